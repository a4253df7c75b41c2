"""Indexed mode on a 3.x store: the CommitLog ranges the transaction redolog no longer covers.

A 3.x store has no half / op queues: indexed mode finds its transaction records through the statetable and
the redolog units (and the real topics' consume queues, which index COMMIT records but not PREPARED or
ROLLBACK ones).  RocketMQ 3.1.4 appends a redolog unit for every PREPARED, COMMIT and ROLLBACK record it
dispatches (``DefaultMessageStore.DispatchMessageService.doDispatch``: the consume queue unit, then
``TransactionStateService.appendPreparedTransaction`` / ``updateTransactionState`` on the statetable, then
``getTranRedoLog().putMessagePostionInfoWrapper`` -- the redolog is a ``ConsumeQueue`` of topic
``TRANSACTION_REDOLOG_TOPIC_XXXX``, queue 0), one dispatch thread in CommitLog order.  So the redolog units
are in CommitLog order with consecutive unit indexes, and a redolog that lost units (zeroed, cut, a unit
dropped for an impossible value, a file missing or emptied) leaves transaction records no index points to.
The statetable cannot stand in: it holds PREPARED records only, and ``recreateStateTable`` rebuilds it after
an unclean shutdown with the still-PREPARED ones only.

``redolog_gaps`` therefore gives, per 3.x store, the ranges indexed mode scans instead (``GAPS_SCHEMA`` rows):

* ``REDOLOG_UNITS_MISSING``: between two units whose indexes are not consecutive, ``[end of the earlier
  unit's record, the later unit's record)`` -- damage (an ``INDEX_INCOMPLETE`` finding);
* ``REDOLOG_HEAD_MISSING``: before the first unit when it is not unit 0 and the CommitLog starts before its
  record -- damage, as ``QUEUE_HEAD_MISSING`` for a consume queue;
* ``REDOLOG_IDLE_TAIL``: ``[end of the last unit's record, dispatch point)`` (from the CommitLog's start when
  the redolog has no unit at all): a redolog cut at a unit boundary or with its newest units zeroed reads
  exactly like one that is simply shorter, so this range is scanned without a finding of its own (an ordinary
  gap, like ``QUEUE_IDLE_TAIL``; on a healthy store it holds only ordinary records).

Only units that vouch for a record count (:func:`table_anchors`, the consume queues' rule
``jobs.read.indexed.holes.anchors``): a unit's record lies in its store's CommitLog and in CommitLog order
with its neighbours'.  Garbage that still decodes as units (a random block: absurd but positive offsets and
sizes, which the decoder cannot tell from real ones) vouches for nothing, so its unit indexes read as missing
(``REDOLOG_UNITS_MISSING`` between the sound units around it, from the record of the sound unit before it,
whose size may be garbled too; up to the dispatch point when no sound unit follows) and its absurd offsets
neither close a hole nor move the dispatch point (:func:`tables_end`).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.indexed.holes import anchors, commitlog_ends
from txlog_io.mappedfile import REDOLOG_TOPIC

GAP_REDOLOG_HOLE = "REDOLOG_UNITS_MISSING"
GAP_REDOLOG_HEAD = "REDOLOG_HEAD_MISSING"
GAP_REDOLOG_TAIL = "REDOLOG_IDLE_TAIL"
_QUEUE = f"{REDOLOG_TOPIC}/0"


def table_anchors(stores, t: pa.Table) -> np.ndarray:
    """Which rows of a statetable / redolog units table ``t`` (broker, index, commitlog_offset, size; any order)
    vouch for a record: ``jobs.read.indexed.holes.anchors`` over each broker's units in index order (3.1.4
    appends both tables in CommitLog order, one dispatch thread; ``recreateStateTable`` rebuilds the statetable
    in ascending offset order too).  ``stores`` give the CommitLog's ends."""
    if t.num_rows == 0:
        return np.zeros(0, bool)
    order = pc.sort_indices(t, [("broker", "ascending"), ("index", "ascending")])
    s = t.select(["broker", "index", "commitlog_offset", "size"]).take(order)
    view = pa.table({"broker": s.column("broker"), "topic": pa.array([_QUEUE] * s.num_rows, pa.string()),
                     "queue_id": pa.array(np.zeros(s.num_rows, np.int32)),
                     "commitlog_offset": s.column("commitlog_offset"), "size": s.column("size")})
    ok = np.zeros(t.num_rows, bool)
    ok[np.asarray(order)] = anchors(view, commitlog_ends(stores))
    return ok


