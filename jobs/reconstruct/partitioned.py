"""The reducer's steps on one partition of rows (Spark-free: numpy + pyarrow), for the distributed reduce
(jobs/reconstruct/distributed.py, which links the evidence with Spark joins in between).

Every function here is a step of jobs/reconstruct/reducer.py taken apart where it is row-local or local to
one key, and calls the same code:

* ``evidence_batches``: RECON_INPUT rows -> unlinked evidence rows (``schemas.recon.RECON_EVIDENCE``), the
  reducer's ``record_evidence`` / ``op_rows_evidence`` / ``statetable_evidence`` / ``redolog_evidence`` of
  each batch.  ``ord`` keeps the driver reducer's row order (kind of row, then input order: the order of
  ``wide.toArrow()``), so that each transaction's rows reach the rules in the order they have there (the
  rules pick the earliest row on ties).  END rows carry ``own_tx``, the id ``link_ends`` gives them when no
  copy is at their PREPARED_TRANSACTION_OFFSET.
* ``partial_facts`` / ``merge_facts``: the broker facts of ``reducer._facts`` summed per partition and merged
  on the driver (counts add up, bounds take their min / max, consume offsets their max).
* ``reduce_chunks``: linked evidence sorted by (broker, tx, ord) -> the transactions, check-back and recovery
  rows of ``jobs/reconstruct/rules.py``, over chunks of whole transactions (jobs/reconstruct/split.py says
  why a reduce over any set of whole transactions gives the same rows).  The broker's facts, profile,
  params, lost CommitLog ranges and decoder findings come in a ``Context`` (small, shipped with the task).
* ``cq_chunks``, ``orphan_batches``, ``missing_body_batches``: the findings no transaction owns
  (``reducer._cq_mismatches`` per CommitLog offset, ``reducer._orphan_ops``, ``reducer._missing_bodies``).

Memory: a chunk holds whole keys of a partition sorted by key, so a task holds about ``CHUNK_ROWS`` rows
(plus one transaction, however many re-put copies it has) whatever the partition's size.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct import rules as txrules
from jobs.reconstruct import worklists
from jobs.reconstruct.damage import DamagedRanges
from jobs.reconstruct.evidence import (
    CODE_FIELDS,
    END,
    INT_FIELDS,
    STR_FIELDS,
    Evidence,
    op_rows_evidence,
    own_tx,
    record_evidence,
    redolog_evidence,
    statetable_evidence,
    tid_tx,
    to_arrow_nullable,
)
from jobs.reconstruct.groups import ints, strings
from jobs.reconstruct.params import AuditParams
from jobs.reconstruct.reducer import (
    _FACT_SUMS,
    _BySrc,
    _corrupt_rows,
    _cq_mismatches,
    _decoder_finding,
    _facts,
    _missing_bodies,
    _orphan_ops,
    _relevant,
    _uncommitted_rows,
    cq_finding,
    cq_records,
    merge_facts_into,
    op_rows_of,
    record_finding_offsets,
)
from schemas.audit import AUDIT_ANOMALIES
from schemas.recon import (
    EVIDENCE_CODE_COLUMNS,
    EVIDENCE_INT_COLUMNS,
    EVIDENCE_STR_COLUMNS,
    RECON_EVIDENCE,
    RECON_EVIDENCE_PASS,
    RECON_FACTS,
    RECON_OUTPUT,
)
from txlog_io.unitchain import drop_misplaced_units

assert (EVIDENCE_INT_COLUMNS, EVIDENCE_CODE_COLUMNS, EVIDENCE_STR_COLUMNS) == (INT_FIELDS, CODE_FIELDS,
                                                                              STR_FIELDS)

#: ``ord`` = kind << KIND_SHIFT | partition << PART_SHIFT | row number in the partition
KIND_SHIFT, PART_SHIFT = 56, 32
KIND_RECORD, KIND_OP, KIND_ST, KIND_REDO, KIND_ORIGREF, KIND_XREF, KIND_TIDREF = range(7)
#: problem bits of the consume-queue comparison (RECON_EVIDENCE.problems)
PROBLEM_BITS = {"CQ_MISMATCH": 1, "EVIDENCE_IN_DELETED_RANGE": 2}
#: rows of sorted evidence a reduce step gathers before it runs the rules on the whole transactions among them
CHUNK_ROWS = 100_000
#: partial_facts' count of consume-queue unit rows (whether the consume-queue comparison runs at all)
CQ_UNITS = "cq_units"



# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------

def _table(batches: Iterable[pa.RecordBatch]) -> Optional[pa.Table]:
    batches = [b for b in batches if b.num_rows]
    return pa.Table.from_batches(batches) if batches else None


def by_broker(table: pa.Table) -> Iterator[tuple]:
    """(broker, rows of that broker) of ``table``: slices when the brokers come in runs (sorted input)."""
    if not table.num_rows:
        return
    enc = pc.dictionary_encode(table.column("broker").combine_chunks())
    idx = np.asarray(enc.indices)
    starts = np.r_[0, np.nonzero(idx[1:] != idx[:-1])[0] + 1]
    names = enc.dictionary.to_pylist()
    if len(np.unique(idx[starts])) == len(starts):
        ends = np.r_[starts[1:], len(idx)]
        for a, e in zip(starts.tolist(), ends.tolist(), strict=True):
            yield names[int(idx[a])], table.slice(a, e - a)
    else:
        for k, name in enumerate(names):
            yield name, table.filter(pa.array(idx == k))


def chunks_by_key(batches: Iterable[pa.RecordBatch], key: Callable[[pa.Table], Sequence[pa.Array]],
                  min_rows: Optional[int] = None) -> Iterator[pa.Table]:
    """Tables of whole key groups from batches sorted by ``key`` (a function of a table -> its key columns):
    batches are gathered to at least ``min_rows`` rows (default CHUNK_ROWS), then cut before the last key's
    group (which goes on with the next batches)."""
    min_rows = CHUNK_ROWS if min_rows is None else min_rows
    held: List[pa.Table] = []
    n = 0
    for b in batches:
        if not b.num_rows:
            continue
        held.append(pa.Table.from_batches([b]))
        n += b.num_rows
        if n < min_rows:
            continue
        t = pa.concat_tables(held)
        cut = _last_group_start(t, key(t))
        if cut == 0:                # one key so far: keep gathering
            held = [t]
            continue
        yield t.slice(0, cut)
        held, n = [t.slice(cut)], t.num_rows - cut
    if held:
        yield pa.concat_tables(held)


def _last_group_start(t: pa.Table, cols: Sequence[pa.Array]) -> int:
    same = np.ones(t.num_rows, bool)
    for col in cols:
        col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        last = col[len(col) - 1]
        eq = pc.is_null(col) if not last.is_valid else pc.fill_null(pc.equal(col, last), False)
        same &= np.asarray(eq)
    differ = np.nonzero(~same)[0]
    return int(differ[-1]) + 1 if len(differ) else 0


def anomalies_table(rows: List[dict]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=AUDIT_ANOMALIES.arrow_schema())


def output_union(outs: Mapping[str, pa.Table]) -> pa.Table:
    """Output tables as RECON_OUTPUT rows tagged with their name in ``out``."""
    schema = RECON_OUTPUT.arrow_schema()
    parts = []
    for name, tbl in outs.items():
        n = tbl.num_rows
        cols = [pa.array([name] * n, pa.string()) if f.name == "out"
                else tbl.column(f.name).cast(f.type) if f.name in tbl.column_names else pa.nulls(n, f.type)
                for f in schema]
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


# ------------------------------------------------------------------------------------------------------------
# evidence rows
# ------------------------------------------------------------------------------------------------------------

def evidence_table(broker: str, ev: Evidence, ord_: np.ndarray) -> pa.Table:
    """One broker's (unlinked) evidence as RECON_EVIDENCE rows."""
    n = ev.n
    cols = {"broker": pa.array([broker] * n, pa.string()), "ord": pa.array(ord_, pa.int64())}
    cols.update({k: to_arrow_nullable(ev.i[k]) for k in INT_FIELDS})
    cols.update({k: pa.array(ev.c[k], pa.int8()) for k in CODE_FIELDS})
    cols.update({k: ev.s[k] for k in STR_FIELDS})
    is_end = ev.c["role"] == END
    own = own_tx(ev)
    cols["own_tx"] = pc.if_else(pa.array(is_end), own, pa.nulls(n, pa.string())) if n else own
    cols["tid_tx"] = tid_tx(ev)
    cols["problems"] = pa.array(np.zeros(n, np.int8), pa.int8())
    schema = RECON_EVIDENCE.arrow_schema()
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def evidence_of(t: pa.Table) -> Evidence:
    """RECON_EVIDENCE rows -> Evidence (nulls of the codes as 0)."""
    return Evidence(t.num_rows, {k: ints(t.column(k)) for k in INT_FIELDS},
                    {k: np.asarray(pc.fill_null(t.column(k), 0).combine_chunks(), np.int8) if t.num_rows
                     else np.zeros(0, np.int8) for k in CODE_FIELDS},
                    {k: strings(t.column(k)) for k in STR_FIELDS})


