"""A PgBouncer in front of the test server, for the pooler tests.

Debian's `pgbouncer` package provides the binary (`make install` installs it
when it may); the tests that need it are skipped without it. Each `PgBouncer`
listens on a free loopback port with a configuration of its own: every
database name is passed through to the server (`* =`), clients are not asked
for a password (`auth_type = any`: the server's user from the test URL logs in
for them), and the pool mode is the one asked for.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.acceptance.procs import free_port

BINARY = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
)


def version() -> str:
    """The first line of `pgbouncer --version` ("PgBouncer 1.18.0")."""
    assert BINARY is not None
    out = subprocess.run([BINARY, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()[0].strip()


class PgBouncer:
    """A PgBouncer process in front of the server of `server_url`, owned by this object."""

    def __init__(self, server_url: str, pool_mode: str, **settings: str) -> None:
        assert BINARY is not None, "pgbouncer is not installed"
        self.pool_mode = pool_mode
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="rota-pgbouncer-"))
        self.root.chmod(0o755)  # read by the unprivileged user it runs as under root
        self.log = self.root / "pgbouncer.log"
        server = conninfo_to_dict(server_url)
        target = {k: server[k] for k in ("host", "port", "user", "password") if server.get(k)}
        config = {
            "listen_addr": "127.0.0.1",
            "listen_port": str(self.port),
            "unix_socket_dir": "",
            "auth_type": "any",
            "pool_mode": pool_mode,
            "max_client_conn": "500",
            "default_pool_size": "20",
            **settings,
        }
        lines = ["[databases]", f"* = {make_conninfo(**target)}", "[pgbouncer]"]
        lines += [f"{key} = {value}" for key, value in config.items()]
        self.config = self.root / "pgbouncer.ini"
        self.config.write_text("\n".join(lines) + "\n")
        self.config.chmod(0o644)
        self._proc: subprocess.Popen[bytes] | None = None

    def url(self, database_url: str) -> str:
        """`database_url` (a database of the server behind) reached through this pooler."""
        return make_conninfo(database_url, host="127.0.0.1", port=str(self.port))

    def start(self, timeout: float = 30) -> PgBouncer:
        command = [str(BINARY), str(self.config)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "nobody"]  # PgBouncer refuses to run as root
        with open(self.log, "wb") as out:
            self._proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        probe = make_conninfo(f"postgresql://127.0.0.1:{self.port}/postgres", connect_timeout=2)
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(f"pgbouncer exited: {self.log.read_text()}")
            try:
                with psycopg.connect(probe, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        shutil.rmtree(self.root, ignore_errors=True)

    def output(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text()
        return ""

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
