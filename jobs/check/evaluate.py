"""``check``: the CI data-quality mode -- evaluate a checks file on an audit run and exit like ``soda scan``.

    ./spark-submit.sh check [--checks FILE] --store DIR ... --out DIR [audit options]   # audit, then check
    ./spark-submit.sh check [--checks FILE] --out DIR [--run-id ID]    # check a run already under --out

The evaluation never reads a store and never needs Spark: it reads the run's own Delta tables under ``--out``
(``audit_runs`` picks the run -- default the latest finished one -- and names its tables) on the driver with
``deltalake`` / pyarrow, projecting the few columns the metrics need (jobs/check/metrics.py), evaluates the
checks (jobs/check/checks.py) and writes two Delta tables (schemas/quality.py): ``metrics`` (every metric of
the run, per broker and for all brokers) and ``check_results``; both replace the run's earlier rows.  They are
written through jobs/delta/sink.py's file writer and single-commit path on the driver (no Spark job), or with
``delta_sink.write_table`` when a Spark session with Delta Lake's own writer is in use.  Without ``--store``
spark-submit.sh runs this module's caller (jobs/main.py) with the venv's Python: no JVM starts at all.

The previous run for ``*_change`` (per result scope): the latest finished run before this one (by as-of, then
finish time) that audited the same broker (broker scope) or the same set of brokers (all brokers).  Its
metrics come from the ``metrics`` table, or are computed from its tables when it was never checked.

Outputs: a table and a one-line summary on stdout, ``--json FILE`` (Great Expectations-like: success,
statistics, results), ``--junit-xml FILE`` (jobs/check/output.py).  Exit codes: 0 all passed, 1 a warning, 2 a
failure, 3 could not evaluate (every such problem is a :class:`CheckError` or ChecksFileError: one line).
"""
from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa

from jobs.check.checks import CheckResult, ChecksFile, evaluate, exit_code, statistics
from jobs.check.metrics import (
    CHECK_BACK_COLUMNS,
    FINDINGS_COLUMNS,
    RECOVERY_COLUMNS,
    TX_COLUMNS,
    RunData,
    compute_metrics,
    metrics_table_rows,
    samples,
)
from jobs.delta import outfs
from schemas.core import Table
from schemas.quality import ALL_INSTANCE, CHECK_RESULTS, ENTITY_ALL, METRICS
from txlog_io.errors import TxlogError

RUNS_TABLE = "audit_runs"
#: logical table -> columns read
RUN_TABLES = {"transactions": TX_COLUMNS, "check_back_worklist": CHECK_BACK_COLUMNS,
              "recovery_worklist": RECOVERY_COLUMNS, "audit_anomalies": FINDINGS_COLUMNS}
_RUN_COLUMNS = ("run_id", "run_date", "as_of", "finished_at", "brokers", "table_paths")


class CheckError(TxlogError):
    """The checks cannot be evaluated on this output directory (no finished run, unreadable table, ...)."""


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    run_date: dt.date
    as_of: dt.datetime
    finished_at: dt.datetime
    brokers: Tuple[str, ...]
    table_paths: Dict[str, str]

    @property
    def order(self):
        return (self.as_of, self.finished_at, self.run_id)


@dataclass
class CheckReport:
    run: RunInfo
    checks: ChecksFile
    results: List[CheckResult]
    metrics: Dict[Tuple[str, str, str], float]
    seconds: Dict[str, float]
    tables: Dict[str, str]            # check_results / metrics -> directory

    @property
    def exit_code(self) -> int:
        return exit_code(self.results)

    @property
    def statistics(self) -> Dict[str, int]:
        return statistics(self.results)


def _named(table: Table, names: Dict[str, str]) -> Table:
    name = names.get(table.name, table.name)
    return table if name == table.name else Table.of(name, table.columns, table.comment, table.partition_by)


# ------------------------------------------------------------------------------------------------------------
# reading the run (driver, deltalake)
# ------------------------------------------------------------------------------------------------------------

def _delta_read(path: str, what: str, run_id: Optional[str] = None, columns: Optional[Sequence[str]] = None
                ) -> pa.Table:
    from jobs.delta.tables import DeltaReadError, read_table

    try:
        table = read_table(path, what=what, columns=columns, **({"run_id": run_id} if run_id is not None else {}))
    except DeltaReadError as e:
        raise CheckError(str(e)) from None
    if table is None:
        raise CheckError(f"{what}: no Delta table at {path}")
    return table


def _ts(v) -> dt.datetime:
    return v if v.tzinfo else v.replace(tzinfo=dt.timezone.utc)


def read_runs(out: str, names: Dict[str, str]) -> List[RunInfo]:
    """Every finished run under ``out`` (``audit_runs``), oldest first."""
    path = outfs.join(out, names.get(RUNS_TABLE, RUNS_TABLE))
    if not outfs.is_delta(path):
        raise CheckError(f"--out {out}: no finished audit run ({path} is not a Delta table); run "
                         f"'check --store ...' or 'audit' first")
    rows = _delta_read(path, "audit_runs", columns=_RUN_COLUMNS).to_pylist()
    runs = [RunInfo(r["run_id"], r["run_date"], _ts(r["as_of"]), _ts(r["finished_at"]), tuple(r["brokers"]),
                    dict(r["table_paths"] or [])) for r in rows]
    return sorted(runs, key=lambda r: r.order)


def _table_dir(out: str, run: RunInfo, logical: str, names: Dict[str, str]) -> str:
    """The run's own record of where it wrote ``logical``; ``<out>/<name>`` when that path is gone (an output
    directory copied elsewhere, e.g. a CI artifact)."""
    recorded = run.table_paths.get(logical)
    if recorded and outfs.isdir(recorded):
        return recorded
    return outfs.join(out, outfs.basename(recorded) if recorded else names.get(logical, logical))


