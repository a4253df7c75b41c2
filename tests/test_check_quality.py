"""The CI data-quality mode's Spark-free parts: metric registry and computation over Arrow tables, the checks
file (conditions, validation errors naming file/check/key), evaluation (levels, *_change, samples), the JSON
and JUnit outputs, and run_check on Delta tables written here (no Spark, no store)."""
from __future__ import annotations

import datetime as dt
import json
import math
import xml.etree.ElementTree as ET

import pyarrow as pa
import pytest

from jobs.check.checks import ChecksFileError, load_checks, parse_checks, parse_condition
from jobs.check.metrics import (
    FINDING_KINDS,
    RunData,
    UnknownMetricError,
    check_metric_name,
    compute_metrics,
    metric_names,
    samples,
)


def _tx(rows):
    cols = ("broker", "transaction_key", "state", "flags", "age_ms", "deadline_ms", "as_of_ms")
    return pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)},
                    schema=pa.schema([("broker", pa.string()), ("transaction_key", pa.string()),
                                      ("state", pa.string()), ("flags", pa.list_(pa.string())),
                                      ("age_ms", pa.int64()), ("deadline_ms", pa.int64()),
                                      ("as_of_ms", pa.int64())]))


NOW = 1_000_000


def _data():
    tx = _tx([
        ("a", "k1", "COMMITTED", ["DUPLICATE_COMMIT", "DUPLICATE_COMMIT"], 10, None, NOW),
        ("a", "k2", "PREPARED", ["PREPARED_PAST_TIMEOUT", "PAST_DEADLINE"], 5000, NOW - 1, NOW),
        ("a", "k3", "PREPARED", [], 2000, NOW + 5, NOW),
        ("b", "k4", "ROLLED_BACK", [], 1, None, NOW),
        ("b", "k5", "PREPARED", ["PREPARED_PAST_TIMEOUT"], 9000, NOW, NOW),
    ])
    cb = pa.table({"broker": ["a", "b"], "transaction_key": ["k2", "k5"], "priority": ["CRITICAL", "HIGH"],
                   "urgency_rank": pa.array([1, 1], pa.int32())})
    rec = pa.table({"broker": ["a"], "transaction_key": ["k1"], "action": ["REVIEW_DUPLICATE_COMMIT"]})
    fnd = pa.table({"broker": ["a", "b", "b"], "code": ["BODY_CRC_MISMATCH", "OP_WITHOUT_HALF", "NEW_KIND"],
                    "transaction_key": pa.array([None, None, None], pa.string()),
                    "file": ["/s/commitlog/0", None, None],
                    "position": pa.array([42, None, None], pa.int64()),
                    "physical_offset": pa.array([42, 77, None], pa.int64())})
    return RunData("r1", ("a", "b", "c"), tx, cb, rec, fnd)


def test_metrics_per_broker_and_all():
    m = compute_metrics(_data())
    a = lambda n: m[("broker", "a", n)]  # noqa: E731
    b = lambda n: m[("broker", "b", n)]  # noqa: E731
    al = lambda n: m[("all", "*", n)]  # noqa: E731
    assert (a("transactions"), b("transactions"), al("transactions")) == (3, 2, 5)
    assert m[("broker", "c", "transactions")] == 0 and m[("broker", "c", "share.state.PREPARED")] == 0
    assert (a("state.PREPARED"), al("state.PREPARED"), al("state.DISCARDED")) == (2, 3, 0)
    assert a("flag.DUPLICATE_COMMIT") == 1                       # listed twice, one transaction
    assert (a("prepared_past_timeout"), al("prepared_past_timeout")) == (1, 2)
    ppd = "prepared_past_deadline"
    assert (a(ppd), b(ppd), al(ppd)) == (1, 1, 2)
    assert (a("max_prepared_age_s"), al("max_prepared_age_s")) == (5.0, 9.0)
    assert (al("check_back"), al("check_back.CRITICAL"), b("check_back.HIGH")) == (2, 1, 1)
    assert (al("recovery"), a("recovery.REVIEW_DUPLICATE_COMMIT"), b("recovery")) == (1, 1, 0)
    assert (al("findings"), a("findings.BODY_CRC_MISMATCH"), b("findings.NEW_KIND")) == (3, 1, 1)
    assert b("flag.OP_WITHOUT_HALF") == 1                        # ANOMALY_ONLY: counted from the findings
    assert al("share.state.PREPARED") == pytest.approx(3 / 5)
    assert ("all", "*", "share.max_prepared_age_s") not in m
    # every registry name has a value in every scope
    for name in metric_names():
        for scope in (("broker", "a"), ("broker", "c"), ("all", "*")):
            assert (*scope, name) in m, name


