"""Reconstruct the true state of every transactional message from a broker store's decoded frames.

``reconstruct`` is the Spark side of a Spark-free reducer (jobs/reconstruct/reducer.py, jobs/reconstruct/evidence.py,
jobs/reconstruct/rules.py): every input frame is projected onto one tagged table (schemas.recon.RECON_INPUT) and then
either collected to the driver and reduced there (small inputs: one Spark job, no shuffle) or shuffled ONCE by
broker and reduced per broker with ``groupBy("broker").applyInArrow`` (large inputs); see docs/ARCHITECTURE.md
for the choice and its measured cost.  Inputs are the frames the data sources produce, each ``broker`` + the
columns of a schemas.store table:

====================  ======================================================================================
``commitlog``         broker + schemas.COMMITLOG (``body`` may be null except for op records, see op_bodies)
``consumequeue``      broker + schemas.CONSUMEQUEUE (optional; enables CQ_MISMATCH)
``statetable``        broker + schemas.STATETABLE (3.x; optional)
``redolog``           broker + schemas.REDOLOG (3.x; optional)
``consumer_offsets``  broker + schemas.CONSUMER_OFFSETS (optional; half/op consume offsets, CID_RMQ_SYS_TRANS)
``anomalies``         broker + schemas.ANOMALIES (optional; decoder findings -> CORRUPT_RECORD)
``op_bodies``         optional: broker, physical_offset, queue_offset, store_timestamp, body (string or
                      binary) [, queue_id] of the RMQ_SYS_TRANS_OP_HALF_TOPIC records.  When absent it
                      is derived from the commitlog rows of that topic whose ``body`` is not null (so ask the
                      source for op bodies).
``commitlog_bounds``  optional: broker, min_commitlog_offset (start of the oldest retained CommitLog file);
                      derived from ``layout_info`` (jobs.read.frames.StoreFrames) when the frames have it,
                      else from the records (only right when the commitlog frame holds every record)
====================  ======================================================================================

Outputs (schemas.audit): ``transactions`` (one row per transaction), ``check_back`` and ``recovery`` work
lists, ``anomalies`` (decoder findings + evidence no transaction could own) and ``profiles``.

Reconstruction rules (store-format reference sections 7, 8, 10, 11):

* 4.3+ ("HALF_QUEUE" mechanism): half records = topic RMQ_SYS_TRANS_HALF_TOPIC (never TRAN_MSG alone); copies
  are grouped by (broker, UNIQ_KEY, PGROUP, REAL_TOPIC) (by their own offset when UNIQ_KEY is missing).  Op
  bodies hold HALF-QUEUE offsets (``1234`` up to 5.0, ``1,2,3,`` from 5.1; both are parsed, empty pieces
  dropped) and are joined to the copies' QUEUEOFFSET.  COMMIT records (real topic, type COMMIT) point with
  PREPARED_TRANSACTION_OFFSET to a copy's CommitLog offset (the copy named in the EndTransaction, usually the
  newest); when that copy is gone they are matched by (UNIQ_KEY, PGROUP, topic).  Discards
  (TRANS_CHECK_MAX_TIME_TOPIC) are matched by (UNIQ_KEY, PGROUP, REAL_TOPIC).
* 3.x / 4.0-4.2 ("PREPARED_RECORD"): PREPARED records in the real topic; COMMIT/ROLLBACK records join on
  PREPARED_TRANSACTION_OFFSET; 3.x adds the statetable unit (by CommitLog offset) and the redolog, and every
  disagreement among CommitLog, statetable and redolog is flagged.
* state: any COMMIT record -> COMMITTED (authoritative, even when also discarded or rolled back: flagged);
  else a ROLLBACK record or an op (4.3+ writes no rollback record) -> ROLLED_BACK; else a 3.x statetable
  COMMIT/ROLLBACK unit; else a discard -> DISCARDED; else PREPARED.  A state reached by the absence of a
  record while CommitLog bytes where it would lie were not readable is flagged
  STATE_UNCERTAIN_DAMAGED_RANGE (jobs/reconstruct/damage.py); an op-rolled-back one becomes UNKNOWN_DAMAGED.

Deadline (``deadline_ms``, PREPARED only), with T = transactionTimeOut or the message's check immunity
(CHECK_IMMUNITY_TIME_IN_SECONDS x 1000), I = transactionCheckInterval, M = transactionCheckMax, c = the newest
copy's TRANSACTION_CHECK_TIMES (0 when absent), S = the newest copy's store time, B = born time, R =
fileReservedTime in ms:

* 4.3+: ``least(greatest(S + I, B + T) + max(M - c, 0) * I,  B + R)`` -- the first pass that can check the
  newest copy comes one interval after it was written (and not before the timeout); every pass re-puts a copy
  with c+1 until c >= M, and the pass after that discards it; independently a pass discards anything born more
  than R ago (needSkip).  Pass start jitter (up to one I) and the 60 s per-pass time limit are ignored.
* 3.x and 4.0-4.2 (no max / no checker): ``first prepared record's store time + R`` -- the earliest time
  retention may delete the CommitLog file holding it (files go by modification time, so this is a lower
  bound).
"""

