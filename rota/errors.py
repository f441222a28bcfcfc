"""Rota's exceptions: the error tree at the edges, and the handler control flow.

Every error Rota raises is a `RotaError`; psycopg errors are wrapped at the edge
(`rota.db`) with the original kept as ``__cause__``. An exception's docstring is
its default message.
"""

from __future__ import annotations


def one_line(exc: BaseException) -> str:
    """`exc`'s message on one line (libpq's run over several: "server closed the
    connection unexpectedly" and two lines of "This probably means..."), for log
    lines and the CLI's one-line errors."""
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip())


class RotaError(Exception):
    """Rota failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class InvalidInput(RotaError, ValueError):
    """The input is not valid."""


class DatabaseUnavailable(RotaError):
    """The database cannot be reached or the connection was lost."""


class ConnectionOptionRefused(InvalidInput):
    """libpq refuses a connection option, before it asks any server: no wait mends it."""

    def __init__(self, reason: str, option: str | None = None) -> None:
        self.reason = reason
        """What libpq (or psycopg before it) said of the option, in one line."""
        self.option = option
        """The option's keyword (`sslmode`), when the reason names it."""
        super().__init__(f"libpq refuses a connection option: {reason}")


class DatabaseError(RotaError):
    """The database refused a statement."""


class MigrationError(RotaError):
    """The database schema cannot be brought up to date."""


class JobNotFound(RotaError, LookupError):
    """No job has that id."""


MAX_DELAY_SECONDS = 10 * 365 * 86400.0
"""The longest delay of a job (enqueued or retried): ten years. Later times
could not be read back into Python (datetime ends at the year 9999), and an
infinite or NaN delay is refused by PostgreSQL itself."""


class Retry(Exception):
    """Run the job again later, after `delay` seconds, counting this attempt."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        # `not <=` refuses NaN too. Raised inside a handler, the ValueError is the
        # job's error: an ordinary retry, after the usual backoff.
        if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
            raise ValueError(
                f"Retry delay must be from 0 to {MAX_DELAY_SECONDS:.0f} seconds, not {delay!r}"
            )
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


class TimedOut(RotaError):
    """A wait ended at its timeout before its event was emitted."""


class ChildFailed(RotaError):
    """A child of the job ended without succeeding (failed, dead or cancelled)."""

    def __init__(self, child_id: int, status: str, error: str | None = None) -> None:
        self.child_id = child_id
        self.status = status
        self.error = error
        first = (error or "").splitlines()[0] if error else ""
        super().__init__(f"child job {child_id} ended {status}" + (f": {first}" if first else ""))


class Suspended(Exception):
    """The job waits (status waiting) for a sleep, an event or its children: this
    attempt ends here without counting, and the handler runs again from the top
    once the wait is over. Raised by the Context's sleep, wait_for and gather;
    a handler lets it pass (catching it keeps the slot busy for nothing)."""

    def __init__(self, job_id: int, wait: str) -> None:
        self.job_id = job_id
        self.wait = wait
        super().__init__(f"job {job_id} waits on {wait}")


class LeaseLost(Cancelled):
    """The job's lease was gone when its run wrote a step or a wait: nothing was written."""


class CancelRequested(Cancelled):
    """Somebody asked to cancel the job before its worker heard of it, and its run
    found out at a sleep, wait or gather: the job does not wait, the attempt ends
    cancelled."""
