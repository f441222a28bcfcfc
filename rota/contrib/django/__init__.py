"""Django 6's tasks framework on Rota: ``rota.contrib.django.RotaBackend``.

    TASKS = {"default": {"BACKEND": "rota.contrib.django.RotaBackend"}}

A ``@task`` function's ``.enqueue()`` inserts a Rota job through Django's own
database connection, so inside ``transaction.atomic()`` the job commits with
the view's rows (and is gone with their rollback). ``rota worker --django``
runs the tasks with Django set up; ``.get_result(id)`` and ``result.refresh()``
read the job's row (status, return value, every attempt's error).

Rota's terms: a queue is a job type, ``django:<queue name>``; Django's
priority (-100 to 100, higher first) maps onto Rota's (0 to 9, 0 first) in ten
bands of about 20 (Django's default 0 is Rota's 5); ``run_after`` is the job's
``run_at``. The payload holds the task's path and its JSON arguments. Options:
``DATABASE`` (the Django database alias to enqueue through, default
``default``) and ``MAX_ATTEMPTS`` (default: Rota's, 20, with backoff; 1 makes a
task that raises FAILED at once, as Django's immediate backend does).

Signals: ``task_enqueued`` as ``.enqueue()`` returns; from the worker's
handler, ``task_started`` as each attempt starts (RUNNING) and
``task_finished`` once, when the task's result is final: SUCCESSFUL, or FAILED
by the attempt that ended it (``Permanent``, or the last of its attempts). An
attempt that will be retried sends no ``task_finished``: its result is READY
again, as ``get_result`` says, so a receiver that acts on a finished task (or
alerts on FAILED) runs once per task, not once per attempt. An attempt stopped
from outside (timeout, cancel, shutdown) sends none either: the worker decides
its outcome without the task. Both go out before the worker writes the
attempt's outcome, through ``send_robust``: a receiver that raises is logged by
Django and never fails the task.
"""

from __future__ import annotations

import builtins
import json
import math
from datetime import datetime
from typing import Any

import psycopg
from django.db import close_old_connections, connections
from django.tasks import task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import (
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultStatus,
)
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json
from django.utils.module_loading import import_string
from psycopg.conninfo import make_conninfo

import rota
from rota import db, limits, lookup
from rota.errors import InvalidInput, JobNotFound, Permanent, RotaError
from rota.jobs import Job, Status
from rota.retry import describe_error

TYPE_PREFIX = "django:"

_STATUSES = {
    Status.READY: TaskResultStatus.READY,
    Status.WAITING: TaskResultStatus.READY,  # no worker holds it; it runs again
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
}
"""Django's status for each of a job's but the ends without success: failed, dead,
cancelled and any status no reader knows (an archived row older than its check)
are all FAILED."""


def job_type(queue_name: str) -> str:
    """The Rota job type of a Django task queue."""
    return f"{TYPE_PREFIX}{queue_name}"


def rota_priority(priority: int) -> int:
    """Django's priority (-100 to 100, higher runs first) as Rota's (0 to 9, 0 first)."""
    return min(9, math.floor((100 - priority) / 20))


