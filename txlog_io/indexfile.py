"""RocketMQ IndexFile (``store/index/<yyyyMMddHHmmssSSS>``): decode to Arrow, look a key up, encode.

Sources (apache/rocketmq 5.x; the layout is unchanged since 3.x):
  store/src/main/java/org/apache/rocketmq/store/index/IndexHeader.java    the 40-byte header
  store/src/main/java/org/apache/rocketmq/store/index/IndexFile.java      putKey, selectPhyOffset, indexKeyHashMethod
  store/src/main/java/org/apache/rocketmq/store/index/IndexService.java   buildIndex: which records get keys

Layout, big-endian (offsets come from the struct/dtype definitions below):

  header (40 B)                       hash slots (hashSlotNum x 4 B)     entries (indexNum x 20 B)
     0 int64 beginTimestamp (ms)         int32 newest entry index of        0 int32 keyHash (>= 0)
     8 int64 endTimestamp                the slot, 0 = empty                4 int64 CommitLog offset
    16 int64 beginPhyOffset                                                 12 int32 timeDiff: seconds since
    24 int64 endPhyOffset                                                      beginTimestamp (clamped >= 0)
    32 int32 hashSlotCount (used slots)                                     16 int32 prevIndex (chain), 0 = end
    36 int32 indexCount (next entry index; entries 1 .. indexCount-1 are written, entry 0 never is)

  file size = 40 + 4 * hashSlotNum + 20 * indexNum.  Neither number is stored (broker settings maxHashSlotNum,
  default 5,000,000, and maxIndexNum, default 20,000,000); :func:`derive_geometry` finds hashSlotNum from the
  bytes: entry 1 holds beginPhyOffset and entry indexCount-1 holds endPhyOffset (putKey sets both).

  Keys: ``topic + "#" + UNIQ_KEY`` and ``topic + "#" + k`` for each space-separated KEYS value, for records of
  transaction type NOT, PREPARED and COMMIT (never ROLLBACK), in CommitLog order, skipping records below the
  file's endPhyOffset.  keyHash = abs(String.hashCode(key)) (0 for Integer.MIN_VALUE); slot = keyHash % slots.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa

from schemas.index import INDEX_ENTRIES
from txlog_io import readstats
from txlog_io.errors import Anomaly, AnomalyKind, EncodeError
from txlog_io.positional import PositionalFile, open_input
from txlog_io.properties import java_string_hash
from txlog_io.storefs import as_path

SOURCE = "index"
HEADER = struct.Struct(">qqqqii")
HEADER_SIZE = HEADER.size                      # 40
SLOT = struct.Struct(">i")
SLOT_SIZE = SLOT.size                          # 4
ENTRY_DTYPE = np.dtype([("key_hash", ">i4"), ("commitlog_offset", ">i8"), ("time_diff_s", ">i4"),
                        ("prev_index", ">i4")])
ENTRY = struct.Struct(">iqii")
#: IndexFileReader.lookup_many reads a file whole when it is no bigger than this many bytes per key (about
#: the pages a slot and its chain touch, read one at a time), else walks each chain by positional reads
WHOLE_LOOKUP_BYTES_PER_KEY = 5 * 4096
ENTRY_SIZE = ENTRY.size                        # 20
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE
DEFAULT_HASH_SLOTS = 5_000_000
DEFAULT_INDEX_NUM = 20_000_000
#: geometries tried (two positional reads each) before the bytes are searched: RocketMQ's defaults, the
#: reference broker's, the real test brokers' (maxHashSlotNum=64, maxIndexNum=512)
KNOWN_GEOMETRIES = ((DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM), (16384, 65536), (64, 512))
_MAX_HEADER_SCAN = 1 << 31                     # a slot table larger than 2 GiB is not a RocketMQ index


@dataclass(frozen=True)
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


@dataclass
class IndexFile:
    """A decoded index file: header, geometry (None when it could not be derived), entries, findings."""

    path: str
    header: Optional[IndexHeader]
    hash_slots: Optional[int]
    index_num: Optional[int]
    slots: np.ndarray                          # int32 per slot (empty when the geometry is unknown)
    entries: pa.Table                          # schemas.index.INDEX_ENTRIES
    anomalies: List[Anomaly]


def index_key_hash(key: str) -> int:
    """``IndexFile.indexKeyHashMethod``: abs(String.hashCode), with Math.abs(MIN_VALUE) < 0 mapped to 0.

    The real 3.1.4 store holds the raw (negative) String.hashCode for some keys and counts every put as a new
    slot: the reader accepts such files, the writer produces the 4.x+ form only."""
    h = java_string_hash(key)
    return 0 if h == -(1 << 31) else abs(h)


#: keys hashed per index_key_hashes call by IndexFileWriter (bounds its temporary arrays to a few MB)
HASH_BATCH = 4096
#: 31**k mod 2**32 for k < len, grown on demand (index_key_hashes)
_POW31 = np.ones(1, np.uint64)


def index_key_hashes(keys: Sequence[str]) -> np.ndarray:
    """``index_key_hash`` of every key (int64): ASCII keys all at once -- String.hashCode is the sum of the
    code units times 31**(units after it), taken mod 2**32 -- any other key one by one."""
    global _POW31
    n = len(keys)
    if n == 0:
        return np.zeros(0, np.int64)
    text = "".join(keys)
    if not text.isascii():
        return np.fromiter((index_key_hash(k) for k in keys), np.int64, n)
    lengths = np.fromiter(map(len, keys), np.int64, n)
    if not lengths.all():
        return np.fromiter((index_key_hash(k) for k in keys), np.int64, n)
    longest = int(lengths.max())
    if len(_POW31) < longest:
        pows = [1]
        for _ in range(longest - 1):
            pows.append(pows[-1] * 31 & 0xFFFFFFFF)
        _POW31 = np.array(pows, np.uint64)
    units = np.frombuffer(text.encode("ascii"), np.uint8).astype(np.uint64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    # the exponent of a unit is the number of units after it in its key
    after = np.repeat(ends, lengths) - 1 - np.arange(len(units), dtype=np.int64)
    sums = np.add.reduceat(units * _POW31[after], starts) & np.uint64(0xFFFFFFFF)
    h = sums.astype(np.int64)
    h = np.where(h >= 1 << 31, h - (1 << 32), h)                    # String.hashCode's int
    return np.where(h == -(1 << 31), 0, np.abs(h))


def build_key(topic: str, key: str) -> str:
    return f"{topic}#{key}"


def file_size_for(hash_slots: int, index_num: int) -> int:
    return HEADER_SIZE + SLOT_SIZE * hash_slots + ENTRY_SIZE * index_num


def _anomaly(kind: str, path: str, pos: int, detail: str, expected=None, actual=None) -> Anomaly:
    return Anomaly(kind=kind, file=path, position=pos, detail=detail,
                   expected=None if expected is None else str(expected),
                   actual=None if actual is None else str(actual), source=SOURCE)


def _read_all(path: str) -> bytes:
    with PositionalFile(path, "index file") as f:
        return f.read_all()


def derive_geometry(data: bytes, header: IndexHeader) -> Optional[Tuple[int, int]]:
    """(hashSlotNum, indexNum) consistent with the bytes, or None.

    Entry 1 carries beginPhyOffset and entry indexCount-1 endPhyOffset; the slot count is the one that puts them
    there and leaves a whole number of 20-byte entries.  An index with no entry yet (indexCount <= 1) has no
    evidence: the broker defaults are assumed when the size matches them."""
    size = len(data)
    if header.index_count <= 1:
        if size == file_size_for(DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM):
            return DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM
        return None
    if size == file_size_for(DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM) and \
            _plausible(data, header, DEFAULT_HASH_SLOTS * SLOT_SIZE):
        return DEFAULT_HASH_SLOTS, DEFAULT_INDEX_NUM
    needle = struct.pack(">q", header.begin_phy_offset)
    start = HEADER_SIZE
    while True:
        p = data.find(needle, start)
        if p < 0:
            return None
        start = p + 1
        entry1 = p - 4                                   # the offset field sits 4 bytes into its entry
        slots4 = entry1 - ENTRY_SIZE - HEADER_SIZE       # entry 1 = after the slots and the unused entry 0
        if slots4 < 0 or slots4 % SLOT_SIZE or slots4 > _MAX_HEADER_SCAN:
            continue
        slots = slots4 // SLOT_SIZE
        rest = size - HEADER_SIZE - slots4
        if slots == 0 or rest % ENTRY_SIZE or rest // ENTRY_SIZE < header.index_count:
            continue
        if not _plausible(data, header, slots4):
            continue
        return slots, rest // ENTRY_SIZE


def _plausible(data: bytes, header: IndexHeader, slots4: int) -> bool:
    """Entry 1 and entry indexCount-1 hold the header's begin/end offsets, chains only point backwards, and
    every entry of a chain belongs to the slot the chain starts from."""
    last = header.index_count - 1
    first = HEADER_SIZE + slots4
    if first + (last + 1) * ENTRY_SIZE > len(data):
        return False
    if struct.unpack_from(">q", data, first + ENTRY_SIZE + 4)[0] != header.begin_phy_offset or \
            struct.unpack_from(">q", data, first + last * ENTRY_SIZE + 4)[0] != header.end_phy_offset:
        return False
    rows = np.frombuffer(data, ENTRY_DTYPE, last, first + ENTRY_SIZE)
    prev = rows["prev_index"].astype(np.int64)
    idx = np.arange(1, last + 1)
    if np.any((prev < 0) | (prev >= idx)):
        return False
    linked = prev > 0
    n_slots = slots4 // SLOT_SIZE
    h = np.abs(rows["key_hash"].astype(np.int64)) % n_slots
    return bool(np.all(h[linked] == h[prev[linked] - 1]))


def read_index_file(path, hash_slots: Optional[int] = None, index_num: Optional[int] = None) -> IndexFile:
    """Decode one index file.  Never raises on content: damage becomes anomalies (file, byte position)."""
    path = str(path)
    data = _read_all(path)
    anomalies: List[Anomaly] = []
    empty = INDEX_ENTRIES.arrow_schema().empty_table()
    if len(data) < HEADER_SIZE:
        anomalies.append(_anomaly(AnomalyKind.TRUNCATED_RECORD, path, 0, "index file shorter than its header",
                                  HEADER_SIZE, len(data)))
        return IndexFile(path, None, None, None, np.zeros(0, np.int32), empty, anomalies)
    header = IndexHeader(*HEADER.unpack_from(data, 0))
    if hash_slots is not None and index_num is None:
        rest = len(data) - file_size_for(hash_slots, 0)
        index_num = rest // ENTRY_SIZE if rest >= 0 and rest % ENTRY_SIZE == 0 else None
    geometry = (hash_slots, index_num) if hash_slots is not None and index_num is not None else None
    if geometry and file_size_for(*geometry) != len(data):
        anomalies.append(_anomaly(AnomalyKind.FILE_SIZE_MISMATCH, path, 0,
                                  f"index file size for {geometry[0]} slots x {geometry[1]} entries",
                                  file_size_for(*geometry), len(data)))
        geometry = None
    if geometry is None:                         # not given, or contradicted by the size: the bytes decide
        geometry = derive_geometry(data, header)
    if geometry is None:
        if header.index_count > 1 or any(data[HEADER_SIZE:]):
            anomalies.append(_anomaly(AnomalyKind.BAD_FILE_HEADER, path, 0,
                                      "cannot place the entries: no slot count puts beginPhyOffset in entry 1 and "
                                      "endPhyOffset in entry indexCount-1 (truncated or damaged index file)",
                                      None, f"indexCount={header.index_count} size={len(data)}"))
        return IndexFile(path, header, None, None, np.zeros(0, np.int32), empty, anomalies)
    slots_n, index_n = geometry
    slots = np.frombuffer(data, ">i4", slots_n, HEADER_SIZE).astype(np.int32)
    count = header.index_count
    if count < 1 or count > index_n:
        anomalies.append(_anomaly(AnomalyKind.BAD_FILE_HEADER, path, 36, "indexCount out of range",
                                  f"1..{index_n}", count))
        count = max(1, min(count, index_n))
    first = HEADER_SIZE + SLOT_SIZE * slots_n
    rows = np.frombuffer(data, ENTRY_DTYPE, count, first)[1:]   # entry 0 is never written
    idx = np.arange(1, count, dtype=np.int64)
    positions = first + idx * ENTRY_SIZE
    bad = (rows["commitlog_offset"] < 0) | (rows["time_diff_s"] < 0) | (rows["prev_index"] < 0) | \
        (rows["prev_index"] >= idx)
    for i in np.flatnonzero(bad)[:1000]:
        anomalies.append(_anomaly(AnomalyKind.BAD_INDEX_ENTRY, path, int(positions[i]),
                                  "index entry with an impossible value (negative offset/time, or a chain link "
                                  "that does not point to an older entry)", None,
                                  str(rows[i].tolist())))
    bad_slots = np.flatnonzero((slots < 0) | (slots >= max(count, 1)))
    for s in bad_slots[:1000]:
        anomalies.append(_anomaly(AnomalyKind.BAD_INDEX_ENTRY, path, HEADER_SIZE + int(s) * SLOT_SIZE,
                                  "hash slot points past the written entries", f"0..{count - 1}", int(slots[s])))
    table = pa.table({
        "file": pa.array([path] * len(idx), pa.string()),
        "file_position": pa.array(positions, pa.int64()),
        "entry_index": pa.array(idx.astype(np.int32), pa.int32()),
        "key_hash": pa.array(rows["key_hash"].astype(np.int32)),
        "commitlog_offset": pa.array(rows["commitlog_offset"].astype(np.int64)),
        "store_timestamp": pa.array(header.begin_timestamp + rows["time_diff_s"].astype(np.int64) * 1000,
                                    pa.int64()),
        "prev_index": pa.array(rows["prev_index"].astype(np.int32)),
        "valid": pa.array(~bad),
    }, schema=INDEX_ENTRIES.arrow_schema())
    return IndexFile(path, header, slots_n, index_n, slots, table, anomalies)


class IndexFileWriter:
    """Encoder twin: builds an index file byte for byte as ``IndexFile.putKey`` does.

    A put only records the key, its CommitLog offset and its time difference; ``to_bytes`` hashes the keys
    not hashed yet (``index_key_hashes``, all at once) and lays the file out (header, slot table, entries from
    index 1 with their chains, zeros after).  The chain of a slot is what putKey builds: each entry points to
    the slot's previous entry (0 for its first), the slot to its latest entry; ``slot_count`` is the number of
    slots used."""

    def __init__(self, hash_slots: int = DEFAULT_HASH_SLOTS, index_num: int = DEFAULT_INDEX_NUM,
                 end_phy_offset: int = 0, end_timestamp: int = 0):
        """``end_phy_offset`` / ``end_timestamp``: the previous file's, which a new IndexFile starts its header
        with (its first put then overwrites the begin values, but its time difference is taken from them)."""
        if hash_slots <= 0 or index_num <= 1:
            raise EncodeError("hash_slots/index_num", "> 0 / > 1", (hash_slots, index_num))
        self.hash_slots, self.index_num = hash_slots, index_num
        self._keys: list = []                   # key of entry i + 1
        self._phys: list = []                   # its CommitLog offset
        self._diffs: list = []                  # its time difference (s) from beginTimestamp
        self._hashes = np.zeros(0, np.int64)    # index_key_hash of the first len(_hashes) keys
        self.begin_phy = self.end_phy = max(end_phy_offset, 0)
        self.begin_ts = self.end_ts = max(end_timestamp, 0)
        self.index_count = 1

    @property
    def full(self) -> bool:
        return self.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        index_count = self.index_count
        if index_count >= self.index_num:
            return False
        begin_ts = self.begin_ts
        self._keys.append(key)
        self._phys.append(phy_offset)
        self._diffs.append(0 if begin_ts <= 0 else min(max((store_timestamp - begin_ts) // 1000, 0), 2**31 - 1))
        if index_count <= 1:
            self.begin_phy, self.begin_ts = phy_offset, store_timestamp
        self.index_count = index_count + 1
        self.end_phy, self.end_ts = phy_offset, store_timestamp
        return True

    def _key_hashes(self) -> np.ndarray:
        done, keys = len(self._hashes), self._keys
        if done < len(keys):
            # in slices of HASH_BATCH keys: the per-character arrays of a whole file would take ~150 MB
            self._hashes = np.concatenate([self._hashes] + [
                index_key_hashes(keys[start:start + HASH_BATCH]) for start in range(done, len(keys), HASH_BATCH)])
        return self._hashes

    def _chains(self):
        """(slot of each entry, previous entry index of its slot per entry, slot table as (slots, latest))."""
        slots = self._key_hashes() % self.hash_slots
        order = np.argsort(slots, kind="stable")          # entries grouped by slot, in put order
        by_slot = slots[order]
        same = by_slot[1:] == by_slot[:-1]
        prev = np.zeros(len(slots), np.int64)
        prev[order[1:][same]] = order[:-1][same] + 1      # entry index = position + 1
        last = np.append(~same, True) if len(slots) else np.zeros(0, bool)
        return prev, by_slot[last], order[last] + 1

    @property
    def slot_count(self) -> int:
        return len(self._chains()[1]) if self._keys else 0

    def to_bytes(self) -> bytes:
        buf = bytearray(file_size_for(self.hash_slots, self.index_num))
        slot_count = 0
        if self._keys:
            prev, used, latest = self._chains()
            slot_count = len(used)
            slots = np.zeros(self.hash_slots, ">i4")
            slots[used] = latest
            buf[HEADER_SIZE:HEADER_SIZE + self.hash_slots * SLOT_SIZE] = slots.tobytes()
            entries = np.empty(len(self._keys), ENTRY_DTYPE)
            entries["key_hash"] = self._key_hashes()
            entries["commitlog_offset"] = self._phys
            entries["time_diff_s"] = self._diffs
            entries["prev_index"] = prev
            at = HEADER_SIZE + self.hash_slots * SLOT_SIZE + ENTRY_SIZE       # entry 0 stays zero
            data = entries.tobytes()
            buf[at:at + len(data)] = data
        HEADER.pack_into(buf, 0, self.begin_ts, self.end_ts, self.begin_phy, self.end_phy,
                         slot_count, self.index_count)
        return bytes(buf)


def index_keys(topic: str, uniq_key: Optional[str], keys: Optional[str], transaction_type: str) -> List[str]:
    """The keys ``IndexService.buildIndex`` puts for one record (none for a ROLLBACK record)."""
    if transaction_type == "ROLLBACK":
        return []
    out = [f"{topic}#{uniq_key}"] if uniq_key is not None else []        # build_key, inlined (once a record)
    if keys:
        for k in keys.split(" "):
            if k:
                out.append(f"{topic}#{k}")
    return out


def list_index_files(store_root) -> List[Path]:
    """The store's index files, oldest first (names are yyyyMMddHHmmssSSS creation times)."""
    d = as_path(store_root) / "index"
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if p.is_file() and p.name.isdigit()), key=lambda p: p.name)


