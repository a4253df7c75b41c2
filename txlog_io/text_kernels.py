"""Compiled (numba) text kernels of the CommitLog decoder: topics and the properties split with
MessageDecoder.string2messageProperties semantics, byte-range gathers, UTF-8 validation and
java.lang.String.hashCode (the TAGS hash) (5.3.3).  Conventions: see ``commitlog_kernels``.
"""
from __future__ import annotations

import numpy as np
from numba.cpython.unsafe.numbers import trailing_zeros  # noqa: E402  (after txlog_io.jit, see there)

from txlog_io.commitlog_kernels import copy_bytes, copy_words, le64, pack_strings
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
def _equal_words(a, at, b, bt, length):
    """a[at:at + length] == b[bt:bt + length], eight bytes at a time (both readable 7 bytes past the end)."""
    for o in range(0, length, 8):
        diff = le64(a, np.int64(at + o)) ^ le64(b, np.int64(bt + o))
        if length - o < 8:
            diff &= (_ONE << np.uint64(8 * (length - o))) - _ONE
        if diff:
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
    columns' validity, and whether every topic and properties byte is ASCII (then every piece is valid UTF-8
    without a further check; tested on the words the split loads anyway, not in a pass over the copies)."""
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
    t_data = np.empty(tt + 8, np.uint8)           # + 8: copy_words writes up to 7 bytes past a value
    w = np.int64(0)
    high = np.uint64(0)                           # OR of every topic and properties byte (the ASCII test)
    for k in range(n):
        t_off[k] = w
        copy_words(t_data, w, u8, topic_at[k], topic_len[k])
        high |= _or_bytes(u8, topic_at[k], topic_len[k])
        w += topic_len[k]
    t_off[n] = w
    ks = np.empty(most, np.int64)                 # one record's entries: key start, 0x01 position, value end
    kv = np.empty(most, np.int64)
    ve = np.empty(most, np.int64)
    dup = np.empty(most, np.bool_)
    k_off = np.empty(n * 8 + 1, np.int32)         # grown below when records carry more entries
    v_off = np.empty(n * 8 + 1, np.int32)
    k_data = np.empty(total + 8, np.uint8)
    v_data = np.empty(total + 8, np.uint8)
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
        # eight bytes at a time: only the bytes below 3 (0x00, 0x01, 0x02) are looked at one by one
        word = index
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
        if m + e + 1 > k_off.size:
            grown = max(k_off.size * 2, m + e + 1)
            k2 = np.empty(grown, np.int32)
            v2 = np.empty(grown, np.int32)
            k2[:m] = k_off[:m]
            v2[:m] = v_off[:m]
            k_off, v_off = k2, v2
        # an entry whose key comes again later is dropped (HashMap.put: the later one wins); keys are compared
        # only when a 64-bit signature of (length, first byte) of a later key matches (the all-pairs check
        # cost 16 ns/record)
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
        for j in range(e):
            if dup[j]:
                continue
            lj = kv[j] - ks[j]
            vl = ve[j] - kv[j] - 1
            k_off[m] = kt
            v_off[m] = vt
            copy_words(k_data, kt, u8, ks[j], lj)
            copy_words(v_data, vt, u8, kv[j] + 1, vl)
            kt += lj
            vt += vl
            m += 1
            if lj < 64:
                q = wanted_at[lj * 256 + u8[ks[j]]]
                if q >= 0 and _equal_words(u8, ks[j], wanted, wanted_off[q], lj):
                    hit[q, k] = m - 1
                    w_size += vl
    map_off[n] = m
    k_off[m] = kt
    v_off[m] = vt
    w_off = np.empty((nw, n + 1), np.int32)
    w_data = np.empty(w_size + 8, np.uint8)
    wt = np.int64(0)
    for q in range(nw):
        for k in range(n):
            w_off[q, k] = wt
            j = hit[q, k]
            if j >= 0:                            # the value's bytes are already in v_data
                copy_words(w_data, wt, v_data, v_off[j], v_off[j + 1] - v_off[j])
                wt += v_off[j + 1] - v_off[j]
        w_off[q, n] = wt
    return (t_off, t_data[:tt], map_off, k_off[:m + 1], k_data[:kt], v_off[:m + 1], v_data[:vt], w_off,
            w_data[:w_size], hit >= 0, (high & _HIGH) == np.uint64(0))


@njit(inline="always")
def _or_bytes(u8, at, length):
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
    data = np.concatenate([data, np.zeros(8, np.uint8)])     # _equal_words reads up to 7 bytes past a key
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
            copy_bytes(data, total, u8, starts[k], ends[k] - starts[k])
            total += ends[k] - starts[k]
    off[n] = total
    return off


@njit
def pick_names(index, data, off):
    """Arrow offsets + data of the column whose row k is name ``index[k]`` of the packed names (data, off)."""
    n = index.size
    out_off = np.empty(n + 1, np.int32)
    total = np.int64(0)
    for k in range(n):
        out_off[k] = total
        total += off[index[k] + 1] - off[index[k]]
    out_off[n] = total
    out = np.empty(total, np.uint8)
    for k in range(n):
        copy_bytes(out, np.int64(out_off[k]), data, off[index[k]], off[index[k] + 1] - off[index[k]])
    return out_off, out


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
def values_equal(data, off, valid, word):
    """Row k: is value k (``valid[k]``) exactly the bytes of ``word``?  (TRAN_MSG == "true": three Arrow
    compute calls cost ~50 us per batch whatever its size.)"""
    n = off.size - 1
    out = np.zeros(n, np.bool_)
    for k in range(n):
        if valid[k] and off[k + 1] - off[k] == word.size:
            same = True
            for j in range(word.size):
                if data[off[k] + j] != word[j]:
                    same = False
                    break
            out[k] = same
    return out


@njit
def decimal_ints(data, off, valid, lo, hi):
    """(values, True) when every valid value is ``[+-]?[0-9]{1,18}`` within [lo, hi] -- the shape for which
    Arrow's string cast and Python's int() agree -- else (partial values, False): the caller takes the exact
    slow path for the column.  (A string-to-int cast costs ~16 us per batch whatever its size.)"""
    n = off.size - 1
    out = np.zeros(n, np.int64)
    for k in range(n):
        if not valid[k]:
            continue
        i = np.int64(off[k])
        end = np.int64(off[k + 1])
        neg = i < end and data[i] == 45          # '-'
        if i < end and (data[i] == 45 or data[i] == 43):
            i += 1
        if end - i < 1 or end - i > 18:
            return out, False
        v = np.int64(0)
        while i < end:
            d = np.int64(data[i]) - 48
            if d < 0 or d > 9:
                return out, False
            v = v * 10 + d
            i += 1
        v = -v if neg else v
        if v < lo or v > hi:
            return out, False
        out[k] = v
    return out, True
