"""jobs/reconstruct/partitioned.py: the distributed reduce's per-partition steps, Spark-free (the whole path
against the driver reducer: tests/test_reconstruct.py, test_dledger_audit.py, test_reconstruct_refbroker.py)."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from test_txreduce import PARAMS, _commitlog

from jobs.reconstruct import partitioned as part
from jobs.reconstruct import rules as txrules
from jobs.reconstruct.evidence import link_ends, link_ops
from jobs.reconstruct.params import OP_TOPIC
from jobs.reconstruct.reducer import _BySrc, _facts, _relevant, input_table, reduce_input


def _batches(table: pa.Table, sizes):
    out, at = [], 0
    for n in sizes:
        out.append(table.slice(at, n).to_batches()[0] if n else None)
        at += n
    return [b for b in out if b is not None]


def _whole_facts(sub) -> dict:
    cl = sub["commitlog"]
    records = _relevant(cl)
    ops = records.filter(pa.compute.and_(pa.compute.equal(records.column("topic"), OP_TOPIC),
                                         pa.compute.is_valid(records.column("body"))))
    return _facts(cl, records, ops, sub)


def test_chunks_hold_whole_keys_in_order():
    keys = np.repeat(np.arange(50), np.arange(50) % 7 + 1)
    t = pa.table({"broker": pa.array(["b"] * len(keys)), "k": pa.array(keys.astype(np.int64))})
    batches = t.to_batches(max_chunksize=9)
    chunks = list(part.chunks_by_key(batches, lambda x: (x.column("broker"), x.column("k")), min_rows=20))
    assert len(chunks) > 3
    assert pa.concat_tables(chunks).column("k").to_pylist() == keys.tolist()
    seen = [set(c.column("k").to_pylist()) for c in chunks]
    for a, b in zip(seen, seen[1:], strict=False):
        assert not a & b            # no key split between two chunks


def test_partial_facts_merge_to_the_whole_brokers_facts():
    table = input_table(commitlog=_commitlog("a", "b"))
    rows = []
    for sizes in ((3, 4, 7), (14,), (1, 1, 12)):
        for batch in _batches(table, sizes):
            rows += [r for out in part.partial_facts([batch], False) for r in out.to_pylist()]
        merged = part.merge_facts(rows)
        rows = []
        for b, got in merged.items():
            sub = _BySrc(table.filter(pa.compute.equal(table.column("broker"), b)))
            assert got.pop(part.CQ_UNITS) == 0
            assert got == _whole_facts(sub)


def test_rules_over_linked_evidence_rows_equal_the_reducer():
    """Evidence built per batch, linked (here by the reducer's own links, Spark does it with windows), turned
    into RECON_EVIDENCE rows and back, sorted by (broker, tx, ord) and reduced in small chunks: the reducer's
    transactions."""
    table = input_table(commitlog=_commitlog("b"))
    want = reduce_input(table, PARAMS)["transactions"]
    batches = list(part.evidence_batches(table.to_batches(max_chunksize=3), 0, False))
    rows = pa.Table.from_batches(batches)
    ev = part.evidence_of(rows)
    link_ends(ev)
    ev = link_ops(ev)
    linked = part.evidence_table("b", ev, np.arange(ev.n, dtype=np.int64))
    linked = linked.filter(pa.compute.is_valid(linked.column("tx"))).sort_by([("tx", "ascending"),
                                                                            ("ord", "ascending")])
    facts = _whole_facts(_BySrc(table))
    profile = txrules.profile_row("b", facts, None)["profile"]
    empty = pa.table({"kind": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                      "physical_offset": pa.array([], pa.int64())})
    ctx = part.Context({"b": part.BrokerContext(facts, profile, PARAMS, None, empty)})
    orig_chunk = part.CHUNK_ROWS
    try:
        part.CHUNK_ROWS = 2
        out = pa.Table.from_batches(list(part.reduce_chunks(linked.to_batches(max_chunksize=2), ctx)))
    finally:
        part.CHUNK_ROWS = orig_chunk
    got = out.filter(pa.compute.equal(out.column("out"), "transactions")).select(want.column_names)
    key = (lambda t: sorted(map(repr, t.cast(want.schema).to_pylist())))
    assert key(got) == key(want)


def test_one_pass_gives_the_evidence_rows_and_the_partial_facts():
    """evidence_and_facts: the rows of evidence_batches (facts_json null) and, after them, one facts row per
    broker whose facts are partial_facts' of the same batches."""
    table = input_table(commitlog=_commitlog("a", "b"))
    batches = _batches(table, (3, 4, 7))
    got = pa.Table.from_batches(list(part.evidence_and_facts(batches, 5, False)))
    is_facts = pa.compute.is_valid(got.column("facts_json"))
    ev = got.filter(pa.compute.invert(is_facts))
    assert ev.drop_columns(["facts_json"]).equals(pa.Table.from_batches(list(part.evidence_batches(batches, 5,
                                                                                                   False))))
    facts = got.filter(is_facts)
    assert facts.num_rows == 2 and facts.column("ord").to_pylist() == [-1, -1]
    assert facts.column("role").null_count == 2
    want = [r for out in part.partial_facts(batches, False) for r in out.to_pylist()]
    assert part.merge_facts(facts.select(["broker", "facts_json"]).to_pylist()) == part.merge_facts(want)
