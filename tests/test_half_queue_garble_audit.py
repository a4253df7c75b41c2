"""A garbled or zeroed half consume queue never costs a transaction in indexed mode (the CommitLog decides
existence, the queue only points into it), on copies of the real-broker 5.3.3 fixture and of a reference-broker store:

* ``garbled_head``: random bytes over the half queue's first 50 units from byte 9 on (unit 0's CommitLog
  offset intact, its size and every later unit random: most are BAD_CQ_ENTRY, the others decode to offsets
  far past the CommitLog) -- the campaign's ``random_block`` mutants of the half queue;
* ``flipped``: one bit flipped in the most significant byte of unit 9's CommitLog offset (a unit that
  decodes, points past the CommitLog, and leaves no queue offset missing);
* ``zeroed_head``: the first 10 units zeroed;
* ``rb_garbled_head``: a reference-broker 5.1+ store (30 transactions, crashes) with random bytes over its half
  queue's bytes 9-3274, the damage of the audit campaign's mutant m00175 (seed 1) with other random bytes;
* ``rb_zeroed_page``: that store's half queue file's first 4 KiB zeroed (every unit it has: mutants m00475,
  m00808): a queue whose files hold no unit.

Each must give every transaction full mode's state, and name the queue's file and byte position in an
INDEX_INCOMPLETE finding.  Without ``jobs.read.indexed.holes.anchors`` indexed mode dropped transactions whose
halves are intact in the CommitLog (the garbled units' neighbours anchored no scan)."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from damage_audits import audit_both_modes
from damage_audits import states as _states

from refbroker.systopics import HALF_TOPIC

pytestmark = pytest.mark.spark
FIXTURE = Path(__file__).parent / "data" / "fixtures" / "rocketmq-5.3.3" / "store"
QUEUE = Path("consumequeue") / HALF_TOPIC / "0" / "00000000000000000000"


def _damage(data: bytearray, case: str) -> None:
    if case == "garbled_head":
        data[9:1009] = random.Random(175).randbytes(1000)
    elif case == "rb_garbled_head":
        data[9:3274] = random.Random(175).randbytes(3265)
    elif case == "rb_zeroed_page":
        data[:4096] = bytes(4096)
    elif case == "flipped":
        data[9 * 20] ^= 0x10
    else:
        data[:200] = bytes(200)


CASES = ("garbled_head", "flipped", "zeroed_head")
RB_CASES = ("rb_garbled_head", "rb_zeroed_page")


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    from refbroker.generate import generate

    base = tmp_path_factory.mktemp("half-garble")
    rb = generate("5.1+", "crashy", 30, 7, base / "gen", commitlog_file_size=128 * 1024, cq_file_units=300).store_dir
    roots = {"intact": str(FIXTURE), "rb_intact": str(rb)}
    for case in CASES + RB_CASES:
        shutil.copytree(rb if case in RB_CASES else FIXTURE, base / case)
        f = base / case / QUEUE
        data = bytearray(f.read_bytes())
        _damage(data, case)
        f.unlink()
        f.write_bytes(bytes(data))
        roots[case] = str(base / case)
    return {"roots": roots, **audit_both_modes(spark, roots)}


def _holes(audit, broker):
    return [a for a in audit["anomalies"] if a["broker"] == broker and a["code"] == "INDEX_INCOMPLETE"
            and "QUEUE_UNITS_MISSING" in a["detail"]]


def test_a_garbled_half_queue_costs_no_transaction_in_indexed_mode(audits):
    full, indexed = audits["full"], audits["indexed"]
    truth = _states(full, "intact")
    assert len(truth) == 52 and _states(indexed, "intact") == truth
    assert not _holes(indexed, "intact")
    rb_truth = _states(full, "rb_intact")
    assert len(rb_truth) == 30 and _states(indexed, "rb_intact") == rb_truth
    assert not _holes(indexed, "rb_intact")
    for case in CASES + RB_CASES:
        truth = rb_truth if case in RB_CASES else _states(full, "intact")
        got = _states(indexed, case)
        assert _states(full, case) == truth, case
        assert got == truth, (case, len(got), {k: (got.get(k), v) for k, v in truth.items() if got.get(k) != v})
    for case, where in (("garbled_head", "byte 0"), ("flipped", "byte 180"), ("rb_garbled_head", "byte 0")):
        named = [a for a in _holes(indexed, case) if f"{QUEUE} {where}" in a["detail"].replace("\\", "/")]
        assert named, (case, _holes(indexed, case))
    whole = [a for a in _holes(indexed, "rb_zeroed_page") if "hold no unit" in a["detail"]]
    assert len(whole) == 1 and f"{QUEUE} byte 0" in whole[0]["detail"].replace("\\", "/"), whole


def test_garbled_units_by_spark_equal_the_driver_s(spark, audits):
    """The Spark path of large queues (``anchored_frame``, ``queue_holes_of_frame``) finds the sound units and
    holes the driver path finds, on the damaged half queues above."""
    import pyarrow as pa

    from jobs.read.indexed.holes import anchored_frame, queue_holes, queue_holes_of_frame
    from jobs.read.indexed.plan import anchored_units, extremes_of_frame, extremes_of_units
    from jobs.read.stores import store_info
    from txlog_io.consumequeue import decode_consumequeue

    roots = audits["roots"]
    stores = [store_info(b, roots[b], None) for b in CASES + RB_CASES]
    tables = []
    for s in stores:
        path = str(Path(s.root) / QUEUE)
        for batch, _ in decode_consumequeue(path, topic=HALF_TOPIC, queue_id=0):
            if batch is not None and batch.num_rows:
                t = pa.Table.from_batches([batch])
                tables.append(t.add_column(0, "broker", pa.array([s.broker] * t.num_rows, pa.string())))
    units = pa.concat_tables(tables)
    frame = spark.createDataFrame(units.to_pandas())
    key = lambda h: (h["broker"], h["first"])  # noqa: E731
    driver = sorted(queue_holes(units, stores), key=key)
    assert {h["broker"] for h in driver} == {"garbled_head", "flipped", "rb_garbled_head"}
    assert driver == sorted(({k: (int(v) if isinstance(v, int) else v) for k, v in h.items()}
                             for h in queue_holes_of_frame(frame, stores)), key=key)
    by = lambda q: (q["broker"], q["topic"], q["queue_id"])  # noqa: E731
    assert sorted(extremes_of_units(anchored_units(units, stores)), key=by) == sorted(
        ({k: (int(v) if isinstance(v, int) else v) for k, v in q.items()}
         for q in extremes_of_frame(anchored_frame(frame, stores).where("anchor"))), key=by)
