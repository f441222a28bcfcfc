"""Log lines for people (text) or for log pipelines (one JSON object per line).

Worker log calls pass the facts as arguments (`job %s (%s)`); the JSON form
keeps the rendered message and adds the logger, level, time and process, so a
pipeline can filter on them without parsing prose.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "pid": os.getpid(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _not_a_lost_pipeline(record: logging.LogRecord) -> bool:
    """False for psycopg's note that ending a pipeline failed on a lost connection
    ("error ignored terminating <psycopg.Pipeline [BAD]>", libpq's lines after
    it) while the error of the statements in it propagates: Rota reports that
    error, once and on one line."""
    return not (
        record.msg == "error ignored terminating %r: %s"
        and isinstance(record.args, tuple)
        and "[BAD]" in repr(record.args[0])
    )


def configure(level: int = logging.INFO, fmt: str = "text") -> None:
    """Send logs to stderr, as text or JSON lines."""
    psycopg_log = logging.getLogger("psycopg")
    if _not_a_lost_pipeline not in psycopg_log.filters:
        psycopg_log.addFilter(_not_a_lost_pipeline)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
