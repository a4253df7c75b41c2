"""DLedger (Raft) CommitLog stores: data files, index files, checkpoint and currterm -- decoders and encoders.

Sources: openmessaging/dledger 0.3.1.2 (the version RocketMQ 4.9.8 pins): store/file/DLedgerMmapFileStore.java
(recover, persistCheckPoint, MAGIC_1), store/file/MmapFileList.java (BLANK_MAGIC_CODE, append / roll rule),
entry/DLedgerEntryCoder.java (encode, encodeIndex, decode), entry/DLedgerEntry.java (BODY_OFFSET = 48),
MemberState.java (currterm); RocketMQ 4.9.8 store/dledger/DLedgerCommitLog.java (recover: the dividing offset,
checkMessageAndReturnSize: the RocketMQ record inside the entry).  Layout notes in docs/dledger.md.

Store layout below storePathRootDir (DLedgerConfig.storeBaseDir = <root>/dledger-<selfId>)::

    dledger-<id>/data/<20-digit offset>     entry files (mappedFileSizeForEntryData, RocketMQ passes
                                            mappedFileSizeCommitLog); name = DLedger offset of the first byte
    dledger-<id>/index/<20-digit offset>    32-byte index units; unit of entry index i at offset i * 32; the
                                            file size is configurable and stored nowhere (inferred from files)
    dledger-<id>/checkpoint (+ .bak)        text: committedIndex=N / endIndex=N
    dledger-<id>/currterm (+ .bak)          text: voteLeader=<id> / currTerm=N

Entry (all big-endian)::

    off  size  field
    0    4     magic        1 (MAGIC_1)
    4    4     size         48 + bodySize (the whole entry)
    8    8     index        0, 1, 2, ... contiguous across files
    16   8     term
    24   8     pos          DLedger offset of this entry = file name + file position
    32   4     channel      0
    36   4     chainCrc     0 in 0.3.1.2 (not computed)
    40   4     bodyCrc      0 in 0.3.1.2 (not computed)
    44   4     bodySize     = the RocketMQ record's TOTALSIZE
    48   n     body         exactly one RocketMQ v1/v2 CommitLog record

A file ends with ``[int32 -1][int32 bytes left]`` (the reverse of RocketMQ's BLANK) when the next entry does
not fit with 8 spare bytes; the newest file ends in zeros.  RocketMQ's physical offset of a message is
``pos + 48`` (PHYSICALOFFSET field, offsetMsgId, consume-queue units), so the message at file position ``p``
of a data file has physical offset ``file name + p`` exactly as in a plain CommitLog file: record decoding and
indexed reads (``commitlog_decode.decode_at``) work on data files unchanged once the entries are framed here.

Framing rules (the same promises as ``commitlog_decode``): any bytes in, typed findings with file and
position; damage resynchronises at the next *plausible* entry header (magic 1, a size that fits, and a ``pos``
field equal to the file's offset + position -- message bytes essentially never satisfy that).  A byte range
``[start, end)`` owns the entries whose *message* starts in it (``pos + 48``), matching the offsets consume
queues and CommitLog ranges speak in, so split ranges yield every record once.
"""
from __future__ import annotations

import functools
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Optional

import numpy as np
import pyarrow as pa

from txlog_io import commitlog_kernels as K
from txlog_io import commitlog_layout as L
from txlog_io.commitlog_decode import DEFAULT_CHUNK_BYTES, ScanSummary, decode_records_in, file_base_offset
from txlog_io.errors import Anomaly, AnomalyKind, EncodeError
from txlog_io.positional import PositionalFile

