"""Full mode's read in ONE Spark job whose results the driver receives as Arrow.

When an audit reads in full mode and reduces on the driver (jobs/reconstruct/spark.py, at most ``LOCAL_MAX_ROWS``
rows), every input of the reduction is small: the transaction-relevant CommitLog records, the op bodies, the
decoders' findings, the half / op / discard queue units, the 3.x statetable and redolog, the consumer
offsets.  The lazy-DataFrame plan (jobs/read/frames.py) produced them as persisted Spark rows and then
collected them again: a scan job, a count job, a findings job, a shuffle to fetch the op bodies by position,
one job per side input under ``toArrow()`` -- about 9 s of Spark overhead around ~1 s of decoding on a 4 GiB
store.  Here one ``RDD.mapPartitions`` job does it all and hands the driver Arrow IPC streams:

* one task per ``CommitLogCells`` group of the txscan plan (``datasources.plan_partitions``: the same
  ``split_bytes`` cells, so the same rows and findings): each cell framed and checked once
  (``decode_log_range(tx_relevant=True)``), the op records' bodies cut in the same pass (so there is no
  fetch by position), every other record counted and checked but never a row;
* one task per partition of the ``rocketmq_anomalies`` plan for the other decoders (consume queues,
  statetable, redolog, consumerOffset.json, store discovery): each unit file decoded once for its findings
  and, for the half / op / discard queues, the statetable and the redolog, for its rows too; the
  ``StoreFiles`` task also gives the consumer offsets.

No row crosses into the JVM as Spark rows, nothing is persisted, and the driver builds the reducer's input
table (``txreduce.input_table``) from what it received.  The rows equal the DataFrame plan's (the same
decoders over the same partitions; tested against it in tests/test_full_read.py).

An incremental run's continuation reads little (the CommitLog from its resume offset, the unit files): up to
``CONTINUATION_DRIVER_BYTES`` the same tasks run in the driver's threads instead (:func:`driver_job`), no
Spark job; so does any fresh read on a local master, whatever its size, and a small one on a cluster
(:func:`driver_read_bound`): where the executor's cores are the driver's, the job adds only its fixed cost.

Bound: a task holding more than ``LOCAL_MAX_ROWS`` rows returns only its count, and a read whose rows add up
to more than that returns None: the caller then takes the DataFrame plan (executor-side reduction), at the
price of reading the CommitLog again -- only for stores whose reduction is itself far costlier.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.spec import ReadSpec
from jobs.session import driver_cpus, is_local_master
from jobs.sources.formats import (
    ANOMALIES_FORMAT,
    CONSUMEQUEUE_FORMAT,
    CONSUMER_OFFSETS_FORMAT,
    READ_PACK_BYTES,
    REDOLOG_FORMAT,
    SIDE_SOURCES,
    STATETABLE_FORMAT,
    TX_SCAN_FORMAT,
    CommitLogCells,
    CommitLogRange,
    PartitionPack,
    StoreFiles,
    UnitFiles,
    anomalies_batch,
    consecutive_groups,
    consumer_offsets_rows,
    decode_unit_slice,
    partition_bytes,
    plan_partitions,
    prepend_broker,
    store_anomalies,
    store_listing,
)
from jobs.sources.options import parse_options
from schemas.recon import OP_BODY_COLUMNS, RECON_INPUT
from schemas.sources import ANOMALIES_SOURCE, COMMITLOG_SOURCE, SOURCE_TABLES
from schemas.state import CELL_OFFSET, STATE_FINDINGS
from schemas.store import COMMITLOG
from txlog_io.commitlog_layout import OP_TOPIC, TX_SYSTEM_TOPICS

#: the records' columns the reducer reads (RECON_INPUT's): the rest (properties map, hosts, file, ...) would
#: only be shipped to the driver and dropped there
RECORD_SCHEMA = pa.schema([f for f in COMMITLOG_SOURCE.arrow_schema() if f.name in RECON_INPUT.names])
#: result kinds -> the schema of their rows (broker + the store table's columns)
KINDS = {"commitlog": RECORD_SCHEMA, "scan_findings": STATE_FINDINGS.arrow_schema(),
         "anomalies": ANOMALIES_SOURCE.arrow_schema(),
         "consumequeue": SOURCE_TABLES[CONSUMEQUEUE_FORMAT].arrow_schema(),
         "statetable": SOURCE_TABLES[STATETABLE_FORMAT].arrow_schema(),
         "redolog": SOURCE_TABLES[REDOLOG_FORMAT].arrow_schema(),
         "consumer_offsets": SOURCE_TABLES[CONSUMER_OFFSETS_FORMAT].arrow_schema()}
#: unit-file slice kind -> its row source
_UNIT_FORMAT = {"consumequeue": CONSUMEQUEUE_FORMAT, "statetable": STATETABLE_FORMAT,
                "redolog": REDOLOG_FORMAT}
_OVERFLOW = "overflow"
#: :func:`pack_items`' bound on the bytes of consecutive small work items read by one task
PACK_BYTES = READ_PACK_BYTES
#: a read allowed in the driver (``read_local(in_driver=True)``: an incremental run's continuation) of at most
#: this many file bytes runs there, in a thread per core (the kernels release the GIL), not as a Spark job:
#: on the 8 GiB bench the continuation's decoding is ~0.25 s of CPU, one job's fixed cost 0.5-0.9 s idle
CONTINUATION_DRIVER_BYTES = 1 << 30
#: any other one-job read (a fresh full or indexed audit) of at most this many work-item bytes (file bytes,
#: a sparse file's unwritten tail included) runs in the driver's threads too, on a local master -- any size:
#: the executor's cores are the driver's, so the job only adds its fixed cost, the Python workers' start
#: (each imports the readers and loads the compiled kernels: ~1.3-1.5 s of CPU), one scheduling round trip
#: per task and the results' trip through the JVM (measured on the 4 GiB bench store: docs/ARCHITECTURE.md,
#: "Full-mode read, eighth pass")
LOCAL_READ_DRIVER_BYTES = sys.maxsize
#: the same bound on a cluster master, where the job's tasks may spread over more cores than the driver's
CLUSTER_READ_DRIVER_BYTES = 256 << 20


@dataclass
class LocalRead:
    """What the one job read, as Arrow tables (``broker`` + the store table's columns)."""

    commitlog: pa.Table          # transaction-relevant records (RECORD_SCHEMA's columns), ``body`` null
    op_bodies: pa.Table          # the op records' bodies (reconstruct's ``op_bodies`` input)
    anomalies: pa.Table          # every decoder's findings
    scan_findings: pa.Table      # the CommitLog decoder's (the first of ``anomalies``) + the cell of each
    consumequeue: pa.Table       # half / op / discard queue units only
    statetable: pa.Table
    redolog: pa.Table
    consumer_offsets: pa.Table
    in_driver: bool = False      # read by the driver's threads (read_local's ``in_driver``), not a Spark job
    read_choices: Optional[dict] = None     # indexed mode: broker -> jobs.read.indexed.plan.read_choices

    @property
    def rows(self) -> int:
        return self.commitlog.num_rows + self.anomalies.num_rows


# ------------------------------------------------------------------------------------------------------------
# executor side
# ------------------------------------------------------------------------------------------------------------

def record_rows(batch: pa.RecordBatch, broker: str) -> pa.RecordBatch:
    """RECORD_SCHEMA rows of a CommitLog decoder batch: only the op records' bodies are kept (the reduction
    parses them); the halves' stay behind."""
    i = batch.schema.get_field_index("body")
    body = pc.if_else(pc.equal(batch.column("topic"), OP_TOPIC), batch.column(i),
                      pa.nulls(batch.num_rows, pa.binary()))
    batch = prepend_broker(batch.set_column(i, "body", body), broker, COMMITLOG.arrow_schema(),
                           COMMITLOG_SOURCE.arrow_schema())
    return batch.select(RECORD_SCHEMA.names)


@dataclass(frozen=True)
class ResumedCells(CommitLogCells):
    """Cells whose first is read from an incremental run's resume offset (a record start inside it, see
    jobs/read/incremental/plan.py), not from its start ``cell_start`` (file position): its findings are that cell's."""

    cell_start: int = 0


def _cells(p, out: Dict[str, list]) -> None:
    """A ``CommitLogCells`` group (or one ``CommitLogRange`` cell) of the txscan plan."""
    from txlog_io.dledger import decode_log_range  # CommitLog or DLedger data file

    resumed = p.cell_start if isinstance(p, ResumedCells) else None
    for start, end in (p.cells if isinstance(p, CommitLogCells) else ((p.start, p.end),)):
        found: list = []
        for batch, anomalies in decode_log_range(p.path, base_offset=p.base_offset, start=start, end=end,
                                                 with_body=True, tx_relevant=True):
            found.extend(anomalies)
            if batch.num_rows:
                out["commitlog"].append(record_rows(batch, p.broker))
        if found:       # tagged with their cell: an incremental state carries them by it (schemas/state.py)
            b = anomalies_batch(p.broker, found, "commitlog", p.path)
            cell = pa.array([p.base_offset + (start if resumed is None else resumed)] * b.num_rows,
                            CELL_OFFSET.type)
            out["scan_findings"].append(pa.RecordBatch.from_arrays([*b.columns, cell],
                                                                   schema=KINDS["scan_findings"]))
        resumed = None


def _units(p: UnitFiles, out: Dict[str, list]) -> None:
    """Each slice decoded once: its findings always, its rows when the reduction reads them."""
    found: list = []
    for s in p.slices:
        keep = s.kind != "consumequeue" or s.topic in TX_SYSTEM_TOPICS
        schema = SOURCE_TABLES[_UNIT_FORMAT[s.kind]].arrow_schema()
        for batch, anomalies in decode_unit_slice(s, rows=keep):
            found.extend(anomalies)
            if keep and batch.num_rows:
                out[s.kind].append(prepend_broker(batch, p.broker, pa.schema(list(schema)[1:]), schema))
    if found:
        out["anomalies"].append(anomalies_batch(p.broker, found, "", p.slices[0].path if p.slices else ""))


def _store(p: StoreFiles, sources: frozenset, out: Dict[str, list]) -> None:
    rows, found = consumer_offsets_rows(p), store_anomalies(p, sources)
    if rows is not None:
        out["consumer_offsets"].append(rows)
    if found:
        out["anomalies"].append(anomalies_batch(p.broker, found, "store", p.root))


class ReadTask:
    """mapPartitions body: partitions (work items) -> ``(kind, Arrow IPC stream)`` pairs, or one
    ``(overflow, rows)`` pair when the task read more than ``max_rows`` records + findings.  Indexed mode's
    read (jobs/read/indexed/read.py) extends ``kinds`` / ``counted`` and :meth:`read` with its own work items."""

    kinds: Dict[str, pa.Schema] = KINDS
    counted = ("commitlog", "scan_findings", "anomalies")

    def __init__(self, sources: frozenset, max_rows: int):
        self.sources = sources
        self.max_rows = max_rows

    def read(self, part, out: Dict[str, list]) -> None:
        if isinstance(part, PartitionPack):
            for p in part.parts:
                self.read(p, out)
        elif isinstance(part, (CommitLogCells, CommitLogRange)):
            _cells(part, out)
        elif isinstance(part, UnitFiles):
            _units(part, out)
        elif isinstance(part, StoreFiles):
            _store(part, self.sources, out)

    def __call__(self, items: Iterator[tuple]) -> Iterator[tuple]:
        from txlog_io.readstats import flush

        out: Dict[str, list] = {k: [] for k in self.kinds}
        try:
            for part in items:
                self.read(part, out)
        finally:
            flush()
        n = sum(b.num_rows for k in self.counted for b in out[k])
        if n > self.max_rows:
            yield _OVERFLOW, n
            return
        for kind, batches in out.items():
            if batches:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, self.kinds[kind]) as w:
                    for b in batches:
                        w.write_batch(b)
                yield kind, sink.getvalue().to_pybytes()


