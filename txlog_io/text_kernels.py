"""Compiled (numba) text kernels of the CommitLog decoder: the properties split with
MessageDecoder.string2messageProperties semantics, the wanted-key lookup, java.lang.String.hashCode (the TAGS
hash) and the decimal parse of numeric properties -- per-record helpers that ``batch_kernels.fill`` inlines --
plus byte-range gathers and UTF-8 validation (5.3.3).  Conventions: see ``commitlog_kernels``.
"""
from __future__ import annotations

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros  # noqa: E402  (after txlog_io.jit, see there)

from txlog_io.commitlog_kernels import copy_bytes, le64, pack_strings
from txlog_io.jit import njit


@njit(inline="always")
def _same(u8, a, la, b, lb):
    if la != lb:
        return False
    for j in range(la):
        if u8[a + j] != u8[b + j]:
            return False
    return True


_ONE = np.uint64(1)
_LOW7 = np.uint64(0x7F7F7F7F7F7F7F7F)
_PLUS_125 = np.uint64(0x7D7D7D7D7D7D7D7D)
_HIGH = np.uint64(0x8080808080808080)


@njit(inline="always")
def _below3(x):
    """The high bit of every byte of ``x`` that is < 3, exactly (no borrow runs from one byte to the next:
    the low 7 bits + 125 stay below 256); trailing_zeros // 8 is then the first such byte."""
    return ~(((x & _LOW7) + _PLUS_125) | x) & _HIGH


@njit(inline="always")
def equal_words(a, at, b, bt, length):
    """a[at:at + length] == b[bt:bt + length], eight bytes at a time (both readable 7 bytes past the end)."""
    for o in range(0, length, 8):
        diff = le64(a, np.int64(at + o)) ^ le64(b, np.int64(bt + o))
        if length - o < 8:
            diff &= (_ONE << np.uint64(8 * (length - o))) - _ONE
        if diff:
            return False
    return True


@njit(inline="always")
def split_entries(u8, start, stop, ks, kv, ve):
    """string2messageProperties' split of the properties at ``u8[start:stop]``: segments end at 0x02 (or at
    ``stop``), the key runs to the segment's first 0x01, and a segment counts when both key and value are
    non-empty.  Fills ``ks`` / ``kv`` / ``ve`` (key start, its 0x01, value end; at least ``(stop - start) // 3
    + 1`` long) and returns (entries, OR of the 64-bit words read: the caller's ASCII test).  Eight bytes at a
    time: only the bytes below 3 (0x00, 0x01, 0x02) are looked at one by one."""
    e = 0
    index = start
    sep = -1                                   # first 0x01 of the current segment
    high = np.uint64(0)
    word = start
    while word < stop:
        x = le64(u8, word)
        hits = _below3(x)
        if stop - word < 8:
            tail = (_ONE << np.uint64(8 * (stop - word))) - _ONE
            x &= tail
            hits &= tail
        high |= x
        while hits:
            i = word + np.int64(trailing_zeros(hits) >> np.uint64(3))
            hits &= hits - _ONE
            c = u8[i]
            if c == 2:                         # a segment ends at a 0x02 or at the end
                if i - index >= 3 and index < sep < i - 1:
                    ks[e] = index
                    kv[e] = sep
                    ve[e] = i
                    e += 1
                index = i + 1
                sep = -1
            elif c == 1 and sep < 0:
                sep = i
        word += 8
    if stop - index >= 3 and index < sep < stop - 1:
        ks[e] = index
        kv[e] = sep
        ve[e] = stop
        e += 1
    return e, high


@njit(inline="always")
def mark_duplicates(u8, ks, kv, e, dup):
    """``dup[j]``: entry j's key comes again later among the ``e`` entries (HashMap.put: the later one wins).
    Keys are compared only when a 64-bit signature of (length, first byte) of a later key matches (the
    all-pairs check cost 16 ns/record)."""
    later = np.uint64(0)
    for j in range(e - 1, -1, -1):
        lj = kv[j] - ks[j]
        bit = _ONE << np.uint64((lj * 7 + np.int64(u8[ks[j]])) & 63)
        dup[j] = False
        if later & bit:
            for q in range(j + 1, e):
                if kv[q] - ks[q] == lj and _same(u8, ks[j], lj, ks[q], lj):
                    dup[j] = True
                    break
        later |= bit


