"""The audit job: ``run_audit(spark, options) -> AuditSummary``.

Called by ``jobs.main`` (``./spark-submit.sh audit ...``) with a validated ``jobs.main.AuditOptions``; a thin
driver around the modules that do the work, one function per stage, each handed what it needs:

1. **plan** -- ``jobs.audit.plan.plan_audit`` -> :class:`jobs.audit.plan.AuditPlan`: the stores are listed (driver: directory listing and
   ``stat`` only) and returns lazy DataFrames; the store fingerprint is computed from the same kind of
   listing; the ``AuditParams`` per profile come from ``conf/broker-defaults.json`` + the user's
   ``broker.<key>`` overrides with ``as_of_ms`` = ``--as-of``.
2. **read** -- full mode, reduced on the driver (no bodies; an incremental run from its resume offset):
   ``jobs.read.full``, ONE Spark job whose tasks send the driver Arrow (records, op bodies, findings,
   transaction queues, statetable, redolog, consumer offsets), with the store's DataFrames never built
   (``store_frames.LazyStoreFrames``); on a local master (any store) or for a small store
   (``full_read.driver_read_bound``) the tasks run in the driver's threads instead: no Spark job at all.  Otherwise
   the transaction-relevant CommitLog records are persisted (``MEMORY_AND_DISK``) once, together
   with the small side inputs (consume queues, statetable, redolog, consumer offsets, decoder anomalies) and
   the op message bodies, so the reconstruction's many uses of them do not re-read the store.  ``full`` mode
   keeps only the records the reconstruction looks at (half / op / discard topics, non-``NOT`` transaction
   types) and magic-V2 records (profile evidence); every other record is dropped right after decoding.  The
   oldest retained CommitLog offset comes from the store listing (``layout_info``), not from the records. Op
   bodies are fetched by position (``store_frames.fetch_records`` with bodies) for the op records found, so
   the store is never decoded with every body just to read the ops.
3. **reconstruct** -- ``jobs.reconstruct.spark.reconstruct``: on the driver when the records read are few (the
   outputs come back as Arrow tables and are counted and written from the driver, without Spark jobs), else
   distributed on the executors (linking as Spark joins, the rules per partition of transactions; the
   outputs are checkpointed once and written from there); ``reconstruct.path`` forces a
   path (driver, broker = one task per broker, distributed), and ``audit_runs.config_json`` records the path
   taken and its reduce tasks (``"reconstruct": {"path", "reduce_tasks"}``).
4. **aggregate** -- counts per state / flag / broker (small ``groupBy`` results, the only things collected).
5. **write** -- one Delta table per output through ``jobs.delta.sink.write_table`` (one commit per table, the
   run's previous rows replaced): ``transactions``, ``check_back_worklist``, ``recovery_worklist``,
   ``audit_anomalies``, ``profiles`` (table names from ``table.<logical>`` in the config; ``profiles`` only
   when configured), ``message_bodies`` when bodies were asked for, and finally ``audit_runs`` (one row per
   run). Partitioning: ``run_date``, ``broker`` (+ ``run_id``, which the sink always adds); ``audit_runs`` by
   ``run_date`` (+ ``run_id``).

Idempotence and interruption: the run id (default: derived from ``--as-of``) is the unit of replacement.  Each
table write is atomic (``delta_sink``); the tables are written one after the other and ``audit_runs`` last, so
a run killed half-way leaves every table readable -- tables written before the kill hold the new rows of the
run, the others still the old ones (or nothing) -- and no ``audit_runs`` row (or the previous one) for it.
Running the same stores with the same run id again rewrites every table and completes the run.

Shuffle partitions: when the user left ``spark.sql.shuffle.partitions`` at Spark's default (200), the run uses
4 per GiB of CommitLog (at least the default parallelism, at most 200) and restores the default afterwards:
the reconstruction shuffles only the transaction-relevant rows, and 200 mostly empty partitions per shuffle
dominate small runs.  An explicit setting (``--conf spark.sql.shuffle.partitions=N``) is kept.

Bodies: no reconstruction table has a body column.  ``--include-bodies`` makes the readers decode bodies and
adds the ``message_bodies`` table (one row per transaction: the body of its first half copy / prepared record,
else of its first COMMIT record, else of its discard record, as stored).  A run without bodies writes no body
rows (and clears those of its run id, if an earlier attempt of the same run wrote some).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import pyarrow as pa

from jobs.audit.bodies import bodies_frame
from jobs.audit.guard import kill_point
from jobs.audit.plan import (  # noqa: F401 - run_audit's helpers, re-exported for callers of this module
    CONFIG_TO_RECON,
    RECON_TO_CONFIG,
    REQUIRED_TABLES,
    SHUFFLE_PARTITIONS,
    AuditPlan,
    audit_params,
    auto_shuffle_partitions,
    config_document,
    epoch_ms,
    plan_audit,
    store_file_rows,
    store_fingerprint,
)
from jobs.audit.summary import AuditSummary, TableOutput, format_summary
from jobs.delta import outfs
from jobs.delta import sink as delta_sink
from jobs.delta.sink import RUNS_TABLE, named_table
from jobs.read.inputs import op_bodies_for, relevant_records
from jobs.session import persist_on_disk

#: partition columns of every output but audit_runs (the sink appends run_id)
_TX_PARTS = ("run_date", "broker")
BODIES_TABLE = "message_bodies"


def _log(msg: str) -> None:
    print(f"txaudit: {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _phase(phases: Dict[str, float], name: str, spark=None):
    if spark is not None:
        with contextlib.suppress(Exception):
            spark.sparkContext.setJobDescription(f"txaudit {name}")
    t0 = time.monotonic()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + (time.monotonic() - t0)


class _Persisted:
    """DataFrames persisted by a run (``session.persist_on_disk``), unpersisted when it ends."""

    def __init__(self) -> None:
        self.frames: List = []

    def __call__(self, df):
        if df is None:
            return None
        return persist_on_disk(df, self.frames)

    def release(self) -> None:
        for df in self.frames:
            with contextlib.suppress(Exception):
                df.unpersist()


# ------------------------------------------------------------------------------------------------------------
# read
# ------------------------------------------------------------------------------------------------------------

@dataclass
class AuditInputs:
    """What the read stage hands the reconstruction: the one-job read's Arrow tables (``local``), or the
    persisted DataFrames of the DataFrame plan."""

    local: Any = None               # jobs.read.full.LocalRead, or None
    side: Dict[str, Any] = field(default_factory=dict)     # consumequeue, statetable, redolog, offsets
    records: Any = None
    op_bodies: Any = None
    anomalies: Any = None
    scan_findings: Any = None       # an incremental run's CommitLog findings (its state keeps them)
    n_records: int = 0
    n_anomalies: int = 0
    #: indexed mode: broker -> how it was read (jobs.read.indexed.plan.read_choices); audit_runs.config_json
    #: records it as ``indexed_read``
    read_choices: Optional[Dict[str, dict]] = None


def read_local(spark, plan: AuditPlan, phases: Dict[str, float]):
    """The one-job read (``jobs.read.full``; ``jobs.read.indexed.read`` in indexed mode;
    ``jobs.read.incremental.read`` for an incremental run) when the plan allows it, else None (also when the
    rows are too many for the driver: the DataFrame plan then reads and reduces on the executors)."""
    if not plan.local_read:
        return None
    from jobs.read.full import read_local as read_full
    from jobs.reconstruct.spark import LOCAL_MAX_ROWS

    with _phase(phases, "read.records"):
        if plan.incremental is not None:
            from jobs.read.incremental.read import read_local as read_incremental

            return read_incremental(spark, plan.incremental, plan.spec, LOCAL_MAX_ROWS, phases)
        if plan.spec.mode == "indexed":     # the same shape for indexed mode (jobs/read/indexed/read.py)
            from jobs.read.indexed.read import read_indexed_local

            return read_indexed_local(spark, plan.spec, LOCAL_MAX_ROWS, phases)
        return read_full(spark, plan.spec, LOCAL_MAX_ROWS, phases)


def read_inputs(spark, plan: AuditPlan, persist, phases: Dict[str, float]) -> AuditInputs:
    """The reconstruction's inputs: the one-job read when it applies, else the store's DataFrames with the
    transaction-relevant records, side inputs and op bodies persisted once."""
    local = read_local(spark, plan, phases)
    if local is not None:
        return AuditInputs(local=local, n_records=local.commitlog.num_rows, n_anomalies=local.anomalies.num_rows,
                           read_choices=local.read_choices)
    frames, incremental = plan.frames, plan.incremental
    got = AuditInputs(side={name: persist(getattr(frames, name))
                            for name in ("statetable", "redolog", "consumer_offsets")},
                      read_choices=getattr(frames, "read_choices", None))
    # the reconstruction reads only the half / op / discard queues: caching every topic's units (millions of
    # rows on a busy broker) cost more than the whole indexed read
    queues = frames.transaction_queues
    got.side["consumequeue"] = persist(queues if queues is not None else frames.consumequeue)
    if incremental is None:
        scan = persist(getattr(frames, "scan", None))      # one CommitLog pass feeds records and findings
        records = relevant_records(frames)
        # full mode's records are a filter of the persisted scan: read from its cache, not cached again
        got.records = records if scan is not None and frames.mode == "full" else persist(records)
        anomalies = frames.anomalies
    else:   # the carried evidence + the CommitLog from the resume offset (jobs/read/incremental/plan.py)
        from jobs.read.incremental.read import evidence

        records, got.op_bodies, anomalies, got.scan_findings = evidence(spark, incremental, frames, plan.spec,
                                                                        persist)
        got.records = persist(records)
    with _phase(phases, "read.records"):
        got.n_records = got.records.count()
    got.op_bodies = persist(got.op_bodies if incremental is not None
                            else op_bodies_for(spark, got.records, frames, plan.spec))
    got.anomalies = persist(anomalies)
    with _phase(phases, "read.anomalies"):
        got.n_anomalies = got.anomalies.count()
    if incremental is not None:     # rows carried as Arrow from the previous run's state
        from jobs.read.incremental.read import carried_rows

        got.n_records += carried_rows(incremental, "records")
        got.n_anomalies += carried_rows(incremental, "findings")
    return got


# ------------------------------------------------------------------------------------------------------------
# reconstruct
# ------------------------------------------------------------------------------------------------------------

@dataclass
class Reconstructed:
    """The reconstruction's outputs: ``arrow`` (reduced on the driver) or the checkpointed DataFrames of
    ``result`` (reduced on the executors)."""

    result: Any                     # jobs.reconstruct.spark.AuditResult
    arrow: Optional[Dict[str, pa.Table]]
    transactions: Any = None        # a slice of the checkpointed outputs when reduced on the executors
    findings: Any = None


def reconstruct_inputs(spark, plan: AuditPlan, inputs: AuditInputs, persist,
                       phases: Dict[str, float]) -> Reconstructed:
    """The one-job read's tables reduced on the driver (``jobs.reconstruct.local``); the DataFrame plan's
    frames by ``jobs.reconstruct.spark.reconstruct``: with ``reconstruct.path`` auto, on the driver when the
    transaction-relevant rows are at most ``LOCAL_MAX_ROWS`` (with the transaction queue units and findings,
    a few hundred MB of Arrow at most), else distributed (linking as Spark joins, the rules per partition of
    transactions) with the outputs materialized once; another path forces it.  Below the bound the driver
    skips the shuffles, the checkpoint and the executor-side writes: a 4 GiB store with 28,887 transactions
    (idle machine, warm) spent 7.1 s reducing on the executors at the former bound of LOCAL_MAX_ROWS // 4."""
    from jobs.reconstruct.spark import LOCAL_MAX_ROWS, AuditResult, reconstruct

    if inputs.local is not None:
        from jobs.reconstruct.local import reduce_local

        outs = reduce_local(inputs.local, plan.layout_info, plan.params, plan.override, phases,
                            plan=plan.incremental)
        return Reconstructed(result=AuditResult(arrow=outs, spark=spark), arrow=outs)
    frames = dict(inputs.side, commitlog=inputs.records, anomalies=inputs.anomalies,
                  layout_info=plan.layout_info)
    if inputs.op_bodies is not None:
        frames["op_bodies"] = inputs.op_bodies
    path = plan.reconstruct_path
    if path == "auto":
        path = "driver" if inputs.n_records + inputs.n_anomalies <= LOCAL_MAX_ROWS else "distributed"
    if plan.incremental is not None:
        from jobs.read.incremental.read import carried_final_arrow
        from jobs.reconstruct.local import carried_input, final_of

        if path == "driver":        # few inputs: the settled rows join them on the driver, as Arrow
            carried_final_arrow(plan.incremental)
        frames["carried"] = carried_input(plan.incremental)
        frames["final"] = final_of(plan.incremental)
    # an incremental run's state settles by the distributed path's linked evidence (jobs.audit.state): it
    # stays persisted until the run ends
    result = reconstruct(frames, plan.params, plan.override, materialize=True, path=path, timings=phases,
                         keep_linked=plan.incremental is not None)
    if result.linked is not None:
        persist.frames.append(result.linked)
    arrow = result.arrow                          # None: reduced on the executors
    # Arrow outputs stay Arrow: a DataFrame of them (createDataFrame, ~0.3 s each on the 8 GiB bench) only
    # for the bodies join.  Executor outputs are slices of the one checkpointed output frame
    # (``materialize``): read from there, not cached a second time
    return Reconstructed(result=result, arrow=arrow,
                         transactions=None if arrow else result.transactions,
                         findings=None if arrow else result.anomalies)


