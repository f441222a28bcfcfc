"""A cancel requested while a durable job runs: the job ends cancelled even when
its handler reaches a sleep, a wait or a spawn before it stops, in every
isolation, and a spawn then makes no child (the cancel, listing the parent's
children before, would have left it to run).

The run learns of the request either from the database (the worker has not
heard of it yet: a long lease, so no heartbeat comes) or from its worker,
which stopped the attempt (a short lease)."""

from __future__ import annotations

import pytest

import rota
from tests.acceptance.procs import wait_for
from tests.durable.helpers import (
    ISOLATION_HANDLERS,
    did,
    isolated,
    row,
    running,
    until_status,
)

LEASES = {"stored": 300.0, "heard": 1.5}
"""The lease per way the run learns of the cancel: a heartbeat every lease/3."""


def _cancelled_while_in_its_step(
    conn, db_url, job_type: str, payload: dict[str, str], lease: float, **settings
) -> dict:
    job_id = rota.enqueue(conn, job_type, payload, max_attempts=3)
    with running(
        db_url, isolated(conn), concurrency=1, lease_seconds=lease,
        handler_modules=[ISOLATION_HANDLERS], **settings,
    ):  # fmt: skip
        wait_for(lambda: did(conn, job_id, "step"), what="the step to start")
        assert rota.cancel(conn, [job_id]).requested == [job_id]
        found = until_status(conn, job_id, "cancelled", "waiting", "done", "ready", "dead")
    assert not did(conn, job_id, "after")
    return found


@pytest.mark.parametrize("then", ["sleep", "wait_for", "spawn"])
@pytest.mark.parametrize("known", ["stored", "heard"])
@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_a_cancelled_run_does_not_suspend(conn, db_url, isolation, known, then) -> None:
    found = _cancelled_while_in_its_step(
        conn, db_url, "iso.cancelled.in.a.step", {"known": known, "then": then},
        LEASES[known], isolation=isolation,
    )  # fmt: skip
    assert (found["status"], found["attempts"]) == ("cancelled", 1)
    assert found["last_error"] == "Cancelled: by request"
    waits = conn.execute("SELECT name FROM rota.job_wait WHERE job_id = %s", (found["id"],))
    assert waits.fetchall() == []
    children = conn.execute("SELECT id FROM rota.job WHERE parent_id = %s", (found["id"],))
    assert children.fetchall() == []


@pytest.mark.parametrize("then", ["sleep", "wait_for", "spawn"])
def test_a_cancelled_async_run_does_not_suspend(conn, db_url, then) -> None:
    found = _cancelled_while_in_its_step(
        conn, db_url, "iso.async.cancelled.in.a.step", {"then": then}, LEASES["stored"]
    )
    assert (found["status"], found["attempts"]) == ("cancelled", 1)
    assert found["last_error"] == "Cancelled: by request"
    assert row(conn, found["id"])["locked_until"] is None
