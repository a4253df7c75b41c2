"""Evidence rows of the reconstruction and their linking, as columns (Spark-free: numpy + pyarrow).

Every record that says something about a transaction becomes one evidence row (role COPY, END, OP, DISCARD,
ST, REDO_P, REDO_E, ORIGREF or XREF) carrying a transaction id ``tx``.  The rules are those of the store-format
reference sections 7, 8, 10 and 11 (see jobs/reconstruct/spark.py for the summary):

* COPY: half copies (topic RMQ_SYS_TRANS_HALF_TOPIC; id from (UNIQ_KEY, PGROUP, REAL_TOPIC), else the copy's
  own offset) and PREPARED records in real topics (one transaction each: "P" + offset).
* END: COMMIT / ROLLBACK records in real topics; DISCARD: TRANS_CHECK_MAX_TIME_TOPIC records; OP: one per
  half offset named in an op body (``1234`` up to 5.0, ``1,2,3,`` from 5.1); ST / REDO_P / REDO_E: 3.x
  statetable and redolog units.
* link_ends: an END finds the copy its PREPARED_TRANSACTION_OFFSET points to (by CommitLog offset), takes its
  id; the copy learns whether a COMMIT points to it.
* link_ops: an OP finds the half copy whose QUEUEOFFSET it names (by half queue id and offset); copies learn
  whether an op names them, directly or through their TRAN_PREPARED_QUEUE_OFFSET (ORIGREF).
* cross_refs: an END whose own (UNIQ_KEY, PGROUP, topic) id differs from the id of the half copy it found
  (``key_mismatch``: RocketMQ copies that half's properties into the END, so one of the two was damaged)
  gets an XREF twin keyed by its own id, so that the transaction the END names is flagged too; a half copy,
  END or discard record whose ``__transactionId__`` property differs from its UNIQ_KEY (``tid_tx``: a 5.1+
  broker sets the one from the other on every half) gets a TIDREF twin keyed by the id that property
  gives.

One broker's rows at a time.  Both links are key joins over sorted keys (jobs/reconstruct/groups.py); no Python loop
runs per row (only op-body pieces that are not plain ASCII digits are parsed one by one).
"""
from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Dict, List, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.groups import (
    Nullable,
    coalesce,
    ints,
    key_ids,
    lookup_ids,
    member,
    str_rank,
    strings,
    take,
    where,
)
from jobs.reconstruct.params import (
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    SCHEDULE_TOPIC,
    SEP,
    TIMER_TOPIC,
)
from schemas.recon import EVIDENCE_CODE_COLUMNS, EVIDENCE_INT_COLUMNS, EVIDENCE_STR_COLUMNS

# role codes (0 = none); mechanism codes keep the order of their names (max() over names = max over codes)
COPY, END, OP, DISCARD, ST, REDO_P, REDO_E, ORIGREF, XREF, TIDREF = range(1, 11)
HALF_Q, PREP_R = 1, 2                       # HALF_QUEUE < PREPARED_RECORD, as strings
COMMIT_T, ROLLBACK_T = 1, 2
CRC_FALSE, CRC_TRUE = 1, 2                  # body_crc_ok: 0 = null
MECH_NAMES = {HALF_Q: "HALF_QUEUE", PREP_R: "PREPARED_RECORD"}

INT_FIELDS = EVIDENCE_INT_COLUMNS             # the evidence columns are schemas.recon's (named once)
CODE_FIELDS = EVIDENCE_CODE_COLUMNS
STR_FIELDS = EVIDENCE_STR_COLUMNS