def _aggregates_arrow(arrow):
    """_aggregates from the reconstruction's Arrow outputs (no Spark job)."""
    import pyarrow.compute as pc

    states_by_broker: Dict[str, Dict[str, int]] = {}
    states_total: Dict[str, int] = {}
    flag_counts: Dict[str, int] = {}
    tx = arrow["transactions"]
    # Arrow kernels, not a Python loop over every transaction (0.13-0.18 s at 57k); the groups come in the
    # order of their first row, so every dict keeps the order the loop gave
    by = tx.select(["broker", "state"]).group_by(["broker", "state"], use_threads=False).aggregate(
        [([], "count_all")])
    for b, s, n in zip(*(by.column(c).to_pylist() for c in ("broker", "state", "count_all")), strict=True):
        states_by_broker.setdefault(b, {})[s] = n
        states_total[s] = states_total.get(s, 0) + n
    if tx.num_rows:
        counted = pc.value_counts(pc.list_flatten(tx.column("flags")))
        flag_counts.update(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist(),
                               strict=True))
    pr = arrow["profiles"]
    profiles = dict(zip(pr.column("broker").to_pylist(), pr.column("profile").to_pylist(), strict=True))
    detected = dict(zip(pr.column("broker").to_pylist(), pr.column("detected_profile").to_pylist(),
                        strict=True))
    return states_total, states_by_broker, flag_counts, profiles, detected


