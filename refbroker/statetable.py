"""The 3.x transaction state of the reference broker: statetable check timers and the statetable rebuild.

``StateTableService`` is the part of ``refbroker.broker.Broker`` that plays 3.1.4's TransactionStateService:
one timer per statetable file (first run 60 s after the file appears, then every transactionCheckInterval)
that checks every PREPARED unit, and the rebuild of the statetable from the redolog after an abnormal restart
(recreateStateTable, with the 3.1.4 index/byte mix-up).  The statetable and redolog files themselves are
written by the store (refbroker.store, refbroker.mappedfiles).
"""
from __future__ import annotations

from refbroker import ledger as L
from txlog_io import properties as P
from txlog_io.consumequeue import STATE_PREPARED

STATETABLE_FIRST_CHECK_DELAY = 60_000       # 3.1.4 TransactionStateService: first timer run, hard-coded


class StateTableService:
    """Broker mixin: 3.x statetable timers and recreateStateTable."""

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


__all__ = [
    "StateTableService",
]
