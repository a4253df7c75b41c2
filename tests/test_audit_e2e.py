"""The audit job end to end: ./spark-submit.sh demo (one subprocess with its own JVM, started first and
awaited by the last tests so that it overlaps the in-process runs), and run_audit in-process on the session
``spark``: Delta tables == the reconstruction's frames, idempotent re-runs, a run killed half-way then
completed, bodies.

Reference-broker stores are small (1 MiB CommitLog files, ~100-300 transactions) and every assertion against
the ground truth goes through the ledger (refbroker.ledger): reconstructed state == true outcome, per outcome.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

ROOT = Path(__file__).resolve().parent.parent
SUBMIT = ROOT / "spark-submit.sh"
AS_OF = "2026-11-21T12:00:00Z"
RUN_ID = "20261121T120000Z"
SMALL_TX = 120          # broker-a: 5.1+ crashy
LEGACY_TX = 60          # broker-b: 3.x legacy-3x (statetable + redolog)
SEED = 4242
SINK_COLS = ("run_id", "run_date")
DEMO_TIMEOUT = 1500


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------

def _delta(path):
    from deltalake import DeltaTable

    return DeltaTable(str(path))


def _run_rows(path, run_id=RUN_ID) -> pa.Table:
    return _delta(path).to_pyarrow_table(filters=[("run_id", "=", run_id)])


def _ledger(ledger_path):
    out = {}
    with open(ledger_path) as fh:
        for line in fh:
            e = json.loads(line)
            if e["kind"] == "transaction":
                out[e["transaction_key"]] = (e["outcome"], e["visible_outcome"])
    return out


def _match_ledger(tx: pa.Table, ledger: dict):
    """-> ({outcome: (matched, total)}, extra keys, mismatches)."""
    state = dict(zip(tx.column("transaction_key").to_pylist(), tx.column("state").to_pylist(), strict=True))
    matched, total, bad = Counter(), Counter(), []
    for key, (outcome, visible) in ledger.items():
        total[outcome] += 1
        if state.get(key) == outcome:
            matched[outcome] += 1
        else:
            bad.append((key, outcome, visible, state.get(key)))
    return {o: (matched[o], total[o]) for o in total}, sorted(set(state) - set(ledger)), bad


def _audit_options(store, out, *extra):
    from jobs.main import parse_args

    _, opts = parse_args(["audit", "--store", str(store), "--out", str(out), "--as-of", AS_OF, *extra])
    return opts


def _frame_of(spark, table: pa.Table, columns):
    """Arrow rows read from Delta -> Spark DataFrame with the reconstruction's columns, in order."""
    return spark.createDataFrame(table.select(list(columns)))


def _counts(out, names):
    return {n: _run_rows(Path(out) / n).num_rows for n in names}


# ------------------------------------------------------------------------------------------------------------
# fixtures
# ------------------------------------------------------------------------------------------------------------

