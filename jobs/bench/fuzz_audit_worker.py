"""One batch of ``txlog-bench fuzz --audit``, in a process of its own (the driver kills it after its timeout).

    python -m jobs.bench.fuzz_audit_worker JOB.json RESULT.json

``JOB.json``: ``{"stores": [[broker, root], ...], "pairs": [[mutant broker, intact broker], ...], "modes":
[...], "as_of": ISO, "out": DIR}``.  One local SparkSession; per mode ONE ``run_audit`` over every store of the
batch (the intact copies of the sources and the mutants, each under its own ``--broker`` name, so the audit
keys their transactions apart), with the outputs written as Delta tables under ``out/<mode>``.  The comparison
runs in Spark on the audit's frames: each mutant's transactions joined (full outer, on transaction_key) with
its source's intact ones; only the rows that differ (state, flags, or present on one side only) reach the
driver, with the per-broker transaction counts and finding codes.

``RESULT.json``: ``{"modes": {mode: {"diffs": [...], "tx": {broker: n}, "codes": {broker: {code: n}}}}}``,
or ``{"error": "traceback" | "clean", "message": ...}`` when an audit raised (exit 3).
"""
from __future__ import annotations

import json
import sys
import traceback


def _compare(spark, result, pairs):
    from pyspark.sql import functions as F

    tx = result.transactions.select("broker", "transaction_key", "state", F.array_sort("flags").alias("flags"),
                                    "prepared_commitlog_offset")
    p = spark.createDataFrame(pairs, "mutant string, base string")
    base = tx.join(F.broadcast(p), tx.broker == p.base).select(
        "mutant", "transaction_key", F.col("state").alias("b_state"), F.col("flags").alias("b_flags"),
        F.col("prepared_commitlog_offset").alias("b_offset"))
    mut = tx.join(F.broadcast(p.select("mutant")), tx.broker == p.mutant).select(
        "mutant", "transaction_key", F.col("state").alias("m_state"), F.col("flags").alias("m_flags"))
    d = base.join(mut, ["mutant", "transaction_key"], "full_outer").where(
        F.col("b_state").isNull() | F.col("m_state").isNull() | (F.col("b_state") != F.col("m_state"))
        | (F.col("b_flags") != F.col("m_flags")))
    diffs = [r.asDict() for r in d.collect()]
    counts = {r["broker"]: r["count"] for r in tx.groupBy("broker").count().collect()}
    codes: dict = {}
    for r in result.anomalies.groupBy("broker", "code").count().collect():
        codes.setdefault(r["broker"], {})[r["code"]] = r["count"]
    return {"diffs": diffs, "tx": counts, "codes": codes}


def audit_batch(spark, job: dict) -> dict:
    """Audit the batch ``job`` once per mode on ``spark``; the differences per mutant (module docstring)."""
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    out: dict = {"modes": {}}
    for mode in job["modes"]:
        argv = ["audit", "--out", f"{job['out']}/{mode}", "--as-of", job["as_of"], "--mode", mode,
                "--no-report"]
        for broker, root in job["stores"]:
            argv += ["--store", root, "--broker", broker]
        _, opts = parse_args(argv)
        got: dict = {}

        def on_result(result, summary, got=got):
            got.update(_compare(spark, result, job["pairs"]))

        run_audit(spark, opts, on_result=on_result, print_summary=False)
        out["modes"][mode] = got
    return out


def run(job: dict) -> dict:
    from jobs.session import build_session

    spark = build_session(app_name="txlog-bench-fuzz-audit", master="local[2]", extra_conf={
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4", "spark.sql.session.timeZone": "UTC"})
    try:
        return audit_batch(spark, job)
    finally:
        spark.stop()


def main(argv=None) -> int:
    from txlog_io.errors import TxlogError

    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as f:
        job = json.load(f)
    code = 0
    try:
        result = run(job)
    except TxlogError as e:
        result, code = {"error": "clean", "message": f"{type(e).__name__}: {e}"}, 3
    except Exception as e:  # noqa: BLE001 - the campaign counts them
        result, code = {"error": "traceback", "message": f"{type(e).__name__}: {e}\n"
                        f"{traceback.format_exc(limit=12)}"}, 3
    with open(args[1], "w") as f:
        json.dump(result, f)
    return code


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
