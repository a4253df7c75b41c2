"""DLedger stores at the user-facing commands: store detection before any JVM, and a whole audit through
./spark-submit.sh of the real store-clean (it once reported a silent "Transactions: 0").  That run
is also the suite's test of the audit's full path through spark-submit (bootstrap, pre-check, py-files zip,
log4j2 config, jobs/main.py, run_audit), once test_cli_main's own JVM run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile

import deltalake
import pytest
from conftest import FIXTURES, ROOT

SUBMIT = os.path.join(ROOT, "spark-submit.sh")
CLEAN = FIXTURES / "rocketmq-4.9.8-dledger" / "store-clean"


def _submit(*args, timeout=120, env=None):
    return subprocess.run(["bash", SUBMIT, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT, env=env)


def test_store_without_a_message_log_is_a_usage_error(tmp_path):
    """consume queues and config but neither commitlog/ nor dledger-*/data/: refused, not audited as 0."""
    store = tmp_path / "store"
    shutil.copytree(CLEAN / "consumequeue", store / "consumequeue")
    shutil.copytree(CLEAN / "config", store / "config")
    p = _submit("audit", "--store", str(store), "--out", str(tmp_path / "out"))
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("txaudit: error: --store: no message log"), p.stderr
    assert not (tmp_path / "out").exists()


def test_several_dledger_replicas_in_one_root_is_a_usage_error(tmp_path):
    store = tmp_path / "store"
    for n in ("dledger-n0", "dledger-n1"):
        shutil.copytree(CLEAN / "dledger-n0", store / n)
    shutil.copytree(CLEAN / "consumequeue", store / "consumequeue")
    p = _submit("audit", "--store", str(store), "--out", str(tmp_path / "out"))
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "several DLedger stores (dledger-n0, dledger-n1)" in lines[0], p.stderr


@pytest.mark.slow
def test_spark_submit_audit_of_a_dledger_store_reports_its_transactions(tmp_path):
    truth = json.loads((FIXTURES / "rocketmq-4.9.8-dledger" / "truth" / "clean" /
                        "workload_client_side.json").read_text())["intended_tx_outcome_by_key"]
    out = tmp_path / "out"
    # without the suite's own C1 setting (conftest's SPARK_SUBMIT_OPTS): the launcher's JIT choice shows
    p = _submit("--master", "local[2]", "audit", "--store", str(CLEAN), "--out", str(out), "--conf",
                "spark.sql.shuffle.partitions=2", timeout=900, env=dict(os.environ, SPARK_SUBMIT_OPTS=""))
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    both = p.stdout + p.stderr
    m = re.search(r"^Transactions: (\d+)$", both, re.M)
    assert m and int(m.group(1)) == len(truth) == 204, both[-3000:]
    assert "profile 4.3-5.0" in both
    tx = deltalake.DeltaTable(str(out / "transactions")).to_pandas()
    assert len(tx) == 204 and set(tx["keys"]) == set(truth)
    # the launcher's own wiring: conf/log4j2.properties was used, the job's code went as one clean zip
    assert "Using Spark's default log4j profile" not in both
    assert " INFO " not in both
    with zipfile.ZipFile(os.path.join(ROOT, "build", "txaudit-pyfiles.zip")) as zf:
        names = set(zf.namelist())
    for mod in ("jobs/main.py", "jobs/delta/sink.py", "jobs/config.py", "schemas/core.py",
                "txlog_io/errors.py"):
        assert mod in names
    assert not any("__pycache__" in n for n in names)
    # a small store reduces on the driver: the pre-check gave the driver JVM the C1-only JIT
    from jobs.session import QUICK_JIT

    run = deltalake.DeltaTable(str(out / "audit_runs")).to_pyarrow_table().to_pylist()[0]
    assert json.loads(run["config_json"])["driver_jit"] == QUICK_JIT


def test_one_broker_name_for_several_stores_only_for_dledger_replicas(tmp_path):
    from jobs import main as txmain
    from txlog_io.errors import UsageError

    crashed = FIXTURES / "rocketmq-4.9.8-dledger" / "store-crashed"
    plain = FIXTURES / "rocketmq-4.9.8" / "store"
    _, o = txmain.parse_args(["audit", "--store", str(CLEAN), "--store", str(crashed), "--broker", "broker-a",
                              "--broker", "broker-a", "--out", str(tmp_path / "o")])
    assert o.brokers == ("broker-a", "broker-a")
    with pytest.raises(UsageError, match="only the replicas of one DLedger group may share a name"):
        txmain.parse_args(["audit", "--store", str(CLEAN), "--store", str(plain), "--broker", "b", "--broker",
                           "b", "--out", str(tmp_path / "o")])
