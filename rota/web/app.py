"""The console's web application: the routes of `rota.web.routes` on a `Console`,
with its errors answered as pages (browsers) or JSON (scripts).

Pages are rendered on the server from Jinja2 templates (autoescaped: a payload
is always text, never markup); lists refresh themselves through htmx, served
from this package (no CDN). Every answer carries a Content-Security-Policy that
allows no inline script and no framing, with nosniff and a same-origin
Referrer-Policy; input no database column can hold is a 400, never a 500.
Every POST is an action: it is refused with 401 without credentials, 403 for a
viewer, in read-only mode or without the CSRF value, and 4xx for bad input,
before anything is written.
Handlers are plain functions run on Starlette's thread pool, each borrowing a
connection from a small pool of autocommit connections.
"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rota.errors import DatabaseUnavailable, InvalidInput, JobNotFound, RotaError
from rota.web import actions, auth
from rota.web.console import Console, WebSettings
from rota.web.routes import build_routes

__all__ = ["Console", "WebSettings", "create_app"]


def _error_handler(c: Console, status: int) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        message = " ".join(str(exc).split()) or "error"
        if "text/html" not in request.headers.get("accept", ""):
            return JSONResponse({"error": message}, status_code=status)
        page = c.render(
            request, "error.html", auth.ANONYMOUS, status=status, message=message, nav=""
        )
        page.status_code = status
        return page

    return handle


NO_SCHEMA = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.InvalidSchemaName,
)
"""What a query meets in a database that `rota migrate` has not brought up to date."""


def _rota_error(c: Console) -> Callable[[Request, Exception], Response]:
    """500 for Rota's errors, but 503 with what to do for a database without the
    schema (or an older one): the console cannot work until `rota migrate` runs."""
    broken = _error_handler(c, 500)
    unmigrated = _error_handler(c, 503)

    def handle(request: Request, exc: Exception) -> Response:
        if isinstance(exc.__cause__, NO_SCHEMA) or isinstance(exc, NO_SCHEMA):
            first = str(exc.__cause__ or exc).splitlines()[0]
            said = RotaError(
                f"the database has no Rota schema, or an older one: run `rota migrate` ({first})"
            )
            return unmigrated(request, said)
        return broken(request, exc)

    return handle


def _server_error(c: Console) -> Callable[[Request, Exception], Response]:
    """500 for a bug: no word of the exception (the server's log has it), and the
    security headers on the answer itself, since Starlette sends it from outside
    every middleware."""
    broken = _error_handler(c, 500)

    def handle(request: Request, exc: Exception) -> Response:
        response = broken(request, RotaError("internal error: the console's log says more"))
        for key, value in SECURITY_HEADERS:
            response.headers[key.decode()] = value.decode()
        return response

    return handle


def _http_error(c: Console) -> Callable[[Request, Exception], Response]:
    def handle(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 303:
            return Response(status_code=303, headers=exc.headers)
        message = exc.detail if isinstance(exc.detail, str) else "error"
        if "text/html" not in request.headers.get("accept", ""):
            return JSONResponse(
                {"error": message}, status_code=exc.status_code, headers=exc.headers
            )
        page = c.render(
            request, "error.html", auth.ANONYMOUS, status=exc.status_code, message=message, nav=""
        )
        page.status_code = exc.status_code
        for key, value in (exc.headers or {}).items():
            page.headers[key] = value
        return page

    return handle


CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
]


class SecurityHeaders:
    """Adds SECURITY_HEADERS to every answer (pages, errors, static files)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


def create_app(settings: WebSettings) -> Starlette:
    """The console as an ASGI application (`uvicorn` serves it in `rota web`)."""
    c = Console(settings)
    app = Starlette(
        routes=build_routes(c),
        lifespan=c.lifespan,
        exception_handlers={
            HTTPException: _http_error(c),
            InvalidInput: _error_handler(c, 400),
            # Backstops: text a column cannot hold that a check above missed.
            UnicodeError: _error_handler(c, 400),
            psycopg.DataError: _error_handler(c, 400),
            JobNotFound: _error_handler(c, 404),
            actions.Conflict: _error_handler(c, 409),
            DatabaseUnavailable: _error_handler(c, 503),
            PoolTimeout: _error_handler(c, 503),
            RotaError: _rota_error(c),
            psycopg.errors.UndefinedTable: _rota_error(c),
            Exception: _server_error(c),
        },
    )
    app.add_middleware(SecurityHeaders)
    app.state.console = c
    return app
