"""Runs the driver commands many times as a scheduler would and counts how each process ended: exit 0, another
exit status, or a signal (the status the command's result deserves is the only one accepted).

    nice -n 19 .venv/bin/python scripts/exit_loop.py [--repair-runs 300] [--budget-min 60] [--dir /tmp/exitloop]
                                                     [--json FILE] [--reuse] [--audit-every N]

1. copies the 3.1.4 and the 5.3.3 real-broker fixtures (tests/data/fixtures/<version>/store) into ``--dir``
   (the fixtures are never the input of a run) and audits both once into ``--dir/out`` with
   ``./spark-submit.sh audit``;
2. ``./spark-submit.sh repair --store COPY --out OUT --into NEWDIR`` ``--repair-runs`` times per store, each a
   fresh process; ``NEWDIR`` (the repaired copy repair writes; the store copy is only read) is removed after
   each run;
   (fewer when ``--budget-min`` minutes have passed: the counts say how many ran);
3. then, until ``--budget-min`` minutes have passed since the start, alternately ``./spark-submit.sh check
   --out OUT`` (driver only: the checks over the audit's tables) and ``./spark-submit.sh audit`` of both
   stores into a second output directory (a JVM per run).

A run's outcome is its status: ``subprocess`` gives a negative code for a process ended by a signal (the
repair's ``exec`` leaves no shell in between); a status >= 128 from the shell in front of ``spark-submit`` is
counted as the signal it encodes.  Prints one line per command (``repair 3.1.4: 300/300 exit 0, 0 other,
0 signal``) and writes the counts with the unexpected runs' stderr tails to ``--json`` (after every run, so an
interrupted loop still leaves its counts).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "fixtures"
AS_OF = "2026-11-21T12:00:00Z"
STORES = {"fx314": "rocketmq-3.1.4", "fx533": "rocketmq-5.3.3"}


def _run(argv, timeout=900) -> tuple:
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    try:
        p = subprocess.run([str(ROOT / "spark-submit.sh"), *argv], capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=str(ROOT))
    except subprocess.TimeoutExpired as e:
        # the exception carries bytes even for a text-mode run (the output read so far, undecoded)
        err = e.stderr.decode("utf-8", "replace") if isinstance(e.stderr, bytes) else str(e.stderr or "")
        return "hang", err[-1500:]
    code = p.returncode
    if code < 0:
        return f"signal {-code}", p.stderr[-1500:]
    if code >= 128:
        return f"signal {code - 128}", p.stderr[-1500:]
    return f"exit {code}", p.stderr[-1500:]


class Tally:
    def __init__(self):
        self.counts: dict = {}
        self.bad: list = []

    def add(self, name: str, outcome: str, expected: str, err: str) -> None:
        self.counts.setdefault(name, Counter())[outcome] += 1
        if outcome != expected:
            self.bad.append({"command": name, "outcome": outcome, "stderr": err})

    def line(self, name: str, expected: str) -> str:
        c = self.counts.get(name, Counter())
        n = sum(c.values())
        signals = sum(v for k, v in c.items() if k.startswith("signal"))
        other = n - c[expected] - signals
        return f"{name}: {c[expected]}/{n} {expected}, {other} other status, {signals} signal ({dict(c)})"


def _audit_args(base: Path, out: Path) -> list:
    args = ["audit", "--out", str(out), "--as-of", AS_OF]
    for broker in STORES:
        args += ["--store", str(base / broker), "--broker", broker]
    return args


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--repair-runs", type=int, default=300)
    p.add_argument("--budget-min", type=float, default=60.0)
    p.add_argument("--dir", default="/tmp/exitloop")
    p.add_argument("--repair-budget-min", type=float, default=None,
                   help="stop the repair loop after this many minutes (default: --budget-min)")
    p.add_argument("--reuse", action="store_true",
                   help="keep --dir's store copies and audit output from an earlier run (no first audit)")
    p.add_argument("--audit-every", type=int, default=4, help="an audit after every N checks in step 3")
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    t0 = time.monotonic()
    base = Path(a.dir)
    out = base / "out"
    tally = Tally()
    if not (a.reuse and (out / "audit_runs").is_dir()):
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir(parents=True)
        for broker, fx in STORES.items():
            shutil.copytree(FIXTURES / fx / "store", base / broker)
        outcome, err = _run(_audit_args(base, out))
        tally.add("audit", outcome, "exit 0", err)
        if outcome != "exit 0":
            print(f"the first audit ended with {outcome}:\n{err}", file=sys.stderr)
            return 1
    shutil.rmtree(base / "into", ignore_errors=True)
    outcome, err = _run(["check", "--out", str(out)])
    check_expected = outcome if not outcome.startswith("signal") and outcome != "hang" else "exit 0"
    tally.add("check", outcome, check_expected, err)
    def save():
        if a.json:
            Path(a.json).write_text(json.dumps({"counts": {k: dict(v) for k, v in tally.counts.items()},
                                                "check_expected": check_expected, "unexpected": tally.bad[:20],
                                                "seconds": round(time.monotonic() - t0)}, indent=1))

    for i in range(a.repair_runs):
        if time.monotonic() - t0 > min(a.budget_min, a.repair_budget_min or a.budget_min) * 60:
            print(f"time budget reached after {i} repair round(s)", flush=True)
            break
        for broker in STORES:
            into = base / "into" / broker
            outcome, err = _run(["repair", "--store", str(base / broker), "--out", str(out), "--into", str(into)])
            if outcome == "exit 0" and "copied" not in err:
                outcome = "exit 0 without summary"
            tally.add(f"repair {broker}", outcome, "exit 0", err)
            shutil.rmtree(into, ignore_errors=True)
            save()
        if (i + 1) % 50 == 0:
            print(f"[{time.monotonic() - t0:.0f}s] repair round {i + 1}", flush=True)
    k = 0
    while time.monotonic() - t0 < a.budget_min * 60:
        outcome, err = _run(["check", "--out", str(out)])
        tally.add("check", outcome, check_expected, err)
        if k % a.audit_every == 0:
            out2 = base / "out2"
            outcome, err = _run(_audit_args(base, out2))
            tally.add("audit", outcome, "exit 0", err)
            shutil.rmtree(out2, ignore_errors=True)
        save()
        k += 1
    lines = [tally.line(f"repair {b}", "exit 0") for b in STORES]
    lines += [tally.line("audit", "exit 0"), tally.line("check", check_expected)]
    lines.append(f"wall {time.monotonic() - t0:.0f}s (machine shared, timings under load)")
    print("\n".join(lines), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps({"counts": {k: dict(v) for k, v in tally.counts.items()},
                                            "check_expected": check_expected, "unexpected": tally.bad[:20],
                                            "summary": lines}, indent=1))
    return 1 if tally.bad else 0


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
