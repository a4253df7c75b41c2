"""The ``message_bodies`` table of an audit run (``--include-bodies``): per transaction the body of its
first copy, else its first COMMIT, else its discard record, joined from the records the audit read."""
from __future__ import annotations

from jobs.reconstruct.params import HALF_QUEUE
from schemas.runs import MESSAGE_BODIES


def bodies_frame(transactions, records):
    """``message_bodies`` rows: per transaction the body of its first copy, else first COMMIT, else
    discard."""
    from pyspark.sql import functions as F

    from jobs.reconstruct.spark import conform

    c = F.col
    first_commit = F.array_min(c("commit_offsets"))
    offset = F.coalesce(c("first_copy_commitlog_offset"), first_commit, c("discard_commitlog_offset"))
    record = (F.when(c("first_copy_commitlog_offset").isNotNull(),
                     F.when(c("mechanism") == HALF_QUEUE, F.lit("HALF")).otherwise(F.lit("PREPARED")))
              .when(first_commit.isNotNull(), F.lit("COMMIT"))
              .otherwise(F.lit("DISCARD")))
    picks = transactions.select("broker", "transaction_key", offset.alias("commitlog_offset"),
                                record.alias("record")).where(c("commitlog_offset").isNotNull())
    recs = records.select("broker", c("physical_offset").alias("commitlog_offset"),
                          F.coalesce(c("real_topic"), c("topic")).alias("topic"), "compression", "body_size",
                          "body_crc_ok", "body")
    return conform(picks.join(recs, ["broker", "commitlog_offset"]), MESSAGE_BODIES)


__all__ = ["bodies_frame"]
