"""Workload generator and scenario presets: deterministic by seed, streamed, bounded memory.

A workload is a stream of sends on a simulated clock: every ``tx_interval_ms`` one transactional send to
``TopicOrders`` (4 queues) from producer group ``PID_TX_ORDERS``, with ordinary traffic spread between them
(``TopicEvents`` 4 queues, ``TopicLogs`` 2 queues with large compressed bodies, IPv6-born messages on 4.6+,
consumer retries through ``SCHEDULE_TOPIC_XXXX`` into ``%RETRY%<group>`` — stored with magic V2 on 5.1+ where
the
consumer group is long enough to push the topic past 127 characters).  Each transaction gets a class (its
producer's behaviour, :data:`TX_CLASSES`) drawn by weight from the scenario's mix; the producer's check
callback
answers from that class.  Bodies come from a small pool generated once per run (compressed and CRC'd once), so
generation cost is dominated by record encoding and file writes.

Scenarios (``SCENARIOS``) add crashes, clock jumps, profile switches, tuning and post-run faults; see
``describe_scenarios()`` or ``txlog-refbroker scenarios``.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field
from typing import Optional

from refbroker.broker import Broker
from refbroker.producer import COMMIT, ROLLBACK, UNKNOWN, Producer
from refbroker.profiles import MODEL_HALF_OP, MODEL_REAL_TOPIC, MODEL_STATETABLE, OP_BODY_COMMA_BATCH, Profile
from txlog_io import compression as CMP
from txlog_io.commitlog import body_crc
from txlog_io.errors import UsageError

TX_TOPIC = "TopicOrders"
EVENTS_TOPIC = "TopicEvents"
LOGS_TOPIC = "TopicLogs"
DELAY_TOPIC = "TopicDelay"
TX_GROUP = "PID_TX_ORDERS"
GONE_GROUP = "PID_TX_GONE"
LONG_GROUP = "CID_LONG_GROUP_" + "-".join(["abcdefghij"] * 12) + "-a"      # retry topic of 157 chars
COMPRESS_OVER = 4096                      # DefaultMQProducer.compressMsgBodyOverHowmuch
_EVENT_TAGS = ("TagA", "TagB", "TagC")
OP_QUEUE_KEY = ("RMQ_SYS_TRANS_OP_HALF_TOPIC", 0)


@dataclass(frozen=True)
class TxClass:
    """What the producer does for one transaction."""

    name: str
    at_send: Optional[str]                # end sent right after the half: COMMIT / ROLLBACK / UNKNOWN / None
    answers: tuple                        # answers to check 1, 2, ... (the last repeats); None = no answer
    decision: str                         # the local transaction's real result (ledger producer_decision)
    immunity: bool = False                # set CHECK_IMMUNITY_TIME_IN_SECONDS
    commit_twice: bool = False            # a second COMMIT for the same half
    unreachable: bool = False             # producer gone: no channel for checks
    late_end: Optional[str] = None        # an end the producer sends on its own, late
    inflight: bool = False                # sent in the last moments before the end of the run


TX_CLASSES = {c.name: c for c in (
    TxClass("commit", COMMIT, (COMMIT,), "COMMIT"),
    TxClass("rollback", ROLLBACK, (ROLLBACK,), "ROLLBACK"),
    TxClass("check_commit", UNKNOWN, (COMMIT,), "COMMIT"),
    TxClass("check_rollback", UNKNOWN, (ROLLBACK,), "ROLLBACK"),
    TxClass("check2_commit", UNKNOWN, (UNKNOWN, COMMIT), "COMMIT"),
    TxClass("check2_rollback", UNKNOWN, (UNKNOWN, ROLLBACK), "ROLLBACK"),
    TxClass("immunity_commit", UNKNOWN, (COMMIT,), "COMMIT", immunity=True),
    TxClass("unknown", UNKNOWN, (UNKNOWN,), "UNKNOWN"),
    TxClass("silent", None, (None,), "NONE"),
    TxClass("unreachable", None, (None,), "NONE", unreachable=True),
    TxClass("late_commit", None, (COMMIT,), "COMMIT", late_end=COMMIT),
    TxClass("commit_twice", COMMIT, (COMMIT,), "COMMIT", commit_twice=True),
    TxClass("inflight", UNKNOWN, (UNKNOWN,), "UNKNOWN", inflight=True),
)}


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    mix: dict                                     # class name -> weight
    crashes: tuple = ()                           # crash kinds spread over the send phase
    final: str = "shutdown"                       # "shutdown" or "crash" (store left as after a crash)
    shutdown_grace_ms: int = 0
    drain_checks: Optional[int] = None  # check intervals to run after the last send (None: enough to
    # let every unanswered transaction reach transactionCheckMax)
    profile_overrides: dict = field(default_factory=dict)
    profiles: Optional[tuple] = None              # allowed final profiles (None: all)
    start_profile: Optional[str] = None           # upgrade: the profile of the first half of the run
    clock_jump_hours: float = 0  # jump after the send phase (retention: past fileReservedTime)
    post_faults: tuple = ()                       # refbroker.faults names, applied to the finished store
    default_sizes: dict = field(default_factory=dict)


_BASE_MIX = {"commit": 40, "rollback": 18, "check_commit": 10, "check_rollback": 8, "check2_commit": 5,
             "check2_rollback": 3, "immunity_commit": 3, "late_commit": 3, "unknown": 2, "inflight": 2}

SCENARIOS = {
    s.name: s
    for s in (
        Scenario(
            "clean",
            "normal traffic, every check answered the way the producer decided, a few never-answered "
            "transactions (discarded after transactionCheckMax on 4.6+), a few in flight at a clean "
            "shutdown; no faults",
            dict(_BASE_MIX),
        ),
        Scenario(
            "crashy",
            "the clean mix plus producers that commit twice, and broker crashes at every interesting step: "
            "between a commit record and its op, with 5.1+ ops still in the batch buffer, a torn tail write "
            "(power loss), consume-queue dispatch lagging the CommitLog, a plain kill (consumerOffset.json "
            "stale by up to its 5 s flush interval); each followed by an abnormal restart; the run ends in "
            "a crash (abort file present, dispatch lag, stale offsets, torn last record); once the operator "
            "also deletes a consume queue (the op queue on 4.3+) before the restart, which recovery "
            "rebuilds with pre-blank units",
            {**_BASE_MIX, "commit_twice": 4},
            crashes=("after_commit_before_op", "op_batch", "torn", "cq_lag", "plain", "delete_cq"),
            final="crash",
        ),
        Scenario(
            "unresolved",
            "producers that answer UNKNOWN, never answer, or are gone: many re-put copies, discards to "
            "TRANS_CHECK_MAX_TIME_TOPIC (4.6+; 4.3-4.5 only log), prepared forever on 3.x/4.0-4.2; the "
            "check service keeps running for 10 s after the producers disconnect",
            {
                "commit": 15,
                "rollback": 5,
                "check_commit": 10,
                "check2_commit": 10,
                "unknown": 25,
                "silent": 15,
                "unreachable": 15,
                "inflight": 5,
            },
            shutdown_grace_ms=10_000,
        ),
        Scenario(
            "checkmax-storm",
            "transactionTimeOut 1 s, check interval 1 s, transactionCheckMax 3 (the 5.3.3 fixture's "
            "settings): halves already ended at send are re-checked before their ops are flushed (5.1+ op "
            "batch 3 s), so commits are duplicated and transactions are committed and discarded",
            {
                "commit": 15,
                "rollback": 15,
                "check_commit": 18,
                "check_rollback": 12,
                "check2_commit": 12,
                "immunity_commit": 12,
                "unknown": 12,
                "inflight": 4,
            },
            profile_overrides={
                "transactionTimeOut": 1000,
                "transactionCheckInterval": 1000,
                "transactionCheckMax": 3,
            },
            profiles=("4.3-4.5", "4.6-4.9", "5.0", "5.1+"),
        ),
        Scenario(
            "retention",
            "a long run: the clock jumps past fileReservedTime so the check service discards unresolved "
            "halves by age (needSkip), then retention deletes the oldest CommitLog files and the "
            "consume-queue files that point only into them",
            {
                "commit": 45,
                "rollback": 20,
                "check_commit": 10,
                "check_rollback": 5,
                "unknown": 8,
                "unreachable": 8,
                "silent": 4,
            },
            clock_jump_hours=80,
            post_faults=("retention",),
        ),
        Scenario(
            "corrupt",
            "a clean run, then damage: bit flips in CommitLog records (a commit body, an ordinary header), "
            "in a consume-queue unit, in the checkpoint (and the 3.x statetable), a truncated CommitLog "
            "file and consumerOffset.json, and (4.3+) a deleted op consume queue",
            dict(_BASE_MIX),
            post_faults=(
                "bitflip_commit_body",
                "bitflip_record_header",
                "bitflip_cq_unit",
                "bitflip_checkpoint",
                "bitflip_statetable",
                "truncate_commitlog",
                "truncate_config",
                "delete_op_cq",
            ),
        ),
        Scenario(
            "upgrade-4.9-to-5.1",
            "the first half of the run on a 4.6-4.9 broker (single-offset ops, no __transactionId__, no "
            "trailing 0x02), clean shutdown, restart as 5.1+ on the same store (batched comma ops, V2 retry "
            "records, 40-byte checkpoint): both op formats in one op queue",
            dict(_BASE_MIX),
            profiles=("5.1+",),
            start_profile="4.6-4.9",
        ),
        Scenario(
            "legacy-3x",
            "3.x statetable/redolog transactions with small statetable (100 units) and redolog (200 units) "
            "files; an abnormal restart rebuilds the statetable through the 3.1.4 bug (only the first "
            "redolog file is read), producers still ending with old indexes afterwards",
            {
                "commit": 30,
                "rollback": 20,
                "check_commit": 15,
                "check_rollback": 15,
                "unknown": 10,
                "late_commit": 5,
                "inflight": 5,
            },
            crashes=("plain",),
            profiles=("3.x",),
            default_sizes={"statetable_file_size": 2400, "redolog_file_size": 4000},
        ),
    )
}


def describe_scenarios() -> str:
    lines = []
    for s in SCENARIOS.values():
        allowed = ", ".join(s.profiles) if s.profiles else "all profiles"
        lines.append(f"{s.name} ({allowed}):\n    {s.description}")
    return "\n".join(lines)


def get_scenario(name) -> Scenario:
    if isinstance(name, Scenario):
        return name
    try:
        return SCENARIOS[name]
    except KeyError:
        raise UsageError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None


# ------------------------------------------------------------------------------------------------------------
# bodies
# ------------------------------------------------------------------------------------------------------------

_WORDS = (
    "order",
    "payment",
    "amount",
    "currency",
    "USD",
    "EUR",
    "sku",
    "user",
    "shipping",
    "invoice",
    "refund",
    "status",
    "created",
    "paid",
    "été",
    "数据",
    "region",
    "warehouse",
    "item",
    "total",
)


class BodyPool:
    """A few dozen bodies per size class, generated once, with their stored form and CRC cached per codec."""

    def __init__(self, rng: random.Random, msg_bytes: int, profile: Profile, count: int = 48):
        self.rng = rng
        self.profile = profile
        large_max = int(max(msg_bytes, 6000) * 2.5)
        words = [rng.choice(_WORDS) for _ in range(max(msg_bytes * 3 // 2, large_max) // 3 + 64)]
        self._text = " ".join(words).encode("utf-8")
        self.plain = [self._body(rng, max(16, int(msg_bytes * rng.uniform(0.5, 1.5)))) for _ in range(count)]
        self.large = [
            self._body(rng, max(COMPRESS_OVER + 1, int(max(msg_bytes, 6000) * rng.uniform(1.2, 2.5))))
            for _ in range(max(4, count // 6))
        ]
        self._stored: dict = {}

    def _body(self, rng: random.Random, size: int) -> bytes:
        """JSON-ish text of ``size`` bytes cut from a shared random word stream at a random place."""
        start = rng.randrange(max(1, len(self._text) - size))
        return (b'{"d":"' + self._text[start:start + size] + b'"}')[:size]

    def stored(self, body: bytes, compression: str) -> tuple:
        """(stored bytes, sys_flag bits, crc) for this profile (computed once per body and codec)."""
        key = (id(body), compression)
        hit = self._stored.get(key)
        if hit is None:
            if compression == CMP.NONE:
                data, bits = body, 0
            else:
                data = CMP.compress(body, compression)
                bits = (
                    CMP.sys_flag_bits(compression)
                    if self.profile.compression_type_bits
                    else CMP.COMPRESSED_FLAG
                )
            hit = self._stored[key] = (data, bits, body_crc(data))
        return hit

    def set_profile(self, profile: Profile) -> None:
        self.profile = profile
        self._stored.clear()


# ------------------------------------------------------------------------------------------------------------
# the driver
# ------------------------------------------------------------------------------------------------------------

def _check_answer(request) -> Optional[str]:
    plan: TxClass = request.transaction.plan
    answers = plan.answers
    return answers[min(request.check_number, len(answers)) - 1]


@dataclass
class WorkloadConfig:
    transactions: int
    background_messages: int
    msg_bytes: int = 1024
    tx_interval_ms: int = 10
    crash_downtime_ms: int = 2000
    retry_every: int = 200             # one consumer retry per this many ordinary messages (0: none)
    final_dispatch_lag: int = 5        # records without CQ entries when the run ends in a crash


class Workload:
    """Drives one Broker through a scenario."""

    def __init__(self, broker: Broker, scenario: Scenario, config: WorkloadConfig, seed: int,
                 profiles: Optional[tuple] = None):
        self.broker = broker
        self.scenario = scenario
        self.config = config
        self.rng = random.Random(seed)
        self.progress = None        # txlog_io.progress.Progress (set by generate on a terminal)
        self.after_transaction = None   # callable(i): after main transaction i (generate's snapshots)
        self.final_profile, self.start_profile = profiles if profiles else (broker.profile, broker.profile)
        self.bodies = BodyPool(random.Random(seed * 7 + 1), config.msg_bytes, broker.profile)
        self.tx_producer = Producer(TX_GROUP, port=51618, pid=4242, check_listener=_check_answer)
        self.gone_producer = Producer(GONE_GROUP, port=51619, pid=4243, check_listener=_check_answer,
                                      connected=False)
        self.event_producer = Producer("PID_EVENTS", port=51572, pid=4244)
        self.v6_producer = Producer("PID_EVENTS_V6", client_ip="0:0:0:0:0:0:0:1", port=51580, pid=4245)
        for producer in (self.tx_producer, self.gone_producer, self.event_producer, self.v6_producer):
            broker.register_producer(producer)
        broker.register_consumer(EVENTS_TOPIC, "CID_EVENTS", lag=3)
        broker.register_consumer(TX_TOPIC, "CID_ORDERS", lag=1)
        if config.retry_every and broker.profile.name != "3.x":
            broker.retry_commit_every = max(5, config.retry_every // 8)
        classes = [c for c in scenario.mix if scenario.mix[c] > 0]
        self.class_names = [c for c in classes if not TX_CLASSES[c].inflight]
        self.class_weights = [scenario.mix[c] for c in self.class_names]
        # Random.choices(population, weights) accumulates the weights on every call; passing them accumulated
        # once draws the same values from the same random() calls
        self.class_cum_weights = list(itertools.accumulate(self.class_weights))
        self.inflight_share = sum(scenario.mix[c] for c in classes if TX_CLASSES[c].inflight) / \
            max(1, sum(scenario.mix.values()))
        self.class_counts: dict = {}
        self._delete_queue_on_restart: Optional[tuple] = None
        self.ordinary_sent = 0
        self.large_sent = 0
        self.upgrade_done = False

    # -- helpers ---------------------------------------------------------------------------------------------
    def _ensure_running(self) -> None:
        b = self.broker
        if b.down:
            b.run_until(b.now + self.config.crash_downtime_ms)
            if self._delete_queue_on_restart is not None:
                b.delete_consume_queue(*self._delete_queue_on_restart)
                self._delete_queue_on_restart = None
            b.restart()

    def _advance(self, until: int) -> None:
        b = self.broker
        if not b.down and (not b.events or b.events[0][0] > until):
            if until > b.clock.now:
                b.clock.now = until
            return
        while True:
            b.run_until(until)
            if not b.down:
                return
            self._ensure_running()
            if b.now >= until:
                return

    def _pick_class(self, inflight: bool) -> TxClass:
        if inflight:
            return TX_CLASSES["inflight"]
        name = self.rng.choices(self.class_names, cum_weights=self.class_cum_weights)[0]
        return TX_CLASSES[name]

    # -- sends ----------------------------------------------------------------------------------------------
    def send_ordinary(self) -> None:
        """One ordinary message; a single random draw picks topic, queue, tag, body, producer and extras."""
        b, p = self.broker, self.broker.profile
        self.ordinary_sent += 1
        n = self.ordinary_sent
        draw = self.rng.getrandbits(32)
        roll = (draw & 0xFFFF) / 65536.0
        high = draw >> 16
        delay = None
        if roll < 0.08:
            large = self.bodies.large
            body = large[high % len(large)]
            self.large_sent += 1
            kind = p.compression_types[self.large_sent % len(p.compression_types)]
            topic, queue_id, tags = LOGS_TOPIC, high & 1, "TagLog"
        else:
            plain = self.bodies.plain
            body = plain[high % len(plain)]
            kind = CMP.NONE
            topic, queue_id, tags = EVENTS_TOPIC, high & 3, _EVENT_TAGS[(high >> 2) % 3]
            if roll < 0.09 and p.name != "3.x":
                topic, queue_id, tags, delay = DELAY_TOPIC, high & 1, "TagD", 1 + ((high >> 1) & 1)
        producer = self.v6_producer if (roll > 0.96 and p.ipv6_hosts) else self.event_producer
        user = {"traceId": f"T{n:08d}"} if roll < 0.03 else None
        result = b.send_message(producer, topic, queue_id, body, tags=tags, keys=f"EV-{n}", user_props=user,
                                stored_body=self.bodies.stored(body, kind), delay_level=delay)
        if result is None:
            self._ensure_running()
            return
        every = self.config.retry_every
        if every and n % every == 0 and topic == EVENTS_TOPIC and p.name != "3.x":
            group = LONG_GROUP if p.magic_v2 else "CID_EVENTS"
            b.consumer_retry(group, b.last_message, result.physical_offset)

    def send_ordinary_no_restart(self) -> None:
        """An ordinary send that may crash the broker and leaves it down (the final torn write)."""
        b = self.broker
        self.ordinary_sent += 1
        body = self.bodies.plain[self.ordinary_sent % len(self.bodies.plain)]
        b.send_message(
            self.event_producer,
            EVENTS_TOPIC,
            0,
            body,
            tags="TagA",
            keys=f"EV-{self.ordinary_sent}",
            stored_body=self.bodies.stored(body, CMP.NONE),
        )

    def send_transaction(self, index: int, inflight: bool = False) -> None:
        b, rng = self.broker, self.rng
        plan = self._pick_class(inflight)
        self.class_counts[plan.name] = self.class_counts.get(plan.name, 0) + 1
        producer = self.gone_producer if plan.unreachable else self.tx_producer
        if rng.random() < 0.05:                        # a large body: the producer compresses it (> 4 KiB)
            body = rng.choice(self.bodies.large)
            self.large_sent += 1
            kind = b.profile.compression_types[self.large_sent % len(b.profile.compression_types)]
        else:
            body, kind = rng.choice(self.bodies.plain), CMP.NONE
        immunity = None
        if plan.immunity and b.profile.transaction_model == MODEL_HALF_OP:
            immunity = max(1, 2 * (b.profile.transactionTimeOut or 6000) // 1000)
        user = {"bizId": f"B{index}"} if rng.random() < 0.3 else None
        txn = b.send_transactional(
            producer,
            TX_TOPIC,
            rng.randrange(4),
            body,
            tags=("create", "pay")[index % 2],
            keys=f"TX-{index}",
            user_props=user,
            immunity_s=immunity,
            plan=plan,
            stored_body=self.bodies.stored(body, kind),
        )
        if txn is None:
            self._ensure_running()
            return
        txn.producer_decision = plan.decision
        txn.end_at_send = plan.at_send
        now = b.now
        if plan.at_send is not None:
            b.schedule(now + 2 + rng.randrange(8), b.end_transaction, txn, plan.at_send, txn=txn)
        if plan.commit_twice:
            b.schedule(now + 40 + rng.randrange(40), b.end_transaction, txn, COMMIT, txn=txn)
        if plan.late_end is not None:
            late = 2 * (b.profile.transactionTimeOut or 6000) + rng.randrange(5000)
            b.schedule(now + late, b.end_transaction, txn, plan.late_end, txn=txn)

    # -- crashes ---------------------------------------------------------------------------------------------
    def arm_crash(self, kind: str) -> None:
        """Arrange for the broker to crash the way ``kind`` says (it happens during the next sends)."""
        b = self.broker
        if kind == "after_commit_before_op":
            if b.profile.transaction_model == MODEL_HALF_OP:
                b.crash_after_next_commit = True
            else:
                self._pending_plain_crash = True
        elif kind == "torn":
            b.tear_next_put = 0.3 + 0.4 * self.rng.random()
        elif kind == "cq_lag":
            b.store.hold_dispatch = True
            self._crash_after_sends = 3 + self.rng.randrange(5)
        elif kind == "op_batch":
            if b.profile.op_body_format == OP_BODY_COMMA_BATCH:
                self._crash_when_ops_pending = True
            else:
                self._pending_plain_crash = True
        elif kind == "delete_cq":
            # a plain crash after which the operator deletes a consume queue; recovery rebuilds it from the
            # newest
            # CommitLog file with pre-blank units in front (the op queue where there is one)
            self._pending_plain_crash = True
            if b.profile.transaction_model == MODEL_HALF_OP and (OP_QUEUE_KEY in b.store.queues):
                self._delete_queue_on_restart = OP_QUEUE_KEY
            else:
                self._delete_queue_on_restart = (EVENTS_TOPIC, 1)
        else:
            self._pending_plain_crash = True

    def _maybe_crash_now(self) -> None:
        b = self.broker
        if b.down:
            return
        if getattr(self, "_pending_plain_crash", False):
            self._pending_plain_crash = False
            b.crash("plain")
        elif getattr(self, "_crash_when_ops_pending", False) and b.op_pending:
            self._crash_when_ops_pending = False
            b.crash("ops pending")
        elif getattr(self, "_crash_after_sends", None) is not None:
            self._crash_after_sends -= 1
            if self._crash_after_sends <= 0:
                self._crash_after_sends = None
                b.crash("dispatch lag")

    # -- the run ---------------------------------------------------------------------------------------------
    def run(self) -> None:
        b, cfg, sc = self.broker, self.config, self.scenario
        n_tx, n_bg = cfg.transactions, cfg.background_messages
        n_inflight = min(n_tx, int(round(n_tx * self.inflight_share)))
        n_main = n_tx - n_inflight
        crash_points = {}
        for k, kind in enumerate(sc.crashes):
            crash_points[max(1, (k + 1) * n_main // (len(sc.crashes) + 1))] = kind
        upgrade_at = n_main // 2 if sc.start_profile else None
        bg_per_tx = n_bg / max(1, n_main)
        bg_credit = 0.0
        if n_main == 0:
            for _ in range(n_bg):
                self._advance(b.now + 1)
                self.send_ordinary()
        for i in range(n_main):
            if upgrade_at is not None and i == upgrade_at:
                self._upgrade()
            if i in crash_points:
                self.arm_crash(crash_points[i])
            bg_credit += bg_per_tx
            slots = int(bg_credit)
            bg_credit -= slots
            step = cfg.tx_interval_ms / (slots + 1)
            start = b.now
            for s in range(slots):
                self._advance(start + int(step * (s + 1)))
                self.send_ordinary()
                self._maybe_crash_now()
            self._advance(start + cfg.tx_interval_ms)
            self.send_transaction(i)
            self._maybe_crash_now()
            if self.progress is not None:
                self.progress.update(i + 1)
            if self.after_transaction is not None:
                self.after_transaction(i)
        self._drain()
        # in-flight transactions: sent in the last moments, unanswered when the run ends
        for i in range(n_main, n_tx):
            self._advance(b.now + cfg.tx_interval_ms)
            self.send_transaction(i, inflight=True)
        self._finish()

    def _upgrade(self) -> None:
        b = self.broker
        self._advance(b.now + 1)
        b.shutdown()
        b.switch_profile(self.final_profile)
        self.bodies.set_profile(self.final_profile)
        b.restart()
        self.upgrade_done = True

    def _drain(self) -> None:
        b, sc = self.broker, self.scenario
        p = b.profile
        interval = p.transactionCheckInterval or 60_000
        if sc.drain_checks is not None:
            checks = sc.drain_checks
        elif p.transaction_model == MODEL_HALF_OP:
            checks = (p.transactionCheckMax or 15) + 3
        elif p.transaction_model == MODEL_STATETABLE:
            checks = 3
        else:
            checks = 0
        # resolve what producers will resolve, then let the check service run
        self._advance(b.now + 3 * (p.transactionTimeOut or 6000) + 10_000)
        if p.transaction_model != MODEL_REAL_TOPIC:
            self._advance(b.now + checks * interval + 1 + (STATETABLE_DELAY if
                                                            p.transaction_model == MODEL_STATETABLE else 0))
        if sc.clock_jump_hours:
            # the broker is stopped for the jump (a long maintenance window); on restart the check service
            # finds
            # halves older than fileReservedTime (needSkip)
            b.shutdown()
            b.run_until(b.now + int(sc.clock_jump_hours * 3600 * 1000))
            b.restart()
            self._advance(b.now + 2 * interval + STATETABLE_DELAY)

    def _finish(self) -> None:
        b, sc = self.broker, self.scenario
        self._advance(b.now + 20)
        for producer in (self.tx_producer, self.gone_producer):
            producer.connected = False
        if sc.final == "crash":
            # the end: consume-queue dispatch lags the last records, the very last write is torn (power loss)
            b.store.hold_dispatch = True
            for _ in range(self.config.final_dispatch_lag):
                self.send_ordinary()
            b.run_until(b.now + 1000)
            b.tear_next_put = 0.3 + 0.4 * self.rng.random()
            self.send_ordinary_no_restart()
            if not b.down:
                b.crash("final crash")
        else:
            b.shutdown(grace_ms=sc.shutdown_grace_ms)


STATETABLE_DELAY = 60_000


def resolve_profiles(scenario: Scenario, profile: Profile) -> tuple:
    """(start profile, final profile) for a scenario, with its overrides applied; UsageError if not
    allowed."""
    from refbroker.profiles import get_profile

    if scenario.profiles is not None and profile.name not in scenario.profiles:
        raise UsageError(f"scenario {scenario.name} needs profile {' or '.join(scenario.profiles)}, "
                         f"got {profile.name}")
    final = profile.with_(**scenario.profile_overrides) if scenario.profile_overrides else profile
    start = get_profile(scenario.start_profile) if scenario.start_profile else final
    if scenario.profile_overrides and scenario.start_profile:
        start = start.with_(**scenario.profile_overrides)
    if start is not final:          # the store's log layout (file mode or DLedger) does not change on upgrade
        start = start.with_(dledger_self_id=final.dledger_self_id,
                            dledger_index_file_size=final.dledger_index_file_size)
    return start, final


__all__ = ["Scenario", "SCENARIOS", "TxClass", "TX_CLASSES", "Workload", "WorkloadConfig", "get_scenario",
           "describe_scenarios", "resolve_profiles", "BodyPool"]
