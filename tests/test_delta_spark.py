"""The Spark Delta writer (``delta.writer=spark``) with delta-spark's own jars, fetched from Maven Central by
scripts/fetch-jars.sh into a cache outside the repository (skipped, loudly, only when Central cannot be
reached on a machine that has not fetched them yet).

One module-scoped run of ``./spark-submit.sh audit`` subprocesses over the 5.3.3 fixture, A in a bucket of
the loopback S3 server (moto's; hadoop-aws's S3A file system), B on disk:

1. A: ``--with-jars delta,s3a`` + ``delta.writer=spark`` + ``--out s3a://...``; B: the default delta-rs writer
   on disk (in parallel);
2. the same run id again with the OTHER writer: delta-rs over A (in the bucket), Spark (``replaceWhere``) over
   B (on disk) (in parallel);
3. one delta-spark process (tests/delta_spark_probe.py) reads every table of A and B, now and (time travel)
   at the version step 1 wrote; in the same JVM it copies A's transactions table with the Spark writer to
   another prefix of the bucket and to a new table on disk (each written, then re-written), and reads B's
   transactions table uploaded to the bucket as is.

Then: both writers' tables hold the same rows, schema, column comments and partitions, read by either
reader (so the whole Spark-writer audit into the bucket equals the delta-rs audit on disk table by table,
every commit Spark's); a re-run by the other writer replaces the run (same rows, one more version) and the
history shows both writers' commits.  On S3: the Spark writer writes and re-writes tables under ``s3a://``,
delta-rs reads them back; Spark reads delta-rs-written tables there.  Tables in the bucket are read by delta-rs
in a child process (see :func:`_remote_snapshots`).
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import FIXTURES, ROOT

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SUBMIT = ROOT / "spark-submit.sh"
FETCH = ROOT / "scripts" / "fetch-jars.sh"
PROBE = ROOT / "tests" / "delta_spark_probe.py"
STORE = FIXTURES / "rocketmq-5.3.3" / "store"
BUCKET = "txaudit-out"
A_OUT = f"s3a://{BUCKET}/A"                  # the Spark writer's first audit, into the bucket
AS_OF = "2026-11-21T12:00:00Z"
RUN_ID = "r1"
TABLES = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies", "profiles",
          "store_files", "audit_runs")
# audit_runs columns that differ between two runs of the same audit (times, writer, where it wrote)
RUN_VOLATILE = {"started_at", "finished_at", "elapsed_s", "phase_seconds", "writer", "config_json",
                "table_paths", "out"}
TIMEOUT = 1800
SPARK_CONF = ["--conf", "spark.ui.enabled=false", "--conf", "spark.ui.showConsoleProgress=false",
              "--conf", "spark.sql.shuffle.partitions=2",
              "--conf", "spark.databricks.delta.snapshotPartitions=2"]


def _cache() -> Path:
    return Path(os.environ.get("TXAUDIT_CACHE") or Path.home() / ".cache" / "txaudit")


def _jars(*sets: str) -> list:
    """The fetched jar sets (fetch-jars.sh runs once per set; exit 3 = Maven Central unreachable: skip)."""
    for s in sets:
        if (_cache() / "jars" / s / ".complete").exists():
            continue
        p = subprocess.run(["bash", str(FETCH), s], capture_output=True, text=True, timeout=TIMEOUT,
                           stdin=subprocess.DEVNULL)
        if p.returncode == 3:
            msg = f"delta-spark jars ({s}) could not be fetched from Maven Central: {p.stderr.strip()[-800:]}"
            warnings.warn(msg, stacklevel=2)
            pytest.skip(msg)
        assert p.returncode == 0, f"fetch-jars.sh {s}: exit {p.returncode}\n{p.stderr[-2000:]}"
    return sorted(j for s in sets for j in glob.glob(str(_cache() / "jars" / s / "*.jar")))


def _audit(out: str, writer: str, conf_dir: Path, env: dict) -> subprocess.Popen:
    conf = conf_dir / f"{writer}.properties"
    conf.write_text(f"delta.writer={writer}\n")
    jars = [] if writer != "spark" else ["--with-jars", "delta,s3a" if out.startswith("s3a://") else "delta"]
    argv = ["bash", str(SUBMIT), "--master", "local[2]", *jars, *SPARK_CONF, "audit", "--store", str(STORE),
            "--out", out, "--as-of", AS_OF, "--run-id", RUN_ID, "--conf-file", str(conf), "--no-report"]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            text=True, env=dict(env, SPARK_LOCAL_IP="127.0.0.1"), start_new_session=True)


def _wait(*procs: subprocess.Popen) -> list:
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=TIMEOUT)
        assert p.returncode == 0, f"{p.args}: exit {p.returncode}\n{out[-3000:]}\n{err[-5000:]}"
        outs.append(out)
    return outs


def _probe(jars: list, *args: str, env=None) -> str:
    env = dict(env or os.environ, TXAUDIT_PROBE_JARS=",".join(jars), SPARK_LOCAL_IP="127.0.0.1")
    p = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=TIMEOUT,
                       stdin=subprocess.DEVNULL, env=env, cwd=str(ROOT))
    assert p.returncode == 0, f"probe {args[0]}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-6000:]}"
    return p.stdout


def _snapshot(path: str, version=None, storage_options=None) -> dict:
    """One table as delta-rs reads it: rows, schema (with comments), partitions, history."""
    from deltalake import DeltaTable

    dt = DeltaTable(path, version=version, storage_options=storage_options)
    schema = pa.schema(dt.schema().to_arrow())
    return {"rows": dt.to_pyarrow_table(), "version": dt.version(), "description": dt.metadata().description,
            "fields": [(f.name, str(f.type), f.nullable, (f.metadata or {}).get(b"comment", b"").decode() or None)
                       for f in schema],
            "partitions": list(dt.metadata().partition_columns),
            "history": sorted(dt.history(), key=lambda h: h["version"])}


def _canonical(tbl: pa.Table, name: str) -> list:
    drop = RUN_VOLATILE if name == "audit_runs" else set()
    cols = [c for c in tbl.column_names if c not in drop]
    rows = tbl.select(cols).to_pylist()
    return sorted((json.dumps(r, sort_keys=True, default=str) for r in rows))


def _engine(commit: dict) -> str:
    return "spark" if "Apache-Spark" in str(commit.get("engineInfo", "")) else \
        "delta-rs" if "delta-rs" in str(commit.get("clientVersion", "")) else repr(commit)


@pytest.mark.parametrize("sets, expect", [("nope", "unknown jar set 'nope'"),
                                           ("delta", "not fetched into")])
def test_with_jars_refuses_what_is_not_there(tmp_path, sets, expect):
    """Before any JVM: an unknown set, or a set not fetched into the cache, is exit 2 and one line."""
    env = dict(os.environ, TXAUDIT_CACHE=str(tmp_path / "empty-cache"))
    p = subprocess.run(["bash", str(SUBMIT), "--with-jars", sets, "audit", "--store", str(STORE),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, env=env,
                       stdin=subprocess.DEVNULL, timeout=300)
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("txaudit: error: --with-jars") and expect in lines[0]
    assert not (tmp_path / "out").exists()


def test_uri_out_is_kept_a_uri_and_a_relative_out_made_absolute(tmp_path, monkeypatch):
    from jobs.delta import sink
    from schemas.audit import PROFILES

    monkeypatch.chdir(tmp_path)
    assert sink.table_path("s3a://bucket/out/", PROFILES) == "s3a://bucket/out/profiles"
    assert sink.table_path("rel", PROFILES) == str(tmp_path / "rel" / "profiles")
    assert list(tmp_path.iterdir()) == []               # nothing written locally (no "s3a:" directory)


def test_fetch_jars_names_the_artifacts_of_the_venvs_pyspark():
    import pyspark

    p = subprocess.run(["bash", str(FETCH), "--print"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    minor = ".".join(pyspark.__version__.split(".")[:2])
    lines = dict(line.split(" ", 1) for line in p.stdout.strip().splitlines())
    assert lines["delta"].startswith(f"io.delta:delta-spark_{minor}_2.13:")
    hadoop = sorted(glob.glob(os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")))
    assert lines["s3a"] == "org.apache.hadoop:hadoop-aws:" + Path(hadoop[0]).stem.rsplit("-", 1)[1]


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("moto", reason="moto[server] (test extra) runs the local S3 server")
    from jobs.bench.s3server import LocalS3

    with LocalS3() as server:
        server.create_bucket(BUCKET)
        yield server


def _bucket_writes(s3, mark: int, prefix: str) -> list:
    """Successful PUT/POST requests below ``/BUCKET/prefix/`` since log entry ``mark``."""
    return [r for r in s3.log[mark:] if r.method in ("PUT", "POST") and 200 <= r.status < 300
            and r.path.startswith(f"/{BUCKET}/{prefix}/")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, s3):
    from jobs.config import delta_storage_options, object_store_settings

    jars = _jars("delta", "s3a")
    work = tmp_path_factory.mktemp("delta-spark")
    env = dict(os.environ, **s3.env())
    opts = delta_storage_options(object_store_settings(env))
    b = work / "B"
    where = {"A": A_OUT, "B": str(b)}
    t0 = time.monotonic()
    mark = len(s3.log)
    first = _wait(_audit(A_OUT, "spark", work, env), _audit(str(b), "delta-rs", work, env))
    t1 = time.monotonic()
    a_writes = _bucket_writes(s3, mark, "A")
    a_summary = s3.summary(mark, bucket=BUCKET)
    phase1 = {"A": _remote_snapshots(A_OUT, TABLES, opts, work / "snap1"),
              "B": {n: _snapshot(str(b / n)) for n in TABLES}}
    t2 = time.monotonic()
    second = _wait(_audit(A_OUT, "delta-rs", work, env), _audit(str(b), "spark", work, env))
    t3 = time.monotonic()
    phase2 = {"A": _remote_snapshots(A_OUT, TABLES, opts, work / "snap2"),
              "B": {n: _snapshot(str(b / n)) for n in TABLES}}
    # B's transactions (v0 delta-rs, v1 Spark on disk) uploaded as is, for Spark to read in the bucket
    s3.upload(str(b / "transactions"), BUCKET, "uploaded/transactions")
    keys = [(w, n) for w in ("A", "B") for n in TABLES]
    mark = len(s3.log)
    t4 = time.monotonic()
    probe_out = _probe(jars, "read", str(work / "dump"),
                       *[f"{where[w]}/{n}@{phase1[w][n]['version']}" for w, n in keys],
                       "+", "copy", A_OUT, f"s3a://{BUCKET}/spark", "transactions",
                       "+", "copy", A_OUT, str(work / "spark-local"), "transactions",
                       "+", "read", str(work / "s3dump"), f"s3a://{BUCKET}/uploaded/transactions", env=env)
    t5 = time.monotonic()
    copy_writes = _bucket_writes(s3, mark, "spark")
    spark_read = {}
    for i, key in enumerate(keys):
        info = json.loads((work / "dump" / f"{i}.json").read_text())
        info["latest"] = pq.read_table(work / "dump" / f"{i}-latest.parquet")
        info["at"] = pq.read_table(work / "dump" / f"{i}-at.parquet")
        spark_read[key] = info
    print(f"\ndelta-spark: audits 1-2 {t1 - t0:.1f} s, snapshots {t2 - t1:.1f} s, audits 3-4 {t3 - t2:.1f} s, "
          f"snapshots + upload {t4 - t3:.1f} s, probe {t5 - t4:.1f} s; {time.monotonic() - t0:.1f} s in all")
    return {"jars": jars, "work": work, "opts": opts, "stdout": first + second, "phase1": phase1,
            "phase2": phase2, "spark": spark_read, "a_writes": a_writes, "a_summary": a_summary,
            "probe_out": probe_out, "copy_writes": copy_writes}


def test_spark_writer_writes_the_audit(runs):
    a_spark, b_rs, a_rs, b_spark = runs["stdout"]
    assert "writer spark" in a_spark and "writer spark" in b_spark
    assert "writer delta-rs" in b_rs and "writer delta-rs" in a_rs
    p1 = runs["phase1"]
    for name in TABLES:
        assert [_engine(h) for h in p1["A"][name]["history"]][-1] == "spark", name
        assert [_engine(h) for h in p1["B"][name]["history"]][-1] == "delta-rs", name
    assert p1["A"]["transactions"]["rows"].num_rows > 0
    assert p1["A"]["audit_runs"]["rows"].column("writer").to_pylist() == ["spark"]
    assert p1["B"]["audit_runs"]["rows"].column("writer").to_pylist() == ["delta-rs"]


def test_both_writers_write_the_same_tables(runs):
    p1 = runs["phase1"]
    for name in TABLES:
        a, b = p1["A"][name], p1["B"][name]
        assert a["fields"] == b["fields"], name                 # names, types, nullability, comments
        assert any(f[3] for f in a["fields"]), name
        assert a["partitions"] == b["partitions"] and "run_id" in a["partitions"], name
        assert a["description"] == b["description"], name
        assert _canonical(a["rows"], name) == _canonical(b["rows"], name), name


def test_a_rerun_by_the_other_writer_replaces_the_run(runs):
    p1, p2 = runs["phase1"], runs["phase2"]
    for w, other in (("A", "delta-rs"), ("B", "spark")):
        for name in TABLES:
            before, after = p1[w][name], p2[w][name]
            assert _canonical(after["rows"], name) == _canonical(before["rows"], name), (w, name)
            assert after["fields"] == before["fields"] and after["partitions"] == before["partitions"]
            if before["rows"].num_rows or other == "delta-rs":
                assert after["version"] > before["version"], (w, name)
                assert _engine(after["history"][-1]) == other, (w, name)
            else:       # Spark commits only when there is something to remove or add (commitIfNeeded)
                assert after["version"] == before["version"], (w, name)
    last = p2["B"]["transactions"]["history"][-1]          # Spark's replaceWhere over a delta-rs table
    assert last["operation"] == "WRITE" and "run_id" in str(last["operationParameters"].get("predicate"))


def test_delta_spark_reads_what_either_writer_wrote(runs):
    p1, p2 = runs["phase1"], runs["phase2"]
    for (w, name), info in runs["spark"].items():
        dr = p2[w][name]
        assert info["partition_columns"] == dr["partitions"], (w, name)
        assert [(f[0], f[2], f[3]) for f in info["fields"]] == [(f[0], f[2], f[3]) for f in dr["fields"]], \
            (w, name)                                     # names, nullability, comments
        assert info["description"] == dr["description"], (w, name)
        assert [h["version"] for h in info["history"]] == [h["version"] for h in dr["history"]], (w, name)
        assert _canonical(info["latest"], name) == _canonical(dr["rows"], name), (w, name)
        # time travel to step 1's version: A's was written by Spark, B's by delta-rs
        assert _canonical(info["at"], name) == _canonical(p1[w][name]["rows"], name), (w, name)


def _dump_snapshots(root: str, names: list, opts: dict, dump: str) -> None:
    """:func:`_snapshot` of each table ``root/<name>``: ``dump/<name>.parquet`` (rows), ``dump/<name>.json``."""
    Path(dump).mkdir(parents=True, exist_ok=True)
    for name in names:
        s = _snapshot(f"{root}/{name}", storage_options=opts)
        pq.write_table(s.pop("rows"), Path(dump) / f"{name}.parquet")
        (Path(dump) / f"{name}.json").write_text(json.dumps(s, default=str))


def _remote_snapshots(root: str, names, opts: dict, dump: Path) -> dict:
    """:func:`_snapshot` of tables on the loopback S3 server, taken in one child process: some deltalake calls
    (``history``) hold the GIL, and the server answers from a thread of this process.  The child ends through
    txlog_io.process_exit as the project's commands do: a pyarrow I/O thread still reading through deltalake's
    file system when the interpreter finalizes aborts the process ("terminate called without an active
    exception", seen once in a fresh-clone run after the JSON was printed)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from tests.test_delta_spark import _dump_snapshots; "
            "from txlog_io import process_exit\n"
            "process_exit.run(_dump_snapshots, sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]), "
            "sys.argv[5])")
    p = subprocess.run([sys.executable, "-c", code, str(ROOT), root, json.dumps(list(names)), json.dumps(opts),
                        str(dump)], capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
                       cwd=str(ROOT))
    assert p.returncode == 0, p.stderr[-3000:]
    out = {}
    for name in names:
        s = json.loads((dump / f"{name}.json").read_text())
        s["fields"] = [tuple(f) for f in s["fields"]]
        s["rows"] = pq.read_table(dump / f"{name}.parquet")
        out[name] = s
    return out


