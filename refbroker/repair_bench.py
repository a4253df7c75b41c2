"""``txlog-bench repair``: throughput of the offline repair (refbroker.repair) against a plain ``cp`` of the
same store.

Generates a 5.1+ store with the reference broker (``clean`` scenario, 4 KiB bodies, 128 MiB CommitLog files),
deletes its op consume queue (so the repair has something to rebuild), then times, each into a fresh
directory on the same filesystem: ``cp -r`` of the store, and the repair (plan: every CommitLog file scanned
for the half/op/discard records, their consume queues compared with the rebuild; apply: copy_file_range of
every file plus the writes).  Rates are per MB of allocated data (holes are not copied by either).  The
page cache is warm (the store was just written and is read once by ``cp``
first); the last line printed is a JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def _du(root: Path) -> tuple:
    """(logical bytes, allocated bytes): mapped files are pre-allocated sparse (mostly holes)."""
    files = [p.stat() for p in root.rglob("*") if p.is_file()]
    return sum(st.st_size for st in files), sum(st.st_blocks * 512 for st in files)


def bench_repair(size_mb: int, directory=None, keep: bool = False) -> dict:
    from refbroker import generate
    from refbroker.repair import apply_repair, plan_repair

    work = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="txlog-bench-repair-"))
    try:
        records = max(1000, size_mb * 1_000_000 // 4300)
        t0 = time.perf_counter()
        store = generate("5.1+", "clean", records // 10, 7, work / "gen",
                         background_messages=records * 9 // 10, msg_bytes=4096,
                         commitlog_file_mb=128).store_dir
        shutil.rmtree(store / "consumequeue" / "RMQ_SYS_TRANS_OP_HALF_TOPIC", ignore_errors=True)
        gen_s = time.perf_counter() - t0
        logical, allocated = _du(store)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-r", str(store), str(work / "cp")], check=True)
        cp_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        plan = plan_repair(str(store), "5.1+", [])
        plan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        apply_repair(plan, str(work / "repaired"))
        apply_s = time.perf_counter() - t0
    finally:
        if not keep and not directory:
            shutil.rmtree(work, ignore_errors=True)
    mb = allocated / 1e6
    result = {"store_mb": round(logical / 1e6, 1), "store_data_mb": round(mb, 1),
              "generate_s": round(gen_s, 1), "cp_s": round(cp_s, 2),
              "cp_mb_s": round(mb / cp_s, 1), "repair_plan_s": round(plan_s, 2),
              "repair_apply_s": round(apply_s, 2),
              "repair_mb_s": round(mb / (plan_s + apply_s), 1), "repair_copy_mb_s": round(mb / apply_s, 1),
              "writes": len(plan.writes), "page_cache": "warm"}
    for k, v in result.items():
        print(f"{k:<16} {v}")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="txlog-bench repair", description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256, help="CommitLog data to generate (default 256)")
    p.add_argument("--dir", help="work directory (default: a temporary one, removed afterwards)")
    p.add_argument("--keep", action="store_true")
    args = p.parse_args(argv)
    print(json.dumps(bench_repair(args.size_mb, args.dir, args.keep)))
    return 0


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
