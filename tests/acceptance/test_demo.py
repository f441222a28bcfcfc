"""`rota demo` (what `make demo` runs) starts, runs jobs and stops cleanly."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def test_demo_runs_jobs_on_an_embedded_database() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rota", "demo", "--seconds", "4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    final = result.stdout.rsplit("Rota status at", 1)[-1]
    assert "demo.email" in final and "demo/every-minute" in final
    email = next(line.split() for line in final.splitlines() if line.startswith("demo.email"))
    assert int(email[6]) > 0  # DONE column (after WAITING): jobs really ran


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_demo_serves_its_console_on_the_port_given_and_prints_commands_that_work() -> None:
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "rota", "demo", "--port", str(port), "--seconds", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert demo.stdout is not None
        seen: list[str] = []
        deadline = time.monotonic() + 90
        while True:
            line = demo.stdout.readline()
            assert line and time.monotonic() < deadline, "".join(seen)
            seen.append(line)
            if "schedule list" in line:
                break
        text = "".join(seen)
        assert f"Console: http://127.0.0.1:{port}/" in text
        assert "Try from another terminal:" in text
        url = re.search(r"export ROTA_DATABASE_URL=(\S+)", text)
        assert url, text
        with contextlib.suppress(urllib.error.HTTPError):  # any answer: the console is there
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).close()
        shown = subprocess.run(
            [sys.executable, "-m", "rota", "jobs", "show", "46"],
            env=dict(os.environ, ROTA_DATABASE_URL=url.group(1)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0 and "demo.poison" in shown.stdout, shown
    finally:
        demo.send_signal(signal.SIGTERM)
        demo.wait(timeout=60)


def test_demo_on_a_port_in_use_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "rota", "demo", "--port", str(port), "--seconds", "1"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"rota: the console cannot listen on 127.0.0.1:{port} (Address already in use):"
        " choose another --port, or --port 0 for any free one"
    ]
