"""``txlog-bench fuzz``: mutate real store files, drive every decoder on the mutants, count what happened.

    txlog-bench fuzz [--cases N] [--seed S] [--timeout SECONDS] [--no-refbroker] [--kinds k1,k2] [--work DIR]
    txlog-bench fuzz --audit ...   whole-store mutants audited in both modes (jobs/bench/fuzz_audit.py)

Corpus: copies of the files of the real-broker fixtures (tests/data/fixtures/*/store) and, unless
``--no-refbroker``, of small reference-broker stores (3.x, 4.6-4.9, 5.1+ profiles, scenario ``crashy``)
generated into the work directory.  Originals are never opened for writing: every file is copied first and
CommitLog files are cropped to their data plus one page (so a case costs milliseconds, not a 1 GiB copy).

Decoders driven (``kind``): ``commitlog`` (txlog_io.commitlog_decode.decode_file, CRC checks on),
``consumequeue`` / ``statetable`` / ``redolog`` (txlog_io.consumequeue), ``checkpoint``
(txlog_io.config.decode_checkpoint), ``config`` (read_consumer_offsets / read_topics / read_delay_offsets with
their ``.bak``), and for every mapped-file kind the directory listing checks (txlog_io.mappedfile
.list_mapped_files) over the case directory.

Mutation classes and how a case is judged: ``jobs/bench/mutants.py``.  Lives in ``jobs``, above
``txlog_io`` (the decoders it drives) and ``refbroker`` (the stores it generates): the lowest layer never
imports the reference broker.

The last line printed is a JSON object with the totals; ``--table-md`` also prints a Markdown table.
"""
from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from jobs.bench.mutants import (  # noqa: F401
    COLUMNS,
    KINDS,
    MAPPED,
    MUTATIONS,
    UNIT,
    Mutant,
    Target,
    _classes_for,
    judge,
    mutate,
)
from txlog_io.errors import TxlogError

ROOT = Path(__file__).resolve().parents[2]        # the repository: jobs/bench/fuzz.py
FIXTURES = ROOT / "tests" / "data" / "fixtures"
CONFIG_READERS = {"consumerOffset.json": "read_consumer_offsets", "topics.json": "read_topics",
                  "delayOffset.json": "read_delay_offsets"}
REFBROKER_PROFILES = ("3.x", "4.6-4.9", "5.1+")


# ------------------------------------------------------------------------------------------------ decoding
def _rows_commitlog(path: str):
    from txlog_io.commitlog_decode import decode_file

    rows, anomalies = {}, []
    for batch, found in decode_file(path, verify_crc=True):
        anomalies.extend(found)
        cols = [c for c in batch.schema.names if c != "file"]
        data = batch.select(cols).to_pylist()
        for r in data:
            p = r["file_position"]
            rows[p] = (p, p + r["total_size"], repr(sorted(r.items())))
    return rows, anomalies


def _rows_units(kind: str, path: str, topic: str, queue_id: int):
    from txlog_io import consumequeue as cq

    rows, anomalies = {}, []
    unit = UNIT[kind]
    base = int(Path(path).name)
    if kind == "consumequeue":
        it = cq.decode_consumequeue(path, topic=topic or "T", queue_id=queue_id)
    elif kind == "statetable":
        it = cq.decode_statetable(path)
    else:
        it = cq.decode_redolog(path)
    for batch, found in it:
        anomalies.extend(found)
        for r in batch.to_pylist():
            p = r["file_position"] if kind == "consumequeue" else r["index"] * unit - base
            r.pop("file", None)
            rows[p] = (p, p + unit, repr(sorted(r.items())))
    return rows, anomalies


def _rows_checkpoint(path: str):
    from txlog_io.config import decode_checkpoint

    d = decode_checkpoint(path)
    anomalies = d.pop("anomalies")
    return {0: (0, d["variant"], repr(sorted(d.items())))}, anomalies


