"""Indexed mode's queue gaps, derived on the driver from a few numbers per transaction queue.

Where the transaction indexes (half / op / discard consume queues, 3.x statetable / redolog) may be
incomplete, indexed mode scans the CommitLog instead of trusting them (``jobs.read.frames`` module docstring,
item 4; the reasons are ``indexed_gaps.GAP_*``). What decides those ranges is small whatever the store's size:

* per transaction queue: its first and last unit (queue offset, CommitLog offset, end of the last record);
* the dispatch point per store: the end of the record the newest unit of ANY consume queue points to
  (found by bisection to the zero tail of each queue's newest file, ``consumequeue.last_unit_end``), and the
  end of the last 3.x statetable / redolog unit;
* ``CID_RMQ_SYS_TRANS``'s consumed offsets (consumerOffset.json);
* the holes in a queue's offsets (``jobs.read.indexed.holes``: a file missing, cut or zeroed in the middle).

The queue extremes come from the transaction queues' units. When their files are small (at most
``DRIVER_READ_BYTES`` in all: thousands of transactions) the driver reads them with the data source's own
reader (``jobs.sources.formats.StoreReader``: the very rows Spark would get) -- no Spark job at all; larger
ones are aggregated by one Spark job and only a row per queue is collected. The gap rows themselves are
derived by :func:`queue_gaps` in plain Python from those rows (one implementation for both paths). This
replaced a lazy Spark plan collected at planning time whose joins and aggregations cost ~18 Spark jobs
(adaptive execution runs each exchange as its own job) on every indexed audit, however small the store.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.indexed.checkpoint import checkpoint_gaps
from jobs.read.indexed.holes import (
    anchored_frame,
    anchors,
    commitlog_ends,
    empty_queue_gaps,
    hole_gaps,
    queue_holes,
    queue_holes_of_frame,
)
from jobs.read.indexed.tables import redolog_gaps, tables_end
from jobs.read.indexed.tails import GAP_QUEUE_IDLE_TAIL
from jobs.sources.formats import (
    CONSUMEQUEUE_FORMAT,
    CONSUMER_OFFSETS_FORMAT,
    REDOLOG_FORMAT,
    STATETABLE_FORMAT,
    StoreReader,
    partition_bytes,
)
from jobs.sources.options import SourceOptions
from schemas.sources import SOURCE_TABLES
from txlog_io import readstats
from txlog_io.commitlog_decode import FETCH_DENSE_GAP, FETCH_WINDOW, FETCH_WINDOW_TAIL
from txlog_io.commitlog_layout import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC, SYS_FLAG_OFFSET, TX_SYSTEM_TOPICS
from txlog_io.errors import TxlogError
from txlog_io.positional import input_pread, open_input

#: why indexed mode scans a CommitLog range because of the queues (INDEX_INCOMPLETE findings name the reason)
GAP_TAIL = "DISPATCH_LAG"            # after the last record any index points to: not dispatched (yet)
GAP_HEAD = "QUEUE_HEAD_MISSING"      # a transaction queue's first unit is not unit 0 and lies past the
                                     # CommitLog's start: its older units were deleted (or rebuilt later)
GAP_TAIL_UNITS = "QUEUE_TAIL_MISSING"  # consumerOffset.json has consumed past the queue's last unit
GAP_OP_QUEUE = "OP_QUEUE_MISSING"    # half queue present, op queue absent: ops cannot be found by index

GAP_DENSE = "DENSE_TRANSACTIONS"     # the transaction records' fetch windows would cover most of the
                                     # CommitLog: read whole, as full mode does (no finding: a choice)
#: fetch passes an indexed read makes over the span of a store's transaction queues: the records at their
#: units, then the COMMIT / real-topic records those lead to (which lie between them)
FETCH_PASSES = 2
#: CommitLog bytes below which a store is always read by index: less than one fetch window
#: (``commitlog_decode.FETCH_WINDOW``, 8 MiB), where two window passes cost at most 16 MiB of reading
WHOLE_READ_MIN_BYTES = FETCH_WINDOW

#: transaction-queue / statetable / redolog file bytes up to which the driver reads them itself
DRIVER_READ_BYTES = 32 << 20
#: transaction-queue units up to which the driver also reads their records' headers and does the IndexFile
#: lookups (about as many records as the executors then fetch; ~1 KiB read per record)
DRIVER_FETCH_UNITS = 20000
#: threads for the driver's record reads (cold random reads: throughput grows with the reads in flight)
DRIVER_IO_THREADS = 16
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
_EXTREMES = ("broker", "topic", "queue_id", "q_first", "q_last", "p_first", "p_after_last")


def uses_index_files(store) -> bool:
    """Whether indexed mode finds this store's 4.3+ COMMIT records through IndexFile lookups of
    ``REAL_TOPIC#UNIQ_KEY`` (else through the real topics' consume queues)."""
    return bool(store.tx_half_topic and store.index_files and store.commitlog_files)


