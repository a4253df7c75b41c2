"""DLedger (Raft) CommitLog codec and discovery: real 4.9.8 DLedger stores against truth/, encoder twins, damage,
range splits, converted stores."""
from __future__ import annotations

import functools
import gzip
import json
import random
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURES
from truth_frames import truth_record_fields

from txlog_io import dledger as D
from txlog_io import dledger_store as S
from txlog_io import mappedfile as mf
from txlog_io.commitlog import Message, encode_record
from txlog_io.errors import AnomalyKind, UsageError

DLEDGER = FIXTURES / "rocketmq-4.9.8-dledger"
STORES = ("clean", "crashed")


def _jsonl(path: Path) -> list:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _data_files(store: str) -> list:
    return sorted((DLEDGER / f"store-{store}" / "dledger-n0" / "data").iterdir())


def _decode(path, **kw):
    rows, found = [], []
    for batch, anomalies in D.decode_range(str(path), **kw):
        rows += batch.to_pylist()
        found += anomalies
    return rows, found


# ------------------------------------------------------------------------------------------ real broker truth
@pytest.mark.parametrize("store", STORES)
def test_records_equal_rocketmq_and_dledger_own_decode(store):
    rows, found = [], []
    for f in _data_files(store):
        r, a = _decode(f, with_body=True)
        rows += r
        found += a
    truth = _jsonl(DLEDGER / "truth" / store / "commitlog.jsonl.gz")
    assert len(rows) == len(truth)
    for got, t in zip(rows, truth, strict=True):
        expected = dict(truth_record_fields(t), file=str(_data_files(store)[0].parent / t["file"]),
                        properties=t["properties"])
        actual = {k: got[k] for k in expected}
        actual["properties"] = dict(actual["properties"])
        assert actual == expected, t["filePos"]
        if t["topic"] != "SCHEDULE_TOPIC_XXXX":
            assert got["tags_code"] == t["tagsCode_dispatch"]
        assert t["dledger"]["pos"] + D.ENTRY_HEADER_SIZE == got["physical_offset"]
    if store == "clean":
        assert found == []


@pytest.mark.parametrize("store", STORES)
def test_entry_headers_equal_truth(store):
    truth = _jsonl(DLEDGER / "truth" / store / "dledger_entries.jsonl.gz")
    got = []
    for f in _data_files(store):
        entries, found = D.entries_of(f)
        assert found == []
        got += [dict(e, file=f.name) for e in entries]
    assert len(got) == len(truth)
    for g, t in zip(got, truth, strict=True):
        assert (g["file"], g["file_position"], g["magic"], g["size"], g["index"], g["term"], g["pos"], g["channel"],
                g["chain_crc"], g["body_crc"], g["body_size"]) == \
            (t["file"], t["filePos"], t["magic"], t["size"], t["index"], t["term"], t["pos"], t["channel"],
             t["chainCrc"], t["bodyCrc"], t["bodySize"])


@pytest.mark.parametrize("store", STORES)
def test_file_ends_match_truth(store):
    """DLedger end markers and the zero tail: where each file's data ends and why."""
    files = {t["file"]: t for t in _jsonl(DLEDGER / "truth" / store / "commitlog_files.jsonl")}
    for f in _data_files(store):
        summary = D.ScanSummary(str(f), 0, 0)
        for _ in D.scan_entries(f, summary=summary):
            pass
        t = files[f.name]
        if "endMarkerPos" in t:
            assert summary.stop_reason == "DLedger end-of-file marker"
            assert summary.valid_end == t["endMarkerPos"]
            raw = f.read_bytes()[t["endMarkerPos"]:t["endMarkerPos"] + 8]
            assert raw == D.encode_end_marker(t["endMarkerSize"])
        else:
            assert summary.stop_reason.startswith("zero-filled tail")


def test_torn_entry_is_reported_with_file_and_position():
    torn = json.loads((DLEDGER / "truth" / "crashed" / "torn_tail.json").read_text())
    last = _data_files("crashed")[-1]
    assert last.name == torn["file"]
    rows, found = _decode(last)
    assert [r["physical_offset"] for r in rows if r["physical_offset"] >= torn["messagePhysicalOffset"]] == []
    assert [(a.kind, Path(a.file).name, a.position, a.physical_offset) for a in found] == [
        (AnomalyKind.BAD_TOTAL_SIZE, torn["file"], torn["filePos"] + 48, torn["messagePhysicalOffset"])]