def _aggregates(result):
    """One small action: per (broker, state) counts, per flag counts and the profile rows."""
    from pyspark.sql import functions as F

    c = F.col
    tx = result.transactions
    states = tx.groupBy("broker", "state").agg(F.count(F.lit(1)).alias("n")).select(
        F.lit("state").alias("kind"), "broker", c("state").alias("key"),
        F.lit(None).cast("string").alias("value"), "n")
    flags = tx.select(F.explode("flags").alias("flag")).groupBy("flag").agg(
        F.count(F.lit(1)).alias("n")).select(
        F.lit("flag").alias("kind"), F.lit(None).cast("string").alias("broker"), c("flag").alias("key"),
        F.lit(None).cast("string").alias("value"), "n")
    profs = result.profiles.select(F.lit("profile").alias("kind"), "broker", c("profile").alias("key"),
                                   c("detected_profile").alias("value"), F.lit(0).cast("long").alias("n"))
    states_by_broker: Dict[str, Dict[str, int]] = {}
    states_total: Dict[str, int] = {}
    flag_counts: Dict[str, int] = {}
    profiles: Dict[str, str] = {}
    detected: Dict[str, str] = {}
    for r in states.unionByName(flags).unionByName(profs).collect():
        if r["kind"] == "state":
            states_by_broker.setdefault(r["broker"], {})[r["key"]] = int(r["n"])
            states_total[r["key"]] = states_total.get(r["key"], 0) + int(r["n"])
        elif r["kind"] == "flag":
            flag_counts[r["key"]] = int(r["n"])
        else:
            profiles[r["broker"]] = r["key"]
            detected[r["broker"]] = r["value"]
    return states_total, states_by_broker, flag_counts, profiles, detected


