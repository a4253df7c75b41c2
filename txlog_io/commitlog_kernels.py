"""Compiled (numba) loops of the CommitLog decoder, framing part: record chains, resynchronisation, the fixed
header fields and the shape check of every record, the transaction-relevance filter; plus the byte readers and
the copy the other kernel modules share.

Record layout: see the comment atop ``txlog_io.commitlog``; the rules each kernel follows are those of
store/.../CommitLog.java (checkMessageAndReturnSize, calMsgLength) (5.3.3).  The other kernels:
``crc_kernels`` (body and ``__CRC32#`` CRCs), ``text_kernels`` (topics, properties, TAGS hash, UTF-8),
``id_kernels`` (host texts, msgId).

Every kernel works on one chunk of file bytes (a ``uint8`` array padded with zeros, see
``positional.PositionalFile.read_chunk``) and record positions relative to it, and fills flat numpy arrays
(per-record values, or Arrow-style ``int32`` offsets + ``uint8`` data) that ``commitlog_decode`` wraps into Arrow
arrays without copying them.  No kernel allocates per record or calls back into Python.  Kernels inline
helpers across these modules; ``txlog_io.jit`` keys their disk cache on all of them, so an edit to one
recompiles the others.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir  # noqa: E402
from numba import types as _nt  # noqa: E402
from numba.core.extending import intrinsic as _intrinsic  # noqa: E402

from txlog_io.jit import njit  # sets NUMBA_CACHE_DIR before numba is imported

MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
MIN_RECORD_SIZE = 91
PHYSICAL_OFFSET_AT = 28

# rows of the per-record field matrix ``fields`` returns (one contiguous row per field)
F_TOTAL, F_V2, F_BODY_CRC, F_QUEUE_ID, F_FLAG, F_QUEUE_OFFSET, F_STORED_PHYS, F_SYS_FLAG, F_BORN_TS, \
    F_STORE_TS, F_RECONSUME, F_PREPARED, F_BODY_SIZE, F_BODY_AT, F_TOPIC_AT, F_TOPIC_LEN, F_PROPS_AT, \
    F_PROPS_LEN, F_OK, F_BORN_AT, F_STORE_AT = range(21)
N_FIELDS = 21


def _load(bits: int, big_endian: bool, result):
    """An intrinsic reading the unsigned ``bits``-bit integer at byte ``i`` of a uint8 array as one unaligned
    load (plus a byte swap for big-endian), widened to ``result`` (64 bits wrap like Java's long).  LLVM does
    not merge the four or eight byte loads of the plain expression into one (119 byte loads in ``fields``)."""
    width = ir.IntType(bits)

    @_intrinsic
    def load(typingctx, arr, idx):
        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            ptr = builder.bitcast(builder.gep(data, [args[1]]), width.as_pointer())
            v = builder.load(ptr, align=1)
            v = builder.bswap(v) if big_endian else v
            return v if bits == 64 else builder.zext(v, ir.IntType(64))
        return result(arr, idx), codegen
    return load


_be32 = _load(32, True, _nt.int64)
_be64 = _load(64, True, _nt.int64)
#: the 8 bytes at ``i`` as a little-endian uint64 (byte ``i`` lowest): word-at-a-time scans
le64 = _load(64, False, _nt.uint64)


@_intrinsic
def store64(typingctx, arr, idx, value):
    """Unaligned store of the uint64 ``value`` (little-endian) at byte ``idx`` of a uint8 array."""
    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        ptr = builder.bitcast(builder.gep(data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], ptr, align=1)
        return context.get_dummy_value()
    return _nt.void(arr, idx, _nt.uint64), codegen


@njit(inline="always")
def u32(b, i):
    return _be32(b, np.int64(i))


@njit(inline="always")
def i32(b, i):
    v = u32(b, i)
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


@njit(inline="always")
def i16(b, i):
    v = (np.int64(b[i]) << 8) | np.int64(b[i + 1])
    return v - 65536 if v >= 32768 else v


@njit(inline="always")
def i64(b, i):
    return _be64(b, np.int64(i))


@njit
def chain(u8, rel, n, verify_from, to_file_end, out, count):
    """Follow the TOTALSIZE chain from ``rel`` while the records are plain V1/V2 records that fit the chunk and
    the file and start before ``verify_from``; append their positions to ``out[count:]``.  Returns the new
    count and the position it stopped at (anything else there is for the caller's exact rules)."""
    while rel + 8 <= n and rel < verify_from:
        magic = u32(u8, rel + 4)
        if magic != MAGIC_V1 and magic != MAGIC_V2:
            break
        total = i32(u8, rel)
        if total < MIN_RECORD_SIZE or rel + total > to_file_end or rel + total > n:
            break
        out[count] = rel
        count += 1
        rel += total
    return count, rel


@njit
def entry_chain(u8, n, base_fp, limit, min_entry, gather):
    """DLedger entries (txlog_io.dledger: magic 1 at +0, size at +4, pos at +24) chained from 0 in the chunk
    ``u8[:n]`` whose first byte has DLedger offset ``base_fp``: accepted while the magic is 1, ``pos`` equals
    the entry's own offset, the size is at least ``min_entry`` and the entry lies in the chunk, for entries
    starting below ``limit`` with ``gather`` header bytes readable.  Returns their relative positions (the
    first irregular entry is left to the exact rules of ``dledger._walk``) and per entry whether it needs
    the entry-vs-record checks of ``dledger._frame`` (bodySize or the inner record's magic / TOTALSIZE
    disagree)."""
    out = np.empty(n // min_entry + 1, np.int64)
    odd = np.empty(n // min_entry + 1, np.bool_)
    count = 0
    rel = 0
    stop = min(n - gather, limit - 1)
    while rel <= stop:
        esize = i32(u8, rel + 4)
        if i32(u8, rel) != 1 or i64(u8, rel + 24) != base_fp + rel or esize < min_entry or rel + esize > n:
            break
        room = esize - 48
        magic = u32(u8, rel + 52)
        out[count] = rel
        odd[count] = i32(u8, rel + 44) != room or i32(u8, rel + 48) != room or \
            (magic != MAGIC_V1 and magic != MAGIC_V2)
        count += 1
        rel += esize
    return out[:count], odd[:count]


@njit
def shape_ok_at(u8, p, total):
    """Do the length fields of the record at ``p`` (all of it in ``u8``) add up to ``total`` (calMsgLength)?"""
    sys_flag = i32(u8, p + 36)
    b = 20 if sys_flag & 0x10 else 8
    s = 20 if sys_flag & 0x20 else 8
    fixed = 72 + b + s
    v2 = u32(u8, p + 4) == MAGIC_V2
    tw = 2 if v2 else 1
    body = i32(u8, p + fixed - 4)
    if body < 0 or fixed + body + tw + 2 > total:
        return False
    t = p + fixed + body
    tl = i16(u8, t) if v2 else (np.int64(u8[t]) - 256 if u8[t] >= 128 else np.int64(u8[t]))
    if tl <= 0 or fixed + body + tw + tl + 2 > total:
        return False
    pl = i16(u8, t + tw + tl)
    return pl >= 0 and fixed + body + tw + tl + 2 + pl == total


@njit
def find_boundary(u8, lo, hi, n, file_pos, base, file_size):
    """First position in ``[lo, hi)`` of the chunk ``u8[:n]`` (which starts at ``file_pos``) holding a
    self-verifying record or BLANK header (see commitlog_decode).  Returns (position, 0) when found, (candidate,
    1) for a candidate whose record runs past the chunk (the caller verifies it with a read), (-1, 0)."""
    i = max(lo, 0)
    while i < hi and i + 8 <= n:
        if u8[i + 4] == 0xDA and u8[i + 5] == 0xA3 and u8[i + 6] == 0x20 or \
                u8[i + 4] == 0xCB and u8[i + 5] == 0xD4 and u8[i + 6] == 0x31:
            magic = u32(u8, i + 4)
            total = i32(u8, i)
            fp = file_pos + i
            if magic == BLANK_MAGIC:
                if fp + total == file_size:
                    return i, 0
            elif magic == MAGIC_V1 or magic == MAGIC_V2:
                if total >= MIN_RECORD_SIZE and fp + total <= file_size:
                    if i + total > n:
                        return i, 1
                    if i64(u8, i + PHYSICAL_OFFSET_AT) == base + fp and shape_ok_at(u8, i, total):
                        return i, 0
        i += 1
    return -1, 0


@njit
def fields(u8, pos):
    """Fixed fields and the shape check of every record; a (N_FIELDS, n) int64 matrix (rows: F_*).

    Two loops: the header fields first, then the topic and properties lengths, which lie after the body (a
    different cache line, at an address the body length gives).  In one loop each record was a chain of
    dependent loads from L3 (sys flag -> body length -> topic length -> properties length) that out-of-order
    execution could not overlap across records: 65 ns/record for 1 KiB records, against 17 with the chunk in
    L2; the second loop's loads depend only on the first loop's output, so they overlap."""
    n = pos.size
    f = np.empty((N_FIELDS, n), np.int64)         # every row is written below
    for k in range(n):
        p = pos[k]
        sys_flag = i32(u8, p + 36)
        b = 20 if sys_flag & 0x10 else 8
        s = 20 if sys_flag & 0x20 else 8
        fixed = 72 + b + s
        f[F_TOTAL, k] = i32(u8, p)
        f[F_V2, k] = 1 if u32(u8, p + 4) == MAGIC_V2 else 0
        f[F_BODY_CRC, k] = i32(u8, p + 8)
        f[F_QUEUE_ID, k] = i32(u8, p + 12)
        f[F_FLAG, k] = i32(u8, p + 16)
        f[F_QUEUE_OFFSET, k] = i64(u8, p + 20)
        f[F_STORED_PHYS, k] = i64(u8, p + 28)
        f[F_SYS_FLAG, k] = sys_flag
        f[F_BORN_TS, k] = i64(u8, p + 40)
        f[F_STORE_TS, k] = i64(u8, p + 48 + b)
        f[F_RECONSUME, k] = i32(u8, p + 56 + b + s)
        f[F_PREPARED, k] = i64(u8, p + 60 + b + s)
        f[F_BODY_SIZE, k] = i32(u8, p + fixed - 4)
        f[F_BODY_AT, k] = p + fixed
        f[F_BORN_AT, k] = p + 48
        f[F_STORE_AT, k] = p + 56 + b
    for k in range(n):
        p = pos[k]
        total = f[F_TOTAL, k]
        v2 = f[F_V2, k] != 0
        body = f[F_BODY_SIZE, k]
        fixed = f[F_BODY_AT, k] - p
        tw = 2 if v2 else 1
        ok = body >= 0 and fixed + body + tw + 2 <= total
        t = p + fixed + body if ok else p
        if v2:
            tl = i16(u8, t)
        else:
            tl = np.int64(u8[t]) - 256 if u8[t] >= 128 else np.int64(u8[t])
        ok = ok and tl > 0 and fixed + body + tw + tl + 2 <= total
        pa = t + tw + tl if ok else p
        pl = i16(u8, pa)
        ok = ok and pl >= 0 and fixed + body + tw + tl + 2 + pl == total
        f[F_TOPIC_AT, k] = t + tw
        f[F_TOPIC_LEN, k] = tl if ok else 0
        f[F_PROPS_AT, k] = pa + 2
        f[F_PROPS_LEN, k] = pl if ok else 0
        f[F_OK, k] = 1 if ok else 0
    return f


_memcpy = _nt.ExternalFunction("memcpy", _nt.voidptr(_nt.voidptr, _nt.voidptr, _nt.uintp))


@njit(inline="always")
def copy_words(dst, at, src, start, length):
    """``copy_bytes`` for short values, eight bytes at a time: it reads and writes up to 7 bytes past the
    value, so ``src`` must have them (a zero-padded chunk) and ``dst`` too (kernels allocate 8 spare bytes
    and fill their output in order, so the next value overwrites them).  Longer values go to memcpy."""
    if length > 64:
        _memcpy(dst.ctypes.data + at, src.ctypes.data + start, length)
    else:
        for o in range(0, length, 8):
            store64(dst, np.int64(at + o), le64(src, np.int64(start + o)))


@njit(inline="always")
def copy_bytes(dst, at, src, start, length):
    if length > 4:                                # libc memcpy (measured: cheaper from 5 bytes up)
        _memcpy(dst.ctypes.data + at, src.ctypes.data + start, length)
    else:                                         # short (topics, keys, values): a plain loop is cheaper
        for j in range(length):
            dst[at + j] = src[start + j]


@njit
def relevant(u8, f, topic_names, topic_off, tx):
    """Well-formed records whose topic is among ``topic_names``; with ``tx`` also every transaction-relevant
    record (what the reconstruction reads): transaction type not NOT or magic V2 (5.1+ profile evidence)."""
    n = f.shape[1]
    keep = np.zeros(n, np.bool_)
    nt = topic_off.size - 1
    for k in range(n):
        if not f[F_OK, k]:
            continue
        if tx and (f[F_SYS_FLAG, k] & 0xC or f[F_V2, k]):
            keep[k] = True
            continue
        at = f[F_TOPIC_AT, k]
        tl = f[F_TOPIC_LEN, k]
        for q in range(nt):
            if topic_off[q + 1] - topic_off[q] != tl:
                continue
            same = True
            for j in range(tl):
                if u8[at + j] != topic_names[topic_off[q] + j]:
                    same = False
                    break
            if same:
                keep[k] = True
                break
    return keep


def pack_strings(values) -> tuple:
    """(uint8 data, int64 offsets) of a list of str (the kernels' input form of a small string set)."""
    raw = [v.encode("utf-8") for v in values]
    off = np.zeros(len(raw) + 1, np.int64)
    np.cumsum([len(r) for r in raw], out=off[1:])
    data = np.frombuffer(b"".join(raw), np.uint8).copy() if raw else np.zeros(0, np.uint8)
    return data, off