def test_samples_are_keys_or_findings():
    d = _data()
    assert samples(d, "prepared_past_timeout", None) == ["b:k5", "a:k2"]     # oldest first
    assert samples(d, "flag.DUPLICATE_COMMIT", "a") == ["a:k1"]
    assert samples(d, "share.state.PREPARED", "a") == ["a:k2", "a:k3"]
    assert samples(d, "findings", None) == ["/s/commitlog/0@42", "b:commitlog@77", "b:NEW_KIND"]
    assert samples(d, "flag.OP_WITHOUT_HALF", None) == ["b:commitlog@77"]
    assert samples(d, "check_back.HIGH", None) == ["b:k5"]
    assert len(samples(d, "transactions", None, limit=2)) == 2


def test_metric_names_validation():
    for ok in ("transactions", "flag.DUPLICATE_COMMIT", "share.flag.CQ_MISMATCH", "check_back.CRITICAL",
               "recovery.MARK_DONE", "findings.INDEX_INCOMPLETE", "findings.CQ_MISMATCH", "state.PREPARED"):
        assert check_metric_name(ok) == ok
    assert "INDEX_INCOMPLETE" in FINDING_KINDS
    for bad, word in (("flag.NOPE", "'NOPE'"), ("nonsense", "'nonsense'"),
                      ("share.max_prepared_age_s", "count"),
                      ("state.OPEN", "'OPEN'"), ("check_back.LOW", "'LOW'"),
                      ("share.share.transactions", "share")):
        with pytest.raises(UnknownMetricError, match=word):
            check_metric_name(bad)


@pytest.mark.parametrize("text,x,expected", [
    ("> 0", 1, True), ("> 0", 0, False), (">= 2", 2, True), ("< 1.5", 1, True), ("<= -1", -1, True),
    ("= 3", 3, True), ("== 3", 4, False), ("!= 3", 4, True), ("between 1 and 5", 5, True),
    ("between 5 and 1", 0, False), ("not between 1 and 5", 6, True), ("NOT BETWEEN 1 AND 5", 3, False),
    ("> 50%", 60, True), ("between -10% and 10%", -10, True)])
def test_conditions(text, x, expected):
    assert parse_condition(text).holds(x) is expected


@pytest.mark.parametrize("bad", ["0", "> ", "gt 5", "between 1 and", "between 1% and 2", ">> 1", "> 1 2"])
def test_bad_conditions(bad):
    with pytest.raises(ValueError):
        parse_condition(bad)


def _parse(items):
    return parse_checks({"checks": items}, "/x/checks.yaml")


@pytest.mark.parametrize("items,words", [
    ([{"name": "a", "metric": "flag.NOPE", "fail": "> 0"}], ["check #1 'a'", "key 'metric'", "'NOPE'"]),
    ([{"name": "a", "metric": "findings", "fail": "more than 3"}], ["key 'fail'", "more than 3"]),
    ([{"name": "a", "metric": "findings"}], ["check #1 'a'", "no condition"]),
    ([{"name": "a", "metric": "findings", "fail": "> 0", "severity": 1}], ["key 'severity'"]),
    ([{"name": "a", "metric": "findings", "fail": "> 1%"}], ["key 'fail'", "%"]),
    ([{"name": "a", "metric": "findings", "fail": 0}], ["key 'fail'", "bare number"]),
    ([{"name": "a", "metric": "findings", "fail": "> 0"},
      {"name": "a", "metric": "check_back", "warn": "> 0"}], ["check #2 'a'", "duplicate"]),
    ([{"metric": "findings", "fail": "> 0"}], ["check #1", "key 'name'"]),
    ([{"name": "a", "fail": "> 0"}], ["key 'metric'", "missing"]),
    ([{"name": "a", "metric": "findings", "fail": "> 0", "broker": ["x", "*"]}], ["key 'broker'"]),
])
def test_checks_file_errors_name_file_check_and_key(items, words):
    with pytest.raises(ChecksFileError) as e:
        _parse(items)
    msg = str(e.value)
    assert msg.startswith("checks file /x/checks.yaml")
    for w in words:
        assert w in msg, (w, msg)


