"""Spark Python data sources over RocketMQ broker store files (``pyspark.sql.datasource``, Spark 4.1+).

``register(spark)`` registers six batch formats.  Each reads one or several store roots and puts a ``broker``
column first (schemas: :mod:`schemas.sources`, i.e. ``broker`` + the :mod:`schemas.store` table, exactly):

* ``rocketmq_commitlog``: ``txlog_io.commitlog.decode_range``; one :class:`CommitLogRange` partition per
  ``split_bytes`` byte range of every CommitLog file (a 1 GiB file spreads over all cores);
* ``rocketmq_consumequeue``: ``txlog_io.consumequeue.decode_consumequeue``; :class:`UnitFiles` partitions,
  ConsumeQueue files (or ranges of big ones) packed up to ``split_bytes`` per task; a 5.x RocksDB
  consume-queue store's queues are the same partitions (``UnitSlice.rocksdb``: a queue-offset range of one
  queue, read by ``txlog_io.rocksdb_cq.read_units``), so every reader gets the same rows;
* ``rocketmq_statetable`` / ``rocketmq_redolog``: ``decode_statetable`` / ``decode_redolog`` (3.x stores),
  :class:`UnitFiles` partitions;
* ``rocketmq_consumer_offsets``: ``txlog_io.config.read_consumer_offsets``; one :class:`StoreFiles` per store;
* ``rocketmq_anomalies``: the anomalies of all of the above plus store discovery (``mappedfile``), over the
  union of the same partitions;
* ``rocketmq_txscan`` (internal, what ``full`` audit mode reads): ONE pass over the same CommitLog ranges
  yielding the transaction-relevant records *and* the CommitLog findings as rows of
  ``schemas.sources.TX_SCAN_SOURCE``; ordinary records are framed and checked but never become rows.  The op
  records keep their bodies (the reduction parses them) even without ``include_bodies``.

Options are parsed once, on the driver, into :class:`jobs.sources.options.SourceOptions`: ``DataSource.schema()`` runs
first and keeps the result on the data source instance, which Spark pickles into the plan; ``reader()`` reuses
it.  A bad option fails the ``load()`` with a one-line ``TXAUDIT_BAD_OPTION <format>: option '<name>': ...``.

The driver only lists directories and stats files (``partitions()``); every file is opened inside ``read()``
on an executor.  ``read()`` yields Arrow RecordBatches whose schema equals the Spark schema exactly (Spark
checks it).

Anomalies: a separate source that re-runs the same partition plan
-----------------------------------------------------------------
Integrity findings (txlog_io ``Anomaly`` values) come out of the same decoders that produce the rows.  They
reach Spark through ``rocketmq_anomalies``, whose partitions are the very same :class:`CommitLogRange` /
:class:`UnitFiles` / :class:`StoreFiles` values the row sources plan (one planner, ``plan_partitions``),
decoded again on the executors with only the anomalies kept.  Chosen over one combined scan (record rows +
anomaly rows + a discriminator, split by the caller after ``.cache()``) because:

* every row source keeps its exact, non-nullable schema; a combined scan needs nullable record columns (or a
  nullable struct) that no longer equal ``schemas.COMMITLOG`` after the split;
* nothing has to be cached: caching a whole CommitLog scan (bodies included) to save a second pass costs more
  memory/disk than the second pass costs CPU, and the cache's lifetime would leak into every caller;
* anomalies are still produced by executors (never collected on the driver), including store-level findings
  (file-name / size / gap checks of ``discover_store``, and the checkpoint's ``decode_checkpoint``
  findings), which a :class:`StoreFiles` partition recomputes;
* the anomaly pass skips bodies and topic filters, so it sees every record, whatever the row query filtered.

Ranges own what starts in them (records and anomalies alike, see ``txlog_io.commitlog_decode``), so neither
rows nor findings are duplicated or lost at split points.

Filter pushdown (option ``pushdown=true`` + ``spark.sql.python.filterPushdown.enabled``)
-------------------------------------------------------------------------------------
With option ``pushdown=true`` the reader takes ``EqualTo`` / ``EqualNullSafe`` / ``In`` filters with string
literals on ``topic`` (CommitLog: passed to the decoder as ``topics=``, so other records are dropped before
their properties and bodies are cut; ConsumeQueue: prunes queue directories) and on ``broker`` (prunes whole
stores).  Those are handled exactly and Spark does not re-evaluate them; every other filter goes back to
Spark.

It is off by default because of a Spark 4.2 defect (observed on 4.2.0, see tests/test_datasources.py): the
JVM keeps ONE planned reader per loaded DataFrame (``PythonDataSourceV2.readInfo``), overwritten by every
``pushFilters`` call and reused as-is by any later scan that pushes nothing.  So with pushdown,
``df.where("topic = 'X'").count()`` followed by ``df.count()`` counts only X, and a union/join of two
differently filtered uses of the same ``df`` reads both with the last reader.  Without the option the reader
never narrows itself, so reuse is safe; the ``topics`` option gives the same early drop per ``load()`` (what
:mod:`jobs.read.frames` uses).  Use ``pushdown=true`` only on a DataFrame that is read by a single scan.

Spark refuses to plan a reader that overrides ``pushFilters`` while the conf is off
(``DATA_SOURCE_PUSHDOWN_DISABLED``), so ``DataSource.reader()`` returns the plain reader when it is called
from Spark's non-pushdown planning worker (``plan_data_source_read._main``, which never calls
``pushFilters``); results are identical with the conf on or off.
"""
from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualNullSafe,
    EqualTo,
    Filter,
    In,
    InputPartition,
)

