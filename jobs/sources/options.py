"""Options of the ``rocketmq_*`` Spark data sources, parsed once on the driver into a frozen dataclass.

Spark hands a data source its options as a case-insensitive ``str -> str`` mapping (keys arrive lower-cased).
:func:`parse_options` turns that mapping into :class:`SourceOptions` during planning (``DataSource.schema()``
/ ``reader()``, i.e. on the driver) and raises an :class:`OptionError` (a :class:`txlog_io.errors.UsageError`)
for anything wrong: an unknown key, a value of the wrong shape, a missing path, a path that is not a broker
store.  Every message is one line that starts with ``TXAUDIT_BAD_OPTION`` and names the format and the option,
so it stays recognisable inside the ``AnalysisException`` Spark wraps Python errors in.

Options (all optional except a path):

==================  ==========================================================================================
``path``            one store root (what ``.load(path)`` sets)
``paths``           several store roots: comma-separated, or the JSON array ``.load([a, b])`` sets
``broker``          broker name for a single store
``brokers``         comma-separated broker names, one per root, in the same order
``commitlog_dirs``  comma-separated CommitLog directories replacing ``<root>/commitlog`` (5.x multi-dir
                    ``storePathCommitLog``); only with a single store root
``split_bytes``     byte range per CommitLog partition (and size budget per group of small files): an
                    integer with an optional k/m/g suffix (binary units), ``134217728`` or ``128m``;
                    default 128 MiB, minimum 4 KiB
``include_bodies``  ``true``/``false`` (default false): fill the CommitLog ``body`` column
``topics``          comma-separated topic filter (CommitLog and ConsumeQueue sources)
``pushdown``        ``true``/``false`` (default false): let the reader take EqualTo/In filters on ``broker``
                    and ``topic`` itself (needs ``spark.sql.python.filterPushdown.enabled``).  Off by
                    default: Spark 4.2 shares one planned reader among all scans of a loaded DataFrame, so
                    a DataFrame read with pushdown must be used by one scan only (see jobs.sources.formats)
``task_bytes``      txscan source only: CommitLog bytes per task (consecutive ``split_bytes`` cells of one
                    file, each decoded on its own exactly as in a task of its own); default = ``split_bytes``
``columns``         txscan source only: ``all`` (default) or ``reducer``: only the record columns the
                    reconstruction reads (``schemas.sources.TX_SCAN_REDUCER``), ``body`` holding the op
                    records' bodies (every body with ``include_bodies``)
``sources``         anomalies source only: which decoders to run, comma-separated subset of
                    ``commitlog,consumequeue,statetable,redolog,config,store`` (default: all)
==================  ==========================================================================================

Store roots may be URIs (``s3://bucket/prefix/store``, ``s3a://``, any scheme ``pyarrow.fs`` resolves; see
``txlog_io.storefs``): listed once on the driver, read by ranged GETs on the executors.

Broker names: without ``broker``/``brokers`` a root's name is its directory name, or its parent's name when
the directory is literally called ``store`` (``.../rocketmq-4.9.8/store`` -> ``rocketmq-4.9.8``).  Names must
be unique across the roots of one read.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional

from txlog_io import storefs
from txlog_io.errors import TxlogError, UsageError

DEFAULT_SPLIT_BYTES = 128 * 1024 * 1024
MIN_SPLIT_BYTES = 4 * 1024
MAX_SPLIT_BYTES = 1 << 40

ANOMALY_SOURCES = ("commitlog", "consumequeue", "statetable", "redolog", "config", "store")

_COMMON_KEYS = frozenset({"path", "paths", "broker", "brokers", "commitlog_dirs", "split_bytes", "pushdown"})
#: format name -> option keys it accepts beyond the common ones
FORMAT_KEYS = {
    "rocketmq_commitlog": frozenset({"include_bodies", "topics"}),
    "rocketmq_consumequeue": frozenset({"topics"}),
    "rocketmq_statetable": frozenset(),
    "rocketmq_redolog": frozenset(),
    "rocketmq_consumer_offsets": frozenset(),
    "rocketmq_anomalies": frozenset({"sources"}),
    "rocketmq_txscan": frozenset({"include_bodies", "task_bytes", "columns"}),
}

#: the txscan source's ``columns`` values
TX_SCAN_COLUMNS = ("all", "reducer")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_STORE_MARKERS = ("commitlog", "consumequeue")  # what txlog_io.mappedfile.discover_store requires


class OptionError(UsageError):
    """A data source option is unknown, malformed or names something that is not there."""

    def __init__(self, fmt: str, option: str, reason: str):
        super().__init__(f"TXAUDIT_BAD_OPTION {fmt}: option '{option}': {reason}")
        self.format = fmt
        self.option = option
        self.reason = reason


class NotAStoreError(OptionError):
    """A path option names an existing directory that is not a RocketMQ store root."""


@dataclass(frozen=True)
class SourceOptions:
    """Everything a ``rocketmq_*`` reader needs, validated.  Picklable; travels to executors in the reader."""

    format: str
    paths: tuple                       # absolute store roots, in the order given
    brokers: tuple                     # one broker name per root
    commitlog_dirs: Optional[tuple] = None   # replaces <root>/commitlog (single root only)
    split_bytes: int = DEFAULT_SPLIT_BYTES
    include_bodies: bool = False
    topics: Optional[frozenset] = None       # None = every topic
    sources: frozenset = frozenset(ANOMALY_SOURCES)
    pushdown: bool = False
    task_bytes: int = 0                      # txscan: bytes of cells per task (0 = one cell per task)
    columns: str = "all"                     # txscan: "all" or "reducer" (TX_SCAN_COLUMNS)

    @property
    def stores(self) -> tuple:
        """``((broker, root), ...)`` in option order."""
        return tuple(zip(self.brokers, self.paths, strict=True))

    def commitlog_dirs_of(self, root: str) -> Optional[tuple]:
        return self.commitlog_dirs if self.commitlog_dirs and root == self.paths[0] else None


def _split_list(value: str) -> list:
    return [p.strip() for p in value.split(",") if p.strip()]


def _parse_paths(fmt: str, key: str, value: str) -> list:
    value = value.strip()
    if value.startswith("["):
        try:
            items = json.loads(value)
        except ValueError as e:
            raise OptionError(fmt, key, f"not a JSON array of paths: {value!r} ({e})") from None
        if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
            raise OptionError(fmt, key, f"not a JSON array of path strings: {value!r}")
        return [i.strip() for i in items if i.strip()]
    return _split_list(value)


def parse_split_bytes(fmt: str, value: str) -> int:
    m = _SIZE.match(value or "")
    if not m:
        raise OptionError(fmt, "split_bytes",
                          f"expected a byte count such as 134217728 or 128m, got {value!r}")
    n = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if not MIN_SPLIT_BYTES <= n <= MAX_SPLIT_BYTES:
        raise OptionError(fmt, "split_bytes",
                          f"must be between {MIN_SPLIT_BYTES} and {MAX_SPLIT_BYTES} bytes, got {value!r}")
    return n


def _parse_bool(fmt: str, key: str, value: str) -> bool:
    v = (value or "").strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise OptionError(fmt, key, f"expected true or false, got {value!r}")


def default_broker_name(root: str) -> str:
    """Directory name of the root, or its parent's name when the root is literally called ``store``."""
    parts = storefs.split_uri(root)
    if parts is not None:                       # s3://bucket/backups/broker-a/store -> broker-a
        names = [n for n in parts[1].split("/") if n]
        if len(names) > 1 and names[-1] == "store":
            return names[-2]
        return names[-1] if names else parts[1]
    norm = os.path.normpath(os.path.abspath(storefs.local_path(root)))
    base = os.path.basename(norm)
    if base == "store":
        parent = os.path.basename(os.path.dirname(norm))
        return parent or base
    return base


