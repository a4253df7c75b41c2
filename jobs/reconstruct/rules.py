"""Per-transaction rules of the reconstruction (Spark-free): profile detection, state, deadline and flags
(the work lists built from them: jobs/reconstruct/worklists.py; the findings of a state resting on lost
bytes: jobs/reconstruct/uncertain.py).  The one implementation of the rules documented in
jobs/reconstruct/spark.py (module docstring), jobs/reconstruct/flags.py (FLAGS, RECOVERY_ACTIONS) and schemas/audit.py; follows
the store-format reference sections 7, 8, 10 and 11 (TransactionalMessageServiceImpl.check, needSkip /
needDiscard; AbstractTransactionalMessageCheckListener.sendCheckMessage for the check-back header fields).

``transactions`` reduces one broker's linked evidence (jobs/txevidence.Evidence) to its transaction rows in
column operations: the rows are grouped by transaction id once (jobs/txgroups.Groups) and every rule is an
expression over per-group arrays, so the cost is a few sorts of the evidence plus linear passes, whatever the
number of transactions.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.damage import EMPTY as NO_DAMAGE
from jobs.reconstruct.damage import DamagedRanges
from jobs.reconstruct.evidence import (
    COMMIT_T,
    COPY,
    CRC_FALSE,
    DISCARD,
    END,
    HALF_Q,
    OP,
    ORIGREF,
    PREP_R,
    REDO_E,
    REDO_P,
    ROLLBACK_T,
    ST,
    TIDREF,
    XREF,
    Evidence,
    _np,
    key_mismatch,
    tid_mismatch,
)
from jobs.reconstruct.flags import FLAGS, UNCERTAIN
from jobs.reconstruct.groups import (
    Groups,
    Nullable,
    at_rows,
    coalesce,
    ints,
    list_of_strings,
    member,
    str_rank,
    take,
    to_arrow,
    valid,
    where,
)
from jobs.reconstruct.params import (
    COMMITTED,
    DISCARDED,
    P_3X,
    P_40,
    P_43,
    P_51,
    P_UNKNOWN,
    PREPARED,
    ROLLED_BACK,
    SEP,
    UNKNOWN_DAMAGED,
    AuditParams,
)
from jobs.reconstruct.uncertain import (
    record_range,
    statetable_damage_findings,
    uncertain_findings,
    unlinked_half,
)
from schemas.audit import TRANSACTIONS

# ------------------------------------------------------------------------------------------------------------
# profiles
# ------------------------------------------------------------------------------------------------------------

def detect(d: Mapping) -> str:
    """Rules, first match wins (see jobs.reconstruct.spark.detect_profile)."""
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

_FLAG_NAMES = tuple(sorted(FLAGS))
_FLAG_CODE = {f: i for i, f in enumerate(_FLAG_NAMES)}


def _add(a: Nullable, b: Nullable) -> Nullable:
    return a[0] + b[0], a[1] & b[1]


def _scalar(v, n: int) -> Nullable:
    return (np.full(n, 0 if v is None else int(v), np.int64), np.full(n, v is not None))


def _greatest(a: Nullable, b: Nullable) -> Nullable:
    """Spark's greatest: nulls skipped, null when both are."""
    both = a[1] & b[1]
    return np.where(both, np.maximum(a[0], b[0]), np.where(a[1], a[0], b[0])), a[1] | b[1]


def _least(a: Nullable, b: Nullable) -> Nullable:
    both = a[1] & b[1]
    return np.where(both, np.minimum(a[0], b[0]), np.where(a[1], a[0], b[0])), a[1] | b[1]


def _str_max_row(g: Groups, mask: np.ndarray, s: pa.Array) -> np.ndarray:
    rank, ok = str_rank(s)
    return g.pick(mask & ok, ~rank)


