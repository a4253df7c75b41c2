"""The DataFrames of one or several broker stores, in one of two modes (pure functions; nothing is run).

``load_store_frames(spark, stores, mode=...)`` returns :class:`StoreFrames`: ``commitlog``, ``consumequeue``,
``statetable``, ``redolog``, ``consumer_offsets`` and ``anomalies`` DataFrames (schemas:
:mod:`schemas.sources`, ``broker`` first) plus ``layout_info`` (driver-side listing summary per store).  The
DataFrames are lazy; the driver work is listing the stores (directory listing and ``stat``) and, in indexed
mode, one small job that locates the index gaps (a few rows per store, see 4. below).  Nothing is cached: a
caller that uses a frame several times may ``.cache()`` it.

Modes
-----
``full``
    Every CommitLog byte is read, framed and checked ONCE: ``scan`` is ``rocketmq_txscan`` over byte ranges
    of ``split_bytes`` of every CommitLog file, and yields both the transaction-relevant records (transaction
    type not NOT, magic V2, or a half / op / discard topic: what the reconstruction reads, see
    ``txlog_io.commitlog_kernels.relevant``) and the CommitLog findings; ordinary records are counted and
    checked but never become rows.  ``commitlog`` is the record half of ``scan``; ``anomalies`` is its
    finding half plus ``rocketmq_anomalies`` of the other decoders (consume queues, statetable, redolog,
    consumerOffset.json, store discovery).  A caller that uses both should persist ``scan`` (the audit
    does), else each of them re-reads the CommitLog.  ``spark.read.format("rocketmq_commitlog")`` still
    gives every record.

``indexed`` (default)
    ``commitlog`` holds only the transaction-relevant records, fetched by position with
    ``txlog_io.commitlog.decode_at`` (``DataFrame.mapInArrow`` over a position DataFrame repartitioned by
    (broker, CommitLog file, ``split_bytes`` chunk) and sorted by offset, so each task reads nearby records of
    one file).  Exactly these records:

    1. every record indexed by the consume queues of ``RMQ_SYS_TRANS_HALF_TOPIC``,
       ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` and ``TRANS_CHECK_MAX_TIME_TOPIC`` (4.3+ half / op / discard records);
    2. every record at a CommitLog offset listed in the 3.x ``transaction/statetable`` or
       ``transaction/redolog`` (PREPARED records, and COMMIT / ROLLBACK records: 3.x PREPARED and ROLLBACK
       records have no consume-queue entry, the redolog is their only index);
    3. the COMMIT records of the 4.3+ transactions (they live in the real topic, with PREPARED_TRANSACTION_OFFSET
       back to the half): for a store with IndexFiles (``index/``), each half's ``REAL_TOPIC#UNIQ_KEY`` is
       looked up as RocketMQ's query by key does (``IndexService.buildIndex`` indexes NOT, PREPARED and
       COMMIT records under ``topic#UNIQ_KEY``; ``jobs.read.indexed.plan.IndexLookup``: a hash slot and its chain per
       key and file,
       positional reads, files ending before the half skipped), so ordinary messages are never touched; the
       CommitLog ranges no usable index file covers are scanned (``indexed_gaps.index_file_gaps``: a missing or
       unreadable index file, files lost after the checkpoint's indexMsgTimestamp, an index lagging after an
       unclean shutdown -- each an ``INDEX_INCOMPLETE`` finding -- and, without a finding, the few unkeyed
       records between two files and after the newest entry).  Stores without IndexFiles (indexing
       disabled), and the non-NOT records of (2), use the real topics' consume queues instead: every record
       of those queues whose transaction type is not ``NOT``, *probed* (``decode_at`` reads the 40 header
       bytes up to SYSFLAG and decodes only the non-NOT records);
    4. every transaction-relevant record (type not NOT, or a transaction system topic) in the CommitLog
       ranges the indexes may miss (``jobs.read.indexed.plan``): after the last indexed record (dispatch lag
       after a crash), before the first unit of a half / op / discard queue that does not start at unit 0
       (a queue deleted and rebuilt later), after the last unit of a queue the check service consumed past,
       after the last unit of an idle half / op / discard queue up to the dispatch point (a zeroed queue
       tail; only that queue's records are kept from there, ``jobs/read/indexed/tails.py``), and the whole
       CommitLog when a half queue exists but the op queue does not.  Each such range except the
       ordinary tail is an ``INDEX_INCOMPLETE`` anomaly naming the reason and the range, so the difference
       from ``full`` is reported, not silent.

    The gap ranges are scanned by the same one-pass reader as ``full`` mode (``scan``: records and findings
    of one pass).  A record reachable several ways is read once.  Not reachable in this mode: COMMIT-typed consumer-retry
    copies in ``SCHEDULE_TOPIC_XXXX`` / ``%RETRY%*`` (not transaction records; the broker keeps the sys_flag
    on retry), a record whose consume-queue unit was damaged to point elsewhere (its unit is a
    ``CQ_ENTRY_MISMATCH``), and orphans in the middle of a healthy-looking index (``full`` finds those).
    ``anomalies`` = ``rocketmq_anomalies`` without the CommitLog range scan, plus the anomalies ``decode_at``
    reports for the fetched positions (``CQ_ENTRY_MISMATCH`` when no record starts there, CRC findings, ...)
    and ``MISSING_FILE`` for an offset that falls in no CommitLog file (deleted by retention, or a bad index
    unit); records and findings come out of the same ``mapInArrow`` pass over the positions
    (``rocketmq_txscan`` rows, :func:`fetch_scan`), and ``scan`` is that pass united with the gap scan.

    A store with no transaction index at all -- no ``RMQ_SYS_TRANS_HALF_TOPIC`` consume queue, no 3.x
    statetable or redolog (:func:`has_transaction_index`) -- is scanned instead: its ``commitlog`` rows are
    the CommitLog scan's records whose transaction type is not NOT or whose topic is a transaction system
    topic, and its CommitLog range anomalies are included.  That is how a 4.0 - 4.2 store is read (its
    PREPARED / ROLLBACK records live in the real topic without any index; without the scan this mode would
    silently find none of its transactions), and a 5.x store with RocksDB consume queues; a 4.3+ store that
    never saw a transaction pays one scan to find nothing.

On a healthy store both modes give the same rows for the records listed above (tested on the real-broker
fixtures and on reference-broker stores of every profile).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence, Union

import pyarrow as pa

from jobs.read.indexed.gaps import (
    GAP_FILE_END,
    GAPS_SCHEMA,
    ORDINARY_GAPS,
    gap_findings,
    indexed_gap_rows,
    scan_cells,
    uses_index_files,
)
from jobs.read.indexed.plan import (
    DRIVER_FETCH_UNITS,
    GAP_HEAD,
    GAP_OP_QUEUE,
    GAP_TAIL,
    GAP_TAIL_UNITS,
    IndexedPlan,
    IndexLookup,
    driver_positions,
    plan_indexed,
)
from jobs.read.indexed.tails import idle_tail_findings, only_queue_records
from jobs.read.stores import (
    StoreInfo,
    commitlog_dirs,
    has_transaction_index,
    infos,
    missing_file_findings,
    scan_task_bytes,
)
from jobs.sources.formats import (
    ANOMALIES_FORMAT,
    COMMITLOG_FORMAT,
    CONSUMEQUEUE_FORMAT,
    CONSUMER_OFFSETS_FORMAT,
    REDOLOG_FORMAT,
    SIDE_SOURCES,
    STATETABLE_FORMAT,
    TX_SCAN_FORMAT,
    anomalies_batch,
    op_bodies_only,
    prepend_broker,
    register,
    tx_scan_rows,
)
from jobs.sources.options import DEFAULT_SPLIT_BYTES, OptionError, SourceOptions, parse_options
from schemas.recon import OP_BODY_COLUMNS
from schemas.sources import (
    ANOMALIES_SOURCE,
    ANOMALY_PREFIX,
    COMMITLOG_REDUCER,
    COMMITLOG_SOURCE,
    SOURCE_TABLES,
    TX_SCAN_ANOMALY,
    TX_SCAN_RECORD,
)
from schemas.store import COMMITLOG
from txlog_io.commitlog_layout import DISCARD_TOPIC, HALF_TOPIC, OP_TOPIC, TX_SYSTEM_TOPICS

MODES = ("indexed", "full")
FETCH_CHUNK = 16384         # positions per decode_at call (bounds the records copied at once)

_API = "load_store_frames"


@dataclass(frozen=True)
class StoreFrames:
    commitlog: object
    consumequeue: object
    statetable: object
    redolog: object
    consumer_offsets: object
    anomalies: object
    layout_info: tuple               # StoreInfo per store, in option order
    mode: str = "indexed"
    #: the consumequeue rows of the half / op / discard topics only (read with file pruning by topic): all the
    #: reconstruction needs of the consume queues (with layout_info for "the store has consume queues")
    transaction_queues: object = None
    #: the one-pass CommitLog scan (``rocketmq_txscan`` rows) ``commitlog`` and ``anomalies`` partly derive
    #: from (full mode; indexed mode: its gap scan); None when there is none.  Persist it to read once.
    scan: object = None
    #: ``commitlog`` (full mode without ``include_bodies``; COMMITLOG_REDUCER rows with ``columns="reducer"``)
    #: carries the op records' bodies (the scan keeps them): ``jobs.read.inputs`` takes them from there
    #: instead of fetching them by position, and nulls them in the records it hands the reduction
    op_bodies_in_records: bool = False
    #: indexed mode without ``include_bodies``: the op records' bodies (the reconstruction's ``op_bodies``
    #: input) as its fetch and gap scan read them -- ``commitlog``'s bodies are null, as a fetch without
    #: bodies gives them -- so they are not fetched again by position
    op_bodies: object = None
    #: indexed mode: broker -> how it was read (``jobs.read.indexed.plan.read_choices``: by index, or whole)
    read_choices: Optional[dict] = None


def load_store_frames(spark, stores: Union[str, Sequence[str]], mode: str = "indexed",
                      brokers: Optional[Union[str, Sequence[str]]] = None, include_bodies: bool = False,
                      split_bytes: int = DEFAULT_SPLIT_BYTES, commitlog_dirs: Optional[Sequence[str]] = None,
                      columns: str = "all") -> StoreFrames:
    """Lazy DataFrames of ``stores`` (one root or several); see the module docstring for the two modes.
    ``columns="reducer"`` (full mode): the scan (``rocketmq_txscan`` with ``columns=reducer``) and
    ``commitlog`` carry only the reducer's record columns, and the op records' bodies
    (``StoreFrames.op_bodies_in_records``): a record's properties map, hosts, ... never cross into the JVM."""
    if mode not in MODES:
        raise OptionError(_API, "mode", f"expected one of {', '.join(MODES)}, got {mode!r}")
    roots = [stores] if isinstance(stores, str) else list(stores)
    replica_findings: list = []
    if brokers is not None:
        names = brokers.split(",") if isinstance(brokers, str) else list(brokers)
        if len(names) == len(roots) and len(set(names)) < len(names):
            # one name for several DLedger stores: replicas of one group, audited once (the most committed)
            from txlog_io.dledger_store import collapse_replicas

            kept, replica_findings = collapse_replicas(list(zip(names, [str(r) for r in roots], strict=True)))
            roots, brokers = [r for _, r in kept], [b for b, _ in kept]
    base = {"paths": json.dumps([str(r) for r in roots]), "split_bytes": str(int(split_bytes))}
    if brokers is not None:
        base["brokers"] = brokers if isinstance(brokers, str) else ",".join(brokers)
    if commitlog_dirs:
        base["commitlog_dirs"] = ",".join(str(d) for d in commitlog_dirs)
    opts = parse_options(COMMITLOG_FORMAT, dict(base, include_bodies=str(bool(include_bodies)).lower()))
    register(spark)

    def read(fmt: str, **extra):
        return spark.read.format(fmt).options(**base, **extra).load()

    info = infos(opts)
    consumequeue = read(CONSUMEQUEUE_FORMAT)
    statetable = read(STATETABLE_FORMAT)
    redolog = read(REDOLOG_FORMAT)
    consumer_offsets = read(CONSUMER_OFFSETS_FORMAT)
    # the transaction queues alone (file pruning by topic): small, and read by several branches below
    tx_queues = read(CONSUMEQUEUE_FORMAT, topics=",".join(TX_SYSTEM_TOPICS))
    scan = None
    choices = op_bodies = None
    if mode == "full":
        scan = spark.read.format(TX_SCAN_FORMAT).options(**dict(
            base, include_bodies=str(bool(include_bodies)).lower(), columns=columns,
            task_bytes=str(scan_task_bytes(info, split_bytes, spark.sparkContext.defaultParallelism)))).load()
        commitlog, scan_findings = split_tx_scan(scan)
        anomalies = read(ANOMALIES_FORMAT, sources=SIDE_SOURCES) \
            .unionByName(scan_findings)
    else:
        # the fetched records and their findings come out of ONE pass (rocketmq_txscan rows, like the
        # gap scan's); ``scan`` is the union of both, which the audit persists so nothing is read twice
        indexed = [s for s in info if has_transaction_index(s) and s.commitlog_files]
        unindexed = [s for s in info if not has_transaction_index(s) and s.commitlog_files]
        def opts_for(fmt, **extra):
            return parse_options(fmt, dict(base, **extra))

        plan = plan_indexed(indexed, info, opts_for, tx_queues, statetable, redolog)
        choices = plan.choices
        if plan.units is not None and plan.units.num_rows <= DRIVER_FETCH_UNITS:
            # the driver holds the transaction queues' units already (the very rows the data source gives):
            # the reconstruction's copy comes from there instead of a second read by a Spark job.  Not above
            # DRIVER_FETCH_UNITS: the frame is a LocalRelation that every later plan carries and compares
            # (226k units, 42 MB: the distributed reconstruction took 167 s instead of 60 s), and a checkpoint
            # of it ships ~190 bytes per unit through the driver to save re-reading 20 bytes per unit
            tx_queues = spark.createDataFrame(plan.units, SOURCE_TABLES[CONSUMEQUEUE_FORMAT].spark_schema())
        decoders = read(ANOMALIES_FORMAT, sources=SIDE_SOURCES)
        gap_rows, idle_tails = indexed_gap_rows(plan, indexed, unindexed)
        # every indexed store read whole (plan.full_read): nothing to fetch by position, the gap scan is the read
        fetched = not (indexed and gap_rows and all(s.broker in plan.full_read for s in indexed))
        scan = indexed_commitlog(spark, consumequeue, statetable, redolog, info, opts, tx_queues=tx_queues,
                                 plan=plan, opts_for=opts_for) if fetched else None
        if gap_rows:
            gaps = spark.createDataFrame(gap_rows, GAPS_SCHEMA)
            scanned_stores = indexed + unindexed
            # a record both fetched and scanned (gaps overlap the indexed ranges) is the same decoded row, and
            # its findings the same rows: de-duplicated after the union (a join against the fetched positions
            # instead would recompute the whole fetch plan)
            # both come from the ONE union frame the audit persists (split before the union, each would
            # re-read the store in every action); an idle queue tail's range keeps only that queue's records
            gap_scan = only_queue_records(scan_cells(spark, gap_rows, scanned_stores, opts), gap_rows,
                                          TX_SYSTEM_TOPICS, (GAP_FILE_END,))
            scan = gap_scan if scan is None else scan.unionByName(gap_scan)
            scan = _damage_gap_commits(spark, scan, gap_rows, indexed, info, opts)
            commitlog, findings = split_tx_scan(scan)
            commitlog = commitlog.dropDuplicates(["broker", "physical_offset"])
            anomalies = decoders.unionByName(findings).distinct().unionByName(gap_findings(gaps))
            if idle_tails:
                anomalies = anomalies.unionByName(idle_tail_findings(spark, commitlog, idle_tails))
        else:
            commitlog, findings = split_tx_scan(scan)
            anomalies = decoders.unionByName(findings)
        if not include_bodies:      # the scan kept the op records' bodies: handed over apart, as fetched
            op_bodies = op_bodies_from_commitlog(commitlog)
            commitlog = without_bodies(commitlog)
    if replica_findings:
        rows = [anomalies_batch(b, [a]).to_pylist()[0] for b, a in replica_findings]
        schema = SOURCE_TABLES[ANOMALIES_FORMAT].spark_schema()
        extra = spark.createDataFrame([tuple(r[f.name] for f in schema) for r in rows], schema)
        anomalies = anomalies.unionByName(extra)
    return StoreFrames(commitlog=commitlog, consumequeue=consumequeue, statetable=statetable, redolog=redolog,
                       consumer_offsets=consumer_offsets, anomalies=anomalies, layout_info=info, mode=mode,
                       transaction_queues=tx_queues, scan=scan, read_choices=choices,
                       op_bodies_in_records=mode == "full" and not include_bodies,
                       op_bodies=op_bodies)


