"""RocketMQ IndexFile entries (``store/index/*``; layout in txlog_io.indexfile)."""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

INDEX_ENTRIES = Table.of("index_entries", [
    C("file", pa.string(), False, "index file path"),
    C("file_position", pa.int64(), False, "byte position of the 20-byte entry in its file"),
    C("entry_index", pa.int32(), False, "entry number (1 .. indexCount-1; entry 0 is never written)"),
    C("key_hash", pa.int32(), False, "abs(String.hashCode(topic + '#' + key))"),
    C("commitlog_offset", pa.int64(), False, "CommitLog offset of the indexed record"),
    C("store_timestamp", pa.int64(), False, "header beginTimestamp + timeDiff seconds (second precision), ms"),
    C("prev_index", pa.int32(), False, "older entry of the same hash slot (0 = end of chain)"),
    C("valid", pa.bool_(), False, "false when a field is impossible (reported as BAD_INDEX_ENTRY)"),
], "IndexFile entries: where topic#UNIQ_KEY and topic#KEYS were written in the CommitLog")
