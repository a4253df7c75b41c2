"""Tables the audit job (jobs/audit/run.py) writes besides the reconstruction's: one row per run, message bodies.

``audit_runs`` is written LAST by every run: a run id with a row here finished all its tables; a run id whose
rows appear in other tables but not here was interrupted (re-running it replaces its rows everywhere).

``message_bodies`` exists only when a run asked for bodies (``--include-bodies`` / ``include.bodies=true``);
the reconstruction's tables never carry bodies.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _i32, _i64, _f64 = pa.string(), pa.int32(), pa.int64(), pa.float64()
_bool, _bin = pa.bool_(), pa.binary()
_ts = pa.timestamp("us", tz="UTC")
_strs = pa.list_(pa.string())


def _map(value: pa.DataType) -> pa.DataType:
    return pa.map_(pa.string(), value)


AUDIT_RUNS = Table.of("audit_runs", [
    C("run_id", _str, False, "audit run id (default: derived from as_of); re-running it replaces this row"),
    C("run_date", pa.date32(), False, "UTC date of as_of"),
    C("as_of", _ts, False, "the audit's 'now' (--as-of)"),
    C("as_of_ms", _i64, False, "as_of in epoch ms (the transactions' as_of_ms)"),
    C("started_at", _ts, False, "wall-clock start of the run"),
    C("finished_at", _ts, False, "wall-clock end of the run, just before this row was written"),
    C("elapsed_s", _f64, False, "finished_at - started_at in seconds"),
    C("status", _str, False, "COMPLETE (only finished runs write a row; see the module docstring)"),
    C("mode", _str, False, "indexed (records found through the consume queues / statetable) or full (every "
                           "CommitLog record scanned)"),
    C("brokers", _strs, False, "broker names, in --store order"),
    C("stores", _strs, False, "store root directories, in --store order"),
    C("profiles", _map(_str), False, "broker -> transaction-format profile used (jobs.reconstruct.spark.PROFILES)"),
    C("detected_profiles", _map(_str), False,
      "broker -> profile the store files showed, before any override"),
    C("include_bodies", _bool, False, "message bodies were copied into message_bodies"),
    C("config_json", _str, False, "the configuration used (JSON): audit settings, broker overrides, the "
                                  "AuditParams per profile, files merged"),
    C("store_fingerprint", _str, False,
      "sha256 over (broker, path relative to the store root, size, mtime ns) of every file under each store "
      "root, from a driver-side listing (no file content read)"),
    C("store_files", _i64, False, "files under the store roots"),
    C("store_bytes", _i64, False, "their total size in bytes"),
    C("commitlog_bytes", _i64, False, "bytes of the CommitLog files"),
    C("transactions", _i64, False, "rows written to the transactions table"),
    C("state_counts", _map(_i64), False, "state -> transactions (all brokers)"),
    C("flag_counts", _map(_i64), False, "flag code -> transactions carrying it (all brokers)"),
    C("table_rows", _map(_i64), False, "logical table -> rows written by this run"),
    C("table_paths", _map(_str), False, "logical table -> Delta table directory"),
    C("phase_seconds", _map(_f64), False, "phase -> wall seconds (plan, read, reconstruct, aggregate, write, "
                                          "write.<table>)"),
    C("writer", _str, False, "Delta writer used: delta-rs or spark"),
    C("spark_version", _str, False, "Spark version of the run"),
    C("out", _str, False, "output directory (--out)"),
], "One row per finished audit run: what was read, with which settings, what came out and how long it took")

MESSAGE_BODIES = Table.of("message_bodies", [
    C("broker", _str, False, "broker / store name"),
    C("transaction_key", _str, False, "see transactions"),
    C("record", _str, False, "record the body was taken from: HALF (first half copy, 4.3+), PREPARED (the "
                             "prepared record, 3.x / 4.0-4.2), COMMIT (first COMMIT record, when no copy "
                             "survives) or DISCARD (the TRANS_CHECK_MAX_TIME_TOPIC record)"),
    C("commitlog_offset", _i64, False, "CommitLog offset of that record"),
    C("topic", _str, True, "topic the producer sent to (REAL_TOPIC of a half/discard record)"),
    C("compression", _str, True, "NONE, ZLIB, LZ4 or ZSTD: the body is stored as in the CommitLog"),
    C("body_size", _i32, False, "stored body length in bytes"),
    C("body_crc_ok", _bool, False, "BODYCRC matches the stored body"),
    C("body", _bin, True, "message body bytes as stored (compressed when compression is not NONE)"),
], "Message body of each transaction (only when the run asked for bodies)")

RUN_TABLES = {t.name: t for t in (AUDIT_RUNS, MESSAGE_BODIES)}

__all__ = ["AUDIT_RUNS", "MESSAGE_BODIES", "RUN_TABLES"]
