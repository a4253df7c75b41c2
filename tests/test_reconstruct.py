"""jobs/reconstruct/spark.py: transaction state reconstruction, flags and work lists.

ONE reconstruct(materialize=True) over many brokers carries the assertions (every rule groups by broker, so
the brokers of one run are independent; one plan to analyse instead of several); its outputs are collected
once:

* the three real-broker fixtures, frames built from their truth/ files (tests/truth_frames.py), judged with
  each fixture's own broker settings (README) and as_of = the fixture's newest store time, i.e. the moment the
  broker was shut down: "what would the auditor have said about this store at that moment".  Every
  transaction's state is compared with the intended client outcome (workload_client_side.json); where the
  README documents that the real broker diverged (5.3.3 op batching: duplicate commits, commit/rollback +
  discard), the flags are asserted instead, from counts derived independently from truth/commitlog.jsonl.gz;
* the same rows under other broker names judged at a later as_of (LATER);
* the real stores decoded by jobs.read.frames.load_store_frames (REAL): must reconstruct exactly like the
  truth;
* tiny hand-built stores (tests/reconstruct_scenarios.py), one broker per scenario (op body forms, copy grouping, commit via the newest copy,
  duplicate commit, commit without op, orphan op, op below the consume offset, conflicting ends, discards and
  resumes, deleted ranges, CQ mismatch, corruption, immunity, deadlines, 3.x statetable disagreements,
  4.0-4.2).
"""

from __future__ import annotations

import base64
import functools
import gzip
import json
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest
import truth_frames as tf
from reconstruct_scenarios import DT, SCENARIO_BROKERS, scenario_rows

from jobs.reconstruct.flags import ANOMALY_ONLY, FLAGS, RECOVERY_ACTIONS
from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, RECOVERY, TRANSACTIONS
from schemas.audit import PROFILES as PROFILES_TABLE

pytestmark = pytest.mark.spark

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
V314, V498, V533 = "rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3"

INTENDED_STATE = {
    "commit": "COMMITTED",
    "check_commit": "COMMITTED",
    "check2_commit": "COMMITTED",
    "immunity_commit": "COMMITTED",
    "rollback": "ROLLED_BACK",
    "check_rollback": "ROLLED_BACK",
    "check2_rollback": "ROLLED_BACK",
    "immunity_rollback": "ROLLED_BACK",
    "unknown_discard": "DISCARDED",
    "inflight_unknown": "PREPARED",
    "unknown": "PREPARED",
}


def _collect(df):
    return [r.asDict(recursive=True) for r in df.collect()]


def _result_dicts(result):
    out = {
        "transactions": _collect(result.transactions),
        "check_back": _collect(result.check_back),
        "recovery": _collect(result.recovery),
        "anomalies": _collect(result.anomalies),
        "profiles": _collect(result.profiles),
    }
    return out


# ------------------------------------------------------------------------------------------------------------
# Real-broker fixtures
# ------------------------------------------------------------------------------------------------------------


def fixture_params():
    """Each fixture broker's own transaction settings (from its README), as_of = its newest store time."""
    from jobs.reconstruct.spark import AuditParams

    as_of = {v: tf.max_store_timestamp(FIXTURES / v) for v in (V314, V498, V533)}
    return {
        # 3.1.4 defaults: checkTransactionMessageAtleastInterval 60 s, no max, fileReservedTime 48 h
        V314: AuditParams.for_profile("3.x", {"as_of_ms": as_of[V314]}),
        V498: AuditParams.for_profile(
            "4.3-5.0",
            {
                "transactionTimeOut": 2000,
                "transactionCheckInterval": 1000,
                "transactionCheckMax": 4,
                "as_of_ms": as_of[V498],
            },
        ),
        V533: AuditParams.for_profile(
            "5.1+",
            {
                "transactionTimeOut": 1000,
                "transactionCheckInterval": 1000,
                "transactionCheckMax": 3,
                "as_of_ms": as_of[V533],
            },
        ),
    }


#: copies of two fixtures judged at a later as_of (same rows, broker renamed): 3.1.4 one hour after shutdown,
#: 4.9.8 73 h after (past its 72 h fileReservedTime)
LATER = {f"{V314}@+1h": (V314, 3600 * 1000), f"{V498}@+73h": (V498, 73 * 3600 * 1000)}
#: the real stores decoded by jobs.read.frames (indexed mode, the jobs' default; full mode is the truth's
#: equivalent: every record) under these broker names
REAL = {f"{mode}-{v}": (mode, v) for mode in ("indexed",) for v in (V314, V498, V533)}


