"""``txlog-bench scale``: transaction-heavy brokers audited on the distributed reduce path.

    txlog-bench scale [--transactions 300000,1000000,3000000] [--driver-memory 2g] [--worker-memory 1g]
                      [--master local[2]] [--msg-bytes 64] [--dir DIR] [--keep]

Per count N:

1. **store** -- the reference broker (``refbroker.generate``, profile 5.1+, scenario ``clean``: every
   transaction class of the generator's base mix -- commits, rollbacks, check-answered ones, re-put copies,
   immunity, late commits, unknown and in-flight ones) writes ONE broker's store of N transactions and no
   ordinary messages, bodies of ``--msg-bytes``.  ``--keep`` reuses a store generated earlier under ``--dir``.
2. **audit** -- ``jobs.audit.run.run_audit`` in ``full`` mode with ``reconstruct.path=distributed`` (linking as
   Spark joins, the rules per partition of transactions), in a session on ``--master`` (default
   ``local[2]``) whose Python workers are capped at ``--worker-memory`` (``spark.executor.pyspark.memory``).
3. **ledger** -- every reconstructed state against the ledger's ``visible_outcome`` (what the store can
   show), the ledger read and joined in Spark (``jobs.demo.compare_with_ledger``): the driver, which runs
   every count in one process, never holds a ledger.

Memory: a sampler thread reads ``/proc`` every 0.2 s during each audit: ``peak_worker_rss_mb`` is the largest
resident set of one Python worker (``pyspark.daemon`` / ``pyspark.worker`` descendants), ``peak_driver_rss_mb``
the driver's (this Python process plus its JVM).  Resident sets, not ``VmHWM``: the session and its workers
outlive one count, and a high-water mark would carry the previous count's peak.

Output: one line per count, then as the LAST line one JSON object::

    {"runs": [{"transactions": N, "audit_s": ..., "s_per_million_tx": ..., "reduce_path": "distributed",
               "reduce_tasks": ..., "peak_worker_rss_mb": ..., "peak_driver_rss_mb": ...,
               "ledger_matched": ..., "ledger_total": ..., "generate_s": ..., "generate_tx_per_s": ...,
               "phases": {...}}, ...]}

``generate_s`` is the store's generation (wall seconds) and ``generate_tx_per_s`` its rate (None when
``--keep`` reused a store)."""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from jobs.bench.audit import python_workers

PROFILE = "5.1+"
SCENARIO = "clean"
SEED = 1
AS_OF = "2026-11-22T00:00:00Z"
#: environment of the session's Python workers (inherited from this process on a local master)
WORKER_ENV = {"ARROW_DEFAULT_MEMORY_POOL": "system", "MALLOC_ARENA_MAX": "2"}


def _rss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> List[int]:
    out = []
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    data = fh.read()
                if int(data[data.rindex(b")") + 2:].split()[1]) == pid:
                    out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return out


class RssPeaks:
    """Background thread: peak resident set (MB) of one Python worker and of the driver (this process plus
    its direct java child, the JVM) while in the ``with`` block."""

    def __init__(self, interval: float = 0.2):
        self.interval, self.worker_kb, self.driver_kb = interval, 0, 0
        self.python_kb = self.jvm_kb = 0        # the driver's two processes apart (their peaks need not coincide)
        self.jvm = [p for p in _children(os.getpid()) if _is_java(p)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-peaks", daemon=True)

    def _sample(self) -> None:
        for pid in python_workers(os.getpid()):
            self.worker_kb = max(self.worker_kb, _rss_kb(pid))
        py, jvm = _rss_kb(os.getpid()), sum(_rss_kb(p) for p in self.jvm)
        self.python_kb, self.jvm_kb = max(self.python_kb, py), max(self.jvm_kb, jvm)
        self.driver_kb = max(self.driver_kb, py + jvm)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssPeaks":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _is_java(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"java" in fh.read().split(b"\0")[0]
    except OSError:
        return False


def _generate(n: int, msg_bytes: int, base: str) -> Tuple[str, str]:
    """The reference broker's store of ``n`` transactions under ``base`` -> (store dir, ledger path)."""
    from refbroker import generate

    res = generate(PROFILE, SCENARIO, n, SEED, Path(base), background_messages=0, msg_bytes=msg_bytes)
    return str(res.store_dir), str(res.ledger_path)


def generate_store(n: int, msg_bytes: int, base: Path, keep: bool):
    """-> (store dir, ledger path, seconds).  The generation runs in a child process: the simulation's heap
    (600 MB at 300k transactions, more with every count) would otherwise stay in this process, which audits
    next and whose resident set is ``peak_driver_rss_mb`` (a freed Python heap is rarely returned to the
    system): the figure would be the generator's, not the audit's driver."""
    params = {"transactions": n, "msg_bytes": msg_bytes, "profile": PROFILE, "scenario": SCENARIO, "seed": SEED}
    marker = base / "bench-params.json"
    if keep and marker.is_file() and (base / "store").is_dir() and (base / "ledger.jsonl").is_file():
        if json.loads(marker.read_text()) == params:
            return base / "store", base / "ledger.jsonl", 0.0
    t0 = time.monotonic()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        store_dir, ledger = pool.submit(_generate, n, msg_bytes, str(base)).result()
    marker.write_text(json.dumps(params))
    return Path(store_dir), Path(ledger), time.monotonic() - t0


def audit_once(spark, store: Path, out: Path, workdir: Path) -> dict:
    """One full-mode audit on the distributed path: seconds, path, tasks, peaks, phases, run id."""
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    conf = workdir / "scale.properties"
    conf.write_text("mode=full\nreconstruct.path=distributed\n")
    _, opts = parse_args(["audit", "--store", str(store), "--out", str(out), "--as-of", AS_OF,
                          "--conf-file", str(conf), "--mode", "full"])
    got: dict = {}

    def on_result(result, summary):
        got.update(path=result.path, tasks=result.reduce_tasks)

    with RssPeaks() as peaks:
        t0 = time.monotonic()
        summary = run_audit(spark, opts, print_summary=False, on_result=on_result)
        seconds = time.monotonic() - t0
    return {"audit_s": seconds, "reduce_path": got.get("path"), "reduce_tasks": got.get("tasks"),
            "peak_worker_rss_mb": round(peaks.worker_kb / 1024, 1),
            "peak_driver_rss_mb": round(peaks.driver_kb / 1024, 1), "run_id": summary.run_id,
            "peak_driver_split_mb": {"python": round(peaks.python_kb / 1024, 1),
                                     "jvm": round(peaks.jvm_kb / 1024, 1)},
            "phases": {k: round(v, 2) for k, v in summary.phases.items() if not k.startswith("write.")}}


def ledger_match(spark, ledger: Path, out: Path, run_id: str) -> tuple:
    """(matched, total) of the ledger's transactions whose reconstructed state is their visible outcome."""
    from jobs.demo import compare_with_ledger, read_delta_run

    tx = read_delta_run(spark, str(out / "transactions"), run_id)
    cmp = compare_with_ledger(spark, str(ledger), tx)
    return sum(cmp.visible_matched.values()), sum(cmp.visible_total.values()) + cmp.extra


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="txlog-bench scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--transactions", default="300000,1000000,3000000",
                   help="comma-separated transaction counts, one store each")
    p.add_argument("--driver-memory", default="2g")
    p.add_argument("--worker-memory", default="1g", help="spark.executor.pyspark.memory (Python worker cap)")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--msg-bytes", type=int, default=64)
    p.add_argument("--dir", default=None, help="work directory (default: a temporary one, removed after)")
    p.add_argument("--keep", action="store_true", help="keep (and reuse) the generated stores under --dir")
    return p


