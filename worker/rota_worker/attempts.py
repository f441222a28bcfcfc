"""Every attempt this worker holds, its state, and the one dispatch that moves it.

    claimed ──STARTED──> RUNNING ──FINISHED──> ENDED ──WRITTEN────> written
       │                   │                     ├────GIVEN_BACK──> given back
       │                   │                     ├────SUSPENDED───> suspended
       │                 a stop                  └────LOST────────> lost
       │                   v
       │                STOPPING ──FINISHED──> ENDED
       └──a stop, NO_SLOT, UNREADABLE──> ENDED (never started)

SUSPENDED: the handler's run wrote its job `waiting` (a durable job's sleep,
wait or gather, rota.durable) before it ended; nothing is left to write, the
attempt is not counted, and its slot was freed when it ended, like any other.

A stop is TIMEOUT, CANCEL, LEASE_LOST or SHUTDOWN; the first one of an attempt
is its reason, later ones change nothing. A STOPPING attempt keeps its slot
until its handler has really ended: a thread that ignores the stop, or a child
process not yet killed, still counts against the concurrency.

`Attempts` is the one owner: every record, by identity (a job given back and
claimed again in one statement has the same job id and attempt twice, and is
a new record); the slots taken are its RUNNING and STOPPING records, nothing
else. Every event goes through `Attempts.dispatch`, which looks the move up in
`MOVES` and does what arriving in the new state means (stop the handler, hand
the outcome on, let go of the lease). A kind of event is added by one row of
`MOVES`, and so is a new end (every end is settled alike); a new held state
also needs one branch of `dispatch`. An illegal
move raises `IllegalMove` when `STRICT` is on (the test suite) and is logged as
an error otherwise: production keeps running.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import logging
import os
from collections import deque
from collections.abc import Callable, Collection, Iterable

from rota.attempt import Attempt, Key, Lease, key_of
from rota.jobs import Job

log = logging.getLogger("rota.worker")


class State(enum.StrEnum):
    __hash__ = str.__hash__  # the str's own (C) hash: the dispatch looks states up per job

    CLAIMED = "claimed"
    """Claimed and held; no slot was free for it yet (claimed ahead)."""
    RUNNING = "running"
    """Its handler runs in a slot."""
    STOPPING = "stopping"
    """Asked to stop; its handler has not ended yet and keeps its slot."""
    ENDED = "ended"
    """Its outcome is decided (by the handler, or without starting); not written yet."""
    WRITTEN = "written"
    """Its outcome is in the database (or the handler completed the job itself)."""
    GIVEN_BACK = "given back"
    """Released to the database: ready again, the attempt not counted."""
    LOST = "lost"
    """Its lease is gone (reaped, taken, or its outcome refused): nothing written."""
    SUSPENDED = "suspended"
    """Its run wrote the job waiting (rota.durable): nothing to write, not counted."""


class Event(enum.StrEnum):
    __hash__ = str.__hash__

    STARTED = "started"
    """A slot was free: its handler starts."""
    FINISHED = "finished"
    """Its handler ended (returned, raised, or gave in to a stop); `outcome` is set."""
    TIMEOUT = "timeout"
    CANCEL = "cancel"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"
    NO_SLOT = "no slot"
    """Claimed ahead, it found no free slot in time: given back, never started."""
    UNREADABLE = "unreadable"
    """Its row could not be read (rota.decoding.Unreadable): written dead at once."""
    WRITTEN = "written"
    GIVEN_BACK = "given back"
    LOST = "lost"
    SUSPENDED = "suspended"
    """Its outcome says the run wrote the job waiting: settled with nothing written."""


Stop = Event
"""The events that stop an attempt (TIMEOUT, CANCEL, LEASE_LOST, SHUTDOWN)."""

STOPS = (Event.TIMEOUT, Event.CANCEL, Event.LEASE_LOST, Event.SHUTDOWN)
REASONS = frozenset({*STOPS, Event.NO_SLOT, Event.UNREADABLE})
"""Events that end or stop an attempt from outside its handler: the first one is
kept as the attempt's `stopped` (it decides the outcome of one never started)."""

