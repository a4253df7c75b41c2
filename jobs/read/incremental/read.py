"""The evidence of an ``audit --incremental`` run (why it equals a full audit: jobs/read/incremental/plan.py): the rows
carried from the previous run's ``audit_state*`` tables (read on the driver with deltalake, filtered to
what a full audit of today's store would also have; for the DataFrame plan the settled transactions are a
DataFrame whose files the executors read) put before this run's own -- the one-job read of the
CommitLog from the resume offset (:func:`read_local`) or the DataFrame plan (:func:`evidence`) -- and the
consume-queue files whose findings are carried instead of decoded again (:class:`UnitCarry`).
"""
from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import pyarrow as pa

from jobs.read.incremental.plan import Plan, _fallback_rows, fallback_findings
from jobs.read.spec import ReadSpec
from schemas.state import CELL_OFFSET, STATE_FINAL, STATE_FINDINGS, STATE_OP_BODIES, STATE_RECORDS


class UnitCarry:
    """Which consume-queue files of non-transaction topics the one-job read skips, their findings carried.

    Such a file's findings depend on its own bytes only: ``decode_consumequeue`` checks each unit's values,
    the unit before a slice (same file) and the file's size; its rows are never the reducer's (only the
    half / op / discard queues' are, and those are always decoded again).  What looks across files -- unit
    chains, gaps and overlaps between neighbours, the store listing -- is the store task's
    (``datasources.store_anomalies``), which every run does again; a file retention deleted has no print
    now and is not carried.  A file is skipped when its print (size, mtime_ns, sha256 of its first and last
    64 KiB) equals the one the previous state recorded: the broker writes units through a mapping, which sets
    mtime.  Prints are taken BEFORE the read, so a file written during it differs next time."""

    def __init__(self, previous: Dict[str, dict]):
        self.previous = previous
        self.skip: Dict[str, frozenset] = {}
        self.prints: Dict[str, dict] = {}

    def seen(self, files: Dict[str, List[str]]) -> None:
        from txlog_io.fingerprint import file_print

        for broker, paths in files.items():
            prints, prev = {}, self.previous.get(broker, {})
            for path in paths:
                try:
                    fp = file_print("", path)
                except OSError:       # gone since the listing: decoded (and reported) as the read finds it
                    continue
                prints[path] = [fp.size, fp.mtime_ns, fp.edge_sha256]
            self.prints[broker] = prints
            self.skip[broker] = frozenset(p for p, fp in prints.items() if prev.get(p) == fp)


def read_local(spark, plan: Plan, spec: ReadSpec, max_rows: int, timings: Optional[dict] = None):
    """The one-job read (jobs.read.full) of an incremental run: the CommitLog cells from ``plan.read_from``
    (the whole store when the plan falls back) and the unit files whole, with the carried rows (deltalake,
    driver) put before this run's -> a ``full_read.LocalRead`` for ``full_read.reduce_local``, or None when
    the rows exceed ``max_rows`` (the caller then takes the DataFrame plan, :func:`evidence`).  This run's
    own rows stay in ``plan.fresh``: ``write_state`` writes them with the carried ones, from the driver."""
    from concurrent.futures import ThreadPoolExecutor

    from jobs.read.full import LocalRead
    from jobs.read.full import read_local as one_job_read

    plan.carried, plan.fresh = {}, None
    plan.units = UnitCarry(plan.prev_units if plan.continuing else {})
    with ThreadPoolExecutor(1) as pool:
        # the carried records and op bodies (deltalake reads, most of the carried bytes) are read while the
        # job runs: the driver only waits for it; the findings need the unit files the read skips (below);
        # the settled rows once the read fits (else the DataFrame plan reads them on the executors)
        early = pool.submit(_load_carried, plan, spec, False, final=False) if plan.continuing else None
        # a continuation reads little: in the driver when small enough (full_read.CONTINUATION_DRIVER_BYTES)
        read = one_job_read(spark, spec, max_rows, timings,
                            start=plan.read_from if plan.continuing else None, units=plan.units,
                            in_driver=plan.continuing)
        early = early.result() if early is not None else None
    if read is None:        # the DataFrame plan reads every unit file again: nothing of theirs is carried
        plan.units = None
        return None
    if not plan.continuing:
        plan.fresh = read
        fallback = pa.Table.from_pylist([dict(zip(read.anomalies.schema.names, r, strict=True))
                                         for r in _fallback_rows(plan, spec.brokers)],
                                        schema=read.anomalies.schema)
        return LocalRead(**dict(vars(read), anomalies=pa.concat_tables([read.anomalies, fallback])))
    c = dict(early, findings=_carried(plan, STATE_FINDINGS, None))
    if read.rows + c["records"].num_rows + c["findings"].num_rows > max_rows:
        plan.carried, plan.units = {}, None
        return None
    c["final"], c["final_facts"] = _carried_final(plan)
    plan.carried, plan.fresh = c, read
    # carried first: the rows in a full audit's order (the CommitLog below the resume offset comes first)
    return LocalRead(**dict(
        vars(read),
        commitlog=pa.concat_tables([_conform(c["records"], read.commitlog.schema), read.commitlog]),
        op_bodies=pa.concat_tables([_conform(c["op_bodies"], read.op_bodies.schema), read.op_bodies]),
        anomalies=pa.concat_tables([_conform(c["findings"], read.anomalies.schema), read.anomalies])))


