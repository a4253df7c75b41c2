"""CommitLog codec: real-broker truth, golden bytes, round trips, damage and range splits."""
from __future__ import annotations

import base64
import gzip
import json
import os
import random
import shutil
import struct
import zlib

import pytest
from conftest import FIXTURE_VERSIONS, FIXTURES
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from truth_frames import truth_record_fields

from txlog_io import commitlog as CL
from txlog_io import properties as P
from txlog_io.commitlog import (
    Message,
    decode_at,
    decode_range,
    encode_blank,
    encode_record,
    record_size,
    scan_range,
)
from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS as CL_TX_TOPICS
from txlog_io.compression import compress, decompress, sys_flag_bits
from txlog_io.errors import AnomalyKind, EncodeError, StoreNotFoundError
from txlog_io.msgid import create_uniq_key, decode_offset_msg_id, offset_msg_id, parse_host, parse_uniq_key


def decode_all(path, **kw):
    rows, anomalies = [], []
    for batch, found in decode_range(str(path), **kw):
        rows += batch.to_pylist()
        anomalies += found
    return rows, anomalies


def truth_records(version):
    with gzip.open(FIXTURES / version / "truth" / "commitlog.jsonl.gz") as fh:
        return [json.loads(line) for line in fh]


# ----------------------------------------------------------------------------------------------- real brokers
@pytest.mark.parametrize("version", FIXTURE_VERSIONS)
def test_every_record_equals_rocketmq_own_decode(version):
    store = FIXTURES / version / "store" / "commitlog"
    rows, anomalies = [], []
    for f in sorted(store.iterdir()):
        r, a = decode_all(f, with_body=True)
        rows += r
        anomalies += a
    truth = truth_records(version)
    assert anomalies == []
    assert len(rows) == len(truth)
    for got, t in zip(rows, truth, strict=True):
        expected = truth_record_fields(t)
        actual = {k: got[k] for k in expected}
        assert actual == expected, t["filePos"]
        assert dict(got["properties"]) == t["properties"]
        props = t["properties"]
        assert got["tags"] == props.get("TAGS") and got["keys"] == props.get("KEYS")
        assert got["pgroup"] == props.get("PGROUP") and got["real_topic"] == props.get("REAL_TOPIC")
        assert got["transaction_id"] == props.get("__transactionId__")
        assert got["tran_msg"] == (props["TRAN_MSG"] == "true" if "TRAN_MSG" in props else None)
        for col, key in (("real_qid", "REAL_QID"), ("transaction_check_times", "TRANSACTION_CHECK_TIMES"),
                         ("tran_prepared_queue_offset", "TRAN_PREPARED_QUEUE_OFFSET"),
                         ("check_immunity_time_s", "CHECK_IMMUNITY_TIME_IN_SECONDS")):
            assert got[col] == (int(props[key]) if key in props else None)
        if t["topic"] != "SCHEDULE_TOPIC_XXXX":   # the dispatcher puts the delivery time there instead
            assert got["tags_code"] == t["tagsCode_dispatch"]
        if "bodyDecompressed_b64" in t:
            assert got["compression"] == t["compressionType"]
            assert decompress(got["body"], got["sys_flag"]) == base64.b64decode(t["bodyDecompressed_b64"])


@pytest.mark.parametrize("version", FIXTURE_VERSIONS)
def test_reencoding_real_records_gives_the_same_bytes(version):
    """The encoder twin writes every real record byte for byte (properties kept in their on-disk order)."""
    store = FIXTURES / version / "store" / "commitlog"
    for f in sorted(store.iterdir()):
        data = f.read_bytes()
        rows, _ = decode_all(f, with_body=True)
        for r in rows:
            raw = data[r["file_position"]:r["file_position"] + r["total_size"]]
            msg = Message(topic=r["topic"], body=r["body"], properties_raw=_props_raw(raw, r), queue_id=r["queue_id"],
                          flag=r["flag"], queue_offset=r["queue_offset"], sys_flag=r["sys_flag"],
                          born_timestamp=r["born_timestamp"], born_host=r["born_host"],
                          store_timestamp=r["store_timestamp"], store_host=r["store_host"],
                          reconsume_times=r["reconsume_times"],
                          prepared_transaction_offset=r["prepared_transaction_offset"],
                          magic_version=r["magic_version"])
            assert encode_record(msg, r["stored_physical_offset"]) == raw


def _props_raw(raw: bytes, row: dict) -> bytes:
    fixed = CL.LAYOUTS[CL.layout_index(row["sys_flag"])].itemsize
    p = fixed + row["body_size"] + (2 if row["magic_version"] == 2 else 1) + len(row["topic"].encode())
    plen = struct.unpack_from(">h", raw, p)[0]
    assert p + 2 + plen == len(raw)
    return raw[p + 2:]


def test_real_compressed_bodies_decompress_by_sysflag():
    """ZLIB (0x301), LZ4 (0x101) and ZSTD (0x201) bodies written by a real 4.9.8 producer."""
    kinds = set()
    for t in truth_records("rocketmq-4.9.8"):
        if "bodyDecompressed_b64" in t:
            kinds.add(t["compressionType"])
            assert decompress(base64.b64decode(t["body_b64"]), t["sysFlag"]) == \
                base64.b64decode(t["bodyDecompressed_b64"])
    assert kinds == {"ZLIB", "LZ4", "ZSTD"}