@pytest.mark.parametrize("store", STORES)
def test_index_units_checkpoint_and_currterm(store):
    root = DLEDGER / f"store-{store}"
    layout = mf.discover_store(root)
    state = json.loads((DLEDGER / "truth" / store / "store_state.json").read_text())
    assert layout.dledger_dir == root / "dledger-n0"
    assert layout.dledger_index_file_size == 32768          # inferred: stored nowhere
    assert layout.dledger_divided_offset == 0 and layout.commitlog_dirs == [root / "dledger-n0" / "data"]
    assert [f.path for f in layout.commitlog] == _data_files(store)
    assert [a for a in layout.anomalies if a.source in ("dledger", "dledger_index")] == []
    units, found = S.decode_index(layout.dledger_index)
    assert found == []
    truth_units = _jsonl(DLEDGER / "truth" / store / "dledger_index.jsonl")
    assert [(Path(u["file"]).name, u["file_position"], u["unit"], u["magic"], u["pos"], u["size"], u["index"],
             u["term"]) for u in units] == \
        [(t["file"], t["filePos"], t["unitIndex"], t["magic"], t["pos"], t["size"], t["index"], t["term"])
         for t in truth_units]
    checkpoint, found = S.read_checkpoint(layout.dledger_dir)
    assert found == []
    assert D.encode_checkpoint(checkpoint["committedIndex"], checkpoint["endIndex"]).decode() == \
        state["dledgerCheckpointFile"]
    assert checkpoint["committedIndex"] == state["recovered_committedIndex"]
    term, found = S.read_currterm(layout.dledger_dir)
    assert found == [] and D.encode_currterm(term["voteLeader"], term["currTerm"]).decode() == \
        state["dledgerCurrtermFile"]
    for u in units:     # the encoder twin writes every real unit byte for byte
        raw = Path(u["file"]).read_bytes()[u["file_position"]:u["file_position"] + 32]
        assert D.encode_index_unit(pos=u["pos"], size=u["size"], index=u["index"], term=u["term"]) == raw
    checks = S.verify_dledger(layout)
    if store == "clean":
        assert checks == []
    else:
        assert [(a.kind, a.actual) for a in checks] == [(AnomalyKind.DLEDGER_UNCOMMITTED,
                                                         str(state["recovered_ledgerEndIndex"]))]
        first = next(u for u in units if u["index"] == state["recovered_committedIndex"] + 1)
        assert checks[0].physical_offset == first["pos"] + 48


@pytest.mark.parametrize("store", STORES)
def test_reencoding_real_entries_gives_the_same_bytes(store):
    for f in _data_files(store):
        data = f.read_bytes()
        entries, _ = D.entries_of(f)
        for e in entries:
            at = e["file_position"]
            body = data[at + 48:at + e["size"]]
            assert D.encode_entry(body, index=e["index"], term=e["term"], pos=e["pos"]) == data[at:at + e["size"]]


# ------------------------------------------------------------------------------------------ synthetic logs
def _message(i: int) -> Message:
    return Message(topic="TopicA" if i % 3 else "RMQ_SYS_TRANS_HALF_TOPIC", body=bytes([65 + i % 26]) * (40 + 13 * i),
                   properties={"KEYS": f"k{i}", "UNIQ_KEY": f"U{i:08d}"}, queue_offset=i, born_timestamp=1000 + i,
                   store_timestamp=2000 + i, sys_flag=0)


def _log(tmp_path: Path, n: int = 30, file_size: int = 4096, term: int = 2) -> tuple:
    log = D.DataLog(file_size, term=term)
    offsets = [log.append(functools.partial(encode_record, _message(i)))[1] for i in range(n)]
    log.write(tmp_path / "dledger-n1", index_file_size=256, vote_leader="n1")
    return sorted((tmp_path / "dledger-n1" / "data").iterdir()), offsets


def test_writer_round_trip_rolls_files_like_mmapfilelist(tmp_path):
    files, offsets = _log(tmp_path)
    assert len(files) > 2 and all(f.stat().st_size == 4096 for f in files)
    rows = [r for f in files for r in _decode(f)[0]]
    assert [r["physical_offset"] for r in rows] == offsets
    assert [r["queue_offset"] for r in rows] == list(range(30))
    assert (tmp_path / "dledger-n1" / "currterm").read_text() == "voteLeader=n1\ncurrTerm=2\n"
    layout = mf.discover_store(tmp_path)
    assert S.verify_dledger(layout) == []
    assert mf.message_log_kind(tmp_path) == "dledger"