def transactions(broker: str, ev: Evidence, facts: Mapping, profile: Optional[str],
                 params: Optional[AuditParams], problems: Sequence[Tuple[np.ndarray, str]] = (),
                 damaged: Optional[DamagedRanges] = None, findings: Optional[list] = None) -> pa.Table:
    """The TRANSACTIONS rows of one broker from its linked evidence (every transaction id with a copy, end,
    op, discard, statetable unit or redolog PREPARED unit).  ``problems``: (evidence rows, flag) pairs from
    the findings; ``damaged``: the broker's lost CommitLog ranges (jobs/reconstruct/damage.py), for
    STATE_UNCERTAIN_DAMAGED_RANGE; ``findings``: when given, an AUDIT_ANOMALIES table of one finding per
    transaction so flagged (the range and the record it misses) is appended to it."""
    enc = pc.dictionary_encode(ev.s["tx"]) if ev.n else pa.DictionaryArray.from_arrays(
        pa.array([], pa.int32()), pa.array([], pa.string()))
    gid = np.asarray(pc.fill_null(enc.indices, -1)).astype(np.int64)
    txs = enc.dictionary
    g = Groups(gid, len(txs))
    G, N = g.n, ev.n
    role, c, i, s = ev.c["role"], ev.c, ev.i, ev.s
    is_copy, is_end, is_op, is_disc = role == COPY, role == END, role == OP, role == DISCARD
    is_st, is_rp, is_re, is_orig = role == ST, role == REDO_P, role == REDO_E, role == ORIGREF
    is_xref = role == XREF
    # a 5.1+ broker sets __transactionId__ = UNIQ_KEY on every half (evidence.tid_tx): elsewhere the property
    # is the client's and proves nothing
    tid_proves = profile == P_51
    is_tidref = (role == TIDREF) & tid_proves
    core = is_copy | is_end | is_op | is_disc
    commit_end, rb_end = is_end & (c["end_type"] == COMMIT_T), is_end & (c["end_type"] == ROLLBACK_T)
    rowid = np.arange(N, dtype=np.int64)
    pv, pok = i["physical_offset"]
    n_copy, n_core, n_st, n_rp = g.count(is_copy), g.count(core), g.count(is_st), g.count(is_rp)
    keep = (n_core > 0) | (n_st > 0) | (n_rp > 0)

    fc = g.pick(is_copy & pok, pv)
    nc = g.pick(is_copy & pok, ~pv, ~rowid)
    has_first = fc >= 0
    first_phys, first_qo = at_rows(fc, i["physical_offset"]), at_rows(fc, i["queue_offset"])
    first_ts, first_ct = at_rows(fc, i["store_timestamp"]), at_rows(fc, i["check_times"])
    first_tpqo, imm = at_rows(fc, i["tran_prepared_qo"]), at_rows(fc, i["immunity_s"])
    newest_phys, newest_qo = at_rows(nc, i["physical_offset"]), at_rows(nc, i["queue_offset"])
    newest_ts, newest_ct_col = at_rows(nc, i["store_timestamp"]), at_rows(nc, i["check_times"])
    fc_mech = np.where(has_first, c["mechanism"][np.where(has_first, fc, 0)] if N else 0, 0)

    mech_v, mech_ok = g.max((c["mechanism"].astype(np.int64), c["mechanism"] > 0), is_copy)
    uk_row = _str_max_row(g, core, s["uniq_key"])
    uniq_key = take(s["uniq_key"], uk_row)
    fc_uk = take(s["uniq_key"], fc)
    copy_key = pc.if_else(pa.array(has_first & (fc_mech == HALF_Q) & valid(fc_uk)), fc_uk,
                          to_arrow(*first_phys).cast(pa.string()))

    def first_or_any_str(name):
        return pc.coalesce(take(s[name], fc), take(s[name], _str_max_row(g, core, s[name])))

    fq = at_rows(fc, i["real_qid"])
    real_qid = np.where(fq[1], fq[0], g.max(i["real_qid"], core)[0]), fq[1] | g.max(i["real_qid"], core)[1]

    commits = g.sorted_sets(i["physical_offset"], commit_end)
    rollbacks = g.sorted_sets(i["physical_offset"], rb_end)
    op_half = g.sorted_sets(i["half_offset"], is_op)
    n_commit, n_rb, n_ops = (np.diff(np.asarray(x.offsets)) for x in (commits, rollbacks, op_half))
    n_disc = g.count(is_disc)
    disc_off = g.max(i["physical_offset"], is_disc)
    disc_msg = take(s["msg_id"], g.pick(is_disc & pok, ~pv))
    st_row = g.pick(is_st & i["queue_offset"][1], ~i["queue_offset"][0])
    st_index, st = at_rows(st_row, i["queue_offset"]), take(s["st_state"], st_row)
    pto_v, pto_ok = i["pto"]
    missing = is_end & pto_ok & (c["has_target"] == 0)
    end_pto = g.min(i["pto"], is_end)

    p = params
    timeout = _scalar(p.transactionTimeOut if p else None, G)
    check_max = p.transactionCheckMax if p else None
    interval = _scalar(p.transactionCheckInterval if p else None, G)
    reserved = _scalar(int(p.fileReservedTime * 3600 * 1000) if p and p.fileReservedTime is not None
                       else None, G)
    as_of_s = p.as_of_ms if p and p.as_of_ms is not None else facts.get("snapshot_ms")
    as_of = _scalar(as_of_s, G)
    hco_s, oco_s = facts.get("half_consume_offset"), facts.get("op_consume_offset")
    mco_s = facts.get("min_commitlog_offset")

    mech = np.where(mech_ok, mech_v, PREP_R if profile in (P_3X, P_40) else HALF_Q)
    born = g.min(i["born_timestamp"], is_copy)
    born = where(born[1], born, g.min(i["born_timestamp"], core))
    any_commit, any_rb = g.any(commit_end), g.any(rb_end)
    cl_state = np.where(any_commit, 1, np.where(any_rb, 2, 0))         # COMMIT, ROLLBACK, PREPARED
    redo_e_rows = np.nonzero(is_re & pok)[0]
    end_rows = np.nonzero(is_end & pok)[0]
    end_in_redo = np.zeros(N, bool)
    end_in_redo[end_rows] = member([(gid[end_rows], np.ones(len(end_rows), bool)), (pv[end_rows],
                                    pok[end_rows])],
                                   [(gid[redo_e_rows], np.ones(len(redo_e_rows), bool)),
                                    (pv[redo_e_rows], pok[redo_e_rows])])
    has_redo_end = g.any(is_re & pok)
    redolog_state = np.where(g.any(end_in_redo & commit_end), "COMMIT",
                             np.where(g.any(end_in_redo & rb_end), "ROLLBACK",
                                      np.where(has_redo_end, "ENDED",
                                               np.where(n_rp > 0, "PREPARED", None))))  # type: ignore[call-overload]  # None: object array
    discarded_last = (n_disc > 0) & ((nc < 0) | (disc_off[1] & (disc_off[0] > newest_phys[0])))
    st_commit, st_rb = _np(pc.equal(st, "COMMIT")), _np(pc.equal(st, "ROLLBACK"))
    has_st, has_redo = (facts.get("n_st") or 0) > 0, (facts.get("n_redo") or 0) > 0
    legacy = mech == PREP_R
    # 3.x: a statetable COMMIT / ROLLBACK is only ever written by dispatching that END record, and the END's
    # redolog unit follows it; with the prepared record read, no END record read and an undamaged redolog
    # without an END unit for it, the unit's state is damage, not a resolution (docs/robustness.md)
    redo_sound = has_redo and not (damaged is not None and damaged.redolog)
    st_damaged = (legacy & has_st & redo_sound & has_first & (st_commit | st_rb) & (n_commit + n_rb == 0)
                  & ~has_redo_end)
    st_commit, st_rb = st_commit & ~st_damaged, st_rb & ~st_damaged
    state = np.where(n_commit > 0, COMMITTED, np.where((n_rb > 0) | (n_ops > 0), ROLLED_BACK,
                     np.where(st_commit, COMMITTED, np.where(st_rb, ROLLED_BACK,
                              np.where(discarded_last, DISCARDED, PREPARED))))).astype(object)
    half = mech == HALF_Q
    use_imm = half & imm[1] & (imm[0] >= 0)
    eff_timeout = where(use_imm, (imm[0] * 1000, np.ones(G, bool)), timeout)
    newest_ct = np.where(newest_ct_col[1], newest_ct_col[0], 0)
    first_pass = _greatest(_add(newest_ts, interval), _add(born, eff_timeout))
    rest = np.maximum(check_max - newest_ct, 0) if check_max is not None else np.zeros(G, np.int64)
    by_checks = _add(first_pass, (rest * interval[0], interval[1]))
    by_age = _add(born, reserved)
    prepared = state == PREPARED
    deadline = where(half & (nc >= 0), _least(by_checks, by_age),
                      where(half, by_age, _add(first_ts, reserved)))
    deadline = (deadline[0], deadline[1] & prepared)
    age = (as_of[0] - born[0], as_of[1] & born[1])

    nqo_at = g.at(newest_qo[0])
    nqo_ok_at = g.at(newest_qo[1])
    qo_v, qo_ok = i["queue_offset"]
    same_qo = qo_ok & nqo_ok_at & (qo_v == nqo_at)
    cand = g.any(is_copy & (c["mechanism"] == HALF_Q) & (c["named"] == 0) & same_qo)
    covered = g.any(is_orig & (c["named"] > 0) & same_qo)
    open_copy = cand & ~covered & newest_qo[1] & (True if hco_s is None else newest_qo[0] >= hco_s)

    resolved = (state == COMMITTED) | (state == ROLLED_BACK)
    past_timeout = prepared & age[1] & eff_timeout[1] & (age[0] > eff_timeout[0])
    orphan_discard_only = ~mech_ok & (n_commit + n_rb == 0) & (n_disc > 0)
    is_p = _np(pc.starts_with(txs, "P" + SEP)) if G else np.zeros(0, bool)
    p_key = pc.if_else(pa.array(is_p), pc.utf8_slice_codeunits(txs, 2), pa.nulls(G, pa.string()))
    p_long = ints(pc.cast(p_key, pa.int64())) if G else (np.zeros(0, np.int64), np.zeros(0, bool))
    units_only = ~mech_ok & (n_core == 0)
    earlier_gone = half & has_first & (first_ct[1] | first_tpqo[1])
    st_ok = valid(st)
    st_arr = np.asarray(st.to_pylist(), dtype=object) if G else np.zeros(0, object)
    compatible = (redolog_state != None) & st_ok & (  # noqa: E711 - numpy elementwise
        (st_arr == redolog_state) | ((redolog_state == "ENDED") & (st_commit | st_rb)))
    ho_v, ho_ok = i["half_offset"]
    below = (g.any(is_op & qo_ok & ho_ok & (qo_v >= oco_s) & (ho_v < hco_s))
             if oco_s is not None and hco_s is not None else np.zeros(G, bool))
    # below the first CommitLog file: retention, unless the store says those files were lost
    head_lost = damaged is not None and damaged.head_lost
    mco_pos = mco_s is not None and mco_s > 0 and not head_lost
    mco_not_pos = mco_s is not None and (not mco_s > 0 or head_lost)
    check_times = g.max(i["check_times"], is_copy)
    miss_below = g.any(missing & (pto_v < mco_s)) if mco_s is not None else np.zeros(G, bool)
    miss_above = g.any(missing & (pto_v >= mco_s)) if mco_s is not None else np.zeros(G, bool)
    p_below = (p_long[1] & (p_long[0] < mco_s)) if mco_s is not None else np.zeros(G, bool)
    p_above = (p_long[1] & (p_long[0] >= mco_s)) if mco_s is not None else np.zeros(G, bool)
    if head_lost:       # what points below the first file points into lost bytes
        miss_above, p_above = miss_above | miss_below, p_above | p_below
        miss_below, p_below = np.zeros(G, bool), np.zeros(G, bool)
    cl_end_n = g.distinct_count(i["physical_offset"], is_end)
    redo_end_n = g.distinct_count(i["physical_offset"], is_re)
    union_n = g.distinct_count(i["physical_offset"], is_end | is_re)
    redo_ne_cl = ~((cl_end_n == redo_end_n) & (union_n == cl_end_n))
    cl_state_s = np.array(["PREPARED", "COMMIT", "ROLLBACK"], dtype=object)[cl_state]
    codes = {
        "PREPARED_PAST_TIMEOUT": past_timeout,
        "PREPARED_NEVER_CHECKED": past_timeout & (
            (half & (n_copy == 1) & (np.where(check_times[1], check_times[0], 0) == 0))
            | (legacy & (profile == P_40))),
        "AT_CHECK_MAX": prepared & half & (check_max is not None) & (newest_ct >= (check_max or 0)),
        "AGE_PAST_FILE_RESERVED_TIME": prepared & age[1] & reserved[1] & (age[0] > reserved[0]),
        "PAST_DEADLINE": prepared & deadline[1] & as_of[1] & (deadline[0] <= as_of[0]),
        "PREPARED_PASSED_BY_CHECKER": (prepared & half & newest_qo[1] & (newest_qo[0] < hco_s)
                                       if hco_s is not None else np.zeros(G, bool)),
        "DUPLICATE_COMMIT": n_commit > 1,
        "COMMIT_WITHOUT_OP": g.any(commit_end & (c["target_mech"] == HALF_Q) & (c["named"] == 0)),
        "RESOLVED_COPY_PENDING_CHECK": resolved & half & open_copy,
        "OP_BELOW_HALF_CONSUME_OFFSET": below,
        "CONFLICTING_ENDS": (n_commit > 0) & ((n_rb > 0) | g.any(is_op & (c["copy_committed"] == 0))),
        "DISCARDED_WITH_RESOLUTION": (n_disc > 0) & ((n_commit > 0) | (n_rb > 0) | (n_ops > 0)),
        "RESUMED_AFTER_DISCARD": prepared & (n_disc > 0) & ~discarded_last,
        "EVIDENCE_IN_DELETED_RANGE": miss_below | (orphan_discard_only & mco_pos) | (units_only & p_below)
        | (earlier_gone & mco_pos),
        "PREPARED_RECORD_MISSING": miss_above | (orphan_discard_only & mco_not_pos) | (units_only & p_above)
        | (earlier_gone & mco_not_pos),
        # an END and the half copy it names disagree on the transaction (evidence.key_mismatch): both the
        # transaction the copy keys and the one the END carries (its XREF twin) hold a damaged record; the
        # same for a record whose __transactionId__ and UNIQ_KEY differ (evidence.tid_tx, its TIDREF twin)
        "CORRUPT_RECORD": g.any((core & (c["crc"] == CRC_FALSE)) | key_mismatch(ev) | is_xref
                                | (tid_mismatch(ev) & tid_proves) | is_tidref) | st_damaged,
        "STATETABLE_MISSING_PREPARED": prepared & legacy & has_st & has_first & (st_row < 0),
        "STATETABLE_INDEX_MISMATCH": legacy & has_st & st_index[1] & first_qo[1]
        & (st_index[0] != first_qo[0]),
        "STATETABLE_COMMITLOG_DISAGREE": legacy & has_st & has_first & st_ok & (st_arr != cl_state_s),
        "STATETABLE_REDOLOG_DISAGREE": legacy & has_st & has_redo & st_ok & ~compatible,
        "REDOLOG_COMMITLOG_DISAGREE": legacy & has_redo & has_first & ((n_rp == 0) | redo_ne_cl),
    }
    prepared_off = where(has_first, first_phys, coalesce(end_pto, p_long))
    # a state reached by the absence of a record, while bytes where that record would lie are lost: the
    # window per inference is documented in docs/robustness.md ("Inference only from complete evidence")
    damaged = NO_DAMAGE if damaged is None else damaged
    rb_absent = (state == ROLLED_BACK) & half & (n_commit == 0) & (n_rb == 0) & (n_ops > 0)
    open_ended = prepared | (state == DISCARDED)
    first_any = _least(prepared_off, first_phys)
    op_rec = g.max(i["physical_offset"], is_op)
    window_hi = (op_rec[0], op_rec[1] & rb_absent)          # null: open to the end of the log
    none = np.full(G, -1, np.int64)
    lost = damaged.first_overlap(first_any, window_hi) if len(damaged) else none
    own = unlinked_half(g, is_copy & (c["mechanism"] == HALF_Q) & pok, s["real_topic"], i["real_qid"],
                        s["pgroup"], i["physical_offset"], i["total_size"])
    own_only = (rb_absent | open_ended) & own[1] & (lost < 0)
    # an END carrying this transaction's id names another transaction's half copy: its resolution may be
    # that END (linked there), so a state by absence is unsure
    xref = record_range(g.pick(is_xref, pv), i["physical_offset"], i["total_size"], i["pto"])
    xref_only = (rb_absent | open_ended) & xref[1] & (lost < 0) & ~own_only
    # a record whose __transactionId__ is this transaction's id carries another UNIQ_KEY: its resolution
    # (a discard, a COMMIT / ROLLBACK) or a newer copy may be that record, keyed elsewhere
    tidr = record_range(g.pick(is_tidref, pv), i["physical_offset"], i["total_size"])
    tid_only = (rb_absent | open_ended) & tidr[1] & (lost < 0) & ~own_only & ~xref_only
    by_state = ((rb_absent | open_ended) & (lost >= 0)) | own_only | xref_only | tid_only
    unknown = rb_absent & by_state
    # flags reached by absence on a state read from a record: the op of a COMMIT (written after it, at any
    # later time) and the op of the newest copy (after that copy) could lie in a lost range after them
    open_hi = (np.zeros(G, np.int64), np.zeros(G, bool))
    cwo_lo = g.min(i["physical_offset"], commit_end & (c["target_mech"] == HALF_Q) & (c["named"] == 0))
    lost_op = damaged.first_overlap(cwo_lo, open_hi) if len(damaged) else none
    cwo_unsure = codes["COMMIT_WITHOUT_OP"] & (lost_op >= 0)
    codes["COMMIT_WITHOUT_OP"] = codes["COMMIT_WITHOUT_OP"] & ~cwo_unsure     # not asserted
    lost_rc = damaged.first_overlap(newest_phys, open_hi) if len(damaged) else none
    rc_unsure = codes["RESOLVED_COPY_PENDING_CHECK"] & (lost_rc >= 0)      # kept: the broker sees no op either
    # 3.x: a state or flag that rests on a statetable / redolog unit nobody read (that file has damage): the
    # table flags -- set, or not set because the unit they compare is gone -- of a transaction with no unit
    # in the damaged table, and a state read from the tables alone
    st_rests = legacy & ~has_first & (n_commit + n_rb == 0)
    # (a redolog that lost units without a decoder finding is a broker fact: damage.with_redolog_gap)
    redo_missing = legacy & ((has_first & (n_rp == 0)) | g.any(is_end & pok & ~end_in_redo))
    st_unsure = ((st_rests | codes["STATETABLE_MISSING_PREPARED"] | codes["STATETABLE_REDOLOG_DISAGREE"]
                  | (legacy & (n_st == 0))) & bool(damaged.statetable))
    redo_unsure = ((st_rests | codes["REDOLOG_COMMITLOG_DISAGREE"] | codes["STATETABLE_REDOLOG_DISAGREE"]
                    | redo_missing) & bool(damaged.redolog))
    uncertain = by_state | cwo_unsure | rc_unsure | st_unsure | redo_unsure
    why = np.select([own_only & unknown, own_only, xref_only & unknown, xref_only, tid_only & unknown, tid_only,
                     by_state & unknown, by_state, cwo_unsure, rc_unsure, st_unsure, redo_unsure],
                    [6, 7, 8, 9, 10, 11, 0, 1, 2, 3, 4, 5], -1)
    lost_at = np.select([(why >= 0) & (why <= 1), why == 2, why == 3], [lost, lost_op, lost_rc], -1)
    codes[UNCERTAIN] = uncertain
    fg, fc_codes = [], []
    for name, on in codes.items():
        hit = np.nonzero(on)[0]
        fg.append(hit)
        fc_codes.append(np.full(len(hit), _FLAG_CODE[name]))
    for rows, code in problems:
        rows = rows[gid[rows] >= 0]
        fg.append(gid[rows])
        fc_codes.append(np.full(len(rows), _FLAG_CODE[code]))
    flags = list_of_strings(np.concatenate(fg) if fg else np.zeros(0, np.int64),
                            np.concatenate(fc_codes) if fc_codes else np.zeros(0, np.int64), _FLAG_NAMES, G)

    key = pc.coalesce(copy_key, p_key, uniq_key, to_arrow(*end_pto).cast(pa.string()),
                      to_arrow(*disc_off).cast(pa.string()))
    tid = take(s["transaction_id"], _str_max_row(g, core, s["transaction_id"]))
    cols = {
        "broker": pa.array([broker] * G, pa.string()), "transaction_key": key, "uniq_key": uniq_key,
        "transaction_id": pc.coalesce(tid, uniq_key), "keys": first_or_any_str("keys"),
        "producer_group": take(s["pgroup"], _str_max_row(g, core, s["pgroup"])),
        "real_topic": first_or_any_str("real_topic"), "real_queue_id": to_arrow(*real_qid, pa.int32()),
        "mechanism": pa.array(np.where(mech == HALF_Q, "HALF_QUEUE", "PREPARED_RECORD"), pa.string()),
        "state": pa.array(state, pa.string()), "prepared_commitlog_offset": to_arrow(*prepared_off),
        "first_copy_commitlog_offset": to_arrow(*first_phys), "first_copy_queue_offset": to_arrow(*first_qo),
        "first_copy_store_timestamp": to_arrow(*first_ts),
        "newest_copy_commitlog_offset": to_arrow(*newest_phys),
        "newest_copy_queue_offset": to_arrow(*newest_qo), "newest_copy_store_timestamp": to_arrow(*newest_ts),
        "newest_copy_msg_id": take(s["msg_id"], nc),
        "newest_copy_check_times": to_arrow(*newest_ct_col, pa.int32()),
        "copies": pa.array(n_copy, pa.int32()), "check_times": to_arrow(*check_times, pa.int32()),
        "check_immunity_time_s": to_arrow(*imm), "born_timestamp": to_arrow(*born), "age_ms": to_arrow(*age),
        "commit_offsets": commits, "rollback_offsets": rollbacks, "op_half_offsets": op_half,
        "op_queue_offsets": g.sorted_sets(i["queue_offset"], is_op),
        "resolved_timestamp": to_arrow(*g.min(i["store_timestamp"], is_end | is_op)),
        "discard_commitlog_offset": to_arrow(*disc_off), "discard_msg_id": disc_msg,
        "discards": pa.array(n_disc, pa.int32()), "statetable_index": to_arrow(*st_index),
        "statetable_state": st, "redolog_state": pa.array(redolog_state, pa.string()),
        "open_copy_offsets": _optional_list(newest_qo[0], open_copy),
        "flags": flags, "deadline_ms": to_arrow(*deadline), "profile": pa.array([profile] * G, pa.string()),
        "as_of_ms": to_arrow(*as_of),
    }
    if unknown.any():
        cols["state"] = pa.array(np.where(unknown, UNKNOWN_DAMAGED, state), pa.string())
    schema = TRANSACTIONS.arrow_schema()
    out = pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)
    if findings is not None and uncertain.any():
        findings.append(uncertain_findings(broker, key, state, uncertain & keep, why, first_any, op_rec,
                                            (cwo_lo, newest_phys), lost_at, damaged, own, xref, tidr))
    if findings is not None and st_damaged.any():
        findings.append(statetable_damage_findings(broker, key, state, st_damaged & keep, st_index, st,
                                                   first_phys))
    return out.filter(pa.array(keep)) if not keep.all() else out


def _optional_list(v: np.ndarray, on: np.ndarray) -> pa.Array:
    """list<int64> holding v where ``on``, else empty."""
    offsets = np.zeros(len(v) + 1, np.int32)
    np.cumsum(on, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(v[on], pa.int64()))


__all__ = ["detect", "evidence", "profile_row", "transactions"]
