"""jobs/reconstruct/reducer.py: the Spark-free reducer, called directly on Arrow tables (no SparkSession)."""
from __future__ import annotations

import pyarrow as pa

from jobs.reconstruct.params import HALF_TOPIC, OP_TOPIC, AuditParams
from jobs.reconstruct.reducer import input_table, reduce_input
from schemas.audit import AUDIT_TABLES
from schemas.sources import COMMITLOG_SOURCE

BASE = 1_700_000_000_000


def _record(broker, off, topic, ttype="NOT", qo=0, uk=None, body=None, pto=0, real_topic=None, born=BASE,
            check_times=None):
    return {"broker": broker, "file": "00000000000000000000", "file_position": off, "physical_offset": off,
            "total_size": 100, "magic_version": 1, "body_crc": 0, "body_crc_ok": True, "queue_id": 0,
            "flag": 0, "queue_offset": qo, "stored_physical_offset": off, "sys_flag": 0,
            "transaction_type": ttype, "born_timestamp": born, "born_host": "127.0.0.1:1",
            "store_timestamp": born + 10, "store_host": "127.0.0.1:2", "reconsume_times": 0,
            "prepared_transaction_offset": pto, "body_size": 0, "topic": topic, "properties": [],
            "msg_id": f"M{off}", "uniq_key": uk, "tags": None, "keys": f"K-{uk}", "pgroup": "pg",
            "real_topic": real_topic, "real_qid": 0 if real_topic else None, "tran_msg": None,
            "transaction_check_times": check_times, "tran_prepared_queue_offset": None,
            "check_immunity_time_s": None, "transaction_id": None, "tags_code": 0, "compression": "NONE",
            "body": body}


def _store(broker):
    return [
        _record(broker, 0, HALF_TOPIC, "PREPARED", 0, "u1", real_topic="t"),
        _record(broker, 100, HALF_TOPIC, "PREPARED", 1, "u2", real_topic="t"),
        _record(broker, 200, HALF_TOPIC, "PREPARED", 2, "u3", real_topic="t", born=BASE - 600_000),
        _record(broker, 300, "t", "COMMIT", 0, "u2", pto=100, real_topic="t"),
        _record(broker, 400, OP_TOPIC, "NOT", 0, body=b"0"),
        _record(broker, 500, OP_TOPIC, "NOT", 1, body=b"1,9,"),
        _record(broker, 600, "plain", "NOT", 5, "u9"),
    ]


def _commitlog(*brokers):
    return pa.Table.from_pylist([r for b in brokers for r in _store(b)],
                                schema=COMMITLOG_SOURCE.arrow_schema())


PARAMS = AuditParams(6000, 15, 60000, 72, as_of_ms=BASE + 60_000)


def test_reducer_on_arrow_tables():
    out = reduce_input(input_table(commitlog=_commitlog("b")), PARAMS)
    for name, table in (("transactions", "transactions"), ("check_back", "check_back_worklist"),
                        ("recovery", "recovery_worklist"), ("anomalies", "audit_anomalies"),
                        ("profiles", "profiles")):
        assert out[name].schema == AUDIT_TABLES[table].arrow_schema()
    tx = {r["transaction_key"]: r for r in out["transactions"].to_pylist()}
    assert {k: r["state"] for k, r in tx.items()} == {"u1": "ROLLED_BACK", "u2": "COMMITTED",
                                                      "u3": "PREPARED"}
    assert tx["u2"]["commit_offsets"] == [300] and tx["u2"]["op_half_offsets"] == [1]
    assert tx["u1"]["op_queue_offsets"] == [0] and tx["u1"]["resolved_timestamp"] == BASE + 10
    u3 = tx["u3"]
    assert u3["flags"] == ["PREPARED_NEVER_CHECKED", "PREPARED_PAST_TIMEOUT"]
    # 4.3+: greatest(S + I, B + T) + (M - c) * I, capped by B + fileReservedTime
    s, b = BASE - 600_000 + 10, BASE - 600_000
    assert u3["deadline_ms"] == min(max(s + 60000, b + 6000) + 15 * 60000, b + 72 * 3600 * 1000)
    assert [(r["transaction_key"], r["priority"], r["urgency_rank"]) for r in out["check_back"].to_pylist()] \
        == [("u3", "HIGH", 1)]
    assert [(r["code"], r["queue_offset"]) for r in out["anomalies"].to_pylist()] == [("OP_WITHOUT_HALF", 9)]
    prof = out["profiles"].to_pylist()[0]
    assert prof["profile"] == "5.1+" and "1 comma-batched op bodies (5.1+)" in prof["evidence"]


def test_brokers_reduce_independently():
    """What a Spark task does (one broker's rows) equals the all-brokers call, row for row (ranks aside)."""
    together = reduce_input(input_table(commitlog=_commitlog("a", "b")), PARAMS)
    for name in ("transactions", "recovery", "anomalies", "profiles"):
        alone = []
        for broker in ("a", "b"):
            alone += reduce_input(input_table(commitlog=_commitlog(broker)), PARAMS)[name].to_pylist()
        key = lambda r: (r["broker"], str(r.get("transaction_key")), str(r.get("code")))  # noqa: E731
        assert sorted(alone, key=key) == sorted(together[name].to_pylist(), key=key)
    assert [r["urgency_rank"] for r in together["check_back"].to_pylist()] == [1, 2]


def test_op_bodies_given_but_missing_one():
    cl = _commitlog("b")
    ops = cl.filter(pa.compute.equal(cl.column("physical_offset"), 400))
    out = reduce_input(input_table(commitlog=cl.set_column(cl.schema.get_field_index("body"), "body",
                                                           pa.nulls(cl.num_rows, pa.binary())),
                                   op_bodies=ops), PARAMS, op_bodies_given=True)
    codes = sorted((r["code"], r["physical_offset"]) for r in out["anomalies"].to_pylist())
    assert codes == [("OP_BODY_MISSING", 500)]
    tx = {r["transaction_key"]: r["state"] for r in out["transactions"].to_pylist()}
    assert tx == {"u1": "ROLLED_BACK", "u2": "COMMITTED", "u3": "PREPARED"}


def test_sources_split_by_slice_or_filter_alike():
    """input_table's sources come one after the other (split by slices); rows of a source in several runs
    (as a Spark shuffle delivers them) are filtered: same parts, same outputs."""
    from jobs.reconstruct.reducer import _BySrc

    cl = _commitlog("b")
    ops = cl.filter(pa.compute.equal(cl.column("topic"), OP_TOPIC))
    given = input_table(commitlog=cl, op_bodies=ops)
    n_cl = cl.num_rows
    mixed = pa.concat_tables([given.slice(0, 2), given.slice(n_cl, 1), given.slice(2, n_cl - 2),
                              given.slice(n_cl + 1)])
    runs, split = _BySrc(given), _BySrc(mixed)
    assert all(runs[s].equals(split[s]) for s in ("commitlog", "op_body", "statetable"))
    assert runs["statetable"].num_rows == 0 and runs["op_body"].num_rows == ops.num_rows
    want = reduce_input(given, PARAMS, op_bodies_given=True)
    got = reduce_input(mixed, PARAMS, op_bodies_given=True)
    assert all(got[name].equals(want[name]) for name in want)