from jobs.sources.options import OptionError, SourceOptions, parse_options
from schemas.sources import SOURCE_TABLES, TX_SCAN_REDUCER, TX_SCAN_SOURCE
from schemas.store import COMMITLOG, CONSUMEQUEUE, CONSUMER_OFFSETS, REDOLOG, STATETABLE
from txlog_io.errors import Anomaly, TxlogError, UsageError

COMMITLOG_FORMAT = "rocketmq_commitlog"
CONSUMEQUEUE_FORMAT = "rocketmq_consumequeue"
STATETABLE_FORMAT = "rocketmq_statetable"
REDOLOG_FORMAT = "rocketmq_redolog"
CONSUMER_OFFSETS_FORMAT = "rocketmq_consumer_offsets"
ANOMALIES_FORMAT = "rocketmq_anomalies"
#: the ``sources`` of the anomalies source that are not the CommitLog decoder: an audit takes the CommitLog's
#: findings from its one CommitLog pass and these from the anomalies source
SIDE_SOURCES = "consumequeue,statetable,redolog,config,store"
FORMATS = (COMMITLOG_FORMAT, CONSUMEQUEUE_FORMAT, STATETABLE_FORMAT, REDOLOG_FORMAT, CONSUMER_OFFSETS_FORMAT,
           ANOMALIES_FORMAT)
TX_SCAN_FORMAT = "rocketmq_txscan"

#: columns whose EqualTo/In filters each format handles itself
PUSHABLE_COLUMNS = {
    COMMITLOG_FORMAT: ("broker", "topic"),
    CONSUMEQUEUE_FORMAT: ("broker", "topic"),
    STATETABLE_FORMAT: ("broker",),
    REDOLOG_FORMAT: ("broker",),
    CONSUMER_OFFSETS_FORMAT: ("broker",),
    ANOMALIES_FORMAT: ("broker",),
    TX_SCAN_FORMAT: ("broker",),
}

ANOMALY_FLUSH_ROWS = 8192


# ----------------------------------------------------------------------------------------------------------
# Partitions (small, picklable; built on the driver from listings only)
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommitLogRange(InputPartition):
    """Byte range ``[start, end)`` of one CommitLog file; owns the records whose start lies in it."""

    broker: str
    path: str
    base_offset: int
    start: int
    end: int


@dataclass(frozen=True)
class CommitLogCells(InputPartition):
    """Consecutive ``[start, end)`` cells of one CommitLog file read by one task (txscan ``task_bytes``): each
    cell is decoded on its own, exactly as a :class:`CommitLogRange` of it would be, so grouping changes the
    task count (each task costs a fixed ~0.25 s) and never the rows."""

    broker: str
    path: str
    base_offset: int
    cells: tuple                      # ((start, end), ...) in file order


def group_cells(ranges: Sequence[CommitLogRange], task_bytes: int) -> list:
    """``ranges`` (one file's cells in order, then the next file's...) grouped per file, up to
    ``task_bytes`` a group."""
    out: list = []
    group: list = []

    def close():
        if group:
            first = group[0]
            out.append(CommitLogCells(first.broker, first.path, first.base_offset,
                                      tuple((r.start, r.end) for r in group)))
            group.clear()

    for r in ranges:
        if group and (r.path != group[0].path or r.end - group[0].start > task_bytes):
            close()
        group.append(r)
    close()
    return out


@dataclass(frozen=True)
class UnitSlice:
    """Byte range of one fixed-unit file (ConsumeQueue, statetable or redolog)."""

    kind: str                  # consumequeue | statetable | redolog
    path: str
    base_offset: int
    start: int
    end: int
    topic: Optional[str] = None
    queue_id: Optional[int] = None
    rocksdb: bool = False      # a RocksDB queue (FileInfo.rocksdb): [start, end) picks its units' positions


@dataclass(frozen=True)
class UnitFiles(InputPartition):
    """Small unit-file slices of one store, read by one task (sizes adding up to about ``split_bytes``)."""

    broker: str
    slices: tuple


