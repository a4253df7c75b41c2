"""The reconstruction reducer: RECON_INPUT rows (schemas/recon.py) -> the five output tables, Spark-free.

``reduce_input(table, params, profile_override)`` takes one Arrow table holding every input frame tagged by
``src`` (any number of brokers; a Spark task gets one broker's rows, a notebook or test may pass everything)
and returns ``{"transactions", "check_back", "recovery", "anomalies", "profiles": pyarrow.Table}`` with the
schemas of ``schemas/audit.py``.  ``input_table(commitlog=..., ...)`` builds that table from per-source Arrow
tables (each ``broker`` + the columns of its schemas.store table).

Per broker: facts (record counts, bounds, consume offsets) -> profile and thresholds; evidence rows
(jobs/reconstruct/evidence.py, columns) linked by two key joins; jobs/reconstruct/rules.py groups them by transaction id once and
derives state, deadline and flags as column expressions; work lists and findings follow.  Nothing loops over
records or transactions in Python: only findings are formatted one by one.  The rules are documented
in jobs/reconstruct/spark.py and jobs/reconstruct/flags.py; this module and txrules.py are their one implementation.

``check_back.urgency_rank`` is ranked over the rows given (one broker in a Spark task): jobs/reconstruct/spark.py
re-ranks across brokers.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import Dict, List, Mapping, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct import rules as txrules
from jobs.reconstruct import split as txsplit
from jobs.reconstruct import worklists
from jobs.reconstruct.damage import (
    cq_lost,
    damaged_ranges,
    past_end_of,
    redolog_gap,
    with_lost,
    with_redolog_gap,
)
from jobs.reconstruct.evidence import (
    COPY,
    DISCARD,
    END,
    OP,
    Evidence,
    _np,
    body_texts,
    cross_refs,
    is_system_topic_mask,
    link_ends,
    link_ops,
    op_rows_evidence,
    record_evidence,
    redolog_evidence,
    statetable_evidence,
)
from jobs.reconstruct.groups import Groups, ints, key_ids, lookup_ids, str_rank, strings
from jobs.reconstruct.params import (
    CHECK_GROUP,
    DISCARD_TOPIC,
    FILE_LEVEL_ANOMALIES,
    HALF_TOPIC,
    LONG_MAX,
    OP_TOPIC,
    TX_SYSTEM_TOPICS,
    ParamsArg,
    check_override,
    override_for,
    params_by_broker,
)
from schemas.audit import AUDIT_ANOMALIES, TRANSACTIONS
from schemas.audit import PROFILES as PROFILES_TABLE
from schemas.recon import OP_BODY_COLUMNS, RECON_INPUT
from txlog_io.unitchain import drop_misplaced_units

SOURCES = ("commitlog", "op_body", "consumequeue", "statetable", "redolog", "consumer_offsets", "anomaly",
           "bounds", "facts", "cq_record")
_FACT_SUMS = ("n_half", "n_op", "n_discard", "n_prep", "n_prep_uk", "n_prep_qo", "n_v2", "n_txid", "n_st",
              "n_redo", "n_comma", "n_cq")
_FACT_MIN = ("min_commitlog_offset", "min_half_queue_offset")
_FACT_MAX = ("snapshot_ms", "half_consume_offset", "op_consume_offset")
#: src of carried facts rows (JSON in ``detail``: the counts of records an incremental state no longer
#: carries, jobs/reconstruct/settle.py) and of carried records' consume-queue tuples
FACTS_SRC, CQ_RECORD_SRC = "facts", "cq_record"
_CQ_COLUMNS = ["topic", "physical_offset", "queue_id", "queue_offset", "total_size"]


# ------------------------------------------------------------------------------------------------------------
# input
# ------------------------------------------------------------------------------------------------------------

def input_table(**sources: Optional[pa.Table]) -> pa.Table:
    """RECON_INPUT from per-source tables: ``commitlog``, ``op_bodies``, ``consumequeue``, ``statetable``,
    ``redolog``, ``consumer_offsets``, ``anomalies``, ``commitlog_bounds`` (each optional but commitlog)."""
    names = {"op_bodies": "op_body", "anomalies": "anomaly", "commitlog_bounds": "bounds"}
    schema = RECON_INPUT.arrow_schema()
    parts = []
    for key, tbl in sources.items():
        if tbl is None:
            continue
        src = names.get(key, key)
        if src not in SOURCES:
            raise ValueError(f"unknown reconstruction input {key!r}")
        n = tbl.num_rows
        cols = []
        for f in schema:
            if f.name == "src":
                cols.append(pa.array([src] * n, f.type))
            elif f.name in tbl.column_names:
                cols.append(tbl.column(f.name).cast(f.type))
            elif f.name == "queue_id" and src == "op_body":
                cols.append(pa.array([0] * n, f.type))
            else:
                cols.append(pa.nulls(n, f.type))
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    return pa.concat_tables(parts) if parts else schema.empty_table()


def _src(table: pa.Table, src: str) -> pa.Table:
    return table.filter(pc.equal(table.column("src"), src))


class _BySrc:
    """One broker's input rows split by ``src``, each part in input order.  input_table concatenates the
    sources one after the other, so each usually is one run of rows: a slice (no copy) instead of a filter of
    every column per source; a source in several runs (rows given in another order) is filtered."""

    def __init__(self, table: pa.Table):
        self.table, self.parts = table, {}
        if not table.num_rows:
            return
        enc = pc.dictionary_encode(table.column("src").combine_chunks())
        idx = np.asarray(enc.indices)
        starts = np.r_[0, np.nonzero(idx[1:] != idx[:-1])[0] + 1]
        run_src = idx[starts]
        names = enc.dictionary.to_pylist()
        if len(np.unique(run_src)) == len(run_src):
            ends = np.r_[starts[1:], len(idx)]
            self.parts = {names[k]: table.slice(a, e - a) for k, a, e in zip(run_src.tolist(), starts.tolist(),
                                                                               ends.tolist(), strict=True)}
        else:
            self.parts = {name: _src(table, name) for name in names}

    def __getitem__(self, src: str) -> pa.Table:
        got = self.parts.get(src)
        return got if got is not None else self.table.slice(0, 0)


def _count(t: pa.Table, mask) -> int:
    return int(np.count_nonzero(_np(mask))) if t.num_rows else 0


def _relevant(t: pa.Table) -> pa.Table:
    """The transaction-relevant CommitLog rows (ordinary records only feed the counts); op bodies only on
    op records."""
    rel = pc.fill_null(pc.or_kleene(pc.is_in(t.column("topic"), pa.array(TX_SYSTEM_TOPICS)),
                                    pc.not_equal(t.column("transaction_type"), "NOT")), False)
    if t.num_rows and not pc.all(rel).as_py():     # the one-job read sends relevant records only
        t = t.filter(rel)
    is_op = pc.fill_null(pc.equal(t.column("topic"), OP_TOPIC), False)
    body = t.column("body")
    return t.set_column(t.schema.get_field_index("body"), "body",
                        pc.if_else(is_op, body, pa.nulls(t.num_rows, body.type)))


# ------------------------------------------------------------------------------------------------------------
# per-broker facts
# ------------------------------------------------------------------------------------------------------------

def _facts(cl: pa.Table, records: pa.Table, op_rows: pa.Table, sub: "_BySrc") -> dict:
    """Counts and bounds of one broker (jobs/txrules.detect reads them)."""
    d = {k: 0 for k in _FACT_SUMS}
    if cl.num_rows:
        base = pc.subtract(cl.column("physical_offset"), cl.column("file_position"))
        d["min_commitlog_offset"] = pc.min(base).as_py()
        d["n_v2"] = _count(cl, pc.equal(cl.column("magic_version"), 2))
        d["snapshot_ms"] = pc.max(cl.column("store_timestamp")).as_py()
    topic, ttype = records.column("topic"), records.column("transaction_type")
    half = pc.equal(topic, HALF_TOPIC)
    d["n_half"] = _count(records, half)
    d["n_txid"] = _count(records, pc.and_(half, pc.is_valid(records.column("transaction_id"))))
    mhq = pc.min(pc.if_else(half, records.column("queue_offset"), None)).as_py() if records.num_rows else None
    if mhq is not None:
        d["min_half_queue_offset"] = mhq
    d["n_op"] = _count(records, pc.equal(topic, OP_TOPIC))
    d["n_discard"] = _count(records, pc.equal(topic, DISCARD_TOPIC))
    prep = (_np(pc.equal(ttype, "PREPARED")) & ~is_system_topic_mask(strings(topic))
            & _np(pc.is_valid(topic))) if records.num_rows else np.zeros(0, bool)
    d["n_prep"] = int(prep.sum())
    d["n_prep_uk"] = int((prep & _np(pc.is_valid(records.column("uniq_key")))).sum())
    d["n_prep_qo"] = int((prep & _np(pc.greater(pc.fill_null(records.column("queue_offset"), 0), 0))).sum())
    if op_rows.num_rows:
        d["n_comma"] = _count(op_rows, pc.match_substring(body_texts(op_rows.column("body").combine_chunks()),
                                                          ","))
    for s, fact in (("statetable", "n_st"), ("redolog", "n_redo"), ("consumequeue", "n_cq")):
        d[fact] += sub[s].num_rows
    bounds = sub["bounds"]
    for m, n_cq in zip(*(bounds.column(c).to_pylist() for c in ("min_commitlog_offset", "n_cq")),
                       strict=True):
        if m is not None and (d.get("min_commitlog_offset") is None or m < d["min_commitlog_offset"]):
            d["min_commitlog_offset"] = m
        d["n_cq"] += n_cq or 0
    for js in sub[FACTS_SRC].column("detail").to_pylist():
        merge_facts_into(d, json.loads(js))
    co = sub["consumer_offsets"]
    for topic, group, qid, off in zip(*(co.column(c).to_pylist() for c in ("topic", "group", "queue_id",
                                                                            "offset")), strict=True):
        if group == CHECK_GROUP and qid == 0 and off is not None:
            key = {HALF_TOPIC: "half_consume_offset", OP_TOPIC: "op_consume_offset"}.get(topic)
            if key is not None:
                d[key] = max(d.get(key, off), off)
    return d


def merge_facts_into(into: dict, d: Mapping) -> dict:
    """``d``'s facts added to ``into``: counts add up, bounds take their min / max, consume offsets their
    max."""
    for k, v in d.items():
        if v is None:
            continue
        if k not in into or into[k] is None:
            into[k] = v
        elif k in _FACT_MIN:
            into[k] = min(into[k], v)
        elif k in _FACT_MAX:
            into[k] = max(into[k], v)
        else:
            into[k] += v
    return into


def cq_records(records: pa.Table, sub: "_BySrc") -> pa.Table:
    """The records the consume-queue comparison reads: ``records``' + the carried ``cq_record`` tuples."""
    carried = sub[CQ_RECORD_SRC]
    if not carried.num_rows:
        return records
    return pa.concat_tables([records.select(_CQ_COLUMNS), carried.select(_CQ_COLUMNS)])


