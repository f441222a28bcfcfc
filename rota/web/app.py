"""The console's web application: routes, access checks, and page rendering.

Pages are rendered on the server from Jinja2 templates (autoescaped: a payload
is always text, never markup); the overview refreshes itself through htmx,
served from this package (no CDN). Every POST is an action: it is refused with
401 without credentials, 403 for a viewer, in read-only mode or without the
CSRF value, and 4xx for bad input, before anything is written.
Handlers are plain functions run on Starlette's thread pool, each borrowing a
connection from a small pool of autocommit connections.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout
from starlette.applications import Starlette
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rota import workers
from rota.db import Conn
from rota.errors import DatabaseUnavailable, InvalidInput, JobNotFound, RotaError
from rota.jobs import Status
from rota.status import format_age
from rota.web import actions, auth, filters, reads
from rota.web.auth import Identity

log = logging.getLogger("rota.web")

JOBS_PARAMS = {*filters.FIELDS, "before", "limit", "flash"}


@dataclasses.dataclass(frozen=True)
class WebSettings:
    dsn: str
    """Database URL ("" lets libpq use its PG* variables)."""
    auth: auth.AuthSettings = dataclasses.field(default_factory=auth.AuthSettings)
    read_only: bool = False
    """Hide every action and refuse every POST but logging in and out."""
    sample_seconds: float = 30.0
    """How often the console records the queue sample its charts read (0: never)."""
    pool_size: int = 8
    """Most database connections the console holds."""
    statement_timeout_ms: int = 10_000
    """A console query that runs longer is cancelled (keeps a slow page off the database)."""


class Console:
    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self.pool = ConnectionPool(
            settings.dsn,
            min_size=1,
            max_size=settings.pool_size,
            open=False,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                # Plans are made for each query's actual values: a filter left
                # empty must not leave a generic plan that walks the table.
                "prepare_threshold": None,
                "application_name": "rota-web",
                "options": f"-c statement_timeout={settings.statement_timeout_ms}",
            },
        )
        loader = jinja2.FileSystemLoader(str(resources.files("rota.web") / "templates"))
        self.templates = jinja2.Environment(loader=loader, autoescape=True)
        self.templates.filters["age"] = format_age
        self.templates.filters["instant"] = _instant
        self.templates.filters["utc"] = lambda v: _instant(v.astimezone(UTC)) if v else "-"
        self.templates.globals["statuses"] = [s.value for s in Status]
        self._stop = threading.Event()

    # -- plumbing ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.pool.open()
        sampler = threading.Thread(target=self._sample, name="rota-web-sampler", daemon=True)
        if self.settings.sample_seconds > 0:
            sampler.start()
        try:
            yield
        finally:
            self._stop.set()
            self.pool.close()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                with self.pool.connection() as conn:
                    workers.record_sample(conn)
            except Exception as exc:  # keep sampling through outages
                log.warning("cannot record the queue sample: %s", exc)
            self._stop.wait(self.settings.sample_seconds)

    def conn(self) -> contextlib.AbstractContextManager[Conn]:
        return self.pool.connection(timeout=10)

    def identify(self, request: Request) -> Identity:
        client = request.client.host if request.client else None
        return auth.identify(self.settings.auth, request.headers, request.cookies, client)

    def render(self, request: Request, name: str, who: Identity, **context: Any) -> HTMLResponse:
        page = self.templates.get_template(name).render(
            request=request,
            who=who,
            read_only=self.settings.read_only,
            can_act=who.can_act and not self.settings.read_only,
            csrf=who.csrf,
            flash=request.query_params.get("flash", "")[:300],
            path=request.url.path,
            here=_here(request),
            auth_configured=self.settings.auth.configured,
            now_utc=datetime.now(UTC),
            **context,
        )
        return HTMLResponse(page)

    # -- guards ---------------------------------------------------------------------
    def viewer(self, request: Request) -> Identity:
        try:
            return self.identify(request)
        except auth.Unauthenticated as exc:
            if "text/html" in request.headers.get("accept", ""):
                target = "/login?" + urlencode({"next": _here(request)})
                raise HTTPException(303, headers={"Location": target}) from exc
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc

    async def actor(self, request: Request) -> tuple[Identity, FormData]:
        """The identity of a POST allowed to act, and its form; 401/403 otherwise."""
        try:
            who = self.identify(request)
        except auth.Unauthenticated as exc:
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc
        if self.settings.read_only:
            raise HTTPException(403, "the console is read-only")
        if not who.can_act:
            raise HTTPException(403, f"{who.name} is a {who.role}: viewers cannot act")
        form = await request.form()
        given = form.get("csrf")
        if not auth.csrf_ok(who, given if isinstance(given, str) else None):
            raise HTTPException(403, "the form's CSRF value is missing or wrong: reload the page")
        return who, form

    def acted(self, request: Request, form: FormData, done: actions.Done) -> Response:
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse(dataclasses.asdict(done))
        target = _safe_next(_field(form, "next")) or "/"
        joiner = "&" if "?" in target else "?"
        return RedirectResponse(f"{target}{joiner}flash={quote(done.message)}", status_code=303)


def _field(form: Mapping[str, Any], name: str) -> str | None:
    value = form.get(name)
    return value.strip() if isinstance(value, str) and value.strip() else None


def _safe_next(target: str | None) -> str | None:
    """Only a path of this console (never another site) is a place to return to."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    # Strip an earlier flash message from the path.
    path, _, query = target.partition("?")
    kept = "&".join(p for p in query.split("&") if p and not p.startswith("flash="))
    return f"{path}?{kept}" if kept else path


