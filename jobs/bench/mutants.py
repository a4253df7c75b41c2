"""Mutation classes and the verdict on one case of ``txlog-bench fuzz`` (driver: ``jobs/bench/fuzz.py``).

Mutation classes: ``bitflip`` (1-8 bits), ``truncate`` (at a unit/record boundary, inside a header, inside a
body, or at a random JSON character), ``zero_page`` (one 4 KiB page, 512 B for small files), ``random_block``
(1 B - 4 KiB of random bytes), ``json_garbage`` (config only: syntax breakage, non-UTF-8, deep nesting, huge
numbers, empty file), ``stray_file`` (a junk-named file, a dotfile, a directory, or a 20-digit file of random
size), ``missized_file`` (the file cut or extended to a length that is not the queue's), ``duplicate_file``
(the file copied to the next or an overlapping offset name).

Per case, compared with the unmutated copy decoded the same way:

* clean error: a ``txlog_io.errors.TxlogError`` left the API (allowed: a usage-level refusal, one line);
* uncaught exception: anything else left the API (a bug);
* hang: the case did not finish within ``--timeout`` seconds in the worker process (killed, a bug);
* anomalies reported: at least one finding (kind, file, position) the original did not have;
* intact record lost: a record (CommitLog record, CQ/redolog/statetable unit, checkpoint) whose byte range
  ``[position, position + size)`` in the original file does not intersect any mutated byte range, lies inside
  the mutant file, and decoded in the original, but is missing or decodes differently in the mutant.  For a
  config JSON (no record framing): when the mutated main file no longer parses, the entries of the (intact)
  ``.bak`` must be returned; when the ``.bak`` was mutated, the main file's entries must be;
* damage not reported: the decoded records differ from the original's (a record missing or added) and no new
  finding was reported;
* undetectable: no new finding, and either the only differences are field values of records at the same
  positions inside the mutated bytes (no checksum covers those bytes: CQ / statetable / redolog units,
  checkpoint, CommitLog header fields outside the body CRC, JSON values), or a unit file lost only its last
  records, all inside the damage (zeroed or cut at a record boundary: it reads exactly like a valid shorter
  file), or a config JSON that still parses.  No decoder can see either alone; the audit cross-checks
  consume queues against the CommitLog;
* duplicate reports: the same finding (kind, file, position) reported more than once.
"""
from __future__ import annotations

import random
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

MUTATIONS = ("bitflip", "truncate", "zero_page", "random_block", "json_garbage", "stray_file",
             "missized_file", "duplicate_file")
KINDS = ("commitlog", "consumequeue", "statetable", "redolog", "checkpoint", "config")
UNIT = {"consumequeue": 20, "redolog": 20, "statetable": 24}
MAPPED = ("commitlog", "consumequeue", "statetable", "redolog")
COLUMNS = ("cases", "clean_errors", "anomalies_reported", "uncaught_exceptions", "hangs",
           "intact_records_lost", "damage_not_reported", "undetectable", "duplicate_reports")


@dataclass(frozen=True)
class Target:
    kind: str
    path: str              # the corpus copy (never an original store file)
    label: str             # store / relative path, for reports
    topic: str = ""
    queue_id: int = 0
    data_end: int = 0      # bytes up to the last non-zero byte
    commitlog: tuple = ()  # the store's txlog_io.unitchain.CommitLogBounds (its CommitLog file listing)


# ------------------------------------------------------------------------------------------------ mutations
JSON_GARBAGE = (b"{", b"}", b"]]]", b"\"", b"'", b",,", b":", b"\xff\xfe", b"\x00", b"NaN", b"1e99999",
                b"99999999999999999999999999", b"[" * 5000, b"{\"a\":" * 3000, b"\\u12", b"/*",
                "\ufeff".encode())


@dataclass
class Mutant:
    cls: str
    damaged: List[Tuple[str, int, int]] = field(default_factory=list)   # (file, start, end) in the original
    note: str = ""


