"""DLedger store-level files and checks: index files, checkpoint / currterm text, the checks that span the
whole log (index units vs entries, contiguous indexes, entries past the committed index) and replicas of one
group.  Sources: dledger 0.3.1.2 store/file/DLedgerMmapFileStore.java (recover, loadCheckPoint,
persistCheckPoint, INDEX_UNIT_SIZE), entry/DLedgerEntryCoder.java (encodeIndex), MemberState.java (currterm),
utils/IOUtils.java (string2Properties).  The data-file codec is txlog_io/dledger.py; layout notes in
docs/dledger.md.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from txlog_io import readstats
from txlog_io.dledger import (
    CHECKPOINT_FILE,
    COMMITTED_INDEX_KEY,
    CURRTERM_FILE,
    END_INDEX_KEY,
    ENTRY_HEADER_SIZE,
    INDEX_UNIT,
    INDEX_UNIT_SIZE,
    MAGIC_1,
    SOURCE,
    _anomaly,
    is_dledger_data_file,
    scan_entries,
)
from txlog_io.errors import Anomaly, AnomalyKind
from txlog_io.storefs import as_path, is_remote


# ------------------------------------------------------------------------------------------------ index files
def decode_index(files: Sequence, *, unit_file_size: Optional[int] = None) -> tuple:
    """(units, anomalies) of the index file list (``MappedFile`` values in offset order).

    A unit is a dict (file, file_position, unit, magic, pos, size, index, term); all-zero units (the unused
    tail) are left out.  ``unit_file_size`` is only used to name gaps; callers infer it from the files."""
    units, anomalies = [], []
    for mf in files:
        data = _read_whole(mf.path) if mf.size else np.zeros(0, np.uint8)
        readstats.add(data.size, "dledger_index")
        whole = data.size - data.size % INDEX_UNIT_SIZE
        if whole != data.size:
            anomalies.append(_anomaly(AnomalyKind.FILE_SIZE_MISMATCH, mf.path, whole, mf.base_offset,
                                      "index file length is not a multiple of the 32-byte unit",
                                      "multiple of 32", data.size, "dledger_index"))
        rows = data[:whole].reshape(-1, INDEX_UNIT_SIZE)
        used = np.flatnonzero(rows.any(axis=1))
        for i in used.tolist():
            magic, pos, size, index, term = INDEX_UNIT.unpack_from(rows[i].tobytes())
            unit = (mf.base_offset + i * INDEX_UNIT_SIZE) // INDEX_UNIT_SIZE
            units.append({"file": str(mf.path), "file_position": i * INDEX_UNIT_SIZE, "unit": unit,
                          "magic": magic, "pos": pos, "size": size, "index": index, "term": term})
    return units, anomalies


def _read_whole(path) -> np.ndarray:
    """A whole file as bytes: ``np.fromfile`` locally, one GET of a remote file."""
    if not is_remote(path):
        return np.fromfile(str(path), np.uint8)
    return np.frombuffer(as_path(path).read_bytes(), np.uint8)


# ------------------------------------------------------------------------------------------------ text files
def read_properties_file(path) -> tuple:
    """(dict, anomalies, used path) of a DLedger ``key=value`` text file; falls back to ``.bak`` when the file
    is missing or unreadable (as the broker's IOUtils does), and says so."""
    p = as_path(path)
    anomalies = []
    for candidate in (p, p.with_name(p.name + ".bak")):
        if not candidate.is_file():
            continue
        try:
            raw = candidate.read_bytes()
            readstats.add(len(raw), "dledger_meta")
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            anomalies.append(_anomaly(AnomalyKind.BAD_CHECKPOINT, candidate, 0, 0, f"unreadable: {exc}",
                                      "UTF-8 key=value text", "unreadable"))
            continue
        values, bad = {}, []
        for lineno, line in enumerate(text.splitlines()):
            line = line.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep:
                bad.append(lineno)
                continue
            values[key.strip()] = value.strip()
        for lineno in bad:
            anomalies.append(_anomaly(AnomalyKind.BAD_CHECKPOINT, candidate, lineno, 0,
                                      f"line {lineno + 1} is not key=value", "key=value", "other text"))
        if candidate != p:
            anomalies.append(_anomaly(AnomalyKind.MISSING_FILE, p, 0, 0, f"{p.name} missing or unreadable; "
                                      f"read {candidate.name}", "the file", "missing"))
        return values, anomalies, candidate
    return None, anomalies, None


def read_checkpoint(dledger_dir) -> tuple:
    """({'committedIndex': int|None, 'endIndex': int|None}, anomalies) of ``dledger-<id>/checkpoint``."""
    path = as_path(dledger_dir) / CHECKPOINT_FILE
    values, anomalies, used = read_properties_file(path)
    out: dict = {COMMITTED_INDEX_KEY: None, END_INDEX_KEY: None}
    if values is None:
        anomalies.append(_anomaly(AnomalyKind.MISSING_FILE, path, 0, 0, "no DLedger checkpoint (nor .bak): "
                                  "the committed index is unknown", "committedIndex=N", "missing"))
        return out, anomalies
    for key in out:
        text = values.get(key)
        try:
            out[key] = int(text) if text is not None else None
        except ValueError:
            anomalies.append(_anomaly(AnomalyKind.BAD_CHECKPOINT, used, 0, 0, f"{key} is not a number",
                                      "a decimal long", text))
    return out, anomalies


def read_currterm(dledger_dir) -> tuple:
    """({'voteLeader': str|None, 'currTerm': int|None}, anomalies) of ``dledger-<id>/currterm``."""
    values, anomalies, used = read_properties_file(as_path(dledger_dir) / CURRTERM_FILE)
    values = values or {}
    term = values.get("currTerm")
    try:
        term = int(term) if term is not None else None
    except ValueError:
        anomalies.append(_anomaly(AnomalyKind.BAD_CHECKPOINT, used, 0, 0, "currTerm is not a number",
                                  "a decimal long", term))
        term = None
    return {"voteLeader": values.get("voteLeader"), "currTerm": term}, anomalies


# -------------------------------------------------------------------------------------------- store checks
def verify_dledger(layout) -> list:
    """Findings only the DLedger layout allows, for a ``StoreLayout`` with a ``dledger_dir`` (else []):
    entry indexes contiguous across files, every index unit equal to its entry (and every entry indexed), the
    checkpoint/currterm readable, and the entries past the checkpoint's committedIndex (one
    DLEDGER_UNCOMMITTED finding whose physical_offset is the first such message: everything from there on is
    not known to be committed, and a new leader of a multi-replica group may truncate it; its length reaches
    one byte past the start of the last such message, so damage ending before ``physical_offset + length``
    has a whole entry after it).  Framing damage is not repeated here (the range decoders report it)."""
    if getattr(layout, "dledger_dir", None) is None:
        return []
    found: list = []
    entries: list = []
    for mf in layout.commitlog:
        if is_dledger_data_file(mf.path):
            for frame in scan_entries(mf.path, base_offset=mf.base_offset):
                entries.extend((str(mf.path), mf.base_offset, e) for e in frame.entries)
    prev = None
    for path, base, e in entries:
        at, index = e[0], e[3]
        if prev is not None and index != prev + 1:
            found.append(_anomaly(AnomalyKind.DLEDGER_INDEX_MISMATCH, path, at, base,
                                  "entry indexes are not contiguous", prev + 1, index))
        prev = index
    units, unit_found = decode_index(layout.dledger_index)
    found.extend(unit_found)
    by_index = {u["unit"]: u for u in units}
    for path, base, e in entries:
        at, _, esize, index, term, pos = e[:6]
        u = by_index.pop(index, None)
        if u is None:
            found.append(_anomaly(AnomalyKind.DLEDGER_INDEX_MISMATCH, path, at, base,
                                  f"entry {index} has no index unit (DLedger's recovery stops before it)",
                                  "an index unit", "none"))
            continue
        want = (MAGIC_1, pos, esize, index, term)
        got = (u["magic"], u["pos"], u["size"], u["index"], u["term"])
        if want != got:
            found.append(Anomaly(AnomalyKind.DLEDGER_INDEX_MISMATCH, u["file"], u["file_position"],
                                 f"index unit {index} differs from its entry at {path}@{at} "
                                 "(magic, pos, size, index, term)", str(want), str(got), SOURCE,
                                 base + at + ENTRY_HEADER_SIZE))
    # units of entries below the first retained data file: DLedger's CleanSpaceService deletes data files
    # only and moves the ledger's begin index past them (reviseLedgerBeginIndex); the units stay behind
    starts = [mf.base_offset for mf in layout.commitlog if is_dledger_data_file(mf.path)]
    log_start = min(starts) if starts else 0
    # a unit whose entry lies before the last entry read names an entry that was appended there and is no
    # longer readable (DLedgerMmapFileStore.appendAsLeader writes the data, then the index unit): its bytes
    # starting at pos are lost (physical_offset = pos); a unit past the last entry is the torn tail a crash
    # leaves (DLedgerMmapFileStore.recover truncates the index to the data), no position given
    last_entry = max((base + e[0] for _, base, e in entries), default=-1)
    for u in sorted(by_index.values(), key=lambda u: u["unit"]):
        if u["pos"] < log_start:
            continue
        inside = u["pos"] < last_entry and u["size"] > 0
        found.append(Anomaly(AnomalyKind.DLEDGER_INDEX_MISMATCH, u["file"], u["file_position"],
                             f"index unit {u['unit']} has no entry in the data files (pos {u['pos']})",
                             "an entry", "none", SOURCE, u["pos"] if inside else None))
    checkpoint, cp_found = read_checkpoint(layout.dledger_dir)
    found.extend(cp_found)
    found.extend(read_currterm(layout.dledger_dir)[1])
    committed = checkpoint[COMMITTED_INDEX_KEY]
    if committed is not None:
        past = [(path, base, e) for path, base, e in entries if e[3] > committed]
        if past:
            path, base, e = past[0]
            last = past[-1][2]
            found.append(_anomaly(
                AnomalyKind.DLEDGER_UNCOMMITTED, path, e[0] + ENTRY_HEADER_SIZE, base,
                f"entries {e[3]}..{last[3]} ({len(past)}, messages from physical offset "
                f"{e[5] + ENTRY_HEADER_SIZE} on) are past the checkpoint's committedIndex {committed}: not "
                "known to be committed by the group (a new leader may truncate them; a single node re-reads "
                "them)",
                f"index <= {committed}", last[3], length=past[-1][1] + last[0] - (base + e[0]) + 1))
    return found


# -------------------------------------------------------------------------------------------- replicas
@dataclass
class _Replica:
    broker: str
    root: str
    layout: Any                     # a mappedfile.StoreLayout
    committed: int                  # checkpoint committedIndex (-1 unknown)
    entries: list                   # (index, term, pos, size, crc32 of the entry bytes, file, file position)


def _replica(broker: str, root: str) -> Optional[_Replica]:
    from txlog_io.mappedfile import discover_store

    layout = discover_store(root)
    if layout.dledger_dir is None:
        return None
    entries = []
    for mf in layout.commitlog:
        if not is_dledger_data_file(mf.path):
            continue
        for frame in scan_entries(mf.path, base_offset=mf.base_offset):
            buf, h = frame.buf, frame.headers
            for k, rel in enumerate(frame.positions.tolist()):
                size = int(h["size"][k])
                entries.append((int(h["index"][k]), int(h["term"][k]), int(h["pos"][k]), size,
                                zlib.crc32(buf[rel:rel + size]), str(mf.path), frame.file_pos + rel))  # type: ignore[arg-type]  # ndarray is a Buffer (numpy's stubs: from 3.12 on)
    committed = read_checkpoint(layout.dledger_dir)[0][COMMITTED_INDEX_KEY]
    return _Replica(broker, root, layout, -1 if committed is None else committed, entries)


def collapse_replicas(stores: Sequence) -> tuple:
    """``stores`` = ((broker, root), ...).  Several DLedger stores given under one broker name are the replicas
    of one Raft group, i.e. one broker: only the replica with the most committed entries (then the longest log,
    then the first given) is kept.  Returns (kept (broker, root) pairs in the given order, [(broker, Anomaly)]
    saying where each other replica differs from the kept one).  Raises UsageError when stores sharing a name
    are not DLedger stores or do not begin with the same entry (not one group).  Reads every entry of the
    replicas (on the caller's machine)."""
    from txlog_io.errors import UsageError

    stores = [(str(b), str(r)) for b, r in stores]
    by_name: dict = {}
    for b, r in stores:
        by_name.setdefault(b, []).append(r)
    dropped: set = set()
    findings: list = []
    for name, roots in by_name.items():
        if len(roots) < 2:
            continue
        members = []
        for r in roots:
            rep = _replica(name, r) if _has_dledger(r) else None
            if rep is None or not rep.entries:
                raise UsageError(f"broker {name!r} names several stores, but {r} is not a DLedger store with "
                                 f"entries: only the replicas of one DLedger group may share a name")
            members.append(rep)
        for m in members[1:]:
            if not _same_group(members[0], m):
                raise UsageError(f"broker {name!r}: {m.root} and {members[0].root} do not hold the same "
                                 f"entry at the first index both retain: not replicas of one group")
        # the most committed, then the longest log, then the one retention pruned least, then the first given
        keep = max(members, key=lambda m: (m.committed, m.entries[-1][0], -m.entries[0][0],
                                           -members.index(m)))
        for m in members:
            if m is not keep:
                dropped.add((name, m.root))
                findings.extend((name, a) for a in _differences(keep, m))
    return [(b, r) for b, r in stores if (b, r) not in dropped], findings


def _same_group(a: _Replica, b: _Replica) -> bool:
    """Replicas may have deleted different numbers of old data files (retention runs per node): they are
    one group when they hold the same entry (index, term, pos, size, bytes) at the first index both retain."""
    first = max(a.entries[0][0], b.entries[0][0])
    ea = next((e for e in a.entries if e[0] == first), None)
    eb = next((e for e in b.entries if e[0] == first), None)
    return ea is not None and eb is not None and ea[:5] == eb[:5]


def _has_dledger(root: str) -> bool:
    from txlog_io.mappedfile import find_dledger_dir

    return find_dledger_dir(as_path(root)) is not None


def _differences(keep: _Replica, other: _Replica) -> list:
    """Findings (DLEDGER_REPLICA_DIFFERS, placed in ``other``'s files) for a replica not audited."""
    head = (f"replica {other.root} (committedIndex {other.committed}, last index {other.entries[-1][0]}) is "
            f"audited as {keep.root} (committedIndex {keep.committed}, last index {keep.entries[-1][0]}) of the "
            f"same DLedger group")
    mine = {e[0]: e for e in keep.entries}
    out = []
    begin, other_begin = keep.entries[0][0], other.entries[0][0]
    retained = []                                # where retention left the two logs different
    if other_begin != begin:
        e = other.entries[0]
        where = (f"retains entries {other_begin}..{begin - 1}, which retention deleted from the audited "
                 "replica (they are not audited)" if other_begin < begin else
                 f"begins at entry {other_begin}: retention deleted more of it than of the audited replica, "
                 f"which begins at {begin} (nothing is missing from the audit)")
        retained.append(Anomaly(AnomalyKind.DLEDGER_REPLICA_DIFFERS, e[5], e[6], f"{head}; it {where}",
                                f"first index {begin}", f"first index {other_begin}", SOURCE,
                                e[2] + ENTRY_HEADER_SIZE))
    for e in other.entries:
        if e[0] < begin:
            continue                            # reported above: older than the audited replica's log
        k = mine.get(e[0])
        if k is None:
            out.append(Anomaly(AnomalyKind.DLEDGER_REPLICA_DIFFERS, e[5], e[6],
                               f"{head}; its entries from index {e[0]} on are not in the audited replica (not "
                               "committed there; a leader would truncate them)", "no entry", f"index {e[0]}",
                               SOURCE, e[2] + ENTRY_HEADER_SIZE))
            break
        if k[1:5] != e[1:5]:
            out.append(Anomaly(AnomalyKind.DLEDGER_REPLICA_DIFFERS, e[5], e[6],
                               f"{head}; entry {e[0]} differs from the audited replica's ({k[5]}@{k[6]}): "
                               "term, pos, size or bytes (a log that diverged: Raft truncates the follower)",
                               f"term {k[1]} pos {k[2]} size {k[3]} crc {k[4]}",
                               f"term {e[1]} pos {e[2]} size {e[3]} crc {e[4]}", SOURCE, e[2] + ENTRY_HEADER_SIZE))
            break
    last = other.entries[-1][0]
    if last < keep.entries[-1][0] and not any("differs" in a.detail for a in out):
        e = other.entries[-1]
        out.append(Anomaly(AnomalyKind.DLEDGER_REPLICA_DIFFERS, e[5], e[6] + e[3],
                           f"{head}; it lacks entries {last + 1}..{keep.entries[-1][0]} (behind the audited "
                           "replica)", f"index {keep.entries[-1][0]}", f"index {last}", SOURCE,
                           e[2] + e[3] + ENTRY_HEADER_SIZE))
    if not out and other.committed != keep.committed:
        e = other.entries[-1]
        out.append(Anomaly(AnomalyKind.DLEDGER_REPLICA_DIFFERS, str(other.layout.dledger_dir / CHECKPOINT_FILE), 0,
                           f"{head}; the entries are identical, only the checkpoint differs",
                           str(keep.committed), str(other.committed), SOURCE, None))
    return retained + out
