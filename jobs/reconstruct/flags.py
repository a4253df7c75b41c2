"""The documented flag codes the reconstruction puts on transactions (and on unattributable findings).

``FLAGS`` maps code -> description; it is the public contract (codes appear in the Delta tables, work lists
and tests).  ``ANOMALY_ONLY`` are codes that can only appear in the audit_anomalies table, because the
evidence they describe cannot be attached to a transaction.  ``RECOVERY_ACTIONS`` maps each recovery_worklist
action to what the operator is expected to do.

Terms: "copy" = a half record in RMQ_SYS_TRANS_HALF_TOPIC (the original or a re-put by the check service);
"op" = an offset named in the body of an RMQ_SYS_TRANS_OP_HALF_TOPIC message (a half-queue offset); "discard"
= a TRANS_CHECK_MAX_TIME_TOPIC record; timeout = transactionTimeOut, or CHECK_IMMUNITY_TIME_IN_SECONDS x 1000
when the message has one (the broker's check immunity); consume offsets are those of CID_RMQ_SYS_TRANS.
"""

from __future__ import annotations

FLAGS: dict = {
    # --- still-open transactions ----------------------------------------------------------------------------
    "PREPARED_PAST_TIMEOUT": (
        "PREPARED and as_of - born > timeout (transactionTimeOut, or the message's check immunity): due for "
        "a check-back."
    ),
    "PREPARED_NEVER_CHECKED": (
        "PREPARED past timeout and no check is visible on disk: a single copy without "
        "TRANSACTION_CHECK_TIMES (4.3+), or any 4.0-4.2 prepared record (that line has no check service). "
        "Not raised for 3.x, whose checks leave no trace in the store."
    ),
    "AT_CHECK_MAX": (
        "PREPARED (4.3+) and the newest copy's TRANSACTION_CHECK_TIMES >= transactionCheckMax: the next "
        "check pass discards it to TRANS_CHECK_MAX_TIME_TOPIC (4.6+; 4.3-4.5 only log it) instead of "
        "checking it."
    ),
    "AGE_PAST_FILE_RESERVED_TIME": (
        "PREPARED and as_of - born > fileReservedTime: 4.3+ discards it at the next pass (needSkip); in "
        "every version its records may already be eligible for deletion by retention."
    ),
    "PAST_DEADLINE": (
        "PREPARED and deadline_ms <= as_of: the broker should already have discarded it (or retention "
        "deleted it); it is still PREPARED because the broker was stopped, lost the discard (4.3-4.5 write "
        "none), or the snapshot is older than as_of."
    ),
    "PREPARED_PASSED_BY_CHECKER": (
        "PREPARED (4.3+) with no op and no discard, but its newest copy is below the half consume offset: "
        "the check service has moved past it and will never check it again."
    ),
    # --- resolution evidence --------------------------------------------------------------------------------
    "DUPLICATE_COMMIT": (
        "More than one COMMIT record for the transaction (each points to a different copy): consumers "
        "received the message more than once."
    ),
    "COMMIT_WITHOUT_OP": (
        "4.3+: a COMMIT record whose copy has no op (crash between the commit write and the op write, or a "
        "5.1+ op batch lost in memory): the broker keeps checking that copy."
    ),
    "RESOLVED_COPY_PENDING_CHECK": (
        "4.3+: resolved, but the newest copy has no op (also none for its TRAN_PREPARED_QUEUE_OFFSET) and "
        "is at/above the half consume offset (or none is known): the check service will check it (the "
        "producer may commit again: DUPLICATE_COMMIT) or discard it. Older copies never count: the service "
        "re-puts a copy while passing the previous one."
    ),
    "OP_WITHOUT_HALF": (
        "An op names a half-queue offset at or above the oldest retained half record but no half record has "
        "that QUEUEOFFSET (orphan op)."
    ),
    "OP_BELOW_HALF_CONSUME_OFFSET": (
        "An op of this transaction is not yet consumed by the check service (op queue offset >= op consume "
        "offset) but names a copy below the half consume offset: the broker will ignore it (the checker "
        "already passed that copy). Still valid evidence of the resolution."
    ),
    "CONFLICTING_ENDS": (
        "Both commit and rollback evidence: a COMMIT record and a ROLLBACK record (3.x, 4.0-4.2), or a "
        "COMMIT record plus an op on a copy that no COMMIT record points to (4.3+: op without commit = "
        "rollback)."
    ),
    "DISCARDED_WITH_RESOLUTION": (
        "Discarded to TRANS_CHECK_MAX_TIME_TOPIC although a COMMIT record or op exists (the resolution wins; "
        "the discard is noise, cf. RocketMQ issue #8311 and op batching in 5.1+)."
    ),
    "RESUMED_AFTER_DISCARD": (
        "PREPARED although discarded once: a half copy newer than its last TRANS_CHECK_MAX_TIME_TOPIC record "
        "exists (RESUME_CHECK_HALF_MESSAGE re-puts it with TRANSACTION_CHECK_TIMES=0), so the check service "
        "handles it again."
    ),
    "PREPARED_RECORD_MISSING": (
        "Commit/rollback/discard evidence, or a 3.x statetable unit / redolog PREPARED entry, whose half or "
        "prepared record is not in the store (or, 4.3+, only re-put copies survive), and retention does not "
        "explain it (the offset it points to is not below the oldest retained CommitLog offset; no file was "
        "deleted): a damaged record, or a unit pointing to garbage."
    ),
    # --- store integrity ------------------------------------------------------------------------------------
    "CQ_MISMATCH": (
        "A consume-queue unit of the half/op/discard queues disagrees with the CommitLog records of those "
        "topics (no record at its offset, other size, topic, queue or queue offset, two units for one "
        "record), or such a record has no CQ unit (checked for brokers that have consume-queue units)."
    ),
    "EVIDENCE_IN_DELETED_RANGE": (
        "Evidence points into CommitLog ranges already deleted by retention: a commit/rollback whose "
        "prepared offset is below the oldest retained CommitLog offset, an op naming a half offset below the "
        "oldest retained half record, a CQ unit or statetable unit pointing below the oldest retained "
        "CommitLog offset, or a transaction whose oldest surviving half copy is a re-put (the original is "
        "gone) while retention has deleted CommitLog files."
    ),
    "CORRUPT_RECORD": (
        "A CommitLog decoder anomaly lies inside one of the transaction's records (findings about a whole "
        "file -- size, gap, missing file -- do not count), or one of them fails its body CRC (the record "
        "still counts as evidence: BODYCRC covers only the body), or a COMMIT / ROLLBACK record and the half "
        "copy its PREPARED_TRANSACTION_OFFSET names disagree on the transaction (UNIQ_KEY, PGROUP, topic): "
        "EndTransactionProcessor copies that half's properties into the record it writes, so one of the "
        "two was damaged; both transactions (the copy's and the one the record carries) are flagged.  On a "
        "5.1+ store also a half copy, discard or COMMIT / ROLLBACK record whose __transactionId__ property "
        "differs from its UNIQ_KEY (TransactionalMessageBridge.parseHalfMessageInner sets the one from the "
        "other on every half; the records made from it copy both): the transaction of either value is flagged.  3.x: "
        "its statetable unit says COMMIT / ROLLBACK while no COMMIT / ROLLBACK record of it was read and the "
        "redolog (undamaged) has no END unit for it: TransactionStateService.updateTransactionState writes "
        "that state only when it dispatches the END record, and the END's redolog unit follows, so the unit "
        "was damaged; the state is then the CommitLog's, and a CORRUPT_RECORD finding names the unit's "
        "statetable bytes."
    ),
    "STATE_UNCERTAIN_DAMAGED_RANGE": (
        "The state rests on the absence of a record (ROLLED_BACK from an op without a COMMIT record, PREPARED "
        "from no op / COMMIT / ROLLBACK record, DISCARDED from no resolution) while CommitLog bytes where "
        "that record would lie could not be read (a cut file, a torn or garbled record, a zeroed page, "
        "garbage, a missing file: jobs/reconstruct/damage.py).  The window per inference: a COMMIT record "
        "lies after the half it commits and before its op (EndTransactionProcessor writes it first); a "
        "resolution or discard of a PREPARED / DISCARDED one anywhere after its first half record.  An "
        "op-rolled-back one becomes UNKNOWN_DAMAGED; PREPARED and DISCARDED keep their state (what the broker "
        "itself acts on).  The same for flags reached by absence on a state read from a record: "
        "COMMIT_WITHOUT_OP is then not asserted (its op is written after the COMMIT, any time later), "
        "RESOLVED_COPY_PENDING_CHECK is kept (lost range after the newest copy); the same where the "
        "transaction's own half copy lacks REAL_TOPIC / REAL_QID / PGROUP, or a COMMIT / ROLLBACK record carrying its "
        "id names another transaction's half copy, or a record whose __transactionId__ is its id carries another "
        "UNIQ_KEY (CORRUPT_RECORD: its resolution may be that record); "
        "and, 3.x, for "
        "STATETABLE_MISSING_PREPARED / REDOLOG_COMMITLOG_DISAGREE / STATETABLE_REDOLOG_DISAGREE or a state "
        "from the tables alone when that table has lost units.  A STATE_UNCERTAIN_DAMAGED_RANGE finding "
        "(audit_anomalies, same transaction_key) names the damaged range (or table) and the inference."
    ),
    "EVIDENCE_NOT_COMMITTED": (
        "DLedger (Raft) store: one of the transaction's records lies past the DLedger checkpoint's "
        "committedIndex (finding DLEDGER_UNCOMMITTED): the group may not have committed it, and a new leader "
        "of a multi-replica group may truncate it -- the state may roll back to what the committed log says."
    ),
    "OP_BODY_UNPARSABLE": (
        "An op body piece is not a decimal number (4.x/5.0 readers treat the whole body as one number; 5.1+ "
        "split on ','). The broker reads it as -1 and ignores it."
    ),
    "OP_BODY_MISSING": (
        "An op record whose body was not provided to the reconstruction (the op_bodies input lacks it): "
        "resolutions recorded by it are unknown."
    ),
    # --- 3.x statetable / redolog ---------------------------------------------------------------------------
    "STATETABLE_REDOLOG_DISAGREE": (
        "3.x: the statetable unit's state and the redolog disagree (e.g. unit PREPARED but the redolog has "
        "an END entry, or unit COMMIT but the redolog END is a rollback)."
    ),
    "STATETABLE_COMMITLOG_DISAGREE": (
        "3.x: the statetable unit's state differs from what the CommitLog COMMIT/ROLLBACK records say (e.g. "
        "a failed statetable update after a rebuild: the broker keeps checking a resolved transaction)."
    ),
    "REDOLOG_COMMITLOG_DISAGREE": (
        "3.x: the redolog lacks the PREPARED entry for a prepared record, or its END entries differ from the "
        "CommitLog's COMMIT/ROLLBACK records."
    ),
    "STATETABLE_MISSING_PREPARED": (
        "3.x: a still-PREPARED transaction's prepared record has no statetable unit (e.g. dropped by the "
        "faulty statetable rebuild after an abnormal restart): the broker will never check it.  (A resolved "
        "one legitimately has none after a rebuild, which keeps only the open units.)"
    ),
    "STATETABLE_INDEX_MISMATCH": (
        "3.x: the prepared record's QUEUEOFFSET differs from its statetable unit's index (statetable "
        "rebuilt): a check-driven EndTransaction is rejected, and a producer's own one cannot update the "
        "unit."
    ),
}

