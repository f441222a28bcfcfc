"""How `rota` reads numbers, durations, names and its environment: a value it
cannot take for sure is exit 2 with a one-line reason, before anything
connects (DESIGN.md section 5); none is guessed at."""

from __future__ import annotations

import pytest

from rota.cli import main
from rota.cli.common import UsageError, parse_duration

NOWHERE = "postgresql://rota@127.0.0.1:9/rota"  # never reached: the input is refused first


def refused(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *argv: str) -> str:
    """The one line `rota argv` prints as it exits 2."""
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    code = main(list(argv))
    err = capsys.readouterr().err.strip()
    assert code == 2, (argv, err)
    assert err.startswith("rota: error: ") and "\n" not in err, err
    return err


def test_duration_units_are_read_in_their_case() -> None:
    assert parse_duration("90", "--x") == 90
    assert parse_duration("15m", "--x") == 900
    assert parse_duration("1.5h", "--x") == 5400
    assert parse_duration("2w", "--x") == 2 * 7 * 86400
    for text in ["1M", "7D", "1mo", "3y", "5 ms"]:
        with pytest.raises(UsageError, match="unit") as refusal:
            parse_duration(text, "--older-than")
        assert "s, m (minutes), h, d and w, in lower case" in str(refusal.value)


@pytest.mark.parametrize(
    "option", ["--older-than", "--failed-older-than", "--delete-archived-older-than"]
)
def test_archive_refuses_a_month_written_as_capital_m(capsys, monkeypatch, option) -> None:
    err = refused(capsys, monkeypatch, "archive", option, "1M")
    assert f"{option} has an unknown unit 'M'" in err and "m (minutes)" in err


def test_a_bad_max_payload_variable_breaks_only_enqueue(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROTA_MAX_PAYLOAD_BYTES", "abc")
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    capsys.readouterr()
    for value in ["abc", "1e5", "0"]:
        monkeypatch.setenv("ROTA_MAX_PAYLOAD_BYTES", value)
        assert "ROTA_MAX_PAYLOAD_BYTES" in refused(capsys, monkeypatch, "enqueue", "t")


@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "t", "--run-at", ""],
        ["schedule", "preview", "--cron", "* * * * *", "--from", ""],
    ],
)
def test_an_empty_instant_is_no_instant(capsys, monkeypatch, argv) -> None:
    assert "ISO-8601" in refused(capsys, monkeypatch, *argv)


@pytest.mark.parametrize("number", ["\u0663", "1_0", "+10", " 3", "3\u00a0"])
@pytest.mark.parametrize(
    "argv",
    [
        ["jobs", "show"],
        ["jobs", "cancel"],
        ["dead", "retry"],
        ["jobs", "list", "--limit"],
        ["enqueue", "t", "--priority"],
        ["schedule", "preview", "--cron", "* * * * *", "--count"],
        ["status", "--max-lease-expirations"],
    ],
)
def test_whole_numbers_are_ascii_digits_only(capsys, monkeypatch, argv, number) -> None:
    err = refused(capsys, monkeypatch, *argv, number)
    assert "not a job id" in err or "not a whole number" in err, err


@pytest.mark.parametrize("number", ["\u0663", "1_0", " 3", "\uff13", "nan"])
@pytest.mark.parametrize(
    "argv",
    [
        ["enqueue", "t", "--delay"],
        ["enqueue", "t", "--timeout"],
        ["enqueue", "t", "--key", "k", "--unique-for"],
        ["limit", "set", "t", "--rate", "1", "--per"],
        ["schedule", "add", "s", "--type", "t", "--cron", "* * * * *", "--timeout"],
    ],
)
def test_numbers_of_seconds_are_ascii_digits_only(capsys, monkeypatch, argv, number) -> None:
    # float() takes them all: another script's digits, `_` between digits, spaces.
    refused(capsys, monkeypatch, *argv, number)


def test_a_duration_s_number_is_ascii_digits_only(capsys, monkeypatch) -> None:
    assert "not a duration" in refused(capsys, monkeypatch, "archive", "--older-than", "1_0d")
    assert "not a duration" in refused(capsys, monkeypatch, "archive", "--older-than", "\u0663d")


