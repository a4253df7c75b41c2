"""Compiled (numba) batch kernel of the CommitLog decoder: every COMMITLOG column (but ``file``) of a chunk's
selected records, written in one call into one output buffer that ``txlog_io.ipc_batch`` reads as a batch.

Layout of the output buffer: ``head`` bytes of IPC metadata (``ipc_batch.Template.meta``, its numbers written
by ``fill``), then the body: one *region* per column buffer (the ``R_*`` ids below), each 8-byte aligned, in
the order ``layout`` places them, sized for the worst case (a text column: the bytes it can at most take,
e.g. every properties byte for the map keys and for each wanted text column).  ``layout`` gives each region's offset
(relative to the body) and capacity in ``reg[r]``; ``fill`` writes the regions and then each one's length,
and the IPC metadata (row count, per array node its length and null count, per buffer its region), from the
``buf_src`` / ``node_m`` / ``node_nulls`` tables that ``commitlog_rows`` derives from the schema.

The topic, the map and every wanted property column (texts, numbers, TRAN_MSG, the TAGS hash) come from one
pass over each record's topic and properties (``text_kernels.split_entries``: string2messageProperties
semantics, duplicate keys dropped, each wanted key's value written into its column as it is found), then one
loop per column family (hosts, msgId, names, body).  Rules: see ``commitlog_kernels`` (5.3.3).
"""
from __future__ import annotations

import numpy as np

from txlog_io import properties as P
from txlog_io.commitlog_kernels import (
    F_BODY_AT,
    F_BODY_CRC,
    F_BODY_SIZE,
    F_BORN_AT,
    F_BORN_TS,
    F_FLAG,
    F_PREPARED,
    F_PROPS_AT,
    F_PROPS_LEN,
    F_QUEUE_ID,
    F_QUEUE_OFFSET,
    F_RECONSUME,
    F_STORE_AT,
    F_STORE_TS,
    F_STORED_PHYS,
    F_SYS_FLAG,
    F_TOPIC_AT,
    F_TOPIC_LEN,
    F_TOTAL,
    F_V2,
    copy_bytes,
    copy_words,
    le64,
    store64,
)
from txlog_io.id_kernels import HOST_V4_MAX, HOST_V6_MAX, host_texts, msg_ids
from txlog_io.jit import njit
from txlog_io.text_kernels import (
    decimal_int,
    equal_words,
    java_hash,
    mark_duplicates,
    or_bytes,
    split_entries,
)

#: property columns of COMMITLOG, in the order of the wanted-key index q
WANTED = (P.UNIQ_KEY, P.TAGS, P.KEYS, P.PGROUP, P.REAL_TOPIC, P.REAL_QID, P.TRAN_MSG,
          P.TRANSACTION_CHECK_TIMES, P.TRAN_PREPARED_QUEUE_OFFSET, P.CHECK_IMMUNITY_TIME_IN_SECONDS,
          P.TRANSACTION_ID)
NW = len(WANTED)
Q_TAGS, Q_REAL_QID, Q_TRAN_MSG, Q_TCT, Q_TPQO, Q_CITS = 1, 5, 6, 7, 8, 9
#: the numeric property columns: (wanted index, value width in bytes); their regions are R_NUMBER + i
NUMBERS = ((Q_REAL_QID, 4), (Q_TCT, 4), (Q_TPQO, 8), (Q_CITS, 8))
#: per wanted index q, its index in NUMBERS (-1: not a number)
NUMBER_OF = tuple(next((i for i, (nq, _) in enumerate(NUMBERS) if nq == q), -1) for q in range(NW))
_NUMBER_OF = np.asarray(NUMBER_OF, np.int64)
_NUMBER_WIDTH = np.asarray([w for _, w in NUMBERS], np.int64)

# ---- regions: fixed-width columns (8-, 4-, 1-byte values; bitmaps), offsets, data
R_FILE_POSITION, R_PHYSICAL, R_QUEUE_OFFSET, R_STORED_PHYS, R_BORN_TS, R_STORE_TS, R_PREPARED, \
    R_TAGS_CODE = range(8)                                                    # int64
