"""Hand-built reconstruction scenarios for tests/test_reconstruct.py: one tiny broker each, as rows of the
reconstruction's inputs (CommitLog records, consume-queue units, 3.x statetable units and redolog records,
consumer offsets).  :func:`scenario_rows` builds them all; the record builders (:func:`half`, :func:`commit`,
:func:`op`, :func:`discard`, :func:`prepared`, ...) make one row each.
"""

from __future__ import annotations

import truth_frames as tf

H, OPT, DT = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"


def half(b, off, qo, uniq, ct=None, *, born=0, store=None, pgroup="PG", topic="T", imm=None, tpqo=None, **kw):
    props = {
        "UNIQ_KEY": uniq,
        "PGROUP": pgroup,
        "REAL_TOPIC": topic,
        "REAL_QID": 1,
        "TRAN_MSG": "true",
        "KEYS": f"K-{uniq}",
    }
    if ct is not None:
        props["TRANSACTION_CHECK_TIMES"] = ct
    if imm is not None:
        props["CHECK_IMMUNITY_TIME_IN_SECONDS"] = imm
    if tpqo is not None:
        props["TRAN_PREPARED_QUEUE_OFFSET"] = tpqo
    return tf.commitlog_row(
        b,
        off,
        H,
        props=props,
        queue_offset=qo,
        born_timestamp=born,
        store_timestamp=off if store is None else store,
        **kw,
    )


def commit(b, off, pto, uniq, *, pgroup="PG", topic="T", **kw):
    props = {
        "UNIQ_KEY": uniq,
        "PGROUP": pgroup,
        "REAL_TOPIC": topic,
        "REAL_QID": 1,
        "TRAN_MSG": "true",
        "KEYS": f"K-{uniq}",
    }
    return tf.commitlog_row(
        b,
        off,
        topic,
        props=props,
        transaction_type="COMMIT",
        prepared_transaction_offset=pto,
        queue_id=1,
        store_timestamp=off,
        **kw,
    )


def op(b, off, oqo, body, **kw):
    return tf.commitlog_row(
        b,
        off,
        OPT,
        props={"TAGS": "d", "WAIT": "true"},
        queue_offset=oqo,
        body=body.encode(),
        store_timestamp=off,
        **kw,
    )


def discard(b, off, uniq, ct, *, pgroup="PG", topic="T", **kw):
    props = {
        "UNIQ_KEY": uniq,
        "PGROUP": pgroup,
        "REAL_TOPIC": topic,
        "REAL_QID": 1,
        "TRAN_MSG": "true",
        "TRANSACTION_CHECK_TIMES": ct,
        "KEYS": f"K-{uniq}",
    }
    return tf.commitlog_row(b, off, DT, props=props, store_timestamp=off, **kw)


def prepared(b, off, qo, *, tt="PREPARED", pto=0, uniq=None, key=None, **kw):
    props = {"PGROUP": "PG3", "TRAN_MSG": "true", "KEYS": key or f"P{off}"}
    if uniq:
        props["UNIQ_KEY"] = uniq
    return tf.commitlog_row(
        b,
        off,
        "T3",
        props=props,
        transaction_type=tt,
        queue_offset=qo,
        prepared_transaction_offset=pto,
        store_timestamp=off,
        **kw,
    )


def co(b, half_offset, op_offset):
    return [
        {
            "broker": b,
            "file": "config/consumerOffset.json",
            "topic": t,
            "group": "CID_RMQ_SYS_TRANS",
            "queue_id": 0,
            "offset": o,
        }
        for t, o in ((H, half_offset), (OPT, op_offset))
    ]


def cq(b, topic, qo, off, size=100):
    return {
        "broker": b,
        "file": f"consumequeue/{topic}/0/{0:020d}",
        "file_position": qo * 20,
        "topic": topic,
        "queue_id": 0,
        "queue_offset": qo,
        "commitlog_offset": off,
        "size": size,
        "tags_code": 0,
    }


def st_unit(b, index, off, state):
    return {
        "broker": b,
        "file": "transaction/statetable/00000000000000000000",
        "index": index,
        "commitlog_offset": off,
        "size": 100,
        "store_timestamp_s": 0,
        "producer_group_hash": 0,
        "state": state,
    }


def redo(b, index, off, tags_code):
    return {
        "broker": b,
        "file": "transaction/redolog/x",
        "index": index,
        "commitlog_offset": off,
        "size": 100,
        "tags_code": tags_code,
        "kind": "PREPARED" if tags_code == -1 else "END",
    }


