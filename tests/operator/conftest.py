"""The real operator, run by kopf's KopfRunner against the emulator and a real PostgreSQL.

The emulator runs in a thread of its own with its own event loop, and so does
the operator (KopfRunner's thread): the tests themselves are plain synchronous
functions that talk HTTP to the emulator and SQL to the database, and wait on
conditions with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import kmock
import pytest
import yaml

# Read when rota_operator.handlers is imported (timer intervals are fixed at declaration).
os.environ.setdefault("ROTA_SCHEDULE_SYNC_SECONDS", "1")

from kopf.testing import KopfRunner
from kube_emulator import Emulator

CRDS = pathlib.Path(__file__).parents[2] / "crds"
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 15.0, what: str = "condition") -> T:
    """Poll `check` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}; last value: {last!r}")


class EmulatorThread:
    """The emulator served on 127.0.0.1 from its own thread and event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.emulator: Emulator | None = None
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),))
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the Kubernetes emulator did not start")

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with Emulator() as emulator, kmock.Server(emulator) as server:
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def close(self) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        self.loop.close()


class Api:
    """A few JSON calls to the emulator, the way kubectl would make them."""

    def __init__(self, url: str) -> None:
        self.url = url

    def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": content_type or "application/json"}
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def get(self, path: str) -> Any:
        try:
            return self.request("GET", path)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise

    def create(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, "application/merge-patch+json")

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def apply_crds(self) -> None:
        for path in sorted(CRDS.glob("*.yaml")):
            for crd in yaml.safe_load_all(path.read_text()):
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]


@pytest.fixture
def kube_api() -> Iterator[Api]:
    """A fresh emulator with Rota's CRDs installed."""
    server = EmulatorThread()
    try:
        api = Api(server.url)
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
        kubeconfig.write_text(_kubeconfig(kube_api.url))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("ROTA_DATABASE_URL", database_url)
        monkeypatch.setenv("ROTA_STANDALONE", str(standalone).lower())
        monkeypatch.setenv("ROTA_METRICS_PORT", "0")
        monkeypatch.setenv("ROTA_METRICS_HOST", "127.0.0.1")
        monkeypatch.setenv("ROTA_RETRY_MAX_SECONDS", "1")
        args = ["run", "-m", "rota_operator", "--all-namespaces", "--verbose"]
        args += ["--standalone"] if standalone else []
        with KopfRunner(args, timeout=60) as runner:
            yield runner
        assert runner.exception is None, runner.output

    return start


@pytest.fixture
def operator(
    db_url: str, run_operator: Callable[..., contextlib.AbstractContextManager[KopfRunner]]
) -> Iterator[KopfRunner]:
    """The operator running on the test's database until the test ends."""
    with run_operator(db_url) as runner:
        yield runner


def _kubeconfig(url: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": url}}],
            "users": [{"name": "tester", "user": {"token": "test-token"}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
            ],
            "current-context": "emulator",
        }
    )