class _Demo:
    """``./spark-submit.sh demo`` in a subprocess (own session/process group; killed if never awaited)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.out = workdir / "demo-out"
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            ["bash", str(SUBMIT), "--conf", "spark.ui.enabled=false", "demo", "--as-of", AS_OF],
            cwd=str(workdir), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            text=True, env=env, start_new_session=True)
        self._result = None

    def result(self):
        if self._result is None:
            out, err = self.proc.communicate(timeout=DEMO_TIMEOUT)
            self._result = (self.proc.returncode, out, err, time.monotonic() - self.t0)
        return self._result

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module", autouse=True)
def demo_process(request, tmp_path_factory):
    """Started before the first test of the module when any selected test needs the demo, so the subprocess
    runs while the in-process tests do."""
    mine = [i for i in request.session.items if i.module is request.module]
    if not any("demo_run" in i.fixturenames for i in mine):
        yield None
        return
    demo = _Demo(tmp_path_factory.mktemp("demo-cwd"))
    yield demo
    demo.kill()


@pytest.fixture(scope="module")
def demo_run(demo_process):
    code, out, err, secs = demo_process.result()
    print(f"\n./spark-submit.sh demo: exit {code} in {secs:.1f} s")
    assert code == 0, f"demo failed (exit {code})\nstdout:\n{out[-4000:]}\nstderr:\n{err[-6000:]}"
    return demo_process, out, err, secs


@pytest.fixture(scope="module")
def small_stores(tmp_path_factory):
    """Two brokers audited together: a 5.1+ store with crashes and a 3.x store (statetable/redolog)."""
    from refbroker import generate

    base = tmp_path_factory.mktemp("small")
    return {"broker-a": generate("5.1+", "crashy", SMALL_TX, SEED, base / "broker-a", commitlog_file_mb=1),
            "broker-b": generate("3.x", "legacy-3x", LEGACY_TX, SEED, base / "broker-b", commitlog_file_mb=1)}


def _store_args(stores):
    return [a for r in stores.values() for a in ("--store", str(r.store_dir))]


@pytest.fixture(scope="module")
def first_run(spark, small_stores, tmp_path_factory):
    """One complete in-process audit (full mode, no bodies), with the reconstruction's frames compared to the
    tables inside run_audit's on_result hook (while they are still persisted)."""
    from jobs.audit.run import run_audit

    out = tmp_path_factory.mktemp("out")
    opts = _audit_options(small_stores["broker-a"].store_dir, out, "--mode", "full",
                          *_store_args(small_stores)[2:])
    compared = {}

    def on_result(result, summary):
        from pyspark.testing import assertDataFrameEqual

        from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES, RECOVERY, TRANSACTIONS

        for logical, df, table in (("transactions", result.transactions, TRANSACTIONS),
                                   ("check_back_worklist", result.check_back, CHECK_BACK),
                                   ("recovery_worklist", result.recovery, RECOVERY),
                                   ("audit_anomalies", result.anomalies, AUDIT_ANOMALIES),
                                   ("profiles", result.profiles, PROFILES)):
            rows = _run_rows(summary.tables[logical].path)
            assertDataFrameEqual(_frame_of(spark, rows, table.names), df.select(*table.names),
                                 checkRowOrder=False)
            compared[logical] = rows.num_rows

    t0 = time.monotonic()
    summary = run_audit(spark, opts, on_result=on_result)
    return {"summary": summary, "out": out, "opts": opts, "compared": compared,
            "seconds": time.monotonic() - t0}


# ------------------------------------------------------------------------------------------------------------
# driver-side pieces (no Spark)
# ------------------------------------------------------------------------------------------------------------

def test_store_fingerprint_is_a_listing_hash(tmp_path):
    from jobs.audit.run import store_fingerprint

    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    f = root / "commitlog" / "00000000000000000000"
    f.write_bytes(b"x" * 100)
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    fp1, n, size = store_fingerprint([("b", str(root))])
    assert (n, size) == (1, 100)
    f.write_bytes(b"y" * 100)                                   # same size and mtime: content is not read
    os.utime(f, ns=(1_000_000_000, 1_000_000_000))
    assert store_fingerprint([("b", str(root))])[0] == fp1
    os.utime(f, ns=(2_000_000_000, 2_000_000_000))
    assert store_fingerprint([("b", str(root))])[0] != fp1
    assert store_fingerprint([("other", str(root))])[0] != store_fingerprint([("b", str(root))])[0]


def test_params_follow_the_config_profiles(tmp_path):
    from jobs.audit.run import audit_params
    from jobs.config import load_audit_config
    from jobs.reconstruct.spark import PROFILES

    cfg = load_audit_config()
    params, override, doc = audit_params(cfg, "auto", 123)
    assert override is None and set(params) == set(PROFILES)
    assert params["5.1+"].transactionCheckInterval == 30000 and params["5.1+"].as_of_ms == 123
    assert params["3.x"].transactionCheckMax is None and params["3.x"].fileReservedTime == 48
    assert params["4.0-4.2"].transactionCheckInterval is None
    conf = tmp_path / "c.properties"
    conf.write_text("broker.transactionTimeOut=3000\nbroker.transactionCheckMax=5\n")
    cfg = load_audit_config(conf, {"broker.profile": "4.3-4.5"})
    p, override, doc = audit_params(cfg, cfg.broker_profile, 7)
    assert override == "4.3-5.0"
    assert (p.transactionTimeOut, p.transactionCheckMax, p.as_of_ms) == (3000, 5, 7)
    assert doc["4.3-5.0"]["broker_profile"] == "4.3-4.5"


