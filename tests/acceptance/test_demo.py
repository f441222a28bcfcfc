"""`rota demo` (what `make demo` runs) starts, runs jobs and stops cleanly."""

from __future__ import annotations

import subprocess
import sys


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
    assert int(email[5]) > 0  # DONE column: jobs really ran