# ----------------------------------------------------------------------------------------------- golden bytes
GOLDEN_IPV4_V1 = bytes.fromhex(
    "0000006F"          # TOTALSIZE        111 = 72 + 8 + 8 + 4 (body) + 1 + 6 (topic) + 2 + 10 (properties)
    "DAA320A7"          # MAGICCODE        V1
    "25D53DFD"          # BODYCRC          crc32(b"ping") & 0x7FFFFFFF = 0x25D53DFD
    "00000002"          # QUEUEID          2
    "00000000"          # FLAG             0
    "0000000000000007"  # QUEUEOFFSET      7
    "0000000000001000"  # PHYSICALOFFSET   4096
    "00000000"          # SYSFLAG          0 (IPv4 hosts, not compressed, TRANSACTION_NOT_TYPE)
    "0000019A7AFD1E00"  # BORNTIMESTAMP    1763000000000
    "0A000001" "0000C350"  # BORNHOST      10.0.0.1:50000
    "0000019A7AFD1E0A"  # STORETIMESTAMP   1763000000010
    "7F000001" "00002A9F"  # STOREHOST     127.0.0.1:10911
    "00000000"          # RECONSUMETIMES   0
    "0000000000000000"  # PREPARED_TRANSACTION_OFFSET 0
    "00000004" "70696E67"  # BODYLENGTH 4, BODY "ping"
    "06" "546F70696341"    # TOPICLENGTH 6, TOPIC "TopicA"
    "000A" "54414753" "01" "54616741" "02"  # PROPERTIESLENGTH 10, "TAGS" 0x01 "TagA" 0x02
)

GOLDEN_IPV6_COMMIT = bytes.fromhex(
    "00000089"          # TOTALSIZE        137 = 72 + 20 + 20 + 0 + 1 + 2 + 2 + 20
    "DAA320A7"          # MAGICCODE        V1
    "00000000"          # BODYCRC          0: empty body
    "00000000" "00000000" "0000000000000003"  # QUEUEID 0, FLAG 0, QUEUEOFFSET 3
    "0000000000000000"  # PHYSICALOFFSET   0
    "00000038"          # SYSFLAG          0x38 = BORNHOST_V6 0x10 | STOREHOST_V6 0x20 | COMMIT 0x8
    "0000000000000001"  # BORNTIMESTAMP    1
    "00000000000000000000000000000001" "00001F90"  # BORNHOST  [::1]:8080 (16-byte IP + int32 port)
    "0000000000000002"  # STORETIMESTAMP   2
    "FD000000000000000000000000000002" "00002A9F"  # STOREHOST [fd00::2]:10911
    "00000001"          # RECONSUMETIMES   1
    "00000000000000AB"  # PREPARED_TRANSACTION_OFFSET 171
    "00000000"          # BODYLENGTH       0
    "02" "5458"         # TOPICLENGTH 2, "TX"
    "0014" "5047524F5550" "01" "5049445F54582D47524F5550" "02"  # 20: "PGROUP" 0x01 "PID_TX-GROUP" 0x02
)

GOLDEN_V2 = bytes.fromhex(
    "00000063"          # TOTALSIZE        99 = 72 + 8 + 8 + 0 + 2 (int16 topic length) + 5 + 2 + 2
    "DAA320AB"          # MAGICCODE        V2 (0xDAA320AB, not ...A8)
    "00000000" "00000000" "00000000" "0000000000000000" "0000000000000000" "00000000"
    "0000000000000000" "7F000001" "00000001"  # BORNTIMESTAMP 0, BORNHOST 127.0.0.1:1
    "0000000000000000" "7F000001" "00000002"  # STORETIMESTAMP 0, STOREHOST 127.0.0.1:2
    "00000000" "0000000000000000" "00000000"  # RECONSUMETIMES, PREPARED_TRANSACTION_OFFSET, BODYLENGTH 0
    "0005" "4C4F4E4721"  # TOPICLENGTH 5 as signed int16, "LONG!"
    "0002" "6B01"        # PROPERTIESLENGTH 2: "k" 0x01 with an empty value: ignored by the reader
)


def _write(tmp_path, name, data, size=None):
    p = tmp_path / name
    p.write_bytes(data + bytes((size or len(data)) - len(data)))
    return p


def test_golden_ipv4_v1_record(tmp_path):
    msg = Message(topic="TopicA", body=b"ping", properties={"TAGS": "TagA"}, queue_id=2, queue_offset=7,
                  born_timestamp=1763000000000, born_host="10.0.0.1:50000", store_timestamp=1763000000010,
                  store_host="127.0.0.1:10911")
    assert zlib.crc32(b"ping") & 0x7FFFFFFF == 0x25D53DFD
    assert encode_record(msg, 4096) == GOLDEN_IPV4_V1
    assert record_size(msg) == 111
    f = _write(tmp_path, "00000000000000004096", GOLDEN_IPV4_V1, 1024)
    (row,), anomalies = decode_all(f, with_body=True)
    assert anomalies == []
    assert row["physical_offset"] == 4096 and row["born_host"] == "10.0.0.1:50000"
    assert row["store_host"] == "127.0.0.1:10911" and row["tags"] == "TagA" and row["body"] == b"ping"
    assert row["msg_id"] == "7F00000100002A9F0000000000001000" == offset_msg_id(bytes([127, 0, 0, 1]), 10911, 4096)
    assert row["tags_code"] == P.java_string_hash("TagA") == 2598919
    assert row["magic_version"] == 1 and row["transaction_type"] == "NOT" and row["compression"] == "NONE"


