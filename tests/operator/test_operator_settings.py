"""The operator's settings come from the environment, with documented defaults."""

from __future__ import annotations

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
