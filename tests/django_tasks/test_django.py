"""rota.contrib.django.RotaBackend: Django 6 tasks enqueued as Rota jobs in
Django's transaction, run by a Rota worker with Django set up (between the
framework's task_started and task_finished signals), their results read
through Django's API; and `rota worker --django` running the example
project's task as users run it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import connection, transaction
from django.tasks import TaskResultStatus, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.tasks.signals import task_finished, task_started
from django.test import Client

import rota
from rota.contrib.django import RotaBackend, rota_priority, setup_worker
from rota.errors import InvalidInput
from rota_worker import Worker, WorkerSettings
from tests.acceptance.procs import wait_for
from tests.django_tasks.conftest import PROJECT


def jobs(url: str) -> list[dict[str, Any]]:
    with psycopg.connect(url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM rota.job ORDER BY id").fetchall()


@pytest.fixture
def worker(shop: str) -> Iterator[Worker]:
    """A Rota worker of the project's task queues, in a thread of this process."""
    types, dsn = setup_worker()
    assert types == ["django:default", "django:emails"]
    settings = WorkerSettings(
        concurrency=2, run_reaper=False, run_scheduler=False, poll_interval_seconds=0.2,
        types=types,
    )  # fmt: skip
    made = Worker(dsn, settings)
    thread = threading.Thread(target=made.run, kwargs={"install_signals": False})
    thread.start()
    yield made
    made.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()


def test_a_task_and_its_order_commit_together_or_not_at_all(shop: str) -> None:
    from orders.models import Order
    from orders.tasks import send_receipt

    with transaction.atomic():
        order = Order.objects.create(email="a@example.com", total_cents=1250)
        kept = send_receipt.enqueue(order.id)
    with pytest.raises(RuntimeError), transaction.atomic():
        lost = Order.objects.create(email="b@example.com", total_cents=1)
        send_receipt.enqueue(lost.id)
        rota.enqueue(connection, "plain.rota.job")  # Django's connection, joined
        raise RuntimeError("card declined")
    [row] = jobs(shop)
    assert (str(row["id"]), row["type"]) == (kept.id, "django:emails")
    assert row["payload"] == {
        "task": "orders.tasks.send_receipt",
        "args": [order.id],
        "kwargs": {},
    }
    assert kept.status == TaskResultStatus.READY
    assert [o.email for o in Order.objects.all()] == ["a@example.com"]


def test_priority_run_after_and_queue_name_in_rotas_terms(shop: str) -> None:
    from orders.tasks import refund

    when = datetime(2031, 1, 2, 3, 4, tzinfo=UTC)
    result = refund.using(priority=-50, run_after=when, queue_name="emails").enqueue(7)
    [row] = jobs(shop)
    assert (row["type"], row["priority"], row["run_at"]) == ("django:emails", 7, when)
    assert row["max_attempts"] == 3  # OPTIONS MAX_ATTEMPTS
    assert refund.get_result(result.id).status == TaskResultStatus.READY
    bands = {p: rota_priority(p) for p in (100, 81, 80, 20, 0, -1, -80, -81, -100)}
    assert bands == {100: 0, 81: 0, 80: 1, 20: 4, 0: 5, -1: 5, -80: 9, -81: 9, -100: 9}


def test_the_worker_runs_tasks_and_their_results_are_read_through_django(
    shop: str, worker: Worker
) -> None:
    from orders.models import Order
    from orders.tasks import refund, send_receipt

    order = Order.objects.create(email="c@example.com", total_cents=990)
    sent = send_receipt.enqueue(order.id)
    refunded = refund.enqueue(order.id)
    for result in (sent, refunded):
        wait_for(lambda r=result: (r.refresh(), r.is_finished)[1], what=f"task {result.id}")
    assert sent.status == TaskResultStatus.SUCCESSFUL
    assert sent.return_value == {"to": "c@example.com", "total": 9.9}
    assert (sent.attempts, sent.errors) == (1, [])
    assert sent.worker_ids == [worker.worker_id]
    assert sent.enqueued_at <= sent.started_at <= sent.finished_at
    assert refunded.status == TaskResultStatus.SUCCESSFUL
    assert refunded.return_value == f"order {order.id} refunded on attempt 2"
    [error] = refunded.errors
    assert error.exception_class is ConnectionError
    assert error.traceback.startswith("ConnectionError: payment provider timed out")


