"""Where a store's bytes live: a local directory, or a prefix of any filesystem ``pyarrow.fs`` resolves
(``s3://`` and ``s3a://``/``s3n://`` -- one S3 filesystem --, ``gs://``, ``abfs://``, ``hdfs://``, ...).

The readers keep working on paths: a local path stays a ``pathlib.Path`` / ``str`` and every local read stays
what it was (``os.pread``, ``os.scandir``); a URI becomes a :class:`RemotePath`, which answers the few
``pathlib`` questions store discovery asks (``/``, ``name``, ``parent``, ``is_dir``, ``is_file``, ``exists``,
``iterdir``, ``read_bytes``) from ONE recursive listing of the path it was made from, taken at its first
question (an object store lists a prefix in pages of 1000 keys; a directory walk would cost a request per
directory).  :func:`scandir` is ``os.scandir`` for both.  Positional reads of a remote file are
``txlog_io.positional.RangedFile`` (ranged GETs); this module resolves a URI to ``(filesystem, path)``.

A URI keeps the scheme it was given in every path and message (``s3a://b/k`` stays ``s3a://``; the anomalies
and fingerprints name the files as the user named the store); ``file://`` URIs are plain local paths.

Object stores have no directories: a "directory" here is a key prefix that some object lies under (an empty
directory of the broker's disk does not survive a copy to a bucket), and they have no holes: a copy of a
sparse file is full size and its zeros are read like any other bytes.

S3 settings (:class:`S3Settings`) come from the standard AWS environment variables and profile files; the
audit's configuration (``jobs.config``) turns the same settings into delta-rs ``storage_options`` and Spark's
``spark.hadoop.fs.s3a.*``.  Secrets are never part of a repr or a message.
"""
from __future__ import annotations

import configparser
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from txlog_io.errors import StoreNotFoundError, UnreadableFileError, UsageError

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://(.*)$", re.DOTALL)
#: schemes served by pyarrow's S3FileSystem (Hadoop spells S3 s3a:// and, formerly, s3n://)
S3_SCHEMES = frozenset({"s3", "s3a", "s3n"})


def split_uri(path) -> Optional[Tuple[str, str]]:
    """``(scheme, rest)`` of a URI string (``rest`` without a trailing ``/``); None for a local path."""
    if isinstance(path, RemotePath):
        return path.scheme, path.key
    if not isinstance(path, str):
        return None
    m = _URI.match(path)
    if not m or m.group(1).lower() == "file":
        return None
    return m.group(1), m.group(2).rstrip("/")


def is_remote(path) -> bool:
    """Whether ``path`` names a file outside the local file system (a URI other than ``file://``)."""
    return isinstance(path, RemotePath) or (isinstance(path, str) and split_uri(path) is not None)


def local_path(path: str) -> str:
    """``file:///x`` -> ``/x``; anything else unchanged."""
    if isinstance(path, str) and path[:7].lower() == "file://":
        rest = path[7:]
        return rest if rest.startswith("/") else "/" + rest.split("/", 1)[-1]
    return path


def normalize_root(path: str) -> str:
    """A store root or output directory as the tools keep it: a local path made absolute, a URI without its
    trailing ``/`` (the scheme as given)."""
    parts = split_uri(path)
    if parts is None:
        return os.path.abspath(local_path(path))
    return f"{parts[0]}://{parts[1]}"


