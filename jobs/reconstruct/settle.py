"""Final transactions carried as their reduced rows (Spark-free): what lets an incremental audit's state
(schemas/state.py, jobs/audit/state.py) stay proportional to the open transactions instead of the history.

:func:`settle` splits a run's carried evidence (the transaction-relevant CommitLog records and op bodies below
the resume offset) into the records still needed as evidence and the transactions that are *settled*: their
``transactions`` row is carried (``schemas.state.STATE_FINAL``) with what later evidence could link against,
their records are dropped, and the broker facts those records gave (``reducer._facts``: counts, bounds) are
carried per CommitLog file.  The next run feeds :func:`final_input` (the facts, and the dropped records'
consume-queue tuples for ``reducer._cq_mismatches``) to the unchanged reducer, appends
:func:`final_transactions` (as_of-dependent columns recomputed) to its ``transactions``, and checks
:func:`reduced_keys` against :func:`final_keys`: a reduced row linking to a settled transaction means later
evidence touched it, and the run is done again as a full audit (jobs/read/incremental/plan.py,
``FINAL_REOPENED``); so does a broker carrying settled DISCARDED rows that now has CommitLog decoder
findings (:func:`discard_damage`).  docs/ARCHITECTURE.md ("Incremental state") gives the RocketMQ rules
that make a settled row safe to carry.

A transaction settles when all of these hold (else its records stay evidence):

* COMMITTED, ROLLED_BACK or DISCARDED (DISCARDED only on a broker without CommitLog decoder findings: the
  state rests on no END anywhere after its first record), never PREPARED (its deadline flags move with the
  as-of time and the check service still acts on it); HALF_QUEUE mechanism (4.3+: no statetable, redolog or
  PREPARED records), profile 4.3-5.0 or 5.1+, keyed by (UNIQ_KEY, PGROUP, REAL_TOPIC), no open copy (so no
  check-back row, no MARK_DONE), no flag but FINAL_FLAGS (each rests on the transaction's own records, and
  is carried with the row);
* every half copy's queue offset below the half queue's consume offset of CID_RMQ_SYS_TRANS and every op's
  below the op queue's (the check service never reads those again: no re-put copy, no discard, no check);
* all its records in one CommitLog file (retention deletes whole files: the row goes with all its evidence
  or none) and below the resume offset (never read again);
* a batched 5.1+ op body naming it and other halves stays carried, with only the other pieces in its
  body (still comma-batched: the facts' counts do not change).

A record that is evidence of no transaction (:func:`jobs.reconstruct.evidence.evidence_mask`: not a half, op
or discard record, nor a PREPARED / COMMIT / ROLLBACK record of an ordinary topic -- e.g. the magic-V2
records of long retry topics the decoder's transaction filter keeps, the delay and retry copies of committed
messages) feeds only the broker facts (``reducer._facts``: the smallest file base, the V2 count, the newest
store time).  Below the resume offset, on a 4.3+ broker without CommitLog decoder findings (a torn end's
lost range counts the records read, ``reducer.records_read``), it is dropped with its facts carried per
file, as a settled transaction's records are.
"""
from __future__ import annotations

import json
from typing import Collection, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.evidence import (
    COPY,
    HALF_Q,
    OP,
    Evidence,
    _np,
    evidence_mask,
    link_ends,
    link_ops,
    op_rows_evidence,
    record_evidence,
    uniq_tx,
)
from jobs.reconstruct.params import (
    CHECK_GROUP,
    COMMITTED,
    DISCARD_TOPIC,
    DISCARDED,
    HALF_QUEUE,
    HALF_TOPIC,
    OP_TOPIC,
    P_43,
    P_51,
    ROLLED_BACK,
)
from jobs.reconstruct.reducer import (
    CQ_RECORD_SRC,
    FACTS_SRC,
    _BySrc,
    _facts,
    final_transactions,
    input_table,
    merge_facts_into,
)
from schemas.recon import OP_BODY_COLUMNS, RECON_INPUT
from schemas.state import STATE_FINAL