def test_auto_shuffle_partitions():
    from jobs.audit.run import auto_shuffle_partitions

    class Conf:
        def __init__(self, explicit, value):
            self.explicit, self.value = explicit, value

        def contains(self, key):
            return self.explicit

        def get(self, key):
            return self.value

    class Spark:
        def __init__(self, explicit=False, value="200", cores=2):
            self.conf = Conf(explicit, value)
            self.sparkContext = type("SC", (), {"defaultParallelism": cores,
                                                "getConf": lambda _self: self.conf})()

    assert auto_shuffle_partitions(Spark(), 3 << 20) == 4
    assert auto_shuffle_partitions(Spark(cores=16), 3 << 20) == 16
    assert auto_shuffle_partitions(Spark(), 10 << 30) == 40
    assert auto_shuffle_partitions(Spark(), 1 << 40) == 200
    assert auto_shuffle_partitions(Spark(explicit=True), 3 << 20) is None
    assert auto_shuffle_partitions(Spark(value="8"), 3 << 20) is None
    asked = []
    spark = Spark()
    spark.sparkContext.getConf = lambda: asked.append(1) or spark.conf
    assert [auto_shuffle_partitions(spark, 3 << 20) for _ in range(3)] == [4, 4, 4]
    assert len(asked) == 1                  # the context's start-up conf is copied once, not per run


# ------------------------------------------------------------------------------------------------------------
# in-process: tables vs frames, audit_runs, ledger
# ------------------------------------------------------------------------------------------------------------

TABLES = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies", "profiles")


def test_delta_tables_equal_reconstruction_frames(first_run):
    s = first_run["summary"]
    print(f"\nin-process audit: {first_run['seconds']:.1f} s, phases "
          + ", ".join(f"{k} {v:.1f}" for k, v in s.phases.items() if "." not in k))
    assert set(first_run["compared"]) == set(TABLES)
    assert first_run["compared"]["transactions"] == s.transactions == SMALL_TX + LEGACY_TX
    assert {b: sum(n.values()) for b, n in s.states_by_broker.items()} == {"broker-a": SMALL_TX,
                                                                           "broker-b": LEGACY_TX}
    for name in TABLES:
        assert s.tables[name].rows == first_run["compared"][name]
        assert Path(s.tables[name].path) == Path(first_run["out"]) / name
    # partitioning and column comments come from the schemas
    from schemas.audit import TRANSACTIONS

    dt_ = _delta(s.tables["transactions"].path)
    assert dt_.metadata().partition_columns == ["run_date", "broker", "run_id"]
    field = dt_.schema().to_arrow().field("state")
    assert (field.metadata or {}).get(b"comment", b"").decode() == TRANSACTIONS.column("state").comment


@pytest.mark.parametrize("broker", ["broker-a", "broker-b"])
def test_states_equal_ledger_outcomes_small_stores(first_run, small_stores, broker):
    tx = _run_rows(first_run["summary"].tables["transactions"].path)
    tx = tx.filter(pc.equal(tx.column("broker"), broker))
    per_outcome, extra, bad = _match_ledger(tx, _ledger(small_stores[broker].ledger_path))
    print(f"\n{broker} (full mode) matched/total: "
          + ", ".join(f"{o} {m}/{t}" for o, (m, t) in sorted(per_outcome.items())))
    assert not extra, extra[:5]
    assert not bad, bad[:10]


def test_audit_runs_row(first_run, small_stores):
    from jobs.audit.run import store_fingerprint

    s = first_run["summary"]
    runs = _run_rows(s.tables["audit_runs"].path).to_pylist()
    assert len(runs) == 1
    r = runs[0]
    assert r["run_id"] == RUN_ID and r["status"] == "COMPLETE" and r["mode"] == "full"
    assert r["as_of_ms"] == int(dt.datetime(2026, 11, 21, 12, tzinfo=dt.timezone.utc).timestamp() * 1000)
    assert r["run_date"] == dt.date(2026, 11, 21)
    assert r["brokers"] == ["broker-a", "broker-b"]
    assert r["stores"] == [str(small_stores[b].store_dir) for b in ("broker-a", "broker-b")]
    assert dict(r["profiles"]) == {"broker-a": "5.1+", "broker-b": "3.x"}
    fp, n_files, n_bytes = store_fingerprint([(b, str(small_stores[b].store_dir))
                                              for b in ("broker-a", "broker-b")])
    assert (r["store_fingerprint"], r["store_files"], r["store_bytes"]) == (fp, n_files, n_bytes)
    assert r["transactions"] == s.transactions == sum(dict(r["state_counts"]).values())
    assert dict(r["state_counts"]) == s.states
    assert dict(r["table_rows"]) == {k: t.rows for k, t in s.tables.items() if k != "audit_runs"}
    assert {"plan", "read", "reconstruct", "aggregate", "write"} <= set(dict(r["phase_seconds"]))
    assert r["writer"] == "delta-rs" and r["include_bodies"] is False
    assert r["started_at"] <= r["finished_at"]
    cfg = json.loads(r["config_json"])
    assert cfg["mode"] == "full" and cfg["broker_profile"] == "auto"
    assert cfg["params"]["5.1+"]["as_of_ms"] == r["as_of_ms"]
    assert cfg["params"]["5.1+"]["transactionCheckInterval"] == 30000