def probed(store) -> bool:
    """Whether indexed mode reads this store's real topics' consume queues (the non-NOT records there are
    transaction records): 3.x files (PREPARED / COMMIT records in their own topics), or no IndexFiles to look
    4.3+ COMMIT records up in."""
    return not uses_index_files(store) or bool(store.statetable_files or store.redolog_files)


def driver_table(fmt: str, opts: SourceOptions) -> pa.Table:
    """Every row of ``fmt`` for ``opts``, read in this process by the data source's reader (small inputs)."""
    reader = StoreReader(fmt, opts)
    schema = SOURCE_TABLES[fmt].arrow_schema()
    return pa.Table.from_batches([b for p in reader.partitions() for b in reader.read(p)], schema=schema)


def extremes_of_units(units: pa.Table) -> List[dict]:
    """One row per (broker, topic, queue_id) of consume-queue units: first / last queue offset, the CommitLog
    offset of the first unit and the end (offset + size) of the last one's record."""
    if units.num_rows == 0:
        return []
    t = units.select(["broker", "topic", "queue_id", "queue_offset", "commitlog_offset", "size"])
    t = t.append_column("p_end", pc.add(t.column("commitlog_offset"), t.column("size").cast(pa.int64())))
    t = t.sort_by([("broker", "ascending"), ("topic", "ascending"), ("queue_id", "ascending"),
                   ("queue_offset", "ascending")])
    agg = t.group_by(["broker", "topic", "queue_id"], use_threads=False).aggregate(
        [("queue_offset", "first"), ("queue_offset", "last"), ("commitlog_offset", "first"),
         ("p_end", "last")])
    return [dict(zip(_EXTREMES, (r["broker"], r["topic"], r["queue_id"], r["queue_offset_first"],
                                 r["queue_offset_last"], r["commitlog_offset_first"], r["p_end_last"]),
                     strict=True))
            for r in agg.to_pylist()]


def anchored_units(units: pa.Table, stores) -> pa.Table:
    """The rows of ``units`` that vouch for a record (``jobs.read.indexed.holes.anchors``): a garbled unit
    neither opens nor closes its queue."""
    t = units.sort_by([("broker", "ascending"), ("topic", "ascending"), ("queue_id", "ascending"),
                       ("queue_offset", "ascending")])
    return t.filter(pa.array(anchors(t, commitlog_ends(stores))))


def extremes_of_frame(units) -> List[dict]:
    """:func:`extremes_of_units` computed by Spark (one aggregation; a row per queue collected)."""
    from pyspark.sql import functions as F

    c = F.col
    rows = units.groupBy("broker", "topic", "queue_id").agg(
        F.min("queue_offset").alias("q_first"), F.max("queue_offset").alias("q_last"),
        F.min_by("commitlog_offset", "queue_offset").alias("p_first"),
        F.max_by(c("commitlog_offset") + c("size"), "queue_offset").alias("p_after_last")).collect()
    return [{k: r[k] for k in _EXTREMES} for r in rows]


def queue_end_extremes(stores, tails: Optional[Dict[str, tuple]] = None) -> Optional[List[dict]]:
    """:func:`extremes_of_units` of ``stores``' transaction queues from each queue's oldest and newest unit alone
    (``consumequeue.first_unit`` / ``last_unit``: a block from the start of its oldest file, a bisection to the
    zero tail of its newest), or None when a store's queues cannot give them: RocksDB consume queues, a queue
    file with no plausible unit at that end, ends out of CommitLog order or past the CommitLog's end.  Queue
    offsets count 20-byte units from the files' names, so a hole in the middle of a queue counts as units (the
    whole read these extremes can choose reads every byte anyway).  ``tails``: filled with each newest file's
    ``last_unit`` (path -> (index, offset, size) or None), for :func:`dispatch_ends`."""
    from txlog_io.consumequeue import CQ_UNIT_DTYPE, first_unit, last_unit
    from txlog_io.errors import TxlogError

    unit = CQ_UNIT_DTYPE.itemsize
    out: List[dict] = []
    for s in stores:
        if s.rocksdb_cq or not s.commitlog_files:
            return None
        end = commitlog_ends([s])[s.broker]
        for topic, qid, head, head_base, tail, tail_base in s.tx_queue_ends:
            try:
                first, last = first_unit(head), last_unit(tail, QUEUE_TAIL_BLOCK)
            except TxlogError:
                return None
            if tails is not None:
                tails[tail] = last
            if first is None or last is None:
                return None
            q_first, q_last = head_base // unit + first[0], tail_base // unit + last[0]
            if q_last < q_first or last[1] < first[1] or last[1] + last[2] > end:
                return None
            out.append(dict(zip(_EXTREMES, (s.broker, topic, qid, q_first, q_last, first[1], last[1] + last[2]),
                                strict=True)))
    return out


