"""The report's charts: matplotlib (no display, no network) rendered to SVG text.

Figures are built with ``matplotlib.figure.Figure`` directly, never through pyplot: importing this module (the
audit does, at the end of a run) must not switch the backend of a notebook or script that uses pyplot itself,
and no global figure registry is touched.

Deterministic output, so a rebuilt report is byte-identical: a fixed ``svg.hashsalt`` (matplotlib otherwise
derives element ids from a random salt), no ``Date`` metadata, and fonts drawn as paths (``svg.fonttype`` =
``path``: the SVG needs no font file).  Every function takes plain pandas / Python data from
``jobs.report.data`` and returns one ``<svg>`` document (XML prolog, DOCTYPE and RDF metadata stripped: the
report embeds it as a data URI and those carry URLs that look like references).
"""
from __future__ import annotations

import io
import re
from typing import List, Optional

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

STATE_COLORS = {"COMMITTED": "#4c9a5f", "ROLLED_BACK": "#8c8c8c", "DISCARDED": "#c0504d",
                "PREPARED": "#e8a33d", "UNKNOWN_DAMAGED": "#7b3f99"}
OTHER_COLOR = "#6a7fb5"
_RC = {"svg.hashsalt": "txaudit-report", "svg.fonttype": "path", "font.size": 9, "axes.titlesize": 10,
       "axes.spines.top": False, "axes.spines.right": False, "figure.dpi": 96}
_STRIP = (re.compile(r"<\?xml[^>]*\?>\s*"), re.compile(r"<!DOCTYPE[^>]*>\s*"),
          re.compile(r"<metadata>.*?</metadata>\s*", re.S))
HOUR_MS = 3600 * 1000


def _svg(fig) -> str:
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    for rx in _STRIP:
        text = rx.sub("", text)
    return text


def _subplots(w: float, h: float):
    fig = Figure(figsize=(w, h))
    return fig, fig.subplots()


def _spread(values: np.ndarray, set_lim) -> None:
    """Widen an axis whose points are (nearly) equal: matplotlib would zoom into the last digits and label
    ticks like 24.838064."""
    v = values[np.isfinite(values)]
    if not len(v):
        return
    lo, hi = float(v.min()), float(v.max())
    need = max(0.1 * max(abs(lo), abs(hi)), 1.0)
    if hi - lo < need:
        mid = (lo + hi) / 2
        set_lim(mid - need / 2, mid + need / 2)