def load_run_data(out: str, run: RunInfo, names: Dict[str, str]) -> RunData:
    from concurrent.futures import ThreadPoolExecutor

    def read(logical: str) -> pa.Table:
        return _delta_read(_table_dir(out, run, logical, names), f"run {run.run_id}: {logical}", run.run_id,
                           RUN_TABLES[logical])

    # four small reads in parallel: each is mostly delta-rs log replay + Parquet I/O, outside the GIL
    with ThreadPoolExecutor(max_workers=len(RUN_TABLES)) as pool:
        tables = dict(zip(RUN_TABLES, pool.map(read, RUN_TABLES), strict=True))
    return RunData(run.run_id, run.brokers, tables["transactions"], tables["check_back_worklist"],
                   tables["recovery_worklist"], tables["audit_anomalies"])


class _History:
    """Metrics of earlier runs, per run id: from the ``metrics`` table, else computed from its tables."""

    def __init__(self, out: str, names: Dict[str, str], runs: List[RunInfo], current: RunInfo):
        self.out, self.names, self.current = out, names, current
        self.before = [r for r in runs if r.order < current.order and r.run_id != current.run_id]
        self.path = outfs.join(out, names.get(METRICS.name, METRICS.name))
        self.cache: Dict[str, Dict[Tuple[str, str, str], float]] = {}

    def _metrics_of(self, run: RunInfo) -> Dict[Tuple[str, str, str], float]:
        if run.run_id not in self.cache:
            got = {}
            if outfs.is_delta(self.path):
                t = _delta_read(self.path, "metrics", run.run_id, ("entity", "instance", "name", "value"))
                got = {(e, i, n): v for e, i, n, v in zip(*(t.column(c).to_pylist() for c in
                                                            ("entity", "instance", "name", "value")),
                                                          strict=True)}
            if not got:
                got = compute_metrics(load_run_data(self.out, run, self.names))
            self.cache[run.run_id] = got
        return self.cache[run.run_id]

    def __call__(self, entity: str, instance: str, name: str):
        for run in reversed(self.before):
            same = (set(run.brokers) == set(self.current.brokers)) if entity == ENTITY_ALL \
                else instance in run.brokers
            if same:
                m = self._metrics_of(run)
                return m.get((entity, instance, name), 0.0), run.run_id
        return None, None


# ------------------------------------------------------------------------------------------------------------
# writing check_results and metrics
# ------------------------------------------------------------------------------------------------------------

def results_table(run: RunInfo, results: Sequence[CheckResult]) -> pa.Table:
    from jobs.delta.sink import arrow_schema_for

    schema = arrow_schema_for(CHECK_RESULTS)
    rows = [dict(r.as_row(run.run_id), run_date=run.run_date) for r in results]
    return pa.Table.from_pylist(rows, schema=schema)


def write_arrow(out: str, table: Table, data: pa.Table, run_id: str, run_date: dt.date, spark=None,
                writer: str = "auto") -> str:
    """Write ``data`` as run ``run_id`` of ``<out>/<table.name>`` (replacing that run's rows) with
    ``jobs.delta.sink.write_table``: from the driver in one commit, or through Spark when the session writes
    Delta itself."""
    from jobs.delta import sink as delta_sink

    return delta_sink.write_table(data, out, table, run_id, None, spark, run_date=run_date, writer=writer).path


# ------------------------------------------------------------------------------------------------------------
# the whole evaluation
# ------------------------------------------------------------------------------------------------------------

def run_check(checks: ChecksFile, out: str, run_id: Optional[str] = None,
              names: Optional[Dict[str, str]] = None, spark=None, writer: str = "auto") -> CheckReport:
    """Evaluate ``checks`` on run ``run_id`` (default: the latest finished run) under ``out`` and write its
    ``metrics`` and ``check_results``.  Spark-free unless ``spark`` is given and writes Delta itself."""
    names = dict(names or {})
    t0 = time.monotonic()
    seconds: Dict[str, float] = {}
    runs = read_runs(out, names)
    if not runs:
        raise CheckError(f"--out {out}: audit_runs has no finished run")
    if run_id is None:
        run = runs[-1]
    else:
        found = [r for r in runs if r.run_id == run_id]
        if not found:
            known = ", ".join(r.run_id for r in runs[-5:])
            raise CheckError(f"--run-id {run_id}: no finished run with that id under {out} (latest: {known})")
        run = found[0]
    data = load_run_data(out, run, names)
    seconds["read"] = time.monotonic() - t0
    t1 = time.monotonic()
    metrics = compute_metrics(data)
    history = _History(out, names, runs, run)
    results = evaluate(checks, metrics, run.brokers, history, lambda m, b: samples(data, m, b))
    seconds["evaluate"] = time.monotonic() - t1
    t2 = time.monotonic()
    tables = {}
    for table, rows in ((_named(METRICS, names), metrics_table_rows(run.run_id, run.run_date, metrics)),
                        (_named(CHECK_RESULTS, names), results_table(run, results))):
        tables[table.name] = write_arrow(out, table, rows, run.run_id, run.run_date, spark, writer)
    seconds["write"] = time.monotonic() - t2
    seconds["total"] = time.monotonic() - t0
    return CheckReport(run, checks, results, metrics, seconds, tables)


def log(msg: str) -> None:
    print(f"txaudit: {msg}", file=sys.stderr, flush=True)


__all__ = ["run_check", "CheckReport", "CheckError", "RunInfo", "read_runs", "load_run_data", "write_arrow",
           "results_table", "ALL_INSTANCE"]
