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
from dataclasses import dataclass, field
from typing import Callable, Optional

from refbroker import ledger as L


class BrokerDown(Exception):
    """Raised to unwind an operation interrupted by a crash the workload asked for."""


class Clock:
    """Injectable simulated clock (epoch ms)."""

    def __init__(self, start_ms: int):
        self.now = start_ms


@dataclass(order=True)
class _Event:
    time: int
    seq: int
    action: Callable = field(compare=False)
    args: tuple = field(compare=False, default=())
    epoch: Optional[int] = field(compare=False, default=None)
    txn: Optional[L.Transaction] = field(compare=False, default=None)


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


__all__ = [
    "EventLoop",
    "Clock",
    "BrokerDown",
]
