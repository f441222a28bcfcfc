"""enqueue_async and enqueue_many_async: the sync API's arguments and rows, on a
psycopg AsyncConnection (in its transaction) or a DSN."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import rota
from rota.errors import InvalidInput
from rota.settings import QueueSettings

NOW = datetime(2030, 6, 1, tzinfo=UTC)
EVERY_ARGUMENT: dict[str, Any] = {
    "key": "order-7",
    "run_at": NOW + timedelta(hours=1),
    "max_attempts": 3,
    "priority": 6,
    "timeout": 2.5,
    "group": "tenant-9",
    "settings": QueueSettings(default_max_attempts=5),
    "now": NOW,
}


def rows(db_url: str) -> list[dict[str, Any]]:
    with psycopg.connect(db_url, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT * FROM rota.job ORDER BY id").fetchall()


def without_id(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "id"}


@pytest.mark.asyncio
async def test_every_argument_makes_the_row_the_sync_api_makes(db_url: str) -> None:
    sync_id = rota.enqueue(db_url, "t", {"a": 1}, **EVERY_ARGUMENT)
    EVERY_ARGUMENT_OTHER_KEY = {**EVERY_ARGUMENT, "key": "order-8"}
    async_id = await rota.enqueue_async(db_url, "t", {"a": 1}, **EVERY_ARGUMENT_OTHER_KEY)
    delayed = await rota.enqueue_async(db_url, "t", delay=30, now=NOW)
    by_id = {r["id"]: r for r in rows(db_url)}
    made_sync, made_async = without_id(by_id[sync_id]), without_id(by_id[async_id])
    assert made_async == {**made_sync, "idempotency_key": "order-8"}
    assert (made_async["group_key"], made_async["priority"], made_async["max_attempts"]) == (
        "tenant-9",
        6,
        3,
    )
    assert by_id[delayed]["run_at"] == NOW + timedelta(seconds=30)
    assert by_id[delayed]["max_attempts"] == 20


@pytest.mark.asyncio
async def test_a_batch_keeps_input_order_and_folds_known_keys(db_url: str) -> None:
    held = await rota.enqueue_async(db_url, "t", key="k0")
    jobs = [
        rota.NewJob("t", {"i": 0}, group="g"),
        rota.NewJob("t", {"i": 1}, key="k0"),
        rota.NewJob("u", {"i": 2}, key="k1", priority=2),
        rota.NewJob("u", {"i": 3}, key="k1"),
    ]
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
        ids = await rota.enqueue_many_async(aconn, jobs)
        assert await rota.enqueue_many_async(aconn, []) == []
    assert ids[1] == held and ids[2] == ids[3] and len(set(ids)) == 3
    by_id = {r["id"]: r for r in rows(db_url)}
    assert (by_id[ids[0]]["group_key"], by_id[ids[2]]["priority"]) == ("g", 2)


@pytest.mark.asyncio
async def test_the_job_exists_if_and_only_if_the_callers_transaction_commits(
    db_url: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as aconn:
        async with aconn.transaction():
            await aconn.execute("CREATE TABLE orders (id int)")
            await aconn.execute("INSERT INTO orders VALUES (1)")
            await rota.enqueue_async(aconn, "t", key="committed")
        with pytest.raises(RuntimeError):
            async with aconn.transaction():
                await aconn.execute("INSERT INTO orders VALUES (2)")
                await rota.enqueue_many_async(aconn, [rota.NewJob("t", key="rolled-back")])
                raise RuntimeError("business logic failed")
        await rota.enqueue_async(aconn, "t", key="never-committed")
        await aconn.rollback()
    assert [r["idempotency_key"] for r in rows(db_url)] == ["committed"]


@pytest.mark.asyncio
async def test_bad_input_is_refused_before_anything_is_written(db_url: str) -> None:
    with pytest.raises(InvalidInput, match="not both"):
        await rota.enqueue_async(db_url, "t", delay=1, run_at=NOW)
    with (
        psycopg.connect(db_url) as sync_conn,
        pytest.raises(InvalidInput, match=r"use rota\.enqueue$"),
    ):
        await rota.enqueue_async(sync_conn, "t")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="cannot use a int"):
        await rota.enqueue_async(42, "t")  # type: ignore[arg-type]
    async with await psycopg.AsyncConnection.connect(db_url) as aconn:
        with pytest.raises(InvalidInput, match=r"use rota\.enqueue_async"):
            rota.enqueue(aconn, "t")  # type: ignore[arg-type]
    assert rows(db_url) == []


@pytest.mark.asyncio
async def test_an_async_connection_in_pipeline_mode_is_answered_as_any_other(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url) as conn:
        async with conn.pipeline():
            one = await rota.enqueue_async(conn, "t", key="a")
            again = await rota.enqueue_async(conn, "t", key="a")
            batch = await rota.enqueue_many_async(conn, [rota.NewJob("t")] * 2)
        await conn.commit()
    assert one == again and len(set(batch)) == 2
