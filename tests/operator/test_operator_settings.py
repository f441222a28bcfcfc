"""The operator's settings come from the environment, with documented defaults."""

from __future__ import annotations

import pytest

from rota_operator.settings import Settings


def test_defaults() -> None:
    settings = Settings.from_environ({})
    assert settings == Settings()
    assert settings.namespaces == ()
    assert settings.metrics_port == 8080
    assert settings.standalone is False


def test_from_environment() -> None:
    settings = Settings.from_environ(
        {
            "ROTA_DATABASE_URL": "postgresql://db/rota",
            "ROTA_NAMESPACES": " jobs, batch ,,",
            "ROTA_SCHEDULE_SYNC_SECONDS": "5",
            "ROTA_POLL_INTERVAL_SECONDS": "7",
            "ROTA_METRICS_PORT": "-1",
            "ROTA_STANDALONE": "True",
            "ROTA_PEERING_NAME": "rota",
            "ROTA_PEERING_PRIORITY": "42",
            "ROTA_RETRY_MAX_SECONDS": "60",
        }
    )
    assert settings.database_url == "postgresql://db/rota"
    assert settings.namespaces == ("jobs", "batch")
    assert (settings.schedule_sync_seconds, settings.poll_interval_seconds) == (5.0, 7)
    assert (settings.metrics_port, settings.standalone) == (-1, True)
    assert (settings.peering_name, settings.peering_priority) == ("rota", 42)
    assert [settings.retry_delay(n) for n in (0, 1, 5, 6, 50)] == [1.0, 2.0, 32.0, 60.0, 60.0]


def test_an_instance_scopes_the_finalizer_annotations_and_peering() -> None:
    plain = Settings.from_environ({})
    assert (plain.finalizer, plain.domain, plain.peering_name) == (
        "rota.dev/finalizer",
        "rota.dev",
        "rota-operator",
    )
    blue = Settings.from_environ({"ROTA_INSTANCE": "blue"})
    assert (blue.finalizer, blue.domain, blue.peering_name) == (
        "blue.rota.dev/finalizer",
        "blue.rota.dev",
        "rota-operator-blue",
    )
    named = Settings.from_environ({"ROTA_INSTANCE": "blue", "ROTA_PEERING_NAME": "mine"})
    assert named.peering_name == "mine"


@pytest.mark.parametrize("bad", ["Blue", "-blue", "blue_1", "a" * 43, "blue.green"])
def test_an_instance_must_fit_a_dns_label(bad: str) -> None:
    with pytest.raises(ValueError, match="ROTA_INSTANCE"):
        Settings.from_environ({"ROTA_INSTANCE": bad})
