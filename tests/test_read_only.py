"""The input store is read-only, provably: checksums before and after every reading path, and a review list of
every place in the reading packages that can write a file."""
from __future__ import annotations

import ast
import datetime as dt
import hashlib
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "fixtures"


def snapshot(root: Path) -> dict:
    """{relative path: (kind, mode, size, mtime_ns, sha256)} of every entry below ``root`` (symlinks not
    followed)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            st = p.lstat()
            if p.is_file() and not p.is_symlink():
                digest = hashlib.sha256(p.read_bytes()).hexdigest()
                out[str(p.relative_to(root))] = ("file", st.st_mode, st.st_size, st.st_mtime_ns, digest)
            else:
                out[str(p.relative_to(root))] = ("dir", st.st_mode, 0, st.st_mtime_ns, "")
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Private copies of the 3.1.4 (statetable/redolog) and 5.3.3 fixtures, with a space and non-ASCII letters
    in the path, so a stray write could not hit the shared fixtures either."""
    base = tmp_path_factory.mktemp("ro") / "brökers dir"
    out = {}
    for v in ("rocketmq-3.1.4", "rocketmq-5.3.3"):
        shutil.copytree(FIXTURES / v / "store", base / v / "store", copy_function=shutil.copy2)
        out[v] = base / v / "store"
    return out


@pytest.mark.parametrize("mode", ["indexed", "full"])
def test_audit_leaves_the_store_untouched(spark, stores, tmp_path, mode):
    from jobs.audit.run import run_audit
    from jobs.main import parse_args

    before = {v: snapshot(s) for v, s in stores.items()}
    _, opts = parse_args(["audit", *sum((["--store", str(s)] for s in stores.values()), []),
                          "--out", str(tmp_path / "out"), "--as-of", "2026-11-22T00:00:00Z", "--mode", mode,
                          "--include-bodies"])
    summary = run_audit(spark, opts, print_summary=False)
    assert summary.transactions > 0
    assert {v: snapshot(s) for v, s in stores.items()} == before


def test_dump_and_bench_read_paths_leave_the_store_untouched(stores, capsys):
    from txlog_io import bench
    from txlog_io.cli import main as dump_main

    before = {v: snapshot(s) for v, s in stores.items()}
    for s in stores.values():
        for kind in ("store", "commitlog", "consumequeue"):
            target = s if kind == "store" else s / kind
            dump_main([kind, str(target), "--bodies"])
            dump_main([kind, str(target), "--verify"])
        if (s / "transaction").is_dir():
            dump_main(["statetable", str(s / "transaction" / "statetable")])
            dump_main(["redolog", str(s / "transaction" / "redolog")])
        m = bench._measure(s / "commitlog")              # the decode benchmark's read + decode path
        assert m["bytes"] > 0
    capsys.readouterr()
    assert {v: snapshot(s) for v, s in stores.items()} == before


def test_fuzz_never_writes_its_corpus_sources(stores, tmp_path, capsys):
    from jobs.bench import fuzz

    before = {v: snapshot(s) for v, s in stores.items()}
    targets = fuzz.build_corpus(tmp_path / "w", [(v, s) for v, s in stores.items()])
    assert targets and all(not Path(t.path).is_relative_to(s) for t in targets for s in stores.values())
    fuzz.campaign(targets, 60, 5, 20.0, tmp_path / "scratch", progress=False)
    assert {v: snapshot(s) for v, s in stores.items()} == before


