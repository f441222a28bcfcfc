"""A worker's /metrics serves what it did itself, never the queue-wide figures."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request

import rota
from rota.handlers import Handler
from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_worker_serves_its_own_measures_and_probes(db_url):
    port = free_port()
    settings = WorkerSettings(concurrency=3, worker_id="w-metrics", metrics_port=port)
    handler = Handler("m.ok", lambda job: None, is_async=False, wants_context=False)
    worker = Worker(db_url, settings, handlers={"m.ok": handler}, services=[])
    thread = threading.Thread(target=worker.run, kwargs={"install_signals": False})
    thread.start()
    try:
        rota.enqueue(db_url, "m.ok")
        rota.enqueue(db_url, "m.ok")
        deadline = time.monotonic() + 60
        text = ""
        while 'rota_jobs_finished_total{outcome="done",type="m.ok"} 2.0' not in text:
            assert time.monotonic() < deadline, text
            time.sleep(0.05)
            text = get(port, "/metrics")[1]
        assert "rota_worker_slots 3.0" in text
        assert 'rota_job_attempts_bucket{le="1.0",type="m.ok"} 2.0' in text
        assert 'rota_jobs_finished_total{outcome="dead",type="m.ok"} 0.0' in text  # declared
        for queue_wide in ("rota_jobs{", "rota_dead_jobs", "rota_workers ", "_created"):
            assert queue_wide not in text
        assert get(port, "/healthz") == (200, "ok\n")
        assert get(port, "/nope")[0] == 404
    finally:
        worker.stop()
        thread.join(timeout=60)