class LazyStoreFrames:
    """:func:`load_store_frames` deferred: ``layout_info`` (the listing) now, the DataFrames on first use.
    Full mode's one-job read (jobs/read/full.py) needs only the listing, and building the lazy DataFrames
    costs a round trip to a Python data-source worker per format (~1.4 s under load on the 4 GiB bench
    store, 0.3-0.5 s idle).  Brokers must be distinct (no DLedger replica groups to collapse)."""

    def __init__(self, spark, stores: Sequence[str], brokers: Sequence[str], **kwargs):
        self._load = lambda: load_store_frames(spark, list(stores), brokers=list(brokers), **kwargs)
        self._frames = None
        self.mode = kwargs.get("mode", "indexed")
        base = {"paths": json.dumps([str(r) for r in stores]), "brokers": ",".join(brokers)}
        if kwargs.get("commitlog_dirs"):
            base["commitlog_dirs"] = ",".join(str(d) for d in kwargs["commitlog_dirs"])
        self.layout_info = infos(parse_options(COMMITLOG_FORMAT, base))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        if self._frames is None:
            self._frames = self._load()
        return getattr(self._frames, name)


#: non-null stand-ins per Spark type name, only ever evaluated for a row of the other kind (filtered out)
_ZERO = {"string": "''", "bigint": "0L", "int": "0", "tinyint": "0Y", "smallint": "0S", "boolean": "false",
         "binary": "X''", "map<string,string>": "map()"}


