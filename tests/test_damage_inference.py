"""Inference only from complete evidence: a state reached by the absence of a record is checked against the
CommitLog ranges the read could not take as records (jobs/reconstruct/damage.py).

Reproduced on a copy of the 5.3.3 fixture: the COMMIT record of a transaction whose op record (a later,
comma-batched op message) survives is zeroed (a zeroed page: RESYNC) or overwritten with garbage (BAD_MAGIC).
Before, the audit said ROLLED_BACK with no flag ("op without COMMIT = rollback"); now the state is
UNKNOWN_DAMAGED with STATE_UNCERTAIN_DAMAGED_RANGE, a finding naming the range, a CHECK_BACK_DAMAGED recovery
entry and a check-back row, in full and indexed mode alike.  The only op record naming a committed half
zeroed: COMMITTED stands (its COMMIT was read), COMMIT_WITHOUT_OP is not asserted, the damage flag is set.
The intact fixture's audit is unchanged (no flag, no UNKNOWN_DAMAGED)."""
from __future__ import annotations

import base64
import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from damage_audits import audit_tables, findings

from jobs.reconstruct.damage import damaged_ranges

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
V533 = FIXTURES / "rocketmq-5.3.3"
AS_OF = "2026-11-20T00:00:00Z"
TABLES = ("transactions", "recovery", "anomalies", "check_back")
HALF, OP = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"


def test_damaged_ranges_merge_and_overlap():
    d = damaged_ranges(findings([
        {"kind": "RESYNC", "source": "commitlog", "physical_offset": 100, "length": 50},
        {"kind": "BAD_MAGIC", "source": "commitlog", "physical_offset": 140, "length": 20},
        {"kind": "TRUNCATED_FILE", "source": "commitlog", "physical_offset": 1000},
        {"kind": "FILE_SIZE_MISMATCH", "source": "commitlog", "physical_offset": 0, "expected": "4096",
         "actual": "1000"},
        {"kind": "FILE_GAP", "source": "commitlog", "physical_offset": 8192, "length": 4096},
        {"kind": "BODY_CRC_MISMATCH", "source": "commitlog", "physical_offset": 5000, "length": 300},
        {"kind": "TRUNCATED_RECORD", "source": "commitlog", "physical_offset": 7000, "length": 5},
        {"kind": "BAD_CQ_ENTRY", "source": "consumequeue", "physical_offset": 6000, "length": 20},
    ]))
    assert d.start.tolist() == [100, 1000, 8192] and d.end.tolist() == [160, 4096, 12288]
    assert "RESYNC" in d.what[0] and "BAD_MAGIC" in d.what[0] and "TRUNCATED_FILE" in d.what[1]
    lo = (np.array([0, 160, 4096, 150, 0]), np.array([True, True, True, True, False]))
    hi = (np.array([100, 900, 5000, 0, 50]), np.array([True, True, True, False, True]))
    # (0,100) touches none; (160,900) none; (4096,5000) none; (150, inf) the first; (-inf, 50) none
    assert d.first_overlap(lo, hi).tolist() == [-1, -1, -1, 0, -1]
    assert d.first_overlap((np.array([99]), np.array([True])), (np.array([101]), np.array([True]))).tolist() \
        == [0]
    assert len(damaged_ranges(findings([]))) == 0


def test_dledger_uncommitted_tail_keeps_file_cuts_only():
    """Past DLEDGER_UNCOMMITTED a crash's torn entries are no lost range (recovery truncates them), a file cut
    short or missing is: DLedger maps each data file at full size, and recovery keeps whole uncommitted
    entries (a one-node group commits them again)."""
    tail = [{"kind": "DLEDGER_UNCOMMITTED", "source": "dledger", "physical_offset": 2000}]
    torn = [{"kind": "BAD_TOTAL_SIZE", "source": "dledger", "physical_offset": 2500, "length": 40},
            {"kind": "RESYNC", "source": "dledger", "physical_offset": 2600, "length": 100}]
    assert len(damaged_ranges(findings(tail + torn))) == 0
    cut = [{"kind": "TRUNCATED_FILE", "source": "dledger", "physical_offset": 3000},
           {"kind": "FILE_SIZE_MISMATCH", "source": "dledger", "physical_offset": 0, "expected": "8192",
            "actual": "3000"}]
    d = damaged_ranges(findings(tail + torn + cut))
    assert d.start.tolist() == [3000] and d.end.tolist() == [8192], (d.start, d.end)
    gap = [{"kind": "FILE_GAP", "source": "dledger", "physical_offset": 8192, "length": 8192}]
    assert damaged_ranges(findings(tail + gap)).start.tolist() == [8192]
    before = [{"kind": "RESYNC", "source": "dledger", "physical_offset": 100, "length": 10}]
    assert damaged_ranges(findings(tail + before + torn)).start.tolist() == [100]


def _truth():
    with gzip.open(V533 / "truth" / "commitlog.jsonl.gz") as f:
        return [json.loads(line) for line in f]


