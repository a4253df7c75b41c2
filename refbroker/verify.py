"""Check a generated store against its ledger with txlog_io's decoders (read-only).

``verify(out_dir)`` decodes every CommitLog, consume-queue, statetable and redolog file and the config files,
and returns a :class:`VerifyReport` listing

* ``anomalies``: everything the decoders reported, and ``unexplained``: those not at an injected fault's
  place;
* ``problems``: broken invariants or disagreements with the ledger, e.g.
  - a consume-queue unit that does not point at a record of its topic/queue with its size, tagsCode and
    offset;
  - a NOT/COMMIT record without its unit (except the dispatch lag of a final crash / deleted queues);
  - a PREPARED/ROLLBACK record with a unit; non-contiguous queue offsets of a queue;
  - a COMMIT record whose PREPARED_TRANSACTION_OFFSET is not a half copy (4.3+) / prepared record (3.x,
    4.0-4.2) of the same transaction;
  - a consumer offset beyond its queue's max offset;
  - a ledger record marked present that is not on disk as described, or a transaction record on disk that no
    ledger line claims;
  - a transaction whose ledger ``visible_outcome`` differs from the outcome the decoded records give.

Meant for test- and CI-sized stores: it holds the decoded records in memory.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from refbroker import ledger as L
from txlog_io.config import decode_checkpoint, read_consumer_offsets
from txlog_io.consumequeue import decode_consumequeue, decode_redolog, decode_statetable
from txlog_io.dledger import decode_log_range
from txlog_io.mappedfile import REDOLOG_TOPIC, discover_store

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


@dataclass
class VerifyReport:
    records: int = 0
    cq_units: int = 0
    anomalies: list = field(default_factory=list)       # [dict(kind, file (relative), position)]
    unexplained: list = field(default_factory=list)
    explained_faults: set = field(default_factory=set)  # fault ids with at least one anomaly at their place
    problems: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.unexplained and not self.problems

    def summary(self) -> str:
        return (f"{self.records} records, {self.cq_units} CQ units, {len(self.anomalies)} anomalies "
                f"({len(self.unexplained)} unexplained), {len(self.problems)} problems")


def _rel(root: Path, file: str) -> str:
    try:
        return str(Path(file).relative_to(root))
    except ValueError:
        return str(file)


def _op_offsets(body: bytes) -> list:
    text = body.decode("ascii", "replace")
    pieces = [p for p in text.split(",") if p] if "," in text else [text]
    out = []
    for piece in pieces:
        try:
            out.append(int(piece))
        except ValueError:
            out.append(-1)
    return out


def verify(out_dir, *, store_dir=None, ledger_path=None) -> VerifyReport:
    out = Path(out_dir)
    root = Path(store_dir) if store_dir else out / "store"
    ledger_file = Path(ledger_path) if ledger_path else out / "ledger.jsonl"
    report = VerifyReport()
    entries = list(L.iter_ledger(ledger_file))
    transactions = [e for e in entries if e["kind"] == "transaction"]
    faults = [e for e in entries if e["kind"] == "fault"]

    # ---- mapped-file queues (names, sizes, gaps) and the checkpoint ----------------------------------------
    layout = discover_store(root)
    for a in layout.anomalies:
        report.anomalies.append({"kind": a.kind, "file": _rel(root, a.file), "position": a.position,
                                 "detail": a.detail})
    if (root / "checkpoint").exists():
        for a in decode_checkpoint(root / "checkpoint")["anomalies"]:
            report.anomalies.append({"kind": a.kind, "file": _rel(root, a.file), "position": a.position,
                                     "detail": a.detail})

    # ---- CommitLog -----------------------------------------------------------------------------------------
    records: dict = {}
    body_damaged = [r for f in faults for r in (f.get("effects") or {}).get("body_damaged", [])]
    for path in [mf.path for mf in layout.commitlog]:          # commitlog/ or dledger-<id>/data/
        for batch, anomalies in decode_log_range(str(path), with_body=True):
            for a in anomalies:
                report.anomalies.append({"kind": a.kind, "file": _rel(root, a.file), "position": a.position,
                                         "detail": a.detail})
            for row in batch.to_pylist():
                if not row["body_crc_ok"] and not any(start <= row["physical_offset"] < end
                                                      for start, end in body_damaged):
                    # a torn write: reported as an anomaly; RocketMQ's recovery drops it too.  A whole record
                    # whose body was damaged later keeps its (readable) header and stays in the ledger.
                    continue
                row["props"] = dict(row["properties"])
                records[row["physical_offset"]] = row
    report.records = len(records)
    min_offset = min(records) if records else 0
    by_type = defaultdict(list)
    for row in records.values():
        by_type[row["transaction_type"]].append(row)

    # ---- consume queues ------------------------------------------------------------------------------------
    lag_start = None
    for fault in faults:
        if fault["fault"] == "CQ_DISPATCH_LAG" and not fault.get("redispatched"):
            lag_start = fault["position"]
    deleted_queues = {f["file"] for f in faults if f["fault"] in ("DELETE_OP_CQ",)}
    retention_min = None
    for fault in faults:
        if fault["fault"] == "RETENTION_DELETE_COMMITLOG":
            retention_min = int(Path(fault["file"]).name) + fault["length"]
    damaged_queues = {str(Path(f["file"]).parent) for f in faults if f["fault"] == "BITFLIP_CQ_UNIT"}
    rebuilt_queues = {(f["topic"], f["queue_id"]): f["recovery_start"] for f in faults
                      if f["fault"] == "CQ_DELETED_AND_REBUILT"}
    cq_seen = set()
    queue_max: dict = {}
    cq_root = root / "consumequeue"
    for qdir in sorted(cq_root.glob("*/*")) if cq_root.is_dir() else []:
        topic, queue_id = qdir.parent.name, int(qdir.name)
        indexes = []
        for path in sorted(qdir.iterdir()):
            for batch, anomalies in decode_consumequeue(str(path), topic=topic, queue_id=queue_id):
                for a in anomalies:
                    report.anomalies.append(
                        {
                            "kind": a.kind,
                            "file": _rel(root, a.file),
                            "position": a.position,
                            "detail": a.detail,
                        }
                    )
                for unit in batch.to_pylist():
                    report.cq_units += 1
                    indexes.append(unit["queue_offset"])
                    rec = records.get(unit["commitlog_offset"])
                    if rec is None:
                        if (
                            unit["commitlog_offset"] >= min_offset
                            and (retention_min is None or unit["commitlog_offset"] >= retention_min)
                            and not _damaged(unit["commitlog_offset"], faults)
                        ):
                            report.problems.append(f"CQ {topic}/{queue_id}#{unit['queue_offset']} points at "
                                                   f"{unit['commitlog_offset']}: no record there")
                        continue
                    cq_seen.add(rec["physical_offset"])
                    expected_tags = rec["tags_code"]
                    if topic == SCHEDULE_TOPIC:
                        expected_tags = unit["tags_code"]        # delivery time, checked separately
                    if (
                        rec["topic"],
                        rec["queue_id"],
                        rec["queue_offset"],
                        rec["total_size"],
                        expected_tags,
                    ) != (topic, queue_id, unit["queue_offset"], unit["size"], unit["tags_code"]):
                        report.problems.append(
                            f"CQ {topic}/{queue_id}#{unit['queue_offset']} disagrees with the "
                            f"record at {rec['physical_offset']}"
                        )
        damaged = f"consumequeue/{topic}/{queue_id}" in damaged_queues
        if indexes and not damaged:
            queue_max[(topic, queue_id)] = max(indexes) + 1
            if sorted(indexes) != list(range(min(indexes), max(indexes) + 1)):
                report.problems.append(f"CQ {topic}/{queue_id}: queue offsets not contiguous")
    for row in records.values():
        tx_type = row["transaction_type"]
        has_unit = row["physical_offset"] in cq_seen
        if tx_type in ("PREPARED", "ROLLBACK"):
            if has_unit:
                report.problems.append(f"{tx_type} record at {row['physical_offset']} has a CQ unit")
        elif not has_unit:
            if lag_start is not None and row["physical_offset"] >= lag_start:
                continue
            rebuilt = rebuilt_queues.get((row["topic"], row["queue_id"]))
            if rebuilt is not None and row["physical_offset"] < rebuilt:
                continue    # written before the file recovery rebuilt the deleted queue from
            if _damaged(row["physical_offset"], faults):
                continue
            if f"consumequeue/{row['topic']}" in deleted_queues:
                continue
            report.problems.append(f"{tx_type} record at {row['physical_offset']} ({row['topic']}/"
                                   f"{row['queue_id']}#{row['queue_offset']}) has no CQ unit")

    # ---- half queue contiguity, commit -> half, consumer offsets -------------------------------------------
    halves = {r["physical_offset"]: r for r in records.values() if r["topic"] == HALF_TOPIC}
    half_qos = sorted(r["queue_offset"] for r in halves.values())
    if half_qos and half_qos != list(range(half_qos[0], half_qos[-1] + 1)):
        report.problems.append("half queue offsets are not contiguous")
    for row in by_type["COMMIT"]:
        prepared = row["prepared_transaction_offset"]
        if row["topic"] == SCHEDULE_TOPIC or row["topic"].startswith("%RETRY%"):
            continue                        # consumer retries of committed messages keep the COMMIT type
        target = records.get(prepared)
        if target is None:
            if prepared < min_offset or (retention_min is not None and prepared < retention_min):
                continue
            if _damaged(prepared, faults):
                continue
            report.problems.append(f"COMMIT at {row['physical_offset']} points at {prepared}: no record")
            continue
        if target["topic"] == HALF_TOPIC:
            if target["uniq_key"] != row["uniq_key"]:
                report.problems.append(
                    f"COMMIT at {row['physical_offset']}: half at {prepared} has another UNIQ_KEY"
                )
        elif target["transaction_type"] != "PREPARED" or target["props"].get("KEYS") != row["props"].get(
            "KEYS"
        ):
            report.problems.append(
                f"COMMIT at {row['physical_offset']}: {prepared} is not its prepared record"
            )
    offsets_path = root / "config" / "consumerOffset.json"
    if offsets_path.exists():
        rows, anomalies = read_consumer_offsets(offsets_path)
        for a in anomalies:
            report.anomalies.append({"kind": a.kind, "file": _rel(root, a.file), "position": a.position,
                                     "detail": a.detail})
        for r in rows:
            if f"consumequeue/{r['topic']}/{r['queue_id']}" in damaged_queues:
                continue
            limit = queue_max.get((r["topic"], r["queue_id"]), 0)
            if r["offset"] > limit and f"consumequeue/{r['topic']}" not in deleted_queues:
                report.problems.append(
                    f"consumer offset {r['topic']}@{r['group']}/{r['queue_id']} = {r['offset']} "
                    f"beyond queue max {limit}"
                )

    # ---- 3.x statetable / redolog --------------------------------------------------------------------------
    unit_states: dict = {}
    for sub, decoder in (("transaction/statetable", decode_statetable),
                         (f"transaction/redolog/{REDOLOG_TOPIC}/0", decode_redolog)):
        directory = root / sub
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            for batch, anomalies in decoder(str(path)):
                if decoder is decode_statetable:
                    unit_states.update(zip(batch.column("commitlog_offset").to_pylist(),
                                           batch.column("state").to_pylist(), strict=True))
                for a in anomalies:
                    report.anomalies.append(
                        {
                            "kind": a.kind,
                            "file": _rel(root, a.file),
                            "position": a.position,
                            "detail": a.detail,
                        }
                    )

    # ---- ledger agreement ----------------------------------------------------------------------------------
    claimed = set()
    ops_by_half = defaultdict(set)
    for row in records.values():
        if row["topic"] == OP_TOPIC:
            for h in _op_offsets(row["body"] or b""):
                ops_by_half[h].add(row["physical_offset"])
    decoded_outcomes = _decoded_outcomes(records, ops_by_half, unit_states)
    for entry in transactions:
        key = entry["transaction_key"]
        groups = (("half_copies", None), ("commit_records", "COMMIT"), ("rollback_records", "ROLLBACK"),
                  ("discard_records", None))
        for group, tx_type in groups:
            for rec in entry[group]:
                offset = rec.get("commitlog_offset")
                if offset is None:
                    continue
                claimed.add(offset)
                row = records.get(offset)
                if not rec["present"]:
                    continue
                if row is None or row["total_size"] != rec["size"]:
                    report.problems.append(
                        f"{key}: {group} record at {offset} not on disk as the ledger says"
                    )
                    continue
                if tx_type is not None and row["transaction_type"] != tx_type:
                    report.problems.append(
                        f"{key}: {group} record at {offset} has type {row['transaction_type']}"
                    )
                if entry["uniq_key"] is not None and row["uniq_key"] != entry["uniq_key"]:
                    report.problems.append(f"{key}: record at {offset} has UNIQ_KEY {row['uniq_key']}")
                if "queue_offset" in rec and rec["queue_offset"] is not None and \
                        row["queue_offset"] != rec["queue_offset"]:
                    report.problems.append(
                        f"{key}: record at {offset} has queue offset {row['queue_offset']}, "
                        f"ledger {rec['queue_offset']}"
                    )
        for op in entry["op_records"]:
            claimed.add(op["op_commitlog_offset"])
            if op["present"] and op["op_commitlog_offset"] not in ops_by_half.get(
                op["half_queue_offset"], ()
            ):
                report.problems.append(f"{key}: op at {op['op_commitlog_offset']} does not list half offset "
                                       f"{op['half_queue_offset']}")
        decoded = decoded_outcomes.get(key, L.PREPARED)
        if decoded != entry["visible_outcome"]:
            report.problems.append(
                f"{key}: ledger visible_outcome {entry['visible_outcome']}, records say {decoded}"
            )
    for row in records.values():
        is_tx_record = (row["topic"] in (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)
                        or (row["transaction_type"] != "NOT" and row["topic"] != SCHEDULE_TOPIC
                            and not row["topic"].startswith("%RETRY%")))
        if is_tx_record and row["physical_offset"] not in claimed:
            report.problems.append(f"{row['topic']} record at {row['physical_offset']} is in no ledger line")

    # ---- anomalies vs faults -------------------------------------------------------------------------------
    for anomaly in report.anomalies:
        fault_ids = _explaining_faults(anomaly, faults)
        if not fault_ids:
            report.unexplained.append(anomaly)
        report.explained_faults.update(fault_ids)
    for fault in faults:
        region = _fault_region(fault)
        if region is not None and fault.get("expected_anomalies") and fault["fault_id"] not in \
                report.explained_faults and fault["fault"] != "DELETE_OP_CQ":
            report.problems.append(f"fault {fault['fault_id']} {fault['fault']} at {fault['file']}@"
                                   f"{fault.get('position')} produced no decoder finding")
    return report


def _damaged(offset: int, faults: list) -> bool:
    for fault in faults:
        effects = fault.get("effects") or {}
        for start, end in effects.get("corrupted", []) + effects.get("body_damaged", []):
            if start <= offset < end:
                return True
        for a in fault.get("affected") or []:
            if a.get("commitlog_offset") == offset:
                return True
    return False


def _fault_region(fault: dict) -> Optional[tuple]:
    """(file or directory, first position, end position) where a fault may show up in decoder findings."""
    name, file = fault["fault"], fault.get("file")
    if file is None:
        return None
    start = fault.get("record_position", fault.get("position")) or 0
    if name in ("BITFLIP_COMMIT_BODY", "BITFLIP_RECORD_HEADER"):
        low, high = (fault["effects"].get("corrupted") or fault["effects"]["body_damaged"])[0]
        return file, start, start + (high - low)
    if name == "BITFLIP_CQ_UNIT":
        return file, start, start + 20
    if name == "BITFLIP_STATETABLE":
        return file, start, start + 24
    if name == "TORN_TAIL":
        return None if fault.get("overwritten") else (file, start, 1 << 62)
    if name == "TRUNCATE_COMMITLOG":
        return file, 0, 1 << 62          # FILE_SIZE_MISMATCH is reported at 0, the cut record at its start
    if name in ("BITFLIP_CHECKPOINT", "TRUNCATE_CONFIG", "DELETE_OP_CQ"):
        return file, 0, 1 << 62
    return None


def _explaining_faults(anomaly: dict, faults: list) -> list:
    """Ids of every fault whose region holds the anomaly (two torn writes at one place share one finding)."""
    found = []
    for fault in faults:
        region = _fault_region(fault)
        if region is None:
            continue
        file, low, high = region
        in_file = anomaly["file"] == file or anomaly["file"].startswith(file + "/")
        if in_file and low <= anomaly["position"] < high:
            found.append(fault["fault_id"])
    return found


def _decoded_outcomes(records: dict, ops_by_half: dict, unit_states: Optional[dict] = None) -> dict:
    """transaction key -> outcome from the decoded records (grouped by UNIQ_KEY, or for 3.x / 4.0-4.2 by the
    prepared record's offset) and, after them, the 3.x statetable units' COMMIT / ROLLBACK states
    (``unit_states``: prepared offset -> decoded state), with the ledger's precedence."""
    groups: dict = defaultdict(
        lambda: {"commit": False, "rollback": False, "discard": False, "half_qos": set(), "unit": None}
    )
    for offset, state in (unit_states or {}).items():
        if state in ("COMMIT", "ROLLBACK"):
            groups[str(offset)]["unit"] = state
    for row in records.values():
        t = row["transaction_type"]
        if row["topic"] == HALF_TOPIC:
            groups[row["uniq_key"]]["half_qos"].add(row["queue_offset"])
        elif row["topic"] == DISCARD_TOPIC:
            groups[row["uniq_key"]]["discard"] = True
        elif t == "PREPARED":
            groups[str(row["physical_offset"])]
        elif (
            t in ("COMMIT", "ROLLBACK")
            and row["topic"] != SCHEDULE_TOPIC
            and not row["topic"].startswith("%RETRY%")
        ):
            # (PREPARED_TRANSACTION_OFFSET may legitimately be 0: the prepared record at physical offset 0)
            if "REAL_TOPIC" in row["props"]:           # 4.3+: the commit carries the half's properties
                key = row["uniq_key"]
            else:                                      # 3.x / 4.0-4.2: keyed by the prepared record's offset
                key = str(row["prepared_transaction_offset"])
            groups[key]["commit" if t == "COMMIT" else "rollback"] = True
    out = {}
    for key, g in groups.items():
        if g["commit"]:
            out[key] = L.COMMITTED
        elif g["rollback"] or any(ops_by_half.get(h) for h in g["half_qos"]):
            out[key] = L.ROLLED_BACK
        elif g["unit"] is not None:
            out[key] = L.COMMITTED if g["unit"] == "COMMIT" else L.ROLLED_BACK
        elif g["discard"]:
            out[key] = L.DISCARDED
        else:
            out[key] = L.PREPARED
    return out


def main(argv=None) -> int:
    import sys

    args = sys.argv[1:] if argv is None else argv
    report = verify(args[0])
    print(report.summary())
    for item in report.unexplained[:20]:
        print("unexplained anomaly:", json.dumps(item))
    for item in report.problems[:50]:
        print("problem:", item)
    return 0 if report.ok else 1


__all__ = ["verify", "VerifyReport"]