_SYSTEM_EXACT = (HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC)
_SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_")
# Spark's string -> bigint cast (what the Spark plan used): optional sign, digits, optional ".digits" dropped
_LONG_RE = re.compile(r"^([+-]?\d+)(\.\d*)?$")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class Evidence:
    """One broker's evidence rows as columns: ``i[name]`` (values, valid) int64 pairs, ``c[name]`` int8 codes
    (0 = null / false), ``s[name]`` Arrow strings."""

    def __init__(self, n: int, i: Dict[str, Nullable], c: Dict[str, np.ndarray], s: Dict[str, pa.Array]):
        self.n, self.i, self.c, self.s = n, i, c, s

    @classmethod
    def part(cls, n: int, **cols) -> "Evidence":
        i = {k: cols.get(k, (np.zeros(n, np.int64), np.zeros(n, bool))) for k in INT_FIELDS}
        c = {k: np.asarray(cols.get(k, np.zeros(n, np.int8)), np.int8) for k in CODE_FIELDS}
        s = {k: cols.get(k, pa.nulls(n, pa.string())) for k in STR_FIELDS}
        return cls(n, i, c, s)

    @classmethod
    def concat(cls, parts: List["Evidence"]) -> "Evidence":
        parts = [p for p in parts if p.n] or [cls.part(0)]
        return cls(sum(p.n for p in parts),
                   {k: (np.concatenate([p.i[k][0] for p in parts]),
                        np.concatenate([p.i[k][1] for p in parts])) for k in INT_FIELDS},
                   {k: np.concatenate([p.c[k] for p in parts]) for k in CODE_FIELDS},
                   {k: pa.concat_arrays([p.s[k] for p in parts]) for k in STR_FIELDS})

    def rows(self, idx: np.ndarray) -> "Evidence":
        return Evidence(len(idx), {k: (v[idx], ok[idx]) for k, (v, ok) in self.i.items()},
                        {k: v[idx] for k, v in self.c.items()},
                        {k: v.take(pa.array(idx, pa.int64())) for k, v in self.s.items()})


def _np(mask) -> np.ndarray:
    """Arrow boolean -> numpy bool, null = False."""
    return np.asarray(pc.fill_null(mask, False)) if len(mask) else np.zeros(0, bool)


def is_system_topic_mask(topic: pa.Array) -> np.ndarray:
    m = pc.is_in(topic, pa.array(_SYSTEM_EXACT))
    for p in _SYSTEM_PREFIXES:
        m = pc.or_(m, pc.starts_with(topic, p))
    return _np(m)


def is_system_topic(topic: Optional[str]) -> bool:
    return topic is not None and (topic in _SYSTEM_EXACT or topic.startswith(_SYSTEM_PREFIXES))


def _join(tag: str, *parts) -> pa.Array:
    """``tag SEP part SEP ...``; null when a part is null."""
    return pc.binary_join_element_wise(tag, *parts, SEP)


def uniq_tx(uk: pa.Array, pgroup: pa.Array, real_topic: pa.Array) -> pa.Array:
    return _join("U", uk, pc.fill_null(pgroup, ""), pc.fill_null(real_topic, ""))


def p_tx(offset: pa.Array) -> pa.Array:
    return _join("P", offset.cast(pa.string()))


def _none(n: int) -> Nullable:
    return np.zeros(n, np.int64), np.zeros(n, bool)


_RECORD_COLUMNS = ("topic", "transaction_type", "physical_offset", "uniq_key", "pgroup", "real_topic",
                   "queue_id", "body_crc_ok", "msg_id", "transaction_id", "keys", "total_size", "queue_offset",
                   "store_timestamp", "born_timestamp", "real_qid", "transaction_check_times",
                   "tran_prepared_queue_offset", "check_immunity_time_s", "prepared_transaction_offset")


def _record_kinds(t: pa.Table):
    """(is_half, is_disc, prep, commit, rollback) masks of CommitLog records: the ones that are evidence."""
    topic, ttype = strings(t.column("topic")), strings(t.column("transaction_type"))
    is_half, is_disc = _np(pc.equal(topic, HALF_TOPIC)), _np(pc.equal(topic, DISCARD_TOPIC))
    normal = ~is_system_topic_mask(topic) & ~np.asarray(topic.is_null())
    prep = normal & _np(pc.equal(ttype, "PREPARED"))
    commit, rollback = normal & _np(pc.equal(ttype, "COMMIT")), normal & _np(pc.equal(ttype, "ROLLBACK"))
    return is_half, is_disc, prep, commit, rollback


def evidence_mask(t: pa.Table) -> np.ndarray:
    """Which CommitLog records :func:`record_evidence` makes a row of (op records are evidence through their
    bodies, :func:`op_rows_evidence`, and are not in this mask)."""
    if not t.num_rows:
        return np.zeros(0, bool)
    is_half, is_disc, prep, commit, rollback = _record_kinds(t)
    return is_half | is_disc | prep | commit | rollback


