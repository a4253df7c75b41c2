"""Writing a Spark DataFrame to a Delta table under ``<out>/<table>``, idempotently per run.

Two writers, chosen automatically by :func:`write_table` (``writer="auto"``):

* **delta-rs, driver** (a ``pyarrow.Table`` instead of a DataFrame: small outputs the driver already holds,
  e.g. the reconstruction's when it ran on the driver, or ``audit_runs``): the driver writes the Parquet files
  itself and commits them like the executor path below -- no Spark job at all, so an empty table or a few
  hundred rows cost milliseconds instead of a Spark job's second or two.
* **delta-rs** (embedded default, no JVM jars needed): the executors write the Parquet data files straight
  into the table directory (``DataFrame.mapInArrow``: each task writes its rows, one file per partition value
  set, and returns only file metadata: path, size, partition values, row count, stats).  The driver collects
  that metadata (one small row per file, never the data) and commits *all* files in ONE Delta transaction with
  the ``deltalake`` package's transaction API (``create_table_with_add_actions`` for a new table, otherwise
  ``DeltaTable.create_write_transaction(mode="overwrite", partition_filters=[("run_id", "=", run_id)])``,
  which removes the run's previous files and adds the new ones atomically).
* **Spark Delta** (when the Delta Lake JVM classes are on the classpath *and* ``spark.sql.extensions``
  contains ``DeltaSparkSessionExtension``): a new table is created first with the sink's schema (NOT NULL
  columns, comments, description), then ``df.write.format("delta").mode("overwrite").option("replaceWhere",
  ...)``.  It also writes URI roots (``s3a://``: any file system Hadoop resolves); the delta-rs writers take
  local directories only.

Guarantees (delta-rs writer; the Spark writer gives the same through Delta's own protocol):

* Every table has ``run_id`` (and ``run_date``) columns; ``run_id`` is always a partition column.  Writing the
  same ``run_id`` again REPLACES that run's rows; another ``run_id`` is added next to the existing ones.
* A table written by an older version whose schema lacks a nullable column this version has (e.g.
  ``audit_anomalies.length``) takes the new run's rows: the commit carries the new schema, the older files
  read that column as null.  Any other schema difference is refused (``SinkError``).
* A run killed after writing data files but before its commit leaves the table exactly as it was (readers only
  see committed files); the stray files are never referenced and a ``VACUUM`` removes them.  The next run
  commits normally.
* Simple protocol (minReader 1 / minWriter 2: no deletion vectors, no column mapping, no timestamp_ntz),
  readable by delta-spark and delta-rs alike; column comments from ``schemas`` travel in the Delta schema
  metadata (``{"comment": ...}``) and the table comment becomes the table description.

``out`` is a local directory (on a real cluster: one every executor and the driver see at the same path) or
a URI of object storage (``s3://bucket/prefix``; ``jobs.delta.outfs``): the tasks then stream their Parquet
files to the bucket through ``pyarrow.fs`` and the driver commits with delta-rs' ``storage_options``, whose
S3 commits are conditional PUTs (``If-None-Match: *``: a version is written once or the commit fails).
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import time
import uuid
from dataclasses import dataclass
from typing import Iterator, List, Mapping, Optional, Sequence

import pyarrow as pa

from jobs.delta import outfs
from schemas.core import Column, Table

RUN_ID = "run_id"
RUN_DATE = "run_date"
BROKER = "broker"

#: columns the sink adds when the table does not define them itself
SINK_COLUMNS = (
    Column(RUN_ID, pa.string(), False,
           "audit run id; writing the same run id again replaces that run's rows"),
    Column(RUN_DATE, pa.date32(), False, "UTC date of the run (its as-of time)"),
)

WRITERS = ("auto", "delta-rs", "spark")
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
STATS_STRING_PREFIX = 32          # like Delta Spark: string stats are limited to a 32-character prefix
DEFAULT_MAX_ROWS_PER_FILE = 4_000_000
DEFAULT_MAX_BYTES_PER_FILE = 512 * 1024 * 1024   # Arrow (uncompressed) bytes per data file, then roll over

# metadata row each write task returns per data file (the only thing collected to the driver)
_FILE_META_SCHEMA = pa.schema([
    pa.field("path", pa.string(), False),               # relative to the table root, NOT url-encoded
    pa.field("size", pa.int64(), False),
    pa.field("partition_values", pa.string(), False),   # JSON object col -> string|null
    pa.field("num_records", pa.int64(), False),
    pa.field("stats", pa.string(), False),              # Delta stats JSON
    pa.field("modification_time", pa.int64(), False),   # epoch ms
])

#: the audit_runs table's default name under ``--out`` (``[tables]`` in the audit config may rename it)
RUNS_TABLE = "audit_runs"


def named_table(table: Table, name: str) -> Table:
    """``table`` under another directory name (the sink writes ``<out>/<table.name>``)."""
    return table if table.name == name else Table.of(name, table.columns, table.comment, table.partition_by)


class SinkError(RuntimeError):
    """The table cannot be written as asked (incompatible existing table, bad partition column, ...)."""


@dataclass(frozen=True)
class WriteResult:
    rows: int                 # rows written for this run
    files: int                # data files added by this run's commit
    version: int              # table version created by the commit
    seconds: float            # wall time of write_table
    writer: str = "delta-rs"  # "delta-rs" or "spark"
    path: str = ""            # table directory


@dataclass(frozen=True)
class _FileMeta:
    path: str
    size: int
    partition_values: dict
    num_records: int
    stats: str
    modification_time: int


# ------------------------------------------------------------------------------------------------------------
# schema helpers
# ------------------------------------------------------------------------------------------------------------

def table_path(out_dir, table: Table) -> str:
    """``<out_dir>/<table.name>``: an absolute local path, or a URI below ``out_dir``'s."""
    return outfs.join(outfs.root(os.fspath(out_dir)), table.name)


