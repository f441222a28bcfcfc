"""Enqueueing in an ORM's transaction: a SQLAlchemy Connection or Session (sync and
async engines, psycopg driver). The job exists if and only if the caller's rows
commit; an engine on a driver Rota cannot join (psycopg2, asyncpg) is refused,
naming the fix, and writes nothing. Django's connection is tested under Django
(tests/django_tasks)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from psycopg.conninfo import conninfo_to_dict

import rota
from rota.errors import InvalidInput

sqlalchemy = pytest.importorskip("sqlalchemy")
from sqlalchemy import URL, create_engine, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session, scoped_session, sessionmaker  # noqa: E402


def url(db_url: str, driver: str = "psycopg") -> Any:
    """The SQLAlchemy URL of a libpq connection string."""
    info = conninfo_to_dict(db_url)
    return URL.create(
        f"postgresql+{driver}",
        username=info.get("user"),
        password=info.get("password"),
        host=info.get("host"),
        port=int(info["port"]) if info.get("port") else None,
        database=info.get("dbname"),
    )


def committed(db_url: str) -> tuple[list[str], list[str]]:
    """The orders and the jobs' keys that are in the database."""
    with psycopg.connect(db_url) as conn:
        orders = [r[0] for r in conn.execute("SELECT name FROM orders ORDER BY name")]
        keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM rota.job ORDER BY id")]
    return orders, keys


@pytest.fixture
def orders_table(db_url: str) -> str:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (name text)")
    return db_url


@pytest.fixture
def engine(orders_table: str) -> Iterator[Any]:
    made = create_engine(url(orders_table))
    yield made
    made.dispose()


@pytest_asyncio.fixture
async def async_engine(orders_table: str) -> AsyncIterator[Any]:
    made = create_async_engine(url(orders_table))
    yield made
    await made.dispose()


def order(name: str) -> Any:
    return text(f"INSERT INTO orders (name) VALUES ('{name}')")


def test_a_connection_commits_or_rolls_back_its_rows_and_its_jobs_together(engine, db_url) -> None:
    with engine.begin() as conn:
        conn.execute(order("a"))
        rota.enqueue(conn, "ship", {"order": "a"}, key="a")
    with pytest.raises(RuntimeError), engine.begin() as conn:
        conn.execute(order("b"))
        rota.enqueue_many(conn, [rota.NewJob("ship", key="b"), rota.NewJob("bill", key="b2")])
        raise RuntimeError("payment refused")
    # Commit as you go: enqueue first (it begins the transaction as a statement would).
    with engine.connect() as conn:
        rota.enqueue(conn, "ship", key="c")
        conn.execute(order("c"))
        conn.commit()
        rota.enqueue(conn, "ship", key="d")
        conn.execute(order("d"))
    # Closed without a commit: d rolled back.
    assert committed(db_url) == (["a", "c"], ["a", "c"])


def test_a_session_commits_or_rolls_back_its_rows_and_its_jobs_together(engine, db_url) -> None:
    with Session(engine) as session:
        rota.enqueue(session, "ship", key="a")
        session.execute(order("a"))
        session.commit()
    with Session(engine) as session:
        session.execute(order("b"))
        rota.enqueue(session, "ship", key="b")
        session.rollback()
        session.execute(order("c"))
        assert rota.enqueue(session, "ship", key="a") == 1  # the known key's job
        rota.enqueue(session, "ship", key="c")
        session.commit()
    assert committed(db_url) == (["a", "c"], ["a", "c"])


def test_a_scoped_session_joins_the_transaction_of_its_current_session(engine, db_url) -> None:
    # Flask-SQLAlchemy's `db.session` is one: Rota takes the Session it stands for.
    session = scoped_session(sessionmaker(engine))
    session.execute(order("a"))
    rota.enqueue(session, "ship", key="a")
    session.commit()
    session.execute(order("b"))
    rota.enqueue(session, "ship", key="b")
    session.rollback()
    session.remove()
    assert committed(db_url) == (["a"], ["a"])


class AppSession(Session):
    """A Session of the application's own, as SQLModel's is: its class lives
    outside SQLAlchemy's modules."""


class AppAsyncSession(AsyncSession):
    """The same for asyncio, as SQLModel's AsyncSession."""


def test_a_session_of_a_subclass_joins_its_transaction(engine, db_url) -> None:
    with AppSession(engine) as session:
        rota.enqueue(session, "ship", key="a")
        session.execute(order("a"))
        session.commit()
        session.execute(order("b"))
        rota.enqueue(session, "ship", key="b")
        session.rollback()
    assert committed(db_url) == (["a"], ["a"])


