"""Misuse of the command line: one line ``txaudit: error: ...``, exit 2, before any JVM."""
from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time

import pytest

from jobs import main as txmain
from jobs.audit import guard
from txlog_io.errors import UsageError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBMIT = os.path.join(ROOT, "spark-submit.sh")
STORE = os.path.join(ROOT, "tests", "data", "fixtures", "rocketmq-3.1.4", "store")


def _main_error(capsys, argv):
    rc = txmain.main(["--validate-only", *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("txaudit: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_out_equal_to_or_inside_a_store(capsys, tmp_path):
    assert "is the store" in _main_error(capsys, ["audit", "--store", STORE, "--out", STORE])
    assert "inside the store" in _main_error(capsys, ["audit", "--store", STORE, "--out",
                                                       os.path.join(STORE, "commitlog", "x")])
    # through a symlink the store is still the store
    link = tmp_path / "link"
    link.symlink_to(STORE)
    assert "inside the store" in _main_error(capsys, ["audit", "--store", STORE, "--out", str(link / "out")])


def test_store_where_an_output_table_goes(capsys, tmp_path):
    store = tmp_path / "transactions"
    shutil.copytree(STORE, store)
    line = _main_error(capsys, ["audit", "--store", str(store), "--out", str(tmp_path)])
    assert "output table directory" in line
    # a store elsewhere below --out is fine
    other = tmp_path / "brokers" / "a"
    shutil.copytree(STORE, other)
    _, o = txmain.parse_args(["audit", "--store", str(other), "--out", str(tmp_path)])
    assert o.stores == (str(other),)


@pytest.mark.parametrize("layout,needle", [
    ("missing", "store not found"),
    ("file", "not a directory"),
    ("empty", "empty directory"),
    ("no-commitlog", "no commitlog/ or dledger-<id>/data/"),
    ("empty-commitlog", "holds no CommitLog file"),
    ("broker-home", "did you mean"),
])
def test_bad_store(capsys, tmp_path, layout, needle):
    s = tmp_path / "s"
    if layout == "file":
        s.write_bytes(b"x")
    elif layout == "empty":
        s.mkdir()
    elif layout == "no-commitlog":
        (s / "config").mkdir(parents=True)
        (s / "config" / "topics.json").write_text("{}")
    elif layout == "empty-commitlog":
        (s / "commitlog").mkdir(parents=True)
        (s / "commitlog" / "README").write_text("")
    elif layout == "broker-home":
        shutil.copytree(STORE, s / "store")
        (s / "logs").mkdir()
    line = _main_error(capsys, ["audit", "--store", str(s), "--out", str(tmp_path / "out")])
    assert needle in line
    if layout != "broker-home":
        assert "expected" in line


@pytest.mark.parametrize("name", ["../../evil", "a/b", "a\\b", "..", ".hidden", "x..y", "a\nb", "a\x00b",
                                  " padded", ""])
def test_escaping_broker_names(capsys, tmp_path, name):
    line = _main_error(capsys, ["audit", "--store", STORE, "--out", str(tmp_path / "o"), "--broker", name])
    assert "--broker" in line
    assert not (tmp_path / "o").exists()


def test_broker_names_with_spaces_and_non_ascii(tmp_path):
    _, o = txmain.parse_args(["audit", "--store", STORE, "--out", str(tmp_path / "o"),
                              "--broker", "brokér a"])
    assert o.brokers == ("brokér a",)
    home = tmp_path / "dätä dir" / "bröker b"
    shutil.copytree(STORE, home / "store")
    _, o = txmain.parse_args(["audit", "--store", str(home / "store"), "--out", str(tmp_path / "oüt put")])
    assert o.brokers == ("bröker b",) and o.out == str(tmp_path / "oüt put")


def test_out_under_a_regular_file_or_not_writable(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    line = _main_error(capsys, ["audit", "--store", STORE, "--out", str(f / "x" / "y")])
    assert "is not a directory" in line and "Traceback" not in line
    assert "exists and is not a directory" in _main_error(capsys, ["audit", "--store", STORE,
                                                                   "--out", str(f)])
    ro = tmp_path / "ro"
    ro.mkdir()
    # root may write anywhere (os.access says yes): a read-only bind would be needed; check the rule directly
    if os.geteuid() != 0:
        ro.chmod(0o500)
        assert "not writable" in _main_error(capsys, ["audit", "--store", STORE, "--out", str(ro / "x")])
    with pytest.raises(UsageError, match="not writable"):
        orig = os.access
        try:
            os.access = lambda p, m: False if str(p) == str(ro) else orig(p, m)
            guard.check_out(str(ro / "x"))
        finally:
            os.access = orig


def test_out_locked_by_another_run(capsys, tmp_path):
    out = tmp_path / "o"
    with guard.out_lock(str(out), "first-run"):
        line = _main_error(capsys, ["audit", "--store", STORE, "--out", str(out)])
        assert "in use by another txaudit run" in line and "first-run" in line
        with pytest.raises(guard.OutLockedError):
            with guard.out_lock(str(out), "second"):
                pass
    # released: the pre-check passes and the lock can be taken again
    assert txmain.main(["--validate-only", "audit", "--store", STORE, "--out", str(out)]) == 0
    with guard.out_lock(str(out), "third"):
        fd = os.open(str(out / guard.LOCK_NAME), os.O_RDONLY)
        try:
            with pytest.raises(OSError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)


def test_lock_is_released_when_the_holder_is_killed(tmp_path):
    out = tmp_path / "o"
    code = ("import sys, time; sys.path.insert(0, %r); from jobs.audit import guard\n"
            "with guard.out_lock(%r, 'killed'):\n    print('held', flush=True); time.sleep(60)\n"
            ) % (ROOT, str(out))
    p = subprocess.Popen([os.sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert guard.probe_lock(str(out)) is not None
        p.kill()
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
    assert guard.probe_lock(str(out)) is None


def test_spark_submit_pre_jvm_misuse(tmp_path):
    """One spark-submit run per misuse class would start no JVM; check a few through the script."""
    f = tmp_path / "file"
    f.write_text("")
    for args, needle in [(("--store", STORE, "--out", STORE), "is the store"),
                         (("--store", STORE, "--out", str(f / "x")), "is not a directory"),
                         (("--store", STORE, "--out", str(tmp_path / "o"), "--broker", "../../evil"),
                          "--broker"),
                         (("--store", str(tmp_path), "--out", str(tmp_path / "o")), "expected")]:
        t0 = time.monotonic()
        p = subprocess.run(["bash", SUBMIT, "audit", *args], capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL, cwd=ROOT)
        assert p.returncode == 2, p.stderr
        lines = [x for x in p.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("txaudit: error: ") and needle in lines[0], p.stderr
        assert time.monotonic() - t0 < 30


def test_dledger_store_is_refused_without_its_codec(capsys, tmp_path):
    import importlib.util

    s = tmp_path / "dl"
    (s / "dledger-n0" / "data").mkdir(parents=True)
    (s / "dledger-n0" / "data" / "00000000000000000000").write_bytes(b"\0" * 64)
    (s / "consumequeue").mkdir()
    if importlib.util.find_spec("txlog_io.dledger") is None:
        line = _main_error(capsys, ["audit", "--store", str(s), "--out", str(tmp_path / "o")])
        assert "DLedger" in line and "cannot read" in line
    else:
        _, o = txmain.parse_args(["audit", "--store", str(s), "--out", str(tmp_path / "o")])
        assert o.stores == (str(s),)
