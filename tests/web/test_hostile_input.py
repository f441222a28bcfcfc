"""Hostile input, route by route: every GET parameter, path id and form field of
the console tried with empty, signed, huge, non-numeric, non-finite, repeated,
overlong, NUL, surrogate and badly encoded values answers 4xx (never 5xx) and
writes nothing; and every page renders whatever rows the tables can hold, written
around the checks by a superuser with triggers off. The sweeps keep what held;
each test named for a defect failed before its fix."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from psycopg.types.json import Jsonb
from starlette.testclient import TestClient

from rota import schedule_store
from tests.web.conftest import BEARER, HTML, TOKEN, add_job, audit_rows, make_client

FORM = {"Content-Type": "application/x-www-form-urlencoded"}

HOSTILE = [
    "", " ", "\t", "0", "-1", str(2**63 - 1), str(2**63), str(2**64), str(-(2**63)), "9" * 400,
    "abc", "NaN", "inf", "-Infinity", "1e999", "1.5", "0x10", "\x00", "a\x00b", "\ud800", "%",
    "%zz", "x" * 20_000, "é" * 600, "2030-13-45", "0001-01-01", "infinity", "\u202e\ufeff",
    "\U0001f600", "DEAD", "unknown", "[1]", '{"a": 1e999}', "a..b=1", "=",
]  # fmt: skip

POSTED = [v for v in HOSTILE if v not in ("-Infinity", "1.5", "0x10", "%zz", "[1]", "a..b=1", "=")]
"""The hostile values each form field is tried with (fewer kinds of number: a
form sweep posts hundreds of forms)."""


def _q(value: str) -> str:
    """A value percent-encoded as bytes, a lone surrogate's bytes (not UTF-8) included."""
    return quote(value, safe="", errors="surrogatepass")


def _replica(conn: Any, *statements: str) -> None:
    """Rows written around the checks, as a superuser with triggers off could."""
    conn.execute("SET session_replication_role = replica")
    for statement in statements:
        conn.execute(statement)
    conn.execute("RESET session_replication_role")


def _unchanged(conn: Any) -> tuple[Any, ...]:
    """What an action could write: the jobs, the audit log, pauses, limits, schedules."""
    return (
        conn.execute("SELECT id, status, priority, run_at, attempts FROM rota.job ORDER BY id")
        .fetchall(),
        audit_rows(conn),
        conn.execute("SELECT type FROM rota.paused_type ORDER BY type").fetchall(),
        conn.execute("SELECT type, concurrency, rate FROM rota.job_limit ORDER BY type").fetchall(),
        conn.execute("SELECT name, suspend FROM rota.schedule ORDER BY name").fetchall(),
        conn.execute("SELECT count(*) AS n FROM rota.web_session").fetchone(),
    )  # fmt: skip


@pytest.fixture
def quiet(db_url: str) -> Any:
    """The console answering a bug with its 500 page instead of raising it here."""
    app = make_client(db_url).app
    with TestClient(app, base_url="http://console.test", raise_server_exceptions=False) as c:
        yield c


# -- GET: query parameters and path ids -----------------------------------------------

QUERIES = {
    "/": ["range"],
    "/jobs": [
        "status", "type", "key", "payload", "error", "created_from", "created_to", "before",
        "limit",
    ],
    "/jobs/bulk?action=priority&status=ready&priority=1": [
        "type", "key", "payload", "error", "created_from", "created_to",
    ],
    "/jobs/bulk?status=ready": ["action"],
    "/jobs/bulk?action=priority&status=ready": ["priority"],
    "/audit": ["before", "limit"],
}  # fmt: skip


def test_every_query_parameter_answers_hostile_values_with_200_or_400(quiet, conn):
    add_job(conn, "email", "ready", payload=Jsonb({"a": 1}))
    add_job(conn, "email", "dead", last_error="ValueError: x")
    for page, names in QUERIES.items():
        joiner = "&" if "?" in page else "?"
        for name in names:
            for value in HOSTILE:
                path = f"{page}{joiner}{name}={_q(value)}"
                response = quiet.get(path, headers=BEARER)
                assert response.status_code in (200, 400), (path[:200], response.text[:200])
                if response.status_code == 400:
                    assert "\n" not in response.json()["error"], path[:200]


