"""ConsumeQueue units (+ CQ ext), and the RocketMQ 3.x transaction statetable and redolog: decode to Arrow, encode.

Sources (RocketMQ 5.3.3 / 4.9.7 unless noted; the 20-byte unit is identical in 3.1.4):
  store/src/main/java/org/apache/rocketmq/store/ConsumeQueue.java      putMessagePositionInfo, fillPreBlank, recover
  store/src/main/java/org/apache/rocketmq/store/ConsumeQueueExt.java   CqExtUnit.read/write, put, fullFillToEnd, recover
  3.1.4 rocketmq-store/src/main/java/com/alibaba/rocketmq/store/transaction/TransactionStateService.java
        (statetable append/update, the redolog is a ConsumeQueue named TRANSACTION_REDOLOG_TOPIC_XXXX/0)

Layouts, big-endian (offsets come from the numpy dtypes below, never typed in by hand):

  ConsumeQueue unit = redolog unit (20 B)      statetable unit (24 B)
     0  int64 CommitLog offset                    0  int64 CommitLog offset of the PREPARED record
     8  int32 record size (TOTALSIZE)             8  int32 record size
    12  int64 tagsCode                           12  int32 store timestamp, epoch SECONDS
                                                 16  int32 PGROUP String.hashCode()
                                                 20  int32 state: 4 PREPARED, 8 COMMIT, 12 ROLLBACK

  CQ ext unit (variable, consumequeue_ext/{topic}/{queueId}/):
     0  int16 size (= 20 + bitmap length)    2  int64 tagsCode    10  int64 msgStoreTime
    18  int16 bitMapSize                    20  bitmap bytes
  An int16 of -1 ends a full ext file (fullFillToEnd); an int16 of 0 is unwritten space.
  A CQ tagsCode <= Integer.MIN_VALUE - 1 is an ext address: real ext byte offset = tagsCode - Long.MIN_VALUE.

  redolog tagsCode: -1 for a PREPARED record; for a COMMIT/ROLLBACK record the PREPARED record's CommitLog offset.

Decoding rules shared by the three fixed-unit formats (file position p is always a multiple of the unit size):
  * all-zero unit: not written yet.  RocketMQ's recovery stops at the first one; when only zeros follow, the file
    simply ends there.  A non-zero unit that follows a zero unit (a hole: e.g. pages flushed out of order before a
    machine crash) is decoded like any other unit but reported as GARBAGE_AFTER_END at its position, because RocketMQ
    would never serve it.  One anomaly per hole (= per non-zero unit whose predecessor is all-zero).
  * pre-blank unit (offset 0, size 0x7FFFFFFF, tagsCode 0, fillPreBlank): padding before a queue's first real unit;
    skipped silently (ConsumeQueue and redolog).
  * offset < 0 or size <= 0 (other than all-zero): RocketMQ's recovery truncates there; we report BAD_CQ_ENTRY /
    BAD_STATETABLE_UNIT / BAD_REDOLOG_UNIT, emit no row for it, and keep going.
  * a trailing partial unit (file length not a multiple of the unit) is reported as TRUNCATED_RECORD.
  * range [start, end) of file positions owns the units whose start position lies in it, so ranges that partition
    the file decode every unit exactly once (anomalies are owned the same way).
  * files are read in bounded chunks (read-only, readinto a reused buffer); nothing is sized from file contents.
File-name checks (20-digit name, alignment, sizes, gaps) belong to txlog_io.mappedfile, not to these decoders.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from schemas import store as store_schemas
from txlog_io import readstats
from txlog_io.errors import (
    Anomaly,
    AnomalyKind,
    EncodeError,
    StoreNotFoundError,
    UnreadableFileError,
    UsageError,
)
from txlog_io.positional import input_next_data, input_next_hole, input_pread, input_size, open_input

# ---------------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------------

CQ_UNIT_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
STATETABLE_UNIT_DTYPE = np.dtype([("commitlog_offset", ">i8"), ("size", ">i4"), ("store_timestamp_s", ">i4"),
                                  ("producer_group_hash", ">i4"), ("state", ">i4")])
REDOLOG_UNIT_DTYPE = CQ_UNIT_DTYPE  # TranRedoLog is a ConsumeQueue instance

CQ_UNIT_SIZE = CQ_UNIT_DTYPE.itemsize                  # ConsumeQueue.CQ_STORE_UNIT_SIZE = 20
STATETABLE_UNIT_SIZE = STATETABLE_UNIT_DTYPE.itemsize  # TransactionStateService.TSStoreUnitSize = 24
REDOLOG_UNIT_SIZE = REDOLOG_UNIT_DTYPE.itemsize
assert STATETABLE_UNIT_DTYPE.fields is not None  # structured (numpy types fields as Optional)
STATETABLE_STATE_POS = STATETABLE_UNIT_DTYPE.fields["state"][1]  # TS_STATE_POS = 20: the only int ever rewritten

PRE_BLANK_SIZE = 0x7FFFFFFF  # Integer.MAX_VALUE, ConsumeQueue.fillPreBlank
REDOLOG_PREPARED_TAGS_CODE = -1  # TransactionStateService.PreparedMessageTagsCode

STATE_PREPARED, STATE_COMMIT, STATE_ROLLBACK = 4, 8, 12  # MessageSysFlag.TRANSACTION_*_TYPE
STATE_NAMES = {STATE_PREPARED: "PREPARED", STATE_COMMIT: "COMMIT", STATE_ROLLBACK: "ROLLBACK"}
_STATE_BY_NAME = {v: k for k, v in STATE_NAMES.items()}

# CQ ext (ConsumeQueueExt / CqExtUnit)
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT16_MAX = (1 << 15) - 1
CQ_EXT_MAX_ADDR = _INT32_MIN - 1                       # MAX_ADDR = Integer.MIN_VALUE - 1L
CQ_EXT_MAX_REAL_OFFSET = CQ_EXT_MAX_ADDR - _INT64_MIN  # MAX_REAL_OFFSET
CQ_EXT_UNIT_HEADER = struct.Struct(">hqqh")            # size, tagsCode, msgStoreTime, bitMapSize
CQ_EXT_MIN_UNIT_SIZE = CQ_EXT_UNIT_HEADER.size         # CqExtUnit.MIN_EXT_UNIT_SIZE = 20
CQ_EXT_MAX_UNIT_SIZE = _INT16_MAX                      # CqExtUnit.MAX_EXT_UNIT_SIZE = Short.MAX_VALUE
CQ_EXT_END_MARKER = struct.pack(">h", -1)              # written by fullFillToEnd
CQ_EXT_END_BLANK_DATA_LENGTH = 4                       # room put() always leaves for the end marker
_INT16 = struct.Struct(">h")

# Chunk size for the fixed-unit decoders: 2^18 units = 5 MiB of CQ units per read; also bounds the per-batch
# memory of the constant string columns.  A default 6,000,000-byte CQ file is 2 chunks.
DEFAULT_CHUNK_UNITS = 1 << 18

_CQ_SCHEMA = store_schemas.CONSUMEQUEUE.arrow_schema()
_STATETABLE_SCHEMA = store_schemas.STATETABLE.arrow_schema()
_REDOLOG_SCHEMA = store_schemas.REDOLOG.arrow_schema()

_STRUCT_CODES = {"i8": "q", "i4": "i", "i2": "h"}


def _struct_of(dtype: np.dtype) -> struct.Struct:
    """The struct.Struct twin of a big-endian structured dtype, so scalar and vector code share one layout."""
    codes = []
    for name in dtype.names or ():
        field_dtype = dtype[name]
        codes.append(_STRUCT_CODES[field_dtype.str[1:]])
    packed = struct.Struct(">" + "".join(codes))
    if packed.size != dtype.itemsize:  # a padded dtype would silently shift every field
        raise ImportError(f"layout mismatch: struct {packed.format} is {packed.size} B, dtype {dtype.itemsize} B")
    return packed


_CQ_STRUCT = _struct_of(CQ_UNIT_DTYPE)
_STATETABLE_STRUCT = _struct_of(STATETABLE_UNIT_DTYPE)


# ---------------------------------------------------------------------------------------------------------------
# Shared fixed-unit scanning
# ---------------------------------------------------------------------------------------------------------------

def _open_read_only(path):
    try:
        return open_input(path)
    except FileNotFoundError:
        raise StoreNotFoundError(str(path), "file") from None
    except IsADirectoryError:
        raise UnreadableFileError(str(path), "is a directory") from None
    except OSError as e:
        raise UnreadableFileError(str(path), e.strerror or str(e)) from None


def base_offset_from_name(path) -> int:
    """The 20-digit file name as an int (UtilAll.offset2FileName inverse); UsageError for any other name."""
    name = Path(path).name
    if len(name) != 20 or not name.isdigit() or not name.isascii():
        raise UsageError(f"{path}: file name is not a 20-digit offset; pass base_offset explicitly")
    return int(name)


@dataclass
class _UnitChunk:
    units: np.ndarray       # structured big-endian view over the read buffer (valid until the next chunk is read)
    positions: np.ndarray   # int64 file position of each unit
    zero: np.ndarray        # bool: every byte of the unit is zero
    anomalies: list         # structural findings owned by this chunk (holes, trailing partial unit)


def _scan_units(path, dtype: np.dtype, *, base_offset: int, start: int, end: Optional[int], chunk_units: int,
                source: str) -> Iterator[_UnitChunk]:
    """Read the units of [start, end) in chunks and find the structure every fixed-unit format shares."""
    if start < 0:
        raise UsageError(f"{path}: range start must be >= 0, got {start}")
    if end is not None and end < start:
        raise UsageError(f"{path}: range end {end} is before start {start}")
    if chunk_units < 1:
        raise UsageError(f"chunk_units must be >= 1, got {chunk_units}")
    unit = dtype.itemsize
    file_str = str(path)
    with _open_read_only(path) as f:
        file_size = input_size(f)
        stop = file_size if end is None else min(end, file_size)
        first = -(-start // unit) * unit
        complete_end = (file_size // unit) * unit          # position just after the last complete unit
        last_excl = min(-(-stop // unit) * unit, complete_end)

        # Whether the unit just before this range is all-zero, so a hole spanning a range boundary is still
        # reported exactly once (by the range owning the first non-zero unit after it).
        previous_zero = False
        if 0 < first <= complete_end:
            f.seek(first - unit)
            previous_zero = not any(f.read(unit))
            readstats.add(unit, source)

        buffer = bytearray(min(chunk_units, max((last_excl - first) // unit, 0)) * unit)
        position = first
        while position < last_excl:
            # whole units inside a file hole (the preallocated file's unwritten tail) are all-zero: skipped
            # unread, as if read (no row, no finding; the unit before the next data is zero)
            hole_end = min(last_excl, input_next_data(f, position, file_size) // unit * unit)
            if hole_end > position:
                previous_zero, position = True, hole_end
                continue
            # ... and a chunk stops where the next hole starts (the units up to it, the last one whole)
            hole = input_next_hole(f, position, file_size)
            count = min(chunk_units, (last_excl - position) // unit, max(1, -(-(hole - position) // unit)))
            view = memoryview(buffer)[:count * unit]
            f.seek(position)
            got = f.readinto(view)
            readstats.add(got or 0, source)
            if got != count * unit:  # the file shrank while we read it
                count = got // unit
                if count == 0:
                    break
            raw = np.frombuffer(buffer, dtype=np.uint8, count=count * unit).reshape(count, unit)
            units = np.frombuffer(buffer, dtype=dtype, count=count)
            zero = ~np.any(raw, axis=1)
            positions = position + np.arange(count, dtype=np.int64) * unit
            previous = np.empty(count, dtype=bool)
            previous[0] = previous_zero
            previous[1:] = zero[:-1]
            anomalies = []
            for i in np.flatnonzero(~zero & previous):
                pos = int(positions[i])
                anomalies.append(Anomaly(
                    kind=AnomalyKind.GARBAGE_AFTER_END, file=file_str, position=pos,
                    detail=f"non-zero unit after an all-zero unit at {pos - unit}; RocketMQ's recovery stops at the "
                           "zero unit and would not serve this one",
                    expected="all-zero unit", actual=units[i:i + 1].tobytes().hex(),
                    source=source, physical_offset=base_offset + pos, length=unit))
            previous_zero = bool(zero[-1])
            yield _UnitChunk(units=units, positions=positions, zero=zero, anomalies=anomalies)
            position += count * unit

        if file_size % unit and first <= complete_end < stop:
            f.seek(complete_end)
            tail = f.read(unit)
            readstats.add(len(tail), source)
            state = "non-zero" if any(tail) else "all zero"
            yield _UnitChunk(units=np.empty(0, dtype=dtype), positions=np.empty(0, dtype=np.int64),
                             zero=np.empty(0, dtype=bool), anomalies=[Anomaly(
                                 kind=AnomalyKind.TRUNCATED_RECORD, file=file_str, position=complete_end,
                                 detail=f"file ends {len(tail)} bytes into a {unit}-byte unit ({state})",
                                 expected=f"{unit} bytes", actual=f"{len(tail)} bytes", source=source,
                                 physical_offset=base_offset + complete_end, length=len(tail))])


def _constant_string(value: str, n: int) -> pa.Array:
    """An n-row string column holding one value, built from buffers (no n-element Python list)."""
    encoded = value.encode("utf-8")
    if len(encoded) * n > _INT32_MAX:  # pa.string() offsets are int32
        return pa.array([value] * n, pa.string())
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(encoded))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(encoded * n)])


def _unit_anomaly(kind: str, file_str: str, source: str, base_offset: int, pos: int, detail: str, expected: str,
                  actual: str, length: int) -> Anomaly:
    """A finding about the one unit at ``pos`` (``length``: the unit size of its kind of file)."""
    return Anomaly(kind=kind, file=file_str, position=pos, detail=detail, expected=expected, actual=actual,
                   source=source, physical_offset=base_offset + pos, length=length)


def _by_position(anomaly: Anomaly) -> int:
    return anomaly.position


def _resolve_base(path, base_offset: Optional[int]) -> int:
    if base_offset is None:
        return base_offset_from_name(path)
    if isinstance(base_offset, bool) or not isinstance(base_offset, (int, np.integer)) or base_offset < 0:
        raise UsageError(f"{path}: base_offset must be a non-negative int, got {base_offset!r}")
    return int(base_offset)


def collect(pairs: Iterable[tuple], schema: pa.Schema) -> tuple:
    """Drain a decoder's (batch, anomalies) pairs into one pa.Table (with `schema`) and one anomaly list."""
    batches, anomalies = [], []
    for batch, found in pairs:
        if batch.num_rows:
            batches.append(batch)
        anomalies.extend(found)
    return pa.Table.from_batches(batches, schema=schema), anomalies


