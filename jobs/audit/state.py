"""Writing an ``audit --incremental`` run's state (schemas/state.py; why it is what it is:
jobs/read/incremental/plan.py): the carried rows + this run's own, one header row per broker (where the next run
resumes, what the store looked like below it), and retiring the previous run's state once this run
completed.
"""
from __future__ import annotations

import json
import os
from typing import Dict, Optional

import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.incremental.plan import Plan, _commitlog_end, _is_dledger, _prefix_sha
from jobs.read.incremental.read import UnitCarry, _conform, _unit_file_rows
from jobs.read.spec import ReadSpec
from jobs.session import arrow_frame
from schemas.state import (
    AUDIT_STATE,
    MAX_SEGMENTS,
    STATE_FINAL,
    STATE_FINDINGS,
    STATE_FORMAT_VERSION,
    STATE_OP_BODIES,
    STATE_RECORDS,
    STATE_TABLES,
)


def write_state(spark, plan: Plan, spec: ReadSpec, records, op_bodies, findings, layout_info, run_date, writer,
                local: bool = False) -> list:
    """:func:`write_now`, or the result of the write ``plan.early_state`` started with the same rows while
    the outputs were written (:func:`start_state_write`)."""
    early, plan.early_state = plan.early_state, None
    if early is not None:
        return early.result()
    return write_now(spark, plan, spec, records, op_bodies, findings, layout_info, run_date, writer, local)


def start_state_write(spark, plan: Plan, spec: ReadSpec, writer: str, run_date) -> None:
    """The state of a run read through jobs.read.incremental.read.read_local (``plan.fresh`` + the carried rows)
    is written in a driver thread while the outputs are written: it needs the reduction's transactions
    (``plan.reduced``: what settles, jobs/reconstruct/settle.py) and nothing the output writes do.
    jobs.audit.run starts it after the reduction; its :func:`write_state` call, after the outputs, then waits
    for it (so the state is still complete before the run's ``audit_runs`` row), and so does its ``finally``
    when the run fails."""
    from concurrent.futures import ThreadPoolExecutor

    if writer != "delta-rs" or spec.mode != "full":       # Spark's writer: a job, from the main thread
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="state-write")
    plan.early_state = pool.submit(write_now, spark, plan, spec, None, None, None, plan.layout_info,
                                   run_date, writer, True)
    pool.shutdown(wait=False)


