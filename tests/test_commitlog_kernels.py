"""The compiled decode kernels against the encoder and the Python reference codecs (hypothesis round trips).

Every generated record is encoded by ``txlog_io.commitlog.encode_record`` into a real CommitLog file, decoded by
``decode_file`` (the numba kernels) and compared column by column with values computed independently in Python:
``properties.decode_properties`` (string2messageProperties), ``properties.java_string_hash``,
``msgid.offset_msg_id`` / ``host_text``, ``zlib.crc32``.  Damaged files must still yield every record that the
damage did not touch (resynchronisation), each exactly once.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import zlib

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from txlog_io import crc_kernels as C
from txlog_io import properties as P
from txlog_io import text_kernels as T
from txlog_io.commitlog import Message, decode_file, encode_record
from txlog_io.msgid import host_text, offset_msg_id, parse_host

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_text = st.text(st.characters(codec="utf-8", exclude_characters="\x00\x01\x02"), min_size=0, max_size=12)
_key = st.sampled_from([P.UNIQ_KEY, P.TAGS, P.KEYS, P.PGROUP, P.REAL_TOPIC, P.REAL_QID, P.TRAN_MSG,
                        P.TRANSACTION_CHECK_TIMES, P.TRANSACTION_ID, "WAIT", "k", "ä"]) | _text
_raw_props = st.lists(st.tuples(_key, _text), max_size=6).map(
    lambda kv: b"".join(k.encode() + b"\x01" + v.encode() + b"\x02" for k, v in kv))
_host = st.sampled_from(["10.0.0.1:50000", "192.168.1.200:-5", "[::1]:10911", "[fe80::12:abcd]:7"])


@st.composite
def messages(draw):
    topic = draw(st.sampled_from(["TopicA", "RMQ_SYS_TRANS_HALF_TOPIC", "Ω-topic", "t" * 130]))
    raw = draw(st.one_of(_raw_props, st.binary(max_size=30), _raw_props.map(lambda b: b[:-1])))
    return Message(topic=topic, body=draw(st.binary(max_size=300)), properties_raw=raw,
                   queue_id=draw(st.integers(-5, 1000)), flag=draw(st.integers(-(1 << 31), (1 << 31) - 1)),
                   queue_offset=draw(st.integers(0, 1 << 40)), sys_flag=draw(st.sampled_from([0, 4, 8, 12, 1])),
                   born_timestamp=draw(st.integers(0, 1 << 42)), born_host=draw(_host),
                   store_timestamp=draw(st.integers(0, 1 << 42)), store_host=draw(_host),
                   reconsume_times=draw(st.integers(0, 20)),
                   prepared_transaction_offset=draw(st.integers(0, 1 << 40)),
                   append_prop_crc=draw(st.booleans()))


def _write(msgs, tail=64) -> tuple:
    """A fresh CommitLog file (base offset 0) holding ``msgs`` and a zero tail; -> (path, spans, bytes)."""
    path = os.path.join(tempfile.mkdtemp(prefix="txlog-kernels-"), "0" * 20)
    spans, pos, out = [], 0, bytearray()
    for m in msgs:
        rec = encode_record(m, pos)
        spans.append((pos, pos + len(rec)))
        out += rec
        pos += len(rec)
    out += bytes(tail)
    with open(path, "wb") as fh:
        fh.write(out)
    return path, spans, out


def _stored_props(m: Message, stored: bytes) -> bytes:
    """The PROPERTIES bytes of ``m`` as stored in its record ``stored``."""
    props_raw = m.properties_bytes()
    if m.append_prop_crc:            # what CommitLog.doAppend stores: a 0x02 if missing, then the CRC entry
        props_raw += (b"\x02" if props_raw and not props_raw.endswith(b"\x02") else b"") + stored[-20:]
    return props_raw


def _expected(m: Message, pos: int, stored: bytes) -> dict:
    props = P.decode_properties(_stored_props(m, stored))
    ip, port = parse_host(m.store_host)
    tags = props.get(P.TAGS)
    return {
        "file_position": pos, "topic": m.topic, "body": m.body, "queue_id": m.queue_id, "flag": m.flag,
        "queue_offset": m.queue_offset, "born_timestamp": m.born_timestamp,
        "store_timestamp": m.store_timestamp, "reconsume_times": m.reconsume_times,
        "prepared_transaction_offset": m.prepared_transaction_offset, "body_size": len(m.body),
        "born_host": host_text(*parse_host(m.born_host)), "store_host": host_text(ip, port),
        "msg_id": offset_msg_id(ip, port, pos), "body_crc_ok": True,
        "magic_version": m.resolved_magic_version(),
        "properties": props, "uniq_key": props.get(P.UNIQ_KEY), "tags": tags, "keys": props.get(P.KEYS),
        "pgroup": props.get(P.PGROUP), "real_topic": props.get(P.REAL_TOPIC),
        "transaction_id": props.get(P.TRANSACTION_ID), "tags_code": P.tags_code(tags),
        "tran_msg": None if P.TRAN_MSG not in props else props[P.TRAN_MSG] == "true",
        "transaction_type": ["NOT", "PREPARED", "COMMIT", "ROLLBACK"][(m.sys_flag & 0xC) >> 2],
    }


def _rows(path) -> tuple:
    batches, anomalies = [], []
    for b, a in decode_file(path, with_body=True):
        batches.append(b)
        anomalies += a
    table = pa.Table.from_batches(batches) if batches else None
    rows = table.to_pylist() if table is not None else []
    for r in rows:
        r["properties"] = dict(r["properties"])
    return rows, anomalies


@SETTINGS
@given(st.lists(messages(), min_size=1, max_size=12))
def test_kernels_decode_what_the_encoder_wrote(msgs):
    path, spans, data = _write(msgs)
    rows, anomalies = _rows(path)
    assert [r["file_position"] for r in rows] == [s for s, _ in spans]
    # raw properties that end in a zero byte are what a zeroed tail leaves (commitlog_rows.zero_tail_findings):
    # the record is still read, with that finding
    zero_tailed = [s for m, (s, e) in zip(msgs, spans, strict=True) if _stored_props(m, bytes(data[s:e]))[-1:] == b"\x00"]
    assert [(a.kind, a.position) for a in anomalies] == [("BAD_PROPERTIES", s) for s in zero_tailed]
    for m, (s, e), row in zip(msgs, spans, rows, strict=True):
        exp = _expected(m, s, bytes(data[s:e]))
        assert {k: row[k] for k in exp} == exp
        assert row["body_crc"] == (zlib.crc32(m.body) & 0x7FFFFFFF if m.body else 0)
    shutil.rmtree(os.path.dirname(path))


@SETTINGS
@given(st.lists(messages(), min_size=3, max_size=10), st.data())
def test_resynchronisation_finds_every_intact_record(msgs, data):
    path, spans, raw = _write(msgs)
    start = data.draw(st.integers(0, len(raw) - 65))
    length = data.draw(st.integers(1, 200))
    fill = data.draw(st.sampled_from([b"\x00", b"\xff", b"\xda"]))
    damaged = bytearray(raw)
    end = min(start + length, len(raw) - 64)
    damaged[start:end] = fill * (end - start)
    with open(path, "wb") as fh:
        fh.write(damaged)
    rows, anomalies = _rows(path)
    got = [r["file_position"] for r in rows]
    assert len(got) == len(set(got))
    intact = [s for s, e in spans if e <= start or s >= end]
    assert set(intact) <= set(got), (start, end, spans)
    by_pos = {r["file_position"]: r for r in rows}
    for m, (s, _e) in zip(msgs, spans, strict=True):
        if s in intact:
            assert by_pos[s]["topic"] == m.topic and by_pos[s]["body"] == m.body
    shutil.rmtree(os.path.dirname(path))


def test_java_hash_kernel_matches_java_for_non_ascii_and_flags_bad_utf8():
    import numpy as np

    values = ["", "Tag1", "ä", "日本", "😀x", None]
    raw = [b"" if v is None else v.encode() for v in values] + [b"\xff\xfe"]
    data = np.frombuffer(b"".join(raw), np.uint8).copy()
    off = np.zeros(len(raw) + 1, np.int32)
    np.cumsum([len(r) for r in raw], out=off[1:])
    valid = np.array([v is not None for v in values] + [True])
    codes, bad = T.java_hashes(data, off, valid)
    assert codes[:-1].tolist() == [P.tags_code(v) for v in values]
    assert bad.tolist() == [False] * len(values) + [True]


def test_crc_kernel_matches_zlib_whichever_library_backs_it():
    import numpy as np

    data = np.frombuffer(os.urandom(70_000), np.uint8)
    for start, length in ((0, 0), (0, 1), (3, 7), (5, 1000), (1, 65_537), (0, 70_000)):
        assert C.crc32_zlib(data, start, length) == zlib.crc32(bytes(data[start:start + length])) & 0x7FFFFFFF
    assert C.CRC32_IMPL in ("isal crc32_gzip_refl", "zlib crc32")


def test_chunk_pool_never_hands_out_a_buffer_something_still_references():
    from txlog_io.positional import ChunkPool

    pool = ChunkPool(keep=1)
    first = pool.take(100)
    first[:] = 7
    held = pa.py_buffer(first)                  # an Arrow buffer over it, as a batch column would hold
    del first
    second = pool.take(100)
    assert bytes(held) == bytes([7]) * 100      # not handed out again while referenced
    second[:] = 9
    assert bytes(held) == bytes([7]) * 100
    del held, second
    third = pool.take(50)                       # now only the pool holds it: reused
    assert third[0] == 7 and third.size == 50
    held = pa.py_buffer(third)                  # a slice of the pooled array keeps it taken too
    del third
    assert pool.take(50)[0] != 7 or bytes(held) == bytes([7]) * 50
    fourth = pool.take(50)
    fourth[:] = 1
    assert bytes(held) == bytes([7]) * 50


def test_chunk_pool_serves_sizes_that_grow_a_little_from_its_buffers():
    """Batch sizes vary by a few bytes from one batch to the next: a buffer too small for the next size is
    replaced once (with room to spare), not bypassed by a fresh array on every call."""
    from txlog_io.positional import ChunkPool

    pool = ChunkPool(keep=2)
    a, b = pool.take(1 << 20), pool.take(1 << 20)       # both pooled, both held
    del a, b
    bases = set()
    for size in range((1 << 20) + 8, (1 << 20) + 800, 8):
        buf = pool.take(size)
        assert buf.size == size and any(buf.base is kept for kept in pool._bufs)
        bases.add(id(buf.base))
        del buf
    assert len(bases) == 1                              # replaced once, then reused for every larger size
    assert len(pool._bufs) == 2

def test_batches_a_caller_keeps_are_not_overwritten_by_later_ones():
    """Each batch is read from a pooled buffer (txlog_io.ipc_batch): one the caller still holds is never
    handed out again, so batches kept across many chunks equal the same rows converted one at a time."""
    msgs = [Message(topic=f"T{i % 3}", body=bytes([i % 251]) * (100 + i), properties={P.TAGS: f"tag{i}",
                    P.UNIQ_KEY: f"K{i}", P.REAL_QID: str(i)}, born_host="10.0.0.1:1", store_host="10.0.0.2:2")
            for i in range(300)]
    path, _, _ = _write(msgs)
    kept = [b for b, _ in decode_file(path, with_body=True, chunk_bytes=4096)]
    assert len(kept) > 10
    one_by_one = [row for b, _ in decode_file(path, with_body=True, chunk_bytes=4096)
                  for row in b.to_pylist()]
    assert pa.Table.from_batches(kept).to_pylist() == one_by_one
    assert [r["body"] for r in one_by_one] == [m.body for m in msgs]
    assert [r["real_qid"] for r in one_by_one] == list(range(300))


def test_properties_of_many_tiny_entries_overflow_the_first_layout_and_still_decode_exactly():
    """``batch_kernels.layout`` first gives the map one entry per 10 properties bytes; 4-byte entries
    overflow that room and the batch is filled again with room for every possible entry."""
    raw = b"".join(bytes([97 + i % 26]) + b"\x01" + bytes([48 + i % 10]) + b"\x02" for i in range(40))
    msgs = [Message(topic="T", body=b"x", properties_raw=raw + b"TAGS\x01t\x02", born_host="10.0.0.1:1",
                    store_host="10.0.0.2:2") for _ in range(5)]
    path, spans, stored = _write(msgs)
    rows, anomalies = _rows(path)
    assert not anomalies
    for row, m, (start, end) in zip(rows, msgs, spans, strict=True):
        assert row["properties"] == _expected(m, start, bytes(stored[start:end]))["properties"]
        assert len(row["properties"]) == 27 and row["tags"] == "t"


def test_a_kernel_is_recompiled_when_a_helper_it_inlines_from_another_kernel_module_changes(tmp_path):
    """numba stamps a function's disk cache with its own file only; the kernel modules inline each other's
    helpers (``commitlog_kernels.u32``, ``copy_bytes``), so ``txlog_io.jit`` stamps them on all of them.
    Without that, the second process below would load the cached kernel with the old helper inlined (1)."""
    import subprocess
    import sys

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    helper = ('from txlog_io.jit import njit\n\n\n@njit(inline="always")\ndef helper():\n    return {}\n')
    (pkg / "a_kernels.py").write_text(helper.format(1))
    (pkg / "b_kernels.py").write_text("from txlog_io.jit import njit\nfrom a_kernels import helper\n\n\n"
                                      "@njit\ndef kernel():\n    return helper()\n")
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pkg), repo]),
               NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    probe = [sys.executable, "-c",
             "import b_kernels; print(b_kernels.kernel(), sum(b_kernels.kernel.stats.cache_hits.values()))"]

    def run():
        return subprocess.run(probe, env=env, capture_output=True, text=True, check=True).stdout.split()

    assert run() == ["1", "0"]                     # compiled and cached
    assert run() == ["1", "1"]                     # loaded from the cache
    (pkg / "a_kernels.py").write_text(helper.format(2))
    assert run() == ["2", "0"]                     # compiled again


def _python_int(value, bits):
    """The numeric property rule: Python's int() of the text, null when that fails or is out of range."""
    try:
        x = int(value)
    except (TypeError, ValueError):
        return None
    return x if -(1 << (bits - 1)) <= x < (1 << (bits - 1)) else None


