"""``audit --incremental``: continue from the previous completed run instead of re-reading all the CommitLog.

What the reducer (jobs/txreduce.py) reads is small evidence: the transaction-relevant CommitLog records, the
op bodies, the decoder findings, the transaction consume queues, statetable, redolog, consumer offsets and the
store listing.  Only the CommitLog part costs a scan.  An incremental run therefore

1. re-reads the small inputs whole (consume queues, statetable, redolog, offsets, the non-CommitLog findings:
   what ``jobs.store_frames.load_store_frames`` gives in ``full`` mode),
2. reads only the CommitLog from ``resume_offset`` to the end, with the same one-pass reader and the same
   ``split_bytes`` cells as a full scan (``jobs.datasources.tx_scan_batches``),
3. adds the evidence the previous run carried in its ``audit_state*`` tables (schemas/state.py) for the
   CommitLog below ``resume_offset``, minus what a full audit of today's store could no longer see (rows in
   files deleted by retention),
4. runs the unchanged reducer, and writes the new state.

Two ways to do it, as for a full audit: when the rows fit the driver (``reconstruct.LOCAL_MAX_ROWS``), 1-2
are the ONE Spark job of ``jobs.full_read`` planned from ``resume_offset`` (:func:`read_local`), 3 is an
Arrow concatenation on the driver, the reducer runs there and the state is written from there with deltalake
(no Spark job after the read); otherwise the DataFrame plan (:func:`evidence`) and executor-side reduction.

Why that equals a full audit of today's store: a full scan cuts every CommitLog file into ``split_bytes``
cells and decodes each cell from its own bytes (a record belongs to the cell it starts in).  ``resume_offset``
is the start of the cell holding the newest transaction-relevant record the previous run decoded: every cell
below it lies wholly below that record, i.e. in bytes that were already written then, and decodes to the same
rows and findings today as long as those bytes are unchanged -- which the state checks (edge hashes of every
CommitLog file below the offset, a hash of the 64 KiB before it).  Cells from ``resume_offset`` on are
decoded again, so whatever the previous run saw at its end of data (a torn record, a file cut short, blank
space) is replaced by what is there now.  Rows in files retention deleted are dropped, not kept: a full audit
no longer sees them and flags their transactions EVIDENCE_IN_DELETED_RANGE from the store's new first offset,
so dropping is what keeps the two equal.  The carried evidence is every row, not only open transactions':
pruning final transactions would need a proof that none can still gain a flag.

When continuing is not safe the run is a full audit (and writes a new state): the reason is in
``audit_runs.config_json`` (``incremental``) and an ``INCREMENTAL_FALLBACK`` finding per broker.  Reasons:
FALLBACK_REASONS below.  Incremental state is kept for ``full`` mode only (indexed mode reads through the
indexes, its result does not decompose by CommitLog offset); DLedger stores are not continued.
"""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from jobs.delta_tables import read_table
from schemas.state import (
    AUDIT_STATE, CELL_OFFSET, STATE_FINDINGS, STATE_FORMAT_VERSION, STATE_OP_BODIES, STATE_RECORDS,
    STATE_TABLES,
)
from txlog_io.errors import AnomalyKind, UsageError

