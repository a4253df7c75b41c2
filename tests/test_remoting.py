"""txlog_io.remoting (Spark-free): the RemotingCommand frame and ACL 1.0 signing against frames RocketMQ's own
classes encoded (tests/data/remoting_golden.json, written by tests/realbroker/GoldenFrames.java with the 4.9.8
and 5.3.3 jars; tests/test_recover_realbroker.py re-runs it against the jars and compares), plus a hypothesis
round trip and the decoder's refusals."""
from __future__ import annotations

import json
import struct

import pytest
from conftest import DATA
from hypothesis import given, settings
from hypothesis import strategies as st

from txlog_io import remoting as R

GOLDEN = json.loads((DATA / "remoting_golden.json").read_text())
CASES = [(v, g["name"], bytes.fromhex(g["hex"])) for v, gs in GOLDEN.items() for g in gs]
IDS = [f"{v}-{n}" for v, n, _ in CASES]
SECRETS = {"acl_end_transaction": "rbSecret-123", "acl_with_body": "sk"}


@pytest.mark.parametrize("version,name,frame", CASES, ids=IDS)
def test_golden_frames_decode(version, name, frame):
    cmd = R.decode_command(frame)
    want = {"resume_one_field": (323, 7, 0, {"msgId": "7F0000010000ABCD00000000000012A0"}, b""),
            "oneway_one_field": (37, 8, 2, {"msgId": "X"}, b""),
            "with_body": (105, 9, 0, {"topic": "TopicRbTx"}, b'{"a":1}'),
            "response_remark": (1, 10, 1, None, b""),
            "acl_end_transaction": (37, 11, 0, None, b""),
            "acl_with_body": (12, 12, 0, None, b"\x01\x02\x03\xff")}[name]
    assert (cmd.code, cmd.opaque, cmd.flag) == want[:3]
    if want[3] is not None:
        assert cmd.ext_fields == want[3]
    assert cmd.body == want[4]
    assert cmd.language == "JAVA" and cmd.version == 0
    assert cmd.is_response == (name == "response_remark")
    assert cmd.is_oneway == (name == "oneway_one_field")
    if name == "response_remark":
        assert cmd.remark == "Find prepared transaction message failed" and cmd.ext_fields is None


@pytest.mark.parametrize("version,name,frame", CASES, ids=IDS)
def test_golden_frames_encode(version, name, frame):
    """The encoder writes RocketMQ's bytes exactly (the JSON's ext fields in the decoded order: Java writes its
    HashMap's order, which the receiver does not depend on)."""
    cmd = R.decode_command(frame)
    assert R.encode_command(cmd) == frame


@pytest.mark.parametrize("version,name,frame", [c for c in CASES if c[1].startswith("acl_")],
                         ids=[i for i, c in zip(IDS, CASES, strict=True) if c[1].startswith("acl_")])
def test_acl_signature_equals_aclclientrpchook(version, name, frame):
    cmd = R.decode_command(frame)
    java_sig = cmd.ext_fields[R.SIGNATURE]
    plain = {k: v for k, v in cmd.ext_fields.items() if k not in (R.SIGNATURE, R.ACCESS_KEY)}
    again = R.sign(R.Command(cmd.code, dict(plain), body=cmd.body),
                   R.Credentials(cmd.ext_fields[R.ACCESS_KEY], SECRETS[name]))
    assert again.ext_fields[R.SIGNATURE] == java_sig
    assert again.ext_fields[R.ACCESS_KEY] == cmd.ext_fields[R.ACCESS_KEY]
    wrong = R.sign(R.Command(cmd.code, dict(plain), body=cmd.body),
                   R.Credentials(cmd.ext_fields[R.ACCESS_KEY], SECRETS[name] + "x"))
    assert wrong.ext_fields[R.SIGNATURE] != java_sig


def test_signature_content_order_and_body():
    ext = {"b": "2", "a": "1", "Signature": "old", "AccessKey": "K"}
    # TreeMap order: upper case before lower case (UTF-16 code units); Signature left out; body appended
    assert R.signature_content(ext, b"\x00B") == b"K12\x00B"
    assert R.signature_content({"\uffff": "x", "\U0001F600": "y"}, None) == "yx".encode()


def test_credentials_repr_hides_the_secret():
    c = R.Credentials("ak", "very-secret", "tok")
    assert "very-secret" not in repr(c) and "tok" not in repr(c) and "ak" in repr(c)


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)


@settings(max_examples=200, deadline=None)
@given(code=st.integers(-2**31, 2**31 - 1), opaque=st.integers(-2**31, 2**31 - 1), flag=st.integers(0, 3),
       version=st.integers(0, 1000), remark=st.none() | _text,
       ext=st.none() | st.dictionaries(_text, _text, max_size=6), body=st.binary(max_size=64),
       language=st.sampled_from(["JAVA", "PYTHON", "GO"]))
def test_round_trip(code, opaque, flag, version, remark, ext, body, language):
    cmd = R.Command(code, ext, opaque, flag, language, version, remark, body)
    frame = R.encode_command(cmd)
    back = R.decode_command(frame)
    assert (back.code, back.ext_fields, back.opaque, back.flag, back.language, back.version, back.remark,
            back.body) == (code, ext, opaque, flag, language, version, remark, body)
    assert R.encode_command(back) == frame


@pytest.mark.parametrize("frame,reason", [
    (b"\x00\x00", "length field"),
    (struct.pack(">i", 3) + b"abc", "outside"),
    (struct.pack(">ii", 8, 2) + b"{}", "follow"),
    (struct.pack(">ii", 6, 9) + b"{}", "exceeds"),
    (struct.pack(">ii", 6, (1 << 24) | 2) + b"{}", "serialize type 1"),
    (struct.pack(">ii", 7, 3) + b"{x}", "does not parse"),
    (struct.pack(">ii", 6, 2) + b"[]", "integer 'code'"),
    (struct.pack(">ii", 24, 20) + b'{"code":1,"extFields":3}'[:20], "does not parse"),
])
def test_decoder_refuses_with_a_reason(frame, reason):
    with pytest.raises(R.RemotingFormatError, match=reason):
        R.decode_command(frame)


def test_fastjson_numeric_keys():
    assert R.loads_fastjson('{"brokerAddrs":{0:"127.0.0.1:10911",1:"x"}}') == \
        {"brokerAddrs": {"0": "127.0.0.1:10911", "1": "x"}}
