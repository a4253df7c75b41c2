"""jobs/reconstruct/settle_frames.py (the settle of a state written from the executors, by the distributed
reduction's linked evidence) against jobs/reconstruct/settle.py (the driver's) on the hand-built rows of
tests/test_settle.py: the same records and op bodies kept (a batched op cut to its open pieces), the same
settled rows, facts and consume-queue tuples; and the next run's reduction with them equals the full one."""
from __future__ import annotations

import json

import pyarrow as pa
import pytest

from jobs.reconstruct.reducer import input_table
from jobs.reconstruct.settle import consume_offsets, final_input
from jobs.reconstruct.settle import settle as settle_rows
from schemas.state import STATE_FINAL, STATE_OP_BODIES, STATE_RECORDS
from tests.test_settle import DISC, FILE, OLD, T0, _bodies, _offsets, _plain, _records, _reduce, _sorted

INERT = OLD + [_plain(1100, "%RETRY%CID_" + "g" * 130, T0 + 4, magic=2),
               _plain(1200, "SCHEDULE_TOPIC_XXXX", T0 + 40, kind="COMMIT"),
               _plain(1900, "%RETRY%CID_" + "g" * 130, T0 + 8, magic=2)]
#: one broker per case: (rows, half / op consume offsets, resume offset, CommitLog file bases, damaged)
CASES = {"inert-records": (INERT, (2, 2), 1800, [0, FILE], False),
         "discarded-duplicate": (DISC, (3, 1), FILE, [0, FILE], False),
         "discarded-damaged": (DISC, (3, 1), FILE, [0, FILE], True),
         "two-files": (OLD, (2, 2), FILE, [0, 1000, FILE], False)}


def _rows(t: pa.Table) -> list:
    return sorted((json.dumps(r, sort_keys=True, default=repr) for r in t.to_pylist()))


def _as(broker: str, t: pa.Table) -> pa.Table:
    i = t.schema.get_field_index("broker")
    return t.set_column(i, t.schema.field(i), pa.array([broker] * t.num_rows, pa.string()))


def _nullable(schema):
    """The hand-built rows leave some non-nullable columns empty (op records have no transaction type)."""
    from pyspark.sql import types as T

    return T.StructType([T.StructField(f.name, f.dataType, True) for f in schema.fields])


def test_settle_on_executors_equals_the_driver(spark):
    """Every case a broker of one store set: one distributed reduction, its linked evidence settled on the
    executors, equal broker by broker to settle.settle on the driver (which settles something in each), and
    the next run's reduction with the executors' carried state equal to the full one."""
    from jobs.reconstruct.settle_frames import BrokerSettle, settle_frames
    from jobs.reconstruct.spark import reduce_frame
    from jobs.session import arrow_frame
    from schemas.recon import RECON_INPUT

    records = pa.concat_tables([_as(b, _records(c[0])) for b, c in CASES.items()])
    bodies = _bodies(records)
    offsets = pa.concat_tables([_as(b, _offsets(*c[1])) for b, c in CASES.items()])
    full = _reduce(records, bodies, offsets)
    co = consume_offsets(offsets)
    damaged = [b for b, c in CASES.items() if c[4]]
    want = settle_rows(records, bodies, full["transactions"], co, {b: c[2] for b, c in CASES.items()},
                       {b: c[3] for b, c in CASES.items()}, damaged=damaged)

    table = input_table(commitlog=records.drop_columns(["body"]), op_bodies=bodies, consumer_offsets=offsets)
    result = reduce_frame(arrow_frame(spark, table, schema=RECON_INPUT.spark_schema()), "distributed",
                          op_bodies_given=True, materialize=True, keep_linked=True)
    assert result.linked is not None
    brokers = {b: BrokerSettle(c[2], c[3], *co[b], settles=True, discarded=b not in damaged,
                               inert=b not in damaged) for b, c in CASES.items()}
    got = settle_frames(arrow_frame(spark, records, _nullable(STATE_RECORDS.spark_schema())),
                        arrow_frame(spark, bodies, _nullable(STATE_OP_BODIES.spark_schema())), result.transactions,
                        result.linked, brokers, 3)
    recs, ops, final, facts = got.records.toArrow(), got.op_bodies.toArrow(), got.final.toArrow(), got.facts
    got.unpersist()
    result.linked.unpersist()
    assert set(want.final.column("broker").to_pylist()) == set(CASES)
    assert want.records.num_rows < records.num_rows
    assert _rows(recs) == _rows(want.records)
    assert _rows(ops) == _rows(want.op_bodies)
    assert [(f.name, f.type) for f in final.schema] == [(f.name, f.type) for f in STATE_FINAL.arrow_schema()]
    assert _rows(final) == _rows(want.final)
    assert facts == want.facts
    # the executors' carried state reduces, with the settled rows, to the full reduction
    again = _reduce(recs, ops, offsets, final_input(final, facts), final)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        assert _sorted(again[name]) == _sorted(full[name]), name


@pytest.mark.parametrize("final_as", ["dataframe", "arrow"])
def test_a_torn_end_before_settled_records_on_the_executors(spark, final_as):
    """tests/test_settle.py's torn-end case reduced on the distributed path with the settled transactions
    carried as a DataFrame (the torn-end job reads their record offsets: distributed._past_end) or as Arrow:
    equal to the driver's reduction of every record.  Were the settled records not counted as read, their
    units past the torn end would make a CQ_PAST_DATA_END range over the open transaction E."""
    from jobs.reconstruct.reducer import reduce_input
    from jobs.reconstruct.spark import final_frame, reduce_frame
    from jobs.session import arrow_frame
    from schemas.recon import RECON_INPUT
    from tests.test_settle import B, torn_end_case

    records, bodies, offsets, table = torn_end_case()
    full = reduce_input(table(records, bodies), None, None, 60000, True)
    got = settle_rows(records, bodies, full["transactions"], consume_offsets(offsets), {B: 2 * FILE},
                      {B: [0, FILE, 2 * FILE]})
    assert sorted(got.final.column("uniq_key").to_pylist()) == ["A", "B"]
    want = reduce_frame(arrow_frame(spark, table(records, bodies), schema=RECON_INPUT.spark_schema()), "driver")
    if final_as == "dataframe":
        carried, final = final_input(None, got.facts), final_frame(spark, got.final)
    else:
        carried, final = final_input(got.final, got.facts), got.final
    result = reduce_frame(arrow_frame(spark, table(got.records, got.op_bodies), schema=RECON_INPUT.spark_schema()),
                          "distributed", op_bodies_given=True, materialize=True, carried=carried, final=final)
    assert result.arrow is None
    for name in ("transactions", "check_back", "recovery", "anomalies"):
        rows = [_rows_of(getattr(r, name)) for r in (result, want)]
        assert rows[0] == rows[1], name
    assert "CQ_PAST_DATA_END" not in json.dumps(_rows_of(result.anomalies))


def _rows_of(df) -> list:
    return sorted(json.dumps(r.asDict(recursive=True), sort_keys=True, default=repr) for r in df.collect())
