"""CommitLog framing scanner and vectorised decoder (layout: see the comment atop ``txlog_io.commitlog``).

Framing
-------
``scan_range`` walks the TOTALSIZE chain of one mapped file, reading it in bounded chunks with ``readinto``, and
reports record positions per chunk plus anything it had to skip.  As in ``CommitLog.checkMessageAndReturnSize``,
a BLANK header or a zero header ends the data of a file; everything else that is not a record is damage: it
becomes an :class:`~txlog_io.errors.Anomaly` and the scan resynchronises at the next *self-verifying* record.

A record *self-verifies* when its magic is V1/V2, its TOTALSIZE fits the file, its field lengths add up to
TOTALSIZE and its stored PHYSICALOFFSET equals the file's start offset plus its position.  Bytes inside a
message body essentially never satisfy all four, which is what makes byte ranges exact:

* a range ``[start, end)`` starts at ``start`` if ``start == 0`` (a file always begins with a record), else at
  the first self-verifying position ``>= start``;
* it follows the chain and stops at the first chain position ``>= end`` that self-verifies.

So the ranges of a split file produce every record exactly once, whatever the split points.

Decoding
--------
``decode_range`` turns a chunk's positions into one Arrow RecordBatch with no per-record Python work on the
fast path: fixed fields come from one numpy structured dtype per host layout applied to a gathered header
matrix; topics, properties and bodies are cut out of the chunk as zero-copy "segment/gap" binary arrays and
compacted with Arrow ``take``; the properties map is parsed with separator positions found by numpy; Java's
``String.hashCode`` of TAGS is computed vectorised.  Rare shapes (non-ASCII tags, duplicate property keys, bad
UTF-8, non-numeric numeric properties) drop to exact per-record Python for the affected rows only.
"""
from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.store import COMMITLOG
from txlog_io import commitlog_layout as L
from txlog_io import properties as P
from txlog_io.errors import Anomaly, AnomalyKind, StoreNotFoundError, UnreadableFileError, UsageError
from txlog_io.msgid import host_text

SOURCE = "commitlog"
DEFAULT_CHUNK_BYTES = 16 << 20
_PAD = L.MAX_FIXED_SIZE + 16          # zero padding after a chunk so fixed-size header windows never overrun
_HEADER = struct.Struct(">iI")
_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")
_GOOD_MAGIC = (L.MAGIC_V1, L.MAGIC_V2)
_MAGIC_BYTES = (struct.pack(">I", L.MAGIC_V1), struct.pack(">I", L.MAGIC_V2), struct.pack(">I", L.BLANK_MAGIC))
_SCHEMA = COMMITLOG.arrow_schema()
_TX_NAMES = pa.array(["NOT", "PREPARED", "COMMIT", "ROLLBACK"], pa.string())
_COMPRESSION_NAMES = pa.array(["NONE", "ZLIB", "LZ4", "ZSTD", "ZLIB", "UNKNOWN"], pa.string())  # bits+1
_HEX = np.frombuffer(b"0123456789ABCDEF", np.uint8)
_POW31 = None  # lazily grown table of 31**k mod 2**32 for the vectorised String.hashCode


# ------------------------------------------------------------------------------------------------ file access
def file_base_offset(path: str, base_offset: Optional[int] = None) -> int:
    if base_offset is not None:
        return int(base_offset)
    name = Path(path).name
    if len(name) == 20 and name.isdigit():
        return int(name)
    raise UsageError(f"{path}: file name is not a 20-digit offset; pass base_offset explicitly")


class _Reader:
    """Read-only positional reads of one file (never mmap'd: memory stays bounded by the chunk size)."""

    def __init__(self, path: str):
        self.path = str(path)
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise StoreNotFoundError(self.path, "CommitLog file") from None
        except OSError as exc:
            raise UnreadableFileError(self.path, exc.strerror or str(exc)) from None
        self.size = os.fstat(self.fd).st_size

    def close(self):
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def pread(self, pos: int, length: int) -> bytes:
        length = max(0, min(length, self.size - pos))
        return os.pread(self.fd, length, pos) if length else b""

    def read_chunk(self, pos: int, length: int) -> np.ndarray:
        """``length`` bytes at ``pos`` followed by zero padding (so header windows may run past the data).

        A fresh uninitialised array each time (no zero-fill pass; batches never alias it, but a caller may
        keep several frames alive)."""
        length = max(0, min(length, self.size - pos))
        buf = np.empty(length + _PAD, np.uint8)
        buf[length:] = 0
        view = memoryview(buf)
        got = 0
        while got < length:
            n = os.preadv(self.fd, [view[got:length]], pos + got)
            if n <= 0:
                break
            got += n
        view.release()
        if got < length:
            raise UnreadableFileError(self.path, f"short read at {pos + got}: file shrank while reading")
        return buf


def _record_shape_ok(head: bytes, total: int) -> bool:
    """Do the length fields of a record header add up to TOTALSIZE?  ``head`` holds the whole record."""
    sys_flag = struct.unpack_from(">i", head, L.SYS_FLAG_OFFSET)[0]
    layout = L.LAYOUTS[L.layout_index(sys_flag)]
    fixed = layout.itemsize
    v2 = struct.unpack_from(">I", head, 4)[0] == L.MAGIC_V2
    body_len = struct.unpack_from(">i", head, fixed - 4)[0]
    t = fixed + body_len
    tw = 2 if v2 else 1
    if body_len < 0 or t + tw + 2 > total:
        return False
    topic_len = _I16.unpack_from(head, t)[0] if v2 else struct.unpack_from(">b", head, t)[0]
    if topic_len <= 0 or t + tw + topic_len + 2 > total:
        return False
    props_len = _I16.unpack_from(head, t + tw + topic_len)[0]
    return props_len >= 0 and t + tw + topic_len + 2 + props_len == total


def _self_verifies(reader: _Reader, pos: int, base_offset: int) -> bool:
    """Is there a record at ``pos`` whose own fields prove it starts there (see module docstring)?"""
    head = reader.pread(pos, 8)
    if len(head) < 8:
        return False
    total, magic = _HEADER.unpack(head)
    if magic == L.BLANK_MAGIC:
        return pos + total == reader.size
    if magic not in _GOOD_MAGIC or total < L.MIN_RECORD_SIZE or pos + total > reader.size:
        return False
    rec = reader.pread(pos, total)
    if _I64.unpack_from(rec, L.PHYSICAL_OFFSET_OFFSET)[0] != base_offset + pos:
        return False
    return _record_shape_ok(rec, total)


def next_boundary(reader: _Reader, pos: int, base_offset: int, limit: Optional[int] = None) -> Optional[int]:
    """First self-verifying record (or BLANK header) at or after ``pos``, searching up to ``limit``."""
    limit = reader.size if limit is None else min(limit, reader.size)
    block = DEFAULT_CHUNK_BYTES
    while pos < limit:
        data = reader.pread(pos, min(block, limit - pos) + 8)
        candidates = sorted(c for c in (_find_all(data, m) for m in _MAGIC_BYTES) for c in c)
        for c in candidates:
            start = pos + c - 4
            if start >= pos and start < limit and _self_verifies(reader, start, base_offset):
                return start
        pos += max(1, len(data) - 8)
    return None


