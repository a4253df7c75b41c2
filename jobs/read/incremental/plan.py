"""``audit --incremental``: continue from the previous completed run instead of re-reading all the CommitLog.

This module plans a run (the previous run, its state, whether continuing is safe: :func:`plan_incremental`);
jobs/read/incremental/read.py reads the carried rows and this run's evidence, jobs/audit/state.py writes
the new state (schemas/state.py).

What the reducer (jobs/reconstruct/reducer.py) reads is small evidence: the transaction-relevant CommitLog records, the
op bodies, the decoder findings, the transaction consume queues, statetable, redolog, consumer offsets and the
store listing.  Only the CommitLog part costs a scan.  An incremental run therefore

1. re-reads the small inputs whole (consume queues, statetable, redolog, offsets, the non-CommitLog findings:
   what ``jobs.read.frames.load_store_frames`` gives in ``full`` mode),
2. reads only the CommitLog from ``resume_offset`` to the end, with the same one-pass reader and the same
   ``split_bytes`` cells as a full scan (``jobs.sources.formats.tx_scan_batches``),
3. adds the evidence the previous run carried in its ``audit_state*`` tables (schemas/state.py) for the
   CommitLog below ``resume_offset``, minus what a full audit of today's store could no longer see (rows in
   files deleted by retention),
4. runs the unchanged reducer, and writes the new state.

Two ways to do it, as for a full audit: when the rows fit the driver (``reconstruct.LOCAL_MAX_ROWS``), 1-2
are the ONE Spark job of ``jobs.read.full`` planned from ``resume_offset`` (:func:`read_local`), 3 is an
Arrow concatenation on the driver, the reducer runs there and the state is written from there with deltalake
(no Spark job after the read); otherwise the DataFrame plan (:func:`evidence`) and executor-side reduction.

Why that equals a full audit of today's store: a full scan cuts every CommitLog file into ``split_bytes``
cells and decodes each cell from its own bytes (a record belongs to the cell it starts in). ``resume_offset``
is the start of the newest transaction-relevant record the previous run decoded, R, in the cell starting at S:
every cell below S, and cell S's records below R, lie wholly below that record, i.e. in bytes that were
already written then, and decode to the same rows and findings today as long as those bytes are unchanged --
which the state checks (edge hashes of every CommitLog file below the offset, a hash of the 64 KiB before it).
Cell S is read from R on (its findings tagged with S, as a full scan's): a cell walks the TOTALSIZE chain from
its first record, and R is on that chain when cell S reported nothing (no damage, no resync) between S and R
-- else the state resumes at S (``incremental_state._resume``); R must also still be a self-verifying record
(else the run reads from S: ``_is_record_start``), so a walk started there takes the very chain cell S takes.
What is read again (from R, or S) replaces whatever the previous run saw at its end of data (a torn record, a
file cut short, blank space). Rows in files retention deleted are dropped, not kept: a full audit no longer
sees them and flags their transactions EVIDENCE_IN_DELETED_RANGE from the store's new first offset, so
dropping is what keeps the two equal. The carried evidence is the open transactions' records: a settled
transaction (jobs/reconstruct/settle.py) is carried as its reduced row, its records dropped, and when this
run's reduction names one (later evidence touched it) the run is done again as a full audit
(``FINAL_REOPENED``); docs/ARCHITECTURE.md lists the RocketMQ rules that make this rare.

When continuing is not safe the run is a full audit (and writes a new state): the reason is in
``audit_runs.config_json`` (``incremental``) and an ``INCREMENTAL_FALLBACK`` finding per broker.  Reasons:
FALLBACK_REASONS below.  Incremental state is kept for ``full`` mode only (indexed mode reads through the
indexes, its result does not decompose by CommitLog offset); DLedger stores are not continued.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jobs.delta import outfs
from jobs.delta.tables import read_table
from jobs.read.spec import ReadSpec
from schemas.state import AUDIT_STATE, STATE_FORMAT_VERSION, STATE_TABLES
from txlog_io.errors import AnomalyKind, UsageError

NO_PREVIOUS_RUN = "NO_PREVIOUS_RUN"        # no completed run under --out
STATE_MISSING = "STATE_MISSING"            # the previous run wrote no audit_state (it was not incremental)
STATE_FORMAT = "STATE_FORMAT"              # audit_state of another STATE_FORMAT_VERSION, or a state table
                                           # of a Delta protocol this build does not carry (deletion vectors)
BROKERS_CHANGED = "BROKERS_CHANGED"        # the previous run audited other broker names
STORE_MOVED = "STORE_MOVED"                # a broker's store root is another directory
CONFIG_CHANGED = "CONFIG_CHANGED"          # mode, split bytes, bodies, profile or parameters changed
STORE_TRUNCATED = "STORE_TRUNCATED"        # the CommitLog now ends below the resume offset
STORE_REWRITTEN = "STORE_REWRITTEN"        # CommitLog bytes below the resume offset differ (replaced store)
MODE_UNSUPPORTED = "MODE_UNSUPPORTED"      # indexed mode, or a DLedger store
FINAL_REOPENED = "FINAL_REOPENED"          # later evidence named a transaction the state carries as settled
FALLBACK_REASONS = (NO_PREVIOUS_RUN, STATE_MISSING, STATE_FORMAT, BROKERS_CHANGED, STORE_MOVED,
                    CONFIG_CHANGED, STORE_TRUNCATED, STORE_REWRITTEN, MODE_UNSUPPORTED, FINAL_REOPENED)
PREFIX_BYTES = 64 << 10
#: config_document keys that do not change a result (output names, where the settings came from)
_NOT_SEMANTIC = ("tables", "conf_file", "config_sources", "delta_writer")


def config_hash(doc: dict) -> str:
    """sha256 of the settings that change an audit's result (``as_of`` excluded: every run has its own)."""
    d = {k: v for k, v in doc.items() if k not in _NOT_SEMANTIC}
    d["params"] = {p: {k: v for k, v in vals.items() if k != "as_of_ms"}
                   for p, vals in (doc.get("params") or {}).items()}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


