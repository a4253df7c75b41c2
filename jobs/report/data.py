"""What the HTML report of one audit run shows, gathered from the run's Delta tables under ``--out``.

Spark-free: the tables are read on the driver with ``deltalake`` (delta-rs) + pyarrow/pandas, filtered to the
run's ``run_id`` partition.  The tables with a row per transaction (``transactions``, the work lists) are
read one record batch at a time and folded (jobs.report.txstats): the report holds counts, the most urgent
PREPARED rows and four numbers per PREPARED transaction, never a broker's transactions; findings, profiles
and ``audit_runs`` are read whole.  Nothing here reads a store,
so a past run's report can be rebuilt from ``--out`` alone (``./spark-submit.sh report``).  Every number the
report prints comes from :func:`gather` (the tests compare them with the tables).

Table directories: ``audit_runs`` is found under ``--out`` (its default name, else any Delta table with its
columns); the run's row names every other table's directory (``table_paths``), which is used when it still
exists, else ``<out>/<basename>`` (an output directory that was moved or copied).  ``check_results`` (written
by the ``check`` subcommand) is optional.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from jobs.delta import outfs
from jobs.delta.tables import column_names, read_batches, read_table
from jobs.delta.tables import is_delta as _is_delta
from jobs.reconstruct.params import STATES
from jobs.report.txstats import TX_COLUMNS, fold
from schemas.runs import AUDIT_RUNS

RUNS_TABLE = "audit_runs"
CHECKS_TABLE = "check_results"
URGENT_ROWS = 25            # most urgent PREPARED transactions listed
STATE_ORDER = STATES
_RANGE = re.compile(r"\[(\d+), (\d+)\)")          # INDEX_INCOMPLETE detail: "... CommitLog [start, end) ..."
_COMMITLOG_NAME = re.compile(r"(?:^|/)(\d{20})$")  # a CommitLog file path: the 20-digit base offset


class ReportDataError(Exception):
    """No run to report on (missing audit_runs table or run id); the message names what was looked for."""


@dataclass
class StoreMap:
    """One broker's CommitLog: files (base offset, size) and what the run found where."""

    broker: str
    files: List[tuple]                      # (base_offset, size), offset order; inferred when not recorded
    files_recorded: bool                    # False: files inferred from finding positions (older runs)
    findings: pd.DataFrame                  # code, source, offset, file_base (decoder + reconstruct findings)
    ranges: pd.DataFrame                    # code, start, end (INDEX_INCOMPLETE and file gaps)


@dataclass
class ReportData:
    out: str
    run: dict                                # the audit_runs row
    history: pd.DataFrame                    # runs up to and including this one (as_of order)
    profiles: pd.DataFrame                   # broker, profile, detected_profile, evidence
    states: pd.DataFrame                     # broker x state counts (rows: brokers, columns: STATE_ORDER)
    prepared: pd.DataFrame                   # every PREPARED transaction (urgency order)
    urgent: pd.DataFrame                     # URGENT_ROWS most urgent of them, with what to do
    flags: pd.DataFrame                      # code, transactions, findings, description
    group_topic: pd.DataFrame                # producer_group, real_topic, transactions, flagged, topics
    findings: pd.DataFrame                   # code, source, rows
    store_maps: List[StoreMap]
    checks: Optional[pd.DataFrame]           # check_results rows of the run, or None when check never ran
    runs: Optional[pd.DataFrame] = None      # every finished run of ``out`` (the index lists them)
    table_rows: Dict[str, int] = field(default_factory=dict)   # logical table -> rows of this run read


def find_runs_table(out: str) -> str:
    """The audit_runs table under ``out`` (default name, else any Delta table with audit_runs' columns)."""
    default = outfs.join(out, RUNS_TABLE)
    if _is_delta(default):
        return default
    need = set(AUDIT_RUNS.names)
    for name in sorted(outfs.listdir(out)):
        path = outfs.join(out, name)
        if _is_delta(path) and need <= set(column_names(path, RUNS_TABLE)):
            return path
    raise ReportDataError(f"no audit_runs table under {out} (not an audit output directory, or no run "
                          f"finished there)")


def read_runs(out: str) -> pd.DataFrame:
    """Every finished run of ``out`` (one audit_runs row each), oldest as-of first."""
    df = read_table(find_runs_table(out), what=RUNS_TABLE).to_pandas(maps_as_pydicts="strict")
    return df.sort_values(["as_of_ms", "run_id"], kind="stable").reset_index(drop=True)


