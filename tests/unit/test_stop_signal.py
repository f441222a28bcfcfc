"""`job.cancelled`: an event made only when a handler waits on it."""

from __future__ import annotations

import threading

from rota.jobs import StopSignal


def test_a_waiting_thread_wakes_when_the_signal_is_set() -> None:
    signal = StopSignal()
    woke: list[bool] = []
    waiting = threading.Thread(target=lambda: woke.append(signal.wait(60)))
    waiting.start()
    while signal._event is None:  # the waiter has made its event
        threading.Event().wait(0.001)
    signal.set()
    waiting.join(timeout=60)
    assert woke == [True] and signal.is_set()


def test_wait_returns_at_once_when_set_and_times_out_when_not() -> None:
    signal = StopSignal()
    assert signal.wait(0.01) is False
    signal.set()
    assert signal.wait() is True
    signal.clear()
    assert not signal.is_set() and signal.wait(0.01) is False


def test_set_before_anyone_waits_makes_no_event() -> None:
    signal = StopSignal()
    signal.set()
    assert signal._event is None and signal.is_set()