# ------------------------------------------------------------------------------------------------------------
# write
# ------------------------------------------------------------------------------------------------------------

def _outputs(plan: AuditPlan, inputs: AuditInputs, rec: Reconstructed) -> list:
    """(logical name, rows, schema) of every table the run writes before ``audit_runs``."""
    from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES, RECOVERY, TRANSACTIONS
    from schemas.repair import STORE_FILES
    from schemas.runs import MESSAGE_BODIES

    arrow, result = rec.arrow, rec.result
    # outputs reduced on the driver are written from there (delta_sink's Arrow path: no Spark job)
    outputs = [("transactions", arrow["transactions"] if arrow else rec.transactions, TRANSACTIONS),
               ("check_back_worklist", arrow["check_back"] if arrow else result.check_back, CHECK_BACK),
               ("recovery_worklist", arrow["recovery"] if arrow else result.recovery, RECOVERY),
               ("audit_anomalies", arrow["anomalies"] if arrow else rec.findings, AUDIT_ANOMALIES)]
    if "profiles" in plan.table_names:
        outputs.append(("profiles", arrow["profiles"] if arrow else result.profiles, PROFILES))
    prints = pa.Table.from_pylist([dict(zip(STORE_FILES.names, r, strict=True)) for r in plan.file_prints],
                                  schema=STORE_FILES.arrow_schema())      # driver-side write
    outputs.append((STORE_FILES.name, prints, STORE_FILES))
    if plan.spec.include_bodies:
        outputs.append((BODIES_TABLE, bodies_frame(result.transactions if arrow else rec.transactions,
                                                   inputs.records), MESSAGE_BODIES))
    elif outfs.is_delta(outfs.join(plan.out, plan.table_names.get(BODIES_TABLE, BODIES_TABLE))):
        # clear the body rows an earlier attempt of this run id may have written
        outputs.append((BODIES_TABLE, MESSAGE_BODIES.arrow_schema().empty_table(), MESSAGE_BODIES))
    return outputs


