"""An END record (COMMIT / ROLLBACK) whose own transaction id is not that of the half copy it names.

EndTransactionProcessor.endMessageTransaction reads the half at the request's commitLogOffset and copies its
properties (UNIQ_KEY, PGROUP; topic = its REAL_TOPIC) into the record it writes, with
PREPARED_TRANSACTION_OFFSET = that offset: RocketMQ never writes an END whose (UNIQ_KEY, PGROUP, topic)
differs from the copy at its PREPARED_TRANSACTION_OFFSET, so such a pair proves that one of the two records
was damaged after the write (no checksum covers properties before 5.2).  The audit campaign's m01550 (a bit
flip in the UNIQ_KEY of a 4.9.8 DLedger transaction's newest re-put copy) read the transaction COMMITTED ->
PREPARED with no flag: the COMMIT and the op linked to the copy, now keyed as another transaction.  Both
transactions are now CORRUPT_RECORD; the one whose key the END carries, whose state rests on the absence of a
resolution, is STATE_UNCERTAIN_DAMAGED_RANGE over the END record (and UNKNOWN_DAMAGED where an op alone would
have rolled it back).

Spark-free (the reducer and the distributed reduce's per-partition steps on Arrow tables), and on a copy of
the 4.9.8 DLedger fixture with the mutant's two flipped bytes (Spark, both modes).
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from partition_steps import assert_partition_steps_equal_reducer, linked
from test_txreduce import PARAMS, _record

from jobs.reconstruct import partitioned as part
from jobs.reconstruct.evidence import XREF, cross_refs, key_mismatch, uniq_tx
from jobs.reconstruct.params import HALF_TOPIC, OP_TOPIC
from jobs.reconstruct.reducer import input_table, reduce_input
from schemas.sources import COMMITLOG_SOURCE

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {UNCERTAIN, "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING", "OP_BODY_MISSING"}


def _store(damaged: bool) -> pa.Table:
    """u1: committed through its re-put copy (op on that copy); u2: the same, plus an op on its original;
    u3: intact.  ``damaged``: the re-put copies of u1 / u2 carry UNIQ_KEY x1 / x2."""
    k1, k2 = ("x1", "x2") if damaged else ("u1", "u2")
    half = (lambda off, qo, uk, ct=None: _record("b", off, HALF_TOPIC, "PREPARED", qo, uk, real_topic="t",
                                                 check_times=ct))
    rows = [
        half(0, 0, "u1"), half(100, 1, k1, 1), _record("b", 200, "t", "COMMIT", 0, "u1", pto=100, real_topic="t"),
        _record("b", 300, OP_TOPIC, "NOT", 0, body=b"1"),
        half(400, 2, "u2"), half(500, 3, k2, 1), _record("b", 600, "t", "COMMIT", 1, "u2", pto=500, real_topic="t"),
        _record("b", 700, OP_TOPIC, "NOT", 1, body=b"2"), _record("b", 800, OP_TOPIC, "NOT", 2, body=b"3"),
        half(900, 4, "u3"), _record("b", 1000, "t", "COMMIT", 2, "u3", pto=900, real_topic="t"),
        _record("b", 1100, OP_TOPIC, "NOT", 3, body=b"4"),
    ]
    return pa.Table.from_pylist(rows, schema=COMMITLOG_SOURCE.arrow_schema())


def _by_key(table: pa.Table) -> dict:
    return {r["transaction_key"]: r for r in table.to_pylist()}


def test_the_end_and_the_copy_it_names_disagree():
    table = input_table(commitlog=_store(True))
    out = reduce_input(table, PARAMS)
    tx, rec = _by_key(out["transactions"]), _by_key(out["recovery"])
    got = {k: (t["state"], "CORRUPT_RECORD" in t["flags"], UNCERTAIN in t["flags"], rec.get(k, {}).get("action"))
           for k, t in tx.items()}
    assert got == {
        "u1": ("PREPARED", True, True, "CHECK_BACK_DAMAGED"),       # was COMMITTED: its COMMIT names x1's copy
        "x1": ("COMMITTED", True, False, "REVIEW_EVIDENCE"),
        "u2": ("UNKNOWN_DAMAGED", True, True, "CHECK_BACK_DAMAGED"),  # would be ROLLED_BACK by the op alone
        "x2": ("COMMITTED", True, False, "REVIEW_EVIDENCE"),
        "u3": ("COMMITTED", False, False, None),
    }
    assert tx["u3"]["flags"] == []
    marks = {a["transaction_key"]: a for a in out["anomalies"].to_pylist() if a["code"] == UNCERTAIN}
    assert sorted(marks) == ["u1", "u2"]
    assert (marks["u1"]["physical_offset"], marks["u1"]["length"]) == (200, 100)
    assert "PREPARED_TRANSACTION_OFFSET 100" in marks["u1"]["detail"]
    assert "endMessageTransaction" in marks["u1"]["detail"]
    assert marks["u2"]["detail"].startswith("UNKNOWN_DAMAGED (would be ROLLED_BACK)")
    assert sorted(r["transaction_key"] for r in out["check_back"].to_pylist()) == ["u1", "u2"]


def test_an_intact_store_has_no_such_flag():
    out = reduce_input(input_table(commitlog=_store(False)), PARAMS)
    tx = _by_key(out["transactions"])
    assert {k: t["state"] for k, t in tx.items()} == {"u1": "COMMITTED", "u2": "COMMITTED", "u3": "COMMITTED"}
    assert not [t for t in tx.values() if DAMAGE & set(t["flags"])]
    assert not out["anomalies"].num_rows


def test_cross_refs_are_the_mismatched_ends_keyed_by_their_own_id():
    ev = linked(input_table(commitlog=_store(True)))
    hit = key_mismatch(ev)
    assert ev.i["physical_offset"][0][hit].tolist() == [200, 600]
    x = cross_refs(ev)
    assert x.c["role"].tolist() == [XREF, XREF]
    assert x.s["tx"].to_pylist() == uniq_tx(pa.array(["u1", "u2"]), pa.array(["pg"] * 2),
                                            pa.array(["t"] * 2)).to_pylist()
    # the END rows themselves stay with the copy they found
    assert ev.s["tx"].filter(pa.array(hit)).to_pylist() == uniq_tx(pa.array(["x1", "x2"]), pa.array(["pg"] * 2),
                                                                   pa.array(["t"] * 2)).to_pylist()
    assert not key_mismatch(linked(input_table(commitlog=_store(False)))).any()


def test_per_partition_rules_equal_the_reducer():
    """The distributed reduce's steps (Spark does the linking with windows and ``distributed.cross_refs``):
    the XREF rows shuffled with the transaction they name give the reducer's rows."""
    assert_partition_steps_equal_reducer(input_table(commitlog=_store(True)), {XREF: part.KIND_XREF})


