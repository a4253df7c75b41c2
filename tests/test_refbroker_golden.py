"""The reference broker writes the same bytes as before: every profile x scenario (and two DLedger stores and a
store of the benchmark's shape) generated with a fixed seed must match the committed digests of every store file,
the ledger and the summary (tests/data/refbroker_golden.json; how to regenerate it: tests/refbroker_golden.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.refbroker_golden import cases, generate_case

GOLDEN = Path(__file__).parent / "data" / "refbroker_golden.json"
CASES = {case[0]: case for case in cases()}


def test_golden_file_covers_every_case():
    assert sorted(json.loads(GOLDEN.read_text())["cases"]) == sorted(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_store_bytes_unchanged(name, tmp_path):
    want = json.loads(GOLDEN.read_text())["cases"][name]
    got = generate_case(CASES[name], tmp_path)
    assert sorted(got) == sorted(want), "files differ: " + str(sorted(set(got) ^ set(want))[:10])
    changed = [path for path in sorted(want) if got[path] != want[path]]
    assert not changed, f"{len(changed)} file(s) differ, first: {changed[:5]}"
