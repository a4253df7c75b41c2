"""Every Spark job a small audit runs, per mode, in a warm session (jobs.bench.sparkjobs: Spark's own status
store): job id, the audit phase it ran in (its ``txaudit <phase>`` description), call site, seconds, stages
(skipped), tasks; then per phase the job count and job seconds, and the audit's wall time.

    .venv/bin/python scripts/list_audit_jobs.py [--store DIR ...] [--modes full,indexed] [--runs 3]
                                                [--read auto|job|both]

Default store: the 4.9.8 real-broker fixture.  The first audit of each mode warms the JVM and the Python
workers and is not listed; the later runs' wall times are printed (median last) and the jobs of the last run
are listed.  ``--read both`` audits each mode alternately as the read chooses and with the read forced into
its Spark job (as it ran before small reads moved to the driver), so both are timed under the same load.
The store is read, never written; the outputs go to a temporary directory."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import OrderedDict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
AS_OF = "2026-11-22T00:00:00Z"


def audit_once(spark, stores, out: Path, mode: str):
    from jobs.audit.run import run_audit
    from jobs.bench.sparkjobs import job_mark, jobs_since
    from jobs.main import parse_args

    args = ["audit", "--out", str(out), "--as-of", AS_OF, "--mode", mode]
    for s in stores:
        args += ["--store", str(s)]
    _, opts = parse_args(args)
    mark = job_mark(spark)
    t0 = time.monotonic()
    summary = run_audit(spark, opts, print_summary=False)
    secs = time.monotonic() - t0
    return secs, jobs_since(spark, mark), summary


def _report(label: str, walls: list, jobs: list, summary) -> dict:
    from jobs.bench.sparkjobs import phase_of

    median = sorted(walls)[len(walls) // 2]
    print(f"== {label}: {len(jobs)} Spark jobs; wall s per run {walls} (median {median})")
    print(f"{'job':>4} {'phase':<28} {'s':>6} {'stages':>7} {'tasks':>5}  call site")
    per_phase: "OrderedDict[str, list]" = OrderedDict()
    for j in jobs:
        ph = phase_of(j)
        per_phase.setdefault(ph, []).append(j.seconds)
        stages = f"{j.stages}({j.skipped_stages})" if j.skipped_stages else str(j.stages)
        print(f"{j.job_id:>4} {ph:<28} {j.seconds:>6.2f} {stages:>7} {j.tasks:>5}  {j.callsite}")
    for ph, secs in per_phase.items():
        print(f"     {ph:<28} {len(secs)} job(s) {sum(secs):.2f} s")
    phases = {k: round(v, 3) for k, v in summary.phases.items()}
    print(f"     phase seconds of the last run: {json.dumps(phases)}")
    return {"jobs": len(jobs), "wall_s": walls, "median_s": median,
            "per_phase": {ph: len(s) for ph, s in per_phase.items()}, "phases": phases}


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--store", action="append", default=None)
    p.add_argument("--modes", default="full,indexed")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--read", default="auto",
                   help="auto (the read's own choice), job (forced into its Spark job: "
                        "full_read.LOCAL_READ_DRIVER_BYTES = 0), or both, alternating run by run")
    a = p.parse_args(argv)
    from jobs.read import full
    from jobs.session import build_session

    stores = a.store or [str(ROOT / "tests" / "data" / "fixtures" / "rocketmq-4.9.8" / "store")]
    variants = ["auto", "job"] if a.read == "both" else [a.read]
    bound = {"auto": full.LOCAL_READ_DRIVER_BYTES, "job": 0}
    spark = build_session(app_name="audit-jobs", master=a.master,
                          extra_conf={"spark.ui.showConsoleProgress": "false", "spark.ui.enabled": "false"})
    result = {}
    with tempfile.TemporaryDirectory(prefix="audit-jobs-") as tmp:
        for mode in a.modes.split(","):
            walls: dict = {v: [] for v in variants}
            last: dict = {}
            for i in range(a.runs + 1):
                for v in variants:
                    full.LOCAL_READ_DRIVER_BYTES = bound[v]
                    secs, jobs, summary = audit_once(spark, stores, Path(tmp) / f"out-{mode}-{v}", mode)
                    last[v] = (jobs, summary)
                    if i:
                        walls[v].append(round(secs, 2))
            for v in variants:
                label = mode if v == "auto" else f"{mode} (read in its job)"
                result[label] = _report(label, walls[v], *last[v])
            print(f"     load average after {mode}: {os.getloadavg()[0]:.1f}")
    spark.stop()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
