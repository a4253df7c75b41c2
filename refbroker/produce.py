"""The produce/put path of the reference broker: records built and put, ordinary, delayed and retry sends.

Properties are kept per message in insertion order and written in Java HashMap iteration order
(refbroker.javaorder), with the capacity each version uses, so the bytes match real records.

``ProducePath`` is the part of ``refbroker.broker.Broker`` that plays SendMessageProcessor for ordinary sends
(the client's properties and body compression included), CommitLog.putMessage's diversion of delayed messages
into SCHEDULE_TOPIC_XXXX and their delivery, sendMessageBack (consumer retries), and the put into
refbroker.store.MessageStore with its torn-write fault (a power loss in the middle of a record).
"""
from __future__ import annotations

from typing import Optional

from refbroker import ledger as L
from refbroker.events import BrokerDown
from refbroker.javaorder import hashmap_capacity, order_keys
from refbroker.producer import Producer
from refbroker.store import SCHEDULE_TOPIC, PutResult
from txlog_io import commitlog as CL
from txlog_io import compression as CMP
from txlog_io import properties as P
from txlog_io.errors import UsageError
from txlog_io.msgid import offset_msg_id

MAX_TOPIC_LENGTH = 127                       # TopicValidator.TOPIC_MAX_LENGTH
DELAY_LEVELS_MS = (1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, 420000, 480000,
                   540000, 600000, 1200000, 1800000, 3600000, 7200000)
_ORDER_CACHE: dict = {}      # (property names in insertion order, capacity) -> names in HashMap order