def record_evidence(t: pa.Table) -> Evidence:
    """COPY / END / DISCARD rows of one broker's transaction-relevant CommitLog records (other records are
    no evidence)."""
    is_half, is_disc, prep, commit, rollback = _record_kinds(t)
    keep = np.nonzero(is_half | is_disc | prep | commit | rollback)[0]
    # only the columns read below are taken (the input has ~40, most of them other sources')
    t = t.select([n for n in _RECORD_COLUMNS if n in t.column_names]).take(pa.array(keep, pa.int64()))
    is_half, is_disc, prep, commit = is_half[keep], is_disc[keep], prep[keep], commit[keep]
    end = commit | rollback[keep]
    n = t.num_rows
    col = (lambda name: strings(t.column(name)))
    icol = (lambda name: ints(t.column(name)))
    phys = t.column("physical_offset").combine_chunks() if n else pa.array([], pa.int64())
    uk, pgroup, rtopic, topic = col("uniq_key"), col("pgroup"), col("real_topic"), col("topic")
    u = uniq_tx(uk, pgroup, rtopic)
    phys_s = phys.cast(pa.string())
    tx = pc.if_else(pa.array(is_half), pc.coalesce(u, _join("O", phys_s)),
                    pc.if_else(pa.array(is_disc), pc.coalesce(u, _join("D", phys_s)),
                               pc.if_else(pa.array(prep), _join("P", phys_s), pa.nulls(n, pa.string()))))
    has_rt = ~np.asarray(rtopic.is_null()) if n else np.zeros(0, bool)
    mech = np.where(is_half, HALF_Q, np.where(prep, PREP_R, np.where(end, np.where(has_rt, HALF_Q, PREP_R),
                                                                     0)))
    copyish = is_half | prep
    qid = icol("queue_id")
    crc_v, crc_ok = icol("body_crc_ok")
    return Evidence.part(
        n, role=np.where(copyish, COPY, np.where(is_disc, DISCARD, END)), mechanism=mech,
        end_type=np.where(end, np.where(commit, COMMIT_T, ROLLBACK_T), 0),
        crc=np.where(crc_ok, np.where(crc_v != 0, CRC_TRUE, CRC_FALSE), 0),
        tx=tx, msg_id=col("msg_id"), uniq_key=uk, transaction_id=col("transaction_id"), keys=col("keys"),
        pgroup=pgroup,
        real_topic=pc.if_else(pa.array(prep), topic,
                              pc.if_else(pa.array(end), pc.coalesce(rtopic, topic), rtopic)),
        physical_offset=ints(phys), total_size=icol("total_size"), queue_id=qid,
        queue_offset=icol("queue_offset"), store_timestamp=icol("store_timestamp"),
        born_timestamp=icol("born_timestamp"),
        real_qid=where(prep, qid, where(end, coalesce(icol("real_qid"), qid), icol("real_qid"))),
        check_times=where(~end, icol("transaction_check_times"), _none(n)),
        tran_prepared_qo=where(copyish, icol("tran_prepared_queue_offset"), _none(n)),
        immunity_s=where(copyish, icol("check_immunity_time_s"), _none(n)),
        pto=where(end, icol("prepared_transaction_offset"), _none(n)))


def body_texts(body: pa.Array) -> pa.Array:
    """Op bodies as text (bytes decoded as UTF-8 with replacement, as ``bytes.decode(..., "replace")``)."""
    if pa.types.is_string(body.type) or pa.types.is_large_string(body.type):
        return body.cast(pa.string())
    try:
        return body.cast(pa.string())
    except pa.ArrowInvalid:         # damaged bytes: decode those one by one
        return pa.array([None if b is None else b.decode("utf-8", "replace") for b in body.to_pylist()],
                        pa.string())


def spark_long(piece: str) -> Optional[int]:
    """``try_cast(piece AS BIGINT)`` as Spark does it (surrounding whitespace allowed, a fraction dropped)."""
    m = _LONG_RE.match(piece.strip())
    if m is None:
        return None
    v = int(m.group(1))
    return v if _LONG_MIN <= v <= _LONG_MAX else None


