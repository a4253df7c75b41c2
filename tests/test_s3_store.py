"""Stores in a bucket: the real-broker fixtures uploaded to a local S3-compatible server (moto's, on loopback,
started here; ``jobs.bench.s3server``) and audited from there.

* discovery, fingerprints and the data sources read the same from ``s3://`` as from disk, in few large
  requests, and never write (the server's request log);
* a full and an indexed audit from ``s3://`` write the same tables as the same audit from disk (paths
  aside), table by table;
* a missing bucket, a refused key, an unreachable endpoint, a prefix that is not a store: one line, exit 2,
  nothing written.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.conftest import FIXTURE_VERSIONS, FIXTURES

pytest.importorskip("moto", reason="moto[server] (test extra) runs the local S3 server")

BUCKET = "txaudit-stores"
PREFIX = "backups"
AS_OF = "2026-11-21T12:00:00Z"
RUN_ID = "20261121T120000Z"


@pytest.fixture(scope="module")
def s3():
    from jobs.bench.s3server import LocalS3

    with LocalS3() as server:
        server.create_bucket(BUCKET)
        for version in FIXTURE_VERSIONS:
            server.upload(str(FIXTURES / version / "store"), BUCKET, f"{PREFIX}/{version}/store")
        saved = {k: os.environ.get(k) for k in server.env()}
        os.environ.update(server.env())
        yield server
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _uri(version: str) -> str:
    return f"s3://{BUCKET}/{PREFIX}/{version}/store"


def _local(version: str) -> str:
    return str(FIXTURES / version / "store")


def _store_writes(s3, mark: int) -> int:
    return s3.summary(mark, bucket=BUCKET)["writes"]


# ------------------------------------------------------------------------------------------------ no Spark
@pytest.mark.parametrize("version", FIXTURE_VERSIONS)
def test_discovery_and_fingerprints_equal_local(s3, version):
    from txlog_io.fingerprint import store_prints
    from txlog_io.mappedfile import discover_store

    mark = len(s3.log)
    remote, local = discover_store(_uri(version)), discover_store(_local(version))
    listing = s3.summary(mark)
    assert listing["requests"] == 1                    # one recursive listing (a fixture has < 1000 objects)

    def norm(files, root):
        return [(str(f.path).replace(root, "<root>"), f.base_offset, f.size) for f in files]

    assert norm(remote.all_mapped_files(), _uri(version)) == norm(local.all_mapped_files(), _local(version))
    assert [(a.kind, a.position, a.file.replace(_uri(version), "<root>")) for a in remote.anomalies] == \
        [(a.kind, a.position, a.file.replace(_local(version), "<root>")) for a in local.anomalies]
    assert remote.checkpoint_path is not None and remote.topics_path is not None
    prints_remote, prints_local = store_prints(_uri(version)), store_prints(_local(version))
    assert {k: (p.size, p.edge_sha256) for k, p in prints_remote.items()} == \
        {k: (p.size, p.edge_sha256) for k, p in prints_local.items()}
    assert _store_writes(s3, mark) == 0


def test_ranged_reads_are_large_and_read_each_byte_once(s3):
    from txlog_io.commitlog_decode import scan_range
    from txlog_io.mappedfile import discover_store

    layout = discover_store(_uri("rocketmq-4.9.8"))
    mark = len(s3.log)
    frames = sum(1 for mf in layout.commitlog for _ in scan_range(str(mf.path), chunk_bytes=256 << 10))
    gets = [r for r in s3.log[mark:] if r.method == "GET"]
    fetched = sum(r.bytes_out for r in gets)
    total = sum(mf.size for mf in layout.commitlog)
    assert frames > 0
    assert fetched == total                            # every byte once (the files are full: no holes)
    assert len(gets) <= 2 * len(layout.commitlog) + total // (4 << 20)   # a probe, then >= 4 MiB requests


def test_cq_and_config_readers_read_the_same(s3):
    from txlog_io.config import decode_checkpoint, read_consumer_offsets
    from txlog_io.consumequeue import decode_consumequeue
    from txlog_io.mappedfile import discover_store

    version = "rocketmq-5.3.3"
    remote, local = discover_store(_uri(version)), discover_store(_local(version))
    for key in sorted(local.consume_queues)[:6]:
        for a, b in zip(remote.consume_queues[key], local.consume_queues[key], strict=True):
            got = [list(decode_consumequeue(str(mf.path), topic=key[0], queue_id=key[1])) for mf in (a, b)]
            rows = [pa.Table.from_batches([batch for batch, _ in g]) for g in got]
            assert rows[0].drop_columns([c for c in rows[0].column_names if c == "file"]).equals(
                rows[1].drop_columns([c for c in rows[1].column_names if c == "file"]))
            assert [x.kind for g in got[0] for x in g[1]] == [x.kind for g in got[1] for x in g[1]]
    ca, cb = decode_checkpoint(str(remote.checkpoint_path)), decode_checkpoint(str(local.checkpoint_path))
    assert {k: v for k, v in ca.items() if k != "anomalies"} == {k: v for k, v in cb.items() if k != "anomalies"}
    offsets = [[{k: v for k, v in row.items() if k != "file"} for row in read_consumer_offsets(str(p))[0]]
               for p in (remote.consumer_offset_path, local.consumer_offset_path)]
    assert offsets[0] == offsets[1] and offsets[0]


# ------------------------------------------------------------------------------------------------ CLI errors
def _cli(argv, capsys):
    from jobs.main import main

    code = main(["--validate-only", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


@pytest.mark.parametrize("case", ["missing bucket", "refused key", "not a store", "unreachable"])
def test_bad_remote_store_is_one_line_exit_2(s3, case, capsys, tmp_path, monkeypatch):
    store = {"missing bucket": "s3://no-such-bucket/x/store", "not a store": f"s3://{BUCKET}/{PREFIX}"}.get(
        case, _uri("rocketmq-4.9.8"))
    if case == "refused key":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONGWRONGWRONG")
    if case == "unreachable":
        import socket

        with socket.socket() as sock:                  # a port nothing listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    out = tmp_path / "out"
    mark = len(s3.log)
    code, err = _cli(["audit", "--store", store, "--out", str(out), "--as-of", AS_OF], capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith("txaudit: error: --store"), err
    expected = {"missing bucket": "bucket not found: s3://no-such-bucket",
                "refused key": "INVALID_ACCESS_KEY_ID", "not a store": "no message log",
                "unreachable": "connect"}[case]
    assert expected.lower() in err[0].lower(), err
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in err[0]
    assert not out.exists()
    assert s3.summary(mark)["writes"] == 0


def test_broker_names_of_uris():
    from jobs.sources.options import default_broker_name

    assert default_broker_name("s3://b/backups/broker-a/store") == "broker-a"
    assert default_broker_name("s3a://b/backups/broker-b/") == "broker-b"
    assert default_broker_name("file:///data/broker-c/store") == "broker-c"


def test_one_set_of_settings_feeds_arrow_delta_and_spark(tmp_path):
    from jobs.config import delta_storage_options, executor_env, object_store_settings, spark_s3a_conf

    creds = tmp_path / "credentials"
    creds.write_text("[ops]\naws_access_key_id = AKIAPROFILE\naws_secret_access_key = profile-secret\n")
    env = {"AWS_PROFILE": "ops", "AWS_SHARED_CREDENTIALS_FILE": str(creds), "AWS_CONFIG_FILE": os.devnull,
           "AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}
    s = object_store_settings(env)
    assert "profile-secret" not in repr(s)
    arrow = s.arrow_options()
    assert (arrow["endpoint_override"], arrow["scheme"], arrow["access_key"]) == ("127.0.0.1:9000", "http",
                                                                                   "AKIAPROFILE")
    delta = delta_storage_options(s)
    assert delta["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000" and delta["AWS_ALLOW_HTTP"] == "true"
    assert delta["AWS_SECRET_ACCESS_KEY"] == "profile-secret" and "AWS_S3_ALLOW_UNSAFE_RENAME" not in delta
    assert delta_storage_options(s, dict(env, AWS_S3_ALLOW_UNSAFE_RENAME="true"))["AWS_S3_ALLOW_UNSAFE_RENAME"] \
        == "true"                                      # a server without conditional writes: the user's choice
    spark = spark_s3a_conf(s)
    assert spark["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert spark["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert spark["spark.hadoop.fs.s3a.access.key"] == "AKIAPROFILE"
    assert executor_env(s)["spark.executorEnv.AWS_ENDPOINT_URL"] == "http://127.0.0.1:9000"
    assert spark_s3a_conf(object_store_settings({"AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                                                 "AWS_CONFIG_FILE": os.devnull})) == {}


# ------------------------------------------------------------------------------------------------ Spark
@pytest.mark.spark
def test_data_source_loads_a_bucket(spark, s3):
    from jobs.sources.formats import register

    spark.sparkContext.environment.update(s3.env())
    register(spark)
    mark = len(s3.log)
    remote = spark.read.format("rocketmq_commitlog").load(_uri("rocketmq-4.9.8"))
    local = spark.read.format("rocketmq_commitlog").load(_local("rocketmq-4.9.8"))
    cols = [c for c in local.columns if c not in ("file",)]
    rows = [sorted(df.select(*cols).collect()) for df in (remote, local)]
    assert rows[0] == rows[1] and rows[0]
    assert _store_writes(s3, mark) == 0


def _read_tables(out: Path) -> dict:
    from deltalake import DeltaTable

    found = {}
    for d in sorted(out.iterdir()):
        if (d / "_delta_log").is_dir():
            found[d.name] = DeltaTable(str(d)).to_pyarrow_table()
    return found


_VOLATILE = {"audit_runs": None, "store_files": {"mtime_ns"}}


def _canonical(tbl: pa.Table, name: str, roots: dict) -> list:
    """Rows as sorted tuples, store roots replaced by their broker's placeholder, volatile columns dropped."""
    drop = _VOLATILE.get(name) or set()
    cols = [c for c in tbl.column_names if c not in drop]
    out = []
    for c in cols:
        col = tbl.column(c)
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            for root, marker in roots.items():
                col = pc.replace_substring(col, root, marker)
        out.append(col.to_pylist())
    return sorted(zip(*out, strict=True), key=repr)


