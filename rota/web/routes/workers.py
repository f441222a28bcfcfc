"""The live workers and what they run."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota.web import reads
from rota.web.console import Console, check_params


def workers_page(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, set())
    with c.conn() as conn:
        found = reads.live_workers(conn)
    return c.render(request, "workers.html", who, workers=found, nav="workers")


def routes(c: Console) -> list[Route]:
    return [Route("/workers", partial(workers_page, c))]