# ------------------------------------------------------------------------------------------------------------
# findings
# ------------------------------------------------------------------------------------------------------------

def _fmt(v) -> str:
    return "null" if v is None else str(v)


def _cq_mismatches(broker: str, records: pa.Table, units: pa.Table, facts: Mapping,
                   corrupt: Optional[np.ndarray] = None) -> List[dict]:
    """Consume-queue units of the half/op/discard queues vs the CommitLog records of those topics, both ways,
    per CommitLog offset: NO_RECORD / NO_UNIT / DIFFERS (see jobs/reconstruct/spark.py).  Where several units (or
    records) share an offset the largest (topic, queue id, queue offset, size) tuple stands for them, nulls
    lowest (Spark's struct ordering for max).

    ``length`` (a lost range, ``damage.cq_lost``) is the unit's size for a unit with no record of its topic,
    and for one unit whose record is there but was damaged after the broker wrote it (``_rewritten``);
    ``corrupt``: ``record_finding_offsets`` of the broker's decoder findings."""
    # the compared columns only: filtering the wide input tables cost more than the comparison
    units = units.select(["topic", "commitlog_offset", "queue_id", "queue_offset", "size"])
    records = records.select(["topic", "physical_offset", "queue_id", "queue_offset", "total_size"])
    units = units.filter(pc.fill_null(pc.is_in(units.column("topic"), pa.array(TX_SYSTEM_TOPICS)), False))
    records = records.filter(pc.fill_null(pc.is_in(records.column("topic"), pa.array(TX_SYSTEM_TOPICS)),
                                          False))
    nu, nr = units.num_rows, records.num_rows
    if nu + nr == 0:
        return []
    off = ints(pa.concat_arrays([units.column("commitlog_offset").combine_chunks().cast(pa.int64()),
                                 records.column("physical_offset").combine_chunks().cast(pa.int64())]))
    topic = pa.concat_arrays([strings(units.column("topic")), strings(records.column("topic"))])
    qid = ints(pa.concat_arrays([units.column("queue_id").combine_chunks().cast(pa.int64()),
                                 records.column("queue_id").combine_chunks().cast(pa.int64())]))
    qo = ints(pa.concat_arrays([units.column("queue_offset").combine_chunks().cast(pa.int64()),
                                records.column("queue_offset").combine_chunks().cast(pa.int64())]))
    size = ints(pa.concat_arrays([units.column("size").combine_chunks().cast(pa.int64()),
                                  records.column("total_size").combine_chunks().cast(pa.int64())]))
    trank = str_rank(topic)
    kid = key_ids(off)
    g = Groups(kid, int(kid.max()) + 1)
    is_unit = np.arange(nu + nr) < nu
    tup = (trank, qid, qo, size)
    # largest tuple, nulls low: keys reversed (~) on (valid, value) pairs
    order = [k for v, ok in tup for k in (~ok.astype(np.int64), ~np.where(ok, v, 0))]
    unit_row, rec_row = g.pick(is_unit, *order), g.pick(~is_unit, *order)
    n_units = g.count(is_unit)
    first_row = g.pick(np.ones(nu + nr, bool))
    both = (unit_row >= 0) & (rec_row >= 0)
    same = both.copy()
    for v, ok in tup:
        ui, ri = np.where(both, unit_row, 0), np.where(both, rec_row, 0)
        same &= (ok[ui] == ok[ri]) & (~ok[ui] | (v[ui] == v[ri]))
    report = ~(same & (n_units <= 1))
    if not facts.get("n_cq", 0) > 0:
        report &= unit_row >= 0             # NO_UNIT needs consume queues to exist at all
    out = []
    fb = facts
    mco = fb.get("min_commitlog_offset")
    keys = np.nonzero(report)[0]
    keys = keys[np.argsort(first_row[keys], kind="stable")]
    rows = np.unique(np.concatenate([unit_row[keys], rec_row[keys]]))
    rows = rows[rows >= 0]
    tl = dict(zip(rows.tolist(), topic.take(pa.array(rows, pa.int64())).to_pylist(), strict=True))
    val = (lambda col, x: int(col[0][x]) if col[1][x] else None)
    for k in keys:
        u, r = int(unit_row[k]), int(rec_row[k])
        unit = None if u < 0 else (tl[u], val(qid, u), val(qo, u), val(size, u))
        rec = None if r < 0 else (tl[r], val(qid, r), val(qo, r), val(size, r))
        o = val(off, u if u >= 0 else r)
        if rec is None:
            assert unit is not None         # every key has a unit or a record
            problem = "NO_RECORD"
            detail = (f"CQ unit {unit[0]}/{_fmt(unit[1])}@{_fmt(unit[2])}: no record of that topic at "
                      f"CommitLog offset {_fmt(o)}")
        elif unit is None:
            problem = "NO_UNIT"
            detail = (f"record {rec[0]}/{_fmt(rec[1])}@{_fmt(rec[2])} at CommitLog offset {_fmt(o)} "
                      f"has no CQ unit")
        elif unit != rec or n_units[k] > 1:
            problem = "DIFFERS"
            detail = (f"CQ unit {unit[0]}/{_fmt(unit[1])}@{_fmt(unit[2])} size {_fmt(unit[3])} "
                      f"({n_units[k]} units) vs record {rec[0]}/{_fmt(rec[1])}@{_fmt(rec[2])} size "
                      f"{_fmt(rec[3])} at CommitLog offset {_fmt(o)}")
        else:
            continue
        deleted = problem == "NO_RECORD" and o is not None and mco is not None and o < mco
        where = unit if unit is not None else rec
        assert where is not None
        # a unit with no record of its topic, or with a record there that is not as it was written: the bytes
        # its size names are a lost range (damage.cq_lost)
        gone = problem == "NO_RECORD" and not deleted or problem == "DIFFERS" and n_units[k] <= 1 \
            and _rewritten(unit, rec, o, corrupt)
        lost = unit[3] if gone and unit is not None else None
        out.append({"broker": broker, "code": "EVIDENCE_IN_DELETED_RANGE" if deleted else "CQ_MISMATCH",
                    "physical_offset": o, "topic": where[0], "queue_id": where[1], "queue_offset": where[2],
                    "detail": detail, "length": lost})
    return out