#: the flag (and finding code) of a state or flag that rests on bytes nobody read
UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"

ANOMALY_ONLY = frozenset({"OP_WITHOUT_HALF", "OP_BODY_UNPARSABLE", "OP_BODY_MISSING"})

#: recovery_worklist actions, most important first (a transaction's ``action`` is the first that applies).
RECOVERY_ACTIONS: dict = {
    "CHECK_BACK_DAMAGED": (
        "STATE_UNCERTAIN_DAMAGED_RANGE on a state not read from a record (UNKNOWN_DAMAGED, PREPARED, "
        "DISCARDED): the state rests on bytes that could not be read.  Ask the producer group for the outcome "
        "(a check-back: CHECK_TRANSACTION_STATE with the transaction id, the row is in check_back_worklist "
        "when a half copy survives) before any other action on it.  (On COMMITTED / ROLLED_BACK only a flag "
        "rests on lost bytes: REVIEW_EVIDENCE.)"
    ),
    "REBUILD_STATETABLE": (
        "3.x: the statetable does not reflect the CommitLog (missing unit, wrong index, or stale state). "
        "Rebuild it from the CommitLog/redolog (offline, broker stopped) so the check timer sees exactly the "
        "open ones."
    ),
    "REVIEW_CONFLICTING_ENDS": (
        "Commit and rollback evidence for one transaction: confirm with the producer which outcome holds; "
        "the message was delivered (COMMIT record) whatever the rollback says."
    ),
    "REVIEW_DUPLICATE_COMMIT": (
        "The committed message was delivered once per COMMIT record: make sure consumers de-duplicated on "
        "UNIQ_KEY / keys."
    ),
    "MARK_DONE": (
        "4.3+: resolved but the broker will still check a copy: write an op message (topic "
        "RMQ_SYS_TRANS_OP_HALF_TOPIC, queue = half queue, tag 'd', body = the half offsets in "
        "mark_done_half_offsets) so the check service skips it."
    ),
    "RESUME_DISCARDED": (
        "Discarded without resolution: send RESUME_CHECK_HALF_MESSAGE (request code 323; mqadmin "
        "resumeCheckHalfMessage) with topic resume_topic (TRANS_CHECK_MAX_TIME_TOPIC) and msgId "
        "resume_msg_id (offsetMsgId of the discard record; 4.x headers carry only msgId). The broker re-puts "
        "it into the half topic with TRANSACTION_CHECK_TIMES=0 and checks it again."
    ),
    "REDRIVE_EXPIRED": (
        "PREPARED beyond automatic handling (at transactionCheckMax, past fileReservedTime or its deadline): "
        "ask the producer's owner for the outcome and re-send the message (or resume it once discarded)."
    ),
    "REVIEW_EVIDENCE": (
        "The state rests on damaged, missing or uncommitted evidence (CORRUPT_RECORD, CQ_MISMATCH, "
        "EVIDENCE_IN_DELETED_RANGE, PREPARED_RECORD_MISSING, "
        "EVIDENCE_NOT_COMMITTED): verify before acting on it."
    ),
}


def describe(code: str) -> str:
    """Description of a flag code (KeyError for an unknown code: every code used must be documented)."""
    return FLAGS[code]
