"""Rota behind PgBouncer (Debian's 1.18) in each pool mode, against the table in
docs/operations.md ("Connection poolers"):

- PgBouncer 1.18 refuses a connection that carries startup ``options``, which
  Rota's own connections do (their statement and lock timeouts) unless it is
  told to ignore them (``ignore_startup_parameters = options``), and then the
  timeouts do not reach the server;
- session mode: a real `rota worker` drains the queue, and an idle one is woken
  by NOTIFY long before its poll interval;
- transaction mode: enqueues, claims, heartbeats and outcomes work with
  prepared statements turned off (``ROTA_PREPARED_STATEMENTS=off``); with
  psycopg's prepared statements on, the worker's statements fail; NOTIFYs
  never reach the listener (PgBouncer drops them), so an idle worker finds new
  jobs by polling; a worker's registry refresh that gets another server
  connection than the one holding its presence lock goes on without it;
- statement mode: a single-statement enqueue works, a claim does not.

Skipped without the pgbouncer binary (`make install` installs Debian's package
when it may).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rota
from rota import claim as claims
from rota import workers
from rota.deadlines import Deadlines
from rota.errors import DatabaseUnavailable
from rota.settings import ConnectionSettings
from rota_worker.listener import Listener
from tests import pgbouncer
from tests.acceptance.procs import WorkerProcess, wait_for
from tests.conftest import Server
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.skipif(
    pgbouncer.BINARY is None, reason="pgbouncer not installed (Debian package pgbouncer)"
)

IGNORE_OPTIONS = {"ignore_startup_parameters": "options"}

DROPPED_NOTIFY = "got packet 'A' from server when not linked"
"""What PgBouncer logs for a notification that reaches a server connection no
client holds (it drops it)."""


@pytest.fixture
def bouncer(pg_server: Server, request: pytest.FixtureRequest) -> Iterator[PgBouncer]:
    """A PgBouncer in the pool mode the test is parametrized with, ignoring startup options."""
    with PgBouncer(pg_server.admin_url, request.param, **IGNORE_OPTIONS) as running:
        yield running


def scalar(conn: psycopg.Connection[Any], query: str, *params: Any) -> Any:
    row = conn.execute(query, params).fetchone()
    return None if row is None else next(iter(row.values()))


def _until_done(conn: psycopg.Connection[Any], jobs: int) -> None:
    wait_for(
        lambda: scalar(conn, "SELECT count(*) FROM rota.job WHERE status = 'done'") == jobs,
        60,
        "every job done",
    )


def test_the_version_is_the_one_the_docs_name() -> None:
    assert pgbouncer.version().startswith("PgBouncer 1.18."), pgbouncer.version()


def test_startup_options_are_refused_unless_ignored_and_then_dropped(
    pg_server: Server, db_url: str
) -> None:
    deadlines = Deadlines(ConnectionSettings())
    with PgBouncer(pg_server.admin_url, "session") as strict:
        with pytest.raises(DatabaseUnavailable, match="unsupported startup parameter: options"):
            deadlines.connect(strict.url(db_url), "rota-worker-claim")
        # Without a statement timeout the claim's connection sends no options, but
        # the heartbeat's lock timeout is one.
        bare = Deadlines(ConnectionSettings(statement_timeout_seconds=None))
        bare.connect(strict.url(db_url), "rota-worker-claim").close()
        with pytest.raises(DatabaseUnavailable, match="unsupported startup parameter: options"):
            bare.connect(strict.url(db_url), "rota-worker-heartbeat", lock_timeout=True)
    with PgBouncer(pg_server.admin_url, "session", **IGNORE_OPTIONS) as lenient:
        conn = deadlines.connect(lenient.url(db_url), "rota-worker-heartbeat", lock_timeout=True)
        with conn:
            assert scalar(conn, "SHOW statement_timeout") == "0"  # not the 30 s asked for
            assert scalar(conn, "SHOW lock_timeout") == "0"


def _drain(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str, tmp_path: Path, **env: str
) -> str:
    """Enqueue through the pooler fast jobs and one that outlives its lease, let a
    real worker behind the pooler run them all, and return the worker's log."""
    through = bouncer.url(db_url)
    ids = rota.enqueue_many(through, [rota.NewJob("noop", {"n": i}) for i in range(300)])
    slow = rota.enqueue(through, "slow", {"seconds": 6})
    log = tmp_path / "worker.log"
    worker = WorkerProcess(through, "--concurrency", "4", "--lease", "3", log=log, env=env)
    try:
        first = wait_for(
            lambda: scalar(conn, "SELECT locked_until FROM rota.job WHERE id = %s", slow),
            30,
            "the slow job to be claimed",
        )
        # Its lease (3 s) is renewed every second through the pooler.
        wait_for(
            lambda: scalar(conn, "SELECT locked_until FROM rota.job WHERE id = %s", slow) > first,
            30,
            "a heartbeat to renew the slow job's lease",
        )
        _until_done(conn, 301)
    finally:
        assert worker.stop() == 0
    attempts = conn.execute(
        "SELECT attempts, count(*) AS n FROM rota.job WHERE id = ANY(%s) GROUP BY 1",
        ([*ids, slow],),
    ).fetchall()
    assert attempts == [{"attempts": 1, "n": 301}]  # no outcome refused, no lease lost
    return worker.output()


