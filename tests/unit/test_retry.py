"""Backoff and error descriptions: the pure parts of retrying."""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest

from rota.errors import MAX_DELAY_SECONDS, Permanent, Retry
from rota.jobs import Job, Outcome, Status
from rota.retry import backoff_seconds, describe_error
from rota.settings import BackoffSettings
from rota_worker.execute import outcome_of_error

NO_JITTER = BackoffSettings(base_seconds=1, cap_seconds=60, jitter=0)


@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (50, 60), (10_000, 60)]
)
def test_backoff_doubles_then_caps(attempts: int, expected: float) -> None:
    assert backoff_seconds(attempts, NO_JITTER) == expected


def test_jitter_stays_within_its_band_and_under_the_cap() -> None:
    settings = BackoffSettings(base_seconds=10, cap_seconds=100, jitter=0.25)
    rng = random.Random(7)
    delays = [backoff_seconds(2, settings, rng) for _ in range(500)]
    assert all(15 <= d <= 25 for d in delays)
    assert len({round(d, 3) for d in delays}) > 100  # really spread
    capped = [backoff_seconds(30, settings, rng) for _ in range(200)]
    assert all(75 <= d <= 100 for d in capped)


def test_invalid_backoff_settings_are_refused() -> None:
    with pytest.raises(ValueError):
        BackoffSettings(base_seconds=10, cap_seconds=1)
    with pytest.raises(ValueError):
        BackoffSettings(jitter=2)


def _raise(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_error_description_keeps_type_message_and_innermost_frames() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("missing-field")
        deep(n - 1)

    try:
        deep(300)
    except KeyError as exc:
        text = describe_error(exc, limit=2000)
    assert text.startswith("KeyError: 'missing-field'")
    assert len(text) <= 2000
    assert 'raise KeyError("missing-field")' in text  # the innermost frame survives trimming


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, MAX_DELAY_SECONDS + 1])
def test_a_retry_delay_the_database_could_not_store_is_refused(delay: float) -> None:
    with pytest.raises(ValueError, match="Retry delay must be from 0 to"):
        Retry(delay=delay)
    assert Retry(delay=MAX_DELAY_SECONDS).delay == MAX_DELAY_SECONDS


def test_error_description_shows_a_nul_it_could_not_store() -> None:
    text = describe_error(_raise(ValueError("bad\x00byte")))
    assert "\x00" not in text
    assert text.startswith("ValueError: bad\\x00byte")


def test_error_description_of_an_exception_whose_message_fails() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert describe_error(_raise(Unprintable())).startswith(
        "Unprintable: <its message could not be read>"
    )


def _job(attempts: int = 1) -> Job:
    from datetime import UTC, datetime

    return Job(1, "t", {}, None, Status.RUNNING, datetime.now(UTC), attempts, 5)


def test_outcomes_of_handler_errors() -> None:
    assert outcome_of_error(_job(), _raise(Permanent("bad payload")), NO_JITTER).outcome == "failed"
    retry = outcome_of_error(_job(), _raise(Retry(delay=42)), NO_JITTER)
    assert (retry.outcome, retry.delay) == ("retry", 42)
    plain = outcome_of_error(_job(3), _raise(ValueError("x")), NO_JITTER)
    assert (plain.outcome, plain.delay) == ("retry", 4)
    assert plain.error is not None and plain.error.startswith("ValueError: x")


def test_database_outage_under_a_handler_is_not_an_attempt() -> None:
    import psycopg

    finish = outcome_of_error(_job(), _raise(psycopg.OperationalError("gone")), NO_JITTER)
    assert finish.outcome == Outcome.RELEASED


def test_retry_refuses_negative_delay() -> None:
    with pytest.raises(ValueError):
        Retry(delay=-1)


def _send_mail() -> None:
    try:
        {}["smtp"]
    except KeyError as exc:
        raise RuntimeError("could not send the welcome mail") from exc


def test_error_description_keeps_the_cause_and_its_frames() -> None:
    text = describe_error(_raise_from(_send_mail))
    assert text.startswith("RuntimeError: could not send the welcome mail\n")
    outer, _, inner = text.partition("\nCaused by: KeyError: 'smtp'\n")
    assert inner, text
    assert 'raise RuntimeError("could not send the welcome mail") from exc' in outer
    assert '{}["smtp"]' in inner  # the root cause's own frame


def test_error_description_keeps_what_it_was_handling() -> None:
    def cleanup() -> None:
        try:
            raise ConnectionError("lost the server")
        except ConnectionError:
            raise ValueError("cleanup failed")  # noqa: B904

    text = describe_error(_raise_from(cleanup))
    assert text.startswith("ValueError: cleanup failed")
    assert "\nWhile handling: ConnectionError: lost the server\n" in text


def test_error_description_leaves_out_rotas_own_calling_frames() -> None:
    import rota
    from rota import limits

    # A runner inside Rota's package calls the handler and catches what it
    # raises, as the worker does.
    runner: dict[str, Any] = {}
    source = (
        "def run(fn):\n    try:\n        fn()\n    except Exception as exc:\n        return exc\n"
    )
    exec(compile(source, os.path.join(os.path.dirname(rota.__file__), "runner.py"), "exec"), runner)

    def handler() -> None:
        limits.text("a\x00b", "field")  # raises InvalidInput inside Rota

    text = describe_error(runner["run"](handler))
    frames = text.splitlines()[1:]
    assert "test_retry.py" in frames[0] and "in handler" in frames[0], text
    assert "runner.py" not in text
    assert "limits.py" in text  # Rota's frame that raised stays (the innermost)


def test_error_description_trims_the_middle_and_keeps_every_exception() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise KeyError("root")
        deep(n - 1)

    def outer() -> None:
        try:
            deep(200)
        except KeyError as exc:
            raise RuntimeError("x" * 5000) from exc

    text = describe_error(_raise_from(outer), limit=2000)
    assert len(text) <= 2000 and text.startswith("RuntimeError: xxx")
    assert "\nCaused by: KeyError: 'root'\n" in text
    assert 'raise KeyError("root")' in text  # the root cause's innermost frame


def _raise_from(fn: Callable[[], object]) -> BaseException:
    try:
        fn()
    except BaseException as caught:
        return caught
    raise AssertionError("did not raise")


def test_error_description_leaves_out_the_thread_pool_that_called_rota() -> None:
    # A sync handler runs in a worker thread: the standard library's executor
    # frame comes first, then Rota's call, then the handler's own frames.
    import concurrent.futures

    from rota import handlers as rota_handlers

    def handler(job: Any) -> None:
        raise ValueError("boom")

    found = rota_handlers.Handler("t", handler, is_async=False, wants_context=False)
    job = Job(1, "t", {}, None, Status.RUNNING, datetime.now(UTC), 1, 3)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        error = pool.submit(
            rota_handlers.call, found, job, rota_handlers.Context("", "w")
        ).exception()
    assert error is not None
    frames = describe_error(error).splitlines()[1:]
    assert "in handler" in frames[0], frames
    assert not any("concurrent" in f or "rota/handlers.py" in f for f in frames), frames
