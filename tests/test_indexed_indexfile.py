"""Indexed mode finds 4.3+ COMMIT records through the IndexFiles (REAL_TOPIC#UNIQ_KEY lookups), scans what the
index files do not cover, and says so: a deleted or truncated index file, lost newest files (the checkpoint's
indexMsgTimestamp says more was indexed) and an index lagging after a crash each give an INDEX_INCOMPLETE
finding naming the range scanned, and the same transaction records as full mode."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from test_datasources import transaction_relevant

import refbroker
import refbroker.index as refindex
from jobs.read.frames import load_store_frames
from jobs.read.indexed.gaps import GAP_INDEX_HOLE, GAP_INDEX_LAG, index_file_gaps, uses_index_files
from jobs.read.stores import store_info
from txlog_io.commitlog import decode_range
from txlog_io.indexfile import IndexFileWriter, index_keys, list_index_files, read_index_file
from txlog_io.mappedfile import discover_store

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def base_store(tmp_path_factory, monkeypatch_module):
    """A 5.1+ store whose index files hold 256 entries each (several files, several boundaries)."""
    monkeypatch_module.setattr(refindex, "DEFAULT_HASH_SLOTS", 32)
    monkeypatch_module.setattr(refindex, "DEFAULT_INDEX_NUM", 256)
    out = tmp_path_factory.mktemp("idxstore")
    refbroker.generate("5.1+", "clean", 120, 5, out, commitlog_file_mb=1)
    return out / "store"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _records(root: Path) -> list:
    rows = []
    for f in discover_store(root).commitlog:
        for batch, _ in decode_range(str(f.path)):
            rows += batch.select(["physical_offset", "topic", "uniq_key", "keys", "transaction_type",
                                  "store_timestamp"]).to_pylist()
    return rows


def test_reference_broker_index_files_are_what_index_service_writes(base_store):
    """Rebuilding the files from the store's own CommitLog with IndexService's rules gives the same bytes."""
    files = list_index_files(base_store)
    assert len(files) >= 3
    decoded = [read_index_file(p) for p in files]
    assert all(i.hash_slots == 32 and i.index_num == 256 and not i.anomalies for i in decoded)
    writers = [IndexFileWriter(32, 256)]
    for r in _records(base_store):
        if r["physical_offset"] < writers[-1].end_phy:
            continue
        for key in index_keys(r["topic"], r["uniq_key"], r["keys"], r["transaction_type"]):
            if not writers[-1].put_key(key, r["physical_offset"], r["store_timestamp"]):
                prev = writers[-1]
                writers.append(IndexFileWriter(32, 256, prev.end_phy, prev.end_ts))
                writers[-1].put_key(key, r["physical_offset"], r["store_timestamp"])
    assert [w.to_bytes() for w in writers] == [p.read_bytes() for p in files]


def _variant(base: Path, tmp: Path, name: str, damage) -> str:
    root = tmp / name / "store"
    shutil.copytree(base, root)
    damage(root, list_index_files(root))
    return str(root)


def _promised(table: pa.Table) -> dict:
    """Offsets per broker of the records indexed mode promises (test_datasources.transaction_relevant)."""
    t = pa.concat_tables([transaction_relevant(table.filter(pc.equal(table.column("broker"), b)))
                          for b in pc.unique(table.column("broker")).to_pylist()])
    out: dict = {}
    for b, o in zip(t.column("broker").to_pylist(), t.column("physical_offset").to_pylist(), strict=True):
        out.setdefault(b, set()).add(o)
    return out


def test_indexed_equals_full_and_reports_each_index_gap(spark, base_store, tmp_path):
    files = list_index_files(base_store)

    def delete_middle(root, fs):
        fs[len(fs) // 2].unlink()

    def truncate_one(root, fs):
        os.truncate(fs[1], 3000)

    def lose_newest(root, fs):          # the checkpoint says a later full file was flushed
        for f in fs[-2:]:
            f.unlink()

    def crash_lag(root, fs):            # unclean shutdown, the newest index file never written
        fs[-1].unlink()
        (root / "abort").touch()

    stores = {"healthy": _variant(base_store, tmp_path, "healthy", lambda r, f: None),
              "deleted": _variant(base_store, tmp_path, "deleted", delete_middle),
              "truncated": _variant(base_store, tmp_path, "truncated", truncate_one),
              "lost": _variant(base_store, tmp_path, "lost", lose_newest),
              "lag": _variant(base_store, tmp_path, "lag", crash_lag)}
    infos = {b: store_info(b, r, None) for b, r in stores.items()}
    assert all(uses_index_files(i) for i in infos.values())
    reasons = {b: {g[3] for g in index_file_gaps(i)} for b, i in infos.items()}
    assert reasons["healthy"] & {GAP_INDEX_HOLE, GAP_INDEX_LAG} == set()
    assert GAP_INDEX_HOLE in reasons["deleted"] and GAP_INDEX_HOLE in reasons["truncated"]
    assert GAP_INDEX_HOLE in reasons["lost"] and GAP_INDEX_LAG in reasons["lag"]

    brokers, roots = list(stores), list(stores.values())
    indexed = load_store_frames(spark, roots, mode="indexed", brokers=brokers)
    full = load_store_frames(spark, roots, mode="full", brokers=brokers)
    got, want = _promised(indexed.commitlog.toArrow()), _promised(full.commitlog.toArrow())
    assert want["healthy"] and all(got[b] == want[b] for b in brokers), \
        {b: (len(got.get(b, ())), len(want[b])) for b in brokers}
    findings = [r.asDict() for r in indexed.anomalies.where("kind = 'INDEX_INCOMPLETE'").collect()]
    by_broker: dict = {}
    for f in findings:
        by_broker.setdefault(f["broker"], []).append(f)
    assert not [f for f in by_broker.get("healthy", []) if "INDEX_" in f["actual"]]
    for b, reason in (("deleted", GAP_INDEX_HOLE), ("truncated", GAP_INDEX_HOLE), ("lost", GAP_INDEX_HOLE),
                      ("lag", GAP_INDEX_LAG)):
        named = [f for f in by_broker.get(b, []) if f["actual"] == reason]
        assert named, (b, by_broker.get(b))
        assert all("indexed mode scanned CommitLog [" in f["detail"] and f["file"].endswith("index")
                   or "/index/" in f["file"] for f in named)
    assert len(files) >= 3