def _load_carried(plan: Plan, spec: ReadSpec, findings: bool = True, spark=None,
                  persist=None, final: bool = True) -> Dict[str, Any]:
    """The carried rows of ``plan`` (Arrow, driver); with ``spark`` the settled transactions (``final``)
    are a DataFrame read on the executors instead (:func:`_carried_final_frame`, persisted by ``persist``);
    without ``final`` they are not read."""
    out: Dict[str, Any] = {"records": _carried(plan, STATE_RECORDS, "physical_offset"),
                           "op_bodies": (None if spec.include_bodies
                                         else _carried(plan, STATE_OP_BODIES, "physical_offset"))}
    if findings:
        out["findings"] = _carried(plan, STATE_FINDINGS, None)
    if final:
        out["final"], out["final_facts"] = (_carried_final(plan) if spark is None
                                            else _carried_final_frame(spark, plan, persist))
    return out


def _final_facts(plan: Plan) -> Dict[str, dict]:
    """broker -> {file base: facts} of the settled transactions in the CommitLog files still present."""
    facts = {}
    for broker, kept in plan.carried_files.items():
        bases = {base for _, base, _ in kept}
        facts[broker] = {k: v for k, v in plan.prev_final_facts.get(broker, {}).items() if int(k) in bases}
    return facts


def _final_runs(plan: Plan) -> List[str]:
    return sorted({r for segs in plan.prev_final_segments.values() for r in segs})


def _carried_final(plan: Plan) -> Tuple[pa.Table, Dict[str, dict]]:
    """The previous state's settled transactions (STATE_FINAL rows of the segments its headers list) whose
    CommitLog file is still present, and their facts per file (a file retention deleted takes its settled
    transactions with it: all their records were in it).  One Arrow table on the driver: for a run reduced
    there (the DataFrame plan's distributed reduce takes :func:`_carried_final_frame`)."""
    import pyarrow.compute as pc

    schema = STATE_FINAL.arrow_schema()
    runs = _final_runs(plan)
    facts = _final_facts(plan)
    if not runs or not _state_files(plan.out, STATE_FINAL, runs):
        return schema.empty_table(), facts
    t = _read_state(plan.out, STATE_FINAL, runs)
    keep = pa.array([False] * t.num_rows, pa.bool_())
    for broker, kept in plan.carried_files.items():
        mine = pc.and_(pc.equal(t.column("broker"), broker),
                       pc.is_in(t.column("run_id"), pa.array(plan.prev_final_segments.get(broker, []), pa.string())))
        hit = pc.and_(pc.is_in(t.column("file_base"), pa.array(sorted({b for _, b, _ in kept}), pa.int64())),
                      pc.less(t.column("max_offset"), plan.read_from[broker]))
        keep = pc.or_(keep, pc.and_(mine, hit))
    rows = t.filter(pc.fill_null(keep, False))
    return pa.Table.from_arrays([rows.column(n) for n in schema.names], schema=schema), facts


