"""Faults injected into a finished store, each reported with its file and exact byte position.

Crash-time faults (torn tail, crash between commit and op, lost 5.1+ op batch, consume-queue dispatch lag,
stale consumerOffset.json, the 3.x statetable rebuild) happen inside the simulation (refbroker.produce,
.transaction, .recovery, .statetable, driven by refbroker.workload).  The faults here damage files after the
broker has stopped, the way disks, operators and retention do.  In DLedger mode (profile ``dledger_self_id``)
the CommitLog faults hit ``dledger-<id>/data/`` files: a record's file and file position are those of the
message inside its entry, so the same byte positions apply; retention deletes data files only (DLedger's
CleanSpaceService leaves the index files):

================================  ===========================================================================
name                              what it does (expected decoder finding)
================================  ===========================================================================
``retention``                     deletes the oldest third of the CommitLog files (at least one when there are
                                  two or more), then every consume-queue / redolog / statetable file (but the
                                  last of each queue) whose last unit points below the new minimum offset
                                  (``deleteExpiredFileByOffset``); records in deleted files become ``present:
                                  false`` with flag RECORD_DELETED
``bitflip_commit_body``           one bit of a COMMIT record's body (BODY_CRC_MISMATCH at the record start;
                                  the header and properties stay readable, so the record still counts)
``bitflip_record_header``         one bit of an ordinary record's MAGICCODE (BAD_MAGIC at the record start)
``bitflip_cq_unit``               the sign bit of a consume-queue unit's size (BAD_CQ_ENTRY at the unit)
``bitflip_checkpoint``            the sign bit of physicMsgTimestamp (BAD_CHECKPOINT at 0)
``bitflip_statetable``            3.x: the low bit of a unit's state (4 -> 5; BAD_STATETABLE_UNIT); the
                                  ledger's ``statetable`` of the unit's transaction gets the new state
``truncate_commitlog``            cuts the newest CommitLog file in the middle of its last record
                                  (FILE_SIZE_MISMATCH and TRUNCATED_RECORD)
``truncate_config``               cuts consumerOffset.json in half (BAD_JSON; the .bak copy is intact)
``delete_op_cq``                  4.3+: removes consumequeue/RMQ_SYS_TRANS_OP_HALF_TOPIC (ops stay in the
                                  CommitLog; flag OP_QUEUE_DELETED)
================================  ===========================================================================

Every fault returns a dict (a ledger "fault" line) with ``effects`` the ledger uses to mark records:
``deleted`` / ``corrupted`` (CommitLog offset ranges [start, end): records starting there are no longer
readable, ``present`` false), ``body_damaged`` (ranges of records whose body fails its CRC but whose header
and properties -- type, PREPARED_TRANSACTION_OFFSET, UNIQ_KEY, PGROUP -- are intact: they stay ``present``,
flag RECORD_CORRUPTED; version 1 records have no CRC over anything but the body, so the evidence they carry
is as readable as before), ``statetable_units`` ([[unit index, new state]]) and ``op_queue_deleted``.
"""
from __future__ import annotations

import random
import shutil
import struct
from pathlib import Path
from typing import Callable, Optional

import numpy as np

from txlog_io import commitlog as CL
from txlog_io import consumequeue as CQ
from txlog_io.errors import UsageError

_I32 = struct.Struct(">i")


class FaultContext:
    """What a fault needs: the store, the profile, sampled target records and a seeded RNG."""

    def __init__(self, store_root, profile, rng: random.Random, *, commitlog_file_size: int,
                 cq_file_size: int, targets: dict, last_record: Optional[dict], commitlog_dir=None):
        self.root = Path(store_root)
        # commitlog/, or dledger-<id>/data/ in DLedger mode (records' file / file_position are the same)
        self.commitlog_dir = Path(commitlog_dir) if commitlog_dir is not None else self.root / "commitlog"
        self.profile = profile
        self.rng = rng
        self.commitlog_file_size = commitlog_file_size
        self.cq_file_size = cq_file_size
        self.targets = targets  # kind -> [record dicts with commitlog_offset/size/file/file_position]
        self.last_record = last_record
        self.used_offsets: set = set()

    def pick(self, *kinds) -> Optional[dict]:
        for kind in kinds:
            pool = [t for t in self.targets.get(kind, []) if t["commitlog_offset"] not in self.used_offsets]
            if pool:
                choice = pool[self.rng.randrange(len(pool))]
                self.used_offsets.add(choice["commitlog_offset"])
                return choice
        return None