from __future__ import annotations

import time
from typing import Any, Dict, Mapping, Optional, Union

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.config import RECONSTRUCT_PATHS
from jobs.reconstruct.distributed import reduce_distributed
from jobs.reconstruct.flags import FLAGS, RECOVERY_ACTIONS
from jobs.reconstruct.local import bounds_rows as _bounds_rows
from jobs.reconstruct.params import (  # noqa: F401 - re-exported: the constants' historical home
    CHECK_GROUP,
    COMMITTED,
    DISCARD_TOPIC,
    DISCARDED,
    FILE_LEVEL_ANOMALIES,
    HALF_QUEUE,
    HALF_TOPIC,
    OP_TOPIC,
    P_3X,
    P_40,
    P_43,
    P_51,
    P_UNKNOWN,
    PREPARED,
    PREPARED_RECORD,
    PROFILES,
    ROLLED_BACK,
    SCHEDULE_TOPIC,
    TIMER_TOPIC,
    TX_SYSTEM_TOPICS,
    AuditParams,
    ParamsArg,
    check_override,
)
from jobs.reconstruct.partitioned import output_union
from jobs.reconstruct.reducer import reduce_input
from jobs.session import arrow_frame
from schemas.core import Table
from schemas.recon import RECON_INPUT, RECON_OUTPUT, RECON_OUTPUT_TABLES
from schemas.state import STATE_FINAL

#: inputs up to this many rows (all brokers together) are reduced on the driver; above, per broker on the
#: executors.  ~200 bytes per row in Arrow: 40 MB at the limit.
LOCAL_MAX_ROWS = 200_000
#: where the reduction runs (``reconstruct(path=...)``, config key ``reconstruct.path``): ``auto`` = the driver
#: up to LOCAL_MAX_ROWS input rows, else ``distributed``; ``broker`` = one executor task per broker
PATHS = RECONSTRUCT_PATHS
#: frame name -> RECON_INPUT.src
_SOURCES = {"commitlog": "commitlog", "op_bodies": "op_body", "consumequeue": "consumequeue",
            "statetable": "statetable", "redolog": "redolog", "consumer_offsets": "consumer_offsets",
            "anomalies": "anomaly", "commitlog_bounds": "bounds"}


class AuditResult:
    """The reconstruction's outputs as DataFrames: ``transactions``, ``check_back``, ``recovery``,
    ``anomalies``, ``profiles``.  ``arrow``: the same outputs as Arrow tables when the reduction ran on the
    driver (None otherwise); the audit job writes and counts those without a Spark job, and their DataFrames
    are only created when asked for."""

    def __init__(self, frames: Optional[Dict[str, DataFrame]] = None,
                 arrow: Optional[Dict[str, pa.Table]] = None, spark=None, path: str = "driver",
                 reduce_tasks: int = 1, linked: Optional[DataFrame] = None):
        self._frames = dict(frames or {})
        #: the distributed path's linked evidence, still persisted, when asked for (``keep_linked``)
        self.linked = linked
        self.arrow = arrow
        self._spark = spark
        #: the path the reduction took (PATHS but auto) and how many reduce tasks (or driver threads) it ran
        self.path, self.reduce_tasks = path, reduce_tasks

    def _get(self, name: str) -> DataFrame:
        if name not in self._frames:
            self._frames[name] = arrow_frame(
                self._spark, self.arrow[name], schema=RECON_OUTPUT_TABLES[name].spark_schema())
        return self._frames[name]

    transactions = property(lambda self: self._get("transactions"))
    check_back = property(lambda self: self._get("check_back"))
    recovery = property(lambda self: self._get("recovery"))
    anomalies = property(lambda self: self._get("anomalies"))
    profiles = property(lambda self: self._get("profiles"))