def write_now(spark, plan: Plan, spec: ReadSpec, records, op_bodies, findings, layout_info, run_date, writer,
              local: bool = False) -> list:
    """Write this run's ``audit_state*`` tables (one commit each; the run's earlier rows replaced) -> their
    ``delta_sink.WriteResult``s.  ``local``: the rows are few, collect and write them from the driver; with
    ``plan.fresh`` (the run read through :func:`read_local`) they are on the driver already (the frames are
    None); else the frames are settled on the executors when the reduction ran distributed
    (:func:`_settle_frames`).  Skipped (empty list) when the run cannot be continued (indexed mode, DLedger) or has no CommitLog
    scan findings frame."""
    from pyspark.sql import functions as F

    from jobs.delta import sink as delta_sink

    fresh = plan.fresh
    if (spec.mode != "full" or (findings is None and fresh is None)
            or any(_is_dledger(s) for s in layout_info)):
        return []
    split = spec.split_bytes
    carried = plan.carried or {}
    plan.segments = {s.broker: [[plan.run_id, None]] for s in layout_info}
    records_written = None
    settled, new_final, settled_facts, last, settled_frames, spark_found = None, None, {}, None, None, None
    if fresh is not None or local:
        # few rows (the reduction ran on the driver): Arrow on the driver (the one-job read's own rows, else
        # one collect per table), counted and written by the driver -- no Spark write jobs (those cost more
        # than the whole incremental read on a small store)
        if fresh is not None:
            new = {"records": fresh.commitlog, "findings": _with_unit_findings(fresh, plan.units),
                   "op_bodies": fresh.op_bodies}
        else:
            new = {key: (_spark_conformed(df, t).toArrow() if df is not None else None)
                   for df, t, key in ((records, STATE_RECORDS, "records"),
                                      (findings, STATE_FINDINGS, "findings"),
                                      (op_bodies, STATE_OP_BODIES, "op_bodies"))}
        records, findings, op_bodies = (
            _with_carried(new[key], t, carried.get(key)) if new[key] is not None else None
            for t, key in ((STATE_RECORDS, "records"), (STATE_FINDINGS, "findings"),
                           (STATE_OP_BODIES, "op_bodies")))
        last = _last_offsets(records)
        settled = _settle(plan, records, op_bodies, findings, layout_info, last, split)
        if settled is not None:
            records, op_bodies, new_final = settled.records, settled.op_bodies, settled.final
            settled_facts = settled.facts
        agg = records.group_by("broker").aggregate([("physical_offset", "max"), ([], "count_all")])
        stats = {b: (m, n) for b, m, n in zip(agg.column("broker").to_pylist(),
                                               agg.column("physical_offset_max").to_pylist(),
                                               agg.column("count_all").to_pylist(), strict=True)}
        counted = findings.group_by("broker").aggregate([([], "count_all")])
        n_findings = dict(zip(counted.column("broker").to_pylist(), counted.column("count_all").to_pylist(),
                              strict=True))
        plan.segments = _segments(plan, [s.broker for s in layout_info])
        if settled is not None:         # the carried records lost the settled ones: all written again
            plan.segments = {s.broker: [[plan.run_id, None]] for s in layout_info}
        if any(len(segs) > 1 for segs in plan.segments.values()):
            # the carried records stay in the segments they are in: only this run's own are written
            records_written = _conform(new["records"], STATE_RECORDS.arrow_schema())
    else:
        def union(df, t, key):
            extra = carried.get(key)
            df = _spark_conformed(df, t)
            return df if extra is None or not extra.num_rows else df.unionByName(
                arrow_frame(spark, extra, schema=t.spark_schema()))

        records = union(records, STATE_RECORDS, "records")
        findings = union(findings, STATE_FINDINGS, "findings")
        if op_bodies is not None:
            op_bodies = union(op_bodies, STATE_OP_BODIES, "op_bodies")
        # the resume offsets come from every record, settled or not; the CommitLog findings (they grow with
        # damage, not with the broker) say where in its cell the state resumes, as on the driver
        last = {r["broker"]: r["last"] for r in records.groupBy("broker").agg(
            F.max("physical_offset").alias("last")).collect()}
        spark_found = findings.where(F.col("source") == "commitlog").select(
            "broker", "file", "source", "position").toArrow()
        settled_frames = _settle_frames(plan, records, op_bodies, spark_found, layout_info, last, split)
        if settled_frames is not None:
            records, op_bodies = settled_frames.records, settled_frames.op_bodies
            new_final, settled_facts = settled_frames.final, settled_frames.facts
        stats = {r["broker"]: (r["last"], r["n"]) for r in records.groupBy("broker").agg(
            F.max("physical_offset").alias("last"), F.count(F.lit(1)).alias("n")).collect()}
        n_findings = {r["broker"]: r["n"] for r in findings.groupBy("broker").agg(
            F.count(F.lit(1)).alias("n")).collect()}
    if last is not None:        # the resume offsets come from every record, settled or not
        stats = {b: (at, stats.get(b, (None, 0))[1]) for b, at in last.items()}
    units = plan.units.prints if fresh is not None and plan.units is not None else {}
    found = findings if isinstance(findings, pa.Table) else spark_found
    final_written, final_info = _final_state(plan, [s.broker for s in layout_info], new_final, settled_facts)
    headers = [dict(_header(s, stats.get(s.broker, (None, 0)), n_findings.get(s.broker, 0), split, plan.hash,
                            units.get(s.broker, {}), plan.segments[s.broker], found), **final_info[s.broker])
               for s in layout_info]
    outs = []
    parts = ["run_date"]
    header_table = pa.Table.from_pylist(headers, schema=AUDIT_STATE.arrow_schema())
    for table, df in ((STATE_FINAL, final_written),
                      (STATE_RECORDS, records if records_written is None else records_written),
                      (STATE_FINDINGS, findings),
                      (STATE_OP_BODIES, op_bodies if op_bodies is not None
                       else STATE_OP_BODIES.arrow_schema().empty_table()),
                      (AUDIT_STATE, header_table)):       # the header last: it says the rest is there
        if not isinstance(df, pa.Table):
            df = df.select(*table.names)
        else:   # one chunk: the one-job read's rows come in one small batch per cell and task, and the
            # sink writes a row group per batch (8 GiB bench: 2,215 row groups, 3.6 s to write, 5.4 s to read)
            df = df.combine_chunks()
        outs.append(delta_sink.write_table(df, plan.out, table, plan.run_id, parts, spark,
                                           run_date=run_date, writer=writer))
    if settled_frames is not None:
        settled_frames.unpersist()
    plan.state_written = True
    return outs