def _find_all(data: bytes, needle: bytes) -> list:
    out, i = [], data.find(needle)
    while i >= 0:
        out.append(i)
        i = data.find(needle, i + 1)
    return out


def _first_nonzero(reader: _Reader, pos: int, limit: int) -> Optional[int]:
    while pos < limit:
        block = reader.pread(pos, min(DEFAULT_CHUNK_BYTES, limit - pos))
        if not block:
            return None
        arr = np.frombuffer(block, np.uint8)
        if arr.any():
            return pos + int(arr.argmax())
        pos += len(block)
    return None


# ------------------------------------------------------------------------------------------------ framing
@dataclass
class Frame:
    """Records found in one chunk: ``positions`` are relative to ``buf``; ``buf`` starts at ``file_pos``."""

    buf: bytearray
    file_pos: int
    positions: np.ndarray
    anomalies: list = field(default_factory=list)
    header: Optional["_Header"] = None
    shape: Optional["_Shape"] = None


@dataclass
class ScanSummary:
    """What a scan of a byte range saw (the dump prints it on stderr)."""

    file: str
    start: int
    end: int
    records: int = 0
    valid_end: int = 0            # file position just past the last record (or the BLANK header) seen
    stop_reason: str = ""
    skipped_bytes: int = 0
    anomalies: int = 0


def scan_range(path: str, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
               chunk_bytes: int = DEFAULT_CHUNK_BYTES, summary: Optional[ScanSummary] = None) -> Iterator[Frame]:
    """Frame the records of ``path`` owned by ``[start, end)``; see the module docstring for the rules."""
    base = file_base_offset(path, base_offset)
    with _Reader(path) as reader:
        size = reader.size
        end = size if end is None else max(0, min(end, size))
        summary = summary if summary is not None else ScanSummary(str(path), start, end)
        summary.file, summary.start, summary.end = str(path), start, end
        if start >= size or start >= end:
            summary.stop_reason = "empty range"
            return
        pos = 0 if start <= 0 else next_boundary(reader, start, base, limit=end)
        if pos is None:
            summary.stop_reason = "no record starts in range"
            return
        yield from _walk(reader, base, pos, end, chunk_bytes, summary)


def _walk(reader: _Reader, base: int, pos: int, end: int, chunk_bytes: int,
          summary: ScanSummary) -> Iterator[Frame]:
    size = reader.size
    path = reader.path
    min_size = L.MIN_RECORD_SIZE
    v1, v2 = L.MAGIC_V1, L.MAGIC_V2
    unpack = _HEADER.unpack_from
    small_records: Optional[bool] = None     # decided from the first records seen
    while pos is not None and pos < size:
        # past the range end only the boundary record has to be looked at: read a little, not a whole chunk
        want = chunk_bytes if pos < end else min(chunk_bytes, 64 << 10)
        head = reader.pread(pos, 8)
        if len(head) == 8:
            first_total = _HEADER.unpack(head)[0]
            if first_total > want and pos + first_total <= size:
                want = first_total          # one record larger than a chunk: read exactly that record
        buf = reader.read_chunk(pos, want)
        n = len(buf) - _PAD
        positions: list = []
        rel = 0
        anomalies: list = []
        next_pos: Optional[int] = None      # where the following chunk starts; None = the range is finished
        verify_from = end - pos             # at/after this relative position a boundary must self-verify to stop
        if small_records is None:
            small_records = _looks_small(buf, n)
        fast = np.zeros(0, np.int64)
        if small_records:
            fast = _chain_fast(buf, n, min(n, verify_from), size - pos)
            if fast.size:
                last = int(fast[-1])
                rel = last + _HEADER.unpack_from(buf, last)[0]
        while True:
            if rel + 8 > n:
                if pos + rel + 8 <= size:
                    next_pos = pos + rel    # header crosses the chunk edge: continue in a new chunk
                    break
                fp = pos + rel
                if fp < size:
                    nz = _first_nonzero(reader, fp, size)
                    if nz is not None:
                        anomalies.append(_anomaly(AnomalyKind.TRUNCATED_RECORD, path, fp, base,
                                                  "fewer than 8 bytes left for a record header",
                                                  "8 bytes", f"{size - fp} bytes"))
                summary.valid_end, summary.stop_reason = fp, "end of file"
                break
            total, magic = unpack(buf, rel)
            fp = pos + rel
            if rel >= verify_from and (magic not in (v1, v2) or total >= min_size) and \
                    _self_verifies(reader, fp, base):
                summary.valid_end, summary.stop_reason = fp, "end of range"
                break
            if magic == v1 or magic == v2:
                if total < min_size or fp + total > size:
                    next_pos = _resync(reader, base, fp, end, anomalies, summary, AnomalyKind.BAD_TOTAL_SIZE,
                                       f"TOTALSIZE {total} impossible here", f"{min_size}..{size - fp}", total)
                    break
                if rel + total > n:
                    next_pos = fp           # record continues past this chunk
                    break
                positions.append(rel)
                rel += total
                continue
            if magic == L.BLANK_MAGIC:
                if fp + total != size:
                    anomalies.append(_anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, fp, base,
                                              "BLANK end-of-file header length does not reach the file end",
                                              size - fp, total))
                summary.valid_end, summary.stop_reason = fp, "BLANK end-of-file filler"
                break
            if total == 0 and magic == 0:
                summary.valid_end, summary.stop_reason = fp, "zero-filled tail (end of data)"
                next_pos = _check_zero_tail(reader, base, fp, end, anomalies, summary)
                break
            next_pos = _resync(reader, base, fp, end, anomalies, summary, AnomalyKind.BAD_MAGIC,
                               "no record header here", "magic 0xDAA320A7/0xDAA320AB/0xCBD43194",
                               f"0x{magic:08X}")
            break
        if positions:
            positions = np.concatenate([fast, np.asarray(positions, np.int64)]) if fast.size else \
                np.asarray(positions, np.int64)
        elif fast.size:
            positions = fast
        if len(positions):
            # small records make the Python chain walk the bottleneck: switch to the vectorised chain finder
            small_records = rel / len(positions) < _FAST_CHAIN_BELOW
        if len(positions) or anomalies:
            rel_pos = positions if isinstance(positions, np.ndarray) else np.asarray(positions, np.int64)
            u8 = np.frombuffer(buf, np.uint8)
            header = _Header(u8, rel_pos) if rel_pos.size else None
            shape = _shape(u8, rel_pos, header) if rel_pos.size else None
            if shape is not None and not shape.ok.all():
                # a record whose lengths do not add up may have a wrong TOTALSIZE that jumped over intact
                # records: look for self-verifying records inside its claimed span and decode them too
                extra = []
                sizes = header.head["total_size"]
                for i in np.flatnonzero(~shape.ok).tolist():
                    fp = pos + int(rel_pos[i])
                    extra += [q - pos for q in _recover_inside(reader, base, fp, int(sizes[i]), end)]
                if extra:
                    rel_pos = np.unique(np.concatenate([rel_pos, np.asarray(extra, np.int64)]))
                    header = _Header(u8, rel_pos)
                    shape = _shape(u8, rel_pos, header)
            summary.records += int(rel_pos.size) - (int((~shape.ok).sum()) if shape is not None else 0)
            summary.anomalies += len(anomalies)
            if rel_pos.size:
                last = int(rel_pos[-1])
                summary.valid_end = max(summary.valid_end, pos + last + _HEADER.unpack_from(buf, last)[0])
            yield Frame(buf, pos, rel_pos, anomalies, header, shape)
        pos = next_pos


