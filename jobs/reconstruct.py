"""Reconstruct the true state of every transactional message from a broker store's decoded frames.

Pure DataFrame -> DataFrame transforms (no action runs here unless ``reconstruct(materialize=True)``).  Inputs
are the frames the data sources produce, each ``broker`` + the columns of a schemas.store table:

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
                      derived from ``layout_info`` (jobs.store_frames.StoreFrames) when the frames have it,
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
  COMMIT/ROLLBACK unit; else a discard -> DISCARDED; else PREPARED.

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

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Union

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.flags import FLAGS, RECOVERY_ACTIONS
from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES as PROFILES_TABLE, RECOVERY, TRANSACTIONS
from schemas.core import Table
from schemas.store import REDOLOG, STATETABLE

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"
TX_SYSTEM_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)

HALF_QUEUE = "HALF_QUEUE"  # 4.3+: half topic + op topic
PREPARED_RECORD = "PREPARED_RECORD"  # 3.x, 4.0-4.2: PREPARED/COMMIT/ROLLBACK records in the real topic

P_3X, P_40, P_43, P_51, P_UNKNOWN = "3.x", "4.0-4.2", "4.3-5.0", "5.1+", "unknown"
PROFILES = {
    P_3X: "RocketMQ 3.x: prepared/commit/rollback records in the real topic, transaction/statetable + "
    "redolog, timer check without a maximum",
    P_40: "RocketMQ 4.0-4.2: prepared/commit/rollback records in the real topic, no check service",
    P_43: "RocketMQ 4.3-5.0: half/op topics, single-offset op bodies. 4.3.0 (timeout 3000, max 5) and "
    "5.0 (32-byte checkpoint) are not distinguishable from the records alone: override the params/profile "
    "if known",
    P_51: "RocketMQ 5.1+: half/op topics with comma-batched op bodies, __transactionId__ on halves, magic "
    "V2. 5.1.0 (check interval 60 s) vs 5.1.1+ (30 s) is visible only in the checkpoint size (40 bytes from "
    "5.1.1)",
    P_UNKNOWN: "no transactional record in the store: 4.3-5.0 defaults are used",
}

COMMITTED, ROLLED_BACK, PREPARED, DISCARDED = "COMMITTED", "ROLLED_BACK", "PREPARED", "DISCARDED"
#: txlog_io anomaly kinds about a whole mapped file, not a record in it (never CORRUPT_RECORD)
FILE_LEVEL_ANOMALIES = (
    "FILE_SIZE_MISMATCH",
    "FILE_GAP",
    "FILE_OVERLAP",
    "BAD_FILE_NAME",
    "MISALIGNED_FILE_NAME",
    "MISSING_FILE",
)
_SEP = "\u0001"  # never inside a property value (it is the properties name/value separator)
_LONG_MAX = (1 << 63) - 1


# ------------------------------------------------------------------------------------------------------------
# Parameters
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditParams:
    """Broker thresholds the audit judges against (names as in BrokerConfig / MessageStoreConfig).

    ``transactionCheckMax`` None = no maximum (3.x, 4.0-4.2); ``transactionCheckInterval`` None = no check
    service (4.0-4.2); ``fileReservedTime`` in hours; ``as_of_ms`` None = the broker's newest record store
    time (the snapshot time of an offline store).
    """

    transactionTimeOut: int = 6000
    transactionCheckMax: Optional[int] = 15
    transactionCheckInterval: Optional[int] = 60000
    fileReservedTime: int = 72
    as_of_ms: Optional[int] = None

    @classmethod
    def for_profile(cls, profile: str, overrides: Optional[Mapping[str, Any]] = None) -> "AuditParams":
        """Defaults of the version line (store-format reference 7.7, 8.3), then ``overrides`` (field
        names)."""
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; expected one of {sorted(PROFILES)}")
        base = {
            # 3.x: checkTransactionMessageAtleastInterval / checkTransactionMessageTimerInterval, no max, 48 h
            P_3X: cls(
                transactionTimeOut=60000,
                transactionCheckMax=None,
                transactionCheckInterval=60000,
                fileReservedTime=48,
            ),
            P_40: cls(transactionTimeOut=6000, transactionCheckMax=None, transactionCheckInterval=None),
            P_43: cls(6000, 15, 60000, 72),
            P_51: cls(6000, 15, 30000, 72),
            P_UNKNOWN: cls(6000, 15, 60000, 72),
        }[profile]
        if overrides:
            known = {f.name for f in fields(cls)}
            bad = set(overrides) - known
            if bad:
                raise ValueError(f"unknown AuditParams field(s) {sorted(bad)}; expected {sorted(known)}")
            base = replace(base, **dict(overrides))
        return base


ParamsArg = Union[None, AuditParams, Mapping[str, AuditParams]]


@dataclass(frozen=True)
class AuditResult:
    transactions: DataFrame
    check_back: DataFrame
    recovery: DataFrame
    anomalies: DataFrame
    profiles: DataFrame


# ------------------------------------------------------------------------------------------------------------
# Small helpers
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


def _codes(*pairs) -> Column:
    """array of the codes whose condition holds (null conditions count as false)."""
    for code, _ in pairs:
        assert code in FLAGS, code
    return F.array_compact(F.array(*[F.when(cond, F.lit(code)) for code, cond in pairs]))


def _has(flags: Column, code: str) -> Column:
    assert code in FLAGS, code
    return F.array_contains(flags, code)


def _is_system_topic(topic: Column) -> Column:
    return (
        topic.isin(HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC)
        | topic.startswith("%RETRY%")
        | topic.startswith("%DLQ%")
        | topic.startswith("rmq_sys_")
        | topic.startswith("RMQ_SYS_")
    )


def _uniq_tx_id(uniq_key: Column, pgroup: Column, real_topic: Column) -> Column:
    return F.concat_ws(
        _SEP, F.lit("U"), uniq_key, F.coalesce(pgroup, F.lit("")), F.coalesce(real_topic, F.lit(""))
    )


def _union(*dfs: DataFrame) -> DataFrame:
    """Positional UNION ALL of frames, aligned to the first frame's columns (missing ones become typed nulls).
    Cheaper to analyse than unionByName, which matters for plans of this size."""
    first = dfs[0]
    names = first.columns
    types = {f.name: f.dataType for f in first.schema.fields}
    out = first
    for df in dfs[1:]:
        if df.columns != names:
            have = set(df.columns)
            df = df.select(*[F.col(n) if n in have else F.lit(None).cast(types[n]).alias(n) for n in names])
        out = out.union(df)
    return out


def _sorted_set(c: Column) -> Column:
    return F.sort_array(F.collect_set(c))


# ------------------------------------------------------------------------------------------------------------
# Per-broker facts and profile detection
# ------------------------------------------------------------------------------------------------------------

_FACT_SUMS = (
    "n_half",
    "n_op",
    "n_discard",
    "n_prep",
    "n_prep_uk",
    "n_prep_qo",
    "n_v2",
    "n_txid",
    "n_st",
    "n_redo",
    "n_comma",
    "n_cq",
)


def broker_facts(
    commitlog: DataFrame,
    consumequeue: Optional[DataFrame] = None,
    statetable: Optional[DataFrame] = None,
    redolog: Optional[DataFrame] = None,
    consumer_offsets: Optional[DataFrame] = None,
    op_bodies: Optional[DataFrame] = None,
    commitlog_bounds: Optional[DataFrame] = None,
) -> DataFrame:
    """-> one row per broker: record counts the profile detection uses (``n_*``) and the store bounds.

    min_commitlog_offset = start of the oldest retained CommitLog file: the smallest of
    ``commitlog_bounds.min_commitlog_offset`` (broker, min_commitlog_offset: from the store listing, see
    commitlog_bounds_from_layout) and physical_offset - file_position of the records (enough when the frame
    holds every record; a commitlog holding only transaction records needs the listing).  Anything below was
    deleted by retention.  min_half_queue_offset = oldest retained half record's
    QUEUEOFFSET. half/op_consume_offset = CID_RMQ_SYS_TRANS on queue 0 of the half / op topic (null when
    absent). snapshot_ms = newest store time.  One pass: projections of every input, unioned, one aggregation.
    """
    c = F.col

    def i(cond):
        return F.when(cond, 1).otherwise(0)

    sys_topic = _is_system_topic(c("topic"))
    prep = (c("transaction_type") == "PREPARED") & ~sys_topic
    parts = [
        commitlog.select(
            "broker",
            i(c("topic") == HALF_TOPIC).alias("n_half"),
            i(c("topic") == OP_TOPIC).alias("n_op"),
            i(c("topic") == DISCARD_TOPIC).alias("n_discard"),
            i(prep).alias("n_prep"),
            i(prep & c("uniq_key").isNotNull()).alias("n_prep_uk"),
            i(prep & (c("queue_offset") > 0)).alias("n_prep_qo"),
            i(c("magic_version") == 2).alias("n_v2"),
            i((c("topic") == HALF_TOPIC) & c("transaction_id").isNotNull()).alias("n_txid"),
            (c("physical_offset") - c("file_position")).alias("min_commitlog_offset"),
            F.when(c("topic") == HALF_TOPIC, c("queue_offset")).alias("min_half_queue_offset"),
            c("store_timestamp").alias("snapshot_ms"),
        )
    ]
    if statetable is not None:
        parts.append(statetable.select("broker", F.lit(1).alias("n_st")))
    if redolog is not None:
        parts.append(redolog.select("broker", F.lit(1).alias("n_redo")))
    if op_bodies is not None:
        parts.append(
            op_bodies.select("broker", i(F.instr(c("body").cast("string"), ",") > 0).alias("n_comma"))
        )
    if consumequeue is not None:
        parts.append(consumequeue.select("broker", F.lit(1).alias("n_cq")))
    if commitlog_bounds is not None:
        # n_cq ("the store has consume queues"): the listing's queue directories count as well as units, so a
        # caller may pass only the transaction queues' units
        extra = [c("n_cq")] if "n_cq" in commitlog_bounds.columns else []
        parts.append(commitlog_bounds.select("broker", "min_commitlog_offset", *extra))
    if consumer_offsets is not None:
        mine = (c("group") == CHECK_GROUP) & (c("queue_id") == 0)
        parts.append(
            consumer_offsets.select(
                "broker",
                F.when(mine & (c("topic") == HALF_TOPIC), c("offset")).alias("half_consume_offset"),
                F.when(mine & (c("topic") == OP_TOPIC), c("offset")).alias("op_consume_offset"),
            )
        )
    cols = (
        *_FACT_SUMS,
        "min_commitlog_offset",
        "min_half_queue_offset",
        "snapshot_ms",
        "half_consume_offset",
        "op_consume_offset",
    )
    parts = [
        p.select("broker", *[c(n) if n in p.columns else F.lit(None).cast("long").alias(n) for n in cols])
        for p in parts
    ]
    u = _union(*parts)
    aggs = [F.coalesce(F.sum(col), F.lit(0)).cast("long").alias(col) for col in _FACT_SUMS]
    return u.groupBy("broker").agg(
        *aggs,
        F.min("min_commitlog_offset").alias("min_commitlog_offset"),
        F.min("min_half_queue_offset").alias("min_half_queue_offset"),
        F.max("snapshot_ms").alias("snapshot_ms"),
        F.max("half_consume_offset").alias("half_consume_offset"),
        F.max("op_consume_offset").alias("op_consume_offset"),
    )


def profile_columns(profile_override: Union[None, str, Mapping[str, str]] = None):
    """(detected_profile, evidence, profile) column expressions over broker_facts() columns."""
    c = F.col
    halfish = (c("n_half") + c("n_op") + c("n_discard")) > 0
    v51 = (c("n_comma") > 0) | (c("n_txid") > 0) | (c("n_v2") > 0)
    detected = (
        F.when((c("n_st") > 0) | (c("n_redo") > 0), P_3X)
        .when(halfish & v51, P_51)
        .when(halfish, P_43)
        .when((c("n_prep") > 0) & (c("n_prep_uk") > 0), P_40)
        .when(c("n_prep") > 0, P_3X)
        .when(c("n_v2") > 0, P_51)
        .otherwise(P_UNKNOWN)
    )

    def ev(cond, fmt, col=None):
        return F.when(cond, F.format_string(fmt, col) if col is not None else F.lit(fmt))

    evidence = F.array_compact(
        F.array(
            ev(c("n_st") > 0, "%d statetable units", c("n_st")),
            ev(c("n_redo") > 0, "%d redolog units", c("n_redo")),
            ev(c("n_half") > 0, "%d half records", c("n_half")),
            ev(c("n_op") > 0, "%d op records", c("n_op")),
            ev(c("n_discard") > 0, "%d discard records", c("n_discard")),
            ev(c("n_comma") > 0, "%d comma-batched op bodies (5.1+)", c("n_comma")),
            ev(c("n_txid") > 0, "%d halves with __transactionId__ (5.1+)", c("n_txid")),
            ev(c("n_v2") > 0, "%d magic V2 records (5.1+)", c("n_v2")),
            ev(c("n_prep") > 0, "%d PREPARED records in real topics", c("n_prep")),
            ev(c("n_prep_uk") > 0, "%d of them with UNIQ_KEY (4.x client)", c("n_prep_uk")),
            ev((c("n_prep") > 0) & (c("n_prep_uk") == 0), "PREPARED records without UNIQ_KEY (3.x client)"),
            ev(
                c("n_prep_qo") > 0,
                "%d PREPARED with QUEUEOFFSET > 0 (3.x statetable counter)",
                c("n_prep_qo"),
            ),
        )
    )
    return detected, evidence, F.coalesce(_override_column(profile_override), detected)


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
    facts = broker_facts(commitlog, statetable=statetable, redolog=redolog, op_bodies=op_bodies)
    return profiles_from_facts(facts, profile_override)


def profiles_from_facts(facts: DataFrame, profile_override=None) -> DataFrame:
    detected, evidence, profile = profile_columns(profile_override)
    return conform(
        facts.select(
            "broker", profile.alias("profile"), detected.alias("detected_profile"), evidence.alias("evidence")
        ),
        PROFILES_TABLE,
    )


def _override_column(profile_override) -> Column:
    if profile_override is None:
        return F.lit(None).cast("string")
    if isinstance(profile_override, str):
        if profile_override not in PROFILES:
            raise ValueError(f"unknown profile {profile_override!r}; expected one of {sorted(PROFILES)}")
        return F.lit(profile_override)
    col = None
    for broker, prof in profile_override.items():
        if prof not in PROFILES:
            raise ValueError(f"unknown profile {prof!r} for broker {broker!r}")
        col = (
            F.when(F.col("broker") == broker, F.lit(prof))
            if col is None
            else col.when(F.col("broker") == broker, F.lit(prof))
        )
    return col if col is not None else F.lit(None).cast("string")


def param_columns(params: ParamsArg = None) -> dict:
    """{timeout_ms, check_max, check_interval_ms, reserved_ms, as_of_ms: Column} over columns ``broker``,
    ``profile`` and ``snapshot_ms`` (CASE expressions; no join).

    ``params``: None (defaults of each broker's profile), one AuditParams for every broker, or a mapping whose
    keys are broker names or profile names (a broker entry wins; brokers matching neither get their profile's
    defaults). as_of_ms None -> snapshot_ms (the broker's newest store time).
    """
    by_profile = {prof: AuditParams.for_profile(prof) for prof in PROFILES}
    by_broker: dict = {}
    if isinstance(params, AuditParams):
        by_profile = {prof: params for prof in PROFILES}
    elif params:
        for key, p in params.items():
            if not isinstance(p, AuditParams):
                raise TypeError(f"params[{key!r}] must be AuditParams, got {type(p).__name__}")
            (by_profile if key in PROFILES else by_broker)[key] = p

    getters = {
        "timeout_ms": lambda p: p.transactionTimeOut,
        "check_max": lambda p: p.transactionCheckMax,
        "check_interval_ms": lambda p: p.transactionCheckInterval,
        "reserved_ms": lambda p: (
            None if p.fileReservedTime is None else int(p.fileReservedTime * 3600 * 1000)
        ),
        "as_of_ms": lambda p: p.as_of_ms,
    }
    out = {}
    for name, get in getters.items():
        col = None
        branches = [(F.col("broker") == b, get(p)) for b, p in by_broker.items()] + [
            (F.col("profile") == pr, get(p)) for pr, p in by_profile.items()
        ]
        for cond, val in branches:
            v = F.lit(val).cast("long") if val is not None else F.lit(None).cast("long")
            col = F.when(cond, v) if col is None else col.when(cond, v)
        out[name] = col
    out["as_of_ms"] = F.coalesce(out["as_of_ms"], F.col("snapshot_ms"))
    return out


# ------------------------------------------------------------------------------------------------------------
# Evidence rows: one schema for every record that says something about a transaction
# ------------------------------------------------------------------------------------------------------------

EVIDENCE_COLUMNS = (
    ("broker", "string"),
    ("role", "string"),
    ("tx_id", "string"),
    ("mechanism", "string"),
    ("physical_offset", "bigint"),
    ("total_size", "int"),
    ("queue_id", "int"),
    ("queue_offset", "bigint"),
    ("store_timestamp", "bigint"),
    ("born_timestamp", "bigint"),
    ("msg_id", "string"),
    ("body_crc_ok", "boolean"),
    ("uniq_key", "string"),
    ("transaction_id", "string"),
    ("keys", "string"),
    ("pgroup", "string"),
    ("real_topic", "string"),
    ("real_qid", "int"),
    ("check_times", "int"),
    ("tran_prepared_qo", "bigint"),
    ("immunity_s", "bigint"),
    ("end_type", "string"),
    ("pto", "bigint"),
    ("half_offset", "bigint"),
    ("piece_index", "int"),
    ("piece", "string"),
    ("st_state", "string"),
)
COPY, END, OP, DISCARD, ST, REDO_P, REDO_E, ORIGREF, PROBLEM = (
    "COPY",
    "END",
    "OP",
    "DISCARD",
    "ST",
    "REDO_P",
    "REDO_E",
    "ORIGREF",
    "PROBLEM",
)


def _evidence(df: DataFrame, role: str, **cols: Column) -> DataFrame:
    """Project ``df`` onto EVIDENCE_COLUMNS: given expressions, else same-named columns of df, else nulls."""
    sel = []
    for name, typ in EVIDENCE_COLUMNS:
        if name == "role":
            e = F.lit(role)
        elif name in cols:
            e = cols[name]
        elif name in df.columns:
            e = F.col(name)
        else:
            e = F.lit(None)
        sel.append(e.cast(typ).alias(name))
    return df.select(*sel)


def _p_tx_id(offset: Column) -> Column:
    return F.concat(F.lit("P" + _SEP), offset.cast("string"))


def group_copies(commitlog: DataFrame) -> DataFrame:
    """COPY evidence rows: half copies (4.3+, topic RMQ_SYS_TRANS_HALF_TOPIC) and PREPARED records in real
    topics (3.x, 4.0-4.2), each with its transaction id.

    Halves: tx_id from (UNIQ_KEY, PGROUP, REAL_TOPIC) -- every copy of one message, however many re-puts -- or
    the copy's own offset when it has no UNIQ_KEY; PREPARED records: one transaction each ("P" + offset).
    """
    c = F.col
    common = dict(
        check_times=c("transaction_check_times"),
        tran_prepared_qo=c("tran_prepared_queue_offset"),
        immunity_s=c("check_immunity_time_s"),
    )
    half = commitlog.filter(c("topic") == HALF_TOPIC)
    half = _evidence(
        half,
        COPY,
        mechanism=F.lit(HALF_QUEUE),
        **common,
        tx_id=F.when(
            c("uniq_key").isNotNull(), _uniq_tx_id(c("uniq_key"), c("pgroup"), c("real_topic"))
        ).otherwise(F.concat(F.lit("O" + _SEP), c("physical_offset").cast("string"))),
    )
    prep = commitlog.filter((c("transaction_type") == "PREPARED") & ~_is_system_topic(c("topic")))
    prep = _evidence(
        prep,
        COPY,
        mechanism=F.lit(PREPARED_RECORD),
        **common,
        real_topic=c("topic"),
        real_qid=c("queue_id"),
        tx_id=_p_tx_id(c("physical_offset")),
    )
    return _union(half, prep)


def end_records(commitlog: DataFrame) -> DataFrame:
    """END evidence rows: COMMIT / ROLLBACK records in real topics (retry/schedule copies of committed
    messages keep the COMMIT type; they are excluded by topic).  pto = PREPARED_TRANSACTION_OFFSET; real_topic
    = the REAL_TOPIC property (a 4.3+ commit keeps the half's) or the record's topic; mechanism = HALF_QUEUE
    when the record carries REAL_TOPIC (it copies a half's properties), else PREPARED_RECORD."""
    c = F.col
    e = commitlog.filter(c("transaction_type").isin("COMMIT", "ROLLBACK") & ~_is_system_topic(c("topic")))
    return _evidence(
        e,
        END,
        end_type=c("transaction_type"),
        pto=c("prepared_transaction_offset"),
        mechanism=F.when(c("real_topic").isNotNull(), F.lit(HALF_QUEUE)).otherwise(F.lit(PREPARED_RECORD)),
        real_topic=F.coalesce(c("real_topic"), c("topic")),
        real_qid=F.coalesce(c("real_qid"), c("queue_id")),
    )


def discard_records(commitlog: DataFrame) -> DataFrame:
    """DISCARD evidence rows: TRANS_CHECK_MAX_TIME_TOPIC records, tx_id from (UNIQ_KEY, PGROUP,
    REAL_TOPIC)."""
    c = F.col
    d = commitlog.filter(c("topic") == DISCARD_TOPIC)
    return _evidence(
        d,
        DISCARD,
        check_times=c("transaction_check_times"),
        tx_id=F.when(
            c("uniq_key").isNotNull(), _uniq_tx_id(c("uniq_key"), c("pgroup"), c("real_topic"))
        ).otherwise(F.concat(F.lit("D" + _SEP), c("physical_offset").cast("string"))),
    )


def op_bodies_from_commitlog(commitlog: DataFrame) -> DataFrame:
    """The op_bodies input from commitlog rows of the op topic that carry a body."""
    c = F.col
    return commitlog.filter((c("topic") == OP_TOPIC) & c("body").isNotNull()).select(
        "broker",
        "queue_id",
        "physical_offset",
        "queue_offset",
        "store_timestamp",
        "total_size",
        "body_crc_ok",
        c("body").cast("string").alias("body"),
    )


def parse_op_bodies(op_bodies: DataFrame) -> DataFrame:
    """OP evidence rows: one per half offset named in an op body.

    Both forms are parsed: ``1234`` (4.3-5.0) and ``1,2,3,`` (5.1+, trailing comma); empty pieces are dropped
    (an empty body means "done" and names nothing); a piece that is not a decimal number keeps half_offset
    null. physical_offset / queue_offset / store_timestamp are the op record's; queue_id its queue (= the half
    queue).
    """
    c = F.col
    body = F.coalesce(c("body").cast("string"), F.lit(""))
    df = op_bodies.select("*", F.posexplode(F.split(body, ",")).alias("piece_index", "piece"))
    df = df.withColumn("piece", F.trim(c("piece"))).filter(c("piece") != "")
    qid = c("queue_id") if "queue_id" in op_bodies.columns else F.lit(0)
    return _evidence(df, OP, queue_id=qid, half_offset=F.expr("try_cast(piece AS BIGINT)"))


def legacy_rows(statetable: DataFrame, redolog: DataFrame) -> DataFrame:
    """3.x evidence rows, keyed to the prepared record's transaction ("P" + CommitLog offset):
    ST (statetable unit: queue_offset = index, st_state), REDO_P (redolog PREPARED entry), REDO_E (redolog END
    entry: physical_offset = the COMMIT/ROLLBACK record, pto = the prepared offset from its tagsCode)."""
    c = F.col
    st = _evidence(
        statetable,
        ST,
        tx_id=_p_tx_id(c("commitlog_offset")),
        physical_offset=c("commitlog_offset"),
        queue_offset=c("index"),
        st_state=c("state"),
        pto=c("commitlog_offset"),
    )
    rp = _evidence(
        redolog.filter(c("kind") == "PREPARED"),
        REDO_P,
        tx_id=_p_tx_id(c("commitlog_offset")),
        physical_offset=c("commitlog_offset"),
        queue_offset=c("index"),
    )
    re = _evidence(
        redolog.filter(c("kind") != "PREPARED"),
        REDO_E,
        tx_id=_p_tx_id(c("tags_code")),
        physical_offset=c("commitlog_offset"),
        queue_offset=c("index"),
        pto=c("tags_code"),
    )
    return _union(st, rp, re)


def link_ends(rows: DataFrame) -> DataFrame:
    """Step A: END rows find the copy PREPARED_TRANSACTION_OFFSET points to; copies learn whether a COMMIT
    points to them.  One window over (broker, CommitLog offset of the copy).

    END rows get target_tx / target_qid / target_qo / target_mech (null: the pointed record is not in the
    store) and tx_id = target_tx, else the (UNIQ_KEY, PGROUP, topic) id the copies would have, else "P" + pto.
    COPY rows get committed.  Other rows pass through (new columns null).
    """
    c = F.col
    inA = c("role").isin(COPY, END)
    a = rows.filter(inA)
    w = Window.partitionBy("broker", F.when(c("role") == COPY, c("physical_offset")).otherwise(c("pto")))
    is_copy = c("role") == COPY
    a = a.select(
        *[c(n) for n in rows.columns if n != "tx_id"],
        F.when(c("role") == END, F.max(F.when(is_copy, c("tx_id"))).over(w)).alias("target_tx"),
        F.when(c("role") == END, F.max(F.when(is_copy, c("queue_id"))).over(w)).alias("target_qid"),
        F.when(c("role") == END, F.max(F.when(is_copy, c("queue_offset"))).over(w)).alias("target_qo"),
        F.when(c("role") == END, F.max(F.when(is_copy, c("mechanism"))).over(w)).alias("target_mech"),
        F.when(is_copy, F.max(F.when((c("role") == END) & (c("end_type") == "COMMIT"), True)).over(w)).alias(
            "committed"
        ),
        F.when(is_copy, c("tx_id"))
        .otherwise(
            F.coalesce(
                F.max(F.when(is_copy, c("tx_id"))).over(w),
                F.when(
                    c("uniq_key").isNotNull() & (c("mechanism") == HALF_QUEUE),
                    _uniq_tx_id(c("uniq_key"), c("pgroup"), c("real_topic")),
                ),
                _p_tx_id(c("pto")),
            )
        )
        .alias("tx_id"),
    )
    rest = rows.filter(~inA).select(
        *[c(n) for n in rows.columns if n != "tx_id"],
        *[
            F.lit(None).cast(t).alias(n)
            for n, t in (
                ("target_tx", "string"),
                ("target_qid", "int"),
                ("target_qo", "bigint"),
                ("target_mech", "string"),
                ("committed", "boolean"),
            )
        ],
        c("tx_id"),
    )
    return _union(a, rest)


def link_ops(rows: DataFrame) -> DataFrame:
    """Step B (after link_ends): op offsets are HALF-QUEUE offsets; one window over (broker, half queue id,
    half queue offset) joins them to the copy with that QUEUEOFFSET.

    OP rows get tx_id, copy_offset and copy_committed (null tx_id = orphan op).  COPY rows (half copies) get
    ``named`` (an op names them); ORIGREF rows -- a copy of every immunity re-put, keyed by its
    TRAN_PREPARED_QUEUE_OFFSET -- get ``named`` when the original's offset is named (the checker treats the
    re-put as resolved then); COMMIT END rows get ``named`` when an op names the copy they point to.
    """
    c = F.col
    half_copy = (c("role") == COPY) & (c("mechanism") == HALF_QUEUE)
    commit_end = (c("role") == END) & (c("end_type") == "COMMIT") & c("target_qo").isNotNull()
    inB = half_copy | (c("role") == OP) | commit_end
    b = rows.filter(inB)
    orig = rows.filter(half_copy & c("tran_prepared_qo").isNotNull()).select(
        *[F.lit(ORIGREF).alias(n) if n == "role" else c(n) for n in rows.columns]
    )
    b = _union(b, orig)
    k_qid = F.when(c("role").isin(COPY, ORIGREF, OP), c("queue_id")).otherwise(c("target_qid"))
    k_off = (
        F.when(c("role") == COPY, c("queue_offset"))
        .when(c("role") == ORIGREF, c("tran_prepared_qo"))
        .when(c("role") == OP, c("half_offset"))
        .otherwise(c("target_qo"))
    )
    w = Window.partitionBy("broker", k_qid, k_off)
    is_copy = c("role") == COPY
    is_op = c("role") == OP
    b = b.select(
        *[c(n) for n in rows.columns if n != "tx_id"],
        F.when(is_op, F.max(F.when(is_copy, c("tx_id"))).over(w)).otherwise(c("tx_id")).alias("tx_id"),
        F.when(is_op, F.max(F.when(is_copy, c("physical_offset"))).over(w)).alias("copy_offset"),
        F.when(is_op, F.max(F.when(is_copy, c("committed"))).over(w)).alias("copy_committed"),
        F.when(~is_op, F.max(F.when(is_op, True)).over(w)).alias("named"),
    )
    rest = rows.filter(~inB).select(
        *[c(n) for n in rows.columns if n != "tx_id"],
        c("tx_id"),
        F.lit(None).cast("bigint").alias("copy_offset"),
        F.lit(None).cast("boolean").alias("copy_committed"),
        F.lit(None).cast("boolean").alias("named"),
    )
    return _union(b, rest)


def evidence_rows(
    commitlog: DataFrame,
    op_bodies: DataFrame,
    statetable: Optional[DataFrame] = None,
    redolog: Optional[DataFrame] = None,
    cut=None,
) -> DataFrame:
    """Every evidence row, linked (steps A and B).  OP rows with a null tx_id are orphans.  ``cut`` (optional
    DataFrame -> DataFrame) is applied to the unlinked union and to the result (see
    reconstruct(materialize))."""
    cut = cut or (lambda df: df)
    parts = [
        group_copies(commitlog),
        end_records(commitlog),
        discard_records(commitlog),
        parse_op_bodies(op_bodies),
    ]
    if statetable is not None and redolog is not None:
        parts.append(legacy_rows(statetable, redolog))
    return cut(link_ops(link_ends(cut(_union(*parts)))))


# ------------------------------------------------------------------------------------------------------------
# Record-level problems
# ------------------------------------------------------------------------------------------------------------


def cq_mismatches(commitlog: DataFrame, consumequeue: DataFrame) -> DataFrame:
    """Consume-queue units of the half/op/discard queues vs the CommitLog records of those topics, both ways,
    in one aggregation per (broker, CommitLog offset).

    -> (broker, physical_offset, topic, queue_id, queue_offset, problem, detail); problem = 'NO_RECORD' (unit
    points where no record of those topics starts), 'DIFFERS' (size, topic, queue or queue offset differ) or
    'NO_UNIT' (record without unit).  build_transactions turns NO_RECORD below the oldest retained CommitLog
    offset into EVIDENCE_IN_DELETED_RANGE and ignores NO_UNIT for brokers without any CQ unit.
    """
    c = F.col
    units = consumequeue.filter(c("topic").isin(*TX_SYSTEM_TOPICS)).select(
        "broker",
        c("commitlog_offset").alias("physical_offset"),
        F.lit(True).alias("is_unit"),
        "topic",
        "queue_id",
        "queue_offset",
        c("size").alias("size"),
    )
    recs = commitlog.filter(c("topic").isin(*TX_SYSTEM_TOPICS)).select(
        "broker",
        "physical_offset",
        F.lit(False).alias("is_unit"),
        "topic",
        "queue_id",
        "queue_offset",
        c("total_size").alias("size"),
    )
    u = _union(units, recs)
    s = F.struct("topic", "queue_id", "queue_offset", "size")
    g = u.groupBy("broker", "physical_offset").agg(
        F.max(F.when(c("is_unit"), s)).alias("unit"),
        F.max(F.when(~c("is_unit"), s)).alias("rec"),
        F.sum(F.when(c("is_unit"), 1).otherwise(0)).alias("n_units"),
    )
    problem = (
        F.when(c("rec").isNull(), "NO_RECORD")
        .when(c("unit").isNull(), "NO_UNIT")
        .when((c("unit") != c("rec")) | (c("n_units") > 1), "DIFFERS")
    )
    where = F.coalesce(c("unit"), c("rec"))
    detail = (
        F.when(
            c("rec").isNull(),
            F.format_string(
                "CQ unit %s/%d@%d: no record of that topic at CommitLog offset %d",
                c("unit.topic"),
                c("unit.queue_id"),
                c("unit.queue_offset"),
                c("physical_offset"),
            ),
        )
        .when(
            c("unit").isNull(),
            F.format_string(
                "record %s/%d@%d at CommitLog offset %d has no CQ unit",
                c("rec.topic"),
                c("rec.queue_id"),
                c("rec.queue_offset"),
                c("physical_offset"),
            ),
        )
        .otherwise(
            F.format_string(
                "CQ unit %s/%d@%d size %d (%d units) vs record %s/%d@%d size %d at CommitLog offset %d",
                c("unit.topic"),
                c("unit.queue_id"),
                c("unit.queue_offset"),
                c("unit.size"),
                c("n_units"),
                c("rec.topic"),
                c("rec.queue_id"),
                c("rec.queue_offset"),
                c("rec.size"),
                c("physical_offset"),
            )
        )
    )
    return g.select(
        "broker",
        "physical_offset",
        where.topic.alias("topic"),
        where.queue_id.alias("queue_id"),
        where.queue_offset.alias("queue_offset"),
        problem.alias("problem"),
        detail.alias("detail"),
    ).filter(c("problem").isNotNull())


# ------------------------------------------------------------------------------------------------------------
# Transactions
# ------------------------------------------------------------------------------------------------------------


def aggregate_transactions(rows: DataFrame) -> DataFrame:
    """Step C: linked evidence rows (+ PROBLEM rows carrying a flag code in ``piece``) -> one row per (broker,
    tx_id) with everything the flags need.  Groups holding only statetable/redolog rows are kept (n_core
    = 0) so the caller can report orphan statetable units."""
    c = F.col
    r = c("role")
    is_copy, is_end, is_op, is_disc = r == COPY, r == END, r == OP, r == DISCARD
    is_commit, is_rb = is_end & (c("end_type") == "COMMIT"), is_end & (c("end_type") == "ROLLBACK")
    is_st, is_rp, is_re, is_orig, is_prob = r == ST, r == REDO_P, r == REDO_E, r == ORIGREF, r == PROBLEM
    core = is_copy | is_end | is_op | is_disc
    co = F.when(is_copy, c("physical_offset"))
    do = F.when(is_disc, c("physical_offset"))
    copy = F.struct(
        c("physical_offset").alias("commitlog_offset"),
        c("queue_offset"),
        c("store_timestamp"),
        c("msg_id"),
        c("check_times"),
        c("tran_prepared_qo"),
    )

    def ss(cond, col):
        return F.sort_array(F.collect_set(F.when(cond, col)))

    def cnt(cond):
        return F.sum(F.when(cond, 1).otherwise(0)).cast("int")

    return (
        rows.filter(c("tx_id").isNotNull())
        .groupBy("broker", "tx_id")
        .agg(
            cnt(core).alias("n_core"),
            F.max(F.when(is_copy, c("mechanism"))).alias("mechanism"),
            F.min_by(
                F.coalesce(
                    F.when(c("mechanism") == HALF_QUEUE, c("uniq_key")), c("physical_offset").cast("string")
                ),
                co,
            ).alias("copy_key"),
            F.max(F.when(core, c("uniq_key"))).alias("uniq_key"),
            F.max(F.when(core, c("transaction_id"))).alias("transaction_id_prop"),
            F.coalesce(F.min_by(c("keys"), co), F.max(F.when(core, c("keys")))).alias("keys"),
            F.max(F.when(core, c("pgroup"))).alias("producer_group"),
            F.coalesce(F.min_by(c("real_topic"), co), F.max(F.when(core, c("real_topic")))).alias(
                "real_topic"
            ),
            F.coalesce(F.min_by(c("real_qid"), co), F.max(F.when(core, c("real_qid")))).alias(
                "real_queue_id"
            ),
            F.min_by(copy, co).alias("first"),
            F.max_by(copy, co).alias("newest"),
            cnt(is_copy).alias("copies"),
            F.max(F.when(is_copy, c("check_times"))).alias("check_times"),
            F.min_by(c("immunity_s"), co).alias("check_immunity_time_s"),
            F.min(F.when(is_copy, c("born_timestamp"))).alias("copy_born"),
            F.min(F.when(core, c("born_timestamp"))).alias("any_born"),
            ss(is_commit, c("physical_offset")).alias("commit_offsets"),
            ss(is_rb, c("physical_offset")).alias("rollback_offsets"),
            F.max(F.when(is_commit & (c("target_mech") == HALF_QUEUE) & c("named").isNull(), True)).alias(
                "commit_without_op"
            ),
            ss(is_end & c("target_tx").isNull(), c("pto")).alias("missing_targets"),
            F.min(F.when(is_end, c("pto"))).alias("end_pto"),
            F.min(F.when(is_end | is_op, c("store_timestamp"))).alias("resolved_timestamp"),
            ss(is_op, c("half_offset")).alias("op_half_offsets"),
            ss(is_op, c("queue_offset")).alias("op_queue_offsets"),
            F.max(F.when(is_op & c("copy_committed").isNull(), True)).alias("op_without_commit"),
            F.collect_set(
                F.when(is_op, F.struct(c("queue_offset").alias("oq"), c("half_offset").alias("h")))
            ).alias("op_pairs"),
            cnt(is_disc).alias("discards"),
            F.max(do).alias("discard_commitlog_offset"),
            F.max_by(c("msg_id"), do).alias("discard_msg_id"),
            ss(is_copy & (c("mechanism") == HALF_QUEUE) & c("named").isNull(), c("queue_offset")).alias(
                "open_candidates"
            ),
            ss(is_orig & c("named"), c("queue_offset")).alias("orig_covered"),
            F.max_by(
                F.struct(c("queue_offset").alias("index"), c("st_state").alias("state")),
                F.when(is_st, c("queue_offset")),
            ).alias("st_unit"),
            cnt(is_st).alias("n_st_units"),
            cnt(is_rp).alias("n_redo_prep"),
            ss(is_re, c("physical_offset")).alias("redo_end_offsets"),
            ss(is_end, c("physical_offset")).alias("cl_end_offsets"),
            F.collect_set(
                F.when(is_end, F.struct(c("physical_offset").alias("o"), c("end_type").alias("t")))
            ).alias("end_structs"),
            F.max(F.when(core & (c("body_crc_ok") == F.lit(False)), True)).alias("crc_bad"),
            F.sort_array(F.collect_set(F.when(is_prob, c("piece")))).alias("problem_codes"),
        )
    )


def finalize_transactions(
    agg: DataFrame, facts: DataFrame, params: ParamsArg = None, profile_override=None
) -> DataFrame:
    """aggregate_transactions() + per-broker facts -> schemas.audit.TRANSACTIONS (state, flags, deadline)."""
    c = F.col
    empty_l = F.array().cast(T.ArrayType(T.LongType()))
    detected, _, profile = profile_columns(profile_override)
    f = facts.select("*", profile.alias("profile"))
    pc = param_columns(params)
    f = f.select(
        "broker",
        "profile",
        "half_consume_offset",
        "op_consume_offset",
        "min_commitlog_offset",
        c("n_st").alias("f_n_st"),
        c("n_redo").alias("f_n_redo"),
        *[v.alias(k) for k, v in pc.items()],
    )
    # statetable / redolog units without any record are transactions too (3.x: the prepared record was
    # deleted by retention or cannot be decoded); their key is the prepared offset in tx_id "P<sep><offset>"
    t = agg.filter((c("n_core") > 0) | (c("n_st_units") > 0) | (c("n_redo_prep") > 0)).join(
        F.broadcast(f), "broker", "left"
    )

    n_commit, n_rb, n_ops = (
        F.size(c("commit_offsets")),
        F.size(c("rollback_offsets")),
        F.size(c("op_half_offsets")),
    )
    mech = F.coalesce(
        c("mechanism"), F.when(c("profile").isin(P_3X, P_40), PREPARED_RECORD).otherwise(HALF_QUEUE)
    )
    born = F.coalesce(c("copy_born"), c("any_born"))
    # 3.x statetable / redolog vs CommitLog
    cl_state = (
        F.when(F.array_contains(c("end_structs.t"), "COMMIT"), "COMMIT")
        .when(F.array_contains(c("end_structs.t"), "ROLLBACK"), "ROLLBACK")
        .otherwise("PREPARED")
    )
    redo_types = F.transform(
        F.filter(c("end_structs"), lambda e: F.array_contains(c("redo_end_offsets"), e["o"])),
        lambda e: e["t"],
    )
    redo_state = (
        F.when(F.array_contains(redo_types, "COMMIT"), "COMMIT")
        .when(F.array_contains(redo_types, "ROLLBACK"), "ROLLBACK")
        .when(F.size(c("redo_end_offsets")) > 0, "ENDED")
        .when(c("n_redo_prep") > 0, "PREPARED")
    )
    # a discard newer than every copy ends the transaction; a copy newer than the last discard (RESUME_CHECK_
    # HALF_MESSAGE re-puts it with TRANSACTION_CHECK_TIMES=0) reopens it
    discarded_last = (c("discards") > 0) & (
        c("newest").isNull() | (c("discard_commitlog_offset") > c("newest.commitlog_offset"))
    )
    t = t.select(
        "*",
        discarded_last.alias("discarded_last"),
        mech.alias("mech"),
        born.alias("born"),
        cl_state.alias("cl_state"),
        redo_state.alias("redolog_state"),
        c("st_unit.index").alias("statetable_index"),
        c("st_unit.state").alias("statetable_state"),
    )
    st = c("statetable_state")
    state = (
        F.when(n_commit > 0, COMMITTED)
        .when((n_rb > 0) | (n_ops > 0), ROLLED_BACK)
        .when(st == "COMMIT", COMMITTED)
        .when(st == "ROLLBACK", ROLLED_BACK)
        .when(c("discarded_last"), DISCARDED)
        .otherwise(PREPARED)
    )
    half = c("mech") == HALF_QUEUE
    imm = c("check_immunity_time_s")
    eff_timeout = F.when(half & imm.isNotNull() & (imm >= 0), imm * 1000).otherwise(c("timeout_ms"))
    newest_ct = F.coalesce(c("newest.check_times"), F.lit(0))
    first_pass = F.greatest(
        c("newest.store_timestamp") + c("check_interval_ms"), c("born") + c("eff_timeout")
    )
    by_checks = first_pass + F.greatest(c("check_max") - newest_ct, F.lit(0)) * c("check_interval_ms")
    by_age = c("born") + c("reserved_ms")
    deadline = (
        F.when(c("state") != PREPARED, F.lit(None).cast("long"))
        .when(half & c("newest").isNotNull(), F.least(by_checks, by_age))
        .when(half, by_age)
        .otherwise(c("first.store_timestamp") + c("reserved_ms"))
    )
    hco, oco = c("half_consume_offset"), c("op_consume_offset")
    # the check service re-puts a copy while passing the previous one, so only the newest copy can still be
    # ahead of it (and it is, unless the half consume offset says otherwise)
    open_copies = F.filter(
        F.array_except(c("open_candidates"), c("orig_covered")),
        lambda x: (x == c("newest.queue_offset")) & (hco.isNull() | (x >= hco)),
    )
    t = t.select(
        "*",
        state.alias("state"),
        eff_timeout.alias("eff_timeout"),
        (c("as_of_ms") - c("born")).alias("age_ms"),
        open_copies.alias("open_copy_offsets"),
    )
    t = t.withColumn("deadline_ms", deadline)

    prepared = c("state") == PREPARED
    resolved = c("state").isin(COMMITTED, ROLLED_BACK)
    past_timeout = prepared & (c("age_ms") > c("eff_timeout"))
    mco = c("min_commitlog_offset")
    orphan_discard_only = c("mechanism").isNull() & (n_commit + n_rb == 0) & (c("discards") > 0)
    p_key = F.when(c("tx_id").startswith("P" + _SEP), F.element_at(F.split(c("tx_id"), _SEP), 2))
    units_only = c("mechanism").isNull() & (c("n_core") == 0)
    # the oldest surviving half copy is a re-put (it carries TRANSACTION_CHECK_TIMES /
    # TRAN_PREPARED_QUEUE_OFFSET, which an original never has): the original and maybe earlier copies are gone
    earlier_copies_gone = (
        half
        & c("first").isNotNull()
        & (c("first.check_times").isNotNull() | c("first.tran_prepared_qo").isNotNull())
    )
    has_st = c("f_n_st") > 0
    has_redo = c("f_n_redo") > 0
    legacy = c("mech") == PREPARED_RECORD
    unit = c("st_unit")
    compatible = (st == c("redolog_state")) | (
        (c("redolog_state") == "ENDED") & st.isin("COMMIT", "ROLLBACK")
    )
    below = F.exists(
        c("op_pairs"), lambda p: oco.isNotNull() & (p["oq"] >= oco) & hco.isNotNull() & (p["h"] < hco)
    )
    codes = _codes(
        ("PREPARED_PAST_TIMEOUT", past_timeout),
        (
            "PREPARED_NEVER_CHECKED",
            past_timeout
            & (
                (half & (c("copies") == 1) & (F.coalesce(c("check_times"), F.lit(0)) == 0))
                | (legacy & (c("profile") == P_40))
            ),
        ),
        ("AT_CHECK_MAX", prepared & half & c("check_max").isNotNull() & (newest_ct >= c("check_max"))),
        ("AGE_PAST_FILE_RESERVED_TIME", prepared & (c("age_ms") > c("reserved_ms"))),
        ("PAST_DEADLINE", prepared & (c("deadline_ms") <= c("as_of_ms"))),
        ("PREPARED_PASSED_BY_CHECKER", prepared & half & hco.isNotNull() & (c("newest.queue_offset") < hco)),
        ("DUPLICATE_COMMIT", n_commit > 1),
        ("COMMIT_WITHOUT_OP", F.coalesce(c("commit_without_op"), F.lit(False))),
        ("RESOLVED_COPY_PENDING_CHECK", resolved & half & (F.size(c("open_copy_offsets")) > 0)),
        ("OP_BELOW_HALF_CONSUME_OFFSET", below),
        (
            "CONFLICTING_ENDS",
            (n_commit > 0) & ((n_rb > 0) | F.coalesce(c("op_without_commit"), F.lit(False))),
        ),
        ("DISCARDED_WITH_RESOLUTION", (c("discards") > 0) & ((n_commit > 0) | (n_rb > 0) | (n_ops > 0))),
        ("RESUMED_AFTER_DISCARD", prepared & (c("discards") > 0) & ~c("discarded_last")),
        (
            "EVIDENCE_IN_DELETED_RANGE",
            F.exists(c("missing_targets"), lambda x: x < mco)
            | (orphan_discard_only & (mco > 0))
            | (units_only & (p_key.cast("long") < mco))
            | (earlier_copies_gone & (mco > 0)),
        ),
        (
            "PREPARED_RECORD_MISSING",
            F.exists(c("missing_targets"), lambda x: x >= mco)
            | (orphan_discard_only & ~(mco > 0))
            | (units_only & (p_key.cast("long") >= mco))
            | (earlier_copies_gone & ~(mco > 0)),
        ),
        ("CORRUPT_RECORD", F.coalesce(c("crc_bad"), F.lit(False))),
        # only while PREPARED: a 3.x rebuild compacts the table to the open units, so a resolved transaction
        # legitimately has none
        ("STATETABLE_MISSING_PREPARED", prepared & legacy & has_st & c("first").isNotNull() & unit.isNull()),
        ("STATETABLE_INDEX_MISMATCH", legacy & has_st & (c("statetable_index") != c("first.queue_offset"))),
        (
            "STATETABLE_COMMITLOG_DISAGREE",
            legacy & has_st & c("first").isNotNull() & st.isNotNull() & (st != c("cl_state")),
        ),
        (
            "STATETABLE_REDOLOG_DISAGREE",
            legacy & has_st & has_redo & st.isNotNull() & ~F.coalesce(compatible, F.lit(False)),
        ),
        (
            "REDOLOG_COMMITLOG_DISAGREE",
            legacy
            & has_redo
            & c("first").isNotNull()
            & ((c("n_redo_prep") == 0) | (c("redo_end_offsets") != c("cl_end_offsets"))),
        ),
    )
    flags = F.array_sort(F.array_distinct(F.concat(codes, c("problem_codes"))))
    t = t.withColumn("flags", flags)
    tx = t.select(
        "broker",
        F.coalesce(
            c("copy_key"),
            p_key,
            c("uniq_key"),
            c("end_pto").cast("string"),
            c("discard_commitlog_offset").cast("string"),
        ).alias("transaction_key"),
        "uniq_key",
        F.coalesce(c("transaction_id_prop"), c("uniq_key")).alias("transaction_id"),
        "keys",
        "producer_group",
        "real_topic",
        "real_queue_id",
        c("mech").alias("mechanism"),
        "state",
        F.coalesce(c("first.commitlog_offset"), c("end_pto"), p_key.cast("long")).alias(
            "prepared_commitlog_offset"
        ),
        c("first.commitlog_offset").alias("first_copy_commitlog_offset"),
        c("first.queue_offset").alias("first_copy_queue_offset"),
        c("first.store_timestamp").alias("first_copy_store_timestamp"),
        c("newest.commitlog_offset").alias("newest_copy_commitlog_offset"),
        c("newest.queue_offset").alias("newest_copy_queue_offset"),
        c("newest.store_timestamp").alias("newest_copy_store_timestamp"),
        c("newest.msg_id").alias("newest_copy_msg_id"),
        c("newest.check_times").alias("newest_copy_check_times"),
        "copies",
        "check_times",
        "check_immunity_time_s",
        c("born").alias("born_timestamp"),
        "age_ms",
        "commit_offsets",
        "rollback_offsets",
        "op_half_offsets",
        "op_queue_offsets",
        "resolved_timestamp",
        "discard_commitlog_offset",
        "discard_msg_id",
        "discards",
        "statetable_index",
        "statetable_state",
        "redolog_state",
        F.coalesce(c("open_copy_offsets"), empty_l).alias("open_copy_offsets"),
        "flags",
        "deadline_ms",
        "profile",
        "as_of_ms",
    )
    return conform(tx, TRANSACTIONS)


def transaction_records(commitlog: DataFrame) -> DataFrame:
    """The CommitLog rows the reconstruction reads: half / op / discard topics and every record whose
    transaction type is not NOT (prepared, commit, rollback; consumer-retry copies of commits included, they
    are filtered later by topic).  Bodies are kept for op records only."""
    c = F.col
    relevant = c("topic").isin(*TX_SYSTEM_TOPICS) | (c("transaction_type") != "NOT")
    cols = [F.when(c("topic") == OP_TOPIC, c(n)).alias(n) if n == "body" else c(n) for n in commitlog.columns]
    return commitlog.filter(relevant).select(*cols)


def build_transactions(
    commitlog: DataFrame,
    op_bodies: Optional[DataFrame],
    consumequeue: Optional[DataFrame],
    statetable: Optional[DataFrame],
    redolog: Optional[DataFrame],
    consumer_offsets: Optional[DataFrame],
    anomalies: Optional[DataFrame],
    params: ParamsArg = None,
    profile_override=None,
    materialize: bool = False,
    commitlog_bounds: Optional[DataFrame] = None,
):
    """-> (transactions [TRANSACTIONS], findings [AUDIT_ANOMALIES], profiles [PROFILES]).  See
    reconstruct(); ``op_bodies`` None = derived from the commitlog's op records."""
    c = F.col

    def cut(df: DataFrame) -> DataFrame:
        return df.localCheckpoint(eager=True) if materialize else df

    full_commitlog = commitlog
    commitlog = cut(transaction_records(full_commitlog))
    op_bodies_derived = op_bodies is None
    if op_bodies_derived:
        op_bodies = op_bodies_from_commitlog(commitlog)
    facts = cut(
        broker_facts(
            full_commitlog, consumequeue, statetable, redolog, consumer_offsets, op_bodies, commitlog_bounds
        )
    )
    if consumequeue is not None:
        consumequeue = cut(consumequeue.filter(c("topic").isin(*TX_SYSTEM_TOPICS)))
    if anomalies is not None:
        anomalies = cut(anomalies)
    rows = evidence_rows(commitlog, op_bodies, statetable, redolog, cut=cut)
    linked = rows.filter(c("tx_id").isNotNull())

    findings = []
    problems = None
    if consumequeue is not None:
        cqm = cq_mismatches(commitlog, consumequeue).join(
            F.broadcast(facts.select("broker", "min_commitlog_offset", "n_cq")), "broker", "left"
        )
        cqm = cqm.filter((c("problem") != "NO_UNIT") | (c("n_cq") > 0)).withColumn(
            "code",
            F.when(
                (c("problem") == "NO_RECORD") & (c("physical_offset") < c("min_commitlog_offset")),
                "EVIDENCE_IN_DELETED_RANGE",
            ).otherwise("CQ_MISMATCH"),
        )
        findings.append(
            cqm.select("broker", "code", "physical_offset", "topic", "queue_id", "queue_offset", "detail")
        )
        problems = cqm.select("broker", "physical_offset", c("code").alias("p_code"))
        problems = linked.join(F.broadcast(problems), ["broker", "physical_offset"]).select(
            "broker", "tx_id", "p_code"
        )
    if anomalies is not None:
        # record-level findings only (a file-level one -- size, gap, missing file -- says nothing about the
        # records in it), matched against rows that ARE records (statetable / redolog rows only point at one)
        a = anomalies.filter(
            c("physical_offset").isNotNull()
            & (c("source") == "commitlog")
            & ~c("kind").isin(*FILE_LEVEL_ANOMALIES)
        ).select(c("broker").alias("a_broker"), c("physical_offset").alias("a_offset"))
        hit = linked.filter(c("role").isin(COPY, END, OP, DISCARD)).join(
            F.broadcast(a),
            (c("broker") == c("a_broker"))
            & (
                (c("a_offset") == c("physical_offset"))
                | (
                    (c("a_offset") > c("physical_offset"))
                    & (c("a_offset") < c("physical_offset") + c("total_size"))
                )
            ),
        )
        hit = hit.select("broker", "tx_id", F.lit("CORRUPT_RECORD").alias("p_code"))
        problems = hit if problems is None else _union(problems, hit)
        # DLedger: records at/after the first message past the checkpoint's committedIndex (the log is
        # ordered, so one offset per broker says it)
        uncommitted = anomalies.filter(c("kind") == "DLEDGER_UNCOMMITTED").groupBy(
            c("broker").alias("u_broker")).agg(F.min("physical_offset").alias("u_offset"))
        past = linked.filter(c("role").isin(COPY, END, OP, DISCARD)).join(
            F.broadcast(uncommitted),
            (c("broker") == c("u_broker")) & (c("physical_offset") >= c("u_offset")))
        past = past.select("broker", "tx_id", F.lit("EVIDENCE_NOT_COMMITTED").alias("p_code"))
        problems = _union(problems, past)
    if problems is not None:
        rows = _union(rows, _evidence(problems, PROBLEM, piece=c("p_code")))

    agg = aggregate_transactions(rows)
    tx = finalize_transactions(agg, facts, params, profile_override)
    tx = cut(tx)
    profiles = profiles_from_facts(facts, profile_override)

    # findings no transaction owns
    orphan_ops = rows.filter((c("role") == OP) & c("tx_id").isNull()).join(
        F.broadcast(facts.select("broker", "min_half_queue_offset")), "broker", "left"
    )
    deleted = c("half_offset") < F.coalesce(c("min_half_queue_offset"), F.lit(_LONG_MAX))
    findings.append(
        orphan_ops.select(
            "broker",
            F.when(c("half_offset").isNull(), "OP_BODY_UNPARSABLE")
            .when(deleted, "EVIDENCE_IN_DELETED_RANGE")
            .otherwise("OP_WITHOUT_HALF")
            .alias("code"),
            "physical_offset",
            F.lit(OP_TOPIC).alias("topic"),
            "queue_id",
            c("half_offset").alias("queue_offset"),
            F.when(
                c("half_offset").isNull(),
                F.format_string(
                    "op at op-queue offset %d: body piece '%s' is not a number", c("queue_offset"), c("piece")
                ),
            )
            .when(
                deleted,
                F.format_string(
                    "op at op-queue offset %d names half offset %d, below the oldest retained " "half record",
                    c("queue_offset"),
                    c("half_offset"),
                ),
            )
            .otherwise(
                F.format_string(
                    "op at op-queue offset %d names half offset %d: no half record has it",
                    c("queue_offset"),
                    c("half_offset"),
                )
            )
            .alias("detail"),
        )
    )
    op_recs = commitlog.filter((c("topic") == OP_TOPIC))
    missing = (
        op_recs.filter(c("body").isNull())
        if op_bodies_derived
        else op_recs.join(
            op_bodies.select("broker", "physical_offset"), ["broker", "physical_offset"], "left_anti"
        )
    )
    findings.append(
        missing.select(
            "broker",
            F.lit("OP_BODY_MISSING").alias("code"),
            "physical_offset",
            F.lit(OP_TOPIC).alias("topic"),
            "queue_id",
            "queue_offset",
            F.format_string("op record at op-queue offset %d: body not provided", c("queue_offset")).alias(
                "detail"
            ),
        )
    )
    out = None
    for f in findings:
        f = f.select(
            "broker",
            "code",
            F.lit("reconstruct").alias("source"),
            "physical_offset",
            "topic",
            c("queue_id").cast("int").alias("queue_id"),
            "queue_offset",
            F.lit(None).cast("string").alias("transaction_key"),
            F.lit(None).cast("string").alias("file"),
            F.lit(None).cast("long").alias("position"),
            "detail",
        )
        out = f if out is None else _union(out, f)
    if anomalies is not None:
        out = _union(
            out,
            anomalies.select(
                "broker",
                c("kind").alias("code"),
                "source",
                "physical_offset",
                F.lit(None).cast("string").alias("topic"),
                F.lit(None).cast("int").alias("queue_id"),
                F.lit(None).cast("long").alias("queue_offset"),
                F.lit(None).cast("string").alias("transaction_key"),
                "file",
                c("position").cast("long").alias("position"),
                F.concat_ws(
                    ": ",
                    c("detail"),
                    F.concat_ws(
                        " ",
                        F.when(c("expected").isNotNull(), F.concat(F.lit("expected "), c("expected"))),
                        F.when(c("actual").isNotNull(), F.concat(F.lit("actual "), c("actual"))),
                    ),
                ).alias("detail"),
            ),
        )
    return tx, conform(out, AUDIT_ANOMALIES), profiles


# ------------------------------------------------------------------------------------------------------------
# Work lists
# ------------------------------------------------------------------------------------------------------------


def check_back_worklist(transactions: DataFrame, critical_within_ms: int = 60000) -> DataFrame:
    """Transactions to send CHECK_TRANSACTION_STATE for now, most urgent first (``urgency_rank`` 1 = first).

    Eligible: PREPARED, past timeout (PREPARED_PAST_TIMEOUT), a copy survives, producer group known, and the
    broker would still check it: not AT_CHECK_MAX / AGE_PAST_FILE_RESERVED_TIME (it discards those instead;
    see the recovery list) and, 3.x, a consistent statetable unit (else REBUILD_STATETABLE).  A
    PREPARED_PASSED_BY_CHECKER transaction is eligible: the broker will not check it again, but it still
    accepts the EndTransaction. Priority: CRITICAL = past its deadline or due within ``critical_within_ms``;
    HIGH = never checked; NORMAL. Header fields follow
    AbstractTransactionalMessageCheckListener.sendCheckMessage (5.3.3): commitLogOffset and
    tranStateTableOffset of the newest copy, msgId = transactionId = UNIQ_KEY, offsetMsgId of the newest copy.
    """
    c = F.col
    fl = c("flags")
    t = transactions.filter(
        (c("state") == PREPARED)
        & _has(fl, "PREPARED_PAST_TIMEOUT")
        & c("newest_copy_commitlog_offset").isNotNull()
        & c("producer_group").isNotNull()
        & ~_has(fl, "AT_CHECK_MAX")
        & ~_has(fl, "AGE_PAST_FILE_RESERVED_TIME")
        & ~_has(fl, "STATETABLE_MISSING_PREPARED")
        & ~_has(fl, "STATETABLE_INDEX_MISMATCH")
        & ~_has(fl, "STATETABLE_COMMITLOG_DISAGREE")
        & ~_has(fl, "STATETABLE_REDOLOG_DISAGREE")
    )
    critical = _has(fl, "PAST_DEADLINE") | (c("deadline_ms") - c("as_of_ms") <= critical_within_ms)
    t = t.withColumn(
        "priority",
        F.when(critical, "CRITICAL").when(_has(fl, "PREPARED_NEVER_CHECKED"), "HIGH").otherwise("NORMAL"),
    )
    prio = F.when(c("priority") == "CRITICAL", 0).when(c("priority") == "HIGH", 1).otherwise(2)
    w = Window.orderBy(
        prio, c("deadline_ms").asc_nulls_last(), c("age_ms").desc(), c("broker"), c("transaction_key")
    )
    half = c("mechanism") == HALF_QUEUE
    out = t.select(
        F.row_number().over(w).alias("urgency_rank"),
        "priority",
        "broker",
        "producer_group",
        "transaction_key",
        F.when(half, F.lit(HALF_TOPIC)).otherwise(c("real_topic")).alias("request_topic"),
        c("newest_copy_commitlog_offset").alias("commitlog_offset"),
        F.when(half, c("newest_copy_queue_offset"))
        .otherwise(F.coalesce(c("statetable_index"), c("newest_copy_queue_offset")))
        .alias("tran_state_table_offset"),
        c("newest_copy_msg_id").alias("offset_msg_id"),
        F.coalesce(c("uniq_key"), c("newest_copy_msg_id")).alias("msg_id"),
        "uniq_key",
        "transaction_id",
        "real_topic",
        "real_queue_id",
        c("newest_copy_check_times").alias("check_times"),
        "age_ms",
        "deadline_ms",
        "profile",
    )
    return conform(out, CHECK_BACK).orderBy("urgency_rank")


def recovery_worklist(transactions: DataFrame) -> DataFrame:
    """One row per transaction needing operator action; ``action`` = the first of ``actions`` in
    RECOVERY_ACTIONS order (see jobs.flags.RECOVERY_ACTIONS for what each means)."""
    c = F.col
    fl = c("flags")
    prepared = c("state") == PREPARED
    resolved = c("state").isin(COMMITTED, ROLLED_BACK)
    half = c("mechanism") == HALF_QUEUE
    st_codes = [
        "STATETABLE_MISSING_PREPARED",
        "STATETABLE_INDEX_MISMATCH",
        "STATETABLE_COMMITLOG_DISAGREE",
        "STATETABLE_REDOLOG_DISAGREE",
    ]
    ev_codes = ["CORRUPT_RECORD", "CQ_MISMATCH", "EVIDENCE_IN_DELETED_RANGE", "PREPARED_RECORD_MISSING",
                "EVIDENCE_NOT_COMMITTED"]
    expired_codes = ["AT_CHECK_MAX", "AGE_PAST_FILE_RESERVED_TIME", "PAST_DEADLINE"]

    def any_of(codes):
        return F.exists(fl, lambda x: x.isin(*codes))

    def present(codes):
        return F.array_join(F.filter(fl, lambda x: x.isin(*codes)), ", ")

    conds = {
        "REBUILD_STATETABLE": any_of(st_codes),
        "REVIEW_CONFLICTING_ENDS": _has(fl, "CONFLICTING_ENDS"),
        "REVIEW_DUPLICATE_COMMIT": _has(fl, "DUPLICATE_COMMIT"),
        "MARK_DONE": resolved & half & (F.size(c("open_copy_offsets")) > 0),
        "RESUME_DISCARDED": (c("state") == DISCARDED) & c("discard_msg_id").isNotNull(),
        "REDRIVE_EXPIRED": prepared & any_of(expired_codes),
        "REVIEW_EVIDENCE": any_of(ev_codes),
    }
    assert list(conds) == list(RECOVERY_ACTIONS)
    reasons = {
        "REBUILD_STATETABLE": F.concat(F.lit("statetable: "), present(st_codes)),
        "REVIEW_CONFLICTING_ENDS": F.format_string(
            "COMMIT record(s) %s and rollback evidence (ROLLBACK records [%s], ops %s)",
            F.array_join(c("commit_offsets"), ","),
            F.array_join(c("rollback_offsets"), ","),
            F.array_join(c("op_half_offsets"), ","),
        ),
        "REVIEW_DUPLICATE_COMMIT": F.format_string(
            "%d COMMIT records (CommitLog offsets %s)",
            F.size(c("commit_offsets")),
            F.array_join(c("commit_offsets"), ","),
        ),
        "MARK_DONE": F.format_string(
            "%s, but half offsets %s have no op and the check service will visit them",
            c("state"),
            F.array_join(c("open_copy_offsets"), ","),
        ),
        "RESUME_DISCARDED": F.format_string(
            "discarded to %s (offset %d) with no commit or op",
            F.lit(DISCARD_TOPIC),
            c("discard_commitlog_offset"),
        ),
        "REDRIVE_EXPIRED": F.concat(F.lit("PREPARED and "), present(expired_codes)),
        "REVIEW_EVIDENCE": F.concat(F.lit("evidence: "), present(ev_codes)),
    }
    actions = F.array_compact(F.array(*[F.when(cond, F.lit(a)) for a, cond in conds.items()]))
    reason = F.concat_ws("; ", *[F.when(conds[a], reasons[a]) for a in conds])
    t = transactions.withColumn("actions", actions).filter(F.size(c("actions")) > 0)
    resume = c("actions")[0] == "RESUME_DISCARDED"
    out = t.select(
        "broker",
        "transaction_key",
        "uniq_key",
        "producer_group",
        "real_topic",
        "state",
        c("actions")[0].alias("action"),
        "actions",
        reason.alias("reason"),
        "flags",
        "prepared_commitlog_offset",
        "newest_copy_commitlog_offset",
        "newest_copy_queue_offset",
        "commit_offsets",
        "rollback_offsets",
        "op_queue_offsets",
        F.when(F.array_contains(c("actions"), "MARK_DONE"), c("open_copy_offsets"))
        .otherwise(F.array().cast(T.ArrayType(T.LongType())))
        .alias("mark_done_half_offsets"),
        "discard_commitlog_offset",
        F.when(resume, F.lit(DISCARD_TOPIC)).alias("resume_topic"),
        F.when(resume, c("discard_msg_id")).alias("resume_msg_id"),
        "statetable_index",
        "deadline_ms",
        "profile",
    )
    return conform(out, RECOVERY)


# ------------------------------------------------------------------------------------------------------------
# Top level
# ------------------------------------------------------------------------------------------------------------


def commitlog_bounds_from_layout(spark, layout_info) -> Optional[DataFrame]:
    """(broker, min_commitlog_offset, n_cq) from store listings (``StoreFrames.layout_info``: objects with
    ``broker``, ``commitlog_files`` = ((path, base_offset, size), ...) and ``consume_queues`` = the number of
    queue directories); None when no store has a CommitLog file."""
    rows = [
        (s.broker, int(min(base for _, base, _ in s.commitlog_files)),
         int(getattr(s, "consume_queues", 0) or 0))
        for s in layout_info
        if getattr(s, "commitlog_files", None)
    ]
    if not rows:
        return None
    return spark.createDataFrame(rows, "broker string, min_commitlog_offset bigint, n_cq bigint")


def reconstruct(
    frames: Any,
    params: ParamsArg = None,
    profile_override: Union[None, str, Mapping[str, str]] = None,
    materialize: bool = False,
) -> AuditResult:
    """Frames (a mapping or an object with attributes; see the module doc) -> AuditResult.

    ``params``: None (each broker's profile defaults, as_of = its newest store time), one AuditParams for all,
    or {broker or profile: AuditParams}.  ``profile_override``: a profile for all brokers or
    {broker: profile}.
    ``materialize``: False (default) = pure lazy transforms, nothing runs until the caller acts on an output.
    True = compute the shared intermediates now as local checkpoints (the transaction-relevant CommitLog
    records, per-broker facts, the half/op/discard consume-queue units, the decoder findings, the evidence
    rows before and after linking, the transactions): each input is read about twice and every output's plan
    starts from these.  The plans of this reconstruction are large; on small stores analysing them dominates
    the run time, so True is much faster whenever more than one output is used (jobs, tests).
    """
    commitlog = _frame(frames, "commitlog")
    if commitlog is None:
        raise ValueError("reconstruct needs at least the 'commitlog' frame")
    spark = commitlog.sparkSession
    statetable = _frame(frames, "statetable")
    statetable = statetable if statetable is not None else empty_frame(spark, STATETABLE)
    redolog = _frame(frames, "redolog")
    redolog = redolog if redolog is not None else empty_frame(spark, REDOLOG)
    consumequeue = _frame(frames, "consumequeue")
    consumer_offsets = _frame(frames, "consumer_offsets")
    anomalies = _frame(frames, "anomalies")
    op_bodies = _frame(frames, "op_bodies")
    bounds = _frame(frames, "commitlog_bounds")
    layout = _frame(frames, "layout_info")
    if bounds is None and layout:
        bounds = commitlog_bounds_from_layout(spark, layout)

    transactions, findings, profiles = build_transactions(
        commitlog,
        op_bodies,
        consumequeue,
        statetable,
        redolog,
        consumer_offsets,
        anomalies,
        params,
        profile_override,
        materialize=materialize,
        commitlog_bounds=bounds,
    )
    return AuditResult(
        transactions=transactions,
        check_back=check_back_worklist(transactions),
        recovery=recovery_worklist(transactions),
        anomalies=findings,
        profiles=profiles,
    )


__all__ = [
    "AuditParams",
    "AuditResult",
    "reconstruct",
    "broker_facts",
    "detect_profile",
    "profiles_from_facts",
    "param_columns",
    "group_copies",
    "end_records",
    "discard_records",
    "op_bodies_from_commitlog",
    "parse_op_bodies",
    "legacy_rows",
    "link_ends",
    "link_ops",
    "evidence_rows",
    "transaction_records",
    "cq_mismatches",
    "aggregate_transactions",
    "finalize_transactions",
    "build_transactions",
    "check_back_worklist",
    "recovery_worklist",
    "commitlog_bounds_from_layout",
    "empty_frame",
    "conform",
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