def write_outputs(spark, plan: AuditPlan, inputs: AuditInputs, rec: Reconstructed,
                  phases: Dict[str, float]) -> Dict[str, TableOutput]:
    """Every output table but ``audit_runs`` (one Delta commit each), then an incremental run's state."""
    from schemas.runs import AUDIT_RUNS

    names = plan.table_names
    tables: Dict[str, TableOutput] = {}
    # a rerun of this run id killed below must not leave the earlier attempt's COMPLETE row behind
    delta_sink.retract_run(plan.out, named_table(AUDIT_RUNS, names.get(RUNS_TABLE, RUNS_TABLE)), plan.run_id)
    kill_point("retracted")
    for logical, df, schema in _outputs(plan, inputs, rec):
        name = plan.required_tables.get(logical) or names.get(logical, logical)
        with _phase(phases, f"write.{logical}", spark):
            wr = delta_sink.write_table(df, plan.out, named_table(schema, name), plan.run_id, list(_TX_PARTS),
                                        spark, run_date=plan.run_date, writer=plan.writer)
        tables[logical] = TableOutput(logical, wr.path, wr.rows, wr.files, wr.version, wr.seconds)
        _log(f"wrote {logical}: {wr.rows} rows, version {wr.version} ({wr.seconds:.1f} s)")
        kill_point(f"wrote.{logical}")
    if plan.incremental is not None:
        from jobs.audit.state import write_state

        with _phase(phases, "write.audit_state", spark):
            for wr in write_state(spark, plan.incremental, plan.spec, inputs.records, inputs.op_bodies,
                                  inputs.scan_findings, plan.layout_info, plan.run_date, plan.writer,
                                  local=rec.arrow is not None):
                name = outfs.basename(wr.path)
                tables[name] = TableOutput(name, wr.path, wr.rows, wr.files, wr.version, wr.seconds)
    return tables