def _half_offsets(pieces: pa.Array) -> Nullable:
    """spark_long of every piece: plain ASCII digits (what brokers write) in one cast, the rest in Python."""
    plain = _np(pc.match_substring_regex(pieces, r"^[0-9]{1,18}$"))
    vals = np.zeros(len(pieces), np.int64)
    ok = plain.copy()
    if plain.any():
        vals[plain] = np.asarray(pieces.filter(pa.array(plain)).cast(pa.int64()))
    for i in np.nonzero(~plain)[0]:
        v = spark_long(pieces[int(i)].as_py())
        if v is not None:
            vals[i], ok[i] = v, True
    return vals, ok


def op_rows_evidence(ops: pa.Table) -> Evidence:
    """OP rows of op messages (columns physical_offset, queue_id, queue_offset, store_timestamp, total_size,
    body_crc_ok, body): one per non-empty piece of a body (``1234`` or ``1,2,3,``), in message order.
    half_offset is null for a piece that is not a number (OP_BODY_UNPARSABLE)."""
    if ops.num_rows == 0:
        return Evidence.part(0)
    split = pc.split_pattern(body_texts(ops.column("body").combine_chunks()), ",")
    parent = np.asarray(pc.list_parent_indices(split)).astype(np.int64)
    pieces = pc.utf8_trim(pc.list_flatten(split), " ")
    keep = np.nonzero(_np(pc.not_equal(pieces, "")))[0]
    parent, pieces = parent[keep], pieces.take(pa.array(keep, pa.int64()))
    n = len(parent)

    def at(name):
        v, ok = ints(ops.column(name))
        return v[parent], ok[parent]

    qv, qok = at("queue_id")
    crc_v, crc_ok = at("body_crc_ok")
    return Evidence.part(n, role=np.full(n, OP), physical_offset=at("physical_offset"),
                         total_size=at("total_size"), queue_id=(np.where(qok, qv, 0), np.ones(n, bool)),
                         queue_offset=at("queue_offset"), store_timestamp=at("store_timestamp"),
                         crc=np.where(crc_ok, np.where(crc_v != 0, CRC_TRUE, CRC_FALSE), 0),
                         piece=pieces, half_offset=_half_offsets(pieces))


def op_evidence(o: dict) -> list:
    """OP rows of one op message (a dict with the op_rows_evidence columns and ``broker``) as objects with
    attributes: the per-message view of op_rows_evidence (tests, notebooks)."""
    body = o["body"]
    typ = pa.binary() if isinstance(body, (bytes, bytearray, memoryview)) else pa.string()
    row = {k: [o[k]] for k in ("physical_offset", "queue_id", "queue_offset", "store_timestamp",
                               "total_size", "body_crc_ok")}
    tbl = pa.table(dict(row, body=pa.array([None if body is None else bytes(body) if typ == pa.binary()
                                            else str(body)], typ)))
    ev = op_rows_evidence(tbl)
    out = []
    for k in range(ev.n):
        ho, ok = ev.i["half_offset"]
        out.append(SimpleNamespace(broker=o["broker"], role=OP, physical_offset=o["physical_offset"],
                                   queue_offset=o["queue_offset"], piece=ev.s["piece"][k].as_py(),
                                   half_offset=int(ho[k]) if ok[k] else None))
    return out


def statetable_evidence(t: pa.Table) -> Evidence:
    n = t.num_rows
    co = t.column("commitlog_offset").combine_chunks()
    return Evidence.part(n, role=np.full(n, ST), tx=p_tx(co), physical_offset=ints(co),
                         queue_offset=ints(t.column("index")), st_state=strings(t.column("state")),
                         pto=ints(co))


def redolog_evidence(t: pa.Table) -> Evidence:
    kind = strings(t.column("kind"))
    keep = np.nonzero(~np.asarray(kind.is_null()))[0] if len(kind) else np.zeros(0, np.int64)
    t = t.take(pa.array(keep, pa.int64()))
    n = t.num_rows
    prep = _np(pc.equal(kind.take(pa.array(keep, pa.int64())), "PREPARED"))
    co, tags = t.column("commitlog_offset").combine_chunks(), t.column("tags_code").combine_chunks()
    return Evidence.part(n, role=np.where(prep, REDO_P, REDO_E),
                         tx=pc.if_else(pa.array(prep), p_tx(co), p_tx(tags)), physical_offset=ints(co),
                         queue_offset=ints(t.column("index")), pto=where(prep, _none(n), ints(tags)))


