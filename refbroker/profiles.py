"""Broker version profiles: the defaults and on-disk habits of each RocketMQ line the reference broker
imitates.

One frozen :class:`Profile` per version range.  Field names that are broker settings keep the broker's own
spelling (``transactionTimeOut``, ``transactionCheckMax``, ``transactionCheckInterval``, ``fileReservedTime``,
``transactionOpMsgMaxSize``, ``transactionOpBatchInterval``, ``flushConsumerOffsetInterval``,
``mappedFileSizeCommitLog``, ``mappedFileSizeConsumeQueue``) so the Spark audit can import the same defaults.

Sources: the store-format reference (../shared/rocketmq-store-format.md) sections 7.7 (defaults), 8 (3.x), 9
(version table) and 11 (observations on real 3.1.4 / 4.9.8 / 5.3.3 stores), plus the fixtures in
tests/data/fixtures.  Where a range spans a change the profile follows its newest release (the one the
fixtures were written by where there is one):

=============  ============  ===============================================================================
profile        represents    notes
=============  ============  ===============================================================================
``3.x``        3.1.4         prepared/commit/rollback in the real topic; statetable + redolog; timer
                             checker (every 60 s, no maximum); fileReservedTime 48 h; no UNIQ_KEY, no
                             CLUSTER.
``4.0-4.2``    4.2.0         prepared/commit/rollback in the real topic, prepared QUEUEOFFSET 0; no checker.
``4.3-4.5``    4.5.2         half/op topics, op body = one offset; check max 15, timeout 6 s, interval 60 s;
                             giving up is only logged (no TRANS_CHECK_MAX_TIME_TOPIC record).
``4.6-4.9``    4.9.8         + TRANS_CHECK_MAX_TIME_TOPIC discards, IPv6 hosts, LZ4/ZSTD (4.9.4+), CLUSTER;
                             properties written without the final 0x02 (observed in the 4.9.8 fixture).
``5.0``        5.0.0         properties map of capacity 128 (observed 5.3.3 order), MSG_REGION/TRACE_ON
                             from the client, 32-byte checkpoint, op body still one offset.
``5.1+``       5.3.3         + __transactionId__ on halves, batched comma op bodies (RIP-50), magic V2 for
                             topics > 127 chars, check interval 30 s (5.1.1+), immunity reject on
                             EndTransaction (5.1.1+), 40-byte checkpoint.
=============  ============  ===============================================================================

Values not settled by the reference or the fixtures are marked UNVERIFIED next to the field (see
refbroker/README.md for the list of decisions).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Optional

from txlog_io.errors import UsageError

#: transaction models
MODEL_STATETABLE = "STATETABLE"          # 3.x: real topic + statetable/redolog, timer checker
MODEL_REAL_TOPIC = "REAL_TOPIC"          # 4.0-4.2: real topic, no checker
MODEL_HALF_OP = "HALF_OP"                # 4.3+: RMQ_SYS_TRANS_HALF_TOPIC / RMQ_SYS_TRANS_OP_HALF_TOPIC

#: op body formats
OP_BODY_SINGLE = "SINGLE"                # "1234"
OP_BODY_COMMA_BATCH = "COMMA_BATCH"      # "1234,1236,1235,"

GIB = 1 << 30


@dataclass(frozen=True)
class Profile:
    """Everything version-dependent the reference broker needs.  Immutable; derive variants with
    ``with_()``."""

    name: str
    represents: str                      # the release whose behaviour the profile follows
    transaction_model: str               # MODEL_*
    # --- broker settings (broker spelling; None = the setting does not exist in this version) ---------------
    transactionTimeOut: Optional[
        int
    ]  # ms; 3.x: checkTransactionMessageAtleastInterval (ineffective, see §8.3)
    transactionCheckMax: Optional[int]   # None = unlimited (3.x) / no checker (4.0-4.2)
    transactionCheckInterval: Optional[int]  # ms; 3.x: checkTransactionMessageTimerInterval
    fileReservedTime: int                # hours
    transactionOpMsgMaxSize: Optional[int]   # chars, 5.1+ op batching
    transactionOpBatchInterval: Optional[int]  # ms, 5.1+ op batching
    flushConsumerOffsetInterval: int = 5000    # ms
    mappedFileSizeCommitLog: int = GIB
    mappedFileSizeConsumeQueue: int = 300_000 * 20
    tranStateTableMapedFileSize: int = 2_000_000 * 24   # 3.x only
    tranRedoLogMapedFileSize: int = 2_000_000 * 20      # 3.x only
    # --- on-disk habits -------------------------------------------------------------------------------------
    op_body_format: Optional[str] = None           # OP_BODY_*; None without half/op topics
    discard_topic: bool = False                    # TRANS_CHECK_MAX_TIME_TOPIC records (4.6+)
    ipv6_hosts: bool = False                       # BORNHOST/STOREHOST V6 flags exist (4.6+)
    magic_v2: bool = False                         # autoMessageVersionOnTopicLen (5.1+)
    compression_types: tuple = ("ZLIB",)           # what a producer of this line can write
    compression_type_bits: bool = False           # 4.9.4+: sys_flag bits 8-10 name the codec
    properties_trailing_separator: bool = True     # 0x02 after the last property
    properties_map_capacity: int = 16              # initial HashMap capacity of broker-decoded properties
    checkpoint_size: int = 24                      # bytes of the checkpoint file actually used
    uniq_key: bool = True                          # client writes UNIQ_KEY
    writes_transaction_id: bool = False            # 5.1+: __transactionId__ on halves
    writes_cluster_property: bool = False  # CLUSTER added by the broker (4.6+; UNVERIFIED below 4.9.8)
    client_region_trace: bool = False              # 5.x client adds MSG_REGION / TRACE_ON
    wait_on_ordinary: bool = True                  # WAIT=true on ordinary sends (3.x, 5.x yes; 4.9.8 no)
    immunity_reject_end: bool = False              # 5.1.1+: non-check EndTransaction past immunity rejected
    rollback_record: bool = False                  # 3.x / 4.0-4.2 write a ROLLBACK record
    blank_fill: str = "zero"  # "zero" (4.x/5.x) or "scratch" (3.1.4 copies a stale buffer)
    data_version_timestamp_key: str = "timestamp"  # 3.x fastjson wrote the field "timestatmp"
    data_version_state_version: bool = False       # 5.x DataVersion.stateVersion
    topic_config_extra_fields: bool = True         # 4.x+: order, topicSysFlag
    topic_config_attributes: bool = False          # 5.x: attributes {}
    consumer_offset_data_version: bool = False     # 5.x consumerOffset.json has dataVersion + groupTopicMap
    persists_op_topic_config: bool = False  # 5.x pre-creates RMQ_SYS_TRANS_OP_HALF_TOPIC in topics.json
    writes_lock_file: bool = True
    # --- DLedger (Raft) CommitLog, enableDLegerCommitLog (4.5+): None = file mode --------------------------
    dledger_self_id: Optional[str] = None          # dLegerSelfId: the log goes to dledger-<id>/data
    dledger_index_file_size: int = 160 << 20       # DLedger's index file size (not a RocketMQ setting)

    # --------------------------------------------------------------------------------------------------------
    def with_(self, **changes) -> "Profile":
        """A copy with some fields changed (e.g. short timeouts for a scenario or a test)."""
        unknown = set(changes) - set(self.__dataclass_fields__)
        if unknown:
            raise UsageError(f"unknown Profile field(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    @property
    def has_checker(self) -> bool:
        return self.transaction_model != MODEL_REAL_TOPIC

    @property
    def half_op(self) -> bool:
        return self.transaction_model == MODEL_HALF_OP

    def broker_defaults(self) -> dict:
        """The broker settings under their broker names (what the audit imports)."""
        return {k: getattr(self, k) for k in (
            "transactionTimeOut", "transactionCheckMax", "transactionCheckInterval", "fileReservedTime",
            "transactionOpMsgMaxSize", "transactionOpBatchInterval", "flushConsumerOffsetInterval",
            "mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue")}

    def to_dict(self) -> dict:
        return asdict(self)


_3X = Profile(
    name="3.x", represents="3.1.4", transaction_model=MODEL_STATETABLE,
    transactionTimeOut=60_000, transactionCheckMax=None, transactionCheckInterval=60_000, fileReservedTime=48,
    transactionOpMsgMaxSize=None, transactionOpBatchInterval=None,
    uniq_key=False, rollback_record=True, blank_fill="scratch", data_version_timestamp_key="timestatmp",
    topic_config_extra_fields=False, writes_lock_file=False, properties_trailing_separator=True,
)

_40 = Profile(
    name="4.0-4.2", represents="4.2.0", transaction_model=MODEL_REAL_TOPIC,
    transactionTimeOut=None, transactionCheckMax=None, transactionCheckInterval=None, fileReservedTime=72,
    transactionOpMsgMaxSize=None, transactionOpBatchInterval=None,
    rollback_record=True,
    # UNVERIFIED: the 4.9.x writer drops the final 0x02; 4.0-4.5 keep the 3.x serializer (trailing 0x02).
    properties_trailing_separator=True, wait_on_ordinary=False,
)

_43 = Profile(
    name="4.3-4.5", represents="4.5.2", transaction_model=MODEL_HALF_OP,
    transactionTimeOut=6_000, transactionCheckMax=15, transactionCheckInterval=60_000, fileReservedTime=72,
    transactionOpMsgMaxSize=None, transactionOpBatchInterval=None,
    op_body_format=OP_BODY_SINGLE, discard_topic=False,
    properties_trailing_separator=True, wait_on_ordinary=False,
)

_46 = Profile(
    name="4.6-4.9", represents="4.9.8", transaction_model=MODEL_HALF_OP,
    transactionTimeOut=6_000, transactionCheckMax=15, transactionCheckInterval=60_000, fileReservedTime=72,
    transactionOpMsgMaxSize=None, transactionOpBatchInterval=None,
    op_body_format=OP_BODY_SINGLE, discard_topic=True, ipv6_hosts=True,
    compression_types=("ZLIB", "LZ4", "ZSTD"), compression_type_bits=True,
    properties_trailing_separator=False, writes_cluster_property=True, wait_on_ordinary=False,
)

_50 = Profile(
    name="5.0", represents="5.0.0", transaction_model=MODEL_HALF_OP,
    transactionTimeOut=6_000, transactionCheckMax=15, transactionCheckInterval=60_000, fileReservedTime=72,
    transactionOpMsgMaxSize=None, transactionOpBatchInterval=None,
    op_body_format=OP_BODY_SINGLE, discard_topic=True, ipv6_hosts=True,
    compression_types=("ZLIB", "LZ4", "ZSTD"), compression_type_bits=True,
    properties_trailing_separator=True, properties_map_capacity=128, checkpoint_size=32,
    writes_cluster_property=True, client_region_trace=True,
    data_version_state_version=True, topic_config_attributes=True, consumer_offset_data_version=True,
    persists_op_topic_config=True,
)

_51 = _50.with_(
    name="5.1+", represents="5.3.3",
    transactionCheckInterval=30_000, transactionOpMsgMaxSize=4096, transactionOpBatchInterval=3000,
    op_body_format=OP_BODY_COMMA_BATCH, magic_v2=True, checkpoint_size=40, writes_transaction_id=True,
    immunity_reject_end=True,
)

PROFILES = {p.name: p for p in (_3X, _40, _43, _46, _50, _51)}
PROFILE_NAMES = tuple(PROFILES)


def get_profile(name) -> Profile:
    """Profile by name ("3.x", "4.0-4.2", "4.3-4.5", "4.6-4.9", "5.0", "5.1+"); a Profile passes through."""
    if isinstance(name, Profile):
        return name
    try:
        return PROFILES[name]
    except KeyError:
        raise UsageError(f"unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}") from None


__all__ = ["Profile", "PROFILES", "PROFILE_NAMES", "get_profile", "MODEL_STATETABLE", "MODEL_REAL_TOPIC",
           "MODEL_HALF_OP", "OP_BODY_SINGLE", "OP_BODY_COMMA_BATCH"]
