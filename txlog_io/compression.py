"""Message body compression as selected by SYSFLAG.

common/.../sysflag/MessageSysFlag.java and common/.../compression/*.java (5.3.3):
  bit 0 (0x1) COMPRESSED_FLAG; bits 8-10 (0x700) compression type: 1 = LZ4 (frame format), 2 = ZSTD,
  3 = ZLIB, 0 = ZLIB (legacy: before 4.9.4 the flag always meant zlib).
"""
from __future__ import annotations

import zlib

COMPRESSED_FLAG = 0x1
COMPRESSION_TYPE_MASK = 0x700
COMPRESSION_LZ4 = 0x100
COMPRESSION_ZSTD = 0x200
COMPRESSION_ZLIB = 0x300

NONE, ZLIB, LZ4, ZSTD = "NONE", "ZLIB", "LZ4", "ZSTD"
_TYPE_BY_BITS = {0: ZLIB, 1: LZ4, 2: ZSTD, 3: ZLIB}
_BITS_BY_TYPE = {ZLIB: COMPRESSION_ZLIB, LZ4: COMPRESSION_LZ4, ZSTD: COMPRESSION_ZSTD}

# A decompressed body larger than this is refused: a hostile frame must not exhaust memory.
MAX_DECOMPRESSED = 256 << 20


def compression_of(sys_flag: int) -> str:
    if not sys_flag & COMPRESSED_FLAG:
        return NONE
    return _TYPE_BY_BITS.get((sys_flag & COMPRESSION_TYPE_MASK) >> 8, "UNKNOWN")


def sys_flag_bits(kind: str) -> int:
    """SYSFLAG bits a producer sets for a body compressed with `kind` (zlib written the 4.9.4+ way, type 3)."""
    if kind == NONE:
        return 0
    return COMPRESSED_FLAG | _BITS_BY_TYPE[kind]


def compress(body: bytes, kind: str, level: int = 5) -> bytes:
    if kind == NONE:
        return body
    if kind == ZLIB:
        return zlib.compress(body, level)
    if kind == LZ4:
        import lz4.frame

        return lz4.frame.compress(body)
    if kind == ZSTD:
        import zstandard

        return zstandard.ZstdCompressor(level=level).compress(body)
    raise ValueError(f"unknown compression {kind!r}")


def decompress(body: bytes, sys_flag: int) -> bytes:
    """Undo the compression SYSFLAG names.  Raises ValueError on a corrupt or oversized body."""
    kind = compression_of(sys_flag)
    try:
        if kind == NONE:
            return body
        if kind == ZLIB:
            d = zlib.decompressobj()
            out = d.decompress(body, MAX_DECOMPRESSED)
            if d.unconsumed_tail:
                raise ValueError("decompressed body exceeds limit")
            return out
        if kind == LZ4:
            import lz4.frame

            return lz4.frame.decompress(body)
        if kind == ZSTD:
            import zstandard

            return zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_DECOMPRESSED)
    except ValueError:
        raise
    except Exception as exc:  # the codecs raise their own error types
        raise ValueError(f"{kind} body does not decompress: {exc}") from exc
    raise ValueError(f"unknown compression type bits in sys_flag {sys_flag:#x}")
