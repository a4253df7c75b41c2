"""CommitLog records: layout, encoder, framing scanner and vectorised decoder.

Follows store/src/main/java/org/apache/rocketmq/store/CommitLog.java (checkMessageAndReturnSize,
DefaultAppendMessageCallback.doAppend), store/.../MessageExtEncoder.java (calMsgLength, encode) and
common/.../message/MessageDecoder.java, 5.3.3; 4.9.7 and 3.1.4 CommitLog.java for the older layouts.

Record layout (all integers big-endian; B/S = 8 for an IPv4 host, 20 for IPv6 per SYSFLAG bits 0x10/0x20;
T = 1 for magic V1, 2 for magic V2):

    off        size  field
    0          4     TOTALSIZE                      whole record, this field included
    4          4     MAGICCODE                      V1 0xDAA320A7 | V2 0xDAA320AB | BLANK 0xCBD43194
    8          4     BODYCRC                        CRC32(stored body) & 0x7FFFFFFF
    12         4     QUEUEID
    16         4     FLAG
    20         8     QUEUEOFFSET
    28         8     PHYSICALOFFSET                 global offset of this record
    36         4     SYSFLAG
    40         8     BORNTIMESTAMP
    48         B     BORNHOST                       IP (4|16 bytes) + int32 port
    48+B       8     STORETIMESTAMP
    56+B       S     STOREHOST
    56+B+S     4     RECONSUMETIMES
    60+B+S     8     PREPARED_TRANSACTION_OFFSET
    68+B+S     4     BODYLENGTH
    72+B+S     n     BODY
    ..         T     TOPICLENGTH                    signed int8 (V1) / signed int16 (V2)
    ..         t     TOPIC
    ..         2     PROPERTIESLENGTH               signed int16
    ..         p     PROPERTIES
    TOTALSIZE = 72 + B + S + n + T + t + 2 + p

End of a mapped file: when a record does not fit with 8 spare bytes, the broker writes [int32 bytes-left][BLANK]
and continues in the next file; the newest file ends in zeros.  Both end the data of a file.

Framing (``scan_*``) is kept apart from decoding (``decode_*``): the scanner walks TOTALSIZE links and reports
record positions, valid bytes and anything it had to skip; the decoder turns a batch of positions into Arrow
columns with one numpy dtype per host layout and no per-record Python work on the fast path.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Mapping, Optional

from txlog_io import properties as P
from txlog_io.commitlog_layout import *  # noqa: F401,F403  (constants and dtypes are part of this API)
from txlog_io.commitlog_layout import (
    _I8,
    _I16,
    _SIZE_MAGIC,
    _STRUCTS,
    BLANK_MAGIC,
    BORNHOST_V6_FLAG,
    END_FILE_MIN_BLANK_LENGTH,
    LAYOUTS,
    MAGIC_V1,
    MAGIC_V2,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    STOREHOST_V6_FLAG,
    TRANSACTION_MASK,
    TRANSACTION_TYPE_NAMES,
    TX_COMMIT,
    TX_NOT,
    TX_PREPARED,
    TX_ROLLBACK,
    body_crc,
    layout_index,
)
from txlog_io.compression import compression_of
from txlog_io.errors import EncodeError
from txlog_io.msgid import parse_host

PROP_CRC_RESERVED_LEN = len(P.CRC32) + 1 + 10 + 1   # CommitLog.CRC32_RESERVED_LEN = 20

# --- encoder -----------------------------------------------------------------------------------------------
@dataclass
class Message:
    """One CommitLog record as the broker writes it (the encoder's input; also what the reference broker builds).

    ``body`` is the body as stored (already compressed when sys_flag says so).  The IPv6 host bits of sys_flag
    are derived from the host addresses.  ``magic_version`` None means what 5.1+ does with
    autoMessageVersionOnTopicLen: V2 only for topics longer than 127 characters.
    """

    topic: str
    body: bytes = b""
    properties: Mapping[str, str] = field(default_factory=dict)
    queue_id: int = 0
    flag: int = 0
    queue_offset: int = 0
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str = "127.0.0.1:0"
    store_timestamp: int = 0
    store_host: str = "127.0.0.1:10911"
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    magic_version: Optional[int] = None
    body_crc: Optional[int] = None           # None: computed; set it to write a deliberately wrong CRC
    properties_raw: Optional[bytes] = None   # exact PROPERTIES bytes, overriding ``properties``
    properties_trailing_separator: bool = True  # False: 4.9.x style, no 0x02 after the last entry
    append_prop_crc: bool = False            # 5.2+ enabledAppendPropCRC: trailing "__CRC32#" entry over the record

    def properties_bytes(self) -> bytes:
        if self.properties_raw is not None:
            return self.properties_raw
        return P.encode_properties(self.properties, self.properties_trailing_separator)

    def resolved_magic_version(self) -> int:
        if self.magic_version is not None:
            return self.magic_version
        return 2 if len(self.topic) > MAX_TOPIC_LENGTH_V1 else 1


def record_size(msg: Message) -> int:
    """calMsgLength."""
    born_ip, _ = parse_host(msg.born_host)
    store_ip, _ = parse_host(msg.store_host)
    t = 2 if msg.resolved_magic_version() == 2 else 1
    return (72 + len(born_ip) + 4 + len(store_ip) + 4 + len(msg.body) + t + len(msg.topic.encode("utf-8"))
            + 2 + len(msg.properties_bytes()))


def encode_record(msg: Message, physical_offset: int) -> bytes:
    """Bytes of one record exactly as DefaultAppendMessageCallback.doAppend lays it out."""
    born_ip, born_port = parse_host(msg.born_host)
    store_ip, store_port = parse_host(msg.store_host)
    sys_flag = msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOST_V6_FLAG)
    sys_flag |= (BORNHOST_V6_FLAG if len(born_ip) == 16 else 0) | (STOREHOST_V6_FLAG if len(store_ip) == 16 else 0)
    version = msg.resolved_magic_version()
    if version not in (1, 2):
        raise EncodeError("magic_version", "1 or 2", version)
    topic = msg.topic.encode("utf-8")
    limit = MAX_TOPIC_LENGTH_V1 if version == 1 else MAX_TOPIC_LENGTH_V2
    if not 0 < len(topic) <= limit:
        raise EncodeError("topic", f"1..{limit} UTF-8 bytes for magic V{version}", len(topic))
    props = msg.properties_bytes()
    if msg.append_prop_crc:
        # CommitLog.doAppend: a 0x02 is added when the properties do not end with one, then
        # CRC32_RESERVED_LEN bytes are reserved and filled once the record bytes before them are final
        if props and not props.endswith(P.PROPERTY_SEPARATOR):
            props += P.PROPERTY_SEPARATOR
        props += bytes(PROP_CRC_RESERVED_LEN)
    if len(props) > MAX_PROPERTIES_LENGTH:
        raise EncodeError("properties", f"at most {MAX_PROPERTIES_LENGTH} bytes", len(props))
    crc = body_crc(msg.body) if msg.body_crc is None else msg.body_crc
    layout = layout_index(sys_flag)
    total = (LAYOUTS[layout].itemsize + len(msg.body) + (1 if version == 1 else 2) + len(topic) + 2 + len(props))
    fixed = _STRUCTS[layout].pack(
        total, MAGIC_V1 if version == 1 else MAGIC_V2, crc, msg.queue_id, msg.flag, msg.queue_offset,
        physical_offset, sys_flag, msg.born_timestamp, born_ip, born_port, msg.store_timestamp, store_ip,
        store_port, msg.reconsume_times, msg.prepared_transaction_offset, len(msg.body))
    topic_len = _I8.pack(len(topic)) if version == 1 else _I16.pack(len(topic))
    record = b"".join((fixed, msg.body, topic_len, topic, _I16.pack(len(props)), props))
    if msg.append_prop_crc:
        head = record[:-PROP_CRC_RESERVED_LEN]
        record = head + prop_crc_entry(zlib.crc32(head) & 0x7FFFFFFF)
    return record


def prop_crc_entry(crc: int) -> bytes:
    """MessageDecoder.createCrc32: "__CRC32#" 0x01, ten decimal digits least-significant first, 0x02."""
    digits = bytearray()
    for _ in range(10):
        digits.append(ord("0") + (crc % 10 if crc > 0 else 0))
        crc //= 10
    return P.CRC32.encode() + P.NAME_VALUE_SEPARATOR + bytes(digits) + P.PROPERTY_SEPARATOR


def parse_prop_crc(value: str):
    """The CRC a "__CRC32#" value holds (digits are least-significant first), None if it is not 10 digits."""
    if len(value) != 10 or not value.isdigit():
        return None
    return int(value[::-1])


def encode_blank(bytes_left: int) -> bytes:
    """The 8-byte end-of-file header: [int32 bytes left in the file][BLANK_MAGIC]; the caller zero-fills the rest."""
    if bytes_left < END_FILE_MIN_BLANK_LENGTH:
        raise EncodeError("bytes_left", f">= {END_FILE_MIN_BLANK_LENGTH}", bytes_left)
    return _SIZE_MAGIC.pack(bytes_left, BLANK_MAGIC)


def transaction_type_name(sys_flag: int) -> str:
    return TRANSACTION_TYPE_NAMES[sys_flag & TRANSACTION_MASK]


from txlog_io.commitlog_decode import (  # noqa: E402  (decoder needs the layout above)
    decode_at,
    decode_file,
    decode_range,
    next_boundary,
    scan_range,
)

__all__ = ["decode_range", "decode_file", "decode_at", "scan_range", "next_boundary", "Message", "encode_record", "encode_blank", "record_size", "body_crc", "compression_of",
           "MAGIC_V1", "MAGIC_V2", "BLANK_MAGIC", "TX_NOT", "TX_PREPARED", "TX_COMMIT", "TX_ROLLBACK",
           "BORNHOST_V6_FLAG", "STOREHOST_V6_FLAG", "END_FILE_MIN_BLANK_LENGTH", "LAYOUTS"]
