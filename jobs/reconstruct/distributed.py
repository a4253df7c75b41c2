"""The distributed reduce: no task and no driver holds a whole broker's evidence.

The reducer (jobs/reconstruct/reducer.py) does three kinds of work; here each runs where it scales:

1. **Row-local** -- evidence rows and each partition's partial broker facts from the input rows in ONE
   Python pass (``partitioned.evidence_and_facts``, one ``mapInArrow`` over the input partitions), persisted;
   the input union itself is not persisted (its branches are the read's persisted frames, and each later
   filter on ``src`` reads only its own branches).
2. **Global, by key** -- the linking of jobs/reconstruct/evidence.py (``link_ends``, ``link_ops``) as two Spark
   windows, one shuffle each, so that every evidence row gets its transaction id ``tx``: by (broker,
   CommitLog offset), a copy by its own offset and an END by its PREPARED_TRANSACTION_OFFSET (the END takes
   the max tx / queue id / queue offset / mechanism of the copies there, else its own (UNIQ_KEY, PGROUP,
   topic) or "P" id, computed with the row; copies learn ``committed``); by (broker, queue id, half-queue
   offset), a half copy by its queue offset, an OP (one per half offset: batched 5.1+ bodies are already
   exploded) by the offset it names, a COMMIT END by its target's and an ORIGREF twin by
   TRAN_PREPARED_QUEUE_OFFSET (OPs take the halves' max tx and whether one is committed; the others learn
   ``named``); an END whose own id differs from its copy's gets an XREF twin, a record whose
   ``__transactionId__`` differs from its UNIQ_KEY a TIDREF twin (``cross_refs``, filters of the persisted
   linked rows).  Window groups compare keys as the reducer's ``key_ids`` do (null equals null).  Then ONE
   shuffle by (broker, tx) over ``reduce_tasks`` partitions, sorted within by (broker, tx, ord), and the
   unchanged per-transaction rules (jobs/reconstruct/rules.py) over chunks of whole transactions
   (``partitioned.reduce_chunks``).
3. **Per broker, small** -- the facts (counts, bounds, consume offsets) are summed per partition (in the
   evidence pass) and merged on the driver; with the decoder findings (collected: they grow with damage, not with the broker) they
   give each broker's profile, params and lost CommitLog ranges, shipped to the tasks with the functions; a
   3.x broker's redolog units lost without a decoder finding are one aggregation over its evidence rows
   (``_redolog_gaps``, a job only for brokers with statetable units).  The
   findings no transaction owns go their own way: the consume-queue comparison shuffled by (broker,
   CommitLog offset), orphan ops from the linked OP rows without an id, missing op bodies by an anti-join;
   the consume-queue findings that name evidence rows are joined back to them as ``problems`` bits before
   the shuffle by transaction.  The check-back list is ranked across brokers by the caller
   (jobs/reconstruct/spark.py, one window over the small table).

Skew: the linking windows are keyed by CommitLog or queue offsets (a few rows per key, no hot key); the shuffle by transaction
puts a transaction's rows in one task, and a chunk holds whole transactions, so a transaction with many
re-put copies and checks is a few more rows in its chunk, not a task of its own.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple, Union

import pyarrow as pa
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from jobs.reconstruct import partitioned as part
from jobs.reconstruct import rules as txrules
from jobs.reconstruct import worklists
from jobs.reconstruct.damage import (
    EMPTY,
    PastEnd,
    RedologGap,
    cq_lost,
    damaged_ranges,
    with_lost,
    with_redolog_gap,
)
from jobs.reconstruct.evidence import (
    COMMIT_T,
    COPY,
    END,
    HALF_Q,
    OP,
    ORIGREF,
    PREP_R,
    REDO_E,
    REDO_P,
    ST,
    TIDREF,
    XREF,
)
from jobs.reconstruct.params import OP_TOPIC, TX_SYSTEM_TOPICS, override_for, params_by_broker
from jobs.reconstruct.reducer import (
    CQ_RECORD_SRC,
    as_of_ms,
    final_transactions,
    first_at_or_after,
    settled_offsets,
)
from jobs.session import arrow_frame, persist_on_disk
from schemas.audit import AUDIT_ANOMALIES
from schemas.audit import PROFILES as PROFILES_TABLE
from schemas.recon import RECON_EVIDENCE, RECON_EVIDENCE_PASS, RECON_OUTPUT

#: linked evidence rows per reduce task (at least one task per core): with chunked rules a task's memory does
#: not grow with it, only its duration
ROWS_PER_TASK = 250_000
MAX_TASKS = 10_000
_ANOMALY_COLUMNS = ["kind", "source", "physical_offset", "file", "position", "length", "detail", "expected",
                    "actual", "data_end"]
_EV = RECON_EVIDENCE.names
_TYPES = {f.name: f.dataType for f in RECON_EVIDENCE.spark_schema().fields}


def reduce_tasks(n_rows: int, cores: int) -> int:
    """Partitions of the shuffle by transaction for ``n_rows`` linked evidence rows."""
    return int(min(MAX_TASKS, max(cores, 1, math.ceil(n_rows / ROWS_PER_TASK))))


class Distributed:
    """The outputs of one distributed reduce: ``out`` (RECON_OUTPUT rows, lazy), ``reduce_tasks``, and the
    intermediates it persisted (``unpersist()`` once ``out`` is materialized); ``linked`` the linked evidence
    (persisted, every row with its transaction id ``tx``: what jobs/reconstruct/settle_frames.py settles by)."""

    def __init__(self, out: DataFrame, tasks: int, persisted: List[DataFrame],
                 linked: Optional[DataFrame] = None):
        self.out, self.reduce_tasks, self.persisted, self.linked = out, tasks, persisted, linked

    def unpersist(self, keep_linked: bool = False) -> None:
        """Unpersist the intermediates (but ``linked`` with ``keep_linked``: the caller unpersists it)."""
        for df in self.persisted:
            if not (keep_linked and df is self.linked):
                df.unpersist()
        self.persisted = []


def _evidence_and_facts(wide: DataFrame, op_bodies_given: bool,
                        persisted: List[DataFrame]) -> Tuple[DataFrame, Dict[str, dict], Dict[str, pa.Table]]:
    """(unlinked evidence rows, persisted; {broker: merged facts}; {broker: its decoder findings as Arrow}).

    One Python pass over the input rows gives both the evidence rows and each partition's partial facts
    (``partitioned.evidence_and_facts``); the job that collects the facts rows (one per broker and partition)
    materializes the evidence.  Consume-queue units give no evidence and are only counted: they stay out of
    the Python pass, and their counts per broker (one aggregation in Spark) are merged as the facts the pass
    would have given them (``partitioned.queue_unit_facts``).  The findings are a second, small job: ``wide``
    is a union whose branches carry their ``src`` as a literal, so a filter on ``src`` reads only the
    branches it keeps."""
    def to_rows(it):
        from pyspark import TaskContext

        yield from part.evidence_and_facts(it, TaskContext.get().partitionId(), op_bodies_given)

    c = F.col
    is_unit = F.coalesce(c("src") == "consumequeue", F.lit(False))
    both = persist_on_disk(wide.where(~is_unit).mapInArrow(to_rows, RECON_EVIDENCE_PASS.spark_schema()),
                           persisted)
    rows = both.where(c("facts_json").isNotNull()).select("broker", "facts_json").collect()
    units = wide.where(is_unit).groupBy("broker").agg(F.count(F.lit(1)).alias("n")).collect()
    merged = part.add_queue_units(part.merge_facts(r.asDict() for r in rows), (r.asDict() for r in units))
    ev = both.where(c("facts_json").isNull()).select(*_EV)
    anomalies = wide.where(c("src") == "anomaly").select("broker", *_ANOMALY_COLUMNS).toArrow()
    by_broker = {b: t for b, t in part.by_broker(anomalies)} if anomalies.num_rows else {}
    empty = anomalies.schema.empty_table()
    return ev, merged, {b: by_broker.get(b, empty) for b in merged}


def _past_end(wide: DataFrame, brokers, final: Union[None, pa.Table, DataFrame] = None) -> Dict[str, PastEnd]:
    """broker -> ``damage.PastEnd`` over ``wide``, run only for a broker with a torn end: one Spark job that
    joins the torn ends (a few rows, broadcast) with the broker's records and half / op / discard queue units
    and aggregates per torn end; the driver gets one row per torn end, whatever the damage.  The records of
    carried settled transactions (``final``) count as read: Arrow ones by the first at or after each torn
    end (``reducer.first_at_or_after``), a DataFrame's as rows of the same job (their offsets at or after
    the lowest torn end)."""
    c = F.col
    spark = wide.sparkSession

    def of(b: str) -> PastEnd:
        settled = settled_offsets(final, b) if isinstance(final, pa.Table) else None

        def per_torn_end(ends) -> List[Tuple[int, int, int]]:
            lo = int(min(ends))
            torn = F.broadcast(spark.createDataFrame([(int(t),) for t in ends], "_t long"))
            mine = wide.where(c("broker") == b)
            read_at = mine.where((c("src") == "commitlog") & (c("physical_offset") >= lo)).select(
                c("physical_offset").alias("_p"))
            if settled is not None and len(settled):
                # settled records were read by an earlier run: only the first one at or after each torn end
                # can be its stop, so at most one row per torn end goes to Spark
                later = [(p,) for p in first_at_or_after(settled, ends)]
                if later:
                    read_at = read_at.unionByName(spark.createDataFrame(later, "_p long"))
            elif isinstance(final, DataFrame):
                # a generator cannot sit inside another expression (the cast): explode first
                read_at = read_at.unionByName(
                    final.where(c("broker") == b).select(F.explode("record_offsets").alias("_x"))
                    .select(c("_x").cast("long").alias("_p")).where(c("_p") >= lo))
            # the first record read at or after each torn end (none: the end of the log)
            stops = (read_at.join(torn, c("_p") >= c("_t")).groupBy("_t").agg(F.min("_p").alias("_stop")))
            bounds = F.broadcast(torn.join(stops, "_t", "left"))
            units = mine.where((c("src") == "consumequeue") & c("topic").isin(*TX_SYSTEM_TOPICS)
                               & c("size").isNotNull() & (c("commitlog_offset") >= lo)).select(
                c("commitlog_offset").alias("_u"),
                (c("commitlog_offset") + F.greatest(c("size").cast("long"), F.lit(1))).alias("_e"))
            hits = (units.join(bounds, (c("_u") >= c("_t")) & (c("_stop").isNull() | (c("_u") < c("_stop"))))
                    .groupBy("_t").agg(F.max("_e").alias("_e"), F.count(F.lit(1)).alias("_n")))
            return sorted((int(r["_t"]), int(r["_e"]), int(r["_n"])) for r in hits.collect())
        return per_torn_end

    return {b: of(b) for b in brokers}


def _redolog_gaps(ev: DataFrame, brokers: List[str]) -> Dict[str, RedologGap]:
    """broker -> ``damage.RedologGap`` over all its unlinked evidence rows, for the 3.x ``brokers`` (those with
    statetable units): one Spark job, grouped by (broker, CommitLog offset) and then by broker, the same
    min / max / count as ``damage.redolog_gap`` over a whole broker."""
    if not brokers:
        return {}
    c = F.col
    role = c("role")
    rec = ((role == COPY) & (c("mechanism") == PREP_R)) | (role == END)
    unit, st = role.isin(REDO_P, REDO_E), role == ST
    at = (ev.where(c("broker").isin(*brokers) & c("physical_offset").isNotNull() & (rec | unit | st))
          .groupBy("broker", "physical_offset")
          .agg(F.max(rec).alias("_r"), F.max(unit).alias("_u"), F.max(st).alias("_s")))
    gone = c("_r") & ~c("_u")
    rows = at.groupBy("broker").agg(F.max(F.when(c("_s"), c("physical_offset"))).alias("st_max"),
                                    F.min(F.when(gone, c("physical_offset"))).alias("lowest"),
                                    F.count(F.when(gone, F.lit(1))).alias("n")).collect()
    return {r["broker"]: RedologGap(int(r["st_max"]), r["lowest"], int(r["n"]))
            for r in rows if r["st_max"] is not None}


def _context(facts: Dict[str, dict], findings: Dict[str, pa.Table], params, profile_override,
             critical_within_ms: int, past_end: Dict[str, PastEnd]) -> Tuple[part.Context, List[dict]]:
    profiles = {b: txrules.profile_row(b, f, override_for(profile_override, b)) for b, f in facts.items()}
    broker_params = params_by_broker(params, {b: p["profile"] for b, p in profiles.items()})
    brokers = {}
    for b, f in facts.items():
        an = findings[b]
        brokers[b] = part.BrokerContext(f, profiles[b]["profile"], broker_params.get(b),
                                        damaged_ranges(an, past_end.get(b)), an,
                                        [dict(a, broker=b) for a in an.select(_ANOMALY_COLUMNS).to_pylist()])
    return part.Context(brokers, critical_within_ms), list(profiles.values())


def _add_cq_lost(ctx: part.Context, cqf: DataFrame) -> None:
    """Merge into each broker's damaged ranges the ``damage.cq_lost`` ranges of the consume-queue comparison's
    findings ``cqf`` (a unit with no record of its topic: rows that carry a ``length``), before the reduce
    reads them; one Spark job over the comparison's findings, its rows grow with the damage only."""
    c = F.col
    rows = (cqf.where((c("code") == "CQ_MISMATCH") & c("length").isNotNull())
            .select("broker", "code", "topic", "physical_offset", "length").collect())
    by_broker: Dict[str, List[dict]] = {}
    for r in rows:
        by_broker.setdefault(r["broker"], []).append(r.asDict())
    for b, found in by_broker.items():
        bc = ctx.brokers[b]
        bc.damaged = with_lost(bc.damaged if bc.damaged is not None else EMPTY, cq_lost(found))