# ------------------------------------------------------------------------------------------------------------
# driver side
# ------------------------------------------------------------------------------------------------------------

def plan_items(spec: ReadSpec, cores: int, start: Optional[Dict[str, int]] = None) -> tuple:
    """(work items, the side decoders' ``sources``): the txscan plan's cell groups, then the other decoders'
    partitions.  ``start``: broker -> CommitLog offset (an incremental run's resume offset: a cell start, or a
    record start inside a cell): only the ``split_bytes`` cells from there on are read, the one holding it
    from it on (:class:`ResumedCells`), grouped by the bytes that are left to read (the cells are a full
    scan's, so their rows and findings are too); the unit files are read whole."""
    from jobs.read.stores import scan_task_bytes
    from jobs.sources.formats import group_cells

    start = start or {}
    split = spec.split_bytes
    base = spec.source_options()
    scan_opts = parse_options(TX_SCAN_FORMAT, dict(base, include_bodies="false"))
    listings = {b: store_listing(r, scan_opts.commitlog_dirs_of(r)) for b, r in scan_opts.stores}
    infos = [_Sized(sum(max(0, min(f.size, f.base_offset + f.size - start.get(b, 0)))
                        for f in listings[b].commitlog)) for b, _ in scan_opts.stores]
    task_bytes = scan_task_bytes(infos, split, cores)
    # ungrouped cells (task_bytes = one cell), those from ``start`` on, then grouped
    cells = resumed_cells(plan_partitions(TX_SCAN_FORMAT, parse_options(TX_SCAN_FORMAT, dict(
        base, include_bodies="false", task_bytes=str(split))), listings=listings), start)
    side_opts = parse_options(ANOMALIES_FORMAT, dict(base, sources=SIDE_SOURCES))
    # the cell cut at ``start`` (a record inside it): its findings keep the cell's start
    inside = {(r.path, r.start): r.start - r.start % split for r in cells
              if r.start % split and r.base_offset + r.start == start.get(r.broker)}
    cells = group_cells(cells, task_bytes) if task_bytes > split else cells
    return ([_resumed(p, inside) for p in cells]
            + plan_partitions(ANOMALIES_FORMAT, side_opts, listings=listings)), side_opts.sources


