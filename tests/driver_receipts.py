"""A spy on what reaches the driver's Python during an audit: every row a Spark action returns to it
(``DataFrame.collect`` / ``toArrow`` / ``toPandas`` / ``toLocalIterator`` / ``take`` / ``tail``,
``RDD.collect``) and what the HTML report reads back from the output tables (``read_table`` whole,
``read_batches`` per batch).  ``install(monkeypatch, spark, batch_rows)`` returns the ``Receipts``; a test
asserts that no single receipt comes near the transaction count (tests/test_full_read.py)."""
from __future__ import annotations

import functools

import pyarrow as pa


def _rows(got) -> int:
    if isinstance(got, (pa.Table, pa.RecordBatch)):
        return got.num_rows
    try:
        return len(got)
    except TypeError:
        return 1


class Receipts:
    def __init__(self):
        self.seen = []              # (where, rows)

    def wrap(self, where, fn):
        @functools.wraps(fn)
        def spy(*a, **k):
            got = fn(*a, **k)
            if got is not None:
                self.seen.append((where, _rows(got)))
            return got
        return spy

    def wrap_iter(self, where, fn):
        @functools.wraps(fn)
        def spy(*a, **k):
            got = fn(*a, **k)
            if got is None:
                return None
            return self._each(where, got)
        return spy

    def _each(self, where, it):
        for item in it:
            self.seen.append((where, _rows(item)))
            yield item


def install(monkeypatch, spark, batch_rows: int) -> Receipts:
    """Spy on the driver's receipts for the rest of the test; the report reads ``batch_rows`` rows a batch."""
    from pyspark import RDD

    import jobs.delta.tables as tables
    import jobs.report.data as report_data

    r = Receipts()
    frame_cls = type(spark.range(1))
    for name in ("collect", "toArrow", "toPandas", "take", "tail"):
        monkeypatch.setattr(frame_cls, name, r.wrap(f"DataFrame.{name}", getattr(frame_cls, name)))
    monkeypatch.setattr(frame_cls, "toLocalIterator",
                        r.wrap_iter("DataFrame.toLocalIterator", frame_cls.toLocalIterator))
    monkeypatch.setattr(RDD, "collect", r.wrap("RDD.collect", RDD.collect))
    monkeypatch.setattr(tables, "BATCH_ROWS", batch_rows, raising=False)
    monkeypatch.setattr(report_data, "read_table", r.wrap("report read_table", report_data.read_table))
    monkeypatch.setattr(report_data, "read_batches", r.wrap_iter("report read_batches", report_data.read_batches))
    return r
