"""Indexed mode reads a store whose records are mostly transactional whole, the full-mode way
(``jobs.read.indexed.plan.read_choices``): its fetch windows would cover the CommitLog twice.  The choice is
recorded in ``audit_runs.config_json`` (``indexed_read``) and the CommitLog bytes read stay within one pass;
a store with few transactions is still read by index."""
from __future__ import annotations

import json
import os

import pytest

import jobs.bench.audit as B
import refbroker
from jobs.read.indexed import plan as indexed_plan
from txlog_io import readstats
from txlog_io.commitlog_layout import OP_TOPIC

pytestmark = pytest.mark.spark

AS_OF = "2030-01-01T00:00:00Z"


def _store(base, name: str, transactions: int, background: int) -> str:
    # 1 MiB CommitLog files and small queue files, as tests/test_readstats.py: several files, little padding
    res = refbroker.generate("5.1+", "clean", transactions, 11, base / name, background_messages=background,
                             msg_bytes=256, commitlog_file_mb=1, cq_file_units=2000)
    return str(res.store_dir)


def _commitlog_bytes(root: str) -> int:
    d = os.path.join(root, "commitlog")
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))


def _audit(spark, root: str, out, mode: str, stats: str):
    """(transaction key -> state, config_json, CommitLog bytes read) of one audit through jobs.audit.run."""
    from jobs.delta.tables import read_table

    before = B.read_kinds(stats).get("commitlog", 0)
    _, summary = B.timed_audit(spark, root, out, mode)
    read = B.read_kinds(stats).get("commitlog", 0) - before
    runs = read_table(summary.tables["audit_runs"].path, run_id=summary.run_id).to_pylist()
    tx = read_table(summary.tables["transactions"].path, run_id=summary.run_id).to_pylist()
    return {t["transaction_key"]: t["state"] for t in tx}, json.loads(runs[-1]["config_json"]), read


def test_mostly_transactional_store_is_read_whole_and_a_sparse_one_by_index(spark, tmp_path, monkeypatch):
    monkeypatch.setattr(indexed_plan, "WHOLE_READ_MIN_BYTES", 0)     # small stores: the byte rule alone
    dense = _store(tmp_path, "dense", 60, 0)
    sparse = _store(tmp_path, "sparse", 6, 8000)
    stats = B.read_stats_dir(spark, tmp_path / "stats")
    assert stats is not None
    try:
        full_states, full_doc, full_read = _audit(spark, dense, tmp_path / "out-full", "full", stats)
        states, doc, read = _audit(spark, dense, tmp_path / "out-indexed", "indexed", stats)
        _, sparse_doc, sparse_read = _audit(spark, sparse, tmp_path / "out-sparse", "indexed", stats)
    finally:
        os.environ.pop(readstats.ENV, None)
        spark.sparkContext.environment.pop(readstats.ENV, None)
    assert "indexed_read" not in full_doc
    (choice,) = doc["indexed_read"].values()
    assert choice["read"] == "full" and choice["covered_to"] == choice["fetch_passes"] * choice["window_bytes"]
    assert not indexed_plan.commitlog_written_past(_info(dense), choice["covered_to"])
    assert len(states) == 60 and states == full_states
    # one pass: no more CommitLog bytes than full mode reads (but the page past the last record that says
    # nothing more is written), nor than the files hold
    assert 0 < read <= min(full_read + indexed_plan.WRITTEN_PROBE_BYTES, _commitlog_bytes(dense)), (read, full_read)
    (sparse_choice,) = sparse_doc["indexed_read"].values()
    assert sparse_choice["read"] == "indexed" and sparse_choice["units"] > 0
    assert 0 < sparse_read < _commitlog_bytes(sparse) / 2, sparse_read


def test_the_dataframe_plan_reads_a_dense_store_whole_with_the_op_bodies_from_the_scan(spark, tmp_path,
                                                                                     monkeypatch):
    """The DataFrame plan: the store read whole is one gap scan, no fetch by position, and the op records'
    bodies come from that scan; the reconstruction equals full mode's."""
    from test_full_read import _frame_inputs

    from jobs.reconstruct.spark import reconstruct

    monkeypatch.setattr(indexed_plan, "WHOLE_READ_MIN_BYTES", 0)
    stores = [("b", _store(tmp_path, "dense", 40, 0))]
    states = {}
    for mode in ("full", "indexed"):
        if mode == "indexed":
            def no_fetch(*args, **kwargs):
                raise AssertionError("records fetched by position")

            monkeypatch.setattr("jobs.read.frames.fetch_records", no_fetch)
        frames, inputs = _frame_inputs(spark, stores, mode=mode)
        if mode == "indexed":
            assert frames.read_choices["b"]["read"] == "full" and frames.op_bodies is not None
            assert inputs["commitlog"].where("body is not null").count() == 0
            n_ops = inputs["commitlog"].where(f"topic = '{OP_TOPIC}'").count()
            assert n_ops > 0 and inputs["op_bodies"].where("body is not null").count() == n_ops
        tx = reconstruct(dict(inputs, layout_info=frames.layout_info), local=True).arrow["transactions"]
        states[mode] = {t["transaction_key"]: t["state"] for t in tx.to_pylist()}
    assert len(states["full"]) == 40 and states["indexed"] == states["full"]
    assert "ROLLED_BACK" in states["full"].values()       # the op bodies were read: rollbacks are seen