@dataclass(frozen=True)
class StoreFiles(InputPartition):
    """Per-store work that is not a byte range: consumerOffset.json, store discovery findings."""

    broker: str
    root: str
    commitlog_dirs: Optional[tuple] = None
    consumer_offsets_path: Optional[str] = None


# ----------------------------------------------------------------------------------------------------------
# Store listing (driver side: directory listing and stat only)
# ----------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FileInfo:
    path: str
    base_offset: int
    size: int
    #: a queue of a RocksDB consume-queue database (``path``): its units as if they were a file of 28-byte units
    #: starting at its first unit (``base_offset`` = first queue offset * 28, ``size`` = units * 28)
    rocksdb: bool = False


@dataclass(frozen=True)
class StoreListing:
    root: str
    commitlog: tuple                                  # FileInfo, in offset order
    consume_queues: dict = field(default_factory=dict)  # (topic, queue_id) -> tuple of FileInfo
    statetable: tuple = ()
    redolog: tuple = ()
    consumer_offsets_path: Optional[str] = None


def store_listing(root: str, commitlog_dirs: Optional[Sequence[str]] = None) -> StoreListing:
    """A store's mapped files, from ``txlog_io.mappedfile.discover_store`` (no file content is read)."""
    from txlog_io.mappedfile import discover_store

    layout = discover_store(root, commitlog_dirs=list(commitlog_dirs) if commitlog_dirs else None)
    return _listing_of(root, layout)


def _file_info(f) -> FileInfo:
    return FileInfo(str(f.path), int(f.base_offset), int(f.size))


def _listing_of(root: str, layout) -> StoreListing:
    cqs = {(str(t), int(q)): tuple(_file_info(f) for f in files)
           for (t, q), files in sorted(layout.consume_queues.items())}
    if layout.rocksdb_queues:
        from txlog_io.rocksdb_cq import CQ_UNIT_SIZE

        cqs.update({(str(t), int(q)): (FileInfo(str(layout.rocksdb_path), first * CQ_UNIT_SIZE,
                                                (last - first + 1) * CQ_UNIT_SIZE, rocksdb=True),)
                    for (t, q), (first, last) in sorted(layout.rocksdb_queues.items())})
    offsets_path = layout.consumer_offset_path
    return StoreListing(root=root, commitlog=tuple(_file_info(f) for f in layout.commitlog),
                        consume_queues=cqs, statetable=tuple(_file_info(f) for f in layout.statetable),
                        redolog=tuple(_file_info(f) for f in layout.redolog),
                        consumer_offsets_path=None if offsets_path is None else str(offsets_path))


# ----------------------------------------------------------------------------------------------------------
# Planning
# ----------------------------------------------------------------------------------------------------------

def commitlog_ranges(broker: str, files: Iterable[FileInfo], split_bytes: int) -> list:
    parts = []
    for f in files:
        for start in range(0, f.size, split_bytes):
            end = min(start + split_bytes, f.size)
            parts.append(CommitLogRange(broker, f.path, f.base_offset, start, end))
    return parts


def _unit_slices(kind: str, files: Iterable[FileInfo], split_bytes: int, topic=None, queue_id=None) -> list:
    out = []
    for f in files:
        for start in range(0, f.size, split_bytes):
            out.append(UnitSlice(kind, f.path, f.base_offset, start, min(start + split_bytes, f.size), topic,
                                 queue_id, f.rocksdb))
    return out


#: the file bytes of consecutive small partitions one task of a ``rocketmq_*`` read takes together
#: (:class:`PartitionPack`; full_read.PACK_BYTES for the one-job reads): a task costs a fixed 0.1-0.25 s, and
#: the DataFrame plan over many small stores paid it per store and format (46 tasks for the anomalies of 12
#: test stores).  A partition larger than this stays a task of its own.
READ_PACK_BYTES = 16 << 20


@dataclass(frozen=True)
class PartitionPack(InputPartition):
    """Consecutive small partitions read by one task, in order (:meth:`StoreReader.partitions`)."""

    parts: tuple


def partition_bytes(p) -> int:
    """The file bytes partition ``p`` reads (0 for the per-store work that is not a byte range)."""
    if isinstance(p, CommitLogRange):
        return p.end - p.start
    if isinstance(p, CommitLogCells):
        return sum(end - start for start, end in p.cells)
    if isinstance(p, UnitFiles):
        return sum(s.end - s.start for s in p.slices)
    if isinstance(p, PartitionPack):
        return sum(partition_bytes(q) for q in p.parts)
    return 0


