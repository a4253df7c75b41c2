"""HTML of the report: one self-contained page per run plus the index of runs.

Self-contained means the browser fetches nothing: CSS is inline, charts are inline ``<svg>`` elements
(``jobs.report.plots``; their ids are prefixed per chart, they reference nothing), the only font is the
system's.  The only links are to sibling pages of ``OUT/report/`` (index <-> runs).  Values
the tests compare with the tables carry ``data-metric`` attributes.  Nothing here depends on the wall clock,
so the same data renders to the same bytes.
"""
from __future__ import annotations

import datetime as dt
import html
import re
from typing import Iterable, List, Optional, Sequence

import pandas as pd

#: section id -> (title, the one-line explanation for a reader who does not know RocketMQ's internals)
SECTIONS = {
    "run": ("Run", "What was audited, as of when, how the store's RocketMQ version was recognised, and how "
                   "long each phase took."),
    "states": ("Transaction states per broker", "Every transactional message ends COMMITTED (delivered), "
               "ROLLED_BACK (dropped) or DISCARDED (the broker gave up asking); PREPARED ones are still "
               "undecided; UNKNOWN_DAMAGED ones were resolved, but the record saying how lies in damaged "
               "bytes."),
    "prepared": ("Undecided (PREPARED) transactions", "A PREPARED message waits for its producer to say "
                 "commit or rollback; the broker asks it periodically and throws the message away at its "
                 "deadline, so the closer to the deadline, the more urgent."),
    "flags": ("Flags", "Flags are the audit's named findings about single transactions; the description says "
              "what each means. A producer group sending to several topics is a known cause of wrong answers "
              "to the broker's check-back."),
    "store-map": ("Store map", "Where in the CommitLog (the broker's append-only message log, cut into "
                  "files) the audit found damaged records, gaps, or ranges its indexes did not cover and had "
                  "to scan."),
    "trend": ("Trend across runs", "The main counts of every finished run in this output directory up to "
              "this one: rising PREPARED or findings mean things are getting worse."),
    "checks": ("Data-quality checks", "Results of the `check` subcommand's rules for this run: FAIL and "
               "ERROR need attention, WARN is worth a look."),
}
PHASE_ORDER = ("plan", "read", "read.records", "read.anomalies", "reconstruct", "aggregate", "write")

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;
 color:#1d2330;background:#f6f7f9;font-size:14px;line-height:1.45}
header.top{background:#24324a;color:#fff;padding:14px 28px}
header.top h1{margin:0;font-size:20px}header.top a{color:#cfe0ff}
main{max-width:1180px;margin:0 auto;padding:8px 28px 40px}
section{background:#fff;border:1px solid #dde2ea;border-radius:6px;margin:18px 0;padding:12px 18px}
section h2{margin:4px 0 2px;font-size:17px}
p.explain{margin:0 0 10px;color:#556;font-style:italic}
table{border-collapse:collapse;margin:8px 0;font-size:13px}
th,td{border-bottom:1px solid #e4e7ee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef1f6}td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.kv th{width:190px}.muted{color:#778}.warn{color:#b4561b;font-weight:600}
.badge{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;font-weight:600}
.PASS{background:#dff3e3}.WARN{background:#fff0c9}.FAIL,.ERROR{background:#f9d6d5}
svg.chart{max-width:100%;height:auto;display:block;margin:6px 0}
code{font-size:12px;background:#f0f2f5;padding:0 3px;border-radius:2px}
code.key{word-break:break-all}td.todo{min-width:280px}td.code{white-space:nowrap}
.kpis{display:flex;gap:14px;flex-wrap:wrap;margin:8px 0}
.kpi{border:1px solid #dde2ea;border-radius:6px;padding:6px 14px;min-width:120px}
.kpi b{display:block;font-size:20px}
"""

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def page_name(run_id: str) -> str:
    """File name of a run's page (run ids may hold any character; ``/`` or ``..`` must not escape)."""
    return "run-" + _SAFE.sub("_", run_id) + ".html" if _SAFE.search(run_id) or run_id.startswith(".") \
        else run_id + ".html"


def e(value) -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return ""
    return html.escape(str(value), quote=True)


def num(value, metric: Optional[str] = None) -> str:
    attr = f' data-metric="{e(metric)}"' if metric else ""
    return f'<td class="n"{attr}>{int(value):,}</td>'


def chart(svg: Optional[str]) -> str:
    """An inline chart (its ``<title>``/``<desc>`` name it for assistive technology), or a placeholder."""
    if not svg:
        return '<p class="muted">(nothing to plot)</p>'
    return svg


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """``rows`` are already-rendered cells (``<td>...</td>``)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "\n".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'


def td(value, cls: str = "") -> str:
    return f'<td class="{cls}">{e(value)}</td>' if cls else f"<td>{e(value)}</td>"


def section(sid: str, body: str) -> str:
    title, explain = SECTIONS[sid]
    return (f'<section id="{sid}"><h2>{e(title)}</h2>\n<p class="explain">{e(explain)}</p>\n{body}\n'
            f"</section>")


def hours(ms) -> str:
    if ms is None or pd.isna(ms):
        return ""
    h = float(ms) / 3_600_000
    return f"{h:,.1f} h" if abs(h) < 48 else f"{h / 24:,.1f} d"


def iso(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (pd.Timestamp, dt.datetime)):
        return pd.Timestamp(value).tz_convert("UTC").strftime("%Y-%m-%d %H:%M:%S UTC") \
            if pd.Timestamp(value).tzinfo else pd.Timestamp(value).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def kpis(items: Sequence[tuple]) -> str:
    """``(label, value, metric)`` boxes."""
    return '<div class="kpis">' + "".join(
        f'<div class="kpi"><b data-metric="{e(m)}">{int(v):,}</b>{e(label)}</div>' for label, v, m in items) \
        + "</div>"


def document(title: str, nav: str, sections: List[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
            f"<title>{e(title)}</title>\n<style>{_CSS}</style></head>\n<body>\n"
            f'<header class="top"><h1>{e(title)}</h1>{nav}</header>\n<main>\n'
            + "\n".join(sections) + "\n</main>\n</body></html>\n")


__all__ = ["SECTIONS", "PHASE_ORDER", "page_name", "e", "num", "chart", "table", "td", "section", "hours",
           "iso", "kpis", "document"]
