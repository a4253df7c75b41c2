"""txlog-bench audit (jobs/bench/audit.py): sizing, worker-RSS sampler, output format, one tiny real run."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from jobs.bench import audit as B


def test_split_and_sizing():
    assert B.split_messages(1000, 0.01) == (10, 990)
    assert B.split_messages(1000, 0.0) == (0, 1000)
    assert B.split_messages(10, 1.0) == (10, 0)
    n = B.messages_for(1.0, 1400.0)
    assert abs(n * 1400.0 - B.GIB * B.FILL) < 1400.0


def test_parse_sizes():
    args = B._parser().parse_args(["--sizes", "1,2,4", "--tx-share", "0.05"])
    assert B.parse_sizes(args) == [1.0, 2.0, 4.0]
    assert B.parse_sizes(B._parser().parse_args([])) == [1.0]
    with pytest.raises(SystemExit):
        B.parse_sizes(B._parser().parse_args(["--sizes", "1,x"]))
    with pytest.raises(SystemExit):
        B.parse_sizes(B._parser().parse_args(["--tx-share", "2"]))
    with pytest.raises(SystemExit, match="--tx-interval-ms must be at least 1"):
        B.parse_sizes(B._parser().parse_args(["--tx-interval-ms", "0"]))


def test_a_store_must_end_before_the_bench_as_of():
    """--tx-interval-ms stretches the store's broker time; one that would end after AS_OF (every audit of the
    bench is as of then) is refused with a one-line error naming the option."""
    from refbroker.generate import DEFAULT_START_MS

    as_of_ms = 1_795_305_600_000                         # B.AS_OF, 2026-11-22T00:00:00Z
    B._check_span({"store": {"simulated_ms": as_of_ms - DEFAULT_START_MS - 1}}, 200)
    with pytest.raises(SystemExit, match=r"spans 5600 s of broker time .* smaller --tx-interval-ms than 800"):
        B._check_span({"store": {"simulated_ms": as_of_ms - DEFAULT_START_MS}}, 800)


def test_rss_sampler_sees_descendant_workers_only():
    code = "import time; b = bytearray(64 << 20); time.sleep(2.5)"
    child = subprocess.Popen([sys.executable, "-c", code, "pyspark.worker"])      # marker in its command line
    try:
        with B.RssSampler(interval=0.1) as rss:
            time.sleep(1.5)
        assert child.pid in rss.seen
        assert rss.peak_mb >= 64
        assert child.pid not in B.python_workers(child.pid)        # not its own descendant
    finally:
        child.wait(timeout=10)


def _run(size=1.0):
    return B.BenchRun(size_gb=size, tx_share=0.01, commitlog_gib=size, record_gib=size * 0.98, messages=1000,
                      transactions=10, generate_s=1.0, scan_s=2.0, full_s=8.0 * size, indexed_s=4.0 * size,
                      full_over_scan=4.0 * size, full_over_indexed=2.0, peak_worker_rss_mb=321.0,
                      full_phases={"read": 1.0}, indexed_phases={"read": 0.5}, states={"COMMITTED": 10})


def test_result_line_single_and_sizes():
    one = B.result_line([_run()])
    assert list(one) == ["size_gb", "tx_share", "scan_s", "full_s", "indexed_s", "full_over_scan",
                         "full_over_indexed", "peak_worker_rss_mb", "full_phases", "indexed_phases",
                         "small_audit_s", "cold", "transactions", "commitlog_bytes", "full_read_bytes",
                         "indexed_read_bytes", "full_read_kinds", "indexed_read_kinds"]
    assert one["full_phases"] == {"read": 1.0} and one["cold"] is False
    many = B.result_line([_run(1.0), _run(2.0)])
    assert many["sizes_gb"] == [1.0, 2.0] and len(many["runs"]) == 2
    assert many["full_s_per_gb"] == [8.0, 8.0]
    assert many["small_audit_s"] is None and many["cold"] is False
    assert "full/scan" in B.format_table([_run()])


@pytest.mark.slow
def test_tiny_bench_run(spark, tmp_path, capsys, monkeypatch):
    """A few MB through the whole command (generate, JVM scan, full + indexed audits) in the session; the
    audits forced into their Spark job (on a local master every read runs in the driver: no Python worker)."""
    from jobs.read import full

    monkeypatch.setattr(full, "LOCAL_READ_DRIVER_BYTES", 0)
    runs = B.run(["--size-gb", "0.004", "--file-mb", "2", "--dir", str(tmp_path), "--tx-share", "0.02",
                  "--no-warmup"],
                 spark=spark)
    out = capsys.readouterr().out.strip().splitlines()
    last = json.loads(out[-1])
    assert set(last) == {"size_gb", "tx_share", "scan_s", "full_s", "indexed_s", "full_over_scan",
                         "full_over_indexed", "peak_worker_rss_mb", "full_phases", "indexed_phases",
                         "small_audit_s", "cold", "transactions", "commitlog_bytes", "full_read_bytes",
                         "indexed_read_bytes", "full_read_kinds", "indexed_read_kinds"}
    assert last["small_audit_s"] is None and last["cold"] is False     # --no-warmup, no --cold
    # bytes the readers counted, in the driver and the workers (txlog_io.readstats)
    assert last["full_read_bytes"] >= last["commitlog_bytes"] * 0.9 > 0 and last["indexed_read_bytes"] > 0
    # the same bytes per kind of file
    for mode in ("full", "indexed"):
        kinds = last[f"{mode}_read_kinds"]
        assert sum(kinds.values()) == last[f"{mode}_read_bytes"] and kinds["commitlog"] > 0, kinds
    assert {"plan", "read", "reconstruct", "write"} <= set(last["full_phases"])
    assert last["size_gb"] == 0.004 and last["tx_share"] == 0.02
    assert last["scan_s"] > 0 and last["full_s"] > 0 and last["indexed_s"] > 0
    assert last["peak_worker_rss_mb"] > 0
    r = runs[0]
    assert r.commitlog_gib > 0 and r.transactions > 0 and sum(r.states.values()) == r.transactions
    assert not any(tmp_path.iterdir())                    # not --keep: the store and outputs are gone


def test_warm_up_times_the_small_store_in_both_modes(spark, tmp_path, monkeypatch):
    """small_audit_s: the warm-up store audited again, timed, per mode (a tiny store here)."""
    monkeypatch.setattr(B, "CALIBRATION_MESSAGES", 60)
    small = B.warm_up(spark, 0.1, 256, tmp_path / "w", log=lambda m: None)
    assert small["full"] > 0 and small["indexed"] > 0
    assert {"plan", "read", "reconstruct", "write"} <= set(small["full_phases"]) and small["indexed_phases"]
    assert not (tmp_path / "w").exists()


def test_drop_page_cache_says_whether_it_could(monkeypatch):
    """Without dropping anything for real (the machine is shared): what was written where, and the failure."""
    import builtins
    import io

    written = {}

    class Sink(io.StringIO):
        def close(self):
            written["value"] = self.getvalue()

    def fake_open(path, mode="r", *a, **k):
        if path != "/proc/sys/vm/drop_caches":
            raise AssertionError(path)
        written["path"] = path
        return Sink()

    assert B.drop_page_cache(False) is False
    monkeypatch.setattr(B.os, "sync", lambda: None)
    monkeypatch.setattr(builtins, "open", fake_open)
    assert B.drop_page_cache(True) is True and written == {"path": "/proc/sys/vm/drop_caches", "value": "3\n"}

    def denied(*a, **k):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(builtins, "open", denied)
    assert B.drop_page_cache(True) is False


def test_bench_cli_dispatch(capsys):
    from jobs.bench import cli as bench_cli

    assert bench_cli.main(["nonsense"]) == 2
    assert "unknown command 'nonsense'" in capsys.readouterr().err
    try:
        import jobs.bench.fuzz  # noqa: F401
    except ModuleNotFoundError:
        assert bench_cli.main(["fuzz"]) == 2
        assert "'fuzz' is not available" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        bench_cli.main(["audit", "--sizes", "x"])
    assert "--sizes" in str(e.value)


def test_bench_cli_failure_ends_with_one_line_naming_the_root_cause(capsys, monkeypatch):
    import types

    from jobs.bench import cli as bench_cli

    java = ("An error occurred while calling o812.count.\n: org.apache.spark.SparkException: Job aborted due "
            "to stage failure: Task 3 in stage 20.0 failed 1 times\n\tat org.apache.spark.scheduler.DAGScheduler"
            "\nCaused by: org.apache.spark.memory.SparkOutOfMemoryError: Unable to acquire 65536 bytes\n"
            "Caused by: java.lang.OutOfMemoryError: Java heap space\n\tat java.base/java.nio.HeapByteBuffer")

    def boom(argv):
        raise RuntimeError(java)

    monkeypatch.setitem(sys.modules, "jobs.bench.scale", types.SimpleNamespace(main=boom))
    assert bench_cli.main(["scale", "--transactions", "1"]) == 1
    err = capsys.readouterr().err.rstrip().splitlines()
    assert "Traceback" in err[0]
    assert err[-1] == ("txlog-bench: error: scale failed: RuntimeError: An error occurred while calling "
                       "o812.count. (Caused by: java.lang.OutOfMemoryError: Java heap space)")