SCENARIO_BROKERS = (
    "s-newest",
    "s-group",
    "s-dup",
    "s-noop",
    "s-orphan",
    "s-below",
    "s-conflict",
    "s-discard",
    "s-deleted",
    "s-cq",
    "s-corrupt",
    "s-deadline",
    "s-3x",
    "s-40",
    "s-resume",
    "s-nocof",
    "s-xkey",
)


def scenario_rows():
    cl, cqs, sts, redos, cos = [], [], [], [], []
    # commit joined via the NEWEST copy (the one the check re-put and the producer answered)
    b = "s-newest"
    cl += [
        half(b, 0, 0, "U1"),
        half(b, 100, 1, "U1", ct=1, store=61000),
        commit(b, 200, 100, "U1"),
        op(b, 300, 0, "1"),
    ]
    cos += co(b, 2, 1)
    # copies of different producer groups / real topics are different transactions; no UNIQ_KEY -> own offset
    b = "s-group"
    cl += [
        half(b, 0, 0, "U1"),
        half(b, 100, 1, "U1", ct=1),
        half(b, 200, 2, "U1", pgroup="OTHER"),
        half(b, 300, 3, "U1", topic="T2"),
        # (parseHalfMessageInner sets REAL_TOPIC and REAL_QID on every half)
        tf.commitlog_row(b, 400, H, props={"PGROUP": "PG", "REAL_TOPIC": "T", "REAL_QID": 1}, queue_offset=4),
        # a COMMIT-typed retry copy of a committed message: not a commit record
        tf.commitlog_row(
            b,
            500,
            "%RETRY%CG",
            props={"UNIQ_KEY": "U1", "PGROUP": "PG", "TRAN_MSG": "true"},
            transaction_type="COMMIT",
        ),
        op(b, 600, 0, "4"),
    ]
    # duplicate commit (5.x op batching): two COMMIT records for two copies, one comma-batched op for both
    b = "s-dup"
    cl += [
        half(b, 0, 0, "U2"),
        half(b, 100, 1, "U2", ct=1),
        commit(b, 200, 0, "U2"),
        commit(b, 300, 100, "U2"),
        op(b, 400, 0, "0,1,"),
    ]
    cos += co(b, 2, 1)
    # commit without op (crash between commit and op, or lost 5.x op batch)
    b = "s-noop"
    cl += [half(b, 0, 0, "U3"), commit(b, 200, 0, "U3")]
    cos += co(b, 0, 0)
    # orphan ops: one naming no half, one below the oldest retained half, one unparsable
    b = "s-orphan"
    cl += [half(b, 1000, 5, "U4"), op(b, 2000, 0, "99"), op(b, 2100, 1, "2"), op(b, 2200, 2, "x,")]
    # op not yet consumed by the checker but naming a copy below the half consume offset
    b = "s-below"
    cl += [half(b, 0, 3, "U5"), op(b, 100, 0, "3")]
    cos += co(b, 10, 0)
    # commit for one copy, op (= rollback) for another copy without commit
    b = "s-conflict"
    cl += [
        half(b, 0, 0, "U6"),
        half(b, 100, 1, "U6", ct=1),
        commit(b, 200, 100, "U6"),
        op(b, 300, 0, "0"),
        op(b, 400, 1, "1"),
    ]
    cos += co(b, 2, 2)
    # discarded without resolution
    b = "s-discard"
    cl += [half(b, 0, 0, "U7"), half(b, 100, 1, "U7", ct=1), discard(b, 200, "U7", 1)]
    cos += co(b, 2, 0)
    # commit whose half lies in a CommitLog file already deleted (oldest retained file starts at 4096)
    b = "s-deleted"
    cl += [commit(b, 5000, 100, "U8", file_start=4096)]
    # only a re-put copy survives (the original was in the deleted file); an op names the copy
    cl += [half(b, 5200, 7, "U19", ct=1, file_start=4096), op(b, 5300, 0, "7", file_start=4096)]
    # CQ disagreements in the half queue: unit with a wrong size, record without unit
    b = "s-cq"
    cl += [half(b, 0, 0, "U9"), half(b, 100, 1, "U10")]
    cqs += [cq(b, H, 0, 0, size=99)]
    # an END whose UNIQ_KEY is not that of the half copy it names (EndTransactionProcessor copies the half's
    # properties into it): a bit flip in the newest copy's UNIQ_KEY (U20 -> UX20, U21 -> UX21); U22 intact
    b = "s-xkey"
    cl += [
        half(b, 0, 0, "U20"),
        half(b, 100, 1, "UX20", ct=1),
        commit(b, 200, 100, "U20"),
        op(b, 300, 0, "1"),
        half(b, 400, 2, "U21"),
        half(b, 500, 3, "UX21", ct=1),
        commit(b, 600, 500, "U21"),
        op(b, 700, 1, "2"),
        op(b, 800, 2, "3"),
        half(b, 900, 4, "U22"),
        commit(b, 1000, 900, "U22"),
        op(b, 1100, 3, "4"),
    ]
    cos += co(b, 5, 4)
    # corrupt record
    b = "s-corrupt"
    cl += [half(b, 0, 0, "U11", body_crc_ok=False)]
    # deadlines: never checked; at check max; immunity not yet due; immunity re-put covered by the original's
    # op
    b = "s-deadline"
    cl += [
        half(b, 0, 0, "U12", born=0, store=0),
        half(b, 100, 1, "U13", born=0, store=0),
        half(b, 200, 2, "U13", ct=15, born=0, store=50000),
        half(b, 300, 3, "U14", born=0, store=0, imm=60),
        half(b, 400, 4, "U15", born=0, store=0, imm=1),
        half(b, 500, 5, "U15", ct=1, born=0, store=2000, imm=1, tpqo=4),
        op(b, 600, 0, "4"),
    ]
    cos += co(b, 0, 0)
    # 3.x: statetable + redolog vs CommitLog
    b = "s-3x"
    cl += [
        prepared(b, 1000, 0),
        prepared(b, 2000, 1),
        prepared(b, 3000, 2),
        prepared(b, 6000, 7),
        prepared(b, 7000, 4),
        prepared(b, 4000, 0, tt="COMMIT", pto=1000),
        prepared(b, 5000, 1, tt="ROLLBACK", pto=2000),
        prepared(b, 8000, 1, tt="COMMIT", pto=7000),
        # after the record of the statetable's newest unit (9999): a redolog not yet dispatched that far, not
        # one that lost units (damage.redolog_units_lost)
        prepared(b, 10500, 4, tt="ROLLBACK", pto=7000),
    ]
    sts += [
        st_unit(b, 0, 1000, "COMMIT"),
        st_unit(b, 1, 2000, "PREPARED"),
        st_unit(b, 3, 6000, "PREPARED"),
        st_unit(b, 4, 7000, "COMMIT"),
        st_unit(b, 5, 9999, "PREPARED"),
    ]
    redos += [
        redo(b, 0, 1000, -1),
        redo(b, 1, 2000, -1),
        redo(b, 2, 3000, -1),
        redo(b, 3, 4000, 1000),
        redo(b, 4, 5000, 2000),
        redo(b, 5, 6000, -1),
        redo(b, 6, 7000, -1),
        redo(b, 7, 8000, 7000),
    ]
    # discarded, then resumed (RESUME_CHECK_HALF_MESSAGE re-put with TRANSACTION_CHECK_TIMES=0)
    b = "s-resume"
    cl += [
        half(b, 0, 0, "U16"),
        half(b, 100, 1, "U16", ct=1),
        discard(b, 200, "U16", 1),
        half(b, 300, 2, "U16", ct=0),
    ]
    cos += co(b, 2, 0)
    # no consumer offsets known: an older copy without op is not pending (the newer copy superseded it)
    b = "s-nocof"
    cl += [
        half(b, 0, 0, "U17"),
        half(b, 100, 1, "U17", ct=1),
        commit(b, 200, 100, "U17"),
        op(b, 300, 0, "1"),
        half(b, 400, 2, "U18"),
        commit(b, 500, 400, "U18"),
    ]
    # 4.0-4.2: PREPARED records with UNIQ_KEY in the real topic, no statetable, no check service
    b = "s-40"
    cl += [
        prepared(b, 0, 0, uniq="U40"),
        prepared(b, 100, 0, uniq="U41"),
        prepared(b, 200, 0, tt="COMMIT", pto=100, uniq="U41"),
    ]
    return {
        "commitlog": cl,
        "consumequeue": cqs,
        "statetable": sts,
        "redolog": redos,
        "consumer_offsets": cos,
    }
