"""On the distributed reduce path the driver receives nothing in proportion to the broker.

One whole ``audit`` (plan, read, reconstruct, aggregate, Delta writes, ``audit_runs``, the HTML report) of a
reference-broker store of ``N_TX`` transactions with ``reconstruct.path=distributed``, while a spy counts
every row that reaches the driver's Python: what each Spark action returns to it (``DataFrame.collect`` /
``toArrow`` / ``toPandas`` / ``toLocalIterator`` / ``take`` / ``tail``, ``RDD.collect``) and what the report
reads back from the output tables (``read_table`` whole, ``read_batches`` per batch, the batches made small
here).  No single receipt may come near the transaction count: a per-transaction frame collected anywhere
(a work list, the transactions table, the report's read of it) fails the test.
"""
from __future__ import annotations

import functools

import pyarrow as pa
import pytest

N_TX = 1200
BATCH = 40                  # read_batches' rows per batch in this test
BOUND = 100                 # rows one receipt may hold (per-broker facts, file metadata, counts, findings)
AS_OF = "2026-11-22T00:00:00Z"


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


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    from refbroker import generate

    base = tmp_path_factory.mktemp("bounded")
    return generate("5.1+", "clean", N_TX, 1, base / "gen", background_messages=0, msg_bytes=64,
                    commitlog_file_mb=1).store_dir


@pytest.mark.spark
def test_no_per_transaction_frame_reaches_the_driver(spark, store, tmp_path, monkeypatch):
    from pyspark import RDD

    import jobs.delta.tables as tables
    import jobs.report.data as report_data
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    r = Receipts()
    frame_cls = type(spark.range(1))
    for name in ("collect", "toArrow", "toPandas", "take", "tail"):
        monkeypatch.setattr(frame_cls, name, r.wrap(f"DataFrame.{name}", getattr(frame_cls, name)))
    monkeypatch.setattr(frame_cls, "toLocalIterator",
                        r.wrap_iter("DataFrame.toLocalIterator", frame_cls.toLocalIterator))
    monkeypatch.setattr(RDD, "collect", r.wrap("RDD.collect", RDD.collect))
    monkeypatch.setattr(tables, "BATCH_ROWS", BATCH, raising=False)
    monkeypatch.setattr(report_data, "read_table", r.wrap("report read_table", report_data.read_table))
    if hasattr(report_data, "read_batches"):
        monkeypatch.setattr(report_data, "read_batches",
                            r.wrap_iter("report read_batches", report_data.read_batches))

    conf = tmp_path / "distributed.properties"
    conf.write_text("mode=full\nreconstruct.path=distributed\n")
    _, opts = parse_args(["audit", "--store", str(store), "--out", str(tmp_path / "out"), "--as-of", AS_OF,
                          "--conf-file", str(conf), "--mode", "full"])
    got = {}
    summary = run_audit(spark, opts, print_summary=False,
                        on_result=lambda result, _: got.update(path=result.path))

    assert got["path"] == "distributed"
    assert summary.transactions == N_TX
    assert (tmp_path / "out" / "report").is_dir()
    over = [(w, n) for w, n in r.seen if n > BOUND]
    assert not over, f"the driver received per-transaction rows ({N_TX} transactions): {over}"
    # the spy saw the driver's receipts: the sink's file metadata, the report's reads
    where = {w for w, _ in r.seen}
    assert "DataFrame.collect" in where and where & {"report read_batches", "report read_table"}, where
    assert sum(n for w, n in r.seen if w == "report read_batches") >= N_TX