def write_run_row(spark, plan: AuditPlan, row: dict) -> TableOutput:
    """The run's ``audit_runs`` row, written last: it says every other table of the run is there."""
    from schemas.runs import AUDIT_RUNS

    kill_point("before.audit_runs")
    runs_name = plan.table_names.get(RUNS_TABLE, RUNS_TABLE)
    runs = pa.Table.from_pylist([row], schema=AUDIT_RUNS.arrow_schema())   # driver-side write
    wr = delta_sink.write_table(runs, plan.out, named_table(AUDIT_RUNS, runs_name), plan.run_id, ["run_date"],
                                spark, run_date=plan.run_date, writer=plan.writer)
    return TableOutput(RUNS_TABLE, wr.path, wr.rows, wr.files, wr.version, wr.seconds)


def _run_row(spark, plan: AuditPlan, result, counts: tuple, tables: Dict[str, TableOutput],
             phases: Dict[str, float], started_at: dt.datetime, finished_at: dt.datetime,
             elapsed: float, read_choices: Optional[Dict[str, dict]] = None) -> dict:
    from schemas.runs import AUDIT_RUNS

    states, _, flags, profiles, detected = counts
    incremental = plan.incremental
    table_paths = {k: t.path for k, t in tables.items()}
    table_paths[RUNS_TABLE] = delta_sink.table_path(
        plan.out, named_table(AUDIT_RUNS, plan.table_names.get(RUNS_TABLE, RUNS_TABLE)))
    return {
        "run_id": plan.run_id, "run_date": plan.run_date,
        "as_of": plan.as_of.astimezone(dt.timezone.utc), "as_of_ms": plan.as_of_ms,
        "started_at": started_at, "finished_at": finished_at,
        "elapsed_s": float(elapsed), "status": "COMPLETE", "mode": plan.spec.mode,
        "brokers": list(plan.spec.brokers), "stores": list(plan.spec.stores), "profiles": profiles,
        "detected_profiles": detected, "include_bodies": plan.spec.include_bodies,
        "config_json": json.dumps(dict(plan.config_doc,
                                       shuffle_partitions=int(spark.conf.get(SHUFFLE_PARTITIONS)),
                                       reconstruct={"path": result.path, "reduce_tasks": result.reduce_tasks},
                                       commitlog_files=commitlog_files(plan.layout_info),
                                       **({"indexed_read": read_choices} if read_choices else {}),
                                       **({"incremental": incremental.describe()} if incremental else {})),
                                  sort_keys=True, default=str),
        "store_fingerprint": plan.fingerprint, "store_files": plan.store_files, "store_bytes": plan.store_bytes,
        "commitlog_bytes": plan.commitlog_bytes, "transactions": sum(states.values()), "state_counts": states,
        "flag_counts": flags, "table_rows": {k: t.rows for k, t in tables.items()},
        "table_paths": table_paths, "phase_seconds": {k: float(v) for k, v in phases.items()},
        "writer": plan.writer, "spark_version": spark.version, "out": plan.out,
    }


class FinalReopened(Exception):
    """An incremental run's reduction named a transaction its state carries as settled: the run is done
    again as a full audit (jobs/read/incremental/plan.py, FINAL_REOPENED)."""


