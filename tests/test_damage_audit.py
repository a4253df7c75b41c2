"""A CommitLog file cut right after a record: the decoder reports TRUNCATED_FILE (RocketMQ always leaves >= 8
bytes of BLANK filler or zeros after a record), and the audit never changes a transaction's state silently:
every transaction whose state differs from the intact store's carries STATE_UNCERTAIN_DAMAGED_RANGE (and a
CHECK_BACK_DAMAGED recovery entry), in both modes."""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from txlog_io.commitlog_decode import decode_file

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
V533 = FIXTURES / "rocketmq-5.3.3"


def _truth_records():
    with gzip.open(V533 / "truth" / "commitlog.jsonl.gz") as f:
        return [json.loads(line) for line in f]


def _cut_after(tmp: Path, record: dict) -> Path:
    root = tmp / f"cut{record['filePos']}" / "store"
    shutil.copytree(V533 / "store", root)
    os.truncate(root / "commitlog" / record["file"], record["filePos"] + record["storeSize"])
    return root


def test_file_cut_at_a_record_boundary_is_reported(tmp_path):
    recs = _truth_records()
    half = [r for r in recs if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"][40]
    root = _cut_after(tmp_path, half)
    path = root / "commitlog" / half["file"]
    rows, found = 0, []
    for batch, anomalies in decode_file(str(path)):
        rows += batch.num_rows
        found += anomalies
    assert rows == sum(1 for r in recs if r["physicalOffset"] <= half["physicalOffset"])
    assert [(a.kind, a.position) for a in found] == [("TRUNCATED_FILE", half["filePos"] + half["storeSize"])]
    intact = [a for _, anomalies in decode_file(str(V533 / "store" / "commitlog" / half["file"]))
              for a in anomalies]
    assert intact == []


@pytest.mark.spark
def test_no_silent_state_change_after_a_cut(spark, tmp_path):
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct.spark import reconstruct

    recs = _truth_records()
    halves = [r for r in recs if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"]
    cut = _cut_after(tmp_path, halves[len(halves) // 2])
    stores, brokers = [str(V533 / "store"), str(cut)], ["intact", "cut"]
    for mode in ("full", "indexed"):
        result = reconstruct(load_store_frames(spark, stores, mode=mode, brokers=brokers), None, local=True)
        tx = result.arrow["transactions"].to_pylist()
        by = {(t["broker"], t["transaction_key"]): t for t in tx}
        intact = {k: t for (b, k), t in by.items() if b == "intact"}
        damaged = {k: t for (b, k), t in by.items() if b == "cut"}
        changed = [k for k, t in damaged.items() if t["state"] != intact[k]["state"]]
        assert changed, mode                        # the cut does lose commits / ops / discards
        assert all("STATE_UNCERTAIN_DAMAGED_RANGE" in damaged[k]["flags"] for k in changed), mode
        assert not any("STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"] for t in intact.values()), mode
        review = {(r["broker"], r["transaction_key"]) for r in result.arrow["recovery"].to_pylist()
                  if r["action"] == "CHECK_BACK_DAMAGED"}
        assert all(("cut", k) in review for k in changed), mode
        codes = [a["code"] for a in result.arrow["anomalies"].to_pylist() if a["broker"] == "cut"]
        assert "TRUNCATED_FILE" in codes, mode
