"""Logging in with the token (a server-side session) and out (the session ends)."""

from __future__ import annotations

from functools import partial

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from rota import sql
from rota.db import fetch_all
from rota.web import auth
from rota.web.console import Console, check_form, check_params, next_of, safe_next


def login_page(c: Console, request: Request) -> Response:
    check_params(request, {"next"})
    return c.render(
        request, "login.html", auth.ANONYMOUS,
        next=safe_next(request.query_params.get("next")), error="", nav="",
    )  # fmt: skip


def _from_this_site(c: Console, request: Request) -> None:
    """Logging in or out is a POST like any other: refused from another site's page
    (a forged login would put a visitor in a session of the forger's choosing)."""
    client = request.client.host if request.client else None
    if not auth.same_origin(c.settings.auth, auth.ANONYMOUS, request.headers, client):
        raise HTTPException(403, "the request comes from another site (Origin)")


async def login(c: Console, request: Request) -> Response:
    _from_this_site(c, request)
    form = await request.form()
    check_form(request, form, {"token", "next"}, ())
    raw = form.get("token")
    given = raw.strip() if isinstance(raw, str) else ""
    target = next_of(form)
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


async def logout(c: Console, request: Request) -> Response:
    """Ends the session on the server (its cookie stops working everywhere)."""
    _from_this_site(c, request)
    found = auth.read_session(c.settings.auth, request.cookies.get(auth.SESSION_COOKIE, ""))
    if found is not None:

        def end() -> None:
            with c.conn() as conn:
                fetch_all(conn, sql.query("web_session_delete"), {"id": found.session})

        await run_in_threadpool(end)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(auth.SESSION_COOKIE, httponly=True, samesite="strict")
    return response


def routes(c: Console) -> list[Route]:
    return [
        Route("/login", partial(login_page, c)),
        Route("/login", partial(login, c), methods=["POST"]),
        Route("/logout", partial(logout, c), methods=["POST"]),
    ]
