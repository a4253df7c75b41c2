"""Times the audit of the bench's warm-up store (jobs.bench.audit.calibration_store) in a warm session:
phase seconds and the number of Spark jobs / stages each audit runs (statusTracker).

    .venv/bin/python scripts/measure_small_audit.py [--runs 3] [--dir /tmp/small-audit]

The first audit of each mode warms the JVM and the Python workers and is not reported; the store is read
from the page cache (warm) since it was just generated."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


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
            secs, summary = B.timed_audit(spark, store, work / f"out-{mode}", mode)
            after_j, after_s = _counts(sc)
            if i == 0:
                continue
            runs.append({"s": round(secs, 2), "jobs": len(after_j - before_j),
                         "stages": len(after_s - before_s),
                         "phases": {k: round(v, 2) for k, v in summary.phases.items()},
                         "transactions": summary.transactions, "states": summary.states})
        out[mode] = runs
        print(mode, json.dumps(runs, indent=None), flush=True)
    spark.stop()
    print(json.dumps({m: {"median_s": sorted(r["s"] for r in rs)[len(rs) // 2], "jobs": rs[-1]["jobs"],
                          "stages": rs[-1]["stages"]} for m, rs in out.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