def link(ev: DataFrame) -> DataFrame:
    """Unlinked RECON_EVIDENCE rows -> linked ones with the ORIGREF rows added: evidence.link_ends and link_ops
    as two windows, each one shuffle (see the module docstring)."""
    c = F.col
    role = c("role")
    is_copy, is_end = role == COPY, role == END
    # link_ends, keyed by (broker, CommitLog offset): a copy by its own offset, an END by the offset it names.
    # Rows without that offset are in no group (a copy without an offset matches nothing, nor does an END
    # without PREPARED_TRANSACTION_OFFSET): they take the values of a group of none.
    w = Window.partitionBy("broker", "_k")
    key = F.when(is_copy, c("physical_offset")).when(is_end, c("pto"))
    by_offset = ev.where((is_copy | is_end) & key.isNotNull()).withColumn("_k", key)
    copy_val = (lambda name: F.max(F.when(is_copy, c(name))).over(w))
    target_tx = copy_val("tx")
    linked_ends = [
        ("tx", F.coalesce(target_tx, c("own_tx"))), ("target_qid", copy_val("queue_id")),
        ("target_qo", copy_val("queue_offset")),
        ("target_mech", F.coalesce(F.max(F.when(is_copy & (c("mechanism") > 0), c("mechanism"))).over(w),
                                   F.lit(0))),
        ("has_target", target_tx.isNotNull())]
    committed = F.max(is_end & (c("end_type") == COMMIT_T)).over(w)
    cols = {name: F.when(is_end, e.cast(_TYPES[name])).otherwise(c(name)) for name, e in linked_ends}
    cols["committed"] = F.when(is_copy, committed.cast("tinyint")).otherwise(c("committed"))
    by_offset = by_offset.select(*[cols[n].cast(_TYPES[n]).alias(n) if n in cols
                                   else c(n) for n in _EV])
    unkeyed = ev.where((is_copy | is_end) & key.isNull()).withColumn("tx", F.when(is_end, c("own_tx"))
                                                                     .otherwise(c("tx"))).select(*_EV)
    linked = by_offset.unionByName(unkeyed)

    # link_ops, keyed by (broker, queue id, half-queue offset): a half copy by its queue offset, an OP by the
    # half offset it names, a COMMIT END by its target's, an ORIGREF twin by TRAN_PREPARED_QUEUE_OFFSET;
    # null equals null here (window groups), as in the reducer's key_ids
    half = is_copy & (c("mechanism") == HALF_Q)
    commit_target = is_end & (c("end_type") == COMMIT_T) & c("target_qo").isNotNull()
    orig = (linked.where(half & c("tran_prepared_qo").isNotNull())
            .withColumn("role", F.lit(ORIGREF).cast("tinyint"))
            .withColumn("ord", c("ord") + F.lit(part.KIND_ORIGREF << part.KIND_SHIFT)))
    ops = ev.where(role == OP)
    in_q = linked.where(half | commit_target).unionByName(orig).unionByName(ops)
    role = c("role")
    half, is_op = (role == COPY) & (c("mechanism") == HALF_Q), role == OP
    qid = F.when(role == END, c("target_qid")).otherwise(c("queue_id"))
    qo = (F.when(role == END, c("target_qo")).when(role == OP, c("half_offset"))
          .when(role == ORIGREF, c("tran_prepared_qo")).otherwise(c("queue_offset")))
    w = Window.partitionBy("broker", "_q", "_o")
    in_q = in_q.withColumn("_q", qid).withColumn("_o", qo)
    half_tx = F.max(F.when(half, c("tx"))).over(w)
    cols = {"tx": F.when(is_op, half_tx).otherwise(c("tx")),
            "copy_committed": F.when(is_op, F.coalesce(F.max(F.when(half, c("committed") > 0)).over(w),
                                                       F.lit(False)).cast("tinyint")).otherwise(c("copy_committed")),
            "named": F.when(is_op, c("named")).otherwise(F.coalesce(F.max(is_op).over(w), F.lit(False))
                                                         .cast("tinyint"))}
    in_q = in_q.select(*[cols[n].cast(_TYPES[n]).alias(n) if n in cols else c(n) for n in _EV])
    rest = linked.where(~(half | commit_target)).unionByName(ev.where(~(is_copy | is_end | (role == OP)))
                                                             .select(*_EV))
    return in_q.unionByName(rest)