# ------------------------------------------------------------------------------------------------------------
# the 4.9.8 DLedger fixture, damaged as mutant m01550 damaged it
# ------------------------------------------------------------------------------------------------------------

STORE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-4.9.8-dledger" / "store-clean"
DATA = Path("dledger-n0") / "data" / "00000000000000000000"
FLIPS = {569974: 0x01, 570017: 0x01}        # KEYS "NTX-37" -> "OTX-37"; one UNIQ_KEY digit '0' -> '1'
KEY = "FD00000000000000000000000000000213365FFD2B277CA9F22000B7"


@pytest.fixture(scope="module")
def fixture_audits(spark, tmp_path_factory):
    from damage_audits import audit_both_modes

    root = tmp_path_factory.mktemp("xkey") / "store"
    shutil.copytree(STORE, root)
    with open(root / DATA, "r+b") as f:
        for pos, bit in FLIPS.items():
            f.seek(pos)
            b = f.read(1)[0]
            assert chr(b) in "N0"
            f.seek(pos)
            f.write(bytes([b ^ bit]))
    return audit_both_modes(spark, {"intact": str(STORE), "damaged": str(root)})


@pytest.mark.spark
@pytest.mark.parametrize("mode", ("full", "indexed"))
def test_a_flipped_uniq_key_in_a_reput_copy_is_flagged(fixture_audits, mode):
    got = fixture_audits[mode]
    tx = {b: {t["transaction_key"]: t for t in got["transactions"] if t["broker"] == b}
          for b in ("intact", "damaged")}
    intact, damaged = tx["intact"], tx["damaged"]
    assert intact[KEY]["state"] == "COMMITTED"
    silent = [(k, intact[k]["state"], t["state"], t["flags"]) for k, t in damaged.items()
              if k in intact and t["state"] != intact[k]["state"] and not DAMAGE & set(t["flags"])]
    assert not silent, silent
    t = damaged[KEY]
    assert t["state"] == "PREPARED" and {"CORRUPT_RECORD", UNCERTAIN} <= set(t["flags"]), t
    added = [t for k, t in damaged.items() if k not in intact]
    assert len(added) == 1 and added[0]["state"] == "COMMITTED" and "CORRUPT_RECORD" in added[0]["flags"]
    commit = added[0]["commit_offsets"][0]
    marks = [a for a in got["anomalies"] if a["broker"] == "damaged" and a["code"] == UNCERTAIN
             and a["transaction_key"] == KEY]
    assert [a["physical_offset"] for a in marks] == [commit]
    assert not [t for t in intact.values() if {"CORRUPT_RECORD", UNCERTAIN} & set(t["flags"])]

