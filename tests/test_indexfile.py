"""txlog_io.indexfile against the real brokers' index files: geometry, lookups, golden bytes, damage."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from txlog_io.errors import TxlogError
from txlog_io.indexfile import (
    IndexFileReader,
    IndexFileWriter,
    file_size_for,
    index_keys,
    list_index_files,
    read_index_file,
)

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"
TX_TYPE = {0: "NOT", 4: "PREPARED", 8: "COMMIT", 12: "ROLLBACK"}


def _records(version):
    with gzip.open(FIXTURES / version / "truth" / "commitlog.jsonl.gz") as f:
        return [json.loads(line) for line in f]


def _keys(rec):
    props = rec["properties"]
    return index_keys(rec["topic"], rec.get("uniqKey") or props.get("UNIQ_KEY"), props.get("KEYS"),
                      TX_TYPE[rec["sysFlag"] & 0xC])


def _rebuild(records, hash_slots, index_num):
    """IndexService.buildIndex over the CommitLog in order: skip records below the file's end offset, roll to a
    new file when one is full (the key that did not fit goes first into the new file)."""
    writers = [IndexFileWriter(hash_slots, index_num)]
    for rec in records:
        if rec["physicalOffset"] < writers[-1].end_phy:
            continue
        for key in _keys(rec):
            if not writers[-1].put_key(key, rec["physicalOffset"], rec["storeTimestamp"]):
                writers.append(IndexFileWriter(hash_slots, index_num))
                assert writers[-1].put_key(key, rec["physicalOffset"], rec["storeTimestamp"])
    return writers


def test_real_498_geometry_lookups_and_golden_bytes():
    files = list_index_files(FIXTURES / "rocketmq-4.9.8" / "store")
    assert len(files) == 4
    decoded = [read_index_file(p) for p in files]
    assert [(i.hash_slots, i.index_num) for i in decoded] == [(64, 512)] * 4      # README: 64 slots, 512 entries
    assert all(not i.anomalies for i in decoded)
    records = _records("rocketmq-4.9.8")
    keyed = [(k, r["physicalOffset"]) for r in records for k in _keys(r)]
    assert sum(i.entries.num_rows for i in decoded) == len(keyed)
    readers = [IndexFileReader(p) for p in files]           # the positional reader the audit uses
    assert all(any(off in r.lookup(k) for r in readers) for k, off in keyed)
    # a ROLLBACK record is never indexed; COMMIT records are, under their real topic
    commits = [r for r in records if r["sysFlag"] & 0xC == 8]
    assert commits and all(any(r["physicalOffset"] in rd.lookup(f"{r['topic']}#{r['uniqKey']}") for rd in readers)
                           for r in commits)
    for rd in readers:
        rd.close()
    for path, writer in zip(files, _rebuild(records, 64, 512), strict=True):
        assert writer.to_bytes() == path.read_bytes(), path.name


def test_real_314_decodes_cleanly():
    (path,) = list_index_files(FIXTURES / "rocketmq-3.1.4" / "store")
    idx = read_index_file(path)
    assert (idx.hash_slots, idx.index_num) == (64, 512) and not idx.anomalies
    offsets = {r["physicalOffset"] for r in _records("rocketmq-3.1.4")}
    assert idx.entries.num_rows == idx.header.index_count - 1
    assert set(idx.entries.column("commitlog_offset").to_pylist()) <= offsets


def test_truncated_and_zeroed_index_files_report_not_raise(tmp_path):
    src = list_index_files(FIXTURES / "rocketmq-4.9.8" / "store")[0].read_bytes()
    cut = tmp_path / "20200101000000000"
    cut.write_bytes(src[:5000])
    idx = read_index_file(cut)
    assert idx.entries.num_rows == 0 and [a.kind for a in idx.anomalies] == ["BAD_FILE_HEADER"]
    tiny = tmp_path / "20200101000000001"
    tiny.write_bytes(src[:12])
    assert [a.kind for a in read_index_file(tiny).anomalies] == ["TRUNCATED_RECORD"]
    wrong = tmp_path / "20200101000000002"
    wrong.write_bytes(src)
    assert [a.kind for a in read_index_file(wrong, 63, 512).anomalies] == ["FILE_SIZE_MISMATCH"]
    with pytest.raises(TxlogError):
        read_index_file(tmp_path / "missing")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=12), st.integers(0, 2**40)), min_size=1, max_size=200),
       st.sampled_from([1, 7, 64]))
def test_round_trip(tmp_path_factory, puts, slots):
    w = IndexFileWriter(slots, 256)
    t0 = 1_700_000_000_000
    stored = [(k, off) for i, (k, off) in enumerate(puts) if w.put_key(k, off, t0 + i * 1500)]
    path = tmp_path_factory.mktemp("idx") / "20240101000000000"
    path.write_bytes(w.to_bytes())
    idx = read_index_file(path, slots)
    assert idx.entries.num_rows == len(stored) and not idx.anomalies
    with IndexFileReader(path, slots) as reader:
        for k, off in stored:
            assert off in reader.lookup(k)
    if len({o for _, o in stored}) > 1 or slots == 1:
        assert (read_index_file(path).hash_slots in (None, slots))


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=4096), st.integers(0, 4095), st.binary(min_size=1, max_size=64))
def test_any_bytes_never_raise(tmp_path_factory, base, at, patch):
    src = list_index_files(FIXTURES / "rocketmq-4.9.8" / "store")[-1].read_bytes()
    data = bytearray(src if len(base) % 2 else base)
    data[at:at + len(patch)] = patch
    path = tmp_path_factory.mktemp("fz") / "20240101000000000"
    path.write_bytes(bytes(data))
    idx = read_index_file(path)
    assert idx.entries.num_rows <= max(0, (len(data) - 40) // 20)
    for a in idx.anomalies:
        assert a.file == str(path) and 0 <= a.position <= len(data)
    with IndexFileReader(path) as reader:
        reader.lookup("TopicA#x")


def test_dump_index_cli(capsys):
    from txlog_io.cli import main

    assert main(["index", str(FIXTURES / "rocketmq-4.9.8" / "store")]) == 0
    out = capsys.readouterr()
    rows = [json.loads(line) for line in out.out.splitlines()]
    assert len(rows) == 511 * 3 + 397 and rows[0]["entry_index"] == 1
    assert main(["index", str(FIXTURES / "rocketmq-4.9.8" / "store" / "commitlog")]) == 2
    assert file_size_for(64, 512) == os.path.getsize(list_index_files(FIXTURES / "rocketmq-4.9.8" / "store")[0])
