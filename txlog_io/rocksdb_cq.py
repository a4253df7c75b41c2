"""RocketMQ 5.x RocksDB consume queues (``storeType=defaultRocksDB``): key / value codec, encoder twins, reader.

Sources (tag rocketmq-all-5.3.3):
  store/src/main/java/org/apache/rocketmq/store/queue/RocksDBConsumeQueueTable.java        buildCQKeyByteBuffer0,
        buildCQValueByteBuffer0, CQ_UNIT_SIZE, buildDeleteCQKey
  store/src/main/java/org/apache/rocketmq/store/queue/RocksDBConsumeQueueOffsetTable.java  buildOffsetKeyByteBuffer0,
        buildOffsetValueByteBuffer0, appendMaxPhyOffset (MAX_PHYSICAL_OFFSET_CHECKPOINT), forEach
  store/src/main/java/org/apache/rocketmq/store/rocksdb/ConsumeQueueRocksDBStorage.java    column families
        "default" (the units) and "offset" (OFFSET_COLUMN_FAMILY)
  store/src/main/java/org/apache/rocketmq/store/queue/RocksDBConsumeQueueStore.java        the database lives in
        StorePathConfigHelper.getStorePathConsumeQueue(storePathRootDir) = <root>/consumequeue
  common/src/main/java/org/apache/rocketmq/common/config/AbstractRocksDBStorage.java       CTRL_0/1/2 = 0x00/01/02
  common/src/main/java/org/apache/rocketmq/common/topic/TopicValidator.java               CHECKPOINT_TOPIC

Layouts (java.nio.ByteBuffer: big-endian; topic = UTF-8 bytes of length n):

  unit key, column family "default" (n + 18 B)         unit value (28 B)
     0      int32 n                                       0  int64 CommitLog physical offset
     4      0x01 (CTRL_1)                                 8  int32 message size (TOTALSIZE)
     5      topic bytes                                  12  int64 tagsCode
     5+n    0x01                                         20  int64 msg store time (epoch ms)
     6+n    int32 queueId
    10+n    0x01
    11+n    int64 ConsumeQueue offset (the logical queue offset)

  offset key, column family "offset" (n + 13 B)         offset value (16 B)
     0      int32 n                                       0  int64 CommitLog physical offset of that unit
     4      0x01                                          8  int64 ConsumeQueue offset: "max" = the queue's
     5      topic bytes                                      last unit (not last + 1), "min" = its first
     5+n    0x01
     6+n    "max" or "min" (3 ASCII bytes)
     9+n    0x01
    10+n    int32 queueId
  The dispatch checkpoint is an offset-family row keyed (CHECKPOINT_TOPIC, "max", queueId 0) whose value is ONE
  int64: the CommitLog offset up to which the dispatcher wrote units (forEach skips it by its 8-byte value).

Keys sort bytewise (RocksDB's default comparator; the topic length leads, so one queue's units are contiguous and
in queue-offset order for offsets >= 0).  A unit is a key, not a byte range: rows carry the database directory as
``file`` and -1 as ``file_position``; findings name the key in hex.

Reading never writes the store: RocksDB's read-only open (no LOCK taken, no compaction, the WAL replayed into
memory only) of a shadow directory outside the store that holds a symlink per RocksDB file of the store; the
binding's own rocksdict-config.json and RocksDB's info log land in the shadow directory (CqDatabase).
"""
from __future__ import annotations

import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from schemas import store as store_schemas
from txlog_io.errors import Anomaly, AnomalyKind, EncodeError, StoreNotFoundError, UnreadableFileError

CTRL_0, CTRL_1, CTRL_2 = 0x00, 0x01, 0x02
_I32, _I64 = struct.Struct(">i"), struct.Struct(">q")
CQ_VALUE = struct.Struct(">qiqq")                      # RocksDBConsumeQueueTable.CQ_UNIT_SIZE = 28
CQ_UNIT_SIZE = CQ_VALUE.size
CQ_KEY_LENGTH_WITHOUT_TOPIC = 4 + 1 + 1 + 4 + 1 + 8    # CQ_KEY_LENGTH_WITHOUT_TOPIC_BYTES = 19
OFFSET_VALUE = struct.Struct(">qq")                    # OFFSET_VALUE_LENGTH = 16
OFFSET_KEY_LENGTH_WITHOUT_TOPIC = 4 + 1 + 1 + 3 + 1 + 4  # OFFSET_KEY_LENGTH_WITHOUT_TOPIC_BYTES = 14
MAX, MIN = b"max", b"min"
CHECKPOINT_TOPIC = "CHECKPOINT_TOPIC"                  # TopicValidator.RMQ_SYS_ROCKSDB_OFFSET_TOPIC
OFFSET_COLUMN_FAMILY = "offset"
DEFAULT_COLUMN_FAMILY = "default"
SOURCE = "consumequeue"
BATCH_ROWS = 8192