NO_PREVIOUS_RUN = "NO_PREVIOUS_RUN"        # no completed run under --out
STATE_MISSING = "STATE_MISSING"            # the previous run wrote no audit_state (it was not incremental)
STATE_FORMAT = "STATE_FORMAT"              # audit_state of another STATE_FORMAT_VERSION
BROKERS_CHANGED = "BROKERS_CHANGED"        # the previous run audited other broker names
STORE_MOVED = "STORE_MOVED"                # a broker's store root is another directory
CONFIG_CHANGED = "CONFIG_CHANGED"          # mode, split bytes, bodies, profile or parameters changed
STORE_TRUNCATED = "STORE_TRUNCATED"        # the CommitLog now ends below the resume offset
STORE_REWRITTEN = "STORE_REWRITTEN"        # CommitLog bytes below the resume offset differ (replaced store)
MODE_UNSUPPORTED = "MODE_UNSUPPORTED"      # indexed mode, or a DLedger store
FALLBACK_REASONS = (NO_PREVIOUS_RUN, STATE_MISSING, STATE_FORMAT, BROKERS_CHANGED, STORE_MOVED,
                    CONFIG_CHANGED, STORE_TRUNCATED, STORE_REWRITTEN, MODE_UNSUPPORTED)
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
    #: broker -> CommitLog files still present below read_from: [(path, base, limit position), ...]
    carried_files: Dict[str, list] = field(default_factory=dict)
    state_written: bool = False
    #: the carried rows (Arrow, read by ``evidence`` or ``read_local``): records, findings, op_bodies (None
    #: with bodies)
    carried: Dict[str, Optional[pa.Table]] = field(default_factory=dict)
    #: this run's own rows when it read through the one-job read (``read_local``): its state's new part
    fresh: Optional[object] = None          # a jobs.full_read.LocalRead
    #: broker -> the previous state's ``unit_files_json`` (consume-queue files whose findings it carries)
    prev_units: Dict[str, dict] = field(default_factory=dict)
    #: this run's unit-file carry (:class:`UnitCarry`; the one-job read only)
    units: Optional["UnitCarry"] = None

    @property
    def continuing(self) -> bool:
        return self.reason is None

    def describe(self) -> dict:
        """The ``incremental`` entry of ``audit_runs.config_json``."""
        return {"continued": self.continuing, "previous_run": self.previous_run, "fallback": self.reason,
                "detail": self.detail, "read_from": dict(self.read_from), "state_written": self.state_written,
                "units_carried": {b: len(p) for b, p in (self.units.skip if self.units else {}).items()}}


def _fallback(plan: Plan, reason: str, detail: str) -> Plan:
    plan.reason, plan.detail, plan.read_from, plan.carried_files = reason, detail, {}, {}
    plan.prev_units = {}
    return plan


class UnitCarry:
    """Which consume-queue files of non-transaction topics the one-job read skips, their findings carried.

    Such a file's findings depend on its own bytes only: ``decode_consumequeue`` checks each unit's values,
    the unit before a slice (same file) and the file's size; its rows are never the reducer's (only the
    half / op / discard queues' are, and those are always decoded again).  What looks across files -- unit
    chains, gaps and overlaps between neighbours, the store listing -- is the store task's
    (``datasources.store_anomalies``), which every run does again; a file retention deleted has no print
    now and is not carried.  A file is skipped when its print (size, mtime_ns, sha256 of its first and last
    64 KiB) equals the one the previous state recorded: the broker writes units through a mapping, which sets
    mtime.  Prints are taken BEFORE the read, so a file written during it differs next time."""

    def __init__(self, previous: Dict[str, dict]):
        self.previous = previous
        self.skip: Dict[str, frozenset] = {}
        self.prints: Dict[str, dict] = {}

    def seen(self, files: Dict[str, List[str]]) -> None:
        from txlog_io.fingerprint import file_print

        for broker, paths in files.items():
            prints, prev = {}, self.previous.get(broker, {})
            for path in paths:
                try:
                    fp = file_print("", path)
                except OSError:       # gone since the listing: decoded (and reported) as the read finds it
                    continue
                prints[path] = [fp.size, fp.mtime_ns, fp.edge_sha256]
            self.prints[broker] = prints
            self.skip[broker] = frozenset(p for p, fp in prints.items() if prev.get(p) == fp)


def _commitlog_end(store) -> int:
    return max((base + size for _, base, size in store.commitlog_files), default=0)


def _prefix_sha(path: str, pos: int) -> str:
    h = hashlib.sha256()
    if pos > 0:
        with open(path, "rb") as f:
            start = max(0, pos - PREFIX_BYTES)
            f.seek(start)
            h.update(f.read(pos - start))
    return h.hexdigest()


def _is_dledger(store) -> bool:
    from txlog_io.dledger import is_dledger_data_file

    return bool(store.commitlog_files) and is_dledger_data_file(store.commitlog_files[0][0])


