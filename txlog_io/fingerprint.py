"""Per-file fingerprints of a store: what the audit saw, so that a later repair can refuse a changed store.

A fingerprint is (size, mtime ns, sha256 of the first and last ``EDGE_BYTES`` of the file).  Reading only the
edges keeps it cheap on a store of hundreds of GiB (two 64 KiB reads per file) while catching what usually
changes between an audit and a repair: a broker that appended (size, mtime, tail), a file replaced or
truncated (size, head), an operator's copy over it (mtime).  A rewrite in the middle of a file with its mtime
restored is not caught; the repair re-validates every byte it reads as it decodes it.

Spark-free (the audit computes it on the driver from a listing; ``jobs.repair.run`` re-computes and compares).
A store in a bucket (a URI root, ``txlog_io.storefs``) is fingerprinted the same way: size and mtime from its
one listing (an object's mtime is its upload time, whole seconds), the edges by two ranged GETs.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Dict, Iterator, Tuple

from txlog_io import readstats, storefs
from txlog_io.positional import open_input

EDGE_BYTES = 64 << 10


@dataclass(frozen=True)
class FilePrint:
    file: str          # path relative to the store root, '/'-separated
    size: int
    mtime_ns: int
    edge_sha256: str   # sha256 over head + tail (the whole file when it is at most 2 * EDGE_BYTES)


def _edge_hash(path: str, size: int) -> str:
    h = hashlib.sha256()
    with open_input(path) as f:
        if size <= 2 * EDGE_BYTES:
            parts = [f.read()]
        else:
            parts = [f.read(EDGE_BYTES)]
            f.seek(size - EDGE_BYTES)
            parts.append(f.read(EDGE_BYTES))
    for part in parts:
        readstats.add(len(part), "fingerprint")
        h.update(part)
    return h.hexdigest()


def iter_store_files(root: str) -> Iterator[Tuple[str, str]]:
    """``(relative path, absolute path)`` of every file under ``root``, sorted, symlinks not followed."""
    for rel, path, _, _ in storefs.walk_files(root):
        yield rel, path


def file_print(root: str, rel: str) -> FilePrint:
    if storefs.is_remote(root):
        path = storefs.as_path(root) / rel
        if not path.is_file():
            raise FileNotFoundError(str(path))
        size, mtime_ns = path.stat_size(), path.stat_mtime_ns()
        return FilePrint(rel, size, mtime_ns, _edge_hash(str(path), size))
    path = os.path.join(root, rel)
    st = os.stat(path)
    return FilePrint(rel, st.st_size, st.st_mtime_ns, _edge_hash(path, st.st_size))


def store_prints(root: str) -> Dict[str, FilePrint]:
    """Fingerprint of every file under ``root`` (files vanishing during the listing are skipped)."""
    out: Dict[str, FilePrint] = {}
    remote = storefs.is_remote(root)
    for rel, path, size, mtime_ns in storefs.walk_files(root):
        try:
            if remote:
                out[rel] = FilePrint(rel, size, mtime_ns, _edge_hash(path, size))
                continue
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            out[rel] = file_print(root, rel)
        except FileNotFoundError:
            continue
    return out


def compare_prints(expected: Dict[str, FilePrint], actual: Dict[str, FilePrint]) -> list:
    """Differences as short strings (empty: the store is as the audit saw it)."""
    diffs = []
    for rel in sorted(set(expected) | set(actual)):
        e, a = expected.get(rel), actual.get(rel)
        if a is None:
            diffs.append(f"{rel}: deleted since the audit")
        elif e is None:
            diffs.append(f"{rel}: created since the audit")
        elif e.size != a.size:
            diffs.append(f"{rel}: size {e.size} at the audit, now {a.size}")
        elif e.mtime_ns != a.mtime_ns:
            diffs.append(f"{rel}: modified since the audit (mtime)")
        elif e.edge_sha256 != a.edge_sha256:
            diffs.append(f"{rel}: content changed since the audit (head/tail hash)")
    return diffs


__all__ = ["EDGE_BYTES", "FilePrint", "store_prints", "file_print", "compare_prints", "iter_store_files"]