@dataclass
class Plan:
    """What an ``--incremental`` run does: continue (``reason`` None) from ``read_from`` per broker, or fall
    back to a full audit for ``reason``."""

    out: str
    run_id: str
    hash: str
    previous_run: Optional[str] = None
    reason: Optional[str] = None
    detail: str = ""
    read_from: Dict[str, int] = field(default_factory=dict)
    #: broker -> the start of the ``split_bytes`` cell holding ``read_from`` (== read_from at a cell start):
    #: that cell is read from ``read_from`` on, its findings below it carried (jobs/read/incremental/read.py)
    resume_cell: Dict[str, int] = field(default_factory=dict)
    #: broker -> CommitLog files still present below read_from: [(path, base, limit position), ...]
    carried_files: Dict[str, list] = field(default_factory=dict)
    state_written: bool = False
    #: the carried rows (Arrow, read by ``evidence`` or ``read_local``): records, findings, op_bodies (None
    #: with bodies); the settled transactions ``final`` (Arrow, or read by ``evidence`` a DataFrame) and their
    #: ``final_facts``
    carried: Dict[str, Any] = field(default_factory=dict)
    #: this run's own rows when it read through the one-job read (``read_local``): its state's new part
    fresh: Optional[object] = None          # a jobs.read.full.LocalRead
    #: broker -> the previous state's ``unit_files_json`` (consume-queue files whose findings it carries)
    prev_units: Dict[str, dict] = field(default_factory=dict)
    #: this run's unit-file carry (the one-job read only)
    units: Optional[object] = None          # a jobs.read.incremental.read.UnitCarry
    #: broker -> the previous state's record segments: [[run id, limit offset or None], ...]
    prev_segments: Dict[str, list] = field(default_factory=dict)
    #: broker -> this run's state's record segments (set by jobs.audit.state.write_state)
    segments: Dict[str, list] = field(default_factory=dict)
    #: the stores as planned (``layout_info``: what the state's headers describe)
    layout_info: list = field(default_factory=list)
    #: the state write started after the reduction, while the outputs are written (jobs.audit.run): a Future
    early_state: Optional[object] = None
    #: broker -> the previous state's settled-transaction segments (run ids) and facts per CommitLog file
    prev_final_segments: Dict[str, list] = field(default_factory=dict)
    prev_final_facts: Dict[str, dict] = field(default_factory=dict)
    #: broker -> this run's state's settled-transaction segments (set by jobs.audit.state.write_state)
    final_segments: Dict[str, list] = field(default_factory=dict)
    #: the reduction's transactions, profiles and consume offsets (Arrow from the driver's reduction; from
    #: the distributed one the transactions and linked evidence as DataFrames): what jobs.audit.state settles
    reduced: Optional[object] = None

    @property
    def continuing(self) -> bool:
        return self.reason is None

    def describe(self) -> dict:
        """The ``incremental`` entry of ``audit_runs.config_json``."""
        return {"continued": self.continuing, "previous_run": self.previous_run, "fallback": self.reason,
                "detail": self.detail, "read_from": dict(self.read_from), "state_written": self.state_written,
                "units_carried": {b: len(p) for b, p in (self.units.skip if self.units else {}).items()},
                "read_in_driver": bool(getattr(self.fresh, "in_driver", False))}