CQ_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)
_CQ_FIELDS = ("topic", "physical_offset", "queue_id", "queue_offset", "total_size")
#: output codes of findings that name a settled transaction's record or half (reduced_keys)
ORPHAN_CODES = ("OP_WITHOUT_HALF", "EVIDENCE_IN_DELETED_RANGE")
CQ_CODES = ("CQ_MISMATCH", "EVIDENCE_IN_DELETED_RANGE")
#: flags a settled row may carry: each rests on the transaction's own records only (their counts and links),
#: so only a later record that links to the transaction -- which ``reopened`` catches -- could change it
FINAL_FLAGS = ("DUPLICATE_COMMIT", "CONFLICTING_ENDS", "DISCARDED_WITH_RESOLUTION")
#: decoder finding sources whose findings make CommitLog ranges lost (jobs/reconstruct/damage.py)
LOST_SOURCES = ("commitlog", "dledger")


def consume_offsets(consumer_offsets: Optional[pa.Table]) -> Dict[str, Tuple[Optional[int], Optional[int]]]:
    """broker -> (half, op) queue consume offsets of CID_RMQ_SYS_TRANS, queue 0 (as ``reducer._facts``)."""
    out: Dict[str, list] = {}
    if consumer_offsets is None or not consumer_offsets.num_rows:
        return {}
    cols = [consumer_offsets.column(c).to_pylist() for c in ("broker", "topic", "group", "queue_id", "offset")]
    for broker, topic, group, qid, off in zip(*cols, strict=True):
        got = out.setdefault(broker, [None, None])
        if group == CHECK_GROUP and qid == 0 and off is not None and topic in (HALF_TOPIC, OP_TOPIC):
            k = 0 if topic == HALF_TOPIC else 1
            got[k] = off if got[k] is None else max(got[k], off)
    return {b: (h, o) for b, (h, o) in out.items()}


class Settled:
    """:func:`settle`'s result: ``records`` / ``op_bodies`` still carried as evidence, ``final`` the newly
    settled transactions (STATE_FINAL rows), ``facts`` {broker: {file base (str): facts}} of the dropped
    records."""

    def __init__(self, records: pa.Table, op_bodies: Optional[pa.Table], final: pa.Table,
                 facts: Dict[str, Dict[str, dict]]):
        self.records, self.op_bodies, self.final, self.facts = records, op_bodies, final, facts


def settle(records: pa.Table, op_bodies: Optional[pa.Table], transactions: pa.Table,
           offsets: Mapping[str, Tuple[Optional[int], Optional[int]]], resume: Mapping[str, int],
           file_bases: Mapping[str, Sequence[int]], legacy: Sequence[str] = (),
           damaged: Sequence[str] = ()) -> Settled:
    """Split ``records`` (STATE_RECORDS rows) and ``op_bodies`` (STATE_OP_BODIES rows, None when the records
    carry the op bodies) by the run's ``transactions`` output (see the module docstring).  ``offsets``:
    consume_offsets of the run; ``resume``: broker -> the state's resume offset; ``file_bases``: broker -> the
    base offsets of its CommitLog files; ``legacy``: brokers with statetable / redolog units (not settled);
    ``damaged``: brokers with CommitLog decoder findings (their records that are no evidence stay)."""
    keep_r, keep_o, finals, facts = [], [], [], {}
    brokers = pc.unique(records.column("broker")).to_pylist() if records.num_rows else []
    for b in brokers:
        rec = records.filter(pc.equal(records.column("broker"), b))
        ops = None if op_bodies is None else op_bodies.filter(pc.equal(op_bodies.column("broker"), b))
        txs = transactions.filter(pc.equal(transactions.column("broker"), b))
        hco, oco = offsets.get(b, (None, None))
        bases = np.asarray(sorted(file_bases.get(b, ())), np.int64)
        got = None
        if b not in legacy and hco is not None and oco is not None and b in resume and txs.num_rows:
            got = _settle_broker(rec, ops, txs, hco, oco, resume[b], bases, b not in damaged)
        if got is None:
            r, o, fa = rec, ops, {}
        else:
            r, o, f, fa = got
            finals.append(f)
        if b not in legacy and b not in damaged and b in resume:
            r, inert_facts = _drop_inert(r, resume[b], bases)
            for k, v in inert_facts.items():
                merge_facts_into(fa.setdefault(k, {}), v)
        keep_r.append(r)
        if o is not None:
            keep_o.append(o)
        if fa:
            facts[b] = fa
    final = pa.concat_tables(finals) if finals else STATE_FINAL.arrow_schema().empty_table()
    records_out = pa.concat_tables(keep_r) if keep_r else records.schema.empty_table()
    ops_out = None if op_bodies is None else (pa.concat_tables(keep_o) if keep_o else op_bodies.schema.empty_table())
    return Settled(records_out, ops_out, final, facts)


