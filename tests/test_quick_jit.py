"""The driver JVM's JIT choice: C1 only (``jobs.session.QUICK_JIT``) for a run expected to reduce on the driver,
the JVM's default otherwise; how the pre-check hands it to spark-submit.sh and how a session started here
takes it.  The launcher's whole path (an audit through ./spark-submit.sh recording ``driver_jit``) is in
tests/test_dledger_cli.py."""
from __future__ import annotations

import dataclasses

import pytest
from conftest import FIXTURES

from jobs import main as txmain
from jobs.audit import plan as audit_plan
from jobs.session import LOG4J2_CONF, QUICK_JIT, driver_java_options

STORE = str(FIXTURES / "rocketmq-5.3.3" / "store")
STORE_3 = str(FIXTURES / "rocketmq-3.1.4" / "store")
AS_OF = "2026-11-21T12:00:00Z"


def _audit(tmp_path, *extra, store=STORE):
    _, opts = txmain.parse_args(["audit", "--store", store, "--out", str(tmp_path / "out"), "--as-of", AS_OF,
                                 *extra])
    return opts


def test_small_stores_are_quick(tmp_path):
    for store in (STORE, STORE_3):
        for mode in ("full", "indexed"):
            assert audit_plan.quick_start(_audit(tmp_path, "--mode", mode, store=store)), (store, mode)


def test_a_store_above_the_driver_bound_is_not(tmp_path, monkeypatch):
    """The read's own test decides (``full.above_bound`` against ``LOCAL_MAX_ROWS``): the 5.3.3 fixture's
    transaction queues hold more than 10 units."""
    import jobs.reconstruct.spark as recon_spark

    opts = _audit(tmp_path)
    monkeypatch.setattr(recon_spark, "LOCAL_MAX_ROWS", 10)
    assert not audit_plan.quick_start(opts)
    monkeypatch.setattr(recon_spark, "LOCAL_MAX_ROWS", 1 << 40)
    assert audit_plan.quick_start(opts)


def test_runs_that_do_not_reduce_on_the_driver_are_not(tmp_path):
    assert not audit_plan.quick_start(_audit(tmp_path, "--include-bodies"))
    conf = tmp_path / "distributed.properties"
    conf.write_text("reconstruct.path=distributed\n")
    assert not audit_plan.quick_start(_audit(tmp_path, "--conf-file", str(conf)))
    remote = dataclasses.replace(_audit(tmp_path), stores=("s3://bucket/store",))
    assert not audit_plan.quick_start(remote)


def test_an_unreadable_store_is_not_an_error_here(tmp_path, monkeypatch):
    import jobs.read.full as full_read

    def fails(*_a, **_k):
        raise OSError("Input/output error")

    monkeypatch.setattr(full_read, "above_bound", fails)
    assert not audit_plan.quick_start(_audit(tmp_path))
    assert not audit_plan.quick_start(object())         # no options to judge: the default JIT


def test_validate_only_prints_the_option_for_spark_submit(tmp_path, capsys):
    assert txmain.main(["--validate-only", "audit", "--store", STORE, "--out", str(tmp_path / "o1")]) == 0
    assert capsys.readouterr().out.splitlines() == [QUICK_JIT]
    assert txmain.main(["--validate-only", "audit", "--store", STORE, "--out", str(tmp_path / "o2"),
                        "--include-bodies"]) == 0
    assert capsys.readouterr().out == ""
    # a refused command prints no option: spark-submit.sh stops on its exit code
    assert txmain.main(["--validate-only", "audit", "--store", str(tmp_path / "none"), "--out",
                        str(tmp_path / "o3")]) == 2
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("quick", [False, True])
def test_driver_java_options(quick):
    got = driver_java_options({}, quick)
    want = ([f"-Dlog4j2.configurationFile={LOG4J2_CONF.as_uri()}"] if LOG4J2_CONF.is_file() else []) + (
        [QUICK_JIT] if quick else [])
    assert (got or "").split() == want
    # the caller's own options stand as given, the JIT choice included
    assert driver_java_options({"spark.driver.extraJavaOptions": "-Xss4m"}, quick) is None