def states_by_broker(states: pd.DataFrame) -> str:
    """Horizontal stacked bars: one bar per broker, one segment per state."""
    with matplotlib.rc_context(_RC):
        fig, ax = _subplots(8, 0.6 + 0.45 * max(1, len(states)))
        left = np.zeros(len(states))
        ys = np.arange(len(states))
        for state in states.columns:
            vals = states[state].to_numpy(dtype=float)
            ax.barh(ys, vals, left=left, color=STATE_COLORS.get(state, OTHER_COLOR), label=state, height=0.6)
            left += vals
        ax.set_yticks(ys, [str(b) for b in states.index])
        ax.invert_yaxis()
        ax.set_xlabel("transactions")
        ax.legend(ncol=len(states.columns), loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        return _svg(fig)


def prepared_age_vs_deadline(prepared: pd.DataFrame) -> Optional[str]:
    """Age (x) against time left until the broker discards it / retention may delete it (y, negative = past
    its deadline): the lower a point, the more urgent."""
    p = prepared[prepared["deadline_ms"].notna()]
    if not len(p):
        return None
    age_ms = p["age_ms"].to_numpy(dtype=float)
    left_ms = p["to_deadline_ms"].to_numpy(dtype=float)
    # minutes for a store audited shortly after its broker stopped, hours or days otherwise
    span = float(np.nanmax(np.abs(np.concatenate([age_ms, left_ms])))) if len(p) else 0.0
    unit, div = (("minutes", 60_000.0) if span < 2 * HOUR_MS else ("hours", float(HOUR_MS))
                 if span < 96 * HOUR_MS else ("days", 24.0 * HOUR_MS))
    with matplotlib.rc_context(_RC):
        fig, ax = _subplots(8, 3.6)
        age, left = age_ms / div, left_ms / div
        past = left <= 0
        for sel, color, label in ((~past, "#e8a33d", "before its deadline"),
                                  (past, "#c0504d", "past its deadline")):
            if sel.any():
                ax.scatter(age[sel], left[sel], s=14, color=color, label=f"{label} ({int(sel.sum())})")
        ax.axhline(0, color="#444", lw=0.8, ls="--")
        ax.ticklabel_format(useOffset=False, style="plain")
        _spread(age, ax.set_xlim)
        _spread(np.append(left, 0.0), ax.set_ylim)
        ax.set_xlabel(f"age ({unit} since the producer sent it)")
        ax.set_ylabel(f"{unit} left until deadline")
        ax.legend(frameon=False, loc="best")
        return _svg(fig)


def check_times_histogram(prepared: pd.DataFrame) -> Optional[str]:
    """How many times the broker already asked the producer (TRANSACTION_CHECK_TIMES), PREPARED only."""
    if not len(prepared):
        return None
    ct = prepared["check_times"]
    known = ct.dropna().astype(int)
    with matplotlib.rc_context(_RC):
        labels, counts = [], []
        if (ct.isna()).any():
            labels.append("none recorded")
            counts.append(int(ct.isna().sum()))
        for v, n in known.value_counts().sort_index().items():
            labels.append(str(v))
            counts.append(int(n))
        fig, ax = _subplots(min(8.0, 2.0 + 0.5 * len(counts)), 2.8)
        ax.bar(range(len(counts)), counts, color="#6a7fb5", width=0.6)
        ax.set_xticks(range(len(counts)), labels)
        ax.set_xlabel("check times")
        ax.set_ylabel("PREPARED transactions")
        return _svg(fig)


def store_map(maps) -> Optional[str]:
    """One row per broker: its CommitLog files as grey blocks (offset axis, MiB), INDEX_INCOMPLETE ranges as
    orange spans, findings as red ticks."""
    maps = [m for m in maps if m.files or len(m.findings) or len(m.ranges)]
    if not maps:
        return None
    with matplotlib.rc_context(_RC):
        fig, ax = _subplots(8, 0.9 + 0.7 * len(maps))
        mib = float(1 << 20)
        for y, m in enumerate(maps):
            spans = [(b / mib, max(s, 1) / mib) for b, s in m.files if s]
            if spans:
                ax.broken_barh(spans, (y - 0.3, 0.6), facecolors="#d9d9d9", edgecolors="#777", lw=0.6)
            if len(m.ranges):
                ranges = [(s / mib, max(e - s, 1) / mib)
                          for s, e in zip(m.ranges["start"], m.ranges["end"], strict=True)]
                ax.broken_barh(ranges, (y - 0.22, 0.44), facecolors="#f0b45a", alpha=0.8)
            if len(m.findings):
                ax.vlines(m.findings["offset"].to_numpy(dtype=float) / mib, y - 0.3, y + 0.3,
                          colors="#c0504d", lw=1.2)
        ax.set_yticks(range(len(maps)), [m.broker for m in maps])
        ax.set_ylim(len(maps) - 0.5, -0.5)
        ax.set_xlabel("CommitLog offset (MiB)")
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color="#d9d9d9", label="CommitLog file"),
                           Patch(color="#f0b45a", label="INDEX_INCOMPLETE range (scanned)"),
                           Patch(color="#c0504d", label="finding")],
                  ncol=3, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        return _svg(fig)


def trend(history: pd.DataFrame, series: List[tuple]) -> Optional[str]:
    """The main counts across runs (x: run as-of), one line per ``(label, values)``."""
    if len(history) < 1:
        return None
    with matplotlib.rc_context(_RC):
        fig, ax = _subplots(8, 3)
        x = np.arange(len(history))
        for label, values in series:
            ax.plot(x, values, marker="o", ms=3, label=label)
        ticks = [str(r) for r in history["run_id"]]
        step = max(1, len(ticks) // 10)
        ax.set_xticks(x[::step], ticks[::step], rotation=20, ha="right")
        ax.set_xlim(-0.5, len(history) - 0.5)
        ax.set_ylabel("count")
        ax.legend(frameon=False, ncol=len(series), loc="lower center", bbox_to_anchor=(0.5, 1.0))
        return _svg(fig)


__all__ = ["states_by_broker", "prepared_age_vs_deadline", "check_times_histogram", "store_map", "trend"]
