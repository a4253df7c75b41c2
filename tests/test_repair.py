"""The recovery job: refbroker.repair writes, jobs.repair.run / `repair` subcommand, re-audits.

Spark-free tests compare what the repair writes with the real brokers' own bytes (fixture op records and
consume-queue units).  The module fixture ``repaired`` audits the repair situations (reference-broker stores
and damaged copies of the 5.3.3 fixture) in ONE run_audit, repairs each store through ``jobs.main.main``
(in-process), and re-audits every repaired copy in one more run_audit.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, ROOT

AS_OF = "2026-11-21T12:00:00Z"
RUN_ID = "20261121T120000Z"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: flags a repair may remove from a transaction (and nothing else may change)
REPAIRABLE = {"COMMIT_WITHOUT_OP", "RESOLVED_COPY_PENDING_CHECK", "CQ_MISMATCH",
              "STATETABLE_MISSING_PREPARED", "STATETABLE_INDEX_MISMATCH", "STATETABLE_COMMITLOG_DISAGREE",
              "STATETABLE_REDOLOG_DISAGREE",
              "REDOLOG_COMMITLOG_DISAGREE", "INDEX_INCOMPLETE"}


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------

def _tree(root) -> dict:
    """relative path -> sha256 of every file under root."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            p = os.path.join(dirpath, name)
            with open(p, "rb") as f:
                out[os.path.relpath(p, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _records(root, topics=None):
    from txlog_io import commitlog as CL
    from txlog_io.mappedfile import list_mapped_files

    files, _ = list_mapped_files(Path(root) / "commitlog")
    rows = []
    for mf in files:
        for batch, _ in CL.decode_range(str(mf.path), base_offset=mf.base_offset, topics=topics,
                                        with_body=True):
            rows += batch.to_pylist()
    return rows


def _record_bytes(row) -> bytes:
    with open(row["file"], "rb") as f:
        f.seek(row["file_position"])
        return f.read(row["total_size"])


def cut_store(src, dst, physical_offset: int) -> None:
    """A copy of ``src`` as a crash would leave it if nothing from ``physical_offset`` on had been written:
    the CommitLog zeroed from there (newer files removed), every consume-queue unit pointing there zeroed."""
    from txlog_io.mappedfile import list_mapped_files

    shutil.copytree(src, dst)
    files, _ = list_mapped_files(Path(dst) / "commitlog")
    for mf in files:
        if mf.base_offset > physical_offset:
            mf.path.unlink()
        elif mf.base_offset <= physical_offset < mf.base_offset + mf.size:
            with open(mf.path, "r+b") as f:
                f.seek(physical_offset - mf.base_offset)
                f.write(bytes(mf.base_offset + mf.size - physical_offset))
    for path in (Path(dst) / "consumequeue").glob("*/*/*"):
        data = bytearray(path.read_bytes())
        for at in range(0, len(data) - 19, 20):
            if struct.unpack_from(">q", data, at)[0] >= physical_offset:
                data[at:at + 20] = bytes(20)
        path.write_bytes(bytes(data))


def _main(*argv):
    from jobs.main import main

    return main(list(argv))


# ------------------------------------------------------------------------------------------------------------
# Spark-free: bytes as the real brokers write them
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["rocketmq-5.3.3", "rocketmq-4.9.8"])
def test_op_records_encode_to_the_fixture_bytes(version):
    from refbroker.repair import op_message
    from txlog_io import commitlog as CL

    ops = _records(FIXTURES / version / "store", [OP_TOPIC])
    assert ops
    for r in ops:
        raw = _record_bytes(r)
        msg = op_message(r["body"].decode(), queue_offset=r["queue_offset"], timestamp=r["store_timestamp"],
                         born_timestamp=r["born_timestamp"], host=r["store_host"],
                         trailing_separator=raw.endswith(b"\x02"))
        assert CL.encode_record(msg, r["physical_offset"]) == raw


def test_op_bodies_batch_like_the_profile():
    from refbroker.repair import op_bodies

    assert op_bodies([3, 5], batched=False) == [("3", [3]), ("5", [5])]
    assert op_bodies([3, 5], batched=True) == [("3,5,", [3, 5])]
    many = op_bodies(list(range(1000, 3000)), batched=True, max_chars=4096)
    assert [len(b) >= 4096 for b, _ in many[:-1]] == [True] * (len(many) - 1)
    assert sum(len(m) for _, m in many) == 2000 and all(len(b) < 4096 + 6 for b, _ in many)


@pytest.mark.parametrize("version,profile", [("rocketmq-5.3.3", "5.1+"), ("rocketmq-4.9.8", "4.3-5.0")])
def test_mark_done_appends_the_fixture_op_record(tmp_path, version, profile):
    """Cut the fixture at its last op record (the op batch lost in a crash): MARK_DONE writes that very
    record back (its store time = as_of; born = store time) and its op consume-queue unit."""
    from refbroker.repair import apply_repair, plan_repair

    src = FIXTURES / version / "store"
    op = _records(src, [OP_TOPIC])[-1]
    golden = bytearray(_record_bytes(op))
    golden[40:48] = struct.pack(">q", op["store_timestamp"])       # BORNTIMESTAMP = store time (one put)
    halves = [int(x) for x in op["body"].decode().split(",") if x]
    damaged = tmp_path / "cut"
    cut_store(src, damaged, op["physical_offset"])
    row = {"transaction_key": "K", "actions": ["MARK_DONE"], "mark_done_half_offsets": halves}
    plan = plan_repair(str(damaged), profile, [row], as_of_ms=op["store_timestamp"])
    marks = [w for w in plan.writes if w.action == "MARK_DONE"]
    assert len(marks) == 1 and marks[0].data == bytes(golden)
    assert marks[0].file == "commitlog/" + Path(op["file"]).name and marks[0].position == op["file_position"]
    apply_repair(plan, str(tmp_path / "new"))
    rel = Path(op["file"]).relative_to(src)
    with open(tmp_path / "new" / rel, "rb") as f:
        f.seek(op["file_position"])
        assert f.read(len(golden)) == bytes(golden)
    cq = f"consumequeue/{OP_TOPIC}/0/00000000000000000000"
    unit = (src / cq).read_bytes()[op["queue_offset"] * 20:(op["queue_offset"] + 1) * 20]
    assert (tmp_path / "new" / cq).read_bytes()[op["queue_offset"] * 20:][:20] == unit
    assert [w.action for w in plan.writes if w.action == "OP_CQ_UNIT"] == ["OP_CQ_UNIT"]


@pytest.mark.parametrize("version,profile", [("rocketmq-5.3.3", "5.1+"), ("rocketmq-4.9.8", "4.3-5.0")])
def test_deleted_transaction_queues_rebuilt_as_the_broker_wrote_them(tmp_path, version, profile):
    from refbroker.repair import apply_repair, plan_repair

    src = FIXTURES / version / "store"
    damaged = tmp_path / "damaged"
    shutil.copytree(src, damaged)
    for topic in (OP_TOPIC, HALF_TOPIC):
        shutil.rmtree(damaged / "consumequeue" / topic)
    plan = plan_repair(str(damaged), profile, [])
    assert {w.action for w in plan.writes} == {"REBUILD_CQ"}
    apply_repair(plan, str(tmp_path / "new"))
    assert _tree(tmp_path / "new") == _tree(src)


def test_undamaged_copy_is_byte_identical(tmp_path, real_store):
    from refbroker.repair import apply_repair, plan_repair

    src = real_store / "store"
    profiles = {"rocketmq-3.1.4": "3.x", "rocketmq-4.9.8": "4.3-5.0", "rocketmq-5.3.3": "5.1+"}
    profile = profiles[real_store.name]
    before = _tree(src)
    plan = plan_repair(str(src), profile, [])
    assert plan.writes == []
    apply_repair(plan, str(tmp_path / "new"))
    assert _tree(tmp_path / "new") == before == _tree(src)
    for rel in before:
        a, b = os.stat(src / rel), os.stat(tmp_path / "new" / rel)
        assert a.st_ino != b.st_ino and b.st_nlink == 1 and not os.path.islink(tmp_path / "new" / rel)
        assert a.st_mtime_ns == b.st_mtime_ns


def test_refusals_before_anything_is_read(tmp_path, capsys):
    store = str(FIXTURES / "rocketmq-5.3.3" / "store")
    out = tmp_path / "out"
    out.mkdir()
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    cases = [
        (["--into", str(full)], "not empty"),
        (["--into", store], "must not be the store"),
        (["--into", os.path.join(store, "sub")], "must not be the store or inside it"),
        (["--into", str(tmp_path / "n"), "--actions", "MARK_DONE,NUKE"], "--actions"),
        (["--into", str(tmp_path / "n")], "no audit_runs table"),
    ]
    for extra, text in cases:
        assert _main("repair", "--store", store, "--out", str(out), *extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("txaudit: error: ") and text in err[0], err
    assert not (tmp_path / "n").exists()


# ------------------------------------------------------------------------------------------------------------
# audit -> repair -> re-audit
# ------------------------------------------------------------------------------------------------------------

def _stores(base: Path) -> dict:
    """broker -> (store root, kind of repair expected)."""
    import refbroker
    from refbroker import repair_scenarios as RS

    out = {
        "obl51": (RS.op_batch_lost(base / "obl51").store_dir, "MARK_DONE"),
        "cbo49": (RS.commit_before_op(base / "cbo49").store_dir, "MARK_DONE"),
        "oqd51": (RS.op_queue_deleted(base / "oqd51").store_dir, "CQ"),
        "cqt49": (RS.cq_truncated(base / "cqt49", profile="4.6-4.9").store_dir, "CQ_TRUNCATED"),
        "leg3x": (refbroker.generate("3.x", "legacy-3x", 60, 4242, base / "leg3x",
                                     commitlog_file_mb=1).store_dir, "REBUILD_STATETABLE"),
    }
    src = FIXTURES / "rocketmq-5.3.3" / "store"
    cut_store(src, base / "fx53cut", _records(src, [OP_TOPIC])[-1]["physical_offset"])
    # the op batch lost, but the check service had passed those halves (half consume offset): nothing to do
    out["fx53cut"] = (base / "fx53cut", "NONE")
    shutil.copytree(src, base / "fx53oqd")
    shutil.rmtree(base / "fx53oqd" / "consumequeue" / OP_TOPIC)
    out["fx53oqd"] = (base / "fx53oqd", "CQ")
    return {k: (str(v[0]), v[1]) for k, v in out.items()}


def _audit(spark, pairs, out):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    args = ["audit", "--out", str(out), "--as-of", AS_OF]
    for broker, store in pairs:
        args += ["--store", store, "--broker", broker]
    _, opts = parse_args(args)
    run_audit(spark, opts, print_summary=False)


def _table(out, name, **eq):
    import deltalake

    rows = deltalake.DeltaTable(str(Path(out) / name)).to_pyarrow_table().to_pylist()
    return [r for r in rows if all(r[k] == v for k, v in eq.items())]


@pytest.fixture(scope="module")
def repaired(spark, tmp_path_factory):
    base = tmp_path_factory.mktemp("repair")
    stores = _stores(base / "stores")
    before = {b: _tree(s) for b, (s, _) in stores.items()}
    _audit(spark, [(b, s) for b, (s, _) in stores.items()], base / "out")
    codes = {}
    for b, (s, _) in stores.items():
        codes[b] = _main("repair", "--store", s, "--out", str(base / "out"), "--into", str(base / "new" / b))
    after = {b: _tree(s) for b, (s, _) in stores.items()}
    _audit(spark, [(b, str(base / "new" / b)) for b in stores], base / "reaudit")
    return {"base": base, "stores": stores, "before": before, "after": after, "codes": codes}


def _by_key(rows):
    return {(r["broker"], r["transaction_key"]): r for r in rows}


@pytest.mark.spark
def test_repair_exits_ok_and_input_is_unchanged(repaired):
    assert set(repaired["codes"].values()) == {0}
    assert repaired["before"] == repaired["after"]


@pytest.mark.spark
def test_each_situation_was_found_and_is_gone(repaired):
    base = repaired["base"]
    old = _table(base / "out", "recovery_worklist")
    new = _table(base / "reaudit", "recovery_worklist")
    old_tx = _table(base / "out", "transactions")
    new_tx = _table(base / "reaudit", "transactions")
    for broker, (_, kind) in repaired["stores"].items():
        o = [r for r in old if r["broker"] == broker]
        n = [r for r in new if r["broker"] == broker]
        if kind == "NONE":
            assert not _table(base / "out", "repair_log", broker=broker)
            assert _tree(base / "new" / broker) == _tree(repaired["stores"][broker][0])
        elif kind == "CQ":
            assert any("CQ_MISMATCH" in t["flags"] for t in old_tx if t["broker"] == broker), broker
        elif kind == "CQ_TRUNCATED":    # the audit sees dispatch lag; the repair restores the broker's bytes
            cq = f"consumequeue/{HALF_TOPIC}/0/00000000000000000000"
            assert [r["file"] for r in _table(base / "out", "repair_log", broker=broker)] == [cq]
            before = Path(repaired["stores"][broker][0]).parent / "cq_before_truncation"
            assert (base / "new" / broker / cq).read_bytes() == before.read_bytes()
        else:
            assert any(kind in r["actions"] for r in o), broker
        assert not [r for r in n if "MARK_DONE" in r["actions"]], broker
        assert not [t for t in new_tx if t["broker"] == broker and "CQ_MISMATCH" in t["flags"]], broker
        left = [r for r in n if "REBUILD_STATETABLE" in r["actions"]]
        if broker == "leg3x":
            # prepared records sharing one statetable index (the rebuild reset the counter): one unit each,
            # the index of one of them cannot match without rewriting CommitLog records (reported as a note)
            log = _table(base / "out", "repair_log", broker=broker)
            assert log and all(r["action"] == "REBUILD_STATETABLE" for r in log)
            assert len(left) < len([r for r in o if "REBUILD_STATETABLE" in r["actions"]])
            assert all(set(r["flags"]) == {"STATETABLE_INDEX_MISMATCH"} for r in left)
        else:
            assert not left, broker


@pytest.mark.spark
def test_every_other_transaction_is_unchanged(repaired):
    base = repaired["base"]
    old_tx = _by_key(_table(base / "out", "transactions"))
    new_tx = _by_key(_table(base / "reaudit", "transactions"))
    # the halves whose half-queue units were lost at the queue's tail (cq_truncated) are found before the
    # repair too: indexed mode scans after an idle transaction queue's last unit (jobs/read/indexed/tails.py)
    assert old_tx.keys() == new_tx.keys()
    old_rw = _by_key(_table(base / "out", "recovery_worklist"))
    new_rw = _by_key(_table(base / "reaudit", "recovery_worklist"))
    old_cb = _by_key(_table(base / "out", "check_back_worklist"))
    new_cb = _by_key(_table(base / "reaudit", "check_back_worklist"))
    for key, o in old_tx.items():
        n = new_tx[key]
        assert n["state"] == o["state"], key
        assert set(n["flags"]) <= set(o["flags"]) and set(o["flags"]) - set(n["flags"]) <= REPAIRABLE, key
        if set(o["flags"]) == set(n["flags"]):
            for a, b in ((old_rw, new_rw), (old_cb, new_cb)):
                x, y = a.get(key), b.get(key)
                assert (x is None) == (y is None), key
                if x is not None:
                    assert (x.get("action"), x.get("actions"), x.get("priority")) == \
                        (y.get("action"), y.get("actions"), y.get("priority")), key


@pytest.mark.spark
def test_repaired_stores_dump_without_new_findings(repaired):
    """txlog-dump --verify of each repaired copy: no finding the input did not have (a crashed reference
    store has no checkpoint yet: MISSING_FILE in both), and every record decodes -- the old ones and the
    appended op records."""
    import contextlib
    import io

    from txlog_io.cli import main as dump

    def findings(root):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
            dump(["store", str(root), "--verify"])
        lines = buf.getvalue().splitlines()
        return sorted((f["kind"], os.path.relpath(f["file"], root)) for f in map(json.loads, lines))

    log = _table(repaired["base"] / "out", "repair_log")
    for broker, (store, _) in repaired["stores"].items():
        new = repaired["base"] / "new" / broker
        assert findings(new) == findings(store), broker
        appended = sum(1 for r in log if r["broker"] == broker and r["action"] == "MARK_DONE"
                       and "op record" in r["detail"])
        assert len(_records(new)) == len(_records(store)) + appended, broker


@pytest.mark.spark
def test_repair_log_and_requests(repaired):
    base = repaired["base"]
    log = _table(base / "out", "repair_log")
    assert {r["broker"] for r in log} == {b for b, (_, kind) in repaired["stores"].items() if kind != "NONE"}
    marks = [r for r in log if r["action"] == "MARK_DONE"]
    assert marks and all(r["file"].startswith("commitlog/") and r["bytes"] > 0 for r in marks)
    assert {r["run_id"] for r in log} == {RUN_ID}
    folder = base / "out" / "recovery" / RUN_ID
    assert (folder / "README.md").read_text().count("resumeCheckHalfMessage") >= 1
    resume = [json.loads(x) for x in (folder / "resume_requests.jsonl").read_text().splitlines()]
    expected = [r for r in _table(base / "out", "recovery_worklist") if "RESUME_DISCARDED" in r["actions"]]
    assert len(resume) == len(expected) and all(x["code"] == 323 for x in resume)
    checks = _table(base / "out", "check_back_worklist")
    written = []
    for p in sorted((folder / "check_back").iterdir()):
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        assert [r["urgency_rank"] for r in rows] == sorted(r["urgency_rank"] for r in rows)
        written += rows
    assert len(written) == len(checks)


@pytest.mark.spark
def test_dry_run_and_changed_store_refusal(repaired, tmp_path, capsys):
    base = repaired["base"]
    store = repaired["stores"]["oqd51"][0]
    assert _main("repair", "--store", store, "--out", str(base / "out"), "--into", str(tmp_path / "d"),
                 "--dry-run") == 0
    assert "REBUILD_CQ" in capsys.readouterr().out and not (tmp_path / "d").exists()
    with open(os.path.join(store, "config", "topics.json"), "a") as f:
        f.write(" ")                               # the store changed since the audit
    assert _main("repair", "--store", store, "--out", str(base / "out"), "--into", str(tmp_path / "e")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "differs from what audit run" in err[0] and "topics.json" in err[0]


@pytest.mark.spark
def test_spark_submit_repair_wiring(repaired, tmp_path):
    base = repaired["base"]
    store = repaired["stores"]["obl51"][0]
    cmd = [str(ROOT / "spark-submit.sh"), "repair", "--store", store, "--out", str(base / "out"),
           "--into", str(tmp_path / "x"), "--dry-run"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "MARK_DONE" in p.stdout, p.stderr
    p = subprocess.run(cmd[:-3] + ["--into", store], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.strip().startswith("txaudit: error: --into"), p.stderr


def test_bench_repair_reports_both_rates(tmp_path):
    from refbroker.repair_bench import bench_repair

    r = bench_repair(2, str(tmp_path))
    assert r["writes"] >= 1 and r["cp_mb_s"] > 0 and r["repair_mb_s"] > 0 and r["store_data_mb"] > 1
    assert _tree(tmp_path / "cp") == _tree(tmp_path / "gen" / "store")


def test_mark_done_over_a_torn_tail(tmp_path):
    """A crash tore the last write: the op records go where the broker's recovery would write (after the
    last valid record), the torn bytes after them are zeroed, and the copy then dumps without a finding."""
    import contextlib
    import io

    from refbroker import repair_scenarios as RS
    from refbroker.repair import apply_repair, plan_repair
    from txlog_io.cli import main as dump

    store = Path(RS.op_batch_lost(tmp_path / "s", transactions=12).store_dir)
    halves = _records(store, [HALF_TOPIC])
    last = max(_records(store), key=lambda r: r["physical_offset"])
    from txlog_io import commitlog as CL

    big = CL.Message(topic="TopicRepair", body=b"x" * 2000, store_host=last["store_host"])
    torn = CL.encode_record(big, last["physical_offset"] + last["total_size"])[:1000]   # cut in the body
    with open(last["file"], "r+b") as f:
        f.seek(last["file_position"] + last["total_size"])
        f.write(bytes(torn))
    rows = [{"transaction_key": f"T{r['queue_offset']}", "actions": ["MARK_DONE"],
             "mark_done_half_offsets": [r["queue_offset"]]} for r in halves]
    plan = plan_repair(str(store), "5.1+", rows, as_of_ms=last["store_timestamp"] + 1000)
    marks = [w for w in plan.writes if w.action == "MARK_DONE"]
    zero = [w for w in plan.writes if w.action == "ZERO_TORN_TAIL"]
    assert marks and marks[0].position == last["file_position"] + last["total_size"]
    end = marks[-1].position + len(marks[-1].data)
    assert len(zero) == 1 and zero[0].position >= end and set(zero[0].data) == {0}
    assert zero[0].position + len(zero[0].data) == last["file_position"] + last["total_size"] + 1000
    apply_repair(plan, str(tmp_path / "new"))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(io.StringIO()):
        dump(["commitlog", str(tmp_path / "new" / "commitlog"), "--verify"])
    assert buf.getvalue() == ""
    ops = _records(tmp_path / "new", ["RMQ_SYS_TRANS_OP_HALF_TOPIC"])
    assert sorted(int(x) for op in ops for x in op["body"].decode().split(",") if x) == \
        sorted(r["queue_offset"] for r in halves)


def test_statetable_rebuilt_as_the_314_broker_wrote_it(tmp_path):
    """The real 3.1.4 statetable equals its rebuild from the CommitLog (no write); zeroed in a copy, the
    rebuild writes the fixture's bytes back."""
    from refbroker.repair import apply_repair, plan_repair

    src = FIXTURES / "rocketmq-3.1.4" / "store"
    row = {"transaction_key": "x", "actions": ["REBUILD_STATETABLE"]}
    assert plan_repair(str(src), "3.x", [row]).writes == []
    damaged = tmp_path / "damaged"
    shutil.copytree(src, damaged)
    table = damaged / "transaction" / "statetable" / "00000000000000000000"
    table.write_bytes(bytes(table.stat().st_size))
    plan = plan_repair(str(damaged), "3.x", [row])
    assert [w.action for w in plan.writes] == ["REBUILD_STATETABLE"]
    apply_repair(plan, str(tmp_path / "new"))
    assert _tree(tmp_path / "new") == _tree(src)