@njit(inline="always")
def or_bytes(u8, at, length):
    """OR of the 64-bit words over u8[at:at + length], bytes past the end masked off (read: padded chunk)."""
    acc = np.uint64(0)
    for o in range(0, length, 8):
        x = le64(u8, np.int64(at + o))
        if length - o < 8:
            x &= (_ONE << np.uint64(8 * (length - o))) - _ONE
        acc |= x
    return acc


def wanted_keys(keys) -> tuple:
    """(bytes, offsets, lookup table) of the property keys ``split_properties`` reports per record; the table
    maps (length, first byte) to the key (every wanted key must differ in one of them, and be < 64 bytes)."""
    data, off = pack_strings(keys)
    data = np.concatenate([data, np.zeros(8, np.uint8)])     # equal_words reads up to 7 bytes past a key
    table = np.full(64 * 256, -1, np.int64)
    for q, k in enumerate(keys):
        b = k.encode("utf-8")
        slot = len(b) * 256 + b[0]
        if len(b) >= 64 or table[slot] >= 0:
            raise ValueError(f"wanted property keys must differ in length or first byte: {k!r}")
        table[slot] = q
    return data, off, table


@njit
def gather(u8, starts, ends, off, data):
    """The byte ranges ``[starts[k], ends[k])`` as Arrow offsets ``off`` (n + 1), their bytes copied into
    ``data`` (at least ``gather_size`` long: the caller owns both, so they can come from a pool); a negative
    start: empty value.  Returns ``off``."""
    n = starts.size
    total = np.int64(0)
    for k in range(n):
        off[k] = total
        if starts[k] >= 0:
            copy_bytes(data, total, u8, starts[k], ends[k] - starts[k])
            total += ends[k] - starts[k]
    off[n] = total
    return off


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


@njit(inline="always")
def java_hash(data, i, end):
    """(String.hashCode of the UTF-8 bytes ``data[i:end]`` (UTF-16 code units, int32 wrap-around), False), or
    (0, True) when they are not valid UTF-8 (the caller hashes them as Python decodes them, with U+FFFD)."""
    h = np.int64(0)
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
            return np.int64(0), True
        if i + need >= end:
            return np.int64(0), True
        for j in range(1, need + 1):
            cc = np.int64(data[i + j])
            if cc & 0xC0 != 0x80:
                return np.int64(0), True
            cp = (cp << 6) | (cc & 0x3F)
        if (need == 2 and (cp < 0x800 or 0xD800 <= cp <= 0xDFFF)) or (need == 3 and not
                                                                      0x10000 <= cp <= 0x10FFFF):
            return np.int64(0), True
        if cp >= 0x10000:
            cp -= 0x10000
            h = (h * 31 + (0xD800 + (cp >> 10))) & 0xFFFFFFFF
            h = (h * 31 + (0xDC00 + (cp & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (h * 31 + cp) & 0xFFFFFFFF
        i += need + 1
    return (h - (np.int64(1) << 32) if h >= (np.int64(1) << 31) else h), False


@njit
def java_hashes(data, off, valid):
    """``java_hash`` of every valid value of an Arrow string column (offsets ``off``): (codes, not UTF-8)."""
    n = off.size - 1
    codes = np.zeros(n, np.int64)
    bad = np.zeros(n, np.bool_)
    for k in range(n):
        if valid[k]:
            codes[k], bad[k] = java_hash(data, np.int64(off[k]), np.int64(off[k + 1]))
    return codes, bad


@njit(inline="always")
def decimal_int(data, i, end, lo, hi):
    """(value, True) when ``data[i:end]`` is ``[+-]?[0-9]{1,18}`` within [lo, hi] -- the shape for which
    Arrow's string cast and Python's int() agree -- else (0, False): the caller takes the exact slow path."""
    neg = i < end and data[i] == 45          # '-'
    if i < end and (data[i] == 45 or data[i] == 43):
        i += 1
    if end - i < 1 or end - i > 18:
        return np.int64(0), False
    v = np.int64(0)
    while i < end:
        d = np.int64(data[i]) - 48
        if d < 0 or d > 9:
            return np.int64(0), False
        v = v * 10 + d
        i += 1
    v = -v if neg else v
    if v < lo or v > hi:
        return np.int64(0), False
    return v, True
