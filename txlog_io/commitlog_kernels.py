"""Compiled (numba) loops of the CommitLog decoder: framing, header fields, properties, hashes, CRCs, ids.

Record layout: see the comment atop ``txlog_io.commitlog``; the rules each kernel follows are those of
store/.../CommitLog.java (checkMessageAndReturnSize, calMsgLength), common/.../message/MessageDecoder.java
(string2messageProperties, createMessageId) and java.lang.String.hashCode (5.3.3).

Every kernel works on one chunk of file bytes (a ``uint8`` array padded with zeros, see
``positional.PositionalFile.read_chunk``) and record positions relative to it, and fills flat numpy arrays
(per-record values, or Arrow-style ``int32`` offsets + ``uint8`` data) that ``commitlog_decode`` wraps into Arrow
arrays without copying them.  No kernel allocates per record or calls back into Python.

Body CRC: ``java.util.zip.CRC32`` is zlib's CRC-32.  The kernels call it through one symbol, ``txaudit_crc32``
(``crc32(init, ptr, len)``), bound at import to ISA-L's ``crc32_gzip_refl`` (PCLMULQDQ folding, shipped inside
the ``isal`` package's extension module) when that package is installed, else to the system zlib's ``crc32``.
Measured from Python on this EPYC (idle, 64 MiB buffer / 1000-byte buffers incl. the ~40 ns call): ISA-L
33.4 GB/s / 67 ns, zlib-ng 28.6 GB/s / 76 ns, zlib 1.2.13 7.2 GB/s / 241 ns; earlier, a numba slicing-by-8
loop did 0.53 GB/s against zlib's 1.12 GB/s (load ~8).  Both give the same CRC (tested).
"""
from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np

from txlog_io.jit import njit  # sets NUMBA_CACHE_DIR before numba is imported

import llvmlite.binding as _llvm  # noqa: E402
from numba import types as _nt  # noqa: E402

# --- CRC-32 (zlib polynomial), callable from nopython code ---------------------------------------------------
def _crc32_address() -> tuple:
    """(address, name) of the fastest ``crc32(uint32 init, const uint8 *buf, len)`` at hand (see docstring).
    ISA-L takes a 64-bit length and zlib a 32-bit one: kernels pass lengths < 2**31, so both read it right."""
    try:
        from isal import isal_zlib

        fn = ctypes.CDLL(isal_zlib.__file__).crc32_gzip_refl
        return ctypes.cast(fn, ctypes.c_void_p).value, "isal crc32_gzip_refl"
    except (ImportError, OSError, AttributeError):
        fn = ctypes.CDLL(ctypes.util.find_library("z") or "libz.so.1").crc32
        return ctypes.cast(fn, ctypes.c_void_p).value, "zlib crc32"


_CRC32_ADDRESS, CRC32_IMPL = _crc32_address()
# one fixed symbol name, so the kernels' on-disk cache stays valid whichever library backs it
_llvm.add_symbol("txaudit_crc32", _CRC32_ADDRESS)
_crc32 = _nt.ExternalFunction("txaudit_crc32", _nt.uint32(_nt.uint32, _nt.voidptr, _nt.uint64))

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


@njit(inline="always")
def _u32(b, i):
    return (np.int64(b[i]) << 24) | (np.int64(b[i + 1]) << 16) | (np.int64(b[i + 2]) << 8) | np.int64(b[i + 3])


@njit(inline="always")
def _i32(b, i):
    v = _u32(b, i)
    return v - (np.int64(1) << 32) if v >= (np.int64(1) << 31) else v


@njit(inline="always")
def _i16(b, i):
    v = (np.int64(b[i]) << 8) | np.int64(b[i + 1])
    return v - 65536 if v >= 32768 else v


@njit(inline="always")
def _i64(b, i):
    return (_u32(b, i) << 32) | _u32(b, i + 4)      # wraps like Java's long


