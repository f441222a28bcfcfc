"""Helpers of the operator tests: the emulator's thread, a small API client, waiting.

Test modules import these from here (not from conftest, a name every test
directory has).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import kmock
import yaml
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

    def __init__(self, url: str, emulator: Emulator | None = None) -> None:
        self.url = url
        self.emulator = emulator
        """The emulator itself, to add namespaces (None for another server)."""

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
        for path in sorted([*CRDS.glob("*.yaml"), *CRDS.glob("kopf/*.yaml")]):
            for crd in yaml.safe_load_all(path.read_text()):
                self.create("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

    def kubeconfig(self) -> str:
        """A kubeconfig file's text pointing at this emulator."""
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [
                    {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
                ],
                "current-context": "emulator",
            }
        )

    def events(self, namespace: str, name: str) -> list[dict[str, Any]]:
        items = self.get(f"/api/v1/namespaces/{namespace}/events")["items"]
        return [e for e in items if e["involvedObject"]["name"] == name]