def tables_end(stores, tables: Sequence[pa.Table]) -> Dict[str, int]:
    """broker -> max(commitlog_offset + size) over the statetable / redolog units that vouch for a record
    (:func:`table_anchors`): the 3.x dispatch point those tables show."""
    out: Dict[str, int] = {}
    for t in tables:
        ok = table_anchors(stores, t)
        for b, off, size, good in zip(t.column("broker").to_pylist(), t.column("commitlog_offset").to_pylist(),
                                      t.column("size").to_pylist(), ok.tolist(), strict=True):
            if good:
                out[b] = max(out.get(b, off + size), off + size)
    return out


def redolog_gaps(stores, redolog: Optional[pa.Table], ends: Dict[str, int]) -> List[tuple]:
    """``GAPS_SCHEMA`` rows of the 3.x ``stores`` (those with statetable or redolog files) from their redolog
    units (``redolog``: broker, index, commitlog_offset, size; None or empty: no unit read) and the dispatch
    points ``ends`` (broker -> CommitLog offset; see the module docstring)."""
    rows: List[tuple] = []
    ok_all = table_anchors(stores, redolog) if redolog is not None else np.zeros(0, bool)
    for s in stores:
        if not (s.statetable_files or s.redolog_files) or not s.commitlog_files:
            continue
        clog_start = s.commitlog_files[0][1]
        qdir = os.path.join(s.root, "transaction", "redolog")

        def gap(start, end, reason, detail, broker=s.broker, qdir=qdir):
            if start < end:
                rows.append((broker, int(start), int(end), reason, _QUEUE, detail, qdir))

        dispatched = max(ends.get(s.broker, clog_start), clog_start)
        if redolog is None or not redolog.num_rows:
            gap(clog_start, dispatched, GAP_REDOLOG_TAIL, "the redolog has no unit")
            continue
        sel = pc.equal(redolog.column("broker"), s.broker)
        mine = redolog.filter(sel)
        if not mine.num_rows:
            gap(clog_start, dispatched, GAP_REDOLOG_TAIL, "the redolog has no unit")
            continue
        ok = ok_all[np.asarray(sel.fill_null(False))]
        every = np.asarray(mine.column("index").cast(pa.int64()))
        garbled = np.sort(every[~ok])
        sound = mine.filter(pa.array(ok)).sort_by([("index", "ascending")])
        if not sound.num_rows:
            gap(clog_start, dispatched, GAP_REDOLOG_HOLE,
                f"none of the redolog's {len(garbled)} unit(s) (units {garbled[0]}..{garbled[-1]}) points to a "
                "record in CommitLog order: garbled")
            continue
        idx = np.asarray(sound.column("index").cast(pa.int64()))
        at = np.asarray(sound.column("commitlog_offset").cast(pa.int64()))
        end = at + np.maximum(np.asarray(sound.column("size").cast(pa.int64())), 1)

        def why(first, last, garbled=garbled):
            n = int(((garbled >= first) & (garbled <= last)).sum())
            return f" ({n} unit(s) read there point to no record in CommitLog order: garbled)" if n else ""

        if idx[0] > 0 and at[0] > clog_start:
            gap(clog_start, at[0], GAP_REDOLOG_HEAD,
                f"the redolog's first unit is unit {idx[0]} at CommitLog offset {at[0]}: the units before it "
                f"are gone while the CommitLog from {clog_start} is retained{why(0, idx[0] - 1)}")
        for k in np.nonzero(np.diff(idx) > 1)[0].tolist():
            gap(at[k] if why(idx[k] + 1, idx[k + 1] - 1) else end[k], at[k + 1], GAP_REDOLOG_HOLE,
                f"redolog units {idx[k] + 1}..{idx[k + 1] - 1} are missing between unit {idx[k]} and unit "
                f"{idx[k + 1]}{why(idx[k] + 1, idx[k + 1] - 1)}")
        if len(garbled) and garbled[-1] > idx[-1]:
            gap(at[-1], max(dispatched, int(end[-1])), GAP_REDOLOG_HOLE,
                f"redolog units after unit {idx[-1]}, the last sound one, are lost{why(idx[-1] + 1, garbled[-1])}")
        else:
            gap(int(end.max()), dispatched, GAP_REDOLOG_TAIL, f"the redolog's last unit is unit {idx[-1]}")
    return rows


__all__ = ["GAP_REDOLOG_HEAD", "GAP_REDOLOG_HOLE", "GAP_REDOLOG_TAIL", "redolog_gaps", "table_anchors",
           "tables_end"]