@njit
def chain(u8, rel, n, verify_from, to_file_end, out, count):
    """Follow the TOTALSIZE chain from ``rel`` while the records are plain V1/V2 records that fit the chunk and
    the file and start before ``verify_from``; append their positions to ``out[count:]``.  Returns the new
    count and the position it stopped at (anything else there is for the caller's exact rules)."""
    while rel + 8 <= n and rel < verify_from:
        magic = _u32(u8, rel + 4)
        if magic != MAGIC_V1 and magic != MAGIC_V2:
            break
        total = _i32(u8, rel)
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
        esize = _i32(u8, rel + 4)
        if _i32(u8, rel) != 1 or _i64(u8, rel + 24) != base_fp + rel or esize < min_entry or rel + esize > n:
            break
        room = esize - 48
        magic = _u32(u8, rel + 52)
        out[count] = rel
        odd[count] = _i32(u8, rel + 44) != room or _i32(u8, rel + 48) != room or \
            (magic != MAGIC_V1 and magic != MAGIC_V2)
        count += 1
        rel += esize
    return out[:count], odd[:count]


@njit
def shape_ok_at(u8, p, total):
    """Do the length fields of the record at ``p`` (all of it in ``u8``) add up to ``total`` (calMsgLength)?"""
    sys_flag = _i32(u8, p + 36)
    b = 20 if sys_flag & 0x10 else 8
    s = 20 if sys_flag & 0x20 else 8
    fixed = 72 + b + s
    v2 = _u32(u8, p + 4) == MAGIC_V2
    tw = 2 if v2 else 1
    body = _i32(u8, p + fixed - 4)
    if body < 0 or fixed + body + tw + 2 > total:
        return False
    t = p + fixed + body
    tl = _i16(u8, t) if v2 else (np.int64(u8[t]) - 256 if u8[t] >= 128 else np.int64(u8[t]))
    if tl <= 0 or fixed + body + tw + tl + 2 > total:
        return False
    pl = _i16(u8, t + tw + tl)
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
            magic = _u32(u8, i + 4)
            total = _i32(u8, i)
            fp = file_pos + i
            if magic == BLANK_MAGIC:
                if fp + total == file_size:
                    return i, 0
            elif magic == MAGIC_V1 or magic == MAGIC_V2:
                if total >= MIN_RECORD_SIZE and fp + total <= file_size:
                    if i + total > n:
                        return i, 1
                    if _i64(u8, i + PHYSICAL_OFFSET_AT) == base + fp and shape_ok_at(u8, i, total):
                        return i, 0
        i += 1
    return -1, 0


@njit
def fields(u8, pos):
    """Fixed fields and the shape check of every record; a (N_FIELDS, n) int64 matrix (rows: F_*)."""
    n = pos.size
    f = np.empty((N_FIELDS, n), np.int64)         # every row is written below
    for k in range(n):
        p = pos[k]
        total = _i32(u8, p)
        v2 = _u32(u8, p + 4) == MAGIC_V2
        sys_flag = _i32(u8, p + 36)
        b = 20 if sys_flag & 0x10 else 8
        s = 20 if sys_flag & 0x20 else 8
        fixed = 72 + b + s
        body = _i32(u8, p + fixed - 4)
        tw = 2 if v2 else 1
        f[F_TOTAL, k] = total
        f[F_V2, k] = 1 if v2 else 0
        f[F_BODY_CRC, k] = _i32(u8, p + 8)
        f[F_QUEUE_ID, k] = _i32(u8, p + 12)
        f[F_FLAG, k] = _i32(u8, p + 16)
        f[F_QUEUE_OFFSET, k] = _i64(u8, p + 20)
        f[F_STORED_PHYS, k] = _i64(u8, p + 28)
        f[F_SYS_FLAG, k] = sys_flag
        f[F_BORN_TS, k] = _i64(u8, p + 40)
        f[F_STORE_TS, k] = _i64(u8, p + 48 + b)
        f[F_RECONSUME, k] = _i32(u8, p + 56 + b + s)
        f[F_PREPARED, k] = _i64(u8, p + 60 + b + s)
        f[F_BODY_SIZE, k] = body
        f[F_BODY_AT, k] = p + fixed
        f[F_BORN_AT, k] = p + 48
        f[F_STORE_AT, k] = p + 56 + b
        ok = body >= 0 and fixed + body + tw + 2 <= total
        t = p + fixed + body if ok else p
        if v2:
            tl = _i16(u8, t)
        else:
            tl = np.int64(u8[t]) - 256 if u8[t] >= 128 else np.int64(u8[t])
        ok = ok and tl > 0 and fixed + body + tw + tl + 2 <= total
        pa = t + tw + tl if ok else p
        pl = _i16(u8, pa)
        ok = ok and pl >= 0 and fixed + body + tw + tl + 2 + pl == total
        f[F_TOPIC_AT, k] = t + tw
        f[F_TOPIC_LEN, k] = tl if ok else 0
        f[F_PROPS_AT, k] = pa + 2
        f[F_PROPS_LEN, k] = pl if ok else 0
        f[F_OK, k] = 1 if ok else 0
    return f