SOURCE = "dledger"
MAGIC_1 = 1
BLANK_MAGIC = -1                      # MmapFileList.BLANK_MAGIC_CODE
ENTRY_HEADER = struct.Struct(">iiqqqiiii")   # magic size index term pos channel chainCrc bodyCrc bodySize
ENTRY_HEADER_SIZE = ENTRY_HEADER.size        # 48 = DLedgerEntry.BODY_OFFSET
END_MARKER = struct.Struct(">ii")            # magic (-1), bytes left in the file
INDEX_UNIT = struct.Struct(">iqiqq")         # magic pos size index term
INDEX_UNIT_SIZE = INDEX_UNIT.size            # 32 = DLedgerMmapFileStore.INDEX_UNIT_SIZE
MIN_ENTRY_SIZE = ENTRY_HEADER_SIZE + L.MIN_RECORD_SIZE
_PROBE = ENTRY_HEADER_SIZE + L.PHYSICAL_OFFSET_OFFSET + 8   # entry header + inner record up to PHYSICALOFFSET
_INNER = struct.Struct(">iI")
assert ENTRY_HEADER_SIZE == 48 and INDEX_UNIT_SIZE == 32   # layout self-check, not input validation

CHECKPOINT_FILE = "checkpoint"
CURRTERM_FILE = "currterm"
COMMITTED_INDEX_KEY = "committedIndex"
END_INDEX_KEY = "endIndex"


def is_dledger_data_file(path) -> bool:
    """A file of ``dledger-<id>/data/`` (DLedgerConfig.getDataStorePath): framed by this module."""
    p = Path(path)
    return p.parent.name == "data" and p.parent.parent.name.startswith("dledger-")


# ------------------------------------------------------------------------------------------------ encoders
def encode_entry(body: bytes, *, index: int, term: int, pos: int, channel: int = 0, chain_crc: int = 0,
                 body_crc: int = 0, magic: int = MAGIC_1) -> bytes:
    """DLedgerEntryCoder.encode: the 48-byte header then ``body`` (one encoded RocketMQ record)."""
    if index < 0 or term < 0 or pos < 0:
        raise EncodeError("DLedger entry", "non-negative index, term and pos", (index, term, pos))
    return ENTRY_HEADER.pack(magic, ENTRY_HEADER_SIZE + len(body), index, term, pos, channel, chain_crc,
                             body_crc, len(body)) + body


def encode_end_marker(bytes_left: int) -> bytes:
    """The end-of-file filler header MmapFileList.append writes: [-1][bytes left]; the rest stays zero."""
    if bytes_left < END_MARKER.size:
        raise EncodeError("DLedger end marker", f">= {END_MARKER.size} bytes left", bytes_left)
    return END_MARKER.pack(BLANK_MAGIC, bytes_left)


def encode_index_unit(*, pos: int, size: int, index: int, term: int, magic: int = MAGIC_1) -> bytes:
    """DLedgerEntryCoder.encodeIndex."""
    return INDEX_UNIT.pack(magic, pos, size, index, term)


def encode_checkpoint(committed_index: int, end_index: int) -> bytes:
    """DLedgerMmapFileStore.persistCheckPoint (java.util.Properties text as IOUtils.properties2String)."""
    return f"{COMMITTED_INDEX_KEY}={committed_index}\n{END_INDEX_KEY}={end_index}\n".encode()


def encode_currterm(vote_leader: Optional[str], term: int) -> bytes:
    """MemberState.persistState (voteLeader is left out while there is none)."""
    lead = f"voteLeader={vote_leader}\n" if vote_leader else ""
    return f"{lead}currTerm={term}\n".encode()


