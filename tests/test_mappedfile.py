"""txlog_io.mappedfile: mapped-file queue checks and store discovery."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import FIXTURES

from txlog_io import mappedfile as mf
from txlog_io.errors import AnomalyKind, StoreNotFoundError, UsageError


def files_under(directory: Path) -> set:
    out = set()
    for dirpath, _, names in os.walk(directory):
        out.update(Path(dirpath) / n for n in names)
    return out


def make(directory: Path, sizes: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, size in sizes.items():
        (directory / name).write_bytes(b"\0" * size)
    return directory


def kinds(anomalies):
    return sorted((a.kind, Path(a.file).name) for a in anomalies)


# ------------------------------------------------------------------------------------------------- real brokers

def test_discovery_finds_exactly_the_files_on_disk(real_store):
    store = real_store / "store"
    layout = mf.discover_store(store)
    assert layout.anomalies == []
    assert layout.root == store
    assert layout.commitlog_dirs == [store / "commitlog"]
    assert [m.path for m in layout.commitlog] == sorted(files_under(store / "commitlog"))
    assert all(m.size == 1048576 == layout.commitlog_file_size for m in layout.commitlog)
    assert [m.base_offset for m in layout.commitlog] == [i * 1048576 for i in range(len(layout.commitlog))]

    queue_files = {m.path for files in layout.consume_queues.values() for m in files}
    assert queue_files == files_under(store / "consumequeue")
    on_disk_queues = {(p.parent.parent.name, int(p.parent.name)) for p in files_under(store / "consumequeue")}
    assert set(layout.consume_queues) == on_disk_queues
    assert layout.consumequeue_file_size == 6000 and not layout.consumequeue_rocksdb
    for (topic, queue_id), files in layout.consume_queues.items():
        assert [m.base_offset for m in files] == sorted(m.base_offset for m in files)
        assert all(m.path.parent == store / "consumequeue" / topic / str(queue_id) for m in files)

    transaction = store / "transaction"
    found_tx = {m.path for m in layout.statetable + layout.redolog}
    assert found_tx == (files_under(transaction) if transaction.exists() else set())
    assert set(layout.index_files) == files_under(store / "index")
    assert layout.consumequeue_ext == {}
    assert set(layout.all_mapped_files()) >= set(layout.commitlog)

    assert layout.consumer_offset_path == store / "config" / "consumerOffset.json"
    assert layout.topics_path == store / "config" / "topics.json"
    assert layout.delay_offset_path == store / "config" / "delayOffset.json"
    assert layout.checkpoint_path == store / "checkpoint"
    assert layout.abort_present is False  # 5.3.3's abort.bak is not the marker
    assert layout.lock_path == ((store / "lock") if (store / "lock").exists() else None)


def test_discovery_of_3x_transaction_files():
    store = FIXTURES / "rocketmq-3.1.4" / "store"
    layout = mf.discover_store(store)
    assert [(m.name, m.base_offset, m.size) for m in layout.statetable] == [("00000000000000000000", 0, 2400)]
    assert [(m.name, m.size) for m in layout.redolog] == [("00000000000000000000", 4000)]
    assert (layout.statetable_file_size, layout.redolog_file_size) == (2400, 4000)
    assert set(layout.consume_queues) == {("TopicA", 0), ("TopicA", 1), ("TopicBig", 0), ("TopicTx", 0)}


def test_4_9_8_rolled_queue():
    layout = mf.discover_store(FIXTURES / "rocketmq-4.9.8" / "store")
    files = layout.consume_queues[("TopicEvents", 0)]
    assert [(m.base_offset, m.end_offset) for m in files] == [(0, 6000), (6000, 12000)]
    assert len(layout.commitlog) == 2 and len(layout.consume_queues) == 18


# ------------------------------------------------------------------------------------------------- queue checks

def test_clean_queue_and_inferred_size(tmp_path):
    d = make(tmp_path / "q", {"00000000000000000000": 100, "00000000000000000100": 100,
                              "00000000000000000200": 100})
    files, anomalies = mf.list_mapped_files(d)
    assert anomalies == []
    assert [f.base_offset for f in files] == [0, 100, 200]
    assert mf.infer_file_size(files) == 100


def test_bad_names_are_reported_and_dotfiles_ignored(tmp_path):
    d = make(tmp_path / "q", {"00000000000000000000": 100, "123": 100, "00000000000000000100.bak": 5,
                              ".DS_Store": 3, "0000000000000000010x": 1})
    (d / "subdir").mkdir()
    files, anomalies = mf.list_mapped_files(d)
    assert [f.name for f in files] == ["00000000000000000000"]
    assert kinds(anomalies) == sorted([(AnomalyKind.BAD_FILE_NAME, "123"),
                                       (AnomalyKind.BAD_FILE_NAME, "00000000000000000100.bak"),
                                       (AnomalyKind.BAD_FILE_NAME, "0000000000000000010x"),
                                       (AnomalyKind.BAD_FILE_NAME, "subdir")])


def test_gap_overlap_and_size_mismatch(tmp_path):
    d = make(tmp_path / "q", {"00000000000000000000": 100, "00000000000000000100": 60,
                              "00000000000000000300": 100, "00000000000000000350": 100})
    files, anomalies = mf.list_mapped_files(d, expected_file_size=100)
    assert kinds(anomalies) == sorted([
        (AnomalyKind.FILE_SIZE_MISMATCH, "00000000000000000100"),
        (AnomalyKind.FILE_GAP, "00000000000000000300"),
        (AnomalyKind.FILE_OVERLAP, "00000000000000000350"),
        (AnomalyKind.MISALIGNED_FILE_NAME, "00000000000000000350"),  # not a multiple of the file size
    ])
    gap = next(a for a in anomalies if a.kind == AnomalyKind.FILE_GAP)
    assert (gap.expected, gap.actual, gap.physical_offset) == ("200", "300", 200)


def test_empty_last_file_is_called_out(tmp_path):
    d = make(tmp_path / "q", {"00000000000000000000": 100, "00000000000000000100": 0})
    files, anomalies = mf.list_mapped_files(d)
    assert len(files) == 2
    assert [a.kind for a in anomalies] == [AnomalyKind.FILE_SIZE_MISMATCH]
    assert "empty last file" in anomalies[0].detail


def test_unit_alignment_for_unit_files(tmp_path):
    d = make(tmp_path / "cq", {"00000000000000000007": 6000})
    _, anomalies = mf.list_mapped_files(d, source="consumequeue")
    assert [a.kind for a in anomalies] == [AnomalyKind.MISALIGNED_FILE_NAME]
    d = make(tmp_path / "st", {"00000000000000000020": 2400, "00000000000000002420": 2390})
    _, anomalies = mf.list_mapped_files(d, expected_file_size=2400, source="statetable")
    assert kinds(anomalies) == sorted([(AnomalyKind.MISALIGNED_FILE_NAME, "00000000000000000020"),
                                       (AnomalyKind.MISALIGNED_FILE_NAME, "00000000000000002420"),
                                       (AnomalyKind.FILE_SIZE_MISMATCH, "00000000000000002420")])
    assert all(a.source == "statetable" for a in anomalies)


def test_offset_to_file_name():
    assert mf.offset_to_file_name(1073741824) == "00000000001073741824"
    with pytest.raises(UsageError):
        mf.offset_to_file_name(-1)


# ------------------------------------------------------------------------------------------------- discovery

def test_multi_path_commitlog_is_merged_in_offset_order(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    make(tmp_path / "disk1", {"00000000000000000000": 64, "00000000000000000128": 64})
    make(tmp_path / "disk2", {"00000000000000000064": 64, "00000000000000000192": 64})
    layout = mf.discover_store(root, commitlog_dirs=f"{tmp_path / 'disk1'},{tmp_path / 'disk2'}")
    assert [(m.base_offset, m.path.parent.name) for m in layout.commitlog] == \
           [(0, "disk1"), (64, "disk2"), (128, "disk1"), (192, "disk2")]
    assert layout.anomalies == [a for a in layout.anomalies if a.kind == AnomalyKind.MISSING_FILE]
    assert layout.commitlog_file_size == 64
    # the same name in two directories overlaps; relative dirs are taken from the store root
    make(root / "d3", {"00000000000000000000": 64})
    layout = mf.discover_store(root, commitlog_dirs=[tmp_path / "disk1", "d3"])
    assert AnomalyKind.FILE_OVERLAP in [a.kind for a in layout.anomalies]


def test_store_errors(tmp_path):
    with pytest.raises(StoreNotFoundError):
        mf.discover_store(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError):
        mf.discover_store(tmp_path / "empty")
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(UsageError):
        mf.discover_store(tmp_path / "file")
    with pytest.raises(StoreNotFoundError):
        mf.discover_store(tmp_path / "empty", commitlog_dirs="missing-dir")
    with pytest.raises(StoreNotFoundError):
        mf.list_mapped_files(tmp_path / "nope")


def test_store_oddities(tmp_path):
    root = tmp_path / "store"
    make(root / "commitlog", {"00000000000000000000": 256})
    make(root / "consumequeue" / "T" / "0", {"00000000000000000000": 60, "00000000000000000060": 60})
    make(root / "consumequeue" / "T" / "1", {"00000000000000000000": 60})
    make(root / "consumequeue" / "T" / "x", {"00000000000000000000": 60})
    make(root / "consumequeue" / "U" / "0", {"00000000000000000000": 40})  # short: store-wide size is 60
    (root / "consumequeue" / "stray").write_bytes(b"")
    make(root / "consumequeue_ext" / "T" / "0", {"00000000000000000000": 1024})
    (root / "abort").write_bytes(b"")
    layout = mf.discover_store(root)
    assert set(layout.consume_queues) == {("T", 0), ("T", 1), ("U", 0)}
    assert layout.consumequeue_file_size == 60
    assert set(layout.consumequeue_ext) == {("T", 0)} and layout.consumequeue_ext_file_size == 1024
    assert layout.abort_present
    assert kinds(layout.anomalies) == sorted([(AnomalyKind.BAD_FILE_NAME, "x"), (AnomalyKind.BAD_FILE_NAME, "stray"),
                                              (AnomalyKind.FILE_SIZE_MISMATCH, "00000000000000000000"),
                                              (AnomalyKind.MISSING_FILE, "checkpoint")])
    assert layout.consumer_offset_path is None and layout.checkpoint_path is None


def test_store_without_commitlog_and_rocksdb_consumequeue(tmp_path):
    root = tmp_path / "store"
    make(root / "consumequeue", {"CURRENT": 16, "MANIFEST-000005": 100, "000007.sst": 10, "LOCK": 0})
    make(root / "config", {"consumerOffset.json.bak": 10})
    layout = mf.discover_store(root)
    assert layout.consumequeue_rocksdb and layout.consume_queues == {} and layout.rocksdb_queues == {}
    # no commitlog/; and the zero-filled "database" cannot be opened: a finding, no queue listed
    assert [a.kind for a in layout.anomalies] == [AnomalyKind.MISSING_FILE, AnomalyKind.BAD_FILE_HEADER]
    assert layout.anomalies[1].file == str(root / "consumequeue") and "RocksDB" in layout.anomalies[1].detail
    assert layout.consumer_offset_path == root / "config" / "consumerOffset.json"  # only the .bak exists