def _drop_inert(rec: pa.Table, resume: int, bases: np.ndarray) -> Tuple[pa.Table, Dict[str, dict]]:
    """(``rec`` without its records that are evidence of nothing below ``resume``, {file base: their facts})."""
    inert = inert_mask(rec, resume, bases)
    if not inert.any():
        return rec, {}
    gone = rec.filter(pa.array(inert))
    return rec.filter(pa.array(~inert)), file_facts(gone, op_rows_for(gone, None), bases)


def inert_mask(rec: pa.Table, resume: int, bases: np.ndarray) -> np.ndarray:
    """The rows of ``rec`` (STATE_RECORDS) that are evidence of no transaction, below ``resume`` in a file
    of ``bases`` (row-local: the distributed settle computes it per batch)."""
    if not rec.num_rows or not len(bases):
        return np.zeros(rec.num_rows, bool)
    phys = rec.column("physical_offset")
    idx = np.searchsorted(bases, np.asarray(pc.fill_null(phys, -1).to_numpy(zero_copy_only=False)), "right") - 1
    return (~evidence_mask(rec) & _np(pc.is_valid(rec.column("topic")))
            & ~_np(pc.equal(rec.column("topic"), OP_TOPIC))
            & _np(pc.less(phys, resume)) & (idx >= 0))


def op_rows_for(rec: pa.Table, ops: Optional[pa.Table]) -> pa.Table:
    """The op rows (OP_BODY_COLUMNS) of ``rec``: the given ``ops``, else ``rec``'s own op records with a body."""
    if ops is not None:
        return ops.select(list(OP_BODY_COLUMNS))
    is_op = pc.and_(pc.fill_null(pc.equal(rec.column("topic"), OP_TOPIC), False), pc.is_valid(rec.column("body")))
    return rec.filter(is_op).select(list(OP_BODY_COLUMNS))


def candidates(txs: pa.Table, discarded: bool) -> np.ndarray:
    """Rows of ``txs`` whose state and flags may settle: COMMITTED / ROLLED_BACK, and DISCARDED when
    ``discarded`` (the broker has no CommitLog decoder finding: a DISCARDED state rests on the absence of a
    later END anywhere after its first record); flags only among FINAL_FLAGS; PREPARED never."""
    state, flags, open_copies = txs.column("state"), txs.column("flags"), txs.column("open_copy_offsets")
    states = [COMMITTED, ROLLED_BACK] + ([DISCARDED] if discarded else [])
    ok = pc.and_(pc.is_in(state, pa.array(states)), pc.equal(txs.column("mechanism"), HALF_QUEUE))
    ok = pc.and_(ok, pc.is_in(txs.column("profile"), pa.array([P_43, P_51])))
    ok = pc.and_(ok, pc.equal(pc.fill_null(pc.list_value_length(open_copies), 0), 0))
    for name in ("uniq_key", "producer_group", "real_topic"):
        ok = pc.and_(ok, pc.is_valid(txs.column(name)))
    out = np.array(_np(ok), bool)
    flags = flags.combine_chunks()
    other = ~_np(pc.is_in(pc.list_flatten(flags), pa.array(FINAL_FLAGS, pa.string())))
    out[np.asarray(pc.list_parent_indices(flags), np.int64)[other]] = False
    return out