# ------------------------------------------------------------------------------------------------------------
# helpers kept for callers of the frame API
# ------------------------------------------------------------------------------------------------------------


def _frame(frames: Any, name: str) -> Optional[DataFrame]:
    if frames is None:
        return None
    if isinstance(frames, Mapping):
        return frames.get(name)
    return getattr(frames, name, None)


def empty_frame(spark, table: Table) -> DataFrame:
    """An empty ``broker`` + ``table`` frame (for inputs a store does not have)."""
    schema = T.StructType([T.StructField("broker", T.StringType(), False), *table.spark_schema().fields])
    return spark.createDataFrame([], schema)


def conform(df: DataFrame, table: Table) -> DataFrame:
    """Select exactly ``table``'s columns, in order, cast to its types."""
    schema = table.spark_schema()
    return df.select(*[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields])


def commitlog_bounds_from_layout(spark, layout_info) -> Optional[DataFrame]:
    """(broker, min_commitlog_offset, n_cq) from store listings (``StoreFrames.layout_info``: objects with
    ``broker``, ``commitlog_files`` = ((path, base_offset, size), ...) and ``consume_queues`` = the number of
    queue directories); None when no store has a CommitLog file."""
    rows = _bounds_rows(layout_info)
    if not rows:
        return None
    return spark.createDataFrame(rows, "broker string, min_commitlog_offset bigint, n_cq bigint")


# ------------------------------------------------------------------------------------------------------------
# inputs -> one tagged frame
# ------------------------------------------------------------------------------------------------------------


def input_frame(frames: Any) -> DataFrame:
    """Every input of ``frames`` projected onto RECON_INPUT (columns a source lacks are typed nulls) and
    unioned.  Bodies are kept for op records only."""
    commitlog = _frame(frames, "commitlog")
    if commitlog is None:
        raise ValueError("reconstruct needs at least the 'commitlog' frame")
    spark = commitlog.sparkSession
    schema = RECON_INPUT.spark_schema()
    parts = []
    for name, src in _SOURCES.items():
        df = _frame(frames, name)
        if name == "commitlog_bounds" and df is None:
            rows = _bounds_rows(_frame(frames, "layout_info"))
            df = (spark.createDataFrame(rows, "broker string, min_commitlog_offset bigint, n_cq bigint")
                  if rows else None)
        if df is None:
            continue
        have = set(df.columns)
        sel = []
        for f in schema.fields:
            if f.name == "src":
                e = F.lit(src)
            elif f.name == "body" and src == "commitlog":
                e = F.when(F.col("topic") == OP_TOPIC, F.col("body")) if "body" in have else F.lit(None)
            elif f.name == "queue_id" and src == "op_body" and "queue_id" not in have:
                e = F.lit(0)
            elif f.name in have:
                e = F.col(f.name)
            else:
                e = F.lit(None)
            sel.append(e.cast(f.dataType).alias(f.name))
        parts.append(df.select(*sel))
    out = parts[0]
    for p in parts[1:]:
        out = out.union(p)
    return out


# ------------------------------------------------------------------------------------------------------------
# the reduction, on the driver or per broker on the executors
# ------------------------------------------------------------------------------------------------------------


def _reduce_per_broker(wide: DataFrame, params, profile_override, op_bodies_given: bool,
                       critical_within_ms: int) -> DataFrame:
    def reduce_group(table: pa.Table) -> pa.Table:
        outs = reduce_input(table, params, profile_override, critical_within_ms, op_bodies_given)
        return output_union(outs)

    return wide.groupBy("broker").applyInArrow(reduce_group, RECON_OUTPUT.spark_schema())


def _split(out: DataFrame) -> Dict[str, DataFrame]:
    frames = {name: conform(out.where(F.col("out") == name), table)
              for name, table in RECON_OUTPUT_TABLES.items()}
    # ranks came per broker (or per chunk of transactions): rank again over every broker, in the same order
    c = F.col
    cb = frames["check_back"]
    prio = F.when(c("priority") == "CRITICAL", 0).when(c("priority") == "HIGH", 1).otherwise(2)
    w = Window.orderBy(prio, c("deadline_ms").asc_nulls_last(), c("age_ms").desc(), c("broker"),
                       c("transaction_key"))
    cb = cb.withColumn("urgency_rank", F.row_number().over(w))
    frames["check_back"] = conform(cb, RECON_OUTPUT_TABLES["check_back"]).orderBy("urgency_rank")
    return frames


