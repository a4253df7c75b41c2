"""3.x redolog / statetable damage the table decoders cannot see, or that takes a transaction's only index.

Copies of the 3.1.4 fixture (redolog: 77 units, 4000-byte file; statetable: 42 units, 2400-byte file):

* ``hole``: redolog units 60..63 zeroed (a COMMIT record at CommitLog 209218 and the ROLLBACK records at
  210874 / 211594, whose only index is the redolog);
* ``tail``: the redolog cut at unit 60 (a unit boundary: the file is just shorter, no decoder finding);
* ``zeroed``: every redolog byte zeroed (an empty-looking redolog, no decoder finding);
* ``stcut``: the statetable cut inside its second unit.

Indexed mode must not lose a transaction whose records are intact in the CommitLog (it scans the CommitLog
ranges the redolog no longer covers: jobs/read/indexed/tables.py), and in both modes every transaction whose
state or flags differ from the intact store's carries STATE_UNCERTAIN_DAMAGED_RANGE (jobs/reconstruct/rules.py:
the table flags of a transaction the damaged table has no unit for; a redolog without units for records
before the statetable's newest unit lost them).  Full and indexed mode agree; the intact copy has no such flag.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes

V314 = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-3.1.4" / "store"
REDOLOG = Path("transaction") / "redolog" / "TRANSACTION_REDOLOG_TOPIC_XXXX" / "0" / ("0" * 20)
STATETABLE = Path("transaction") / "statetable" / ("0" * 20)
UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGED = ("hole", "tail", "zeroed", "stcut")


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()                       # a copy of the fixture: replaced, never written through
    path.write_bytes(data)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("tableranges")
    roots = {}
    for name in ("intact",) + DAMAGED:
        shutil.copytree(V314, base / name)
        roots[name] = str(base / name)
    redo = (V314 / REDOLOG).read_bytes()
    _rewrite(base / "hole" / REDOLOG, redo[:60 * 20] + bytes(4 * 20) + redo[64 * 20:])
    _rewrite(base / "tail" / REDOLOG, redo[:60 * 20])
    _rewrite(base / "zeroed" / REDOLOG, bytes(len(redo)))
    _rewrite(base / "stcut" / STATETABLE, (V314 / STATETABLE).read_bytes()[:32])
    return roots


@pytest.fixture(scope="module")
def audits(spark, roots):
    return audit_both_modes(spark, roots, ("transactions", "anomalies"))


def _tx(got, broker):
    return {t["transaction_key"]: t for t in got["transactions"] if t["broker"] == broker}


@pytest.mark.spark
@pytest.mark.parametrize("broker", DAMAGED)
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_table_damage_drops_nothing_and_every_change_is_flagged(audits, mode, broker):
    got = audits[mode]
    intact, damaged = _tx(got, "intact"), _tx(got, broker)
    assert len(intact) == 42 and set(damaged) == set(intact)
    changed = {k for k, t in damaged.items()
               if (t["state"], sorted(t["flags"])) != (intact[k]["state"], sorted(intact[k]["flags"]))}
    assert changed, "the damage changes what the tables say"
    silent = {k: (intact[k]["state"], intact[k]["flags"], damaged[k]["state"], damaged[k]["flags"])
              for k in changed if UNCERTAIN not in damaged[k]["flags"]}
    assert not silent
    assert not [t for t in intact.values() if UNCERTAIN in t["flags"]]
    table = "statetable" if broker == "stcut" else "redolog"
    notes = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN]
    assert notes and all(f"damaged {table} bytes" in a["detail"] for a in notes
                         if a["physical_offset"] is None)


@pytest.mark.spark
def test_a_redolog_cut_at_a_unit_boundary_is_named(audits):
    for mode in ("full", "indexed"):
        notes = [a["detail"] for a in audits[mode]["anomalies"] if a["broker"] in ("tail", "zeroed")
                 and a["code"] == UNCERTAIN]
        assert notes and all("REDOLOG_UNITS_MISSING" in d for d in notes), (mode, notes[:2])


@pytest.mark.spark
def test_both_modes_agree_on_table_damage(audits):
    def view(got):
        return {(t["broker"], t["transaction_key"]): (t["state"], sorted(t["flags"])) for t in got["transactions"]}
    assert view(audits["full"]) == view(audits["indexed"])


@pytest.mark.spark
def test_lost_redolog_units_are_one_fact_per_broker(spark, roots, audits, monkeypatch):
    """The distributed reduce over 8 partitions of transactions flags the same transactions, with the same
    REDOLOG_UNITS_MISSING text, as the driver's reduce of the whole broker: whether the redolog lost units is
    decided over all of a broker's evidence, not per partition."""
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct import distributed
    from jobs.reconstruct.spark import reconstruct

    monkeypatch.setattr(distributed, "reduce_tasks", lambda n_rows, cores: 8)
    brokers = ["tail", "zeroed"]
    frames = load_store_frames(spark, [roots[b] for b in brokers], mode="full", brokers=brokers)
    result = reconstruct(frames, None, path="distributed", materialize=True)
    assert result.reduce_tasks == 8
    for table in ("transactions", "anomalies"):
        got = sorted(map(repr, getattr(result, table).toArrow().to_pylist()))
        want = sorted(repr(r) for r in audits["full"][table] if r["broker"] in brokers)
        assert len(got) == len(want) and got == want, table