def _evidence_tables(batches: Iterable[pa.RecordBatch], partition: int, op_bodies_given: bool,
                     facts: Optional[Dict[str, dict]] = None) -> Iterator[pa.Table]:
    """RECON_INPUT batches of one input partition -> RECON_EVIDENCE tables; with ``facts``, each broker's
    partial facts (``partial_facts``) are summed into it from the same per-batch split of the rows."""
    seq = 0
    base = partition << PART_SHIFT
    for b in batches:
        if not b.num_rows:
            continue
        for broker, sub in by_broker(pa.Table.from_batches([b])):
            src = _BySrc(sub)
            cl = src["commitlog"]
            records = _relevant(cl)
            op_rows = op_rows_of(src, records, op_bodies_given)
            if facts is not None:
                d = _facts(cl, records, op_rows, src)
                d[CQ_UNITS] = src["consumequeue"].num_rows
                _merge(facts.setdefault(broker, {}), d)
            for kind, ev in ((KIND_RECORD, record_evidence(records)), (KIND_OP, op_rows_evidence(op_rows)),
                             (KIND_ST, statetable_evidence(src["statetable"])),
                             (KIND_REDO, redolog_evidence(src["redolog"]))):
                if not ev.n:
                    continue
                ord_ = (np.int64(kind) << KIND_SHIFT) + base + seq + np.arange(ev.n, dtype=np.int64)
                seq += ev.n
                yield evidence_table(broker, ev, ord_)


