"""Indexed mode: consume-queue units the checkpoint says were written, past the end of every queue.

RocketMQ sets ``StoreCheckpoint.logicsMsgTimestamp`` to a record's store timestamp when it writes that
record's consume-queue unit into the mapped file (``ConsumeQueue.putMessagePositionInfoWrapper``);
``FlushConsumeQueueService.doFlush`` flushes the queues and then the checkpoint, and 5.x also writes the
checkpoint every second (``DefaultMessageStore``'s scheduled ``storeCheckpoint.flush()``), so on disk it may
run ahead of the units' own flush by up to ``flushIntervalConsumeQueue`` -- lost only if the machine itself
went down, which leaves the ``abort`` file (RocketMQ's abnormal recovery re-dispatches those units).
Dispatch follows CommitLog order.  So when the first record after the dispatch point (the end of the record the newest unit of any
queue indexes) that a consume queue would index -- a NOT or COMMIT record; PREPARED and ROLLBACK records get
no unit (``CommitLogDispatcherBuildConsumeQueue``) -- was stored strictly *before* the checkpoint's
``logicsMsgTimestamp``, a later record's unit was flushed and this one's is gone: every queue lost its newest
units (cut or zeroed consume-queue files), not a dispatch lag.  A store with an ``abort`` file gets no
row: after an unclean shutdown units past the flushed ones are expected to be missing.

:func:`checkpoint_gaps` gives such a store a ``QUEUE_UNITS_PAST_CHECKPOINT`` gap row from the dispatch point
to the CommitLog's end: that range is scanned anyway (``DISPATCH_LAG``), the row adds the
``INDEX_INCOMPLETE`` finding naming the cause.  One record header read per store (a few when
ROLLBACK / PREPARED records follow the dispatch point); a store whose checkpoint cannot be read, or whose
next record is as new as the checkpoint, gets no row.  A wall clock set back while the broker ran could make
an older-looking record follow a newer one; the finding then names a loss that was a clock jump.
"""
from __future__ import annotations

import bisect
import os
from typing import Dict, List, Optional, Tuple

GAP_PAST_CHECKPOINT = "QUEUE_UNITS_PAST_CHECKPOINT"
#: records walked after the dispatch point looking for one a consume queue indexes
MAX_WALK = 64
_DISPATCHED = ("NOT", "COMMIT")


def first_indexed_after(store, offset: int) -> Optional[Tuple[int, int]]:
    """(CommitLog offset, store timestamp) of the first record at or after ``offset`` a consume queue would
    index, walking at most MAX_WALK records (None: none found, or the bytes there are not records)."""
    from txlog_io.commitlog_decode import decode_at

    files = store.commitlog_files
    bases = [base for _, base, _ in files]
    for _ in range(MAX_WALK):
        i = bisect.bisect_right(bases, offset) - 1
        if i < 0 or i >= len(files):
            return None
        path, base, size = files[i]
        if offset >= base + size:
            return None
        batch, _ = decode_at(path, [offset - base], base_offset=base, with_body=False)
        if batch.num_rows == 0:             # a file's BLANK tail, zeros or garbage: try the next file once
            nxt = base + size
            if i + 1 < len(files) and files[i + 1][1] == nxt and offset != nxt:
                offset = nxt
                continue
            return None
        row = batch.select(["physical_offset", "total_size", "store_timestamp", "transaction_type"]).to_pylist()[0]
        if row["transaction_type"] in _DISPATCHED:
            return int(row["physical_offset"]), int(row["store_timestamp"])
        offset = int(row["physical_offset"]) + int(row["total_size"])
    return None


def checkpoint_gaps(stores, ends: Dict[str, int]) -> List[tuple]:
    """``QUEUE_UNITS_PAST_CHECKPOINT`` gap rows (GAPS_SCHEMA) of ``stores``; ``ends``: broker -> dispatch
    point (``jobs.read.indexed.plan.dispatch_ends``)."""
    rows: List[tuple] = []
    for s in stores:
        logics = getattr(s, "checkpoint_logics_ts", 0)
        dispatched = ends.get(s.broker)
        if not logics or dispatched is None or not s.commitlog_files or s.abort_present:
            continue
        clog_end = s.commitlog_files[-1][1] + s.commitlog_files[-1][2]
        hit = first_indexed_after(s, dispatched)
        if hit is None or not hit[1] < logics or not dispatched < clog_end:
            continue
        rows.append((s.broker, int(dispatched), int(clog_end), GAP_PAST_CHECKPOINT, None,
                     f"the checkpoint's logicsMsgTimestamp {logics} is after the store time {hit[1]} of the "
                     f"record at CommitLog offset {hit[0]}, which no consume-queue unit indexes: units written "
                     "before the checkpoint are gone from the end of every queue",
                     os.path.join(s.root, "consumequeue")))
    return rows


__all__ = ["GAP_PAST_CHECKPOINT", "checkpoint_gaps", "first_indexed_after"]
