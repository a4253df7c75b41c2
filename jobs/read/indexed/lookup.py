"""Indexed mode's COMMIT lookups inside the one job (used by jobs/read/indexed/read.py).

Follows RocketMQ's query by key (store/.../index/IndexService.queryOffset, IndexFile.selectPhyOffset): the
COMMIT record of a half is found under ``REAL_TOPIC#UNIQ_KEY`` in every IndexFile that ends after the half's
oldest copy (txlog_io/indexfile.py).  Two halves:

* **driver** (:func:`fetch_units`): the half / op / discard records at the transaction queues' units are read
  here, with the op bodies, in DRIVER_IO_THREADS threads (cold positional reads are latency-bound; ``pread``
  and the numba decoder release the GIL).  These are rows the reducer needs anyway, so the job does not fetch
  them again; their ``REAL_TOPIC#UNIQ_KEY`` hashes and oldest copies are the lookups' input.  The driver holds
  what the reducer reads (one row per unit) and one (hash, offset) pair per transaction: no limit on units
  below the one-job read's ``LOCAL_MAX_ROWS``.
* **executors** (:class:`LookupAt`, :func:`lookup_fetch`): a task per group of consecutive IndexFiles reads
  them (whole at the reference broker's small geometry, else slot + chain by positional reads), and fetches
  the records at the offsets found in the same task, in threads (``decode_at`` with ``tx_only``: an ordinary
  record met by a hash collision is probed, never copied).  Index files are read once per audit, spread over
  the cores; the driver asks the kernel to read them ahead (:func:`index_files_read_whole`,
  ``positional.will_read``) before it fetches the units, so on a cold page cache their reads overlap the plan.

Before, the driver looked every key up in every index file itself (one file after another: 1.0 s of cold
reads and 1.6 s of per-key Python on the 8 GiB bench store) and the job fetched the unit records a second
time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from jobs.read.full import record_rows
from jobs.read.indexed.plan import DRIVER_IO_THREADS, _in_threads, probe_offsets
from jobs.sources.formats import anomalies_batch
from txlog_io.commitlog_layout import DISCARD_TOPIC, HALF_TOPIC

#: lookup tasks per core: enough that the index files of the newest (most searched) groups do not leave a
#: core idle at the end
LOOKUP_TASKS_PER_CORE = 3
#: positions per decode_at call (bounds the records copied at once)
FETCH_CHUNK = 16384
#: what a lookup task sends besides records and findings: the offsets found that no CommitLog file holds
LOST_SCHEMA = pa.schema([("broker", pa.string()), ("commitlog_offset", pa.int64())])


@dataclass(frozen=True)
class LookupAt:
    """Keys to search for in consecutive IndexFiles of one broker, and where its CommitLog files lie."""

    broker: str
    files: tuple            # (path, end_phy_offset, hash_slots, index_num) of usable IndexFiles
    hashes: bytes           # int64 index_key_hash of REAL_TOPIC#UNIQ_KEY, one per key
    after: bytes            # int64 CommitLog offset of each key's oldest half copy
    commitlog_files: tuple  # ((path, base_offset, size), ...) in offset order


@dataclass(frozen=True)
class ProbeAt:
    """CommitLog offsets of one broker to probe (``decode_at`` with ``tx_only``: a NOT record is read up to
    its SYSFLAG, never copied): the units of the real topics a 3.x store's (or an un-indexed 4.3+ store's)
    transactions live in, where the DataFrame plan joins every unit of those topics."""

    broker: str
    offsets: bytes          # int64, sorted and distinct
    commitlog_files: tuple  # ((path, base_offset, size), ...) in offset order


# ------------------------------------------------------------------------------------------------------------
# executor side
# ------------------------------------------------------------------------------------------------------------

def lookup_fetch(p: LookupAt, out: Dict[str, list]) -> None:
    """Search ``p.files`` for ``p``'s keys and fetch the records at the offsets found: records to
    ``out["commitlog"]``, findings to ``out["hit_anomalies"]``, offsets no CommitLog file holds to
    ``out["lost"]``."""
    from txlog_io.indexfile import search_files

    hits = search_files(p.files, np.frombuffer(p.hashes, np.int64), np.frombuffer(p.after, np.int64))
    if hits.size:
        _probe(p.broker, p.commitlog_files, hits, out)


def probe_fetch(p: "ProbeAt", out: Dict[str, list]) -> None:
    """Probe the records at ``p.offsets`` (a real topic's consume-queue units): what
    :func:`lookup_fetch` does with the offsets it found."""
    _probe(p.broker, p.commitlog_files, np.frombuffer(p.offsets, np.int64), out)


def _probe(broker: str, commitlog_files: Sequence, offsets, out: Dict[str, list]) -> None:
    """The non-NOT records at ``offsets`` to ``out["commitlog"]``, the findings met to
    ``out["hit_anomalies"]``, the offsets no CommitLog file holds to ``out["lost"]``."""
    records, anomalies, lost = fetch_at(broker, commitlog_files, offsets, tx_only=True)
    if lost:
        out["lost"].append(pa.RecordBatch.from_arrays(
            [pa.array([broker] * len(lost), pa.string()), pa.array(lost, pa.int64())], schema=LOST_SCHEMA))
    out["commitlog"] += records
    out["hit_anomalies"] += anomalies


def fetch_at(broker: str, commitlog_files: Sequence, offsets, tx_only: bool) -> Tuple[list, list, list]:
    """The records at the sorted, distinct CommitLog ``offsets`` of one broker, read in DRIVER_IO_THREADS
    threads (the positions lie anywhere in the CommitLog: cold reads are latency-bound, so several are in
    flight): (``full_read.RECORD_SCHEMA`` batches, findings batches, the offsets no CommitLog file holds).
    ``tx_only``: an ordinary record found there is probed, never copied (``decode_at``)."""
    from txlog_io.commitlog import decode_at

    offsets = np.asarray(offsets, np.int64)
    bases = np.array([f[1] for f in commitlog_files], np.int64)
    ends = bases + np.array([f[2] for f in commitlog_files], np.int64)
    which = np.searchsorted(bases, offsets, "right") - 1
    held = (which >= 0) & (offsets < ends[np.clip(which, 0, None)]) if bases.size \
        else np.zeros(offsets.size, bool)
    size = _piece(int(held.sum()))
    work = [[(commitlog_files[k], chunk)] for k in np.unique(which[held]).tolist()
            for chunk in _split((offsets[held & (which == k)] - commitlog_files[k][1]).tolist(), size)]

    def read(pieces):
        return [(f[0], decode_at(f[0], chunk, base_offset=f[1], with_body=True,
                                 tx_only=chunk if tx_only else ())) for f, chunk in pieces]

    records, anomalies = [], []
    for path, (batch, found) in (r for part in _in_threads(read, work) for r in part):
        if batch.num_rows:
            records.append(record_rows(batch, broker))
        if found:
            anomalies.append(anomalies_batch(broker, found, "commitlog", path))
    return records, anomalies, offsets[~held].tolist()


def _piece(total: int) -> int:
    """Positions per ``decode_at`` call when ``total`` are read in DRIVER_IO_THREADS threads."""
    return min(FETCH_CHUNK, max(64, -(-total // (2 * DRIVER_IO_THREADS))))


# ------------------------------------------------------------------------------------------------------------
# driver side
# ------------------------------------------------------------------------------------------------------------

@dataclass
class UnitRecords:
    """What the driver read at the transaction queues' units."""

    records: List[pa.RecordBatch]       # full_read.RECORD_SCHEMA rows (op bodies kept)
    anomalies: List[pa.RecordBatch]     # the fetch's findings (CQ_ENTRY_MISMATCH, ...)
    lost: List[Tuple[str, int]]         # (broker, offset) no CommitLog file holds
    keys: Dict[str, Dict[Tuple[str, str], int]]     # broker -> (real_topic, uniq_key) -> oldest half copy


def fetch_units(stores: Sequence, units: pa.Table, keyed) -> UnitRecords:
    """The records at ``units``' CommitLog offsets (each once), read on the driver; the keys of the half and
    discard copies of the ``keyed`` stores."""
    got = UnitRecords([], [], [], {})
    offsets: Dict[str, set] = {}
    for b, off in zip(units.column("broker").to_pylist(), units.column("commitlog_offset").to_pylist(),
                      strict=True):
        offsets.setdefault(b, set()).add(off)
    for s in stores:
        mine, anomalies, lost = fetch_at(s.broker, s.commitlog_files, sorted(offsets.get(s.broker, ())),
                                         tx_only=False)
        got.anomalies += anomalies
        got.lost += [(s.broker, off) for off in lost]
        got.records += mine
        if keyed(s) and mine:
            keys = got.keys.setdefault(s.broker, {})
            heads = pa.Table.from_batches(mine).select(["topic", "real_topic", "uniq_key", "physical_offset"])
            for topic, real, uniq, off in zip(*(c.to_pylist() for c in heads.columns), strict=True):
                if topic in (HALF_TOPIC, DISCARD_TOPIC) and uniq is not None and real is not None:
                    keys[(real, uniq)] = min(keys.get((real, uniq), off), off)
    return got


def scanned_keys(records: pa.Table, keyed: Sequence[str],
                 known: Dict[str, Dict[Tuple[str, str], int]]) -> Dict[str, Dict[Tuple[str, str], int]]:
    """The ``REAL_TOPIC#UNIQ_KEY`` keys of the half and discard copies among ``records`` (a gap scan's rows)
    of the ``keyed`` brokers that :func:`fetch_units` did not give, or gave with a newer oldest copy: broker
    -> key -> oldest copy.  A half only a gap scan found (its unit lies in a queue hole, before a queue's head)
    has COMMIT records after the scanned range, which only an IndexFile lookup of its key finds."""
    out: Dict[str, Dict[Tuple[str, str], int]] = {}
    if not records.num_rows or not keyed:
        return out
    mask = pc.and_(pc.is_in(records.column("topic"), pa.array([HALF_TOPIC, DISCARD_TOPIC], pa.string())),
                   pc.is_in(records.column("broker"), pa.array(list(keyed), pa.string())))
    heads = records.filter(pc.fill_null(mask, False)).select(
        ["broker", "real_topic", "uniq_key", "physical_offset"])
    for b, real, uniq, off in zip(*(c.to_pylist() for c in heads.columns), strict=True):
        if real is None or uniq is None:
            continue
        have = known.get(b, {}).get((real, uniq))
        mine = out.setdefault(b, {})
        if have is None or off < have:
            mine[(real, uniq)] = min(mine.get((real, uniq), off), off)
    return {b: k for b, k in out.items() if k}


def probe_items(stores: Sequence, units: UnitRecords, fetched: Dict[str, set], opts_for, cores: int,
                max_units: int) -> Optional[List[ProbeAt]]:
    """The probe tasks: every unit of the real topics the records at the transaction index units name
    (``indexed_plan.probe_offsets``: a 3.x store's, an un-indexed 4.3+ store's) but the ``fetched`` offsets
    (broker -> offsets the driver read whole), cut into about ``LOOKUP_TASKS_PER_CORE`` tasks per core.  None
    when the probed queue files exceed DRIVER_READ_BYTES or the offsets ``max_units``: the DataFrame plan then
    probes on the executors."""
    heads = (r for batch in units.records for r in zip(*(batch.column(c).to_pylist() for c in (
        "broker", "topic", "real_topic", "transaction_type")), strict=True))
    probes = probe_offsets(stores, heads, opts_for)
    if probes is None:
        return None
    offsets = {b: np.setdiff1d(o, np.fromiter(fetched.get(b, ()), np.int64), assume_unique=True)
               for b, o in probes.items()}
    total = sum(o.size for o in offsets.values())
    if total > max_units:
        return None
    piece = max(1024, -(-total // (LOOKUP_TASKS_PER_CORE * max(1, cores))))
    files = {s.broker: s.commitlog_files for s in stores}
    return [ProbeAt(b, o[i:i + piece].tobytes(), files[b]) for b, o in offsets.items()
            for i in range(0, o.size, piece)]


def _split(items: list, size: int) -> List[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def index_files_read_whole(stores: Sequence, keys: int) -> List[str]:
    """The usable IndexFiles the lookups will read whole for about ``keys`` keys (``WHOLE_LOOKUP_BYTES_PER_KEY``;
    never a large file: a real broker's 420 MB file is searched by positional reads)."""
    from txlog_io.indexfile import WHOLE_LOOKUP_BYTES_PER_KEY, WHOLE_READ_LIMIT, file_size_for

    limit = min(WHOLE_READ_LIMIT, keys * WHOLE_LOOKUP_BYTES_PER_KEY)
    return [f[0] for s in stores for f in s.index_files
            if f[4] is None and f[5] and file_size_for(f[5], f[6]) <= limit]


def lookup_items(stores: Sequence, keys: Dict[str, Dict[Tuple[str, str], int]], cores: int) -> List[LookupAt]:
    """The lookup tasks: per broker, its usable IndexFiles cut into consecutive groups of about the same cost
    (a file is searched for the keys whose oldest copy lies before its end), each group with the keys it
    needs."""
    from txlog_io.indexfile import build_key, index_key_hash

    items: List[LookupAt] = []
    for s in stores:
        mine = keys.get(s.broker)
        files = [(f[0], f[2], f[5], f[6]) for f in s.index_files if f[4] is None]
        if not mine or not files:
            continue
        hashes = np.array([index_key_hash(build_key(t, u)) for t, u in mine], np.int64)
        after = np.array(list(mine.values()), np.int64)
        # a file's cost is mostly reading it (whole, at the small geometries where there are many): a file
        # searched for every key costs about twice one searched for none
        keys_of = np.searchsorted(np.sort(after), np.array([f[1] for f in files], np.int64), "right")
        weight = 1.0 + keys_of / after.size
        groups = max(1, min(len(files), LOOKUP_TASKS_PER_CORE * cores))
        cuts = np.searchsorted(np.cumsum(weight), np.arange(1, groups) * weight.sum() / groups, "left")
        lo = 0
        for hi in [*dict.fromkeys(int(c) + 1 for c in cuts), len(files)]:
            part = files[lo:min(hi, len(files))]
            if part:
                need = after <= max(f[1] for f in part)
                if need.any():
                    items.append(LookupAt(s.broker, tuple(part), hashes[need].tobytes(),
                                          after[need].tobytes(), s.commitlog_files))
            lo = max(lo, min(hi, len(files)))
    return items


__all__ = ["LookupAt", "ProbeAt", "lookup_fetch", "probe_fetch", "probe_items", "fetch_units", "lookup_items",
           "UnitRecords", "LOST_SCHEMA", "scanned_keys",
           "index_files_read_whole"]