#: bytes ``consumequeue.last_unit`` reads per block backwards from a queue file's zero tail (the newest unit
#: is mostly in the first block)
QUEUE_TAIL_BLOCK = 4096


def dispatch_ends(stores, known: Optional[Dict[str, tuple]] = None) -> Dict[str, int]:
    """broker -> the end of the record the newest unit of any of its consume queues indexes (a block read
    backwards per queue; an unreadable file or one without a plausible unit says nothing).  ``known``: queue
    files whose ``last_unit`` was read already (:func:`queue_end_extremes`)."""
    from txlog_io.consumequeue import last_unit_end
    from txlog_io.errors import TxlogError
    from txlog_io.rocksdb_cq import dispatch_end

    out: Dict[str, int] = {}
    for s in stores:
        if getattr(s, "rocksdb_cq", ""):       # a RocksDB database: its newest unit of any queue
            try:
                end = dispatch_end(s.rocksdb_cq)
            except TxlogError:
                end = None
            if end is not None:
                out[s.broker] = max(out.get(s.broker, end), end)
        for path in s.queue_tails:
            if known is not None and path in known:
                last = known[path]
                end = None if last is None else last[1] + last[2]
            else:
                try:
                    end = last_unit_end(path, QUEUE_TAIL_BLOCK)
                except TxlogError:
                    end = None
            if end is not None:
                out[s.broker] = max(out.get(s.broker, end), end)
    return out


def queue_gaps(stores, extremes: List[dict], ends: Dict[str, int], consumed: Dict[tuple, int]) -> List[tuple]:
    """``indexed_gaps.GAPS_SCHEMA`` rows of the indexed ``stores``: DISPATCH_LAG, QUEUE_HEAD_MISSING,
    QUEUE_TAIL_MISSING, QUEUE_IDLE_TAIL, OP_QUEUE_MISSING (see ``store_frames.load_store_frames``).
    ``consumed``:
    (broker, topic, queue_id) -> CID_RMQ_SYS_TRANS's next offset."""
    rows: List[tuple] = []

    def store_gap(broker, queue_dir, start, end, reason, queue, detail):
        if start < end:
            rows.append((broker, int(start), int(end), reason, queue, detail, queue_dir))

    for s in stores:
        clog_start = s.commitlog_files[0][1]
        clog_end = s.commitlog_files[-1][1] + s.commitlog_files[-1][2]
        gap = functools.partial(store_gap, s.broker, os.path.join(s.root, "consumequeue"))
        dispatched = max(ends.get(s.broker, clog_start), clog_start)
        gap(dispatched, clog_end, GAP_TAIL, None, "records after the last one any index points to")
        mine = [q for q in extremes if q["broker"] == s.broker and q["topic"] in TX_SYSTEM_TOPICS]
        for q in mine:
            name = f"{q['topic']}/{q['queue_id']}"
            if q["q_first"] > 0 and q["p_first"] > clog_start:
                gap(clog_start, q["p_first"], GAP_HEAD, name,
                    f"the queue's first unit is queue offset {q['q_first']} at CommitLog offset "
                    f"{q['p_first']}: the units before it are gone while the CommitLog from {clog_start} is "
                    "retained")
            done = consumed.get((s.broker, q["topic"], q["queue_id"]))
            if done is not None and done > q["q_last"] + 1:
                gap(q["p_after_last"], clog_end, GAP_TAIL_UNITS, name,
                    f"{CHECK_GROUP} consumed up to queue offset {done} but the queue's last unit is "
                    f"{q['q_last']}")
            # a queue whose newest units were zeroed reads like an idle one: [its last unit, dispatch
            # point) is scanned, and jobs.read.indexed.tails reports the records of that queue found there
            gap(q["p_after_last"], dispatched, GAP_QUEUE_IDLE_TAIL, name,
                f"the queue's last unit is queue offset {q['q_last']}")
        if s.tx_half_topic and not any(q["topic"] == OP_TOPIC for q in mine):
            gap(clog_start, clog_end, GAP_OP_QUEUE, OP_TOPIC,
                "a half queue but no op queue: the op records (commit / rollback ends) cannot be found by "
                "index")
    return rows