def _rewritten(unit, rec, offset: Optional[int], corrupt: Optional[np.ndarray]) -> bool:
    """Whether the record one unit names differs from it because the record's bytes changed, not the unit's.

    Either the record has a record-level decoder finding (its body or properties fail their CRC: it was
    damaged in place, so its header fields, which no CRC covers, are no evidence), or the unit matches the
    record's topic and size exactly but names another queue id.  A unit holds only a CommitLog offset, a size
    and a tag hash; its queue id is its directory's name.  Damage to a unit moves its offset or size: it names
    the start of a record of its own topic and size only by accident, and a hole in a queue shifts queue
    offsets, not queue ids.  A record whose queue id changed names halves of another queue (an op) or is no
    half of its own (a half)."""
    if unit is None or rec is None or offset is None:
        return False
    if unit[0] == rec[0] and unit[3] == rec[3] and unit[1] != rec[1]:
        return True
    if corrupt is None or not len(corrupt):
        return False
    i = int(np.searchsorted(corrupt, offset, "left"))
    return i < len(corrupt) and int(corrupt[i]) < offset + max(rec[3] or 0, 1)


def record_finding_offsets(anomalies: pa.Table) -> np.ndarray:
    """The sorted CommitLog offsets of a broker's record-level decoder findings (source commitlog, not a
    file-level kind): where a record was framed and read but its bytes fail a check."""
    kind, phys = anomalies.column("kind"), anomalies.column("physical_offset")
    sel = pc.and_(pc.and_(pc.is_valid(phys), pc.equal(anomalies.column("source"), "commitlog")),
                  pc.invert(pc.is_in(kind, pa.array(sorted(_FILE_LEVEL)))))
    return np.sort(np.asarray(phys.filter(pc.fill_null(sel, False)).cast(pa.int64())))