def _boundaries(t: Target, data: bytes, rng: random.Random) -> List[int]:
    if t.kind in UNIT:
        u = UNIT[t.kind]
        return list(range(0, len(data) + 1, u))
    if t.kind == "commitlog":
        b, p = [0], 0
        while p + 8 <= t.data_end:
            size = int.from_bytes(data[p:p + 4], "big", signed=True)
            if size <= 0 or p + size > len(data):
                break
            p += size
            b.append(p)
        return b
    return list(range(0, len(data) + 1, 8))


def mutate(t: Target, case_dir: Path, rng: random.Random, cls: str) -> Mutant:
    """Write the case directory for ``cls`` applied to ``t``; returns what was damaged."""
    src = Path(t.path)
    name = src.name
    case_dir.mkdir(parents=True)
    data = bytearray(src.read_bytes())
    bak = src.with_name(name + ".bak")
    if t.kind == "config" and bak.is_file():
        shutil.copyfile(bak, case_dir / bak.name)
    (case_dir / name).write_bytes(bytes(data))      # the untouched file; overwritten below when mutated
    m = Mutant(cls)
    size = len(data)
    hot = max(t.data_end, 1)
    target_name = name
    if t.kind == "config" and bak.is_file() and rng.random() < 0.25:
        target_name = bak.name                        # damage the .bak instead; the main file stays intact
        data = bytearray((case_dir / bak.name).read_bytes())
        size, hot = len(data), max(len(data), 1)
    if cls == "bitflip":
        for _ in range(rng.randint(1, 8)):
            pos = rng.randrange(hot) if size and rng.random() < 0.8 else rng.randrange(max(size, 1))
            if pos < size:
                data[pos] ^= 1 << rng.randrange(8)
                m.damaged.append((target_name, pos, pos + 1))
    elif cls == "truncate":
        b = _boundaries(t, bytes(data), rng) if target_name == name else [0, size]
        how = rng.choice(("boundary", "header", "body", "random"))
        base = rng.choice(b) if b else 0
        new = {"boundary": base, "header": base + rng.randint(1, 19),
               "body": base + rng.randint(20, 400), "random": rng.randrange(size + 1)}[how]
        new = max(0, min(new, size))
        m.damaged.append((target_name, new, size))
        m.note = how
        del data[new:]
    elif cls == "zero_page":
        page = 4096 if size > 16384 else 512
        start = (rng.randrange(hot) // page) * page if size else 0
        end = min(start + page, size)
        data[start:end] = bytes(end - start)
        m.damaged.append((target_name, start, end))
    elif cls == "random_block":
        n = rng.randint(1, min(4096, max(size, 1)))
        start = rng.randrange(max(min(hot, size - n + 1), 1))
        data[start:start + n] = rng.randbytes(n)
        m.damaged.append((target_name, start, start + n))
    elif cls == "json_garbage":
        piece = rng.choice(JSON_GARBAGE)
        start = rng.randrange(size + 1)
        end = min(size, start + rng.randint(0, 16))
        if rng.random() < 0.1:
            start, end, piece = 0, size, b""
        data[start:end] = piece
        m.damaged.append((target_name, start, max(end, start + 1)))
    elif cls == "stray_file":
        choice = rng.choice(("junk", "dot", "dir", "offset"))
        if choice == "junk":
            junk = rng.choice(("core.1234", "00000000000000000000.bak", "0000001", "x.tmp"))
            (case_dir / junk).write_bytes(rng.randbytes(rng.randint(0, 8192)))
        elif choice == "dot":
            (case_dir / ".nfs0001").write_bytes(rng.randbytes(100))
        elif choice == "dir":
            (case_dir / f"{int(name) + 10 ** 9 if name.isdigit() else 0:020d}").mkdir()
        else:
            base = int(name) if name.isdigit() else 0
            stray = f"{base + max(size, 1) * rng.randint(2, 5):020d}"
            (case_dir / stray).write_bytes(rng.randbytes(rng.randint(0, 3000)))
        m.note = choice
    elif cls == "missized_file":
        if rng.random() < 0.5 and size:
            new = rng.randrange(size)
            m.damaged.append((target_name, new, size))
            del data[new:]
        else:
            extra = rng.randint(1, 5000)
            data += bytes(extra) if rng.random() < 0.5 else rng.randbytes(extra)
    elif cls == "duplicate_file":
        if name.isdigit():
            base = int(name)
            unit = UNIT.get(t.kind, 1)
            step = size if rng.random() < 0.5 else max(unit, (size // 2) // unit * unit)
            (case_dir / f"{base + step:020d}").write_bytes(bytes(data))
            m.note = "next" if step == size else "overlap"
        else:
            (case_dir / (name + ".copy")).write_bytes(bytes(data))
    (case_dir / target_name).write_bytes(bytes(data))
    return m


# ------------------------------------------------------------------------------------------------ judging
def _touched(span: tuple, name: str, damaged: List[Tuple[str, int, int]]) -> bool:
    lo, hi = span
    return any(f == name and s < hi and lo < e for f, s, e in damaged)


def judge(t: Target, m: Mutant, orig: dict, status: str, payload, mutant_size: Dict[str, int],
          bak_rows: Optional[dict]) -> Counter:
    c = Counter(cases=1)
    if status == "clean":
        c["clean_errors"] += 1
        return c
    if status == "uncaught":
        c["uncaught_exceptions"] += 1
        return c
    if status == "hang":
        c["hangs"] += 1
        return c
    name = Path(t.path).name
    rows, anomalies = payload["rows"], payload["anomalies"]
    before = Counter(orig["anomalies"])
    after = Counter(anomalies)
    new = after - before
    if new:
        c["anomalies_reported"] += 1
    if any(n > 1 for n in after.values()):
        c["duplicate_reports"] += 1
    target_rows = {k: v for k, v in orig["rows"].items() if k[0] == name}
    lost = 0
    if t.kind == "config":
        main_broken = any(f == name for f, _, _ in m.damaged) and any(
            k == "BAD_JSON" and f == name for k, f, _ in anomalies)
        damaged_bak = any(f.endswith(".bak") for f, _, _ in m.damaged)
        expect = None
        if damaged_bak:
            expect = target_rows
        elif main_broken and bak_rows is not None:
            expect = {(name, k[1]): v for k, v in bak_rows.items()}
        if expect is not None:
            got = {k[1]: v[2] for k, v in rows.items()}
            lost = sum(1 for k, v in expect.items() if got.get(k[1]) != v[2])
    else:
        limit = mutant_size.get(name, 0)
        for key, (lo, hi, value) in target_rows.items():
            if hi > limit or _touched((lo, hi), name, m.damaged):
                continue
            got = rows.get(key)
            if got is None or got[2] != value:
                lost += 1
    if lost:
        c["intact_records_lost"] += 1
    orig_keys, new_keys = set(orig["rows"]), set(rows)
    structural = orig_keys != new_keys
    values = any(rows[k][2] != orig["rows"][k][2] for k in orig_keys & new_keys)
    if not new:
        if structural and not _indistinguishable(t, m, orig["rows"], rows, anomalies, name):
            c["damage_not_reported"] += 1
        elif structural or values:
            c["undetectable"] += 1
    return c


def _indistinguishable(t: Target, m: Mutant, before: dict, after: dict, anomalies: list, name: str) -> bool:
    """A structural difference no decoder can see alone: a mapped file that lost only its last records, all
    inside the damage, and gained none (zeroed or cut at a record boundary from some point on: it reads
    exactly like a valid shorter file); a config file that still parses (JSON has no checksum: a flipped key
    is a different, valid key)."""
    if t.kind == "config":
        return not any(k == "BAD_JSON" for k, _f, _p in anomalies)
    if t.kind not in MAPPED or set(after) - set(before):
        return False
    missing = sorted(k[1] for k in set(before) - set(after))
    kept = [k[1] for k in after if k[0] == name]
    if not missing or (kept and max(kept) > missing[0]):
        return False
    return all(_touched(before[(name, p)][:2], name, m.damaged) for p in missing)


def _classes_for(kind: str) -> Tuple[str, ...]:
    if kind == "config":
        return ("bitflip", "truncate", "random_block", "json_garbage", "json_garbage", "missized_file")
    if kind == "checkpoint":
        return ("bitflip", "truncate", "zero_page", "random_block", "missized_file", "stray_file")
    return tuple(c for c in MUTATIONS if c != "json_garbage")