def sink_table(table: Table) -> Table:
    """The table as written: its own columns plus ``run_id`` / ``run_date`` unless it defines them."""
    extra = [c for c in SINK_COLUMNS if c.name not in table.names]
    return table.with_columns(table.name, after=extra) if extra else table


def resolve_partition_by(table: Table, partition_by: Optional[Sequence[str]]) -> List[str]:
    """Partition columns: the given ones (default: the table's own, else ``run_date`` [+ ``broker``]), always
    including ``run_id`` (appended when missing) so that a run can be replaced atomically."""
    full = sink_table(table)
    if partition_by is None:
        cols = list(table.partition_by) or [RUN_DATE] + ([BROKER] if BROKER in full.names else [])
    else:
        cols = list(partition_by)
    if RUN_ID not in cols:
        cols.append(RUN_ID)
    for c in cols:
        if c not in full.names:
            raise SinkError(f"partition column {c!r} is not a column of table {table.name}")
        t = full.column(c).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_integer(t)
                or pa.types.is_date32(t) or pa.types.is_boolean(t)):
            raise SinkError(f"partition column {c!r} of table {table.name} has unsupported type {t}")
    if len(set(cols)) != len(cols):
        raise SinkError(f"duplicate partition column in {cols}")
    return cols


def _delta_compatible_type(t: pa.DataType) -> pa.DataType:
    """Arrow type as stored: timestamps become timestamp[us, UTC] (Delta ``timestamp``; a zone-less timestamp
    would need the timestamp_ntz table feature), large strings/binaries their plain forms; nested types
    recursively."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC")
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_map(t):
        return pa.map_(_delta_compatible_type(t.key_type), _delta_compatible_type(t.item_type))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(_delta_compatible_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_delta_compatible_type(f.type)) for f in t])
    return t


def arrow_schema_for(table: Table) -> pa.Schema:
    """Full table schema (incl. partition columns), with comments in the field metadata."""
    full = sink_table(table)
    return pa.schema([f.with_type(_delta_compatible_type(f.type)) for f in full.arrow_schema()])


# ------------------------------------------------------------------------------------------------------------
# executor side: Parquet files + metadata
# ------------------------------------------------------------------------------------------------------------

_ESCAPE = set('"#%\'*/:=?\\{[]^\x7f') | {chr(i) for i in range(0x20)}


def _escape_path_name(value: str) -> str:
    """Hive/Spark ``escapePathName``: %XX for the characters that cannot stand in a directory name."""
    return "".join(f"%{ord(ch):02X}" if ch in _ESCAPE else ch for ch in value)


def _partition_value_string(v) -> Optional[str]:
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, _dt.date):
        return v.isoformat()
    return str(v)


def _stats_value(t: pa.DataType, v):
    if v is None:
        return None
    if pa.types.is_integer(t):
        return int(v)
    if pa.types.is_floating(t):
        return None if (math.isnan(v) or math.isinf(v)) else float(v)
    if pa.types.is_date32(t):
        return v.isoformat()
    if pa.types.is_string(t):
        return v
    return None


def _stats_eligible(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_date32(t) or pa.types.is_string(t)


class _StatsAccumulator:
    """Delta ``stats`` of one data file, merged batch by batch (no rows are kept): numRecords, min/max for
    numbers, dates and short strings, nullCount for flat columns.

    Strings follow Delta Spark's rule: the minimum is cut to a 32-character prefix (still a lower bound); a
    maximum longer than 32 characters is left out (a prefix would not be an upper bound).  Floats with NaN get
    no min/max."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.rows = 0
        self.nulls = {f.name: 0 for f in schema if not pa.types.is_nested(f.type)}
        self.mins: dict = {}
        self.maxs: dict = {}
        self.no_minmax: set = set()

    def add(self, batch: pa.RecordBatch) -> None:
        import pyarrow.compute as pc

        self.rows += batch.num_rows
        for f in self.schema:
            if pa.types.is_nested(f.type):
                continue
            col = batch.column(batch.schema.get_field_index(f.name))
            self.nulls[f.name] += col.null_count
            if not _stats_eligible(f.type) or f.name in self.no_minmax or col.null_count == len(col):
                continue
            if pa.types.is_floating(f.type) and pc.any(pc.is_nan(col)).as_py():
                self.no_minmax.add(f.name)
                self.mins.pop(f.name, None)
                self.maxs.pop(f.name, None)
                continue
            mm = pc.min_max(col)
            lo, hi = mm["min"].as_py(), mm["max"].as_py()
            if lo is not None and (f.name not in self.mins or lo < self.mins[f.name]):
                self.mins[f.name] = lo
            if hi is not None and (f.name not in self.maxs or hi > self.maxs[f.name]):
                self.maxs[f.name] = hi

    def to_json(self) -> str:
        mins, maxs = {}, {}
        for name, v in self.mins.items():
            t = self.schema.field(name).type
            lo = _stats_value(t, v)
            if lo is not None and pa.types.is_string(t):
                lo = lo[:STATS_STRING_PREFIX]
            if lo is not None:
                mins[name] = lo
        for name, v in self.maxs.items():
            t = self.schema.field(name).type
            hi = _stats_value(t, v)
            if hi is not None and pa.types.is_string(t) and len(hi) > STATS_STRING_PREFIX:
                hi = None
            if hi is not None:
                maxs[name] = hi
        return json.dumps({"numRecords": self.rows, "minValues": mins, "maxValues": maxs,
                           "nullCount": self.nulls}, separators=(",", ":"))


