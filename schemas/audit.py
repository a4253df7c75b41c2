"""Tables the reconstruction (jobs/reconstruct/spark.py) writes: one row per transaction, two work lists, findings.

Offsets are CommitLog byte offsets ("commitlog_offset") unless the name says queue offset.  Times are epoch
ms. Flag codes and their meaning live in ``jobs.reconstruct.flags.FLAGS``.
"""

from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _i32, _i64, _bool = pa.string(), pa.int32(), pa.int64(), pa.bool_()
_i64s, _strs = pa.list_(pa.int64()), pa.list_(pa.string())

PROFILES = Table.of(
    "profiles",
    [
        C("broker", _str, False, "broker / store name"),
        C("profile", _str, False, "3.x, 4.0-4.2, 4.3-5.0, 5.1+ or unknown (see jobs.reconstruct.spark.PROFILES)"),
        C("detected_profile", _str, False, "what the store files say, before any override"),
        C("evidence", _strs, False, "why: the on-disk facts the detection used"),
    ],
    "Transaction-format profile per broker store",
)

TRANSACTIONS = Table.of(
    "transactions",
    [
        C("broker", _str, False, "broker / store name"),
        C(
            "transaction_key",
            _str,
            False,
            "UNIQ_KEY where the version writes one (4.x+), else the prepared record's CommitLog offset in "
            "decimal (3.x)",
        ),
        C("uniq_key", _str, True, "UNIQ_KEY (client message id = transaction id); null in 3.x"),
        C(
            "transaction_id",
            _str,
            True,
            "__transactionId__ (5.1+ broker) else UNIQ_KEY: what CHECK_TRANSACTION_STATE carries",
        ),
        C("keys", _str, True, "KEYS property of the first prepared/half record (user keys)"),
        C("producer_group", _str, True, "PGROUP"),
        C(
            "real_topic",
            _str,
            True,
            "REAL_TOPIC of the halves (4.3+), else the topic of the prepared/commit record",
        ),
        C(
            "real_queue_id",
            _i32,
            True,
            "REAL_QID of the halves (4.3+), else the queue id of the prepared record",
        ),
        C("mechanism", _str, False, "HALF_QUEUE (4.3+ half/op topics) or PREPARED_RECORD (3.x, 4.0-4.2)"),
        C(
            "state",
            _str,
            False,
            "COMMITTED, ROLLED_BACK, DISCARDED, PREPARED or UNKNOWN_DAMAGED (resolved by an op, the COMMIT "
            "record's bytes unreadable); a COMMIT record wins over everything",
        ),
        C(
            "prepared_commitlog_offset",
            _i64,
            True,
            "first half/prepared record (null when only later evidence survives)",
        ),
        C("first_copy_commitlog_offset", _i64, True, "oldest half copy / prepared record: CommitLog offset"),
        C(
            "first_copy_queue_offset",
            _i64,
            True,
            "its QUEUEOFFSET (half-queue offset 4.3+, statetable index 3.x, 0 in 4.0-4.2)",
        ),
        C("first_copy_store_timestamp", _i64, True, "its store time"),
        C(
            "newest_copy_commitlog_offset",
            _i64,
            True,
            "newest half copy (what a check and EndTransaction reference)",
        ),
        C("newest_copy_queue_offset", _i64, True, "its QUEUEOFFSET"),
        C("newest_copy_store_timestamp", _i64, True, "its store time"),
        C("newest_copy_msg_id", _str, True, "its offsetMsgId"),
        C("newest_copy_check_times", _i32, True, "its TRANSACTION_CHECK_TIMES (null when absent)"),
        C("copies", _i32, False, "number of half copies / prepared records (0 when none survives)"),
        C(
            "check_times",
            _i32,
            True,
            "max TRANSACTION_CHECK_TIMES over the copies (null when no copy has one)",
        ),
        C("check_immunity_time_s", _i64, True, "CHECK_IMMUNITY_TIME_IN_SECONDS of the first copy"),
        C("born_timestamp", _i64, True, "producer BORNTIMESTAMP (same on every copy)"),
        C("age_ms", _i64, True, "as_of_ms - born_timestamp"),
        C("commit_offsets", _i64s, False, "CommitLog offsets of COMMIT records, ascending"),
        C(
            "rollback_offsets",
            _i64s,
            False,
            "CommitLog offsets of ROLLBACK records (3.x, 4.0-4.2), ascending",
        ),
        C(
            "op_half_offsets",
            _i64s,
            False,
            "half-queue offsets of this transaction's copies named in op bodies, ascending",
        ),
        C("op_queue_offsets", _i64s, False, "op-queue offsets of the op messages naming them, ascending"),
        C("resolved_timestamp", _i64, True, "store time of the first commit / rollback record / op message"),
        C("discard_commitlog_offset", _i64, True, "newest TRANS_CHECK_MAX_TIME_TOPIC record"),
        C("discard_msg_id", _str, True, "its offsetMsgId (input of RESUME_CHECK_HALF_MESSAGE)"),
        C("discards", _i32, False, "number of TRANS_CHECK_MAX_TIME_TOPIC records"),
        C("statetable_index", _i64, True, "3.x: index of the statetable unit for the prepared record"),
        C("statetable_state", _str, True, "3.x: state of that unit (PREPARED, COMMIT, ROLLBACK, UNKNOWN(n))"),
        C(
            "redolog_state",
            _str,
            True,
            "3.x: PREPARED, COMMIT, ROLLBACK, ENDED (END whose record is gone) or null",
        ),
        C(
            "open_copy_offsets",
            _i64s,
            False,
            "[newest copy's half-queue offset] when it has no op and is at/above the half consume offset: "
            "what the check service will still visit; else []",
        ),
        C("flags", _strs, False, "documented codes, see jobs.reconstruct.flags.FLAGS"),
        C(
            "deadline_ms",
            _i64,
            True,
            "PREPARED only: when the broker discards it (4.3+) / retention may delete it (3.x, 4.0-4.2); see "
            "jobs.reconstruct.spark",
        ),
        C("profile", _str, False, "profile used for this broker"),
        C("as_of_ms", _i64, False, "audit time"),
    ],
    "One row per transactional message, reconstructed from the store",
    partition_by=("broker",),
)