def _exact(df, table, prefix: str = ""):
    """``df``'s columns (named ``prefix`` + name, ``broker`` as is) as ``table``'s exact Spark schema: the
    union table's columns are all nullable, so a required column is coalesced with a typed zero (a plan-only
    change: it restores nullability and column comments, no row is changed)."""
    from pyspark.sql import functions as F

    cols = []
    for f in table.spark_schema().fields:
        col = F.col(f.name if f.name == "broker" else prefix + f.name)
        if not f.nullable:
            zero = F.expr(_ZERO[f.dataType.simpleString()])
            col = F.coalesce(col, zero.cast(f.dataType) if f.dataType.simpleString().startswith("map") else zero)
        cols.append(col.alias(f.name, metadata=f.metadata))
    return df.select(*cols)


def op_bodies_from_commitlog(commitlog):
    """The reconstruction's op_bodies input from commitlog rows of the op topic that carry a body."""
    from pyspark.sql import functions as F

    c = F.col
    return commitlog.filter((c("topic") == OP_TOPIC) & c("body").isNotNull()).select(
        "broker", *[c(n).cast("string").alias(n) if n == "body" else n for n in OP_BODY_COLUMNS])


def without_bodies(records):
    """``records`` with ``body`` null (same type and column metadata)."""
    from pyspark.sql import functions as F

    body = records.schema["body"]
    return records.withColumn("body", F.lit(None).cast(body.dataType).alias("body", metadata=body.metadata))


