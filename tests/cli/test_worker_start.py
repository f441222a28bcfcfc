"""`rota worker` refuses what cannot work before it runs a job: handler modules
that register no handler and two handlers for one type (exit 2), and a database
it cannot use after --startup-wait (exit 1, saying why) instead of waiting for
ever; under --django each log line is printed once."""

from __future__ import annotations

import itertools
import logging
import socket
import sys
import threading
from pathlib import Path

import pytest

from rota.cli import main

_names = itertools.count()


def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """A handlers module of its own name (nothing cached), importable from tmp_path."""
    name = f"handlers_{next(_names)}_{id(tmp_path)}"
    (tmp_path / f"{name}.py").write_text("import rota\n\n" + body)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_a_handlers_module_with_no_handler_is_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", "postgresql://rota@127.0.0.1:9/rota")
    empty = module(tmp_path, monkeypatch, "def send(payload):\n    pass\n")
    assert main(["worker", "--handlers", empty]) == 2
    err = capsys.readouterr().err
    assert f"{empty} register no handler" in err and "@rota.handler" in err


def test_two_handlers_for_one_type_are_refused(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", "postgresql://rota@127.0.0.1:9/rota")
    code = '@rota.handler("mail.dup")\ndef send(payload):\n    pass\n'
    first, second = module(tmp_path, monkeypatch, code), module(tmp_path, monkeypatch, code)
    assert main(["worker", "--handlers", first, second]) == 2
    err = capsys.readouterr().err
    assert f"'mail.dup' has two handlers, {first}.send and {second}.send" in err


def test_an_unreachable_database_ends_the_start_with_exit_1(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("ROTA_DATABASE_URL", "postgresql://rota@127.0.0.1:9/rota")
    served = module(tmp_path, monkeypatch, '@rota.handler("mail.far")\ndef send(p):\n    pass\n')
    assert main(["worker", "--handlers", served, "--startup-wait", "1"]) == 1
    err = capsys.readouterr().err
    assert "gave up after 1s waiting for the database (--startup-wait)" in err
    # libpq's reason has a line of its own ("\tIs the server running ..."): each
    # log line and the exit's reason stay one line.
    assert not [line for line in err.splitlines() if line[:1].isspace()]


def test_an_unmigrated_database_ends_the_start_with_exit_1(
    tmp_path, monkeypatch, capsys, empty_db_url
):
    monkeypatch.setenv("ROTA_DATABASE_URL", empty_db_url)
    served = module(tmp_path, monkeypatch, '@rota.handler("mail.new")\ndef send(p):\n    pass\n')
    assert main(["worker", "--handlers", served, "--startup-wait", "0"]) == 1
    assert "run `rota migrate`" in capsys.readouterr().err


def test_djangos_console_handler_leaves_the_lines_to_the_root(capsys) -> None:
    """As Django's DEFAULT_LOGGING sets it up with DEBUG on: a console handler on
    the `django` logger, whose records propagate to the root's handler too."""
    from rota_worker import cli

    django_logger = logging.getLogger("django")
    root = logging.getLogger()
    saved = django_logger.handlers[:], root.handlers[:]
    try:
        root.handlers[:] = [logging.StreamHandler(sys.stderr)]
        django_logger.handlers[:] = [logging.StreamHandler(sys.stderr), logging.NullHandler()]
        django_logger.setLevel(logging.INFO)
        cli._one_line_per_log_record()
        logging.getLogger("django.tasks").info("Task t enqueued")
        assert capsys.readouterr().err.count("Task t enqueued") == 1
        assert [type(h) for h in django_logger.handlers] == [logging.NullHandler]
    finally:
        django_logger.handlers[:], root.handlers[:] = saved


@pytest.mark.parametrize("types", ["", ",", " , "])
def test_a_blank_list_of_types_is_refused(tmp_path, monkeypatch, capsys, types) -> None:
    # "" claimed every handled type, "," started a worker that claimed none.
    monkeypatch.setenv("ROTA_DATABASE_URL", "postgresql://rota@127.0.0.1:9/rota")
    served = module(tmp_path, monkeypatch, '@rota.handler("mail.any")\ndef send(p):\n    pass\n')
    assert main(["worker", "--handlers", served, "--types", types]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--types" in line and "names no job type" in line


def test_a_metrics_port_in_use_ends_the_start_with_one_line(
    tmp_path, monkeypatch, capsys, db_url
) -> None:
    monkeypatch.setenv("ROTA_DATABASE_URL", db_url)
    served = module(tmp_path, monkeypatch, '@rota.handler("mail.port")\ndef send(p):\n    pass\n')
    before = set(threading.enumerate())
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["worker", "--handlers", served, "--metrics-port", str(port), "--no-scheduler"]
        assert main([*args, "--no-reaper"]) == 1
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rota:")]
    assert lines == [
        f"rota: the worker's probes could not listen on 0.0.0.0:{port}: choose another"
        " metrics port (Address already in use)"
    ]
    # Nothing it started runs on (the listener retried its connection for ever).
    assert not [t for t in set(threading.enumerate()) - before if t.name.startswith("rota-")]


@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "1e400"])
def test_the_demo_refuses_a_length_it_cannot_keep(capsys, seconds) -> None:
    assert main(["demo", "--seconds", seconds]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--seconds" in line