def _max_at(n_keys: int, ids: np.ndarray, col: Nullable) -> Nullable:
    """Per key id: max of the valid values (null when none)."""
    v, ok = col
    out = np.full(n_keys, np.iinfo(np.int64).min, np.int64)
    np.maximum.at(out, ids[ok], v[ok])
    has = np.zeros(n_keys, bool)
    has[ids[ok]] = True
    return np.where(has, out, 0), has


def _string_max_at(n_keys: int, ids: np.ndarray, s: pa.Array, rows: np.ndarray) -> pa.Array:
    """Per key id: the largest string of ``s[rows]`` (null when none)."""
    rank, ok = str_rank(s.take(pa.array(rows, pa.int64())))     # ranks among those rows only: fewer to rank
    best, has = _max_at(n_keys, ids, (rank, ok))
    where = np.full(int(rank.max(initial=0)) + 1, -1, np.int64)
    where[rank[ok]] = rows[ok]
    return take(s, np.where(has, where[best], -1))


def own_tx(ev: Evidence) -> pa.Array:
    """Per row: the id an END row has by its own properties (its (UNIQ_KEY, PGROUP, topic) id for a half-queue
    END with a UNIQ_KEY, else "P" + PREPARED_TRANSACTION_OFFSET); meaningful on END rows only."""
    if not ev.n:
        return pa.nulls(0, pa.string())
    uk_ok = ~np.asarray(ev.s["uniq_key"].is_null())
    return pc.if_else(pa.array(uk_ok & (ev.c["mechanism"] == HALF_Q)),
                      uniq_tx(ev.s["uniq_key"], ev.s["pgroup"], ev.s["real_topic"]),
                      p_tx(to_arrow_nullable(ev.i["pto"])))


def link_ends(ev: Evidence) -> None:
    """END rows take the id of the copy PREPARED_TRANSACTION_OFFSET points to (target_*), else the
    (UNIQ_KEY, PGROUP, topic) id the copies would have, else "P" + pto; copies learn ``committed``.  Where two
    copies share an offset the largest value wins (as the Spark plan's max over a window did)."""
    role, i = ev.c["role"], ev.i
    copies = np.nonzero(role == COPY)[0]
    pto_v, pto_ok = i["pto"]
    ends = np.nonzero((role == END) & pto_ok)[0]
    pv, pok = i["physical_offset"]
    e_ids, c_ids = lookup_ids([(pto_v[ends], pto_ok[ends])], [(pv[copies], pok[copies])])
    nk = int(max(e_ids.max(initial=-1), c_ids.max(initial=-1))) + 1
    found = np.zeros(nk, bool)
    found[c_ids] = True
    hit = found[e_ids] if len(ends) else np.zeros(0, bool)
    tx_at = _string_max_at(nk, c_ids, ev.s["tx"], copies)
    n = ev.n
    target_tx_idx = np.full(n, -1, np.int64)
    t_tx = pa.nulls(n, pa.string())
    if len(ends):
        e_tx = take(tx_at, np.where(hit, e_ids, -1))
        pos = np.full(n, -1, np.int64)
        pos[ends] = np.arange(len(ends))
        t_tx = take(e_tx, pos)
        for name, src in (("target_qid", "queue_id"), ("target_qo", "queue_offset")):
            mv, mok = _max_at(nk, c_ids, (i[src][0][copies], i[src][1][copies]))
            v, ok = np.zeros(n, np.int64), np.zeros(n, bool)
            v[ends], ok[ends] = mv[e_ids], mok[e_ids] & hit
            i[name] = (v, ok)
        cm = ev.c["mechanism"][copies]
        mm, mok = _max_at(nk, c_ids, (cm.astype(np.int64), cm > 0))
        tm = np.zeros(n, np.int8)
        tm[ends] = np.where(mok[e_ids] & hit, mm[e_ids], 0)
        ev.c["target_mech"] = tm
        target_tx_idx[ends] = np.where(hit, 0, -1)
    has_target = ~np.asarray(t_tx.is_null()) if n else np.zeros(0, bool)
    ev.c["has_target"] = has_target.astype(np.int8)
    is_end = role == END
    ev.s["tx"] = pc.if_else(pa.array(is_end), pc.coalesce(t_tx, own_tx(ev)), ev.s["tx"])
    commits = np.nonzero(is_end & (ev.c["end_type"] == COMMIT_T) & pto_ok)[0]
    committed = np.zeros(n, bool)
    committed[copies] = member([(pv[copies], pok[copies])], [(pto_v[commits], pto_ok[commits])])
    ev.c["committed"] = committed.astype(np.int8)


