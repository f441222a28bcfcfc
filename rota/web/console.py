"""The console's plumbing: settings, the connection pool, who is asking, rendering.

A `Console` holds what every request needs: the settings, a small pool of
autocommit connections (no prepared statements: each query is planned for its
actual values), the Jinja2 templates (autoescaped: a payload is always text,
never markup) and the sampler thread that records the charts' minute samples.
Its guards turn missing credentials into 401, a viewer, read-only mode or a
missing CSRF value into 403, before a handler touches the database. A session
cookie counts only while its server-side row lives (logging out deletes it);
the message of an action reaches the next page in a signed one-shot cookie.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
from collections import Counter
from collections.abc import AsyncIterator, Collection, Iterable, Mapping
from datetime import UTC, datetime
from importlib import resources
from typing import Any
from urllib.parse import quote, unquote_to_bytes, urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import jinja2
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData, ImmutableMultiDict
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from rota import limits, sql, workers
from rota.db import Conn, fetch_all, settle
from rota.errors import InvalidInput
from rota.jobs import Status
from rota.reading import RawInstant
from rota.status import format_age
from rota.web import actions, auth, filters, reads
from rota.web.auth import Identity

log = logging.getLogger("rota.web")

JOBS_PARAMS = {*filters.FIELDS, "before", "limit"}
FORM_TYPES = ("", "application/x-www-form-urlencoded", "multipart/form-data")
"""The bodies an action reads (none at all, or a form): any other body, JSON say,
is refused rather than read as an empty form."""
TIMELESS_PAGES = frozenset({"login.html"})
"""Pages that show no time, rendered without reading the database's clock."""
JSON_SUFFIX = ":json"
"""A field the console's own forms write as a JSON string (`type:json` holding
`"mail\\nout"`), read as the field without the suffix. A browser sends every
line break of a form value as CR LF, so a name with one, written as it is,
would come back as another name; JSON writes it as the two characters `\\n`,
which no browser rewrites. A field without the suffix is read as it is."""
MAX_NEXT = 16 * 1024
"""Longest `next` an action's form may carry: the request head uvicorn's HTTP/1.1
parser (h11) takes, so any page the console served, whatever its filter, is one
to return to."""


@dataclasses.dataclass(frozen=True)
class WebSettings:
    dsn: str
    """Database URL ("" lets libpq use its PG* variables)."""
    auth: auth.AuthSettings = dataclasses.field(default_factory=auth.AuthSettings)
    read_only: bool = False
    """Hide every action and refuse every POST but logging in and out."""
    sample_seconds: float = 30.0
    """How often the console records the queue sample its charts read (0: never)."""
    pool_size: int = 8
    """Most database connections the console holds."""
    statement_timeout_ms: int = 10_000
    """A console query that runs longer is cancelled (keeps a slow page off the database)."""


