"""The console's routes, one module per page area.

Pages are plain functions run on Starlette's thread pool; actions read their
form on the event loop, pass the guards of `Console.actor`, then do their
database work on the thread pool. Bad input raises `InvalidInput` before
anything is written (the app answers 400). Each area's module lists its own
routes; this one joins them with the static files and the health check.
"""

from __future__ import annotations

from importlib import resources

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from rota.web.console import Console
from rota.web.routes import audit, dead, jobs, login, overview, schedules, types, workers

AREAS = (overview, jobs, dead, schedules, types, workers, audit, login)


def healthz(request: Request) -> Response:
    return Response("ok\n", media_type="text/plain")


def build_routes(c: Console) -> list[BaseRoute]:
    """Every route of the console, each area's in turn."""
    found: list[BaseRoute] = [route for area in AREAS for route in area.routes(c)]
    static = StaticFiles(directory=str(resources.files("rota.web") / "static"))
    return [*found, Route("/healthz", healthz), Mount("/static", app=static, name="static")]
