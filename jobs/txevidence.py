"""Evidence rows of the reconstruction and their linking (Spark-free: Python + pyarrow only).

Every record that says something about a transaction becomes one ``Ev`` (role COPY, END, OP, DISCARD, ST,
REDO_P, REDO_E, ORIGREF or PROBLEM) carrying a transaction id ``tx``.  The rules are those of the store-format
reference sections 7, 8, 10 and 11 (see jobs/reconstruct.py for the summary):

* COPY: half copies (topic RMQ_SYS_TRANS_HALF_TOPIC; id from (UNIQ_KEY, PGROUP, REAL_TOPIC), else the copy's
  own offset) and PREPARED records in real topics (one transaction each: "P" + offset).
* END: COMMIT / ROLLBACK records in real topics; DISCARD: TRANS_CHECK_MAX_TIME_TOPIC records; OP: one per
  half offset named in an op body (``1234`` up to 5.0, ``1,2,3,`` from 5.1); ST / REDO_P / REDO_E: 3.x
  statetable and redolog units.
* link_ends: an END finds the copy its PREPARED_TRANSACTION_OFFSET points to (by CommitLog offset), takes its
  id; the copy learns whether a COMMIT points to it.
* link_ops: an OP finds the half copy whose QUEUEOFFSET it names (by half queue id and offset); copies learn
  whether an op names them, directly or through their TRAN_PREPARED_QUEUE_OFFSET (ORIGREF).

Both links are dictionary look-ups over one broker's rows: one pass each, no sort.
"""

from __future__ import annotations

import re
from typing import Dict, List, Optional

from jobs.txparams import (
    DISCARD_TOPIC, HALF_QUEUE, HALF_TOPIC, OP_TOPIC, PREPARED_RECORD, SCHEDULE_TOPIC, SEP, TIMER_TOPIC,
)

COPY, END, OP, DISCARD, ST, REDO_P, REDO_E, ORIGREF, PROBLEM = (
    "COPY", "END", "OP", "DISCARD", "ST", "REDO_P", "REDO_E", "ORIGREF", "PROBLEM")
_SYSTEM_EXACT = frozenset((HALF_TOPIC, OP_TOPIC, DISCARD_TOPIC, SCHEDULE_TOPIC, TIMER_TOPIC))
_SYSTEM_PREFIXES = ("%RETRY%", "%DLQ%", "rmq_sys_", "RMQ_SYS_")
# Spark's string -> bigint cast (what the Spark plan used): optional sign, digits, optional ".digits" dropped
_LONG_RE = re.compile(r"^([+-]?\d+)(\.\d*)?$")
_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1


class Ev:
    """One evidence row.  Unset attributes are None (class defaults, so a row stores only what it has);
    linking adds target_* / committed / copy_committed / named."""

    FIELDS = ("role", "broker", "tx", "mechanism", "physical_offset", "total_size", "queue_id",
              "queue_offset", "store_timestamp", "born_timestamp", "msg_id", "body_crc_ok", "uniq_key",
              "transaction_id", "keys", "pgroup", "real_topic", "real_qid", "check_times", "tran_prepared_qo",
              "immunity_s", "end_type", "pto", "half_offset", "piece", "st_state", "target_tx", "target_qid",
              "target_qo", "target_mech", "committed", "copy_committed", "named")

    def __init__(self, role: str, broker: str, **kw):
        self.__dict__.update(kw)
        self.role = role
        self.broker = broker

    def copy(self, role: str) -> "Ev":
        e = Ev(role, self.broker)
        e.__dict__.update(self.__dict__)
        e.role = role
        return e


for _name in Ev.FIELDS[2:]:
    setattr(Ev, _name, None)


def is_system_topic(topic: Optional[str]) -> bool:
    return topic is not None and (topic in _SYSTEM_EXACT or topic.startswith(_SYSTEM_PREFIXES))


def uniq_tx_id(uniq_key: str, pgroup: Optional[str], real_topic: Optional[str]) -> str:
    return SEP.join(("U", uniq_key, pgroup or "", real_topic or ""))


def p_tx_id(offset: Optional[int]) -> Optional[str]:
    return None if offset is None else f"P{SEP}{offset}"