def test_golden_ipv6_commit_record(tmp_path):
    msg = Message(topic="TX", properties={"PGROUP": "PID_TX-GROUP"}, queue_offset=3, sys_flag=CL.TX_COMMIT,
                  born_timestamp=1, born_host="[::1]:8080", store_timestamp=2, store_host="[fd00::2]:10911",
                  reconsume_times=1, prepared_transaction_offset=171)
    assert encode_record(msg, 0) == GOLDEN_IPV6_COMMIT
    f = _write(tmp_path, "00000000000000000000", GOLDEN_IPV6_COMMIT, 512)
    (row,), anomalies = decode_all(f)
    assert anomalies == []
    assert row["sys_flag"] == 0x38 and row["transaction_type"] == "COMMIT"
    assert row["born_host"] == "[0:0:0:0:0:0:0:1]:8080"          # Java's getHostAddress form
    assert row["store_host"] == "[fd00:0:0:0:0:0:0:2]:10911"
    assert row["msg_id"] == "FD00000000000000000000000000000200002A9F0000000000000000"
    assert decode_offset_msg_id(row["msg_id"]) == ("[fd00:0:0:0:0:0:0:2]:10911", 0)
    assert row["prepared_transaction_offset"] == 171 and row["pgroup"] == "PID_TX-GROUP"
    assert row["body_crc_ok"] is True and row["body_size"] == 0


def test_golden_v2_record(tmp_path):
    msg = Message(topic="LONG!", properties_raw=b"k\x01", born_host="127.0.0.1:1", store_host="127.0.0.1:2",
                  magic_version=2)
    assert encode_record(msg, 0) == GOLDEN_V2
    f = _write(tmp_path, "00000000000000000000", GOLDEN_V2, 256)
    (row,), anomalies = decode_all(f)
    assert anomalies == [] and row["magic_version"] == 2 and row["topic"] == "LONG!"
    assert dict(row["properties"]) == {}


def test_auto_v2_for_topics_longer_than_127_chars():
    long_topic = "%RETRY%" + "g" * 130
    rec = encode_record(Message(topic=long_topic), 0)
    assert struct.unpack_from(">I", rec, 4)[0] == CL.MAGIC_V2
    assert struct.unpack_from(">I", encode_record(Message(topic="t" * 127), 0), 4)[0] == CL.MAGIC_V1
    with pytest.raises(EncodeError):
        encode_record(Message(topic="t" * 128, magic_version=1), 0)


@pytest.mark.parametrize("kind", ["ZLIB", "LZ4", "ZSTD"])
def test_compressed_bodies_by_sysflag_bits(tmp_path, kind):
    plain = b"{'order': 42, 'items': [...]} " * 300
    body = compress(plain, kind)
    msg = Message(topic="TopicLogs", body=body, sys_flag=sys_flag_bits(kind))
    f = _write(tmp_path, "00000000000000000000", encode_record(msg, 0), 65536)
    (row,), _ = decode_all(f, with_body=True)
    assert row["compression"] == kind and row["body"] == body and row["body_crc_ok"]
    assert decompress(row["body"], row["sys_flag"]) == plain
    # legacy flag (bit 0 alone, before 4.9.4) always means zlib
    assert decompress(compress(plain, "ZLIB"), 0x1) == plain


def test_blank_record_ends_a_file_and_the_next_file_continues(tmp_path):
    file_size = 1024
    recs, off = [], 0
    d = tmp_path / "commitlog"
    d.mkdir()
    first = bytearray()
    while True:
        rec = encode_record(Message(topic="T", body=b"x" * 100, queue_offset=len(recs)), off)
        if len(first) + len(rec) + CL.END_FILE_MIN_BLANK_LENGTH > file_size:
            break
        first += rec
        recs.append(off)
        off += len(rec)
    blank = encode_blank(file_size - len(first))
    assert blank == struct.pack(">iI", file_size - len(first), 0xCBD43194)
    (d / "00000000000000000000").write_bytes(bytes(first) + blank + b"\xEE" * (file_size - len(first) - 8))
    second = encode_record(Message(topic="T", body=b"y"), file_size)
    (d / "00000000000000001024").write_bytes(second + bytes(file_size - len(second)))
    rows1, a1 = decode_all(d / "00000000000000000000")
    rows2, a2 = decode_all(d / "00000000000000001024")
    assert [r["physical_offset"] for r in rows1] == recs and a1 == []   # garbage after BLANK is not data
    assert [r["physical_offset"] for r in rows2] == [file_size] and a2 == []
    with pytest.raises(EncodeError):
        encode_blank(7)


def test_properties_reader_follows_java_rules():
    assert P.decode_properties(b"A\x011\x02B\x012") == {"A": "1", "B": "2"}            # no final 0x02 (4.9.x)
    assert P.decode_properties(b"A\x01\x02\x01x\x02B\x012\x02") == {"B": "2"}           # empty key/value dropped
    assert P.decode_properties(b"A\x011\x02A\x012\x02") == {"A": "2"}                   # later duplicate wins
    assert P.decode_properties(b"K\x01v\x01w\x02") == {"K": "v\x01w"}                   # value keeps later 0x01
    assert P.decode_properties(b"") == {} and P.decode_properties(b"\x02\x02") == {}
    assert P.encode_properties({"A": "1", "B": "2"}, trailing_separator=False) == b"A\x011\x02B\x012"
    assert P.java_string_hash("PID_TX_DEMO") == 372692970 and P.java_string_hash("") == 0
    assert P.java_string_hash("数据") == (ord("数") * 31 + ord("据"))


