"""The job list, a job's page, and the actions on one job, on the ticked jobs
and on everything a filter matches."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from starlette.datastructures import ImmutableMultiDict
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rota.errors import InvalidInput
from rota.web import actions, filters, reads
from rota.web.console import (
    JOBS_PARAMS,
    Console,
    check_params,
    form_field,
    job_id_of,
    json_fields,
)
from rota.web.routes.acting import threaded


def job_list(c: Console, request: Request) -> Response:
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


def job(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    check_params(request, set())
    job_id = job_id_of(request)
    with c.conn() as conn:
        detail = reads.job_detail(conn, job_id)
    return c.render(request, "job.html", who, d=detail, j=detail.job, nav="jobs")


def bulk_confirm(c: Console, request: Request) -> Response:
    who = c.viewer(request)
    # The filter's fields come from the jobs page's form (JSON_SUFFIX) or a link.
    q = ImmutableMultiDict(json_fields(request.query_params.multi_items()))
    check_params(request, {*filters.FIELDS, "action", "priority"}, q)
    bulk, priority = _bulk_of(q)
    found = filters.parse_filter(q)
    with c.conn() as conn:
        count = actions.bulk_count(conn, bulk, found)
    return c.render(
        request, "bulk.html", who, bulk=bulk, f=found, count=count, cap=actions.BULK_CAP,
        priority=priority, nav="jobs",
    )  # fmt: skip


def job_action(c: Console, run: Callable[..., actions.Done], needs_priority: bool = False) -> Any:
    async def endpoint(request: Request) -> Response:
        who, form = await c.actor(request, ["priority"] if needs_priority else [])
        job_id = job_id_of(request)
        extra = [filters.parse_priority(form_field(form, "priority"))] if needs_priority else []
        return c.acted(request, form, await threaded(c, run, who, job_id, *extra))

    return endpoint


async def bulk_apply(c: Console, request: Request) -> Response:
    who, form = await c.actor(request, [*filters.FIELDS, "action", "priority"])
    bulk, priority = _bulk_of(form)
    found = filters.parse_filter({k: v for k, v in form.items() if isinstance(v, str)})
    return c.acted(request, form, await threaded(c, actions.bulk_apply, who, bulk, found, priority))


async def selected_apply(c: Console, request: Request) -> Response:
    """An action on the jobs ticked on a page (`id` once per job)."""
    who, form = await c.actor(request, ["id", "action", "priority"], repeated=["id"])
    bulk, priority = _bulk_of(form)
    ids = [filters.parse_id(v, "id") for v in form.getlist("id") if isinstance(v, str)]
    chosen = [i for i in ids if i is not None]
    done = await threaded(c, actions.selection_apply, who, bulk, chosen, priority)
    return c.acted(request, form, done)


def _bulk_of(fields: Mapping[str, Any]) -> tuple[actions.Bulk, int | None]:
    """A bulk action's name and, for a priority change, the new priority (a
    priority given with another action is refused, never left unread)."""
    bulk = actions.bulk_action(form_field(fields, "action"))
    priority = form_field(fields, "priority")
    if bulk.name != "priority":
        if priority is not None:
            raise InvalidInput(f"priority goes with the priority action only, not with {bulk.name}")
        return bulk, None
    return bulk, filters.parse_priority(priority)


def routes(c: Console) -> list[Route]:
    post = ["POST"]
    return [
        Route("/jobs", partial(job_list, c)),
        Route("/jobs/bulk", partial(bulk_confirm, c)),
        Route("/jobs/bulk", partial(bulk_apply, c), methods=post),
        Route("/jobs/selected", partial(selected_apply, c), methods=post),
        Route("/jobs/{job_id}", partial(job, c)),
        Route("/jobs/{job_id}/retry", job_action(c, actions.retry_job), methods=post),
        Route("/jobs/{job_id}/cancel", job_action(c, actions.cancel_job), methods=post),
        Route("/jobs/{job_id}/run-now", job_action(c, actions.run_now), methods=post),
        Route(
            "/jobs/{job_id}/priority",
            job_action(c, actions.set_priority, needs_priority=True),
            methods=post,
        ),
    ]
