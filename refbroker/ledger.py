"""Ground-truth ledger: what the reference broker knows it wrote, per transaction, and every injected fault.

Written as JSON lines to ``<out>/ledger.jsonl`` (next to the store, never inside it) plus
``<out>/summary.json``. Each line has ``"kind"``: ``"transaction"`` or ``"fault"``.

Transaction line (field names are a contract for the audit tests)::

    kind                 "transaction"
    transaction_key      UNIQ_KEY (4.3+); the prepared record's CommitLog offset in decimal for 3.x and
                         4.0-4.2 (3.x writes no UNIQ_KEY; 4.0-4.2 keys by prepared offset too because there is
                         exactly one prepared record per transaction and COMMIT/ROLLBACK point at it)
    uniq_key             UNIQ_KEY property or null (3.x)
    producer_group       PGROUP
    real_topic, real_queue_id
    keys                 KEYS property (the workload's readable id, e.g. "TX-42")
    born_timestamp       producer clock, epoch ms
    profile              profile name the half was written under (changes in the upgrade scenario)
    outcome              COMMITTED | ROLLED_BACK | DISCARDED | PREPARED  (definition below)
    visible_outcome      the same rule applied only to evidence still readable after the injected faults
                         (retention, truncation, corruption); what an auditor can at best conclude
    producer_decision    what the producer's local transaction decided: COMMIT | ROLLBACK | UNKNOWN | NONE
    end_at_send          the EndTransaction action the producer sent right after the half (or null)
    check_count          CHECK_TRANSACTION_STATE requests the broker delivered to a producer
    checks_skipped       check attempts with no connected producer of the group
    max_check_times      highest TRANSACTION_CHECK_TIMES written on any copy (0 if none)
    check_immunity_time_s  CHECK_IMMUNITY_TIME_IN_SECONDS the producer set on the half (int), or null
    half_copies          [{commitlog_offset, size, queue_offset, store_timestamp, file, file_position,
                           copy_kind: ORIGINAL | CHECK_COPY | IMMUNITY_COPY, check_times,
                           tran_prepared_queue_offset,
                           present}]      (3.x / 4.0-4.2: the PREPARED record, queue_offset as written)
    commit_records       [{commitlog_offset, size, queue_id, queue_offset, prepared_transaction_offset,
                           store_timestamp, file, file_position, from_check, present}]
    rollback_records     same (3.x / 4.0-4.2 ROLLBACK records; queue_offset as written)
    op_records           [{half_queue_offset, op_queue_offset, op_commitlog_offset, op_size, file,
                           file_position, body_offsets, present}]  (one entry per (op message, half offset
                           of this transaction))
    lost_ops             [{half_queue_offset, reason}]   ops the broker accepted but never wrote
    discard_records      [{commitlog_offset, size, queue_offset, check_times, half_queue_offset,
                           reason: CHECK_MAX | FILE_RESERVED_TIME, recorded, file, file_position, present,
                           store_timestamp}]   (recorded=false: 4.3-4.5 only logs)
    end_requests         [{time, action, from_check, commitlog_offset, tran_state_table_offset, accepted,
                           reason}]
    statetable           3.x: {index, state} of the unit for this transaction as on disk at the end (or null)
    flags                sorted list of anomaly flags (below)
    faults               [fault ids] of injected faults that touched this transaction's records

Outcome (what the broker did; the auditor's rule "a COMMIT record exists => COMMITTED" is authoritative):

* COMMITTED   at least one COMMIT record was written whole (a torn record does not count), whatever else
              happened: committed-and-discarded and committed-and-rolled-back are COMMITTED, flagged
              COMMITTED_AND_DISCARDED / COMMIT_AND_ROLLBACK.
* ROLLED_BACK no COMMIT record; the broker durably recorded a rollback: an op message on disk for one of the
              half copies (4.3+), or a ROLLBACK record (3.x, 4.0-4.2).  Also discarded =>
              ROLLED_BACK_AND_DISCARDED.
* DISCARDED   neither of the above, and the check service gave up: a TRANS_CHECK_MAX_TIME_TOPIC record (4.6+)
              or the log-only give-up of 4.3-4.5 (flag DISCARD_NOT_RECORDED: nothing on disk shows it).
* PREPARED    none of the above: still pending from the broker's point of view (including a rollback whose op
              was lost in a crash: flag OP_LOST_IN_CRASH).

visible_outcome applies the same precedence to records with ``present`` true (an op counts only while the half
copy it names is readable: op bodies hold half queue offsets, nothing else); for a log-only discard it is
PREPARED; 3.x: after the records, a statetable unit in state COMMIT / ROLLBACK (still on disk) decides, as
only the dispatch of such a record writes that state.  A record whose body alone was damaged stays present:
BODYCRC covers only the body, the type, PREPARED_TRANSACTION_OFFSET and properties an auditor reads are intact
(a COMMIT record still proves the commit; it is flagged RECORD_CORRUPTED).

Flags (what the broker knows it caused): DUPLICATE_COMMIT, COMMIT_WITHOUT_OP, OP_LOST_IN_CRASH,
COMMITTED_AND_DISCARDED, ROLLED_BACK_AND_DISCARDED, COMMIT_AND_ROLLBACK, DISCARD_NOT_RECORDED,
DUPLICATE_DISCARD, CHECKED, IMMUNITY_COPIES, END_REJECTED, TORN_RECORD, STATETABLE_STALE (3.x: the statetable
unit disagrees with the transaction's records, e.g. after the rebuild bug), STATETABLE_MISSING (3.x: pending
but absent from the rebuilt statetable), RECORD_DELETED (retention), RECORD_CORRUPTED, OP_QUEUE_DELETED,
PRODUCER_UNREACHABLE.

Fault line: {kind: "fault", fault_id, fault, file (relative to the store root; null for faults with no place
on disk such as OP_BATCH_LOST), position (the byte changed / cut / first affected), record_position (where a
decoder reports it: start of the damaged record or unit), length, detail, expected_anomalies (AnomalyKind
codes a decoder should report there), affected: [{record, commitlog_offset, transaction_key}], effects:
{deleted | corrupted: [[start, end) CommitLog offset ranges: records starting there become present false],
body_damaged: [[start, end) of records whose body alone fails its CRC: still present, flag RECORD_CORRUPTED],
statetable_units: [[index, new state]] (3.x: the line's statetable state becomes the flipped value, flags
RECORD_CORRUPTED and STATETABLE_STALE), op_queue_deleted}} plus fault-specific fields
(TORN_TAIL: commitlog_offset, overwritten; CQ_DISPATCH_LAG: redispatched; CQ_DELETED_AND_REBUILT: topic,
queue_id, first_queue_offset, recovery_start).  In-simulation faults: TORN_TAIL, CRASH_BETWEEN_COMMIT_AND_OP,
OP_BATCH_LOST, CQ_DISPATCH_LAG, CQ_DELETED_AND_REBUILT, STATETABLE_REBUILT; post-run faults: see
refbroker.faults.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Optional

from txlog_io.consumequeue import STATE_COMMIT, STATE_ROLLBACK

COMMITTED, ROLLED_BACK, DISCARDED, PREPARED = "COMMITTED", "ROLLED_BACK", "DISCARDED", "PREPARED"
OUTCOMES = (COMMITTED, ROLLED_BACK, DISCARDED, PREPARED)

# flags
DUPLICATE_COMMIT = "DUPLICATE_COMMIT"
COMMIT_WITHOUT_OP = "COMMIT_WITHOUT_OP"
OP_LOST_IN_CRASH = "OP_LOST_IN_CRASH"
COMMITTED_AND_DISCARDED = "COMMITTED_AND_DISCARDED"
ROLLED_BACK_AND_DISCARDED = "ROLLED_BACK_AND_DISCARDED"
COMMIT_AND_ROLLBACK = "COMMIT_AND_ROLLBACK"
DISCARD_NOT_RECORDED = "DISCARD_NOT_RECORDED"
DUPLICATE_DISCARD = "DUPLICATE_DISCARD"
CHECKED = "CHECKED"
IMMUNITY_COPIES = "IMMUNITY_COPIES"
END_REJECTED = "END_REJECTED"
TORN_RECORD = "TORN_RECORD"
STATETABLE_STALE = "STATETABLE_STALE"
STATETABLE_MISSING = "STATETABLE_MISSING"
RECORD_DELETED = "RECORD_DELETED"
RECORD_CORRUPTED = "RECORD_CORRUPTED"
OP_QUEUE_DELETED = "OP_QUEUE_DELETED"
PRODUCER_UNREACHABLE = "PRODUCER_UNREACHABLE"

ORIGINAL, CHECK_COPY, IMMUNITY_COPY = "ORIGINAL", "CHECK_COPY", "IMMUNITY_COPY"


def compute_outcome(commit_records, rollback_records, op_records, discard_records, half_copies,
                    present_only: bool, statetable: Optional[dict] = None) -> str:
    """The outcome rule of the module docstring; present_only=True gives visible_outcome.

    For visible_outcome an op only counts when the half copy it names is still readable: an op body holds half
    queue offsets, so without the half record nothing ties it to a transaction.  COMMIT, ROLLBACK and discard
    records identify their transaction themselves (UNIQ_KEY / PREPARED_TRANSACTION_OFFSET).  A 3.x statetable
    unit in state COMMIT / ROLLBACK (``statetable``, as on disk) is written only by the dispatch of such a
    record: it shows the end when the records themselves are gone (retention, damage)."""
    def live(items):
        return [r for r in items if r.get("present", True)] if present_only else items
    if live(commit_records):
        return COMMITTED
    ops = live(op_records)
    if present_only and ops:
        readable_halves = {c["queue_offset"] for c in half_copies if c.get("present", True)}
        ops = [op for op in ops if op["half_queue_offset"] in readable_halves]
    if live(rollback_records) or ops:
        return ROLLED_BACK
    if present_only and statetable is not None:
        if statetable["state"] == STATE_COMMIT:
            return COMMITTED
        if statetable["state"] == STATE_ROLLBACK:
            return ROLLED_BACK
    discards = live(discard_records)
    if any(d["recorded"] for d in discards) or (not present_only and discards):
        return DISCARDED
    return PREPARED


def entry_outcome(entry: dict, present_only: bool) -> str:
    """compute_outcome for a ledger line."""
    return compute_outcome(entry["commit_records"], entry["rollback_records"], entry["op_records"],
                           entry["discard_records"], entry["half_copies"], present_only,
                           entry.get("statetable"))


class HalfCopy:
    """One half (4.3+) or prepared (3.x / 4.0-4.2) record of a transaction, as the broker keeps it in
    memory."""

    __slots__ = ("txn", "commitlog_offset", "size", "queue_offset", "store_timestamp", "props", "check_times",
                 "copy_kind", "file", "file_position", "present", "sys_flag")

    def __init__(
        self,
        txn,
        commitlog_offset,
        size,
        queue_offset,
        store_timestamp,
        props,
        check_times,
        copy_kind,
        file,
        file_position,
        sys_flag,
    ):
        self.txn = txn
        self.commitlog_offset = commitlog_offset
        self.size = size
        self.queue_offset = queue_offset
        self.store_timestamp = store_timestamp
        self.props = props
        self.check_times = check_times
        self.copy_kind = copy_kind
        self.file = file
        self.file_position = file_position
        self.present = True
        self.sys_flag = sys_flag

    def to_dict(self) -> dict:
        return {
            "commitlog_offset": self.commitlog_offset,
            "size": self.size,
            "queue_offset": self.queue_offset,
            "store_timestamp": self.store_timestamp,
            "file": self.file,
            "file_position": self.file_position,
            "copy_kind": self.copy_kind,
            "check_times": self.check_times,
            "tran_prepared_queue_offset": _int_or_none(self.props.get("TRAN_PREPARED_QUEUE_OFFSET")),
            "present": self.present,
        }


def _int_or_none(value) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class Transaction:
    """The broker-side truth about one transaction, accumulated while the reference broker runs."""

    def __init__(
        self,
        *,
        uniq_key,
        producer_group,
        real_topic,
        real_queue_id,
        keys,
        born_timestamp,
        born_host,
        body,
        sys_flag,
        flag,
        props,
        profile_name,
        plan=None,
        producer=None,
    ):
        self.transaction_key: Optional[str] = uniq_key
        self.uniq_key = uniq_key
        self.producer_group = producer_group
        self.real_topic = real_topic
        self.real_queue_id = real_queue_id
        self.keys = keys
        self.born_timestamp = born_timestamp
        self.born_host = born_host
        self.body = body                    # as stored (compressed when sys_flag says so)
        self.sys_flag = sys_flag            # compression bits only
        self.flag = flag
        self.props = props                  # the half's property map, insertion order
        self.profile_name = profile_name
        self.plan = plan                    # the workload's plan (producer side)
        self.producer = producer
        self.send_result = None             # (commitlog_offset, queue_offset) the producer got back
        self.copies: list = []
        self.commit_records: list = []
        self.rollback_records: list = []
        self.op_records: list = []
        self.lost_ops: list = []
        self.discard_records: list = []
        self.end_requests: list = []
        self.check_count = 0
        self.checks_skipped = 0
        self.flags: set = set()
        self.faults: list = []
        self.pending_events = 0
        self.pending_op_offsets: set = set()
        self.producer_decision = "NONE"
        self.end_at_send = None
        self.statetable_index: Optional[int] = None
        self.statetable_state: Optional[int] = None
        self.local_done = True             # False while the producer still plans actions not yet scheduled
        self.uses_ops = True               # 4.3+ half/op model (False for 3.x and 4.0-4.2)

    # --------------------------------------------------------------------------------------------------------
    def op_half_offsets(self, present_only: bool = False) -> set:
        return {op["half_queue_offset"] for op in self.op_records if op["present"] or not present_only}

    def _outcome(self, present_only: bool, copies: Optional[list] = None) -> str:
        """``copies``: the copies' ``to_dict()`` when the caller has them already."""
        if present_only and copies is None:
            copies = [c.to_dict() for c in self.copies]
        return compute_outcome(
            self.commit_records,
            self.rollback_records,
            self.op_records,
            self.discard_records,
            copies if present_only else (),
            present_only,
            None if self.statetable_index is None else {"index": self.statetable_index,
                                                        "state": self.statetable_state},
        )

    @property
    def outcome(self) -> str:
        return self._outcome(False)

    @property
    def visible_outcome(self) -> str:
        return self._outcome(True)

    def derive_flags(self) -> None:
        """Flags that follow from the records (the event-driven ones are added while the broker runs)."""
        f = self.flags
        if len(self.commit_records) > 1:
            f.add(DUPLICATE_COMMIT)
        if self.commit_records and self.discard_records:
            f.add(COMMITTED_AND_DISCARDED)
        if not self.commit_records and (self.op_records or self.rollback_records) and self.discard_records:
            f.add(ROLLED_BACK_AND_DISCARDED)
        if len(self.discard_records) > 1:
            f.add(DUPLICATE_DISCARD)
        if any(not d["recorded"] for d in self.discard_records):
            f.add(DISCARD_NOT_RECORDED)
        if self.commit_records and self.rollback_records:
            f.add(COMMIT_AND_ROLLBACK)
        if self.lost_ops:
            f.add(OP_LOST_IN_CRASH)
        if self.check_count:
            f.add(CHECKED)
        if any(c.copy_kind == IMMUNITY_COPY for c in self.copies):
            f.add(IMMUNITY_COPIES)
        if self.commit_records and self.uses_ops:
            half_qo_by_offset = {c.commitlog_offset: c.queue_offset for c in self.copies}
            op_halves = self.op_half_offsets()
            if any(half_qo_by_offset.get(r["prepared_transaction_offset"]) not in op_halves
                   for r in self.commit_records):
                f.add(COMMIT_WITHOUT_OP)
        if any(not r.get("accepted", True) for r in self.end_requests):
            f.add(END_REJECTED)

    def to_dict(self) -> dict:
        self.derive_flags()
        copies = [c.to_dict() for c in self.copies]
        return {
            "kind": "transaction",
            "transaction_key": self.transaction_key,
            "uniq_key": self.uniq_key,
            "producer_group": self.producer_group,
            "real_topic": self.real_topic,
            "real_queue_id": self.real_queue_id,
            "keys": self.keys,
            "born_timestamp": self.born_timestamp,
            "profile": self.profile_name,
            "outcome": self.outcome,
            "visible_outcome": self._outcome(True, copies),
            "producer_decision": self.producer_decision,
            "end_at_send": self.end_at_send,
            "check_count": self.check_count,
            "checks_skipped": self.checks_skipped,
            "max_check_times": max([c.check_times or 0 for c in self.copies] or [0]),
            "check_immunity_time_s": _int_or_none(self.props.get("CHECK_IMMUNITY_TIME_IN_SECONDS")),
            "half_copies": copies,
            "commit_records": self.commit_records,
            "rollback_records": self.rollback_records,
            "op_records": self.op_records,
            "lost_ops": self.lost_ops,
            "discard_records": self.discard_records,
            "end_requests": self.end_requests,
            "statetable": (None if self.statetable_index is None
                           else {"index": self.statetable_index, "state": self.statetable_state}),
            "flags": sorted(self.flags),
            "faults": sorted(set(self.faults), key=lambda f: int(f[1:])),
        }


