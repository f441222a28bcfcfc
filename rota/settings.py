"""Settings of the core queue, as dataclasses with their units and reasons.

Only the CLI and the ``__main__`` modules read environment variables; everything
else receives one of these.
"""

from __future__ import annotations

import dataclasses

from rota import limits
from rota.errors import InvalidInput


@dataclasses.dataclass(frozen=True)
class QueueSettings:
    default_max_attempts: int = 20
    """Attempts a job gets when it does not say (River and Oban use 20/25): with the
    default backoff that spans about a day before the job is declared dead."""

    max_payload_bytes: int = limits.MAX_PAYLOAD_BYTES
    """Largest JSON payload accepted, in bytes. Jobs carry references, not documents;
    large payloads bloat the table every claim walks."""

    def __post_init__(self) -> None:
        if self.default_max_attempts < 1:
            raise InvalidInput("default_max_attempts must be at least 1")
        if self.max_payload_bytes < 2:
            raise InvalidInput("max_payload_bytes must be at least 2")


@dataclasses.dataclass(frozen=True)
class BackoffSettings:
    base_seconds: float = 1.0
    """Delay before the first retry, in seconds; doubled for every further attempt."""

    cap_seconds: float = 3600.0
    """No retry waits longer than this, in seconds, however many attempts came before."""

    jitter: float = 0.25
    """Fraction of the delay drawn at random (+/-), so jobs that failed together do
    not all come back in the same instant."""

    def __post_init__(self) -> None:
        if self.base_seconds < 0 or self.cap_seconds < self.base_seconds:
            raise InvalidInput("backoff needs 0 <= base_seconds <= cap_seconds")
        if not 0 <= self.jitter <= 1:
            raise InvalidInput("backoff jitter must be between 0 and 1")