def real_store_frames(spark):
    """jobs.read.frames.load_store_frames over the three fixture stores, per mode of REAL (bodies decoded, so
    op bodies come with the records); -> (frames by table, commitlog bounds) or (None, error text)."""
    try:
        from jobs.read.frames import load_store_frames
        from jobs.reconstruct.spark import commitlog_bounds_from_layout

        out, bounds = {}, []
        for mode in sorted({m for m, _ in REAL.values()}):
            names = [b for b, (m, _) in REAL.items() if m == mode]
            sf = load_store_frames(
                spark,
                [str(FIXTURES / REAL[b][1] / "store") for b in names],
                mode=mode,
                brokers=names,
                include_bodies=True,
            )
            for name in tf.TABLES:
                df = getattr(sf, name)
                out[name] = df if name not in out else out[name].unionByName(df)
            bounds.append(commitlog_bounds_from_layout(spark, sf.layout_info))
        # decode once (as jobs.audit.run persists its inputs): reconstruct reads its inputs more than once
        out = {name: df.localCheckpoint() for name, df in out.items()}
        return out, functools.reduce(lambda a, b: a.unionByName(b), bounds)
    except Exception as exc:  # reported by the real-store tests; the other tests still run
        return None, f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def frames(spark):
    """The fixture brokers (from truth/), their LATER copies, every scenario broker and the REAL decoded
    stores, in one set of frames."""
    rows = tf.truth_rows({v: FIXTURES / v for v in (V314, V498, V533)})
    for later, (v, _) in LATER.items():
        for name in tf.TABLES:
            rows[name] += [dict(r, broker=later) for r in rows[name] if r["broker"] == v]
    for name, extra in scenario_rows().items():
        rows[name] += extra
    frames = tf.frames_from_rows(spark, rows)
    real, bounds = real_store_frames(spark)
    frames["real_error"] = bounds if real is None else None
    if real is not None:
        frames = {k: (v.unionByName(real[k]) if k in real else v) for k, v in frames.items()}
        frames["commitlog_bounds"] = bounds
    return frames


@pytest.fixture(scope="module")
def audit(frames):
    """ONE reconstruct over every broker of ``frames`` (one Spark plan, intermediates materialized, each
    output collected once): fixtures and their decoded stores judged with their README settings and as_of =
    shutdown (LATER: shifted), scenarios with 4.3.1+ defaults and as_of 10 s after the epoch."""
    from jobs.reconstruct.spark import reconstruct

    result = reconstruct({k: v for k, v in frames.items() if k != "real_error"}, audit_params(),
                         materialize=True)
    return _result_dicts(result)


def audit_params():
    from jobs.reconstruct.spark import AuditParams

    base = fixture_params()
    scenario = AuditParams(6000, 15, 60000, 72, as_of_ms=10_000)
    params = {**base, **{b: scenario for b in SCENARIO_BROKERS}}
    params.update({b: base[v] for b, (_, v) in REAL.items()})
    params.update({b: replace(base[v], as_of_ms=base[v].as_of_ms + shift) for b, (v, shift) in LATER.items()})
    return params


@pytest.mark.parametrize("path", ["broker", "distributed"])
def test_executor_path_equals_driver_path(frames, audit, path):
    """The same reducer shuffled per broker (groupBy(broker).applyInArrow), or linked with Spark joins and
    reduced per partition of transactions (distributed), re-ranked across brokers, gives exactly the driver
    path's rows, urgency ranks included."""
    from jobs.reconstruct.spark import reconstruct

    result = reconstruct({k: v for k, v in frames.items() if k != "real_error"}, audit_params(),
                         materialize=True, path=path)
    assert result.arrow is None and result.path == path
    got = _result_dicts(result)
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        key = repr
        assert sorted(map(key, got[name])) == sorted(map(key, audit[name])), name
    assert len(audit["transactions"]) > 100


def _only(out, brokers):
    return {k: [r for r in v if r["broker"] in brokers] for k, v in out.items()}


@pytest.fixture(scope="module")
def truth_audit(audit):
    return _only(audit, {V314, V498, V533})