CHECK_BACK = Table.of(
    "check_back_worklist",
    [
        C("urgency_rank", _i32, False, "1 = most urgent (soonest deadline, then oldest)"),
        C(
            "priority",
            _str,
            False,
            "CRITICAL (deadline within one check interval), HIGH (never checked), NORMAL",
        ),
        C("broker", _str, False, "broker / store name"),
        C("producer_group", _str, False, "group whose producer must answer"),
        C("transaction_key", _str, False, "see transactions"),
        C(
            "request_topic",
            _str,
            False,
            "header topic: the half topic (4.3+) or the real topic (3.x, 4.0-4.2)",
        ),
        C("commitlog_offset", _i64, False, "header commitLogOffset: newest copy"),
        C(
            "tran_state_table_offset",
            _i64,
            False,
            "header tranStateTableOffset: newest copy's half-queue offset (4.3+), statetable index (3.x)",
        ),
        C("offset_msg_id", _str, False, "header offsetMsgId: newest copy's offsetMsgId"),
        C("msg_id", _str, False, "header msgId: UNIQ_KEY (offsetMsgId in 3.x)"),
        C("uniq_key", _str, True, "UNIQ_KEY"),
        C("transaction_id", _str, True, "header transactionId"),
        C("real_topic", _str, True, "topic the producer sent to"),
        C("real_queue_id", _i32, True, "queue the producer sent to"),
        C("check_times", _i32, True, "TRANSACTION_CHECK_TIMES of the newest copy"),
        C("age_ms", _i64, False, "as_of - born"),
        C("deadline_ms", _i64, True, "see transactions"),
        C("profile", _str, False, "profile"),
    ],
    "Transactions to send CHECK_TRANSACTION_STATE for now, most urgent first",
)

RECOVERY = Table.of(
    "recovery_worklist",
    [
        C("broker", _str, False, "broker / store name"),
        C("transaction_key", _str, False, "see transactions"),
        C("uniq_key", _str, True, "UNIQ_KEY"),
        C("producer_group", _str, True, "PGROUP"),
        C("real_topic", _str, True, "real topic"),
        C("state", _str, False, "reconstructed state"),
        C("action", _str, False, "most important action (see jobs.reconstruct.spark.RECOVERY_ACTIONS)"),
        C("actions", _strs, False, "every applicable action, most important first"),
        C("reason", _str, False, "why, in words (from the flags)"),
        C("flags", _strs, False, "the transaction's flags"),
        C("prepared_commitlog_offset", _i64, True, "first half/prepared record"),
        C("newest_copy_commitlog_offset", _i64, True, "newest copy"),
        C("newest_copy_queue_offset", _i64, True, "newest copy's QUEUEOFFSET"),
        C("commit_offsets", _i64s, False, "COMMIT records"),
        C("rollback_offsets", _i64s, False, "ROLLBACK records"),
        C("op_queue_offsets", _i64s, False, "op messages"),
        C(
            "mark_done_half_offsets",
            _i64s,
            False,
            "MARK_DONE: half-queue offsets that need an op (d-tagged, body = offset)",
        ),
        C("discard_commitlog_offset", _i64, True, "discard record"),
        C("resume_topic", _str, True, "RESUME_DISCARDED: RESUME_CHECK_HALF_MESSAGE (code 323) header topic"),
        C("resume_msg_id", _str, True, "RESUME_DISCARDED: header msgId = offsetMsgId of the discard record"),
        C("statetable_index", _i64, True, "3.x statetable unit index"),
        C("deadline_ms", _i64, True, "see transactions"),
        C("profile", _str, False, "profile"),
    ],
    "Transactions needing operator action",
)

AUDIT_ANOMALIES = Table.of(
    "audit_anomalies",
    [
        C("broker", _str, False, "broker / store name"),
        C("code", _str, False, "flag code (jobs.reconstruct.flags.FLAGS) or decoder anomaly kind (txlog_io AnomalyKind)"),
        C("source", _str, False, "reconstruct, or the decoder that reported it"),
        C("physical_offset", _i64, True, "CommitLog offset concerned, when known"),
        C("topic", _str, True, "topic concerned"),
        C("queue_id", _i32, True, "queue concerned"),
        C("queue_offset", _i64, True, "queue offset concerned (half-queue offset for ops)"),
        C("transaction_key", _str, True, "transaction the finding was attached to (null = not attributable)"),
        C("file", _str, True, "file (decoder findings)"),
        C("position", _i64, True, "byte position in that file (decoder findings)"),
        C("length", _i64, True, "bytes of the damaged range that starts at position (null: not a byte range)"),
        C("detail", _str, False, "human-readable reason"),
    ],
    "Findings: decoder anomalies, plus evidence no transaction could be attached to",
)

AUDIT_TABLES = {t.name: t for t in (PROFILES, TRANSACTIONS, CHECK_BACK, RECOVERY, AUDIT_ANOMALIES)}
