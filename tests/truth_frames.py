"""Test helper: the reconstruction's input DataFrames built from the fixtures' truth/ files.

The truth files were produced by RocketMQ's own decoders, so these frames are what the project's Spark data
sources must produce (``broker`` + exactly the schemas.store columns).  Used by tests/test_reconstruct.py
until (and besides) jobs/read/frames.py decodes the real stores.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path
from typing import Iterable, Mapping, Optional

import pyarrow as pa

from schemas.store import ANOMALIES, COMMITLOG, CONSUMEQUEUE, CONSUMER_OFFSETS, REDOLOG, STATETABLE

TRAN_TYPE = {0: "NOT", 4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}
ST_STATE = {4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
_UNQUOTED_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)\s*:')


def _int(v) -> Optional[int]:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def _property_columns(p: Mapping[str, str]) -> dict:
    """The COMMITLOG columns RocketMQ's decoder derives from a record's properties."""
    return {
        "uniq_key": p.get("UNIQ_KEY"),
        "tags": p.get("TAGS"),
        "keys": p.get("KEYS"),
        "pgroup": p.get("PGROUP"),
        "real_topic": p.get("REAL_TOPIC"),
        "real_qid": _int(p.get("REAL_QID")),
        "tran_msg": (p["TRAN_MSG"] == "true") if "TRAN_MSG" in p else None,
        "transaction_check_times": _int(p.get("TRANSACTION_CHECK_TIMES")),
        "tran_prepared_queue_offset": _int(p.get("TRAN_PREPARED_QUEUE_OFFSET")),
        "check_immunity_time_s": _int(p.get("CHECK_IMMUNITY_TIME_IN_SECONDS")),
        "transaction_id": p.get("__transactionId__"),
    }


def _host(ip: str, port) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def _compression(sys_flag: int) -> str:
    if not sys_flag & 0x1:
        return "NONE"
    return {1: "LZ4", 2: "ZSTD"}.get((sys_flag & 0x700) >> 8, "ZLIB")


def _schema(table, exclude=()) -> pa.Schema:
    s = table.arrow_schema(exclude)
    return pa.schema([pa.field("broker", pa.string(), False), *s])


def truth_record_fields(t: Mapping) -> dict:
    """The decoded CommitLog columns one ``commitlog.jsonl`` truth line fixes (RocketMQ's own decode)."""
    return {
        "file_position": t["filePos"], "physical_offset": t["physicalOffset"], "total_size": t["storeSize"],
        "magic_version": 1 if t["magicCode"] == "0xDAA320A7" else 2, "body_crc": t["bodyCRC"],
        "body_crc_ok": t["bodyCrcMatches"], "queue_id": t["queueId"], "flag": t["flag"],
        "queue_offset": t["queueOffset"], "stored_physical_offset": t["physicalOffsetField"],
        "sys_flag": t["sysFlag"], "born_timestamp": t["bornTimestamp"], "born_host": t["bornHost"][1:],
        "store_timestamp": t["storeTimestamp"], "store_host": t["storeHost"][1:],
        "reconsume_times": t["reconsumeTimes"], "prepared_transaction_offset": t["preparedTransactionOffset"],
        "body_size": t["bodyLength"], "topic": t["topic"], "msg_id": t["msgId"], "uniq_key": t.get("uniqKey"),
        "body": base64.b64decode(t.get("body_b64", "")),
        "transaction_type": {0: "NOT", 4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}[t["tranType"]],
    }


def commitlog_rows(fixture: Path, broker: str, bodies: str = "ops") -> list:
    """truth/commitlog.jsonl.gz -> rows of broker + schemas.COMMITLOG.  bodies: 'ops' (op records only),
    'all', 'none'."""
    import base64

    rows = []
    with gzip.open(fixture / "truth" / "commitlog.jsonl.gz", "rt") as fh:
        for line in fh:
            r = json.loads(line)
            p = r.get("properties") or {}
            want_body = bodies == "all" or (bodies == "ops" and r["topic"] == OP_TOPIC)
            rows.append(
                {
                    "broker": broker,
                    "file": f"commitlog/{r['file']}",
                    "file_position": r["filePos"],
                    "physical_offset": r["physicalOffset"],
                    "total_size": r["storeSize"],
                    "magic_version": 2 if r["magicCode"].upper() == "0XDAA320AB" else 1,
                    "body_crc": r["bodyCRC"],
                    "body_crc_ok": bool(r.get("bodyCrcMatches", True)),
                    "queue_id": r["queueId"],
                    "flag": r["flag"],
                    "queue_offset": r["queueOffset"],
                    "stored_physical_offset": r["physicalOffsetField"],
                    "sys_flag": r["sysFlag"],
                    "transaction_type": TRAN_TYPE[r["tranType"]],
                    "born_timestamp": r["bornTimestamp"],
                    "born_host": _host(r["bornHostIp"], r["bornHostPort"]),
                    "store_timestamp": r["storeTimestamp"],
                    "store_host": _host(r["storeHostIp"], r["storeHostPort"]),
                    "reconsume_times": r["reconsumeTimes"],
                    "prepared_transaction_offset": r["preparedTransactionOffset"],
                    "body_size": r["bodyLength"],
                    "topic": r["topic"],
                    "properties": list(p.items()),
                    "msg_id": r["msgId"],
                    **_property_columns(p),
                    "tags_code": r["tagsCode_dispatch"],
                    "compression": _compression(r["sysFlag"]),
                    "body": base64.b64decode(r["body_b64"]) if want_body else None,
                }
            )
    return rows


def consumequeue_rows(fixture: Path, broker: str) -> list:
    rows = []
    for line in (fixture / "truth" / "consumequeue.jsonl").read_text().splitlines():
        u = json.loads(line)
        rows.append(
            {
                "broker": broker,
                "file": f"consumequeue/{u['topic']}/{u['queueId']}/{u['file']}",
                "file_position": u["index"] * 20 - int(u["file"]),
                "topic": u["topic"],
                "queue_id": u["queueId"],
                "queue_offset": u["index"],
                "commitlog_offset": u["commitLogOffset"],
                "size": u["size"],
                "tags_code": u["tagsCode"],
            }
        )
    return rows


def statetable_rows(fixture: Path, broker: str) -> list:
    path = fixture / "truth" / "statetable.jsonl"
    if not path.exists():
        return []
    return [
        {
            "broker": broker,
            "file": f"transaction/statetable/{u['file']}",
            "index": u["index"],
            "commitlog_offset": u["commitLogOffset"],
            "size": u["size"],
            "store_timestamp_s": u["timestampSec"],
            "producer_group_hash": u["producerGroupHash"],
            "state": ST_STATE.get(u["state"], f"UNKNOWN({u['state']})"),
        }
        for u in map(json.loads, path.read_text().splitlines())
    ]


def redolog_rows(fixture: Path, broker: str) -> list:
    path = fixture / "truth" / "redolog.jsonl"
    if not path.exists():
        return []
    return [
        {
            "broker": broker,
            "file": f"transaction/redolog/TRANSACTION_REDOLOG_TOPIC_XXXX/0/{u['file']}",
            "index": u["index"],
            "commitlog_offset": u["commitLogOffset"],
            "size": u["size"],
            "tags_code": u["tagsCode"],
            "kind": "PREPARED" if u["tagsCode"] == -1 else "END",
        }
        for u in map(json.loads, path.read_text().splitlines())
    ]


def parse_consumer_offsets(text: str) -> dict:
    """fastjson consumerOffset.json (unquoted integer keys) -> dict."""
    return json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2":', text))


def consumer_offset_rows(fixture: Path, broker: str) -> list:
    path = fixture / "store" / "config" / "consumerOffset.json"
    table = parse_consumer_offsets(path.read_text()).get("offsetTable", {})
    rows = []
    for key, queues in table.items():
        topic, _, group = key.partition("@")
        for qid, off in queues.items():
            rows.append(
                {
                    "broker": broker,
                    "file": "config/consumerOffset.json",
                    "topic": topic,
                    "group": group,
                    "queue_id": int(qid),
                    "offset": int(off),
                }
            )
    return rows


TABLES = {
    "commitlog": COMMITLOG,
    "consumequeue": CONSUMEQUEUE,
    "statetable": STATETABLE,
    "redolog": REDOLOG,
    "consumer_offsets": CONSUMER_OFFSETS,
    "anomalies": ANOMALIES,
}


def frame(spark, name: str, rows: list):
    """rows (dicts with broker + the table's columns) -> DataFrame with exactly broker + the table's
    schema."""
    from pyspark.sql import types as T

    table = TABLES[name]
    arrow = pa.Table.from_pylist(rows, schema=_schema(table))
    schema = T.StructType([T.StructField("broker", T.StringType(), False), *table.spark_schema().fields])
    if arrow.num_rows == 0:
        return spark.createDataFrame([], schema)
    return spark.createDataFrame(arrow, schema)


def truth_rows(fixtures: Mapping[str, Path], bodies: str = "ops") -> dict:
    """{broker: fixture dir} -> {table name: rows} for every broker (truth stores have no anomalies)."""
    rows = {k: [] for k in TABLES}
    for broker, fixture in fixtures.items():
        fixture = Path(fixture)
        rows["commitlog"] += commitlog_rows(fixture, broker, bodies)
        rows["consumequeue"] += consumequeue_rows(fixture, broker)
        rows["statetable"] += statetable_rows(fixture, broker)
        rows["redolog"] += redolog_rows(fixture, broker)
        rows["consumer_offsets"] += consumer_offset_rows(fixture, broker)
    return rows


def frames_from_rows(spark, rows: Mapping[str, list]) -> dict:
    """{table name: rows} -> {table name: DataFrame} for every table of TABLES (missing names -> empty
    frames)."""
    return {name: frame(spark, name, list(rows.get(name, []))) for name in TABLES}


def truth_frames(spark, fixtures: Mapping[str, Path], bodies: str = "ops") -> dict:
    """{broker: fixture dir} -> {'commitlog', 'consumequeue', 'statetable', 'redolog', 'consumer_offsets',
    'anomalies'} DataFrames holding every broker (truth stores have no anomalies, so that frame is empty)."""
    return frames_from_rows(spark, truth_rows(fixtures, bodies))


def intended_outcomes(fixture: Path) -> dict:
    """KEYS (DTX-n) -> intended class from truth/workload_client_side.json."""
    return json.loads((Path(fixture) / "truth" / "workload_client_side.json").read_text())[
        "intended_tx_outcome_by_key"
    ]


def max_store_timestamp(fixture: Path) -> int:
    with gzip.open(Path(fixture) / "truth" / "commitlog.jsonl.gz", "rt") as fh:
        return max(json.loads(line)["storeTimestamp"] for line in fh)


def rows_of(df) -> Iterable[dict]:
    return [r.asDict(recursive=True) for r in df.collect()]


# ------------------------------------------------------------------------------------------------------------
# Hand-built rows for unit tests
# ------------------------------------------------------------------------------------------------------------

_TT = {"NOT": 0, "PREPARED": 4, "COMMIT": 8, "ROLLBACK": 12}


def commitlog_row(
    broker: str,
    physical_offset: int,
    topic: str,
    *,
    file_start: int = 0,
    size: int = 100,
    props: Optional[dict] = None,
    transaction_type: str = "NOT",
    **cols,
) -> dict:
    """One broker + schemas.COMMITLOG row with plausible defaults; ``props`` fills the properties map and the
    columns extracted from it (UNIQ_KEY, PGROUP, REAL_TOPIC, ... as the decoder does); ``cols`` override any
    column."""
    p = {k: str(v) for k, v in (props or {}).items()}
    row = {
        "broker": broker,
        "file": f"commitlog/{file_start:020d}",
        "file_position": physical_offset - file_start,
        "physical_offset": physical_offset,
        "total_size": size,
        "magic_version": 1,
        "body_crc": 0,
        "body_crc_ok": True,
        "queue_id": 0,
        "flag": 0,
        "queue_offset": 0,
        "stored_physical_offset": physical_offset,
        "sys_flag": _TT[transaction_type],
        "transaction_type": transaction_type,
        "born_timestamp": 0,
        "born_host": "127.0.0.1:1",
        "store_timestamp": 0,
        "store_host": "127.0.0.1:10911",
        "reconsume_times": 0,
        "prepared_transaction_offset": 0,
        "body_size": 0,
        "topic": topic,
        "properties": list(p.items()),
        "msg_id": f"7F00000100002A9F{physical_offset:016X}",
        **_property_columns(p),
        "tags_code": 0,
        "compression": "NONE",
        "body": None,
    }
    row.update(cols)
    return row
