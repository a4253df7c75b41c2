"""A zeroed page over the tail of a half record: the record still frames, so only its properties tell.

Reproduced on copies of the shared 5.3.3 fixture (one CommitLog file): the half of DTX-29 (CommitLog 146,304,
1,250 bytes, queue offset 29; re-put three times, committed, discarded by the checker) has its last 98 bytes
zeroed -- REAL_TOPIC, REAL_QID and KEYS are gone, so the half no longer links to its re-put copies and
COMMIT: the transaction reads as two, a PREPARED one (the half) and a COMMITTED one (``PREPARED_RECORD_MISSING``).

* ``page``: bytes 147,456-151,552 zeroed (seed 3's m03820): the zeros run on over three records of other
  topics.  Full mode read them as RESYNC, whose range lies in the PREPARED half's window (flagged); indexed
  mode reads only the half / op / discard / real-topic records and saw no damage at all: COMMITTED ->
  PREPARED ``PREPARED_PASSED_BY_CHECKER`` with no flag.
* ``tail``: only the half's own bytes 147,456-147,554 zeroed: both modes were silent.

Now the decoder reports BAD_PROPERTIES for a record whose non-empty properties end in a zero byte (RocketMQ's
messageProperties2String never writes one), in both modes, and the PREPARED part carries CORRUPT_RECORD.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from damage_audits import MODES, audit_both_modes

FIXTURE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3" / "store"
LOG = "00000000000000000000"
HALF, HALF_SIZE = 146304, 1250
ZEROED = {"page": (147456, 151552), "tail": (147456, HALF + HALF_SIZE)}
DAMAGE_FLAGS = {"STATE_UNCERTAIN_DAMAGED_RANGE", "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING",
                "OP_BODY_MISSING"}


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("zeroed_tail")
    roots = {"intact": str(FIXTURE)}
    for how, (start, end) in ZEROED.items():
        root = base / how / "store"
        shutil.copytree(FIXTURE, root)
        with open(root / "commitlog" / LOG, "r+b") as f:
            f.seek(start)
            f.write(bytes(end - start))
        roots[how] = str(root)
    return audit_both_modes(spark, roots)


def _rows(audit, broker):
    return [t for t in audit["transactions"] if t["broker"] == broker]


@pytest.mark.spark
@pytest.mark.parametrize("how", sorted(ZEROED))
@pytest.mark.parametrize("mode", MODES)
def test_no_state_changes_silently(audits, mode, how):
    got = audits[mode]
    intact = {t["transaction_key"]: t["state"] for t in _rows(got, "intact")}
    rows = _rows(got, how)
    changed = [t for t in rows if t["transaction_key"] in intact and t["state"] != intact[t["transaction_key"]]]
    assert changed, "the zeroed properties split DTX-29: some state must change"
    silent = [(t["transaction_key"], t["state"], t["flags"]) for t in changed if not DAMAGE_FLAGS & set(t["flags"])]
    assert not silent, silent
    half = [t for t in rows if t["prepared_commitlog_offset"] == HALF]
    assert [(t["state"], "CORRUPT_RECORD" in t["flags"]) for t in half] == [("PREPARED", True)], half
    found = [a for a in got["anomalies"] if a["broker"] == how and a["code"] == "BAD_PROPERTIES"]
    assert [(a["physical_offset"], a["length"]) for a in found] == [(HALF, HALF_SIZE)], found


@pytest.mark.spark
@pytest.mark.parametrize("mode", MODES)
def test_the_intact_store_has_no_such_finding(audits, mode):
    got = audits[mode]
    assert not [a for a in got["anomalies"] if a["broker"] == "intact" and a["code"] == "BAD_PROPERTIES"]
    assert not [t for t in _rows(got, "intact") if "CORRUPT_RECORD" in t["flags"]]
