"""jobs/reconstruct/split.py: the reducer on several threads gives today's outputs, table by table, in today's order."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from jobs.reconstruct import split as txsplit
from jobs.reconstruct.params import AuditParams
from jobs.reconstruct.reducer import input_table, reduce_input
from schemas.sources import ANOMALIES_SOURCE

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from bench_reducer import BASE, synthetic_commitlog  # noqa: E402

PARAMS = AuditParams(6000, 15, 30000, 72, as_of_ms=BASE + 30_000)


def _anomalies(broker: str, offsets, kind: str) -> pa.Table:
    n = len(offsets)
    cols = {"broker": [broker] * n, "kind": [kind] * n, "source": ["commitlog"] * n,
            "physical_offset": list(offsets), "file": ["00000000000000000000"] * n, "position": list(offsets),
            "length": [300] * n, "detail": ["test"] * n}
    schema = ANOMALIES_SOURCE.arrow_schema()
    return pa.table({f.name: pa.array(cols.get(f.name, [None] * n), f.type) for f in schema}, schema=schema)


def _input() -> pa.Table:
    """Two brokers of the synthetic 5.1+ store (commits, rollbacks by op, re-put copies, batched op bodies),
    one with corrupt records and an uncommitted DLedger tail: per-row problems reach the parts."""
    a, b = synthetic_commitlog(3000), synthetic_commitlog(1200)
    b = b.set_column(b.schema.get_field_index("broker"), "broker", pa.array(["b2"] * b.num_rows))
    offs = np.asarray(a.column("physical_offset"))
    bad = _anomalies("b", offs[[5, 700, 2500]].tolist(), "BODY_CRC_MISMATCH")
    tail = _anomalies("b", [int(offs[-300])], "DLEDGER_UNCOMMITTED")
    return pa.concat_tables([input_table(commitlog=a, anomalies=pa.concat_tables([bad, tail])),
                             input_table(commitlog=b)])


@pytest.mark.parametrize("cpus", [2, 3, 7])
def test_threads_give_the_serial_outputs(monkeypatch, cpus):
    table = _input()
    want = reduce_input(table, PARAMS)
    assert want["transactions"].num_rows == 4200
    assert any("CORRUPT_RECORD" in f for f in want["transactions"].column("flags").to_pylist())
    monkeypatch.setattr(txsplit, "PARALLEL_MIN_ROWS", 1)
    monkeypatch.setattr(txsplit, "driver_cpus", lambda: cpus)
    got = reduce_input(table, PARAMS)
    for name in want:
        assert got[name].equals(want[name]), name


def test_split_is_contiguous_balanced_and_complete():
    table = input_table(commitlog=synthetic_commitlog(2000))
    from jobs.reconstruct.evidence import Evidence, link_ends, link_ops, op_rows_evidence, record_evidence
    from jobs.reconstruct.reducer import OP_BODY_COLUMNS, _relevant
    rec = _relevant(table)
    ops = rec.filter(pa.compute.equal(rec.column("topic"), "RMQ_SYS_TRANS_OP_HALF_TOPIC"))
    ev = Evidence.concat([record_evidence(rec), op_rows_evidence(ops.select(list(OP_BODY_COLUMNS)))])
    link_ends(ev)
    ev = link_ops(ev)
    parts = txsplit.split_by_transaction(ev, 3)
    rows = np.concatenate(parts)
    tx = ev.s["tx"]
    assert sorted(rows.tolist()) == np.nonzero(~np.asarray(tx.is_null()))[0].tolist()
    assert all((np.diff(p) > 0).all() for p in parts)
    ids = [set(tx.take(pa.array(p)).to_pylist()) for p in parts]
    assert not (ids[0] & ids[1]) and not (ids[1] & ids[2]) and not (ids[0] & ids[2])
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) < 0.2 * len(rows)


def test_small_inputs_keep_one_thread():
    assert txsplit.parts_for(txsplit.PARALLEL_MIN_ROWS - 1) == 1
    assert txsplit.parts_for(txsplit.PARALLEL_MIN_ROWS, cpus=2) == 2
    assert txsplit.parts_for(10**9, cpus=1) == 1


def test_arrow_allocator_is_restored_and_its_buffers_outlive_it():
    before = pa.default_memory_pool().backend_name
    with txsplit.arrow_allocator():
        assert pa.default_memory_pool().backend_name == pa.system_memory_pool().backend_name
        made = pa.compute.add(pa.array(np.arange(100_000)), 1)
    assert pa.default_memory_pool().backend_name == before
    assert made.to_numpy()[-1] == 100_000