@pytest.mark.parametrize("every", [1, 3, 400])
def test_pass_bytes_is_what_decode_at_reads(fixtures_dir, tmp_path, monkeypatch, every):
    """The plan's estimate of a fetch pass is ``decode_at``'s own window rule: on every ``every``-th record of
    a real broker's CommitLog file (windows at 1 and 3, a record each at 400) it equals the bytes decode_at
    reads."""
    import numpy as np

    from txlog_io.commitlog import decode_at, decode_file

    path = str(fixtures_dir / "rocketmq-4.9.8" / "store" / "commitlog" / "00000000000000000000")
    batches = [b for b, _ in decode_file(path)]
    offsets = np.concatenate([b.column("physical_offset").to_numpy() for b in batches])[:-1:every]
    sizes = np.concatenate([b.column("total_size").to_numpy() for b in batches])[:-1:every].astype(np.int64)
    monkeypatch.setenv(readstats.ENV, str(tmp_path / "stats"))
    t0 = readstats.process_total()
    batch, _ = decode_at(path, offsets.tolist(), base_offset=0)
    read = readstats.process_total() - t0
    assert batch.num_rows == offsets.size >= 2
    assert indexed_plan.pass_bytes(offsets, sizes, [(path, 0, os.path.getsize(path))]) == read


def _info(root: str):
    from jobs.read.stores import store_info

    return store_info("b", root, None)


@pytest.mark.parametrize("chosen_from", ["units", "queue_ends"])
def test_a_store_read_whole_costs_full_modes_bytes_and_one_probe(spark, tmp_path, monkeypatch, chosen_from):
    """Every file kind together, on the DataFrame plan (a store above the driver's bound): indexed mode's read
    of a mostly transactional store is full mode's read plus the one page ``commitlog_written_past`` reads
    past its last record -- its transaction queues' units are read once (on the driver, handed to Spark; or,
    with more units than the driver hands over, chosen from the queues' ends and read by Spark alone), and no
    queue's dispatch point, consumer offset or checkpoint is looked up for it."""
    import jobs.reconstruct.spark as recon_spark

    monkeypatch.setattr(indexed_plan, "WHOLE_READ_MIN_BYTES", 0)
    monkeypatch.setattr(recon_spark, "LOCAL_MAX_ROWS", 0)       # no one-job read: the DataFrame plan
    if chosen_from == "queue_ends":     # as a store with more units than DRIVER_FETCH_UNITS
        monkeypatch.setattr(indexed_plan, "QUEUE_ENDS_MIN_UNITS", 1)
        monkeypatch.setattr(indexed_plan, "DRIVER_FETCH_UNITS", 0)
    dense = _store(tmp_path, "dense", 60, 0)
    stats = B.read_stats_dir(spark, tmp_path / "stats")
    assert stats is not None
    read, states = {}, {}
    try:
        for mode in ("full", "indexed"):
            before = B.read_kinds(stats)
            states[mode], doc, _ = _audit(spark, dense, tmp_path / f"out-{mode}", mode, stats)
            after = B.read_kinds(stats)
            read[mode] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    finally:
        os.environ.pop(readstats.ENV, None)
        spark.sparkContext.environment.pop(readstats.ENV, None)
    assert states["indexed"] == states["full"] and len(states["full"]) == 60
    assert doc["indexed_read"]["dense"]["read"] == "full"
    assert doc["indexed_read"]["dense"]["from"] == chosen_from
    assert read["full"]["commitlog"] > 0 and read["full"]["consumequeue"] > 0
    # the probes: a CommitLog page past the last record; from the queue ends, per transaction queue its oldest
    # unit, a bisection to its zero tail (20 bytes a step) and a block before it
    queue_ends = 3 * (20 + 20 * 32 + indexed_plan.QUEUE_TAIL_BLOCK) if chosen_from == "queue_ends" else 0
    probes = {"commitlog": indexed_plan.WRITTEN_PROBE_BYTES, "consumequeue": queue_ends}
    for kind in set(read["full"]) | set(read["indexed"]):
        assert read["indexed"].get(kind, 0) <= read["full"].get(kind, 0) + probes.get(kind, 0), (kind, read)


def test_written_past_reads_zero_tails_and_the_next_file(tmp_path):
    """``commitlog_written_past``: bytes of a record at or past the offset, the zero tail of a preallocated
    file, a full file's blank end followed by an empty or a written next file, an unreadable file."""
    from types import SimpleNamespace

    size = 1 << 16
    first, second = tmp_path / "00000000000000000000", tmp_path / f"{size:020d}"
    first.write_bytes(b"\x07" * 1000 + bytes(size - 1000))
    second.write_bytes(bytes(size))
    store = SimpleNamespace(commitlog_files=((str(first), 0, size), (str(second), size, size)))
    written = indexed_plan.commitlog_written_past
    assert written(store, 0) and written(store, 999)
    assert not written(store, 1000) and not written(store, size) and not written(store, 2 * size)
    second.write_bytes(b"\x01" + bytes(size - 1))
    assert written(store, 1000) and written(store, size) and not written(store, size + 1)
    second.unlink()
    assert not written(store, 1000)
