"""3.x statetable / redolog damage feeds the inference from complete evidence (jobs/reconstruct/damage.py
``TABLE_KINDS``, jobs/reconstruct/rules.py).

On copies of the 3.1.4 fixture, the statetable unit (index 12) or the redolog PREPARED unit (index 18) of the
still-PREPARED transaction DTX-12 (prepared record at CommitLog offset 66633) is zeroed.  The audit then sees
no unit for it -- STATETABLE_MISSING_PREPARED / REDOLOG_COMMITLOG_DISAGREE -- while the table itself is
damaged (a zero unit before later ones: GARBAGE_AFTER_END), so that absence rests on unread bytes: the
transaction also carries STATE_UNCERTAIN_DAMAGED_RANGE with a finding naming the table, the statetable
rebuild is still proposed, and every transaction whose state or flags differ from the intact store's says
so.  Full and indexed mode agree; the intact fixture has no such flag.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes

V314 = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-3.1.4" / "store"
KEY = "66633"           # DTX-12's prepared record: statetable index 12, redolog unit 18 (truth/)
UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"


def _zero(path: Path, start: int, n: int) -> None:
    with open(path, "r+b") as f:
        f.seek(start)
        assert any(f.read(n))
        f.seek(start)
        f.write(b"\0" * n)


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("tables")
    roots = {}
    for name in ("intact", "st", "redo"):
        shutil.copytree(V314, base / name)
        roots[name] = str(base / name)
    _zero(base / "st" / "transaction" / "statetable" / ("0" * 20), 12 * 24, 24)
    _zero(base / "redo" / "transaction" / "redolog" / "TRANSACTION_REDOLOG_TOPIC_XXXX" / "0" / ("0" * 20),
          18 * 20, 20)
    return audit_both_modes(spark, roots, ("transactions", "anomalies", "recovery"))


def _tx(got, broker):
    return {t["transaction_key"]: t for t in got["transactions"] if t["broker"] == broker}


@pytest.mark.spark
@pytest.mark.parametrize("broker,flag,table", [("st", "STATETABLE_MISSING_PREPARED", "statetable"),
                                               ("redo", "REDOLOG_COMMITLOG_DISAGREE", "redolog")])
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_flag_from_a_damaged_table_says_it_rests_on_missing_bytes(audits, mode, broker, flag, table):
    got = audits[mode]
    intact, damaged = _tx(got, "intact"), _tx(got, broker)
    assert set(damaged) == set(intact) and len(intact) == 42
    assert intact[KEY]["state"] == damaged[KEY]["state"] == "PREPARED"
    assert flag not in intact[KEY]["flags"] and UNCERTAIN not in intact[KEY]["flags"]
    assert flag in damaged[KEY]["flags"] and UNCERTAIN in damaged[KEY]["flags"]
    for k, t in damaged.items():
        if (t["state"], sorted(t["flags"])) != (intact[k]["state"], sorted(intact[k]["flags"])):
            assert UNCERTAIN in t["flags"], (k, t["flags"], intact[k]["flags"])
    finding = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN
               and a["transaction_key"] == KEY]
    assert len(finding) == 1 and f"damaged {table} bytes" in finding[0]["detail"], finding
    assert "GARBAGE_AFTER_END" in finding[0]["detail"] and finding[0]["physical_offset"] is None
    assert not [t for t in intact.values() if UNCERTAIN in t["flags"]]
    if broker == "st":
        rec = {r["transaction_key"]: r for r in got["recovery"] if r["broker"] == broker}
        assert "REBUILD_STATETABLE" in rec[KEY]["actions"]


@pytest.mark.spark
def test_both_modes_agree_on_damaged_tables(audits):
    def view(got):
        return {(t["broker"], t["transaction_key"]): (t["state"], sorted(t["flags"])) for t in got["transactions"]}
    assert view(audits["full"]) == view(audits["indexed"])
