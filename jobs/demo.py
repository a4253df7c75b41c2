"""``./spark-submit.sh demo``: generate a reference store, audit it, compare the result with the ground truth.

1. The reference broker (``refbroker.generate``) writes a RocketMQ 5.1+ store for the ``crashy`` scenario --
   commits (some twice), rollbacks, unresolved transactions discarded after transactionCheckMax, in-flight
   ones, crashes between a commit and its op, lost op batches, torn tails, consume-queue dispatch lag -- with
   DEMO_TRANSACTIONS transactions in 1 MiB CommitLog files and a fixed seed, into ``<out>/demo-store``
   (``store/``, ``ledger.jsonl``, ``summary.json``; outside the Delta tables, which go to ``<out>/<table>``).
   The simulated clock starts one hour before ``--as-of`` (default: now), so the audit looks at the store as
   an operator would an hour after the broker stopped; the outcomes are the same for every as-of (fixed seed).
2. ``jobs.audit.run.run_audit`` audits it (broker name ``demo-store``) with the demo's options.
3. The transactions just written are read back from their Delta table (the committed files of this run id) and
   joined with the ledger in Spark; matched/total per true outcome (and per visible outcome: what the store
   still shows after the injected faults) is printed after the audit summary.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from jobs.audit.summary import AuditSummary, LedgerComparison, format_ledger_comparison

DEMO_PROFILE = "5.1+"
DEMO_SCENARIO = "crashy"
DEMO_TRANSACTIONS = 300
DEMO_SEED = 20240501
DEMO_COMMITLOG_FILE_MB = 1
DEMO_BROKER = "demo-store"
DEMO_STORE_DIR = "demo-store"
CLOCK_LEAD_MS = 3600 * 1000          # the simulated run starts this long before as-of
MISMATCH_SAMPLES = 10


@dataclass(frozen=True)
class DemoResult:
    summary: AuditSummary
    comparison: LedgerComparison
    store_dir: str
    ledger_path: str
    generate_seconds: float
    elapsed_s: float


def generate_demo_store(out: str, as_of_ms: int, transactions: int = DEMO_TRANSACTIONS,
                        seed: int = DEMO_SEED):
    """The demo store under ``<out>/demo-store`` (replaced when present) -> refbroker.GenerateResult."""
    from refbroker import generate

    return generate(DEMO_PROFILE, DEMO_SCENARIO, transactions, seed, os.path.join(out, DEMO_STORE_DIR),
                    commitlog_file_mb=DEMO_COMMITLOG_FILE_MB, start_ms=int(as_of_ms) - CLOCK_LEAD_MS)


def read_ledger(ledger_path) -> list:
    """``(transaction_key, outcome, visible_outcome)`` of every transaction line of a refbroker ledger."""
    rows = []
    with open(ledger_path, "r", encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            e = json.loads(line)
            if e.get("kind") == "transaction":
                rows.append((str(e["transaction_key"]), e["outcome"], e.get("visible_outcome")))
    return rows


def read_delta_run(spark, table_path: str, run_id: str):
    """The rows run ``run_id`` committed to the Delta table at ``table_path``, as a Spark DataFrame (the files
    of the table's current snapshot in that run's partition; partition columns recovered from the paths)."""
    from deltalake import DeltaTable

    files = DeltaTable(table_path).file_uris(partition_filters=[("run_id", "=", run_id)])
    if not files:
        return None
    return spark.read.option("basePath", table_path).parquet(*files)


def compare_with_ledger(spark, ledger_path, transactions, broker: Optional[str] = None) -> LedgerComparison:
    """Reconstructed ``state`` vs the ledger's ``outcome`` / ``visible_outcome``, joined on transaction_key in
    Spark; only per-outcome counts and a few mismatches reach the driver."""
    from pyspark.sql import functions as F

    c = F.col
    # read by Spark: the ledger has a line per transaction, never held by the driver
    ledger = spark.read.schema("kind string, transaction_key string, outcome string, visible_outcome string") \
        .option("mode", "FAILFAST").json(str(ledger_path)) \
        .where(c("kind") == "transaction").drop("kind")
    tx = transactions
    if broker is not None:
        tx = tx.where(c("broker") == broker)
    tx = tx.select("transaction_key", "state")
    j = ledger.join(tx, "transaction_key", "full")
    agg = j.groupBy("outcome", "visible_outcome").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum(F.when(c("state").isNotNull() & (c("state") == c("outcome")), 1).otherwise(0)).alias("ok"),
        F.sum(F.when(c("state").isNotNull() & (c("state") == c("visible_outcome")), 1).otherwise(0))
        .alias("vis_ok"),
        F.sum(F.when(c("state").isNull(), 1).otherwise(0)).alias("missing")).collect()
    matched, total, vmatched, vtotal = {}, {}, {}, {}
    missing = extra = 0
    for r in agg:
        if r["outcome"] is None:                 # reconstructed, not in the ledger
            extra += int(r["n"])
            continue
        o, v = r["outcome"], r["visible_outcome"]
        total[o] = total.get(o, 0) + int(r["n"])
        matched[o] = matched.get(o, 0) + int(r["ok"])
        if v is not None:
            vtotal[v] = vtotal.get(v, 0) + int(r["n"])
            vmatched[v] = vmatched.get(v, 0) + int(r["vis_ok"])
        missing += int(r["missing"])
    bad = j.where(c("outcome").isNull() | c("state").isNull() | (c("state") != c("outcome"))) \
        .orderBy("transaction_key").limit(MISMATCH_SAMPLES).collect()
    samples = tuple((r["transaction_key"], r["outcome"], r["visible_outcome"], r["state"]) for r in bad)
    return LedgerComparison(matched=matched, total=total, visible_matched=vmatched, visible_total=vtotal,
                            missing=missing, extra=extra, mismatches=samples)


def audit_options_for(options, store_dir: str):
    """The AuditOptions of the demo's audit (the demo's out, as-of, mode, config, run id)."""
    from jobs.cli_options import AuditOptions

    return AuditOptions(stores=(os.path.abspath(str(store_dir)),), brokers=(DEMO_BROKER,),
                        out=os.path.abspath(options.out), as_of=options.as_of, mode=options.mode,
                        conf_file=options.conf_file, include_bodies=options.include_bodies,
                        run_id=options.run_id,
                        profile=options.config.broker_profile, config=options.config,
                        report=getattr(options, "report", True))


def run_demo(spark, options, *, transactions: int = DEMO_TRANSACTIONS) -> DemoResult:
    """Generate, audit, compare (see the module docstring); prints the audit summary and the comparison."""
    from jobs.audit.run import epoch_ms, run_audit

    t0 = time.monotonic()
    out = os.path.abspath(options.out)
    os.makedirs(out, exist_ok=True)
    gen = generate_demo_store(out, epoch_ms(options.as_of), transactions=transactions)
    gen_s = time.monotonic() - t0
    s = gen.summary
    print(f"Demo store: {gen.store_dir} -- RocketMQ {DEMO_PROFILE}, scenario {DEMO_SCENARIO}, "
          f"{s['transactions']} transactions {s['outcomes']}, {s['store']['records']} records in "
          f"{s['store']['commitlog_files']} CommitLog file(s), faults {s['faults']} ({gen_s:.1f} s)",
          flush=True)

    summary = run_audit(spark, audit_options_for(options, gen.store_dir))
    tx = read_delta_run(spark, summary.tables["transactions"].path, options.run_id)
    if tx is None:
        tx = spark.createDataFrame([], "broker string, transaction_key string, state string")
    comparison = compare_with_ledger(spark, gen.ledger_path, tx, DEMO_BROKER)
    print(format_ledger_comparison(comparison), flush=True)
    elapsed = time.monotonic() - t0
    print(f"Demo finished in {elapsed:.1f} s. Ground truth: {gen.ledger_path}; read a table back with: "
          f"python -c \"import deltalake; print(deltalake.DeltaTable('{summary.tables['transactions'].path}')"
          f".to_pandas())\"", flush=True)
    return DemoResult(summary=summary, comparison=comparison, store_dir=str(gen.store_dir),
                      ledger_path=str(Path(gen.ledger_path)), generate_seconds=gen_s, elapsed_s=elapsed)


__all__ = ["run_demo", "DemoResult", "generate_demo_store", "compare_with_ledger", "read_ledger",
           "read_delta_run", "audit_options_for", "DEMO_PROFILE", "DEMO_SCENARIO", "DEMO_TRANSACTIONS",
           "DEMO_SEED", "DEMO_BROKER"]