def _here(request: Request) -> str:
    params = [(k, v) for k, v in request.query_params.multi_items() if k != "flash"]
    return request.url.path + ("?" + urlencode(params) if params else "")


def _instant(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value else "-"


def _job_id(request: Request) -> int:
    job_id = filters.parse_id(request.path_params["job_id"], "job id")
    assert job_id is not None
    return job_id


def _check_params(request: Request, allowed: set[str]) -> None:
    unknown = sorted(set(request.query_params) - allowed)
    if unknown:
        raise InvalidInput(
            f"unknown parameter {unknown[0]!r} (known: {', '.join(sorted(allowed))})"
        )


# -- pages ------------------------------------------------------------------------------


def build_routes(c: Console) -> list[Route | Mount]:
    def overview(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"flash"})
        with c.conn() as conn:
            data = reads.overview(conn)
        name = "overview_live.html" if request.headers.get("hx-request") else "overview.html"
        return c.render(request, name, who, o=data, nav="overview")

    def jobs(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, JOBS_PARAMS)
        q = request.query_params
        found = filters.parse_filter(q)
        before = filters.parse_id(q.get("before"), "before")
        limit = filters.parse_page_size(q.get("limit"))
        with c.conn() as conn:
            page = reads.job_page(conn, found, before, limit)
        bulk = [
            name for name, b in actions.BULK_ACTIONS.items()
            if found.status is None or found.status in b.statuses
        ]  # fmt: skip
        return c.render(
            request, "jobs.html", who, f=found, page=page, limit=limit, bulk=bulk,
            scan_rows=filters.SCAN_ROWS, nav="jobs",
        )  # fmt: skip

    def job(request: Request) -> Response:
        who = c.viewer(request)
        job_id = _job_id(request)
        with c.conn() as conn:
            detail = reads.job_detail(conn, job_id)
        return c.render(request, "job.html", who, d=detail, j=detail.job, nav="jobs")

    def bulk_confirm(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {*filters.FIELDS, "action", "priority", "flash"})
        q = request.query_params
        bulk = actions.bulk_action(q.get("action"))
        found = filters.parse_filter(q)
        priority = filters.parse_priority(q.get("priority")) if bulk.name == "priority" else None
        with c.conn() as conn:
            count = actions.bulk_count(conn, bulk, found)
        return c.render(
            request, "bulk.html", who, bulk=bulk, f=found, count=count, cap=actions.BULK_CAP,
            priority=priority, nav="jobs",
        )  # fmt: skip

    def dead(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"flash"})
        with c.conn() as conn:
            groups = reads.dead_groups(conn)
        return c.render(request, "dead.html", who, groups=groups, nav="dead")

    def schedules(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"flash"})
        with c.conn() as conn:
            views = reads.schedules(conn)
        return c.render(request, "schedules.html", who, schedules=views, nav="schedules")

    def types(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"flash"})
        with c.conn() as conn:
            data = reads.overview(conn)
        return c.render(request, "types.html", who, o=data, nav="types")

    def workers_page(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"flash"})
        with c.conn() as conn:
            found = reads.live_workers(conn)
        return c.render(request, "workers.html", who, workers=found, nav="workers")

    def audit(request: Request) -> Response:
        who = c.viewer(request)
        _check_params(request, {"before", "limit", "flash"})
        before = filters.parse_id(request.query_params.get("before"), "before")
        limit = filters.parse_page_size(request.query_params.get("limit"))
        with c.conn() as conn:
            rows, next_before = reads.audit_page(conn, before, limit)
        return c.render(
            request, "audit.html", who, rows=rows, next_before=next_before, limit=limit,
            nav="audit",
        )  # fmt: skip

    def healthz(request: Request) -> Response:
        return Response("ok\n", media_type="text/plain")

    # -- login ----------------------------------------------------------------------
    def login_page(request: Request) -> Response:
        return c.render(
            request, "login.html", auth.ANONYMOUS,
            next=_safe_next(request.query_params.get("next")),
            error="", nav="",
        )  # fmt: skip

    async def login(request: Request) -> Response:
        form = await request.form()
        given = _field(form, "token") or ""
        target = _safe_next(_field(form, "next")) or "/"
        if not auth.token_matches(c.settings.auth, given):
            page = c.render(
                request, "login.html", auth.ANONYMOUS, next=target, error="That is not the token.",
                nav="",
            )  # fmt: skip
            page.status_code = 401
            return page
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            auth.SESSION_COOKIE,
            auth.session_cookie(c.settings.auth, "token", auth.OPERATOR),
            max_age=auth.SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    async def logout(request: Request) -> Response:
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(auth.SESSION_COOKIE)
        return response

    # -- actions --------------------------------------------------------------------
    def job_action(run: Callable[..., actions.Done], needs_priority: bool = False) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            job_id = _job_id(request)
            extra = [filters.parse_priority(_field(form, "priority"))] if needs_priority else []

            def work() -> actions.Done:
                with c.conn() as conn:
                    return run(conn, who, job_id, *extra)

            return c.acted(request, form, await _threaded(work))

        return endpoint

    async def bulk_apply(request: Request) -> Response:
        who, form = await c.actor(request)
        bulk = actions.bulk_action(_field(form, "action"))
        found = filters.parse_filter({k: v for k, v in form.items() if isinstance(v, str)})
        priority = (
            filters.parse_priority(_field(form, "priority")) if bulk.name == "priority" else None
        )

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.bulk_apply(conn, who, bulk, found, priority)

        return c.acted(request, form, await _threaded(work))

    async def dead_retry(request: Request) -> Response:
        who, form = await c.actor(request)
        job_type = _field(form, "type") or ""
        error_class = _field(form, "error_class") or ""

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.retry_dead_group(conn, who, job_type, error_class)

        return c.acted(request, form, await _threaded(work))

    def types_action(pause: bool) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            every = _field(form, "all") is not None
            job_type = _field(form, "type")
            if not every and not job_type:
                raise InvalidInput("give a job type, or all")
            chosen = None if every else [job_type or ""]
            run = actions.pause_types if pause else actions.resume_types

            def work() -> actions.Done:
                with c.conn() as conn:
                    return run(conn, who, chosen)

            return c.acted(request, form, await _threaded(work))

        return endpoint

    def schedule_action(suspend: bool) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            name = _field(form, "name")
            if not name:
                raise InvalidInput("give the schedule's name")

            def work() -> actions.Done:
                with c.conn() as conn:
                    return actions.suspend_schedule(conn, who, name, suspend)

            return c.acted(request, form, await _threaded(work))

        return endpoint

    static = StaticFiles(directory=str(resources.files("rota.web") / "static"))
    return [
        Route("/", overview),
        Route("/jobs", jobs),
        Route("/jobs/bulk", bulk_confirm),
        Route("/jobs/bulk", bulk_apply, methods=["POST"]),
        Route("/jobs/{job_id}", job),
        Route("/jobs/{job_id}/retry", job_action(actions.retry_job), methods=["POST"]),
        Route("/jobs/{job_id}/cancel", job_action(actions.cancel_job), methods=["POST"]),
        Route("/jobs/{job_id}/run-now", job_action(actions.run_now), methods=["POST"]),
        Route(
            "/jobs/{job_id}/priority",
            job_action(actions.set_priority, needs_priority=True),
            methods=["POST"],
        ),
        Route("/dead", dead),
        Route("/dead/retry", dead_retry, methods=["POST"]),
        Route("/schedules", schedules),
        Route("/schedules/suspend", schedule_action(True), methods=["POST"]),
        Route("/schedules/resume", schedule_action(False), methods=["POST"]),
        Route("/types", types),
        Route("/types/pause", types_action(True), methods=["POST"]),
        Route("/types/resume", types_action(False), methods=["POST"]),
        Route("/workers", workers_page),
        Route("/audit", audit),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Mount("/static", app=static, name="static"),
    ]


async def _threaded(work: Callable[[], actions.Done]) -> actions.Done:
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(work)


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


def create_app(settings: WebSettings) -> Starlette:
    """The console as an ASGI application (`uvicorn` serves it in `rota web`)."""
    c = Console(settings)
    app = Starlette(
        routes=build_routes(c),
        lifespan=c.lifespan,
        exception_handlers={
            HTTPException: _http_error(c),
            InvalidInput: _error_handler(c, 400),
            JobNotFound: _error_handler(c, 404),
            actions.Conflict: _error_handler(c, 409),
            DatabaseUnavailable: _error_handler(c, 503),
            PoolTimeout: _error_handler(c, 503),
            RotaError: _error_handler(c, 500),
        },
    )
    app.state.console = c
    return app