def _written_units(path: Path, dtype: np.dtype) -> list:
    """[{position, size}] of the units of a fixed-unit file that are not all zero (numpy scan, any size)."""
    raw = np.fromfile(path, dtype=np.uint8)
    count = len(raw) // dtype.itemsize
    if count == 0:
        return []
    rows = raw[:count * dtype.itemsize].reshape(count, dtype.itemsize)
    nonzero = np.flatnonzero(rows.any(axis=1))
    sizes = raw[:count * dtype.itemsize].view(dtype)["size"]
    return [{"position": int(i) * dtype.itemsize, "size": int(sizes[i])} for i in nonzero]


def _flip(path: Path, position: int, bit: int) -> tuple:
    with open(path, "r+b") as fh:
        fh.seek(position)
        old = fh.read(1)[0]
        new = old ^ (1 << bit)
        fh.seek(position)
        fh.write(bytes([new]))
    return old, new


def _rel(ctx: FaultContext, path: Path) -> str:
    return str(path.relative_to(ctx.root))


def _record_fault(ctx, name, target, position, bit, detail, expected, effect="corrupted"):
    path = ctx.commitlog_dir / target["file"]
    old, new = _flip(path, position, bit)
    return {
        "fault": name,
        "file": _rel(ctx, path),
        "position": position,
        "length": 1,
        "detail": f"{detail}: byte 0x{old:02x} -> 0x{new:02x} (bit {bit}) in the record at file position "
        f"{target['file_position']} (physical offset {target['commitlog_offset']})",
        "expected_anomalies": expected,
        "record_position": target["file_position"],
        "affected": [
            {
                "record": target.get("record"),
                "commitlog_offset": target["commitlog_offset"],
                "transaction_key": target.get("transaction_key"),
            }
        ],
        "effects": {effect: [[target["commitlog_offset"], target["commitlog_offset"] + target["size"]]]},
    }


def bitflip_commit_body(ctx: FaultContext) -> list:
    target = ctx.pick("commit", "half")
    if target is None:
        return []
    path = ctx.commitlog_dir / target["file"]
    with open(path, "rb") as fh:
        fh.seek(target["file_position"])
        head = fh.read(CL.MAX_FIXED_SIZE)
    sys_flag = _I32.unpack_from(head, CL.SYS_FLAG_OFFSET)[0]
    fixed = CL.LAYOUTS[CL.layout_index(sys_flag)].itemsize
    body_len = _I32.unpack_from(head, fixed - 4)[0]
    if body_len <= 0:
        return []
    position = target["file_position"] + fixed + ctx.rng.randrange(body_len)
    return [_record_fault(ctx, "BITFLIP_COMMIT_BODY", target, position, ctx.rng.randrange(8),
                          "flipped one bit of a record body", ["BODY_CRC_MISMATCH"], effect="body_damaged")]


def bitflip_record_header(ctx: FaultContext) -> list:
    target = ctx.pick("ordinary", "op", "half")
    if target is None:
        return []
    position = target["file_position"] + 4 + ctx.rng.randrange(4)       # MAGICCODE
    return [_record_fault(ctx, "BITFLIP_RECORD_HEADER", target, position, ctx.rng.randrange(8),
                          "flipped one bit of a record's MAGICCODE", ["BAD_MAGIC", "RESYNC"])]


def _queue_files(ctx: FaultContext) -> list:
    top = ctx.root / "consumequeue"
    if not top.is_dir():
        return []
    return sorted(p for p in top.glob("*/*/*") if p.is_file())


def bitflip_cq_unit(ctx: FaultContext) -> list:
    files = [p for p in _queue_files(ctx) if "RMQ_SYS_TRANS" not in str(p)]
    if not files:
        return []
    path = files[ctx.rng.randrange(len(files))]
    units = _written_units(path, CQ.CQ_UNIT_DTYPE)
    written = [i for i in units if int(i["size"]) != CQ.PRE_BLANK_SIZE] if units is not None else []
    if not written:
        return []
    with open(path, "rb") as fh:
        data = fh.read()
    unit = int(written[ctx.rng.randrange(len(written))]["position"])
    commitlog_offset = struct.unpack_from(">q", data, unit)[0]
    position = unit + 8                                                   # size field, most significant byte
    old, new = _flip(path, position, 7)
    return [
        {
            "fault": "BITFLIP_CQ_UNIT",
            "file": _rel(ctx, path),
            "position": position,
            "length": 1,
            "detail": f"sign bit of the size of the unit at file position {unit}: "
            f"byte 0x{old:02x} -> 0x{new:02x}",
            "expected_anomalies": ["BAD_CQ_ENTRY"],
            "record_position": unit,
            "affected": [
                {
                    "record": "consume queue unit",
                    "commitlog_offset": commitlog_offset,
                    "transaction_key": None,
                }
            ],
            "effects": {},
        }
    ]