def _rows_config(path: str):
    from txlog_io import config as cfg

    reader = getattr(cfg, CONFIG_READERS[Path(path).name])
    result, anomalies = reader(path)
    if isinstance(result, dict):
        items = {str(k): repr(v) for k, v in result.items()}
    else:
        items = {f"{r['topic']}@{r['group']}#{r['queue_id']}": repr(r["offset"]) for r in result}
    return {k: (None, None, v) for k, v in items.items()}, anomalies


def decode_case(kind: str, directory: str, target_name: str, topic: str, queue_id: int,
                commitlog: tuple = ()) -> dict:
    """Run every decoder of ``kind`` over the case directory; rows keyed by (file name, record key).
    ``commitlog``: the store's ``CommitLogBounds`` for the unit-chain check, as the audit passes them."""
    from txlog_io.mappedfile import is_offset_name, list_mapped_files

    rows: Dict[tuple, tuple] = {}
    anomalies: list = []
    if kind in MAPPED:
        files, found = list_mapped_files(directory, source=kind)
        anomalies.extend(found)
        if kind in UNIT:
            from txlog_io.unitchain import CommitLogBounds, check_unit_chain

            bounds = CommitLogBounds(*commitlog) if commitlog else None
            anomalies.extend(check_unit_chain(files, kind, bounds=bounds))
        names = sorted(n for n in os.listdir(directory) if is_offset_name(n)
                       and os.path.isfile(os.path.join(directory, n)))
    else:
        names = [target_name]
    for name in names:
        path = os.path.join(directory, name)
        if kind == "commitlog":
            r, a = _rows_commitlog(path)
        elif kind in UNIT:
            r, a = _rows_units(kind, path, topic, queue_id)
        elif kind == "checkpoint":
            r, a = _rows_checkpoint(path)
        else:
            r, a = _rows_config(path)
        anomalies.extend(a)
        rows.update({(name, k): v for k, v in r.items()})
    keys = [(a.kind, os.path.basename(a.file), int(a.position)) for a in anomalies]
    return {"rows": rows, "anomalies": keys}


def _decode_safely(job: tuple) -> Tuple[str, object]:
    try:
        return "ok", decode_case(*job)
    except TxlogError as e:
        return "clean", f"{type(e).__name__}: {e}"
    except BaseException as e:  # noqa: BLE001 - the point is to count them
        return "uncaught", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}"


def _worker(conn) -> None:
    """Decodes in the worker process, and judges there too, so only a small verdict crosses the pipe.

    Messages: ``("remember", key, job)`` decodes an unmutated copy and keeps its result under ``key``;
    ``("case", job, target, mutant, sizes)`` decodes a mutant and returns ``judge``'s counters; ``None``
    ends."""
    kept: Dict[str, dict] = {}
    while True:
        msg = conn.recv()
        if msg is None:
            return
        if msg[0] == "remember":
            status, payload = _decode_safely(msg[2])
            if status == "ok":
                kept[msg[1]] = payload
            conn.send((status, None if status == "ok" else payload))
            continue
        _, job, t, m, sizes = msg
        status, payload = _decode_safely(job)
        c = judge(t, m, kept[t.path], status, payload, sizes, (kept.get(t.path + ".bak") or {}).get("rows"))
        conn.send((status, (dict(c), None if status == "ok" else str(payload)[:400])))


