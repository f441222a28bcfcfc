"""The hot statements keep index-driven plans once psycopg has prepared them,
and the claim that carries a batch of outcomes commits both or neither.

psycopg prepares a statement on its sixth execution; PostgreSQL then plans the
next five custom and may switch to a generic plan, estimated without the
parameters' values. On a table whose statistics were taken while nothing ran
(one running row estimated), a generic outcome or heartbeat statement that may
choose could walk every running row and rescan the batch for each. These tests
run each hot statement the way the worker does, more than five times, on a
table of realistic size, and then read the plan PostgreSQL would use.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row, tuple_row

import rota
from rota import claim as claims
from rota import sql
from rota.claim import Attempt
from rota.errors import DatabaseError
from rota.jobs import Outcome

WORKER = "plans-worker"
DONE_ROWS = 200_000
READY_ROWS = 5_000
BATCH = 100
RUNS = 8


def _add_ready(c: psycopg.Connection[Any], job_type: str, count: int, age: str = "1 s") -> None:
    c.execute(
        "INSERT INTO rota.job (type, run_at) SELECT %s, now() - %s::interval"
        " FROM generate_series(1, %s)",
        (job_type, age, count),
    )


@pytest.fixture
def crowded(db_url: str) -> Iterator[str]:
    """200,000 done rows and some ready ones, analyzed while nothing runs."""
    with psycopg.connect(db_url, autocommit=True) as c:
        c.execute(
            "INSERT INTO rota.job (type, status, run_at, attempts, finished_at, locked_by)"
            " SELECT 'bench.noop', 'done', now() - interval '1 day', 1, now(), 'old'"
            " FROM generate_series(1, %s)",
            (DONE_ROWS,),
        )
        _add_ready(c, "bench.noop", READY_ROWS)
        c.execute("VACUUM ANALYZE rota.job")
    yield db_url


def _numbered(text: str) -> str:
    """A named query with $n placeholders, for EXPLAIN (GENERIC_PLAN)."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return re.sub(r"%\((\w+)\)s", number, text)


def _explained(doc: Any) -> dict[str, Any]:
    """The top of an `EXPLAIN (FORMAT JSON)` result, however the driver returned it."""
    return (json.loads(doc) if isinstance(doc, str) else doc)[0]  # type: ignore[no-any-return]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _generic_plan(conn: psycopg.Connection[Any], name: str) -> dict[str, Any]:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            "EXPLAIN (GENERIC_PLAN, FORMAT JSON) " + _numbered(sql.query(name))
        ).fetchone()
    assert rows is not None
    return _explained(rows[0])["Plan"]  # type: ignore[no-any-return]


def _prepared(conn: psycopg.Connection[Any], fragment: str) -> dict[str, Any]:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        ).fetchall()
    mine = [r for r in rows if fragment in r[0]]
    assert len(mine) == 1, f"{fragment!r} was not prepared: {[r[0][:60] for r in rows]}"
    return {"generic_plans": mine[0][1], "custom_plans": mine[0][2]}


def _assert_keyed(plan: dict[str, Any]) -> None:
    """No sequential scan of rota.job, and no nested loop that rescans a function."""
    nodes = list(_nodes(plan))
    text = json.dumps(plan)
    for node in nodes:
        assert not (node["Node Type"] == "Seq Scan" and node.get("Relation Name") == "job"), text
        if node["Node Type"] == "Nested Loop":
            inner = [c for c in node.get("Plans", []) if c.get("Parent Relationship") == "Inner"]
            assert all(c["Node Type"] != "Function Scan" for c in inner), text
    job_scans = [n for n in nodes if n.get("Relation Name") == "job" and "Index Name" in n]
    assert job_scans, text


def _claimed(conn: psycopg.Connection[Any]) -> list[tuple[int, int]]:
    jobs = claims.claim(conn, WORKER, BATCH, 30.0, ["bench.noop"])
    assert len(jobs) == BATCH
    return [(j.id, j.attempts) for j in jobs]


