"""Times the audit of the bench's warm-up store (jobs.bench.audit.calibration_store) in a warm session:
phase seconds, the number of Spark jobs / stages each audit runs (statusTracker), the CPU seconds it cost
(``cpu``: driver, JVM, Python workers, from /proc: live processes' own time plus that of the children they
reaped) and, after each audit, the HTML report rebuilt alone (``report_s``, ``report_cpu``).

    .venv/bin/python scripts/measure_small_audit.py [--runs 3] [--dir /tmp/small-audit]

The first audit of each mode warms the JVM and the Python workers and is not reported; the store is read
from the page cache (warm) since it was just generated."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def _proc_cpu(pid: int) -> float:
    """utime + stime + cutime + cstime of a live process, in seconds (0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            f = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in f[11:15]) / os.sysconf("SC_CLK_TCK")


def cpu_split() -> dict:
    """CPU seconds so far of this process (driver), its JVM and every other descendant (Python workers)."""
    kids: dict = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    kids.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
            except OSError:
                continue
    t = os.times()
    out = {"driver": t.user + t.system, "jvm": 0.0, "workers": 0.0}
    todo = list(kids.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        todo += kids.get(pid, [])
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                exe = fh.read().split(b"\0")[0]
        except OSError:
            continue
        out["jvm" if exe.endswith(b"java") else "workers"] += _proc_cpu(pid)
    return out


def _counts(sc):
    st = sc.statusTracker()
    jobs = set(st.getJobIdsForGroup(None))
    stages = set()
    for j in jobs:
        info = st.getJobInfo(j)
        if info is not None:
            stages.update(info.stageIds)
    return jobs, stages


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--dir", default="/tmp/small-audit")
    p.add_argument("--master", default="local[2]")
    a = p.parse_args(argv)
    from jobs.bench import audit as B
    from jobs.report.write import write_report
    from jobs.session import build_session

    work = Path(a.dir)
    shutil.rmtree(work, ignore_errors=True)
    store, _ = B.calibration_store(0.01, 1024, work / "store")
    spark = build_session(app_name="small-audit", master=a.master,
                          extra_conf={"spark.ui.showConsoleProgress": "false"})
    sc = spark.sparkContext
    out = {}
    for mode in ("full", "indexed"):
        runs = []
        for i in range(a.runs + 1):
            before_j, before_s = _counts(sc)
            c0 = cpu_split()
            secs, summary = B.timed_audit(spark, store, work / f"out-{mode}", mode)
            c1 = cpu_split()
            after_j, after_s = _counts(sc)
            t0, r0 = time.monotonic(), time.process_time()
            write_report(str(work / f"out-{mode}"))
            report_s, report_cpu = time.monotonic() - t0, time.process_time() - r0
            if i == 0:
                continue
            runs.append({"s": round(secs, 2), "jobs": len(after_j - before_j),
                         "stages": len(after_s - before_s),
                         "cpu": {k: round(c1[k] - c0[k], 2) for k in c0},
                         "report_s": round(report_s, 3), "report_cpu": round(report_cpu, 3),
                         "phases": {k: round(v, 2) for k, v in summary.phases.items()},
                         "transactions": summary.transactions, "states": summary.states})
        out[mode] = runs
        print(mode, json.dumps(runs, indent=None), flush=True)
    spark.stop()
    def med(rs, key):
        return sorted(key(r) for r in rs)[len(rs) // 2]

    print(json.dumps({m: {"median_s": med(rs, lambda r: r["s"]), "jobs": rs[-1]["jobs"],
                          "stages": rs[-1]["stages"], "median_cpu": round(med(rs, lambda r: sum(r["cpu"].values())), 2),
                          "median_report_cpu": med(rs, lambda r: r["report_cpu"])} for m, rs in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
