"""Enqueue: single and batch, idempotency keys, delays, the caller's transaction."""

from __future__ import annotations

import importlib
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import rota
from rota import handlers, sql
from rota.errors import InvalidInput
from rota.lookup import get_job
from rota.settings import QueueSettings

enqueue_module = importlib.import_module("rota.enqueue")


def rows(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    return conn.execute("SELECT * FROM rota.job ORDER BY id").fetchall()  # type: ignore[return-value]


def test_enqueue_one_job_with_defaults(conn: psycopg.Connection[Any]) -> None:
    job_id = rota.enqueue(conn, "email.send", {"to": "a@example.com"})
    [row] = rows(conn)
    assert row["id"] == job_id
    assert (row["type"], row["payload"], row["status"]) == (
        "email.send",
        {"to": "a@example.com"},
        "ready",
    )
    assert (row["attempts"], row["max_attempts"], row["idempotency_key"]) == (0, 20, None)
    assert row["run_at"] == row["created_at"]


def test_duplicate_key_returns_the_existing_job(conn: psycopg.Connection[Any]) -> None:
    first = rota.enqueue(conn, "t", {"n": 1}, key="order-42")
    again = rota.enqueue(conn, "t", {"n": 2}, key="order-42")
    assert again == first
    assert [r["payload"] for r in rows(conn)] == [{"n": 1}]


def test_batch_keeps_input_order_and_folds_duplicate_keys(conn: psycopg.Connection[Any]) -> None:
    existing = rota.enqueue(conn, "t", key="k0")
    ids = rota.enqueue_many(
        conn,
        [
            rota.NewJob("t", {"i": 0}),
            rota.NewJob("t", {"i": 1}, key="k0"),
            rota.NewJob("t", {"i": 2}, key="k1"),
            rota.NewJob("t", {"i": 3}, key="k1"),
            rota.NewJob("t", {"i": 4}),
        ],
    )
    assert ids[1] == existing
    assert ids[2] == ids[3]
    assert len(set(ids)) == 4
    by_id = {r["id"]: r for r in rows(conn)}
    assert by_id[ids[0]]["payload"] == {"i": 0}
    assert by_id[ids[2]]["payload"] == {"i": 2}
    assert by_id[ids[4]]["payload"] == {"i": 4}
    assert len(by_id) == 4


JOBS_OF_EVERY_SHAPE = [
    rota.NewJob("t"),
    rota.NewJob("t", {"a": [1, "x"]}, key="k-1"),
    rota.NewJob("t", None, delay=30.5, max_attempts=3),
    rota.NewJob("t", "text", run_at=datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC)),
    rota.NewJob("prioritized", [1, 2], priority=7, timeout=2.5),
    rota.NewJob("prioritized"),  # the handler's priority
    rota.NewJob("t", {"n": 1}, group="tenant-1"),
]


@pytest.mark.parametrize("job", JOBS_OF_EVERY_SHAPE)
def test_one_job_makes_the_row_a_batch_makes(
    conn: psycopg.Connection[Any], job: rota.NewJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A single job, a batch without keys and a batch with one each take a
    # statement of their own: they must write the same row.
    monkeypatch.setattr(handlers, "_registry", {})
    rota.handler("prioritized", priority=4)(lambda job: None)
    now = datetime(2030, 6, 1, tzinfo=UTC)
    alone = rota.enqueue_many(conn, [job], now=now)
    batch = rota.enqueue_many(conn, [job, rota.NewJob("other")], now=now)
    keyed = rota.enqueue_many(conn, [job, rota.NewJob("other", key="other-1")], now=now)
    made = {r["id"]: {k: v for k, v in r.items() if k != "id"} for r in rows(conn)}
    if job.key is None:
        assert made[alone[0]] == made[batch[0]] == made[keyed[0]]
    else:
        assert batch[0] == alone[0] == keyed[0]  # the key already held


def test_jobs_without_keys_are_sent_without_the_keys_arbitration() -> None:
    # No row can conflict, so they take a plain INSERT: no ON CONFLICT, whose
    # speculative insertion writes a second WAL record for every row (48 bytes),
    # and in a batch no join of the rows made back to the input.
    keyless = [rota.NewJob("t"), rota.NewJob("t", group="g"), rota.NewJob("u", delay=5)]
    assert enqueue_module._statement(keyless, QueueSettings(), None)[0] == sql.query(
        "enqueue_jobs_without_keys"
    )
    keyed = [rota.NewJob("t"), rota.NewJob("t", key="k")]
    assert enqueue_module._statement(keyed, QueueSettings(), None)[0] == sql.query("enqueue_jobs")
    one = enqueue_module._statement(keyless[:1], QueueSettings(), None)[0]
    assert one == sql.query("enqueue_job_without_key")
    one = enqueue_module._statement(keyed[1:], QueueSettings(), None)[0]
    assert one == sql.query("enqueue_job")


def test_payloads_of_any_spelling_come_back_as_they_went(conn: psycopg.Connection[Any]) -> None:
    payloads = [
        {"q": 'say "hi"', "b": "back\\slash", "braces": "{a,b}", "comma": "x,y"},
        ["\u00e9t\u00e9", "\u2603", "\U0001f600", "tab\there", "line\nbreak"],
        'just text with a " quote',
        12.5,
        None,
        {"nested": {"empty": {}, "list": [[], [None, True, False]]}},
    ]
    ids = rota.enqueue_many(conn, [rota.NewJob("t", p) for p in payloads])
    got = {r["id"]: r["payload"] for r in rows(conn)}
    assert [got[i] for i in ids] == [{} if p is None else p for p in payloads]  # None: {}


def test_batch_of_thousands(conn: psycopg.Connection[Any]) -> None:
    ids = rota.enqueue_many(conn, [rota.NewJob("bulk", {"i": i}) for i in range(5000)])
    assert len(set(ids)) == 5000
    payloads = {r["id"]: r["payload"]["i"] for r in rows(conn)}
    assert [payloads[i] for i in ids] == list(range(5000))


def test_delay_and_run_at(conn: psycopg.Connection[Any]) -> None:
    frozen = datetime(2030, 1, 1, tzinfo=UTC)
    later = rota.enqueue(conn, "t", delay=90, now=frozen)
    at = rota.enqueue(conn, "t", run_at=frozen + timedelta(hours=2), now=frozen)
    by_id = {r["id"]: r for r in rows(conn)}
    assert by_id[later]["run_at"] == frozen + timedelta(seconds=90)
    assert by_id[at]["run_at"] == frozen + timedelta(hours=2)


def test_max_attempts_per_job(conn: psycopg.Connection[Any]) -> None:
    rota.enqueue(conn, "t", max_attempts=3)
    assert rows(conn)[0]["max_attempts"] == 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"delay": -1}, "negative"),
        ({"delay": 1e12}, "at most"),
        ({"max_attempts": 0}, "at least 1"),
        ({"run_at": datetime(2030, 1, 1)}, "time zone"),
        ({"key": ""}, "empty"),
        ({"key": "a\x00b"}, "NUL"),
        ({"group": ""}, "group must be a non-empty string"),
        ({"group": "a\x00b"}, "NUL"),
        ({"payload": {"a": "\x00"}}, "NUL"),
        ({"payload": {"\x00": 1}}, "NUL"),
        ({"delay": 1, "run_at": datetime(2030, 1, 1, tzinfo=UTC)}, "not both"),
    ],
)
def test_invalid_jobs_are_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInput, match=message):
        rota.enqueue_many(conn, [rota.NewJob("ok"), rota.NewJob("t", **kwargs)])
    assert rows(conn) == []


