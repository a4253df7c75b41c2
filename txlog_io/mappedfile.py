"""Mapped-file queues (20-digit offset names, order, sizes, gaps) and store discovery.

Sources: store/.../MappedFileQueue.java (load/doLoad, checkSelf, getLastMappedFile), store/.../MultiPathMappedFileQueue
.java (5.x storePathCommitLog with several ','-separated directories), store/.../config/StorePathConfigHelper.java,
common/.../UtilAll.offset2FileName, broker/.../BrokerPathConfigHelper.java — 5.3.3 / 4.9.7; 3.1.4 MapedFileQueue and
StorePathConfigHelper (transaction/statetable, transaction/redolog).

What RocketMQ requires of a mapped-file queue, and what we report when a store breaks it:
  * every file is named by the 20-digit zero-padded decimal of its first byte's offset  -> BAD_FILE_NAME
    (dotfiles are ignored: they are editor / OS litter, not something RocketMQ would try to load)
  * every file has exactly the configured size (5.x deletes a 0-byte LAST file at load; 3.x/4.x refuse to
    load any mismatching file)                                                             -> FILE_SIZE_MISMATCH
  * adjacent names differ by exactly the file size                                      -> FILE_GAP / FILE_OVERLAP
  * names are multiples of the file size, and of the unit size for unit files
    (ConsumeQueue/redolog 20 B, statetable 24 B)                                        -> MISALIGNED_FILE_NAME
The configured size is not stored anywhere in the store, so unless the caller knows it we infer it: the most
common value among the file lengths and the spacings of adjacent names (ties -> the larger value).

Store layout (storePathRootDir):
  commitlog/ (or storePathCommitLog dirs)   consumequeue/{topic}/{queueId}/   consumequeue_ext/{topic}/{queueId}/
  transaction/statetable/ (3.x)   transaction/redolog/TRANSACTION_REDOLOG_TOPIC_XXXX/0/ (3.x)
  index/   config/{consumerOffset,topics,delayOffset}.json   checkpoint   abort   lock
In 5.x RocksDB mode (storeType=defaultRocksDB) consumequeue/ holds a RocksDB database instead of queue
directories; discovery flags that, lists no queue files and lists the database's queues (``rocksdb_queues``,
read through txlog_io.rocksdb_cq).

DLedger mode (enableDLegerCommitLog, 4.5+; RocketMQ store/dledger/DLedgerCommitLog.java): the messages live in
dledger-<selfId>/data/ (entries wrapping one record each, see txlog_io/dledger.py) with
dledger-<selfId>/index/, checkpoint and currterm beside them, and usually no commitlog/ at all.  A store
converted from file mode keeps its old commitlog/ below the dividing offset (= the first DLedger file's name):
both read as one log, listed in ``StoreLayout.commitlog`` in offset order (``is_dledger_data_file`` tells the
two kinds of file apart).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence, Union

from txlog_io.errors import Anomaly, AnomalyKind, StoreNotFoundError, UsageError
from txlog_io.storefs import as_path, scandir

FILE_NAME_DIGITS = 20
REDOLOG_TOPIC = "TRANSACTION_REDOLOG_TOPIC_XXXX"  # 3.1.4 TransactionStateService: redolog is this topic's queue 0

# Fixed unit size per mapped-file source: names must be multiples of it (and so must file sizes).
UNIT_SIZE_BY_SOURCE = {"consumequeue": 20, "redolog": 20, "statetable": 24, "dledger_index": 32}
DLEDGER_PREFIX = "dledger-"

PathLike = Union[str, os.PathLike]


@dataclass(frozen=True)
class MappedFile:
    path: Path
    base_offset: int   # from the 20-digit name: the global offset of the file's first byte
    size: int          # length on disk

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size


def is_offset_name(name: str) -> bool:
    return len(name) == FILE_NAME_DIGITS and name.isascii() and name.isdigit()


def offset_to_file_name(offset: int) -> str:
    """UtilAll.offset2FileName."""
    if offset < 0 or offset >= 10 ** FILE_NAME_DIGITS:
        raise UsageError(f"offset {offset} has no 20-digit file name")
    return f"{offset:0{FILE_NAME_DIGITS}d}"


def _scan_directory(directory: Path, source: str, anomalies: list) -> list:
    files = []
    for entry in sorted(scandir(directory), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            anomalies.append(Anomaly(AnomalyKind.BAD_FILE_NAME, entry.path, 0,
                                     "unexpected directory inside a mapped-file directory", "a 20-digit file",
                                     entry.name, source))
            continue
        if not is_offset_name(entry.name):
            anomalies.append(Anomaly(AnomalyKind.BAD_FILE_NAME, entry.path, 0,
                                     "file name is not a 20-digit offset; RocketMQ cannot load it",
                                     "20 decimal digits", entry.name, source))
            continue
        files.append(MappedFile(directory / entry.name, int(entry.name), entry.stat().st_size))
    return files


def infer_file_size(files: Sequence[MappedFile]) -> Optional[int]:
    """Most common value among the non-empty file lengths and adjacent-name spacings (ties -> larger)."""
    votes = Counter(mf.size for mf in files if mf.size > 0)
    ordered = sorted(files, key=lambda mf: mf.base_offset)
    votes.update(b.base_offset - a.base_offset for a, b in zip(ordered, ordered[1:], strict=False)
                 if b.base_offset > a.base_offset)
    if not votes:
        return None
    return max(votes.items(), key=lambda kv: (kv[1], kv[0]))[0]


def check_mapped_files(files: Sequence[MappedFile], file_size: Optional[int], source: str) -> list:
    """Anomalies of one queue's files (already sorted by offset) against the configured/inferred file size."""
    anomalies = []
    unit = UNIT_SIZE_BY_SOURCE.get(source)
    for index, mf in enumerate(files):
        is_last = index == len(files) - 1
        if file_size is not None and mf.size != file_size:
            detail = "file length differs from the queue's file size; RocketMQ refuses to load the queue"
            if mf.size == 0 and is_last:
                detail = "empty last file (5.x deletes it at load; 3.x/4.x refuse to load it)"
            anomalies.append(Anomaly(AnomalyKind.FILE_SIZE_MISMATCH, str(mf.path), 0, detail, str(file_size),
                                     str(mf.size), source, mf.base_offset))
        elif unit and mf.size % unit:
            anomalies.append(Anomaly(AnomalyKind.FILE_SIZE_MISMATCH, str(mf.path), 0,
                                     f"file length is not a multiple of the {unit}-byte unit",
                                     f"multiple of {unit}", str(mf.size), source, mf.base_offset))
        if unit and mf.base_offset % unit:
            anomalies.append(Anomaly(AnomalyKind.MISALIGNED_FILE_NAME, str(mf.path), 0,
                                     f"name is not a multiple of the {unit}-byte unit", f"multiple of {unit}",
                                     str(mf.base_offset), source, mf.base_offset))
        elif file_size and mf.base_offset % file_size:
            anomalies.append(Anomaly(AnomalyKind.MISALIGNED_FILE_NAME, str(mf.path), 0,
                                     "name is not a multiple of the file size (RocketMQ names every file "
                                     "fileSize * n)", f"multiple of {file_size}", str(mf.base_offset), source,
                                     mf.base_offset))
    for previous, current in zip(files, files[1:], strict=False):
        expected_next = previous.base_offset + (file_size if file_size is not None else previous.size)
        if current.base_offset > expected_next:
            anomalies.append(Anomaly(AnomalyKind.FILE_GAP, str(current.path), 0,
                                     f"bytes [{expected_next}, {current.base_offset}) are missing after "
                                     f"{previous.name}", str(expected_next), str(current.base_offset), source,
                                     expected_next, current.base_offset - expected_next))   # no file holds them
        elif current.base_offset < expected_next:
            anomalies.append(Anomaly(AnomalyKind.FILE_OVERLAP, str(current.path), 0,
                                     f"starts inside the range of {previous.path}", str(expected_next),
                                     str(current.base_offset), source, current.base_offset,
                                     expected_next - current.base_offset))
    return anomalies