class Console:
    def __init__(self, settings: WebSettings) -> None:
        self.settings = settings
        self.pool = ConnectionPool(
            settings.dsn,
            min_size=1,
            max_size=settings.pool_size,
            open=False,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                # Plans are made for each query's actual values: a filter left
                # empty must not leave a generic plan that walks the table.
                "prepare_threshold": None,
                "application_name": "rota-web",
                "options": f"-c statement_timeout={settings.statement_timeout_ms}",
            },
            configure=settle,
        )
        loader = jinja2.FileSystemLoader(str(resources.files("rota.web") / "templates"))
        self.templates = jinja2.Environment(loader=loader, autoescape=True)
        self.templates.filters["age"] = format_age
        self.templates.filters["instant"] = _instant
        self.templates.filters["utc"] = lambda v: _instant(v.astimezone(UTC)) if v else "-"
        self.templates.filters["span"] = reads.span
        self.templates.filters["ago"] = _ago_on_page
        self.templates.filters["iso"] = lambda v: v.isoformat() if v else ""
        self.templates.filters["in_zone"] = in_zone
        self.templates.filters["json"] = as_json
        self.templates.filters["segment"] = path_segment
        self.templates.globals["statuses"] = [s.value for s in Status]
        self._stop = threading.Event()

    # -- plumbing ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.pool.open()
        sampler = threading.Thread(target=self._sample, name="rota-web-sampler", daemon=True)
        if self.settings.sample_seconds > 0:
            sampler.start()
        try:
            yield
        finally:
            self._stop.set()
            self.pool.close()

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                with self.pool.connection() as conn:
                    workers.record_sample(conn)
            except Exception as exc:  # keep sampling through outages
                log.warning("cannot record the queue sample: %s", exc)
            self._stop.wait(self.settings.sample_seconds)

    def conn(self) -> contextlib.AbstractContextManager[Conn]:
        return self.pool.connection(timeout=10)

    def identify(self, request: Request) -> Identity:
        """Who is asking (blocking: a session's row is read from the database)."""
        client = request.client.host if request.client else None
        who = auth.identify(self.settings.auth, request.headers, request.cookies, client)
        if who.via == "session":
            with self.conn() as conn:
                alive = fetch_all(
                    conn, sql.query("web_session_alive"), {"id": who.session, "now": None}
                )
            if not alive:
                if self.settings.auth.configured:
                    raise auth.Unauthenticated("the session has ended: log in again")
                return auth.ANONYMOUS
        return who

    def https(self, request: Request) -> bool:
        client = request.client.host if request.client else None
        return auth.is_https(self.settings.auth, request.url.scheme, request.headers, client)

    def set_cookie(
        self, request: Request, response: Response, name: str, value: str, seconds: int
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=seconds,
            httponly=True,
            samesite="strict",
            secure=self.https(request),
        )

    def render(
        self,
        request: Request,
        name: str,
        who: Identity,
        now: datetime | None = None,
        **context: Any,
    ) -> HTMLResponse:
        """The page `name`. Its times ("3 min ago", "ran 5 min", due or not) are
        measured from `now`, the database's clock read once for the page (read
        here when the route has not read it), never the console host's clock."""
        # A flash message is shown once, by the next full page (not a live refresh).
        cookie = request.cookies.get(auth.FLASH_COOKIE)
        shown = cookie is not None and not request.headers.get("hx-request")
        page = self.templates.get_template(name).render(
            request=request,
            who=who,
            read_only=self.settings.read_only,
            can_act=who.can_act and not self.settings.read_only,
            csrf=who.csrf,
            flash=auth.read_flash(self.settings.auth, cookie) if shown else "",
            path=request.url.path,
            here=here_of(request),
            auth_configured=self.settings.auth.configured,
            now_utc=now or self.database_now(name),
            **context,
        )
        response = HTMLResponse(page)
        if shown:
            response.delete_cookie(auth.FLASH_COOKIE, httponly=True, samesite="strict")
        return response

    def database_now(self, page: str) -> datetime | None:
        """The database's clock; None for a page that shows no time (the login
        page, which needs no database)."""
        if page in TIMELESS_PAGES:
            return None
        with self.conn() as conn:
            return reads.database_now(conn)

    # -- guards ---------------------------------------------------------------------
    def viewer(self, request: Request) -> Identity:
        try:
            return self.identify(request)
        except auth.Unauthenticated as exc:
            if "text/html" in request.headers.get("accept", ""):
                target = "/login?" + urlencode({"next": here_of(request)})
                raise HTTPException(303, headers={"Location": target}) from exc
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc

    async def actor(
        self, request: Request, fields: Collection[str] = (), repeated: Collection[str] = ()
    ) -> tuple[Identity, FormData]:
        """The identity of a POST allowed to act, and its form; 401/403 otherwise,
        and 400 (`check_form`) for a form other than the `fields` the route reads."""
        try:
            who = await run_in_threadpool(self.identify, request)
        except auth.Unauthenticated as exc:
            raise HTTPException(401, str(exc), headers={"WWW-Authenticate": "Bearer"}) from exc
        if self.settings.read_only:
            raise HTTPException(403, "the console is read-only")
        if not who.can_act:
            raise HTTPException(403, f"{who.name} is a {who.role}: viewers cannot act")
        client = request.client.host if request.client else None
        if not auth.same_origin(self.settings.auth, who, request.headers, client):
            raise HTTPException(403, "the request comes from another site (Origin)")
        kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
        if kind not in FORM_TYPES:
            raise HTTPException(415, f"an action takes a form, not {kind[:80]}")
        check_utf8(kind, await request.body())
        form = FormData(json_fields((await request.form()).multi_items()))
        given = form.get("csrf")
        if not auth.csrf_ok(who, given if isinstance(given, str) else None):
            raise HTTPException(403, "the form's CSRF value is missing or wrong: reload the page")
        check_form(request, form, {*fields, "csrf", "next"}, repeated)
        next_of(form)
        return who, form

    def acted(self, request: Request, form: FormData, done: actions.Done) -> Response:
        if "application/json" in request.headers.get("accept", ""):
            return JSONResponse(dataclasses.asdict(done))
        response = RedirectResponse(next_of(form), status_code=303)
        flash = auth.flash_cookie(self.settings.auth, done.message)
        self.set_cookie(request, response, auth.FLASH_COOKIE, flash, auth.FLASH_SECONDS)
        return response


