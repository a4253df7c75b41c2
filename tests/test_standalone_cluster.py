"""The audit as a scheduled ``spark-submit`` on a real Spark standalone cluster (tests/standalone.py: a Master and
one 1-core Worker on 127.0.0.1): ``./spark-submit.sh --master spark://... audit`` with ``reconstruct.path=
distributed`` writes the same Delta tables, table by table, as a ``--master local[2]`` audit of the same stores
on the driver path; the cluster run records the distributed path, its reduce time was spent on the executors,
and the Worker's executor ran the job's Python tasks.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from conftest import ROOT
from standalone import standalone_cluster  # noqa: F401  (the module-scoped cluster fixture)
from test_full_read import _rows

from refbroker.generate import DEFAULT_START_MS

pytestmark = [pytest.mark.slow, pytest.mark.spark]

SUBMIT = ROOT / "spark-submit.sh"
AS_OF = "2030-01-01T00:00:00Z"
APP_NAME = "txaudit-standalone-test"         # spark-submit --name: the Master lists the app under it
TIMEOUT = 600
SIZES = dict(commitlog_file_size=48 * 1024, msg_bytes=256, cq_file_units=256)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """(broker, store root): a crashed 5.1+ broker (re-puts, damage) and a 3.x broker (statetable + redolog)."""
    import refbroker

    base = tmp_path_factory.mktemp("standalone-stores")
    out = []
    for name, profile, scenario, tx in (("b51", "5.1+", "crashy", 30), ("b3x", "3.x", "legacy-3x", 20)):
        refbroker.generate(profile, scenario, transactions=tx, seed=7, out_dir=base / name,
                           start_ms=DEFAULT_START_MS, **SIZES)
        out.append((name, str(base / name / "store")))
    return out


def _submit(master: str, path: str, stores, out, cwd, *spark_opts: str) -> subprocess.Popen:
    conf = cwd / f"{path}.properties"
    conf.write_text(f"reconstruct.path={path}\n")
    args = ["bash", str(SUBMIT), "--master", master, "--conf", "spark.ui.enabled=false",
            "--conf", "spark.sql.shuffle.partitions=2", *spark_opts,
            "audit", "--out", str(out), "--as-of", AS_OF, "--mode", "full", "--run-id", "r1",
            "--conf-file", str(conf)]
    for broker, root in stores:
        args += ["--store", root, "--broker", broker]
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    env.pop("TXAUDIT_SPARK_MASTER", None)
    return subprocess.Popen(args, cwd=str(cwd), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, env=env, start_new_session=True)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _finish(proc: subprocess.Popen, label: str) -> str:
    out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, f"{label}: exit {proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    return out


def _tables(out):
    from deltalake import DeltaTable

    run = DeltaTable(str(out / "audit_runs")).to_pyarrow_table().to_pylist()
    assert len(run) == 1
    tables = {name: _rows(DeltaTable(path).to_pyarrow_table(), drop=("run_id", "run_date"))
              for name, path in run[0]["table_paths"] if name != "audit_runs"}
    return run[0], tables


def test_spark_submit_audit_on_a_standalone_cluster_writes_the_driver_tables(standalone_cluster,  # noqa: F811
                                                                             stores, tmp_path):
    cluster = standalone_cluster
    t0 = time.monotonic()
    # the local driver-path audit runs alongside the cluster's (its own JVM, --master local[2])
    local = _submit("local[2]", "driver", stores, tmp_path / "local", tmp_path)
    dist = _submit(cluster.url, "distributed", stores, tmp_path / "cluster", tmp_path,
                   "--name", APP_NAME, "--total-executor-cores", "1", "--executor-memory", "1g",
                   "--conf", "spark.executor.extraJavaOptions=-XX:TieredStopAtLevel=1")   # C1, as the driver
    try:
        _finish(dist, "cluster audit")
        _finish(local, "local audit")
    finally:                                        # a failed or timed-out run leaves no process behind
        _kill(dist)
        _kill(local)
    elapsed = time.monotonic() - t0

    run_d, tables_d = _tables(tmp_path / "cluster")
    run_l, tables_l = _tables(tmp_path / "local")
    assert json.loads(run_d["config_json"])["reconstruct"]["path"] == "distributed"
    assert json.loads(run_d["config_json"])["reconstruct"]["reduce_tasks"] >= 1
    assert json.loads(run_l["config_json"])["reconstruct"]["path"] == "driver"
    phases_d, phases_l = dict(run_d["phase_seconds"]), dict(run_l["phase_seconds"])
    assert "reconstruct.executors" in phases_d and "reconstruct.reduce" not in phases_d, phases_d
    assert "reconstruct.reduce" in phases_l and "reconstruct.executors" not in phases_l, phases_l

    assert set(tables_d) == set(tables_l) and len(tables_l) >= 5
    for name in sorted(tables_l):
        assert tables_d[name] == tables_l[name], name
    assert len(tables_l["transactions"]) >= 40 and tables_l["audit_anomalies"]

    # the Master saw the application finish with executors on the Worker, which ran its Python tasks
    state = cluster.state()
    apps = state["completedapps"]
    assert [a["name"] for a in apps] == [APP_NAME] and apps[0]["state"] == "FINISHED", apps
    assert not state["activeapps"] and apps[0]["cores"] >= 1, state
    logs = [p for p in cluster.executor_logs() if p.parent.parent.name == apps[0]["id"]]
    assert logs, f"no executor log of {apps[0]['id']} under {cluster.work_dir}"
    text = "".join(p.read_text(errors="replace") for p in logs)
    assert "Starting Python task execution" in text
    assert f"--app-id\" \"{apps[0]['id']}\"" in text and "--hostname\" \"127.0.0.1\"" in text
    print(f"standalone audit + local audit: {elapsed:.1f} s\ncluster phases {phases_d}\nlocal phases {phases_l}")
