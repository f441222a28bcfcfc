"""The real operator, run by kopf's KopfRunner against the emulator and a real PostgreSQL.

The emulator runs in a thread of its own with its own event loop, and so does
the operator (KopfRunner's thread): the tests themselves are plain synchronous
functions that talk HTTP to the emulator and SQL to the database, and wait on
conditions with deadlines.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
from collections.abc import Callable, Iterator

import pytest

# Read when rota_operator.handlers is imported (timer intervals are fixed at declaration).
os.environ.setdefault("ROTA_SCHEDULE_SYNC_SECONDS", "1")

from kopf.testing import KopfRunner
from kube_client import Api, EmulatorThread, wait_for

# kopf's runner thread may still log a line while it winds down, after pytest
# has closed the stream its handler wrote to; that line is of no interest, and
# the "--- Logging error ---" report of it would only bury the test output.
logging.raiseExceptions = False


@pytest.fixture
def kube_api() -> Iterator[Api]:
    """A fresh emulator with Rota's CRDs installed."""
    server = EmulatorThread()
    try:
        api = Api(server.url, server.emulator)
        api.apply_crds()
        yield api
    finally:
        server.close()


@pytest.fixture
def run_operator(
    kube_api: Api, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., contextlib.AbstractContextManager[KopfRunner]]:
    """Start the operator (standalone, all namespaces) on a database URL of the test's choice."""

    @contextlib.contextmanager
    def start(database_url: str, standalone: bool = True) -> Iterator[KopfRunner]:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(kube_api.kubeconfig())
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("ROTA_DATABASE_URL", database_url)
        monkeypatch.setenv("ROTA_STANDALONE", str(standalone).lower())
        monkeypatch.setenv("ROTA_METRICS_PORT", "0")
        monkeypatch.setenv("ROTA_METRICS_HOST", "127.0.0.1")
        monkeypatch.setenv("ROTA_RETRY_MAX_SECONDS", "1")
        args = ["run", "-m", "rota_operator", "--all-namespaces", "--verbose"]
        args += ["--standalone"] if standalone else []
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            with KopfRunner(args, timeout=60) as runner:
                # kopf makes its log handler on sys.stderr as it is then. Made
                # after a fixture returned, in the moment pytest stops capturing
                # between a test's setup and its call, the handler would write
                # to the terminal: wait for it while the capture holds.
                wait_for(
                    lambda: [h for h in root.handlers if h not in handlers],
                    what="the operator's log handler",
                )
                yield runner
        finally:
            # kopf's CLI logs to the stream the runner captured and closes: forget that handler.
            root.handlers[:], root.level = handlers, level
        assert runner.exception is None, runner.output

    return start


@pytest.fixture
def operator(
    db_url: str, run_operator: Callable[..., contextlib.AbstractContextManager[KopfRunner]]
) -> Iterator[KopfRunner]:
    """The operator running on the test's database until the test ends."""
    with run_operator(db_url) as runner:
        yield runner
