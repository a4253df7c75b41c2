"""``txlog-bench audit``: the Spark audit at scale, against a plain JVM scan of the same CommitLog bytes.

    txlog-bench audit [--size-gb N] [--tx-share P] [--dir DIR] [--keep] [--sizes 1,2,4]
                      [--master local[*]] [--driver-memory 4g] [--msg-bytes 1024] [--file-mb 1024]
                      [--no-warmup] [--cold] [--fixed-tx] [--incremental P [--incremental-runs K]]
                      [--tx-interval-ms MS] [--store-on s3]

Per size:

1. **store** -- the reference broker (``refbroker.generate``, profile 5.1+, scenario ``clean``) writes a store
   of about N GiB of CommitLog in ``--file-mb`` files (default 1024 MiB, the broker default) where a share P
   (default 0.01) of the messages producers sent are transactional (each transaction adds its half, commit or
   op, and check records); the rest are ordinary messages of ``--msg-bytes``.  The number of messages comes
   from a small calibration store with the same mix (bytes per message), aiming at 98% of N GiB so the last
   file is nearly full.  With ``--keep`` a store generated earlier for the same parameters under ``--dir`` is
   reused.  ``--tx-interval-ms`` (default 10, the generator's) is the broker time between two transactional
   sends, the other messages spread between them: it sets how much broker time the store spans, i.e. how many
   check-service passes (30 s apart on 5.1+) and consumer-offset persists (every 5 s) lie between two
   snapshots of a growing store (``--incremental-runs``), which is what lets transactions settle between runs.
2. **scan** -- ``JavaSparkContext.binaryRecords(<commitlog dir>, 1 MiB).count()``: every CommitLog byte read
   by the JVM (Hadoop FixedLengthBinaryInputFormat splits), nothing decoded, nothing sent to Python.  The
   floor of what any Spark job over these files costs on this machine.
3. **full** -- ``jobs.audit.run.run_audit`` in ``full`` mode (every record decoded by the Python data source, the
   reconstruction, every Delta table written) into ``<dir>/.../out-full``.
4. **indexed** -- the same in ``indexed`` mode (records fetched through the consume queues) into
   ``out-indexed``.

On a local master every one-job read (any store size) runs its tasks in the driver's threads, not in a
Spark job (``jobs.read.full.driver_read_bound``; no Python worker then); on a cluster only one of at most
``CLUSTER_READ_DRIVER_BYTES`` does.

All three run in one SparkSession, after untimed warm-up audits (both modes) of a small store with the same
mix, so JVM start-up, JIT compilation and the Python workers' imports are charged to neither mode
(``--no-warmup`` skips it).  That small store is then audited once more per mode, timed, in the same warm
session: ``small_audit_s`` (the fixed cost of an audit: what a small store costs end to end).  The OS page
cache is warm from the generation (the store is read from memory, like a re-run of the job would be) unless
``--cold``: then ``sync; echo 3 > /proc/sys/vm/drop_caches`` runs before each timed scan and audit (root only;
the JSON says ``"cold": false`` when it could not).  Each audit's phase timings (plan, read -- split into
read.records and read.anomalies --, reconstruct, aggregate, write) are printed under the table and are in
the JSON (``full_phases`` / ``indexed_phases``, seconds).

``--store-on s3``: after the disk audits, the same store uploaded to a local S3-compatible server and audited
from there in both modes (``jobs.bench.s3audit``: seconds, requests and bytes from the server's request log,
the indexed audit's share of the CommitLog bytes); the JSON gets a ``store_on_s3`` object.

Peak Python worker RSS: a sampler thread reads ``/proc`` every 0.2 s and takes, over every ``pyspark.daemon``
/ ``pyspark.worker`` process descended from this process (the local executor's Python workers: data-source
reads, ``mapInArrow`` decoders and Delta file writers), the maximum ``VmHWM`` (the kernel's per-process peak
resident set, so short peaks between samples are not missed).  Linux only; 0 elsewhere.

Output: a table, then as the LAST line one JSON object::

    {"size_gb": ..., "tx_share": ..., "scan_s": ..., "full_s": ..., "indexed_s": ..., "full_over_scan": ...,
     "full_over_indexed": ..., "peak_worker_rss_mb": ..., "full_phases": {...}, "indexed_phases": {...},
     "small_audit_s": {"full": ..., "indexed": ...} or null, "cold": true|false,
     "transactions": ..., "commitlog_bytes": ..., "full_read_bytes": ..., "indexed_read_bytes": ...}

``full_read_bytes`` / ``indexed_read_bytes``: the bytes of store files each timed audit read, counted by the
readers themselves (``txlog_io.readstats``: every pread / read of a CommitLog, consume queue, index,
statetable, checkpoint or config file, in the driver and in every Python worker, which report through
per-process files under ``<dir>/.readstats``); ``commitlog_bytes``: the CommitLog files' size;
``full_read_kinds`` / ``indexed_read_kinds``: the same bytes per kind of file (commitlog, consumequeue, index,
config, checkpoint, fingerprint, ...).

With several ``--sizes`` every size is measured in turn (one session) and the last line is
``{"sizes_gb": [...], "runs": [<one object as above per size>], "full_s_per_gb": [...], "indexed_s_per_gb":
[...], "small_audit_s": ..., "cold": ...}`` (linearity: per-GiB times should stay flat).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, Optional, Sequence

GIB = 1 << 30
MIB = 1 << 20
SCAN_RECORD = MIB
PROFILE = "5.1+"
SCENARIO = "clean"
SEED = 1
AS_OF = "2026-11-22T00:00:00Z"
TX_INTERVAL_MS = 10             # refbroker.workload's default: broker ms between two transactional sends
FILL = 0.98
CALIBRATION_MESSAGES = 4000


@dataclass
class BenchRun:
    size_gb: float
    tx_share: float
    commitlog_gib: float          # CommitLog bytes on disk (whole mapped files)
    record_gib: float             # bytes of records written
    messages: int
    transactions: int
    generate_s: float
    scan_s: float
    full_s: float
    indexed_s: float
    full_over_scan: float
    full_over_indexed: float
    peak_worker_rss_mb: float
    full_phases: dict
    indexed_phases: dict
    states: dict
    small_audit_s: Optional[dict] = None    # the warm-up store's audit per mode, timed (None: --no-warmup)
    cold: bool = False                      # the page cache was dropped before each timed run
    commitlog_bytes: int = 0                # CommitLog file bytes on disk
    full_read_bytes: int = -1               # store bytes each mode's audit read (txlog_io.readstats; -1: not
    indexed_read_bytes: int = -1            # counted, the counting directory could not be set up)
    incremental: Optional[dict] = None      # --incremental P: jobs.bench.incremental keys
    full_read_kinds: Optional[dict] = None      # the read bytes per kind of file (readstats.directory_kinds)
    indexed_read_kinds: Optional[dict] = None
    s3: Optional[dict] = None                   # --store-on s3: the audits from the local S3 server (s3audit)

    def line(self) -> dict:
        return {"size_gb": self.size_gb, "tx_share": self.tx_share, "scan_s": round(self.scan_s, 2),
                "full_s": round(self.full_s, 2), "indexed_s": round(self.indexed_s, 2),
                "full_over_scan": round(self.full_over_scan, 2),
                "full_over_indexed": round(self.full_over_indexed, 2),
                "peak_worker_rss_mb": round(self.peak_worker_rss_mb, 1),
                "full_phases": self.full_phases, "indexed_phases": self.indexed_phases,
                "small_audit_s": self.small_audit_s, "cold": self.cold,
                "transactions": self.transactions,
                "commitlog_bytes": self.commitlog_bytes, "full_read_bytes": self.full_read_bytes,
                "indexed_read_bytes": self.indexed_read_bytes, "full_read_kinds": self.full_read_kinds,
                "indexed_read_kinds": self.indexed_read_kinds, **(self.incremental or {}),
                **({"store_on_s3": self.s3} if self.s3 else {})}


# ------------------------------------------------------------------------------------------------------------
# peak RSS of the Python workers
# ------------------------------------------------------------------------------------------------------------

def _ppid(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _vm_hwm_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def python_workers(root_pid: int, marker: bytes = b"pyspark.") -> List[int]:
    """pids of processes descended from ``root_pid`` whose command line names a pyspark daemon / worker."""
    if not os.path.isdir("/proc"):
        return []
    parents, cmds = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if marker in cmd and b"java" not in cmd.split(b"\0")[0]:
            cmds[pid] = cmd
        parents[pid] = _ppid(pid)
    out = []
    for pid in cmds:
        p, seen = parents.get(pid), 0
        while p and p != 1 and seen < 64:
            if p == root_pid:
                out.append(pid)
                break
            p = parents.get(p) if p in parents else _ppid(p)
            seen += 1
    return out


class RssSampler:
    """Background thread: max VmHWM (MB) over the Python workers descended from ``root_pid``."""

    def __init__(self, root_pid: Optional[int] = None, interval: float = 0.2, marker: bytes = b"pyspark."):
        self.root_pid = root_pid or os.getpid()
        self.interval = interval
        self.marker = marker
        self.peak_kb = 0
        self.seen: set = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def _sample(self) -> None:
        for pid in python_workers(self.root_pid, self.marker):
            self.seen.add(pid)
            self.peak_kb = max(self.peak_kb, _vm_hwm_kb(pid))

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> "RssSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    @property
    def peak_mb(self) -> float:
        return self.peak_kb / 1024.0


# ------------------------------------------------------------------------------------------------------------
# store generation
# ------------------------------------------------------------------------------------------------------------

def split_messages(total: int, tx_share: float) -> tuple:
    """(transactions, ordinary messages) for ``total`` producer messages of which ``tx_share`` are
    transactional."""
    tx = max(1, int(round(total * tx_share))) if tx_share > 0 else 0
    return tx, max(0, total - tx)


def messages_for(size_gb: float, bytes_per_message: float, fill: float = FILL) -> int:
    return max(10, int(size_gb * GIB * fill / bytes_per_message))


def calibration_store(tx_share: float, msg_bytes: int, workdir: Path):
    """A small store with the benchmark's mix -> (store dir, record bytes per producer message)."""
    from refbroker import generate

    tx, bg = split_messages(CALIBRATION_MESSAGES, tx_share)
    res = generate(PROFILE, SCENARIO, tx, SEED, workdir, background_messages=bg, msg_bytes=msg_bytes,
                   commitlog_file_mb=64)
    return res.store_dir, res.summary["store"]["record_bytes"] / float(tx + bg)