def plan_incremental(options, layout_info: Sequence, doc: dict) -> Plan:
    """Driver only (no Spark): the previous completed run under ``options.out`` and whether its state can be
    continued for today's stores.  ``doc``: ``jobs.audit.config_document`` of this run.  Raises UsageError
    when this run's id is the previous run's (the state would be replaced by the run continuing from it)."""
    from jobs import delta_sink
    from jobs.audit_inputs import RUNS_TABLE, named_table
    from schemas.runs import AUDIT_RUNS

    plan = Plan(out=options.out, run_id=options.run_id, hash=config_hash(doc))
    runs_name = options.config.table_names.get(RUNS_TABLE, RUNS_TABLE)
    runs = read_table(delta_sink.table_path(options.out, named_table(AUDIT_RUNS, runs_name)))
    done = [r for r in (runs.to_pylist() if runs is not None else []) if r["status"] == "COMPLETE"]
    if not done:
        return _fallback(plan, NO_PREVIOUS_RUN, f"no completed audit run under {options.out}")
    prev = max(done, key=lambda r: (r["finished_at"], r["run_id"]))
    if prev["run_id"] == options.run_id:
        raise UsageError(f"--incremental: run id {options.run_id!r} is the latest completed run under "
                         f"{options.out}; an incremental run continues from it under a new --run-id "
                         f"(or none: the default is derived from --as-of)")
    plan.previous_run = prev["run_id"]
    if options.mode != "full":
        return _fallback(plan, MODE_UNSUPPORTED, f"mode {options.mode}: incremental state is kept for full "
                                                 f"mode only (--mode full)")
    dledger = [s.broker for s in layout_info if _is_dledger(s)]
    if dledger:
        return _fallback(plan, MODE_UNSUPPORTED, f"DLedger store(s) {', '.join(dledger)} are not continued")
    if sorted(prev["brokers"]) != sorted(options.brokers):
        return _fallback(plan, BROKERS_CHANGED, f"previous run {prev['run_id']} audited brokers "
                                                f"{sorted(prev['brokers'])}, this run "
                                                f"{sorted(options.brokers)}")
    state = read_table(delta_sink.table_path(options.out, AUDIT_STATE), run_id=prev["run_id"])
    headers = {r["broker"]: r for r in (state.to_pylist() if state is not None else [])}
    if set(headers) != set(options.brokers):
        return _fallback(plan, STATE_MISSING, f"previous run {prev['run_id']} wrote no audit_state for "
                                              f"{sorted(set(options.brokers) - set(headers))} (it was not "
                                              f"an --incremental run)")
    for store in layout_info:
        h = headers[store.broker]
        problem = _check_store(plan, store, h)
        if problem is not None:
            return _fallback(plan, *problem)
    return plan


def _check_store(plan: Plan, store, h: dict) -> Optional[Tuple[str, str]]:
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
    read_from = max(resume, first)
    plan.prev_units[b] = json.loads(h["unit_files_json"] or "{}")
    plan.read_from[b] = read_from
    plan.carried_files[b] = [(p, base, read_from - base) for p, base, _ in store.commitlog_files
                             if base < read_from]
    return None


# ------------------------------------------------------------------------------------------------------------
# Spark side: the evidence of an incremental run
# ------------------------------------------------------------------------------------------------------------

def _fallback_rows(plan: Plan, brokers: Sequence[str]) -> List[tuple]:
    """One INCREMENTAL_FALLBACK finding per broker (ANOMALIES_SOURCE rows: the reducer passes them to
    audit_anomalies)."""
    return [(b, AnomalyKind.INCREMENTAL_FALLBACK, os.path.join(plan.out, AUDIT_STATE.name), 0,
             f"--incremental ran a full audit: {plan.detail}", "a completed incremental run to continue from",
             plan.reason, "audit", None, None) for b in brokers]


def fallback_findings(spark, plan: Plan, brokers: Sequence[str]):
    """:func:`_fallback_rows` as a DataFrame."""
    from schemas.sources import ANOMALIES_SOURCE

    return spark.createDataFrame(_fallback_rows(plan, brokers), ANOMALIES_SOURCE.spark_schema())


