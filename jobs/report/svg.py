"""A small SVG writer for the report's charts: a frame with axes, ticks, labels and a legend, as text.

No plotting library: the charts' data are small aggregates, and writing the elements directly costs
milliseconds where a plotting library costs its import plus a layout pass per figure.  Output is
deterministic (no ids from a random salt, no dates; numbers rounded to 0.1 px), so the same data gives the
same bytes.  Text is ``<text>`` in the page's sans-serif font; widths needed for layout are estimated from
the character count (``text_width``), generously, so labels are not clipped.

Every document is a standalone ``<svg xmlns=...>`` with ``role="img"``, a ``<title>`` and a ``<desc>`` (named
by ``aria-labelledby``), an explicit ``width``/``height`` and a matching ``viewBox``; ids are prefixed with
the chart's name so that several charts can be inlined in one page.
"""
from __future__ import annotations

import math
from html import escape
from typing import List, Optional, Sequence, Tuple

FONT = 12.0                       # px: tick labels, legend
SMALL = 11.0
CHAR_W = 0.62                     # average glyph width of a sans-serif font, in em (digits ~0.56)
AXIS = "#444"
GRID = "#e6e6e6"
TEXT = "#1d2330"


def q(s) -> str:
    """Text or attribute value, escaped."""
    return escape(str(s), quote=True)


def f(x: float) -> str:
    """A coordinate: at most one decimal, no trailing zeros."""
    r = round(float(x), 1)
    if r == int(r):
        return str(int(r))
    return f"{r:.1f}"


def text_width(s: str, size: float = FONT) -> float:
    return len(str(s)) * size * CHAR_W


def nice_ticks(lo: float, hi: float, target: int = 6, integer: bool = False) -> List[float]:
    """Round tick values within [lo, hi] (1, 2, 2.5, 5 x 10^k steps; ``integer``: steps of at least 1)."""
    if not hi > lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, target)
    mag = 10.0 ** math.floor(math.log10(raw))
    steps = (1, 2, 5, 10) if integer and mag < 10 else (1, 2, 2.5, 5, 10)
    step = next(m * mag for m in steps if m * mag >= raw)
    if integer:
        step = max(1.0, step)
    first = math.ceil(lo / step - 1e-9) * step
    ticks, v = [], first
    while v <= hi + step * 1e-9:
        ticks.append(0.0 if abs(v) < step * 1e-9 else v)
        v = first + len(ticks) * step
    return ticks