class Runner:
    """One worker process; a case that does not answer within ``timeout`` is a hang and costs the worker."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.ctx = mp.get_context("fork")
        self.proc = None
        self.memory: List[tuple] = []         # "remember" messages, replayed into a restarted worker
        self._start()

    def remember(self, key: str, job: tuple) -> Tuple[str, object]:
        """Decode an unmutated copy in the worker and keep the result there under ``key``."""
        status, payload, _ = self.run(("remember", key, job))
        if status == "ok":
            self.memory.append(("remember", key, job))
        return status, payload

    def case(self, t: "Target", case_dir: Path, m: "Mutant") -> Tuple[Counter, Optional[str], float]:
        """Decode and judge one case directory; (counters, error text, seconds)."""
        sizes = {p.name: p.stat().st_size for p in case_dir.iterdir() if p.is_file()}
        job = (t.kind, str(case_dir), Path(t.path).name, t.topic, t.queue_id, t.commitlog)
        status, payload, secs = self.run(("case", job, t, m, sizes))
        if status == "hang":
            return Counter(cases=1, hangs=1), f"no answer within {self.timeout} s", secs
        if not isinstance(payload, tuple):                      # the worker died
            return Counter(cases=1, uncaught_exceptions=1), str(payload), secs
        return Counter(payload[0]), payload[1], secs

    def _start(self):
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=_worker, args=(child,), daemon=True)
        self.proc.start()
        child.close()

    def run(self, job: tuple) -> Tuple[str, object, float]:
        t0 = time.monotonic()
        self.conn.send(job)
        if self.conn.poll(self.timeout):
            try:
                status, payload = self.conn.recv()
            except EOFError:
                status, payload = "uncaught", "worker died"
                self._restart()
            return status, payload, time.monotonic() - t0
        self._restart()
        return "hang", None, time.monotonic() - t0

    def _restart(self):
        self.proc.kill()
        self.proc.join(5)
        self._start()
        for msg in self.memory:
            self.conn.send(msg)
            self.conn.recv()

    def close(self):
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


# ------------------------------------------------------------------------------------------------ corpus
def _data_end(path: Path) -> int:
    data = path.read_bytes()
    stripped = data.rstrip(b"\0")
    return len(stripped)


def _copy(src: Path, dst: Path, limit: Optional[int] = None) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as f:
        data = f.read() if limit is None else f.read(limit)
    dst.write_bytes(data)


def build_corpus(work: Path, stores: List[Tuple[str, Path]]) -> List[Target]:
    """Copy every decodable file of ``stores`` into ``work/corpus`` and describe it."""
    from txlog_io.mappedfile import discover_store
    from txlog_io.unitchain import commitlog_bounds

    targets: List[Target] = []

    def store_add(dst_root: Path, label: str, bounds: tuple, kind, src: Path, rel: str, limit=None, **kw):
        dst = dst_root / rel
        _copy(src, dst, limit)
        targets.append(Target(kind, str(dst), f"{label}/{rel}", data_end=_data_end(dst), commitlog=bounds,
                              **kw))

    for label, root in stores:
        layout = discover_store(root)
        dst_root = work / "corpus" / label
        bounds = tuple(commitlog_bounds(layout))
        add = functools.partial(store_add, dst_root, label, bounds)

        for mf in layout.commitlog[:2]:
            end = _data_end(mf.path)
            crop = min(mf.size, -(-(end + 4096) // 4096) * 4096)      # the data and one page of its tail
            add("commitlog", mf.path, f"commitlog/{mf.name}", limit=crop)
        def unit_crop(mf, unit):
            # the units written plus one page of unwritten ones (a 6 MB queue file is mostly zeros)
            end = _data_end(mf.path)
            return min(mf.size, -(-(end + 4096) // unit) * unit)

        for (topic, qid), files in sorted(layout.consume_queues.items()):
            for mf in files[:1]:
                add("consumequeue", mf.path, f"consumequeue/{topic}/{qid}/{mf.name}", topic=topic,
                    queue_id=qid, limit=unit_crop(mf, UNIT["consumequeue"]))
        for kind in ("statetable", "redolog"):
            for mf in getattr(layout, kind)[:2]:
                add(kind, mf.path, f"{kind}/{mf.name}", limit=unit_crop(mf, UNIT[kind]))
        if layout.checkpoint_path:
            add("checkpoint", Path(layout.checkpoint_path), "checkpoint/checkpoint")
        for attr in ("consumer_offset_path", "topics_path", "delay_offset_path"):
            p = getattr(layout, attr)
            if p is None:
                continue
            main = Path(p)
            rel = f"config-{main.stem}/{main.name}"
            bak = main.with_name(main.name + ".bak")
            if bak.is_file():
                _copy(bak, dst_root / (rel + ".bak"))
            if main.is_file():
                add("config", main, rel)
    return targets


def refbroker_stores(work: Path, transactions: int = 40) -> List[Tuple[str, Path]]:
    from refbroker.generate import generate

    out = []
    for profile in REFBROKER_PROFILES:
        d = work / f"refbroker-{profile}"
        store = d / "store"
        if not (store / "commitlog").is_dir():
            generate(profile, "crashy", transactions, 7, d, commitlog_file_size=256 * 1024,
                     cq_file_units=300, statetable_file_size=2400, redolog_file_size=4000)
        out.append((f"refbroker-{profile}", store))
    return out


def fixture_stores() -> List[Tuple[str, Path]]:
    return [(p.name, p / "store") for p in sorted(FIXTURES.iterdir()) if (p / "store" / "commitlog").is_dir()]


# ------------------------------------------------------------------------------------------------ campaign

def remember_all(runner: Runner, targets: List[Target], scratch: Path) -> None:
    """Decode every unmutated corpus file (and a config's ``.bak`` as if it were the main file) once."""
    for i, t in enumerate(targets):
        name = Path(t.path).name
        d = scratch / str(i)
        d.mkdir(parents=True)
        shutil.copyfile(t.path, d / name)
        status, payload = runner.remember(t.path, (t.kind, str(d), name, t.topic, t.queue_id, t.commitlog))
        if status != "ok":
            raise RuntimeError(f"the unmutated copy of {t.label} does not decode: {payload}")
        bak = Path(t.path + ".bak")
        if t.kind == "config" and bak.is_file():
            db = scratch / f"{i}-bak"
            db.mkdir(parents=True)
            shutil.copyfile(bak, db / name)
            runner.remember(t.path + ".bak", (t.kind, str(db), name, t.topic, t.queue_id))
        # the copies stay: a worker replaced after a hang decodes them again


def campaign(targets: List[Target], cases: int, seed: int, timeout: float, scratch: Path,
             progress: bool = True, examples: Optional[dict] = None,
             replay: Optional[set] = None, keep: Optional[Path] = None) -> Tuple[dict, dict, float]:
    """``replay``: only these case numbers are decoded and judged (each printed, its directory copied to
    ``keep/c<case>``); the others are still mutated, because a case's random stream depends on every case
    before it."""
    rng = random.Random(seed)
    by_class: Dict[str, Counter] = defaultdict(Counter)
    by_kind: Dict[str, Counter] = defaultdict(Counter)
    examples = examples if examples is not None else {}
    runner = Runner(timeout)
    max_case_s = 0.0
    t_start = time.monotonic()
    try:
        remember_all(runner, targets, scratch / "orig")
        for i in range(cases):
            t = rng.choice(targets)
            cls = rng.choice(_classes_for(t.kind))
            case_dir = scratch / f"c{i}"
            m = mutate(t, case_dir, rng, cls)
            if replay is not None and i not in replay:
                shutil.rmtree(case_dir, ignore_errors=True)
                continue
            c, error, secs = runner.case(t, case_dir, m)
            if replay is not None:
                verdict = {k: v for k, v in c.items() if v}
                print(f"case {i}: {t.label} {cls}({m.note}) damaged={m.damaged[:3]} {verdict}"
                      + (f": {error[:300]}" if error else ""), flush=True)
                if keep is not None:
                    shutil.rmtree(keep / f"c{i}", ignore_errors=True)
                    shutil.copytree(case_dir, keep / f"c{i}")
            max_case_s = max(max_case_s, secs)
            by_class[cls].update(c)
            by_kind[t.kind].update(c)
            for col in ("uncaught_exceptions", "hangs", "intact_records_lost", "damage_not_reported"):
                if c[col] and len(examples.setdefault((t.kind, cls, col), [])) < 3:
                    examples[(t.kind, cls, col)].append(
                        f"{t.label} {cls}({m.note}) damaged={m.damaged[:3]} seed={seed} case={i}"
                        + (f": {error[:300]}" if error else ""))
            shutil.rmtree(case_dir, ignore_errors=True)
            if progress and (i + 1) % 5000 == 0:
                print(f"fuzz: {i + 1}/{cases} cases, {time.monotonic() - t_start:.0f} s", file=sys.stderr,
                      flush=True)
    finally:
        runner.close()
    return by_class, by_kind, max_case_s


def format_table(title: str, rows: Dict[str, Counter], markdown: bool = False) -> str:
    heads = ("class",) + COLUMNS
    body = [[k] + [str(rows[k][c]) for c in COLUMNS] for k in sorted(rows)]
    total = Counter()
    for r in rows.values():
        total.update(r)
    body.append(["TOTAL"] + [str(total[c]) for c in COLUMNS])
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(heads)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([title, fmt.format(*heads)] + [fmt.format(*r) for r in body])


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--audit" in argv:                   # whole stores, audited (jobs/bench/fuzz_audit.py)
        from jobs.bench.fuzz_audit import main as audit_main

        return audit_main(argv)
    p = argparse.ArgumentParser(prog="txlog-bench fuzz",
                                description="mutation fuzzing of every store decoder")
    p.add_argument("--cases", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it counts as a hang")
    p.add_argument("--no-refbroker", action="store_true", help="fixtures only (no reference-broker stores)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    p.add_argument("--work", help="work directory (default: a temporary one, removed afterwards)")
    p.add_argument("--table-md", action="store_true", help="also print the tables as Markdown")
    p.add_argument("--replay", help="comma-separated case numbers: judge only these cases of --seed (the "
                   "cases before them are mutated but not decoded), print each verdict and keep its "
                   "directory under <work>/replay (use with --work)")
    args = p.parse_args(argv)
    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if args.cases < 1 or not kinds <= set(KINDS):
        p.error(f"--cases must be >= 1 and --kinds a subset of {','.join(KINDS)}")
    try:
        replay = None if args.replay is None else {int(x) for x in args.replay.split(",") if x.strip()}
    except ValueError:
        p.error(f"--replay takes comma-separated case numbers, got {args.replay!r}")
    if replay:
        args.cases = max(replay) + 1
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="txlog-fuzz-"))
    scratch_base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    scratch = Path(tempfile.mkdtemp(prefix="txlog-fuzz-cases-", dir=scratch_base))
    try:
        stores = fixture_stores() + ([] if args.no_refbroker else refbroker_stores(work))
        if (work / "corpus").exists():
            shutil.rmtree(work / "corpus")
        targets = [t for t in build_corpus(work, stores) if t.kind in kinds]
        t0 = time.monotonic()
        examples: dict = {}
        by_class, by_kind, max_case = campaign(targets, args.cases, args.seed, args.timeout, scratch,
                                               examples=examples, replay=replay, keep=work / "replay")
        secs = time.monotonic() - t0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    kinds_found = Counter(t.kind for t in targets)
    listing = ", ".join(f"{k} {n}" for k, n in sorted(kinds_found.items()))
    print(f"corpus: {len(targets)} files from {len(stores)} stores ({listing}); "
          f"{args.cases} cases in {secs:.0f} s")
    print(format_table("per mutation class", by_class))
    print()
    print(format_table("per decoder", by_kind))
    if args.table_md:
        print()
        print(format_table("per mutation class", by_class, markdown=True))
        print()
        print(format_table("per decoder", by_kind, markdown=True))
    for (kind, cls, col), lines in sorted(examples.items()):
        for line in lines:
            print(f"example {col} [{kind}/{cls}]: {line}")
    total = Counter()
    for r in by_class.values():
        total.update(r)
    print(json.dumps({"cases": args.cases, "seed": args.seed, "seconds": round(secs, 1),
                      "max_case_seconds": round(max_case, 2), "files": len(targets),
                      **{c: total[c] for c in COLUMNS}}))
    return 0


if __name__ == "__main__":
    from txlog_io import process_exit

    process_exit.run(main)
