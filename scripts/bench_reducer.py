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

import pyarrow as pa  # noqa: E402

from jobs.txparams import HALF_TOPIC, OP_TOPIC, AuditParams  # noqa: E402
from jobs.txreduce import input_table, reduce_input  # noqa: E402
from schemas.sources import COMMITLOG_SOURCE  # noqa: E402

BASE = 1_700_000_000_000


def synthetic_commitlog(n: int) -> pa.Table:
    cols = {f.name: [] for f in COMMITLOG_SOURCE.arrow_schema()}
    off = 0
    qo = 0
    op_qo = 0
    pending_ops: list = []

    def add(topic, ttype, queue_offset, uk=None, body=None, pto=0, real_topic=None, check_times=None,
            tpqo=None):
        nonlocal off
        v = {"broker": "b", "file": "00000000000000000000", "file_position": off, "physical_offset": off,
             "total_size": 300, "magic_version": 2, "body_crc": 0, "body_crc_ok": True, "queue_id": 0,
             "flag": 0, "queue_offset": queue_offset, "stored_physical_offset": off, "sys_flag": 0,
             "transaction_type": ttype, "born_timestamp": BASE + off // 300, "born_host": "10.0.0.1:1",
             "store_timestamp": BASE + off // 300 + 5, "store_host": "10.0.0.2:2", "reconsume_times": 0,
             "prepared_transaction_offset": pto, "body_size": 0, "topic": topic, "properties": [],
             "msg_id": f"0A00000200000000{off:016X}", "uniq_key": uk, "tags": None, "keys": uk,
             "pgroup": "pg", "real_topic": real_topic, "real_qid": 0 if real_topic else None,
             "tran_msg": True,
             "transaction_check_times": check_times, "tran_prepared_queue_offset": tpqo,
             "check_immunity_time_s": None, "transaction_id": uk, "tags_code": 0, "compression": "NONE",
             "body": body}
        for k, x in v.items():
            cols[k].append(x)
        off += 300
        return off - 300

    def flush_ops(force=False):
        nonlocal op_qo
        if pending_ops and (force or len(pending_ops) >= 10):
            add(OP_TOPIC, "NOT", op_qo, body=(",".join(map(str, pending_ops)) + ",").encode())
            op_qo += 1
            pending_ops.clear()

    for i in range(n):
        uk = f"7F00000100002A9F0000{i:012X}"
        half = add(HALF_TOPIC, "PREPARED", qo, uk, real_topic="orders")
        my_qo = qo
        qo += 1
        if i % 2 == 0:
            add("orders", "COMMIT", 0, uk, pto=half, real_topic="orders")
            pending_ops.append(my_qo)
        elif i % 3 == 0:
            pending_ops.append(my_qo)
        else:
            add(HALF_TOPIC, "PREPARED", qo, uk, real_topic="orders", check_times=1, tpqo=my_qo)
            qo += 1
        flush_ops()
    flush_ops(force=True)
    return pa.Table.from_pydict(cols, schema=COMMITLOG_SOURCE.arrow_schema())


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--transactions", type=int, default=200_000)
    a = p.parse_args(argv)
    cl = synthetic_commitlog(a.transactions)
    table = input_table(commitlog=cl)
    params = AuditParams(6000, 15, 30000, 72, as_of_ms=BASE + 10 * a.transactions)
    t0, c0 = time.perf_counter(), time.process_time()
    out = reduce_input(table, params)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    n_tx = out["transactions"].num_rows
    print(json.dumps({"transactions": n_tx, "input_rows": table.num_rows, "wall_s": round(wall, 2),
                      "cpu_s": round(cpu, 2), "tx_per_cpu_s": round(n_tx / cpu),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "load_avg_1m": os.getloadavg()[0]}))
    assert n_tx == a.transactions, n_tx
    return 0


if __name__ == "__main__":
    sys.exit(main())
