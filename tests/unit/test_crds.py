"""The CRDs in crds/ accept every sample and reject what the API server would reject.

The openAPIV3Schema of each CRD is an OpenAPI 3.0 schema, which is JSON Schema
draft 4 with Kubernetes extensions (ignored here), so jsonschema validates the
sample objects the way the API server's structural validation would.
"""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import jsonschema
import pytest
import yaml

from rota_operator import pools

CRDS = pathlib.Path(__file__).parents[2] / "crds"
EXAMPLES = sorted((CRDS / "examples").glob("*.yaml"))


def load_crds() -> dict[str, dict[str, Any]]:
    crds = {}
    for path in CRDS.glob("*.rota.dev.yaml"):
        crd = yaml.safe_load(path.read_text())
        crds[crd["spec"]["names"]["kind"]] = crd
    return crds


def schema_of(kind: str) -> dict[str, Any]:
    (version,) = load_crds()[kind]["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


def errors_of(obj: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(schema_of(obj["kind"]))
    return [error.message for error in validator.iter_errors(obj)]


def test_both_crds_are_namespaced_v1_with_status() -> None:
    crds = load_crds()
    assert set(crds) == {"JobSchedule", "WorkerPool"}
    for crd in crds.values():
        jsonschema.Draft4Validator.check_schema(
            crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        )
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["group"] == "rota.dev"
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1" and version["storage"] is True
        assert "status" in version["subresources"]
        assert crd["metadata"]["name"] == f"{crd['spec']['names']['plural']}.rota.dev"


@pytest.mark.parametrize(
    ("kind", "columns"),
    [
        (
            "JobSchedule",
            ["Schedule", "TimeZone", "Suspend", "Next Run", "Last Slot", "Ready", "Age"],
        ),
        (
            "WorkerPool",
            [
                "Target",
                "Min",
                "Max",
                "Desired",
                "Current",
                "Queue Age",
                "Decided By",
                "Paused",
                "Age",
            ],
        ),
    ],
)
def test_printer_columns(kind: str, columns: list[str]) -> None:
    (version,) = load_crds()[kind]["spec"]["versions"]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_is_valid(path: pathlib.Path) -> None:
    for obj in yaml.safe_load_all(path.read_text()):
        assert errors_of(obj) == []


def test_there_are_examples_of_both_kinds() -> None:
    kinds = {yaml.safe_load(p.read_text())["kind"] for p in EXAMPLES}
    assert kinds == {"JobSchedule", "WorkerPool"}


SCHEDULE = {
    "apiVersion": "rota.dev/v1",
    "kind": "JobSchedule",
    "metadata": {"name": "s", "namespace": "default"},
    "spec": {"jobType": "t", "schedule": "* * * * *"},
}
POOL = {
    "apiVersion": "rota.dev/v1",
    "kind": "WorkerPool",
    "metadata": {"name": "p", "namespace": "default"},
    "spec": {"scaleTargetRef": {"name": "workers"}, "maxReplicas": 3},
}


def changed(obj: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of obj with the dotted path set to value (or removed when value is ...)."""
    result = copy.deepcopy(obj)
    *parents, last = path.split(".")
    target = result
    for key in parents:
        target = target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return result


def test_minimal_objects_are_valid() -> None:
    assert errors_of(SCHEDULE) == []
    assert errors_of(POOL) == []


@pytest.mark.parametrize(
    ("obj", "path", "value"),
    [
        (SCHEDULE, "spec", ...),
        (SCHEDULE, "spec.jobType", ...),
        (SCHEDULE, "spec.jobType", ""),
        (SCHEDULE, "spec.schedule", ...),
        (SCHEDULE, "spec.schedule", 5),
        (SCHEDULE, "spec.payload", ["not", "an", "object"]),
        (SCHEDULE, "spec.maxAttempts", 0),
        (SCHEDULE, "spec.suspend", "yes"),
        (SCHEDULE, "spec.spreadSeconds", -1),
        (SCHEDULE, "spec.concurrencyPolicy", "Replace"),
        (SCHEDULE, "spec.startingDeadlineSeconds", 0),
        (POOL, "spec.scaleTargetRef", ...),
        (POOL, "spec.scaleTargetRef", {}),
        (POOL, "spec.maxReplicas", ...),
        (POOL, "spec.maxReplicas", 0),
        (POOL, "spec.minReplicas", -1),
        (POOL, "spec.jobTypes", []),
        (POOL, "spec.jobTypes", "email.send"),
        (POOL, "spec.targetQueueAgeSeconds", 0),
        (POOL, "spec.scaleDownStabilizationSeconds", -5),
        (POOL, "spec.pollIntervalSeconds", 0),
        (POOL, "spec.jobsPerReplica", 0),
        (POOL, "spec.paused", "yes"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_invalid_objects_are_rejected(obj: dict[str, Any], path: str, value: Any) -> None:
    assert errors_of(changed(obj, path, value)) != []


def test_the_operator_defaults_match_the_crd_defaults() -> None:
    spec = schema_of("WorkerPool")["properties"]["spec"]["properties"]
    crd_defaults = {key: prop["default"] for key, prop in spec.items() if "default" in prop}
    assert crd_defaults == pools.SPEC_DEFAULTS
