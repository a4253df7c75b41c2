"""Whole-store mutants for ``txlog-bench fuzz --audit`` (driver: ``jobs/bench/fuzz_audit.py``).

A *source* is a pristine copy of a store in the campaign's work directory (never a fixture itself).  Its
CommitLog is decoded once (``txlog_io.commitlog_decode`` / ``txlog_io.dledger``, the audit's own decoders) to
place the transactional records: ``half`` (a 4.3+ half record, or a 3.x / 4.0-4.2 PREPARED record),
``commit`` (a COMMIT or ROLLBACK end record), ``op`` (a 4.3+ op record).  A mutant is a directory mirroring
the source with every file hard-linked to it but the one mutated file, which is written anew (so the source
copy is never changed and a mutant costs one file's bytes).

Mutation classes (``AIMED``: at a transactional record or queue; ``RANDOM``: anywhere):

* ``cut_in_<role>`` / ``cut_after_<role>``: the record's CommitLog file cut inside the record / right after it
  (later files intact);
* ``zero_<role>``: the record's bytes zeroed;
* ``tear_half_cq`` / ``tear_op_cq`` / ``tear_real_cq``: the half / op / a COMMIT record's real-topic consume
  queue cut mid-unit, cut at a unit boundary, or one run of units zeroed;
* ``tear_statetable`` / ``tear_redolog`` (3.x): the same on the transaction statetable / redolog;
* ``random_bitflip`` / ``random_zero_page`` / ``random_block`` / ``random_truncate``: 1-8 flipped bits, a
  zeroed 4 KiB page, 1 B - 4 KiB of random bytes, a cut at a random byte, in a random CommitLog file (two
  times in three) or transaction queue / table file, inside its written bytes.

``Mutant.damaged`` lists the mutated byte ranges as (file relative to the store root, start, end) in the
source's file: the oracle's notion of an *intact* record is one whose bytes intersect none of them.
"""
from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from txlog_io.commitlog_layout import HALF_TOPIC, OP_TOPIC

ROLES = ("half", "commit", "op")
AIMED = tuple(f"{how}_{role}" for how in ("cut_in", "cut_after", "zero") for role in ROLES) + (
    "tear_half_cq", "tear_op_cq", "tear_real_cq", "tear_statetable", "tear_redolog")
RANDOM = ("random_bitflip", "random_zero_page", "random_block", "random_truncate")
CLASSES = AIMED + RANDOM
CQ_UNIT = 20
TABLE_UNIT = {"statetable": 24, "redolog": 20}


@dataclass(frozen=True)
class TxRecord:
    role: str                 # half, commit or op
    file: str                 # relative to the store root
    pos: int                  # file position of the record
    size: int
    physical_offset: int
    topic: str
    queue_id: int
    frame: int = 0            # bytes before ``pos`` that frame the record (a DLedger entry's header)


@dataclass
class Source:
    label: str                # also the broker name of its intact audit (prefixed)
    root: Path                # the pristine copy
    log_kind: str             # file or dledger
    records: List[TxRecord] = field(default_factory=list)
    halves: Dict[int, TxRecord] = field(default_factory=dict)   # physical offset -> half / prepared record
    queues: Dict[str, List[str]] = field(default_factory=dict)  # half / op / real -> consume-queue files
    tables: Dict[str, List[str]] = field(default_factory=dict)  # statetable / redolog -> files
    log_files: List[str] = field(default_factory=list)          # CommitLog / DLedger data files

    def classes(self) -> Tuple[str, ...]:
        """The classes that have a target in this store."""
        have = {r.role for r in self.records}
        out = [c for c in AIMED[:9] if c.rsplit("_", 1)[1] in have]
        out += [f"tear_{q}_cq" for q in ("half", "op", "real") if self.queues.get(q)]
        out += [f"tear_{t}" for t in ("statetable", "redolog") if self.tables.get(t)]
        return tuple(out) + RANDOM


@dataclass
class Mutant:
    name: str                 # the broker name of its audit
    source: str               # Source.label
    cls: str
    root: Path
    damaged: List[Tuple[str, int, int]] = field(default_factory=list)
    note: str = ""

    def describe(self) -> str:
        """One line for a campaign's examples: the first two damaged ranges, and how many more there are."""
        more = f" +{len(self.damaged) - 2} more" if len(self.damaged) > 2 else ""
        return f"{self.name} {self.source} {self.cls}({self.note}) damaged={self.damaged[:2]}{more}"


def _rel(root: Path, p) -> str:
    return str(Path(p).relative_to(root))


def load_source(label: str, root: Path) -> Source:
    """Decode the CommitLog of the pristine copy ``root`` and place its transactional records and queues."""
    from txlog_io import commitlog_decode, dledger
    from txlog_io.mappedfile import discover_store

    layout = discover_store(root)
    kind = "dledger" if layout.dledger_dir is not None else "file"
    src = Source(label, root, kind)
    real: Dict[Tuple[str, int], int] = {}
    for mf in layout.commitlog:
        rel = _rel(root, mf.path)
        src.log_files.append(rel)
        in_entries = dledger.is_dledger_data_file(mf.path)
        decode = dledger.decode_file if in_entries else commitlog_decode.decode_file
        frame = dledger.ENTRY_HEADER_SIZE if in_entries else 0
        for batch, _found in decode(str(mf.path)):
            cols = ("file_position", "physical_offset", "total_size", "topic", "transaction_type", "queue_id")
            for r in batch.select(list(cols)).to_pylist():
                topic, tt = r["topic"], r["transaction_type"]
                role = ("half" if topic == HALF_TOPIC or tt == "PREPARED" else "op" if topic == OP_TOPIC
                        else "commit" if tt in ("COMMIT", "ROLLBACK") else None)
                if role is None:
                    continue
                rec = TxRecord(role, rel, int(r["file_position"]), int(r["total_size"]),
                               int(r["physical_offset"]), topic, int(r["queue_id"] or 0), frame)
                src.records.append(rec)
                if role == "half":
                    src.halves[rec.physical_offset] = rec
                elif role == "commit":
                    real[(topic, rec.queue_id)] = real.get((topic, rec.queue_id), 0) + 1
    for (topic, qid), files in layout.consume_queues.items():
        role = {HALF_TOPIC: "half", OP_TOPIC: "op"}.get(topic)
        if role is None and (topic, qid) in real:
            role = "real"
        if role is not None:
            src.queues.setdefault(role, []).extend(_rel(root, f.path) for f in files)
    for t in ("statetable", "redolog"):
        files = [_rel(root, f.path) for f in getattr(layout, t)]
        if files:
            src.tables[t] = files
    return src


