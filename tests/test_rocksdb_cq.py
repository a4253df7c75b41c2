"""RocketMQ 5.3.3 RocksDB consume queues (txlog_io.rocksdb_cq): the key / value codec against bytes a real
5.3.3 broker wrote (tests/data/fixtures/rocketmq-5.3.3-rocksdb: the store of a storeType=defaultRocksDB broker
after the realbroker workload and a clean stop), the encoder twins, and the read-only reader."""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_read_only import snapshot

from txlog_io import rocksdb_cq as R
from txlog_io.errors import EncodeError, UnreadableFileError

DB = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3-rocksdb" / "store" / "consumequeue"
HALF, OP, DISCARD = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC"

# (key, value) pairs as the 5.3.3 broker wrote them (read from DB with ldb-free raw iteration)
GOLDEN_UNIT = (bytes.fromhex("0000000901546f706963526254780100000000010000000000000000"),
               bytes.fromhex("0000000000003823000001f7ffffffffaf65a0fc000001a21e2c08f7"))
GOLDEN_OFFSET = (bytes.fromhex("0000000901546f70696352625478016d61780100000002"),
                 bytes.fromhex("0000000000006cf60000000000000003"))


@pytest.fixture()
def db_copy(tmp_path):
    d = tmp_path / "store" / "consumequeue"
    shutil.copytree(DB, d, copy_function=shutil.copy2)
    return d


def test_golden_unit_decodes_and_reencodes():
    k, v = GOLDEN_UNIT
    u = R.decode_cq_unit(k, v)
    assert (u.topic, u.queue_id, u.queue_offset) == ("TopicRbTx", 0, 0)
    assert (u.commitlog_offset, u.size) == (0x3823, 0x1F7)
    assert u.tags_code == -1352294148          # "TagRbTx".hashCode(), a negative int widened to long
    assert u.store_time_ms == 0x1A21E2C08F7
    assert R.encode_cq_unit(u) == (k, v)


def test_golden_offset_entry_decodes_and_reencodes():
    k, v = GOLDEN_OFFSET
    assert R.decode_offset_key(k) == ("TopicRbTx", "max", 2)
    assert R.decode_offset_value(v) == (0x6CF6, 3)
    assert R.encode_offset_key("TopicRbTx", "max", 2) == k and R.encode_offset_value(0x6CF6, 3) == v


def test_the_real_database_holds_the_golden_pairs_and_reads_consistently():
    with R.CqDatabase(DB) as db:
        assert db.column_families == ["default", "offset"]
        assert dict(db.raw_items())[GOLDEN_UNIT[0]] == GOLDEN_UNIT[1]
        assert dict(db.raw_items("offset"))[GOLDEN_OFFSET[0]] == GOLDEN_OFFSET[1]
        queues = db.queues()
        entries, checkpoint, found = db.offsets()
    assert not found
    assert queues[(HALF, 0)] == (0, 43) and queues[(OP, 0)] == (0, 3) and queues[(DISCARD, 0)] == (0, 5)
    # the offset table's "max" entry of every queue = its last unit (queue offset and CommitLog offset)
    rows = {}
    for b, a in R.read_units(DB):
        assert not a
        for r in b.to_pylist():
            rows[(r["topic"], r["queue_id"], r["queue_offset"])] = r
    maxes = {(e.topic, e.queue_id): e for e in entries if e.kind == "max"}
    for (topic, qid), (first, last) in queues.items():
        assert [k[2] for k in rows if k[:2] == (topic, qid)] == list(range(first, last + 1))
        assert maxes[(topic, qid)].queue_offset == last
        assert maxes[(topic, qid)].commitlog_offset == rows[(topic, qid, last)]["commitlog_offset"]
    # the dispatch checkpoint = the end of the newest record any unit points to
    assert checkpoint == R.dispatch_end(DB) == max(r["commitlog_offset"] + r["size"] for r in rows.values())
    half = [r for k, r in sorted(rows.items()) if k[0] == HALF]
    assert all(r["file"] == str(DB) and r["file_position"] == -1 for r in half)
    assert [r["commitlog_offset"] for r in half] == sorted(r["commitlog_offset"] for r in half)


