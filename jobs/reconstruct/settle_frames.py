"""The settle of jobs/reconstruct/settle.py for a state written from the executors: the reduction ran
distributed (jobs/reconstruct/distributed.py), so no task and no driver holds a broker's records or
transactions.  The decisions are settle.py's own Spark-free functions, run on Arrow batches:

1. ``settle.candidates`` over the ``transactions`` rows (``mapInArrow``, row-local), each candidate keyed by
   its transaction id (``evidence.uniq_tx``: the ``tx`` the linking gave its evidence rows).
2. The linked evidence (``Distributed.linked``: every row with its ``tx``) left-joined with the candidates,
   shuffled by (broker, tx) and sorted by ``ord``; per chunk of whole transactions ``settle.tx_bad`` decides
   which settle and ``settle.tx_lists`` gives their evidence columns (file base, newest offset, copy / half /
   record offsets); every evidence row comes out with whether its transaction settled.
3. Per (broker, CommitLog offset), as ``settle._settle_broker``: a copy / END / discard record is dropped
   when a settled transaction has it and no unsettled one does, an op record when all its pieces are
   settled ones'; one shared with unsettled transactions keeps only their pieces (``piece,`` each, in
   ``ord`` = body order).  Records and op bodies lose the dropped ones by anti-joins; the records that are
   evidence of nothing below the resume offset (``settle.inert_mask``, per batch) go too.
4. The dropped records' broker facts per CommitLog file (``settle.file_facts`` per partition, merged on the
   driver: one row per broker, file and partition) and consume-queue tuples (each to the settled
   transaction with the smallest id that has the record, as settle.py), and the STATE_FINAL rows (the
   candidate's ``transactions`` row joined with its evidence columns and tuples).

Only the merged facts reach the driver.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from jobs.reconstruct import settle as st
from jobs.reconstruct.evidence import OP, uniq_tx
from jobs.reconstruct.partitioned import by_broker, chunks_by_key, evidence_of
from jobs.reconstruct.reducer import merge_facts_into
from jobs.session import persist_on_disk
from schemas.audit import TRANSACTIONS
from schemas.recon import OP_BODY_COLUMNS, RECON_EVIDENCE
from schemas.state import STATE_FINAL, STATE_OP_BODIES, STATE_RECORDS

_LONGS = T.ArrayType(T.LongType())
#: the output of the per-transaction pass: kind 0 = one evidence row (its offset, role, ord, piece, whether
#: its transaction settled), kind 1 = one settled transaction (its evidence columns)
_PASS = T.StructType([
    T.StructField("broker", T.StringType()), T.StructField("kind", T.ByteType()),
    T.StructField("tx", T.StringType()), T.StructField("physical_offset", T.LongType()),
    T.StructField("role", T.ByteType()), T.StructField("ord", T.LongType()),
    T.StructField("piece", T.StringType()), T.StructField("good", T.BooleanType()),
    T.StructField("file_base", T.LongType()), T.StructField("max_offset", T.LongType()),
    T.StructField("copy_offsets", _LONGS), T.StructField("half_offsets", _LONGS),
    T.StructField("record_offsets", _LONGS)])
_FACTS = T.StructType([T.StructField("broker", T.StringType()), T.StructField("file_base", T.StringType()),
                       T.StructField("facts_json", T.StringType())])
_LIST_COLUMNS = ("file_base", "max_offset", "copy_offsets", "half_offsets", "record_offsets")


@dataclass
class BrokerSettle:
    """What the settle of one broker needs (small, shipped to the tasks): ``resume`` its state's resume
    offset, ``bases`` its CommitLog files' base offsets, ``hco`` / ``oco`` the half / op consume offsets,
    ``settles`` whether transactions may settle, ``discarded`` whether DISCARDED ones may, ``inert``
    whether its records that are evidence of nothing are dropped (settle.settle's conditions)."""

    resume: int
    bases: List[int]
    hco: Optional[int] = None
    oco: Optional[int] = None
    settles: bool = False
    discarded: bool = False
    inert: bool = False


@dataclass
class SettledFrames:
    """:func:`settle_frames`' result, as settle.Settled: ``records`` / ``op_bodies`` still carried,
    ``final`` the newly settled STATE_FINAL rows (DataFrames), ``facts`` {broker: {file base: facts}};
    ``persisted``: frames to unpersist once the state is written."""

    records: DataFrame
    op_bodies: Optional[DataFrame]
    final: DataFrame
    facts: Dict[str, Dict[str, dict]]
    persisted: List[DataFrame] = field(default_factory=list)

    def unpersist(self) -> None:
        for df in self.persisted:
            df.unpersist()
        self.persisted = []


def settle_frames(records: DataFrame, op_bodies: Optional[DataFrame], transactions: DataFrame,
                  linked: DataFrame, brokers: Dict[str, BrokerSettle], tasks: int) -> SettledFrames:
    """Split the state's ``records`` (STATE_RECORDS rows) and ``op_bodies`` (STATE_OP_BODIES rows, None
    when the records carry the op bodies) by the run's ``transactions`` and ``linked`` evidence (see the
    module docstring); ``brokers``: per broker settled.settle's conditions; ``tasks``: partitions of the
    shuffle by transaction."""
    c = F.col
    spark = records.sparkSession
    persisted: List[DataFrame] = []

    def keep(df: DataFrame) -> DataFrame:
        return persist_on_disk(df, persisted)

    settling = sorted(b for b, x in brokers.items() if x.settles and x.hco is not None and x.oco is not None
                      and x.bases)
    cand = keep(_candidates(transactions.where(c("broker").isin(*settling)), brokers)) if settling else None
    if cand is not None:
        ev = linked.where(c("broker").isin(*settling)).select(*RECON_EVIDENCE.names)
        keyed = ev.join(cand.select("broker", c("_tx").alias("tx"), F.lit(True).alias("_cand")),
                        ["broker", "tx"], "left")
        passed = keep(_per_transaction(keyed, brokers, tasks))
        rows = passed.where((c("kind") == 0) & c("physical_offset").isNotNull())
        is_op = c("role") == OP
        per_off = rows.groupBy("broker", "physical_offset").agg(
            F.max(c("good") & ~is_op).alias("_a"), F.max(~c("good") & ~is_op).alias("_b"),
            F.max(c("good") & is_op).alias("_c"), F.max(~c("good") & is_op).alias("_d"))
        dropped = keep(per_off.where((c("_a") & ~c("_b")) | (c("_c") & ~c("_d")))
                       .select("broker", "physical_offset", F.lit(True).alias("_drop")))
        mixed = per_off.where(c("_c") & c("_d")).select("broker", "physical_offset")
        bodies = keep(rows.where(is_op & ~c("good")).join(mixed, ["broker", "physical_offset"], "left_semi")
                      .groupBy("broker", "physical_offset")
                      .agg(F.array_sort(F.collect_list(F.struct("ord", "piece"))).alias("_p"))
                      .select("broker", "physical_offset",
                              F.array_join(F.transform("_p", lambda x: F.concat(F.coalesce(x["piece"], F.lit("")),
                                                                                F.lit(","))), "")
                              .alias("_body")))
        owner = (rows.where(c("good")).groupBy("broker", "physical_offset").agg(F.min("tx").alias("tx")))
    else:
        passed = dropped = bodies = owner = None
    inert = sorted(b for b, x in brokers.items() if x.inert and x.bases)
    marked = _inert_marked(records, brokers, inert)
    if dropped is not None:
        marked = marked.join(dropped, ["broker", "physical_offset"], "left")
    else:
        marked = marked.withColumn("_drop", F.lit(None).cast("boolean"))
    marked = keep(marked.withColumn("_gone", F.coalesce(c("_drop"), F.lit(False)) | c("_inert")))
    cols = STATE_RECORDS.names
    kept = marked.where(~c("_gone")).select(*cols)
    gone = marked.where(c("_gone")).select(*cols, "_drop")
    kept_ops = gone_ops = None
    if op_bodies is not None:
        ops = (op_bodies.join(dropped, ["broker", "physical_offset"], "left") if dropped is not None
               else op_bodies.withColumn("_drop", F.lit(None).cast("boolean")))
        kept_ops = _rebodied(ops.where(c("_drop").isNull()).select(*op_bodies.columns), bodies)
        gone_ops = ops.where(c("_drop").isNotNull()).select(*op_bodies.columns)
    else:
        kept = _rebodied(kept, bodies)
    facts = _facts(gone.select(*cols), gone_ops, brokers, op_bodies is None)
    final = (_final(passed, cand, owner, gone.where(c("_drop").isNotNull()).select(*cols), brokers)
             if cand is not None else _empty_final(spark))
    return SettledFrames(kept, kept_ops, final, facts, persisted)


def _candidates(transactions: DataFrame, brokers: Dict[str, BrokerSettle]) -> DataFrame:
    """The ``transactions`` rows settle.candidates keeps, with their transaction id ``_tx``."""
    allow = {b: x.discarded for b, x in brokers.items()}
    schema = T.StructType([*TRANSACTIONS.spark_schema().fields, T.StructField("_tx", T.StringType())])
    names = TRANSACTIONS.names

    def run(batches):
        for b in batches:
            for broker, sub in by_broker(pa.Table.from_batches([b]).select(names)):
                sub = sub.filter(pa.array(st.candidates(sub, allow.get(broker, False))))
                if sub.num_rows:
                    ids = uniq_tx(*(sub.column(n).combine_chunks()
                                    for n in ("uniq_key", "producer_group", "real_topic")))
                    yield from sub.append_column("_tx", ids).to_batches()

    return transactions.select(*names).mapInArrow(run, schema)


def _per_transaction(keyed: DataFrame, brokers: Dict[str, BrokerSettle], tasks: int) -> DataFrame:
    """Linked evidence rows (+ ``_cand``) -> _PASS rows: settle.tx_bad / tx_lists per chunk of whole
    transactions."""
    c = F.col
    conf = {b: (x.hco, x.oco, x.resume, np.asarray(sorted(x.bases), np.int64)) for b, x in brokers.items()}
    schema = pa.schema([pa.field(f.name, _arrow_type(f.dataType)) for f in _PASS.fields])

    def run(batches):
        for t in chunks_by_key(batches, lambda t: (t.column("broker"), t.column("tx"))):
            for broker, sub in by_broker(t):
                yield from _pass_rows(broker, sub, *conf[broker], schema).to_batches()

    return (keyed.repartition(tasks, c("broker"), c("tx")).sortWithinPartitions("broker", "tx", "ord")
            .mapInArrow(run, _PASS))


def _pass_rows(broker: str, sub: pa.Table, hco: int, oco: int, resume: int, bases: np.ndarray,
               schema: pa.Schema) -> pa.Table:
    ev = evidence_of(sub)
    enc = pc.dictionary_encode(sub.column("tx").combine_chunks())
    code = np.asarray(pc.fill_null(enc.indices, -1)).astype(np.int64)
    n_tx = len(enc.dictionary)
    is_cand = np.asarray(pc.fill_null(sub.column("_cand"), False).combine_chunks(), bool)
    cand = np.unique(code[is_cand & (code >= 0)])
    bad, file_idx = st.tx_bad(ev, code, n_tx, cand, hco, oco, resume, bases)
    has = code >= 0
    good = has & ~bad[np.where(has, code, 0)]
    settled = cand[~bad[cand]] if len(cand) else cand
    n = len(settled)
    slot = np.full(n_tx, -1, np.int64)
    slot[settled] = np.arange(n)
    g = slot[np.where(has, code, 0)]
    sel = good & (g >= 0)
    lists = st.tx_lists(ev, g, sel, n, bases, file_idx)
    m = sub.num_rows
    row_cols = {"broker": pa.array([broker] * m, pa.string()), "kind": pa.array(np.zeros(m, np.int8)),
                "tx": sub.column("tx").combine_chunks(), "physical_offset": sub.column("physical_offset"),
                "role": pa.array(ev.c["role"], pa.int8()), "ord": sub.column("ord"),
                "piece": sub.column("piece"), "good": pa.array(good)}
    tx_cols = dict(lists, broker=pa.array([broker] * n, pa.string()), kind=pa.array(np.ones(n, np.int8)),
                   tx=enc.dictionary.take(pa.array(settled, pa.int64())))
    return pa.concat_tables([
        pa.Table.from_arrays([(cols[f.name] if f.name in cols else pa.nulls(k, f.type)).cast(f.type)
                              for f in schema], schema=schema)
        for cols, k in ((row_cols, m), (tx_cols, n))])


def _arrow_type(t):
    return {T.StringType(): pa.string(), T.ByteType(): pa.int8(), T.LongType(): pa.int64(),
            T.BooleanType(): pa.bool_()}.get(t, pa.list_(pa.int64()))


def _inert_marked(records: DataFrame, brokers: Dict[str, BrokerSettle], inert: Sequence[str]) -> DataFrame:
    """``records`` + ``_inert``: settle.inert_mask per batch on the brokers of ``inert``."""
    if not inert:
        return records.withColumn("_inert", F.lit(False))
    conf = {b: (brokers[b].resume, np.asarray(sorted(brokers[b].bases), np.int64)) for b in inert}
    schema = T.StructType([*records.schema.fields, T.StructField("_inert", T.BooleanType())])

    def run(batches):
        for b in batches:
            t = pa.Table.from_batches([b])
            mask = np.zeros(t.num_rows, bool)
            for broker, _ in by_broker(t):
                if broker in conf:
                    rows = np.nonzero(np.asarray(pc.equal(t.column("broker"), broker).combine_chunks()))[0]
                    sub = t.take(pa.array(rows, pa.int64()))
                    mask[rows] = st.inert_mask(sub, *conf[broker])
            yield from t.append_column("_inert", pa.array(mask)).to_batches()

    return records.mapInArrow(run, schema)


def _rebodied(df: DataFrame, bodies: Optional[DataFrame]) -> DataFrame:
    """``df`` with the ``body`` of the rows at the offsets of ``bodies`` replaced (settle._rebodied)."""
    if bodies is None:
        return df
    c = F.col
    typ = df.schema["body"].dataType
    return (df.join(bodies, ["broker", "physical_offset"], "left")
            .withColumn("body", F.coalesce(c("_body").cast(typ), c("body"))).select(*df.columns))


def _facts(gone: DataFrame, gone_ops: Optional[DataFrame], brokers: Dict[str, BrokerSettle],
           ops_in_records: bool) -> Dict[str, Dict[str, dict]]:
    """{broker: {file base: facts}} of the dropped records and op bodies: settle.file_facts per partition,
    one row per broker, file and partition collected and merged."""
    bases = {b: np.asarray(sorted(x.bases), np.int64) for b, x in brokers.items()}
    empty_records = STATE_RECORDS.arrow_schema().empty_table()
    empty_ops = STATE_OP_BODIES.arrow_schema().empty_table()

    def rows(broker, facts):
        return [{"broker": broker, "file_base": k, "facts_json": json.dumps(v)} for k, v in facts.items()]

    def of_records(batches):
        out = []
        for b in batches:
            for broker, sub in by_broker(pa.Table.from_batches([b])):
                ops = st.op_rows_for(sub, None if ops_in_records else empty_ops)
                out += rows(broker, st.file_facts(sub, ops, bases[broker]))
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=pa.schema([(f.name, pa.string()) for f in _FACTS]))

    def of_ops(batches):
        out = []
        for b in batches:
            for broker, sub in by_broker(pa.Table.from_batches([b])):
                out += rows(broker, st.file_facts(empty_records, sub.select(list(OP_BODY_COLUMNS)), bases[broker]))
        if out:
            yield pa.RecordBatch.from_pylist(out, schema=pa.schema([(f.name, pa.string()) for f in _FACTS]))

    parts = gone.mapInArrow(of_records, _FACTS)
    if gone_ops is not None:
        parts = parts.unionByName(gone_ops.mapInArrow(of_ops, _FACTS))
    out: Dict[str, Dict[str, dict]] = {}
    for r in parts.collect():
        merge_facts_into(out.setdefault(r["broker"], {}).setdefault(r["file_base"], {}),
                         json.loads(r["facts_json"]))
    return out