@pytest.mark.parametrize("value", [v for v in HOSTILE if v] + ["\n", "\r\n", "1 2"])
def test_a_job_id_in_the_path_is_a_whole_number_or_400(quiet, conn, value):
    job_id = add_job(conn, "email", "ready")
    before = _unchanged(conn)
    response = quiet.get(f"/jobs/{_q(value)}", headers=BEARER)
    assert response.status_code in (400, 404), (value, response.text[:200])
    for action, data in [
        ("retry", ""),
        ("cancel", ""),
        ("run-now", ""),
        ("priority", "priority=3"),
    ]:
        path = f"/jobs/{_q(value)}/{action}"
        response = quiet.post(path, content=data, headers={**BEARER, **FORM})
        assert response.status_code in (400, 404), (path, response.text[:200])
    assert _unchanged(conn) == before
    assert quiet.get(f"/jobs/{job_id}", headers=BEARER).status_code == 200


def test_a_blank_job_id_is_named_in_the_400(quiet, conn):
    for path in ("/jobs/%20", "/jobs/%09"):
        response = quiet.get(path, headers=BEARER)
        assert response.status_code == 400, response.text
        assert "job id" in response.json()["error"]
    response = quiet.post("/jobs/%20/priority", content="priority=1", headers={**BEARER, **FORM})
    assert response.status_code == 400 and "job id" in response.json()["error"], response.text


@pytest.mark.parametrize(
    "path",
    [
        "/?range=1h&range=7d",
        "/jobs?status=dead&status=failed",
        "/jobs?type=email&type=sms",
        "/jobs?before=5&before=9",
        "/jobs?limit=1&limit=200",
        "/jobs/bulk?action=retry&status=dead&status=",
        "/jobs/bulk?action=retry&action=cancel",
        "/jobs/bulk?action=priority&status=ready&priority=1&priority=9",
        "/audit?limit=1&limit=2",
        "/login?next=/jobs&next=/audit",
    ],
)
def test_a_query_parameter_given_twice_is_refused_not_half_read(client, conn, path):
    add_job(conn, "email", "dead")
    response = client.get(path, headers=BEARER)
    assert response.status_code == 400, response.text
    assert "given twice" in response.json()["error"]


def test_the_login_page_names_a_parameter_it_does_not_take(client):
    response = client.get("/login?nxet=/jobs")
    assert response.status_code == 400 and "nxet" in response.json()["error"], response.text
    assert client.get("/login?next=/jobs").status_code == 200


# -- POST: form fields and bodies -------------------------------------------------------

ACTIONS = [
    ("/jobs/{dead}/retry", {}),
    ("/jobs/{ready}/cancel", {}),
    ("/jobs/{later}/run-now", {}),
    ("/jobs/{ready}/priority", {"priority": "5"}),
    ("/jobs/selected", {"action": "retry", "id": "{dead}"}),
    ("/jobs/selected", {"action": "priority", "id": "{ready}", "priority": "3"}),
    ("/jobs/bulk", {"action": "retry", "status": "dead"}),
    ("/jobs/bulk", {"action": "priority", "status": "ready", "priority": "3"}),
    ("/dead/retry", {"type": "email", "error_class": "ValueError"}),
    ("/types/pause", {"type": "email"}),
    ("/types/pause", {"all": "1"}),
    ("/types/resume", {"all": "1"}),
    ("/types/limit", {"type": "email", "concurrency": "2", "rate": "5", "per": "1"}),
    ("/types/limit/clear", {"type": "email"}),
    ("/schedules/suspend", {"name": "nightly"}),
    ("/schedules/resume", {"name": "nightly"}),
    ("/schedules/nightly/run", {}),
]


def _jobs(conn: Any) -> dict[str, int]:
    later = datetime.now(UTC) + timedelta(hours=1)
    schedule_store.upsert(conn, schedule_store.ScheduleSpec("nightly", "report", "0 3 * * *"))
    return {
        "dead": add_job(conn, "email", "dead", last_error="ValueError: x"),
        "ready": add_job(conn, "email", "ready"),
        "later": add_job(conn, "email", "ready", run_at=later),
    }