def calibrate(tx_share: float, msg_bytes: int, workdir: Path) -> float:
    """Record bytes per producer message for this mix, from a small store (removed again)."""
    try:
        return calibration_store(tx_share, msg_bytes, workdir)[1]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def warm_up(spark, tx_share: float, msg_bytes: int, workdir: Path, log=print, cold: bool = False) -> dict:
    """Audit a small store in both modes (not timed into the results): the JVM compiles the plans' code paths
    and the Python workers import their modules once, so neither measured mode pays that warm-up.  Then audit
    it once more per mode, timed: -> {"full": s, "indexed": s, "full_phases": {...}, "indexed_phases": {...}}
    (the small-store cost of a warm session)."""
    t0 = time.monotonic()
    small: dict = {}
    try:
        store, _ = calibration_store(tx_share, msg_bytes, workdir / "store")
        for mode in ("full", "indexed"):
            timed_audit(spark, store, workdir / f"out-{mode}", mode)
        for mode in ("full", "indexed"):
            drop_page_cache(cold)
            seconds, summary = timed_audit(spark, store, workdir / f"out-{mode}", mode)
            small[mode] = round(seconds, 2)
            small[f"{mode}_phases"] = _phases(summary)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"warm-up audits of a {CALIBRATION_MESSAGES}-message store: {time.monotonic() - t0:.1f} s; timed: "
        f"full {small.get('full')} s, indexed {small.get('indexed')} s")
    return small