def truth_records(version):
    with gzip.open(FIXTURES / version / "truth" / "commitlog.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def truth_expectations(version):
    """Per KEYS (DTX-n), derived straight from the truth records (independently of the Spark code):
    commits (real-topic COMMIT records), discards, half copies and the newest copy."""
    recs = truth_records(version)
    exp = defaultdict(lambda: {"commits": 0, "discards": 0, "copies": [], "rollbacks": 0})
    for r in recs:
        key = r["properties"].get("KEYS")
        if not key or not key.startswith("DTX-"):
            continue
        topic = r["topic"]
        if r["tranType"] == 8 and not topic.startswith("%") and topic != "SCHEDULE_TOPIC_XXXX":
            exp[key]["commits"] += 1
        elif r["tranType"] == 12:
            exp[key]["rollbacks"] += 1
        elif topic == "TRANS_CHECK_MAX_TIME_TOPIC":
            exp[key]["discards"] += 1
            exp[key]["discard_msg_id"] = r["msgId"]
        elif topic == "RMQ_SYS_TRANS_HALF_TOPIC" or r["tranType"] == 4:
            exp[key]["copies"].append(r)
    return exp


def tx_by_keys(audit, broker):
    rows = [t for t in audit["transactions"] if t["broker"] == broker]
    by_keys = defaultdict(list)
    for t in rows:
        by_keys[t["keys"]].append(t)
    return rows, by_keys


def test_profiles_detected_per_store(truth_audit):
    prof = {p["broker"]: p for p in truth_audit["profiles"]}
    assert {b: p["profile"] for b, p in prof.items()} == {V314: "3.x", V498: "4.3-5.0", V533: "5.1+"}
    assert all(p["profile"] == p["detected_profile"] for p in prof.values())
    assert any("comma-batched" in e for e in prof[V533]["evidence"])
    assert any("statetable" in e for e in prof[V314]["evidence"])


@pytest.mark.parametrize("version", [V314, V498, V533])
def test_every_transaction_matches_the_intended_outcome(truth_audit, version):
    intended = tf.intended_outcomes(FIXTURES / version)
    exp = truth_expectations(version)
    rows, by_keys = tx_by_keys(truth_audit, version)
    assert len(rows) == len(intended), "one row per transaction, nothing else"
    assert set(by_keys) == set(intended)
    for key, cls in intended.items():
        (t,) = by_keys[key]
        e = exp[key]
        assert t["state"] == INTENDED_STATE[cls], (key, cls, t["state"], t["flags"])
        assert len(t["commit_offsets"]) == e["commits"], key
        assert t["copies"] == len(e["copies"]), key
        newest = max(e["copies"], key=lambda r: r["physicalOffset"])
        first = min(e["copies"], key=lambda r: r["physicalOffset"])
        assert t["newest_copy_commitlog_offset"] == newest["physicalOffset"]
        assert t["newest_copy_queue_offset"] == newest["queueOffset"]
        assert t["prepared_commitlog_offset"] == first["physicalOffset"]
        assert t["born_timestamp"] == first["bornTimestamp"]
        assert t["producer_group"] == first["properties"]["PGROUP"]
        # documented real-broker divergences are flagged, and nothing else is
        assert ("DUPLICATE_COMMIT" in t["flags"]) == (e["commits"] > 1), key
        resolved = e["commits"] > 0 or t["state"] == "ROLLED_BACK"
        assert ("DISCARDED_WITH_RESOLUTION" in t["flags"]) == (e["discards"] > 0 and resolved), key
        expected = {"PREPARED_PAST_TIMEOUT"} if t["state"] == "PREPARED" else set()
        if e["commits"] > 1:
            expected.add("DUPLICATE_COMMIT")
        if e["discards"] and resolved:
            expected.add("DISCARDED_WITH_RESOLUTION")
        if cls == "inflight_unknown" and version == V314:
            expected = set()  # sent just before shutdown: younger than the 60 s 3.x timeout at as_of
        assert set(t["flags"]) == expected, (key, cls, t["flags"])
        if t["state"] == "DISCARDED":
            assert t["discard_msg_id"] == e["discard_msg_id"]
        if version == V314:
            assert t["uniq_key"] is None and t["transaction_key"] == str(first["physicalOffset"])
            assert t["mechanism"] == "PREPARED_RECORD"
        else:
            assert t["transaction_key"] == t["uniq_key"] == first["properties"]["UNIQ_KEY"]
            assert t["mechanism"] == "HALF_QUEUE"


def test_state_counts_per_fixture(truth_audit):
    counts = Counter((t["broker"], t["state"]) for t in truth_audit["transactions"])
    assert counts == {
        (V314, "COMMITTED"): 15,
        (V314, "ROLLED_BACK"): 20,
        (V314, "PREPARED"): 7,
        (V498, "COMMITTED"): 30,
        (V498, "ROLLED_BACK"): 21,
        (V498, "DISCARDED"): 6,
        (V498, "PREPARED"): 3,
        (V533, "COMMITTED"): 29,
        (V533, "ROLLED_BACK"): 13,
        (V533, "DISCARDED"): 6,
        (V533, "PREPARED"): 4,
    }
    dup = Counter(t["broker"] for t in truth_audit["transactions"] if "DUPLICATE_COMMIT" in t["flags"])
    dwr = Counter(
        t["broker"] for t in truth_audit["transactions"] if "DISCARDED_WITH_RESOLUTION" in t["flags"]
    )
    assert dup == {V533: 22} and dwr == {
        V533: 40
    }  # README: 6+10+6 duplicate, 6+6+10+6+6+6 commit/rollback+discard


def test_3x_matches_transactions_expected(truth_audit):
    rows, _ = tx_by_keys(truth_audit, V314)
    by_offset = {t["prepared_commitlog_offset"]: t for t in rows}
    for line in (FIXTURES / V314 / "truth" / "transactions_expected.jsonl").read_text().splitlines():
        e = json.loads(line)
        t = by_offset[e["prepared_commitlog_offset"]]
        assert t["state"] == e["state_from_commitlog"]
        assert t["statetable_index"] == e["statetable"][0]["index"] == e["prepared_queue_offset_field"]
        assert t["statetable_state"] == e["statetable"][0]["stateName"]
        ends = e["end_records"]
        assert t["commit_offsets"] == sorted(x["commitlog_offset"] for x in ends if x["type"] == "COMMIT")
        assert t["rollback_offsets"] == sorted(x["commitlog_offset"] for x in ends if x["type"] == "ROLLBACK")
        assert t["redolog_state"] == (
            "PREPARED" if e["state_from_redolog"] == "PREPARED" else ends[0]["type"]
        )
        assert e["flags"] == []


def test_op_offsets_are_half_queue_offsets(truth_audit):
    """Every 4.9.8/5.3.3 op names a half-queue offset of a copy of its transaction, and the op queue offsets
    match."""
    for version in (V498, V533):
        ops = defaultdict(set)
        for r in truth_records(version):
            if r["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC":
                for piece in base64.b64decode(r["body_b64"]).decode().split(","):
                    if piece:
                        ops[int(piece)].add(r["queueOffset"])
        rows, _ = tx_by_keys(truth_audit, version)
        named = {h for t in rows for h in t["op_half_offsets"]}
        assert named == set(ops)
        for t in rows:
            assert set(t["op_queue_offsets"]) == {q for h in t["op_half_offsets"] for q in ops[h]}


def test_check_back_worklist_on_fixtures(truth_audit):
    """as_of = shutdown time: 3.1.4's 5 'unknown' keys are older than the 60 s 3.x timeout (its 2 in-flight
    ones, sent just before shutdown, are not yet due); 4.9.8's 3 and 5.3.3's 4 in-flight keys are past their 2
    s / 1 s timeout with 3 < 4 / 2 < 3 checks.  Nothing else is PREPARED."""
    cb = truth_audit["check_back"]
    intended = {v: tf.intended_outcomes(FIXTURES / v) for v in (V314, V498, V533)}
    tx = {(t["broker"], t["transaction_key"]): t for t in truth_audit["transactions"]}
    got = Counter(
        (r["broker"], intended[r["broker"]][tx[(r["broker"], r["transaction_key"])]["keys"]]) for r in cb
    )
    assert got == {(V314, "unknown"): 5, (V498, "inflight_unknown"): 3, (V533, "inflight_unknown"): 4}
    ranks = [r["urgency_rank"] for r in cb]  # global over all brokers of the run (scenarios included)
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    order = [({"CRITICAL": 0, "HIGH": 1}.get(r["priority"], 2), r["deadline_ms"], -r["age_ms"]) for r in cb]
    assert order == sorted(order)
    for r in cb:
        t = tx[(r["broker"], r["transaction_key"])]
        assert r["commitlog_offset"] == t["newest_copy_commitlog_offset"]
        assert r["offset_msg_id"] == t["newest_copy_msg_id"]
        assert r["producer_group"] == t["producer_group"]
        if r["broker"] == V314:
            assert r["tran_state_table_offset"] == t["statetable_index"] == t["newest_copy_queue_offset"]
            assert r["request_topic"] == "TopicTx" and r["msg_id"] == t["newest_copy_msg_id"]
        else:
            assert r["tran_state_table_offset"] == t["newest_copy_queue_offset"]
            assert r["request_topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"
            assert r["msg_id"] == r["transaction_id"] == t["uniq_key"]
            assert r["check_times"] == t["newest_copy_check_times"]
    # 4.9.8: newest copy has 3 checks of max 4 -> one more pass checks, the next discards: deadline within 2 s
    assert all(r["priority"] == "CRITICAL" for r in cb if r["broker"] != V314)


def test_recovery_worklist_on_fixtures(truth_audit):
    rec = truth_audit["recovery"]
    assert Counter((r["broker"], r["action"]) for r in rec) == {
        (V498, "RESUME_DISCARDED"): 6,
        (V533, "RESUME_DISCARDED"): 6,
        (V533, "REVIEW_DUPLICATE_COMMIT"): 22,
    }
    exp = {v: truth_expectations(v) for v in (V498, V533)}
    tx = {(t["broker"], t["transaction_key"]): t for t in truth_audit["transactions"]}
    for r in rec:
        t = tx[(r["broker"], r["transaction_key"])]
        if r["action"] == "RESUME_DISCARDED":
            assert r["state"] == "DISCARDED" and r["resume_topic"] == "TRANS_CHECK_MAX_TIME_TOPIC"
            assert r["resume_msg_id"] == exp[r["broker"]][t["keys"]]["discard_msg_id"]
        else:
            assert r["state"] == "COMMITTED" and len(r["commit_offsets"]) > 1 and r["resume_msg_id"] is None
        assert r["actions"][0] == r["action"] and r["reason"]


def test_truth_stores_have_no_findings(truth_audit):
    assert truth_audit["anomalies"] == []


def test_output_schemas(truth_audit):
    # the collected dicts carry exactly the schema's columns
    for name, table in (
        ("transactions", TRANSACTIONS),
        ("check_back", CHECK_BACK),
        ("recovery", RECOVERY),
        ("profiles", PROFILES_TABLE),
    ):
        assert list(truth_audit[name][0]) == table.names, name
    assert AUDIT_ANOMALIES.names == [
        "broker",
        "code",
        "source",
        "physical_offset",
        "topic",
        "queue_id",
        "queue_offset",
        "transaction_key",
        "file",
        "position",
        "length",
        "detail",
    ]


# ------------------------------------------------------------------------------------------------------------
# Later as_of, and the real stores decoded by jobs.read.frames
# ------------------------------------------------------------------------------------------------------------


def test_later_as_of(audit):
    """One hour after shutdown the two 3.1.4 in-flight keys are due too; 73 h after, the 4.9.8 in-flight keys
    are past fileReservedTime and their deadline: no longer check-back material but REDRIVE_EXPIRED."""
    b314, b498 = list(LATER)
    cb = Counter(r["broker"] for r in audit["check_back"])
    assert cb[b314] == 7 and cb[b498] == 0
    tx = [t for t in audit["transactions"] if t["broker"] == b498 and t["state"] == "PREPARED"]
    assert len(tx) == 3
    assert all(
        set(t["flags"]) == {"PREPARED_PAST_TIMEOUT", "AGE_PAST_FILE_RESERVED_TIME", "PAST_DEADLINE"}
        for t in tx
    )
    rec = Counter((r["broker"], r["action"]) for r in audit["recovery"] if r["broker"] in LATER)
    assert rec == {(b498, "REDRIVE_EXPIRED"): 3, (b498, "RESUME_DISCARDED"): 6}


def _real_or_fail(frames):
    if frames["real_error"]:
        pytest.fail(f"jobs.read.frames.load_store_frames failed: {frames['real_error']}")


@pytest.mark.parametrize("mode", sorted({m for m, _ in REAL.values()}))
def test_real_stores_reconstruct_like_the_truth(audit, frames, mode):
    """The stores decoded by jobs.read.frames give exactly the transactions, work lists and findings that the
    truth (RocketMQ's own decoding) gives."""
    from pyspark.sql import Row
    from pyspark.testing import assertDataFrameEqual

    _real_or_fail(frames)

    def rows(name, broker, drop):
        return [
            Row(**{k: v for k, v in d.items() if k not in drop}) for d in audit[name] if d["broker"] == broker
        ]

    for v in (V314, V498, V533):
        real = f"{mode}-{v}"
        assert len(rows("transactions", real, ())) == len(tf.intended_outcomes(FIXTURES / v))
        for name, drop in (
            ("transactions", {"broker"}),
            ("check_back", {"broker", "urgency_rank"}),
            ("recovery", {"broker"}),
            ("anomalies", {"broker"}),
        ):
            assertDataFrameEqual(rows(name, real, drop), rows(name, v, drop))
        prof = {p["broker"]: p["profile"] for p in audit["profiles"]}
        assert prof[real] == prof[v]


# ------------------------------------------------------------------------------------------------------------
# Hand-built scenarios (one broker each)
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def scenarios(audit):
    out = _only(audit, set(SCENARIO_BROKERS))
    tx = defaultdict(dict)
    for t in out["transactions"]:
        tx[t["broker"]][t["transaction_key"]] = t
    out["tx"] = tx
    return out


def _recovery(scen, broker):
    return {r["transaction_key"]: r for r in scen["recovery"] if r["broker"] == broker}


def _check_back(scen, broker):
    return {r["transaction_key"]: r for r in scen["check_back"] if r["broker"] == broker}


def _findings(scen, broker):
    return sorted((a["code"], a["queue_offset"]) for a in scen["anomalies"] if a["broker"] == broker)


def test_commit_joins_via_the_newest_copy(scenarios):
    (t,) = scenarios["tx"]["s-newest"].values()
    assert t["state"] == "COMMITTED" and t["flags"] == []
    assert (t["copies"], t["first_copy_commitlog_offset"], t["newest_copy_commitlog_offset"]) == (2, 0, 100)
    assert (t["commit_offsets"], t["op_half_offsets"], t["op_queue_offsets"]) == ([200], [1], [0])
    assert t["check_times"] == 1 and t["resolved_timestamp"] == 200 and t["open_copy_offsets"] == []


def test_grouping_of_copies(scenarios):
    tx = [t for t in scenarios["transactions"] if t["broker"] == "s-group"]
    # (U1, PG, T) x2 copies, (U1, OTHER, T), (U1, PG, T2), and the copy without UNIQ_KEY keyed by its offset
    assert sorted((t["transaction_key"], t["producer_group"], t["real_topic"], t["copies"]) for t in tx) == [
        ("400", "PG", "T", 1),
        ("U1", "OTHER", "T", 1),
        ("U1", "PG", "T", 2),
        ("U1", "PG", "T2", 1),
    ]
    by = {(t["transaction_key"], t["producer_group"], t["real_topic"]): t for t in tx}
    assert by[("400", "PG", "T")]["state"] == "ROLLED_BACK"  # op names its queue offset 4
    assert by[("U1", "PG", "T")]["commit_offsets"] == []  # the %RETRY% COMMIT copy is not a commit
    assert all(t["state"] == "PREPARED" for k, t in by.items() if k != ("400", "PG", "T"))


def test_duplicate_commit(scenarios):
    (t,) = scenarios["tx"]["s-dup"].values()
    assert t["state"] == "COMMITTED" and t["flags"] == ["DUPLICATE_COMMIT"]
    assert t["commit_offsets"] == [200, 300] and t["op_half_offsets"] == [0, 1]
    assert _recovery(scenarios, "s-dup")["U2"]["action"] == "REVIEW_DUPLICATE_COMMIT"


def test_commit_without_op(scenarios):
    (t,) = scenarios["tx"]["s-noop"].values()
    assert t["state"] == "COMMITTED"
    assert t["flags"] == ["COMMIT_WITHOUT_OP", "RESOLVED_COPY_PENDING_CHECK"]
    r = _recovery(scenarios, "s-noop")["U3"]
    assert r["action"] == "MARK_DONE" and r["mark_done_half_offsets"] == [0]


def test_orphan_ops(scenarios):
    assert _findings(scenarios, "s-orphan") == [
        ("EVIDENCE_IN_DELETED_RANGE", 2),
        ("OP_BODY_UNPARSABLE", None),
        ("OP_WITHOUT_HALF", 99),
    ]
    (t,) = scenarios["tx"]["s-orphan"].values()
    assert t["state"] == "PREPARED" and t["op_half_offsets"] == []


def test_op_below_half_consume_offset(scenarios):
    (t,) = scenarios["tx"]["s-below"].values()
    assert t["state"] == "ROLLED_BACK" and t["flags"] == ["OP_BELOW_HALF_CONSUME_OFFSET"]


def test_conflicting_ends(scenarios):
    (t,) = scenarios["tx"]["s-conflict"].values()
    assert t["state"] == "COMMITTED" and t["flags"] == ["CONFLICTING_ENDS"]
    assert _recovery(scenarios, "s-conflict")["U6"]["action"] == "REVIEW_CONFLICTING_ENDS"


def test_discarded_without_resolution(scenarios):
    (t,) = scenarios["tx"]["s-discard"].values()
    assert t["state"] == "DISCARDED" and t["discard_commitlog_offset"] == 200 and t["discards"] == 1
    r = _recovery(scenarios, "s-discard")["U7"]
    assert r["action"] == "RESUME_DISCARDED" and r["resume_topic"] == DT
    assert r["resume_msg_id"] == "7F00000100002A9F00000000000000C8"


def test_evidence_in_deleted_range(scenarios):
    tx = scenarios["tx"]["s-deleted"]
    r = tx["U19"]
    assert (r["state"], r["copies"], r["prepared_commitlog_offset"]) == ("ROLLED_BACK", 1, 5200)
    assert r["flags"] == ["EVIDENCE_IN_DELETED_RANGE"]
    t = tx["U8"]
    assert t["state"] == "COMMITTED" and t["copies"] == 0 and t["transaction_key"] == "U8"
    assert t["prepared_commitlog_offset"] == 100 and t["flags"] == ["EVIDENCE_IN_DELETED_RANGE"]
    assert _recovery(scenarios, "s-deleted")["U8"]["action"] == "REVIEW_EVIDENCE"


def test_cq_mismatch(scenarios):
    tx = scenarios["tx"]["s-cq"]
    assert set(tx["U9"]["flags"]) == {"CQ_MISMATCH", "PREPARED_NEVER_CHECKED", "PREPARED_PAST_TIMEOUT"}
    assert "CQ_MISMATCH" in tx["U10"]["flags"]
    assert [c for c, _ in _findings(scenarios, "s-cq")] == ["CQ_MISMATCH", "CQ_MISMATCH"]


def test_corrupt_record(scenarios):
    (t,) = scenarios["tx"]["s-corrupt"].values()
    assert "CORRUPT_RECORD" in t["flags"]


def test_end_naming_another_transactions_copy(scenarios):
    """A COMMIT record carrying U20's UNIQ_KEY names (PREPARED_TRANSACTION_OFFSET) a copy keyed UX20: both
    transactions CORRUPT_RECORD; U20, PREPARED by absence, STATE_UNCERTAIN_DAMAGED_RANGE over the COMMIT
    record and a check-back; U21 (also rolled back by an op on its original copy) UNKNOWN_DAMAGED."""
    tx, rec = scenarios["tx"]["s-xkey"], _recovery(scenarios, "s-xkey")
    got = {k: (t["state"], "CORRUPT_RECORD" in t["flags"], "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"],
               rec[k]["action"] if k in rec else None) for k, t in tx.items()}
    assert got == {
        "U20": ("PREPARED", True, True, "CHECK_BACK_DAMAGED"),
        "UX20": ("COMMITTED", True, False, "REVIEW_EVIDENCE"),
        "U21": ("UNKNOWN_DAMAGED", True, True, "CHECK_BACK_DAMAGED"),
        "UX21": ("COMMITTED", True, False, "REVIEW_EVIDENCE"),
        "U22": ("COMMITTED", False, False, None),
    }
    assert tx["U22"]["flags"] == []
    marks = sorted((a["transaction_key"], a["physical_offset"], a["length"]) for a in scenarios["anomalies"]
                   if a["broker"] == "s-xkey")
    assert marks == [("U20", 200, 100), ("U21", 600, 100)]
    assert "U21" in _check_back(scenarios, "s-xkey")


def test_deadlines_and_check_back_priorities(scenarios):
    tx, cb, rec = (
        scenarios["tx"]["s-deadline"],
        _check_back(scenarios, "s-deadline"),
        _recovery(scenarios, "s-deadline"),
    )
    # never checked: first pass one interval after the copy (0 + 60 s), then 15 re-puts, the next pass
    # discards
    assert tx["U12"]["deadline_ms"] == 60_000 + 15 * 60_000
    assert set(tx["U12"]["flags"]) == {"PREPARED_PAST_TIMEOUT", "PREPARED_NEVER_CHECKED"}
    assert cb["U12"]["priority"] == "HIGH" and cb["U12"]["tran_state_table_offset"] == 0
    # at check max: the next pass (newest copy at 50 s + 60 s) discards it -> recovery, not check-back
    assert tx["U13"]["deadline_ms"] == 110_000 and "AT_CHECK_MAX" in tx["U13"]["flags"]
    assert "U13" not in cb and rec["U13"]["action"] == "REDRIVE_EXPIRED"
    # immunity 60 s: not due at as_of 10 s
    assert tx["U14"]["flags"] == [] and "U14" not in cb
    assert tx["U14"]["deadline_ms"] == 60_000 + 15 * 60_000
    # immunity re-put (TRAN_PREPARED_QUEUE_OFFSET 4) is covered by the op for the original offset 4
    assert (
        tx["U15"]["state"] == "ROLLED_BACK"
        and tx["U15"]["open_copy_offsets"] == []
        and tx["U15"]["flags"] == []
    )
    assert set(cb) == {"U12"}


def test_3x_statetable_and_redolog_disagreements(scenarios):
    tx = scenarios["tx"]["s-3x"]
    assert tx["1000"]["state"] == "COMMITTED" and tx["1000"]["flags"] == []
    assert tx["1000"]["statetable_index"] == 0 and tx["1000"]["redolog_state"] == "COMMIT"
    assert tx["2000"]["state"] == "ROLLED_BACK"
    assert tx["2000"]["flags"] == ["STATETABLE_COMMITLOG_DISAGREE", "STATETABLE_REDOLOG_DISAGREE"]
    assert tx["3000"]["state"] == "PREPARED"
    # (the scenarios share one 6 s timeout, so the open ones are past it)
    assert tx["3000"]["flags"] == ["PREPARED_PAST_TIMEOUT", "STATETABLE_MISSING_PREPARED"]
    assert tx["6000"]["flags"] == ["PREPARED_PAST_TIMEOUT", "STATETABLE_INDEX_MISMATCH"]
    assert tx["7000"]["state"] == "COMMITTED"
    assert tx["7000"]["flags"] == ["CONFLICTING_ENDS", "REDOLOG_COMMITLOG_DISAGREE"]
    # a statetable unit whose prepared record is not in the store is a transaction of its own
    assert tx["9999"]["state"] == "PREPARED"
    assert tx["9999"]["flags"] == [
        "PREPARED_RECORD_MISSING",
        "STATETABLE_REDOLOG_DISAGREE",
    ]  # not in the redolog
    assert (
        tx["9999"]["statetable_index"],
        tx["9999"]["copies"],
        tx["9999"]["prepared_commitlog_offset"],
    ) == (5, 0, 9999)
    rec = _recovery(scenarios, "s-3x")
    assert {k: r["action"] for k, r in rec.items()} == {
        "2000": "REBUILD_STATETABLE",
        "3000": "REBUILD_STATETABLE",
        "6000": "REBUILD_STATETABLE",
        "7000": "REVIEW_CONFLICTING_ENDS",
        "9999": "REBUILD_STATETABLE",
    }
    assert _check_back(scenarios, "s-3x") == {}
    assert _findings(scenarios, "s-3x") == []


def test_resumed_after_discard(scenarios):
    (t,) = scenarios["tx"]["s-resume"].values()
    assert t["state"] == "PREPARED" and t["discards"] == 1 and t["newest_copy_queue_offset"] == 2
    assert set(t["flags"]) == {"RESUMED_AFTER_DISCARD", "PREPARED_PAST_TIMEOUT"}
    assert _check_back(scenarios, "s-resume")["U16"]["commitlog_offset"] == 300
    assert _recovery(scenarios, "s-resume") == {}


def test_open_copies_without_consume_offsets(scenarios):
    tx = scenarios["tx"]["s-nocof"]
    assert tx["U17"]["flags"] == [] and tx["U17"]["open_copy_offsets"] == []
    assert tx["U18"]["flags"] == ["COMMIT_WITHOUT_OP", "RESOLVED_COPY_PENDING_CHECK"]
    assert tx["U18"]["open_copy_offsets"] == [2]


def test_4_0_prepared_records(scenarios):
    """4.0-4.2 clients write UNIQ_KEY, but there is exactly one prepared record per transaction and the
    COMMIT/ROLLBACK records point at it: keyed by the prepared offset like 3.x (uniq_key still carried)."""
    tx = scenarios["tx"]["s-40"]
    assert tx["0"]["state"] == "PREPARED" and tx["0"]["profile"] == "4.0-4.2" and tx["0"]["uniq_key"] == "U40"
    assert set(tx["0"]["flags"]) == {"PREPARED_PAST_TIMEOUT", "PREPARED_NEVER_CHECKED"}
    assert tx["100"]["state"] == "COMMITTED" and tx["100"]["mechanism"] == "PREPARED_RECORD"
    assert tx["100"]["commit_offsets"] == [200] and tx["100"]["uniq_key"] == "U41"
    cb = _check_back(scenarios, "s-40")["0"]
    assert (cb["request_topic"], cb["msg_id"], cb["tran_state_table_offset"]) == ("T3", "U40", 0)


def test_scenario_profiles(scenarios):
    prof = {p["broker"]: p["profile"] for p in scenarios["profiles"]}
    assert prof["s-3x"] == "3.x" and prof["s-40"] == "4.0-4.2" and prof["s-dup"] == "5.1+"
    assert prof["s-newest"] == "4.3-5.0"


def test_every_flag_used_is_documented(scenarios, truth_audit):
    used = {f for out in (scenarios, truth_audit) for t in out["transactions"] for f in t["flags"]}
    assert used <= set(FLAGS) - ANOMALY_ONLY
    codes = {a["code"] for a in scenarios["anomalies"]}
    assert codes <= set(FLAGS)
    assert {r["action"] for r in scenarios["recovery"]} <= set(RECOVERY_ACTIONS)


# ------------------------------------------------------------------------------------------------------------
# Small transforms
# ------------------------------------------------------------------------------------------------------------


def test_parse_op_bodies_both_forms():
    from jobs.reconstruct.evidence import op_evidence

    bodies = [(10, 0, "1234"), (20, 1, "1,4,9,"), (30, 2, ""), (40, 3, " 7 ,x,"), (50, 4, None),
              (60, 5, b"12,13")]
    got = sorted(
        ((e.physical_offset, e.queue_offset, e.half_offset, e.piece)
         for off, qo, body in bodies
         for e in op_evidence(dict(broker="b", queue_id=0, physical_offset=off, queue_offset=qo,
                                   store_timestamp=5, total_size=100, body_crc_ok=True, body=body))),
        key=lambda x: (x[0], x[3]),
    )
    assert got == [
        (10, 0, 1234, "1234"),
        (20, 1, 1, "1"),
        (20, 1, 4, "4"),
        (20, 1, 9, "9"),
        (40, 3, 7, "7"),
        (40, 3, None, "x"),
        (60, 5, 12, "12"),
        (60, 5, 13, "13"),
    ]


def test_audit_params_defaults():
    from jobs.reconstruct.spark import AuditParams

    assert AuditParams.for_profile("5.1+") == AuditParams(6000, 15, 30000, 72, None)
    assert AuditParams.for_profile("4.3-5.0") == AuditParams(6000, 15, 60000, 72, None)
    p3 = AuditParams.for_profile("3.x")
    assert (p3.transactionCheckMax, p3.fileReservedTime) == (None, 48)
    assert AuditParams.for_profile(
        "4.3-5.0", {"transactionTimeOut": 3000, "transactionCheckMax": 5}
    ) == AuditParams(
        3000, 5, 60000, 72, None
    )  # 4.3.0
    with pytest.raises(ValueError):
        AuditParams.for_profile("9.9")
    with pytest.raises(ValueError):
        AuditParams.for_profile("5.1+", {"nope": 1})


def test_profile_override(frames):
    from jobs.reconstruct.spark import detect_profile

    f = frames
    got = {
        r.broker: (r.profile, r.detected_profile)
        for r in detect_profile(
            f["commitlog"], f["statetable"], f["redolog"], profile_override={"s-40": "3.x"}
        ).collect()
    }
    assert got["s-40"] == ("3.x", "4.0-4.2") and got["s-3x"] == ("3.x", "3.x")
    with pytest.raises(ValueError):
        detect_profile(f["commitlog"], profile_override="6.0")
