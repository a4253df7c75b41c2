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


def test_read_batches_streams_the_rows_and_names_a_missing_file(tmp_path):
    """Spark-free: ``read_batches`` gives read_table's rows in batches of at most ``batch_rows``; a data file
    gone is a one-line DeltaReadError naming the table."""
    from deltalake import write_deltalake

    from jobs.delta.tables import DeltaReadError, read_batches, read_table

    path = str(tmp_path / "t")
    t = pa.table({"run_id": ["a"] * 250 + ["b"] * 50, "n": list(range(300))})
    write_deltalake(path, t, partition_by=["run_id"])
    got = list(read_batches(path, columns=["n"], run_id="a", batch_rows=64))
    assert max(b.num_rows for b in got) <= 64
    assert pa.Table.from_batches(got).equals(read_table(path, columns=["n"], run_id="a"))
    assert read_batches(str(tmp_path / "none")) is None
    for f in (tmp_path / "t").glob("run_id=a/*.parquet"):
        f.unlink()
    with pytest.raises(DeltaReadError, match=r"^tx: cannot read .*: "):
        list(read_batches(path, what="tx", run_id="a"))


def test_fold_equals_the_whole_table_figures():
    """Spark-free: the batch fold's counts, urgent rows and chart inputs equal those computed over the whole
    table at once, whatever the batch size."""
    import numpy as np

    from jobs.report.txstats import TX_COLUMNS, fold, urgency

    rng = np.random.default_rng(5)
    n, as_of = 700, 10_000_000
    state = rng.choice(["COMMITTED", "PREPARED", "ROLLED_BACK"], n)
    deadline = [None if rng.random() < 0.2 else int(x) for x in rng.integers(as_of - 10**6, as_of + 10**6, n)]
    t = pa.table({
        "broker": rng.choice(["b1", "b2"], n).tolist(), "transaction_key": [f"k{i:04d}" for i in range(n)],
        "uniq_key": [f"u{i}" for i in range(n)], "keys": [None] * n,
        "producer_group": [None if rng.random() < 0.1 else f"g{rng.integers(3)}" for _ in range(n)],
        "real_topic": [f"t{rng.integers(2)}" for _ in range(n)], "state": state.tolist(),
        "age_ms": rng.integers(0, 50, n).tolist(), "deadline_ms": pa.array(deadline, pa.int64()),
        "check_times": pa.array([None if rng.random() < 0.3 else int(rng.integers(4)) for _ in range(n)],
                                pa.int64()),
        "newest_copy_commitlog_offset": list(range(n)),
        "flags": [[] if rng.random() < 0.5 else list(rng.choice(["F1", "F2"], rng.integers(1, 3)))
                  for _ in range(n)]}).select(TX_COLUMNS)
    whole = t.to_pandas()
    prepared = urgency(whole[whole["state"] == "PREPARED"], as_of)
    for rows in (7, 64, n):
        got = fold(t.to_batches(max_chunksize=rows), ["b1", "b2"], as_of, 25)
        assert got.rows == n
        assert got.states.loc["b1"].sum() + got.states.loc["b2"].sum() == n
        assert got.states.at["b2", "PREPARED"] == int(((whole.broker == "b2") & (whole.state == "PREPARED")).sum())
        assert dict(got.flag_counts) == whole["flags"].explode().dropna().value_counts().to_dict()
        assert got.urgent["transaction_key"].tolist() == prepared["transaction_key"].head(25).tolist()
        for c in ("age_ms", "to_deadline_ms"):      # the charts' order (ties differ in broker or key only)
            assert np.array_equal(got.prepared[c].to_numpy(float), prepared[c].to_numpy(float), equal_nan=True)
        assert got.prepared["check_times"].fillna(-1).value_counts().to_dict() == \
            prepared["check_times"].fillna(-1).value_counts().to_dict()
        pg = whole.assign(producer_group=whole["producer_group"].fillna("(none)"))
        assert got.group_topic["transactions"].sum() == n
        assert got.group_topic.set_index(["producer_group", "real_topic"])["transactions"].to_dict() == \
            pg.groupby(["producer_group", "real_topic"]).size().to_dict()
