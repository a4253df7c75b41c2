"""Digests of reference-broker stores generated with fixed seeds: every file of ``store/``, the ledger and the
summary (without its timing), for the golden test (tests/test_refbroker_golden.py).

Regenerate the digest file (only when a change of the bytes written is intended)::

    .venv/bin/python -m tests.refbroker_golden tests/data/refbroker_golden.json
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from refbroker import generate, get_profile
from refbroker.profiles import PROFILE_NAMES
from refbroker.workload import SCENARIOS

SEED = 11
TX = 40
SMALL = dict(commitlog_file_size=96 * 1024, consumequeue_file_size=600, background_messages=50, msg_bytes=600)
# the benchmark's shape (5.1+ clean, no ordinary messages, 64-byte bodies) with files small enough to roll often
BENCH = dict(commitlog_file_size=256 * 1024, consumequeue_file_size=6000, background_messages=0, msg_bytes=64)


def cases() -> list:
    """(name, profile, scenario, transactions, sizes, dledger) for every scenario x profile and a few more."""
    out = []
    for scenario in SCENARIOS.values():
        for profile in scenario.profiles or PROFILE_NAMES:
            sizes = dict(SMALL)
            tx = TX
            if scenario.name == "legacy-3x":
                sizes["background_messages"] = 20
                tx = 120
            out.append((f"{scenario.name}/{profile}", profile, scenario.name, tx, sizes, False))
    for profile, scenario in (("5.1+", "crashy"), ("4.6-4.9", "unresolved")):
        out.append((f"dledger/{scenario}/{profile}", profile, scenario, TX, dict(SMALL), True))
    out.append(("bench-shape/5.1+", "5.1+", "clean", 2000, dict(BENCH), False))
    # enough records (two index keys each) to fill an index file (65,536 entries) and start the next
    out.append(("index-roll/5.1+", "5.1+", "clean", 14000, dict(BENCH, commitlog_file_size=4 << 20), False))
    return out


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_run(out: Path) -> dict:
    """{relative path: "size sha256"} of every file under ``out`` (summary.json without its timing)."""
    files = {}
    for dirpath, _dirs, names in os.walk(out):
        for name in names:
            path = Path(dirpath) / name
            rel = path.relative_to(out).as_posix()
            if rel == "summary.json":
                summary = json.loads(path.read_text())
                summary.pop("timing", None)
                blob = json.dumps(summary, sort_keys=True).encode()
                files[rel] = f"{len(blob)} {hashlib.sha256(blob).hexdigest()}"
            else:
                files[rel] = f"{path.stat().st_size} {_sha(path)}"
    return dict(sorted(files.items()))


def generate_case(case, base: Path) -> dict:
    name, profile, scenario, tx, sizes, dledger = case
    out = base / name.replace("/", "_").replace("+", "p")
    prof = get_profile(profile)
    if dledger:
        prof = prof.with_(dledger_self_id="n0", dledger_index_file_size=32768)
    generate(prof, scenario, tx, SEED, out, **sizes)
    return digest_run(out)


def main(argv) -> int:
    import tempfile

    target = Path(argv[0])
    with tempfile.TemporaryDirectory() as tmp:
        digests = {case[0]: generate_case(case, Path(tmp)) for case in cases()}
    how = (".venv/bin/python -m tests.refbroker_golden tests/data/refbroker_golden.json (only when a change of "
           "the bytes written is intended; made by the code before the generator was sped up)")
    target.write_text(json.dumps({"regenerate": how,
                                  "seed": SEED, "cases": digests}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
