"""Status conditions the Kubernetes way: one entry per type, transition times kept.

`kubectl wait --for=condition=Ready` and the READY printer column read these,
so a condition keeps its lastTransitionTime while its status stays the same.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any


def now_rfc3339() -> str:
    """The current instant as Kubernetes writes it (UTC, seconds, 'Z')."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(instant: datetime.datetime | None) -> str | None:
    """A database timestamp as an RFC 3339 UTC string, or None."""
    if instant is None:
        return None
    return instant.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def with_condition(
    conditions: Iterable[Mapping[str, Any]] | None,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """The conditions with one of them set, its transition time kept if unchanged."""
    value = "True" if status else "False"
    others = [dict(c) for c in conditions or () if c.get("type") != type_]
    previous = next((c for c in conditions or () if c.get("type") == type_), None)
    kept = (
        previous.get("lastTransitionTime") if previous and previous.get("status") == value else None
    )
    condition: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": kept or now_rfc3339(),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return [*others, condition]