class RotaBackend(BaseTaskBackend):
    """A Django task backend that enqueues Rota jobs and reads their rows."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.database = self.options.get("DATABASE", "default")
        self.max_attempts = self.options.get("MAX_ATTEMPTS")

    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        _check_importable(task)
        args, kwargs = normalize_json(list(args)), normalize_json(dict(kwargs))
        payload = {"task": task.module_path, "args": args, "kwargs": kwargs}
        job_id = rota.enqueue(
            connections[self.database],
            job_type(task.queue_name),
            payload,
            run_at=_aware(task.run_after),
            priority=rota_priority(task.priority),
            max_attempts=self.max_attempts,
        )
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=timezone.now(),
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult:
        try:
            job_id = limits.job_id(limits.whole_text(str(result_id)))
            if str(job_id) != str(result_id):  # "07": only the id enqueue() gave
                raise ValueError(result_id)
            row = lookup.outcome(connections[self.database], job_id)
        except (ValueError, JobNotFound):  # InvalidInput is a ValueError: no job has it
            raise TaskResultDoesNotExist(result_id) from None
        if not _is_task(row):
            raise TaskResultDoesNotExist(result_id)
        try:
            task = _task_at(row["payload"]["task"])
        except InvalidTask as exc:  # renamed or removed since: no Task to give it
            raise TaskResultDoesNotExist(f"{result_id}: {exc}") from None
        return self._result(str(result_id), row, task)

    def _result(self, result_id: str, row: dict[str, Any], task: Task) -> TaskResult:
        """The result of `row`, a job of `task` (the Task its payload names)."""
        payload = row["payload"]
        queue_name = row["type"].removeprefix(TYPE_PREFIX)
        if queue_name != task.queue_name and (not self.queues or queue_name in self.queues):
            task = task.using(queue_name=queue_name)  # the queue it was enqueued on
        errors = [
            TaskError(exception_class_path=_exception_path(text), traceback=text)
            for text in _error_texts(row["errors"])
        ]
        result = TaskResult(
            task=task,
            id=result_id,
            status=_STATUSES.get(row["status"], TaskResultStatus.FAILED),
            enqueued_at=row["created_at"],
            started_at=row["started_at"],
            finished_at=row["finished_at"],
            last_attempted_at=row["started_at"],
            args=payload["args"],
            kwargs=payload["kwargs"],
            backend=self.alias,
            errors=errors,
            # Rota keeps the worker of the last attempt only: once per attempt.
            worker_ids=[row["locked_by"]] * row["attempts"] if row["locked_by"] else [],
        )
        object.__setattr__(result, "_return_value", row["result"])
        return result


def _task_at(path: str) -> Task:
    """The Task a payload names, as a worker imports it; InvalidTask when the path
    does not import or names something other than a Task."""
    try:
        found = import_string(path)
    except ImportError as exc:
        raise InvalidTask(f"task {path!r} cannot be imported: {exc}") from None
    if not isinstance(found, Task):
        raise InvalidTask(f"{path!r} is not a Task (it is {type(found).__name__})")
    return found


def _aware(when: datetime | None) -> datetime | None:
    """`run_after` as an instant: a naive one (Django lets it through with USE_TZ
    off) is the project's local time, TIME_ZONE, as Django reads naive times."""
    if when is None or not timezone.is_naive(when):
        return when
    return timezone.make_aware(when, timezone.get_default_timezone())


def _check_importable(task: Task) -> None:
    """A worker imports the task by its path: refuse one it cannot (a function of
    ``__main__``, or one whose name does not lead to its Task)."""
    path = task.module_path
    if task.func.__module__ == "__main__":
        raise InvalidTask(f"task {path!r} is in __main__: a worker cannot import it")
    found = _task_at(path)
    if found.func is not task.func:
        raise InvalidTask(f"{path!r} does not lead to this task's function")


def _is_task(row: dict[str, Any]) -> bool:
    """Whether a job is a task this backend enqueued: a task queue's type and a
    task's payload (another job, or one written by hand, is no task result)."""
    payload = row["payload"]
    return (
        row["type"].startswith(TYPE_PREFIX)
        and isinstance(payload, dict)
        and isinstance(payload.get("task"), str)
        and isinstance(payload.get("args"), list)
        and isinstance(payload.get("kwargs"), dict)
    )


def _error_texts(errors: Any) -> list[str]:
    """Each attempt's error as Rota writes it (a list of {attempt, at, error});
    what a row written by hand holds there instead, each entry as its JSON
    text, so that a result always reads."""
    listed = errors if isinstance(errors, list) else [] if errors is None else [errors]
    texts = []
    for entry in listed:
        text = entry.get("error") if isinstance(entry, dict) else entry
        if not isinstance(text, str):
            try:
                text = json.dumps(entry, default=str)
            except (RecursionError, ValueError):
                text = "(an error entry too deeply nested to show)"
        texts.append(text)
    return texts


def _exception_path(error: str) -> str:
    """The exception class of an error as Rota writes it (``Type: message``)."""
    name = error.partition(":")[0].strip()
    return f"builtins.{name}" if isinstance(getattr(builtins, name, None), type) else name


_NAMED: dict[type[BaseException], type[Exception]] = {}


def _named(kind: type[BaseException]) -> type[Exception]:
    """A stand-in for `kind` whose name is its full path: Rota's error text starts
    with its class's name, and Django's TaskError wants the path."""
    if kind not in _NAMED:
        path = f"{kind.__module__}.{kind.__qualname__}"
        _NAMED[kind] = type(path, (Exception,), {"__module__": kind.__module__})
    return _NAMED[kind]


def run_task(job: Job) -> Any:
    """The handler of every Django queue: call the task with its arguments, with
    Django's connections handled as around a request, between the framework's
    `task_started` and `task_finished` signals. A task's exception is written
    with its class's full path (Rota's own, `Retry` and `Permanent`, keep their
    meaning)."""
    try:
        return _run_task(job)
    except Exception as exc:
        written = _as_written(exc)
        if written is exc:
            raise
        raise written from None


