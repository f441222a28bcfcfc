"""Rota's exceptions: the error tree at the edges, and the handler control flow.

Every error Rota raises is a `RotaError`; psycopg errors are wrapped at the edge
(`rota.db`) with the original kept as ``__cause__``. An exception's docstring is
its default message.
"""

from __future__ import annotations


class RotaError(Exception):
    """Rota failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(RotaError, ValueError):
    """The input is not valid."""


class DatabaseUnavailable(RotaError):
    """The database cannot be reached or the connection was lost."""


class DatabaseError(RotaError):
    """The database refused a statement."""


class MigrationError(RotaError):
    """The database schema cannot be brought up to date."""


class JobNotFound(RotaError, LookupError):
    """No job has that id."""


class Retry(Exception):
    """Run the job again later, after `delay` seconds, counting this attempt."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and delay < 0:
            raise ValueError("Retry delay must not be negative")
        self.delay = delay
        self.reason = reason
        super().__init__(reason or f"retry requested (delay={delay})")


class Permanent(Exception):
    """The job cannot succeed: move it to failed without retrying."""

    def __init__(self, reason: str = "permanent failure") -> None:
        self.reason = reason
        super().__init__(reason)


class Cancelled(Exception):
    """The attempt was asked to stop (timeout or cancel request): raised inside a handler
    by `Job.raise_if_cancelled`, it ends the attempt the way the stop request says."""
