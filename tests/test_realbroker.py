"""The audit against real RocketMQ brokers: released 4.9.8 and 5.3.3 jars, fetched from Maven
Central by tests/realbroker/fetch.sh into a cache outside the repository, run on 127.0.0.1 by the harness in
tests/realbroker/ with a real TransactionMQProducer (commit, rollback, UNKNOW answered on check-back, never
answered -> discarded after transactionCheckMax, a producer JVM that halts before answering, in-flight halves
at the stop), then a clean stop, a kill -9, or a kill -9 + restart (+ the in-flight halves answered on
check-back after the restart); both versions also with the DLedger CommitLog, 5.3.3 also with its RocksDB
consume-queue store (storeType=defaultRocksDB), whose audit must equal its file consume-queue twin's.

Every store is audited through ./spark-submit.sh in both modes (one run per mode over all stores, one broker
name per store) and compared with the truth: the producers' decisions (JSON lines) plus what the broker did
(its pulls of the real topic and TRANS_CHECK_MAX_TIME_TOPIC during the run, its own discard log lines).

Selected with ``-m realbroker``; part of the default suite (``.ci/run``).  Skipped, loudly, only when Maven
Central cannot be reached on a machine that has not fetched the jars yet.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

import pytest
from conftest import ROOT

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realbroker as rb  # noqa: E402

pytestmark = [pytest.mark.realbroker, pytest.mark.slow]

SUBMIT = os.path.join(ROOT, "spark-submit.sh")
CASES = [(v, s) for v in rb.VERSIONS for s in (*rb.SCENARIOS, *rb.DLEDGER_SCENARIOS)] \
    + [("5.3.3", s) for s in rb.ROCKSDB_SCENARIOS]
#: a RocksDB consume-queue run -> the file consume-queue run of the same workload and stop
ROCKSDB_TWIN = {s: s.removeprefix("rocksdb_") for s in rb.ROCKSDB_SCENARIOS}
MODES = ("full", "indexed")


def broker_name(version: str, scenario: str) -> str:
    return f"v{version.replace('.', '')}-{scenario.replace('_', '-')}"


class Runs:
    """Every scenario's broker run (or the error it raised), then one audit per mode over all stores."""

    def __init__(self, base: Path):
        self.base = base
        self.runs = {}
        self.errors = {}
        self.audits = {}
        self.audit_errors = {}
        self.timings = {}


def selected_names(items) -> set:
    """The broker runs the collected tests need (``-k`` and node ids select scenarios); a RocksDB run is
    compared with its file consume-queue twin, so both run when either is selected."""
    here = Path(__file__).name
    selected = {broker_name(it.callspec.params["version"], it.callspec.params["scenario"])
                for it in items
                if hasattr(it, "callspec") and {"version", "scenario"} <= it.callspec.params.keys()
                and Path(str(it.path)).name == here}
    selected |= {broker_name(v, ROCKSDB_TWIN[s]) for v, s in CASES
                 if s in ROCKSDB_TWIN and broker_name(v, s) in selected}
    return selected


def broker_runs(selected: set, base: Path, cancel: Optional[threading.Event] = None) -> Runs:
    """Every selected scenario's broker run, the two versions side by side (the brokers mostly wait on their
    1 s timers, so two at a time costs little CPU and halves the wall time).  Raises rb.FetchUnavailable."""
    t0 = time.monotonic()
    for v in sorted({v for v, s in CASES if broker_name(v, s) in selected}):
        rb.compile_workload(v)              # fetches the jars first (once per machine)
    res = Runs(base)
    res.timings["fetch+compile"] = time.monotonic() - t0

    def chain(version):
        for v, s in CASES:
            name = broker_name(v, s)
            if v != version or name not in selected:
                continue
            if cancel is not None and cancel.is_set():
                res.errors[name] = "not run: the test session ended first"
                continue
            try:
                res.runs[name] = rb.run_scenario(v, s, base / name)
            except Exception as e:   # one broken scenario fails its own tests only
                res.errors[name] = f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(max_workers=len(rb.VERSIONS)) as pool:
        list(pool.map(chain, rb.VERSIONS))
    res.timings["brokers"] = time.monotonic() - t0 - res.timings["fetch+compile"]
    return res


class EarlyRuns:
    """The broker runs started in a background thread as soon as collection is done (conftest calls
    :func:`start_early`): they spend minutes waiting on the brokers' timers, which the rest of the suite
    fills with its own work instead of waiting for them at this module's turn."""

    def __init__(self, selected: set, base: Path):
        self.selected, self.cancel = selected, threading.Event()
        self.result: Optional[Runs] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(base,), name="realbroker-early")
        self.thread.start()

    def _run(self, base: Path) -> None:
        try:
            self.result = broker_runs(self.selected, base, self.cancel)
        except BaseException as e:  # noqa: BLE001 - re-raised in the fixture (a skip for FetchUnavailable)
            self.error = e

    def get(self) -> Runs:
        self.thread.join()
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


