"""txlog_io.consumequeue: ConsumeQueue / CQ ext / 3.x statetable / 3.x redolog codecs."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from conftest import FIXTURES, ROOT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schemas import store as store_schemas
from txlog_io import consumequeue as cq
from txlog_io.errors import AnomalyKind, EncodeError, StoreNotFoundError, UsageError

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
FIRST_NAME = "00000000000000000000"

CQ_SCHEMA = store_schemas.CONSUMEQUEUE.arrow_schema()
STATETABLE_SCHEMA = store_schemas.STATETABLE.arrow_schema()
REDOLOG_SCHEMA = store_schemas.REDOLOG.arrow_schema()


def java_string_hash(text: str) -> int:
    h = 0
    for ch in text:
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def write(directory: Path, name: str, data: bytes) -> Path:
    path = Path(directory) / name
    path.write_bytes(data)
    return path


def decode_cq(path, **kw):
    kw.setdefault("topic", "T")
    kw.setdefault("queue_id", 0)
    return cq.collect(cq.decode_consumequeue(path, **kw), CQ_SCHEMA)


def decode_st(path, **kw):
    return cq.collect(cq.decode_statetable(path, **kw), STATETABLE_SCHEMA)


def decode_rd(path, **kw):
    return cq.collect(cq.decode_redolog(path, **kw), REDOLOG_SCHEMA)


def kinds(anomalies):
    return [(a.kind, a.position) for a in anomalies]


# ------------------------------------------------------------------------------------------------- layouts

def test_layouts_are_derived_and_have_rocketmq_sizes():
    assert cq.CQ_UNIT_SIZE == 20 and cq.REDOLOG_UNIT_SIZE == 20 and cq.STATETABLE_UNIT_SIZE == 24
    assert [cq.CQ_UNIT_DTYPE.fields[n][1] for n in cq.CQ_UNIT_DTYPE.names] == [0, 8, 12]
    assert [cq.STATETABLE_UNIT_DTYPE.fields[n][1] for n in cq.STATETABLE_UNIT_DTYPE.names] == [0, 8, 12, 16, 20]
    assert cq.STATETABLE_STATE_POS == 20  # TS_STATE_POS in 3.1.4
    assert cq.CQ_EXT_MIN_UNIT_SIZE == 20


def test_modules_do_not_import_spark():
    code = ("import sys; import txlog_io.consumequeue, txlog_io.mappedfile, txlog_io.config; "
            "sys.exit(1 if any(m.startswith('pyspark') for m in sys.modules) else 0)")
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0


# ------------------------------------------------------------------------------------------------- real brokers

def _cq_files(store: Path):
    for queue_dir in sorted((store / "consumequeue").glob("*/*")):
        for f in sorted(queue_dir.iterdir()):
            yield queue_dir.parent.name, int(queue_dir.name), f


def test_consumequeue_matches_truth(real_store):
    truth = {}
    for line in open(real_store / "truth" / "consumequeue.jsonl"):
        r = json.loads(line)
        truth[(r["topic"], r["queueId"], r["index"])] = r
    decoded = {}
    for topic, queue_id, f in _cq_files(real_store / "store"):
        for batch, anomalies in cq.decode_consumequeue(f, topic=topic, queue_id=queue_id):
            assert batch.schema.equals(CQ_SCHEMA, check_metadata=True)
            assert anomalies == []
            for row in batch.to_pylist():
                decoded[(row["topic"], row["queue_id"], row["queue_offset"])] = row
    assert decoded.keys() == truth.keys()
    for key, row in decoded.items():
        t = truth[key]
        assert Path(row["file"]).name == t["file"]
        assert row["commitlog_offset"] == t["commitLogOffset"]
        assert row["size"] == t["size"]
        assert row["tags_code"] == t["tagsCode"]
        assert row["file_position"] == (t["index"] * 20) % 6000  # 300-unit files in every fixture


def test_consumequeue_second_file_offsets_come_from_its_name():
    # 4.9.8 TopicEvents/0 rolled over: units 300.. live in 00000000000000006000 at positions 0..
    f = FIXTURES / "rocketmq-4.9.8/store/consumequeue/TopicEvents/0/00000000000000006000"
    table, anomalies = decode_cq(f, topic="TopicEvents")
    assert anomalies == []
    assert table.column("queue_offset").to_pylist() == list(range(300, 506))
    assert table.column("file_position").to_pylist()[:2] == [0, 20]


def test_statetable_matches_truth():
    store = FIXTURES / "rocketmq-3.1.4"
    truth = [json.loads(line) for line in open(store / "truth" / "statetable.jsonl")]
    anomalies = []
    rows = list(cq.iter_statetable_dicts(store / "store/transaction/statetable" / FIRST_NAME, anomalies=anomalies))
    assert anomalies == []
    assert len(rows) == len(truth) == 42
    for row, t in zip(rows, truth, strict=True):
        assert list(row) == ["file", "index", "commitlog_offset", "size", "store_timestamp_s",
                             "producer_group_hash", "state"]
        assert Path(row["file"]).name == t["file"]
        assert (row["index"], row["commitlog_offset"], row["size"], row["store_timestamp_s"],
                row["producer_group_hash"], row["state"]) == \
               (t["index"], t["commitLogOffset"], t["size"], t["timestampSec"], t["producerGroupHash"],
                t["stateName"])
    assert java_string_hash("PID_TX_DEMO") == 372692970 == rows[0]["producer_group_hash"]


def test_redolog_matches_truth():
    store = FIXTURES / "rocketmq-3.1.4"
    truth = [json.loads(line) for line in open(store / "truth" / "redolog.jsonl")]
    path = store / "store/transaction/redolog/TRANSACTION_REDOLOG_TOPIC_XXXX/0" / FIRST_NAME
    anomalies = []
    rows = list(cq.iter_redolog_dicts(path, anomalies=anomalies))
    assert anomalies == []
    assert len(rows) == len(truth) == 77
    for row, t in zip(rows, truth, strict=True):
        assert list(row) == ["file", "index", "commitlog_offset", "size", "tags_code", "kind"]
        assert (row["index"], row["commitlog_offset"], row["size"], row["tags_code"]) == \
               (t["index"], t["commitLogOffset"], t["size"], t["tagsCode"])
        assert row["kind"] == ("PREPARED" if t["kind"] == "PREPARED" else "END")
        assert t["kind"] in ("PREPARED", "END(tagsCode=preparedCommitLogOffset)")
    assert sum(r["kind"] == "PREPARED" for r in rows) == 42


def test_consumequeue_dicts_use_public_names():
    f = FIXTURES / "rocketmq-3.1.4/store/consumequeue/TopicA/0" / FIRST_NAME
    first = next(cq.iter_consumequeue_dicts(f, topic="TopicA", queue_id=0))
    assert first == {"file": str(f), "topic": "TopicA", "queue_id": 0, "queue_offset": 0, "commitlog_offset": 0,
                     "size": 713, "tags_code": java_string_hash("TagB")}


# ------------------------------------------------------------------------------------------------- golden bytes

def test_golden_cq_unit_matches_real_file():
    # 3.1.4 TopicA/0 queue offset 1: CommitLog offset 1964 (0x7AC), size 1195 (0x4AB), tagsCode "TagA".hashCode()
    # = 2598919 (0x27A807).
    expected = bytes.fromhex("00000000000007ac" "000004ab" "000000000027a807")
    assert cq.encode_cq_unit(1964, 1195, java_string_hash("TagA")) == expected
    f = FIXTURES / "rocketmq-3.1.4/store/consumequeue/TopicA/0" / FIRST_NAME
    assert f.read_bytes()[20:40] == expected


def test_golden_pre_blank():
    # fillPreBlank: offset 0, size Integer.MAX_VALUE, tagsCode 0
    assert cq.encode_pre_blank() == bytes.fromhex("0000000000000000" "7fffffff" "0000000000000000")


def test_golden_statetable_unit_matches_real_file():
    # 3.1.4 statetable index 0: prepared record at 11096 (0x2B58), size 993 (0x3E1), stored at 1795304862 s
    # (0x6B022D9E), PGROUP "PID_TX_DEMO".hashCode() = 372692970 (0x1636D7EA), state 8 = COMMIT (at byte 20).
    expected = bytes.fromhex("0000000000002b58" "000003e1" "6b022d9e" "1636d7ea" "00000008")
    unit = cq.encode_statetable_unit(11096, 993, 1795304862, 372692970, "COMMIT")
    assert unit == expected == cq.encode_statetable_unit(11096, 993, 1795304862, 372692970, 8)
    f = FIXTURES / "rocketmq-3.1.4/store/transaction/statetable" / FIRST_NAME
    assert f.read_bytes()[:24] == unit


def test_golden_redolog_units_match_real_file():
    # index 0: PREPARED at 11096, size 993, tagsCode -1;  index 1: COMMIT record at 12089 (0x2F39) ending it,
    # tagsCode = the prepared offset 11096.
    prepared = bytes.fromhex("0000000000002b58" "000003e1" "ffffffffffffffff")
    end = bytes.fromhex("0000000000002f39" "000003e1" "0000000000002b58")
    assert cq.encode_redolog_unit(11096, 993) == prepared
    assert cq.encode_redolog_unit(12089, 993, tags_code=11096) == end
    f = FIXTURES / "rocketmq-3.1.4/store/transaction/redolog/TRANSACTION_REDOLOG_TOPIC_XXXX/0" / FIRST_NAME
    assert f.read_bytes()[:40] == prepared + end


def test_golden_cq_ext_unit():
    # size 22 = 20 + 2-byte bitmap, tagsCode 7, msgStoreTime 0x0102030405060708, bitMapSize 2, bitmap a5 5a
    expected = bytes.fromhex("0016" "0000000000000007" "0102030405060708" "0002" "a55a")
    assert cq.encode_cq_ext_unit(7, 0x0102030405060708, b"\xa5\x5a") == expected
    assert cq.encode_cq_ext_end_marker() == b"\xff\xff"


# ------------------------------------------------------------------------------------------------- encoders

def test_encoders_refuse_what_rocketmq_never_writes():
    with pytest.raises(EncodeError):
        cq.encode_cq_unit(-1, 10, 0)
    with pytest.raises(EncodeError):
        cq.encode_cq_unit(0, 0, 0)
    with pytest.raises(EncodeError):
        cq.encode_cq_unit(1 << 63, 10, 0)
    with pytest.raises(EncodeError):
        cq.encode_cq_unit(0, 1 << 31, 0)
    with pytest.raises(EncodeError):
        cq.encode_cq_unit(0, 10, "tag")
    with pytest.raises(EncodeError):
        cq.encode_statetable_unit(1, 1, 1, 1, 5)
    with pytest.raises(EncodeError):
        cq.encode_statetable_unit(1, 1, 1, 1, "DONE")
    with pytest.raises(EncodeError):
        cq.encode_redolog_unit(1, 1, tags_code=-2)
    with pytest.raises(EncodeError):
        cq.encode_cq_units({"commitlog_offset": [1, -1], "size": [1, 1], "tags_code": [0, 0]})
    with pytest.raises(EncodeError):
        cq.encode_cq_units({"commitlog_offset": [1], "size": [1 << 31], "tags_code": [0]})
    with pytest.raises(EncodeError):
        cq.encode_cq_units({"commitlog_offset": [1, 2], "size": [1], "tags_code": [0]})
    with pytest.raises(EncodeError):
        cq.encode_cq_ext_unit(0, 0, b"x" * 32760)
    # damage tests and the reference broker can still write impossible units on purpose
    assert len(cq.encode_cq_unit(-1, -1, 0, allow_invalid=True)) == 20
    assert len(cq.encode_statetable_unit(-1, 0, 0, 0, 99, allow_invalid=True)) == 24


def test_encode_cq_units_accepts_a_decoded_batch():
    f = FIXTURES / "rocketmq-4.9.8/store/consumequeue/RMQ_SYS_TRANS_HALF_TOPIC/0" / FIRST_NAME
    table, _ = decode_cq(f)
    assert cq.encode_cq_units(table) == f.read_bytes()[:table.num_rows * 20]
    assert cq.encode_cq_units({"commitlog_offset": [], "size": [], "tags_code": []}) == b""


# ------------------------------------------------------------------------------------------------- round trips

cq_units = st.tuples(st.integers(0, (1 << 63) - 1), st.integers(1, (1 << 31) - 1), INT64).filter(
    lambda u: u != (0, cq.PRE_BLANK_SIZE, 0))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=st.lists(cq_units, max_size=12), base_units=st.integers(0, 10 ** 12), pre_blanks=st.integers(0, 3),
       chunk=st.integers(1, 5))
def test_cq_round_trip(units, base_units, pre_blanks, chunk):
    arrays = {name: np.array([u[i] for u in units], dtype=np.int64)
              for i, name in enumerate(["commitlog_offset", "size", "tags_code"])}
    data = cq.encode_pre_blank() * pre_blanks + cq.encode_cq_units(arrays) + bytes(40)
    assert data[pre_blanks * 20:len(data) - 40] == b"".join(cq.encode_cq_unit(*u) for u in units)
    with tempfile.TemporaryDirectory() as d:
        base = base_units * 20
        path = write(Path(d), f"{base:020d}", data)
        table, anomalies = decode_cq(path, chunk_units=chunk)
    assert anomalies == []
    assert list(zip(table.column("commitlog_offset").to_pylist(), table.column("size").to_pylist(),
                    table.column("tags_code").to_pylist(), strict=True)) == units
    assert table.column("queue_offset").to_pylist() == [base_units + pre_blanks + i for i in range(len(units))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(1, (1 << 31) - 1), INT32, INT32,
                                st.sampled_from([4, 8, 12])), max_size=10))
def test_statetable_round_trip(units):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), FIRST_NAME, b"".join(cq.encode_statetable_unit(*u) for u in units) + bytes(24))
        table, anomalies = decode_st(path)
    assert anomalies == []
    names = {4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}
    assert [tuple(r.values())[1:] for r in table.to_pylist()] == \
           [(i, *u[:4], names[u[4]]) for i, u in enumerate(units)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(units=st.lists(st.tuples(st.integers(1, (1 << 63) - 1), st.integers(1, (1 << 31) - 1), st.booleans(),
                                st.integers(0, (1 << 63) - 1)), max_size=10))
def test_redolog_round_trip(units):
    encoded = []
    expected = []
    for offset, size, is_prepared, prepared_offset in units:
        tags = -1 if is_prepared else prepared_offset % offset  # an END points before itself
        encoded.append(cq.encode_redolog_unit(offset, size, tags_code=tags))
        expected.append((offset, size, tags, "PREPARED" if is_prepared else "END"))
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), FIRST_NAME, b"".join(encoded))
        table, anomalies = decode_rd(path)
    assert anomalies == []
    assert [(r["commitlog_offset"], r["size"], r["tags_code"], r["kind"]) for r in table.to_pylist()] == expected


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes_never_raise_and_every_unit_is_accounted_for(data):
    with tempfile.TemporaryDirectory() as d:
        path = write(Path(d), FIRST_NAME, data)
        for decode, unit in ((decode_cq, 20), (decode_st, 24), (decode_rd, 20)):
            table, anomalies = decode(path)
            positions = set(table.column("file_position").to_pylist()) if "file_position" in table.column_names \
                else {i * unit for i in table.column("index").to_pylist()}
            bad = {a.position for a in anomalies if a.kind.startswith("BAD_")}
            for p in range(0, len(data) - unit + 1, unit):
                chunk = data[p:p + unit]
                skipped = not any(chunk) or (unit == 20 and chunk == cq.encode_pre_blank())
                assert (p in positions) + (p in bad and p not in positions) + skipped >= 1
            if len(data) % unit:
                assert (AnomalyKind.TRUNCATED_RECORD, len(data) - len(data) % unit) in kinds(anomalies)


@settings(max_examples=200, deadline=None)
@given(offset=st.integers(0, cq.CQ_EXT_MAX_REAL_OFFSET))
def test_ext_address_round_trip(offset):
    address = cq.ext_address(offset)
    assert cq.is_ext_address(address)
    assert cq.ext_offset(address) == offset


@settings(max_examples=200, deadline=None)
@given(tags=INT32)
def test_real_tag_hashes_are_never_ext_addresses(tags):
    assert not cq.is_ext_address(tags)


# ------------------------------------------------------------------------------------------------- rules

def _unit(offset, size, tags=0):
    return cq.encode_cq_unit(offset, size, tags, allow_invalid=True)


def _messy_cq_file() -> bytes:
    """pre-blank, 4 units, a bad unit, 2 units, a 1-unit hole, 1 unit after the hole, zero tail, 7 stray bytes."""
    return (cq.encode_pre_blank()
            + b"".join(_unit(1000 * i, 100 + i, i) for i in range(1, 5))
            + _unit(-5, 10, 0)
            + _unit(6000, 106, 6) + _unit(7000, 107, -7)
            + bytes(20)
            + _unit(9000, 109, 9)
            + bytes(60)
            + b"\0\0\x01\0\0\0\0")


def test_cq_rules_pre_blank_bad_entry_hole_and_truncation(tmp_path):
    path = write(tmp_path, "00000000000000000200", _messy_cq_file())
    table, anomalies = decode_cq(path)
    rows = table.to_pylist()
    assert [r["commitlog_offset"] for r in rows] == [1000, 2000, 3000, 4000, 6000, 7000, 9000]
    assert [r["queue_offset"] for r in rows] == [11, 12, 13, 14, 16, 17, 19]  # 200/20 = 10 is the pre-blank
    assert kinds(anomalies) == [(AnomalyKind.BAD_CQ_ENTRY, 100), (AnomalyKind.GARBAGE_AFTER_END, 180),
                                (AnomalyKind.TRUNCATED_RECORD, 260)]
    bad = anomalies[0]
    assert bad.source == "consumequeue" and bad.physical_offset == 300 and "commitlog_offset=-5" in bad.actual
    assert anomalies[1].physical_offset == 380



def test_findings_only_decode_has_the_same_findings(tmp_path):
    """``rows=False`` (a queue decoded for its findings only): empty batches, the very same findings, at every
    chunk size (a chunk with findings but no rows, one with rows but no findings)."""
    path = write(tmp_path, "00000000000000000200", _messy_cq_file())
    for chunk in (1, 3, 1 << 18):
        full = list(cq.decode_consumequeue(path, topic="T", queue_id=0, chunk_units=chunk))
        lean = list(cq.decode_consumequeue(path, topic="T", queue_id=0, chunk_units=chunk, rows=False))
        assert all(b.num_rows == 0 and b.schema == full[0][0].schema for b, _ in lean)
        assert [a for _, found in lean for a in found] == [a for _, found in full for a in found]
        assert len([a for _, found in lean for a in found]) == 3

def test_zero_tail_is_clean_end(tmp_path):
    path = write(tmp_path, FIRST_NAME, _unit(1, 2, 3) + bytes(20 * 50))
    table, anomalies = decode_cq(path)
    assert table.num_rows == 1 and anomalies == []


def test_range_split_every_point_yields_every_unit_once(tmp_path):
    data = _messy_cq_file()
    path = write(tmp_path, FIRST_NAME, data)
    full, full_anomalies = decode_cq(path)
    for split in range(0, len(data) + 2):
        left, left_anomalies = decode_cq(path, end=split)
        right, right_anomalies = decode_cq(path, start=split)
        assert pa.concat_tables([left, right]).equals(full), split
        assert left_anomalies + right_anomalies == full_anomalies, split


def test_three_way_random_splits_and_chunk_sizes(tmp_path):
    rng = random.Random(7)
    data = b"".join(_unit(rng.randrange(1 << 40), rng.randrange(1, 1 << 20), rng.randrange(-99, 99))
                    for _ in range(50)) + bytes(20) + _unit(5, 5) + bytes(35)
    path = write(tmp_path, FIRST_NAME, data)
    full, full_anomalies = decode_cq(path)
    for chunk in (1, 3, 7, 64):
        table, anomalies = decode_cq(path, chunk_units=chunk)
        assert table.equals(full) and anomalies == full_anomalies
    for _ in range(40):
        a, b = sorted(rng.randrange(len(data) + 1) for _ in range(2))
        parts = [decode_cq(path, end=a, chunk_units=3), decode_cq(path, start=a, end=b, chunk_units=2),
                 decode_cq(path, start=b)]
        assert pa.concat_tables([p[0] for p in parts]).equals(full)
        assert sum((p[1] for p in parts), []) == full_anomalies


def test_statetable_and_redolog_range_split(tmp_path):
    st_data = b"".join(cq.encode_statetable_unit(100 * i + 1, 10, 5, 6, [4, 8, 12][i % 3]) for i in range(6)) \
        + cq.encode_statetable_unit(1, 1, 1, 1, 3, allow_invalid=True) + bytes(24) \
        + cq.encode_statetable_unit(9, 9, 9, 9, 4) + bytes(30)
    rd_data = b"".join(cq.encode_redolog_unit(100 * i + 50, 10, tags_code=-1 if i % 2 == 0 else 100 * i - 50)
                       for i in range(6)) + bytes(20) + cq.encode_redolog_unit(5, 5) + bytes(9)
    for data, decode in ((st_data, decode_st), (rd_data, decode_rd)):
        path = write(tmp_path, FIRST_NAME, data)
        full, full_anomalies = decode(path)
        for split in range(0, len(data) + 1):
            left, la = decode(path, end=split)
            right, ra = decode(path, start=split)
            assert pa.concat_tables([left, right]).equals(full)
            assert la + ra == full_anomalies


def test_statetable_unknown_state_and_bad_pointer(tmp_path):
    data = (cq.encode_statetable_unit(10, 5, 1, 2, 4)
            + cq.encode_statetable_unit(20, 5, 1, 2, 7, allow_invalid=True)
            + cq.encode_statetable_unit(-1, 5, 1, 2, 8, allow_invalid=True)
            + cq.encode_statetable_unit(30, 5, 1, 2, 12))
    path = write(tmp_path, "00000000000000000048", data)  # base 48 -> first index 2
    table, anomalies = decode_st(path)
    assert table.column("state").to_pylist() == ["PREPARED", "UNKNOWN(7)", "ROLLBACK"]
    assert table.column("index").to_pylist() == [2, 3, 5]
    assert kinds(anomalies) == [(AnomalyKind.BAD_STATETABLE_UNIT, 24), (AnomalyKind.BAD_STATETABLE_UNIT, 48)]
    assert all(a.source == "statetable" for a in anomalies)


def test_redolog_end_must_point_before_itself(tmp_path):
    data = (cq.encode_redolog_unit(100, 5) + cq.encode_redolog_unit(200, 5, tags_code=100)
            + cq.encode_redolog_unit(300, 5, tags_code=300) + _unit(400, 5, -9) + _unit(500, 0, 1)
            + cq.encode_pre_blank())
    path = write(tmp_path, FIRST_NAME, data)
    table, anomalies = decode_rd(path)
    assert table.column("kind").to_pylist() == ["PREPARED", "END", "END", "END"]
    assert kinds(anomalies) == [(AnomalyKind.BAD_REDOLOG_UNIT, 40), (AnomalyKind.BAD_REDOLOG_UNIT, 60),
                                (AnomalyKind.BAD_REDOLOG_UNIT, 80)]


# ------------------------------------------------------------------------------------------------- damage

def _small_cq_file() -> bytes:
    return cq.encode_pre_blank() + b"".join(_unit(977 * i, 200 + i, i * 31 - 50) for i in range(1, 9)) + bytes(60)


def _rows_by_position(table):
    return {r["file_position"]: r for r in table.to_pylist()}


def test_truncation_at_every_byte(tmp_path):
    data = _small_cq_file()
    original = _rows_by_position(decode_cq(write(tmp_path, FIRST_NAME, data))[0])
    for length in range(len(data) + 1):
        path = write(tmp_path, FIRST_NAME, data[:length])
        table, anomalies = decode_cq(path)
        rows = _rows_by_position(table)
        assert rows == {p: r for p, r in original.items() if p + 20 <= length}
        expected = [(AnomalyKind.TRUNCATED_RECORD, length - length % 20)] if length % 20 else []
        assert kinds(anomalies) == expected


def test_truncation_statetable_and_redolog(tmp_path):
    st_data = b"".join(cq.encode_statetable_unit(50 * i + 1, 9, 1, 2, 4) for i in range(5)) + bytes(24)
    rd_data = b"".join(cq.encode_redolog_unit(50 * i + 1, 9) for i in range(5)) + bytes(20)
    for data, decode, unit in ((st_data, decode_st, 24), (rd_data, decode_rd, 20)):
        full = decode(write(tmp_path, FIRST_NAME, data))[0].to_pylist()
        for length in range(len(data) + 1):
            table, anomalies = decode(write(tmp_path, FIRST_NAME, data[:length]))
            assert table.to_pylist() == full[:min(length // unit, len(full))]
            assert len(anomalies) == (1 if length % unit else 0)


def test_random_bit_flips(tmp_path):
    rng = random.Random(20240611)
    data = _small_cq_file()
    original = _rows_by_position(decode_cq(write(tmp_path, FIRST_NAME, data))[0])
    flips = [(byte, bit) for byte in range(len(data)) for bit in range(8)]
    for byte, bit in rng.sample(flips, 400):
        damaged = bytearray(data)
        damaged[byte] ^= 1 << bit
        table, anomalies = decode_cq(write(tmp_path, FIRST_NAME, bytes(damaged)))
        rows = _rows_by_position(table)
        hit = byte - byte % 20
        for position, row in original.items():
            if position != hit:
                assert rows.get(position) == row, (byte, bit, position)


def test_random_bit_flips_statetable(tmp_path):
    rng = random.Random(3)
    data = b"".join(cq.encode_statetable_unit(50 * i + 1, 9, 1, 2, 8) for i in range(6)) + bytes(48)
    original = {r["index"]: r for r in decode_st(write(tmp_path, FIRST_NAME, data))[0].to_pylist()}
    for _ in range(200):
        byte, bit = rng.randrange(len(data)), rng.randrange(8)
        damaged = bytearray(data)
        damaged[byte] ^= 1 << bit
        rows = {r["index"]: r for r in decode_st(write(tmp_path, FIRST_NAME, bytes(damaged)))[0].to_pylist()}
        for index, row in original.items():
            if index != byte // 24:
                assert rows[index] == row


# ------------------------------------------------------------------------------------------------- CQ ext

def test_cq_ext_walk_lookup_and_end_marker(tmp_path):
    units = [(11, 1000, b""), (-22, 2000, b"\x01\x02\x03\x04\x05\x06\x07\x08"), (33, 3000, b"\xff")]
    data = b"".join(cq.encode_cq_ext_unit(*u) for u in units)
    full = data + cq.encode_cq_ext_end_marker() + bytes(10)
    path = write(tmp_path, "00000000000000000128", full)
    anomalies = []
    decoded = list(cq.iter_cq_ext_units(path, anomalies=anomalies))
    assert anomalies == []
    assert [(u.tags_code, u.msg_store_time, u.filter_bitmap) for u in decoded] == units
    assert [u.file_position for u in decoded] == [0, 20, 48]
    assert decoded[1].address == cq.ext_address(128 + 20) and cq.is_ext_address(decoded[1].address)

    class MF:  # anything with path / base_offset / size, like mappedfile.MappedFile
        def __init__(self, p):
            self.path, self.base_offset, self.size = p, 128, p.stat().st_size

    found = cq.read_cq_ext_unit([MF(path)], decoded[2].address)
    assert (found.tags_code, found.filter_bitmap, found.address) == (33, b"\xff", decoded[2].address)
    assert cq.read_cq_ext_unit([MF(path)], cq.ext_address(5000)) is None
    with pytest.raises(UsageError):
        cq.ext_offset(-5)


def test_cq_ext_damage(tmp_path):
    good = cq.encode_cq_ext_unit(1, 2, b"ab")
    cases = {
        "garbage": (good + bytes(4) + b"\x07", [AnomalyKind.GARBAGE_AFTER_END]),
        "tiny size": (good + b"\x00\x05" + bytes(20), [AnomalyKind.BAD_CQ_EXT_UNIT]),
        "bitmap disagrees": (b"\x00\x18" + good[2:] + b"zz" + good, [AnomalyKind.BAD_CQ_EXT_UNIT]),
        "truncated": (good + good[:10], [AnomalyKind.TRUNCATED_RECORD]),
        "after marker": (good + b"\xff\xff" + b"\x00\x01", [AnomalyKind.GARBAGE_AFTER_END]),
    }
    for name, (data, expected) in cases.items():
        anomalies = []
        units = list(cq.iter_cq_ext_units(write(tmp_path, FIRST_NAME, data), anomalies=anomalies))
        assert units[0].filter_bitmap == b"ab" or name == "bitmap disagrees", name
        assert [a.kind for a in anomalies] == expected, name
    # every truncation of a two-unit file decodes without raising
    data = good + cq.encode_cq_ext_unit(3, 4, b"xyz")
    for length in range(len(data) + 1):
        anomalies = []
        units = list(cq.iter_cq_ext_units(write(tmp_path, FIRST_NAME, data[:length]), anomalies=anomalies))
        assert len(units) == (length >= 22) + (length == len(data))


# ------------------------------------------------------------------------------------------------- usage errors

def test_usage_errors(tmp_path):
    with pytest.raises(StoreNotFoundError):
        list(cq.decode_consumequeue(tmp_path / "missing", topic="T", queue_id=0, base_offset=0))
    path = write(tmp_path, "not-an-offset", bytes(20))
    with pytest.raises(UsageError):
        list(cq.decode_consumequeue(path, topic="T", queue_id=0))
    assert decode_cq(path, base_offset=0)[0].num_rows == 0
    with pytest.raises(UsageError):
        list(cq.decode_statetable(path, base_offset=0, start=-1))
    with pytest.raises(UsageError):
        list(cq.decode_redolog(path, base_offset=0, start=10, end=5))
    with pytest.raises(UsageError):
        list(cq.decode_redolog(path, base_offset=-20))


def test_empty_file_and_range_past_end(tmp_path):
    path = write(tmp_path, FIRST_NAME, b"")
    assert list(cq.decode_consumequeue(path, topic="T", queue_id=0)) == []
    path = write(tmp_path, FIRST_NAME, _unit(1, 1) * 3)
    assert list(cq.decode_consumequeue(path, topic="T", queue_id=0, start=1000)) == []


def test_last_unit_end_reads_backwards_to_the_newest_real_unit(tmp_path):
    from txlog_io.consumequeue import encode_cq_unit, encode_pre_blank, last_unit_end

    units = [encode_cq_unit(1000 + 300 * i, 250 + i, 7) for i in range(50)]
    f = tmp_path / "00000000000000000000"
    f.write_bytes(encode_pre_blank() * 3 + b"".join(units) + bytes(20 * 400))      # preallocated zero tail
    expected = 1000 + 300 * 49 + 250 + 49
    for block in (20, 60, 1000, 64 * 1024):     # the newest unit found whatever the block size
        assert last_unit_end(f, block_bytes=block) == expected
    only_blank = tmp_path / "00000000000000001000"
    only_blank.write_bytes(encode_pre_blank() * 5 + bytes(200))
    empty = tmp_path / "00000000000000002000"
    empty.write_bytes(b"")
    torn = tmp_path / "00000000000000003000"
    torn.write_bytes(units[0] + units[1][:7])       # a partial unit at the end is not a unit
    assert last_unit_end(only_blank) is None and last_unit_end(empty) is None
    assert last_unit_end(torn) == 1000 + 250
    bad = tmp_path / "00000000000000004000"
    bad.write_bytes(units[0] + encode_cq_unit(5, 1, 0, allow_invalid=True)[:8] + (-3).to_bytes(4, "big", signed=True)
                    + bytes(8))
    assert last_unit_end(bad) is None               # an impossible newest unit: no claim at all


def test_first_and_last_unit_name_the_queue_ends_of_a_file(tmp_path):
    from txlog_io.consumequeue import encode_cq_unit, encode_pre_blank, first_unit, last_unit

    units = [encode_cq_unit(1000 + 300 * i, 250 + i, 7) for i in range(50)]
    f = tmp_path / "00000000000000000000"
    f.write_bytes(encode_pre_blank() * 3 + b"".join(units) + bytes(20 * 400))
    for block in (20, 60, 1000, 4096, 64 * 1024):
        assert first_unit(f, block_bytes=block) == (3, 1000, 250)
        assert last_unit(f, block_bytes=block) == (52, 1000 + 300 * 49, 250 + 49)
    leading_zeros = tmp_path / "00000000000000001000"          # units not yet written before the first one
    leading_zeros.write_bytes(bytes(20 * 300) + units[0] + bytes(40))
    assert first_unit(leading_zeros, block_bytes=100) == (300, 1000, 250)
    blank = tmp_path / "00000000000000002000"
    blank.write_bytes(encode_pre_blank() * 5 + bytes(200))
    bad = tmp_path / "00000000000000003000"
    bad.write_bytes((-3).to_bytes(8, "big", signed=True) + (5).to_bytes(4, "big") + bytes(8) + units[1])
    assert first_unit(blank) is None and last_unit(blank) is None
    assert first_unit(bad) is None                      # an impossible oldest unit: no claim at all
