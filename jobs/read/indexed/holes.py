"""Indexed mode: transaction records behind a hole in the middle of a transaction queue.

RocketMQ gives a queue's units consecutive queue offsets, in CommitLog order, and deletes a queue's files only
from its head (retention).  A queue offset that has no unit while units before and after it exist is
therefore damage: a consume-queue file missing between two others, a file cut short or zeroed part-way, a unit
torn in the middle of the queue.  The records of the missing units lie between the record of the unit before
the hole and the record of the unit after it; indexed mode, which finds a transaction's records through those
units, would silently miss them (a half without its unit is no transaction at all; its COMMIT found through
the op queue or the IndexFile reads as a transaction without a half).

:func:`queue_holes` (the units read on the driver) and :func:`queue_holes_of_frame` (the same by Spark for
large queues: one window, a row per hole collected) list the holes of every half / op / discard queue;
:func:`hole_gaps` turns them into ``QUEUE_UNITS_MISSING`` gap rows (``jobs.read.indexed.gaps.GAPS_SCHEMA``):
the CommitLog range ``[end of the record before the hole, the record after it)`` is scanned like every other
gap, and the row's ``INDEX_INCOMPLETE`` finding names the queue and the missing queue offsets.  A queue
without a hole gives no row: an undamaged store's plan is unchanged.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS
from txlog_io.consumequeue import CQ_UNIT_SIZE

GAP_QUEUE_HOLE = "QUEUE_UNITS_MISSING"   # queue offsets without a unit between two units of the queue
_HOLE = ("broker", "topic", "queue_id", "q_before", "q_after", "p_before", "p_next")


def anchors(units: pa.Table, clog_end: Optional[Dict[str, int]] = None) -> np.ndarray:
    """Which rows of ``units`` (CONSUMEQUEUE_SOURCE rows sorted by broker, topic, queue_id, queue_offset) can
    vouch for a record: a unit whose record lies in its store's CommitLog (``clog_end``: broker -> end of
    the CommitLog; none given: no upper bound) and in CommitLog order with its neighbours (RocketMQ
    dispatches a queue's units in CommitLog order).  A garbled unit that still decodes (absurd offset or
    size) fails one of these and so does the neighbour it contradicts: their queue offsets read as missing,
    and the CommitLog range between the units around them is scanned.  A unit repeated with the same record
    (a duplicated queue file) is no contradiction."""
    n = units.num_rows
    if n == 0:
        return np.zeros(0, bool)
    p = units.column("commitlog_offset").to_numpy(zero_copy_only=False).astype(np.int64)
    s = units.column("size").to_numpy(zero_copy_only=False).astype(np.int64)
    end = p + s
    ends = np.full(n, np.iinfo(np.int64).max, np.int64)
    brokers = units.column("broker")
    for b, e in (clog_end or {}).items():
        ends[pc.equal(brokers, b).to_numpy(zero_copy_only=False)] = e
    ok = (p >= 0) & (s > 0) & (end <= ends)
    valid = np.flatnonzero(ok)
    if len(valid) < 2:
        return ok
    same = np.ones(len(valid) - 1, bool)           # consecutive sound-looking units of one queue
    for c in ("broker", "topic", "queue_id"):
        col = units.column(c).take(pa.array(valid)).combine_chunks()
        same &= pc.equal(col.slice(1), col.slice(0, len(valid) - 1)).to_numpy(zero_copy_only=False)
    pv, sv, ev = p[valid], s[valid], end[valid]
    repeat = (pv[:-1] == pv[1:]) & (sv[:-1] == sv[1:])
    clash = same & (ev[:-1] > pv[1:]) & ~repeat      # one of the two is garbled: neither vouches for its record
    ok[valid[:-1][clash]] = False
    ok[valid[1:][clash]] = False
    return ok


def queue_holes(units: pa.Table, stores: Sequence = ()) -> List[dict]:
    """The holes of the transaction queues in ``units`` (CONSUMEQUEUE_SOURCE rows): one dict per run of
    queue offsets without a unit that vouches for its record (:func:`anchors`), with the unit before
    (``q_before``, its record's CommitLog offset ``p_before``; None at the head of the queue) and the unit
    after (``q_after``, its record's CommitLog offset ``p_next``; None at the tail), the run's queue offsets
    ``first``..``last``, ``garbled`` the units of the run that were read but vouch for nothing, and
    ``file`` / ``position`` where the run's first unit lies (None without those columns).  A run at the head
    or tail of a queue is a hole only when it holds garbled units (units merely absent there are retention
    or the undispatched tail, which the queue gaps handle).  ``stores`` give the CommitLog's ends."""
    if units.num_rows == 0:
        return []
    t = units.filter(pc.is_in(units.column("topic"), pa.array(TX_SYSTEM_TOPICS, pa.string())))
    has_file = "file" in t.column_names and "file_position" in t.column_names
    t = t.select(["broker", "topic", "queue_id", "queue_offset", "commitlog_offset", "size"]
                 + (["file", "file_position"] if has_file else []))
    t = t.sort_by([("broker", "ascending"), ("topic", "ascending"), ("queue_id", "ascending"),
                   ("queue_offset", "ascending")])
    ok = anchors(t, commitlog_ends(stores))
    cols = {c: t.column(c).to_pylist() for c in t.column_names}

    def unit(i: Optional[int]) -> Optional[tuple]:        # (q, p, end, file, position) of row i
        if i is None:
            return None
        return (cols["queue_offset"][i], cols["commitlog_offset"][i],
                cols["commitlog_offset"][i] + cols["size"][i],
                cols["file"][i] if has_file else None, cols["file_position"][i] if has_file else None)

    out: List[dict] = []
    key, prev, run = None, None, []     # the queue, its last anchor's row, rows read since then (garbled)
    for i in range(t.num_rows + 1):
        k = (cols["broker"][i], cols["topic"][i], cols["queue_id"][i]) if i < t.num_rows else None
        if key is not None and k != key:
            out += make_hole(key, unit(prev), None, _run(run, unit))
        if k != key:
            key, prev, run = k, None, []
        if i == t.num_rows:
            break
        if ok[i]:
            if run or (prev is not None and cols["queue_offset"][i] != cols["queue_offset"][prev] + 1):
                out += make_hole(key, unit(prev), unit(i), _run(run, unit))
            prev, run = i, []
        else:
            run.append(i)
    return out


def _run(rows: List[int], unit) -> Optional[tuple]:
    """(count, first queue offset, last queue offset, file, position of the first) of garbled rows."""
    if not rows:
        return None
    first, last = unit(rows[0]), unit(rows[-1])
    return len(rows), first[0], last[0], first[3], first[4]


def make_hole(key: tuple, before: Optional[tuple], after: Optional[tuple], run: Optional[tuple]) -> List[dict]:
    """The hole (a list of at most one dict, see :func:`queue_holes`) between the anchors ``before`` and
    ``after`` ((q, p, end, file, position); None: the queue's head / tail) with the garbled units ``run``
    ((count, first q, last q, file, position); None: no unit read there)."""
    if (before is None or after is None) and run is None:
        return []
    first = before[0] + 1 if before is not None else run[1]
    last = after[0] - 1 if after is not None else run[2]
    if first > last:
        return []
    if run is not None and run[1] == first:
        file, pos = run[3], run[4]
    elif before is not None:
        file, pos = before[3], None if before[4] is None else before[4] + CQ_UNIT_SIZE * (first - before[0])
    else:
        file, pos = after[3], None if after[4] is None else max(0, after[4] - CQ_UNIT_SIZE * (after[0] - first))
    return [dict(zip(_HOLE, (*key, before[0] if before else None, after[0] if after else None,
                             before[1] if before else None, after[1] if after else None), strict=True),
                 first=first, last=last, garbled=run[0] if run else 0, file=file, position=pos)]


def commitlog_ends(stores: Sequence) -> Dict[str, int]:
    """broker -> the end of its CommitLog (the last file's base + size)."""
    return {s.broker: s.commitlog_files[-1][1] + s.commitlog_files[-1][2] for s in stores if s.commitlog_files}


def _queue_neighbours():
    """``(prev, nxt)``: ``prev(col, flag)`` is ``col`` of the nearest earlier unit of the same queue (by queue
    offset) where ``flag`` holds, ``nxt(col, flag)`` of the nearest later one; Spark window columns."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("broker", "topic", "queue_id").orderBy("queue_offset")
    before, after = w.rowsBetween(Window.unboundedPreceding, -1), w.rowsBetween(1, Window.unboundedFollowing)

    def prev(col, flag):
        return F.last(F.when(flag, F.col(col)), ignorenulls=True).over(before)

    def nxt(col, flag):
        return F.first(F.when(flag, F.col(col)), ignorenulls=True).over(after)

    return prev, nxt


def anchored_frame(units, stores: Sequence = ()):
    """The transaction queues' units of the DataFrame ``units`` with the column ``anchor``: :func:`anchors`
    computed by Spark (windows over each queue), and ``e`` the end of each unit's record."""
    from pyspark.sql import functions as F

    c = F.col
    has_file = "file" in units.columns and "file_position" in units.columns
    ends = commitlog_ends(stores)
    limit = F.lit(None).cast("long")
    for b, e in ends.items():
        limit = F.when(c("broker") == b, F.lit(e)).otherwise(limit)
    u = units.where(c("topic").isin(*TX_SYSTEM_TOPICS)).select(
        "broker", "topic", "queue_id", "queue_offset", "commitlog_offset", c("size").cast("long").alias("size"),
        *((c("file"), c("file_position")) if has_file
          else (F.lit(None).cast("string").alias("file"), F.lit(None).cast("long").alias("file_position"))))
    u = u.withColumn("e", c("commitlog_offset") + c("size"))
    valid = (c("commitlog_offset") >= 0) & (c("size") > 0) & (limit.isNull() | (c("e") <= limit))
    prev, nxt = _queue_neighbours()
    u = u.withColumn("valid", valid).select(
        "*", prev("commitlog_offset", c("valid")).alias("vp_p"), prev("size", c("valid")).alias("vp_s"),
        prev("e", c("valid")).alias("vp_e"), nxt("commitlog_offset", c("valid")).alias("vn_p"),
        nxt("size", c("valid")).alias("vn_s"))

    def dup(p, s):
        return (c(p) == c("commitlog_offset")) & (c(s) == c("size"))

    bad = (((c("vp_e") > c("commitlog_offset")) & ~dup("vp_p", "vp_s"))
           | ((c("e") > c("vn_p")) & ~dup("vn_p", "vn_s")))
    return u.withColumn("anchor", c("valid") & ~F.coalesce(bad, F.lit(False))).drop(
        "valid", "vp_p", "vp_s", "vp_e", "vn_p", "vn_s")


def queue_holes_of_frame(units, stores: Sequence = ()) -> List[dict]:
    """:func:`queue_holes` computed by Spark (:func:`anchored_frame`, then windows over each queue; a row per
    hole and per run of garbled units collected)."""
    from pyspark.sql import functions as F

    c = F.col
    u = anchored_frame(units, stores)
    prev, nxt = _queue_neighbours()
    a = c("anchor")
    u = u.select("broker", "topic", "queue_id", "queue_offset", "commitlog_offset", "e", "file", "file_position",
                 "anchor", *(prev(x, a).alias("b_" + x) for x in ("queue_offset", "commitlog_offset", "e", "file",
                                                                  "file_position")),
                 *(nxt(x, a).alias("a_" + x) for x in ("queue_offset", "commitlog_offset", "e", "file",
                                                       "file_position")))
    around = ["broker", "topic", "queue_id"] + [p + x for p in ("b_", "a_") for x in (
        "queue_offset", "commitlog_offset", "e", "file", "file_position")]
    gaps = u.where(a & (c("queue_offset") > c("b_queue_offset") + 1)).select(
        "broker", "topic", "queue_id", "b_queue_offset", "b_commitlog_offset", "b_e", "b_file", "b_file_position",
        c("queue_offset").alias("a_queue_offset"), c("commitlog_offset").alias("a_commitlog_offset"),
        c("e").alias("a_e"), c("file").alias("a_file"), c("file_position").alias("a_file_position")).collect()
    runs = u.where(~a).groupBy(*around).agg(
        F.count(F.lit(1)).alias("n"), F.min("queue_offset").alias("r_first"), F.max("queue_offset").alias("r_last"),
        F.min_by("file", "queue_offset").alias("r_file"),
        F.min_by("file_position", "queue_offset").alias("r_pos")).collect()

    def anchor_of(r, p):
        q = r[p + "queue_offset"]
        return None if q is None else (q, r[p + "commitlog_offset"], r[p + "e"], r[p + "file"],
                                       r[p + "file_position"])

    found: Dict[tuple, tuple] = {}
    for r in gaps:
        found[(r["broker"], r["topic"], r["queue_id"], r["b_queue_offset"])] = (r, None)
    for r in runs:
        found[(r["broker"], r["topic"], r["queue_id"], r["b_queue_offset"])] = (
            r, (r["n"], r["r_first"], r["r_last"], r["r_file"], r["r_pos"]))
    out: List[dict] = []
    for k, (r, run) in found.items():
        out += make_hole(k[:3], anchor_of(r, "b_"), anchor_of(r, "a_"), run)
    return out


def hole_gaps(stores, holes: Sequence[dict]) -> List[tuple]:
    """``QUEUE_UNITS_MISSING`` gap rows (GAPS_SCHEMA) of ``holes`` for the ``stores`` they belong to: from the
    record of the unit before the hole (the CommitLog's start at the head of the queue) to the record of the
    unit after it (the CommitLog's end at the tail).  The scan starts at the before-unit's record, not at its
    end: the unit's size field can be garbled while its offset still fits the queue's CommitLog order (a
    block of garbage starting inside the unit), and an end computed from it would skip the hole's records."""
    by: Dict[str, object] = {s.broker: s for s in stores}
    rows: List[tuple] = []
    for h in sorted(holes, key=lambda h: (h["broker"], h["topic"], h["queue_id"], h["first"])):
        s = by.get(h["broker"])
        if s is None or not s.commitlog_files:
            continue
        start = h["p_before"] if h["q_before"] is not None else s.commitlog_files[0][1]
        end = h["p_next"] if h["q_after"] is not None else s.commitlog_files[-1][1] + s.commitlog_files[-1][2]
        if not start < end:
            continue
        first, last = h["first"], h["last"]
        offsets = f"queue offset {first}" if first == last else f"queue offsets {first}..{last}"
        verb = "has" if first == last else "have"
        before, after = h["q_before"], h["q_after"]
        around = (f"between units {before} and {after}" if before is not None and after is not None else
                  f"before unit {after}, the queue's first sound unit" if after is not None else
                  f"after unit {before}, the queue's last sound unit" if before is not None else
                  "in the whole queue")
        garbled = (f" ({h['garbled']} unit(s) read there point to no record in CommitLog order: garbled)"
                   if h.get("garbled") else "")
        place = f"; {h['file']} byte {h['position']}" if h.get("file") else ""
        rows.append((h["broker"], int(start), int(end), GAP_QUEUE_HOLE, f"{h['topic']}/{h['queue_id']}",
                     f"{offsets} {verb} no unit {around}{garbled} (a consume-queue "
                     f"file missing, cut, zeroed or garbled){place}",
                     os.path.join(s.root, "consumequeue")))
    return rows


def empty_queue_gaps(stores, seen: set) -> List[tuple]:
    """``QUEUE_UNITS_MISSING`` gap rows (GAPS_SCHEMA) of the transaction queues whose files hold no unit at
    all (every unit zeroed, or rejected as impossible): ``seen`` are the (broker, topic, queue_id) that gave
    a unit, sound or garbled.  RocketMQ creates a queue's file to write a unit into it and never deletes a
    queue's last file, so such a queue lost every unit it had: its records are searched in the whole
    CommitLog."""
    rows: List[tuple] = []
    for s in stores:
        if not s.commitlog_files:
            continue
        for path in s.queue_tails:
            parts = os.path.normpath(path).split(os.sep)
            topic, qid = parts[-3], parts[-2]
            if topic not in TX_SYSTEM_TOPICS or not qid.isdigit() or (s.broker, topic, int(qid)) in seen:
                continue
            rows.append((s.broker, int(s.commitlog_files[0][1]),
                         int(s.commitlog_files[-1][1] + s.commitlog_files[-1][2]), GAP_QUEUE_HOLE,
                         f"{topic}/{qid}", f"the queue's files hold no unit (zeroed or garbled); {path} byte 0",
                         os.path.join(s.root, "consumequeue")))
    return rows


__all__ = ["GAP_QUEUE_HOLE", "anchors", "empty_queue_gaps", "commitlog_ends", "make_hole", "anchored_frame", "queue_holes", "queue_holes_of_frame", "hole_gaps"]