_FAST_CHAIN_BELOW = 640   # average record size under which the vectorised chain finder beats the Python walk


def _looks_small(buf: bytearray, n: int, sample: int = 32) -> bool:
    """Average size of the first records of a chunk (a cheap guess; either path is exact)."""
    pos, count = 0, 0
    while count < sample and pos + 8 <= n:
        total, magic = _HEADER.unpack_from(buf, pos)
        if magic not in _GOOD_MAGIC or total < L.MIN_RECORD_SIZE:
            break
        pos += total
        count += 1
    return count > 0 and pos / count < _FAST_CHAIN_BELOW


def _chain_fast(buf: bytearray, n: int, limit: int, bytes_to_file_end: int) -> np.ndarray:
    """Record positions of the unbroken TOTALSIZE chain that starts at 0 and stays below ``limit``.

    Candidates are the places where a V1/V2 magic sits 4 bytes in; the chain is accepted while each record ends
    exactly where the next candidate starts.  The first irregularity (a magic pattern inside a body, damage, the
    end of data, a record crossing the chunk edge) ends the fast prefix and the exact Python walk takes over."""
    u8 = np.frombuffer(buf, np.uint8, n)
    c = np.flatnonzero(u8[4:n - 3] == 0xDA)
    c = c[(u8[c + 5] == 0xA3) & (u8[c + 6] == 0x20) & ((u8[c + 7] | 0x0C) == 0xAF)]
    if not c.size or c[0] != 0:
        return np.zeros(0, np.int64)
    m = (u8[c + 7] == 0xA7) | (u8[c + 7] == 0xAB)
    c = c[m]
    sizes = _sizes_at(buf, c)
    ends = c + sizes
    ok = (sizes >= L.MIN_RECORD_SIZE) & (ends <= n) & (ends <= bytes_to_file_end) & (c < limit)
    linked = np.empty(c.size, bool)
    linked[:-1] = ends[:-1] == c[1:]
    linked[-1] = False
    good = ok & linked
    bad = np.flatnonzero(~good)
    stop = int(bad[0]) if bad.size else c.size
    # the record at ``stop`` is still part of the chain when its own size is fine (its successor is what broke)
    if stop < c.size and ok[stop]:
        stop += 1
    return c[:stop].astype(np.int64)


def _sizes_at(buf: bytearray, rel_pos: np.ndarray) -> np.ndarray:
    if not rel_pos.size:
        return np.zeros(0, np.int64)
    u8 = np.frombuffer(buf, np.uint8)
    w = np.lib.stride_tricks.sliding_window_view(u8, 4)[rel_pos]
    return w.copy().view(">i4").reshape(-1).astype(np.int64)


def _recover_inside(reader: _Reader, base: int, fp: int, claimed: int, end: int) -> list:
    """File positions of self-verifying records inside ``(fp, fp + claimed)`` that a range ending at ``end``
    owns: the chain skipped them because the record at ``fp`` carries a wrong TOTALSIZE."""
    found = []
    limit = min(fp + claimed, end, reader.size)
    t = next_boundary(reader, fp + 1, base, limit=limit)
    while t is not None and t < limit:
        head = reader.pread(t, 8)
        total, magic = _HEADER.unpack(head)
        if magic not in _GOOD_MAGIC:
            break
        found.append(t)
        nxt = t + total
        t = nxt if nxt < limit and _self_verifies(reader, nxt, base) else next_boundary(reader, t + 1, base, limit)
    return found


def _resync(reader, base, fp, end, anomalies, summary, kind, detail, expected, actual) -> Optional[int]:
    """Report damage at ``fp`` and find where intact records resume; None when the range is finished."""
    nxt = next_boundary(reader, fp + 1, base)
    if nxt is None:
        anomalies.append(_anomaly(kind, reader.path, fp, base,
                                  f"{detail}; no valid record follows (bytes {fp}..{reader.size} unreadable)",
                                  expected, actual))
        summary.skipped_bytes += reader.size - fp
        summary.stop_reason = f"{kind} with no valid record after it"
        return None
    anomalies.append(_anomaly(kind, reader.path, fp, base,
                              f"{detail}; resynchronised at file position {nxt} ({nxt - fp} bytes skipped)",
                              expected, actual))
    summary.skipped_bytes += nxt - fp
    return nxt if nxt < end else None


def _check_zero_tail(reader, base, fp, end, anomalies, summary) -> Optional[int]:
    """Data ended at ``fp`` with a zero header: the rest must be zeros, else report it and resume if we can.

    The newest file of a store is mostly zeros, so the common case is a plain non-zero test per block; only
    a block holding non-zero bytes is searched for a record (which starts at most 3 bytes before its first
    non-zero byte: the high bytes of TOTALSIZE are usually zero)."""
    nz = _first_nonzero(reader, fp, reader.size)
    if nz is None:
        return None
    nxt = next_boundary(reader, max(fp, nz - 3), base)
    if nxt is None:
        anomalies.append(_anomaly(AnomalyKind.GARBAGE_AFTER_END, reader.path, nz, base,
                                  f"non-zero bytes after the end of data at {fp}", "zeros", "non-zero bytes"))
        summary.skipped_bytes += reader.size - nz
        return None
    anomalies.append(_anomaly(AnomalyKind.RESYNC, reader.path, fp, base,
                              f"zero gap {fp}..{nxt} inside the data; records resume at {nxt}",
                              "contiguous records", f"{nxt - fp} zero/garbage bytes"))
    summary.skipped_bytes += nxt - fp
    return nxt if nxt < end else None


def _anomaly(kind, file, pos, base, detail, expected=None, actual=None) -> Anomaly:
    return Anomaly(kind=kind, file=str(file), position=int(pos), detail=detail,
                   expected=None if expected is None else str(expected),
                   actual=None if actual is None else str(actual), source=SOURCE,
                   physical_offset=int(base + pos))


# ------------------------------------------------------------------------------------------------ decoding
def decode_range(path: str, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                 with_body: bool = False, topics: Optional[Iterable[str]] = None, verify_crc: bool = True,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 summary: Optional[ScanSummary] = None) -> Iterator[tuple]:
    """Decode the records ``[start, end)`` owns into ``(RecordBatch, anomalies)`` pairs (schema COMMITLOG).

    ``topics``: keep only records of these topics (filter pushdown; decided before properties/bodies are cut).
    ``verify_crc``: compute the body CRC of every record (``body_crc_ok``); without it ``body_crc_ok`` is true.
    """
    base = file_base_offset(path, base_offset)
    topic_set = None if topics is None else pa.array(sorted(set(topics)), pa.string())
    for frame in scan_range(path, base_offset=base, start=start, end=end, chunk_bytes=chunk_bytes,
                            summary=summary):
        yield from _decode_frame(frame, str(path), base, with_body, topic_set, verify_crc)