def cross_refs(linked: DataFrame) -> DataFrame:
    """evidence.cross_refs over linked rows: the XREF twins (keyed by ``own_tx``) of the END rows whose own
    id differs from the id of the half copy their PREPARED_TRANSACTION_OFFSET found (evidence.key_mismatch),
    and the TIDREF twins (keyed by ``tid_tx``) of the rows whose ``__transactionId__`` names another id than
    their own (evidence.tid_tx).  Filters of the persisted linked rows: no shuffle of their own."""
    c = F.col
    hit = ((c("role") == END) & (c("has_target") > 0) & (c("target_mech") == HALF_Q)
           & (c("mechanism") == HALF_Q) & c("uniq_key").isNotNull() & (c("own_tx") != c("tx")))
    tid = c("tid_tx").isNotNull() & (c("tx").isNull() | (c("tid_tx") != c("tx")))

    def twins(where, key: str, role: int, kind: int) -> DataFrame:
        return (linked.where(where).withColumn("tx", c(key)).withColumn("role", F.lit(role).cast("tinyint"))
                .withColumn("ord", c("ord") + F.lit(kind << part.KIND_SHIFT)).select(*_EV))

    return (twins(hit, "own_tx", XREF, part.KIND_XREF)
            .unionByName(twins(tid, "tid_tx", TIDREF, part.KIND_TIDREF)))


