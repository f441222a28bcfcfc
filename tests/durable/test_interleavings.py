"""The races of waits, with the interleavings held by hand: an emit, a child's
end or a cancel that commits while its job is suspending is never lost,
whichever of the two transactions takes the lock first."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row

import rota
from rota import sql
from rota.attempt import Attempt
from rota.claim import write_outcomes
from rota.jobs import Outcome, Status
from rota.reaper import Reaper
from tests.acceptance.procs import wait_for
from tests.durable.helpers import later, row

SUSPEND = "SELECT rota.suspend(%s, 1, 'w', %s, %s, %s, %s::bigint[], NULL, NULL) AS state"


def _running_job(conn: Any, parent: int | None = None) -> int:
    found = conn.execute(
        "INSERT INTO rota.job (type, status, locked_by, locked_until, attempts, claims, run_at,"
        " parent_id) VALUES ('t', 'running', 'w', now() + interval '1 hour', 1, 1, now(), %s)"
        " RETURNING id",
        (parent,),
    ).fetchone()
    return int(found["id"])


def _blocked(conn: Any, pid: int) -> Callable[[], bool]:
    """Whether backend `pid` waits for a lock (False once it is gone: a
    statement that passed may end its connection before its thread ends)."""
    query = (
        "SELECT coalesce((SELECT wait_event_type = 'Lock' FROM pg_stat_activity"
        " WHERE pid = %s), false) AS blocked"
    )
    return lambda: bool(conn.execute(query, (pid,)).fetchone()["blocked"])


def test_a_backend_gone_is_not_blocked(conn, db_url) -> None:
    # A statement on a thread's connection that passes at once may end the
    # connection before the thread ends: the look for a lock wait finds no row.
    with psycopg.connect(db_url) as gone:
        pid = gone.info.backend_pid
    here = "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s"
    wait_for(lambda: conn.execute(here, (pid,)).fetchone()["n"] == 0, what="the backend to end")
    assert _blocked(conn, pid)() is False


def _in_thread(db_url: str, query: str, params: tuple[Any, ...]) -> tuple[Any, dict[str, Any]]:
    """Run `query` on a connection of its own in a thread; its pid and, once it
    returns, its row (under "row")."""
    other = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
    out: dict[str, Any] = {"pid": other.info.backend_pid}

    def run() -> None:
        with other:
            out["row"] = other.execute(query, params).fetchone()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_an_emit_committing_while_its_waiter_suspends_is_seen(conn, db_url) -> None:
    job = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as emitter:
        emitter.execute("SELECT rota.emit('k', '1')")  # holds the key's lock, not committed
        thread, out = _in_thread(db_url, SUSPEND, (job, "event:k", "event", "k", None))
        wait_for(_blocked(conn, out["pid"]), what="the suspend to wait for the key's lock")
        emitter.commit()
    thread.join(30)
    assert out["row"]["state"] == "event"  # it saw the event: the job runs on
    assert row(conn, job)["status"] == "running"


def test_a_suspend_committing_before_the_emit_is_woken_by_it(conn, db_url) -> None:
    job = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as waiter:
        state = waiter.execute(SUSPEND, (job, "event:k", "event", "k", None)).fetchone()
        assert state["state"] == "waiting"  # not committed: holds the key's lock
        thread, out = _in_thread(db_url, "SELECT rota.emit('k', '1') AS woken", ())
        wait_for(_blocked(conn, out["pid"]), what="the emit to wait for the key's lock")
        waiter.commit()
    thread.join(30)
    assert out["row"]["woken"] == 1
    assert row(conn, job)["status"] == "ready"


def test_a_last_child_ending_while_its_parent_suspends_is_seen(conn, db_url) -> None:
    parent = _running_job(conn)
    child = _running_job(conn, parent)
    with psycopg.connect(db_url, row_factory=dict_row) as ender:
        # The child ends; its trigger holds the parent's row, not committed.
        ender.execute("UPDATE rota.job SET status = 'done' WHERE id = %s", (child,))
        thread, out = _in_thread(db_url, SUSPEND, (parent, "gather:1", "children", None, [child]))
        wait_for(_blocked(conn, out["pid"]), what="the suspend to wait for the parent's row")
        ender.commit()
    thread.join(30)
    assert out["row"]["state"] == "children"
    assert row(conn, parent)["status"] == "running"


def test_a_parent_suspending_before_its_last_child_ends_is_woken(conn, db_url) -> None:
    parent = _running_job(conn)
    child = _running_job(conn, parent)
    with psycopg.connect(db_url, row_factory=dict_row) as waiter:
        state = waiter.execute(SUSPEND, (parent, "gather:1", "children", None, [child]))
        assert state.fetchone()["state"] == "waiting"  # not committed: holds its own row
        thread, out = _in_thread(
            db_url, "UPDATE rota.job SET status = 'done' WHERE id = %s RETURNING id", (child,)
        )
        wait_for(_blocked(conn, out["pid"]), what="the child's end to wait for the parent")
        waiter.commit()
    thread.join(30)
    assert out["row"]["id"] == child
    assert row(conn, parent)["status"] == "ready"


SLEEP = {"job": None, "claim": 1, "worker": "w", "name": "sleep:1", "kind": "sleep",
         "key": None, "children": None, "seconds": 3600, "now": None}  # fmt: skip
"""The parameters of a run's suspend statement (rota/sql/durable.sql), for a sleep."""