R_TOTAL, R_BODY_CRC, R_QUEUE_ID, R_FLAG, R_SYS_FLAG, R_RECONSUME, R_BODY_SIZE = range(8, 15)   # int32
R_MAGIC = 15                                                                  # int8
R_NUMBER = 16                                                                 # 4 numeric property columns
R_CRC_OK, R_TRAN_MSG, R_BODY_VALID = 20, 21, 22                               # bitmaps
R_VALID = 23                                                                  # NW validity bitmaps
R_TT_OFF, R_BORN_OFF, R_STORE_OFF, R_TOPIC_OFF, R_MSGID_OFF, R_COMP_OFF, R_BODY_OFF, R_MAP_OFF = \
    range(R_VALID + NW, R_VALID + NW + 8)                                     # (n + 1) int32 offsets
R_W_OFF = R_MAP_OFF + 1                                                       # NW wanted columns' offsets
R_KEY_OFF, R_VAL_OFF = R_W_OFF + NW, R_W_OFF + NW + 1                         # (entries + 1) int32 offsets
R_TT_DATA, R_BORN_DATA, R_STORE_DATA, R_TOPIC_DATA, R_MSGID_DATA, R_COMP_DATA, R_BODY_DATA, R_KEY_DATA, \
    R_VAL_DATA = range(R_VAL_OFF + 1, R_VAL_OFF + 10)
R_W_DATA = R_VAL_DATA + 1                                                     # NW wanted columns' data
R_NONE = R_W_DATA + NW                                                        # an absent buffer: (0, 0)
N_REGIONS = R_NONE + 1
#: ``nulls`` slots of ``fill``: one per wanted column, the body, and a zero
N_BODY, N_ZERO = NW, NW + 1
NAME_MAX = 8                                                                  # "PREPARED", "ROLLBACK"


@njit
def layout(f, with_body, reg, every_entry):
    """Place every region (``reg[r] = (offset, capacity)``, body-relative, 8-byte aligned) for the records of
    the field matrix ``f``; returns the body's size.  The map's entries get room for one per 10 properties
    bytes (real properties hold ~15-40 bytes per entry; ``fill`` reports when that is not enough), or with
    ``every_entry`` for as many as the bytes can hold: a 3-byte segment each.  (Room left unused costs
    memory: numpy backs large arrays with 2 MiB pages, so a gap in one is resident too.)"""
    n = f.shape[1]
    props = np.int64(0)
    topics = np.int64(0)
    bodies = np.int64(0)
    entries = np.int64(0)
    hosts = np.int64(0)
    for k in range(n):
        props += f[F_PROPS_LEN, k]
        topics += f[F_TOPIC_LEN, k]
        bodies += f[F_BODY_SIZE, k] if with_body else 0
        entries += f[F_PROPS_LEN, k] // (3 if every_entry else 10) + 1
        hosts += HOST_V6_MAX if f[F_SYS_FLAG, k] & 0x30 else HOST_V4_MAX
    at = np.int64(0)
    for r in range(N_REGIONS):
        if r < R_TOTAL:
            size = 8 * n
        elif r < R_MAGIC:
            size = 4 * n
        elif r == R_MAGIC:
            size = n
        elif r < R_CRC_OK:
            size = (4 if r < R_NUMBER + 2 else 8) * n     # NUMBERS: two int32 columns, two int64
        elif r < R_TT_OFF:
            size = (n + 7) // 8
        elif r < R_KEY_OFF:
            size = 4 * (n + 1)
        elif r < R_TT_DATA:
            size = 4 * (entries + 1)
        elif r == R_TT_DATA or r == R_COMP_DATA:
            size = NAME_MAX * n
        elif r == R_BORN_DATA or r == R_STORE_DATA:
            size = hosts
        elif r == R_TOPIC_DATA:
            size = topics
        elif r == R_MSGID_DATA:
            size = 56 * n
        elif r == R_BODY_DATA:
            size = bodies
        elif r < R_NONE:
            # keys, values, each text wanted column's values: at most every byte (numbers and TRAN_MSG keep
            # no text)
            size = 0 if r >= R_W_DATA and (_NUMBER_OF[r - R_W_DATA] >= 0 or r == R_W_DATA + Q_TRAN_MSG) \
                else props
        else:
            size = 0
        reg[r, 0] = at if r != R_NONE else 0
        reg[r, 1] = size
        at += (size + 8 + 7) // 8 * 8                      # + 8: copy_words writes up to 7 bytes past a value
    return at


_I32_LO, _I32_HI = -(1 << 31), (1 << 31) - 1
_I64_LO, _I64_HI = -(1 << 63), (1 << 63) - 1


@njit(inline="always")
def _words(head, reg, r, width):
    """Index of region ``r``'s first value in the output viewed as ``width``-byte words."""
    return (head + reg[r, 0]) // width


