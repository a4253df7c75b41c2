"""Cross-file check of the fixed-unit queues (ConsumeQueue, 3.x statetable, 3.x redolog): does each file's
content belong at its name's offset?

Sources (RocketMQ 4.9.7 / 5.3.3; 3.1.4 for the statetable):
  store/.../ConsumeQueue.java   putMessagePositionInfo: a unit whose ``offset + size`` is not past
                                ``maxPhysicOffset`` is skipped, so a queue's CommitLog offsets only grow;
                                recover / correctMinOffset check units one by one only
  3.1.4 .../transaction/TransactionStateService.java: appendPreparedTransaction in dispatch (CommitLog)
                                order; the redolog is a ConsumeQueue (same rule)

A unit carries no queue offset of its own: its place in the queue is its file's name plus its position.  A
copy of one file under the next file's name (a duplicated file), or a file restored from an older backup,
therefore has the right size and valid units, and no single-file decoder can see it.  RocketMQ itself never
checks this (its recovery reads only the newest files and trusts their names); we go beyond it with the one
invariant its writer guarantees: across the files of one queue, in name order, the first unit of a file lies
after the last unit of the nearest non-empty file before it.  A file breaking that is reported once,
``UNIT_FILE_OUT_OF_ORDER`` at its first unit (file, position, expected vs actual).  Within a file, the same
invariant is checked for the last unit only (``UNIT_OUT_OF_ORDER``): a plausible unit born in the unwritten
space right after the data (a flipped bit, stray bytes) is not preceded by a zero unit, so only the order
shows it.  Other units of a file are left to the decoders (a bad value there is a change no checksum covers;
the audit cross-checks units against the CommitLog).

Cost: the first, the last and the one before the last real unit of each file, found by bounded block reads
from each end (a preallocated file is zeros after its data).  Files are opened read-only.
"""
from __future__ import annotations

import os
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from txlog_io.consumequeue import CQ_UNIT_DTYPE, PRE_BLANK_SIZE, REDOLOG_UNIT_DTYPE, STATETABLE_UNIT_DTYPE
from txlog_io.errors import Anomaly, AnomalyKind, TxlogError

UNIT_DTYPE_BY_KIND = {"consumequeue": CQ_UNIT_DTYPE, "redolog": REDOLOG_UNIT_DTYPE,
                      "statetable": STATETABLE_UNIT_DTYPE}
_BLOCK_BYTES = 64 * 1024

# (position, CommitLog offset, size) of one real unit
Unit = Tuple[int, int, int]


def _real(units: np.ndarray) -> np.ndarray:
    """Indexes of the units a queue holds: not unwritten (all zero), not pre-blank padding, sane pointer."""
    offsets, sizes = units["commitlog_offset"], units["size"]
    written = np.zeros(len(units), dtype=bool)
    for name in units.dtype.names:
        written |= units[name] != 0
    return np.flatnonzero(written & (sizes != PRE_BLANK_SIZE) & (offsets >= 0) & (sizes > 0))


def file_ends(path, dtype: np.dtype) -> Optional[Tuple[Unit, Optional[Unit], Unit]]:
    """(first, the one before the last, last) real unit of one file, or None when it holds none."""
    unit = dtype.itemsize
    block = max(unit, _BLOCK_BYTES - _BLOCK_BYTES % unit)
    with open(path, "rb") as fh:
        complete = os.fstat(fh.fileno()).st_size // unit * unit

        def at(start: int, end: int, pick: int) -> Optional[Unit]:
            fh.seek(start)
            units = np.frombuffer(fh.read(end - start), dtype=dtype)
            real = _real(units)
            if not real.size:
                return None
            i = int(real[pick])
            return start + i * unit, int(units["commitlog_offset"][i]), int(units["size"][i])

        def last_before(end: int, floor: int) -> Optional[Unit]:
            while end > floor:
                start = max(floor, end - block)
                found = at(start, end, -1)
                if found is not None:
                    return found
                end = start
            return None

        first = None
        for start in range(0, complete, block):
            first = at(start, min(start + block, complete), 0)
            if first is not None:
                break
        if first is None:
            return None
        last = last_before(complete, first[0])
        if last is None or last[0] == first[0]:
            return first, None, first
        return first, last_before(last[0], first[0]), last


def check_unit_chain(files: Sequence, kind: str, label: str = "") -> List[Anomaly]:
    """Findings for the files of one queue (``MappedFile``s in name order) whose units do not continue the
    CommitLog offsets of the files before them.  ``label`` names the queue in the detail."""
    dtype = UNIT_DTYPE_BY_KIND[kind]
    found: List[Anomaly] = []
    previous = None                                  # (file name, last unit) of the nearest non-empty file
    for mf in files:
        try:
            ends = file_ends(mf.path, dtype)
        except (OSError, TxlogError):
            continue                                 # unreadable: the decoders report it
        if ends is None:
            continue
        first, before_last, last = ends
        if before_last is not None and last[1] < before_last[1] + before_last[2]:
            # a plausible unit in the unwritten space right after the data (a flipped bit, stray bytes): no
            # zero unit precedes it, so only the order betrays it
            found.append(Anomaly(
                AnomalyKind.UNIT_OUT_OF_ORDER, str(mf.path), last[0],
                f"the last unit of this {kind} file points back before the unit at {before_last[0]}: "
                "RocketMQ writes a queue's CommitLog offsets in increasing order",
                f"commitlog_offset >= {before_last[1] + before_last[2]}", f"commitlog_offset={last[1]}",
                kind, mf.base_offset + last[0]))
        if previous is not None:
            name, (_, p_offset, p_size) = previous
            if first[1] < p_offset + p_size:
                queue = f" of {label}" if label else ""
                found.append(Anomaly(
                    AnomalyKind.UNIT_FILE_OUT_OF_ORDER, str(mf.path), first[0],
                    f"the {kind} file{queue} does not continue {name}: its first unit points back into the "
                    "CommitLog offsets that file already indexes (a copied or stale file under this name); "
                    "RocketMQ writes a queue's CommitLog offsets in increasing order",
                    f"commitlog_offset >= {p_offset + p_size}", f"commitlog_offset={first[1]}", kind,
                    mf.base_offset + first[0]))
        previous = (mf.name, last)
    return found


def check_store_unit_chains(layout) -> List[Anomaly]:
    """``check_unit_chain`` over every consume queue, the statetable and the redolog of a ``StoreLayout``."""
    found: List[Anomaly] = []
    queues: Iterable = sorted(layout.consume_queues.items())
    for (topic, queue_id), files in queues:
        found.extend(check_unit_chain(files, "consumequeue", f"{topic}/{queue_id}"))
    for kind in ("statetable", "redolog"):
        found.extend(check_unit_chain(getattr(layout, kind), kind))
    return found


__all__ = ["check_unit_chain", "check_store_unit_chains", "file_ends", "UNIT_DTYPE_BY_KIND"]