class DataLog:
    """An in-memory DLedger log being appended to, laid out exactly as MmapFileList.append does (used by tests
    and the reference broker): ``append(record_for)`` takes a function physical offset -> encoded record bytes
    (the record's PHYSICALOFFSET is ``pos + 48``) and returns (index, physical offset of the message)."""

    def __init__(self, file_size: int, start_offset: int = 0, first_index: int = 0, term: int = 0):
        if file_size < MIN_ENTRY_SIZE + END_MARKER.size:
            raise EncodeError("DLedger data file size", f">= {MIN_ENTRY_SIZE + END_MARKER.size}", file_size)
        self.file_size = file_size
        self.files: list = [[start_offset, bytearray()]]      # [base offset, bytes written]
        self.next_index = first_index
        self.term = term
        self.units: list = []                                 # (index, pos, size, term)

    @property
    def end_offset(self) -> int:
        base, data = self.files[-1]
        return base + len(data)

    def append(self, record_for) -> tuple:
        base, data = self.files[-1]
        # the size is known only once encoded; the position is known before (RocketMQ fixes it the same way)
        probe = record_for(self.end_offset + ENTRY_HEADER_SIZE)
        size = ENTRY_HEADER_SIZE + len(probe)
        if size > self.file_size - END_MARKER.size:
            raise EncodeError("DLedger entry", f"<= {self.file_size - END_MARKER.size} bytes", size)
        if size + END_MARKER.size > self.file_size - len(data):       # roll: end marker, then a new file
            data += encode_end_marker(self.file_size - len(data))
            data += bytes(self.file_size - len(data))
            self.files.append([base + self.file_size, bytearray()])
            base, data = self.files[-1]
            probe = record_for(self.end_offset + ENTRY_HEADER_SIZE)
        pos = base + len(data)
        index = self.next_index
        data += encode_entry(probe, index=index, term=self.term, pos=pos)
        self.units.append((index, pos, size, self.term))
        self.next_index += 1
        return index, pos + ENTRY_HEADER_SIZE

    def write(self, dledger_dir, index_file_size: int = 160 << 20, committed_index: Optional[int] = None,
              vote_leader: Optional[str] = None) -> None:
        """Files under ``dledger_dir`` (data/, index/, checkpoint + .bak, currterm + .bak); every data and index
        file full size (DLedger maps them whole), the newest zero-filled past the data."""
        root = Path(dledger_dir)
        (root / "data").mkdir(parents=True, exist_ok=True)
        (root / "index").mkdir(parents=True, exist_ok=True)
        for base, data in self.files:
            (root / "data" / f"{base:020d}").write_bytes(bytes(data) + bytes(self.file_size - len(data)))
        if index_file_size % INDEX_UNIT_SIZE:
            raise EncodeError("DLedger index file size", "a multiple of 32", index_file_size)
        index_bytes: bytes | bytearray = bytearray()
        first = self.units[0][0] if self.units else 0
        for index, pos, size, term in self.units:
            index_bytes += encode_index_unit(pos=pos, size=size, index=index, term=term)
        start = first * INDEX_UNIT_SIZE
        file_base = start - start % index_file_size
        index_bytes = bytes(start - file_base) + bytes(index_bytes)
        for k in range(0, max(1, len(index_bytes)), index_file_size):
            chunk = index_bytes[k:k + index_file_size]
            (root / "index" / f"{file_base + k:020d}").write_bytes(chunk + bytes(index_file_size - len(chunk)))
        end_index = self.next_index - 1
        for name, text in ((CHECKPOINT_FILE, encode_checkpoint(
                end_index if committed_index is None else committed_index, end_index)),
                           (CURRTERM_FILE, encode_currterm(vote_leader, self.term))):
            (root / name).write_bytes(text)
            (root / (name + ".bak")).write_bytes(text)


# ---------------------------------------------------------------------------------------------- entry framing
def _plausible(f: PositionalFile, fp: int, base: int) -> bool:
    head = f.pread(fp, ENTRY_HEADER_SIZE)
    if len(head) < ENTRY_HEADER_SIZE:
        return False
    magic, size, _, _, pos, *_ = ENTRY_HEADER.unpack(head)
    return magic == MAGIC_1 and size >= MIN_ENTRY_SIZE and fp + size <= f.size and pos == base + fp


def next_entry(f: PositionalFile, fp: int, base: int, limit: Optional[int] = None) -> Optional[int]:
    """First plausible entry header at or after file position ``fp`` (searching up to ``limit``)."""
    limit = f.size if limit is None else min(limit, f.size)
    fp = max(0, fp)
    while fp < limit:
        block = f.pread(fp, min(DEFAULT_CHUNK_BYTES, limit - fp) + ENTRY_HEADER_SIZE)
        u8 = np.frombuffer(block, np.uint8)
        n = u8.size - ENTRY_HEADER_SIZE
        if n <= 0:
            return None
        c = np.flatnonzero(u8[3:n + 3] == MAGIC_1)
        c = c[(u8[c] == 0) & (u8[c + 1] == 0) & (u8[c + 2] == 0)]
        if c.size:
            pos_field = np.lib.stride_tricks.sliding_window_view(u8, 8)[c + 24].copy().view(">i8").ravel()
            c = c[pos_field == base + fp + c]
        for q in c.tolist():
            if _plausible(f, fp + q, base):
                return fp + q
        fp += n
    return None


