"""3.x redolog / statetable damage the table decoders cannot see, or that takes a transaction's only index.

Copies of the 3.1.4 fixture (redolog: 77 units, 4000-byte file; statetable: 42 units, 2400-byte file):

* ``hole``: redolog units 60..63 zeroed (a COMMIT record at CommitLog 209218 and the ROLLBACK records at
  210874 / 211594, whose only index is the redolog);
* ``tail``: the redolog cut at unit 60 (a unit boundary: the file is just shorter, no decoder finding);
* ``zeroed``: every redolog byte zeroed (an empty-looking redolog, no decoder finding);
* ``stcut``: the statetable cut inside its second unit;
* ``garbled``: a block of random bytes over the redolog from inside unit 20 to near the file's end (units
  that still decode, with absurd but positive offsets and sizes, beside ones the decoder rejects);
* ``stflip``: statetable unit 4 (a PREPARED transaction: no COMMIT / ROLLBACK record, no END redolog unit)
  with its state bit-flipped from PREPARED (4) to ROLLBACK (12).

Indexed mode must not lose a transaction whose records are intact in the CommitLog (it scans the CommitLog
ranges the redolog no longer covers: jobs/read/indexed/tables.py), and in both modes every transaction whose
state or flags differ from the intact store's carries STATE_UNCERTAIN_DAMAGED_RANGE (jobs/reconstruct/rules.py:
the table flags of a transaction the damaged table has no unit for; a redolog without units for records
before the statetable's newest unit lost them).  Full and indexed mode agree; the intact copy has no such flag.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes

V314 = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-3.1.4" / "store"
REDOLOG = Path("transaction") / "redolog" / "TRANSACTION_REDOLOG_TOPIC_XXXX" / "0" / ("0" * 20)
STATETABLE = Path("transaction") / "statetable" / ("0" * 20)
UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGED = ("hole", "tail", "zeroed", "stcut")
#: damage the tables' decoders cannot see at all (tested on its own below)
UNSEEN = ("garbled", "stflip")
#: flags that name damage on a transaction (jobs/bench/fuzz_audit.py DAMAGE_FLAGS)
DAMAGE_FLAGS = {UNCERTAIN, "CORRUPT_RECORD", "PREPARED_RECORD_MISSING"}
GARBLED = (20 * 20 + 13, 3800)          # redolog bytes replaced by random ones
FLIPPED = 4                             # the statetable unit whose state reads ROLLBACK


def _rewrite(path: Path, data: bytes) -> None:
    path.unlink()                       # a copy of the fixture: replaced, never written through
    path.write_bytes(data)


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("tableranges")
    roots = {}
    for name in ("intact",) + DAMAGED + UNSEEN:
        shutil.copytree(V314, base / name)
        roots[name] = str(base / name)
    redo = (V314 / REDOLOG).read_bytes()
    _rewrite(base / "hole" / REDOLOG, redo[:60 * 20] + bytes(4 * 20) + redo[64 * 20:])
    _rewrite(base / "tail" / REDOLOG, redo[:60 * 20])
    _rewrite(base / "zeroed" / REDOLOG, bytes(len(redo)))
    _rewrite(base / "stcut" / STATETABLE, (V314 / STATETABLE).read_bytes()[:32])
    a, b = GARBLED
    _rewrite(base / "garbled" / REDOLOG, redo[:a] + random.Random(45).randbytes(b - a) + redo[b:])
    table = bytearray((V314 / STATETABLE).read_bytes())
    assert table[FLIPPED * 24 + 23] == 4
    table[FLIPPED * 24 + 23] ^= 8               # state PREPARED (4) -> ROLLBACK (12)
    _rewrite(base / "stflip" / STATETABLE, bytes(table))
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
    decided over all of a broker's evidence, not per partition.  The same for the garbled redolog and the
    statetable state no END backs (CORRUPT_RECORD and its finding)."""
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct import distributed
    from jobs.reconstruct.spark import reconstruct

    monkeypatch.setattr(distributed, "reduce_tasks", lambda n_rows, cores: 8)
    brokers = ["tail", "zeroed", "garbled", "stflip"]
    frames = load_store_frames(spark, [roots[b] for b in brokers], mode="full", brokers=brokers)
    result = reconstruct(frames, None, path="distributed", materialize=True)
    assert result.reduce_tasks == 8
    for table in ("transactions", "anomalies"):
        got = sorted(map(repr, getattr(result, table).toArrow().to_pylist()))
        want = sorted(repr(r) for r in audits["full"][table] if r["broker"] in brokers)
        assert len(got) == len(want) and got == want, table