def test_outcome_statement_reaches_each_job_by_primary_key(crowded: str) -> None:
    with psycopg.connect(crowded, autocommit=True, row_factory=dict_row) as c:
        for _ in range(RUNS):
            keys = _claimed(c)
            written = claims.write_outcomes(
                c, WORKER, [Attempt(i, n, Outcome.DONE, claim=n) for i, n in keys]
            )
            assert len(written) == BATCH
        _assert_keyed(_generic_plan(c, "write_outcomes"))
        counts = _prepared(c, "rota.job AS j\n    SET status = CASE")
        assert counts["generic_plans"] + counts["custom_plans"] >= RUNS - 5


def test_heartbeat_reaches_each_job_by_primary_key(crowded: str) -> None:
    with psycopg.connect(crowded, autocommit=True, row_factory=dict_row) as c:
        keys = _claimed(c)
        for _ in range(RUNS):
            assert len(claims.extend_leases(c, WORKER, keys, 30.0)) == BATCH
        _assert_keyed(_generic_plan(c, "extend_leases"))
        counts = _prepared(c, "SET locked_until = coalesce")
        assert counts["generic_plans"] + counts["custom_plans"] >= RUNS - 5


def test_claim_walks_the_claim_index(crowded: str) -> None:
    with psycopg.connect(crowded, autocommit=True, row_factory=dict_row) as c:
        for _ in range(RUNS):
            _claimed(c)
        plan = _generic_plan(c, "claim_jobs")
        _assert_keyed(plan)
        assert "job_claim_idx" in json.dumps(plan)


@pytest.fixture
def backlog(db_url: str) -> Iterator[str]:
    """A drain's table: 30,000 ready rows and nothing else, analyzed."""
    with psycopg.connect(db_url, autocommit=True) as c:
        _add_ready(c, "bench.noop", 30_000)
        c.execute("VACUUM ANALYZE rota.job")
    yield db_url