def spark_long(piece: str) -> Optional[int]:
    """``try_cast(piece AS BIGINT)`` as Spark does it (surrounding whitespace allowed, a fraction dropped)."""
    m = _LONG_RE.match(piece.strip())
    if m is None:
        return None
    v = int(m.group(1))
    return v if _LONG_MIN <= v <= _LONG_MAX else None


def _common(r: dict) -> dict:
    return dict(physical_offset=r["physical_offset"], total_size=r["total_size"], queue_id=r["queue_id"],
                queue_offset=r["queue_offset"], store_timestamp=r["store_timestamp"],
                born_timestamp=r["born_timestamp"], msg_id=r["msg_id"], body_crc_ok=r["body_crc_ok"],
                uniq_key=r["uniq_key"], transaction_id=r["transaction_id"], keys=r["keys"],
                pgroup=r["pgroup"],
                real_topic=r["real_topic"], real_qid=r["real_qid"])


def record_evidence(r: dict) -> Optional[Ev]:
    """COPY / END / DISCARD row of one transaction-relevant CommitLog record (None: not evidence)."""
    topic, ttype, b = r["topic"], r["transaction_type"], r["broker"]
    if topic == HALF_TOPIC:
        uk = r["uniq_key"]
        tx = (uniq_tx_id(uk, r["pgroup"], r["real_topic"]) if uk is not None
              else f"O{SEP}{r['physical_offset']}")
        return Ev(COPY, b, tx=tx, mechanism=HALF_QUEUE, check_times=r["transaction_check_times"],
                  tran_prepared_qo=r["tran_prepared_queue_offset"], immunity_s=r["check_immunity_time_s"],
                  **_common(r))
    if topic == DISCARD_TOPIC:
        uk = r["uniq_key"]
        tx = (uniq_tx_id(uk, r["pgroup"], r["real_topic"]) if uk is not None
              else f"D{SEP}{r['physical_offset']}")
        return Ev(DISCARD, b, tx=tx, check_times=r["transaction_check_times"], **_common(r))
    if is_system_topic(topic) or topic is None:
        return None
    if ttype == "PREPARED":
        ev = Ev(COPY, b, tx=p_tx_id(r["physical_offset"]), mechanism=PREPARED_RECORD,
                check_times=r["transaction_check_times"], tran_prepared_qo=r["tran_prepared_queue_offset"],
                immunity_s=r["check_immunity_time_s"], **_common(r))
        ev.real_topic, ev.real_qid = topic, r["queue_id"]
        return ev
    if ttype in ("COMMIT", "ROLLBACK"):
        ev = Ev(END, b, end_type=ttype, pto=r["prepared_transaction_offset"],
                mechanism=HALF_QUEUE if r["real_topic"] is not None else PREPARED_RECORD, **_common(r))
        ev.real_topic = r["real_topic"] if r["real_topic"] is not None else topic
        ev.real_qid = r["real_qid"] if r["real_qid"] is not None else r["queue_id"]
        return ev
    return None


def body_text(body) -> str:
    if body is None:
        return ""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body).decode("utf-8", "replace")
    return str(body)


def op_evidence(o: dict) -> List[Ev]:
    """OP rows of one op message: one per non-empty piece of its body (``1234`` or ``1,2,3,``).  half_offset
    is None for a piece that is not a number (OP_BODY_UNPARSABLE)."""
    out = []
    for piece in body_text(o["body"]).split(","):
        piece = piece.strip(" ")
        if piece == "":
            continue
        out.append(Ev(OP, o["broker"], physical_offset=o["physical_offset"], total_size=o["total_size"],
                      queue_id=o["queue_id"] if o["queue_id"] is not None else 0,
                      queue_offset=o["queue_offset"], store_timestamp=o["store_timestamp"],
                      body_crc_ok=o["body_crc_ok"], piece=piece, half_offset=spark_long(piece)))
    return out


def statetable_evidence(u: dict) -> Ev:
    return Ev(ST, u["broker"], tx=p_tx_id(u["commitlog_offset"]), physical_offset=u["commitlog_offset"],
              queue_offset=u["index"], st_state=u["state"], pto=u["commitlog_offset"])


