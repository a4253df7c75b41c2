"""The recovery job: ``./spark-submit.sh repair --store DIR --out AUDIT_OUT [--run-id ID] --into NEWDIR
[--actions LIST] [--dry-run]``.

Thin driver (no Spark: the audit's tables are small and read with ``deltalake`` on the driver):

1. pick the audit run (``--run-id``, else the newest ``audit_runs`` row whose stores include ``--store``) and
   the store's broker name and profile from it;
2. refuse (``UsageError``: exit 2, one line) when the run has no per-file fingerprint (``store_files``) or the
   store differs from it (txlog_io.fingerprint);
3. ``refbroker.repair.plan_repair`` on the run's ``recovery_worklist`` rows of that broker (reads the store
   read-only), then ``apply_repair`` into ``--into`` -- or, with ``--dry-run``, print the planned writes;
4. append the writes to the ``repair_log`` Delta table under AUDIT_OUT (the run's rows for that broker
   replaced) and write the requests an operator sends to the live broker under
   ``AUDIT_OUT/recovery/<run_id>/`` (jobs.repair.requests).
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Optional, Tuple

from jobs.delta import outfs
from jobs.delta.tables import read_table
from txlog_io.errors import UsageError

RUNS_TABLE = "audit_runs"


@dataclass(frozen=True)
class RepairOptions:
    store: str                      # absolute store root (read-only)
    out: str                        # the audit's output directory
    into: str                       # absolute directory of the repaired copy (absent or empty)
    run_id: Optional[str]           # None: newest run that audited the store
    actions: Tuple[str, ...]
    dry_run: bool


def check_into(store: str, into: str) -> str:
    """``--into`` must be absent or an empty directory, and neither the store nor inside it."""
    path = os.path.abspath(into)
    s = os.path.realpath(store)
    real = os.path.realpath(path)
    if real == s or real.startswith(s.rstrip(os.sep) + os.sep):
        raise UsageError(f"--into must not be the store or inside it (the store is read-only): {path}")
    if s.startswith(real.rstrip(os.sep) + os.sep):
        raise UsageError(f"--into must not contain the store: {path}")
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise UsageError(f"--into exists and is not a directory: {path}")
        if os.listdir(path):
            raise UsageError(f"--into exists and is not empty: {path}")
    return path


def pick_run(out: str, store: str, run_id: Optional[str]) -> dict:
    runs = read_table(outfs.join(out, RUNS_TABLE))
    if runs is None:
        raise UsageError(f"--out: no {RUNS_TABLE} table under {out} (run the audit first)")
    rows = [r for r in runs.to_pylist() if store in (r["stores"] or [])]
    if run_id is not None:
        rows = [r for r in rows if r["run_id"] == run_id]
        if not rows:
            raise UsageError(f"--run-id: no finished audit run {run_id!r} of store {store} in {out}")
    if not rows:
        raise UsageError(f"--store: no finished audit run of {store} in {out}")
    return max(rows, key=lambda r: (r["finished_at"], r["run_id"]))


def check_fingerprint(run: dict, broker: str, store: str) -> None:
    from txlog_io.fingerprint import FilePrint, compare_prints, store_prints

    path = dict(run["table_paths"]).get("store_files", outfs.join(run["out"], "store_files"))
    table = read_table(path, run_id=run["run_id"], broker=broker)
    if table is None or table.num_rows == 0:
        raise UsageError(f"audit run {run['run_id']} kept no per-file fingerprint of {store} (audited before "
                         f"store_files existed); audit the store again")
    expected = {r["file"]: FilePrint(r["file"], r["size"], r["mtime_ns"], r["edge_sha256"])
                for r in table.to_pylist()}
    diffs = compare_prints(expected, store_prints(store))
    if diffs:
        more = f" (and {len(diffs) - 1} more)" if len(diffs) > 1 else ""
        raise UsageError(f"--store differs from what audit run {run['run_id']} saw: {diffs[0]}{more}; "
                         f"audit it again before repairing")


def _print_log(rows) -> None:
    print(f"{'action':<20} {'file':<60} {'position':>10} {'bytes':>8}  transaction_key / detail")
    for r in rows:
        print(f"{r['action']:<20} {r['file']:<60} {r['position']:>10} {r['bytes']:>8}  "
              f"{r['transaction_key'] or '-'}  {r['detail']}")


def write_repair_log(out: str, rows: list) -> str:
    """Append ``rows`` (schemas.repair.REPAIR_LOG) to ``out/repair_log``, replacing the rows of the same run
    id and broker."""
    import deltalake
    import pyarrow as pa

    from schemas.repair import REPAIR_LOG

    path = outfs.join(out, REPAIR_LOG.name)
    options = outfs.delta_options(path)
    table = pa.Table.from_pylist(rows, schema=REPAIR_LOG.arrow_schema())
    if outfs.is_delta(path) and rows:
        quoted = {k: str(rows[0][k]).replace("'", "''") for k in ("run_id", "broker")}
        pred = " AND ".join(f"{k} = '{v}'" for k, v in quoted.items())
        deltalake.write_deltalake(path, table, mode="overwrite", predicate=pred, partition_by=["run_id"],
                                  storage_options=options)
    else:
        deltalake.write_deltalake(path, table, mode="append", partition_by=["run_id"],
                                  description=REPAIR_LOG.comment, name=REPAIR_LOG.name, storage_options=options)
    return path


def run_repair(options: RepairOptions) -> int:
    from jobs.repair.requests import write_requests
    from refbroker.repair import apply_repair, plan_repair

    t0 = time.monotonic()
    run = pick_run(options.out, options.store, options.run_id)
    broker = run["brokers"][run["stores"].index(options.store)]
    profile = dict(run["profiles"]).get(broker, "unknown")
    check_fingerprint(run, broker, options.store)
    path = dict(run["table_paths"]).get("recovery_worklist", outfs.join(options.out, "recovery_worklist"))
    worklist = read_table(path, run_id=run["run_id"], broker=broker)
    rows = worklist.to_pylist() if worklist is not None else []
    plan = plan_repair(options.store, profile, rows, actions=options.actions, as_of_ms=int(run["as_of_ms"]))
    log = [dict(r, run_id=run["run_id"], broker=broker, into=options.into) for r in plan.log_rows()]
    print(f"txaudit: repair of {options.store} (broker {broker}, profile {profile}) from audit run "
          f"{run['run_id']}: {len(rows)} work-list row(s), {len(log)} write(s)", file=sys.stderr)
    for note in plan.notes:
        print(f"txaudit: note: {note}", file=sys.stderr)
    if options.dry_run:
        _print_log(log)
        return 0
    t1 = time.monotonic()
    copied = apply_repair(plan, options.into)
    seconds = time.monotonic() - t1
    if log:
        write_repair_log(options.out, log)
    folder = write_requests(options.out, run)
    _print_log(log)
    print(f"txaudit: copied {copied / 1e6:.1f} MB into {options.into} and wrote {len(log)} repair(s) in "
          f"{seconds:.1f} s ({copied / 1e6 / max(seconds, 1e-9):.0f} MB/s); requests in {folder} "
          f"({time.monotonic() - t0:.1f} s in all)", file=sys.stderr)
    return 0


__all__ = ["RepairOptions", "run_repair", "check_into", "pick_run", "check_fingerprint", "write_repair_log"]