def read_local(spark, plan: Plan, options, max_rows: int, timings: Optional[dict] = None):
    """The one-job read (jobs.full_read) of an incremental run: the CommitLog cells from ``plan.read_from``
    (the whole store when the plan falls back) and the unit files whole, with the carried rows (deltalake,
    driver) put before this run's -> a ``full_read.LocalRead`` for ``full_read.reduce_local``, or None when
    the rows exceed ``max_rows`` (the caller then takes the DataFrame plan, :func:`evidence`).  This run's
    own rows stay in ``plan.fresh``: ``write_state`` writes them with the carried ones, from the driver."""
    from jobs.full_read import LocalRead, read_local as one_job_read

    plan.carried, plan.fresh = {}, None
    plan.units = UnitCarry(plan.prev_units if plan.continuing else {})
    read = one_job_read(spark, options, max_rows, timings, start=plan.read_from if plan.continuing else None,
                        units=plan.units)
    if read is None:        # the DataFrame plan reads every unit file again: nothing of theirs is carried
        plan.units = None
        return None
    if not plan.continuing:
        plan.fresh = read
        fallback = pa.Table.from_pylist([dict(zip(read.anomalies.schema.names, r))
                                         for r in _fallback_rows(plan, options.brokers)],
                                        schema=read.anomalies.schema)
        return LocalRead(**dict(vars(read), anomalies=pa.concat_tables([read.anomalies, fallback])))
    c = _load_carried(plan, options)
    if read.rows + c["records"].num_rows + c["findings"].num_rows > max_rows:
        plan.carried, plan.units = {}, None
        return None
    plan.carried, plan.fresh = c, read
    # carried first: the rows in a full audit's order (the CommitLog below the resume offset comes first)
    return LocalRead(**dict(
        vars(read),
        commitlog=pa.concat_tables([_conform(c["records"], read.commitlog.schema), read.commitlog]),
        op_bodies=pa.concat_tables([_conform(c["op_bodies"], read.op_bodies.schema), read.op_bodies]),
        anomalies=pa.concat_tables([_conform(c["findings"], read.anomalies.schema), read.anomalies])))


def _load_carried(plan: Plan, options) -> Dict[str, Optional[pa.Table]]:
    return {"records": _carried(plan, STATE_RECORDS, "physical_offset"),
            "findings": _carried(plan, STATE_FINDINGS, None),
            "op_bodies": (None if options.include_bodies
                          else _carried(plan, STATE_OP_BODIES, "physical_offset"))}


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t``'s columns cast to ``schema`` (absent ones null)."""
    n = t.num_rows
    return pa.Table.from_arrays([t.column(f.name).cast(f.type) if f.name in t.column_names
                                 else pa.nulls(n, f.type) for f in schema], schema=schema)


def evidence(spark, plan: Plan, frames, options, persist):
    """(records, op_bodies or None, anomalies, scan_findings) for ``jobs.audit``: the whole store's when the
    plan falls back, else a scan of the CommitLog from ``read_from`` -- the carried rows below it are read
    into ``plan.carried`` (Arrow, driver; ``carried_input`` gives them to the reducer, ``write_state`` writes
    them on).  ``scan_findings``: the CommitLog decoder findings of this run's scan."""
    from jobs.audit_inputs import op_bodies_for, relevant_records
    from jobs.store_frames import split_tx_scan

    plan.carried = {}
    if not plan.continuing:
        persist(frames.scan)
        records = relevant_records(frames)
        anomalies = frames.anomalies.unionByName(fallback_findings(spark, plan, options.brokers))
        scan_findings = split_tx_scan(frames.scan)[1] if frames.scan is not None else None
        return records, op_bodies_for(spark, records, frames, options), anomalies, scan_findings
    from jobs.datasources import ANOMALIES_FORMAT, SIDE_SOURCES

    scan = persist(_tail_scan(spark, plan, frames.layout_info, options))
    new_records, new_findings = split_tx_scan(scan)
    new_records = relevant_records(SimpleNamespace(mode="full", commitlog=new_records))
    # the carried rows stay Arrow on the driver: the reducer and the state writer take them as they are
    plan.carried = _load_carried(plan, options)
    op_bodies = None
    if not options.include_bodies:
        op_bodies = op_bodies_for(spark, new_records, frames, options).select(*STATE_OP_BODIES.names)
    side = (spark.read.format(ANOMALIES_FORMAT)
            .options(paths=json.dumps(list(options.stores)), brokers=",".join(options.brokers),
                     split_bytes=str(int(options.config.split_bytes)),
                     sources=SIDE_SOURCES).load())
    return new_records, op_bodies, side.unionByName(new_findings), new_findings


def carried_rows(plan: Optional[Plan], name: str) -> int:
    """Rows of ``name`` (records, findings, op_bodies) the plan carries (0 when it does not continue)."""
    t = (plan.carried or {}).get(name) if plan is not None else None
    return 0 if t is None else t.num_rows


