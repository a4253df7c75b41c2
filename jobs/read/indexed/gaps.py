"""Indexed mode's CommitLog gaps: the ranges the indexes cannot answer for, which indexed mode scans instead
of trusting them, and the INDEX_INCOMPLETE findings that name them.

A gap row is a ``GAPS_SCHEMA`` tuple (broker, start, end, reason, queue, detail, queue_dir).  Where they come
from: the queue gaps (lost / rebuilt / lagging / zeroed-tail consume queues) are located by jobs.read.indexed.plan;
here are added the ranges no usable IndexFile covers (``index_file_gaps``: deleted, truncated or unreadable
index files, an ``indexMsgTimestamp`` newer than every index), the whole CommitLog of a store without any
transaction index, and the last 64 KiB of every CommitLog file (a file cut right after a record shows only
there).  Split out of jobs/read/frames.py, which plans the store's DataFrames and calls these; the one-job
indexed read (jobs/read/indexed/read.py) calls them on the driver.  A ``store`` / ``info`` item is a
jobs.read.frames ``StoreInfo`` (not imported: jobs.read.frames imports this module).
"""
from __future__ import annotations

import os
from typing import Iterator, Sequence

import pyarrow as pa

from jobs.read.indexed.plan import GAP_DENSE, GAP_TAIL, IndexedPlan, uses_index_files  # noqa: F401 - re-exported
from jobs.read.indexed.tables import GAP_REDOLOG_TAIL
from jobs.read.indexed.tails import GAP_QUEUE_IDLE_TAIL, split_idle_tails
from jobs.sources.formats import TX_SCAN_FORMAT, tx_scan_batches
from jobs.sources.options import SourceOptions
from schemas.sources import SOURCE_TABLES
from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS
from txlog_io.errors import Anomaly, AnomalyKind

#: why indexed mode scans a CommitLog range (INDEX_INCOMPLETE findings name the reason); the queue gaps
#: (GAP_TAIL, GAP_HEAD, GAP_TAIL_UNITS, GAP_OP_QUEUE) are derived by jobs.read.indexed.plan
GAP_NO_INDEX = "NO_TRANSACTION_INDEX"  # no transaction index at all (4.0 - 4.2, RocksDB queues): all of it
#: gaps that are how the store is made, not damage: scanned without an INDEX_INCOMPLETE finding
GAP_INDEX_HOLE = "INDEX_FILE_MISSING"   # IndexFile coverage has a hole: a deleted or unreadable index file
GAP_INDEX_TAIL = "INDEX_TAIL"           # after the newest index entry: unkeyed records, or not indexed yet
GAP_INDEX_LAG = "INDEX_LAG"             # the same after an unclean shutdown: the index may lag the CommitLog
GAP_INDEX_BOUNDARY = "INDEX_FILE_BOUNDARY"  # between a full index file and the next: unkeyed records only
GAP_FILE_END = "FILE_END"               # the last 64 KiB of every CommitLog file: a file cut short shows there
FILE_END_BYTES = 64 << 10
ORDINARY_GAPS = (GAP_TAIL, GAP_NO_INDEX, GAP_DENSE, GAP_INDEX_TAIL, GAP_INDEX_BOUNDARY, GAP_FILE_END,
                 GAP_QUEUE_IDLE_TAIL, GAP_REDOLOG_TAIL)     # its finding depends on what the scan finds: jobs/read/indexed/tails.py
GAPS_SCHEMA = ("broker string, start bigint, end bigint, reason string, queue string, detail string, "
               "queue_dir string")


