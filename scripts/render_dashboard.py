"""Draw docs/dashboard.png: the Grafana dashboard's panels from a real Prometheus.

Runs tests/prometheus/test_prometheus.py (Debian's Prometheus scraping a real
worker and `rota exporter` every second under real traffic, every query checked
against the database) with ROTA_DASHBOARD_DATA set, so the test saves each
panel's range query over the run as Prometheus answered it; then draws every
panel where the dashboard places it (its gridPos), with its legend, from those
answers. Nothing is computed here: the lines are Prometheus's numbers (a series
that stays 0 throughout is left out, to keep the legends readable).

Needs `prometheus` (Debian package) and matplotlib (not a dependency of Rota):
    .venv/bin/pip install matplotlib && .venv/bin/python scripts/render_dashboard.py
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parents[1]
OUT = ROOT / "docs" / "dashboard.png"
UNITS = {"s": "seconds", "ops": "per second", "short": ""}


def collect(path: Path) -> dict[str, Any]:
    """Run the Prometheus test and return what it saved."""
    env = dict(os.environ, ROTA_DASHBOARD_DATA=str(path))
    test = "tests/prometheus/test_prometheus.py"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", test], cwd=ROOT, env=env)
    if done.returncode != 0 or not path.exists():
        sys.exit("the Prometheus test failed or was skipped (is prometheus installed?)")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def draw(data: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = data["panels"]
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    plt.style.use("dark_background")
    fig = plt.figure(figsize=(20, rows * 0.62))
    grid = fig.add_gridspec(rows, 24, hspace=1.6, wspace=1.4, top=0.95, bottom=0.03)
    start = data["start"]
    seconds = math.ceil(data["end"] - start)
    fig.suptitle(
        f"Rota dashboard: Prometheus 2.42's answers to every panel query over a {seconds} s run"
        " (a worker and rota exporter scraped every second)",
        fontsize=14,
    )
    for panel in panels:
        g = panel["gridPos"]
        ax = fig.add_subplot(grid[g["y"] : g["y"] + g["h"] - 1, g["x"] : g["x"] + g["w"]])
        ax.set_title(panel["title"], loc="left", fontsize=11)
        ax.grid(alpha=0.2)
        ax.set_xlim(0, seconds)
        ax.set_xlabel("seconds into the run", fontsize=8)
        if UNITS.get(panel["unit"]):
            ax.set_ylabel(UNITS[panel["unit"]], fontsize=8)
        shown = [s for s in panel["series"] if any(y for _, y in s["points"])] or panel["series"]
        for series in shown:  # a series that stays 0 is left out, as its legend would crowd
            t = [x - start for x, _ in series["points"]]
            v = [y for _, y in series["points"]]
            style = "--" if series["legend"] == "target" else "-"
            ax.step(t, v, where="post", linestyle=style, label=series["legend"])
        if shown:
            ax.legend(fontsize=7, loc="upper left")
        else:
            ax.text(0.5, 0.5, "no data (no operator in this run)", ha="center",
                    transform=ax.transAxes, alpha=0.6)  # fmt: skip
        ax.set_ylim(bottom=0)  # every panel's min is 0, as in the dashboard
        ax.tick_params(labelsize=8)
    fig.savefig(OUT, dpi=72, bbox_inches="tight")


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        draw(collect(Path(tmp) / "panels.json"))
    print(f"wrote {OUT}")