def _last_offsets(records: pa.Table) -> Dict[str, int]:
    """broker -> the newest record's CommitLog offset (where the state resumes, before any settles)."""
    agg = records.group_by("broker").aggregate([("physical_offset", "max")])
    return dict(zip(agg.column("broker").to_pylist(), agg.column("physical_offset_max").to_pylist(), strict=True))


def _settle(plan: Plan, records: pa.Table, op_bodies: Optional[pa.Table], findings: Optional[pa.Table],
            layout_info, last: Dict[str, int], split: int):
    """jobs.reconstruct.settle.settle of this run's state rows against its reduction (None when the run was
    not reduced on the driver).  A transaction settles below the state's resume offset (:func:`_resume`: the
    newest record, or the start of its cell when the scan reported something in the cell before it), below
    which the next run reads nothing again (jobs/read/incremental/plan.py; a run that does read a settled
    record again, its resume record gone, is redone in full by ``settle.reopened``).  ``findings``: the
    state's findings (a broker with CommitLog decoder findings keeps its records that are evidence of
    nothing)."""
    from jobs.reconstruct.settle import settle

    reduced = plan.reduced
    if reduced is None or not isinstance(reduced["transactions"], pa.Table):
        return None
    bases, bound, legacy, damaged, offsets = _settle_inputs(reduced, layout_info, last, split, findings)
    return settle(records, op_bodies, reduced["transactions"], offsets, bound, bases, legacy, damaged)


def _settle_inputs(reduced: dict, layout_info, last: Dict[str, int], split: int, findings: Optional[pa.Table]):
    """(broker -> CommitLog file bases, broker -> resume offset, legacy brokers, damaged brokers, consume
    offsets): settle.settle's arguments besides the rows, for the driver's settle and the executors'."""
    from jobs.reconstruct.settle import consume_offsets

    bases, bound = {}, {}
    for s in layout_info:
        files = sorted(s.commitlog_files, key=lambda f: f[1])
        bases[s.broker] = [base for _, base, _ in files]
        at = last.get(s.broker)
        holder = next((f for f in files if at is not None and f[1] <= at < f[1] + f[2]), None)
        if holder is not None:
            bound[s.broker] = _resume(s.broker, holder, at, split, findings)
    legacy = [p["broker"] for p in reduced["profiles"].to_pylist()
              if p["detected_profile"] not in ("4.3-5.0", "5.1+")]
    if findings is None:        # unknown: every broker keeps its records
        damaged = [s.broker for s in layout_info]
    else:
        in_commitlog = pc.fill_null(pc.equal(findings.column("source"), "commitlog"), False)
        damaged = pc.unique(findings.filter(in_commitlog).column("broker")).to_pylist()
    return bases, bound, legacy, damaged, consume_offsets(reduced.get("consumer_offsets"))


def _settle_frames(plan: Plan, records, op_bodies, findings: pa.Table, layout_info, last: Dict[str, int],
                   split: int):
    """jobs.reconstruct.settle_frames.settle_frames of the state's frames against a reduction that ran
    distributed (``plan.reduced`` with its linked evidence), under the conditions of :func:`_settle`; None
    when the run was not reduced so."""
    from jobs.reconstruct.settle_frames import BrokerSettle, settle_frames

    reduced = plan.reduced
    if reduced is None or reduced.get("linked") is None:
        return None
    bases, bound, legacy, damaged, offsets = _settle_inputs(reduced, layout_info, last, split, findings)
    brokers = {}
    for b, resume in bound.items():
        hco, oco = offsets.get(b, (None, None))
        brokers[b] = BrokerSettle(int(resume), [int(x) for x in bases.get(b, ())], hco, oco,
                                  settles=b not in legacy and hco is not None and oco is not None,
                                  discarded=b not in damaged, inert=b not in legacy and b not in damaged)
    return settle_frames(records, op_bodies, reduced["transactions"], reduced["linked"], brokers,
                         int(reduced.get("tasks") or 1))


