"""The reference broker's transaction semantics on an injectable clock (discrete-event simulation).

The broker plays RocketMQ's SendMessageProcessor, EndTransactionProcessor, TransactionalMessageBridge,
TransactionalMessageServiceImpl (check service), TransactionalOpBatchService (5.1+), ConsumerOffsetManager
and, for 3.x, TransactionStateService with its check timers — against refbroker.store.MessageStore, which
writes the files. Reference sections (../shared/rocketmq-store-format.md): 7.2 half message, 7.3
EndTransaction checks, 7.4 commit path, 7.5 op messages, 7.6 check service, 7.8 4.0-4.2, 8 3.x, 10 edge cases,
11 observations.

Time is simulated: ``Clock.now`` is epoch ms; everything that happens later (producer answers to checks, the
periodic services, the workload's own actions) is an event in a heap, run in (time, sequence) order by
``run_until``.  Broker-internal events carry the broker's ``epoch`` and are dropped after a crash (the process
that scheduled them is gone); producer actions survive a crash (a later EndTransaction meets the restarted
broker).

Producers are objects with a ``check_listener(CheckRequest) -> "COMMIT" | "ROLLBACK" | "UNKNOWN" | None``
(None = no answer at all) and a ``connected`` flag (unreachable producers get no checks; RocketMQ silently
skips them).

Properties are kept per message in insertion order and written in Java HashMap iteration order
(refbroker.javaorder), with the capacity each version uses, so the bytes match real records.

Check service (4.3+), faithful to TransactionalMessageServiceImpl.check (4.9.7 / 5.3.3):
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
"""
from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

from refbroker import ledger as L
from refbroker.javaorder import hashmap_capacity, order_keys
from refbroker.profiles import MODEL_HALF_OP, MODEL_STATETABLE, OP_BODY_COMMA_BATCH, Profile
from refbroker.store import SCHEDULE_TOPIC, MessageStore, PutResult
from txlog_io import commitlog as CL
from txlog_io import compression as CMP
from txlog_io import properties as P
from txlog_io.consumequeue import STATE_COMMIT, STATE_PREPARED, STATE_ROLLBACK
from txlog_io.errors import UsageError
from txlog_io.msgid import create_uniq_key, offset_msg_id, parse_host

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"
OP_PULL_BATCH = 32
MAX_RETRY_COUNT_WHEN_HALF_NULL = 1
STATETABLE_FIRST_CHECK_DELAY = 60_000       # 3.1.4 TransactionStateService: first timer run, hard-coded
MAX_TOPIC_LENGTH = 127                       # TopicValidator.TOPIC_MAX_LENGTH
DELAY_LEVELS_MS = (1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, 420000, 480000,
                   540000, 600000, 1200000, 1800000, 3600000, 7200000)

COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"
_ORDER_CACHE: dict = {}      # (property names in insertion order, capacity) -> names in HashMap order
_TX_TYPE = {COMMIT: CL.TX_COMMIT, ROLLBACK: CL.TX_ROLLBACK}


class BrokerDown(Exception):
    """Raised to unwind an operation interrupted by a crash the workload asked for."""


@dataclass
class CheckRequest:
    """CHECK_TRANSACTION_STATE as the producer receives it."""

    transaction: L.Transaction
    commitlog_offset: int
    tran_state_table_offset: int
    msg_id: str
    transaction_id: Optional[str]
    check_number: int                 # 1 for the first check delivered for the transaction


class Producer:
    """A (transactional) producer client: identity for UNIQ_KEY and born host, and the check callback."""

    def __init__(
        self,
        group: str,
        *,
        client_ip: str = "127.0.0.1",
        port: int = 50000,
        pid: int = 4242,
        class_loader_hash: int = 0x2B276C15,
        check_listener: Optional[Callable] = None,
        check_latency_ms: int = 15,
        connected: bool = True,
        same_jvm_as: Optional["Producer"] = None,
    ):
        """``same_jvm_as``: another producer in the same client JVM; they share MessageClientIDSetter's static
        counter (and pid / class loader), so their UNIQ_KEYs never collide.  Producers in different JVMs must
        differ in ip, pid or class_loader_hash, as real ones do."""
        self.group = group
        self.client_ip = client_ip
        self.born_host = f"[{client_ip}]:{port}" if ":" in client_ip else f"{client_ip}:{port}"
        self.ip_bytes = parse_host(self.born_host)[0]
        self.pid = same_jvm_as.pid if same_jvm_as else pid
        self.class_loader_hash = same_jvm_as.class_loader_hash if same_jvm_as else class_loader_hash
        self._counter = same_jvm_as._counter if same_jvm_as else [0]
        self.check_listener = check_listener
        self.check_latency_ms = check_latency_ms
        self.connected = connected

    def next_uniq_key(self, now_ms: int) -> str:
        counter = self._counter
        key = create_uniq_key(self.ip_bytes, self.pid, self.class_loader_hash, now_ms, counter[0])
        counter[0] = (counter[0] + 1) & 0xFFFF
        return key

    def answer_check(self, request: CheckRequest) -> Optional[str]:
        if self.check_listener is None:
            return UNKNOWN
        return self.check_listener(request)