_INT32 = (-(1 << 31), (1 << 31) - 1)
_INT64 = (-(1 << 63), (1 << 63) - 1)
_CQ_SCHEMA = store_schemas.CONSUMEQUEUE.arrow_schema()


class LayoutError(ValueError):
    """A key or value that RocketMQ's layout cannot have produced (turned into an anomaly by the reader)."""


@dataclass(frozen=True)
class CqUnit:
    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    size: int
    tags_code: int
    store_time_ms: int


@dataclass(frozen=True)
class OffsetEntry:
    topic: str
    kind: str                       # "max" | "min"
    queue_id: int
    commitlog_offset: int
    queue_offset: int


# ---------------------------------------------------------------------------------------------------------------
# Codec
# ---------------------------------------------------------------------------------------------------------------

def _check(name: str, v: int, bounds: Tuple[int, int]) -> int:
    if not isinstance(v, int) or not bounds[0] <= v <= bounds[1]:
        raise EncodeError(name, f"an integer in [{bounds[0]}, {bounds[1]}]", v)
    return v


def _topic_bytes(topic: str) -> bytes:
    if not isinstance(topic, str):
        raise EncodeError("topic", "a str", topic)
    return topic.encode("utf-8")


def encode_cq_key(topic: str, queue_id: int, queue_offset: int) -> bytes:
    """RocksDBConsumeQueueTable.buildCQKeyByteBuffer0."""
    t = _topic_bytes(topic)
    return (_I32.pack(len(t)) + bytes([CTRL_1]) + t + bytes([CTRL_1]) + _I32.pack(_check("queue_id", queue_id, _INT32))
            + bytes([CTRL_1]) + _I64.pack(_check("queue_offset", queue_offset, _INT64)))


def _topic_of(key: bytes, fixed: int) -> Tuple[str, int]:
    """(topic, position after the CTRL_1 that follows it) of a key whose fixed part is ``fixed`` bytes."""
    if len(key) < fixed:
        raise LayoutError(f"key of {len(key)} bytes, shorter than its {fixed} fixed bytes")
    n = _I32.unpack_from(key, 0)[0]
    if n < 0 or len(key) != fixed + n:
        raise LayoutError(f"topic length {n} does not fit a key of {len(key)} bytes (expected {fixed} + n)")
    if key[4] != CTRL_1 or key[5 + n] != CTRL_1:
        raise LayoutError("separator bytes around the topic are not CTRL_1 (0x01)")
    try:
        topic = key[5:5 + n].decode("utf-8")
    except UnicodeDecodeError as e:
        raise LayoutError(f"topic bytes are not UTF-8: {e}") from None
    return topic, 6 + n


def decode_cq_key(key: bytes) -> Tuple[str, int, int]:
    """(topic, queue_id, queue_offset) of a unit key."""
    topic, p = _topic_of(key, CQ_KEY_LENGTH_WITHOUT_TOPIC)
    if key[p + 4] != CTRL_1:
        raise LayoutError("separator byte before the queue offset is not CTRL_1 (0x01)")
    return topic, _I32.unpack_from(key, p)[0], _I64.unpack_from(key, p + 5)[0]


def encode_cq_value(commitlog_offset: int, size: int, tags_code: int, store_time_ms: int) -> bytes:
    """RocksDBConsumeQueueTable.buildCQValueByteBuffer0."""
    return CQ_VALUE.pack(_check("commitlog_offset", commitlog_offset, _INT64), _check("size", size, _INT32),
                         _check("tags_code", tags_code, _INT64), _check("store_time_ms", store_time_ms, _INT64))


def decode_cq_value(value: bytes) -> Tuple[int, int, int, int]:
    """(commitlog_offset, size, tags_code, store_time_ms) of a unit value."""
    if len(value) != CQ_UNIT_SIZE:
        raise LayoutError(f"unit value of {len(value)} bytes (expected {CQ_UNIT_SIZE})")
    return CQ_VALUE.unpack(value)


def encode_cq_unit(u: CqUnit) -> Tuple[bytes, bytes]:
    return (encode_cq_key(u.topic, u.queue_id, u.queue_offset),
            encode_cq_value(u.commitlog_offset, u.size, u.tags_code, u.store_time_ms))


