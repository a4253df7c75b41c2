"""The report's charts as inline SVG, written directly from the aggregated data (``jobs.report.svg``).

Every function takes plain pandas / Python data from ``jobs.report.data`` and returns one standalone
``<svg>`` element (or None when there is nothing to plot) with a ``<title>`` and a ``<desc>`` that states the
chart's numbers in words (what a screen reader reads).  Bars, spans and points carry a ``<title>`` of their
own (the browser's tooltip; a scatter of more than ``MANY_POINTS`` distinct points draws one dot per 2 px
cell, without tooltips, so a store with many PREPARED transactions keeps a page of about a megabyte).
Deterministic: the same data gives the same bytes.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pandas as pd

from jobs.report.svg import Chart, Scale, expand, nice_ticks, q, text_width, tick_label

STATE_COLORS = {"COMMITTED": "#4c9a5f", "ROLLED_BACK": "#8c8c8c", "DISCARDED": "#c0504d",
                "PREPARED": "#e8a33d", "UNKNOWN_DAMAGED": "#7b3f99"}
OTHER_COLOR = "#6a7fb5"
SERIES_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
HOUR_MS = 3600 * 1000
WIDTH = 760.0
RIGHT = 16.0            # right margin
MIB = float(1 << 20)
MANY_POINTS = 2000      # above: scatter points on a 2 px grid, without a tooltip each


def _left(labels: Sequence[str], ylabel: bool) -> float:
    return (26.0 if ylabel else 8.0) + max([text_width(s) for s in labels] + [12.0]) + 10.0


def _num(v: float) -> str:
    return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.2f}"


def states_by_broker(states: pd.DataFrame) -> str:
    """Horizontal stacked bars: one bar per broker, one segment per state."""
    brokers = [str(b) for b in states.index]
    cols = [str(c) for c in states.columns]
    vals = states.to_numpy(dtype=float).reshape(len(brokers), len(cols))
    totals = vals.sum(axis=1) if len(brokers) else np.zeros(0)
    c = Chart("states", WIDTH, 0)
    left = _left(brokers, False)
    top = c.legend([("box", STATE_COLORS.get(s, OTHER_COLOR), s) for s in cols], left, 16,
                   WIDTH - left - RIGHT) + 6
    row = 32.0
    bottom = top + row * max(1, len(brokers))
    xmax = float(totals.max()) if len(totals) else 0.0
    ticks = nice_ticks(0.0, max(xmax, 1.0), integer=True)
    ticks = ticks + [ticks[-1] + ticks[1] - ticks[0]] if ticks[-1] < xmax else ticks
    x = Scale(0.0, ticks[-1], left, WIDTH - RIGHT)
    c.x_axis(x, ticks, bottom, top, "transactions")
    for i, b in enumerate(brokers):
        y0, acc = top + i * row + row * 0.2, 0.0
        for j, s in enumerate(cols):
            n = vals[i, j]
            if n > 0:
                c.rect(x(acc), y0, x(acc + n) - x(acc), row * 0.6, STATE_COLORS.get(s, OTHER_COLOR),
                       tip=f"{b}: {s} {_num(n)}")
            acc += n
        c.text(left - 8, y0 + row * 0.3 + 4, b, anchor="end")
    c.line(left, top, left, bottom)
    c.height = bottom + 44
    desc = "; ".join(f"{b}: " + ", ".join(f"{s} {_num(vals[i, j])}" for j, s in enumerate(cols))
                     + f" (total {_num(totals[i])})" for i, b in enumerate(brokers)) or "no brokers"
    return c.document("Transactions per state and broker", "Stacked horizontal bars, one per broker, one "
                      "segment per state; x: transactions. " + desc + ".")


def _unit(span_ms: float) -> Tuple[str, float]:
    """minutes for a store audited shortly after its broker stopped, hours or days otherwise"""
    if span_ms < 2 * HOUR_MS:
        return "minutes", 60_000.0
    if span_ms < 96 * HOUR_MS:
        return "hours", float(HOUR_MS)
    return "days", 24.0 * HOUR_MS


def prepared_age_vs_deadline(prepared: pd.DataFrame) -> Optional[str]:
    """Age (x) against time left until the broker discards it / retention may delete it (y, negative = past
    its deadline): the lower a point, the more urgent."""
    p = prepared[prepared["deadline_ms"].notna()]
    if not len(p):
        return None
    age_ms = p["age_ms"].to_numpy(dtype=float)
    left_ms = p["to_deadline_ms"].to_numpy(dtype=float)
    both = np.concatenate([age_ms, left_ms])
    both = both[np.isfinite(both)]
    unit, div = _unit(float(np.abs(both).max()) if len(both) else 0.0)
    age, left = age_ms / div, left_ms / div
    ok = np.isfinite(age) & np.isfinite(left)
    past = ok & (left <= 0)
    before = ok & ~past
    groups = [(sel, color, f"{label} ({int(sel.sum())})") for sel, color, label in
              ((before, "#e8a33d", "before its deadline"), (past, "#c0504d", "past its deadline")) if sel.any()]
    x0, x1 = expand(float(age[ok].min()), float(age[ok].max())) if ok.any() else (0.0, 1.0)
    ys = np.append(left[ok], 0.0)
    y0, y1 = expand(float(ys.min()), float(ys.max()))
    xt, yt = nice_ticks(x0, x1), nice_ticks(y0, y1)
    c = Chart("prepared-age", WIDTH, 0)
    lm = _left([tick_label(v, yt) for v in yt], True)
    top = c.legend([("dot", color, label) for _, color, label in groups], lm, 16, WIDTH - lm - RIGHT) + 8
    bottom = top + 260.0
    x, y = Scale(x0, x1, lm, WIDTH - RIGHT), Scale(y0, y1, bottom, top)
    c.x_axis(x, xt, bottom, top, f"age ({unit} since the producer sent it)")
    c.y_axis(y, yt, lm, WIDTH - RIGHT, f"{unit} left until deadline")
    c.line(lm, y(0.0), WIDTH - RIGHT, y(0.0), stroke="#444", width=0.8, extra=' stroke-dasharray="5 3"')
    for sel, color, _ in groups:
        a_s, l_s = age[sel], left[sel]
        grid = 2.0 if len(a_s) > MANY_POINTS else 0.5            # one circle per grid cell
        cells = np.stack([np.round(x.many(a_s) / grid), np.round(y.many(l_s) / grid)], axis=1)
        cells, first, count = np.unique(cells, axis=0, return_index=True, return_counts=True)
        if len(cells) > MANY_POINTS:                                # a dense cloud: no tooltip per point
            pts = [f'<circle cx="{cx * grid:g}" cy="{cy * grid:g}" r="3"/>' for cx, cy in cells.tolist()]
        else:
            pts = [f'<circle cx="{cx * grid:g}" cy="{cy * grid:g}" r="3"><title>'
                   + (f"{n} transactions here: " if n > 1 else "")
                   + f"age {a_s[k]:,.1f} {unit}, {l_s[k]:,.1f} {unit} left until the deadline</title></circle>"
                   for (cx, cy), k, n in zip(cells.tolist(), first.tolist(), count.tolist(), strict=True)]
        c.add(f'<g fill="{color}" fill-opacity="0.85">' + "".join(pts) + "</g>")
    c.height = bottom + 44
    n_past, n_before = int(past.sum()), int(before.sum())
    desc = (f"Scatter plot of {int(ok.sum())} PREPARED transactions with a deadline: x is the age in {unit}, "
            f"y the {unit} left until the deadline (dashed line: the deadline). {n_before} before their "
            f"deadline, {n_past} past it.")
    if ok.any():
        desc += (f" Ages {age[ok].min():,.1f} to {age[ok].max():,.1f} {unit}; time left "
                 f"{left[ok].min():,.1f} to {left[ok].max():,.1f} {unit}.")
    return c.document("Age of PREPARED transactions against time left until their deadline", desc)


def check_times_histogram(prepared: pd.DataFrame) -> Optional[str]:
    """How many times the broker already asked the producer (TRANSACTION_CHECK_TIMES), PREPARED only."""
    if not len(prepared):
        return None
    ct = prepared["check_times"]
    labels, counts = [], []
    if ct.isna().any():
        labels.append("none recorded")
        counts.append(int(ct.isna().sum()))
    for v, n in ct.dropna().astype(int).value_counts().sort_index().items():
        labels.append(str(v))
        counts.append(int(n))
    yt = nice_ticks(0.0, float(max(counts)), target=5, integer=True)
    yt = yt + [yt[-1] + yt[1] - yt[0]] if yt[-1] < max(counts) else yt
    lm = _left([f"{int(v):,}" for v in yt], True)
    slot = max(48.0, max(text_width(s) for s in labels) + 12)
    width = max(300.0, lm + slot * len(labels) + RIGHT)
    c = Chart("check-times", width, 0)
    top, bottom = 16.0, 16.0 + 200.0
    y = Scale(0.0, yt[-1], bottom, top)
    c.y_axis(y, yt, lm, width - RIGHT, "PREPARED transactions")
    slot = (width - RIGHT - lm) / len(labels)
    for i, (lab, n) in enumerate(zip(labels, counts, strict=True)):
        cx = lm + slot * (i + 0.5)
        c.rect(cx - slot * 0.3, y(n), slot * 0.6, bottom - y(n), "#6a7fb5", tip=f"checked {lab}: {n:,}")
        c.text(cx, y(n) - 4, f"{n:,}", anchor="middle", size=11)
        c.line(cx, bottom, cx, bottom + 4)
        c.text(cx, bottom + 16, lab, anchor="middle")
    c.line(lm, bottom, width - RIGHT, bottom)
    c.text((lm + width - RIGHT) / 2, bottom + 34, "check times", anchor="middle")
    c.height = bottom + 44
    desc = "Bar chart of PREPARED transactions by how often the broker already asked the producer: " + \
        ", ".join(f"{lab}: {n:,}" for lab, n in zip(labels, counts, strict=True)) + "."
    return c.document("How often the broker already asked (check times)", desc)


def store_map(maps) -> Optional[str]:
    """One row per broker: its CommitLog files as grey blocks (offset axis, MiB), INDEX_INCOMPLETE ranges as
    orange spans, findings as red ticks."""
    maps = [m for m in maps if m.files or len(m.findings) or len(m.ranges)]
    if not maps:
        return None
    edges: List[float] = []
    for m in maps:
        edges += [v for b, s in m.files if s for v in (b, b + s)]
        edges += [float(v) for v in m.ranges["start"]] + [float(v) for v in m.ranges["end"]]
        edges += [float(v) for v in m.findings["offset"]]
    lo, hi = (min(edges) / MIB, max(edges) / MIB) if edges else (0.0, 1.0)
    x0, x1 = expand(lo, hi, pad=0.02, min_span=max(hi - lo, 1.0) if hi > lo else 1.0)
    xt = nice_ticks(x0, x1)
    brokers = [str(m.broker) for m in maps]
    c = Chart("store-map", WIDTH, 0)
    lm = _left(brokers, False)
    top = c.legend([("box", "#d9d9d9", "CommitLog file"), ("box", "#f0b45a", "INDEX_INCOMPLETE range (scanned)"),
                    ("tick", "#c0504d", "finding")], lm, 16, WIDTH - lm - RIGHT) + 6
    row = 48.0
    bottom = top + row * len(maps)
    x = Scale(x0, x1, lm, WIDTH - RIGHT)
    c.x_axis(x, xt, bottom, top, "CommitLog offset (MiB)")
    desc = []
    for i, m in enumerate(maps):
        cy = top + row * (i + 0.5)
        for b, s in m.files:
            if s:
                c.rect(x(b / MIB), cy - row * 0.3, max(x((b + s) / MIB) - x(b / MIB), 1.0), row * 0.6,
                       "#d9d9d9", tip=f"{b:020d}: {s / MIB:,.1f} MiB",
                       extra=' stroke="#777" stroke-width="0.6"')
        for s, e in zip(m.ranges["start"], m.ranges["end"], strict=True):
            c.rect(x(s / MIB), cy - row * 0.22, max(x(e / MIB) - x(s / MIB), 1.0), row * 0.44, "#f0b45a",
                   tip=f"INDEX_INCOMPLETE [{int(s):,}, {int(e):,})", extra=' fill-opacity="0.8"')
        ticks: Dict[float, List[str]] = {}
        for off, code in zip(m.findings["offset"], m.findings["code"], strict=True):
            ticks.setdefault(round(x(float(off) / MIB) * 2) / 2, []).append(f"{code} at {int(off):,}")
        for px, what in ticks.items():
            tip = what[0] if len(what) == 1 else f"{len(what)} findings: " + "; ".join(what[:5]) + \
                ("; ..." if len(what) > 5 else "")
            c.line(px, cy - row * 0.3, px, cy + row * 0.3, stroke="#c0504d", width=1.2, tip=tip)
        c.text(lm - 8, cy + 4, m.broker, anchor="end")
        desc.append(f"{m.broker}: {len([f_ for f_ in m.files if f_[1]])} CommitLog file(s), {len(m.ranges)} "
                    f"INDEX_INCOMPLETE range(s), {len(m.findings)} finding(s)")
    c.line(lm, top, lm, bottom)
    c.height = bottom + 44
    return c.document("Store map: CommitLog files, scanned ranges and findings",
                      "One row per broker along the CommitLog offset in MiB: files as grey blocks, "
                      "INDEX_INCOMPLETE ranges (scanned) in orange, findings as red ticks. "
                      + "; ".join(desc) + ".")


def trend(history: pd.DataFrame, series: List[tuple]) -> Optional[str]:
    """The main counts across runs (x: run as-of), one line per ``(label, values)``."""
    n = len(history)
    if n < 1:
        return None
    runs = [str(r) for r in history["run_id"]]
    step = max(1, n // 10)
    shown = list(range(0, n, step))
    ymax = max([float(v) for _, vals in series for v in vals] + [1.0])
    yt = nice_ticks(0.0, ymax, target=5, integer=True)
    yt = yt + [yt[-1] + yt[1] - yt[0]] if yt[-1] < ymax else yt
    widest = max(text_width(runs[i]) for i in shown)
    slot = (WIDTH - RIGHT) / (n + 1)        # about the x distance of the first tick from the left margin
    lm = max(_left([f"{int(v):,}" for v in yt], True), math.cos(math.radians(20)) * widest - slot / 2 + 6)
    c = Chart("trend", WIDTH, 0)
    top = c.legend([("line", SERIES_COLORS[i % len(SERIES_COLORS)], lab) for i, (lab, _) in enumerate(series)],
                   lm, 16, WIDTH - lm - RIGHT) + 8
    bottom = top + 220.0
    x, y = Scale(-0.5, n - 0.5, lm, WIDTH - RIGHT), Scale(0.0, yt[-1], bottom, top)
    c.y_axis(y, yt, lm, WIDTH - RIGHT, "count")
    c.line(lm, bottom, WIDTH - RIGHT, bottom)
    for i in shown:
        px = x(i)
        c.line(px, bottom, px, bottom + 4)
        c.text(px, bottom + 14, runs[i], anchor="end",
               extra=f' transform="rotate(-20 {px:.1f} {bottom + 14:.1f})"')
    label_drop = math.sin(math.radians(20)) * widest + 16
    c.text((lm + WIDTH - RIGHT) / 2, bottom + label_drop + 12, "run (oldest first)", anchor="middle")
    for k, (lab, vals) in enumerate(series):
        color = SERIES_COLORS[k % len(SERIES_COLORS)]
        pts = [(x(i), y(float(v))) for i, v in enumerate(vals)]
        c.add(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="'
              + " ".join(f"{px:.1f},{py:.1f}" for px, py in pts) + '"/>')
        c.add(f'<g fill="{color}">' + "".join(
            f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5"><title>{q(runs[i])}: {q(lab)} '
            f'{int(vals[i]):,}</title></circle>' for i, (px, py) in enumerate(pts)) + "</g>")
    c.height = bottom + label_drop + 22
    last = "; ".join(f"{lab} {int(vals[-1]):,}" for lab, vals in series)
    desc = (f"Line chart of the main counts across {n} run(s), oldest first ({runs[0]} to {runs[-1]}); "
            f"latest run: {last}.")
    return c.document("Main counts across runs", desc)


__all__ = ["states_by_broker", "prepared_age_vs_deadline", "check_times_histogram", "store_map", "trend",
           "STATE_COLORS"]
