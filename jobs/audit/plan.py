"""The plan of an audit run: :func:`plan_audit` turns the validated options into an :class:`AuditPlan`.

Driver only, before anything is read: the store listing and fingerprints (``stat`` only), the thresholds per
profile (``conf/broker-defaults.json`` + the user's ``broker.<key>`` overrides, ``as_of_ms`` = ``--as-of``),
the read spec (:class:`jobs.read.spec.ReadSpec`), whether the one-job read applies, the incremental
continuation, the Delta writer and the run's shuffle partitions.  The stages after it
(``jobs.audit.run``) take what they need from the plan, never the options.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import weakref
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from jobs.read.spec import ReadSpec
from txlog_io.storefs import walk_files

#: logical tables always written (their directory names: ``table.<logical>`` of the config)
REQUIRED_TABLES = ("transactions", "check_back_worklist", "recovery_worklist", "audit_anomalies")

#: reconstruction profile (jobs.reconstruct.spark.PROFILES) -> broker profile of conf/broker-defaults.json whose
#: values parametrise it.  4.3-4.5, 4.6-4.9 and 5.0 share the same check settings; 4.6-4.9 stands for them.
RECON_TO_CONFIG = {"3.x": "3.x", "4.0-4.2": "4.0-4.2", "4.3-5.0": "4.6-4.9", "5.1+": "5.1+",
                   "unknown": "4.6-4.9"}
#: broker profile (--profile / broker.profile) -> reconstruction profile it forces
CONFIG_TO_RECON = {"3.x": "3.x", "4.0-4.2": "4.0-4.2", "4.3-4.5": "4.3-5.0", "4.6-4.9": "4.3-5.0",
                   "5.0": "4.3-5.0", "5.1+": "5.1+"}


def epoch_ms(t: dt.datetime) -> int:
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return int(round(t.timestamp() * 1000))


def store_fingerprint(store_pairs: Sequence[Tuple[str, str]]) -> Tuple[str, int, int]:
    """``(sha256 hex, files, bytes)`` over (broker, relative path, size, mtime ns) of every file under each
    store root, in a fixed order.  Listing and ``stat`` only: no file content is read."""
    h = hashlib.sha256()
    n_files = n_bytes = 0
    for broker, root in store_pairs:
        h.update(f"store\0{broker}\n".encode())
        for rel, _, size, mtime_ns in walk_files(root):      # os.walk + lstat, or a bucket's listing
            h.update(f"{rel}\0{size}\0{mtime_ns}\n".encode("utf-8", "surrogateescape"))
            n_files += 1
            n_bytes += size
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


SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
MAX_AUTO_SHUFFLE_PARTITIONS = 200


_STARTED_WITH: "weakref.WeakKeyDictionary[Any, Dict[str, bool]]" = weakref.WeakKeyDictionary()


def _set_at_start(sc, key: str) -> bool:
    """Whether the SparkContext was started with ``key`` set.  A context's SparkConf is fixed once it runs,
    and ``getConf()`` copies every entry through the gateway (about a hundred calls), so it is asked once
    per context."""
    known = _STARTED_WITH.setdefault(sc, {})
    if key not in known:
        known[key] = bool(sc.getConf().contains(key))
    return known[key]


def auto_shuffle_partitions(spark, commitlog_bytes: int) -> Optional[int]:
    """Shuffle partitions for this run when the user left ``spark.sql.shuffle.partitions`` at Spark's default
    (None = the user chose a value; keep it).

    The reconstruction shuffles only transaction-relevant rows (a small fraction of the CommitLog) through
    many joins and aggregations; with Spark's default of 200 partitions per shuffle, a small store spends most
    of its time scheduling empty tasks (the demo: ~90 s of 230 s).  Chosen: 4 per GiB of CommitLog, at least
    the default parallelism (cores), at most 200."""
    try:
        explicit = _set_at_start(spark.sparkContext, SHUFFLE_PARTITIONS)
        current = spark.conf.get(SHUFFLE_PARTITIONS)
    except Exception:  # noqa: BLE001 - e.g. Spark Connect: leave the session alone
        return None
    if explicit or str(current) != "200":
        return None
    cores = int(getattr(spark.sparkContext, "defaultParallelism", 2) or 2)
    gib = -(-int(commitlog_bytes) // (1 << 30))
    return int(min(MAX_AUTO_SHUFFLE_PARTITIONS, max(cores, 4 * gib, 1)))



@dataclass
class AuditPlan:
    """Everything the read, reconstruct and write stages of one run need, decided once on the driver."""

    spec: ReadSpec                  # what the read plans need (stores, brokers, mode, bodies, split)
    run_id: str
    as_of: dt.datetime
    as_of_ms: int
    run_date: dt.date
    out: str
    profile: str                    # --profile as given ("auto" or a broker profile)
    params: Any                     # AuditParams per reconstruction profile, or one (see audit_params)
    override: Optional[str]         # the reconstruction profile forced, if any
    config_doc: dict                # config_document: what audit_runs.config_json records
    table_names: Dict[str, str]     # logical name -> directory name under ``out``
    required_tables: Dict[str, str]  # the always-written tables' directory names
    writer: str                     # Delta writer chosen for the session ("delta-rs" or "spark")
    reconstruct_path: str           # reconstruct.path: auto, driver, broker or distributed
    frames: Any                     # StoreFrames, or LazyStoreFrames when the one-job read applies
    local_read: bool                # the one-job read (Arrow to the driver) is tried first
    incremental: Any = None         # jobs.read.incremental.plan.Plan of an --incremental run
    fingerprint: str = ""
    store_files: int = 0
    store_bytes: int = 0
    file_prints: List[tuple] = None  # type: ignore[assignment]  # STORE_FILES rows
    commitlog_bytes: int = 0
    restore_shuffle: bool = False   # the run set spark.sql.shuffle.partitions and unsets it at its end

    @property
    def layout_info(self) -> tuple:
        return self.frames.layout_info


def local_read_applies(spec: ReadSpec, incremental: bool, reconstruct_path: str = "auto") -> bool:
    """Full or indexed mode, no bodies (the ``message_bodies`` join reads the records frame), distinct brokers
    (DLedger replicas of one group are collapsed by the DataFrame plan).  Incremental runs in full mode too
    (from the resume offset, the carried rows merged: jobs.read.incremental.read.read_local); an indexed
    incremental run falls back (MODE_UNSUPPORTED) through the DataFrame plan.  A forced ``reconstruct.path``
    other than the driver's reads through the DataFrame plan."""
    return (not spec.include_bodies and len(set(spec.brokers)) == len(spec.brokers)
            and reconstruct_path in ("auto", "driver")
            and (spec.mode == "full" or (spec.mode == "indexed" and not incremental)))