def decode_file(path: str, **kwargs) -> Iterator[tuple]:
    return decode_range(path, **kwargs)


#: indexed reads: positions closer than this on average are served by one read of their whole window
FETCH_DENSE_GAP = 64 << 10
FETCH_WINDOW = 8 << 20              # bytes spanned by one window read (plus the last record)
_PROBE = L.SYS_FLAG_OFFSET + 4      # header bytes that say where a record ends and its transaction type
_PROBE_DT = np.dtype([("total", ">i4"), ("magic", ">u4"), ("_", "V28"), ("sys_flag", ">i4")])


def decode_at(path: str, positions: Sequence[int], *, base_offset: Optional[int] = None,
              with_body: bool = False, verify_crc: bool = True, tx_only: Sequence[int] = ()) -> tuple:
    """Decode the records starting at the given file positions (indexed reads via consume queues).

    A position that holds no record (outside the file, wrong magic, impossible size) is an anomaly
    ``CQ_ENTRY_MISMATCH`` instead of a row.  ``tx_only``: positions whose record is wanted only if its
    transaction type is not NOT (positions found through a real topic's consume queue, where 99 % of the
    records may be ordinary): their header is probed and an ordinary record is never copied or decoded.
    Dense positions are read a window at a time, sparse ones a record at a time.
    Returns one ``(RecordBatch, anomalies)`` pair.
    """
    base = file_base_offset(path, base_offset)
    anomalies: list = []
    wanted = np.unique(np.asarray(list(positions), dtype=np.int64))
    probe_only = (np.isin(wanted, np.asarray(list(tx_only), np.int64)) if len(tx_only)
                  else np.zeros(wanted.size, bool))
    parts: list = []
    file_pos: list = []
    with _Reader(path) as reader:
        i, n = 0, wanted.size
        while i < n:
            j = max(i + 1, int(np.searchsorted(wanted, wanted[i] + FETCH_WINDOW, "left")))
            if j - i > 1 and (wanted[j - 1] - wanted[i]) <= FETCH_DENSE_GAP * (j - i - 1):
                _fetch_window(reader, base, wanted[i:j], probe_only[i:j], parts, file_pos, anomalies)
            else:
                for k in range(i, j):
                    _fetch_one(reader, base, int(wanted[k]), bool(probe_only[k]), parts, file_pos, anomalies)
            i = j
    rel = np.zeros(len(parts), np.int64)
    if parts:
        np.cumsum([len(x) for x in parts[:-1]], out=rel[1:])
    buf = bytearray(b"".join(parts))
    buf += bytes(_PAD)
    frame = Frame(buf, 0, rel)
    batches = list(_decode_frame(frame, str(path), base, with_body, None, verify_crc,
                                 file_positions=np.asarray(file_pos, np.int64)))
    if not batches:
        return _empty_batch(), anomalies
    batch = pa.concat_batches([b for b, _ in batches]) if len(batches) > 1 else batches[0][0]
    for _, a in batches:
        anomalies.extend(a)
    return batch, anomalies


def _no_record(path: str, p: int, base: int, actual: str) -> Anomaly:
    return _anomaly(AnomalyKind.CQ_ENTRY_MISMATCH, path, p, base, "no CommitLog record starts at this indexed "
                    "position", "record header", actual)


def _fetch_one(reader: _Reader, base: int, p: int, probe_only: bool, parts: list, file_pos: list,
               anomalies: list) -> None:
    head = reader.pread(p, _PROBE) if 0 <= p < reader.size else b""
    total, magic = _HEADER.unpack_from(head) if len(head) >= 8 else (0, 0)
    if magic not in _GOOD_MAGIC or total < L.MIN_RECORD_SIZE or p + total > reader.size:
        anomalies.append(_no_record(reader.path, p, base, "end of file" if not head else f"0x{magic:08X}/{total}"))
        return
    if probe_only and not struct.unpack_from(">i", head, L.SYS_FLAG_OFFSET)[0] & L.TRANSACTION_MASK:
        return
    parts.append(reader.pread(p, total))
    file_pos.append(p)


def _fetch_window(reader: _Reader, base: int, pos: np.ndarray, probe_only: np.ndarray, parts: list,
                  file_pos: list, anomalies: list) -> None:
    """``pos`` (sorted, within FETCH_WINDOW of each other) through one read of their span."""
    inside = (pos >= 0) & (pos < reader.size)
    outside = [_no_record(reader.path, p, base, "end of file") for p in pos[~inside].tolist()]
    anomalies.extend(a for a in outside if a.position < 0)
    pos, probe_only = pos[inside], probe_only[inside]
    if pos.size == 0:
        anomalies.extend(a for a in outside if a.position >= 0)
        return
    start = int(pos[0])
    buf = reader.read_chunk(start, int(pos[-1]) - start + 64 * 1024)   # zero padding covers every probe
    data_len = buf.size - _PAD
    rel = pos - start
    heads = buf[rel[:, None] + np.arange(_PROBE)].view(_PROBE_DT).ravel()
    total = heads["total"].astype(np.int64)
    magic = heads["magic"]
    bad = (~np.isin(magic, np.asarray(_GOOD_MAGIC, np.uint32)) | (total < L.MIN_RECORD_SIZE)
           | (pos + total > reader.size))
    for k in np.flatnonzero(bad).tolist():
        anomalies.append(_no_record(reader.path, int(pos[k]), base, f"0x{int(magic[k]):08X}/{int(total[k])}"))
    keep = ~bad & ~(probe_only & ((heads["sys_flag"] & L.TRANSACTION_MASK) == 0))
    view = memoryview(buf)
    for k in np.flatnonzero(keep).tolist():
        r, t = int(rel[k]), int(total[k])
        parts.append(view[r:r + t] if r + t <= data_len else reader.pread(int(pos[k]), t))
        file_pos.append(int(pos[k]))
    anomalies.extend(a for a in outside if a.position >= 0)


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=_SCHEMA)


def _decode_frame(frame: Frame, path: str, base: int, with_body: bool, topic_set, verify_crc: bool,
                  file_positions: Optional[np.ndarray] = None) -> Iterator[tuple]:
    """One RecordBatch per frame (a frame holds at most chunk_bytes / 91 records)."""
    if frame.positions.size == 0:
        if frame.anomalies:
            yield _empty_batch(), frame.anomalies
        return
    fpos = file_positions if file_positions is not None else frame.positions + frame.file_pos
    batch, anomalies = _decode_rows(frame.buf, frame.positions, fpos, path, base, with_body, topic_set,
                                    verify_crc, frame.header, frame.shape)
    yield batch, list(frame.anomalies) + anomalies


def _padded(dt: np.dtype) -> np.dtype:
    """The same fields at the same offsets, in a row as wide as the widest layout (zero-copy row views)."""
    return np.dtype({"names": list(dt.names), "formats": [dt.fields[k][0] for k in dt.names],
                     "offsets": [dt.fields[k][1] for k in dt.names], "itemsize": L.MAX_FIXED_SIZE})


_HEAD_ROW = _padded(L.HEAD)
_LAYOUT_ROWS = tuple(_padded(d) for d in L.LAYOUTS)
_FIXED_LEN = np.array([d.itemsize for d in L.LAYOUTS], np.int64)


