"""The producer side of the reference broker: producer clients, check requests and the end actions.

Producers are objects with a ``check_listener(CheckRequest) -> "COMMIT" | "ROLLBACK" | "UNKNOWN" | None``
(None = no answer at all) and a ``connected`` flag (unreachable producers get no checks; RocketMQ silently
skips them).  ``Producer.next_uniq_key`` plays MessageClientIDSetter (UNIQ_KEY).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from refbroker import ledger as L
from txlog_io.msgid import create_uniq_key, parse_host

COMMIT, ROLLBACK, UNKNOWN = "COMMIT", "ROLLBACK", "UNKNOWN"


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


__all__ = [
    "Producer",
    "CheckRequest",
    "COMMIT",
    "ROLLBACK",
    "UNKNOWN",
]
