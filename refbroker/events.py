"""The reference broker's simulated time: the clock, the event heap and the loop that runs it.

Time is simulated: ``Clock.now`` is epoch ms; everything that happens later (producer answers to checks, the
periodic services, the workload's own actions) is an event in a heap, run in (time, sequence) order by
``run_until``.  Broker-internal events carry the broker's ``epoch`` and are dropped after a crash (the process
that scheduled them is gone); producer actions survive a crash (a later EndTransaction meets the restarted
broker).

``EventLoop`` is the part of ``refbroker.broker.Broker`` that schedules and runs events and reports
in-simulation faults to the broker's fault collector; ``BrokerDown`` unwinds an operation a crash interrupted.
"""
from __future__ import annotations

import heapq
from typing import Callable, Optional

from refbroker import ledger as L


class BrokerDown(Exception):
    """Raised to unwind an operation interrupted by a crash the workload asked for."""


class Clock:
    """Injectable simulated clock (epoch ms)."""

    def __init__(self, start_ms: int):
        self.now = start_ms


class _Event:
    """One scheduled action; the heap holds ``(time, seq, event)`` tuples (compared in C: seq is unique)."""

    __slots__ = ("time", "seq", "action", "args", "epoch", "txn")

    def __init__(self, time: int, seq: int, action: Callable, args: tuple = (), epoch: Optional[int] = None,
                 txn: Optional[L.Transaction] = None):
        self.time, self.seq, self.action, self.args, self.epoch, self.txn = time, seq, action, args, epoch, txn


class EventLoop:
    """Broker mixin: the event loop on the simulated clock and the fault hook (state set up by
    ``Broker.__init__``: clock, events, epoch, transactions, on_fault)."""

    @property
    def now(self) -> int:
        return self.clock.now

    def schedule(self, time_ms: int, action: Callable, *args, internal: bool = False,
                 txn: Optional[L.Transaction] = None) -> None:
        self._seq += 1
        if txn is not None:
            txn.pending_events += 1
        at = max(time_ms, self.clock.now)
        heapq.heappush(self.events, (at, self._seq, _Event(at, self._seq, action, args,
                                                           self.epoch if internal else None, txn)))

    def run_until(self, time_ms: int) -> None:
        events = self.events
        while events and events[0][0] <= time_ms:
            ev = heapq.heappop(events)[2]
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
            if limit_ms is not None and self.events[0][0] > limit_ms:
                break
            if all(ev.epoch is not None for _, _, ev in self.events) and not self._has_pending_transactions():
                break
            self.run_until(self.events[0][0])

    def _has_pending_transactions(self) -> bool:
        return any(t.pending_events for t in self.transactions.values())

    def _fault(self, fault: dict) -> Optional[str]:
        """Report an in-simulation fault; returns its id (None without a collector)."""
        return self.on_fault(fault) if self.on_fault is not None else None

    def _fault_record(self, fault: dict) -> dict:
        self._fault(fault)
        return fault


__all__ = [
    "EventLoop",
    "Clock",
    "BrokerDown",
]