def redolog_evidence(u: dict) -> Optional[Ev]:
    if u["kind"] == "PREPARED":
        return Ev(REDO_P, u["broker"], tx=p_tx_id(u["commitlog_offset"]),
                  physical_offset=u["commitlog_offset"],
                  queue_offset=u["index"])
    if u["kind"] is None:
        return None
    return Ev(REDO_E, u["broker"], tx=p_tx_id(u["tags_code"]), physical_offset=u["commitlog_offset"],
              queue_offset=u["index"], pto=u["tags_code"])


def _max(a, b):
    return b if a is None else a if b is None else max(a, b)


def link_ends(rows: List[Ev]) -> None:
    """END rows take the id of the copy PREPARED_TRANSACTION_OFFSET points to (target_*), else the
    (UNIQ_KEY, PGROUP, topic) id the copies would have, else "P" + pto; copies learn ``committed``.  Where two
    copies share an offset the largest value wins (as the Spark plan's max over a window did)."""
    copies: Dict[tuple, list] = {}
    for e in rows:
        if e.role == COPY:
            k = (e.broker, e.physical_offset)
            t = copies.get(k)
            copies[k] = ([e.tx, e.queue_id, e.queue_offset, e.mechanism] if t is None else
                         [_max(t[0], e.tx), _max(t[1], e.queue_id), _max(t[2], e.queue_offset),
                          _max(t[3], e.mechanism)])
    committed = set()
    for e in rows:
        if e.role != END:
            continue
        t = copies.get((e.broker, e.pto)) if e.pto is not None else None
        if t is not None:
            e.target_tx, e.target_qid, e.target_qo, e.target_mech = t
        if e.end_type == "COMMIT" and e.pto is not None:
            committed.add((e.broker, e.pto))
        e.tx = (e.target_tx if e.target_tx is not None else
                uniq_tx_id(e.uniq_key, e.pgroup, e.real_topic)
                if e.uniq_key is not None and e.mechanism == HALF_QUEUE else p_tx_id(e.pto))
    for e in rows:
        if e.role == COPY and (e.broker, e.physical_offset) in committed:
            e.committed = True


def link_ops(rows: List[Ev]) -> List[Ev]:
    """OP rows find the half copy with the QUEUEOFFSET they name (tx, copy_committed; tx None = orphan op);
    half copies, their ORIGREF twins (keyed by TRAN_PREPARED_QUEUE_OFFSET) and COMMIT ENDs pointing to a
    copy learn ``named``.  Returns the ORIGREF rows (appended to ``rows`` too)."""
    copies: Dict[tuple, list] = {}
    for e in rows:
        if e.role == COPY and e.mechanism == HALF_QUEUE:
            k = (e.broker, e.queue_id, e.queue_offset)
            t = copies.get(k)
            copies[k] = ([e.tx, e.committed] if t is None else [_max(t[0], e.tx), _max(t[1], e.committed)])
    named = set()
    for e in rows:
        if e.role == OP:
            k = (e.broker, e.queue_id, e.half_offset)
            named.add(k)
            t = copies.get(k)
            if t is not None:
                e.tx, e.copy_committed = t
    orig = []
    for e in list(rows):
        if e.role == COPY and e.mechanism == HALF_QUEUE:
            if (e.broker, e.queue_id, e.queue_offset) in named:
                e.named = True
            if e.tran_prepared_qo is not None:
                o = e.copy(ORIGREF)
                o.named = True if (e.broker, e.queue_id, e.tran_prepared_qo) in named else None
                orig.append(o)
        elif (e.role == END and e.end_type == "COMMIT" and e.target_qo is not None
              and (e.broker, e.target_qid, e.target_qo) in named):
            e.named = True
    rows.extend(orig)
    return orig


__all__ = ["Ev", "COPY", "END", "OP", "DISCARD", "ST", "REDO_P", "REDO_E", "ORIGREF", "PROBLEM",
           "is_system_topic", "uniq_tx_id", "p_tx_id", "spark_long", "record_evidence", "op_evidence",
           "statetable_evidence", "redolog_evidence", "body_text", "link_ends", "link_ops"]
