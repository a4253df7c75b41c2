"""jobs/read/indexed/read.py (indexed mode's one-job read, Arrow to the driver) against the DataFrame plan it
stands in for (jobs/read/frames.py indexed mode + jobs/read/inputs.py + jobs/reconstruct/spark.py): the same
reducer inputs and the same five outputs, row for row, over the real-broker fixtures, reference-broker stores
of every scenario and profile, and a store whose index was damaged each way INDEX_INCOMPLETE reports (deleted,
truncated, lost newest files, crash lag past indexMsgTimestamp, deleted op queue); and its fallbacks."""
from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_full_read import FIXTURE_STORES, _frame_inputs, _options, _rows
from test_indexed_indexfile import _variant, base_store, monkeypatch_module  # noqa: F401

from refbroker.generate import DEFAULT_START_MS

pytestmark = pytest.mark.spark

#: (profile, scenario) of the reference-broker stores compared: damage (crashy / corrupt) under the 4.3+
#: profiles, retention, a check-max storm, an upgrade, and the two kinds read other ways (3.x: its real
#: topics' consume queues probed; 4.0-4.2: no transaction index, its CommitLog scanned)
MATRIX = (("4.3-4.5", "crashy"), ("4.6-4.9", "corrupt"), ("5.0", "retention"), ("5.1+", "crashy"),
          ("5.1+", "corrupt"), ("5.1+", "checkmax-storm"), ("5.1+", "upgrade-4.9-to-5.1"),
          ("4.0-4.2", "crashy"), ("3.x", "crashy"))


@pytest.fixture(scope="module")
def stores(tmp_path_factory, fixtures_dir):
    """(broker, root) of the fixtures and of 12-transaction reference-broker stores (MATRIX)."""
    import refbroker

    base = tmp_path_factory.mktemp("indexed-read")
    out = [(f"fx-{i}", str(fixtures_dir / rel)) for i, rel in enumerate(FIXTURE_STORES)
           if (fixtures_dir / rel).is_dir()]
    for profile, scenario in MATRIX:
        name = f"{profile}_{scenario}".replace("+", "p")
        sizes = dict(commitlog_file_size=48 * 1024, msg_bytes=256, cq_file_units=256)
        if profile == "3.x":
            sizes.update(statetable_file_size=500 * 24, redolog_file_size=1000 * 20)
        refbroker.generate(profile, scenario, transactions=12, seed=11, out_dir=base / name,
                           start_ms=DEFAULT_START_MS, **sizes)
        out.append((name, str(base / name / "store")))
    return out