def evidence_batches(batches: Iterable[pa.RecordBatch], partition: int,
                     op_bodies_given: bool) -> Iterator[pa.RecordBatch]:
    """RECON_INPUT batches of one input partition -> RECON_EVIDENCE batches (see the module docstring)."""
    for t in _evidence_tables(batches, partition, op_bodies_given):
        yield from t.to_batches()


def evidence_and_facts(batches: Iterable[pa.RecordBatch], partition: int,
                       op_bodies_given: bool) -> Iterator[pa.RecordBatch]:
    """RECON_INPUT batches of one input partition -> RECON_EVIDENCE_PASS batches: the rows of
    ``evidence_batches`` (``facts_json`` null), then one row per broker with the partition's ``partial_facts``
    in ``facts_json`` (``ord`` -1, the evidence columns null): one pass over the rows for both."""
    schema = RECON_EVIDENCE_PASS.arrow_schema()
    acc: Dict[str, dict] = {}
    for t in _evidence_tables(batches, partition, op_bodies_given, acc):
        t = t.append_column(schema.field("facts_json"), pa.nulls(t.num_rows, pa.string()))
        yield from t.to_batches()
    if acc:
        n = len(acc)
        cols = {"broker": pa.array(list(acc), pa.string()), "ord": pa.array([-1] * n, pa.int64()),
                "facts_json": pa.array([json.dumps(d) for d in acc.values()], pa.string())}
        yield pa.RecordBatch.from_arrays([cols[f.name] if f.name in cols else pa.nulls(n, f.type)
                                          for f in schema], schema=schema)