def test_no_bodies_by_default(first_run):
    out = Path(first_run["out"])
    assert not (out / "message_bodies").exists()
    for name in TABLES + ("audit_runs",):
        names = _delta(out / name).schema().to_arrow().names
        assert not [n for n in names if "body" in n], (name, names)


def test_summary_text(first_run):
    from jobs.audit.summary import format_summary

    text = format_summary(first_run["summary"])
    assert f"TxAudit run {RUN_ID}" in text
    s = first_run["summary"]
    assert re.search(r"\s+broker-a\s+broker-b\s+total", text), text          # one column per broker
    for state, n in s.states.items():
        per = r"\s+".join(str(s.states_by_broker[b].get(state, 0)) for b in ("broker-a", "broker-b"))
        assert re.search(rf"{state}\s+{per}\s+{n}\b", text), text
    assert "Work lists: check_back_worklist" in text and "Elapsed" in text
    assert str(first_run["out"]) in text


# ------------------------------------------------------------------------------------------------------------
# in-process: a run killed half-way, then the next run completes it (same run id = same stores + as-of)
# ------------------------------------------------------------------------------------------------------------

class _Killed(RuntimeError):
    pass


def _rerun_options(first_run, *extra):
    """The first run's stores, out and as-of (hence its run id), plus ``extra`` options."""
    o = first_run["opts"]
    return _audit_options(o.stores[0], first_run["out"], "--mode", "full",
                          *[a for s in o.stores[1:] for a in ("--store", s)], *extra)


