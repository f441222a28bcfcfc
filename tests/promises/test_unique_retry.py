"""Unique jobs and retry, whole.

`rota dead retry --all` revives every dead job, in batches, says how many, and
names each job it left with the reason ("key held by job N"); a dead
unique_active job whose key a newer job holds is told apart from one that is
not dead; a retry racing an enqueue of the same key ends in that reason or a
clear refusal, never the driver's UniqueViolation (nor a 500 in the console).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

import rota
from rota import control
from rota.cli import main
from rota.schedule_store import ScheduleSpec
from rota.schedule_store import upsert as upsert_schedule
from tests.acceptance.procs import wait_for
from tests.web.conftest import BEARER, make_client

DEAD = (
    "INSERT INTO rota.job (type, status, attempts, max_attempts, finished_at, last_error,"
    " unique_key, unique_active)"
    " SELECT 't', 'dead', 3, 3, now(), 'boom', %s, %s FROM generate_series(1, %s)"
    " RETURNING id"
)


def _dead(conn: psycopg.Connection[Any], n: int = 1, key: str | None = None) -> list[int]:
    return [r["id"] for r in conn.execute(DEAD, (key, key is not None, n)).fetchall()]


def _cli(monkeypatch: pytest.MonkeyPatch, capsys: Any, url: str, *argv: str) -> tuple[int, str]:
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out + err


def test_retry_all_revives_every_dead_job_and_names_those_it_left(
    conn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    plain = _dead(conn, 2500)
    held = _dead(conn, 1, key="acct-1")[0]
    holder = rota.enqueue(conn, "t", key="acct-1", unique_active=True)
    early = _dead(conn, 1, key="acct-2")[0]
    more = _dead(conn, 10)
    code, out = _cli(monkeypatch, capsys, db_url, "dead", "retry", "--all")
    assert code == 0, out
    assert f"{len(plain) + 1 + len(more)} job(s) back to ready" in out
    assert f"key held by job {holder} (left alone): [{held}]" in out
    statuses = conn.execute(
        "SELECT status, count(*) AS n FROM rota.job GROUP BY status ORDER BY status"
    ).fetchall()
    assert statuses == [{"status": "dead", "n": 1}, {"status": "ready", "n": 2512}]
    assert conn.execute("SELECT status FROM rota.job WHERE id = %s", (early,)).fetchone() == {
        "status": "ready"
    }


def test_a_left_job_in_a_full_batch_does_not_end_the_walk(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(control, "BATCH_SIZE", 3)
    first = _dead(conn, 1, key="k")[0]
    rota.enqueue(conn, "t", key="k", unique_active=True)
    rest = _dead(conn, 7)
    result = control.retry_report(conn, all_matching=True)
    assert result.revived == rest
    assert list(result.left) == [first]


def test_a_dead_unique_job_whose_key_is_held_says_so(
    conn: psycopg.Connection[Any], db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    dead = _dead(conn, 1, key="acct")[0]
    holder = rota.enqueue(conn, "t", key="acct", unique_active=True)
    code, out = _cli(monkeypatch, capsys, db_url, "dead", "retry", str(dead), str(holder))
    assert code == 0
    assert f"key held by job {holder} (left alone): [{dead}]" in out
    assert f"not dead (left alone): [{holder}]" in out
    assert control.retry_report(conn, [dead]).left == {dead: f"key held by job {holder}"}


def _blocked(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute(
        "SELECT wait_event_type = 'Lock' AS waiting FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return bool(row and row["waiting"])


class RacingRetry:
    """A retry on its own connection, started while another transaction holds an
    uncommitted enqueue of the same key: it waits on the key's index entry."""

    def __init__(self, db_url: str, run: Any) -> None:
        self.conn = psycopg.connect(db_url, autocommit=True)
        self.pid = self.conn.info.backend_pid
        self.outcome: Any = None
        self.thread = threading.Thread(target=self._run, args=(run,))

    def _run(self, run: Any) -> None:
        try:
            self.outcome = run(self.conn)
        except BaseException as exc:
            self.outcome = exc

    def __enter__(self) -> RacingRetry:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.thread.join(timeout=60)
        self.conn.close()


@pytest.mark.parametrize("ending", ["commit", "rollback"])
def test_a_retry_racing_an_enqueue_of_the_key_gets_the_reason(
    conn: psycopg.Connection[Any], db_url: str, ending: str
) -> None:
    dead = _dead(conn, 1, key="race")[0]
    with psycopg.connect(db_url) as enqueuer:  # an explicit transaction, held open
        holder = rota.enqueue(enqueuer, "t", key="race", unique_active=True)
        with RacingRetry(db_url, lambda c: control.retry_report(c, [dead])) as racing:
            wait_for(lambda: _blocked(conn, racing.pid), 30, "the retry to wait on the key")
            getattr(enqueuer, ending)()
    result = racing.outcome
    assert isinstance(result, control.RetryResult), result
    if ending == "commit":
        assert result.left == {dead: f"key held by job {holder}"} and result.revived == []
    else:
        assert result.revived == [dead] and result.left == {}


def test_the_console_answers_409_to_a_retry_that_lost_the_race(
    conn: psycopg.Connection[Any], db_url: str
) -> None:
    dead = _dead(conn, 1, key="race")[0]
    with make_client(db_url) as client, psycopg.connect(db_url) as enqueuer:
        holder = rota.enqueue(enqueuer, "t", key="race", unique_active=True)

        def post(_: Any) -> Any:
            return client.post(f"/jobs/{dead}/retry", headers=BEARER, follow_redirects=False)

        with RacingRetry(db_url, post) as racing:
            wait_for(
                lambda: conn.execute(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database()"
                ).fetchone()["n"],  # type: ignore[index]
                30,
                "the console's retry to wait on the key",
            )
            enqueuer.commit()
    response = racing.outcome
    assert response.status_code == 409, response.text
    assert f"key held by job {holder}" in response.text