def quick_start(options) -> bool:
    """Whether an audit of ``options`` (``AuditOptions``) is expected to reduce on the driver, so that its JVM
    mostly starts up and runs a few small jobs (``jobs.session.QUICK_JIT``): the one-job read applies
    (:func:`local_read_applies`), every store is a local directory, and the stores' transaction queues hold at
    most ``LOCAL_MAX_ROWS`` units (``jobs.read.full.above_bound``, the read's own test: a lower bound of the
    transaction-relevant records from a few positional reads; a 3.x store, without transaction queues, counts
    as small there too).  It only chooses the driver JVM's compiler: a wrong guess costs time, never a row, and
    a guess that cannot be made (an unreadable store, options it cannot read) is False -- the run itself then
    says what is wrong."""
    from jobs.read.full import above_bound
    from jobs.reconstruct.spark import LOCAL_MAX_ROWS
    from txlog_io.storefs import is_remote

    try:
        cfg = options.config
        spec = ReadSpec(stores=tuple(options.stores), brokers=tuple(options.brokers), mode=options.mode,
                        include_bodies=bool(options.include_bodies), split_bytes=int(cfg.split_bytes))
        if not local_read_applies(spec, bool(getattr(options, "incremental", False)),
                                  getattr(cfg, "reconstruct_path", "auto")):
            return False
        if any(is_remote(s) for s in spec.stores):
            return False
        return not above_bound(spec, LOCAL_MAX_ROWS)
    except Exception:  # noqa: BLE001 - an optimisation never fails the command
        return False


