"""The operator's settings come from the environment, with documented defaults."""

from __future__ import annotations

import pytest

from rota_operator.settings import Settings, SettingsError


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
            "ROTA_PEERING_WAIT_LOG_SECONDS": "2.5",
        }
    )
    assert settings.database_url == "postgresql://db/rota"
    assert settings.namespaces == ("jobs", "batch")
    assert (settings.schedule_sync_seconds, settings.poll_interval_seconds) == (5.0, 7)
    assert (settings.metrics_port, settings.standalone) == (-1, True)
    assert (settings.peering_name, settings.peering_priority) == ("rota", 42)
    assert [settings.retry_delay(n) for n in (0, 1, 5, 6, 50)] == [1.0, 2.0, 32.0, 60.0, 60.0]
    assert settings.peering_wait_log_seconds == 2.5


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


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ROTA_SCHEDULE_SYNC_SECONDS", "abc", "a number of seconds more than 0"),
        ("ROTA_SCHEDULE_SYNC_SECONDS", "nan", "a number of seconds more than 0"),
        ("ROTA_SCHEDULE_SYNC_SECONDS", "inf", "a number of seconds more than 0"),
        ("ROTA_SCHEDULE_SYNC_SECONDS", "0", "a number of seconds more than 0"),
        ("ROTA_SCHEDULE_SYNC_SECONDS", "1e9", "a number of seconds more than 0 and at most 86400"),
        ("ROTA_POLL_INTERVAL_SECONDS", "1.5", "a whole number of seconds from 1"),
        ("ROTA_POLL_INTERVAL_SECONDS", "0", "a whole number of seconds from 1"),
        ("ROTA_POLL_INTERVAL_SECONDS", "1_0", "a whole number of seconds from 1"),
        ("ROTA_METRICS_PORT", "70000", "a port from 0 to 65535, or -1"),
        ("ROTA_METRICS_PORT", "http", "a port from 0 to 65535, or -1"),
        ("ROTA_PEERING_PRIORITY", "high", "a whole number"),
        ("ROTA_RETRY_MAX_SECONDS", "-5", "a number of seconds more than 0"),
        ("ROTA_STANDALONE", "maybe", "true or false"),
        ("ROTA_PEERING_WAIT_LOG_SECONDS", "abc", "a number of seconds more than 0"),
        ("ROTA_PEERING_WAIT_LOG_SECONDS", "0", "a number of seconds more than 0"),
    ],
)
def test_a_setting_it_cannot_use_is_named_with_its_rule(
    name: str, value: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=rf"^{name} must be {message}.*, not {value!r}$"):
        Settings.from_environ({name: value})


def test_an_empty_setting_is_its_default() -> None:
    names = ["ROTA_SCHEDULE_SYNC_SECONDS", "ROTA_POLL_INTERVAL_SECONDS", "ROTA_METRICS_PORT",
             "ROTA_PEERING_PRIORITY", "ROTA_RETRY_MAX_SECONDS", "ROTA_STANDALONE",
             "ROTA_PEERING_WAIT_LOG_SECONDS"]  # fmt: skip
    assert Settings.from_environ(dict.fromkeys(names, " ")) == Settings()
