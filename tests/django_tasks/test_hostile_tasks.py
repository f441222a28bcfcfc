"""rota.contrib.django.RotaBackend given what a Django project should not give
it: arguments JSON cannot carry back as they were, tasks no worker can import,
results asked for by ids of every shape; each refused at enqueue with Django's
exception, or failed by the worker with a clear error, never changed silently."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from django.tasks import task, task_backends
from django.tasks.base import Task, TaskResultStatus
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist

import rota
from tests.acceptance.procs import wait_for
from tests.archived_rows import archive_as_before_the_check
from tests.django_tasks.test_django import jobs, worker  # noqa: F401 (a fixture)


def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


def returns_int_keys() -> dict[int, str]:
    return {1: "one"}


TASK_FUNCTIONS = [echo, returns_int_keys]


@pytest.fixture
def tasks(shop: str) -> None:
    """This module's functions as tasks of the default backend, under their own
    names (where a worker imports them from), once Django is set up."""
    for func in TASK_FUNCTIONS:
        if not isinstance(globals()[func.__name__], Task):
            globals()[func.__name__] = task(func)


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        ((datetime(2030, 1, 1, tzinfo=UTC),), TypeError),
        ((Decimal("1.5"),), TypeError),
        (({1, 2},), TypeError),
        ((b"\xff",), ValueError),
        ((math.nan,), rota.InvalidInput),
        ((10**5000,), rota.InvalidInput),
        (("x" * 300_000,), rota.InvalidInput),
        (({1: "one"},), rota.InvalidInput),
        (([{"ok": {None: 1}}],), rota.InvalidInput),
    ],
    ids=["datetime", "decimal", "set", "bytes", "nan", "huge-int", "300kB", "int-key", "none-key"],
)
def test_arguments_json_cannot_carry_back_are_refused_and_nothing_is_written(
    tasks: None, shop: str, args: tuple[Any, ...], refused: type[Exception]
) -> None:
    with pytest.raises(refused):
        echo.enqueue(*args)
    with pytest.raises(refused):
        echo.enqueue(value=args[0])
    assert jobs(shop) == []


def test_arguments_that_round_trip_are_read_back_as_enqueued(tasks: None, shop: str) -> None:
    deep: Any = "bottom"
    for _ in range(90):  # the payload holds the arguments two levels down
        deep = {"d": deep}
    result = echo.enqueue((1, "a"), b"bytes", deep, 10**40, key={"k": [True, None]})
    assert result.args == [[1, "a"], "bytes", deep, 10**40]
    read = task_backends["default"].get_result(result.id)
    assert (read.args, read.kwargs) == (result.args, {"key": {"k": [True, None]}})


def test_a_task_no_worker_can_import_is_invalid_at_enqueue(tasks: None, shop: str) -> None:
    def in_main() -> None: ...

    in_main.__module__, in_main.__qualname__ = "__main__", "in_main"
    with pytest.raises(InvalidTask, match="__main__"):
        task(in_main).enqueue()
    # A Task made from a module's function without taking its name: the name
    # still leads to the function, which a worker cannot run as a task.
    with pytest.raises(InvalidTask, match="is not a Task"):
        task(plain_function).enqueue()
    with pytest.raises(InvalidTask, match="must be defined at a module level"):
        task(lambda: None)  # Django's own refusal, at definition
    assert jobs(shop) == []


def plain_function() -> None: ...


@pytest.mark.parametrize("priority", [101, -101, 50.5])
def test_priorities_past_the_edges_are_invalid(tasks: None, priority: float) -> None:
    with pytest.raises(InvalidTask, match="priority"):
        echo.using(priority=priority)


def test_run_after_naive_and_unknown_queues_are_invalid(tasks: None, shop: str) -> None:
    with pytest.raises(InvalidTask, match="aware"):
        echo.using(run_after=datetime(2031, 1, 1))
    with pytest.raises(InvalidTask, match="nowhere"):
        echo.using(queue_name="nowhere")
    top, bottom = echo.using(priority=100).enqueue(), echo.using(priority=-100).enqueue()
    assert [row["priority"] for row in jobs(shop)] == [0, 9]
    assert {top.task.priority, bottom.task.priority} == {100, -100}


def test_a_naive_run_after_is_the_projects_local_time_without_use_tz(
    tasks: None, shop: str
) -> None:
    # With USE_TZ off, Django takes naive datetimes in TIME_ZONE (and lets the
    # task through): Rota refused it as a time without a zone.
    from django.test import override_settings

    with override_settings(USE_TZ=False, TIME_ZONE="Europe/Berlin"):
        echo.using(run_after=datetime(2031, 1, 1, 12, 0)).enqueue()
    assert [row["run_at"] for row in jobs(shop)] == [datetime(2031, 1, 1, 11, 0, tzinfo=UTC)]


def test_a_result_read_back_is_of_the_queue_it_was_enqueued_on(tasks: None, shop: str) -> None:
    result = echo.using(queue_name="emails").enqueue()
    read = task_backends["default"].get_result(result.id)
    assert read.task.queue_name == "emails" == result.task.queue_name
    assert echo.get_result(result.id).task.func is echo.func


def test_a_result_is_read_by_the_id_enqueue_gave_only(tasks: None, shop: str) -> None:
    result = echo.enqueue()
    backend = task_backends["default"]
    assert backend.get_result(result.id).id == result.id
    for other in (f"0{result.id}", f"{result.id}.0", f"+{result.id}"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(other)
        with pytest.raises(TaskResultDoesNotExist):
            asyncio.run(backend.aget_result(other))


@pytest.mark.parametrize(
    "result_id", [None, b"1", 1.5, "1\x00", "x" * 10_000, "\u0661", "9" * 20, "", "1 "]
)
def test_ids_of_every_shape_are_no_result_sync_or_async(shop: str, result_id: Any) -> None:
    backend = task_backends["default"]
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result_id)
    with pytest.raises(TaskResultDoesNotExist):
        asyncio.run(backend.aget_result(result_id))


def test_a_result_whose_task_was_renamed_since_is_no_result(tasks: None, shop: str) -> None:
    payload = {"args": [], "kwargs": {}}
    with psycopg.connect(shop) as conn:
        gone = rota.enqueue(conn, "django:default", {**payload, "task": "orders.gone.send"})
        plain = rota.enqueue(conn, "django:default", {**payload, "task": "orders.tasks.Order"})
    for job_id, reason in ((gone, "cannot be imported"), (plain, "is not a Task")):
        with pytest.raises(TaskResultDoesNotExist, match=reason):
            task_backends["default"].get_result(str(job_id))


@pytest.mark.usefixtures("worker")
def test_the_worker_fails_a_task_whose_module_was_renamed_and_runs_on(
    tasks: None, shop: str
) -> None:
    payload = {"args": [], "kwargs": {}}
    with psycopg.connect(shop) as conn:
        gone = rota.enqueue(
            conn, "django:default", {**payload, "task": "orders.gone.send"}, max_attempts=1
        )
    after = echo.enqueue(1)

    def row() -> dict[str, Any] | None:
        found = {r["id"]: r for r in jobs(shop)}.get(gone)
        return found if found and found["status"] in ("failed", "dead") else None

    failed = wait_for(row, what="the worker to fail the job")
    [error] = failed["errors"]
    assert "orders.gone.send" in error["error"] and "cannot be imported" in error["error"]
    wait_for(lambda: (after.refresh(), after.is_finished)[1], what="the next task")
    assert after.return_value == {"args": [1], "kwargs": {}}


def test_a_result_of_any_status_the_table_can_hold_is_read(tasks: None, shop: str) -> None:
    # A task's job set waiting by hand, and one archived in a status no reader
    # knows (a row older than the archive's check), raised KeyError.
    backend = task_backends["default"]
    waiting, archived = echo.enqueue(1), echo.enqueue(2)
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("UPDATE rota.job SET status = 'waiting' WHERE id = %s", (int(waiting.id),))
        archive_as_before_the_check(conn, "sleeping", [int(archived.id)])
        try:
            assert backend.get_result(waiting.id).status == TaskResultStatus.READY
            assert backend.get_result(archived.id).status == TaskResultStatus.FAILED
        finally:  # the project's database is shared: as it was
            conn.execute("DELETE FROM rota.job_archive")
            conn.execute(
                "ALTER TABLE rota.job_archive VALIDATE CONSTRAINT job_archive_status_check"
            )