def plan_audit(spark, options, reopened: Optional[str] = None) -> AuditPlan:
    """The plan of a run of ``options`` (a validated ``jobs.cli_options.AuditOptions``).  ``reopened``: why
    the incremental run is being done again as a full audit (jobs.read.incremental.plan, FINAL_REOPENED)."""
    from jobs.delta import sink as delta_sink
    from jobs.read.frames import LazyStoreFrames, load_store_frames
    from jobs.session import driver_jit

    cfg = options.config
    spec = ReadSpec(stores=tuple(options.stores), brokers=tuple(options.brokers), mode=options.mode,
                    include_bodies=bool(options.include_bodies), split_bytes=int(cfg.split_bytes))
    incremental = bool(getattr(options, "incremental", False))
    reconstruct_path = getattr(cfg, "reconstruct_path", "auto")
    local = local_read_applies(spec, incremental, reconstruct_path)
    as_of_ms = epoch_ms(options.as_of)
    fingerprint, store_files, store_bytes = store_fingerprint(options.store_pairs)
    file_prints = store_file_rows(options.store_pairs)     # the repair refuses a changed store
    # the one-job read needs only the store listing: the DataFrames are built if it falls back
    frames = (LazyStoreFrames if local else load_store_frames)(
        spark, list(spec.stores), mode=spec.mode, brokers=list(spec.brokers),
        include_bodies=spec.include_bodies, split_bytes=spec.split_bytes, columns="reducer")
    params, override, params_doc = audit_params(cfg, options.profile, as_of_ms)
    doc = config_document(options, params_doc, override)
    doc["driver_jit"] = driver_jit(spark)
    names = cfg.table_names
    plan = AuditPlan(
        spec=spec, run_id=options.run_id, as_of=options.as_of, as_of_ms=as_of_ms,
        run_date=options.as_of.astimezone(dt.timezone.utc).date(), out=options.out, profile=options.profile,
        params=params, override=override, config_doc=doc, table_names=dict(names),
        required_tables={t: cfg.table(t) for t in REQUIRED_TABLES},
        writer=delta_sink.choose_writer(spark, cfg.delta_writer), reconstruct_path=reconstruct_path,
        frames=frames, local_read=local,
        fingerprint=fingerprint, store_files=store_files, store_bytes=store_bytes, file_prints=file_prints,
        commitlog_bytes=sum(s.commitlog_bytes for s in frames.layout_info))
    if incremental:
        from jobs.delta.sink import RUNS_TABLE
        from jobs.read.incremental.plan import plan_incremental

        plan.incremental = plan_incremental(spec, plan.out, plan.run_id, names.get(RUNS_TABLE, RUNS_TABLE),
                                            frames.layout_info, doc,
                                            reopened=reopened)
    # indexed mode shuffles only what it fetched (transactions' records): partitions as for no CommitLog
    shuffle_partitions = auto_shuffle_partitions(spark, plan.commitlog_bytes if spec.mode == "full" else 0)
    if shuffle_partitions is not None:
        spark.conf.set(SHUFFLE_PARTITIONS, str(shuffle_partitions))
        plan.restore_shuffle = True
    return plan


__all__ = ["AuditPlan", "plan_audit", "local_read_applies", "quick_start", "store_fingerprint", "store_file_rows",
           "audit_params", "config_document", "auto_shuffle_partitions", "epoch_ms", "RECON_TO_CONFIG",
           "CONFIG_TO_RECON", "REQUIRED_TABLES", "SHUFFLE_PARTITIONS"]
