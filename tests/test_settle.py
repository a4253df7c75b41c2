"""jobs/reconstruct/settle.py on hand-built CommitLog rows (Spark-free, driver reducer): a settled
transaction carried as its row reduces, with the open rows, to what the reducer gives for all the records; a
later END or op naming it (a late producer commit, an op for an old half) is reported by ``reopened``, and
the run that sees it must be a full audit, whose result differs from the carried one."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct.params import CHECK_GROUP, DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from jobs.reconstruct.reducer import input_table, reduce_input
from jobs.reconstruct.settle import consume_offsets, final_input, reopened, settle
from schemas.state import STATE_OP_BODIES, STATE_RECORDS

B = "b1"
FILE = 1 << 20
T0 = 1_795_300_000_000


def _half(off, qo, uk, ts):
    return {"topic": HALF_TOPIC, "physical_offset": off, "queue_id": 0, "queue_offset": qo, "uniq_key": uk,
            "pgroup": "PG", "real_topic": "Orders", "real_qid": 1, "transaction_type": "PREPARED",
            "store_timestamp": ts, "born_timestamp": ts, "total_size": 200}


def _end(off, pto, uk, ts, kind="COMMIT"):
    return {"topic": "Orders", "physical_offset": off, "queue_id": 1, "queue_offset": off, "uniq_key": uk,
            "pgroup": "PG", "transaction_type": kind, "prepared_transaction_offset": pto, "store_timestamp": ts,
            "born_timestamp": ts, "total_size": 200}


def _op(off, qo, body, ts):
    return {"topic": OP_TOPIC, "physical_offset": off, "queue_id": 0, "queue_offset": qo, "store_timestamp": ts,
            "total_size": 100, "body": body}


def _records(rows):
    schema = STATE_RECORDS.arrow_schema()
    full = [{**{n: None for n in schema.names}, "broker": B, "file": "00000000000000000000",
             "magic_version": 1, "body_crc_ok": True, **r} for r in rows]
    for r in full:
        r["file_position"] = r["physical_offset"] % FILE
    return pa.Table.from_pylist(full, schema=schema)


def _bodies(records):
    ops = records.filter(pc.equal(records.column("topic"), OP_TOPIC))
    schema = STATE_OP_BODIES.arrow_schema()
    return pa.Table.from_arrays([ops.column(f.name).cast(f.type) for f in schema], schema=schema)


def _offsets(half, op):
    return pa.Table.from_pylist([{"broker": B, "topic": HALF_TOPIC, "group": CHECK_GROUP, "queue_id": 0,
                                  "offset": half},
                                 {"broker": B, "topic": OP_TOPIC, "group": CHECK_GROUP, "queue_id": 0,
                                  "offset": op}])


def _reduce(records, bodies, offsets, extra=None, final=None):
    t = input_table(commitlog=records.drop_columns(["body"]), op_bodies=bodies, consumer_offsets=offsets)
    if extra is not None:
        t = pa.concat_tables([t, extra.cast(t.schema)])
    return reduce_input(t, None, None, 60000, True, final)


def _sorted(t):
    return sorted(t.to_pylist(), key=repr)


# two settled transactions (A committed, B rolled back), two open ones at or above the half consume offset (C
# prepared, D rolled back), and a batched 5.1+ op naming B's and D's halves
OLD = [_half(0, 0, "A", T0), _end(300, 0, "A", T0 + 1), _half(600, 1, "B", T0 + 2), _op(900, 0, "0,", T0 + 3),
       _half(1300, 2, "C", T0 + 5), _half(1500, 3, "D", T0 + 6), _op(1700, 1, "1,3,", T0 + 7)]


def test_settled_rows_reduce_to_the_full_result_and_late_evidence_reopens():
    records = _records(OLD)
    bodies = _bodies(records)
    offsets = _offsets(2, 2)
    full = _reduce(records, bodies, offsets)
    assert sorted(full["transactions"].column("state").to_pylist()) == ["COMMITTED", "PREPARED", "ROLLED_BACK",
                                                                         "ROLLED_BACK"]
    got = settle(records, bodies, full["transactions"], consume_offsets(offsets), {B: FILE}, {B: [0, FILE]})
    assert sorted(got.final.column("uniq_key").to_pylist()) == ["A", "B"]
    # kept: C's and D's halves and the batched op, cut to D's piece (still comma-batched)
    assert sorted(got.records.column("physical_offset").to_pylist()) == [1300, 1500, 1700]
    assert got.op_bodies.column("body").to_pylist() == [b"3,"]
    # the next run: the open rows + the settled rows give what the reducer gives for every record
    extra = final_input(got.final, got.facts)
    again = _reduce(got.records, got.op_bodies, offsets, extra, got.final)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        assert _sorted(again[name]) == _sorted(full[name]), name
    assert reopened(got.final, again["transactions"], again["anomalies"],
                    {B: again["profiles"].column("profile")[0].as_py()}, consume_offsets(offsets)) == {}

    # later evidence naming a settled transaction: a late op for A's half, a producer's late ROLLBACK of B
    for late in ([_op(FILE + 10, 2, "0,", T0 + 9)], [_end(FILE + 20, 600, "B", T0 + 9, "ROLLBACK")]):
        new = _records(late)
        whole = pa.concat_tables([records, new])
        want = _reduce(whole, _bodies(whole), offsets)
        carried = pa.concat_tables([got.records, new])
        inc = _reduce(carried, pa.concat_tables([got.op_bodies, _bodies(new)]), offsets, extra, got.final)
        assert _sorted(inc["transactions"]) != _sorted(want["transactions"]) or \
            _sorted(inc["anomalies"]) != _sorted(want["anomalies"])      # carrying would be wrong here ...
        why = reopened(got.final, inc["transactions"], inc["anomalies"],
                       {B: inc["profiles"].column("profile")[0].as_py()}, consume_offsets(offsets))
        assert list(why) == [B], why                                     # ... and it is detected


def test_consume_offsets_below_the_settled_ones_reopen():
    records = _records(OLD)
    bodies = _bodies(records)
    full = _reduce(records, bodies, _offsets(2, 2))
    got = settle(records, bodies, full["transactions"], consume_offsets(_offsets(2, 2)), {B: FILE},
                 {B: [0, FILE]})
    why = reopened(got.final, full["transactions"].slice(0, 0), full["anomalies"].slice(0, 0),
                   {B: full["profiles"].column("profile")[0].as_py()}, consume_offsets(_offsets(1, 2)))
    assert "consume offsets" in why[B]


def test_nothing_settles_across_files_or_at_or_above_the_bound():
    records = _records(OLD)
    bodies = _bodies(records)
    offsets = _offsets(2, 2)
    txs = _reduce(records, bodies, offsets)["transactions"]
    # A's commit record in the next file: A spans two files
    split = settle(records, bodies, txs, consume_offsets(offsets), {B: FILE}, {B: [0, 200]})
    assert "A" not in split.final.column("uniq_key").to_pylist()
    # the bound below A's commit record: A may be read again
    below = settle(records, bodies, txs, consume_offsets(offsets), {B: 300}, {B: [0, FILE]})
    assert "A" not in below.final.column("uniq_key").to_pylist()


def _units(records):
    """Consume-queue units of the half / op records (as the broker dispatched them)."""
    rows = [{"broker": B, "topic": r["topic"], "queue_id": r["queue_id"], "queue_offset": r["queue_offset"],
             "commitlog_offset": r["physical_offset"], "size": r["total_size"]}
            for r in records.to_pylist() if r["topic"] in (HALF_TOPIC, OP_TOPIC)]
    return pa.Table.from_pylist(rows)


def torn_end_case():
    """(records, op bodies, consumer offsets, input table of the given records and bodies) of a store whose
    first file has a torn end (TRUNCATED_RECORD) before the records of two transactions (A, B) that settle with
    the consume offsets given, with every half / op unit; E, prepared in the first file, stays open."""
    f = FILE
    records = _records([_half(100, 0, "E", T0 - 1),
                        _half(f, 1, "A", T0), _end(f + 300, f, "A", T0 + 1), _half(f + 600, 2, "B", T0 + 2),
                        _op(f + 900, 0, "1,", T0 + 3), _half(f + 1300, 3, "C", T0 + 5),
                        _half(f + 1500, 4, "D", T0 + 6), _op(f + 1700, 1, "2,4,", T0 + 7)])
    offsets = _offsets(3, 2)
    torn = pa.Table.from_pylist([{"broker": B, "source": "commitlog", "kind": "TRUNCATED_RECORD",
                                  "file": "00000000000000000000", "position": f - 8,
                                  "physical_offset": f - 8, "length": 8, "detail": "4 bytes of a header"}])

    def table(recs, bods):
        return input_table(commitlog=recs.drop_columns(["body"]), op_bodies=bods, consumer_offsets=offsets,
                           consumequeue=_units(records), anomalies=torn)
    return records, _bodies(records), offsets, table


def test_a_torn_end_before_settled_records_loses_no_range():
    """A torn end (TRUNCATED_RECORD at the end of the first file) before the settled transactions' records:
    their units point at records an earlier run read, not past the readable data (no CQ_PAST_DATA_END range
    over E, prepared in the first file), so the carried reduction still equals the reduction of every
    record."""
    f = FILE
    records, bodies, offsets, table = torn_end_case()

    def reduce(recs, bods, extra=None, final=None):
        t = table(recs, bods)
        if extra is not None:
            t = pa.concat_tables([t, extra.cast(t.schema)])
        return reduce_input(t, None, None, 60000, True, final)

    full = reduce(records, bodies)
    got = settle(records, bodies, full["transactions"], consume_offsets(offsets), {B: 2 * f},
                 {B: [0, f, 2 * f]})
    assert sorted(got.final.column("uniq_key").to_pylist()) == ["A", "B"]
    again = reduce(got.records, got.op_bodies, final_input(got.final, got.facts), got.final)
    for name in ("transactions", "check_back", "recovery", "anomalies"):
        assert _sorted(again[name]) == _sorted(full[name]), name


def _plain(off, topic, ts, kind="NOT", magic=1):
    """A record that is evidence of no transaction: a retry topic's message (magic V2 for a long group name),
    or the delay copy of a committed message."""
    return {"topic": topic, "physical_offset": off, "queue_id": 0, "queue_offset": off, "uniq_key": f"u{off}",
            "transaction_type": kind, "store_timestamp": ts, "born_timestamp": ts, "total_size": 150,
            "magic_version": magic}


def test_records_that_are_no_evidence_are_dropped_below_the_bound_with_their_facts():
    """Records no transaction links (a V2 retry-topic message, a delay copy of a COMMIT) leave the carried
    state below the bound, their facts (V2 count, newest store time, smallest file base) carried per file:
    the next run's reduction equals the reduction of every record.  Kept at or above the bound, on a broker
    with CommitLog decoder findings, and on a legacy broker."""
    rows = OLD + [_plain(1100, "%RETRY%CID_" + "g" * 130, T0 + 4, magic=2),
                  _plain(1200, "SCHEDULE_TOPIC_XXXX", T0 + 40, kind="COMMIT"),
                  _plain(1900, "%RETRY%CID_" + "g" * 130, T0 + 8, magic=2)]
    records = _records(rows)
    bodies = _bodies(records)
    offsets = _offsets(2, 2)
    full = _reduce(records, bodies, offsets)
    got = settle(records, bodies, full["transactions"], consume_offsets(offsets), {B: 1800}, {B: [0, FILE]})
    assert sorted(got.records.column("physical_offset").to_pylist()) == [1300, 1500, 1700, 1900]
    facts = got.facts[B]["0"]
    assert facts["n_v2"] == 1 and facts["snapshot_ms"] == T0 + 40 and facts["min_commitlog_offset"] == 0
    extra = final_input(got.final, got.facts)
    again = _reduce(got.records, got.op_bodies, offsets, extra, got.final)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        assert _sorted(again[name]) == _sorted(full[name]), name

    for kw in ({"damaged": [B]}, {"legacy": [B]}):
        kept = settle(records, bodies, full["transactions"], consume_offsets(offsets), {B: 1800},
                      {B: [0, FILE]}, **kw)
        assert {1100, 1200} <= set(kept.records.column("physical_offset").to_pylist()), kw


def _discard(off, qo, uk, ts, check_times):
    """The broker's discard of a half checked too often (resolveDiscardMsg): a copy in
    TRANS_CHECK_MAX_TIME_TOPIC with the half's properties."""
    return {**_half(off, qo, uk, ts), "topic": DISCARD_TOPIC, "transaction_check_times": check_times}


