"""Where the outputs go: ``--out`` as a local directory, or a prefix of any filesystem ``pyarrow.fs`` resolves
(``s3://`` / ``s3a://``, ``gs://``, ``abfs://``, ``hdfs://``; ``txlog_io.storefs`` resolves them).

Every writer of an output -- the Delta sink's data files, the work lists, the report pages, the repair log --
goes through these few functions, so that a local ``--out`` keeps its plain file-system calls (atomic
``rename`` of a temporary file, ``makedirs``) and a URI becomes object-store requests:

* a remote "directory" is a key prefix: :func:`makedirs` creates nothing (no marker objects), :func:`isdir`
  asks whether any object lies below;
* :func:`write_bytes` is one PUT (an object appears whole or not at all, like the local rename);
* :func:`open_output` streams a (Parquet) file; the object exists only once the stream is closed;
* :func:`delta_options` are the delta-rs ``storage_options`` of a table under ``--out`` (``jobs.config``:
  the one set of S3 settings that also feeds pyarrow and Spark).

Paths are strings: a local path absolute, a URI as the user gave it (``s3a://`` stays ``s3a://``).
"""
from __future__ import annotations

import os
import time
from typing import Dict, List, Tuple

from txlog_io import storefs

DELTA_LOG = "_delta_log"


def is_remote(path) -> bool:
    return storefs.is_remote(path)


def root(path) -> str:
    """``--out`` as kept: a local path made absolute, a URI without its trailing ``/``."""
    return storefs.normalize_root(os.fspath(path) if not isinstance(path, str) else path)


def join(base: str, *names: str) -> str:
    """``base/name/...`` (``os.path.join`` for a local path, ``/`` for a URI)."""
    if is_remote(base):
        return "/".join([base.rstrip("/"), *(n.strip("/") for n in names if n)])
    return os.path.join(base, *names)


def basename(path: str) -> str:
    return path.rstrip("/").rpartition("/")[2] if is_remote(path) else os.path.basename(path)


def _fs(path: str):
    return storefs.filesystem(path)


def delta_options(path: str) -> Dict[str, str]:
    """delta-rs ``storage_options`` for a table at ``path`` (empty for a local path and for the schemes whose
    settings delta-rs reads from the environment itself)."""
    parts = storefs.split_uri(path)
    if parts is None or parts[0].lower() not in storefs.S3_SCHEMES:
        return {}
    from jobs.config import delta_storage_options

    return delta_storage_options()


def exists(path: str) -> bool:
    if not is_remote(path):
        return os.path.exists(path)
    from pyarrow import fs as pafs

    fs, inner = _fs(path)
    return fs.get_file_info(inner).type != pafs.FileType.NotFound


def isdir(path: str) -> bool:
    if not is_remote(path):
        return os.path.isdir(path)
    from pyarrow import fs as pafs

    fs, inner = _fs(path)
    return fs.get_file_info(inner).type == pafs.FileType.Directory


def is_delta(path) -> bool:
    """Whether a Delta table (its ``_delta_log``) is at ``path``."""
    return bool(path) and isdir(join(str(path), DELTA_LOG))


def makedirs(path: str) -> None:
    """``os.makedirs(exist_ok=True)`` of a local directory; nothing for a prefix (no marker objects)."""
    if not is_remote(path):
        os.makedirs(path, exist_ok=True)


def listdir(path: str) -> List[str]:
    """Names directly below ``path`` (files and sub-directories / prefixes); empty when there is nothing."""
    if not is_remote(path):
        return os.listdir(path) if os.path.isdir(path) else []
    from pyarrow import fs as pafs

    fs, inner = _fs(path)
    infos = fs.get_file_info(pafs.FileSelector(inner, recursive=False, allow_not_found=True))
    return [i.base_name for i in infos]


def write_bytes(path: str, data: bytes) -> None:
    """The whole file ``path`` at once: a temporary sibling renamed over it (local), one PUT (remote)."""
    if is_remote(path):
        fs, inner = _fs(path)
        with fs.open_output_stream(inner) as f:
            f.write(data)
        return
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def read_bytes(path: str) -> bytes:
    if not is_remote(path):
        with open(path, "rb") as f:
            return f.read()
    fs, inner = _fs(path)
    with fs.open_input_stream(inner) as f:
        return f.read()


def open_input(path: str):
    """A pyarrow random-access file of ``path`` (a local path or ``file://`` URI: the file itself; a URI: the
    object read by ranged requests), e.g. for ``pyarrow.parquet.ParquetFile``."""
    import pyarrow as pa

    if not is_remote(path):
        return pa.OSFile(storefs.local_path(path), "rb")
    fs, inner = _fs(path)
    return fs.open_input_file(inner)


def remove(path: str) -> None:
    """Delete one file (absent: nothing)."""
    if not is_remote(path):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    from pyarrow import fs as pafs

    fs, inner = _fs(path)
    try:
        fs.delete_file(inner)
    except FileNotFoundError:
        pass
    except OSError:
        if fs.get_file_info(inner).type != pafs.FileType.NotFound:
            raise


class Output:
    """A file being written: ``stream`` takes the bytes; :meth:`close` returns ``(size, mtime ms)`` without
    another request (a remote object is uploaded as the stream closes)."""

    def __init__(self, path: str):
        self.path = path
        if is_remote(path):
            fs, inner = _fs(path)
            self.stream = fs.open_output_stream(inner)
        else:
            import pyarrow as pa

            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.stream = pa.OSFile(path, "wb")

    def close(self) -> Tuple[int, int]:
        size = self.stream.tell()
        self.stream.close()
        if is_remote(self.path):
            return size, int(time.time() * 1000)
        st = os.stat(self.path)
        return st.st_size, int(st.st_mtime * 1000)


def open_output(path: str) -> Output:
    return Output(path)


__all__ = ["is_remote", "root", "join", "basename", "delta_options", "exists", "isdir", "is_delta", "makedirs",
           "listdir", "write_bytes", "read_bytes", "open_input", "remove", "open_output", "Output", "DELTA_LOG"]
