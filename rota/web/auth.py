"""Who is asking, and may they act: tokens, sessions, proxy headers, CSRF values.

Three ways in, checked in this order:
- ``Authorization: Bearer <ROTA_WEB_TOKEN>``: an operator (scripts, curl). No
  CSRF value is needed: a browser never sends this header by itself.
- a signed session cookie, given once by ``POST /login`` for the same token:
  an operator; its POSTs carry the session's CSRF value.
- a trusted header set by an auth proxy (oauth2-proxy style), honoured only
  from the configured proxy addresses: an operator when the user is listed as
  an operator user, or one of their groups as an operator group (a user named
  like a group is not that group), else a viewer; POSTs carry a CSRF value
  bound to the user.
With no token and no proxy configured, anybody may look and nobody may act.
A session cookie is signed and names a server-side session row (migration
0011), so logging out ends it everywhere; `rota.web.console` checks the row.
Flash messages travel in a signed one-shot cookie, never in the URL.
Pure functions of the settings and the request's parts: no database.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import ipaddress
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

VIEWER = "viewer"
OPERATOR = "operator"
SESSION_COOKIE = "rota_session"
SESSION_SECONDS = 12 * 3600


@dataclasses.dataclass(frozen=True)
class AuthSettings:
    token: str | None = None
    """ROTA_WEB_TOKEN: the bearer token of operators (None: no token login)."""
    secret: bytes = b""
    """Key that signs session cookies and CSRF values; derived from the token
    when not given (so every replica with the same token accepts the same cookie),
    random per process when there is no token either."""
    proxy_header: str | None = None
    """Header an auth proxy sets to the user's name (e.g. X-Forwarded-User)."""
    proxy_groups_header: str | None = None
    """Header with the user's groups, comma-separated (e.g. X-Forwarded-Groups)."""
    proxy_addresses: tuple[str, ...] = ()
    """Addresses or networks (CIDR) the proxy connects from; the header is ignored
    from anywhere else."""
    operators: frozenset[str] = frozenset()
    """Proxy users that may act (by user name only, never by group)."""
    operator_groups: frozenset[str] = frozenset()
    """Proxy groups whose members may act (by group only, never by user name)."""
    forwarded_addresses: tuple[str, ...] = ()
    """Addresses or networks (CIDR) of a TLS-terminating proxy whose
    X-Forwarded-Proto is trusted (the proxy_addresses are trusted too): a
    request it forwarded over https gets Secure cookies."""

    def __post_init__(self) -> None:
        if not self.secret:
            seed = (
                hashlib.sha256(b"rota-web-session|" + self.token.encode()).digest()
                if self.token
                else secrets.token_bytes(32)
            )
            object.__setattr__(self, "secret", seed)
        for address in (*self.proxy_addresses, *self.forwarded_addresses):
            ipaddress.ip_network(address, strict=False)  # ValueError for a typo

    @property
    def configured(self) -> bool:
        return bool(self.token or self.proxy_header)


@dataclasses.dataclass(frozen=True)
class Identity:
    name: str
    role: str
    via: str
    """token, session, proxy or open."""
    csrf: str = ""
    """The CSRF value this identity's forms carry ("" when none is needed)."""
    session: str = ""
    """The server-side session row a session cookie names (via == "session")."""

    @property
    def can_act(self) -> bool:
        return self.role == OPERATOR


ANONYMOUS = Identity("anonymous", VIEWER, "open")


class Unauthenticated(Exception):
    """No valid credentials."""


MAX_NAME = 200
"""Longest proxy user or group name accepted."""
FLASH_COOKIE = "rota_flash"
FLASH_SECONDS = 120
MAX_FLASH = 300


def _sign(secret: bytes, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(secret, data, hashlib.sha256).digest()).decode()