def _put_back(conn: Any, ids: dict[str, int]) -> None:
    """The state `_jobs` made, after an action that acted on a harmless value (a
    `next` that is no page of the console, an unknown type's dead letters)."""
    conn.execute("DELETE FROM rota.audit")
    conn.execute("DELETE FROM rota.paused_type")
    conn.execute("DELETE FROM rota.job_limit")
    conn.execute("DELETE FROM rota.job")
    conn.execute("UPDATE rota.schedule SET suspend = false WHERE name = 'nightly'")
    later = datetime.now(UTC) + timedelta(hours=1)
    for name, status, run_at in [
        ("dead", "dead", None),
        ("ready", "ready", None),
        ("later", "ready", later),
    ]:
        ids[name] = add_job(conn, "email", status, **({"run_at": run_at} if run_at else {}))


def test_every_form_field_answers_hostile_values_with_4xx_and_writes_nothing(quiet, conn):
    ids = _jobs(conn)
    for path, data in ACTIONS:
        for name in [*data, "next"]:
            for value in POSTED:
                url = path.format(**ids)
                fields = {**{k: v.format(**ids) for k, v in data.items()}, name: value}
                before = _unchanged(conn)
                body = "&".join(f"{k}={_q(v)}" for k, v in fields.items())
                response = quiet.post(url, content=body, headers={**BEARER, **FORM})
                assert response.status_code < 500, (url, name, value[:40], response.text[:200])
                if response.status_code >= 400:
                    assert _unchanged(conn) == before, (url, name, value[:40])
                else:
                    _put_back(conn, ids)


@pytest.mark.parametrize("value", ["banana", "5", "-1", "1e999", "\x00"])
def test_a_priority_sent_with_another_action_is_refused_and_nothing_changes(client, conn, value):
    ids = _jobs(conn)
    before = _unchanged(conn)
    for path, data in [
        ("/jobs/bulk", {"action": "retry", "status": "dead"}),
        ("/jobs/bulk", {"action": "cancel"}),
        ("/jobs/selected", {"action": "retry", "id": str(ids["dead"])}),
        ("/jobs/selected", {"action": "run-now", "id": str(ids["later"])}),
    ]:
        body = "&".join(f"{k}={_q(v)}" for k, v in {**data, "priority": value}.items())
        response = client.post(path, content=body, headers={**BEARER, **FORM})
        assert response.status_code == 400, (path, value, response.text)
        assert "priority" in response.json()["error"]
    confirm = client.get(
        f"/jobs/bulk?action=retry&status=dead&priority={_q(value)}", headers=BEARER
    )
    assert confirm.status_code == 400 and "priority" in confirm.json()["error"], confirm.text
    assert _unchanged(conn) == before
    # Left empty (a form's unfilled box), it is no priority at all.
    done = client.post("/jobs/bulk", data={"action": "retry", "priority": ""}, headers=BEARER)
    assert done.status_code == 200, done.text


@pytest.mark.parametrize("path", ["/types/pause", "/types/resume"])
@pytest.mark.parametrize(
    "data",
    [
        {"all": "0"},
        {"all": "false"},
        {"all": "no"},
        {"all": "1", "type": "email"},
        {"all": "yes", "type": "email"},
    ],
)
def test_all_means_every_type_only_when_it_says_so(client, conn, path, data):
    conn.execute("INSERT INTO rota.paused_type (type) VALUES ('sms')")
    before = _unchanged(conn)
    response = client.post(path, data=data, headers=BEARER)
    assert response.status_code == 400, (data, response.text)
    assert "all" in response.json()["error"]
    assert _unchanged(conn) == before