def test_yaml_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("checks:\n  - name: a\n    metric: [unclosed\n")
    with pytest.raises(ChecksFileError, match=r"checks file .*c\.yaml: invalid YAML at line \d+, column \d+"):
        load_checks(str(p))
    p.write_text('checks:\n  - name: a\n    metric: findings\n    fail: > 0\n')
    with pytest.raises(ChecksFileError, match=r"line 4, .*quote the condition"):
        load_checks(str(p))
    p.write_text("- just a list\n")
    with pytest.raises(ChecksFileError, match="expected a mapping"):
        load_checks(str(p))
    p.write_text("checks: []\nextra: 1\n")
    with pytest.raises(ChecksFileError, match="key 'extra'"):
        load_checks(str(p))
    with pytest.raises(ChecksFileError, match="cannot read"):
        load_checks(str(tmp_path / "missing.yaml"))


def test_default_checks_file_is_valid():
    from jobs.config import conf_dir

    checks = load_checks(str(conf_dir() / "checks-default.yaml"))
    assert len(checks.checks) >= 8
    assert {c.level for c in checks.checks} == {"fail", "warn"}
    assert any(c.has_change for c in checks.checks)


def test_evaluate_levels_change_and_errors():
    from jobs.check.checks import evaluate, exit_code, statistics

    checks = _parse([
        {"name": "dup", "metric": "flag.DUPLICATE_COMMIT", "fail": "> 0"},
        {"name": "pending", "metric": "prepared_past_timeout", "warn": "> 0", "fail": "> 100"},
        {"name": "backlog", "metric": "check_back", "warn_change": "> 50%", "broker": "each"},
        {"name": "abs change", "metric": "transactions", "fail_change": "< -1"},
        {"name": "ghost", "metric": "findings", "warn": "> 0", "broker": "zz"},
        {"name": "share", "metric": "share.state.PREPARED", "warn": "> 50%"},
    ])
    d = _data()
    m = compute_metrics(d)
    prev = {("broker", "a", "check_back"): 0.0, ("broker", "b", "check_back"): 1.0,
            ("all", "*", "transactions"): 8.0}

    def previous(entity, instance, name):
        v = prev.get((entity, instance, name))
        return (v, "r0") if v is not None else (None, None)

    res = evaluate(checks, m, d.brokers, previous, lambda metric, b: samples(d, metric, b))
    by = {(r.check, r.broker): r for r in res}
    assert by[("dup", "*")].status == "FAIL" and by[("dup", "*")].samples == ["a:k1"]
    assert by[("dup", "*")].condition == "fail: > 0" and by[("dup", "*")].level == "fail"
    p = by[("pending", "*")]
    assert (p.status, p.value, p.condition, p.level) == ("WARN", 2.0, "warn: > 0", "fail")
    assert by[("backlog", "a")].status == "WARN"                 # 0 -> 1: +inf %
    assert by[("backlog", "a")].previous_value == 0.0
    assert by[("backlog", "b")].status == "PASS" and "previous 1" in by[("backlog", "b")].message  # 1 -> 1
    assert by[("backlog", "c")].status == "PASS" and "no previous run" in by[("backlog", "c")].message
    assert by[("backlog", "c")].samples == [] and by[("backlog", "c")].previous_value is None
    assert by[("abs change", "*")].status == "FAIL" and "changed -3 from 8" in by[("abs change", "*")].message
    assert by[("ghost", "zz")].status == "ERROR" and "key 'broker'" in by[("ghost", "zz")].message
    assert by[("share", "*")].status == "WARN"                  # 3/5 = 60% > 50%
    assert statistics(res) == {"evaluated": 8, "passed": 2, "warned": 3, "failed": 2, "errors": 1}
    assert exit_code(res) == 3
    assert exit_code([r for r in res if r.status != "ERROR"]) == 2
    assert exit_code([r for r in res if r.status in ("PASS", "WARN")]) == 1
    assert exit_code([r for r in res if r.status == "PASS"]) == 0