@pytest.mark.parametrize(
    ("bouncer", "env"),
    [("session", {}), ("transaction", {"ROTA_PREPARED_STATEMENTS": "off"})],
    ids=["session", "transaction"],
    indirect=["bouncer"],
)
def test_a_worker_behind_the_pooler_runs_every_job_once(
    conn: psycopg.Connection[Any],
    bouncer: PgBouncer,
    env: dict[str, str],
    db_url: str,
    tmp_path: Path,
) -> None:
    output = _drain(conn, bouncer, db_url, tmp_path, **env)
    assert " ERROR " not in output and "refused" not in output, output


@pytest.mark.parametrize("bouncer", ["transaction"], indirect=True)
def test_durable_steps_behind_transaction_pooling_prepare_nothing(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str, tmp_path: Path
) -> None:
    # Each run's connection sends a job's ten steps: prepared on a connection's
    # sixth, they would fail as the claims do (the test below).
    through = bouncer.url(db_url)
    ids = rota.enqueue_many(through, [rota.NewJob("ten.steps") for _ in range(40)])
    log = tmp_path / "worker.log"
    env = {"ROTA_PREPARED_STATEMENTS": "off"}
    worker = WorkerProcess(through, "--concurrency", "4", "--lease", "3", log=log, env=env)
    try:
        _until_done(conn, 40)
    finally:
        assert worker.stop() == 0
    rows = conn.execute(
        "SELECT attempts, result, count(*) AS n FROM rota.job WHERE id = ANY(%s) GROUP BY 1, 2",
        (ids,),
    ).fetchall()
    assert rows == [{"attempts": 1, "result": 45, "n": 40}], worker.output()
    assert scalar(conn, "SELECT count(*) FROM rota.job_step WHERE job_id = ANY(%s)", ids) == 400


@pytest.mark.parametrize("bouncer", ["transaction"], indirect=True)
def test_prepared_statements_fail_behind_transaction_pooling(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str, tmp_path: Path
) -> None:
    # psycopg prepares a statement on its sixth run, on whichever server connection
    # the transaction got: the next transaction of that client may get another one
    # (the statement "does not exist" there, or is another client's of the same
    # name), and another client's statement of the same name may be prepared where
    # one exists already.
    through = bouncer.url(db_url)
    rota.enqueue_many(through, [rota.NewJob("noop") for _ in range(300)])
    log = tmp_path / "worker.log"
    worker = WorkerProcess(through, "--concurrency", "4", "--lease", "3", log=log)
    try:
        wait_for(
            lambda: 'prepared statement "_pg3_' in log.read_text(),
            60,
            "a prepared statement to fail",
        )
    finally:
        worker.stop()


@pytest.mark.parametrize("bouncer", ["transaction"], indirect=True)
def test_a_registry_refresh_never_waits_for_the_presence_lock_another_server_holds(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str
) -> None:
    # The registration takes the worker's presence lock (a session advisory lock)
    # on the server connection its transaction got; the pool keeps it there. With
    # that server connection busy, the next refresh gets another one.
    info = workers.WorkerInfo("w-pooled", 1)
    registry = Deadlines(ConnectionSettings(answer_timeout_seconds=5)).connect(
        bouncer.url(db_url), "rota-worker-registry", each_answer=True
    )
    with registry, psycopg.connect(bouncer.url(db_url)) as busy:
        workers.register(registry, info)
        holder = scalar(conn, "SELECT pid FROM pg_locks WHERE locktype = 'advisory'")
        assert busy.execute("SELECT pg_backend_pid()").fetchone() == (holder,)  # in a transaction
        workers.refresh(registry, info)  # waited for ever (to the answer deadline) before
        assert scalar(conn, "SELECT count(*) FROM rota.worker WHERE seen_at > started_at") == 1
        busy.rollback()


