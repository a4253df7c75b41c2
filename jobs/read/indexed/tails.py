"""Indexed mode: transaction records hiding behind the end of an idle transaction queue.

A consume queue whose newest units were zeroed or cut at a unit boundary (lost on a crash before their flush,
or damaged later) reads exactly like a shorter, idle queue: no decoder can tell (docs/robustness.md, "What
counts as damage").  The dispatch point (``DISPATCH_LAG``) is the newest unit of *any* queue, so when other
queues kept going, the records whose units were lost lie before it and indexed mode would never reach them.

``jobs.read.indexed.plan.queue_gaps`` therefore adds, per transaction system queue (half / op / discard) whose last
unit lies before the dispatch point, the range ``[after that unit's record, dispatch point)`` as a
``QUEUE_IDLE_TAIL`` gap.  Here those rows are merged into one scan range per broker (the ranges all end at
the same point; scanning each would read their overlap several times), and the scan's records decide the
finding: a record of that very queue found in its range has no unit (RocketMQ writes every dispatched
record's unit, in CommitLog order), so the queue lost its tail: one ``INDEX_INCOMPLETE`` per queue with the
count and the CommitLog range.  An idle queue of a healthy store costs the scan of the range and says
nothing.
"""
from __future__ import annotations

import os
from typing import List, Sequence, Tuple

from txlog_io.errors import AnomalyKind

GAP_QUEUE_IDLE_TAIL = "QUEUE_IDLE_TAIL"   # after a transaction queue's last unit, before the dispatch point


IDLE_DETAIL = ("%s: %s; %d records of this queue at CommitLog offsets %d..%d have no unit (its tail was "
               "lost: zeroed or cut); indexed mode scanned CommitLog [%d, %d) for transaction records")
IDLE_EXPECTED = "a unit for every record of the queue"
IDLE_ACTUAL = "%d records without a unit"


def split_idle_tails(gap_rows: Sequence[tuple]) -> Tuple[List[tuple], List[tuple]]:
    """(gap rows to scan, the per-queue idle-tail rows): idle tails merged into one row per broker."""
    idle = [r for r in gap_rows if r[3] == GAP_QUEUE_IDLE_TAIL]
    rows = [r for r in gap_rows if r[3] != GAP_QUEUE_IDLE_TAIL]
    merged = {}
    for broker, start, end, _reason, _queue, _detail, queue_dir in idle:
        lo, hi, _ = merged.get(broker, (start, end, queue_dir))
        merged[broker] = (min(lo, start), max(hi, end), queue_dir)
    rows += [(b, lo, hi, GAP_QUEUE_IDLE_TAIL, None, "after the last unit of an idle transaction queue", qd)
             for b, (lo, hi, qd) in sorted(merged.items())]
    return rows, idle


def only_queue_records(scanned, gap_rows: Sequence[tuple], topics: Sequence[str], unlisted=()):
    """``scanned`` without the records only an idle-tail range reached that are not of ``topics`` (the
    transaction system topics): the range is scanned for the lost units' records, and anything else there
    (e.g. COMMIT-typed consumer-retry copies, which indexed mode does not promise) is left out as before.
    Ranges of the other gaps in ``gap_rows`` keep everything (``unlisted`` reasons excepted)."""
    from pyspark.sql import functions as F

    c = F.col
    inside = None
    for broker, pieces in idle_ranges(gap_rows, unlisted).items():
        for a, z in pieces:
            cond = (c("broker") == broker) & (c("physical_offset") >= a) & (c("physical_offset") < z)
            inside = cond if inside is None else inside | cond
    # rows without a CommitLog offset (a scan's finding rows) are not records: always kept
    return scanned if inside is None else scanned.where(F.coalesce(~inside, F.lit(True))
                                                       | c("topic").isin(*topics))


