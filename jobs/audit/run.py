"""The audit job: ``run_audit(spark, options) -> AuditSummary``.

Called by ``jobs.main`` (``./spark-submit.sh audit ...``) with a validated ``jobs.main.AuditOptions``; a thin
driver around the modules that do the work:

1. **plan** -- ``jobs.read.frames.load_store_frames`` lists the stores (driver: directory listing and
   ``stat`` only) and returns lazy DataFrames; the store fingerprint is computed from the same kind of
   listing; the ``AuditParams`` per profile come from ``conf/broker-defaults.json`` + the user's
   ``broker.<key>`` overrides with ``as_of_ms`` = ``--as-of``.
2. **read** -- full mode, reduced on the driver (no bodies; an incremental run from its resume offset):
   ``jobs.read.full``, ONE Spark job whose tasks send the driver Arrow (records, op bodies, findings,
   transaction queues, statetable, redolog, consumer offsets), with the store's DataFrames never built
   (``store_frames.LazyStoreFrames``).  Otherwise
   the transaction-relevant CommitLog records are persisted (``MEMORY_AND_DISK``) once, together
   with the small side inputs (consume queues, statetable, redolog, consumer offsets, decoder anomalies) and
   the op message bodies, so the reconstruction's many uses of them do not re-read the store.  ``full`` mode
   keeps only the records the reconstruction looks at (half / op / discard topics, non-``NOT`` transaction
   types) and magic-V2 records (profile evidence); every other record is dropped right after decoding.  The
   oldest retained CommitLog offset comes from the store listing (``layout_info``), not from the records. Op
   bodies are fetched by position (``store_frames.fetch_records`` with bodies) for the op records found, so
   the store is never decoded with every body just to read the ops.
3. **reconstruct** -- ``jobs.reconstruct.spark.reconstruct``: on the driver when the records read are few (the
   outputs come back as Arrow tables and are counted and written from the driver, without Spark jobs), else
   distributed on the executors (linking as Spark joins, the rules per partition of transactions; the
   transactions DataFrame is then persisted while the outputs are written); ``reconstruct.path`` forces a
   path (driver, broker = one task per broker, distributed), and ``audit_runs.config_json`` records the path
   taken and its reduce tasks (``"reconstruct": {"path", "reduce_tasks"}``).
4. **aggregate** -- counts per state / flag / broker (small ``groupBy`` results, the only things collected).
5. **write** -- one Delta table per output through ``jobs.delta.sink.write_table`` (one commit per table, the
   run's previous rows replaced): ``transactions``, ``check_back_worklist``, ``recovery_worklist``,
   ``audit_anomalies``, ``profiles`` (table names from ``table.<logical>`` in the config; ``profiles`` only
   when configured), ``message_bodies`` when bodies were asked for, and finally ``audit_runs`` (one row per
   run). Partitioning: ``run_date``, ``broker`` (+ ``run_id``, which the sink always adds); ``audit_runs`` by
   ``run_date`` (+ ``run_id``).

Idempotence and interruption: the run id (default: derived from ``--as-of``) is the unit of replacement.  Each
table write is atomic (``delta_sink``); the tables are written one after the other and ``audit_runs`` last, so
a run killed half-way leaves every table readable -- tables written before the kill hold the new rows of the
run, the others still the old ones (or nothing) -- and no ``audit_runs`` row (or the previous one) for it.
Running the same stores with the same run id again rewrites every table and completes the run.

Shuffle partitions: when the user left ``spark.sql.shuffle.partitions`` at Spark's default (200), the run uses
4 per GiB of CommitLog (at least the default parallelism, at most 200) and restores the default afterwards:
the reconstruction shuffles only the transaction-relevant rows, and 200 mostly empty partitions per shuffle
dominate small runs.  An explicit setting (``--conf spark.sql.shuffle.partitions=N``) is kept.

Bodies: no reconstruction table has a body column.  ``--include-bodies`` makes the readers decode bodies and
adds the ``message_bodies`` table (one row per transaction: the body of its first half copy / prepared record,
else of its first COMMIT record, else of its discard record, as stored).  A run without bodies writes no body
rows (and clears those of its run id, if an earlier attempt of the same run wrote some).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict
from typing import Dict, List, Optional, Sequence, Tuple

import pyarrow as pa

from jobs.audit.bodies import bodies_frame
from jobs.audit.guard import kill_point
from jobs.audit.summary import AuditSummary, TableOutput, format_summary
from jobs.delta import sink as delta_sink
from jobs.delta.sink import RUNS_TABLE, named_table
from jobs.read.inputs import op_bodies_for, relevant_records

#: partition columns of every output but audit_runs (the sink appends run_id)
_TX_PARTS = ("run_date", "broker")
#: logical tables always written (their directory names: ``table.<logical>`` of the config)
REQUIRED_TABLES = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies")
BODIES_TABLE = "message_bodies"

#: reconstruction profile (jobs.reconstruct.spark.PROFILES) -> broker profile of conf/broker-defaults.json whose
#: values parametrise it.  4.3-4.5, 4.6-4.9 and 5.0 share the same check settings; 4.6-4.9 stands for them.
RECON_TO_CONFIG = {"3.x": "3.x", "4.0-4.2": "4.0-4.2", "4.3-5.0": "4.6-4.9", "5.1+": "5.1+",
                   "unknown": "4.6-4.9"}
#: broker profile (--profile / broker.profile) -> reconstruction profile it forces
CONFIG_TO_RECON = {"3.x": "3.x", "4.0-4.2": "4.0-4.2", "4.3-4.5": "4.3-5.0", "4.6-4.9": "4.3-5.0",
                   "5.0": "4.3-5.0", "5.1+": "5.1+"}


def _log(msg: str) -> None:
    print(f"txaudit: {msg}", file=sys.stderr, flush=True)


def epoch_ms(t: dt.datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(round(t.timestamp() * 1000))


# ------------------------------------------------------------------------------------------------------------
# driver-side helpers (no Spark)
# ------------------------------------------------------------------------------------------------------------

def store_fingerprint(store_pairs: Sequence[Tuple[str, str]]) -> Tuple[str, int, int]:
    """``(sha256 hex, files, bytes)`` over (broker, relative path, size, mtime ns) of every file under each
    store root, in a fixed order.  Listing and ``stat`` only: no file content is read."""
    h = hashlib.sha256()
    n_files = n_bytes = 0
    for broker, root in store_pairs:
        h.update(f"store\0{broker}\n".encode())
        for dirpath, dirs, files in os.walk(root, followlinks=False):
            dirs.sort()
            for name in sorted(files):
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                rel = os.path.relpath(path, root)
                h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
                n_files += 1
                n_bytes += st.st_size
    return h.hexdigest(), n_files, n_bytes


def store_file_rows(store_pairs: Sequence[Tuple[str, str]]) -> List[tuple]:
    """``schemas.repair.STORE_FILES`` rows: the per-file fingerprint (txlog_io.fingerprint) of every store."""
    from txlog_io.fingerprint import store_prints

    return [(broker, fp.file, fp.size, fp.mtime_ns, fp.edge_sha256)
            for broker, root in store_pairs for fp in store_prints(root).values()]


def audit_params(config, profile: str, as_of_ms: int):
    """-> (params for ``reconstruct``, profile_override, JSON-able description).

    ``profile`` "auto": one AuditParams per reconstruction profile (the broker's detected profile picks),
    built from the matching broker profile of the config (RECON_TO_CONFIG) with the user's overrides.  A named
    profile: that profile's values for every broker and the matching reconstruction profile forced."""
    from jobs.reconstruct.spark import PROFILES, AuditParams

    def from_config(recon: str, name: str) -> "AuditParams":
        bp = config.profile(name)                 # overrides (broker.<key>) applied
        base = AuditParams.for_profile(recon)
        return AuditParams(
            transactionTimeOut=int(bp.transaction_timeout_ms if bp.transaction_timeout_ms is not None
                                   else base.transactionTimeOut),
            transactionCheckMax=bp.transaction_check_max,
            transactionCheckInterval=bp.transaction_check_interval_ms,
            fileReservedTime=int(bp.file_reserved_time_hours),
            as_of_ms=int(as_of_ms))

    if profile == "auto":
        params = {recon: from_config(recon, RECON_TO_CONFIG[recon]) for recon in PROFILES}
        doc = {recon: dict(asdict(p), broker_profile=RECON_TO_CONFIG[recon]) for recon, p in params.items()}
        return params, None, doc
    if profile not in CONFIG_TO_RECON:
        from jobs.config import ConfigError

        raise ConfigError(f"unknown broker profile {profile!r} (known: {', '.join(CONFIG_TO_RECON)})")
    recon = CONFIG_TO_RECON[profile]
    p = from_config(recon, profile)
    return p, recon, {recon: dict(asdict(p), broker_profile=profile)}


def config_document(options, params_doc: dict, override: Optional[str]) -> dict:
    cfg = options.config
    return {
        "mode": options.mode,
        "split_bytes": cfg.split_bytes,
        "include_bodies": bool(options.include_bodies),
        "broker_profile": options.profile,
        "profile_override": override,
        "delta_writer": cfg.delta_writer,
        "tables": dict(cfg.tables),
        "broker_overrides": {k: v for k, v in cfg.broker_overrides},
        "params": params_doc,
        "conf_file": options.conf_file,
        "config_sources": list(cfg.sources),
    }


@contextlib.contextmanager
def _phase(phases: Dict[str, float], name: str, spark=None):
    if spark is not None:
        with contextlib.suppress(Exception):
            spark.sparkContext.setJobDescription(f"txaudit {name}")
    t0 = time.monotonic()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + (time.monotonic() - t0)


# ------------------------------------------------------------------------------------------------------------
# Spark side
# ------------------------------------------------------------------------------------------------------------

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
MAX_AUTO_SHUFFLE_PARTITIONS = 200


def auto_shuffle_partitions(spark, commitlog_bytes: int) -> Optional[int]:
    """Shuffle partitions for this run when the user left ``spark.sql.shuffle.partitions`` at Spark's default
    (None = the user chose a value; keep it).

    The reconstruction shuffles only transaction-relevant rows (a small fraction of the CommitLog) through
    many joins and aggregations; with Spark's default of 200 partitions per shuffle, a small store spends most
    of its time scheduling empty tasks (the demo: ~90 s of 230 s).  Chosen: 4 per GiB of CommitLog, at least
    the default parallelism (cores), at most 200."""
    try:
        explicit = spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS)
        current = spark.conf.get(SHUFFLE_PARTITIONS)
    except Exception:  # noqa: BLE001 - e.g. Spark Connect: leave the session alone
        return None
    if explicit or str(current) != "200":
        return None
    cores = int(getattr(spark.sparkContext, "defaultParallelism", 2) or 2)
    gib = -(-int(commitlog_bytes) // (1 << 30))
    return int(min(MAX_AUTO_SHUFFLE_PARTITIONS, max(cores, 4 * gib, 1)))


def _reconstruct_path(options) -> str:
    """The ``reconstruct.path`` setting (``auto`` when the options carry no config)."""
    return getattr(getattr(options, "config", None), "reconstruct_path", "auto")


def _reconstruct(inputs: dict, params, override, n_rows: int, phases: Dict[str, float], path: str = "auto"):
    """``jobs.reconstruct.spark.reconstruct``: with ``path`` auto, on the driver when the transaction-relevant
    rows are at most ``LOCAL_MAX_ROWS`` (``n_rows``; with the transaction queue units and findings, a few
    hundred MB of Arrow at most), else distributed (linking as Spark joins, the rules per partition of
    transactions) with the outputs materialized once; another ``path`` forces it.  Below the bound the driver
    skips the shuffles, the checkpoint and the executor-side writes: a 4 GiB store with 28,887 transactions
    (idle machine, warm) spent 7.1 s reducing on the executors at the former bound of LOCAL_MAX_ROWS // 4."""
    from jobs.reconstruct.spark import LOCAL_MAX_ROWS, reconstruct

    if path == "auto":
        path = "driver" if n_rows <= LOCAL_MAX_ROWS else "distributed"
    return reconstruct(inputs, params, override, materialize=True, path=path, timings=phases)


def _local_read_applies(options) -> bool:
    """Full or indexed mode, no bodies (the ``message_bodies`` join reads the records frame), distinct brokers
    (DLedger replicas of one group are collapsed by the DataFrame plan).  Incremental runs in full mode too
    (from the resume offset, the carried rows merged: jobs.read.incremental.read.read_local); an indexed
    incremental run falls back (MODE_UNSUPPORTED) through the DataFrame plan."""
    incremental = getattr(options, "incremental", False)
    return (not options.include_bodies and len(set(options.brokers)) == len(options.brokers)
            and _reconstruct_path(options) in ("auto", "driver")
            and (options.mode == "full" or (options.mode == "indexed" and not incremental)))


def _read_local(spark, options, incremental, phases: Dict[str, float]):
    """``jobs.read.full.read_local`` (``jobs.read.incremental.read.read_local`` for an incremental run) when
    :func:`_local_read_applies`, else None (also when the rows are too many for the driver: the DataFrame
    plan then reads and reduces on the executors)."""
    if not _local_read_applies(options):
        return None
    from jobs.read.full import read_local
    from jobs.reconstruct.spark import LOCAL_MAX_ROWS

    with _phase(phases, "read.records"):
        if incremental is not None:
            from jobs.audit.state import start_state_write
            from jobs.read.incremental.read import read_local as read_incremental

            read = read_incremental(spark, incremental, options, LOCAL_MAX_ROWS, phases)
            if incremental.fresh is not None:       # this run's rows are all on the driver: write its state
                start_state_write(spark, incremental, options)      # while the reducer runs
            return read
        if options.mode == "indexed":       # the same shape for indexed mode (jobs/read/indexed/read.py)
            from jobs.read.indexed.read import read_indexed_local

            return read_indexed_local(spark, options, LOCAL_MAX_ROWS, phases)
        return read_local(spark, options, LOCAL_MAX_ROWS, phases)


def _aggregates_arrow(arrow):
    """_aggregates from the reconstruction's Arrow outputs (no Spark job)."""
    import pyarrow.compute as pc

    states_by_broker: Dict[str, Dict[str, int]] = {}
    states_total: Dict[str, int] = {}
    flag_counts: Dict[str, int] = {}
    tx = arrow["transactions"]
    # Arrow kernels, not a Python loop over every transaction (0.13-0.18 s at 57k); the groups come in the
    # order of their first row, so every dict keeps the order the loop gave
    by = tx.select(["broker", "state"]).group_by(["broker", "state"], use_threads=False).aggregate(
        [([], "count_all")])
    for b, s, n in zip(*(by.column(c).to_pylist() for c in ("broker", "state", "count_all"))):
        states_by_broker.setdefault(b, {})[s] = n
        states_total[s] = states_total.get(s, 0) + n
    if tx.num_rows:
        counted = pc.value_counts(pc.list_flatten(tx.column("flags")))
        flag_counts.update(zip(counted.field("values").to_pylist(), counted.field("counts").to_pylist()))
    pr = arrow["profiles"]
    profiles = dict(zip(pr.column("broker").to_pylist(), pr.column("profile").to_pylist()))
    detected = dict(zip(pr.column("broker").to_pylist(), pr.column("detected_profile").to_pylist()))
    return states_total, states_by_broker, flag_counts, profiles, detected


def _aggregates(result):
    """One small action: per (broker, state) counts, per flag counts and the profile rows."""
    from pyspark.sql import functions as F

    c = F.col
    tx = result.transactions
    states = tx.groupBy("broker", "state").agg(F.count(F.lit(1)).alias("n")).select(
        F.lit("state").alias("kind"), "broker", c("state").alias("key"),
        F.lit(None).cast("string").alias("value"), "n")
    flags = tx.select(F.explode("flags").alias("flag")).groupBy("flag").agg(
        F.count(F.lit(1)).alias("n")).select(
        F.lit("flag").alias("kind"), F.lit(None).cast("string").alias("broker"), c("flag").alias("key"),
        F.lit(None).cast("string").alias("value"), "n")
    profs = result.profiles.select(F.lit("profile").alias("kind"), "broker", c("profile").alias("key"),
                                   c("detected_profile").alias("value"), F.lit(0).cast("long").alias("n"))
    states_by_broker: Dict[str, Dict[str, int]] = {}
    states_total: Dict[str, int] = {}
    flag_counts: Dict[str, int] = {}
    profiles: Dict[str, str] = {}
    detected: Dict[str, str] = {}
    for r in states.unionByName(flags).unionByName(profs).collect():
        if r["kind"] == "state":
            states_by_broker.setdefault(r["broker"], {})[r["key"]] = int(r["n"])
            states_total[r["key"]] = states_total.get(r["key"], 0) + int(r["n"])
        elif r["kind"] == "flag":
            flag_counts[r["key"]] = int(r["n"])
        else:
            profiles[r["broker"]] = r["key"]
            detected[r["broker"]] = r["value"]
    return states_total, states_by_broker, flag_counts, profiles, detected


def run_audit(spark, options, *, print_summary: bool = True, on_result=None) -> AuditSummary:
    """Audit ``options.stores`` as of ``options.as_of`` and write the outputs under ``options.out``; prints
    the summary (jobs.audit.summary) and returns it.  See the module docstring.

    ``on_result(result, summary)``: called after every table is written, while the reconstruction's frames
    (``jobs.reconstruct.spark.AuditResult``) are still persisted (tests compare them with the tables)."""
    from pyspark import StorageLevel

    from jobs.read.frames import LazyStoreFrames, load_store_frames
    from schemas.audit import AUDIT_ANOMALIES, CHECK_BACK, PROFILES, RECOVERY, TRANSACTIONS
    from schemas.repair import STORE_FILES
    from schemas.runs import AUDIT_RUNS, MESSAGE_BODIES

    started_at = dt.datetime.now(dt.timezone.utc)
    t_start = time.monotonic()
    phases: Dict[str, float] = {}
    cfg = options.config
    as_of_ms = epoch_ms(options.as_of)
    run_date = options.as_of.astimezone(dt.timezone.utc).date()
    writer = delta_sink.choose_writer(spark, cfg.delta_writer)
    names = cfg.table_names
    persisted: List = []
    restore_shuffle = False

    def persist(df):
        if df is None:
            return None
        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        persisted.append(df)
        return df

    incremental = None
    try:
        with _phase(phases, "plan", spark):
            fingerprint, store_files, store_bytes = store_fingerprint(options.store_pairs)
            file_prints = store_file_rows(options.store_pairs)     # the repair refuses a changed store
            # the one-job read needs only the store listing: the DataFrames are built if it falls back
            frames = (LazyStoreFrames if _local_read_applies(options) else load_store_frames)(
                spark, list(options.stores), mode=options.mode, brokers=list(options.brokers),
                include_bodies=options.include_bodies, split_bytes=cfg.split_bytes)
            params, override, params_doc = audit_params(cfg, options.profile, as_of_ms)
            if getattr(options, "incremental", False):
                from jobs.read.incremental.plan import plan_incremental

                incremental = plan_incremental(options, frames.layout_info,
                                               config_document(options, params_doc, override))
            commitlog_bytes = sum(s.commitlog_bytes for s in frames.layout_info)
            # indexed mode shuffles only what it fetched (transactions' records): partitions as for no CommitLog
            shuffle_partitions = auto_shuffle_partitions(spark, commitlog_bytes if options.mode == "full" else 0)
            if shuffle_partitions is not None:
                spark.conf.set(SHUFFLE_PARTITIONS, str(shuffle_partitions))
                restore_shuffle = True
        _log(f"run {options.run_id}: {len(options.stores)} store(s), "
             f"{commitlog_bytes / (1 << 20):.1f} MiB of CommitLog, mode {options.mode}, "
             f"as of {options.as_of.isoformat()}")

        with _phase(phases, "read", spark):
            # full mode reduced on the driver: one job, Arrow straight to the driver (jobs/read/full.py)
            local_read = _read_local(spark, options, incremental, phases)
            if local_read is not None:
                records = op_bodies = scan_findings = None      # incremental: the state is plan.fresh
                n_records, n_anomalies = local_read.commitlog.num_rows, local_read.anomalies.num_rows
            else:
                side = {name: persist(getattr(frames, name))
                        for name in ("statetable", "redolog", "consumer_offsets")}
                # the reconstruction reads only the half / op / discard queues: caching every topic's units
                # (millions of rows on a busy broker) cost more than the whole indexed read
                queues = frames.transaction_queues
                side["consumequeue"] = persist(queues if queues is not None else frames.consumequeue)
                if incremental is None:
                    persist(getattr(frames, "scan", None))  # one CommitLog pass feeds records and findings
                    records = persist(relevant_records(frames))
                    op_bodies, anomalies = None, frames.anomalies
                else:   # the carried evidence + the CommitLog from the resume offset (jobs/read/incremental/plan.py)
                    from jobs.read.incremental.read import evidence

                    records, op_bodies, anomalies, scan_findings = evidence(spark, incremental, frames,
                                                                            options, persist)
                    records = persist(records)
                with _phase(phases, "read.records"):
                    n_records = records.count()
                if incremental is not None:     # rows carried as Arrow from the previous run's state
                    from jobs.read.incremental.read import carried_rows
                    from jobs.reconstruct.local import carried_input

                    n_records += carried_rows(incremental, "records")
                op_bodies = persist(op_bodies if incremental is not None
                                    else op_bodies_for(spark, records, frames, options))
                anomalies = persist(anomalies)
                with _phase(phases, "read.anomalies"):
                    n_anomalies = anomalies.count()
                if incremental is not None:
                    n_anomalies += carried_rows(incremental, "findings")
        _log(f"read {n_records} transaction-relevant records and {n_anomalies} decoder findings "
             f"({phases['read']:.1f} s)")

        with _phase(phases, "reconstruct", spark):
            if local_read is not None:
                from jobs.reconstruct.local import reduce_local
                from jobs.reconstruct.spark import AuditResult

                outs = reduce_local(local_read, frames.layout_info, params, override, phases)
                result = AuditResult(arrow=outs, spark=spark)
            else:
                inputs = dict(side, commitlog=records, anomalies=anomalies, layout_info=frames.layout_info)
                if op_bodies is not None:
                    inputs["op_bodies"] = op_bodies
                if incremental is not None:
                    inputs["carried"] = carried_input(incremental)
                result = _reconstruct(inputs, params, override, n_records + n_anomalies, phases,
                                      _reconstruct_path(options))
            arrow = result.arrow                          # None: reduced on the executors
            # Arrow outputs stay Arrow: a DataFrame of them (createDataFrame, ~0.3 s each on the 8 GiB bench)
            # only for the bodies join
            transactions = None if arrow else persist(result.transactions)
            findings = None if arrow else persist(result.anomalies)

        with _phase(phases, "aggregate", spark):
            states, states_by_broker, flags, profiles, detected = (_aggregates_arrow(arrow) if arrow
                                                                   else _aggregates(result))
            n_tx = sum(states.values())
        _log(f"reconstructed {n_tx} transactions ({phases['reconstruct'] + phases['aggregate']:.1f} s)")

        # outputs reduced on the driver are written from there (delta_sink's Arrow path: no Spark job)
        outputs = [("transactions", arrow["transactions"] if arrow else transactions, TRANSACTIONS),
                   ("check_back_worklist", arrow["check_back"] if arrow else result.check_back, CHECK_BACK),
                   ("recovery_worklist", arrow["recovery"] if arrow else result.recovery, RECOVERY),
                   ("audit_anomalies", arrow["anomalies"] if arrow else findings, AUDIT_ANOMALIES)]
        if "profiles" in names:
            outputs.append(("profiles", arrow["profiles"] if arrow else result.profiles, PROFILES))
        prints = pa.Table.from_pylist([dict(zip(STORE_FILES.names, r)) for r in file_prints],
                                      schema=STORE_FILES.arrow_schema())      # driver-side write
        outputs.append((STORE_FILES.name, prints, STORE_FILES))
        if options.include_bodies:
            outputs.append((BODIES_TABLE, bodies_frame(result.transactions if arrow else transactions, records),
                            MESSAGE_BODIES))
        elif os.path.isdir(os.path.join(options.out, names.get(BODIES_TABLE, BODIES_TABLE), "_delta_log")):
            # clear the body rows an earlier attempt of this run id may have written
            outputs.append((BODIES_TABLE, MESSAGE_BODIES.arrow_schema().empty_table(), MESSAGE_BODIES))

        tables: Dict[str, TableOutput] = {}
        with _phase(phases, "write", spark):
            # a rerun of this run id killed below must not leave the earlier attempt's COMPLETE row behind
            delta_sink.retract_run(options.out, named_table(AUDIT_RUNS, names.get(RUNS_TABLE, RUNS_TABLE)),
                                   options.run_id)
            kill_point("retracted")
            for logical, df, schema in outputs:
                name = cfg.table(logical) if logical in REQUIRED_TABLES else names.get(logical, logical)
                with _phase(phases, f"write.{logical}", spark):
                    wr = delta_sink.write_table(df, options.out, named_table(schema, name), options.run_id,
                                                list(_TX_PARTS), spark, run_date=run_date, writer=writer)
                tables[logical] = TableOutput(logical, wr.path, wr.rows, wr.files, wr.version, wr.seconds)
                _log(f"wrote {logical}: {wr.rows} rows, version {wr.version} ({wr.seconds:.1f} s)")
                kill_point(f"wrote.{logical}")
            if incremental is not None:
                from jobs.audit.state import write_state

                with _phase(phases, "write.audit_state", spark):
                    for wr in write_state(spark, incremental, options, records, op_bodies, scan_findings,
                                          frames.layout_info, run_date, writer, local=arrow is not None):
                        name = os.path.basename(wr.path)
                        tables[name] = TableOutput(name, wr.path, wr.rows, wr.files, wr.version, wr.seconds)

        finished_at = dt.datetime.now(dt.timezone.utc)
        elapsed = time.monotonic() - t_start
        runs_name = names.get(RUNS_TABLE, RUNS_TABLE)
        table_paths = {k: t.path for k, t in tables.items()}
        table_paths[RUNS_TABLE] = delta_sink.table_path(options.out, named_table(AUDIT_RUNS, runs_name))
        row = {
            "run_id": options.run_id, "run_date": run_date,
            "as_of": options.as_of.astimezone(dt.timezone.utc), "as_of_ms": as_of_ms,
            "started_at": started_at, "finished_at": finished_at,
            "elapsed_s": float(elapsed), "status": "COMPLETE", "mode": options.mode,
            "brokers": list(options.brokers), "stores": list(options.stores), "profiles": profiles,
            "detected_profiles": detected, "include_bodies": bool(options.include_bodies),
            "config_json": json.dumps(dict(config_document(options, params_doc, override),
                                           shuffle_partitions=int(spark.conf.get(SHUFFLE_PARTITIONS)),
                                           reconstruct={"path": result.path,
                                                        "reduce_tasks": result.reduce_tasks},
                                           commitlog_files=commitlog_files(frames.layout_info),
                                           **({"incremental": incremental.describe()}
                                              if incremental else {})),
                                      sort_keys=True, default=str),
            "store_fingerprint": fingerprint, "store_files": store_files, "store_bytes": store_bytes,
            "commitlog_bytes": commitlog_bytes, "transactions": n_tx, "state_counts": states,
            "flag_counts": flags, "table_rows": {k: t.rows for k, t in tables.items()},
            "table_paths": table_paths, "phase_seconds": {k: float(v) for k, v in phases.items()},
            "writer": writer, "spark_version": spark.version, "out": options.out,
        }
        kill_point("before.audit_runs")
        runs_df = pa.Table.from_pylist([row], schema=AUDIT_RUNS.arrow_schema())   # driver-side write
        wr = delta_sink.write_table(runs_df, options.out, named_table(AUDIT_RUNS, runs_name), options.run_id,
                                    ["run_date"], spark, run_date=run_date, writer=writer)
        tables[RUNS_TABLE] = TableOutput(RUNS_TABLE, wr.path, wr.rows, wr.files, wr.version, wr.seconds)
        if incremental is not None:
            from jobs.audit.state import retire_previous

            retire_previous(incremental)        # the previous run's state: superseded by this one

        summary = AuditSummary(
            run_id=options.run_id, as_of=options.as_of, out=options.out, mode=options.mode,
            brokers=tuple(options.brokers), stores=tuple(options.stores), profiles=profiles,
            detected_profiles=detected, transactions=n_tx, states=states, states_by_broker=states_by_broker,
            flags=flags, tables=tables, phases=phases, elapsed_s=time.monotonic() - t_start, writer=writer,
            store_fingerprint=fingerprint, include_bodies=bool(options.include_bodies), started_at=started_at,
            finished_at=finished_at, store_bytes=store_bytes, commitlog_bytes=commitlog_bytes,
            extra=dict({"records": n_records, "decoder_findings": n_anomalies},
                       **({"incremental": incremental.describe()} if incremental else {})))
        if on_result is not None:
            on_result(result, summary)
    finally:
        if incremental is not None and incremental.early_state is not None:
            # a state write started while the reducer ran (jobs.read.incremental.read) ends before the caller
            # releases the output lock, also when the run failed: no thread writes under --out after it
            with contextlib.suppress(Exception):
                incremental.early_state.result()
        for df in persisted:
            with contextlib.suppress(Exception):
                df.unpersist()
        with contextlib.suppress(Exception):
            spark.sparkContext.setJobDescription(None)
        if restore_shuffle:
            with contextlib.suppress(Exception):
                spark.conf.unset(SHUFFLE_PARTITIONS)

    if print_summary:
        print(format_summary(summary), flush=True)
    if getattr(options, "report", True):
        write_run_report(options.out, options.run_id)
    return summary


def commitlog_files(layout_info) -> Dict[str, list]:
    """broker -> [[base offset, size], ...] of its CommitLog files (kept in config_json: the report's store
    map needs the file boundaries, and the report reads no store)."""
    return {s.broker: [[int(base), int(size)] for _, base, size in s.commitlog_files] for s in layout_info}


def write_run_report(out: str, run_id: str) -> Optional[str]:
    """The run's HTML report (jobs.report.write); a report that fails is a warning, never a failed audit."""
    try:
        from jobs.report.write import write_report

        page = write_report(out, run_id)
    except Exception as e:  # noqa: BLE001 - the tables are written; the report is a view of them
        first = (str(e).strip().splitlines() or [""])[0]
        _log(f"warning: report not written: {type(e).__name__}: {first}")
        return None
    _log(f"report: {page}")
    return page


__all__ = ["run_audit", "write_run_report", "commitlog_files", "store_fingerprint", "audit_params",
           "relevant_records", "op_bodies_for", "bodies_frame", "named_table", "epoch_ms", "RECON_TO_CONFIG",
           "CONFIG_TO_RECON", "AuditSummary"]
