"""``refbroker.generate``: one call from (profile, scenario, size, seed) to a store, its ledger and a summary.

Layout of ``out_dir``::

    store/          the broker store (storePathRootDir)
    ledger.jsonl    ground truth, one JSON line per transaction and per injected fault (refbroker.ledger)
    summary.json    counts per outcome / visible outcome / flag / fault, store statistics, timing

The run is deterministic for a given (profile, scenario, transactions, background_messages, sizes, seed): the
simulated clock starts at ``start_ms`` and every random choice comes from ``random.Random(seed)``.
"""
from __future__ import annotations

import contextlib
import gc
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from refbroker import ledger as L
from refbroker.broker import Broker
from refbroker.faults import FaultContext, apply_faults
from refbroker.profiles import Profile, get_profile
from refbroker.workload import Workload, WorkloadConfig, get_scenario, resolve_profiles
from txlog_io.consumequeue import STATETABLE_UNIT_SIZE
from txlog_io.errors import UsageError
from txlog_io.progress import Progress

MIB = 1 << 20
DEFAULT_START_MS = 1_795_300_000_000      # 2026-11-21, like the fixtures' clocks


@dataclass
class GenerateResult:
    store_dir: Path
    ledger_path: Path
    summary: dict

    @property
    def summary_path(self) -> Path:
        return self.ledger_path.parent / "summary.json"


def _sizes(profile: Profile, scenario, sizes: dict) -> dict:
    merged = dict(scenario.default_sizes)
    merged.update({k: v for k, v in sizes.items() if v is not None})
    unknown = set(merged) - {
        "commitlog_file_size",
        "commitlog_file_mb",
        "consumequeue_file_size",
        "cq_file_units",
        "statetable_file_size",
        "redolog_file_size",
        "background_messages",
        "msg_bytes",
        "tx_interval_ms",
        "start_ms",
        "retry_every",
        "crash_downtime_ms",
    }
    if unknown:
        raise UsageError(f"unknown size option(s): {', '.join(sorted(unknown))}")
    if "commitlog_file_mb" in merged:
        merged["commitlog_file_size"] = int(float(merged.pop("commitlog_file_mb")) * MIB)
    if "cq_file_units" in merged:
        merged["consumequeue_file_size"] = int(merged.pop("cq_file_units")) * 20
    for key in ("commitlog_file_size", "consumequeue_file_size", "statetable_file_size", "redolog_file_size",
                "msg_bytes", "tx_interval_ms"):
        if key in merged and (not isinstance(merged[key], int) or merged[key] <= 0):
            raise UsageError(f"{key} must be a positive integer, got {merged[key]!r}")
    if merged.get("commitlog_file_size", 1 << 30) < 4096:
        raise UsageError("commitlog file size must be at least 4096 bytes")
    return merged