_EVIDENCE_ROLES = (COPY, END, OP, DISCARD)
_FILE_LEVEL = frozenset(FILE_LEVEL_ANOMALIES)


def _tx_rows(ev: Evidence) -> np.ndarray:
    return ~np.asarray(ev.s["tx"].is_null()) if ev.n else np.zeros(0, bool)


def _corrupt_rows(ev: Evidence, offs: np.ndarray) -> np.ndarray:
    """Evidence rows (of a transaction) that contain a record-level CommitLog decoder finding (``offs``:
    :func:`record_finding_offsets` of the broker's findings)."""
    if not len(offs):
        return np.zeros(0, np.int64)
    lo, ok = ev.i["physical_offset"]
    ts, ts_ok = ev.i["total_size"]
    cand = _tx_rows(ev) & np.isin(ev.c["role"], _EVIDENCE_ROLES) & ok
    hi = np.where(ts_ok, lo + ts, lo + 1)
    i = np.searchsorted(offs, lo, "left")
    nxt = offs[np.minimum(i, len(offs) - 1)]
    return np.nonzero(cand & (i < len(offs)) & (nxt < np.maximum(hi, lo + 1)))[0]


def _uncommitted_rows(ev: Evidence, anomalies: pa.Table) -> np.ndarray:
    """DLedger: evidence rows at or after the first message past the checkpoint's committedIndex (one
    DLEDGER_UNCOMMITTED finding per broker names it; the log is ordered)."""
    first = pc.min(anomalies.column("physical_offset").filter(
        pc.fill_null(pc.equal(anomalies.column("kind"), "DLEDGER_UNCOMMITTED"), False))).as_py() \
        if anomalies.num_rows else None
    if first is None:
        return np.zeros(0, np.int64)
    lo, ok = ev.i["physical_offset"]
    return np.nonzero(_tx_rows(ev) & np.isin(ev.c["role"], _EVIDENCE_ROLES) & ok & (lo >= first))[0]


