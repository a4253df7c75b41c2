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
from typing import Dict, List, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS

GAP_QUEUE_HOLE = "QUEUE_UNITS_MISSING"   # queue offsets without a unit between two units of the queue
_HOLE = ("broker", "topic", "queue_id", "q_before", "q_after", "p_after_before", "p_next")


def queue_holes(units: pa.Table) -> List[dict]:
    """The holes of the transaction queues in ``units`` (CONSUMEQUEUE_SOURCE rows): one dict per run of
    missing queue offsets, with the unit before (``q_before``, the end of its record ``p_after_before``) and
    the unit after (``q_after``, its record's CommitLog offset ``p_next``)."""
    if units.num_rows == 0:
        return []
    t = units.filter(pc.is_in(units.column("topic"), pa.array(TX_SYSTEM_TOPICS, pa.string())))
    t = t.select(["broker", "topic", "queue_id", "queue_offset", "commitlog_offset", "size"])
    t = t.sort_by([("broker", "ascending"), ("topic", "ascending"), ("queue_id", "ascending"),
                   ("queue_offset", "ascending")])
    cols = {c: t.column(c).to_pylist() for c in t.column_names}
    out: List[dict] = []
    for i in range(1, t.num_rows):
        key = (cols["broker"][i], cols["topic"][i], cols["queue_id"][i])
        if key != (cols["broker"][i - 1], cols["topic"][i - 1], cols["queue_id"][i - 1]):
            continue
        if cols["queue_offset"][i] > cols["queue_offset"][i - 1] + 1:
            out.append(dict(zip(_HOLE, (*key, cols["queue_offset"][i - 1], cols["queue_offset"][i],
                                        cols["commitlog_offset"][i - 1] + cols["size"][i - 1],
                                        cols["commitlog_offset"][i]), strict=False)))
    return out


def queue_holes_of_frame(units) -> List[dict]:
    """:func:`queue_holes` computed by Spark (one window over the transaction queues' units)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    c = F.col
    w = Window.partitionBy("broker", "topic", "queue_id").orderBy("queue_offset")
    rows = (units.where(c("topic").isin(*TX_SYSTEM_TOPICS))
            .select("broker", "topic", "queue_id", c("queue_offset").alias("q_after"),
                    c("commitlog_offset").alias("p_next"),
                    F.lag("queue_offset").over(w).alias("q_before"),
                    F.lag(c("commitlog_offset") + c("size")).over(w).alias("p_after_before"))
            .where(c("q_after") > c("q_before") + 1).collect())
    return [{k: r[k] for k in _HOLE} for r in rows]


def hole_gaps(stores, holes: Sequence[dict]) -> List[tuple]:
    """``QUEUE_UNITS_MISSING`` gap rows (GAPS_SCHEMA) of ``holes`` for the ``stores`` they belong to."""
    roots: Dict[str, str] = {s.broker: s.root for s in stores}
    rows: List[tuple] = []
    for h in sorted(holes, key=lambda h: (h["broker"], h["topic"], h["queue_id"], h["q_before"])):
        root = roots.get(h["broker"])
        if root is None or not h["p_after_before"] < h["p_next"]:
            continue        # units out of CommitLog order say nothing about where the missing ones lie
        first, last = h["q_before"] + 1, h["q_after"] - 1
        offsets = f"queue offset {first}" if first == last else f"queue offsets {first}..{last}"
        verb = "has" if first == last else "have"
        rows.append((h["broker"], int(h["p_after_before"]), int(h["p_next"]), GAP_QUEUE_HOLE,
                     f"{h['topic']}/{h['queue_id']}",
                     f"{offsets} {verb} no unit between units {h['q_before']} and {h['q_after']} (a "
                     "consume-queue file missing, cut or zeroed in the middle of the queue)",
                     os.path.join(root, "consumequeue")))
    return rows


__all__ = ["GAP_QUEUE_HOLE", "queue_holes", "queue_holes_of_frame", "hole_gaps"]