def reconstruct(
    frames: Any,
    params: ParamsArg = None,
    profile_override: Union[None, str, Mapping[str, str]] = None,
    materialize: bool = False,
    local: Optional[bool] = None,
    critical_within_ms: int = 60000,
    timings: Optional[Dict[str, float]] = None,
    path: Optional[str] = None,
    keep_linked: bool = False,
) -> AuditResult:
    """Frames (a mapping or an object with attributes; see the module doc) -> AuditResult.

    ``params``: None (each broker's profile defaults, as_of = its newest store time), one AuditParams for all,
    or {broker or profile: AuditParams}.  ``profile_override``: a profile for all brokers or
    {broker: profile}.  ``path`` (PATHS): ``driver`` = collect the inputs and reduce on the driver (one Spark
    job); ``broker`` = reduce per broker on the executors (one shuffle); ``distributed`` = link with Spark
    joins and reduce per partition of transactions (jobs/reconstruct/distributed.py); ``auto`` / None = the
    driver when the inputs have at most LOCAL_MAX_ROWS rows (one count job decides), else distributed.
    ``local`` (when ``path`` is None or auto): True = driver, False = broker.  ``materialize`` (executor
    paths): compute the outputs now as a local checkpoint, so that each output read does not run the
    reduction again.  ``timings``: receives the seconds of ``reconstruct.collect`` / ``.reduce`` / ``.frames``
    (driver path) or ``.executors``.  ``keep_linked`` (distributed path, ``materialize``): the linked
    evidence stays persisted as ``AuditResult.linked`` (the caller unpersists it).
    """
    t = timings if timings is not None else {}
    t0 = time.monotonic()
    check_override(profile_override)
    if path not in (None, *PATHS):
        raise ValueError(f"unknown reconstruct path {path!r}; expected one of {PATHS}")
    wide = input_frame(frames)
    op_bodies_given = _frame(frames, "op_bodies") is not None
    if path in (None, "auto"):
        if local is None:
            local = wide.count() <= LOCAL_MAX_ROWS
            path = "driver" if local else "distributed"
        else:
            path = "driver" if local else "broker"
    carried = _frame(frames, "carried")     # Arrow RECON_INPUT rows (an incremental run's carried state)
    final = _frame(frames, "final")         # STATE_FINAL rows (its settled transactions): Arrow or a DataFrame
    return reduce_frame(wide, path, params, profile_override, op_bodies_given, materialize, critical_within_ms,
                        carried, t, t0, final, keep_linked)


def reduce_frame(wide: DataFrame, path: str, params: ParamsArg = None, profile_override=None,
                 op_bodies_given: bool = True, materialize: bool = True, critical_within_ms: int = 60000,
                 carried: Optional[pa.Table] = None, timings: Optional[Dict[str, float]] = None,
                 t0: Optional[float] = None, final: Union[None, pa.Table, DataFrame] = None,
                 keep_linked: bool = False) -> AuditResult:
    """RECON_INPUT rows (``wide``, plus ``carried`` Arrow rows) reduced on ``path`` (driver, broker or
    distributed); see :func:`reconstruct`.  ``final``: carried settled transactions (``reduce_input``); with
    them the broker path is taken as distributed.  ``final`` as a DataFrame: ``carried`` holds their facts
    only, their consume-queue tuples come from it (:func:`final_input_frame`, on the executors; collected
    with it on the driver path)."""
    t = timings if timings is not None else {}
    t0 = time.monotonic() if t0 is None else t0
    spark = wide.sparkSession
    if isinstance(final, DataFrame):
        if path == "driver":
            from jobs.reconstruct.settle import final_input

            final = _conform_arrow(final.toArrow(), STATE_FINAL.arrow_schema())
            tuples = final_input(final, {})
            if tuples is not None:
                carried = tuples if carried is None else pa.concat_tables([carried, tuples.cast(carried.schema)])
        else:
            wide = wide.union(final_input_frame(final))
    if path == "driver":
        table = wide.toArrow()
        if carried is not None and carried.num_rows:
            table = pa.concat_tables([table, carried.cast(table.schema)])
        t1 = time.monotonic()
        outs = reduce_input(table, params, profile_override, critical_within_ms, op_bodies_given, final)
        t.update({"reconstruct.collect": t1 - t0, "reconstruct.reduce": time.monotonic() - t1})
        return AuditResult(arrow=outs, spark=spark)
    if carried is not None and carried.num_rows:
        wide = wide.union(arrow_frame(spark, carried, schema=RECON_INPUT.spark_schema()))
    if path == "broker" and _has_rows(final):
        path = "distributed"        # one task per broker has no place for the settled rows (AuditResult.path)
    if path == "distributed":
        dist = reduce_distributed(wide, params, profile_override, op_bodies_given, critical_within_ms,
                                  final=final)
        out, tasks = dist.out, dist.reduce_tasks
    elif path == "broker":
        out = _reduce_per_broker(wide, params, profile_override, op_bodies_given, critical_within_ms)
        dist, tasks = None, None
    else:
        raise ValueError(f"unknown reconstruct path {path!r}")
    linked = None
    if materialize:
        out = out.localCheckpoint(eager=True)
        if dist is not None:
            linked = dist.linked if keep_linked else None
            dist.unpersist(keep_linked)
    if tasks is None and materialize:       # one task per broker
        tasks = out.where(F.col("out") == "profiles").count()
    t["reconstruct.executors"] = time.monotonic() - t0
    return AuditResult(frames=_split(out), path=path, reduce_tasks=tasks, linked=linked)