def test_an_action_reads_a_form_and_nothing_else(client, conn):
    ids = _jobs(conn)
    before = _unchanged(conn)
    for path, body, kind in [
        (f"/jobs/{ids['dead']}/retry", b'{"next": "/jobs"}', "application/json"),
        (f"/jobs/{ids['ready']}/cancel", b"next=/jobs", "text/plain"),
        ("/types/pause", b"<type>email</type>", "application/xml"),
    ]:
        response = client.post(path, content=body, headers={**BEARER, "Content-Type": kind})
        assert response.status_code == 415, (path, response.text)
        assert kind in response.json()["error"]
    for path, data, name in [
        (f"/jobs/{ids['dead']}/retry", {}, "next"),
        ("/types/pause", {}, "type"),
        ("/jobs/selected", {"action": "retry"}, "id"),
        ("/types/pause", {}, "all"),
    ]:
        upload = {name: ("a.txt", b"/jobs" if name == "next" else b"1", "text/plain")}
        response = client.post(path, data=data, files=upload, headers=BEARER)
        assert response.status_code == 400, (path, name, response.text)
        assert f"{name!r} must be text" in response.json()["error"]
    assert _unchanged(conn) == before
    # An empty POST, or a form sent as multipart, acts as before.
    done = client.post(f"/jobs/{ids['dead']}/retry", headers=BEARER)
    assert done.status_code == 200, done.text
    # multipart/form-data with text parts only (no file name): a form too.
    done = client.post("/types/pause", files={"type": (None, b"email")}, headers=BEARER)
    assert done.status_code == 200, done.text


@pytest.mark.parametrize(
    "body",
    [
        f"token={TOKEN}&token=nope",
        f"token=nope&token={TOKEN}",
        f"token={TOKEN}&next=/&next=/jobs",
        f"token={TOKEN}&tokne={TOKEN}",
    ],
)
def test_a_login_form_with_a_field_twice_or_unknown_is_refused(client, conn, body):
    response = client.post("/login", content=body, headers=FORM, follow_redirects=False)
    assert response.status_code == 400, response.text
    assert "rota_session" not in response.cookies
    assert conn.execute("SELECT count(*) AS n FROM rota.web_session").fetchone()["n"] == 0


# -- rows the tables can hold -------------------------------------------------------------

PAGES = [
    "/", "/?range=24h", "/?range=7d", "/jobs", "/jobs?status=ready", "/jobs?status=dead",
    "/jobs?status=running", "/jobs?status=retrying", "/jobs?type=email", "/jobs?payload=a%3D1",
    "/jobs?error=x", "/dead", "/schedules", "/types", "/workers", "/audit",
    "/jobs/bulk?action=retry", "/jobs/bulk?action=cancel", "/jobs/bulk?action=run-now",
]  # fmt: skip

MACROS = {
    "$DEAD": "INSERT INTO rota.job (id, type, status, finished_at) OVERRIDING SYSTEM VALUE"
    " VALUES (100, 'email', 'dead', now())",
    "$READY": "INSERT INTO rota.job (id, type, status) OVERRIDING SYSTEM VALUE"
    " VALUES (100, 'email', 'ready')",
    "$RUNNING": "INSERT INTO rota.job (id, type, status, started_at, locked_by, locked_until)"
    " OVERRIDING SYSTEM VALUE VALUES (100, 'email', 'running', now(), 'w1', now())",
    "$WORKER": "INSERT INTO rota.worker VALUES ('w1', 'h', 1, 4, '{email}', now(), now(),"
    " now() + interval '1 hour')",
    "$SCHEDULE": "INSERT INTO rota.schedule (name, job_type, cron, timezone, payload, next_run_at)"
    " VALUES ('s1', 'report', '0 3 * * *', 'UTC', '{}', now() + interval '1 min')",
    "$SAMPLES": "INSERT INTO rota.queue_sample SELECT date_trunc('minute', now())"
    " - make_interval(mins => g), g, 0, 0, 0, $AGE FROM generate_series(0, 70) AS g",
    "$TYPE_SAMPLES": "INSERT INTO rota.queue_sample_type SELECT date_trunc('minute', now())"
    " - make_interval(mins => g), 'email', g, 0, 0, 0, $AGE FROM generate_series(0, 70) AS g",
    # A JSON number of more digits than Python's int reads, and JSON nested deeper
    # than Python's reader recurses.
    "$DIGITS": "repeat('9', 5000)",
    "$DEEP": "(repeat('[', 3000) || repeat(']', 3000))::jsonb",
}