def decode_cq_unit(key: bytes, value: bytes) -> CqUnit:
    return CqUnit(*decode_cq_key(key), *decode_cq_value(value))


def encode_offset_key(topic: str, kind: str, queue_id: int) -> bytes:
    """RocksDBConsumeQueueOffsetTable.buildOffsetKeyByteBuffer0 (``kind`` "max" or "min")."""
    if kind not in ("max", "min"):
        raise EncodeError("kind", "'max' or 'min'", kind)
    t = _topic_bytes(topic)
    return (_I32.pack(len(t)) + bytes([CTRL_1]) + t + bytes([CTRL_1]) + kind.encode("ascii") + bytes([CTRL_1])
            + _I32.pack(_check("queue_id", queue_id, _INT32)))


def decode_offset_key(key: bytes) -> Tuple[str, str, int]:
    """(topic, "max" | "min", queue_id).  Any other 3 bytes read as "min", as ``forEach`` does; a finding is
    the reader's business (it reports them)."""
    topic, p = _topic_of(key, OFFSET_KEY_LENGTH_WITHOUT_TOPIC)
    if key[p + 3] != CTRL_1:
        raise LayoutError("separator byte before the queue id is not CTRL_1 (0x01)")
    kind = key[p:p + 3]
    if kind not in (MAX, MIN):
        raise LayoutError(f"offset kind {kind!r} is neither 'max' nor 'min'")
    return topic, kind.decode("ascii"), _I32.unpack_from(key, p + 4)[0]


def encode_offset_value(commitlog_offset: int, queue_offset: int) -> bytes:
    """RocksDBConsumeQueueOffsetTable.buildOffsetValueByteBuffer0."""
    return OFFSET_VALUE.pack(_check("commitlog_offset", commitlog_offset, _INT64),
                             _check("queue_offset", queue_offset, _INT64))


def decode_offset_value(value: bytes) -> Tuple[int, int]:
    if len(value) != OFFSET_VALUE.size:
        raise LayoutError(f"offset value of {len(value)} bytes (expected {OFFSET_VALUE.size})")
    return OFFSET_VALUE.unpack(value)


def checkpoint_key() -> bytes:
    """The offset-family key of the dispatch checkpoint (MAX_PHYSICAL_OFFSET_CHECKPOINT_KEY)."""
    return encode_offset_key(CHECKPOINT_TOPIC, "max", 0)


def encode_checkpoint_value(max_phy_offset: int) -> bytes:
    """appendMaxPhyOffset: one int64."""
    return _I64.pack(_check("max_phy_offset", max_phy_offset, _INT64))


def queue_prefix(topic: str, queue_id: Optional[int] = None) -> bytes:
    """The key prefix shared by every unit of ``topic`` (and ``queue_id``): a seek start."""
    t = _topic_bytes(topic)
    p = _I32.pack(len(t)) + bytes([CTRL_1]) + t + bytes([CTRL_1])
    return p if queue_id is None else p + _I32.pack(queue_id) + bytes([CTRL_1])


# ---------------------------------------------------------------------------------------------------------------
# Reading a database (read-only)
# ---------------------------------------------------------------------------------------------------------------

def is_rocksdb_dir(directory) -> bool:
    """A RocksDB database directory: CURRENT plus a MANIFEST."""
    d = Path(directory)
    try:
        names = {p.name for p in d.iterdir() if p.is_file()}
    except OSError:
        return False
    return "CURRENT" in names and any(n.startswith("MANIFEST-") for n in names)


def _is_rocksdb_file(name: str) -> bool:
    """The files RocksDB itself keeps in a database directory (not LOCK, LOG*, nor anything else)."""
    return name in ("CURRENT", "IDENTITY") or name.startswith(("MANIFEST-", "OPTIONS-")) \
        or name.endswith((".sst", ".log", ".blob"))


