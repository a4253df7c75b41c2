"""txlog_io.unitchain: a unit file (consume queue, 3.x statetable / redolog) whose content does not belong at
its name's offset -- a copy of the file before it, a stale older copy -- is reported once, at its first unit;
the stores RocketMQ and the reference broker write (several files per queue) report nothing."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import FIXTURES

from refbroker.generate import generate
from txlog_io.errors import AnomalyKind
from txlog_io.mappedfile import discover_store, list_mapped_files, offset_to_file_name
from txlog_io.unitchain import CommitLogBounds, check_store_unit_chains, check_unit_chain, commitlog_bounds

SIZES = dict(commitlog_file_size=256 * 1024, cq_file_units=30, statetable_file_size=240,
             redolog_file_size=400)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    base = tmp_path_factory.mktemp("unitchain")
    return {p: generate(p, "legacy-3x" if p == "3.x" else "crashy", 60, 7, base / p, **SIZES).store_dir
            for p in ("3.x", "5.1+")}


def test_real_and_reference_stores_report_nothing(stores):
    roots = [FIXTURES / v / "store" for v in ("rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3")]
    roots += [FIXTURES / "rocketmq-4.9.8-dledger" / s for s in ("store-clean", "store-crashed")]
    for root in roots + list(stores.values()):
        layout = discover_store(root)
        assert check_store_unit_chains(layout) == [], root
    # the generated stores do exercise file boundaries
    layout = discover_store(stores["3.x"])
    assert len(layout.statetable) > 1 and len(layout.redolog) > 1
    assert any(len(files) > 1 for files in discover_store(stores["5.1+"]).consume_queues.values())


def _queue_dir(layout, kind):
    if kind == "consumequeue":
        files = max(layout.consume_queues.values(), key=len)
    else:
        files = getattr(layout, kind)
    return files[0].path.parent, files


@pytest.mark.parametrize("profile,kind",
                         [("5.1+", "consumequeue"), ("3.x", "statetable"), ("3.x", "redolog")])
@pytest.mark.parametrize("how", ["copy_of_previous", "stale_middle"])
def test_misplaced_file_is_reported_at_its_first_unit(stores, tmp_path, profile, kind, how):
    src_dir, files = _queue_dir(discover_store(stores[profile]), kind)
    work = tmp_path / "q"
    shutil.copytree(src_dir, work)
    names = [f.name for f in files]
    if how == "copy_of_previous":
        # the newest file copied under the next name: right size, valid units, contiguous names
        victim = offset_to_file_name(files[-1].base_offset + files[-1].size)
        shutil.copyfile(work / names[-1], work / victim)
        previous = names[-1]
    else:
        # a middle file replaced by the one before it (a restore from an older backup)
        victim = names[1]
        shutil.copyfile(work / names[0], work / victim)
        previous = names[0]
    listed, _ = list_mapped_files(work, source=kind)
    found = check_unit_chain(listed, kind, "q")
    assert [(a.kind, Path(a.file).name) for a in found][:1] == [(AnomalyKind.UNIT_FILE_OUT_OF_ORDER, victim)]
    a = found[0]
    assert previous in a.detail and a.expected.startswith("commitlog_offset >= ")
    assert int(a.actual.split("=")[1]) < int(a.expected.split(">= ")[1])
    assert a.physical_offset == int(victim) + a.position
    # the file after a stale middle one continues the stale copy's offsets: one finding, not two
    assert len(found) == 1


def test_untouched_queue_reports_nothing(stores):
    src_dir, files = _queue_dir(discover_store(stores["5.1+"]), "consumequeue")
    assert len(files) > 1 and check_unit_chain(files, "consumequeue") == []


def test_plausible_unit_born_after_the_data_is_reported(stores, tmp_path):
    """A flipped bit in the first unwritten unit makes a unit no zero unit precedes: only the order shows it."""
    from txlog_io.consumequeue import encode_cq_unit

    src_dir, files = _queue_dir(discover_store(stores["5.1+"]), "consumequeue")
    work = tmp_path / "q"
    shutil.copytree(src_dir, work)
    newest = work / files[-1].name
    data = bytearray(newest.read_bytes())
    end = len(data.rstrip(b"\0"))
    end = -(-end // 20) * 20
    assert check_unit_chain(list_mapped_files(work, source="consumequeue")[0], "consumequeue") == []
    data[end:end + 20] = encode_cq_unit(0, 1 << 12, 0)       # offset 0: behind every unit before it
    newest.write_bytes(bytes(data))
    found = check_unit_chain(list_mapped_files(work, source="consumequeue")[0], "consumequeue")
    assert [(a.kind, Path(a.file).name, a.position) for a in found] == \
        [(AnomalyKind.UNIT_OUT_OF_ORDER, newest.name, end)]
    assert found[0].actual == "commitlog_offset=0"


@pytest.mark.parametrize("unit,expected", [
    ((1 << 62, 300, -1797392022), "commitlog_offset + size <= "),    # fuzz seed 21 case 83554: forward
    ((4096, 1 << 20, 0), "size <= "),                                # bigger than a CommitLog file
    ((4096, 50, 0), "size >= 91"),                                   # smaller than any record
])
def test_impossible_unit_born_after_the_data_is_reported(stores, tmp_path, unit, expected):
    """Random bytes after the data can make a unit that points *forward* (the order cannot show it): its
    record would lie past the newest CommitLog file, or be larger than one, or smaller than any record.
    One finding for it, and it does not make the next file look out of order."""
    from txlog_io.consumequeue import encode_cq_unit

    layout = discover_store(stores["5.1+"])
    bounds = commitlog_bounds(layout)
    assert bounds == CommitLogBounds(max(mf.base_offset for mf in layout.commitlog) + 256 * 1024, 256 * 1024)
    src_dir, files = _queue_dir(layout, "consumequeue")
    work = tmp_path / "q"
    shutil.copytree(src_dir, work)
    victim = work / files[-2].name                       # not the newest file: a file follows it
    data = bytearray(victim.read_bytes())
    end = -(-len(data.rstrip(b"\0")) // 20) * 20
    if end == len(data):                                 # a full file: damage its last unit instead
        end -= 20
    data[end:end + 20] = encode_cq_unit(*unit)
    victim.write_bytes(bytes(data))
    listed = list_mapped_files(work, source="consumequeue")[0]
    found = check_unit_chain(listed, "consumequeue", bounds=bounds)
    assert [(a.kind, Path(a.file).name, a.position) for a in found] == \
        [(AnomalyKind.IMPOSSIBLE_UNIT, victim.name, end)]
    assert found[0].expected.startswith(expected), found[0]
    assert found[0].actual == f"commitlog_offset={unit[0]} size={unit[1]}"


def test_units_of_a_misplaced_queue_file_are_dropped_from_the_cross_checks(stores, tmp_path):
    """drop_misplaced_units: the units of the file a UNIT_FILE_OUT_OF_ORDER finding covers (its queue offsets,
    from the finding's logical offset and length), and only those, of that broker and queue."""
    from txlog_io.unitchain import drop_misplaced_units

    src_dir, files = _queue_dir(discover_store(stores["5.1+"]), "consumequeue")
    queue = tmp_path / "consumequeue" / "T" / "3"
    shutil.copytree(src_dir, queue)
    copy = queue / offset_to_file_name(files[-1].base_offset + files[-1].size)
    shutil.copyfile(queue / files[-1].name, copy)
    (a,) = check_unit_chain(list_mapped_files(queue, source="consumequeue")[0], "consumequeue")
    finding = dict(a.to_dict(), broker="b")
    first, n = int(copy.name) // 20, a.length // 20
    assert n > 1
    rows = [{"broker": b, "topic": t, "queue_id": q, "queue_offset": o} for b in ("b", "other")
            for t, q in (("T", 3), ("T", 4)) for o in (first - 1, first, first + n - 1, first + n)]
    units = pa.Table.from_pylist(rows)
    kept = drop_misplaced_units(units, [finding]).to_pylist()
    assert [u for u in rows if u not in kept] == [
        {"broker": "b", "topic": "T", "queue_id": 3, "queue_offset": o} for o in (first, first + n - 1)]
    assert drop_misplaced_units(units, [dict(finding, kind="UNIT_OUT_OF_ORDER")]) is units
