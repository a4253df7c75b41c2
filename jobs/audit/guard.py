"""Driver-side guards of a run: command-line paths and names, and the exclusive lock on ``--out``.

Everything here runs before any JVM starts (``jobs.main.parse_args`` and ``main``), so misuse costs one line
``txaudit: error: ...`` and exit 2, never a traceback from deep inside Spark or the Delta writer:

* ``--store`` must be an existing directory laid out as a broker store root: ``commitlog/`` holding at least
  one 20-digit CommitLog file, or a DLedger ``dledger-*`` directory when the DLedger codec
  (``txlog_io.dledger``) is present (without it: a clear refusal, never a silent zero).  The message says
  what was expected and, when the user pointed at the broker's home, offers the ``store`` directory inside.
* ``--out`` must be a directory or creatable as one: its nearest existing ancestor must be a writable
  directory (``--out`` below a regular file used to surface as a ``NotADirectoryError`` traceback at the
  first write).
  It must not be a store, lie inside a store, or be the parent of a store whose directory is one of the output
  table names (the sink would write into the store).  Paths compare after ``realpath`` (symlinks resolved).
* broker names become partition values and directory names: no path separators, no ``..``, no control or
  NUL characters, no leading dot (a hidden / relative directory), at most 255 bytes of UTF-8.  Spaces and
  non-ASCII letters are fine (a store directory ``/data/brokér a/store`` gives the broker ``brokér a``).
* :func:`out_lock` (a local ``--out``) holds ``fcntl.flock(LOCK_EX | LOCK_NB)`` on ``<out>/.txaudit.lock`` for the whole run: a
  second audit on the same ``--out`` fails at once with a clear message instead of racing the first one's
  Delta commits.  The kernel drops the lock when the holder dies (even on ``kill -9``), so a crash never
  leaves a stale lock behind; the file itself stays and is harmless.

A store or ``--out`` given as a URI (``s3://bucket/prefix``, ``s3a://``, any scheme ``pyarrow.fs`` resolves;
``txlog_io.storefs``) passes the same checks through one listing of the prefix, and every failure of the
object store -- a missing bucket, a key the server refuses, an endpoint that does not answer, a prefix that
holds no store -- is one line naming the URI and the server's reason; nothing is written.  ``--out`` in an
S3 bucket (``s3://`` / ``s3a://``) is checked by one listing of its prefix and one of its bucket (missing
bucket, refused key, unreachable endpoint, an object where the prefix should be: one line, nothing
written); its run lock is a lock object created with a conditional PUT (``jobs.audit.bucketlock``).  Other
schemes offer no such PUT through the clients here: ``--out gs://...`` and the like are refused with one line.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from typing import Iterable, Iterator, Optional

from txlog_io import storefs
from txlog_io.errors import TxlogError, UsageError

LOCK_NAME = ".txaudit.lock"
_MAX_NAME_BYTES = 255


class OutLockedError(UsageError):
    """Another txaudit process holds the lock of this ``--out``."""


def _is_offset_name(name: str) -> bool:
    return len(name) == 20 and name.isascii() and name.isdigit()


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def check_store(root: str) -> str:
    """Absolute path of ``root`` if it is a broker store root with CommitLog data; a UsageError otherwise."""
    if storefs.is_remote(root):
        return _check_remote_store(root)
    path = os.path.abspath(storefs.local_path(root))
    expected = ("expected a RocketMQ store root: a directory holding commitlog/ with 20-digit CommitLog files, "
                "or dledger-<id>/data/ (DLedger)")
    if not os.path.exists(path):
        raise UsageError(f"--store: store not found: {path} ({expected})")
    if not os.path.isdir(path):
        raise UsageError(f"--store: not a directory: {path} ({expected})")
    try:
        entries = os.listdir(path)
    except OSError as e:
        raise UsageError(f"--store: cannot list {path}: {e.strerror}") from None
    inner = os.path.join(path, "store")
    hint = f"; did you mean {inner}?" if os.path.isdir(os.path.join(inner, "commitlog")) else ""
    if not entries:
        raise UsageError(f"--store: empty directory: {path} ({expected})")
    commitlog = os.path.join(path, "commitlog")
    dledger = [os.path.join(d, n) for d in (path, commitlog) if os.path.isdir(d)
               for n in sorted(os.listdir(d)) if n.startswith("dledger-") and os.path.isdir(os.path.join(d, n))]
    if dledger:
        # a DLedger (Raft) CommitLog: readable only when this build has its codec (txlog_io.dledger)
        import importlib.util

        if importlib.util.find_spec("txlog_io.dledger") is None:
            raise UsageError(f"--store: {path} holds a DLedger CommitLog ({dledger[0]}), which this build "
                             f"cannot read (expected a RocketMQ store root with 20-digit CommitLog files in "
                             f"commitlog/)")
        return path
    if not os.path.isdir(commitlog):
        raise UsageError(f"--store: no message log in {path} (no commitlog/ or dledger-<id>/data/ inside; "
                         f"{expected}){hint}")
    try:
        names = os.listdir(commitlog)
    except OSError as e:
        raise UsageError(f"--store: cannot list {commitlog}: {e.strerror}") from None
    if not any(_is_offset_name(n) for n in names):
        raise UsageError(f"--store: {commitlog} holds no CommitLog file (expected files named by 20-digit "
                         f"offsets such as 00000000000000000000); nothing to audit")
    return path


def _remote_listing(option: str, uri: str):
    """``storefs.as_path(uri)`` after its one listing, or the UsageError that says why it cannot be listed."""
    try:
        path = storefs.as_path(uri)
        path.exists()
    except TxlogError as e:
        raise UsageError(f"{option}: {e}") from None
    return path


def _check_remote_store(root: str) -> str:
    """``check_store`` of a URI: the same rules, answered from one listing of the prefix."""
    uri = storefs.normalize_root(root)
    expected = ("expected a RocketMQ store root: a prefix holding commitlog/ with 20-digit CommitLog files, "
                "or dledger-<id>/data/ (DLedger)")
    path = _remote_listing("--store", uri)
    if not path.exists():
        raise UsageError(f"--store: store not found: {uri} (no object under this prefix; {expected})")
    if not path.is_dir():
        raise UsageError(f"--store: not a prefix but an object: {uri} ({expected})")
    hint = f"; did you mean {uri}/store?" if (path / "store" / "commitlog").is_dir() else ""
    commitlog = path / "commitlog"
    dledger = [d for d in (path, commitlog) if d.is_dir() for d in d.iterdir()
               if d.name.startswith("dledger-") and d.is_dir()]
    if dledger:
        return uri
    if not commitlog.is_dir():
        raise UsageError(f"--store: no message log in {uri} (no commitlog/ or dledger-<id>/data/ inside; "
                         f"{expected}){hint}")
    if not any(_is_offset_name(p.name) for p in commitlog.iterdir()):
        raise UsageError(f"--store: {commitlog} holds no CommitLog file (expected files named by 20-digit "
                         f"offsets such as 00000000000000000000); nothing to audit")
    return uri


def check_broker_name(name: str, option: str = "--broker") -> str:
    """``name`` if it cannot escape ``--out`` as a directory / partition value; a UsageError otherwise."""
    bad = None
    if not name or not name.strip():
        bad = "empty broker name"
    elif "/" in name or "\\" in name:
        bad = "contains a path separator"
    elif ".." in name:
        bad = "contains '..'"
    elif name.startswith("."):
        bad = "starts with '.'"
    elif any(ord(c) < 0x20 or c == "\x7f" for c in name):
        bad = "contains a control character"
    elif name != name.strip():
        bad = "has leading or trailing blanks"
    elif len(name.encode("utf-8", "surrogatepass")) > _MAX_NAME_BYTES:
        bad = f"longer than {_MAX_NAME_BYTES} bytes"
    else:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            bad = "not valid UTF-8"
    if bad:
        raise UsageError(f"{option}: invalid broker name {name!r}: {bad} (broker names name directories "
                         f"under --out: letters, digits, spaces and -_.:@+ are fine)")
    return name


def check_out(out: str) -> str:
    """Absolute ``--out`` if it is, or can be created as, a writable directory; a UsageError otherwise.  An
    S3 URI: its bucket must exist and answer, and the prefix must not be an object."""
    if storefs.is_remote(out):
        return _check_remote_out(out)
    path = os.path.abspath(storefs.local_path(out))
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"--out: exists and is not a directory: {path}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"--out: directory is not writable: {path}")
        return path
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"--out: cannot create {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out: cannot create {path}: {parent} is not writable")
    return path


def _check_remote_out(out: str) -> str:
    from pyarrow import fs as pafs

    uri = storefs.normalize_root(out)
    scheme, rest = storefs.split_uri(uri)
    if scheme.lower() not in storefs.S3_SCHEMES:
        raise UsageError(f"--out: {uri}: outputs on {scheme}:// are not supported (no run lock there: only S3 "
                         f"offers the conditional PUT it needs); use s3://, s3a:// or a directory")
    bucket, _, key = rest.partition("/")
    if not bucket or not key:
        raise UsageError(f"--out: {uri}: give a prefix inside the bucket (s3://bucket/prefix)")
    try:
        fs, inner = storefs.filesystem(uri)
        below = fs.get_file_info(pafs.FileSelector(inner, allow_not_found=True))   # a listing: its error
        kind = pafs.FileType.Directory if below else fs.get_file_info(inner).type  # has the server's reason
        if kind == pafs.FileType.NotFound and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise UsageError(f"--out: bucket not found: {scheme}://{bucket}")
    except UsageError:
        raise
    except (OSError, ValueError) as e:
        raise UsageError(f"--out: {uri}: {storefs.reason(e)}") from None
    if kind == pafs.FileType.File:
        raise UsageError(f"--out: exists and is not a directory: {uri} (an object, not a prefix)")
    return uri


def check_out_vs_stores(out: str, stores: Iterable[str], table_names: Iterable[str]) -> None:
    """``--out`` must not be, or lie in, a store; a store must not lie where an output table is written."""
    real_out = _real(out)
    owned = set(table_names) | {LOCK_NAME}
    for s in stores:
        real_store = _real(s)
        if storefs.is_remote(real_out) != storefs.is_remote(real_store):
            continue                          # one local, one in a bucket: they cannot overlap
        if _inside(real_out, real_store):
            what = "is the store" if real_out == real_store else "is inside the store"
            raise UsageError(f"--out must not be inside a store (stores are read-only): {out} {what} {s}")
        if _inside(real_store, real_out):
            first = real_store[len(real_out):].strip("/").split("/")[0] if storefs.is_remote(real_out) \
                else os.path.relpath(real_store, real_out).split(os.sep)[0]
            if first in owned:
                raise UsageError(f"--out {out}: the store {s} lies in the output table directory "
                                 f"{os.path.join(out, first)} (choose another --out)")


def _real(path: str) -> str:
    """``realpath`` of a local path; a URI with the S3 schemes made one (``s3a://b/k`` is ``s3://b/k``)."""
    parts = storefs.split_uri(path)
    if parts is None:
        return os.path.realpath(path)
    scheme = "s3" if parts[0].lower() in storefs.S3_SCHEMES else parts[0].lower()
    return f"{scheme}://{parts[1]}"


def probe_lock(out: str) -> Optional[str]:
    """Message naming the holder when ``<out>/.txaudit.lock`` is held now (does not create anything)."""
    if storefs.is_remote(out):
        from jobs.audit import bucketlock

        return bucketlock.probe(out, LOCK_NAME)
    path = os.path.join(out, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
            return _locked_message(out, path)
        return None
    finally:
        os.close(fd)
    return None


def _locked_message(out: str, path: str) -> str:
    holder = ""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        with open(path, "rb") as f:
            holder = f.read(512).decode("utf-8").strip()
    return (f"--out {out} is in use by another txaudit run ({holder or 'holder unknown'}); "
            f"wait for it to finish or use another --out")


@contextlib.contextmanager
def out_lock(out: str, run_id: str) -> Iterator[str]:
    """Hold the exclusive lock of ``out`` (created if needed) for the ``with`` block; OutLockedError if
    another process holds it.  In a bucket: the lock object of ``jobs.audit.bucketlock``."""
    if storefs.is_remote(out):
        from jobs.audit import bucketlock

        lock = bucketlock.BucketLock(out, run_id, LOCK_NAME)
        lock.acquire()
        try:
            yield lock.uri
        finally:
            lock.release()
        return
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out: cannot create {out}: {e.strerror}") from None
    path = os.path.join(out, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise UsageError(f"--out: cannot create the lock file {path}: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise OutLockedError(_locked_message(out, path)) from None
            raise UsageError(f"--out: cannot lock {path}: {e.strerror}") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()}, run id {run_id}\n".encode("utf-8"))
        yield path
    finally:
        os.close(fd)       # closing the descriptor releases the flock


__all__ = ["check_store", "check_broker_name", "check_out", "check_out_vs_stores", "out_lock", "probe_lock",
           "kill_point", "OutLockedError", "LOCK_NAME"]


def kill_point(name: str) -> None:
    """Crash-test hook: with ``TXAUDIT_KILL_AT=<name>`` the whole job (its process group: driver, JVM, Python
    workers) is killed here exactly as ``kill -9`` would (tests/test_crash_safety.py)."""
    if os.environ.get("TXAUDIT_KILL_AT") == name:
        import signal

        os.killpg(os.getpgrp(), signal.SIGKILL)