def _settle_broker(rec: pa.Table, ops: Optional[pa.Table], txs: pa.Table, hco: int, oco: int, resume: int,
                   bases: np.ndarray, discarded: bool = True):
    """One broker: (records kept, op bodies kept, STATE_FINAL rows, {file base: facts}) or None (nothing
    settles).  ``discarded``: whether DISCARDED transactions may settle (:func:`candidates`)."""
    cand = np.nonzero(candidates(txs, discarded))[0]
    if not len(cand) or not len(bases):
        return None
    op_rows = op_rows_for(rec, ops)
    ev = Evidence.concat([record_evidence(rec), op_rows_evidence(op_rows)])
    link_ends(ev)
    ev = link_ops(ev)
    if not ev.n:
        return None
    enc = pc.dictionary_encode(ev.s["tx"])
    code = np.asarray(pc.fill_null(enc.indices, -1)).astype(np.int64)
    n_tx = len(enc.dictionary)
    ids = uniq_tx(*(txs.column(n).combine_chunks().take(pa.array(cand, pa.int64()))
                    for n in ("uniq_key", "producer_group", "real_topic")))
    at = np.asarray(pc.fill_null(pc.index_in(ids, value_set=enc.dictionary), -1)).astype(np.int64)
    bad, file_idx = tx_bad(ev, code, n_tx, at[at >= 0], hco, oco, resume, bases)
    has = code >= 0
    phys, phys_ok = ev.i["physical_offset"]
    role = ev.c["role"]
    good_rows = has & ~bad[np.where(has, code, 0)]
    if not good_rows.any():
        return None
    # a copy, END or discard record is one transaction's (its ORIGREF twin too); an op record names one half
    # per piece: dropped when every piece is a settled transaction's, else kept with the other pieces only
    op_rec = role == OP
    bad_offsets = np.unique(phys[~good_rows & ~op_rec & phys_ok])
    dropped = np.setdiff1d(np.unique(phys[good_rows & ~op_rec]), bad_offsets)
    op_bad = np.unique(phys[op_rec & ~good_rows])
    dropped = np.union1d(dropped, np.setdiff1d(np.unique(phys[op_rec & good_rows]), op_bad))
    mixed = np.intersect1d(np.unique(phys[op_rec & good_rows]), op_bad)
    bodies = _kept_pieces(ev, op_rec & ~good_rows, mixed)
    rec_off = np.asarray(rec.column("physical_offset").to_numpy(zero_copy_only=False))
    rec_drop = np.isin(rec_off, dropped)
    kept_rec, gone = rec.filter(pa.array(~rec_drop)), rec.filter(pa.array(rec_drop))
    kept_ops, gone_ops = None, None
    if ops is not None:
        ops_drop = np.isin(np.asarray(ops.column("physical_offset").to_numpy(zero_copy_only=False)), dropped)
        kept_ops, gone_ops = _rebodied(ops.filter(pa.array(~ops_drop)), bodies), ops.filter(pa.array(ops_drop))
    else:
        kept_rec = _rebodied(kept_rec, bodies)
    final = _final_rows(txs, cand, at, bad, ev, code, good_rows, bases, file_idx, gone, hco, oco,
                        enc.dictionary)
    return kept_rec, kept_ops, final, file_facts(gone, op_rows_for(gone, gone_ops), bases)


