"""Crash safety of the audit's outputs: ``kill -9`` of the whole job, reruns of a run id, concurrent runs.

The whole-job test runs ``./spark-submit.sh audit`` on the 5.3.3 fixture in its own process group and kills
that group with SIGKILL at points injected through ``TXAUDIT_KILL_AT`` (jobs.audit.guard.kill_point): after a
table in the middle of the write phase, and right after a rerun retracted its old ``audit_runs`` row.  After
each kill every table under ``--out`` must load at its latest version, and ``audit_runs`` must not list the
run unless the run completed.  The completing rerun between the two kills runs in-process on the session's
Spark, held at its first kill point while a second audit on the same ``--out`` is turned away (a third
spark-submit cost ~30 s more).  (The ``before.audit_runs`` point is not exercised: each spark-submit audit
takes 20-60 s depending on the machine's load.)  The commit protocol itself is killed at random moments
without Spark (``delta_sink._commit_files`` in a loop in a child process).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jobs.audit import guard
from jobs.delta import sink as delta_sink
from schemas.core import Column, Table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBMIT = os.path.join(ROOT, "spark-submit.sh")
STORE = os.path.join(ROOT, "tests", "data", "fixtures", "rocketmq-5.3.3", "store")
RUN = "crash-run"
TABLES = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies", "profiles")
KEYS = {"transactions": ("broker", "transaction_key")}


def _audit(out, kill_at=None, timeout=900):
    env = dict(os.environ)
    env.pop("TXAUDIT_KILL_AT", None)
    if kill_at:
        env["TXAUDIT_KILL_AT"] = kill_at
    return subprocess.Popen(["bash", SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                             "--conf", "spark.ui.showConsoleProgress=false", "audit", "--store", STORE,
                             "--out", str(out), "--as-of", "2026-11-22T00:00:00Z", "--run-id", RUN],
                            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _finish(p, timeout=900):
    try:
        out, _ = p.communicate(timeout=timeout)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    return p.returncode, out


def _tables(out):
    """Every Delta table under ``out`` loads at its latest version: {name: pyarrow Table}."""
    from deltalake import DeltaTable

    found = {}
    for name in sorted(os.listdir(out)):
        if os.path.isdir(os.path.join(out, name, "_delta_log")):
            found[name] = DeltaTable(os.path.join(out, name)).to_pyarrow_table()
    return found


def _runs(tables):
    t = tables.get("audit_runs")
    return [] if t is None else t.to_pylist()


def _assert_killed(rc, log):
    assert rc in (-signal.SIGKILL, 128 + signal.SIGKILL), (rc, log[-3000:])


def _assert_once(tables, run_row):
    for name, rows in dict(run_row["table_rows"]).items():
        t = tables[name].filter(pa.compute.equal(tables[name]["run_id"], RUN))
        assert t.num_rows == rows, (name, t.num_rows, rows)
        if name in KEYS:
            keys = set(zip(*(t[k].to_pylist() for k in KEYS[name]), strict=True))
            assert len(keys) == t.num_rows, name


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_kill_at_several_points_then_rerun_and_a_concurrent_run(spark, tmp_path, monkeypatch):
    out = tmp_path / "out dir ü"        # a space and a non-ASCII letter on the way, too

    # 1: killed in the middle of the write phase (two tables written, the others not yet)
    rc, log = _finish(_audit(out, "wrote.check_back_worklist"))
    _assert_killed(rc, log)
    t = _tables(out)
    assert {"transactions", "check_back_worklist"} <= set(t) and "audit_runs" not in t, (set(t), log[-2000:])
    assert guard.probe_lock(str(out)) is None           # the kernel dropped the dead run's lock

    # 2: the same run id again, to completion; meanwhile a second audit on the same --out is turned away.
    # This run is in-process on the session's Spark (steps 1 and 3 are the spark-submit path, and a JVM start
    # costs more than the audit); it takes the lock as jobs.main does and is held at its first kill point
    # (after the retraction, before any table is written) until the second audit has been refused.
    from jobs.audit import run as audit_job
    from jobs.main import parse_args

    monkeypatch.delenv("TXAUDIT_KILL_AT", raising=False)
    at_first_point, go_on, done = threading.Event(), threading.Event(), {}

    def hold(name):
        if not at_first_point.is_set():
            done["held_at"] = name
            at_first_point.set()
            go_on.wait(600)

    def complete_run():
        try:
            with guard.out_lock(str(out), RUN):
                done["summary"] = audit_job.run_audit(spark, opts, print_summary=False)
        except BaseException as e:      # noqa: BLE001 - reported by the main thread
            done["error"] = e
        finally:
            at_first_point.set()

    _, opts = parse_args(["audit", "--store", STORE, "--out", str(out), "--as-of", "2026-11-22T00:00:00Z",
                          "--run-id", RUN])
    monkeypatch.setattr(audit_job, "kill_point", hold)
    lock_file = out / guard.LOCK_NAME
    runner = threading.Thread(target=complete_run, daemon=True)
    runner.start()
    try:
        assert at_first_point.wait(600) and "error" not in done, done.get("error")
        assert done["held_at"] == "retracted"
        assert guard.probe_lock(str(out)) is not None, "the running audit does not hold the lock"
        second = subprocess.run(["bash", SUBMIT, "audit", "--store", STORE, "--out", str(out),
                                 "--run-id", "other"],
                                cwd=ROOT, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert second.returncode == 2, second.stderr
        assert second.stderr.strip().startswith("txaudit: error: --out") and "in use by another txaudit run" \
            in second.stderr and second.stderr.strip().count("\n") == 0, second.stderr
        assert lock_file.read_text().startswith("pid ")
    finally:
        go_on.set()
        runner.join(600)
    assert not runner.is_alive() and "error" not in done, done.get("error")
    assert guard.probe_lock(str(out)) is None
    t = _tables(out)
    runs = _runs(t)
    assert [r["run_id"] for r in runs] == [RUN] and runs[0]["status"] == "COMPLETE"
    assert set(TABLES) <= set(t)
    _assert_once(t, runs[0])
    complete = {name: t[name].num_rows for name in TABLES}

    # 3: a rerun killed right after it retracted the COMPLETE row: the run is no longer listed as complete
    rc, log = _finish(_audit(out, "retracted"))
    _assert_killed(rc, log)
    t = _tables(out)
    assert _runs(t) == []
    assert {name: t[name].num_rows for name in TABLES} == complete     # still one copy of each row


_COMMIT_CHILD = r"""
import datetime, os, sys, time
sys.path.insert(0, sys.argv[1])
import pyarrow as pa, pyarrow.parquet as pq
from jobs.delta import sink as delta_sink
from schemas.core import Column, Table
root, n = sys.argv[2], int(sys.argv[3])
table = Table.of("t", [Column("k", pa.int64(), False, "key")], "crash test")
schema = delta_sink.arrow_schema_for(table)
i = 0
while True:
    run = f"r{i % 3}"
    rel = f"run_id={run}/part-{os.getpid()}-{i}.parquet"
    os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
    batch = pa.table({"k": pa.array(range(n), pa.int64()), "run_date": pa.array([datetime.date(2026, 1, 1)] * n, pa.date32()),
                      "run_id": pa.array([run] * n)}).select(schema.names).cast(schema)
    pq.write_table(batch.drop(["run_id"]), os.path.join(root, rel))
    meta = delta_sink._FileMeta(rel, os.path.getsize(os.path.join(root, rel)), {"run_id": run}, n, "{}",
                                int(time.time() * 1000))
    delta_sink._commit_files(root, table, run, ["run_id"], [meta])
    print(i, flush=True)
    i += 1