def check_utf8(kind: str, body: bytes) -> None:
    """`InvalidInput` for a form whose text is not UTF-8: Starlette would read its
    bytes as U+FFFD (or, in a multipart part, as Latin-1), a name nobody gave.
    A multipart body's boundaries and headers are ASCII and a file is refused
    anyway, so that body is UTF-8 exactly when its fields are."""
    if kind == "multipart/form-data":
        texts = [body]
    else:
        texts = [
            unquote_to_bytes(text.replace(b"+", b" "))
            for field in body.split(b"&")
            for text in field.split(b"=", 1)
        ]
    for text in texts:
        try:
            text.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput(f"the form is not UTF-8 text: {text[:40]!r}") from None


def json_fields(items: Iterable[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The fields of a form or query, each `<name>:json` (JSON_SUFFIX) read as
    `<name>` with its JSON string decoded; `InvalidInput` for one that is not a
    JSON string."""
    return [_json_field(name, value) for name, value in items]


def _json_field(name: str, value: Any) -> tuple[str, Any]:
    if not name.endswith(JSON_SUFFIX) or not isinstance(value, str):
        return name, value
    try:
        text = json.loads(value)
    except ValueError:
        text = None
    if not isinstance(text, str):
        raise InvalidInput(f"field {name!r} must hold a JSON string, not {value[:40]!r}")
    return name.removesuffix(JSON_SUFFIX), text


def form_field(form: Mapping[str, Any], name: str) -> str | None:
    """A form field's text, stripped (None when empty); `InvalidInput` for text no
    database column can hold (NUL, a lone surrogate) or too long."""
    value = form.get(name)
    if not isinstance(value, str) or not value.strip():
        return None
    return filters.clean(value.strip(), name)


def name_field(form: Mapping[str, Any], field: str = "type", what: str = "job type") -> str | None:
    """A form field naming a job type or a schedule (None when blank), by the rule
    every door applies to a name (`limits.name`), not the shorter cap of a
    filter's search text. Taken as it is: a name may start or end with a
    space, and one without them names another type or schedule."""
    value = form.get(field)
    if not isinstance(value, str) or not value.strip():
        return None
    return limits.name(value, what)


def next_of(form: Mapping[str, Any]) -> str:
    """Where a browser goes after an action: the form's `next` when it is a path of
    this console, else the overview; `InvalidInput` (before the action acts) when
    it is longer than any page address the console can have served."""
    value = form.get("next")
    if not isinstance(value, str):
        return "/"
    if len(value) > MAX_NEXT:
        raise InvalidInput(f"next is longer than {MAX_NEXT} characters")
    return safe_next(value.strip()) or "/"


def safe_next(target: str | None) -> str | None:
    """Only a path of this console (never another site) is a place to return to."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    if not target.isprintable():
        return None
    return target


def here_of(request: Request) -> str:
    params = request.query_params.multi_items()
    return request.url.path + ("?" + urlencode(params) if params else "")


@jinja2.pass_context
def _ago_on_page(context: jinja2.runtime.Context, value: datetime | None) -> str:
    """`ago` from the page's clock (`now_utc`, the database's)."""
    return ago(value, context["now_utc"])


def ago(value: datetime | None, now: datetime) -> str:
    """A time relative to `now`, as people say it: "3 min ago", "in 2 h", "just now"."""
    if value is None:
        return "-"
    if isinstance(value, RawInstant):
        return str(value)  # PostgreSQL's text: a time datetime cannot hold
    seconds = (now - value).total_seconds()
    size = abs(seconds)
    if size < 10:
        return "just now"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if size >= length:
            amount = f"{size / length:.0f} {unit}"
            break
    return f"{amount} ago" if seconds > 0 else f"in {amount}"


def in_zone(value: datetime | None, zone_name: str) -> str:
    """An instant in a named zone, with the zone's abbreviation: 2030-03-14 02:30 CET."""
    if value is None:
        return "-"
    if isinstance(value, RawInstant):
        return str(value)
    try:
        local = value.astimezone(ZoneInfo(zone_name))
    except (ValueError, KeyError, ZoneInfoNotFoundError, OverflowError):
        local = value.astimezone(UTC)  # OverflowError: the zone's day is past year 1 or 9999
    return f"{local.date().isoformat()} {local:%H:%M:%S %Z}"  # %Y writes year 1 as "1"


def path_segment(name: str) -> str:
    """A name as one segment of a URL path, that the route's `{name:path}` decodes
    back: every `/` percent-encoded (`a/b/../c` is `a%2Fb%2F..%2Fc`, never resolved
    by a client to `a/c`), and the dots of a name that is only dots (`.`, `..`)."""
    quoted = quote(name, safe="")
    return quoted if quoted.strip(".") else quoted.replace(".", "%2E")


def as_json(value: Any, indent: int | None = None) -> str:
    """A JSON value as a person reads it: its own characters (``Müller & Söhne``,
    not ``M\\u00fcller \\u0026 S\\u00f6hne``); the template escapes it for HTML."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=str)


def _instant(value: datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value else "-"


def job_id_of(request: Request) -> int:
    job_id = filters.parse_id(request.path_params["job_id"], "job id")
    if job_id is None:  # blank: a path segment of spaces
        raise InvalidInput("job id is not a whole number: it is blank")
    return job_id


def check_params(
    request: Request, allowed: set[str], params: ImmutableMultiDict[str, str] | None = None
) -> None:
    """A page reads the parameters it names, each once: an unknown one (a typo) or
    one given twice (of which only one would be read) is refused. `params`: the
    query as the page reads it, when that is not the request's as it came."""
    given = request.query_params if params is None else params
    unknown = sorted(set(given) - allowed)
    if unknown and not allowed:
        raise InvalidInput(f"this page takes no parameters, not {unknown[0]!r}")
    if unknown:
        raise InvalidInput(
            f"unknown parameter {unknown[0]!r} (known: {', '.join(sorted(allowed))})"
        )
    counts = Counter(name for name, _ in given.multi_items())
    twice = sorted(name for name, n in counts.items() if n > 1)
    if twice:
        raise InvalidInput(f"parameter {twice[0]!r} is given twice")


def check_form(
    request: Request, form: FormData, allowed: set[str], repeated: Collection[str]
) -> None:
    """An action reads its form and nothing else: a query string, a field it does
    not read (a typo) or one given twice is refused rather than left out, so that
    no mistyped filter widens an action to every job."""
    if request.query_params:
        first = next(iter(request.query_params))
        raise InvalidInput(f"an action takes no query string, not {first!r}: send it in the form")
    counts = Counter(name for name, _ in form.multi_items())
    unknown = sorted(set(counts) - allowed)
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r} (known: {', '.join(sorted(allowed))})")
    files = sorted(name for name, value in form.multi_items() if not isinstance(value, str))
    if files:
        raise InvalidInput(f"field {files[0]!r} must be text, not a file")
    twice = sorted(name for name, n in counts.items() if n > 1 and name not in repeated)
    if twice:
        raise InvalidInput(f"field {twice[0]!r} is given twice")
