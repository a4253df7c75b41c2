"""Read-only positional access to one store file: ``os.pread`` / ``os.preadv`` on a descriptor opened
``O_RDONLY`` (never mmap'd, so memory stays bounded by what a caller asks for), every byte counted by
``txlog_io.readstats``.  The CommitLog and DLedger framers and the IndexFile reader all read through it, so
opening errors, short reads and byte accounting are decided in one place.

A path that is a URI (``s3://...``, see ``txlog_io.storefs``) opens as a :class:`RangedFile`: the same
interface over ranged GETs of a ``pyarrow.fs`` input file.  :func:`open_input` is the file-object twin for
the readers that ``seek`` / ``read`` (``open(path, "rb")`` for a local path, unchanged)."""
from __future__ import annotations

import os
import sys

import numpy as np

from txlog_io import readstats, storefs
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
        if storefs.is_remote(path):
            continue
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
    """One file opened read-only; ``what`` names it in a missing-file error ("CommitLog file", ...).  A URI
    path gives a :class:`RangedFile`."""

    def __new__(cls, path, what: str = "file"):
        if cls is PositionalFile and storefs.is_remote(path):
            cls = RangedFile
        return super().__new__(cls)

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


#: smallest GET of a read that does not continue the previous one (a record probe, an index slot): what a
#: random read costs anyway, and usually the whole record behind a probe
RANDOM_REQUEST = 16 << 10
#: smallest GET of a read that continues the bytes fetched before it (a scan): large requests, each byte once
SEQUENTIAL_REQUEST = 4 << 20


class RangedFile(PositionalFile):
    """A :class:`PositionalFile` over a file of a ``pyarrow.fs`` filesystem (a store in a bucket): every read
    is served from the last fetched block or by one ranged GET of what is missing, sized by the access
    pattern -- a read that continues the previous block (a scan) fetches at least ``SEQUENTIAL_REQUEST``, any
    other at least ``RANDOM_REQUEST`` -- so a scan reads each byte once in requests of a few MiB and a lookup
    reads a little more than the record it needs.  ``pread`` / ``read_chunk`` / ``read_all`` count their
    bytes like the local reader; the file-object reads leave it to the caller.  An object store has no holes: ``next_data`` is the
    position itself and ``next_hole`` the end of the file.  Also a minimal read-only file object (``seek``,
    ``tell``, ``read``, ``readinto``) for the readers that use one.  Never writes."""

    def __init__(self, path, what: str = "file"):
        self.path = str(path)
        self.kind = _KINDS.get(what, "other")
        self.fd = -1
        self._block, self._block_at, self._offset = b"", 0, 0
        fs, inner = storefs.filesystem(self.path)
        try:
            self._file = fs.open_input_file(inner)
            self.size = int(self._file.size())
        except FileNotFoundError:
            raise StoreNotFoundError(self.path, what) from None
        except (OSError, ValueError) as exc:
            if "not found" in str(exc).lower() or "NoSuchKey" in str(exc):
                raise StoreNotFoundError(self.path, what) from None
            raise UnreadableFileError(self.path, storefs.reason(exc)) from None

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._block = b""

    def _get(self, pos: int, length: int) -> bytes:
        """``length`` bytes at ``pos`` (within the file), from the block and at most one GET."""
        block, at = self._block, self._block_at
        end = pos + length
        if at <= pos and end <= at + len(block):
            return block[pos - at:end - at]
        head = b""
        if at <= pos < at + len(block):                 # continues the block: fetch only what follows it
            head, pos = block[pos - at:], at + len(block)
            want = max(end - pos, SEQUENTIAL_REQUEST)
        else:
            want = max(end - pos, RANDOM_REQUEST)
        want = min(want, self.size - pos)
        try:
            got = self._file.read_at(want, pos)         # bytes
        except (OSError, ValueError) as exc:
            raise UnreadableFileError(self.path, f"read of {want} bytes at {pos}: {storefs.reason(exc)}") from None
        if len(got) < min(want, end - pos):
            raise UnreadableFileError(self.path, f"short read at {pos + len(got)}: object shrank while reading")
        self._block, self._block_at = got, pos
        return head + got[:end - pos]

    def pread(self, pos: int, length: int) -> bytes:
        length = max(0, min(length, self.size - pos))
        if not length:
            return b""
        b = self._get(pos, length)
        readstats.add(len(b), self.kind)
        return b

    def next_data(self, pos: int) -> int:
        return min(max(pos, 0), self.size)

    def next_hole(self, pos: int) -> int:
        return self.size

    def read_chunk(self, pos: int, length: int, pad: int, pool: "ChunkPool | None" = None) -> np.ndarray:
        length = max(0, min(length, self.size - pos))
        buf = np.empty(length + pad, np.uint8) if pool is None else pool.take(length + pad)
        buf[length:] = 0
        if length:
            buf[:length] = np.frombuffer(self._get(pos, length), np.uint8)
        readstats.add(length, self.kind)
        return buf

    # -- read-only file object
    def seek(self, offset: int, whence: int = 0) -> int:
        self._offset = offset if whence == 0 else self._offset + offset if whence == 1 else self.size + offset
        return self._offset

    def tell(self) -> int:
        return self._offset

    def read(self, n: int = -1) -> bytes:
        """Like a file object's ``read``: the caller counts the bytes (as it does for a local file)."""
        n = self.size - self._offset if n is None or n < 0 else n
        n = max(0, min(n, self.size - self._offset))
        b = self._get(self._offset, n) if n else b""
        self._offset += len(b)
        return b

    def readinto(self, view) -> int:
        b = self.read(len(view))
        memoryview(view).cast("B")[:len(b)] = b
        return len(b)


