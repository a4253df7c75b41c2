"""Indexed mode's queue gaps, derived on the driver (jobs.read.indexed.plan): Spark-free, on hand-made inputs."""
from __future__ import annotations

import pyarrow as pa
import pytest
from test_indexed_indexfile import base_store, monkeypatch_module  # noqa: F401

from jobs.read.frames import StoreInfo
from jobs.read.indexed.plan import (
    GAP_HEAD,
    GAP_OP_QUEUE,
    GAP_TAIL,
    GAP_TAIL_UNITS,
    extremes_of_units,
    queue_gaps,
)
from jobs.read.indexed.tails import GAP_QUEUE_IDLE_TAIL
from jobs.reconstruct.params import HALF_TOPIC, OP_TOPIC

CLOG = 1 << 20


def _store(broker="b", half=True) -> StoreInfo:
    return StoreInfo(broker=broker, root="/s", commitlog_files=(("/s/commitlog/0", 0, CLOG),),
                     consume_queues=2, tx_half_topic=half, statetable_files=0, redolog_files=0,
                     abort_present=False, consumequeue_rocksdb=False, discovery_anomalies=0)


def _units(rows):
    return pa.table({"broker": [r[0] for r in rows], "topic": [r[1] for r in rows],
                     "queue_id": pa.array([r[2] for r in rows], pa.int32()),
                     "queue_offset": pa.array([r[3] for r in rows], pa.int64()),
                     "commitlog_offset": pa.array([r[4] for r in rows], pa.int64()),
                     "size": pa.array([r[5] for r in rows], pa.int32())})


def test_extremes_take_the_first_and_last_unit_by_queue_offset():
    ext = extremes_of_units(_units([("b", HALF_TOPIC, 0, 7, 700, 10), ("b", HALF_TOPIC, 0, 5, 500, 10),
                                    ("b", HALF_TOPIC, 0, 6, 600, 30), ("b", OP_TOPIC, 0, 0, 900, 20)]))
    by = {(e["topic"], e["queue_id"]): e for e in ext}
    assert by[(HALF_TOPIC, 0)] == {"broker": "b", "topic": HALF_TOPIC, "queue_id": 0, "q_first": 5,
                                   "q_last": 7, "p_first": 500, "p_after_last": 710}
    assert by[(OP_TOPIC, 0)]["p_after_last"] == 920


def test_healthy_queues_leave_only_the_undispatched_tail():
    ext = extremes_of_units(_units([("b", HALF_TOPIC, 0, 0, 0, 100), ("b", OP_TOPIC, 0, 0, 100, 50)]))
    # other topics carried the dispatch point on: each transaction queue's idle tail is scanned (an ordinary
    # gap: a finding only if records of that queue turn up there, jobs/read/indexed/tails.py), nothing else
    gaps = queue_gaps([_store()], ext, {"b": CLOG}, {})
    assert {g[:5] for g in gaps} == {("b", 100, CLOG, GAP_QUEUE_IDLE_TAIL, f"{HALF_TOPIC}/0"),
                                     ("b", 150, CLOG, GAP_QUEUE_IDLE_TAIL, f"{OP_TOPIC}/0")}
    gaps = queue_gaps([_store()], ext, {"b": 150}, {("b", HALF_TOPIC, 0): 1})
    assert {g[:5] for g in gaps} == {("b", 150, CLOG, GAP_TAIL, None),
                                     ("b", 100, 150, GAP_QUEUE_IDLE_TAIL, f"{HALF_TOPIC}/0")}


def test_each_damage_names_its_queue_and_range():
    ext = extremes_of_units(_units([("b", HALF_TOPIC, 0, 40, 4000, 100)]))       # rebuilt: starts at unit 40
    gaps = {g[3]: g for g in queue_gaps([_store()], ext, {"b": CLOG}, {("b", HALF_TOPIC, 0): 60})}
    assert gaps[GAP_HEAD][1:3] == (0, 4000) and gaps[GAP_HEAD][4] == f"{HALF_TOPIC}/0"
    assert gaps[GAP_TAIL_UNITS][1:3] == (4100, CLOG)
    assert "consumed up to queue offset 60" in gaps[GAP_TAIL_UNITS][5]
    assert gaps[GAP_OP_QUEUE][1:3] == (0, CLOG)                                   # no op queue at all
    assert GAP_TAIL not in gaps