def read_choices(stores, extremes: List[dict], units: Optional[pa.Table] = None,
                 written_past=None) -> Dict[str, dict]:
    """broker -> how indexed mode reads it, from what the plan read already: its transaction queues' units
    (``units``, when the driver read them; else the queues' extremes) and whether its CommitLog holds written
    bytes past a position (``written_past(store, offset)``, default :func:`commitlog_written_past`).

    ``window_bytes``: what one fetch pass over the units' positions reads -- ``decode_at``'s own rule
    (``txlog_io.commitlog_decode``: positions within ``FETCH_WINDOW`` closer than ``FETCH_DENSE_GAP`` on average
    are one window read over their span, others a record each), per CommitLog file; from the extremes alone:
    min(span, units x FETCH_DENSE_GAP).  An indexed read makes ``FETCH_PASSES`` such passes, so when the
    CommitLog holds nothing past its first byte + ``FETCH_PASSES x window_bytes`` (the windows cover at least
    half of what it holds) the store is read whole the full-mode way (``read: "full"``;
    ``jobs.read.indexed.gaps`` scans it as a ``DENSE_TRANSACTIONS`` gap): one pass over every byte instead of
    two over most of them.  That takes one page read (two at a file's end), not the dispatch point of every
    queue (:func:`dispatch_ends`, only needed for the stores read by index).  A store whose transaction
    records end before ``WHOLE_READ_MIN_BYTES`` is always read by index; 3.x statetable / redolog units are
    not counted."""
    written_past = written_past or commitlog_written_past
    out: Dict[str, dict] = {}
    for s in stores:
        mine = [q for q in extremes if q["broker"] == s.broker and q["topic"] in TX_SYSTEM_TOPICS]
        start = s.commitlog_files[0][1]
        n_units, span = units_and_span(mine)
        tx_end = max((int(q["p_after_last"]) for q in mine), default=start)
        if units is not None:
            t = units.filter(pc.equal(units.column("broker"), s.broker))
            n_units = t.num_rows
            offsets = t.column("commitlog_offset").to_numpy()
            sizes = t.column("size").to_numpy().astype(np.int64)
            windows = pass_bytes(offsets, sizes, s.commitlog_files)
            tx_end = int((offsets + sizes).max()) if n_units else start
        else:
            windows = min(max(span, 0), n_units * FETCH_DENSE_GAP)
        covered = start + FETCH_PASSES * int(windows)
        full = (n_units > 0 and tx_end - start >= WHOLE_READ_MIN_BYTES and covered >= tx_end
                and not written_past(s, covered))
        out[s.broker] = {"read": "full" if full else "indexed", "units": n_units, "window_bytes": int(windows),
                         "fetch_passes": FETCH_PASSES, "covered_to": int(covered),
                         "from": "units" if units is not None else "extremes"}
    return out


def units_and_span(extremes: List[dict]) -> Tuple[int, int]:
    """(units, CommitLog span) of one store's transaction-queue extremes (:func:`extremes_of_units` rows): the queue
    offsets they cover, and from the lowest first record to the end of the highest last one (0 for none)."""
    units = sum(int(q["q_last"]) - int(q["q_first"]) + 1 for q in extremes)
    span = (max(int(q["p_after_last"]) for q in extremes) - min(int(q["p_first"]) for q in extremes)) \
        if extremes else 0
    return units, span


#: bytes :func:`commitlog_written_past` reads at its position: a page of a preallocated, zero-filled file
WRITTEN_PROBE_BYTES = 4096


def commitlog_written_past(store, offset: int) -> bool:
    """Whether ``store``'s CommitLog holds written bytes at or after ``offset``: a non-zero byte in the page at
    ``offset``, or in the first bytes of a later file.  CommitLog files are preallocated and zero-filled
    (MappedFile), written in order, and a full file ends with a blank record (its end is zeros), so past the
    last record every file reads zeros; a page of zeros inside a record's body reads as the end (the choice
    then reads the store whole: complete either way).  An unreadable file says it holds nothing."""
    for path, base, size in store.commitlog_files:
        if base + size <= offset:
            continue
        at = max(offset, base) - base
        try:
            with open_input(path) as f:         # a local file or a store in a bucket, as every reader
                data = input_pread(f, WRITTEN_PROBE_BYTES if at > 0 else 8, at)
        except (OSError, TxlogError):
            continue
        readstats.add(len(data), "commitlog")
        if any(data):
            return True
    return False


