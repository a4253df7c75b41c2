"""CommitLog records of one chunk -> one ``schemas.COMMITLOG`` RecordBatch, plus the record-level findings.

Layout: see the comment atop ``txlog_io.commitlog``; the loops are the numba kernels of
``txlog_io.*_kernels`` (MessageDecoder.java / CommitLog.java semantics, 5.3.3).  This module only
runs them and turns the rare findings into ``Anomaly`` values; the rows of a batch are one
``batch_kernels.fill`` call into one pooled buffer, read as an Arrow IPC message (``txlog_io.ipc_batch``: no
copy, one Arrow call instead of one constructor per column).  Order of work: every well-formed record is
checked (stored PHYSICALOFFSET, body CRC, 5.2+ ``__CRC32#`` property), *then* the rows are selected (topic
filter or transaction relevance), and only the selected rows get their topic, properties, hosts, ids and
bodies cut out.

Rare shapes take a slower exact path for the affected values only: bytes that are not valid UTF-8 (decoded
with U+FFFD like ``bytes.decode("utf-8", "replace")``), a TAGS value that is not valid UTF-8 (hashed as that
decoded text), a numeric property that Arrow cannot parse (null).
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.store import COMMITLOG
from txlog_io import batch_kernels as B
from txlog_io import commitlog_kernels as K
from txlog_io import commitlog_layout as L
from txlog_io import crc_kernels as C
from txlog_io import id_kernels as I
from txlog_io import properties as P
from txlog_io import text_kernels as T
from txlog_io.errors import Anomaly, AnomalyKind
from txlog_io.ipc_batch import Template
from txlog_io.positional import ChunkPool

SOURCE = "commitlog"
SCHEMA = COMMITLOG.arrow_schema()
_NAMES = SCHEMA.names          # iterating the schema builds a Field object per column, per batch


def _names(names: list) -> tuple:
    """``pack_strings`` of names of at most 8 bytes, readable 8 bytes at a time (``batch_kernels._name``)."""
    data, off = K.pack_strings(names)
    return np.concatenate([data, np.zeros(8, np.uint8)]), off


_TX_NAMES = _names(["NOT", "PREPARED", "COMMIT", "ROLLBACK"])
_COMPRESSION_NAMES = _names(["NONE", "ZLIB", "LZ4", "ZSTD", "ZLIB", "UNKNOWN"])  # bits+1
_WANTED_DATA, _WANTED_OFF, _WANTED_AT = T.wanted_keys(B.WANTED)
#: COMMITLOG's property columns, in the order of batch_kernels.WANTED (their wanted-key index)
_COLUMN_Q = {name: q for q, name in enumerate((
    "uniq_key", "tags", "keys", "pgroup", "real_topic", "real_qid", "tran_msg", "transaction_check_times",
    "tran_prepared_queue_offset", "check_immunity_time_s", "transaction_id"))}
_TX_TOPICS = K.pack_strings(L.TX_SYSTEM_TOPICS)
_TRUE = np.frombuffer(b"true", np.uint8)
_INT_RANGE = {pa.int32(): (-(1 << 31), (1 << 31) - 1), pa.int64(): (-(1 << 63), (1 << 63) - 1)}


def anomaly(kind, file, pos, base, detail, expected=None, actual=None, length=None,
            data_end: Optional[int] = None) -> Anomaly:
    """A CommitLog finding at ``pos``; ``length``: bytes of the damaged range (a record, skipped bytes);
    ``data_end``: for a torn end, the file position where the readable data ends (made global here)."""
    return Anomaly(kind=kind, file=str(file), position=int(pos), detail=detail,
                   expected=None if expected is None else str(expected),
                   actual=None if actual is None else str(actual), source=SOURCE,
                   physical_offset=int(base + pos), length=None if length is None else int(length),
                   data_end=None if data_end is None else int(base + data_end))


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=SCHEMA)


def _numeric(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """Arrow array of ``typ`` over ``values`` (no copy when they are already contiguous of its width): an
    untyped ``pa.array(ndarray)`` cost 3-20 us per column, inferring the type through pandas' checks."""
    dtype = typ.to_pandas_dtype()
    return pa.Array.from_buffers(typ, values.size, [None, pa.py_buffer(np.ascontiguousarray(values, dtype))])


#: per thread: the last file's ``file`` column, sliced for each batch of that file (one file, many batches)
_FILE_COLUMN = threading.local()