def to_arrow_nullable(col: Nullable) -> pa.Array:
    return pa.array(col[0], pa.int64(), mask=~col[1])


def link_ops(ev: Evidence) -> Evidence:
    """OP rows find the half copy with the QUEUEOFFSET they name (tx, copy_committed; tx null = orphan op);
    half copies, their ORIGREF twins (keyed by TRAN_PREPARED_QUEUE_OFFSET) and COMMIT ENDs pointing to a
    copy learn ``named``.  Returns the evidence with the ORIGREF rows appended."""
    role, i, n = ev.c["role"], ev.i, ev.n
    halves = np.nonzero((role == COPY) & (ev.c["mechanism"] == HALF_Q))[0]
    ops = np.nonzero(role == OP)[0]
    qid, qo, ho = i["queue_id"], i["queue_offset"], i["half_offset"]

    def sub(col, rows):
        return col[0][rows], col[1][rows]

    o_ids, h_ids = lookup_ids([sub(qid, ops), sub(ho, ops)], [sub(qid, halves), sub(qo, halves)])
    nk = int(max(o_ids.max(initial=-1), h_ids.max(initial=-1))) + 1
    found = np.zeros(nk, bool)
    found[h_ids] = True
    comm = np.zeros(nk, bool)
    comm[h_ids[ev.c["committed"][halves] > 0]] = True
    tx_at = _string_max_at(nk, h_ids, ev.s["tx"], halves)
    if len(ops):
        hit = found[o_ids]
        pos = np.full(n, -1, np.int64)
        pos[ops] = np.where(hit, o_ids, -1)
        ev.s["tx"] = pc.if_else(pa.array(role == OP), take(tx_at, pos), ev.s["tx"])
        cc = np.zeros(n, np.int8)
        cc[ops] = comm[o_ids] & hit
        ev.c["copy_committed"] = cc
    op_keys = [sub(qid, ops), sub(ho, ops)]
    named = np.zeros(n, bool)
    named[halves] = member([sub(qid, halves), sub(qo, halves)], op_keys)
    tqid, tqo = i["target_qid"], i["target_qo"]
    commit_ends = np.nonzero((role == END) & (ev.c["end_type"] == COMMIT_T) & tqo[1])[0]
    named[commit_ends] = member([sub(tqid, commit_ends), sub(tqo, commit_ends)], op_keys)
    ev.c["named"] = named.astype(np.int8)
    orig_rows = halves[i["tran_prepared_qo"][1][halves]]
    orig = ev.rows(orig_rows)
    orig.c["role"] = np.full(orig.n, ORIGREF, np.int8)
    orig.c["named"] = member([sub(qid, orig_rows), sub(i["tran_prepared_qo"], orig_rows)],
                             op_keys).astype(np.int8)
    return Evidence.concat([ev, orig])


def key_mismatch(ev: Evidence) -> np.ndarray:
    """Linked END rows of a half-queue transaction (with a UNIQ_KEY) whose PREPARED_TRANSACTION_OFFSET found a
    half copy of another (UNIQ_KEY, PGROUP, REAL_TOPIC) id than the END's own.  EndTransactionProcessor reads
    the half at that offset and copies its properties into the END it writes (endMessageTransaction; topic =
    the half's REAL_TOPIC), so RocketMQ never writes such a pair: one of the two records was damaged after
    the write (their properties are covered by no checksum before 5.2, and only optionally after)."""
    if not ev.n:
        return np.zeros(0, bool)
    c = ev.c
    cand = ((c["role"] == END) & (c["has_target"] > 0) & (c["target_mech"] == HALF_Q) & (c["mechanism"] == HALF_Q)
            & ~np.asarray(ev.s["uniq_key"].is_null()))
    rows = np.nonzero(cand)[0]
    if len(rows):
        sub = ev.rows(rows)
        cand[rows] = _np(pc.not_equal(own_tx(sub), sub.s["tx"]))
    return cand