def bitflip_checkpoint(ctx: FaultContext) -> list:
    path = ctx.root / "checkpoint"
    if not path.exists():
        return []
    old, new = _flip(path, 0, 7)
    return [{"fault": "BITFLIP_CHECKPOINT", "file": "checkpoint", "position": 0, "length": 1,
             "detail": f"sign bit of physicMsgTimestamp: byte 0x{old:02x} -> 0x{new:02x}",
             "expected_anomalies": ["BAD_CHECKPOINT"], "affected": [], "effects": {}}]


def bitflip_statetable(ctx: FaultContext) -> list:
    top = ctx.root / "transaction" / "statetable"
    files = sorted(top.iterdir()) if top.is_dir() else []
    for path in files:
        units = _written_units(path, CQ.STATETABLE_UNIT_DTYPE)
        if not units:
            continue
        unit = int(units[ctx.rng.randrange(len(units))]["position"])
        position = unit + CQ.STATETABLE_STATE_POS + 3
        with open(path, "rb") as fh:
            fh.seek(unit)
            prepared_offset = struct.unpack(">q", fh.read(8))[0]
        old, new = _flip(path, position, 0)
        index = (int(path.name) + unit) // CQ.STATETABLE_UNIT_SIZE
        return [
            {
                "fault": "BITFLIP_STATETABLE",
                "file": _rel(ctx, path),
                "position": position,
                "length": 1,
                "detail": f"low bit of the state of the unit at file position {unit}: "
                f"0x{old:02x} -> 0x{new:02x}",
                "expected_anomalies": ["BAD_STATETABLE_UNIT"],
                "record_position": unit,
                "affected": [
                    {
                        "record": "statetable unit",
                        "commitlog_offset": prepared_offset,
                        "transaction_key": str(prepared_offset),
                    }
                ],
                "effects": {"statetable_units": [[index, new]]},
            }
        ]
    return []


