"""The reduction of evidence already on the driver as Arrow (no Spark): a one-job read's tables
(``jobs.read.full.LocalRead``) and an incremental run's carried rows, put into the reducer's input
(``schemas.recon.RECON_INPUT``) and reduced by :func:`jobs.reconstruct.reducer.reduce_input`.
"""
from __future__ import annotations

import time
from typing import Dict, Optional

import pyarrow as pa

from jobs.reconstruct.reducer import input_table, reduce_input


def bounds_rows(layout_info) -> list:
    """(broker, min_commitlog_offset, n_cq) per store listing that has a CommitLog file."""
    return [(s.broker, int(min(base for _, base, _ in s.commitlog_files)),
             int(getattr(s, "consume_queues", 0) or 0))
            for s in layout_info or () if getattr(s, "commitlog_files", None)]


def bounds_table(layout_info) -> Optional[pa.Table]:
    """The ``commitlog_bounds`` input as Arrow (``jobs.reconstruct.spark.commitlog_bounds_from_layout`` as a
    table)."""
    rows = bounds_rows(layout_info)
    if not rows:
        return None
    schema = pa.schema([("broker", pa.string()), ("min_commitlog_offset", pa.int64()), ("n_cq", pa.int64())])
    return pa.table([list(c) for c in zip(*rows, strict=True)], schema=schema)


def reduce_local(read, layout_info, params, override, timings: Optional[dict] = None,
                 critical_within_ms: int = 60000, plan=None) -> Dict[str, pa.Table]:
    """The reducer's five outputs from ``read`` (a ``jobs.read.full.LocalRead``), on the driver; ``plan``:
    an incremental plan whose settled transactions (``carried["final"]``) are reduced with it."""
    t0 = time.monotonic()
    table = input_table(commitlog=read.commitlog, op_bodies=read.op_bodies, consumequeue=read.consumequeue,
                        statetable=read.statetable, redolog=read.redolog,
                        consumer_offsets=read.consumer_offsets, anomalies=read.anomalies,
                        commitlog_bounds=bounds_table(layout_info))
    extra = final_input_of(plan)
    if extra is not None:
        table = pa.concat_tables([table, extra])
    t1 = time.monotonic()
    outs = reduce_input(table, params, override, critical_within_ms, True, final_of(plan))
    if timings is not None:
        timings.update({"reconstruct.collect": t1 - t0, "reconstruct.reduce": time.monotonic() - t1})
    return outs


def carried_input(plan) -> Optional[pa.Table]:
    """An incremental plan's carried rows (``jobs.read.incremental.plan.Plan``) as reducer input (the records,
    op bodies and findings, and the settled transactions' facts and consume-queue tuples), or None.  Settled
    transactions carried as a DataFrame give their facts only: ``jobs.reconstruct.spark.reduce_frame`` adds
    their tuples on the executors."""
    if plan is None or not plan.carried:
        return None
    c = plan.carried
    t = input_table(commitlog=c["records"], op_bodies=c["op_bodies"], anomalies=c["findings"])
    extra = final_input_of(plan)
    return t if extra is None else pa.concat_tables([t, extra])


def final_of(plan):
    """The settled transactions an incremental plan carries (schemas.state.STATE_FINAL rows: Arrow, or a
    DataFrame when read for the executors), or None."""
    return None if plan is None or not plan.carried else plan.carried.get("final")


def final_input_of(plan) -> Optional[pa.Table]:
    """The settled transactions' reducer input (settle.final_input), or None; of settled transactions
    carried as a DataFrame, their facts only."""
    from jobs.reconstruct.settle import final_input

    final = final_of(plan)
    if final is None:
        return None
    return final_input(final if isinstance(final, pa.Table) else None, plan.carried.get("final_facts") or {})


__all__ = ["bounds_rows", "bounds_table", "reduce_local", "carried_input", "final_of", "final_input_of"]
