"""Shared test fixtures: the real-broker stores and ONE SparkSession for the whole suite."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"
FIXTURES = DATA / "fixtures"
FIXTURE_VERSIONS = ("rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3")

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
# Every Spark JVM the suite starts (the session below and each ./spark-submit.sh; spark-class passes this to
# SparkSubmit) compiles with C1 only, as the real-broker JVMs do: the suite's JVMs are short-lived or run tiny
# jobs, where C2's compiler threads cost CPU they never pay back (a spark-submit audit of the 5.3.3 fixture:
# ~15 s -> ~10.5 s of CPU).  An explicit SPARK_SUBMIT_OPTS (even empty) is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session", params=FIXTURE_VERSIONS)
def real_store(request) -> Path:
    """Each real-broker fixture directory (contains store/ and truth/)."""
    return FIXTURES / request.param


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole suite (starting one costs ~6 s)."""
    from jobs.session import build_session

    session = build_session(app_name="txaudit-tests", master="local[2]", extra_conf={
        "spark.sql.shuffle.partitions": "4",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",     # no progress bars in test output
        "spark.sql.session.timeZone": "UTC",
    })
    yield session
    session.stop()


#: the real-broker modules whose broker work was started in the background (see their start_early)
_REALBROKER_EARLY = []


def pytest_collection_finish(session):
    """The real-broker runs, minutes of brokers waiting on their timers, start as soon as the tests are
    collected and overlap the rest of the suite (test_realbroker's fixture then only waits for them); after
    them, in the same background, test_recover_realbroker's broker lives (overlapping test_realbroker's audits;
    one real-broker workload at a time, as when the modules ran them in turn)."""
    if session.config.option.collectonly or os.environ.get("TXAUDIT_REALBROKER_EARLY", "1") == "0":
        return
    modules = {}
    for item in session.items:
        name = Path(str(item.path)).name
        if name in ("test_realbroker.py", "test_recover_realbroker.py") and hasattr(item.module, "start_early"):
            modules.setdefault(name, item.module)
    runs, lives = modules.get("test_realbroker.py"), modules.get("test_recover_realbroker.py")
    if runs is not None:
        runs.start_early(session)
        _REALBROKER_EARLY.append(runs)
    if lives is not None:
        lives.start_early(session, after=runs.wait_early if runs is not None else None)
        _REALBROKER_EARLY.append(lives)


def pytest_sessionfinish(session, exitstatus):
    for module in _REALBROKER_EARLY:
        module.stop_early()
