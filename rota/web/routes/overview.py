"""The overview: what needs the operator, the queue by type, the charts."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota.errors import InvalidInput
from rota.web import charts, overview
from rota.web.console import Console, check_params


def overview_page(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, {"range"})
    span = request.query_params.get("range") or "1h"
    if span not in charts.RANGES:
        raise InvalidInput(f"range must be one of {', '.join(charts.RANGES)}, not {span[:20]!r}")
    with c.conn() as conn:
        data = overview.read(conn, span=span)
    name = "overview_live.html" if request.headers.get("hx-request") else "overview.html"
    return c.render(
        request, name, who, o=data, span=span, ranges=charts.RANGES, nav="overview",
        failing_minutes=overview.FAILING_MINUTES,
    )  # fmt: skip


def routes(c: Console) -> list[Route]:
    return [Route("/", partial(overview_page, c))]
