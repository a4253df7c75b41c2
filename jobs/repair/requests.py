"""Requests an operator sends to the live broker, from an audit run's work lists (no Spark; small tables).

``OUT/recovery/<run_id>/``:

* ``resume_requests.jsonl`` -- one RESUME_CHECK_HALF_MESSAGE (RequestCode 323) per RESUME_DISCARDED
  transaction of the run's ``recovery_worklist``: the ``ResumeCheckHalfMessageRequestHeader`` fields
  (``msgId``; 5.x adds ``topic``) plus broker, transaction_key and reason;
* ``check_back/<producer group>.jsonl`` -- the ``check_back_worklist`` rows of that group, most urgent first,
  as ``CheckTransactionStateRequestHeader`` fields (topic, tranStateTableOffset, commitLogOffset, msgId,
  transactionId, offsetMsgId, brokerName) plus urgency;
* ``README.md`` -- how to use each.
"""
from __future__ import annotations

import json
import re

from jobs.delta import outfs

RESUME_CHECK_HALF_MESSAGE = 323        # RequestCode.RESUME_CHECK_HALF_MESSAGE
CHECK_TRANSACTION_STATE = 39           # RequestCode.CHECK_TRANSACTION_STATE

README = """# Recovery requests of audit run {run_id}

Written by `./spark-submit.sh repair` from the audit's `recovery_worklist` and `check_back_worklist` tables.
Nothing here has been sent: each file is a list of requests for an operator to send to the live broker.

## resume_requests.jsonl ({n_resume} request(s))

One line per transaction the broker discarded to `TRANS_CHECK_MAX_TIME_TOPIC` without a resolution
(action RESUME_DISCARDED).  Each is a RESUME_CHECK_HALF_MESSAGE request (request code 323): the broker re-puts
the half message with TRANSACTION_CHECK_TIMES=0 and checks the producer again.

* Java: `DefaultMQAdminExt admin = ...; admin.start();` then per line
  `admin.resumeCheckHalfMessage(line.topic, line.msgId)` (5.x; 4.x:
  `admin.resumeCheckHalfMessage(line.msgId)`), sent to the broker named in `broker`.
* CLI: `mqadmin resumeCheckHalfMessage -n <namesrv> -t <topic> -i <msgId>` (4.x: without `-t`).

`msgId` is the offsetMsgId of the discard record, `topic` is `TRANS_CHECK_MAX_TIME_TOPIC`; `reason` says why.

## check_back/<producer group>.jsonl ({n_check} row(s) in {n_groups} group(s))

Transactions the producer of that group must answer now, most urgent first (`urgency_rank` 1 first;
`priority` CRITICAL = deadline within one check interval).  Each line holds the fields of a
CHECK_TRANSACTION_STATE request header (request code 39) for that transaction: `topic`, `commitLogOffset`,
`tranStateTableOffset`, `msgId`, `offsetMsgId`, `transactionId`, `brokerName`.  Use them to ask the
producer's owner for the outcome (its `TransactionListener.checkLocalTransaction` with these values), or
let the broker's check service send them; a transaction past `deadline_ms` is discarded by the broker.

The repaired store copy (if any) and every write made to it are in the `repair_log` Delta table.
"""


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name or "_unknown_group") or "_"


def _read(run: dict, logical: str):
    from jobs.delta.tables import read_table as read

    path = dict(run["table_paths"]).get(logical, outfs.join(run["out"], logical))
    t = read(path, run_id=run["run_id"])
    return t.to_pylist() if t is not None else []


def resume_requests(recovery_rows) -> list:
    out = []
    for r in recovery_rows:
        if "RESUME_DISCARDED" not in (r.get("actions") or []) or not r.get("resume_msg_id"):
            continue
        out.append({"code": RESUME_CHECK_HALF_MESSAGE, "topic": r.get("resume_topic"),
                    "msgId": r["resume_msg_id"], "broker": r["broker"],
                    "transaction_key": r["transaction_key"],
                    "uniq_key": r.get("uniq_key"), "producer_group": r.get("producer_group"),
                    "reason": r.get("reason")})
    return sorted(out, key=lambda x: (x["broker"], x["transaction_key"]))


def check_back_requests(check_rows) -> dict:
    groups: dict = {}
    for r in sorted(check_rows, key=lambda r: (r["urgency_rank"], r["broker"], r["transaction_key"])):
        groups.setdefault(r["producer_group"], []).append({
            "code": CHECK_TRANSACTION_STATE, "producerGroup": r["producer_group"],
            "topic": r["request_topic"],
            "commitLogOffset": r["commitlog_offset"], "tranStateTableOffset": r["tran_state_table_offset"],
            "msgId": r["msg_id"], "offsetMsgId": r["offset_msg_id"], "transactionId": r.get("transaction_id"),
            "brokerName": r["broker"], "transaction_key": r["transaction_key"],
            "urgency_rank": r["urgency_rank"], "priority": r["priority"], "deadline_ms": r.get("deadline_ms"),
            "real_topic": r.get("real_topic"), "check_times": r.get("check_times")})
    return groups


def _write_jsonl(path: str, rows) -> None:
    outfs.write_bytes(path, "".join(json.dumps(row, sort_keys=True) + "\n" for row in rows).encode("utf-8"))


def write_requests(out: str, run: dict) -> str:
    """Write ``out/recovery/<run_id>/`` for ``run`` (an audit_runs row); returns the folder."""
    folder = outfs.join(out, "recovery", run["run_id"])
    outfs.makedirs(outfs.join(folder, "check_back"))
    resume = resume_requests(_read(run, "recovery_worklist"))
    groups = check_back_requests(_read(run, "check_back_worklist"))
    _write_jsonl(outfs.join(folder, "resume_requests.jsonl"), resume)
    for name in outfs.listdir(outfs.join(folder, "check_back")):     # a re-run replaces the previous lists
        outfs.remove(outfs.join(folder, "check_back", name))
    for group, rows in groups.items():
        _write_jsonl(outfs.join(folder, "check_back", _safe(group) + ".jsonl"), rows)
    outfs.write_bytes(outfs.join(folder, "README.md"), README.format(
        run_id=run["run_id"], n_resume=len(resume), n_check=sum(len(v) for v in groups.values()),
        n_groups=len(groups)).encode("utf-8"))
    return folder


__all__ = ["write_requests", "resume_requests", "check_back_requests", "RESUME_CHECK_HALF_MESSAGE"]