# E: a half, its check re-put, then its discard (DISCARDED); G: committed twice (DUPLICATE_COMMIT) with one op;
# H: prepared above the half consume offset (open).  Half consume offset 3, op consume offset 1.
DISC = [_half(0, 0, "E", T0), {**_half(300, 1, "E", T0 + 60_000), "transaction_check_times": 1},
        _discard(600, 0, "E", T0 + 120_000, 2), _half(900, 2, "G", T0 + 130_000),
        _end(1200, 900, "G", T0 + 130_001), _end(1500, 900, "G", T0 + 130_002), _op(1800, 0, "2,", T0 + 130_003),
        _half(2100, 3, "H", T0 + 140_000)]


def _run(records, offsets, extra=None, final=None, anomalies=None):
    t = input_table(commitlog=records.drop_columns(["body"]), op_bodies=_bodies(records),
                    consumer_offsets=offsets, anomalies=anomalies)
    if extra is not None:
        t = pa.concat_tables([t, extra.cast(t.schema)])
    return reduce_input(t, None, None, 60000, True, final)


def test_discarded_and_duplicate_commit_transactions_settle_and_a_late_end_reopens():
    """A DISCARDED transaction (its halves below the half consume offset: the check service never reads them
    again) and a COMMITTED one with DUPLICATE_COMMIT (the flag carried) settle; PREPARED does not.  The next
    run equals the full reduction while nothing new names them; a producer's late COMMIT of the discarded half
    (EndTransactionProcessor looks the half up by offset, whether discarded or not), a third COMMIT, or a
    CommitLog range lost above the discarded one reopens; on a broker with decoder findings DISCARDED stays
    evidence.  The full audit of the late COMMIT settles the now committed transaction again, its
    DISCARDED_WITH_RESOLUTION carried."""
    records = _records(DISC)
    offsets = _offsets(3, 1)
    full = _run(records, offsets)
    by_key = {r["uniq_key"]: r for r in full["transactions"].to_pylist()}
    assert (by_key["E"]["state"], by_key["G"]["state"], by_key["H"]["state"]) == ("DISCARDED", "COMMITTED",
                                                                                   "PREPARED")
    assert by_key["G"]["flags"] == ["DUPLICATE_COMMIT"] and not by_key["E"]["flags"]
    got = settle(records, _bodies(records), full["transactions"], consume_offsets(offsets), {B: FILE},
                 {B: [0, FILE]})
    assert sorted(got.final.column("uniq_key").to_pylist()) == ["E", "G"]
    assert got.records.column("physical_offset").to_pylist() == [2100]
    extra = final_input(got.final, got.facts)
    profile = {B: full["profiles"].column("profile")[0].as_py()}
    again = _run(got.records, offsets, extra, got.final)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        assert _sorted(again[name]) == _sorted(full[name]), name
    assert reopened(got.final, again["transactions"], again["anomalies"], profile, consume_offsets(offsets)) == {}

    lost = pa.Table.from_pylist([{"broker": B, "source": "commitlog", "kind": "BAD_MAGIC",
                                  "file": "00000000000000001048576", "position": 100,
                                  "physical_offset": FILE + 100, "length": 64, "detail": "garbled"}])
    late_commit = [_end(2400, 300, "E", T0 + 200_000), _op(2700, 1, "1,", T0 + 200_001)]
    for late, damage in ((late_commit, None), (late_commit[:1], None), ([_end(FILE + 10, 900, "G", T0 + 9)], None),
                         ([_half(FILE + 10, 4, "K", T0 + 200_000)], lost)):
        new = _records(late)
        want = _run(pa.concat_tables([records, new]), offsets, anomalies=damage)
        inc = _run(pa.concat_tables([got.records, new]), offsets, extra, got.final, anomalies=damage)
        assert _sorted(inc["transactions"]) != _sorted(want["transactions"])   # carrying would be wrong ...
        why = reopened(got.final, inc["transactions"], inc["anomalies"], profile, consume_offsets(offsets))
        assert list(why) == [B], (late, why)                                  # ... and it is detected
        assert ("DISCARDED" in why[B]) == (damage is not None), why
    assert {r["uniq_key"]: r["state"] for r in want["transactions"].to_pylist()}["E"] == "DISCARDED"
    assert "STATE_UNCERTAIN_DAMAGED_RANGE" in {r["uniq_key"]: r["flags"]
                                                for r in want["transactions"].to_pylist()}["E"]

    kept = settle(records, _bodies(records), full["transactions"], consume_offsets(offsets), {B: FILE},
                  {B: [0, FILE]}, damaged=[B])
    assert sorted(kept.final.column("uniq_key").to_pylist()) == ["G"]

    # the reopened run is a full audit: E is COMMITTED with DISCARDED_WITH_RESOLUTION, and settles again once
    # the check service passed the op (the flag carried); the run after it equals the full reduction
    whole, later = pa.concat_tables([records, _records(late_commit)]), _offsets(4, 2)
    redo = _run(whole, later)
    e = {r["uniq_key"]: r for r in redo["transactions"].to_pylist()}["E"]
    assert (e["state"], e["flags"]) == ("COMMITTED", ["DISCARDED_WITH_RESOLUTION"])
    got = settle(whole, _bodies(whole), redo["transactions"], consume_offsets(later), {B: FILE}, {B: [0, FILE]})
    assert sorted(got.final.column("uniq_key").to_pylist()) == ["E", "G"]
    again = _run(got.records, later, final_input(got.final, got.facts), got.final)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        assert _sorted(again[name]) == _sorted(redo[name]), name