def _conform_batch(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Reorder/cast a Spark-produced batch to the table schema; nulls in a NOT NULL column raise."""
    arrays = []
    for f in schema:
        idx = batch.schema.get_field_index(f.name)
        if idx < 0:
            raise SinkError(f"column {f.name!r} missing from the DataFrame")
        arr = batch.column(idx)
        if not f.nullable and arr.null_count:
            raise SinkError(f"column {f.name!r} is NOT NULL but {arr.null_count} row(s) are null")
        if arr.type != f.type:
            arr = arr.cast(f.type)
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class _PartitionFileWriter:
    """Writes one task's rows into per-partition Parquet files under the table root."""

    def __init__(self, root: str, schema: pa.Schema, partition_by: Sequence[str], task_tag: str,
                 max_rows_per_file: int, max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE):
        self.root = root
        self.schema = schema
        self.partition_by = list(partition_by)
        self.data_schema = pa.schema([f for f in schema if f.name not in self.partition_by])
        self.task_tag = task_tag
        self.max_rows = max_rows_per_file
        self.max_bytes = max_bytes_per_file
        # partition key tuple -> [writer, rel_path, outfs.Output, rows, stats, arrow_bytes]
        self.open = {}
        self.done: List[_FileMeta] = []
        self.seq = 0

    def _rel_dir(self, key) -> str:
        parts = [f"{_escape_path_name(c)}={HIVE_NULL if v is None else _escape_path_name(v)}"
                 for c, v in zip(self.partition_by, key, strict=True)]
        return "/".join(parts)

    def _start(self, key):
        import pyarrow.parquet as pq

        rel_dir = self._rel_dir(key)
        name = f"part-{self.task_tag}-{self.seq:04d}-{uuid.uuid4().hex}.snappy.parquet"
        self.seq += 1
        rel = f"{rel_dir}/{name}" if rel_dir else name
        sink = outfs.open_output(outfs.join(self.root, *rel.split("/")))
        writer = pq.ParquetWriter(sink.stream, self.data_schema, compression="snappy", coerce_timestamps="us",
                                  allow_truncated_timestamps=False)
        state = [writer, rel, sink, 0, _StatsAccumulator(self.data_schema), 0]
        self.open[key] = state
        return state

    def _finish(self, key):
        writer, rel, sink, rows, stats, _ = self.open.pop(key)
        writer.close()
        size, mtime_ms = sink.close()
        self.done.append(_FileMeta(rel, size, dict(zip(self.partition_by, key, strict=True)), rows,
                                   stats.to_json(), mtime_ms))

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        import pyarrow.compute as pc

        if self.partition_by:
            keys_tbl = pa.Table.from_batches([batch.select(self.partition_by)])
            distinct = keys_tbl.group_by(self.partition_by, use_threads=False).aggregate([]).to_pylist()
        else:
            distinct = [{}]
        for d in distinct:
            key = tuple(_partition_value_string(d[c]) for c in self.partition_by)
            if len(distinct) == 1:
                part = batch
            else:
                mask = None
                for c in self.partition_by:
                    col = batch.column(batch.schema.get_field_index(c))
                    m = pc.is_null(col) if d[c] is None else pc.equal(col, pa.scalar(d[c], col.type))
                    m = pc.fill_null(m, False)
                    mask = m if mask is None else pc.and_(mask, m)
                part = batch.filter(mask)
            data = part.select(self.data_schema.names)
            start = 0
            while start < data.num_rows:
                state = self.open.get(key) or self._start(key)
                take = min(data.num_rows - start, self.max_rows - state[3])
                chunk = data.slice(start, take)
                state[0].write_batch(chunk)
                state[3] += take
                state[4].add(chunk)
                state[5] += chunk.nbytes
                start += take
                if state[3] >= self.max_rows or state[5] >= self.max_bytes:
                    self._finish(key)

    def close(self) -> List[_FileMeta]:
        for key in list(self.open):
            self._finish(key)
        return self.done


def _make_file_writer_udf(root: str, schema: pa.Schema, partition_by: Sequence[str], max_rows_per_file: int):
    """The function ``mapInArrow`` runs in each task: write the task's rows, yield one metadata row per
    file."""

    def write_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        tag = f"{ctx.partitionId():05d}-{ctx.attemptNumber()}" if ctx is not None else "00000-0"
        w = _PartitionFileWriter(root, schema, partition_by, tag, max_rows_per_file)
        for b in batches:
            w.write(_conform_batch(b, schema))
        metas = w.close()
        if metas:
            yield pa.RecordBatch.from_pylist([{
                "path": m.path, "size": m.size,
                "partition_values": json.dumps(m.partition_values, separators=(",", ":")),
                "num_records": m.num_records, "stats": m.stats, "modification_time": m.modification_time,
            } for m in metas], schema=_FILE_META_SCHEMA)

    return write_partition


def _prepare_frame(df, table: Table, run_id: str, run_date: _dt.date):
    """Add run_id / run_date (when the table defines no such column, or the frame lacks it) and order the
    columns as the table; every column carries its comment in the Spark metadata."""
    from pyspark.sql import functions as F

    full = sink_table(table)
    missing = [c for c in table.names if c not in df.columns and c not in (RUN_ID, RUN_DATE)]
    if missing:
        raise SinkError(f"DataFrame lacks column(s) {missing} of table {table.name}")
    df = df.withColumn(RUN_ID, F.lit(run_id))          # the run being written owns every row
    if RUN_DATE not in df.columns:
        df = df.withColumn(RUN_DATE, F.lit(run_date))
    cols = []
    for c in full.columns:
        meta = {"comment": c.comment} if c.comment else {}
        cols.append(F.col(c.name).alias(c.name, metadata=meta))
    return df.select(*cols)


def _write_data_files(df, root: str, table: Table, run_id: str, partition_by: Sequence[str],
                      run_date: _dt.date,
                      max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE) -> List[_FileMeta]:
    """Executors write the Parquet files; only their metadata comes back.  No commit: the files are invisible
    to readers until :func:`_commit_files` references them (a run killed after this step leaves the table as
    it was)."""
    schema = arrow_schema_for(table)
    frame = _prepare_frame(df, table, run_id, run_date)
    from pyspark.sql import types as T

    meta_spark = T.StructType([
        T.StructField("path", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("partition_values", T.StringType(), False),
        T.StructField("num_records", T.LongType(), False),
        T.StructField("stats", T.StringType(), False),
        T.StructField("modification_time", T.LongType(), False),
    ])
    outfs.makedirs(root)
    udf = _make_file_writer_udf(root, schema, list(partition_by), max_rows_per_file)
    rows = frame.mapInArrow(udf, meta_spark).collect()   # one small row per data file
    return [_FileMeta(r["path"], int(r["size"]), json.loads(r["partition_values"]), int(r["num_records"]),
                      r["stats"], int(r["modification_time"])) for r in rows]


def _write_arrow_files(tbl: pa.Table, root: str, table: Table, run_id: str, partition_by: Sequence[str],
                       run_date: _dt.date,
                       max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE) -> List[_FileMeta]:
    """The driver writes ``tbl``'s rows (columns of ``table``; run_id / run_date added) as Parquet files under
    the table root, like one executor task would; no commit."""
    schema = arrow_schema_for(table)
    missing = [c for c in table.names if c not in tbl.column_names and c not in (RUN_ID, RUN_DATE)]
    if missing:
        raise SinkError(f"table lacks column(s) {missing} of table {table.name}")
    n = tbl.num_rows
    cols = []
    for f in schema:
        if f.name == RUN_ID:
            cols.append(pa.array([run_id] * n, f.type))
        elif f.name == RUN_DATE and RUN_DATE not in tbl.column_names:
            cols.append(pa.array([run_date] * n, f.type))
        else:
            cols.append(tbl.column(f.name))
    frame = pa.Table.from_arrays(cols, names=schema.names)
    outfs.makedirs(root)
    w = _PartitionFileWriter(root, schema, list(partition_by), f"driver-{os.getpid()}", max_rows_per_file)
    for batch in frame.to_batches():
        w.write(_conform_batch(batch, schema))
    return w.close()


# ------------------------------------------------------------------------------------------------------------
# driver side: the one commit
# ------------------------------------------------------------------------------------------------------------

def _same_fields(a: pa.Schema, b: pa.Schema) -> bool:
    return [(f.name, f.type) for f in a] == [(f.name, f.type) for f in b]


def _only_added_nullable(existing: pa.Schema, new: pa.Schema) -> bool:
    """Schema evolution the sink accepts: ``new`` keeps every existing column with its type and adds only
    nullable ones (a table written by an older version: its files read the new columns as null, as Delta
    specifies for columns missing from a data file)."""
    old = {f.name: f.type for f in existing}
    names = {f.name for f in new}
    return (all(n in names for n in old)
            and all(old[f.name] == f.type if f.name in old else f.nullable for f in new))


def _commit_files(root: str, table: Table, run_id: str, partition_by: Sequence[str],
                  files: Sequence[_FileMeta],
                  extra_commit_info: Optional[Mapping[str, object]] = None) -> int:
    """Commit ``files`` as this run's whole content in ONE Delta transaction; returns the new table
    version."""
    from deltalake import DeltaTable
    from deltalake import Schema as DeltaSchema
    from deltalake.exceptions import TableNotFoundError
    from deltalake.transaction import AddAction, CommitProperties, create_table_with_add_actions

    schema = arrow_schema_for(table)
    delta_schema = DeltaSchema.from_arrow(schema)
    adds = [AddAction(f.path, f.size, {k: f.partition_values.get(k) for k in partition_by},
                      f.modification_time, True, f.stats) for f in files]
    info = {"txaudit.run_id": run_id, "txaudit.table": table.name, "txaudit.files": len(files),
            "txaudit.rows": sum(f.num_records for f in files)}
    info.update(extra_commit_info or {})
    props = CommitProperties(custom_metadata=info)
    options = outfs.delta_options(root)
    try:
        dt = DeltaTable(root, storage_options=options)
    except TableNotFoundError:
        dt = None
    if dt is None:
        create_table_with_add_actions(root, delta_schema, adds, mode="append",
                                      partition_by=list(partition_by), name=table.name,
                                      description=table.comment or None, storage_options=options,
                                      commit_properties=props)
        return DeltaTable(root, storage_options=options).version()
    existing_parts = list(dt.metadata().partition_columns)
    if existing_parts != list(partition_by):
        raise SinkError(f"table {root} is partitioned by {existing_parts}, "
                        f"this write by {list(partition_by)}")
    existing = pa.schema(dt.schema().to_arrow())
    new = pa.schema(DeltaSchema.from_arrow(schema).to_arrow())
    if not _same_fields(new, existing) and not _only_added_nullable(existing, new):
        raise SinkError(f"table {root} has a different schema than {table.name}: "
                        f"existing {existing.names}, new {schema.names}")
    dt.create_write_transaction(adds, mode="overwrite", schema=delta_schema, partition_by=list(partition_by),
                                partition_filters=[(RUN_ID, "=", run_id)], commit_properties=props)
    dt.update_incremental()
    return dt.version()


# ------------------------------------------------------------------------------------------------------------
# Spark Delta writer
# ------------------------------------------------------------------------------------------------------------

def delta_spark_available(spark) -> bool:
    """True when the session can write Delta through Spark: the extension is configured and its JVM classes
    load."""
    try:
        exts = spark.conf.get("spark.sql.extensions", "") or ""
    except Exception:
        return False
    if "DeltaSparkSessionExtension" not in exts:
        return False
    jvm = getattr(spark, "_jvm", None)
    if jvm is None:       # Spark Connect: the server loaded the extension (or failed to start)
        return True
    try:
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("io.delta.tables.DeltaTable", False, loader)
        return True
    except Exception:
        return False


def choose_writer(spark, writer: str = "auto") -> str:
    """"spark" or "delta-rs".  ``writer`` (or env ``TXAUDIT_DELTA_WRITER``) may force one; "auto" picks
    Spark's Delta writer only when :func:`delta_spark_available`."""
    writer = os.environ.get("TXAUDIT_DELTA_WRITER", writer) if writer == "auto" else writer
    if writer not in WRITERS:
        raise SinkError(f"unknown Delta writer {writer!r} (expected one of {', '.join(WRITERS)})")
    if writer == "auto":
        return "spark" if delta_spark_available(spark) else "delta-rs"
    if writer == "spark" and not delta_spark_available(spark):
        raise SinkError("writer 'spark' asked for but Delta Lake is not on the Spark classpath "
                        "(spark.sql.extensions lacks io.delta.sql.DeltaSparkSessionExtension "
                        "or its jar is missing)")
    return writer


def _sql_string(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _create_with_spark(spark, frame, root: str, table: Table, partition_by: Sequence[str]) -> None:
    """Create the (empty) table the way the delta-rs writer does: NOT NULL columns, column comments, the table
    comment as its description.  A DataFrame write that creates the table would make every column nullable
    (Delta stores a new table's schema ``asNullable``).  Nothing happens when a table is at ``root``."""
    from delta.tables import DeltaTable as SparkDeltaTable

    if SparkDeltaTable.isDeltaTable(spark, root):
        return
    nullable = {f.name: f.nullable for f in arrow_schema_for(table)}
    builder = SparkDeltaTable.createIfNotExists(spark).location(root)
    for f in frame.schema.fields:
        builder = builder.addColumn(f.name, f.dataType, nullable=nullable[f.name],
                                    comment=f.metadata.get("comment"))
    builder = builder.partitionedBy(*partition_by)
    if table.comment:
        builder = builder.comment(table.comment)
    builder.execute()


def _write_with_spark(df, root: str, table: Table, run_id: str, partition_by: Sequence[str],
                      run_date: _dt.date) -> tuple:
    frame = _prepare_frame(df, table, run_id, run_date)
    _create_with_spark(frame.sparkSession, frame, root, table, partition_by)
    (frame.write.format("delta")
     .mode("overwrite")
     .option("replaceWhere", f"{RUN_ID} = {_sql_string(run_id)}")
     .option("mergeSchema", "true")            # a table written before a nullable column was added
     .option("userMetadata", json.dumps({"txaudit.run_id": run_id, "txaudit.table": table.name}))
     .partitionBy(*partition_by)
     .save(root))
    # the commit's own record, read through Spark (any file system Hadoop resolves, s3a:// included)
    last = frame.sparkSession.sql(f"DESCRIBE HISTORY delta.`{root.replace('`', '``')}` LIMIT 1").collect()[0]
    metrics = last["operationMetrics"] or {}
    rows = int(metrics.get("numOutputRows", 0))
    files = int(metrics.get("numFiles", metrics.get("numAddedFiles", 0)))
    return rows, files, int(last["version"])


# ------------------------------------------------------------------------------------------------------------
# public entry point
# ------------------------------------------------------------------------------------------------------------

def write_table(df, out_dir, table: Table, run_id: str, partition_by: Optional[Sequence[str]] = None,
                spark=None, *, run_date: Optional[_dt.date] = None, writer: str = "auto",
                max_rows_per_file: int = DEFAULT_MAX_ROWS_PER_FILE) -> WriteResult:
    """Write ``df`` (columns of ``table``; ``run_id`` / ``run_date`` are added) as run ``run_id`` of the Delta
    table ``<out_dir>/<table.name>``, replacing whatever that run wrote before.  ``df`` is a Spark DataFrame
    (the executors write the files) or a ``pyarrow.Table`` (the driver writes them: for small outputs).  See
    the module docstring."""
    t0 = time.monotonic()
    if not run_id or not isinstance(run_id, str):
        raise SinkError("run_id must be a non-empty string")
    local = isinstance(df, pa.Table)
    spark = spark or (None if local else df.sparkSession)
    run_date = run_date or _dt.datetime.now(_dt.timezone.utc).date()
    parts = resolve_partition_by(table, partition_by)
    root = table_path(out_dir, table)
    chosen = choose_writer(spark, writer)
    if chosen == "spark":
        if local:
            from jobs.session import arrow_frame

            df = arrow_frame(spark, df)
        rows, files, version = _write_with_spark(df, root, table, run_id, parts, run_date)
    else:
        metas = (_write_arrow_files(df, root, table, run_id, parts, run_date, max_rows_per_file) if local
                 else _write_data_files(df, root, table, run_id, parts, run_date, max_rows_per_file))
        version = _commit_files(root, table, run_id, parts, metas)
        rows, files = sum(m.num_records for m in metas), len(metas)
    return WriteResult(rows=rows, files=files, version=version, seconds=time.monotonic() - t0, writer=chosen,
                       path=root)


def retract_run(out_dir, table: Table, run_id: str) -> Optional[int]:
    """Remove run ``run_id``'s rows from ``<out_dir>/<table.name>`` in one commit (new version, or None when
    the table does not exist or holds no such run).  The audit retracts its ``audit_runs`` row before
    rewriting the other tables of a run id, so a rerun killed half-way never leaves the old COMPLETE row next
    to half-replaced tables.  ``run_id`` is a partition column: the delete only removes whole files."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    root = table_path(out_dir, table)
    if not outfs.is_delta(root):
        return None
    try:
        dt = DeltaTable(root, storage_options=outfs.delta_options(root))
    except TableNotFoundError:
        return None
    if not any(dict(p).get(RUN_ID) == run_id for p in (dt.partitions() or [])):
        return None
    dt.delete(f"{RUN_ID} = {_sql_string(run_id)}")
    dt.update_incremental()
    return dt.version()