def resumed_cells(cells: list, start: Dict[str, int]) -> list:
    """The ``CommitLogRange`` cells (a full scan's) a read from ``start`` (broker -> CommitLog offset) owns:
    those ending above it, the one holding it cut to start there."""
    from dataclasses import replace

    return [r if r.base_offset + r.start >= start.get(r.broker, 0)
            else replace(r, start=start[r.broker] - r.base_offset)
            for r in cells if r.base_offset + r.end > start.get(r.broker, 0)]


def _resumed(p, inside: Dict[tuple, int]):
    """``p`` as :class:`ResumedCells` when its first cell is read from inside (``inside``: (path, start) ->
    the cell's start)."""
    first = p.cells[0][0] if isinstance(p, CommitLogCells) else p.start
    if (p.path, first) not in inside:
        return p
    cells = p.cells if isinstance(p, CommitLogCells) else ((p.start, p.end),)
    return ResumedCells(p.broker, p.path, p.base_offset, cells, inside[(p.path, first)])


#: the file bytes a work item reads (a group of them included)
item_bytes = partition_bytes


def pack_items(items: list, cores: int, pack_bytes: Optional[int] = None) -> list:
    """``items`` with consecutive ones grouped (``datasources.PartitionPack``, as the DataFrame plan's reads
    pack their partitions) up to ``pack_bytes`` or a ``cores``-th of all bytes, whichever is less: a task
    costs a fixed 0.1-0.25 s, and a small store of many small files (one cell, unit pack or store task each)
    paid it per file.  An item above the quota stays a task of its
    own (the grouped cells of a large store keep their balance); order, hence rows and findings, unchanged."""
    limit = PACK_BYTES if pack_bytes is None else pack_bytes
    quota = min(limit, sum(item_bytes(p) for p in items) // max(1, cores))
    return [g[0] if len(g) == 1 else PartitionPack(tuple(g)) for g in consecutive_groups(items, quota)]


@dataclass(frozen=True)
class _Sized:
    commitlog_bytes: int


def findings_only_units(items: list) -> Dict[str, List[str]]:
    """broker -> the consume-queue files of non-transaction topics among ``items``: decoded for their
    findings only (no row of theirs reaches the reducer), so an incremental run may carry those findings."""
    out: Dict[str, List[str]] = {}
    for p in items:
        if isinstance(p, UnitFiles):
            for s in p.slices:
                if s.kind == "consumequeue" and s.topic not in TX_SYSTEM_TOPICS:
                    paths = out.setdefault(p.broker, [])
                    if not paths or paths[-1] != s.path:
                        paths.append(s.path)
    return out


def _skipping(items: list, skip: Dict[str, frozenset]) -> list:
    """``items`` without the unit slices of the files in ``skip`` (broker -> paths)."""
    out = []
    for p in items:
        if isinstance(p, UnitFiles) and skip.get(p.broker):
            kept = tuple(s for s in p.slices if s.path not in skip[p.broker])
            if kept:
                out.append(UnitFiles(p.broker, kept))
        else:
            out.append(p)
    return out


def collect_job(sc, items: list, partitions: int, task: ReadTask) -> Optional[List[tuple]]:
    """Run the one job over ``items`` -> the tasks' ``(kind, Arrow IPC stream)`` pairs on the driver, or None
    when a task read more than its bound."""
    got = sc.parallelize(items, partitions).mapPartitions(task).collect() if items else []
    return None if any(kind == _OVERFLOW for kind, _ in got) else got


def driver_job(items: list, threads: int, task: ReadTask) -> Optional[List[tuple]]:
    """:func:`collect_job` run in the driver: each item a task of its own (as there), ``threads`` at a time,
    the results in item order."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, threads)) as pool:
        got = [pair for part in pool.map(lambda p: list(task(iter((p,)))), items) for pair in part]
    return None if any(kind == _OVERFLOW for kind, _ in got) else got


def run_tasks(sc, items: list, task, in_driver: bool) -> Optional[List[tuple]]:
    """``task`` over ``items``, one task each: in the driver's threads (:func:`driver_job`, a thread per core)
    when ``in_driver``, else as one Spark job (:func:`collect_job`)."""
    if in_driver:
        return driver_job(items, min(int(sc.defaultParallelism or 1), driver_cpus()), task)
    return collect_job(sc, items, len(items), task)


def driver_read_bound(sc) -> int:
    """The work-item bytes up to which a one-job read runs in the driver's threads on ``sc``'s master
    (``LOCAL_READ_DRIVER_BYTES``: no bound; a cluster's at most ``CLUSTER_READ_DRIVER_BYTES``)."""
    if is_local_master(sc.master):
        return LOCAL_READ_DRIVER_BYTES
    return min(LOCAL_READ_DRIVER_BYTES, CLUSTER_READ_DRIVER_BYTES)


def job_tables(got: List[tuple], kinds: Dict[str, pa.Schema]) -> Dict[str, pa.Table]:
    """:func:`collect_job`'s pairs -> one table per kind of ``kinds`` (empty when no task sent it)."""
    parts: Dict[str, list] = {k: [] for k in kinds}
    for kind, data in got:
        parts[kind].extend(pa.ipc.open_stream(data).read_all().to_batches())
    return {k: pa.Table.from_batches(b, schema=kinds[k]) for k, b in parts.items()}


def split_op_bodies(records: pa.Table) -> tuple:
    """(``records`` with ``body`` nulled, the op records' bodies as reconstruct's ``op_bodies`` input): the
    reducer reads only the op records' bodies, and keeps them apart."""
    is_op = pc.and_(pc.equal(records.column("topic"), OP_TOPIC), pc.is_valid(records.column("body")))
    op_bodies = records.filter(is_op).select(["broker", *OP_BODY_COLUMNS])
    i = records.schema.get_field_index("body")
    return records.set_column(i, records.schema.field(i), pa.nulls(records.num_rows, pa.binary())), op_bodies


def above_bound(spec: ReadSpec, max_rows: int) -> bool:
    """Whether the stores' transaction queues alone hold more units than ``max_rows``
    (``jobs.read.estimate``): the one-job read would then collect rows to the driver only to give up."""
    from jobs.read.estimate import min_relevant_records

    opts = parse_options(TX_SCAN_FORMAT, spec.source_options(include_bodies="false"))
    return min_relevant_records(store_listing(r, opts.commitlog_dirs_of(r)) for _, r in opts.stores) > max_rows


def read_local(spark, spec: ReadSpec, max_rows: int, timings: Optional[dict] = None,
               start: Optional[Dict[str, int]] = None, units=None,
               in_driver: bool = False) -> Optional[LocalRead]:
    """The one-job read of ``spec.stores``, or None when its rows exceed
    ``max_rows`` (records + findings; see the module docstring) -- without reading when the transaction
    queues already say so (:func:`above_bound`; not for a read from ``start``).  ``start``: see :func:`plan_items`.
    ``units`` (an incremental run's): ``units.seen(findings_only_units(items))`` is called before the job,
    and the files in ``units.skip`` (broker -> paths) are not read (their findings are carried).
    The same tasks run in the driver (:func:`driver_job`, ``LocalRead.in_driver``) when they read at most
    :func:`driver_read_bound`, or ``CONTINUATION_DRIVER_BYTES`` with ``in_driver`` (a continuation) if that is more."""
    t0 = time.monotonic()
    if start is None and above_bound(spec, max_rows):
        return None
    sc = spark.sparkContext
    cores = int(sc.defaultParallelism or 1)
    items, sources = plan_items(spec, cores, start)
    if units is not None:
        units.seen(findings_only_units(items))
        items = _skipping(items, units.skip)
    task = ReadTask(sources, max_rows)
    items = pack_items(items, cores)
    bound = max(driver_read_bound(sc), CONTINUATION_DRIVER_BYTES if in_driver else 0)
    driver = sum(item_bytes(p) for p in items) <= bound
    got = run_tasks(sc, items, task, driver)
    t1 = time.monotonic()
    if got is None:
        return None
    tables = job_tables(got, task.kinds)
    clog, op_bodies = split_op_bodies(tables["commitlog"])
    scan = tables["scan_findings"]
    anomalies = pa.concat_tables([scan.select(ANOMALIES_SOURCE.names).cast(KINDS["anomalies"]),
                                  tables["anomalies"]])       # the task order's: CommitLog tasks first
    read = LocalRead(commitlog=clog, op_bodies=op_bodies, anomalies=anomalies, scan_findings=scan,
                     consumequeue=tables["consumequeue"], statetable=tables["statetable"],
                     redolog=tables["redolog"], consumer_offsets=tables["consumer_offsets"],
                     in_driver=driver)
    if timings is not None:
        timings["read.job"] = t1 - t0
        timings["read.arrow"] = time.monotonic() - t1
    return None if read.rows > max_rows else read


__all__ = ["LocalRead", "ReadTask", "read_local", "plan_items", "pack_items", "above_bound", "driver_read_bound",
           "run_tasks"]
