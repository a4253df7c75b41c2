"""A half / op / discard queue unit with no record of its topic at its CommitLog offset is a lost range.

ReputMessageService builds every consume-queue unit from the record it dispatched, with that record's topic,
offset and size; so a unit of the discard queue (TRANS_CHECK_MAX_TIME_TOPIC) that points at a record of
another topic says that record's bytes (or the unit's) were damaged after the broker wrote them.  The audit
cannot tell whose discard, COMMIT or op record lay there, so every state reached by absence whose window
holds ``[offset, offset + unit size)`` rests on missing bytes (``damage.cq_lost``, docs/robustness.md).

The case that taught it: fuzz mutant m04675 (seed 43) flipped five bits of the discard record at CommitLog
offset 31911 of the 5.3.3 RocksDB fixture, one in its topic; the read no longer takes the record, its
transaction read DISCARDED -> PREPARED with no flag, in both modes.  The same holds for one unit whose record
is there but was changed after it was written (``reducer._rewritten``): fuzz mutant m03294 (seed 47) flipped
the queue id of an op record (0 -> 65536) and a byte of its body, whose op then named halves of a queue that
has none, and its own half read ROLLED_BACK -> PREPARED with no flag.  An intact record that a damaged unit
names (another size, another queue offset) is read as it was: no lost range.
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from damage_audits import audit_three_ways, by_key, flipped_copy, silent_changes

from jobs.reconstruct.damage import CQ_NO_RECORD, EMPTY, DamagedRanges, cq_lost, with_lost
from jobs.reconstruct.reducer import _cq_mismatches

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {"CORRUPT_RECORD", UNCERTAIN, "CQ_MISMATCH"}


def _finding(off, length, topic="TRANS_CHECK_MAX_TIME_TOPIC", code="CQ_MISMATCH"):
    return {"code": code, "physical_offset": off, "length": length, "topic": topic}


def test_only_units_without_their_record_are_lost_ranges():
    got = cq_lost([_finding(100, 50), _finding(300, None), _finding(400, 10, topic="TopicA"),
                   _finding(500, 10, code="EVIDENCE_IN_DELETED_RANGE"), _finding(None, 10),
                   _finding(600, 0, topic="RMQ_SYS_TRANS_HALF_TOPIC")])
    assert [(s, e) for s, e, _ in got] == [(100, 150), (600, 601)]
    assert all(w.startswith(CQ_NO_RECORD) for _, _, w in got)


def test_merged_ranges_do_not_depend_on_the_order_they_come_in():
    base = DamagedRanges(np.array([0, 1000], np.int64), np.array([10, 1100], np.int64), ("A", "B"))
    rows = [_finding(5, 20), _finding(1100, 5), _finding(2000, 7), _finding(2003, 10)]
    want = with_lost(base, cq_lost(rows))
    assert list(zip(want.start.tolist(), want.end.tolist(), strict=True)) == [(0, 25), (1000, 1105), (2000, 2013)]
    assert want.what[0].startswith("A; ") and CQ_NO_RECORD in want.what[0]
    for seed in range(5):
        shuffled = rows[:]
        random.Random(seed).shuffle(shuffled)
        got = with_lost(base, cq_lost(shuffled))
        assert (got.start.tolist(), got.end.tolist(), got.what) == (want.start.tolist(), want.end.tolist(),
                                                                   want.what)
    assert with_lost(base, []) is base
    assert len(with_lost(EMPTY, cq_lost(rows[:1]))) == 1


def test_the_torn_end_of_a_dledger_uncommitted_tail_is_no_lost_range():
    # in the uncommitted tail (from 1000), damage with a whole entry after it (ending before 1500) hides records;
    # damage from there on is the torn end a crash leaves, which DLedger's recovery truncates
    tail = DamagedRanges(EMPTY.start, EMPTY.end, (), uncommitted=(1000, 1500))
    got = with_lost(tail, cq_lost([_finding(500, 10), _finding(1200, 10), _finding(1600, 10)]))
    assert list(zip(got.start.tolist(), got.end.tolist(), strict=True)) == [(500, 510), (1200, 1210)]


OP_T = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


def _compared(unit, rec, corrupt=()):
    """One op-queue unit and one record at CommitLog offset 1000 -> the comparison's lost lengths."""
    units = pa.table({"topic": [OP_T], "commitlog_offset": [1000], "queue_id": [unit[0]], "queue_offset": [unit[1]],
                      "size": [unit[2]]})
    records = pa.table({"topic": [OP_T], "physical_offset": [1000], "queue_id": [rec[0]], "queue_offset": [rec[1]],
                        "total_size": [rec[2]]})
    got = _cq_mismatches("b", records, units, {"n_cq": 1}, np.array(sorted(corrupt), np.int64))
    assert all(m["code"] == "CQ_MISMATCH" and m["physical_offset"] == 1000 for m in got)
    return [m["length"] for m in got]


@pytest.mark.parametrize(("unit", "rec", "corrupt", "lost"), [
    ((0, 5, 147), (0, 5, 147), (), None),               # the same: no finding at all
    ((0, 5, 147), (65536, 5, 147), (), 147),            # the record's queue id changed: its unit's is its directory's
    ((0, 5, 147), (0, 6, 147), (), None),               # another queue offset, record intact (a hole in the queue)
    ((0, 5, 99), (0, 5, 147), (), None),                # another size, record intact (a garbled unit)
    ((0, 5, 147), (0, 6, 147), (1000,), 147),           # another queue offset, and the record fails its CRC
    ((0, 5, 99), (0, 5, 147), (1146,), 99),             # a finding inside the record
    ((0, 5, 147), (0, 6, 147), (1147,), None),          # a finding after it is another record's
    ((0, 5, 147), (0, 6, 147), (999,), None),           # ... and before it
])
def test_a_unit_whose_record_was_changed_names_a_lost_range(unit, rec, corrupt, lost):
    got = _compared(unit, rec, corrupt)
    assert got == ([] if unit == rec else [lost])