def _signed(secret: bytes, purpose: str, body: dict[str, Any]) -> str:
    # UTF-8, not JSON's \u escapes (12 characters an emoji): a flash message of
    # MAX_FLASH characters in any script keeps the cookie under the 4,096
    # bytes a browser keeps. A lone surrogate stays an escape.
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    data = base64.urlsafe_b64encode(text.encode(errors="backslashreplace"))
    signature = _sign(secret, purpose.encode() + b"|" + data)
    return f"{data.decode()}.{signature}"


def _unsigned(secret: bytes, purpose: str, value: str) -> dict[str, Any] | None:
    """The body of a value `_signed` made for this purpose; None for anything else
    (a forged, truncated, non-ASCII or otherwise malformed value)."""
    if not value.isascii():
        return None
    data, _, signature = value.partition(".")
    expected = _sign(secret, purpose.encode() + b"|" + data.encode())
    if not hmac.compare_digest(expected.encode(), signature.encode()):
        return None
    try:
        body = json.loads(base64.urlsafe_b64decode(data.encode()))
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def session_id(nonce: str) -> str:
    """The key of a session's server-side row: a hash of the cookie's nonce."""
    return hashlib.sha256(b"rota-web-session|" + nonce.encode()).hexdigest()


def csrf_value(settings: AuthSettings, subject: str) -> str:
    return _sign(settings.secret, b"csrf|" + subject.encode())


@dataclasses.dataclass(frozen=True)
class NewSession:
    cookie: str
    """The signed cookie value: who, what role, until when, and a nonce for CSRF."""
    id: str
    """The id of the server-side row that keeps the session alive."""
    expires: int
    """Unix time the session ends at."""


def new_session(
    settings: AuthSettings, name: str, role: str, now: float | None = None
) -> NewSession:
    nonce = secrets.token_urlsafe(18)
    expires = int((now or time.time()) + SESSION_SECONDS)
    body = {"u": name, "r": role, "exp": expires, "n": nonce, "t": token_mark(settings)}
    return NewSession(_signed(settings.secret, "session", body), session_id(nonce), expires)


def token_mark(settings: AuthSettings) -> str:
    """A mark of the console's token that a session cookie carries, so a cookie made
    before the token changed is refused even when ROTA_WEB_SECRET (which signs the
    cookies) stays the same. Not the token: a keyed hash of it."""
    if not settings.token:
        return ""
    return _sign(settings.secret, b"token|" + settings.token.encode())[:22]


def same_origin(
    settings: AuthSettings, identity: Identity, headers: Mapping[str, str], client: str | None
) -> bool:
    """A POST comes from the console's own pages: its Origin (or, without one, its
    Referer) names the host the request was sent to. A bearer token needs no check
    (a browser never sends that header by itself); a request that names no origin
    at all (not a browser) is judged by its CSRF value alone. The host compared is
    the Host header, or X-Forwarded-Host from a trusted proxy."""
    if identity.via == "token":
        return True
    given = headers.get("origin") or headers.get("referer")
    if given is None:
        return True
    source = urlsplit(given)
    if given == "null" or not source.netloc:
        return False
    hosts = {headers.get("host", "").lower()}
    trusted = (*settings.proxy_addresses, *settings.forwarded_addresses)
    if _from(trusted, client):
        hosts.add(headers.get("x-forwarded-host", "").split(",")[0].strip().lower())
    return source.netloc.lower() in hosts - {""}


def read_session(settings: AuthSettings, value: str, now: float | None = None) -> Identity | None:
    """The identity a session cookie claims (its row still to be checked), or None."""
    body = _unsigned(settings.secret, "session", value)
    if body is None or not isinstance(body.get("exp"), int) or not isinstance(body.get("n"), str):
        return None
    if body["exp"] < (now or time.time()):
        return None
    if not hmac.compare_digest(str(body.get("t", "")), token_mark(settings)):
        return None  # made with another token: rotating the token ends every session
    role = OPERATOR if body.get("r") == OPERATOR else VIEWER
    name = str(body.get("u", "?"))
    nonce = body["n"]
    csrf = csrf_value(settings, "session|" + nonce)
    return Identity(name, role, "session", csrf, session_id(nonce))