@pytest.mark.parametrize(
    "argv",
    [
        ["archive", "--older-than", "nan"],
        ["archive", "--older-than", "inf"],
        ["archive", "--older-than=-inf"],
        ["archive", "--failed-older-than", "1e400"],
        ["status", "--max-age", "nan"],
        ["status", "--watch", "nan"],
    ],
)
def test_a_duration_that_is_no_number_says_so(capsys, monkeypatch, argv) -> None:
    err = refused(capsys, monkeypatch, *argv)
    assert "must be a number" in err and "negative" not in err


def test_a_negative_duration_is_still_said_to_be_negative(capsys, monkeypatch) -> None:
    assert "must not be negative" in refused(capsys, monkeypatch, "archive", "--older-than=-1d")


def test_status_refuses_a_negative_lease_expiration_threshold(capsys, monkeypatch) -> None:
    err = refused(capsys, monkeypatch, "status", "--max-lease-expirations=-1")
    assert "must not be negative" in err


def test_pause_of_the_star_names_the_all_flag(capsys, monkeypatch) -> None:
    for verb in ["pause", "resume"]:
        err = refused(capsys, monkeypatch, verb, "*")
        assert "say --all" in err and "say all" not in err


def test_cancel_of_an_empty_type_says_the_type_is_empty(capsys, monkeypatch) -> None:
    for empty in ["", " "]:
        err = refused(capsys, monkeypatch, "jobs", "cancel", "--type", empty)
        assert "--type must be a non-empty job type" in err and "give job ids" not in err


@pytest.mark.parametrize(
    "query", ["sslmode=bogus", "target_session_attrs=zz", "connect_timeout=abc", "keepalives=x"]
)
def test_a_url_option_libpq_refuses_is_bad_input(capsys, monkeypatch, query) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", f"postgresql://rota@127.0.0.1:9/rota?{query}")
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rota: error: ROTA_DATABASE_URL") and "\n" not in err, err
    assert query.split("=")[0] in err


@pytest.mark.parametrize(
    ("url", "variable", "value", "said"),
    [
        (NOWHERE, "PGSSLMODE", "verify-fulll", 'invalid sslmode value: "verify-fulll"'),
        ("postgresql://rota@127.0.0.1/rota", "PGPORT", "99999", 'invalid port number: "99999"'),
        (None, "PGTARGETSESSIONATTRS", "x", 'invalid target_session_attrs value: "x"'),
    ],
    ids=["beside-the-url", "the-url-gives-no-port", "no-url"],
)
def test_a_pg_variable_libpq_refuses_is_named(
    capsys, monkeypatch, url, variable, value, said
) -> None:
    # The Helm chart sets PGSSLMODE beside ROTA_DATABASE_URL: the variable is at fault.
    if url is None:
        monkeypatch.delenv("ROTA_DATABASE_URL", raising=False)
        monkeypatch.setenv("PGHOST", "127.0.0.1")
        monkeypatch.setenv("PGPORT", "9")
    else:
        monkeypatch.setenv("ROTA_DATABASE_URL", url)
    monkeypatch.setenv(variable, value)
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rota: error: {variable} has a connection option libpq refuses: {said}"


def test_the_url_is_named_when_it_gives_the_option_a_variable_gives_too(
    capsys, monkeypatch
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", f"{NOWHERE}?sslmode=bogus")
    monkeypatch.setenv("PGSSLMODE", "require")
    assert main(["jobs", "list"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rota: error: ROTA_DATABASE_URL has a connection option libpq refuses")


def test_an_unreachable_server_stays_a_runtime_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", "postgresql://rota@127.0.0.1:9/rota?sslmode=disable")
    assert main(["jobs", "list"]) == 1
    assert "cannot reach the database" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--unique-for", "3600"], ["--unique-active"]])
def test_enqueue_refuses_a_key_of_a_schedule_s_jobs(capsys, monkeypatch, extra) -> None:
    # A job under a slot's key, enqueued ahead, would take the slot from its schedule.
    err = refused(capsys, monkeypatch, "enqueue", "t", "--key", "schedule:1", *extra)
    assert "must not start with 'schedule:'" in err
