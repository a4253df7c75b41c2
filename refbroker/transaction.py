"""Transactional sends, EndTransaction and op messages of the reference broker.

``TransactionPath`` is the part of ``refbroker.broker.Broker`` that plays TransactionMQProducer's half /
prepared send, EndTransactionProcessor (its checks, then for 4.3+ the commit record and the op message that
deletes the half; for 3.x / 4.0-4.2 the COMMIT or ROLLBACK record in the real topic) and
TransactionalMessageBridge's op writes, batched in 5.1+ as TransactionalOpBatchService does (one buffer for
the one half queue, flushed by size or interval, lost in a crash).  ``java_long`` is the broker's lenient
number parse of property values and op bodies.
"""
from __future__ import annotations

from typing import Optional

from refbroker import ledger as L
from refbroker.events import BrokerDown
from refbroker.produce import MAX_TOPIC_LENGTH
from refbroker.producer import COMMIT, ROLLBACK, UNKNOWN, Producer
from refbroker.profiles import MODEL_HALF_OP, OP_BODY_COMMA_BATCH
from refbroker.store import PutResult
from refbroker.systopics import HALF_TOPIC, OP_TOPIC, REMOVE_TAG
from txlog_io import commitlog as CL
from txlog_io import properties as P

_TX_TYPE = {COMMIT: CL.TX_COMMIT, ROLLBACK: CL.TX_ROLLBACK}


class OpRecord:
    __slots__ = ("queue_offset", "offsets", "born_timestamp", "commitlog_offset", "size", "body")

    def __init__(self, queue_offset, offsets, born_timestamp, commitlog_offset, size, body):
        self.queue_offset = queue_offset
        self.offsets = offsets
        self.born_timestamp = born_timestamp
        self.commitlog_offset = commitlog_offset
        self.size = size
        self.body = body


def java_long(text) -> int:
    """TransactionalMessageServiceImpl.getLong: Long.parseLong or -1."""
    try:
        return int(str(text).strip()) if str(text).strip().lstrip("-").isdigit() else -1
    except ValueError:
        return -1


