"""The console's routes: one function per page, one per action.

Pages are plain functions run on Starlette's thread pool; actions read their
form on the event loop, pass the guards of `Console.actor`, then do their
database work on the thread pool. Bad input raises `InvalidInput` before
anything is written (the app answers 400).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rota import sql
from rota.db import fetch_all
from rota.errors import InvalidInput
from rota.flow import Limit
from rota.web import actions, auth, charts, filters, reads
from rota.web.console import (
    JOBS_PARAMS,
    Console,
    check_params,
    form_field,
    job_id_of,
    safe_next,
)

# -- pages ------------------------------------------------------------------------------


def build_routes(c: Console) -> list[Route | Mount]:
    def overview(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, {"range"})
        span = request.query_params.get("range") or "1h"
        if span not in charts.RANGES:
            raise InvalidInput(
                f"range must be one of {', '.join(charts.RANGES)}, not {span[:20]!r}"
            )
        with c.conn() as conn:
            data = reads.overview(conn, span=span)
        name = "overview_live.html" if request.headers.get("hx-request") else "overview.html"
        return c.render(request, name, who, o=data, span=span, ranges=charts.RANGES, nav="overview")

    def jobs(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, JOBS_PARAMS)
        q = request.query_params
        found = filters.parse_filter(q)
        before = filters.parse_id(q.get("before"), "before")
        limit = filters.parse_page_size(q.get("limit"))
        with c.conn() as conn:
            page = reads.job_page(conn, found, before, limit)
            known = reads.known_types(conn)
        bulk = [
            name for name, b in actions.BULK_ACTIONS.items()
            if found.status is None or found.status in b.statuses
        ]  # fmt: skip
        return c.render(
            request, "jobs.html", who, f=found, page=page, limit=limit, bulk=bulk,
            scan_rows=filters.SCAN_ROWS, known_types=known, nav="jobs",
        )  # fmt: skip

    def job(request: Request) -> Response:
        who = c.viewer(request)
        job_id = job_id_of(request)
        with c.conn() as conn:
            detail = reads.job_detail(conn, job_id)
        return c.render(request, "job.html", who, d=detail, j=detail.job, nav="jobs")

    def bulk_confirm(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, {*filters.FIELDS, "action", "priority"})
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
        check_params(request, set())
        with c.conn() as conn:
            groups = reads.dead_groups(conn)
        return c.render(request, "dead.html", who, groups=groups, nav="dead")

    def schedules(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, set())
        with c.conn() as conn:
            views = reads.schedules(conn)
        return c.render(request, "schedules.html", who, schedules=views, nav="schedules")

    def types(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, set())
        with c.conn() as conn:
            data = reads.overview(conn, drawn=False)
        limits = data.status.limits
        return c.render(request, "types.html", who, o=data, limits=limits, nav="types")

    def workers_page(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, set())
        with c.conn() as conn:
            found = reads.live_workers(conn)
        return c.render(request, "workers.html", who, workers=found, nav="workers")

    def audit(request: Request) -> Response:
        who = c.viewer(request)
        check_params(request, {"before", "limit"})
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
            next=safe_next(request.query_params.get("next")),
            error="", nav="",
        )  # fmt: skip

    async def login(request: Request) -> Response:
        form = await request.form()
        raw = form.get("token")
        given = raw.strip() if isinstance(raw, str) else ""
        target = safe_next(form_field(form, "next")) or "/"
        if not auth.token_matches(c.settings.auth, given):
            page = c.render(
                request, "login.html", auth.ANONYMOUS, next=target, error="That is not the token.",
                nav="",
            )  # fmt: skip
            page.status_code = 401
            return page
        session = auth.new_session(c.settings.auth, "token", auth.OPERATOR)

        def keep() -> None:
            with c.conn() as conn:
                fetch_all(conn, sql.query("web_session_insert"), {
                    "id": session.id, "actor": "token", "role": auth.OPERATOR,
                    "expires": session.expires, "now": None,
                })  # fmt: skip

        await run_in_threadpool(keep)
        response = RedirectResponse(target, status_code=303)
        c.set_cookie(request, response, auth.SESSION_COOKIE, session.cookie, auth.SESSION_SECONDS)
        return response

    async def logout(request: Request) -> Response:
        """Ends the session on the server (its cookie stops working everywhere)."""
        found = auth.read_session(c.settings.auth, request.cookies.get(auth.SESSION_COOKIE, ""))
        if found is not None:

            def end() -> None:
                with c.conn() as conn:
                    fetch_all(conn, sql.query("web_session_delete"), {"id": found.session})

            await run_in_threadpool(end)
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(auth.SESSION_COOKIE, httponly=True, samesite="strict")
        return response

    # -- actions --------------------------------------------------------------------
    def job_action(run: Callable[..., actions.Done], needs_priority: bool = False) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            job_id = job_id_of(request)
            extra = [filters.parse_priority(form_field(form, "priority"))] if needs_priority else []

            def work() -> actions.Done:
                with c.conn() as conn:
                    return run(conn, who, job_id, *extra)

            return c.acted(request, form, await _threaded(work))

        return endpoint

    async def bulk_apply(request: Request) -> Response:
        who, form = await c.actor(request)
        bulk, priority = _bulk_of(form)
        found = filters.parse_filter({k: v for k, v in form.items() if isinstance(v, str)})

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.bulk_apply(conn, who, bulk, found, priority)

        return c.acted(request, form, await _threaded(work))

    async def selected_apply(request: Request) -> Response:
        """An action on the jobs ticked on a page (`id` once per job)."""
        who, form = await c.actor(request)
        bulk, priority = _bulk_of(form)
        ids = [filters.parse_id(v, "id") for v in form.getlist("id") if isinstance(v, str)]

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.selection_apply(
                    conn, who, bulk, [i for i in ids if i is not None], priority
                )

        return c.acted(request, form, await _threaded(work))

    async def schedule_run(request: Request) -> Response:
        who, form = await c.actor(request)
        name = filters.clean(request.path_params["name"], "schedule name")

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.run_schedule(conn, who, name)

        return c.acted(request, form, await _threaded(work))

    async def dead_retry(request: Request) -> Response:
        who, form = await c.actor(request)
        job_type = form_field(form, "type") or ""
        error_class = form_field(form, "error_class") or ""

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.retry_dead_group(conn, who, job_type, error_class)

        return c.acted(request, form, await _threaded(work))

    def types_action(pause: bool) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            every = form_field(form, "all") is not None
            job_type = form_field(form, "type")
            if not every and not job_type:
                raise InvalidInput("give a job type, or all")
            chosen = None if every else [job_type or ""]
            run = actions.pause_types if pause else actions.resume_types

            def work() -> actions.Done:
                with c.conn() as conn:
                    return run(conn, who, chosen)

            return c.acted(request, form, await _threaded(work))

        return endpoint

    async def limit_set(request: Request) -> Response:
        who, form = await c.actor(request)
        job_type = form_field(form, "type")
        if not job_type:
            raise InvalidInput("give the job type to limit")
        wanted = Limit(
            job_type,
            concurrency=_whole(form, "concurrency"),
            group_concurrency=_whole(form, "group_concurrency"),
            rate=_whole(form, "rate"),
            per=_seconds(form, "per"),
        )

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.set_limit(conn, who, job_type, wanted)

        return c.acted(request, form, await _threaded(work))

    async def limit_clear(request: Request) -> Response:
        who, form = await c.actor(request)
        job_type = form_field(form, "type")
        if not job_type:
            raise InvalidInput("give the job type whose limits to clear")

        def work() -> actions.Done:
            with c.conn() as conn:
                return actions.clear_limit(conn, who, job_type)

        return c.acted(request, form, await _threaded(work))

    def schedule_action(suspend: bool) -> Any:
        async def endpoint(request: Request) -> Response:
            who, form = await c.actor(request)
            name = form_field(form, "name")
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
        Route("/jobs/selected", selected_apply, methods=["POST"]),
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
        Route("/schedules/{name:path}/run", schedule_run, methods=["POST"]),
        Route("/types", types),
        Route("/types/pause", types_action(True), methods=["POST"]),
        Route("/types/resume", types_action(False), methods=["POST"]),
        Route("/types/limit", limit_set, methods=["POST"]),
        Route("/types/limit/clear", limit_clear, methods=["POST"]),
        Route("/workers", workers_page),
        Route("/audit", audit),
        Route("/login", login_page),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/healthz", healthz),
        Mount("/static", app=static, name="static"),
    ]


def _bulk_of(form: FormData) -> tuple[actions.Bulk, int | None]:
    """A bulk action's name and, for a priority change, the new priority."""
    bulk = actions.bulk_action(form_field(form, "action"))
    if bulk.name != "priority":
        return bulk, None
    return bulk, filters.parse_priority(form_field(form, "priority"))


async def _threaded(work: Callable[[], actions.Done]) -> actions.Done:
    """Run an action's database work on the thread pool, off the event loop."""
    return await run_in_threadpool(work)


def _whole(form: Any, name: str) -> int | None:
    """A whole number from a form field (None when empty); `InvalidInput` otherwise."""
    value = _parsed(form, name, int, "a whole number")
    return None if value is None else int(value)


def _seconds(form: Any, name: str) -> float | None:
    return _parsed(form, name, float, "a number of seconds")


def _parsed(form: Any, name: str, parse: Callable[[str], float], what: str) -> float | None:
    text = form_field(form, name)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        raise InvalidInput(f"{name} must be {what}, not {text!r}") from None
