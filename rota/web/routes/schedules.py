"""The schedules: their next slots and recent jobs; run one now, suspend, resume."""

from __future__ import annotations

from functools import partial
from typing import Any

from starlette.convertors import Convertor, register_url_convertor
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota import limits
from rota.errors import InvalidInput
from rota.web import actions, reads
from rota.web.console import Console, check_params, name_field
from rota.web.routes.acting import threaded


class AnyName(Convertor[str]):
    """A schedule's name in a path: any characters, `/` and line breaks among
    them (`path` stops at a line break, and every door takes a name with one)."""

    regex = r"[\s\S]*"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("any_name", AnyName())


def schedules(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, set())
    with c.conn() as conn:
        now = reads.database_now(conn)  # one clock for the slots and the page's times
        views = reads.schedules(conn, now)
    return c.render(request, "schedules.html", who, now, schedules=views, nav="schedules")


async def schedule_run(c: Console, request: Request) -> Response:
    who, form = await c.actor(request)
    name = limits.name(request.path_params["name"], "schedule name")
    return c.acted(request, form, await threaded(c, actions.run_schedule, who, name))


def schedule_action(c: Console, suspend: bool) -> Any:
    async def endpoint(request: Request) -> Response:
        who, form = await c.actor(request, ["name"])
        name = name_field(form, "name", "schedule name")
        if not name:
            raise InvalidInput("give the schedule's name")
        done = await threaded(c, actions.suspend_schedule, who, name, suspend)
        return c.acted(request, form, done)

    return endpoint


def routes(c: Console) -> list[Route]:
    post = ["POST"]
    return [
        Route("/schedules", partial(schedules, c)),
        Route("/schedules/suspend", schedule_action(c, True), methods=post),
        Route("/schedules/resume", schedule_action(c, False), methods=post),
        Route("/schedules/{name:any_name}/run", partial(schedule_run, c), methods=post),
    ]
