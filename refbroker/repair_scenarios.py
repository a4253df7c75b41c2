"""Reference-broker stores for the repair job's situations, each with its ledger (refbroker.generate.Run).

=======================  =====================================================================================
name                     what the store shows at the end
=======================  =====================================================================================
``op_batch_lost``        5.1+: transactions committed / rolled back at send, then a crash while their ops sit
                         in TransactionalOpBatchService's buffer (OP_BATCH_LOST): committed halves without an
                         op, the broker would check them again (MARK_DONE)
``commit_before_op``     4.3-5.0 (4.6-4.9 by default): a crash between a COMMIT record and its op (MARK_DONE)
``op_queue_deleted``     any 4.3+ profile: a clean store whose op consume queue an operator deleted (the check
                         service would re-read every half since the beginning: apache/rocketmq#2133)
``cq_truncated``         any 4.3+ profile: the half queue's newest consume-queue units zeroed (lost on a crash
                         before their flush; the audit cannot tell this from dispatch lag); the file as the
                         broker wrote it is kept as ``out_dir/cq_before_truncation``
=======================  =====================================================================================

The 3.x statetable rebuilt from the first redolog file is the generator's ``legacy-3x`` scenario.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from refbroker.events import BrokerDown
from refbroker.generate import Run
from refbroker.producer import COMMIT, ROLLBACK, Producer
from refbroker.systopics import HALF_TOPIC, OP_TOPIC

TOPIC = "TopicRepair"
_SIZES = {"commitlog_file_size": 1 << 20, "consumequeue_file_size": 6000}


def _traffic(run: Run, transactions: int, *, end_first: int) -> list:
    """Ordinary sends plus ``transactions`` transactional sends; the first ``end_first`` are committed (2 of
    3) or rolled back at send, the others stay open (never answered: the producer is silent)."""
    b = run.broker
    producer = Producer("PID_REPAIR", check_listener=lambda request: None)
    b.register_producer(producer)
    b.start()
    txns = []
    for i in range(transactions):
        b.run_until(b.now + 5)
        b.send_message(producer, TOPIC, i % 2, b"ordinary-%d" % i, tags="o")
        txn = b.send_transactional(producer, TOPIC, i % 2, b"tx-%d" % i, tags="t", keys=f"k{i}")
        txns.append(txn)
    for i, txn in enumerate(txns[:end_first]):
        b.end_transaction(txn, ROLLBACK if i % 3 == 2 else COMMIT)
    return txns


def op_batch_lost(out_dir, *, profile: str = "5.1+", transactions: int = 30, seed: int = 1):
    run = Run(out_dir, profile, seed=seed, **_SIZES)
    _traffic(run, transactions, end_first=transactions * 2 // 3)
    run.broker.crash("op batch lost")          # within transactionOpBatchInterval: the op buffer is lost
    return run.finish()


def commit_before_op(out_dir, *, profile: str = "4.6-4.9", transactions: int = 30, seed: int = 1):
    run = Run(out_dir, profile, seed=seed, **_SIZES)
    txns = _traffic(run, transactions, end_first=transactions // 2)
    b = run.broker
    b.crash_after_next_commit = True
    try:
        b.end_transaction(txns[-1], COMMIT)
    except BrokerDown:
        pass
    if not b.down:
        b.crash("after commit")
    return run.finish()


def op_queue_deleted(out_dir, *, profile: str = "5.1+", transactions: int = 30, seed: int = 1):
    run = Run(out_dir, profile, seed=seed, **_SIZES)
    _traffic(run, transactions, end_first=transactions // 2)
    run.broker.shutdown()
    result = run.finish()
    shutil.rmtree(Path(result.store_dir) / "consumequeue" / OP_TOPIC)
    return result


def cq_truncated(out_dir, *, profile: str = "5.1+", transactions: int = 30, seed: int = 1, units: int = 5):
    run = Run(out_dir, profile, seed=seed, **_SIZES)
    _traffic(run, transactions, end_first=transactions // 2)
    run.broker.shutdown()
    result = run.finish()
    files = sorted((Path(result.store_dir) / "consumequeue" / HALF_TOPIC / "0").iterdir())
    path = files[-1]
    data = bytearray(path.read_bytes())
    shutil.copyfile(path, Path(out_dir) / "cq_before_truncation")       # the broker's own bytes, for tests
    used = len(data.rstrip(b"\0")) // 20 * 20 + (20 if len(data.rstrip(b"\0")) % 20 else 0)
    cut = max(0, used - units * 20)
    data[cut:used] = bytes(used - cut)
    path.write_bytes(bytes(data))
    return result


SCENARIOS = {f.__name__: f for f in (op_batch_lost, commit_before_op, op_queue_deleted, cq_truncated)}

__all__ = ["SCENARIOS", "op_batch_lost", "commit_before_op", "op_queue_deleted", "cq_truncated"]
