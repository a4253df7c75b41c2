"""jobs.delta.sink: executor-written Parquet files, one delta-rs commit per table per run, idempotent by
run_id."""
from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from jobs.delta import sink as delta_sink
from jobs.delta.sink import RUN_DATE, RUN_ID, SinkError, WriteResult, write_table
from schemas.core import Column as C
from schemas.core import Table

pytestmark = pytest.mark.spark

TINY = Table.of("tiny_tx", [
    C("broker", pa.string(), False, "broker name"),
    C("tx_id", pa.string(), False, "transaction id (UNIQ_KEY)"),
    C("commitlog_offset", pa.int64(), False, "CommitLog offset of the half record"),
    C("state", pa.string(), True, "COMMIT, ROLLBACK or UNKNOWN"),
    C("checks", pa.int32(), True, "TRANSACTION_CHECK_TIMES"),
    C("store_time", pa.timestamp("ms"), True, "store time of the half record"),
    C("props", pa.map_(pa.string(), pa.string()), True, "half record properties"),
    C("body", pa.binary(), True, "body bytes"),
], "tiny transaction table for the sink tests")

RUN_DAY = dt.date(2024, 5, 17)


def _rows(n: int, broker: str = "broker-a", start: int = 0):
    t0 = dt.datetime(2024, 5, 17, 12, 0, 0)
    return [(broker, f"TX{i:04d}", 1000 * i, ["COMMIT", "ROLLBACK", None][i % 3], i % 16,
             t0 + dt.timedelta(milliseconds=i), {"PGROUP": "pg", "i": str(i)}, bytes([i % 256]) * 3)
            for i in range(start, start + n)]


def _df(spark, rows, partitions: int = 2):
    return spark.createDataFrame(rows, TINY.spark_schema()).repartition(partitions)


def _read(path) -> pa.Table:
    return DeltaTable(str(path)).to_pyarrow_table()


def _expected(spark, rows, run_id):
    from pyspark.sql import functions as F

    return (spark.createDataFrame(rows, TINY.spark_schema())
            .withColumn(RUN_ID, F.lit(run_id)).withColumn(RUN_DATE, F.lit(RUN_DAY)))


def _as_spark(spark, table: pa.Table):
    # Delta round trip: compare in Spark, columns in the table's order
    cols = TINY.names + [RUN_ID, RUN_DATE]
    return spark.createDataFrame(table.select(cols))


