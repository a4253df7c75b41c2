"""A DLedger entry garbled in the middle of the log, found by indexed mode through the DLedger index.

Reproduced on a copy of the 4.9.8 DLedger crashed fixture: a random block over bytes 120,812-124,715 of the
first data file (the tail of a half record and the next entry, which no transaction queue unit points to).
Full mode reads the entry's bytes as BAD_MAGIC (a lost range) and flags the transactions whose state rests on
them; indexed mode does not scan those bytes, and its only sign is the DLedger index unit of the entry
(``DLEDGER_INDEX_MISMATCH`` "has no entry in the data files"): it now carries the entry's position when the
entry lies before the last one read, and that position is a lost point (jobs/reconstruct/damage.py).  Before,
indexed mode read ROLLED_BACK -> PREPARED (``PREPARED_PASSED_BY_CHECKER``) with no damage flag."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from jobs.reconstruct.damage import damaged_ranges

STORE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-4.9.8-dledger" / "store-crashed"
DATA = Path("dledger-n0") / "data" / "00000000000000000000"
BLOCK = (120812, 124715)
ENTRY = 120847            # the entry whose header the block garbles
AS_OF = "2026-11-20T00:00:00Z"
DAMAGE_FLAGS = {"STATE_UNCERTAIN_DAMAGED_RANGE", "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING",
                "OP_BODY_MISSING"}


def _damaged(tmp: Path) -> Path:
    root = tmp / "store"
    shutil.copytree(STORE, root)
    with open(root / DATA, "r+b") as f:
        f.seek(BLOCK[0])
        f.write(random.Random(3217).randbytes(BLOCK[1] - BLOCK[0]))
    return root


def test_an_index_unit_without_its_entry_is_a_lost_point(tmp_path):
    from txlog_io.dledger_store import verify_dledger
    from txlog_io.mappedfile import discover_store

    found = [a for a in verify_dledger(discover_store(str(_damaged(tmp_path))))
             if a.kind == "DLEDGER_INDEX_MISMATCH" and "has no entry" in a.detail]
    assert [a.physical_offset for a in found] == [ENTRY]
    assert not [a for a in verify_dledger(discover_store(str(STORE))) if a.kind == "DLEDGER_INDEX_MISMATCH"]
    rows = [{"kind": a.kind, "source": a.source, "physical_offset": a.physical_offset, "length": a.length,
             "expected": a.expected, "actual": a.actual} for a in found]
    # the torn tail's unit (no position: past the last entry) and the other variants are no lost range
    rows += [{"kind": "DLEDGER_INDEX_MISMATCH", "source": "dledger", "physical_offset": None,
              "expected": "an entry", "actual": "none"},
             {"kind": "DLEDGER_INDEX_MISMATCH", "source": "dledger", "physical_offset": 500,
              "expected": "(1, 2, 3, 4, 5)", "actual": "(1, 2, 3, 4, 6)"}]
    cols = ("kind", "source", "physical_offset", "length", "expected", "actual")
    table = pa.table({c: [r.get(c) for r in rows] for c in cols},
                     schema=pa.schema([(c, pa.int64() if c in ("physical_offset", "length") else pa.string())
                                       for c in cols]))
    d = damaged_ranges(table)
    assert d.start.tolist() == [ENTRY] and d.end.tolist() == [ENTRY + 1]


@pytest.mark.spark
def test_indexed_mode_flags_what_rests_on_the_lost_entry(spark, tmp_path):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    def audit(store, out):
        _, opts = parse_args(["audit", "--store", str(store), "--out", str(out), "--as-of", AS_OF,
                              "--mode", "indexed"])
        got = {}

        def on_result(result, summary):
            got["tx"] = result.transactions.toPandas().to_dict("records")

        run_audit(spark, opts, on_result=on_result, print_summary=False)
        return {(t["transaction_key"], t["first_copy_commitlog_offset"]): t for t in got["tx"]}

    intact = audit(STORE, tmp_path / "out-intact")
    damaged = audit(_damaged(tmp_path), tmp_path / "out-damaged")
    changed = [k for k in damaged if k in intact and damaged[k]["state"] != intact[k]["state"]]
    assert changed
    silent = [(k, intact[k]["state"], damaged[k]["state"], list(damaged[k]["flags"])) for k in changed
              if not DAMAGE_FLAGS & set(damaged[k]["flags"])]
    assert not silent, silent