class TransactionPath:
    """Broker mixin: transactional send, EndTransaction, op messages (and the 5.1+ op batch)."""

    # ========================================================================================================
    # transactional send
    # ========================================================================================================
    def send_transactional(self, producer: Producer, topic: str, queue_id: int, body: bytes, *, tags=None,
                           keys=None, user_props: Optional[dict] = None, compression: Optional[str] = None,
                           immunity_s: Optional[int] = None, plan=None, flag: int = 0,
                           stored_body: Optional[tuple] = None) -> Optional[L.Transaction]:
        """TransactionMQProducer.sendMessageInTransaction up to the stored half / prepared record."""
        p = self.profile
        if self.down:
            self.stats["send_failed"] += 1
            return None
        if len(topic) > MAX_TOPIC_LENGTH:
            self.stats["rejected_long_topic"] += 1
            return None
        self.ensure_topic(topic, max(queue_id + 1, self.topics.get(topic, 0)))
        born = self.clock.now - 1
        # 3.x/5.x clients put WAIT in the Message constructor; in 4.9.8 records WAIT follows PGROUP within
        # their
        # shared HashMap bucket, i.e. it was inserted after PGROUP (observed), and ordinary sends carry no
        # WAIT
        wait_first = p.wait_on_ordinary
        props = self._client_props(tags, keys, user_props, wait_first)
        if immunity_s is not None:
            props[P.CHECK_IMMUNITY_TIME_IN_SECONDS] = str(immunity_s)
        props.pop(P.DELAY, None)                       # the transactional producer clears DELAY
        props[P.TRAN_MSG] = "true"
        props[P.PGROUP] = producer.group
        if not wait_first:
            props[P.WAIT] = "true"
        self._client_send_props(props, producer, born)
        if p.writes_cluster_property:
            props[P.CLUSTER] = self.cluster
        if stored_body is not None:
            data, bits, _crc = stored_body
        else:
            data, bits = self._compress(body, compression)
        txn = L.Transaction(
            uniq_key=props.get(P.UNIQ_KEY),
            producer_group=producer.group,
            real_topic=topic,
            real_queue_id=queue_id,
            keys=keys,
            born_timestamp=born,
            born_host=producer.born_host,
            body=data,
            sys_flag=bits,
            flag=flag,
            props=None,
            profile_name=p.name,
            plan=plan,
            producer=producer,
        )
        txn.uses_ops = p.transaction_model == MODEL_HALF_OP
        if p.transaction_model == MODEL_HALF_OP:
            if p.writes_transaction_id and P.UNIQ_KEY in props:
                props[P.TRANSACTION_ID] = props[P.UNIQ_KEY]
            props[P.REAL_TOPIC] = topic
            props[P.REAL_QID] = str(queue_id)
            self.ensure_topic(HALF_TOPIC, 1)
            msg = self._message(HALF_TOPIC, 0, data, props, sys_flag=bits, flag=flag, born_timestamp=born,
                                born_host=producer.born_host)
            try:
                result = self._put(msg, what="half", txn=txn)
            except BrokerDown:
                self.stats["send_failed"] += 1
                return None
        else:
            msg = self._message(topic, queue_id, data, props, sys_flag=bits | CL.TX_PREPARED, flag=flag,
                                born_timestamp=born, born_host=producer.born_host)
            try:
                result = self._put(msg, what="prepared", txn=txn, producer_group=producer.group)
            except BrokerDown:
                self.stats["send_failed"] += 1
                return None
            txn.transaction_key = str(result.physical_offset)
        txn.props = props
        copy = L.HalfCopy(txn, result.physical_offset, result.size, result.queue_offset, msg.store_timestamp,
                          props, None, L.ORIGINAL, result.file, result.file_position, msg.sys_flag)
        txn.copies.append(copy)
        txn.send_result = (result.physical_offset, result.queue_offset)
        self._register_copy(copy)
        self.transactions[id(txn)] = txn
        self.stats["transactions"] += 1
        return txn

    def _register_copy(self, copy: L.HalfCopy) -> None:
        self.half_by_offset[copy.commitlog_offset] = copy
        if self.profile.transaction_model == MODEL_HALF_OP:
            self.half_by_qo[copy.queue_offset] = copy

    # ========================================================================================================
    # EndTransaction
    # ========================================================================================================
    def end_transaction(self, txn: L.Transaction, action: str, *, from_check: bool = False,
                        commitlog_offset: Optional[int] = None,
                        tran_state_table_offset: Optional[int] = None) -> str:
        """EndTransactionProcessor.  Offsets default to the producer's SendResult (an end at send)."""
        if commitlog_offset is None:
            commitlog_offset, tran_state_table_offset = txn.send_result
        request = {"time": self.clock.now, "action": action, "from_check": from_check,
                   "commitlog_offset": commitlog_offset, "tran_state_table_offset": tran_state_table_offset,
                   "accepted": False, "reason": None}
        txn.end_requests.append(request)
        if self.down:
            request["reason"] = "BROKER_DOWN"
            return request["reason"]
        if action == UNKNOWN:
            request["accepted"] = True
            request["reason"] = "UNKNOWN_WRITES_NOTHING"
            return request["reason"]
        copy = self.half_by_offset.get(commitlog_offset)
        reason = None
        if copy is None:
            reason = "PREPARED_MESSAGE_NOT_FOUND"
        elif copy.props.get(P.PGROUP) != txn.producer_group:
            reason = "PRODUCER_GROUP_WRONG"
        elif copy.queue_offset != tran_state_table_offset:
            reason = "TRAN_STATE_TABLE_OFFSET_WRONG"
        elif self.profile.immunity_reject_end and not from_check and self._past_immunity(copy):
            reason = "ILLEGAL_OPERATION"
        if reason is not None:
            request["reason"] = reason
            return reason
        try:
            if self.profile.transaction_model == MODEL_HALF_OP:
                if action == COMMIT:
                    self._write_commit(copy, from_check)
                self._delete_prepare(copy)
            else:
                self._write_end_record(copy, action, from_check, tran_state_table_offset)
        except BrokerDown:
            request["reason"] = "BROKER_CRASHED"
            return request["reason"]
        request["accepted"] = True
        request["reason"] = "OK"
        return "OK"

    def _past_immunity(self, copy: L.HalfCopy) -> bool:
        text = copy.props.get(P.CHECK_IMMUNITY_TIME_IN_SECONDS)
        if not text:
            return False
        timeout = self.profile.transactionTimeOut
        immunity = java_long(text)
        immunity = timeout if immunity == -1 else immunity * 1000
        return self.clock.now - copy.txn.born_timestamp > max(immunity, timeout)

    def _write_commit(self, copy: L.HalfCopy, from_check: bool) -> None:
        txn = copy.txn
        msg = self._message(txn.real_topic, txn.real_queue_id, txn.body, copy.props,
                            sys_flag=(copy.sys_flag & ~CL.TRANSACTION_MASK) | CL.TX_COMMIT, flag=txn.flag,
                            born_timestamp=txn.born_timestamp, born_host=txn.born_host,
                            prepared_offset=copy.commitlog_offset)
        result = self._put(msg, what="commit", txn=txn)
        txn.commit_records.append(self._record_dict(result, msg, from_check))
        self._commits_written += 1
        if self.retry_commit_every and self._commits_written % self.retry_commit_every == 0:
            # the real topic's consumer fails this message once: a retry copy that still says TRAN_MSG=true
            self.schedule(self.clock.now + 50, self.consumer_retry, self.retry_commit_group, msg,
                          result.physical_offset, internal=True)
        if self.crash_after_next_commit:
            self.crash_after_next_commit = False
            txn.lost_ops.append({"half_queue_offset": copy.queue_offset, "reason": "CRASH_AFTER_COMMIT"})
            txn.flags.add(L.OP_LOST_IN_CRASH)
            fault_id = self._fault(
                {
                    "fault": "CRASH_BETWEEN_COMMIT_AND_OP",
                    "file": f"commitlog/{result.file}",
                    "position": result.file_position,
                    "length": result.size,
                    "detail": "broker crashed after writing the commit record, before its op",
                    "expected_anomalies": [],
                    "transaction_key": txn.transaction_key,
                    "record": "commit",
                    "commitlog_offset": result.physical_offset,
                }
            )
            if fault_id:
                txn.faults.append(fault_id)
            self.crash("crash between commit and op")
            raise BrokerDown()

    @staticmethod
    def _record_dict(result: PutResult, msg: CL.Message, from_check: bool) -> dict:
        return {
            "commitlog_offset": result.physical_offset,
            "size": result.size,
            "queue_id": msg.queue_id,
            "queue_offset": result.queue_offset,
            "prepared_transaction_offset": msg.prepared_transaction_offset,
            "store_timestamp": msg.store_timestamp,
            "file": result.file,
            "file_position": result.file_position,
            "from_check": from_check,
            "present": True,
        }

    def _write_end_record(
        self, copy: L.HalfCopy, action: str, from_check: bool, tran_state_table_offset
    ) -> None:
        """3.x / 4.0-4.2: a COMMIT or ROLLBACK copy of the prepared record in the real topic."""
        txn = copy.txn
        body = txn.body if action == COMMIT else b""
        msg = self._message(txn.real_topic, txn.real_queue_id, body, copy.props,
                            sys_flag=(copy.sys_flag & ~CL.TRANSACTION_MASK) | _TX_TYPE[action], flag=txn.flag,
                            born_timestamp=txn.born_timestamp, born_host=txn.born_host,
                            prepared_offset=copy.commitlog_offset)
        result = self._put(msg, what=action.lower(), txn=txn, tran_state_table_offset=tran_state_table_offset,
                           producer_group=txn.producer_group)
        record = self._record_dict(result, msg, from_check)
        (txn.commit_records if action == COMMIT else txn.rollback_records).append(record)

    # ========================================================================================================
    # op messages
    # ========================================================================================================
    def _delete_prepare(self, copy: L.HalfCopy) -> None:
        if self.profile.op_body_format == OP_BODY_COMMA_BATCH:
            if not self._op_context_created:        # MessageQueueOpContext(lastWriteTimestamp = now)
                self._op_context_created = True
                self.op_last_write = self.clock.now
            text = f"{copy.queue_offset},"
            self.op_pending.append((text, copy))
            self.op_pending_chars += len(text)
            copy.txn.pending_op_offsets.add(copy.queue_offset)
            if self.op_pending_chars > self.profile.transactionOpMsgMaxSize:
                self._flush_ops(force=True)
            return
        self._write_op(str(copy.queue_offset), [copy])

    def _write_op(self, body_text: str, copies: list) -> None:
        self.ensure_topic(OP_TOPIC, 1)
        props = {P.TAGS: REMOVE_TAG, P.WAIT: "true"}      # new Message(opTopic, "d", body): TAGS then WAIT
        now = self._store_time()
        body = body_text.encode("ascii")
        msg = self._message(
            OP_TOPIC, 0, body, props, born_timestamp=now, born_host=self.store_host, capacity=16
        )
        result = self._put(msg, what="op", txn=copies[0].txn if copies else None)
        offsets = tuple(self._parse_op_body(body_text))
        op = OpRecord(result.queue_offset, offsets, now, result.physical_offset, result.size, body_text)
        self.ops[result.queue_offset] = op
        self.stats["ops_written"] += 1
        for copy in copies:
            copy.txn.op_records.append({
                "half_queue_offset": copy.queue_offset, "op_queue_offset": result.queue_offset,
                "op_commitlog_offset": result.physical_offset, "op_size": result.size, "file": result.file,
                "file_position": result.file_position, "body_offsets": len(offsets), "present": True})

    def _parse_op_body(self, text: str) -> list:
        if self.profile.op_body_format == OP_BODY_COMMA_BATCH:
            return [java_long(piece) for piece in text.split(",") if piece != ""]
        return [java_long(text)]

    def _flush_ops(self, force: bool = False) -> None:
        """TransactionalOpBatchService.batchSendOpMessage for the one half queue."""
        p = self.profile
        while self.op_pending:
            if not force and self.op_pending_chars < p.transactionOpMsgMaxSize and \
                    self.clock.now - self.op_last_write < p.transactionOpBatchInterval:
                return
            parts, copies, length = [], [], 0
            while self.op_pending and length < p.transactionOpMsgMaxSize:
                text, copy = self.op_pending.pop(0)
                parts.append(text)
                copies.append(copy)
                length += len(text)
            self.op_pending_chars -= length
            self.op_last_write = self.clock.now
            for copy in copies:
                copy.txn.pending_op_offsets.discard(copy.queue_offset)
            self._write_op("".join(parts), copies)
            force = force and bool(self.op_pending)

    def _op_batch_tick(self) -> None:
        if self.op_pending:
            self._flush_ops()
        self.schedule(
            self.clock.now + self.profile.transactionOpBatchInterval, self._op_batch_tick, internal=True
        )


__all__ = [
    "TransactionPath",
    "OpRecord",
    "java_long",
]
