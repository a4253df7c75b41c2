"""The HTML report of an audit run: ``OUT/report/<run_id>.html`` plus ``OUT/report/index.html``.

``write_report(out, run_id=None)`` builds the page of one run (default: the latest) from the Delta tables
under ``out`` only (``jobs.report.data``: deltalake on the driver, no Spark, no store), draws the charts
(``jobs.report.plots``: inline SVG written from the aggregates) and renders the page (``jobs.report.html``), then refreshes the
index (every finished run, newest first, linking the pages that exist).  The audit calls it at the end of each
run (``jobs.audit.run``; ``--no-report`` turns it off); ``./spark-submit.sh report --out DIR [--run-id ID]``
(re)builds it for any past run.

The page depends only on the run's rows and the runs before it (the trend stops at the run), so rebuilding a
past run gives the same bytes.  Files are written to a temporary name and renamed (a reader never sees half a
page).
"""
from __future__ import annotations

import json
from typing import Optional

import pandas as pd

from jobs.delta import outfs
from jobs.report import html as H
from jobs.report import plots as P
from jobs.report.data import STATE_ORDER, URGENT_ROWS, ReportData, gather, read_runs

REPORT_DIR = "report"
INDEX = "index.html"
GROUP_TOPIC_ROWS = 30
FINDING_ROWS = 40


def _run_section(d: ReportData) -> str:
    r = d.run
    n_findings = d.table_rows["audit_anomalies"]
    rows = [
        ("run id", H.e(r["run_id"])), ("as of", H.e(H.iso(r["as_of"]))), ("mode", H.e(r["mode"])),
        ("brokers", H.e(", ".join(r["brokers"]))),
        ("stores", "<br>".join(f"<code>{H.e(s)}</code>" for s in r["stores"])),
        ("CommitLog", f"{int(r['commitlog_bytes']) / (1 << 20):,.1f} MiB in {int(r['store_files']):,} store "
                      f"files ({int(r['store_bytes']) / (1 << 20):,.1f} MiB)"),
        ("run took", f"{float(r['elapsed_s']):,.1f} s (started {H.e(H.iso(r['started_at']))}; "
                     f"Delta writer {H.e(r['writer'])}, Spark {H.e(r['spark_version'])})"),
        ("store fingerprint", f"<code>{H.e(r['store_fingerprint'][:16])}</code>"),
    ]
    kv = "<table class=\"kv\">" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"
    states = d.states.sum(axis=0)
    box = H.kpis([("transactions", int(d.states.to_numpy().sum()), "transactions"),
                  ("still PREPARED", int(states.get("PREPARED", 0)), "prepared"),
                  ("on the check-back work list", d.table_rows["check_back_worklist"], "check_back"),
                  ("on the recovery work list", d.table_rows["recovery_worklist"], "recovery"),
                  ("findings", n_findings, "findings")])
    prof_rows = []
    for p in d.profiles.sort_values("broker").itertuples(index=False):
        ev = "; ".join(str(x) for x in (p.evidence if p.evidence is not None else []))
        note = "" if p.profile == p.detected_profile else ' <span class="warn">(forced)</span>'
        prof_rows.append([H.td(p.broker), f"<td>{H.e(p.profile)}{note}</td>", H.td(p.detected_profile),
                          H.td(ev)])
    profiles = H.table(["broker", "profile used", "detected", "evidence"], prof_rows) if prof_rows else \
        '<p class="muted">(no profiles table for this run)</p>'
    phases = dict(r["phase_seconds"] or {})
    order = [p for p in H.PHASE_ORDER if p in phases] + sorted(p for p in phases if p not in H.PHASE_ORDER)
    ph = H.table(["phase", "seconds"], ([H.td(p), f'<td class="n">{phases[p]:,.2f}</td>'] for p in order))
    fnd = H.table(["finding code", "source", "rows"],
                  ([H.td(f.code), H.td(f.source), H.num(f.rows, f"finding.{f.code}.{f.source}")]
                   for f in d.findings.head(FINDING_ROWS).itertuples(index=False))) if len(d.findings) else \
        '<p class="muted">No findings: every record decoded cleanly and every piece of evidence was ' \
        'attributed.</p>'
    return H.section("run", f"{box}\n{kv}\n<h3>Detected profiles</h3>\n{profiles}\n<h3>Phase timings</h3>\n"
                            f"{ph}\n<h3>Findings</h3>\n{fnd}")


def _states_section(d: ReportData) -> str:
    s = d.states
    rows = [[H.td(b)] + [H.num(s.at[b, c], f"state.{b}.{c}") for c in s.columns]
            + [H.num(int(s.loc[b].sum()), f"broker.{b}")] for b in s.index]
    tbl = H.table(["broker", *s.columns, "total"], rows)
    return H.section("states", H.chart(P.states_by_broker(s)) + tbl)