def tid_tx(ev: Evidence) -> pa.Array:
    """Per row: for a half-queue COPY, END or DISCARD row with a ``__transactionId__`` property and another
    UNIQ_KEY or none, the (``__transactionId__``, PGROUP, topic) id; else null.  A 5.1+ broker sets
    ``__transactionId__`` = UNIQ_KEY on every half it stores with a UNIQ_KEY, and only there
    (TransactionalMessageBridge.parseHalfMessageInner), and every record made from the half (re-put copy,
    discard, COMMIT / ROLLBACK) copies both properties, so on such a store a difference (or a UNIQ_KEY whose
    name or separator was damaged, so that it no longer parses) proves that one of the two was damaged after
    the write; which one is not known, hence the second id.  Older brokers store the property as the client sent it (jobs/reconstruct/
    rules.py only acts on it for the 5.1+ profile)."""
    if not ev.n:
        return pa.nulls(0, pa.string())
    c, uk, tid = ev.c, ev.s["uniq_key"], ev.s["transaction_id"]
    rec = (((c["role"] == COPY) | (c["role"] == END)) & (c["mechanism"] == HALF_Q)) | (c["role"] == DISCARD)
    differ = (_np(pc.not_equal(uk, tid)) | (np.asarray(uk.is_null()) & np.asarray(tid.is_valid()))) & rec
    rows = np.nonzero(differ)[0]
    none = pa.nulls(ev.n, pa.string())
    if not len(rows):           # the ids are built for the (rare) differing rows only
        return none
    at = pa.array(rows, pa.int64())
    return pc.replace_with_mask(none, pa.array(differ),
                                uniq_tx(tid.take(at), ev.s["pgroup"].take(at), ev.s["real_topic"].take(at)))


def tid_mismatch(ev: Evidence) -> np.ndarray:
    """Rows with a ``tid_tx`` (their ``__transactionId__`` and UNIQ_KEY differ)."""
    return ~np.asarray(tid_tx(ev).is_null()) if ev.n else np.zeros(0, bool)


def cross_refs(ev: Evidence) -> Evidence:
    """The twins of linked evidence, to append to it (after the ORIGREF rows): XREF twins of the
    ``key_mismatch`` END rows, keyed by the END's own id, so that the transaction whose key the END carries
    sees it; then TIDREF twins of the rows with a ``tid_tx`` other than their own ``tx``, keyed by it
    (jobs/reconstruct/rules.py flags both transactions of either pair)."""
    rows = np.nonzero(key_mismatch(ev))[0]
    x = ev.rows(rows)
    x.s["tx"] = own_tx(x)
    x.c["role"] = np.full(x.n, XREF, np.int8)
    tid = tid_tx(ev)
    t_rows = np.nonzero(_np(pc.not_equal(tid, pc.fill_null(ev.s["tx"], ""))))[0]
    t = ev.rows(t_rows)
    t.s["tx"] = tid.take(pa.array(t_rows, pa.int64()))
    t.c["role"] = np.full(t.n, TIDREF, np.int8)
    return Evidence.concat([x, t])


__all__ = ["Evidence", "COPY", "END", "OP", "DISCARD", "ST", "REDO_P", "REDO_E", "ORIGREF", "HALF_Q",
           "PREP_R", "XREF", "TIDREF", "COMMIT_T", "ROLLBACK_T", "CRC_FALSE", "CRC_TRUE", "MECH_NAMES", "is_system_topic",
           "is_system_topic_mask", "spark_long", "record_evidence", "op_rows_evidence", "op_evidence",
           "statetable_evidence", "redolog_evidence", "body_texts", "link_ends", "link_ops", "key_ids", "own_tx",
           "key_mismatch", "tid_tx", "tid_mismatch", "cross_refs"]