class _Header:
    """The fixed part of every record, gathered once: an (n x 112) byte matrix read through structured dtypes.

    Fields before BORNHOST sit at the same offsets in every layout (``head``); the host fields and BODYLENGTH
    are read per host layout (IPv4/IPv6 born x store host), usually a single group."""

    def __init__(self, u8: np.ndarray, pos: np.ndarray):
        self.n = pos.size
        self.rows = np.lib.stride_tricks.sliding_window_view(u8, L.MAX_FIXED_SIZE)[pos]
        self.head = self.rows.view(_HEAD_ROW).reshape(self.n)
        self.sys_flag = self.head["sys_flag"].astype(np.int64)
        self.layout = ((self.sys_flag >> 4) & 1) | (((self.sys_flag >> 5) & 1) << 1)
        kinds = np.unique(self.layout)
        if kinds.size == 1:
            g = int(kinds[0])
            self.groups = [(g, None, self.rows.view(_LAYOUT_ROWS[g]).reshape(self.n))]
        else:
            self.groups = []
            for g in kinds.tolist():
                idx = np.flatnonzero(self.layout == g)
                self.groups.append((g, idx, np.ascontiguousarray(self.rows[idx]).view(_LAYOUT_ROWS[g])
                                    .reshape(idx.size)))

    def field(self, name: str, dtype) -> np.ndarray:
        if name in L.HEAD.names:
            return self.head[name].astype(dtype)
        if len(self.groups) == 1:
            return self.groups[0][2][name].astype(dtype)
        out = np.empty(self.n, dtype)
        for _, idx, rec in self.groups:
            out[idx] = rec[name]
        return out

    def select(self, sel: np.ndarray) -> "_Header":
        other = object.__new__(_Header)
        other.n = sel.size
        other.rows = self.rows[sel]
        other.head = other.rows.view(_HEAD_ROW).reshape(other.n)
        other.sys_flag = self.sys_flag[sel]
        other.layout = self.layout[sel]
        other.groups = []
        for g in np.unique(other.layout).tolist():
            idx = None if np.unique(other.layout).size == 1 else np.flatnonzero(other.layout == g)
            rows = other.rows if idx is None else np.ascontiguousarray(other.rows[idx])
            other.groups.append((g, idx, rows.view(_LAYOUT_ROWS[g]).reshape(rows.shape[0])))
        return other

    def hosts(self, which: str) -> pa.Array:
        if len(self.groups) == 1:
            _, _, rec = self.groups[0]
            return _hosts(rec[f"{which}_ip"], rec[f"{which}_port"].astype(np.int64))
        parts = np.empty(self.n, object)
        for _, idx, rec in self.groups:
            parts[idx] = _hosts(rec[f"{which}_ip"], rec[f"{which}_port"].astype(np.int64)).to_pylist()
        return pa.array(parts.tolist(), pa.string())

    def msg_ids(self) -> pa.Array:
        """offsetMsgId = hex(store ip + store port + stored PHYSICALOFFSET), straight from the record bytes."""
        phys = self.rows[:, L.PHYSICAL_OFFSET_OFFSET:L.PHYSICAL_OFFSET_OFFSET + 8]
        if len(self.groups) == 1:
            dt = L.LAYOUTS[self.groups[0][0]]
            s_off, s_len = dt.fields["store_ip"][1], dt.fields["store_ip"][0].itemsize + 4
            return _hex_ids(np.concatenate([self.rows[:, s_off:s_off + s_len], phys], axis=1))
        result = np.empty(self.n, object)
        for g, idx, _ in self.groups:
            dt = L.LAYOUTS[g]
            s_off, s_len = dt.fields["store_ip"][1], dt.fields["store_ip"][0].itemsize + 4
            result[idx] = _hex_ids(np.concatenate([self.rows[idx, s_off:s_off + s_len], phys[idx]],
                                                  axis=1)).to_pylist()
        return pa.array(result.tolist(), pa.string())


def _segments(buf, starts: np.ndarray, ends: np.ndarray, binary=True) -> pa.Array:
    """The byte ranges [starts[i], ends[i]) of ``buf`` (sorted, non-overlapping) as one compact binary array.

    The ranges and the gaps between them are first laid over ``buf`` as a zero-copy binary array of
    alternating segment/gap values; Arrow's ``take`` then copies just the segments (memcpy speed)."""
    n = starts.size
    if n == 0:
        return pa.array([], pa.binary() if binary else pa.string())
    offsets = np.empty(2 * n, np.int64)
    offsets[0::2] = starts
    offsets[1::2] = ends
    if offsets[-1] >= 2 ** 31:
        raise UsageError("chunk too large for 32-bit Arrow offsets")
    interleaved = pa.Array.from_buffers(pa.binary(), 2 * n - 1,
                                        [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(buf)])
    return interleaved.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int32)))


def _read_i16(u8: np.ndarray, at: np.ndarray) -> np.ndarray:
    return ((u8[at].astype(np.int16) << 8) | u8[at + 1].astype(np.int16)).astype(np.int64)


_HEX4 = None


def _hex_ids(window_rows: np.ndarray) -> pa.Array:
    """Upper-case hex of each row of a uint8 matrix (offsetMsgId), four hex digits per table lookup."""
    global _HEX4
    if _HEX4 is None:
        v = np.arange(65536)
        t = np.empty((65536, 4), np.uint8)
        for k in range(4):
            t[:, k] = _HEX[(v >> (12 - 4 * k)) & 0xF]
        _HEX4 = t.view("<u4").reshape(65536)
    n, w = window_rows.shape
    words = np.ascontiguousarray(window_rows).view(">u2").reshape(n, w // 2)
    out = _HEX4[words]
    offsets = np.arange(0, (n + 1) * 2 * w, 2 * w, dtype=np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(out)])


def _hosts(ip: np.ndarray, port: np.ndarray) -> pa.Array:
    """Host text per record via the (few) distinct (ip, port) pairs."""
    n = port.size
    ipw = np.ascontiguousarray(ip).view(np.uint8).reshape(n, -1)
    if ipw.shape[1] == 4:
        key = (ipw.astype(np.uint64) @ np.array([1 << 24, 1 << 16, 1 << 8, 1], np.uint64)) << np.uint64(32)
        key |= port.astype(np.int64).astype(np.uint64) & np.uint64(0xFFFFFFFF)
        uniq, inverse = np.unique(key, return_inverse=True)
        texts = []
        for k in uniq.tolist():
            ipv = k >> 32
            texts.append(host_text(ipv.to_bytes(4, "big"), _s32(k & 0xFFFFFFFF)))
        return pa.array(texts, pa.string()).take(pa.array(inverse.astype(np.int32)))
    texts = [host_text(bytes(ipw[i]), int(port[i])) for i in range(n)]
    return pa.array(texts, pa.string())


def _s32(v: int) -> int:
    return v - (1 << 32) if v & 0x80000000 else v


