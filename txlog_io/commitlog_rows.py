"""CommitLog records of one chunk -> one ``schemas.COMMITLOG`` RecordBatch, plus the record-level findings.

Layout: see the comment atop ``txlog_io.commitlog``; the loops are the numba kernels of
``txlog_io.*_kernels`` (MessageDecoder.java / CommitLog.java semantics, 5.3.3).  This module only
wraps their flat output buffers into Arrow arrays (no copy) and turns the rare findings into ``Anomaly``
values.  Order of work: every well-formed record is checked (stored PHYSICALOFFSET, body CRC, 5.2+
``__CRC32#`` property), *then* the rows are selected (topic filter or transaction relevance), and only the
selected rows get their topic, properties, hosts, ids and bodies cut out.

Rare shapes take a slower exact path for the affected values only: bytes that are not valid UTF-8 (decoded
with U+FFFD like ``bytes.decode("utf-8", "replace")``), a TAGS value that is not valid UTF-8 (hashed as that
decoded text), a numeric property that Arrow cannot parse (null).
"""
from __future__ import annotations

import threading
from typing import Optional

import numpy as np
import pyarrow as pa

from schemas.store import COMMITLOG
from txlog_io import commitlog_kernels as K
from txlog_io import commitlog_layout as L
from txlog_io import crc_kernels as C
from txlog_io import id_kernels as I
from txlog_io import properties as P
from txlog_io import text_kernels as T
from txlog_io.errors import Anomaly, AnomalyKind
from txlog_io.positional import ChunkPool

SOURCE = "commitlog"
SCHEMA = COMMITLOG.arrow_schema()
_NAMES = SCHEMA.names          # iterating the schema builds a Field object per column, per batch
_TX_NAMES = K.pack_strings(["NOT", "PREPARED", "COMMIT", "ROLLBACK"])
_COMPRESSION_NAMES = K.pack_strings(["NONE", "ZLIB", "LZ4", "ZSTD", "ZLIB", "UNKNOWN"])  # bits+1
#: property columns of COMMITLOG, in the order of the rows of text_columns' ``w_off``
_WANTED = (P.UNIQ_KEY, P.TAGS, P.KEYS, P.PGROUP, P.REAL_TOPIC, P.REAL_QID, P.TRAN_MSG, P.TRANSACTION_CHECK_TIMES,
           P.TRAN_PREPARED_QUEUE_OFFSET, P.CHECK_IMMUNITY_TIME_IN_SECONDS, P.TRANSACTION_ID)
_W = {k: i for i, k in enumerate(_WANTED)}
_WANTED_DATA, _WANTED_OFF, _WANTED_AT = T.wanted_keys(_WANTED)
_TX_TOPICS = K.pack_strings(L.TX_SYSTEM_TOPICS)
_TRUE = np.frombuffer(b"true", np.uint8)
_INT_RANGE = {pa.int32(): (np.int32, -(1 << 31), (1 << 31) - 1),
              pa.int64(): (np.int64, -(1 << 63), (1 << 63) - 1)}
_NO_TOPICS = K.pack_strings([])


def anomaly(kind, file, pos, base, detail, expected=None, actual=None, length=None) -> Anomaly:
    """A CommitLog finding at ``pos``; ``length``: bytes of the damaged range (a record, skipped bytes)."""
    return Anomaly(kind=kind, file=str(file), position=int(pos), detail=detail,
                   expected=None if expected is None else str(expected),
                   actual=None if actual is None else str(actual), source=SOURCE,
                   physical_offset=int(base + pos), length=None if length is None else int(length))


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=SCHEMA)


