"""txlog_io.config: fastjson config files and the checkpoint."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from schemas import store as store_schemas
from txlog_io import config
from txlog_io.errors import AnomalyKind, EncodeError, FormatError, StoreNotFoundError, UsageError

from conftest import FIXTURES, FIXTURE_VERSIONS

CONFIG_FILES = sorted(p for v in FIXTURE_VERSIONS for p in (FIXTURES / v / "store" / "config").iterdir())

# consumerOffset.json exactly as fastjson pretty-prints it: tabs, one String key per line, Integer queue-id keys
# bare and inline, and a newline + the parent's tabs before each closing brace.  No final newline.
GOLDEN_CONSUMER_OFFSET = (
    '{\n'
    '\t"offsetTable":{\n'
    '\t\t"TopicA@CID_A":{0:524,1:489\n'
    '\t\t},\n'
    '\t\t"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:138\n'
    '\t\t}\n'
    '\t}\n'
    '}')
GOLDEN_OBJECT = {"offsetTable": {"TopicA@CID_A": {0: 524, 1: 489},
                                 "RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS": {0: 138}}}


def offsets_by_key(rows):
    return {(r["topic"], r["group"], r["queue_id"]): r["offset"] for r in rows}


# ------------------------------------------------------------------------------------------------- real brokers

def test_consumer_offsets_4_9_8():
    path = FIXTURES / "rocketmq-4.9.8/store/config/consumerOffset.json"
    rows, anomalies = config.read_consumer_offsets(path)
    assert anomalies == []
    got = offsets_by_key(rows)
    assert got[("RMQ_SYS_TRANS_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0)] == 138
    assert got[("RMQ_SYS_TRANS_OP_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0)] == 51
    assert [got[("TopicEvents", "CID_EVENTS", q)] for q in range(4)] == [506, 73, 80, 73]
    assert got[("%RETRY%CID_EVENTS", "CID_EVENTS", 0)] == 0
    assert len(rows) == 4 + 1 + 4 + 1 + 1 + 1
    assert all(r["file"] == str(path) for r in rows)
    batch = config.consumer_offsets_batch(rows)
    assert batch.schema.equals(store_schemas.CONSUMER_OFFSETS.arrow_schema(), check_metadata=True)
    assert batch.num_rows == len(rows)


def test_consumer_offsets_5_3_3():
    rows, anomalies = config.read_consumer_offsets(FIXTURES / "rocketmq-5.3.3/store/config/consumerOffset.json")
    assert anomalies == []
    got = offsets_by_key(rows)
    assert got[("RMQ_SYS_TRANS_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0)] == 194
    assert got[("RMQ_SYS_TRANS_OP_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0)] == 2
    assert [got[("TopicOrders", "CID_ORDERS", q)] for q in (1, 2, 3)] == [30, 17, 27]
    long_group = [r for r in rows if r["group"].startswith("CID_D_LONG_GROUP")]
    assert len(long_group) == 4 and len(long_group[0]["group"]) == 150


def test_consumer_offsets_3_1_4_is_empty():
    rows, anomalies = config.read_consumer_offsets(FIXTURES / "rocketmq-3.1.4/store/config/consumerOffset.json")
    assert rows == [] and anomalies == []


def test_delay_offsets_and_topics():
    assert config.read_delay_offsets(FIXTURES / "rocketmq-4.9.8/store/config/delayOffset.json") == ({1: 8, 2: 5}, [])
    assert config.read_delay_offsets(FIXTURES / "rocketmq-5.3.3/store/config/delayOffset.json") == ({1: 14, 2: 2}, [])
    topics, anomalies = config.read_topics(FIXTURES / "rocketmq-5.3.3/store/config/topics.json")
    assert anomalies == []
    assert topics["RMQ_SYS_TRANS_HALF_TOPIC"]["readQueueNums"] == 1
    assert topics["TopicEvents"]["perm"] == 6 and topics["TopicEvents"]["attributes"] == {}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: f"{p.parents[2].name}/{p.name}")
def test_every_fixture_config_file_round_trips_byte_identical(path):
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    rewritten = config.write_fastjson(config.parse_fastjson(text), pretty="\n" in text)
    assert rewritten.encode("utf-8") == raw


def test_checkpoint_matches_store_state(real_store):
    truth = json.loads((real_store / "truth" / "store_state.json").read_text())
    cp = config.decode_checkpoint(real_store / "store" / "checkpoint")
    assert cp["anomalies"] == []
    assert cp["physic_msg_timestamp"] == truth["checkpoint_physicMsgTimestamp"]
    assert cp["logics_msg_timestamp"] == truth["checkpoint_logicsMsgTimestamp"]
    assert cp["index_msg_timestamp"] == truth["checkpoint_indexMsgTimestamp"]
    # no fixture has a non-zero masterFlushedOffset / confirmPhyOffset, so without a version hint they are None
    assert cp["variant"] == 24 and cp["master_flushed_offset"] is None and cp["confirm_phy_offset"] is None
    version = real_store.name.split("-")[1]
    hinted = config.decode_checkpoint(real_store / "store" / "checkpoint", version=version)
    assert hinted["variant"] == {"3.1.4": 24, "4.9.8": 24, "5.3.3": 40}[version]
    assert config.encode_checkpoint(cp["physic_msg_timestamp"], cp["logics_msg_timestamp"],
                                    cp["index_msg_timestamp"]) == (real_store / "store" / "checkpoint").read_bytes()


# ------------------------------------------------------------------------------------------------- golden

def test_golden_consumer_offset_text():
    assert config.parse_fastjson(GOLDEN_CONSUMER_OFFSET) == GOLDEN_OBJECT
    assert config.write_fastjson(GOLDEN_OBJECT) == GOLDEN_CONSUMER_OFFSET
    assert config.write_fastjson(GOLDEN_OBJECT, pretty=False) == \
        '{"offsetTable":{"TopicA@CID_A":{0:524,1:489},"RMQ_SYS_TRANS_HALF_TOPIC@CID_RMQ_SYS_TRANS":{0:138}}}'


def test_golden_checkpoint():
    page = config.encode_checkpoint(0x01A2007E1333, 0x01A2007E1334, 0x01A2007E0129, 7, 9)
    assert len(page) == 4096 and not any(page[40:])
    assert page[:40].hex() == ("000001a2007e1333" "000001a2007e1334" "000001a2007e0129"
                               "0000000000000007" "0000000000000009")


# ------------------------------------------------------------------------------------------------- lenient parsing

def test_strings_with_digits_colons_and_braces_are_left_alone():
    text = '{"a:1,{2}":"x:3,4:5", 7:"q\\"8:9", "n":[1,{3:4}], "123":{"0":1, 0:2}}'
    assert config.parse_fastjson(text) == {"a:1,{2}": "x:3,4:5", 7: 'q"8:9', "n": [1, {3: 4}],
                                           "123": {"0": 1, 0: 2}}
    obj = config.parse_fastjson(text)
    assert isinstance(list(obj)[1], int) and isinstance(list(obj["123"])[0], str)


def test_trailing_commas_single_quotes_bom_and_bare_words():
    assert config.parse_fastjson('\ufeff{"a":[1,2,],\n\t"b":{x:1,},}') == {"a": [1, 2], "b": {"x": 1}}
    assert config.parse_fastjson("{'k':'it\\'s \"q\"', -1:true}") == {"k": "it's \"q\"", -1: True}


@pytest.mark.parametrize("text, position", [('{"a":1,,"b":2}', 7), ('{"a" 1}', 5), ('{"a":"open', 5),
                                            ('{"a":1]', 6), ('{"a":nope}', 5), ('{0:1 "x"}', 5)])
def test_bad_json_points_at_the_original_text(text, position):
    with pytest.raises(FormatError) as info:
        config.parse_fastjson(text, file="f.json")
    assert info.value.anomaly.kind == AnomalyKind.BAD_JSON
    assert info.value.anomaly.position == position
    assert info.value.anomaly.file == "f.json"


json_keys = st.one_of(st.text(max_size=8), st.integers(-(1 << 31), (1 << 31) - 1))
json_leaves = st.one_of(st.integers(-(1 << 63), (1 << 63) - 1), st.text(max_size=10), st.booleans())
json_values = st.recursive(json_leaves, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                                st.dictionaries(json_keys, inner, max_size=4)),
                           max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(obj=st.dictionaries(json_keys, json_values, max_size=6), pretty=st.booleans())
def test_write_then_parse_round_trip(obj, pretty):
    text = config.write_fastjson(obj, pretty=pretty)
    assert config.parse_fastjson(text) == obj
    assert config.write_fastjson(config.parse_fastjson(text), pretty=pretty) == text


def test_writer_details():
    assert config.write_fastjson({}) == "{}"
    assert config.write_fastjson({"a": None, "b": {}}) == '{\n\t"b":{}\n}'  # null values skipped
    assert config.write_fastjson({"s": {"x", }}) == '{\n\t"s":["x"]\n}'
    assert config.write_fastjson({"f": 1.5, "g": 1e10}, pretty=False) == '{"f":1.5,"g":1.0E10}'
    assert config.write_fastjson({"t": "tab\there"}, pretty=False) == '{"t":"tab\\there"}'
    with pytest.raises(EncodeError):
        config.write_fastjson({(1, 2): 3})
    with pytest.raises(EncodeError):
        config.write_fastjson({"a": object()})


# ------------------------------------------------------------------------------------------------- files, .bak

def test_bad_json_falls_back_to_bak(tmp_path):
    main = tmp_path / "consumerOffset.json"
    main.write_text('{"offsetTable":{"T@G":{0:1,\x00')
    (tmp_path / "consumerOffset.json.bak").write_text(GOLDEN_CONSUMER_OFFSET)
    rows, anomalies = config.read_consumer_offsets(main)
    assert offsets_by_key(rows) == {("TopicA", "CID_A", 0): 524, ("TopicA", "CID_A", 1): 489,
                                    ("RMQ_SYS_TRANS_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0): 138}
    assert all(r["file"].endswith(".bak") for r in rows)
    assert [a.kind for a in anomalies] == [AnomalyKind.BAD_JSON]
    assert anomalies[0].file == str(main) and "consumerOffset.json.bak" in anomalies[0].detail
    assert anomalies[0].source == "config"


def test_empty_or_missing_main_file_uses_bak(tmp_path):
    main = tmp_path / "delayOffset.json"
    (tmp_path / "delayOffset.json.bak").write_text('{\n\t"offsetTable":{1:8,2:5\n\t}\n}')
    assert config.read_delay_offsets(main)[0] == {1: 8, 2: 5}
    assert [a.kind for a in config.read_delay_offsets(main)[1]] == [AnomalyKind.MISSING_FILE]
    main.write_text("")
    offsets, anomalies = config.read_delay_offsets(main)
    assert offsets == {1: 8, 2: 5} and [a.kind for a in anomalies] == [AnomalyKind.BAD_JSON]


def test_both_copies_bad_or_missing(tmp_path):
    main = tmp_path / "topics.json"
    main.write_text("{nope")
    (tmp_path / "topics.json.bak").write_text("[1,")
    topics, anomalies = config.read_topics(main)
    assert topics == {} and [a.kind for a in anomalies] == [AnomalyKind.BAD_JSON, AnomalyKind.BAD_JSON]
    with pytest.raises(StoreNotFoundError):
        config.read_topics(tmp_path / "absent.json")


def test_bad_entries(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_text('{"offsetTable":{"a@b@c":{0:1},"nogroup":{0:1},"T@G":{0:"x",1:2,"q":3},"U@H":[1]}}')
    rows, anomalies = config.read_consumer_offsets(path)
    assert offsets_by_key(rows) == {("T", "G", 1): 2}
    assert [a.kind for a in anomalies] == [AnomalyKind.BAD_CONFIG_ENTRY] * 5
    assert anomalies[0].position == path.read_text().index('"a@b@c"')
    path.write_text('{"dataVersion":{}}')
    assert [a.kind for a in config.read_consumer_offsets(path)[1]] == [AnomalyKind.BAD_CONFIG_ENTRY]


def test_write_config_file_keeps_previous_as_bak(tmp_path):
    path = tmp_path / "consumerOffset.json"
    config.write_config_file(path, "first")
    assert path.read_text() == "first" and not (tmp_path / "consumerOffset.json.bak").exists()
    config.write_config_file(path, GOLDEN_CONSUMER_OFFSET)
    assert path.read_text() == GOLDEN_CONSUMER_OFFSET
    assert (tmp_path / "consumerOffset.json.bak").read_text() == "first"
    assert not (tmp_path / "consumerOffset.json.tmp").exists()


# ------------------------------------------------------------------------------------------------- checkpoint

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)


@settings(max_examples=100, deadline=None)
@given(values=st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1), st.integers(0, (1 << 63) - 1),
                        INT64, INT64))
def test_checkpoint_round_trip(tmp_path_factory, values):
    path = tmp_path_factory.mktemp("cp") / "checkpoint"
    path.write_bytes(config.encode_checkpoint(*values))
    cp = config.decode_checkpoint(path, version="5.3.3")
    assert cp["anomalies"] == []
    assert (cp["physic_msg_timestamp"], cp["logics_msg_timestamp"], cp["index_msg_timestamp"],
            cp["master_flushed_offset"], cp["confirm_phy_offset"]) == values


def test_checkpoint_variants_and_damage(tmp_path):
    path = tmp_path / "checkpoint"
    path.write_bytes(config.encode_checkpoint(1, 2, 3, master_flushed_offset=4))
    assert config.decode_checkpoint(path)["variant"] == 32
    assert config.decode_checkpoint(path, version="5.0.0")["master_flushed_offset"] == 4
    hinted = config.decode_checkpoint(path, version="4.9.7")
    assert hinted["master_flushed_offset"] is None and [a.kind for a in hinted["anomalies"]] == \
        [AnomalyKind.BAD_CHECKPOINT]  # a 4.x broker never writes byte 24
    path.write_bytes(config.encode_checkpoint(1, 2, 3, 0, 5))
    assert config.decode_checkpoint(path)["variant"] == 40
    path.write_bytes(config.encode_checkpoint(1, 2, 3)[:20])
    short = config.decode_checkpoint(path)
    assert short["index_msg_timestamp"] == 0 and [a.kind for a in short["anomalies"]] == [AnomalyKind.BAD_CHECKPOINT]
    damaged = bytearray(config.encode_checkpoint(-1, 2, 3))
    damaged[100] = 1
    path.write_bytes(bytes(damaged))
    assert sorted(a.position for a in config.decode_checkpoint(path)["anomalies"]) == [0, 100]
    assert [config.checkpoint_variant_for_version(v) for v in ("3.1.4", "4.9.8", "5.0.0", "5.1.0", "5.1.1", "5.3.3")] \
        == [24, 24, 32, 32, 40, 40]
    with pytest.raises(UsageError):
        config.checkpoint_variant_for_version("latest")
    with pytest.raises(StoreNotFoundError):
        config.decode_checkpoint(tmp_path / "missing")
    with pytest.raises(EncodeError):
        config.encode_checkpoint(1 << 63, 0, 0)