def _prepared_section(d: ReportData) -> str:
    p = d.prepared
    if not len(p):
        return H.section("prepared", '<p>No PREPARED transactions: every transaction is decided.</p>'
                                     '<span data-metric="prepared_rows" hidden>0</span>')
    past = int((p["to_deadline_ms"] <= 0).sum())
    intro = (f'<p><b data-metric="prepared_rows">{len(p):,}</b> PREPARED, <b data-metric="past_deadline">'
             f'{past:,}</b> already past their deadline. The table lists the {min(len(p), URGENT_ROWS)} most '
             f'urgent (soonest deadline first).</p>')
    rows = []
    for u in d.urgent.itertuples(index=False):
        key = f'<td><code class="key">{H.e(u.transaction_key)}</code></td>'
        rows.append([H.td(u.broker), key, H.td(u.keys), H.td(u.producer_group), H.td(u.real_topic),
                     H.td(H.hours(u.age_ms), "n"),
                     H.td(H.hours(u.to_deadline_ms), "n warn" if (u.to_deadline_ms or 0) <= 0 else "n"),
                     H.td("" if pd.isna(u.check_times) else int(u.check_times)),
                     H.td(", ".join(u.flags) if u.flags is not None else ""), H.td(u.what_to_do, "todo")])
    tbl = H.table(["broker", "transaction key", "keys", "producer group", "topic", "age", "to deadline",
                   "checks", "flags", "what to do"], rows)
    return H.section("prepared", intro + "<h3>Age against deadline</h3>"
                     + H.chart(P.prepared_age_vs_deadline(p))
                     + "<h3>How often the broker already asked</h3>"
                     + H.chart(P.check_times_histogram(p))
                     + "<h3>Most urgent</h3>" + tbl)


def _flags_section(d: ReportData) -> str:
    f = d.flags
    flags = H.table(["flag", "transactions", "findings", "what it means"],
                    ([f'<td class="code"><code>{H.e(r.code)}</code></td>',
                      H.num(r.transactions, f"flag.{r.code}"),
                      H.num(r.findings, f"flag_finding.{r.code}"), H.td(r.description)]
                     for r in f.itertuples(index=False))) if len(f) else \
        '<p>No transaction carries a flag.</p>'
    g = d.group_topic
    multi = sorted(set(g.loc[g["topics_of_group"] > 1, "producer_group"])) if len(g) else []
    note = (f'<p class="warn">Producer groups sending to several topics: {H.e(", ".join(multi))}. The broker '
            f'asks any producer of the group about a transaction, which may not know it.</p>') if multi else \
        '<p class="muted">Every producer group sends to a single topic.</p>'
    gt = H.table(["producer group", "topic", "transactions", "flagged", "topics of the group"],
                 ([H.td(r.producer_group), H.td(r.real_topic), H.num(r.transactions), H.num(r.flagged),
                   H.num(r.topics_of_group, None)] for r in g.head(GROUP_TOPIC_ROWS).itertuples(index=False)))
    more = f'<p class="muted">({len(g) - GROUP_TOPIC_ROWS} more pairs not shown)</p>' \
        if len(g) > GROUP_TOPIC_ROWS else ""
    return H.section("flags", flags + "<h3>Per producer group and topic</h3>" + note + gt + more)


def _store_map_section(d: ReportData) -> str:
    parts = [H.chart(P.store_map(d.store_maps))]
    for m in d.store_maps:
        sizes = {b: s for b, s in m.files}
        rows = []
        for base in sorted(set(sizes) | set(x for x in m.findings["file_base"].dropna().astype("int64"))):
            in_file = m.findings[m.findings["file_base"] == base]
            size = sizes.get(base, 0)
            ranges = m.ranges[(m.ranges["start"] < base + size) & (m.ranges["end"] > base)] if size else \
                m.ranges.iloc[0:0]
            codes = ", ".join(f"{c} x{n}" for c, n in sorted(in_file["code"].value_counts().items()))
            rng = "; ".join(f"[{int(s):,}, {int(e):,})"
                            for s, e in zip(ranges["start"], ranges["end"], strict=True))
            rows.append([f"<td><code>{base:020d}</code></td>",
                         H.td(f"{size / (1 << 20):,.1f} MiB" if size else "?"),
                         H.num(len(in_file), f"map.{m.broker}.{base}"), H.td(codes), H.td(rng)])
        unplaced = m.findings[m.findings["file_base"].isna()]
        note = "" if m.files_recorded else \
            '<p class="muted">This run did not record its CommitLog files: only files with findings are ' \
            'listed.</p>'
        extra = f'<p class="muted">{len(unplaced)} finding(s) at offsets before the first file.</p>' \
            if len(unplaced) else ""
        parts.append(f"<h3>{H.e(m.broker)}</h3>{note}"
                     + (H.table(["CommitLog file", "size", "findings", "codes", "INDEX_INCOMPLETE ranges"],
                                rows) if rows else '<p class="muted">(no CommitLog files)</p>') + extra)
    return H.section("store-map", "\n".join(parts))