def _cancel_in_thread(db_url: str, job: int) -> tuple[Any, dict[str, Any]]:
    """`rota.cancel` of `job` on a connection of its own in a thread; its pid and,
    once it returns, the jobs it ended (under "ended")."""
    other = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
    out: dict[str, Any] = {"pid": other.info.backend_pid}

    def run() -> None:
        with other:
            out["ended"] = rota.cancel(other, [job]).ended

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_a_cancel_committing_while_its_job_suspends_is_seen(conn, db_url) -> None:
    job = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as canceller:
        canceller.execute("SELECT 1")  # a transaction of the test's: rota.cancel commits none
        assert rota.cancel(canceller, [job]).requested == [job]  # holds the row, not committed
        thread, out = _in_thread(db_url, sql.query("suspend"), {**SLEEP, "job": job})
        wait_for(_blocked(conn, out["pid"]), what="the suspend to wait for the job's row")
        canceller.commit()
    thread.join(30)
    assert out["row"]["state"] == "cancelled"  # it does not wait: its worker ends it
    found = row(conn, job)
    assert (found["status"], found["attempts"]) == ("running", 1)
    assert conn.execute("SELECT 1 FROM rota.job_wait WHERE job_id = %s", (job,)).fetchall() == []


def test_a_job_suspending_before_the_cancel_is_cancelled_by_it(conn, db_url) -> None:
    job = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as waiter:
        state = waiter.execute(sql.query("suspend"), {**SLEEP, "job": job}).fetchone()
        assert state["state"] == "waiting"  # not committed: holds the job's row
        thread, out = _cancel_in_thread(db_url, job)
        wait_for(_blocked(conn, out["pid"]), what="the cancel to wait for the job's row")
        waiter.commit()
    thread.join(30)
    assert out["ended"] == [job]
    found = row(conn, job)
    assert (found["status"], found["last_error"]) == ("cancelled", "Cancelled: while it waited")


