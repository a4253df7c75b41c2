"""Outputs in a bucket: ``--out s3://...`` against the local S3-compatible server (moto's, on loopback;
``jobs.bench.s3server``), with the real-broker fixtures.

* an audit (full + incremental state, and indexed) written to ``s3://`` equals the same audit written to disk,
  table by table; ``report``, ``check`` and ``repair`` read it there and write their outputs there;
* a missing bucket, a refused key, an unreachable endpoint, an object where the prefix should be, a scheme with
  no run lock: one line, exit 2, nothing written;
* the run lock in a bucket: exactly one of two runs racing for one ``--out`` gets it; the other is turned away
  in one line; a stale lock is taken over; a Delta commit is a conditional PUT;
* a writer killed at random moments while committing to the bucket leaves every table as it was or as the
  next commit made it, never half; so does a whole ``./spark-submit.sh audit`` SIGKILLed at moments read off
  the server's request log, and its stale lock object does not block the rerun.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest

from tests.conftest import FIXTURES

pytest.importorskip("moto", reason="moto[server] (test extra) runs the local S3 server")

BUCKET = "txaudit-outputs"
AS_OF = "2026-11-21T12:00:00Z"
VERSIONS = ("rocketmq-4.9.8", "rocketmq-5.3.3")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def s3():
    from jobs.bench.s3server import LocalS3

    with LocalS3() as server:
        server.create_bucket(BUCKET)
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        yield server
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _local(version: str) -> str:
    return str(FIXTURES / version / "store")


def _uri(prefix: str) -> str:
    return f"s3://{BUCKET}/{prefix}"


def _writes(s3, mark: int) -> list:
    """The requests since ``mark`` that changed something (a refused conditional PUT did not)."""
    return [r for r in s3.log[mark:] if r.method in ("PUT", "POST", "DELETE") and 200 <= r.status < 300]


def _tables(out: str) -> dict:
    """Every Delta table directly under ``out`` (a directory or a prefix) at its latest version."""
    from deltalake import DeltaTable

    from jobs.delta import outfs

    return {name: DeltaTable(outfs.join(out, name), storage_options=outfs.delta_options(out)).to_pyarrow_table()
            for name in sorted(outfs.listdir(out)) if outfs.is_delta(outfs.join(out, name))}


_VOLATILE = {"audit_runs": {"started_at", "finished_at", "elapsed_s", "phase_seconds", "table_paths", "out",
                            "config_json"}}


def _canonical(tbl: pa.Table, name: str, out: str) -> list:
    """Rows as sorted tuples, the ``--out`` root replaced by ``<out>`` (an incremental fallback names the state
    table's path), volatile columns dropped."""
    import pyarrow.compute as pc

    cols = []
    for c in tbl.column_names:
        if c in _VOLATILE.get(name, ()):
            continue
        col = tbl.column(c)
        if pa.types.is_string(col.type):
            col = pc.replace_substring(col, out, "<out>")
        cols.append(col.to_pylist())
    return sorted(zip(*cols, strict=True), key=repr)


# ------------------------------------------------------------------------------------------------ audit
@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_audit_into_a_bucket_equals_the_audit_on_disk(spark, s3, tmp_path, mode):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    spark.sparkContext.environment.update(s3.env())
    outs = {"s3": _uri(f"audit-{mode}"), "local": str(tmp_path / "local")}
    mark = len(s3.log)
    for out in outs.values():
        argv = ["audit", *[a for v in VERSIONS for a in ("--store", _local(v))], "--out", out, "--as-of", AS_OF,
                "--mode", mode, *(["--incremental"] if mode == "full" else [])]
        _, opts = parse_args(argv)
        run_audit(spark, opts, print_summary=False)
    got = {k: _tables(v) for k, v in outs.items()}
    assert set(got["s3"]) == set(got["local"]) and {"transactions", "audit_runs"} <= set(got["s3"])
    if mode == "full":
        assert any(n.startswith("audit_state") for n in got["s3"])          # the incremental state
    for name in sorted(got["local"]):
        a, b = _canonical(got["s3"][name], name, outs["s3"]), _canonical(got["local"][name], name, outs["local"])
        assert a == b, f"{name} ({mode}) differs: {len(a)} rows in the bucket, {len(b)} on disk"
    assert got["s3"]["transactions"].num_rows > 0
    run = got["s3"]["audit_runs"].to_pylist()[0]
    assert all(p.startswith(outs["s3"] + "/") for p in dict(run["table_paths"]).values())
    # the report is an object of the bucket; every Delta commit was a conditional PUT
    from jobs.delta import outfs

    page = outfs.join(outs["s3"], "report", "20261121T120000Z.html")
    assert b"TxAudit run 20261121T120000Z" in outfs.read_bytes(page)
    commits = [r for r in _writes(s3, mark) if "/_delta_log/" in r.path and r.path.endswith(".json")]
    assert commits and all(r.condition == "If-None-Match: *" for r in commits)
    assert not [r for r in _writes(s3, mark) if r.path.endswith("/")]                # no directory markers


@pytest.mark.spark
def test_report_check_and_repair_use_a_bucket(spark, s3, tmp_path, capsys):
    """``report`` rewrites the page, ``check`` adds its tables, ``repair`` its log and work lists -- all in the
    bucket -- from an audit written there."""
    from jobs.audit.run import run_audit
    from jobs.delta import outfs
    from jobs.main import main, parse_args

    spark.sparkContext.environment.update(s3.env())
    out, store = _uri("tools"), _local("rocketmq-4.9.8")
    _, opts = parse_args(["audit", "--store", store, "--out", out, "--as-of", AS_OF, "--no-report"])
    run_audit(spark, opts, print_summary=False)
    assert main(["report", "--out", out]) == 0
    assert capsys.readouterr().out.strip() == outfs.join(out, "report", "20261121T120000Z.html")
    assert outfs.exists(outfs.join(out, "report", "index.html"))

    code = main(["check", "--out", out])            # no --store: no Spark, the driver evaluates and writes
    assert code in (0, 1, 2), capsys.readouterr().err      # passed / warned / failed: every check evaluated
    assert _tables(out)["check_results"].num_rows == 12          # conf/checks.yml's 12 results

    into = tmp_path / "copy"
    assert main(["repair", "--store", store, "--out", out, "--into", str(into)]) == 0, capsys.readouterr().err
    assert outfs.exists(outfs.join(out, "recovery", "20261121T120000Z", "README.md"))


# ------------------------------------------------------------------------------------------------ errors
def _cli(argv, capsys):
    from jobs.main import main

    code = main(argv)
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("case", ["missing bucket", "refused key", "unreachable", "an object", "gs scheme"])
def test_bad_out_is_one_line_exit_2(s3, case, capsys, monkeypatch):
    out = {"missing bucket": "s3://no-such-bucket/txaudit", "gs scheme": "gs://some-bucket/txaudit",
           "an object": _uri("an-object")}.get(case, _uri("never"))
    if case == "an object":
        from jobs.delta import outfs

        outfs.write_bytes(out, b"not a prefix")
    if case == "refused key":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG")
    if case == "unreachable":
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    mark = len(s3.log)
    for argv in (["--validate-only", "audit", "--store", _local("rocketmq-4.9.8"), "--out", out, "--as-of", AS_OF],
                 ["report", "--out", out]):
        code, err = _cli(argv, capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith("txaudit: error: --out"), err
        expected = {"missing bucket": "bucket not found: s3://no-such-bucket", "refused key": "INVALID_ACCESS_KEY_ID",
                    "unreachable": "connect", "an object": "not a directory",
                    "gs scheme": "not supported"}[case]
        assert expected.lower() in err[0].lower(), err
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in err[0]
    assert _writes(s3, mark) == []


# ------------------------------------------------------------------------------------------------ lock
def test_two_runs_racing_for_one_out_get_one_lock(s3, capsys):
    from jobs.audit import guard
    from jobs.audit.bucketlock import BucketLock, BucketLockedError

    out = _uri("locked")
    start, results = threading.Barrier(2), {}

    def contend(name):
        lock = BucketLock(out, name, guard.LOCK_NAME)
        start.wait()
        try:
            lock.acquire()
            results[name] = lock
        except BucketLockedError as e:
            results[name] = str(e)

    threads = [threading.Thread(target=contend, args=(n,)) for n in ("run-a", "run-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [v for v in results.values() if isinstance(v, BucketLock)]
    losers = [v for v in results.values() if isinstance(v, str)]
    assert len(winners) == 1 and len(losers) == 1, results
    assert "in use by another txaudit run" in losers[0] and winners[0].run_id in losers[0]
    # the CLI on the same --out: one line naming the holder, exit 2, no Spark started, nothing written
    mark = len(s3.log)
    for argv in (["audit", "--store", _local("rocketmq-4.9.8"), "--out", out, "--as-of", AS_OF],
                 ["--validate-only", "audit", "--store", _local("rocketmq-4.9.8"), "--out", out]):
        code, err = _cli(argv, capsys)
        assert code == 2 and len(err) == 1 and winners[0].run_id in err[0], err
    assert _writes(s3, mark) == []
    winners[0].release()
    code, err = _cli(["--validate-only", "audit", "--store", _local("rocketmq-4.9.8"), "--out", out], capsys)
    assert code == 0, err


def test_a_stale_lock_is_taken_over_and_a_live_one_kept(s3, capsys):
    from jobs.audit import guard
    from jobs.audit.bucketlock import BucketLock, BucketLockedError

    out = _uri("stale")
    dead = BucketLock(out, "dead-run", guard.LOCK_NAME, ttl_s=1)
    dead.acquire()
    dead._stop.set()                                  # its process "died": no heartbeat, no release
    live = BucketLock(out, "live-run", guard.LOCK_NAME, ttl_s=1)
    with pytest.raises(BucketLockedError):
        live.acquire()                                # not stale yet
    time.sleep(2.2)
    live.acquire()                                    # stale now: taken over with If-Match
    assert "took over the stale run lock" in capsys.readouterr().err
    time.sleep(1.5)                                   # live's heartbeat (every ttl / 3) keeps it fresh
    other = BucketLock(out, "third-run", guard.LOCK_NAME, ttl_s=1)
    with pytest.raises(BucketLockedError):
        other.acquire()
    mark = len(s3.log)
    dead.release()                                    # the dead run's late release must not delete it
    assert live.holder()[0]["run_id"] == "live-run"
    live.release()
    assert live.holder() is None
    assert [r.condition.split(":")[0] for r in _writes(s3, mark) if r.method == "DELETE"] == ["If-Match"]


# ------------------------------------------------------------------------------------------------ kill
_WRITER = r"""
import datetime as dt, os, sys
import pyarrow as pa
from jobs.delta import sink
from schemas.core import Column, Table
T = Table.of("t", [Column("broker", pa.string(), False, ""), Column("k", pa.int64(), False, ""),
                   Column("run", pa.string(), False, "")], "killed writer", ("broker",))
out, n = sys.argv[1], int(sys.argv[2])
for i in range(n):
    rows = pa.table({"broker": ["a"] * 500 + ["b"] * 500, "k": list(range(1000)), "run": [f"gen{i}"] * 1000})
    sink.write_table(rows, out, T, f"run{i % 2}", ["broker"], run_date=dt.date(2026, 11, 21), writer="delta-rs")
    print(i, flush=True)
"""


def test_a_writer_killed_while_committing_leaves_the_table_whole(s3):
    """SIGKILL at random moments of a loop of sink commits to the bucket: after each kill the table loads and
    each run id holds exactly one generation's 1000 rows (the one before the killed commit, or its own)."""
    import random

    from deltalake import DeltaTable

    from jobs.delta import outfs

    out = _uri("killed")
    env = dict(os.environ, PYTHONPATH=ROOT)
    rng = random.Random(31)
    seen_versions = []
    for round_ in range(4):
        p = subprocess.Popen([sys.executable, "-c", _WRITER, out, "40"], env=env, cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        assert p.stdout.readline().strip() != "" or round_ > 0     # at least one commit per round
        time.sleep(rng.uniform(0.05, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
        table = outfs.join(out, "t")
        dt_ = DeltaTable(table, storage_options=outfs.delta_options(table))
        seen_versions.append(dt_.version())
        rows = dt_.to_pyarrow_table().to_pylist()
        by_run = {}
        for r in rows:
            by_run.setdefault(r["run_id"], []).append(r)
        for run_id, rs in by_run.items():
            assert len(rs) == 1000, (run_id, len(rs))
            assert len({r["run"] for r in rs}) == 1, run_id
            assert sorted(r["k"] for r in rs if r["broker"] == "a") == list(range(500))
    assert seen_versions == sorted(seen_versions) and seen_versions[-1] > 0


# ------------------------------------------------------------------------------------------------ kill -9
def _run_rows(tables: dict, run_id: str, out: str) -> dict:
    """{table: canonical rows of ``run_id`` without the run id} (audit_runs: without its volatile columns)."""
    import pyarrow.compute as pc

    got = {}
    for name, tbl in tables.items():
        if "run_id" not in tbl.column_names:
            continue
        rows = tbl.filter(pc.equal(tbl["run_id"], run_id)).drop_columns(["run_id"])
        got[name] = _canonical(rows, name, out)
    return got


def _kill_when(p, s3, mark: int, moment) -> str:
    """SIGKILL ``p``'s process group as soon as the server's log since ``mark`` satisfies ``moment`` (a predicate
    on the completed requests that changed something); returns the path of the request that triggered it."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and p.poll() is None:
        hit = moment(_writes(s3, mark))
        if hit is not None:
            os.killpg(p.pid, signal.SIGKILL)
            return hit.path
        time.sleep(0.005)
    raise AssertionError(f"the run ended (exit {p.poll()}) before the moment to kill it came")


def _nth(kind: str, n: int):
    """The n-th (1-based) completed write of ``kind``: "commit" (a ``_delta_log`` JSON) or "data" (a Parquet
    object of a table, written by a task before the commit that adds it)."""
    def moment(writes):
        hits = [r for r in writes if (("/_delta_log/" in r.path and r.path.endswith(".json")) if kind == "commit"
                                      else r.path.endswith(".parquet") and "/_delta_log/" not in r.path)]
        return hits[n - 1] if len(hits) >= n else None
    return moment


@pytest.mark.spark
@pytest.mark.timeout(600)
def test_a_spark_submit_killed_while_writing_to_the_bucket_leaves_the_tables_whole(spark, s3, monkeypatch,
                                                                                      capsys):
    """``./spark-submit.sh audit --out s3://...`` of a second run id, its process group SIGKILLed at moments read
    off the server's request log (a data file of the first table uploaded; the second commit): after
    each kill every table loads, the first run's rows are untouched and the second run's rows are all there or
    none; the dead run's lock object goes stale after ``TXAUDIT_LOCK_TTL_S`` and is taken over; the rerun of
    the killed run id completes and holds the same rows as the first run."""
    from jobs.audit import guard
    from jobs.audit.bucketlock import BucketLockedError
    from jobs.audit.run import run_audit
    from jobs.main import parse_args
    from tests.test_crash_safety import SUBMIT, _assert_killed, _finish

    ttl = 3
    T0 = time.monotonic()
    monkeypatch.setenv("TXAUDIT_LOCK_TTL_S", str(ttl))
    spark.sparkContext.environment.update(s3.env())
    out, store = _uri("killed-audit"), _local("rocketmq-5.3.3")
    argv = ["audit", "--store", store, "--out", out, "--as-of", AS_OF, "--no-report"]

    # the first run, complete (in-process: the kills below are the spark-submit path)
    _, opts = parse_args([*argv, "--run-id", "first"])
    with guard.out_lock(out, "first"):
        run_audit(spark, opts, print_summary=False)
    first_tables = _tables(out)
    first = _run_rows(first_tables, "first", out)
    versions = {n: _delta_version(out, n) for n in first_tables}
    assert first["transactions"] and first["audit_runs"]

    killed_at, t0 = [], time.monotonic()
    first_s = time.monotonic() - T0
    for moment in (_nth("data", 1), _nth("commit", 2)):
        time.sleep(ttl + 0.5)                               # the previous kill's lock object goes stale
        mark = len(s3.log)
        p = subprocess.Popen(["bash", SUBMIT, "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                              "--conf", "spark.ui.showConsoleProgress=false", *argv, "--run-id", "second"],
                             cwd=ROOT, env=dict(os.environ), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
        hit = _kill_when(p, s3, mark, moment)
        rc, log = _finish(p, timeout=120)
        _assert_killed(rc, log)
        with pytest.raises(BucketLockedError):                   # the dead run's lock object: fresh for a ttl
            guard.out_lock(out, "second").__enter__()
        after = _tables(out)
        assert set(first_tables) <= set(after), (hit, set(after))
        second = _run_rows(after, "second", out)
        committed = []
        for name, rows in _run_rows(after, "first", out).items():
            if name in first:
                assert rows == first[name], f"{name}: the first run's rows changed (killed after {hit})"
            if name == "audit_runs":
                continue
            if second.get(name):
                assert second[name] == first[name], f"{name}: a partial second run (killed after {hit})"
                committed.append(name)
        assert not second.get("audit_runs"), f"the killed run is listed in audit_runs (killed after {hit})"
        for name, v in versions.items():
            assert _delta_version(out, name) >= v, name
        killed_at.append((hit.removeprefix(f"/{BUCKET}/killed-audit/"), committed, round(time.monotonic() - t0, 1)))
    assert killed_at[0][1] == [] and killed_at[-1][1], killed_at  # the first kill before, the last after commits

    # the rerun of the killed run id: the dead run's lock is taken over once stale, then the run completes
    time.sleep(ttl + 0.5)
    capsys.readouterr()
    _, opts = parse_args([*argv, "--run-id", "second"])
    with guard.out_lock(out, "second"):
        run_audit(spark, opts, print_summary=False)
    assert "took over the stale run lock" in capsys.readouterr().err
    print(f"first run {first_s:.1f} s; killed after (request, tables committed, s): {killed_at}; "
          f"rerun done at {time.monotonic() - t0:.1f} s")
    final = _tables(out)
    assert _run_rows(final, "first", out) == first and _run_rows(final, "second", out) == first
    assert guard.probe_lock(out) is None


def _delta_version(out: str, name: str) -> int:
    from deltalake import DeltaTable

    from jobs.delta import outfs

    table = outfs.join(out, name)
    return DeltaTable(table, storage_options=outfs.delta_options(table)).version()