def _mirror(src: Path, dst: Path) -> None:
    """``dst`` mirrors ``src``: directories made, files hard-linked (copied where links fail)."""
    for dirpath, _dirnames, filenames in os.walk(src):
        rel = os.path.relpath(dirpath, src)
        target = dst / rel if rel != "." else dst
        target.mkdir(parents=True, exist_ok=True)
        for f in filenames:
            try:
                os.link(os.path.join(dirpath, f), target / f)
            except OSError:
                shutil.copy2(os.path.join(dirpath, f), target / f)


def _written(data: bytes) -> int:
    return len(data.rstrip(b"\0"))


def _tear_units(data: bytearray, unit: int, rng: random.Random) -> Tuple[int, int, str, bool]:
    """Cut mid-unit, cut at a unit boundary, or zero a run of units: (start, end, note, cut)."""
    units = max(1, -(-_written(data) // unit))
    k = rng.randrange(units)
    how = rng.choice(("mid_unit", "boundary", "zero_units"))
    if how == "mid_unit":
        return k * unit + rng.randint(1, unit - 1), len(data), how, True
    if how == "boundary":
        return k * unit, len(data), how, True
    n = rng.randint(1, 8)
    return k * unit, min(len(data), (k + n) * unit), how, False


def mutate(src: Source, name: str, dst: Path, cls: str, rng: random.Random) -> Mutant:
    """Write the mutant ``dst`` of ``src`` for ``cls`` (one of ``src.classes()``)."""
    _mirror(src.root, dst)
    m = Mutant(name, src.label, cls, dst)
    if cls.startswith(("cut_", "zero_")):
        role = cls.rsplit("_", 1)[1]
        rec = rng.choice([r for r in src.records if r.role == role])
        rel = rec.file
        data = bytearray((src.root / rel).read_bytes())
        if cls.startswith("cut_in"):
            start, end, cut = rec.pos + rng.randint(1, max(1, rec.size - 1)), len(data), True
        elif cls.startswith("cut_after"):
            start, end, cut = rec.pos + rec.size, len(data), True
        else:
            start, end, cut = rec.pos, rec.pos + rec.size, False
        m.note = f"{rec.topic}@{rec.physical_offset}"
    elif cls.startswith("tear_"):
        what = cls[5:].replace("_cq", "")
        files = src.queues.get(what) or src.tables.get(what) or []
        rel = rng.choice(files)
        data = bytearray((src.root / rel).read_bytes())
        start, end, how, cut = _tear_units(data, TABLE_UNIT.get(what, CQ_UNIT), rng)
        m.note = f"{rel} {how}"
    else:
        pool = src.log_files if rng.random() < 2 / 3 else (
            [f for fs in src.queues.values() for f in fs] + [f for fs in src.tables.values() for f in fs]
            or src.log_files)
        rel = rng.choice(pool)
        data = bytearray((src.root / rel).read_bytes())
        hot = max(1, _written(data))
        cut = False
        if cls == "random_bitflip":
            pos = rng.randrange(hot)
            n = rng.randint(1, 8)
            for _ in range(n):
                p = min(len(data) - 1, pos + rng.randrange(64))
                data[p] ^= 1 << rng.randrange(8)
                m.damaged.append((rel, p, p + 1))
            start = end = -1
        elif cls == "random_zero_page":
            start = (rng.randrange(hot) // 4096) * 4096
            end = min(len(data), start + 4096)
        elif cls == "random_block":
            n = rng.randint(1, 4096)
            start = rng.randrange(hot)
            end = min(len(data), start + n)
            data[start:end] = rng.randbytes(end - start)
            m.damaged.append((rel, start, end))
            start = end = -1
        else:
            start, end, cut = rng.randrange(hot + 1), len(data), True
        m.note = rel
    if start >= 0:
        if cut:
            del data[start:]
        else:
            data[start:end] = bytes(end - start)
        m.damaged.append((rel, start, max(end, start + 1)))
    target = dst / rel
    target.unlink()                         # the hard link to the source copy: replaced, never written through
    target.write_bytes(bytes(data))
    return m


def intact(m: Mutant, rec: Optional[TxRecord]) -> bool:
    """Whether ``rec`` (a source record), with the bytes that frame it (a DLedger entry's header: a reader, like
    ``DLedgerMmapFileStore.recover``, cannot frame the record without it), lies outside every mutated byte range
    of ``m``."""
    if rec is None:
        return False
    start = rec.pos - rec.frame
    return not any(f == rec.file and s < rec.pos + rec.size and start < e for f, s, e in m.damaged)


__all__ = ["AIMED", "RANDOM", "CLASSES", "ROLES", "Mutant", "Source", "TxRecord", "intact", "load_source",
           "mutate"]
