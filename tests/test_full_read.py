"""jobs/read/full.py (full mode's one-job read, Arrow to the driver) against the DataFrame plan it stands in
for on the driver path (jobs/read/frames.py + jobs/read/inputs.py + jobs/reconstruct/spark.py): the same reducer
inputs and the same five outputs, row for row, over the real-broker fixtures and reference-broker stores of
every scenario and profile (the damaged ones under every profile), all brokers in one read; and the fallback
when the rows are too many for the driver."""
from __future__ import annotations

import pyarrow as pa
import pytest

from refbroker.generate import DEFAULT_START_MS
from refbroker.workload import SCENARIOS

pytestmark = pytest.mark.spark

PROFILES = ("3.x", "4.0-4.2", "4.3-4.5", "4.6-4.9", "5.0", "5.1+")
FIXTURE_STORES = ("rocketmq-3.1.4/store", "rocketmq-4.9.8/store", "rocketmq-5.3.3/store",
                  "rocketmq-4.9.8-dledger/store-crashed")
SPLIT = 256 << 10           # cell boundaries inside the fixtures' 1 MiB CommitLog files
N_BOUNDED = 1200            # the distributed audit's larger broker, well above what one receipt may hold
RECEIPT_BOUND = 100         # rows one driver receipt may hold (per-broker facts, file metadata, counts)


@pytest.fixture(scope="module")
def stores(tmp_path_factory, fixtures_dir):
    """(broker, root) of the fixtures and of 12-transaction reference-broker stores: every scenario, the
    damaging ones under every profile."""
    import refbroker

    base = tmp_path_factory.mktemp("full-read")
    out = [(f"fx-{i}", str(fixtures_dir / rel)) for i, rel in enumerate(FIXTURE_STORES)
           if (fixtures_dir / rel).is_dir()]
    for k, scenario in enumerate(SCENARIOS.values()):
        allowed = scenario.profiles or PROFILES
        # every profile where the store is damaged (findings, resynchronisation), one profile elsewhere
        for profile in allowed if scenario.name in ("crashy", "corrupt") else allowed[k % len(allowed):][:1]:
            name = f"{profile}_{scenario.name}".replace("+", "p")
            sizes = dict(commitlog_file_size=48 * 1024, msg_bytes=256, cq_file_units=256)
            if profile == "3.x" and scenario.name != "legacy-3x":
                sizes.update(statetable_file_size=500 * 24, redolog_file_size=1000 * 20)
            refbroker.generate(profile, scenario.name, transactions=12, seed=11, out_dir=base / name,
                               start_ms=DEFAULT_START_MS, **sizes)
            out.append((name, str(base / name / "store")))
    return out


def _options(stores, split=SPLIT):
    from jobs.read.spec import ReadSpec

    return ReadSpec(stores=tuple(r for _, r in stores), brokers=tuple(b for b, _ in stores), split_bytes=split)


def _frame_inputs(spark, stores, split=SPLIT, mode="full"):
    """The reducer inputs as the DataFrame plan builds them for a non-incremental audit (full mode, or
    indexed: tests/test_indexed_read.py)."""
    from jobs.read.frames import load_store_frames
    from jobs.read.inputs import op_bodies_for, relevant_records

    frames = load_store_frames(spark, [r for _, r in stores], mode=mode, brokers=[b for b, _ in stores],
                               split_bytes=split)
    frames.scan.persist()                               # as the audit does: one CommitLog read
    records = relevant_records(frames).persist()
    inputs = dict(commitlog=records, anomalies=frames.anomalies, statetable=frames.statetable,
                  redolog=frames.redolog, consumer_offsets=frames.consumer_offsets,
                  consumequeue=frames.transaction_queues,
                  op_bodies=op_bodies_for(spark, records, frames, _options(stores, split)))
    return frames, {k: v.persist() for k, v in inputs.items()}