def carried_input(plan: Optional[Plan]) -> Optional[pa.Table]:
    """The carried rows as reducer input (schemas.recon.RECON_INPUT), or None."""
    if plan is None or not plan.carried:
        return None
    from jobs.txreduce import input_table

    c = plan.carried
    return input_table(commitlog=c["records"], op_bodies=c["op_bodies"], anomalies=c["findings"])


def _tail_scan(spark, plan: Plan, layout_info, options):
    """``rocketmq_txscan`` rows of the CommitLog from ``plan.read_from``: the cells a full scan has there
    (files cut at ``split_bytes`` from their start; read_from is a cell start), decoded by the same
    one-pass reader."""
    from jobs.datasources import TX_SCAN_FORMAT, FileInfo, commitlog_ranges, register
    from schemas.sources import SOURCE_TABLES

    register(spark)
    split = int(options.config.split_bytes)
    # the very cells of a full scan (datasources.commitlog_ranges), from the resume cell on
    cells = [(r.broker, r.path, r.base_offset, r.start, r.end)
             for s in layout_info
             for r in commitlog_ranges(s.broker, [FileInfo(*f) for f in s.commitlog_files], split)
             if r.base_offset + r.start >= plan.read_from.get(s.broker, 0)]
    schema = SOURCE_TABLES[TX_SCAN_FORMAT].spark_schema()
    if not cells:
        return spark.createDataFrame([], schema)
    frame = spark.createDataFrame(cells, "broker string, path string, base_offset bigint, start bigint, "
                                         "end bigint")
    frame = frame.repartition(max(1, min(len(cells), 4 * spark.sparkContext.defaultParallelism)))
    return frame.mapInArrow(_Cells(bool(options.include_bodies)), schema)


class _Cells:
    """mapInArrow body: one ``tx_scan_batches`` pass (no row filter: full mode's rows) per cell."""

    def __init__(self, with_body: bool):
        self.with_body = with_body

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from jobs.datasources import tx_scan_batches

        for cells in batches:
            for c in cells.to_pylist():
                yield from tx_scan_batches(c["broker"], c["path"], c["base_offset"], c["start"], c["end"],
                                           self.with_body)


def _state_files(out: str, table, run_id: str) -> List[str]:
    import deltalake

    from jobs import delta_sink

    path = delta_sink.table_path(out, table)
    if not os.path.isdir(os.path.join(path, "_delta_log")):
        return []
    with warnings.catch_warnings():     # partition_filters: deprecated in newer deltalake, still exact here
        warnings.simplefilter("ignore", DeprecationWarning)
        return list(deltalake.DeltaTable(path).file_uris(partition_filters=[("run_id", "=", run_id)]))


def _carried(plan: Plan, table, offset_col: Optional[str]) -> pa.Table:
    """The previous run's rows of ``table`` a full audit of today's store would also have: below
    ``read_from`` in a CommitLog file still present (by offset, or for findings by file and position).
    Read on the driver with deltalake (one Arrow table; no Spark job)."""
    import pyarrow.compute as pc

    schema = table.arrow_schema()
    if not _state_files(plan.out, table, plan.previous_run):
        return schema.empty_table()
    t = _read_state(plan.out, table, plan.previous_run)
    keep = pa.array([False] * t.num_rows, pa.bool_())
    for broker, kept in plan.carried_files.items():
        mine = pc.equal(t.column("broker"), broker)
        for path, base, limit in kept:
            if offset_col is None:     # by the cell that found it; by position when the cell is unknown
                cell = t.column(CELL_OFFSET.name)
                hit = pc.and_(pc.equal(t.column("file"), path), pc.if_else(
                    pc.is_valid(cell), pc.and_(pc.greater_equal(cell, base), pc.less(cell, base + limit)),
                    pc.less(t.column("position"), limit)))
            else:
                off = t.column(offset_col)
                hit = pc.and_(pc.greater_equal(off, base), pc.less(off, base + limit))
            keep = pc.or_(keep, pc.and_(mine, hit))
    if offset_col is None:
        keep = pc.and_(keep, pc.equal(t.column("source"), "commitlog"))
        if plan.units is not None:      # the consume-queue files the read skipped (UnitCarry)
            keep = pc.or_(keep, _unit_file_rows(t, plan.units.skip))
    return t.filter(pc.fill_null(keep, False))


