"""A half copy whose PGROUP property was damaged keys no transaction its discard, re-put copies or END reach.

The producer puts PGROUP on every transactional message (DefaultMQProducerImpl.sendMessageInTransaction) and
the broker reads it back to check and to end a half (AbstractTransactionalMessageCheckListener.resolveHalfMsg,
EndTransactionProcessor.checkPrepareMessage), so a half copy without it was damaged after the write
(``uncertain.unlinked_half``, as for REAL_TOPIC / REAL_QID).  The case that taught it: fuzz mutant m02043
(seed 46) flipped a bit in the property names PGROUP and ``__transactionId__`` of the first half of the 5.3.3
RocksDB fixture's discarded transaction (CommitLog offset 20,950): that half keyed a transaction of its own,
PREPARED with no flag, in both modes, while its re-put copies and its discard stayed DISCARDED.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from damage_audits import audit_three_ways, by_key, flipped_copy, silent_changes

UNCERTAIN = "STATE_UNCERTAIN_DAMAGED_RANGE"
DAMAGE = {"CORRUPT_RECORD", UNCERTAIN, "CQ_MISMATCH", "PREPARED_RECORD_MISSING"}
STORE = Path(__file__).resolve().parent / "data" / "fixtures" / "rocketmq-5.3.3-rocksdb" / "store"
DATA = Path("commitlog") / "00000000000000000000"
HALF_AT, HALF_SIZE = 20950, 648
KEY = "C000020258044E0E2F2A89C4319B0002"
#: 'PGROUP' -> 'PgROUP' in the half's properties; the mutant also turned '__transactionId__' into '_^...'
FLIPS = {"pgroup": {21426: 0x20}, "mutant": {21426: 0x20, 21443: 0x01}}


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pgroup")
    roots = {"intact": str(STORE), **{b: flipped_copy(STORE, tmp / b, DATA, f) for b, f in FLIPS.items()}}
    return audit_three_ways(spark, roots)


@pytest.mark.spark
@pytest.mark.parametrize("broker", sorted(FLIPS))
@pytest.mark.parametrize("mode", ("full", "indexed", "distributed"))
def test_a_half_without_its_producer_group_is_flagged(audits, mode, broker):
    got = audits[mode]
    intact = by_key(got, "intact")
    assert intact[KEY]["state"] == "DISCARDED"
    mine = [t for t in got["transactions"] if t["broker"] == broker and t["transaction_key"] == KEY]
    by_state = {t["state"]: set(t["flags"]) for t in mine}
    # the damaged half keys a transaction of its own, which says its state rests on that damage; the copies
    # and the discard keep the transaction DISCARDED, its first half missing
    assert len(mine) == 2 and set(by_state) == {"DISCARDED", "PREPARED"}, mine
    assert UNCERTAIN in by_state["PREPARED"] and "PREPARED_RECORD_MISSING" in by_state["DISCARDED"], mine
    for t in mine:
        assert not silent_changes(intact, {KEY: t}, DAMAGE)
    marks = [a for a in got["anomalies"] if a["broker"] == broker and a["code"] == UNCERTAIN]
    assert [(a["transaction_key"], a["physical_offset"], a["length"]) for a in marks] == [(KEY, HALF_AT, HALF_SIZE)]
    assert "PGROUP" in marks[0]["detail"]
