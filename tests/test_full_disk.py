"""A full or unusable disk ends a command with one line naming the directory, not a Java trace or exit 53."""
from __future__ import annotations

import os
import subprocess
import types

import pytest

from jobs import main as txmain
from jobs import session
from tests.test_cli_main import JAVA_NOISE, STORE, SUBMIT
from txlog_io.errors import ScratchSpaceError


def _full_tmpfs(path):
    """A 256 KiB tmpfs at ``path`` filled to the last block (root only), or None."""
    os.makedirs(path, exist_ok=True)
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)],
                                           capture_output=True).returncode != 0:
        return None
    try:
        with open(os.path.join(path, "fill"), "wb") as f:
            while True:
                f.write(bytes(4096))
                f.flush()
    except OSError:
        pass
    return path


@pytest.fixture
def full_dir(tmp_path):
    d = _full_tmpfs(str(tmp_path / "full"))
    if d is None:
        pytest.skip("needs root to mount a tmpfs")
    yield d
    subprocess.run(["umount", d], capture_output=True)


def test_spark_submit_with_an_uncreatable_local_dir_is_one_line_exit_2(tmp_path):
    # Spark's DiskBlockManager would System.exit(53) with "Failed to create any local dir"
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = dict(os.environ, SPARK_LOCAL_DIRS=str(blocker / "spark"))
    out = tmp_path / "out"
    p = subprocess.run(["bash", SUBMIT, "audit", "--store", STORE, "--out", str(out)],
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL, env=env)
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    # Spark's PythonRunner merges the driver's stderr into its stdout; the JVM launcher's own notice
    # ("WARNING: Using incubator modules") may stand beside it
    lines = [line for line in (p.stdout + p.stderr).splitlines()
             if line.strip() and not line.startswith("WARNING: Using incubator modules")]
    assert len(lines) == 1, lines
    for needle in ("txaudit: error: Spark local directory", str(blocker / "spark"), "SPARK_LOCAL_DIRS"):
        assert needle in lines[0]
    assert not any(n in line for n in JAVA_NOISE for line in lines)
    assert not (blocker.parent / "spark").exists()


def test_a_full_local_dir_is_found_before_spark_starts(full_dir, monkeypatch):
    assert "No space left on device" in session.local_dir_problem(full_dir)
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{os.path.dirname(full_dir)},{full_dir}")
    with pytest.raises(ScratchSpaceError, match="full"):
        session.check_local_dirs({})
    assert os.listdir(full_dir) == ["fill"]                       # the probe left nothing behind


def test_too_little_free_space_counts_as_full(tmp_path, monkeypatch):
    assert session.local_dir_problem(str(tmp_path)) is None
    real = os.statvfs(str(tmp_path))
    monkeypatch.setattr(os, "statvfs", lambda p: types.SimpleNamespace(f_bavail=3, f_frsize=real.f_frsize))
    assert "MiB free" in session.local_dir_problem(str(tmp_path))


def test_local_dirs_are_taken_in_sparks_order(monkeypatch):
    for k in ("CONTAINER_ID", "LOCAL_DIRS", "SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS"):
        monkeypatch.delenv(k, raising=False)
    assert session.configured_local_dirs({}) == ["/tmp"]
    assert session.configured_local_dirs({"java.io.tmpdir": "/jt"}) == ["/jt"]
    assert session.configured_local_dirs({"spark.local.dir": "/a, /b", "java.io.tmpdir": "/jt"}) == ["/a", "/b"]
    monkeypatch.setenv("SPARK_LOCAL_DIRS", "/l1,/l2")
    assert session.configured_local_dirs({"spark.local.dir": "/a"}) == ["/l1", "/l2"]
    monkeypatch.setenv("SPARK_EXECUTOR_DIRS", "/e1:/e2")
    assert session.configured_local_dirs({}) == ["/e1", "/e2"]
    monkeypatch.setenv("CONTAINER_ID", "c1")
    monkeypatch.setenv("LOCAL_DIRS", "/y1,/y2")
    assert session.configured_local_dirs({}) == ["/y1", "/y2"]


def test_local_dirs_come_from_the_jvm_before_and_after_the_context_starts(spark, monkeypatch):
    """``_launcher_conf`` (through the launcher's gateway, as under spark-submit) and ``local_dirs_of`` (a
    running session) read ``spark.local.dir`` and ``java.io.tmpdir`` from the driver JVM the same way."""
    for k in ("CONTAINER_ID", "LOCAL_DIRS", "SPARK_EXECUTOR_DIRS", "SPARK_LOCAL_DIRS"):
        monkeypatch.delenv(k, raising=False)
    props = spark.sparkContext._jvm.java.lang.System
    saved = {k: props.getProperty(k) for k in ("java.io.tmpdir", "spark.local.dir")}
    assert saved["spark.local.dir"] is None and not spark.sparkContext.getConf().get("spark.local.dir", None)
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "0")         # the gateway exists: the launcher branch starts nothing
    try:
        props.setProperty("java.io.tmpdir", "/jt-probe")
        assert session.local_dirs_of(spark) == ["/jt-probe"]
        assert session._launcher_conf({}) == {"java.io.tmpdir": "/jt-probe"}
        props.setProperty("spark.local.dir", "/sl1,/sl2")  # a system property the launcher's SparkConf loads
        assert session._launcher_conf({}) == {"spark.local.dir": "/sl1,/sl2", "java.io.tmpdir": "/jt-probe"}
        assert session._launcher_conf({"spark.local.dir": "/x"}) == {"spark.local.dir": "/x",
                                                                     "java.io.tmpdir": "/jt-probe"}
        assert session.local_dirs_of(spark) == ["/sl1", "/sl2"]   # getConf() loads the spark.* properties too
    finally:
        props.setProperty("java.io.tmpdir", saved["java.io.tmpdir"])
        props.clearProperty("spark.local.dir")


class _Session:
    def stop(self):
        pass


def test_a_disk_filling_during_the_run_is_one_line_exit_1(capsys):
    java = ("An error occurred while calling o123.save.\n: org.apache.spark.SparkException: Job aborted.\n"
            "Caused by: java.io.IOException: No space left on device\n\tat java.base/java.io.FileOutputStream")

    def run(spark, opts):
        raise RuntimeError(java)

    opts = types.SimpleNamespace(out="/data/out")
    assert txmain._run(run, lambda **kw: _Session(), "audit", opts) == txmain.EXIT_FAILURE
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == ["txaudit: error: audit failed: a disk is full (--out /data/out, Spark local directories "
                   f"{','.join(session.local_dirs_of(None))}): Caused by: java.io.IOException: "
                   "No space left on device"]


def test_other_failures_keep_their_traceback(capsys):
    def run(spark, opts):
        raise RuntimeError("boom")

    assert txmain._run(run, lambda **kw: _Session(), "audit", types.SimpleNamespace(out="/o")) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().endswith("txaudit: error: audit failed: RuntimeError: boom")
