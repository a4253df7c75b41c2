"""The reference broker's message store: CommitLog, consume queues, 3.x statetable/redolog, config,
checkpoint.

This is the file-writing half of the reference broker (the transaction semantics live in refbroker.broker and
its mixin modules).  It plays the part of RocketMQ's ``DefaultMessageStore`` + ``CommitLog`` +
``ConsumeQueue`` + (3.x) ``TransactionStateService``; the files are written by the writers of
refbroker.mappedfiles, through txlog_io's encoders:

* CommitLog records: one ``CommitLogWriter`` (or ``DLedgerLogWriter`` in DLedger mode).
* QUEUEOFFSET per transaction type (``doAppend``): NOT/COMMIT take the next offset of (topic, queueId) and get
  a consume-queue entry; PREPARED takes 0 (4.x) or the statetable counter (3.x); ROLLBACK takes 0 (4.x) or the
  statetable index carried by the EndTransaction request (3.x).  Neither gets a consume-queue entry.
* Consume queues: written by a dispatcher that can be held back (consume-queue dispatch lagging the CommitLog
  at a crash).
* 3.x: the statetable (a unit appended on PREPARED dispatch, its state rewritten in place on COMMIT/ROLLBACK
  dispatch) and the redolog (a consume queue named TRANSACTION_REDOLOG_TOPIC_XXXX/0).
* ``config/*.json`` through ``txlog_io.config.write_fastjson`` + ``write_config_file`` (keeps ``.bak``), the
  checkpoint through ``encode_checkpoint``, the ``abort`` marker and (4.x/5.x) the ``lock`` file.

A crash is modelled by what reaches the files: everything the broker process wrote (page cache survives a
process crash) except a held-back dispatch backlog and, for a torn tail (power loss), the unwritten end of the
last record.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from refbroker.index import IndexService
from refbroker.mappedfiles import (
    CommitLogWriter,
    ConsumeQueueWriter,
    DLedgerLogWriter,
    StateTableWriter,
    UnitQueueWriter,
)
from refbroker.profiles import Profile
from txlog_io import commitlog as CL
from txlog_io import consumequeue as CQ
from txlog_io.mappedfile import REDOLOG_TOPIC
from txlog_io.properties import java_string_hash
from txlog_io.properties import tags_code as tags_hash_code

MAX_OPEN_QUEUES = 128
_TRANSACTION_MASK, _TX_NOT, _TX_PREPARED, _TX_COMMIT = CL.TRANSACTION_MASK, CL.TX_NOT, CL.TX_PREPARED, CL.TX_COMMIT
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_TAGS_CODES: dict = {}          # TAGS -> tagsCode (String.hashCode), a small cache


# ------------------------------------------------------------------------------------------------------------
# the store
# ------------------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class PutResult:
    physical_offset: int
    size: int
    queue_offset: int          # the QUEUEOFFSET field written
    file: str                  # CommitLog file name
    file_position: int
    store_timestamp: int
    torn: bool = False


@dataclass(slots=True)
class DispatchRequest:
    topic: str
    queue_id: int
    physical_offset: int
    size: int
    tags_code: int
    store_timestamp: int
    queue_offset: int
    sys_flag: int
    tran_state_table_offset: int      # 3.x: request's statetable index for COMMIT/ROLLBACK
    prepared_transaction_offset: int
    producer_group: Optional[str]     # None during recovery re-dispatch
    uniq_key: Optional[str] = None    # UNIQ_KEY / KEYS properties: the IndexFile keys
    keys: Optional[str] = None


class MessageStore:
    """DefaultMessageStore for the reference broker (see module docstring)."""

    def __init__(self, root, profile: Profile, *, commitlog_file_size: Optional[int] = None,
                 consumequeue_file_size: Optional[int] = None, statetable_file_size: Optional[int] = None,
                 redolog_file_size: Optional[int] = None):
        self.root = Path(root)
        self.profile = profile
        self.commitlog_file_size = commitlog_file_size or profile.mappedFileSizeCommitLog
        self.cq_file_size = consumequeue_file_size or profile.mappedFileSizeConsumeQueue
        self.statetable_file_size = statetable_file_size or profile.tranStateTableMapedFileSize
        self.redolog_file_size = redolog_file_size or profile.tranRedoLogMapedFileSize
        if profile.dledger_self_id:
            self.commitlog = DLedgerLogWriter(self.root / f"dledger-{profile.dledger_self_id}",
                                              self.commitlog_file_size, profile.dledger_index_file_size,
                                              profile.dledger_self_id)
        else:
            self.commitlog = CommitLogWriter(
                self.root / "commitlog", self.commitlog_file_size, profile.blank_fill
            )
        self.queues: "OrderedDict[tuple, ConsumeQueueWriter]" = OrderedDict()
        self.queue_next: dict = {}            # CommitLog.topicQueueTable: (topic, qid) -> next offset
        self.tran_state_table_offset = 0      # 3.x TransactionStateService.tranStateTableOffset
        self.statetable: Optional[StateTableWriter] = None
        self.redolog: Optional[UnitQueueWriter] = None
        if profile.transaction_model == "STATETABLE":
            self.statetable = StateTableWriter(
                self.root / "transaction" / "statetable", self.statetable_file_size
            )
            self.redolog = UnitQueueWriter(self.root / "transaction" / "redolog" / REDOLOG_TOPIC / "0",
                                           self.redolog_file_size)
        self.redolog_units: list = []          # 3.x: (commitlog_offset, size, tags_code) per redolog index
        # IndexService (4.x+ key form; 3.1.4 stores raw hashes, which this writer does not reproduce)
        self.index: Optional[IndexService] = (
            IndexService(self.root / "index") if profile.transaction_model != "STATETABLE" else None)
        self.dispatch_backlog: deque = deque()
        self.hold_dispatch = False
        self.last_store_timestamp = 0          # of the newest CommitLog record
        self.last_dispatched_timestamp = 0     # of the newest record with a CQ entry (checkpoint logics time)
        self.records_written = 0
        self.bytes_written = 0
        self.statetable_listener: Optional[Callable] = None  # broker hook: a new statetable file (its number)
        self.running = False
        self._last_put: Optional[tuple] = None  # the newest whole record (``last_put``)
        self._written: dict = {}  # config/checkpoint content last written (skip identical rewrites)

    # -- lifecycle -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config").mkdir(exist_ok=True)
        if not self.commitlog.queue.is_open:
            self.commitlog.start(
                self.commitlog.max_offset if self.commitlog.queue.file_start is not None else 0
            )
        (self.root / "abort").touch()          # DefaultMessageStore.createTempFile
        if self.profile.writes_lock_file:
            with open(self.root / "lock", "wb") as f:
                f.write(b"lock")
        self.running = True

    def flush(self) -> None:
        self.commitlog.flush()
        for q in self.queues.values():
            q.flush()
        if self.index is not None:
            self.index.flush()
        if self.statetable is not None:
            self.statetable.flush()
            self.redolog.flush()

    def shutdown(self) -> None:
        """Clean shutdown: dispatch everything, flush, close, remove the abort marker."""
        self.dispatch_all()
        self.flush()
        self.close_files()
        abort = self.root / "abort"
        if abort.exists():
            abort.unlink()
        self.running = False

    def crash(self) -> list:
        """Process crash: the dispatch backlog is lost (returned), everything already written stays."""
        lost = list(self.dispatch_backlog)
        self.dispatch_backlog.clear()
        self.hold_dispatch = False
        self.flush()
        self.close_files()
        self.running = False
        return lost

    def close_files(self) -> None:
        self.commitlog.close()
        for q in self.queues.values():
            q.close()
        if self.statetable is not None:
            self.statetable.close()
            self.redolog.close()

    def reopen(self) -> None:
        """After a crash or shutdown: continue appending where the CommitLog ends."""
        self.commitlog.queue.open_at(self.commitlog.queue.position)
        (self.root / "abort").touch()
        self.running = True

    # -- queue offsets (CommitLog.topicQueueTable)
    # ------------------------------------------------------------
    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        return self.queue_next.get((topic, queue_id), 0)

    def max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        """ConsumeQueue max offset as a reader sees it (dispatched units only)."""
        q = self.queues.get((topic, queue_id))
        return q.max_index if q is not None else 0

    def min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        q = self.queues.get((topic, queue_id))
        return q.min_index if q is not None and q.next_index is not None else 0

    # -- put
    # ----------------------------------------------------------------------------------------------------
    def put(self, msg: CL.Message, *, tran_state_table_offset: int = 0, producer_group: Optional[str] = None,
            torn_keep: Optional[int] = None, cq_tags_code: Optional[int] = None) -> PutResult:
        """CommitLog.putMessage + doAppend: assign QUEUEOFFSET by transaction type, append, dispatch."""
        sys_flag = msg.sys_flag
        tx_type = sys_flag & _TRANSACTION_MASK
        queued = tx_type == _TX_NOT or tx_type == _TX_COMMIT          # gets a consume-queue unit
        topic = msg.topic
        key = (topic, msg.queue_id)
        if queued:
            queue_offset = self.queue_next.get(key, 0)
        elif tx_type == _TX_PREPARED:
            queue_offset = self.tran_state_table_offset if self.statetable is not None else 0
        else:   # ROLLBACK: 3.x keeps the request's statetable index, 4.x writes 0
            queue_offset = tran_state_table_offset if self.statetable is not None else 0
        msg.queue_offset = queue_offset
        offset, size, file_name, file_pos = self.commitlog.append(msg, torn_keep)
        store_timestamp = msg.store_timestamp
        if torn_keep is not None:
            return PutResult(offset, size, queue_offset, file_name, file_pos, store_timestamp, True)
        if queued:
            self.queue_next[key] = queue_offset + 1
        elif tx_type == _TX_PREPARED and self.statetable is not None:
            self.tran_state_table_offset += 1
        self.records_written += 1
        self.bytes_written += size
        self._last_put = (offset, size, file_name, file_pos, topic)
        self.last_store_timestamp = store_timestamp
        props = msg.properties
        if cq_tags_code is None:
            tags = props.get("TAGS") if props else None
            cq_tags_code = _TAGS_CODES.get(tags)
            if cq_tags_code is None:
                cq_tags_code = tags_hash_code(tags)
                if len(_TAGS_CODES) < 4096:
                    _TAGS_CODES[tags] = cq_tags_code
        if not props:
            props = {}
        req = DispatchRequest(
            topic, msg.queue_id, offset, size, cq_tags_code, store_timestamp, queue_offset, sys_flag,
            tran_state_table_offset, msg.prepared_transaction_offset, producer_group, props.get("UNIQ_KEY"),
            props.get("KEYS"))
        if self.hold_dispatch:
            self.dispatch_backlog.append(req)
        elif self.dispatch_backlog:           # what was held back goes first
            self.dispatch_backlog.append(req)
            self.dispatch_all()
        else:
            self._dispatch(req)
        return PutResult(offset, size, queue_offset, file_name, file_pos, store_timestamp)

    @property
    def last_put(self) -> Optional[dict]:
        """The newest whole record (the truncation fault's target): CommitLog offset, size, file, position."""
        if self._last_put is None:
            return None
        offset, size, file_name, file_pos, topic = self._last_put
        return {"commitlog_offset": offset, "size": size, "file": file_name, "file_position": file_pos,
                "record": topic}

    # -- dispatch (ReputMessageService / DispatchMessageService)
    # -----------------------------------------------
    def dispatch_all(self) -> None:
        backlog = self.dispatch_backlog
        while backlog:
            self._dispatch(backlog.popleft())

    def _dispatch(self, req: DispatchRequest) -> None:
        tx_type = req.sys_flag & _TRANSACTION_MASK
        if self.index is not None:
            self.index.build(req.topic, req.uniq_key, req.keys, req.sys_flag, req.physical_offset,
                             req.store_timestamp)
        if tx_type == _TX_NOT or tx_type == _TX_COMMIT:
            self._queue(req.topic, req.queue_id).append(req.queue_offset, req.physical_offset, req.size,
                                                        req.tags_code)
            self.last_dispatched_timestamp = req.store_timestamp
        if self.statetable is None:
            return
        if tx_type == CL.TX_PREPARED:
            index = self.statetable.append(req.physical_offset, req.size, req.store_timestamp // 1000,
                                           java_string_hash(req.producer_group or ""))
            if index % self.statetable.units_per_file == 0 and self.statetable_listener is not None:
                self.statetable_listener(index // self.statetable.units_per_file)
            self._redolog_put(req.physical_offset, req.size, CQ.REDOLOG_PREPARED_TAGS_CODE)
        elif tx_type in (CL.TX_COMMIT, CL.TX_ROLLBACK):
            if req.producer_group is not None:
                self.statetable.update_state(req.tran_state_table_offset, req.prepared_transaction_offset,
                                             java_string_hash(req.producer_group), tx_type)
            self._redolog_put(req.physical_offset, req.size, req.prepared_transaction_offset)

    def _redolog_put(self, offset: int, size: int, tags_code: int) -> None:
        index = self.redolog.max_index
        self.redolog.put(index, CQ.encode_redolog_unit(offset, size, tags_code))
        self.redolog_units.append((offset, size, tags_code))

    def _queue(self, topic: str, queue_id: int) -> "ConsumeQueueWriter":
        key = (topic, queue_id)
        q = self.queues.get(key)
        if q is None:
            q = ConsumeQueueWriter(self.root / "consumequeue" / topic / str(queue_id), self.cq_file_size)
            self.queues[key] = q
            if len(self.queues) > MAX_OPEN_QUEUES:      # bound open handles: close the least recently used
                for other_key, other in self.queues.items():
                    if other_key != key and other.queue.is_open:
                        other.close()
                        break
        elif len(self.queues) > MAX_OPEN_QUEUES:
            self.queues.move_to_end(key)
        return q

    def queue_writer(self, topic: str, queue_id: int) -> Optional["ConsumeQueueWriter"]:
        return self.queues.get((topic, queue_id))

    # -- checkpoint / abort
    # -------------------------------------------------------------------------------------
    def write_checkpoint(self) -> None:
        from txlog_io.config import encode_checkpoint

        physic = self.last_store_timestamp
        logics = self.last_dispatched_timestamp
        extra = {}
        if self.profile.checkpoint_size >= 32:
            extra["master_flushed_offset"] = 0      # 0 without HA (observed in the 5.3.3 fixture)
        if self.profile.checkpoint_size >= 40:
            extra["confirm_phy_offset"] = 0
        index_ts = self.index.last_index_timestamp if self.index is not None else 0
        page = encode_checkpoint(physic, logics, index_ts, **extra)
        path = self.root / "checkpoint"
        if page == self._written.get("checkpoint") and path.exists():
            return
        mode = "r+b" if path.exists() else "wb"
        with open(path, mode) as f:
            f.write(page)
        self._written["checkpoint"] = page

    def write_config(self, name: str, obj, *, force: bool = False) -> None:
        """Persist a config file the way ConfigManager.persist does (previous content kept as .bak).  A file
        whose content would not change is not rewritten (only its .bak copy would differ in mtime)."""
        from txlog_io.config import write_config_file, write_fastjson

        text = write_fastjson(obj)
        path = self.root / "config" / name
        if not force and self._written.get(name) == text and path.exists():
            return
        write_config_file(path, text)
        self._written[name] = text


__all__ = [
    "MessageStore",
    "PutResult",
    "DispatchRequest",
    "SCHEDULE_TOPIC",
]