def _fallback(plan: Plan, reason: str, detail: str) -> Plan:
    plan.reason, plan.detail, plan.read_from, plan.carried_files = reason, detail, {}, {}
    plan.resume_cell = {}
    plan.prev_units, plan.prev_segments = {}, {}
    plan.prev_final_segments, plan.prev_final_facts = {}, {}
    return plan


def _commitlog_end(store) -> int:
    return max((base + size for _, base, size in store.commitlog_files), default=0)


def _prefix_sha(path: str, pos: int) -> str:
    h = hashlib.sha256()
    if pos > 0:
        from txlog_io.positional import open_input  # a local file, or ranged GETs of a store in a bucket

        with open_input(path) as f:
            start = max(0, pos - PREFIX_BYTES)
            f.seek(start)
            h.update(f.read(pos - start))
    return h.hexdigest()


def _is_record_start(path: str, base: int, pos: int) -> bool:
    """Does a self-verifying record start at file position ``pos`` (txlog_io.commitlog_decode's rule, the one
    a range starting there follows)?  A state resumes at a record start inside a cell; if the record is not
    there any more, a range from ``pos`` would silently skip to the next one where a full scan reports
    damage."""
    from txlog_io.commitlog_decode import next_boundary
    from txlog_io.positional import PositionalFile

    with PositionalFile(path, "CommitLog file") as reader:
        return next_boundary(reader, pos, base, limit=pos + 1) == pos


def _is_dledger(store) -> bool:
    from txlog_io.dledger import is_dledger_data_file

    return bool(store.commitlog_files) and is_dledger_data_file(store.commitlog_files[0][0])