def _listening(bouncer: PgBouncer, db_url: str) -> tuple[Listener, threading.Event]:
    """A worker's listener behind the pooler, past its LISTEN (and the wake-up that
    follows every connection)."""
    wake = threading.Event()
    listener = Listener(bouncer.url(db_url), wake)
    listener.start()
    assert wake.wait(30), "the listener did not connect"
    wake.clear()
    return listener, wake


def _notify(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as direct:
        direct.execute("NOTIFY rota_jobs")


@pytest.mark.parametrize("bouncer", ["session"], indirect=True)
def test_session_pooling_carries_notifications(bouncer: PgBouncer, db_url: str) -> None:
    listener, wake = _listening(bouncer, db_url)
    try:
        _notify(db_url)
        assert wake.wait(10)
    finally:
        listener.stop()
        listener.join(10)


@pytest.mark.parametrize("bouncer", ["transaction"], indirect=True)
def test_transaction_pooling_drops_notifications(bouncer: PgBouncer, db_url: str) -> None:
    listener, wake = _listening(bouncer, db_url)
    try:
        # The LISTEN stays on the server connection it ran on, which went back to the
        # pool with the transaction: PgBouncer receives the notification there and
        # drops it, as it logs.
        _notify(db_url)
        wait_for(lambda: DROPPED_NOTIFY in bouncer.output(), 10, "PgBouncer to drop it")
        assert not wake.is_set()
    finally:
        listener.stop()
        listener.join(10)


@pytest.mark.parametrize(
    ("bouncer", "args"),
    [
        # Woken by the NOTIFY long before its poll interval of a minute.
        ("session", ["--poll-interval", "60"]),
        # No NOTIFY arrives: its claim every 2 s finds the job.
        ("transaction", ["--poll-interval", "2", "--no-prepared-statements"]),
    ],
    ids=["session-notified", "transaction-polling"],
    indirect=["bouncer"],
)
def test_an_idle_worker_finds_a_new_job_within_seconds(
    conn: psycopg.Connection[Any],
    bouncer: PgBouncer,
    args: list[str],
    db_url: str,
    tmp_path: Path,
) -> None:
    through = bouncer.url(db_url)
    worker = WorkerProcess(through, *args, log=tmp_path / "worker.log")
    done = "SELECT status = 'done' FROM rota.job WHERE id = %s"
    try:
        first = rota.enqueue(through, "noop")
        wait_for(lambda: scalar(conn, done, first), 60, "the first job done")
        second = rota.enqueue(through, "noop")  # the worker is idle, or about to be
        wait_for(lambda: scalar(conn, done, second), 10, "the second job done")
    finally:
        assert worker.stop() == 0


@pytest.mark.parametrize("bouncer", ["statement"], indirect=True)
def test_statement_pooling_takes_an_enqueue_and_a_claim_but_no_transaction_block(
    conn: psycopg.Connection[Any], bouncer: PgBouncer, db_url: str
) -> None:
    through = bouncer.url(db_url)
    with psycopg.connect(through, autocommit=True, prepare_threshold=None) as pooled:
        job_id = rota.enqueue(pooled, "t")
        assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "ready"
        # Its setting and the claim are one pipeline, one implicit transaction that
        # ends at the pipeline's Sync: the pooler keeps them on one server connection.
        _, [claimed] = claims.write_and_claim(pooled, "w", [], 1, 30)
        assert claimed.id == job_id
        assert scalar(conn, "SELECT status FROM rota.job WHERE id = %s", job_id) == "running"
        # Several statements in a transaction block (a job unique while active
        # takes its own statement beside the others) are refused.
        with pytest.raises(DatabaseUnavailable):
            rota.enqueue_many(
                pooled, [rota.NewJob("t"), rota.NewJob("t", key="u", unique_active=True)]
            )
    assert "transaction blocks not allowed" in bouncer.output()
    assert scalar(conn, "SELECT count(*) FROM rota.job") == 1
