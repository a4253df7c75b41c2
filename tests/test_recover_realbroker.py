"""``recover`` against real RocketMQ 4.9.8 and 5.3.3 brokers (harness: tests/realbroker/).

Per version one broker life: a transactional producer commits, rolls back, leaves two halves to be discarded
(never answered) and two in-flight halves; kill -9; the broker restarts on the same store with its check
service idle (transactionCheckInterval 10 min), so the in-flight halves stay PREPARED and nothing else
moves.  Then, on the live stores: audit -> ``recover`` (a NameServer that is down: exit 2, nothing logged;
dry run: nothing sent; ``--send`` with a decisions file: RESUME for the discarded, COMMIT / ROLLBACK for the
in-flight) -> ``recover --send`` again (nothing left to send) -> a second audit: exactly those transactions
changed.  And per version a broker with ACL on (4.9.8: ACL 1.0, plain_acl.yml; 5.3.3: ACL 2.0 authentication,
same signature): a wrong secret is refused by the broker, ``recover`` says so in one line (exit 2) and sends
nothing; the right secret passes.

In a whole-suite run the broker lives start in the background (conftest's pytest_collection_finish calls
:func:`start_early`) once test_realbroker's background runs are over, and overlap that module's audits.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import DATA, ROOT

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realbroker as rb  # noqa: E402

pytestmark = [pytest.mark.realbroker, pytest.mark.slow]

SUBMIT = os.path.join(ROOT, "spark-submit.sh")
COUNTS = "commit=1,rollback=1,discard=2"
INFLIGHT = 2
#: the restarted broker's check interval (BrokerConfig.transactionCheckInterval, a long): longer than the lives
#: can wait for this module when they start early in a whole-suite run (that run took 74 min at load ~18), so
#: the in-flight halves are never checked before the audits and recover run
IDLE_CHECK_MS = 6 * 3_600_000
ACL_AK, ACL_SK = "rbAccess", "rbSecret-123"


def _name(v: str) -> str:
    return f"rc{v.replace('.', '')}"


def _submit(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", SUBMIT, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, cwd=ROOT, env=env)


def _audit(out: Path, run_id: str, stores, conf: Path) -> subprocess.CompletedProcess:
    args = []
    for name, store in stores:
        args += ["--store", str(store), "--broker", name]
    return _submit("--master", "local[2]", "audit", *args, "--out", str(out), "--mode", "indexed", "--run-id",
                   run_id, "--conf-file", str(conf), "--no-report", "--conf", "spark.sql.shuffle.partitions=2")


def _tables(out: Path, run_id: str):
    import deltalake
    tx = deltalake.DeltaTable(str(out / "transactions")).to_pandas()
    return tx[tx["run_id"] == run_id]


class Life:
    def __init__(self, version, work):
        self.version, self.work, self.cluster, self.error, self.truth = version, work, None, None, {}

    def start(self):
        c = self.cluster = rb.Cluster(self.version, self.work)
        c.start()
        log = self.work / "workload-run.jsonl"
        run = c.start_workload("run", log, seed=11, counts=COUNTS, inflight=INFLIGHT, op_flush_ms=1500,
                               immunity_s=0)
        c.wait_phase(run, log, "done", timeout=run.timeout_s + 60)
        c.stop_broker(clean=False)              # the in-flight halves stay unchecked
        run.stop(clean=False)
        c.tx_settings["transactionCheckInterval"] = str(IDLE_CHECK_MS)
        c.start_broker()
        self.truth = rb.truth([log], c.broker_discards())


def _selected(session):
    """The versions whose round trip was selected (-k, node ids), and whether the ACL test was."""
    items = [it for it in session.items if Path(str(it.path)).name == Path(__file__).name]
    versions = {it.callspec.params["version"] for it in items
                if it.name.startswith("test_recover_round_trip[")}
    acl = {it.callspec.params["version"] for it in items if it.name.startswith("test_recover_acl_wrong_secret[")}
    return versions | acl, acl


def _start_lives(versions: set, base: Path) -> dict:
    """One broker life per version, started in parallel (a life that fails carries its error)."""
    for v in sorted(versions):
        rb.compile_workload(v)                  # rb.FetchUnavailable: the module's tests skip
    ls = {v: Life(v, base / _name(v)) for v in rb.VERSIONS if v in versions}

    def go(life):
        try:
            life.start()
        except Exception as e:  # noqa: BLE001 - that version's tests fail with it
            life.error = f"{type(e).__name__}: {e}"

    with ThreadPoolExecutor(len(ls)) as pool:
        list(pool.map(go, ls.values()))
    return ls


class EarlyLives:
    """The broker lives started in a background thread (see :func:`start_early`), after ``after()``."""

    def __init__(self, versions: set, base: Path, after=None):
        self.versions, self.base, self.cancel = versions, base, threading.Event()
        self.lives: dict = {}
        self.error: "BaseException | None" = None
        self.seconds = 0.0
        self.thread = threading.Thread(target=self._run, args=(after,), name="recover-lives-early")
        self.thread.start()

    def _run(self, after) -> None:
        try:
            if after is not None:
                after()
            if self.cancel.is_set():
                return
            t0 = time.monotonic()
            self.lives = _start_lives(self.versions, self.base)
            self.seconds = time.monotonic() - t0
        except BaseException as e:  # noqa: BLE001 - re-raised in the fixture (a skip for FetchUnavailable)
            self.error = e

    def get(self) -> dict:
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.lives

    def close(self) -> None:
        self.cancel.set()
        self.thread.join()
        for life in self.lives.values():
            if life.cluster:
                life.cluster.close()


_EARLY: list = []


def start_early(session, after=None) -> None:
    """conftest's pytest_collection_finish: start the selected versions' broker lives in the background once
    ``after()`` (test_realbroker's background runs) has returned."""
    versions, _ = _selected(session)
    if versions and not _EARLY:
        _EARLY.append(EarlyLives(versions, session.config._tmp_path_factory.mktemp("recover-early"), after))


def stop_early() -> None:
    """conftest's pytest_sessionfinish: lives not begun are not begun; running brokers are stopped."""
    for early in _EARLY:
        early.close()


@pytest.fixture(scope="module")
def lives(request, tmp_path_factory):
    base = tmp_path_factory.mktemp("recover")
    versions, want_acl = _selected(request.session)
    t0 = time.monotonic()
    ls: dict = {}
    try:
        if _EARLY and versions <= _EARLY[0].versions:
            ls = _EARLY[0].get()
            waited = time.monotonic() - t0
        else:
            ls = _start_lives(versions, base)
            waited = None
    except rb.FetchUnavailable as e:
        warnings.warn(f"REAL-BROKER TESTS SKIPPED: {e}", stacklevel=2)
        pytest.skip(f"REAL-BROKER TESTS SKIPPED: {e}")
    try:
        ok = {v: life for v, life in ls.items() if life.error is None}
        timings = {"brokers": time.monotonic() - t0}
        if waited is not None:              # started early: how long they took, how long this module waited
            timings = {"brokers (early)": _EARLY[0].seconds, "waited for them": waited}
        res = {"base": base, "lives": ls, "timings": timings}
        conf = base / "audit.properties"
        conf.write_text(f"broker.transactionTimeOut={rb.TX_TIMEOUT_MS}\n"
                        f"broker.transactionCheckInterval={rb.TX_CHECK_INTERVAL_MS}\n"
                        f"broker.transactionCheckMax={rb.TX_CHECK_MAX}\n")
        out = base / "out"
        stores = [(_name(v), life.cluster.store) for v, life in ok.items()]
        t1 = time.monotonic()
        res["audit1"] = _audit(out, "a1", stores, conf)
        res["timings"]["audit1"] = time.monotonic() - t1
        res["recover"] = {}
        for v, life in ok.items():
            res["recover"][v] = _recover_steps(life, out, base)
        time.sleep(2)                           # 5.x writes op records in batches (transactionOpBatchInterval)
        for v in sorted(want_acl):       # the run list as audit 1 left it, without recovery_log
            nolog = base / f"out-acl-{_name(v)}"
            nolog.mkdir()
            shutil.copytree(out / "audit_runs", nolog / "audit_runs")
        t1 = time.monotonic()
        with ThreadPoolExecutor(1) as pool:  # the ACL brokers start and answer while audit 2 runs
            acl = pool.submit(lambda: {v: _acl_or_error(base, ok.get(v)) for v in sorted(want_acl)})
            res["audit2"] = _audit(out, "a2", stores, conf)
            res["timings"]["audit2"] = time.monotonic() - t1
            res["acl"] = acl.result()
        res["timings"]["audit2 || acl"] = time.monotonic() - t1
        res["out"] = out
        res["timings"]["total"] = time.monotonic() - t0
        print("\nrecover realbroker timings: " + ", ".join(f"{k} {v:.0f}s" for k, v in res["timings"].items()),
              file=sys.stderr)
        yield res
    finally:
        for life in ls.values():
            if life.cluster:
                life.cluster.close()


def _decisions(life: Life, path: Path) -> dict:
    want = {}
    for t in life.truth.values():
        if t.cls == "inflight_commit":
            want[t.uniq] = "COMMIT"
        elif t.cls == "inflight_rollback":
            want[t.uniq] = "ROLLBACK"
    path.write_text("# transaction_key decision\n" + "".join(f"{u} {d}\n" for u, d in want.items()))
    return want


def _recover_steps(life: Life, out: Path, base: Path) -> dict:
    name, c = _name(life.version), life.cluster
    dec = base / f"decisions-{name}.txt"
    steps = {"decisions": _decisions(life, dec)}
    before = len(_log_rows(out, name))
    common = ["recover", "--out", str(out), "--run-id", "a1", "--broker", name, "--decisions", str(dec)]
    # a NameServer that is down: one line, exit 2, nothing logged
    dead = rb.free_port_block(1)
    steps["dead_ns"] = _submit(*common, "--namesrv", f"127.0.0.1:{dead}", "--send", "--timeout-s", "2")
    steps["log_after_dead_ns"] = len(_log_rows(out, name)) - before
    steps["dry"] = _submit(*common, "--namesrv", c.namesrv_addr)
    steps["log_after_dry"] = len(_log_rows(out, name)) - before
    steps["send"] = _submit(*common, "--namesrv", c.namesrv_addr, "--send", "--rate", "50")
    steps["again"] = _submit(*common, "--namesrv", c.namesrv_addr, "--send")
    # the same requests without the recovery_log that remembers them: the broker's index shows what moved
    nolog = base / f"out-nolog-{name}"
    nolog.mkdir()
    shutil.copytree(out / "audit_runs", nolog / "audit_runs")
    steps["stale"] = _submit(*[a if a != str(out) else str(nolog) for a in common], "--namesrv", c.namesrv_addr)
    return steps


ACL_YML = """globalWhiteRemoteAddresses: []
accounts:
  - accessKey: {ak}
    secretKey: {sk}
    whiteRemoteAddress:
    admin: true
"""


def _acl_settings(version: str) -> dict:
    """4.9.8: ACL 1.0 (``aclEnable``, ``plain_acl.yml``); 5.3.3: its ACL 2.0 authentication (ACL 1.0's validator
    is gone; ``DefaultAuthenticationContextBuilder`` checks the same AccessKey / Signature fields), one user
    created at start-up (``initAuthenticationUser``), authorization off."""
    if version.startswith("4."):
        return {"aclEnable": "true"}
    user = json.dumps({"username": ACL_AK, "password": ACL_SK})
    return {"authenticationEnabled": "true",
            "authenticationProvider":
                "org.apache.rocketmq.auth.authentication.provider.DefaultAuthenticationProvider",
            "authenticationMetadataProvider":
                "org.apache.rocketmq.auth.authentication.provider.LocalAuthenticationMetadataProvider",
            "initAuthenticationUser": user,
            "innerClientAuthenticationCredentials": json.dumps({"accessKey": ACL_AK, "secretKey": ACL_SK})}


def _acl_or_error(base: Path, life) -> dict:
    try:
        return _acl_steps(base, life)
    except Exception as e:  # noqa: BLE001 - that version's ACL test fails with it
        return {"error": f"{type(e).__name__}: {e}"}


def _wait_route(namesrv: str, topic: str, timeout: float = 90) -> None:
    """A topic created on a broker reaches the NameServer with the broker's next registration (5.3.3 may send
    it a while after UPDATE_AND_CREATE_TOPIC answered): wait until the NameServer routes it."""
    from jobs.recover.wire import Remote
    from txlog_io import remoting as R

    end = time.monotonic() + timeout
    while True:
        resp = Remote(10).call(namesrv, R.GET_ROUTEINFO_BY_TOPIC, {"topic": topic, "acceptStandardJsonOnly": "true"})
        if resp.code == R.SUCCESS:
            return
        if time.monotonic() > end:
            raise rb.HarnessError(f"NameServer {namesrv} still has no route for {topic} after {timeout:.0f} s: "
                                  f"code {resp.code} {resp.remark}")
        time.sleep(0.5)


def _acl_steps(base: Path, life):
    """A second broker of the version, named like the first, with ACL on; TopicRbTx created on it with a
    signed UPDATE_AND_CREATE_TOPIC (our own codec, right credentials).  ``recover`` runs on a copy of the
    audit's run list without recovery_log (which shows every request answered already)."""
    if life is None:
        return {"error": "the broker life failed"}
    from jobs.recover.wire import Remote
    from txlog_io import remoting as R

    v, name = life.version, _name(life.version)
    c = rb.Cluster(v, base / f"acl-{name}", tx_settings=_acl_settings(v))
    (c.home / "conf" / "plain_acl.yml").write_text(ACL_YML.format(ak=ACL_AK, sk=ACL_SK))
    nolog = base / f"out-acl-{name}"
    steps = {}
    try:
        c.start()
        addr = f"127.0.0.1:{c.broker_port}"
        topic = {"topic": "TopicRbTx", "defaultTopic": "TBW102", "readQueueNums": 4, "writeQueueNums": 4,
                 "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": "false"}
        steps["unsigned_create"] = Remote(10).call(addr, R.UPDATE_AND_CREATE_TOPIC, topic)
        steps["create"] = Remote(10, R.Credentials(ACL_AK, ACL_SK)).call(addr, R.UPDATE_AND_CREATE_TOPIC, topic)
        if steps["create"].code == R.SUCCESS:
            _wait_route(c.namesrv_addr, topic["topic"])
        common = ["recover", "--out", str(nolog), "--run-id", "a1", "--broker", name, "--namesrv",
                  c.namesrv_addr, "--live-broker", "broker-a", "--decisions", str(base / f"decisions-{name}.txt")]
        env = dict(os.environ, TXAUDIT_ACL_ACCESS_KEY=ACL_AK, TXAUDIT_ACL_SECRET_KEY=ACL_SK + "-wrong")
        steps["wrong"] = _submit(*common, "--send", env=env)
        steps["log_after_wrong"] = len(_log_rows(nolog, name))
        good = base / f"acl-{name}.properties"
        good.write_text(f"accessKey={ACL_AK}\nsecretKey={ACL_SK}\n")
        steps["right"] = _submit(*common, "--acl-file", str(good))
    finally:
        c.close()
    return steps


def _life(lives, version) -> Life:
    life = lives["lives"][version]
    if life.error:
        pytest.fail(f"{version}: broker life failed: {life.error}")
    return life


def _ok(p: subprocess.CompletedProcess, what: str):
    assert p.returncode == 0, f"{what}: exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


def _log_rows(out: Path, broker: str):
    import deltalake
    import pandas as pd
    if not (out / "recovery_log" / "_delta_log").is_dir():
        return pd.DataFrame({"broker": []})
    df = deltalake.DeltaTable(str(out / "recovery_log")).to_pandas()
    return df[df["broker"] == broker]


@pytest.mark.parametrize("version", rb.VERSIONS)
def test_recover_round_trip(lives, version):
    life = _life(lives, version)
    name = _name(version)
    _ok(lives["audit1"], "audit 1")
    st = lives["recover"][version]
    # NameServer down: one line, exit 2, nothing written
    dead = st["dead_ns"]
    err = [ln for ln in dead.stderr.splitlines() if "error" in ln]
    assert dead.returncode == 2 and len(err) == 1 and "NameServer" in err[0] and "cannot connect" in err[0], \
        dead.stderr
    assert not st["log_after_dead_ns"]
    # dry run: prints each request, sends and writes nothing
    _ok(st["dry"], "dry run")
    assert st["dry"].stdout.count("WOULD SEND") == 2 + INFLIGHT, st["dry"].stdout
    assert not st["log_after_dry"]
    _ok(st["send"], "recover --send")
    log = _log_rows(lives["out"], name)
    by_uniq = {t.uniq: t for t in life.truth.values()}
    discarded = {t.uniq for t in life.truth.values() if t.state == "DISCARDED"}
    assert len(discarded) == 2
    got = {(r.uniq_key, r.request, r.decision, r.outcome, int(r.response_code)) for r in log.itertuples()}
    want = {(u, "RESUME_CHECK_HALF_MESSAGE", None, "OK", 0) for u in discarded} | \
        {(u, "END_TRANSACTION", d, "OK", 0) for u, d in st["decisions"].items()}
    assert {(a, b, c if isinstance(c, str) else None, d, e) for a, b, c, d, e in got} == want, \
        log.to_string()
    assert set(log["live_broker"]) == {"broker-a"} and set(log["broker_addr"]) == \
        {f"127.0.0.1:{life.cluster.broker_port}"}
    for h in log["header"]:
        assert "Signature" not in h and "AccessKey" not in h
    # a second --send: everything already answered SUCCESS, nothing sent, nothing logged
    _ok(st["again"], "recover --send again")
    assert f"{len(want)} already answered SUCCESS" in st["again"].stderr and "nothing sent" in st["again"].stderr
    assert len(_log_rows(lives["out"], name)) == len(want)
    # without recovery_log: the resumed and the committed transactions are stale by the broker's index (a half
    # copy after the discard record; a real-topic message); a ROLLBACK leaves no indexed trace (only an op
    # record), so it would be sent again -- harmless, the broker writes one more op record for that half
    stale = st["stale"]
    _ok(stale, "recover without recovery_log")
    lines = stale.stdout.splitlines()
    assert sum(ln.startswith("REFUSED_STALE") and "RESUME_CHECK_HALF_MESSAGE" in ln and "resumed it" in ln
               for ln in lines) == 2, stale.stdout
    assert sum(ln.startswith("REFUSED_STALE") and "END_TRANSACTION COMMIT" in ln and "committed" in ln
               for ln in lines) == 1, stale.stdout
    assert sum(ln.startswith("WOULD SEND") and "END_TRANSACTION ROLLBACK" in ln for ln in lines) == 1, stale.stdout
    # the second audit: exactly the recovered transactions changed
    _ok(lives["audit2"], "audit 2")
    a1 = _tables(lives["out"], "a1")
    a2 = _tables(lives["out"], "a2")
    s1 = dict(zip(a1[a1["broker"] == name]["uniq_key"], a1[a1["broker"] == name]["state"], strict=True))
    s2 = dict(zip(a2[a2["broker"] == name]["uniq_key"], a2[a2["broker"] == name]["state"], strict=True))
    assert s1 == {u: t.state for u, t in by_uniq.items()}, (s1, life.truth)
    expect2 = dict(s1)
    for u, d in st["decisions"].items():
        expect2[u] = {"COMMIT": "COMMITTED", "ROLLBACK": "ROLLED_BACK"}[d]
    for u in discarded:
        expect2[u] = "PREPARED"             # resumed: a fresh half copy after the discard record
    assert s2 == expect2, {u: (s1.get(u), s2.get(u), expect2.get(u)) for u in expect2}
    print(f"\n{version} recovery_log:\n" + log[["transaction_key", "request", "decision", "outcome",
                                                 "response_code", "remark", "latency_ms"]].to_string() +
          f"\n{version} audit a1 -> a2: " + json.dumps({by_uniq[u].key: [s1[u], s2[u]] for u in s1}),
          file=sys.stderr)


@pytest.mark.parametrize("version", rb.VERSIONS)
def test_recover_acl_wrong_secret(lives, version):
    _life(lives, version)
    st = lives["acl"][version]
    assert "error" not in st, st
    from txlog_io import remoting as R
    assert st["unsigned_create"].code != R.SUCCESS, "the ACL broker accepted an unsigned request"
    assert st["create"].code == R.SUCCESS, (st["create"].code, st["create"].remark)
    wrong = st["wrong"]
    err = [ln for ln in wrong.stderr.splitlines() if "error" in ln]
    assert wrong.returncode == 2 and len(err) == 1 and "ACL" in err[0], wrong.stderr
    assert "WOULD SEND" not in wrong.stdout and "OK " not in wrong.stdout and st["log_after_wrong"] == 0
    # the right secret passes the broker's signature check: the requests are then refused because this
    # broker does not hold those transactions (its index does not show them)
    right = st["right"]
    _ok(right, "recover with the right secret")
    assert right.stdout.count("REFUSED_UNVERIFIABLE") == 2 + INFLIGHT, right.stdout
    for p in (wrong, right):
        assert ACL_SK not in p.stdout + p.stderr
    print(f"\n{version} ACL: unsigned UPDATE_AND_CREATE_TOPIC -> code {st['unsigned_create'].code} "
          f"({(st['unsigned_create'].remark or '')[:160]}); wrong secret -> exit 2: {err[0][:300]}", file=sys.stderr)


@pytest.mark.parametrize("version", rb.VERSIONS)
def test_golden_frames_are_rocketmqs(tmp_path, version):
    """tests/data/remoting_golden.json is what GoldenFrames.java prints with each version's jars."""
    golden = json.loads((DATA / "remoting_golden.json").read_text())
    for v in [version]:
        try:
            lib = rb.ensure_lib(v)
        except rb.FetchUnavailable as e:
            pytest.skip(f"REAL-BROKER TESTS SKIPPED: {e}")
        classes = tmp_path / f"golden-{v}"
        classes.mkdir(exist_ok=True)
        src = Path(rb.__file__).parent / "GoldenFrames.java"
        subprocess.run([rb.java_bin("javac"), "-nowarn", "-cp", rb.classpath(lib), "-d", str(classes), str(src)],
                       check=True, capture_output=True, timeout=300)
        p = subprocess.run([rb.java_bin(), "-cp", rb.classpath(lib, classes), "GoldenFrames"], capture_output=True,
                           text=True, timeout=120, check=True)
        frames = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
        assert frames == golden[v]
