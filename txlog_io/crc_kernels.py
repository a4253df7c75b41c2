"""Compiled (numba) CRC kernels of the CommitLog decoder: the body CRC (UtilAll.crc32) and the 5.2+
``__CRC32#`` trailing property (CommitLog.doAppend) (5.3.3).

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

import llvmlite.binding as _llvm  # noqa: E402
import numpy as np
from numba import types as _nt  # noqa: E402

from txlog_io.jit import njit  # sets NUMBA_CACHE_DIR before numba is imported


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


CRC_MARKER = np.frombuffer(b"__CRC32#\x01", np.uint8).copy()
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
