"""A record whose ``__transactionId__`` property is not its UNIQ_KEY, on a 5.1+ store.

A 5.1+ broker sets ``__transactionId__`` = UNIQ_KEY on every half it stores
(TransactionalMessageBridge.parseHalfMessageInner), and every record made from a half (re-put copy, discard,
COMMIT / ROLLBACK) copies both properties: the real 5.3.3 fixture's 337 such records all agree.  So where the
two differ, one of them was damaged after the write (no checksum covers properties before 5.2, and only
optionally after).  The audit campaign's m02281 (two bit flips in the UNIQ_KEY of a 5.3.3 discard record)
read its transaction DISCARDED -> PREPARED with no flag: the discard was keyed as another transaction.  The
record's own transaction is now CORRUPT_RECORD, and the one its ``__transactionId__`` names, whose state rests
on the absence of a resolution, CORRUPT_RECORD and STATE_UNCERTAIN_DAMAGED_RANGE over that record.  Older
brokers store the property as the client sent it: there it proves nothing and nothing changes.

Spark-free (the reducer and the distributed reduce's per-partition steps on Arrow tables), and on a copy of
the 5.3.3 RocksDB fixture with the mutant's two flipped bytes (Spark, both modes).
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from damage_audits import audit_three_ways, by_key, flipped_copy, silent_changes
from partition_steps import assert_partition_steps_equal_reducer, linked
from test_txreduce import PARAMS, _record

from jobs.reconstruct import partitioned as part
from jobs.reconstruct.evidence import TIDREF, cross_refs, tid_mismatch, uniq_tx
from jobs.reconstruct.params import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from jobs.reconstruct.reducer import input_table, reduce_input
from schemas.sources import COMMITLOG_SOURCE

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {UNCERTAIN, "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING", "OP_BODY_MISSING"}


def _store(damaged: bool, tid_on_halves: bool = True, lost_name: bool = False) -> pa.Table:
    """u1: discarded (its discard record's UNIQ_KEY reads x1 when ``damaged``); u2: committed (its COMMIT
    record's __transactionId__ reads y2 when ``damaged``); u3: intact, committed.  ``tid_on_halves``: the
    halves carry __transactionId__ (a 5.1+ broker); else only the damaged records do (an older broker).
    ``lost_name``: the discard record has no UNIQ_KEY at all (its property name was damaged) instead of x1."""

    def rec(off, topic, ttype, qo, uk, tid, **kw):
        r = _record("b", off, topic, ttype, qo, uk, **kw)
        r["transaction_id"] = tid
        return r

    half = (lambda off, qo, uk: rec(off, HALF_TOPIC, "PREPARED", qo, uk, uk if tid_on_halves else None,
                                    real_topic="t"))
    rows = [
        half(0, 0, "u1"),
        rec(100, DISCARD_TOPIC, "NOT", 0, (None if lost_name else "x1") if damaged else "u1", "u1", real_topic="t",
            check_times=15),
        half(200, 1, "u2"),
        rec(300, "t", "COMMIT", 0, "u2", "y2" if damaged else "u2", pto=200, real_topic="t"),
        rec(400, OP_TOPIC, "NOT", 0, None, None, body=b"1"),
        half(500, 2, "u3"),
        rec(600, "t", "COMMIT", 1, "u3", "u3", pto=500, real_topic="t"),
        rec(700, OP_TOPIC, "NOT", 1, None, None, body=b"2"),
    ]
    return pa.Table.from_pylist(rows, schema=COMMITLOG_SOURCE.arrow_schema())


def _by_key(table: pa.Table) -> dict:
    return {r["transaction_key"]: r for r in table.to_pylist()}


def _summary(out) -> dict:
    tx, rec = _by_key(out["transactions"]), _by_key(out["recovery"])
    return {k: (t["state"], "CORRUPT_RECORD" in t["flags"], UNCERTAIN in t["flags"], rec.get(k, {}).get("action"))
            for k, t in tx.items()}


def test_a_record_whose_transaction_id_is_not_its_uniq_key():
    out = reduce_input(input_table(commitlog=_store(True)), PARAMS)
    assert out["profiles"].column("profile").to_pylist() == ["5.1+"]
    assert _summary(out) == {
        "u1": ("PREPARED", True, True, "CHECK_BACK_DAMAGED"),       # was DISCARDED: its discard reads x1
        "x1": ("DISCARDED", True, False, "RESUME_DISCARDED"),
        "u2": ("COMMITTED", True, False, "REVIEW_EVIDENCE"),        # its COMMIT's __transactionId__ reads y2
        "u3": ("COMMITTED", False, False, None),
    }
    assert _by_key(out["transactions"])["u3"]["flags"] == []
    marks = {a["transaction_key"]: a for a in out["anomalies"].to_pylist() if a["code"] == UNCERTAIN}
    assert sorted(marks) == ["u1"]
    assert (marks["u1"]["physical_offset"], marks["u1"]["length"]) == (100, 100)
    assert "__transactionId__" in marks["u1"]["detail"] and marks["u1"]["detail"].startswith("PREPARED")
    assert sorted(r["transaction_key"] for r in out["check_back"].to_pylist()) == ["u1"]


def test_a_record_with_a_transaction_id_and_no_uniq_key():
    """The mutant m02281 flipped a bit of the property name (``UNIQ_KEy``): the discard record has no key of
    its own and reads as an unkeyed discard, but its __transactionId__ still names u1."""
    out = reduce_input(input_table(commitlog=_store(True, lost_name=True)), PARAMS)
    got = _summary(out)
    unkeyed = [k for k in got if k not in ("u1", "u2", "u3")]
    assert len(unkeyed) == 1 and got[unkeyed[0]][:2] == ("DISCARDED", True)
    assert got["u1"] == ("PREPARED", True, True, "CHECK_BACK_DAMAGED")


def test_an_intact_store_has_no_such_flag():
    out = reduce_input(input_table(commitlog=_store(False)), PARAMS)
    assert {k: v[:3] for k, v in _summary(out).items()} == {
        "u1": ("DISCARDED", False, False), "u2": ("COMMITTED", False, False), "u3": ("COMMITTED", False, False)}
    assert not out["anomalies"].num_rows


def test_an_older_broker_s_property_proves_nothing():
    """Halves without __transactionId__: not the 5.1+ profile, so a record whose property (sent by the client)
    differs from its UNIQ_KEY is no damage."""
    out = reduce_input(input_table(commitlog=_store(True, tid_on_halves=False)), PARAMS)
    assert out["profiles"].column("profile").to_pylist() != ["5.1+"]
    tx = _by_key(out["transactions"])
    assert not [t for t in tx.values() if {"CORRUPT_RECORD", UNCERTAIN} & set(t["flags"])]
    assert tx["u1"]["state"] == "PREPARED" and tx["x1"]["state"] == "DISCARDED"
    assert tx["x1"]["flags"] == ["PREPARED_RECORD_MISSING"]     # a discard whose half was never read


def test_cross_refs_are_keyed_by_the_transaction_id():
    ev = linked(input_table(commitlog=_store(True)))
    hit = tid_mismatch(ev)
    assert ev.i["physical_offset"][0][hit].tolist() == [100, 300]
    x = cross_refs(ev)
    assert x.c["role"].tolist() == [TIDREF, TIDREF]
    assert x.s["tx"].to_pylist() == uniq_tx(pa.array(["u1", "y2"]), pa.array(["pg"] * 2),
                                            pa.array(["t"] * 2)).to_pylist()
    assert not tid_mismatch(linked(input_table(commitlog=_store(False)))).any()


@pytest.mark.parametrize("tid_on_halves", (True, False))
def test_per_partition_rules_equal_the_reducer(tid_on_halves):
    """The distributed reduce's steps (Spark links with windows and takes the twins with
    ``distributed.cross_refs``, from the ``tid_tx`` column): the TIDREF rows shuffled with the transaction
    they name give the reducer's rows."""
    rows = assert_partition_steps_equal_reducer(input_table(commitlog=_store(True, tid_on_halves)),
                                                {TIDREF: part.KIND_TIDREF})
    assert rows.column("tid_tx").drop_null().to_pylist() == (
        uniq_tx(pa.array(["u1", "y2"]), pa.array(["pg"] * 2), pa.array(["t"] * 2)).to_pylist())


