"""Line charts drawn on the server: samples in, SVG geometry out.

Lines of (instant, value) points are scaled into a fixed box with a y-axis of
round numbers, gridlines and time labels on the x-axis; each instant gets a
column that carries its readout (the time, and each line's value and height
there), which console.js shows in a tooltip as the pointer or the arrow keys
reach it. The chart itself draws without any script. The template only draws
what this module computes. Pure.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

WIDTH = 640
HEIGHT = 200
LEFT = 48
"""Room for the y-axis labels."""
BOTTOM = 22
"""Room for the x-axis labels."""
TOP = 8
RIGHT = 10
MAX_LINES = 6
"""The total and at most five job types; the rest are left out of the breakdown."""


@dataclasses.dataclass(frozen=True)
class Range:
    name: str
    span: timedelta
    bucket: timedelta
    """One point per bucket (the samples are a minute apart)."""
    tick: timedelta
    """A labelled time every tick."""
    label: str
    """strftime format of the time labels."""


RANGES = {
    "1h": Range("1h", timedelta(hours=1), timedelta(minutes=1), timedelta(minutes=10), "%H:%M"),
    "24h": Range("24h", timedelta(hours=24), timedelta(minutes=10), timedelta(hours=4), "%H:%M"),
    "7d": Range("7d", timedelta(days=7), timedelta(hours=1), timedelta(days=1), "%a %d"),
}


@dataclasses.dataclass(frozen=True)
class Line:
    name: str
    points: str
    """"x,y x,y ..." in the WIDTH x HEIGHT box, y growing downwards."""
    css: str
    """s1 (the total) .. s6: its colour in the style sheet."""


@dataclasses.dataclass(frozen=True)
class Column:
    """One instant of the chart: the strip of the plot nearest to it, and the
    value and height of each line there (None where a line has no point)."""

    x: float
    """The left edge of the strip; the point itself is at its middle."""
    width: float
    at: datetime
    names: tuple[str, ...]
    """The lines' names, as in Chart.lines."""
    values: tuple[tuple[str, float] | None, ...]
    """Per line: (its value as shown, its y), or None."""

    @property
    def when(self) -> str:
        """The instant as the readout shows it in UTC."""
        return self.at.astimezone(UTC).strftime("%a %d %b %H:%M UTC")

    @property
    def text(self) -> str:
        """The whole readout in one line."""
        shown = [f"{n} {v[0]}" for n, v in zip(self.names, self.values, strict=True) if v]
        return f"{self.when}: {', '.join(shown)}"

    @property
    def readout(self) -> str:
        """The values as JSON for console.js: [[text, y] or null, ...] per line."""
        return json.dumps([[v[0], round(v[1], 1)] if v else None for v in self.values])


@dataclasses.dataclass(frozen=True)
class Chart:
    title: str
    range: Range
    lines: tuple[Line, ...]
    y_ticks: tuple[tuple[float, str], ...]
    """(y, label) of each horizontal gridline."""
    x_ticks: tuple[tuple[float, str], ...]
    """(x, label) of each vertical gridline."""
    columns: tuple[Column, ...]
    latest: float | None
    peak: float

    @property
    def empty(self) -> bool:
        return not self.lines

    @property
    def slug(self) -> str:
        """An id for the chart's elements, from its title."""
        return "chart-" + re.sub(r"[^a-z0-9]+", "-", self.title.lower()).strip("-")

    @property
    def legend(self) -> str:
        """The lines as JSON for console.js: [[name, css], ...]."""
        return json.dumps([[line.name, line.css] for line in self.lines])

    width = WIDTH
    height = HEIGHT
    left = LEFT
    right = WIDTH - RIGHT
    top = TOP
    bottom = HEIGHT - BOTTOM


def axis_top(peak: float) -> float:
    """The top of a y-axis of four equal steps of 1, 2, 2.5 or 5 x 10^k that holds peak."""
    if peak <= 0:
        return 4.0
    quarter = peak / 4
    power = 10 ** math.floor(math.log10(quarter))
    step = next(s * power for s in (1, 2, 2.5, 5, 10) if s * power >= quarter)
    return float(4 * step)


def _number(value: float) -> str:
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k".replace(".0k", "k")
    return f"{value:.0f}" if value == int(value) or value >= 10 else f"{value:g}"


def _reading(value: float) -> str:
    """A value as the readout shows it: whole from 100 up, else three digits."""
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.3g}"


def chart(
    title: str,
    lines: Mapping[str, Sequence[tuple[datetime, float]]],
    end: datetime,
    span: Range,
) -> Chart:
    """The chart of `lines` (the first is the total, drawn first) over the range
    ending at `end`; a point that is no finite number (NaN, infinity: a sample
    written around the checks) is a gap, and a line with fewer than two points is
    left out."""
    finite = {name: [p for p in points if math.isfinite(p[1])] for name, points in lines.items()}
    kept = {name: sorted(points) for name, points in finite.items() if len(points) >= 2}
    if not kept:
        return Chart(title, span, (), (), (), (), None, 0.0)
    start = end - span.span
    total = next(iter(kept.values()))
    peak = max(v for points in kept.values() for _, v in points)
    top = axis_top(peak)
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    seconds = span.span.total_seconds()

    def x(t: datetime) -> float:
        return LEFT + max(0.0, min(1.0, (t - start).total_seconds() / seconds)) * plot_w

    xs = {t: x(t) for points in kept.values() for t, _ in points}  # lines share their times
    scale = plot_h / top

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    drawn = tuple(
        Line(
            name,
            " ".join(f"{xs[t]:.1f},{TOP + plot_h - v * scale:.1f}" for t, v in points),
            f"s{i + 1}",
        )
        for i, (name, points) in enumerate(kept.items())
    )
    y_ticks = tuple((y(top * k / 4), _number(top * k / 4)) for k in range(5))
    tick = span.tick.total_seconds()
    first = math.ceil(start.timestamp() / tick) * tick
    x_ticks = []
    moment = first
    while moment <= end.timestamp():
        at = datetime.fromtimestamp(moment, tz=end.tzinfo)
        x_ticks.append((x(at), at.strftime(span.label)))
        moment += tick
    values = {name: dict(points) for name, points in kept.items()}
    step = span.bucket.total_seconds() / seconds * plot_w
    columns = tuple(
        Column(
            xs[t] - step / 2,
            step,
            t,
            tuple(kept),
            tuple(
                (_reading(values[name][t]), y(values[name][t])) if t in values[name] else None
                for name in kept
            ),
        )
        for t, _ in total
    )
    return Chart(title, span, drawn, y_ticks, tuple(x_ticks), columns, total[-1][1], peak)
