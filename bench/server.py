"""What a measurement costs the PostgreSQL server: CPU, WAL and commits.

CPU comes from /proc, not from PostgreSQL: the utime and stime of the
postmaster, of every live child (backends, autovacuum, checkpointer, WAL
writer), and the postmaster's cutime and cstime, which hold the times of the
children that already exited (a worker's backend that disconnected). The sum
only grows, so a difference of two readings is the server's CPU in between,
whatever connected or left. WAL is the difference of `pg_current_wal_lsn()`,
commits that of `xact_commit` in `pg_stat_database` for one database.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg

_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Reading:
    cpu_seconds: float
    wal_lsn: int
    """Bytes since the start of the WAL."""


@dataclasses.dataclass(frozen=True)
class Cost:
    """What the server spent on some jobs."""

    jobs: int
    cpu_seconds: float
    wal_bytes: int
    commits: int

    @property
    def cpu_seconds_per_1000_jobs(self) -> float:
        return 1000 * self.cpu_seconds / max(self.jobs, 1)

    @property
    def wal_bytes_per_job(self) -> float:
        return self.wal_bytes / max(self.jobs, 1)

    @property
    def commits_per_job(self) -> float:
        return self.commits / max(self.jobs, 1)

    def as_dict(self) -> dict[str, float]:
        return {
            "jobs": self.jobs,
            "cpu_seconds": self.cpu_seconds,
            "wal_bytes": self.wal_bytes,
            "commits": self.commits,
            "cpu_seconds_per_1000_jobs": self.cpu_seconds_per_1000_jobs,
            "wal_bytes_per_job": self.wal_bytes_per_job,
            "commits_per_job": self.commits_per_job,
        }


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split after the last ")".
    return text[text.rindex(")") + 2 :].split()


def postmaster_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def server_cpu_seconds(postmaster: int) -> float:
    """CPU seconds the server has used so far (itself, live children, exited children)."""
    own = _stat(postmaster)
    if own is None:
        raise RuntimeError(f"no PostgreSQL postmaster with pid {postmaster}")
    # Fields after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    ticks = sum(int(x) for x in own[11:15])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields is not None and int(fields[1]) == postmaster:
            ticks += sum(int(x) for x in fields[11:15])
    return ticks / _TICKS


def cpu_seconds_of(pids: Iterable[int]) -> float:
    """CPU seconds some live processes have used so far, every thread of each (0 for a
    process already gone): what the workers of a drain spend on their side."""
    ticks = 0
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / _TICKS


class Server:
    """Readings of one PostgreSQL server, through one admin connection to `admin_url`.

    The connection stays open so that reading costs no backend start.
    """

    def __init__(self, data_dir: Path, admin_url: str) -> None:
        self.postmaster = postmaster_pid(data_dir)
        self.conn = psycopg.connect(admin_url, autocommit=True)

    def close(self) -> None:
        self.conn.close()

    def read(self) -> Reading:
        lsn = _one(self.conn, "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn")
        return Reading(server_cpu_seconds(self.postmaster), int(lsn))

    def round_trip_ms(self, idle: float, count: int) -> float:
        """Median milliseconds of a `SELECT 1`, each sent after `idle` seconds of quiet.

        Back to back it is the protocol and the loopback; after a pause it also
        holds what the machine takes to wake a sleeping backend and client, which
        each hop of a job sent to an idle worker pays again.
        """
        times = []
        for _ in range(count):
            time.sleep(idle)
            began = time.perf_counter()
            self.conn.execute(b"SELECT 1")
            times.append(time.perf_counter() - began)
        return statistics.median(times) * 1000

    def version(self) -> str:
        return str(_one(self.conn, "SHOW server_version"))

    def commits(self, database: str) -> int:
        """Commits counted for `database` so far (flushed statistics only: see settled)."""
        value = _one(
            self.conn, "SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (database,)
        )
        return int(value or 0)

    def settled(self, database: str, timeout: float = 30.0) -> None:
        """Wait until no backend is connected to `database`.

        A backend flushes its statistics when it exits, so after this the
        commit counter of the database is complete.
        """
        deadline = time.monotonic() + timeout
        while _one(
            self.conn, "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (database,)
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"backends still connected to {database} after {timeout}s")
            time.sleep(0.02)


def _one(conn: psycopg.Connection, query: str, params: tuple[object, ...] = ()) -> Any:
    row = conn.execute(query.encode(), params).fetchone()
    return row[0] if row else None