# ------------------------------------------------------------------------------------------------------------
# run_check on Delta tables written without Spark (the --out path)
# ------------------------------------------------------------------------------------------------------------

def _write_run(out, run_id, as_of, data: RunData, brokers):
    """Minimal audit outputs of one run (only the columns check reads), with delta_sink's driver path."""
    from jobs.check.evaluate import write_arrow
    from schemas.core import Column, Table

    run_date = as_of.date()

    def table_of(name, t: pa.Table):
        cols = [Column(f.name, f.type) for f in t.schema]
        return Table.of(name, cols, partition_by=("run_date",))

    for name, t in (("transactions", data.transactions), ("check_back_worklist", data.check_back),
                    ("recovery_worklist", data.recovery), ("audit_anomalies", data.findings)):
        t = t.append_column("run_id", pa.array([run_id] * t.num_rows, pa.string())) \
             .append_column("run_date", pa.array([run_date] * t.num_rows, pa.date32()))
        write_arrow(str(out), table_of(name, t.drop_columns(["run_id", "run_date"])), t, run_id, run_date)
    runs = pa.table({"run_id": [run_id], "run_date": pa.array([run_date], pa.date32()),
                     "as_of": pa.array([as_of], pa.timestamp("us", tz="UTC")),
                     "finished_at": pa.array([as_of], pa.timestamp("us", tz="UTC")),
                     "brokers": pa.array([list(brokers)], pa.list_(pa.string())),
                     "table_paths": pa.array([[]], pa.map_(pa.string(), pa.string()))})
    write_arrow(str(out), table_of("audit_runs", runs.drop_columns(["run_id", "run_date"])), runs, run_id,
                run_date)


def test_run_check_on_delta_tables_history_and_outputs(tmp_path):
    from deltalake import DeltaTable

    from jobs.check.evaluate import CheckError, run_check
    from jobs.check.output import format_results, json_document, junit_xml, summary_line

    d = _data()
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    small = RunData("r0", ("a", "b", "c"), d.transactions.slice(0, 1), d.check_back.slice(0, 0),
                    d.recovery.slice(0, 0), d.findings.slice(0, 0))
    _write_run(tmp_path, "r0", t0, small, ("a", "b", "c"))
    _write_run(tmp_path, "r1", t0 + dt.timedelta(days=1), d, ("a", "b", "c"))
    checks = _parse([{"name": "grew", "metric": "transactions", "warn_change": "> 100%"},
                     {"name": "dup", "metric": "flag.DUPLICATE_COMMIT", "fail": "> 5"}])
    rep = run_check(checks, str(tmp_path))                      # latest run: r1, previous r0 (computed)
    assert rep.run.run_id == "r1" and rep.exit_code == 1
    grew = rep.results[0]
    assert (grew.value, grew.previous_value, grew.status) == (5.0, 1.0, "WARN")
    assert "+400.0%" in grew.message and "run r0" in grew.message
    metrics = DeltaTable(str(tmp_path / "metrics")).to_pyarrow_table().to_pylist()
    assert {r["run_id"] for r in metrics} == {"r1"}
    assert {(r["entity"], r["instance"]) for r in metrics} == {("broker", "a"), ("broker", "b"),
                                                               ("broker", "c"), ("all", "*")}
    # check r0 explicitly: no previous run; then r1 again reads r0's metrics from the table
    rep0 = run_check(checks, str(tmp_path), run_id="r0")
    assert rep0.exit_code == 0 and "no previous run" in rep0.results[0].message
    rep1 = run_check(checks, str(tmp_path), run_id="r1")
    assert rep1.results[0].previous_value == 1.0
    cr = DeltaTable(str(tmp_path / "check_results")).to_pyarrow_table()
    assert sorted(cr.column("run_id").to_pylist()) == ["r0", "r0", "r1", "r1"]     # r1 replaced, not added
    assert set(cr.schema.names) >= {"run_id", "check", "metric", "broker", "level", "status", "value",
                                    "condition", "previous_value", "message", "samples"}
    # outputs
    doc = json.loads(json.dumps(json_document(rep1)))
    assert doc["success"] is True and doc["statistics"] == {"evaluated": 2, "passed": 1, "warned": 1,
                                                            "failed": 0, "errors": 0}
    suite = ET.fromstring(junit_xml(rep1)).find("testsuite")
    cases = suite.findall("testcase")
    assert len(cases) == 2 and suite.get("failures") == "0"
    assert cases[0].find("failure") is None and "WARN" in cases[0].find("system-out").text
    assert "WARN" in format_results(rep1) and summary_line(rep1).endswith("WARN (exit 1)")
    with pytest.raises(CheckError, match="--run-id nope"):
        run_check(checks, str(tmp_path), run_id="nope")
    with pytest.raises(CheckError, match="no finished audit run"):
        run_check(checks, str(tmp_path / "empty"))
    assert not math.isnan(rep1.seconds["total"])