def _read_state(out: str, table, run_id: str) -> pa.Table:
    import deltalake

    from jobs import delta_sink

    schema = table.arrow_schema()
    dt = deltalake.DeltaTable(delta_sink.table_path(out, table))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        t = dt.to_pyarrow_table(partitions=[("run_id", "=", run_id)], columns=list(schema.names))
    return pa.Table.from_arrays([t.column(f.name).cast(f.type) for f in schema], schema=schema)


# ------------------------------------------------------------------------------------------------------------
# writing the state
# ------------------------------------------------------------------------------------------------------------

def write_state(spark, plan: Plan, options, records, op_bodies, findings, layout_info, run_date, writer,
                local: bool = False) -> list:
    """Write this run's ``audit_state*`` tables (one commit each; the run's earlier rows replaced) -> their
    ``delta_sink.WriteResult``s.  ``local``: the rows are few, collect and write them from the driver; with
    ``plan.fresh`` (the run read through :func:`read_local`) they are on the driver already (the frames are
    None).  Skipped (empty list) when the run cannot be continued (indexed mode, DLedger) or has no CommitLog
    scan findings frame."""
    from pyspark.sql import functions as F

    from jobs import delta_sink

    fresh = plan.fresh
    if (options.mode != "full" or (findings is None and fresh is None)
            or any(_is_dledger(s) for s in layout_info)):
        return []
    split = int(options.config.split_bytes)
    carried = plan.carried or {}
    if fresh is not None or local:
        # few rows (the reduction ran on the driver): Arrow on the driver (the one-job read's own rows, else
        # one collect per table), counted and written by the driver -- no Spark write jobs (those cost more
        # than the whole incremental read on a small store)
        if fresh is not None:
            new = {"records": fresh.commitlog, "findings": _with_unit_findings(fresh, plan.units),
                   "op_bodies": fresh.op_bodies}
        else:
            new = {key: (_spark_conformed(df, t).toArrow() if df is not None else None)
                   for df, t, key in ((records, STATE_RECORDS, "records"),
                                      (findings, STATE_FINDINGS, "findings"),
                                      (op_bodies, STATE_OP_BODIES, "op_bodies"))}
        records, findings, op_bodies = (
            _with_carried(new[key], t, carried.get(key)) if new[key] is not None else None
            for t, key in ((STATE_RECORDS, "records"), (STATE_FINDINGS, "findings"),
                           (STATE_OP_BODIES, "op_bodies")))
        agg = records.group_by("broker").aggregate([("physical_offset", "max"), ([], "count_all")])
        stats = {b: (m, n) for b, m, n in zip(agg.column("broker").to_pylist(),
                                               agg.column("physical_offset_max").to_pylist(),
                                               agg.column("count_all").to_pylist())}
        counted = findings.group_by("broker").aggregate([([], "count_all")])
        n_findings = dict(zip(counted.column("broker").to_pylist(), counted.column("count_all").to_pylist()))
    else:
        def union(df, t, key):
            extra = carried.get(key)
            df = _spark_conformed(df, t)
            return df if extra is None or not extra.num_rows else df.unionByName(
                spark.createDataFrame(extra, schema=t.spark_schema()))

        records = union(records, STATE_RECORDS, "records")
        findings = union(findings, STATE_FINDINGS, "findings")
        if op_bodies is not None:
            op_bodies = union(op_bodies, STATE_OP_BODIES, "op_bodies")
        stats = {r["broker"]: (r["last"], r["n"]) for r in records.groupBy("broker").agg(
            F.max("physical_offset").alias("last"), F.count(F.lit(1)).alias("n")).collect()}
        n_findings = {r["broker"]: r["n"] for r in findings.groupBy("broker").agg(
            F.count(F.lit(1)).alias("n")).collect()}
    units = plan.units.prints if fresh is not None and plan.units is not None else {}
    headers = [_header(s, stats.get(s.broker, (None, 0)), n_findings.get(s.broker, 0), split, plan.hash,
                       units.get(s.broker, {})) for s in layout_info]
    outs = []
    parts = ["run_date"]
    header_table = pa.Table.from_pylist(headers, schema=AUDIT_STATE.arrow_schema())
    for table, df in ((STATE_RECORDS, records), (STATE_FINDINGS, findings),
                      (STATE_OP_BODIES, op_bodies if op_bodies is not None
                       else STATE_OP_BODIES.arrow_schema().empty_table()),
                      (AUDIT_STATE, header_table)):       # the header last: it says the rest is there
        if not isinstance(df, pa.Table):
            df = df.select(*table.names)
        else:   # one chunk: the one-job read's rows come in one small batch per cell and task, and the
            # sink writes a row group per batch (8 GiB bench: 2,215 row groups, 3.6 s to write, 5.4 s to read)
            df = df.combine_chunks()
        outs.append(delta_sink.write_table(df, options.out, table, options.run_id, parts, spark,
                                           run_date=run_date, writer=writer))
    plan.state_written = True
    return outs


