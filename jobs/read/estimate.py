"""How many transaction-relevant CommitLog records a store holds at least, from its transaction queues alone.

The one-job reads (jobs/read/full.py, jobs/read/indexed/read.py) bring every transaction-relevant row to the
driver and give up when they add up to more than the driver's bound: a store far above it paid a whole read
(and held the rows in the driver) for nothing before the DataFrame plan read it again.  This module answers
the question up front, with a few positional reads per queue:

* every 4.3+ half record has a unit in ``RMQ_SYS_TRANS_HALF_TOPIC``'s consume queue, every op record one in
  ``RMQ_SYS_TRANS_OP_HALF_TOPIC``'s and every discarded half one in ``TRANS_CHECK_MAX_TIME_TOPIC``'s
  (ConsumeQueue.putMessagePositionInfo for each dispatched record of those topics), and each of those records
  is transaction-relevant (a transaction system topic): the units of those queues are a lower bound of the
  rows (commit records and undispatched records come on top);
* a RocksDB consume queue (5.x ``storeType=defaultRocksDB``) is listed as one ``FileInfo`` spanning exactly
  its units (``rocksdb_cq.CQ_UNIT_SIZE`` virtual bytes each): its count is read off the listing;
* a file queue's units: the files before the last are full (``mapedFileSizeConsumeQueue`` / 20 units each, the
  file name being the first unit's byte offset); in the last one the written units are followed by zeros
  (the mapped file is preallocated), so the first all-zero unit is found by bisection -- about 20 reads of
  20 bytes.

A store whose queues were damaged may count wrong here; the count only chooses between two complete read
paths (the driver's one-job read, or the DataFrame plan), never what is read.
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

from txlog_io import readstats
from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS
from txlog_io.consumequeue import CQ_UNIT_SIZE
from txlog_io.rocksdb_cq import CQ_UNIT_SIZE as ROCKSDB_UNIT_SIZE

#: the 4.3+ transaction system topics whose every dispatched record has a consume-queue unit
QUEUE_TOPICS = TX_SYSTEM_TOPICS


def _zero_unit(fd: int, index: int) -> bool:
    data = os.pread(fd, CQ_UNIT_SIZE, index * CQ_UNIT_SIZE)
    readstats.add(len(data), "consumequeue")
    return len(data) < CQ_UNIT_SIZE or not any(data)


def written_units(path: str, size: int) -> int:
    """Units before the first all-zero unit of a consume-queue file (bisection: units are written in order)."""
    lo, hi = 0, size // CQ_UNIT_SIZE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return 0
    try:
        while lo < hi:
            mid = (lo + hi) // 2
            if _zero_unit(fd, mid):
                hi = mid
            else:
                lo = mid + 1
    except OSError:                 # not a readable file (a directory, an I/O error): a lower bound stays one
        return lo
    finally:
        os.close(fd)
    return lo


def queue_units(files: Sequence) -> int:
    """Units of one queue (``FileInfo``s in offset order): full files before the last, its written units."""
    if not files:
        return 0
    first, last = files[0], files[-1]
    if last.rocksdb:                # a RocksDB queue: its FileInfo spans exactly the queue's units
        return sum(f.size // ROCKSDB_UNIT_SIZE for f in files)
    return max(0, (last.base_offset - first.base_offset) // CQ_UNIT_SIZE) + written_units(last.path, last.size)


def min_relevant_records(listings: Iterable) -> int:
    """A lower bound of the transaction-relevant records of the stores (``StoreListing``s)."""
    return sum(queue_units(files) for listing in listings
               for (topic, _qid), files in listing.consume_queues.items() if topic in QUEUE_TOPICS)


__all__ = ["min_relevant_records", "queue_units", "written_units"]