def _reconstruct_finding(broker, code, physical_offset, queue_id, queue_offset, detail, topic=OP_TOPIC,
                         length=None):
    return {"broker": broker, "code": code, "source": "reconstruct", "physical_offset": physical_offset,
            "topic": topic, "queue_id": queue_id, "queue_offset": queue_offset, "transaction_key": None,
            "file": None, "position": None, "length": length, "detail": detail}


def cq_finding(m: Mapping) -> dict:
    """A consume-queue comparison result (``_cq_mismatches``) as an AUDIT_ANOMALIES row."""
    return _reconstruct_finding(m["broker"], m["code"], m["physical_offset"], m["queue_id"], m["queue_offset"],
                                m["detail"], m["topic"], m["length"])


def _decoder_finding(a: dict) -> dict:
    tail = " ".join(s for s in (None if a["expected"] is None else f"expected {a['expected']}",
                                None if a["actual"] is None else f"actual {a['actual']}") if s is not None)
    detail = ": ".join(s for s in (a["detail"], tail) if s is not None)
    return {"broker": a["broker"], "code": a["kind"], "source": a["source"],
            "physical_offset": a["physical_offset"], "topic": None, "queue_id": None, "queue_offset": None,
            "transaction_key": None, "file": a["file"], "position": a["position"], "length": a["length"],
            "detail": detail}