def reduce_arrow(spark, table: pa.Table, path: str, params: ParamsArg = None, profile_override=None,
                 op_bodies_given: bool = True, critical_within_ms: int = 60000) -> AuditResult:
    """A RECON_INPUT Arrow table (jobs.reconstruct.reducer.input_table) reduced on ``path`` through Spark (the
    executor paths' equality with ``reduce_input`` on the same rows is what the tests check)."""
    wide = arrow_frame(spark, table, schema=RECON_INPUT.spark_schema())
    return reduce_frame(wide, path, params, profile_override, op_bodies_given, True, critical_within_ms)


def _has_rows(final: Union[None, pa.Table, DataFrame]) -> bool:
    """Whether ``final`` may hold settled transactions (a DataFrame is not counted: it may)."""
    return final is not None and (isinstance(final, DataFrame) or final.num_rows > 0)


def _conform_arrow(t: pa.Table, schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([t.column(f.name).cast(f.type) for f in schema], schema=schema)


class _PerBatch:
    """mapInArrow body: ``fn`` (Spark-free, Arrow table -> Arrow table or None) applied to each batch."""

    def __init__(self, fn, schema: pa.Schema):
        self.fn, self.schema = fn, schema

    def __call__(self, batches):
        for b in batches:
            if not b.num_rows:
                continue
            got = self.fn(pa.Table.from_batches([b]))
            if got is not None and got.num_rows:
                yield from _conform_arrow(got, self.schema).to_batches()


def final_input_frame(final: DataFrame) -> DataFrame:
    """settle.final_input's consume-queue tuples (``cq_record`` RECON_INPUT rows) of settled transactions
    carried as a DataFrame, batch by batch on the executors (the facts rows come with ``carried``)."""
    from jobs.reconstruct.settle import final_input

    return final.select("broker", "cq_records").mapInArrow(
        _PerBatch(lambda t: final_input(t, {}), RECON_INPUT.arrow_schema()), RECON_INPUT.spark_schema())


def final_frame(spark, final: Union[pa.Table, DataFrame]) -> DataFrame:
    """STATE_FINAL rows as a DataFrame (Arrow ones converted)."""
    if isinstance(final, DataFrame):
        return final
    return arrow_frame(spark, final, schema=STATE_FINAL.spark_schema())


def reopened_frames(result: AuditResult, final: Union[pa.Table, DataFrame], offsets) -> Dict[str, str]:
    """jobs.reconstruct.settle.reopened for outputs reduced on the executors, with the settled rows
    ``final`` a DataFrame (Arrow ones are converted): their per-broker facts (consume offsets, profiles,
    whether DISCARDED) one small aggregate, the reduced keys grouped and joined with the settled rows' keys
    in Spark (the settled rows' own keys subtracted), the keys of each batch of settled rows given by
    settle.self_keys / settle.final_keys."""
    from jobs.reconstruct.settle import (
        CQ_CODES,
        DISCARDED,
        LOST_SOURCES,
        ORPHAN_CODES,
        changed_facts,
        damaged_with_discards,
        final_keys,
        self_keys,
    )

    c = F.col
    t, a = result.transactions, result.anomalies
    spark = t.sparkSession
    final = final_frame(spark, final)
    profiles = {r["broker"]: r["profile"] for r in result.profiles.select("broker", "profile").collect()}
    agg = final.groupBy("broker").agg(
        F.max("half_consume_offset").alias("half_consume_offset_max"),
        F.max("op_consume_offset").alias("op_consume_offset_max"),
        F.collect_set("profile").alias("profile_distinct"),
        F.max(F.coalesce(c("state") == DISCARDED, F.lit(False))).alias("_discarded")).collect()
    why = changed_facts([r.asDict() for r in agg], profiles, offsets)
    have = {r["broker"] for r in agg if r["_discarded"]}
    if have:        # only then can decoder findings reopen the run (discard_damage)
        damaged = [r["broker"] for r in
                   a.where(c("source").isin(*LOST_SOURCES)).select("broker").distinct().collect()]
        for b, w in damaged_with_discards(have, damaged).items():
            why.setdefault(b, w)

    def keys(df, kind, col):
        return df.select("broker", F.lit(kind).alias("kind"), c(col).cast("string").alias("key"))

    rec = a.where(c("source") == "reconstruct")
    mine = (keys(t, "k", "transaction_key").unionByName(keys(t, "o", "prepared_commitlog_offset"))
            .unionByName(keys(rec.where(c("code").isin(*ORPHAN_CODES)), "h", "queue_offset"))
            .unionByName(keys(rec.where(c("code").isin(*CQ_CODES)), "r", "physical_offset"))
            .where(c("key").isNotNull()).groupBy("broker", "kind", "key").count())
    key_schema = pa.schema([("broker", pa.string()), ("kind", pa.string()), ("key", pa.string())])
    schema = "broker string, kind string, key string"
    own_df = (final.mapInArrow(_PerBatch(self_keys, key_schema), schema).where(c("key").isNotNull())
              .groupBy("broker", "kind", "key").agg(F.count(F.lit(1)).alias("own")))
    theirs = final.mapInArrow(_PerBatch(final_keys, key_schema), schema)
    extra = (mine.join(own_df, ["broker", "kind", "key"], "left")
             .where(c("count") > F.coalesce(c("own"), F.lit(0))).select("broker", "kind", "key"))
    for r in extra.join(theirs, ["broker", "kind", "key"]).limit(100).collect():
        why.setdefault(r["broker"], f"a reduced row names settled transaction evidence ({r['kind']} {r['key']})")
    return why


def detect_profile(
    commitlog: DataFrame,
    statetable: Optional[DataFrame] = None,
    redolog: Optional[DataFrame] = None,
    op_bodies: Optional[DataFrame] = None,
    profile_override: Union[None, str, Mapping[str, str]] = None,
) -> DataFrame:
    """-> (broker, profile, detected_profile, evidence) for every broker of the inputs.

    Rules, first match wins: statetable/redolog units -> 3.x; half/op/discard topic records -> 5.1+ if an op
    body has a comma, a half has __transactionId__ or any record has magic V2, else 4.3-5.0 (4.3.0 and 5.0
    cannot be told apart from 4.3.1-4.9 by the records: 5.0 differs only in the checkpoint size); PREPARED
    records in real topics -> 4.0-4.2 if they carry UNIQ_KEY (4.x clients always set it), else 3.x (prepared
    QUEUEOFFSET = statetable counter); magic V2 alone -> 5.1+; else unknown.  ``profile_override``: one
    profile for every broker, or {broker: profile} (others keep the detected one).
    """
    frames = {"commitlog": commitlog, "statetable": statetable, "redolog": redolog, "op_bodies": op_bodies}
    return reconstruct(frames, profile_override=profile_override).profiles


__all__ = [
    "AuditParams",
    "AuditResult",
    "reconstruct",
    "reduce_frame",
    "reduce_arrow",
    "reopened_frames",
    "input_frame",
    "detect_profile",
    "commitlog_bounds_from_layout",
    "empty_frame",
    "conform",
    "LOCAL_MAX_ROWS",
    "PATHS",
    "PROFILES",
    "HALF_TOPIC",
    "OP_TOPIC",
    "DISCARD_TOPIC",
    "TX_SYSTEM_TOPICS",
    "CHECK_GROUP",
    "HALF_QUEUE",
    "PREPARED_RECORD",
    "COMMITTED",
    "ROLLED_BACK",
    "PREPARED",
    "DISCARDED",
    "FLAGS",
    "RECOVERY_ACTIONS",
]