def test_lookup_many_finds_what_lookup_finds(tmp_path):
    """The whole-file, all-chains-at-once walk (small files, many keys) against the positional one."""
    import refbroker
    from txlog_io.commitlog import decode_range
    from txlog_io.indexfile import IndexFileReader, index_key_hash, index_keys, list_index_files

    refbroker.generate("5.1+", "clean", 40, 7, tmp_path, background_messages=300, commitlog_file_mb=1)
    keys = ["TopicOrders#no-such-key"]
    for f in sorted((tmp_path / "store" / "commitlog").iterdir()):
        for batch, _ in decode_range(f):
            for r in batch.select(["topic", "uniq_key", "keys", "transaction_type"]).to_pylist():
                keys += index_keys(r["topic"], r["uniq_key"], r["keys"], r["transaction_type"])
    for path in list_index_files(tmp_path / "store"):
        with IndexFileReader(path) as r:
            for floor in (0, r.header.begin_phy_offset + 1, r.header.end_phy_offset):
                many = r.lookup_many([index_key_hash(k) for k in keys], [floor] * len(keys))
                assert many == [r.lookup(k, min_offset=floor) for k in keys]
                assert any(many)
                # few keys: chains walked by positional reads, same answer
                few = keys[-3:]
                assert r.lookup_many([index_key_hash(k) for k in few], [floor] * 3) == \
                    [r.lookup(k, min_offset=floor) for k in few]


@pytest.mark.spark
def test_spark_extremes_equal_the_driver_ones(spark):
    """The path for large transaction queues (one Spark aggregation) gives the driver path's rows."""
    from jobs.read.indexed.plan import extremes_of_frame

    units = _units([("b", HALF_TOPIC, 0, 7, 700, 10), ("b", HALF_TOPIC, 0, 5, 500, 10),
                    ("b", HALF_TOPIC, 1, 2, 650, 30), ("c", OP_TOPIC, 0, 0, 900, 20)])
    key = lambda e: (e["broker"], e["topic"], e["queue_id"])      # noqa: E731
    assert sorted(extremes_of_frame(spark.createDataFrame(units)), key=key) == \
        sorted(extremes_of_units(units), key=key)


def test_lookup_tasks_find_what_every_index_file_holds(base_store):  # noqa: F811
    """The one job's lookup tasks (jobs.read.indexed.lookup: consecutive index files per task, the records found
    fetched in the task), cut for 1, 2 and 8 cores, fetch exactly the non-NOT records a key-by-key lookup in
    every index file ending after the key's oldest half copy names: lookups that cross index files and tasks."""
    import json

    from test_indexed_indexfile import _records

    from jobs.read.frames import keyed_only
    from jobs.read.indexed.lookup import fetch_units, lookup_fetch, lookup_items
    from jobs.read.indexed.plan import driver_table
    from jobs.read.stores import infos
    from jobs.reconstruct.params import TX_SYSTEM_TOPICS
    from jobs.sources.formats import COMMITLOG_FORMAT, CONSUMEQUEUE_FORMAT
    from jobs.sources.options import parse_options
    from txlog_io.indexfile import IndexFileReader, build_key

    base = {"paths": json.dumps([str(base_store)]), "brokers": "b"}
    info = infos(parse_options(COMMITLOG_FORMAT, base))
    units = driver_table(CONSUMEQUEUE_FORMAT, parse_options(CONSUMEQUEUE_FORMAT, dict(
        base, topics=",".join(TX_SYSTEM_TOPICS))))
    got = fetch_units(info, units, keyed_only)
    assert not got.lost and len(got.keys["b"]) >= 100
    assert sum(b.num_rows for b in got.records) == len(set(units.column("commitlog_offset").to_pylist()))
    files = [f for f in info[0].index_files if f[4] is None]
    assert len(files) > 4
    wanted = set()
    for (topic, uniq), after in got.keys["b"].items():
        for path, _, end, _, _, slots, entries, _ in files:
            if end >= after:
                with IndexFileReader(path, slots, entries) as r:
                    wanted.update(r.lookup(build_key(topic, uniq), min_offset=after + 1))
    kind = {r["physical_offset"]: r["transaction_type"] for r in _records(base_store)}
    wanted = {o for o in wanted if kind[o] != "NOT"}
    assert any(kind[o] == "COMMIT" for o in wanted)
    for cores in (1, 2, 8):
        items = lookup_items(info, got.keys, cores)
        assert 1 < len(items) <= min(len(files), 3 * cores)       # cut by the files and keys searched
        assert sorted(f for i in items for f in i.files) == sorted((f[0], f[2], f[5], f[6]) for f in files)
        out = {"commitlog": [], "hit_anomalies": [], "lost": []}
        for item in items:
            lookup_fetch(item, out)
        found = [o for b in out["commitlog"] for o in b.column("physical_offset").to_pylist()]
        assert set(found) == wanted and not out["lost"] and not out["hit_anomalies"]