# ------------------------------------------------------------------------------------------------------------
# top level
# ------------------------------------------------------------------------------------------------------------

def reduce_input(table: pa.Table, params: ParamsArg = None, profile_override=None,
                 critical_within_ms: int = 60000,
                 op_bodies_given: Optional[bool] = None, final: Optional[pa.Table] = None) -> Dict[str, pa.Table]:
    """RECON_INPUT rows (any brokers) -> {output name: Arrow table} (see the module docstring).

    ``final``: settled transactions an incremental state carries as rows (schemas.state.STATE_FINAL, their
    facts and consume-queue tuples among ``table``'s rows): appended to ``transactions`` at this run's as-of
    (:func:`final_transactions`).

    ``op_bodies_given``: whether the caller supplied an op_bodies input (then an op record without a row in it
    is OP_BODY_MISSING); None = whether ``table`` has ``op_body`` rows.  Otherwise op bodies come from the
    op records' own ``body``."""
    check_override(profile_override)
    has_op_input = _has_src(table, "op_body") if op_bodies_given is None else op_bodies_given
    has_cq = _has_src(table, "consumequeue")
    brokers = pc.unique(table.column("broker")).to_pylist() if table.num_rows else []
    threads = txsplit.parts_for(table.num_rows)
    with txsplit.arrow_allocator(), \
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="txreduce") if threads > 1 \
            else nullcontext() as pool:
        return _reduce(table, brokers, params, profile_override, critical_within_ms, has_op_input, has_cq,
                       pool, final)


def as_of_ms(params, facts: Mapping) -> Optional[int]:
    """The audit time of a broker: its params' as_of, else its newest store time (as the rules take it)."""
    return params.as_of_ms if params is not None and params.as_of_ms is not None else facts.get("snapshot_ms")


def final_transactions(final: Optional[pa.Table], as_of: Mapping[str, Optional[int]]) -> pa.Table:
    """TRANSACTIONS rows of carried settled transactions (schemas.state.STATE_FINAL) at this run's as-of:
    ``as_of_ms`` and ``age_ms`` recomputed, every other column as the run that settled them reduced it."""
    schema = TRANSACTIONS.arrow_schema()
    if final is None or not final.num_rows:
        return schema.empty_table()
    a = pa.array([as_of.get(b) for b in final.column("broker").to_pylist()], pa.int64())
    cols = {"as_of_ms": a, "age_ms": pc.subtract(a, final.column("born_timestamp"))}
    return pa.Table.from_arrays([cols[f.name] if f.name in cols else final.column(f.name).cast(f.type)
                                 for f in schema], schema=schema)


def _reduce(table, brokers, params, profile_override, critical_within_ms, has_op_input, has_cq,
            pool, final=None) -> Dict[str, pa.Table]:
    per = []
    for b in brokers:
        sub = table if len(brokers) == 1 else table.filter(pc.equal(table.column("broker"), b))
        per.append(_reduce_broker(b, sub, has_op_input, has_cq, pool, settled_offsets(final, b)))
    profiles = {b: txrules.profile_row(b, p["facts"], override_for(profile_override, b))
                for b, p in zip(brokers, per, strict=True)}
    broker_params = params_by_broker(params, {b: p["profile"] for b, p in profiles.items()})
    tx_tables, findings = [], []
    for b, p in zip(brokers, per, strict=True):
        uncertain: list = []
        tx_tables.append(txsplit.transactions(b, p["evidence"], p["facts"], profiles[b]["profile"],
                                              broker_params.get(b), p["problems"], p["damaged"],
                                              pool=pool, findings=uncertain))
        if final is not None and final.num_rows:
            mine = final.filter(pc.equal(final.column("broker"), b))
            tx_tables.append(final_transactions(mine, {b: as_of_ms(broker_params.get(b), p["facts"])}))
        findings += p["findings"]
        findings += [row for t in uncertain for row in t.to_pylist()]
    tx = pa.concat_tables(tx_tables) if tx_tables else TRANSACTIONS.arrow_schema().empty_table()
    return {
        "transactions": tx,
        "check_back": worklists.check_back(tx, critical_within_ms),
        "recovery": worklists.recovery(tx),
        "anomalies": _arrow(findings, AUDIT_ANOMALIES),
        "profiles": _arrow(list(profiles.values()), PROFILES_TABLE),
    }