def test_java_string_hash_matches_horner_over_utf16_units():
    """Every length up to past the table, ASCII (the cached-prefix path) and beyond the BMP, prefixes shared
    by many strings and more prefixes than the cache holds."""
    import random

    def horner(s):
        data, h = s.encode("utf-16-be"), 0
        for i in range(0, len(data), 2):
            h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h

    rng = random.Random(7)
    for n in list(range(0, 530)) + [1000]:
        for alphabet in ("aZ09#_~\x7f", "aé漢\U0001F600"):
            s = "".join(rng.choice(alphabet) for _ in range(n))
            assert P.java_string_hash(s) == horner(s), (n, s)
            assert P.java_string_hash(s) == horner(s), (n, s)          # second time: from the cached prefix
    prefix = "RMQ_SYS_TRANS_HALF_TOPIC#7F00000110922B276C156BD0"
    keys = [f"{prefix}{i:08X}" for i in range(300)] + [f"T{i}#{'x' * 40}{i:012d}" for i in range(5000)]
    assert [P.java_string_hash(k) for k in keys] == [horner(k) for k in keys]


def test_vectorised_properties_match_the_scalar_reader(tmp_path):
    cases = [b"A\x011\x02B\x012", b"A\x01\x02\x01x\x02B\x012\x02", b"A\x011\x02A\x012\x02", b"K\x01v\x01w\x02",
             b"", b"\x02\x02", b"\x02A\x01b", "é\x01ü\x02".encode(), b"TAGS\x01T\xc3\xa9g\x02", b"\x01\x01\x01",
             b"AB\x02CD\x02", b"x\x01y"]
    data, off = bytearray(), 0
    for i, raw in enumerate(cases):
        rec = encode_record(Message(topic="T", properties_raw=raw, queue_offset=i), off)
        data += rec
        off += len(rec)
    f = _write(tmp_path, "00000000000000000000", bytes(data), len(data) + 64)
    rows, anomalies = decode_all(f)
    assert anomalies == []
    for row, raw in zip(rows, cases, strict=True):
        assert dict(row["properties"]) == P.decode_properties(raw), raw
        tags = P.decode_properties(raw).get("TAGS")
        assert row["tags_code"] == P.tags_code(tags)


def test_word_at_a_time_properties_split_matches_the_scalar_reader(tmp_path):
    """The split reads eight bytes at a time, copies and compares keys eight bytes at a time and pre-filters
    duplicate keys by (length, first byte): values across word edges, keys of 7/8/9/64+ bytes, keys that
    share length and first byte without being equal, near misses of the wanted keys, a 0x00 byte."""
    long_value = "v" * 70 + "é"
    cases = [
        "".join(f"K{i:02d}\x01{'x' * i}\x02" for i in range(18)).encode(),
        b"ABCDEFG\x011\x02ABCDEFGH\x012\x02ABCDEFGHI\x013\x02ABCDEFG\x014",
        b"AX\x011\x02AY\x012\x02AX\x013\x02AY\x014\x02AZ\x015",
        b"TAGX\x01no\x02UNIQ_KEZ\x01no\x02TAGS\x01yes\x02KEYS\x01a\x00b\x02TAGS\x01later",
        ("L" * 70 + "\x01" + long_value + "\x02TRANSACTION_CHECK_TIMES\x0112").encode(),
        b"PGROUP\x01p1\x02REAL_TOPIC\x01t\x02PGROUP\x01p2\x02REAL_QID\x01-3\x02\x02\x02",
    ]
    data, off = bytearray(), 0
    for i, raw in enumerate(cases):
        # 512..767 bytes: the next record's TOTALSIZE puts a 0x02 two bytes after these properties' end
        msg = Message(topic="T" * (i + 1), body=b"b" * 400, properties_raw=raw, queue_offset=i)
        rec = encode_record(msg, off)
        assert 512 <= len(rec) < 768
        data += rec
        off += len(rec)
    f = _write(tmp_path, "00000000000000000000", bytes(data), len(data) + 64)
    rows, anomalies = decode_all(f)
    assert anomalies == [] and len(rows) == len(cases)

    def entries(raw: bytes) -> list:
        """string2messageProperties' entries in record order, an entry dropped when its key comes again."""
        out = []
        for seg in raw.split(b"\x02"):
            i = seg.find(b"\x01")
            if len(seg) >= 3 and 0 < i < len(seg) - 1:
                out.append((seg[:i].decode(), seg[i + 1:].decode()))
        keys = [k for k, _ in out]
        return [(k, v) for j, (k, v) in enumerate(out) if k not in keys[j + 1:]]

    for i, (row, raw) in enumerate(zip(rows, cases, strict=True)):
        props = P.decode_properties(raw)
        assert dict(row["properties"]) == props, raw
        assert list(row["properties"]) == entries(raw), raw
        assert row["topic"] == "T" * (i + 1)
        assert (row["tags"], row["pgroup"], row["uniq_key"]) == (props.get("TAGS"), props.get("PGROUP"), None)
        assert row["tags_code"] == P.tags_code(props.get("TAGS"))


def test_message_ids():
    key = create_uniq_key(bytes([10, 1, 2, 3]), 4242, 0x5FFD2B27, 1795304574047, 7)
    parsed = parse_uniq_key(key)
    assert len(key) == 32 and parsed.ip_text == "10.1.2.3" and parsed.pid == 4242 and parsed.counter == 7
    real = parse_uniq_key("FD00000000000000000000000000000258345FFD2B276C15E45E0000")   # 4.9.8 fixture, IPv6
    assert real.ip_text == "fd00:0:0:0:0:0:0:2" and real.class_loader_hash == 0x5FFD2B27
    assert parse_host("/[0:0:0:0:0:0:0:1]:41638") == (bytes(15) + b"\x01", 41638)
    assert decode_offset_msg_id("7F0000010000597F0000000000002ABB") == ("127.0.0.1:22911", 10939)