C, R, S, E = State.CLAIMED, State.RUNNING, State.STOPPING, State.ENDED
MOVES: dict[tuple[State, Event], State] = {
    (C, Event.STARTED): R,
    (C, Event.NO_SLOT): E,
    (C, Event.UNREADABLE): E,
    **{(C, stop): E for stop in STOPS},
    **{(R, stop): S for stop in STOPS},
    **{(S, stop): S for stop in STOPS},  # the first reason stands
    **{(E, stop): E for stop in STOPS},  # decided already: its write finds out
    (R, Event.FINISHED): E,
    (S, Event.FINISHED): E,
    (E, Event.WRITTEN): State.WRITTEN,
    (E, Event.GIVEN_BACK): State.GIVEN_BACK,
    (E, Event.LOST): State.LOST,
    (E, Event.SUSPENDED): State.SUSPENDED,
}
"""The only moves: (state, event) -> the next state. Anything else is illegal."""

HELD = frozenset({C, R, S, E})
"""States whose lease this worker renews."""

SLOTTED = frozenset({R, S})
"""States that take a slot: the handler has not ended."""

STRICT = os.environ.get("ROTA_STRICT_ATTEMPTS", "") not in ("", "0")
"""Raise on an illegal move (tests) instead of logging it (production)."""


class IllegalMove(RuntimeError):
    """An attempt was moved in a way its lifecycle does not allow."""