@pytest.mark.asyncio
async def test_an_async_session_of_a_subclass_joins_its_transaction(async_engine, db_url) -> None:
    async with AppAsyncSession(async_engine) as session:
        await rota.enqueue_async(session, "ship", key="a")
        await session.execute(order("a"))
        await session.commit()
        await rota.enqueue_async(session, "ship", key="b")
        await session.rollback()
    assert committed(db_url) == (["a"], ["a"])
    with pytest.raises(InvalidInput, match=r"asynchronous: use rota\.enqueue_async"):
        rota.enqueue(AppAsyncSession(async_engine), "ship")
    with (
        AppSession(create_engine(url(db_url))) as session,
        pytest.raises(InvalidInput, match=r"synchronous: use rota\.enqueue"),
    ):
        await rota.enqueue_async(session, "ship")


@pytest.mark.asyncio
async def test_async_connections_and_sessions_join_their_transactions(async_engine, db_url) -> None:
    async with async_engine.begin() as conn:
        await conn.execute(order("a"))
        await rota.enqueue_async(conn, "ship", key="a")
    with pytest.raises(RuntimeError):
        async with async_engine.begin() as conn:
            await conn.execute(order("b"))
            await rota.enqueue_many_async(conn, [rota.NewJob("ship", key="b")])
            raise RuntimeError("payment refused")
    async with AsyncSession(async_engine) as session:
        await rota.enqueue_async(session, "ship", key="c")
        await session.execute(order("c"))
        await session.commit()
        await rota.enqueue_async(session, "ship", key="d")
        await session.rollback()
    assert committed(db_url) == (["a", "c"], ["a", "c"])


@pytest.mark.asyncio
async def test_connections_rota_cannot_join_are_refused_naming_what_to_use(
    engine, async_engine, db_url
) -> None:
    sqlite = create_engine("sqlite://")
    with sqlite.connect() as conn, pytest.raises(InvalidInput) as refused:
        rota.enqueue(conn, "t")
    assert str(refused.value) == (
        "Rota joins the transactions of psycopg 3 connections only; this SQLAlchemy engine "
        "uses sqlite3: create the engine with a postgresql+psycopg:// URL (psycopg 3, sync "
        "or async)"
    )
    async with async_engine.connect() as conn:
        with pytest.raises(InvalidInput, match=r"AsyncConnection is asynchronous: use rota\."):
            rota.enqueue(conn, "t")  # type: ignore[arg-type]
    with engine.connect() as conn, pytest.raises(InvalidInput, match="synchronous: use"):
        await rota.enqueue_async(conn, "t")  # type: ignore[arg-type]
    assert committed(db_url) == ([], [])


NOT_PSYCOPG3 = (
    "Rota joins the transactions of psycopg 3 connections only; this SQLAlchemy engine "
    "uses {driver}: create the engine with a postgresql+psycopg:// URL (psycopg 3, sync "
    "or async)"
)


def test_an_engine_on_psycopg2_is_refused_naming_psycopg_3_and_writes_nothing(
    orders_table: str,
) -> None:
    psycopg2_engine = create_engine(url(orders_table, "psycopg2"))
    try:
        with Session(psycopg2_engine) as session:
            session.execute(order("a"))
            with pytest.raises(InvalidInput) as refused:
                rota.enqueue(session, "ship", key="a")
            session.commit()  # the caller's rows are theirs to commit
        with psycopg2_engine.begin() as conn, pytest.raises(InvalidInput) as refused_many:
            rota.enqueue_many(conn, [rota.NewJob("ship", key="b")])
    finally:
        psycopg2_engine.dispose()
    assert str(refused.value) == NOT_PSYCOPG3.format(driver="psycopg2")
    assert str(refused_many.value) == str(refused.value)
    assert committed(orders_table) == (["a"], [])


@pytest.mark.asyncio
async def test_an_async_engine_on_asyncpg_is_refused_naming_psycopg_3_and_writes_nothing(
    orders_table: str,
) -> None:
    asyncpg_engine = create_async_engine(url(orders_table, "asyncpg"))
    try:
        async with AsyncSession(asyncpg_engine) as session:
            await session.execute(order("a"))
            with pytest.raises(InvalidInput) as refused:
                await rota.enqueue_async(session, "ship", key="a")
            await session.commit()
        async with asyncpg_engine.begin() as conn:
            with pytest.raises(InvalidInput) as refused_many:
                await rota.enqueue_many_async(conn, [rota.NewJob("ship", key="b")])
    finally:
        await asyncpg_engine.dispose()
    assert str(refused.value) == NOT_PSYCOPG3.format(driver="asyncpg")
    assert str(refused_many.value) == str(refused.value)
    assert committed(orders_table) == (["a"], [])