def tx_bad(ev: Evidence, code: np.ndarray, n_tx: int, cand: np.ndarray, hco: int, oco: int, resume: int,
           bases: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(per transaction code 0..n_tx-1 of linked evidence ``ev`` (``code`` per row, -1: none): True when it
    does NOT settle, per row: the index of its CommitLog file in ``bases``).  ``cand``: the codes whose
    transaction row may settle (:func:`candidates`); every other code is bad.  A candidate settles when all
    its rows lie in one CommitLog file, below ``resume``, every half copy's queue offset below ``hco`` and
    every op's below ``oco`` (the module docstring).  Whole transactions: the rows of a code must all be in
    ``ev`` (the distributed settle calls it per chunk of whole transactions)."""
    phys, phys_ok = ev.i["physical_offset"]
    qo, qo_ok = ev.i["queue_offset"]
    role = ev.c["role"]
    half = (role == COPY) & (ev.c["mechanism"] == HALF_Q)
    is_op = role == OP
    row_bad = (~phys_ok | (phys >= resume) | (half & (~qo_ok | (qo >= hco))) | (is_op & (~qo_ok | (qo >= oco))))
    file_idx = np.searchsorted(bases, phys, "right") - 1
    has = code >= 0
    bad = np.ones(n_tx, bool)
    bad[cand] = False
    lo = np.full(n_tx, np.iinfo(np.int64).max)
    hi = np.full(n_tx, -1)
    np.minimum.at(lo, code[has], file_idx[has])
    np.maximum.at(hi, code[has], file_idx[has])
    bad |= (lo != hi) | (lo < 0)
    bad[np.unique(code[has & row_bad])] = True
    return bad, file_idx


def _kept_pieces(ev: Evidence, keep_rows: np.ndarray, mixed: np.ndarray) -> Dict[int, str]:
    """CommitLog offset of an op record shared with settled transactions -> the body of its other pieces
    (``piece,`` each, in body order: still a comma-batched body, as the original was)."""
    phys = ev.i["physical_offset"][0]
    rows = np.nonzero(keep_rows & np.isin(phys, mixed))[0]
    pieces = ev.s["piece"].take(pa.array(rows, pa.int64())).to_pylist()
    out: Dict[int, list] = {}
    for o, piece in zip(phys[rows].tolist(), pieces, strict=True):
        out.setdefault(o, []).append(piece if piece is not None else "")
    return {o: "".join(f"{p}," for p in ps) for o, ps in out.items()}


def _rebodied(t: pa.Table, bodies: Dict[int, str]) -> pa.Table:
    """``t`` with the ``body`` of the rows at the offsets of ``bodies`` replaced."""
    if not bodies or not t.num_rows:
        return t
    i = t.schema.get_field_index("body")
    typ = t.schema.field(i).type
    old = t.column("body").to_pylist()
    new = [bodies.get(o, b) for o, b in zip(t.column("physical_offset").to_pylist(), old, strict=True)]
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        new = [b.encode() if isinstance(b, str) else b for b in new]
    return t.set_column(i, t.schema.field(i), pa.array(new, typ))


def _lists(group: np.ndarray, values: pa.Array, n: int, by: Optional[np.ndarray] = None) -> pa.ListArray:
    """values grouped into n lists by ``group`` (0..n-1), each list in the order of ``by`` (default: the
    values themselves; the distributed settle sorts its lists the same way)."""
    by = np.asarray(values.to_numpy(zero_copy_only=False)) if by is None else by
    order = np.lexsort((by, group)) if len(group) else np.zeros(0, np.int64)
    counts = np.bincount(group, minlength=n)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values.take(pa.array(order, pa.int64())))


def tx_lists(ev: Evidence, g: np.ndarray, sel: np.ndarray, n: int, bases: np.ndarray,
             file_idx: np.ndarray) -> Dict[str, pa.Array]:
    """The STATE_FINAL columns of n settled transactions that come from their evidence rows alone:
    ``sel`` the rows of ``ev`` that are theirs, ``g`` (on those rows) their transaction 0..n-1; ``file_idx``
    per row (:func:`tx_bad`).  Lists in ascending order."""
    phys = ev.i["physical_offset"][0]
    hi = np.full(n, -1, np.int64)
    np.maximum.at(hi, g[sel], phys[sel])
    fbase = np.zeros(n, np.int64)
    fbase[g[sel]] = bases[file_idx[sel]]
    copy = sel & (ev.c["role"] == COPY)
    half = copy & (ev.c["mechanism"] == HALF_Q)
    pairs = np.unique(np.stack([g[sel], phys[sel]], axis=1), axis=0) if sel.any() else np.zeros((0, 2), np.int64)
    return {"file_base": pa.array(fbase, pa.int64()), "max_offset": pa.array(hi, pa.int64()),
            "copy_offsets": _lists(g[copy], pa.array(phys[copy], pa.int64()), n),
            "half_offsets": _lists(g[half], pa.array(ev.i["queue_offset"][0][half], pa.int64()), n),
            "record_offsets": _lists(pairs[:, 0], pa.array(pairs[:, 1], pa.int64()), n)}


def _final_rows(txs, cand, at, bad, ev: Evidence, code, good_rows, bases, file_idx, gone: pa.Table,
                hco: int, oco: int, tx_ids: pa.Array) -> pa.Table:
    settled = (at >= 0) & ~bad[np.where(at >= 0, at, 0)]
    rows, tcode = cand[settled], at[settled]
    n = len(rows)
    slot = np.full(len(bad), -1, np.int64)
    slot[tcode] = np.arange(n)
    out = txs.take(pa.array(rows, pa.int64()))
    phys = ev.i["physical_offset"][0]
    g = slot[np.where(good_rows, code, 0)]
    sel = good_rows & (g >= 0)
    extra = tx_lists(ev, g, sel, n, bases, file_idx)
    # each dropped record of a transaction topic goes to one settled transaction: of those that have it, the
    # one with the smallest transaction id (so the distributed settle picks the same one)
    rank = np.empty(n, np.int64)
    rank[np.asarray(pc.sort_indices(tx_ids.take(pa.array(tcode, pa.int64()))), np.int64)] = np.arange(n)
    owner_rows = np.nonzero(sel)[0]
    off_of = phys[owner_rows]
    order = np.lexsort((rank[g[owner_rows]], off_of))
    first = order[np.r_[True, off_of[order][1:] != off_of[order][:-1]]] if len(order) else order
    owner = dict(zip(off_of[first].tolist(), g[owner_rows][first].tolist(), strict=True))
    cq = gone.filter(pc.fill_null(pc.is_in(gone.column("topic"), pa.array(CQ_TOPICS)), False)).select(
        list(_CQ_FIELDS))
    cq_owner = np.asarray([owner.get(o, -1) for o in cq.column("physical_offset").to_pylist()], np.int64)
    cq = cq.filter(pa.array(cq_owner >= 0))
    cq_owner = cq_owner[cq_owner >= 0]
    struct = pa.StructArray.from_arrays([cq.column(f).combine_chunks() for f in _CQ_FIELDS], list(_CQ_FIELDS))
    schema = STATE_FINAL.arrow_schema()
    extra.update({"cq_records": _lists(cq_owner, struct, n,
                                       np.asarray(cq.column("physical_offset").to_numpy(zero_copy_only=False))),
                  "half_consume_offset": pa.array([hco] * n, pa.int64()),
                  "op_consume_offset": pa.array([oco] * n, pa.int64())})
    return pa.Table.from_arrays([extra[f.name].cast(f.type) if f.name in extra else out.column(f.name)
                                 for f in schema], schema=schema)


def file_facts(gone: pa.Table, op_rows: pa.Table, bases: np.ndarray) -> Dict[str, dict]:
    """{file base: reducer._facts of the dropped records ``gone`` and op rows ``op_rows`` in that file}
    (sums, minima and maxima: the facts of parts merge into those of the whole, ``merge_facts_into``)."""
    out: Dict[str, dict] = {}
    if not gone.num_rows and not op_rows.num_rows:
        return out
    empty = _BySrc(RECON_INPUT.arrow_schema().empty_table())
    idx = np.searchsorted(bases, np.asarray(gone.column("physical_offset").to_numpy(zero_copy_only=False)),
                          "right") - 1
    op_idx = (np.searchsorted(bases, np.asarray(op_rows.column("physical_offset").to_numpy(zero_copy_only=False)),
                              "right") - 1) if op_rows.num_rows else np.zeros(0, np.int64)
    for k in np.union1d(np.unique(idx), np.unique(op_idx)).tolist():
        cl = gone.filter(pa.array(idx == k))
        out[str(int(bases[k]))] = _facts(cl, cl, op_rows.filter(pa.array(op_idx == k)), empty)
    return out


# ------------------------------------------------------------------------------------------------------------
# the next run: the carried rows back into the reduction
# ------------------------------------------------------------------------------------------------------------

def final_input(final: Optional[pa.Table], facts: Mapping[str, Mapping[str, dict]]) -> Optional[pa.Table]:
    """RECON_INPUT rows of the settled transactions: one ``facts`` row per broker and file, the consume-queue
    tuples of their dropped records (``cq_record``)."""
    parts = []
    schema = RECON_INPUT.arrow_schema()
    rows = [(b, json.dumps(d)) for b, files in facts.items() for d in files.values()]
    if rows:
        parts.append(input_table(anomalies=pa.table({"broker": [r[0] for r in rows],
                                                     "detail": [r[1] for r in rows]})))
        parts[-1] = parts[-1].set_column(0, "src", pa.array([FACTS_SRC] * len(rows), pa.string()))
    if final is not None and final.num_rows:
        cq = final.select(["broker", "cq_records"])
        flat = pc.list_flatten(cq.column("cq_records"))
        parent = pc.list_parent_indices(cq.column("cq_records"))
        if len(flat):
            t = pa.table({"broker": cq.column("broker").take(parent),
                          **{f: pc.struct_field(flat, f) for f in _CQ_FIELDS}})
            t = input_table(commitlog=t)
            parts.append(t.set_column(0, "src", pa.array([CQ_RECORD_SRC] * t.num_rows, pa.string())))
    return pa.concat_tables([p.cast(schema) for p in parts]) if parts else None


def final_keys(final: Optional[pa.Table]) -> pa.Table:
    """(broker, kind, key) rows later evidence would link a settled transaction by: ``k`` its transaction
    key, ``o`` a copy's CommitLog offset, ``h`` a half copy's queue offset, ``r`` a dropped record's offset."""
    parts: List[pa.Table] = []
    if final is None or not final.num_rows:
        return _keys([], [], [])
    b = final.column("broker")
    parts.append(_keys(b, "k", final.column("transaction_key")))
    for kind, col in (("o", "copy_offsets"), ("h", "half_offsets")):
        lists = final.column(col)
        parts.append(_keys(b.take(pc.list_parent_indices(lists)), kind, pc.list_flatten(lists)))
    recs = final.column("record_offsets")
    parts.append(_keys(b.take(pc.list_parent_indices(recs)), "r", pc.list_flatten(recs)))
    return pa.concat_tables(parts)


def _keys(broker, kind, key) -> pa.Table:
    n = len(broker)
    return pa.table({"broker": pa.array(broker, pa.string()) if not isinstance(broker, (pa.Array, pa.ChunkedArray))
                     else broker, "kind": pa.array([kind] * n if isinstance(kind, str) else kind, pa.string()),
                     "key": pc.cast(key, pa.string()) if n else pa.array([], pa.string())})


def reduced_keys(transactions: pa.Table, anomalies: pa.Table) -> pa.Table:
    """(broker, kind, key) rows of a reduction's outputs that would name a settled transaction (see
    final_keys): a transaction's key or the CommitLog offset it was prepared at (an END whose copy was
    dropped), an orphan op's half offset, a consume-queue finding's CommitLog offset."""
    t, a = transactions, anomalies
    rec = pc.fill_null(pc.equal(a.column("source"), "reconstruct"), False)
    o = a.filter(pc.fill_null(pc.and_(rec, pc.is_in(a.column("code"), pa.array(ORPHAN_CODES))), False))
    c = a.filter(pc.fill_null(pc.and_(rec, pc.is_in(a.column("code"), pa.array(CQ_CODES))), False))
    return pa.concat_tables([
        _keys(t.column("broker"), "k", t.column("transaction_key")),
        _keys(t.column("broker"), "o", t.column("prepared_commitlog_offset")),
        _keys(o.column("broker"), "h", o.column("queue_offset")),
        _keys(c.column("broker"), "r", c.column("physical_offset"))])


def self_keys(final: pa.Table) -> pa.Table:
    """reduced_keys of the settled rows themselves (a reduction's ``transactions`` holds them too)."""
    from schemas.audit import AUDIT_ANOMALIES

    return reduced_keys(final_transactions(final, {}), AUDIT_ANOMALIES.arrow_schema().empty_table())


def _counted(keys: pa.Table) -> pa.Table:
    keys = keys.filter(pc.is_valid(keys.column("key")))
    return keys.group_by(["broker", "kind", "key"]).aggregate([([], "count_all")])


def reopened(final: Optional[pa.Table], transactions: pa.Table, anomalies: pa.Table,
             profiles: Mapping[str, str], offsets: Mapping[str, Tuple[Optional[int], Optional[int]]]
             ) -> Dict[str, str]:
    """broker -> why later evidence or facts reach a settled transaction (empty: the carried rows stand).
    Arrow, driver: this run's outputs (``transactions`` with the settled rows appended) against the settled
    rows' keys; a key the settled rows give themselves counts only when some other row gives it too."""
    why: Dict[str, str] = {}
    if final is None or not final.num_rows:
        return why
    why.update(fact_changes(final, profiles, offsets))
    lost = pc.fill_null(pc.is_in(anomalies.column("source"), pa.array(LOST_SOURCES)), False)
    for b, w in discard_damage(final, pc.unique(anomalies.filter(lost).column("broker")).to_pylist()).items():
        why.setdefault(b, w)
    mine = _counted(reduced_keys(transactions, anomalies))
    own = _counted(self_keys(final)).rename_columns(["broker", "kind", "key", "own"])
    j = mine.join(own, ["broker", "kind", "key"], join_type="left outer")
    extra = j.filter(pc.greater(j.column("count_all"), pc.fill_null(j.column("own"), 0)))
    hits = extra.join(final_keys(final), ["broker", "kind", "key"], join_type="inner")
    for b, kind, key in zip(*(hits.column(c).to_pylist() for c in ("broker", "kind", "key")), strict=True):
        why.setdefault(b, f"a reduced row names settled transaction evidence ({kind} {key})")
    return why


def discard_damage(final: pa.Table, damaged: Sequence[str]) -> Dict[str, str]:
    """brokers of ``damaged`` (this run has CommitLog decoder findings on them) that carry settled DISCARDED
    rows: a DISCARDED state rests on no END or op anywhere after the transaction's first record, so a range
    lost anywhere above it (a later run's torn or garbled bytes) makes the state uncertain in a full audit
    (jobs/reconstruct/damage.py); such a broker is audited in full (and then settles no DISCARDED row)."""
    if not len(damaged):
        return {}
    return damaged_with_discards(discarded_brokers(final), damaged)


def damaged_with_discards(have: Collection[str], damaged: Sequence[str]) -> Dict[str, str]:
    """:func:`discard_damage` given the brokers with settled DISCARDED rows (``have``)."""
    return {b: "CommitLog decoder findings on a broker with settled DISCARDED transactions"
            for b in damaged if b in have}


def discarded_brokers(final: pa.Table) -> set:
    """The brokers with settled DISCARDED rows in ``final``."""
    disc = final.filter(pc.fill_null(pc.equal(final.column("state"), DISCARDED), False))
    return set(pc.unique(disc.column("broker")).to_pylist()) if disc.num_rows else set()


def fact_changes(final: pa.Table, profiles: Mapping[str, str],
                  offsets: Mapping[str, Tuple[Optional[int], Optional[int]]]) -> Dict[str, str]:
    """brokers whose profile differs from a settled row's, or whose consume offsets went below (or lost)
    the ones the rows settled under."""
    agg = final.group_by("broker").aggregate([("half_consume_offset", "max"), ("op_consume_offset", "max"),
                                             ("profile", "distinct")])
    return changed_facts(agg.to_pylist(), profiles, offsets)


def changed_facts(rows: Iterable[Mapping], profiles: Mapping[str, str],
                  offsets: Mapping[str, Tuple[Optional[int], Optional[int]]]) -> Dict[str, str]:
    """:func:`fact_changes` of the settled rows' per-broker aggregate: ``rows`` of broker,
    half_consume_offset_max, op_consume_offset_max, profile_distinct (one per broker)."""
    why = {}
    for row in rows:
        b = row["broker"]
        hco, oco = offsets.get(b, (None, None))
        if any(p != profiles.get(b) for p in row["profile_distinct"]):
            why[b] = f"profile now {profiles.get(b)}, settled as {sorted(row['profile_distinct'])}"
        elif hco is None or oco is None or hco < row["half_consume_offset_max"] \
                or oco < row["op_consume_offset_max"]:
            why[b] = (f"transaction consume offsets now half {hco} / op {oco}, below those the settled rows "
                      f"relied on")
    return why


__all__ = ["settle", "Settled", "tx_bad", "tx_lists", "inert_mask", "file_facts", "candidates", "consume_offsets", "final_input", "final_transactions", "final_keys",
           "reduced_keys", "self_keys", "reopened", "fact_changes", "changed_facts", "discard_damage",
           "damaged_with_discards", "discarded_brokers", "FACTS_SRC",
           "CQ_RECORD_SRC", "ORPHAN_CODES", "CQ_CODES", "FINAL_FLAGS", "LOST_SOURCES"]
