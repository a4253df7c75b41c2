"""Building the SparkSession the jobs and tests use.

Local runs must not bind to the machine's external interface and executors must run the same interpreter as
the driver (or pyarrow is "missing" on them), so both are pinned here unless the caller already set them.  On
a cluster (a non-local master given here or through spark-submit.sh, which exports ``TXAUDIT_SPARK_MASTER``)
the driver address is left to Spark.

Under spark-submit the application keeps the name spark-submit gave it (``--name``; spark-submit.sh defaults it
to ``txaudit-<command>``), so a scheduled run is found under its own name in the cluster's UI.

When this process starts the JVM itself (tests, plain ``python``), the driver JVM gets the project's
``conf/log4j2.properties`` (quiet Spark console); under spark-submit the launcher already chose the logging.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Mapping, Optional

LOG4J2_CONF = Path(__file__).resolve().parent.parent / "conf" / "log4j2.properties"


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


def build_session(app_name: str = "txaudit", master: Optional[str] = None,
                  extra_conf: Optional[Mapping[str, str]] = None):
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
    }
    if local:
        conf["spark.driver.host"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
        conf["spark.driver.bindAddress"] = os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")
    extra = dict(extra_conf or {})
    if (LOG4J2_CONF.is_file() and "spark.driver.extraJavaOptions" not in extra and not _jvm_started()):
        conf["spark.driver.extraJavaOptions"] = f"-Dlog4j2.configurationFile={LOG4J2_CONF.as_uri()}"
    conf.update(extra)
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()


def arrow_frame(spark, table, schema=None):
    """``spark.createDataFrame`` of a pyarrow Table without its empty record batches: PySpark 4.2's Arrow
    conversion ends the table at the first zero-row batch (every row after it is silently lost), and
    ``pa.concat_tables`` of a part with no rows leaves one in the middle."""
    import pyarrow as pa

    batches = [b for b in table.to_batches() if b.num_rows]
    if len(batches) != len(table.to_batches()):
        table = pa.Table.from_batches(batches, schema=table.schema)
    return spark.createDataFrame(table, schema=schema) if schema is not None else spark.createDataFrame(table)
