"""The audit's Delta tables read back on the driver: ``deltalake`` + pyarrow, no Spark, no JVM.

``check``, ``report``, ``repair`` and the recovery requests read a finished run's outputs (audit_runs, work
lists, findings, metrics, store_files): small tables, filtered on partition columns (``run_id``, ``broker``)
so that only that run's files are opened.  One reader, so that "no table there" (None) and "a table that
cannot be read" (:class:`DeltaReadError`, one line naming the table and the cause) mean the same everywhere;
the writers are in ``jobs.delta.sink``.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import pyarrow as pa

from jobs.delta import outfs
from txlog_io.errors import TxlogError


class DeltaReadError(TxlogError):
    """A Delta table exists at the path but cannot be read (damaged log, missing data file, permissions)."""


def is_delta(path: Optional[str]) -> bool:
    return outfs.is_delta(path)


def _first_line(e: Exception) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}"


def _open(path: str, what: str):
    from deltalake import DeltaTable

    try:
        return DeltaTable(path, storage_options=outfs.delta_options(path))
    except Exception as e:  # noqa: BLE001 - a damaged log, permissions: one line
        raise DeltaReadError(f"{what or 'table'}: cannot open Delta table {path}: {_first_line(e)}") from None


def column_names(path: str, what: str = "") -> Optional[List[str]]:
    """The table's column names (None when no Delta table is at ``path``)."""
    if not is_delta(path):
        return None
    return list(_open(path, what).schema().to_arrow().names)


def read_table(path: Optional[str], *, what: str = "", columns: Optional[Sequence[str]] = None,
               need: Sequence[str] = (), **equal) -> Optional[pa.Table]:
    """The rows of the Delta table at ``path`` whose columns equal ``equal`` (e.g. ``run_id=...``,
    ``broker=...``; partition columns prune whole files), restricted to ``columns``; None when no Delta table
    is at ``path``, or when it lacks one of the columns ``need`` (the table is opened once either way)."""
    if not is_delta(path):
        return None
    import pyarrow.dataset as ds

    table = _open(path, what)
    if need and not set(need) <= set(table.schema().to_arrow().names):
        return None
    expr = None
    for name, value in equal.items():
        e = ds.field(name) == value
        expr = e if expr is None else expr & e
    try:
        return table.to_pyarrow_dataset().to_table(filter=expr, columns=list(columns) if columns else None)
    except Exception as e:  # noqa: BLE001 - a data file gone or damaged: one line
        raise DeltaReadError(f"{what or 'table'}: cannot read {path}: {_first_line(e)}") from None


__all__ = ["read_table", "column_names", "is_delta", "DeltaReadError"]
