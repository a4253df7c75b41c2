"""Store bytes read, counted by the readers (txlog_io.readstats): the per-process files, the partition-end
flush, and what each audit mode reads of a store with few transactions (the bench's
``full_read_bytes`` / ``indexed_read_bytes``), counted in the driver and in the Spark Python workers."""
from __future__ import annotations

import os

import pytest

import refbroker
from jobs.bench import audit as B
from txlog_io import readstats
from txlog_io.commitlog import decode_range


def test_counts_reach_the_directory_at_partition_end(tmp_path, monkeypatch):
    monkeypatch.setenv(readstats.ENV, str(tmp_path))
    before = readstats.directory_total(str(tmp_path))
    start = readstats.process_total()

    def partition():
        readstats.add(1000)
        yield 1
        readstats.add(24)

    assert list(readstats.flushing(partition())) == [1]       # flushed when the partition ends
    assert readstats.process_total() - start == 1024
    assert before == 0 and readstats.directory_total(str(tmp_path)) == readstats.process_total()
    names = [n for n in os.listdir(tmp_path) if n.endswith(readstats.SUFFIX)]
    assert len(names) == 1 and names[0].startswith(f"{os.getpid()}-")


def test_bytes_are_also_counted_per_kind_of_file(tmp_path, monkeypatch):
    monkeypatch.setenv(readstats.ENV, str(tmp_path))
    before = readstats.process_kinds()
    readstats.add(100, "commitlog")
    readstats.add(20, "consumequeue")
    readstats.add(7)
    readstats.flush()
    after = readstats.process_kinds()
    assert {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)} == \
        {"commitlog": 100, "consumequeue": 20, "other": 7}
    kinds = readstats.directory_kinds(str(tmp_path))
    assert kinds == after and sum(kinds.values()) == readstats.directory_total(str(tmp_path))


def test_counting_is_off_without_the_variable(monkeypatch):
    monkeypatch.delenv(readstats.ENV, raising=False)
    start = readstats.process_total()
    readstats.add(4096)
    readstats.flush()
    assert readstats.process_total() == start


def test_a_decoder_counts_the_bytes_it_reads(tmp_path, monkeypatch):
    out = tmp_path / "s"
    refbroker.generate("5.1+", "clean", 5, 3, out, background_messages=200, msg_bytes=512,
                       commitlog_file_mb=1)
    monkeypatch.setenv(readstats.ENV, str(tmp_path / "stats"))
    files = sorted((out / "store" / "commitlog").iterdir())
    start = readstats.process_total()
    records = sum(b.num_rows for b, _ in decode_range(files[0]))
    assert records > 200
    # every record's bytes at least (the framing also re-reads boundaries and checks the zero tail)
    assert 200 * 512 < readstats.process_total() - start


@pytest.mark.spark
def test_indexed_mode_reads_a_fraction_of_what_full_mode_reads(spark, tmp_path):
    out = tmp_path / "gen"
    # small consume-queue files: the CommitLog is most of the store, as on a real broker (the default 6 MB
    # preallocated queue files would dwarf an 8 MiB CommitLog; every mode reads them whole for findings)
    res = refbroker.generate("5.1+", "clean", 8, 11, out, background_messages=12000, msg_bytes=1024,
                             commitlog_file_mb=1, cq_file_units=2000)
    record_bytes = res.summary["store"]["record_bytes"]
    stats = B.read_stats_dir(spark, tmp_path)           # on for the driver and the workers started from now
    assert stats is not None
    read = {}
    try:
        for mode in ("full", "indexed"):
            t0 = B.read_bytes_total(stats)
            _, summary = B.timed_audit(spark, res.store_dir, tmp_path / f"out-{mode}", mode)
            read[mode] = B.read_bytes_total(stats) - t0
            assert summary.transactions == 8
    finally:
        os.environ.pop(readstats.ENV, None)
        spark.sparkContext.environment.pop(readstats.ENV, None)
    # full mode reads every record (plus queues, config, fingerprints); indexed mode the transactions'
    # records, the index files' slots and chains, each file's last 64 KiB (FILE_END) and the small files
    assert read["full"] >= record_bytes
    # (measured: full 22.5 MB, indexed 8.2 MB; on 1 MiB files the per-file reads -- each file's last 64 KiB,
    # the fingerprint's edges -- weigh much more than on 1 GiB files)
    assert 0 < read["indexed"] < read["full"] / 2, read


def test_a_queue_tail_costs_a_block_not_the_preallocated_file(tmp_path, monkeypatch):
    """The dispatch point of a preallocated 6 MB ConsumeQueue file holding a few units: bisection to the zero
    tail, then one block (it used to read the zeros backwards: the whole file)."""
    from txlog_io.consumequeue import encode_cq_unit, last_unit_end

    f = tmp_path / "00000000000000000000"
    units = b"".join(encode_cq_unit(1000 + 100 * i, 100, 0) for i in range(50))
    f.write_bytes(units + bytes(6_000_000 - len(units)))
    monkeypatch.setenv(readstats.ENV, str(tmp_path))
    start = readstats.process_total()
    assert last_unit_end(f) == 1000 + 100 * 49 + 100
    assert readstats.process_total() - start <= 64 * 1024 + 30 * 20