def _carried_final_frame(spark, plan: Plan, persist=None):
    """:func:`_carried_final` as a DataFrame (persisted by ``persist``): the data files of the listed
    segments come from the Delta log (a few URIs, driver), each file is read by an executor
    (:class:`_StateFiles`: pyarrow through ``jobs.delta.outfs``, so an ``--out`` in a bucket reads as a local
    one does) and the same filter is applied in Spark.  STATE_FINAL grows with history (a row per settled
    transaction): neither the driver nor one task holds it.  No file listed: an empty Arrow table (no Spark
    job).  -> (rows, facts per broker and file)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    facts = _final_facts(plan)
    runs = _final_runs(plan)
    files = _state_file_runs(plan.out, STATE_FINAL, runs) if runs else []
    if not files:
        return STATE_FINAL.arrow_schema().empty_table(), facts
    c = F.col
    schema = T.StructType([*STATE_FINAL.spark_schema().fields, T.StructField("run_id", T.StringType())])
    listed = spark.createDataFrame(files, "uri string, run_id string")
    listed = listed.repartition(max(1, min(len(files), 4 * spark.sparkContext.defaultParallelism)))
    rows = listed.mapInArrow(_StateFiles(STATE_FINAL.arrow_schema()), schema)
    keep = F.lit(False)
    for broker, kept in plan.carried_files.items():
        segments, bases = plan.prev_final_segments.get(broker, []), sorted({b for _, b, _ in kept})
        if segments and bases:
            keep = keep | ((c("broker") == broker) & c("run_id").isin(*segments) & c("file_base").isin(*bases)
                           & (c("max_offset") < F.lit(int(plan.read_from[broker]))))
    rows = rows.where(keep).select(*STATE_FINAL.names)
    return (persist(rows) if persist is not None else rows), facts


class _StateFiles:
    """mapInArrow body: the rows of each (uri, run_id) data file of a state table, read with pyarrow
    through ``jobs.delta.outfs`` batch by batch, cast to ``schema`` (a column the file lacks: nulls), with
    their ``run_id`` (a partition column: not in the file)."""

    def __init__(self, schema: pa.Schema):
        self.schema = schema
        self.out = pa.schema([*schema, pa.field("run_id", pa.string())])

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow.parquet as pq

        from jobs.delta import outfs

        for files in batches:
            for f in files.to_pylist():
                with outfs.open_input(f["uri"]) as src:
                    pf = pq.ParquetFile(src)
                    have = set(pf.schema_arrow.names)
                    for b in pf.iter_batches(columns=[n for n in self.schema.names if n in have]):
                        n = b.num_rows
                        cols = [b.column(x.name).cast(x.type) if x.name in have else pa.nulls(n, x.type)
                                for x in self.schema]
                        yield pa.RecordBatch.from_arrays([*cols, pa.array([f["run_id"]] * n, pa.string())],
                                                         schema=self.out)


def _conform(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t``'s columns cast to ``schema`` (absent ones null)."""
    n = t.num_rows
    return pa.Table.from_arrays([t.column(f.name).cast(f.type) if f.name in t.column_names
                                 else pa.nulls(n, f.type) for f in schema], schema=schema)


def evidence(spark, plan: Plan, frames, spec: ReadSpec, persist):
    """(records, op_bodies or None, anomalies, scan_findings) for ``jobs.audit.run``: the whole store's when the
    plan falls back, else a scan of the CommitLog from ``read_from`` -- the carried rows below it are read
    into ``plan.carried`` (the records, op bodies and findings Arrow on the driver: ``carried_input`` gives
    them to the reducer, ``write_state`` writes them on; the settled transactions ``final`` a persisted
    DataFrame read on the executors, :func:`carried_final_arrow` makes it Arrow for a reduction on the
    driver).  ``scan_findings``: the CommitLog decoder findings of this run's scan."""
    from jobs.read.frames import split_tx_scan
    from jobs.read.inputs import op_bodies_for, relevant_records

    plan.carried = {}
    if not plan.continuing:
        persist(frames.scan)
        records = relevant_records(frames)
        anomalies = frames.anomalies.unionByName(fallback_findings(spark, plan, spec.brokers))
        scan_findings = split_tx_scan(frames.scan)[1] if frames.scan is not None else None
        return records, op_bodies_for(spark, records, frames, spec), anomalies, scan_findings
    from jobs.sources.formats import ANOMALIES_FORMAT, SIDE_SOURCES

    scan = persist(_tail_scan(spark, plan, frames.layout_info, spec))
    new_records, new_findings = split_tx_scan(scan)
    # the tail scan carries the op records' bodies (columns=reducer): they come from it, not from the
    # whole store's frames nor a second read by position
    tail = SimpleNamespace(mode="full", commitlog=new_records, layout_info=frames.layout_info,
                           op_bodies_in_records=not spec.include_bodies)
    new_records = relevant_records(tail)
    # the carried evidence stays Arrow on the driver (the open transactions' rows: the reducer and the state
    # writer take them as they are); the settled rows, which grow with history, are a DataFrame
    plan.carried = _load_carried(plan, spec, spark=spark, persist=persist)
    op_bodies = None
    if not spec.include_bodies:
        op_bodies = op_bodies_for(spark, new_records, tail, spec).select(*STATE_OP_BODIES.names)
    side = (spark.read.format(ANOMALIES_FORMAT)
            .options(**spec.source_options(sources=SIDE_SOURCES)).load())
    return new_records, op_bodies, side.unionByName(new_findings), new_findings


