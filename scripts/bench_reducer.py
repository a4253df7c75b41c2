"""Rate of the Spark-free reducer (jobs/txreduce.reduce_input) on one core: a synthetic 5.1+ broker with N
transactions (half copy each; half committed -- COMMIT record + op --, a third rolled back by an op, the rest
PREPARED with a re-put copy), op bodies batched 10 per op message.  Prints one JSON line.

    .venv/bin/python scripts/bench_reducer.py [--transactions 200000]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from jobs.reconstruct.params import HALF_TOPIC, OP_TOPIC, AuditParams  # noqa: E402
from jobs.reconstruct.reducer import input_table, reduce_input  # noqa: E402
from schemas.sources import COMMITLOG_SOURCE  # noqa: E402

BASE = 1_700_000_000_000


def synthetic_commitlog(n: int) -> pa.Table:
    """Built column-wise (numpy), so the peak RSS measured is the reducer's, not the generator's: per
    transaction a half copy; even ones get a COMMIT record and an op, odd multiples of 3 an op, the rest a
    re-put copy (check times 1); the ops follow, their half offsets batched 10 per op message."""
    i = np.arange(n, dtype=np.int64)
    commit, rolled = i % 2 == 0, (i % 2 != 0) & (i % 3 == 0)
    reput = ~commit & ~rolled
    qo = np.concatenate([[0], np.cumsum(1 + reput)[:-1]])            # half-queue offset of each first copy
    # CommitLog order: each transaction's half, then its COMMIT or re-put copy; the op messages at the end
    per_tx = 1 + commit + reput
    start = np.concatenate([[0], np.cumsum(per_tx)[:-1]])
    m = int(per_tx.sum())
    named = qo[commit | rolled]
    n_ops = -(-len(named) // 10)
    total = m + n_ops
    off = np.arange(total, dtype=np.int64) * 300
    kind = np.zeros(total, np.int8)                                  # 0 half, 1 commit, 2 re-put, 3 op
    tx_of = np.full(total, -1, np.int64)
    tx_of[start] = i
    second = start[commit | reput] + 1
    kind[second] = np.where(commit[commit | reput], 1, 2)
    tx_of[second] = i[commit | reput]
    kind[m:] = 3
    uk = pa.array(np.char.add("7F00000100002A9F0000", np.char.zfill(np.char.upper(
        np.vectorize(lambda x: format(x, "X"))(np.maximum(tx_of, 0))), 12)))
    uk = pc.if_else(pa.array(tx_of >= 0), uk, pa.nulls(total, pa.string()))
    is_half = (kind == 0) | (kind == 2)
    topic = np.where(is_half, HALF_TOPIC, np.where(kind == 1, "orders", OP_TOPIC))
    ttype = np.where(is_half, "PREPARED", np.where(kind == 1, "COMMIT", "NOT"))
    q = np.zeros(total, np.int64)
    q[start] = qo
    q[start[reput] + 1] = qo[reput] + 1
    q[m:] = np.arange(n_ops)
    pto = np.zeros(total, np.int64)
    pto[start[commit] + 1] = off[start[commit]]
    bodies = [(",".join(map(str, named[k:k + 10])) + ",").encode() for k in range(0, len(named), 10)]
    cols = {
        "broker": pa.array(["b"] * total), "file": pa.array(["00000000000000000000"] * total),
        "file_position": off, "physical_offset": off, "total_size": np.full(total, 300, np.int32),
        "magic_version": np.full(total, 2, np.int8), "body_crc": np.zeros(total, np.int32),
        "body_crc_ok": np.ones(total, bool), "queue_id": np.zeros(total, np.int32), "queue_offset": q,
        "transaction_type": ttype, "born_timestamp": BASE + off // 300,
        "store_timestamp": BASE + off // 300 + 5, "prepared_transaction_offset": pto, "topic": topic,
        "msg_id": pa.array(np.char.add("0A000002", np.char.zfill(off.astype(str), 24))), "uniq_key": uk,
        "keys": uk, "pgroup": pa.array(["pg"] * total),
        "real_topic": pa.array(np.where(kind == 3, None, "orders")),
        "real_qid": pa.array(np.zeros(total, np.int32), mask=kind == 3),
        "transaction_check_times": pa.array(np.ones(total, np.int32), mask=kind != 2),
        "tran_prepared_queue_offset": pa.array(q - 1, mask=kind != 2),
        "transaction_id": uk,
        "body": pa.array([None] * m + bodies, pa.binary()),
    }
    schema = COMMITLOG_SOURCE.arrow_schema()
    return pa.table({f.name: (pa.array(cols[f.name]).cast(f.type) if f.name in cols
                              else pa.nulls(total, f.type)) for f in schema}, schema=schema)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--transactions", type=int, default=200_000)
    a = p.parse_args(argv)
    cl = synthetic_commitlog(a.transactions)
    table = input_table(commitlog=cl)
    del cl
    rss_input = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    params = AuditParams(6000, 15, 30000, 72, as_of_ms=BASE + 10 * a.transactions)
    t0, c0 = time.perf_counter(), time.process_time()
    out = reduce_input(table, params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_tx = out["transactions"].num_rows
    print(json.dumps({"transactions": n_tx, "input_rows": table.num_rows, "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2), "tx_per_cpu_s": round(n_tx / cpu),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "peak_rss_before_reduce_mb": round(rss_input),
                      "load_avg_1m": os.getloadavg()[0]}))
    assert n_tx == a.transactions, n_tx
    return 0


if __name__ == "__main__":
    sys.exit(main())