def index_file_gaps(store) -> list:
    """CommitLog ranges (GAPS_SCHEMA rows) where the IndexFiles cannot answer "where is the COMMIT record of
    this key": before the first usable file's first entry, between usable files (a hole where a file is
    missing or unreadable, or the unkeyed records between a full file and the next), and after the newest
    entry.  Driver-side, from the headers listed in ``store.index_files``."""
    if not uses_index_files(store):
        return []
    clog_start = store.commitlog_files[0][1]
    clog_end = store.commitlog_files[-1][1] + store.commitlog_files[-1][2]
    index_dir = os.path.join(store.root, "index")
    rows, pos, prev_full = [], clog_start, True
    bad = [f for f in store.index_files if f[4] is not None]

    def gap(start, end, reason, name, detail):
        if end > start:
            rows.append((store.broker, start, end, reason, name, detail, index_dir))

    usable = [f for f in store.index_files if f[4] is None and f[2] >= f[1] >= 0]
    # between two files lie only the unkeyed records after the last keyed one of the full file; a missing
    # file leaves a range as long as the ones whole files cover.  1/8 of a typical file's span separates them
    # (at least 4 KiB: a few unkeyed records, e.g. the 48-byte DLedger entry header before the first message)
    spans = sorted(f[2] - f[1] for f in usable if f[3])
    boundary_limit = max(spans[len(spans) // 2] // 8 if spans else 0, 4096)
    for path, begin, end, full, *_ in usable:
        if end < pos:
            continue
        name = os.path.basename(path)
        ordinary = prev_full and begin - pos < boundary_limit
        reason = GAP_INDEX_BOUNDARY if ordinary else GAP_INDEX_HOLE
        gap(pos, begin, reason, name, f"no usable index file covers these records before {name}"
            + (f" (unusable: {', '.join(os.path.basename(b[0]) + ': ' + b[4] for b in bad)})" if bad else ""))
        pos, prev_full = max(pos, end + 1), full
    newest_full_ts = max((f[7] for f in usable if f[3]), default=-1)
    if not usable:
        tail, detail = GAP_INDEX_HOLE, "no usable index file"
    elif store.checkpoint_index_ts > max(newest_full_ts, usable[-1][7]):
        tail, detail = GAP_INDEX_HOLE, (
            f"the checkpoint's indexMsgTimestamp {store.checkpoint_index_ts} is newer than every usable index "
            "file: index files are missing")
    elif store.abort_present:
        tail, detail = GAP_INDEX_LAG, ("records after the newest index entry; the broker did not shut down "
                                       "cleanly, so the index may lag the CommitLog")
    else:
        tail, detail = GAP_INDEX_TAIL, "records after the newest index entry"
    gap(pos, clog_end, tail, None, detail)
    return rows


def indexed_gap_rows(plan: IndexedPlan, indexed: Sequence,
                     unindexed: Sequence) -> tuple:
    """(GAPS_SCHEMA rows to scan, the per-queue idle-tail rows) of an indexed read.

    What the indexes cannot reach is scanned, not silently missed: the gaps of the indexed stores (lost /
    rebuilt / lagging / zeroed-tail queues), located on the driver (jobs.read.indexed.plan: a few rows per store)
    so the scan and the findings share them, the ranges no usable IndexFile covers, and the whole CommitLog of
    a store without any index.  An indexed store the plan reads whole (``plan.full_read``: dense transaction
    records, ``jobs.read.indexed.plan.read_choices``) is one whole-CommitLog gap of its own ordinary reason."""
    whole = plan.full_read
    gap_rows, idle_tails = split_idle_tails(list(plan.gaps))
    gap_rows += [_whole_commitlog_gap(s) for s in unindexed]
    gap_rows += [_whole_commitlog_gap(s, GAP_DENSE, _dense_detail(plan.choices[s.broker]))
                 for s in indexed if s.broker in whole]
    indexed = [s for s in indexed if s.broker not in whole]
    gap_rows += [row for s in indexed for row in index_file_gaps(s)]
    # a file cut right after a record (TRUNCATED_FILE) is seen only by walking to its end: every file's last
    # 64 KiB is scanned, so indexed mode reports it (and flags what it touches) like full mode
    gap_rows += [(s.broker, max(base, base + size - FILE_END_BYTES), base + size, GAP_FILE_END, None,
                  "the end of every CommitLog file", os.path.join(s.root, "commitlog"))
                 for s in indexed for _, base, size in s.commitlog_files]
    return gap_rows, idle_tails


def _whole_commitlog_gap(store, reason: str = GAP_NO_INDEX,
                         detail: str = "no half-queue consume queue, statetable or redolog") -> tuple:
    """The gap row (GAPS_SCHEMA) of a store read whole (by default: one without a transaction index)."""
    _, last_base, last_size = store.commitlog_files[-1]
    return (store.broker, store.commitlog_files[0][1], last_base + last_size, reason, None, detail,
            os.path.join(store.root, "consumequeue"))


def _dense_detail(choice: dict) -> str:
    return (f"{choice['units']} transaction queue units: {choice['fetch_passes']} fetch passes of "
            f"{choice['window_bytes']} window bytes would cover the CommitLog (nothing written past "
            f"{choice['covered_to']})")


GAP_DETAIL = "%s: %s; indexed mode scanned CommitLog [%d, %d) for transaction records"
GAP_EXPECTED = "an index of every retained record of the queue"


def gap_anomalies(gap_rows: Sequence[tuple]) -> list:
    """:func:`gap_findings` on the driver: (broker, Anomaly) per gap row (GAPS_SCHEMA) that is damage."""
    out = []
    for broker, start, end, reason, queue, detail, queue_dir in gap_rows:
        if reason not in ORDINARY_GAPS:     # concat_ws("/", queue_dir, queue): nulls left out
            name = "/".join(p for p in (queue_dir, queue) if p is not None)
            out.append((broker, Anomaly(AnomalyKind.INDEX_INCOMPLETE, name, 0,
                                        GAP_DETAIL % (reason, detail, start, end), GAP_EXPECTED, reason,
                                        "index", start)))
    return out


def gap_findings(gaps):
    """One INDEX_INCOMPLETE anomaly per gap that is damage, not one of ORDINARY_GAPS (broker + ANOMALIES)."""
    from pyspark.sql import functions as F

    c = F.col
    return gaps.where(~c("reason").isin(*ORDINARY_GAPS)).select(
        "broker", F.lit(AnomalyKind.INDEX_INCOMPLETE).alias("kind"),
        F.concat_ws("/", "queue_dir", "queue").alias("file"), F.lit(0).cast("long").alias("position"),
        F.format_string(GAP_DETAIL, "reason", "detail", "start", "end").alias("detail"),
        F.lit(GAP_EXPECTED).alias("expected"),
        c("reason").alias("actual"), F.lit("index").alias("source"),
        c("start").alias("physical_offset"), F.lit(None).cast("long").alias("length"),
        F.lit(None).cast("long").alias("data_end"))


def scan_cells(spark, gap_rows: Sequence[tuple], info: Sequence, opts: SourceOptions):
    """Scan the CommitLog ranges of ``gap_rows`` (GAPS_SCHEMA tuples), cut at file and ``split_bytes``
    boundaries into pieces (a range owns the records that start in it, so the pieces of one range read each
    record once; records of overlapping gaps are de-duplicated by the caller).  One pass per piece yields
    ``rocketmq_txscan`` rows (:func:`split_tx_scan`): the transaction-relevant records (transaction type not
    NOT, or a transaction system topic) and the decoder's findings in those pieces.

    The pieces are cut on the driver (a few rows per gap: no join, no shuffle) and handed to the executors as
    contiguous slices of a parallelized list, so the scan is one narrow stage."""
    split = int(opts.split_bytes)
    cells = gap_cells(gap_rows, info, split)
    n_parts = max(1, -(-sum(s.commitlog_bytes for s in info) // split))
    n = max(1, min(len(cells), n_parts, 4 * spark.sparkContext.defaultParallelism))
    frame = spark.createDataFrame(spark.sparkContext.parallelize(cells, n),
                                  "broker string, path string, base_offset bigint, start bigint, end bigint")
    return frame.mapInArrow(_ScanCells(opts.include_bodies), SOURCE_TABLES[TX_SCAN_FORMAT].spark_schema())


def gap_cells(gap_rows: Sequence[tuple], info: Sequence, split: int) -> list:
    """Sorted (broker, path, base_offset, start, end) pieces of the merged gap ranges, cut at file and
    ``split`` boundaries (file positions)."""
    files: dict = {}
    for s in info:
        files.setdefault(s.broker, []).extend(s.commitlog_files)
    cells = set()
    for broker, g_start, g_end in _merged_ranges(gap_rows):
        for path, base, size in files.get(broker, ()):
            if not (g_start < base + size and g_end > base):
                continue
            lo, hi = max(g_start, base) - base, min(g_end, base + size) - base        # file positions
            for cell in range(lo // split, (hi - 1) // split + 1):
                cells.add((broker, path, int(base), max(lo, cell * split), min(hi, (cell + 1) * split)))
    return sorted(cells)


def _merged_ranges(gap_rows: Sequence[tuple]) -> list:
    """(broker, start, end) of the union of the gap ranges: overlapping gaps (e.g. DISPATCH_LAG and
    INDEX_TAIL, both ending at the CommitLog's end) are read once, as one range owning every record that
    starts in it."""
    out: list = []
    for broker, start, end, *_ in sorted(gap_rows, key=lambda g: (g[0], g[1], g[2])):
        if out and out[-1][0] == broker and start <= out[-1][2]:
            out[-1][2] = max(out[-1][2], end)
        elif start < end:
            out.append([broker, start, end])
    return [tuple(r) for r in out]


class _ScanCells:
    """mapInArrow body of ``scan_cells``: one ``tx_scan_batches`` pass per (path, base_offset, start, end),
    the op records' bodies kept (``StoreFrames.op_bodies_in_records``)."""

    def __init__(self, with_body: bool):
        self.with_body = with_body

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from txlog_io.readstats import flushing

        return flushing(self._scan(batches))

    def _scan(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for cells in batches:
            for cell in cells.to_pylist():
                yield from tx_scan_batches(cell["broker"], cell["path"], cell["base_offset"], cell["start"],
                                           cell["end"], self.with_body, gap_scan_keeps)


def gap_scan_keeps(batch: pa.RecordBatch) -> pa.Array:
    """Which records of a gap scan's ``tx_relevant`` batch indexed mode keeps -- what it promises: no
    magic-V2-only ordinary records (transaction type not NOT, or a transaction system topic)."""
    import pyarrow.compute as pc

    return pc.or_(pc.not_equal(batch.column("transaction_type"), "NOT"),
                  pc.is_in(batch.column("topic"), pa.array(TX_SYSTEM_TOPICS, pa.string())))


__all__ = ["GAPS_SCHEMA", "GAP_NO_INDEX", "GAP_INDEX_HOLE", "GAP_INDEX_TAIL", "GAP_INDEX_LAG",
           "GAP_INDEX_BOUNDARY", "GAP_FILE_END", "ORDINARY_GAPS", "uses_index_files", "index_file_gaps",
           "indexed_gap_rows", "gap_anomalies", "gap_findings", "scan_cells", "gap_cells", "gap_scan_keeps"]