def _as_directories(directory) -> list:
    if isinstance(directory, (str, os.PathLike)) or not hasattr(directory, "__iter__"):
        return [as_path(directory)]
    return [as_path(d) for d in directory]


def list_mapped_files(directory, expected_file_size: Optional[int] = None, source: str = "commitlog") -> tuple:
    """(files sorted by offset, anomalies) of one mapped-file queue.

    `directory` may be one directory or several (5.x multi-path CommitLog): their files are merged in offset
    order.  Without expected_file_size the size is inferred (see module doc).
    """
    anomalies: list = []
    files: list = []
    for d in _as_directories(directory):
        if not d.is_dir():
            raise StoreNotFoundError(str(d), f"{source} directory")
        files.extend(_scan_directory(d, source, anomalies))
    files.sort(key=lambda mf: (mf.base_offset, str(mf.path)))
    file_size = expected_file_size if expected_file_size is not None else infer_file_size(files)
    anomalies.extend(check_mapped_files(files, file_size, source))
    return files, anomalies


@dataclass
class StoreLayout:
    root: Path
    commitlog_dirs: list = field(default_factory=list)
    commitlog: list = field(default_factory=list)                 # [MappedFile] in offset order
    commitlog_file_size: Optional[int] = None
    consume_queues: dict = field(default_factory=dict)            # {(topic, queue_id): [MappedFile]}
    consumequeue_file_size: Optional[int] = None
    consumequeue_rocksdb: bool = False                            # 5.x storeType=defaultRocksDB
    #: RocksDB mode: {(topic, queue_id): (first queue offset, last queue offset)} of the database's units
    rocksdb_queues: dict = field(default_factory=dict)
    rocksdb_path: Optional[Path] = None                           # the database directory (consumequeue/)
    consumequeue_ext: dict = field(default_factory=dict)          # {(topic, queue_id): [MappedFile]}
    consumequeue_ext_file_size: Optional[int] = None
    statetable: list = field(default_factory=list)                # 3.x
    statetable_file_size: Optional[int] = None
    redolog: list = field(default_factory=list)                   # 3.x
    redolog_file_size: Optional[int] = None
    index_files: list = field(default_factory=list)               # [Path]; names are timestamps, not offsets
    consumer_offset_path: Optional[Path] = None                   # set when the file or its .bak exists
    topics_path: Optional[Path] = None
    delay_offset_path: Optional[Path] = None
    checkpoint_path: Optional[Path] = None
    abort_present: bool = False                                   # last shutdown was not clean
    lock_path: Optional[Path] = None
    dledger_dir: Optional[Path] = None                            # dledger-<selfId>/ (DLedger mode)
    dledger_index: list = field(default_factory=list)             # [MappedFile] of dledger-<selfId>/index/
    dledger_index_file_size: Optional[int] = None                 # inferred: DLedger stores it nowhere
    dledger_divided_offset: Optional[int] = None                  # first DLedger offset; commitlog/ below it
    anomalies: list = field(default_factory=list)

    def all_mapped_files(self) -> list:
        out = list(self.commitlog)
        for group in (self.consume_queues, self.consumequeue_ext):
            for files in group.values():
                out.extend(files)
        return out + list(self.statetable) + list(self.redolog)


