"""The five-minute tour, run as written against a fresh database.

The tour is the `console` block of "A five-minute tour" in docs/getting-started.md
(the README carries the same section). Each `$ ` line runs, in order; what the
docs show under it is compared with what it printed, line by line with runs of
spaces taken as one: `<...>` stands for text that differs between runs, a line
`...` for lines left out. The handlers are the section's first Python block,
with a mailer that refuses `.invalid` addresses. A command marked "until
Ctrl-C" (the worker) runs until no job is due, then gets SIGINT. The built-in
archive schedule is suspended after `rota migrate`, as the page says: it fires
on the wall clock.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
HEADING = "## A five-minute tour"

STUBS = """
class MailerError(Exception):
    pass


class mailer:
    @staticmethod
    def send(to, idempotency_key):
        if to.endswith(".invalid"):
            raise MailerError(f"cannot deliver to {to}")


def upstream_busy():
    return False


async def make_report(month):
    pass
"""


def section(text: str) -> str:
    start = text.index(HEADING)
    end = text.find("\n## ", start + len(HEADING))
    return text[start : end if end != -1 else len(text)]


def fenced(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def steps(block: str) -> list[tuple[str, list[str]]]:
    """(command, the lines shown under it) for every `$ ` line of the block."""
    found: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        else:
            found[-1][1].append(line)
    return found


def pattern(expected: list[str]) -> re.Pattern[str]:
    parts = []
    for line in expected:
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = re.split(r"(<[^<>\n]+>)", " ".join(line.split()))
        parts.append("".join(".+?" if p.startswith("<") else re.escape(p) for p in pieces) + r"\n")
    return re.compile("".join(parts))


def normalized(output: str) -> str:
    return "".join(" ".join(line.split()) + "\n" for line in output.splitlines())


def nothing_due(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM rota.job WHERE status = 'running'"
            " OR (status = 'ready' AND run_at <= now())"
        ).fetchone()
    return row is not None and row[0] == 0


def test_the_readme_carries_the_same_tour() -> None:
    readme = (ROOT / "README.md").read_text()
    assert section(readme) == section(PAGE.read_text())


def test_the_tour_runs_as_written(empty_db_url: str, tmp_path: Path) -> None:
    tour = section(PAGE.read_text())
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "jobs.py").write_text(STUBS + fenced(tour, "python")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PYTHONPATH"] = str(tmp_path)
    for command, expected in steps(fenced(tour, "console")[0]):
        words = shlex.split(command, comments=True)
        if words[0] == "export":
            assert words[1].startswith("ROTA_DATABASE_URL=")
            env["ROTA_DATABASE_URL"] = empty_db_url
            continue
        assert words[0] == "rota", command
        argv = [sys.executable, "-m", "rota", *words[1:]]
        if "until Ctrl-C" in command:
            assert not [line for line in expected if line.strip()], command
            worker = subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 120
            while not nothing_due(empty_db_url):
                assert time.monotonic() < deadline, "the worker did not run the due jobs"
                time.sleep(0.2)
            worker.send_signal(signal.SIGINT)
            assert worker.wait(timeout=60) == 0
            continue
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, (command, done.stderr)
        assert pattern(expected).fullmatch(normalized(done.stdout)), (command, done.stdout)
        if words[1] == "migrate":
            suspend_the_archiver(env, tmp_path, empty_db_url)


def suspend_the_archiver(env: dict[str, str], cwd: Path, url: str) -> None:
    """The built-in rota/archive schedule fires every five minutes of the wall
    clock: a worker running past one of those slots would add its job to the lists
    the tour shows. Suspended as the page says, it adds none, even with a slot
    already due (made so here, so that the suspension is what keeps it out on
    every run)."""
    argv = [sys.executable, "-m", "rota", "schedule", "suspend", "rota/archive"]
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    assert (done.returncode, done.stdout) == (0, "rota/archive: suspended\n"), done.stderr
    with psycopg.connect(url, autocommit=True) as conn:
        due = conn.execute(
            "UPDATE rota.schedule"
            " SET next_run_at = date_bin('5 minutes', now(), timestamptz '2000-01-01Z')"
            " WHERE name = 'rota/archive' AND suspend"
        )
        assert due.rowcount == 1