def carried_final_arrow(plan: Optional[Plan]) -> None:
    """The settled transactions ``plan`` carries as a DataFrame (:func:`evidence`) collected into one Arrow
    table in ``plan.carried["final"]``: for a run that reduces on the driver anyway (its inputs are few),
    whose reducer, reopened check and state writer take Arrow."""
    final = (plan.carried or {}).get("final") if plan is not None else None
    if final is not None and not isinstance(final, pa.Table):
        plan.carried["final"] = _conform(final.toArrow(), STATE_FINAL.arrow_schema())


def carried_rows(plan: Optional[Plan], name: str) -> int:
    """Rows of ``name`` (records, findings, op_bodies) the plan carries (0 when it does not continue)."""
    t = (plan.carried or {}).get(name) if plan is not None else None
    return 0 if t is None else t.num_rows


def _tail_scan(spark, plan: Plan, layout_info, spec: ReadSpec):
    """``rocketmq_txscan`` rows of the CommitLog from ``plan.read_from``: the cells a full scan has there
    (files cut at ``split_bytes`` from their start; the one holding read_from read from it), decoded by the
    same one-pass reader."""
    from jobs.read.full import resumed_cells
    from jobs.sources.formats import TX_SCAN_TABLES, FileInfo, commitlog_ranges, register

    register(spark)
    split = spec.split_bytes
    # the very cells of a full scan (datasources.commitlog_ranges), from the resume offset on (findings have
    # no cell here: the next run carries them by position)
    cells = [(r.broker, r.path, r.base_offset, r.start, r.end)
             for r in resumed_cells([r for s in layout_info for r in commitlog_ranges(
                 s.broker, [FileInfo(*f) for f in s.commitlog_files], split)], plan.read_from)]
    schema = TX_SCAN_TABLES["reducer"].spark_schema()
    if not cells:
        return spark.createDataFrame([], schema)
    frame = spark.createDataFrame(cells, "broker string, path string, base_offset bigint, start bigint, "
                                         "end bigint")
    frame = frame.repartition(max(1, min(len(cells), 4 * spark.sparkContext.defaultParallelism)))
    return frame.mapInArrow(_Cells(spec.include_bodies), schema)


class _Cells:
    """mapInArrow body: one ``tx_scan_batches`` pass (no row filter: full mode's rows, the reducer's
    columns with the op records' bodies) per cell."""

    def __init__(self, with_body: bool):
        self.with_body = with_body

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from jobs.sources.formats import tx_scan_batches

        for cells in batches:
            for c in cells.to_pylist():
                yield from tx_scan_batches(c["broker"], c["path"], c["base_offset"], c["start"], c["end"],
                                           self.with_body, columns="reducer")


def _state_files(out: str, table, run_ids: Sequence[str]) -> List[str]:
    """The data file URIs of the rows of runs ``run_ids`` of ``table`` (none when it is no Delta table)."""
    return [uri for uri, _ in _state_file_runs(out, table, run_ids)]


def _state_file_runs(out: str, table, run_ids: Sequence[str]) -> List[Tuple[str, str]]:
    """(data file URI, run id) of the rows of runs ``run_ids`` of ``table`` (none when it is no Delta table)."""
    import deltalake

    from jobs.delta import outfs
    from jobs.delta import sink as delta_sink

    path = delta_sink.table_path(out, table)
    if not outfs.is_delta(path):
        return []
    dt = deltalake.DeltaTable(path, storage_options=outfs.delta_options(path))
    with warnings.catch_warnings():     # partition_filters: deprecated in newer deltalake, still exact here
        warnings.simplefilter("ignore", DeprecationWarning)
        return [(uri, r) for r in run_ids for uri in dt.file_uris(partition_filters=[("run_id", "=", r)])]