# ------------------------------------------------------------------------------------------------ framing
ENTRY_FIELDS = ("file_position", "magic", "size", "index", "term", "pos", "channel", "chain_crc", "body_crc",
                "body_size")


#: an entry header plus the first 8 bytes of its record, gathered for every entry of a chunk at once
ENTRY_DTYPE = np.dtype([("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"), ("pos", ">i8"),
                        ("channel", ">i4"), ("chain_crc", ">i4"), ("body_crc", ">i4"), ("body_size", ">i4"),
                        ("inner_total", ">i4"), ("inner_magic", ">u4")])
_GATHER = ENTRY_DTYPE.itemsize           # 56
_PAD = 256                               # zero bytes after a chunk (covers the CommitLog decoder's windows)


@dataclass
class EntryFrame:
    """Entries framed in one chunk.  ``buf`` holds the chunk (read at file position ``file_pos``, zero padded);
    ``positions`` are the entries' positions relative to ``buf`` and ``headers`` their ENTRY_DTYPE rows;
    ``messages`` the relative positions of the RocketMQ records to decode (entry + 48; none for an entry whose
    message is not a record).  Every entry listed lies wholly inside ``buf``."""

    buf: np.ndarray
    file_pos: int
    positions: np.ndarray
    messages: np.ndarray
    anomalies: list = field(default_factory=list)

    @functools.cached_property
    def headers(self) -> np.ndarray:
        """ENTRY_DTYPE rows of the entries (gathered on first use: decoding does not need them)."""
        return _headers(self.buf, self.positions)

    @property
    def entries(self) -> list:
        """Tuples of ENTRY_FIELDS."""
        h = self.headers
        return list(zip((self.positions + self.file_pos).tolist(), *(h[n].tolist() for n in ENTRY_FIELDS[1:]),
                        strict=True))


def _anomaly(kind, path, fp, base, detail, expected=None, actual=None, source=SOURCE, length=None,
             data_end: Optional[int] = None) -> Anomaly:
    """A finding at file position ``fp``; ``data_end``: a torn end's file position where the data ends."""
    return Anomaly(kind=kind, file=str(path), position=int(fp), detail=detail,
                   expected=None if expected is None else str(expected),
                   actual=None if actual is None else str(actual), source=source,
                   physical_offset=int(base + fp), length=None if length is None else int(length),
                   data_end=None if data_end is None else int(base + data_end))


def scan_entries(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 summary: Optional[ScanSummary] = None) -> Iterator[EntryFrame]:
    """Frame the entries of a data file whose message starts in ``[start, end)``; one EntryFrame per chunk."""
    base = file_base_offset(str(path), base_offset)
    with PositionalFile(path, "DLedger data file") as f:
        end = f.size if end is None else max(0, min(end, f.size))
        summary = summary if summary is not None else ScanSummary(str(path), start, end)
        summary.file, summary.start, summary.end = str(path), start, end
        if start >= end or start >= f.size:
            summary.stop_reason = "empty range"
            return
        fp = 0 if start <= 0 else next_entry(f, start - ENTRY_HEADER_SIZE, base, limit=end)
        if fp is None:
            summary.stop_reason = "no entry starts in range"
            return
        yield from _walk(f, base, fp, end, chunk_bytes, summary)


