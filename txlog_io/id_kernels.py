"""Compiled (numba) id kernels of the CommitLog decoder: host fields as InetAddress.getHostAddress texts and
the offsetMsgId (MessageDecoder.createMessageId) (5.3.3).  Conventions: see ``commitlog_kernels``.
"""
from __future__ import annotations

import numpy as np

from txlog_io.commitlog_kernels import PHYSICAL_OFFSET_AT, copy_words, i32, store64, u32
from txlog_io.jit import njit


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


HEX_LOWER = np.frombuffer(b"0123456789abcdef", np.uint8).copy()
HEX_UPPER = np.frombuffer(b"0123456789ABCDEF", np.uint8).copy()


#: the longest host texts: "255.255.255.255:-2147483648", "[ffff:..:ffff]:-2147483648"
HOST_V4_MAX, HOST_V6_MAX = 27, 53


@njit
def host_texts(u8, at, v6, hexd, off, data):
    """InetAddress.getHostAddress + port: "a.b.c.d:port" or "[x:x:x:x:x:x:x:x]:port" (lower-case groups
    without leading zeros or zero compression) for the host fields starting at ``at``, as Arrow offsets
    ``off`` (n + 1) and bytes ``data`` (room for HOST_V4_MAX / HOST_V6_MAX per row and 8 more); returns the
    bytes used."""
    n = at.size
    w = 0
    for k in range(n):
        off[k] = w
        p = at[k]
        if k > 0 and v6[k] == v6[k - 1]:
            q = at[k - 1]
            same = u32(u8, p) == u32(u8, q) and u32(u8, p + 4) == u32(u8, q + 4)
            if same and v6[k]:
                for j in range(8, 20):
                    if u8[p + j] != u8[q + j]:
                        same = False
                        break
            if same:                              # the same host as the record before: copy its text
                prev = off[k - 1]
                copy_words(data, w, data, prev, w - prev)
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
        w = _put_int(data, w, i32(u8, port_at))
    off[n] = w
    return w


def hex_pairs(digits: np.ndarray) -> np.ndarray:
    """Per byte value, its two hex digits as a little-endian uint16 (the high nibble's digit first)."""
    b = np.arange(256)
    return (digits[b >> 4].astype(np.uint64) | (digits[b & 0xF].astype(np.uint64) << np.uint64(8)))


HEX_PAIRS_UPPER = hex_pairs(HEX_UPPER)


@njit(inline="always")
def _hex4(u8, at, pairs):
    """The 8 hex characters of the 4 bytes at ``at``, as one little-endian word (the first byte's first)."""
    return (pairs[u8[at]] | (pairs[u8[at + 1]] << _S16) | (pairs[u8[at + 2]] << _S32)
            | (pairs[u8[at + 3]] << _S48))


_S16, _S32, _S48 = np.uint64(16), np.uint64(32), np.uint64(48)


@njit
def msg_ids(u8, pos, store_at, v6, pairs, off, data):
    """offsetMsgId: upper-case hex of store IP + port + the stored PHYSICALOFFSET (32 or 56 characters) as
    Arrow offsets ``off`` (n + 1) and bytes ``data`` (room for 56 per row); ``pairs``: ``hex_pairs`` of the
    digits.  Four bytes -> one 8-character store (the byte-by-byte loop cost 17 ns/record).  Returns the bytes
    used."""
    n = pos.size
    total = 0
    for k in range(n):
        off[k] = total
        total += 56 if v6[k] else 32
    off[n] = total
    for k in range(n):
        w = np.int64(off[k])
        ip_port = 20 if v6[k] else 8
        for j in range(0, ip_port, 4):
            store64(data, w, _hex4(u8, store_at[k] + j, pairs))
            w += 8
        for j in range(0, 8, 4):
            store64(data, w, _hex4(u8, pos[k] + PHYSICAL_OFFSET_AT + j, pairs))
            w += 8
    return total
