"""Bytes read from store files, counted where the readers read them (``txlog-bench audit``'s
``full_read_bytes`` / ``indexed_read_bytes``).

What counts: the bytes every ``pread`` / ``preadv`` / ``read`` / ``readinto`` / ``np.fromfile`` of a store
file returned (CommitLog, DLedger data, consume queues and their ext files, statetable, redolog, index files,
the checkpoint, config JSON, the fingerprint's file edges); the one mmap'd reader (the ConsumeQueue ext walk)
counts the bytes it walked, not the pages the kernel mapped. Readahead, page-cache hits and misses are not
distinguished: this is what the audit asked for, independent of the cache.

How it leaves a Spark worker: counting is off unless the environment variable ``TXAUDIT_READ_STATS_DIR``
names a directory.  Then each process keeps a running total in memory and writes it (one small file per
process, ``<pid>-<token>.bytes``, replaced atomically) when a partition ends (:func:`flush`, called by the
data-source readers and the ``mapInArrow`` bodies of ``jobs``) and at exit.  A reader of the directory
(:func:`directory_total`) sums the files; the difference of two sums is what ran in between.  Each byte is
also counted under the kind of file it came from (``commitlog``, ``consumequeue``, ``index``, ...: the
``kind`` the reader passes to :func:`add`), so :func:`directory_kinds` says where the bytes went (the file
holds the total on its first line, then ``kind bytes`` lines).  Python workers
inherit the variable from the JVM, which inherits it from the driver process that starts it (the bench sets
it before the session exists), or from ``SparkContext.environment`` (``spark.executorEnv.*``).
"""
from __future__ import annotations

import atexit
import os
import secrets
import threading
from typing import Dict, Iterable, Iterator

ENV = "TXAUDIT_READ_STATS_DIR"
SUFFIX = ".bytes"

_lock = threading.Lock()
_total = 0
_kinds: Dict[str, int] = {}
_written: tuple = ()        # (directory, total) last written: nothing to do until either changes
_token = secrets.token_hex(4)


def _after_fork() -> None:
    # a forked worker starts from zero under its own file name: the parent's bytes are the parent's
    global _total, _kinds, _written, _token
    _total, _kinds, _written, _token = 0, {}, (), secrets.token_hex(4)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def add(n: int, kind: str = "other") -> None:
    """Count ``n`` bytes read from a store file of ``kind`` (no-op unless counting is on)."""
    global _total
    if n > 0 and ENV in os.environ:
        with _lock:
            _total += int(n)
            _kinds[kind] = _kinds.get(kind, 0) + int(n)


def process_total() -> int:
    """Bytes counted by this process so far."""
    return _total


def process_kinds() -> Dict[str, int]:
    """Bytes counted by this process so far, per kind of file."""
    with _lock:
        return dict(_kinds)


def flush() -> None:
    """Write this process's running total to its file in ``$TXAUDIT_READ_STATS_DIR`` (if set and changed; the
    directory must exist: whoever turned counting on made it)."""
    global _written
    directory = os.environ.get(ENV)
    if not directory or (directory, _total) == _written:
        return
    with _lock:
        total = _total
        name = os.path.join(directory, f"{os.getpid()}-{_token}{SUFFIX}")
        try:
            tmp = name + ".tmp"
            with open(tmp, "w") as fh:
                fh.write("\n".join([str(total)] + [f"{k} {v}" for k, v in sorted(_kinds.items())]))
            os.replace(tmp, name)
            _written = (directory, total)
        except OSError:
            pass    # a benchmark aid: an unwritable directory must never fail the reader it counts for


atexit.register(flush)


def flushing(batches: Iterable) -> Iterator:
    """``batches`` unchanged, then :func:`flush` (also when the consumer stops early): the wrapper of a
    partition's reader, so a reused Python worker's counts are on disk when its task ends."""
    try:
        yield from batches
    finally:
        flush()


def _process_files(directory: str) -> Iterator[list]:
    """The lines of every process's file in ``directory`` (none for a missing directory)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(SUFFIX):
            try:
                with open(os.path.join(directory, name)) as fh:
                    yield fh.read().split("\n")
            except OSError:
                continue


def directory_total(directory: str) -> int:
    """Sum of the totals every process wrote into ``directory`` (0 for a missing directory)."""
    total = 0
    for lines in _process_files(directory):
        try:
            total += int(lines[0].strip() or 0)
        except ValueError:
            continue
    return total


def directory_kinds(directory: str) -> Dict[str, int]:
    """Per kind of file, the sum of the bytes every process wrote into ``directory``."""
    out: Dict[str, int] = {}
    for lines in _process_files(directory):
        for line in lines[1:]:
            kind, _, n = line.rpartition(" ")
            if kind and n.isdigit():
                out[kind] = out.get(kind, 0) + int(n)
    return out


__all__ = ["ENV", "add", "flush", "flushing", "process_total", "process_kinds", "directory_total",
           "directory_kinds"]
