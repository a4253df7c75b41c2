"""The reference broker in DLedger mode (profile ``dledger_self_id``; ``txlog-refbroker generate --dledger``):
its stores have the real 4.9.8 DLedger fixture's layout, and the ledger-driven checks of
tests/test_reconstruct_refbroker.py run on them (both modes) for the scenarios without CommitLog faults.

The test functions imported below are the matrix module's own; pytest collects them here with this module's
``matrix`` fixture (DLedger stores), so every assertion is the same code as for file-mode stores."""
from __future__ import annotations

import re

import pytest

import test_reconstruct_refbroker as R
from conftest import FIXTURES
from test_reconstruct_refbroker import (  # noqa: F401  (fixtures and tests re-collected with this matrix)
    audit, test_check_back_worklist_holds_exactly_the_expected_transactions,
    test_every_transaction_is_reconstructed_once_with_the_ledger_state,
    test_flags_of_every_transaction_equal_the_ledger, test_profiles_are_detected,
    test_recovery_worklist_holds_exactly_the_expected_actions, views,
)
from txlog_io import dledger as D
from txlog_io.dledger_store import verify_dledger
from txlog_io.mappedfile import discover_store

pytestmark = pytest.mark.spark

#: the scenarios whose crashes / faults do not touch the CommitLog files (those are not DLedger-aware yet)
COMBOS = (("4.6-4.9", "clean"), ("5.1+", "clean"), ("4.6-4.9", "unresolved"), ("5.0", "unresolved"),
          ("4.6-4.9", "checkmax-storm"), ("5.1+", "checkmax-storm"), ("5.1+", "upgrade-4.9-to-5.1"))
FIXTURE = FIXTURES / "rocketmq-4.9.8-dledger" / "store-clean"


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    import refbroker
    from refbroker.profiles import get_profile

    base = tmp_path_factory.mktemp("refbroker-dledger")
    stores = {}
    for profile, scenario in COMBOS:
        out = base / R.broker_name(profile, scenario).replace("+", "p")
        p = get_profile(profile).with_(dledger_self_id="n0", dledger_index_file_size=32768)
        refbroker.generate(p, scenario, transactions=R.TRANSACTIONS, seed=R.SEED, out_dir=out,
                           start_ms=R.DEFAULT_START_MS, **R._sizes(scenario, profile))
        stores[R.broker_name(profile, scenario)] = R.Store(profile, scenario, out)
    return stores


def test_generated_stores_have_the_fixture_layout(matrix):
    real = FIXTURE / "dledger-n0"
    for st in matrix.values():
        root = st.out / "store"
        assert not (root / "commitlog").exists()
        dl = root / "dledger-n0"
        assert sorted(p.name for p in dl.iterdir()) == sorted(p.name for p in real.iterdir())
        assert (dl / "currterm").read_bytes() == (real / "currterm").read_bytes() == \
            (dl / "currterm.bak").read_bytes()
        assert re.fullmatch(rb"committedIndex=(\d+)\nendIndex=\1\n", (dl / "checkpoint").read_bytes())
        assert re.fullmatch(rb"committedIndex=(\d+)\nendIndex=\d+\n", (real / "checkpoint").read_bytes())
        layout = discover_store(root)
        assert layout.dledger_index_file_size == 32768 and layout.anomalies == []
        assert verify_dledger(layout) == []
        files = [f.path for f in layout.commitlog]
        assert len({f.stat().st_size for f in files}) == 1
        first = next(b for b, _ in D.decode_range(str(files[0])))
        assert first.column("physical_offset")[0].as_py() == 48            # as in the fixture: pos 0 + 48
        for f in files[:-1]:                                               # closed by the DLedger end marker
            summary = D.ScanSummary(str(f), 0, 0)
            for _ in D.scan_entries(f, summary=summary):
                pass
            assert summary.stop_reason == "DLedger end-of-file marker"
            assert f.read_bytes()[summary.valid_end:summary.valid_end + 8] == \
                D.encode_end_marker(f.stat().st_size - summary.valid_end)
