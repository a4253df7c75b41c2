"""./spark-submit.sh and jobs.main: argument validation before any JVM starts, exit codes, one-line errors."""
from __future__ import annotations

import dataclasses
import datetime as dt
import os
import subprocess
import sys
import time

import pytest

from jobs import main as txmain
from txlog_io.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBMIT = os.path.join(ROOT, "spark-submit.sh")
STORE = os.path.join(ROOT, "tests", "data", "fixtures", "rocketmq-4.9.8", "store")
STORE_3 = os.path.join(ROOT, "tests", "data", "fixtures", "rocketmq-3.1.4", "store")
JAVA_NOISE = ("Exception", "\tat ", "at org.apache", "py4j", "log4j", "WARN", "Traceback")


def _submit(*args, timeout=120):
    t0 = time.monotonic()
    p = subprocess.run(["bash", SUBMIT, *args], capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL, cwd=ROOT)
    return p, time.monotonic() - t0


def _assert_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("txaudit: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    assert not any(n in p.stderr for n in JAVA_NOISE), p.stderr
    assert p.stdout == ""


# ------------------------------------------------------------------------------------------------------------
# through ./spark-submit.sh (the pre-check runs before spark-submit: fast, no JVM)
# ------------------------------------------------------------------------------------------------------------

def test_missing_store_is_a_one_line_usage_error(tmp_path):
    p, secs = _submit("audit", "--store", "/nonexistent", "--out", str(tmp_path / "x"))
    _assert_one_line_error(p, "store not found", "/nonexistent")
    assert secs < 30                     # no JVM was started (that alone takes ~10 s)
    assert not (tmp_path / "x").exists()


def test_unknown_option_after_subcommand(tmp_path):
    p, _ = _submit("audit", "--store", STORE, "--out", str(tmp_path / "x"), "--bogus")
    _assert_one_line_error(p, "--bogus")


def test_unknown_option_before_subcommand_and_spark_options_pass(tmp_path):
    p, _ = _submit("--bogus", "audit", "--store", STORE, "--out", str(tmp_path / "x"))
    _assert_one_line_error(p, "--bogus")
    # Spark options around the subcommand are not the job's business: the job's own error still wins
    p, _ = _submit("--master", "local[1]", "audit", "--driver-memory", "1g", "--conf", "spark.x=y",
                   "--store", "/nonexistent", "--out", str(tmp_path / "x"))
    _assert_one_line_error(p, "store not found")


@pytest.mark.parametrize("args,needle", [
    ((), "missing subcommand"),
    (("frobnicate",), "unknown subcommand"),
    (("audit", "--out", "/tmp/x"), "--store"),
    (("audit", "--store", STORE), "--out"),
    (("audit", "--store", STORE, "--out", "/tmp/x", "--as-of", "yesterday"), "--as-of"),
    (("audit", "--store", STORE, "--out", "/tmp/x", "--mode", "fast"), "--mode"),
    (("audit", "--store", os.path.dirname(STORE), "--out", "/tmp/x"), "no message log"),
    (("audit", "--store", STORE, "--store", STORE_3, "--out", "/tmp/x", "--broker", "a"), "--broker"),
    (("audit", "--store", STORE, "--out", "/tmp/x", "--conf-file", "/nonexistent.properties"), "--conf-file"),
    (("audit", "--conf"), "--conf"),
])
def test_usage_errors(args, needle):
    p, _ = _submit(*args)
    _assert_one_line_error(p, needle)


def test_conf_file_unknown_key_named(tmp_path):
    conf = tmp_path / "my.properties"
    conf.write_text("mode=full\nsplit.bites=1m\n")
    p, _ = _submit("audit", "--store", STORE, "--out", str(tmp_path / "x"), "--conf-file", str(conf))
    _assert_one_line_error(p, "split.bites")


def test_help():
    p, _ = _submit("--help")
    assert p.returncode == 0 and "audit" in p.stdout and "demo" in p.stdout
    p, _ = _submit("audit", "--help")
    assert p.returncode == 0 and "--store" in p.stdout and "--include-bodies" in p.stdout


# The full path of an audit (bootstrap, pre-check, py-files zip, log4j2 config, spark-submit, jobs/main.py,
# run_audit) is tested by test_dledger_cli.test_spark_submit_audit_of_a_dledger_store_reports_its_transactions:
# one JVM run for both (test_check_e2e, test_audit_e2e and test_crash_safety go through spark-submit, too).


# ------------------------------------------------------------------------------------------------------------
# jobs.main in-process
# ------------------------------------------------------------------------------------------------------------

def test_parse_audit_options(tmp_path):
    validate_only, o = txmain.parse_args(["--validate-only", "audit", "--store", STORE, "--store", STORE_3,
                                          "--out", str(tmp_path / "o"),
                                          "--as-of", "2024-05-01T10:00:00+02:00",
                                          "--mode", "full", "--include-bodies"])
    assert validate_only is True
    assert isinstance(o, txmain.AuditOptions)
    assert o.stores == (STORE, STORE_3)
    assert o.brokers == ("rocketmq-4.9.8", "rocketmq-3.1.4")
    assert o.as_of == dt.datetime(2024, 5, 1, 8, 0, tzinfo=dt.timezone.utc)
    assert o.run_id == "20240501T080000Z" and o.run_date == dt.date(2024, 5, 1)
    assert (o.mode, o.include_bodies, o.conf_file, o.profile) == ("full", True, None, "auto")
    assert o.out == str(tmp_path / "o")
    assert o.config.table("transactions") == "transactions"
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.mode = "indexed"                                     # frozen


def test_parse_defaults_and_broker_names(tmp_path):
    _, o = txmain.parse_args(["audit", "--store", STORE, "--out", str(tmp_path), "--broker", "broker-a",
                              "--profile", "4.6-4.9", "--run-id", "nightly"])
    assert o.brokers == ("broker-a",) and o.run_id == "nightly" and o.profile == "4.6-4.9"
    assert o.mode == "indexed" and o.include_bodies is False
    assert o.as_of.tzinfo is not None
    assert abs((dt.datetime.now(dt.timezone.utc) - o.as_of).total_seconds()) < 60
    _, d = txmain.parse_args(["demo"])
    assert isinstance(d, txmain.DemoOptions) and d.out == os.path.abspath("demo-out")


def test_parse_errors(tmp_path):
    with pytest.raises(UsageError, match="given twice"):
        txmain.parse_args(["audit", "--store", STORE, "--store", STORE, "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="unique"):
        txmain.parse_args(["audit", "--store", STORE, "--store", STORE_3, "--out", str(tmp_path),
                           "--broker", "x", "--broker", "x"])
    with pytest.raises(UsageError, match="inside a store"):
        txmain.parse_args(["audit", "--store", STORE, "--out", os.path.join(STORE, "out")])
    with pytest.raises(UsageError, match="profile"):
        txmain.parse_args(["audit", "--store", STORE, "--out", str(tmp_path), "--profile", "9.9"])
    f = tmp_path / "file"
    f.write_text("")
    with pytest.raises(UsageError, match="not a directory"):
        txmain.parse_args(["audit", "--store", STORE, "--out", str(f)])


def test_as_of_forms():
    utc = dt.timezone.utc
    assert txmain.parse_as_of("2024-05-01") == dt.datetime(2024, 5, 1, tzinfo=utc)
    assert txmain.parse_as_of("2024-05-01T12:30:00Z") == dt.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    assert txmain.parse_as_of("2024-05-01T12:30:00.250") == \
        dt.datetime(2024, 5, 1, 12, 30, 0, 250000, tzinfo=utc)
    assert txmain.parse_as_of("2024-05-01T14:30:00+02:00") == dt.datetime(2024, 5, 1, 12, 30, tzinfo=utc)
    with pytest.raises(UsageError):
        txmain.parse_as_of("01/05/2024")


def test_main_exit_codes(capsys, tmp_path):
    assert txmain.main(["--validate-only", "audit", "--store", STORE, "--out", str(tmp_path)]) == 0
    assert txmain.main(["audit", "--store", "/nonexistent", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("txaudit: error: ")


def test_main_module_runs_standalone(tmp_path):
    """``python jobs/main.py`` (how spark-submit runs it) imports the package, not jobs/ as top-level."""
    p = subprocess.run([sys.executable, os.path.join(ROOT, "jobs", "main.py"), "--validate-only", "audit",
                        "--store", STORE, "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
