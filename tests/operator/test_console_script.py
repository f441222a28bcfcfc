"""`rota-operator`, the console script, runs the same operator and stops on SIGTERM;
a connection option libpq refuses stops it at start, a database away does not."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
from typing import Any

import pytest
from kube_client import Api, wait_for
from psycopg.conninfo import make_conninfo

from rota import schedule_store as schedules

SCRIPT = pathlib.Path(sys.executable).parent / "rota-operator"


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            {"ROTA_STANDALONE": "true", "ROTA_NAMESPACES": "default"}, id="standalone-namespaced"
        ),
        pytest.param({"ROTA_STANDALONE": "false", "ROTA_NAMESPACES": ""}, id="peering-clusterwide"),
    ],
)
def test_runs_until_sigterm(
    kube_api: Api, db_url: str, tmp_path: pathlib.Path, mode: dict[str, str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube_api.kubeconfig())
    peering = {
        "apiVersion": "kopf.dev/v1",
        "kind": "ClusterKopfPeering",
        "metadata": {"name": "rota-operator"},
    }
    kube_api.create("/apis/kopf.dev/v1/clusterkopfpeerings", peering)
    env: dict[str, Any] = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "ROTA_DATABASE_URL": db_url,
        "ROTA_METRICS_PORT": "0",
        **mode,
    }
    log = (tmp_path / "operator.log").open("w+")
    process = subprocess.Popen([str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        schedule = {
            "apiVersion": "rota.dev/v1",
            "kind": "JobSchedule",
            "metadata": {"name": "scripted"},
            "spec": {"jobType": "t", "schedule": "@daily"},
        }
        kube_api.create("/apis/rota.dev/v1/namespaces/default/jobschedules", schedule)
        wait_for(lambda: schedules.get(db_url, "default/scripted"), timeout=30, what="the row")
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    log.seek(0)
    assert code == 0, log.read()


def test_a_connection_option_libpq_refuses_stops_it_at_start(db_url: str) -> None:
    # No retry mends the option: one line and exit 2 before kopf starts, as
    # every long-running `rota` command does.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["ROTA_DATABASE_URL"] = make_conninfo(db_url, sslmode="bogus")
    done = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "rota-operator: error: ROTA_DATABASE_URL has a connection option libpq refuses:"
        ' invalid sslmode value: "bogus"'
    ]


@pytest.mark.parametrize(
    ("name", "value"),
    [("ROTA_INSTANCE", "Blue"), ("ROTA_POLL_INTERVAL_SECONDS", "abc"), ("ROTA_METRICS_PORT", "x")],
)
def test_a_setting_it_cannot_use_stops_it_at_start_in_one_line(
    db_url: str, name: str, value: str
) -> None:
    env = {**os.environ, "ROTA_DATABASE_URL": db_url, name: value}
    for command in ([str(SCRIPT)], [sys.executable, "-m", "kopf", "run", "-m", "rota_operator"]):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()
        assert line.startswith(f"rota-operator: error: {name} ") and line.endswith(f"not {value!r}")


def test_a_database_away_at_start_is_retried_object_by_object(
    kube_api: Api, db_url: str, tmp_path: pathlib.Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(kube_api.kubeconfig())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        away = make_conninfo(db_url, port=str(s.getsockname()[1]))  # nothing listens
    env: dict[str, Any] = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PG")},
        "KUBECONFIG": str(kubeconfig),
        "ROTA_DATABASE_URL": away,
        "ROTA_METRICS_PORT": "0",
        "ROTA_STANDALONE": "true",
        "ROTA_NAMESPACES": "default",
        "ROTA_RETRY_MAX_SECONDS": "1",
    }
    log = (tmp_path / "operator.log").open("w+")
    process = subprocess.Popen([str(SCRIPT)], env=env, stdout=log, stderr=subprocess.STDOUT)
    path = "/apis/rota.dev/v1/namespaces/default/jobschedules"
    try:
        schedule = {
            "apiVersion": "rota.dev/v1",
            "kind": "JobSchedule",
            "metadata": {"name": "patient"},
            "spec": {"jobType": "t", "schedule": "@daily"},
        }
        kube_api.create(path, schedule)

        def reason() -> str | None:
            conditions = ((kube_api.get(f"{path}/patient") or {}).get("status") or {}).get(
                "conditions"
            ) or ()
            return next((c["reason"] for c in conditions if c["type"] == "Ready"), None)

        assert wait_for(reason, timeout=30, what="Ready=False") == "DatabaseUnavailable"
        assert process.poll() is None
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=30)
    log.seek(0)
    assert code == 0, log.read()


@pytest.mark.parametrize("missing", ["kopf", "kubernetes"])
def test_an_install_without_the_operator_extra_says_what_to_install(missing: str) -> None:
    # `pip install rota` installs the script without kopf and kubernetes: it
    # ended in a ModuleNotFoundError traceback.
    hidden = (
        f"import sys; sys.modules[{missing!r}] = None; sys.argv = ['rota-operator'];"
        " import runpy; runpy.run_module('rota_operator', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", hidden], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "rota-operator: error: the operator needs the 'operator' extra:"
        f" pip install 'rota[operator]' (no module named {missing!r})"
    ]