def _walk(f: PositionalFile, base: int, fp: Optional[int], end: int, chunk_bytes: int,
          summary: ScanSummary) -> Iterator[EntryFrame]:
    path, size = f.path, f.size
    stop_at = end - ENTRY_HEADER_SIZE      # an entry at or past this owns a message at or past ``end``
    prev_at: Optional[int] = None          # the entry whose size led to ``at`` (its size may be the damage)
    while fp is not None and fp < size:
        first = f.pread(fp, 8)
        want = chunk_bytes
        if len(first) == 8:
            magic0, size0 = END_MARKER.unpack(first)
            if magic0 == MAGIC_1 and chunk_bytes < size0 and fp + size0 <= size:
                want = size0               # one entry larger than a chunk: read exactly that entry
        buf = f.read_chunk(fp, want, _PAD)
        n = buf.size - _PAD
        anomalies: list = []
        fast, odd = K.entry_chain(buf, n, base + fp, stop_at - fp, MIN_ENTRY_SIZE, _GATHER)
        slow: list = []
        rel = 0
        if fast.size:
            rel = int(fast[-1]) + END_MARKER.unpack_from(buf, int(fast[-1]))[1]  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
            prev_at = fp + int(fast[-1])
        nxt: Optional[int] = None          # where the next chunk starts; None = finished
        while True:
            at = fp + rel
            # damage found where the previous entry's size led: search again from inside that entry
            search_from = prev_at + ENTRY_HEADER_SIZE if prev_at is not None and prev_at < at else at + 1
            if at + END_MARKER.size > size:
                if at < size and any(f.pread(at, size - at)):
                    anomalies.append(_anomaly(AnomalyKind.TRUNCATED_RECORD, path, at, base,
                                              "fewer than 8 bytes left for an entry header", "8 bytes",
                                              f"{size - at} bytes", length=size - at, data_end=at))
                summary.valid_end, summary.stop_reason = at, "end of file"
                break
            if rel + END_MARKER.size > n:
                nxt = at
                break
            magic, esize = END_MARKER.unpack_from(buf, rel)  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
            if magic == MAGIC_1 and rel + esize > n and fp + n < size and at + esize <= size and rel > 0:
                nxt = at                   # the entry continues past this chunk: the next chunk starts with it
                break
            if at >= stop_at and magic == MAGIC_1 and _plausible(f, at, base):
                summary.valid_end, summary.stop_reason = at, "end of range"
                break
            if magic == BLANK_MAGIC:
                if esize != size - at:
                    anomalies.append(_anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, at, base,
                                              "DLedger end-of-file marker length does not reach the file end",
                                              size - at, esize, length=size - at))
                summary.valid_end, summary.stop_reason = at, "DLedger end-of-file marker"
                break
            if magic == 0 and esize == 0:
                summary.valid_end, summary.stop_reason = at, "zero-filled tail (end of data)"
                nxt = _zero_tail(f, base, at, stop_at, anomalies, summary, search_from)
                break
            if magic != MAGIC_1 or at + ENTRY_HEADER_SIZE > size:
                nxt = _resync(f, base, at, stop_at, anomalies, summary, AnomalyKind.BAD_MAGIC,
                              "no DLedger entry header here", "magic 1 or end marker -1", magic, search_from,
                              prev_at)
                break
            if esize < MIN_ENTRY_SIZE or at + esize > size:
                pos = struct.unpack_from(">q", buf, rel + 24)[0] if rel + 32 <= n else None  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
                kind = AnomalyKind.TRUNCATED_RECORD if at + esize > size and pos == base + at else \
                    AnomalyKind.BAD_TOTAL_SIZE
                nxt = _resync(f, base, at, stop_at, anomalies, summary, kind,
                              f"entry size {esize} impossible here", f"{MIN_ENTRY_SIZE}..{size - at}", esize,
                              at + 1, None)
                break
            slow.append(rel)
            prev_at = at
            rel += esize
        if slow:
            positions = np.concatenate([fast, np.asarray(slow, np.int64)])
            odd = np.concatenate([odd, np.ones(len(slow), bool)])
        else:
            positions = fast
        frame = _frame(buf, fp, positions, base, path, anomalies, odd)
        summary.records += int(positions.size)
        if positions.size:
            last = int(positions[-1])
            summary.valid_end = max(summary.valid_end, fp + last + END_MARKER.unpack_from(buf, last)[1])  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
        summary.anomalies += len(frame.anomalies)
        if positions.size or frame.anomalies:
            yield frame
        fp = nxt


def _headers(buf: np.ndarray, positions: np.ndarray) -> np.ndarray:
    if not positions.size:
        return np.zeros(0, ENTRY_DTYPE)
    return np.lib.stride_tricks.sliding_window_view(buf, _GATHER)[positions].copy().view(ENTRY_DTYPE).ravel()


