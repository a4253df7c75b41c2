"""Names of the half/op transaction model's system topics, checker consumer group and op tag (4.3+).

The names RocketMQ's TransactionalMessageUtil and TopicValidator give them; the check service, the op path,
the topic config and the repair tool (refbroker.repair) use them.
"""

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
DISCARD_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
CHECK_GROUP = "CID_RMQ_SYS_TRANS"
REMOVE_TAG = "d"


__all__ = [
    "HALF_TOPIC",
    "OP_TOPIC",
    "DISCARD_TOPIC",
    "CHECK_GROUP",
    "REMOVE_TAG",
]