# ------------------------------------------------------------------------------------------------ S3 settings
@dataclass(frozen=True)
class S3Settings:
    """S3 endpoint and credentials, from the environment the way the AWS tools read it.

    ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (an S3-compatible server; ``http://`` turns TLS off),
    ``AWS_REGION`` / ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID`` + ``AWS_SECRET_ACCESS_KEY`` (+
    ``AWS_SESSION_TOKEN``), else the ``AWS_PROFILE`` (``default``) section of ``AWS_SHARED_CREDENTIALS_FILE``
    (``~/.aws/credentials``) and of ``AWS_CONFIG_FILE`` (``~/.aws/config``: region, endpoint_url).  Keys left
    unset are left to each client's own default chain (instance roles, web identity)."""

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    access_key_id: Optional[str] = None
    secret_access_key: Optional[str] = field(default=None, repr=False)
    session_token: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> "S3Settings":
        env = os.environ if env is None else env
        profile = env.get("AWS_PROFILE") or env.get("AWS_DEFAULT_PROFILE") or "default"
        creds = _profile_section(env.get("AWS_SHARED_CREDENTIALS_FILE") or "~/.aws/credentials", profile)
        conf = _profile_section(env.get("AWS_CONFIG_FILE") or "~/.aws/config",
                                profile if profile == "default" else f"profile {profile}")
        key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
        token = env.get("AWS_SESSION_TOKEN")
        if not (key and secret):
            key, secret = creds.get("aws_access_key_id"), creds.get("aws_secret_access_key")
            token = creds.get("aws_session_token")
        endpoint = (env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or conf.get("endpoint_url")
                    or None)
        region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or conf.get("region") or None
        return cls(endpoint_url=endpoint, region=region, access_key_id=key or None,
                   secret_access_key=secret or None, session_token=token or None)

    def arrow_options(self) -> dict:
        """Keyword arguments of ``pyarrow.fs.S3FileSystem`` (read-only use: no bucket is created or deleted)."""
        opts: dict = {"allow_bucket_creation": False, "allow_bucket_deletion": False}
        if self.endpoint_url:
            scheme, _, host = self.endpoint_url.partition("://")
            opts["endpoint_override"] = host.rstrip("/") if host else scheme
            opts["scheme"] = scheme if host else "https"
        if self.region:
            opts["region"] = self.region
        elif self.endpoint_url:
            opts["region"] = "us-east-1"        # an S3-compatible server: no region lookup against AWS
        if self.access_key_id and self.secret_access_key:
            opts.update(access_key=self.access_key_id, secret_key=self.secret_access_key)
            if self.session_token:
                opts["session_token"] = self.session_token
        return opts


def _profile_section(path: str, section: str) -> Dict[str, str]:
    parser = configparser.RawConfigParser()
    try:
        parser.read(os.path.expanduser(path), encoding="utf-8")
    except (configparser.Error, OSError, UnicodeDecodeError):
        return {}
    return dict(parser.items(section)) if parser.has_section(section) else {}


_fs_lock = threading.Lock()
_fs_cache: Dict[tuple, object] = {}


def filesystem(path) -> Tuple[Any, str]:
    """``(pyarrow FileSystem, path inside it)`` of a URI; filesystems are made once per process and
    settings (S3 settings are read from the environment at that moment)."""
    parts = split_uri(path)
    if parts is None:
        raise UsageError(f"not a URI: {path}")
    scheme, rest = parts
    from pyarrow import fs as pafs

    if scheme.lower() in S3_SCHEMES:
        settings = S3Settings.from_env()
        key = ("s3", settings)
        with _fs_lock:
            if key not in _fs_cache:
                _fs_cache[key] = pafs.S3FileSystem(**settings.arrow_options())
            return _fs_cache[key], rest
    uri = f"{scheme}://{rest}"
    try:
        found, inner = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError, TypeError) as exc:       # unknown scheme, bad authority
        raise UsageError(f"cannot open {uri}: {_reason(exc)}") from None
    return found, inner