def _rows(table: pa.Table, drop=()) -> list:
    names = [n for n in table.column_names if n not in drop]
    return sorted((tuple(repr(v) for v in r.values()) for r in table.select(names).to_pylist()))


def test_local_read_equals_the_dataframe_plan(spark, stores):
    from jobs.read.full import read_local
    from jobs.reconstruct.local import reduce_local
    from jobs.reconstruct.spark import reconstruct

    timings: dict = {}
    read = read_local(spark, _options(stores), 10 ** 9, timings)
    assert read is not None and {"read.job", "read.arrow"} <= set(timings)
    frames, inputs = _frame_inputs(spark, stores)
    generated = {b for b, _ in stores if not b.startswith("fx-")}
    assert generated <= set(read.commitlog.column("broker").to_pylist())
    for name in ("commitlog", "anomalies", "statetable", "redolog", "consumer_offsets", "consumequeue"):
        mine = getattr(read, name)
        theirs = inputs[name].toArrow()
        if name == "commitlog":             # only the columns the reducer reads are sent to the driver
            theirs = theirs.select(mine.schema.names)
        assert mine.schema.names == theirs.schema.names, name
        assert _rows(mine) == _rows(theirs), name
    assert read.anomalies.num_rows > 0 and read.statetable.num_rows > 0 and read.op_bodies.num_rows > 0
    theirs_ops = inputs["op_bodies"].toArrow()
    mine_ops = read.op_bodies.select(theirs_ops.schema.names)
    mine_ops = mine_ops.set_column(7, "body", mine_ops.column("body").cast(pa.string()))
    assert _rows(mine_ops) == _rows(theirs_ops)

    mine_out = reduce_local(read, frames.layout_info, None, None)
    theirs_out = reconstruct(dict(inputs, layout_info=frames.layout_info), local=True).arrow
    for name, table in theirs_out.items():
        assert _rows(mine_out[name]) == _rows(table), name
    assert mine_out["transactions"].num_rows > 100


def test_too_many_rows_fall_back(spark, stores):
    from jobs.read.full import read_local

    one = stores[-1:]                   # one small store: one CommitLogRange cell, not a group of cells
    read = read_local(spark, _options(one), 10 ** 9)
    assert read is not None and read.commitlog.num_rows > 1
    assert read_local(spark, _options(one), 1) is None       # the transaction queues alone exceed the bound


def test_queue_units_decide_before_any_read(spark, stores, monkeypatch):
    """above_bound: the transaction queues' units (a lower bound of the relevant records) against the bound,
    from a few positional reads; below it the job still gives up when a task's rows exceed the bound."""
    from jobs.read import full
    from jobs.read.estimate import min_relevant_records
    from jobs.sources.formats import store_listing

    broker, root = next((b, r) for b, r in stores if b.startswith("5.1p_"))
    units = min_relevant_records([store_listing(root)])
    assert units > 12                                    # 12 halves plus their op records at least
    read = full.read_local(spark, _options([(broker, root)]), 10 ** 9)
    assert units <= read.commitlog.num_rows              # a lower bound: commit records come on top
    assert full.above_bound(_options([(broker, root)]), units - 1)
    assert not full.above_bound(_options([(broker, root)]), units)
    ran = []
    monkeypatch.setattr(full, "collect_job", lambda *a, **k: ran.append(1))
    assert full.read_local(spark, _options([(broker, root)]), units - 1) is None and not ran
    monkeypatch.undo()
    monkeypatch.setattr(full, "above_bound", lambda spec, max_rows: False)
    assert full.read_local(spark, _options([(broker, root)]), 1) is None   # a task over the bound: count only


