"""A consume-queue unit pointing at or past where a CommitLog file's readable data ends is evidence that the
broker wrote a record there (jobs/reconstruct/damage.py, ``CQ_PAST_DATA_END``).

Reproduced on copies of the 5.3.3 RocksDB-consume-queue fixture (one CommitLog file, no ``config/``):

* ``zero``: bytes 36,864-40,960 of the CommitLog zeroed (written data goes on to 41,237).  The read takes the
  zeros for the end of data and the records after them for the torn end a crash leaves
  (GARBAGE_AFTER_END); two discard records lay in the page.  Before, full mode read DISCARDED -> PREPARED
  with no flag; the RocksDB units pointing into the page were the only sign.
* ``cut``: the file cut inside a record at byte 14,376 (TRUNCATED_RECORD, no FILE_SIZE_MISMATCH: the file
  size is inferred from the file itself).  Before, seven transactions whose COMMIT lay past the cut silently
  became PREPARED.

Now every state that differs from the intact audit carries a damage flag, the lost range starts where the
readable data ends, and both modes agree.  The intact store's audit has no such range."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from damage_audits import audit_tables, findings

from jobs.reconstruct.damage import PAST_END, damaged_ranges, past_end_of

FIXTURE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3-rocksdb" / "store"
AS_OF = "2026-11-20T00:00:00Z"
DAMAGE_FLAGS = {"STATE_UNCERTAIN_DAMAGED_RANGE", "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING",
                "OP_BODY_MISSING"}
ZERO = (36864, 40960)
CUT = 14376
LOG = "00000000000000000000"


def _units(rows):
    return pa.table({"topic": [r[0] for r in rows], "commitlog_offset": [r[1] for r in rows],
                     "size": [r[2] for r in rows]},
                    schema=pa.schema([("topic", pa.string()), ("commitlog_offset", pa.int64()),
                                      ("size", pa.int32())]))


def test_units_past_the_data_end_make_a_lost_range():
    garbage = {"kind": "GARBAGE_AFTER_END", "source": "commitlog", "physical_offset": 1040960,
               "position": 40960, "length": 100, "detail": "non-zero bytes after the end of data at 36873",
               "data_end": 1036873}
    records = pa.table({"physical_offset": pa.array([1000000, 1036000, 1041000], pa.int64())})
    units = _units([("RMQ_SYS_TRANS_OP_HALF_TOPIC", 1039481, 200), ("RMQ_SYS_TRANS_HALF_TOPIC", 1036000, 300),
                    ("TopicTest", 1039000, 5000), ("RMQ_SYS_TRANS_OP_HALF_TOPIC", 1041000, 90)])
    d = damaged_ranges(findings([garbage]), past_end_of(records, units))
    # from the end of data (file base 1,000,000 + 36,873) to the unit's end; the unit at a record read
    # (1,041,000) and the other topic's unit do not count
    assert d.start.tolist() == [1036873] and d.end.tolist() == [1039681], (d.start, d.end)
    assert PAST_END in d.what[0]
    # the torn end alone, or without units past it, is no lost range (a crash's torn tail)
    assert len(damaged_ranges(findings([garbage]))) == 0
    assert len(damaged_ranges(findings([garbage]), past_end_of(records, units.slice(1, 1)))) == 0
    cut = {"kind": "TRUNCATED_RECORD", "source": "commitlog", "physical_offset": 14371, "position": 14371,
           "length": 5, "data_end": 14371}
    d = damaged_ranges(findings([cut]), past_end_of(pa.table({"physical_offset": pa.array([0], pa.int64())}),
                                                     _units([("RMQ_SYS_TRANS_OP_HALF_TOPIC", 15000, 100),
                                                             ("RMQ_SYS_TRANS_OP_HALF_TOPIC", 20000, 100)])))
    assert d.start.tolist() == [14371] and d.end.tolist() == [20100]
    # past a DLedger log's committed index a crash's torn entries stay no lost range
    tail = {"kind": "DLEDGER_UNCOMMITTED", "source": "dledger", "physical_offset": 10000}
    assert len(damaged_ranges(findings([tail, dict(cut, source="dledger")]),
                              past_end_of(pa.table({"physical_offset": pa.array([], pa.int64())}),
                                          _units([("RMQ_SYS_TRANS_OP_HALF_TOPIC", 15000, 100)])))) == 0
    assert np.all(d.end > d.start)


def _damage(tmp: Path, how: str) -> Path:
    root = tmp / how / "store"
    shutil.copytree(FIXTURE, root)
    log = root / "commitlog" / LOG
    if how == "zero":
        with open(log, "r+b") as f:
            f.seek(ZERO[0])
            f.write(bytes(ZERO[1] - ZERO[0]))
    else:
        os.truncate(log, CUT)
    return root


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("cq_past_end")
    out = {}
    for mode in ("full", "indexed"):
        out[("intact", mode)] = audit_tables(spark, FIXTURE, base / f"out-intact-{mode}", mode, AS_OF)
        for how in ("zero", "cut"):
            out[how] = _damage(base / mode, how)
            out[(how, mode)] = audit_tables(spark, out[how], base / f"out-{how}-{mode}", mode, AS_OF)
    return out


@pytest.mark.spark
@pytest.mark.parametrize("how", ["zero", "cut"])
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_no_state_concluded_from_bytes_past_the_data_end(audits, how, mode):
    intact = {t["transaction_key"]: t for t in audits[("intact", mode)]["transactions"]}
    got = audits[(how, mode)]
    damaged = {t["transaction_key"]: t for t in got["transactions"]}
    changed = [k for k, t in damaged.items() if k in intact and t["state"] != intact[k]["state"]]
    assert changed, "the damage hides resolutions: some state must change"
    silent = [(k, intact[k]["state"], damaged[k]["state"]) for k in changed
              if not DAMAGE_FLAGS & set(damaged[k]["flags"])]
    assert not silent, silent
    lo = ZERO[0] if how == "zero" else CUT - 8
    ranges = [a for a in got["anomalies"] if a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"
              and a["physical_offset"] is not None]
    assert ranges and all(lo <= a["physical_offset"] <= (ZERO[1] if how == "zero" else CUT) for a in ranges)
    if how == "cut" or mode == "full":      # indexed mode reads the zeroed units' positions (CQ_ENTRY_MISMATCH)
        assert any(PAST_END in (a["detail"] or "") for a in ranges), ranges[:3]


@pytest.mark.spark
@pytest.mark.parametrize("how", ["zero", "cut"])
def test_both_modes_agree(audits, how):
    full = {t["transaction_key"]: (t["state"], sorted(t["flags"])) for t in audits[(how, "full")]["transactions"]}
    indexed = {t["transaction_key"]: (t["state"], sorted(t["flags"]))
               for t in audits[(how, "indexed")]["transactions"]}
    assert full == indexed


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_intact_store_has_no_lost_range(audits, mode):
    got = audits[("intact", mode)]
    assert not [a for a in got["anomalies"] if PAST_END in (a["detail"] or "")
                or a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"]
    assert not [t for t in got["transactions"] if "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"]]


@pytest.mark.spark
@pytest.mark.slow
def test_the_executor_reduction_finds_the_same_ranges(spark, audits, tmp_path, monkeypatch):
    """The DataFrame plan with the reduction on the executors (jobs/reconstruct/distributed.py, forced by
    LOCAL_MAX_ROWS = 0) gives the same states, flags and lost ranges as the driver's."""
    from jobs.reconstruct import spark as reconstruct

    monkeypatch.setattr(reconstruct, "LOCAL_MAX_ROWS", 0)
    got = audit_tables(spark, audits["cut"], tmp_path / "out", "full", AS_OF)

    def view(a):
        return ({t["transaction_key"]: (t["state"], sorted(t["flags"])) for t in a["transactions"]},
                sorted((r["transaction_key"], r["physical_offset"], r["length"]) for r in a["anomalies"]
                       if r["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"))
    assert view(got) == view(audits[("cut", "full")])