def _bitmap(valid: Optional[np.ndarray]) -> Optional[pa.Buffer]:
    """Arrow validity bitmap of a bool array (None: all valid)."""
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _numeric(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """Arrow array of ``typ`` over ``values`` (no copy when they are already contiguous of its width): an
    untyped ``pa.array(ndarray)`` cost 3-20 us per column, inferring the type through pandas' checks."""
    dtype = typ.to_pandas_dtype()
    return pa.Array.from_buffers(typ, values.size, [None, pa.py_buffer(np.ascontiguousarray(values, dtype))])


def _binary(off: np.ndarray, data: np.ndarray, valid: Optional[np.ndarray] = None) -> pa.Array:
    """Arrow binary array over kernel output (offsets int32 + data), no copy."""
    return pa.Array.from_buffers(pa.binary(), off.size - 1,
                                 [_bitmap(valid), pa.py_buffer(off), pa.py_buffer(data)])


def _names(index: np.ndarray, names: tuple) -> pa.Array:
    """The string column ``names[index]`` (``names``: ``pack_strings`` of the names) built by a kernel: a
    dictionary array cast to strings cost ~27 us per 4096 rows, two columns per batch."""
    return _binary(*T.pick_names(index, *names)).view(pa.string())


#: per thread: the last file's ``file`` column, sliced for each batch of that file (one file, many batches)
_FILE_COLUMN = threading.local()


def _file_column(path: str, n: int) -> pa.Array:
    path_col = getattr(_FILE_COLUMN, "col", None)
    if path_col is None or path_col[0] != path or len(path_col[1]) < n:
        path_col = _FILE_COLUMN.col = (path, _names(np.zeros(max(n, 8192), np.int64), K.pack_strings([path])))
    return path_col[1].slice(0, n)


def to_utf8(arr: pa.Array) -> pa.Array:
    """binary -> string, zero-copy after Arrow's UTF-8 validation; invalid values decoded with U+FFFD."""
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return pa.array([None if v is None else v.decode("utf-8", "replace") for v in arr.to_pylist()],
                        pa.string())


#: per thread: output buffers of ``_cut`` (bodies) reused once the batch that held them is gone (see
#: positional.ChunkPool: a fresh multi-MiB array per batch costs a page fault per 4 KiB)
_POOLS = threading.local()


def _cut(u8: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> pa.Array:
    size = T.gather_size(starts, ends)
    if size >= 2 ** 31:
        raise OverflowError("chunk too large for 32-bit Arrow offsets")
    pool = getattr(_POOLS, "cut", None)
    if pool is None:
        pool = _POOLS.cut = ChunkPool()
    data = pool.take(size)
    off = T.gather(u8, starts, ends, data)
    return _binary(off, data)


def _int_column(strings: pa.Array, typ: pa.DataType) -> pa.Array:
    try:
        return strings.cast(typ)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        _, lo, hi = _INT_RANGE[typ]
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
    ok = f[K.F_OK] != 0
    if not ok.all():
        for i in np.flatnonzero(~ok).tolist():
            anomalies.append(anomaly(AnomalyKind.BAD_TOTAL_SIZE, path, int(file_pos[i]), base,
                                     "field lengths do not add up to TOTALSIZE (calMsgLength); record dropped",
                                     int(f[K.F_TOTAL, i]), "body/topic/properties lengths inconsistent",
                                     int(f[K.F_TOTAL, i])))
    # every well-formed record is checked, whether it becomes a row or not
    phys = file_pos + base
    stored_phys = f[K.F_STORED_PHYS]
    for i in np.flatnonzero(ok & (stored_phys != phys)).tolist():
        anomalies.append(anomaly(AnomalyKind.PHYSICAL_OFFSET_MISMATCH, path, int(file_pos[i]), base,
                                 "stored PHYSICALOFFSET differs from the record's location",
                                 int(phys[i]), int(stored_phys[i]), int(f[K.F_TOTAL, i])))
    if verify_crc:
        computed = C.body_crcs(u8, f[K.F_BODY_AT], np.where(ok, f[K.F_BODY_SIZE], 0))
        crc_ok = computed == f[K.F_BODY_CRC]
        for i in np.flatnonzero(ok & ~crc_ok).tolist():
            anomalies.append(anomaly(AnomalyKind.BODY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                     "BODYCRC does not match the stored body", int(f[K.F_BODY_CRC, i]),
                                     int(computed[i]), int(f[K.F_TOTAL, i])))
    else:
        crc_ok = np.ones(pos.size, bool)
    status, actual = C.prop_crcs(u8, pos, f[K.F_TOTAL], ok, f[K.F_PROPS_AT], C.CRC_MARKER)
    for i in np.flatnonzero(status == 2).tolist():
        t = int(pos[i] + f[K.F_TOTAL, i]) - C.PROP_CRC_RESERVED + len(C.CRC_MARKER)
        anomalies.append(anomaly(AnomalyKind.PROPERTY_CRC_MISMATCH, path, int(file_pos[i]), base,
                                 "__CRC32# property does not match the record bytes before it",
                                 bytes(u8[t:t + 10]).decode("utf-8", "replace"), str(int(actual[i])),
                                 int(f[K.F_TOTAL, i])))
    if topics is not None or tx_relevant:
        names, off = topics if topics is not None else _TX_TOPICS
        keep = K.relevant(u8, f, names, off, tx_relevant)
    else:
        keep = ok
    if not keep.all():
        sel = np.flatnonzero(keep)
        f, pos, file_pos, crc_ok = f[:, sel], pos[sel], file_pos[sel], crc_ok[sel]
    return f, pos, file_pos, crc_ok, anomalies


def batch_of(u8: np.ndarray, pos: np.ndarray, file_pos: np.ndarray, base: int, path: str, with_body: bool,
             crc_ok: np.ndarray, f: Optional[np.ndarray] = None) -> pa.RecordBatch:
    """The COMMITLOG rows of records that ``check_rows`` selected, at ``pos`` in ``u8`` (zero-padded);
    ``f``: their field matrix when known."""
    if pos.size == 0:
        return empty_batch()
    f = f if f is not None else K.fields(u8, pos)
    return _batch(u8, f, pos, file_pos, base, path, with_body, crc_ok, pos.size)


def _batch(u8, f, pos, file_pos, base, path, with_body, crc_ok, n) -> pa.RecordBatch:
    sys_flag = f[K.F_SYS_FLAG]
    topic_at, topic_len, props_at, props_len = f[K.F_TOPIC_AT], f[K.F_TOPIC_LEN], f[K.F_PROPS_AT], f[K.F_PROPS_LEN]
    (t_off, t_data, map_off, k_off, k_data, v_off, v_data, w_off, w_data, present, ascii) = T.text_columns(
        u8, topic_at, topic_len, props_at, props_len, _WANTED_DATA, _WANTED_OFF, _WANTED_AT)
    # text is validated once per record (all-ASCII needs no check); every key and value is cut at ASCII
    # separators, so stays valid
    clean = ascii or (T.utf8_ok(u8, topic_at, topic_len) and T.utf8_ok(u8, props_at, props_len))

    def text(off, data, valid=None) -> pa.Array:
        arr = _binary(off, data, valid)
        return arr.view(pa.string()) if clean else to_utf8(arr)

    topic = text(t_off, t_data)
    keys = text(k_off, k_data)
    values = text(v_off, v_data)

    def prop(key: str) -> pa.Array:
        q = _W[key]
        return text(w_off[q], w_data, present[q])

    def number(key: str, typ: pa.DataType) -> pa.Array:
        # most batches lack most of these keys: an all-null column needs no parse (~5-10 us per cast)
        q = _W[key]
        if not present[q].any():
            return pa.nulls(n, typ)
        dtype, lo, hi = _INT_RANGE[typ]
        values, plain = T.decimal_ints(w_data, w_off[q], present[q], lo, hi)
        if plain:
            return pa.Array.from_buffers(typ, n, [_bitmap(present[q]), pa.py_buffer(values.astype(dtype))])
        return _int_column(prop(key), typ)

    tags = prop(P.TAGS)
    tags_code, bad_tags = T.java_hashes(w_data, w_off[_W[P.TAGS]], present[_W[P.TAGS]])
    for i in np.flatnonzero(bad_tags).tolist():
        tags_code[i] = P.java_string_hash(tags[i].as_py())
    born6 = (sys_flag & L.BORNHOST_V6_FLAG) != 0
    store6 = (sys_flag & L.STOREHOST_V6_FLAG) != 0
    born_host = _binary(*I.host_texts(u8, f[K.F_BORN_AT], born6, I.HEX_LOWER)).view(pa.string())
    store_host = _binary(*I.host_texts(u8, f[K.F_STORE_AT], store6, I.HEX_LOWER)).view(pa.string())
    msg_id = _binary(*I.msg_ids(u8, pos, f[K.F_STORE_AT], store6, I.HEX_PAIRS_UPPER)).view(pa.string())
    tran_type = _names((sys_flag & L.TRANSACTION_MASK) >> 2, _TX_NAMES)
    # index into _COMPRESSION_NAMES: 0 = not compressed, else type bits + 1 (bits 0 and 3 both mean zlib)
    comp_idx = np.where(sys_flag & 1, np.minimum(((sys_flag & 0x700) >> 8) + 1, 5), 0)
    compression = _names(comp_idx, _COMPRESSION_NAMES)
    body_at = f[K.F_BODY_AT]
    body = _cut(u8, body_at, body_at + f[K.F_BODY_SIZE]) if with_body else pa.nulls(n, pa.binary())
    pmap = pa.MapArray.from_arrays(_numeric(map_off, pa.int32()), keys, values)
    q_tran = _W[P.TRAN_MSG]
    tran_msg = np.packbits(T.values_equal(w_data, w_off[q_tran], present[q_tran], _TRUE), bitorder="little")
    i8, i32, i64 = pa.int8(), pa.int32(), pa.int64()
    cols = {
        "file": _file_column(path, n),
        "file_position": _numeric(file_pos, i64),
        "physical_offset": _numeric(file_pos + base, i64),
        "total_size": _numeric(f[K.F_TOTAL], i32),
        "magic_version": _numeric(f[K.F_V2] + 1, i8),
        "body_crc": _numeric(f[K.F_BODY_CRC], i32),
        "body_crc_ok": pa.array(crc_ok, pa.bool_()),
        "queue_id": _numeric(f[K.F_QUEUE_ID], i32),
        "flag": _numeric(f[K.F_FLAG], i32),
        "queue_offset": _numeric(f[K.F_QUEUE_OFFSET], i64),
        "stored_physical_offset": _numeric(f[K.F_STORED_PHYS], i64),
        "sys_flag": _numeric(sys_flag, i32),
        "transaction_type": tran_type,
        "born_timestamp": _numeric(f[K.F_BORN_TS], i64),
        "born_host": born_host,
        "store_timestamp": _numeric(f[K.F_STORE_TS], i64),
        "store_host": store_host,
        "reconsume_times": _numeric(f[K.F_RECONSUME], i32),
        "prepared_transaction_offset": _numeric(f[K.F_PREPARED], i64),
        "body_size": _numeric(f[K.F_BODY_SIZE], i32),
        "topic": topic,
        "properties": pmap,
        "msg_id": msg_id,
        "uniq_key": prop(P.UNIQ_KEY),
        "tags": tags,
        "keys": prop(P.KEYS),
        "pgroup": prop(P.PGROUP),
        "real_topic": prop(P.REAL_TOPIC),
        "real_qid": number(P.REAL_QID, pa.int32()),
        "tran_msg": pa.Array.from_buffers(pa.bool_(), n, [_bitmap(present[q_tran]), pa.py_buffer(tran_msg)]),
        "transaction_check_times": number(P.TRANSACTION_CHECK_TIMES, pa.int32()),
        "tran_prepared_queue_offset": number(P.TRAN_PREPARED_QUEUE_OFFSET, pa.int64()),
        "check_immunity_time_s": number(P.CHECK_IMMUNITY_TIME_IN_SECONDS, pa.int64()),
        "transaction_id": prop(P.TRANSACTION_ID),
        "tags_code": _numeric(tags_code, i64),
        "compression": compression,
        "body": body,
    }
    return pa.RecordBatch.from_arrays([cols[name] for name in _NAMES], schema=SCHEMA)
