"""The audit job: ``run_audit(spark, options)``.

PLACEHOLDER — to be replaced by the real implementation (data sources -> transaction reconstruction -> Delta
tables through ``jobs.delta_sink.write_table``).  ``jobs.main`` already parses and validates the command line
into ``jobs.main.AuditOptions`` and calls this function with the job's SparkSession; it maps
``NotImplementedError`` and any other exception to exit code 1 and ``UsageError`` to exit code 2.
"""
from __future__ import annotations


def run_audit(spark, options) -> None:
    """Audit ``options.stores`` as of ``options.as_of`` and write the outputs under ``options.out``."""
    raise NotImplementedError("reconstruction not wired yet")