def settled_check(spark, plan: AuditPlan, inputs: AuditInputs, rec: Reconstructed) -> None:
    """For an incremental run carrying settled transactions: raise FinalReopened when this run's reduction
    names one of them (jobs.reconstruct.settle.reopened); else hand the reduction to the state writer
    (``plan.incremental.reduced``), which settles more: the driver's Arrow outputs, or the distributed
    reduction's transactions and linked evidence (settled on the executors)."""
    from jobs.reconstruct.local import final_of
    from jobs.reconstruct.settle import consume_offsets

    inc = plan.incremental
    if inc is None:
        return
    if inputs.local is not None:
        co = inputs.local.consumer_offsets
    else:
        df = inputs.side.get("consumer_offsets")
        co = df.toArrow() if df is not None else None
    offsets = consume_offsets(co)
    final = final_of(inc)       # Arrow when reduced on the driver, else a DataFrame (or no rows: Arrow)
    if final is not None and (not isinstance(final, pa.Table) or final.num_rows):
        if rec.arrow is not None:
            from jobs.reconstruct.settle import reopened

            profiles = dict(zip(*(rec.arrow["profiles"].column(c).to_pylist() for c in ("broker", "profile")),
                                strict=True))
            why = reopened(final, rec.arrow["transactions"], rec.arrow["anomalies"], profiles, offsets)
        else:
            from jobs.reconstruct.spark import reopened_frames

            why = reopened_frames(rec.result, final, offsets)
        if why:
            raise FinalReopened("; ".join(f"{b}: {w}" for b, w in sorted(why.items())))
    if rec.arrow is not None:
        inc.reduced = {"transactions": rec.arrow["transactions"], "profiles": rec.arrow["profiles"],
                       "consumer_offsets": co}
    elif getattr(rec.result, "linked", None) is not None:       # reduced distributed: settled on the executors
        inc.reduced = {"transactions": rec.transactions, "profiles": rec.result.profiles.toArrow(),
                       "consumer_offsets": co, "linked": rec.result.linked, "tasks": rec.result.reduce_tasks}


# ------------------------------------------------------------------------------------------------------------
# the pipeline
# ------------------------------------------------------------------------------------------------------------

def run_audit(spark, options, *, print_summary: bool = True, on_result=None) -> AuditSummary:
    """Audit ``options.stores`` as of ``options.as_of`` and write the outputs under ``options.out``: plan ->
    read -> reconstruct -> aggregate -> write; prints the summary (jobs.audit.summary) and returns it.  See
    the module docstring.  An incremental run whose reduction reopens a settled transaction (FinalReopened,
    before anything is written) is done again as a full audit.

    ``on_result(result, summary)``: called after every table is written, while the reconstruction's frames
    (``jobs.reconstruct.spark.AuditResult``) are still persisted (tests compare them with the tables)."""
    try:
        return _run_audit(spark, options, print_summary=print_summary, on_result=on_result)
    except FinalReopened as e:
        _log(f"incremental state: {e}; auditing the whole store again")
        return _run_audit(spark, options, print_summary=print_summary, on_result=on_result, reopened=str(e))


def _run_audit(spark, options, *, print_summary: bool = True, on_result=None,
               reopened: Optional[str] = None) -> AuditSummary:
    started_at = dt.datetime.now(dt.timezone.utc)
    t_start = time.monotonic()
    phases: Dict[str, float] = {}
    persist = _Persisted()
    plan: Optional[AuditPlan] = None
    try:
        with _phase(phases, "plan", spark):
            plan = plan_audit(spark, options, reopened)
        _log(f"run {plan.run_id}: {len(plan.spec.stores)} store(s), "
             f"{plan.commitlog_bytes / (1 << 20):.1f} MiB of CommitLog, mode {plan.spec.mode}, "
             f"as of {plan.as_of.isoformat()}")

        with _phase(phases, "read", spark):
            inputs = read_inputs(spark, plan, persist, phases)
        _log(f"read {inputs.n_records} transaction-relevant records and {inputs.n_anomalies} decoder findings "
             f"({phases['read']:.1f} s)")
        for broker, how in sorted((inputs.read_choices or {}).items()):
            _log(f"indexed read of {broker}: {'whole CommitLog (full-mode read)' if how['read'] == 'full' else 'by index'}"
                 f" -- {how['units']} transaction queue units, {how['fetch_passes']} fetch passes x "
                 f"{how['window_bytes'] / (1 << 20):.1f} MiB of windows; "
                 f"{'nothing' if how['read'] == 'full' else 'records'} written past CommitLog byte "
                 f"{how['covered_to']:,}")

        with _phase(phases, "reconstruct", spark):
            rec = reconstruct_inputs(spark, plan, inputs, persist, phases)
            settled_check(spark, plan, inputs, rec)
        if plan.incremental is not None and plan.incremental.fresh is not None:
            from jobs.audit.state import start_state_write

            # this run's rows and its reduction are on the driver: its state is written while the outputs are
            start_state_write(spark, plan.incremental, plan.spec, plan.writer, plan.run_date)
        with _phase(phases, "aggregate", spark):
            counts = _aggregates_arrow(rec.arrow) if rec.arrow else _aggregates(rec.result)
        states, states_by_broker, flags, profiles, detected = counts
        n_tx = sum(states.values())
        _log(f"reconstructed {n_tx} transactions ({phases['reconstruct'] + phases['aggregate']:.1f} s)")

        with _phase(phases, "write", spark):
            tables = write_outputs(spark, plan, inputs, rec, phases)
        finished_at = dt.datetime.now(dt.timezone.utc)
        row = _run_row(spark, plan, rec.result, counts, tables, phases, started_at, finished_at,
                       time.monotonic() - t_start, inputs.read_choices)
        tables[RUNS_TABLE] = write_run_row(spark, plan, row)
        if plan.incremental is not None:
            from jobs.audit.state import retire_previous

            retire_previous(plan.incremental)        # the previous run's state: superseded by this one

        describe = {"incremental": plan.incremental.describe()} if plan.incremental else {}
        summary = AuditSummary(
            run_id=plan.run_id, as_of=plan.as_of, out=plan.out, mode=plan.spec.mode,
            brokers=plan.spec.brokers, stores=plan.spec.stores, profiles=profiles,
            detected_profiles=detected, transactions=n_tx, states=states, states_by_broker=states_by_broker,
            flags=flags, tables=tables, phases=phases, elapsed_s=time.monotonic() - t_start,
            writer=plan.writer, store_fingerprint=plan.fingerprint, include_bodies=plan.spec.include_bodies,
            started_at=started_at, finished_at=finished_at, store_bytes=plan.store_bytes,
            commitlog_bytes=plan.commitlog_bytes,
            extra=dict({"records": inputs.n_records, "decoder_findings": inputs.n_anomalies}, **describe))
        if on_result is not None:
            on_result(rec.result, summary)
    finally:
        _end_run(spark, plan, persist)

    if print_summary:
        print(format_summary(summary), flush=True)
    if getattr(options, "report", True):
        write_run_report(plan.out, plan.run_id)
    return summary