def _reason(exc: BaseException) -> str:
    """The first line of a filesystem error (pyarrow's S3 messages carry the operation and the AWS error)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def reason(exc: BaseException) -> str:
    """Public :func:`_reason`: one line saying why a remote operation failed."""
    return _reason(exc)


# ------------------------------------------------------------------------------------------------ listings
@dataclass
class _Info:
    is_dir: bool
    size: int = 0
    mtime_ns: int = 0


class _Tree:
    """One recursive listing below ``root`` (a path of ``fs``), taken on first use and kept."""

    def __init__(self, fs, root: str, uri: str):
        self.fs, self.root, self.uri = fs, root, uri
        self._lock = threading.Lock()
        self._children: Optional[Dict[str, Dict[str, _Info]]] = None
        self._self: Optional[_Info] = None

    def _load(self) -> None:
        from pyarrow import fs as pafs

        children: Dict[str, Dict[str, _Info]] = {}
        me: Optional[_Info] = None
        try:
            infos = self.fs.get_file_info(pafs.FileSelector(self.root, recursive=True, allow_not_found=True))
            if infos:
                me = _Info(True)
            else:
                one = self.fs.get_file_info(self.root)
                if one.type == pafs.FileType.File:
                    me = _Info(False, int(one.size or 0), int(one.mtime_ns or 0))
                elif one.type == pafs.FileType.Directory:
                    me = _Info(True)
                elif "/" in self.root.strip("/"):        # nothing there: say so if the bucket itself is missing
                    bucket = self.root.strip("/").split("/", 1)[0]
                    if self.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                        raise StoreNotFoundError(f"{self.uri.split('://', 1)[0]}://{bucket}", "bucket")
        except (OSError, ValueError) as exc:
            raise UnreadableFileError(self.uri, f"cannot list: {_reason(exc)}") from None
        for info in infos:
            rel = info.path[len(self.root):].lstrip("/") if info.path.startswith(self.root) else None
            if not rel:
                continue
            parent, _, name = rel.rpartition("/")
            if info.type == pafs.FileType.File:
                entry = _Info(False, int(info.size or 0), int(info.mtime_ns or 0))
            elif info.type == pafs.FileType.Directory:
                entry = _Info(True)
            else:
                continue
            children.setdefault(parent, {})[name] = entry
            while parent:                       # every prefix of a key is a directory
                up, _, dname = parent.rpartition("/")
                siblings = children.setdefault(up, {})
                if dname in siblings and siblings[dname].is_dir:
                    break
                siblings[dname] = _Info(True)
                parent = up
        if me is not None and me.is_dir:
            children.setdefault("", {})
        self._children, self._self = children, me

    def _listing(self) -> Dict[str, Dict[str, _Info]]:
        with self._lock:
            if self._children is None:
                self._load()
        assert self._children is not None       # _load sets it
        return self._children

    def info(self, rel: str) -> Optional[_Info]:
        children = self._listing()
        if not rel:
            return self._self
        parent, _, name = rel.rpartition("/")
        return (children.get(parent) or {}).get(name)

    def children(self, rel: str) -> Dict[str, _Info]:
        return self._listing().get(rel, {})


class RemotePath:
    """A path below a URI root; ``str()`` is the URI.  Answers from its root's one listing (see module doc)."""

    __slots__ = ("scheme", "key", "_tree", "_rel")

    def __init__(self, uri: str, _tree: Optional[_Tree] = None, _rel: str = ""):
        parts = split_uri(uri)
        if parts is None:
            raise UsageError(f"not a URI: {uri}")
        self.scheme, self.key = parts
        if _tree is None:
            fs, inner = filesystem(uri)
            _tree = _Tree(fs, inner.rstrip("/"), f"{self.scheme}://{self.key}")
        self._tree, self._rel = _tree, _rel

    def _child(self, rel: str) -> "RemotePath":
        p = RemotePath.__new__(RemotePath)
        base = self._tree.uri
        p.scheme = self.scheme
        p.key = (base.split("://", 1)[1] + "/" + rel) if rel else base.split("://", 1)[1]
        p._tree, p._rel = self._tree, rel
        return p

    def __truediv__(self, name) -> "RemotePath":
        name = str(name).strip("/")
        if not name:
            return self
        rel = f"{self._rel}/{name}" if self._rel else name
        return self._child(os.path.normpath(rel).replace(os.sep, "/") if ".." in rel else rel)

    def __str__(self) -> str:
        return f"{self.scheme}://{self.key}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __lt__(self, other) -> bool:
        return str(self) < str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    @property
    def name(self) -> str:
        return self.key.rpartition("/")[2]

    @property
    def parent(self) -> "RemotePath":
        if self._rel:
            return self._child(self._rel.rpartition("/")[0])
        up = self.key.rpartition("/")[0]
        return RemotePath(f"{self.scheme}://{up}") if "/" in self.key else self

    def with_name(self, name: str) -> "RemotePath":
        return self.parent / name

    def is_absolute(self) -> bool:
        return True

    def _info(self) -> Optional[_Info]:
        return self._tree.info(self._rel)

    def exists(self) -> bool:
        return self._info() is not None

    def is_dir(self) -> bool:
        info = self._info()
        return bool(info and info.is_dir)

    def is_file(self) -> bool:
        info = self._info()
        return bool(info and not info.is_dir)

    def stat_size(self) -> int:
        info = self._info()
        if info is None:
            raise StoreNotFoundError(str(self), "file")
        return info.size

    def stat_mtime_ns(self) -> int:
        info = self._info()
        if info is None:
            raise StoreNotFoundError(str(self), "file")
        return info.mtime_ns

    def iterdir(self) -> Iterator["RemotePath"]:
        for name in sorted(self._tree.children(self._rel)):
            yield self / name

    def read_bytes(self) -> bytes:
        """The whole file (small files: DLedger's checkpoint and currterm)."""
        with self._tree.fs.open_input_file(_inner(self)) as f:      # OSError as Path.read_bytes raises
            return f.read()


