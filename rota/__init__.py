"""Rota: background jobs and recurring schedules on one PostgreSQL table."""

from rota.claim import complete
from rota.effects import effect_result, record_effect
from rota.enqueue import enqueue, enqueue_many
from rota.errors import (
    DatabaseError,
    DatabaseUnavailable,
    InvalidInput,
    Permanent,
    Retry,
    RotaError,
)
from rota.handlers import Context, handler
from rota.jobs import Job, NewJob, Status
from rota.migrate import migrate

__all__ = [
    "Context",
    "DatabaseError",
    "DatabaseUnavailable",
    "InvalidInput",
    "Job",
    "NewJob",
    "Permanent",
    "Retry",
    "RotaError",
    "Status",
    "complete",
    "effect_result",
    "enqueue",
    "enqueue_many",
    "handler",
    "migrate",
    "record_effect",
]