@dataclasses.dataclass(eq=False)
class Execution:
    """This worker's record of one attempt: the job, its state, its task, why it
    was stopped (if it was) and, once ended, its outcome. Compared by identity.
    Its state moves only by its owner's `Attempts.dispatch`."""

    job: Job
    timeout_seconds: float | None = None
    held_at: float = 0.0
    """When this worker took the job (monotonic clock)."""
    owner: Attempts | None = dataclasses.field(default=None, repr=False)
    state: State = State.CLAIMED
    stopped: Event | None = None
    task: asyncio.Task[None] | None = None
    """None until the attempt starts (a job claimed ahead waits for a slot)."""
    outcome: Attempt | None = None
    """What to write, once ENDED."""
    _timer: asyncio.TimerHandle | None = None

    @property
    def key(self) -> Key:
        return key_of(self.job)

    @property
    def id_and_attempt(self) -> tuple[int, int]:
        """(job id, attempt number), as the logs name an attempt."""
        return (self.job.id, self.job.attempts)

    def stop(self, why: Event) -> None:
        """Stop this attempt (see `Attempts.stop`)."""
        if self.owner is not None:
            self.owner.stop(self, why)

    def start_clock(self) -> None:
        """The handler starts now: from here its time limit runs (if it has one)."""
        if self.timeout_seconds is not None and self.task is not None and not self.task.done():
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.timeout_seconds, self.stop, Event.TIMEOUT)

    def stop_clock(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def signal_stop(self) -> None:
        """Tell the handler to stop: `job.cancelled` for a sync one, a cancel for its task."""
        self.job.cancelled.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()


class Attempts:
    """The one owner of the attempts this worker holds and of its slots."""

    def __init__(self, concurrency: int, lease_seconds: float) -> None:
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self._held: dict[Execution, None] = {}
        """Every held record, in claim order. Changed on the event loop only; the
        lease renewal's thread reads a copy (one call into the dict's C code,
        which no other thread can interleave with: no lock per job)."""
        self._claimed: deque[Execution] = deque()
        """The CLAIMED records, oldest first: the order they start in."""
        self._count = dict.fromkeys(HELD, 0)
        """How many records are in each held state (an end is not counted)."""
        self.ended: Callable[[Execution, State], None] = lambda record, was: None
        """Told when a record reaches ENDED (its outcome is to be written), with the
        state it left (a slot was freed if that was RUNNING or STOPPING)."""
        self.settled: Callable[[Execution], None] = lambda record: None
        """Told when a record leaves the held ones (its outcome is settled)."""
        self.settled_total = 0
        """Records settled so far (written, given back or lost)."""
        self._quiet: asyncio.Future[None] | None = None
        """Resolved when no ENDED record is left (`settled_all` waits for it)."""

    # -- the dispatch -------------------------------------------------------------
    def claimed(self, job: Job, timeout_seconds: float | None, now: float) -> Execution:
        """A new record, CLAIMED and held from now on."""
        record = Execution(job, timeout_seconds, held_at=now, owner=self)
        self._held[record] = None
        self._claimed.append(record)
        self._count[C] += 1
        return record

    def dispatch(self, record: Execution, event: Event) -> bool:
        """Move `record` by `event`, and do what arriving in its new state means;
        False (and nothing changed) when the move is illegal."""
        was = record.state
        to = MOVES.get((was, event))
        if to is None:
            return _illegal(record, event)
        if to is was:  # a stop of one stopping or ended: the first reason stands
            return True
        if record.stopped is None and event in REASONS:
            record.stopped = event
        record.state = to
        count = self._count
        count[was] -= 1
        if was is C:
            claimed = self._claimed
            if claimed[0] is record:
                claimed.popleft()
            else:
                claimed.remove(record)
        if to is R:
            count[R] += 1
        elif to is E:
            count[E] += 1
            if was is C:  # never started: nothing will ask the handler, but say so
                record.job.cancelled.set()
            self.ended(record, was)
        elif to is S:
            count[S] += 1
            record.signal_stop()
        else:  # an end: written, given back, lost or suspended
            del self._held[record]
            self.settled_total += 1
            self.settled(record)
            quiet = self._quiet
            if quiet is not None and not count[E] and not quiet.done():
                quiet.set_result(None)
        return True

    async def settled_all(self) -> None:
        """Wait until every ENDED record is settled (the outcomes are written)."""
        while self._count[E]:
            self._quiet = asyncio.get_running_loop().create_future()
            await self._quiet

    def stop(self, record: Execution, why: Event) -> None:
        """Stop `record` (a stop event) unless it is settled already."""
        if record.state in HELD:
            self.dispatch(record, why)

    # -- what the lease renewal found ---------------------------------------------
    def renewed(
        self, records: Iterable[Execution], leases: Iterable[Lease], unknown: Collection[Key] = ()
    ) -> None:
        """On the event loop: a renewal of `records` extended `leases`. The others lost
        their lease; those whose job somebody asked to cancel are stopped too;
        `unknown` keys were not renewed this time (refused), and are left alone."""
        kept = {(lease.job_id, lease.claim): lease for lease in leases}
        for record in records:
            if record not in self._held or record.key in unknown:
                continue  # settled meanwhile, or not known this time
            lease = kept.get(record.key)
            if lease is None:
                if record.state in SLOTTED:
                    log.warning(
                        "job %s attempt %s: lease lost; stopping it", *record.id_and_attempt
                    )
                self.dispatch(record, Event.LEASE_LOST)
            elif lease.cancel_requested and record.state is not E:
                log.info("job %s: cancel requested; stopping attempt %s", *record.id_and_attempt)
                self.dispatch(record, Event.CANCEL)

    # -- views --------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._held)

    def __contains__(self, record: object) -> bool:
        return record in self._held

    def count(self, state: State) -> int:
        return self._count.get(state, 0)

    @property
    def slots_taken(self) -> int:
        """Handlers that have not ended: RUNNING and STOPPING records."""
        return self._count[R] + self._count[S]

    @property
    def slots_free(self) -> int:
        return self.concurrency - self.slots_taken

    @property
    def waiting_for_a_slot(self) -> deque[Execution]:
        """The CLAIMED records, oldest first (read only: move them by `dispatch`)."""
        return self._claimed

    def snapshot(self) -> list[Execution]:
        """The held records, now (safe from any thread)."""
        return list(self._held.copy())

    def holds(self, key: Key) -> bool:
        """Whether some held record is (job id, claim number) `key`."""
        return any(record.key == key for record in self.snapshot())

    @property
    def running(self) -> list[Execution]:
        """Held records whose handler has not ended (RUNNING or STOPPING)."""
        return [record for record in self.snapshot() if record.state in SLOTTED]


def _illegal(record: Execution, event: Event) -> bool:
    job_id, attempt = record.id_and_attempt
    message = f"job {job_id} attempt {attempt}: illegal move {record.state} by {event}"
    if STRICT:
        raise IllegalMove(message)
    log.error("%s; ignored", message)
    return False
