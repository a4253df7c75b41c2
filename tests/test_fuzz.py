"""Short, hypothesis-driven ``txlog-bench fuzz`` (the long campaign is the command; docs/robustness.md).

Every mutation class against every decoder of the real-broker fixtures, each case in the fuzz worker process
with a timeout: no exception but ``txlog_io.errors`` may leave a decoder, nothing may hang, no intact record
of a non-CommitLog file may be lost, no finding may be reported twice.  The CommitLog decoder is owned
elsewhere: it is held to "no uncaught exception, no hang" here, and the zeroed-page case that once lost intact records is tested below.
"""
from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.bench import fuzz
from txlog_io.config import read_consumer_offsets

FIXTURES = Path(__file__).resolve().parent / "data" / "fixtures"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    work = tmp_path_factory.mktemp("fuzz")
    targets = fuzz.build_corpus(work, fuzz.fixture_stores())
    runner = fuzz.Runner(timeout=20.0)
    scratch = work / "scratch"
    fuzz.remember_all(runner, targets, scratch / "orig")
    yield targets, runner, scratch
    runner.close()


def test_corpus_covers_every_decoder(corpus):
    targets = corpus[0]
    assert {t.kind for t in targets} == set(fuzz.KINDS)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2 ** 32 - 1), pick=st.integers(0, 10 ** 6), cls=st.sampled_from(fuzz.MUTATIONS))
def test_mutants_end_in_results_or_clean_errors(corpus, seed, pick, cls):
    targets, runner, scratch = corpus
    t = targets[pick % len(targets)]
    if cls not in fuzz._classes_for(t.kind):
        cls = fuzz._classes_for(t.kind)[seed % len(fuzz._classes_for(t.kind))]
    case = scratch / f"case-{seed}-{pick}-{cls}"
    shutil.rmtree(case, ignore_errors=True)
    m = fuzz.mutate(t, case, random.Random(seed), cls)
    c, payload, _ = runner.case(t, case, m)
    shutil.rmtree(case, ignore_errors=True)
    where = f"{t.label} {cls}({m.note}) seed={seed} damaged={m.damaged[:4]}: {str(payload)[:400]}"
    assert c["uncaught_exceptions"] == 0 and c["hangs"] == 0, where
    if t.kind != "commitlog":
        assert c["intact_records_lost"] == 0, where
        assert c["duplicate_reports"] == 0, where
        assert c["damage_not_reported"] == 0, where


def test_corrupt_config_falls_back_to_bak_and_says_so(tmp_path):
    src = FIXTURES / "rocketmq-5.3.3" / "store" / "config"
    shutil.copyfile(src / "consumerOffset.json.bak", tmp_path / "consumerOffset.json.bak")
    good, _ = read_consumer_offsets(src / "consumerOffset.json.bak")
    text = (src / "consumerOffset.json").read_text()
    (tmp_path / "consumerOffset.json").write_text(text[: len(text) // 2] + "}}garbage")
    rows, anomalies = read_consumer_offsets(tmp_path / "consumerOffset.json")
    assert [(r["topic"], r["group"], r["queue_id"], r["offset"]) for r in rows] == \
        [(r["topic"], r["group"], r["queue_id"], r["offset"]) for r in good]
    assert len(anomalies) == 1 and anomalies[0].kind == "BAD_JSON"
    assert anomalies[0].file.endswith("consumerOffset.json") and ".bak" in anomalies[0].detail
    assert anomalies[0].position > 0


def test_fuzz_command_prints_its_tables(capsys):
    from jobs.bench.cli import main as bench_main

    assert bench_main(["fuzz", "--cases", "150", "--seed", "3", "--no-refbroker"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("per mutation class")
    totals = json.loads(out[-1])
    assert totals["cases"] == 150 and totals["uncaught_exceptions"] == 0 and totals["hangs"] == 0
    assert totals["anomalies_reported"] > 0


def test_commitlog_zero_page_keeps_every_intact_record(tmp_path):
    from txlog_io.commitlog_decode import decode_file

    src = FIXTURES / "rocketmq-3.1.4" / "store" / "commitlog" / "00000000000000000000"
    data = bytearray(src.read_bytes())
    data[114688:118784] = bytes(4096)
    mutant = tmp_path / src.name
    mutant.write_bytes(bytes(data))

    def records(path):
        out = {}
        for batch, _ in decode_file(str(path)):
            out.update(zip(batch.column("file_position").to_pylist(),
                           batch.column("total_size").to_pylist(), strict=True))
        return out

    before, after = records(src), records(mutant)
    intact = [p for p, n in before.items() if p + n <= 114688 or p >= 118784]
    assert [p for p in intact if p not in after] == []


def test_runner_counts_hangs_and_uncaught_exceptions(tmp_path, monkeypatch):
    """The columns that must stay 0 can count: a decoder that sleeps is a hang (the worker is replaced and
    keeps its originals), one that raises a non-txlog exception is uncaught."""
    import time as _time

    corpus = fuzz.build_corpus(tmp_path / "w", fuzz.fixture_stores())
    targets = [t for t in corpus if t.kind == "checkpoint"][:1]
    real = fuzz.decode_case
    mode = tmp_path / "mode"                 # read by the worker process at each case
    mode.write_text("ok")

    def patched(*job):
        if "case" in job[1] and mode.read_text() == "sleep":
            _time.sleep(30)
        if "case" in job[1] and mode.read_text() == "raise":
            raise ValueError("boom")
        return real(*job)

    monkeypatch.setattr(fuzz, "decode_case", patched)
    runner = fuzz.Runner(timeout=2.0)       # forked after the patch: the worker runs ``patched``
    try:
        fuzz.remember_all(runner, targets, tmp_path / "orig")
        t = targets[0]
        for want, col in (("sleep", "hangs"), ("raise", "uncaught_exceptions"), ("ok", "anomalies_reported")):
            mode.write_text(want)
            case = tmp_path / f"case-{want}"
            m = fuzz.mutate(t, case, random.Random(1), "random_block")
            c, _, _ = runner.case(t, case, m)
            assert c[col] == 1, (want, c)
    finally:
        runner.close()