def _as_output(df: DataFrame, name: str) -> DataFrame:
    """Rows of one output table as RECON_OUTPUT rows."""
    have = set(df.columns)
    return df.select(*[(F.lit(name) if f.name == "out" else F.col(f.name) if f.name in have else F.lit(None))
                       .cast(f.dataType).alias(f.name) for f in RECON_OUTPUT.spark_schema().fields])


def settled_outputs(final: pa.Table, as_of: Dict[str, Optional[int]]) -> pa.Table:
    """RECON_OUTPUT rows of carried settled transactions (STATE_FINAL rows): their ``transactions`` rows at
    ``as_of`` (broker -> its audit time, ``reducer.final_transactions``) and the ``recovery`` rows of those,
    as the driver's reducer builds the work lists after appending them (a settled transaction has no open
    copy: no check-back row)."""
    tx = final_transactions(final, as_of)
    return part.output_union({"transactions": tx, "recovery": worklists.recovery(tx)})


class _SettledOutputs:
    """mapInArrow body: :func:`settled_outputs` of each batch of STATE_FINAL rows."""

    def __init__(self, as_of: Dict[str, Optional[int]]):
        self.as_of = as_of

    def __call__(self, batches):
        for b in batches:
            if b.num_rows:
                yield from settled_outputs(pa.Table.from_batches([b]), self.as_of).to_batches()


