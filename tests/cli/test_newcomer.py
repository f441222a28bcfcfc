"""What tripped a new user of `rota`: each says what to do in one line, with
the exit code DESIGN.md section 5 names (2 for bad input, before anything
connects), and `rota --version` tells the version."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

import rota
from rota.cli import main

ROOT = Path(__file__).resolve().parents[2]
NOWHERE = "postgresql://rota@127.0.0.1:9/rota"  # never reached: the input is refused first


def test_version_is_the_packages_and_rota_version_prints_it(capsys) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert rota.__version__ == project["version"] == "0.4.0"
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == "rota 0.4.0"


def test_a_run_at_out_of_range_is_said_as_the_time_given(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    assert main(["enqueue", "t", "--run-at", "9999-12-31T23:59:59-05:00"]) == 2
    err = capsys.readouterr().err
    assert "9999-12-31T23:59:59-05:00 lies outside the years 1970 to 9999" in err
    assert "datetime.datetime" not in err


def test_limit_set_without_a_limit_names_the_commands_flags(capsys, monkeypatch) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", NOWHERE)
    assert main(["limit", "set", "t.x"]) == 2
    err = capsys.readouterr().err
    assert "--concurrency N, --group-concurrency N, or --rate N with --per SECONDS" in err
    assert "group_concurrency" not in err and "rota.clear_limit" not in err
    assert "rota limit clear t.x" in err


@pytest.mark.parametrize("port", ["abc", "70000", "5432x"])
def test_a_url_with_a_port_that_is_no_number_is_bad_input(capsys, monkeypatch, port) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", f"postgresql://rota@db.example:{port}/rota")
    assert main(["status"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rota: error: ROTA_DATABASE_URL has port") and "\n" not in err


def test_the_job_not_found_error_the_docs_name_exists() -> None:
    assert rota.JobNotFound.__module__ == "rota.errors"
    assert "rota.JobNotFound" in (ROOT / "docs" / "integrations.md").read_text()
