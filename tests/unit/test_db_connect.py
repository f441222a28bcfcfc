"""Opening a connection (`rota.db.connect`): an option libpq refuses is
`ConnectionOptionRefused`, bad input said before any server is asked; a server
that is away is `DatabaseUnavailable`, an outage to wait for. No server is
needed: the refusals come first, and the outages have nobody listening."""

from __future__ import annotations

import socket

import psycopg
import pytest

from rota import db
from rota.errors import ConnectionOptionRefused, DatabaseUnavailable, InvalidInput


def _nothing_listening() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"postgresql://rota@127.0.0.1:{s.getsockname()[1]}/rota"


REFUSED = [
    ("sslmode=bogus", "sslmode", 'invalid sslmode value: "bogus"'),
    ("connect_timeout=abc", "connect_timeout", "bad value for connect_timeout: 'abc'"),
    ("target_session_attrs=x", "target_session_attrs", 'invalid target_session_attrs value: "x"'),
    ("port=99999", "port", 'invalid port number: "99999"'),
    ("port=abc", "port", 'invalid integer value "abc" for connection option "port"'),
    ("keepalives=x", "keepalives", 'invalid integer value "x" for connection option "keepalives"'),
    ("hostaddr=zz", None, 'could not parse network address "zz"'),
    ("host=a,b&port=1,2,3", None, "could not match 3 port numbers to 2 hosts"),
    ("nosuch=1", "nosuch", 'invalid URI query parameter: "nosuch"'),
    ("a%zz=1", None, 'invalid percent-encoded token: "a%zz"'),
]
"""A URL's query, the option libpq names in its refusal (if any), and the refusal."""


@pytest.mark.parametrize(("query", "option", "reason"), REFUSED)
def test_an_option_libpq_refuses_is_bad_input(query: str, option: str | None, reason: str) -> None:
    with pytest.raises(ConnectionOptionRefused) as refused:
        db.connect(f"{_nothing_listening()}?{query}")
    assert refused.value.option == option
    assert refused.value.reason.startswith(reason)
    assert isinstance(refused.value, InvalidInput)
    assert isinstance(refused.value.__cause__, psycopg.Error)
    with pytest.raises(ConnectionOptionRefused):  # what every long-running command checks
        db.check_options(f"{_nothing_listening()}?{query}")


@pytest.mark.asyncio
async def test_an_async_connection_refuses_the_same_options() -> None:
    with pytest.raises(ConnectionOptionRefused):
        async with db.aconnection(f"{_nothing_listening()}?sslmode=bogus"):
            pass


@pytest.mark.parametrize(
    "url",
    [_nothing_listening(), "postgresql://rota@host.invalid/rota"],
    ids=["nothing-listening", "not-resolvable"],
)
def test_a_server_that_is_away_is_an_outage(url: str) -> None:
    with pytest.raises(DatabaseUnavailable) as away:
        db.connect(url)
    assert not isinstance(away.value, ConnectionOptionRefused)
    assert isinstance(db.check_options(url), DatabaseUnavailable)


def test_only_libpq_s_own_failure_is_a_refused_option() -> None:
    said = 'invalid sslmode value: "bogus"'
    assert db.refused_option(psycopg.OperationalError(f"connection is bad: {said}")) is not None
    # The same words with a SQLSTATE come from a server: the options were taken.
    assert db.refused_option(psycopg.errors.InvalidParameterValue(said)) is None
    assert db.refused_option(psycopg.OperationalError("connection failed: timeout")) is None
    assert db.refused_option(ValueError(said)) is None


@pytest.mark.parametrize(
    ("dsn", "option", "reason"),
    [
        ("garbage=1", "garbage", 'invalid connection option "garbage"'),
        ("host=h port", None, 'missing "=" after "port" in connection info string'),
        ("host='x", None, "unterminated quoted string in connection info string"),
        ("postgresql://rota@h/rota\x00other", None, "the connection string holds a NUL"),
        ("postgresql://rota@h/\udcff", None, "the connection string is not valid UTF-8"),
    ],
)
def test_a_connection_string_libpq_cannot_read_is_bad_input(
    dsn: str, option: str | None, reason: str
) -> None:
    # A NUL ended the string where libpq read it: the database after it was
    # silently left out.
    with pytest.raises(ConnectionOptionRefused) as refused:
        db.connect(dsn)
    assert refused.value.option == option
    assert refused.value.reason.startswith(reason)
