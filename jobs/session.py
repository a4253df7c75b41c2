"""Building the SparkSession the jobs and tests use.

Local runs must not bind to the machine's external interface and executors must run the same interpreter as the
driver (or pyarrow is "missing" on them), so both are pinned here unless the caller already set them.
"""
from __future__ import annotations

import os
import sys
from typing import Mapping, Optional


def build_session(app_name: str = "txaudit", master: Optional[str] = None,
                  extra_conf: Optional[Mapping[str, str]] = None):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    conf = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.driver.host": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
        "spark.driver.bindAddress": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
    }
    conf.update(extra_conf or {})
    for k, v in conf.items():
        builder = builder.config(k, v)
    return builder.getOrCreate()