class CqDatabase:
    """A RocksDB consume-queue database opened read-only through a shadow directory of symlinks outside the
    store (removed at close; use as a context manager)."""

    def __init__(self, path):
        self.path = Path(path)
        if not self.path.is_dir():
            raise StoreNotFoundError(str(self.path), "RocksDB consume-queue directory")
        try:
            from rocksdict import AccessType, Options, Rdict
        except ImportError as e:      # a declared dependency (setup.cfg)
            raise UnreadableFileError(str(self.path), f"the rocksdict package is not installed ({e})") from None
        # The binding writes a rocksdict-config.json into the directory it opens, even read-only: it opens a
        # shadow directory outside the store instead, holding a symlink per RocksDB file of the store (RocksDB's
        # read-only open only reads them) and receiving whatever the binding or RocksDB create (config, LOG).
        self._shadow = tempfile.mkdtemp(prefix="txaudit-rocksdb-")
        try:
            for entry in self.path.iterdir():
                if entry.is_file() and _is_rocksdb_file(entry.name):
                    (Path(self._shadow) / entry.name).symlink_to(entry.resolve())
        except OSError as e:
            shutil.rmtree(self._shadow, ignore_errors=True)
            raise UnreadableFileError(str(self.path), e.strerror or str(e)) from None
        opts = Options(raw_mode=True)
        opts.create_if_missing(False)
        opts.set_db_log_dir(self._shadow)
        try:
            cfs = Rdict.list_cf(self._shadow, opts)
            self.db = Rdict(self._shadow, options=opts, access_type=AccessType.read_only(),
                            column_families={n: Options(raw_mode=True) for n in cfs if n != DEFAULT_COLUMN_FAMILY})
        except Exception as e:        # rocksdict raises plain Exception with RocksDB's status text
            shutil.rmtree(self._shadow, ignore_errors=True)
            raise UnreadableFileError(str(self.path), f"RocksDB read-only open failed: {e}") from None
        self.column_families = list(cfs)

    def close(self) -> None:
        db, self.db = getattr(self, "db", None), None
        if db is not None:
            db.close()
        shutil.rmtree(self._shadow, ignore_errors=True)

    def __enter__(self) -> "CqDatabase":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _family(self, name: str):
        return self.db if name == DEFAULT_COLUMN_FAMILY else self.db.get_column_family(name)

    def raw_items(self, family: str = DEFAULT_COLUMN_FAMILY, prefix: bytes = b"",
                  seek: Optional[bytes] = None) -> Iterator[Tuple[bytes, bytes]]:
        """(key, value) pairs of ``family`` in key order, from ``seek`` (default ``prefix``) on while keys start
        with ``prefix``."""
        if family != DEFAULT_COLUMN_FAMILY and family not in self.column_families:
            return
        it = self._family(family).iter()
        start = seek or prefix
        it.seek(start) if start else it.seek_to_first()
        while it.valid():
            k = it.key()
            if prefix and not k.startswith(prefix):
                break
            yield k, it.value()
            it.next()

    def _finding(self, detail: str, key: bytes, value: Optional[bytes], expected: str) -> Anomaly:
        return Anomaly(AnomalyKind.BAD_CQ_ENTRY, str(self.path), -1, f"{detail}; key {key.hex()}", expected,
                       None if value is None else value.hex(), SOURCE)

    def units(self, topics: Optional[Sequence[str]] = None, queue_id: Optional[int] = None, start: int = 0,
              end: Optional[int] = None) -> Iterator[Tuple[Optional[CqUnit], Optional[Anomaly]]]:
        """Every unit of the default family (of ``topics`` only, by prefix seeks): (unit, None), or
        (None, finding) for a key / value RocketMQ's layout cannot have produced, or an impossible unit (offset
        < 0 or size <= 0, as the file decoder's BAD_CQ_ENTRY).  ``queue_id`` (with one topic): that queue's
        units with queue offsets in [``start``, ``end``) only."""
        if queue_id is not None:
            if topics is None or len(set(topics)) != 1:
                raise ValueError("queue_id needs exactly one topic")
            prefix = queue_prefix(next(iter(topics)), queue_id)
            pairs = self.raw_items(DEFAULT_COLUMN_FAMILY, prefix, seek=prefix + _I64.pack(max(start, 0)))
            for u, finding in self._decoded(pairs):
                if u is not None and end is not None and u.queue_offset >= end:
                    return
                yield u, finding
            return
        prefixes = [b""] if topics is None else [queue_prefix(t) for t in sorted(set(topics))]
        for prefix in prefixes:
            yield from self._decoded(self.raw_items(DEFAULT_COLUMN_FAMILY, prefix))

    def _decoded(self, pairs) -> Iterator[Tuple[Optional[CqUnit], Optional[Anomaly]]]:
        for k, v in pairs:
            try:
                u = decode_cq_unit(k, v)
            except LayoutError as e:
                yield None, self._finding(str(e), k, v, "RocksDBConsumeQueueTable key / 28-byte value")
                continue
            if u.commitlog_offset < 0 or u.size <= 0 or u.queue_offset < 0:
                yield None, self._finding(
                    f"unit {u.topic}/{u.queue_id}@{u.queue_offset}: CommitLog offset {u.commitlog_offset}, "
                    f"size {u.size}", k, v, "offset >= 0, size > 0, queue offset >= 0")
                continue
            yield u, None

    def offsets(self) -> Tuple[List[OffsetEntry], Optional[int], List[Anomaly]]:
        """The offset family: the per-queue max / min entries, the dispatch checkpoint (None when absent) and
        the findings for keys / values that do not fit the layout."""
        entries: List[OffsetEntry] = []
        found: List[Anomaly] = []
        checkpoint = None
        for k, v in self.raw_items(OFFSET_COLUMN_FAMILY):
            try:
                topic, kind, qid = decode_offset_key(k)
                if topic == CHECKPOINT_TOPIC and len(v) == _I64.size:
                    checkpoint = _I64.unpack(v)[0]
                    continue
                entries.append(OffsetEntry(topic, kind, qid, *decode_offset_value(v)))
            except LayoutError as e:
                found.append(self._finding(str(e), k, v, "RocksDBConsumeQueueOffsetTable key / 16-byte value"))
        return entries, checkpoint, found

    def queues(self) -> Dict[Tuple[str, int], Tuple[int, int]]:
        """(topic, queue_id) -> (first queue offset, last queue offset) of the units actually present (one
        seek per queue: the first key of the next queue is found by seeking past the last possible offset)."""
        out: Dict[Tuple[str, int], Tuple[int, int]] = {}
        it = self.db.iter()
        it.seek_to_first()
        while it.valid():
            k = it.key()
            try:
                topic, qid, first = decode_cq_key(k)
            except LayoutError:
                it.next()
                continue
            prefix = queue_prefix(topic, qid)
            it.seek_for_prev(prefix + b"\x7f" + b"\xff" * 7)
            last = first
            if it.valid() and it.key().startswith(prefix):
                try:
                    last = max(first, decode_cq_key(it.key())[2])
                except LayoutError:     # reported by the read of the queue's units (units())
                    pass
            out[(topic, qid)] = (first, last)
            it.seek(prefix + b"\xff" * 8)
            if it.valid() and it.key().startswith(prefix):    # queue offset -1: not a real unit, skipped
                it.next()
        return out


def read_units(path, topics: Optional[Sequence[str]] = None, rows: bool = True, queue_id: Optional[int] = None,
               start: int = 0, end: Optional[int] = None,
               batch_rows: int = BATCH_ROWS) -> Iterator[Tuple[pa.RecordBatch, List[Anomaly]]]:
    """(batch, findings) pairs of the ``schemas.store.CONSUMEQUEUE`` rows of a RocksDB consume-queue database
    (``file`` = the database directory, ``file_position`` = -1: a unit is a key).  ``rows=False``: findings
    only (empty batches).  ``queue_id``, ``start``, ``end``: one queue's units in that queue-offset range
    (``CqDatabase.units``)."""
    cols: Dict[str, list] = {n: [] for n in _CQ_SCHEMA.names}
    found: List[Anomaly] = []
    db_path = str(path)

    def flush():
        batch = pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in _CQ_SCHEMA], schema=_CQ_SCHEMA)
        for v in cols.values():
            v.clear()
        out = (batch, list(found))
        found.clear()
        return out

    with CqDatabase(path) as db:
        for u, finding in db.units(topics, queue_id, start, end):
            if finding is not None:
                found.append(finding)
                continue
            if not rows:
                continue
            assert u is not None
            for name, v in (("file", db_path), ("file_position", -1), ("topic", u.topic),
                            ("queue_id", u.queue_id), ("queue_offset", u.queue_offset),
                            ("commitlog_offset", u.commitlog_offset), ("size", u.size),
                            ("tags_code", u.tags_code)):
                cols[name].append(v)
            if len(cols["file"]) >= batch_rows:
                yield flush()
        yield flush()


def dispatch_end(path) -> Optional[int]:
    """The end of the record the newest unit of any queue indexes (max over queues of offset + size of the
    unit at the offset table's "max" entry, else the last unit present), or None for an empty database."""
    end: Optional[int] = None
    with CqDatabase(path) as db:
        for (topic, qid), (_, last) in db.queues().items():
            v = db.db.get(encode_cq_key(topic, qid, last))
            if v is None:
                continue
            try:
                off, size, _, _ = decode_cq_value(v)
            except LayoutError:
                continue
            if off >= 0 and size > 0:
                end = max(end or 0, off + size)
    return end
