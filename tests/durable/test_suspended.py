"""A suspended attempt in the worker's one state machine: its slot is free when its
handler ends, nothing is written for it, and it settles as `suspended`."""

from __future__ import annotations

from datetime import UTC, datetime

from rota.attempt import Attempt
from rota.errors import Suspended
from rota.jobs import Job, Outcome, Status
from rota.settings import BackoffSettings
from rota_worker.attempts import HELD, Attempts, Event, State
from rota_worker.execute import outcome_of_error
from rota_worker.outcomes import OutcomeBuffer


def _job() -> Job:
    return Job(7, "t", {}, None, Status.RUNNING, datetime(2030, 1, 1, tzinfo=UTC), 1, 20)


def test_a_suspended_attempt_frees_its_slot_and_settles_with_nothing_written() -> None:
    owner = Attempts(concurrency=1, lease_seconds=30)
    record = owner.claimed(_job(), None, 0.0)
    owner.dispatch(record, Event.STARTED)
    assert owner.slots_free == 0
    record.outcome = outcome_of_error(record.job, Suspended(7, "sleep:1"), BackoffSettings())
    assert record.outcome == Attempt(7, 1, Outcome.WAITING)
    owner.dispatch(record, Event.FINISHED)
    assert owner.slots_free == 1  # free at once, before anything is settled
    assert OutcomeBuffer.to_write([record]) == []
    assert owner.dispatch(record, Event.SUSPENDED)
    assert record.state is State.SUSPENDED and State.SUSPENDED not in HELD
    assert record not in owner
