"""What happens after a handler fails: how long to wait, and what to remember.

Pure functions: the worker decides the outcome, `write_outcomes` writes it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import sys
import traceback

from rota.settings import BackoffSettings

_DEFAULT = BackoffSettings()

MAX_RELEASES = 10
"""Give-backs in a row that do not count as an attempt (a job given back in an
outage, a durable job whose worker died after storing a step) before the next
one counts."""

MAX_ERROR_CHARS = 4000
"""last_error keeps the error type, its message, the end of its traceback, and
its chain of causes."""


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
    """``Type: message``, its frames, then each exception of its chain the same way
    (``raise X from exc``: "Caused by:"; raised while handling another: "While
    handling:"), trimmed to `limit`.

    The first line is always the outermost error (the console groups dead jobs by
    it). The frames of Rota's own code that called the handler are left out: each
    traceback starts at the first frame outside Rota. Trimmed, every exception keeps
    its line and the root cause's innermost frames are kept first. What PostgreSQL
    cannot store in text (the outcome would never be written) is escaped (see
    `storable`).
    """
    parts = [_Part(label, _headline(e), _frames(e)) for label, e in _chain(exc)]
    text = "\n".join(part.text(part.frames) for part in parts)
    if len(text) <= limit:
        return text
    share = limit // (2 * len(parts))  # a long message leaves room for its causes
    parts = [dataclasses.replace(p, head=p.head[:share]) for p in parts]
    room = limit - sum(len(part.text("")) + len(_CUT) + 1 for part in parts)
    kept = []
    for part in reversed(parts):  # the root cause's frames first
        frames = part.frames[-room:] if room > 0 else ""
        room -= len(frames)
        cut = _CUT if len(frames) < len(part.frames) else ""
        kept.append(part.text(cut + frames))
    return "\n".join(reversed(kept))[:limit]


_CUT = "  ...\n"
_CHAIN_DEPTH = 8
"""Exceptions of a chain described at most (a chain can even be a loop)."""


@dataclasses.dataclass(frozen=True)
class _Part:
    label: str
    head: str
    frames: str

    def text(self, frames: str) -> str:
        return f"{self.label}{self.head}\n{frames}" if frames else f"{self.label}{self.head}"


def _chain(exc: BaseException) -> list[tuple[str, BaseException]]:
    """The exception, then its cause or context, then theirs: (label, exception)."""
    found: list[tuple[str, BaseException]] = [("", exc)]
    seen = {id(exc)}
    while len(found) < _CHAIN_DEPTH:
        current = found[-1][1]
        if current.__cause__ is not None:
            label, following = "\nCaused by: ", current.__cause__
        elif current.__context__ is not None and not current.__suppress_context__:
            label, following = "\nWhile handling: ", current.__context__
        else:
            break
        if id(following) in seen:
            break
        seen.add(id(following))
        found.append((label, following))
    return found


def _headline(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # a handler's exception whose __str__ itself fails
        message = "<its message could not be read>"
    return storable(f"{type(exc).__name__}: {message}".rstrip(": "))


def _frames(exc: BaseException) -> str:
    """The traceback's frames from the first one outside Rota and the standard
    library (a thread pool calls Rota, which calls the handler); all of them
    when there is none: then Rota itself raised it."""
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    own = _own_folders()
    first = next((i for i, f in enumerate(frames) if not _calls_in(f.filename, own)), len(frames))
    shown = frames[first:] or frames
    return storable("".join(traceback.format_list(shown)).rstrip("\n"))


_STANDARD_LIBRARY = os.path.join(os.path.dirname(os.__file__), "")
"""The standard library's folder; the packages installed below it are not its."""


def _calls_in(filename: str, own: tuple[str, ...]) -> bool:
    """A frame of Rota's or of the standard library: of what calls a handler."""
    if filename.startswith(own):
        return True
    installed = f"{os.sep}site-packages{os.sep}" in filename or "dist-packages" in filename
    return filename.startswith(_STANDARD_LIBRARY) and not installed


def _own_folders() -> tuple[str, ...]:
    """The folders of Rota's packages (the core, and the worker when it is loaded)."""
    folders = [os.path.dirname(__file__)]
    worker = sys.modules.get("rota_worker")
    if worker is not None and getattr(worker, "__file__", None):
        folders.append(os.path.dirname(str(worker.__file__)))
    return tuple(os.path.join(f, "") for f in folders)


def storable(text: str) -> str:
    """`text` as PostgreSQL can store it: a NUL character becomes the four characters
    ``\\x00``, and a lone surrogate (``os.fsdecode`` of a file name that is not
    UTF-8, say), which cannot even be encoded, becomes ``\\udcff`` and the like."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