def test_numeric_and_tran_msg_columns_without_arrow_casts(tmp_path):
    """REAL_QID (int32), TRAN_PREPARED_QUEUE_OFFSET (int64) and TRAN_MSG are built by kernels when every value
    of the batch is plain decimal: a batch of plain values and one that also holds values only int() reads
    (or nothing reads) give the same values as the Python rule, and TRAN_MSG is true only for "true"."""
    plain = ["0", "-0", "+5", "0012", "2147483647", "-2147483648", "999999999999999999", None]
    odd = plain + [" 7", "1_0", "2147483648", "abc", "١٢", "-", "+"]
    tran = ["true", "True", "false", "truex", "tru", None]
    for name, values in (("plain", plain), ("odd", odd)):
        data, off = bytearray(), 0
        for i, v in enumerate(values):
            props = {} if v is None else {P.REAL_QID: v, P.TRAN_PREPARED_QUEUE_OFFSET: v}
            if tran[i % len(tran)] is not None:
                props[P.TRAN_MSG] = tran[i % len(tran)]
            rec = encode_record(Message(topic="T", properties=props, queue_offset=i), off)
            data += rec
            off += len(rec)
        path = tmp_path / name / "00000000000000000000"
        path.parent.mkdir()
        path.write_bytes(bytes(data) + bytes(64))
        rows = [r for batch, _ in decode_file(str(path)) for r in batch.to_pylist()]
        assert [r["real_qid"] for r in rows] == [_python_int(v, 32) for v in values], name
        assert [r["tran_prepared_queue_offset"] for r in rows] == [_python_int(v, 64) for v in values], name
        want = [None if t is None else t == "true" for t in (tran[i % len(tran)] for i in range(len(values)))]
        assert [r["tran_msg"] for r in rows] == want, name


