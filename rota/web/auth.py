"""Who is asking, and may they act: tokens, sessions, proxy headers, CSRF values.

Three ways in, checked in this order:
- ``Authorization: Bearer <ROTA_WEB_TOKEN>``: an operator (scripts, curl). No
  CSRF value is needed: a browser never sends this header by itself.
- a signed session cookie, given once by ``POST /login`` for the same token:
  an operator; its POSTs carry the session's CSRF value.
- a trusted header set by an auth proxy (oauth2-proxy style), honoured only
  from the configured proxy addresses: an operator when the user or one of
  their groups is listed as an operator, else a viewer; POSTs carry a CSRF
  value bound to the user.
With no token and no proxy configured, anybody may look and nobody may act.
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
    """Proxy users or groups that may act; other proxy users only look."""

    def __post_init__(self) -> None:
        if not self.secret:
            seed = (
                hashlib.sha256(b"rota-web-session|" + self.token.encode()).digest()
                if self.token
                else secrets.token_bytes(32)
            )
            object.__setattr__(self, "secret", seed)
        for address in self.proxy_addresses:
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

    @property
    def can_act(self) -> bool:
        return self.role == OPERATOR


ANONYMOUS = Identity("anonymous", VIEWER, "open")


class Unauthenticated(Exception):
    """No valid credentials."""


def _sign(secret: bytes, data: bytes) -> str:
    return base64.urlsafe_b64encode(hmac.new(secret, data, hashlib.sha256).digest()).decode()


def csrf_value(settings: AuthSettings, subject: str) -> str:
    return _sign(settings.secret, b"csrf|" + subject.encode())


def session_cookie(settings: AuthSettings, name: str, role: str, now: float | None = None) -> str:
    """A signed cookie value: who, what role, until when, and a nonce for CSRF."""
    body = {
        "u": name,
        "r": role,
        "exp": int((now or time.time()) + SESSION_SECONDS),
        "n": secrets.token_urlsafe(12),
    }
    data = base64.urlsafe_b64encode(json.dumps(body, separators=(",", ":")).encode())
    return f"{data.decode()}.{_sign(settings.secret, data)}"


def read_session(settings: AuthSettings, value: str, now: float | None = None) -> Identity | None:
    data, _, signature = value.partition(".")
    if not hmac.compare_digest(_sign(settings.secret, data.encode()), signature):
        return None
    try:
        body: dict[str, Any] = json.loads(base64.urlsafe_b64decode(data.encode()))
    except ValueError:
        return None
    if int(body.get("exp", 0)) < (now or time.time()):
        return None
    role = OPERATOR if body.get("r") == OPERATOR else VIEWER
    name = str(body.get("u", "?"))
    return Identity(name, role, "session", csrf_value(settings, "session|" + str(body.get("n"))))


def token_matches(settings: AuthSettings, given: str) -> bool:
    return bool(settings.token) and hmac.compare_digest(
        given.encode(), (settings.token or "").encode()
    )


def _from_proxy(settings: AuthSettings, client: str | None) -> bool:
    if not client or not settings.proxy_addresses:
        return False
    try:
        address = ipaddress.ip_address(client)
    except ValueError:
        return False
    return any(
        address in ipaddress.ip_network(net, strict=False) for net in settings.proxy_addresses
    )


def identify(
    settings: AuthSettings,
    headers: Mapping[str, str],
    cookies: Mapping[str, str],
    client: str | None,
) -> Identity:
    """The identity of a request; `Unauthenticated` when it brings none that is valid
    and the console requires one."""
    authorization = headers.get("authorization", "")
    if authorization:
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() == "bearer" and token_matches(settings, given.strip()):
            return Identity("token", OPERATOR, "token")
        raise Unauthenticated("the Authorization header does not carry the console's token")
    if settings.proxy_header and _from_proxy(settings, client):
        user = headers.get(settings.proxy_header.lower(), "").strip()
        if user:
            groups = set()
            if settings.proxy_groups_header:
                raw = headers.get(settings.proxy_groups_header.lower(), "")
                groups = {g.strip() for g in raw.split(",") if g.strip()}
            role = OPERATOR if ({user} | groups) & settings.operators else VIEWER
            return Identity(user, role, "proxy", csrf_value(settings, "proxy|" + user))
    cookie = cookies.get(SESSION_COOKIE)
    if cookie:
        found = read_session(settings, cookie)
        if found is not None:
            return found
    if settings.configured:
        raise Unauthenticated("log in with the console's token")
    return ANONYMOUS


def csrf_ok(identity: Identity, given: str | None) -> bool:
    """A POST's CSRF value is right (or none is needed: bearer tokens)."""
    if identity.via == "token":
        return True
    return bool(identity.csrf) and hmac.compare_digest(identity.csrf, given or "")