def flash_cookie(settings: AuthSettings, message: str) -> str:
    """A signed one-shot cookie value carrying a message for the next page."""
    body = {"m": message[:MAX_FLASH], "exp": int(time.time() + FLASH_SECONDS)}
    return _signed(settings.secret, "flash", body)


def read_flash(settings: AuthSettings, value: str | None) -> str:
    """The message of a flash cookie this console signed, else ""."""
    body = _unsigned(settings.secret, "flash", value or "")
    if body is None or not isinstance(body.get("exp"), int) or body["exp"] < time.time():
        return ""
    message = body.get("m")
    return message if isinstance(message, str) else ""


def token_matches(settings: AuthSettings, given: str) -> bool:
    return bool(settings.token) and hmac.compare_digest(
        given.encode(errors="replace"), (settings.token or "").encode()
    )


def _from(networks: tuple[str, ...], client: str | None) -> bool:
    if not client or not networks:
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(address in ipaddress.ip_network(net, strict=False) for net in networks)


def is_https(
    settings: AuthSettings, scheme: str, headers: Mapping[str, str], client: str | None
) -> bool:
    """The browser reached the console over https: directly, or through a trusted
    TLS-terminating proxy that says so in X-Forwarded-Proto."""
    if scheme == "https":
        return True
    trusted = (*settings.proxy_addresses, *settings.forwarded_addresses)
    proto = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    return proto == "https" and _from(trusted, client)


def _plain_name(value: str) -> bool:
    return 0 < len(value) <= MAX_NAME and value.isprintable()


def identify(
    settings: AuthSettings,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
    client: str | None,
) -> Identity:
    """The identity of a request; `Unauthenticated` when it brings none that is valid
    and the console requires one.

    A request from the proxy naming its user is that user whatever Authorization
    it also carries: proxies add their own (oauth2-proxy's --pass-basic-auth is on
    by default), and the token is for requests that do not come through it."""
    proxied = _proxy_identity(settings, headers, client)
    if proxied is not None:
        return proxied
    authorization = headers.get("authorization", "")
    if authorization:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and token_matches(settings, given.strip()):
            return Identity("token", OPERATOR, "token")
        raise Unauthenticated("the Authorization header does not carry the console's token")
    cookie = cookies.get(SESSION_COOKIE)
    if cookie:
        found = read_session(settings, cookie)
        if found is not None:
            return found
    if settings.configured:
        raise Unauthenticated("log in with the console's token")
    return ANONYMOUS


def _proxy_identity(
    settings: AuthSettings, headers: Mapping[str, str], client: str | None
) -> Identity | None:
    """The proxy's user, when the request comes from a trusted proxy address and
    carries its user header; None otherwise."""
    if not settings.proxy_header or not _from(settings.proxy_addresses, client):
        return None
    user = headers.get(settings.proxy_header.lower(), "").strip()
    if not user:
        return None
    if not _plain_name(user):
        raise Unauthenticated("the proxy's user header is not a plain name")
    groups = set()
    if settings.proxy_groups_header:
        raw = headers.get(settings.proxy_groups_header.lower(), "")
        groups = {g.strip() for g in raw.split(",") if _plain_name(g.strip())}
    acts = user in settings.operators or bool(groups & settings.operator_groups)
    role = OPERATOR if acts else VIEWER
    return Identity(user, role, "proxy", csrf_value(settings, "proxy|" + user))


def csrf_ok(identity: Identity, given: str | None) -> bool:
    """A POST's CSRF value is right (or none is needed: bearer tokens)."""
    if identity.via == "token":
        return True
    return bool(identity.csrf) and hmac.compare_digest(
        identity.csrf.encode(), (given or "").encode(errors="replace")
    )
