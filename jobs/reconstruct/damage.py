"""CommitLog byte ranges the read could not take as records, and the transactions whose state rests on them.

A state the rules reach by the *absence* of a record (ROLLED_BACK from an op without a COMMIT record, PREPARED
from no op / end record, DISCARDED from no resolution after the discard) holds only if every byte where that
record could lie was read.  ``damaged_ranges`` turns one broker's decoder findings into sorted, disjoint
CommitLog ranges that may have held records nobody read; ``DamagedRanges.first_overlap`` finds, per
transaction, the first of them inside the window its missing record must lie in (jobs/reconstruct/rules.py
sets the windows, docs/robustness.md states the rule per inference with RocketMQ's write order).

What counts as a lost range (``source`` commitlog or dledger, an offset known):

* ``LOST_KINDS`` findings: ``[physical_offset, physical_offset + length)`` (a point when ``length`` is
  unknown: TRUNCATED_FILE marks where a file was cut, the rest of the file is the FILE_SIZE_MISMATCH range);
* FILE_SIZE_MISMATCH of a CommitLog file shorter than the store's file size: ``[base + actual, base +
  expected)``, the part of the file that is gone;
* FILE_GAP: the missing files' offsets (``length`` is the gap);
* CQ_ENTRY_MISMATCH of an indexed read (a consume-queue unit or an IndexFile entry points to a position
  inside a CommitLog file where no record can be read: zeroed or garbled bytes): a point, the record the
  index names is lost.  Indexed mode does not scan the bytes around it, so this is its only sign of a COMMIT
  record zeroed in the middle of the log (full mode reports the same bytes as RESYNC / BAD_MAGIC).  A
  position past the end of its file (``actual`` "end of file") is not one: the cut is FILE_SIZE_MISMATCH's.
* a consume-queue unit that points at or past where a CommitLog file's readable data ends (``past_end``):
  the torn end of a file -- GARBAGE_AFTER_END, TRUNCATED_RECORD,
  TRUNCATED_FILE -- is what a crash leaves and no lost range by itself (below), but a unit of the half / op /
  discard queue pointing into it (at or after that end, before the next record the read took) says the broker
  dispatched a record there: ``[end of data, the unit's end)`` is lost (``CQ_PAST_DATA_END``).  The
  consume queues are written from the CommitLog after the put (ReputMessageService), so such a unit names a
  record that was written; zeroed bytes or a cut that ends the readable data early look like a torn end
  otherwise.  After an OS crash the queues may run ahead of an unflushed CommitLog, and RocketMQ's recovery
  then truncates them (CommitLog.recoverNormally / recoverAbnormally -> DefaultMessageStore.
  truncateDirtyLogicFiles): the broker has lost those records too, so a state resting on them still rests on
  missing bytes.
* a half / op / discard queue unit with no record of its topic at its CommitLog offset (the consume-queue
  comparison's CQ_MISMATCH "no record", which carries the unit's size as ``length``: :func:`cq_lost`):
  ``[offset, offset + size)`` (``CQ_NO_RECORD``).  ReputMessageService builds every unit from the record it
  dispatched, with that record's topic, offset and size, so the record is no longer readable as what it was
  (a flipped topic byte makes the read drop it as no transaction record).  So is one unit whose record is
  there but was changed after it was written (``reducer._rewritten``): the record fails its body or properties
  CRC (its header, which no CRC covers, is no evidence then), or it has the unit's topic and size but another
  queue id (a unit's queue id is its directory's; damage to a unit moves its offset or size).  A flipped
  queue id makes an op name halves of another queue, and its own half keeps no op.  Not one: a unit below the
  first CommitLog file (retention: EVIDENCE_IN_DELETED_RANGE), an intact record with another queue offset or
  size (a hole in a queue, a garbled unit: the record is read as it was).
* DLEDGER_INDEX_MISMATCH "has no entry in the data files" with a position (txlog_io/dledger_store.py gives
  one only for a unit before the last entry read): an entry DLedger appended and indexed there is gone -- a
  point, like CQ_ENTRY_MISMATCH; indexed mode's only sign of an entry garbled in the middle of the log when no
  transaction queue unit points into it (full mode reports the same bytes as BAD_MAGIC / RESYNC).
* COMMITLOG_HEAD_MISSING (txlog_io/retention.py): the CommitLog before the first file, when consume-queue or
  index files that retention deletes with it are still there -- lost, not retained (``head_lost``: what
  points below the first file is then PREPARED_RECORD_MISSING, not EVIDENCE_IN_DELETED_RANGE).

3.x statetable / redolog damage (``TABLE_KINDS`` findings of those files) is kept per file, in words: the
units are not CommitLog positions, and a flag or state that rests on a unit of a damaged table is uncertain.
A redolog that lost units although its decoder found nothing wrong (cut at a unit boundary, its newest or all
units zeroed) shows in the CommitLog instead: ``RedologGap`` / ``redolog_units_lost``, one fact per broker
over all its evidence (whichever path reduced it), so that every transaction of the broker sees the same
damage.

Not lost ranges: record-level damage at the end of a DLedger log's uncommitted tail (at or past the
DLEDGER_UNCOMMITTED offset, with no whole entry after it: a crash's torn entries, which
DLedgerMmapFileStore.recover truncates at the first entry that does not check).  Damage in that tail that a
whole entry follows is a lost range: a process crash leaves no hole before a later entry (DLedger appends
whole entries in order), and recovery truncates at the hole, later entries included; a file cut short there
(FILE_SIZE_MISMATCH, TRUNCATED_FILE) or missing (FILE_GAP) is a lost range all the same: DLedger maps every data
file at its full size when it creates it, so no crash makes one short, and recover() keeps the whole entries
past the checkpoint's committedIndex, which a one-node group commits again once it leads (what such a cut hides
may well be committed).  The torn end of the written data a crash leaves (TRUNCATED_RECORD: fewer than 8 bytes
of a header; GARBAGE_AFTER_END: bytes after the zero tail): RocketMQ's own recovery drops them too, so the broker
never acts on what they held (the reference broker's crash stores are audited as the broker sees them) --
unless a transaction queue unit points into them (``CQ_PAST_DATA_END`` above).
Record findings whose record was still framed and read (BODY_CRC_MISMATCH, PROPERTY_CRC_MISMATCH,
BAD_PROPERTIES, BAD_BODY_COMPRESSION) lose no record: they are CORRUPT_RECORD on the transaction that owns the
record, not a lost range.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, List, Mapping, Optional, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.evidence import COPY, END, PREP_R, REDO_E, REDO_P, ST
from jobs.reconstruct.groups import Nullable
from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS

#: decoder findings whose bytes were not read as records (ranges of their own)
LOST_KINDS = ("TRUNCATED_FILE", "BAD_MAGIC", "BAD_TOTAL_SIZE", "RESYNC", "PHYSICAL_OFFSET_MISMATCH",
              "FILE_GAP", "COMMITLOG_HEAD_MISSING")
#: an indexed read's finding for a position where no record can be read (a point range, see above)
INDEXED_LOST = "CQ_ENTRY_MISMATCH"
#: a DLedger index unit without its entry (a point range when the finding has a position, see above)
DLEDGER_UNINDEXED = "DLEDGER_INDEX_MISMATCH"
#: lost ranges no crash produces (a file shorter than its mapped size, a file missing): lost even in a DLedger
#: log's uncommitted tail
FILE_LEVEL_KINDS = ("FILE_SIZE_MISMATCH", "TRUNCATED_FILE", "FILE_GAP")
_SOURCES = ("commitlog", "dledger")
#: findings that mark where a CommitLog (or DLedger data) file's readable data ends in a torn tail: their
#: ``data_end`` column (schemas.store.ANOMALIES; txlog_io.commitlog_decode and txlog_io.dledger set it)
TORN_END_KINDS = ("GARBAGE_AFTER_END", "TRUNCATED_RECORD", "TRUNCATED_FILE")
#: the lost range a consume-queue unit past a file's readable data makes (see the module docstring)
PAST_END = "CQ_PAST_DATA_END"
#: the lost range a half / op / discard queue unit without a record of its topic makes (module docstring)
CQ_NO_RECORD = "CQ_NO_RECORD"
#: ``past_end`` argument: the torn ends (sorted CommitLog offsets) -> per torn end ``t`` whose half / op /
#: discard queue units point into ``[t, the first record read at or after t)``: ``(t, the furthest such unit's
#: end, how many)`` -- one row per torn end, whatever the damage (jobs/reconstruct/distributed.py computes it
#: as a Spark aggregation)
PastEnd = Callable[[np.ndarray], List[Tuple[int, int, int]]]
_MIN, _MAX = -(1 << 62), (1 << 62)


@dataclass(frozen=True)
class DamagedRanges:
    """Sorted, disjoint ``[start, end)`` CommitLog ranges and, per range, what damaged it (in words); for a
    3.x store also what damaged its statetable and its redolog ("" when nothing did)."""

    start: np.ndarray
    end: np.ndarray
    what: Tuple[str, ...]
    statetable: str = ""
    redolog: str = ""
    #: the files before the first CommitLog file were lost, not deleted by retention (COMMITLOG_HEAD_MISSING)
    head_lost: bool = False
    #: a DLedger log's uncommitted tail: ``(where it starts, where damage in it stops being a torn end)``
    #: (``damaged_ranges``), so that ranges merged in later are kept or dropped by the same rule
    uncommitted: Optional[Tuple[int, int]] = None

    def __len__(self) -> int:
        return len(self.start)

    def first_overlap(self, lo: Nullable, hi: Nullable) -> np.ndarray:
        """Per window ``(lo, hi)`` (a null bound is open): the index of the first range with ``end > lo`` and
        ``start < hi``, else -1."""
        lo_v = np.where(lo[1], lo[0], _MIN)
        hi_v = np.where(hi[1], hi[0], _MAX)
        if not len(self):
            return np.full(len(lo_v), -1, np.int64)
        k = np.searchsorted(self.end, lo_v, side="right")
        safe = np.minimum(k, len(self) - 1)
        return np.where((k < len(self)) & (self.start[safe] < hi_v), safe, -1).astype(np.int64)


EMPTY = DamagedRanges(np.zeros(0, np.int64), np.zeros(0, np.int64), ())


@dataclass(frozen=True)
class RedologGap:
    """One 3.x broker's transaction records without a redolog unit, against its statetable: ``st_max`` the
    CommitLog offset of the statetable's newest unit, ``lowest`` the smallest offset of a transaction record
    (a PREPARED record, a COMMIT / ROLLBACK record) no redolog unit points at (None: none), ``n`` how many such
    offsets.  Each is a min / max / count over (broker, CommitLog offset) groups, so a Spark aggregation
    (jobs/reconstruct/distributed.py) and :func:`redolog_gap` give the same."""

    st_max: int
    lowest: Optional[int]
    n: int


def redolog_gap(role: np.ndarray, mechanism: np.ndarray, offset: Nullable) -> Optional[RedologGap]:
    """A broker's ``RedologGap`` from its evidence rows (``role``, ``mechanism``, ``physical_offset``); None
    without a statetable unit.  Records: PREPARED_RECORD copies and END rows; units: REDO_P and REDO_E rows
    (a redolog unit's ``physical_offset`` is the CommitLog offset of the record it was appended for)."""
    pv, pok = offset
    st = (role == ST) & pok
    if not st.any():
        return None
    rec = (((role == COPY) & (mechanism == PREP_R)) | (role == END)) & pok
    unit = ((role == REDO_P) | (role == REDO_E)) & pok
    at = np.unique(pv[rec])
    missing = at[~np.isin(at, pv[unit])]
    return RedologGap(int(pv[st].max()), int(missing[0]) if len(missing) else None, int(len(missing)))


def redolog_units_lost(gap: Optional[RedologGap]) -> str:
    """What shows that a 3.x redolog lost units although its decoder found nothing wrong: a transaction record
    without a redolog unit before the record of the statetable's newest unit.  RocketMQ 3.1.4 dispatches
    records one by one in CommitLog order (DefaultMessageStore.DispatchMessageService.doDispatch: the
    statetable unit of a PREPARED record -- TransactionStateService.appendPreparedTransaction --, then the
    redolog unit of every PREPARED, COMMIT and ROLLBACK record -- getTranRedoLog().putMessagePostionInfoWrapper),
    so every record before one with a statetable unit has its redolog unit.  "" when nothing shows it."""
    if gap is None or gap.lowest is None or gap.lowest >= gap.st_max:
        return ""
    return (f"REDOLOG_UNITS_MISSING: {gap.n} transaction record(s) have no redolog unit, the lowest at CommitLog "
            f"offset {gap.lowest}, before the record of the statetable's newest unit ({gap.st_max}); the redolog "
            "is appended for every record in CommitLog order, so its units there are gone")


def with_redolog_gap(damaged: DamagedRanges, gap: Optional[RedologGap]) -> DamagedRanges:
    """``damaged`` with the redolog's lost units (:func:`redolog_units_lost`) when its decoder found none."""
    if damaged.redolog:
        return damaged
    text = redolog_units_lost(gap)
    return replace(damaged, redolog=text) if text else damaged

#: 3.x statetable / redolog findings whose units may be gone: units zeroed before a later unit (RocketMQ's
#: load stops at the zero unit), a file cut, missing or of the wrong length, and a unit with impossible values
#: (BAD_STATETABLE_UNIT / BAD_REDOLOG_UNIT whose expected value is the pointer: the unit is dropped).  Not: a
#: unit kept with an unknown state or end pointer (read, nothing lost), nor the torn end a crash leaves
#: (TRUNCATED_RECORD: 3.x recovery drops it too, as for the CommitLog)
TABLE_KINDS = ("GARBAGE_AFTER_END", "FILE_SIZE_MISMATCH", "FILE_GAP", "TRUNCATED_FILE", "MISSING_FILE")
_BAD_UNIT_KINDS = ("BAD_STATETABLE_UNIT", "BAD_REDOLOG_UNIT")
_POINTER = "commitlog_offset >= 0"


def _table_damage(anomalies: pa.Table, source: str) -> str:
    """What damaged one 3.x table (``source`` statetable or redolog), in words; "" when nothing did."""
    kind = anomalies.column("kind")
    bad_pointer = pc.and_(pc.is_in(kind, pa.array(_BAD_UNIT_KINDS)),
                          pc.starts_with(pc.fill_null(anomalies.column("expected"), ""), _POINTER))
    sel = pc.and_(pc.equal(anomalies.column("source"), source),
                  pc.or_(pc.is_in(kind, pa.array(TABLE_KINDS)), bad_pointer))
    rows = anomalies.filter(pc.fill_null(sel, False)).select(["kind", "physical_offset"]).to_pylist()
    if not rows:
        return ""
    shown = "; ".join(f"{r['kind']} at {source} byte {r['physical_offset']}" for r in rows[:3])
    return shown + (f"; {len(rows) - 3} more" if len(rows) > 3 else "")


def _int(v):
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _torn_end_from(uncommitted: pa.Table, tail: int) -> int:
    """The DLedger log position from which damage in the uncommitted tail is a torn end: one byte past the start
    of the last whole uncommitted message (DLEDGER_UNCOMMITTED's ``physical_offset + length``).  Damage that
    ends before it has a whole entry after it: no process crash leaves that, and DLedgerMmapFileStore.recover
    truncates at the first entry that does not check, so the records there are lost either way.  Without a
    length, the tail's first message (every damaged range in the tail counts as torn)."""
    ends = pc.add(uncommitted.column("physical_offset"), uncommitted.column("length"))
    end = pc.max(ends).as_py() if pc.all(pc.is_valid(ends)).as_py() else None
    return tail if end is None else int(end)


def torn_ends(anomalies: pa.Table) -> np.ndarray:
    """Sorted CommitLog offsets where a file's readable data ends in a torn tail (``TORN_END_KINDS``): the
    finding's ``data_end`` (set by the decoder), its position when a finding carries none."""
    sel = pc.and_(pc.and_(pc.is_in(anomalies.column("source"), pa.array(_SOURCES)),
                          pc.is_in(anomalies.column("kind"), pa.array(TORN_END_KINDS))),
                  pc.is_valid(anomalies.column("physical_offset")))
    torn = anomalies.filter(pc.fill_null(sel, False))
    if not torn.num_rows:
        return np.zeros(0, np.int64)
    ends = torn.column("physical_offset")
    if "data_end" in torn.column_names:
        ends = pc.coalesce(torn.column("data_end"), ends)
    return np.unique(np.asarray(ends.cast(pa.int64())))


def units_past_end(ends: np.ndarray, read_at: np.ndarray, unit_at: np.ndarray,
                   unit_end: np.ndarray) -> List[Tuple[int, int, int]]:
    """Per torn end ``t`` (``ends``) with units pointing into ``[t, the first record read at or after t)`` --
    where the read took nothing --: ``(t, their furthest end, how many)`` (a ``PastEnd`` answer)."""
    found: List[Tuple[int, int, int]] = []
    read_at = np.sort(read_at)
    for t in ends.tolist():
        k = int(np.searchsorted(read_at, t, "left"))
        stop = int(read_at[k]) if k < len(read_at) else _MAX
        sel = (unit_at >= t) & (unit_at < stop)
        if sel.any():
            found.append((int(t), int(unit_end[sel].max()), int(sel.sum())))
    return found


def past_end_ranges(hits: List[Tuple[int, int, int]]) -> List[Tuple[int, int, str]]:
    """``PastEnd`` answers -> lost ranges ``[t, the furthest unit's end)`` with their description."""
    return [(t, max(e, t + 1), f"{PAST_END} [{t}, {e}) ({n} consume-queue unit(s) point at or past where the "
                               f"readable data ends at {t})") for t, e, n in hits]


def past_end_of(records: pa.Table, units: Optional[pa.Table]) -> PastEnd:
    """``PastEnd`` over Arrow tables: ``records`` with ``physical_offset`` (the records read), ``units`` with
    ``topic``, ``commitlog_offset`` and ``size`` (consume-queue units; only the half / op / discard queues'
    count)."""
    def per_torn_end(ends: np.ndarray) -> List[Tuple[int, int, int]]:
        t = int(ends.min())
        phys = records.column("physical_offset")
        read_at = np.asarray(phys.filter(pc.fill_null(pc.greater_equal(phys, t), False)).cast(pa.int64()))
        if units is None or not units.num_rows:
            return []
        off = units.column("commitlog_offset")
        sel = pc.and_(pc.greater_equal(off, t), pc.is_in(units.column("topic"), pa.array(TX_SYSTEM_TOPICS)))
        sel = pc.and_(sel, pc.is_valid(units.column("size")))
        u = units.filter(pc.fill_null(sel, False))
        at = np.asarray(u.column("commitlog_offset").cast(pa.int64()))
        return units_past_end(ends, read_at, at, at + np.maximum(np.asarray(u.column("size").cast(pa.int64())), 1))

    return per_torn_end


def damaged_ranges(anomalies: pa.Table, past_end: Optional[PastEnd] = None) -> DamagedRanges:
    """One broker's decoder findings (schemas.store.ANOMALIES columns) -> its lost CommitLog ranges, merged
    (overlapping or touching ranges become one; their descriptions are joined).  ``past_end`` (see
    ``PastEnd``; called only when a file has a torn end) gives the units and records that make
    ``CQ_PAST_DATA_END`` ranges; without it there are none."""
    if not anomalies.num_rows:
        return EMPTY
    st_damage, redo_damage = _table_damage(anomalies, "statetable"), _table_damage(anomalies, "redolog")
    head_lost = bool(pc.any(pc.equal(anomalies.column("kind"), "COMMITLOG_HEAD_MISSING")).as_py())
    sel = pc.and_(pc.is_in(anomalies.column("source"), pa.array(_SOURCES)),
                  pc.is_valid(anomalies.column("physical_offset")))
    sel = pc.and_(sel, pc.is_in(anomalies.column("kind"), pa.array(LOST_KINDS + ("FILE_SIZE_MISMATCH",
                                                                                 INDEXED_LOST, DLEDGER_UNINDEXED))))
    rows = anomalies.filter(pc.fill_null(sel, False)).select(
        ["kind", "physical_offset", "length", "expected", "actual"]).to_pylist()
    found: List[Tuple[int, int, str]] = []
    for a in rows:                                  # decoder findings: a handful per damaged file
        kind, off, length = a["kind"], a["physical_offset"], a["length"]
        if kind == "FILE_SIZE_MISMATCH":
            expected, actual = _int(a["expected"]), _int(a["actual"])
            if expected is None or actual is None or actual >= expected:
                continue
            found.append((off + actual, off + expected, f"{kind} (file cut at {actual} of {expected} bytes)"))
        elif kind == DLEDGER_UNINDEXED:
            if a["expected"] == "an entry" and a["actual"] == "none":
                found.append((off, off + 1, f"{kind} at {off} (a DLedger index unit names an entry that cannot "
                                            "be read)"))
        elif kind == INDEXED_LOST:
            if a["actual"] != "end of file":
                found.append((off, off + 1, f"{kind} at {off} (an index points to a record that cannot be read)"))
        elif length is not None and length > 0:
            found.append((off, off + length, f"{kind} [{off}, {off + length})"))
        else:
            found.append((off, off + 1, f"{kind} at {off}"))
    if past_end is not None:
        torn = torn_ends(anomalies)
        if len(torn):
            found.extend(past_end_ranges(past_end(torn)))
    # a DLedger log's uncommitted tail (past the checkpoint's committedIndex, DLEDGER_UNCOMMITTED): the torn
    # end a crash leaves there (record-level damage with no whole entry after it) is truncated by DLedger's
    # recovery (and its records are flagged EVIDENCE_NOT_COMMITTED already), so it hides no record the broker
    # acts on; damage with a whole entry after it, and a file cut short or missing, is no process crash's
    # doing and hides records all the same
    is_tail = pc.fill_null(pc.equal(anomalies.column("kind"), "DLEDGER_UNCOMMITTED"), False)
    uncommitted = anomalies.filter(is_tail)
    tail = pc.min(uncommitted.column("physical_offset")).as_py() if uncommitted.num_rows else None
    tail_at = None if tail is None else (int(tail), _torn_end_from(uncommitted, tail))
    found = _outside_torn_tail(found, tail_at)
    if not found:
        if not (st_damage or redo_damage or head_lost or tail_at):
            return EMPTY
        return DamagedRanges(EMPTY.start, EMPTY.end, (), st_damage, redo_damage, head_lost, tail_at)
    starts, ends, what = _merged(found)
    return DamagedRanges(starts, ends, what, st_damage, redo_damage, head_lost, tail_at)


def _outside_torn_tail(found: List[Tuple[int, int, str]],
                       tail_at: Optional[Tuple[int, int]]) -> List[Tuple[int, int, str]]:
    """``found`` without the torn end of a DLedger log's uncommitted tail (``DamagedRanges.uncommitted``);
    a file cut short or missing stays."""
    if tail_at is None:
        return found
    tail, torn_from = tail_at
    return [f for f in found if f[0] < tail or f[1] < torn_from or f[2].startswith(FILE_LEVEL_KINDS)]


def _merged(found: List[Tuple[int, int, str]]) -> Tuple[np.ndarray, np.ndarray, Tuple[str, ...]]:
    """``(start, end, what)`` ranges -> sorted, disjoint ranges: overlapping or touching ones become one, their
    descriptions joined (each once)."""
    starts: List[int] = []
    ends: List[int] = []
    what: List[str] = []
    for s, e, w in sorted(found):
        if starts and s <= ends[-1]:
            ends[-1] = max(ends[-1], e)
            if w not in what[-1]:
                what[-1] = f"{what[-1]}; {w}"
            continue
        starts.append(s)
        ends.append(e)
        what.append(w)
    return np.asarray(starts, np.int64), np.asarray(ends, np.int64), tuple(what)


def cq_lost(findings: Iterable[Mapping]) -> List[Tuple[int, int, str]]:
    """One broker's consume-queue comparison findings (AUDIT_ANOMALIES rows as mappings) -> the lost ranges of
    ``CQ_NO_RECORD``: a CQ_MISMATCH of a half / op / discard queue unit with no record of its topic at its
    CommitLog offset, or whose record there was changed after it was written, which the comparison reports with
    the unit's size as ``length`` (module docstring)."""
    found = []
    for f in findings:
        off, length = f.get("physical_offset"), f.get("length")
        if (f.get("code") == "CQ_MISMATCH" and off is not None and length is not None
                and f.get("topic") in TX_SYSTEM_TOPICS):
            end = off + max(int(length), 1)
            found.append((int(off), end, f"{CQ_NO_RECORD} [{off}, {end}) (a {f['topic']} unit names a record "
                                         "the CommitLog no longer holds there as it was written)"))
    return found


def with_lost(damaged: DamagedRanges, found: List[Tuple[int, int, str]]) -> DamagedRanges:
    """``damaged`` with the ranges ``found`` (``(start, end, what)``) merged in (as ``damaged_ranges`` merges
    its own): the same result whichever path collected them, in whatever order."""
    found = _outside_torn_tail(found, damaged.uncommitted)
    if not found:
        return damaged
    mine = list(zip(damaged.start.tolist(), damaged.end.tolist(), damaged.what, strict=True))
    starts, ends, what = _merged(mine + found)
    return replace(damaged, start=starts, end=ends, what=what)


__all__ = ["DamagedRanges", "EMPTY", "RedologGap", "redolog_gap", "redolog_units_lost", "with_redolog_gap", "LOST_KINDS", "PAST_END", "PastEnd", "TABLE_KINDS", "damaged_ranges",
           "past_end_of", "past_end_ranges", "torn_ends", "units_past_end", "cq_lost", "with_lost", "CQ_NO_RECORD"]
