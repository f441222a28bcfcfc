"""Timeouts on every worker connection, a connection the network silently
stopped carrying (a TCP proxy started here that stops forwarding) replaced, and
connection options libpq refuses raised at start instead of waited for."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import pytest
from psycopg.conninfo import make_conninfo

import rota
from rota.deadlines import Deadlines
from rota.errors import ConnectionOptionRefused
from rota.settings import ConnectionSettings
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker
from tests.acceptance.procs import wait_for
from tests.worker.helpers import _async_handlers, _noop, _proxy, _running


def test_a_connection_that_stops_answering_is_replaced_and_draining_goes_on(conn, db_url) -> None:
    # After a failover, say, the worker's connections are half-open: the network
    # carries nothing more, and no error ever comes. Each call has an answer
    # deadline: the worker takes such a connection for dead, opens a new one and
    # goes on draining.
    timeouts = ConnectionSettings(answer_timeout_seconds=2, statement_timeout_seconds=1)
    done = "SELECT count(*) AS n FROM rota.job WHERE status = 'done'"
    with (
        _proxy(db_url) as (proxy, through),
        _running(
            through, _async_handlers(noop=_noop), concurrency=2, connection=timeouts,
            reconnect_max_seconds=0.5,
        ) as worker,
    ):  # fmt: skip
        rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(20)])
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 20, 30, "the first jobs")
        proxy.freeze()
        rota.enqueue_many(conn, [rota.NewJob("noop") for _ in range(20)])
        wait_for(lambda: conn.execute(done).fetchone()["n"] == 40, 60, "the next jobs")
        assert worker.deadlines.severed >= 1
    counts: Any = conn.execute("SELECT max(attempts) AS most FROM rota.job").fetchone()
    assert counts["most"] == 1


def test_every_worker_connection_carries_its_timeouts(db_url) -> None:
    timeouts = ConnectionSettings(statement_timeout_seconds=7, lock_timeout_seconds=0.5)
    deadlines = Deadlines(timeouts)
    with contextlib.closing(deadlines.connect(db_url, "claim")) as plain:
        assert plain.execute("SHOW statement_timeout").fetchone() == {"statement_timeout": "7s"}
        assert plain.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "0"}
        assert plain.info.get_parameters()  # connected
        assert "keepalives_idle=10" in plain.info.dsn
        assert "tcp_user_timeout=20000" in plain.info.dsn
    with contextlib.closing(deadlines.connect(db_url, "heartbeat", lock_timeout=True)) as beat:
        assert beat.execute("SHOW lock_timeout").fetchone() == {"lock_timeout": "500ms"}


def test_a_worker_given_an_option_libpq_refuses_raises_it_instead_of_waiting(db_url) -> None:
    # An outage is waited for (alive, not ready); an option libpq refuses never
    # gets better by waiting.
    settings = WorkerSettings(run_reaper=False, run_scheduler=False)
    worker = Worker(make_conninfo(db_url, sslmode="bogus"), settings, handlers={})
    started = time.monotonic()
    with pytest.raises(ConnectionOptionRefused, match="invalid sslmode value"):
        worker.run(install_signals=False)
    assert time.monotonic() - started < 30
