"""Indexed mode's read in ONE Spark job whose results the driver receives as Arrow.

The same shape as full mode's one-job read (jobs/read/full.py), for ``--mode indexed``:

* **plan, on the driver** (jobs/read/indexed/plan.py, jobs/read/indexed/gaps.py, jobs/read/indexed/lookup.py): the half /
  op / discard queues' and the 3.x statetable's and redolog's units, the queue gaps, the records at those
  units (read here, in threads, with the op bodies: rows the reducer needs), their halves'
  ``REAL_TOPIC#UNIQ_KEY`` keys, the units of the real topics a 3.x store's records name (its PREPARED /
  COMMIT records are in those topics), the ranges no index covers (``indexed_gap_rows``);
* **one ``RDD.mapPartitions`` job** (in the driver's threads when the items read at most
  ``full_read.driver_read_bound``: no Spark job) whose tasks each take a few work items: a group of IndexFiles
  searched for the keys, the COMMIT records at the offsets found fetched in the same task (``indexed_lookup.LookupAt``),
  a slice of the real topics' units probed (``indexed_lookup.ProbeAt``: non-NOT records kept), a
  gap-scan cell (``decode_log_range(tx_relevant=True)`` filtered as the DataFrame plan's ``_ScanCells``), or a
  partition of the ``rocketmq_anomalies`` plan for the other decoders (full_read's ``_units`` / ``_store``:
  unit files' findings and the transaction queues', statetable's, redolog's and consumer offsets' rows);
* **Arrow on the driver**: records fetched and scanned de-duplicated by (broker, offset), an idle tail's range
  keeping only the transaction system topics' records (jobs/read/indexed/tails.py), findings de-duplicated like the
  DataFrame plan's ``distinct()``, plus the INDEX_INCOMPLETE rows of the gaps and idle tails; then
  ``full_read.reduce_local``.

The rows equal the DataFrame plan's (tests/test_indexed_read.py).  Falls back to that plan (returns None)
when the plan needs Spark (transaction queues, 3.x tables or the probed real topics' queue files over
``DRIVER_READ_BYTES``) or when the units, the probed units or the rows exceed ``LOCAL_MAX_ROWS``: any number
of units below that takes this read, 3.x stores included.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.full import (
    KINDS,
    RECORD_SCHEMA,
    LocalRead,
    ReadTask,
    above_bound,
    driver_read_bound,
    item_bytes,
    job_tables,
    record_rows,
    run_tasks,
    split_op_bodies,
)
from jobs.read.indexed.gaps import (
    GAP_FILE_END,
    ORDINARY_GAPS,
    gap_anomalies,
    gap_cells,
    gap_scan_keeps,
    indexed_gap_rows,
    uses_index_files,
)
from jobs.read.indexed.lookup import (
    LOST_SCHEMA,
    LookupAt,
    ProbeAt,
    UnitRecords,
    fetch_units,
    index_files_read_whole,
    lookup_fetch,
    lookup_items,
    probe_fetch,
    probe_items,
    scanned_keys,
)
from jobs.read.indexed.plan import DRIVER_READ_BYTES, index_units, plan_indexed
from jobs.read.indexed.tails import idle_ranges, idle_tail_anomalies
from jobs.read.spec import ReadSpec
from jobs.read.stores import commitlog_dirs, has_transaction_index, infos, missing_file_findings
from jobs.sources.formats import (
    ANOMALIES_FORMAT,
    COMMITLOG_FORMAT,
    SIDE_SOURCES,
    UnitFiles,
    anomalies_batch,
    plan_partitions,
    store_listing,
)
from jobs.sources.options import parse_options
from txlog_io.commitlog_layout import TX_SYSTEM_TOPICS
from txlog_io.positional import will_read

#: result kinds of this read: full_read's, plus the gap scan's records (filtered on the driver), the lookup
#: fetches' findings (de-duplicated against the driver's) and the offsets found that no CommitLog file holds
_KINDS = dict(KINDS, gap_records=RECORD_SCHEMA, hit_anomalies=KINDS["anomalies"], lost=LOST_SCHEMA)


@dataclass(frozen=True)
class GapCell:
    """``[start, end)`` (file positions) of one CommitLog file, scanned for transaction-relevant records."""

    broker: str
    path: str
    base_offset: int
    start: int
    end: int


# ------------------------------------------------------------------------------------------------------------
# executor side
# ------------------------------------------------------------------------------------------------------------

def _scan(p: GapCell, out: Dict[str, list]) -> None:
    from txlog_io.dledger import decode_log_range  # CommitLog or DLedger data file

    found: list = []
    for batch, anomalies in decode_log_range(p.path, base_offset=p.base_offset, start=p.start, end=p.end,
                                             with_body=True, tx_relevant=True):
        found.extend(anomalies)
        if batch.num_rows:      # what indexed mode promises: no magic-V2-only ordinary records
            batch = batch.filter(gap_scan_keeps(batch))
        if batch.num_rows:
            out["gap_records"].append(record_rows(batch, p.broker))
    if found:
        out["anomalies"].append(anomalies_batch(p.broker, found, "commitlog", p.path))


class _ReadTask(ReadTask):
    """full_read's task with indexed mode's work items: index files to search (and fetch what they find) and
    gap cells to scan."""

    kinds = _KINDS
    counted = ("commitlog", "scan_findings", "gap_records", "anomalies", "hit_anomalies")

    def __call__(self, groups):
        """A partition holds one group of work items (:func:`_balanced`)."""
        return super().__call__(item for group in groups for item in group)

    def read(self, part, out: Dict[str, list]) -> None:
        if isinstance(part, LookupAt):
            lookup_fetch(part, out)
        elif isinstance(part, ProbeAt):
            probe_fetch(part, out)
        elif isinstance(part, GapCell):
            _scan(part, out)
        else:
            super().read(part, out)


# ------------------------------------------------------------------------------------------------------------
# driver side
# ------------------------------------------------------------------------------------------------------------

@dataclass
class _Plan:
    items: list                 # LookupAt, GapCell, UnitFiles / StoreFiles work items
    sources: frozenset          # the side decoders' sources
    gap_rows: list              # GAPS_SCHEMA rows scanned
    idle: list                  # the per-queue idle-tail rows
    units: UnitRecords          # the records at the transaction queues' units, read by the driver
    commitlog_dirs: dict        # broker -> its CommitLog directory (MISSING_FILE findings)
    choices: dict               # jobs.read.indexed.plan.read_choices: which brokers are read whole
    stores: list                # the stores' StoreInfo (a second lookup round's tasks)
    keyed: list                 # brokers whose COMMIT records are looked up in their IndexFiles


def plan_read(spec: ReadSpec, cores: int = 1, max_rows: int = 1 << 62) -> Optional[_Plan]:
    """The work items of an indexed read of ``spec.stores``, or None when the plan needs Spark."""
    base = spec.source_options()
    opts = parse_options(COMMITLOG_FORMAT, dict(base, include_bodies="false"))
    info = infos(opts)
    indexed = [s for s in info if has_transaction_index(s) and s.commitlog_files]
    unindexed = [s for s in info if not has_transaction_index(s) and s.commitlog_files]
    if (sum(s.tx_queue_bytes for s in info) > DRIVER_READ_BYTES
            or sum(s.tx_table_bytes for s in info) > DRIVER_READ_BYTES):
        return None

    def opts_for(fmt, **extra):
        return parse_options(fmt, dict(base, **extra))

    plan = plan_indexed(indexed, info, opts_for, None, None, None, queue_ends=False)    # the units are wanted
    if plan.units is None or plan.units.num_rows > max_rows:
        return None
    side_opts = parse_options(ANOMALIES_FORMAT, dict(base, sources=SIDE_SOURCES))
    listings = {b: store_listing(r, opts.commitlog_dirs_of(r)) for b, r in opts.stores}
    side = plan_partitions(ANOMALIES_FORMAT, side_opts, listings=listings)
    # the kernel reads the files the job reads whole (index files searched whole, unit files) while the
    # driver fetches the units: on a cold page cache those reads overlap the plan (the hints themselves
    # block while the kernel queues the reads: ~0.15 s for 218 files, so they are given from a thread)
    positions = index_units(plan, info, opts_for)     # none of a store read whole (plan.full_read)
    looked_up = [s for s in info if s.broker not in plan.full_read]
    ahead = index_files_read_whole(looked_up, positions.num_rows) + list(dict.fromkeys(
        s.path for p in side if isinstance(p, UnitFiles) for s in p.slices))
    threading.Thread(target=will_read, args=(ahead,), name="txaudit-read-ahead", daemon=True).start()
    units = fetch_units(info, positions, uses_index_files)
    # 3.x stores (and 4.3+ ones without IndexFiles): their transactions' real topics are probed in the job
    probes = probe_items(info, units, _by_broker(positions), opts_for, cores, max_rows)
    if probes is None:
        return None
    items: list = lookup_items(info, units.keys, cores) + probes
    gap_rows, idle = indexed_gap_rows(plan, indexed, unindexed)
    items += [GapCell(*cell) for cell in gap_cells(gap_rows, info, spec.split_bytes)]
    items += side
    keyed = [s.broker for s in looked_up if uses_index_files(s)]
    return _Plan(items, side_opts.sources, gap_rows, idle, units, commitlog_dirs(info), plan.choices, info,
                 keyed)


def _by_broker(positions: pa.Table) -> Dict[str, set]:
    out: Dict[str, set] = {}
    for b, off in zip(*(positions.column(c).to_pylist() for c in ("broker", "commitlog_offset")),
                      strict=True):
        out.setdefault(b, set()).add(off)
    return out


def read_indexed_local(spark, spec: ReadSpec, max_rows: int,
                       timings: Optional[dict] = None) -> Optional[LocalRead]:
    """The one-job indexed read of ``spec.stores``, or None: the DataFrame plan then reads (see the module
    docstring)."""
    t0 = time.monotonic()
    if above_bound(spec, max_rows):     # the queues alone hold too many units: no plan read only to give up
        return None
    sc = spark.sparkContext
    cores = int(sc.defaultParallelism or 1)
    plan = plan_read(spec, cores, max_rows)
    if plan is None:
        return None
    t1 = time.monotonic()
    groups = _balanced(plan.items, max(1, min(len(plan.items), 3 * cores)))
    task = _ReadTask(plan.sources, max_rows)
    # a small read runs in the driver's threads, the groups as the job's tasks would (full_read.run_tasks)
    in_driver = sum(_read_bytes(p) for p in plan.items) <= driver_read_bound(sc)
    got = run_tasks(sc, groups, task, in_driver)
    t2 = time.monotonic()
    if got is None:
        return None
    tables = job_tables(got, _KINDS)
    scanned = _outside_idle(tables["gap_records"], plan.gap_rows)
    if not _second_round(sc, plan, scanned, tables, cores, max_rows, in_driver):
        return None
    units = plan.units
    fetched_findings = pa.Table.from_batches(units.anomalies, schema=_KINDS["anomalies"])
    lost = sorted(set(units.lost) | set(zip(tables["lost"].column("broker").to_pylist(),
                                            tables["lost"].column("commitlog_offset").to_pylist(),
                                            strict=True)))
    missing = missing_file_findings(plan.commitlog_dirs, lost)
    tables["anomalies"] = pa.concat_tables([
        tables["anomalies"], fetched_findings, _new_rows(tables["hit_anomalies"], fetched_findings),
        pa.Table.from_batches([batch for _, batch in missing], schema=_KINDS["anomalies"])])
    fetched = pa.concat_tables([pa.Table.from_batches(units.records, schema=RECORD_SCHEMA),
                                tables["commitlog"]])
    clog = _union_records(fetched, scanned)
    anomalies = _distinct(tables["anomalies"]) if plan.gap_rows else tables["anomalies"]
    extra = gap_anomalies(plan.gap_rows)
    if plan.idle:
        keys = zip(*(clog.column(c).to_pylist() for c in ("broker", "topic", "queue_id", "physical_offset")),
                   strict=True)
        extra += idle_tail_anomalies(list(keys), plan.idle)
    if extra:
        anomalies = pa.concat_tables([anomalies, pa.Table.from_batches(
            [anomalies_batch(b, [a]) for b, a in extra], schema=anomalies.schema)])
    clog, op_bodies = split_op_bodies(clog)
    # no CommitLog cells in this plan (gap cells report into ``anomalies``): ``scan_findings`` stays empty
    read = LocalRead(commitlog=clog, op_bodies=op_bodies, anomalies=anomalies,
                     scan_findings=tables["scan_findings"], consumequeue=tables["consumequeue"],
                     statetable=tables["statetable"], redolog=tables["redolog"],
                     consumer_offsets=tables["consumer_offsets"], read_choices=plan.choices,
                     in_driver=in_driver)
    if timings is not None:
        timings.update({"read.plan": t1 - t0, "read.job": t2 - t1, "read.arrow": time.monotonic() - t2})
    return None if read.rows > max_rows else read


def _second_round(sc, plan: _Plan, scanned: pa.Table, tables: Dict[str, pa.Table], cores: int,
                  max_rows: int, in_driver: bool) -> bool:
    """Look up the keys of the halves that only the scans of damage gaps (not ``ORDINARY_GAPS``: a queue hole,
    a missing queue head, ...) found (``lookup.scanned_keys``): their COMMIT records may lie after the scanned
    range (an ordinary gap's halves have units, or a scan reaching the CommitLog's end reads their COMMITs).
    One more job (in the driver's threads when the first round ran there: ``in_driver``), its records,
    findings and lost offsets added to ``tables``; none when there is no such key.  False when a task read
    more than its bound."""
    damage = [(g[0], g[1], g[2]) for g in plan.gap_rows if g[0] in plan.keyed and g[3] not in ORDINARY_GAPS]
    more = scanned_keys(_within(scanned, damage), plan.keyed, plan.units.keys) if damage else {}
    items = lookup_items(plan.stores, more, cores) if more else []
    if not items:
        return True
    groups = _balanced(items, max(1, min(len(items), 3 * cores)))
    task = _ReadTask(plan.sources, max_rows)
    got = run_tasks(sc, groups, task, in_driver)
    if got is None:
        return False
    again = job_tables(got, _KINDS)
    for kind in ("commitlog", "hit_anomalies", "lost"):
        tables[kind] = pa.concat_tables([tables[kind], again[kind]])
    return True


def _read_bytes(p) -> int:
    """The file bytes work item ``p`` reads at most: an IndexFile group's files, a gap cell's range, a KiB
    per probed offset, a unit-file or store item's (``full_read.item_bytes``)."""
    from txlog_io.indexfile import file_size_for

    if isinstance(p, LookupAt):
        return sum(file_size_for(slots, entries) for _, _, slots, entries in p.files)
    if isinstance(p, GapCell):
        return p.end - p.start
    if isinstance(p, ProbeAt):
        return len(p.offsets) * 1024
    return item_bytes(p)


def _balanced(items: list, n: int) -> list:
    """``items`` in ``n`` groups of about the same estimated cost (largest first onto the least loaded group),
    the costliest group first: Spark starts tasks in partition order, so the long ones do not end the job on
    one core.  Cost ~ bytes read: an IndexFile group's files, a unit-file group's units (about the same CPU per
    byte, findings only for the ordinary queues); a gap cell's range is mostly the newest file's unwritten
    tail, skipped."""
    from txlog_io.indexfile import file_size_for

    def cost(p) -> float:
        if isinstance(p, LookupAt):
            return float(sum(file_size_for(slots, entries) for _, _, slots, entries in p.files))
        if isinstance(p, UnitFiles):
            return float(sum(s.end - s.start for s in p.slices))
        if isinstance(p, GapCell):
            return (p.end - p.start) / 64
        if isinstance(p, ProbeAt):      # a header read per offset, ~1 KiB of page each
            return float(len(p.offsets) // 8 * 1024)
        return float(1 << 20)

    costs = [cost(p) for p in items]
    groups: list = [[] for _ in range(n)]
    load = [0.0] * n
    for i in sorted(range(len(items)), key=lambda i: -costs[i]):
        j = min(range(n), key=load.__getitem__)
        groups[j].append(items[i])
        load[j] += costs[i]
    return [g for _, g in sorted(zip(load, groups, strict=True), key=lambda lg: -lg[0]) if g]


def _new_rows(extra: pa.Table, seen: pa.Table) -> pa.Table:
    """``extra``'s distinct rows that are not in ``seen``: a lookup task's fetch finding is the driver's
    when a hash collision led it to a unit's position, or another task's when two index files name the same
    offset (the DataFrame plan fetches each position once)."""
    if not extra.num_rows:
        return extra
    have = {repr(tuple(r.values())) for r in seen.to_pylist()}
    keep = []
    for i, r in enumerate(extra.to_pylist()):
        k = repr(tuple(r.values()))
        if k not in have:
            have.add(k)
            keep.append(i)
    return extra.take(pa.array(keep, pa.int64()))


def _within(records: pa.Table, ranges: list) -> pa.Table:
    """The rows of ``records`` whose offset lies in one of ``ranges`` ((broker, start, end) tuples)."""
    if not records.num_rows:
        return records
    inside = pa.array([False] * records.num_rows)
    off, broker = records.column("physical_offset"), records.column("broker")
    for b, lo, hi in ranges:
        hit = pc.and_(pc.equal(broker, b), pc.and_(pc.greater_equal(off, lo), pc.less(off, hi)))
        inside = pc.or_(inside, pc.fill_null(hit, False))
    return records.filter(inside)


def _outside_idle(records: pa.Table, gap_rows: list) -> pa.Table:
    """The gap scan's records without those only an idle tail's range reached that are not of a transaction
    system topic (jobs.read.indexed.tails.only_queue_records on the driver)."""
    ranges = idle_ranges(gap_rows, (GAP_FILE_END,))
    if not ranges or not records.num_rows:
        return records
    inside = pa.array([False] * records.num_rows)
    off, broker = records.column("physical_offset"), records.column("broker")
    for b, pieces in ranges.items():
        for lo, hi in pieces:
            hit = pc.and_(pc.equal(broker, b), pc.and_(pc.greater_equal(off, lo), pc.less(off, hi)))
            inside = pc.or_(inside, pc.fill_null(hit, False))
    system = pc.is_in(records.column("topic"), pa.array(TX_SYSTEM_TOPICS, pa.string()))
    return records.filter(pc.or_(pc.invert(inside), system))


def _union_records(fetched: pa.Table, scanned: pa.Table) -> pa.Table:
    """Fetched and scanned records, one row per (broker, physical_offset): a record both fetched and scanned
    (or fetched by the driver and by a lookup task) is the same decoded row."""
    both = pa.concat_tables([fetched, scanned])
    if not both.num_rows:
        return both
    idx = pa.array(range(both.num_rows), pa.int64())
    firsts = (both.select(["broker", "physical_offset"]).append_column("_i", idx)
              .group_by(["broker", "physical_offset"], use_threads=False).aggregate([("_i", "min")]))
    first = firsts.column("_i_min")
    return both.take(pc.take(first, pc.sort_indices(first)))


def _distinct(table: pa.Table) -> pa.Table:
    """``table``'s distinct rows (the DataFrame plan's ``distinct()`` of the decoders' and the fetch / scan
    findings: a finding met by both the fetch and the gap scan is one row)."""
    if not table.num_rows:
        return table
    return table.group_by(table.column_names, use_threads=False).aggregate([]).select(
        table.column_names).cast(table.schema)


__all__ = ["read_indexed_local", "plan_read", "GapCell"]