def test_limit_set_refuses_the_type_names_enqueue_refuses(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any, conn: psycopg.Connection[Any]
) -> None:
    name = "x" * 1100
    enqueued = _cli(monkeypatch, capsys, db_url, "enqueue", name)
    limited = _cli(monkeypatch, capsys, db_url, "limit", "set", name, "--concurrency", "2")
    assert enqueued[0] == limited[0] == 2, (enqueued, limited)
    assert (
        enqueued[1]
        == limited[1]
        == "rota: error: job type is 1100 bytes long, over the limit of 1024\n"
    )
    assert conn.execute("SELECT count(*) AS n FROM rota.job_limit").fetchone() == {"n": 0}


@pytest.mark.parametrize("name", ["x" * 1100, "   "], ids=["long", "blank"])
def test_every_door_to_limits_and_pauses_refuses_a_type_name_alike(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: Any, conn: psycopg.Connection[Any],
    name: str,
) -> None:  # fmt: skip
    # Python, the CLI, the console and plain SQL, for a limit and for a pause.
    with pytest.raises(rota.InvalidInput) as python:
        rota.set_limit(conn, name, concurrency=2)
    reason = str(python.value)
    with pytest.raises(rota.InvalidInput) as paused:
        rota.pause(conn, [name])
    assert str(paused.value) == reason
    code, said = _cli(monkeypatch, capsys, db_url, "limit", "set", name, "--concurrency", "2")
    assert (code, said) == (2, f"rota: error: {reason}\n")
    code, said = _cli(monkeypatch, capsys, db_url, "pause", name)
    assert (code, said) == (2, f"rota: error: {reason}\n")
    with make_client(db_url) as client:
        for path, form in (
            ("/types/limit", {"type": name, "concurrency": "2"}),
            ("/types/pause", {"type": name}),
        ):
            answer = client.post(path, data=form, headers={**BEARER, "Accept": "application/json"})
            assert answer.status_code == 400, (path, answer.text)
            # A blank form field is no field at all: the console asks for one.
            assert (reason if name.strip() else "give") in answer.text
    for statement in (
        "INSERT INTO rota.job_limit (type, concurrency) VALUES (%s, 2)",
        "INSERT INTO rota.paused_type (type) VALUES (%s)",
    ):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as sql, conn.transaction():
            conn.execute(statement, (name,))
        assert sql.value.diag.message_primary == reason
    written = conn.execute(
        "SELECT (SELECT count(*) FROM rota.job_limit)"
        " + (SELECT count(*) FROM rota.paused_type) AS n"
    ).fetchone()
    assert written == {"n": 0}


def test_the_console_pauses_and_limits_every_type_name_enqueue_takes(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    name = "t" * 600  # over a search filter's 500 characters, within a name's 1,024 bytes
    rota.enqueue(conn, name)
    with make_client(db_url) as client:
        for path, form in (
            ("/types/pause", {"type": name}),
            ("/types/limit", {"type": name, "concurrency": "2"}),
        ):
            answer = client.post(path, data=form, headers={**BEARER, "Accept": "application/json"})
            assert answer.status_code == 200, (path, answer.text)
    assert conn.execute("SELECT type FROM rota.paused_type").fetchall() == [{"type": name}]
    assert conn.execute("SELECT type FROM rota.job_limit").fetchall() == [{"type": name}]


def test_the_console_retries_and_suspends_by_every_name_enqueue_takes(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    name = "t" * 600  # over a search filter's 500 characters, within a name's 1,024 bytes
    [job_id] = _dead(conn)
    conn.execute("UPDATE rota.job SET type = %s WHERE id = %s", (name, job_id))
    upsert_schedule(conn, ScheduleSpec(name, "t", "0 * * * *"))
    json = {**BEARER, "Accept": "application/json"}
    with make_client(db_url) as client:
        group = {"type": name, "error_class": "boom"}  # its last error: "boom"
        retried = client.post("/dead/retry", data=group, headers=json)
        assert retried.status_code == 200, retried.text
        suspended = client.post("/schedules/suspend", data={"name": name}, headers=json)
        assert suspended.status_code == 200, suspended.text
        run = client.post(f"/schedules/{name}/run", headers=json)
        assert run.status_code == 200, run.text
    assert conn.execute("SELECT status FROM rota.job WHERE id = %s", (job_id,)).fetchone() == {
        "status": "ready"
    }
    [row] = conn.execute("SELECT suspend FROM rota.schedule WHERE name = %s", (name,)).fetchall()
    assert row == {"suspend": True}


def test_the_job_list_filters_by_every_type_and_key_a_job_can_hold(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    name, key = "t" * 600, "k" * 600
    job_id = rota.enqueue(conn, name, key=key)
    other = rota.enqueue(conn, "other")
    with make_client(db_url) as client:
        for params in ({"type": name}, {"key": key}):
            found = client.get("/jobs", params=params, headers=BEARER)
            assert found.status_code == 200, found.text
            assert f'href="/jobs/{job_id}"' in found.text
            assert f'href="/jobs/{other}"' not in found.text
        refused = client.get("/jobs", params={"type": "t" * 1100}, headers=BEARER)
        assert refused.status_code == 400
        assert "job type is 1100 bytes long, over the limit of 1024" in refused.text
