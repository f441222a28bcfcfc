"""The job types: pause and resume them, set and clear their limits."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota.errors import InvalidInput
from rota.flow import Limit
from rota.web import actions, overview
from rota.web.console import Console, check_params, form_field, name_field
from rota.web.routes.acting import seconds, threaded, whole


def types(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, set())
    with c.conn() as conn:
        data = overview.read(conn, drawn=False)
    limits = data.status.limits
    return c.render(request, "types.html", who, o=data, limits=limits, nav="types")


def types_action(c: Console, pause: bool) -> Any:
    async def endpoint(request: Request) -> Response:
        who, form = await c.actor(request, ["type", "all"])
        every = form_field(form, "all")
        job_type = name_field(form)
        if every not in (None, "1"):
            raise InvalidInput(f"all must be 1 (every type), not {every[:20]!r}")
        if every and job_type:
            raise InvalidInput("give a job type or all=1, not both")
        if not every and not job_type:
            raise InvalidInput("give a job type, or all")
        chosen = None if every else [job_type or ""]
        run = actions.pause_types if pause else actions.resume_types
        return c.acted(request, form, await threaded(c, run, who, chosen))

    return endpoint


async def limit_set(c: Console, request: Request) -> Response:
    fields = ["type", "concurrency", "group_concurrency", "rate", "per"]
    who, form = await c.actor(request, fields)
    job_type = name_field(form)
    if not job_type:
        raise InvalidInput("give the job type to limit")
    wanted = Limit(
        job_type,
        concurrency=whole(form, "concurrency"),
        group_concurrency=whole(form, "group_concurrency"),
        rate=whole(form, "rate"),
        per=seconds(form, "per"),
    )
    return c.acted(request, form, await threaded(c, actions.set_limit, who, job_type, wanted))


async def limit_clear(c: Console, request: Request) -> Response:
    who, form = await c.actor(request, ["type"])
    job_type = name_field(form)
    if not job_type:
        raise InvalidInput("give the job type whose limits to clear")
    return c.acted(request, form, await threaded(c, actions.clear_limit, who, job_type))


def routes(c: Console) -> list[Route]:
    post = ["POST"]
    return [
        Route("/types", partial(types, c)),
        Route("/types/pause", types_action(c, True), methods=post),
        Route("/types/resume", types_action(c, False), methods=post),
        Route("/types/limit", partial(limit_set, c), methods=post),
        Route("/types/limit/clear", partial(limit_clear, c), methods=post),
    ]