def split_tx_scan(scan):
    """(records [broker + COMMITLOG], findings [broker + ANOMALIES]) of a ``rocketmq_txscan`` frame (records
    of COMMITLOG_REDUCER's columns when it was read with ``columns=reducer``)."""
    from pyspark.sql import functions as F

    kind = F.col("row_kind")
    records = COMMITLOG_SOURCE if "properties" in scan.columns else COMMITLOG_REDUCER
    return (_exact(scan.where(kind == TX_SCAN_RECORD), records),
            _exact(scan.where(kind == TX_SCAN_ANOMALY), ANOMALIES_SOURCE, ANOMALY_PREFIX))


# ----------------------------------------------------------------------------------------------------------
# indexed mode
# ----------------------------------------------------------------------------------------------------------

def indexed_commitlog(spark, consumequeue, statetable, redolog, info: Sequence[StoreInfo],
                      opts: SourceOptions, tx_queues=None, plan: Optional[IndexedPlan] = None, opts_for=None):
    """The transaction-relevant CommitLog records and the findings met reading them, as ``rocketmq_txscan``
    rows of one fetch pass (:func:`fetch_scan`; :func:`split_tx_scan` splits them).

    Positions are (broker, commitlog_offset, only_tx) rows, duplicates allowed: ``only_tx`` marks a position
    found through a real topic's consume queue, where a record is kept only if its transaction type is not NOT
    (a position also listed by a transaction index is kept whatever its type).  When the indexes and the
    probed real topics' units are small (``indexed_plan.driver_positions``: 3.x stores too) the driver works
    the positions out and ONE narrow fetch pass reads them; else two fetch passes: the index records (to
    learn the real topics), then every position once (:class:`_FetchAt` merges duplicates).
    """
    from pyspark.sql import functions as F

    local = None if plan is None or opts_for is None else driver_positions(plan, info, opts_for)
    if local is not None:       # worked out on the driver: one narrow fetch pass, no join, no shuffle
        return fetch_scan_local(spark, local, info, opts)
    key = ["broker", "commitlog_offset"]
    index_positions = (
        (consumequeue if tx_queues is None else tx_queues).where(F.col("topic").isin(*TX_SYSTEM_TOPICS))
        .select(*key)
        .unionByName(statetable.select(*key))
        .unionByName(redolog.select(*key)))
    whole = sorted(plan.full_read) if plan is not None else []
    if whole:       # read whole by the gap scan (jobs.read.indexed.plan.read_choices): nothing fetched
        index_positions = index_positions.where(~F.col("broker").isin(*whole))
    index_records = fetch_records(spark, index_positions, info, opts)
    c = F.col
    keyed = [s.broker for s in info if uses_index_files(s)]
    from_half = c("topic").isin(HALF_TOPIC, DISCARD_TOPIC)
    # stores with IndexFiles: the commits of the halves' REAL_TOPIC#UNIQ_KEY, looked up on executors (the
    # ranges no usable index file covers are scanned: indexed_gaps.index_file_gaps); other stores and the 3.x / 4.0-4.2
    # records: every non-NOT record of the real topics' consume queues
    real_topics = (
        index_records.where(~(from_half & c("broker").isin(*keyed)) if keyed else F.lit(True))
        .select("broker", F.coalesce(F.when(from_half, c("real_topic")),
                                     F.when(c("transaction_type") != "NOT", c("topic"))).alias("topic"))
        .where(c("topic").isNotNull() & ~c("topic").isin(*TX_SYSTEM_TOPICS))
        .distinct())
    positions = index_positions.withColumn("only_tx", F.lit(False))
    # a 4.3+ store with IndexFiles and no 3.x files has nothing to probe: its real-topic consume queues (every
    # ordinary message of those topics) are never read
    probed = [s.broker for s in info if not uses_index_files(s) or s.statetable_files or s.redolog_files]
    if probed:
        real_topic_positions = consumequeue.where(c("broker").isin(*probed)).join(
            F.broadcast(real_topics), ["broker", "topic"], "left_semi")
        positions = positions.unionByName(real_topic_positions.select(*key, F.lit(True).alias("only_tx")))
    if keyed:
        keys = (index_records.where(from_half & c("broker").isin(*keyed) & c("uniq_key").isNotNull()
                                    & c("real_topic").isNotNull())
                .groupBy("broker", "real_topic", "uniq_key").agg(F.min("physical_offset").alias("after")))
        hits = keys.repartition(max(1, min(len(keyed) * 4, spark.sparkContext.defaultParallelism)), "broker") \
            .mapInArrow(IndexLookup([s for s in info if uses_index_files(s)]),
                        "broker string, commitlog_offset bigint")
        positions = positions.unionByName(hits.withColumn("only_tx", F.lit(True)))
    return fetch_scan(spark, positions, info, opts)