def idle_tail_findings(spark, scanned, idle: Sequence[tuple]):
    """One INDEX_INCOMPLETE row (broker + ANOMALIES columns) per idle queue whose range holds records of that
    queue: units the queue has lost.  ``scanned``: the gap scan's commitlog rows."""
    from pyspark.sql import functions as F

    c = F.col
    ranges = spark.createDataFrame(
        [(b, q.rsplit("/", 1)[0], int(q.rsplit("/", 1)[1]), start, end, detail, os.path.join(qd, q))
         for b, start, end, _r, q, detail, qd in idle],
        "broker string, topic string, queue_id int, g_start bigint, g_end bigint, g_detail string, "
        "g_file string")
    hits = scanned.select("broker", "topic", "queue_id", "physical_offset").join(
        F.broadcast(ranges), ["broker", "topic", "queue_id"]).where(
        (c("physical_offset") >= c("g_start")) & (c("physical_offset") < c("g_end")))
    per_queue = hits.groupBy("broker", "g_file", "g_start", "g_end", "g_detail").agg(
        F.count(F.lit(1)).alias("n"), F.min("physical_offset").alias("first"),
        F.max("physical_offset").alias("last"))
    return per_queue.select(
        "broker", F.lit(AnomalyKind.INDEX_INCOMPLETE).alias("kind"), c("g_file").alias("file"),
        F.lit(0).cast("long").alias("position"),
        F.format_string(IDLE_DETAIL, F.lit(GAP_QUEUE_IDLE_TAIL), "g_detail", "n", "first", "last", "g_start",
                        "g_end").alias("detail"),
        F.lit(IDLE_EXPECTED).alias("expected"),
        F.format_string(IDLE_ACTUAL, "n").alias("actual"), F.lit("index").alias("source"),
        c("first").alias("physical_offset"), F.lit(None).cast("long").alias("length"),
        F.lit(None).cast("long").alias("data_end"))


def idle_tail_anomalies(records, idle: Sequence[tuple]) -> list:
    """:func:`idle_tail_findings` on the driver: (broker, Anomaly) per idle queue whose range holds records of
    that queue.  ``records``: (broker, topic, queue_id, physical_offset) tuples of the scanned records."""
    from txlog_io.errors import Anomaly

    out = []
    for b, start, end, _r, q, detail, qd in idle:
        topic, qid = q.rsplit("/", 1)[0], int(q.rsplit("/", 1)[1])
        hits = [off for rb, t, i, off in records
                if rb == b and t == topic and i == qid and start <= off < end]
        if hits:
            out.append((b, Anomaly(AnomalyKind.INDEX_INCOMPLETE, os.path.join(qd, q), 0,
                                   IDLE_DETAIL % (GAP_QUEUE_IDLE_TAIL, detail, len(hits), min(hits),
                                                  max(hits), start, end),
                                   IDLE_EXPECTED, IDLE_ACTUAL % len(hits), "index", min(hits))))
    return out


def idle_ranges(gap_rows: Sequence[tuple], unlisted=()) -> dict:
    """broker -> the (lo, hi) pieces of its idle-tail ranges no other gap of ``gap_rows`` covers (the ranges
    where :func:`only_queue_records` keeps only the transaction system topics' records)."""
    others = [(r[0], r[1], r[2]) for r in gap_rows if r[3] != GAP_QUEUE_IDLE_TAIL and r[3] not in unlisted]
    out: dict = {}
    for broker, lo, hi, reason, *_ in gap_rows:
        if reason != GAP_QUEUE_IDLE_TAIL:
            continue
        pieces = [(lo, hi)]
        for other, o_lo, o_hi in others:
            if other == broker:
                pieces = [p for a, z in pieces for p in ((a, min(z, o_lo)), (max(a, o_hi), z)) if p[0] < p[1]]
        out.setdefault(broker, []).extend(pieces)
    return out


__all__ = ["GAP_QUEUE_IDLE_TAIL", "split_idle_tails", "only_queue_records", "idle_tail_findings",
           "idle_tail_anomalies", "idle_ranges"]