def _commit_with_later_op(recs):
    """The newest COMMIT record whose half is named in an op record written after it: (commit, half)."""
    halves = {r["physicalOffset"]: r for r in recs if r["topic"] == HALF}
    ops = [r for r in recs if r["topic"] == OP]
    named = {}
    for o in ops:
        for piece in base64.b64decode(o["body_b64"]).decode().split(","):
            if piece.strip():
                named.setdefault(int(piece), o["physicalOffset"])
    for c in sorted((r for r in recs if r["tranType"] == 8 and r["preparedTransactionOffset"] in halves),
                    key=lambda r: -r["physicalOffset"]):
        half = halves[c["preparedTransactionOffset"]]
        if named.get(half["queueOffset"], -1) > c["physicalOffset"]:
            return c, half
    raise AssertionError("the fixture has no COMMIT record followed by its op")


def _only_op_of(recs, half):
    """The op record naming ``half`` when it is the only one that does, else None."""
    hits = [o for o in recs if o["topic"] == OP and str(half["queueOffset"]) in
            [p.strip() for p in base64.b64decode(o["body_b64"]).decode().split(",")]]
    return hits[0] if len(hits) == 1 else None


def _committed_with_single_op(recs):
    """A COMMIT record whose half is named by exactly one op record, written after it: (commit, op)."""
    halves = {r["physicalOffset"]: r for r in recs if r["topic"] == HALF}
    for c in sorted((r for r in recs if r["tranType"] == 8 and r["preparedTransactionOffset"] in halves),
                    key=lambda r: -r["physicalOffset"]):
        op = _only_op_of(recs, halves[c["preparedTransactionOffset"]])
        if op is not None and op["physicalOffset"] > c["physicalOffset"]:
            return c, op
    raise AssertionError("the fixture has no COMMIT record whose half only one op names")


