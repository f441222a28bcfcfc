"""`rota demo` (what `make demo` runs) also serves the console and prints its address."""

from __future__ import annotations

import re
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
        for line in demo.stdout:
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