@pytest.fixture(scope="module")
def damaged(base_store, tmp_path_factory):  # noqa: F811
    """(broker, root) of the many-index-file store: healthy and damaged each way."""
    tmp = tmp_path_factory.mktemp("idx-damaged")

    def delete_middle(root, fs):
        fs[len(fs) // 2].unlink()

    def truncate_one(root, fs):
        os.truncate(fs[1], 3000)

    def lose_newest(root, fs):
        for f in fs[-2:]:
            f.unlink()

    def crash_lag(root, fs):
        fs[-1].unlink()
        (root / "abort").touch()

    def no_op_queue(root, fs):
        shutil.rmtree(root / "consumequeue" / "RMQ_SYS_TRANS_OP_HALF_TOPIC")

    return [(name, _variant(base_store, tmp, name, fn)) for name, fn in (
        ("healthy", lambda r, f: None), ("deleted", delete_middle), ("truncated", truncate_one),
        ("lost", lose_newest), ("lag", crash_lag), ("no-op-queue", no_op_queue))]


def _local(stores):
    """The stores read without probing real topics: IndexFiles and no 3.x files, or no transaction index."""
    from jobs.read.frames import keyed_only
    from jobs.read.stores import has_transaction_index
    from jobs.read.stores import infos as store_infos
    from jobs.sources.options import parse_options

    infos = store_infos(parse_options("rocketmq_commitlog", {"paths": json.dumps([r for _, r in stores]),
                                                        "brokers": ",".join(b for b, _ in stores)}))
    return [pair for pair, i in zip(stores, infos, strict=True)
            if keyed_only(i) or not has_transaction_index(i)]


def test_indexed_read_equals_the_dataframe_plan(spark, stores, damaged, monkeypatch):
    from jobs.read.indexed import plan as indexed_plan
    from jobs.read.indexed import read as indexed_read
    from jobs.read.indexed.read import read_indexed_local
    from jobs.reconstruct.local import reduce_local
    from jobs.reconstruct.spark import reconstruct

    # the damaged stores' queue files are preallocated 6 MB each: over the driver's 32 MB all together, so
    # both plans would locate the queue gaps with Spark (and this read would decline); raised for both
    for module in (indexed_plan, indexed_read):
        monkeypatch.setattr(module, "DRIVER_READ_BYTES", 1 << 30)
    # the DataFrame plan's positions worked out by Spark (index records fetched, real topics' units joined,
    # lookups in mapInArrow), as for stores over DRIVER_FETCH_UNITS: an implementation of its own, where its
    # driver-side positions share the one-job read's code (and are checked against full mode and the truth
    # in tests/test_indexed_indexfile.py and tests/test_reconstruct.py)
    monkeypatch.setattr(indexed_plan, "DRIVER_FETCH_UNITS", 0)

    chosen = stores + damaged
    probed = [b for b, _ in stores if b not in dict(_local(stores))]     # 3.x: real topics probed in the job
    assert len(chosen) > 12 and {"fx-0", "3.x_crashy"} <= set(probed)
    timings: dict = {}
    read = read_indexed_local(spark, _options(chosen), 10 ** 9, timings)
    assert read is not None and {"read.plan", "read.job", "read.arrow"} <= set(timings)
    assert set(probed) <= set(read.commitlog.column("broker").to_pylist())
    frames, inputs = _frame_inputs(spark, chosen, mode="indexed")
    for name in ("commitlog", "anomalies", "statetable", "redolog", "consumer_offsets", "consumequeue"):
        mine = getattr(read, name)
        theirs = inputs[name].toArrow()
        if name == "commitlog":
            theirs = theirs.select(mine.schema.names)
        assert mine.schema.names == theirs.schema.names, name
        assert _rows(mine) == _rows(theirs), name
    theirs_ops = inputs["op_bodies"].toArrow()
    mine_ops = read.op_bodies.select(theirs_ops.schema.names)
    mine_ops = mine_ops.set_column(7, "body", mine_ops.column("body").cast(pa.string()))
    assert read.op_bodies.num_rows > 0 and _rows(mine_ops) == _rows(theirs_ops)

    # every source of incompleteness is reported, naming the range scanned
    incomplete = read.anomalies.filter(pc.equal(read.anomalies.column("kind"), "INDEX_INCOMPLETE"))
    by_broker: dict = {}
    for r in incomplete.to_pylist():
        by_broker.setdefault(r["broker"], []).append(r)
    assert not [r for r in by_broker.get("healthy", []) if r["actual"].startswith("INDEX_")]
    for b in ("deleted", "truncated", "lost", "lag", "no-op-queue"):
        assert any("indexed mode scanned CommitLog [" in r["detail"] for r in by_broker.get(b, [])), b

    mine_out = reduce_local(read, frames.layout_info, None, None)
    theirs_out = reconstruct(dict(inputs, layout_info=frames.layout_info), local=True).arrow
    for name, table in theirs_out.items():
        assert _rows(mine_out[name]) == _rows(table), name
    assert mine_out["transactions"].num_rows > 100


def test_indexed_read_falls_back(spark, damaged, monkeypatch):
    from jobs.read.indexed import read as indexed_read

    one = damaged[:1]
    read = indexed_read.read_indexed_local(spark, _options(one), 10 ** 9)
    assert read is not None and read.commitlog.num_rows > 1
    assert indexed_read.read_indexed_local(spark, _options(one), 1) is None     # too many rows
    # no limit on units below the rows' bound (the lookups run in the job): the old driver-positions limit
    # (DRIVER_FETCH_UNITS, still the DataFrame plan's) does not send this read to the DataFrame plan
    from jobs.read.indexed import plan as indexed_plan

    monkeypatch.setattr(indexed_plan, "DRIVER_FETCH_UNITS", 0)
    again = indexed_read.read_indexed_local(spark, _options(one), 10 ** 9)
    assert again is not None
    for name in ("commitlog", "op_bodies", "anomalies", "consumequeue"):
        assert _rows(getattr(again, name)) == _rows(getattr(read, name)), name


def test_indexed_audit_reads_in_one_job_with_the_fallbacks_tables(spark, damaged, tmp_path, monkeypatch):
    from deltalake import DeltaTable

    from jobs.audit.run import run_audit
    from jobs.main import parse_args
    from jobs.reconstruct import spark as reconstruct

    root = dict(damaged)["deleted"]
    tables = {}
    for label in ("local", "fallback"):
        if label == "fallback":
            monkeypatch.setattr(reconstruct, "LOCAL_MAX_ROWS", 0)
        _, opts = parse_args(["audit", "--store", root, "--out", str(tmp_path / label), "--as-of",
                              "2030-01-01T00:00:00Z", "--mode", "indexed", "--run-id", "r1"])
        summary = run_audit(spark, opts, print_summary=False)
        assert ("read.job" in summary.phases) == (label == "local")
        tables[label] = {name: _rows(DeltaTable(t.path).to_pyarrow_table(), drop=("run_id", "run_date"))
                         for name, t in summary.tables.items() if name != "audit_runs"}
    assert tables["local"] == tables["fallback"]
    assert any("INDEX_INCOMPLETE" in repr(r) for r in tables["local"]["audit_anomalies"])


def test_a_small_indexed_read_in_the_driver_equals_the_job(spark, stores, monkeypatch):
    """The indexed read's groups run in the driver's threads up to full_read.driver_read_bound (no Spark job),
    else as the job's tasks: the same tables, row order included (3.x stores' probes among them)."""
    from test_full_read import READ_TABLES

    from jobs.bench.sparkjobs import job_mark, jobs_since
    from jobs.read import full
    from jobs.read.indexed import read as indexed_read

    reads = {}
    for label, bound in (("driver", full.LOCAL_READ_DRIVER_BYTES), ("job", 0)):
        monkeypatch.setattr(full, "LOCAL_READ_DRIVER_BYTES", bound)
        mark = job_mark(spark)
        reads[label] = indexed_read.read_indexed_local(spark, _options(stores), 10 ** 9)
        assert len(jobs_since(spark, mark)) == (label == "job"), label
        assert reads[label].in_driver == (label == "driver")
    assert reads["driver"].commitlog.num_rows > 100
    for name in READ_TABLES:
        assert getattr(reads["driver"], name).equals(getattr(reads["job"], name)), name
