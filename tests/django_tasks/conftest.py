"""Django 6 tests (`make test-django`, Python 3.12+): the example project in
examples/django on a database of the session's own. Skipped where Django 6
cannot be imported (the main suite's Python 3.11)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

PROJECT = Path(__file__).parents[2] / "examples" / "django"


def _django_6() -> bool:
    if importlib.util.find_spec("django") is None:
        return False
    import django

    return django.VERSION >= (6, 0)


if not _django_6():
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(scope="session")
def django_db(pg_server, template_db) -> Iterator[str]:
    """The example project set up on a migrated database (Rota's and Django's tables)."""
    url = pg_server.create(f"rota_django_{os.getpid()}", template=template_db)
    os.environ["DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
    sys.path.insert(0, str(PROJECT))
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    yield url
    from django.db import connections

    connections.close_all()
    pg_server.drop(f"rota_django_{os.getpid()}")


@pytest.fixture
def shop(django_db: str) -> Iterator[str]:
    """The example project with no orders and no jobs."""
    with psycopg.connect(django_db, autocommit=True) as conn:
        conn.execute("TRUNCATE rota.job, orders_order")
    yield django_db
