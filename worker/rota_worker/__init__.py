"""The Rota worker process: claims jobs, runs handlers, holds leases, shuts down cleanly.

Never imports kopf or kubernetes: the worker image runs anywhere PostgreSQL is.
"""

from rota_worker.settings import WorkerSettings
from rota_worker.worker import Worker

__all__ = ["Worker", "WorkerSettings"]
