"""Results and history: a handler's return value kept in the job's row, every
attempt's error kept beside the last one, and both kept by the archive."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import rota
from rota import claim as claims
from rota.archive import Archiver, ArchiveSettings
from rota.claim import Attempt
from rota.handlers import Handler
from rota.jobs import Job, Outcome, Status
from rota.reaper import Reaper
from tests.acceptance.procs import rota as rota_cli
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _running

T0 = datetime(2030, 1, 1, tzinfo=UTC)


def finished(conn: Any, job_id: int) -> dict[str, Any] | None:
    row = conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    return row if row["status"] in {"done", "dead", "failed"} else None


def _sync_returns(job: Job) -> Any:
    return {"sent_to": job.payload["to"], "n": [1, 2.5, None, "é"]}


async def _async_returns(job: Job) -> Any:
    return ["ok", job.id]


async def _returns_none(job: Job) -> None:
    return None


async def _returns_object(job: Job) -> Any:
    return object()


async def _returns_too_much(job: Job) -> Any:
    return "x" * (300 * 1024)


HANDLERS = {
    "sync.returns": Handler("sync.returns", _sync_returns, is_async=False, wants_context=False),
    "async.returns": Handler("async.returns", _async_returns, is_async=True, wants_context=False),
    "returns.none": Handler("returns.none", _returns_none, is_async=True, wants_context=False),
    "returns.object": Handler(
        "returns.object", _returns_object, is_async=True, wants_context=False
    ),
    "returns.too.much": Handler(
        "returns.too.much", _returns_too_much, is_async=True, wants_context=False
    ),
}


def test_return_values_are_kept_and_read_back_with_rota_result(conn, db_url) -> None:
    sync_id = rota.enqueue(conn, "sync.returns", {"to": "a@example.com"})
    async_id = rota.enqueue(conn, "async.returns")
    none_id = rota.enqueue(conn, "returns.none")
    waiting = rota.enqueue(conn, "not.run.yet", run_at=T0)
    with _running(db_url, HANDLERS, concurrency=2):
        for job_id in (sync_id, async_id, none_id):
            wait_for(lambda j=job_id: finished(conn, j), what=f"job {job_id} to finish")
    assert rota.result(conn, sync_id) == (
        Status.DONE,
        {"sent_to": "a@example.com", "n": [1, 2.5, None, "é"]},
    )
    assert rota.result(db_url, async_id) == (Status.DONE, ["ok", async_id])
    assert rota.result(conn, none_id) == (Status.DONE, None)
    assert rota.result(conn, waiting) == (Status.READY, None)
    with pytest.raises(rota.RotaError, match="no job with id 999999"):
        rota.result(conn, 999999)


@pytest.mark.parametrize(
    ("job_type", "reason"),
    [
        ("returns.object", "the handler's return value is not JSON-serialisable"),
        ("returns.too.much", "the handler's return value is 307202 bytes, over the limit"),
    ],
)
def test_a_return_value_rota_cannot_keep_is_an_error_of_its_attempt(
    conn, db_url, job_type, reason
) -> None:
    job_id = rota.enqueue(conn, job_type, max_attempts=1)
    with _running(db_url, HANDLERS, concurrency=1):
        row = wait_for(lambda: finished(conn, job_id), what="the job to end")
    assert row["status"] == "dead"
    assert row["result"] is None
    assert row["last_error"].startswith(f"InvalidInput: {reason}"), row["last_error"]
    assert [e["error"] for e in row["errors"]] == [row["last_error"]]


def test_a_return_value_comes_back_from_a_child_process(conn, db_url, tmp_path) -> None:
    module = tmp_path / "returning_handlers.py"
    module.write_text(
        "import rota\n\n"
        "@rota.handler('child.returns')\n"
        "def child_returns(job):\n"
        "    return {'pid_seen': True, 'id': job.id}\n"
    )
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        import returning_handlers  # noqa: F401

        handlers = {"child.returns": rota.handlers.registered()["child.returns"]}
        job_id = rota.enqueue(conn, "child.returns")
        with _running(
            db_url,
            handlers,
            concurrency=1,
            isolation="process",
            handler_modules=["returning_handlers"],
        ):
            wait_for(lambda: finished(conn, job_id), what="the job to be done")
    finally:
        sys.path.remove(str(tmp_path))
    assert rota.result(conn, job_id) == (Status.DONE, {"pid_seen": True, "id": job_id})


def _attempt(conn: Any, job_id: int, n: int, outcome: Outcome, error: str | None) -> None:
    (job,) = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(minutes=n))
    assert (job.id, job.attempts, job.claims) == (job_id, n, n)
    written = claims.write_outcomes(
        conn, "w", [Attempt.of(job, outcome, 0, error)], now=T0 + timedelta(minutes=n)
    )
    assert written


def test_every_attempts_error_is_kept_the_last_twenty(conn) -> None:
    job_id = rota.enqueue(conn, "flaky", max_attempts=30, now=T0)
    for n in range(1, 26):
        _attempt(conn, job_id, n, Outcome.RETRY, f"ValueError: attempt {n}")
    _attempt(conn, job_id, 26, Outcome.DONE, None)
    row = conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert row["status"] == "done"
    assert row["last_error"] == "ValueError: attempt 25"
    assert [e["attempt"] for e in row["errors"]] == list(range(6, 26))
    assert [e["error"] for e in row["errors"]][-1] == "ValueError: attempt 25"
    at = datetime.fromisoformat(row["errors"][-1]["at"])
    assert at == T0 + timedelta(minutes=25)


def test_a_lease_that_expired_is_an_error_in_the_history(conn) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    claims.claim(conn, "gone", 1, 30, now=T0)
    assert Reaper().run_once(conn, now=T0 + timedelta(minutes=1)).requeued == [job_id]
    row = conn.execute("SELECT * FROM rota.job WHERE id = %s", (job_id,)).fetchone()
    assert row["last_error"].startswith("LeaseExpired: worker gone")
    assert row["errors"] == [
        {"attempt": 1, "at": row["errors"][0]["at"], "error": row["last_error"]}
    ]


def test_the_archive_keeps_result_errors_and_group(conn) -> None:
    job_id = rota.enqueue(conn, "t", now=T0)
    conn.execute("UPDATE rota.job SET group_key = 'tenant-1' WHERE id = %s", (job_id,))
    _attempt(conn, job_id, 1, Outcome.RETRY, "ValueError: first")
    (job,) = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(minutes=5))
    claims.write_outcomes(
        conn,
        "w",
        [Attempt.of(job, Outcome.DONE, result=json.dumps({"total": 3}))],
        now=T0 + timedelta(minutes=5),
    )
    moved = Archiver(ArchiveSettings(done_retention_seconds=0)).run_once(
        conn, now=T0 + timedelta(days=1)
    )
    assert moved.done == 1
    archived = conn.execute("SELECT * FROM rota.job_archive WHERE id = %s", (job_id,)).fetchone()
    assert (archived["result"], archived["group_key"]) == ({"total": 3}, "tenant-1")
    assert [e["error"] for e in archived["errors"]] == ["ValueError: first"]
    assert rota.result(conn, job_id) == (Status.DONE, {"total": 3})


def test_rota_jobs_show_prints_the_result_and_the_errors(conn, db_url) -> None:
    job_id = int(rota_cli(db_url, "enqueue", "t", "--group", "tenant-1").stdout)
    _attempt(conn, job_id, 1, Outcome.RETRY, "ValueError: first")
    (job,) = claims.claim(conn, "w", 1, 30, now=T0 + timedelta(minutes=5))
    claims.write_outcomes(conn, "w", [Attempt.of(job, Outcome.DONE, result='{"id":"abc"}')], now=T0)
    shown = json.loads(rota_cli(db_url, "jobs", "show", str(job_id), "--json").stdout)
    assert shown["result"] == {"id": "abc"}
    assert [(e["attempt"], e["error"]) for e in shown["errors"]] == [(1, "ValueError: first")]
    assert shown["status"] == "done" and shown["group_key"] == "tenant-1"