def _resolve_commitlog_dirs(root: Path, commitlog_dirs) -> Optional[list]:
    if commitlog_dirs is None:
        return None
    raw = commitlog_dirs.split(",") if isinstance(commitlog_dirs, str) else list(commitlog_dirs)
    dirs = []
    for d in raw:
        text = str(d).strip()
        if not text:
            continue
        p = as_path(text)
        dirs.append(p if p.is_absolute() else root / text)  # relative: taken as relative to the store root
    if not dirs:
        raise UsageError(f"no commitlog directory in {commitlog_dirs!r}")
    for d in dirs:
        if not d.is_dir():
            raise StoreNotFoundError(str(d), "commitlog directory")
    return dirs


def _is_rocksdb_dir(directory: Path) -> bool:
    names = {e.name for e in scandir(directory) if e.is_file()}
    return "CURRENT" in names and any(n.startswith("MANIFEST-") for n in names)


def _add_rocksdb_queues(layout: "StoreLayout", directory: Path, anomalies: list) -> None:
    """The queues of a RocksDB consume-queue database (txlog_io.rocksdb_cq, opened read-only); a database that
    cannot be opened is a finding and lists no queue (the audit then scans the CommitLog)."""
    from txlog_io.errors import TxlogError
    from txlog_io.rocksdb_cq import CqDatabase

    try:
        with CqDatabase(directory) as db:
            layout.rocksdb_queues = db.queues()
    except TxlogError as e:
        anomalies.append(Anomaly(AnomalyKind.BAD_FILE_HEADER, str(directory), 0, str(e),
                                 "a RocksDB consume-queue database RocksDB can open read-only", "unreadable",
                                 "consumequeue"))


def _scan_queue_tree(top: Path, source: str, anomalies: list) -> dict:
    """{(topic, queue_id): [MappedFile]} from top/{topic}/{queueId}/, unchecked (sizes are checked store-wide)."""
    queues = {}
    for topic_entry in sorted(scandir(top), key=lambda e: e.name):
        if topic_entry.name.startswith("."):
            continue
        if not topic_entry.is_dir():
            anomalies.append(Anomaly(AnomalyKind.BAD_FILE_NAME, topic_entry.path, 0,
                                     "unexpected file where a topic directory belongs", "a topic directory",
                                     topic_entry.name, source))
            continue
        topic_dir = top / topic_entry.name
        for queue_entry in sorted(scandir(topic_dir), key=lambda e: e.name):
            if queue_entry.name.startswith("."):
                continue
            name = queue_entry.name
            if not queue_entry.is_dir() or not (name.isascii() and name.isdigit()) or int(name) > 2 ** 31 - 1:
                anomalies.append(Anomaly(AnomalyKind.BAD_FILE_NAME, queue_entry.path, 0,
                                         "not a queue-id directory (RocketMQ parses the name as an int)",
                                         "a decimal queue id directory", name, source))
                continue
            queues[(topic_entry.name, int(name))] = _scan_directory(topic_dir / name, source, anomalies)
    return queues