# ----------------------------------------------------------------------------------------------- round trips
hosts = st.one_of(
    st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255),
              st.integers(0, 65535)).map(lambda t: f"{t[0]}.{t[1]}.{t[2]}.{t[3]}:{t[4]}"),
    st.tuples(st.binary(min_size=16, max_size=16), st.integers(0, 65535)).map(
        lambda t: "[" + ":".join(format(int.from_bytes(t[0][i:i + 2], "big"), "x") for i in range(0, 16, 2))
        + f"]:{t[1]}"))
names = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\x01\x02"), min_size=1,
                max_size=12)
i32, i64 = st.integers(-2 ** 31, 2 ** 31 - 1), st.integers(-2 ** 63, 2 ** 63 - 1)
messages = st.builds(
    Message, topic=st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
    body=st.binary(max_size=300), properties=st.dictionaries(names, names, max_size=6), queue_id=i32, flag=i32,
    queue_offset=i64, sys_flag=st.integers(0, 0x7FF).map(lambda f: f & ~0x30), born_timestamp=i64,
    born_host=hosts, store_timestamp=i64, store_host=hosts, reconsume_times=i32,
    prepared_transaction_offset=i64, magic_version=st.sampled_from([None, 1, 2]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(messages, min_size=1, max_size=6))
def test_encode_decode_round_trip(tmp_path, batch):
    data, offsets = bytearray(), []
    for m in batch:
        offsets.append(len(data))
        data += encode_record(m, len(data))
    f = tmp_path / "00000000000000000000"
    f.write_bytes(bytes(data) + bytes(64))
    rows, anomalies = decode_all(f, with_body=True)
    assert anomalies == []
    assert [r["physical_offset"] for r in rows] == offsets
    for m, r in zip(batch, rows, strict=True):
        assert (r["topic"], r["body"], r["queue_id"], r["flag"], r["queue_offset"]) == \
            (m.topic, m.body, m.queue_id, m.flag, m.queue_offset)
        assert (r["born_timestamp"], r["store_timestamp"], r["reconsume_times"],
                r["prepared_transaction_offset"]) == (m.born_timestamp, m.store_timestamp, m.reconsume_times,
                                                      m.prepared_transaction_offset)
        assert parse_host(r["born_host"]) == parse_host(m.born_host)
        assert parse_host(r["store_host"]) == parse_host(m.store_host)
        assert r["sys_flag"] & ~0x30 == m.sys_flag
        assert dict(r["properties"]) == P.decode_properties(P.encode_properties(m.properties))
        assert r["magic_version"] == m.resolved_magic_version() and r["body_crc_ok"]


# ----------------------------------------------------------------------------------------------- damage
def _small_file(tmp_path, n=6, file_size=None):
    """n records followed by zeros; returns (bytes, record offsets, record ends)."""
    data, offsets, ends = bytearray(), [], []
    for i in range(n):
        offsets.append(len(data))
        data += encode_record(Message(topic="TopicD", body=bytes([i]) * (20 + 7 * i),
                                      properties={"UNIQ_KEY": f"K{i}", "TAGS": "t"}, queue_offset=i), len(data))
        ends.append(len(data))
    file_size = file_size or len(data) + 100
    return bytes(data) + bytes(file_size - len(data)), offsets, ends


def test_truncation_at_every_byte_never_raises_and_keeps_intact_records(tmp_path):
    full, offsets, ends = _small_file(tmp_path, n=5)
    f = tmp_path / "00000000000000000000"
    for cut in range(len(full) + 1):
        f.write_bytes(full[:cut])
        rows, anomalies = decode_all(f)
        intact = [o for o, e in zip(offsets, ends, strict=True) if e <= cut]
        assert [r["physical_offset"] for r in rows] == intact, cut
        torn_from = max([e for e in ends if e <= cut], default=0)
        if any(full[torn_from:cut]):
            assert anomalies, cut       # a torn record is reported, never silently dropped
        elif torn_from and cut - torn_from < 8:
            # the broker always leaves >= 8 bytes of BLANK filler or zeros after a record: cut here
            assert [a.kind for a in anomalies] == ["TRUNCATED_FILE"], cut
        else:
            assert anomalies == [], cut  # zeros after the last record are the normal end of data


def test_random_bit_flips_never_raise_and_keep_untouched_records(tmp_path):
    rnd = random.Random(20261122)
    full, offsets, ends = _small_file(tmp_path, n=8)
    sizes = [e - o for o, e in zip(offsets, ends, strict=True)]
    f = tmp_path / "00000000000000000000"
    for _ in range(400):
        data = bytearray(full)
        bit = rnd.randrange(offsets[-1] + sizes[-1]) * 8 + rnd.randrange(8)
        data[bit // 8] ^= 1 << (bit % 8)
        f.write_bytes(bytes(data))
        rows, anomalies = decode_all(f)
        hit = next(i for i, o in enumerate(offsets) if o <= bit // 8 < o + sizes[i])
        got = {r["physical_offset"] for r in rows}
        for i, o in enumerate(offsets):
            if i != hit:
                assert o in got, (bit, i)
        damaged = [r for r in rows if r["physical_offset"] == offsets[hit]]
        if not damaged or not damaged[0]["body_crc_ok"] or damaged[0]["stored_physical_offset"] != offsets[hit]:
            assert anomalies, bit


def test_garbage_in_the_middle_resynchronises(tmp_path):
    full, offsets, _ = _small_file(tmp_path, n=6)
    data = bytearray(full)
    data[offsets[2]:offsets[3]] = b"\xAB" * (offsets[3] - offsets[2])     # record 2 overwritten
    f = tmp_path / "00000000000000000000"
    f.write_bytes(bytes(data))
    rows, anomalies = decode_all(f)
    assert [r["physical_offset"] for r in rows] == offsets[:2] + offsets[3:]
    assert anomalies[0].kind == AnomalyKind.BAD_MAGIC and anomalies[0].position == offsets[2]
    assert "resynchronised at file position %d" % offsets[3] in anomalies[0].detail


def test_a_zeroed_tail_of_the_properties_is_reported_and_the_record_kept(tmp_path):
    """PROPERTIES is a record's last field and never ends in a zero byte (messageProperties2String: 0x02 or a
    value's last byte, 4.9.x without the final 0x02): a record whose tail was zeroed after the write still frames
    and is read, with BAD_PROPERTIES over the whole record (the half of seed 3's m03820 lost REAL_TOPIC)."""
    props = {"UNIQ_KEY": "K1", "PGROUP": "G", "TRAN_MSG": "true", "REAL_TOPIC": "TopicOrders", "REAL_QID": "1"}
    for trailing in (True, False):
        rec = encode_record(Message(topic="RMQ_SYS_TRANS_HALF_TOPIC", body=b"hello", properties=props,
                                    properties_trailing_separator=trailing), 0)
        intact = _write(tmp_path, "00000000000000000000", rec, 4096)
        assert decode_all(intact)[1] == []
        cut = bytearray(rec)
        cut[-20:] = bytes(20)
        f = _write(tmp_path, "00000000000000000000", bytes(cut), 4096)
        (row,), anomalies = decode_all(f)
        assert row["physical_offset"] == 0 and row["real_topic"] != "TopicOrders"
        assert [(a.kind, a.position, a.length) for a in anomalies] == [(AnomalyKind.BAD_PROPERTIES, 0, len(rec))]
        assert "end in 20 zero byte(s)" in anomalies[0].detail
    # no properties at all: the record ends in PROPERTIESLENGTH 0x0000, which is no damage
    bare = _write(tmp_path, "00000000000000000000", encode_record(Message(topic="T", body=b"x"), 0), 4096)
    assert decode_all(bare)[1] == []


def test_crc_mismatch_is_reported_and_the_record_kept(tmp_path):
    rec = encode_record(Message(topic="T", body=b"hello", body_crc=12345), 0)
    f = _write(tmp_path, "00000000000000000000", rec, 256)
    (row,), anomalies = decode_all(f)
    assert row["body_crc_ok"] is False
    assert [(a.kind, a.position, a.expected) for a in anomalies] == [(AnomalyKind.BODY_CRC_MISMATCH, 0, "12345")]


def test_wrong_total_size_that_jumps_over_records_recovers_them(tmp_path):
    full, offsets, _ = _small_file(tmp_path, n=6)
    data = bytearray(full)
    jump = offsets[4] - offsets[1]        # record 1 claims to span records 1..3 exactly
    struct.pack_into(">i", data, offsets[1], jump)
    f = tmp_path / "00000000000000000000"
    f.write_bytes(bytes(data))
    rows, anomalies = decode_all(f)
    assert [r["physical_offset"] for r in rows] == [offsets[0]] + offsets[2:]
    assert [a.kind for a in anomalies] == [AnomalyKind.BAD_TOTAL_SIZE]


def test_nonzero_garbage_after_end_of_data(tmp_path):
    full, offsets, _ = _small_file(tmp_path, n=3, file_size=2048)
    data = bytearray(full)
    data[1500] = 7
    f = tmp_path / "00000000000000000000"
    f.write_bytes(bytes(data))
    rows, anomalies = decode_all(f)
    assert len(rows) == 3
    assert [(a.kind, a.position) for a in anomalies] == [(AnomalyKind.GARBAGE_AFTER_END, 1500)]
    end = rows[-1]["physical_offset"] + rows[-1]["total_size"]      # where the readable data ends
    assert anomalies[0].data_end == end and f"end of data at {end}" in anomalies[0].detail
    cut = tmp_path / "cut" / "00000000000000000000"                  # a file cut inside a record's header
    cut.parent.mkdir()
    cut.write_bytes(full[:offsets[2] + 5])
    (found,) = decode_all(cut)[1]
    assert (found.kind, found.data_end) == (AnomalyKind.TRUNCATED_RECORD, offsets[2])


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(StoreNotFoundError):
        list(decode_range(str(tmp_path / "00000000000000000000")))


# ----------------------------------------------------------------------------------------------- ranges
def _owned(path, start, end, chunk_bytes=1 << 20):
    """File positions of the records a range owns (framing only: ownership is decided by the scanner)."""
    return [int(p) + fr.file_pos for fr in scan_range(str(path), start=start, end=end, chunk_bytes=chunk_bytes)
            for p in fr.positions]


def test_every_split_point_yields_every_record_once(tmp_path):
    full, offsets, _ = _small_file(tmp_path, n=7, file_size=1200)
    f = tmp_path / "00000000000000000000"
    f.write_bytes(full)
    for cut in range(0, len(full) + 1):
        assert _owned(f, 0, cut) + _owned(f, cut, len(full)) == offsets, cut
    for cut in range(0, len(full) + 1, 97):       # and the decoded rows agree with the framing
        first, _ = decode_all(f, start=0, end=cut)
        second, _ = decode_all(f, start=cut, end=len(full))
        assert [r["physical_offset"] for r in first + second] == offsets, cut


def test_random_three_way_splits_on_a_real_file():
    f = FIXTURES / "rocketmq-4.9.8" / "store" / "commitlog" / "00000000000000000000"
    size = f.stat().st_size
    whole = _owned(f, 0, size)
    assert len(whole) == 959
    rnd = random.Random(5)
    for _ in range(10):
        a, b = sorted(rnd.randrange(size) for _ in range(2))
        parts = []
        for s, e in ((0, a), (a, b), (b, size)):
            parts += _owned(f, s, e, chunk_bytes=rnd.choice([4096, 65536, 1 << 20]))
        assert parts == whole, (a, b)
    rows, _ = decode_all(f, start=size // 3, end=2 * size // 3, chunk_bytes=65536)
    owned = _owned(f, size // 3, 2 * size // 3)
    assert [r["physical_offset"] for r in rows] == owned and set(owned) <= set(whole)


def test_topic_filter_and_decode_at():
    f = FIXTURES / "rocketmq-5.3.3" / "store" / "commitlog" / "00000000000000000000"
    every, _ = decode_all(f)
    half, _ = decode_all(f, topics=["RMQ_SYS_TRANS_HALF_TOPIC"])
    assert [r["physical_offset"] for r in half] == \
        [r["physical_offset"] for r in every if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"]
    wanted = [r["physical_offset"] for r in every[::37]]
    batch, anomalies = decode_at(str(f), wanted + [123])
    assert batch.column("physical_offset").to_pylist() == wanted
    assert [(a.kind, a.position) for a in anomalies] == [(AnomalyKind.CQ_ENTRY_MISMATCH, 123)]


@pytest.mark.parametrize("fixture", ["rocketmq-4.9.8", "rocketmq-5.3.3", "rocketmq-3.1.4"])
def test_filtered_decode_batches_across_chunks_give_the_unfiltered_rows(fixture, tmp_path, monkeypatch):
    """A filtered decode (``tx_relevant`` / ``topics``) gathers the selected records of many chunks into one
    batch: same rows (every column, bodies included) and same findings as the unfiltered decode, whatever the
    chunk size and the flush threshold; damage in the middle of the file is reported once."""
    from txlog_io import commitlog_decode as D

    src = FIXTURES / fixture / "store" / "commitlog" / "00000000000000000000"
    f = tmp_path / src.name
    data = bytearray(src.read_bytes())
    every, _ = decode_all(src, with_body=True)
    hit = every[len(every) // 2]["file_position"] + 8          # break one record's BODYCRC in the middle
    data[hit] ^= 0xFF
    f.write_bytes(bytes(data))
    every, every_found = decode_all(f, with_body=True, chunk_bytes=4096)

    def relevant(r):
        return r["transaction_type"] != "NOT" or r["magic_version"] == 2 or r["topic"] in CL_TX_TOPICS

    for flush in (1, 3, 1 << 20):
        monkeypatch.setattr(D, "SELECTED_FLUSH_ROWS", flush)
        batches = list(decode_range(str(f), with_body=True, tx_relevant=True, chunk_bytes=4096))
        rows = [r for b, _ in batches for r in b.to_pylist()]
        found = [x for _, got in batches for x in got]
        assert rows == [r for r in every if relevant(r)]
        assert [(a.kind, a.position) for a in found] == [(a.kind, a.position) for a in every_found]
        assert any(a.kind == AnomalyKind.BODY_CRC_MISMATCH for a in found)
        assert 1 <= sum(1 for b, _ in batches if b.num_rows) <= len(rows)
    half, _ = decode_all(f, topics=["RMQ_SYS_TRANS_HALF_TOPIC"], with_body=True, chunk_bytes=8192)
    assert half == [r for r in every if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"]
    rare = every[len(every) // 3]["topic"]         # a topic few chunks hold: gathered across chunks
    assert decode_all(f, topics=[rare], with_body=True, chunk_bytes=65536)[0] == \
        [r for r in every if r["topic"] == rare]


@pytest.mark.parametrize("fixture", ["rocketmq-4.9.8", "rocketmq-5.3.3", "rocketmq-3.1.4"])
def test_decode_at_window_and_single_reads_agree(fixture, monkeypatch):
    """Dense positions are served by one window read, sparse ones record by record: same rows, same findings;
    ``tx_only`` positions yield only records whose transaction type is not NOT (probed, never decoded)."""
    from txlog_io import commitlog_decode as D

    f = FIXTURES / fixture / "store" / "commitlog" / "00000000000000000000"
    every, _ = decode_all(f, with_body=True)
    size = f.stat().st_size
    wanted = [r["physical_offset"] for r in every]
    junk = [every[3]["physical_offset"] + 5, size - 10, size, size + 4096]   # mid-record, tail, past EOF
    tx_only = wanted[::2]
    results = []
    for gap in (D.FETCH_DENSE_GAP, 0):          # 0: every position read on its own
        monkeypatch.setattr(D, "FETCH_DENSE_GAP", gap)
        batch, anomalies = decode_at(str(f), wanted + junk, with_body=True, tx_only=tx_only)
        results.append((batch.to_pylist(), [(a.kind, a.position, a.actual) for a in anomalies]))
    assert results[0] == results[1]
    rows, found = results[0]
    probed = set(tx_only)
    expected = [r for r in every if r["physical_offset"] not in probed or r["transaction_type"] != "NOT"]
    assert rows == expected and len(rows) < len(every)
    assert [(k, p) for k, p, _ in found] == [(AnomalyKind.CQ_ENTRY_MISMATCH, p) for p in sorted(junk)]
    assert found[-1][2] == "end of file"


def test_decoder_never_writes_its_input(tmp_path):
    src = FIXTURES / "rocketmq-3.1.4" / "store" / "commitlog" / "00000000000000000000"
    copy = tmp_path / src.name
    shutil.copy(src, copy)
    os.chmod(copy, 0o444)
    before = copy.read_bytes()
    rows, _ = decode_all(copy, with_body=True)
    assert len(rows) == 191 and copy.read_bytes() == before


def test_property_crc_5_2(tmp_path):
    """enabledAppendPropCRC: the last 20 property bytes are "__CRC32#" 0x01 + digits LSB-first + 0x02."""
    from txlog_io.commitlog import parse_prop_crc, prop_crc_entry

    assert prop_crc_entry(123) == b"__CRC32#\x013210000000\x02" and parse_prop_crc("3210000000") == 123
    good = encode_record(Message(topic="T", body=b"abc", properties={"A": "1"}, append_prop_crc=True,
                                 properties_trailing_separator=False), 0)
    assert good[-20:-11] == b"__CRC32#\x01" and good[-21:-20] == b"\x02"   # separator added before the entry
    crc = zlib.crc32(good[:-20]) & 0x7FFFFFFF
    assert parse_prop_crc(good[-11:-1].decode()) == crc
    bad = bytearray(encode_record(Message(topic="T", body=b"abd", properties={"A": "1"}, append_prop_crc=True),
                                  len(good)))
    bad[-11:-1] = good[-11:-1]                  # a stale CRC: covers other bytes
    f = _write(tmp_path, "00000000000000000000", good + bytes(bad), 512)
    rows, anomalies = decode_all(f)
    assert len(rows) == 2 and dict(rows[0]["properties"])["__CRC32#"] == good[-11:-1].decode()
    assert [(a.kind, a.position) for a in anomalies] == [(AnomalyKind.PROPERTY_CRC_MISMATCH, len(good))]


def _record_crc_oracle(record: bytes, body: bytes) -> tuple:
    """(body CRC ok, ``__CRC32#`` status 0/1/2, CRC before the 20 reserved bytes or 0) of one record, by
    ``zlib.crc32`` over its bytes: BODYCRC at offset 8; the entry "__CRC32#" 0x01, ten digits
    least-significant first, 0x02 as the last 20 bytes (MessageDecoder.createCrc32)."""
    body_ok = struct.unpack_from(">i", record, 8)[0] == zlib.crc32(body) & 0x7FFFFFFF
    if record[-20:-11] != b"__CRC32#\x01" or record[-1:] != b"\x02":
        return body_ok, 0, 0
    crc = zlib.crc32(record[:-20]) & 0x7FFFFFFF
    return body_ok, 1 if int(record[-11:-1][::-1]) == crc else 2, crc


def test_every_record_check_in_one_chunk(tmp_path):
    """One chunk holding each kind of record-level finding (crc_kernels.record_checks gates the per-kind
    passes): every one reported, in record order per kind, the damaged records still rows; the fused pass's
    per-record results equal a zlib.crc32 computed per record over its bytes."""
    import numpy as np

    from txlog_io import commitlog_kernels as K
    from txlog_io import crc_kernels as C

    def rec(at, **kw):
        props = kw.pop("properties", {"A": "1"})
        return bytearray(encode_record(Message(topic="T", body=b"hello", properties=props, **kw), at))

    data = bytearray()
    data += rec(0)                                         # clean
    data += rec(len(data), body_crc=12345)                 # BODY_CRC_MISMATCH
    data += rec(len(data) + 8)                             # PHYSICAL_OFFSET_MISMATCH (stored 8 too far)
    good = rec(len(data), append_prop_crc=True)
    good[-11:-1] = b"0000000000"                           # a __CRC32# that does not match
    prop_at = len(data)
    data += good
    tail_at = len(data)
    cut = rec(len(data), properties={"REAL_TOPIC": "TopicOrders"})
    cut[-5:] = bytes(5)                                    # BAD_PROPERTIES: properties end in zero bytes
    data += cut
    data += rec(len(data), body_crc=1)                     # a second BODY_CRC_MISMATCH, after the others
    f = _write(tmp_path, "00000000000000000000", bytes(data), 4096)
    rows, anomalies = decode_all(f)
    assert len(rows) == 6
    assert [r["body_crc_ok"] for r in rows] == [True, False, True, True, True, False]
    starts = [r["file_position"] for r in rows]
    assert [(a.kind, a.position) for a in anomalies] == [
        (AnomalyKind.PHYSICAL_OFFSET_MISMATCH, starts[2]), (AnomalyKind.BODY_CRC_MISMATCH, starts[1]),
        (AnomalyKind.BODY_CRC_MISMATCH, starts[5]), (AnomalyKind.PROPERTY_CRC_MISMATCH, prop_at),
        (AnomalyKind.BAD_PROPERTIES, tail_at)]
    u8 = np.frombuffer(bytes(data) + bytes(256), np.uint8)
    pos = np.asarray(starts, np.int64)
    fm = K.fields(u8, pos)
    crc_ok, status, actual = np.empty(6, np.bool_), np.empty(6, np.int8), np.empty(6, np.int64)
    found = C.record_checks(u8, pos, fm, pos, 0, True, C.CRC_MARKER, crc_ok, status, actual)
    assert found == C.FOUND_PHYS | C.FOUND_BODY_CRC | C.FOUND_PROP_CRC | C.FOUND_ZERO_TAIL
    want = [_record_crc_oracle(bytes(data[s:s + struct.unpack_from(">i", data, s)[0]]), b"hello") for s in starts]
    assert crc_ok.tolist() == [w[0] for w in want] == [True, False, True, True, True, False]
    assert status.tolist() == [w[1] for w in want] == [0, 0, 0, 2, 0, 0]
    assert actual.tolist() == [w[2] for w in want] and actual[3] != 0
    assert _record_crc_oracle(bytes(rec(0, append_prop_crc=True)), b"hello")[1] == 1   # the oracle reads digits
    assert C.record_checks(u8, pos[:1], fm[:, :1], pos[:1], 0, True, C.CRC_MARKER, crc_ok, status, actual) == 0