def test_command_exit_3_on_audit_failure_and_unreadable_table(monkeypatch, tmp_path, capsys):
    """A Spark/audit failure and a run whose table is gone: one error line, exit 3 (not a traceback only)."""
    import shutil

    import jobs.audit.run
    import jobs.session
    from jobs.check.cli import CheckOptions, run_check_command
    from jobs.config import load_audit_config

    checks = _parse([{"name": "dup", "metric": "flag.DUPLICATE_COMMIT", "fail": "> 0"}])

    class FakeSpark:
        stopped = False

        def stop(self):
            FakeSpark.stopped = True

    def boom(spark, opts):
        raise RuntimeError("Job aborted: executor lost\n\tat org.apache.spark...")

    monkeypatch.setattr(jobs.session, "build_session", lambda **kw: FakeSpark())
    monkeypatch.setattr(jobs.audit.run, "run_audit", boom)
    cfg = load_audit_config()
    opts = CheckOptions(checks=checks, out=str(tmp_path), run_id="r1", json_path=None, junit_path=None,
                        config=cfg, audit=object())
    assert run_check_command(opts) == 3 and FakeSpark.stopped
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("txaudit: error:")]
    assert err == ["txaudit: error: check failed: the audit failed: RuntimeError: Job aborted: executor lost"]

    d = _data()
    _write_run(tmp_path, "r1", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), d, d.brokers)
    shutil.rmtree(tmp_path / "recovery_worklist")
    opts = CheckOptions(checks=checks, out=str(tmp_path), run_id=None, json_path=None, junit_path=None,
                        config=cfg, audit=None)
    assert run_check_command(opts) == 3
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("txaudit: error:")]
    assert len(err) == 1 and "recovery_worklist" in err[0] and "no Delta table" in err[0]


def test_command_error_results_give_one_line(tmp_path, capsys):
    from jobs.check.cli import CheckOptions, run_check_command
    from jobs.config import load_audit_config

    d = _data()
    _write_run(tmp_path, "r1", dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), d, d.brokers)
    checks = _parse([{"name": "x", "metric": "findings", "fail": "> 0", "broker": ["nope", "zz"]},
                     {"name": "y", "metric": "transactions", "warn": "> 0"}])
    opts = CheckOptions(checks=checks, out=str(tmp_path), run_id=None, json_path=str(tmp_path / "r.json"),
                        junit_path=str(tmp_path / "r.xml"), config=load_audit_config(), audit=None)
    assert run_check_command(opts) == 3
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.startswith("txaudit: error:")]
    assert len(err) == 1 and "'nope'" in err[0] and "1 more ERROR" in err[0]
    assert cap.out.splitlines()[-1].endswith("ERROR (exit 3)")
    suite = ET.parse(tmp_path / "r.xml").getroot().find("testsuite")
    assert suite.get("errors") == "2" and len(suite.findall("testcase/error")) == 2
    assert json.loads((tmp_path / "r.json").read_text())["statistics"]["errors"] == 2