def _damage(tmp: Path, rec: dict, how: str) -> Path:
    root = tmp / how / "store"
    shutil.copytree(V533 / "store", root)
    junk = bytes(range(7, 104)) * (rec["storeSize"] // 97 + 1)
    with open(root / "commitlog" / rec["file"], "r+b") as f:
        f.seek(rec["filePos"])
        f.write((b"\0" * rec["storeSize"]) if how == "zero" else junk[:rec["storeSize"]])
    return root


@pytest.fixture(scope="module")
def cases(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("inference")
    commit, half = _commit_with_later_op(_truth())
    op_commit, op = _committed_with_single_op(_truth())
    out = {"commit": commit, "half": half, "op_commit": op_commit, "op": op}
    for mode in ("full", "indexed"):
        out[("intact", mode)] = audit_tables(spark, V533 / "store", base / f"out-intact-{mode}", mode, AS_OF, TABLES)
        for how in ("zero", "garbage"):
            store = _damage(base / mode, commit, how)
            out[(how, mode)] = audit_tables(spark, store, base / f"out-{how}-{mode}", mode, AS_OF, TABLES)
        store = _damage(base / mode / "op", op, "zero")
        out[("op", mode)] = audit_tables(spark, store, base / f"out-op-{mode}", mode, AS_OF, TABLES)
    return out


@pytest.mark.spark
@pytest.mark.parametrize("how", ["zero", "garbage"])
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_lost_commit_before_a_surviving_op_is_unknown_not_rolled_back(cases, how, mode):
    commit = cases["commit"]
    intact = {t["transaction_key"]: t for t in cases[("intact", mode)]["transactions"]}
    got = cases[(how, mode)]
    damaged = {t["transaction_key"]: t for t in got["transactions"]}
    assert set(damaged) == set(intact)
    key = commit["uniqKey"]
    assert intact[key]["state"] == "COMMITTED"
    assert damaged[key]["state"] == "UNKNOWN_DAMAGED"
    assert "STATE_UNCERTAIN_DAMAGED_RANGE" in damaged[key]["flags"]
    for k, t in damaged.items():        # never a silent change: every changed state or flag set says why
        if t["state"] != intact[k]["state"]:
            assert "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"], (k, t["state"], intact[k]["state"])
        assert t["state"] != "ROLLED_BACK" or intact[k]["state"] == "ROLLED_BACK", k
    finding = [a for a in got["anomalies"] if a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"
               and a["transaction_key"] == key]
    assert len(finding) == 1 and finding[0]["physical_offset"] <= commit["physicalOffset"]
    assert finding[0]["physical_offset"] + finding[0]["length"] > commit["physicalOffset"]
    assert "UNKNOWN_DAMAGED" in finding[0]["detail"] and str(cases["half"]["physicalOffset"]) in \
        finding[0]["detail"]
    recovery = {r["transaction_key"]: r for r in got["recovery"]}
    assert recovery[key]["action"] == "CHECK_BACK_DAMAGED"
    assert key in {r["transaction_key"] for r in got["check_back"]}


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_intact_fixture_has_no_uncertain_state(cases, mode):
    got = cases[("intact", mode)]
    assert not [t for t in got["transactions"] if "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"]
                or t["state"] == "UNKNOWN_DAMAGED"]
    assert not [a for a in got["anomalies"] if a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"]
    assert not [r for r in got["recovery"] if r["action"] == "CHECK_BACK_DAMAGED"]


@pytest.mark.spark
def test_both_modes_agree_on_the_damaged_store(cases):
    for how in ("zero", "garbage", "op"):
        full = {t["transaction_key"]: (t["state"], sorted(t["flags"]))
                for t in cases[(how, "full")]["transactions"]}
        indexed = {t["transaction_key"]: (t["state"], sorted(t["flags"]))
                   for t in cases[(how, "indexed")]["transactions"]}
        assert full == indexed, how


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_commit_without_op_is_not_asserted_when_the_op_could_be_lost(cases, mode):
    """The only op record naming a committed half zeroed: the COMMIT was read (COMMITTED stands), but
    "no op" rests on the lost bytes after it -- COMMIT_WITHOUT_OP is not asserted, the damage flag is set,
    and the work list reviews it instead of sending a committed transaction to a check-back."""
    key = cases["op_commit"]["uniqKey"]
    intact = {t["transaction_key"]: t for t in cases[("intact", mode)]["transactions"]}
    got = cases[("op", mode)]
    damaged = {t["transaction_key"]: t for t in got["transactions"]}
    assert intact[key]["state"] == damaged[key]["state"] == "COMMITTED"
    assert "COMMIT_WITHOUT_OP" not in intact[key]["flags"]
    assert "COMMIT_WITHOUT_OP" not in damaged[key]["flags"]
    assert "STATE_UNCERTAIN_DAMAGED_RANGE" in damaged[key]["flags"]
    assert not [k for k, t in damaged.items() if "COMMIT_WITHOUT_OP" in t["flags"]
                and "COMMIT_WITHOUT_OP" not in intact[k]["flags"]]
    finding = [a for a in got["anomalies"] if a["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"
               and a["transaction_key"] == key]
    assert len(finding) == 1 and finding[0]["detail"].startswith("COMMIT_WITHOUT_OP not asserted")
    assert finding[0]["physical_offset"] <= cases["op"]["physicalOffset"] \
        < finding[0]["physical_offset"] + finding[0]["length"]
    recovery = {r["transaction_key"]: r for r in got["recovery"]}
    assert recovery[key]["action"] != "CHECK_BACK_DAMAGED" and "REVIEW_EVIDENCE" in recovery[key]["actions"]
    for k, t in damaged.items():        # every changed state or flag set names the damage
        if (t["state"], sorted(t["flags"])) != (intact[k]["state"], sorted(intact[k]["flags"])):
            assert "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"], (k, t, intact[k])


def test_only_the_first_settled_record_after_each_torn_end_can_stop_its_range():
    import pyarrow as pa

    from jobs.reconstruct.reducer import first_at_or_after

    settled = pa.array([900, 100, 500, 500, 300, 700], pa.int64())
    assert first_at_or_after(settled, [250, 260, 600, 950]) == [300, 700]        # 950: none after it
    assert first_at_or_after(settled, [100]) == [100]                             # at the end itself
    assert first_at_or_after(pa.array([], pa.int64()), [1]) == []


def test_redolog_units_lost_only_before_the_statetables_newest_unit():
    """A transaction record without a redolog unit shows lost units only before the record of the
    statetable's newest unit (3.1.4 dispatches the statetable and redolog units in CommitLog order)."""
    import numpy as np

    from jobs.reconstruct.damage import EMPTY, redolog_gap, with_redolog_gap
    from jobs.reconstruct.evidence import COPY, END, HALF_Q, PREP_R, REDO_E, REDO_P, ST

    def gap(rows):
        role, mech, off = (np.array(x, np.int64) for x in zip(*rows, strict=True))
        return redolog_gap(role, mech, (off, np.ones(len(off), bool)))

    base = [(COPY, PREP_R, 100), (REDO_P, 0, 100), (ST, 0, 100), (END, 0, 300), (REDO_E, 0, 300)]
    assert gap(base).lowest is None and not with_redolog_gap(EMPTY, gap(base)).redolog
    assert gap([r for r in base if r[0] != ST]) is None                      # no statetable: nothing to say
    late = base + [(COPY, PREP_R, 500), (REDO_P, 0, 500), (ST, 0, 500), (END, 0, 700)]  # after st_max: not yet
    assert (gap(late).st_max, gap(late).lowest, gap(late).n) == (500, 700, 1)
    assert not with_redolog_gap(EMPTY, gap(late)).redolog
    lost = late + [(ST, 0, 900)]
    text = with_redolog_gap(EMPTY, gap(lost)).redolog
    assert text.startswith("REDOLOG_UNITS_MISSING: 1 transaction record(s)") and "offset 700" in text
    assert gap(base + [(COPY, HALF_Q, 50)]).lowest is None                  # a half copy is not a 3.x record
    kept = with_redolog_gap(EMPTY.__class__(EMPTY.start, EMPTY.end, (), "", "REDOLOG_ZEROED"), gap(lost))
    assert kept.redolog == "REDOLOG_ZEROED"                                  # a decoder finding stands