def _file_column(path: str, n: int) -> pa.Array:
    path_col = getattr(_FILE_COLUMN, "col", None)
    if path_col is None or path_col[0] != path or len(path_col[1]) < n:
        path_col = _FILE_COLUMN.col = (path, pa.array([path] * max(n, 8192), pa.string()))
    return path_col[1].slice(0, n)


def to_utf8(arr: pa.Array) -> pa.Array:
    """binary -> string, zero-copy after Arrow's UTF-8 validation; invalid values decoded with U+FFFD."""
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()],
                        pa.string())


#: per thread: the batches' buffers, reused once the batch that held one is gone (see positional.ChunkPool:
#: a fresh multi-MiB array per batch costs a page fault per 4 KiB)
_POOLS = threading.local()


def _int_column(strings: pa.Array, typ: pa.DataType) -> pa.Array:
    try:
        return strings.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        lo, hi = _INT_RANGE[typ]
        out = []
        for v in strings.to_pylist():
            try:
                x = int(v) if v is not None else None
                out.append(x if x is None or lo <= x <= hi else None)
            except ValueError:
                out.append(None)
        return pa.array(out, typ)


def decode_rows(buf, pos: np.ndarray, file_pos: np.ndarray, path: str, base: int, with_body: bool,
                topics: Optional[tuple], verify_crc: bool, f: Optional[np.ndarray] = None,
                tx_relevant: bool = False) -> tuple:
    """(RecordBatch, anomalies) of the records at ``pos`` (positions in ``buf``, zero-padded after the data).

    ``topics``: packed topic set (``commitlog_kernels.pack_strings``) to keep, None = every topic.
    ``tx_relevant``: keep only transaction-relevant rows (``commitlog_kernels.relevant``)."""
    u8 = np.frombuffer(buf, np.uint8)
    f, pos, file_pos, crc_ok, anomalies = check_rows(u8, pos, file_pos, path, base, topics, verify_crc, f,
                                                     tx_relevant)
    return batch_of(u8, pos, file_pos, base, path, with_body, crc_ok, f), anomalies


def check_rows(u8: np.ndarray, pos: np.ndarray, file_pos: np.ndarray, path: str, base: int,
               topics: Optional[tuple], verify_crc: bool, f: Optional[np.ndarray] = None,
               tx_relevant: bool = False) -> tuple:
    """Every record's checks and findings, then the row selection of ``decode_rows`` (same arguments):
    ``(fields, positions, file positions, body_crc_ok, anomalies)`` of the selected records only."""
    anomalies: list = []
    f = f if f is not None else K.fields(u8, pos)
    n = pos.size
    crc_ok, status, actual = np.empty(n, np.bool_), np.empty(n, np.int8), np.empty(n, np.int64)
    # one compiled pass over every record; the per-finding passes below run only for what it found
    found = C.record_checks(u8, pos, f, file_pos, base, verify_crc, C.CRC_MARKER, crc_ok, status, actual)
    ok: Optional[np.ndarray] = None
    if found:
        ok = f[K.F_OK] != 0
        anomalies = _findings(found, u8, pos, file_pos, f, ok, crc_ok, status, actual, path, base)
    if topics is not None or tx_relevant:
        names, off = topics if topics is not None else _TX_TOPICS
        keep = K.relevant(u8, f, names, off, tx_relevant)
    else:
        keep = ok if found & C.FOUND_BAD_LENGTHS else None   # None: every record is well-formed
    if keep is not None and not keep.all():
        sel = np.flatnonzero(keep)
        f, pos, file_pos, crc_ok = f[:, sel], pos[sel], file_pos[sel], crc_ok[sel]
    return f, pos, file_pos, crc_ok, anomalies