def truncate_commitlog(ctx: FaultContext) -> list:
    last = ctx.last_record
    if last is None:
        return []
    path = ctx.commitlog_dir / last["file"]
    cut = last["file_position"] + max(1, last["size"] // 2)
    file_start = int(last["file"])
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return [
        {
            "fault": "TRUNCATE_COMMITLOG",
            "file": _rel(ctx, path),
            "position": cut,
            "length": 0,
            "detail": f"file truncated to {cut} bytes, inside the last record (file position "
            f"{last['file_position']}, {last['size']} bytes)",
            "expected_anomalies": ["FILE_SIZE_MISMATCH", "TRUNCATED_RECORD", "BAD_TOTAL_SIZE"],
            "record_position": last["file_position"],
            "affected": [
                {
                    "record": last.get("record"),
                    "commitlog_offset": last["commitlog_offset"],
                    "transaction_key": last.get("transaction_key"),
                }
            ],
            "effects": {
                "corrupted": [[file_start + last["file_position"], file_start + ctx.commitlog_file_size]]
            },
        }
    ]


def truncate_config(ctx: FaultContext) -> list:
    path = ctx.root / "config" / "consumerOffset.json"
    if not path.exists():
        return []
    size = path.stat().st_size
    cut = size // 2
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return [{"fault": "TRUNCATE_CONFIG", "file": _rel(ctx, path), "position": cut, "length": 0,
             "detail": f"consumerOffset.json cut from {size} to {cut} bytes (consumerOffset.json.bak intact)",
             "expected_anomalies": ["BAD_JSON"], "affected": [], "effects": {}}]


def delete_op_cq(ctx: FaultContext) -> list:
    path = ctx.root / "consumequeue" / "RMQ_SYS_TRANS_OP_HALF_TOPIC"
    if not path.is_dir():
        return []
    shutil.rmtree(path)
    return [
        {
            "fault": "DELETE_OP_CQ",
            "file": _rel(ctx, path),
            "position": 0,
            "length": 0,
            "detail": "the op half topic's consume queue directory was deleted (ops remain in the CommitLog)",
            "expected_anomalies": ["MISSING_FILE"],
            "affected": [],
            "effects": {"op_queue_deleted": True},
        }
    ]


def _last_unit_offset(path: Path, unit_size: int) -> Optional[int]:
    """CommitLog offset in the file's last unit slot, None when the file is not full (never deleted)."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(size - unit_size)
        tail = fh.read(unit_size)
    if not tail.strip(b"\0"):
        return None
    return struct.unpack_from(">q", tail, 0)[0]


def retention(ctx: FaultContext) -> list:
    files = sorted(p for p in ctx.commitlog_dir.iterdir() if p.is_file())
    if len(files) < 2:
        return []
    count = max(1, len(files) // 3)
    doomed = files[:count]
    min_offset = int(files[count].name)
    for path in doomed:
        path.unlink()
    faults = [{"fault": "RETENTION_DELETE_COMMITLOG", "file": _rel(ctx, doomed[0]), "position": 0,
               "length": min_offset - int(doomed[0].name),
               "detail": f"retention deleted {count} CommitLog file(s) {doomed[0].name}..{doomed[-1].name}; "
                         f"the minimum physical offset is now {min_offset}",
               "expected_anomalies": [], "affected": [],
               "effects": {"deleted": [[int(doomed[0].name), min_offset]]}}]
    deleted_units = []
    queue_dirs = [d for d in (ctx.root / "consumequeue").glob("*/*") if d.is_dir()]
    redolog = ctx.root / "transaction" / "redolog"
    queue_dirs += [d for d in redolog.glob("*/*") if d.is_dir()] if redolog.is_dir() else []
    for directory in queue_dirs:
        deleted_units += _delete_expired_units(directory, CQ.CQ_UNIT_SIZE, min_offset)
    statetable = ctx.root / "transaction" / "statetable"
    if statetable.is_dir():
        deleted_units += _delete_expired_units(statetable, CQ.STATETABLE_UNIT_SIZE, min_offset)
    deleted_units += _delete_expired_index_files(ctx.root / "index", min_offset)
    for path, size in deleted_units:
        faults.append({"fault": "RETENTION_DELETE_QUEUE_FILE", "file": _rel(ctx, path), "position": 0,
                       "length": size,
                       "detail": "queue file whose last unit points below the minimum CommitLog offset was "
                                 "deleted with it", "expected_anomalies": [],
                       "affected": [], "effects": {}})
    return faults


def _delete_expired_index_files(directory: Path, min_offset: int) -> list:
    """IndexService.deleteExpiredFile: index files whose endPhyOffset is below the CommitLog's first offset
    (never the newest)."""
    from txlog_io.indexfile import read_index_header

    files = sorted(p for p in directory.iterdir() if p.is_file()) if directory.is_dir() else []
    deleted = []
    for path in files[:-1]:
        header = read_index_header(path)
        if header is None or header.end_phy_offset >= min_offset:
            break
        size = path.stat().st_size
        path.unlink()
        deleted.append((path, size))
    return deleted


def _delete_expired_units(directory: Path, unit_size: int, min_offset: int) -> list:
    files = sorted(p for p in directory.iterdir() if p.is_file())
    deleted = []
    for path in files[:-1]:                                  # MappedFileQueue never deletes the last file
        last = _last_unit_offset(path, unit_size)
        if last is None or last >= min_offset:
            break
        size = path.stat().st_size
        path.unlink()
        deleted.append((path, size))
    return deleted


FAULTS: dict = {
    f.__name__: f
    for f in (
        retention,
        bitflip_commit_body,
        bitflip_record_header,
        bitflip_cq_unit,
        bitflip_checkpoint,
        bitflip_statetable,
        truncate_commitlog,
        truncate_config,
        delete_op_cq,
    )
}


def apply_faults(names, ctx: FaultContext) -> list:
    out = []
    for name in names:
        fn: Optional[Callable] = FAULTS.get(name)
        if fn is None:
            raise UsageError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
        out.extend(fn(ctx))
    return out


__all__ = ["FAULTS", "FaultContext", "apply_faults"]