def _trend_series(history):
    def state(name):
        return [int((s or {}).get(name, 0)) for s in history["state_counts"]]

    def rows(name):
        return [int((t or {}).get(name, 0)) for t in history["table_rows"]]

    flagged = [int(sum((f or {}).values())) for f in history["flag_counts"]]
    return [("transactions", [int(x) for x in history["transactions"]]), ("PREPARED", state("PREPARED")),
            ("DISCARDED", state("DISCARDED")), ("flag hits", flagged), ("findings", rows("audit_anomalies")),
            ("check-back", rows("check_back_worklist"))]


def _trend_section(d: ReportData) -> str:
    h = d.history
    series = _trend_series(h)
    rows = []
    for i in range(len(h) - 1, -1, -1):
        rid = h.at[i, "run_id"]
        rows.append([f'<td><a href="{H.e(H.page_name(rid))}">{H.e(rid)}</a></td>',
                     H.td(H.iso(h.at[i, "as_of"]))]
                    + [H.num(vals[i]) for _, vals in series])
    chart = H.chart(P.trend(h, series)) if len(h) > 1 else \
        '<p class="muted">First run in this output directory: nothing to compare with yet.</p>'
    return H.section("trend", chart + H.table(["run", "as of", *[n for n, _ in series]], rows))


def _checks_section(d: ReportData) -> Optional[str]:
    c = d.checks
    if c is None:
        return None
    if not len(c):
        return H.section("checks", '<p class="muted">The check_results table has no rows for this run.</p>')
    counts = c["status"].value_counts() if "status" in c.columns else {}
    summary = " ".join(f'<span class="badge {H.e(s)}">{H.e(s)} <span data-metric="check.{H.e(s)}">'
                       f'{int(counts.get(s, 0))}</span></span>' for s in ("FAIL", "ERROR", "WARN", "PASS"))
    cols = [x for x in ("check", "metric", "broker", "level", "status", "value", "condition",
                        "previous_value", "message") if x in c.columns]
    rows = []
    for r in c.to_dict("records"):
        cells = []
        for col in cols:
            v = r.get(col)
            if col == "status":
                cells.append(f'<td><span class="badge {H.e(v)}">{H.e(v)}</span></td>')
            else:
                cells.append(H.td(json.dumps(v, default=str) if isinstance(v, (list, dict)) else v))
        rows.append(cells)
    return H.section("checks", f"<p>{summary}</p>" + H.table(cols, rows))


def render_run(d: ReportData) -> str:
    nav = f'<a href="{INDEX}">all runs</a>'
    secs = [_run_section(d), _states_section(d), _prepared_section(d), _flags_section(d),
            _store_map_section(d), _trend_section(d)]
    checks = _checks_section(d)
    if checks:
        secs.append(checks)
    return H.document(f"TxAudit run {d.run['run_id']}", nav, secs)


def render_index(out: str, report_dir: str, runs: Optional[pd.DataFrame] = None) -> str:
    """The index page: every finished run of ``out`` (``runs``: read_runs(out), when already read)."""
    runs = read_runs(out) if runs is None else runs
    rows = []
    for i in range(len(runs) - 1, -1, -1):
        r = runs.iloc[i]
        page = H.page_name(r["run_id"])
        exists = outfs.exists(outfs.join(report_dir, page))
        link = f'<a href="{H.e(page)}">{H.e(r["run_id"])}</a>' if exists \
            else f'{H.e(r["run_id"])} <span class="muted">(no page: ./spark-submit.sh report --run-id)</span>'
        sc = r["state_counts"] or {}
        rows.append([f"<td>{link}</td>", H.td(H.iso(r["as_of"])), H.td(r["mode"]),
                     H.td(", ".join(r["brokers"])),
                     H.num(r["transactions"]), H.num(sc.get("PREPARED", 0)),
                     H.num((r["table_rows"] or {}).get("audit_anomalies", 0))])
    latest = runs.iloc[-1]["run_id"] if len(runs) else None
    head = f'<p>Latest run: <a href="{H.e(H.page_name(latest))}">{H.e(latest)}</a></p>' if latest else ""
    body = ('<section id="runs"><h2>Audit runs</h2><p class="explain">Every finished audit run of this '
            'output directory, newest first; open one for its full report.</p>' + head
            + H.table(["run", "as of", "mode", "brokers", "transactions", "PREPARED", "findings"], rows)
            + "</section>")
    return H.document("TxAudit runs", f"<span>{H.e(out)}</span>", [body])


def _write(path: str, text: str) -> None:
    outfs.write_bytes(path, text.encode("utf-8"))     # a temporary file renamed over it; one PUT remote


def write_report(out: str, run_id: Optional[str] = None, *, index: bool = True) -> str:
    """Write ``OUT/report/<run_id>.html`` (default: latest run) and refresh the index; returns the page
    path."""
    out = outfs.root(out)
    data = gather(out, run_id)
    report_dir = outfs.join(out, REPORT_DIR)
    outfs.makedirs(report_dir)
    page = outfs.join(report_dir, H.page_name(data.run["run_id"]))
    _write(page, render_run(data))
    if index:
        _write(outfs.join(report_dir, INDEX), render_index(out, report_dir, data.runs))
    return page


__all__ = ["write_report", "render_run", "render_index", "REPORT_DIR", "INDEX", "STATE_ORDER"]