# every call that can create, write, truncate or delete a file, per module and enclosing function; each was
# reviewed: it writes under --out, the tool's own work directory, or is an encoder used by refbroker/tests
WRITE_SITES_REVIEWED = {
    ("jobs/session.py", "local_dir_problem"),       # a probe directory under Spark's local dirs, removed
    ("txlog_io/bench.py", "write_commitlog"),       # bench's own generated CommitLog
    ("txlog_io/bench.py", "bench_decode"),          # removes its own work directory
    ("txlog_io/config.py", "write_config_file"),    # encoder (refbroker writes its stores with it)
    ("jobs/bench/fuzz.py", "_copy"),             # corpus copies under the fuzz work directory
    ("jobs/bench/mutants.py", "mutate"),            # mutants under the fuzz scratch directory
    ("jobs/bench/fuzz.py", "remember_all"),     # unmutated copies under the fuzz scratch directory
    ("jobs/bench/fuzz.py", "campaign"),         # removes its case directories
    ("jobs/bench/fuzz.py", "main"),
    ("jobs/bench/fuzz_audit.py", "_copy_store"),      # fuzz --audit: source copies under its work directory
    ("jobs/bench/fuzz_audit.py", "_run"),             # a batch's job / result files under the work directory
    ("jobs/bench/fuzz_audit.py", "campaign"),         # partial totals; removes its mutant directories
    ("jobs/bench/fuzz_audit.py", "main"),             # removes its own temporary work directory
    ("jobs/bench/fuzz_audit_worker.py", "main"),      # the batch's result file (named by the campaign)
    ("jobs/bench/store_mutants.py", "_mirror"),       # a mutant: hard links to the source COPY (never a store)
    ("jobs/bench/store_mutants.py", "mutate"),        # unlinks the link first: the copy is never written through
    ("jobs/bench/audit.py", "bench_size"),          # bench's own generated stores / work directory
    ("jobs/bench/scale.py", "generate_store"),      # txlog-bench scale: its own generated store's marker
    ("jobs/bench/scale.py", "audit_once"),          # its own audit config file under its work directory
    ("jobs/bench/scale.py", "run"),                 # creates / removes its own work directory and outputs
    ("jobs/bench/audit.py", "calibrate"),
    ("jobs/bench/audit.py", "generate_store"),
    ("jobs/bench/audit.py", "run"),
    ("jobs/bench/audit.py", "warm_up"),
    ("jobs/delta/sink.py", "_start"),               # Parquet data files under --out/<table>
    ("jobs/delta/sink.py", "_commit_files"),        # Delta log under --out/<table>
    ("jobs/delta/sink.py", "_write_with_spark"),
    ("jobs/delta/sink.py", "_create_with_spark"),   # the Spark writer creates a new table under --out first
    ("jobs/delta/sink.py", "retract_run"),
    ("jobs/demo.py", "run_demo"),                   # the demo's --out
    ("jobs/audit/guard.py", "out_lock"),                  # --out/.txaudit.lock
    ("txlog_io/dledger.py", "write"),               # DLedger encoder twin (refbroker writes its stores with it)
    ("txlog_io/dledger_bench.py", "main"),          # removes its own work directory
    ("txlog_io/jit.py", "_writable"),               # the numba cache directory (never under a store)
    ("txlog_io/jit.py", "ensure_cache_path"),
    ("jobs/bench/audit.py", "drop_page_cache"),     # /proc/sys/vm/drop_caches for --cold
    ("jobs/bench/incremental.py", "bench_incremental"),  # renames the bench's own stores in and out of live/
    ("jobs/bench/incremental.py", "bench_growth"),  # the same for each snapshot of the bench's own growing store
    ("jobs/bench/incremental.py", "share_identical"),  # hard-links the bench snapshot's identical files
    ("jobs/bench/incremental.py", "_fresh_paths"),  # empties the bench's own live/ store and output directories
    ("jobs/check/output.py", "_atomic_write"),      # --json / --junit-xml files the user named
    ("jobs/repair/requests.py", "_write_jsonl"),  # --out/recovery/<run_id>/
    ("jobs/repair/requests.py", "write_requests"),
    ("jobs/repair/run.py", "write_repair_log"),         # --out/repair_log (the store copy: refbroker.repair, --into)
    ("jobs/report/write.py", "_write"),                   # --out/report/<run_id>.html, index.html
    ("txlog_io/readstats.py", "flush"),             # per-process byte counts under $TXAUDIT_READ_STATS_DIR
    ("jobs/bench/audit.py", "read_stats_dir"),      # the bench's <dir>/.readstats
    ("txlog_io/java_baseline.py", "compile_baseline"),  # javac output under ~/.cache/txaudit-java
    # --out as a directory or a bucket prefix (jobs.delta.outfs): the sink's data files, report pages, work lists,
    # the repair log; never a store (guard.check_out_vs_stores refuses an --out in or around a store)
    ("jobs/delta/outfs.py", "makedirs"),
    ("jobs/delta/outfs.py", "write_bytes"),
    ("jobs/delta/outfs.py", "remove"),
    ("jobs/delta/outfs.py", "__init__"),            # Output: one data file being written
    ("jobs/audit/bucketlock.py", "_put"),           # <out>/.txaudit.lock in a bucket (conditional PUTs)
    ("jobs/audit/bucketlock.py", "release"),        # deletes that lock object (If-Match: our ETag)
    ("jobs/bench/s3server.py", "create_bucket"),    # the local test/bench S3 server's own buckets and uploads
    ("jobs/bench/s3server.py", "upload"),
    # RocksDB consume queues: the reader's own shadow directory of symlinks under the system temp directory
    # (rocksdict writes its config there, not into the store; test_rocksdb_cq proves the store unchanged)
    ("txlog_io/rocksdb_cq.py", "__init__"),
    ("txlog_io/rocksdb_cq.py", "close"),
}
_ANY_RECEIVER = {"write_bytes", "write_text", "mkdir", "unlink", "ParquetWriter", "write_deltalake", "touch",
                 "create_table_with_add_actions", "create_write_transaction", "save",
                 # object stores: pyarrow.fs and boto3 writes
                 "open_output_stream", "open_append_stream", "delete_file", "delete_dir", "delete_dir_contents",
                 "create_dir", "copy_file", "put_object", "delete_object",
                 # the Spark Delta writer
                 "createIfNotExists"}
