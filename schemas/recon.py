"""The reconstruction reducer's two intermediate tables (jobs/reconstruct/reducer.py): every input frame tagged and
unioned into one table (RECON_INPUT, what is shuffled by broker), and every output table unioned into one
(RECON_OUTPUT, what a reduce task returns).  Not written anywhere; defined here so column names and types stay
in ``schemas``.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES, RECOVERY, TRANSACTIONS
from schemas.core import Column as C
from schemas.core import Table
from schemas.store import ANOMALIES, COMMITLOG, CONSUMEQUEUE, CONSUMER_OFFSETS, REDOLOG, STATETABLE

_str, _i64 = pa.string(), pa.int64()

#: input column -> source tables that fill it (the others leave it null)
_INPUT_SOURCES = {
    COMMITLOG: ("file_position", "physical_offset", "total_size", "magic_version", "body_crc_ok", "queue_id",
                "queue_offset", "transaction_type", "born_timestamp", "store_timestamp",
                "prepared_transaction_offset", "topic", "msg_id", "uniq_key", "keys", "pgroup", "real_topic",
                "real_qid", "transaction_check_times", "tran_prepared_queue_offset", "check_immunity_time_s",
                "transaction_id", "body"),
    CONSUMEQUEUE: ("commitlog_offset", "size"),
    STATETABLE: ("index", "state"),
    REDOLOG: ("tags_code", "kind"),
    CONSUMER_OFFSETS: ("group", "offset"),
    ANOMALIES: ("file", "position", "length", "detail", "expected", "actual", "source", "data_end"),
}


def _input_columns():
    cols = [C("src", _str, False, "input: commitlog, op_body, consumequeue, statetable, redolog, "
                                  "consumer_offsets, anomaly or bounds"),
            C("broker", _str, False, "broker / store name")]
    for table, names in _INPUT_SOURCES.items():
        for n in names:
            c = table.column(n)
            cols.append(C(n, c.type, True, c.comment))
    cols.append(C("min_commitlog_offset", _i64, True, "bounds: start of the oldest retained CommitLog file"))
    cols.append(C("n_cq", _i64, True, "bounds: number of consume-queue directories"))
    return cols


#: the op records' columns the reduction reads (its ``op_body`` input; the commitlog rows' when absent)
OP_BODY_COLUMNS = ("physical_offset", "queue_id", "queue_offset", "store_timestamp", "total_size",
                   "body_crc_ok", "body")

RECON_INPUT = Table.of("recon_input", _input_columns(),
                       "Reconstruction inputs, tagged by src, one table (shuffled by broker)")


def _output_columns() -> list:
    seen: dict = {}
    cols = [C("out", _str, False, "output table: transactions, check_back, recovery, anomalies, profiles")]
    for table in (TRANSACTIONS, CHECK_BACK, RECOVERY, AUDIT_ANOMALIES, PROFILES):
        for c in table.columns:
            if c.name in seen:
                if seen[c.name] != c.type:
                    raise TypeError(f"output column {c.name} has two types: {seen[c.name]} and {c.type}")
                continue
            seen[c.name] = c.type
            cols.append(C(c.name, c.type, True, c.comment))
    return cols


RECON_OUTPUT = Table.of("recon_output", _output_columns(), "Every reconstruction output, tagged by out")
#: RECON_OUTPUT.out value -> the table its rows belong to
RECON_OUTPUT_TABLES = {"transactions": TRANSACTIONS, "check_back": CHECK_BACK, "recovery": RECOVERY,
                       "anomalies": AUDIT_ANOMALIES, "profiles": PROFILES}


# ------------------------------------------------------------------------------------------------------------
# the distributed reduce (jobs/reconstruct/distributed.py): evidence rows as a DataFrame, per-broker facts
# ------------------------------------------------------------------------------------------------------------

_i8 = pa.int8()
#: evidence columns (jobs/reconstruct/evidence.py Evidence: ``i`` int64 pairs, ``c`` int8 codes, ``s`` strings)
EVIDENCE_INT_COLUMNS = ("physical_offset", "total_size", "queue_id", "queue_offset", "store_timestamp",
                        "born_timestamp", "real_qid", "check_times", "tran_prepared_qo", "immunity_s", "pto",
                        "half_offset", "target_qid", "target_qo")
EVIDENCE_CODE_COLUMNS = ("role", "mechanism", "end_type", "target_mech", "crc", "has_target", "committed",
                         "copy_committed", "named")
EVIDENCE_STR_COLUMNS = ("tx", "msg_id", "uniq_key", "transaction_id", "keys", "pgroup", "real_topic", "piece",
                        "st_state")

RECON_EVIDENCE = Table.of("recon_evidence", [
    C("broker", _str, False, "broker / store name"),
    C("ord", _i64, False, "the row's place in the driver reducer's evidence order (kind, then input order)"),
    *[C(n, _i64, True, "evidence integer column") for n in EVIDENCE_INT_COLUMNS],
    *[C(n, _i8, True, "evidence code column (0 = none)") for n in EVIDENCE_CODE_COLUMNS],
    *[C(n, _str, True, "evidence string column") for n in EVIDENCE_STR_COLUMNS],
    C("own_tx", _str, True, "END rows: the id they have when PREPARED_TRANSACTION_OFFSET finds no copy"),
    C("tid_tx", _str, True, "rows whose __transactionId__ differs from their UNIQ_KEY: the id it gives"),
    C("problems", _i8, True, "bits of the consume-queue findings naming the row's CommitLog offset"),
], "Evidence rows of the distributed reduce, linked by Spark joins and shuffled by transaction")

RECON_EVIDENCE_PASS = RECON_EVIDENCE.with_columns("recon_evidence_pass", after=[
    C("facts_json", _str, True, "null on evidence rows; on a broker's facts row (ord -1, evidence columns "
                                 "null): the partition's partial facts, as in recon_facts")])

RECON_FACTS = Table.of("recon_facts", [
    C("broker", _str, False, "broker / store name"),
    C("facts_json", _str, False, "partial per-broker facts of one input partition (counts, bounds, offsets)"),
], "Per-partition broker facts of the distributed reduce, merged on the driver")