def test_a_task_that_fails_every_attempt_is_failed_with_every_error(
    shop: str, worker: Worker
) -> None:
    from orders.tasks import send_receipt

    missing = send_receipt.enqueue(424242)  # no such order: Order.DoesNotExist each time
    with psycopg.connect(shop, autocommit=True) as conn:
        conn.execute("UPDATE rota.job SET run_at = now() WHERE id = %s", (int(missing.id),))
    result = send_receipt.get_result(missing.id)
    wait_for(
        lambda: (result.refresh(), result.is_finished)[1] or _due_now(shop),
        what="the task to fail three times",
    )
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 3 and result.attempts == 3
    assert {e.exception_class_path for e in result.errors} == {"orders.models.Order.DoesNotExist"}
    assert result.errors[0].traceback.startswith(
        "orders.models.Order.DoesNotExist: Order matching query does not exist.\n"
    )
    assert "orders/tasks.py" in result.errors[0].traceback  # the task's own frames
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value
    with pytest.raises(TaskResultDoesNotExist):
        send_receipt.get_result("999999")
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result("not-an-id")


@pytest.mark.parametrize("result_id", ["0", "²", "1" * 30, "-1", " 1", "1_0"])
def test_an_id_no_job_can_have_is_no_result(shop: str, result_id: str) -> None:
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(result_id)


def test_a_job_that_is_not_a_task_is_no_result(shop: str) -> None:
    # A job of another type, or of a task queue's type written by hand without a
    # task's payload: neither is a task result this backend made.
    with psycopg.connect(shop) as conn:
        plain = rota.enqueue(conn, "mail.plain", {"to": "x"})
        odd = rota.enqueue(conn, "django:default", {"task": 5})
        bare = rota.enqueue(conn, "django:default", {"task": "orders.tasks.send_receipt"})
    for job_id in (plain, odd, bare):
        with pytest.raises(TaskResultDoesNotExist):
            task_backends["default"].get_result(str(job_id))


def test_a_connection_of_an_engines_own_backend_class_joins_its_transaction(shop: str) -> None:
    """django-prometheus and django-tenants name an ENGINE whose DatabaseWrapper
    subclasses Django's PostgreSQL one, in a module of their own."""
    from django.db import connections
    from django.db.backends.postgresql.base import DatabaseWrapper

    own = type("DatabaseWrapper", (DatabaseWrapper,), {"__module__": "tenants.postgresql.base"})
    wrapper = own(connections["default"].settings_dict, alias="own")
    try:
        wrapper.set_autocommit(False)
        rolled_back = rota.enqueue(wrapper, "mail.plain", {"to": "x"})
        wrapper.rollback()
        kept = rota.enqueue(wrapper, "mail.plain", {"to": "y"})
        wrapper.commit()
    finally:
        wrapper.close()
    with psycopg.connect(shop) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM rota.job ORDER BY id").fetchall()]
    assert kept in ids and rolled_back not in ids


@pytest.mark.parametrize(
    "errors",
    [
        {"error": "ValueError: x"},
        [1, 2],
        [{"attempt": 1}],
        [{"attempt": 1, "error": 5}],
        [{"attempt": 1, "error": None}],
        "ValueError: x",
    ],
    ids=["object", "numbers", "no error", "error not text", "null error", "text"],
)
def test_a_result_is_read_whatever_shape_its_errors_were_written_in(shop: str, errors: Any) -> None:
    """Rota writes a list of {attempt, at, error}; a row written by hand may hold
    any JSON there, and its result still reads, each entry shown as its text."""
    from orders.tasks import send_receipt

    result = send_receipt.enqueue(1)
    with psycopg.connect(shop) as conn:
        conn.execute(
            "UPDATE rota.job SET status = 'failed', errors = %s WHERE id = %s",
            (psycopg.types.json.Jsonb(errors), int(result.id)),
        )
    read = task_backends["default"].get_result(result.id)
    assert read.status == TaskResultStatus.FAILED
    assert read.errors and all(isinstance(e.traceback, str) for e in read.errors)