def _damage_gap_commits(spark, scan, gap_rows: Sequence[tuple], indexed: Sequence[StoreInfo],
                        info: Sequence[StoreInfo], opts: SourceOptions):
    """``scan`` with the COMMIT records of the halves a damage gap's scan finds (a queue hole, a missing queue
    head, ...: gaps not in ``ORDINARY_GAPS``) looked up in the IndexFiles: such a half has no unit, so its key
    was not looked up with the others, and its COMMIT records may lie after the scanned range.  Unchanged (no
    stage added) when no store that uses IndexFiles has such a gap."""
    from pyspark.sql import functions as F

    keyed = {s.broker for s in indexed if uses_index_files(s)}
    damage = [g for g in gap_rows if g[0] in keyed and g[3] not in ORDINARY_GAPS]
    if not damage:
        return scan
    c = F.col
    records, _ = split_tx_scan(scan_cells(spark, damage, indexed, opts))
    keys = (records.where(c("topic").isin(HALF_TOPIC, DISCARD_TOPIC) & c("uniq_key").isNotNull()
                          & c("real_topic").isNotNull())
            .groupBy("broker", "real_topic", "uniq_key").agg(F.min("physical_offset").alias("after")))
    hits = keys.repartition(max(1, min(len(keyed) * 4, spark.sparkContext.defaultParallelism)), "broker") \
        .mapInArrow(IndexLookup([s for s in info if s.broker in keyed]), "broker string, commitlog_offset bigint")
    return scan.unionByName(fetch_scan(spark, hits.withColumn("only_tx", F.lit(True)), info, opts))


