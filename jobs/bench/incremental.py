"""``txlog-bench audit --incremental P``: the cost of a scheduled incremental audit (jobs/read/incremental/plan.py).

The bench store is generated with one snapshot (``refbroker.generate`` ``snapshot_every``) taken after a
share ``1 - P`` of the send phase: the store as it was before its last P of messages.  In the bench's session:

1. the snapshot is audited with ``--incremental`` (untimed: the run whose state is continued),
2. the final store is audited with ``--incremental`` at the SAME store path (the two stores are renamed in
   and out of ``<base>/live/store``: a broker's store grows in place), timed: ``incremental_s``,

and ``incremental_over_full`` = ``incremental_s`` / the bench's timed full-mode audit of the final store
(``full_s``): both are ``full`` mode.  ``incremental_read_share``: the share of the final store's CommitLog
bytes (files as mapped, zero tail included) the incremental run decoded: from its resume offset (the
snapshot's newest transaction record, or the start of its ``split.bytes`` cell) to the end.

The snapshot shares the final store's files that are byte-identical (hard links, :func:`share_identical`;
done once, compared byte for byte): a real broker's store an hour later is the same files, the older ones
unchanged and the newest grown.  So the page cache holds one copy of them, and a warm bench is warm for the
full and the incremental run alike (two 8 GiB copies did not both fit).  With ``--cold`` the cache is dropped
again right before the timed incremental run (the snapshot's audit warmed it).
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

LIVE = ("live", "store")


def snapshot_every(transactions: int, share: float, scenario: str) -> int:
    """``snapshot_every`` that snapshots the send phase once, after a share ``1 - share`` of its main
    transactions (the in-flight ones are sent after it: refbroker.workload.Workload.run)."""
    from refbroker.workload import TX_CLASSES, get_scenario

    sc = get_scenario(scenario)
    classes = [c for c in sc.mix if sc.mix[c] > 0]
    inflight = sum(sc.mix[c] for c in classes if TX_CLASSES[c].inflight) / max(1, sum(sc.mix.values()))
    n_main = transactions - min(transactions, int(round(transactions * inflight)))
    return max(1, int(n_main * (1.0 - share)))


def _commitlog_span(store: Path) -> tuple:
    from txlog_io.mappedfile import discover_store

    files = discover_store(str(store)).commitlog
    return (files[0].base_offset, files[-1].base_offset + files[-1].size) if files else (0, 0)


def _fresh_paths(base: Path, out_name: str) -> tuple:
    """(the live store's path, the output directory) under ``base``, both removed; the live store's parent
    made."""
    live = base.joinpath(*LIVE)
    out = base / out_name
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(live, ignore_errors=True)
    live.parent.mkdir(parents=True, exist_ok=True)
    return live, out


def share_identical(snap: Path, final: Path) -> tuple:
    """Each file of ``snap`` whose bytes equal the same path's in ``final`` becomes a hard link to it ->
    (files linked now, bytes they hold).  Files already linked are skipped; a file that differs (the newest
    CommitLog and consume-queue files, checkpoint, config) stays the snapshot's own copy."""
    import filecmp

    linked = nbytes = 0
    for path in sorted(p for p in snap.rglob("*") if p.is_file() and not p.is_symlink()):
        other = final / path.relative_to(snap)
        try:
            a, b = path.stat(), other.stat()
        except OSError:
            continue
        if (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino) or a.st_size != b.st_size \
                or not filecmp.cmp(path, other, shallow=False):
            continue
        tmp = path.with_name(path.name + ".link-tmp")
        os.link(other, tmp)
        os.replace(tmp, path)
        linked, nbytes = linked + 1, nbytes + a.st_size
    return linked, nbytes


def bench_incremental(spark, base: Path, final_store: Path, as_of: str, log=print,
                      before_timed=None) -> dict:
    """Audit ``base/snapshots/001/store`` then ``final_store`` incrementally at one path; -> the JSON keys.
    ``before_timed``: called right before the timed run (``--cold``: drops the page cache)."""
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    snap = base / "snapshots" / "001" / "store"
    if not snap.is_dir():
        raise RuntimeError(f"no snapshot store at {snap} (generate with snapshot_every)")
    live, out = _fresh_paths(base, "out-incremental")

    def audit(run_id: str):
        _, opts = parse_args(["audit", "--store", str(live), "--out", str(out), "--as-of", as_of,
                              "--mode", "full", "--incremental", "--run-id", run_id, "--no-report"])
        t0 = time.monotonic()
        summary = run_audit(spark, opts, print_summary=False)
        return time.monotonic() - t0, summary

    first, end = _commitlog_span(final_store)
    linked, nbytes = share_identical(snap, final_store)
    if linked:
        log(f"incremental: {linked} snapshot files ({nbytes / (1 << 30):.2f} GiB) are now hard links to the "
            f"final store's identical ones")
    os.rename(snap, live)
    try:
        first_s, _ = audit("before")
    finally:
        os.rename(live, snap)
    log(f"incremental: snapshot audited (untimed) in {first_s:.1f} s; timing the continuation ...")
    os.rename(final_store, live)
    try:
        if before_timed is not None:
            before_timed()
        inc_s, summary = audit("after")
    finally:
        os.rename(live, final_store)
    info = summary.extra.get("incremental", {})
    if not info.get("continued"):
        raise RuntimeError(f"the incremental run did not continue: {info}")
    return {"incremental_s": round(inc_s, 2),
            "incremental_read_share": round((end - max(info["read_from"].values())) / (end - first), 4)
            if end > first else None,
            "incremental_phases": {k: round(v, 2) for k, v in summary.phases.items()
                                   if not k.startswith("write.")},
            "incremental_read_from": info.get("read_from"),
            "incremental_state": state_counts(out, "after")}


def state_counts(out: Path, run_id: str) -> dict:
    """The carried state run ``run_id`` wrote (summed over brokers): ``records`` (open transactions' evidence
    rows, re-reduced by the next run) and ``finals`` (settled transactions carried as their reduced rows)."""
    from jobs.delta.tables import read_table

    t = read_table(str(out / "audit_state"), run_id=run_id)
    rows = t.to_pylist() if t is not None else []
    return {"records": sum(r["records"] for r in rows), "finals": sum(r["finals"] or 0 for r in rows)}


def bench_growth(spark, base: Path, final_store: Path, as_of: str, log=print, before_timed=None) -> dict:
    """Audit every snapshot of ``base/snapshots`` and then ``final_store`` with ``--incremental`` at one path
    (the store growing in place): the first run falls back to a full audit, each later one continues.  ->
    JSON keys: ``incremental_runs`` (per run: seconds, whether it continued, the share of the CommitLog it
    decoded, the carried state's rows: ``records`` and ``finals``), ``incremental_s`` (the last run's)."""
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    snaps = sorted(p / "store" for p in (base / "snapshots").iterdir() if (p / "store").is_dir())
    if not snaps:
        raise RuntimeError(f"no snapshot stores under {base / 'snapshots'}")
    live, out = _fresh_paths(base, "out-growth")
    for snap in snaps:
        share_identical(snap, final_store)
    runs = []
    states = snaps + [final_store]
    for k, store in enumerate(states):
        first, end = _commitlog_span(store)
        os.rename(store, live)
        try:
            if k == len(states) - 1 and before_timed is not None:
                before_timed()
            _, opts = parse_args(["audit", "--store", str(live), "--out", str(out), "--as-of", as_of,
                                  "--mode", "full", "--incremental", "--run-id", f"g{k}", "--no-report"])
            t0 = time.monotonic()
            summary = run_audit(spark, opts, print_summary=False)
            took = time.monotonic() - t0
        finally:
            os.rename(live, store)
        info = summary.extra.get("incremental", {})
        row = {"run": k, "s": round(took, 2), "continued": bool(info.get("continued")),
               "fallback": info.get("fallback"), "commitlog_bytes": end - first,
               "read_share": round((end - max(info["read_from"].values())) / (end - first), 4)
               if info.get("read_from") and end > first else 1.0,
               "transactions": summary.transactions, **state_counts(out, f"g{k}")}
        runs.append(row)
        log(f"incremental run {k}: {row}")
    if not all(r["continued"] for r in runs[1:]):
        raise RuntimeError(f"an incremental run did not continue: {runs}")
    return {"incremental_runs": runs, "incremental_s": runs[-1]["s"],
            "incremental_read_share": runs[-1]["read_share"]}


__all__ = ["bench_incremental", "bench_growth", "snapshot_every", "state_counts"]
