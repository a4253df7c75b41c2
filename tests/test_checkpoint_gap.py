"""Indexed mode: the checkpoint says consume-queue units were written past the end of every queue
(jobs/read/indexed/checkpoint.py).

A copy of the 5.3.3 fixture whose every consume queue lost its newest 10 units (zeroed): the dispatch point
moves back to CommitLog offset 958938, whose record was stored before the checkpoint's logicsMsgTimestamp.
The plan gets one QUEUE_UNITS_PAST_CHECKPOINT gap (from there to the CommitLog's end), the audit one
INDEX_INCOMPLETE finding naming it, and full and indexed mode agree on every transaction.  The intact fixture
(and the same copy with only the 3 newest units gone: their records were stored in the checkpoint's very
millisecond) gets none.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes

V533 = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3" / "store"


def _cut_every_queue(root: Path, units: int) -> None:
    for q in sorted((root / "consumequeue").glob("*/*")):
        newest = sorted(q.iterdir())[-1]
        data = bytearray(newest.read_bytes())
        end = -(-len(data.rstrip(b"\0")) // 20) * 20
        keep = max(0, end - units * 20)
        data[keep:end] = bytes(end - keep)
        newest.write_bytes(bytes(data))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("checkpoint")
    out = {}
    for name, units in (("intact", 0), ("cut3", 3), ("cut10", 10)):
        shutil.copytree(V533, base / name)
        if units:
            _cut_every_queue(base / name, units)
        out[name] = str(base / name)
    return out


def _gaps(root):
    from jobs.read.indexed.checkpoint import checkpoint_gaps
    from jobs.read.indexed.plan import dispatch_ends
    from jobs.read.stores import store_info

    info = store_info("b", root, None)
    return checkpoint_gaps([info], dispatch_ends([info]))


def test_units_lost_before_the_checkpoint_make_a_gap(stores):
    assert _gaps(stores["intact"]) == [] and _gaps(stores["cut3"]) == []
    (row,) = _gaps(stores["cut10"])
    assert row[1:4] == (958938, 1 << 20, "QUEUE_UNITS_PAST_CHECKPOINT")
    assert "logicsMsgTimestamp 1795305150212" in row[5] and row[6] == os.path.join(stores["cut10"], "consumequeue")


@pytest.mark.spark
def test_full_and_indexed_agree_and_indexed_names_the_checkpoint(spark, stores):
    roots = {"intact": stores["intact"], "cut10": stores["cut10"]}
    got = audit_both_modes(spark, roots)

    def view(g, broker):
        return {t["transaction_key"]: (t["state"], sorted(t["flags"])) for t in g["transactions"]
                if t["broker"] == broker}

    assert view(got["indexed"], "cut10") == view(got["full"], "cut10")
    assert set(view(got["full"], "cut10")) == set(view(got["full"], "intact"))
    found = [a for a in got["indexed"]["anomalies"] if a["code"] == "INDEX_INCOMPLETE"
             and "QUEUE_UNITS_PAST_CHECKPOINT" in (a["detail"] or "")]
    assert [a["broker"] for a in found] == ["cut10"], found
