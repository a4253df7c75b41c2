"""The real 4.9.8 DLedger stores through jobs.read.frames + jobs.reconstruct.spark (both modes): every transaction's
state, the work lists and the findings, against expectations derived straight from truth/ (RocketMQ's and
DLedger's own decoding), independently of the Spark code."""
from __future__ import annotations

import base64
import gzip
import json
from collections import defaultdict

import pytest
from conftest import FIXTURES

DLEDGER = FIXTURES / "rocketmq-4.9.8-dledger"
STORES = ("clean", "crashed")
MODES = ("indexed", "full")
pytestmark = pytest.mark.spark


def _truth(store: str) -> list:
    with gzip.open(DLEDGER / "truth" / store / "commitlog.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


def _first_uncommitted_offset(store: str):
    """Physical offset of the first message past the DLedger checkpoint's committedIndex (None: all committed)."""
    state = json.loads((DLEDGER / "truth" / store / "store_state.json").read_text())
    committed = state["recovered_committedIndex"]
    for line in (DLEDGER / "truth" / store / "dledger_index.jsonl").read_text().splitlines():
        unit = json.loads(line)
        if unit["index"] == committed + 1:
            return unit["pos"] + 48
    return None


def expectations(store: str) -> dict:
    """Per KEYS: state, the physical offsets of every record of the transaction, discard msgId, newest copy."""
    recs = _truth(store)
    exp = defaultdict(lambda: {"commits": [], "copies": [], "discards": [], "ops": []})
    key_of_half_qo = {}
    for r in recs:
        key = r["properties"].get("KEYS")
        topic = r["topic"]
        if topic == "RMQ_SYS_TRANS_HALF_TOPIC":
            exp[key]["copies"].append(r)
            key_of_half_qo[r["queueOffset"]] = key
        elif topic == "TRANS_CHECK_MAX_TIME_TOPIC":
            exp[key]["discards"].append(r)
        elif r["tranType"] == 8 and not topic.startswith("%") and topic != "SCHEDULE_TOPIC_XXXX":
            exp[key]["commits"].append(r)
    for r in recs:
        if r["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC":
            key = key_of_half_qo.get(int(base64.b64decode(r["body_b64"]).decode()))
            if key is not None:
                exp[key]["ops"].append(r)
    for e in exp.values():
        e["state"] = ("COMMITTED" if e["commits"] else "ROLLED_BACK" if e["ops"] else
                      "DISCARDED" if e["discards"] else "PREPARED")
        e["offsets"] = [r["physicalOffset"] for k in ("commits", "copies", "discards", "ops") for r in e[k]]
    return dict(exp)


def _params() -> dict:
    from jobs.reconstruct.spark import AuditParams

    params = {}
    for store in STORES:
        as_of = max(r["storeTimestamp"] for r in _truth(store))
        # README: transactionTimeOut 1000, transactionCheckInterval 1000, transactionCheckMax 3
        params[store] = AuditParams.for_profile("4.3-5.0", {"transactionTimeOut": 1000, "transactionCheckInterval":
                                                            1000, "transactionCheckMax": 3, "as_of_ms": as_of})
    return params


def _frames(spark, mode: str) -> dict:
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct.spark import commitlog_bounds_from_layout

    sf = load_store_frames(spark, [str(DLEDGER / f"store-{s}") for s in STORES], mode=mode, brokers=list(STORES),
                           include_bodies=True)
    frames = {n: getattr(sf, n) for n in ("commitlog", "consumequeue", "statetable", "redolog",
                                           "consumer_offsets", "anomalies")}
    frames["commitlog_bounds"] = commitlog_bounds_from_layout(spark, sf.layout_info)
    return frames


@pytest.fixture(scope="module")
def audits(spark):
    from jobs.reconstruct.spark import reconstruct

    out = {}
    params = _params()
    for mode in MODES:
        frames = _frames(spark, mode)
        result = reconstruct(frames, params, materialize=True)
        out[mode] = {name: [r.asDict(recursive=True) for r in getattr(result, name).collect()]
                     for name in ("transactions", "check_back", "recovery", "anomalies")}
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("store", STORES)
def test_every_transaction_state_matches_the_truth(audits, mode, store):
    audit = audits[mode]
    exp = expectations(store)
    intended = json.loads((DLEDGER / "truth" / store / "workload_client_side.json").read_text())[
        "intended_tx_outcome_by_key"]
    rows = [t for t in audit["transactions"] if t["broker"] == store]
    assert len(rows) == len(intended) == len(exp), "one row per transaction: the broker's real count, not 0"
    uncommitted = _first_uncommitted_offset(store)
    for t in rows:
        e = exp[t["keys"]]
        assert t["state"] == e["state"], (t["keys"], intended[t["keys"]], t["flags"])
        assert sorted(t["commit_offsets"]) == sorted(r["physicalOffset"] for r in e["commits"])
        assert t["copies"] == len(e["copies"])
        newest = max(e["copies"], key=lambda r: r["physicalOffset"])
        assert t["newest_copy_commitlog_offset"] == newest["physicalOffset"]
        assert t["newest_copy_msg_id"] == newest["msgId"]
        assert t["prepared_commitlog_offset"] == min(r["physicalOffset"] for r in e["copies"])
        # the client's intent holds wherever the broker did not discard first
        if t["state"] != "DISCARDED" and intended[t["keys"]] != "unknown_discard":
            assert {"commit": "COMMITTED", "rollback": "ROLLED_BACK"}.get(
                intended[t["keys"]].split("_")[-1], "PREPARED") == t["state"]
        past = uncommitted is not None and max(e["offsets"]) >= uncommitted
        assert ("EVIDENCE_NOT_COMMITTED" in t["flags"]) == past, t["keys"]
    if store == "crashed":
        assert any("EVIDENCE_NOT_COMMITTED" in t["flags"] for t in rows)


@pytest.mark.parametrize("mode", MODES)
def test_work_lists(audits, mode):
    audit = audits[mode]
    tx = {(t["broker"], t["transaction_key"]): t for t in audit["transactions"]}
    due = {k for k, t in tx.items() if t["state"] == "PREPARED" and "PREPARED_PAST_TIMEOUT" in t["flags"]
           and "AT_CHECK_MAX" not in t["flags"]}
    assert {(r["broker"], r["transaction_key"]) for r in audit["check_back"]} == due and due
    for r in audit["check_back"]:
        t = tx[(r["broker"], r["transaction_key"])]
        assert r["commitlog_offset"] == t["newest_copy_commitlog_offset"]
        assert r["request_topic"] == "RMQ_SYS_TRANS_HALF_TOPIC" and r["msg_id"] == t["uniq_key"]
    exp = {s: expectations(s) for s in STORES}
    resumed = [r for r in audit["recovery"] if r["action"] == "RESUME_DISCARDED"]
    assert {(r["broker"], r["transaction_key"]) for r in resumed} == \
        {k for k, t in tx.items() if t["state"] == "DISCARDED"}
    for r in resumed:
        e = exp[r["broker"]][tx[(r["broker"], r["transaction_key"])]["keys"]]
        assert r["resume_msg_id"] in {d["msgId"] for d in e["discards"]}
    review = {(r["broker"], r["transaction_key"]) for r in audit["recovery"] if "REVIEW_EVIDENCE" in r["actions"]}
    assert review == {k for k, t in tx.items() if "EVIDENCE_NOT_COMMITTED" in t["flags"]} and review

@pytest.mark.parametrize("mode", MODES)
def test_findings_torn_entry_and_uncommitted_tail(audits, mode):
    torn = json.loads((DLEDGER / "truth" / "crashed" / "torn_tail.json").read_text())
    # the crashed store kept its abort file: indexed mode scans past the newest IndexFile entry and says why
    lag = [(a["broker"], a["detail"].split(":")[0]) for a in audits[mode]["anomalies"]
           if a["code"] == "INDEX_INCOMPLETE"]
    assert lag == ([("crashed", "INDEX_LAG")] if mode == "indexed" else [])
    found = sorted((a["broker"], a["code"], a["physical_offset"]) for a in audits[mode]["anomalies"]
                   if a["code"] != "INDEX_INCOMPLETE")
    assert found == sorted([("crashed", "BAD_TOTAL_SIZE", torn["messagePhysicalOffset"]),
                            ("crashed", "DLEDGER_UNCOMMITTED", _first_uncommitted_offset("crashed"))])
    (bad,) = [a for a in audits[mode]["anomalies"] if a["code"] == "BAD_TOTAL_SIZE"]
    assert bad["file"].endswith(torn["file"]) and bad["position"] == torn["filePos"] + 48


def test_modes_agree(audits):
    def key(t):
        return (t["broker"], t["transaction_key"], t["state"], tuple(sorted(t["flags"])))
    assert sorted(map(key, audits["indexed"]["transactions"])) == sorted(map(key, audits["full"]["transactions"]))


def test_replicas_given_together_are_one_broker(spark, tmp_path):
    from test_dledger import make_replicas

    from jobs.read.frames import load_store_frames

    roots, _ = make_replicas(tmp_path)
    sf = load_store_frames(spark, [str(r) for r in roots], brokers=["n0", "n0", "n0"], mode="indexed")
    assert [(s.broker, s.root) for s in sf.layout_info] == [("n0", str(roots[0]))]
    found = [r.asDict() for r in sf.anomalies.where("kind = 'DLEDGER_REPLICA_DIFFERS'").collect()]
    assert sorted(a["file"].split("/store/")[0][-2:] for a in found) == ["r1", "r2"]
    assert {a["broker"] for a in found} == {"n0"}
    assert sf.commitlog.where("topic = 'RMQ_SYS_TRANS_HALF_TOPIC'").count() == sum(
        1 for r in _truth("clean") if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC")


def test_distributed_path_equals_the_driver(spark):
    """Both DLedger stores (the crashed one with its torn entry and uncommitted tail), full mode: the
    distributed path (linking as Spark joins, the rules per partition of transactions) gives the driver
    reducer's rows in every output table."""
    from jobs.reconstruct.spark import reconstruct

    frames = {k: v.localCheckpoint() for k, v in _frames(spark, "full").items()}
    want = reconstruct(frames, _params(), path="driver").arrow
    got = reconstruct(frames, _params(), materialize=True, path="distributed")
    assert got.path == "distributed"
    for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
        rows = getattr(got, name).toArrow().to_pylist()
        assert sorted(map(repr, rows)) == sorted(map(repr, want[name].to_pylist())), name