def op_rows_of(sub: "_BySrc", records: pa.Table, has_op_input: bool) -> pa.Table:
    """The op records' OP_BODY_COLUMNS: the ``op_body`` input when given, else the op topic's relevant
    records that carry a body."""
    if has_op_input:
        return sub["op_body"].select(list(OP_BODY_COLUMNS))
    is_op = pc.and_(pc.fill_null(pc.equal(records.column("topic"), OP_TOPIC), False),
                    pc.is_valid(records.column("body")))
    return records.filter(is_op).select(list(OP_BODY_COLUMNS))


def settled_offsets(final: Optional[pa.Table], broker: str) -> Optional[pa.Array]:
    """The CommitLog offsets of the records of ``broker``'s carried settled transactions (STATE_FINAL's
    ``record_offsets``), or None: records read by an earlier run, no longer among this run's input."""
    if final is None or not final.num_rows:
        return None
    mine = final.filter(pc.equal(final.column("broker"), broker))
    return pc.list_flatten(mine.column("record_offsets")).combine_chunks().cast(pa.int64())


def first_at_or_after(offsets: pa.Array, ends) -> List[int]:
    """For each of ``ends``, the smallest of ``offsets`` at or after it (ends with none left out), distinct and
    ascending: of a run's settled records, the only ones that can stop a torn end's range."""
    at = np.unique(np.asarray(offsets, np.int64))
    i = np.searchsorted(at, np.asarray(list(ends), np.int64))
    return [int(p) for p in np.unique(at[i[i < len(at)]])]


def records_read(cl: pa.Table, settled: Optional[pa.Array]) -> pa.Table:
    """``physical_offset`` of every record read: this run's ``cl`` and the settled transactions' (for
    ``damage.past_end_of``: a unit pointing at a settled record points at a record that was read)."""
    phys = cl.column("physical_offset").cast(pa.int64())
    if settled is None or not len(settled):
        return pa.table({"physical_offset": phys})
    return pa.table({"physical_offset": pa.chunked_array(phys.chunks + [settled], pa.int64())})


def _reduce_broker(b: str, sub: pa.Table, has_op_input: bool, has_cq: bool,
                   pool: Optional[ThreadPoolExecutor] = None, settled: Optional[pa.Array] = None) -> dict:
    """One broker's facts, linked evidence, problem rows and findings (everything but the profile-dependent
    rules).  With a ``pool`` the findings side (facts, consume-queue comparison, missing bodies) runs in a
    worker thread while this one builds and links the evidence: the two share only their inputs.
    ``settled``: ``settled_offsets`` of the carried settled transactions."""
    sub = _BySrc(sub)
    cl = sub["commitlog"]
    records = _relevant(cl)
    op_rows = op_rows_of(sub, records, has_op_input)
    anomalies = sub["anomaly"]
    corrupt = record_finding_offsets(anomalies)

    def side():
        facts = _facts(cl, records, op_rows, sub)
        decoder_findings = anomalies.select(["kind", "source", "physical_offset", "file", "position",
                                             "length", "detail", "expected", "actual"]).to_pylist()
        cqm = []
        if has_cq:
            units = drop_misplaced_units(sub["consumequeue"], (dict(a, broker=b) for a in decoder_findings))
            cqm = _cq_mismatches(b, cq_records(records, sub), units, facts, corrupt)
        return facts, decoder_findings, cqm, _missing_bodies(b, records, op_rows, has_op_input)

    later = pool.submit(side) if pool is not None else None
    got = None if later is not None else side()
    ev = Evidence.concat([record_evidence(records), op_rows_evidence(op_rows),
                          statetable_evidence(sub["statetable"]),
                          redolog_evidence(sub["redolog"])])
    link_ends(ev)
    ev = link_ops(ev)
    xref = cross_refs(ev)
    if xref.n:
        ev = Evidence.concat([ev, xref])
    if later is not None:
        got = later.result()
    assert got is not None
    facts, decoder_findings, cqm, missing_bodies = got
    findings: List[dict] = []
    problems = []
    if has_cq:
        findings.extend(cq_finding(m) for m in cqm)
        for code in ("CQ_MISMATCH", "EVIDENCE_IN_DELETED_RANGE"):
            offs = [m["physical_offset"] for m in cqm if m["code"] == code]
            if offs:
                at = (np.array([0 if o is None else o for o in offs], np.int64),
                      np.array([o is not None for o in offs]))
                mine, theirs = lookup_ids([ev.i["physical_offset"]], [at])
                problems.append((np.nonzero(_tx_rows(ev) & np.isin(mine, theirs))[0], code))
    problems.append((_corrupt_rows(ev, corrupt), "CORRUPT_RECORD"))
    problems.append((_uncommitted_rows(ev, anomalies), "EVIDENCE_NOT_COMMITTED"))
    findings.extend(_orphan_ops(b, ev, facts))
    findings.extend(missing_bodies)
    findings.extend(_decoder_finding(dict(a, broker=b)) for a in decoder_findings)
    return {"facts": facts, "evidence": ev, "problems": problems, "findings": findings,
            "damaged": with_lost(with_redolog_gap(
                damaged_ranges(anomalies, past_end_of(records_read(cl, settled),
                                                      sub["consumequeue"] if has_cq else None)),
                redolog_gap(ev.c["role"], ev.c["mechanism"], ev.i["physical_offset"])), cq_lost(cqm))}