def drop_page_cache(wanted: bool) -> bool:
    """``sync; echo 3 > /proc/sys/vm/drop_caches`` when ``wanted``; whether the cache was dropped."""
    if not wanted:
        return False
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return True
    except OSError:
        return False


def _phases(summary) -> dict:
    return {k: round(v, 2) for k, v in summary.phases.items() if not k.startswith("write.")}


def generate_store(size_gb: float, tx_share: float, msg_bytes: int, file_mb: int, base: Path, keep: bool,
                   incremental: Optional[float] = None, incremental_runs: int = 1,
                   tx_interval_ms: int = TX_INTERVAL_MS):
    """-> (store_dir, summary dict, seconds).  ``incremental`` P: also a snapshot before the last P of the
    send phase (jobs.bench.incremental); with ``incremental_runs`` K > 1 instead K snapshots, one every
    1/(K+1) of the send phase (P unused)."""
    from refbroker import generate

    params = {"size_gb": size_gb, "tx_share": tx_share, "msg_bytes": msg_bytes, "file_mb": file_mb,
              "profile": PROFILE, "scenario": SCENARIO, "seed": SEED, "incremental": incremental,
              **({"incremental_runs": incremental_runs} if incremental_runs > 1 else {}),
              **({"tx_interval_ms": tx_interval_ms} if tx_interval_ms != TX_INTERVAL_MS else {})}
    marker = base / "bench-params.json"
    if keep and marker.is_file() and (base / "summary.json").is_file() and (base / "store").is_dir():
        if json.loads(marker.read_text()) == params:
            return base / "store", json.loads((base / "summary.json").read_text()), 0.0
    t0 = time.monotonic()
    per_msg = calibrate(tx_share, msg_bytes, base.parent / f".calibrate-{base.name}")
    tx, bg = split_messages(messages_for(size_gb, per_msg), tx_share)
    every = None
    if incremental:
        from jobs.bench.incremental import snapshot_every

        every = snapshot_every(tx, incremental if incremental_runs <= 1
                               else incremental_runs / (incremental_runs + 1), SCENARIO)
    res = generate(PROFILE, SCENARIO, tx, SEED, base, background_messages=bg, msg_bytes=msg_bytes,
                   commitlog_file_mb=file_mb, snapshot_every=every, tx_interval_ms=tx_interval_ms)
    _check_span(res.summary, tx_interval_ms)
    marker.write_text(json.dumps(params))
    return res.store_dir, res.summary, time.monotonic() - t0


def _check_span(summary: dict, tx_interval_ms: int) -> None:
    """The store must end before the bench's ``AS_OF`` (every audit of it is as of then)."""
    from refbroker.generate import DEFAULT_START_MS

    end_ms = DEFAULT_START_MS + int(summary["store"]["simulated_ms"])
    as_of_ms = int(datetime.datetime.fromisoformat(AS_OF.replace("Z", "+00:00")).timestamp() * 1000)
    if end_ms >= as_of_ms:
        raise SystemExit(f"txlog-bench audit: error: the store spans {(end_ms - DEFAULT_START_MS) / 1000:.0f} s "
                         f"of broker time and ends after the bench's as-of {AS_OF}; use a smaller "
                         f"--tx-interval-ms than {tx_interval_ms}")


# ------------------------------------------------------------------------------------------------------------
# measurements
# ------------------------------------------------------------------------------------------------------------

def jvm_scan(spark, commitlog_dir: str) -> tuple:
    """(bytes, seconds) of a JVM-only read of every CommitLog byte."""
    t0 = time.monotonic()
    n = spark.sparkContext._jsc.binaryRecords(str(commitlog_dir), SCAN_RECORD).count()
    return int(n) * SCAN_RECORD, time.monotonic() - t0


def read_stats_dir(spark, workdir: Path) -> Optional[str]:
    """Turn on store-read counting (``txlog_io.readstats``) for this process and the session's Python
    workers: the directory they write their totals to (None when it cannot be made)."""
    from txlog_io import readstats

    directory = str(workdir / ".readstats")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    os.environ[readstats.ENV] = directory
    with contextlib.suppress(Exception):     # workers started from now on (already set when we built the JVM)
        spark.sparkContext.environment[readstats.ENV] = directory
    return directory


def read_bytes_total(directory: Optional[str]) -> int:
    """Store bytes read so far by this process and every worker that reported into ``directory``."""
    from txlog_io import readstats

    if directory is None:
        return -1
    readstats.flush()
    return readstats.directory_total(directory)


def read_kinds(directory: Optional[str]) -> dict:
    """Store bytes read so far per kind of file (commitlog, consumequeue, index, ...), as read_bytes_total."""
    from txlog_io import readstats

    if directory is None:
        return {}
    readstats.flush()
    return readstats.directory_kinds(directory)


def _kinds_between(before: dict, after: dict) -> dict:
    return {k: after[k] - before.get(k, 0) for k in sorted(after) if after[k] > before.get(k, 0)}


def timed_audit(spark, store: Path, out: Path, mode: str):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    _, opts = parse_args(["audit", "--store", str(store), "--out", str(out), "--as-of", AS_OF,
                          "--mode", mode])
    t0 = time.monotonic()
    summary = run_audit(spark, opts, print_summary=False)
    return time.monotonic() - t0, summary


def bench_size(spark, size_gb: float, tx_share: float, workdir: Path, keep: bool, msg_bytes: int,
               file_mb: int, log=print, cold: bool = False, stats_dir: Optional[str] = None,
               incremental: Optional[float] = None, incremental_runs: int = 1, s3=None,
               tx_interval_ms: int = TX_INTERVAL_MS) -> BenchRun:
    base = workdir / f"store-{size_gb:g}gb-p{tx_share:g}"
    log(f"[{size_gb:g} GiB] generating the store under {base} ...")
    store, gen, gen_s = generate_store(size_gb, tx_share, msg_bytes, file_mb, base, keep, incremental,
                                       incremental_runs, tx_interval_ms)
    commitlog = store / "commitlog"
    cl_bytes = sum(f.stat().st_size for f in commitlog.iterdir() if f.is_file())
    log(f"[{size_gb:g} GiB] {gen['store']['records']} records, {cl_bytes / GIB:.2f} GiB of CommitLog "
        f"({gen['transactions']} transactions) in {gen_s:.0f} s; scanning ...")
    for d in ("out-full", "out-indexed"):
        shutil.rmtree(base / d, ignore_errors=True)
    dropped = []
    with RssSampler() as rss:
        dropped.append(drop_page_cache(cold))
        scan_bytes, scan_s = jvm_scan(spark, str(commitlog))
        log(f"[{size_gb:g} GiB] scan {scan_bytes / GIB:.2f} GiB in {scan_s:.1f} s; audit full ...")
        dropped.append(drop_page_cache(cold))
        read0, kinds0 = read_bytes_total(stats_dir), read_kinds(stats_dir)
        full_s, full = timed_audit(spark, store, base / "out-full", "full")
        read1, kinds1 = read_bytes_total(stats_dir), read_kinds(stats_dir)
        log(f"[{size_gb:g} GiB] full {full_s:.1f} s; audit indexed ...")
        dropped.append(drop_page_cache(cold))
        indexed_s, indexed = timed_audit(spark, store, base / "out-indexed", "indexed")
        read2, kinds2 = read_bytes_total(stats_dir), read_kinds(stats_dir)
        log(f"[{size_gb:g} GiB] indexed {indexed_s:.1f} s")
        inc = None
        if incremental:
            from jobs.bench.incremental import bench_growth, bench_incremental

            dropped.append(drop_page_cache(cold))
            inc = (bench_incremental if incremental_runs <= 1 else bench_growth)(
                spark, base, store, AS_OF, log=log, before_timed=lambda: dropped.append(drop_page_cache(cold)))
            inc["incremental_over_full"] = round(inc["incremental_s"] / full_s, 3) if full_s else None
            log(f"[{size_gb:g} GiB] incremental {inc['incremental_s']:.1f} s ({inc['incremental_over_full']} "
                f"of full)")
    s3_result = None
    if s3 is not None:
        s3_result = s3.bench(spark, store, base, f"{size_gb:g}gb-p{tx_share:g}", cl_bytes,
                             {"full": full.states, "indexed": indexed.states}, timed_audit, log=log)
    if full.states != indexed.states:
        log(f"[{size_gb:g} GiB] note: states differ between modes: full {full.states} "
            f"indexed {indexed.states}")
    messages = int(gen.get("background_messages", 0)) + int(gen["transactions"])
    return BenchRun(
        size_gb=size_gb, tx_share=tx_share, commitlog_gib=cl_bytes / GIB,
        record_gib=gen["store"]["record_bytes"] / GIB, messages=messages,
        transactions=int(gen["transactions"]),
        generate_s=gen_s, scan_s=scan_s, full_s=full_s, indexed_s=indexed_s,
        full_over_scan=full_s / scan_s if scan_s > 0 else math.inf,
        full_over_indexed=full_s / indexed_s if indexed_s > 0 else math.inf,
        peak_worker_rss_mb=rss.peak_mb,
        full_phases=_phases(full), indexed_phases=_phases(indexed),
        states=dict(full.states), cold=all(dropped), commitlog_bytes=cl_bytes,
        full_read_bytes=read1 - read0 if stats_dir else -1,
        indexed_read_bytes=read2 - read1 if stats_dir else -1, incremental=inc,
        full_read_kinds=_kinds_between(kinds0, kinds1), indexed_read_kinds=_kinds_between(kinds1, kinds2),
        s3=s3_result)


def format_table(runs: Sequence[BenchRun]) -> str:
    head = (f"{'size':>8} {'tx share':>8} {'CommitLog':>10} {'messages':>10} {'tx':>8} {'scan s':>8} "
            f"{'full s':>8} {'indexed s':>9} {'full/scan':>9} {'full/idx':>8} {'full MiB/s':>10} "
            f"{'peak worker RSS':>15}")
    lines = [head, "-" * len(head)]
    for r in runs:
        mibs = r.commitlog_gib * 1024 / r.full_s if r.full_s else 0.0
        lines.append(f"{r.size_gb:>6g} G {r.tx_share:>8g} {r.commitlog_gib:>8.2f} G {r.messages:>10} "
                     f"{r.transactions:>8} {r.scan_s:>8.1f} {r.full_s:>8.1f} {r.indexed_s:>9.1f} "
                     f"{r.full_over_scan:>9.1f} {r.full_over_indexed:>8.2f} {mibs:>10.1f} "
                     f"{r.peak_worker_rss_mb:>12.0f} MB")
    for r in runs:
        lines.append(f"  {r.size_gb:g} GiB phases: full {r.full_phases}; indexed {r.indexed_phases}")
    if runs and runs[0].small_audit_s:
        s = runs[0].small_audit_s
        lines.append(f"  small store ({CALIBRATION_MESSAGES} messages), warm session: full {s['full']} s "
                     f"{s['full_phases']}; indexed {s['indexed']} s {s['indexed_phases']}")
    for r in runs:
        if r.s3:
            f, i = r.s3["full"], r.s3["indexed"]
            lines.append(f"  {r.size_gb:g} GiB from the local S3 server (disk: full {r.full_s:.1f} s, indexed "
                         f"{r.indexed_s:.1f} s): full {f['seconds']} s, {f['requests']} requests, "
                         f"{f['bytes_out'] / MIB:.1f} MiB; indexed {i['seconds']} s, {i['requests']} requests, "
                         f"{i['bytes_out'] / MIB:.1f} MiB ({i['commitlog_bytes_read'] / MIB:.1f} MiB of CommitLog "
                         f"= {r.s3['indexed_commitlog_share']} of it); writes {r.s3['writes']}, states equal "
                         f"{r.s3['states_equal']}")
    lines.append(f"  page cache: {'dropped before each timed run' if runs and all(r.cold for r in runs) else 'warm'}")
    return "\n".join(lines)


def result_line(runs: Sequence[BenchRun]) -> dict:
    if len(runs) == 1:
        return runs[0].line()
    return {"sizes_gb": [r.size_gb for r in runs], "runs": [r.line() for r in runs],
            "full_s_per_gb": [round(r.full_s / r.commitlog_gib, 2) for r in runs],
            "indexed_s_per_gb": [round(r.indexed_s / r.commitlog_gib, 2) for r in runs],
            "small_audit_s": runs[0].small_audit_s if runs else None,
            "cold": all(r.cold for r in runs) if runs else False}


# ------------------------------------------------------------------------------------------------------------
# command line
# ------------------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="txlog-bench audit",
        description="Spark audit (full and indexed) vs a JVM scan of the same CommitLog")
    p.add_argument("--size-gb", type=float, default=1.0, help="GiB of CommitLog to generate (default 1)")
    p.add_argument("--sizes", default=None,
                   help="comma-separated sizes in GiB, e.g. 1,2,4 (overrides --size-gb)")
    p.add_argument("--tx-share", type=float, default=0.01,
                   help="share of producer messages that are transactional (default 0.01)")
    p.add_argument("--fixed-tx", action="store_true",
                   help="with --sizes: scale the share per size so every store holds the transactions of the "
                        "largest size at --tx-share (share x largest / size): indexed time vs store size")
    p.add_argument("--dir", default=None, help="working directory (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep (and reuse) the generated stores and outputs")
    p.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    p.add_argument("--driver-memory", default="4g", help="driver memory when this command starts the JVM")
    p.add_argument("--msg-bytes", type=int, default=1024,
                   help="body size of generated messages (default 1024)")
    p.add_argument("--file-mb", type=int, default=1024, help="CommitLog file size in MiB (default 1024)")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the untimed warm-up audits of a small store (then the first mode measured pays "
                        "the JVM's and the workers' warm-up; no small_audit_s)")
    p.add_argument("--incremental", type=float, default=None, metavar="P",
                   help="also time an incremental full-mode audit after the last share P of the store was "
                        "appended (a snapshot at 1-P audited first, untimed): incremental_s, "
                        "incremental_over_full")
    p.add_argument("--incremental-runs", type=int, default=1, metavar="K",
                   help="with --incremental: K > 1 snapshots of the growing store, one every 1/(K+1) of it, "
                        "audited one after the other with --incremental (the first falls back to a full audit): "
                        "each run's time and carried state rows (incremental_runs); incremental_over_full from "
                        "the last run")
    p.add_argument("--tx-interval-ms", type=int, default=TX_INTERVAL_MS, metavar="MS",
                   help="broker time between two transactional sends in the generated store (default "
                        f"{TX_INTERVAL_MS}; the other messages spread between them): how much broker time, "
                        "i.e. how many check-service passes, lie between the snapshots of --incremental-runs")
    p.add_argument("--store-on", dest="store_on", choices=("disk", "s3"), default="disk",
                   help="s3: also audit the store (full and indexed) from a local S3-compatible server on "
                        "loopback (moto, a test extra): seconds, requests, bytes transferred (jobs.bench.s3audit)")
    p.add_argument("--cold", action="store_true",
                   help="drop the OS page cache before each timed run (sync; echo 3 > /proc/sys/vm/drop_caches, "
                        "needs root; the JSON says whether it could)")
    return p