def test_topic_filter_and_queue_range():
    got = [r for b, _ in R.read_units(DB, topics=[OP]) for r in b.to_pylist()]
    assert {r["topic"] for r in got} == {OP} and len(got) == 4
    got = [r["queue_offset"] for b, _ in R.read_units(DB, topics=[HALF], queue_id=0, start=10, end=13)
           for r in b.to_pylist()]
    assert got == [10, 11, 12]


def test_reading_never_writes_the_store(db_copy):
    before = snapshot(db_copy.parent)
    assert sum(b.num_rows for b, _ in R.read_units(db_copy)) == 62
    with R.CqDatabase(db_copy) as db:
        db.offsets()
        db.queues()
    assert R.dispatch_end(db_copy) is not None
    assert snapshot(db_copy.parent) == before


def test_undecodable_keys_and_impossible_units_are_findings():
    """A key RocketMQ's layout cannot produce and a unit with size 0 give BAD_CQ_ENTRY rows naming the database
    and the key; the good units still read.  (Written with the binding into a scratch database.)"""
    pytest.importorskip("rocksdict")
    from rocksdict import Options, Rdict

    with tempfile.TemporaryDirectory() as d:
        scratch = Path(d) / "consumequeue"
        o = Options(raw_mode=True)
        o.create_if_missing(True)
        o.create_missing_column_families(True)
        w = Rdict(str(scratch), o, column_families={"offset": Options(raw_mode=True)})
        w[R.encode_cq_key(HALF, 0, 0)] = R.encode_cq_value(100, 200, 0, 1)
        w[R.encode_cq_key(HALF, 0, 1)] = R.encode_cq_value(300, 0, 0, 1)            # size 0
        w[R.queue_prefix(HALF, 0) + b"\x00\x00"] = b"short"                          # cut key
        w.get_column_family("offset")[R.checkpoint_key()] = R.encode_checkpoint_value(500)
        w.close()
        got = list(R.read_units(scratch, topics=[HALF]))
        rows = [r for b, _ in got for r in b.to_pylist()]
        found = [a for _, a in got for a in a]
        assert [(r["queue_offset"], r["commitlog_offset"]) for r in rows] == [(0, 100)]
        assert sorted(a.kind for a in found) == ["BAD_CQ_ENTRY", "BAD_CQ_ENTRY"]
        assert all(a.file == str(scratch) and "key " in a.detail for a in found)
        with R.CqDatabase(scratch) as db:
            assert db.offsets()[1] == 500


