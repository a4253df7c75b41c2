"""The reference broker's mapped-file writers: CommitLog (or DLedger log), consume queues, 3.x
redolog and statetable.

They write bytes only through txlog_io's encoders:

* CommitLog records: ``txlog_io.commitlog.encode_record`` / ``encode_blank``; a record is written only if
  ``size + 8 <= bytes left`` in the file, otherwise the BLANK header is written and the record goes to the
  next file (``CommitLog.doAppend``).  3.1.4 fills the rest of a BLANK-ended file from its reused message
  buffer, so the ``3.x`` profile reproduces that stale-buffer garbage (``Profile.blank_fill == "scratch"``);
  4.x/5.x leave zeros.  In DLedger mode each record is one DLedger entry (``txlog_io.dledger``).
* Consume queues (``txlog_io.consumequeue.encode_cq_units`` / ``encode_pre_blank``).  A queue whose first file
  starts after index 0 gets pre-blank units from the file start (``ConsumeQueue.fillPreBlank``).
* 3.x: the statetable (24-byte units, ``encode_statetable_unit``, state rewritten in place) and the redolog
  (``encode_redolog_unit``, a consume-queue-format queue).

Every mapped file is created at its full configured size (``truncate`` = sparse zero fill), like RocketMQ's
pre-allocated mapped files, and written sequentially through one large buffered handle per open file, so
memory stays bounded however large the store grows.  refbroker.store decides what goes where.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from txlog_io import commitlog as CL
from txlog_io import consumequeue as CQ
from txlog_io import dledger as D
from txlog_io.errors import UsageError
from txlog_io.mappedfile import offset_to_file_name

COMMITLOG_BUFFER = 8 << 20
QUEUE_BUFFER = 64 << 10


class InternalError(RuntimeError):
    """The reference broker broke one of its own invariants (a bug here, never bad input)."""


# ------------------------------------------------------------------------------------------------------------
# mapped-file queues
# ------------------------------------------------------------------------------------------------------------

class MappedQueueWriter:
    """Sequential writer over one mapped-file queue directory (20-digit names, every file its full size)."""

    def __init__(self, directory: Path, file_size: int, buffer_size: int = QUEUE_BUFFER):
        if file_size <= 0:
            raise UsageError(f"mapped file size must be positive, got {file_size}")
        self.directory = Path(directory)
        self.file_size = file_size
        self.buffer_size = buffer_size
        self._fh = None
        self.file_start: Optional[int] = None
        self.pos_in_file = 0

    # -- state -----------------------------------------------------------------------------------------------
    @property
    def is_open(self) -> bool:
        return self._fh is not None

    @property
    def position(self) -> int:
        """Global offset of the next byte to write."""
        if self.file_start is None:
            raise InternalError(f"{self.directory}: no file open")
        return self.file_start + self.pos_in_file

    @property
    def bytes_left(self) -> int:
        return self.file_size - self.pos_in_file

    def path_for(self, file_start: int) -> Path:
        return self.directory / offset_to_file_name(file_start)

    @property
    def current_path(self) -> Path:
        return self.path_for(self.file_start)

    @property
    def current_name(self) -> str:
        """Name of the open file (cached: asked for on every append)."""
        return self._current_name

    # -- opening ---------------------------------------------------------------------------------------------
    def open_at(self, global_offset: int) -> None:
        """Continue writing at ``global_offset`` (creating its file at full size if it does not exist)."""
        self.close()
        file_start = global_offset - global_offset % self.file_size
        path = self.path_for(file_start)
        self.directory.mkdir(parents=True, exist_ok=True)
        if path.exists():
            fh = open(path, "r+b", buffering=self.buffer_size)
        else:
            fh = open(path, "w+b", buffering=self.buffer_size)
            fh.truncate(self.file_size)
        fh.seek(global_offset - file_start)
        self._fh = fh
        self._current_name = path.name
        self.file_start = file_start
        self.pos_in_file = global_offset - file_start

    def next_file(self) -> None:
        self.open_at(self.file_start + self.file_size)

    # -- writing ---------------------------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if len(data) > self.bytes_left:
            raise InternalError(f"{self.current_path}: {len(data)} bytes do not fit in {self.bytes_left}")
        self._fh.write(data)
        self.pos_in_file += len(data)

    def write_at(self, global_offset: int, data: bytes) -> None:
        """Overwrite bytes anywhere in the queue (3.x statetable state updates)."""
        file_start = global_offset - global_offset % self.file_size
        if file_start == self.file_start and self._fh is not None:
            self._fh.flush()
            os.pwrite(self._fh.fileno(), data, global_offset - file_start)
            return
        with open(self.path_for(file_start), "r+b") as fh:
            fh.seek(global_offset - file_start)
            fh.write(data)

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def files(self) -> list:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.is_file())


class CommitLogWriter:
    """CommitLog appends with the BLANK end-of-file rule, torn writes and the 3.1.4 stale-buffer filler."""

    def __init__(self, directory: Path, file_size: int, blank_fill: str = "zero"):
        self.queue = MappedQueueWriter(directory, file_size, min(COMMITLOG_BUFFER, file_size))
        self.blank_fill = blank_fill
        # 3.1.4 CommitLog.msgStoreItemMemory: one buffer reused for every record, never cleared.
        self._scratch = bytearray() if blank_fill == "scratch" else None
        self.blank_count = 0

    @property
    def file_size(self) -> int:
        return self.queue.file_size

    def start(self, offset: int = 0) -> None:
        self.queue.open_at(offset)

    @property
    def max_offset(self) -> int:
        return self.queue.position

    def append(self, msg: CL.Message, torn_keep: Optional[int] = None) -> tuple:
        """Write ``msg`` at the end; returns (physical_offset, size, file_name, file_position).

        ``torn_keep``: write only the first bytes of the record (a torn tail after a power loss); the write
        position stays at the start of the torn record, so the next write after recovery overwrites it.
        """
        q = self.queue
        offset = q.position
        data = CL.encode_record(msg, offset)
        size = len(data)
        if size + CL.END_FILE_MIN_BLANK_LENGTH > q.file_size:
            raise UsageError(f"a {size}-byte record cannot fit in a {q.file_size}-byte CommitLog file")
        if size + CL.END_FILE_MIN_BLANK_LENGTH > q.bytes_left:
            self._write_blank()
            offset = q.position
            data = CL.encode_record(msg, offset)
        file_name, file_pos = q.current_name, q.pos_in_file
        if torn_keep is not None:
            q.write(data[:torn_keep])
            q.flush()
            q.open_at(offset)            # recovery truncates here; the torn bytes stay until overwritten
            return offset, size, file_name, file_pos
        q.write(data)
        if self._scratch is not None:
            self._remember(data)
        return offset, size, file_name, file_pos

    def _remember(self, data: bytes) -> None:
        if len(self._scratch) < len(data):
            self._scratch.extend(bytes(len(data) - len(self._scratch)))
        self._scratch[:len(data)] = data

    def _write_blank(self) -> None:
        q = self.queue
        left = q.bytes_left
        header = CL.encode_blank(left)
        if self._scratch is not None:
            self._remember(header)
            filler = bytes(self._scratch[len(header):left])
            q.write(header + filler)
        else:
            q.write(header)
        self.blank_count += 1
        q.next_file()

    def flush(self) -> None:
        self.queue.flush()

    def close(self) -> None:
        self.queue.close()


class DLedgerLogWriter:
    """DLedgerCommitLog + DLedgerMmapFileStore (dledger 0.3.1.2) in place of the CommitLog: each record is one
    DLedger entry (``txlog_io.dledger.encode_entry``) whose PHYSICALOFFSET is ``pos + 48``; a file is closed
    with the end marker ``[-1][bytes left]`` when ``entry + 8`` does not fit (MmapFileList.append); every
    entry gets its index unit; flush/close persist ``checkpoint`` and ``currterm`` (+ .bak) as DLedger does.
    Same interface as :class:`CommitLogWriter` (offsets and sizes are the message's, as RocketMQ reports
    them)."""

    def __init__(self, dledger_dir: Path, file_size: int, index_file_size: int, self_id: str):
        if index_file_size % D.INDEX_UNIT_SIZE:
            raise UsageError(f"a DLedger index file holds whole {D.INDEX_UNIT_SIZE}-byte units: "
                             f"{index_file_size} bytes is not a multiple")
        self.dir = Path(dledger_dir)
        self.queue = MappedQueueWriter(self.dir / "data", file_size, min(COMMITLOG_BUFFER, file_size))
        self.index = MappedQueueWriter(self.dir / "index", index_file_size, QUEUE_BUFFER)
        self.self_id = self_id
        self.term = 0                    # a single node re-elects itself in the term it persisted
        self.next_index = 0
        self.blank_count = 0

    @property
    def file_size(self) -> int:
        return self.queue.file_size

    def start(self, offset: int = 0) -> None:
        self.queue.open_at(offset)
        if not self.index.is_open:
            self.index.open_at(self.next_index * D.INDEX_UNIT_SIZE)

    @property
    def max_offset(self) -> int:
        return self.queue.position

    def append(self, msg: CL.Message, torn_keep: Optional[int] = None) -> tuple:
        """Write ``msg`` as the next entry; returns (physical offset of the message, record size, file name,
        file position of the message).  ``torn_keep``: only the entry header and the first bytes of the record
        reach the file (a torn tail); the next append overwrites it."""
        q = self.queue
        pos = q.position
        data = CL.encode_record(msg, pos + D.ENTRY_HEADER_SIZE)
        entry_size = D.ENTRY_HEADER_SIZE + len(data)
        if entry_size + D.END_MARKER.size > q.file_size:
            raise UsageError(f"a {entry_size}-byte entry cannot fit in a {q.file_size}-byte DLedger data "
                             f"file")
        if entry_size + D.END_MARKER.size > q.bytes_left:
            q.write(D.encode_end_marker(q.bytes_left))
            self.blank_count += 1
            q.next_file()
            pos = q.position
            data = CL.encode_record(msg, pos + D.ENTRY_HEADER_SIZE)
        entry = D.encode_entry(data, index=self.next_index, term=self.term, pos=pos)
        file_name, file_pos = q.current_name, q.pos_in_file + D.ENTRY_HEADER_SIZE
        unit = D.encode_index_unit(pos=pos, size=entry_size, index=self.next_index, term=self.term)
        at = self.next_index * D.INDEX_UNIT_SIZE
        if at - at % self.index.file_size != self.index.file_start:
            self.index.open_at(at)      # the next index file, created at its full size (MmapFileList)
        self.index.write_at(at, unit)
        if torn_keep is not None:
            q.write(entry[:D.ENTRY_HEADER_SIZE + torn_keep])
            q.flush()
            q.open_at(pos)
            return pos + D.ENTRY_HEADER_SIZE, len(data), file_name, file_pos
        q.write(entry)
        self.next_index += 1
        return pos + D.ENTRY_HEADER_SIZE, len(data), file_name, file_pos

    def _persist_state(self) -> None:
        end = self.next_index - 1
        for name, text in (("checkpoint", D.encode_checkpoint(end, end)),
                           ("currterm", D.encode_currterm(self.self_id, self.term))):
            (self.dir / name).write_bytes(text)
            (self.dir / (name + ".bak")).write_bytes(text)

    def flush(self) -> None:
        self.queue.flush()
        self.index.flush()
        if self.dir.is_dir():
            self._persist_state()

    def close(self) -> None:
        self.flush()
        self.queue.close()
        self.index.close()


class UnitQueueWriter:
    """A consume-queue-format queue (20-byte units; also the 3.x redolog) written unit by unit."""

    UNIT = CQ.CQ_UNIT_SIZE

    def __init__(self, directory: Path, file_size: int):
        if file_size % self.UNIT:
            raise UsageError(f"consume queue file size {file_size} is not a multiple of {self.UNIT}")
        self.queue = MappedQueueWriter(directory, file_size)
        self.next_index: Optional[int] = None   # None: no file of this queue exists yet
        self.min_index = 0
        self.pre_blank_units = 0
        self.pre_blank_file: Optional[str] = None

    def put(self, index: int, unit: bytes) -> tuple:
        """Write ``unit`` as queue offset ``index``; returns (file_name, file_position)."""
        q = self.queue
        if self.next_index is None:
            q.open_at(index * self.UNIT - (index * self.UNIT) % q.file_size)
            self.min_index = index
            while q.position < index * self.UNIT:          # ConsumeQueue.fillPreBlank
                q.write(CQ.encode_pre_blank())
                self.pre_blank_units += 1
                self.pre_blank_file = q.current_path.name
            self.next_index = index
        elif index != self.next_index:
            raise InternalError(f"{q.directory}: unit {index} written after {self.next_index - 1}")
        if not q.is_open:
            q.open_at(index * self.UNIT)
        elif q.bytes_left == 0:
            q.next_file()
        where = (q.current_name, q.pos_in_file)
        q.write(unit)
        self.next_index = index + 1
        return where

    @property
    def max_index(self) -> int:
        """Next queue offset (= ConsumeQueue.getMaxOffsetInQueue)."""
        return self.next_index or 0

    def forget_files(self) -> None:
        """The queue's files were deleted under the running broker: the next unit starts a fresh file."""
        self.queue.close()
        self.next_index = None

    def flush(self) -> None:
        self.queue.flush()

    def close(self) -> None:
        self.queue.close()


