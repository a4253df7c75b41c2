"""The reference broker: one broker (master) writing one store, with its transaction semantics on a
simulated clock (discrete-event simulation).

The broker plays RocketMQ's SendMessageProcessor, EndTransactionProcessor, TransactionalMessageBridge,
TransactionalMessageServiceImpl (check service), TransactionalOpBatchService (5.1+), ConsumerOffsetManager
and, for 3.x, TransactionStateService with its check timers — against refbroker.store.MessageStore, which
writes the files. Reference sections (../shared/rocketmq-store-format.md): 7.2 half message, 7.3
EndTransaction checks, 7.4 commit path, 7.5 op messages, 7.6 check service, 7.8 4.0-4.2, 8 3.x, 10 edge cases,
11 observations.

``Broker`` holds the broker's state, its lifecycle (start with its periodic services, clean shutdown, profile
switch) and the hand-over of finished transactions to the ledger.  The rest of its behaviour comes from one
mixin per concern, each in its own module; besides the lower refbroker modules (store, profiles, ledger,
javaorder) a module of this list imports only modules listed above it:

* refbroker.events: ``EventLoop`` (simulated clock, event heap, fault hook), ``Clock``, ``BrokerDown``
* refbroker.producer: ``Producer``, ``CheckRequest``, ``COMMIT`` / ``ROLLBACK`` / ``UNKNOWN``
* refbroker.systopics: ``HALF_TOPIC``, ``OP_TOPIC``, ``DISCARD_TOPIC``, ``CHECK_GROUP``, ``REMOVE_TAG``
* refbroker.configmanagers: ``ConfigManagers`` (topics.json, consumerOffset.json, delayOffset.json)
* refbroker.produce: ``ProducePath`` (records built and put, ordinary / delayed / retry sends, torn writes)
* refbroker.transaction: ``TransactionPath`` (transactional send, EndTransaction, op messages, 5.1+ op batch)
* refbroker.checkservice: ``CheckService`` (the 4.3+ check service and check delivery)
* refbroker.statetable: ``StateTableService`` (3.x statetable timers and rebuild)
* refbroker.recovery: ``Recovery`` (crash, restart, consume queues deleted while stopped)

The mixins call each other's methods through ``self`` only; the state they share is set up in
``Broker.__init__``.
"""
from __future__ import annotations

import random
from typing import Callable, Optional

from refbroker import ledger as L
from refbroker.checkservice import CheckService
from refbroker.configmanagers import ConfigManagers
from refbroker.events import BrokerDown, Clock, EventLoop
from refbroker.produce import ProducePath
from refbroker.profiles import MODEL_HALF_OP, MODEL_STATETABLE, OP_BODY_COMMA_BATCH, Profile
from refbroker.recovery import Recovery
from refbroker.statetable import StateTableService
from refbroker.store import MessageStore
from refbroker.systopics import CHECK_GROUP, HALF_TOPIC, OP_TOPIC
from refbroker.transaction import TransactionPath
from txlog_io import commitlog as CL
from txlog_io.consumequeue import STATE_COMMIT, STATE_PREPARED, STATE_ROLLBACK
from txlog_io.errors import UsageError
from txlog_io.msgid import parse_host


class Broker(EventLoop, ConfigManagers, ProducePath, TransactionPath, CheckService, StateTableService,
             Recovery):
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
        self._ops_swept: tuple = (None, 0)     # (persisted op offset, len(ops)) after _finalize's last sweep
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

    def switch_profile(self, profile: Profile) -> None:
        """Upgrade in place: only while stopped, only between half/op profiles."""
        if not self.down:
            raise UsageError("switch_profile needs a stopped broker")
        if profile.transaction_model != self.profile.transaction_model:
            raise UsageError("an upgrade cannot change the transaction model")
        self.profile = profile
        self.store.profile = profile

    # ========================================================================================================
    # ledger
    # ========================================================================================================
    def _finalize_ready(self) -> None:
        if self.profile.transaction_model == MODEL_STATETABLE:
            return          # 3.x: the statetable can resurrect anything until the end (see ledger notes)
        persisted_half = self.persisted_offsets.get((HALF_TOPIC, CHECK_GROUP), {}).get(0, -1)
        # ready: nothing pending and (4.3+) every half copy below the persisted check offset; the newest copy
        # is tested first (one comparison rejects a transaction still being checked), then all of them
        if self.profile.transaction_model == MODEL_HALF_OP:
            done = [key for key, txn in self.transactions.items()
                    if not txn.pending_events and txn.local_done and not txn.pending_op_offsets
                    and (not txn.copies or (txn.copies[-1].queue_offset < persisted_half
                                            and all(c.queue_offset < persisted_half for c in txn.copies)))]
        else:
            done = [key for key, txn in self.transactions.items()
                    if not txn.pending_events and txn.local_done and not txn.pending_op_offsets]
        for key in done:
            self._finalize(self.transactions.pop(key))

    def _finalize(self, txn: L.Transaction) -> None:
        for copy in txn.copies:
            self.half_by_offset.pop(copy.commitlog_offset, None)
            if self.half_by_qo.get(copy.queue_offset) is copy:
                del self.half_by_qo[copy.queue_offset]
        if self.profile.transaction_model == MODEL_HALF_OP:
            low = self.persisted_offsets.get((OP_TOPIC, CHECK_GROUP), {}).get(0, 0)
            # ops below the persisted op offset are dropped; ops are only added between two sweeps, so the
            # sweep is repeated only when that offset moved or ops were added
            if (low, len(self.ops)) != self._ops_swept:
                for q in [q for q in self.ops if q < low]:
                    del self.ops[q]
                self._ops_swept = (low, len(self.ops))
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
]