def _due_now(url: str) -> bool:
    """Retries wait for their backoff: bring the next attempt forward (returns False)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE rota.job SET run_at = now() WHERE status = 'ready'")
    return False


@pytest.fixture
def signals() -> Iterator[list[dict[str, Any]]]:
    """What each task_started and task_finished carried, in the order they were
    sent; a receiver that raises is connected to both before the recording ones."""
    seen: list[dict[str, Any]] = []

    def broken(**kwargs: Any) -> None:
        raise RuntimeError("a receiver's own bug")

    def recorder(name: str) -> Any:
        def record(sender: type, task_result: Any, **kwargs: Any) -> None:
            successful = task_result.status == TaskResultStatus.SUCCESSFUL
            seen.append({
                "signal": name,
                "sender": sender,
                "id": task_result.id,
                "task": task_result.task.module_path,
                "status": task_result.status,
                "attempts": task_result.attempts,
                "errors": [e.exception_class_path for e in task_result.errors],
                "return_value": task_result.return_value if successful else None,
            })  # fmt: skip

        return record

    receivers = [
        (task_started, broken),
        (task_finished, broken),
        (task_started, recorder("started")),
        (task_finished, recorder("finished")),
    ]
    for sent_by, receiver in receivers:
        sent_by.connect(receiver, weak=False)
    yield seen
    for sent_by, receiver in receivers:
        sent_by.disconnect(receiver)


def test_the_worker_sends_task_started_and_task_finished_around_a_task_that_succeeds(
    shop: str, worker: Worker, signals: list[dict[str, Any]]
) -> None:
    from orders.models import Order
    from orders.tasks import send_receipt

    order = Order.objects.create(email="f@example.com", total_cents=2500)
    result = send_receipt.enqueue(order.id)
    wait_for(lambda: (result.refresh(), result.is_finished)[1], what="the task to run")
    sent = {"sender": RotaBackend, "id": result.id, "task": "orders.tasks.send_receipt"}
    receipt = {"to": "f@example.com", "total": 25.0}
    assert signals == [
        {**sent, "signal": "started", "status": TaskResultStatus.RUNNING, "attempts": 1,
         "errors": [], "return_value": None},
        {**sent, "signal": "finished", "status": TaskResultStatus.SUCCESSFUL, "attempts": 1,
         "errors": [], "return_value": receipt},
    ]  # fmt: skip
    # The receiver that raised on both signals changed nothing for the task.
    assert (result.status, result.errors, result.return_value) == (
        TaskResultStatus.SUCCESSFUL, [], receipt,
    )  # fmt: skip


def test_task_finished_comes_once_a_task_is_final_not_after_an_attempt_that_is_retried(
    shop: str, worker: Worker, signals: list[dict[str, Any]]
) -> None:
    from orders.tasks import refund, send_receipt

    refunded = refund.enqueue(8)  # fails its first attempt, succeeds on the second
    missing = send_receipt.enqueue(424242)  # fails all three (MAX_ATTEMPTS)
    for result in (refunded, missing):
        wait_for(
            lambda r=result: (r.refresh(), r.is_finished)[1] or _due_now(shop),
            what=f"task {result.id} to finish",
        )

    def sent(result: Any) -> list[tuple[str, TaskResultStatus, int, list[str]]]:
        return [
            (s["signal"], s["status"], s["attempts"], s["errors"])
            for s in signals
            if s["id"] == result.id
        ]

    running = TaskResultStatus.RUNNING
    assert sent(refunded) == [
        ("started", running, 1, []),
        ("started", running, 2, []),
        ("finished", TaskResultStatus.SUCCESSFUL, 2, []),
    ]
    assert sent(missing) == [
        ("started", running, 1, []),
        ("started", running, 2, []),
        ("started", running, 3, []),
        ("finished", TaskResultStatus.FAILED, 3, ["orders.models.Order.DoesNotExist"]),
    ]
    assert missing.status == TaskResultStatus.FAILED and len(missing.errors) == 3


def test_the_example_projects_views_place_an_order_and_read_its_receipt(
    shop: str, worker: Worker
) -> None:
    client = Client()
    placed = client.post(
        "/orders", json.dumps({"email": "d@example.com", "total_cents": 500}), "application/json"
    ).json()

    def receipt() -> dict[str, Any]:
        return client.get(f"/orders/receipt/{placed['receipt']}").json()

    done = wait_for(lambda: receipt() if receipt()["status"] == "SUCCESSFUL" else None)
    assert done["receipt"] == {"to": "d@example.com", "total": 5.0}


def test_rota_worker_django_runs_the_projects_tasks_on_djangos_database(shop: str) -> None:
    from orders.models import Order
    from orders.tasks import send_receipt

    order = Order.objects.create(email="e@example.com", total_cents=100)
    result = send_receipt.enqueue(order.id)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ROTA_", "PG"))}
    env.update(PYTHONPATH=str(PROJECT), DJANGO_SETTINGS_MODULE="shop.settings")
    argv = [sys.executable, "-m", "rota", "worker", "--django", "--no-scheduler"]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: (result.refresh(), result.is_finished)[1], what="the worker to run it")
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0].decode()
    assert proc.returncode == 0, output
    assert "types=django:default,django:emails" in output
    assert result.return_value == {"to": "e@example.com", "total": 1.0}


def test_rota_worker_django_refuses_a_project_it_cannot_run(shop: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    argv = [sys.executable, "-m", "rota", "worker", "--django"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "rota: error: --django needs DJANGO_SETTINGS_MODULE (the project's settings module)"
    ]


@pytest.mark.parametrize(
    ("tasks", "reason"),
    [
        (
            {"default": {"BACKEND": "rota.contrib.django.RotaBackend", "QUEUES": []}},
            r"TASKS\['default'\] takes any queue \(QUEUES is empty\)",
        ),
        (
            {
                "default": {"BACKEND": "rota.contrib.django.RotaBackend"},
                "reports": {
                    "BACKEND": "rota.contrib.django.RotaBackend",
                    "OPTIONS": {"DATABASE": "reports"},
                },
            },
            r"TASKS' Rota backends use different databases",
        ),
    ],
    ids=["any queue", "two databases"],
)
def test_rota_worker_django_refuses_backends_whose_tasks_it_would_never_run(
    shop: str, tasks: dict[str, Any], reason: str
) -> None:
    """A backend that takes any queue name, or backends on two databases: the
    worker could not name every queue, or reach every database, so tasks that
    enqueue() accepted would stay ready for ever."""
    from django.db import connections
    from django.test import override_settings

    connections.settings["reports"] = {**connections.settings["default"], "NAME": "reports"}
    try:
        with override_settings(TASKS=tasks), pytest.raises(InvalidInput, match=reason):
            setup_worker()
    finally:
        del connections.settings["reports"]


def test_a_task_past_the_limits_is_refused_like_any_job(shop: str) -> None:
    # The backend enqueues through rota.enqueue: the same rules, the same refusal
    # (tests/promises/test_one_rule.py drives the other doors), nothing written.
    from orders.tasks import refund

    deep: Any = 1
    for _ in range(150):
        deep = [deep]
    with pytest.raises(rota.InvalidInput, match=r"^payload is nested more than 100 levels deep"):
        refund.enqueue(deep)
    late = datetime(9999, 12, 31, tzinfo=UTC)
    with pytest.raises(rota.InvalidInput, match=r"^run_at must be from 1970-01-01"):
        refund.using(run_after=late).enqueue(7)
    assert jobs(shop) == []
