"""Shared test fixtures: the real-broker stores and ONE SparkSession for the whole suite."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

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

# Hypothesis's timing checks (a per-example deadline, "input generation is slow") measure the machine, not the
# code: on a loaded 2-core runner with two test workers they fail tests whose properties hold.  Every property
# and example count stays as written; a test's own @settings still wins.
settings.register_profile("txaudit", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("txaudit")


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


#: test_realbroker's module once its broker runs were started in the background (see its start_early)
_REALBROKER_EARLY = []


def _xdist_worker() -> str:
    """This process's pytest-xdist worker id (gw0, gw1, ...), or "" when the tests run in one process."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def pytest_collection_modifyitems(session, config, items):
    """Under pytest-xdist the longest test files come first (tests/xdist_files.py); one process keeps the
    files' order."""
    if _xdist_worker():
        from xdist_files import order_items

        order_items(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``-n N`` (``--dist load`` or ``loadfile``): a file at a time, longest first, test_realbroker.py on gw0
    (tests/xdist_files.py).  Other ``--dist`` modes are xdist's own."""
    if config.getoption("dist") in ("load", "loadfile"):
        from xdist_files import make_scheduler

        return make_scheduler(config, log)
    return None


def pytest_collection_finish(session):
    """The real-broker runs, minutes of brokers waiting on their timers, start as soon as the tests are
    collected and overlap the rest of the suite (test_realbroker's fixture then only waits for them).  Under
    pytest-xdist only worker gw0 starts them: test_realbroker.py runs there (tests/xdist_files.py)."""
    if session.config.option.collectonly or os.environ.get("TXAUDIT_REALBROKER_EARLY", "1") == "0":
        return
    from xdist_files import PINNED_WORKER

    if _xdist_worker() not in ("", PINNED_WORKER):
        return
    for item in session.items:
        if Path(str(item.path)).name == "test_realbroker.py" and hasattr(item.module, "start_early"):
            item.module.start_early(session)
            _REALBROKER_EARLY.append(item.module)
            return


def pytest_sessionfinish(session, exitstatus):
    for module in _REALBROKER_EARLY:
        module.stop_early()
