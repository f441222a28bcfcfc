"""The life of an attempt: the one dispatch, the only moves allowed, and what an
illegal one does; the slots are the records whose handler has not ended."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from rota.jobs import Job, Status
from rota_worker import attempts
from rota_worker.attempts import HELD, MOVES, STOPS, Attempts, Event, IllegalMove, State


def _job(job_id: int = 7) -> Job:
    return Job(job_id, "t", {}, None, Status.RUNNING, datetime(2030, 1, 1, tzinfo=UTC), 2, 20)


def _owner() -> tuple[Attempts, list[tuple[int, State]], list[int]]:
    owner = Attempts(concurrency=2, lease_seconds=30)
    ended: list[tuple[int, State]] = []
    settled: list[int] = []
    owner.ended = lambda record, was: ended.append((record.job.id, was))
    owner.settled = lambda record: settled.append(record.job.id)
    return owner, ended, settled


@pytest.mark.parametrize(
    "path",
    [
        [Event.STARTED, Event.FINISHED, Event.WRITTEN],
        [Event.STARTED, Event.FINISHED, Event.LOST],
        [Event.STARTED, Event.TIMEOUT, Event.CANCEL, Event.FINISHED, Event.WRITTEN],
        [Event.NO_SLOT, Event.GIVEN_BACK],
        [Event.UNREADABLE, Event.WRITTEN],
        [Event.LEASE_LOST, Event.LOST],
    ],
)
def test_an_attempt_lives_from_its_claim_to_one_end(path: list[Event]) -> None:
    owner, ended, settled = _owner()
    record = owner.claimed(_job(), None, 0.0)
    assert record.state is State.CLAIMED and len(owner) == 1
    for event in path:
        assert owner.dispatch(record, event)
    assert record.state not in HELD and len(owner) == 0
    assert not [to for (state, _), to in MOVES.items() if state is record.state]  # an end
    assert ended == [(7, State.STOPPING if Event.TIMEOUT in path else ended[0][1])]
    assert settled == [7]


def test_a_stopped_attempt_keeps_its_slot_until_its_handler_ends() -> None:
    owner, ended, _ = _owner()
    record = owner.claimed(_job(), None, 0.0)
    owner.dispatch(record, Event.STARTED)
    assert owner.slots_free == 1
    owner.dispatch(record, Event.TIMEOUT)
    assert record.state is State.STOPPING and record.stopped is Event.TIMEOUT
    assert record.job.cancelled.is_set()
    owner.dispatch(record, Event.LEASE_LOST)  # the first reason stands
    assert record.stopped is Event.TIMEOUT
    assert owner.slots_free == 1 and not ended
    owner.dispatch(record, Event.FINISHED)
    assert owner.slots_free == 2 and ended == [(7, State.STOPPING)]


def test_every_stop_is_a_move_from_every_live_state() -> None:
    for stop in STOPS:
        for state in (State.CLAIMED, State.RUNNING, State.STOPPING, State.ENDED):
            assert (state, stop) in MOVES


def test_records_are_told_apart_by_identity() -> None:
    owner, _, _ = _owner()
    old = owner.claimed(_job(), None, 0.0)
    owner.dispatch(old, Event.NO_SLOT)
    new = owner.claimed(_job(), None, 0.0)  # claimed again in the statement that gave it back
    assert old.key == new.key and old is not new
    owner.dispatch(old, Event.GIVEN_BACK)
    assert new in owner and old not in owner
    assert list(owner.waiting_for_a_slot) == [new]


def test_an_illegal_move_raises_in_tests_and_is_logged_otherwise(monkeypatch, caplog) -> None:
    owner, _, _ = _owner()
    record = owner.claimed(_job(), None, 0.0)
    owner.dispatch(record, Event.STARTED)
    with pytest.raises(IllegalMove, match="job 7 attempt 2: illegal move running by written"):
        owner.dispatch(record, Event.WRITTEN)  # its outcome is not decided yet
    monkeypatch.setattr(attempts, "STRICT", False)
    with caplog.at_level(logging.ERROR, logger="rota.worker"):
        assert not owner.dispatch(record, Event.STARTED)
    assert record.state is State.RUNNING  # nothing changed
    assert owner.slots_free == 1
    assert "illegal move running by started; ignored" in caplog.text