def _check_queue_tree(queues: dict, source: str, anomalies: list) -> Optional[int]:
    """One file size for the whole tree (it is a single broker setting), then per-queue checks."""
    file_size = infer_file_size([mf for files in queues.values() for mf in files])
    for key in queues:
        queues[key].sort(key=lambda mf: mf.base_offset)
        anomalies.extend(check_mapped_files(queues[key], file_size, source))
    return file_size


def _existing_config(config_dir: Path, name: str) -> Optional[Path]:
    main = config_dir / name
    if main.is_file() or (config_dir / (name + ".bak")).is_file():
        return main
    return None


def find_dledger_dir(root: Path) -> Optional[Path]:
    """The store's ``dledger-<selfId>/`` holding a ``data/`` directory; several of them in one root are an
    error (replicas of a group are separate stores: give each its own root)."""
    found = sorted(root / e.name for e in scandir(root)
                   if e.is_dir() and e.name.startswith(DLEDGER_PREFIX) and (root / e.name / "data").is_dir())
    if len(found) > 1:
        raise UsageError(f"{root} holds several DLedger stores ({', '.join(p.name for p in found)}); give "
                         f"each replica as its own store root")
    return found[0] if found else None


def _add_dledger(layout: StoreLayout, dledger_dir: Path) -> None:
    """DLedger data files join ``layout.commitlog`` above the dividing offset (DLedgerCommitLog.recover)."""
    anomalies = layout.anomalies
    layout.dledger_dir = dledger_dir
    data, found = list_mapped_files(dledger_dir / "data", source="dledger")
    anomalies.extend(found)
    legacy = layout.commitlog
    if data:
        divided = data[0].base_offset
        layout.dledger_divided_offset = divided
        for mf in legacy:
            if mf.end_offset > divided:
                anomalies.append(Anomaly(AnomalyKind.FILE_OVERLAP, str(mf.path), 0,
                                         f"legacy CommitLog file reaches past the DLedger dividing offset "
                                         f"{divided} (DLedger's log wins there; the file is not read)",
                                         f"end <= {divided}",
                                         str(mf.end_offset), "commitlog", mf.base_offset))
        legacy = [mf for mf in legacy if mf.end_offset <= divided]
        if legacy and legacy[-1].end_offset != divided:
            gap = f"[{legacy[-1].end_offset}, {divided})"
            anomalies.append(Anomaly(AnomalyKind.FILE_GAP, str(data[0].path), 0,
                                     f"bytes {gap} between the legacy CommitLog and the DLedger log are missing",
                                     str(legacy[-1].end_offset), str(divided),
                                     "dledger", legacy[-1].end_offset))
        layout.commitlog_file_size = infer_file_size(data)
    layout.commitlog = legacy + data
    layout.commitlog_dirs = list(layout.commitlog_dirs) + [dledger_dir / "data"]
    index_dir = dledger_dir / "index"
    if index_dir.is_dir():
        layout.dledger_index, found = list_mapped_files(index_dir, source="dledger_index")
        layout.dledger_index_file_size = infer_file_size(layout.dledger_index)
        anomalies.extend(found)
    elif data:
        anomalies.append(Anomaly(AnomalyKind.MISSING_FILE, str(index_dir), 0, "DLedger store without its "
                                 "index directory (DLedger cannot load it)", "a directory", "missing",
                                 "dledger"))


def message_log_kind(root: PathLike) -> Optional[str]:
    """``commitlog``, ``dledger`` or ``converted`` (commitlog/ below dledger-*/data/): where a store root
    keeps its messages; None when it has neither (its records cannot be read, whatever else is there).  Raises
    UsageError for a root holding several dledger-*/data/ (see ``find_dledger_dir``)."""
    root_path = as_path(root)
    plain = (root_path / "commitlog").is_dir()
    dledger = find_dledger_dir(root_path) is not None     # several replicas in one root: UsageError
    if plain and dledger:
        return "converted"
    return "dledger" if dledger else "commitlog" if plain else None