def _final_state(plan: Plan, brokers, new_final, new_facts: Dict[str, dict]):
    """(STATE_FINAL rows this run writes, broker -> its header's final_* columns): the carried settled rows
    stay in their segments (runs), this run's own are a new one; past MAX_SEGMENTS every row is written
    again as one.  ``new_final``: Arrow, or a DataFrame when settled on the executors; the carried rows
    are a DataFrame when read for the executors (jobs.read.incremental.read.evidence).  With a DataFrame
    among them the rows are counted in one aggregate over both."""
    from jobs.reconstruct.reducer import merge_facts_into

    carried = (plan.carried or {}).get("final")
    carried = carried if carried is not None else STATE_FINAL.arrow_schema().empty_table()
    new = new_final if new_final is not None else STATE_FINAL.arrow_schema().empty_table()
    prev = {b: list(plan.prev_final_segments.get(b, [])) for b in brokers} if plan.continuing else \
        {b: [] for b in brokers}
    compact = any(len(v) + 1 > MAX_SEGMENTS for v in prev.values())
    if isinstance(new, pa.Table) and isinstance(carried, pa.Table):
        written = pa.concat_tables([carried, new]) if compact else new
        counts = _final_counts(carried)
        for b, n in _final_counts(new).items():
            counts[b] = counts.get(b, 0) + n
    else:
        spark_session = (new if not isinstance(new, pa.Table) else carried).sparkSession
        both = _union_frames(spark_session, [new, carried])
        written = both if compact else new
        counts = _final_counts(both)
    plan.final_segments = {b: [plan.run_id] if compact else prev[b] + [plan.run_id] for b in brokers}
    facts_prev = (plan.carried or {}).get("final_facts") or {}
    info = {}
    for b in brokers:
        facts = {k: dict(v) for k, v in facts_prev.get(b, {}).items()}
        for k, v in new_facts.get(b, {}).items():
            merge_facts_into(facts.setdefault(k, {}), v)
        info[b] = {"final_segments_json": json.dumps(plan.final_segments[b]),
                   "final_facts_json": json.dumps(facts, sort_keys=True), "finals": counts.get(b, 0)}
    return written, info


def _union_frames(spark, parts: list):
    """The union of STATE_FINAL ``parts`` (DataFrames, or Arrow tables: converted, skipped when empty)."""
    frames = [p.select(*STATE_FINAL.names) if not isinstance(p, pa.Table)
              else arrow_frame(spark, p, schema=STATE_FINAL.spark_schema()) for p in parts
              if not isinstance(p, pa.Table) or p.num_rows]
    if not frames:
        return arrow_frame(spark, STATE_FINAL.arrow_schema().empty_table(), schema=STATE_FINAL.spark_schema())
    out = frames[0]
    for f in frames[1:]:
        out = out.unionByName(f)
    return out


def _final_counts(final) -> Dict[str, int]:
    """broker -> rows of ``final`` (Arrow, or a DataFrame: one small aggregate job)."""
    if isinstance(final, pa.Table):
        if not final.num_rows:
            return {}
        agg = final.group_by("broker").aggregate([([], "count_all")])
        return dict(zip(agg.column("broker").to_pylist(), agg.column("count_all").to_pylist(), strict=True))
    return {r["broker"]: int(r["count"]) for r in final.groupBy("broker").count().collect()}


def _segments(plan: Plan, brokers) -> Dict[str, list]:
    """broker -> this state's record segments (see schemas/state.py): the previous state's, each cut at this
    run's resume offset, + this run's own rows; one segment (every record written again) when the previous
    state is not continued, would list more than MAX_SEGMENTS, or already lists this run id."""
    prev = plan.prev_segments if plan.continuing and plan.carried.get("records") is not None else {}
    own = [plan.run_id, None]
    if (not prev or any(len(prev.get(b, ())) + 1 > MAX_SEGMENTS for b in brokers)
            or any(r == plan.run_id for segs in prev.values() for r, _ in segs)):
        return {b: [own] for b in brokers}
    return {b: [[r, plan.read_from[b] if limit is None else min(limit, plan.read_from[b])]
                for r, limit in prev[b]] + [own] for b in brokers}


def _spark_conformed(df, table):
    """``df`` as ``table``'s columns (absent ones null: a findings frame has no cell)."""
    from pyspark.sql import functions as F

    return df.select(*(F.col(f.name).cast(f.dataType) if f.name in df.columns
                       else F.lit(None).cast(f.dataType).alias(f.name) for f in table.spark_schema()))


def _with_carried(new: pa.Table, table, carried: Optional[pa.Table]) -> pa.Table:
    new = _conform(new, table.arrow_schema())
    return new if carried is None or not carried.num_rows else pa.concat_tables([carried, new])