@njit
def crc32_zlib(u8, start, length):
    if length <= 0:
        return np.int64(0)
    return np.int64(_crc32(np.uint32(0), u8[start:].ctypes.data, np.uint64(length)) & 0x7FFFFFFF)


@njit
def body_crcs(u8, starts, lengths):
    """UtilAll.crc32 of every body (masked to 31 bits, 0 for an empty body)."""
    out = np.zeros(starts.size, np.int64)
    for k in range(starts.size):
        out[k] = crc32_zlib(u8, starts[k], lengths[k])
    return out


_CRC_MARKER = np.frombuffer(b"__CRC32#\x01", np.uint8).copy()
PROP_CRC_RESERVED = 20


@njit
def prop_crcs(u8, pos, totals, ok, props_at, marker):
    """5.2+ ``__CRC32#`` trailing property (CommitLog.doAppend): per record 0 = none, 1 = matches, 2 = does not
    match; plus the CRC computed over the record bytes before the 20 reserved ones."""
    n = pos.size
    status = np.zeros(n, np.int8)
    actual = np.zeros(n, np.int64)
    m = marker.size
    for k in range(n):
        if not ok[k] or totals[k] < PROP_CRC_RESERVED:
            continue
        t = pos[k] + totals[k] - PROP_CRC_RESERVED
        if t < props_at[k] or u8[t + PROP_CRC_RESERVED - 1] != 2:
            continue
        same = True
        for j in range(m):
            if u8[t + j] != marker[j]:
                same = False
                break
        # the entry must be a segment of its own: at the start of the properties or right after a 0x02
        if not same or (t > props_at[k] and u8[t - 1] != 2):
            continue
        expected = np.int64(0)
        digits = True
        for j in range(9, -1, -1):               # least-significant digit first
            d = np.int64(u8[t + m + j]) - 48
            if d < 0 or d > 9:
                digits = False
            expected = expected * 10 + d
        actual[k] = crc32_zlib(u8, pos[k], totals[k] - PROP_CRC_RESERVED)
        status[k] = 1 if digits and expected == actual[k] else 2
    return status, actual


@njit(inline="always")
def _same(u8, a, la, b, lb):
    if la != lb:
        return False
    for j in range(la):
        if u8[a + j] != u8[b + j]:
            return False
    return True


