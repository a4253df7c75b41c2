"""The driver's bounded reads of the output tables, Spark-free: ``read_batches`` streams a table in batches and
the report's fold of them gives the whole-table figures.  That no per-transaction frame reaches the driver
on the distributed path is checked by a spy on a whole audit in tests/test_full_read.py."""
from __future__ import annotations

import pyarrow as pa
import pytest


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