def _spark_conformed(df, table):
    """``df`` as ``table``'s columns (absent ones null: a findings frame has no cell)."""
    from pyspark.sql import functions as F

    return df.select(*(F.col(f.name).cast(f.dataType) if f.name in df.columns
                       else F.lit(None).cast(f.dataType).alias(f.name) for f in table.spark_schema()))


def _with_carried(new: pa.Table, table, carried: Optional[pa.Table]) -> pa.Table:
    new = _conform(new, table.arrow_schema())
    return new if carried is None or not carried.num_rows else pa.concat_tables([carried, new])


def _with_unit_findings(fresh, units: Optional[UnitCarry]) -> pa.Table:
    """The one-job read's CommitLog findings + the consume-queue findings of the files ``units`` printed
    (those decoded now; the skipped ones' come with the carried findings)."""
    import pyarrow.compute as pc

    scan = fresh.scan_findings
    if units is None or not any(units.prints.values()):
        return scan
    found = fresh.anomalies.filter(pc.fill_null(_unit_file_rows(fresh.anomalies, units.prints), False))
    return pa.concat_tables([scan, _conform(found, STATE_FINDINGS.arrow_schema())])


def _unit_file_rows(findings: pa.Table, files: Dict[str, Iterable[str]]) -> pa.Array:
    """Mask of the ``findings`` rows that are consume-queue findings of ``files`` (broker -> paths)."""
    import pyarrow.compute as pc

    keep = pa.array([False] * findings.num_rows, pa.bool_())
    for broker, paths in files.items():
        if paths:
            keep = pc.or_(keep, pc.and_(
                pc.and_(pc.equal(findings.column("broker"), broker),
                        pc.equal(findings.column("source"), "consumequeue")),
                pc.is_in(findings.column("file"), value_set=pa.array(sorted(paths), pa.string()))))
    return keep


def _header(store, last_and_n, n_findings: int, split: int, digest: str, unit_prints: dict) -> dict:
    """The audit_state row of one broker: resume at the cell of its newest relevant record."""
    from txlog_io.fingerprint import file_print

    last, n = last_and_n
    files = sorted(store.commitlog_files, key=lambda f: f[1])
    resume, holder = (files[0][1] if files else 0), None
    if last is not None:
        holder = next((f for f in files if f[1] <= last < f[1] + f[2]), None)
        if holder is not None:
            resume = holder[1] + (last - holder[1]) // split * split
    rel = (lambda p: os.path.relpath(p, store.root).replace(os.sep, "/"))
    below = {rel(p): [base, size, file_print(store.root, rel(p)).edge_sha256]
             for p, base, size in files if base + size <= resume}
    return {"broker": store.broker, "format_version": STATE_FORMAT_VERSION, "config_hash": digest,
            "store_root": store.root, "resume_offset": int(resume),
            "resume_file": rel(holder[0]) if holder else None,
            "resume_file_base": int(holder[1]) if holder else None,
            "resume_prefix_sha256": (_prefix_sha(holder[0], resume - holder[1]) if holder
                                     else _prefix_sha("", 0)),
            "below_files_json": json.dumps(below, sort_keys=True),
            "commitlog_end": int(_commitlog_end(store)), "records": int(n), "findings": int(n_findings),
            "unit_files_json": json.dumps(unit_prints, sort_keys=True)}


def retire_previous(plan: Plan) -> None:
    """After this run completed: the previous run's state is no longer the newest; remove its rows (one
    commit per table; whole files)."""
    from jobs import delta_sink

    if not plan.state_written or plan.previous_run is None or plan.previous_run == plan.run_id:
        return
    for table in STATE_TABLES.values():
        delta_sink.retract_run(plan.out, table, plan.previous_run)


__all__ = ["Plan", "plan_incremental", "evidence", "carried_input", "carried_rows", "write_state",
           "retire_previous", "config_hash",
           "fallback_findings", "FALLBACK_REASONS"]
