"""CommitLog record layout constants and numpy dtypes (the record layout itself is drawn in txlog_io/commitlog.py).

Sources: store/.../CommitLog.java, common/.../message/MessageDecoder.java, common/.../sysflag/MessageSysFlag.java
(5.3.3).  Kept apart from the encoder and decoder so both can import it without an import cycle.
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

# --- constants (CommitLog.java / MessageDecoder.java / MessageSysFlag.java) -------------------------------
MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8
MAX_TOPIC_LENGTH_V1 = 127          # signed byte
MAX_TOPIC_LENGTH_V2 = 32767        # signed short
MAX_PROPERTIES_LENGTH = 32767      # signed short

TRANSACTION_MASK = 0xC
TX_NOT, TX_PREPARED, TX_COMMIT, TX_ROLLBACK = 0x0, 0x4, 0x8, 0xC
TRANSACTION_TYPE_NAMES = {TX_NOT: "NOT", TX_PREPARED: "PREPARED", TX_COMMIT: "COMMIT", TX_ROLLBACK: "ROLLBACK"}
BORNHOST_V6_FLAG = 0x10
#: 4.3+ transaction system topics (TransactionalMessageUtil / TopicValidator): half, op and discard records
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
TX_SYSTEM_TOPICS = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC)
STOREHOST_V6_FLAG = 0x20

# --- fixed layouts, one dtype per (born host family, store host family) ----------------------------------
_HEAD_FIELDS = (("total_size", ">i4"), ("magic", ">u4"), ("body_crc", ">i4"), ("queue_id", ">i4"),
                ("flag", ">i4"), ("queue_offset", ">i8"), ("physical_offset", ">i8"), ("sys_flag", ">i4"),
                ("born_timestamp", ">i8"))


def _layout(born_ip_len: int, store_ip_len: int) -> np.dtype:
    fields = [*_HEAD_FIELDS,
              ("born_ip", f"V{born_ip_len}"), ("born_port", ">i4"), ("store_timestamp", ">i8"),
              ("store_ip", f"V{store_ip_len}"), ("store_port", ">i4"), ("reconsume_times", ">i4"),
              ("prepared_transaction_offset", ">i8"), ("body_size", ">i4")]
    return np.dtype(fields)


#: layout index = (born host is IPv6) | (store host is IPv6) << 1
LAYOUTS = tuple(_layout(4 if not (i & 1) else 16, 4 if not (i & 2) else 16) for i in range(4))
HEAD = np.dtype(list(_HEAD_FIELDS))
assert HEAD.fields is not None  # structured (numpy types fields as Optional)
HEAD_SIZE = HEAD.itemsize                                  # 48: fields before BORNHOST
MAX_FIXED_SIZE = LAYOUTS[3].itemsize                       # 112: everything before BODY with two IPv6 hosts
MIN_RECORD_SIZE = LAYOUTS[0].itemsize + 1 + 2              # 91: IPv4 hosts, empty body, topic and properties
SYS_FLAG_OFFSET = HEAD.fields["sys_flag"][1]               # 36
PHYSICAL_OFFSET_OFFSET = HEAD.fields["physical_offset"][1]  # 28
QUEUE_OFFSET_OFFSET = HEAD.fields["queue_offset"][1]        # 20
assert LAYOUTS[0].itemsize == 72 + 8 + 8 and SYS_FLAG_OFFSET == 36  # layout self-check, not input validation

_SIZE_MAGIC = struct.Struct(">iI")
_I16 = struct.Struct(">h")
_I8 = struct.Struct(">b")
_STRUCTS = tuple(struct.Struct(">" + "".join(
    {"i4": "i", "u4": "I", "i8": "q"}.get(dt[n].str[1:], f"{dt[n].itemsize}s")
    for n in dt.names or ())) for dt in LAYOUTS)


def layout_index(sys_flag: int) -> int:
    return (1 if sys_flag & BORNHOST_V6_FLAG else 0) | (2 if sys_flag & STOREHOST_V6_FLAG else 0)


def body_crc(body: bytes) -> int:
    """UtilAll.crc32: java.util.zip.CRC32 masked to 31 bits; 0 for an empty body."""
    return zlib.crc32(body) & 0x7FFFFFFF if body else 0


