"""Delta tables seen through delta-spark, in a process of its own (its own JVM with the fetched delta-spark
jars, and hadoop-aws for ``s3a://``): run by tests/test_delta_spark.py, never imported by the suite.

    python tests/delta_spark_probe.py read DUMP_DIR TABLE_DIR[@VERSION]...
        each table as Spark reads it: ``DUMP_DIR/<n>.json`` (schema with comments, partition columns,
        description, DESCRIBE HISTORY) and ``DUMP_DIR/<n>-latest.parquet`` (its rows, through Spark's Arrow
        conversion), plus ``<n>-at.parquet`` (time travel to VERSION) when given; ``<n>`` is the table's
        position in the arguments.
    python tests/delta_spark_probe.py copy SRC_OUT DST_OUT TABLE...
        run ``run_id`` of each table under SRC_OUT rewritten under DST_OUT (a URI, ``s3a://``) by
        ``jobs.delta.sink.write_table(writer="spark")``: twice, the second a replaceWhere re-run.

Commands may be chained with ``+`` (one JVM): ``copy ... + read ...``.

The jars come from ``TXAUDIT_PROBE_JARS`` (comma-separated paths); S3A settings from the environment
(``jobs.config.object_store_conf``).  Exit 0 on success; any error is a traceback (a test failure).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _session():
    from jobs.config import object_store_conf
    from jobs.session import build_session

    conf = {"spark.jars": os.environ["TXAUDIT_PROBE_JARS"],
            "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
            "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2", "spark.databricks.delta.snapshotPartitions": "2"}
    conf.update(object_store_conf())
    return build_session(app_name="txaudit-delta-probe", master="local[2]", extra_conf=conf)


def _quoted(path: str) -> str:
    return "delta.`" + path.replace("`", "``") + "`"


def read(spark, dump: Path, tables) -> None:
    import pyarrow.parquet as pq

    dump.mkdir(parents=True, exist_ok=True)
    for n, arg in enumerate(tables):
        path, _, version = arg.partition("@")
        df = spark.read.format("delta").load(path)
        detail = spark.sql(f"DESCRIBE DETAIL {_quoted(path)}").collect()[0]
        history = spark.sql(f"DESCRIBE HISTORY {_quoted(path)}").collect()
        info = {
            "path": path,
            "fields": [[f.name, f.dataType.simpleString(), f.nullable, f.metadata.get("comment")]
                       for f in df.schema.fields],
            "partition_columns": list(detail["partitionColumns"]),
            "description": detail["description"],
            "history": [{"version": int(h["version"]), "operation": h["operation"],
                         "engine": h["engineInfo"], "parameters": dict(h["operationParameters"] or {})}
                        for h in sorted(history, key=lambda h: h["version"])],
        }
        (dump / f"{n}.json").write_text(json.dumps(info, indent=1, default=str))
        pq.write_table(df.toArrow(), dump / f"{n}-latest.parquet")
        if version:
            at = spark.read.format("delta").option("versionAsOf", int(version)).load(path)
            pq.write_table(at.toArrow(), dump / f"{n}-at.parquet")


def _schema_table(name: str):
    from schemas import audit, repair, runs

    for module in (audit, runs, repair):
        for value in vars(module).values():
            if getattr(value, "name", None) == name and hasattr(value, "columns"):
                return value
    raise SystemExit(f"no schema for table {name}")


def copy(spark, src_out: str, dst_out: str, names) -> None:
    from jobs.delta import sink

    for name in names:
        src = os.path.join(src_out, name)
        detail = spark.sql(f"DESCRIBE DETAIL {_quoted(src)}").collect()[0]
        df = spark.read.format("delta").load(src)
        row = df.select("run_id", "run_date").distinct().collect()
        assert len(row) == 1, (name, row)
        for _ in range(2):                       # the second write replaces the first (replaceWhere)
            res = sink.write_table(df, dst_out, _schema_table(name), row[0]["run_id"],
                                   list(detail["partitionColumns"]), spark, run_date=row[0]["run_date"],
                                   writer="spark")
            assert res.writer == "spark" and res.path == f"{dst_out}/{name}", res
        print(f"probe: {name}: {res.rows} rows, version {res.version}")


def main(argv) -> int:
    spark = _session()
    try:
        while argv:
            cmd = argv[:argv.index("+")] if "+" in argv else argv
            argv = argv[len(cmd) + 1:]
            if cmd[0] == "read":
                read(spark, Path(cmd[1]), cmd[2:])
            elif cmd[0] == "copy":
                copy(spark, cmd[1], cmd[2], cmd[3:])
            else:
                raise SystemExit(f"unknown probe command {cmd[0]}")
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