@pytest.mark.parametrize("topics", [["TopicA"], ["TopicA", "RMQ_SYS_TRANS_HALF_TOPIC", "Other"]])
def test_topic_filter_keeps_the_rows_of_those_topics(tmp_path, topics):
    files, _ = _log(tmp_path)
    every = [r for f in files for r in _decode(f)[0]]
    kept = [r for f in files for r in _decode(f, topics=topics)[0]]
    assert kept == [r for r in every if r["topic"] in topics] and kept


def test_every_split_point_yields_every_record_once(tmp_path):
    files, _ = _log(tmp_path, n=12, file_size=8192)
    f = files[0]
    whole = [r["physical_offset"] for r in _decode(f)[0]]
    size = f.stat().st_size
    for cut in range(0, size, 37):
        a = [r["physical_offset"] for r in _decode(f, start=0, end=cut)[0]]
        b = [r["physical_offset"] for r in _decode(f, start=cut, end=size)[0]]
        assert a + b == whole, cut


def test_truncation_at_every_byte_never_raises_and_keeps_intact_records(tmp_path):
    files, _ = _log(tmp_path, n=8, file_size=8192)
    data = files[0].read_bytes()
    full = _decode(files[0])[0]
    for cut in range(0, 2200, 7):
        p = tmp_path / "cut" / "00000000000000000000"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data[:cut])
        rows, found = _decode(p)
        kept = [r["physical_offset"] for r in rows]
        intact = [r["physical_offset"] for r in full if r["file_position"] + r["total_size"] <= cut]
        assert kept == intact, cut


def test_random_damage_never_raises_and_resynchronises(tmp_path):
    files, _ = _log(tmp_path, n=10, file_size=8192)
    data = files[0].read_bytes()
    full = _decode(files[0])[0]
    rng = random.Random(7)
    p = tmp_path / "dmg" / "00000000000000000000"
    p.parent.mkdir()
    for _ in range(150):
        buf = bytearray(data)
        at = rng.randrange(0, 2500)
        width = rng.choice([1, 4, 60])
        for k in range(at, min(at + width, len(buf))):
            buf[k] = rng.randrange(256)
        p.write_bytes(bytes(buf))
        rows, found = _decode(p)
        got = {r["physical_offset"] for r in rows}
        # every record whose entry lies wholly before the damage or starts after it survives
        for r in full:
            entry_start, entry_end = r["file_position"] - 48, r["file_position"] + r["total_size"]
            if entry_end <= at or entry_start >= at + width:
                assert r["physical_offset"] in got, (at, width, r["physical_offset"])
        if bytes(buf) != data and len(rows) < len(full):
            assert found, (at, width)


def test_garbage_entry_header_is_a_finding_and_following_entries_survive(tmp_path):
    files, _ = _log(tmp_path, n=6, file_size=8192)
    data = bytearray(files[0].read_bytes())
    entries, _ = D.entries_of(files[0])
    second = entries[1]["file_position"]
    data[second:second + 4] = b"\x7f\x7f\x7f\x7f"
    files[0].write_bytes(bytes(data))
    rows, found = _decode(files[0])
    assert [r["queue_offset"] for r in rows] == [0, 2, 3, 4, 5]
    assert [(a.kind, a.position) for a in found] == [(AnomalyKind.BAD_MAGIC, second)]
    assert f"resynchronised at file position {entries[2]['file_position']}" in found[0].detail


def test_entry_header_vs_record_mismatches(tmp_path):
    files, _ = _log(tmp_path, n=4, file_size=8192)
    data = bytearray(files[0].read_bytes())
    entries, _ = D.entries_of(files[0])
    e = entries[1]
    data[e["file_position"] + 44:e["file_position"] + 48] = (e["body_size"] + 1).to_bytes(4, "big")  # bodySize
    data[e["file_position"] + 48 + 28:e["file_position"] + 48 + 36] = (7).to_bytes(8, "big")  # PHYSICALOFFSET
    files[0].write_bytes(bytes(data))
    rows, found = _decode(files[0])
    assert len(rows) == 4
    kinds = sorted((a.kind, a.position) for a in found)
    assert kinds == [(AnomalyKind.DLEDGER_ENTRY_MISMATCH, e["file_position"]),
                     (AnomalyKind.PHYSICAL_OFFSET_MISMATCH, e["file_position"] + 48)]