def _table_path(out: str, run: dict, logical: str) -> Optional[str]:
    paths = dict(run.get("table_paths") or {})
    recorded = paths.get(logical)
    for cand in ((recorded, outfs.join(out, outfs.basename(recorded))) if recorded else ()) + \
            (outfs.join(out, logical),):
        if cand and _is_delta(cand):
            return cand
    return None


def read_run_table(path: Optional[str], run_id: str, columns=None) -> Optional[pa.Table]:
    """The rows of ``run_id`` in the Delta table at ``path`` (None when there is no such table)."""
    return read_table(path, columns=columns, need=("run_id",), run_id=run_id)


def _frame(table: Optional[pa.Table], columns: List[str]) -> pd.DataFrame:
    if table is None:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    return table.select([c for c in columns if c in table.column_names]).to_pandas()


def _what_to_do(row, checks: dict, recovery: dict) -> str:
    key = (row["broker"], row["transaction_key"])
    if key in recovery:
        action, reason = recovery[key]
        return f"{action}: {reason}"
    if key in checks:
        rank, priority = checks[key]
        return (f"check back now (CHECK_TRANSACTION_STATE to the producer group; work-list rank {rank}, "
                f"{priority})")
    return "wait: within the check timeout; the broker will ask the producer"


def _flags(per_tx: pd.Series, anomalies: pd.DataFrame) -> pd.DataFrame:
    from jobs.reconstruct.flags import FLAGS

    per_finding = anomalies.loc[anomalies["code"].isin(list(FLAGS)), "code"].value_counts() \
        if len(anomalies) else pd.Series(dtype="int64")
    codes = sorted(set(per_tx.index) | set(per_finding.index), key=lambda c: (-int(per_tx.get(c, 0)), c))
    return pd.DataFrame({
        "code": codes,
        "transactions": [int(per_tx.get(c, 0)) for c in codes],
        "findings": [int(per_finding.get(c, 0)) for c in codes],
        "description": [FLAGS.get(c, "(not in the flag registry)") for c in codes]})


def _recorded_files(run: dict) -> Dict[str, List[tuple]]:
    try:
        doc = json.loads(run.get("config_json") or "{}")
    except ValueError:
        return {}
    files = doc.get("commitlog_files") or {}
    return {b: [(int(base), int(size)) for base, size in fs] for b, fs in files.items()}


def _store_maps(run: dict, brokers: List[str], anomalies: pd.DataFrame) -> List[StoreMap]:
    recorded = _recorded_files(run)
    maps = []
    for broker in brokers:
        a = anomalies[anomalies["broker"] == broker] if len(anomalies) else anomalies
        ranges, points = [], []
        for r in a.itertuples(index=False):
            m = _RANGE.search(r.detail or "") if r.code == "INDEX_INCOMPLETE" else None
            if m:
                ranges.append((r.code, int(m.group(1)), int(m.group(2))))
                continue
            fm = _COMMITLOG_NAME.search(r.file or "")
            offset = r.physical_offset
            if offset is None or pd.isna(offset):
                if fm is None:
                    continue            # a consume-queue / config finding: not a CommitLog position
                offset = int(fm.group(1)) + int(0 if pd.isna(r.position) else r.position)
            points.append((r.code, r.source, int(offset)))
        files = recorded.get(broker)
        if not files:                   # an older run: the files the findings name, sizes unknown (0)
            bases = sorted({int(m.group(1)) for f in (a["file"] if len(a) else ())
                            for m in [_COMMITLOG_NAME.search(f or "")] if m})
            files = [(b, 0) for b in bases]
        starts = [b for b, _ in files]
        findings = pd.DataFrame(points, columns=["code", "source", "offset"])
        findings["file_base"] = [max([s for s in starts if s <= o], default=None) if starts else None
                                 for o in findings["offset"]]
        maps.append(StoreMap(broker=broker, files=list(files), files_recorded=broker in recorded,
                             findings=findings,
                             ranges=pd.DataFrame(ranges, columns=["code", "start", "end"])))
    return maps


