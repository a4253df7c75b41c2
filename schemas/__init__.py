"""Column names, types and comments, defined once.

Every table the project reads or writes is a :class:`Table` here.  ``arrow_schema()`` is what the pure-Python
decoders in ``txlog_io`` produce; ``spark_schema()`` is the same definition as a Spark ``StructType`` (pyspark is
imported only when it is asked for, so ``txlog_io`` stays Spark-free); column comments travel into Spark metadata
and Delta table schemas.
"""
from __future__ import annotations

from schemas.core import Column, Table, spark_type_of  # noqa: F401
from schemas.store import (  # noqa: F401
    ANOMALIES,
    COMMITLOG,
    CONSUMEQUEUE,
    CONSUMER_OFFSETS,
    REDOLOG,
    STATETABLE,
    STORE_TABLES,
)
