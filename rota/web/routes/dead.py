"""The dead letters, grouped by type and error class, and retrying a group."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota import limits
from rota.web import actions, reads
from rota.web.console import Console, check_params, name_field
from rota.web.routes.acting import threaded


def dead(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, set())
    with c.conn() as conn:
        groups = reads.dead_groups(conn)
    return c.render(request, "dead.html", who, groups=groups, nav="dead")


async def dead_retry(c: Console, request: Request) -> Response:
    who, form = await c.actor(request, ["type", "error_class"])
    job_type = name_field(form) or ""
    # As the group showed it: the start of a last_error, which no cap bounds.
    error_class = limits.text(form.get("error_class") or "", "error_class")
    done = await threaded(c, actions.retry_dead_group, who, job_type, error_class)
    return c.acted(request, form, done)


def routes(c: Console) -> list[Route]:
    return [
        Route("/dead", partial(dead, c)),
        Route("/dead/retry", partial(dead_retry, c), methods=["POST"]),
    ]