def check_store_root(fmt: str, key: str, root: str, has_commitlog_dirs: bool = False) -> str:
    """Absolute path of ``root`` if it looks like a broker store root; an :class:`OptionError` otherwise."""
    if storefs.is_remote(root):
        return _check_remote_root(fmt, key, root, has_commitlog_dirs)
    path = os.path.abspath(storefs.local_path(root))
    if not os.path.exists(path):
        raise OptionError(fmt, key, f"store root not found: {path}")
    if not os.path.isdir(path):
        raise NotAStoreError(fmt, key, f"not a directory (expected a broker store root): {path}")
    if not has_commitlog_dirs and not any(os.path.isdir(os.path.join(path, m)) for m in _STORE_MARKERS):
        hint = ""
        if os.path.isdir(os.path.join(path, "store")):
            hint = f"; did you mean {os.path.join(path, 'store')}?"
        raise NotAStoreError(fmt, key, f"not a RocketMQ store root (none of {', '.join(_STORE_MARKERS)} "
                                       f"inside): {path}{hint}")
    return path


def _check_remote_root(fmt: str, key: str, root: str, has_commitlog_dirs: bool) -> str:
    uri = storefs.normalize_root(root)
    try:
        path = storefs.as_path(uri)
        found = path.exists()
    except TxlogError as e:
        raise OptionError(fmt, key, str(e)) from None
    if not found:
        raise OptionError(fmt, key, f"store root not found: {uri} (no object under this prefix)")
    if not path.is_dir():
        raise NotAStoreError(fmt, key, f"not a prefix but an object (expected a broker store root): {uri}")
    if not has_commitlog_dirs and not any((path / m).is_dir() for m in _STORE_MARKERS):
        hint = f"; did you mean {uri}/store?" if (path / "store").is_dir() else ""
        raise NotAStoreError(fmt, key, f"not a RocketMQ store root (none of {', '.join(_STORE_MARKERS)} "
                                       f"inside): {uri}{hint}")
    return uri