def test_audit_falls_back_to_the_dataframe_plan_with_the_same_tables(spark, stores, tmp_path, monkeypatch):
    """run_audit in full mode: the one-job read, and (LOCAL_MAX_ROWS forced to 0) the DataFrame plan with its
    store frames built on demand (store_frames.LazyStoreFrames) and the reduction on the executors."""
    from deltalake import DeltaTable

    from jobs.audit.run import run_audit
    from jobs.main import parse_args
    from jobs.reconstruct import spark as reconstruct

    broker, root = next((b, r) for b, r in stores if b.startswith("5.1p_crashy"))
    tables = {}
    for label in ("local", "fallback"):
        if label == "fallback":
            monkeypatch.setattr(reconstruct, "LOCAL_MAX_ROWS", 0)
        out = tmp_path / label
        _, opts = parse_args(["audit", "--store", root, "--out", str(out), "--as-of", "2030-01-01T00:00:00Z",
                              "--mode", "full", "--run-id", "r1"])
        summary = run_audit(spark, opts, print_summary=False)
        assert ("read.job" in summary.phases) == (label == "local")
        tables[label] = {name: _rows(DeltaTable(t.path).to_pyarrow_table(), drop=("run_id", "run_date"))
                         for name, t in summary.tables.items() if name != "audit_runs"}
    assert tables["local"] == tables["fallback"]
    assert len(tables["local"]["transactions"]) > 5


def test_small_work_items_are_packed_into_few_tasks(spark, stores, monkeypatch):
    """pack_items: consecutive small items share a task (a task costs a fixed 0.1-0.25 s; these stores'
    48 KiB CommitLog files were one task each), an item above the quota keeps its own, the order is kept;
    the read gives the same tables, in the same order, as one task per item."""
    from jobs.read import full as full_read
    from jobs.sources.formats import CommitLogRange, PartitionPack, StoreFiles

    items, _ = full_read.plan_items(_options(stores), 2)
    packed = full_read.pack_items(items, 2)
    flat = [p for g in packed for p in (g.parts if isinstance(g, PartitionPack) else (g,))]
    assert flat == items and len(packed) <= 3 < len(items) // 10, (len(packed), len(items))
    big = [CommitLogRange("b", "f", 0, 0, 100), StoreFiles("b", "/r"), CommitLogRange("b", "g", 0, 0, 10),
           CommitLogRange("b", "g", 0, 10, 20), CommitLogRange("b", "h", 0, 0, 100)]
    assert full_read.pack_items(big, 2, pack_bytes=30) == [big[0], PartitionPack(tuple(big[1:4])), big[4]]
    assert full_read.pack_items(big, 2, pack_bytes=0) == big[:1] + big[1:]

    some = _options(stores[3:9])                 # a fixture and generated stores: six brokers, ~60 items
    packed_read = full_read.read_local(spark, some, 10 ** 9)
    monkeypatch.setattr(full_read, "PACK_BYTES", 0)         # one task per work item
    single_read = full_read.read_local(spark, some, 10 ** 9)
    assert packed_read.commitlog.num_rows > 50 and packed_read.anomalies.num_rows > 0
    for name in ("commitlog", "op_bodies", "anomalies", "scan_findings", "consumequeue", "statetable",
                 "redolog", "consumer_offsets"):
        assert getattr(packed_read, name).equals(getattr(single_read, name)), name