@njit
def text_columns(u8, topic_at, topic_len, starts, lengths, wanted, wanted_off, wanted_at):
    """Topics and properties of every record in one pass over their bytes: the topic column, the properties
    map (string2messageProperties: split on 0x02, key before the first 0x01, both non-empty, a later duplicate
    key wins and the earlier entry is dropped) and one column per wanted key (``wanted`` bytes, ``wanted_off``
    offsets; ``wanted_at[len * 256 + first byte]`` = its index, see ``wanted_keys``).

    Returns Arrow offsets + data of the topics, the map (per-record entry offsets, keys, values) and the
    wanted columns (all in one data buffer, row q of ``w_off`` starts where its bytes start), the wanted
    columns' validity, and whether every byte copied was ASCII (then every piece is valid UTF-8 without a
    further check)."""
    n = starts.size
    nw = wanted_off.size - 1
    t_off = np.empty(n + 1, np.int32)
    tt = np.int64(0)
    total = np.int64(0)
    most = np.int64(1)
    for k in range(n):
        tt += topic_len[k]
        total += lengths[k]
        most = max(most, lengths[k] // 3 + 1)     # segments of >= 3 bytes plus a shorter last one
    t_data = np.empty(tt, np.uint8)
    w = np.int64(0)
    for k in range(n):
        t_off[k] = w
        _copy(t_data, w, u8, topic_at[k], topic_len[k])
        w += topic_len[k]
    t_off[n] = w
    ks = np.empty(most, np.int64)                 # one record's entries: key start, 0x01 position, value end
    kv = np.empty(most, np.int64)
    ve = np.empty(most, np.int64)
    k_off = np.empty(n * 8 + 1, np.int32)         # grown below when records carry more entries
    v_off = np.empty(n * 8 + 1, np.int32)
    k_data = np.empty(total, np.uint8)
    v_data = np.empty(total, np.uint8)
    map_off = np.empty(n + 1, np.int32)
    hit = np.full((nw, n), -1, np.int32)         # the map entry holding wanted key q of record k
    w_size = np.int64(0)
    m = 0
    kt = np.int64(0)
    vt = np.int64(0)
    for k in range(n):
        map_off[k] = m
        e = 0
        index = starts[k]
        stop = starts[k] + lengths[k]
        sep = -1                                   # first 0x01 of the current segment
        for i in range(index, stop):
            c = u8[i]
            if c > 2:
                continue
            if c == 2:                             # a segment ends at a 0x02 or at the end
                if i - index >= 3 and index < sep < i - 1:
                    ks[e] = index
                    kv[e] = sep
                    ve[e] = i
                    e += 1
                index = i + 1
                sep = -1
            elif c == 1 and sep < 0:
                sep = i
        if stop - index >= 3 and index < sep < stop - 1:
            ks[e] = index
            kv[e] = sep
            ve[e] = stop
            e += 1
        if m + e + 1 > k_off.size:
            grown = max(k_off.size * 2, m + e + 1)
            k2 = np.empty(grown, np.int32)
            v2 = np.empty(grown, np.int32)
            k2[:m] = k_off[:m]
            v2[:m] = v_off[:m]
            k_off, v_off = k2, v2
        for j in range(e):
            lj = kv[j] - ks[j]
            dup = False
            for q in range(j + 1, e):
                if kv[q] - ks[q] == lj and u8[ks[q]] == u8[ks[j]] and _same(u8, ks[j], lj, ks[q], lj):
                    dup = True
                    break
            if dup:
                continue
            vl = ve[j] - kv[j] - 1
            k_off[m] = kt
            v_off[m] = vt
            _copy(k_data, kt, u8, ks[j], lj)
            _copy(v_data, vt, u8, kv[j] + 1, vl)
            kt += lj
            vt += vl
            m += 1
            if lj < 64:
                q = wanted_at[lj * 256 + u8[ks[j]]]
                if q >= 0:
                    same = True
                    for t in range(lj):
                        if u8[ks[j] + t] != wanted[wanted_off[q] + t]:
                            same = False
                            break
                    if same:
                        hit[q, k] = m - 1
                        w_size += vl
    map_off[n] = m
    k_off[m] = kt
    v_off[m] = vt
    w_off = np.empty((nw, n + 1), np.int32)
    w_data = np.empty(w_size, np.uint8)
    wt = np.int64(0)
    for q in range(nw):
        for k in range(n):
            w_off[q, k] = wt
            j = hit[q, k]
            if j >= 0:                            # the value's bytes are already in v_data
                _copy(w_data, wt, v_data, v_off[j], v_off[j + 1] - v_off[j])
                wt += v_off[j + 1] - v_off[j]
        w_off[q, n] = wt
    return (t_off, t_data, map_off, k_off[:m + 1], k_data[:kt], v_off[:m + 1], v_data[:vt], w_off, w_data,
            hit >= 0, _ascii(t_data) and _ascii(k_data[:kt]) and _ascii(v_data[:vt]))


@njit(inline="always")
def _ascii(data):
    acc = 0
    for i in range(data.size):                    # a plain reduction: vectorised
        acc |= data[i]
    return acc < 0x80


def wanted_keys(keys) -> tuple:
    """(bytes, offsets, lookup table) of the property keys ``split_properties`` reports per record; the table
    maps (length, first byte) to the key (every wanted key must differ in one of them, and be < 64 bytes)."""
    data, off = pack_strings(keys)
    table = np.full(64 * 256, -1, np.int64)
    for q, k in enumerate(keys):
        b = k.encode("utf-8")
        slot = len(b) * 256 + b[0]
        if len(b) >= 64 or table[slot] >= 0:
            raise ValueError(f"wanted property keys must differ in length or first byte: {k!r}")
        table[slot] = q
    return data, off, table


@njit
def gather(u8, starts, ends, data):
    """The byte ranges ``[starts[k], ends[k])`` as Arrow offsets, their bytes copied into ``data`` (at least
    ``gather_size`` long: the caller owns it, so it can come from a pool); a negative start: empty value."""
    n = starts.size
    off = np.empty(n + 1, np.int32)
    total = np.int64(0)
    for k in range(n):
        off[k] = total
        if starts[k] >= 0:
            _copy(data, total, u8, starts[k], ends[k] - starts[k])
            total += ends[k] - starts[k]
    off[n] = total
    return off


_memcpy = _nt.ExternalFunction("memcpy", _nt.voidptr(_nt.voidptr, _nt.voidptr, _nt.uintp))


@njit(inline="always")
def _copy(dst, at, src, start, length):
    if length > 4:                                # libc memcpy (measured: cheaper from 5 bytes up)
        _memcpy(dst.ctypes.data + at, src.ctypes.data + start, length)
    else:                                         # short (topics, keys, values): a plain loop is cheaper
        for j in range(length):
            dst[at + j] = src[start + j]


@njit
def utf8_ok(u8, starts, lengths):
    """Are all the byte ranges valid UTF-8 (then every piece cut at an ASCII separator is valid too)?"""
    for k in range(starts.size):
        i = starts[k]
        end = starts[k] + lengths[k]
        while i < end:
            c = u8[i]
            if c < 0x80:
                i += 1
                continue
            if 0xC2 <= c < 0xE0:
                need = 1
            elif 0xE0 <= c < 0xF0:
                need = 2
            elif 0xF0 <= c < 0xF5:
                need = 3
            else:
                return False
            if i + need >= end:
                return False
            for j in range(1, need + 1):
                if u8[i + j] & 0xC0 != 0x80:
                    return False
            c1 = u8[i + 1]
            if (c == 0xE0 and c1 < 0xA0) or (c == 0xED and c1 >= 0xA0) or (c == 0xF0 and c1 < 0x90) or \
                    (c == 0xF4 and c1 >= 0x90):
                return False                      # overlong, surrogate or beyond U+10FFFF
            i += need + 1
    return True


@njit
def gather_size(starts, ends):
    total = np.int64(0)
    for k in range(starts.size):
        if starts[k] >= 0:
            total += ends[k] - starts[k]
    return total


@njit
def _put_int(out, at, v):
    if v < 0:
        out[at] = 45                              # '-'
        at += 1
        v = -v
    digits = 1
    t = v
    while t >= 10:
        t //= 10
        digits += 1
    for j in range(digits - 1, -1, -1):
        out[at + j] = 48 + v % 10
        v //= 10
    return at + digits


_HEX_LOWER = np.frombuffer(b"0123456789abcdef", np.uint8).copy()
_HEX_UPPER = np.frombuffer(b"0123456789ABCDEF", np.uint8).copy()


@njit
def host_texts(u8, at, v6, hexd):
    """InetAddress.getHostAddress + port: "a.b.c.d:port" or "[x:x:x:x:x:x:x:x]:port" (lower-case groups
    without leading zeros or zero compression) for the host fields starting at ``at``."""
    n = at.size
    off = np.empty(n + 1, np.int32)
    upper = 0
    for k in range(n):                  # longest: "255.255.255.255:-2147483648", "[ffff:..:ffff]:-2147483648"
        upper += 53 if v6[k] else 27
    data = np.empty(upper, np.uint8)
    w = 0
    for k in range(n):
        off[k] = w
        p = at[k]
        if k > 0 and v6[k] == v6[k - 1]:
            q = at[k - 1]
            same = _u32(u8, p) == _u32(u8, q) and _u32(u8, p + 4) == _u32(u8, q + 4)
            if same and v6[k]:
                for j in range(8, 20):
                    if u8[p + j] != u8[q + j]:
                        same = False
                        break
            if same:                              # the same host as the record before: copy its text
                prev = off[k - 1]
                _copy(data, w, data, prev, w - prev)
                w += w - prev
                continue
        if v6[k]:
            data[w] = 91                          # '['
            w += 1
            for g in range(8):
                v = (np.int64(u8[p + 2 * g]) << 8) | np.int64(u8[p + 2 * g + 1])
                started = False
                for sh in range(12, -1, -4):
                    d = (v >> sh) & 0xF
                    if d or started or sh == 0:
                        data[w] = hexd[d]
                        w += 1
                        started = True
                if g < 7:
                    data[w] = 58                  # ':'
                    w += 1
            data[w] = 93                          # ']'
            w += 1
            port_at = p + 16
        else:
            for j in range(4):
                w = _put_int(data, w, np.int64(u8[p + j]))
                if j < 3:
                    data[w] = 46                  # '.'
                    w += 1
            port_at = p + 4
        data[w] = 58
        w += 1
        w = _put_int(data, w, _i32(u8, port_at))
    off[n] = w
    return off, data[:w]


@njit
def msg_ids(u8, pos, store_at, v6, hexd):
    """offsetMsgId: upper-case hex of store IP + port + the stored PHYSICALOFFSET (32 or 56 characters)."""
    n = pos.size
    off = np.empty(n + 1, np.int32)
    total = 0
    for k in range(n):
        off[k] = total
        total += 56 if v6[k] else 32
    off[n] = total
    data = np.empty(total, np.uint8)
    for k in range(n):
        w = off[k]
        ip_port = 20 if v6[k] else 8
        for j in range(ip_port):
            b = u8[store_at[k] + j]
            data[w] = hexd[b >> 4]
            data[w + 1] = hexd[b & 0xF]
            w += 2
        for j in range(8):
            b = u8[pos[k] + PHYSICAL_OFFSET_AT + j]
            data[w] = hexd[b >> 4]
            data[w + 1] = hexd[b & 0xF]
            w += 2
    return off, data


@njit
def java_hashes(data, off, valid):
    """String.hashCode of UTF-8 values (UTF-16 code units, int32 wrap-around; 0 for null or empty).  Values
    that are not valid UTF-8 get flag 1 (the caller hashes them as Python decodes them, with U+FFFD)."""
    n = off.size - 1
    codes = np.zeros(n, np.int64)
    bad = np.zeros(n, np.bool_)
    for k in range(n):
        if not valid[k]:
            continue
        h = np.int64(0)
        i = np.int64(off[k])
        end = np.int64(off[k + 1])
        while i < end:
            c = np.int64(data[i])
            if c < 0x80:
                need, cp = 0, c
            elif 0xC2 <= c < 0xE0:
                need, cp = 1, c & 0x1F
            elif 0xE0 <= c < 0xF0:
                need, cp = 2, c & 0x0F
            elif 0xF0 <= c < 0xF5:
                need, cp = 3, c & 0x07
            else:
                bad[k] = True
                break
            if i + need >= end:
                bad[k] = True
                break
            for j in range(1, need + 1):
                cc = np.int64(data[i + j])
                if cc & 0xC0 != 0x80:
                    bad[k] = True
                    break
                cp = (cp << 6) | (cc & 0x3F)
            if bad[k]:
                break
            if (need == 2 and (cp < 0x800 or 0xD800 <= cp <= 0xDFFF)) or (need == 3 and not
                                                                          0x10000 <= cp <= 0x10FFFF):
                bad[k] = True
                break
            if cp >= 0x10000:
                cp -= 0x10000
                h = (h * 31 + (0xD800 + (cp >> 10))) & 0xFFFFFFFF
                h = (h * 31 + (0xDC00 + (cp & 0x3FF))) & 0xFFFFFFFF
            else:
                h = (h * 31 + cp) & 0xFFFFFFFF
            i += need + 1
        codes[k] = h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h
    return codes, bad


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


HEX_LOWER, HEX_UPPER, CRC_MARKER = _HEX_LOWER, _HEX_UPPER, _CRC_MARKER
