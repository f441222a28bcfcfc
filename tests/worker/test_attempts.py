"""The life of an attempt: the only moves allowed, and what an illegal one does."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from rota.jobs import Job, Status
from rota_worker import attempts
from rota_worker.attempts import MOVES, IllegalMove, State
from rota_worker.execute import Execution


def _record() -> Execution:
    return Execution(Job(7, "t", {}, None, Status.RUNNING, datetime(2030, 1, 1, tzinfo=UTC), 2, 20))


def test_an_attempt_lives_from_its_claim_to_one_end() -> None:
    for path in (
        [State.RUNNING, State.ENDED, State.WRITTEN],
        [State.RUNNING, State.ENDED, State.LOST],
        [State.ENDED, State.GIVEN_BACK],
    ):
        record = _record()
        assert record.state is State.WAITING
        assert all(record.move(to) for to in path)
        assert not MOVES[record.state]  # an end: no move leaves it


def test_an_illegal_move_raises_in_tests_and_is_logged_otherwise(monkeypatch, caplog) -> None:
    record = _record()
    record.move(State.RUNNING)
    with pytest.raises(IllegalMove, match="job 7 attempt 2: illegal move running -> written"):
        record.move(State.WRITTEN)  # its outcome is not decided yet
    monkeypatch.setattr(attempts, "STRICT", False)
    with caplog.at_level(logging.ERROR, logger="rota.worker"):
        assert not record.move(State.WAITING)
    assert record.state is State.RUNNING  # nothing changed
    assert "illegal move running -> claimed-waiting; ignored" in caplog.text