def _java_hash_ascii(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """String.hashCode of ASCII strings given as concatenated bytes + offsets (int32 wrap-around)."""
    global _POW31
    lengths = np.diff(offsets)
    n = lengths.size
    if n == 0 or data.size == 0:
        return np.zeros(n, np.int64)
    longest = int(lengths.max())
    if _POW31 is None or _POW31.size < longest + 1:
        size = max(longest + 1, 256)
        pw = np.empty(size, np.uint64)
        acc = 1
        for k in range(size):
            pw[k] = acc
            acc = (acc * 31) & 0xFFFFFFFF
        _POW31 = pw
    # exponent of byte j of string i is (len_i - 1 - (j - start_i))
    rec = np.repeat(np.arange(n), lengths)
    exps = offsets[1:][rec] - 1 - np.arange(offsets[0], offsets[-1])
    contrib = (data.astype(np.uint64) * _POW31[exps]) & np.uint64(0xFFFFFFFF)
    sums = np.zeros(n, np.uint64)
    nz = lengths > 0
    if nz.any():
        sums[nz] = np.add.reduceat(contrib, (offsets[:-1] - offsets[0])[nz])
    h = (sums & np.uint64(0xFFFFFFFF)).astype(np.int64)
    return np.where(h >= 1 << 31, h - (1 << 32), h)


@dataclass
class _Props:
    keys: pa.Array
    values: pa.Array
    map_offsets: np.ndarray
    key_codes: np.ndarray
    dictionary: list
    record_of: np.ndarray


def _parse_properties(props: pa.Array) -> _Props:
    """string2messageProperties for every record at once (see txlog_io.properties for the rules).

    Segments end at every 0x02 and at every record end.  Both lists are merged in one stable sort (a record end
    sorts before a 0x02 at the same byte, which belongs to the next record), so the record of each segment is a
    running count of record ends and no per-record search is needed."""
    n = len(props)
    bufs = props.buffers()
    rec_off = np.frombuffer(bufs[1], np.int32, n + 1, props.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    data = data[:rec_off[-1]]
    fast = _well_formed_segments(data, rec_off, n)
    if fast is not None:
        s, kv, e, r = fast
        return _props_from_segments(bufs[2], s, kv, e, r, n)
    sep2 = np.flatnonzero(data == 2)
    sep1 = np.flatnonzero(data == 1)
    merged = np.concatenate([rec_off[1:], sep2])
    order = np.argsort(merged, kind="stable")
    ends = merged[order]
    is_end = order < n
    rec_of_end = np.cumsum(is_end) - is_end
    seg_start = np.empty_like(ends)
    seg_start[0] = rec_off[0]
    seg_start[1:] = ends[:-1] + 1
    # a segment that follows a record end starts at its own record's first byte
    follows_end = np.empty(ends.size, bool)
    follows_end[0] = True
    follows_end[1:] = is_end[:-1]
    seg_start[follows_end] = rec_off[:-1][rec_of_end[follows_end]]
    nonempty = ends - seg_start >= 3
    s, e, r = seg_start[nonempty], ends[nonempty], rec_of_end[nonempty]
    if sep1.size == s.size and (sep1 > s).all() and (sep1 < e - 1).all():
        kv, valid = sep1, None          # well-formed: exactly one 0x01 inside every segment
    else:
        k = np.searchsorted(sep1, s)
        kv = np.full(s.size, -1, np.int64)
        has = k < sep1.size
        kv[has] = sep1[k[has]]
        valid = (kv > s) & (kv < e - 1)
    if valid is not None:
        s, e, r, kv = s[valid], e[valid], r[valid], kv[valid]
    return _props_from_segments(bufs[2], s, kv, e, r, n)


def _well_formed_segments(data: np.ndarray, rec_off: np.ndarray, n: int):
    """Fast path for the shape every broker writes: per record ``k 01 v 02 k 01 v 02 ...`` with or without the
    final 02 (3.x/5.x vs 4.9.x), the same style in every record of the batch.  Returns (key start, 0x01
    position, segment end, record) per entry, or None to let the general path decide."""
    sep = np.flatnonzero(data < 3)
    kinds = data[sep]
    lens = np.diff(rec_off)
    nonempty = np.flatnonzero(lens > 0)
    if not nonempty.size:
        return None
    ends = rec_off[1:][nonempty]
    final_two = data[ends - 1] == 2
    if final_two.all():
        virtual = None
    elif not final_two.any():
        # 4.9.x: a virtual 0x02 at every record end (one past its last byte) makes both styles alike
        at = np.searchsorted(sep, ends)
        sep = np.insert(sep, at, ends)
        kinds = np.insert(kinds, at, 2)
        virtual = at + np.arange(at.size)
    else:
        return None
    if sep.size % 2 or (kinds[0::2] != 1).any() or (kinds[1::2] != 2).any():
        return None
    kv, e = sep[0::2], sep[1::2]
    s = np.empty_like(e)
    s[0] = rec_off[nonempty[0]]
    s[1:] = e[:-1] + 1
    if virtual is None:
        final = np.searchsorted(e, ends - 1)            # index of each record's last segment
    else:
        final = (virtual - 1) // 2
        s[final[:-1] + 1] = e[final[:-1]]               # after a virtual 0x02 the next record starts right there
    counts = np.diff(np.concatenate([[-1], final]))
    r = np.repeat(nonempty, counts)
    valid = (kv > s) & (kv < e - 1)                     # empty key or value: ignored, as Java does
    if not valid.all():
        s, kv, e, r = s[valid], kv[valid], e[valid], r[valid]
    return s, kv, e, r


def _props_from_segments(data_buf, s, kv, e, r, n: int) -> _Props:
    m = s.size
    bufs = [None, None, data_buf]
    if m:
        offs = np.empty(4 * m, np.int32)
        offs[0::4], offs[1::4], offs[2::4], offs[3::4] = s, kv, kv + 1, e
        inter = pa.Array.from_buffers(pa.binary(), 4 * m - 1, [None, pa.py_buffer(offs), bufs[2]])
        keys_b = inter.take(pa.array(np.arange(0, 4 * m, 4, dtype=np.int32)))
        vals_b = inter.take(pa.array(np.arange(2, 4 * m, 4, dtype=np.int32)))
    else:
        keys_b = vals_b = pa.array([], pa.binary())
    keys = _to_utf8(keys_b)
    values = _to_utf8(vals_b)
    enc = pc.dictionary_encode(keys)
    codes = np.asarray(enc.indices, dtype=np.int64) if m else np.zeros(0, np.int64)
    dictionary = enc.dictionary.to_pylist() if m else []
    counts = np.bincount(r, minlength=n) if m else np.zeros(n, np.int64)
    map_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=map_offsets[1:])
    return _dedupe_keys(_Props(keys, values, map_offsets, codes, dictionary, r), n)


def _to_utf8(arr: pa.Array) -> pa.Array:
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()],
                        pa.string())