ROWS_SQL = r"""
-- a payload of megabytes
$DEAD;
UPDATE rota.job SET payload = jsonb_build_object('a', repeat('x', 3000000));
-- a payload number of 5000 digits
$DEAD;
UPDATE rota.job SET payload = ('{"a": ' || $DIGITS || '}')::jsonb;
-- payload numbers beyond a float
$DEAD;
UPDATE rota.job SET payload = '{"a": 1e400, "b": -1e400, "c": 1e-400}';
-- a payload that is no object
$DEAD;
UPDATE rota.job SET payload = '[null, "x", 1e400]';
-- a payload nested too deep
$DEAD;
UPDATE rota.job SET payload = $DEEP;
-- odd unicode everywhere
$DEAD;
UPDATE rota.job SET payload = jsonb_build_object(E'\u202e\ufeff', E'\U0001F600\u2028'),
    type = E'a/b?c#d&e=f\u202e<i>', idempotency_key = E'\ufeff', last_error = E'\u2028\x01\x7f';
-- results of odd shapes
$DEAD;
UPDATE rota.job SET status = 'done', result = ($DIGITS)::jsonb, errors = $DEEP;
-- errors entries of odd shapes
$DEAD;
UPDATE rota.job SET errors = '[{"attempt": "x", "at": 5, "error": [1]}, {"at": "99999-01-01"},
    {"error": 1e400}, null]';
-- a run_at of infinity
$READY;
UPDATE rota.job SET run_at = 'infinity';
-- a run_at of -infinity
$READY;
UPDATE rota.job SET run_at = '-infinity';
-- a run_at in year 1
$READY;
UPDATE rota.job SET run_at = '0001-01-01 00:00:00+00';
-- a run_at before Christ
$READY;
UPDATE rota.job SET run_at = '4713-01-01 00:00:00+00 BC';
-- a run_at past 9999
$READY;
UPDATE rota.job SET run_at = '294276-12-31 23:59:59+00';
-- every time at an edge
$DEAD;
UPDATE rota.job SET created_at = 'infinity', started_at = '-infinity',
    finished_at = '9999-12-31 23:59:59+00', cancel_requested_at = '0001-01-01 00:00:00+00';
-- a running job's times at the edges
$RUNNING;
$WORKER;
UPDATE rota.job SET started_at = '-infinity', locked_until = 'infinity';
-- a running job from year 1
$RUNNING;
$WORKER;
UPDATE rota.job SET started_at = '0001-01-01 00:00:00+00', locked_until = '20000-01-01 00:00:00+00';
-- a timeout of NaN
$DEAD;
UPDATE rota.job SET timeout_seconds = 'NaN';
-- a timeout of infinity
$DEAD;
UPDATE rota.job SET timeout_seconds = 'Infinity';
-- counts at the integer's edges
$READY;
UPDATE rota.job SET attempts = 2147483647, max_attempts = 1, releases = -2147483648;
-- names of 100000 characters
$DEAD;
UPDATE rota.job SET type = repeat('t', 100000), idempotency_key = repeat('k', 100000),
    locked_by = repeat('w', 100000), group_key = repeat('g', 100000),
    last_error = repeat('E', 100000) || ': x';
-- an empty type
$DEAD;
UPDATE rota.job SET type = '';
-- a parent that is itself
$DEAD;
UPDATE rota.job SET parent_id = 100;
-- a schedule long gone
$DEAD;
UPDATE rota.job SET schedule_id = 9223372036854775807, slot = 'infinity';
-- the largest id
INSERT INTO rota.job (id, type, status, finished_at) OVERRIDING SYSTEM VALUE
    VALUES (9223372036854775807, 'email', 'dead', now());
-- steps at the edges
$DEAD;
INSERT INTO rota.job_step VALUES
    (100, repeat('s', 10000), ($DIGITS)::jsonb, -1, 'infinity', '-infinity'),
    (100, 'b', '1e400', 2147483647, '0001-01-01 00:00:00+00', '9999-12-31 23:59:59+00');
-- waits and children at the edges
$DEAD;
INSERT INTO rota.job_wait (job_id, name, kind, event_key, children, until, started_at, ended_at,
    ended_by) VALUES (100, 'w', 'event', repeat('e', 10000), '{}', 'infinity', '-infinity',
    'infinity', 'time');
INSERT INTO rota.job_child VALUES (100, repeat('n', 10000), 9223372036854775807), (100, 's', 100);
-- effects at the edges
$DEAD;
UPDATE rota.job SET idempotency_key = 'k1';
INSERT INTO rota.job_effect VALUES ('k1', repeat('e', 10000), ($DIGITS)::jsonb, 'infinity'),
    ('k1', 'b', '1e400', '0001-01-01 00:00:00+00');
-- a cron that never fires
$SCHEDULE;
UPDATE rota.schedule SET cron = '0 0 30 2 *';
-- a cron that is no cron
$SCHEDULE;
UPDATE rota.schedule SET cron = repeat('* ', 50000);
-- a zone that does not exist
$SCHEDULE;
UPDATE rota.schedule SET timezone = '../../etc/passwd';
-- schedule times at infinity
$SCHEDULE;
UPDATE rota.schedule SET next_run_at = '-infinity', last_slot = 'infinity';
-- schedule numbers at the edges
$SCHEDULE;
UPDATE rota.schedule SET spread_seconds = 2147483647, missed_slots = 9223372036854775807,
    skipped_slots = -9223372036854775808, timeout_seconds = 'NaN', unique_for_seconds = 'Infinity';
-- a schedule payload nested too deep
$SCHEDULE;
UPDATE rota.schedule SET payload = $DEEP;
-- an archiver payload of odd numbers
UPDATE rota.schedule SET payload = '{"done_retention_seconds": 1e400, "batch_size": -1}'
    WHERE name = 'rota/archive';
-- an archiver payload that is no object
UPDATE rota.schedule SET payload = '[1]' WHERE name = 'rota/archive';
-- a worker at the edges
INSERT INTO rota.worker VALUES (repeat('w', 10000), repeat('h', 10000), -1, 2147483647,
    ARRAY[repeat('t', 10000), '', NULL, '*'], '-infinity', 'infinity', 'infinity');
-- a worker seen in year 20000
INSERT INTO rota.worker VALUES ('w', 'h', NULL, 1, '{}', '0100-01-01 00:00:00+00 BC',
    '20000-01-01 00:00:00+00', '20000-01-01 00:00:00+00');
-- pauses at the edges
INSERT INTO rota.paused_type VALUES (repeat('p', 10000), 'infinity'), ('', '-infinity'),
    (E'a\x01', '0001-01-01 00:00:00+00');
-- limits at the edges
$READY;
INSERT INTO rota.job_limit (type, concurrency, group_concurrency, rate, per_seconds, updated_at)
    VALUES ('email', 2147483647, 2147483647, 10000, 1e-300, 'infinity'),
    ('', 1, NULL, NULL, NULL, '-infinity');
-- failures at the edges
INSERT INTO rota.job_failure_count VALUES ('infinity', 'email', 5), ('-infinity', 'email', 5),
    (date_trunc('minute', now()), repeat('f', 10000), 9223372036854775807);
-- samples at the edges
INSERT INTO rota.queue_sample VALUES ('infinity', 1, 1, 1, 1, 1), ('-infinity', 1, 1, 1, 1, 1);
-- audit rows at the edges
INSERT INTO rota.audit (at, actor, role, action, target, rows) VALUES
    ('infinity', repeat('a', 10000), '', E'\u202e', $DEEP, -1),
    ('-infinity', '', 'x', '', '1e400', 2147483647),
    ('0001-01-01 00:00:00+00', 'a', 'b', 'c', ('[' || $DIGITS || ']')::jsonb, 0);
-- an archived job at the edges
INSERT INTO rota.job_archive (id, type, payload, status, run_at, attempts, max_attempts,
    created_at, archived_at, priority, releases) VALUES (100, repeat('t', 10000), '[1e400]',
    'dead', 'infinity', -1, 0, '-infinity', 'infinity', 99, 0);
-- a schedule's last slot in year 1, west of UTC
$SCHEDULE;
UPDATE rota.schedule SET next_run_at = '0001-01-01 00:00:00+00',
    last_slot = '0001-01-01 00:00:00+00', timezone = 'America/New_York' WHERE name = 's1';
-- a schedule's next run in 9999, east of UTC
$SCHEDULE;
UPDATE rota.schedule SET next_run_at = '9999-12-31 23:59:59+00',
    last_slot = '9999-12-31 23:59:59+00', timezone = 'Asia/Tokyo' WHERE name = 's1';
-- a scheduled job's slot in year 1
$SCHEDULE;
INSERT INTO rota.job (id, type, status, finished_at, schedule_id, slot) OVERRIDING SYSTEM VALUE
    SELECT 100, 'report', 'dead', now(), id, '0001-01-01 00:00:00+00'
    FROM rota.schedule WHERE name = 's1';
UPDATE rota.schedule SET timezone = 'America/New_York' WHERE name = 's1';
-- a scheduled job's slot in 9999
$SCHEDULE;
INSERT INTO rota.job (id, type, status, finished_at, schedule_id, slot) OVERRIDING SYSTEM VALUE
    SELECT 100, 'report', 'dead', now(), id, '9999-12-31 23:59:59+00'
    FROM rota.schedule WHERE name = 's1';
UPDATE rota.schedule SET timezone = 'Pacific/Kiritimati' WHERE name = 's1';
-- queue ages of NaN
$SAMPLES;
$TYPE_SAMPLES;
-- queue ages of infinity
$SAMPLES;
-- queue ages of every kind
$SAMPLES;
"""
AGES = {
    "queue ages of NaN": "'NaN'",
    "queue ages of infinity": "'Infinity'",
    "queue ages of every kind": "CASE g % 4 WHEN 0 THEN 'NaN'::float8 WHEN 1 THEN 'Infinity'"
    " WHEN 2 THEN -1e308 ELSE 1e308 END",
}
"""What the queue's oldest ready age is in the samples of a case (a double precision
column: NaN and infinity fit)."""


