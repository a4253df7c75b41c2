"""Tables of the recovery job (``./spark-submit.sh repair``, jobs/repair/run.py) and the audit's per-file store
fingerprint it checks before repairing.

``store_files`` is written by every audit run (jobs/audit/run.py, next to ``audit_runs``): one row per file under
each store root (txlog_io.fingerprint).  ``repair_log`` gets one row per write the repair made to the copy.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _i64 = pa.string(), pa.int64()

STORE_FILES = Table.of("store_files", [
    C("broker", _str, False, "broker / store name"),
    C("file", _str, False, "path relative to the store root ('/'-separated)"),
    C("size", _i64, False, "size in bytes at the audit"),
    C("mtime_ns", _i64, False, "modification time (ns since the epoch) at the audit"),
    C("edge_sha256", _str, False, "sha256 over the first and last 64 KiB (whole file when <= 128 KiB)"),
], "Per-file fingerprint of every audited store (the repair refuses a store that changed since)",
    partition_by=("broker",))

REPAIR_LOG = Table.of("repair_log", [
    C("run_id", _str, False, "audit run whose recovery_worklist was applied"),
    C("broker", _str, False, "broker / store name"),
    C("action", _str, False, "MARK_DONE (op record, or the BLANK filler before it, appended), OP_CQ_UNIT "
                             "(its op consume-queue unit), REBUILD_CQ (consume-queue units rewritten from "
                             "the "
                             "CommitLog), REBUILD_STATETABLE (3.x statetable file, abort marker removed), "
                             "CHECKPOINT, ZERO_TORN_TAIL"),
    C("transaction_key", _str, True, "transaction the write is for (null for store-level writes)"),
    C("file", _str, False, "file written, relative to the new store root"),
    C("position", _i64, False, "byte position of the write in that file"),
    C("bytes", _i64, False, "bytes written"),
    C("detail", _str, True, "what was written, in words"),
    C("into", _str, False, "root of the repaired copy"),
], "Every write the repair made to the repaired copy of a store")

REPAIR_TABLES = {t.name: t for t in (STORE_FILES, REPAIR_LOG)}

__all__ = ["STORE_FILES", "REPAIR_LOG", "REPAIR_TABLES"]
