"""Shared fixtures: a real PostgreSQL server and one fresh database per test.

When ROTA_TEST_DATABASE_URL is set, its server is used (the URL's user must be
allowed to create databases); otherwise a throwaway embedded server is started
for the session. Every test gets its own database cloned from a migrated
template, so tests are isolated and fast.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row

from rota.migrate import migrate
from rota.testing import EmbeddedPostgres

# The operator reads this when its handlers are imported: status syncs every
# second in tests, whichever test module imports the operator first.
os.environ.setdefault("ROTA_SCHEDULE_SYNC_SECONDS", "1")
# An attempt moved in a way its lifecycle does not allow raises in tests (in
# this process and in the workers tests start), instead of being logged.
os.environ.setdefault("ROTA_STRICT_ATTEMPTS", "1")

TEMPLATE = "rota_template"
_counter = itertools.count()


class Server:
    """Where the test databases live."""

    def __init__(self, admin_url: str, embedded: EmbeddedPostgres | None) -> None:
        self.admin_url = admin_url
        self.embedded = embedded

    def url(self, database: str) -> str:
        return make_conninfo(self.admin_url, dbname=database)

    def execute(self, statement: pgsql.Composable) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(statement)

    def create(self, name: str, template: str | None = None) -> str:
        self.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )
        if template:
            self.execute(
                pgsql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    pgsql.Identifier(name), pgsql.Identifier(template)
                )
            )
        else:
            self.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        return self.url(name)

    def drop(self, name: str) -> None:
        self.execute(
            pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
        )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    url = os.environ.get("ROTA_TEST_DATABASE_URL")
    if url:
        admin = make_conninfo(url, dbname=conninfo_to_dict(url).get("dbname") or "postgres")
        yield Server(admin, None)
        return
    with EmbeddedPostgres() as pg:
        yield Server(pg.url(), pg)


@pytest.fixture(scope="session")
def template_db(pg_server: Server) -> str:
    url = pg_server.create(TEMPLATE)
    migrate(url)
    # The built-in archive schedule would add a job of its own to any test that
    # runs a worker past its next slot; tests that want it resume it.
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE rota.schedule SET suspend = true WHERE name = 'rota/archive'")
    return TEMPLATE


@pytest.fixture
def db_url(pg_server: Server, template_db: str) -> Iterator[str]:
    """A migrated database of this test's own."""
    name = f"rota_test_{os.getpid()}_{next(_counter)}"
    url = pg_server.create(name, template=template_db)
    yield url
    pg_server.drop(name)


@pytest.fixture
def empty_db_url(pg_server: Server) -> Iterator[str]:
    """An empty database (no schema) of this test's own."""
    name = f"rota_empty_{os.getpid()}_{next(_counter)}"
    url = pg_server.create(name)
    yield url
    pg_server.drop(name)


@pytest.fixture(autouse=True)
def _no_leftover_workers() -> Iterator[None]:
    """Every `rota worker` a test started is gone when it ends, pass or fail."""
    yield
    from tests.acceptance.procs import kill_leftovers

    kill_leftovers()


@pytest.fixture
def conn(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, rows as dicts."""
    with psycopg.connect(db_url, autocommit=True, row_factory=dict_row) as c:  # type: ignore[arg-type]
        yield c