_MODULE_CALLS = {"os": {"replace", "rename", "remove", "unlink", "ftruncate", "truncate", "makedirs", "mkdir",
                        "rmdir", "removedirs", "link", "symlink"},
                 "shutil": {"rmtree", "copy", "copy2", "copyfile", "copytree", "move"},
                 "pq": {"write_table"}, "dt": {"delete"}}


def _is_write(node: ast.Call) -> bool:
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
    receiver = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
    if name in _ANY_RECEIVER or name in _MODULE_CALLS.get(receiver, ()):
        return True
    if name == "OSFile":
        return any(c in ast.unparse(node) for c in ('"w', "'w", '"a', "'a"))
    if name == "mmap":
        return "ACCESS_WRITE" in ast.unparse(node) or "ACCESS_COPY" in ast.unparse(node)
    if name == "open" and receiver == "os":
        flags = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
        return any(x in flags for x in ("O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"))
    if name == "open" and receiver in ("", "io", "builtins"):
        mode = node.args[1] if len(node.args) > 1 else next(
            (k.value for k in node.keywords if k.arg == "mode"), None)
        if mode is None:
            return False
        if isinstance(mode, ast.Constant) and isinstance(mode.value, str):
            return any(c in mode.value for c in "wax+")
        return True                                    # a computed mode: review it
    return False


def _file_write_sites(rel, tree, sites):
    stack = []

    def visit(node):
        named = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        if named:
            stack.append(node.name)
        if isinstance(node, ast.Call) and _is_write(node):
            sites.setdefault((rel, stack[-1] if stack else "<module>"), []).append(
                f"{rel}:{node.lineno} {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child)
        if named:
            stack.pop()

    visit(tree)


def _write_sites():
    sites = {}
    for pkg in ("txlog_io", "jobs", "schemas"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            tree = ast.parse(path.read_text(), rel)
            _file_write_sites(rel, tree, sites)
    return sites


def test_every_write_site_in_the_reading_packages_is_reviewed():
    sites = _write_sites()
    new = {k: v for k, v in sites.items() if k not in WRITE_SITES_REVIEWED}
    assert not new, f"unreviewed write sites (could they touch a store?): {new}"
    gone = WRITE_SITES_REVIEWED - set(sites)
    assert not gone, f"reviewed write sites that no longer exist (update the list): {gone}"


def test_decoders_open_files_read_only():
    """The decoders' open helpers: plain 'rb' and read-only mmaps (no 'r+b', no ACCESS_WRITE) anywhere in
    txlog_io outside the reviewed writers above."""
    for path in sorted((ROOT / "txlog_io").glob("*.py")):
        text = path.read_text()
        assert "ACCESS_WRITE" not in text and "ACCESS_COPY" not in text, path
        assert '"r+b"' not in text and "'r+b'" not in text and '"rb+"' not in text, path
    assert dt  # noqa: B018
