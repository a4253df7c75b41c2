"""The ``length`` of a finding: every finding about a byte range says how many bytes it covers (null where it
is not about a range), from the decoders to ``audit_anomalies``; an ``audit_anomalies`` table an older
version wrote without the column takes the new run's rows, and ``check`` / ``report`` read it."""
from __future__ import annotations

import datetime as dt
import gzip
import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from txlog_io import consumequeue as cq
from txlog_io.commitlog_decode import decode_file
from txlog_io.config import read_consumer_offsets
from txlog_io.mappedfile import list_mapped_files, offset_to_file_name
from txlog_io.unitchain import check_unit_chain

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
V533 = FIXTURES / "rocketmq-5.3.3"


def _records():
    with gzip.open(V533 / "truth" / "commitlog.jsonl.gz") as f:
        return [json.loads(line) for line in f]


def _garbled_store(tmp: Path):
    """The 5.3.3 store with one ordinary record's header overwritten: (store root, that record)."""
    victim = [r for r in _records() if not r["topic"].startswith("RMQ_SYS")][10]
    root = tmp / "store"
    shutil.copytree(V533 / "store", root)
    path = root / "commitlog" / victim["file"]
    data = bytearray(path.read_bytes())
    data[victim["filePos"]:victim["filePos"] + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    return root, victim


def _commitlog_findings(path):
    return [a for _, found in decode_file(str(path)) for a in found]


def test_commitlog_damage_and_record_findings_carry_their_length(tmp_path):
    root, victim = _garbled_store(tmp_path)
    (a,) = _commitlog_findings(root / "commitlog" / victim["file"])
    assert (a.kind, a.position, a.length) == ("BAD_MAGIC", victim["filePos"], victim["storeSize"])
    assert f"({victim['storeSize']} bytes skipped)" in a.detail
    # a body bit flip: the finding covers the whole record
    path = root / "commitlog" / victim["file"]
    shutil.copyfile(V533 / "store" / "commitlog" / victim["file"], path)
    data = bytearray(path.read_bytes())
    data[victim["filePos"] + 120] ^= 0x10                 # inside the body (it starts at byte 88)
    path.write_bytes(bytes(data))
    (a,) = _commitlog_findings(path)
    assert (a.kind, a.position, a.length) == ("BODY_CRC_MISMATCH", victim["filePos"], victim["storeSize"])


def test_unit_findings_carry_their_length(tmp_path):
    unit = cq.CQ_UNIT_SIZE
    path = tmp_path / offset_to_file_name(0)
    data = b"".join(cq.encode_cq_unit(1000 * i, 200, 7) for i in range(1, 4))
    bad = cq.encode_cq_unit(5000, -1, 7, allow_invalid=True)
    path.write_bytes(data + bad + b"\x01" * 7)             # a bad unit, then 7 bytes of a torn one
    found = [a for _, f in cq.decode_consumequeue(path, topic="T", queue_id=0) for a in f]
    assert [(a.kind, a.position, a.length) for a in found] == [
        ("BAD_CQ_ENTRY", 3 * unit, unit), ("TRUNCATED_RECORD", 4 * unit, 7)]
    # a file copied under the next name: the finding covers the copy's units
    path.write_bytes(data + bytes(unit * 2))
    copy = tmp_path / offset_to_file_name(5 * unit)
    shutil.copyfile(path, copy)
    (a,) = check_unit_chain(list_mapped_files(tmp_path, source="consumequeue")[0], "consumequeue")
    assert (a.kind, a.file, a.position, a.length) == ("UNIT_FILE_OUT_OF_ORDER", str(copy), 0, 3 * unit)


def test_findings_that_are_not_ranges_have_no_length(tmp_path):
    path = tmp_path / "consumerOffset.json"
    path.write_text("{not json")
    _, found = read_consumer_offsets(str(path))
    assert found and all(a.length is None for a in found)


@pytest.mark.spark
def test_length_reaches_audit_anomalies_of_a_table_written_without_it(spark, tmp_path):
    from deltalake import DeltaTable

    from jobs.audit.run import run_audit
    from jobs.check.checks import load_checks
    from jobs.check.evaluate import run_check
    from jobs.delta.sink import write_table
    from jobs.main import parse_args
    from jobs.report.write import write_report
    from schemas.audit import AUDIT_ANOMALIES
    from schemas.core import Table

    root, victim = _garbled_store(tmp_path)
    out = tmp_path / "out"
    old = Table.of(AUDIT_ANOMALIES.name, [c for c in AUDIT_ANOMALIES.columns if c.name != "length"],
                   AUDIT_ANOMALIES.comment)
    old_row = {"broker": "b", "code": "RESYNC", "source": "commitlog", "physical_offset": 1, "topic": None,
               "queue_id": None, "queue_offset": None, "transaction_key": None, "file": "f", "position": 1,
               "detail": "written by an older version"}
    write_table(pa.Table.from_pylist([old_row], schema=old.arrow_schema()), out, old, "older-version",
                run_date=dt.date(2026, 11, 1))
    _, opts = parse_args(["audit", "--store", str(root), "--broker", "b", "--out", str(out), "--mode", "full",
                          "--as-of", "2026-11-21T12:00:00Z"])
    summary = run_audit(spark, opts, print_summary=False)
    rows = DeltaTable(str(out / AUDIT_ANOMALIES.name)).to_pyarrow_table().to_pylist()
    assert [r["length"] for r in rows if r["run_id"] == "older-version"] == [None]
    mine = [r for r in rows if r["run_id"] == summary.run_id]
    bad = [r for r in mine if r["code"] == "BAD_MAGIC"]
    assert [(Path(r["file"]).name, r["position"], r["length"]) for r in bad] == \
        [(victim["file"], victim["filePos"], victim["storeSize"])]
    # a reconstruction finding has a length only when it names a damaged range: the record lost to BAD_MAGIC
    uncertain = [r for r in mine if r["code"] == "STATE_UNCERTAIN_DAMAGED_RANGE"]
    assert uncertain and all(r["physical_offset"] <= bad[0]["physical_offset"] < r["physical_offset"] + r["length"]
                             for r in uncertain)
    assert all(r["length"] is None for r in mine if r["source"] == "reconstruct" and r not in uncertain)
    report = run_check(load_checks(str(Path(__file__).resolve().parent.parent / "conf" / "checks-default.yaml")),
                       str(out))
    assert report.run.run_id == summary.run_id
    assert Path(write_report(str(out), summary.run_id)).is_file()