def _findings(found: int, u8: np.ndarray, pos: np.ndarray, file_pos: np.ndarray, f: np.ndarray, ok: np.ndarray,
              crc_ok: np.ndarray, status: np.ndarray, actual: np.ndarray, path: str, base: int) -> list:
    """The anomalies of the checks ``crc_kernels.record_checks`` reported in ``found``, in record order per
    kind: lengths that do not add up, PHYSICALOFFSET, body CRC, ``__CRC32#``, zeroed properties tail."""
    anomalies: list = []
    if found & C.FOUND_BAD_LENGTHS:
        for i in np.flatnonzero(~ok).tolist():
            anomalies.append(anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, int(file_pos[i]), base,
                                     "field lengths do not add up to TOTALSIZE (calMsgLength); record dropped",
                                     int(f[K.F_TOTAL, i]), "body/topic/properties lengths inconsistent",
                                     int(f[K.F_TOTAL, i])))
    if found & C.FOUND_PHYS:
        phys = file_pos + base
        stored_phys = f[K.F_STORED_PHYS]
        for i in np.flatnonzero(ok & (stored_phys != phys)).tolist():
            anomalies.append(anomaly(AnomalyKind.PHYSICAL_OFFSET_MISMATCH, path, int(file_pos[i]), base,
                                     "stored PHYSICALOFFSET differs from the record's location",
                                     int(phys[i]), int(stored_phys[i]), int(f[K.F_TOTAL, i])))
    if found & C.FOUND_BODY_CRC:
        for i in np.flatnonzero(ok & ~crc_ok).tolist():
            computed = C.crc32_zlib(u8, f[K.F_BODY_AT, i], f[K.F_BODY_SIZE, i])
            anomalies.append(anomaly(AnomalyKind.BODY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                     "BODYCRC does not match the stored body", int(f[K.F_BODY_CRC, i]),
                                     int(computed), int(f[K.F_TOTAL, i])))
    if found & C.FOUND_PROP_CRC:
        for i in np.flatnonzero(status == 2).tolist():
            t = int(pos[i] + f[K.F_TOTAL, i]) - C.PROP_CRC_RESERVED + len(C.CRC_MARKER)
            anomalies.append(anomaly(AnomalyKind.PROPERTY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                     "__CRC32# property does not match the record bytes before it",
                                     bytes(u8[t:t + 10]).decode("utf-8", "replace"), str(int(actual[i])),
                                     int(f[K.F_TOTAL, i])))
    if found & C.FOUND_ZERO_TAIL:
        anomalies.extend(zero_tail_findings(u8, pos, file_pos, f, ok, path, base))
    return anomalies


def zero_tail_findings(u8: np.ndarray, pos: np.ndarray, file_pos: np.ndarray, f: np.ndarray, ok: np.ndarray,
                       path: str, base: int) -> list:
    """BAD_PROPERTIES for each framed record whose non-empty properties end in a zero byte: its tail was
    zeroed after the write.  PROPERTIES is a record's last field, written with the rest of the record in one
    put (CommitLog.DefaultAppendMessageCallback.doAppend, 4.x and 5.x), from
    MessageDecoder.messageProperties2String: ``name 0x01 value 0x02`` per entry (4.9.x drops the last
    0x02), so its last byte is 0x02 or a value's last byte, and UTF-8 has a zero byte only for U+0000.  The
    record still frames and is read (it is CORRUPT_RECORD on the transaction that owns it), but the
    properties it lost (REAL_TOPIC, TRAN_PREPARED_QUEUE_OFFSET, ...) no longer link it."""
    n = f[K.F_PROPS_LEN]
    has = np.flatnonzero(ok & (n > 0))
    if not has.size:
        return []
    last = f[K.F_PROPS_AT, has] + n[has] - 1
    inside = last < u8.size
    bad = has[inside][u8[last[inside]] == 0]
    found = []
    for i in bad.tolist():
        at, size = int(f[K.F_PROPS_AT, i]), int(n[i])
        kept = len(bytes(u8[at:at + size]).rstrip(b"\x00"))
        found.append(anomaly(AnomalyKind.BAD_PROPERTIES, path, int(file_pos[i]), base,
                             f"the properties end in {size - kept} zero byte(s) (record bytes "
                             f"{at - int(pos[i]) + kept}..{int(f[K.F_TOTAL, i])} zeroed after the write); "
                             "record kept, properties incomplete",
                             "properties ending in 0x02 or a value's last byte",
                             f"{size - kept} zero bytes", int(f[K.F_TOTAL, i])))
    return found


def batch_of(u8: np.ndarray, pos: np.ndarray, file_pos: np.ndarray, base: int, path: str, with_body: bool,
             crc_ok: np.ndarray, f: Optional[np.ndarray] = None) -> pa.RecordBatch:
    """The COMMITLOG rows of records that ``check_rows`` selected, at ``pos`` in ``u8`` (zero-padded);
    ``f``: their field matrix when known."""
    if pos.size == 0:
        return empty_batch()
    f = f if f is not None else K.fields(u8, pos)
    return _batch(u8, f, pos, file_pos, base, path, with_body, crc_ok, pos.size)


