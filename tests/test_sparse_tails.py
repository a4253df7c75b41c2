"""File holes (the unwritten tail RocketMQ's ``setLength``-preallocated mapped files keep until written) are
zeros the readers skip unread (``txlog_io.positional.next_data``): the same rows and findings as reading them,
fewer bytes.  Checked against a non-sparse copy of the same bytes, with garbage after the hole too."""
from __future__ import annotations

import os

import pytest

from txlog_io import readstats
from txlog_io.commitlog import Message, decode_file, encode_record
from txlog_io.consumequeue import decode_consumequeue, encode_cq_unit

MIB = 1 << 20


def _sparse(path, data: bytes, size: int, tail: bytes = b"") -> None:
    """``data`` at 0, a hole up to ``size - len(tail)``, ``tail`` at the end (a hole only where FS allows)."""
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(size)
        if tail:
            f.seek(size - len(tail))
            f.write(tail)


def _dense_copy(src, dst) -> None:
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(f.read())


def _counted(monkeypatch, tmp_path, fn):
    monkeypatch.setenv(readstats.ENV, str(tmp_path))
    start = readstats.process_total()
    out = fn()
    return out, readstats.process_total() - start


def _holes_supported(path) -> bool:
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < os.fstat(fd).st_size
    except OSError:
        return False
    finally:
        os.close(fd)


def _commitlog_bytes(n: int) -> bytes:
    out, pos = b"", 0
    for i in range(n):
        rec = encode_record(Message(topic="T", body=b"x" * 300, properties={"UNIQ_KEY": f"K{i:04d}"}), pos)
        out += rec
        pos += len(rec)
    return out


def _decoded(path):
    rows, found = [], []
    for batch, anomalies in decode_file(str(path)):
        rows += batch.column("physical_offset").to_pylist()
        found += [(a.kind, a.position) for a in anomalies]
    return rows, found


@pytest.mark.parametrize("garbage", [b"", b"\x01\x02\x03\x04"])
def test_commitlog_hole_is_skipped_with_the_same_result(tmp_path, monkeypatch, garbage):
    sparse, dense = tmp_path / "00000000000000000000", tmp_path / "dense" / "00000000000000000000"
    dense.parent.mkdir()
    _sparse(sparse, _commitlog_bytes(50), 16 * MIB, garbage)
    if not _holes_supported(sparse):
        pytest.skip("file system without holes")
    _dense_copy(sparse, dense)
    got, read_sparse = _counted(monkeypatch, tmp_path, lambda: _decoded(sparse))
    want, read_dense = _counted(monkeypatch, tmp_path, lambda: _decoded(dense))
    assert got == want and len(got[0]) == 50
    assert ("GARBAGE_AFTER_END" in [k for k, _ in got[1]]) == bool(garbage)
    assert read_dense >= 16 * MIB and read_sparse < 2 * MIB, (read_sparse, read_dense)


@pytest.mark.parametrize("garbage", [b"", encode_cq_unit(5, 10, 0)])
def test_consumequeue_hole_is_skipped_with_the_same_result(tmp_path, monkeypatch, garbage):
    units = b"".join(encode_cq_unit(100 * i, 100, 0) for i in range(1000))
    sparse, dense = tmp_path / "00000000000000000000", tmp_path / "dense" / "00000000000000000000"
    dense.parent.mkdir()
    _sparse(sparse, units, 6_000_000, garbage)
    if not _holes_supported(sparse):
        pytest.skip("file system without holes")
    _dense_copy(sparse, dense)

    def decode(path):
        rows, found = [], []
        for batch, anomalies in decode_consumequeue(path, topic="T", queue_id=0, chunk_units=4096):
            rows += batch.column("commitlog_offset").to_pylist()
            found += [(a.kind, a.position) for a in anomalies]
        return rows, found

    got, read_sparse = _counted(monkeypatch, tmp_path, lambda: decode(sparse))
    want, read_dense = _counted(monkeypatch, tmp_path, lambda: decode(dense))
    assert got == want and len(got[0]) == 1000 + (1 if garbage else 0)
    assert [k for k, _ in got[1]] == (["GARBAGE_AFTER_END"] if garbage else [])
    assert read_dense == 6_000_000 and read_sparse <= 1000 * 20 + 8192, (read_sparse, read_dense)
