"""RecordBatches read from one buffer that a kernel filled: an Arrow IPC message whose metadata is a template.

An IPC record batch message is ``0xFFFFFFFF``, the metadata length, a flatbuffer ``Message`` (``RecordBatch``
header: the row count, one ``FieldNode`` (length, null count) per array node and one ``Buffer`` (offset,
length) per buffer, depth first), then the body those buffers point into.  For a fixed schema without
dictionaries the flatbuffer's shape never changes, only those numbers do: :class:`Template` serialises a
one-row batch of the schema once, finds where the numbers lie, and a decoder then writes a batch's numbers
there and its column data into the body, so ``pyarrow.ipc.read_record_batch`` gives every column in one call
over that one buffer, without a copy (each column's buffers are slices of it, holding a reference to it).
Buffers may leave gaps between them and may share bytes; each starts 8-byte aligned.
"""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_U16 = struct.Struct("<H")


def _field(fb: bytes, table: int, index: int) -> int:
    """Position of field ``index`` of the flatbuffer table at ``table`` (0: absent)."""
    vtable = table - _I32.unpack_from(fb, table)[0]
    size = _U16.unpack_from(fb, vtable)[0]
    if 4 + 2 * index >= size:
        return 0
    at = _U16.unpack_from(fb, vtable + 4 + 2 * index)[0]
    return table + at if at else 0


def _target(fb: bytes, at: int) -> int:
    """Where the offset stored at ``at`` points."""
    return at + _U32.unpack_from(fb, at)[0]


def _one_row(schema: pa.Schema) -> pa.RecordBatch:
    """A batch of one row with a value in every column (and one map entry): every metadata field present."""
    def value(t: pa.DataType):
        if pa.types.is_map(t):
            return [(value(t.key_type), value(t.item_type))]
        if pa.types.is_boolean(t):
            return True
        if pa.types.is_integer(t):
            return 1
        return b"x" if pa.types.is_binary(t) else "x"
    return pa.RecordBatch.from_pylist([{f.name: value(f.type) for f in schema}], schema=schema)


class Template:
    """The IPC metadata of ``schema``'s batches: ``head`` bytes to put first in the buffer (``meta``), the
    byte positions of the row count (``length_at``), the body length (``body_len_at``), the ``nodes``
    FieldNodes (``nodes_at``) and the ``buffers`` Buffers (``buffers_at``); the body starts at ``head``."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        raw = _one_row(schema).serialize().to_pybytes()
        if _U32.unpack_from(raw, 0)[0] != 0xFFFFFFFF:
            raise ValueError("unexpected IPC message prefix")
        self.head = 8 + _I32.unpack_from(raw, 4)[0]
        fb = raw[8:self.head]
        message = _U32.unpack_from(fb, 0)[0]
        header = _target(fb, _field(fb, message, 2))
        nodes, buffers = _target(fb, _field(fb, header, 1)), _target(fb, _field(fb, header, 2))
        self.length_at = 8 + _field(fb, header, 0)
        self.body_len_at = 8 + _field(fb, message, 3)
        self.nodes, self.buffers = _U32.unpack_from(fb, nodes)[0], _U32.unpack_from(fb, buffers)[0]
        self.nodes_at, self.buffers_at = 8 + nodes + 4, 8 + buffers + 4
        if 8 in (self.length_at, self.body_len_at) or self.nodes_at % 8 or self.buffers_at % 8:
            raise ValueError("unexpected IPC metadata layout")
        self.meta = np.frombuffer(raw[:self.head], np.uint8).copy()

    def read(self, buf: np.ndarray) -> pa.RecordBatch:
        """The batch in ``buf`` (``meta`` with its numbers written, then the body), without a copy."""
        return pa.ipc.read_record_batch(pa.py_buffer(buf), self.schema)


def node_count(t: pa.DataType) -> int:
    """Array nodes of a column of type ``t`` (itself and its children, depth first)."""
    return 1 + sum(node_count(t.field(i).type) for i in range(t.num_fields))


__all__ = ["Template", "node_count"]
