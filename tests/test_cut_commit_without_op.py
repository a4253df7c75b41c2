"""A CommitLog file cut between a COMMIT record and the op record naming its half (the op lay in the lost
range): COMMIT_WITHOUT_OP must not be asserted from the missing op.

EndTransactionProcessor writes the COMMIT record (``sendFinalMessage``) before the op
(``deletePrepareMessage``; 5.1+ batches ops and writes them later, still after), so an op that is not read
while bytes after the COMMIT are lost may well have been written there.  On copies of the 5.3.3 fixture (one
CommitLog file, no configured file size: the cut leaves a torn end, which the op queue's unit pointing past
it makes a lost range, ``CQ_PAST_DATA_END``) the file is cut right after the COMMIT record of a transaction
whose only op comes later (``after_commit``) and inside that op record (``in_op``).  In both modes: the
transaction stays COMMITTED (its COMMIT was read) without COMMIT_WITHOUT_OP and with
STATE_UNCERTAIN_DAMAGED_RANGE; every transaction whose state or flags differ from the intact store's carries
a damage flag; none whose half record is intact is dropped.
"""
from __future__ import annotations

import shutil

import pytest
from damage_audits import audit_both_modes
from test_damage_inference import V533, _committed_with_single_op, _truth

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {UNCERTAIN, "CORRUPT_RECORD", "CQ_MISMATCH", "PREPARED_RECORD_MISSING", "OP_BODY_MISSING"}
CUTS = ("after_commit", "in_op")


@pytest.fixture(scope="module")
def cut(spark, tmp_path_factory):
    commit, op = _committed_with_single_op(_truth())
    assert commit["file"] == op["file"]
    base = tmp_path_factory.mktemp("cutcwo")
    roots = {"intact": str(V533 / "store")}
    at = {"after_commit": commit["filePos"] + commit["storeSize"], "in_op": op["filePos"] + 7}
    for name in CUTS:
        root = base / name
        shutil.copytree(V533 / "store", root)
        path = root / "commitlog" / commit["file"]
        data = path.read_bytes()[:at[name]]
        path.unlink()                   # a copy of the fixture: replaced, never written through
        path.write_bytes(data)
        roots[name] = str(root)
    return commit, audit_both_modes(spark, roots, ("transactions",))


@pytest.mark.spark
@pytest.mark.parametrize("name", CUTS)
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_cut_op_is_no_commit_without_op(cut, mode, name):
    commit, got = cut
    tx = {b: {t["transaction_key"]: t for t in got[mode]["transactions"] if t["broker"] == b}
          for b in ("intact", name)}
    intact, damaged = tx["intact"], tx[name]
    mine = [k for k, t in intact.items() if commit["physicalOffset"] in (t["commit_offsets"] or [])]
    assert len(mine) == 1
    t = damaged[mine[0]]
    assert intact[mine[0]]["state"] == t["state"] == "COMMITTED"
    assert "COMMIT_WITHOUT_OP" not in t["flags"] and UNCERTAIN in t["flags"], t["flags"]
    assert not [k for k, v in intact.items() if "COMMIT_WITHOUT_OP" not in v["flags"]
                and k in damaged and "COMMIT_WITHOUT_OP" in damaged[k]["flags"]
                and not set(damaged[k]["flags"]) & DAMAGE]
    for k, v in damaged.items():
        if k in intact and (v["state"], sorted(v["flags"])) != (intact[k]["state"], sorted(intact[k]["flags"])):
            assert set(v["flags"]) & DAMAGE, (k, intact[k]["state"], intact[k]["flags"], v["state"], v["flags"])
    dropped = [k for k, v in intact.items() if k not in damaged
               and (v["prepared_commitlog_offset"] or 0) < commit["physicalOffset"]]
    assert not dropped
