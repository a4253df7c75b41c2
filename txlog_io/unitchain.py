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
shows it.  The same units are checked against the CommitLog's geometry (file names and sizes, not its
bytes): a unit whose record is smaller than the smallest record (``MIN_RECORD_SIZE``), larger than one
CommitLog file (``doAppend`` moves a record that does not fit to the next file: END_OF_FILE), or ending past
the newest CommitLog file (RocketMQ's recovery deletes such units, ``CommitLog.recoverNormally /
recoverAbnormally -> truncateDirtyLogicFiles``) is ``IMPOSSIBLE_UNIT``; it is then left out of the order
checks, so one bad unit is one finding.  A random block in the unwritten space after the data makes such a
unit pointing *forward*, which the order alone cannot show.  Other units of a file are left to the decoders
(a bad value there is a change no checksum covers; the audit cross-checks units against the CommitLog).

Cost: the first, the last and the one before the last real unit of each file, found by bounded block reads
from each end (a preallocated file is zeros after its data).  Files are opened read-only.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from txlog_io.commitlog_layout import MIN_RECORD_SIZE
from txlog_io.consumequeue import (
    CQ_UNIT_DTYPE,
    CQ_UNIT_SIZE,
    PRE_BLANK_SIZE,
    REDOLOG_UNIT_DTYPE,
    STATETABLE_UNIT_DTYPE,
)
from txlog_io.errors import Anomaly, AnomalyKind, TxlogError
from txlog_io.positional import input_size, open_input

if TYPE_CHECKING:       # Arrow only for drop_misplaced_units; the unit checks need numpy alone
    import pyarrow as pa

UNIT_DTYPE_BY_KIND = {"consumequeue": CQ_UNIT_DTYPE, "redolog": REDOLOG_UNIT_DTYPE,
                      "statetable": STATETABLE_UNIT_DTYPE}
_BLOCK_BYTES = 64 * 1024

# (position, CommitLog offset, size) of one real unit
Unit = Tuple[int, int, int]


class CommitLogBounds(NamedTuple):
    """What a store's CommitLog file listing says about any record in it (None: not known)."""
    end: Optional[int]            # just past the newest CommitLog file (its start offset + its file size)
    file_size: Optional[int]      # the largest CommitLog file: no record is larger


def commitlog_bounds(layout) -> CommitLogBounds:
    """Bounds from a ``StoreLayout``'s CommitLog (or DLedger data) files; nominal sizes, so a file cut short
    by a half-copied backup does not make the units written before the cut look impossible."""
    files = list(layout.commitlog)
    if not files:
        return CommitLogBounds(None, None)
    nominal = max([layout.commitlog_file_size or 0] + [mf.size for mf in files])
    return CommitLogBounds(max(mf.base_offset for mf in files) + nominal, nominal)


def _impossible(unit: Unit, bounds: Optional[CommitLogBounds]) -> Optional[Tuple[str, str]]:
    """(expected, why) when no CommitLog of the store can hold the unit's record, else None."""
    _, offset, size = unit
    if size < MIN_RECORD_SIZE:
        return f"size >= {MIN_RECORD_SIZE}", "smaller than the smallest CommitLog record"
    if bounds is None:
        return None
    if bounds.file_size is not None and size > bounds.file_size:
        return f"size <= {bounds.file_size}", "larger than a CommitLog file (a record never spans two)"
    if bounds.end is not None and offset + size > bounds.end:
        return f"commitlog_offset + size <= {bounds.end}", \
            "past the end of the newest CommitLog file (RocketMQ's recovery deletes such units)"
    return None


def _real(units: np.ndarray) -> np.ndarray:
    """Indexes of the units a queue holds: not unwritten (all zero), not pre-blank padding, sane pointer."""
    offsets, sizes = units["commitlog_offset"], units["size"]
    written = np.zeros(len(units), dtype=bool)
    for name in units.dtype.names or ():
        written |= units[name] != 0
    return np.flatnonzero(written & (sizes != PRE_BLANK_SIZE) & (offsets >= 0) & (sizes > 0))


def file_ends(path, dtype: np.dtype) -> Optional[Tuple[Unit, Optional[Unit], Unit]]:
    """(first, the one before the last, last) real unit of one file, or None when it holds none."""
    unit = dtype.itemsize
    block = max(unit, _BLOCK_BYTES - _BLOCK_BYTES % unit)
    with open_input(path) as fh:
        complete = input_size(fh) // unit * unit

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


