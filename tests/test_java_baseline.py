"""The Java baseline's class is compiled once per source into a cache shared by every process of the user:
compiles that run at once (two suites, two benchmarks) each see a whole class, and a directory left
half-written by an interrupted compile is replaced."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from txlog_io import java_baseline as jb

pytestmark = pytest.mark.skipif(shutil.which("javac") is None, reason="needs a JDK (javac)")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path / ".cache" / "txaudit-java"


def test_concurrent_compiles_each_get_a_whole_class(home):
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda _: jb.compile_baseline(), range(4)))
    assert len(set(outs)) == 1 and outs[0].parent == home
    assert (outs[0] / f"{jb.MAIN_CLASS}.class").stat().st_size > 0
    assert [p.name for p in home.iterdir()] == [outs[0].name]        # no compile directory left behind


def test_a_half_written_directory_is_replaced(home):
    first = jb.compile_baseline()
    shutil.rmtree(first)
    first.mkdir(parents=True)
    (first / "partial.tmp").write_bytes(b"\0")                      # what an interrupted javac left
    again = jb.compile_baseline()
    assert again == first and (again / f"{jb.MAIN_CLASS}.class").is_file()
    assert not (again / "partial.tmp").exists()
