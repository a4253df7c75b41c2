"""Tables as the Spark data sources deliver them: every store table with a leading ``broker`` column.

``jobs.sources.formats`` reads one or several broker stores at once, so each row says which store it came from.
The columns after ``broker`` are exactly those of the store table in :mod:`schemas.store` (same names, Arrow
types, nullability and comments); nothing here redefines them.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column, Table
from schemas.recon import RECON_INPUT
from schemas.runs import MESSAGE_BODIES
from schemas.store import ANOMALIES, COMMITLOG, CONSUMEQUEUE, CONSUMER_OFFSETS, REDOLOG, STATETABLE

BROKER = Column("broker", pa.string(), False,
                "broker the store belongs to: option broker/brokers, else the store directory's name "
                "(its parent's name when the directory is literally called 'store')")


def with_broker(table: Table) -> Table:
    """``table`` with the ``broker`` column first (same table name, comment and partitioning)."""
    return table.with_columns(table.name, before=[BROKER])


COMMITLOG_SOURCE = with_broker(COMMITLOG)
CONSUMEQUEUE_SOURCE = with_broker(CONSUMEQUEUE)
STATETABLE_SOURCE = with_broker(STATETABLE)
REDOLOG_SOURCE = with_broker(REDOLOG)
CONSUMER_OFFSETS_SOURCE = with_broker(CONSUMER_OFFSETS)
ANOMALIES_SOURCE = with_broker(ANOMALIES)

#: ``rocketmq_txscan``: ONE pass over CommitLog ranges yields both the transaction-relevant records and the
#: decoder's findings, as rows of this union table (``row_kind`` says which half is set; every other column
#: nullable).  ``jobs.read.frames`` splits it back into COMMITLOG_SOURCE and ANOMALIES_SOURCE rows.
TX_SCAN_RECORD, TX_SCAN_ANOMALY = "record", "anomaly"
ANOMALY_PREFIX = "anomaly_"
TX_SCAN_SOURCE = Table.of("txscan", [
    BROKER,
    Column("row_kind", pa.string(), False, f"'{TX_SCAN_RECORD}' (COMMITLOG columns set) or '{TX_SCAN_ANOMALY}' "
                                           f"(the {ANOMALY_PREFIX}* columns set)"),
    *(Column(c.name, c.type, True, c.comment) for c in COMMITLOG.columns),
    *(Column(ANOMALY_PREFIX + c.name, c.type, True, c.comment) for c in ANOMALIES.columns),
], "Transaction-relevant CommitLog records and decoder findings of one pass")
#: the CommitLog columns every consumer of the audit's records reads: the reconstruction's
#: (``schemas.recon.RECON_INPUT``) and the ``message_bodies`` table's (``schemas.runs.MESSAGE_BODIES``:
#: ``compression``, ``body_size``).  ``tests/test_datasources.py`` resolves every audit select against it.
REDUCER_COLUMNS = tuple(c.name for c in COMMITLOG.columns
                        if c.name in RECON_INPUT.names or c.name in MESSAGE_BODIES.names)
_NOT_REDUCER = [c.name for c in COMMITLOG.columns if c.name not in REDUCER_COLUMNS]
#: ``rocketmq_txscan`` with ``columns=reducer``: the REDUCER_COLUMNS records only; ``body`` holds the op
#: records' bodies (all bodies with ``include_bodies``).  The properties map, hosts, ... never cross into
#: the JVM.
TX_SCAN_REDUCER = TX_SCAN_SOURCE.with_columns("txscan_reducer", exclude=_NOT_REDUCER)
#: the record half of TX_SCAN_REDUCER (``broker`` + those COMMITLOG columns)
COMMITLOG_REDUCER = COMMITLOG_SOURCE.with_columns("commitlog_reducer", exclude=_NOT_REDUCER)

#: Spark format name -> row schema of that data source
SOURCE_TABLES = {
    "rocketmq_commitlog": COMMITLOG_SOURCE,
    "rocketmq_consumequeue": CONSUMEQUEUE_SOURCE,
    "rocketmq_statetable": STATETABLE_SOURCE,
    "rocketmq_redolog": REDOLOG_SOURCE,
    "rocketmq_consumer_offsets": CONSUMER_OFFSETS_SOURCE,
    "rocketmq_anomalies": ANOMALIES_SOURCE,
    "rocketmq_txscan": TX_SCAN_SOURCE,
}

__all__ = ["BROKER", "with_broker", "SOURCE_TABLES", "COMMITLOG_SOURCE", "CONSUMEQUEUE_SOURCE",
           "STATETABLE_SOURCE", "REDOLOG_SOURCE", "CONSUMER_OFFSETS_SOURCE", "ANOMALIES_SOURCE",
           "TX_SCAN_SOURCE", "TX_SCAN_REDUCER", "COMMITLOG_REDUCER", "REDUCER_COLUMNS", "TX_SCAN_RECORD", "TX_SCAN_ANOMALY", "ANOMALY_PREFIX"]