def _orphan_ops(b: str, ev: Evidence, facts: Mapping) -> List[dict]:
    rows = np.nonzero((ev.c["role"] == OP) & ~_tx_rows(ev))[0]
    if not len(rows):
        return []
    out = []
    col = (lambda name: [int(v) if ok else None for v, ok in zip(ev.i[name][0][rows].tolist(),
                                                                 ev.i[name][1][rows].tolist(), strict=True)])
    pieces = ev.s["piece"].take(pa.array(rows, pa.int64())).to_pylist()
    for phys, qid, qo, ho, piece in zip(col("physical_offset"), col("queue_id"), col("queue_offset"),
                                        col("half_offset"), pieces, strict=True):
        out.append(_orphan_op(b, phys, qid, qo, ho, piece, facts))
    return out


def _missing_bodies(b: str, records: pa.Table, op_rows: pa.Table, has_op_input: bool) -> List[dict]:
    """OP_BODY_MISSING: op records without a body (none given for them, or none read)."""
    ops = records.filter(pc.fill_null(pc.equal(records.column("topic"), OP_TOPIC), False))
    if has_op_input:
        mine, given = lookup_ids([ints(ops.column("physical_offset"))],
                                 [ints(op_rows.column("physical_offset"))])
        missing = ops.filter(pa.array(~np.isin(mine, given)))
    else:
        missing = ops.filter(pc.is_null(ops.column("body")))
    return [_reconstruct_finding(b, "OP_BODY_MISSING", r["physical_offset"], r["queue_id"], r["queue_offset"],
                                 f"op record at op-queue offset {_fmt(r['queue_offset'])}: body not provided")
            for r in missing.select(["physical_offset", "queue_id", "queue_offset"]).to_pylist()]


def _has_src(table: pa.Table, src: str) -> bool:
    return bool(pc.any(pc.equal(table.column("src"), src)).as_py()) if table.num_rows else False


def _orphan_op(broker, physical_offset, queue_id, queue_offset, half_offset, piece, fb: Mapping) -> dict:
    mhq = fb.get("min_half_queue_offset")
    if half_offset is None:
        code = "OP_BODY_UNPARSABLE"
        detail = f"op at op-queue offset {_fmt(queue_offset)}: body piece '{piece}' is not a number"
    elif half_offset < (mhq if mhq is not None else LONG_MAX):
        code = "EVIDENCE_IN_DELETED_RANGE"
        detail = (f"op at op-queue offset {_fmt(queue_offset)} names half offset {half_offset}, below "
                  f"the oldest retained half record")
    else:
        code = "OP_WITHOUT_HALF"
        detail = (f"op at op-queue offset {_fmt(queue_offset)} names half offset {half_offset}: no half "
                  f"record has it")
    return _reconstruct_finding(broker, code, physical_offset, queue_id, half_offset, detail)


def _arrow(rows: List[dict], table) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=table.arrow_schema())


__all__ = ["reduce_input", "input_table", "SOURCES", "final_transactions", "merge_facts_into", "as_of_ms",
           "settled_offsets", "records_read", "cq_finding"]