# ---------------------------------------------------------------------------------------------------------------
# ConsumeQueue
# ---------------------------------------------------------------------------------------------------------------

def decode_consumequeue(path, *, topic: str, queue_id: int, base_offset: Optional[int] = None, start: int = 0,
                        end: Optional[int] = None, chunk_units: int = DEFAULT_CHUNK_UNITS, rows: bool = True
                        ) -> Iterator[tuple]:
    """Yield (RecordBatch with schemas.CONSUMEQUEUE, anomalies) for the units of one ConsumeQueue file.

    base_offset defaults to the 20-digit file name (a logical byte offset); queue_offset = (base_offset + pos) / 20.
    Only chunks with rows or anomalies are yielded.  ``rows=False``: the same findings, with empty batches
    (for a queue decoded for its findings only, the rows are most of the cost: two constant string columns
    per unit, ~1 s of 1.5 s for 6 M units).
    """
    base = _resolve_base(path, base_offset)
    file_str, source = str(path), "consumequeue"
    for chunk in _scan_units(path, CQ_UNIT_DTYPE, base_offset=base, start=start, end=end, chunk_units=chunk_units,
                             source=source):
        anomalies = list(chunk.anomalies)
        offsets = chunk.units["commitlog_offset"].astype(np.int64)
        sizes = chunk.units["size"].astype(np.int32)
        tags = chunk.units["tags_code"].astype(np.int64)
        pre_blank = (offsets == 0) & (sizes == PRE_BLANK_SIZE) & (tags == 0)
        bad = ~chunk.zero & ~pre_blank & ((offsets < 0) | (sizes <= 0))
        for i in np.flatnonzero(bad):
            anomalies.append(_unit_anomaly(
                AnomalyKind.BAD_CQ_ENTRY, file_str, source, base, int(chunk.positions[i]),
                f"unit with impossible values (queue offset {(base + int(chunk.positions[i])) // CQ_UNIT_SIZE}); "
                "RocketMQ's recovery truncates the queue here",
                "commitlog_offset >= 0 and size > 0",
                f"commitlog_offset={int(offsets[i])} size={int(sizes[i])} tags_code={int(tags[i])}",
                CQ_UNIT_SIZE))
        keep = ~chunk.zero & ~pre_blank & ~bad
        n = int(keep.sum()) if rows else 0
        if n == 0 and not anomalies:
            continue
        anomalies.sort(key=_by_position)  # file order, whatever check found them
        if not rows:
            yield pa.RecordBatch.from_pylist([], schema=_CQ_SCHEMA), anomalies
            continue
        positions = chunk.positions[keep]
        batch = pa.RecordBatch.from_arrays([
            _constant_string(file_str, n),
            pa.array(positions, pa.int64()),
            _constant_string(topic, n),
            pa.array(np.full(n, queue_id, dtype=np.int32), pa.int32()),
            pa.array((base + positions) // CQ_UNIT_SIZE, pa.int64()),
            pa.array(offsets[keep], pa.int64()),
            pa.array(sizes[keep], pa.int32()),
            pa.array(tags[keep], pa.int64()),
        ], schema=_CQ_SCHEMA)
        yield batch, anomalies


def iter_consumequeue_dicts(path, *, topic: str, queue_id: int, base_offset: Optional[int] = None, start: int = 0,
                            end: Optional[int] = None, anomalies: Optional[list] = None) -> Iterator[dict]:
    """Units as plain dicts with the public JSON names; anomalies are appended to `anomalies` when given."""
    for batch, found in decode_consumequeue(path, topic=topic, queue_id=queue_id, base_offset=base_offset,
                                            start=start, end=end):
        if anomalies is not None:
            anomalies.extend(found)
        for row in batch.to_pylist():
            yield {"file": row["file"], "topic": row["topic"], "queue_id": row["queue_id"],
                   "queue_offset": row["queue_offset"], "commitlog_offset": row["commitlog_offset"],
                   "size": row["size"], "tags_code": row["tags_code"]}


def last_unit_end(path, block_bytes: int = 64 * 1024) -> Optional[int]:
    """CommitLog offset just past the record of the newest real unit of a ConsumeQueue file (:func:`last_unit`),
    or None."""
    last = last_unit(path, block_bytes)
    return None if last is None else last[1] + last[2]


def last_unit(path, block_bytes: int = 64 * 1024) -> Optional[Tuple[int, int, int]]:
    """(unit index in the file, CommitLog offset, size) of the newest real unit of a ConsumeQueue file, reading
    backwards from the end of the file (files are preallocated and zero-filled: the data ends at the last
    non-zero unit), so finding a queue's dispatch point costs a block, not the whole queue.  None when the file
    holds no plausible unit (empty, only pre-blank units, or a last unit with impossible values: the caller then
    knows less, never more).

    Where the zero-filled tail starts is found by bisection on single units first (~20 reads of 20 bytes
    instead of reading megabytes of zeros backwards): units are written from the start, so a unit is zero
    only after the last one written.  A zero hole inside the data can only move the answer earlier (the
    caller then scans a longer tail), never later."""
    unit = CQ_UNIT_DTYPE.itemsize
    with _open_read_only(path) as fh:
        size = input_size(fh)
        lo, hi = 0, size // unit            # the first all-zero unit lies in [lo, hi]
        while lo < hi:
            mid = (lo + hi) // 2
            raw = input_pread(fh, unit, mid * unit)
            readstats.add(len(raw), "consumequeue")
            if any(raw):
                lo = mid + 1
            else:
                hi = mid
        end = lo * unit
        while end > 0:
            start = max(0, end - max(unit, block_bytes - block_bytes % unit))
            fh.seek(start)
            raw = fh.read(end - start)
            readstats.add(len(raw), "consumequeue")
            units = np.frombuffer(raw, dtype=CQ_UNIT_DTYPE)
            real = _real_units(units)
            if real.size:
                return _plausible(units, real[-1], start // unit)
            end = start
    return None


def first_unit(path, block_bytes: int = 4096) -> Optional[Tuple[int, int, int]]:
    """(unit index in the file, CommitLog offset, size) of the oldest real unit of a ConsumeQueue file (pre-blank
    and all-zero units skipped), reading its first unit, then ``block_bytes`` at a time; None as for
    :func:`last_unit`."""
    unit = CQ_UNIT_DTYPE.itemsize
    step = max(unit, block_bytes - block_bytes % unit)
    with _open_read_only(path) as fh:
        size = input_size(fh) // unit * unit
        starts = [0, *range(unit, size, step)]          # a queue's oldest file mostly starts with a real unit
        for start, stop in zip(starts, [*starts[1:], size], strict=True):
            raw = input_pread(fh, stop - start, start)
            readstats.add(len(raw), "consumequeue")
            units = np.frombuffer(raw, dtype=CQ_UNIT_DTYPE)
            real = _real_units(units)
            if real.size:
                return _plausible(units, real[0], start // unit)
    return None


def _real_units(units: np.ndarray) -> np.ndarray:
    real = np.flatnonzero((units["commitlog_offset"] != 0) | (units["size"] != 0) | (units["tags_code"] != 0))
    return real[units["size"][real] != PRE_BLANK_SIZE]


def _plausible(units: np.ndarray, i: int, first_index: int) -> Optional[Tuple[int, int, int]]:
    offset, length = int(units[i]["commitlog_offset"]), int(units[i]["size"])
    return (first_index + int(i), offset, length) if offset >= 0 and length > 0 else None


def _check_range(field: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise EncodeError(field, "an int", value)
    if not low <= int(value) <= high:
        raise EncodeError(field, f"{low}..{high}", value)
    return int(value)


def encode_cq_unit(commitlog_offset: int, size: int, tags_code: int, *, allow_invalid: bool = False) -> bytes:
    """One 20-byte ConsumeQueue unit.  Unless allow_invalid, refuses units RocketMQ never writes (offset < 0,
    size <= 0) so that a reference broker cannot produce them by accident; damage tests pass allow_invalid=True."""
    offset = _check_range("commitlog_offset", commitlog_offset, _INT64_MIN, _INT64_MAX)
    size = _check_range("size", size, _INT32_MIN, _INT32_MAX)
    tags = _check_range("tags_code", tags_code, _INT64_MIN, _INT64_MAX)
    if not allow_invalid and (offset < 0 or size <= 0):
        raise EncodeError("consume queue unit", "commitlog_offset >= 0 and size > 0", (offset, size))
    return _CQ_STRUCT.pack(offset, size, tags)


def encode_pre_blank() -> bytes:
    """The unit fillPreBlank writes before a queue's first real unit when the queue starts at a non-zero offset."""
    return _CQ_STRUCT.pack(0, PRE_BLANK_SIZE, 0)


def _int_column(arrays, name: str, low: int, high: int) -> np.ndarray:
    try:
        values = arrays[name]
    except (KeyError, TypeError, IndexError):
        raise EncodeError(name, f"a column named {name}", type(arrays).__name__) from None
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if values.null_count:
            raise EncodeError(name, "no nulls", f"{values.null_count} nulls")
        values = values.to_numpy()
    try:
        column = np.asarray(values)
    except OverflowError:
        raise EncodeError(name, f"{low}..{high}", "a value outside int64") from None
    if column.size and column.dtype.kind not in "iu":
        raise EncodeError(name, "integers", column.dtype)
    if column.size and (int(column.min()) < low or int(column.max()) > high):
        raise EncodeError(name, f"{low}..{high}", f"{column.min()}..{column.max()}")
    return column.astype(np.int64)


def encode_cq_units(arrays, *, allow_invalid: bool = False) -> bytes:
    """Vectorised encode_cq_unit: `arrays` maps commitlog_offset, size, tags_code to equal-length integer arrays
    (a dict of numpy arrays, or a decoded CONSUMEQUEUE RecordBatch / Table)."""
    offsets = _int_column(arrays, "commitlog_offset", _INT64_MIN, _INT64_MAX)
    sizes = _int_column(arrays, "size", _INT32_MIN, _INT32_MAX)
    tags = _int_column(arrays, "tags_code", _INT64_MIN, _INT64_MAX)
    if not (len(offsets) == len(sizes) == len(tags)):
        raise EncodeError("arrays", "equal lengths", (len(offsets), len(sizes), len(tags)))
    if not allow_invalid and len(offsets) and (offsets.min() < 0 or sizes.min() <= 0):
        raise EncodeError("consume queue units", "commitlog_offset >= 0 and size > 0",
                          f"min offset {offsets.min()}, min size {sizes.min()}")
    out = np.empty(len(offsets), dtype=CQ_UNIT_DTYPE)
    out["commitlog_offset"] = offsets
    out["size"] = sizes
    out["tags_code"] = tags
    return out.tobytes()


# ---------------------------------------------------------------------------------------------------------------
# CQ ext
# ---------------------------------------------------------------------------------------------------------------

def is_ext_address(tags_code):
    """ConsumeQueueExt.isExtAddr: tagsCode <= Integer.MIN_VALUE - 1.  Works on ints and numpy arrays."""
    return tags_code <= CQ_EXT_MAX_ADDR


def ext_offset(tags_code: int) -> int:
    """ConsumeQueueExt.unDecorate: the real byte offset in the ext file queue (tagsCode - Long.MIN_VALUE)."""
    if isinstance(tags_code, bool) or not isinstance(tags_code, (int, np.integer)) or not is_ext_address(tags_code):
        raise UsageError(f"tagsCode {tags_code!r} is not a CQ ext address (must be <= {CQ_EXT_MAX_ADDR})")
    return int(tags_code) - _INT64_MIN


def ext_address(real_offset: int) -> int:
    """ConsumeQueueExt.decorate: the tagsCode a ConsumeQueue unit stores for an ext unit at `real_offset`."""
    offset = _check_range("ext offset", real_offset, 0, CQ_EXT_MAX_REAL_OFFSET)
    return offset + _INT64_MIN


@dataclass(frozen=True)
class CqExtUnit:
    file: str
    file_position: int
    address: int          # decorated address, i.e. what the ConsumeQueue unit's tagsCode holds
    size: int
    tags_code: int
    msg_store_time: int
    filter_bitmap: bytes


def encode_cq_ext_unit(tags_code: int, msg_store_time: int, filter_bitmap: bytes = b"") -> bytes:
    """CqExtUnit.write: int16 size, int64 tagsCode, int64 msgStoreTime, int16 bitMapSize, bitmap."""
    tags = _check_range("tags_code", tags_code, _INT64_MIN, _INT64_MAX)
    store_time = _check_range("msg_store_time", msg_store_time, _INT64_MIN, _INT64_MAX)
    bitmap = bytes(filter_bitmap or b"")
    size = CQ_EXT_MIN_UNIT_SIZE + len(bitmap)
    if size > CQ_EXT_MAX_UNIT_SIZE:
        raise EncodeError("filter_bitmap", f"at most {CQ_EXT_MAX_UNIT_SIZE - CQ_EXT_MIN_UNIT_SIZE} bytes",
                          f"{len(bitmap)} bytes")
    return CQ_EXT_UNIT_HEADER.pack(size, tags, store_time, len(bitmap)) + bitmap


def encode_cq_ext_end_marker() -> bytes:
    """What fullFillToEnd writes where the next unit does not fit (the rest of the file stays zero)."""
    return CQ_EXT_END_MARKER


def _cq_ext_unit_at(buf, pos: int, limit: int, file_str: str, base: int, source: str):
    """Decode the ext unit at pos: returns (unit | None, next_pos | None, anomaly | None).  next_pos None = stop."""
    if pos + 2 > limit:
        if pos < limit and any(buf[pos:limit]):
            return None, None, Anomaly(AnomalyKind.TRUNCATED_RECORD, file_str, pos,
                                       "file ends inside an ext unit's size field", "2 bytes",
                                       f"{limit - pos} bytes", source, base + pos, limit - pos)
        return None, None, None
    (size,) = _INT16.unpack_from(buf, pos)
    if size == 0 or size == -1:
        return None, None, None  # unwritten space / end-of-full-file marker: callers check what follows
    if size < CQ_EXT_MIN_UNIT_SIZE:
        return None, None, Anomaly(AnomalyKind.BAD_CQ_EXT_UNIT, file_str, pos,
                                   "impossible ext unit size; cannot find the next unit", f">= {CQ_EXT_MIN_UNIT_SIZE}",
                                   str(size), source, base + pos, limit - pos)
    if pos + size > limit:
        return None, None, Anomaly(AnomalyKind.TRUNCATED_RECORD, file_str, pos,
                                   "ext unit runs past the end of the file", f"{size} bytes",
                                   f"{limit - pos} bytes", source, base + pos, limit - pos)
    _, tags, store_time, bitmap_size = CQ_EXT_UNIT_HEADER.unpack_from(buf, pos)
    if max(bitmap_size, 0) + CQ_EXT_MIN_UNIT_SIZE != size:
        # RocketMQ's recovery steps over `size` bytes regardless, so do we.
        return None, pos + size, Anomaly(AnomalyKind.BAD_CQ_EXT_UNIT, file_str, pos,
                                         "ext unit size disagrees with its bitmap size",
                                         f"size = 20 + bitMapSize ({CQ_EXT_MIN_UNIT_SIZE + max(bitmap_size, 0)})",
                                         str(size), source, base + pos, size)
    bitmap = bytes(buf[pos + CQ_EXT_MIN_UNIT_SIZE:pos + size])
    unit = CqExtUnit(file=file_str, file_position=pos, address=ext_address(base + pos), size=size, tags_code=tags,
                     msg_store_time=store_time, filter_bitmap=bitmap)
    return unit, pos + size, None


def _first_nonzero(buf, begin: int, end: int) -> Optional[int]:
    step = 1 << 20
    for chunk_start in range(begin, end, step):
        chunk = np.frombuffer(buf, dtype=np.uint8, count=min(step, end - chunk_start), offset=chunk_start)
        hits = np.flatnonzero(chunk)
        if hits.size:
            return chunk_start + int(hits[0])
    return None


def iter_cq_ext_units(path, *, base_offset: Optional[int] = None, anomalies: Optional[list] = None
                      ) -> Iterator[CqExtUnit]:
    """Walk one consumequeue_ext file like ConsumeQueueExt.recover: units back to back until a 0 or -1 size.

    Variable-length units cannot be resynchronised, so an impossible size ends the walk (with an anomaly).
    Non-zero bytes after the end are reported as GARBAGE_AFTER_END.  Uses a read-only mmap.
    """
    base = _resolve_base(path, base_offset)
    file_str, source = str(path), "consumequeue_ext"
    found = anomalies if anomalies is not None else []
    with _open_read_only(path) as f:
        limit = input_size(f)
        if limit == 0:
            return
        # a remote file (no mmap) is read whole: ext files are a few MiB
        with (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if hasattr(f, "fileno")
              else memoryview(f.read_all())) as buf:
            pos = 0
            while True:
                unit, next_pos, anomaly = _cq_ext_unit_at(buf, pos, limit, file_str, base, source)
                if anomaly is not None:
                    found.append(anomaly)
                if unit is not None:
                    yield unit
                if next_pos is None:
                    break
                pos = next_pos
            if pos + 2 <= limit:
                (size,) = _INT16.unpack_from(buf, pos)
                after = pos + 2 if size == -1 else pos
                if size in (0, -1):
                    garbage = _first_nonzero(buf, after, limit)
                    if garbage is not None:
                        found.append(Anomaly(AnomalyKind.GARBAGE_AFTER_END, file_str, garbage,
                                             f"non-zero bytes after the end of ext data at {pos}", "zero bytes",
                                             f"0x{buf[garbage]:02x}", source, base + garbage, limit - garbage))


def read_cq_ext_unit(files: Sequence, tags_code: int) -> Optional[CqExtUnit]:
    """ConsumeQueueExt.get: the ext unit a ConsumeQueue tagsCode points at, or None if no file holds it.

    `files` are txlog_io.mappedfile.MappedFile entries (anything with path, base_offset, size) of one queue.
    """
    real = ext_offset(tags_code)
    for mf in files:
        if mf.base_offset <= real < mf.base_offset + mf.size:
            pos = real - mf.base_offset
            with _open_read_only(mf.path) as f:
                f.seek(pos)
                head = f.read(CQ_EXT_MIN_UNIT_SIZE)
                readstats.add(len(head), "consumequeue_ext")
                if len(head) < 2:
                    return None
                (size,) = _INT16.unpack_from(head, 0)
                if size < CQ_EXT_MIN_UNIT_SIZE:
                    return None
                f.seek(pos)
                raw = f.read(size)
                readstats.add(len(raw), "consumequeue_ext")
            unit, _, anomaly = _cq_ext_unit_at(raw, 0, len(raw), str(mf.path), mf.base_offset + pos,
                                               "consumequeue_ext")
            if unit is None or anomaly is not None:
                return None
            return CqExtUnit(file=str(mf.path), file_position=pos, address=int(tags_code), size=unit.size,
                             tags_code=unit.tags_code, msg_store_time=unit.msg_store_time,
                             filter_bitmap=unit.filter_bitmap)
    return None


# ---------------------------------------------------------------------------------------------------------------
# 3.x statetable
# ---------------------------------------------------------------------------------------------------------------

def state_name(state: int) -> str:
    return STATE_NAMES.get(int(state), f"UNKNOWN({int(state)})")


def decode_statetable(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                      chunk_units: int = DEFAULT_CHUNK_UNITS) -> Iterator[tuple]:
    """Yield (RecordBatch with schemas.STATETABLE, anomalies); index = (base_offset + pos) / 24.

    Valid-unit test of 3.1.4's recovery: offset >= 0, size > 0, state in {4, 8, 12}.  A unit with a bad pointer is
    reported and dropped; a unit with a good pointer but another state is kept as UNKNOWN(n) and reported, because
    its index still names a tranStateTableOffset a producer may have been given.
    """
    base = _resolve_base(path, base_offset)
    file_str, source = str(path), "statetable"
    for chunk in _scan_units(path, STATETABLE_UNIT_DTYPE, base_offset=base, start=start, end=end,
                             chunk_units=chunk_units, source=source):
        anomalies = list(chunk.anomalies)
        units = chunk.units
        offsets = units["commitlog_offset"].astype(np.int64)
        sizes = units["size"].astype(np.int32)
        states = units["state"].astype(np.int32)
        bad_pointer = ~chunk.zero & ((offsets < 0) | (sizes <= 0))
        known_state = np.isin(states, list(STATE_NAMES))
        keep = ~chunk.zero & ~bad_pointer
        for i in np.flatnonzero(bad_pointer | (keep & ~known_state)):
            pos = int(chunk.positions[i])
            if bad_pointer[i]:
                detail, expected = "unit with impossible values; 3.x recovery truncates the table here", \
                    "commitlog_offset >= 0 and size > 0"
            else:
                detail, expected = "unknown transaction state", "state 4, 8 or 12"
            anomalies.append(_unit_anomaly(
                AnomalyKind.BAD_STATETABLE_UNIT, file_str, source, base, pos,
                f"{detail} (index {(base + pos) // STATETABLE_UNIT_SIZE})", expected,
                f"commitlog_offset={int(offsets[i])} size={int(sizes[i])} state={int(states[i])}",
                STATETABLE_UNIT_SIZE))
        n = int(keep.sum())
        if n == 0 and not anomalies:
            continue
        anomalies.sort(key=_by_position)  # file order, whatever check found them
        kept_states = states[keep]
        names = [state_name(s) for s in kept_states.tolist()]
        positions = chunk.positions[keep]
        batch = pa.RecordBatch.from_arrays([
            _constant_string(file_str, n),
            pa.array((base + positions) // STATETABLE_UNIT_SIZE, pa.int64()),
            pa.array(offsets[keep], pa.int64()),
            pa.array(sizes[keep], pa.int32()),
            pa.array(units["store_timestamp_s"][keep].astype(np.int32), pa.int32()),
            pa.array(units["producer_group_hash"][keep].astype(np.int32), pa.int32()),
            pa.array(names, pa.string()),
        ], schema=_STATETABLE_SCHEMA)
        yield batch, anomalies


def iter_statetable_dicts(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                          anomalies: Optional[list] = None) -> Iterator[dict]:
    for batch, found in decode_statetable(path, base_offset=base_offset, start=start, end=end):
        if anomalies is not None:
            anomalies.extend(found)
        yield from batch.to_pylist()  # column names are the public JSON names


def encode_statetable_unit(commitlog_offset: int, size: int, store_timestamp_s: int, producer_group_hash: int,
                           state, *, allow_invalid: bool = False) -> bytes:
    """One 24-byte statetable unit; `state` is 4/8/12 or PREPARED/COMMIT/ROLLBACK."""
    if isinstance(state, str):
        if state not in _STATE_BY_NAME:
            raise EncodeError("state", "PREPARED, COMMIT or ROLLBACK", state)
        state = _STATE_BY_NAME[state]
    state = _check_range("state", state, _INT32_MIN, _INT32_MAX)
    offset = _check_range("commitlog_offset", commitlog_offset, _INT64_MIN, _INT64_MAX)
    size = _check_range("size", size, _INT32_MIN, _INT32_MAX)
    timestamp = _check_range("store_timestamp_s", store_timestamp_s, _INT32_MIN, _INT32_MAX)
    group_hash = _check_range("producer_group_hash", producer_group_hash, _INT32_MIN, _INT32_MAX)
    if not allow_invalid:
        if offset < 0 or size <= 0:
            raise EncodeError("statetable unit", "commitlog_offset >= 0 and size > 0", (offset, size))
        if state not in STATE_NAMES:
            raise EncodeError("state", "4, 8 or 12", state)
    return _STATETABLE_STRUCT.pack(offset, size, timestamp, group_hash, state)


# ---------------------------------------------------------------------------------------------------------------
# 3.x redolog
# ---------------------------------------------------------------------------------------------------------------

def decode_redolog(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                   chunk_units: int = DEFAULT_CHUNK_UNITS) -> Iterator[tuple]:
    """Yield (RecordBatch with schemas.REDOLOG, anomalies); kind PREPARED if tagsCode == -1 else END.

    Beyond the ConsumeQueue rules, an END unit must carry the prepared record's offset: a tagsCode < -1, or one
    not before the END record's own offset (the end record is always written after its prepared record), is kept
    and reported as BAD_REDOLOG_UNIT.
    """
    base = _resolve_base(path, base_offset)
    file_str, source = str(path), "redolog"
    for chunk in _scan_units(path, REDOLOG_UNIT_DTYPE, base_offset=base, start=start, end=end,
                             chunk_units=chunk_units, source=source):
        anomalies = list(chunk.anomalies)
        offsets = chunk.units["commitlog_offset"].astype(np.int64)
        sizes = chunk.units["size"].astype(np.int32)
        tags = chunk.units["tags_code"].astype(np.int64)
        pre_blank = (offsets == 0) & (sizes == PRE_BLANK_SIZE) & (tags == 0)
        bad_pointer = ~chunk.zero & ~pre_blank & ((offsets < 0) | (sizes <= 0))
        keep = ~chunk.zero & ~pre_blank & ~bad_pointer
        prepared = tags == REDOLOG_PREPARED_TAGS_CODE
        bad_end = keep & ~prepared & ((tags < 0) | (tags >= offsets))
        for i in np.flatnonzero(bad_pointer | bad_end):
            pos = int(chunk.positions[i])
            if bad_pointer[i]:
                detail, expected = "unit with impossible values; recovery truncates the redolog here", \
                    "commitlog_offset >= 0 and size > 0"
            else:
                detail, expected = "END unit whose prepared offset cannot be right", \
                    "0 <= tags_code < commitlog_offset (or -1 for PREPARED)"
            anomalies.append(_unit_anomaly(
                AnomalyKind.BAD_REDOLOG_UNIT, file_str, source, base, pos,
                f"{detail} (index {(base + pos) // REDOLOG_UNIT_SIZE})", expected,
                f"commitlog_offset={int(offsets[i])} size={int(sizes[i])} tags_code={int(tags[i])}",
                REDOLOG_UNIT_SIZE))
        n = int(keep.sum())
        if n == 0 and not anomalies:
            continue
        anomalies.sort(key=_by_position)  # file order, whatever check found them
        positions = chunk.positions[keep]
        kinds = np.where(prepared[keep], "PREPARED", "END")
        batch = pa.RecordBatch.from_arrays([
            _constant_string(file_str, n),
            pa.array((base + positions) // REDOLOG_UNIT_SIZE, pa.int64()),
            pa.array(offsets[keep], pa.int64()),
            pa.array(sizes[keep], pa.int32()),
            pa.array(tags[keep], pa.int64()),
            pa.array(kinds.tolist(), pa.string()),
        ], schema=_REDOLOG_SCHEMA)
        yield batch, anomalies


def iter_redolog_dicts(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                       anomalies: Optional[list] = None) -> Iterator[dict]:
    for batch, found in decode_redolog(path, base_offset=base_offset, start=start, end=end):
        if anomalies is not None:
            anomalies.extend(found)
        yield from batch.to_pylist()  # column names are the public JSON names


def encode_redolog_unit(commitlog_offset: int, size: int, tags_code: int = REDOLOG_PREPARED_TAGS_CODE, *,
                        allow_invalid: bool = False) -> bytes:
    """One 20-byte redolog unit: tags_code -1 (default) for PREPARED, else the prepared record's CommitLog offset."""
    tags = _check_range("tags_code", tags_code, _INT64_MIN, _INT64_MAX)
    if not allow_invalid and tags < REDOLOG_PREPARED_TAGS_CODE:
        raise EncodeError("tags_code", "-1 (PREPARED) or a prepared CommitLog offset >= 0", tags)
    return encode_cq_unit(commitlog_offset, size, tags, allow_invalid=allow_invalid)
