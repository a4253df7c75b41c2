"""The check-back and recovery work lists (Spark-free): plain filters of the TRANSACTIONS table by column
(state, flags, deadline), formatting only their own rows.  The rules that set the flags are in
jobs/reconstruct/rules.py; the actions and what they mean are jobs/reconstruct/flags.py RECOVERY_ACTIONS;
jobs/reconstruct/spark.py ranks the check-back list across brokers."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.evidence import _np
from jobs.reconstruct.flags import RECOVERY_ACTIONS, UNCERTAIN
from jobs.reconstruct.groups import ints, list_of_strings, valid
from jobs.reconstruct.params import (
    COMMITTED,
    DISCARD_TOPIC,
    DISCARDED,
    HALF_QUEUE,
    HALF_TOPIC,
    PREPARED,
    ROLLED_BACK,
    UNKNOWN_DAMAGED,
)
from schemas.audit import CHECK_BACK, RECOVERY

_ST_CODES = ("STATETABLE_MISSING_PREPARED", "STATETABLE_INDEX_MISMATCH", "STATETABLE_COMMITLOG_DISAGREE",
             "STATETABLE_REDOLOG_DISAGREE")
_EV_CODES = ("CORRUPT_RECORD", "CQ_MISMATCH", "EVIDENCE_IN_DELETED_RANGE", "PREPARED_RECORD_MISSING",
             "EVIDENCE_NOT_COMMITTED")
_EXPIRED_CODES = ("AT_CHECK_MAX", "AGE_PAST_FILE_RESERVED_TIME", "PAST_DEADLINE")


def flag_rows(flags: pa.Array, codes) -> np.ndarray:
    """Per row of a list<string> column: whether it holds one of ``codes``."""
    if isinstance(flags, pa.ChunkedArray):
        flags = flags.combine_chunks()
    out = np.zeros(len(flags), bool)
    if len(flags):
        hit = _np(pc.is_in(pc.list_flatten(flags), pa.array(list(codes), pa.string())))
        out[np.asarray(pc.list_parent_indices(flags))[hit]] = True
    return out


def check_back(transactions: pa.Table, critical_within_ms: int = 60000) -> pa.Table:
    """CHECK_BACK rows, ranked: priority, deadline ascending (nulls last), age descending, broker,
    transaction key (see jobs.reconstruct.spark.check_back_worklist)."""
    t = transactions
    fl = t.column("flags")
    unknown = _np(pc.equal(t.column("state"), UNKNOWN_DAMAGED))
    cand = (((_np(pc.equal(t.column("state"), PREPARED)) & flag_rows(fl, ("PREPARED_PAST_TIMEOUT",))
              & ~flag_rows(fl, ("AT_CHECK_MAX", "AGE_PAST_FILE_RESERVED_TIME", *_ST_CODES))) | unknown)
            & valid(t.column("newest_copy_commitlog_offset")) & valid(t.column("producer_group")))
    t = t.filter(pa.array(cand))
    fl = t.column("flags")
    dl, as_of = ints(t.column("deadline_ms")), ints(t.column("as_of_ms"))
    critical = flag_rows(fl, ("PAST_DEADLINE",)) | (dl[1] & as_of[1]
                                                    & (dl[0] - as_of[0] <= critical_within_ms))
    unknown = _np(pc.equal(t.column("state"), UNKNOWN_DAMAGED))
    prio = np.where(critical, 0, np.where(flag_rows(fl, ("PREPARED_NEVER_CHECKED",)) | unknown, 1, 2))
    age = ints(t.column("age_ms"))
    order = pc.sort_indices(pa.table({
        "p": prio, "dn": ~dl[1], "d": dl[0], "an": ~age[1], "a": -age[0],
        "b": pc.fill_null(t.column("broker"), ""), "k": pc.fill_null(t.column("transaction_key"), "")}),
        sort_keys=[(k, "ascending") for k in ("p", "dn", "d", "an", "a", "b", "k")])
    t = t.take(order)
    prio = prio[np.asarray(order)]
    half = pa.array(_np(pc.equal(t.column("mechanism"), HALF_QUEUE)))
    col = t.column
    cols = {
        "urgency_rank": pa.array(np.arange(1, t.num_rows + 1), pa.int32()),
        "priority": pa.array(np.array(["CRITICAL", "HIGH", "NORMAL"], dtype=object)[prio], pa.string()),
        "request_topic": pc.if_else(half, HALF_TOPIC, col("real_topic")),
        "commitlog_offset": col("newest_copy_commitlog_offset"),
        "tran_state_table_offset": pc.if_else(half, col("newest_copy_queue_offset"), pc.coalesce(
            col("statetable_index"), col("newest_copy_queue_offset"))),
        "offset_msg_id": col("newest_copy_msg_id"),
        "msg_id": pc.coalesce(col("uniq_key"), col("newest_copy_msg_id")),
        "check_times": col("newest_copy_check_times"),
    }
    schema = CHECK_BACK.arrow_schema()
    return pa.Table.from_arrays([(cols[f.name] if f.name in cols else col(f.name)).cast(f.type)
                                 for f in schema], schema=schema)


def _filtered_join(flags: pa.Array, codes, sep: str) -> pa.Array:
    """Per row: its flags that are in ``codes``, in their order, joined by ``sep``."""
    flat = pc.list_flatten(flags)
    keep = _np(pc.is_in(flat, pa.array(list(codes), pa.string())))
    parent = np.asarray(pc.list_parent_indices(flags))[keep]
    offsets = np.zeros(len(flags) + 1, np.int32)
    np.cumsum(np.bincount(parent, minlength=len(flags)), out=offsets[1:])
    lists = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat.filter(pa.array(keep)))
    return pc.binary_join(lists, sep)


def _joined(lists) -> pa.Array:
    return pc.binary_join(pc.cast(lists, pa.list_(pa.string())), ",")


def recovery(transactions: pa.Table) -> pa.Table:
    """RECOVERY rows (see jobs.reconstruct.spark.recovery_worklist and jobs.reconstruct.flags.RECOVERY_ACTIONS)."""
    t = transactions
    fl, state = t.column("flags"), t.column("state")
    # COMMITTED / ROLLED_BACK stand on a record that was read: only a flag of theirs rests on lost bytes
    read_state = _np(pc.is_in(state, pa.array([COMMITTED, ROLLED_BACK])))
    on = {
        "CHECK_BACK_DAMAGED": flag_rows(fl, (UNCERTAIN,)) & ~read_state,
        "REBUILD_STATETABLE": flag_rows(fl, _ST_CODES),
        "REVIEW_CONFLICTING_ENDS": flag_rows(fl, ("CONFLICTING_ENDS",)),
        "REVIEW_DUPLICATE_COMMIT": flag_rows(fl, ("DUPLICATE_COMMIT",)),
        "MARK_DONE": (_np(pc.is_in(state, pa.array([COMMITTED, ROLLED_BACK])))
                      & _np(pc.equal(t.column("mechanism"), HALF_QUEUE))
                      & (np.asarray(pc.list_value_length(t.column("open_copy_offsets"))) > 0)),
        "RESUME_DISCARDED": _np(pc.equal(state, DISCARDED)) & valid(t.column("discard_msg_id")),
        "REDRIVE_EXPIRED": _np(pc.equal(state, PREPARED)) & flag_rows(fl, _EXPIRED_CODES),
        "REVIEW_EVIDENCE": flag_rows(fl, _EV_CODES) | (flag_rows(fl, (UNCERTAIN,)) & read_state),
    }
    assert list(on) == list(RECOVERY_ACTIONS)
    cand = np.logical_or.reduce(list(on.values())) if len(t) else np.zeros(0, bool)
    keep = pa.array(cand)
    t = t.filter(keep)
    on = {a: m[cand] for a, m in on.items()}
    n = t.num_rows
    col = t.column
    fl = col("flags").combine_chunks() if n else pa.array([], pa.list_(pa.string()))
    names = list(RECOVERY_ACTIONS)
    g = np.concatenate([np.nonzero(m)[0] for m in on.values()]) if n else np.zeros(0, np.int64)
    codes = np.concatenate([np.full(int(m.sum()), k) for k, m in enumerate(on.values())]) if n else g
    actions = list_of_strings(g, codes, names, n)
    first = np.full(n, len(names))
    for k, m in reversed(list(enumerate(on.values()))):
        first = np.where(m, k, first)
    commits = _joined(col("commit_offsets"))
    text = {
        "CHECK_BACK_DAMAGED": pc.binary_join_element_wise(
            col("state"), " rests on CommitLog bytes that could not be read (finding ", UNCERTAIN,
            "): ask the producer for the outcome", ""),
        "REBUILD_STATETABLE": pc.binary_join_element_wise("statetable: ", _filtered_join(fl, _ST_CODES, ", "),
                                                          ""),
        "REVIEW_CONFLICTING_ENDS": pc.binary_join_element_wise(
            "COMMIT record(s) ", commits, " and rollback evidence (ROLLBACK records [",
            _joined(col("rollback_offsets")), "], ops ", _joined(col("op_half_offsets")), ")", ""),
        "REVIEW_DUPLICATE_COMMIT": pc.binary_join_element_wise(
            pc.cast(pc.list_value_length(col("commit_offsets")), pa.string()),
            " COMMIT records (CommitLog offsets ", commits, ")", ""),
        "MARK_DONE": pc.binary_join_element_wise(
            col("state"), ", but half offsets ", _joined(col("open_copy_offsets")),
            " have no op and the check service will visit them", ""),
        "RESUME_DISCARDED": pc.binary_join_element_wise(
            f"discarded to {DISCARD_TOPIC} (offset ",
            pc.fill_null(pc.cast(col("discard_commitlog_offset"), pa.string()), "null"),
            ") with no commit or op", ""),
        "REDRIVE_EXPIRED": pc.binary_join_element_wise("PREPARED and ",
                                                       _filtered_join(fl, _EXPIRED_CODES, ", "), ""),
        "REVIEW_EVIDENCE": pc.binary_join_element_wise("evidence: ", _filtered_join(fl, _EV_CODES + (UNCERTAIN,),
                                                                                     ", "), ""),
    }
    parts = [pc.if_else(pa.array(on[a]), text[a], pa.nulls(n, pa.string())) for a in names]
    reason = pc.binary_join_element_wise(*parts, "; ", null_handling="skip")
    resume = pa.array(first == names.index("RESUME_DISCARDED"))
    mark = pa.array(on["MARK_DONE"])
    empty = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.int64()))
    cols = {
        "action": pa.array(np.array(names + [None], dtype=object)[first], pa.string()),
        "actions": actions, "reason": reason, "flags": fl,
        "mark_done_half_offsets": pc.if_else(mark, col("open_copy_offsets"), empty),
        "resume_topic": pc.if_else(resume, DISCARD_TOPIC, pa.nulls(n, pa.string())),
        "resume_msg_id": pc.if_else(resume, col("discard_msg_id"), pa.nulls(n, pa.string())),
        "producer_group": col("producer_group"),
    }
    schema = RECOVERY.arrow_schema()
    return pa.Table.from_arrays([(cols[f.name] if f.name in cols else col(f.name)).cast(f.type)
                                 for f in schema], schema=schema)


__all__ = ["check_back", "recovery", "flag_rows"]