def test_audit_on_the_forced_distributed_path_writes_the_driver_tables(spark, stores, tmp_path, monkeypatch):
    """run_audit with ``reconstruct.path=distributed`` (linking as Spark joins, the rules per partition of
    transactions, the DataFrame plan's read) writes every table the driver path writes, row for row, on a
    damaged store, a real-broker fixture and a 1,200-transaction reference store together; the run records its
    path and reduce task count.  On the distributed run a spy (tests/driver_receipts.py) counts every row that
    reaches the driver's Python (Spark actions, the HTML report's reads of the output tables): no single
    receipt may come near the transaction count (a per-transaction frame collected anywhere fails)."""
    from deltalake import DeltaTable

    import refbroker
    from jobs.audit.run import run_audit
    from jobs.main import parse_args
    from tests import driver_receipts

    big = refbroker.generate("5.1+", "clean", N_BOUNDED, 1, tmp_path / "gen", background_messages=0,
                             msg_bytes=64, commitlog_file_mb=1, start_ms=DEFAULT_START_MS).store_dir
    picked = [s for s in stores if s[0].startswith("5.1p_crashy")] + [s for s in stores if s[0] == "fx-2"]
    picked.append(("big", str(big)))
    tables, paths, receipts = {}, {}, None
    for label in ("driver", "distributed"):
        conf = tmp_path / f"{label}.properties"
        conf.write_text(f"reconstruct.path={label}\n")
        args = ["audit", "--out", str(tmp_path / label), "--as-of", "2030-01-01T00:00:00Z", "--mode", "full",
                "--run-id", "r1", "--conf-file", str(conf)]
        for broker, root in picked:
            args += ["--store", root, "--broker", broker]
        if label == "distributed":
            receipts = driver_receipts.install(monkeypatch, spark, batch_rows=40)
        summary = run_audit(spark, parse_args(args)[1], print_summary=False,
                            on_result=lambda result, _s, lb=label: paths.update({lb: (result.path,
                                                                                      result.reduce_tasks)}))
        tables[label] = {name: _rows(DeltaTable(t.path).to_pyarrow_table(), drop=("run_id", "run_date"))
                         for name, t in summary.tables.items() if name != "audit_runs"}
        monkeypatch.undo()
    assert paths["driver"][0] == "driver"
    assert paths["distributed"][0] == "distributed" and paths["distributed"][1] >= 1
    assert tables["driver"] == tables["distributed"]
    assert len(tables["driver"]["transactions"]) > N_BOUNDED and len(tables["driver"]) >= 5
    assert (tmp_path / "distributed" / "report").is_dir()
    over = [(w, n) for w, n in receipts.seen if n > RECEIPT_BOUND]
    assert not over, f"the driver received per-transaction rows ({N_BOUNDED}-transaction broker): {over}"
    where = {w for w, _ in receipts.seen}       # the spy saw the driver's receipts: file metadata, the report
    assert "DataFrame.collect" in where and "report read_batches" in where, where
    assert sum(n for w, n in receipts.seen if w == "report read_batches") >= N_BOUNDED


READ_TABLES = ("commitlog", "op_bodies", "anomalies", "scan_findings", "consumequeue", "statetable", "redolog",
               "consumer_offsets")


def test_a_small_read_in_the_driver_equals_the_job(spark, stores, monkeypatch):
    """A read up to driver_read_bound runs its tasks in the driver's threads, no Spark job (counted by Spark's
    status store); forced into the job (bound 0) the same tasks give the same tables, row order included."""
    from jobs.bench.sparkjobs import job_mark, jobs_since
    from jobs.read import full

    spec = _options(stores[:8])            # the fixtures and four generated stores
    assert full.driver_read_bound(spark.sparkContext) == full.LOCAL_READ_DRIVER_BYTES
    reads = {}
    for label, bound in (("driver", full.LOCAL_READ_DRIVER_BYTES), ("job", 0)):
        monkeypatch.setattr(full, "LOCAL_READ_DRIVER_BYTES", bound)
        mark = job_mark(spark)
        reads[label] = full.read_local(spark, spec, 10 ** 9)
        assert len(jobs_since(spark, mark)) == (label == "job"), label
        assert reads[label].in_driver == (label == "driver")
    assert reads["driver"].commitlog.num_rows > 100 and reads["driver"].anomalies.num_rows > 0
    for name in READ_TABLES:
        assert getattr(reads["driver"], name).equals(getattr(reads["job"], name)), name
    monkeypatch.setattr(full, "LOCAL_READ_DRIVER_BYTES", 10 ** 12)
    assert full.read_local(spark, spec, 1) is None          # over the rows' bound in the driver too
