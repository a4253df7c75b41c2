"""What ``recover`` would send, from one audit run's tables (no Spark; small tables read on the driver).

* RESUME_CHECK_HALF_MESSAGE (323) per RESUME_DISCARDED row of ``recovery_worklist``: header ``msgId`` = the
  discard record's offsetMsgId (``AdminBrokerProcessor.resumeCheckHalfMessage`` decodes it with
  ``MessageDecoder.decodeMessageId``, reads that record with ``selectOneMessageByOffset`` and puts it back on
  the half topic with TRANSACTION_CHECK_TIMES=0 -- in 4.9.8 and 5.3.3 alike) and ``topic`` =
  TRANS_CHECK_MAX_TIME_TOPIC (5.x ``ResumeCheckHalfMessageRequestHeader.topic``; 4.9.8 ignores it).
* END_TRANSACTION (37) per line of the operator's decisions file naming a transaction the audit found
  PREPARED on the half queue: the fields ``DefaultMQProducerImpl.checkTransactionState`` sends when a
  producer answers a check -- ``fromTransactionCheck=true`` (so 5.x's ``rejectCommitOrRollback`` immunity
  rule does not apply), ``commitLogOffset`` / ``tranStateTableOffset`` = the NEWEST half copy's CommitLog
  offset and half-queue offset (``EndTransactionProcessor.checkPrepareMessage`` compares both with the
  message it reads at commitLogOffset), ``producerGroup`` = its PGROUP (compared too), ``msgId`` = UNIQ_KEY,
  ``transactionId``, ``commitOrRollback`` = 8 (TRANSACTION_COMMIT_TYPE) or 12 (TRANSACTION_ROLLBACK_TYPE),
  ``topic`` = the real topic and ``brokerName`` (5.x header fields, ignored by 4.9.8).

Decisions file: one transaction per line, ``<transaction_key> COMMIT|ROLLBACK`` (separated by blanks, a comma
or ``=``); blank lines and ``#`` comments are skipped.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from jobs.delta.tables import read_table
from txlog_io.errors import UsageError
from txlog_io.msgid import decode_offset_msg_id
from txlog_io.remoting import END_TRANSACTION, RESUME_CHECK_HALF_MESSAGE

RESUME, END = "RESUME_CHECK_HALF_MESSAGE", "END_TRANSACTION"
COMMIT_OR_ROLLBACK = {"COMMIT": 8, "ROLLBACK": 12}     # MessageSysFlag.TRANSACTION_COMMIT_TYPE / _ROLLBACK_TYPE
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"


@dataclass
class Request:
    kind: str                       # RESUME or END
    broker: str                     # audited broker name
    transaction_key: str
    uniq_key: Optional[str]
    real_topic: str
    store_host: str                 # host of the copy the header names (from its offsetMsgId)
    header: Dict[str, str]
    decision: Optional[str] = None
    # what the audit saw, for the staleness check (jobs.recover.live)
    newest_copy_offset: Optional[int] = None
    discard_offset: Optional[int] = None
    notes: List[str] = field(default_factory=list)

    @property
    def code(self) -> int:
        return RESUME_CHECK_HALF_MESSAGE if self.kind == RESUME else END_TRANSACTION

    @property
    def log_key(self) -> Tuple[str, str, str]:
        return (self.broker, self.transaction_key, self.kind)


def pick_run(out: str, run_id: Optional[str]) -> dict:
    runs = read_table(os.path.join(out, "audit_runs"), what="audit_runs")
    if runs is None:
        raise UsageError(f"--out: no audit_runs table under {out} (run the audit first)")
    rows = runs.to_pylist()
    if run_id is not None:
        rows = [r for r in rows if r["run_id"] == run_id]
        if not rows:
            raise UsageError(f"--run-id: no finished audit run {run_id!r} in {out}")
    if not rows:
        raise UsageError(f"--out: no finished audit run in {out}")
    return max(rows, key=lambda r: (r["finished_at"], r["run_id"]))


def _rows(run: dict, logical: str) -> list:
    path = dict(run["table_paths"]).get(logical, os.path.join(run["out"], logical))
    t = read_table(path, what=logical, run_id=run["run_id"])
    return t.to_pylist() if t is not None else []


_LINE = re.compile(r"^\s*(\S+?)\s*[\s,=]\s*(\w+)\s*$")


def read_decisions(path: str) -> Dict[str, str]:
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as e:
        raise UsageError(f"--decisions: cannot read {path}: {e.strerror}") from None
    out: Dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or m.group(2).upper() not in COMMIT_OR_ROLLBACK:
            raise UsageError(f"--decisions: {path} line {n}: expected '<transaction_key> COMMIT|ROLLBACK', "
                             f"got {line.strip()[:80]!r}")
        key, decision = m.group(1), m.group(2).upper()
        if out.get(key, decision) != decision:
            raise UsageError(f"--decisions: {path} line {n}: {key} given both COMMIT and ROLLBACK")
        out[key] = decision
    return out


def _host(msg_id: Optional[str]) -> str:
    return decode_offset_msg_id(msg_id)[0] if msg_id else ""


def resume_requests(run: dict, brokers: Optional[set]) -> List[Request]:
    out = []
    for r in _rows(run, "recovery_worklist"):
        if brokers and r["broker"] not in brokers:
            continue
        if "RESUME_DISCARDED" not in (r.get("actions") or []) or not r.get("resume_msg_id"):
            continue
        out.append(Request(RESUME, r["broker"], r["transaction_key"], r.get("uniq_key"), r.get("real_topic") or "",
                           _host(r["resume_msg_id"]),
                           {"topic": r.get("resume_topic") or DISCARD_TOPIC, "msgId": r["resume_msg_id"]},
                           newest_copy_offset=r.get("newest_copy_commitlog_offset"),
                           discard_offset=r.get("discard_commitlog_offset")))
    return out


def end_requests(run: dict, decisions: Dict[str, str], brokers: Optional[set]) -> Tuple[List[Request], List[str]]:
    """END_TRANSACTION requests, and one note per decision that names no PREPARED half-queue transaction."""
    by_key: Dict[str, list] = {}
    for t in _rows(run, "transactions"):
        if not brokers or t["broker"] in brokers:
            by_key.setdefault(t["transaction_key"], []).append(t)
    out, notes = [], []
    for key, decision in decisions.items():
        rows = by_key.get(key, [])
        if not rows:
            notes.append(f"{key}: not a transaction of audit run {run['run_id']}: skipped")
            continue
        for t in rows:
            if t["state"] != "PREPARED" or t["mechanism"] != "HALF_QUEUE" or \
                    t.get("newest_copy_commitlog_offset") is None:
                notes.append(f"{key} ({t['broker']}): {t['state']} ({t['mechanism']}) in the audit, not a PREPARED "
                             f"half: skipped")
                continue
            header = {"producerGroup": t["producer_group"], "tranStateTableOffset": t["newest_copy_queue_offset"],
                      "commitLogOffset": t["newest_copy_commitlog_offset"],
                      "commitOrRollback": COMMIT_OR_ROLLBACK[decision], "fromTransactionCheck": "true",
                      "msgId": t.get("uniq_key") or t["newest_copy_msg_id"],
                      "transactionId": t.get("transaction_id") or t.get("uniq_key"), "topic": t["real_topic"]}
            out.append(Request(END, t["broker"], key, t.get("uniq_key"), t["real_topic"] or "",
                               _host(t["newest_copy_msg_id"]),
                               {k: str(v) for k, v in header.items() if v is not None}, decision=decision,
                               newest_copy_offset=t["newest_copy_commitlog_offset"],
                               discard_offset=t.get("discard_commitlog_offset")))
    return out, notes


def done_keys(out: str, audit_run_id: str) -> set:
    """(broker, transaction_key, request) the recovery_log shows as answered SUCCESS for this audit run."""
    t = read_table(os.path.join(out, "recovery_log"), what="recovery_log", audit_run_id=audit_run_id)
    if t is None:
        return set()
    return {(r["broker"], r["transaction_key"], r["request"]) for r in t.to_pylist() if r["outcome"] == "OK"}


__all__ = ["Request", "RESUME", "END", "pick_run", "read_decisions", "resume_requests", "end_requests",
           "done_keys"]