def keyed_only(store: StoreInfo) -> bool:
    """A store whose transaction records the driver can find alone: IndexFiles, no 3.x files to probe."""
    return uses_index_files(store) and not store.statetable_files and not store.redolog_files


def fetch_scan_local(spark, positions: pa.Table, info: Sequence[StoreInfo], opts: SourceOptions):
    """:func:`fetch_scan` of positions the driver holds (broker, commitlog_offset, only_tx): each located in
    its CommitLog file and de-duplicated here, sorted, and handed to the executors as contiguous slices of a
    parallelized list (one narrow stage)."""
    rows = located_positions(positions, info)
    n_parts = max(1, -(-sum(s.commitlog_bytes for s in info) // int(opts.split_bytes)))
    n = max(1, min(len(rows), n_parts, 4 * spark.sparkContext.defaultParallelism))
    frame = spark.createDataFrame(spark.sparkContext.parallelize(rows, n),
                                  "broker string, commitlog_offset bigint, only_tx boolean, path string, "
                                  "base_offset bigint")
    fn = _FetchAt(with_body=opts.include_bodies, emit="scan", commitlog_dirs=commitlog_dirs(info))
    return frame.mapInArrow(fn, SOURCE_TABLES[TX_SCAN_FORMAT].spark_schema())


def located_positions(positions: pa.Table, info: Sequence[StoreInfo]) -> list:
    """(broker, commitlog_offset, only_tx, path, base_offset) per distinct position of ``positions`` (broker,
    commitlog_offset, only_tx), sorted by (broker, path, offset); path and base None when no CommitLog file
    holds it.  A position listed several times is ``only_tx`` only if every listing says so."""
    import bisect

    files = {s.broker: s.commitlog_files for s in info}
    merged: dict = {}
    for b, off, only in zip(positions.column("broker").to_pylist(),
                            positions.column("commitlog_offset").to_pylist(),
                            positions.column("only_tx").to_pylist(), strict=True):
        merged[(b, off)] = merged.get((b, off), True) and bool(only)
    rows = []
    for (b, off), only in merged.items():
        fl = files.get(b, ())
        i = bisect.bisect_right([base for _, base, _ in fl], off) - 1
        path, base = (fl[i][0], fl[i][1]) if i >= 0 and off < fl[i][1] + fl[i][2] else (None, None)
        rows.append((b, int(off), only, path, base))
    rows.sort(key=lambda r: (r[0], r[3] or "", r[1]))
    return rows


def commitlog_files_frame(spark, info: Sequence[StoreInfo]):
    """(broker, path, base_offset, size) of every CommitLog file of the listed stores (driver listing)."""
    return spark.createDataFrame([(s.broker, path, base, size) for s in info
                                  for path, base, size in s.commitlog_files],
                                 "broker string, path string, base_offset bigint, size bigint")


def _located(spark, positions, info: Sequence[StoreInfo], split_bytes: int):
    """positions (broker, commitlog_offset[, only_tx]) + the CommitLog file holding each (null path: no file),
    repartitioned by (broker, file, chunk of split_bytes) and sorted by offset within a partition."""
    from pyspark.sql import functions as F

    files = commitlog_files_frame(spark, info).select(
        F.col("broker").alias("f_broker"), "path", "base_offset",
        (F.col("base_offset") + F.col("size")).alias("end_offset"))
    # one partition per split_bytes of CommitLog (not per file: many small files -- small stores, many
    # brokers -- would each cost a task and a Python runner in every fetch pass), at most a few per core:
    # the positions are records of transactions, whose number does not grow with the store
    n_parts = max(1, min(-(-sum(size for s in info for _, _, size in s.commitlog_files) // split_bytes),
                         4 * spark.sparkContext.defaultParallelism))
    if "only_tx" not in positions.columns:
        positions = positions.withColumn("only_tx", F.lit(False))
    p = positions.alias("p")
    located = p.join(F.broadcast(files), (F.col("p.broker") == F.col("f_broker"))
                     & (F.col("p.commitlog_offset") >= F.col("base_offset"))
                     & (F.col("p.commitlog_offset") < F.col("end_offset")), "left")
    chunk = F.floor((F.col("commitlog_offset") - F.col("base_offset")) / F.lit(split_bytes))
    columns = ["broker", "commitlog_offset", "only_tx", "path", "base_offset"]
    return (located.select(*columns, chunk.alias("chunk"))
            .repartition(n_parts, "broker", "path", "chunk")
            .sortWithinPartitions("broker", "path", "commitlog_offset")
            .select(*columns))


def fetch_records(spark, positions, info: Sequence[StoreInfo], opts: SourceOptions):
    """CommitLog rows (``broker`` + COMMITLOG) of the records starting at the given (broker, commitlog_offset)
    positions (duplicates allowed, each record is read once); with a boolean ``only_tx`` column, a position
    whose rows all say true yields its record only if its transaction type is not NOT."""
    fn = _FetchAt(with_body=opts.include_bodies, emit="records")
    return _located(spark, positions, info, opts.split_bytes).mapInArrow(
        fn, SOURCE_TABLES[COMMITLOG_FORMAT].spark_schema())


def fetch_scan(spark, positions, info: Sequence[StoreInfo], opts: SourceOptions):
    """``rocketmq_txscan`` rows of ONE pass over the given positions: the records :func:`fetch_records` gives
    and the findings met reading them (``MISSING_FILE`` for a position no CommitLog file holds)."""
    fn = _FetchAt(with_body=opts.include_bodies, emit="scan", commitlog_dirs=commitlog_dirs(info))
    return _located(spark, positions, info, opts.split_bytes).mapInArrow(
        fn, SOURCE_TABLES[TX_SCAN_FORMAT].spark_schema())


class _FetchAt:
    """mapInArrow body: group sorted positions by file and call ``txlog_io.commitlog.decode_at`` per chunk."""

    def __init__(self, with_body: bool, emit: str, commitlog_dirs: Optional[dict] = None):
        self.with_body = with_body
        self.emit = emit
        self.commitlog_dirs = commitlog_dirs or {}

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from txlog_io.readstats import flushing

        return flushing(self._fetch(batches))

    def _fetch(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow.compute as pc

        # a partition holds the positions of about split_bytes of CommitLog (tens of thousands of rows at
        # most): grouped per file with Arrow / numpy, no Python loop per position
        received = [b for b in batches if b.num_rows]
        if not received:            # an empty partition sends no batch at all
            return
        table = pa.Table.from_batches(received)
        lost = table.filter(pc.is_null(table.column("path")))
        table = table.filter(pc.is_valid(table.column("path")))
        keys = table.select(["broker", "path", "base_offset"]).group_by(
            ["broker", "path", "base_offset"]).aggregate([]).to_pylist()
        for key in keys:
            rows = table.filter(pc.and_(pc.equal(table.column("path"), key["path"]),
                                        pc.equal(table.column("broker"), key["broker"])))
            pos = rows.column("commitlog_offset").to_numpy() - int(key["base_offset"])
            flag = rows.column("only_tx").to_numpy(zero_copy_only=False).astype(bool)
            order = np.argsort(pos, kind="stable")
            pos, flag = pos[order], flag[order]
            unique, first = np.unique(pos, return_index=True)
            # a position reached through a transaction index as well is wanted whatever its type
            only = np.logical_and.reduceat(flag, first) if unique.size else flag
            for lo in range(0, unique.size, FETCH_CHUNK):
                chunk, chunk_only = unique[lo:lo + FETCH_CHUNK], only[lo:lo + FETCH_CHUNK]
                yield from self._decode((key["broker"], key["path"], int(key["base_offset"])), chunk,
                                        chunk[chunk_only])
        if lost.num_rows and self.emit == "scan":
            pairs = dict.fromkeys(zip(lost.column("broker").to_pylist(),
                                      lost.column("commitlog_offset").to_pylist(), strict=True))
            yield from self._missing(list(pairs))

    def _decode(self, key: tuple, positions, tx_only) -> Iterator[pa.RecordBatch]:
        from txlog_io.commitlog import decode_at

        broker, path, base = key
        # a scan keeps the op records' bodies (StoreFrames.op_bodies_in_records): no second read for them
        op_only = self.emit == "scan" and not self.with_body
        batch, anomalies = decode_at(path, positions, base_offset=base, with_body=self.with_body or op_only,
                                     tx_only=tx_only)
        if op_only and batch.num_rows:
            batch = op_bodies_only(batch)
        if self.emit == "records":
            if batch.num_rows:
                yield prepend_broker(batch, broker, COMMITLOG.arrow_schema(),
                                     SOURCE_TABLES[COMMITLOG_FORMAT].arrow_schema())
            return
        if batch.num_rows:
            yield tx_scan_rows(broker, records=batch)
        if anomalies:
            yield tx_scan_rows(broker, anomalies=anomalies_batch(broker, anomalies, "commitlog", path))

    def _missing(self, missing: list) -> Iterator[pa.RecordBatch]:
        for broker, batch in missing_file_findings(self.commitlog_dirs, missing):
            yield tx_scan_rows(broker, anomalies=batch)


__all__ = ["load_store_frames", "LazyStoreFrames", "StoreFrames", "StoreInfo", "indexed_commitlog",
           "fetch_records", "fetch_scan", "has_transaction_index", "commitlog_files_frame", "split_tx_scan",
           "fetch_scan_local", "TX_SYSTEM_TOPICS", "MODES", "GAP_HEAD", "GAP_OP_QUEUE", "GAP_TAIL",
           "GAP_TAIL_UNITS", "located_positions", "missing_file_findings", "keyed_only", "op_bodies_from_commitlog", "without_bodies"]