def pass_bytes(offsets: np.ndarray, sizes: np.ndarray, commitlog_files) -> int:
    """CommitLog bytes one ``decode_at`` pass over the records at ``offsets`` (``sizes`` bytes each) reads:
    its window rule applied per file to the sorted distinct positions (a record longer than a window's
    4 KiB tail is read again by decode_at: not counted)."""
    if offsets.size == 0:
        return 0
    offsets, first = np.unique(offsets.astype(np.int64), return_index=True)
    sizes = sizes[first]
    which = np.searchsorted(np.array([f[1] for f in commitlog_files], np.int64), offsets, "right") - 1
    total = 0
    for k in np.unique(which[which >= 0]).tolist():
        pos, size = offsets[which == k], sizes[which == k]
        end = commitlog_files[k][1] + commitlog_files[k][2]     # a window stops at its file's end
        i, n = 0, pos.size
        while i < n:
            j = max(i + 1, int(np.searchsorted(pos, pos[i] + FETCH_WINDOW, "left")))
            if j - i > 1 and (pos[j - 1] - pos[i]) <= FETCH_DENSE_GAP * (j - i - 1):
                total += max(0, min(int(pos[j - 1] - pos[i]) + FETCH_WINDOW_TAIL, end - int(pos[i])))
            else:       # a record each: its header probe, then the record
                total += int(size[i:j].sum()) + (j - i) * (SYS_FLAG_OFFSET + 4)
            i = j
    return total


@dataclass
class IndexedPlan:
    """What the driver worked out for indexed mode: the queue gaps and, when the transaction queues were read
    here, their units (``units``: CONSUMEQUEUE_SOURCE rows of every store's half / op / discard queues)."""

    gaps: List[tuple]
    units: Optional[pa.Table] = None
    #: the statetable and redolog rows (STATETABLE / REDOLOG_SOURCE) when the driver read them here: their
    #: positions are the 3.x transactions' records (jobs/read/indexed/read.py fetches them on the driver)
    tables: Optional[List[pa.Table]] = None
    #: :func:`read_choices` of the indexed stores (``audit_runs.config_json``'s ``indexed_read``)
    choices: Dict[str, dict] = field(default_factory=dict)

    @property
    def full_read(self) -> frozenset:
        """The brokers read whole the full-mode way (no fetch by position, no gap of their queues)."""
        return frozenset(b for b, c in self.choices.items() if c["read"] == "full")


def plan_indexed(stores, all_stores, opts_for, tx_queues, statetable, redolog,
                 queue_ends: bool = True) -> IndexedPlan:
    """:func:`queue_gaps` of the indexed ``stores``, its inputs read on the driver when small (see the module
    docstring).  ``opts_for(fmt, **extra)``: the SourceOptions of a format for ``all_stores``; the three
    frames are the lazy Spark inputs used when the files are large.  ``queue_ends``: a store dense with
    transaction records may be chosen for the whole read from its queues' ends alone
    (:func:`_whole_from_queue_ends`; the plan then holds no units)."""
    brokers = {s.broker for s in stores}
    units = None
    tails: Dict[str, tuple] = {}
    if queue_ends and not any(s.statetable_files or s.redolog_files for s in stores):
        quick = _whole_from_queue_ends(stores, tails)
        if quick is not None:
            return IndexedPlan([], None, None, quick)
    if sum(s.tx_queue_bytes for s in all_stores) <= DRIVER_READ_BYTES:
        units = driver_table(CONSUMEQUEUE_FORMAT,
                             opts_for(CONSUMEQUEUE_FORMAT, topics=",".join(TX_SYSTEM_TOPICS)))
        mine = units.filter(pc.is_in(units.column("broker"), pa.array(sorted(brokers), pa.string())))
        extremes, holes = extremes_of_units(anchored_units(mine, stores)), queue_holes(mine, stores)
    else:
        from pyspark.sql import functions as F

        mine = tx_queues.where(F.col("broker").isin(*brokers)) if brokers else None
        extremes = extremes_of_frame(anchored_frame(mine, stores).where("anchor")) if brokers else []
        holes = queue_holes_of_frame(mine, stores) if brokers else []
    choices = read_choices(stores, extremes, None if units is None else mine)
    # a store read whole has no queue gaps to scan: every byte of it is
    whole = {b for b, c in choices.items() if c["read"] == "full"}
    ends = dispatch_ends([s for s in stores if s.broker not in whole], tails)
    driver_tables = redolog_units = None
    if any(s.statetable_files or s.redolog_files for s in stores):
        if sum(s.tx_table_bytes for s in stores) <= DRIVER_READ_BYTES:
            tables = driver_tables = [driver_table(fmt, opts_for(fmt)) for fmt in (STATETABLE_FORMAT,
                                                                                   REDOLOG_FORMAT)]
        else:
            tables = [f.select("broker", "index", "commitlog_offset", "size").toArrow()
                      for f in (statetable, redolog)]
        for b, end in tables_end(stores, tables).items():
            if b in brokers:
                ends[b] = max(ends.get(b, end), end)
        redolog_units = tables[1]
    stores = [s for s in stores if s.broker not in whole]
    if not stores:
        return IndexedPlan([], units, driver_tables, choices)
    offsets = driver_table(CONSUMER_OFFSETS_FORMAT, opts_for(CONSUMER_OFFSETS_FORMAT))
    consumed = {(r["broker"], r["topic"], r["queue_id"]): r["offset"] for r in offsets.to_pylist()
                if r["group"] == CHECK_GROUP}
    extremes = [q for q in extremes if q["broker"] not in whole]
    holes = [q for q in holes if q["broker"] not in whole]
    seen = {(q["broker"], q["topic"], q["queue_id"]) for q in [*extremes, *holes]}
    gaps = (queue_gaps(stores, extremes, ends, consumed) + hole_gaps(stores, holes)
            + empty_queue_gaps(stores, seen)
            + checkpoint_gaps(stores, ends) + redolog_gaps(stores, redolog_units, ends))
    return IndexedPlan(gaps, units, driver_tables, choices)