def _inner(path: RemotePath) -> str:
    """The path of ``path`` inside its filesystem."""
    return f"{path._tree.root}/{path._rel}" if path._rel else path._tree.root


class _Entry:
    """What :func:`scandir` yields for a remote directory (the subset of ``os.DirEntry`` the readers use)."""

    __slots__ = ("name", "path", "_info")

    def __init__(self, parent: RemotePath, name: str, info: _Info):
        self.name, self.path, self._info = name, f"{parent}/{name}", info

    def is_dir(self) -> bool:
        return self._info.is_dir

    def is_file(self) -> bool:
        return not self._info.is_dir

    def stat(self) -> os.stat_result:
        return os.stat_result((0o100444, 0, 0, 1, 0, 0, self._info.size, 0, self._info.mtime_ns // 10 ** 9,
                               self._info.mtime_ns // 10 ** 9))


def as_path(path):
    """``pathlib.Path`` of a local path (``file://`` URIs included), :class:`RemotePath` of a URI; a
    RemotePath is returned as is (it keeps its listing)."""
    if isinstance(path, RemotePath):
        return path
    if isinstance(path, str) and split_uri(path) is not None:
        return RemotePath(path)
    return Path(local_path(path) if isinstance(path, str) else path)


def scandir(directory):
    """``os.scandir`` of a local directory; the entries of a RemotePath from its root's listing."""
    if isinstance(directory, RemotePath):
        return [_Entry(directory, name, info) for name, info in directory._tree.children(directory._rel).items()]
    return os.scandir(directory)


def walk_files(root) -> Iterator[Tuple[str, str, int, int]]:
    """``(relative path, path, size, mtime ns)`` of every file below ``root`` in ``os.walk`` order (a
    directory's files by name, then its sub-directories by name); local files as ``os.lstat`` sees them
    (symlinks not followed, files vanishing meanwhile skipped), remote ones from the root's one listing."""
    top = as_path(root)
    if isinstance(top, RemotePath):
        def walk(rel: str):
            entries = top._tree.children(rel)
            for name in sorted(n for n, i in entries.items() if not i.is_dir):
                sub = f"{rel}/{name}" if rel else name
                yield sub, f"{top}/{sub}", entries[name].size, entries[name].mtime_ns
            for name in sorted(n for n, i in entries.items() if i.is_dir):
                yield from walk(f"{rel}/{name}" if rel else name)

        yield from walk("")
        return
    for dirpath, dirs, files in os.walk(str(top), followlinks=False):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            yield os.path.relpath(path, str(top)).replace(os.sep, "/"), path, st.st_size, st.st_mtime_ns


__all__ = ["S3Settings", "RemotePath", "as_path", "scandir", "walk_files", "filesystem", "is_remote",
           "split_uri", "local_path", "normalize_root", "reason", "S3_SCHEMES"]
