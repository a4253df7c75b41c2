"""``txlog-bench fuzz --audit``: whole-store mutants, audited in full and indexed mode against the intact store.

    txlog-bench fuzz --audit [--cases N] [--seed S] [--batch B] [--timeout SECONDS] [--modes full,indexed]
                             [--no-refbroker] [--transactions T] [--work DIR] [--table-md] [--only m00175,...]

Sources: copies of the real-broker fixtures (tests/data/fixtures: 3.1.4, 4.9.8, 5.3.3, the 4.9.8 DLedger
stores) and, unless ``--no-refbroker``, reference-broker stores (scenario ``crashy``) of every profile with a
file CommitLog, and of the 4.6-4.9 and 5.1+ profiles with a DLedger CommitLog.  Mutants
(``jobs/bench/store_mutants.py``) are hard-linked mirrors of those copies with one file rewritten; fixtures are
never opened for writing.

Batches: ``--batch`` mutants (round-robin over the sources, a class drawn per mutant) plus the intact copies
of their sources are audited by ONE Spark run per mode in a worker process (``jobs/bench/fuzz_audit_worker.py``:
every store its own ``--store``/``--broker``, so the audit keys their transactions apart).  A worker that does
not finish within ``--timeout`` is killed (a hang); one whose audit raised is bisected down to the mutant that
makes it raise (a traceback, or a clean ``TxlogError`` refusal).

Oracle, per mutant and mode, transaction by transaction (keyed by ``transaction_key``) against the intact
source's audit in the same run:

* ``silent_state_change``: the state differs and the mutant's transaction carries no damage flag
  (``DAMAGE_FLAGS``) -- a bug;
* ``intact_dropped``: the transaction is missing although its first half / prepared record's bytes were not
  mutated -- a bug;
* ``state_change_flagged`` / ``dropped_damaged``: allowed (the damage is named / the half itself is damaged);
* ``silent_flag_change``: the flags differ (a state kept) without a damage flag: reported, not gated;
* ``added``: a transaction key the intact audit does not have (e.g. a record read with damaged fields);
* ``known_gap``: a violation of one of ``KNOWN_GAPS`` (being fixed elsewhere), counted apart, by name.

The last line printed is a JSON object with the totals; the exit status is 1 when a gated count
(silent state changes, intact transactions dropped, tracebacks, hangs) is not 0.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from jobs.bench.store_mutants import CLASSES, Mutant, Source, intact, load_source, mutate

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "fixtures"
AS_OF = "2026-11-20T00:00:00Z"
MODES = ("full", "indexed")
#: flags that name damage on the transaction they are set on (jobs/reconstruct/flags.py)
DAMAGE_FLAGS = frozenset({"STATE_UNCERTAIN_DAMAGED_RANGE", "CORRUPT_RECORD", "CQ_MISMATCH",
                          "PREPARED_RECORD_MISSING", "OP_BODY_MISSING"})
EXAMPLES = 12          # examples kept per kind of violation (every batch's job.json lists its mutants too)
GATED = ("silent_state_change", "intact_dropped", "tracebacks", "hangs")
COLUMNS = ("mutants", "audits", "state_change_flagged", "dropped_damaged", "added", "silent_flag_change",
           "silent_state_change", "intact_dropped", "known_gap", "clean_errors", "tracebacks", "hangs")
#: known gaps (fixed on another branch): name -> what they are; ``known_gap`` classifies a violation
KNOWN_GAPS = {
    "oldest_file_as_retention": "a missing oldest CommitLog file read as retention",
    "queue_end_before_checkpoint": "indexed mode: a consume queue cut short while the checkpoint / "
                                   "consumerOffset.json point past its end",
}
REFBROKER = (("3.x", None), ("4.0-4.2", None), ("4.3-4.5", None), ("4.6-4.9", None), ("5.0", None),
             ("5.1+", None), ("4.6-4.9", "n0"), ("5.1+", "n0"))


# ------------------------------------------------------------------------------------------------ sources
def _copy_store(src: Path, dst: Path) -> Path:
    if not dst.exists():
        shutil.copytree(src, dst, symlinks=False)
    return dst


def fixture_sources(work: Path) -> List[Tuple[str, Path]]:
    out = []
    for d in sorted(FIXTURES.iterdir()):
        for store in sorted(p for p in d.iterdir() if p.is_dir() and p.name.startswith("store")):
            label = d.name.replace("rocketmq-", "rmq") + ("" if store.name == "store" else "-" + store.name[6:])
            out.append((label, _copy_store(store, work / "sources" / label)))
    return out


def refbroker_sources(work: Path, transactions: int) -> List[Tuple[str, Path]]:
    from refbroker.generate import generate
    from refbroker.profiles import get_profile

    out = []
    for name, dledger in REFBROKER:
        label = "rb" + name.replace(".", "").replace("+", "p") + ("-dledger" if dledger else "")
        d = work / "gen" / label
        if not (d / "store").is_dir():
            profile = get_profile(name).with_(dledger_self_id=dledger) if dledger else name
            generate(profile, "crashy", transactions, 7, d, commitlog_file_size=128 * 1024, cq_file_units=300,
                     statetable_file_size=2400, redolog_file_size=4000)
        out.append((label, _copy_store(d / "store", work / "sources" / label)))
    return out


# ------------------------------------------------------------------------------------------------ oracle
def known_gap(m: Mutant, src: Source, mode: str, kind: str, b_flags: set, m_flags: set) -> Optional[str]:
    """The name of the known gap a violation belongs to, else None."""
    cut = m.cls.startswith(("cut_", "random_truncate")) or "mid_unit" in m.note or "boundary" in m.note
    files = {f for f, _, _ in m.damaged}
    if "DUPLICATE_COMMIT" in b_flags - m_flags:     # a COMMIT not read: counted, never another gap's
        return None
    if mode == "indexed" and cut and all(f.startswith("consumequeue/") for f in files):
        return "queue_end_before_checkpoint"
    return None


def judge(m: Mutant, src: Source, mode: str, diffs: List[dict], counts: Counter,
          examples: Dict[str, List[str]]) -> None:
    """Count ``diffs`` (the worker's rows of mutant ``m``) into ``counts``; keep a few examples per kind."""
    for d in diffs:
        b_flags, m_flags = set(d["b_flags"] or ()), set(d["m_flags"] or ())
        if d["m_state"] is None:
            rec = src.halves.get(d["b_offset"]) if d["b_offset"] is not None else None
            kind = "intact_dropped" if intact(m, rec) else "dropped_damaged"
        elif d["b_state"] is None:
            kind = "added"
        elif d["b_state"] != d["m_state"]:
            kind = "state_change_flagged" if m_flags & DAMAGE_FLAGS else "silent_state_change"
        else:
            kind = "silent_flag_change" if not (m_flags & DAMAGE_FLAGS) else "state_change_flagged"
            if kind == "state_change_flagged":
                continue                        # a flag change that names the damage: nothing to count
        if kind in ("silent_state_change", "intact_dropped", "silent_flag_change"):
            gap = known_gap(m, src, mode, kind, b_flags, m_flags)
            if gap is not None:
                counts["known_gap"] += 1
                counts[f"known_gap:{gap}"] += 1
                kind = f"known_gap:{gap}"
        if kind not in ("state_change_flagged", "dropped_damaged", "added"):
            counts[kind] += kind in COLUMNS
            ex = examples.setdefault(kind, [])
            if len(ex) < EXAMPLES:
                ex.append(f"[{mode}] {m.describe()} tx={d['transaction_key']} {d['b_state']}{sorted(b_flags)}"
                          f" -> {d['m_state']}{sorted(m_flags)}")
        else:
            counts[kind] += 1


# ------------------------------------------------------------------------------------------------ batches
class Batches:
    """Runs batches in worker processes; bisects failed ones."""

    def __init__(self, work: Path, modes: Tuple[str, ...], timeout: float, log=print):
        self.work, self.modes, self.timeout, self.log = work, modes, timeout, log
        self.runs = 0

    def _run(self, sources: Dict[str, Source], mutants: List[Mutant]) -> Tuple[str, dict]:
        """("ok", result) / ("error", result) / ("hang", {}) for one worker over ``mutants``."""
        self.runs += 1
        d = self.work / "runs" / f"r{self.runs}"
        d.mkdir(parents=True)
        used = sorted({m.source for m in mutants})
        stores = [[f"base-{s}", str(sources[s].root)] for s in used] + [[m.name, str(m.root)] for m in mutants]
        job = {"stores": stores, "pairs": [[m.name, f"base-{m.source}"] for m in mutants],
               "modes": list(self.modes), "as_of": AS_OF, "out": str(d / "out"),
               "mutants": {m.name: {"class": m.cls, "note": m.note, "damaged": m.damaged} for m in mutants}}
        (d / "job.json").write_text(json.dumps(job))
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
        with open(d / "log.txt", "wb") as logf:
            proc = subprocess.Popen([sys.executable, "-m", "jobs.bench.fuzz_audit_worker", str(d / "job.json"),
                                     str(d / "result.json")], cwd=ROOT, env=env, stdout=logf, stderr=logf,
                                    start_new_session=True)
            try:
                proc.wait(self.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)       # the worker's own process group (it and its JVM)
                proc.wait()
                return "hang", {"message": f"no result within {self.timeout:.0f} s ({d})"}
            finally:
                if proc.poll() is None:                   # the campaign itself was stopped
                    os.killpg(proc.pid, signal.SIGKILL)
        try:
            result = json.loads((d / "result.json").read_text())
        except (OSError, ValueError):
            tail = (d / "log.txt").read_text(errors="replace")[-1500:]
            return "error", {"error": "traceback", "message": f"worker exit {proc.returncode}: {tail}"}
        if proc.returncode == 0:
            shutil.rmtree(d / "out", ignore_errors=True)
        return ("ok" if proc.returncode == 0 else "error"), result

    def run(self, sources: Dict[str, Source], mutants: List[Mutant]) -> List[Tuple[List[Mutant], str, dict]]:
        """(mutants, status, result) for ``mutants``: one worker, or -- when it failed -- its halves, down to
        the single mutants that fail."""
        status, result = self._run(sources, mutants)
        if status == "ok" or len(mutants) == 1:
            return [(mutants, status, result)]
        self.log(f"fuzz --audit: a batch of {len(mutants)} failed ({status}: "
                 f"{str(result.get('message', ''))[:200]}); bisecting")
        half = len(mutants) // 2
        return self.run(sources, mutants[:half]) + self.run(sources, mutants[half:])


def campaign(sources: Dict[str, Source], cases: int, seed: int, batch: int, runner: Batches, scratch: Path,
             progress: bool = True, only: frozenset = frozenset(),
             ) -> Tuple[Dict[str, Counter], Dict[str, Counter], Dict[str, List[str]]]:
    """Mutate ``cases`` mutants (round-robin over ``sources``), audit them in batches; (per class, per source,
    examples).  ``only``: mutant names to audit (the others are still drawn, so that a seed's mutants are
    the same ones, and removed at once): a run's listed mutants replayed."""
    rng = random.Random(seed)
    labels = sorted(sources)
    by_class: Dict[str, Counter] = defaultdict(Counter)
    by_source: Dict[str, Counter] = defaultdict(Counter)
    examples: Dict[str, List[str]] = {}
    t0 = time.monotonic()
    for start in range(0, cases, batch):
        bdir = scratch / f"b{start}"
        mutants = []
        for i in range(start, min(cases, start + batch)):
            src = sources[labels[i % len(labels)]]
            cls = rng.choice(src.classes())
            m = mutate(src, f"m{i:05d}", bdir / f"m{i:05d}", cls, rng)
            if only and m.name not in only:
                shutil.rmtree(m.root, ignore_errors=True)
                continue
            mutants.append(m)
        if not mutants:
            continue
        for group, status, result in runner.run(sources, mutants):
            for m in group:
                c = Counter(mutants=1)
                if status == "hang":
                    c["hangs"] += 1
                elif status == "error":
                    c["tracebacks" if result.get("error") != "clean" else "clean_errors"] += 1
                if status != "ok":
                    key = "hangs" if status == "hang" else (
                        "tracebacks" if result.get("error") != "clean" else "clean_errors")
                    ex = examples.setdefault(key, [])
                    if len(ex) < EXAMPLES and len(group) == 1:
                        ex.append(f"{m.describe()}: {str(result.get('message'))[:600]}")
                else:
                    for mode, got in result["modes"].items():
                        c["audits"] += 1
                        judge(m, sources[m.source], mode, [d for d in got["diffs"] if d["mutant"] == m.name], c,
                              examples)
                by_class[m.cls].update(c)
                by_source[m.source].update(c)
        shutil.rmtree(bdir, ignore_errors=True)
        total: Counter = Counter()
        for r in by_class.values():
            total.update(r)
        (runner.work / "partial.json").write_text(json.dumps({"by_class": by_class, "by_source": by_source,
                                                              "total": total, "examples": examples}))
        if progress:
            done = min(cases, start + batch)
            gated = ", ".join(f"{c} {total[c]}" for c in GATED + ("known_gap", "clean_errors"))
            print(f"fuzz --audit: {done}/{cases} mutants, {total['audits']} audits, {time.monotonic() - t0:.0f} s"
                  f" ({gated})", file=sys.stderr, flush=True)
    return by_class, by_source, examples


def format_table(title: str, rows: Dict[str, Counter], markdown: bool = False) -> str:
    heads = ("class",) + COLUMNS
    total: Counter = Counter()
    for r in rows.values():
        total.update(r)
    body = [[k] + [str(rows[k][c]) for c in COLUMNS] for k in sorted(rows)]
    body.append(["TOTAL"] + [str(total[c]) for c in COLUMNS])
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([title, fmt.format(*heads)] + [fmt.format(*r) for r in body])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="txlog-bench fuzz --audit",
                                description="whole-store mutants audited in full and indexed mode")
    p.add_argument("--audit", action="store_true", help="(the mode switch of txlog-bench fuzz)")
    p.add_argument("--cases", type=int, default=200, help="mutants (each audited once per mode)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--batch", type=int, default=150, help="mutants per Spark run")
    p.add_argument("--timeout", type=float, default=0.0,
                   help="seconds per worker run before it counts as a hang (default: 600 + 6 per store)")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--no-refbroker", action="store_true", help="fixtures only")
    p.add_argument("--sources", default="", help="comma-separated source labels to keep (default: all)")
    p.add_argument("--transactions", type=int, default=30, help="transactions per reference-broker store")
    p.add_argument("--work", help="work directory (default: a temporary one, removed afterwards)")
    p.add_argument("--table-md", action="store_true", help="also print the tables as Markdown")
    p.add_argument("--only", default="",
                   help="comma-separated mutant names (m00175,...) to audit: the same seed's mutants replayed")
    args = p.parse_args(argv)
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if args.cases < 1 or args.batch < 1 or not modes or not set(modes) <= set(MODES):
        p.error(f"--cases and --batch must be >= 1, --modes a subset of {','.join(MODES)}")
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="txlog-fuzz-audit-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # stop the running worker too (finally)
    t0 = time.monotonic()
    try:
        pairs = fixture_sources(work) + ([] if args.no_refbroker else refbroker_sources(work, args.transactions))
        keep = {s.strip() for s in args.sources.split(",") if s.strip()}
        sources = {label: load_source(label, root) for label, root in pairs if not keep or label in keep}
        if not sources:
            p.error(f"--sources: none of {sorted(keep)} among {[lb for lb, _ in pairs]}")
        timeout = args.timeout or 600 + 6 * (args.batch + len(sources))
        runner = Batches(work, modes, timeout, log=lambda s: print(s, file=sys.stderr, flush=True))
        scratch = work / "mutants"
        shutil.rmtree(scratch, ignore_errors=True)
        only = frozenset(n.strip() for n in args.only.split(",") if n.strip())
        by_class, by_source, examples = campaign(sources, args.cases, args.seed, args.batch, runner, scratch,
                                                 only=only)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    secs = time.monotonic() - t0
    print(f"sources: {len(sources)} ({', '.join(f'{k} [{v.log_kind}]' for k, v in sorted(sources.items()))}); "
          f"{args.cases} mutants x {len(modes)} mode(s) in {runner.runs} Spark run(s), {secs:.0f} s")
    print(format_table("per mutation class", by_class))
    print()
    print(format_table("per source store", by_source))
    if args.table_md:
        print()
        print(format_table("per mutation class", by_class, markdown=True))
        print()
        print(format_table("per source store", by_source, markdown=True))
    total: Counter = Counter()
    for r in by_class.values():
        total.update(r)
    for kind, lines in sorted(examples.items()):
        for line in lines:
            print(f"example {kind}: {line}")
    gaps = {k.split(":", 1)[1]: v for k, v in sorted(total.items()) if k.startswith("known_gap:")}
    print(json.dumps({"mutants": args.cases, "modes": list(modes), "seed": args.seed, "seconds": round(secs, 1),
                      "spark_runs": runner.runs, **{c: total[c] for c in COLUMNS}, "known_gaps": gaps}))
    return 1 if any(total[c] for c in GATED) else 0


__all__ = ["CLASSES", "DAMAGE_FLAGS", "KNOWN_GAPS", "campaign", "judge", "known_gap", "main"]