def open_input(path):
    """A read-only file object: ``open(path, "rb")`` for a local path, a :class:`RangedFile` for a URI (the
    caller maps the errors of ``open``; a RangedFile raises txlog_io's own)."""
    return RangedFile(path) if storefs.is_remote(path) else open(path, "rb")


def input_size(f) -> int:
    """Size of a file object from :func:`open_input`."""
    return f.size if isinstance(f, RangedFile) else os.fstat(f.fileno()).st_size


def input_next_data(f, pos: int, size: int) -> int:
    """:func:`next_data` of a file object from :func:`open_input`."""
    return f.next_data(pos) if isinstance(f, RangedFile) else next_data(f.fileno(), pos, size)


def input_next_hole(f, pos: int, size: int) -> int:
    """:func:`next_hole` of a file object from :func:`open_input`."""
    return f.next_hole(pos) if isinstance(f, RangedFile) else next_hole(f.fileno(), pos, size)


def input_pread(f, length: int, pos: int) -> bytes:
    """``os.pread`` of a file object from :func:`open_input` (bytes not counted: the caller counts)."""
    if isinstance(f, RangedFile):
        length = max(0, min(length, f.size - pos))
        return f._get(pos, length) if length else b""
    return os.pread(f.fileno(), length, pos)


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
        """A buffer of ``size`` bytes.  A new one gets 1/16 more room (at least 64 KiB), and replaces a free
        pooled one too small for ``size``: sizes that vary a little from one call to the next (a batch's
        output) are served from the pool rather than by a fresh array each time."""
        spare = -1
        for i in range(len(self._bufs)):
            # 2 references: the list's and getrefcount's argument
            if sys.getrefcount(self._bufs[i]) == 2:
                if self._bufs[i].size >= size:
                    return self._bufs[i][:size]
                spare = i
        buf = np.empty(size + max(size >> 4, 64 << 10), np.uint8)
        if len(self._bufs) < self._keep:
            self._bufs.append(buf)
        elif spare >= 0:
            self._bufs[spare] = buf
        return buf[:size]


__all__ = ["PositionalFile", "RangedFile", "ChunkPool", "next_data", "next_hole", "open_input", "input_size",
           "input_next_data", "input_next_hole", "input_pread"]
