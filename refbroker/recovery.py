"""Crash and restart of the reference broker.

Crash model: a process crash keeps everything written (page cache) and loses the consume-queue dispatch
backlog, the 5.1+ op buffer, in-flight check answers (events of the old epoch) and in-memory consumer offsets
(a restart reloads consumerOffset.json); a torn write (refbroker.produce) keeps a prefix of the last record.

``Recovery`` is the part of ``refbroker.broker.Broker`` that kills the broker process and restarts it
(abnormal recovery re-dispatches the lost backlog, rebuilds consume queues an operator deleted while the
broker was down and, for 3.x, rebuilds the statetable), and deletes a stopped broker's consume queues.
"""
from __future__ import annotations

from refbroker import ledger as L
from refbroker.profiles import MODEL_STATETABLE
from txlog_io import commitlog as CL
from txlog_io.errors import UsageError


class Recovery:
    """Broker mixin: crash, restart (normal or abnormal recovery), consume queues deleted by an operator."""

    def crash(self, reason: str = "crash") -> None:
        """Kill the broker process: in-memory state not on disk is lost."""
        if self.down:
            return
        lost_dispatch = self.store.crash()
        self._lost_dispatch = lost_dispatch
        fault_id = None
        if self.op_pending:
            fault_id = self._fault(
                {
                    "fault": "OP_BATCH_LOST",
                    "file": None,
                    "position": None,
                    "length": 0,
                    "detail": f"{len(self.op_pending)} buffered op offsets lost in the crash: "
                    + "".join(text for text, _ in self.op_pending),
                    "expected_anomalies": [],
                }
            )
        for _text, copy in self.op_pending:
            txn = copy.txn
            txn.pending_op_offsets.discard(copy.queue_offset)
            txn.lost_ops.append({"half_queue_offset": copy.queue_offset, "reason": "OP_BATCH_LOST_IN_CRASH"})
            txn.flags.add(L.OP_LOST_IN_CRASH)
            if fault_id:
                txn.faults.append(fault_id)
        self.op_pending = []
        self.op_pending_chars = 0
        if lost_dispatch:
            first = lost_dispatch[0]
            self._lag_fault = self._fault_record(
                {
                    "fault": "CQ_DISPATCH_LAG",
                    "file": None,
                    "position": first.physical_offset,
                    "length": len(lost_dispatch),
                    "detail": f"{len(lost_dispatch)} CommitLog records from physical offset "
                    f"{first.physical_offset} had no consume-queue entry at the crash",
                    "expected_anomalies": [],
                }
            )
        self.down = True
        self.epoch += 1
        self.stats["crashes"] += 1

    def restart(self) -> None:
        """Start after a crash (abort present: abnormal recovery) or after a clean shutdown."""
        if not self.down:
            raise UsageError("broker is running")
        abnormal = (self.store.root / "abort").exists()
        lost, self._lost_dispatch = self._lost_dispatch, []
        if lost and self._lag_fault is not None:
            self._lag_fault["redispatched"] = True      # recovery rebuilt the missing units
        self._lag_fault = None
        if abnormal and self._deleted_queues:
            self._rebuild_deleted_queues()
        for req in lost:                            # recoverAbnormally re-dispatches what the CQs miss
            req.producer_group = None               # 3.x: no statetable update during recovery
            if self.store.statetable is not None and (req.sys_flag & CL.TRANSACTION_MASK) == CL.TX_PREPARED:
                self.store._redolog_put(req.physical_offset, req.size, -1)
                continue
            self.store._dispatch(req)
        self.store.reopen()
        # in-memory consumer offsets come back from consumerOffset.json
        self.offsets = {k: dict(v) for k, v in self.persisted_offsets.items()}
        if self.profile.transaction_model == MODEL_STATETABLE and abnormal:
            self._recreate_state_table()
        self.down = False
        self.epoch += 1
        self.stats["restarts"] += 1
        self._start_services()

    def delete_consume_queue(self, topic: str, queue_id: int) -> None:
        """An operator removes a consume-queue directory while the broker is down (a common "repair")."""
        if not self.down:
            raise UsageError("delete_consume_queue needs a stopped broker")
        import shutil

        writer = self.store.queue_writer(topic, queue_id)
        if writer is not None:
            writer.forget_files()
            writer.min_index = 0
            writer.pre_blank_file = None
        directory = self.store.root / "consumequeue" / topic / str(queue_id)
        if directory.is_dir():
            shutil.rmtree(directory)
        self._deleted_queues.append((topic, queue_id))

    def _rebuild_deleted_queues(self) -> None:
        """recoverAbnormally re-dispatches the CommitLog from its recovery start (here: the newest CommitLog
        file;
        RocketMQ picks it from the checkpoint).  A deleted queue is rebuilt from that point only: its first
        file is created at the first re-dispatched offset and filled with pre-blank units before it
        (fillPreBlank);
        older units are gone."""
        from txlog_io.dledger import decode_log_range

        store = self.store
        recovery_start = store.commitlog.queue.file_start
        wanted = {key: store._queue(*key) for key in self._deleted_queues}
        for path in sorted(store.commitlog.queue.directory.iterdir()):   # commitlog/ or dledger-<id>/data/
            if int(path.name) < recovery_start:
                continue
            for batch, _anomalies in decode_log_range(str(path)):
                cols = batch.select(["topic", "queue_id", "queue_offset", "physical_offset", "total_size",
                                     "tags_code", "transaction_type"]).to_pylist()
                for row in cols:
                    writer = wanted.get((row["topic"], row["queue_id"]))
                    if writer is None or row["transaction_type"] not in ("NOT", "COMMIT"):
                        continue
                    if writer.next_index is not None and row["queue_offset"] < writer.next_index:
                        continue
                    writer.append(
                        row["queue_offset"], row["physical_offset"], row["total_size"], row["tags_code"]
                    )
        for (topic, queue_id), writer in wanted.items():
            writer.write_pending()
            self._fault(
                {
                    "fault": "CQ_DELETED_AND_REBUILT",
                    "file": f"consumequeue/{topic}/{queue_id}",
                    "position": writer.min_index * 20 % store.cq_file_size,
                    "length": writer.pre_blank_units,
                    "detail": f"consume queue {topic}/{queue_id} deleted while the broker was down; abnormal "
                    f"recovery rebuilt it from CommitLog offset {recovery_start}: first unit "
                    f"{writer.min_index}, {writer.pre_blank_units} pre-blank units before it",
                    "expected_anomalies": [],
                    "recovery_start": recovery_start,
                    "topic": topic,
                    "queue_id": queue_id,
                    "first_queue_offset": writer.min_index,
                }
            )
        self._deleted_queues = []


__all__ = [
    "Recovery",
]
