"""The web console: see and steer the queue in a browser (`rota web`).

`create_app` builds the ASGI application; `rota.cli.web` serves it with
uvicorn. Pages read through the core's readers and `rota.web.reads`; actions go
through `rota.web.actions`, which uses the core's levers and writes an audit
row for each. This package needs the ``web`` extra (Starlette, Jinja2,
uvicorn); nothing else in Rota imports it.
"""

from __future__ import annotations

from rota.web.app import WebSettings, create_app
from rota.web.auth import AuthSettings

__all__ = ["AuthSettings", "WebSettings", "create_app"]
