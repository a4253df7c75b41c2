"""Tables as the Spark data sources deliver them: every store table with a leading ``broker`` column.

``jobs.datasources`` reads one or several broker stores at once, so each row says which store it came from.
The columns after ``broker`` are exactly those of the store table in :mod:`schemas.store` (same names, Arrow
types, nullability and comments); nothing here redefines them.
"""
from __future__ import annotations

import pyarrow as pa

from schemas.core import Column, Table
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

#: Spark format name -> row schema of that data source
SOURCE_TABLES = {
    "rocketmq_commitlog": COMMITLOG_SOURCE,
    "rocketmq_consumequeue": CONSUMEQUEUE_SOURCE,
    "rocketmq_statetable": STATETABLE_SOURCE,
    "rocketmq_redolog": REDOLOG_SOURCE,
    "rocketmq_consumer_offsets": CONSUMER_OFFSETS_SOURCE,
    "rocketmq_anomalies": ANOMALIES_SOURCE,
}

__all__ = ["BROKER", "with_broker", "SOURCE_TABLES", "COMMITLOG_SOURCE", "CONSUMEQUEUE_SOURCE",
           "STATETABLE_SOURCE", "REDOLOG_SOURCE", "CONSUMER_OFFSETS_SOURCE", "ANOMALIES_SOURCE"]
