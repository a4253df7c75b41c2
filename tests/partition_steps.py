"""The distributed reduce's per-partition steps on Arrow tables, for tests of cross-record rules: link one
broker's evidence as the driver does, add its twins (``evidence.cross_refs``), and reduce the rows sorted by
(tx, ord) in small chunks, as the Spark shuffle hands them to ``partitioned.reduce_chunks``."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from test_reconstruct_partitioned import _whole_facts
from test_txreduce import PARAMS

from jobs.reconstruct import partitioned as part
from jobs.reconstruct import rules as txrules
from jobs.reconstruct.evidence import cross_refs, link_ends, link_ops
from jobs.reconstruct.reducer import _BySrc, reduce_input


def linked(table: pa.Table):
    """Broker "b"'s evidence of RECON_INPUT ``table``, built in partitions of 3 rows and linked."""
    ev = part.evidence_of(pa.Table.from_batches(list(part.evidence_batches(table.to_batches(max_chunksize=3), 0,
                                                                           False))))
    link_ends(ev)
    return link_ops(ev)


def assert_partition_steps_equal_reducer(table: pa.Table, kinds) -> pa.Table:
    """Reduce ``table`` by the per-partition steps, the twins' ``ord`` of kind ``kinds[role]``, and assert the
    transactions and anomalies equal ``reduce_input``'s; returns the linked evidence rows."""
    want = reduce_input(table, PARAMS)
    ev = linked(table)
    rows = part.evidence_table("b", ev, np.arange(ev.n, dtype=np.int64))
    x = cross_refs(ev)
    kind = np.array([kinds[int(r)] for r in x.c["role"]], np.int64)
    xrows = part.evidence_table("b", x, np.arange(x.n, dtype=np.int64) + (kind << part.KIND_SHIFT))
    both = pa.concat_tables([rows, xrows])
    both = both.filter(pa.compute.is_valid(both.column("tx"))).sort_by([("tx", "ascending"), ("ord", "ascending")])
    facts = _whole_facts(_BySrc(table))
    profile = txrules.profile_row("b", facts, None)["profile"]
    empty = pa.table({"kind": pa.array([], pa.string()), "source": pa.array([], pa.string()),
                      "physical_offset": pa.array([], pa.int64())})
    ctx = part.Context({"b": part.BrokerContext(facts, profile, PARAMS, None, empty)})
    out = pa.Table.from_batches(list(part.reduce_chunks(both.to_batches(max_chunksize=2), ctx)))
    for name, cols in (("transactions", want["transactions"]), ("anomalies", want["anomalies"])):
        got = out.filter(pa.compute.equal(out.column("out"), name)).select(cols.column_names)
        key = (lambda t, s=cols.schema: sorted(map(repr, t.cast(s).to_pylist())))
        assert key(got) == key(cols), name
    return rows
