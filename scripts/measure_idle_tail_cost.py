"""Spark jobs / stages and wall time of an indexed load + reconstruct of the three real-broker fixtures, with
and without the idle-tail scan of jobs/read/indexed/tails.py (disabled by monkeypatching split_idle_tails).  Reads
the fixtures only, writes nothing.

    SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python \\
        scripts/measure_idle_tail_cost.py 2>/dev/null
"""
from __future__ import annotations

import time
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "data" / "fixtures"
VERSIONS = ("rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3")


def main() -> None:
    from pyspark.sql import SparkSession

    import jobs.read.frames as SF
    import jobs.read.indexed.gaps as IG
    import jobs.read.indexed.tails as QT
    from jobs.reconstruct.spark import reconstruct

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    roots = [str(FIXTURES / v / "store") for v in VERSIONS]
    real_split = IG.split_idle_tails

    def run(label: str) -> None:
        sc = spark.sparkContext
        sc.setJobGroup(label, label)
        t0 = time.perf_counter()
        frames = SF.load_store_frames(spark, roots, mode="indexed", brokers=["a", "b", "c"])
        res = reconstruct(frames, None, local=True)
        secs = time.perf_counter() - t0
        st = sc.statusTracker()
        jobs = st.getJobIdsForGroup(label)
        stages = sum(len(st.getJobInfo(j).stageIds) for j in jobs)
        print(f"{label}: jobs {len(jobs)} stages {stages} seconds {secs:.1f} "
              f"transactions {res.arrow['transactions'].num_rows} findings {res.arrow['anomalies'].num_rows}",
              flush=True)

    run("warm-up")
    run("with idle tail")
    IG.split_idle_tails = lambda rows: ([r for r in rows if r[3] != QT.GAP_QUEUE_IDLE_TAIL], [])
    run("without idle tail")
    IG.split_idle_tails = real_split
    run("with idle tail again")


if __name__ == "__main__":
    main()
