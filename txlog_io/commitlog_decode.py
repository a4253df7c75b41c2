"""CommitLog framing scanner and decoder (layout: see the comment atop ``txlog_io.commitlog``).

Framing
-------
``scan_range`` walks the TOTALSIZE chain of one mapped file, reading it in bounded chunks with ``preadv`` into
buffers reused from chunk to chunk (``positional.ChunkPool``; not mmap: a file truncated while mapped kills the
process with SIGBUS, which Python cannot catch -- see docs/ARCHITECTURE.md), and
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
``decode_range`` turns a chunk's positions into one Arrow RecordBatch (a filtered decode -- ``topics`` or
``tx_relevant`` -- checks each chunk as it is read but builds one batch per many chunks, see
``_decode_selected``) through the compiled kernels of
``txlog_io.*_kernels`` (header fields, shape check, CRCs, properties split, TAGS hash, hosts, msgId)
and ``txlog_io.commitlog_rows`` (Arrow arrays over the kernels' buffers); no per-record Python on that path.
The chain walk of ``scan_range`` and the boundary search of ``next_boundary`` are kernels too; the rare
irregular positions (damage, BLANK, zero tail, range end) are decided by the Python rules below.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa

from txlog_io import commitlog_kernels as K
from txlog_io import commitlog_layout as L
from txlog_io import text_kernels as T
from txlog_io.commitlog_rows import anomaly as _anomaly
from txlog_io.commitlog_rows import batch_of, check_rows, decode_rows
from txlog_io.commitlog_rows import empty_batch as _empty_batch
from txlog_io.errors import Anomaly, AnomalyKind, UsageError
from txlog_io.positional import ChunkPool, PositionalFile

# 2 MiB: the chunk, its field matrix and its output columns stay close to the core while the kernels pass
# over them, and a batch's fixed cost (~25 us) is still small against its rows.  Measured, CPU time of the
# best of 5 decode passes, load 6-7: 1 KiB records 512/1024/2048/4096 KiB chunks 0.26/0.22/0.195/0.21 s,
# 200 B records 1024/2048/4096 KiB 0.28/0.278/0.31 s (peak RSS 285 -> 259 MB at 200 B)
DEFAULT_CHUNK_BYTES = 2 << 20
_PAD = L.MAX_FIXED_SIZE + 16          # zero padding after a chunk so fixed-size header windows never overrun
BOUNDARY_WINDOW = 64 << 10            # first read of a boundary search (next_boundary), then x4 up to a chunk
_HEADER = struct.Struct(">iI")
_I64 = struct.Struct(">q")
_GOOD_MAGIC = (L.MAGIC_V1, L.MAGIC_V2)


# ------------------------------------------------------------------------------------------------ file access
def file_base_offset(path: str, base_offset: Optional[int] = None) -> int:
    if base_offset is not None:
        return int(base_offset)
    name = Path(path).name
    if len(name) == 20 and name.isdigit():
        return int(name)
    raise UsageError(f"{path}: file name is not a 20-digit offset; pass base_offset explicitly")


def _self_verifies(reader: PositionalFile, pos: int, base_offset: int) -> bool:
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
    return bool(K.shape_ok_at(np.frombuffer(rec + bytes(_PAD), np.uint8), 0, total))


def next_boundary(reader: PositionalFile, pos: int, base_offset: int, limit: Optional[int] = None) -> Optional[int]:
    """First self-verifying record (or BLANK header) at or after ``pos``, searching up to ``limit``."""
    limit = reader.size if limit is None else min(limit, reader.size)
    # a boundary is usually within a record's length: look at a small window first and grow it, instead of
    # reading a whole chunk at every range start (4 MiB per 128 MiB cell, ~3 % of a full scan's bytes)
    window = BOUNDARY_WINDOW
    while pos < limit:
        # a file hole holds no record: one can start at most 7 bytes before the data after it
        pos = max(pos, reader.next_data(pos) - 8)
        if pos >= limit:
            break
        buf = reader.read_chunk(pos, min(window, limit - pos, reader.next_hole(pos) - pos) + 8, _PAD)
        window = min(window * 4, DEFAULT_CHUNK_BYTES)
        n = buf.size - _PAD
        if n < 8:
            return None
        lo, hi = 0, limit - pos
        while True:
            at, undecided = K.find_boundary(buf, lo, hi, n, pos, base_offset, reader.size)
            if at < 0:
                break
            if not undecided or _self_verifies(reader, pos + at, base_offset):
                return pos + at
            lo = at + 1
        pos += n - 7
    return None


def _first_nonzero(reader: PositionalFile, pos: int, limit: int) -> Optional[int]:
    while pos < limit:
        pos = reader.next_data(pos)         # a file hole (the newest file's unwritten tail) is zeros unread
        if pos >= limit:
            return None
        block = reader.pread(pos, min(DEFAULT_CHUNK_BYTES, limit - pos, reader.next_hole(pos) - pos))
        if not block:
            return None
        arr = np.frombuffer(block, np.uint8)
        if arr.any():
            return pos + int((arr != 0).argmax())     # the FIRST non-zero byte, not the largest
        pos += len(block)
    return None


# ------------------------------------------------------------------------------------------------ framing
@dataclass
class Frame:
    """Records found in one chunk: ``positions`` are relative to ``buf``; ``buf`` starts at ``file_pos``."""

    buf: np.ndarray | bytearray
    file_pos: int
    positions: np.ndarray
    anomalies: list = field(default_factory=list)
    fields: Optional[np.ndarray] = None       # commitlog_kernels.fields of the positions, when already known


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
    with PositionalFile(path, "CommitLog file") as reader:
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


def _walk(reader: PositionalFile, base: int, pos: Optional[int], end: int, chunk_bytes: int,
          summary: ScanSummary) -> Iterator[Frame]:
    size = reader.size
    path = reader.path
    min_size = L.MIN_RECORD_SIZE
    v1, v2 = L.MAGIC_V1, L.MAGIC_V2
    unpack = _HEADER.unpack_from
    pool = ChunkPool()
    while pos is not None and pos < size:
        # past the range end only the boundary record has to be looked at: read a little, not a whole chunk;
        # and a file hole is not read as data.  (Shortening the last chunk before the end as well, to
        # min(chunk, end - pos + 64 KiB), made the same reads decode 10-25 % slower in an A/B of
        # `txlog-bench decode`-style runs, cause not found: whole chunks are kept.)
        want = chunk_bytes if pos < end else min(chunk_bytes, 64 << 10)
        want = min(want, max(reader.next_hole(pos) - pos, 64 << 10))
        head = reader.pread(pos, 8)
        if len(head) == 8:
            first_total = _HEADER.unpack(head)[0]
            if first_total > want and pos + first_total <= size:
                want = first_total          # one record larger than a chunk: read exactly that record
        buf = reader.read_chunk(pos, want, _PAD, pool)
        n = len(buf) - _PAD
        found = np.empty(n // min_size + 2, np.int64)
        count = 0
        rel = 0
        anomalies: list = []
        next_pos: Optional[int] = None      # where the following chunk starts; None = the range is finished
        verify_from = end - pos             # at/after this relative position a boundary must self-verify to stop
        while True:
            # the compiled chain walk takes every plain record; what stops it is decided here, exactly
            count, rel = K.chain(buf, rel, n, verify_from, size - pos, found, count)
            if rel + 8 > n:
                if pos + rel + 8 <= size:
                    next_pos = pos + rel    # header crosses the chunk edge: continue in a new chunk
                    break
                fp = pos + rel
                nz = _first_nonzero(reader, fp, size) if fp < size else None
                if nz is not None:
                    anomalies.append(_anomaly(AnomalyKind.TRUNCATED_RECORD, path, fp, base,
                                              "fewer than 8 bytes left for a record header",
                                              "8 bytes", f"{size - fp} bytes", size - fp, data_end=fp))
                elif fp > pos or count:
                    # the broker always leaves >= END_FILE_MIN_BLANK_LENGTH (8) bytes after a record and fills
                    # them with a BLANK header or zeros: a file that ends right after a record was cut there
                    anomalies.append(_anomaly(AnomalyKind.TRUNCATED_FILE, path, fp, base,
                                              "the file ends right after a record, without the BLANK "
                                              "end-of-file filler or zero tail the broker always leaves: it "
                                              "was cut here and the records written after this point are lost",
                                              ">= 8 bytes of BLANK filler or zeros", f"{size - fp} bytes",
                                              data_end=fp))
                summary.valid_end, summary.stop_reason = fp, "end of file"
                break
            total, magic = unpack(buf, rel)  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
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
                found[count] = rel
                count += 1
                rel += total
                continue
            if magic == L.BLANK_MAGIC:
                if fp + total != size:
                    anomalies.append(_anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, fp, base,
                                              "BLANK end-of-file header length does not reach the file end",
                                              size - fp, total, size - fp))
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
        rel_pos = found[:count]
        if count or anomalies:
            f = K.fields(buf, rel_pos) if count else None
            if f is not None and not f[K.F_OK].all():
                # a record whose lengths do not add up may have a wrong TOTALSIZE that jumped over intact
                # records: look for self-verifying records inside its claimed span and decode them too
                extra = []
                for i in np.flatnonzero(f[K.F_OK] == 0).tolist():
                    fp = pos + int(rel_pos[i])
                    extra += [q - pos for q in _recover_inside(reader, base, fp, int(f[K.F_TOTAL, i]), end)]
                if extra:
                    rel_pos = np.unique(np.concatenate([rel_pos, np.asarray(extra, np.int64)]))
                    f = K.fields(buf, rel_pos)
            summary.records += int(rel_pos.size) - (int((f[K.F_OK] == 0).sum()) if f is not None else 0)
            summary.anomalies += len(anomalies)
            if rel_pos.size:
                last = int(rel_pos[-1])
                summary.valid_end = max(summary.valid_end, pos + last + _HEADER.unpack_from(buf, last)[0])  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
            yield Frame(buf, pos, rel_pos, anomalies, f)
        pos = next_pos


def _recover_inside(reader: PositionalFile, base: int, fp: int, claimed: int, end: int) -> list:
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
                                  expected, actual, reader.size - fp))
        summary.skipped_bytes += reader.size - fp
        summary.stop_reason = f"{kind} with no valid record after it"
        return None
    anomalies.append(_anomaly(kind, reader.path, fp, base,
                              f"{detail}; resynchronised at file position {nxt} ({nxt - fp} bytes skipped)",
                              expected, actual, nxt - fp))
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
                                  f"non-zero bytes after the end of data at {fp}", "zeros", "non-zero bytes",
                                  reader.size - nz, data_end=fp))
        summary.skipped_bytes += reader.size - nz
        return None
    anomalies.append(_anomaly(AnomalyKind.RESYNC, reader.path, fp, base,
                              f"zero gap {fp}..{nxt} inside the data; records resume at {nxt}",
                              "contiguous records", f"{nxt - fp} zero/garbage bytes", nxt - fp))
    summary.skipped_bytes += nxt - fp
    return nxt if nxt < end else None


# ------------------------------------------------------------------------------------------------ decoding
def decode_range(path: str, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                 with_body: bool = False, topics: Optional[Iterable[str]] = None, verify_crc: bool = True,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, summary: Optional[ScanSummary] = None,
                 tx_relevant: bool = False) -> Iterator[tuple]:
    """Decode the records ``[start, end)`` owns into ``(RecordBatch, anomalies)`` pairs (schema COMMITLOG).

    ``topics``: keep only records of these topics (filter pushdown; decided before properties/bodies are cut).
    ``tx_relevant``: keep only transaction-relevant records (type not NOT, magic V2, or a half / op / discard
    topic; with ``topics``, those topics instead of the system topics).  Either way every record is still
    framed and checked (stored offset, body CRC, ``__CRC32#``) and its findings are reported: one pass gives
    the rows and the findings.
    ``verify_crc``: compute the body CRC of every record (``body_crc_ok``); without it ``body_crc_ok`` is true.
    """
    base = file_base_offset(path, base_offset)
    topic_set = None if topics is None else K.pack_strings(sorted(set(topics)))
    frames = scan_range(path, base_offset=base, start=start, end=end, chunk_bytes=chunk_bytes, summary=summary)
    if topic_set is not None or tx_relevant:
        yield from _decode_selected(frames, str(path), base, with_body, topic_set, verify_crc, tx_relevant)
        return
    for frame in frames:
        yield from _decode_frame(frame, str(path), base, with_body, topic_set, verify_crc)


#: a filtered decode (``topics`` / ``tx_relevant``) builds one batch per this many selected rows or bytes
SELECTED_FLUSH_ROWS = 16384
SELECTED_FLUSH_BYTES = 16 << 20


def _decode_selected(frames: Iterable[Frame], path: str, base: int, with_body: bool, topic_set,
                     verify_crc: bool, tx_relevant: bool) -> Iterator[tuple]:
    """``decode_range`` when few records become rows: every chunk is checked as it is read, and the selected
    records' bytes are copied aside (one gather kernel call per chunk) until enough of them make one batch.
    A batch per 4 MiB chunk cost ~0.3 ms of Arrow building whatever its row count -- in a full audit (~1 %
    of the records selected) more than the body CRCs of the chunk's records."""
    parts: list = []
    starts: list = []
    fpos: list = []
    crcs: list = []
    found: list = []
    rows = size = 0
    for frame in frames:
        found.extend(frame.anomalies)
        if frame.positions.size:
            u8 = np.frombuffer(frame.buf, np.uint8)
            f, pos, file_pos, crc_ok, anomalies = check_rows(
                u8, frame.positions, frame.positions + frame.file_pos, path, base, topic_set, verify_crc,
                frame.fields, tx_relevant)
            found.extend(anomalies)
            if pos.size * 4 >= frame.positions.size:
                # a filter that keeps many of the records (a notebook's topic filter): the chunk is a batch
                # of its own, as without a filter -- gathering it aside would only copy it twice more
                if rows:
                    yield _selected_batch(parts, starts, fpos, crcs, path, base, with_body), []
                    parts, starts, fpos, crcs, rows, size = [], [], [], [], 0, 0
                yield batch_of(u8, pos, file_pos, base, path, with_body, crc_ok, f), found
                found = []
                continue
            if pos.size:
                ends = pos + f[K.F_TOTAL]
                data = np.empty(T.gather_size(pos, ends), np.uint8)
                starts.append(T.gather(u8, pos, ends, np.empty(pos.size + 1, np.int32), data)[:-1]
                              + np.int64(size))
                parts.append(data)
                fpos.append(file_pos)
                crcs.append(crc_ok)
                rows += pos.size
                size += data.size
        if rows >= SELECTED_FLUSH_ROWS or size >= SELECTED_FLUSH_BYTES:
            yield _selected_batch(parts, starts, fpos, crcs, path, base, with_body), found
            parts, starts, fpos, crcs, found, rows, size = [], [], [], [], [], 0, 0
    if rows or found:
        yield _selected_batch(parts, starts, fpos, crcs, path, base, with_body), found


def _selected_batch(parts: list, starts: list, fpos: list, crcs: list, path: str, base: int,
                    with_body: bool) -> pa.RecordBatch:
    if not parts:
        return _empty_batch()
    u8 = np.concatenate(parts + [np.zeros(_PAD, np.uint8)])
    return batch_of(u8, np.concatenate(starts), np.concatenate(fpos), base, path, with_body,
                    np.concatenate(crcs))


def decode_file(path: str, **kwargs) -> Iterator[tuple]:
    return decode_range(path, **kwargs)


#: indexed reads: positions closer than this on average are served by one read of their whole window
FETCH_DENSE_GAP = 64 << 10
FETCH_WINDOW = 8 << 20              # bytes spanned by one window read (plus the last record)
_PROBE = L.SYS_FLAG_OFFSET + 4      # header bytes that say where a record ends and its transaction type
#: bytes a window read takes past its last position: most records end within them, a longer one is read by
#: its own pread (64 KiB cost 62 KiB of extra reading per window of 1 KiB records: an indexed audit of a
#: 4 GiB store, 2,912 transactions, read 44.3 MB of CommitLog with 64 KiB, 35.8 MB with 4 KiB)
FETCH_WINDOW_TAIL = 4 << 10
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
    with PositionalFile(path, "CommitLog file") as reader:
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


def _fetch_one(reader: PositionalFile, base: int, p: int, probe_only: bool, parts: list, file_pos: list,
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


def _fetch_window(reader: PositionalFile, base: int, pos: np.ndarray, probe_only: np.ndarray, parts: list,
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
    buf = reader.read_chunk(start, int(pos[-1]) - start + FETCH_WINDOW_TAIL, _PAD)  # zero padding: every probe
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
    view = memoryview(buf)  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
    for k in np.flatnonzero(keep).tolist():
        r, t = int(rel[k]), int(total[k])
        parts.append(view[r:r + t] if r + t <= data_len else reader.pread(int(pos[k]), t))
        file_pos.append(int(pos[k]))
    anomalies.extend(a for a in outside if a.position >= 0)


def _decode_frame(frame: Frame, path: str, base: int, with_body: bool, topic_set, verify_crc: bool,
                  file_positions: Optional[np.ndarray] = None, tx_relevant: bool = False) -> Iterator[tuple]:
    """One RecordBatch per frame (a frame holds at most chunk_bytes / 91 records)."""
    if frame.positions.size == 0:
        if frame.anomalies:
            yield _empty_batch(), frame.anomalies
        return
    fpos = file_positions if file_positions is not None else frame.positions + frame.file_pos
    batch, anomalies = decode_rows(frame.buf, frame.positions, fpos, path, base, with_body, topic_set,
                                   verify_crc, frame.fields, tx_relevant)
    yield batch, list(frame.anomalies) + anomalies


def decode_records_in(buf, positions: np.ndarray, *, file_pos: int, path: str, base_offset: int,
                      with_body: bool = False, topics: Optional[Iterable[str]] = None,
                      verify_crc: bool = True, tx_relevant: bool = False) -> Iterator[tuple]:
    """Decode the records that start at ``positions`` (sorted, relative to ``buf``) of a chunk read from
    ``path`` at file position ``file_pos``, each lying wholly inside the chunk, followed by at least 128 zero
    bytes.  For framings that wrap records (txlog_io.dledger): the chunk it framed is decoded without a second
    read.  Same results as ``decode_range`` (schema COMMITLOG, physical offset = base_offset + file
    position)."""
    topic_set = None if topics is None else K.pack_strings(sorted(set(topics)))
    frame = Frame(buf, int(file_pos), np.asarray(positions, np.int64))
    return _decode_frame(frame, str(path), int(base_offset), with_body, topic_set, verify_crc,
                         tx_relevant=tx_relevant)
