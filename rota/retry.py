"""What happens after a handler fails: how long to wait, and what to remember.

Pure functions: the worker decides the outcome, `write_outcomes` writes it.
"""

from __future__ import annotations

import random
import traceback

from rota.settings import BackoffSettings

_DEFAULT = BackoffSettings()

MAX_ERROR_CHARS = 4000
"""last_error keeps the error type, its message and the end of the traceback."""


def backoff_seconds(
    attempts: int, settings: BackoffSettings = _DEFAULT, rng: random.Random | None = None
) -> float:
    """Delay before the next attempt after `attempts` failed ones.

    base * 2**(attempts-1), capped, then spread by +/- jitter (never below 0 and
    never above the cap).
    """
    exponent = max(attempts - 1, 0)
    # Past 2**60 every delay is capped anyway; avoid float overflow on absurd counts.
    delay = settings.cap_seconds if exponent > 60 else settings.base_seconds * 2**exponent
    delay = min(delay, settings.cap_seconds)
    if settings.jitter:
        spread = delay * settings.jitter
        delay += (rng or random).uniform(-spread, spread)
    return max(0.0, min(delay, settings.cap_seconds))


def describe_error(exc: BaseException, limit: int = MAX_ERROR_CHARS) -> str:
    """``Type: message`` then the innermost frames of the traceback, trimmed to `limit`.

    What PostgreSQL cannot store in text (the outcome would never be written) is
    escaped (see `storable`).
    """
    try:
        message = str(exc)
    except Exception:  # a handler's exception whose __str__ itself fails
        message = "<its message could not be read>"
    head = storable(f"{type(exc).__name__}: {message}".rstrip(": "))
    frames = "".join(traceback.format_tb(exc.__traceback__)) if exc.__traceback__ else ""
    frames = storable(frames)
    if not frames:
        return head[:limit]
    text = f"{head}\n{frames}"
    if len(text) <= limit:
        return text
    # Keep the head and the innermost frames, where the error was raised.
    tail_room = max(limit - len(head) - 6, 0)
    return f"{head}\n...\n{frames[-tail_room:]}"[:limit]


def storable(text: str) -> str:
    """`text` as PostgreSQL can store it: a NUL character becomes the four characters
    ``\\x00``, and a lone surrogate (``os.fsdecode`` of a file name that is not
    UTF-8, say), which cannot even be encoded, becomes ``\\udcff`` and the like."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