def _carried_segments(plan: Plan, table) -> List[Tuple[str, Dict[str, Optional[int]]]]:
    """[(run id, {broker: limit offset or None})] of the previous state's rows of ``table``, oldest first: the
    records' segments (state format 4), else the previous run's rows, whole."""
    if table is not STATE_RECORDS or not plan.prev_segments:
        return [(plan.previous_run, {b: None for b in plan.carried_files})]
    runs: Dict[str, Dict[str, Optional[int]]] = {}
    for broker, segs in plan.prev_segments.items():
        for run_id, limit in segs:
            runs.setdefault(run_id, {})[broker] = limit
    return list(runs.items())


def _carried(plan: Plan, table, offset_col: Optional[str]) -> pa.Table:
    """The previous state's rows of ``table`` a full audit of today's store would also have: below
    ``read_from`` (and below their segment's limit) in a CommitLog file still present (by offset, or for
    findings by file and position).  Read on the driver with deltalake (one Arrow table, the segments in
    order: a full audit's row order; no Spark job)."""
    import pyarrow.compute as pc

    schema = table.arrow_schema()
    segments = _carried_segments(plan, table)
    if not _state_files(plan.out, table, [r for r, _ in segments]):
        return schema.empty_table()
    state = _read_state(plan.out, table, [r for r, _ in segments])
    parts = []
    for run_id, limits in segments:
        t = state.filter(pc.equal(state.column("run_id"), run_id)) if len(segments) > 1 else state
        keep = pa.array([False] * t.num_rows, pa.bool_())
        for broker, kept in plan.carried_files.items():
            if broker not in limits:
                continue
            mine = pc.equal(t.column("broker"), broker)
            if limits[broker] is not None:
                mine = pc.and_(mine, pc.less(t.column(offset_col), limits[broker]))
            for path, base, limit in kept:
                if offset_col is None:     # by the cell that found it; by position when the cell is unknown
                    cell, below = t.column(CELL_OFFSET.name), pc.less(t.column("position"), limit)
                    # the cell read from inside (the resume cell): only its findings below read_from
                    whole = pc.less(cell, plan.resume_cell.get(broker, base + limit))
                    hit = pc.and_(pc.equal(t.column("file"), path), pc.if_else(
                        pc.is_valid(cell), pc.and_(pc.and_(pc.greater_equal(cell, base),
                                                           pc.less(cell, base + limit)),
                                                   pc.or_(whole, below)), below))
                else:
                    off = t.column(offset_col)
                    hit = pc.and_(pc.greater_equal(off, base), pc.less(off, base + limit))
                keep = pc.or_(keep, pc.and_(mine, hit))
        if offset_col is None:
            keep = pc.and_(keep, pc.equal(t.column("source"), "commitlog"))
            if plan.units is not None:      # the consume-queue files the read skipped (UnitCarry)
                keep = pc.or_(keep, _unit_file_rows(t, plan.units.skip))
        kept_rows = t.filter(pc.fill_null(keep, False))
        parts.append(pa.Table.from_arrays([kept_rows.column(n) for n in schema.names], schema=schema))
    return pa.concat_tables(parts) if len(parts) > 1 else parts[0]


def _read_state(out: str, table, run_ids: Sequence[str]) -> pa.Table:
    """The rows of runs ``run_ids`` of ``table`` (its columns + ``run_id``)."""
    import deltalake

    from jobs.delta import sink as delta_sink

    schema = table.arrow_schema()
    from jobs.delta import outfs

    path = delta_sink.table_path(out, table)
    dt = deltalake.DeltaTable(path, storage_options=outfs.delta_options(path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        t = dt.to_pyarrow_table(partitions=[("run_id", "in", list(run_ids))],
                                columns=[*schema.names, "run_id"])
    return pa.Table.from_arrays([t.column(f.name).cast(f.type) for f in schema] + [t.column("run_id")],
                                names=[*schema.names, "run_id"])


def _unit_file_rows(findings: pa.Table, files: Dict[str, Iterable[str]]) -> pa.Array:
    """Mask of the ``findings`` rows that are consume-queue findings of ``files`` (broker -> paths)."""
    import pyarrow.compute as pc

    keep = pa.array([False] * findings.num_rows, pa.bool_())
    for broker, paths in files.items():
        if paths:
            keep = pc.or_(keep, pc.and_(
                pc.and_(pc.equal(findings.column("broker"), broker),
                        pc.equal(findings.column("source"), "consumequeue")),
                pc.is_in(findings.column("file"), value_set=pa.array(sorted(paths), pa.string()))))
    return keep


__all__ = ["UnitCarry", "read_local", "evidence", "carried_rows", "carried_final_arrow"]
