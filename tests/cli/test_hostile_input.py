"""Hostile values for `rota`: numbers past what Python reads, text that is not
UTF-8 in the environment, blank names where a server option needs one, ports
already taken. Each is one line on stderr with the exit code DESIGN.md section
5 names (2 for bad input, before anything connects or serves; 1 for a runtime
error), never "unexpected" and never a traceback."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from rota.cli import main

NOWHERE = "postgresql://rota@127.0.0.1:9/rota"  # never reached: the input is refused first
HUGE_NUMBER = '{"n": 1' + "0" * 5000 + "}"
"""JSON with an integer of 5,001 digits: past the 4,300 Python converts from text."""
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \S+ (DEBUG|INFO|WARNING) ")


def said(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `rota` printed on stderr as it failed (log records aside)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not LOG_LINE.match(line)]
    assert len(lines) == 1, err
    assert "Traceback" not in err and "unexpected" not in err, err
    return lines[0]


def refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """The one line `rota argv` prints as it exits 2."""
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    code = main(list(argv))
    line = said(capsys)
    assert code == 2, (argv, line)
    assert line.startswith("rota: error: "), line
    return line


@pytest.fixture
def never_served(monkeypatch: pytest.MonkeyPatch) -> None:
    """`rota web` fails the test instead of serving (a refused value must stop it first)."""

    def serve(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the console was served")

    monkeypatch.setattr("uvicorn.run", serve)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port something else listens on, on every interface."""
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "t", "--payload", HUGE_NUMBER],
        ["schedule", "add", "s", "--type", "t", "--cron", "@daily", "--payload", HUGE_NUMBER],
    ],
)
def test_a_payload_number_too_long_for_python_is_bad_input(capsys, monkeypatch, argv) -> None:
    line = refused(capsys, monkeypatch, *argv)
    assert "--payload" in line and "digits" in line, line


@pytest.mark.parametrize(
    ("number", "why"),
    [
        ("1e400", "too large"),
        ("-1e400", "too large"),
        ("1e-400", "exactly"),
        ("123456789012345678901234567890.5", "exactly"),
        ("0.1000000000000000000001", "exactly"),
    ],
)
@pytest.mark.parametrize("command", [["enqueue", "t"], ["schedule", "add", "s", "--type", "t",
                                                       "--cron", "@daily"]])  # fmt: skip
def test_a_payload_number_a_double_would_change_is_bad_input(
    capsys, monkeypatch, command, number, why
) -> None:
    # Python reads a JSON number with a point or an exponent as a double: one it
    # cannot hold as written would be stored rounded (or refused as not JSON).
    line = refused(capsys, monkeypatch, *command, "--payload", f'{{"n": {number}}}')
    assert "--payload" in line and number in line and why in line, line


def test_payload_numbers_a_double_holds_are_taken_as_written(capsys, monkeypatch) -> None:
    from rota.cli.common import parse_json

    text = '{"a": 0.1, "b": 0.10, "c": 1e300, "d": -2.5e-300, "e": 12345678901234567890123}'
    assert parse_json(text) == {"a": 0.1, "b": 0.1, "c": 1e300, "d": -2.5e-300,
                                "e": 12345678901234567890123}  # fmt: skip


def test_a_watch_interval_past_ten_years_is_said_with_the_option(capsys, monkeypatch) -> None:
    for value in ["315360001", "9223372036854775808", "1e9w"]:
        line = refused(capsys, monkeypatch, "status", "--watch", value)
        assert "--watch must be at most 315360000 seconds" in line, line
        assert "_interval" not in line, line


def test_the_exporter_cache_must_be_a_finite_span(capsys, monkeypatch) -> None:
    monkeypatch.setattr("rota.cli.exporter.serve_pages", None)  # a refusal comes first
    line = refused(capsys, monkeypatch, "exporter", "--cache", "1e400")
    assert "--cache must be at most 315360000 seconds" in line, line


@pytest.mark.parametrize(
    "argv",
    [
        ["exporter", "--host", "127.0.0.1", "--port"],
        ["reaper", "--health-port"],
        ["scheduler", "--health-port"],
    ],
)
def test_a_port_in_use_is_a_runtime_error_in_one_line(capsys, monkeypatch, taken_port, argv):
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    assert main([*argv, str(taken_port)]) == 1
    line = said(capsys)
    assert "could not listen on" in line and f":{taken_port}" in line, line
    assert "choose another" in line, line


@pytest.mark.parametrize("url", [NOWHERE + "\udcff", "\udcff"])
def test_a_database_url_that_is_not_utf_8_is_bad_input(capsys, monkeypatch, url) -> None:
    # What a byte that is not UTF-8 in the environment becomes in Python.
    monkeypatch.setenv("ROTA_DATABASE_URL", url)
    assert main(["jobs", "list"]) == 2
    assert said(capsys).startswith("rota: error: ROTA_DATABASE_URL is not valid UTF-8")


@pytest.mark.parametrize("value", ["xml", "JSON", "json-lines"])
def test_a_log_format_variable_that_names_no_format_is_bad_input(
    capsys, monkeypatch, value
) -> None:
    monkeypatch.setenv("ROTA_LOG_FORMAT", value)
    line = refused(capsys, monkeypatch, "jobs", "list")
    assert "ROTA_LOG_FORMAT" in line and "text or json" in line, line


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("ROTA_WEB_SECRET", "s\udcff"),
        ("ROTA_WEB_TOKEN", "t\udcff"),
        ("ROTA_WEB_TOKEN", "   "),
    ],
)
def test_a_console_variable_that_cannot_be_used_is_named(
    capsys, monkeypatch, never_served, variable, value
) -> None:
    monkeypatch.setenv(variable, value)
    line = refused(capsys, monkeypatch, "web")
    assert line.startswith(f"rota: error: {variable} "), line
    assert "--proxy-from" not in line, line


PROXY = ["--proxy-header", "X-User", "--proxy-from", "127.0.0.1"]


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--host", ""], "--host"),
        (["--host", " "], "--host"),
        (["--proxy-header", "", "--proxy-from", "127.0.0.1"], "--proxy-header"),
        (["--proxy-header", "X User", "--proxy-from", "127.0.0.1"], "--proxy-header"),
        (
            [*PROXY, "--proxy-groups-header", "X:G", "--operator-group", "ops"],
            "--proxy-groups-header",
        ),
        ([*PROXY, "--operator", ""], "--operator"),
        ([*PROXY, "--proxy-groups-header", "X-G", "--operator-group", " "], "--operator-group"),
    ],
)
def test_the_console_refuses_blank_addresses_headers_and_names(
    capsys, monkeypatch, never_served, argv, option
) -> None:
    line = refused(capsys, monkeypatch, "web", *argv)
    assert f"argument {option}:" in line, line


def test_the_exporter_refuses_a_blank_address(capsys, monkeypatch) -> None:
    monkeypatch.setattr("rota.cli.exporter.serve_pages", None)  # a refusal comes first
    line = refused(capsys, monkeypatch, "exporter", "--host", " ")
    assert "argument --host:" in line, line


def test_a_console_address_that_cannot_be_listened_on_is_one_line(
    capsys, monkeypatch, taken_port
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    assert main(["web", "--host", "127.0.0.1", "--port", str(taken_port)]) == 1
    line = said(capsys)
    assert f"could not listen on 127.0.0.1:{taken_port}" in line, line
    assert "choose another --port" in line, line