def test_index_and_checkpoint_findings(tmp_path):
    _log(tmp_path, n=10, file_size=8192)
    d = tmp_path / "dledger-n1"
    idx = sorted((d / "index").iterdir())[0]
    raw = bytearray(idx.read_bytes())
    raw[3 * 32 + 4:3 * 32 + 12] = (999).to_bytes(8, "big")         # unit 3: wrong pos
    idx.write_bytes(bytes(raw))
    (d / "checkpoint").write_text("committedIndex=6\nendIndex=9\n")
    found = S.verify_dledger(mf.discover_store(tmp_path))
    assert sorted(a.kind for a in found) == [AnomalyKind.DLEDGER_INDEX_MISMATCH, AnomalyKind.DLEDGER_UNCOMMITTED]
    unc = next(a for a in found if a.kind == AnomalyKind.DLEDGER_UNCOMMITTED)
    assert "entries 7..9" in unc.detail
    (d / "checkpoint").unlink()
    (d / "checkpoint.bak").write_text("committedIndex=x\n")
    found = S.verify_dledger(mf.discover_store(tmp_path))
    assert {a.kind for a in found} >= {AnomalyKind.MISSING_FILE, AnomalyKind.BAD_CHECKPOINT}


def test_decoder_never_writes_its_input():
    before = {f: f.stat().st_mtime_ns for f in _data_files("crashed")}
    for f in before:
        _decode(f)
    assert {f: f.stat().st_mtime_ns for f in before} == before


# ------------------------------------------------------------------------------------------ discovery
def test_converted_store_reads_commitlog_then_dledger_as_one_log(tmp_path):
    from txlog_io.commitlog import encode_blank

    # legacy file-mode CommitLog: 2 records then BLANK; DLedger continues at the next file boundary
    size = 4096
    legacy = bytearray()
    for i in range(2):
        legacy += encode_record(_message(i), len(legacy))
    legacy += encode_blank(size - len(legacy))
    legacy += bytes(size - len(legacy))
    (tmp_path / "commitlog").mkdir()
    (tmp_path / "commitlog" / f"{0:020d}").write_bytes(bytes(legacy))
    log = D.DataLog(size, start_offset=size)
    offsets = [log.append(functools.partial(encode_record, _message(i)))[1] for i in range(2, 6)]
    log.write(tmp_path / "dledger-n0", index_file_size=256)
    layout = mf.discover_store(tmp_path)
    assert mf.message_log_kind(tmp_path) == "converted"
    assert layout.dledger_divided_offset == size
    assert [f.base_offset for f in layout.commitlog] == [0, size]
    rows = [row for f in layout.commitlog for b, _ in D.decode_log_range(str(f.path)) for row in b.to_pylist()]
    assert [r["queue_offset"] for r in rows] == list(range(6))
    assert [r["physical_offset"] for r in rows][2:] == offsets
    assert [a for a in layout.anomalies if a.source != "store"] == []


def test_unrecognised_and_ambiguous_layouts(tmp_path):
    (tmp_path / "config").mkdir()
    assert mf.message_log_kind(tmp_path) is None
    with pytest.raises(UsageError, match="dledger"):
        mf.discover_store(tmp_path)
    for n in ("dledger-a", "dledger-b"):
        (tmp_path / n / "data").mkdir(parents=True)
    with pytest.raises(UsageError, match="several DLedger stores"):
        mf.discover_store(tmp_path)


def test_dump_verify_reports_the_torn_entry_and_uncommitted_tail(tmp_path, capsys):
    from txlog_io.cli import main

    assert main(["commitlog", str(DLEDGER / "store-clean"), "--verify"]) == 0
    capsys.readouterr()
    assert main(["commitlog", str(DLEDGER / "store-crashed"), "--verify"]) == 1
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert sorted(x["kind"] for x in lines) == [AnomalyKind.BAD_TOTAL_SIZE, AnomalyKind.DLEDGER_UNCOMMITTED]
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_decode_bench_relays_the_same_records(tmp_path):
    from txlog_io import dledger_bench

    result = dledger_bench.run(2, 700, tmp_path, repeat=1)
    assert result["commitlog"]["rows"] == result["dledger"]["rows"] == result["records"] == \
        result["dledger_entries"] > 0
    assert result["dledger_vs_commitlog_time"] > 0