def tick_label(v: float, ticks: Sequence[float]) -> str:
    """Plain numbers (no offset, no exponent), as many decimals as the step needs, thousands separated."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    dec = 0 if step >= 1 and float(step).is_integer() else max(0, min(6, -math.floor(math.log10(step)) + 1))
    s = f"{v:,.{dec}f}"
    if dec:
        s = s.rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def expand(lo: float, hi: float, pad: float = 0.05, min_span: Optional[float] = None) -> Tuple[float, float]:
    """A data range widened by ``pad`` of its span; a (nearly) single value gets ``min_span`` (default: 10%
    of its magnitude, at least 1) around it, so ticks are not labelled with the last digits of one value."""
    if min_span is None:
        min_span = max(0.1 * max(abs(lo), abs(hi)), 1.0)
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    p = (hi - lo) * pad
    return lo - p, hi + p


class Scale:
    """Linear map from data [d0, d1] to pixels [p0, p1]."""

    def __init__(self, d0: float, d1: float, p0: float, p1: float):
        self.d0, self.d1, self.p0, self.p1 = float(d0), float(d1), float(p0), float(p1)

    def __call__(self, v: float) -> float:
        if self.d1 == self.d0:
            return (self.p0 + self.p1) / 2
        return self.p0 + (float(v) - self.d0) * (self.p1 - self.p0) / (self.d1 - self.d0)

    def many(self, values):
        """Pixels of a numpy array of data values."""
        if self.d1 == self.d0:
            return values * 0.0 + (self.p0 + self.p1) / 2
        return self.p0 + (values - self.d0) * ((self.p1 - self.p0) / (self.d1 - self.d0))

    def inv(self, px: float) -> float:
        """The data value at pixel ``px``."""
        if self.p1 == self.p0:
            return self.d0
        return self.d0 + (float(px) - self.p0) * (self.d1 - self.d0) / (self.p1 - self.p0)


class Chart:
    """Elements of one chart; ``document()`` wraps them in the ``<svg>``."""

    def __init__(self, name: str, width: float, height: float):
        self.name, self.width, self.height = name, float(width), float(height)
        self.parts: List[str] = []

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(self, x: float, y: float, s, anchor: str = "start", size: float = FONT, extra: str = "") -> None:
        a = "" if anchor == "start" else f' text-anchor="{anchor}"'
        sz = "" if size == FONT else f' font-size="{f(size)}"'
        self.add(f'<text x="{f(x)}" y="{f(y)}"{a}{sz}{extra}>{q(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke: str = AXIS, width: float = 1.0, extra: str = "",
             tip: Optional[str] = None) -> None:
        body = f'<line x1="{f(x1)}" y1="{f(y1)}" x2="{f(x2)}" y2="{f(y2)}" stroke="{stroke}" ' \
               f'stroke-width="{f(width)}"{extra}'
        self.add(f"{body}><title>{q(tip)}</title></line>" if tip else f"{body}/>")

    def rect(self, x, y, w, h, fill: str, tip: Optional[str] = None, extra: str = "") -> None:
        body = f'<rect x="{f(x)}" y="{f(y)}" width="{f(max(w, 0.0))}" height="{f(max(h, 0.0))}" fill="{fill}"' \
               f'{extra}'
        self.add(f"{body}><title>{q(tip)}</title></rect>" if tip else f"{body}/>")

    def x_axis(self, scale: Scale, ticks: Sequence[float], y: float, top: float, label: str,
               labels: Optional[Sequence[str]] = None, grid: bool = True) -> None:
        """Ticks, tick labels and a grid line at each tick (from ``top`` down to the axis at ``y``)."""
        for i, v in enumerate(ticks):
            x = scale(v)
            if grid:
                self.line(x, top, x, y, stroke=GRID)
            self.line(x, y, x, y + 4)
            self.text(x, y + 16, labels[i] if labels else tick_label(v, ticks), anchor="middle")
        self.line(scale.p0, y, scale.p1, y)
        self.text((scale.p0 + scale.p1) / 2, y + 34, label, anchor="middle")

    def y_axis(self, scale: Scale, ticks: Sequence[float], x: float, right: float, label: Optional[str],
               grid: bool = True) -> None:
        for v in ticks:
            y = scale(v)
            if grid:
                self.line(x, y, right, y, stroke=GRID)
            self.line(x - 4, y, x, y)
            self.text(x - 7, y + 4, tick_label(v, ticks), anchor="end")
        self.line(x, scale.p0, x, scale.p1)
        if label:
            cy = (scale.p0 + scale.p1) / 2
            self.text(14, cy, label, anchor="middle", extra=f' transform="rotate(-90 14 {f(cy)})"')

    def legend(self, items: Sequence[Tuple[str, str, str]], x: float, y: float, max_width: float) -> float:
        """``(kind, color, label)`` entries (kind: ``box``, ``dot``, ``line``, ``tick``), left to right,
        wrapping at ``max_width``; returns the y below the last row."""
        cx, row = x, y
        for kind, color, label in items:
            w = 18 + text_width(label) + 16
            if cx > x and cx + w > x + max_width:
                cx, row = x, row + 18
            if kind == "box":
                self.rect(cx, row - 9, 12, 10, color)
            elif kind == "dot":
                self.add(f'<circle cx="{f(cx + 6)}" cy="{f(row - 4)}" r="4" fill="{color}"/>')
            elif kind == "tick":
                self.line(cx + 6, row - 10, cx + 6, row + 1, stroke=color, width=2)
            else:
                self.line(cx, row - 4, cx + 14, row - 4, stroke=color, width=2)
                self.add(f'<circle cx="{f(cx + 7)}" cy="{f(row - 4)}" r="2.5" fill="{color}"/>')
            self.text(cx + 18, row, label)
            cx += w
        return row + 10

    def document(self, title: str, desc: str) -> str:
        t, d = f"{self.name}-title", f"{self.name}-desc"
        w, h = f(self.width), f(self.height)
        return (f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{w}" height="{h}" '
                f'viewBox="0 0 {w} {h}" role="img" aria-labelledby="{t} {d}" '
                f'font-family="system-ui,-apple-system,Segoe UI,Roboto,Helvetica,Arial,sans-serif" '
                f'font-size="{f(FONT)}" fill="{TEXT}">'
                f'<title id="{t}">{q(title)}</title><desc id="{d}">{q(desc)}</desc>'
                f'<rect width="100%" height="100%" fill="#fff"/>'
                + "".join(self.parts) + "</svg>")


__all__ = ["Chart", "Scale", "nice_ticks", "tick_label", "expand", "text_width", "q", "f", "FONT", "SMALL"]