def _dedupe_keys(p: _Props, n: int) -> _Props:
    """Java's HashMap: a later duplicate key wins.  Detect records with duplicates cheaply, fix only those."""
    m = p.key_codes.size
    if m == 0:
        return p
    combined = p.record_of * (len(p.dictionary) + 1) + p.key_codes
    if len(p.dictionary) <= 63:
        bits = np.left_shift(np.uint64(1), p.key_codes.astype(np.uint64))
        counts = np.diff(p.map_offsets)
        has = counts > 0
        distinct = np.zeros(n, np.int64)
        distinct[has] = np.bitwise_count(np.bitwise_or.reduceat(bits, p.map_offsets[:-1][has]))
        if (distinct == counts).all():
            return p
    else:
        srt = np.sort(combined)
        if not np.any(srt[1:] == srt[:-1]):
            return p
    keep = np.ones(m, bool)
    # walk backwards so the last occurrence of each (record, key) is kept
    seen = set()
    for i in range(m - 1, -1, -1):
        c = int(combined[i])
        if c in seen:
            keep[i] = False
        else:
            seen.add(c)
    idx = pa.array(np.flatnonzero(keep).astype(np.int32))
    r = p.record_of[keep]
    counts = np.bincount(r, minlength=n)
    map_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=map_offsets[1:])
    return _Props(p.keys.take(idx), p.values.take(idx), map_offsets, p.key_codes[keep], p.dictionary, r)


def _prop_column(p: _Props, n: int, key: str) -> pa.Array:
    if key not in p.dictionary:
        return pa.nulls(n, pa.string())
    code = p.dictionary.index(key)
    hit = np.flatnonzero(p.key_codes == code)
    take = np.full(n, -1, np.int64)
    take[p.record_of[hit]] = hit
    return p.values.take(pa.array(take, mask=take < 0))


def _int_column(strings: pa.Array, typ: pa.DataType) -> pa.Array:
    try:
        return strings.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        lo, hi = (-(1 << 31), (1 << 31) - 1) if typ == pa.int32() else (-(1 << 63), (1 << 63) - 1)
        out = []
        for v in strings.to_pylist():
            try:
                x = int(v) if v is not None else None
                out.append(x if x is None or lo <= x <= hi else None)
            except ValueError:
                out.append(None)
        return pa.array(out, typ)


@dataclass
class _Shape:
    """Length fields of each record and whether they add up to TOTALSIZE (calMsgLength)."""

    sys_flag: np.ndarray
    fixed_len: np.ndarray
    v2: np.ndarray
    tw: np.ndarray
    body_size: np.ndarray
    t_at: np.ndarray
    topic_len: np.ndarray
    p_at: np.ndarray
    props_len: np.ndarray
    ok: np.ndarray


_FIXED_LEN = np.array([d.itemsize for d in L.LAYOUTS], np.int64)


def _shape(u8: np.ndarray, pos: np.ndarray, hdr: "_Header") -> _Shape:
    sizes = hdr.head["total_size"].astype(np.int64)
    sys_flag = hdr.sys_flag
    fixed_len = _FIXED_LEN[hdr.layout]
    v2 = hdr.head["magic"] == L.MAGIC_V2
    body_size = hdr.field("body_size", np.int64)
    tw = np.where(v2, 2, 1)
    body_ok = (body_size >= 0) & (fixed_len + body_size + tw + 2 <= sizes)
    t_at = pos + np.where(body_ok, fixed_len + body_size, 0)
    topic_len = np.where(v2, _read_i16(u8, t_at), u8[t_at].astype(np.int8).astype(np.int64))
    ok = body_ok & (topic_len > 0) & (fixed_len + body_size + tw + topic_len + 2 <= sizes)
    p_at = np.where(ok, t_at + tw + topic_len, pos)
    props_len = _read_i16(u8, p_at)
    ok &= (props_len >= 0) & (fixed_len + body_size + tw + topic_len + 2 + props_len == sizes)
    return _Shape(sys_flag, fixed_len, v2, tw, body_size, t_at, topic_len, p_at, props_len, ok)


