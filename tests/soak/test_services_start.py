"""`rota reaper` and `rota scheduler` started while their database is away wait for it.

Like `rota worker` (tests/acceptance/test_outage.py): a reaper or scheduler
that starts during an outage, or slowly enough to meet a restart (the chaos
soak met this), must not exit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import rota
from rota.testing import EmbeddedPostgres
from tests.acceptance.procs import wait_for
from tests.soak.harness import Fleet


@pytest.fixture
def absent_server() -> Iterator[EmbeddedPostgres]:
    server = EmbeddedPostgres()  # created, not started yet
    try:
        yield server
    finally:
        server.destroy()


@pytest.mark.parametrize("command", [["reaper", "--interval", "0.5"], ["scheduler"]])
def test_a_service_started_before_its_database_waits_for_it(
    absent_server: EmbeddedPostgres, tmp_path: Path, command: list[str]
) -> None:
    fleet = Fleet(absent_server.url(), tmp_path)
    try:
        proc = fleet.start(command[0], *command)
        wait_for(
            lambda: not proc.alive() or "database" in proc.output(),
            what=f"rota {command[0]} to meet the absent database",
        )
        absent_server.start()
        rota.migrate(absent_server.url())
        assert proc.alive(), f"rota {command[0]} exited: {proc.output().strip()}"
    finally:
        codes = fleet.stop_all()
    assert list(codes.values()) == [0]
