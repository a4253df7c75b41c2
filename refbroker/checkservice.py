"""The check service of the reference broker (4.3+): the half-queue scan and the checks it sends.

Faithful to TransactionalMessageServiceImpl.check (4.9.7 / 5.3.3):
  halfOffset/opOffset from CID_RMQ_SYS_TRANS (min offset if absent); ops pulled 32 at a time into removeMap /
  opMsgMap; scan from halfOffset: resolved -> skip; needDiscard (TRANSACTION_CHECK_TIMES >=
  transactionCheckMax) or needSkip (born > fileReservedTime ago) -> TRANS_CHECK_MAX_TIME_TOPIC copy (4.6+) or
  log only (4.3-4.5); stored during this pass -> stop; CHECK_IMMUNITY_TIME_IN_SECONDS younger than immunity ->
  immunity copy with TRAN_PREPARED_QUEUE_OFFSET (or resolved through it); too young -> stop; otherwise (after
  all ops are pulled) re-put a copy with the incremented TRANSACTION_CHECK_TIMES and send the check for the
  copy.  Offsets committed: half = first offset not passed, op = contiguous run of done ops.  Two deliberate
  simplifications: a pass takes no simulated time (the 60 s MAX_PROCESS_TIME_LIMIT and 5.x's 1 s sleeps never
  trigger), and a scan that would spin on an exact "age == immunity" tie stops (the Java loop would spin until
  the clock moved on).

``CheckService`` is the part of ``refbroker.broker.Broker`` that runs the scan every transactionCheckInterval,
keeps the producer registry, sends CHECK_TRANSACTION_STATE to a connected producer of the group (also for the
3.x statetable timers) and turns the producer's answer into an EndTransaction.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from refbroker import ledger as L
from refbroker.events import BrokerDown
from refbroker.producer import CheckRequest, Producer
from refbroker.systopics import CHECK_GROUP, DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC
from refbroker.transaction import java_long
from txlog_io import properties as P
from txlog_io.msgid import offset_msg_id

OP_PULL_BATCH = 32
MAX_RETRY_COUNT_WHEN_HALF_NULL = 1


@dataclass
class _Pull:
    msgs: Optional[list]
    next_begin: int


class CheckService:
    """Broker mixin: TransactionalMessageServiceImpl.check, the producer registry and check delivery."""

    def _check_tick(self) -> None:
        self.check_pass()
        self.schedule(self.clock.now + self.profile.transactionCheckInterval, self._check_tick, internal=True)

    def _consume_offset(self, topic: str) -> int:
        offset = self.query_offset(topic, CHECK_GROUP, 0)
        return offset if offset != -1 else self.store.min_offset_in_queue(topic, 0)

    def _fill_op_remove_map(self, remove_map: dict, op_msg_map: dict, done_op: list, pull_offset: int,
                            mini_offset: int) -> _Pull:
        op_max = self.store.max_offset_in_queue(OP_TOPIC, 0)
        op_min = self.store.min_offset_in_queue(OP_TOPIC, 0)
        if pull_offset < op_min:                        # OFFSET_ILLEGAL: the checker jumps to the min offset
            self.commit_offset(OP_TOPIC, CHECK_GROUP, 0, op_min)
            return _Pull(None, op_min)
        msgs = [
            self.ops[q] for q in range(pull_offset, min(pull_offset + OP_PULL_BATCH, op_max)) if q in self.ops
        ]
        if not msgs:
            return _Pull(None, pull_offset)
        for op in msgs:
            if not op.body:
                done_op.append(op.queue_offset)
                continue
            kept = set()
            for h in op.offsets:
                if h < mini_offset:
                    continue
                remove_map[h] = op.queue_offset
                kept.add(h)
            if kept:
                op_msg_map[op.queue_offset] = kept
            else:
                done_op.append(op.queue_offset)
        return _Pull(msgs, msgs[-1].queue_offset + 1)

    def check_pass(self) -> None:
        """One run of TransactionalMessageServiceImpl.check for half queue 0."""
        if self.down or HALF_TOPIC not in self.topics:
            return
        p = self.profile
        self.stats["check_passes"] += 1
        start = self.clock.now
        timeout = p.transactionTimeOut
        half_offset = self._consume_offset(HALF_TOPIC)
        op_offset = self._consume_offset(OP_TOPIC)
        if half_offset < 0 or op_offset < 0:
            return
        remove_map, op_msg_map, done_op = {}, {}, []
        pull = self._fill_op_remove_map(remove_map, op_msg_map, done_op, op_offset, half_offset)
        null_count = 1
        empty_pulls = 0
        new_offset = i = half_offset
        half_max = self.store.max_offset_in_queue(HALF_TOPIC, 0)
        half_min = self.store.min_offset_in_queue(HALF_TOPIC, 0)
        try:
            while True:
                if i in remove_map:
                    op_qo = remove_map.pop(i)
                    pending = op_msg_map.get(op_qo)
                    if pending is not None:
                        pending.discard(i)
                        if not pending:
                            del op_msg_map[op_qo]
                            done_op.append(op_qo)
                    new_offset = i = i + 1
                    continue
                copy = self.half_by_qo.get(i) if half_min <= i < half_max else None
                if copy is None:
                    null_count += 1
                    if null_count - 1 > MAX_RETRY_COUNT_WHEN_HALF_NULL:
                        break
                    if i >= half_max:
                        break
                    i = new_offset = max(i + 1, half_min)
                    continue
                txn = copy.txn
                msg_props = dict(copy.props)
                times_text = msg_props.get(P.TRANSACTION_CHECK_TIMES)
                check_time = 1
                discard = False
                if times_text is not None:
                    check_time = java_long(times_text)
                    if check_time >= p.transactionCheckMax:
                        discard = True
                    else:
                        check_time += 1
                reason = "CHECK_MAX"
                if not discard:
                    msg_props[P.TRANSACTION_CHECK_TIMES] = str(check_time)
                    if self.clock.now - txn.born_timestamp > p.fileReservedTime * 3600 * 1000:
                        discard, reason = True, "FILE_RESERVED_TIME"
                if discard:
                    self._resolve_discard(copy, msg_props, reason)
                    new_offset = i = i + 1
                    continue
                if copy.store_timestamp >= start:
                    break
                age = self.clock.now - txn.born_timestamp
                immunity = timeout
                immunity_text = msg_props.get(P.CHECK_IMMUNITY_TIME_IN_SECONDS)
                if immunity_text is not None:
                    value = java_long(immunity_text)
                    immunity = timeout if value == -1 else value * 1000
                    if age < immunity:
                        if self._check_prepare_queue_offset(remove_map, done_op, copy, msg_props):
                            new_offset = i = i + 1
                            continue
                elif 0 <= age < immunity:
                    break
                op_msgs = pull.msgs
                need_check = ((op_msgs is None and age > immunity)
                              or (op_msgs is not None and op_msgs[-1].born_timestamp - start > timeout)
                              or age <= -1)
                if need_check:
                    new_copy = self._put_back_half(copy, msg_props, L.CHECK_COPY)
                    self._send_check(new_copy)
                    empty_pulls = 0
                else:
                    pull = self._fill_op_remove_map(
                        remove_map, op_msg_map, done_op, pull.next_begin, half_offset
                    )
                    if pull.msgs is None:
                        empty_pulls += 1
                        if empty_pulls > 1:
                            break        # the Java loop would spin until the clock moves (see module doc)
                    continue
                new_offset = i = i + 1
        except BrokerDown:
            return
        if new_offset != half_offset:
            self.commit_offset(HALF_TOPIC, CHECK_GROUP, 0, new_offset)
        done_op.sort()
        new_op = op_offset
        for value in done_op:
            if value == new_op:
                new_op += 1
            else:
                break
        if new_op != op_offset:
            self.commit_offset(OP_TOPIC, CHECK_GROUP, 0, new_op)

    def _check_prepare_queue_offset(self, remove_map: dict, done_op: list, copy: L.HalfCopy, msg_props: dict
                                    ) -> bool:
        text = msg_props.get(P.TRAN_PREPARED_QUEUE_OFFSET)
        if text is None:
            self._put_back_half(copy, msg_props, L.IMMUNITY_COPY)
            return True
        prepare_offset = java_long(text)
        if prepare_offset == -1:
            return False
        if prepare_offset in remove_map:
            done_op.append(remove_map.pop(prepare_offset))
            return True
        self._put_back_half(copy, msg_props, L.IMMUNITY_COPY)
        return True

    def _put_back_half(self, copy: L.HalfCopy, msg_props: dict, kind: str) -> L.HalfCopy:
        """renewHalfMessageInner / renewImmunityHalfMessageInner + putMessage."""
        txn = copy.txn
        props = dict(msg_props)
        if kind == L.IMMUNITY_COPY and P.TRAN_PREPARED_QUEUE_OFFSET not in props:
            props[P.TRAN_PREPARED_QUEUE_OFFSET] = str(copy.queue_offset)
        msg = self._message(HALF_TOPIC, 0, txn.body, props, sys_flag=copy.sys_flag, flag=txn.flag,
                            born_timestamp=txn.born_timestamp, born_host=txn.born_host)
        result = self._put(msg, what="half copy", txn=txn)
        new_copy = L.HalfCopy(
            txn,
            result.physical_offset,
            result.size,
            result.queue_offset,
            msg.store_timestamp,
            props,
            java_long(props.get(P.TRANSACTION_CHECK_TIMES, "-1")),
            kind,
            result.file,
            result.file_position,
            msg.sys_flag,
        )
        txn.copies.append(new_copy)
        self._register_copy(new_copy)
        self.stats["copies"] += 1
        return new_copy

    def _connected_producer(self, group_matches: Callable) -> Optional[Producer]:
        candidates = [
            pr for g, prs in self.producers.items() if group_matches(g) for pr in prs if pr.connected
        ]
        return self._pick_producer(candidates)

    def _group_producer(self, group: str) -> Optional[Producer]:
        """``_connected_producer`` for one group by name (the same candidates, the same random draw)."""
        return self._pick_producer([pr for pr in self.producers.get(group, ()) if pr.connected])

    def _pick_producer(self, candidates: list) -> Optional[Producer]:
        if not candidates:
            return None
        return candidates[self.rng.randrange(len(candidates))] if len(candidates) > 1 else candidates[0]

    def register_producer(self, producer: Producer) -> None:
        self.producers.setdefault(producer.group, []).append(producer)

    def _send_check(self, copy: L.HalfCopy, tran_state_table_offset: Optional[int] = None) -> None:
        txn = copy.txn
        group = txn.producer_group
        producer = self._group_producer(group)
        if producer is None:
            txn.checks_skipped += 1
            txn.flags.add(L.PRODUCER_UNREACHABLE)
            return
        txn.check_count += 1
        self.stats["checks"] += 1
        request = CheckRequest(
            txn,
            copy.commitlog_offset,
            copy.queue_offset if tran_state_table_offset is None else tran_state_table_offset,
            offset_msg_id(self.store_ip, self.store_port, copy.commitlog_offset),
            txn.uniq_key,
            txn.check_count,
        )
        self.schedule(
            self.clock.now + producer.check_latency_ms,
            self._producer_answers_check,
            producer,
            request,
            internal=True,
            txn=txn,
        )

    def _producer_answers_check(self, producer: Producer, request: CheckRequest) -> None:
        answer = producer.answer_check(request)
        if answer is None:
            return
        self.end_transaction(request.transaction, answer, from_check=True,
                             commitlog_offset=request.commitlog_offset,
                             tran_state_table_offset=request.tran_state_table_offset)

    def _resolve_discard(self, copy: L.HalfCopy, msg_props: dict, reason: str) -> None:
        txn = copy.txn
        self.stats["discards"] += 1
        entry = {
            "commitlog_offset": None,
            "size": None,
            "queue_offset": None,
            "check_times": java_long(msg_props.get(P.TRANSACTION_CHECK_TIMES, "-1")),
            "reason": reason,
            "recorded": False,
            "file": None,
            "file_position": None,
            "half_queue_offset": copy.queue_offset,
            "present": False,
            "store_timestamp": self.clock.now,
        }
        if self.profile.discard_topic:
            self.ensure_topic(DISCARD_TOPIC, 1)
            msg = self._message(DISCARD_TOPIC, 0, txn.body, msg_props, sys_flag=copy.sys_flag, flag=txn.flag,
                                born_timestamp=txn.born_timestamp, born_host=txn.born_host)
            result = self._put(msg, what="discard", txn=txn)
            entry.update(
                commitlog_offset=result.physical_offset,
                size=result.size,
                queue_offset=result.queue_offset,
                recorded=True,
                file=result.file,
                file_position=result.file_position,
                present=True,
                store_timestamp=msg.store_timestamp,
            )
        txn.discard_records.append(entry)


__all__ = [
    "CheckService",
]
