"""``txlog-bench audit --store-on s3``: the same full and indexed audits of the generated store, read from a
local S3-compatible server (``jobs.bench.s3server``: moto on loopback, in this process) instead of the disk.

The server is started before the warm-up, and its endpoint and key are put in this process's environment and
the session's worker environment then, so the Python workers that read the disk and the bucket are the same
warm ones (no worker start-up charged to the bucket's audits).  Per size, after the audits from disk:

* the store is uploaded to ``s3://txaudit-bench/<size>/store`` (``upload_s``);
* ``full`` and ``indexed`` audits of ``s3://...`` are timed like the disk ones, their outputs on disk;
* the server's request log gives, per audit: requests (GET / ranged GET / HEAD / list), response bytes, and
  the bytes of ranged GETs of CommitLog objects (``commitlog_bytes_read``); ``indexed_commitlog_share`` is
  the indexed audit's CommitLog bytes over the CommitLog's size (at 0.1 % transactional share it must stay
  around 0.1 or below);
* ``writes`` counts requests that would change the bucket (must be 0: the store is read-only);
* ``states_equal``: the bucket's audits found the disk audits' states.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

BUCKET = "txaudit-bench"


class BenchS3:
    """The local S3 server of one bench run (started by :meth:`start`, stopped by :meth:`stop`)."""

    def __init__(self):
        self.server = None
        self._saved: dict = {}

    def start(self, spark) -> "BenchS3":
        from jobs.bench.s3server import LocalS3

        self.server = LocalS3().start()
        self.server.create_bucket(BUCKET)
        env = self.server.env()
        self._saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        spark.sparkContext.environment.update(env)
        return self

    def stop(self, spark=None) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
            if spark is not None:
                spark.sparkContext.environment.pop(k, None)
        if self.server is not None:
            self.server.stop()
            self.server = None

    def _requests(self, mark: int) -> dict:
        rows = [r for r in self.server.log[mark:] if r.path.strip("/").split("/", 1)[0] == BUCKET]
        s = self.server.summary(mark, bucket=BUCKET)
        s["lists"] = sum(r.method == "GET" and "list-type" in r.query for r in rows)
        s["commitlog_bytes_read"] = sum(r.bytes_out for r in rows if r.method == "GET" and r.range
                                        and "/commitlog/" in r.path)
        s["largest_get"] = max((r.bytes_out for r in rows if r.method == "GET"), default=0)
        return s

    def bench(self, spark, store: Path, base: Path, label: str, commitlog_bytes: int, disk_states: dict,
              timed_audit, log=print) -> dict:
        """Upload ``store``, audit it from the bucket in both modes -> the measurements (module doc)."""
        t0 = time.monotonic()
        uri = self.server.upload(str(store), BUCKET, f"{label}/store")
        upload_s = time.monotonic() - t0
        log(f"[{label}] uploaded the store to {uri} in {upload_s:.0f} s; audit full from the bucket ...")
        out: dict = {"store": uri, "upload_s": round(upload_s, 1)}
        states_equal = True
        for mode in ("full", "indexed"):
            mark = len(self.server.log)
            seconds, summary = timed_audit(spark, uri, base / f"out-s3-{mode}", mode)
            req = self._requests(mark)
            out[mode] = dict(seconds=round(seconds, 2), **req)
            states_equal = states_equal and dict(summary.states) == dict(disk_states[mode])
            log(f"[{label}] {mode} from the bucket: {seconds:.1f} s, {req['requests']} requests, "
                f"{req['bytes_out'] / (1 << 20):.1f} MiB transferred")
        out["indexed_commitlog_share"] = round(out["indexed"]["commitlog_bytes_read"] / commitlog_bytes, 4) \
            if commitlog_bytes else None
        out["states_equal"] = states_equal
        out["writes"] = out["full"]["writes"] + out["indexed"]["writes"]
        return out


def start(spark, wanted: bool) -> Optional[BenchS3]:
    return BenchS3().start(spark) if wanted else None


__all__ = ["BenchS3", "start", "BUCKET"]
