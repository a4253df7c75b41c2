"""txlog-bench decode runs end to end on a few MB and reports what it measured (figures are not asserted)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_bench_decode_smoke(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "txlog_io.bench", "decode", "--size-mb", "4", "--msg-bytes", "200",
                           "--dir", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) >= {"raw_read_mb_s", "decode_mb_s", "ratio", "records_s", "msg_bytes", "peak_rss_mb"}
    assert result["msg_bytes"] == 200 and result["records"] > 10000
    assert 0 < result["ratio"] and result["decode_mb_s"] > 0
    files = sorted((tmp_path / "commitlog").iterdir())
    assert [f.stat().st_size for f in files] == [4 << 20]       # one full file, no zero-filled tail