def _changed_without_damage_flag(got, broker, intact_broker="intact"):
    intact, damaged = _tx(got, intact_broker), _tx(got, broker)
    return {k: (t["state"], t["flags"], damaged[k]["state"], damaged[k]["flags"]) for k, t in intact.items()
            if k in damaged and t["state"] != damaged[k]["state"] and not DAMAGE_FLAGS & set(damaged[k]["flags"])}


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_garbled_redolog_drops_nothing(audits, mode):
    """Random bytes over the redolog: units that still decode with absurd offsets must neither close the
    range indexed mode scans for the transactions the redolog no longer covers nor move the dispatch point;
    every transaction of the intact store is there, and a state that changes says why."""
    got = audits[mode]
    assert len(_tx(got, "intact")) == 42
    assert set(_tx(got, "intact")) <= set(_tx(got, "garbled"))
    assert not _changed_without_damage_flag(got, "garbled")
    if mode == "indexed":
        found = [a["detail"] for a in got["anomalies"] if a["broker"] == "garbled"
                 and a["code"] == "INDEX_INCOMPLETE" and "REDOLOG_UNITS_MISSING" in (a["detail"] or "")]
        assert found and any("garbled" in d for d in found), found


@pytest.mark.spark
@pytest.mark.parametrize("broker", UNSEEN)
def test_both_modes_agree_on_unseen_table_damage(audits, broker):
    assert _tx(audits["full"], broker) == _tx(audits["indexed"], broker)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_statetable_state_no_end_backs_is_damage(audits, mode):
    """Statetable unit 4's state flipped to ROLLBACK: 3.1.4 writes a unit's COMMIT / ROLLBACK only when it
    dispatches that END record (TransactionStateService.updateTransactionState), then the END's redolog unit;
    with neither in the store the unit is damaged -- the transaction keeps the CommitLog's state, flagged
    CORRUPT_RECORD, and a finding names the unit's statetable bytes."""
    got = audits[mode]
    intact, flipped = _tx(got, "intact"), _tx(got, "stflip")
    key = next(k for k, t in intact.items() if t["statetable_index"] == FLIPPED)
    assert intact[key]["state"] == "PREPARED" and "CORRUPT_RECORD" not in intact[key]["flags"]
    assert flipped[key]["statetable_state"] == "ROLLBACK"
    assert flipped[key]["state"] == "PREPARED" and "CORRUPT_RECORD" in flipped[key]["flags"]
    assert set(flipped) == set(intact) and not _changed_without_damage_flag(got, "stflip")
    notes = [a["detail"] for a in got["anomalies"] if a["code"] == "CORRUPT_RECORD" and a["source"] == "reconstruct"]
    assert len(notes) == 1 and f"statetable unit {FLIPPED} (statetable bytes 96..120) says ROLLBACK" in notes[0]
    assert not [t for t in intact.values() if "CORRUPT_RECORD" in t["flags"]]


@pytest.fixture(scope="module")
def rb3x_audits(spark, tmp_path_factory):
    """A reference-broker 3.x store as the audit-level campaign makes it (``crashy``, 128 KiB CommitLog files,
    a 4000-byte redolog) and a copy with random bytes over its redolog from inside unit 7 to byte 3802 --
    past its last unit, so the garbage that still decodes lies after every sound unit."""
    from refbroker.generate import generate

    base = tmp_path_factory.mktemp("rb3xgarbled")
    store = generate("3.x", "crashy", 30, 7, base / "gen", commitlog_file_size=128 * 1024, cq_file_units=300,
                     statetable_file_size=2400, redolog_file_size=4000).store_dir
    roots = {"rb3x": str(base / "rb3x"), "rb3x_garbled": str(base / "rb3x_garbled")}
    for root in roots.values():
        shutil.copytree(store, root)
    path = base / "rb3x_garbled" / REDOLOG
    redo = path.read_bytes()
    assert len(redo) == 4000 and len(redo.rstrip(b"\0")) < 1100       # 52 units written
    _rewrite(path, redo[:153] + random.Random(45).randbytes(3802 - 153) + redo[3802:])
    return audit_both_modes(spark, roots)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_garbled_redolog_tail_hides_no_transaction(rb3x_audits, mode):
    """Garbage past a redolog's last sound unit that decodes as units with absurd offsets once set the end of
    the redolog's coverage and the dispatch point: indexed mode scanned neither the redolog's tail nor the
    undispatched range, and a ROLLED_BACK transaction whose only index is the redolog vanished."""
    got = rb3x_audits[mode]
    intact, garbled = _tx(got, "rb3x"), _tx(got, "rb3x_garbled")
    assert len(intact) == 30 and set(intact) <= set(garbled)
    assert not _changed_without_damage_flag(got, "rb3x_garbled", "rb3x")
    assert _tx(rb3x_audits["full"], "rb3x_garbled") == _tx(rb3x_audits["indexed"], "rb3x_garbled")
    if mode == "indexed":
        assert [a for a in got["anomalies"] if a["broker"] == "rb3x_garbled" and a["code"] == "INDEX_INCOMPLETE"
                and "REDOLOG_UNITS_MISSING" in (a["detail"] or "") and "garbled" in a["detail"]]
