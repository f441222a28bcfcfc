"""PostgreSQL servers for fault tests: one that survives crashes, and a streaming standby.

Both build on `rota.testing.EmbeddedPostgres` (same binaries, same temporary
directories, same unprivileged user when run as root):

- `CrashSafePostgres` commits synchronously, so an immediate stop (a crash of
  the server, not of the machine) loses no acknowledged commit; fsync stays off,
  which only matters when the operating system itself goes down;
- `StreamingStandby` is a hot standby made by `pg_basebackup` from a running
  primary, streaming asynchronously; it can be cut off from its primary and
  promoted, as a failover does.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg

from rota.testing import EmbeddedPostgres


class CrashSafePostgres(EmbeddedPostgres):
    """An embedded server whose acknowledged commits survive `stop("immediate")`."""

    SETTINGS = {**EmbeddedPostgres.SETTINGS, "synchronous_commit": "on"}


class StreamingStandby(EmbeddedPostgres):
    """A hot standby of `primary`, made from a base backup and streaming from it."""

    def __init__(self, primary: EmbeddedPostgres, *, port: int | None = None) -> None:
        self.primary = primary
        super().__init__(port=port)

    def _initdb(self) -> None:
        # No initdb: the data directory is a base backup of the primary, with
        # standby.signal and primary_conninfo written by `pg_basebackup -R`.
        self.user = self.primary.user
        self.root = Path(tempfile.mkdtemp(prefix="rota-pg-standby-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.socket_dir.mkdir()
        if self.user:
            for path in (self.root, self.socket_dir):
                shutil.chown(path, self.user)
            self.root.chmod(0o711)
        self._run(
            self.bin / "pg_basebackup",
            "-D",
            self.data,
            "-h",
            "127.0.0.1",
            "-p",
            str(self.primary.port),
            "-U",
            "postgres",
            "-X",
            "stream",
            "-c",
            "fast",
            "-R",
            "--no-sync",
        )
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"port = {self.port}\nunix_socket_directories = '{self.socket_dir}'\n")

    def wait_caught_up(self, timeout: float = 60) -> None:
        """Wait until this standby has replayed everything the primary has written so far."""
        with psycopg.connect(self.primary.url(), autocommit=True) as conn:
            row = conn.execute("SELECT pg_current_wal_lsn()").fetchone()
        assert row is not None
        target = row[0]
        deadline = time.monotonic() + timeout
        with psycopg.connect(self.url(), autocommit=True) as conn:
            while True:
                done = conn.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)
                ).fetchone()
                if done and done[0]:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"the standby did not replay up to {target} in {timeout}s")
                time.sleep(0.05)

    def cut_off(self) -> None:
        """Stop streaming from the primary (which carries on alone, asynchronously)."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 60
            while conn.execute("SELECT 1 FROM pg_stat_wal_receiver").fetchone():
                if time.monotonic() > deadline:
                    raise AssertionError("the standby's WAL receiver did not stop")
                time.sleep(0.05)

    def promote(self) -> None:
        """End recovery: the standby becomes a primary that accepts writes."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-w", "-t", "60", "promote")