def check_unit_chain(files: Sequence, kind: str, label: str = "",
                     bounds: Optional[CommitLogBounds] = None) -> List[Anomaly]:
    """Findings for the files of one queue (``MappedFile``s in name order) whose units do not continue the
    CommitLog offsets of the files before them, or whose first / last units no CommitLog can hold (``bounds``
    from :func:`commitlog_bounds`; None checks only the smallest record size).  ``label`` names the queue in
    the detail."""
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
        plausible = {}
        for unit in dict.fromkeys(u for u in ends if u is not None):
            why = _impossible(unit, bounds)
            plausible[unit] = why is None
            if why is not None:
                found.append(Anomaly(
                    AnomalyKind.IMPOSSIBLE_UNIT, str(mf.path), unit[0],
                    f"this {kind} unit points at a record {why[1]}: RocketMQ cannot have written it (damaged "
                    "bytes, or a unit born in the unwritten space after the data)",
                    why[0], f"commitlog_offset={unit[1]} size={unit[2]}", kind, mf.base_offset + unit[0],
                    dtype.itemsize))
        first, before_last, last = ends
        if before_last is not None and plausible[before_last] and plausible[last] \
                and last[1] < before_last[1] + before_last[2]:
            # a plausible unit in the unwritten space right after the data (a flipped bit, stray bytes): no
            # zero unit precedes it, so only the order betrays it
            found.append(Anomaly(
                AnomalyKind.UNIT_OUT_OF_ORDER, str(mf.path), last[0],
                f"the last unit of this {kind} file points back before the unit at {before_last[0]}: "
                "RocketMQ writes a queue's CommitLog offsets in increasing order",
                f"commitlog_offset >= {before_last[1] + before_last[2]}", f"commitlog_offset={last[1]}",
                kind, mf.base_offset + last[0], dtype.itemsize))
        if previous is not None and plausible[first]:
            name, (_, p_offset, p_size) = previous
            if first[1] < p_offset + p_size:
                queue = f" of {label}" if label else ""
                found.append(Anomaly(
                    AnomalyKind.UNIT_FILE_OUT_OF_ORDER, str(mf.path), first[0],
                    f"the {kind} file{queue} does not continue {name}: its first unit points back into the "
                    "CommitLog offsets that file already indexes (a copied or stale file under this name); "
                    "RocketMQ writes a queue's CommitLog offsets in increasing order, but its recovery would "
                    "keep these units and serve them again; the audit does not use them as evidence",
                    f"commitlog_offset >= {p_offset + p_size}", f"commitlog_offset={first[1]}", kind,
                    mf.base_offset + first[0], last[0] + dtype.itemsize - first[0]))   # the file's units
        if plausible[last]:
            previous = (mf.name, last)
        elif plausible[first]:
            previous = (mf.name, first)
    return found


def check_store_unit_chains(layout) -> List[Anomaly]:
    """``check_unit_chain`` over every consume queue, the statetable and the redolog of a ``StoreLayout``."""
    found: List[Anomaly] = []
    bounds = commitlog_bounds(layout)
    queues: Iterable = sorted(layout.consume_queues.items())
    for (topic, queue_id), files in queues:
        found.extend(check_unit_chain(files, "consumequeue", f"{topic}/{queue_id}", bounds))
    for kind in ("statetable", "redolog"):
        found.extend(check_unit_chain(getattr(layout, kind), kind, bounds=bounds))
    return found


def drop_misplaced_units(units: "pa.Table", findings: Iterable[dict]) -> "pa.Table":
    """``units`` (an Arrow table with broker, topic, queue_id, queue_offset) without the rows of the
    consume-queue files reported ``UNIT_FILE_OUT_OF_ORDER`` in ``findings`` (dicts with broker, kind, source,
    file, physical_offset = the first unit's logical byte offset, length = bytes of the file's units).

    RocketMQ's recovery would keep such units (``ConsumeQueue.recover`` checks units one by one) and serve
    them; its writer would never have written them (``putMessagePositionInfo`` skips a unit whose CommitLog
    offset does not grow).  Their queue offsets come from a name their content does not belong to, so they
    are no evidence about any record: cross-checked, every one of them would be a CQ_MISMATCH and flag an
    intact transaction.  The one finding on the file reports them instead."""
    import pyarrow.compute as pc

    ranges: dict = {}
    for a in findings:
        if a["kind"] != AnomalyKind.UNIT_FILE_OUT_OF_ORDER or a["source"] != "consumequeue" \
                or a["length"] is None or a["physical_offset"] is None:
            continue
        queue_dir = Path(a["file"]).parent                  # consumequeue/<topic>/<queueId>/<20 digits>
        if not queue_dir.name.isdigit():
            continue
        lo = a["physical_offset"] // CQ_UNIT_SIZE
        ranges.setdefault((a["broker"], queue_dir.parent.name, int(queue_dir.name)), []).append(
            (lo, lo + a["length"] // CQ_UNIT_SIZE))
    if not ranges or not units.num_rows:
        return units
    drop = None
    for (broker, topic, queue_id), spans in ranges.items():
        same_queue = pc.and_(pc.and_(pc.equal(units.column("broker"), broker),
                                     pc.equal(units.column("topic"), topic)),
                             pc.equal(units.column("queue_id"), queue_id))
        for lo, hi in spans:
            offset = units.column("queue_offset")
            hit = pc.and_(same_queue, pc.and_(pc.greater_equal(offset, lo), pc.less(offset, hi)))
            drop = hit if drop is None else pc.or_(drop, hit)
    return units.filter(pc.invert(pc.fill_null(drop, False)))


__all__ = ["check_unit_chain", "drop_misplaced_units", "check_store_unit_chains", "commitlog_bounds", "CommitLogBounds", "file_ends",
           "UNIT_DTYPE_BY_KIND"]
