"""The reducer on the driver's cores: one broker's transaction rules (jobs/txrules.transactions) run over
contiguous ranges of transaction ids, one range per thread, and the parts are concatenated in range order.

Why this is exact: ``txrules.transactions`` groups the linked evidence by transaction id (dictionary order =
order of first appearance) and every rule is a per-group expression (the broker's facts, profile, params and
``damaged`` ranges are given to every part; each part's findings are kept in part order).  A part takes ALL rows of the ids in its range, in input order,
so each group sees the same rows in the same order (ties picked by "earliest row" stay the same), the part's
own dictionary order is the global one restricted to its ids, and concatenating the parts in range order
gives today's rows in today's order.  Rows without an id belong to no group and are dropped (the rules ignore
them).  What is global across transactions -- linking (jobs/reconstruct/evidence.py), findings, facts, the check-back
ranking -- stays in jobs/reconstruct/reducer.py and runs once.

Threads, not processes: numpy's sorts and ufuncs and pyarrow's kernels release the GIL, and the evidence
columns need no copy into another process.  A small input keeps one thread: below ``PARALLEL_MIN_ROWS``
evidence rows the split (a dictionary pass plus a row take per part) costs more than it saves.

``arrow_allocator()``: the reduce allocates its Arrow buffers from the system allocator (glibc malloc), not
pyarrow's default mimalloc pool.  Measured on the 8 GiB bench's captured reducer input (first reduce of a
process, the audit's case): mimalloc spends ~0.5 s of system time in that call against ~0.1 s for the system
pool, for the same user time (why is not pinned down: mimalloc took fewer minor page faults than jemalloc,
63k against 110k, yet three times its system time); the buffers remember their pool, so outputs outlive the
switch safely.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.reconstruct import rules as txrules
from jobs.reconstruct.damage import DamagedRanges
from jobs.reconstruct.evidence import Evidence
from jobs.session import driver_cpus

#: rows from which the reduce uses threads: input rows for the pool (and the findings side beside the
#: linking), one broker's evidence rows for the split of its rules (measured: docs/ARCHITECTURE.md "The
#: reducer on the driver's cores")
PARALLEL_MIN_ROWS = 50_000


@contextmanager
def arrow_allocator():
    """Within: pyarrow's default memory pool is the system allocator (see the module docstring); the previous
    pool is restored on exit.  The pool is process-wide: another thread allocating meanwhile gets it too,
    which changes only where its buffers come from."""
    before, system = pa.default_memory_pool(), pa.system_memory_pool()
    if before.backend_name == system.backend_name:
        yield
        return
    pa.set_memory_pool(system)
    try:
        yield
    finally:
        pa.set_memory_pool(before)


def parts_for(n_rows: int, cpus: Optional[int] = None) -> int:
    """How many parts a broker's ``n_rows`` evidence rows are reduced in: one below PARALLEL_MIN_ROWS."""
    if n_rows < PARALLEL_MIN_ROWS:
        return 1
    return cpus or driver_cpus()


def split_by_transaction(ev: Evidence, parts: int) -> List[np.ndarray]:
    """Evidence row indices (ascending) of ``parts`` contiguous ranges of transaction ids, balanced by rows;
    rows without an id are in none."""
    enc = pc.dictionary_encode(ev.s["tx"])
    gid = np.asarray(pc.fill_null(enc.indices, -1)).astype(np.int64)
    n_groups = len(enc.dictionary)
    rows_per = np.bincount(gid[gid >= 0], minlength=n_groups)
    cum = np.cumsum(rows_per)
    total = int(cum[-1]) if n_groups else 0
    # group cut points: the first group whose cumulative rows reach k/parts of the total
    cuts = np.searchsorted(cum, [total * k // parts for k in range(1, parts)], side="left") + 1
    part_of = np.searchsorted(cuts, gid, side="right")
    part_of[gid < 0] = -1
    return [np.nonzero(part_of == k)[0] for k in range(parts)]


def _local(rows: np.ndarray, n: int) -> Callable[[np.ndarray], np.ndarray]:
    pos = np.full(n, -1, np.int64)
    pos[rows] = np.arange(len(rows))

    def to_local(global_rows: np.ndarray) -> np.ndarray:
        mine = pos[global_rows]
        return mine[mine >= 0]
    return to_local


def transactions(broker: str, ev: Evidence, facts, profile, params,
                 problems: Sequence[Tuple[np.ndarray, str]] = (), damaged: Optional[DamagedRanges] = None,
                 parts: Optional[int] = None, pool: Optional[ThreadPoolExecutor] = None,
                 findings: Optional[list] = None) -> pa.Table:
    """``txrules.transactions`` of one broker, in ``parts`` threads (default: parts_for(ev.n)); same rows,
    same order; ``findings`` as there, in the same order too."""
    parts = parts_for(ev.n) if parts is None else parts
    if parts <= 1 or ev.n == 0:
        return txrules.transactions(broker, ev, facts, profile, params, problems, damaged, findings)

    def one(rows: np.ndarray) -> Tuple[pa.Table, list]:
        to_local = _local(rows, ev.n)
        mine: list = []
        return txrules.transactions(broker, ev.rows(rows), facts, profile, params,
                                    [(to_local(r), code) for r, code in problems], damaged, mine), mine

    split = [rows for rows in split_by_transaction(ev, parts) if len(rows)]
    if len(split) <= 1:
        return txrules.transactions(broker, ev, facts, profile, params, problems, damaged, findings)
    if pool is not None:
        got = list(pool.map(one, split))
    else:
        with ThreadPoolExecutor(max_workers=parts, thread_name_prefix="txreduce") as own:
            got = list(own.map(one, split))
    if findings is not None:
        findings.extend(f for _, mine in got for f in mine)
    return pa.concat_tables([t for t, _ in got])


__all__ = ["PARALLEL_MIN_ROWS", "arrow_allocator", "parts_for", "split_by_transaction",
           "transactions"]