#: json.dumps(entry, separators=(",", ":")) without building an encoder per line, and without the check for
#: circular references (a ledger line is a tree of fresh dicts and lists: the same text, less work per container)
_LINE_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


class Tally:
    """The summary's counts (per outcome / visible outcome / flag / fault) of the ledger lines added."""

    def __init__(self):
        self.transactions = 0
        self.outcomes, self.visible, self.flags, self.faults = Counter(), Counter(), Counter(), Counter()

    def add(self, entry: dict) -> None:
        kind = entry["kind"]
        if kind == "transaction":
            self.transactions += 1
            self.outcomes[entry["outcome"]] += 1
            self.visible[entry["visible_outcome"]] += 1
            self.flags.update(entry["flags"])
        elif kind == "fault":
            self.faults[entry["fault"]] += 1

    def merge(self, other: "Tally") -> "Tally":
        self.transactions += other.transactions
        self.outcomes.update(other.outcomes)
        self.visible.update(other.visible)
        self.flags.update(other.flags)
        self.faults.update(other.faults)
        return self


class LedgerWriter:
    """Streams transaction lines to a JSON-lines file; counts outcomes and flags for the summary (``tally``:
    the lines this writer wrote)."""

    def __init__(self, path, append: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a" if append else "w", encoding="utf-8", buffering=1 << 20)
        self.count = 0
        self.tally = Tally()

    def write(self, entry: dict) -> None:
        self._fh.write(_LINE_ENCODER.encode(entry))
        self._fh.write("\n")
        self.count += 1
        self.tally.add(entry)

    def flush(self) -> None:
        self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def iter_ledger(path):
    """Yield every ledger line as a dict (the tests' reader)."""
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def summarize(ledger_path, extra: Optional[dict] = None, tally: Optional[Tally] = None) -> dict:
    """Counts per outcome / visible outcome / flag / fault of a finished ledger file: read from the file, or
    ``tally``, the counts of the writers that wrote every line of it."""
    if tally is None:
        tally = Tally()
        for entry in iter_ledger(ledger_path):
            tally.add(entry)
    summary = {
        "transactions": tally.transactions,
        "outcomes": {k: tally.outcomes.get(k, 0) for k in OUTCOMES},
        "visible_outcomes": {k: tally.visible.get(k, 0) for k in OUTCOMES},
        "flags": dict(sorted(tally.flags.items())),
        "faults": dict(sorted(tally.faults.items())),
    }
    if extra:
        summary.update(extra)
    return summary


def write_json(path, obj) -> None:
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


__all__ = ["Transaction", "HalfCopy", "LedgerWriter", "Tally", "iter_ledger", "summarize", "OUTCOMES", "COMMITTED",
           "ROLLED_BACK", "DISCARDED", "PREPARED"]