class Run:
    """One broker writing ``out_dir/store`` with its ledger and fault collector.

    ``generate`` drives it with a scenario; tests drive ``run.broker`` by hand and call ``run.finish()``::

        run = Run(out_dir, "5.1+", seed=1, commitlog_file_size=1 << 20)
        producer = Producer("PID_X", check_listener=...); run.broker.register_producer(producer)
        run.broker.start(); ...; run.broker.shutdown()          # or run.broker.crash()
        result = run.finish()                                     # ledger.jsonl + summary.json
    """

    def __init__(self, out_dir, profile, *, seed: int = 0, start_ms: int = DEFAULT_START_MS,
                 commitlog_file_size: Optional[int] = None, consumequeue_file_size: Optional[int] = None,
                 statetable_file_size: Optional[int] = None, redolog_file_size: Optional[int] = None):
        self.started = time.perf_counter()
        self.started_cpu = time.process_time()
        self.profile = get_profile(profile)
        self.seed = seed
        self.start_ms = start_ms
        self.out = Path(out_dir)
        self.store_dir = self.out / "store"
        if self.store_dir.exists():
            shutil.rmtree(self.store_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.ledger_path = self.out / "ledger.jsonl"
        self.partial_path = self.out / "ledger.partial.jsonl"
        self.faults: list = []
        self.writer = L.LedgerWriter(self.partial_path)
        self.broker = Broker(
            self.store_dir,
            self.profile,
            start_ms=start_ms,
            seed=seed,
            commitlog_file_size=commitlog_file_size,
            consumequeue_file_size=consumequeue_file_size,
            statetable_file_size=statetable_file_size,
            redolog_file_size=redolog_file_size,
            ledger=self.writer,
            on_fault=self.collect,
        )
        self.sim_seconds = 0.0
        self.sim_cpu_seconds = 0.0
        self._ended = False

    def collect(self, fault: dict) -> str:
        """The broker's / faults' fault collector: numbers the fault and keeps it for the ledger."""
        fault_id = f"F{len(self.faults) + 1}"
        fault["fault_id"] = fault_id
        self.faults.append(fault)
        return fault_id

    def end_simulation(self) -> None:
        """Every transaction to the (partial) ledger; files closed.  The broker must be stopped or crashed."""
        if self._ended:
            return
        self._ended = True
        broker = self.broker
        try:
            broker.finalize_all()
        finally:
            self.writer.close()
            if not broker.down:
                broker.store.close_files()
        self.sim_seconds = time.perf_counter() - self.started
        self.sim_cpu_seconds = time.process_time() - self.started_cpu
        end_offset = broker.store.commitlog.max_offset
        for fault in self.faults:
            if fault["fault"] == "TORN_TAIL":
                fault["overwritten"] = end_offset >= fault["commitlog_offset"] + fault["length"]

    def snapshot(self, name: str) -> Path:
        """Copy the store as it is on disk now (the broker keeps running: the copy is what an offline audit
        of the live store sees -- abort file present, dispatch possibly lagging) to
        ``out_dir/snapshots/<name>/store``, with the ledger lines written so far (transactions finished by
        then) as ``ledger.partial.jsonl`` next to it."""
        broker = self.broker
        if not broker.down:
            broker.store.flush()
        self.writer.flush()
        dest = self.out / "snapshots" / name
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        shutil.copytree(self.store_dir, dest / "store")
        shutil.copyfile(self.partial_path, dest / "ledger.partial.jsonl")
        return dest

    def inject(self, fault_names) -> None:
        """Post-run faults (refbroker.faults) on the stopped store."""
        if not fault_names:
            return
        broker = self.broker
        ctx = FaultContext(
            self.store_dir,
            broker.profile,
            random.Random(self.seed * 31 + 7),
            commitlog_file_size=broker.store.commitlog_file_size,
            cq_file_size=broker.store.cq_file_size,
            targets=_targets(self.partial_path, broker),
            last_record=broker.store.last_put,
            commitlog_dir=broker.store.commitlog.queue.directory,
        )
        for fault in apply_faults(fault_names, ctx):
            self.collect(fault)

    def finish(self, fault_names=(), extra: Optional[dict] = None) -> GenerateResult:
        """end_simulation (if not done), post-run faults, final ledger and summary.json."""
        if not self._ended:
            self.end_simulation()
        self.inject(fault_names)
        tally = _write_final_ledger(self.partial_path, self.ledger_path, self.faults, self.writer.tally)
        broker, store = self.broker, self.broker.store
        elapsed = time.perf_counter() - self.started
        data_bytes = store.bytes_written
        commitlog_dir = store.commitlog.queue.directory          # commitlog/ or dledger-<id>/data/
        info = {
            "profile": broker.profile.name,
            "seed": self.seed,
            "broker": dict(broker.stats),
            "store": {
                "commitlog_file_size": store.commitlog_file_size,
                "consumequeue_file_size": store.cq_file_size,
                "commitlog_files": len(list(commitlog_dir.glob("*"))) if commitlog_dir.is_dir() else 0,
                "records": store.records_written,
                "record_bytes": data_bytes,
                "store_bytes_on_disk": _tree_bytes(self.store_dir),
                "max_physical_offset": store.commitlog.max_offset,
                "abort_present": (self.store_dir / "abort").exists(),
                "simulated_ms": broker.now - self.start_ms,
            },
            "fault_list": [{k: f.get(k) for k in ("fault_id", "fault", "file", "position", "length",
                                                    "expected_anomalies")} for f in self.faults],
            "timing": {
                "seconds": round(elapsed, 3),
                "simulation_seconds": round(self.sim_seconds, 3),
                "simulation_cpu_seconds": round(self.sim_cpu_seconds, 3),
                "record_mb_per_s": round(data_bytes / MIB / max(self.sim_seconds, 1e-9), 2),
                "record_mb_per_cpu_s": round(data_bytes / MIB / max(self.sim_cpu_seconds, 1e-9), 2),
            },
            "profile_settings": broker.profile.broker_defaults(),
        }
        info.update(extra or {})
        summary = L.summarize(self.ledger_path, extra=info, tally=tally)
        L.write_json(self.out / "summary.json", summary)
        return GenerateResult(self.store_dir, self.ledger_path, summary)


def generate(profile, scenario, transactions: int, seed: int, out_dir, snapshot_every: Optional[int] = None,
             **sizes) -> GenerateResult:
    """Write ``out_dir/store`` for ``scenario`` under ``profile`` with ``transactions`` transactions.

    ``snapshot_every`` N: also copy the store every N transactions of the send phase to
    ``out_dir/snapshots/NNN/store`` (see ``Run.snapshot``): snapshots of one growing store, the final store
    (after the scenario's post-run faults, e.g. retention) being the last state.

    Size options: background_messages (default: 2 per transaction), msg_bytes (1024), commitlog_file_size
    (bytes) or commitlog_file_mb, consumequeue_file_size (bytes) or cq_file_units, statetable_file_size,
    redolog_file_size (3.x), tx_interval_ms (10), start_ms, retry_every, crash_downtime_ms. An existing
    ``out_dir/store`` is replaced.
    """
    profile = get_profile(profile)
    scenario = get_scenario(scenario)
    if isinstance(transactions, bool) or not isinstance(transactions, int) or transactions < 0:
        raise UsageError(f"transactions must be a non-negative integer, got {transactions!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"seed must be an integer, got {seed!r}")
    if snapshot_every is not None and (isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int)
                                       or snapshot_every <= 0):
        raise UsageError(f"snapshot_every must be a positive integer, got {snapshot_every!r}")
    opts = _sizes(profile, scenario, sizes)
    start_profile, final_profile = resolve_profiles(scenario, profile)
    run = Run(
        out_dir,
        start_profile,
        seed=seed,
        start_ms=opts.get("start_ms", DEFAULT_START_MS),
        commitlog_file_size=opts.get("commitlog_file_size"),
        consumequeue_file_size=opts.get("consumequeue_file_size"),
        statetable_file_size=opts.get("statetable_file_size"),
        redolog_file_size=opts.get("redolog_file_size"),
    )
    background = opts.get("background_messages", 2 * transactions)
    config = WorkloadConfig(
        transactions=transactions,
        background_messages=background,
        msg_bytes=opts.get("msg_bytes", 1024),
        tx_interval_ms=opts.get("tx_interval_ms", 10),
        retry_every=opts.get("retry_every", max(10, min(200, background // 4))),
        crash_downtime_ms=opts.get("crash_downtime_ms", 2000),
    )
    workload = Workload(run.broker, scenario, config, seed, profiles=(final_profile, start_profile))
    # a large store takes minutes: progress per transaction on a terminal (silent when stderr is captured)
    workload.progress = Progress(f"generate {profile.name} {scenario.name}", transactions, unit="tx",
                                 check_every=64)
    if snapshot_every:
        snapshots = []

        def after(i: int) -> None:
            if (i + 1) % snapshot_every == 0:
                snapshots.append(run.snapshot(f"{len(snapshots) + 1:03d}"))
        workload.after_transaction = after
    with fewer_collections():
        run.broker.start()
        try:
            workload.run()
        finally:
            workload.progress.close()
            run.end_simulation()
        return run.finish(scenario.post_faults, extra={
            "profile": final_profile.name,
            "start_profile": start_profile.name,
            "scenario": scenario.name,
            "requested_transactions": transactions,
            "background_messages": config.background_messages,
            "transaction_classes": dict(sorted(workload.class_counts.items())),
        })


#: generation allocates a few objects per record, most of them short-lived; with CPython's default first
#: threshold (700) the cyclic collector ran ~30 times per 1,000 transactions and took ~20% of the CPU
GC_GEN0_THRESHOLD = 20_000


@contextlib.contextmanager
def fewer_collections():
    """Run the block with the cyclic collector's first threshold raised to ``GC_GEN0_THRESHOLD`` and the
    objects alive before it frozen (``gc.freeze``: the collector no longer scans the caller's imports and
    data, e.g. a Spark driver's, on every full collection); both restored afterwards.  Objects are still
    collected (the broker's transactions and their copies refer to each other), only less often."""
    old = gc.get_threshold()
    freeze = gc.get_freeze_count() == 0          # a caller that froze objects itself keeps its own freeze
    if freeze:
        gc.freeze()
    gc.set_threshold(max(old[0], GC_GEN0_THRESHOLD), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
        if freeze:
            gc.unfreeze()


def _tree_bytes(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def _targets(partial_path: Path, broker: Broker) -> dict:
    """Reservoir samples of records the faults can hit, from the partial ledger and the broker."""
    rng = random.Random(17)
    pools: dict = {"commit": [], "half": [], "op": []}
    seen = {k: 0 for k in pools}

    def offer(kind: str, item: dict) -> None:
        seen[kind] += 1
        pool = pools[kind]
        if len(pool) < 64:
            pool.append(item)
        else:
            j = rng.randrange(seen[kind])
            if j < 64:
                pool[j] = item

    for entry in L.iter_ledger(partial_path):
        key = entry["transaction_key"]
        for record in entry["commit_records"]:
            offer("commit", {**record, "record": "commit", "transaction_key": key})
        for copy in entry["half_copies"]:
            offer("half", {**copy, "record": "half", "transaction_key": key})
        for op in entry["op_records"]:
            offer(
                "op",
                {
                    "commitlog_offset": op["op_commitlog_offset"],
                    "size": op["op_size"],
                    "file": op["file"],
                    "file_position": op["file_position"],
                    "record": "op",
                    "transaction_key": key,
                },
            )
    pools["ordinary"] = [dict(s, record="ordinary") for s in broker.ordinary_samples]
    return pools


def _in_ranges(offset, ranges) -> bool:
    return offset is not None and any(start <= offset < end for start, end in ranges)


def _write_final_ledger(partial_path: Path, ledger_path: Path, faults: list, partial: L.Tally) -> L.Tally:
    """The final ledger: the partial ledger's transaction lines (annotated with the faults' effects) and the
    fault lines.  Returns the counts of every line written (``partial``: those of the partial ledger)."""
    deleted, corrupted, damaged, units, op_queue_faults, gone_units = [], [], [], {}, [], []
    for fault in faults:
        effects = fault.get("effects") or {}
        deleted += [(tuple(r), fault["fault_id"]) for r in effects.get("deleted", [])]
        corrupted += [(tuple(r), fault["fault_id"]) for r in effects.get("corrupted", [])]
        damaged += [(tuple(r), fault["fault_id"]) for r in effects.get("body_damaged", [])]
        for index, state in effects.get("statetable_units", []):
            units[index] = (state, fault["fault_id"])
        if fault["fault"] == "RETENTION_DELETE_QUEUE_FILE" and \
                fault["file"].startswith("transaction/statetable/"):
            start = int(fault["file"].rsplit("/", 1)[1])           # statetable files are named by byte offset
            gone_units.append(((start, start + fault["length"]), fault["fault_id"]))
        if effects.get("op_queue_deleted"):
            op_queue_faults.append(fault["fault_id"])
    if not (deleted or corrupted or damaged or units or op_queue_faults or gone_units):
        # nothing to mark: keep the transaction lines as written and append the fault lines
        os.replace(partial_path, ledger_path)
        writer = L.LedgerWriter(ledger_path, append=True)
        writer.tally.merge(partial)
    else:
        writer = L.LedgerWriter(ledger_path)
        for entry in L.iter_ledger(partial_path):
            _annotate(entry, deleted, corrupted, op_queue_faults, damaged, units, gone_units)
            writer.write(entry)
        partial_path.unlink()
    try:
        for fault in faults:
            line = {"kind": "fault", "fault_id": fault["fault_id"]}
            line.update((k, v) for k, v in fault.items() if k not in line)
            writer.write(line)
    finally:
        writer.close()
    return writer.tally


def _annotate(entry: dict, deleted: list, corrupted: list, op_queue_faults: list, damaged: tuple = (),
              units: Optional[dict] = None, gone_units: tuple = ()) -> None:
    """Marks the records of one ledger line hit by post-run faults: ``deleted`` / ``corrupted`` ranges make a
    record unreadable (present false), ``damaged`` ranges (body CRC only) keep it present; a flipped 3.x
    statetable unit (``units``: index -> (new state, fault id)) replaces the line's statetable state, a
    statetable file deleted by retention (``gone_units``: byte ranges) removes it."""
    flags, fault_ids = set(entry["flags"]), set(entry["faults"])

    def mark(record: dict, offset_key: str = "commitlog_offset") -> None:
        offset = record.get(offset_key)
        if not record.get("present", False) or offset is None:
            return
        size = record.get("op_size" if offset_key == "op_commitlog_offset" else "size") or 1
        for (start, end), fault_id in damaged:
            if offset < end and start < offset + size:
                flags.add(L.RECORD_CORRUPTED)
                fault_ids.add(fault_id)
        for (start, end), fault_id in deleted:
            if start <= offset < end:
                record["present"] = False
                flags.add(L.RECORD_DELETED)
                fault_ids.add(fault_id)
        for (start, end), fault_id in corrupted:
            if start <= offset < end:
                record["present"] = False
                flags.add(L.RECORD_CORRUPTED)
                fault_ids.add(fault_id)

    for group in ("half_copies", "commit_records", "rollback_records", "discard_records"):
        for record in entry[group]:
            mark(record)
    for op in entry["op_records"]:
        mark(op, "op_commitlog_offset")
    if op_queue_faults and entry["op_records"]:
        flags.add(L.OP_QUEUE_DELETED)
        fault_ids.update(op_queue_faults)
    unit = entry.get("statetable")
    for (start, end), fault_id in gone_units:
        if unit is not None and start <= unit["index"] * STATETABLE_UNIT_SIZE < end:
            entry["statetable"] = unit = None
            flags.add(L.RECORD_DELETED)
            fault_ids.add(fault_id)
    if units and unit is not None and unit["index"] in units:
        unit["state"], fault_id = units[unit["index"]]
        flags.update((L.RECORD_CORRUPTED, L.STATETABLE_STALE))
        fault_ids.add(fault_id)
    entry["flags"] = sorted(flags)
    entry["faults"] = sorted(fault_ids, key=lambda f: int(f[1:]))
    entry["visible_outcome"] = L.entry_outcome(entry, True)


__all__ = ["generate", "GenerateResult", "Run"]