def test_an_emit_as_its_waits_timeout_passes_deadlocks_with_no_wake_pass(conn, db_url) -> None:
    # The emit locked the wait's row, then the job's; the wake pass the job's,
    # then the wait's. A third transaction holding the wait's row lets both
    # reach their first lock; when it ends, neither may fail.
    job = _running_job(conn)
    timed = "SELECT rota.suspend(%s, 1, 'w', 'event:k', 'event', 'k', NULL, 10, NULL) AS state"
    assert conn.execute(timed, (job,)).fetchone()["state"] == "waiting"
    due = later(conn, 20)
    with psycopg.connect(db_url, row_factory=dict_row) as holder:
        holder.execute("SELECT 1 FROM rota.job_wait WHERE job_id = %s FOR UPDATE", (job,))
        emit, emitted = _in_thread(db_url, "SELECT rota.emit('k', '1') AS woken", ())
        wait_for(_blocked(conn, emitted["pid"]), what="the emit to wait for the wait's row")
        wake, woke = _in_thread(db_url, sql.query("wake_due"), {"now": due, "limit": 10})
        wait_for(
            lambda: not wake.is_alive() or _blocked(conn, woke["pid"])(),
            what="the wake pass to pass or wait",
        )
        holder.commit()
    emit.join(30)
    wake.join(30)
    assert "row" in emitted and "row" in woke, (emitted, woke)  # neither failed
    assert row(conn, job)["status"] == "ready"


def test_an_emit_in_a_repeatable_read_transaction_wakes_a_wait_it_could_not_see(
    conn, db_url
) -> None:
    # The emit's snapshot is older than a wait committed before it took the
    # key's lock: it cannot see the wait, and woke nobody, for ever. The next
    # wake pass does.
    job = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as app:
        app.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        app.execute("SELECT 1")  # its snapshot
        assert conn.execute(SUSPEND, (job, "event:k", "event", "k", None)).fetchone()["state"] == (
            "waiting"
        )
        assert app.execute("SELECT rota.emit('k', '1') AS woken").fetchone()["woken"] == 0
        app.commit()
    assert row(conn, job)["status"] == "waiting"
    assert Reaper().run_once(db_url).woken == [job]
    assert row(conn, job)["status"] == "ready"
    ended = conn.execute("SELECT ended_by FROM rota.job_wait WHERE job_id = %s", (job,))
    assert ended.fetchone()["ended_by"] == "event"
    assert Reaper().run_once(db_url).woken == []


def test_a_cancel_of_a_parent_that_deadlocks_with_its_childs_outcome_is_retried(
    conn, db_url
) -> None:
    # The outcome locks the child, then its other rows, then (its end's
    # trigger) the parent; the cancel locks the parent, then its children. The
    # database ends one of them: the cancel is the one here (it checks for a
    # deadlock first), and it is tried again.
    parent = _running_job(conn)
    child = _running_job(conn, parent)
    other = _running_job(conn)
    with psycopg.connect(db_url, row_factory=dict_row) as holder:
        holder.execute("SELECT 1 FROM rota.job WHERE id = %s FOR SHARE", (other,))
        outcome = [Attempt(i, 1, Outcome.DONE, claim=1) for i in (child, other)]
        writer = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
        writer.execute("SET deadlock_timeout = '30s'")
        written: dict[str, Any] = {"pid": writer.info.backend_pid}

        def write() -> None:
            with writer:
                written["row"] = write_outcomes(writer, "w", outcome)

        writing = threading.Thread(target=write)
        writing.start()
        wait_for(_blocked(conn, written["pid"]), what="the outcome to wait for the other row")
        canceller = psycopg.connect(db_url, autocommit=True, row_factory=dict_row)
        canceller.execute("SET deadlock_timeout = '1s'")
        cancelled: dict[str, Any] = {"pid": canceller.info.backend_pid}

        def cancel() -> None:
            with canceller:
                try:
                    cancelled["row"] = rota.cancel(canceller, [parent])
                except rota.DatabaseError as exc:
                    cancelled["error"] = exc

        cancelling = threading.Thread(target=cancel)
        cancelling.start()
        wait_for(_blocked(conn, cancelled["pid"]), what="the cancel to wait for the child")
        holder.commit()
    writing.join(60)
    cancelling.join(60)
    assert "error" not in cancelled, cancelled
    assert written["row"] == {(child, 1): Status.DONE, (other, 1): Status.DONE}
    assert cancelled["row"].requested == [parent]
    assert row(conn, parent)["cancel_requested_at"] is not None
