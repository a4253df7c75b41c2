"""Damage inside a DLedger log's uncommitted tail that whole entries follow is a lost range; a torn end is not.

DLedger appends whole entries in order, so a process crash leaves at most a torn end; a zeroed or garbled
stretch before a later whole entry is an OS crash's unordered write-back or disk damage, and
DLedgerMmapFileStore.recover truncates at it (later entries included).  Either way a state inferred from the
absence of a record that could lie there rests on missing bytes.  Reproduced on a copy of the crashed 4.9.8
DLedger fixture: the COMMIT record of a transaction, past the checkpoint's committedIndex, zeroed while the op
record after it survives.  Before, both modes said ROLLED_BACK with no damage flag."""
from __future__ import annotations

import base64
import datetime as dt
import gzip
import json
import shutil
from pathlib import Path

import pytest
from damage_audits import audit_tables, findings

from jobs.reconstruct.damage import damaged_ranges

DLEDGER = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-4.9.8-dledger"
OP = "RMQ_SYS_TRANS_OP_HALF_TOPIC"


def test_interior_damage_in_the_uncommitted_tail_is_lost_the_torn_end_is_not():
    # uncommitted messages start at 2000 .. 2999 (the last one starts at 2999)
    tail = [{"kind": "DLEDGER_UNCOMMITTED", "source": "dledger", "physical_offset": 2000, "length": 1000}]
    interior = [{"kind": "RESYNC", "source": "dledger", "physical_offset": 2500, "length": 100}]
    d = damaged_ranges(findings(tail + interior))
    assert d.start.tolist() == [2500] and d.end.tolist() == [2600], (d.start, d.end)
    # the last message's own record unreadable (a point at its start), or damage with no entry after it
    last = [{"kind": "BAD_MAGIC", "source": "dledger", "physical_offset": 2999}]
    end = [{"kind": "BAD_TOTAL_SIZE", "source": "dledger", "physical_offset": 3100, "length": 500}]
    assert len(damaged_ranges(findings(tail + last + end))) == 0
    d = damaged_ranges(findings(tail + interior + end))
    assert d.start.tolist() == [2500], d.start


def _truth():
    with gzip.open(DLEDGER / "truth" / "crashed" / "commitlog.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def _first_uncommitted_offset():
    committed = json.loads((DLEDGER / "truth" / "crashed" / "store_state.json").read_text())[
        "recovered_committedIndex"]
    for line in (DLEDGER / "truth" / "crashed" / "dledger_index.jsonl").read_text().splitlines():
        unit = json.loads(line)
        if unit["index"] == committed + 1:
            return unit["pos"] + 48
    raise AssertionError("the crashed fixture has no uncommitted tail")


def _uncommitted_commit_with_later_op(recs):
    """The first COMMIT record past committedIndex followed by an op record (in the log) of the same half."""
    tail = _first_uncommitted_offset()
    halves = {r["physicalOffset"]: r for r in recs if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"}
    ops = {}
    for o in recs:
        if o["topic"] == OP:
            for piece in base64.b64decode(o["body_b64"]).decode().split(","):
                if piece.strip():
                    ops[int(piece)] = max(ops.get(int(piece), -1), o["physicalOffset"])
    for c in sorted(recs, key=lambda r: r["physicalOffset"]):
        half = halves.get(c.get("preparedTransactionOffset"))
        if c["tranType"] == 8 and c["physicalOffset"] >= tail and half is not None \
                and ops.get(half["queueOffset"], -1) > c["physicalOffset"]:
            return c
    raise AssertionError("no COMMIT record in the uncommitted tail has an op record after it")


def _audit(spark, store, out, mode, as_of_ms):
    as_of = dt.datetime.fromtimestamp(as_of_ms // 1000 + 1, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return audit_tables(spark, store, out, mode, as_of)


@pytest.mark.spark
def test_zeroed_commit_in_the_uncommitted_tail_is_uncertain_not_rolled_back(spark, tmp_path):
    recs = _truth()
    commit = _uncommitted_commit_with_later_op(recs)
    store = tmp_path / "store-crashed"
    shutil.copytree(DLEDGER / "store-crashed", store)
    with open(store / "dledger-n0" / "data" / commit["file"], "r+b") as f:
        f.seek(commit["filePos"])
        f.write(b"\0" * commit["storeSize"])
    as_of = max(r["storeTimestamp"] for r in recs)
    key = commit["uniqKey"]
    for mode in ("full", "indexed"):
        got = _audit(spark, store, tmp_path / f"out-{mode}", mode, as_of)
        (t,) = [t for t in got["transactions"] if t["transaction_key"] == key]
        assert t["state"] != "ROLLED_BACK", (mode, t["state"], t["flags"])
        assert "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"], (mode, t["flags"])
        finding = [a for a in got["anomalies"] if a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"
                   and a["transaction_key"] == key]
        assert len(finding) == 1 and finding[0]["physical_offset"] <= commit["physicalOffset"], (mode, finding)
        assert finding[0]["physical_offset"] + finding[0]["length"] > commit["physicalOffset"], (mode, finding)