def test_spark_writer_on_s3a(runs):
    """The probe's Spark writer wrote A's transactions (read from the bucket) to another prefix, and to a new
    table on disk, twice each (the second a replaceWhere); delta-rs reads them back; Spark read B's table
    uploaded as is (v0 delta-rs, v1 Spark)."""
    assert runs["copy_writes"], "the Spark writer wrote nothing under s3a://txaudit-out/spark/"
    name = "transactions"
    copies = {"bucket": _remote_snapshots(f"s3a://{BUCKET}/spark", [name], runs["opts"],
                                          runs["work"] / "snap-copy")[name],
              "disk": _snapshot(str(runs["work"] / "spark-local" / name))}
    for where, got in copies.items():
        local = runs["phase2"]["A"][name]
        assert _canonical(got["rows"], name) == _canonical(local["rows"], name), where
        assert got["fields"] == local["fields"] and got["partitions"] == local["partitions"], where
        assert [(_engine(h), h["operation"]) for h in got["history"]] == \
            [("spark", "CREATE TABLE")] + [("spark", "WRITE")] * 2, where
    assert runs["probe_out"].count(f"probe: {name}:") == 2, runs["probe_out"]
    uploaded = runs["phase2"]["B"]["transactions"]
    assert [_engine(h) for h in uploaded["history"]] == ["delta-rs", "spark"]
    info = json.loads((runs["work"] / "s3dump" / "0.json").read_text())
    assert [h["version"] for h in info["history"]] == [h["version"] for h in uploaded["history"]]
    rows = pq.read_table(runs["work"] / "s3dump" / "0-latest.parquet")
    assert _canonical(rows, "transactions") == _canonical(uploaded["rows"], "transactions")