@pytest.mark.spark
@pytest.mark.parametrize("mode", ["full", "indexed"])
def test_audit_from_a_bucket_equals_the_audit_from_disk(spark, s3, tmp_path, mode):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    spark.sparkContext.environment.update(s3.env())
    outs = {}
    mark = len(s3.log)
    for where in ("s3", "local"):
        out = tmp_path / where
        stores = [_uri(v) if where == "s3" else _local(v) for v in FIXTURE_VERSIONS]
        argv = ["audit", *[a for s in stores for a in ("--store", s)], "--out", str(out), "--as-of", AS_OF,
                "--mode", mode, "--no-report"]
        _, opts = parse_args(argv)
        run_audit(spark, opts, print_summary=False)
        outs[where] = _read_tables(out)
    assert _store_writes(s3, mark) == 0
    assert set(outs["s3"]) == set(outs["local"]) and "transactions" in outs["s3"]
    roots = {**{_uri(v): f"<{v}>" for v in FIXTURE_VERSIONS}, **{_local(v): f"<{v}>" for v in FIXTURE_VERSIONS}}
    for name in sorted(outs["local"]):
        if _VOLATILE.get(name, ()) is None:
            continue
        a, b = _canonical(outs["s3"][name], name, roots), _canonical(outs["local"][name], name, roots)
        assert a == b, f"{name} ({mode}) differs: {len(a)} rows from S3, {len(b)} from disk"
    tx = outs["local"]["transactions"]
    assert tx.num_rows > 0
    shutil.rmtree(tmp_path, ignore_errors=True)
