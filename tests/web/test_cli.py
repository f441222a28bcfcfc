"""`rota web` refuses bad settings with exit code 2, and the front-end file it serves
is the pinned one."""

from __future__ import annotations

import hashlib
from importlib import resources

import pytest

from rota.cli import main

# sha256 of dist/htmx.min.js in the npm package htmx.org@2.0.11 (see mk/web.mk).
HTMX_SHA256 = "d6fdc75f204e6bdefa99b69bf1e6d4ac69b8a364f77929f45c13476b4000f717"


@pytest.mark.parametrize(
    ("args", "reason"),
    [
        (["--port", "0"], "--port must be from 1 to 65535"),
        (["--port", "http"], "--port is not a whole number"),
        (["--proxy-header", "X-Forwarded-User"], "--proxy-header needs --proxy-from"),
        (["--proxy-header", "X-User", "--proxy-from", "10.0.0.300/8"], "--proxy-from"),
    ],
)
def test_bad_settings_exit_2_with_one_line(capsys, args, reason):
    assert main(["web", *args]) == 2
    err = capsys.readouterr().err
    assert reason in err and err.count("\n") == 1


def test_the_served_htmx_is_the_pinned_release():
    data = (resources.files("rota.web") / "static" / "htmx.min.js").read_bytes()
    assert hashlib.sha256(data).hexdigest() == HTMX_SHA256
