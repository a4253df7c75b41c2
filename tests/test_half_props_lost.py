"""A half record whose REAL_TOPIC / REAL_QID were overwritten: a state reached by absence must be flagged.

TransactionalMessageBridge.parseHalfMessageInner puts REAL_TOPIC and REAL_QID on every half (4.3+, 5.x), so a
half-queue copy without them was damaged after the write.  Indexed mode finds a COMMIT record under
``REAL_TOPIC#UNIQ_KEY`` in the IndexFiles, so without REAL_TOPIC it never looks the COMMIT up, and the op alone
read as a silent rollback.  On copies of the 5.3.3 fixture the committed transaction whose COMMIT record
directly follows its half (and which one op names, later) gets non-zero random bytes over the half's
properties from REAL_TOPIC to its end (valid framing, no zero tail; the audit campaign's mutant m00216 also
garbled the COMMIT's head, which full mode then reads as a lost range).  In both modes: no state changes
without a damage flag; the transaction is not ROLLED_BACK, and indexed mode reads it UNKNOWN_DAMAGED with
STATE_UNCERTAIN_DAMAGED_RANGE over the half record's bytes.
"""
from __future__ import annotations

import random
import shutil

import pytest
from damage_audits import MODES, audit_both_modes
from test_damage_inference import V533, _committed_with_single_op, _truth

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {UNCERTAIN, "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING", "OP_BODY_MISSING"}
CASES = {"half": 0}          # name -> bytes garbled into the COMMIT record


@pytest.fixture(scope="module")
def damaged(spark, tmp_path_factory):
    recs = _truth()
    commit, _ = _committed_with_single_op(recs)
    half = next(r for r in recs if r["physicalOffset"] == commit["preparedTransactionOffset"])
    assert half["filePos"] + half["storeSize"] == commit["filePos"], "the COMMIT must follow its half"
    path = V533 / "store" / "commitlog" / half["file"]
    with open(path, "rb") as f:
        f.seek(half["filePos"])
        rec = f.read(half["storeSize"])
    start = half["filePos"] + rec.index(b"REAL_TOPIC\x01")
    assert rec.rindex(b"REAL_QID\x01") > rec.index(b"REAL_TOPIC\x01")
    base = tmp_path_factory.mktemp("half_props")
    roots = {"intact": str(V533 / "store")}
    rnd = random.Random(216)
    for name, into_commit in CASES.items():
        root = base / name / "store"
        shutil.copytree(V533 / "store", root)
        end = commit["filePos"] + into_commit
        junk = bytes(rnd.randrange(3, 256) for _ in range(end - start))     # no 0x00 / 0x01 / 0x02
        with open(root / "commitlog" / half["file"], "r+b") as f:      # a copy of the fixture
            f.seek(start)
            f.write(junk)
        roots[name] = str(root)
    return half, commit, audit_both_modes(spark, roots)


def _tx(audit, broker):
    return {t["transaction_key"]: t for t in audit["transactions"] if t["broker"] == broker}


@pytest.mark.spark
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("mode", MODES)
def test_lost_real_topic_is_no_silent_rollback(damaged, mode, name):
    half, commit, got = damaged
    intact, mine = _tx(got[mode], "intact"), _tx(got[mode], name)
    silent = [(k, intact[k]["state"], t["state"], t["flags"]) for k, t in mine.items()
              if k in intact and t["state"] != intact[k]["state"] and not DAMAGE & set(t["flags"])]
    assert not silent, silent
    key = next(k for k, t in intact.items() if commit["physicalOffset"] in (t["commit_offsets"] or []))
    assert intact[key]["state"] == "COMMITTED"
    t = next(t for t in mine.values() if t["first_copy_commitlog_offset"] == half["physicalOffset"])
    assert t["state"] != "ROLLED_BACK", t
    if t["state"] != "COMMITTED":
        assert (t["state"], UNCERTAIN in t["flags"]) == ("UNKNOWN_DAMAGED", True), t
    if mode == "indexed":
        assert t["state"] == "UNKNOWN_DAMAGED"
        mark = [(a["physical_offset"], a["length"]) for a in got[mode]["anomalies"]
                if a["broker"] == name and a["code"] == UNCERTAIN and a["transaction_key"] == t["transaction_key"]]
        assert (half["physicalOffset"], half["storeSize"]) in mark, mark


@pytest.mark.spark
@pytest.mark.parametrize("mode", MODES)
def test_the_intact_store_has_no_such_flag(damaged, mode):
    _, _, got = damaged
    assert not [t for t in _tx(got[mode], "intact").values() if UNCERTAIN in t["flags"]]