_EARLY: List[EarlyRuns] = []


def start_early(session) -> None:
    """conftest's pytest_collection_finish: start the selected broker runs in the background."""
    selected = selected_names(session.items)
    if selected and not _EARLY:
        _EARLY.append(EarlyRuns(selected, session.config._tmp_path_factory.mktemp("realbroker")))


def stop_early() -> None:
    """conftest's pytest_sessionfinish: scenarios not begun yet are not begun; the one running finishes
    (its JVMs are stopped by the harness) before the interpreter exits."""
    for early in _EARLY:
        early.cancel.set()
        early.thread.join()


@pytest.fixture(scope="session")
def realbroker_runs(request, tmp_path_factory) -> Runs:
    selected = selected_names(request.session.items)
    try:
        if _EARLY and selected <= _EARLY[0].selected:
            res = _EARLY[0].get()
        else:
            res = broker_runs(selected, tmp_path_factory.mktemp("realbroker"))
    except rb.FetchUnavailable as e:
        msg = f"REAL-BROKER TESTS SKIPPED: {e}"
        warnings.warn(msg, stacklevel=2)
        print(f"\n*** {msg}\n", file=sys.stderr)
        pytest.skip(msg)
    base = res.base
    conf = base / "audit.properties"
    conf.write_text(f"broker.transactionTimeOut={rb.TX_TIMEOUT_MS}\n"
                    f"broker.transactionCheckInterval={rb.TX_CHECK_INTERVAL_MS}\n"
                    f"broker.transactionCheckMax={rb.TX_CHECK_MAX}\n")
    stores = []
    for name, run in res.runs.items():
        stores += ["--store", str(run.store), "--broker", name]
    for mode in MODES:
        t1 = time.monotonic()
        out = base / f"audit-{mode}"
        if not stores:
            res.audit_errors[mode] = "no store"
            continue
        p = subprocess.run(["bash", SUBMIT, "--master", "local[2]", "audit", *stores, "--out", str(out),
                            "--mode", mode, "--conf-file", str(conf), "--no-report", "--conf",
                            "spark.sql.shuffle.partitions=2"], capture_output=True, text=True, timeout=1800,
                           stdin=subprocess.DEVNULL, cwd=ROOT)
        res.timings[f"audit {mode}"] = time.monotonic() - t1
        if p.returncode != 0:
            res.audit_errors[mode] = f"exit {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            continue
        import deltalake
        res.audits[mode] = {t: deltalake.DeltaTable(str(out / t)).to_pandas()
                            for t in ("transactions", "check_back_worklist", "recovery_worklist",
                                      "audit_anomalies", "profiles")}
        res.audits[mode]["stdout"] = p.stdout
    line = "realbroker timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in res.timings.items()) + "; " + \
        ", ".join(f"{n} {r.seconds:.0f}s" for n, r in res.runs.items())
    (base / "timings.txt").write_text(line + "\n")
    print("\n" + line, file=sys.stderr)
    return res


def _run(runs: Runs, name: str):
    if name in runs.errors:
        pytest.fail(f"{name}: the broker run failed: {runs.errors[name]}")
    return runs.runs[name]


def _audit(runs: Runs, mode: str, name: str):
    if mode in runs.audit_errors:
        pytest.fail(f"audit --mode {mode} failed: {runs.audit_errors[mode]}")
    return {t: (df[df["broker"] == name] if t != "stdout" else df) for t, df in runs.audits[mode].items()}


@pytest.mark.parametrize("version,scenario", CASES, ids=[broker_name(*c) for c in CASES])
def test_broker_run_truth_is_consistent(realbroker_runs, version, scenario):
    """The harness itself: every transaction was sent, the broker's committed messages (a pull of the real
    topic) are exactly the COMMIT answers, every never-answered class was discarded by the broker."""
    run = _run(realbroker_runs, broker_name(version, scenario))
    t = run.truth
    n_expected = sum(int(x.split("=")[1]) for x in rb.WORKLOAD["counts"].split(",")) + \
        sum(int(x.split("=")[1]) for x in rb.WORKLOAD["died"].split(",")) + rb.WORKLOAD["inflight"]
    assert len(t) == n_expected, sorted(t)
    committed = {k for k, x in t.items() if x.state == "COMMITTED"}
    assert set(run.view["committed"]) == committed, (run.view, run.steps)
    for k, x in t.items():
        if x.cls in ("discard", "died_discard"):
            assert x.state == "DISCARDED", (k, x, run.broker_discards)
        if x.cls.startswith("inflight"):
            if scenario.endswith("_restart"):
                want = {"inflight_commit": "COMMITTED", "inflight_rollback": "ROLLED_BACK"}[x.cls]
            elif scenario.endswith("kill9"):
                want = "PREPARED"          # killed the moment they were sent: never checked
            else:
                # a graceful stop takes seconds to minutes on a loaded machine (5.3.3: 25 s seen), the check
                # service keeps running meanwhile: once the immunity time is over it checks the halves, finds
                # no producer and may discard them before it stops.  Either way the broker's log says which.
                want = "DISCARDED" if k in run.broker_discards else "PREPARED"
            assert x.state == want, (k, x, run.steps, run.broker_discards)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version,scenario", CASES, ids=[broker_name(*c) for c in CASES])