class ConsumeQueueWriter(UnitQueueWriter):
    """A consume queue whose units are collected and written in batches with ``encode_cq_units``.

    The batch is only Python-side buffering of what the broker has already dispatched (in RocketMQ the unit is
    in
    the mapped page at once), so every flush/close/crash writes it out; the queue's max offset counts it."""

    BATCH = 2048

    def __init__(self, directory: Path, file_size: int):
        super().__init__(directory, file_size)
        self._offsets: list = []
        self._sizes: list = []
        self._tags: list = []
        self._first_pending: Optional[int] = None

    def append(self, index: int, commitlog_offset: int, size: int, tags_code: int) -> None:
        if self.next_index is not None and index < self.next_index:
            return                                      # already built (recovery re-dispatch skips it)
        if self.next_index is not None and index != self.next_index:
            raise InternalError(f"{self.queue.directory}: unit {index} written after {self.next_index - 1}")
        if self._first_pending is None:
            self._first_pending = index
        self._offsets.append(commitlog_offset)
        self._sizes.append(size)
        self._tags.append(tags_code)
        self.next_index = index + 1
        if len(self._offsets) >= self.BATCH:
            self.write_pending()

    def write_pending(self) -> None:
        if self._first_pending is None:
            return
        index = self._first_pending
        offsets, sizes, tags = self._offsets, self._sizes, self._tags
        self._offsets, self._sizes, self._tags, self._first_pending = [], [], [], None
        q = self.queue
        if not q.is_open or (q.file_start is not None and q.position != index * self.UNIT):
            self._open_for(index)
        done = 0
        while done < len(offsets):
            if q.bytes_left == 0:
                q.next_file()
            take = min(len(offsets) - done, q.bytes_left // self.UNIT)
            q.write(
                CQ.encode_cq_units(
                    {
                        "commitlog_offset": offsets[done : done + take],
                        "size": sizes[done : done + take],
                        "tags_code": tags[done : done + take],
                    }
                )
            )
            done += take

    def _open_for(self, index: int) -> None:
        """Open the file holding unit ``index``; a queue's first file gets pre-blank units up to it."""
        q = self.queue
        target = index * self.UNIT
        file_start = target - target % q.file_size
        first_file = not q.directory.is_dir() or not any(q.directory.iterdir())
        if first_file:
            self.min_index = index
        if first_file and target > file_start:
            q.open_at(file_start)
            while q.position < target:                  # ConsumeQueue.fillPreBlank
                q.write(CQ.encode_pre_blank())
                self.pre_blank_units += 1
            self.pre_blank_file = q.current_name
        else:
            q.open_at(target)

    def forget_files(self) -> None:
        self.write_pending()
        super().forget_files()

    def flush(self) -> None:
        self.write_pending()
        super().flush()

    def close(self) -> None:
        self.write_pending()
        super().close()


class StateTableWriter:
    """3.x transaction/statetable: 24-byte units, appended on PREPARED dispatch, state rewritten in place."""

    UNIT = CQ.STATETABLE_UNIT_SIZE

    def __init__(self, directory: Path, file_size: int):
        if file_size % self.UNIT:
            raise UsageError(f"statetable file size {file_size} is not a multiple of {self.UNIT}")
        self.directory = Path(directory)
        self.file_size = file_size
        self.queue = MappedQueueWriter(directory, file_size)
        self.units: list = []       # [commitlog_offset, size, timestamp_s, group_hash, state] per index

    @property
    def units_per_file(self) -> int:
        return self.file_size // self.UNIT

    def append(self, commitlog_offset: int, size: int, timestamp_s: int, group_hash: int) -> int:
        q = self.queue
        index = len(self.units)
        if not q.is_open:
            q.open_at(index * self.UNIT)
        elif q.bytes_left == 0:
            q.next_file()
        q.write(CQ.encode_statetable_unit(commitlog_offset, size, timestamp_s, group_hash, CQ.STATE_PREPARED))
        self.units.append([commitlog_offset, size, timestamp_s, group_hash, CQ.STATE_PREPARED])
        return index

    def update_state(self, index: int, commitlog_offset: int, group_hash: int, state: int) -> bool:
        """TransactionStateService.updateTransactionState: only a PREPARED unit with matching offset and
        group."""
        if not 0 <= index < len(self.units):
            return False
        unit = self.units[index]
        if unit[0] != commitlog_offset or unit[3] != group_hash or unit[4] != CQ.STATE_PREPARED:
            return False
        unit[4] = state
        self.queue.write_at(index * self.UNIT, CQ.encode_statetable_unit(*unit))
        return True

    def delete_all(self) -> None:
        self.queue.close()
        if self.directory.is_dir():
            shutil.rmtree(self.directory)
        self.units = []

    def flush(self) -> None:
        self.queue.flush()

    def close(self) -> None:
        self.queue.close()


__all__ = [
    "CommitLogWriter",
    "DLedgerLogWriter",
    "UnitQueueWriter",
    "ConsumeQueueWriter",
    "StateTableWriter",
    "MappedQueueWriter",
    "InternalError",
]
