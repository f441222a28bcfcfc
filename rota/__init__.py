"""Rota: background jobs and recurring schedules on one PostgreSQL table."""

from rota.claim import complete
from rota.control import cancel, pause, paused, resume
from rota.durable import emit
from rota.effects import effect_result, record_effect
from rota.enqueue import enqueue, enqueue_async, enqueue_many, enqueue_many_async
from rota.errors import (
    Cancelled,
    ChildFailed,
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    JobNotFound,
    Permanent,
    Retry,
    RotaError,
    Suspended,
    TimedOut,
)
from rota.flow import Limit, clear_limit, list_limits, set_limit
from rota.handlers import Context, handler
from rota.jobs import Job, NewJob, Outcome, Status
from rota.lookup import result
from rota.migrate import migrate

__version__ = "0.4.0"
"""Rota's version (pyproject.toml says the same; `rota --version` prints it)."""

__all__ = [
    "Cancelled",
    "ChildFailed",
    "Context",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "Job",
    "JobNotFound",
    "Limit",
    "NewJob",
    "Outcome",
    "Permanent",
    "Retry",
    "RotaError",
    "Status",
    "Suspended",
    "TimedOut",
    "cancel",
    "clear_limit",
    "complete",
    "effect_result",
    "emit",
    "enqueue",
    "enqueue_async",
    "enqueue_many",
    "enqueue_many_async",
    "handler",
    "list_limits",
    "migrate",
    "pause",
    "paused",
    "record_effect",
    "result",
    "resume",
    "set_limit",
]