def plan_incremental(spec: ReadSpec, out: str, run_id: str, runs_table: str, layout_info: Sequence,
                     doc: dict, reopened: Optional[str] = None) -> Plan:
    """Driver only (no Spark): the previous completed run under ``out`` (its ``audit_runs`` table named
    ``runs_table``) and whether its state can be continued for today's stores.  ``doc``: the run's config
    document (``jobs.audit.plan.config_document``).  Raises UsageError when ``run_id`` is the previous run's
    (the state would be replaced by the run continuing from it).  ``reopened``: a continuation of the same
    run found later evidence naming a settled transaction (jobs.reconstruct.settle.reopened): this is the
    full audit it is done again as."""
    from jobs.delta import sink as delta_sink
    from jobs.delta.sink import named_table
    from schemas.runs import AUDIT_RUNS

    plan = Plan(out=out, run_id=run_id, hash=config_hash(doc), layout_info=list(layout_info))
    runs = read_table(delta_sink.table_path(out, named_table(AUDIT_RUNS, runs_table)))
    done = [r for r in (runs.to_pylist() if runs is not None else []) if r["status"] == "COMPLETE"]
    if not done:
        return _fallback(plan, NO_PREVIOUS_RUN, f"no completed audit run under {out}")
    prev = max(done, key=lambda r: (r["finished_at"], r["run_id"]))
    if prev["run_id"] == run_id:
        raise UsageError(f"--incremental: run id {run_id!r} is the latest completed run under "
                         f"{out}; an incremental run continues from it under a new --run-id "
                         f"(or none: the default is derived from --as-of)")
    plan.previous_run = prev["run_id"]
    if reopened is not None:
        return _fallback(plan, FINAL_REOPENED, reopened)
    if spec.mode != "full":
        return _fallback(plan, MODE_UNSUPPORTED, f"mode {spec.mode}: incremental state is kept for full "
                                                 f"mode only (--mode full)")
    dledger = [s.broker for s in layout_info if _is_dledger(s)]
    if dledger:
        return _fallback(plan, MODE_UNSUPPORTED, f"DLedger store(s) {', '.join(dledger)} are not continued")
    if sorted(prev["brokers"]) != sorted(spec.brokers):
        return _fallback(plan, BROKERS_CHANGED, f"previous run {prev['run_id']} audited brokers "
                                                f"{sorted(prev['brokers'])}, this run "
                                                f"{sorted(spec.brokers)}")
    foreign = _foreign_protocol(out)
    if foreign is not None:
        return _fallback(plan, STATE_FORMAT, foreign)
    state = read_table(delta_sink.table_path(out, AUDIT_STATE), run_id=prev["run_id"])
    headers = {r["broker"]: r for r in (state.to_pylist() if state is not None else [])}
    if set(headers) != set(spec.brokers):
        return _fallback(plan, STATE_MISSING, f"previous run {prev['run_id']} wrote no audit_state for "
                                              f"{sorted(set(spec.brokers) - set(headers))} (it was not "
                                              f"an --incremental run)")
    for store in layout_info:
        h = headers[store.broker]
        problem = _check_store(plan, store, h, spec.split_bytes)
        if problem is not None:
            return _fallback(plan, *problem)
    return plan


def _foreign_protocol(out: str) -> Optional[str]:
    """Why the state tables under ``out`` cannot be carried as this build reads them, or None.  The carried
    rows are read from their tables' data files (``jobs.read.incremental.read``), which is exact for the
    protocol ``jobs.delta.sink`` writes (reader version 1: no deletion vectors, no column mapping).  A state
    table another Delta writer upgraded (``delta.enableDeletionVectors`` and a DELETE, column mapping, ...)
    may hide or rename rows in ways its files do not show: it is not continued."""
    import deltalake

    from jobs.delta import sink as delta_sink

    for table in STATE_TABLES.values():
        path = delta_sink.table_path(out, table)
        if not outfs.is_delta(path):
            continue
        p = deltalake.DeltaTable(path, storage_options=outfs.delta_options(path)).protocol()
        if p.min_reader_version > 1 or p.reader_features:
            features = ", ".join(p.reader_features or []) or "none named"
            return (f"{table.name}: Delta reader version {p.min_reader_version} (reader features: {features}), "
                    f"written by another Delta writer; this build carries state tables of reader version 1 only")
    return None