# ------------------------------------------------------------------------------------------------------------
# the 5.3.3 RocksDB fixture, its discard record at 31911 damaged
# ------------------------------------------------------------------------------------------------------------

STORE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3-rocksdb" / "store"
DATA = Path("commitlog") / "00000000000000000000"
DISCARD_AT, DISCARD_SIZE = 31911, 676
#: the first byte of the record's topic ('T' -> 't')
TOPIC_FLIP = {32253: 0x20}
#: the mutant's own five flips (one in the body's tail, three in the topic, one in the properties)
M04675 = {32247: 0x80, 32254: 0x40, 32261: 0x10, 32262: 0x20, 32284: 0x04}
KEY = "C000020258044E0E2F2A89C4319B0002"
BROKERS = ("topic", "mutant")
#: the op record at 9520 (147 bytes, body "0,3,8,10,11,": three committed halves, and KEY_OP's and another
#: rolled-back one at half-queue offsets 10 and 11): its queue id's third byte, 0 -> 1 (queue id 0 -> 65536);
#: with a flip in its body too ('3' -> '2', the body CRC fails), as fuzz mutant m03294 (seed 47) did on a
#: DLedger store
OP_AT, OP_SIZE = 9520, 147
OP_QID_FLIP = {OP_AT + 13: 0x01}
OP_QID_BODY_FLIP = {OP_AT + 13: 0x01, OP_AT + 88 + 2: 0x01}
KEY_OP = "C000020257674E0E2F2A89C4175B000A"


def _flipped(root: Path, flips: dict) -> str:
    return flipped_copy(STORE, root, DATA, flips)


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cqlost")
    roots = {"intact": str(STORE), "topic": _flipped(tmp / "topic", TOPIC_FLIP),
             "mutant": _flipped(tmp / "mutant", M04675), "opqid": _flipped(tmp / "opqid", OP_QID_FLIP),
             "opcrc": _flipped(tmp / "opcrc", OP_QID_BODY_FLIP)}
    return audit_three_ways(spark, roots)


@pytest.mark.spark
@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("mode", ("full", "indexed", "distributed"))
def test_a_discard_record_read_under_another_topic_is_flagged(audits, mode, broker):
    got = audits[mode]
    intact, damaged = by_key(got, "intact"), by_key(got, broker)
    assert intact[KEY]["state"] == "DISCARDED"
    silent = silent_changes(intact, damaged, DAMAGE)
    assert not silent, silent
    assert damaged[KEY]["state"] == "PREPARED" and UNCERTAIN in damaged[KEY]["flags"], damaged[KEY]
    cq = [(a["physical_offset"], a["topic"], a["length"]) for a in got["anomalies"]
          if a["broker"] == broker and a["code"] == "CQ_MISMATCH"]
    assert cq == [(DISCARD_AT, "TRANS_CHECK_MAX_TIME_TOPIC", DISCARD_SIZE)]
    marks = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN
             and a["transaction_key"] == KEY]
    assert [(a["physical_offset"], a["length"]) for a in marks] == [(DISCARD_AT, DISCARD_SIZE)]
    assert CQ_NO_RECORD in marks[0]["detail"]


@pytest.mark.spark
@pytest.mark.parametrize("broker", ("opqid", "opcrc"))
@pytest.mark.parametrize("mode", ("full", "indexed", "distributed"))
def test_an_op_record_under_another_queue_id_is_flagged(audits, mode, broker):
    got = audits[mode]
    intact, damaged = by_key(got, "intact"), by_key(got, broker)
    silent = silent_changes(intact, damaged, DAMAGE)
    assert not silent, silent
    assert intact[KEY_OP]["state"] == "ROLLED_BACK" and damaged[KEY_OP]["state"] == "PREPARED", damaged[KEY_OP]
    assert UNCERTAIN in damaged[KEY_OP]["flags"], damaged[KEY_OP]
    cq = [(a["physical_offset"], a["topic"], a["length"]) for a in got["anomalies"]
          if a["broker"] == broker and a["code"] == "CQ_MISMATCH"]
    assert cq == [(OP_AT, OP_T, OP_SIZE)]
    crc = [a["physical_offset"] for a in got["anomalies"] if a["broker"] == broker and a["code"] == "BODY_CRC_MISMATCH"]
    assert crc == ([OP_AT] if broker == "opcrc" else [])
    marks = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN
             and a["transaction_key"] == KEY_OP]
    assert [(a["physical_offset"], a["length"]) for a in marks] == [(OP_AT, OP_SIZE)]


@pytest.mark.spark
@pytest.mark.parametrize("mode", ("full", "indexed", "distributed"))
def test_the_intact_store_has_no_such_range(audits, mode):
    got = audits[mode]
    assert not [a for a in got["anomalies"] if a["broker"] == "intact" and a["code"] in ("CQ_MISMATCH", UNCERTAIN)]
    assert not [t for t in got["transactions"] if t["broker"] == "intact" and DAMAGE & set(t["flags"])]


@pytest.mark.spark
@pytest.mark.parametrize("broker", (*BROKERS, "opqid", "opcrc"))
def test_the_reduce_paths_agree(audits, broker):
    def rows(mode, table):
        return sorted((tuple(sorted((k, str(v)) for k, v in r.items())) for r in audits[mode][table]
                       if r["broker"] == broker))

    for table in ("transactions", "anomalies"):
        assert rows("full", table) == rows("distributed", table), table
