"""Building the SparkSession the jobs and tests use.

Local runs must not bind to the machine's external interface and executors must run the same interpreter as
the driver (or pyarrow is "missing" on them), so both are pinned here unless the caller already set them.  On
a cluster (a non-local master given here or through spark-submit.sh, which exports ``TXAUDIT_SPARK_MASTER``)
the driver address is left to Spark.

Under spark-submit the application keeps the name spark-submit gave it (``--name``; spark-submit.sh defaults it
to ``txaudit-<command>``), so a scheduled run is found under its own name in the cluster's UI.

When this process starts the JVM itself (tests, plain ``python``), the driver JVM gets the project's
``conf/log4j2.properties`` (quiet Spark console); under spark-submit the launcher already chose the logging.

Before the SparkContext starts, the driver's local directories (where Spark copies the job's files and
spills shuffles) are probed: a full or unwritable one would otherwise end the run inside the JVM -- a Java
stack trace from copying ``--files``, or ``DiskBlockManager``'s "Failed to create any local dir" and exit 53 --
instead of one line (:class:`txlog_io.errors.ScratchSpaceError`).  A disk that fills up during the run is
named in one line by :func:`no_space_line`.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Callable, List, Mapping, Optional

LOG4J2_CONF = Path(__file__).resolve().parent.parent / "conf" / "log4j2.properties"
#: the driver JVM's JIT for a short run (``build_session(quick_jit=True)``, spark-submit.sh from the pre-check):
#: C1 only.  A fresh JVM's C2 compiler otherwise spends tens of CPU seconds compiling Spark's start-up and
#: first jobs (its compiler threads: 45-54 s of CPU in a 65 s audit), which on a small machine competes with
#: the run itself; a run that reduces on the driver never reaches the steady state C2 pays off in.
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: free space below which a local directory counts as full: the context copies the job's files (the
#: project's py-files zip, a few MB) there before the first job, and every shuffle spills there
MIN_LOCAL_DIR_FREE = 64 << 20
_NO_SPACE = "No space left on device"


def driver_cpus() -> int:
    """The CPUs this process may run on (the affinity mask, not the machine's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:          # not Linux
        return max(1, os.cpu_count() or 1)


def is_local_master(master: Optional[str]) -> bool:
    """None / "" (spark-submit's default, local[*]) and ``local...`` masters run on this machine."""
    return not master or master.strip().lower().startswith("local")


def _effective_master(master: Optional[str]) -> Optional[str]:
    if master:
        return master
    env = os.environ.get("TXAUDIT_SPARK_MASTER")
    return env or None


def _jvm_started() -> bool:
    if os.environ.get("PYSPARK_GATEWAY_PORT"):          # launched by spark-submit
        return True
    try:
        from pyspark import SparkContext
    except ImportError:
        return False
    return SparkContext._gateway is not None


def configured_local_dirs(conf: Mapping[str, str]) -> List[str]:
    """The driver's local directories in the order ``org.apache.spark.util.Utils.getConfiguredLocalDirs``
    takes them: YARN's ``LOCAL_DIRS`` in a container, ``SPARK_EXECUTOR_DIRS``, ``SPARK_LOCAL_DIRS``, then
    ``spark.local.dir``, else the JVM's ``java.io.tmpdir`` (``conf["java.io.tmpdir"]``, default /tmp)."""
    env = os.environ
    if env.get("CONTAINER_ID") is not None:
        raw = env.get("LOCAL_DIRS", "").split(",")
    elif env.get("SPARK_EXECUTOR_DIRS") is not None:
        raw = env["SPARK_EXECUTOR_DIRS"].split(os.pathsep)
    elif env.get("SPARK_LOCAL_DIRS") is not None:
        raw = env["SPARK_LOCAL_DIRS"].split(",")
    else:
        raw = (conf.get("spark.local.dir") or conf.get("java.io.tmpdir") or "/tmp").split(",")
    return [d.strip() for d in raw if d.strip()]


def local_dir_problem(root: str) -> Optional[str]:
    """Why Spark could not use ``root`` as a local directory (None: it can): it cannot be created, a
    directory and a page cannot be written under it, or less than :data:`MIN_LOCAL_DIR_FREE` is free."""
    try:
        os.makedirs(root, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".txaudit-probe-", dir=root)
        try:
            with open(os.path.join(probe, "page"), "wb") as f:
                f.write(bytes(4096))
        finally:
            shutil.rmtree(probe, ignore_errors=True)
        st = os.statvfs(root)
    except OSError as e:
        return e.strerror or type(e).__name__
    free = st.f_bavail * st.f_frsize
    if free < MIN_LOCAL_DIR_FREE:
        return f"{_NO_SPACE} ({free >> 20} MiB free, at least {MIN_LOCAL_DIR_FREE >> 20} MiB needed)"
    return None


def _jvm_dirs(jvm, get_conf: Callable[[str], Optional[str]]) -> dict:
    """The inputs of :func:`configured_local_dirs` a JVM holds: ``spark.local.dir`` (``get_conf(key)``, a
    Spark configuration's value or None) and ``jvm``'s ``java.io.tmpdir`` system property, the empty ones
    left out; nothing without a JVM (``jvm`` None)."""
    if jvm is None:
        return {}
    conf = {"spark.local.dir": get_conf("spark.local.dir") or "",
            "java.io.tmpdir": jvm.java.lang.System.getProperty("java.io.tmpdir")}
    return {k: v for k, v in conf.items() if v}


def _launcher_conf(extra: Mapping[str, str]) -> dict:
    """``spark.local.dir`` and ``java.io.tmpdir`` as the driver JVM sees them: from ``extra``, and under
    spark-submit (the JVM already runs) from its system properties."""
    conf = {k: v for k, v in extra.items() if k == "spark.local.dir"}
    if os.environ.get("PYSPARK_GATEWAY_PORT"):
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()               # connects to the launcher's gateway, starts nothing
        conf = {**_jvm_dirs(SparkContext._jvm, SparkConf().get), **conf}
    return {k: v for k, v in conf.items() if v}


def check_local_dirs(extra: Mapping[str, str]) -> None:
    """Raise :class:`ScratchSpaceError` for the first of the driver's local directories Spark could not use
    (Spark hashes blocks over all of them, so one full directory fails the run)."""
    from txlog_io.errors import ScratchSpaceError

    for root in configured_local_dirs(_launcher_conf(extra)):
        why = local_dir_problem(root)
        if why:
            raise ScratchSpaceError(root, why)


def local_dirs_of(spark) -> List[str]:
    """The local directories of the running session's driver (for naming them in an error)."""
    try:
        sc = spark.sparkContext
        conf = _jvm_dirs(sc._jvm, sc.getConf().get)
    except Exception:  # noqa: BLE001 - the session may be gone: name the defaults
        conf = {}
    return configured_local_dirs(conf)


def no_space_line(exc: BaseException) -> Optional[str]:
    """The line of ``exc``'s message (a Spark job's Java error included) that says a disk is full, or None."""
    for line in str(exc).splitlines():
        if _NO_SPACE in line:
            return " ".join(line.split())[:400]
    return None


def disk_full(exc: BaseException, out: str, spark) -> Optional[str]:
    """One line for a run ``exc`` ended because a disk filled up (naming ``--out`` and the session's local
    directories, where the run writes), or None when ``exc`` is something else."""
    full = no_space_line(exc)
    if full is None:
        return None
    return f"a disk is full (--out {out}, Spark local directories {','.join(local_dirs_of(spark))}): {full}"


def driver_java_options(extra: Mapping[str, str], quick_jit: bool) -> Optional[str]:
    """``spark.driver.extraJavaOptions`` for a JVM this process starts: Log4j2 pointed at conf/ and, with
    ``quick_jit``, :data:`QUICK_JIT`; None when the caller gives its own options (they stand as given) or there
    is nothing to add."""
    if "spark.driver.extraJavaOptions" in extra:
        return None
    options = [f"-Dlog4j2.configurationFile={LOG4J2_CONF.as_uri()}"] if LOG4J2_CONF.is_file() else []
    if quick_jit:
        options.append(QUICK_JIT)
    return " ".join(options) or None


def driver_jit(spark) -> str:
    """The driver JVM's JIT as started: its ``-XX:TieredStopAtLevel`` / ``-XX:-TieredCompilation`` arguments
    (``RuntimeMXBean.getInputArguments``), or ``"tiered"`` (the JVM's default) when it has none."""
    args = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    jit = [str(a) for a in args if str(a).startswith(("-XX:TieredStopAtLevel", "-XX:-TieredCompilation"))]
    return " ".join(jit) or "tiered"


def build_session(app_name: str = "txaudit", master: Optional[str] = None,
                  extra_conf: Optional[Mapping[str, str]] = None, quick_jit: bool = False):
    """The session (``getOrCreate``).  ``quick_jit``: the run is short (a driver reduce, a check): a JVM
    started here compiles with C1 only (:data:`QUICK_JIT`); an existing JVM keeps its own."""
    local = is_local_master(_effective_master(master))
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):      # under spark-submit its --name (spark.app.name) stands
        builder = builder.appName(app_name)
    if master:
        builder = builder.master(master)
    conf = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        # a persisted DataFrame (persist_on_disk) is built as columnar batches whatever its storage level;
        # compressed, every string value of every batch goes through DictionaryEncoding's hash-set probe
        # (CompressibleColumnBuilder.gatherCompressibilityStats) before the batch is written to local disk
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    if local:
        conf["spark.driver.host"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        conf["spark.driver.bindAddress"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    extra = dict(extra_conf or {})
    if SparkSession.getActiveSession() is None:
        check_local_dirs(extra)
    java = driver_java_options(extra, quick_jit)
    if java and not _jvm_started():
        conf["spark.driver.extraJavaOptions"] = java
    conf.update(extra)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def persist_on_disk(df, into: list):
    """``df`` persisted DISK_ONLY and appended to ``into`` (the caller unpersists them).  The persisted
    intermediates of an audit grow with the broker, and with a level that uses memory Spark reads a block
    that went to disk back into ONE heap buffer of the block's size to cache it again
    (BlockManager.maybeCacheDiskBytesInMemory, only when ``level.useMemory``): in local mode that buffer
    comes out of the driver's heap outside the unified pool's accounting (3 M transactions, 2 GiB driver:
    OutOfMemoryError there, docs/ARCHITECTURE.md).  A DISK_ONLY block is streamed."""
    from pyspark import StorageLevel

    df = df.persist(StorageLevel.DISK_ONLY)
    into.append(df)
    return df


def arrow_frame(spark, table, schema=None):
    """``spark.createDataFrame`` of a pyarrow Table without its empty record batches: PySpark 4.2's Arrow
    conversion ends the table at the first zero-row batch (every row after it is silently lost), and
    ``pa.concat_tables`` of a part with no rows leaves one in the middle.  A table without rows is given as
    one empty chunk per column: with none, the conversion fails on a nested column (``pa.chunked_array([])``
    without a type)."""
    import pyarrow as pa

    batches = [b for b in table.to_batches() if b.num_rows]
    if not batches:
        table = table.schema.empty_table()
    elif len(batches) != len(table.to_batches()):
        table = pa.Table.from_batches(batches, schema=table.schema)
    return spark.createDataFrame(table, schema=schema) if schema is not None else spark.createDataFrame(table)
