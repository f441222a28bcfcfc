"""Small line charts drawn on the server: points in, SVG coordinates out.

The console's charts need no JavaScript: a series of (minute, value) pairs is
scaled into a fixed box and the template draws it as one SVG polyline. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

WIDTH = 600
HEIGHT = 140


@dataclasses.dataclass(frozen=True)
class Series:
    title: str
    points: tuple[tuple[datetime, float], ...]
    polyline: str
    """"x,y x,y ..." in a WIDTH x HEIGHT box, y growing downwards."""
    peak: float
    latest: float | None

    @property
    def empty(self) -> bool:
        return len(self.points) < 2


def series(title: str, points: Sequence[tuple[datetime, float]]) -> Series:
    ordered = tuple(sorted(points))
    peak = max((v for _, v in ordered), default=0.0)
    if len(ordered) < 2:
        return Series(title, ordered, "", peak, ordered[-1][1] if ordered else None)
    first, last = ordered[0][0], ordered[-1][0]
    span = (last - first).total_seconds() or 1.0
    top = peak or 1.0
    coords = " ".join(
        f"{(t - first).total_seconds() / span * WIDTH:.1f},{HEIGHT - v / top * (HEIGHT - 10):.1f}"
        for t, v in ordered
    )
    return Series(title, ordered, coords, peak, ordered[-1][1])
