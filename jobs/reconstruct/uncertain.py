"""The findings of a state or flag that rests on bytes nobody read (Spark-free): one
STATE_UNCERTAIN_DAMAGED_RANGE row per flagged transaction, naming the inference, the window its missing record
must lie in and the damage inside it (jobs/reconstruct/rules.py decides which transactions are flagged,
jobs/reconstruct/damage.py gives the lost ranges; docs/robustness.md states the rule per inference), and the
half copies whose damaged properties leave a transaction unlinked (``unlinked_half``)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.damage import DamagedRanges
from jobs.reconstruct.flags import UNCERTAIN
from jobs.reconstruct.groups import Groups, Nullable, at_rows, to_arrow
from schemas.audit import AUDIT_ANOMALIES
from txlog_io.consumequeue import STATETABLE_UNIT_SIZE


def unlinked_half(g: Groups, half_copy: np.ndarray, real_topic: pa.Array, real_qid: Nullable, pgroup: pa.Array,
                  phys: Nullable, size: Nullable) -> Tuple[Tuple[np.ndarray, np.ndarray], np.ndarray]:
    """Per transaction the ``([start, end), present)`` CommitLog range of its first half-queue copy that lacks
    REAL_TOPIC, REAL_QID or PGROUP.  TransactionalMessageBridge.parseHalfMessageInner sets the first two on
    every half it puts, the producer sets PGROUP on every transactional message
    (DefaultMQProducerImpl.sendMessageInTransaction; the broker reads it back to check a half,
    AbstractTransactionalMessageCheckListener.resolveHalfMsg, and to end it, EndTransactionProcessor.
    checkPrepareMessage), and renewHalfMessageInner copies all three to every re-put copy (4.3+, 5.x), so such a
    copy's properties were damaged after the write: what finds a half by ``REAL_TOPIC#UNIQ_KEY`` or keys it by
    (UNIQ_KEY, PGROUP, topic) (its re-put copies, its discard, an indexed read's COMMIT lookup) may not have
    reached this transaction, and a state reached by absence is unsure."""
    valid = (lambda a: np.asarray(a.is_valid()) if len(a) else np.zeros(0, bool))
    whole = valid(real_topic) & real_qid[1] & valid(pgroup)
    rng, ok, _ = record_range(g.pick(half_copy & ~whole, phys[0]), phys, size)
    return rng, ok


Range = Tuple[Tuple[np.ndarray, np.ndarray], np.ndarray, Nullable]


def record_range(row: np.ndarray, phys: Nullable, size: Nullable, pto: Optional[Nullable] = None) -> Range:
    """Per transaction the ``([start, end), present, PREPARED_TRANSACTION_OFFSET)`` of the evidence row picked
    for it (``row``, -1: none); at least one byte long."""
    start, ok = at_rows(row, phys)
    ts = at_rows(row, size)
    named = at_rows(row, pto) if pto is not None else (np.zeros(len(row), np.int64), np.zeros(len(row), bool))
    return (start, start + np.where(ts[1], np.maximum(ts[0], 1), 1)), ok, named


def uncertain_findings(broker: str, key: pa.Array, state: np.ndarray, on: np.ndarray, why: np.ndarray,
                        lo: Nullable, op_rec: Nullable, after: Tuple[Nullable, Nullable], hit: np.ndarray,
                        damaged: DamagedRanges, own: Tuple[Tuple[np.ndarray, np.ndarray], np.ndarray],
                        xref: Optional[Range] = None, tid: Optional[Range] = None) -> pa.Table:
    """One STATE_UNCERTAIN_DAMAGED_RANGE finding per flagged transaction: the inference (``why``: 0 rollback
    from an op, 1 PREPARED / DISCARDED, 2 COMMIT_WITHOUT_OP, 3 RESOLVED_COPY_PENDING_CHECK, 4 statetable,
    5 redolog, 6 / 7 as 0 / 1 when the damage is the transaction's own half copy without REAL_TOPIC /
    REAL_QID: ``own``, see ``unlinked_half``; 8 / 9 as 0 / 1 when an END record carrying the transaction's
    id names another transaction's half copy: ``xref``, see evidence.key_mismatch; 10 / 11 as 0 / 1 when a
    record's ``__transactionId__`` is the transaction's id but its UNIQ_KEY another: ``tid``, see
    evidence.tid_tx), the window its missing
    record must lie in and the damage
    inside it (AUDIT_ANOMALIES rows; ``physical_offset`` / ``length`` the CommitLog range, null for a
    statetable / redolog file)."""
    rows = np.nonzero(on)[0]
    n, k, w = len(rows), hit[rows], why[rows]
    text = (lambda v, ok: pc.fill_null(pc.cast(to_arrow(v[rows], ok[rows]), pa.string()), "?"))
    names = np.asarray(damaged.what + ("",), dtype=object)
    what = pa.array(names[np.where(k >= 0, k, len(names) - 1)], pa.string())
    lo_s, op_s, cwo_s, copy_s = text(*lo), text(*op_rec), text(*after[0]), text(*after[1])
    st_s = pa.array(state[rows], pa.string())
    detail = pa.array([None] * n, pa.string())
    variants = [
        (0, pc.binary_join_element_wise(
            "UNKNOWN_DAMAGED (would be ROLLED_BACK): an op record at CommitLog offset ", op_s,
            " resolves it but no COMMIT record was read; EndTransactionProcessor writes the COMMIT record before "
            "the op, so it would lie between the half record at ", lo_s, " and ", op_s,
            ", where CommitLog bytes were not readable: ", what, "")),
        (1, pc.binary_join_element_wise(
            st_s, ": no op, COMMIT or ROLLBACK record was read after the first half/prepared record at ", lo_s,
            ", and CommitLog bytes after it were not readable: ", what, "; its resolution may have been there",
            "")),
        (2, pc.binary_join_element_wise(
            "COMMIT_WITHOUT_OP not asserted: no op record names the copy committed at CommitLog offset ", cwo_s,
            ", but the op is written after the COMMIT record (EndTransactionProcessor, at any later time when "
            "batched) and CommitLog bytes after it were not readable: ", what, "")),
        (3, pc.binary_join_element_wise(
            "RESOLVED_COPY_PENDING_CHECK rests on a missing op: no op record names the newest copy at CommitLog "
            "offset ", copy_s, ", and CommitLog bytes after it were not readable: ", what, "")),
        (4, pc.binary_join_element_wise(
            st_s, ": the statetable unit this state or statetable flag rests on may be in damaged statetable "
            "bytes: " + damaged.statetable, "")),
        (5, pc.binary_join_element_wise(
            st_s, ": the redolog unit this state or redolog flag rests on may be in damaged redolog bytes: "
            + damaged.redolog, "")),
    ]
    unlinked = pc.binary_join_element_wise(
        "its half copy at CommitLog offset ", text(own[0][0], own[1]), " lacks REAL_TOPIC, REAL_QID or PGROUP, "
        "which every half carries (TransactionalMessageBridge.parseHalfMessageInner, the producer's "
        "sendMessageInTransaction): its properties were damaged after the write, so a record that finds it by "
        "REAL_TOPIC#UNIQ_KEY or keys it by UNIQ_KEY, PGROUP and topic (its COMMIT record in an indexed read, "
        "its re-put copies, its discard) may not be linked to it", "")

    def not_linked(code: int, because: pa.Array) -> list:
        """The two variants of a resolution that may exist but was not linked: ``code`` rolled back by an
        op, ``code + 1`` PREPARED / DISCARDED."""
        return [(code, pc.binary_join_element_wise(
                    "UNKNOWN_DAMAGED (would be ROLLED_BACK): an op record at CommitLog offset ", op_s,
                    " resolves it but no COMMIT record was linked; ", because, "")),
                (code + 1, pc.binary_join_element_wise(st_s, ": no resolution was linked, and ", because, ""))]

    variants += not_linked(6, unlinked)
    if xref is not None:
        variants += not_linked(8, pc.binary_join_element_wise(
            "the COMMIT/ROLLBACK record at CommitLog offset ", text(xref[0][0], xref[1]), " carries this "
            "transaction's UNIQ_KEY, PGROUP and topic, but the half copy at its PREPARED_TRANSACTION_OFFSET ",
            text(*xref[2]), " is another transaction's; EndTransactionProcessor.endMessageTransaction copies the "
            "properties of the half at that offset into the record it writes, so one of the two records was "
            "damaged after the write, and this transaction's resolution may be that record", ""))
    if tid is not None:
        variants += not_linked(10, pc.binary_join_element_wise(
            "the record at CommitLog offset ", text(tid[0][0], tid[1]), " carries this transaction's id in its "
            "__transactionId__ property but another UNIQ_KEY; a 5.1+ broker sets the one from the other on every "
            "half (TransactionalMessageBridge.parseHalfMessageInner) and every record made from it copies both, "
            "so one of the two values was damaged after the write, and this transaction's resolution or newest "
            "copy may be that record", ""))
    for code, txt in variants:
        detail = pc.if_else(pa.array(w == code), txt, detail)
    mine, crossed_on, tid_on = (w == 6) | (w == 7), (w == 8) | (w == 9), (w == 10) | (w == 11)
    in_log = (k >= 0) | mine | crossed_on | tid_on
    start = np.where(k >= 0, damaged.start[np.where(k >= 0, k, 0)] if len(damaged) else 0, 0)
    end = np.where(k >= 0, damaged.end[np.where(k >= 0, k, 0)] if len(damaged) else 0, 0)
    start = np.where(mine, own[0][0][rows], start)
    end = np.where(mine, own[0][1][rows], end)
    if xref is not None:
        start = np.where(crossed_on, xref[0][0][rows], start)
        end = np.where(crossed_on, xref[0][1][rows], end)
    if tid is not None:
        start = np.where(tid_on, tid[0][0][rows], start)
        end = np.where(tid_on, tid[0][1][rows], end)
    return _findings_table(broker, UNCERTAIN, key, rows, detail,
                           physical_offset=pa.array(start, pa.int64(), mask=~in_log),
                           length=pa.array(end - start, pa.int64(), mask=~in_log))


def statetable_damage_findings(broker: str, key: pa.Array, state: np.ndarray, on: np.ndarray, index: Nullable,
                                st_state: pa.Array, prepared: Nullable) -> pa.Table:
    """One CORRUPT_RECORD finding per transaction ``on`` whose 3.x statetable unit says COMMIT / ROLLBACK
    while nothing else has its END (jobs/reconstruct/rules.py ``st_damaged``): the unit (``index``, its bytes
    in the statetable), what it says and what the state is instead (AUDIT_ANOMALIES rows, no CommitLog range:
    the damage is in the statetable)."""
    rows = np.nonzero(on)[0]
    text = (lambda v, ok: pc.fill_null(pc.cast(to_arrow(v[rows], ok[rows]), pa.string()), "?"))
    idx_v, idx_ok = index
    start = (idx_v * STATETABLE_UNIT_SIZE, idx_ok)
    detail = pc.binary_join_element_wise(
        "statetable unit ", text(*index), " (statetable bytes ", text(*start), "..",
        text(start[0] + STATETABLE_UNIT_SIZE, idx_ok), ") says ", st_state.take(pa.array(rows, pa.int64())),
        " for the prepared record at CommitLog offset ", text(*prepared), ", but no COMMIT / ROLLBACK record of "
        "it was read and the redolog has no END unit for it: TransactionStateService.updateTransactionState "
        "writes that state only when its END record is dispatched, and the END's redolog unit follows it, so "
        "the unit was damaged; the state is the CommitLog's: ", pa.array(state[rows], pa.string()), "")
    return _findings_table(broker, "CORRUPT_RECORD", key, rows, detail)


def _findings_table(broker: str, code: str, key: pa.Array, rows: np.ndarray, detail: pa.Array,
                    **columns: pa.Array) -> pa.Table:
    """AUDIT_ANOMALIES rows of the reducer (``source`` reconstruct): one per transaction ``rows`` of ``key``,
    with ``detail`` and the ``columns`` given; the other columns null."""
    n = len(rows)
    cols = {"broker": pa.array([broker] * n, pa.string()), "code": pa.array([code] * n, pa.string()),
            "source": pa.array(["reconstruct"] * n, pa.string()),
            "transaction_key": key.take(pa.array(rows, pa.int64())), "detail": detail, **columns}
    schema = AUDIT_ANOMALIES.arrow_schema()
    return pa.Table.from_arrays([cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema],
                                schema=schema)


__all__ = ["record_range", "statetable_damage_findings", "uncertain_findings", "unlinked_half"]