def _is_dir(path: str) -> bool:
    try:
        return storefs.as_path(path).is_dir() if storefs.is_remote(path) else os.path.isdir(path)
    except TxlogError:
        return False


def parse_options(fmt: str, options: Mapping[str, str]) -> SourceOptions:
    """Validate ``options`` for format ``fmt``; raises :class:`OptionError` naming the offending option."""
    if fmt not in FORMAT_KEYS:
        raise UsageError(f"TXAUDIT_BAD_OPTION unknown rocketmq format {fmt!r}")
    opts = {str(k).lower(): ("" if v is None else str(v)) for k, v in dict(options).items()}
    allowed = _COMMON_KEYS | FORMAT_KEYS[fmt]
    for key in sorted(opts):
        if key not in allowed:
            raise OptionError(fmt, key, f"unknown option; {fmt} accepts {', '.join(sorted(allowed))}")

    roots: list = []
    for key in ("path", "paths"):
        if key in opts:
            for p in _parse_paths(fmt, key, opts[key]):
                if p not in roots:
                    roots.append(p)
    if not roots:
        raise OptionError(fmt, "path",
                          "no store root given: use .load(path) or .option('paths', 'rootA,rootB')")
    key_of_paths = "path" if "path" in opts and "paths" not in opts else "paths"
    own_commitlog = "commitlog_dirs" in opts and len(roots) == 1
    paths = tuple(check_store_root(fmt, key_of_paths, p, has_commitlog_dirs=own_commitlog) for p in roots)
    if len(set(paths)) != len(paths):
        raise OptionError(fmt, key_of_paths, f"the same store root is given twice: {list(paths)}")

    if "broker" in opts and "brokers" in opts:
        raise OptionError(fmt, "broker", "give either 'broker' or 'brokers', not both")
    if "broker" in opts or "brokers" in opts:
        key = "broker" if "broker" in opts else "brokers"
        brokers = tuple(_split_list(opts[key]))
        if len(brokers) != len(paths):
            raise OptionError(fmt, key, f"{len(brokers)} broker name(s) {list(brokers)} for {len(paths)} "
                                        f"store root(s); give one name per root, in order")
    else:
        key = "brokers"
        brokers = tuple(default_broker_name(p) for p in paths)
    if len(set(brokers)) != len(brokers):
        raise OptionError(fmt, key, f"broker names must be unique, got {list(brokers)} "
                                    f"(set option 'brokers' to name each root)")

    commitlog_dirs = None
    if "commitlog_dirs" in opts:
        if len(paths) != 1:
            raise OptionError(fmt, "commitlog_dirs", "only allowed with a single store root")
        dirs = [storefs.normalize_root(d) for d in _split_list(opts["commitlog_dirs"])]
        if not dirs:
            raise OptionError(fmt, "commitlog_dirs", "empty list")
        for d in dirs:
            if not _is_dir(d):
                raise OptionError(fmt, "commitlog_dirs", f"not a directory: {d}")
        commitlog_dirs = tuple(dirs)

    split_bytes = DEFAULT_SPLIT_BYTES
    if "split_bytes" in opts:
        split_bytes = parse_split_bytes(fmt, opts["split_bytes"])
    task_bytes = parse_split_bytes(fmt, opts["task_bytes"]) if "task_bytes" in opts else 0
    include_bodies = _parse_bool(fmt, "include_bodies", opts["include_bodies"]) if "include_bodies" in opts \
        else False

    pushdown = _parse_bool(fmt, "pushdown", opts["pushdown"]) if "pushdown" in opts else False
    columns = opts.get("columns", "all").strip().lower()
    if columns not in TX_SCAN_COLUMNS:
        raise OptionError(fmt, "columns", f"expected one of {', '.join(TX_SCAN_COLUMNS)}, got {opts['columns']!r}")

    topics = None
    if "topics" in opts:
        items = _split_list(opts["topics"])
        if not items:
            raise OptionError(fmt, "topics", "empty topic list (leave the option out to read every topic)")
        topics = frozenset(items)

    sources = frozenset(ANOMALY_SOURCES)
    if "sources" in opts:
        items = _split_list(opts["sources"])
        bad = [s for s in items if s not in ANOMALY_SOURCES]
        if bad or not items:
            raise OptionError(fmt, "sources", f"expected a comma-separated subset of "
                                              f"{','.join(ANOMALY_SOURCES)}, got {opts['sources']!r}")
        sources = frozenset(items)

    return SourceOptions(format=fmt, paths=paths, brokers=brokers, commitlog_dirs=commitlog_dirs,
                         split_bytes=split_bytes, include_bodies=include_bodies, topics=topics,
                         sources=sources, pushdown=pushdown, task_bytes=task_bytes,
                         columns=columns)


__all__ = ["SourceOptions", "OptionError", "NotAStoreError", "parse_options", "parse_split_bytes",
           "default_broker_name", "check_store_root", "DEFAULT_SPLIT_BYTES", "ANOMALY_SOURCES", "FORMAT_KEYS",
           "TX_SCAN_COLUMNS"]
