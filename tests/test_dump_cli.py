"""txlog-dump: the JSON-lines contract, summaries, --verify exit codes, --bodies."""
from __future__ import annotations

import base64
import io
import json
import shutil
import struct
import subprocess
import sys

import pytest
from conftest import FIXTURES, ROOT

from txlog_io import cli

COMMITLOG_CONTRACT = ["file", "file_position", "physical_offset", "total_size", "magic_version", "body_crc",
                      "body_crc_ok", "queue_id", "flag", "queue_offset", "sys_flag", "transaction_type",
                      "born_timestamp", "born_host", "store_timestamp", "store_host", "reconsume_times",
                      "prepared_transaction_offset", "body_size", "topic", "properties", "msg_id", "uniq_key",
                      "tags", "keys"]


def run(argv, monkeypatch):
    out, err = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    code = cli.main(argv)
    return code, [json.loads(line) for line in out.getvalue().splitlines()], \
        [json.loads(line) for line in err.getvalue().splitlines() if line.startswith("{")], err.getvalue()


def test_commitlog_dump_fields_and_summary(monkeypatch):
    code, rows, summaries, _ = run(["commitlog", str(FIXTURES / "rocketmq-4.9.8" / "store")], monkeypatch)
    assert code == 0 and len(rows) == 999
    assert list(rows[0]) == COMMITLOG_CONTRACT
    assert rows[0]["born_host"] == "127.0.0.1:51572" and rows[0]["transaction_type"] == "NOT"
    first, second = [s["summary"] for s in summaries]
    assert first["records"] == 959 and first["valid_bytes"] == 1048091    # BLANK filler at 1048091
    assert first["stop_reason"].startswith("BLANK")
    assert second["records"] == 40 and second["valid_bytes"] == 48028 and second["trailing_from"] == 48028


def test_bodies_include_uncompressed(monkeypatch):
    code, rows, _, _ = run(["commitlog", "--bodies", str(FIXTURES / "rocketmq-5.3.3" / "store" / "commitlog")],
                           monkeypatch)
    compressed = [r for r in rows if r["sys_flag"] & 1]
    assert len(compressed) == 6 and all("body_uncompressed" in r for r in compressed)
    assert all("body_uncompressed" not in r for r in rows if not r["sys_flag"] & 1)
    assert all(len(base64.b64decode(r["body_uncompressed"])) > 10000 for r in compressed)


@pytest.mark.parametrize("kind, path, count, fields", [
    ("consumequeue", "rocketmq-5.3.3/store/consumequeue/RMQ_SYS_TRANS_HALF_TOPIC", 198,
     ["file", "topic", "queue_id", "queue_offset", "commitlog_offset", "size", "tags_code"]),
    ("statetable", "rocketmq-3.1.4/store", 42,
     ["file", "index", "commitlog_offset", "size", "store_timestamp_s", "producer_group_hash", "state"]),
    ("redolog", "rocketmq-3.1.4/store", 77, ["file", "index", "commitlog_offset", "size", "tags_code", "kind"]),
])
def test_unit_dumps(monkeypatch, kind, path, count, fields):
    code, rows, _, _ = run([kind, str(FIXTURES / path)], monkeypatch)
    assert code == 0 and len(rows) == count and list(rows[0]) == fields


@pytest.mark.parametrize("version", ["rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3"])
def test_verify_is_clean_on_real_stores(monkeypatch, version):
    code, findings, _, _ = run(["store", "--verify", str(FIXTURES / version / "store")], monkeypatch)
    assert (code, findings) == (0, [])


def test_verify_reports_damage_with_position_and_exits_1(monkeypatch, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(FIXTURES / "rocketmq-5.3.3" / "store", store)
    cl = store / "commitlog" / "00000000000000000000"
    data = bytearray(cl.read_bytes())
    second = struct.unpack_from(">i", data, 0)[0]
    data[second + 4] ^= 0xFF                             # break the magic of the second record
    cl.write_bytes(bytes(data))
    code, findings, _, _ = run(["commitlog", "--verify", str(store)], monkeypatch)
    assert code == 1
    assert findings[0]["kind"] == "BAD_MAGIC" and findings[0]["position"] == second
    assert findings[0]["file"].endswith("00000000000000000000")


def test_usage_errors_are_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "txlog_io", "commitlog", str(tmp_path / "missing")],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr
