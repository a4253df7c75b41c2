"""``audit --incremental`` (jobs/read/incremental/plan.py): auditing snapshots 1..k of one growing reference-broker
store incrementally gives at snapshot k exactly what a full audit of snapshot k gives (transactions with their
flags, both work lists, findings, profiles), for several profiles and for crashes, retention and a 3.x
statetable rebuild between snapshots; and every reason to fall back to a full audit is reported."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

AS_OF = "2026-11-23T00:00:00Z"
#: the default settings (a small split.bytes would also cut every consume-queue file into hundreds of tasks);
#: small CommitLog files instead: the resume offset lands in later files, retention deletes whole files
CONF = "# defaults\n"
COMPARED = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies", "profiles")


def _opts(out, stores, run_id, conf, *extra, as_of=AS_OF):
    from jobs.main import parse_args

    args = ["audit", "--out", str(out), "--as-of", as_of, "--mode", "full", "--run-id", run_id, "--no-report",
            "--conf-file", str(conf), *extra]
    for broker, store in stores:
        args += ["--store", str(store), "--broker", broker]
    return parse_args(args)[1]


def _audit(spark, out, stores, run_id, conf, *extra, as_of=AS_OF):
    from jobs.audit.run import run_audit

    return run_audit(spark, _opts(out, stores, run_id, conf, *extra, as_of=as_of), print_summary=False)


def _rows(out, table, run_id):
    from jobs.delta.tables import read_table as read_rows

    t = read_rows(os.path.join(str(out), table), run_id=run_id)
    rows = [{k: v for k, v in r.items() if k not in ("run_id", "run_date")} for r in t.to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _sync(src: Path, dst: Path) -> None:
    """The live store becomes ``src`` (same directory, as a broker's store grows in place)."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)


def _conf(tmp: Path, text: str = CONF) -> Path:
    path = tmp / "audit.properties"
    path.write_text(text)
    return path


def _incremental_info(out, run_id):
    from jobs.delta.tables import read_table as read_rows

    row = read_rows(os.path.join(str(out), "audit_runs"), run_id=run_id).to_pylist()[0]
    return json.loads(row["config_json"])["incremental"]


CASES = [
    ("5.1+", "crashy", 45, None),      # crashes and abnormal restarts between snapshots, ends in a crash
    ("4.6-4.9", "retention", 45, None),  # retention deletes the oldest files after the last snapshot
    ("3.x", "legacy-3x", 45, None),    # 3.x statetable / redolog, the statetable rebuilt after a crash
    ("4.0-4.2", "clean", 30, None),    # no transaction index at all: every record found by the scan
    # halves re-checked before their (batched) ops are flushed: late ops and duplicate commits for halves
    # an earlier snapshot already saw resolved (one snapshot half-way: two incremental runs)
    ("5.1+", "checkmax-storm", 40, 20),
]
#: profiles whose resolved transactions settle (jobs/reconstruct/settle.py): carried as rows, not records
SETTLING = ("4.3-4.5", "4.6-4.9", "5.0", "5.1+")
#: cases where some run's state must carry settled transactions (5.1+ batches ops across the tiny CommitLog
#: files of these stores, so its transactions span files and stay records)
SETTLES = {("4.6-4.9", "retention"), ("4.6-4.9", "crashy")}


@pytest.mark.parametrize("profile,scenario,n_tx,every", CASES, ids=[f"{p}-{s}" for p, s, _, _ in CASES])
def test_incremental_equals_full(spark, tmp_path, profile, scenario, n_tx, every):
    _equivalence(spark, tmp_path, profile, scenario, n_tx, every=every)


@pytest.fixture(scope="module")
def settling(spark, tmp_path_factory):
    """One growing 4.6-4.9 store with crashes (re-put copies and re-checks after a crash, unbatched ops:
    transactions settle between runs), audited incrementally at its one snapshot and at its final state on
    the driver, then the final state three more times: once more on the driver (continuing a state with
    settled rows), once read through the DataFrame plan and reduced on the driver (the settled rows read as
    a DataFrame, collected for the reduce), then read through the DataFrame plan and reduced on the executors
    with the settled rows carried.  The tests below check the runs of this one fixture; ``final_seen``:
    ``_watch_final`` of the two DataFrame-plan runs."""
    import jobs.audit.run
    import jobs.reconstruct.spark

    tmp = tmp_path_factory.mktemp("incr-settling")
    seen: dict = {}

    @contextlib.contextmanager
    def last_run_distributed(k, n):
        with pytest.MonkeyPatch.context() as mp:
            if k == n - 1:
                mp.setattr(jobs.reconstruct.spark, "LOCAL_MAX_ROWS", 0)
                _watch_final(mp, seen.setdefault(f"s{k}", {}))
            elif k == n - 2:        # no one-job read: the DataFrame plan, its few rows reduced on the driver
                mp.setattr(jobs.audit.run, "read_local", lambda *args, **kw: None)
                _watch_final(mp, seen.setdefault(f"s{k}", {}))
            yield

    g = _grow(spark, tmp, "4.6-4.9", "crashy", 45, every=25, one_job=None, run_with=last_run_distributed,
              repeat_last=3, keep_states=True)
    g.final_seen = seen
    return g


def _watch_final(mp, got: dict) -> None:
    """Records in ``got`` how a run's plan carries the settled rows once its DataFrame read has them
    (``final``: the object's type) and how often they are read into one driver-side Arrow table
    (``driver_reads``: calls of ``_carried_final``)."""
    import jobs.read.incremental.read as incremental_read

    evidence, carried_final = incremental_read.evidence, incremental_read._carried_final
    got.update(final=None, driver_reads=0)

    def watched(spark, plan, *args, **kw):
        out = evidence(spark, plan, *args, **kw)
        final = (plan.carried or {}).get("final")
        got["final"] = None if final is None else type(final)
        return out

    def on_driver(plan):
        got["driver_reads"] += 1
        return carried_final(plan)

    mp.setattr(incremental_read, "evidence", watched)
    mp.setattr(incremental_read, "_carried_final", on_driver)


def test_settling_store_equals_full_run_by_run(settling):
    """Every snapshot's run continues the previous state; each audit of the final store (the first, the
    driver run carrying settled rows, the distributed run) equals the full audit table by table; settled
    transactions are carried as rows."""
    g = settling
    for k in range(len(g.states) - 3, len(g.states)):
        _assert_equal_to_full(g, f"s{k}")
    settled = [h["finals"] for h in g.headers]
    assert max(settled) > 0, g.headers
    assert max(settled) <= len(_rows(g.full_out, "transactions", "full"))


def test_settled_rows_carried_by_a_driver_run(settling):
    """The final store audited a second time on the driver: the run continues a state with settled rows
    written by the run before and reduces with them carried (no reopening)."""
    g = settling
    first, again = f"s{len(g.states) - 3}", f"s{len(g.states) - 2}"
    assert g.infos[again]["continued"] and g.infos[again]["fallback"] is None, g.infos[again]
    assert first in g.final_segments[again]                 # settled rows written by the run before ...
    assert g.headers[-2]["finals"] > 0                       # ... and carried by this one


def test_settled_rows_reach_a_reduction_on_executors(settling):
    """The last run reads through the DataFrame plan and reduces on the distributed path with the settled rows
    carried (its state passes them on): it continues the state without reopening a settled transaction and
    equals the full audit (checked above)."""
    g = settling
    last = f"s{len(g.states) - 1}"
    assert "read.job" not in g.phases[last], sorted(g.phases[last])
    assert g.infos[last]["continued"] and g.infos[last]["fallback"] is None, g.infos[last]
    assert g.headers[-1]["finals"] > 0, g.headers[-1]


def test_settled_rows_collected_for_a_reduce_on_the_driver(settling):
    """The settling fixture's run that reads through the DataFrame plan but reduces on the driver (few rows):
    the settled rows come as a DataFrame, are collected for the reduce (jobs.read.incremental.read
    .carried_final_arrow), the run continues without reopening and equals the full audit table by table."""
    from pyspark.sql import DataFrame

    g = settling
    run = f"s{len(g.states) - 2}"
    assert g.headers[-3]["finals"] > 0, g.headers[-3]
    assert "read.job" not in g.phases[run] and "reconstruct.reduce" in g.phases[run], sorted(g.phases[run])
    assert g.infos[run]["continued"] and g.infos[run]["fallback"] is None, g.infos[run]
    seen = g.final_seen[run]
    assert seen["final"] is not None and issubclass(seen["final"], DataFrame), seen
    assert seen["driver_reads"] == 0, seen
    _assert_equal_to_full(g, run)


def test_settled_rows_reach_the_executors_as_a_frame(settling):
    """On the distributed path the carried settled rows are a DataFrame the executors read, never one Arrow
    table on the driver: the settling fixture's last run (DataFrame read, distributed reduce, continuing a
    state with settled rows) carried them so and read none into Arrow, and equals the full audit table by
    table."""
    from pyspark.sql import DataFrame

    g = settling
    last = f"s{len(g.states) - 1}"
    assert g.headers[-2]["finals"] > 0, g.headers[-2]           # the state it continues has settled rows
    seen = g.final_seen[last]
    assert seen["final"] is not None and issubclass(seen["final"], DataFrame), seen
    assert seen["driver_reads"] == 0, seen
    _assert_equal_to_full(g, last)


@pytest.fixture(scope="module")
def settling_on_executors(spark, tmp_path_factory):
    """The settling fixture's store and snapshots with every run read through the DataFrame plan and reduced
    on the distributed path, so every state is written (and settled) from the executors."""
    import jobs.reconstruct.spark

    tmp = tmp_path_factory.mktemp("incr-settling-executors")

    @contextlib.contextmanager
    def distributed(k, n):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(jobs.reconstruct.spark, "LOCAL_MAX_ROWS", 0)
            yield

    return _grow(spark, tmp, "4.6-4.9", "crashy", 45, every=25, one_job=False, run_with=distributed,
                 keep_states=True)


def test_settled_on_executors_as_on_the_driver(settling, settling_on_executors):
    """States written from the executors settle (settled rows appear, their records leave the carried ones):
    after every run each carries what the driver-written state of the same run carries (records, op bodies,
    settled rows, header), and the last run equals the full audit table by table."""
    g, e = settling, settling_on_executors
    last = f"s{len(e.states) - 1}"
    _assert_equal_to_full(e, last)
    assert all(e.infos[f"s{k}"]["fallback"] is None for k in range(1, len(e.states))), e.infos
    assert max(h["finals"] for h in e.headers) > 0, e.headers      # every state was written by the executors
    for run_id, state in e.carried.items():
        want = g.carried[run_id]
        for table, rows in state.items():
            assert rows == want[table], f"{run_id} {table}: executors {len(rows)} rows vs driver {len(want[table])}"
        settled = {o for r in state["audit_state_final"] for o in r["record_offsets"]}
        assert not settled & {r["physical_offset"] for r in state["audit_state_records"]}, run_id
    assert e.carried[last]["audit_state_final"], "no settled rows"


def test_carried_rows_after_an_empty_part_reach_the_executors(spark):
    """The carried rows go to Spark as one Arrow table of parts (records, op bodies, findings, the settled
    rows' facts and consume-queue tuples); a part without rows must not end it (jobs.session.arrow_frame:
    PySpark's conversion stopped at the first empty batch, the settled rows' facts and tuples were lost and
    the distributed run reported their units as having no record).  End to end: the settling fixture's
    distributed run above."""
    import pyarrow.compute as pc

    from jobs.reconstruct.reducer import input_table, reduce_input
    from jobs.reconstruct.settle import consume_offsets, final_input
    from jobs.reconstruct.settle import settle as settle_rows
    from jobs.session import arrow_frame
    from schemas.recon import RECON_INPUT
    from tests.test_settle import FILE, OLD, B, _bodies, _offsets, _records

    records, offsets = _records(OLD), _offsets(2, 2)
    full = reduce_input(input_table(commitlog=records.drop_columns(["body"]), op_bodies=_bodies(records),
                                    consumer_offsets=offsets), None, None, 60000, True)
    got = settle_rows(records, _bodies(records), full["transactions"], consume_offsets(offsets), {B: FILE},
                      {B: [0, FILE]})
    assert got.final.num_rows == 2
    # as jobs.reconstruct.local.carried_input builds them: an empty findings part before the settled rows' input
    carried = pa.concat_tables([input_table(commitlog=got.records.drop_columns(["body"]), op_bodies=got.op_bodies,
                                            anomalies=None), RECON_INPUT.arrow_schema().empty_table(),
                                final_input(got.final, got.facts)])
    want = carried.group_by("src").aggregate([([], "count_all")])
    assert set(pc.unique(carried.column("src")).to_pylist()) >= {"commitlog", "op_body", "facts", "cq_record"}
    df = arrow_frame(spark, carried, RECON_INPUT.spark_schema())
    assert {r["src"]: r["count"] for r in df.groupBy("src").count().collect()} == dict(
        zip(*(want.column(c).to_pylist() for c in ("src", "count_all")), strict=True))


def test_a_table_without_rows_reaches_spark(spark):
    """arrow_frame of a table without rows (no chunk at all, one empty chunk, an empty batch dropped) that has
    a list column: an empty DataFrame of its columns.  PySpark's conversion failed on a nested column without
    chunks (``pa.chunked_array([])`` without a type), which the driver path's empty outputs (a run with no
    recovery row) are when asked for as frames."""
    from jobs.session import arrow_frame

    schema = pa.schema([("broker", pa.string()), ("flags", pa.list_(pa.string()))])
    one_empty = pa.Table.from_batches([pa.RecordBatch.from_pylist([], schema=schema)])
    for t in (pa.Table.from_batches([], schema=schema), schema.empty_table(), one_empty):
        df = arrow_frame(spark, t)
        assert df.columns == ["broker", "flags"] and df.count() == 0


def test_reopened_on_executors_as_on_the_driver(spark):
    """jobs.reconstruct.spark.reopened_frames (outputs reduced on the executors) names the same brokers as
    settle.reopened for settled DISCARDED and DUPLICATE_COMMIT rows: none while nothing new names them, the
    broker once it has CommitLog decoder findings (a late END reopens through the keys both compare)."""
    from jobs.reconstruct.settle import consume_offsets, final_input, reopened
    from jobs.reconstruct.settle import settle as settle_rows
    from jobs.reconstruct.spark import AuditResult, reopened_frames
    from tests.test_settle import DISC, FILE, B, _bodies, _offsets, _records, _run

    records, offsets = _records(DISC), _offsets(3, 1)
    full = _run(records, offsets)
    got = settle_rows(records, _bodies(records), full["transactions"], consume_offsets(offsets), {B: FILE},
                      {B: [0, FILE]})
    assert set(got.final.column("state").to_pylist()) == {"DISCARDED", "COMMITTED"}
    extra = final_input(got.final, got.facts)
    lost = pa.Table.from_pylist([{"broker": B, "source": "commitlog", "kind": "BAD_MAGIC", "file": "x",
                                  "position": 100, "physical_offset": FILE + 100, "length": 64, "detail": "x"}])
    for damage, want in ((None, []), (lost, [B])):
        inc = _run(got.records, offsets, extra, got.final, anomalies=damage)
        profile = {B: inc["profiles"].column("profile")[0].as_py()}
        driver = reopened(got.final, inc["transactions"], inc["anomalies"], profile, consume_offsets(offsets))
        executors = reopened_frames(AuditResult(arrow=inc, spark=spark), got.final, consume_offsets(offsets))
        assert sorted(driver) == sorted(executors) == want, (driver, executors)


def test_settled_frame_reduces_as_the_arrow_rows(spark):
    """Settled rows carried as a DataFrame (the DataFrame plan's, jobs.read.incremental.read.evidence): the
    distributed reduce given only their facts as input rows (their consume-queue tuples, transactions and
    recovery rows made batch by batch on the executors) gives every output the driver's reduce_input gives
    with the same rows as Arrow (a settled DUPLICATE_COMMIT keeps its REVIEW_DUPLICATE_COMMIT row), and so
    does the distributed reduce given them as Arrow; the reopened check over the frame names nobody, as
    settle.reopened over the Arrow rows."""
    from jobs.reconstruct.reducer import input_table
    from jobs.reconstruct.settle import consume_offsets, final_input, reopened
    from jobs.reconstruct.settle import settle as settle_rows
    from jobs.reconstruct.spark import final_frame, reduce_frame, reopened_frames
    from jobs.session import arrow_frame
    from schemas.recon import RECON_INPUT
    from tests.test_settle import DISC, FILE, B, _bodies, _offsets, _records, _run

    records, offsets = _records(DISC), _offsets(3, 1)
    full = _run(records, offsets)
    got = settle_rows(records, _bodies(records), full["transactions"], consume_offsets(offsets), {B: FILE},
                      {B: [0, FILE]})
    assert got.final.num_rows == 2
    want = _run(got.records, offsets, final_input(got.final, got.facts), got.final)
    assert want["recovery"].num_rows
    t = input_table(commitlog=got.records.drop_columns(["body"]), op_bodies=_bodies(got.records),
                    consumer_offsets=offsets)
    final = final_frame(spark, got.final)
    for given, extra in ((final, final_input(None, got.facts)), (got.final, final_input(got.final, got.facts))):
        wide = arrow_frame(spark, pa.concat_tables([t, extra.cast(t.schema)]), RECON_INPUT.spark_schema())
        result = reduce_frame(wide, "distributed", final=given)
        assert result.path == "distributed"
        for name in ("transactions", "check_back", "recovery", "anomalies", "profiles"):
            rows = getattr(result, name).toArrow().to_pylist()
            assert sorted(map(repr, rows)) == sorted(map(repr, want[name].to_pylist())), (type(given), name)
    profile = {B: want["profiles"].column("profile")[0].as_py()}
    assert reopened(got.final, want["transactions"], want["anomalies"], profile, consume_offsets(offsets)) == {}
    assert reopened_frames(result, final, consume_offsets(offsets)) == {}


def test_record_segments_compacted_and_as_of_advancing(spark, tmp_path, monkeypatch):
    """At most MAX_SEGMENTS segments: the run that would list a third writes every settled row again as
    one; each run at its own, later as-of (time-based flags change between runs: nothing of them is
    carried).  Still equal to a full audit at the last as-of."""
    import jobs.audit.state

    monkeypatch.setattr(jobs.audit.state, "MAX_SEGMENTS", 2)
    segments = _equivalence(spark, tmp_path, "5.1+", "crashy", 30,
                            as_of=["2026-11-20T00:00:00Z", "2026-11-21T06:00:00Z", "2026-11-23T00:00:00Z",
                                   "2026-11-26T12:00:00Z", "2026-12-01T00:00:00Z"])
    assert [len(s) for s in segments] == [1, 2, 1, 2, 1][:len(segments)], segments


class _Grown:
    """The incremental runs s0..sN of one growing store under ``out`` and a full audit of the final store
    under ``full_out`` (run id ``full``)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _grow(spark, tmp_path, profile, scenario, n_tx, every=None, one_job=True, as_of=None, run_with=None,
          repeat_last=0, keep_states=False) -> _Grown:
    """Audit the snapshots of a generated growing store (one every ``every`` transactions, default a third)
    and its final state with ``--incremental``, then the final state in full.  ``one_job``: every run read
    through jobs.read.full's one job (its ``read.job`` phase), False: through the DataFrame plan, None:
    either.  ``as_of``: one per run (default AS_OF for all).  ``run_with(k, n)``: a context manager run k of
    n runs in (the full audit runs without).  ``repeat_last``: the final state is audited that many more times (each run continues the state the
    one before settled).  ``keep_states``: each run's state tables are kept (``_state_tables``) as
    ``carried[run id]``."""
    from refbroker.generate import generate

    gen = generate(profile, scenario, n_tx, 7, tmp_path / "gen", snapshot_every=every or n_tx // 3,
                   commitlog_file_size=32 << 10, msg_bytes=256)
    snaps = sorted((tmp_path / "gen" / "snapshots").iterdir())
    assert len(snaps) >= 1
    states = [s / "store" for s in snaps] + [gen.store_dir] * (1 + repeat_last)
    conf = _conf(tmp_path)
    live = tmp_path / "live" / "b1"
    out = tmp_path / "out"
    read_from, segments, headers, infos, phases, final_segments, carried = [], [], [], {}, {}, {}, {}
    as_of = as_of or [AS_OF] * len(states)
    for k, state in enumerate(states):
        if k == 0 or state != states[k - 1]:
            _sync(state, live)
        with run_with(k, len(states)) if run_with is not None else contextlib.nullcontext():
            s = _audit(spark, out, [("b1", live)], f"s{k}", conf, "--incremental", as_of=as_of[k])
        info = infos[f"s{k}"] = s.extra["incremental"]
        phases[f"s{k}"] = set(s.phases)
        if k == 0:
            assert info["fallback"] == "NO_PREVIOUS_RUN"
        elif info["fallback"] != "FINAL_REOPENED":
            assert info["continued"], info
            read_from.append(info["read_from"]["b1"])
        assert info["state_written"]
        if one_job is not None:
            assert ("read.job" in s.phases) == one_job, sorted(s.phases)
        assert _record_segments(out, f"s{k}") == [[f"s{k}", None]]     # the open records, written whole
        segments.append(_final_segments(out, f"s{k}"))
        final_segments[f"s{k}"] = segments[-1]
        headers.append(_header_row(out, f"s{k}"))
        if keep_states:
            carried[f"s{k}"] = _state_tables(out)
    assert max(read_from, default=0) > 0, read_from     # some run did not read the CommitLog below it again
    full_out = tmp_path / "full"
    _audit(spark, full_out, [("b1", live)], "full", conf, as_of=as_of[len(states) - 1])
    # only the newest run's state is kept (the records: the segments it lists)
    from jobs.delta.tables import read_table as read_rows

    last = f"s{len(states) - 1}"
    assert set(read_rows(str(out / "audit_state")).column("run_id").to_pylist()) == {last}
    return _Grown(out=out, full_out=full_out, states=states, segments=segments, headers=headers, infos=infos,
                  phases=phases, final_segments=final_segments, carried=carried)


def _assert_equal_to_full(g: _Grown, run_id: str) -> None:
    """Run ``run_id``'s tables equal the full audit's.  A run whose reduction reopened a settled transaction
    is a full audit (FINAL_REOPENED): its findings hold the INCREMENTAL_FALLBACK row a full audit does not."""
    reopened = g.infos[run_id]["fallback"] == "FINAL_REOPENED"
    for table in COMPARED:
        got, want = _rows(g.out, table, run_id), _rows(g.full_out, table, "full")
        if reopened and table == "audit_anomalies":
            fell = [r for r in got if r["code"] == "INCREMENTAL_FALLBACK"]
            assert len(fell) == 1 and "FINAL_REOPENED" in json.dumps(fell[0]), fell
            got = [r for r in got if r["code"] != "INCREMENTAL_FALLBACK"]
        assert got == want, f"{run_id} {table}: incremental {len(got)} rows vs full {len(want)}"
    assert _rows(g.out, "transactions", run_id), "no transactions audited"


def _equivalence(spark, tmp_path, profile, scenario, n_tx, every=None, one_job=True, as_of=None) -> list:
    """``_grow``, then the last run equal to the full audit; settled transactions carried as rows where the
    case settles, none for profiles that never settle.  -> the settled-transaction segments of each run's
    state."""
    g = _grow(spark, tmp_path, profile, scenario, n_tx, every=every, one_job=one_job, as_of=as_of)
    _assert_equal_to_full(g, f"s{len(g.states) - 1}")
    settled = [h["finals"] for h in g.headers]
    if (profile, scenario) in SETTLES and one_job is not False:
        assert max(settled) > 0, g.headers
        assert max(settled) <= len(_rows(g.full_out, "transactions", "full"))
    elif profile not in SETTLING:
        assert settled == [0] * len(settled), g.headers
    return g.segments


def _header_row(out, run_id) -> dict:
    from jobs.delta.tables import read_table as read_rows

    return read_rows(os.path.join(str(out), "audit_state"), run_id=run_id).to_pylist()[0]


#: what a state carries: its header's columns that do not name the run or the path, and the rows of the
#: records, op bodies and settled transactions (whichever run's segment holds them)
_HEADER_COMPARED = ("broker", "resume_offset", "resume_file", "records", "finals", "final_facts_json",
                    "below_files_json", "commitlog_end")


def _state_tables(out) -> dict:
    """The state the newest run left (every row of the state tables: the older runs' are retracted), rows
    without their run id, sorted; list cells sorted (an order the settle does not define)."""
    from jobs.delta.tables import read_table as read_rows

    got = {}
    for table in ("audit_state_records", "audit_state_op_bodies", "audit_state_final"):
        t = read_rows(os.path.join(str(out), table))
        rows = [] if t is None else [{k: _portable(v) for k, v in r.items() if k not in ("run_id", "run_date")}
                                     for r in t.to_pylist()]
        got[table] = sorted(rows, key=lambda r: json.dumps(r, sort_keys=True, default=str))
    header = read_rows(os.path.join(str(out), "audit_state")).to_pylist()
    got["audit_state"] = sorted(({k: r[k] for k in _HEADER_COMPARED} for r in header), key=repr)
    return got


def _portable(v):
    """A state cell without where the store was (paths below the live store) or an order of list items."""
    if isinstance(v, list):
        return sorted((_portable(x) for x in v), key=repr)
    return v.split("/live/", 1)[-1] if isinstance(v, str) else v


def _final_runs(out) -> set:
    """The run ids audit_state_final holds rows of."""
    from jobs.delta.tables import read_table as read_rows

    t = read_rows(os.path.join(str(out), "audit_state_final"))
    return set(t.column("run_id").to_pylist()) if t is not None else set()


def _final_segments(out, run_id) -> list:
    """The settled-transaction segments run ``run_id``'s state lists; the table holds exactly those runs'."""
    from jobs.delta.tables import read_table as read_rows

    segs = json.loads(_header_row(out, run_id)["final_segments_json"])
    assert segs[-1] == run_id, segs
    t = read_rows(os.path.join(str(out), "audit_state_final"))
    held = set(t.column("run_id").to_pylist()) if t is not None else set()
    assert held <= set(segs), (held, segs)
    return segs


def _record_segments(out, run_id) -> list:
    """The record segments run ``run_id``'s state lists; the records table holds exactly those runs' rows."""
    from jobs.delta.tables import read_table as read_rows

    header = read_rows(os.path.join(str(out), "audit_state"), run_id=run_id).to_pylist()
    segs = json.loads(header[0]["record_segments_json"])
    assert segs[-1] == [run_id, None], segs
    held = set(read_rows(os.path.join(str(out), "audit_state_records")).column("run_id").to_pylist())
    assert held <= {r for r, _ in segs}, (held, segs)     # earlier runs' rows no longer listed are gone
    return segs


def test_carried_findings_follow_their_cell(tmp_path):
    """A finding is carried when the cell that reported it lies below the resume offset, whatever its
    position (a record crossing the cell's end can be reported past it), and not when its cell is read again;
    without a cell (a state written by the DataFrame plan) by its position.  Spark-free: the state table is
    written and read with deltalake."""
    path, base, split = "/s/commitlog/00000000000000000000", 0, 1000
    rows = [  # (position, cell_offset): resume (read_from) is the cell at 2000
        (1500, 1000),       # below, in its cell: carried
        (2100, 1000),       # reported by the cell below, past the resume offset: carried
        (1990, 2000),       # hypothetical: the resumed cell's, below it: read again, not carried
        (2500, 2000),       # the resumed cell's: read again
        (1200, None),       # no cell: by position, carried
        (2200, None),       # no cell: by position, read again
    ]
    kept = carried_findings(tmp_path, path, rows, read_from={"b1": 2 * split},
                            carried_files={"b1": [(path, base, 2 * split)]})
    assert kept == ["1200/None", "1500/1000", "2100/1000"]


def carried_findings(tmp_path, path, rows, **plan) -> list:
    """CommitLog findings ``rows`` [(position, cell offset)] of ``path`` written as run r1's state; -> the
    ``position/cell`` of those a run r2 continuing it with ``plan`` (Plan fields) carries, sorted."""
    from jobs.delta import sink as delta_sink
    from jobs.read.incremental.plan import Plan
    from jobs.read.incremental.read import _carried
    from schemas.state import STATE_FINDINGS

    blank = {f.name: None for f in STATE_FINDINGS.arrow_schema()}
    table = pa.Table.from_pylist([dict(blank, broker="b1", kind="CRC_MISMATCH", file=path, position=p,
                                       source="commitlog", detail=f"{p}/{c}", cell_offset=c)
                                  for p, c in rows], schema=STATE_FINDINGS.arrow_schema())
    out = str(tmp_path / "out")
    delta_sink.write_table(table, out, STATE_FINDINGS, "r1", ["run_date"], writer="delta-rs")
    got = _carried(Plan(out=out, run_id="r2", hash="", previous_run="r1", **plan), STATE_FINDINGS, None)
    return sorted(got.column("detail").to_pylist())


# ------------------------------------------------------------------------------------------------------------
# fallbacks
# ------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    """A 5.1+ store of several CommitLog files (the resume offset lies past the first file)."""
    from refbroker.generate import generate

    base = tmp_path_factory.mktemp("incr-fallback")
    gen = generate("5.1+", "clean", 40, 3, base / "gen", commitlog_file_size=48 << 10, msg_bytes=256)
    return gen.store_dir


def _fallback_finding(out, run_id):
    return [r for r in _rows(out, "audit_anomalies", run_id) if r["code"] == "INCREMENTAL_FALLBACK"]


def _expect_fallback(spark, out, stores, run_id, conf, reason, *extra):
    s = _audit(spark, out, stores, run_id, conf, "--incremental", *extra)
    info = _incremental_info(out, run_id)
    assert info["fallback"] == reason and not info["continued"], info
    assert s.extra["incremental"]["fallback"] == reason
    found = _fallback_finding(out, run_id)
    assert {f["broker"] for f in found} == {b for b, _ in stores}
    assert all(info["detail"] in f["detail"] for f in found)
    return s


def _prepared(spark, tmp_path, small_store, name="b1"):
    live = tmp_path / "live" / name
    _sync(small_store, live)
    conf = _conf(tmp_path)
    out = tmp_path / "out"
    _audit(spark, out, [(name, live)], "r1", conf, "--incremental")
    return live, conf, out


def test_fallback_no_previous_run_and_continue(spark, tmp_path, small_store):
    live, conf, out = _prepared(spark, tmp_path, small_store)
    assert _incremental_info(out, "r1")["fallback"] == "NO_PREVIOUS_RUN"
    assert _fallback_finding(out, "r1")
    s = _audit(spark, out, [("b1", live)], "r2", conf, "--incremental")
    assert s.extra["incremental"]["continued"] and not _fallback_finding(out, "r2")


def test_fallback_state_missing(spark, tmp_path, small_store):
    live = tmp_path / "live" / "b1"
    _sync(small_store, live)
    conf, out = _conf(tmp_path), tmp_path / "out"
    _audit(spark, out, [("b1", live)], "plain", conf)                     # not incremental: no state
    _expect_fallback(spark, out, [("b1", live)], "r2", conf, "STATE_MISSING")


def test_fallback_config_changed(spark, tmp_path, small_store):
    live, conf, out = _prepared(spark, tmp_path, small_store)
    _expect_fallback(spark, out, [("b1", live)], "r2", conf, "CONFIG_CHANGED", "--include-bodies")
    other = tmp_path / "other.properties"
    other.write_text(CONF + "broker.transactionTimeOut=9000\n")
    _expect_fallback(spark, out, [("b1", live)], "r3", other, "CONFIG_CHANGED")


def test_fallback_mode_and_brokers(spark, tmp_path, small_store):
    from jobs.audit.run import run_audit

    live, conf, out = _prepared(spark, tmp_path, small_store)
    opts = _opts(out, [("b1", live)], "r2", conf, "--incremental", "--mode", "indexed")
    run_audit(spark, opts, print_summary=False)
    assert _incremental_info(out, "r2")["fallback"] == "MODE_UNSUPPORTED"
    assert _fallback_finding(out, "r2")
    moved = tmp_path / "live" / "b2"
    _sync(small_store, moved)
    _expect_fallback(spark, out, [("b2", moved)], "r3", conf, "BROKERS_CHANGED")


def test_fallback_store_moved(spark, tmp_path, small_store):
    live, conf, out = _prepared(spark, tmp_path, small_store)
    elsewhere = tmp_path / "elsewhere" / "b1"
    _sync(small_store, elsewhere)
    _expect_fallback(spark, out, [("b1", elsewhere)], "r2", conf, "STORE_MOVED")


def test_fallback_store_truncated_and_rewritten(spark, tmp_path, small_store):
    from jobs.delta.tables import read_table as read_rows

    live, conf, out = _prepared(spark, tmp_path, small_store)
    header = read_rows(str(out / "audit_state"), run_id="r1").to_pylist()[0]
    assert json.loads(header["below_files_json"]), "the test store must resume past its first file"
    files = sorted((live / "commitlog").iterdir())
    # a byte of the first file's head changed: the bytes the continuation would trust differ
    with open(files[0], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    _expect_fallback(spark, out, [("b1", live)], "r2", conf, "STORE_REWRITTEN")
    # the CommitLog cut below the resume offset (r2 fell back and wrote a state of the damaged store)
    _sync(small_store, live)
    _audit(spark, out, [("b1", live)], "r3", conf, "--incremental")
    for f in sorted((live / "commitlog").iterdir())[1:]:
        f.unlink()
    _expect_fallback(spark, out, [("b1", live)], "r4", conf, "STORE_TRUNCATED")


def test_fallback_state_format(spark, tmp_path, small_store, monkeypatch):
    import jobs.read.incremental.plan as incremental

    live, conf, out = _prepared(spark, tmp_path, small_store)
    with monkeypatch.context() as mp:
        mp.setattr(incremental, "STATE_FORMAT_VERSION", incremental.STATE_FORMAT_VERSION + 1)
        _expect_fallback(spark, out, [("b1", live)], "r2", conf, "STATE_FORMAT")
    # a state written before settled transactions were carried (format 4: no audit_state_final, a header
    # without its columns): a full audit that writes the new state into the old tables, which the next run
    # continues
    _as_format_4(out)
    s = _expect_fallback(spark, out, [("b1", live)], "r3", conf, "STATE_FORMAT")
    assert s.extra["incremental"]["state_written"]
    assert "format 4" in _incremental_info(out, "r3")["detail"]
    s = _audit(spark, out, [("b1", live)], "r4", conf, "--incremental")
    assert s.extra["incremental"]["continued"], s.extra["incremental"]


def test_fallback_state_table_with_deletion_vectors(spark, tmp_path, small_store):
    """A state table another Delta writer upgraded to deletion vectors (its data files may then hold deleted
    rows): the run is a full audit (STATE_FORMAT, the table named) that writes a state the next run continues."""
    import deltalake

    live, conf, out = _prepared(spark, tmp_path, small_store)
    dt = deltalake.DeltaTable(str(out / "audit_state_final"))
    dt.alter.add_feature(deltalake.TableFeatures.DeletionVectors, allow_protocol_versions_increase=True)
    assert "deletionVectors" in (deltalake.DeltaTable(str(out / "audit_state_final")).protocol().reader_features
                                 or [])
    s = _expect_fallback(spark, out, [("b1", live)], "r2", conf, "STATE_FORMAT")
    assert "audit_state_final" in _incremental_info(out, "r2")["detail"]
    assert "deletionVectors" in _incremental_info(out, "r2")["detail"]
    assert s.extra["incremental"]["state_written"]


def _as_format_4(out: Path) -> None:
    """The newest state under ``out`` rewritten as format 4 wrote it (its header's columns, no settled rows)."""
    import deltalake

    path = str(out / "audit_state")
    dt = deltalake.DeltaTable(path)
    parts = list(dt.metadata().partition_columns)
    t = dt.to_pyarrow_table().drop_columns(["final_segments_json", "final_facts_json", "finals"])
    i = t.schema.get_field_index("format_version")
    t = t.set_column(i, t.schema.field(i), pa.array([4] * t.num_rows, t.schema.field(i).type))
    deltalake.write_deltalake(path, t, mode="overwrite", schema_mode="overwrite", partition_by=parts)
    shutil.rmtree(out / "audit_state_final", ignore_errors=True)


def test_same_run_id_is_a_usage_error(spark, tmp_path, small_store):
    from txlog_io.errors import UsageError

    live, conf, out = _prepared(spark, tmp_path, small_store)
    with pytest.raises(UsageError, match="--incremental: run id 'r1' is the latest completed run"):
        _audit(spark, out, [("b1", live)], "r1", conf, "--incremental")


def test_check_passes_incremental_through(tmp_path, small_store):
    from jobs.main import parse_args
    from txlog_io.errors import UsageError

    out = tmp_path / "out"
    _, opts = parse_args(["check", "--out", str(out), "--store", str(small_store), "--incremental"])
    assert opts.audit is not None and opts.audit.incremental
    _, opts = parse_args(["audit", "--out", str(out), "--store", str(small_store)])
    assert not opts.incremental
    with pytest.raises(UsageError, match="--incremental: only with --store"):
        parse_args(["check", "--out", str(out), "--incremental"])


def _old_unit_file(first: Path, last: Path) -> str:
    """A consume-queue file of a non-transaction topic, not the newest of its queue, with the same bytes in
    the ``first`` and ``last`` store states (relative path)."""
    from jobs.reconstruct.params import TX_SYSTEM_TOPICS

    for path in sorted((last / "consumequeue").rglob("*")):
        rel = path.relative_to(last)
        if (path.is_file() and rel.parts[1] not in TX_SYSTEM_TOPICS and (first / rel).is_file()
                and path != max(path.parent.iterdir()) and path.read_bytes() == (first / rel).read_bytes()):
            return str(rel)
    raise AssertionError("no unchanged old consume-queue file")


def _bad_unit(path: Path, unit: int) -> None:
    """Unit ``unit`` of a consume-queue file given impossible values (a BAD_CQ_ENTRY finding)."""
    import struct

    with open(path, "r+b") as f:
        f.seek(unit * 20)
        f.write(struct.pack(">qiq", -7, -1, 0))


def _equal_to_full(spark, tmp_path, out, live, run_id, conf, name):
    _audit(spark, tmp_path / name, [("b1", live)], "full", conf)
    for table in COMPARED:
        got, want = _rows(out, table, run_id), _rows(tmp_path / name, table, "full")
        assert got == want, f"{table}: incremental {len(got)} rows vs full {len(want)}"
    return _rows(out, "audit_anomalies", run_id)


def test_unchanged_unit_file_carries_its_findings(spark, tmp_path):
    """An old consume-queue file of a non-transaction topic that did not change since the previous run is not
    decoded again: its finding comes from the state, run after run; once the file is modified it is decoded
    again (its new finding seen), once deleted its findings are gone -- each time equal to a full audit."""
    from refbroker.generate import generate

    gen = generate("5.1+", "clean", 40, 7, tmp_path / "gen", snapshot_every=10, cq_file_units=4)
    snaps = sorted((tmp_path / "gen" / "snapshots").iterdir())
    states = [s / "store" for s in snaps] + [gen.store_dir]
    rel = _old_unit_file(states[0], states[-1])
    conf, out, live = _conf(tmp_path), tmp_path / "out", tmp_path / "live" / "b1"
    keep = tmp_path / "bad-unit"
    _sync(states[0], live)
    _bad_unit(live / rel, 1)
    shutil.copy2(live / rel, keep)               # the file as the first run saw it (bytes and mtime)

    def bad_units(run_id):
        return {r["position"] for r in _rows(out, "audit_anomalies", run_id)
                if r["code"] == "BAD_CQ_ENTRY" and r["file"] == str(live / rel)}

    _audit(spark, out, [("b1", live)], "s0", conf, "--incremental")
    assert bad_units("s0") == {20}
    for k, state in enumerate(states[1:], 1):
        _sync(state, live)
        shutil.copy2(keep, live / rel)           # unchanged since the previous run
        s = _audit(spark, out, [("b1", live)], f"s{k}", conf, "--incremental")
        assert s.extra["incremental"]["continued"] and s.extra["incremental"]["units_carried"]["b1"] >= 1
        assert bad_units(f"s{k}") == {20}
    last = len(states) - 1
    _equal_to_full(spark, tmp_path, out, live, f"s{last}", conf, "full1")
    # modified: decoded again (and printed anew)
    _bad_unit(live / rel, 2)
    _audit(spark, out, [("b1", live)], "m", conf, "--incremental")
    assert bad_units("m") == {20, 40}
    _equal_to_full(spark, tmp_path, out, live, "m", conf, "full2")
    # deleted: nothing of it is carried
    os.remove(live / rel)
    s = _audit(spark, out, [("b1", live)], "d", conf, "--incremental")
    assert s.extra["incremental"]["continued"]
    assert bad_units("d") == set()
    _equal_to_full(spark, tmp_path, out, live, "d", conf, "full3")