def _custom_plan(
    conn: psycopg.Connection[Any], name: str, params: dict[str, Any]
) -> dict[str, Any]:
    """The plan PostgreSQL makes for `name` with these values, run and rolled back."""
    with conn.transaction(force_rollback=True), conn.cursor(row_factory=tuple_row) as cur:
        row = cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql.query(name), params).fetchone()
    assert row is not None
    return _explained(row[0])["Plan"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("limit", [100, 500])
def test_a_large_claim_marks_its_rows_by_primary_key(backlog: str, limit: int) -> None:
    # On a table of a drain's size a join of the picked rows was planned as a
    # hash join over a sequential scan of the table from a few hundred rows on.
    with psycopg.connect(backlog, autocommit=True, row_factory=dict_row) as c:
        params = claims._claim_params(WORKER, limit, 30.0, None, None)
        plan = _custom_plan(c, "claim_jobs", params)
        _assert_keyed(plan)
        assert plan["Actual Rows"] == limit
        params["types"] = ["bench.noop"]
        _assert_keyed(_custom_plan(c, "claim_jobs", params))


@pytest.mark.parametrize("batch", [150, 500])
def test_large_batches_of_outcomes_and_heartbeats_reach_their_rows_by_primary_key(
    backlog: str, batch: int
) -> None:
    # A worker writes up to 500 outcomes at once (finish_batch_size) and extends
    # as many leases as it holds. Planned for their values on this table, whose
    # statistics say nothing runs, a batch of 150 or more was joined to a
    # sequential scan of the table that rescanned the batch for every row it
    # found: 70 ms for 500 outcomes instead of 6.
    with psycopg.connect(backlog, autocommit=True, row_factory=dict_row) as c:
        keys = [(j.id, j.claims) for j in claims.claim(c, WORKER, batch, 30.0, None)]
        assert len(keys) == batch
        outcome = {
            "ids": [i for i, _ in keys], "claims": [n for _, n in keys],
            "outcomes": ["done"] * batch, "delays": [0.0] * batch, "errors": [None] * batch,
            "results": None, "worker": WORKER, "now": None,
        }  # fmt: skip
        plan = _custom_plan(c, "write_outcomes", outcome)
        _assert_keyed(plan)
        assert plan["Actual Rows"] == batch
        heartbeat = {k: outcome[k] for k in ("ids", "claims", "worker", "now")}
        plan = _custom_plan(c, "extend_leases", {**heartbeat, "lease": 30.0})
        _assert_keyed(plan)
        assert plan["Actual Rows"] == batch


def test_the_generic_claim_on_a_backlog_marks_its_rows_by_primary_key(backlog: str) -> None:
    with psycopg.connect(backlog, autocommit=True, row_factory=dict_row) as c:
        _assert_keyed(_generic_plan(c, "claim_jobs"))


# -- the worker's claim, its types written in ------------------------------------


def _executed(conn: psycopg.Connection[Any], text: str, values: dict[str, str]) -> dict[str, Any]:
    """The generic plan a prepared `text` runs (once, rolled back), each
    parameter given as SQL by its name."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", text)))
    given = ", ".join(values[name] for name in names)
    with conn.transaction(force_rollback=True), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("PREPARE mine AS " + _numbered(text))
        row = cur.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE mine({given})").fetchone()
        assert row is not None
        kinds = cur.execute(
            "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'mine'"
        ).fetchone()
        assert kinds == (1, 0)
    return _explained(row[0])


def _claim_values(limit: int, since: str = "NULL") -> dict[str, str]:
    return {"now": "NULL", "limit": str(limit), "worker": f"'{WORKER}'", "lease": "30",
            "since": since, "limited_since": "NULL"}  # fmt: skip


def _removed(plan: dict[str, Any]) -> int:
    return sum(n.get("Rows Removed by Filter", 0) for n in _nodes(plan))


@pytest.fixture
def mixed(db_url: str) -> Iterator[str]:
    """30,000 ready jobs of another type before 300 of ours, analyzed."""
    with psycopg.connect(db_url, autocommit=True) as c:
        _add_ready(c, "other", 30_000, age="1 min")
        _add_ready(c, "mine", 300)
        c.execute("VACUUM ANALYZE rota.job")
    yield db_url


def test_a_workers_generic_claim_never_walks_the_ready_jobs_of_other_types(mixed: str) -> None:
    # Planned for any types, the generic claim would walk the 30,000 others to
    # find ours: the worker's claim names its types in the statement.
    with psycopg.connect(mixed, autocommit=True) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        text = claims._claim_query(["mine"])
        run = _executed(c, text, _claim_values(BATCH))
        assert run["Plan"]["Actual Rows"] == BATCH
        assert _removed(run["Plan"]) < 1_000, json.dumps(run["Plan"])
        _assert_keyed(run["Plan"])


def test_a_workers_generic_claim_on_its_own_backlog_walks_the_claim_index(backlog: str) -> None:
    with psycopg.connect(backlog, autocommit=True) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        run = _executed(c, claims._claim_query(["bench.noop"]), _claim_values(500))
        assert run["Plan"]["Actual Rows"] == 500
        _assert_keyed(run["Plan"])
        assert "job_claim_idx" in json.dumps(run["Plan"])


# -- the claim that carries outcomes --------------------------------------------


def _xmin(conn: psycopg.Connection[Any], ids: list[int]) -> set[str]:
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute("SELECT xmin::text FROM rota.job WHERE id = ANY(%s)", (ids,)).fetchall()
    return {r[0] for r in rows}


def test_outcomes_and_the_next_claim_commit_together(conn) -> None:
    rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(5)])
    first = claims.claim(conn, WORKER, 3, 30.0)
    conn.execute("UPDATE rota.job SET locked_by = 'thief' WHERE id = %s", (first[2].id,))
    attempts = [Attempt.of(j, Outcome.DONE) for j in first]
    written, jobs = claims.write_and_claim(conn, WORKER, attempts, 10, 30.0)
    assert set(written) == {(j.id, j.attempts) for j in first[:2]}  # the stolen one is not
    assert len(jobs) == 2 and all(j.locked_by == WORKER for j in jobs)
    # One transaction: the written rows and the claimed rows carry the same xmin.
    assert len(_xmin(conn, [j.id for j in first[:2]] + [j.id for j in jobs])) == 1


def test_a_failed_claim_writes_none_of_the_outcomes_it_carried(conn) -> None:
    rota.enqueue_many(conn, [rota.NewJob("t") for _ in range(3)])
    first = claims.claim(conn, WORKER, 2, 30.0)
    attempts = [Attempt.of(j, Outcome.DONE) for j in first]
    with pytest.raises(DatabaseError):
        claims.write_and_claim(conn, WORKER, attempts, -1, 30.0)  # LIMIT -1 is refused
    with conn.cursor(row_factory=tuple_row) as cur:
        rows = cur.execute(
            "SELECT status FROM rota.job WHERE id = ANY(%s)", ([j.id for j in first],)
        ).fetchall()
    assert [r[0] for r in rows] == ["running", "running"]
    written, jobs = claims.write_and_claim(conn, WORKER, attempts, 10, 30.0)
    assert len(written) == 2 and len(jobs) == 1  # the connection is usable again


def test_the_steady_claim_runs_its_generic_plan_within_its_own_transaction(backlog: str) -> None:
    # Left to itself, PostgreSQL plans a claim on a busy queue for every call
    # (0.3 ms each); the claim that carries outcomes is told to run its generic
    # plan, for its own transaction only.
    with psycopg.connect(backlog, autocommit=True, row_factory=dict_row) as c:
        for _ in range(RUNS):
            _claimed(c)
        left_alone = _prepared(c, "WITH limited AS MATERIALIZED")
        assert left_alone["generic_plans"] == 0, left_alone
        pending: list[Attempt] = []
        for _ in range(RUNS):
            _, jobs = claims.write_and_claim(c, WORKER, pending, BATCH, 30.0, ["bench.noop"])
            assert len(jobs) == BATCH
            pending = [Attempt.of(j, Outcome.DONE) for j in jobs]
        steady = _prepared(c, "WITH limited AS MATERIALIZED")
        assert steady["custom_plans"] == left_alone["custom_plans"], steady
        assert steady["generic_plans"] >= 1, steady
        row = c.execute("SHOW plan_cache_mode").fetchone()
        assert row is not None and row["plan_cache_mode"] == "auto"


_SINCE = "'{\"2000-01-01T00:00:00+00:00\",NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL,NULL}'"
"""A start for priority 0 (rota.floor.Floor), as a worker's claim sends it."""


def test_a_workers_generic_claim_from_its_start_walks_the_claim_index(backlog: str) -> None:
    # The start bounds the walk; planned without its value it must not turn the
    # claim into a sort of the whole backlog.
    with psycopg.connect(backlog, autocommit=True) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        text = claims._claim_query(["bench.noop"])
        run = _executed(c, text, _claim_values(500, _SINCE))
        assert run["Plan"]["Actual Rows"] == 500
        _assert_keyed(run["Plan"])
        nodes = list(_nodes(run["Plan"]))
        assert not any(n["Node Type"] in ("Sort", "Bitmap Heap Scan") for n in nodes), run
        assert "job_claim_idx" in json.dumps(run["Plan"])


def test_a_workers_generic_claim_from_its_start_never_walks_other_types(mixed: str) -> None:
    with psycopg.connect(mixed, autocommit=True) as c:
        c.execute("SET plan_cache_mode = force_generic_plan")
        run = _executed(c, claims._claim_query(["mine"]), _claim_values(BATCH, _SINCE))
        assert run["Plan"]["Actual Rows"] == BATCH
        assert _removed(run["Plan"]) < 1_000, json.dumps(run["Plan"])
        _assert_keyed(run["Plan"])
