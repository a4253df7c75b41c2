"""The Spark jobs a small audit runs -- the fixed cost every scheduled or CI audit pays -- counted by Spark's
own status store (jobs.bench.sparkjobs, fed by its listener bus), not timed: the 4.9.8 real-broker fixture
audited in each mode runs no Spark job (read, reduction, aggregates and Delta writes all on the driver);
forced to read in the one Spark job (``full_read.LOCAL_READ_DRIVER_BYTES`` = 0) it runs exactly that job
and writes the same tables, row for row."""
from __future__ import annotations

import pytest
from conftest import FIXTURES
from test_full_read import _rows

pytestmark = pytest.mark.spark

STORE = FIXTURES / "rocketmq-4.9.8" / "store"
AS_OF = "2026-11-22T00:00:00Z"
#: Spark jobs of a small audit per mode (scripts/list_audit_jobs.py lists them; docs/ARCHITECTURE.md)
MAX_JOBS = 0


def _audit(spark, out, mode):
    from deltalake import DeltaTable

    from jobs.audit.run import run_audit
    from jobs.bench.sparkjobs import job_mark, jobs_since
    from jobs.main import parse_args

    _, opts = parse_args(["audit", "--store", str(STORE), "--out", str(out), "--as-of", AS_OF, "--mode", mode,
                          "--run-id", "r1", "--no-report"])
    mark = job_mark(spark)
    summary = run_audit(spark, opts, print_summary=False)
    jobs = jobs_since(spark, mark)
    tables = {name: _rows(DeltaTable(t.path).to_pyarrow_table(), drop=("run_id",))
              for name, t in summary.tables.items() if name != "audit_runs"}
    return jobs, tables, summary


@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_a_small_audit_runs_no_spark_job(spark, tmp_path, monkeypatch, mode):
    from jobs.read import full

    jobs, tables, summary = _audit(spark, tmp_path / "driver", mode)
    assert len(jobs) <= MAX_JOBS, [(j.description, j.callsite) for j in jobs]
    assert summary.transactions > 10 and len(tables["transactions"]) == summary.transactions
    monkeypatch.setattr(full, "LOCAL_READ_DRIVER_BYTES", 0)
    jobs, in_job, _ = _audit(spark, tmp_path / "job", mode)
    # the counter sees the one-job read: the count above is not vacuous
    assert [j.description for j in jobs] == ["txaudit read"], [(j.description, j.callsite) for j in jobs]
    assert in_job == tables