def test_spark_writer_audit_into_a_bucket_equals_the_delta_rs_audit_on_disk(runs):
    """A's first audit, ``./spark-submit.sh --with-jars delta,s3a`` with ``delta.writer=spark`` and ``--out
    s3a://...`` (Hadoop's S3A file system writes the tables; delta-rs retracts, pyarrow writes the work lists, the
    run lock is the bucket's lock object): table by table the same rows, schema, comments and partitions as the
    default writer's audit of the same store on disk (step 1's B), and every commit is Spark's."""
    assert "writer spark" in runs["stdout"][0], runs["stdout"][0][-2000:]
    writes = runs["a_writes"]
    assert any("/transactions/_delta_log/" in r.path for r in writes)
    for name in TABLES:
        got, want = runs["phase1"]["A"][name], runs["phase1"]["B"][name]
        assert _canonical(got["rows"], name) == _canonical(want["rows"], name), name
        assert got["fields"] == want["fields"], name
        assert got["partitions"] == want["partitions"] and got["description"] == want["description"], name
        assert {_engine(h) for h in got["history"]} == {"spark"}, (name, got["history"])
    assert runs["a_summary"]["writes"] >= len(writes) > 0
    print(f"\nspark writer audit into {A_OUT}: {len(writes)} objects written")