def test_a_hole_in_a_queue_is_scanned_and_named():
    from jobs.read.indexed.gaps import ORDINARY_GAPS, gap_anomalies
    from jobs.read.indexed.holes import GAP_QUEUE_HOLE, hole_gaps, queue_holes

    units = _units([("b", HALF_TOPIC, 0, q, 100 * q, 50) for q in (0, 1, 2, 6, 7)]
                   + [("b", OP_TOPIC, 0, q, 1000 + 10 * q, 10) for q in (0, 2)]
                   + [("b", "RealTopic", 0, q, 10 * q, 10) for q in (0, 5)])      # not a transaction queue
    holes = queue_holes(units)
    assert sorted((h["topic"], h["q_before"], h["q_after"]) for h in holes) == [(HALF_TOPIC, 2, 6),
                                                                               (OP_TOPIC, 0, 2)]
    rows = hole_gaps([_store()], holes)
    by = {r[4]: r for r in rows}
    # from the record of the unit before the hole (its start: its size field may be garbage) to the record
    # of the unit after it
    assert by[f"{HALF_TOPIC}/0"][:4] == ("b", 200, 600, GAP_QUEUE_HOLE)
    assert "queue offsets 3..5 have no unit between units 2 and 6" in by[f"{HALF_TOPIC}/0"][5]
    assert by[f"{OP_TOPIC}/0"][:4] == ("b", 1000, 1020, GAP_QUEUE_HOLE)
    assert "queue offset 1 has no unit" in by[f"{OP_TOPIC}/0"][5]
    assert GAP_QUEUE_HOLE not in ORDINARY_GAPS and len(gap_anomalies(rows)) == 2
    # contiguous queues: no row; units out of CommitLog order vouch for nothing: scanned from the CommitLog's
    # start (no sound unit before them) to its end (none after)
    assert queue_holes(_units([("b", HALF_TOPIC, 0, q, 100 * q, 50) for q in range(5)])) == []
    assert [r[:4] for r in hole_gaps([_store()], queue_holes(_units([("b", HALF_TOPIC, 0, 0, 900, 50),
                                                                    ("b", HALF_TOPIC, 0, 3, 100, 50)])))] == [
        ("b", 0, CLOG, GAP_QUEUE_HOLE)]