#: queue ends alone choose the whole read only for stores with more transaction-queue units than this ...
QUEUE_ENDS_MIN_UNITS = DRIVER_FETCH_UNITS
#: ... and at most this many CommitLog bytes per unit over the queues' span (a record every few KiB: every
#: fetch window of such a store is dense, ``pass_bytes`` is the span whatever the units say)
QUEUE_ENDS_MAX_GAP = FETCH_DENSE_GAP // 16


def _whole_from_queue_ends(stores, tails: Dict[str, tuple]) -> Optional[Dict[str, dict]]:
    """:func:`read_choices` from :func:`queue_end_extremes` when they choose the whole read for every store and
    every store is dense with transaction records (``QUEUE_ENDS_MIN_UNITS`` units or more, at most
    ``QUEUE_ENDS_MAX_GAP`` bytes per unit), else None.  Then the queues' units are not read to plan at all: a
    store read whole has no queue gaps, holes or positions to fetch, so the units would only have confirmed the
    choice (the whole read reads them once more, with every other consume queue, as full mode does).  Any
    other answer, or none, leaves the choice to the units.  Nothing is read for a store whose queue files
    cannot hold ``QUEUE_ENDS_MIN_UNITS`` units; the newest files' ends read go to ``tails``."""
    from txlog_io.consumequeue import CQ_UNIT_DTYPE

    if not stores or any(s.tx_queue_bytes < QUEUE_ENDS_MIN_UNITS * CQ_UNIT_DTYPE.itemsize for s in stores):
        return None
    extremes = queue_end_extremes(stores, tails)
    if not extremes:
        return None
    for s in stores:        # the unit count and the density first: read_choices probes the CommitLog
        units, span = units_and_span([q for q in extremes if q["broker"] == s.broker])
        if units < QUEUE_ENDS_MIN_UNITS or span > units * QUEUE_ENDS_MAX_GAP:
            return None
    choices = read_choices(stores, extremes)
    if not all(c["read"] == "full" for c in choices.values()):
        return None
    for c in choices.values():
        c["from"] = "queue_ends"
    return choices


def index_units(plan: IndexedPlan, all_stores, opts_for) -> Optional[pa.Table]:
    """(broker, commitlog_offset) of every transaction index unit -- the half / op / discard queues', the 3.x
    statetable's and redolog's -- as the driver read them, or None when they were too large for it."""
    tables = plan.tables
    if tables is None and any(s.statetable_files or s.redolog_files for s in all_stores):
        if sum(s.tx_table_bytes for s in all_stores) > DRIVER_READ_BYTES:
            return None
        tables = [driver_table(fmt, opts_for(fmt)) for fmt in (STATETABLE_FORMAT, REDOLOG_FORMAT)]
    if plan.units is None:
        return None
    key = ["broker", "commitlog_offset"]
    units = pa.concat_tables([t.select(key) for t in [plan.units, *(tables or ())]])
    if plan.full_read:      # those stores are read whole: nothing of theirs is fetched by position
        units = units.filter(pc.invert(pc.is_in(units.column("broker"),
                                                 pa.array(sorted(plan.full_read), pa.string()))))
    return units


