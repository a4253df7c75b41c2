"""Constants, profiles and broker thresholds of the reconstruction (Spark-free: the reducer, the Spark wrapper
and the audit job share them).  Profiles and defaults follow the store-format reference sections 7.7 and 8.3
(BrokerConfig / MessageStoreConfig of each version line).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional, Union

from txlog_io.commitlog_layout import (  # noqa: F401 - the reconstruction's topics are the store's
    DISCARD_TOPIC,
    HALF_TOPIC,
    OP_TOPIC,
    TX_SYSTEM_TOPICS,
)

CHECK_GROUP = "CID_RMQ_SYS_TRANS"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TIMER_TOPIC = "rmq_sys_wheel_timer"

HALF_QUEUE = "HALF_QUEUE"  # 4.3+: half topic + op topic
PREPARED_RECORD = "PREPARED_RECORD"  # 3.x, 4.0-4.2: PREPARED/COMMIT/ROLLBACK records in the real topic

P_3X, P_40, P_43, P_51, P_UNKNOWN = "3.x", "4.0-4.2", "4.3-5.0", "5.1+", "unknown"
PROFILES = {
    P_3X: "RocketMQ 3.x: prepared/commit/rollback records in the real topic, transaction/statetable + "
    "redolog, timer check without a maximum",
    P_40: "RocketMQ 4.0-4.2: prepared/commit/rollback records in the real topic, no check service",
    P_43: "RocketMQ 4.3-5.0: half/op topics, single-offset op bodies. 4.3.0 (timeout 3000, max 5) and "
    "5.0 (32-byte checkpoint) are not distinguishable from the records alone: override the params/profile "
    "if known",
    P_51: "RocketMQ 5.1+: half/op topics with comma-batched op bodies, __transactionId__ on halves, magic "
    "V2. 5.1.0 (check interval 60 s) vs 5.1.1+ (30 s) is visible only in the checkpoint size (40 bytes from "
    "5.1.1)",
    P_UNKNOWN: "no transactional record in the store: 4.3-5.0 defaults are used",
}

COMMITTED, ROLLED_BACK, PREPARED, DISCARDED = "COMMITTED", "ROLLED_BACK", "PREPARED", "DISCARDED"
#: resolved (an op record names it) but whether committed or rolled back is unknown: the COMMIT record would lie
#: in CommitLog bytes that could not be read (jobs/reconstruct/damage.py)
UNKNOWN_DAMAGED = "UNKNOWN_DAMAGED"
#: every state a transaction can have, in the order reports list them
STATES = (COMMITTED, ROLLED_BACK, DISCARDED, PREPARED, UNKNOWN_DAMAGED)
#: txlog_io anomaly kinds about a whole mapped file, not a record in it (never CORRUPT_RECORD)
FILE_LEVEL_ANOMALIES = (
    "FILE_SIZE_MISMATCH",
    "FILE_GAP",
    "FILE_OVERLAP",
    "BAD_FILE_NAME",
    "MISALIGNED_FILE_NAME",
    "MISSING_FILE",
    "COMMITLOG_HEAD_MISSING",
)
SEP = "\u0001"  # never inside a property value (it is the properties name/value separator)
LONG_MAX = (1 << 63) - 1


# ------------------------------------------------------------------------------------------------------------
# Parameters
# ------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditParams:
    """Broker thresholds the audit judges against (names as in BrokerConfig / MessageStoreConfig).

    ``transactionCheckMax`` None = no maximum (3.x, 4.0-4.2); ``transactionCheckInterval`` None = no check
    service (4.0-4.2); ``fileReservedTime`` in hours; ``as_of_ms`` None = the broker's newest record store
    time (the snapshot time of an offline store).
    """

    transactionTimeOut: int = 6000
    transactionCheckMax: Optional[int] = 15
    transactionCheckInterval: Optional[int] = 60000
    fileReservedTime: int = 72
    as_of_ms: Optional[int] = None

    @classmethod
    def for_profile(cls, profile: str, overrides: Optional[Mapping[str, Any]] = None) -> "AuditParams":
        """Defaults of the version line (store-format reference 7.7, 8.3), then ``overrides`` (field
        names)."""
        if profile not in PROFILES:
            raise ValueError(f"unknown profile {profile!r}; expected one of {sorted(PROFILES)}")
        base = {
            # 3.x: checkTransactionMessageAtleastInterval / checkTransactionMessageTimerInterval, no max, 48 h
            P_3X: cls(
                transactionTimeOut=60000,
                transactionCheckMax=None,
                transactionCheckInterval=60000,
                fileReservedTime=48,
            ),
            P_40: cls(transactionTimeOut=6000, transactionCheckMax=None, transactionCheckInterval=None),
            P_43: cls(6000, 15, 60000, 72),
            P_51: cls(6000, 15, 30000, 72),
            P_UNKNOWN: cls(6000, 15, 60000, 72),
        }[profile]
        if overrides:
            known = {f.name for f in fields(cls)}
            bad = set(overrides) - known
            if bad:
                raise ValueError(f"unknown AuditParams field(s) {sorted(bad)}; expected {sorted(known)}")
            base = replace(base, **dict(overrides))
        return base


ParamsArg = Union[None, AuditParams, Mapping[str, AuditParams]]


def params_by_broker(params: ParamsArg, brokers_profiles: Mapping[str, str]) -> dict:
    """{broker: AuditParams} for {broker: profile}: ``params`` None (each profile's defaults), one AuditParams
    for every broker, or a mapping keyed by broker or profile name (a broker entry wins; brokers matching
    neither get their profile's defaults)."""
    by_profile = {prof: AuditParams.for_profile(prof) for prof in PROFILES}
    by_broker: dict = {}
    if isinstance(params, AuditParams):
        by_profile = {prof: params for prof in PROFILES}
    elif params:
        for key, p in params.items():
            if not isinstance(p, AuditParams):
                raise TypeError(f"params[{key!r}] must be AuditParams, got {type(p).__name__}")
            (by_profile if key in PROFILES else by_broker)[key] = p
    return {b: by_broker.get(b) or by_profile.get(prof) for b, prof in brokers_profiles.items()}


def check_override(profile_override) -> None:
    """ValueError for an unknown profile in ``profile_override`` (None, a profile, or {broker: profile})."""
    if profile_override is None:
        return
    if isinstance(profile_override, str):
        if profile_override not in PROFILES:
            raise ValueError(f"unknown profile {profile_override!r}; expected one of {sorted(PROFILES)}")
        return
    for broker, prof in profile_override.items():
        if prof not in PROFILES:
            raise ValueError(f"unknown profile {prof!r} for broker {broker!r}")


def override_for(profile_override, broker: str) -> Optional[str]:
    if profile_override is None:
        return None
    if isinstance(profile_override, str):
        return profile_override
    return profile_override.get(broker)
