"""What every action route shares: its database work runs on the thread pool,
and its form fields are read as numbers or refused with `InvalidInput`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool

from rota import limits
from rota.errors import InvalidInput
from rota.web import actions, filters
from rota.web.console import Console, form_field


async def threaded(c: Console, run: Callable[..., actions.Done], *args: Any) -> actions.Done:
    """`run(conn, *args)` on a pooled connection, on the thread pool (off the event loop)."""

    def work() -> actions.Done:
        with c.conn() as conn:
            return run(conn, *args)

    return await run_in_threadpool(work)


def whole(form: Any, name: str) -> int | None:
    """A whole number from a form field (None when empty); `InvalidInput` otherwise."""
    value = _parsed(form, name, limits.whole_text, "a whole number")
    return None if value is None else int(value)


def seconds(form: Any, name: str) -> float | None:
    return _parsed(form, name, filters.decimal_number, "a number of seconds")


def _parsed(form: Any, name: str, parse: Callable[[str], float], what: str) -> float | None:
    text = form_field(form, name)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError:
        raise InvalidInput(f"{name} must be {what}, not {text!r}") from None
