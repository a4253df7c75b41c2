"""Decode speed of a DLedger log against a plain CommitLog holding the same records.

    python -m txlog_io.dledger_bench [--size-mb 256] [--msg-bytes 1024] [--dir DIR] [--keep] [--repeat 3]

Writes a plain CommitLog with ``txlog_io.bench.write_commitlog`` (one file of ``--size-mb``), re-lays the very
same records as DLedger entries (``txlog_io.dledger.DataLog``: 48-byte header, PHYSICALOFFSET = pos + 48, the
roll rule of MmapFileList), warms the page cache with one read of each, then times on one core the full decode
(every column, bodies, CRC checked) of each log, the two in turn, best wall and CPU time of ``--repeat``.
The last line is a JSON object.
"""
from __future__ import annotations

import argparse
import json
import shutil
import struct
import tempfile
import time
from pathlib import Path

from txlog_io import commitlog_decode as CD
from txlog_io import dledger as D
from txlog_io.bench import write_commitlog

_PHYS = struct.Struct(">q")
_SIZE = struct.Struct(">i")


def _records(data: bytes) -> list:
    pos, out = 0, []
    while pos + 8 <= len(data):
        total, magic = struct.unpack_from(">iI", data, pos)
        if magic not in (0xDAA320A7, 0xDAA320AB):
            break
        out.append((pos, total))
        pos += total
    return out


def relay_as_dledger(plain_file: Path, dledger_dir: Path) -> int:
    """The records of one plain CommitLog file appended to a DLedger log in ``dledger_dir`` whose single data
    file is just large enough (so neither log has a zero tail to skip); returns the entry count."""
    data = plain_file.read_bytes()
    records = _records(data)
    log = D.DataLog(sum(t for _, t in records) + D.ENTRY_HEADER_SIZE * len(records) + D.END_MARKER.size)
    n = 0
    for pos, total in records:
        record = bytearray(data[pos:pos + total])

        def record_for(phys: int, record=record) -> bytes:
            _PHYS.pack_into(record, 28, phys)
            return bytes(record)
        log.append(record_for)
        n += 1
    log.write(dledger_dir, index_file_size=32 << 20)
    return n


def _read_all(files) -> None:
    for f in files:
        with open(f, "rb") as fh:
            while fh.read(16 << 20):
                pass


def _time_decode(files, decode) -> tuple:
    """(wall seconds, CPU seconds of this process, rows): CPU time is what to compare on a busy machine."""
    t0, c0 = time.perf_counter(), time.process_time()
    rows = 0
    for f in files:
        for batch, _ in decode(str(f), with_body=True, verify_crc=True):
            rows += batch.num_rows
    return time.perf_counter() - t0, time.process_time() - c0, rows


def run(size_mb: int, msg_bytes: int, directory: Path, repeat: int) -> dict:
    size = size_mb << 20
    plain_dir = directory / "commitlog"
    count = write_commitlog(plain_dir, size, msg_bytes, file_size=size)
    plain = sorted(plain_dir.iterdir())
    entries = relay_as_dledger(plain[0], directory / "dledger-n0")
    dl = sorted((directory / "dledger-n0" / "data").iterdir())
    _read_all(plain + dl)
    result: dict = {"size_mb": size_mb, "msg_bytes": msg_bytes, "records": count, "dledger_entries": entries}
    logs = (("commitlog", plain, CD.decode_range), ("dledger", dl, D.decode_range))
    runs: dict = {name: [] for name, _, _ in logs}
    for _ in range(repeat):             # interleaved (A B A B ...): a load change hits both logs
        for name, files, decode in logs:
            runs[name].append(_time_decode(files, decode))
    for name, files, _ in logs:
        wall, cpu, rows = min(r[0] for r in runs[name]), min(r[1] for r in runs[name]), runs[name][0][2]
        nbytes = sum(f.stat().st_size for f in files)
        result[name] = {"seconds": round(wall, 3), "cpu_seconds": round(cpu, 3), "rows": rows, "bytes": nbytes,
                        "mb_per_s": round(nbytes / wall / 1e6, 1), "records_per_s": round(rows / wall)}
    result["dledger_vs_commitlog_time"] = round(result["dledger"]["seconds"] / result["commitlog"]["seconds"], 3)
    result["dledger_vs_commitlog_cpu"] = round(result["dledger"]["cpu_seconds"]
                                               / result["commitlog"]["cpu_seconds"], 3)
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m txlog_io.dledger_bench", description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--msg-bytes", type=int, default=1024)
    p.add_argument("--dir", type=Path)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    directory = args.dir or Path(tempfile.mkdtemp(prefix="txlog-dledger-bench-"))
    try:
        result = run(args.size_mb, args.msg_bytes, directory, args.repeat)
    finally:
        if not args.keep:
            shutil.rmtree(directory, ignore_errors=True)
    for name in ("commitlog", "dledger"):
        r = result[name]
        print(f"{name:10s} {r['rows']:>9d} records  {r['seconds']:7.3f} s wall  {r['cpu_seconds']:7.3f} s cpu  "
              f"{r['mb_per_s']:8.1f} MB/s")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
