"""Random operation sequences against the reference broker (sends, ends, check passes, clock moves, crashes of
every kind, restarts) on every profile; afterwards the store must satisfy the broker's invariants:

* it decodes cleanly apart from injected faults, and every consume-queue unit matches its record (verify);
* every COMMIT record's PREPARED_TRANSACTION_OFFSET points at a half copy of the same UNIQ_KEY (4.3+) or at
  the prepared record (3.x, 4.0-4.2);
* half-queue offsets are contiguous; consumer offsets never exceed the queue's max offset;
* the ledger's outcome agrees with its records and with what the decoded store shows;
* TRANSACTION_CHECK_TIMES never exceeds transactionCheckMax; copies of one transaction have increasing
  offsets.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refbroker import COMMIT, ROLLBACK, UNKNOWN, Producer, Run
from refbroker.ledger import iter_ledger
from refbroker.profiles import PROFILE_NAMES
from refbroker.verify import verify
from refbroker.workload import TX_CLASSES, _check_answer

CLASSES = sorted(n for n in TX_CLASSES if n != "inflight")

OPERATION = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(CLASSES)),
    st.tuples(st.just("ordinary"), st.integers(0, 3)),
    st.tuples(st.just("end"), st.integers(0, 10_000), st.sampled_from([COMMIT, ROLLBACK, UNKNOWN])),
    st.tuples(st.just("advance"), st.integers(1, 40_000)),
    st.tuples(st.just("check")),
    st.tuples(st.just("jump_hours"), st.sampled_from([1, 80])),
    st.tuples(st.just("crash"), st.sampled_from(["plain", "torn", "after_commit", "lag", "delete_cq"])),
)


def _run_sequence(out: Path, profile: str, operations: list, final: str) -> None:
    run = Run(out, profile, seed=1, commitlog_file_size=24 * 1024, consumequeue_file_size=200)
    b = run.broker
    producer = Producer("PID_TX", check_listener=_check_answer, port=40000)
    gone = Producer(
        "PID_GONE", check_listener=_check_answer, port=40001, connected=False, same_jvm_as=producer
    )
    plain = Producer("PID_PLAIN", port=40002, pid=777)
    for p in (producer, gone, plain):
        b.register_producer(p)
    b.start()
    txns = []
    hold_crash = False

    def ensure_running():
        if b.down:
            b.run_until(b.now + 1000)
            b.restart()

    for op in operations:
        if hold_crash and not b.down:
            b.crash("dispatch lag")
            hold_crash = False
        ensure_running()
        kind = op[0]
        if kind == "send":
            plan = TX_CLASSES[op[1]]
            txn = b.send_transactional(gone if plan.unreachable else producer, "TopicTx", len(txns) % 2,
                                       b"body-%d" % len(txns), tags="T", keys=f"TX-{len(txns)}", plan=plan,
                                       immunity_s=2 if plan.immunity else None)
            if txn is not None:
                txns.append(txn)
                if plan.at_send is not None:
                    b.schedule(b.now + 3, b.end_transaction, txn, plan.at_send, txn=txn)
                if plan.commit_twice:
                    b.schedule(b.now + 30, b.end_transaction, txn, COMMIT, txn=txn)
        elif kind == "ordinary":
            b.send_message(plain, "TopicPlain", op[1], b"x" * 50, tags="TagA", keys="K")
        elif kind == "end" and txns:
            b.end_transaction(txns[op[1] % len(txns)], op[2])
        elif kind == "advance":
            b.run_until(b.now + op[1])
        elif kind == "check":
            b.check_pass()
        elif kind == "jump_hours":
            b.shutdown()
            b.run_until(b.now + op[1] * 3_600_000)
            b.restart()
        elif kind == "crash":
            how = op[1]
            if how == "plain":
                b.crash("plain")
            elif how == "delete_cq":
                b.crash("plain")
                key = ("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)
                b.delete_consume_queue(*(key if key in b.store.queues else ("TopicPlain", 0)))
            elif how == "torn":
                b.tear_next_put = 0.5
            elif how == "after_commit":
                b.crash_after_next_commit = True
            else:
                b.store.hold_dispatch = True
                hold_crash = True
    ensure_running()
    b.tear_next_put = None
    b.crash_after_next_commit = False
    b.run_until(b.now + 5000)
    ensure_running()
    b.tear_next_put = None
    b.crash_after_next_commit = False
    if final == "crash":
        b.crash("final")
    else:
        b.shutdown()
    run.finish()


@settings(max_examples=14, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)
@given(profile=st.sampled_from(PROFILE_NAMES), operations=st.lists(OPERATION, min_size=1, max_size=28),
       final=st.sampled_from(["shutdown", "crash"]))
def test_random_operation_sequences_keep_the_broker_invariants(profile, operations, final):
    out = Path(tempfile.mkdtemp(prefix="refbroker-hyp-"))
    try:
        _run_sequence(out, profile, operations, final)
        report = verify(out)
        assert not report.unexplained, report.unexplained[:3]
        assert not report.problems, report.problems[:5]
        from refbroker import get_profile

        check_max = get_profile(profile).transactionCheckMax
        for entry in iter_ledger(out / "ledger.jsonl"):
            if entry["kind"] != "transaction":
                continue
            assert (entry["outcome"] == "COMMITTED") == bool(entry["commit_records"])
            offsets = [c["commitlog_offset"] for c in entry["half_copies"]]
            assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
            if check_max is not None:
                assert entry["max_check_times"] <= check_max
            copies = set(offsets)
            for commit in entry["commit_records"]:
                assert commit["prepared_transaction_offset"] in copies
            if entry["outcome"] == "ROLLED_BACK":
                assert entry["op_records"] or entry["rollback_records"]
    finally:
        shutil.rmtree(out, ignore_errors=True)