def test_not_a_database_is_a_clear_error(tmp_path):
    (tmp_path / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(UnreadableFileError, match="RocksDB read-only open failed"):
        R.CqDatabase(tmp_path)


_topic = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
_i32 = st.integers(-(1 << 31), (1 << 31) - 1)
_i64 = st.integers(-(1 << 63), (1 << 63) - 1)


@given(_topic, _i32, _i64, _i64, _i32, _i64, _i64)
def test_unit_round_trip(topic, qid, qo, off, size, tags, ts):
    u = R.CqUnit(topic, qid, qo, off, size, tags, ts)
    k, v = R.encode_cq_unit(u)
    assert len(k) == R.CQ_KEY_LENGTH_WITHOUT_TOPIC + len(topic.encode()) and len(v) == R.CQ_UNIT_SIZE
    assert R.decode_cq_unit(k, v) == u


@given(_topic, st.sampled_from(["max", "min"]), _i32, _i64, _i64)
def test_offset_round_trip(topic, kind, qid, off, qo):
    assert R.decode_offset_key(R.encode_offset_key(topic, kind, qid)) == (topic, kind, qid)
    assert R.decode_offset_value(R.encode_offset_value(off, qo)) == (off, qo)


def test_encoders_refuse_what_rocketmq_cannot_write():
    with pytest.raises(EncodeError):
        R.encode_cq_key("t", 1 << 31, 0)
    with pytest.raises(EncodeError):
        R.encode_cq_value(0, 1 << 31, 0, 0)
    with pytest.raises(EncodeError):
        R.encode_offset_key("t", "mid", 0)


# ---- the audit's read path: a real 5.3.3 defaultRocksDB store (tests/data/fixtures/rocketmq-5.3.3-rocksdb) ----

STORE = DB.parent


def _opts_for(fmt, **extra):
    from jobs.sources.options import parse_options

    return parse_options(fmt, dict({"path": str(STORE), "broker": "rdb"}, **extra))


def test_discovery_lists_the_databases_queues_and_indexed_mode_plans_on_them():
    """The store's queues come from the database (not "no transaction index": no whole-CommitLog scan), the
    data source's consume-queue rows are the database's units, and indexed mode's plan is built from them:
    its dispatch point is the end of the newest unit's record: only the CommitLog after it is scanned."""
    from jobs.read.indexed.gaps import GAP_NO_INDEX
    from jobs.read.indexed.plan import dispatch_ends, driver_table, plan_indexed
    from jobs.read.stores import has_transaction_index, store_info
    from jobs.sources.formats import CONSUMEQUEUE_FORMAT
    from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS

    info = store_info("rdb", str(STORE), None)
    assert info.consumequeue_rocksdb and info.rocksdb_cq == str(DB)
    assert has_transaction_index(info) and info.consume_queues == 7
    assert info.tx_queue_bytes == (44 + 4 + 6) * R.CQ_UNIT_SIZE
    rows = driver_table(CONSUMEQUEUE_FORMAT, _opts_for(CONSUMEQUEUE_FORMAT))
    direct = [r for b, _ in R.read_units(DB) for r in b.to_pylist()]
    key = ("topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code")
    assert sorted(tuple(r[k] for k in key) for r in rows.to_pylist()) == sorted(tuple(r[k] for k in key)
                                                                               for r in direct)
    assert set(rows.column("broker").to_pylist()) == {"rdb"}
    assert dispatch_ends([info]) == {"rdb": R.dispatch_end(DB)}
    plan = plan_indexed([info], [info], _opts_for, None, None, None)
    assert plan.units is not None and plan.units.num_rows == 54
    assert set(plan.units.column("topic").to_pylist()) == set(TX_SYSTEM_TOPICS)
    assert not [g for g in plan.gaps if g[3] == GAP_NO_INDEX], plan.gaps
    # the only CommitLog range left: after the newest dispatched record (the broker wrote none after it)
    assert [(g[1], g[2]) for g in plan.gaps if g[3] == "DISPATCH_LAG"] == [(41237, 1 << 20)]


def test_relevant_record_estimate_counts_the_databases_transaction_units(tmp_path):
    """Full mode's up-front bound (jobs/read/estimate) counts a RocksDB queue's units off its listing (the
    database directory is no consume-queue file to bisect): the half, op and discard queues' 44 + 4 + 6 units,
    the units read straight from the database."""
    from jobs.read.estimate import min_relevant_records, written_units
    from jobs.sources.formats import store_listing
    from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS

    direct = sum(1 for b, _ in R.read_units(DB) for t in b.column("topic").to_pylist() if t in TX_SYSTEM_TOPICS)
    assert direct == 54
    assert min_relevant_records([store_listing(str(STORE), None)]) == direct
    assert written_units(str(tmp_path), 4096) == 0          # a directory where a file was expected: no units


def test_split_queue_reads_every_unit_once():
    """A queue cut into slices at any byte boundaries (as ``split_bytes`` cuts a big queue) reads each unit
    exactly once: a slice owns the units whose virtual position (28 bytes each) starts in it."""
    from jobs.sources.formats import _unit_slices, decode_unit_slice, store_listing

    (info,) = store_listing(str(STORE)).consume_queues[(HALF, 0)]
    assert info.rocksdb and info.size == 44 * R.CQ_UNIT_SIZE
    for split in (28, 50, 100, 1000, 4096):
        slices = _unit_slices("consumequeue", [info], split, HALF, 0)
        assert all(s.rocksdb for s in slices)
        got = [r["queue_offset"] for s in slices for b, _ in decode_unit_slice(s) for r in b.to_pylist()]
        assert got == list(range(44)), split


def test_cq_mismatch_from_rocksdb_units(tmp_path):
    """The reconstruction's CQ_MISMATCH check on RocksDB units: the real store's units agree with its CommitLog
    records; a copy whose half-queue unit 5 says a wrong size gives exactly one DIFFERS finding there."""
    import pyarrow as pa
    from rocksdict import Options, Rdict

    from jobs.reconstruct.reducer import _cq_mismatches
    from txlog_io.dledger import decode_log_range

    clog = STORE / "commitlog" / "00000000000000000000"
    records = pa.Table.from_batches([b for b, _ in decode_log_range(str(clog), base_offset=0, start=0,
                                                                       end=clog.stat().st_size,
                                                                       with_body=False)])

    def units(db):
        return pa.Table.from_batches([b for b, _ in R.read_units(db)])

    assert _cq_mismatches("rdb", records, units(DB), {"n_cq": 1}) == []
    copy = tmp_path / "consumequeue"
    shutil.copytree(DB, copy)
    w = Rdict(str(copy), Options(raw_mode=True), column_families={"offset": Options(raw_mode=True)})
    key = R.encode_cq_key(HALF, 0, 5)
    off, size, tags, ts = R.decode_cq_value(w[key])
    w[key] = R.encode_cq_value(off, size + 1, tags, ts)
    w.close()
    found = _cq_mismatches("rdb", records, units(copy), {"n_cq": 1})
    assert [(m["code"], m["physical_offset"], m["topic"], m["queue_offset"]) for m in found] == \
        [("CQ_MISMATCH", off, HALF, 5)]
    assert f"size {size + 1}" in found[0]["detail"] and f"size {size} at" in found[0]["detail"]


@pytest.mark.parametrize("mode", ["indexed", "full"])
def test_audit_of_the_real_rocksdb_store_equals_its_truth_and_leaves_it_untouched(spark, tmp_path, mode):
    """The committed 5.3.3 defaultRocksDB store (a private copy) audited in both modes: every transaction's
    state and discard count is the producer's / broker's truth (truth/truth.json), no finding, and the store
    (RocksDB files included) is byte-for-byte and mtime-for-mtime unchanged."""
    import json

    import deltalake

    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    store = tmp_path / "brökers" / "store"
    shutil.copytree(STORE, store, copy_function=shutil.copy2)
    truth = json.loads((STORE.parent / "truth" / "truth.json").read_text())
    conf = tmp_path / "audit.properties"
    conf.write_text("broker.transactionTimeOut=1000\nbroker.transactionCheckInterval=1000\n"
                    "broker.transactionCheckMax=3\n")
    before = snapshot(store)
    out = tmp_path / "out"
    _, opts = parse_args(["audit", "--store", str(store), "--broker", "rdb", "--out", str(out), "--mode", mode,
                          "--conf-file", str(conf), "--as-of", "2026-11-27T18:30:00Z"])
    run_audit(spark, opts, print_summary=False)
    assert snapshot(store) == before
    tx = deltalake.DeltaTable(str(out / "transactions")).to_pandas()
    assert dict(zip(tx["keys"], tx["state"], strict=True)) == \
        {k: v["state"] for k, v in truth["transactions"].items()}
    assert {k: int(n) for k, n in zip(tx["keys"], tx["discards"], strict=True) if n} == truth["broker_discards"]
    assert deltalake.DeltaTable(str(out / "audit_anomalies")).to_pandas().empty