def discover_store(root: PathLike, commitlog_dirs=None) -> StoreLayout:
    """Find every file of a broker store below `root` (storePathRootDir).

    commitlog_dirs: storePathCommitLog when it is not root/commitlog — one path, a ','-separated string or a list;
    relative paths are taken relative to root.  Raises StoreNotFoundError for a missing root and UsageError when
    the directory has neither a CommitLog nor a consumequeue directory (not a store).
    """
    root_path = as_path(root)
    if not root_path.exists():
        raise StoreNotFoundError(str(root_path), "store root")
    if not root_path.is_dir():
        raise UsageError(f"store root is not a directory: {root_path}")
    layout = StoreLayout(root=root_path)
    anomalies = layout.anomalies

    dirs = _resolve_commitlog_dirs(root_path, commitlog_dirs)
    default_commitlog = root_path / "commitlog"
    consumequeue_dir = root_path / "consumequeue"
    if dirs is None:
        dirs = [default_commitlog] if default_commitlog.is_dir() else []
    dledger_dir = find_dledger_dir(root_path)
    if not dirs and not consumequeue_dir.is_dir() and dledger_dir is None:
        raise UsageError(f"{root_path} does not look like a RocketMQ store (no commitlog/, no "
                         f"dledger-*/data/ and no consumequeue/)")

    layout.commitlog_dirs = dirs
    if dirs:
        layout.commitlog, found = list_mapped_files(dirs, source="commitlog")
        layout.commitlog_file_size = infer_file_size(layout.commitlog)
        anomalies.extend(found)
    if dledger_dir is not None:
        _add_dledger(layout, dledger_dir)
    elif not dirs:
        anomalies.append(Anomaly(AnomalyKind.MISSING_FILE, str(default_commitlog), 0,
                                 "store has consume queues but no commitlog directory", "a directory", "missing",
                                 "store"))

    if consumequeue_dir.is_dir():
        if _is_rocksdb_dir(consumequeue_dir):
            layout.consumequeue_rocksdb = True
            layout.rocksdb_path = consumequeue_dir
            _add_rocksdb_queues(layout, consumequeue_dir, anomalies)
        else:
            layout.consume_queues = _scan_queue_tree(consumequeue_dir, "consumequeue", anomalies)
            layout.consumequeue_file_size = _check_queue_tree(layout.consume_queues, "consumequeue", anomalies)

    ext_dir = root_path / "consumequeue_ext"
    if ext_dir.is_dir():
        layout.consumequeue_ext = _scan_queue_tree(ext_dir, "consumequeue_ext", anomalies)
        layout.consumequeue_ext_file_size = _check_queue_tree(layout.consumequeue_ext, "consumequeue_ext",
                                                              anomalies)

    statetable_dir = root_path / "transaction" / "statetable"
    if statetable_dir.is_dir():
        layout.statetable, found = list_mapped_files(statetable_dir, source="statetable")
        layout.statetable_file_size = infer_file_size(layout.statetable)
        anomalies.extend(found)
    redolog_dir = root_path / "transaction" / "redolog" / REDOLOG_TOPIC / "0"
    if redolog_dir.is_dir():
        layout.redolog, found = list_mapped_files(redolog_dir, source="redolog")
        layout.redolog_file_size = infer_file_size(layout.redolog)
        anomalies.extend(found)

    index_dir = root_path / "index"
    if index_dir.is_dir():
        layout.index_files = sorted(index_dir / e.name for e in scandir(index_dir)
                                    if e.is_file() and not e.name.startswith("."))

    config_dir = root_path / "config"
    layout.consumer_offset_path = _existing_config(config_dir, "consumerOffset.json")
    layout.topics_path = _existing_config(config_dir, "topics.json")
    layout.delay_offset_path = _existing_config(config_dir, "delayOffset.json")

    checkpoint = root_path / "checkpoint"
    if checkpoint.is_file():
        layout.checkpoint_path = checkpoint
    elif layout.commitlog:
        # StoreCheckpoint creates the file at every broker start, so a store with data always has one.
        anomalies.append(Anomaly(AnomalyKind.MISSING_FILE, str(checkpoint), 0,
                                 "store has CommitLog files but no checkpoint", "a 4096-byte file", "missing",
                                 "store"))
    layout.abort_present = (root_path / "abort").is_file()
    lock = root_path / "lock"
    layout.lock_path = lock if lock.is_file() else None
    from txlog_io.retention import head_findings  # retention or loss of the files before the first

    anomalies.extend(head_findings(layout))
    return layout