def test_garbled_units_vouch_for_nothing():
    """A unit pointing past the CommitLog, or contradicting its neighbour's CommitLog order, is no anchor:
    the queue offsets around it read as missing (at the head of the queue too), and retained units whose
    records were deleted, or a unit repeated with its record, change nothing."""
    from jobs.read.indexed.holes import GAP_QUEUE_HOLE, hole_gaps, queue_holes
    from jobs.read.indexed.plan import anchored_units, extremes_of_units

    def units(ps):
        rows = _units([("b", HALF_TOPIC, 0, q, p, 50) for q, p in ps])
        files = pa.array([f"/s/consumequeue/{HALF_TOPIC}/0/00000000000000000000"] * rows.num_rows)
        return rows.append_column("file", files).append_column(
            "file_position", pa.array([20 * q for q, _ in ps], pa.int64()))

    store = _store()
    head = units([(0, 1 << 62), (1, CLOG + 5)] + [(q, 100 * q) for q in range(2, 6)])
    assert [r[1:4] for r in hole_gaps([store], queue_holes(head, [store]))] == [(0, 200, GAP_QUEUE_HOLE)]
    detail = hole_gaps([store], queue_holes(head, [store]))[0][5]
    assert "queue offsets 0..1 have no unit before unit 2" in detail and "00000000000000000000 byte 0" in detail
    assert extremes_of_units(anchored_units(head, [store]))[0]["q_first"] == 2
    middle = units([(q, 900 if q == 3 else 100 * q) for q in range(8)])
    got = hole_gaps([store], queue_holes(middle, [store]))
    assert [r[1:3] for r in got] == [(200, 500)] and "byte 60" in got[0][5]
    tail = units([(q, 100 * q) for q in range(4)] + [(4, -1 & 0x7FFFFFFFFFFF)])
    assert [r[1:3] for r in hole_gaps([store], queue_holes(tail, [store]))] == [(300, CLOG)]
    sound = [(q, 100 * q) for q in range(6)]
    assert queue_holes(units(sound + sound[2:4]), [store]) == []
    assert queue_holes(units([(q, 100 * q) for q in range(5)]), [_store_from(200)]) == []


def _store_from(start: int) -> StoreInfo:
    return StoreInfo(broker="b", root="/s", commitlog_files=(("/s/commitlog/x", start, CLOG),),
                     consume_queues=2, tx_half_topic=True, statetable_files=0, redolog_files=0,
                     abort_present=False, consumequeue_rocksdb=False, discovery_anomalies=0)


def test_scanned_keys_are_the_halves_no_unit_gave():
    """lookup.scanned_keys: the half / discard copies of a gap scan's rows of the keyed brokers, keyed
    REAL_TOPIC#UNIQ_KEY, when the units did not give the key or gave a newer oldest copy."""
    from jobs.read.indexed.lookup import scanned_keys
    from txlog_io.commitlog_layout import DISCARD_TOPIC

    rows = [("b", HALF_TOPIC, "T", "u1", 100), ("b", HALF_TOPIC, "T", "u1", 50),     # new: oldest copy 50
            ("b", DISCARD_TOPIC, "T", "u2", 300),                                     # new (a discard copy)
            ("b", HALF_TOPIC, "T", "u3", 400),                                        # known, older unit copy
            ("b", HALF_TOPIC, "T", "u4", 10),                                         # known, newer unit copy
            ("b", "T", None, "u5", 500), ("b", HALF_TOPIC, None, "u6", 600),          # no real topic
            ("c", HALF_TOPIC, "T", "u7", 700)]                                        # broker not keyed
    records = pa.table({"broker": [r[0] for r in rows], "topic": [r[1] for r in rows],
                        "real_topic": [r[2] for r in rows], "uniq_key": [r[3] for r in rows],
                        "physical_offset": pa.array([r[4] for r in rows], pa.int64())})
    known = {"b": {("T", "u3"): 200, ("T", "u4"): 20}}
    assert scanned_keys(records, ["b"], known) == {"b": {("T", "u1"): 50, ("T", "u2"): 300, ("T", "u4"): 10}}
    assert scanned_keys(records, [], known) == {}
    assert scanned_keys(records.slice(2, 2), ["b"], {"b": {("T", "u2"): 300, ("T", "u3"): 400}}) == {}
