"""The audit log: who did what, newest first, a page at a time."""

from __future__ import annotations

from functools import partial

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota.web import filters, reads
from rota.web.console import Console, check_params


def audit(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, {"before", "limit"})
    before = filters.parse_id(request.query_params.get("before"), "before")
    limit = filters.parse_page_size(request.query_params.get("limit"))
    with c.conn() as conn:
        rows, next_before = reads.audit_page(conn, before, limit)
    return c.render(
        request, "audit.html", who, rows=rows, next_before=next_before, limit=limit, nav="audit"
    )


def routes(c: Console) -> list[Route]:
    return [Route("/audit", partial(audit, c))]
