"""A half consume-queue unit whose offset survived but whose size field is garbage (a block of garbage that
starts inside the unit) must not narrow indexed mode's scan of the hole after it: the scan starts at that
unit's record, not at the end its size claims (jobs/read/indexed/holes.py ``hole_gaps``).  Without that, a
size stretching over the hole's records made indexed mode drop transactions whose halves are intact in the
CommitLog (the 4.9.8 DLedger store, units 237..280 garbled)."""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest
from damage_audits import audit_both_modes, states

FIXTURE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-4.9.8-dledger" / "store-clean"
QUEUE = Path("consumequeue") / "RMQ_SYS_TRANS_HALF_TOPIC" / "0" / ("0" * 20)
UNIT = struct.Struct(">qiq")                  # ConsumeQueue CQ_STORE_UNIT_SIZE: offset, size, tags code
BEFORE, AFTER = 236, 281

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("garbled-size")
    roots = {}
    for name in ("intact", "garbled"):
        shutil.copytree(FIXTURE, base / name)
        roots[name] = str(base / name)
    f = base / "garbled" / QUEUE
    data = bytearray(f.read_bytes())
    off_before, _, tags = UNIT.unpack_from(data, BEFORE * UNIT.size)
    off_after = UNIT.unpack_from(data, AFTER * UNIT.size)[0]
    # the before-unit's size reaches to just short of the after-unit's record: it still fits the queue's order
    UNIT.pack_into(data, BEFORE * UNIT.size, off_before, off_after - off_before - 1, tags)
    data[(BEFORE + 1) * UNIT.size:AFTER * UNIT.size] = b"\xff" * ((AFTER - BEFORE - 1) * UNIT.size)
    f.unlink()                                # a copy: the fixture is never written
    f.write_bytes(bytes(data))
    return {"off_before": off_before, **audit_both_modes(spark, roots)}


def test_a_garbled_unit_size_does_not_narrow_the_scan_of_the_hole(audits):
    truth = states(audits["full"], "intact")
    assert len(truth) > 100
    assert states(audits["full"], "garbled") == truth
    got = states(audits["indexed"], "garbled")
    assert got == truth, {k: (got.get(k), v) for k, v in truth.items() if got.get(k) != v}
    holes = [a for a in audits["indexed"]["anomalies"] if a["broker"] == "garbled"
             and a["code"] == "INDEX_INCOMPLETE" and "QUEUE_UNITS_MISSING" in a["detail"]]
    assert any(f"between units {BEFORE} and {AFTER}" in a["detail"]
               and f"scanned CommitLog [{audits['off_before']}," in a["detail"] for a in holes), holes
