"""Stored messages back to back, as a broker's QUERY_MESSAGE response body carries them (``QueryMessageTransfer``
writes the CommitLog bytes of each selected message, one after the other; layout: txlog_io.commitlog_layout,
``CommitLog.calMsgLength``).  Only the fields a live check needs: physical offset, queue offset, store time,
topic, properties.  The encoder twin is ``txlog_io.commitlog.encode_record``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import List

from txlog_io.commitlog_layout import LAYOUTS, MAGIC_V1, MAGIC_V2, layout_index
from txlog_io.errors import TxlogError
from txlog_io.properties import decode_properties


class StoredMessageError(TxlogError):
    """A response body that is not a sequence of whole stored messages (position and reason in the text)."""


@dataclass(frozen=True)
class StoredMessage:
    physical_offset: int
    queue_offset: int
    store_timestamp: int
    topic: str
    properties: dict


def _field_offsets(i: int) -> dict:
    fields = LAYOUTS[i].fields
    assert fields is not None  # structured dtype (numpy types fields as Optional)
    return {n: f[1] for n, f in fields.items()}


_OFFSETS = tuple(_field_offsets(i) for i in range(len(LAYOUTS)))
_OFF = _OFFSETS[0]


def split_stored_messages(buf: bytes) -> List[StoredMessage]:
    try:
        return _split(buf)
    except (struct.error, IndexError) as e:
        raise StoredMessageError(f"a message overruns the {len(buf)}-byte body: {e}") from None


def _split(buf: bytes) -> List[StoredMessage]:
    out: List[StoredMessage] = []
    pos, n = 0, len(buf)
    while pos < n:
        if n - pos < LAYOUTS[0].itemsize:
            raise StoredMessageError(f"byte {pos}: {n - pos} bytes left, less than a message's fixed part")
        size, magic = struct.unpack_from(">iI", buf, pos)
        if magic not in (MAGIC_V1, MAGIC_V2):
            raise StoredMessageError(f"byte {pos}: magic {magic:#010x} is not a message's")
        if size < LAYOUTS[0].itemsize or pos + size > n:
            raise StoredMessageError(f"byte {pos}: total size {size} does not fit the {n - pos} bytes left")
        (sys_flag,) = struct.unpack_from(">i", buf, pos + _OFF["sys_flag"])
        li = layout_index(sys_flag)
        lay, offs = LAYOUTS[li], _OFFSETS[li]
        (qoff, poff) = struct.unpack_from(">qq", buf, pos + _OFF["queue_offset"])
        (store_ts,) = struct.unpack_from(">q", buf, pos + offs["store_timestamp"])
        (body_len,) = struct.unpack_from(">i", buf, pos + offs["body_size"])
        p = pos + lay.itemsize + max(body_len, 0)
        if magic == MAGIC_V2:
            (tlen,) = struct.unpack_from(">h", buf, p)
            p += 2
        else:
            tlen = buf[p]
            p += 1
        topic = buf[p:p + tlen].decode("utf-8", "replace")
        p += tlen
        (plen,) = struct.unpack_from(">h", buf, p)
        p += 2
        if body_len < 0 or plen < 0 or p + plen > pos + size:
            raise StoredMessageError(f"byte {pos}: body/topic/properties lengths overrun the {size}-byte message")
        out.append(StoredMessage(poff, qoff, store_ts, topic, decode_properties(buf[p:p + plen])))
        pos += size
    return out


__all__ = ["StoredMessage", "StoredMessageError", "split_stored_messages"]