def _final(passed: DataFrame, cand: DataFrame, owner: DataFrame, dropped_records: DataFrame,
           brokers: Dict[str, BrokerSettle]) -> DataFrame:
    """STATE_FINAL rows: each settled transaction's candidate row + its evidence columns + the consume-queue
    tuples of the dropped records it owns (ascending offsets) + the consume offsets it settled under."""
    c = F.col
    cq_fields = ("topic", "physical_offset", "queue_id", "queue_offset", "total_size")
    cq = (dropped_records.where(c("topic").isin(*st.CQ_TOPICS)).join(owner, ["broker", "physical_offset"])
          .groupBy("broker", "tx")
          .agg(F.array_sort(F.collect_list(F.struct(*(["physical_offset"] + [f for f in cq_fields
                                                                            if f != "physical_offset"]))))
               .alias("_cq")))
    schema = STATE_FINAL.spark_schema()
    cq_type = schema["cq_records"].dataType
    cq = cq.select("broker", "tx", F.transform("_cq", lambda x: F.struct(*(x[f].alias(f) for f in cq_fields)))
                   .cast(cq_type).alias("cq_records"))
    txs = passed.where(c("kind") == 1).select("broker", "tx", *_LIST_COLUMNS)
    rows = (txs.join(cand.withColumnRenamed("_tx", "tx"), ["broker", "tx"])
            .join(cq, ["broker", "tx"], "left"))
    mine = [(b, int(x.hco), int(x.oco)) for b, x in sorted(brokers.items())
            if x.hco is not None and x.oco is not None]
    hco = F.create_map(*[e for b, h, _ in mine for e in (F.lit(b), F.lit(h).cast("long"))])
    oco = F.create_map(*[e for b, _, o in mine for e in (F.lit(b), F.lit(o).cast("long"))])
    extra = {"cq_records": F.coalesce(c("cq_records"), F.array().cast(cq_type)),
             "half_consume_offset": hco[c("broker")], "op_consume_offset": oco[c("broker")]}
    return rows.select(*[(extra[f.name] if f.name in extra else c(f.name)).cast(f.dataType).alias(f.name)
                         for f in schema.fields])


def _empty_final(spark) -> DataFrame:
    return spark.createDataFrame([], STATE_FINAL.spark_schema())


__all__ = ["settle_frames", "SettledFrames", "BrokerSettle"]
