"""The ``recovery_log`` table of the ``recover`` command (jobs/recover/): one row per request it decided on
(sent, refused as stale, or failed), appended by every ``recover --send`` invocation (the sink's ``run_id`` is
that invocation's id, ``audit_run_id`` the audit run whose work lists it acted on)."""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _i32, _i64 = pa.string(), pa.int32(), pa.int64()

RECOVERY_LOG = Table.of("recovery_log", [
    C("audit_run_id", _str, False, "audit run whose recovery_worklist / transactions the request came from"),
    C("broker", _str, False, "audited broker / store name"),
    C("transaction_key", _str, False, "see transactions"),
    C("uniq_key", _str, True, "UNIQ_KEY"),
    C("request", _str, False, "RESUME_CHECK_HALF_MESSAGE or END_TRANSACTION"),
    C("request_code", _i32, False, "RequestCode: 323 or 37"),
    C("decision", _str, True, "END_TRANSACTION: COMMIT or ROLLBACK (the operator's decisions file)"),
    C("live_broker", _str, True, "brokerName the request went (or would have gone) to, from the NameServer"),
    C("broker_addr", _str, True, "its master address"),
    C("header", _str, False, "the request's ext fields as JSON (ACL fields left out)"),
    C("outcome", _str, False, "OK (broker answered SUCCESS), FAILED (broker answered another code), "
                              "NO_RESPONSE (sent, no answer in time: the broker may have applied it), "
                              "REFUSED_STALE (not sent: the broker moved past the audit for this transaction), "
                              "REFUSED_UNVERIFIABLE (not sent: the broker's index does not show the copy "
                              "the audit saw)"),
    C("response_code", _i32, True, "the broker's ResponseCode (null when nothing was received)"),
    C("remark", _str, True, "the broker's remark, or why the request was refused"),
    C("sent_at_ms", _i64, True, "when it was sent (epoch ms; null when not sent)"),
    C("latency_ms", _i64, True, "until the answer"),
], "Requests the recover command sent to (or refused to send to) a live broker, with the broker's answers",
    partition_by=())

RECOVER_TABLES = {RECOVERY_LOG.name: RECOVERY_LOG}

__all__ = ["RECOVERY_LOG", "RECOVER_TABLES"]
