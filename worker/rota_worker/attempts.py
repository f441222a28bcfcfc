"""The life of one attempt inside this worker: its states and the only moves between them.

    claim ──> WAITING ──slot free──> RUNNING ──handler ends──> ENDED
                 └─────never started (waited too long, stopped)────┘
    ENDED ──> WRITTEN      its outcome is written (or the handler completed the job)
    ENDED ──> GIVEN_BACK   its release is written: ready again, attempt not counted
    ENDED ──> LOST         its lease is gone: nothing written

An attempt is *held* (its lease renewed by the heartbeat) from its claim until it
reaches a terminal state. Each claim makes new attempt records: a job given back
and claimed again in the same statement (same job id, same attempt number) is a
new record, never confused with the one being settled. Records are compared by
identity, never by (job id, attempt).

The claim loop, the outcome buffer and the lease keeper move attempts only by
`move`. An illegal move raises `IllegalMove` when `STRICT` is on (the test suite
turns it on) and is logged as an error otherwise: production keeps running.
"""

from __future__ import annotations

import enum
import logging
import os
from typing import Protocol

log = logging.getLogger("rota.worker")


class State(enum.StrEnum):
    WAITING = "claimed-waiting"
    """Claimed and held; no slot was free for it yet (claimed ahead)."""
    RUNNING = "running"
    """Its handler runs in a slot."""
    ENDED = "ended"
    """Its outcome is decided (by the handler, or without starting); not written yet."""
    WRITTEN = "written"
    """Its outcome is in the database (or the handler completed the job itself)."""
    GIVEN_BACK = "given back"
    """Released to the database: ready again, the attempt not counted."""
    LOST = "lost"
    """Its lease is gone (reaped, taken, or its outcome refused): nothing written."""


MOVES: dict[State, frozenset[State]] = {
    State.WAITING: frozenset({State.RUNNING, State.ENDED}),
    State.RUNNING: frozenset({State.ENDED}),
    State.ENDED: frozenset({State.WRITTEN, State.GIVEN_BACK, State.LOST}),
    State.WRITTEN: frozenset(),
    State.GIVEN_BACK: frozenset(),
    State.LOST: frozenset(),
}
"""The only moves allowed, from each state."""

HELD = frozenset({State.WAITING, State.RUNNING, State.ENDED})
"""States whose lease this worker renews."""

STRICT = os.environ.get("ROTA_STRICT_ATTEMPTS", "") not in ("", "0")
"""Raise on an illegal move (tests) instead of logging it (production)."""


class IllegalMove(RuntimeError):
    """An attempt was moved in a way its lifecycle does not allow."""


class Record(Protocol):
    """What `move` needs of an attempt record (rota_worker.execute.Execution)."""

    state: State

    @property
    def key(self) -> tuple[int, int]: ...


def move(record: Record, to: State) -> bool:
    """Move `record` to `to`; False (and nothing changed) when the move is illegal."""
    if to in MOVES[record.state]:
        record.state = to
        return True
    job_id, attempt = record.key
    message = f"job {job_id} attempt {attempt}: illegal move {record.state} -> {to}"
    if STRICT:
        raise IllegalMove(message)
    log.error("%s; ignored", message)
    return False
