"""Per-transaction rules of the reconstruction (Spark-free): profile detection, state, deadline, flags, and
the check-back / recovery work-list rows.  The one implementation of the rules documented in
jobs/reconstruct.py (module docstring), jobs/flags.py (FLAGS, RECOVERY_ACTIONS) and schemas/audit.py; follows
the store-format reference sections 7, 8, 10 and 11 (TransactionalMessageServiceImpl.check, needSkip /
needDiscard; AbstractTransactionalMessageCheckListener.sendCheckMessage for the check-back header fields).

``transaction_row`` reduces the evidence rows (jobs/txevidence.Ev) of ONE transaction; nothing here looks at
another transaction, so the work is linear in the number of evidence rows.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

from jobs.flags import FLAGS, RECOVERY_ACTIONS
from jobs.txevidence import COPY, DISCARD, END, OP, ORIGREF, PROBLEM, REDO_E, REDO_P, ST, Ev
from jobs.txparams import (
    COMMITTED, DISCARD_TOPIC, DISCARDED, HALF_QUEUE, HALF_TOPIC, P_3X, P_40, P_43, P_51, P_UNKNOWN, PREPARED,
    PREPARED_RECORD, ROLLED_BACK, SEP, AuditParams,
)

_ST_CODES = ("STATETABLE_MISSING_PREPARED", "STATETABLE_INDEX_MISMATCH", "STATETABLE_COMMITLOG_DISAGREE",
             "STATETABLE_REDOLOG_DISAGREE")
_EV_CODES = ("CORRUPT_RECORD", "CQ_MISMATCH", "EVIDENCE_IN_DELETED_RANGE", "PREPARED_RECORD_MISSING",
             "EVIDENCE_NOT_COMMITTED", "EVIDENCE_IN_DAMAGED_RANGE")
_EXPIRED_CODES = ("AT_CHECK_MAX", "AGE_PAST_FILE_RESERVED_TIME", "PAST_DEADLINE")


# ------------------------------------------------------------------------------------------------------------
# profiles
# ------------------------------------------------------------------------------------------------------------

def detect(d: Mapping) -> str:
    """Rules, first match wins (see jobs.reconstruct.detect_profile)."""
    halfish = d["n_half"] + d["n_op"] + d["n_discard"] > 0
    v51 = d["n_comma"] > 0 or d["n_txid"] > 0 or d["n_v2"] > 0
    if d["n_st"] > 0 or d["n_redo"] > 0:
        return P_3X
    if halfish:
        return P_51 if v51 else P_43
    if d["n_prep"] > 0:
        return P_40 if d["n_prep_uk"] > 0 else P_3X
    return P_51 if d["n_v2"] > 0 else P_UNKNOWN


def evidence(d: Mapping) -> List[str]:
    out = []
    for key, text in (("n_st", "%d statetable units"), ("n_redo", "%d redolog units"),
                      ("n_half", "%d half records"), ("n_op", "%d op records"),
                      ("n_discard", "%d discard records"), ("n_comma", "%d comma-batched op bodies (5.1+)"),
                      ("n_txid", "%d halves with __transactionId__ (5.1+)"),
                      ("n_v2", "%d magic V2 records (5.1+)"),
                      ("n_prep", "%d PREPARED records in real topics"),
                      ("n_prep_uk", "%d of them with UNIQ_KEY (4.x client)")):
        if d[key] > 0:
            out.append(text % d[key])
    if d["n_prep"] > 0 and d["n_prep_uk"] == 0:
        out.append("PREPARED records without UNIQ_KEY (3.x client)")
    if d["n_prep_qo"] > 0:
        out.append("%d PREPARED with QUEUEOFFSET > 0 (3.x statetable counter)" % d["n_prep_qo"])
    return out


def profile_row(broker: str, facts: Mapping, override: Optional[str]) -> dict:
    detected = detect(facts)
    return {"broker": broker, "profile": override or detected, "detected_profile": detected,
            "evidence": evidence(facts)}


# ------------------------------------------------------------------------------------------------------------
# transactions
# ------------------------------------------------------------------------------------------------------------

def _min(vals):
    vals = [v for v in vals if v is not None]
    return min(vals) if vals else None


def _max(vals):
    vals = [v for v in vals if v is not None]
    return max(vals) if vals else None


def _greatest(*vals):
    return _max(vals)


def _least(*vals):
    return _min(vals)


def _add(a, b):
    return None if a is None or b is None else a + b


def _sorted_set(vals) -> list:
    return sorted({v for v in vals if v is not None})


def _copy_struct(e: Ev) -> dict:
    return {"commitlog_offset": e.physical_offset, "queue_offset": e.queue_offset,
            "store_timestamp": e.store_timestamp, "msg_id": e.msg_id, "check_times": e.check_times,
            "tran_prepared_qo": e.tran_prepared_qo}


def transaction_row(broker: str, tx: str, evs: List[Ev], facts: Mapping, profile: Optional[str],
                    params: Optional[AuditParams]) -> Optional[dict]:
    """The TRANSACTIONS row of one transaction id from its evidence rows, or None when the group holds no
    transaction (only PROBLEM rows, or an ORIGREF whose copy belongs elsewhere)."""
    by_role = {COPY: [], END: [], OP: [], DISCARD: [], ST: [], REDO_P: [], REDO_E: [], ORIGREF: [],
               PROBLEM: []}
    for e in evs:
        by_role[e.role].append(e)
    all_copies, ends, ops, discards = by_role[COPY], by_role[END], by_role[OP], by_role[DISCARD]
    st_units, n_redo_prep = by_role[ST], len(by_role[REDO_P])
    core = all_copies + ends + ops + discards
    copies = (all_copies if len(all_copies) == 1 and all_copies[0].physical_offset is not None else
              sorted((e for e in all_copies if e.physical_offset is not None),
                     key=lambda e: e.physical_offset))
    if not core and not st_units and not n_redo_prep:
        return None
    first = _copy_struct(copies[0]) if copies else None
    newest = _copy_struct(copies[-1]) if copies else None
    fc = copies[0] if copies else None

    mechanism = _max(e.mechanism for e in all_copies)
    if fc is not None:
        copy_key = (fc.uniq_key if fc.mechanism == HALF_QUEUE and fc.uniq_key is not None
                    else str(fc.physical_offset))
    else:
        copy_key = None
    uniq_key = _max(e.uniq_key for e in core)

    def first_or_any(attr):
        v = getattr(fc, attr) if fc is not None else None
        return v if v is not None else _max(getattr(e, attr) for e in core)

    commits = _sorted_set(e.physical_offset for e in ends if e.end_type == "COMMIT")
    rollbacks = _sorted_set(e.physical_offset for e in ends if e.end_type == "ROLLBACK")
    op_half = _sorted_set(e.half_offset for e in ops)
    n_commit, n_rb, n_ops = len(commits), len(rollbacks), len(op_half)
    disc = [e for e in discards if e.physical_offset is not None]
    discard_off = max((e.physical_offset for e in disc), default=None)
    discard_msg = max(disc, key=lambda e: e.physical_offset).msg_id if disc else None
    st_with_index = [e for e in st_units if e.queue_offset is not None]
    st_unit = max(st_with_index, key=lambda e: e.queue_offset) if st_with_index else None
    st_index = st_unit.queue_offset if st_unit is not None else None
    st = st_unit.st_state if st_unit is not None else None
    redo_end = _sorted_set(e.physical_offset for e in by_role[REDO_E])
    cl_end = _sorted_set(e.physical_offset for e in ends)
    end_structs = {(e.physical_offset, e.end_type) for e in ends}
    end_types = {t for _, t in end_structs}
    missing_targets = _sorted_set(e.pto for e in ends if e.target_tx is None)
    end_pto = _min(e.pto for e in ends)

    prof = profile
    p = params
    timeout = p.transactionTimeOut if p else None
    check_max = p.transactionCheckMax if p else None
    interval = p.transactionCheckInterval if p else None
    reserved = int(p.fileReservedTime * 3600 * 1000) if p and p.fileReservedTime is not None else None
    as_of = (p.as_of_ms if p and p.as_of_ms is not None else None)
    if as_of is None:
        as_of = facts.get("snapshot_ms")
    hco, oco = facts.get("half_consume_offset"), facts.get("op_consume_offset")
    mco = facts.get("min_commitlog_offset")

    mech = mechanism or (PREPARED_RECORD if prof in (P_3X, P_40) else HALF_QUEUE)
    born = _min(e.born_timestamp for e in all_copies)
    if born is None:
        born = _min(e.born_timestamp for e in core)
    cl_state = "COMMIT" if "COMMIT" in end_types else "ROLLBACK" if "ROLLBACK" in end_types else "PREPARED"
    redo_types = {t for o, t in end_structs if o in set(redo_end)}
    redolog_state = ("COMMIT" if "COMMIT" in redo_types else "ROLLBACK" if "ROLLBACK" in redo_types
                     else "ENDED" if redo_end else "PREPARED" if n_redo_prep > 0 else None)
    discarded_last = bool(discards) and (newest is None or (discard_off is not None
                                                            and discard_off > newest["commitlog_offset"]))
    if n_commit > 0:
        state = COMMITTED
    elif n_rb > 0 or n_ops > 0:
        state = ROLLED_BACK
    elif st == "COMMIT":
        state = COMMITTED
    elif st == "ROLLBACK":
        state = ROLLED_BACK
    elif discarded_last:
        state = DISCARDED
    else:
        state = PREPARED
    half = mech == HALF_QUEUE
    imm = fc.immunity_s if fc is not None else None
    eff_timeout = imm * 1000 if half and imm is not None and imm >= 0 else timeout
    newest_ct = newest["check_times"] if newest is not None and newest["check_times"] is not None else 0
    first_pass = _greatest(_add(newest["store_timestamp"] if newest else None, interval),
                           _add(born, eff_timeout))
    rest = _greatest(None if check_max is None else check_max - newest_ct, 0)
    by_checks = _add(first_pass, None if interval is None else rest * interval)
    by_age = _add(born, reserved)
    if state != PREPARED:
        deadline = None
    elif half and newest is not None:
        deadline = _least(by_checks, by_age)
    elif half:
        deadline = by_age
    else:
        deadline = _add(first["store_timestamp"] if first else None, reserved)
    newest_qo = newest["queue_offset"] if newest else None
    open_candidates = _sorted_set(e.queue_offset for e in all_copies
                                  if e.mechanism == HALF_QUEUE and not e.named)
    orig_covered = {e.queue_offset for e in by_role[ORIGREF] if e.named}
    open_copies = [x for x in open_candidates if x not in orig_covered and newest_qo is not None
                   and x == newest_qo and (hco is None or x >= hco)]
    age = None if as_of is None or born is None else as_of - born

    prepared, resolved = state == PREPARED, state in (COMMITTED, ROLLED_BACK)
    past_timeout = prepared and age is not None and eff_timeout is not None and age > eff_timeout
    orphan_discard_only = mechanism is None and n_commit + n_rb == 0 and bool(discards)
    p_key = tx.split(SEP)[1] if tx.startswith("P" + SEP) else None
    p_long = _to_long(p_key)
    units_only = mechanism is None and not core
    earlier_gone = (half and first is not None
                    and (first["check_times"] is not None or first["tran_prepared_qo"] is not None))
    has_st, has_redo = (facts.get("n_st") or 0) > 0, (facts.get("n_redo") or 0) > 0
    legacy = mech == PREPARED_RECORD
    compatible = redolog_state is not None and st is not None and (
        st == redolog_state or (redolog_state == "ENDED" and st in ("COMMIT", "ROLLBACK")))
    below = oco is not None and hco is not None and any(
        e.queue_offset is not None and e.half_offset is not None and e.queue_offset >= oco
        and e.half_offset < hco
        for e in ops)
    mco_pos = mco is not None and mco > 0
    mco_not_pos = mco is not None and not mco > 0
    copies_n = len(all_copies)
    check_times = _max(e.check_times for e in all_copies)
    codes = {
        "PREPARED_PAST_TIMEOUT": past_timeout,
        "PREPARED_NEVER_CHECKED": past_timeout and (
            (half and copies_n == 1 and (check_times or 0) == 0) or (legacy and prof == P_40)),
        "AT_CHECK_MAX": prepared and half and check_max is not None and newest_ct >= check_max,
        "AGE_PAST_FILE_RESERVED_TIME": prepared and age is not None and reserved is not None
        and age > reserved,
        "PAST_DEADLINE": prepared and deadline is not None and as_of is not None and deadline <= as_of,
        "PREPARED_PASSED_BY_CHECKER": prepared and half and hco is not None and newest_qo is not None
        and newest_qo < hco,
        "DUPLICATE_COMMIT": n_commit > 1,
        "COMMIT_WITHOUT_OP": any(e.end_type == "COMMIT" and e.target_mech == HALF_QUEUE and not e.named
                                 for e in ends),
        "RESOLVED_COPY_PENDING_CHECK": resolved and half and len(open_copies) > 0,
        "OP_BELOW_HALF_CONSUME_OFFSET": below,
        "CONFLICTING_ENDS": n_commit > 0 and (n_rb > 0 or any(not e.copy_committed for e in ops)),
        "DISCARDED_WITH_RESOLUTION": bool(discards) and (n_commit > 0 or n_rb > 0 or n_ops > 0),
        "RESUMED_AFTER_DISCARD": prepared and bool(discards) and not discarded_last,
        "EVIDENCE_IN_DELETED_RANGE": (
            (mco is not None and any(x < mco for x in missing_targets)) or (orphan_discard_only and mco_pos)
            or (units_only and p_long is not None and mco is not None and p_long < mco)
            or (earlier_gone and mco_pos)),
        "PREPARED_RECORD_MISSING": (
            (mco is not None and any(x >= mco for x in missing_targets))
            or (orphan_discard_only and mco_not_pos)
            or (units_only and p_long is not None and mco is not None and p_long >= mco)
            or (earlier_gone and mco_not_pos)),
        "CORRUPT_RECORD": any(e.body_crc_ok is False for e in core),
        "STATETABLE_MISSING_PREPARED": prepared and legacy and has_st and first is not None
        and st_unit is None,
        "STATETABLE_INDEX_MISMATCH": legacy and has_st and st_index is not None and first is not None
        and first["queue_offset"] is not None and st_index != first["queue_offset"],
        "STATETABLE_COMMITLOG_DISAGREE": legacy and has_st and first is not None and st is not None
        and st != cl_state,
        "STATETABLE_REDOLOG_DISAGREE": legacy and has_st and has_redo and st is not None and not compatible,
        "REDOLOG_COMMITLOG_DISAGREE": legacy and has_redo and first is not None
        and (n_redo_prep == 0 or redo_end != cl_end),
    }
    flags = {c for c, on in codes.items() if on}
    flags.update(e.piece for e in by_role[PROBLEM] if e.piece is not None)
    for c in flags:
        assert c in FLAGS, c

    key = copy_key
    for alt in (p_key, uniq_key, None if end_pto is None else str(end_pto),
                None if discard_off is None else str(discard_off)):
        if key is None:
            key = alt
    prepared_off = first["commitlog_offset"] if first else None
    if prepared_off is None:
        prepared_off = end_pto if end_pto is not None else p_long
    tid = _max(e.transaction_id for e in core)
    return {
        "broker": broker, "transaction_key": key, "uniq_key": uniq_key,
        "transaction_id": tid if tid is not None else uniq_key,
        "keys": first_or_any("keys"), "producer_group": _max(e.pgroup for e in core),
        "real_topic": first_or_any("real_topic"), "real_queue_id": first_or_any("real_qid"),
        "mechanism": mech, "state": state, "prepared_commitlog_offset": prepared_off,
        "first_copy_commitlog_offset": first["commitlog_offset"] if first else None,
        "first_copy_queue_offset": first["queue_offset"] if first else None,
        "first_copy_store_timestamp": first["store_timestamp"] if first else None,
        "newest_copy_commitlog_offset": newest["commitlog_offset"] if newest else None,
        "newest_copy_queue_offset": newest_qo,
        "newest_copy_store_timestamp": newest["store_timestamp"] if newest else None,
        "newest_copy_msg_id": newest["msg_id"] if newest else None,
        "newest_copy_check_times": newest["check_times"] if newest else None,
        "copies": copies_n, "check_times": check_times, "check_immunity_time_s": imm,
        "born_timestamp": born, "age_ms": age, "commit_offsets": commits, "rollback_offsets": rollbacks,
        "op_half_offsets": op_half, "op_queue_offsets": _sorted_set(e.queue_offset for e in ops),
        "resolved_timestamp": _min(e.store_timestamp for e in ends + ops),
        "discard_commitlog_offset": discard_off, "discard_msg_id": discard_msg, "discards": len(discards),
        "statetable_index": st_index, "statetable_state": st, "redolog_state": redolog_state,
        "open_copy_offsets": open_copies, "flags": sorted(flags), "deadline_ms": deadline, "profile": prof,
        "as_of_ms": as_of,
    }


def _null(v) -> str:
    return "null" if v is None else str(v)


def _to_long(s: Optional[str]) -> Optional[int]:
    if s is None:
        return None
    try:
        return int(s)
    except ValueError:
        return None


# ------------------------------------------------------------------------------------------------------------
# work lists
# ------------------------------------------------------------------------------------------------------------

def check_back_rows(transactions: List[dict], critical_within_ms: int = 60000) -> List[dict]:
    """CHECK_BACK rows, ranked (see jobs.reconstruct.check_back_worklist)."""
    out = []
    for t in transactions:
        fl = set(t["flags"])
        if not (t["state"] == PREPARED and "PREPARED_PAST_TIMEOUT" in fl
                and t["newest_copy_commitlog_offset"] is not None and t["producer_group"] is not None
                and not fl & {"AT_CHECK_MAX", "AGE_PAST_FILE_RESERVED_TIME", *_ST_CODES}):
            continue
        dl, as_of = t["deadline_ms"], t["as_of_ms"]
        critical = "PAST_DEADLINE" in fl or (dl is not None and as_of is not None
                                             and dl - as_of <= critical_within_ms)
        priority = "CRITICAL" if critical else "HIGH" if "PREPARED_NEVER_CHECKED" in fl else "NORMAL"
        half = t["mechanism"] == HALF_QUEUE
        st_off = t["statetable_index"] if t["statetable_index"] is not None else t["newest_copy_queue_offset"]
        out.append({
            "priority": priority, "broker": t["broker"], "producer_group": t["producer_group"],
            "transaction_key": t["transaction_key"],
            "request_topic": HALF_TOPIC if half else t["real_topic"],
            "commitlog_offset": t["newest_copy_commitlog_offset"],
            "tran_state_table_offset": t["newest_copy_queue_offset"] if half else st_off,
            "offset_msg_id": t["newest_copy_msg_id"],
            "msg_id": t["uniq_key"] if t["uniq_key"] is not None else t["newest_copy_msg_id"],
            "uniq_key": t["uniq_key"], "transaction_id": t["transaction_id"], "real_topic": t["real_topic"],
            "real_queue_id": t["real_queue_id"], "check_times": t["newest_copy_check_times"],
            "age_ms": t["age_ms"], "deadline_ms": t["deadline_ms"], "profile": t["profile"],
        })
    rank_check_back(out)
    return out


def check_back_order(r: dict) -> tuple:
    """Sort key: priority, deadline ascending (nulls last), age descending, broker, transaction key."""
    prio = {"CRITICAL": 0, "HIGH": 1}.get(r["priority"], 2)
    dl, age = r["deadline_ms"], r["age_ms"]
    return (prio, dl is None, dl if dl is not None else 0, age is None, -(age or 0), r["broker"] or "",
            r["transaction_key"] or "")


def rank_check_back(rows: List[dict]) -> None:
    rows.sort(key=check_back_order)
    for i, r in enumerate(rows, 1):
        r["urgency_rank"] = i


def recovery_rows(transactions: List[dict]) -> List[dict]:
    """RECOVERY rows (see jobs.reconstruct.recovery_worklist and jobs.flags.RECOVERY_ACTIONS)."""
    out = []
    for t in transactions:
        fl = t["flags"]
        fls = set(fl)
        state = t["state"]
        half = t["mechanism"] == HALF_QUEUE
        conds = {
            "REBUILD_STATETABLE": bool(fls.intersection(_ST_CODES)),
            "REVIEW_CONFLICTING_ENDS": "CONFLICTING_ENDS" in fls,
            "REVIEW_DUPLICATE_COMMIT": "DUPLICATE_COMMIT" in fls,
            "MARK_DONE": state in (COMMITTED, ROLLED_BACK) and half and len(t["open_copy_offsets"]) > 0,
            "RESUME_DISCARDED": state == DISCARDED and t["discard_msg_id"] is not None,
            "REDRIVE_EXPIRED": state == PREPARED and bool(fls.intersection(_EXPIRED_CODES)),
            "REVIEW_EVIDENCE": bool(fls.intersection(_EV_CODES)),
        }
        assert list(conds) == list(RECOVERY_ACTIONS)
        actions = [a for a, on in conds.items() if on]
        if not actions:
            continue

        def present(codes):
            return ", ".join(c for c in fl if c in codes)

        def joined(xs):
            return ",".join(str(x) for x in xs)

        reasons = {
            "REBUILD_STATETABLE": lambda: "statetable: " + present(_ST_CODES),
            "REVIEW_CONFLICTING_ENDS": lambda: (
                f"COMMIT record(s) {joined(t['commit_offsets'])} and rollback evidence (ROLLBACK records "
                f"[{joined(t['rollback_offsets'])}], ops {joined(t['op_half_offsets'])})"),
            "REVIEW_DUPLICATE_COMMIT": lambda: (
                f"{len(t['commit_offsets'])} COMMIT records "
                f"(CommitLog offsets {joined(t['commit_offsets'])})"),
            "MARK_DONE": lambda: (f"{state}, but half offsets {joined(t['open_copy_offsets'])} have no op "
                                  f"and the check service will visit them"),
            "RESUME_DISCARDED": lambda: (f"discarded to {DISCARD_TOPIC} (offset "
                                         f"{_null(t['discard_commitlog_offset'])}) with no commit or op"),
            "REDRIVE_EXPIRED": lambda: "PREPARED and " + present(_EXPIRED_CODES),
            "REVIEW_EVIDENCE": lambda: "evidence: " + present(_EV_CODES),
        }
        resume = actions[0] == "RESUME_DISCARDED"
        out.append({
            "broker": t["broker"], "transaction_key": t["transaction_key"], "uniq_key": t["uniq_key"],
            "producer_group": t["producer_group"], "real_topic": t["real_topic"], "state": state,
            "action": actions[0], "actions": actions, "reason": "; ".join(reasons[a]() for a in actions),
            "flags": fl, "prepared_commitlog_offset": t["prepared_commitlog_offset"],
            "newest_copy_commitlog_offset": t["newest_copy_commitlog_offset"],
            "newest_copy_queue_offset": t["newest_copy_queue_offset"], "commit_offsets": t["commit_offsets"],
            "rollback_offsets": t["rollback_offsets"], "op_queue_offsets": t["op_queue_offsets"],
            "mark_done_half_offsets": t["open_copy_offsets"] if "MARK_DONE" in actions else [],
            "discard_commitlog_offset": t["discard_commitlog_offset"],
            "resume_topic": DISCARD_TOPIC if resume else None,
            "resume_msg_id": t["discard_msg_id"] if resume else None,
            "statetable_index": t["statetable_index"], "deadline_ms": t["deadline_ms"],
            "profile": t["profile"],
        })
    return out


__all__ = ["detect", "evidence", "profile_row", "transaction_row", "check_back_rows", "recovery_rows",
           "rank_check_back", "check_back_order"]