def _ipc_tables() -> tuple:
    """(buf_src, node_m, node_nulls) of ``batch_kernels.fill`` for the IPC schema (COMMITLOG without
    ``file``): per IPC buffer the region that holds it, per array node whether its length is the map
    entries' and which ``nulls`` slot holds its null count."""
    one = {"file_position": B.R_FILE_POSITION, "physical_offset": B.R_PHYSICAL, "total_size": B.R_TOTAL,
           "magic_version": B.R_MAGIC, "body_crc": B.R_BODY_CRC, "body_crc_ok": B.R_CRC_OK,
           "queue_id": B.R_QUEUE_ID, "flag": B.R_FLAG, "queue_offset": B.R_QUEUE_OFFSET,
           "stored_physical_offset": B.R_STORED_PHYS, "sys_flag": B.R_SYS_FLAG, "born_timestamp": B.R_BORN_TS,
           "store_timestamp": B.R_STORE_TS, "reconsume_times": B.R_RECONSUME,
           "prepared_transaction_offset": B.R_PREPARED, "body_size": B.R_BODY_SIZE,
           "tags_code": B.R_TAGS_CODE}
    texts = {"transaction_type": (B.R_TT_OFF, B.R_TT_DATA), "born_host": (B.R_BORN_OFF, B.R_BORN_DATA),
             "store_host": (B.R_STORE_OFF, B.R_STORE_DATA), "topic": (B.R_TOPIC_OFF, B.R_TOPIC_DATA),
             "msg_id": (B.R_MSGID_OFF, B.R_MSGID_DATA), "compression": (B.R_COMP_OFF, B.R_COMP_DATA)}
    numbers = {q: B.R_NUMBER + i for i, (q, _) in enumerate(B.NUMBERS)}
    bufs, node_m, node_nulls = [], [], []
    for name in _NAMES[1:]:
        q = _COLUMN_Q.get(name)
        node_m.append(0)
        node_nulls.append(B.N_BODY if name == "body" else B.N_ZERO if q is None else q)
        if name in one:
            bufs += [B.R_NONE, one[name]]
        elif name in texts:
            bufs += [B.R_NONE, *texts[name]]
        elif name == "properties":            # map, then its entries struct, key and value (map entries long)
            bufs += [B.R_NONE, B.R_MAP_OFF, B.R_NONE, B.R_NONE, B.R_KEY_OFF, B.R_KEY_DATA,
                     B.R_NONE, B.R_VAL_OFF, B.R_VAL_DATA]
            node_m += [1, 1, 1]
            node_nulls += [B.N_ZERO] * 3
        elif name == "body":
            bufs += [B.R_BODY_VALID, B.R_BODY_OFF, B.R_BODY_DATA]
        elif q in numbers:
            bufs += [B.R_VALID + q, numbers[q]]
        elif q == B.Q_TRAN_MSG:
            bufs += [B.R_VALID + q, B.R_TRAN_MSG]
        else:
            assert q is not None, name          # every other column is a wanted property
            bufs += [B.R_VALID + q, B.R_W_OFF + q, B.R_W_DATA + q]
    if len(bufs) != _IPC.buffers or len(node_m) != _IPC.nodes:
        raise AssertionError("batch_kernels regions do not match the COMMITLOG schema")
    return tuple(np.asarray(x, np.int64) for x in (bufs, node_m, node_nulls))


_IPC = Template(SCHEMA.remove(0))               # every column but ``file``, added to each batch afterwards
_IPC_AT = np.asarray([_IPC.head, _IPC.length_at, _IPC.body_len_at, _IPC.nodes_at, _IPC.buffers_at], np.int64)
_BUF_SRC, _NODE_M, _NODE_NULLS = _ipc_tables()
_FILE_FIELD = SCHEMA.field(0)