# ------------------------------------------------------------------------------------------------------------
# broker facts
# ------------------------------------------------------------------------------------------------------------

_merge = merge_facts_into


def partial_facts(batches: Iterable[pa.RecordBatch], op_bodies_given: bool) -> Iterator[pa.RecordBatch]:
    """RECON_INPUT batches of one partition -> RECON_FACTS rows (one per broker of the partition)."""
    acc: Dict[str, dict] = {}
    for b in batches:
        if not b.num_rows:
            continue
        for broker, sub in by_broker(pa.Table.from_batches([b])):
            src = _BySrc(sub)
            cl = src["commitlog"]
            records = _relevant(cl)
            op_rows = op_rows_of(src, records, op_bodies_given)
            d = _facts(cl, records, op_rows, src)
            d[CQ_UNITS] = src["consumequeue"].num_rows
            _merge(acc.setdefault(broker, {}), d)
    if acc:
        yield pa.RecordBatch.from_pylist([{"broker": b, "facts_json": json.dumps(d)} for b, d in acc.items()],
                                         schema=RECON_FACTS.arrow_schema())


def queue_unit_facts(n: int) -> dict:
    """The partial facts ``_facts`` gives a partition holding ``n`` consume-queue units of a broker and no
    other rows (the units are only counted): what the evidence pass would add for them."""
    d = {k: 0 for k in _FACT_SUMS}
    d["n_cq"] = n
    d[CQ_UNITS] = n
    return d


def add_queue_units(merged: Dict[str, dict], counts: Iterable[Mapping]) -> Dict[str, dict]:
    """``merged`` facts ({broker: facts}) with ``counts`` ({"broker", "n"} rows: consume-queue units per
    broker) added as :func:`queue_unit_facts`."""
    for r in counts:
        _merge(merged.setdefault(r["broker"], {}), queue_unit_facts(int(r["n"])))
    return merged


def merge_facts(rows: Iterable[Mapping]) -> Dict[str, dict]:
    """RECON_FACTS rows (dicts) -> {broker: facts} as ``reducer._facts`` gives them for all the rows."""
    out: Dict[str, dict] = {}
    for r in rows:
        _merge(out.setdefault(r["broker"], {}), json.loads(r["facts_json"]))
    return out


# ------------------------------------------------------------------------------------------------------------
# the rules over whole transactions, and the findings no transaction owns
# ------------------------------------------------------------------------------------------------------------

@dataclass
class BrokerContext:
    """What a reduce task needs of its broker besides its evidence rows."""

    facts: dict
    profile: str
    params: Optional[AuditParams]
    damaged: Optional[DamagedRanges]      # its lost CommitLog ranges (jobs/reconstruct/damage.py)
    anomalies: pa.Table                     # its decoder findings (kind, source, physical_offset, ...)
    findings: List[dict] = field(default_factory=list)     # the same as dicts (for drop_misplaced_units)

    @cached_property
    def corrupt(self) -> np.ndarray:
        """``reducer.record_finding_offsets`` of its decoder findings."""
        return record_finding_offsets(self.anomalies)


@dataclass
class Context:
    brokers: Dict[str, BrokerContext]
    critical_within_ms: int = 60000


def reduce_chunks(batches: Iterable[pa.RecordBatch], ctx: Context) -> Iterator[pa.RecordBatch]:
    """Linked evidence rows (every one with a transaction id) sorted by (broker, tx, ord) -> RECON_OUTPUT
    rows: transactions, check_back (ranked within the chunk: the caller ranks them again) and recovery."""
    for t in chunks_by_key(batches, lambda t: (t.column("broker"), t.column("tx"))):
        for broker, sub in by_broker(t):
            bc = ctx.brokers[broker]
            ev = evidence_of(sub)
            bits = np.asarray(pc.fill_null(sub.column("problems"), 0).combine_chunks(), np.int8)
            problems = [(np.nonzero(bits & bit)[0], code) for code, bit in PROBLEM_BITS.items()]
            problems.append((_corrupt_rows(ev, bc.corrupt), "CORRUPT_RECORD"))
            problems.append((_uncommitted_rows(ev, bc.anomalies), "EVIDENCE_NOT_COMMITTED"))
            uncertain: list = []        # STATE_UNCERTAIN_DAMAGED_RANGE findings, one per flagged transaction
            tx = txrules.transactions(broker, ev, bc.facts, bc.profile, bc.params, problems, bc.damaged,
                                      findings=uncertain)
            outs = {"transactions": tx, "check_back": worklists.check_back(tx, ctx.critical_within_ms),
                    "recovery": worklists.recovery(tx)}
            if uncertain:
                outs["anomalies"] = pa.concat_tables(uncertain)
            out = output_union(outs)
            yield from out.to_batches()