def test_kernels_imported_from_a_copied_zip_archive_load_the_cache_of_an_earlier_copy(tmp_path):
    """spark-submit copies the ``--py-files`` archive into a new directory per application; a kernel imported
    from a copy at another path, with the same bytes, is loaded from the disk cache, and one from an archive
    with other bytes is compiled again."""
    import shutil
    import subprocess
    import sys
    import zipfile

    def archive(value):
        path = tmp_path / f"src{value}.zip"
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("zpkg/__init__.py", "")
            zf.writestr("zpkg/k_kernels.py", f"from txlog_io.jit import njit\n\n\n@njit\ndef kernel():\n"
                                             f"    return {value}\n")
        return path

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    probe = "from zpkg import k_kernels as k; print(k.kernel(), sum(k.kernel.stats.cache_hits.values()))"

    def run(src, copy):
        target = tmp_path / copy / "pyfiles.zip"
        target.parent.mkdir()
        shutil.copy(src, target)                      # a fresh copy: new path, new mtime
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), repo]),
                   NUMBA_CACHE_DIR=str(tmp_path / "cache"))
        return subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                              check=True).stdout.split()

    one = archive(1)
    assert run(one, "app-1") == ["1", "0"]          # compiled and cached
    assert run(one, "app-2") == ["1", "1"]          # another application's copy: loaded from the cache
    assert run(archive(2), "app-3") == ["2", "0"]   # other bytes: compiled again
    assert len(list((tmp_path / "cache").glob("zip_*"))) == 2


def test_no_usable_temporary_directory_means_no_cache_not_a_traceback(monkeypatch, tmp_path):
    """On a full disk ``tempfile.gettempdir`` raises (no usable temporary directory); with the home cache
    unwritable too, the numba cache is simply off (NUMBA_CACHE_DIR unset) instead of the import failing."""
    import os
    import tempfile

    from txlog_io import jit

    def no_temp():
        raise FileNotFoundError(2, "No usable temporary directory found")

    monkeypatch.setattr(tempfile, "gettempdir", no_temp)
    monkeypatch.setenv("HOME", str(tmp_path / "file-not-dir"))
    (tmp_path / "file-not-dir").write_text("")          # ~/.cache cannot be made under a file
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    assert jit.cache_dir() == ""
    assert "NUMBA_CACHE_DIR" not in os.environ