def _frame(buf: np.ndarray, fp: int, all_positions: np.ndarray, base: int, path: str, anomalies: list,
           odd: np.ndarray) -> EntryFrame:
    """The chunk's entries with their checks: header vs itself, header vs the record inside.  Only the ``odd``
    entries (those the chain kernel did not find regular) are gathered and checked here."""
    odd_at = np.flatnonzero(odd)
    if not odd_at.size:
        return EntryFrame(buf, fp, all_positions, all_positions + ENTRY_HEADER_SIZE, anomalies)
    positions = all_positions[odd_at]
    h = _headers(buf, positions)
    sizes = h["size"].astype(np.int64)
    room = sizes - ENTRY_HEADER_SIZE
    total = h["inner_total"].astype(np.int64)
    good_magic = (h["inner_magic"] == L.MAGIC_V1) | (h["inner_magic"] == L.MAGIC_V2)
    has_record = good_magic & (total >= L.MIN_RECORD_SIZE) & (total <= room)
    bad = (h["pos"] != base + fp + positions) | (h["body_size"] != room) | ~good_magic | (total != room)
    for i in np.flatnonzero(bad).tolist():
        at, index = fp + int(positions[i]), int(h["index"][i])
        if h["pos"][i] != base + at:
            anomalies.append(_anomaly(AnomalyKind.DLEDGER_ENTRY_MISMATCH, path, at, base,
                                      f"entry {index}: pos field differs from the entry's offset", base + at,
                                      int(h["pos"][i])))
        if h["body_size"][i] != room[i]:
            anomalies.append(_anomaly(AnomalyKind.DLEDGER_ENTRY_MISMATCH, path, at, base,
                                      f"entry {index}: bodySize differs from size - 48", int(room[i]),
                                      int(h["body_size"][i])))
        msg = at + ENTRY_HEADER_SIZE
        if not good_magic[i]:
            anomalies.append(_anomaly(AnomalyKind.BAD_MAGIC, path, msg, base,
                                      f"entry {index} holds no RocketMQ record (message dropped; the entry "
                                      "framing continues)", "magic 0xDAA320A7/0xDAA320AB",
                                      f"0x{int(h['inner_magic'][i]):08X}"))
        elif total[i] != room[i]:
            anomalies.append(_anomaly(AnomalyKind.DLEDGER_ENTRY_MISMATCH, path, msg, base,
                                      f"entry {index}: the record's TOTALSIZE differs from the entry's body size"
                                      + ("" if has_record[i] else "; record dropped"), int(room[i]),
                                      int(total[i])))
    keep = np.ones(all_positions.size, bool)
    keep[odd_at] = has_record
    return EntryFrame(buf, fp, all_positions, all_positions[keep] + ENTRY_HEADER_SIZE, anomalies)


def _resync(f: PositionalFile, base, at, stop_at, anomalies, summary, kind, detail, expected, actual, search_from: int,
            prev_at: Optional[int]) -> Optional[int]:
    nxt = next_entry(f, search_from, base)
    if nxt is not None and prev_at is not None and nxt < at:   # (nxt < at: prev_at set, see _walk)
        anomalies.append(_anomaly(AnomalyKind.BAD_TOTAL_SIZE, f.path, prev_at, base,
                                  f"the entry's size leads to {at}, where {detail.lower()}; the next entry "
                                  f"starts at {nxt}: resynchronised there", nxt - prev_at, at - prev_at,
                                  length=nxt - prev_at))
        return nxt if nxt < stop_at else None
    torn = at if kind == AnomalyKind.TRUNCATED_RECORD else None
    if nxt is None:
        anomalies.append(_anomaly(kind, f.path, at, base, f"{detail}; no entry follows (bytes {at}..{f.size} "
                                  "unreadable)", expected, actual, length=f.size - at, data_end=torn))
        summary.skipped_bytes += f.size - at
        summary.stop_reason = f"{kind} with no entry after it"
        return None
    anomalies.append(_anomaly(kind, f.path, at, base, f"{detail}; resynchronised at file position {nxt} "
                              f"({nxt - at} bytes skipped)", expected, actual, length=nxt - at, data_end=torn))
    summary.skipped_bytes += nxt - at
    return nxt if nxt < stop_at else None


