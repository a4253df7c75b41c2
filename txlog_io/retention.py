"""Whether the CommitLog files missing before the first present one were deleted by retention or lost.

RocketMQ deletes CommitLog files only from the head (``CleanCommitLogService``: ``deleteExpiredFileByTime``,
by age or under disk pressure), and cleans the derived files in the same pass: 4.x
``DefaultMessageStore.cleanFilesPeriodically`` runs ``CleanConsumeQueueService`` right after
``CleanCommitLogService``; 5.x runs it from ``cleanQueueFilesPeriodically`` at the same
``cleanResourceInterval`` (10 s).  ``CleanConsumeQueueService.deleteExpiredFiles`` then calls, for every
consume queue, ``MappedFileQueue.deleteExpiredFileByOffset(minOffset, 20)`` -- each file but the last whose
last unit (at ``mappedFileSize - 20``) points below the CommitLog's new minimum offset is deleted, oldest
first, stopping at the first that does not -- and ``IndexService.deleteExpiredFile(minOffset)`` -- each
IndexFile but the newest whose header's ``endPhyOffset`` is below it.

So a store whose CommitLog starts past offset 0 (files before it are gone) and that still holds such a
consume-queue or IndexFile was not cleaned by retention: the head was lost (a deleted or missing file, a
restore that left it out), unless the broker stopped within one clean-up interval of the deletion.
:func:`head_findings` reports that as ``COMMITLOG_HEAD_MISSING`` with the CommitLog range the stale files
point to.  A store without such a file reads as retention: nothing there says otherwise (with RocketMQ's
default 300,000-unit consume-queue files a queue rarely has a whole non-last file inside one deleted
CommitLog file, so the check proves damage when it fires and proves nothing when it does not).
"""
from __future__ import annotations

import struct
from typing import List, Optional

from txlog_io import readstats
from txlog_io.errors import Anomaly, AnomalyKind
from txlog_io.indexfile import read_index_header
from txlog_io.positional import input_pread, open_input

CQ_UNIT = 20
_UNIT = struct.Struct(">qiq")   # ConsumeQueue unit: CommitLog offset, size, tags code


def _unit_offset(path, position: int) -> Optional[int]:
    """The CommitLog offset of the consume-queue unit at ``position``; None for an all-zero or unreadable
    unit, or one with impossible values (it proves nothing)."""
    with open_input(path) as f:
        raw = input_pread(f, CQ_UNIT, position)
    readstats.add(len(raw), "consumequeue")
    if len(raw) != CQ_UNIT or not any(raw):
        return None
    offset, size, _ = _UNIT.unpack(raw)
    return offset if offset >= 0 and size > 0 else None


def head_findings(layout) -> List[Anomaly]:
    """``COMMITLOG_HEAD_MISSING`` (at most one) for a discovered store (``txlog_io.mappedfile.StoreLayout``)."""
    if not layout.commitlog or layout.commitlog[0].base_offset <= 0:
        return []
    first = layout.commitlog[0].base_offset
    stale = []                      # (path, lowest CommitLog offset it names, highest)
    for files in layout.consume_queues.values():
        for mf in files[:-1]:       # MappedFileQueue never deletes a queue's last file
            if mf.size < CQ_UNIT:
                break
            last = _unit_offset(mf.path, mf.size - mf.size % CQ_UNIT - CQ_UNIT)
            if last is None or last >= first:
                break
            lowest = _unit_offset(mf.path, 0)
            stale.append((mf.path, last if lowest is None else min(lowest, last), last))
    for path in list(layout.index_files)[:-1]:
        header = read_index_header(path)
        if header is None or header.end_phy_offset >= first or header.end_phy_offset <= 0:
            break
        stale.append((path, max(0, min(header.begin_phy_offset, header.end_phy_offset)), header.end_phy_offset))
    if not stale:
        return []
    start = max(0, min(s[1] for s in stale))
    size = layout.commitlog_file_size
    if size:                        # the files are named fileSize * n: the lost ones start at such a name
        start -= start % size
    example = min(stale, key=lambda s: s[1])
    return [Anomaly(
        AnomalyKind.COMMITLOG_HEAD_MISSING, str(layout.commitlog[0].path), 0,
        f"the CommitLog starts at offset {first}, but {len(stale)} consume-queue / index file(s) that RocketMQ's "
        f"retention deletes in the same clean-up as the CommitLog files before it are still here (e.g. "
        f"{example[0]} names CommitLog offsets up to {example[2]}): the CommitLog from {start} was lost, not "
        "deleted by retention",
        "no consume-queue or index file (but a queue's last) wholly below the first CommitLog offset",
        f"{len(stale)} such file(s)", "commitlog", start, first - start)]


__all__ = ["head_findings"]