def parse_sizes(args) -> List[float]:
    if args.sizes:
        try:
            sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
        except ValueError:
            raise SystemExit(f"txlog-bench audit: error: --sizes: not a list of numbers: {args.sizes!r}") from None
    else:
        sizes = [args.size_gb]
    if not sizes or any(s <= 0 for s in sizes):
        raise SystemExit("txlog-bench audit: error: sizes must be positive")
    if not 0.0 <= args.tx_share <= 1.0:
        raise SystemExit("txlog-bench audit: error: --tx-share must be within [0, 1]")
    if args.incremental is not None and not 0.0 < args.incremental < 0.5:
        raise SystemExit("txlog-bench audit: error: --incremental must be within (0, 0.5)")
    if args.tx_interval_ms < 1:
        raise SystemExit("txlog-bench audit: error: --tx-interval-ms must be at least 1")
    if args.incremental_runs < 1 or (args.incremental_runs > 1 and args.incremental is None):
        raise SystemExit("txlog-bench audit: error: --incremental-runs K needs K >= 1 and --incremental")
    return sizes


def run(argv: Optional[Sequence[str]] = None, spark=None) -> List[BenchRun]:
    """Parse, measure, print; returns the runs.  ``spark``: an existing session to use (not stopped)."""
    args = _parser().parse_args(list(argv or []))
    sizes = parse_sizes(args)
    own_dir = args.dir is None
    workdir = Path(tempfile.mkdtemp(prefix="txlog-bench-audit-")) if own_dir else Path(args.dir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    own_session = spark is None
    if own_session:
        from txlog_io import readstats

        os.environ[readstats.ENV] = str(workdir / ".readstats")     # inherited by the JVM and its workers
        from jobs.session import build_session

        spark = build_session(app_name="txaudit-bench", master=args.master, extra_conf={
            "spark.driver.memory": args.driver_memory, "spark.ui.showConsoleProgress": "false"})

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    runs: List[BenchRun] = []
    small = None
    s3 = None
    try:
        from jobs.bench import s3audit

        s3 = s3audit.start(spark, args.store_on == "s3")     # before the warm-up: the same warm workers
        stats_dir = read_stats_dir(spark, workdir)
        if not args.no_warmup:
            small = warm_up(spark, args.tx_share, args.msg_bytes, workdir / ".warmup", log=log, cold=args.cold)
        for size in sizes:
            share = args.tx_share * max(sizes) / size if args.fixed_tx else args.tx_share
            runs.append(bench_size(spark, size, round(share, 9), workdir, args.keep, args.msg_bytes,
                                   args.file_mb, log=log, cold=args.cold, stats_dir=stats_dir,
                                   incremental=args.incremental, incremental_runs=args.incremental_runs,
                                   tx_interval_ms=args.tx_interval_ms,
                                   s3=s3))
            runs[-1].small_audit_s = small
            if not args.keep:
                shutil.rmtree(workdir / f"store-{size:g}gb-p{runs[-1].tx_share:g}", ignore_errors=True)
    finally:
        if s3 is not None:
            s3.stop(None if own_session else spark)
        if own_session:
            spark.stop()
        else:       # the caller's session: counting off again for what it runs next
            from txlog_io import readstats

            os.environ.pop(readstats.ENV, None)
            with contextlib.suppress(Exception):
                spark.sparkContext.environment.pop(readstats.ENV, None)
        if not args.keep:
            shutil.rmtree(workdir / ".readstats", ignore_errors=True)
        if not args.keep and own_dir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(format_table(runs))
    print(json.dumps(result_line(runs)), flush=True)
    return runs


def main(argv: Optional[Sequence[str]] = None) -> int:
    run(sys.argv[1:] if argv is None else argv)
    return 0


__all__ = ["main", "run", "BenchRun", "RssSampler", "python_workers", "jvm_scan", "split_messages",
           "messages_for", "result_line", "format_table", "asdict"]