def _zero_tail(f: PositionalFile, base, at, stop_at, anomalies, summary, search_from: int) -> Optional[int]:
    pos = at
    while pos < f.size:
        block = np.frombuffer(f.pread(pos, DEFAULT_CHUNK_BYTES), np.uint8)
        if block.any():
            nz = pos + int(block.argmax())
            nxt = next_entry(f, min(max(at, nz - 3), search_from), base)
            if nxt is None:
                anomalies.append(_anomaly(AnomalyKind.GARBAGE_AFTER_END, f.path, nz, base,
                                          f"non-zero bytes after the end of data at {at}", "zeros",
                                          "non-zero bytes", length=f.size - nz, data_end=at))
                summary.skipped_bytes += f.size - nz
                return None
            anomalies.append(_anomaly(AnomalyKind.RESYNC, f.path, at, base,
                                      f"zero gap {at}..{nxt} inside the data; entries resume at {nxt}",
                                      "contiguous entries", f"{nxt - at} zero/garbage bytes",
                                      length=max(0, nxt - at)))
            summary.skipped_bytes += max(0, nxt - at)
            return nxt if nxt < stop_at else None
        pos += block.size
    return None


# ------------------------------------------------------------------------------------------------ decoding
def decode_range(path, *, base_offset: Optional[int] = None, start: int = 0, end: Optional[int] = None,
                 with_body: bool = False, topics: Optional[Iterable[str]] = None, verify_crc: bool = True,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, summary: Optional[ScanSummary] = None,
                 tx_relevant: bool = False) -> Iterator[tuple]:
    """``commitlog_decode.decode_range`` for a DLedger data file: ``(RecordBatch, anomalies)`` pairs, schema
    COMMITLOG, rows = the RocketMQ records of the entries whose message starts in ``[start, end)``.  The
    records are decoded by the CommitLog decoder from the chunk the entries were framed in
    (``commitlog_decode.decode_records_in``); ``file_position``
    and ``physical_offset`` are those of the message (entry position + 48)."""
    base = file_base_offset(str(path), base_offset)
    for frame in scan_entries(path, base_offset=base, start=start, end=end, chunk_bytes=chunk_bytes,
                              summary=summary):
        if not frame.messages.size:
            yield _empty_batch(), frame.anomalies
            continue
        decoded = list(decode_records_in(frame.buf, frame.messages, file_pos=frame.file_pos, path=str(path),
                                         base_offset=base, with_body=with_body, topics=topics,
                                         verify_crc=verify_crc, tx_relevant=tx_relevant))
        if summary is not None and topics is None and not tx_relevant:   # the summary counts decoded records, not entries
            summary.records -= int(frame.positions.size) - sum(b.num_rows for b, _ in decoded)
        for k, (batch, found) in enumerate(decoded):
            yield batch, (frame.anomalies if k == 0 else []) + found
        if not decoded:
            yield _empty_batch(), frame.anomalies


def decode_file(path, **kwargs) -> Iterator[tuple]:
    return decode_range(path, **kwargs)


def _empty_batch() -> pa.RecordBatch:
    from schemas.store import COMMITLOG

    return pa.RecordBatch.from_pylist([], schema=COMMITLOG.arrow_schema())


def entries_of(path, *, base_offset: Optional[int] = None) -> tuple:
    """(every entry header of a data file as a dict of ENTRY_FIELDS, framing anomalies)."""
    out: list = []
    found: list = []
    for frame in scan_entries(path, base_offset=base_offset):
        out.extend(dict(zip(ENTRY_FIELDS, e, strict=True)) for e in frame.entries)
        found.extend(frame.anomalies)
    return out, found


def decode_log_range(path, **kwargs) -> Iterator[tuple]:
    """``decode_range`` of whichever log file ``path`` is: a DLedger data file is framed here, anything else
    is a CommitLog file (the per-file dispatch the data sources use; same arguments and results)."""
    if is_dledger_data_file(path):
        return decode_range(path, **kwargs)
    from txlog_io.commitlog_decode import decode_range as decode_commitlog_range

    return decode_commitlog_range(path, **kwargs)
