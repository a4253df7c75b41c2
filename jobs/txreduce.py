"""The reconstruction reducer: RECON_INPUT rows (schemas/recon.py) -> the five output tables, Spark-free.

``reduce_input(table, params, profile_override)`` takes one Arrow table holding every input frame tagged by
``src`` (any number of brokers; a Spark task gets one broker's rows, a notebook or test may pass everything)
and returns ``{"transactions", "check_back", "recovery", "anomalies", "profiles": pyarrow.Table}`` with the
schemas of ``schemas/audit.py``.  ``input_table(commitlog=..., ...)`` builds that table from per-source Arrow
tables (each ``broker`` + the columns of its schemas.store table).

Per broker: facts (record counts, bounds, consume offsets) -> profile and thresholds; evidence rows
(jobs/txevidence.py) linked by two dictionary passes; one pass groups them by transaction id and
jobs/txrules.py derives state, deadline and flags; work lists and findings follow.  The rules are documented
in jobs/reconstruct.py and jobs/flags.py; this module and txrules.py are their one implementation.

``check_back.urgency_rank`` is ranked over the rows given (one broker in a Spark task): jobs/reconstruct.py
re-ranks across brokers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Dict, Iterable, List, Mapping, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs import txrules
from jobs.txevidence import (
    COPY, DISCARD, END, OP, PROBLEM, Ev, body_text, is_system_topic, link_ends,
    link_ops, op_evidence, record_evidence, redolog_evidence, statetable_evidence,
)
from jobs.txparams import (
    CHECK_GROUP, FILE_LEVEL_ANOMALIES, HALF_TOPIC, LONG_MAX, OP_TOPIC, TX_SYSTEM_TOPICS, ParamsArg,
    check_override, override_for, params_by_broker,
)
from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES as PROFILES_TABLE, RECOVERY, TRANSACTIONS
from schemas.recon import RECON_INPUT
from txlog_io.unitchain import drop_misplaced_units

SOURCES = ("commitlog", "op_body", "consumequeue", "statetable", "redolog", "consumer_offsets", "anomaly",
           "bounds")
_FACT_SUMS = ("n_half", "n_op", "n_discard", "n_prep", "n_prep_uk", "n_prep_qo", "n_v2", "n_txid", "n_st",
              "n_redo", "n_comma", "n_cq")
_FILE_LEVEL = frozenset(FILE_LEVEL_ANOMALIES)


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


def _rows(table: pa.Table, src: str, names: Iterable[str]) -> List[dict]:
    t = table.filter(pc.equal(table.column("src"), src))
    names = ["broker", *names]
    cols = [t.column(n).to_pylist() for n in names]
    return [dict(zip(names, vals)) for vals in zip(*cols)]


_CL_COLS = ("file_position", "physical_offset", "total_size", "magic_version", "body_crc_ok", "queue_id",
            "queue_offset", "transaction_type", "born_timestamp", "store_timestamp",
            "prepared_transaction_offset", "topic", "msg_id", "uniq_key", "keys", "pgroup", "real_topic",
            "real_qid", "transaction_check_times", "tran_prepared_queue_offset", "check_immunity_time_s",
            "transaction_id")


def _commitlog_rows(table: pa.Table):
    """(transaction-relevant rows with their op bodies, per-broker facts over every row) -- ordinary records
    only feed the counts, so they never become dicts."""
    t = table.filter(pc.equal(table.column("src"), "commitlog"))
    facts: Dict[str, dict] = {}
    if t.num_rows:
        g = pa.table({
            "broker": t.column("broker"),
            "base": pc.subtract(t.column("physical_offset"), t.column("file_position")),
            "v2": pc.cast(pc.equal(t.column("magic_version"), 2), pa.int64()),
            "ts": t.column("store_timestamp"),
        }).group_by("broker").aggregate([("base", "min"), ("v2", "sum"), ("ts", "max")])
        for b, base, v2, ts in zip(*(g.column(n).to_pylist() for n in ("broker", "base_min", "v2_sum",
                                                                           "ts_max"))):
            facts[b] = {"min_commitlog_offset": base, "n_v2": v2 or 0, "snapshot_ms": ts}
    ttype = t.column("transaction_type")
    rel = pc.or_kleene(pc.is_in(t.column("topic"), pa.array(TX_SYSTEM_TOPICS)),
                       pc.not_equal(ttype, "NOT"))
    t = t.filter(pc.fill_null(rel, False))
    names = ["broker", *_CL_COLS]
    cols = [t.column(n).to_pylist() for n in names]
    bodies = t.column("body").to_pylist()
    rows = []
    for vals, body in zip(zip(*cols), bodies):
        r = dict(zip(names, vals))
        r["body"] = body if r["topic"] == OP_TOPIC else None
        rows.append(r)
    return rows, facts


# ------------------------------------------------------------------------------------------------------------
# per-broker facts and profiles
# ------------------------------------------------------------------------------------------------------------

def _facts(records, op_bodies, table, base_facts) -> Dict[str, dict]:
    facts: Dict[str, dict] = defaultdict(lambda: {k: 0 for k in _FACT_SUMS})

    def f(b):
        return facts[b]

    for b, bf in base_facts.items():
        d = f(b)
        d["n_v2"] = bf["n_v2"]
        d["min_commitlog_offset"] = bf["min_commitlog_offset"]
        d["snapshot_ms"] = bf["snapshot_ms"]
    for r in records:
        d, topic = f(r["broker"]), r["topic"]
        if topic == HALF_TOPIC:
            d["n_half"] += 1
            if r["transaction_id"] is not None:
                d["n_txid"] += 1
            qo = r["queue_offset"]
            if qo is not None and (d.get("min_half_queue_offset") is None or qo < d["min_half_queue_offset"]):
                d["min_half_queue_offset"] = qo
        elif topic == OP_TOPIC:
            d["n_op"] += 1
        elif topic == "TRANS_CHECK_MAX_TIME_TOPIC":
            d["n_discard"] += 1
        if r["transaction_type"] == "PREPARED" and not is_system_topic(topic) and topic is not None:
            d["n_prep"] += 1
            d["n_prep_uk"] += r["uniq_key"] is not None
            d["n_prep_qo"] += (r["queue_offset"] or 0) > 0
    for o in op_bodies:
        f(o["broker"])["n_comma"] += "," in body_text(o["body"]) if o["body"] is not None else 0
    brokers = table.column("broker")
    src = table.column("src")
    for s, key in (("statetable", "n_st"), ("redolog", "n_redo"), ("consumequeue", "n_cq")):
        vc = pc.value_counts(brokers.filter(pc.equal(src, s)))
        for item in vc.to_pylist():
            f(item["values"])[key] += item["counts"]
    for r in _rows(table, "bounds", ("min_commitlog_offset", "n_cq")):
        d = f(r["broker"])
        m = r["min_commitlog_offset"]
        if m is not None and (d.get("min_commitlog_offset") is None or m < d["min_commitlog_offset"]):
            d["min_commitlog_offset"] = m
        d["n_cq"] += r["n_cq"] or 0
    for r in _rows(table, "consumer_offsets", ("topic", "group", "queue_id", "offset")):
        d = f(r["broker"])
        if r["group"] == CHECK_GROUP and r["queue_id"] == 0 and r["offset"] is not None:
            key = {HALF_TOPIC: "half_consume_offset", OP_TOPIC: "op_consume_offset"}.get(r["topic"])
            if key is not None:
                d[key] = max(d.get(key, r["offset"]), r["offset"])
    return dict(facts)


# ------------------------------------------------------------------------------------------------------------
# findings
# ------------------------------------------------------------------------------------------------------------

def _fmt(v) -> str:
    return "null" if v is None else str(v)


def _cq_mismatches(records, units, facts) -> List[dict]:
    """Consume-queue units of the half/op/discard queues vs the CommitLog records of those topics, both ways,
    per (broker, CommitLog offset): NO_RECORD / NO_UNIT / DIFFERS (see jobs/reconstruct.py)."""
    by: Dict[tuple, list] = defaultdict(lambda: [None, None, 0])
    for u in units:
        if u["topic"] not in TX_SYSTEM_TOPICS:
            continue
        g = by[(u["broker"], u["commitlog_offset"])]
        s = (u["topic"], u["queue_id"], u["queue_offset"], u["size"])
        g[0] = s if g[0] is None else max(g[0], s, key=_null_low)
        g[2] += 1
    for r in records:
        if r["topic"] not in TX_SYSTEM_TOPICS:
            continue
        g = by[(r["broker"], r["physical_offset"])]
        s = (r["topic"], r["queue_id"], r["queue_offset"], r["total_size"])
        g[1] = s if g[1] is None else max(g[1], s, key=_null_low)
    out = []
    for (b, off), (unit, rec, n_units) in by.items():
        if rec is None:
            problem = "NO_RECORD"
            detail = (f"CQ unit {unit[0]}/{_fmt(unit[1])}@{_fmt(unit[2])}: no record of that topic at "
                      f"CommitLog offset {_fmt(off)}")
        elif unit is None:
            problem = "NO_UNIT"
            detail = (f"record {rec[0]}/{_fmt(rec[1])}@{_fmt(rec[2])} at CommitLog offset {_fmt(off)} "
                      f"has no CQ unit")
        elif unit != rec or n_units > 1:
            problem = "DIFFERS"
            detail = (f"CQ unit {unit[0]}/{_fmt(unit[1])}@{_fmt(unit[2])} size {_fmt(unit[3])} "
                      f"({n_units} units) vs record {rec[0]}/{_fmt(rec[1])}@{_fmt(rec[2])} size "
                      f"{_fmt(rec[3])} at CommitLog offset {_fmt(off)}")
        else:
            continue
        fb = facts.get(b, {})
        if problem == "NO_UNIT" and not fb.get("n_cq", 0) > 0:
            continue
        mco = fb.get("min_commitlog_offset")
        deleted = problem == "NO_RECORD" and off is not None and mco is not None and off < mco
        where = unit if unit is not None else rec
        out.append({"broker": b, "code": "EVIDENCE_IN_DELETED_RANGE" if deleted else "CQ_MISMATCH",
                    "physical_offset": off, "topic": where[0], "queue_id": where[1], "queue_offset": where[2],
                    "detail": detail})
    return out


def _null_low(t: tuple) -> tuple:
    """Sort key ordering None first (Spark's struct ordering for max)."""
    return tuple((v is not None, v if v is not None else 0) for v in t)


def _corrupt_hits(rows: List[Ev], anomalies: List[dict]) -> List[tuple]:
    """(broker, tx) of evidence records that contain a record-level CommitLog decoder finding."""
    by_broker: Dict[str, list] = defaultdict(list)
    for a in anomalies:
        if (a["physical_offset"] is not None and a["source"] == "commitlog"
                and a["kind"] not in _FILE_LEVEL):
            by_broker[a["broker"]].append(a["physical_offset"])
    if not by_broker:
        return []
    import bisect

    for v in by_broker.values():
        v.sort()
    hits = []
    for e in rows:
        if e.tx is None or e.role not in (COPY, END, OP, DISCARD) or e.physical_offset is None:
            continue
        offs = by_broker.get(e.broker)
        if not offs:
            continue
        lo = e.physical_offset
        hi = lo + e.total_size if e.total_size is not None else lo + 1
        i = bisect.bisect_left(offs, lo)
        if i < len(offs) and offs[i] < max(hi, lo + 1):
            hits.append((e.broker, e.tx))
    return hits


#: decoder findings that mean CommitLog bytes of unknown extent were lost from their offset on (a torn last
#: record after a crash, TRUNCATED_RECORD, loses that one record only: RocketMQ's recovery drops it too)
LOST_BYTES = ("TRUNCATED_FILE", "FILE_GAP")


def _flag_damaged(tx_rows: List[dict], anomalies: List[dict]) -> None:
    """EVIDENCE_IN_DAMAGED_RANGE on the transactions whose state rests on evidence NOT being there (PREPARED,
    DISCARDED, ROLLED_BACK from an op without a COMMIT record) while bytes after their first record were lost:
    the missing commit / op / discard may have been in them, so the state is flagged, never silently changed."""
    lost: Dict[str, int] = {}
    for a in anomalies:
        if a["kind"] in LOST_BYTES and a["source"] == "commitlog" and a["physical_offset"] is not None:
            lost[a["broker"]] = max(lost.get(a["broker"], -1), a["physical_offset"])
    if not lost:
        return
    for t in tx_rows:
        at = lost.get(t["broker"])
        first = min((o for o in (t["prepared_commitlog_offset"], t["first_copy_commitlog_offset"])
                     if o is not None), default=None)
        by_absence = t["state"] in ("PREPARED", "DISCARDED") or (
            t["state"] == "ROLLED_BACK" and t["mechanism"] == "HALF_QUEUE" and not t["rollback_offsets"])
        if at is not None and first is not None and first < at and by_absence:
            t["flags"] = sorted(set(t["flags"]) | {"EVIDENCE_IN_DAMAGED_RANGE"})


def _uncommitted_hits(rows: List[Ev], anomalies: List[dict]) -> List[tuple]:
    """DLedger: (broker, tx) of evidence records at or after the first message past the checkpoint's
    committedIndex (one DLEDGER_UNCOMMITTED finding per broker names it; the log is ordered)."""
    first: Dict[str, int] = {}
    for a in anomalies:
        if a["kind"] == "DLEDGER_UNCOMMITTED" and a["physical_offset"] is not None:
            first[a["broker"]] = min(first.get(a["broker"], a["physical_offset"]), a["physical_offset"])
    if not first:
        return []
    return [(e.broker, e.tx) for e in rows
            if e.tx is not None and e.role in (COPY, END, OP, DISCARD) and e.physical_offset is not None
            and e.broker in first and e.physical_offset >= first[e.broker]]


def _reconstruct_finding(broker, code, physical_offset, queue_id, queue_offset, detail, topic=OP_TOPIC):
    return {"broker": broker, "code": code, "source": "reconstruct", "physical_offset": physical_offset,
            "topic": topic, "queue_id": queue_id, "queue_offset": queue_offset, "transaction_key": None,
            "file": None, "position": None, "length": None, "detail": detail}


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
                 op_bodies_given: Optional[bool] = None) -> Dict[str, pa.Table]:
    """RECON_INPUT rows (any brokers) -> {output name: Arrow table} (see the module docstring).

    ``op_bodies_given``: whether the caller supplied an op_bodies input (then an op record without a row in it
    is OP_BODY_MISSING); None = whether ``table`` has ``op_body`` rows.  Otherwise op bodies come from the
    op records' own ``body``."""
    check_override(profile_override)
    records, base_facts = _commitlog_rows(table)
    op_rows = _rows(table, "op_body", ("physical_offset", "queue_id", "queue_offset", "store_timestamp",
                                       "total_size", "body_crc_ok", "body"))
    has_op_input = bool(op_rows) if op_bodies_given is None else op_bodies_given
    if not has_op_input:
        op_rows = [dict(broker=r["broker"], physical_offset=r["physical_offset"], queue_id=r["queue_id"],
                        queue_offset=r["queue_offset"], store_timestamp=r["store_timestamp"],
                        total_size=r["total_size"], body_crc_ok=r["body_crc_ok"], body=r["body"])
                   for r in records if r["topic"] == OP_TOPIC and r["body"] is not None]
    facts = _facts(records, op_rows, table, base_facts)
    profiles = {b: txrules.profile_row(b, d, override_for(profile_override, b)) for b, d in facts.items()}
    broker_params = params_by_broker(params, {b: p["profile"] for b, p in profiles.items()})

    rows: List[Ev] = []
    for r in records:
        e = record_evidence(r)
        if e is not None:
            rows.append(e)
    for o in op_rows:
        rows.extend(op_evidence(o))
    for u in _rows(table, "statetable", ("index", "commitlog_offset", "state")):
        rows.append(statetable_evidence(u))
    for u in _rows(table, "redolog", ("index", "commitlog_offset", "tags_code", "kind")):
        e = redolog_evidence(u)
        if e is not None:
            rows.append(e)
    link_ends(rows)
    link_ops(rows)

    findings: List[dict] = []
    problems: List[tuple] = []
    anomalies = _rows(table, "anomaly", ("kind", "source", "physical_offset", "file", "position", "length",
                                         "detail", "expected", "actual"))
    if _has_src(table, "consumequeue"):
        units = drop_misplaced_units(_rows(table, "consumequeue", ("topic", "queue_id", "queue_offset",
                                                                   "commitlog_offset", "size")), anomalies)
        cqm = _cq_mismatches(records, units, facts)
        findings.extend(_reconstruct_finding(m["broker"], m["code"], m["physical_offset"], m["queue_id"],
                                             m["queue_offset"], m["detail"], m["topic"]) for m in cqm)
        codes_at: Dict[tuple, set] = defaultdict(set)
        for m in cqm:
            codes_at[(m["broker"], m["physical_offset"])].add(m["code"])
        if codes_at:
            for e in rows:
                if e.tx is not None:
                    for code in codes_at.get((e.broker, e.physical_offset), ()):
                        problems.append((e.broker, e.tx, code))
    problems.extend((b, tx, "CORRUPT_RECORD") for b, tx in _corrupt_hits(rows, anomalies))
    problems.extend((b, tx, "EVIDENCE_NOT_COMMITTED") for b, tx in _uncommitted_hits(rows, anomalies))
    for b, tx, code in problems:
        rows.append(Ev(PROBLEM, b, tx=tx, piece=code))

    groups: Dict[tuple, List[Ev]] = defaultdict(list)
    for e in rows:
        if e.tx is not None:
            groups[(e.broker, e.tx)].append(e)
    tx_rows = []
    for (b, tx), evs in groups.items():
        fb = facts.get(b, {})
        row = txrules.transaction_row(b, tx, evs, fb, profiles.get(b, {}).get("profile"),
                                      broker_params.get(b))
        if row is not None:
            tx_rows.append(row)
    _flag_damaged(tx_rows, anomalies)

    for e in rows:
        if e.role == OP and e.tx is None:
            findings.append(_orphan_op(e, facts.get(e.broker, {})))
    if has_op_input:
        provided = {(o["broker"], o["physical_offset"]) for o in op_rows}
        missing = [r for r in records if r["topic"] == OP_TOPIC and (r["broker"], r["physical_offset"])
                   not in provided]
    else:
        missing = [r for r in records if r["topic"] == OP_TOPIC and r["body"] is None]
    for r in missing:
        findings.append(_reconstruct_finding(
            r["broker"], "OP_BODY_MISSING", r["physical_offset"], r["queue_id"], r["queue_offset"],
            f"op record at op-queue offset {_fmt(r['queue_offset'])}: body not provided"))
    findings.extend(_decoder_finding(a) for a in anomalies)

    return {
        "transactions": _arrow(tx_rows, TRANSACTIONS),
        "check_back": _arrow(txrules.check_back_rows(tx_rows, critical_within_ms), CHECK_BACK),
        "recovery": _arrow(txrules.recovery_rows(tx_rows), RECOVERY),
        "anomalies": _arrow(findings, AUDIT_ANOMALIES),
        "profiles": _arrow(list(profiles.values()), PROFILES_TABLE),
    }


def _has_src(table: pa.Table, src: str) -> bool:
    return bool(pc.any(pc.equal(table.column("src"), src)).as_py()) if table.num_rows else False


def _orphan_op(e: Ev, fb: Mapping) -> dict:
    mhq = fb.get("min_half_queue_offset")
    if e.half_offset is None:
        code = "OP_BODY_UNPARSABLE"
        detail = f"op at op-queue offset {_fmt(e.queue_offset)}: body piece '{e.piece}' is not a number"
    elif e.half_offset < (mhq if mhq is not None else LONG_MAX):
        code = "EVIDENCE_IN_DELETED_RANGE"
        detail = (f"op at op-queue offset {_fmt(e.queue_offset)} names half offset {e.half_offset}, below "
                  f"the oldest retained half record")
    else:
        code = "OP_WITHOUT_HALF"
        detail = (f"op at op-queue offset {_fmt(e.queue_offset)} names half offset {e.half_offset}: no half "
                  f"record has it")
    return _reconstruct_finding(e.broker, code, e.physical_offset, e.queue_id, e.half_offset, detail)


def _arrow(rows: List[dict], table) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=table.arrow_schema())


__all__ = ["reduce_input", "input_table", "SOURCES"]