def _matching(path: Optional[str], run_id: str, columns: List[str], keys: set) -> tuple:
    """(rows of ``run_id`` in the table at ``path`` whose transaction_key is one of ``keys``, as a frame of
    ``columns``; the run's row count), read a batch at a time."""
    found, rows = [], 0
    value_set = pa.array(sorted(keys), pa.string())
    for b in read_batches(path, columns=columns, need=("run_id",), run_id=run_id) or ():
        rows += b.num_rows
        hit = b.filter(pc.fill_null(pc.is_in(b.column("transaction_key"), value_set=value_set), False))
        if hit.num_rows:
            found.append(hit)
    return _frame(pa.Table.from_batches(found) if found else None, columns), rows


def _checks(out: str, run_id: str) -> Optional[pd.DataFrame]:
    path = outfs.join(out, CHECKS_TABLE)
    try:
        t = read_run_table(path, run_id)
    except Exception:                  # noqa: BLE001 - another engineer's table: never fail the report on it
        return None
    if t is None:
        return None
    df = t.to_pandas()
    order = [c for c in ("status", "check", "broker", "metric") if c in df.columns]
    rank = {"FAIL": 0, "ERROR": 1, "WARN": 2, "PASS": 3}
    if "status" in df.columns:
        df = df.assign(_r=df["status"].map(lambda s: rank.get(s, 4)))
        df = df.sort_values(["_r"] + order[1:], kind="stable").drop(columns="_r")
    return df.reset_index(drop=True)


def gather(out: str, run_id: Optional[str] = None) -> ReportData:
    """Everything the report of ``run_id`` (default: the latest run by as-of) shows."""
    out = outfs.root(out)
    runs = read_runs(out)
    if not len(runs):
        raise ReportDataError(f"no finished run in {find_runs_table(out)}")
    if run_id is None:
        pos = len(runs) - 1
    else:
        hits = runs.index[runs["run_id"] == run_id]
        if not len(hits):
            known = ", ".join(runs["run_id"].tolist()[-5:])
            raise ReportDataError(f"run id {run_id!r} has no audit_runs row in {out} (latest: {known})")
        pos = int(hits[-1])
    run = runs.iloc[pos].to_dict()
    rid, as_of_ms = run["run_id"], int(run["as_of_ms"])
    brokers = list(run["brokers"])

    def table(logical, columns):
        t = read_run_table(_table_path(out, run, logical), rid)
        return _frame(t, columns), (0 if t is None else t.num_rows)

    tx = fold(read_batches(_table_path(out, run, "transactions"), columns=TX_COLUMNS, need=("run_id",),
                           run_id=rid), brokers, as_of_ms, URGENT_ROWS)
    urgent = tx.urgent
    wanted = set(urgent["transaction_key"].tolist())
    cb, n_cb = _matching(_table_path(out, run, "check_back_worklist"), rid,
                         ["broker", "transaction_key", "urgency_rank", "priority"], wanted)
    rec, n_rec = _matching(_table_path(out, run, "recovery_worklist"), rid,
                           ["broker", "transaction_key", "action", "reason"], wanted)
    an, n_an = table("audit_anomalies", ["broker", "code", "source", "physical_offset", "file", "position",
                                         "detail"])
    prof, _ = table("profiles", ["broker", "profile", "detected_profile", "evidence"])

    checks = {(r.broker, r.transaction_key): (int(r.urgency_rank), r.priority) for r in cb.itertuples()}
    recovery = {(r.broker, r.transaction_key): (r.action, r.reason) for r in rec.itertuples()}
    urgent["what_to_do"] = [_what_to_do(r, checks, recovery) for _, r in urgent.iterrows()]
    findings = (an.groupby(["code", "source"]).size().rename("rows").reset_index()
                .sort_values(["rows", "code", "source"], ascending=[False, True, True], kind="stable")
                .reset_index(drop=True)) if len(an) else pd.DataFrame(columns=["code", "source", "rows"])
    return ReportData(
        out=out, run=run, history=runs.iloc[:pos + 1].reset_index(drop=True), profiles=prof,
        states=tx.states, prepared=tx.prepared, urgent=urgent, flags=_flags(tx.flag_counts, an),
        group_topic=tx.group_topic, findings=findings, store_maps=_store_maps(run, brokers, an),
        checks=_checks(out, rid), runs=runs,
        table_rows={"transactions": tx.rows, "check_back_worklist": n_cb, "recovery_worklist": n_rec,
                    "audit_anomalies": n_an})


__all__ = ["gather", "read_runs", "read_run_table", "find_runs_table", "ReportData", "StoreMap",
           "ReportDataError", "URGENT_ROWS", "STATE_ORDER"]
