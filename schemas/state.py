"""Tables of an incremental audit's carried state (jobs/read/incremental/plan.py): what the next ``audit --incremental``
needs to continue from this run instead of re-reading the whole CommitLog.

``audit_state``                one header row per broker: where the run's CommitLog read may be continued
                               (``resume_offset``), what the store looked like below it (hashes), and the
                               hash of the settings (a change falls back to a full audit)
``audit_state_records``        the transaction-relevant CommitLog records the run read (COMMITLOG_SOURCE rows,
                               the columns the reducer reads: schemas.recon.RECON_INPUT's)
``audit_state_findings``       the CommitLog decoder findings of the run's scan (ANOMALIES_SOURCE rows + the
                               start of the cell whose decoding gave each) and the consume-queue decoder
                               findings of the files in ``unit_files_json`` (no cell)
``audit_state_op_bodies``      the op message bodies fetched for the run's op records (the reducer's
                               ``op_bodies`` input; absent rows when the run copied every body)
``audit_state_final``          the settled transactions (jobs/reconstruct/settle.py): their reduced
                               ``transactions`` row + the keys later evidence could name them by; their
                               records and op bodies are no longer in the two tables above

Every table is partitioned by ``broker`` and ``run_id`` (the sink adds ``run_id`` / ``run_date``); only the
newest run's state is kept (the next incremental run retracts the previous run's rows after it completes),
except the records and the settled transactions, kept in segments (run ids) that the header lists: a run
writes only the settled transactions it settled itself next to the previous runs' segments, until
MAX_SEGMENTS are reached and it writes them all again as one (``final_segments_json``); the records, the open
transactions' only, are written whole by a run that settled (``record_segments_json`` then lists its own
run), as segments otherwise.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.audit import TRANSACTIONS
from schemas.core import Column as C
from schemas.core import Table
from schemas.recon import RECON_INPUT
from schemas.sources import ANOMALIES_SOURCE, BROKER, COMMITLOG_SOURCE
from schemas.store import COMMITLOG

#: bumped whenever what is carried or how it is checked changes: an older state falls back to a full audit.
#: 2: records narrowed to the reducer's columns, findings with their cell, op bodies as bytes
#: 3: findings of unchanged consume-queue files of non-transaction topics carried (``unit_files_json``)
#: 4: records kept in segments, one per run that read them (``record_segments_json``), not rewritten whole
#: 5: settled transactions carried as their reduced rows (``audit_state_final``), not as their records
STATE_FORMAT_VERSION = 5
#: record segments a state may list; a run that would list more writes every carried record again (one)
MAX_SEGMENTS = 8

_str, _i32, _i64 = pa.string(), pa.int32(), pa.int64()

AUDIT_STATE = Table.of("audit_state", [
    BROKER,
    C("format_version", _i32, False, "STATE_FORMAT_VERSION of the writer; another version is not continued"),
    C("config_hash", _str, False, "sha256 of the settings that change the audit's result (mode, split bytes, "
                                  "bodies, profile, broker overrides, AuditParams without as_of)"),
    C("store_root", _str, False, "store root directory the run read (decoder findings name its files)"),
    C("resume_offset", _i64, False,
      "CommitLog offset the next run reads from: the newest transaction-relevant record read, or the "
      "start of its split_bytes cell when the scan reported damage between the two (rows and findings "
      "below it are carried, the rest re-read)"),
    C("resume_file", _str, True, "CommitLog file holding resume_offset (relative to the store root)"),
    C("resume_file_base", _i64, True, "base offset of resume_file"),
    C("resume_prefix_sha256", _str, False,
      "sha256 of the (up to) 64 KiB of resume_file before resume_offset: the bytes a continuation trusts"),
    C("below_files_json", _str, False,
      "JSON {relative path: [base offset, size, edge sha256]} of the CommitLog files wholly below "
      "resume_offset (txlog_io.fingerprint edges): a rewritten file falls back to a full audit"),
    C("commitlog_end", _i64, False, "end offset of the newest CommitLog file the run saw"),
    C("unit_files_json", _str, True,
      "JSON {path: [size, mtime_ns, edge sha256]} of the consume-queue files of non-transaction topics whose "
      "decoder findings audit_state_findings carries (taken before the read): the next run decodes again "
      "only those whose print differs"),
    C("record_segments_json", _str, True,
      "JSON [[run_id, limit offset or null], ...]: the audit_state_records partitions (run ids) whose rows "
      "make up this state, each one's rows valid below its limit (the resume offset of the run that "
      "continued it); the newest is this run's own rows"),
    C("final_segments_json", _str, True,
      "JSON [run_id, ...]: the audit_state_final partitions whose rows make up this state (the newest: "
      "the transactions this run settled)"),
    C("final_facts_json", _str, True,
      "JSON {CommitLog file base offset: broker facts}: what the records of the settled transactions in that "
      "file counted (jobs.reconstruct.reducer._facts); dropped with the file"),
    C("records", _i64, False, "rows carried in audit_state_records (all segments)"),
    C("finals", _i64, True, "settled transactions carried in audit_state_final (all segments)"),
    C("findings", _i64, False, "rows carried in audit_state_findings"),
], "Incremental audit state: one row per broker", partition_by=("broker",))

# only what the reducer reads is carried (the properties map, hosts, ... would be rewritten every run for
# nothing)
STATE_RECORDS = COMMITLOG_SOURCE.with_columns(
    "audit_state_records",
    exclude=[c.name for c in COMMITLOG_SOURCE.columns if c.name not in RECON_INPUT.names])
#: a CommitLog cell below the resume offset can report a finding at a position above it (a record crossing
#: the cell's end, TRUNCATED_FILE after it): carried by the cell that found it, not by its position
CELL_OFFSET = C("cell_offset", _i64, True,
                "CommitLog offset of the split_bytes cell whose decoding gave the finding (null: unknown, "
                "carried by its position)")
STATE_FINDINGS = ANOMALIES_SOURCE.with_columns("audit_state_findings", after=[CELL_OFFSET])
STATE_OP_BODIES = Table.of("audit_state_op_bodies", [
    BROKER,
    *(C(n, COMMITLOG.column(n).type, True, COMMITLOG.column(n).comment)
      for n in ("queue_id", "physical_offset", "queue_offset", "store_timestamp", "total_size",
                "body_crc_ok")),
    C("body", pa.binary(), True, "op message body as stored (the half queue offsets it marks)"),
], "Op message bodies carried for the next incremental run")

_i64s = pa.list_(_i64)
#: a settled transaction (jobs/reconstruct/settle.py): its reduced row + what later evidence links it by
STATE_FINAL = TRANSACTIONS.with_columns("audit_state_final", after=[
    C("file_base", _i64, False, "base offset of the CommitLog file holding all of its records"),
    C("max_offset", _i64, False, "CommitLog offset of its newest record (below the state's resume offset)"),
    C("copy_offsets", _i64s, False, "CommitLog offsets of its half copies (an END's target)"),
    C("half_offsets", _i64s, False, "half-queue offsets of its half copies (an op's target)"),
    C("record_offsets", _i64s, False, "CommitLog offsets of all its records (a consume-queue finding's), "
                                      "an op record it shares with open transactions included"),
    C("cq_records", pa.list_(pa.struct([("topic", _str), ("physical_offset", _i64), ("queue_id", _i32),
                                        ("queue_offset", _i64), ("total_size", _i32)])), False,
      "its dropped half / op / discard records as the consume-queue comparison reads them"),
    C("half_consume_offset", _i64, False, "half queue consume offset it settled under"),
    C("op_consume_offset", _i64, False, "op queue consume offset it settled under"),
])

STATE_TABLES = {t.name: t for t in (AUDIT_STATE, STATE_RECORDS, STATE_FINDINGS, STATE_OP_BODIES, STATE_FINAL)}

__all__ = ["AUDIT_STATE", "STATE_FINAL", "STATE_RECORDS", "STATE_FINDINGS", "STATE_OP_BODIES", "STATE_TABLES",
           "STATE_FORMAT_VERSION", "CELL_OFFSET", "MAX_SEGMENTS"]