def probed_topics(stores, heads) -> Dict[str, set]:
    """broker -> the real topics whose consume queues indexed mode probes, from ``heads`` (broker, topic,
    real_topic, transaction_type) of the records at the transaction index units: a :func:`probed` store's
    non-NOT records' own topics (3.x) and, without IndexFiles, its halves' REAL_TOPIC -- the DataFrame plan's
    ``coalesce(when(half, real_topic), when(type != NOT, topic))`` (``store_frames.indexed_commitlog``)."""
    mine = {s.broker for s in stores if probed(s)}
    keyed = {s.broker for s in stores if uses_index_files(s)}
    out: Dict[str, set] = {}
    for b, topic, real, kind in heads:
        half = topic in (HALF_TOPIC, DISCARD_TOPIC)
        if b not in mine or (half and b in keyed):
            continue
        name = real if half and real is not None else (topic if kind is not None and kind != "NOT" else None)
        if name is not None and name not in TX_SYSTEM_TOPICS:
            out.setdefault(b, set()).add(name)
    return out


def probe_offsets(stores, heads, opts_for) -> Optional[Dict[str, np.ndarray]]:
    """broker -> the sorted, distinct CommitLog offsets of every unit of its :func:`probed_topics`, read here
    by the data source's reader; None when those queue files exceed ``DRIVER_READ_BYTES`` (the DataFrame
    plan's executors then join them)."""
    wanted = probed_topics(stores, heads)
    if not wanted:
        return {}
    reader = StoreReader(CONSUMEQUEUE_FORMAT, opts_for(CONSUMEQUEUE_FORMAT, topics=",".join(
        sorted(set().union(*wanted.values())))))
    reader.brokers = frozenset(wanted)
    parts = reader.partitions()
    if sum(partition_bytes(p) for p in parts) > DRIVER_READ_BYTES:
        return None
    found: Dict[str, list] = {}
    for part in parts:
        for batch in reader.read(part):
            for b in set(batch.column("broker").to_pylist()):
                topics = pa.array(sorted(wanted.get(b, ())), pa.string())
                keep = pc.and_(pc.equal(batch.column("broker"), b), pc.is_in(batch.column("topic"), topics))
                found.setdefault(b, []).append(batch.column("commitlog_offset").filter(keep).to_numpy())
    return {b: np.unique(np.concatenate(parts_of)).astype(np.int64) for b, parts_of in found.items()}


def driver_positions(plan: IndexedPlan, all_stores, opts_for) -> Optional[pa.Table]:
    """(broker, commitlog_offset, only_tx) of every record indexed mode fetches, worked out on the driver --
    or None when that is not small (``store_frames.indexed_commitlog`` then plans with Spark).

    Small means: the transaction index units (queues, 3.x tables) were read here and the queues hold at most
    ``DRIVER_FETCH_UNITS`` units, and the :func:`probed` real topics' queue files at most
    ``DRIVER_READ_BYTES`` with at most ``DRIVER_FETCH_UNITS`` units.  Then the driver reads the index records'
    headers by position (``decode_at``, no bodies), looks the halves' ``REAL_TOPIC#UNIQ_KEY`` up in the
    IndexFiles (the executors' ``IndexLookup``, run here), lists the probed topics' units, and hands the
    executors one flat list of positions to fetch."""
    if plan.units is None or plan.units.num_rows > DRIVER_FETCH_UNITS:
        return None
    index = index_units(plan, all_stores, opts_for)
    if index is None:
        return None
    offsets: Dict[str, set] = {}
    for b, off in zip(*(index.column(c).to_pylist() for c in ("broker", "commitlog_offset")), strict=True):
        offsets.setdefault(b, set()).add(off)
    brokers, found = [], []
    keys: Dict[tuple, int] = {}
    heads: list = []
    for s in all_stores:
        wanted = sorted(offsets.get(s.broker, ()))
        brokers += [s.broker] * len(wanted)
        found += wanted
        keyed = uses_index_files(s)
        for part in _in_threads(lambda chunk, s=s: records_at(s, chunk), _chunks(wanted)):
            for rec in part:
                heads.append((s.broker, rec["topic"], rec["real_topic"], rec["transaction_type"]))
                if keyed and rec["topic"] in (HALF_TOPIC, DISCARD_TOPIC) and rec["uniq_key"] is not None \
                        and rec["real_topic"] is not None:
                    k = (s.broker, rec["real_topic"], rec["uniq_key"])
                    keys[k] = min(keys.get(k, rec["physical_offset"]), rec["physical_offset"])
    probes = probe_offsets(all_stores, heads, opts_for)
    if probes is None or sum(p.size for p in probes.values()) > DRIVER_FETCH_UNITS:
        return None
    only_tx = [False] * len(found)
    for b, probe in probes.items():     # only_tx: a NOT record there is probed, not fetched
        brokers += [b] * probe.size
        found += probe.tolist()
        only_tx += [True] * probe.size
    if keys:        # ONE call: each index file is searched for all its keys at once (lookup_many)
        batch = pa.RecordBatch.from_pylist([{"broker": b, "real_topic": t, "uniq_key": u, "after": a}
                                            for (b, t, u), a in keys.items()])
        for hits in IndexLookup([s for s in all_stores if uses_index_files(s)])(iter([batch])):
            brokers += hits.column("broker").to_pylist()
            found += hits.column("commitlog_offset").to_pylist()
            only_tx += [True] * hits.num_rows
    return pa.table({"broker": pa.array(brokers, pa.string()),
                     "commitlog_offset": pa.array(found, pa.int64()),
                     "only_tx": pa.array(only_tx, pa.bool_())})


