"""A real Spark standalone cluster on 127.0.0.1 for tests: one Master and one or more Workers, started from the
venv's pyspark with ``bin/spark-class`` (pip's pyspark has no ``sbin/start-*.sh``), each in its own process
group, and killed (the whole group: executors included) when the fixture ends.

Executors are started by the Worker, so they inherit its environment: ``SPARK_LOCAL_IP=127.0.0.1`` (nothing
binds to another interface) and ``PYSPARK_PYTHON`` = this interpreter (the venv's, with pyarrow and numba).
The Master's REST submission server is turned off (it would take the fixed port 6066 on a shared machine).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, List

import pytest

START_TIMEOUT = 90.0        # seconds for the Master to answer and every Worker to register (loaded machine)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spark_class() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "bin" / "spark-class"


class Cluster:
    """A running Master + Workers: ``url`` (spark://...), ``webui`` (the Master's web UI), ``work_dir`` (the
    Workers' --work-dir: ``<work_dir>/<n>/app-*/<executor>/stderr`` are the executors' logs)."""

    def __init__(self, base: Path, workers: int = 1, cores: int = 1, memory: str = "1g"):
        self.base = base
        self.port, self.webui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.webui = f"http://127.0.0.1:{self.webui_port}"
        self.work_dir = base / "work"
        self.n_workers, self.cores, self.memory = workers, cores, memory
        self.procs: List[subprocess.Popen] = []
        self.env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                        SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                        SPARK_DAEMON_JAVA_OPTS="-XX:TieredStopAtLevel=1",   # C1 only, as the suite's Spark JVMs
                        SPARK_LOG_DIR=str(base / "logs"), SPARK_NO_DAEMONIZE="1")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.base / f"{name}.log", "wb")
        try:
            self.procs.append(subprocess.Popen([str(spark_class()), *args], stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL, env=self.env, cwd=str(self.base),
                                               start_new_session=True))
        finally:
            log.close()

    def state(self) -> dict:
        """The Master's JSON view (workers, active and completed applications)."""
        with urllib.request.urlopen(f"{self.webui}/json/", timeout=5) as r:
            return json.load(r)

    def _wait(self, what: str, ready) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"standalone cluster: a process exited ({p.returncode}) while waiting for "
                                       f"{what}; logs in {self.base}")
            try:
                if ready(self.state()):
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"standalone cluster: no {what} after {START_TIMEOUT:.0f} s; logs in {self.base}")
            time.sleep(0.5)

    def start(self) -> "Cluster":
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.webui_port))
        self._wait("master web UI", lambda s: s.get("status") == "ALIVE")
        for i in range(self.n_workers):
            wd = self.work_dir / str(i)
            wd.mkdir(parents=True, exist_ok=True)
            self._spawn(f"worker{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", str(self.cores), "--memory", self.memory,
                        "--webui-port", str(free_port()), "--work-dir", str(wd))
        self._wait(f"{self.n_workers} registered worker(s)",
                   lambda s: s.get("aliveworkers", 0) >= self.n_workers)
        return self

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    def executor_logs(self) -> List[Path]:
        """Every executor's stderr the Workers wrote (``<work_dir>/<n>/<app id>/<executor id>/stderr``)."""
        return sorted(self.work_dir.glob("*/app-*/*/stderr"))


@contextmanager
def standalone(base: Path, workers: int = 1, cores: int = 1) -> Iterator[Cluster]:
    cluster = Cluster(base, workers=workers, cores=cores)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory) -> Iterator[Cluster]:
    """A Master and one 1-core Worker on 127.0.0.1 for the module's tests."""
    with standalone(tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster
