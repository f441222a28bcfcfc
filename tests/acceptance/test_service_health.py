"""`rota scheduler --health-port` and `rota reaper --health-port`: probes for Kubernetes.

/healthz answers while the process runs; /readyz once a pass has worked, and
503 again while the database is away or before the first pass.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.acceptance.procs import env_for, free_port, probe, rota, wait_for


@pytest.mark.parametrize("command", ["scheduler", "reaper"])
def test_probes_follow_the_loop(db_url: str, command: str) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "rota", command, f"--health-port={port}"],
        env=env_for(db_url),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: probe(port, "/healthz") == 200, what="/healthz")
        assert wait_for(lambda: probe(port, "/readyz") == 200, what="/readyz")
        assert probe(port, "/metrics") == 404
    finally:
        proc.terminate()
        proc.wait(30)


def test_an_unreachable_database_is_not_ready_but_alive(db_url: str) -> None:
    port = free_port()
    dead = "postgresql://rota@127.0.0.1:1/rota?connect_timeout=1"
    proc = subprocess.Popen(
        [sys.executable, "-m", "rota", "scheduler", f"--health-port={port}"],
        env=env_for(dead),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_for(lambda: probe(port, "/healthz") == 200, what="/healthz")
        assert probe(port, "/readyz") == 503
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_bad_port_is_refused(db_url: str) -> None:
    result = rota(db_url, "scheduler", "--health-port=70000")
    assert result.returncode == 2
    assert "--health-port" in result.stderr