def _decode_rows(buf: bytearray, pos: np.ndarray, file_pos: np.ndarray, path: str, base: int,
                 with_body: bool, topic_set, verify_crc: bool, hdr: Optional[_Header] = None,
                 shape: Optional[_Shape] = None) -> tuple:
    anomalies: list = []
    u8 = np.frombuffer(buf, np.uint8)
    n = pos.size
    hdr = hdr if hdr is not None else _Header(u8, pos)
    sh = shape if shape is not None else _shape(u8, pos, hdr)
    sizes = hdr.head["total_size"].astype(np.int64)
    sys_flag, fixed_len, v2, body_size = sh.sys_flag, sh.fixed_len, sh.v2, sh.body_size
    t_at, tw, topic_len, p_at, props_len, shape_ok = sh.t_at, sh.tw, sh.topic_len, sh.p_at, sh.props_len, sh.ok
    if not shape_ok.all():
        for i in np.flatnonzero(~shape_ok).tolist():
            anomalies.append(_anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, int(file_pos[i]), base,
                                      "field lengths do not add up to TOTALSIZE (calMsgLength); record dropped",
                                      int(sizes[i]), "body/topic/properties lengths inconsistent"))
    keep = shape_ok
    topics_start = t_at + tw
    if topic_set is not None or not keep.all():
        if topic_set is not None and keep.any():
            idx_k = np.flatnonzero(keep)
            tps = _to_utf8(_segments(buf, topics_start[idx_k], topics_start[idx_k] + topic_len[idx_k]))
            hit = np.asarray(pc.is_in(tps, value_set=topic_set).fill_null(False))
            keep = np.zeros(n, bool)
            keep[idx_k[hit]] = True
        sel = np.flatnonzero(keep)
        if sel.size < n:
            pos, sizes, file_pos, sys_flag = pos[sel], sizes[sel], file_pos[sel], sys_flag[sel]
            v2, body_size, tw = v2[sel], body_size[sel], tw[sel]
            t_at, topics_start, topic_len, p_at, props_len = \
                t_at[sel], topics_start[sel], topic_len[sel], p_at[sel], props_len[sel]
            fixed_len = fixed_len[sel]
            hdr = hdr.select(sel)
            n = pos.size
    if n == 0:
        return _empty_batch(), anomalies
    body_start = pos + fixed_len
    topic = _to_utf8(_segments(buf, topics_start, topics_start + topic_len))
    props_start = p_at + 2
    props_raw = _segments(buf, props_start, props_start + props_len)
    props = _parse_properties(props_raw)
    stored_phys = hdr.field("physical_offset", np.int64)
    phys = file_pos + base
    bad_phys = stored_phys != phys
    if bad_phys.any():
        for i in np.flatnonzero(bad_phys).tolist():
            anomalies.append(_anomaly(AnomalyKind.PHYSICAL_OFFSET_MISMATCH, path, int(file_pos[i]), base,
                                      "stored PHYSICALOFFSET differs from the record's location",
                                      int(phys[i]), int(stored_phys[i])))
    body_crc = hdr.field("body_crc", np.int64)
    if verify_crc:
        crc32 = zlib.crc32
        mv = memoryview(buf)
        bs, be = body_start.tolist(), (body_start + body_size).tolist()
        computed = np.fromiter((crc32(mv[s:e]) & 0x7FFFFFFF if e > s else 0 for s, e in zip(bs, be)),
                               np.int64, n)
        mv.release()
        crc_ok = computed == body_crc
        for i in np.flatnonzero(~crc_ok).tolist():
            anomalies.append(_anomaly(AnomalyKind.BODY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                      "BODYCRC does not match the stored body", int(body_crc[i]), int(computed[i])))
    else:
        crc_ok = np.ones(n, bool)
    _check_prop_crc(buf, pos, sizes, props, n, path, base, file_pos, anomalies)
    # hosts and offsetMsgId
    born_host = hdr.hosts("born")
    store_host = hdr.hosts("store")
    msg_id = hdr.msg_ids()
    tags = _prop_column(props, n, P.TAGS)
    tags_code = _tags_codes(tags)
    tran_type = pa.DictionaryArray.from_arrays(pa.array(((sys_flag & L.TRANSACTION_MASK) >> 2).astype(np.int8)),
                                               _TX_NAMES).cast(pa.string())
    # index into _COMPRESSION_NAMES: 0 = not compressed, else type bits + 1 (bits 0 and 3 both mean zlib)
    comp_idx = np.where(sys_flag & 1, np.minimum(((sys_flag & 0x700) >> 8) + 1, 5), 0)
    compression = pa.DictionaryArray.from_arrays(pa.array(comp_idx.astype(np.int8)),
                                                 _COMPRESSION_NAMES).cast(pa.string())
    body = _segments(buf, body_start, body_start + body_size) if with_body else pa.nulls(n, pa.binary())
    pmap = pa.MapArray.from_arrays(pa.array(props.map_offsets.astype(np.int32)), props.keys, props.values)
    tran_msg_s = _prop_column(props, n, P.TRAN_MSG)
    cols = {
        "file": pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int8)), pa.array([path])).cast(pa.string()),
        "file_position": pa.array(file_pos, pa.int64()),
        "physical_offset": pa.array(phys, pa.int64()),
        "total_size": pa.array(sizes.astype(np.int32)),
        "magic_version": pa.array(np.where(v2, 2, 1).astype(np.int8)),
        "body_crc": pa.array(body_crc.astype(np.int32)),
        "body_crc_ok": pa.array(crc_ok),
        "queue_id": pa.array(hdr.field("queue_id", np.int32)),
        "flag": pa.array(hdr.field("flag", np.int32)),
        "queue_offset": pa.array(hdr.field("queue_offset", np.int64)),
        "stored_physical_offset": pa.array(stored_phys),
        "sys_flag": pa.array(sys_flag.astype(np.int32)),
        "transaction_type": tran_type,
        "born_timestamp": pa.array(hdr.field("born_timestamp", np.int64)),
        "born_host": born_host,
        "store_timestamp": pa.array(hdr.field("store_timestamp", np.int64)),
        "store_host": store_host,
        "reconsume_times": pa.array(hdr.field("reconsume_times", np.int32)),
        "prepared_transaction_offset": pa.array(hdr.field("prepared_transaction_offset", np.int64)),
        "body_size": pa.array(body_size.astype(np.int32)),
        "topic": topic,
        "properties": pmap,
        "msg_id": msg_id,
        "uniq_key": _prop_column(props, n, P.UNIQ_KEY),
        "tags": tags,
        "keys": _prop_column(props, n, P.KEYS),
        "pgroup": _prop_column(props, n, P.PGROUP),
        "real_topic": _prop_column(props, n, P.REAL_TOPIC),
        "real_qid": _int_column(_prop_column(props, n, P.REAL_QID), pa.int32()),
        "tran_msg": pc.if_else(pc.is_null(tran_msg_s), pa.nulls(n, pa.bool_()), pc.equal(tran_msg_s, "true")),
        "transaction_check_times": _int_column(_prop_column(props, n, P.TRANSACTION_CHECK_TIMES), pa.int32()),
        "tran_prepared_queue_offset": _int_column(_prop_column(props, n, P.TRAN_PREPARED_QUEUE_OFFSET), pa.int64()),
        "check_immunity_time_s": _int_column(_prop_column(props, n, P.CHECK_IMMUNITY_TIME_IN_SECONDS), pa.int64()),
        "transaction_id": _prop_column(props, n, P.TRANSACTION_ID),
        "tags_code": pa.array(tags_code),
        "compression": compression,
        "body": body,
    }
    return pa.RecordBatch.from_arrays([cols[f.name] for f in _SCHEMA], schema=_SCHEMA), anomalies


def _check_prop_crc(buf, pos, sizes, props, n, path, base, file_pos, anomalies) -> None:
    """5.2+ enabledAppendPropCRC records end with "__CRC32#" 0x01 <10 digits> 0x02; the CRC covers every byte
    of the record before those 20 (CommitLog.doAppend / checkMessageAndReturnSize with forceVerifyPropCRC)."""
    if P.CRC32 not in props.dictionary:
        return
    from txlog_io.commitlog import PROP_CRC_RESERVED_LEN, parse_prop_crc

    values = _prop_column(props, n, P.CRC32)
    marker = P.CRC32.encode() + P.NAME_VALUE_SEPARATOR
    for i in np.flatnonzero(np.asarray(values.is_valid())).tolist():
        start, total = int(pos[i]), int(sizes[i])
        tail = bytes(buf[start + total - PROP_CRC_RESERVED_LEN:start + total])
        if not (tail.startswith(marker) and tail.endswith(P.PROPERTY_SEPARATOR)):
            continue            # a property of that name, but not the broker's reserved trailing entry
        expected = parse_prop_crc(values[i].as_py())
        actual = zlib.crc32(memoryview(buf)[start:start + total - PROP_CRC_RESERVED_LEN]) & 0x7FFFFFFF
        if expected != actual:
            anomalies.append(_anomaly(AnomalyKind.PROPERTY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                      "__CRC32# property does not match the record bytes before it",
                                      values[i].as_py(), str(actual)))


def _tags_codes(tags: pa.Array) -> np.ndarray:
    n = len(tags)
    filled = tags.fill_null("")
    bufs = filled.buffers()
    offsets = np.frombuffer(bufs[1], np.int32, n + 1, filled.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    data = data[offsets[0]:offsets[-1]]
    codes = _java_hash_ascii(data, offsets) if n else np.zeros(0, np.int64)
    if data.size and (data >= 0x80).any():
        rec = np.repeat(np.arange(n), np.diff(offsets))
        for i in np.unique(rec[data >= 0x80]).tolist():
            codes[i] = P.java_string_hash(filled[i].as_py())
    return codes


# ------------------------------------------------------------------------------------------- hook: dledger
def decode_records_in(buf, positions: np.ndarray, *, file_pos: int, path: str, base_offset: int,
                      with_body: bool = False, topics: Optional[Iterable[str]] = None,
                      verify_crc: bool = True) -> Iterator[tuple]:
    """Decode the records that start at ``positions`` (sorted, relative to ``buf``) of a chunk read from
    ``path`` at file position ``file_pos``, each lying wholly inside the chunk, followed by at least 128 zero
    bytes.  For framings that wrap records (txlog_io.dledger): the chunk it framed is decoded without a second
    read.  Same results as ``decode_range`` (schema COMMITLOG, physical offset = base_offset + file
    position)."""
    topic_set = None if topics is None else pa.array(sorted(set(topics)), pa.string())
    frame = Frame(buf, int(file_pos), np.asarray(positions, np.int64))
    return _decode_frame(frame, str(path), int(base_offset), with_body, topic_set, verify_crc)