def _end_run(spark, plan: Optional[AuditPlan], persist: _Persisted) -> None:
    """What a run leaves behind, also when it failed: no state-write thread still running under ``--out``
    (the caller releases the output lock next), nothing persisted, the session's settings as they were."""
    incremental = plan.incremental if plan is not None else None
    if incremental is not None and incremental.early_state is not None:
        # a state write started while the outputs are written (jobs.audit.state.start_state_write) ends before
        # the caller releases the output lock, also when the run failed: no thread writes under --out after it
        with contextlib.suppress(Exception):
            incremental.early_state.result()
    persist.release()
    with contextlib.suppress(Exception):
        spark.sparkContext.setJobDescription(None)
    if plan is not None and plan.restore_shuffle:
        with contextlib.suppress(Exception):
            spark.conf.unset(SHUFFLE_PARTITIONS)


def commitlog_files(layout_info) -> Dict[str, list]:
    """broker -> [[base offset, size], ...] of its CommitLog files (kept in config_json: the report's store
    map needs the file boundaries, and the report reads no store)."""
    return {s.broker: [[int(base), int(size)] for _, base, size in s.commitlog_files] for s in layout_info}


def write_run_report(out: str, run_id: str) -> Optional[str]:
    """The run's HTML report (jobs.report.write); a report that fails is a warning, never a failed audit."""
    try:
        from jobs.report.write import write_report

        page = write_report(out, run_id)
    except Exception as e:  # noqa: BLE001 - the tables are written; the report is a view of them
        first = (str(e).strip().splitlines() or [""])[0]
        _log(f"warning: report not written: {type(e).__name__}: {first}")
        return None
    _log(f"report: {page}")
    return page


__all__ = ["run_audit", "plan_audit", "read_inputs", "reconstruct_inputs", "write_outputs", "write_run_row",
           "write_run_report", "commitlog_files", "store_fingerprint", "audit_params", "relevant_records",
           "op_bodies_for", "bodies_frame", "named_table", "epoch_ms", "RECON_TO_CONFIG", "CONFIG_TO_RECON",
           "AuditSummary", "AuditPlan", "AuditInputs", "Reconstructed"]
