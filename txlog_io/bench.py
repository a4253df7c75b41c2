"""txlog-bench decode: measured figures for the CommitLog decoder (Spark-free; the ``txlog-bench`` command
itself is ``jobs.bench.cli``, which also runs ``audit`` from jobs/bench/audit.py).

    txlog-bench decode [--size-mb N] [--msg-bytes B] [--dir DIR] [--keep] [--passes N]
                       [--java [--java-passes P]]

``decode`` writes a CommitLog of N MB with the project's encoder (1 GiB files, the broker's default), then in
one worker process measures (a) raw sequential read MB/s of the same files (``readinto`` one reused 16 MiB
buffer, page cache warmed by a first read) and (b) full decode on one core into Arrow columns: every header
field, topic, properties (parsed map plus UNIQ_KEY, PGROUP, REAL_TOPIC, REAL_QID, TRANSACTION_CHECK_TIMES, TAGS,
KEYS columns) and body.  The decode is run without and with body-CRC verification (RocketMQ's own
MessageDecoder.decode does not check the CRC; recovery does).  The last line printed is a JSON object; on a
busy machine compare its CPU-time figures (``ratio_cpu``: the decode's CPU seconds against the best of five
raw reads; ``records_s_cpu``: CPU seconds exclude waiting for a core) and note ``load_avg_1m``.

``--java`` also runs RocketMQ's own ``MessageDecoder.decode`` (``txlog_io.java_baseline``) over the same files
in the same run, P passes in one JVM on one thread, and reports ``java_decode_mb_s`` / ``java_ratio`` (best
pass, JIT warmed) and ``java_first_mb_s`` (first pass) against the same raw read, plus whether it decoded the
same records (``java_same_records``).  Our decode then runs as many passes (``--passes``), best
reported (``decode_first_mb_s``: its first), so both sides get the same treatment;
``decode_over_java_cpu`` compares the CPU seconds of the two best passes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from txlog_io.commitlog import END_FILE_MIN_BLANK_LENGTH, Message, encode_blank, encode_record
from txlog_io.msgid import create_uniq_key

GIB = 1 << 30
_QUEUE_OFFSET = struct.Struct(">q")
_PHYS = struct.Struct(">q")
_TIMES = struct.Struct(">q")


def write_commitlog(directory: Path, size_bytes: int, msg_bytes: int, file_size: int = GIB, seed: int = 7) -> int:
    """Write ceil(size_bytes / file_size) full CommitLog files of records of about ``msg_bytes`` each (no
    zero-filled tail, so both measurements read only record bytes); returns the record count.

    Every distinct record shape is produced by ``encode_record``; the per-record fields that change from one
    record to the next (queue offset, physical offset, timestamps) are then patched into a copy of those bytes
    at the offsets the layout defines, which is what keeps generation of gigabytes fast."""
    directory.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    templates = []
    for t in range(64):
        topic = f"TopicBench{t % 8}"
        props = {"UNIQ_KEY": create_uniq_key(bytes([10, 0, 0, t]), 4242, 0x5FFD2B27, 1795300000000 + t, t),
                 "TAGS": f"Tag{t % 5}", "KEYS": f"order-{rnd.randrange(10 ** 9)}", "WAIT": "true",
                 "CLUSTER": "DefaultCluster"}
        if t % 4 == 0:
            props.update({"TRAN_MSG": "true", "PGROUP": "PID_BENCH", "REAL_TOPIC": topic, "REAL_QID": "1",
                          "TRANSACTION_CHECK_TIMES": "1"})
        probe = encode_record(Message(topic=topic, properties=props), 0)
        body_len = max(0, msg_bytes - len(probe))
        body = bytes(rnd.getrandbits(8) for _ in range(body_len))
        msg = Message(topic=topic, body=body, properties=props, queue_id=t % 4, born_timestamp=1795300000000,
                      born_host="10.0.0.1:50000", store_timestamp=1795300000001, store_host="10.0.0.2:10911")
        templates.append(bytearray(encode_record(msg, 0)))
    count, file_index = 0, 0
    queue_next = [0] * 4
    files = max(1, -(-size_bytes // file_size))
    while file_index < files:
        base = file_index * file_size
        path = directory / f"{base:020d}"
        pos = 0
        with open(path, "wb") as fh:
            out = bytearray()
            while True:                      # every file is filled up to its BLANK end, like a rolled file
                rec = templates[count % len(templates)]
                if pos + len(rec) + END_FILE_MIN_BLANK_LENGTH > file_size:
                    out += encode_blank(file_size - pos)
                    break
                q = count % 4
                _QUEUE_OFFSET.pack_into(rec, 20, queue_next[q])
                _PHYS.pack_into(rec, 28, base + pos)
                _TIMES.pack_into(rec, 40, 1795300000000 + count)
                _TIMES.pack_into(rec, 56, 1795300000001 + count)
                queue_next[q] += 1
                out += rec
                pos += len(rec)
                count += 1
                if len(out) >= 8 << 20:
                    fh.write(out)
                    out = bytearray()
            fh.write(out)
            fh.truncate(file_size)
        file_index += 1
    return count


def _measure(directory: Path, passes: int = 1) -> dict:
    """Runs in a fresh worker process so its peak RSS is the decoder's alone.  Each decode runs ``passes``
    times: ``*_s`` / ``*_cpu_s`` are the best pass (wall and CPU each, as the Java baseline reports its own),
    ``*_first_s`` the first."""
    t_load = time.perf_counter()
    from txlog_io.commitlog import decode_range

    files = sorted(p for p in directory.iterdir() if p.name.isdigit())
    # numba kernels: loaded from the on-disk cache (or compiled, on a cold cache) by the first decode
    for _ in decode_range(str(files[0]), end=1 << 20):
        pass
    kernel_load_s = time.perf_counter() - t_load
    buf = bytearray(16 << 20)
    view = memoryview(buf)

    def read_all() -> int:
        total = 0
        for p in files:
            with open(p, "rb", buffering=0) as fh:
                while True:
                    n = fh.readinto(view)
                    if not n:
                        break
                    total += n
        return total

    read_all()                                   # warm the page cache
    t0 = time.perf_counter()
    nbytes = read_all()
    raw_s = time.perf_counter() - t0
    raw_best_s = raw_s
    for _ in range(4):                           # best of 5: the read's speed here when least disturbed
        t0 = time.perf_counter()
        read_all()
        raw_best_s = min(raw_best_s, time.perf_counter() - t0)
    result = {"bytes": nbytes, "raw_s": raw_s, "raw_best_s": raw_best_s, "kernel_load_s": kernel_load_s}
    for label, crc in (("decode", False), ("decode_crc", True)):
        for i in range(max(1, passes)):
            records = 0
            t0, c0 = time.perf_counter(), time.process_time()
            for p in files:
                for batch, _ in decode_range(str(p), with_body=True, verify_crc=crc):
                    records += batch.num_rows
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            if i == 0:
                result[f"{label}_first_s"], result[f"{label}_s"], result[f"{label}_cpu_s"] = wall, wall, cpu
            result[f"{label}_s"] = min(result[f"{label}_s"], wall)
            result[f"{label}_cpu_s"] = min(result[f"{label}_cpu_s"], cpu)
        result["records"] = records
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return result


def bench_decode(size_mb: int, msg_bytes: int, directory: str | None, keep: bool,
                 java_passes: int = 0, passes: int = 1) -> dict:
    work = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="txlog-bench-"))
    cl_dir = work / "commitlog"
    try:
        t0 = time.perf_counter()
        if cl_dir.exists():
            shutil.rmtree(cl_dir)
        # files of the broker's 1 GiB size, each filled to the end; a smaller benchmark uses one full file of
        # its size, so both measurements read record bytes, not a zero-filled tail
        records = write_commitlog(cl_dir, size_mb << 20, msg_bytes, file_size=min(GIB, size_mb << 20))
        gen_s = time.perf_counter() - t0
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                           os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-m", "txlog_io.bench", "_measure", str(cl_dir), str(passes)],
                              capture_output=True, text=True, env=env, check=True)
        m = json.loads(proc.stdout.strip().splitlines()[-1])
        if java_passes:
            from txlog_io.java_baseline import run_baseline

            java = run_baseline(sorted(str(p) for p in cl_dir.iterdir() if p.name.isdigit()), java_passes)
    finally:
        if not keep and not directory:
            shutil.rmtree(work, ignore_errors=True)
    mb = m["bytes"] / 1e6
    raw, dec, dec_crc = mb / m["raw_s"], mb / m["decode_s"], mb / m["decode_crc_s"]
    rows = [("generated", f"{records} records, {size_mb} MiB in {gen_s:.1f} s"),
            ("raw read (readinto 16 MiB)", f"{raw:,.0f} MB/s"),
            (f"decode, one core, best of {passes}",
             f"{dec:,.0f} MB/s  {m['records'] / m['decode_s']:,.0f} records/s  "
             f"(first pass {mb / m['decode_first_s']:,.0f} MB/s)"),
            ("decode + body CRC check", f"{dec_crc:,.0f} MB/s  {m['records'] / m['decode_crc_s']:,.0f} records/s"),
            ("decode / raw read", f"{dec / raw:.3f}"),
            ("peak RSS of the decoding process", f"{m['peak_rss_mb']:.0f} MB"),
            ("import + kernel load (first decode)", f"{m['kernel_load_s']:.2f} s")]
    extra = {}
    if java_passes:
        j_best, j_first = mb / java["best_s"], mb / java["first_s"]
        rows += [(f"Java MessageDecoder, best of {java_passes}", f"{j_best:,.0f} MB/s  "
                  f"{java['records'] / java['best_s']:,.0f} records/s  (first pass {j_first:,.0f} MB/s)"),
                 ("Java decode / raw read", f"{j_best / raw:.3f}"),
                 ("our decode / Java decode", f"{dec / j_best:.3f}")]
        extra = {"java_decode_mb_s": round(j_best, 1), "java_ratio": round(j_best / raw, 4),
                 "java_first_mb_s": round(j_first, 1),
                 "java_records_s": round(java["records"] / java["best_s"]),
                 "java_ratio_cpu": round(m["raw_best_s"] / java["best_cpu_s"], 4),
                 "java_decode_cpu_mb_s": round(mb / java["best_cpu_s"], 1),
                 "decode_over_java": round(dec / j_best, 4), "java_passes": java_passes,
                 # CPU seconds of the best passes of both: what to compare on a busy machine
                 "decode_over_java_cpu": round(java["best_cpu_s"] / m["decode_cpu_s"], 4),
                 "java_same_records": java["records"] == m["records"]}
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return {"raw_read_mb_s": round(raw, 1), "decode_mb_s": round(dec, 1), "ratio": round(dec / raw, 4),
            "records_s": round(m["records"] / m["decode_s"]), "msg_bytes": msg_bytes,
            "peak_rss_mb": round(m["peak_rss_mb"], 1), "decode_crc_mb_s": round(dec_crc, 1),
            "size_mb": size_mb, "records": m["records"], "decode_passes": passes,
            "decode_first_mb_s": round(mb / m["decode_first_s"], 1),
            "kernel_load_s": round(m["kernel_load_s"], 3),
            # the decode's CPU seconds against the best of five raw reads: what to compare on a busy machine
            # (wall time there includes waiting for a core)
            "ratio_cpu": round(m["raw_best_s"] / m["decode_cpu_s"], 4),
            "raw_best_mb_s": round(mb / m["raw_best_s"], 1),
            "decode_cpu_mb_s": round(mb / m["decode_cpu_s"], 1),
            "records_s_cpu": round(m["records"] / m["decode_cpu_s"]),
            "load_avg_1m": round(os.getloadavg()[0], 2), **extra}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["_measure"]:
        print(json.dumps(_measure(Path(argv[1]), int(argv[2]) if len(argv) > 2 else 1)))
        return 0
    parser = argparse.ArgumentParser(prog="txlog-bench", description="decoder benchmark (see module docstring)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("decode", help="CommitLog decode vs raw read of the same bytes")
    d.add_argument("--size-mb", type=int, default=1024)
    d.add_argument("--msg-bytes", type=int, default=1024)
    d.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    d.add_argument("--keep", action="store_true", help="keep the generated CommitLog")
    d.add_argument("--java", action="store_true", help="also run RocketMQ's MessageDecoder (needs a JDK)")
    d.add_argument("--java-passes", type=int, default=5, help="passes of the Java decoder (best is reported)")
    d.add_argument("--passes", type=int, help="passes of our decoder, best reported (default: 1; with --java "
                                              "as many as the Java decoder gets)")
    args = parser.parse_args(argv)
    java_passes = args.java_passes if args.java else 0
    passes = args.passes or max(1, java_passes)
    result = bench_decode(args.size_mb, args.msg_bytes, args.dir, args.keep, java_passes, passes)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
