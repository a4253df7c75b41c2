"""recover's Spark-free parts: the decisions file, the credentials, the stored-message walker of QUERY_MESSAGE
bodies (against txlog_io.commitlog.encode_record), and the blocking client against a loopback server that
speaks the frame."""
from __future__ import annotations

import socket
import threading

import pytest

from jobs.recover import plan as P
from jobs.recover.run import load_credentials
from jobs.recover.wire import Remote, Unreachable
from txlog_io import remoting as R
from txlog_io.commitlog import Message, encode_record
from txlog_io.errors import UsageError
from txlog_io.stored_messages import StoredMessageError, split_stored_messages


def test_decisions_file(tmp_path):
    f = tmp_path / "d.txt"
    f.write_text("# key decision\nAAA COMMIT\n\nBBB,rollback\nCCC=Commit\n")
    assert P.read_decisions(str(f)) == {"AAA": "COMMIT", "BBB": "ROLLBACK", "CCC": "COMMIT"}
    f.write_text("AAA COMMIT\nAAA ROLLBACK\n")
    with pytest.raises(UsageError, match="line 2: AAA given both"):
        P.read_decisions(str(f))
    f.write_text("AAA MAYBE\n")
    with pytest.raises(UsageError, match="line 1: expected"):
        P.read_decisions(str(f))


def test_credentials_env_and_file(tmp_path, monkeypatch):
    for k in ("TXAUDIT_ACL_ACCESS_KEY", "TXAUDIT_ACL_SECRET_KEY", "TXAUDIT_ACL_SECURITY_TOKEN"):
        monkeypatch.delenv(k, raising=False)
    assert load_credentials(None) is None
    monkeypatch.setenv("TXAUDIT_ACL_ACCESS_KEY", "ak")
    with pytest.raises(UsageError, match="set both"):
        load_credentials(None)
    monkeypatch.setenv("TXAUDIT_ACL_SECRET_KEY", "s3cret")
    c = load_credentials(None)
    assert (c.access_key, c.secret_key) == ("ak", "s3cret") and "s3cret" not in repr(c)
    f = tmp_path / "acl"
    f.write_text("# creds\naccessKey = fk\nsecretKey=fs\n")
    c = load_credentials(str(f))
    assert (c.access_key, c.secret_key) == ("fk", "fs")
    f.write_text("accessKey=fk\n")
    with pytest.raises(UsageError, match="needs accessKey= and secretKey="):
        load_credentials(str(f))


def test_stored_messages_walk_encoded_records():
    msgs = [Message("RMQ_SYS_TRANS_HALF_TOPIC", b"body", {"UNIQ_KEY": "U1", "PGROUP": "g"}, queue_offset=3,
                    store_timestamp=111),
            Message("T" * 200, b"", {"UNIQ_KEY": "U2"}, queue_offset=4, store_host="[::1]:10911",
                    born_host="[::1]:1"),
            Message("TopicRbTx", b"x" * 300, {}, queue_offset=5, store_timestamp=333)]
    buf, offs, pos = b"", [], 1000
    for m in msgs:
        rec = encode_record(m, pos)
        buf += rec
        offs.append(pos)
        pos += len(rec)
    got = split_stored_messages(buf)
    assert [(g.physical_offset, g.queue_offset, g.topic, g.properties.get("UNIQ_KEY")) for g in got] == \
        [(o, m.queue_offset, m.topic, m.properties.get("UNIQ_KEY")) for o, m in zip(offs, msgs, strict=True)]
    assert got[0].store_timestamp == 111
    for cut in (len(buf) - 1, 10):
        with pytest.raises(StoredMessageError):
            split_stored_messages(buf[:cut])
    with pytest.raises(StoredMessageError, match="magic"):
        split_stored_messages(bytes(100))


def _server(handler):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def loop():
        conn, _ = srv.accept()
        with conn:
            handler(conn)
        srv.close()
    threading.Thread(target=loop, daemon=True).start()
    return f"127.0.0.1:{srv.getsockname()[1]}"


def _read_frame(conn) -> R.Command:
    head = conn.recv(4, socket.MSG_WAITALL)
    n = R.frame_length(head)
    return R.decode_payload(conn.recv(n, socket.MSG_WAITALL))


def test_client_matches_the_response_by_opaque_and_signs():
    seen = {}

    def handler(conn):
        req = _read_frame(conn)
        seen["req"] = req
        # an unrelated response first (another opaque), then the answer
        conn.sendall(R.encode_command(R.Command(0, opaque=req.opaque + 1000, flag=1)))
        conn.sendall(R.encode_command(R.Command(0, {"k": "v"}, opaque=req.opaque, flag=1, remark="fine",
                                                body=b"\x00\x01")))
    addr = _server(handler)
    creds = R.Credentials("ak", "sk")
    resp = Remote(5, creds).call(addr, 12, {"topic": "T", "maxNum": 3})
    assert (resp.code, resp.remark, resp.body, resp.ext_fields) == (0, "fine", b"\x00\x01", {"k": "v"})
    req = seen["req"]
    assert req.code == 12 and req.ext_fields["maxNum"] == "3" and req.ext_fields["AccessKey"] == "ak"
    plain = {k: v for k, v in req.ext_fields.items() if k != "Signature"}
    assert req.ext_fields["Signature"] == R.calc_signature(R.signature_content(plain, b""), "sk")


def test_client_errors_are_one_line():
    addr = _server(_read_frame)                  # reads the request, closes without answering
    with pytest.raises(Unreachable, match="closed the connection"):
        Remote(5).call(addr, 12, {})
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    with pytest.raises(Unreachable, match=f"cannot connect to 127.0.0.1:{port}"):
        Remote(2).call(f"127.0.0.1:{port}", 12, {})
    addr = _server(lambda conn: (_read_frame(conn), threading.Event().wait(3)))
    with pytest.raises(Unreachable, match="did not answer within 0.5 s"):
        Remote(0.5).call(addr, 12, {})