def run(argv: Optional[Sequence[str]] = None) -> List[dict]:
    args = _parser().parse_args(list(argv or []))
    counts = [int(x) for x in str(args.transactions).split(",") if x.strip()]
    own_dir = args.dir is None
    workdir = Path(tempfile.mkdtemp(prefix="txlog-bench-scale-")) if own_dir else Path(args.dir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    from jobs.session import build_session

    # the cap is an address-space limit (RLIMIT_AS), not a resident-set one: allocators that reserve address
    # space ahead (glibc's 64 MiB per-thread arenas, Arrow's mimalloc / jemalloc pools) hit it with little
    # memory in use, so the workers allocate from the system pool with two arenas
    for k, v in WORKER_ENV.items():
        os.environ.setdefault(k, v)
    spark = build_session(app_name="txaudit-bench-scale", master=args.master, extra_conf={
        "spark.driver.memory": args.driver_memory, "spark.executor.pyspark.memory": args.worker_memory,
        # local mode: the executor is the driver JVM, and at 1M transactions with a 2 GiB heap the default
        # unified memory share (0.6) let the linking windows' sorters take pages the heap no longer had
        # (OutOfMemoryError: Java heap space); 0.4 leaves the rest of the heap its headroom
        "spark.memory.fraction": "0.4",
        "spark.ui.showConsoleProgress": "false",
        **{f"spark.executorEnv.{k}": v for k, v in WORKER_ENV.items()}})
    runs: List[dict] = []
    try:
        for n in counts:
            base = workdir / f"store-{n}"
            store, ledger, gen_s = generate_store(n, args.msg_bytes, base, args.keep)
            out = workdir / f"out-{n}"
            shutil.rmtree(out, ignore_errors=True)
            r = audit_once(spark, store, out, workdir)
            matched, total = ledger_match(spark, ledger, out, r.pop("run_id"))
            runs.append({"transactions": n, "audit_s": round(r["audit_s"], 2),
                         "s_per_million_tx": round(r["audit_s"] / n * 1e6, 2), "reduce_path": r["reduce_path"],
                         "reduce_tasks": r["reduce_tasks"], "peak_worker_rss_mb": r["peak_worker_rss_mb"],
                         "peak_driver_rss_mb": r["peak_driver_rss_mb"], "ledger_matched": matched,
                         "ledger_total": total, "generate_s": round(gen_s, 1),
                         "generate_tx_per_s": round(n / gen_s) if gen_s > 0 else None, "phases": r["phases"],
                         "peak_driver_split_mb": r["peak_driver_split_mb"]})
            print(f"{n} transactions: audit {r['audit_s']:.1f} s ({runs[-1]['s_per_million_tx']} s per million), "
                  f"{r['reduce_tasks']} reduce tasks, worker {r['peak_worker_rss_mb']} MB, driver "
                  f"{r['peak_driver_rss_mb']} MB, ledger {matched}/{total}, generated in {gen_s:.0f} s",
                  file=sys.stderr, flush=True)
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
                shutil.rmtree(out, ignore_errors=True)
    finally:
        spark.stop()
        if own_dir and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"runs": runs}), flush=True)
    return runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(sys.argv[1:] if argv is None else argv)
    return 0


__all__ = ["main", "run", "RssPeaks", "generate_store"]