def _chunks(items: list) -> List[list]:
    n = max(1, min(DRIVER_IO_THREADS, len(items) // 64))
    size = -(-len(items) // n) if items else 0
    return [items[i:i + size] for i in range(0, len(items), size)] if items else []


def _in_threads(fn, chunks: List[list]) -> list:
    """``fn`` over ``chunks`` in up to DRIVER_IO_THREADS threads, results in order: the driver's positional
    reads are latency-bound on a cold disk (a few ms each), and ``pread`` / the numba kernels release the GIL,
    so many in flight cost what one does."""
    from concurrent.futures import ThreadPoolExecutor

    if len(chunks) <= 1:
        return [fn(c) for c in chunks]
    with ThreadPoolExecutor(max_workers=min(DRIVER_IO_THREADS, len(chunks))) as pool:
        return list(pool.map(fn, chunks))


def records_at(store, offsets: Sequence[int]) -> List[dict]:
    """topic / real_topic / uniq_key / physical_offset / transaction_type of the records at ``offsets``
    (sorted) of one store, header and properties only (``txlog_io.commitlog.decode_at`` per CommitLog
    file)."""
    import bisect

    from txlog_io.commitlog import decode_at

    out: List[dict] = []
    bases = [base for _, base, _ in store.commitlog_files]
    by_file: Dict[int, list] = {}
    for off in offsets:
        i = bisect.bisect_right(bases, off) - 1
        if i >= 0 and off < bases[i] + store.commitlog_files[i][2]:
            by_file.setdefault(i, []).append(off - bases[i])
    for i, positions in by_file.items():
        path, base, _ = store.commitlog_files[i]
        batch, _ = decode_at(path, positions, base_offset=base, with_body=False)
        out += batch.select(["topic", "real_topic", "uniq_key", "physical_offset",
                             "transaction_type"]).to_pylist()
    return out



class IndexLookup:
    """mapInArrow body: (broker, real_topic, uniq_key, after) -> the CommitLog offsets the broker's IndexFiles
    hold for ``real_topic#uniq_key`` past the oldest half copy (``after``): a hash slot and its chain per key
    and index file (positional reads, or the whole file for many keys against a small file); files that end
    before ``after`` are skipped."""

    def __init__(self, stores: Sequence):
        self.files = {s.broker: [(f[0], f[2], f[5], f[6]) for f in s.index_files if f[4] is None]
                      for s in stores}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from txlog_io.indexfile import build_key, index_key_hash, search_files
        from txlog_io.readstats import flush

        try:
            for batch in batches:
                broker, topic, uniq, after = (batch.column(c).to_pylist()
                                              for c in ("broker", "real_topic", "uniq_key", "after"))
                for b in dict.fromkeys(broker):
                    mine = [i for i, x in enumerate(broker) if x == b]
                    hashes = [index_key_hash(build_key(topic[i], uniq[i])) for i in mine]
                    # file by file, every key the file may hold at once (IndexFileReader.lookup_arrays)
                    hits = search_files(self.files.get(b, ()), np.asarray(hashes, np.int64),
                                        np.asarray([after[i] for i in mine], np.int64))
                    if hits.size:
                        yield pa.RecordBatch.from_arrays([pa.array([b] * hits.size, pa.string()),
                                                          pa.array(hits, pa.int64())],
                                                         ["broker", "commitlog_offset"])
        finally:
            flush()


__all__ = ["read_choices", "queue_end_extremes", "pass_bytes", "GAP_DENSE", "FETCH_PASSES", "WHOLE_READ_MIN_BYTES", "IndexLookup", "uses_index_files", "probed", "probed_topics", "probe_offsets", "index_units",
           "plan_indexed", "IndexedPlan", "driver_positions", "records_at", "queue_gaps", "extremes_of_units",
           "extremes_of_frame", "driver_table", "dispatch_ends", "DRIVER_READ_BYTES",
           "DRIVER_FETCH_UNITS", "GAP_TAIL", "GAP_HEAD", "GAP_TAIL_UNITS", "GAP_OP_QUEUE"]