def orphan_batches(batches: Iterable[pa.RecordBatch], ctx: Context) -> Iterator[pa.RecordBatch]:
    """OP evidence rows without a transaction -> their AUDIT_ANOMALIES rows (``reducer._orphan_ops``)."""
    for b in batches:
        for broker, sub in by_broker(pa.Table.from_batches([b])):
            rows = _orphan_ops(broker, evidence_of(sub), ctx.brokers[broker].facts)
            if rows:
                yield from anomalies_table(rows).to_batches()


def cq_key(t: pa.Table) -> Sequence[pa.Array]:
    """The key of the consume-queue comparison: (broker, CommitLog offset of a unit or a record)."""
    return t.column("broker"), pc.coalesce(t.column("commitlog_offset"), t.column("physical_offset"))


def cq_chunks(batches: Iterable[pa.RecordBatch], ctx: Context) -> Iterator[pa.RecordBatch]:
    """Half / op / discard consume-queue units and records of those topics (RECON_INPUT rows, src
    consumequeue / commitlog) sorted by ``cq_key`` -> their CQ_MISMATCH / EVIDENCE_IN_DELETED_RANGE rows
    (``reducer._cq_mismatches``: every comparison is within one CommitLog offset)."""
    for t in chunks_by_key(batches, cq_key):
        for broker, sub in by_broker(t):
            bc = ctx.brokers[broker]
            src = _BySrc(sub)
            units = drop_misplaced_units(src["consumequeue"], bc.findings)
            rows = [cq_finding(m) for m in _cq_mismatches(broker, cq_records(src["commitlog"], src), units,
                                                          bc.facts, bc.corrupt)]
            if rows:
                yield from anomalies_table(rows).to_batches()


def missing_body_batches(batches: Iterable[pa.RecordBatch], op_bodies_given: bool) -> Iterator[pa.RecordBatch]:
    """Op records (RECON_INPUT commitlog rows) that have no body -> OP_BODY_MISSING rows.  With op bodies
    given, the caller passes only the records no op body row matched."""
    empty = pa.table({"physical_offset": pa.array([], pa.int64())})
    for b in batches:
        for broker, sub in by_broker(pa.Table.from_batches([b])):
            rows = _missing_bodies(broker, sub, empty, op_bodies_given)
            if rows:
                yield from anomalies_table(rows).to_batches()


def decoder_findings(broker: str, anomalies: pa.Table) -> List[dict]:
    """A broker's decoder findings as AUDIT_ANOMALIES rows (dicts)."""
    cols = ["kind", "source", "physical_offset", "file", "position", "length", "detail", "expected", "actual"]
    return [_decoder_finding(dict(a, broker=broker)) for a in anomalies.select(cols).to_pylist()]


__all__ = ["evidence_batches", "evidence_and_facts", "evidence_table", "evidence_of", "partial_facts", "merge_facts",
           "queue_unit_facts", "add_queue_units",
           "reduce_chunks", "orphan_batches", "cq_chunks", "cq_key", "missing_body_batches",
           "decoder_findings", "chunks_by_key", "by_broker", "output_union", "BrokerContext", "Context",
           "PROBLEM_BITS", "CQ_UNITS", "KIND_SHIFT", "KIND_ORIGREF", "KIND_XREF", "KIND_TIDREF",
           "CHUNK_ROWS"]