def test_audit_states_equal_the_truth(realbroker_runs, version, scenario, mode):
    name = broker_name(version, scenario)
    run = _run(realbroker_runs, name)
    a = _audit(realbroker_runs, mode, name)
    tx = a["transactions"]
    got = dict(zip(tx["keys"], tx["state"], strict=True))
    want = {k: x.state for k, x in run.truth.items()}
    wrong = {k: (got.get(k), want.get(k)) for k in sorted(set(got) | set(want)) if got.get(k) != want.get(k)}
    assert not wrong, f"{name} --mode {mode}: (audit, truth) per key: {wrong}; broker: {run.steps}"
    assert len(tx) == len(want), tx["keys"].tolist()
    # the transaction key is the producer's UNIQ_KEY (its msgId), one row per transaction
    assert dict(zip(tx["keys"], tx["uniq_key"], strict=True)) == {k: x.uniq for k, x in run.truth.items()}
    assert (tx["transaction_key"] == tx["uniq_key"]).all()
    prof = a["profiles"]
    assert prof["profile"].tolist() == ["4.3-5.0" if version.startswith("4.") else "5.1+"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version,scenario", CASES, ids=[broker_name(*c) for c in CASES])
def test_audit_discards_and_work_lists_equal_the_truth(realbroker_runs, version, scenario, mode):
    """Discard records per transaction = the broker's discards (its log lines); RESUME_DISCARDED = the
    DISCARDED transactions; the check-back list = the PREPARED ones (the in-flight halves of a stop without
    restart, never checked)."""
    name = broker_name(version, scenario)
    run = _run(realbroker_runs, name)
    a = _audit(realbroker_runs, mode, name)
    tx = a["transactions"]
    discards = {k: int(n) for k, n in zip(tx["keys"], tx["discards"], strict=True) if n}
    assert discards == run.broker_discards, (discards, run.broker_discards, run.steps)
    by_uniq = {x.uniq: k for k, x in run.truth.items()}
    rec = a["recovery_worklist"]
    resume = {by_uniq.get(u) for u in rec[rec["action"] == "RESUME_DISCARDED"]["uniq_key"]}
    assert resume == {k for k, x in run.truth.items() if x.state == "DISCARDED"}, rec[["uniq_key", "action"]]
    cb = a["check_back_worklist"]
    prepared = {k for k, x in run.truth.items() if x.state == "PREPARED"}
    listed = {by_uniq.get(u) for u in cb["uniq_key"]}
    assert listed <= prepared, cb[["uniq_key", "check_times", "priority"]]
    # Two reasons RocketMQ would not check a PREPARED half now, and the audit leaves it off the list:
    # * it was already checked transactionCheckMax times (a slow graceful stop): the broker discards it at its
    #   next visit (AT_CHECK_MAX);
    # * its CHECK_IMMUNITY_TIME_IN_SECONDS (the in-flight halves: 10 s) is not over at the audit's as-of (an
    #   audit started within seconds of the kill): no PREPARED_PAST_TIMEOUT yet.
    rows = tx.set_index("keys")
    for k in prepared - listed:
        r = rows.loc[k]
        at_max = "AT_CHECK_MAX" in r["flags"] and r["check_times"] >= rb.TX_CHECK_MAX
        immune = ("PREPARED_PAST_TIMEOUT" not in r["flags"]
                  and r["check_immunity_time_s"] == rb.INFLIGHT_IMMUNITY_S
                  and r["age_ms"] < rb.INFLIGHT_IMMUNITY_S * 1000)
        assert at_max or immune, (k, r.to_dict())
    assert (cb["producer_group"] == "PID_RB_TX").all() and (cb["real_topic"] == "TopicRbTx").all()


def _checkpoint_left_as_bak(finding, store) -> bool:
    """Whether ``finding`` is the MISSING_FILE of a DLedger ``checkpoint`` that is in fact gone while its
    ``.bak`` is there.  Seen on a 5.3.3 DLedger broker whose shutdown hook completed ("Shutdown hook over"):
    DLedger rewrites the checkpoint by writing ``checkpoint.tmp``, copying the old one to ``.bak``, deleting
    ``checkpoint`` and renaming the tmp file (IOUtils.string2File), and the flush service's last write and the
    shutdown's can interleave so that only the ``.bak`` is left.  The audit reads the ``.bak`` (as the file's
    own fallback does) and names the missing file: a true finding about the store, not damage."""
    path = os.path.join(str(store), finding["file"] or "")      # (a relative file is under the store)
    return (finding["code"] == "MISSING_FILE" and os.path.basename(path) == "checkpoint"
            and os.path.basename(os.path.dirname(path)).startswith("dledger-")
            and not os.path.exists(path) and os.path.isfile(path + ".bak"))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version,scenario", [c for c in CASES if c[1].endswith("clean")],
                         ids=[broker_name(*c) for c in CASES if c[1].endswith("clean")])
