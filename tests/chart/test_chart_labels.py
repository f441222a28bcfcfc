"""Every label key appears once, and the chart's selector labels stay its own.

A mapping with one key twice is refused by a strict YAML reader and, read
leniently, keeps either value: a pod whose labels then differ from its
Deployment's selector is refused by the API server. Users' labels (commonLabels,
podLabels, the monitoring objects' labels) may replace the chart's other labels
(app.kubernetes.io/part-of, say) but not the ones that select or own objects:
those are refused with a message that names the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from chart_support import ALL_OPTIONS, CHART, load_strict, run_helm, template_text

SELECTOR_KEYS = [
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
]


def _strict(helm: Path, *set_strings: str) -> list[dict[str, Any]]:
    text = template_text(
        helm, values=[ALL_OPTIONS], api_versions=["monitoring.coreos.com/v1/PrometheusRule"],
        set_strings=set_strings,
    )  # fmt: skip
    return load_strict(text)


def test_an_all_options_render_has_no_duplicate_keys(helm: Path) -> None:
    objects = _strict(
        helm,
        r"commonLabels.app\.kubernetes\.io/part-of=platform",
        "commonLabels.grafana_dashboard=0",
        "commonLabels.release=other",
    )
    assert objects
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        if obj["kind"] != "CustomResourceDefinition":
            assert labels["app.kubernetes.io/part-of"] == "platform", obj["metadata"]["name"]
    (dashboard,) = [o for o in objects if o["kind"] == "ConfigMap"]
    # The object's own labels win over commonLabels: Grafana's sidecar selects by them.
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    for obj in objects:
        if obj["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            assert obj["metadata"]["labels"]["release"] == "prometheus", obj["kind"]


def test_pod_labels_match_their_selector(helm: Path) -> None:
    for obj in _strict(helm):
        if obj["kind"] == "Deployment":
            selector = obj["spec"]["selector"]["matchLabels"]
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), obj["metadata"]["name"]


@pytest.mark.parametrize(
    ("where", "key"),
    [
        *(("operator.podLabels", key) for key in SELECTOR_KEYS),
        ("worker.podLabels", "app.kubernetes.io/component"),
        ("commonLabels", "app.kubernetes.io/instance"),
        ("commonLabels", "app.kubernetes.io/managed-by"),
        ("commonLabels", "rota.dev/instance"),
        ("metrics.dashboard.labels", "app.kubernetes.io/name"),
    ],
)
def test_users_cannot_change_the_selector_labels(helm: Path, where: str, key: str) -> None:
    label = f"{where}.{key.replace('.', chr(92) + '.')}=x"
    done = run_helm(
        helm, "template", "rota", str(CHART), "--set", "worker.enabled=true",
        "--set", "metrics.dashboard.enabled=true", "--set-string", label,
    )  # fmt: skip
    assert done.returncode != 0, label
    assert f"{where} must not set {key}" in done.stderr, done.stderr