def _check_store(plan: Plan, store, h: dict, split: int) -> Optional[Tuple[str, str]]:
    """None when ``store`` continues ``h`` (and plan.read_from / carried_files set), else (reason, detail)."""
    from txlog_io.fingerprint import file_print

    b = store.broker
    if h["format_version"] != STATE_FORMAT_VERSION:
        return STATE_FORMAT, f"{b}: audit_state format {h['format_version']}, this build " \
                             f"{STATE_FORMAT_VERSION}"
    if h["store_root"] != store.root:
        return STORE_MOVED, f"{b}: store root was {h['store_root']}, now {store.root}"
    if h["config_hash"] != plan.hash:
        return CONFIG_CHANGED, f"{b}: the settings changed since the previous run (mode, split bytes, " \
                               f"bodies, profile, broker overrides or parameters)"
    resume, end = int(h["resume_offset"]), _commitlog_end(store)
    if end < resume:
        return STORE_TRUNCATED, f"{b}: the CommitLog ends at {end}, below the previous run's resume offset " \
                                f"{resume}"
    files = {os.path.relpath(p, store.root).replace(os.sep, "/"): (p, base, size)
             for p, base, size in store.commitlog_files}
    first = min((base for _, base, _ in files.values()), default=end)
    for rel, (base, size, edge) in json.loads(h["below_files_json"]).items():
        now = files.get(rel)
        if now is None:
            if base + size > first:        # not the oldest files: retention deletes from the start only
                return STORE_REWRITTEN, f"{b}: CommitLog file {rel} below the resume offset is gone while " \
                                        f"older files remain"
            continue
        if now[1] != base or now[2] != size or file_print(store.root, rel).edge_sha256 != edge:
            return STORE_REWRITTEN, f"{b}: CommitLog file {rel} changed since the previous run (size or " \
                                    f"first/last 64 KiB differ)"
    if h["resume_file"] is not None and h["resume_file"] in files:
        path, base, _ = files[h["resume_file"]]
        if base != h["resume_file_base"] or _prefix_sha(path, resume - base) != h["resume_prefix_sha256"]:
            return STORE_REWRITTEN, f"{b}: the 64 KiB before the resume offset {resume} in " \
                                    f"{h['resume_file']} changed since the previous run"
    elif h["resume_file"] is not None and resume > first:
        return STORE_REWRITTEN, f"{b}: CommitLog file {h['resume_file']} holding the resume offset is gone " \
                                f"while older files remain"
    read_from, cell = max(resume, first), max(resume, first)
    if read_from == resume and h["resume_file"] in files:
        path, base, _ = files[h["resume_file"]]
        cell = base + (resume - base) // split * split
        if cell != resume and not _is_record_start(path, base, resume - base):
            read_from = cell        # the record the state resumes at is not there: read its whole cell again
    plan.resume_cell[b] = cell
    plan.prev_units[b] = json.loads(h["unit_files_json"] or "{}")
    plan.prev_segments[b] = json.loads(h["record_segments_json"])
    plan.prev_final_segments[b] = json.loads(h["final_segments_json"] or "[]")
    plan.prev_final_facts[b] = json.loads(h["final_facts_json"] or "{}")
    plan.read_from[b] = read_from
    plan.carried_files[b] = [(p, base, read_from - base) for p, base, _ in store.commitlog_files
                             if base < read_from]
    return None


# ------------------------------------------------------------------------------------------------------------
# the fallback finding
# ------------------------------------------------------------------------------------------------------------

def _fallback_rows(plan: Plan, brokers: Sequence[str]) -> List[tuple]:
    """One INCREMENTAL_FALLBACK finding per broker (ANOMALIES_SOURCE rows: the reducer passes them to
    audit_anomalies)."""
    return [(b, AnomalyKind.INCREMENTAL_FALLBACK, outfs.join(plan.out, AUDIT_STATE.name), 0,
             f"--incremental ran a full audit: {plan.detail}", "a completed incremental run to continue from",
             plan.reason, "audit", None, None, None) for b in brokers]


def fallback_findings(spark, plan: Plan, brokers: Sequence[str]):
    """:func:`_fallback_rows` as a DataFrame."""
    from schemas.sources import ANOMALIES_SOURCE

    return spark.createDataFrame(_fallback_rows(plan, brokers), ANOMALIES_SOURCE.spark_schema())


__all__ = ["Plan", "plan_incremental", "config_hash", "fallback_findings", "FALLBACK_REASONS"]