class ProducePath:
    """Broker mixin: building records, putting them into the store, ordinary / delayed / retry sends."""

    def _store_time(self) -> int:
        return max(self.clock.now, self.store.last_store_timestamp)

    def _ordered(self, props: dict, capacity: int) -> dict:
        names = tuple(props)
        cache_key = (names, capacity)
        keys = _ORDER_CACHE.get(cache_key)
        if keys is None:
            keys = order_keys(names, hashmap_capacity(len(names), capacity))
            if len(_ORDER_CACHE) < 65536:
                _ORDER_CACHE[cache_key] = keys
        return {k: props[k] for k in keys}

    def _message(
        self,
        topic: str,
        queue_id: int,
        body: bytes,
        props: dict,
        *,
        sys_flag: int = 0,
        flag: int = 0,
        born_timestamp: int,
        born_host: str,
        reconsume_times: int = 0,
        prepared_offset: int = 0,
        capacity: Optional[int] = None,
        body_crc: Optional[int] = None,
    ) -> CL.Message:
        p = self.profile
        ordered = self._ordered(props, capacity or p.properties_map_capacity)
        return CL.Message(
            topic=topic,
            body=body,
            properties=ordered,
            queue_id=queue_id,
            flag=flag,
            sys_flag=sys_flag,
            born_timestamp=born_timestamp,
            born_host=born_host,
            store_timestamp=self._store_time(),
            store_host=self.store_host,
            reconsume_times=reconsume_times,
            prepared_transaction_offset=prepared_offset,
            magic_version=None if p.magic_v2 else 1,
            properties_trailing_separator=p.properties_trailing_separator,
            body_crc=body_crc,
        )

    def _put(self, msg: CL.Message, *, what: str, txn: Optional[L.Transaction] = None,
             tran_state_table_offset: int = 0, producer_group: Optional[str] = None,
             cq_tags_code: Optional[int] = None) -> PutResult:
        if self.down:
            raise BrokerDown()
        torn_keep = None
        if self.tear_next_put is not None:
            torn_keep = self._torn_length(msg, self.tear_next_put)
            self.tear_next_put = None
        result = self.store.put(msg, tran_state_table_offset=tran_state_table_offset,
                                producer_group=producer_group, torn_keep=torn_keep, cq_tags_code=cq_tags_code)
        if result.torn:
            if txn is not None:
                txn.flags.add(L.TORN_RECORD)
            fault_id = self._fault(
                {
                    "fault": "TORN_TAIL",
                    "file": f"commitlog/{result.file}",
                    "position": result.file_position,
                    "length": torn_keep,
                    "detail": f"power loss while writing a {result.size}-byte {what} record at physical "
                    f"offset {result.physical_offset}: only {torn_keep} bytes reached the disk",
                    "expected_anomalies": [
                        "TRUNCATED_RECORD",
                        "BAD_TOTAL_SIZE",
                        "BODY_CRC_MISMATCH",
                        "GARBAGE_AFTER_END",
                        "BAD_MAGIC",
                    ],
                    "transaction_key": txn.transaction_key if txn else None,
                    "record": what,
                    "commitlog_offset": result.physical_offset,
                }
            )
            if txn is not None and fault_id:
                txn.faults.append(fault_id)
            self.crash("torn write")
            raise BrokerDown()
        return result

    @staticmethod
    def _torn_length(msg: CL.Message, fraction: float) -> int:
        """How much of a record a power loss leaves: a cut inside the fixed header or the body, so that the
        zeros
        after it break TOTALSIZE or BODYCRC and RocketMQ's recovery truncates the record.  (A cut inside the
        properties would leave a record that checkMessageAndReturnSize accepts with truncated properties; the
        reference broker does not produce that case.)"""
        size = CL.record_size(msg)
        topic_width = 2 if msg.resolved_magic_version() == 2 else 1
        body_end = size - topic_width - len(msg.topic.encode("utf-8")) - 2 - len(msg.properties_bytes())
        low, high = 9, max(10, body_end - 1)
        return min(size - 1, low + int((high - low) * fraction))

    def _client_props(self, tags: Optional[str], keys: Optional[str], user_props: Optional[dict],
                      wait: bool) -> dict:
        props = {}
        if tags:
            props[P.TAGS] = tags
        if keys:
            props[P.KEYS] = keys
        if wait:
            props[P.WAIT] = "true"
        if user_props:
            props.update(user_props)
        return props

    def _client_send_props(self, props: dict, producer: Producer, born: int) -> None:
        p = self.profile
        if p.uniq_key:
            props[P.UNIQ_KEY] = producer.next_uniq_key(born)
        if p.client_region_trace:
            props["MSG_REGION"] = "DefaultRegion"
            props["TRACE_ON"] = "true"

    def _compress(self, body: bytes, compression: Optional[str]) -> tuple:
        """-> (stored body, sys_flag bits) as the producer writes them for this profile."""
        if not compression or compression == CMP.NONE:
            return body, 0
        if compression not in self.profile.compression_types:
            raise UsageError(f"profile {self.profile.name} cannot write {compression} bodies")
        stored = CMP.compress(body, compression)
        bits = CMP.sys_flag_bits(compression) if self.profile.compression_type_bits else CMP.COMPRESSED_FLAG
        return stored, bits

    def send_message(
        self,
        producer: Producer,
        topic: str,
        queue_id: int,
        body: bytes,
        *,
        tags=None,
        keys=None,
        user_props: Optional[dict] = None,
        compression: Optional[str] = None,
        flag: int = 0,
        stored_body: Optional[tuple] = None,
        born_delay_ms: int = 1,
        delay_level: Optional[int] = None,
    ) -> Optional[PutResult]:
        """An ordinary (non-transactional) send.  ``stored_body`` = precomputed (stored bytes, sys_flag bits,
        crc) to skip compression and CRC work for reused bodies.  ``delay_level``: a delayed message, stored
        in
        SCHEDULE_TOPIC_XXXX (queue level-1, REAL_TOPIC/REAL_QID) and re-put into ``topic`` when due."""
        if self.down:
            self.stats["send_failed"] += 1
            return None
        if len(topic) > MAX_TOPIC_LENGTH:
            self.stats["rejected_long_topic"] += 1     # client and broker validation reject long plain topics
            return None
        self.ensure_topic(topic, max(queue_id + 1, self.topics.get(topic, 0)))
        born = self.clock.now - born_delay_ms
        props = self._client_props(tags, keys, user_props, self.profile.wait_on_ordinary)
        if delay_level:
            props[P.DELAY] = str(delay_level)
            props.setdefault(P.WAIT, "true")          # 4.9.8: WAIT follows DELAY in its bucket (observed)
        self._client_send_props(props, producer, born)
        if self.profile.writes_cluster_property:
            props[P.CLUSTER] = self.cluster
        if stored_body is not None:
            data, bits, crc = stored_body
        else:
            data, bits = self._compress(body, compression)
            crc = None
        target_topic, target_queue, deliver_at = topic, queue_id, None
        if delay_level:                                 # CommitLog.putMessage diverts delayed messages
            self.ensure_topic(SCHEDULE_TOPIC, 18)
            props[P.REAL_TOPIC] = topic
            props[P.REAL_QID] = str(queue_id)
            target_topic, target_queue = SCHEDULE_TOPIC, delay_level - 1
        msg = self._message(
            target_topic,
            target_queue,
            data,
            props,
            sys_flag=bits,
            flag=flag,
            born_timestamp=born,
            born_host=producer.born_host,
            body_crc=crc,
        )
        if delay_level:
            deliver_at = msg.store_timestamp + DELAY_LEVELS_MS[delay_level - 1]
        try:
            result = self._put(msg, what="ordinary", cq_tags_code=deliver_at)
        except BrokerDown:
            self.stats["send_failed"] += 1
            return None
        self.last_message = msg
        self.stats["ordinary"] += 1
        if delay_level:
            self.schedule(
                deliver_at, self._deliver_scheduled, msg, delay_level, result.queue_offset, internal=True
            )
        self._sample_ordinary(result, topic)
        return result

    def _sample_ordinary(self, result: PutResult, topic: str) -> None:
        """Keep a few ordinary records as fault targets: every 97th, the newest 64."""
        self._ordinary_seen += 1
        if self._ordinary_seen % 97 != 1:
            return
        self.ordinary_samples.append(
            {
                "commitlog_offset": result.physical_offset,
                "size": result.size,
                "file": result.file,
                "file_position": result.file_position,
                "topic": topic,
            }
        )
        if len(self.ordinary_samples) > 64:
            del self.ordinary_samples[0]

    def consumer_retry(self, group: str, original: CL.Message, original_offset: int,
                       delay_level: int = 3) -> Optional[PutResult]:
        """sendMessageBack of a consumed message: a SCHEDULE_TOPIC_XXXX record now, the %RETRY% record at
        delivery.

        With a long group the retry topic passes 127 characters: 5.1+ stores it with magic V2 (the only way V2
        appears in practice, §11.1); older profiles cannot represent it, so they refuse (UsageError)."""
        retry_topic = f"%RETRY%{group}"
        if len(retry_topic) > MAX_TOPIC_LENGTH and not self.profile.magic_v2:
            raise UsageError(
                f"profile {self.profile.name} cannot store the {len(retry_topic)}-char topic {retry_topic}"
            )
        if self.down:
            return None
        self.ensure_topic(retry_topic, 1)
        self.ensure_topic(SCHEDULE_TOPIC, 18)
        props = dict(original.properties)
        props["RETRY_TOPIC"] = original.topic
        props["ORIGIN_MESSAGE_ID"] = offset_msg_id(self.store_ip, self.store_port, original_offset)
        props[P.WAIT] = "false"
        props[P.DELAY] = str(delay_level)
        props["REAL_TOPIC"] = retry_topic
        props["REAL_QID"] = "0"
        msg = self._message(SCHEDULE_TOPIC, delay_level - 1, original.body, props, sys_flag=original.sys_flag,
                            flag=original.flag, born_timestamp=original.born_timestamp,
                            born_host=original.born_host, reconsume_times=original.reconsume_times + 1)
        deliver_at = msg.store_timestamp + DELAY_LEVELS_MS[delay_level - 1]
        try:
            result = self._put(msg, what="schedule", cq_tags_code=deliver_at)
        except BrokerDown:
            return None
        self.stats["retries"] += 1
        self.schedule(
            deliver_at, self._deliver_scheduled, msg, delay_level, result.queue_offset, internal=True
        )
        return result

    def _deliver_scheduled(self, scheduled: CL.Message, delay_level: int, schedule_offset: int) -> None:
        props = dict(scheduled.properties)
        msg = self._message(props["REAL_TOPIC"], int(props["REAL_QID"]), scheduled.body, props,
                            sys_flag=scheduled.sys_flag, flag=scheduled.flag,
                            born_timestamp=scheduled.born_timestamp, born_host=scheduled.born_host,
                            reconsume_times=scheduled.reconsume_times)
        self._put(msg, what="retry")
        self.delay_offsets[delay_level] = schedule_offset + 1


__all__ = [
    "ProducePath",
    "MAX_TOPIC_LENGTH",
    "DELAY_LEVELS_MS",
]
