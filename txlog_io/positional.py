"""Read-only positional access to one store file: ``os.pread`` / ``os.preadv`` on a descriptor opened
``O_RDONLY`` (never mmap'd, so memory stays bounded by what a caller asks for), every byte counted by
``txlog_io.readstats``.  The CommitLog and DLedger framers and the IndexFile reader all read through it, so
opening errors, short reads and byte accounting are decided in one place."""
from __future__ import annotations

import os
import sys

import numpy as np

from txlog_io import readstats
from txlog_io.errors import StoreNotFoundError, UnreadableFileError

#: bytes per pread of read_all (one pread call is limited to ~2 GiB on Linux)
_READ_ALL_STEP = 64 << 20
#: the readstats kind of each ``what`` (bytes read are counted per kind of file)
_KINDS = {"CommitLog file": "commitlog", "DLedger data file": "dledger", "index file": "index"}


def next_data(fd: int, pos: int, size: int) -> int:
    """The first position >= ``pos`` that may hold data: ``pos`` itself, or the end of the file hole (a
    never-written range of a sparse file, which reads as zeros) it lies in; ``size`` when only a hole follows.
    RocketMQ creates its mapped files (CommitLog, consume queues) with ``setLength``, so the unwritten tail of
    the newest file is a hole: readers that would only confirm it is zero skip it without reading it.  A file
    system without SEEK_DATA makes every byte data (``pos``)."""
    if pos >= size:
        return size
    try:
        return min(size, max(pos, _seek(fd, pos, os.SEEK_DATA)))
    except OSError as exc:
        import errno

        return size if exc.errno == errno.ENXIO else pos     # ENXIO: nothing but a hole from pos on
    except AttributeError:                                    # no SEEK_DATA on this platform
        return pos


def _seek(fd: int, pos: int, whence: int) -> int:
    """lseek that leaves the descriptor's offset where it was (a buffered file object may share it)."""
    here = os.lseek(fd, 0, os.SEEK_CUR)
    try:
        return os.lseek(fd, pos, whence)
    finally:
        os.lseek(fd, here, os.SEEK_SET)


def next_hole(fd: int, pos: int, size: int) -> int:
    """The start of the first file hole at or after ``pos`` (``size``: none, or no SEEK_HOLE)."""
    if pos >= size:
        return size
    try:
        return min(size, max(pos, _seek(fd, pos, os.SEEK_HOLE)))
    except (OSError, AttributeError):
        return size


def will_read(paths) -> None:
    """Ask the kernel to start reading ``paths`` (files about to be read whole) in the background
    (``posix_fadvise(POSIX_FADV_WILLNEED)``): on a cold page cache their reads then overlap the caller's other
    work instead of following it.  No byte reaches this process (the readers count their reads where they
    happen); a file that cannot be opened is left alone."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except (OSError, AttributeError):      # not Linux: only a hint
            pass
        finally:
            os.close(fd)


class PositionalFile:
    """One file opened read-only; ``what`` names it in a missing-file error ("CommitLog file", ...)."""

    def __init__(self, path, what: str = "file"):
        self.path = str(path)
        self.kind = _KINDS.get(what, "other")
        try:
            self.fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise StoreNotFoundError(self.path, what) from None
        except OSError as exc:
            raise UnreadableFileError(self.path, exc.strerror or str(exc)) from None
        self.size = os.fstat(self.fd).st_size

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def pread(self, pos: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``pos`` (fewer at the end of the file, none past it)."""
        length = max(0, min(length, self.size - pos))
        if not length:
            return b""
        b = os.pread(self.fd, length, pos)
        readstats.add(len(b), self.kind)
        return b

    def next_data(self, pos: int) -> int:
        """:func:`next_data` of this file."""
        return next_data(self.fd, pos, self.size)

    def next_hole(self, pos: int) -> int:
        """:func:`next_hole` of this file."""
        return next_hole(self.fd, pos, self.size)

    def read_all(self) -> bytes:
        chunks, got = [], 0
        while got < self.size:
            b = self.pread(got, _READ_ALL_STEP)
            if not b:
                break
            chunks.append(b)
            got += len(b)
        return b"".join(chunks)

    def read_chunk(self, pos: int, length: int, pad: int, pool: "ChunkPool | None" = None) -> np.ndarray:
        """``length`` bytes at ``pos`` (fewer at the end of the file) followed by ``pad`` zero bytes, so fixed
        header windows may run past the data.  An uninitialised array (no zero-fill pass of the data part):
        fresh, or from ``pool`` a buffer no earlier chunk's user still references.  A file that shrinks
        while being read is an UnreadableFileError, never a short chunk."""
        length = max(0, min(length, self.size - pos))
        buf = np.empty(length + pad, np.uint8) if pool is None else pool.take(length + pad)
        buf[length:] = 0
        view = memoryview(buf)  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
        got = 0
        while got < length:
            n = os.preadv(self.fd, [view[got:length]], pos + got)
            if n <= 0:
                break
            got += n
        view.release()
        readstats.add(got, self.kind)
        if got < length:
            raise UnreadableFileError(self.path, f"short read at {pos + got}: file shrank while reading")
        return buf


class ChunkPool:
    """Read buffers reused from one chunk to the next.  A fresh multi-MiB array is fresh anonymous memory: the
    first touch of each 4 KiB page is a page fault that zero-fills it, which cost more than the copy out of the
    page cache (``txlog-bench decode``, 1 KiB records: read_chunk 79 ns/record with fresh buffers, see
    docs/ARCHITECTURE.md).  A buffer is handed out again only when nothing but the pool references it -- every
    numpy view, ``np.frombuffer`` or Arrow buffer made over it holds a reference -- so a caller that keeps a
    chunk alive never sees it overwritten; it just gets a fresh one."""

    def __init__(self, keep: int = 2):
        self._bufs: list = []
        self._keep = keep

    def take(self, size: int) -> np.ndarray:
        for i in range(len(self._bufs)):
            # 2 references: the list's and getrefcount's argument
            if self._bufs[i].size >= size and sys.getrefcount(self._bufs[i]) == 2:
                return self._bufs[i][:size]
        buf = np.empty(size, np.uint8)
        if len(self._bufs) < self._keep:
            self._bufs.append(buf)
        return buf


__all__ = ["PositionalFile", "ChunkPool", "next_data", "next_hole"]