def consecutive_groups(items: Sequence, quota: int) -> list:
    """``items`` cut into runs of consecutive items whose :func:`partition_bytes` add up to at most ``quota``
    (an item above it alone), in order."""
    groups: list = []
    acc = 0
    for p in items:
        n = partition_bytes(p)
        if not groups or acc + n > quota:
            groups.append([])
            acc = 0
        groups[-1].append(p)
        acc += n
    return groups


#: the least bytes of unit-file slices one partition packs, whatever ``split_bytes``: a task costs a fixed
#: 0.1-0.25 s while the decoder reads ~300 MB/s of CPU (mostly preallocated zeros).  At a small test-sized
#: split (256 KiB) six stores of 6 MB queue files were 2,345 partitions: 451 s for a DataFrame of 5 rows
UNIT_PACK_BYTES = 64 << 20


def pack_slices(broker: str, slices: Sequence[UnitSlice], split_bytes: int) -> list:
    """Greedy, order-preserving packing of slices into partitions of <= ``split_bytes`` (>= 1 slice each;
    at least :data:`UNIT_PACK_BYTES`).  The slices stay cut at ``split_bytes``: the same rows and findings."""
    split_bytes = max(split_bytes, UNIT_PACK_BYTES)
    parts, group, size = [], [], 0
    for s in slices:
        n = s.end - s.start
        if group and size + n > split_bytes:
            parts.append(UnitFiles(broker, tuple(group)))
            group, size = [], 0
        group.append(s)
        size += n
    if group:
        parts.append(UnitFiles(broker, tuple(group)))
    return parts


def plan_partitions(fmt: str, opts: SourceOptions, brokers: Optional[frozenset] = None,
                    topics: Optional[frozenset] = None, listings: Optional[dict] = None) -> list:
    """The partitions of format ``fmt``: the one planner every source (and the anomalies source) uses.

    ``brokers`` / ``topics``: pushed-down filters (None = all).  ``listings``: broker -> StoreListing, to
    reuse a listing the caller already made.
    """
    want = {
        "commitlog": fmt in (COMMITLOG_FORMAT, TX_SCAN_FORMAT)
        or (fmt == ANOMALIES_FORMAT and "commitlog" in opts.sources),
        "consumequeue": fmt == CONSUMEQUEUE_FORMAT
        or (fmt == ANOMALIES_FORMAT and "consumequeue" in opts.sources),
        "statetable": fmt == STATETABLE_FORMAT or (fmt == ANOMALIES_FORMAT and "statetable" in opts.sources),
        "redolog": fmt == REDOLOG_FORMAT or (fmt == ANOMALIES_FORMAT and "redolog" in opts.sources),
        "store": fmt == CONSUMER_OFFSETS_FORMAT or (fmt == ANOMALIES_FORMAT
                                                    and bool({"config", "store"} & opts.sources)),
    }
    split = opts.split_bytes
    parts: list = []
    for broker, root in opts.stores:
        if brokers is not None and broker not in brokers:
            continue
        listing = (listings or {}).get(broker) or store_listing(root, opts.commitlog_dirs_of(root))
        if want["commitlog"]:
            ranges = commitlog_ranges(broker, listing.commitlog, split)
            if fmt == TX_SCAN_FORMAT and opts.task_bytes > split:
                ranges = group_cells(ranges, opts.task_bytes)
            parts.extend(ranges)
        if want["consumequeue"]:
            slices = []
            for (topic, queue_id), files in listing.consume_queues.items():
                if topics is None or topic in topics:
                    slices.extend(_unit_slices("consumequeue", files, split, topic, queue_id))
            parts.extend(pack_slices(broker, slices, split))
        if want["statetable"]:
            parts.extend(pack_slices(broker, _unit_slices("statetable", listing.statetable, split), split))
        if want["redolog"]:
            parts.extend(pack_slices(broker, _unit_slices("redolog", listing.redolog, split), split))
        if want["store"]:
            parts.append(StoreFiles(broker, root, opts.commitlog_dirs_of(root),
                                    listing.consumer_offsets_path))
    return parts


# ----------------------------------------------------------------------------------------------------------
# Executor side: decoding a partition
# ----------------------------------------------------------------------------------------------------------

class DecoderContractError(TxlogError):
    """A txlog_io decoder yielded a batch whose schema is not the table's (a bug, not a data problem)."""


def prepend_broker(batch: pa.RecordBatch, broker: str, inner: pa.Schema, target: pa.Schema) -> pa.RecordBatch:
    if not batch.schema.equals(inner):
        raise DecoderContractError(f"decoder batch schema differs from {target.names[1:]}: {batch.schema}")
    col = pa.repeat(pa.scalar(broker, pa.string()), batch.num_rows)
    return pa.RecordBatch.from_arrays([col, *batch.columns], schema=target)


_ANOMALY_TARGET = SOURCE_TABLES[ANOMALIES_FORMAT].arrow_schema()