def test_killed_run_leaves_readable_tables_and_rerun_completes(spark, first_run, monkeypatch):
    from jobs.audit import run as audit
    from jobs.delta import sink as delta_sink

    out = Path(first_run["out"])
    before = _counts(out, TABLES + ("audit_runs",))
    runs_before = _run_rows(out / "audit_runs").to_pylist()
    versions_before = {n: _delta(out / n).version() for n in TABLES + ("audit_runs",)}

    # attempt 2 (with bodies): transactions and check_back_worklist are committed; recovery_worklist gets its
    # data files written and the process "dies" before its commit
    real_write, real_commit = delta_sink.write_table, delta_sink._commit_files
    written = []

    def write_table(df, out_dir, table, *a, **k):
        r = real_write(df, out_dir, table, *a, **k)
        written.append(table.name)
        return r

    def commit_files(root, table, *a, **k):
        if table.name == "recovery_worklist":
            raise _Killed("killed before the recovery_worklist commit")
        return real_commit(root, table, *a, **k)

    monkeypatch.setattr(delta_sink, "write_table", write_table)
    monkeypatch.setattr(delta_sink, "_commit_files", commit_files)
    with pytest.raises(_Killed):
        audit.run_audit(spark, _rerun_options(first_run, "--include-bodies"), print_summary=False)
    monkeypatch.undo()
    assert written == ["transactions", "check_back_worklist"]

    # every table is readable; the committed ones hold this run's rows once (replaced, not appended); the
    # rerun retracted the run id's COMPLETE row first (one commit), so the half-done run is not listed
    assert _counts(out, TABLES) == {n: before[n] for n in TABLES}
    versions_mid = {n: _delta(out / n).version() for n in TABLES + ("audit_runs",)}
    assert versions_mid["transactions"] == versions_before["transactions"] + 1
    assert versions_mid["check_back_worklist"] == versions_before["check_back_worklist"] + 1
    assert versions_mid["audit_runs"] == versions_before["audit_runs"] + 1
    for n in ("recovery_worklist", "audit_anomalies", "profiles"):
        assert versions_mid[n] == versions_before[n], n
    # the uncommitted data files are on disk but not part of the table
    on_disk = {str(p) for p in (out / "recovery_worklist").rglob("*.parquet")}
    referenced = set(_delta(out / "recovery_worklist").file_uris())
    assert referenced < on_disk
    assert _run_rows(out / "audit_runs").to_pylist() == []      # the interrupted rerun is not listed
    assert not (out / "message_bodies").exists()

    # attempt 3: same stores, same as-of -> same run id; completes every table
    s3 = audit.run_audit(spark, _rerun_options(first_run, "--include-bodies"))
    after = _counts(out, TABLES + ("audit_runs",))
    assert after == before, (before, after)
    runs = _run_rows(out / "audit_runs").to_pylist()
    assert len(runs) == 1 and runs[0]["include_bodies"] is True
    assert runs[0]["finished_at"] > runs_before[0]["finished_at"]
    for n in TABLES + ("audit_runs",):
        assert _delta(out / n).version() > versions_before[n], n
    assert s3.states == first_run["summary"].states

    # bodies: one row per transaction whose message record survives, with the stored bytes
    bodies = _run_rows(out / "message_bodies")
    assert 0 < bodies.num_rows <= s3.transactions
    rows = bodies.to_pylist()
    assert all(r["body"] is not None and len(r["body"]) == r["body_size"] for r in rows)
    assert {r["record"] for r in rows} <= {"HALF", "PREPARED", "COMMIT", "DISCARD"}
    assert {r["broker"] for r in rows} == {"broker-a", "broker-b"}
    keys = set(_run_rows(out / "transactions").column("transaction_key").to_pylist())
    assert {r["transaction_key"] for r in rows} <= keys
    # spot-check one body against the CommitLog bytes
    from txlog_io.commitlog import decode_at

    r = rows[0]
    store = Path(dict(zip(first_run["opts"].brokers, first_run["opts"].stores, strict=True))[r["broker"]])
    files = sorted((store / "commitlog").iterdir())
    base = max(int(f.name) for f in files if int(f.name) <= r["commitlog_offset"])
    batch, _ = decode_at(str(store / "commitlog" / f"{base:020d}"), [r["commitlog_offset"] - base],
                         base_offset=base, with_body=True)
    assert batch.column("body")[0].as_py() == r["body"]


# ------------------------------------------------------------------------------------------------------------
# ./spark-submit.sh demo (subprocess, started at module start)
# ------------------------------------------------------------------------------------------------------------

def test_demo_end_to_end(demo_run):
    demo, out, err, secs = demo_run
    tables = demo.out
    for name in TABLES + ("audit_runs",):
        assert (tables / name / "_delta_log").is_dir(), name
    assert (tables / "demo-store" / "store" / "commitlog").is_dir()
    assert (tables / "demo-store" / "ledger.jsonl").is_file()
    assert f"TxAudit run {RUN_ID}" in out
    assert "Compared with the reference broker's ledger" in out
    runs = _run_rows(tables / "audit_runs").to_pylist()
    assert len(runs) == 1 and runs[0]["mode"] == "indexed" and runs[0]["brokers"] == ["demo-store"]
    assert dict(runs[0]["profiles"]) == {"demo-store": "5.1+"}


def test_demo_states_equal_ledger(demo_run):
    from jobs.demo import DEMO_TRANSACTIONS

    demo, out, err, secs = demo_run
    tx = _run_rows(demo.out / "transactions")
    assert tx.num_rows == DEMO_TRANSACTIONS
    ledger = _ledger(demo.out / "demo-store" / "ledger.jsonl")
    per_outcome, extra, bad = _match_ledger(tx, ledger)
    print("\ndemo (crashy, 5.1+, indexed) matched/total: "
          + ", ".join(f"{o} {m}/{t}" for o, (m, t) in sorted(per_outcome.items())))
    assert set(per_outcome) == {"COMMITTED", "ROLLED_BACK", "DISCARDED", "PREPARED"}   # all outcomes occur
    assert not extra, extra[:5]
    assert not bad, bad[:10]
    # the demo printed the same comparison
    for outcome, (m, t) in per_outcome.items():
        assert re.search(rf"{outcome}\s+{m}/{t}\b", out), out[-3000:]
