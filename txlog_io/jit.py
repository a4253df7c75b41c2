"""numba set-up for the compiled decode kernels: a writable on-disk cache wherever the code runs.

numba reads ``NUMBA_CACHE_DIR`` once, when it is first imported, so this module must be imported before numba
(the ``txlog_io.*_kernels`` modules do).  The cache directory is, in order: ``NUMBA_CACHE_DIR`` if it is set and
writable, ``~/.cache/txaudit-numba``, ``<tempdir>/txaudit-numba-<uid>``.  That covers the CLI, Spark
executors (whose HOME may be read-only) and a read-only install.

Code shipped with ``--py-files`` is imported from a zip archive; numba's own cache locators only cache functions
defined in real files, so :class:`_ZipCacheLocator` keys the cache of such functions on the archive's content
(its SHA-1) and the module's path inside it instead: spark-submit copies the archive into a new directory for
every application (``userFiles-<uuid>/`` locally, ``<work-dir>/app-<id>/<executor>/`` on a standalone Worker),
so a key on the copy's path would compile every kernel again in every run and leave one more cache directory
behind.  Functions of the ``*_kernels.py`` modules in real files are keyed on all of those modules together
(:class:`_KernelFamilyLocator`), since they inline each other's helpers.  ``njit`` here is
``numba.njit(cache=True, nogil=True)``.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Optional


def _writable(path: str) -> bool:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
        return True
    except OSError:
        return False


def _temp_candidate(uid: int) -> Optional[str]:
    """The cache directory under the system's temporary directory; None when there is no usable one at all
    (``tempfile.gettempdir`` raises then, e.g. on a full disk: the commands must still start and say what
    failed in one line, not end in a traceback at import)."""
    try:
        return os.path.join(tempfile.gettempdir(), f"txaudit-numba-{uid}")
    except OSError:
        return None


def cache_dir() -> str:
    """Pick (and export) the numba cache directory; see the module docstring."""
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen and _writable(chosen):
        return chosen
    uid = os.getuid() if hasattr(os, "getuid") else 0
    for cand in (os.path.join(os.path.expanduser("~"), ".cache", "txaudit-numba"), _temp_candidate(uid)):
        if cand is not None and _writable(cand):
            os.environ["NUMBA_CACHE_DIR"] = cand
            return cand
    os.environ.pop("NUMBA_CACHE_DIR", None)      # nothing writable: numba compiles, without a cache
    return ""


CACHE_DIR = cache_dir()

import numba  # noqa: E402  (NUMBA_CACHE_DIR must be set before numba is imported)
from numba.core import caching as _caching  # noqa: E402


def _zip_of(py_file: str):
    """(archive path, member) when ``py_file`` lies inside a zip archive, else None."""
    probe = py_file
    while True:
        parent = os.path.dirname(probe)
        if parent == probe:
            return None
        if os.path.isfile(parent):
            return parent, os.path.relpath(py_file, parent)
        probe = parent


_DIGESTS: dict = {}


def _archive_digest(archive: str) -> str:
    """SHA-1 of the archive's bytes (once per archive path, size and mtime in this process)."""
    st = os.stat(archive)
    key = (os.path.abspath(archive), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha1()
        with open(archive, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


class _ZipCacheLocator(_caching._CacheLocator):
    """Cache of functions whose module was imported from a zip (``--py-files``)."""

    def __init__(self, py_func, py_file, archive, member):
        self._stamp = _archive_digest(archive)
        digest = hashlib.sha1(f"{self._stamp}/{member}".encode()).hexdigest()[:16]
        self._cache_path = os.path.join(CACHE_DIR, f"zip_{digest}")

    def ensure_cache_path(self):
        os.makedirs(self._cache_path, exist_ok=True)
        tempfile.TemporaryFile(dir=self._cache_path).close()

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return self._stamp

    def get_disambiguator(self):
        return ""

    @classmethod
    def from_function(cls, py_func, py_file):
        if not CACHE_DIR or os.path.exists(py_file):
            return None
        found = _zip_of(py_file)
        if found is None:
            return None
        return cls(py_func, py_file, *found)


class _KernelFamilyLocator(_caching.UserProvidedCacheLocator):
    """Cache of kernels defined in a ``*_kernels.py`` file: its stamp covers every ``*_kernels.py`` file
    beside it, because kernels inline helpers from one another (``commitlog_kernels.u32``, ``copy_bytes``)
    and numba's own stamp (the defining file alone) would keep a stale inlined copy after an edit."""

    def get_source_stamp(self):
        folder = os.path.dirname(os.path.abspath(self._py_file))
        return tuple(_caching._hash_source_file(path, st.st_mtime, st.st_size)
                     for path, st in _family_stats(folder))

    @classmethod
    def from_function(cls, py_func, py_file):
        if not CACHE_DIR or not py_file.endswith(_FAMILY_SUFFIX) or not os.path.isfile(py_file):
            return None
        return super().from_function(py_func, py_file)


_FAMILY_SUFFIX = "_kernels.py"


def _family_stats(folder: str) -> list:
    """(path, stat) of every kernel module in ``folder``, in name order."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(_FAMILY_SUFFIX))
    return [(os.path.join(folder, n), os.stat(os.path.join(folder, n))) for n in names]


_IMPL = getattr(_caching, "CacheImpl", None) or _caching._CacheImpl   # renamed in numba 0.61+
if _ZipCacheLocator not in _IMPL._locator_classes:
    # first: numba's own zip locator (0.61+) caches under ~/.cache, which an executor may not be able to write
    _IMPL._locator_classes.insert(0, _ZipCacheLocator)
if _KernelFamilyLocator not in _IMPL._locator_classes:
    _IMPL._locator_classes.insert(1, _KernelFamilyLocator)


def njit(*args, **kwargs):
    """``numba.njit`` with the project's defaults: on-disk cache, GIL released."""
    kwargs.setdefault("cache", bool(CACHE_DIR))
    kwargs.setdefault("nogil", True)
    return numba.njit(*args, **kwargs)


__all__ = ["njit", "CACHE_DIR", "cache_dir"]