# ------------------------------------------------------------------------------------------ replicas
def make_replicas(tmp_path) -> list:
    """Three replicas of store-clean's group: r0 intact; r1 behind (its log ends after entry 1400, checkpoint
    committedIndex 1000); r2 with one byte of entry 700's record changed."""
    clean = DLEDGER / "store-clean"
    roots = []
    for name in ("r0", "r1", "r2"):
        root = tmp_path / name / "store"
        shutil.copytree(clean, root)
        for p in root.rglob("*"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        roots.append(root)
    entries = {}
    for f in sorted((roots[1] / "dledger-n0" / "data").iterdir()):
        for e in D.entries_of(f)[0]:
            entries[e["index"]] = (f, e)
    f, e = entries[1401]
    data = bytearray(f.read_bytes())
    data[e["file_position"]:] = bytes(len(data) - e["file_position"])
    f.write_bytes(bytes(data))
    for later in sorted((roots[1] / "dledger-n0" / "data").iterdir()):
        if later.name > f.name:
            later.write_bytes(bytes(later.stat().st_size))
    (roots[1] / "dledger-n0" / "checkpoint").write_text("committedIndex=1000\nendIndex=1400\n")
    f2, e2 = entries[700]
    f2 = roots[2] / "dledger-n0" / "data" / f2.name
    data = bytearray(f2.read_bytes())
    data[e2["file_position"] + 200] ^= 0xFF
    f2.write_bytes(bytes(data))
    return roots, entries


def test_replicas_of_one_group_collapse_to_the_most_committed(tmp_path):
    from txlog_io.dledger_store import collapse_replicas

    roots, entries = make_replicas(tmp_path)
    other = FIXTURES / "rocketmq-4.9.8-dledger" / "store-crashed"       # another broker: kept as it is
    stores = [("b", str(roots[1])), ("b", str(roots[0])), ("x", str(other)), ("b", str(roots[2]))]
    kept, findings = collapse_replicas(stores)
    assert kept == [("b", str(roots[0])), ("x", str(other))]
    assert [(b, a.kind) for b, a in findings] == [("b", AnomalyKind.DLEDGER_REPLICA_DIFFERS)] * 2
    behind, diverged = (a for _, a in findings)
    assert "lacks entries 1401..1528" in behind.detail and str(roots[1]) in behind.file
    assert "entry 700 differs" in diverged.detail and diverged.position == entries[700][1]["file_position"]
    # distinct names: distinct brokers, even with identical logs
    assert collapse_replicas([("a", str(roots[0])), ("c", str(roots[0]))]) == \
        ([("a", str(roots[0])), ("c", str(roots[0]))], [])
    with pytest.raises(UsageError, match="not replicas of one group"):
        collapse_replicas([("b", str(roots[0])), ("b", str(other))])
    with pytest.raises(UsageError, match="not a DLedger store"):
        collapse_replicas([("b", str(roots[0])), ("b", str(FIXTURES / "rocketmq-4.9.8" / "store"))])


def test_refbroker_fills_more_than_one_small_index_file(tmp_path):
    """The reference broker in DLedger mode with DLedger index files of 32 KiB (1,024 units each, as in the real
    4.9.8 fixture) and more entries than one file holds: the next index file is created at its full size and
    every entry has its unit, in order (generation used to fail with FileNotFoundError at the second file)."""
    from refbroker import generate
    from refbroker.profiles import get_profile

    prof = get_profile("5.1+").with_(dledger_self_id="n0", dledger_index_file_size=32768)
    res = generate(prof, "clean", 600, 1, tmp_path / "s", background_messages=0, msg_bytes=64)
    layout = mf.discover_store(res.store_dir)
    assert len(layout.dledger_index) >= 2 and all(f.size == 32768 for f in layout.dledger_index)
    units, found = S.decode_index(layout.dledger_index)
    assert found == []
    assert [u["index"] for u in units] == list(range(res.summary["store"]["records"]))
    pos = [u["pos"] for u in units]
    assert pos == sorted(pos) and len(set(pos)) == len(pos)
    with pytest.raises(UsageError, match="whole 32-byte units"):
        generate(prof.with_(dledger_index_file_size=32770), "clean", 2, 1, tmp_path / "t", background_messages=0)
