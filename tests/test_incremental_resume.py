"""Where ``audit --incremental`` resumes its CommitLog read (jobs/read/incremental/plan.py): at the previous run's
newest transaction-relevant record itself, inside its ``split_bytes`` cell, not at the cell's start -- and
at the cell's start when the previous scan reported damage between the two (a damaged record straddling the
resume offset) or the record is no longer there.  Every continuation is compared with a full audit of the
same store, table by table; the resume offset is also moved by hand to a file boundary and into an earlier
file.  A continuation this small reads in the driver (full_read.CONTINUATION_DRIVER_BYTES); the first run of
each test, a fallback, takes the Spark job."""
from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pyarrow as pa
import pytest

from tests.test_incremental import COMPARED, _audit, _conf, _rows, _sync, carried_findings

FILE_BYTES = 32 << 10       # one split cell per file (default split.bytes): a record start inside is mid-cell


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """(snapshot store, final store) of one growing 5.1+ store of 32 KiB CommitLog files."""
    from refbroker.generate import generate

    base = tmp_path_factory.mktemp("incr-resume")
    gen = generate("5.1+", "clean", 30, 5, base / "gen", snapshot_every=20, commitlog_file_size=FILE_BYTES,
                   msg_bytes=256)
    snaps = sorted((base / "gen" / "snapshots").iterdir())
    return snaps[0] / "store", gen.store_dir


def _records(store: Path) -> list:
    """[(physical offset, total size, path, file base, transaction-relevant)] of every record, in order."""
    from txlog_io.commitlog_decode import decode_range

    out = []
    for path in sorted((store / "commitlog").iterdir()):
        base = int(path.name)
        relevant = {o for b, _ in decode_range(str(path), tx_relevant=True)
                    for o in b.column("physical_offset").to_pylist()}
        for b, _ in decode_range(str(path)):
            out += [(o, n, path, base, o in relevant) for o, n in zip(b.column("physical_offset").to_pylist(),
                                                                     b.column("total_size").to_pylist(),
                                                                     strict=True)]
    return out


def _header(out: Path, run_id: str) -> dict:
    from jobs.delta.tables import read_table

    return read_table(str(out / "audit_state"), run_id=run_id).to_pylist()[0]


def _resume_at(out: Path, run_id: str, live: Path, offset: int) -> None:
    """Rewrite run ``run_id``'s state header to resume at ``offset`` (a record start), as a run that saw its
    newest relevant record there would have written it."""
    from jobs.delta import sink as delta_sink
    from jobs.read.incremental.plan import _prefix_sha
    from schemas.state import AUDIT_STATE

    h = _header(out, run_id)
    path = max(p for p in (live / "commitlog").iterdir() if int(p.name) <= offset)
    h.update(resume_offset=offset, resume_file=f"commitlog/{path.name}", resume_file_base=int(path.name),
             resume_prefix_sha256=_prefix_sha(str(path), offset - int(path.name)))
    row = {f.name: h[f.name] for f in AUDIT_STATE.arrow_schema()}
    delta_sink.write_table(pa.Table.from_pylist([row], schema=AUDIT_STATE.arrow_schema()), str(out),
                           AUDIT_STATE, run_id, ["run_date"], writer="delta-rs", run_date=h.get("run_date"))


def _continue_and_compare(spark, tmp_path, out, live, conf, run_id, full_name) -> dict:
    """``run_id`` continued incrementally, compared with a full audit of ``live`` -> its incremental info."""
    s = _audit(spark, out, [("b1", live)], run_id, conf, "--incremental")
    info = s.extra["incremental"]
    assert info["continued"], info
    full = tmp_path / full_name
    if not (full / "transactions").is_dir():
        _audit(spark, full, [("b1", live)], "full", conf)
    for table in COMPARED:
        got, want = _rows(out, table, run_id), _rows(full, table, "full")
        assert got == want, f"{table}: incremental {len(got)} rows vs full {len(want)}"
    assert _rows(out, "transactions", run_id)
    return info


def _snapshot_audited(spark, tmp_path, snapshot: Path, name="out"):
    live, conf, out = tmp_path / "live" / "b1", _conf(tmp_path), tmp_path / name
    _sync(snapshot, live)
    _audit(spark, out, [("b1", live)], "s0", conf, "--incremental")
    return live, conf, out


def test_resumes_at_the_newest_relevant_record_inside_its_cell(spark, tmp_path, grown, monkeypatch):
    snapshot, final = grown
    newest = max(o for o, _, _, _, rel in _records(snapshot) if rel)
    assert newest % FILE_BYTES, "the newest relevant record must not start its file (cell)"
    live, conf, out = _snapshot_audited(spark, tmp_path, snapshot)
    assert _header(out, "s0")["resume_offset"] == newest
    keep = tmp_path / "state-s0"
    shutil.copytree(out, keep)
    _sync(final, live)
    info = _continue_and_compare(spark, tmp_path, out, live, conf, "s1", "full")
    assert info["read_from"] == {"b1": newest} and info["read_in_driver"]
    # the same state resumed by hand at a file boundary (the first record of the newest record's file: a cell
    # start) and in the middle of an earlier file: the same result each time; the second in a Spark job (the
    # cells pickled to its tasks)
    import jobs.read.full

    records = _records(snapshot)
    file_start = newest - newest % FILE_BYTES
    earlier = [o for o, _, _, base, _ in records if base == file_start - FILE_BYTES]
    for k, offset in enumerate([file_start, earlier[len(earlier) // 2]]):
        assert any(o == offset for o, *_ in records)
        again = tmp_path / f"again{k}"
        shutil.copytree(keep, again)
        _resume_at(again, "s0", live, offset)
        if k == 1:
            monkeypatch.setattr(jobs.read.full, "CONTINUATION_DRIVER_BYTES", 0)
            monkeypatch.setattr(jobs.read.full, "LOCAL_READ_DRIVER_BYTES", 0)
        info = _continue_and_compare(spark, tmp_path, again, live, conf, "s1", "full")
        assert info["read_from"] == {"b1": offset} and info["read_in_driver"] == (k == 0)


def _corrupt(path: Path, pos: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)


def test_damaged_record_straddling_the_resume_offset(spark, tmp_path, grown):
    """The record before the newest relevant one claims a TOTALSIZE reaching into it (the scan reports it,
    finds the newest record inside its span, resynchronises after): the state resumes at the cell's start,
    whose walk is the one that found that record, not at the record itself."""
    snapshot, final = grown
    records = _records(snapshot)
    i = max(k for k, r in enumerate(records) if r[4])
    (newest, _, path, base, _), (prev, prev_size, prev_path, _, _) = records[i], records[i - 1]
    assert prev_path == path and prev + prev_size == newest
    stores = {}
    for name, store in (("snap", snapshot), ("final", final)):
        stores[name] = tmp_path / name
        shutil.copytree(store, stores[name])
        _corrupt(stores[name] / "commitlog" / path.name, prev - base, struct.pack(">i", prev_size + 64))
    live, conf, out = _snapshot_audited(spark, tmp_path, stores["snap"])
    found = [r for r in _rows(out, "audit_anomalies", "s0") if r["position"] == prev - base]
    assert found, "the damaged record must be reported"
    assert _header(out, "s0")["resume_offset"] == base          # the cell's (file's) start, not newest
    _sync(stores["final"], live)
    info = _continue_and_compare(spark, tmp_path, out, live, conf, "s1", "full")
    assert info["read_from"] == {"b1": base}


def test_record_at_the_resume_offset_replaced(spark, tmp_path, grown):
    """The record the state resumes at is damaged after the previous run (the 64 KiB before it unchanged): a
    read from it would skip to the next record where a full scan reports the damage -- the run reads its whole
    cell again instead."""
    snapshot, final = grown
    live, conf, out = _snapshot_audited(spark, tmp_path, snapshot)
    resume = _header(out, "s0")["resume_offset"]
    _sync(final, live)
    holder = max(p for p in (live / "commitlog").iterdir() if int(p.name) <= resume)
    _corrupt(holder, resume - int(holder.name) + 4, b"\x00\x11\x22\x33")          # its magic
    info = _continue_and_compare(spark, tmp_path, out, live, conf, "s1", "full")
    cell = int(holder.name)
    assert info["read_from"] == {"b1": cell} and resume != cell
    assert any(r["code"] == "BAD_MAGIC" for r in _rows(out, "audit_anomalies", "s1")), "damage not reported"


def test_carried_findings_of_the_resumed_cell(tmp_path):
    """Of the cell read from inside (the resume cell), only the findings below the resume offset are carried;
    cells below it whole; no cell: by position.  Spark-free."""
    path = "/s/commitlog/00000000000000000000"
    rows = [(1500, 1000), (2100, 1000), (2100, 2000), (2300, 2000), (2500, 2000), (2200, None), (2400, None)]
    kept = carried_findings(tmp_path, path, rows, read_from={"b1": 2300}, resume_cell={"b1": 2000},
                            carried_files={"b1": [(path, 0, 2300)]})
    assert kept == ["1500/1000", "2100/1000", "2100/2000", "2200/None"]


def test_bench_snapshot_shares_identical_files(tmp_path):
    """``txlog-bench audit --incremental``: a snapshot file byte-identical to the final store's becomes a hard
    link to it; a file that differs (same size), or exists in one store only, stays as it is.  Spark-free."""
    from jobs.bench.incremental import share_identical

    snap, final = tmp_path / "snap", tmp_path / "final"
    for root, grown in ((snap, b"old"), (final, b"new")):
        (root / "commitlog").mkdir(parents=True)
        (root / "commitlog" / "00000000000000000000").write_bytes(b"x" * 4096)
        (root / "commitlog" / "00000000000000004096").write_bytes(grown + b"\0" * 4093)
    (snap / "abort").write_bytes(b"")
    assert share_identical(snap, final) == (1, 4096)
    first = [root / "commitlog" / "00000000000000000000" for root in (snap, final)]
    assert first[0].stat().st_ino == first[1].stat().st_ino
    assert (snap / "commitlog" / "00000000000000004096").read_bytes()[:3] == b"old"
    assert (snap / "abort").exists() and share_identical(snap, final) == (0, 0)


def test_failed_run_waits_for_its_state_write(spark, tmp_path, grown, monkeypatch):
    """The state write a continuation starts in a thread while the reducer runs is over when ``run_audit``
    raises (an output write failed): nothing writes under ``--out`` after the run gave its lock back."""
    import threading
    import time

    import jobs.audit.state
    import jobs.delta.sink

    snapshot, final = grown
    live, conf, out = _snapshot_audited(spark, tmp_path, snapshot)
    _sync(final, live)
    done = threading.Event()
    real_write_now = jobs.audit.state.write_now

    def slow_write_now(*args, **kwargs):
        time.sleep(1.0)                 # still writing when the output write below fails
        try:
            return real_write_now(*args, **kwargs)
        finally:
            done.set()

    def failing_write_table(*args, **kwargs):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(jobs.audit.state, "write_now", slow_write_now)
    monkeypatch.setattr(jobs.delta.sink, "write_table", failing_write_table)
    with pytest.raises(OSError, match="injected"):
        _audit(spark, out, [("b1", live)], "s1", conf, "--incremental")
    assert done.is_set(), "the state thread was still writing after run_audit returned"