def _with_unit_findings(fresh, units: Optional[UnitCarry]) -> pa.Table:
    """The one-job read's CommitLog findings + the consume-queue findings of the files ``units`` printed
    (those decoded now; the skipped ones' come with the carried findings)."""
    import pyarrow.compute as pc

    scan = fresh.scan_findings
    if units is None or not any(units.prints.values()):
        return scan
    found = fresh.anomalies.filter(pc.fill_null(_unit_file_rows(fresh.anomalies, units.prints), False))
    return pa.concat_tables([scan, _conform(found, STATE_FINDINGS.arrow_schema())])


def _resume(broker: str, holder: tuple, last: int, split: int, findings: Optional[pa.Table]) -> int:
    """Where the next run resumes in file ``holder`` (path, base, size): at the newest relevant record
    ``last`` itself when the CommitLog scan reported nothing between the start of its ``split_bytes`` cell and
    it (so ``last`` is on the cell's record chain: jobs/read/incremental/plan.py), else at the cell's start.  Without
    the findings at hand (the DataFrame plan's write) at the cell's start."""
    import pyarrow.compute as pc

    path, base, _ = holder
    cell = base + (last - base) // split * split
    if findings is None or cell == last:
        return cell
    pos = findings.column("position")
    mine = pc.and_(pc.equal(findings.column("broker"), broker), pc.equal(findings.column("file"), path))
    hit = pc.and_(mine,
                  pc.and_(pc.equal(findings.column("source"), "commitlog"),
                          pc.and_(pc.greater_equal(pos, cell - base), pc.less(pos, last - base))))
    return cell if pc.any(pc.fill_null(hit, False)).as_py() else last


def _header(store, last_and_n, n_findings: int, split: int, digest: str, unit_prints: dict,
            segments: list, findings: Optional[pa.Table] = None) -> dict:
    """The audit_state row of one broker: resume at its newest relevant record (:func:`_resume`)."""
    from txlog_io.fingerprint import file_print

    last, n = last_and_n
    files = sorted(store.commitlog_files, key=lambda f: f[1])
    resume, holder = (files[0][1] if files else 0), None
    if last is not None:
        holder = next((f for f in files if f[1] <= last < f[1] + f[2]), None)
        if holder is not None:
            resume = _resume(store.broker, holder, last, split, findings)
    rel = (lambda p: os.path.relpath(p, store.root).replace(os.sep, "/"))
    below = {rel(p): [base, size, file_print(store.root, rel(p)).edge_sha256]
             for p, base, size in files if base + size <= resume}
    return {"broker": store.broker, "format_version": STATE_FORMAT_VERSION, "config_hash": digest,
            "store_root": store.root, "resume_offset": int(resume),
            "resume_file": rel(holder[0]) if holder else None,
            "resume_file_base": int(holder[1]) if holder else None,
            "resume_prefix_sha256": (_prefix_sha(holder[0], resume - holder[1]) if holder
                                     else _prefix_sha("", 0)),
            "below_files_json": json.dumps(below, sort_keys=True),
            "commitlog_end": int(_commitlog_end(store)), "records": int(n), "findings": int(n_findings),
            "unit_files_json": json.dumps(unit_prints, sort_keys=True),
            "record_segments_json": json.dumps(segments)}


def retire_previous(plan: Plan) -> None:
    """After this run completed: the previous run's state is no longer the newest; remove its rows (one
    commit per table; whole files)."""
    from jobs.delta import sink as delta_sink

    if not plan.state_written or plan.previous_run is None or plan.previous_run == plan.run_id:
        return
    kept = {r for segs in plan.segments.values() for r, _ in segs}
    kept_final = {r for segs in plan.final_segments.values() for r in segs}
    for table in STATE_TABLES.values():
        # records and settled transactions: every run's rows but the segments this state lists (a fallback
        # run does not read the previous state's list)
        old = (_state_runs(plan.out, table) - kept if table is STATE_RECORDS
               else _state_runs(plan.out, table) - kept_final if table is STATE_FINAL else {plan.previous_run})
        for run_id in sorted(old):
            delta_sink.retract_run(plan.out, table, run_id)


def _state_runs(out: str, table) -> set:
    """The run ids ``table`` holds rows of."""
    import deltalake

    from jobs.delta import outfs
    from jobs.delta import sink as delta_sink

    path = delta_sink.table_path(out, table)
    if not outfs.is_delta(path):
        return set()
    return {dict(p).get("run_id") for p in (deltalake.DeltaTable(path, storage_options=outfs.delta_options(path))
                                            .partitions() or [])}


__all__ = ["write_state", "start_state_write", "write_now", "retire_previous"]
