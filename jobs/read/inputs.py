"""What the audit feeds the reconstruction: the CommitLog rows it needs (full mode: the transaction-relevant
ones) and the op records' bodies: taken from the scan's records when it carries them
(``StoreFrames.op_bodies_in_records``), else fetched by position.  Shared by ``jobs.audit.run`` and the incremental
read.
"""
from __future__ import annotations

from jobs.read.frames import op_bodies_from_commitlog, without_bodies
from jobs.read.spec import ReadSpec
from txlog_io.commitlog_layout import OP_TOPIC, TX_SYSTEM_TOPICS


def relevant_records(frames):
    """The CommitLog rows the reconstruction needs (see the module docstring); in indexed mode all of them."""
    from pyspark.sql import functions as F

    if frames.mode != "full":
        return frames.commitlog
    c = F.col
    records = frames.commitlog.where(c("topic").isin(*TX_SYSTEM_TOPICS) | (c("transaction_type") != "NOT")
                                     | (c("magic_version") == 2))
    if getattr(frames, "op_bodies_in_records", False):
        # the op records' bodies go to the reduction apart (op_bodies_for), as a fetched record's would
        records = without_bodies(records)
    return records


def op_bodies_for(spark, records, frames, spec: ReadSpec):
    """Op message bodies (the ``op_bodies`` input of ``reconstruct``) fetched by position for the op records
    in ``records`` -- or None when ``records`` already carry bodies.  A scan of the reducer's columns
    (``frames.op_bodies_in_records``) carries the op records' bodies: they are taken from it, no second read."""
    if spec.include_bodies:
        return None
    from pyspark.sql import functions as F

    if getattr(frames, "op_bodies_in_records", False):
        return op_bodies_from_commitlog(frames.commitlog)
    if getattr(frames, "op_bodies", None) is not None:     # indexed mode: its fetch and gap scan kept them
        return frames.op_bodies

    from jobs.read.frames import fetch_records
    from jobs.sources.formats import COMMITLOG_FORMAT
    from jobs.sources.options import parse_options

    opts = parse_options(COMMITLOG_FORMAT, spec.source_options(include_bodies="true"))
    positions = records.where(F.col("topic") == OP_TOPIC).select(
        "broker", F.col("physical_offset").alias("commitlog_offset"))
    return op_bodies_from_commitlog(fetch_records(spark, positions, frames.layout_info, opts))


__all__ = ["relevant_records", "op_bodies_for", "op_bodies_from_commitlog"]