"""


def test_commit_killed_at_random_moments_leaves_a_readable_table(tmp_path):
    """kill -9 of a process committing in a loop, at random moments: the table always loads, each run once."""
    from deltalake import DeltaTable

    root = tmp_path / "t"
    rng = random.Random(19)
    n = 50
    for attempt in range(6):
        p = subprocess.Popen([sys.executable, "-c", _COMMIT_CHILD, ROOT, str(root), str(n)],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert p.stdout.readline(), "the committing child died before its first commit"
        time.sleep(rng.uniform(0.0, 1.5))
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(30)
        t = DeltaTable(str(root)).to_pyarrow_table()
        for run, count in zip(*pa.compute.value_counts(t["run_id"]).flatten(), strict=True):
            assert count.as_py() == n, (attempt, run, count)


def test_retract_run_removes_only_that_run(tmp_path):
    from deltalake import DeltaTable, write_deltalake

    table = Table.of("audit_runs", [Column("k", pa.int64(), False, "key")], "runs")
    root = tmp_path / "audit_runs"
    write_deltalake(str(root), pa.table({"k": [1, 2, 3], "run_id": ["a", "b", "a"]}), partition_by=["run_id"])
    assert delta_sink.retract_run(str(tmp_path), table, "missing") is None
    v = delta_sink.retract_run(str(tmp_path), table, "a")
    assert v == 1
    assert DeltaTable(str(root)).to_pyarrow_table()["run_id"].to_pylist() == ["b"]
    assert delta_sink.retract_run(str(tmp_path / "nothing"), table, "a") is None
    assert pq is not None
