"""Tables the CI data-quality mode (``check``, jobs/check/evaluate.py) writes: one row per check result, one row per
metric value.

``metrics`` follows Deequ's ``successMetricsAsDataFrame`` shape (``entity, instance, name, value``) keyed by
run: entity ``broker`` with the broker's name as instance, and entity ``all`` with instance ``*``.  Every
metric of the registry (jobs/check/metrics.py) gets a row for every checked run, so the table is the
history ``warn_change`` / ``fail_change`` read.

``check_results`` column names are a contract with the HTML report (jobs/report*): keep them as they are.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column as C
from schemas.core import Table

_str, _f64, _date = pa.string(), pa.float64(), pa.date32()
_strs = pa.list_(pa.string())

#: ``check_results.status`` values, least to most severe
STATUSES = ("PASS", "WARN", "FAIL", "ERROR")
#: ``metrics.entity`` values
ENTITY_BROKER, ENTITY_ALL, ALL_INSTANCE = "broker", "all", "*"

CHECK_RESULTS = Table.of("check_results", [
    C("run_id", _str, False, "audit run the checks were evaluated on"),
    C("check", _str, False, "check name, from the checks file"),
    C("metric", _str, False, "metric of the registry (jobs/check/metrics.py) the check reads"),
    C("broker", _str, False, "broker the result is about, or * for all brokers of the run together"),
    C("level", _str, False, "most severe level the check can raise: fail (it has a fail or fail_change "
                            "condition) or warn"),
    C("status", _str, False, "PASS, WARN, FAIL or ERROR (the check could not be evaluated)"),
    C("value", _f64, True, "metric value in this run (null when it could not be computed)"),
    C("condition", _str, True, "the condition that decided a WARN/FAIL (e.g. 'fail: > 0'); for PASS every "
                               "condition of the check, '; '-separated"),
    C("previous_value", _f64, True, "the metric in the previous run of the same broker(s) (only for checks "
                                    "with warn_change / fail_change; null when there is none)"),
    C("message", _str, False, "what was found, in words"),
    C("samples", _strs, False, "up to 10 transaction keys (broker:key) or findings (file@position, or "
                               "broker:commitlog@offset) behind a WARN/FAIL; empty otherwise"),
], "One row per check result (check x broker scope) of a run's data-quality evaluation",
    partition_by=("run_date",))

METRICS = Table.of("metrics", [
    C("run_id", _str, False, "audit run the metric was computed on"),
    C("run_date", _date, False, "UTC date of the run (its as-of time)"),
    C("entity", _str, False, "broker (one broker) or all (every broker of the run)"),
    C("instance", _str, False, "broker name, or * for entity all"),
    C("name", _str, False, "metric name (jobs/check/metrics.py registry)"),
    C("value", _f64, False, "metric value"),
], "Every registry metric of every checked run, per broker and for all brokers (Deequ-style history)",
    partition_by=("run_date",))

QUALITY_TABLES = {t.name: t for t in (CHECK_RESULTS, METRICS)}

__all__ = ["CHECK_RESULTS", "METRICS", "QUALITY_TABLES", "STATUSES", "ENTITY_BROKER", "ENTITY_ALL",
           "ALL_INSTANCE"]
