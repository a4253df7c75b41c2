"""What the driver learns of a store by listing it (file names and sizes, a few header reads; no record
decoded): :class:`StoreInfo` per store, and the helpers every read plan shares on top of it -- the full scan's
task size, the CommitLog directory per broker, MISSING_FILE findings for offsets no file holds.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence

from jobs.sources.formats import anomalies_batch
from jobs.sources.options import SourceOptions
from txlog_io.commitlog_layout import HALF_TOPIC, TX_SYSTEM_TOPICS
from txlog_io.errors import Anomaly, AnomalyKind
from txlog_io.rocksdb_cq import CQ_UNIT_SIZE as ROCKSDB_UNIT


@dataclass(frozen=True)
class StoreInfo:
    """What the driver learnt by listing one store (no file content read)."""

    broker: str
    root: str
    commitlog_files: tuple          # ((path, base_offset, size), ...) in offset order
    consume_queues: int             # number of (topic, queue_id) directories
    tx_half_topic: bool             # a RMQ_SYS_TRANS_HALF_TOPIC consume queue exists (4.3+ transactions)
    statetable_files: int           # 3.x transaction statetable files
    redolog_files: int              # 3.x transaction redolog files
    abort_present: bool             # last shutdown was not clean
    consumequeue_rocksdb: bool      # 5.x RocksDB consume queues (read through txlog_io.rocksdb_cq)
    discovery_anomalies: int        # findings of discover_store (the rows are in the anomalies frame)
    queue_tails: tuple = ()         # the newest ConsumeQueue file of every (topic, queue_id)
    #: IndexFiles, oldest first: (path, begin_offset, end_offset, full, problem or None, hash_slots, index_num,
    #: end_timestamp); see indexed_gaps.index_file_gaps
    index_files: tuple = ()
    checkpoint_index_ts: int = 0    # checkpoint indexMsgTimestamp: end time of the last full index file flushed
    checkpoint_logics_ts: int = 0   # checkpoint logicsMsgTimestamp: store time of a record whose unit was flushed
    tx_queue_bytes: int = 0         # file bytes of the half / op / discard consume queues
    tx_table_bytes: int = 0         # file bytes of the 3.x statetable and redolog
    rocksdb_cq: str = ""            # the RocksDB consume-queue database directory ("" for file queues)
    #: the half / op / discard consume queues' end files: ((topic, queue_id, oldest file's path, its base
    #: offset, newest file's path, its base offset), ...); base offsets are logical bytes (20 per unit)
    tx_queue_ends: tuple = ()

    @property
    def commitlog_bytes(self) -> int:
        return sum(size for _, _, size in self.commitlog_files)


def has_transaction_index(store: StoreInfo) -> bool:
    """Whether indexed mode can reach the store's transaction records through an index: a half-topic
    consume queue (4.3+) or a 3.x statetable / redolog."""
    return bool(store.tx_half_topic or store.statetable_files or store.redolog_files)


def store_info(broker: str, root: str, commitlog_dirs) -> StoreInfo:
    from txlog_io.mappedfile import discover_store

    layout = discover_store(root, commitlog_dirs=list(commitlog_dirs) if commitlog_dirs else None)
    return StoreInfo(
        broker=broker, root=root,
        commitlog_files=tuple((str(f.path), int(f.base_offset), int(f.size)) for f in layout.commitlog),
        consume_queues=len(layout.consume_queues) + len(layout.rocksdb_queues),
        tx_half_topic=any(topic == HALF_TOPIC for topic, _ in (*layout.consume_queues, *layout.rocksdb_queues)),
        statetable_files=len(layout.statetable), redolog_files=len(layout.redolog),
        abort_present=bool(layout.abort_present), consumequeue_rocksdb=bool(layout.consumequeue_rocksdb),
        discovery_anomalies=len(layout.anomalies),
        queue_tails=tuple(str(files[-1].path) for files in layout.consume_queues.values() if files),
        index_files=_index_files(root), checkpoint_index_ts=_checkpoint_ts(root, "index_msg_timestamp"),
        checkpoint_logics_ts=_checkpoint_ts(root, "logics_msg_timestamp"),
        tx_queue_bytes=sum(int(f.size) for (topic, _), files in layout.consume_queues.items()
                           if topic in TX_SYSTEM_TOPICS for f in files)
        + sum((last - first + 1) * ROCKSDB_UNIT for (topic, _), (first, last) in layout.rocksdb_queues.items()
              if topic in TX_SYSTEM_TOPICS),
        rocksdb_cq=str(layout.rocksdb_path) if layout.rocksdb_queues else "",
        tx_queue_ends=tuple((topic, int(qid), str(files[0].path), int(files[0].base_offset), str(files[-1].path),
                             int(files[-1].base_offset))
                            for (topic, qid), files in sorted(layout.consume_queues.items())
                            if topic in TX_SYSTEM_TOPICS and files),
        tx_table_bytes=sum(int(f.size) for f in (*layout.statetable, *layout.redolog)))


def _index_files(root: str) -> tuple:
    """What the driver needs of each IndexFile to plan lookups: its header range and whether its entries can be
    placed (two positional reads for a file of a known geometry)."""
    from txlog_io.errors import TxlogError
    from txlog_io.indexfile import IndexFileReader, list_index_files

    out = []
    for path in list_index_files(root):
        try:
            with IndexFileReader(path) as r:
                h = r.header
                out.append((str(path), h.begin_phy_offset if h else -1, h.end_phy_offset if h else -1,
                            bool(h and r.index_num and h.index_count >= r.index_num), r.problem,
                            r.hash_slots, r.index_num, h.end_timestamp if h else -1))
        except TxlogError as exc:
            out.append((str(path), -1, -1, False, str(exc), None, None, -1))
    return tuple(out)


def _checkpoint_ts(root: str, field: str) -> int:
    from txlog_io.config import decode_checkpoint
    from txlog_io.errors import TxlogError

    try:
        return int(decode_checkpoint(os.path.join(root, "checkpoint"))[field])
    except TxlogError:
        return 0


#: full-mode scan tasks per core: a few, so one slow task does not leave a core idle at the end
SCAN_TASKS_PER_CORE = 3


def scan_task_bytes(info: Sequence[StoreInfo], split_bytes: int, cores: int) -> int:
    """CommitLog bytes per task of the full-mode scan (txscan ``task_bytes``): one ``split_bytes`` cell at
    least, more when the CommitLog would give more than ``SCAN_TASKS_PER_CORE`` tasks per core.  Each task
    costs ~0.25 s of fixed cost here and streams its cells in 4 MiB chunks (memory does not grow with the
    task): measured on a 2 GiB CommitLog, 2 cores, 128 MiB per task (16 tasks) counted in 6.7-7.2 s, 512 MiB
    (4 tasks) in 3.6-4.4 s -- about the JVM's own binaryRecords scan (3.2 s).  The cells themselves stay
    ``split_bytes`` long (the same rows whatever the grouping; incremental audits resume at a cell)."""
    total = sum(s.commitlog_bytes for s in info)
    per_task = -(-total // max(1, SCAN_TASKS_PER_CORE * max(1, int(cores or 1))))
    return int(max(split_bytes, per_task))


def infos(opts: SourceOptions) -> tuple:
    return tuple(store_info(b, r, opts.commitlog_dirs_of(r)) for b, r in opts.stores)


def commitlog_dirs(info: Sequence[StoreInfo]) -> dict:
    return {s.broker: (os.path.dirname(s.commitlog_files[0][0]) if s.commitlog_files
                       else os.path.join(s.root, "commitlog")) for s in info}


def missing_file_findings(commitlog_dirs: dict, missing: Sequence[tuple]) -> list:
    """(broker, findings batch) per broker: one MISSING_FILE per (broker, offset) no CommitLog file holds."""
    by_broker: dict = {}
    for broker, offset in missing:
        by_broker.setdefault(broker, []).append(Anomaly(
            AnomalyKind.MISSING_FILE, commitlog_dirs.get(broker, ""), int(offset),
            "an index (consume queue / statetable / redolog) points to a CommitLog offset no file holds",
            "a CommitLog file containing this offset", "no such file", "commitlog", int(offset)))
    return [(broker, anomalies_batch(broker, found, "commitlog", commitlog_dirs.get(broker, "")))
            for broker, found in by_broker.items()]


__all__ = ["StoreInfo", "has_transaction_index", "store_info", "infos", "scan_task_bytes", "SCAN_TASKS_PER_CORE",
           "commitlog_dirs", "missing_file_findings"]
