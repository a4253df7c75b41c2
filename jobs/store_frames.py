"""The DataFrames of one or several broker stores, in one of two modes (pure functions; nothing is run).

``load_store_frames(spark, stores, mode=...)`` returns :class:`StoreFrames`: ``commitlog``, ``consumequeue``,
``statetable``, ``redolog``, ``consumer_offsets`` and ``anomalies`` DataFrames (schemas:
:mod:`schemas.sources`, ``broker`` first) plus ``layout_info`` (driver-side listing summary per store).  The
DataFrames are lazy; the only driver work is listing the stores (directory listing and ``stat``).  Nothing is
cached: a caller that uses a frame several times may ``.cache()`` it.

Modes
-----
``full``
    ``commitlog`` is the whole CommitLog of every store (``rocketmq_commitlog``, byte ranges of
    ``split_bytes``); ``anomalies`` is ``rocketmq_anomalies`` with every decoder (CommitLog ranges, consume
    queues, statetable, redolog, consumerOffset.json, store discovery).

``indexed`` (default)
    ``commitlog`` holds only the transaction-relevant records, fetched by position with
    ``txlog_io.commitlog.decode_at`` (``DataFrame.mapInArrow`` over a position DataFrame repartitioned by
    (broker, CommitLog file, ``split_bytes`` chunk) and sorted by offset, so each task reads nearby records of
    one file).  Exactly these records:

    1. every record indexed by the consume queues of ``RMQ_SYS_TRANS_HALF_TOPIC``,
       ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` and ``TRANS_CHECK_MAX_TIME_TOPIC`` (4.3+ half / op / discard records);
    2. every record at a CommitLog offset listed in the 3.x ``transaction/statetable`` or
       ``transaction/redolog`` (PREPARED records, and COMMIT / ROLLBACK records: 3.x PREPARED and ROLLBACK
       records have no consume-queue entry, the redolog is their only index);
    3. the *real topics* are the ``REAL_TOPIC`` values of the half and discard records of (1) and the topics
       of the non-NOT records of (2); from the consume queues of those topics, every record whose transaction
       type is not ``NOT`` (the COMMIT records: 4.3+ commit records live in the real topic with a CQ entry and
       carry PREPARED_TRANSACTION_OFFSET back to the half).

    A record reachable several ways is read once.  Not reachable in this mode: 4.0 - 4.2 PREPARED / ROLLBACK
    records (stored in the real topic without any index; use ``full``), COMMIT-typed consumer-retry copies in
    ``SCHEDULE_TOPIC_XXXX`` / ``%RETRY%*`` (not transaction records; the broker keeps the sys_flag on retry),
    and anything no index points to (orphans after a crash: ``full`` finds those).
    ``anomalies`` = ``rocketmq_anomalies`` without the CommitLog range scan, plus the anomalies ``decode_at``
    reports for the fetched positions (``CQ_ENTRY_MISMATCH`` when no record starts there, CRC findings, ...)
    and ``MISSING_FILE`` for an offset that falls in no CommitLog file (deleted by retention, or a bad index
    unit); those come from a second ``mapInArrow`` pass over the same positions, on executors.

On a healthy store both modes give the same rows for the records listed above (tested on the real-broker
fixtures).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import pyarrow as pa

from jobs.datasources import (
    ANOMALIES_FORMAT, COMMITLOG_FORMAT, CONSUMEQUEUE_FORMAT, CONSUMER_OFFSETS_FORMAT, REDOLOG_FORMAT,
    STATETABLE_FORMAT, anomalies_batch, prepend_broker, register,
)
from jobs.options import DEFAULT_SPLIT_BYTES, OptionError, SourceOptions, parse_options
from schemas.sources import SOURCE_TABLES
from schemas.store import COMMITLOG
from txlog_io.errors import Anomaly, AnomalyKind

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TX_SYSTEM_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)
MODES = ("indexed", "full")
FETCH_CHUNK = 4096          # positions per decode_at call

_API = "load_store_frames"


@dataclass(frozen=True)
class StoreInfo:
    """What the driver learnt by listing one store (no file content read)."""

    broker: str
    root: str
    commitlog_files: tuple          # ((path, base_offset, size), ...) in offset order
    consume_queues: int             # number of (topic, queue_id) directories
    tx_half_topic: bool             # a RMQ_SYS_TRANS_HALF_TOPIC consume queue exists (4.3+ transactions)
    statetable_files: int           # 3.x transaction statetable files
    redolog_files: int              # 3.x transaction redolog files
    abort_present: bool             # last shutdown was not clean
    consumequeue_rocksdb: bool      # 5.x RocksDB consume queues (not readable as files)
    discovery_anomalies: int        # findings of discover_store (the rows are in the anomalies frame)

    @property
    def commitlog_bytes(self) -> int:
        return sum(size for _, _, size in self.commitlog_files)


@dataclass(frozen=True)
class StoreFrames:
    commitlog: object
    consumequeue: object
    statetable: object
    redolog: object
    consumer_offsets: object
    anomalies: object
    layout_info: tuple               # StoreInfo per store, in option order
    mode: str = "indexed"


def _store_info(broker: str, root: str, commitlog_dirs) -> StoreInfo:
    from txlog_io.mappedfile import discover_store

    layout = discover_store(root, commitlog_dirs=list(commitlog_dirs) if commitlog_dirs else None)
    return StoreInfo(
        broker=broker, root=root,
        commitlog_files=tuple((str(f.path), int(f.base_offset), int(f.size)) for f in layout.commitlog),
        consume_queues=len(layout.consume_queues),
        tx_half_topic=any(topic == HALF_TOPIC for topic, _ in layout.consume_queues),
        statetable_files=len(layout.statetable), redolog_files=len(layout.redolog),
        abort_present=bool(layout.abort_present), consumequeue_rocksdb=bool(layout.consumequeue_rocksdb),
        discovery_anomalies=len(layout.anomalies))


def load_store_frames(spark, stores: Union[str, Sequence[str]], mode: str = "indexed",
                      brokers: Optional[Union[str, Sequence[str]]] = None, include_bodies: bool = False,
                      split_bytes: int = DEFAULT_SPLIT_BYTES, commitlog_dirs: Optional[Sequence[str]] = None
                      ) -> StoreFrames:
    """Lazy DataFrames of ``stores`` (one root or several); see the module docstring for the two modes."""
    if mode not in MODES:
        raise OptionError(_API, "mode", f"expected one of {', '.join(MODES)}, got {mode!r}")
    roots = [stores] if isinstance(stores, str) else list(stores)
    base = {"paths": json.dumps([str(r) for r in roots]), "split_bytes": str(int(split_bytes))}
    if brokers is not None:
        base["brokers"] = brokers if isinstance(brokers, str) else ",".join(brokers)
    if commitlog_dirs:
        base["commitlog_dirs"] = ",".join(str(d) for d in commitlog_dirs)
    opts = parse_options(COMMITLOG_FORMAT, dict(base, include_bodies=str(bool(include_bodies)).lower()))
    register(spark)

    def read(fmt: str, **extra):
        return spark.read.format(fmt).options(**base, **extra).load()

    info = tuple(_store_info(b, r, opts.commitlog_dirs_of(r)) for b, r in opts.stores)
    consumequeue = read(CONSUMEQUEUE_FORMAT)
    statetable = read(STATETABLE_FORMAT)
    redolog = read(REDOLOG_FORMAT)
    consumer_offsets = read(CONSUMER_OFFSETS_FORMAT)
    if mode == "full":
        commitlog = read(COMMITLOG_FORMAT, include_bodies=str(bool(include_bodies)).lower())
        anomalies = read(ANOMALIES_FORMAT)
    else:
        commitlog, positions = indexed_commitlog(spark, consumequeue, statetable, redolog, info, opts)
        anomalies = read(ANOMALIES_FORMAT, sources="consumequeue,statetable,redolog,config,store") \
            .unionByName(fetch_anomalies(spark, positions, info, opts))
    return StoreFrames(commitlog=commitlog, consumequeue=consumequeue, statetable=statetable, redolog=redolog,
                       consumer_offsets=consumer_offsets, anomalies=anomalies, layout_info=info, mode=mode)


# ----------------------------------------------------------------------------------------------------------
# indexed mode
# ----------------------------------------------------------------------------------------------------------

def indexed_commitlog(spark, consumequeue, statetable, redolog, info: Sequence[StoreInfo],
                      opts: SourceOptions):
    """(transaction-relevant CommitLog rows, the positions they were fetched from).

    Positions are (broker, commitlog_offset, only_tx) rows, duplicates allowed: ``only_tx`` marks a position
    found through a real topic's consume queue, where a record is kept only if its transaction type is not NOT
    (a position also listed by a transaction index is kept whatever its type).  Two fetch passes: the index
    records (to learn the real topics), then every position once (:class:`_FetchAt` merges duplicates).
    """
    from pyspark.sql import functions as F

    key = ["broker", "commitlog_offset"]
    index_positions = (
        consumequeue.where(F.col("topic").isin(*TX_SYSTEM_TOPICS)).select(*key)
        .unionByName(statetable.select(*key))
        .unionByName(redolog.select(*key)))
    index_records = fetch_records(spark, index_positions, info, opts)
    real_topics = (
        index_records.select("broker", F.coalesce(
            F.when(F.col("topic").isin(HALF_TOPIC, DISCARD_TOPIC), F.col("real_topic")),
            F.when(F.col("transaction_type") != "NOT", F.col("topic"))).alias("topic"))
        .where(F.col("topic").isNotNull() & ~F.col("topic").isin(*TX_SYSTEM_TOPICS))
        .distinct())
    real_topic_positions = consumequeue.join(F.broadcast(real_topics), ["broker", "topic"], "left_semi")
    positions = (index_positions.withColumn("only_tx", F.lit(False))
                 .unionByName(real_topic_positions.select(*key, F.lit(True).alias("only_tx"))))
    return fetch_records(spark, positions, info, opts), positions


def _located(spark, positions, info: Sequence[StoreInfo], split_bytes: int):
    """positions (broker, commitlog_offset[, only_tx]) + the CommitLog file holding each (null path: no file),
    repartitioned by (broker, file, chunk of split_bytes) and sorted by offset within a partition."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    files_schema = T.StructType([T.StructField("f_broker", T.StringType(), False),
                                 T.StructField("path", T.StringType(), False),
                                 T.StructField("base_offset", T.LongType(), False),
                                 T.StructField("end_offset", T.LongType(), False)])
    rows = [(s.broker, path, base, base + size) for s in info for path, base, size in s.commitlog_files]
    files = spark.createDataFrame(rows, files_schema)
    # one partition per split_bytes of CommitLog (not per file: many small files -- small stores, many
    # brokers -- would each cost a task and a Python runner in every fetch pass)
    n_parts = max(1, -(-sum(size for s in info for _, _, size in s.commitlog_files) // split_bytes))
    if "only_tx" not in positions.columns:
        positions = positions.withColumn("only_tx", F.lit(False))
    p = positions.alias("p")
    located = p.join(F.broadcast(files), (F.col("p.broker") == F.col("f_broker"))
                     & (F.col("p.commitlog_offset") >= F.col("base_offset"))
                     & (F.col("p.commitlog_offset") < F.col("end_offset")), "left")
    chunk = F.floor((F.col("commitlog_offset") - F.col("base_offset")) / F.lit(split_bytes))
    columns = ["broker", "commitlog_offset", "only_tx", "path", "base_offset"]
    return (located.select(*columns, chunk.alias("chunk"))
            .repartition(n_parts, "broker", "path", "chunk")
            .sortWithinPartitions("broker", "path", "commitlog_offset")
            .select(*columns))


def fetch_records(spark, positions, info: Sequence[StoreInfo], opts: SourceOptions):
    """CommitLog rows (``broker`` + COMMITLOG) of the records starting at the given (broker, commitlog_offset)
    positions (duplicates allowed, each record is read once); with a boolean ``only_tx`` column, a position
    whose rows all say true yields its record only if its transaction type is not NOT."""
    fn = _FetchAt(with_body=opts.include_bodies, emit="records")
    return _located(spark, positions, info, opts.split_bytes).mapInArrow(
        fn, SOURCE_TABLES[COMMITLOG_FORMAT].spark_schema())


def fetch_anomalies(spark, positions, info: Sequence[StoreInfo], opts: SourceOptions):
    """Anomaly rows (``broker`` + ANOMALIES) met while fetching the given positions (a second pass)."""
    fn = _FetchAt(with_body=False, emit="anomalies",
                  commitlog_dirs={s.broker: (os.path.dirname(s.commitlog_files[0][0]) if s.commitlog_files
                                             else os.path.join(s.root, "commitlog")) for s in info})
    return _located(spark, positions, info, opts.split_bytes).mapInArrow(
        fn, SOURCE_TABLES[ANOMALIES_FORMAT].spark_schema())


class _FetchAt:
    """mapInArrow body: group sorted positions by file and call ``txlog_io.commitlog.decode_at`` per chunk."""

    def __init__(self, with_body: bool, emit: str, commitlog_dirs: Optional[dict] = None):
        self.with_body = with_body
        self.emit = emit
        self.commitlog_dirs = commitlog_dirs or {}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        # rows arrive sorted by (broker, path, offset): equal offsets are adjacent and merged here
        group_key, group, only_tx = None, [], set()
        missing: dict = {}
        for batch in batches:
            cols = batch.to_pydict()
            rows = zip(cols["broker"], cols["commitlog_offset"], cols["only_tx"], cols["path"],
                       cols["base_offset"])
            for broker, offset, flag, path, base in rows:
                if path is None:
                    missing[(broker, offset)] = True
                    continue
                k, pos = (broker, path, base), offset - base
                if k == group_key and group and group[-1] == pos:
                    if not flag:
                        only_tx.discard(pos)
                    continue
                if k != group_key or len(group) >= FETCH_CHUNK:
                    if group:
                        yield from self._decode(group_key, group, only_tx)
                    group_key, group, only_tx = k, [], set()
                group.append(pos)
                if flag:
                    only_tx.add(pos)
        if group:
            yield from self._decode(group_key, group, only_tx)
        if missing and self.emit == "anomalies":
            yield from self._missing(list(missing))

    def _decode(self, key: tuple, positions: list, only_tx: set) -> Iterator[pa.RecordBatch]:
        import pyarrow.compute as pc
        from txlog_io.commitlog import decode_at

        broker, path, base = key
        batch, anomalies = decode_at(path, positions, base_offset=base, with_body=self.with_body)
        if self.emit == "records":
            if only_tx and batch.num_rows:
                flagged = pc.is_in(batch.column("file_position"), pa.array(sorted(only_tx), pa.int64()))
                plain = pc.equal(batch.column("transaction_type"), "NOT")
                batch = batch.filter(pc.invert(pc.and_(flagged, plain)))
            if batch.num_rows:
                yield prepend_broker(batch, broker, COMMITLOG.arrow_schema(),
                                     SOURCE_TABLES[COMMITLOG_FORMAT].arrow_schema())
        elif anomalies:
            yield anomalies_batch(broker, anomalies, "commitlog", path)

    def _missing(self, missing: list) -> Iterator[pa.RecordBatch]:
        by_broker: dict = {}
        for broker, offset in missing:
            by_broker.setdefault(broker, []).append(Anomaly(
                AnomalyKind.MISSING_FILE, self.commitlog_dirs.get(broker, ""), int(offset),
                "an index (consume queue / statetable / redolog) points to a CommitLog offset no file holds",
                "a CommitLog file containing this offset", "no such file", "commitlog", int(offset)))
        for broker, found in by_broker.items():
            yield anomalies_batch(broker, found, "commitlog", self.commitlog_dirs.get(broker, ""))


__all__ = ["load_store_frames", "StoreFrames", "StoreInfo", "indexed_commitlog", "fetch_records",
           "fetch_anomalies", "TX_SYSTEM_TOPICS", "MODES"]