def test_audit_of_a_cleanly_stopped_broker_has_no_findings(realbroker_runs, version, scenario, mode):
    """A store RocketMQ shut down normally is not damaged: no decoder finding, no unattributable evidence; the
    recovery work list holds only RESUME_DISCARDED for the DISCARDED transactions and REDRIVE_EXPIRED for
    in-flight halves still PREPARED (checked during the stop, their discard deadline is past at the audit's
    as-of), nothing to review."""
    name = broker_name(version, scenario)
    run = _run(realbroker_runs, name)
    a = _audit(realbroker_runs, mode, name)
    found = a["audit_anomalies"]
    raced = (found.apply(lambda f: _checkpoint_left_as_bak(f, run.store), axis=1) if not found.empty
             else found.index == 0)
    assert found[~raced].empty, found[["code", "detail"]].to_string()
    rec = a["recovery_worklist"]
    by_uniq = {x.uniq: x for x in run.truth.values()}
    allowed = {"DISCARDED": "RESUME_DISCARDED", "PREPARED": "REDRIVE_EXPIRED"}
    for u, action in zip(rec["uniq_key"], rec["action"], strict=True):
        t = by_uniq[u]
        # a loaded broker may check a half whose op record is still batched (transactionOpBatchInterval): the
        # producer answers COMMIT again and the broker writes a second COMMIT record, which the audit lists
        if action == "REVIEW_DUPLICATE_COMMIT" and t.state == "COMMITTED" and t.answers.count("COMMIT") > 1:
            continue
        assert action == allowed.get(t.state), rec[["uniq_key", "action", "reason"]].to_string()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("version,scenario", [("5.3.3", s) for s in rb.ROCKSDB_SCENARIOS],
                         ids=[broker_name("5.3.3", s) for s in rb.ROCKSDB_SCENARIOS])
def test_rocksdb_consume_queue_store_audits_like_its_file_twin(realbroker_runs, version, scenario, mode):
    """The same seeded workload and stop on a storeType=defaultRocksDB broker and on a file consume-queue
    broker: the same transaction keys, and the same audited state for every key whose truth is the same in
    both runs (all but the in-flight halves, which a graceful stop may or may not discard), in both modes."""
    rocks, files = broker_name(version, scenario), broker_name(version, ROCKSDB_TWIN[scenario])
    r, f = _run(realbroker_runs, rocks), _run(realbroker_runs, files)
    ar, af = _audit(realbroker_runs, mode, rocks), _audit(realbroker_runs, mode, files)
    got_r = dict(zip(ar["transactions"]["keys"], ar["transactions"]["state"], strict=True))
    got_f = dict(zip(af["transactions"]["keys"], af["transactions"]["state"], strict=True))
    assert set(got_r) == set(got_f) == set(r.truth) == set(f.truth)
    same = {k for k in r.truth if r.truth[k].state == f.truth[k].state}
    assert same >= {k for k, x in r.truth.items() if not x.cls.startswith("inflight")}, (r.truth, f.truth)
    assert {k: got_r[k] for k in sorted(same)} == {k: got_f[k] for k in sorted(same)}
    # findings: none beyond the file twin's.  After kill -9 the RocksDB database is empty (its WAL is flushed
    # every 1024 writes, docs/realbroker.md): the whole CommitLog is scanned as a store without a transaction
    # index, so the file twin's INDEX_INCOMPLETE (IndexFiles that may lag after an unclean stop) has no twin
    assert set(ar["audit_anomalies"]["code"]) <= set(af["audit_anomalies"]["code"])
    if scenario.endswith("clean"):
        assert ar["audit_anomalies"].empty and af["audit_anomalies"].empty