# ------------------------------------------------------------------------------------------ positional lookups
#: index files up to this size are read whole to derive their geometry; larger ones must match the defaults
#: (or the geometry given), checked with two positional reads
WHOLE_READ_LIMIT = 64 << 20


class IndexFileReader:
    """Key lookups in one index file with positional reads only (a slot, then the chain's entries).

    ``usable`` is False when the file's geometry cannot be established (``problem`` says why): its CommitLog
    range must then be reached another way."""

    def __init__(self, path, hash_slots: Optional[int] = None, index_num: Optional[int] = None):
        self.file = PositionalFile(path, "index file")
        self.path, self.size = self.file.path, self.file.size
        self.whole: Optional[bytes] = None      # the file's bytes, once read whole (geometry or lookup_many)
        self.header: Optional[IndexHeader] = None
        self.hash_slots = self.index_num = None
        self.problem: Optional[str] = None
        head = self.file.pread(0, HEADER_SIZE)
        if len(head) < HEADER_SIZE:
            self.problem = f"shorter than its {HEADER_SIZE}-byte header ({self.size} bytes)"
            return
        self.header = IndexHeader(*HEADER.unpack(head))
        candidates = list(KNOWN_GEOMETRIES)
        if hash_slots is not None:
            n = index_num if index_num is not None else (self.size - file_size_for(hash_slots, 0)) // ENTRY_SIZE
            candidates.insert(0, (hash_slots, n))
        geometry = next((g for g in candidates if file_size_for(*g) == self.size
                         and (self.header.index_count <= 1 or self._ends_match(g[0]))), None)
        if geometry is None and self.size <= WHOLE_READ_LIMIT:
            self.whole = self.file.read_all()
            geometry = derive_geometry(self.whole, self.header)
        if geometry is None:
            self.problem = ("cannot place its entries (truncated, damaged, or a slot/entry count other than the "
                            f"defaults; {self.size} bytes, indexCount {self.header.index_count})")
            return
        self.hash_slots, self.index_num = geometry
        if not 1 <= self.header.index_count <= self.index_num:
            self.problem = f"indexCount {self.header.index_count} outside 1..{self.index_num}"

    @property
    def usable(self) -> bool:
        return self.problem is None

    def _entry(self, slots: int, i: int) -> Tuple[int, int, int, int]:
        b = self.file.pread(HEADER_SIZE + slots * SLOT_SIZE + i * ENTRY_SIZE, ENTRY_SIZE)
        return ENTRY.unpack(b) if len(b) == ENTRY_SIZE else (0, -1, -1, 0)

    def _ends_match(self, slots: int) -> bool:
        h = self.header
        assert h is not None                # read before the geometry is looked for
        return self._entry(slots, 1)[1] == h.begin_phy_offset and \
            self._entry(slots, h.index_count - 1)[1] == h.end_phy_offset

    def lookup(self, key: str, min_offset: int = 0, max_hits: int = 4096) -> List[int]:
        """CommitLog offsets >= ``min_offset`` stored under ``key``, newest first.  The chain is walked from the
        newest entry down (entries are written in CommitLog order), so it stops at the first older offset."""
        if not self.usable or self.header is None or self.header.index_count <= 1:
            return []
        return self._chain(index_key_hash(key), min_offset, max_hits)

    def lookup_many(self, hashes: Sequence[int], min_offsets: Sequence[int],
                    max_hits: int = 4096) -> List[list]:
        """:meth:`lookup` of many keys at once, given their ``index_key_hash`` (per key: the offsets found,
        newest first); see :meth:`lookup_arrays`."""
        out: List[list] = [[] for _ in hashes]
        keys, offsets = self.lookup_arrays(hashes, min_offsets, max_hits)
        for i, o in zip(keys.tolist(), offsets.tolist(), strict=True):
            out[i].append(o)
        return out

    def lookup_arrays(self, hashes, min_offsets, max_hits: int = 4096) -> Tuple[np.ndarray, np.ndarray]:
        """(key indexes, CommitLog offsets) of every hit of many keys given their ``index_key_hash``, each
        key's hits newest first.

        Many keys against a small file (the whole file is no bigger than the pages their chains would touch
        one read at a time, ``WHOLE_LOOKUP_BYTES_PER_KEY``) read the file once and walk every chain together
        in numpy, one entry per key per step; otherwise each chain is walked by positional reads as
        :meth:`lookup` does.  Same results."""
        h = np.asarray(hashes, np.int64)
        lo = np.asarray(min_offsets, np.int64)
        none = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if not self.usable or self.header is None or self.header.index_count <= 1 or not h.size:
            return none
        assert self.hash_slots is not None and self.index_num is not None   # usable: the geometry is known
        if self.whole is None and self.size > h.size * WHOLE_LOOKUP_BYTES_PER_KEY:
            found = [(i, o) for i in range(h.size) for o in self._chain(int(h[i]), int(lo[i]), max_hits)]
            return (np.array([i for i, _ in found], np.int64), np.array([o for _, o in found], np.int64)) \
                if found else none
        if self.whole is None:
            self.whole = self.file.read_all()
        data = self.whole
        slots = np.frombuffer(data, ">i4", self.hash_slots, HEADER_SIZE)
        entries = np.frombuffer(data, ENTRY_DTYPE, min(self.index_num, (len(data) - HEADER_SIZE
                                                       - self.hash_slots * SLOT_SIZE) // ENTRY_SIZE),
                                HEADER_SIZE + self.hash_slots * SLOT_SIZE)
        count = min(self.header.index_count, len(entries))
        cur = slots[h % self.hash_slots].astype(np.int64)
        live = np.arange(h.size)
        keys, offsets = [], []
        for _ in range(max_hits):
            live = live[(cur[live] > 0) & (cur[live] < count)]
            if not live.size:
                break
            e = entries[cur[live]]
            off, prev = e["commitlog_offset"].astype(np.int64), e["prev_index"].astype(np.int64)
            stop = off < lo[live]
            hit = ~stop & (e["key_hash"] == h[live])
            keys.append(live[hit])
            offsets.append(off[hit])
            cur[live] = np.where(stop | (prev >= cur[live]), 0, prev)
        return (np.concatenate(keys), np.concatenate(offsets)) if keys else none

    def _chain(self, h: int, min_offset: int, max_hits: int) -> List[int]:
        assert self.header is not None and self.hash_slots is not None   # a usable reader's
        b = self.file.pread(HEADER_SIZE + (h % self.hash_slots) * SLOT_SIZE, SLOT_SIZE)
        cur = SLOT.unpack(b)[0] if len(b) == SLOT_SIZE else 0
        out: List[int] = []
        steps = 0
        while 0 < cur < self.header.index_count and steps < max_hits:
            key_hash, offset, _, prev = self._entry(self.hash_slots, cur)
            if offset < min_offset:
                break
            if key_hash == h:
                out.append(offset)
            if prev >= cur:
                break
            cur, steps = prev, steps + 1
        return out

    def close(self) -> None:
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def search_files(files: Sequence[tuple], hashes: np.ndarray, after: np.ndarray) -> np.ndarray:
    """The CommitLog offsets (sorted, distinct) that ``files`` ((path, end_phy_offset, hash_slots, index_num),
    usable ones) hold for the keys of ``hashes`` past each key's ``after`` (the oldest half copy): a file that
    ends before a key's ``after`` is not searched for it (its entries are older)."""
    hashes, after = np.asarray(hashes, np.int64), np.asarray(after, np.int64)
    found = [np.zeros(0, np.int64)]
    for path, end, slots, entries in files:
        keys = np.flatnonzero(after <= end)
        if keys.size:
            with IndexFileReader(path, slots, entries) as reader:
                found.append(reader.lookup_arrays(hashes[keys], after[keys] + 1)[1])
    return np.unique(np.concatenate(found))


def read_index_header(path) -> Optional[IndexHeader]:
    """The 40-byte header alone (None when the file is shorter): what a driver lists before planning."""
    with open_input(path) as f:
        head = f.read(HEADER_SIZE)
    readstats.add(len(head), "index")
    return IndexHeader(*HEADER.unpack(head)) if len(head) == HEADER_SIZE else None