def _batch(u8, f, pos, file_pos, base, path, with_body, crc_ok, n) -> pa.RecordBatch:
    """One ``batch_kernels.fill`` call into one pooled buffer read as IPC, the ``file`` column added; the rare
    shapes (text that is not all ASCII, numbers that are not plain, TAGS that are not UTF-8) then take the
    exact slow paths for the affected columns only."""
    pool = getattr(_POOLS, "batch", None)
    if pool is None:
        pool = _POOLS.batch = ChunkPool()
    reg = np.empty((B.N_REGIONS, 2), np.int64)
    nulls = np.empty(B.NW + 2, np.int64)
    for every_entry in (False, True):       # room for typical properties first, for any if they overflow it
        body = B.layout(f, with_body, reg, every_entry)
        if body >= 2 ** 31:
            raise OverflowError("chunk too large for 32-bit Arrow offsets")
        out = pool.take(_IPC.head + body)
        ascii, plain, bad_tags = B.fill(
            u8, f, pos, file_pos, base, crc_ok, with_body, out, out.view(np.int32), out.view(np.int64), reg,
            _IPC_AT, _IPC.meta, _BUF_SRC, _NODE_M, _NODE_NULLS, nulls, _WANTED_DATA, _WANTED_OFF, _WANTED_AT,
            *_TX_NAMES, *_COMPRESSION_NAMES, I.HEX_LOWER, I.HEX_PAIRS_UPPER, _TRUE)
        if plain >= 0:
            break
    batch = _IPC.read(out).add_column(0, _FILE_FIELD, _file_column(path, n))
    # text is validated once per record (all-ASCII needs no check); every key and value is cut at ASCII
    # separators, so stays valid
    clean = ascii or (T.utf8_ok(u8, f[K.F_TOPIC_AT], f[K.F_TOPIC_LEN])
                      and T.utf8_ok(u8, f[K.F_PROPS_AT], f[K.F_PROPS_LEN]))
    if clean and plain == (1 << len(B.NUMBERS)) - 1 and not bad_tags:
        return batch
    return _exact(batch, out, reg, clean, plain, bad_tags)


def _exact(batch: pa.RecordBatch, out: np.ndarray, reg: np.ndarray, clean: bool, plain: int,
           bad_tags: int) -> pa.RecordBatch:
    """``batch`` with the columns of the rare shapes redone exactly: text with invalid UTF-8 decoded with
    U+FFFD, numeric properties that are not plain ``[+-]digits`` parsed by ``_int_column``, the TAGS hash of
    TAGS values that are not UTF-8 taken from their decoded text."""
    cols = dict(zip(_NAMES, batch.columns, strict=True))
    if not clean:
        for name in ("topic", *_TEXT_PROPS):
            cols[name] = to_utf8(cols[name].view(pa.binary()))
        pmap = cols["properties"]
        cols["properties"] = pa.MapArray.from_arrays(pmap.offsets, to_utf8(pmap.keys.view(pa.binary())),
                                                     to_utf8(pmap.items.view(pa.binary())))
    for i, (q, _) in enumerate(B.NUMBERS):
        if not plain & (1 << i):
            name = _NAME_OF_Q[q]
            strings = pc.map_lookup(cols["properties"], B.WANTED[q], "last")   # its keys are unique
            cols[name] = _int_column(strings, SCHEMA.field(name).type)
    if bad_tags:
        codes = out[_IPC.head + reg[B.R_TAGS_CODE, 0]:].view(np.int64)[:batch.num_rows].copy()
        tags = cols["tags"]
        _, bad = T.java_hashes(*_column_data(out, reg, B.Q_TAGS, batch.num_rows))
        for i in np.flatnonzero(bad).tolist():
            codes[i] = P.java_string_hash(tags[i].as_py())
        cols["tags_code"] = _numeric(codes, pa.int64())
    return pa.RecordBatch.from_arrays([cols[name] for name in _NAMES], schema=SCHEMA)


_TEXT_PROPS = ("uniq_key", "tags", "keys", "pgroup", "real_topic", "transaction_id")
_NAME_OF_Q = {q: name for name, q in _COLUMN_Q.items()}


def _column_data(out: np.ndarray, reg: np.ndarray, q: int, n: int) -> tuple:
    """(data, offsets, validity) of wanted column ``q`` in a filled buffer."""
    head = _IPC.head
    off = out[head + reg[B.R_W_OFF + q, 0]:].view(np.int32)[:n + 1]
    data = out[head + reg[B.R_W_DATA + q, 0]:head + reg[B.R_W_DATA + q, 0] + reg[B.R_W_DATA + q, 1]]
    bits = out[head + reg[B.R_VALID + q, 0]:][:(n + 7) // 8]
    valid = np.unpackbits(bits, bitorder="little")[:n].astype(bool)
    return data, off, valid


