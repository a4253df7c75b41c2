"""What the audit feeds the reconstruction and how it names its tables: helpers shared by ``jobs.audit`` and
``jobs.incremental`` (which continues an audit from carried evidence), kept below both so neither imports the
other."""
from __future__ import annotations

import json

from schemas.core import Table

RUNS_TABLE = "audit_runs"


def named_table(table: Table, name: str) -> Table:
    """``table`` under another directory name (the sink writes ``<out>/<table.name>``)."""
    return table if table.name == name else Table.of(name, table.columns, table.comment, table.partition_by)



def relevant_records(frames):
    """The CommitLog rows the reconstruction needs (see the module docstring); in indexed mode all of them."""
    from pyspark.sql import functions as F

    from jobs.reconstruct import TX_SYSTEM_TOPICS

    if frames.mode != "full":
        return frames.commitlog
    c = F.col
    return frames.commitlog.where(c("topic").isin(*TX_SYSTEM_TOPICS) | (c("transaction_type") != "NOT")
                                  | (c("magic_version") == 2))


def op_bodies_for(spark, records, frames, options):
    """Op message bodies (the ``op_bodies`` input of ``reconstruct``) fetched by position for the op records
    in ``records`` -- or None when ``records`` already carry bodies."""
    if options.include_bodies:
        return None
    from pyspark.sql import functions as F

    from jobs.datasources import COMMITLOG_FORMAT
    from jobs.options import parse_options
    from jobs.reconstruct import OP_TOPIC, op_bodies_from_commitlog
    from jobs.store_frames import fetch_records

    opts = parse_options(COMMITLOG_FORMAT, {
        "paths": json.dumps(list(options.stores)), "brokers": ",".join(options.brokers),
        "split_bytes": str(int(options.config.split_bytes)), "include_bodies": "true"})
    positions = records.where(F.col("topic") == OP_TOPIC).select(
        "broker", F.col("physical_offset").alias("commitlog_offset"))
    return op_bodies_from_commitlog(fetch_records(spark, positions, frames.layout_info, opts))


def bodies_frame(transactions, records):
    """``message_bodies`` rows: per transaction the body of its first copy, else first COMMIT, else
    discard."""
    from pyspark.sql import functions as F

    from jobs.reconstruct import HALF_QUEUE, conform
    from schemas.runs import MESSAGE_BODIES

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


__all__ = ["RUNS_TABLE", "named_table", "relevant_records", "op_bodies_for", "bodies_frame"]