def reduce_distributed(wide: DataFrame, params, profile_override, op_bodies_given: bool,
                       critical_within_ms: int = 60000, tasks: Optional[int] = None,
                       final: Union[None, pa.Table, DataFrame] = None) -> Distributed:
    """RECON_INPUT rows (any brokers) -> the reducer's outputs as RECON_OUTPUT rows (check_back ranked per
    chunk: rank them again).  ``tasks``: partitions of the shuffle by transaction (default: reduce_tasks of
    the linked rows).  ``final``: carried settled transactions (``reducer.reduce_input``'s ``final``; Arrow,
    or a DataFrame converted batch by batch on the executors), added to the transactions at each broker's
    as-of with their recovery rows (:func:`settled_outputs`)."""
    spark = wide.sparkSession
    c = F.col
    persisted: List[DataFrame] = []
    ev, facts, findings = _evidence_and_facts(wide, op_bodies_given, persisted)
    has_cq = any(f.pop(part.CQ_UNITS, 0) for f in facts.values())
    ctx, profile_rows = _context(facts, findings, params, profile_override, critical_within_ms,
                                 _past_end(wide, facts, final))
    legacy = [b for b, bc in ctx.brokers.items()
              if bc.facts.get("n_st") and bc.damaged is not None and not bc.damaged.redolog]
    for broker, gap in _redolog_gaps(ev, legacy).items():
        d = ctx.brokers[broker].damaged
        if d is not None:
            ctx.brokers[broker].damaged = with_redolog_gap(d, gap)

    cores = int(spark.sparkContext.defaultParallelism or 1)
    # the union of the link's parts has the partitions of all of them: as many as a shuffle has, each task
    # reading several (every Python step over the rows costs a worker round trip per partition)
    narrow = max(cores, int(spark.conf.get("spark.sql.shuffle.partitions")))
    linked = persist_on_disk(link(ev).coalesce(narrow), persisted)
    n_rows = linked.count()
    if tasks is None:
        tasks = reduce_tasks(n_rows, cores)

    def orphans(it):
        yield from part.orphan_batches(it, ctx)

    anomaly_frames = [linked.where((c("role") == OP) & c("tx").isNull()).coalesce(cores)
                      .mapInArrow(orphans, AUDIT_ANOMALIES.spark_schema())]
    with_tx = linked.where(c("tx").isNotNull()).unionByName(cross_refs(linked))
    if has_cq:
        def cq(it):
            yield from part.cq_chunks(it, ctx)

        key = F.coalesce(c("commitlog_offset"), c("physical_offset"))
        cq_in = (wide.where(c("src").isin("commitlog", "consumequeue", CQ_RECORD_SRC)
                            & c("topic").isin(*TX_SYSTEM_TOPICS))
                 .select("src", "broker", "topic", "physical_offset", "commitlog_offset", "queue_id",
                         "queue_offset", "total_size", "size"))
        cqf = persist_on_disk(cq_in.repartition(tasks, c("broker"), key).sortWithinPartitions(c("broker"), key)
                       .mapInArrow(cq, AUDIT_ANOMALIES.spark_schema()), persisted)
        anomaly_frames.append(cqf)
        bit = F.lit(0)
        for code, b in part.PROBLEM_BITS.items():
            bit = F.when(c("code") == code, F.lit(b)).otherwise(bit)
        bits = (cqf.where(c("code").isin(*part.PROBLEM_BITS))
                .groupBy(c("broker").alias("_b"), c("physical_offset").alias("_o"))
                .agg(F.bit_or(bit.cast("tinyint")).alias("_p")))
        n_bits = bits.count()
        if n_bits:
            _add_cq_lost(ctx, cqf)
            with_tx = (with_tx.join(F.broadcast(bits) if n_bits <= 1_000_000 else bits,
                                    (c("broker") == c("_b")) & c("physical_offset").eqNullSafe(c("_o")), "left")
                       .withColumn("problems", F.coalesce(c("_p"), F.lit(0)).cast("tinyint")).select(*_EV))

    def missing(it):
        yield from part.missing_body_batches(it, op_bodies_given)

    op_records = (wide.where((c("src") == "commitlog") & (c("topic") == OP_TOPIC))
                  .select("broker", "topic", "physical_offset", "queue_id", "queue_offset", "body"))
    if op_bodies_given:
        given = wide.where(c("src") == "op_body").select("broker", "physical_offset").distinct()
        op_records = op_records.join(given, ["broker", "physical_offset"], "left_anti")
    anomaly_frames.append(op_records.coalesce(cores).mapInArrow(missing, AUDIT_ANOMALIES.spark_schema()))
    decoder = [a for b in ctx.brokers for a in part.decoder_findings(b, findings[b])]
    if decoder:
        anomaly_frames.append(arrow_frame(spark, part.anomalies_table(decoder),
                                                    schema=AUDIT_ANOMALIES.spark_schema()))

    def reduce(it):
        yield from part.reduce_chunks(it, ctx)

    out = (with_tx.repartition(tasks, c("broker"), c("tx")).sortWithinPartitions("broker", "tx", "ord")
           .mapInArrow(reduce, RECON_OUTPUT.spark_schema()))
    for df in anomaly_frames:
        out = out.unionByName(_as_output(df, "anomalies"))
    as_of = {b: as_of_ms(bc.params, bc.facts) for b, bc in ctx.brokers.items()}
    if isinstance(final, DataFrame):
        out = out.unionByName(final.mapInArrow(_SettledOutputs(as_of), RECON_OUTPUT.spark_schema()))
    elif final is not None and final.num_rows:
        out = out.unionByName(arrow_frame(spark, settled_outputs(final, as_of), schema=RECON_OUTPUT.spark_schema()))
    profiles = pa.Table.from_pylist(profile_rows, schema=PROFILES_TABLE.arrow_schema())
    out = out.unionByName(_as_output(arrow_frame(spark, profiles, schema=PROFILES_TABLE.spark_schema()),
                                     "profiles"))
    return Distributed(out, tasks, persisted, linked)


__all__ = ["reduce_distributed", "reduce_tasks", "link", "cross_refs", "Distributed", "ROWS_PER_TASK"]
