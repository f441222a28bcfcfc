"""The one loop shape (`rota.loops.Loop`), stepped without its thread: a round's
failure handled by its kind (an outage backs off and reconnects, a refusal waits
the interval, anything else backs off, a connection option libpq refuses ends the
loop), the backoff reset by a success, a round's own wait, and a thread that
stops when its (shared) stop event is set."""

from __future__ import annotations

import threading

import pytest

from rota.errors import ConnectionOptionRefused, DatabaseError, DatabaseUnavailable
from rota.loops import Backoff, Loop
from tests.acceptance.procs import wait_for


class Scripted(Loop):
    """A loop whose rounds do what `script` says, in order (then succeed)."""

    def __init__(self, script: list[BaseException | None], stop: threading.Event | None = None):
        super().__init__(interval=5.0, reconnect_max_seconds=0.4, stop=stop)
        self.script = script
        self.closed = 0
        self.done = threading.Event()

    def run_once(self) -> None:
        failure = self.script.pop(0) if self.script else None
        if not self.script:
            self.done.set()
        if failure is not None:
            raise failure

    def close(self) -> None:
        self.closed += 1
        super().close()


def test_backoff_doubles_up_to_its_most_and_a_reset_starts_it_again() -> None:
    backoff = Backoff(first=0.1, most=0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1


def test_each_failure_of_a_round_is_handled_by_its_kind() -> None:
    loop = Scripted(
        [
            DatabaseUnavailable("gone"),
            DatabaseUnavailable("still gone"),
            DatabaseError("refused"),
            RuntimeError("a bug"),
            None,
            DatabaseUnavailable("gone again"),
        ]
    )
    waits = [loop.step() for _ in range(6)]
    # Outages back off (and close the connection), a refusal waits the
    # interval, a bug backs off too, a success resets the backoff.
    assert waits == [0.1, 0.2, 5.0, 0.4, 5.0, 0.1]
    assert loop.closed == 4
    assert loop.rounds == 1


def test_a_connection_option_libpq_refuses_ends_the_loop_no_wait_mends_it() -> None:
    refused = ConnectionOptionRefused('invalid sslmode value: "bogus"', "sslmode")
    loop = Scripted([DatabaseUnavailable("gone"), refused])
    loop.run_at_start = True
    with pytest.raises(ConnectionOptionRefused):
        loop.run()  # its first round backs off, its second ends the loop
    assert loop.closed >= 2
    assert loop.rounds == 0


def test_a_loop_in_its_thread_ends_on_a_refused_option_and_says_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = Scripted([ConnectionOptionRefused('invalid sslmode value: "bogus"', "sslmode")])
    loop.run_at_start = True
    loop.start()
    loop.join(20)
    assert not loop.is_alive()
    assert "rota-loop: ended: libpq refuses a connection option: invalid sslmode" in caplog.text


class Capped(Loop):
    """A loop that knows its next wait: at once while work is left."""

    run_at_start = True

    def __init__(self, rounds: int, stop: threading.Event) -> None:
        super().__init__(interval=3600.0, stop=stop)
        self.left = rounds
        self.done = threading.Event()

    def run_once(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.done.set()

    def next_wait(self) -> float:
        return 0.0 if self.left > 0 else self.interval


def test_a_loop_runs_at_once_while_it_says_so_and_stops_on_its_shared_event() -> None:
    stop = threading.Event()
    loop = Capped(3, stop)
    loop.start()
    assert loop.done.wait(20)  # three rounds with no wait between them
    assert loop.rounds == 3
    stop.set()  # whoever shares the event stops the loop
    loop.join(20)
    assert not loop.is_alive()
    assert loop.left == 0


def test_a_loop_stopped_waits_no_longer_and_closes_its_connection() -> None:
    loop = Scripted([])
    loop.start()
    loop.stop()  # in its first wait of 5 seconds
    wait_for(lambda: not loop.is_alive(), 20, "the loop's thread to end")
    assert loop.rounds == 0
    assert loop.closed >= 1


LIBPQ = (
    "consuming input failed: server closed the connection unexpectedly\n"
    "\tThis probably means the server terminated abnormally\n"
    "\tbefore or while processing the request."
)
"""libpq's message for a connection the server ended: three lines."""


def test_a_failed_round_is_logged_on_one_line(caplog: pytest.LogCaptureFixture) -> None:
    loop = Scripted([DatabaseUnavailable(LIBPQ), DatabaseError(LIBPQ)])
    for _ in range(2):
        loop.step()
    messages = [record.getMessage() for record in caplog.records]
    assert len(messages) == 2 and all("abnormally before" in m for m in messages)
    assert not [m for m in messages if "\n" in m]