def _cases(text: str) -> dict[str, list[str]]:
    """The statements of each `-- name` of ROWS_SQL, the macros written out."""
    cases: dict[str, list[str]] = {}
    for block in text.split("\n-- ")[1:]:
        name, _, body = block.partition("\n")
        for macro, value in sorted(MACROS.items(), key=lambda m: -len(m[0])):
            body = body.replace(macro, value)
        body = body.replace("$AGE", AGES.get(name, "1"))
        cases[name] = [s.strip() for s in body.split(";\n") if s.strip()]
    return cases


ROWS = _cases(ROWS_SQL)


@pytest.mark.parametrize("name", list(ROWS))
def test_every_page_renders_a_row_written_around_the_checks(quiet, conn, name):
    _replica(conn, *ROWS[name])
    ids = [
        r["id"]
        for r in conn.execute("SELECT id FROM rota.job UNION SELECT id FROM rota.job_archive")
    ]
    for path in [*PAGES, *(f"/jobs/{i}" for i in ids)]:
        for live in ({}, {"HX-Request": "true"}):
            response = quiet.get(path, headers={**BEARER, **HTML, **live})
            assert response.status_code == 200, (name, path, response.text[-400:])


def test_a_time_no_zone_can_show_is_shown_in_utc(client, conn):
    _replica(conn, *ROWS["a schedule's last slot in year 1, west of UTC"])
    page = html.unescape(client.get("/schedules", headers={**BEARER, **HTML}).text)
    assert "0001-01-01 00:00:00 UTC" in page
    _replica(conn, *ROWS["a scheduled job's slot in 9999"][1:])
    page = html.unescape(client.get("/jobs/100", headers={**BEARER, **HTML}).text)
    assert "9999-12-31 23:59:59 UTC" in page


def test_a_chart_leaves_out_ages_that_are_not_numbers(client, conn):
    _replica(conn, *ROWS["queue ages of every kind"])
    page = client.get("/", headers={**BEARER, **HTML})
    assert page.status_code == 200, page.text
    readouts = re.findall(r'data-values="([^"]*)"', page.text)
    assert readouts and not [r for r in readouts if "nan" in r.lower() or "inf" in r.lower()]
    assert page.text.count("<polyline") == 3
