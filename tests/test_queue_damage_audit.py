"""Derived files never cost or change a transaction (the CommitLog is the truth), at the audit level:

* the half consume queue's newest units zeroed (refbroker.repair_scenarios.cq_truncated: it reads like an idle
  queue): indexed mode scans after the queue's last unit (jobs/read/indexed/tails.py), finds every transaction full
  mode finds (30/30) and reports INDEX_INCOMPLETE for the queue; the intact store reports nothing of the kind;
* the half consume queue's file copied under the next file's name: UNIT_FILE_OUT_OF_ORDER at that file
  (covering its units), and every transaction keeps the intact store's state and flags, in both modes: the
  copy's units are not cross-checked (RocketMQ's recovery would keep them, its writer never wrote them; they
  would be 30 CQ_MISMATCH findings flagging 30 intact transactions);
* a hole in the middle of the half queue (a reference-broker store with 8-unit queue files: a file deleted,
  one cut to 3 units, one zeroed after 3 units, one torn mid-unit): indexed mode scans the CommitLog between the
  units around the hole (jobs/read/indexed/holes.py) and names it (INDEX_INCOMPLETE, QUEUE_UNITS_MISSING);
  every transaction has full mode's state.  Without that scan indexed mode dropped 3 (cut) and 2 (zeroed) of
  120 transactions and flagged halves that are intact in the CommitLog PREPARED_RECORD_MISSING.  A half only
  that scan finds has its COMMIT records looked up in the IndexFiles too, so every transaction also has full
  mode's flags (a second COMMIT after the hole: DUPLICATE_COMMIT), on each indexed read path."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes
from damage_audits import states as _states

from refbroker import repair_scenarios as RS
from refbroker.systopics import HALF_TOPIC
from txlog_io.mappedfile import offset_to_file_name

pytestmark = pytest.mark.spark
TRANSACTIONS = 30


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("queue-damage")
    truncated = RS.cq_truncated(base / "trunc", profile="4.6-4.9", transactions=TRANSACTIONS).store_dir
    intact = base / "intact" / "store"
    shutil.copytree(truncated, intact)
    queue = intact / "consumequeue" / HALF_TOPIC / "0"
    newest = sorted(queue.iterdir())[-1]
    shutil.copyfile(base / "trunc" / "cq_before_truncation", newest)
    dup = base / "dup" / "store"
    shutil.copytree(intact, dup)
    dq = dup / "consumequeue" / HALF_TOPIC / "0"
    last = sorted(dq.iterdir())[-1]
    copy = dq / offset_to_file_name(int(last.name) + last.stat().st_size)
    shutil.copyfile(last, copy)
    units = len(copy.read_bytes().rstrip(b"\0")) // 20 + (len(copy.read_bytes().rstrip(b"\0")) % 20 > 0)
    roots = {"intact": str(intact), "trunc": str(truncated), "dup": str(dup)}
    roots.update(_hole_stores(base / "holes"))
    return roots, copy.name, units


HOLE_CASES = ("hole_missing", "hole_cut", "hole_zeroed", "hole_torn")


def _hole_stores(base: Path) -> dict:
    """A 5.1+ store (120 transactions, crashes) with 8-unit consume-queue files, intact and with a hole in the
    middle of its half queue made four ways."""
    import refbroker

    src = Path(refbroker.generate("5.1+", "crashy", 120, 7, base / "gen", cq_file_units=8,
                                  commitlog_file_mb=1).store_dir)
    out = {}
    for name in ("hole_intact", *HOLE_CASES):
        shutil.copytree(src, base / name)
        out[name] = str(base / name)
    files = {name: sorted((base / name / "consumequeue" / HALF_TOPIC / "0").iterdir()) for name in out}
    files["hole_missing"][10].unlink()
    f = files["hole_cut"][12]
    f.write_bytes(f.read_bytes()[:60])
    for name, i, keep in (("hole_zeroed", 14, 60), ("hole_torn", 16, 50)):
        data = bytearray(files[name][i].read_bytes())
        data[keep:] = bytes(len(data) - keep)
        files[name][i].write_bytes(bytes(data))
    return out


@pytest.fixture(scope="module")
def audits(spark, stores):
    roots, _, _ = stores
    return audit_both_modes(spark, roots)


def _flags(audit, broker):
    return {t["transaction_key"]: sorted(t["flags"]) for t in audit["transactions"] if t["broker"] == broker}


def _codes(audit, broker, code):
    return [a for a in audit["anomalies"] if a["broker"] == broker and a["code"] == code]


def test_zeroed_half_queue_tail_costs_no_transaction_in_indexed_mode(audits):
    full, indexed = audits["full"], audits["indexed"]
    assert len(_states(full, "intact")) == TRANSACTIONS
    for broker in ("intact", "trunc"):
        assert _states(indexed, broker) == _states(full, broker) == _states(full, "intact"), broker
    lost = [a for a in _codes(indexed, "trunc", "INDEX_INCOMPLETE") if "QUEUE_IDLE_TAIL" in a["detail"]]
    assert len(lost) == 1 and HALF_TOPIC in lost[0]["file"], lost
    assert "5 records of this queue" in lost[0]["detail"], lost[0]["detail"]
    assert not [a for a in _codes(indexed, "intact", "INDEX_INCOMPLETE") if "QUEUE_IDLE_TAIL" in a["detail"]]


def test_duplicated_half_queue_file_is_reported_and_changes_nothing(audits, stores):
    _, copy_name, _ = stores
    for mode, audit in audits.items():
        assert _states(audit, "dup") == _states(audits["full"], "intact"), mode
        found = _codes(audit, "dup", "UNIT_FILE_OUT_OF_ORDER")
        assert [Path(a["file"]).name for a in found] == [copy_name], mode
        assert found[0]["position"] == 0, mode
        assert found[0]["length"] == stores[2] * 20, mode           # every unit of the copy
        assert not _codes(audit, "intact", "UNIT_FILE_OUT_OF_ORDER"), mode
        assert _flags(audit, "dup") == _flags(audit, "intact"), mode
        assert not _codes(audit, "dup", "CQ_MISMATCH"), mode


def test_a_hole_in_the_half_queue_costs_no_transaction_in_indexed_mode(audits):
    full, indexed = audits["full"], audits["indexed"]
    truth = _states(full, "hole_intact")
    assert len(truth) == 120 and _states(indexed, "hole_intact") == truth
    assert not [a for a in _codes(indexed, "hole_intact", "INDEX_INCOMPLETE")
                if "QUEUE_UNITS_MISSING" in a["detail"]]
    for broker in HOLE_CASES:
        assert _states(indexed, broker) == _states(full, broker) == truth, broker
        holes = [a for a in _codes(indexed, broker, "INDEX_INCOMPLETE")
                 if "QUEUE_UNITS_MISSING" in a["detail"]]
        assert len(holes) == 1 and holes[0]["file"].endswith(f"consumequeue/{HALF_TOPIC}/0"), (broker, holes)
        assert "have no unit between units" in holes[0]["detail"], holes[0]["detail"]


def test_holes_by_spark_equal_the_driver_s(spark, stores):
    """The Spark path of large queues (one window) finds the holes the driver path finds."""
    import pyarrow as pa

    from jobs.read.indexed.holes import queue_holes, queue_holes_of_frame
    from txlog_io.consumequeue import decode_consumequeue

    roots, _, _ = stores
    tables = []
    for broker in HOLE_CASES:
        queue = Path(roots[broker]) / "consumequeue" / HALF_TOPIC / "0"
        for f in sorted(queue.iterdir()):
            for batch, _ in decode_consumequeue(str(f), topic=HALF_TOPIC, queue_id=0):
                t = pa.Table.from_batches([batch]).select(["topic", "queue_id", "queue_offset",
                                                          "commitlog_offset", "size"])
                tables.append(t.add_column(0, "broker", pa.array([broker] * t.num_rows, pa.string())))
    units = pa.concat_tables(tables)
    driver = queue_holes(units)
    by_spark = queue_holes_of_frame(spark.createDataFrame(units.to_pandas()))
    key = lambda h: (h["broker"], h["q_before"])  # noqa: E731
    assert len(driver) == len(HOLE_CASES)
    assert sorted(driver, key=key) == sorted(({k: (int(v) if isinstance(v, int) else v)
                                              for k, v in h.items()} for h in by_spark), key=key)


def _one_job_flags(spark, roots, broker):
    """``broker``'s transaction flags through indexed mode's one-job read (jobs/read/indexed/read.py), and the
    number of Spark jobs that read ran."""
    import json

    from jobs.read.indexed.read import read_indexed_local
    from jobs.read.spec import ReadSpec
    from jobs.read.stores import infos
    from jobs.reconstruct.local import reduce_local
    from jobs.sources.options import parse_options

    sc = spark.sparkContext
    group = f"one-job-{broker}"
    sc.setJobGroup(group, group)
    try:
        read = read_indexed_local(spark, ReadSpec(stores=(roots[broker],), brokers=(broker,)), 10 ** 9)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert read is not None
    info = infos(parse_options("rocketmq_commitlog", {"paths": json.dumps([roots[broker]]), "brokers": broker}))
    out = reduce_local(read, info, None, None)
    flags = {t["transaction_key"]: sorted(t["flags"]) for t in out["transactions"].to_pylist()}
    return flags, len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_hole_in_the_half_queue_keeps_full_mode_s_flags(spark, audits, stores, monkeypatch):
    """A half found only by a hole's CommitLog scan has its COMMITs looked up in the IndexFiles too (its
    second COMMIT lies after the hole: DUPLICATE_COMMIT, as full mode flags it), on every indexed read path:
    the driver's positions, the DataFrame plan's Spark lookups, the one-job read (a second job only for the
    store with the hole)."""
    from jobs.read.frames import load_store_frames
    from jobs.read.indexed import plan as indexed_plan
    from jobs.reconstruct.spark import reconstruct

    roots, _, _ = stores
    full, indexed = audits["full"], audits["indexed"]
    assert any("DUPLICATE_COMMIT" in f for f in _flags(full, "hole_cut").values())
    for broker in HOLE_CASES:
        assert _flags(indexed, broker) == _flags(full, broker), broker
    cut = {"hole_cut": roots["hole_cut"]}
    monkeypatch.setattr(indexed_plan, "DRIVER_FETCH_UNITS", 0)      # positions and lookups planned by Spark
    frames = load_store_frames(spark, list(cut.values()), mode="indexed", brokers=list(cut))
    by_spark = {"transactions": reconstruct(frames, None, local=True).arrow["transactions"].to_pylist()}
    assert _flags(by_spark, "hole_cut") == _flags(full, "hole_cut")
    monkeypatch.undo()
    from jobs.read import full as full_read

    monkeypatch.setattr(full_read, "LOCAL_READ_DRIVER_BYTES", 0)     # the rounds as Spark jobs, to count them
    cut_flags, cut_jobs = _one_job_flags(spark, roots, "hole_cut")
    intact_flags, intact_jobs = _one_job_flags(spark, roots, "hole_intact")
    assert cut_flags == _flags(full, "hole_cut") and intact_flags == _flags(full, "hole_intact")
    assert (intact_jobs, cut_jobs) == (1, 2)
