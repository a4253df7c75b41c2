"""The audit's Delta tables read back on the driver: ``deltalake`` + pyarrow, no Spark, no JVM.

``check``, ``report``, ``repair`` and the recovery requests read a finished run's outputs (audit_runs, work
lists, findings, metrics, store_files): small tables, filtered on partition columns (``run_id``, ``broker``)
so that only that run's files are opened.  A table with a row per transaction is read a batch at a time
(:func:`read_batches`).  One reader, so that "no table there" (None) and "a table that
cannot be read" (:class:`DeltaReadError`, one line naming the table and the cause) mean the same everywhere;
the writers are in ``jobs.delta.sink``.
"""
from __future__ import annotations

from typing import Iterator, List, Optional, Sequence

import pyarrow as pa

from jobs.delta import outfs
from txlog_io.errors import TxlogError

#: rows per record batch of :func:`read_batches`
BATCH_ROWS = 65_536


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
    found = _dataset(path, what, need, equal)
    if found is None:
        return None
    dataset, expr = found
    try:
        return dataset.to_table(filter=expr, columns=list(columns) if columns else None)
    except Exception as e:  # noqa: BLE001 - a data file gone or damaged: one line
        raise DeltaReadError(f"{what or 'table'}: cannot read {path}: {_first_line(e)}") from None


def read_batches(path: Optional[str], *, what: str = "", columns: Optional[Sequence[str]] = None,
                 need: Sequence[str] = (), batch_rows: Optional[int] = None,
                 **equal) -> Optional[Iterator[pa.RecordBatch]]:
    """:func:`read_table`'s rows as record batches of at most ``batch_rows`` (default ``BATCH_ROWS``) rows,
    read one at a time (no read-ahead beyond the batch at hand): what a reader that folds a table of any size
    needs; None as :func:`read_table`.  The iterator raises :class:`DeltaReadError` for a data file gone or damaged."""
    found = _dataset(path, what, need, equal)
    if found is None:
        return None
    dataset, expr = found
    return _batches(dataset, expr, columns, batch_rows or BATCH_ROWS, what or "table", path)


def _batches(dataset, expr, columns, batch_rows: int, what: str, path) -> Iterator[pa.RecordBatch]:
    try:
        for batch in dataset.to_batches(filter=expr, columns=list(columns) if columns else None,
                                        batch_size=batch_rows, batch_readahead=0, fragment_readahead=0):
            if batch.num_rows:
                yield batch
    except Exception as e:  # noqa: BLE001 - a data file gone or damaged: one line
        raise DeltaReadError(f"{what}: cannot read {path}: {_first_line(e)}") from None


def _dataset(path: Optional[str], what: str, need: Sequence[str], equal: dict):
    """(pyarrow dataset, filter expression of ``equal``) of the Delta table at ``path``; None when no table
    is there or it lacks a column of ``need``."""
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
        return table.to_pyarrow_dataset(), expr
    except Exception as e:  # noqa: BLE001 - a damaged log: one line
        raise DeltaReadError(f"{what or 'table'}: cannot read {path}: {_first_line(e)}") from None


__all__ = ["read_table", "read_batches", "BATCH_ROWS", "column_names", "is_delta", "DeltaReadError"]