def test_write_and_read_back(spark, tmp_path):
    from pyspark.testing import assertDataFrameEqual

    rows = _rows(25)
    res = write_table(_df(spark, rows), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    assert isinstance(res, WriteResult)
    assert (res.rows, res.version, res.writer) == (25, 0, "delta-rs")
    assert res.files >= 2 and res.seconds > 0
    assert res.path == os.path.join(str(tmp_path), "tiny_tx")
    got = _read(res.path)
    assert got.num_rows == 25
    assert got.schema.field("store_time").type == pa.timestamp("us", tz="UTC")
    assertDataFrameEqual(_as_spark(spark, got), _expected(spark, rows, "run-1"))


def test_one_commit_for_many_files(spark, tmp_path):
    rows = _rows(60, "b1") + _rows(40, "b2")
    res = write_table(_df(spark, rows, partitions=4), tmp_path, TINY, "r", spark=spark, run_date=RUN_DAY)
    t = DeltaTable(res.path)
    assert t.version() == 0                                   # one transaction for all files
    assert len(t.file_uris()) == res.files >= 4
    assert t.metadata().partition_columns == [RUN_DATE, "broker", RUN_ID]
    adds = pa.table(t.get_add_actions(flatten=True)).to_pydict()
    assert sum(adds["num_records"]) == 100
    assert set(adds["partition.broker"]) == {"b1", "b2"}
    # every data file is below its Hive-style partition directory
    for uri in t.file_uris():
        assert "/run_date=2024-05-17/broker=b" in uri and "/run_id=r/" in uri


def test_rerun_same_run_id_replaces(spark, tmp_path):
    write_table(_df(spark, _rows(30)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    again = write_table(_df(spark, _rows(30)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    assert again.version == 1
    got = _read(again.path)
    assert got.num_rows == 30                                  # unchanged, not doubled
    # replacing with different content: only the new content remains for that run
    third = write_table(_df(spark, _rows(5, start=100)), tmp_path, TINY, "run-1", spark=spark,
                        run_date=RUN_DAY)
    got = _read(third.path)
    assert sorted(got.column("tx_id").to_pylist()) == [f"TX{i:04d}" for i in range(100, 105)]


def test_second_run_id_appends(spark, tmp_path):
    write_table(_df(spark, _rows(10)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    res = write_table(_df(spark, _rows(7)), tmp_path, TINY, "run-2", spark=spark,
                      run_date=RUN_DAY + dt.timedelta(days=1))
    got = _read(res.path)
    counts = {}
    for r in got.column(RUN_ID).to_pylist():
        counts[r] = counts.get(r, 0) + 1
    assert counts == {"run-1": 10, "run-2": 7}
    # replacing run-1 leaves run-2 alone
    write_table(_df(spark, _rows(3)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    counts = {}
    for r in _read(res.path).column(RUN_ID).to_pylist():
        counts[r] = counts.get(r, 0) + 1
    assert counts == {"run-1": 3, "run-2": 7}


def test_killed_run_leaves_table_readable_and_next_run_completes(spark, tmp_path):
    first = write_table(_df(spark, _rows(12)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    parts = delta_sink.resolve_partition_by(TINY, None)
    # the executors' half of a run that dies before the driver commits
    orphans = delta_sink._write_data_files(_df(spark, _rows(50, start=500)), first.path, TINY, "run-1", parts,
                                           RUN_DAY)
    assert orphans and all(os.path.exists(os.path.join(first.path, m.path)) for m in orphans)
    t = DeltaTable(first.path)
    assert t.version() == 0 and t.to_pyarrow_table().num_rows == 12
    # same for a killed run with a new run id
    delta_sink._write_data_files(_df(spark, _rows(9)), first.path, TINY, "run-2", parts, RUN_DAY)
    assert DeltaTable(first.path).to_pyarrow_table().num_rows == 12
    # the re-run commits its own files; the orphans stay unreferenced
    again = write_table(_df(spark, _rows(20)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    t = DeltaTable(again.path)
    assert again.version == 1 and t.to_pyarrow_table().num_rows == 20
    referenced = {os.path.normpath(u.replace("file://", "")) for u in t.file_uris()}
    assert not referenced & {os.path.normpath(os.path.join(first.path, m.path)) for m in orphans}


def test_killed_first_run_then_next_run_creates_table(spark, tmp_path):
    root = delta_sink.table_path(tmp_path, TINY)
    parts = delta_sink.resolve_partition_by(TINY, None)
    delta_sink._write_data_files(_df(spark, _rows(4)), root, TINY, "run-1", parts, RUN_DAY)
    assert not DeltaTable.is_deltatable(root)
    res = write_table(_df(spark, _rows(6)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    assert res.version == 0 and _read(root).num_rows == 6


def test_failing_task_leaves_table_unchanged(spark, tmp_path):
    write_table(_df(spark, _rows(8)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    bad = spark.createDataFrame([(None, "TXn", 1, None, None, None, None, None)],
                                TINY.spark_schema().__class__(
                                    [f.__class__(f.name, f.dataType, True, f.metadata)
                                     for f in TINY.spark_schema().fields]))
    with pytest.raises(Exception, match="NOT NULL"):
        write_table(bad, tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    t = DeltaTable(delta_sink.table_path(tmp_path, TINY))
    assert t.version() == 0 and t.to_pyarrow_table().num_rows == 8


def test_protocol_and_comments(spark, tmp_path):
    res = write_table(_df(spark, _rows(3)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    t = DeltaTable(res.path)
    p = t.protocol()
    assert (p.min_reader_version, p.min_writer_version) == (1, 2)
    assert not p.reader_features and not p.writer_features
    conf = t.metadata().configuration
    assert not any(k.startswith(("delta.enableDeletionVectors", "delta.columnMapping")) for k in conf)
    assert t.metadata().name == "tiny_tx"
    assert t.metadata().description == TINY.comment
    schema = json.loads(t.schema().to_json())
    comments = {f["name"]: f["metadata"].get("comment") for f in schema["fields"]}
    for c in TINY.columns:
        assert comments[c.name] == c.comment
    assert comments[RUN_ID] and comments[RUN_DATE]
    nullable = {f["name"]: f["nullable"] for f in schema["fields"]}
    assert nullable["tx_id"] is False and nullable["state"] is True and nullable[RUN_ID] is False
    # the log itself: only the simple protocol action, no table features
    with open(os.path.join(res.path, "_delta_log", "00000000000000000000.json")) as fh:
        actions = [json.loads(line) for line in fh if line.strip()]
    proto = [a["protocol"] for a in actions if "protocol" in a]
    assert proto == [{"minReaderVersion": 1, "minWriterVersion": 2}]
    stats = [json.loads(a["add"]["stats"]) for a in actions if "add" in a]
    assert sum(s["numRecords"] for s in stats) == 3
    assert all("commitlog_offset" in s["minValues"] and "commitlog_offset" in s["maxValues"] for s in stats)


def test_awkward_run_id_and_partition_values(spark, tmp_path):
    run = "run 1/a=b%c'd"
    rows = _rows(4, broker="broker:x/y z")
    res = write_table(_df(spark, rows), tmp_path, TINY, run, spark=spark, run_date=RUN_DAY)
    got = _read(res.path)
    assert set(got.column(RUN_ID).to_pylist()) == {run}
    assert set(got.column("broker").to_pylist()) == {"broker:x/y z"}
    # Spark's own Parquet reader decodes the Hive-style directories to the same partition values
    plain = spark.read.option("basePath", res.path).parquet(res.path).collect()
    assert {(r[RUN_ID], r["broker"], r[RUN_DATE]) for r in plain} == {(run, "broker:x/y z", RUN_DAY)}
    assert len(plain) == 4
    again = write_table(_df(spark, rows), tmp_path, TINY, run, spark=spark, run_date=RUN_DAY)
    assert again.version == 1 and _read(res.path).num_rows == 4


def test_empty_frame(spark, tmp_path):
    empty = spark.createDataFrame([], TINY.spark_schema())
    res = write_table(empty, tmp_path, TINY, "run-0", spark=spark, run_date=RUN_DAY)
    assert (res.rows, res.files, res.version) == (0, 0, 0)
    assert _read(res.path).num_rows == 0
    write_table(_df(spark, _rows(5)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    # a run that now produces nothing removes what it produced before
    res = write_table(empty, tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    assert res.version == 2 and _read(res.path).num_rows == 0


def test_partition_layout_mismatch_and_bad_args(spark, tmp_path):
    write_table(_df(spark, _rows(2)), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY)
    with pytest.raises(SinkError, match="partitioned by"):
        write_table(_df(spark, _rows(2)), tmp_path, TINY, "run-2", ["broker"], spark=spark, run_date=RUN_DAY)
    with pytest.raises(SinkError, match="not a column"):
        delta_sink.resolve_partition_by(TINY, ["nope"])
    with pytest.raises(SinkError, match="unsupported type"):
        delta_sink.resolve_partition_by(TINY, ["props"])
    with pytest.raises(SinkError, match="run_id"):
        write_table(_df(spark, _rows(2)), tmp_path, TINY, "", spark=spark)
    missing = spark.createDataFrame([("b", "t")], "broker string, tx_id string")
    with pytest.raises(SinkError, match="lacks column"):
        write_table(missing, tmp_path, TINY, "run-3", spark=spark)


def test_writer_choice(spark, monkeypatch):
    monkeypatch.delenv("TXAUDIT_DELTA_WRITER", raising=False)
    assert delta_sink.delta_spark_available(spark) is False      # no Delta jars in the test session
    assert delta_sink.choose_writer(spark) == "delta-rs"
    assert delta_sink.choose_writer(spark, "delta-rs") == "delta-rs"
    with pytest.raises(SinkError, match="not on the Spark classpath"):
        delta_sink.choose_writer(spark, "spark")
    with pytest.raises(SinkError, match="unknown Delta writer"):
        delta_sink.choose_writer(spark, "parquet")
    monkeypatch.setenv("TXAUDIT_DELTA_WRITER", "delta-rs")
    assert delta_sink.choose_writer(spark) == "delta-rs"


def test_writer_choice_with_delta_configured(monkeypatch):
    """Auto-selection when the session has the extension and the classes load (JVM faked)."""

    class _Conf:
        def __init__(self, exts):
            self.exts = exts

        def get(self, key, default=None):
            return self.exts if key == "spark.sql.extensions" else default

    class _Class:
        def __init__(self, ok):
            self.ok = ok

        def forName(self, name, init, loader):
            if not self.ok:
                raise RuntimeError("ClassNotFoundException: " + name)

    class _Jvm:
        def __init__(self, ok):
            self.java = type("j", (), {"lang": type("l", (), {
                "Class": _Class(ok),
                "Thread": type("t", (), {"currentThread": staticmethod(
                    lambda: type("ct", (), {"getContextClassLoader": lambda self: None})())}),
            })})

    class _Spark:
        def __init__(self, exts, ok):
            self.conf, self._jvm = _Conf(exts), _Jvm(ok)

    monkeypatch.delenv("TXAUDIT_DELTA_WRITER", raising=False)
    ext = "io.delta.sql.DeltaSparkSessionExtension"
    assert delta_sink.choose_writer(_Spark(ext, True)) == "spark"
    assert delta_sink.choose_writer(_Spark(ext, False)) == "delta-rs"      # configured, jar missing
    assert delta_sink.choose_writer(_Spark("", True)) == "delta-rs"        # jar present, not configured


def test_files_roll_over_and_stats_describe_each_file(spark, tmp_path):
    import pyarrow.parquet as pq

    rows = _rows(50)
    res = write_table(_df(spark, rows, partitions=1), tmp_path, TINY, "run-1", spark=spark, run_date=RUN_DAY,
                      max_rows_per_file=7)
    assert res.files == 8 and res.rows == 50 and res.version == 0
    with open(os.path.join(res.path, "_delta_log", "00000000000000000000.json")) as fh:
        adds = [json.loads(line)["add"] for line in fh if '"add"' in line]
    assert len(adds) == 8
    for a in adds:
        stats = json.loads(a["stats"])
        from urllib.parse import unquote
        data = pq.read_table(os.path.join(res.path, unquote(a["path"])))
        offs = data.column("commitlog_offset").to_pylist()
        assert stats["numRecords"] == data.num_rows == len(offs) <= 7
        assert (stats["minValues"]["commitlog_offset"], stats["maxValues"]["commitlog_offset"]) == (min(offs),
                                                                                                   max(offs))
        assert stats["nullCount"]["state"] == data.column("state").null_count
        assert RUN_ID not in stats["nullCount"]            # partition columns are not in the data files
        assert "props" not in stats["nullCount"]           # nested: no stats


def _arrow(rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(TINY.names, r, strict=True)) for r in rows],
                                schema=TINY.arrow_schema())


def test_arrow_table_written_by_the_driver_same_table_as_the_executors(spark, tmp_path):
    """A pyarrow.Table is written by the driver (no Spark job): same files, partitions, commit and replacement
    semantics as a DataFrame written by the executors; an empty table commits and clears its run."""
    from pyspark.testing import assertDataFrameEqual

    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(None))
    rows = _rows(30, "b1") + _rows(5, "b2")
    res = write_table(_arrow(rows), tmp_path, TINY, "run-a", spark=spark, run_date=RUN_DAY)
    assert len(tracker.getJobIdsForGroup(None)) == jobs_before        # no Spark job ran
    assert (res.rows, res.files, res.version, res.writer) == (35, 2, 0, "delta-rs")   # one file per broker
    got = _read(res.path)
    assertDataFrameEqual(_as_spark(spark, got), _expected(spark, rows, "run-a"))
    dt_ = DeltaTable(res.path)
    assert dt_.metadata().partition_columns == ["run_date", "broker", "run_id"]
    assert dt_.schema().fields[1].metadata.get("comment") == "transaction id (UNIQ_KEY)"
    # another run written by the executors lands in the same table; the Arrow path replaces only its run
    write_table(_df(spark, _rows(7, "b3")), tmp_path, TINY, "run-b", spark=spark, run_date=RUN_DAY)
    res = write_table(_arrow(_rows(3, "b1")), tmp_path, TINY, "run-a", spark=spark, run_date=RUN_DAY)
    got = _read(res.path).to_pydict()
    assert sorted(zip(got[RUN_ID], got["broker"], strict=True)).count(("run-a", "b1")) == 3
    assert sorted(set(zip(got[RUN_ID], got["broker"], strict=True))) == [("run-a", "b1"), ("run-b", "b3")]
    # an empty table: one commit that removes the run's rows
    res = write_table(TINY.arrow_schema().empty_table(), tmp_path, TINY, "run-a", spark=spark,
                      run_date=RUN_DAY)
    assert (res.rows, res.files) == (0, 0)
    assert set(_read(res.path).column(RUN_ID).to_pylist()) == {"run-b"}
    with pytest.raises(SinkError, match="NOT NULL"):
        bad = _arrow(_rows(2)).set_column(1, "tx_id", pa.array([None, "x"], pa.string()))
        write_table(bad, tmp_path, TINY, "run-c", spark=spark, run_date=RUN_DAY)


def test_table_without_a_new_nullable_column_takes_the_new_rows(spark, tmp_path):
    """audit_anomalies written before its ``length`` column existed: the next run's rows (driver and executor
    writers) land next to the old ones, which read ``length`` as null; any other schema change is refused."""
    from schemas.audit import AUDIT_ANOMALIES

    old = Table.of(AUDIT_ANOMALIES.name, [c for c in AUDIT_ANOMALIES.columns if c.name != "length"],
                   AUDIT_ANOMALIES.comment)
    row = {"broker": "b", "code": "RESYNC", "source": "commitlog", "physical_offset": 10, "topic": None,
           "queue_id": None, "queue_offset": None, "transaction_key": None, "file": "f", "position": 10,
           "detail": "d"}
    write_table(pa.Table.from_pylist([row], schema=old.arrow_schema()), tmp_path, old, "old", spark=spark,
                run_date=RUN_DAY)
    new_rows = [dict(row, length=123)]
    write_table(pa.Table.from_pylist(new_rows, schema=AUDIT_ANOMALIES.arrow_schema()), tmp_path,
                AUDIT_ANOMALIES, "new-driver", spark=spark, run_date=RUN_DAY)
    df = spark.createDataFrame(pa.Table.from_pylist(new_rows, schema=AUDIT_ANOMALIES.arrow_schema()).to_pandas(),
                               AUDIT_ANOMALIES.spark_schema())
    write_table(df, tmp_path, AUDIT_ANOMALIES, "new-executors", spark=spark, run_date=RUN_DAY)
    got = {r[RUN_ID]: r["length"] for r in _read(tmp_path / AUDIT_ANOMALIES.name).to_pylist()}
    assert got == {"old": None, "new-driver": 123, "new-executors": 123}
    assert "length" in DeltaTable(str(tmp_path / AUDIT_ANOMALIES.name)).schema().to_arrow().names
    # rewriting the old run id with the old schema would drop a column: refused, table unchanged
    with pytest.raises(SinkError, match="different schema"):
        write_table(pa.Table.from_pylist([row], schema=old.arrow_schema()), tmp_path, old, "old", spark=spark,
                    run_date=RUN_DAY)
    retyped = Table.of(AUDIT_ANOMALIES.name, [C(c.name, pa.int32(), True, c.comment) if c.name == "length"
                                              else c for c in AUDIT_ANOMALIES.columns], AUDIT_ANOMALIES.comment)
    with pytest.raises(SinkError, match="different schema"):
        write_table(pa.Table.from_pylist(new_rows, schema=retyped.arrow_schema()), tmp_path, retyped, "x",
                    spark=spark, run_date=RUN_DAY)
    assert len(_read(tmp_path / AUDIT_ANOMALIES.name)) == 3
