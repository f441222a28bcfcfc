"""What `helm install` prints after an install is true for the values given.

The notes are rendered offline through a copy of the chart (chart_support.notes_chart):
helm renders NOTES.txt only for install and upgrade, which need a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import yaml

Notes = Callable[..., str]


def _example(text: str) -> dict[str, Any]:
    """The JobSchedule the notes tell to save as hello.yaml."""
    start = text.index("save this as hello.yaml,") + len("save this as hello.yaml,")
    end = text.index("then apply it", start)
    example: dict[str, Any] = yaml.safe_load(text[start:end])
    return example


def _applied_in(text: str) -> str:
    (line,) = [x for x in text.splitlines() if x.strip().endswith("apply -f hello.yaml")]
    return line.split()[2]  # kubectl -n NAMESPACE apply -f hello.yaml


def test_the_example_schedule_is_one_the_operator_handles(notes: Notes) -> None:
    plain = notes()
    assert _example(plain)["kind"] == "JobSchedule"
    assert "labels" not in _example(plain)["metadata"]
    assert _applied_in(plain) == "rota"
    blue = _example(notes(sets=["operator.instance=blue"]))
    assert blue["metadata"]["labels"] == {"rota.dev/instance": "blue"}


def test_the_example_is_applied_in_a_watched_namespace(notes: Notes) -> None:
    text = notes(sets=["operator.watchNamespaces={team-a,team-b}"])
    assert _applied_in(text) == "team-a"
    assert "Operator: watches team-a,team-b" in text
    # The release's own pool is watched too (its namespace joins the list).
    with_pool = notes(sets=["operator.watchNamespaces={team-a}", "worker.enabled=true"])
    assert "Operator: watches team-a,rota" in with_pool
    everywhere = notes(sets=["operator.watchNamespaces={*}"])
    assert _applied_in(everywhere) == "rota"
    assert "Operator: watches every namespace" in everywhere


def test_without_the_operator_nothing_speaks_of_schedules_it_would_handle(notes: Notes) -> None:
    text = notes(sets=["operator.enabled=false", "exporter.enabled=true"])
    assert "No operator: JobSchedules and WorkerPools are not handled." in text
    assert "kind: JobSchedule" not in text
    assert "Operator: watches" not in text
    assert "delete jobschedules" not in text