def anomalies_batch(broker: str, anomalies: Sequence[Anomaly], default_source: str = "",
                    default_file: str = "") -> pa.RecordBatch:
    """Anomaly values -> one RecordBatch of ``broker`` + ``schemas.ANOMALIES`` (required fields not null)."""
    cols = {name: [] for name in _ANOMALY_TARGET.names}
    for a in anomalies:
        cols["broker"].append(broker)
        cols["kind"].append(str(a.kind))
        cols["file"].append(str(a.file) if a.file is not None else default_file)
        cols["position"].append(int(a.position) if a.position is not None else -1)
        cols["detail"].append(str(a.detail) if a.detail is not None else "")
        cols["expected"].append(None if a.expected is None else str(a.expected))
        cols["actual"].append(None if a.actual is None else str(a.actual))
        cols["source"].append(str(a.source) if a.source else default_source)
        cols["physical_offset"].append(None if a.physical_offset is None else int(a.physical_offset))
        cols["length"].append(None if a.length is None else int(a.length))
        cols["data_end"].append(None if a.data_end is None else int(a.data_end))
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in _ANOMALY_TARGET],
                                      schema=_ANOMALY_TARGET)


def decode_unit_slice(s: UnitSlice, rows: bool = True) -> Iterator[tuple]:
    """(batch, anomalies) pairs of one slice; ``rows=False``: a consume queue's batches are empty (findings
    only)."""
    from txlog_io import consumequeue as CQ

    if s.kind == "consumequeue" and s.rocksdb:
        from txlog_io.rocksdb_cq import CQ_UNIT_SIZE, read_units

        first, n = s.base_offset // CQ_UNIT_SIZE, CQ_UNIT_SIZE
        return read_units(s.path, topics=[s.topic], rows=rows, queue_id=s.queue_id,
                          start=first + -(-s.start // n), end=first + -(-s.end // n))
    if s.kind == "consumequeue":
        return CQ.decode_consumequeue(s.path, topic=s.topic, queue_id=s.queue_id, base_offset=s.base_offset,
                                      start=s.start, end=s.end, rows=rows)
    if s.kind == "statetable":
        return CQ.decode_statetable(s.path, base_offset=s.base_offset, start=s.start, end=s.end)
    if s.kind == "redolog":
        return CQ.decode_redolog(s.path, base_offset=s.base_offset, start=s.start, end=s.end)
    raise UsageError(f"unknown unit file kind {s.kind!r}")


def store_anomalies(p: StoreFiles, sources: frozenset) -> list:
    """Findings of store discovery, unit chains, DLedger checks, the checkpoint (``store``) and
    consumerOffset.json (``config``) of one store."""
    found: list = []
    if "store" in sources:
        from txlog_io.config import decode_checkpoint
        from txlog_io.errors import AnomalyKind
        from txlog_io.mappedfile import discover_store

        layout = discover_store(p.root, commitlog_dirs=list(p.commitlog_dirs) if p.commitlog_dirs else None)
        found.extend(layout.anomalies)
        from txlog_io.dledger_store import verify_dledger
        from txlog_io.unitchain import check_store_unit_chains

        found.extend(check_store_unit_chains(layout))

        found.extend(verify_dledger(layout))
        if layout.checkpoint_path is not None:
            try:
                found.extend(decode_checkpoint(layout.checkpoint_path)["anomalies"])
            except TxlogError as e:         # unreadable: say so instead of failing the read
                found.append(Anomaly(AnomalyKind.BAD_CHECKPOINT, str(layout.checkpoint_path), 0, str(e),
                                     "a readable 4096-byte file", "unreadable", "checkpoint"))
    if "config" in sources:
        path = _consumer_offsets_path(p)
        if path is not None:
            from txlog_io.config import read_consumer_offsets

            _, config_anomalies = read_consumer_offsets(path)
            found.extend(config_anomalies)
    return found


def _consumer_offsets_path(p: StoreFiles) -> Optional[str]:
    return p.consumer_offsets_path


def consumer_offsets_rows(p: StoreFiles) -> Optional[pa.RecordBatch]:
    """``broker`` + CONSUMER_OFFSETS rows of the store's consumerOffset.json (None: no file or no rows)."""
    path = _consumer_offsets_path(p)
    if path is None:
        return None
    from txlog_io.config import consumer_offsets_batch, read_consumer_offsets

    rows, _ = read_consumer_offsets(path)
    if not rows:
        return None
    return prepend_broker(consumer_offsets_batch(rows), p.broker, CONSUMER_OFFSETS.arrow_schema(),
                          SOURCE_TABLES[CONSUMER_OFFSETS_FORMAT].arrow_schema())


# ----------------------------------------------------------------------------------------------------------
# Readers
# ----------------------------------------------------------------------------------------------------------

class StoreReader(DataSourceReader):
    """Reader of one ``rocketmq_*`` format (no filter pushdown; see :class:`FilteringStoreReader`)."""

    def __init__(self, fmt: str, opts: SourceOptions):
        self.fmt = fmt
        self.opts = opts
        self.brokers: Optional[frozenset] = None   # pushed broker filter
        self.topics: Optional[frozenset] = opts.topics  # option topics, narrowed by pushed topic filters

    def partitions(self) -> list:
        parts = plan_partitions(self.fmt, self.opts, brokers=self.brokers, topics=self.topics)
        return [g[0] if len(g) == 1 else PartitionPack(tuple(g)) for g in consecutive_groups(parts,
                                                                                             READ_PACK_BYTES)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        from txlog_io.readstats import flushing

        return flushing(self._read(partition))

    def _read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(partition, PartitionPack):
            return (b for p in partition.parts for b in self._read(p))
        if self.fmt == ANOMALIES_FORMAT:
            return self._read_anomalies(partition)
        if self.fmt == TX_SCAN_FORMAT:
            if isinstance(partition, CommitLogCells):
                return (b for start, end in partition.cells
                        for b in tx_scan_batches(partition.broker, partition.path, partition.base_offset,
                                                 start, end, self.opts.include_bodies,
                                                 columns=self.opts.columns))
            return tx_scan_batches(partition.broker, partition.path, partition.base_offset, partition.start,
                                   partition.end, self.opts.include_bodies, columns=self.opts.columns) \
                if isinstance(partition, CommitLogRange) else iter(())
        if isinstance(partition, CommitLogRange):
            return self._read_commitlog(partition)
        if isinstance(partition, UnitFiles):
            return self._read_units(partition)
        if isinstance(partition, StoreFiles):
            return self._read_consumer_offsets(partition)
        return iter(())  # InputPartition(None): Spark's stand-in for an empty plan

    # -- rows -----------------------------------------------------------------------------------------------
    def _read_commitlog(self, p: CommitLogRange) -> Iterator[pa.RecordBatch]:
        from txlog_io.dledger import decode_log_range as decode_range  # CommitLog or DLedger data file

        if self.topics is not None and not self.topics:
            return
        inner, target = COMMITLOG.arrow_schema(), SOURCE_TABLES[COMMITLOG_FORMAT].arrow_schema()
        for batch, _ in decode_range(p.path, base_offset=p.base_offset, start=p.start, end=p.end,
                                     with_body=self.opts.include_bodies,
                                     topics=None if self.topics is None else sorted(self.topics)):
            if batch.num_rows:
                yield prepend_broker(batch, p.broker, inner, target)

    def _read_units(self, p: UnitFiles) -> Iterator[pa.RecordBatch]:
        table = {CONSUMEQUEUE_FORMAT: CONSUMEQUEUE, STATETABLE_FORMAT: STATETABLE,
                 REDOLOG_FORMAT: REDOLOG}[self.fmt]
        inner, target = table.arrow_schema(), SOURCE_TABLES[self.fmt].arrow_schema()
        for s in p.slices:
            for batch, _ in decode_unit_slice(s):
                if batch.num_rows:
                    yield prepend_broker(batch, p.broker, inner, target)

    def _read_consumer_offsets(self, p: StoreFiles) -> Iterator[pa.RecordBatch]:
        batch = consumer_offsets_rows(p)
        if batch is not None:
            yield batch

    # -- anomalies ------------------------------------------------------------------------------------------
    def _read_anomalies(self, p: InputPartition) -> Iterator[pa.RecordBatch]:
        if isinstance(p, CommitLogRange):
            from txlog_io.dledger import decode_log_range as decode_range

            pairs = decode_range(p.path, base_offset=p.base_offset, start=p.start, end=p.end, with_body=False)
            found = (a for _, anomalies in pairs for a in anomalies)
            yield from _anomaly_batches(p.broker, found, "commitlog", p.path)
        elif isinstance(p, UnitFiles):
            def unit_anomalies() -> Iterator[Anomaly]:
                for s in p.slices:
                    for _, anomalies in decode_unit_slice(s, rows=False):
                        yield from anomalies
            yield from _anomaly_batches(p.broker, unit_anomalies(), "", p.slices[0].path if p.slices else "")
        elif isinstance(p, StoreFiles):
            found = iter(store_anomalies(p, self.opts.sources))
            yield from _anomaly_batches(p.broker, found, "store", p.root)


_TX_SCAN_TARGET = SOURCE_TABLES[TX_SCAN_FORMAT].arrow_schema()
_RECORD_NAMES = COMMITLOG.arrow_schema().names
_ANOMALY_NAMES = [f.name for f in _ANOMALY_TARGET][1:]
#: the txscan source's ``columns`` option -> its row schema
TX_SCAN_TABLES = {"all": TX_SCAN_SOURCE, "reducer": TX_SCAN_REDUCER}


def tx_scan_table(opts: SourceOptions):
    """The row table (``schemas.core.Table``) of a ``rocketmq_txscan`` read with ``opts``."""
    return TX_SCAN_TABLES[opts.columns]


def tx_scan_rows(broker: str, records: Optional[pa.RecordBatch] = None,
                 anomalies: Optional[pa.RecordBatch] = None,
                 target: pa.Schema = _TX_SCAN_TARGET) -> pa.RecordBatch:
    """COMMITLOG rows or ``broker`` + ANOMALIES rows as ``target`` rows (TX_SCAN_SOURCE's, or a narrower
    schema of the same columns: TX_SCAN_REDUCER's), the other half null."""
    from schemas.sources import TX_SCAN_ANOMALY, TX_SCAN_RECORD

    n = records.num_rows if records is not None else anomalies.num_rows
    kind = TX_SCAN_RECORD if records is not None else TX_SCAN_ANOMALY
    cols = [pa.repeat(pa.scalar(broker, pa.string()), n), pa.repeat(pa.scalar(kind, pa.string()), n)]
    for f in target:
        if f.name in ("broker", "row_kind"):
            continue
        if f.name.startswith("anomaly_") and f.name[8:] in _ANOMALY_NAMES:
            cols.append(anomalies.column(f.name[8:]) if anomalies is not None else pa.nulls(n, f.type))
        else:
            cols.append(records.column(f.name) if records is not None else pa.nulls(n, f.type))
    return pa.RecordBatch.from_arrays(cols, schema=target)


def op_bodies_only(batch: pa.RecordBatch) -> pa.RecordBatch:
    """``batch`` (COMMITLOG columns) with ``body`` kept for the op records only (the reduction parses those;
    the halves' and the commits' stay behind)."""
    import pyarrow.compute as pc

    from txlog_io.commitlog_layout import OP_TOPIC

    i = batch.schema.get_field_index("body")
    body = pc.if_else(pc.equal(batch.column("topic"), OP_TOPIC), batch.column(i),
                      pa.nulls(batch.num_rows, pa.binary()))
    return batch.set_column(i, batch.schema.field(i), body)


def tx_scan_batches(broker: str, path: str, base_offset: int, start: int, end: int, with_body: bool,
                    keep=None, columns: str = "all") -> Iterator[pa.RecordBatch]:
    """One pass over ``[start, end)`` of a CommitLog file: its transaction-relevant records and its findings
    as ``TX_SCAN_SOURCE`` rows (``columns="reducer"``: TX_SCAN_REDUCER rows).  Without ``with_body`` only the op
    records keep their bodies (the reducer links them by the half offsets they carry).  ``keep(batch) -> mask``:
    a further row filter (indexed mode's gap scan)."""
    from txlog_io.dledger import decode_log_range as decode_range  # CommitLog or DLedger data file

    target = TX_SCAN_TABLES[columns].arrow_schema()
    op_only = not with_body
    pending: list = []
    for batch, anomalies in decode_range(path, base_offset=base_offset, start=start, end=end,
                                         with_body=with_body or op_only, tx_relevant=True):
        if keep is not None and batch.num_rows:
            batch = batch.filter(keep(batch))
        if batch.num_rows:
            yield tx_scan_rows(broker, records=op_bodies_only(batch) if op_only else batch, target=target)
        pending.extend(anomalies)
        if len(pending) >= ANOMALY_FLUSH_ROWS:
            yield tx_scan_rows(broker, anomalies=anomalies_batch(broker, pending, "commitlog", path),
                               target=target)
            pending = []
    if pending:
        yield tx_scan_rows(broker, anomalies=anomalies_batch(broker, pending, "commitlog", path), target=target)


def _anomaly_batches(broker: str, anomalies: Iterator[Anomaly], default_source: str,
                     default_file: str) -> Iterator[pa.RecordBatch]:
    pending: list = []
    for a in anomalies:
        pending.append(a)
        if len(pending) >= ANOMALY_FLUSH_ROWS:
            yield anomalies_batch(broker, pending, default_source, default_file)
            pending = []
    if pending:
        yield anomalies_batch(broker, pending, default_source, default_file)


def _string_values(f: Filter) -> Optional[frozenset]:
    """The string set an EqualTo / EqualNullSafe / In filter admits; None when it is not such a filter."""
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return frozenset([f.value]) if isinstance(f.value, str) else None
    if isinstance(f, In):
        values = tuple(f.value)
        if all(isinstance(v, str) or v is None for v in values):
            return frozenset(v for v in values if v is not None)   # NULL never equals a non-null column value
    return None


class FilteringStoreReader(StoreReader):
    """:class:`StoreReader` that takes EqualTo / EqualNullSafe / In on ``broker`` and ``topic`` itself."""

    def pushFilters(self, filters: list) -> Iterable[Filter]:
        pushable = PUSHABLE_COLUMNS[self.fmt]
        for f in filters:
            column = getattr(f, "attribute", None)
            values = _string_values(f)
            if values is None or column is None or len(column) != 1 or column[0] not in pushable:
                yield f
                continue
            if column[0] == "broker":
                self.brokers = values if self.brokers is None else self.brokers & values
            else:
                self.topics = values if self.topics is None else self.topics & values


# ----------------------------------------------------------------------------------------------------------
# Data sources
# ----------------------------------------------------------------------------------------------------------

def _called_from_non_pushdown_planner(depth: int = 2) -> bool:
    """True when our caller is Spark's ``plan_data_source_read._main`` (it never calls pushFilters)."""
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return False
    code = frame.f_code
    return code.co_name == "_main" and os.path.basename(code.co_filename) == "plan_data_source_read.py"


class _RocketMQSource(DataSource):
    FORMAT = ""

    @classmethod
    def name(cls) -> str:
        return cls.FORMAT

    def _options(self) -> SourceOptions:
        parsed = self.__dict__.get("_parsed")
        if parsed is None:
            parsed = parse_options(self.FORMAT, self.options)
            self._parsed = parsed
        return parsed

    def _table(self, opts: SourceOptions):
        return tx_scan_table(opts) if self.FORMAT == TX_SCAN_FORMAT else SOURCE_TABLES[self.FORMAT]

    def schema(self):
        return self._table(self._options()).spark_schema()  # options validated at load() time, on the driver

    def reader(self, schema) -> DataSourceReader:
        opts = self._options()
        expected = self._table(opts).spark_schema()
        if schema is not None and [(f.name, f.dataType) for f in schema.fields] != \
                [(f.name, f.dataType) for f in expected.fields]:
            raise OptionError(self.FORMAT, "schema", f"the schema of {self.FORMAT} is fixed "
                                                     f"({expected.simpleString()}); do not pass another one")
        filtering = opts.pushdown and not _called_from_non_pushdown_planner()
        return (FilteringStoreReader if filtering else StoreReader)(self.FORMAT, opts)


class CommitLogSource(_RocketMQSource):
    FORMAT = COMMITLOG_FORMAT


class ConsumeQueueSource(_RocketMQSource):
    FORMAT = CONSUMEQUEUE_FORMAT


class StateTableSource(_RocketMQSource):
    FORMAT = STATETABLE_FORMAT


class RedoLogSource(_RocketMQSource):
    FORMAT = REDOLOG_FORMAT


class ConsumerOffsetsSource(_RocketMQSource):
    FORMAT = CONSUMER_OFFSETS_FORMAT


class AnomaliesSource(_RocketMQSource):
    FORMAT = ANOMALIES_FORMAT


class TxScanSource(_RocketMQSource):
    FORMAT = TX_SCAN_FORMAT


SOURCES = (CommitLogSource, ConsumeQueueSource, StateTableSource, RedoLogSource, ConsumerOffsetsSource,
           AnomaliesSource, TxScanSource)


_REGISTERED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # session -> its environment


def register(spark) -> None:
    """Register every ``rocketmq_*`` format with ``spark`` (idempotent per session and worker environment:
    a registration carries ``SparkContext.environment`` as it was then -- e.g. the bench's read counting --
    so a changed environment registers again)."""
    try:
        env = tuple(sorted(spark.sparkContext.environment.items()))
    except Exception:  # noqa: BLE001 - no SparkContext (Spark Connect): nothing to carry
        env = ()
    if _REGISTERED.get(spark) == env:
        return
    for cls in SOURCES:
        spark.dataSource.register(cls)
    _REGISTERED[spark] = env


__all__ = ["register", "FORMATS", "SOURCES", "CommitLogRange", "CommitLogCells", "group_cells",
           "PartitionPack", "partition_bytes", "consecutive_groups", "READ_PACK_BYTES", "UNIT_PACK_BYTES",
           "UnitSlice", "UnitFiles", "StoreFiles",
           "StoreListing", "FileInfo", "store_listing", "plan_partitions", "anomalies_batch",
           "prepend_broker", "StoreReader", "FilteringStoreReader", "COMMITLOG_FORMAT", "CONSUMEQUEUE_FORMAT",
           "STATETABLE_FORMAT", "REDOLOG_FORMAT", "CONSUMER_OFFSETS_FORMAT", "ANOMALIES_FORMAT", "TX_SCAN_FORMAT",
           "tx_scan_batches", "tx_scan_rows", "tx_scan_table", "op_bodies_only", "TX_SCAN_TABLES", "decode_unit_slice", "store_anomalies",
           "consumer_offsets_rows"]