# ------------------------------------------------------------------------------------------------------------
# the 5.3.3 RocksDB fixture, damaged as mutant m02281 damaged it
# ------------------------------------------------------------------------------------------------------------

STORE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3-rocksdb" / "store"
DATA = Path("commitlog") / "00000000000000000000"
#: two digits of the UNIQ_KEY of the discard record at CommitLog offset 39481 ('0' -> '1', 'E' -> 'D')
FLIPS = {40062: 0x01, 40072: 0x01}
#: the mutant's own seven flips (the property name UNIQ_KEY reads UNIQ_KEy: the record has no UNIQ_KEY left)
M02281 = {40057: 0x20, 40059: 0x40, 40062: 0x20, 40064: 0x01, 40065: 0x04, 40070: 0x10, 40072: 0x01}
DISCARD_AT = 39481
KEY = "C000020257674E0E2F2A89C457B6000C"
BROKERS = ("damaged", "mutant")


def _flipped(root: Path, flips: dict) -> str:
    return flipped_copy(STORE, root, DATA, flips)


@pytest.fixture(scope="module")
def fixture_audits(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tid")
    roots = {"intact": str(STORE), "damaged": _flipped(tmp / "damaged", FLIPS),
             "mutant": _flipped(tmp / "mutant", M02281)}
    return audit_three_ways(spark, roots)


@pytest.mark.spark
@pytest.mark.parametrize("broker", BROKERS)
@pytest.mark.parametrize("mode", ("full", "indexed", "distributed"))
def test_a_flipped_uniq_key_in_a_discard_record_is_flagged(fixture_audits, mode, broker):
    got = fixture_audits[mode]
    intact, damaged = by_key(got, "intact"), by_key(got, broker)
    assert intact[KEY]["state"] == "DISCARDED"
    silent = silent_changes(intact, damaged, DAMAGE)
    assert not silent, silent
    t = damaged[KEY]
    assert t["state"] == "PREPARED" and {"CORRUPT_RECORD", UNCERTAIN} <= set(t["flags"]), t
    added = [t for k, t in damaged.items() if k not in intact]
    assert len(added) == 1 and added[0]["state"] == "DISCARDED" and "CORRUPT_RECORD" in added[0]["flags"]
    marks = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN
             and a["transaction_key"] == KEY]
    assert [(a["physical_offset"], a["length"]) for a in marks] == [(DISCARD_AT, 898)]
    assert not [t for t in intact.values() if {"CORRUPT_RECORD", UNCERTAIN} & set(t["flags"])]
