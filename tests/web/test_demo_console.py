"""`rota demo` (what `make demo` runs) also serves the console and prints its address;
stopped by SIGTERM, it takes its embedded PostgreSQL down with it."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.request


def test_the_demo_prints_the_console_url_and_the_console_answers() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "rota", "demo", "--seconds", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert demo.stdout is not None
        database = None
        for line in demo.stdout:
            database = (
                re.search(r"Database: postgresql://\S+@127\.0\.0\.1:(\d+)/", line) or database
            )
            found = re.search(r"Console: (http://127\.0\.0\.1:\d+/)\s+\(token: (\S+)\)", line)
            if found:
                break
        else:
            raise AssertionError("the demo printed no console address")
        url, token = found.groups()
        with urllib.request.urlopen(url + "healthz", timeout=30) as response:
            assert response.read() == b"ok\n"
        request = urllib.request.Request(url + "jobs", headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert b"demo.email" in response.read()
    finally:
        demo.terminate()
        demo.communicate(timeout=120)
    assert demo.returncode == 0
    assert database is not None
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", int(database.group(1)))) != 0, "PostgreSQL still runs"
