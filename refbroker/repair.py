"""Offline repair of a COPY of a broker store: the writes the broker should have made, made as it makes them.

Plays the parts of RocketMQ the audit found missing (the reference broker's own writers and txlog_io's
encoders, so every byte is what the broker of the store's profile writes):

* MARK_DONE (4.3+): op messages of ``TransactionalMessageBridge.putOpMessage`` / 5.1+
  ``TransactionalOpBatchService`` -- topic RMQ_SYS_TRANS_OP_HALF_TOPIC, queue 0, TAGS ``d`` then WAIT ``true``
  (HashMap order, capacity 16), body the half offset (4.3-5.0) or ``"o1,o2,"`` batched up to
  transactionOpMsgMaxSize chars (5.1+), born host = store host = the broker's address -- appended after the
  last valid CommitLog record exactly as ``CommitLog.doAppend`` does (BLANK + next file when it does not fit),
  with QUEUEOFFSET = the op queue's next offset; their op consume-queue units follow from the rebuild below,
  and the checkpoint's physic/logics timestamps move to the new records (``StoreCheckpoint``) so recovery
  starts no later than them.  Torn bytes of a crashed last write after the new records are zeroed: RocketMQ's
  recovery discards them, and the copy must not show a record the broker would not read.
* REBUILD_CQ (4.3+): the half / op / discard consume queues as ``ReputMessageService`` dispatch writes them
  from the CommitLog (NOT/COMMIT records, unit = offset, size, tagsCode; ``fillPreBlank`` before the first
  unit of a new file); units pointing past the CommitLog's end are zeroed (``truncateDirtyLogicFiles``).
  Slots whose records retention deleted keep their bytes.  A queue equal to its rebuild is not touched.
* REBUILD_STATETABLE (3.x): statetable units at the prepared records' own QUEUEOFFSET (the index the 3.1.4
  broker gave them and a check request carries) with the state the CommitLog's COMMIT/ROLLBACK records say,
  and the ``abort`` marker removed: with it the 3.1.4 broker would rebuild the table from the first redolog
  file again (TransactionStateService.recreateStateTable).

Everything else in the copy is byte-identical: files are copied with ``os.copy_file_range`` (never linked,
so writing the copy cannot touch the input) and the writes above are applied to the copy.  ``plan_repair``
only reads the input store (read-only opens) and returns the writes; ``apply_repair`` copies and writes.
Spark-free: the ``repair`` job (jobs/repair/run.py) and the tests call it directly.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from refbroker.javaorder import hashmap_capacity, order_keys
from refbroker.profiles import OP_BODY_COMMA_BATCH, get_profile
from refbroker.systopics import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC, REMOVE_TAG
from schemas.store import COMMITLOG
from txlog_io import commitlog as CL
from txlog_io import consumequeue as CQ
from txlog_io import properties as P
from txlog_io.commitlog_decode import ScanSummary
from txlog_io.config import decode_checkpoint, encode_checkpoint
from txlog_io.errors import UsageError
from txlog_io.mappedfile import infer_file_size, list_mapped_files, offset_to_file_name

ACTIONS = ("MARK_DONE", "REBUILD_CQ", "REBUILD_STATETABLE")
TX_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)
#: reconstruction profile (jobs.reconstruct.spark.PROFILES, what audit_runs.profiles holds) -> writer profile
WRITER_PROFILE = {"3.x": "3.x", "4.0-4.2": "4.0-4.2", "4.3-5.0": "4.6-4.9", "5.1+": "5.1+",
                  "unknown": "4.6-4.9"}
_COPY_CHUNK = 1 << 30
_ZERO_SCAN = 1 << 20
_VERIFY_LAST = 8            # newest records re-checked for a torn write (the broker tears at most the last)
_PRE_BLANK = np.frombuffer(CQ.encode_pre_blank(), CQ.CQ_UNIT_DTYPE)[0]
_OP_PROPS = order_keys((P.TAGS, P.WAIT), hashmap_capacity(2, 16))   # new Message(opTopic, "d", body) + WAIT


@dataclass
class Write:
    """One write to the copy: ``data`` at ``position`` of ``file`` (relative to the store root); a missing or
    shorter file is first extended with zeros to ``file_size``.  ``remove``: delete the file instead."""

    action: str
    file: str
    position: int
    data: bytes
    transaction_key: Optional[str] = None
    detail: str = ""
    file_size: Optional[int] = None
    remove: bool = False

    def log_row(self) -> dict:
        return {"action": self.action, "transaction_key": self.transaction_key, "file": self.file,
                "position": int(self.position), "bytes": 0 if self.remove else len(self.data),
                "detail": self.detail}


@dataclass
class RepairPlan:
    root: str
    profile: str
    writes: List[Write] = field(default_factory=list)
    notes: List[str] = field(default_factory=list)      # what could not be repaired, in words

    def log_rows(self) -> List[dict]:
        return [w.log_row() for w in self.writes]


# ------------------------------------------------------------------------------------------------------------
# reading the input store (read-only)
# ------------------------------------------------------------------------------------------------------------

def _rel(root: Path, path) -> str:
    return Path(path).relative_to(root).as_posix()


def _commitlog_files(root: Path):
    d = root / "commitlog"
    if not d.is_dir():
        raise UsageError(f"{d}: no commitlog directory; nothing to repair")
    files, _ = list_mapped_files(d)
    if not files:
        raise UsageError(f"{d}: no CommitLog file; nothing to repair")
    return files, infer_file_size(files) or files[-1].size


def _records(files, topics: Optional[Sequence[str]], with_body: bool) -> pa.Table:
    batches = []
    for mf in files:
        for batch, _ in CL.decode_range(str(mf.path), base_offset=mf.base_offset, topics=topics,
                                        with_body=with_body):
            if batch.num_rows:
                batches.append(batch)
    if not batches:
        return COMMITLOG.arrow_schema().empty_table()
    return pa.Table.from_batches(batches)


def _data_end(mf) -> tuple:
    """(file position after the last valid record of ``mf``, True when the file ends with a BLANK filler,
    file position of that record or None).

    The newest framed records are decoded back to front until one passes its body CRC, as the broker's
    recovery (checkMessageAndReturnSize with checkCRCOnRecover) does: a torn last write whose TOTALSIZE and
    MAGIC survived frames like a record but is not one."""
    summary = ScanSummary(str(mf.path), 0, mf.size)
    tail: List[int] = []
    for frame in CL.scan_range(str(mf.path), base_offset=mf.base_offset, summary=summary):
        if len(frame.positions):
            tail = (tail + [frame.file_pos + int(p) for p in frame.positions[-_VERIFY_LAST:]])[-_VERIFY_LAST:]
    blank = summary.stop_reason.startswith("BLANK")
    if not tail:
        return 0, blank, None
    batch, _ = CL.decode_at(str(mf.path), tail, base_offset=mf.base_offset)
    good = {int(p): int(t) for p, t, ok in zip(batch["file_position"].to_pylist(),
                                                batch["total_size"].to_pylist(),
                                                batch["body_crc_ok"].to_pylist(), strict=True) if ok}
    for pos in reversed(tail):
        if pos in good:
            return pos + good[pos], blank and pos == tail[-1], pos
    return tail[0], False, None


def _tail_garbage(path: Path, start: int, size: int) -> Optional[tuple]:
    """[first, last+1) of the non-zero bytes from ``start`` up to the first all-zero MiB (a torn write)."""
    first = last = None
    with open(path, "rb") as f:
        pos = start
        while pos < size:
            f.seek(pos)
            chunk = np.frombuffer(f.read(min(_ZERO_SCAN, size - pos)), np.uint8)
            nz = np.flatnonzero(chunk)
            if not nz.size:
                break
            first = pos + int(nz[0]) if first is None else first
            last = pos + int(nz[-1]) + 1
            pos += len(chunk)
    return None if first is None else (first, last)


# ------------------------------------------------------------------------------------------------------------
# MARK_DONE
# ------------------------------------------------------------------------------------------------------------

def op_message(body_text: str, *, queue_offset: int, timestamp: int, host: str,
               trailing_separator: bool, born_timestamp: Optional[int] = None) -> CL.Message:
    """An op message as TransactionalMessageBridge writes it (see the module docstring); born = store time
    unless ``born_timestamp`` says otherwise (a live broker's differ by the few ms the put took)."""
    props = {P.TAGS: REMOVE_TAG, P.WAIT: "true"}
    return CL.Message(topic=OP_TOPIC, body=body_text.encode("ascii"),
                      properties={k: props[k] for k in _OP_PROPS},
                      queue_id=0, queue_offset=queue_offset,
                      born_timestamp=timestamp if born_timestamp is None else born_timestamp, born_host=host,
                      store_timestamp=timestamp, store_host=host, magic_version=1,
                      properties_trailing_separator=trailing_separator)


def op_bodies(offsets: Sequence[int], batched: bool, max_chars: int = 4096) -> List[tuple]:
    """[(body text, offsets in it)]: one op per offset (4.3-5.0), or ``"a,b,"`` pieces appended while the
    body is shorter than ``max_chars`` (5.1+ TransactionalOpBatchService.batchSendOpMessage)."""
    if not batched:
        return [(str(o), [o]) for o in offsets]
    out, parts, members, length = [], [], [], 0
    for o in offsets:
        if parts and length >= max_chars:
            out.append(("".join(parts), members))
            parts, members, length = [], [], 0
        text = f"{o},"
        parts.append(text)
        members.append(o)
        length += len(text)
    if parts:
        out.append(("".join(parts), members))
    return out


def _trailing_separator(root: Path, records: pa.Table, default: bool) -> bool:
    """Whether this broker ends its properties with 0x02: read from its newest op (else half) record."""
    for topic in (OP_TOPIC, HALF_TOPIC):
        rows = records.filter(pc.equal(records["topic"], topic))
        if rows.num_rows:
            r = rows.slice(rows.num_rows - 1).to_pylist()[0]
            with open(r["file"], "rb") as f:
                f.seek(r["file_position"] + r["total_size"] - 1)
                return f.read(1) == P.PROPERTY_SEPARATOR
    return default


def _plan_mark_done(plan: RepairPlan, root: Path, rows: Sequence[dict], records: pa.Table, files, file_size,
                    writer, as_of_ms: int) -> List[dict]:
    """Appends the missing op records; returns them as decoded-record-like dicts for the CQ rebuild."""
    wanted: Dict[int, str] = {}
    for r in rows:
        if "MARK_DONE" in (r.get("actions") or [r.get("action")]):
            for o in r.get("mark_done_half_offsets") or []:
                wanted.setdefault(int(o), r["transaction_key"])
    if not wanted:
        return []
    ops = records.filter(pc.equal(records["topic"], OP_TOPIC)).to_pylist()
    done = set()
    for op in ops:          # never write an op twice: the audit may be older than the newest op
        for piece in (op.get("body") or b"").decode("ascii", "replace").split(","):
            if piece.strip().lstrip("-").isdigit():
                done.add(int(piece))
    offsets = sorted(o for o in wanted if o not in done)
    if len(offsets) < len(wanted):
        plan.notes.append(f"{len(wanted) - len(offsets)} MARK_DONE offset(s) already have an op: skipped")
    if not offsets:
        return []
    # the file the broker appends to: the newest with data (a newer all-zero file follows a BLANK filler)
    last_mf, (end, blank_ended, _) = files[-1], _data_end(files[-1])
    for mf in reversed(files[:-1]):
        if end or blank_ended:
            break
        last_mf, (end, blank_ended, _) = mf, _data_end(mf)
    last = _last_record(files)
    if last is None:
        raise UsageError(f"{root}: the CommitLog has no valid record; cannot tell the broker's address")
    host = last["store_host"]
    ts = max(int(as_of_ms), int(last["store_timestamp"]))
    next_qo = 1 + max([int(o["queue_offset"]) for o in ops] + [_cq_max_index(root, OP_TOPIC, 0)])
    trailing = _trailing_separator(root, records, writer.properties_trailing_separator)
    batched = writer.op_body_format == OP_BODY_COMMA_BATCH or plan.profile == "5.1+"
    cur_base, pos = last_mf.base_offset, end
    if blank_ended:
        cur_base, pos = last_mf.base_offset + file_size, 0
    appended = []
    for body, members in op_bodies(offsets, batched, writer.transactionOpMsgMaxSize or 4096):
        msg = op_message(body, queue_offset=next_qo, timestamp=ts, host=host, trailing_separator=trailing)
        size = CL.record_size(msg)
        if size + CL.END_FILE_MIN_BLANK_LENGTH > file_size - pos:        # CommitLog.doAppend: END_OF_FILE
            plan.writes.append(Write("MARK_DONE", f"commitlog/{offset_to_file_name(cur_base)}", pos,
                                     CL.encode_blank(file_size - pos), None,
                                     "BLANK end-of-file header: the op record does not fit", file_size))
            cur_base, pos = cur_base + file_size, 0
        data = CL.encode_record(msg, cur_base + pos)
        keys = sorted({wanted[o] for o in members})
        plan.writes.append(Write(
            "MARK_DONE", f"commitlog/{offset_to_file_name(cur_base)}", pos, data,
            keys[0] if len(keys) == 1 else None,
            f"op record (op queue offset {next_qo}, body {body!r}) for {len(keys)} transaction(s): "
            + ", ".join(keys[:20]) + (" ..." if len(keys) > 20 else ""), file_size))
        appended.append({"topic": OP_TOPIC, "queue_id": 0, "queue_offset": next_qo,
                         "physical_offset": cur_base + pos, "total_size": size,
                         "tags_code": P.tags_code(REMOVE_TAG), "transaction_type": "NOT",
                         "members": members, "keys": keys})
        pos += size
        next_qo += 1
    path = root / "commitlog" / offset_to_file_name(cur_base)
    if path.exists():
        garbage = _tail_garbage(path, pos, min(path.stat().st_size, file_size))
        if garbage:
            plan.writes.append(Write("ZERO_TORN_TAIL", _rel(root, path), garbage[0],
                                     bytes(garbage[1] - garbage[0]), None,
                                     "bytes of a torn write after the last valid record (recovery discards "
                                     "them)", file_size))
    _plan_checkpoint(plan, root, ts)
    return appended


def _last_record(files) -> Optional[dict]:
    for mf in reversed(files):
        _, _, last_pos = _data_end(mf)
        if last_pos is not None:
            batch, _ = CL.decode_at(str(mf.path), [last_pos], base_offset=mf.base_offset)
            if batch.num_rows:
                return batch.to_pylist()[0]
    return None


def _plan_checkpoint(plan: RepairPlan, root: Path, ts: int) -> None:
    path = root / "checkpoint"
    if not path.exists():
        plan.notes.append("no checkpoint file: not created")
        return
    cp = decode_checkpoint(path)
    page = encode_checkpoint(max(ts, cp["physic_msg_timestamp"]), max(ts, cp["logics_msg_timestamp"]),
                             cp["index_msg_timestamp"], cp["master_flushed_offset"], cp["confirm_phy_offset"])
    with open(path, "rb") as f:
        old = f.read(16)
    if page[:16] != old:
        plan.writes.append(Write("CHECKPOINT", "checkpoint", 0, page[:16], None,
                                 f"physicMsgTimestamp/logicsMsgTimestamp -> {ts} (the appended op records)"))


# ------------------------------------------------------------------------------------------------------------
# REBUILD_CQ
# ------------------------------------------------------------------------------------------------------------

def _cq_dir(root: Path, topic: str, qid: int) -> Path:
    return root / "consumequeue" / topic / str(qid)


def _cq_max_index(root: Path, topic: str, qid: int) -> int:
    """Index of the last written unit of a consume queue (-1 when none)."""
    d = _cq_dir(root, topic, qid)
    if not d.is_dir():
        return -1
    files, _ = list_mapped_files(d, source="consumequeue")
    for mf in reversed(files):
        raw = np.fromfile(mf.path, np.uint8)
        rows = raw[:len(raw) // CQ.CQ_UNIT_SIZE * CQ.CQ_UNIT_SIZE].reshape(-1, CQ.CQ_UNIT_SIZE)
        used = np.flatnonzero(rows.any(axis=1))
        if used.size:
            return mf.base_offset // CQ.CQ_UNIT_SIZE + int(used[-1])
    return -1


def _cq_file_size(root: Path, topic: str, qid: int, default: int) -> int:
    d = _cq_dir(root, topic, qid)
    sizes = []
    dirs = [d] if d.is_dir() else [p for p in (root / "consumequeue").glob("*/*") if p.is_dir()]
    for directory in dirs:
        files, _ = list_mapped_files(directory, source="consumequeue")
        sizes += [mf.size for mf in files if mf.size > 0]
    return max(set(sizes), key=sizes.count) if sizes else default


def _plan_cq(plan: RepairPlan, root: Path, records: pa.Table, appended: List[dict], commitlog_end: int,
             default_size: int) -> None:
    units: Dict[tuple, Dict[int, tuple]] = defaultdict(dict)
    new_ops = {}
    cols = records.select(["topic", "queue_id", "queue_offset", "physical_offset", "total_size", "tags_code",
                           "transaction_type"]).to_pylist()
    for r in cols + appended:
        if r["topic"] in TX_TOPICS and r["transaction_type"] in ("NOT", "COMMIT"):
            units[(r["topic"], int(r["queue_id"]))][int(r["queue_offset"])] = (
                int(r["physical_offset"]), int(r["total_size"]), int(r["tags_code"]))
    for a in appended:
        new_ops[int(a["queue_offset"])] = a
    for (topic, qid), by_index in sorted(units.items()):
        size = _cq_file_size(root, topic, qid, default_size)
        per_file = size // CQ.CQ_UNIT_SIZE
        lo, hi = min(by_index), max(by_index)
        keys = np.fromiter(by_index, np.int64, len(by_index))
        values = np.array([by_index[k] for k in keys.tolist()], CQ.CQ_UNIT_DTYPE)
        expected = (keys, values)
        directory = _cq_dir(root, topic, qid)
        existing = {}
        if directory.is_dir():
            files, _ = list_mapped_files(directory, source="consumequeue")
            existing = {mf.base_offset: mf for mf in files}
        starts = set(range(lo // per_file * size, hi // per_file * size + 1, size))
        starts |= {b for b in existing if b >= lo // per_file * size}
        for start in sorted(starts):
            first = start // CQ.CQ_UNIT_SIZE
            mf = existing.get(start)
            old = b""
            if mf is not None:
                with open(mf.path, "rb") as f:
                    old = f.read(size)
            new = np.frombuffer(old.ljust(size, b"\0"), CQ.CQ_UNIT_DTYPE, count=per_file).copy()
            if mf is not None:      # truncateDirtyLogicFiles: units pointing past the CommitLog's end
                new[new["commitlog_offset"] >= commitlog_end] = np.zeros(1, CQ.CQ_UNIT_DTYPE)
            else:                   # fillPreBlank in front of the first unit of a re-created file
                new[:max(0, min(per_file, lo - first))] = _PRE_BLANK
            keys, values = expected
            sel = (keys >= first) & (keys < first + per_file)
            new[keys[sel] - first] = values[sel]
            rel = f"consumequeue/{topic}/{qid}/{offset_to_file_name(start)}"
            ops = new_ops if topic == OP_TOPIC and qid == 0 else {}
            _diff_writes(plan, rel, old, new.tobytes(), size, ops, first, created=mf is None)


def _diff_writes(plan: RepairPlan, rel: str, old: bytes, new: bytes, size: int, new_ops: dict, first: int,
                 created: bool) -> None:
    """One write per new op's unit (OP_CQ_UNIT) and per other run of changed units (REBUILD_CQ)."""
    a = np.frombuffer(old.ljust(size, b"\0"), np.uint8).reshape(-1, CQ.CQ_UNIT_SIZE)
    b = np.frombuffer(new, np.uint8).reshape(-1, CQ.CQ_UNIT_SIZE)
    changed = np.flatnonzero((a != b).any(axis=1))
    if created and not changed.size:
        plan.writes.append(Write("REBUILD_CQ", rel, 0, b"", None, "consume-queue file re-created", size))
        return
    run: List[int] = []

    def flush():
        if run:
            p0, p1 = run[0] * CQ.CQ_UNIT_SIZE, (run[-1] + 1) * CQ.CQ_UNIT_SIZE
            plan.writes.append(Write("REBUILD_CQ", rel, p0, new[p0:p1], None,
                                     f"queue offsets {first + run[0]}..{first + run[-1]} rebuilt from the "
                                     f"CommitLog" + (" (file re-created)" if created else ""), size))
            run.clear()

    for slot in changed.tolist():
        op = new_ops.get(first + slot)
        if op is not None:
            flush()
            p0 = slot * CQ.CQ_UNIT_SIZE
            keys = op["keys"]
            plan.writes.append(Write("OP_CQ_UNIT", rel, p0, new[p0:p0 + CQ.CQ_UNIT_SIZE],
                                     keys[0] if len(keys) == 1 else None,
                                     f"op consume-queue unit {first + slot} for the appended op record",
                                     size))
            continue
        if run and slot != run[-1] + 1:
            flush()
        run.append(slot)
    flush()


# ------------------------------------------------------------------------------------------------------------
# REBUILD_STATETABLE (3.x)
# ------------------------------------------------------------------------------------------------------------

def _plan_statetable(plan: RepairPlan, root: Path, records: pa.Table, writer) -> None:
    from txlog_io.properties import java_string_hash

    tx = records.filter(pc.not_equal(records["transaction_type"], "NOT")).select(
        ["physical_offset", "total_size", "queue_offset", "store_timestamp", "pgroup", "transaction_type",
         "prepared_transaction_offset"]).to_pylist()
    ends: Dict[int, str] = {}
    for r in tx:
        if r["transaction_type"] in ("COMMIT", "ROLLBACK"):
            t = r["transaction_type"]
            p = int(r["prepared_transaction_offset"])
            if ends.get(p) != "COMMIT":                 # a COMMIT record wins over everything
                ends[p] = t
    slots: Dict[int, dict] = {}
    losers = []
    for r in (r for r in tx if r["transaction_type"] == "PREPARED"):
        r["state"] = ends.get(int(r["physical_offset"]), "PREPARED")
        index = int(r["queue_offset"])
        held = slots.get(index)
        # two prepared records with one index (a rebuild reset the counter): the still-open one keeps the
        # unit (it is the one the check timer must see), else the newer one
        if held is None or (r["state"] == "PREPARED") >= (held["state"] == "PREPARED"):
            if held is not None:
                losers.append(held)
            slots[index] = r
        else:
            losers.append(r)
    open_losers = [r for r in losers if r["state"] == "PREPARED"]
    if losers:
        plan.notes.append(f"{len(losers)} prepared record(s) share a statetable index with another "
                          f"({len(open_losers)} still PREPARED, given a unit at the end: their index "
                          f"mismatch cannot be repaired without rewriting CommitLog records)")
    nxt = max(slots, default=-1) + 1
    for r in open_losers:
        slots[nxt] = r
        nxt += 1
    d = root / "transaction" / "statetable"
    existing = {}
    if d.is_dir():
        files, _ = list_mapped_files(d, source="statetable")
        existing = {mf.base_offset: mf for mf in files}
    size = infer_file_size(list(existing.values())) if existing else writer.tranStateTableMapedFileSize
    unit = CQ.STATETABLE_UNIT_SIZE
    per_file = size // unit
    if not slots:
        return
    starts = set(range(min(slots) // per_file * size, max(slots) // per_file * size + 1, size))
    starts |= set(existing)
    for start in sorted(starts):
        mf = existing.get(start)
        old = b""
        if mf is not None:
            with open(mf.path, "rb") as f:
                old = f.read(size)
        new = bytearray(size)
        for slot in range(per_file):
            r = slots.get(start // unit + slot)
            if r is not None:
                new[slot * unit:(slot + 1) * unit] = CQ.encode_statetable_unit(
                    int(r["physical_offset"]), int(r["total_size"]), int(r["store_timestamp"]) // 1000,
                    java_string_hash(r["pgroup"] or ""), r["state"])
        if bytes(new) != old.ljust(size, b"\0") or mf is None:
            n = sum(1 for s in range(per_file) if start // unit + s in slots)
            plan.writes.append(Write(
                "REBUILD_STATETABLE", f"transaction/statetable/{offset_to_file_name(start)}", 0, bytes(new),
                None,
                f"statetable file rewritten from the CommitLog: {n} unit(s) at the prepared records' "
                f"QUEUEOFFSET with their CommitLog state", size))
    if (root / "abort").exists():
        plan.writes.append(Write("REBUILD_STATETABLE", "abort", 0, b"", None,
                                 "abort marker removed: a 3.1.4 broker starting with it would rebuild the "
                                 "statetable from the first redolog file again", remove=True))


# ------------------------------------------------------------------------------------------------------------
# plan / apply
# ------------------------------------------------------------------------------------------------------------

def plan_repair(store: str, profile: str, rows: Iterable[dict], *, actions: Sequence[str] = ACTIONS,
                as_of_ms: int = 0) -> RepairPlan:
    """The writes that repair a copy of ``store`` (reconstruction ``profile``, ``rows`` = its
    recovery_worklist rows).  Reads the store only."""
    root = Path(store)
    unknown = set(actions) - set(ACTIONS)
    if unknown:
        raise UsageError(f"unknown repair action(s): {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(ACTIONS)})")
    rows = list(rows)
    plan = RepairPlan(str(root), profile)
    writer = get_profile(WRITER_PROFILE.get(profile, "4.6-4.9"))
    files, file_size = _commitlog_files(root)
    commitlog_end = 0
    for mf in reversed(files):
        end = _data_end(mf)[0]
        if end:
            commitlog_end = mf.base_offset + end
            break
    if profile == "3.x":
        wanted = any("REBUILD_STATETABLE" in (r.get("actions") or []) for r in rows)
        if "REBUILD_STATETABLE" in actions and wanted:
            _plan_statetable(plan, root, _records(files, None, False), writer)
        return plan
    if profile == "4.0-4.2":
        return plan
    records = _records(files, TX_TOPICS, with_body=True)
    appended = []
    if "MARK_DONE" in actions:
        appended = _plan_mark_done(plan, root, rows, records, files, file_size, writer, as_of_ms)
    if appended and "REBUILD_CQ" not in actions:
        plan.notes.append("MARK_DONE without REBUILD_CQ: the op consume-queue units are written anyway")
    if "REBUILD_CQ" in actions or appended:
        end = max([commitlog_end] + [a["physical_offset"] + a["total_size"] for a in appended])
        _plan_cq(plan, root, records if "REBUILD_CQ" in actions else records.slice(0, 0), appended, end,
                 writer.mappedFileSizeConsumeQueue)
    return plan


def copy_store(src: str, dst: str) -> int:
    """Copy every file under ``src`` to ``dst`` with ``os.copy_file_range`` (no links; holes and mtimes kept);
    returns the bytes of data copied."""
    total = 0
    for dirpath, dirs, files in os.walk(src, followlinks=False):
        dirs.sort()
        out_dir = os.path.join(dst, os.path.relpath(dirpath, src))
        os.makedirs(out_dir, exist_ok=True)
        for name in sorted(files):
            s = os.path.join(dirpath, name)
            if os.path.islink(s) or not os.path.isfile(s):
                continue
            d = os.path.join(out_dir, name)
            with open(s, "rb") as fin, open(d, "wb") as fout:
                total += _copy_file(fin.fileno(), fout.fileno())
            st = os.stat(s)
            os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
    return total


def _data_extents(fd: int, size: int):
    """[start, end) ranges holding data (SEEK_DATA/SEEK_HOLE): pre-allocated mapped files are mostly holes,
    and copying a hole as zeros would make a sparse 1 GiB CommitLog file cost 1 GiB of writes."""
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError:          # ENXIO: only a hole is left (or the filesystem cannot tell: one extent)
            if pos == 0 and not hasattr(os, "SEEK_DATA"):
                yield 0, size
            return
        end = os.lseek(fd, start, os.SEEK_HOLE)
        yield start, min(end, size)
        pos = end


def _copy_file(src: int, dst: int) -> int:
    """Bytes of data copied from ``src`` to ``dst`` with copy_file_range, holes kept as holes."""
    size = os.fstat(src).st_size
    os.ftruncate(dst, size)
    copied = 0
    for start, end in _data_extents(src, size):
        pos = start
        while pos < end:
            n = os.copy_file_range(src, dst, min(_COPY_CHUNK, end - pos), pos, pos)
            if n == 0:
                raise OSError(f"copy_file_range returned 0 at byte {pos} of {end}")
            pos += n
        copied += end - start
    return copied


def apply_repair(plan: RepairPlan, into: str) -> int:
    """Copy the store into ``into`` (must not exist or be empty) and apply the plan's writes; bytes copied."""
    copied = copy_store(plan.root, into)
    for w in plan.writes:
        path = os.path.join(into, w.file)
        if w.remove:
            if os.path.exists(path):
                os.unlink(path)
            continue
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "r+b" if os.path.exists(path) else "w+b") as f:
            if w.file_size is not None and os.fstat(f.fileno()).st_size < w.file_size:
                f.truncate(w.file_size)         # mapped files are pre-allocated at full size
            if w.data:
                f.seek(w.position)
                f.write(w.data)
    return copied


__all__ = ["ACTIONS", "Write", "RepairPlan", "plan_repair", "apply_repair", "copy_store", "op_message",
           "op_bodies", "WRITER_PROFILE"]