@njit(inline="always")
def _name(out, at, names, off, i):
    """Name ``i`` of the packed names (``names``, ``off``; at most 8 bytes each, ``names`` readable 7 bytes
    past the last) written at ``out[at:]`` as one 8-byte store; returns its length."""
    store64(out, at, le64(names, off[i]))
    return off[i + 1] - off[i]


@njit
def _texts(u8, f, out, o32, o64, head, reg, wanted, wanted_off, wanted_at, true_word, present, wt):
    """``fill``'s text part: the topic, map entries and wanted columns of every record in one pass over its
    topic and properties.  A wanted key's value is written into its column as it is found, and the value
    columns derived from it set: numbers, TRAN_MSG == "true" (the text of these two is not kept), the TAGS
    hash.
    ``present[q]``, ``wt[q]``: rows and bytes of wanted column q.  Returns (OR of every byte read, map entries
    or -1 when they do not fit the room ``layout`` gave them, topic / key / value bytes, bit i: numeric column
    NUMBERS[i] parsed exactly, TAGS values that are not UTF-8)."""
    n = f.shape[1]
    nb = (n + 7) // 8
    t_off, t_data = _words(head, reg, R_TOPIC_OFF, 4), head + reg[R_TOPIC_DATA, 0]
    m_off, k_off, v_off = (_words(head, reg, R_MAP_OFF, 4), _words(head, reg, R_KEY_OFF, 4),
                           _words(head, reg, R_VAL_OFF, 4))
    k_data, v_data = head + reg[R_KEY_DATA, 0], head + reg[R_VAL_DATA, 0]
    w_off = np.empty(NW, np.int64)
    w_data = np.empty(NW, np.int64)
    valid = np.empty(NW, np.int64)
    value_at = np.empty(NW, np.int64)              # word index of a number's / the TAGS hash's first value
    for q in range(NW):
        w_off[q] = _words(head, reg, R_W_OFF + q, 4)
        w_data[q] = head + reg[R_W_DATA + q, 0]
        valid[q] = head + reg[R_VALID + q, 0]
        present[q] = 0
        wt[q] = 0
        for b in range(nb):
            out[valid[q] + b] = 0
        number = _NUMBER_OF[q]
        value_at[q] = 0
        if number >= 0:
            width = _NUMBER_WIDTH[number]
            value_at[q] = _words(head, reg, R_NUMBER + number, width)
            for k in range(n):
                if width == 4:
                    o32[value_at[q] + k] = 0
                else:
                    o64[value_at[q] + k] = 0
    tags_at = _words(head, reg, R_TAGS_CODE, 8)
    for k in range(n):
        o64[tags_at + k] = 0
    true_at = head + reg[R_TRAN_MSG, 0]
    for b in range(nb):
        out[true_at + b] = 0
    most = np.int64(1)
    for k in range(n):
        most = max(most, f[F_PROPS_LEN, k] // 3 + 1)
    room = reg[R_KEY_OFF, 1] // 4 - 1               # map entries the offsets regions hold
    ks = np.empty(most, np.int64)                  # one record's entries: key start, 0x01 position, value end
    kv = np.empty(most, np.int64)
    ve = np.empty(most, np.int64)
    dup = np.empty(most, np.bool_)
    high = np.uint64(0)                            # OR of every topic and properties byte (the ASCII test)
    tw = np.int64(0)
    kt = np.int64(0)
    vt = np.int64(0)
    m = 0
    plain = (1 << len(NUMBERS)) - 1
    bad_tags = 0
    for k in range(n):
        ta, tl = f[F_TOPIC_AT, k], f[F_TOPIC_LEN, k]
        o32[t_off + k] = tw
        copy_words(out, t_data + tw, u8, ta, tl)
        high |= or_bytes(u8, ta, tl)
        tw += tl
        o32[m_off + k] = m
        for q in range(NW):
            o32[w_off[q] + k] = wt[q]
        e, h = split_entries(u8, f[F_PROPS_AT, k], f[F_PROPS_AT, k] + f[F_PROPS_LEN, k], ks, kv, ve)
        high |= h
        if m + e > room:
            return high, -1, tw, kt, vt, 0, 0
        mark_duplicates(u8, ks, kv, e, dup)
        for j in range(e):
            if dup[j]:
                continue
            lj = kv[j] - ks[j]
            va = kv[j] + 1
            vl = ve[j] - va
            o32[k_off + m] = kt
            o32[v_off + m] = vt
            copy_words(out, k_data + kt, u8, ks[j], lj)
            copy_words(out, v_data + vt, u8, va, vl)
            kt += lj
            vt += vl
            m += 1
            # a wanted key? (length, first byte) -> its index, then the bytes compared (this inline form
            # measured ~60 ns/record cheaper than the same test in a helper returning the index)
            if lj < 64:
                q = wanted_at[lj * 256 + u8[ks[j]]]
                if q >= 0 and equal_words(u8, ks[j], wanted, wanted_off[q], lj):
                    present[q] += 1
                    out[valid[q] + (k >> 3)] |= np.uint8(1 << (k & 7))
                    if q == Q_TRAN_MSG:
                        if vl == true_word.size:
                            same = True
                            for c in range(true_word.size):
                                same = same and u8[va + c] == true_word[c]
                            if same:
                                out[true_at + (k >> 3)] |= np.uint8(1 << (k & 7))
                        continue
                    number = _NUMBER_OF[q]
                    if number >= 0:
                        width = _NUMBER_WIDTH[number]
                        v, ok = decimal_int(u8, va, va + vl, _I32_LO if width == 4 else _I64_LO,
                                            _I32_HI if width == 4 else _I64_HI)
                        if not ok:
                            plain &= ~(1 << number)
                        if width == 4:
                            o32[value_at[q] + k] = v
                        else:
                            o64[value_at[q] + k] = v
                        continue
                    if q == Q_TAGS:
                        v, bad = java_hash(u8, va, va + vl)
                        bad_tags += 1 if bad else 0      # its tags_code is left 0 here
                        o64[tags_at + k] = v
                    copy_words(out, w_data[q] + wt[q], u8, va, vl)
                    wt[q] += vl
    o32[t_off + n] = tw
    o32[m_off + n] = m
    o32[k_off + m] = kt
    o32[v_off + m] = vt
    for q in range(NW):
        o32[w_off[q] + n] = wt[q]
    return high, m, tw, kt, vt, plain, bad_tags


@njit
def fill(u8, f, pos, file_pos, base, crc_ok, with_body, out, o32, o64, reg, ipc, meta, buf_src, node_m,
         node_nulls, nulls, wanted, wanted_off, wanted_at, tx_names, tx_off, comp_names, comp_off, hexd,
         pairs, true_word):
    """Write the rows of the records at ``pos`` (field matrix ``f``, file positions, body CRC results) into
    ``out`` (``o32`` / ``o64``: the same bytes as int32 / int64 words), regions placed by ``layout`` in
    ``reg``, then the IPC metadata (``meta`` patched; ``ipc`` = head, row count, body length, nodes and
    buffers positions; see the module docstring).  ``nulls``: per wanted column and the body, its nulls.
    Returns (every topic and properties byte is ASCII, bit i: numeric column NUMBERS[i] parsed exactly,
    TAGS values that are not UTF-8: their tags_code is left 0), or (False, -1, 0) when the map entries did
    not fit (nothing usable written: call ``layout`` with ``every_entry`` and fill again)."""
    n = f.shape[1]
    head = ipc[0]
    # ---- fixed-width columns
    for r, row in ((R_QUEUE_OFFSET, F_QUEUE_OFFSET), (R_STORED_PHYS, F_STORED_PHYS), (R_BORN_TS, F_BORN_TS),
                   (R_STORE_TS, F_STORE_TS), (R_PREPARED, F_PREPARED)):
        i = _words(head, reg, r, 8)
        for k in range(n):
            o64[i + k] = f[row, k]
    for r, row in ((R_TOTAL, F_TOTAL), (R_BODY_CRC, F_BODY_CRC), (R_QUEUE_ID, F_QUEUE_ID), (R_FLAG, F_FLAG),
                   (R_SYS_FLAG, F_SYS_FLAG), (R_RECONSUME, F_RECONSUME), (R_BODY_SIZE, F_BODY_SIZE)):
        i = _words(head, reg, r, 4)
        for k in range(n):
            o32[i + k] = f[row, k]
    i, j, at = _words(head, reg, R_FILE_POSITION, 8), _words(head, reg, R_PHYSICAL, 8), head + reg[R_MAGIC, 0]
    for k in range(n):
        o64[i + k] = file_pos[k]
        o64[j + k] = file_pos[k] + base
        out[at + k] = f[F_V2, k] + 1
    at = head + reg[R_CRC_OK, 0]
    for b in range((n + 7) // 8):
        v = 0
        for k in range(b * 8, min(n, b * 8 + 8)):
            v |= np.int64(crc_ok[k]) << (k - b * 8)
        out[at + b] = v
    # ---- topics and properties, one pass (``_texts``)
    present = np.empty(NW, np.int64)
    wt = np.empty(NW, np.int64)
    high, m, tw, kt, vt, plain, bad_tags = _texts(u8, f, out, o32, o64, head, reg, wanted, wanted_off,
                                                  wanted_at, true_word, present, wt)
    if m < 0:
        return False, -1, 0
    for q in range(NW):
        nulls[q] = n - present[q]
    # ---- names (transaction type, compression), hosts, msgId
    i, j = _words(head, reg, R_TT_OFF, 4), _words(head, reg, R_COMP_OFF, 4)
    a, c = head + reg[R_TT_DATA, 0], head + reg[R_COMP_DATA, 0]
    tt = np.int64(0)
    ct = np.int64(0)
    for k in range(n):
        sys_flag = f[F_SYS_FLAG, k]
        o32[i + k] = tt
        o32[j + k] = ct
        tt += _name(out, a + tt, tx_names, tx_off, (sys_flag & 0xC) >> 2)
        # 0 = not compressed, else type bits + 1 (bits 0 and 3 both mean zlib)
        ct += _name(out, c + ct, comp_names, comp_off,
                    min(((sys_flag & 0x700) >> 8) + 1, 5) if sys_flag & 1 else 0)
    o32[i + n] = tt
    o32[j + n] = ct
    sys_flags = f[F_SYS_FLAG]
    born6 = (sys_flags & 0x10) != 0
    store6 = (sys_flags & 0x20) != 0
    i, a = _words(head, reg, R_BORN_OFF, 4), head + reg[R_BORN_DATA, 0]
    born = host_texts(u8, f[F_BORN_AT], born6, hexd, o32[i:i + n + 1],
                      out[a:a + reg[R_BORN_DATA, 1] + 8])
    i, a = _words(head, reg, R_STORE_OFF, 4), head + reg[R_STORE_DATA, 0]
    store = host_texts(u8, f[F_STORE_AT], store6, hexd, o32[i:i + n + 1],
                       out[a:a + reg[R_STORE_DATA, 1] + 8])
    i, a = _words(head, reg, R_MSGID_OFF, 4), head + reg[R_MSGID_DATA, 0]
    ids = msg_ids(u8, pos, f[F_STORE_AT], store6, pairs, o32[i:i + n + 1], out[a:a + reg[R_MSGID_DATA, 1]])
    # ---- body: a copy of every body, or all nulls
    i, a = _words(head, reg, R_BODY_OFF, 4), head + reg[R_BODY_DATA, 0]
    bt = np.int64(0)
    for k in range(n):
        o32[i + k] = bt
        if with_body:
            copy_bytes(out, a + bt, u8, f[F_BODY_AT, k], f[F_BODY_SIZE, k])
            bt += f[F_BODY_SIZE, k]
    o32[i + n] = bt
    at = head + reg[R_BODY_VALID, 0]
    for b in range((n + 7) // 8):
        out[at + b] = 0xFF if with_body else 0
    nulls[N_BODY] = 0 if with_body else n
    nulls[N_ZERO] = 0
    # ---- region lengths, then the IPC metadata
    for r, used in ((R_KEY_OFF, 4 * (m + 1)), (R_VAL_OFF, 4 * (m + 1)), (R_TT_DATA, tt), (R_COMP_DATA, ct),
                    (R_BORN_DATA, born), (R_STORE_DATA, store), (R_TOPIC_DATA, tw), (R_MSGID_DATA, ids),
                    (R_BODY_DATA, bt), (R_KEY_DATA, kt), (R_VAL_DATA, vt)):
        reg[r, 1] = used
    for q in range(NW):
        reg[R_W_DATA + q, 1] = wt[q]
    reg[R_NONE, 0] = 0
    reg[R_NONE, 1] = 0
    out[:head] = meta
    o64[ipc[1] // 8] = n
    o64[ipc[2] // 8] = out.size - head
    nodes, buffers = ipc[3] // 8, ipc[4] // 8
    for x in range(node_m.size):
        o64[nodes + 2 * x] = m if node_m[x] else n
        o64[nodes + 2 * x + 1] = nulls[node_nulls[x]]
    for x in range(buf_src.size):
        o64[buffers + 2 * x] = reg[buf_src[x], 0]
        o64[buffers + 2 * x + 1] = reg[buf_src[x], 1]
    return (high & np.uint64(0x8080808080808080)) == np.uint64(0), plain, bad_tags
