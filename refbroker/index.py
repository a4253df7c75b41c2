"""The reference broker's IndexService: ``index/<yyyyMMddHHmmssSSS>`` files built at dispatch, as RocketMQ does.

Follows store/src/main/java/org/apache/rocketmq/store/index/IndexService.java (buildIndex, putKey's retry on a
full file, retryGetAndCreateIndexFile: a new file starts its header from the previous file's end offset and
time) through :class:`txlog_io.indexfile.IndexFileWriter`, which writes each entry as IndexFile.putKey does
(byte-identical to the real 4.9.8 broker's files, tested).

A file lives in memory while it is being filled and is written whole when it is full and at every flush, so a
crash loses exactly the entries of records whose dispatch was lost (like the consume queues).
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Optional

from txlog_io.indexfile import IndexFileWriter, index_keys

#: small files for reference stores (RocketMQ's defaults, 5,000,000 slots x 20,000,000 entries, make
#: 420 MB files); the geometry is not stored in the file, readers derive it from the bytes
DEFAULT_HASH_SLOTS = 16384
DEFAULT_INDEX_NUM = 65536
_TX_NAMES = {0: "NOT", 4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}


def index_file_name(timestamp_ms: int) -> str:
    """UtilAll.timeMillisToHumanString: yyyyMMddHHmmssSSS (the reference broker's clock is UTC)."""
    t = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.timezone.utc)
    return t.strftime("%Y%m%d%H%M%S") + f"{timestamp_ms % 1000:03d}"


class IndexService:
    def __init__(self, directory: Path, hash_slots: Optional[int] = None, index_num: Optional[int] = None):
        self.directory = Path(directory)
        self.hash_slots = hash_slots or DEFAULT_HASH_SLOTS
        self.index_num = index_num or DEFAULT_INDEX_NUM
        self.current: Optional[IndexFileWriter] = None
        self.current_path: Optional[Path] = None
        # checkpoint indexMsgTimestamp: IndexService.flush records the end time of a file flushed when full
        self.last_index_timestamp = 0

    def build(self, topic: str, uniq_key: Optional[str], keys: Optional[str], sys_flag: int,
              physical_offset: int, store_timestamp: int) -> None:
        if self.current is not None and physical_offset < self.current.end_phy:
            return                                           # already indexed (re-dispatch after recovery)
        for key in index_keys(topic, uniq_key, keys, _TX_NAMES[sys_flag & 0xC]):
            if self.current is None or not self.current.put_key(key, physical_offset, store_timestamp):
                self._roll(store_timestamp)
                self.current.put_key(key, physical_offset, store_timestamp)

    def _roll(self, now_ms: int) -> None:
        prev = self.current
        if prev is not None:
            self.flush()
            if prev.full:
                self.last_index_timestamp = prev.end_ts
        self.current = IndexFileWriter(self.hash_slots, self.index_num,
                                       prev.end_phy if prev else 0, prev.end_ts if prev else 0)
        name = index_file_name(now_ms)
        while (self.directory / name).exists():              # two files in one millisecond: next name
            now_ms += 1
            name = index_file_name(now_ms)
        self.current_path = self.directory / name

    def flush(self) -> None:
        if self.current is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        with open(self.current_path, "wb") as f:
            f.write(self.current.to_bytes())

    def delete_files_below(self, min_offset: int) -> None:
        """deleteExpiredFile: index files whose entries all lie below the CommitLog's first offset."""
        from txlog_io.indexfile import read_index_header

        if not self.directory.is_dir():
            return
        for p in sorted(self.directory.iterdir()):
            if p == self.current_path:
                continue
            h = read_index_header(p)
            if h is not None and h.end_phy_offset < min_offset:
                p.unlink()