def test_a_type_with_a_nul_is_refused_and_text_that_only_looks_like_one_is_kept(
    conn: psycopg.Connection[Any],
) -> None:
    with pytest.raises(InvalidInput, match="NUL"):
        rota.enqueue(conn, "t\x00")
    assert rows(conn) == []
    looks_like = {"a": "\\u0000", "b": "\\\\u0000"}  # a backslash, then u0000
    job_id = rota.enqueue(conn, "t", looks_like)
    assert get_job(conn, job_id).payload == looks_like


def test_payload_size_limit(conn: psycopg.Connection[Any]) -> None:
    settings = QueueSettings(max_payload_bytes=100)
    with pytest.raises(InvalidInput, match="over the limit of 100 bytes"):
        rota.enqueue(conn, "t", {"blob": "x" * 200}, settings=settings)
    with pytest.raises(InvalidInput, match="JSON"):
        rota.enqueue(conn, "t", {"when": datetime.now()})
    assert rows(conn) == []


def test_enqueue_inside_the_callers_transaction(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        with conn.transaction():
            rota.enqueue(conn, "t", key="committed")
        with pytest.raises(RuntimeError), conn.transaction():
            rota.enqueue(conn, "t", key="rolled-back")
            raise RuntimeError("business logic failed")
        conn.commit()
        keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM rota.job").fetchall()]
    assert keys == ["committed"]


def test_nothing_is_committed_for_the_caller(db_url: str) -> None:
    with psycopg.connect(db_url) as conn:
        rota.enqueue(conn, "t")
        conn.rollback()
        assert conn.execute("SELECT count(*) FROM rota.job").fetchone() == (0,)


def test_a_connection_in_pipeline_mode_is_answered_as_any_other(db_url: str) -> None:
    # In psycopg's pipeline mode a statement's rows come with the first fetch: a
    # job was written and the id read as missing ("being inserted concurrently").
    with psycopg.connect(db_url) as conn:
        with conn.pipeline():
            one = rota.enqueue(conn, "t")
            keyed = rota.enqueue(conn, "t", key="k")
            again = rota.enqueue(conn, "t", key="k")
            batch = rota.enqueue_many(conn, [rota.NewJob("t")] * 3)
            assert rota.result(conn, one) == ("ready", None)
            assert rota.cancel(conn, [one]).ended == [one]
        conn.commit()
        count = conn.execute("SELECT count(*) FROM rota.job").fetchone()
    assert keyed == again and len(set(batch)) == 3 and count == (5,)


def test_concurrent_enqueues_of_one_key_make_one_row(db_url: str) -> None:
    results: list[int] = []
    barrier = threading.Barrier(8)

    def enqueue() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            barrier.wait()
            results.append(rota.enqueue(conn, "t", key="same"))

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT count(*) FROM rota.job").fetchone() == (1,)


def test_a_ready_job_notifies_idle_workers(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as listener:
        listener.execute("LISTEN rota_jobs")
        rota.enqueue(db_url, "future", delay=3600)
        assert list(listener.notifies(timeout=0.3)) == []
        rota.enqueue(db_url, "now")
        notes = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notes] == ["rota_jobs"]