def _run_task(job: Job) -> Any:
    close_old_connections()
    try:
        return _call_between_signals(job)
    finally:
        close_old_connections()


def _call_between_signals(job: Job) -> Any:
    payload = job.payload
    task = _task_at(payload["task"])
    sender = type(task.get_backend())
    result = _running(task, job)
    task_started.send_robust(sender, task_result=result)
    try:
        context = (TaskContext(task_result=result),) if task.takes_context else ()
        value = normalize_json(task.call(*context, *payload["args"], **payload["kwargs"]))
        # A value Rota cannot keep fails the attempt: find out before saying SUCCESSFUL.
        limits.encode_result(value)
    except BaseException as exc:
        written = _as_written(exc)
        if _ends_task(job, written):  # sent while handling: Django logs it with exc_info
            _finished(sender, result, TaskResultStatus.FAILED, error=describe_error(written))
        raise
    if not job.cancelled.is_set():
        _finished(sender, result, TaskResultStatus.SUCCESSFUL, value=value)
    return value


def _running(task: Task, job: Job) -> TaskResult:
    """The task's result as the attempt starts: the job as claimed, RUNNING."""
    row = {
        "type": job.type,
        "status": Status.RUNNING,
        "payload": job.payload,
        "result": None,
        "errors": None,
        "attempts": job.attempts,
        "locked_by": job.locked_by,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": None,
    }
    return task.get_backend()._result(str(job.id), row, task)


def _as_written(exc: BaseException) -> BaseException:
    """The exception as the worker writes it: a task's own under a stand-in named
    with its class's full path; Rota's, Python's builtins and anything that is not
    an `Exception` as they are."""
    if not isinstance(exc, Exception) or isinstance(exc, RotaError):
        return exc
    if type(exc).__module__ == "builtins":
        return exc
    return _named(type(exc))(str(exc)).with_traceback(exc.__traceback__)


def _ends_task(job: Job, error: BaseException) -> bool:
    """Whether the worker writes this attempt's error as the task's end (failed,
    or dead with no attempts left) rather than retrying it or giving it back."""
    if job.cancelled.is_set():
        return False  # stopped from outside (timeout, cancel, shutdown): decided there
    if isinstance(error, Permanent):
        return True
    if db.is_unavailable(error):
        return False  # given back to the queue: not an attempt
    return job.attempts >= job.max_attempts


def _finished(
    sender: type[BaseTaskBackend],
    result: TaskResult,
    status: TaskResultStatus,
    *,
    value: Any = None,
    error: str | None = None,
) -> None:
    """Move the attempt's result to its end and send `task_finished`; a receiver
    that raises is logged by Django and changes nothing for the task."""
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    if error is None:
        object.__setattr__(result, "_return_value", value)
    else:
        path = _exception_path(error)
        result.errors.append(TaskError(exception_class_path=path, traceback=error))
    task_finished.send_robust(sender, task_result=result)


def setup_worker() -> tuple[list[str], str]:
    """Set Django up (DJANGO_SETTINGS_MODULE) for `rota worker --django` and register
    the handler of every queue of every Rota backend in TASKS. Returns the job
    types and the URL of the backends' database (for a worker given none)."""
    import django

    django.setup()
    ours = {name: task_backends[name] for name in task_backends}
    ours = {name: b for name, b in ours.items() if isinstance(b, RotaBackend)}
    if not ours:
        raise InvalidInput("no task backend in Django's TASKS is rota.contrib.django.RotaBackend")
    # A worker runs the queues it can name, on one database: a backend that
    # takes any queue, or backends on two databases, would leave tasks that
    # enqueue() accepted ready for ever.
    for name, backend in ours.items():
        if not backend.queues:
            raise InvalidInput(
                f"TASKS[{name!r}] takes any queue (QUEUES is empty): list its queues,"
                " so that rota worker --django runs every one of them"
            )
    urls = {name: database_url(backend.database) for name, backend in ours.items()}
    if len(set(urls.values())) > 1:
        named = ", ".join(f"{n!r} on {ours[n].database!r}" for n in sorted(urls))
        raise InvalidInput(
            f"TASKS' Rota backends use different databases ({named}):"
            " rota worker --django runs the tasks of one database"
        )
    types = sorted({job_type(queue) for backend in ours.values() for queue in backend.queues})
    for name in types:
        rota.handler(name)(run_task)
    return types, next(iter(urls.values()))


def database_url(alias: str) -> str:
    """A libpq connection string for one of Django's databases."""
    params = connections[alias].get_connection_params()
    known = {d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults()}
    return make_conninfo(
        "", **{k: v for k, v in params.items() if k in known and isinstance(v, str | int)}
    )