class Clock:
    """Injectable simulated clock (epoch ms)."""

    def __init__(self, start_ms: int):
        self.now = start_ms


class OpRecord:
    __slots__ = ("queue_offset", "offsets", "born_timestamp", "commitlog_offset", "size", "body")

    def __init__(self, queue_offset, offsets, born_timestamp, commitlog_offset, size, body):
        self.queue_offset = queue_offset
        self.offsets = offsets
        self.born_timestamp = born_timestamp
        self.commitlog_offset = commitlog_offset
        self.size = size
        self.body = body


@dataclass
class _Pull:
    msgs: Optional[list]
    next_begin: int


@dataclass(order=True)
class _Event:
    time: int
    seq: int
    action: Callable = field(compare=False)
    args: tuple = field(compare=False, default=())
    epoch: Optional[int] = field(compare=False, default=None)
    txn: Optional[L.Transaction] = field(compare=False, default=None)


def java_long(text) -> int:
    """TransactionalMessageServiceImpl.getLong: Long.parseLong or -1."""
    try:
        return int(str(text).strip()) if str(text).strip().lstrip("-").isdigit() else -1
    except ValueError:
        return -1


class Broker:
    """One broker (master) writing one store.  See the module docstring for the model."""

    def __init__(self, store_dir, profile: Profile, *, start_ms: int = 1_795_300_000_000, seed: int = 0,
                 store_host: str = "127.0.0.1:10911", broker_name: str = "broker-a",
                 cluster: str = "DefaultCluster", commitlog_file_size: Optional[int] = None,
                 consumequeue_file_size: Optional[int] = None, statetable_file_size: Optional[int] = None,
                 redolog_file_size: Optional[int] = None, ledger: Optional[L.LedgerWriter] = None,
                 on_fault: Optional[Callable] = None):
        self.profile = profile
        self.clock = Clock(start_ms)
        self.rng = random.Random(seed ^ 0x5EED)
        self.store_host = store_host
        self.store_ip, self.store_port = parse_host(store_host)
        self.broker_name = broker_name
        self.cluster = cluster
        self.store = MessageStore(
            store_dir,
            profile,
            commitlog_file_size=commitlog_file_size,
            consumequeue_file_size=consumequeue_file_size,
            statetable_file_size=statetable_file_size,
            redolog_file_size=redolog_file_size,
        )
        self.store.statetable_listener = self._on_new_statetable_file
        self.ledger = ledger
        self.on_fault = on_fault
        self.events: list = []
        self._seq = 0
        self.epoch = 0
        self.down = True
        self.started_at = start_ms
        self.topics: dict = {}                 # topic -> queue count (TopicConfigManager)
        self.topics_version = 0
        self.topics_timestamp = start_ms
        self.offsets: dict = {}                # (topic, group) -> {queue_id: offset}   in memory
        self.persisted_offsets: dict = {}      # what consumerOffset.json holds
        self.consumer_groups: dict = {}        # (topic, group) -> lag generator for simulated consumers
        self.delay_offsets: dict = {}          # delay level -> delivered offset
        self.producers: dict = {}              # group -> [Producer]
        self.transactions: dict = {}           # id(txn) -> txn  (active, not yet in the ledger)
        self.half_by_qo: dict = {}             # half queue offset -> HalfCopy   (active transactions)
        self.half_by_offset: dict = {}         # CommitLog offset -> HalfCopy   (active transactions)
        self.ops: dict = {}                    # op queue offset -> OpRecord
        self.op_pending: list = []             # 5.1+: [(text, HalfCopy)] not yet written
        self.op_pending_chars = 0
        self.op_last_write = start_ms
        self._op_context_created = False
        self.crash_after_next_commit = False   # crash between the commit record and its op
        self.tear_next_put: Optional[float] = None
        self.statetable_timers: dict = {}      # 3.x: file number -> active
        self.ordinary_samples: list = []       # reservoir of ordinary records (fault targets)
        self._ordinary_seen = 0
        self.stats = {"ordinary": 0, "transactions": 0, "checks": 0, "check_passes": 0, "crashes": 0,
                      "restarts": 0, "send_failed": 0, "ops_written": 0, "discards": 0, "copies": 0,
                      "retries": 0, "rejected_long_topic": 0}
        self.finalized = 0
        self.last_message: Optional[CL.Message] = None   # the last ordinary message written (retry source)
        self._lost_dispatch: list = []
        self._lag_fault: Optional[dict] = None
        self._deleted_queues: list = []
        self.retry_commit_every = 0                      # a consumer retry for every n-th commit (0: none)
        self.retry_commit_group = "CID_ORDERS"
        self._commits_written = 0

    # ========================================================================================================
    # event loop
    # ========================================================================================================
    @property
    def now(self) -> int:
        return self.clock.now

    def schedule(self, time_ms: int, action: Callable, *args, internal: bool = False,
                 txn: Optional[L.Transaction] = None) -> None:
        self._seq += 1
        if txn is not None:
            txn.pending_events += 1
        heapq.heappush(self.events, _Event(max(time_ms, self.clock.now), self._seq, action, args,
                                           self.epoch if internal else None, txn))

    def run_until(self, time_ms: int) -> None:
        events = self.events
        while events and events[0].time <= time_ms:
            ev = heapq.heappop(events)
            if ev.time > self.clock.now:
                self.clock.now = ev.time
            if ev.txn is not None:
                ev.txn.pending_events -= 1
            if ev.epoch is not None and ev.epoch != self.epoch:
                continue
            try:
                ev.action(*ev.args)
            except BrokerDown:
                pass
        if time_ms > self.clock.now:
            self.clock.now = time_ms

    def run_all(self, limit_ms: Optional[int] = None) -> None:
        """Run until only periodic broker services are left (or until limit_ms)."""
        while self.events:
            if limit_ms is not None and self.events[0].time > limit_ms:
                break
            if all(ev.epoch is not None for ev in self.events) and not self._has_pending_transactions():
                break
            self.run_until(self.events[0].time)

    def _has_pending_transactions(self) -> bool:
        return any(t.pending_events for t in self.transactions.values())

    def _fault(self, fault: dict) -> Optional[str]:
        """Report an in-simulation fault; returns its id (None without a collector)."""
        return self.on_fault(fault) if self.on_fault is not None else None

    def _fault_record(self, fault: dict) -> dict:
        self._fault(fault)
        return fault

    def _store_time(self) -> int:
        return max(self.clock.now, self.store.last_store_timestamp)

    # ========================================================================================================
    # lifecycle
    # ========================================================================================================
    def start(self) -> None:
        self.store.start()
        self.down = False
        self.epoch += 1
        self._start_services()
        self._persist_topics()

    def _start_services(self) -> None:
        p, now = self.profile, self.clock.now
        self.schedule(now + p.flushConsumerOffsetInterval, self._persist_tick, internal=True)
        if p.transaction_model == MODEL_HALF_OP:
            self.schedule(now + p.transactionCheckInterval, self._check_tick, internal=True)
            if p.op_body_format == OP_BODY_COMMA_BATCH:
                self.schedule(now + p.transactionOpBatchInterval, self._op_batch_tick, internal=True)
        if p.transaction_model == MODEL_STATETABLE and self.store.statetable is not None:
            files = (len(self.store.statetable.units) + self.store.statetable.units_per_file - 1) \
                // self.store.statetable.units_per_file
            self.statetable_timers = {}
            for number in range(files):
                self._on_new_statetable_file(number)

    def shutdown(self, grace_ms: int = 0) -> None:
        """Clean shutdown: optionally keep the services running for grace_ms (the check service keeps working
        while producers are gone), flush the op batch, persist offsets/topics, checkpoint, remove abort."""
        if self.down:
            raise UsageError("broker is not running")
        if grace_ms:
            self.run_until(self.clock.now + grace_ms)
            if self.down:
                return                              # it crashed during the grace period
        if self.op_pending:
            try:
                self._flush_ops(force=True)
            except BrokerDown:
                return                              # a torn write while flushing: the broker is down
        self.store.dispatch_all()
        self._persist_offsets(force=True)          # BrokerController.shutdown persists every config once more
        self._persist_topics(force=True)
        self._persist_delay_offsets(force=True)
        self.store.write_checkpoint()
        self.store.shutdown()
        self.down = True
        self.epoch += 1

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

    def switch_profile(self, profile: Profile) -> None:
        """Upgrade in place: only while stopped, only between half/op profiles."""
        if not self.down:
            raise UsageError("switch_profile needs a stopped broker")
        if profile.transaction_model != self.profile.transaction_model:
            raise UsageError("an upgrade cannot change the transaction model")
        self.profile = profile
        self.store.profile = profile

    # ========================================================================================================
    # topics / offsets / config files
    # ========================================================================================================
    def ensure_topic(self, topic: str, queues: int = 1) -> None:
        if topic not in self.topics:
            self.topics[topic] = queues
            self.topics_version += 1
            self.topics_timestamp = self.clock.now
            if not self.down:
                self._persist_topics()

    def _topic_config(self, name: str, queues: int, perm: int = 6) -> dict:
        p = self.profile
        entry = {}
        if p.topic_config_attributes:
            entry["attributes"] = {}
        if p.topic_config_extra_fields:
            entry["order"] = False
        entry["perm"] = perm
        entry["readQueueNums"] = queues
        entry["topicFilterType"] = "SINGLE_TAG"
        entry["topicName"] = name
        if p.topic_config_extra_fields:
            entry["topicSysFlag"] = 0
        entry["writeQueueNums"] = queues
        return entry

    def _data_version(self, counter: int, timestamp: int) -> dict:
        p = self.profile
        version = {"counter": counter}
        if p.data_version_state_version:
            version["stateVersion"] = 0
        version[p.data_version_timestamp_key] = timestamp
        return version

    def _persist_topics(self, force: bool = False) -> None:
        from refbroker.javaorder import concurrent_hashmap_order

        p = self.profile
        table = {}
        defaults = [("SELF_TEST_TOPIC", 1, 6), (self.cluster, 16, 7), (self.broker_name, 1, 7),
                    ("BenchmarkTest", 1024, 6), ("OFFSET_MOVED_EVENT", 1, 6)]
        if p.name != "3.x":
            defaults += [("TBW102", 8, 7), ("SCHEDULE_TOPIC_XXXX", 18, 6)]
        if p.writes_cluster_property:
            defaults.append((f"{self.cluster}_REPLY_TOPIC", 1, 6))
        if p.persists_op_topic_config:
            defaults += [(HALF_TOPIC, 1, 6), (OP_TOPIC, 1, 6), (f"rmq_sys_REVIVE_LOG_{self.cluster}", 8, 6),
                         (f"rmq_sys_SYNC_BROKER_MEMBER_{self.broker_name}", 1, 1)]
        for name, queues, perm in defaults:
            table[name] = self._topic_config(name, queues, perm)
        for name, queues in self.topics.items():
            if name == OP_TOPIC and not p.persists_op_topic_config:
                continue       # observed: 4.9.8 never persists the op topic
            if name not in table:
                table[name] = self._topic_config(name, queues)
        obj = {"dataVersion": self._data_version(self.topics_version, self.topics_timestamp),
               "topicConfigTable": concurrent_hashmap_order(table, 1024)}
        self.store.write_config("topics.json", obj, force=force)

    def commit_offset(self, topic: str, group: str, queue_id: int, offset: int) -> None:
        self.offsets.setdefault((topic, group), {})[queue_id] = offset

    def query_offset(self, topic: str, group: str, queue_id: int) -> int:
        return self.offsets.get((topic, group), {}).get(queue_id, -1)

    def register_consumer(self, topic: str, group: str, lag: int = 0) -> None:
        """A simulated push consumer that keeps ``lag`` messages behind the queue max (never beyond it)."""
        self.consumer_groups[(topic, group)] = lag

    def _advance_consumers(self) -> None:
        for (topic, group), lag in self.consumer_groups.items():
            queues = self.topics.get(topic, 0)
            for qid in range(queues):
                max_offset = self.store.max_offset_in_queue(topic, qid)
                if max_offset == 0 and (topic, qid) not in self.store.queues:
                    continue
                current = self.query_offset(topic, group, qid)
                target = max(0, max_offset - (self.rng.randint(0, lag) if lag else 0))
                if target > current:
                    self.commit_offset(topic, group, qid, target)

    def _persist_offsets(self, force: bool = False) -> None:
        from refbroker.javaorder import concurrent_hashmap_order, hashmap_order

        self._advance_consumers()
        self.persisted_offsets = {k: dict(v) for k, v in self.offsets.items()}
        table = {f"{topic}@{group}": dict(sorted(queues.items()))
                 for (topic, group), queues in self.offsets.items()}
        table = concurrent_hashmap_order(table, 512)
        if self.profile.consumer_offset_data_version:
            group_topics: dict = {}
            for topic, group in self.offsets:
                group_topics.setdefault(group, []).append(topic)
            group_topics = {g: order_keys(ts, hashmap_capacity(len(ts))) for g, ts in group_topics.items()}
            obj = {"dataVersion": self._data_version(0, self.started_at),
                   "groupTopicMap": hashmap_order(group_topics),
                   "offsetTable": table}
        else:
            obj = {"offsetTable": table}
        self.store.write_config("consumerOffset.json", obj, force=force)

    def _persist_delay_offsets(self, force: bool = False) -> None:
        obj = {"offsetTable": dict(sorted(self.delay_offsets.items()))}
        if self.profile.consumer_offset_data_version:
            obj = {"dataVersion": self._data_version(0, self.started_at), **obj}
        self.store.write_config("delayOffset.json", obj, force=force)

    def _persist_tick(self) -> None:
        self._persist_offsets()
        self._persist_delay_offsets()
        self.store.write_checkpoint()
        self._finalize_ready()
        self.schedule(
            self.clock.now + self.profile.flushConsumerOffsetInterval, self._persist_tick, internal=True
        )

    # ========================================================================================================
    # messages
    # ========================================================================================================
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

    # ========================================================================================================
    # check service (4.3+)
    # ========================================================================================================
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
        if not candidates:
            return None
        return candidates[self.rng.randrange(len(candidates))] if len(candidates) > 1 else candidates[0]

    def register_producer(self, producer: Producer) -> None:
        self.producers.setdefault(producer.group, []).append(producer)

    def _send_check(self, copy: L.HalfCopy, tran_state_table_offset: Optional[int] = None) -> None:
        txn = copy.txn
        group = txn.producer_group
        producer = self._connected_producer(lambda g: g == group)
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

    # ========================================================================================================
    # 3.x: statetable timers and rebuild
    # ========================================================================================================
    def _on_new_statetable_file(self, number: int) -> None:
        if number in self.statetable_timers:
            return
        self.statetable_timers[number] = True
        self.schedule(self.clock.now + STATETABLE_FIRST_CHECK_DELAY, self._statetable_timer, number,
                      internal=True)

    def _statetable_timer(self, number: int) -> None:
        st = self.store.statetable
        per_file = st.units_per_file
        units = st.units[number * per_file:(number + 1) * per_file]
        prepared_seen = False
        for offset_in_file, unit in enumerate(units):
            if unit[4] != STATE_PREPARED:
                continue
            prepared_seen = True
            self._goto_check(unit[3], number * per_file + offset_in_file, unit[0])
        if not prepared_seen and len(units) == per_file:
            self.statetable_timers.pop(number, None)
            return
        self.schedule(self.clock.now + self.profile.transactionCheckInterval, self._statetable_timer, number,
                      internal=True)

    def _goto_check(self, group_hash: int, index: int, commitlog_offset: int) -> None:
        copy = self.half_by_offset.get(commitlog_offset)
        producer = self._connected_producer(lambda g: P.java_string_hash(g) == group_hash)
        if copy is None:
            return
        if producer is None:
            copy.txn.checks_skipped += 1
            copy.txn.flags.add(L.PRODUCER_UNREACHABLE)
            return
        self._send_check(copy, tran_state_table_offset=index)

    def _recreate_state_table(self) -> None:
        """TransactionStateService.recreateStateTable, including the 3.1.4 index/byte mix-up (§11.6)."""
        st, units = self.store.statetable, self.store.redolog_units
        st.delete_all()
        file_size = self.store.redolog_file_size
        unit = 20
        written_bytes = len(units) * unit
        prepared = set()
        process = self.store.redolog.min_index
        while True:
            byte_offset = process * unit
            file_start = byte_offset - byte_offset % file_size
            read_position = min(file_size, written_bytes - file_start)
            pos = byte_offset - file_start
            if file_start >= written_bytes or pos >= read_position:
                break
            for off, _size, tags in units[byte_offset // unit:(file_start + read_position) // unit]:
                if tags == -1:
                    prepared.add(off)
                else:
                    prepared.discard(tags)
            process += read_position - pos        # bytes added to a unit index: the 3.1.4 bug
        for offset in sorted(prepared):
            copy = self.half_by_offset.get(offset)
            if copy is None:
                continue
            st.append(
                offset, copy.size, copy.store_timestamp // 1000, P.java_string_hash(copy.txn.producer_group)
            )
        self.store.tran_state_table_offset = len(st.units)
        self._fault({"fault": "STATETABLE_REBUILT", "file": "transaction/statetable", "position": 0,
                     "length": len(st.units) * st.UNIT,
                     "detail": f"abnormal restart rebuilt the statetable from the redolog: {len(st.units)} "
                               f"PREPARED units (3.1.4 reads only the first redolog file)",
                     "expected_anomalies": []})

    # ========================================================================================================
    # ledger
    # ========================================================================================================
    def _finalize_ready(self) -> None:
        if self.profile.transaction_model == MODEL_STATETABLE:
            return          # 3.x: the statetable can resurrect anything until the end (see ledger notes)
        persisted_half = self.persisted_offsets.get((HALF_TOPIC, CHECK_GROUP), {}).get(0, -1)
        done = []
        for key, txn in self.transactions.items():
            if txn.pending_events or not txn.local_done or txn.pending_op_offsets:
                continue
            if self.profile.transaction_model == MODEL_HALF_OP and \
                    any(c.queue_offset >= persisted_half for c in txn.copies):
                continue
            done.append(key)
        for key in done:
            self._finalize(self.transactions.pop(key))

    def _finalize(self, txn: L.Transaction) -> None:
        for copy in txn.copies:
            self.half_by_offset.pop(copy.commitlog_offset, None)
            if self.half_by_qo.get(copy.queue_offset) is copy:
                del self.half_by_qo[copy.queue_offset]
        if self.profile.transaction_model == MODEL_HALF_OP:
            low = self.persisted_offsets.get((OP_TOPIC, CHECK_GROUP), {}).get(0, 0)
            for q in [q for q in self.ops if q < low]:
                del self.ops[q]
        self.finalized += 1
        if self.ledger is not None:
            self.ledger.write(txn.to_dict())

    def finalize_all(self) -> None:
        """End of generation: every transaction still in memory goes to the ledger."""
        if self.store.statetable is not None:
            by_offset = {unit[0]: (index, unit[4]) for index, unit in enumerate(self.store.statetable.units)}
            for txn in self.transactions.values():
                found = by_offset.get(txn.copies[0].commitlog_offset) if txn.copies else None
                if found is None:
                    txn.statetable_index = txn.statetable_state = None
                    if txn.outcome == L.PREPARED:
                        txn.flags.add(L.STATETABLE_MISSING)
                else:
                    txn.statetable_index, txn.statetable_state = found
                    expected = {L.COMMITTED: STATE_COMMIT, L.ROLLED_BACK: STATE_ROLLBACK}.get(txn.outcome,
                                                                                               STATE_PREPARED)
                    if found[1] != expected or found[0] != txn.copies[0].queue_offset:
                        txn.flags.add(L.STATETABLE_STALE)
        for key in list(self.transactions):
            self._finalize(self.transactions.pop(key))


__all__ = [
    "Broker",
    "Producer",
    "CheckRequest",
    "Clock",
    "BrokerDown",
    "HALF_TOPIC",
    "OP_TOPIC",
    "DISCARD_TOPIC",
    "CHECK_GROUP",
    "COMMIT",
    "ROLLBACK",
    "UNKNOWN",
]
