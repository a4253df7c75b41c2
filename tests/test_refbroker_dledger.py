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
    audit,
    test_check_back_worklist_holds_exactly_the_expected_transactions,
    test_every_transaction_is_reconstructed_once_with_the_ledger_state,
    test_flags_of_every_transaction_equal_the_ledger,
    test_profiles_are_detected,
    test_recovery_worklist_holds_exactly_the_expected_actions,
    views,
)

from txlog_io import dledger as D
from txlog_io.dledger_store import verify_dledger
from txlog_io.mappedfile import discover_store

pytestmark = pytest.mark.spark

#: every scenario of a 4.5+ profile: crashes (torn entries, dispatch lag, a deleted queue rebuilt), restarts,
#: retention (oldest data files deleted, their index units left behind as DLedger does), check storms and
#: post-run damage (bit flips inside entries, a data file cut inside its last entry)
COMBOS = (("4.6-4.9", "clean"), ("5.1+", "clean"), ("4.6-4.9", "unresolved"), ("5.0", "unresolved"),
          ("4.6-4.9", "checkmax-storm"), ("5.1+", "checkmax-storm"), ("5.1+", "upgrade-4.9-to-5.1"),
          ("4.6-4.9", "crashy"), ("5.1+", "crashy"), ("4.6-4.9", "retention"), ("5.1+", "retention"),
          ("4.6-4.9", "corrupt"), ("5.1+", "corrupt"))
DAMAGED = {"crashy", "corrupt"}
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
        assert layout.dledger_index_file_size == 32768
        if st.scenario in DAMAGED:
            continue            # torn / cut entries: the decoders' findings are checked by the matrix tests
        assert layout.anomalies == [] and verify_dledger(layout) == []
        files = [f.path for f in layout.commitlog]
        assert len({f.stat().st_size for f in files}) == 1
        first = next(b for b, _ in D.decode_range(str(files[0])))
        # as in the fixture: the file's first entry at pos = file name, its message at pos + 48
        assert first.column("physical_offset")[0].as_py() == int(files[0].name) + 48
        for f in files[:-1]:                                               # closed by the DLedger end marker
            summary = D.ScanSummary(str(f), 0, 0)
            for _ in D.scan_entries(f, summary=summary):
                pass
            assert summary.stop_reason == "DLedger end-of-file marker"
            assert f.read_bytes()[summary.valid_end:summary.valid_end + 8] == \
                D.encode_end_marker(f.stat().st_size - summary.valid_end)


def _pruned_replica(st, tmp_path, name: str, drop: int = 1):
    """A copy of ``st``'s store whose ``drop`` oldest DLedger data files are deleted (this node's retention
    ran further; DLedger's CleanSpaceService leaves the index files behind)."""
    import shutil

    root = tmp_path / name / "store"
    shutil.copytree(st.out / "store", root)
    data = sorted((root / "dledger-n0" / "data").iterdir())
    assert len(data) > drop
    for path in data[:drop]:
        path.unlink()
    return root, data[drop].name


def test_replicas_with_different_retention_are_one_group(matrix, tmp_path):
    from txlog_io.dledger_store import collapse_replicas
    from txlog_io.errors import AnomalyKind

    st = matrix[R.broker_name("4.6-4.9", "clean")]
    full = str(st.out / "store")
    pruned, first_kept = _pruned_replica(st, tmp_path, "r1")
    assert verify_dledger(discover_store(pruned)) == []      # a pruned log alone is a healthy log
    for order in ([full, str(pruned)], [str(pruned), full]):
        kept, findings = collapse_replicas([("g", r) for r in order])
        assert kept == [("g", full)], order                   # same commits: the one that retains more
        assert [(b, a.kind) for b, a in findings] == [("g", AnomalyKind.DLEDGER_REPLICA_DIFFERS)]
        a = findings[0][1]
        assert a.file.endswith(first_kept) and a.position == 0 and "retention deleted more" in a.detail
    # the other way round: the pruned replica has committed more, so it is audited and the fuller one says
    # which of its entries the audit does not see
    cp = pruned / "dledger-n0" / "checkpoint"
    committed = int(cp.read_text().split("\n")[0].split("=")[1])
    cp.write_text(f"committedIndex={committed + 1}\nendIndex={committed + 1}\n")
    kept, findings = collapse_replicas([("g", full), ("g", str(pruned))])
    assert kept == [("g", str(pruned))] and len(findings) == 2
    assert "which retention deleted from the audited replica" in findings[0][1].detail
    assert findings[0][1].file.endswith("00000000000000000000") and findings[0][1].position == 0
    assert "only the checkpoint differs" in findings[1][1].detail


def test_replicas_with_different_retention_audit_as_one_broker(spark, matrix, tmp_path):
    from jobs.read.frames import load_store_frames
    from jobs.reconstruct.spark import reconstruct

    st = matrix[R.broker_name("4.6-4.9", "clean")]
    import shutil

    pruned, first_kept = _pruned_replica(st, tmp_path, "r1")
    solo = tmp_path / "solo" / "store"          # the fuller replica again, audited alone under its own name
    shutil.copytree(st.out / "store", solo)
    roots = [str(pruned), str(st.out / "store"), str(solo)]
    for mode in ("full", "indexed"):
        frames = load_store_frames(spark, roots, mode=mode, brokers=["g", "g", "solo"])
        assert [(s.broker, s.root) for s in frames.layout_info] == [("g", roots[1]), ("solo", roots[2])]
        result = reconstruct(frames, None, local=True)
        tx = result.arrow["transactions"].to_pylist()
        view = {b: sorted((t["transaction_key"], t["state"], tuple(sorted(t["flags"]))) for t in tx
                          if t["broker"] == b) for b in ("g", "solo")}
        assert view["g"] == view["solo"] and len(view["g"]) >= R.TRANSACTIONS, mode
        differs = [a for a in result.arrow["anomalies"].to_pylist() if a["code"] == "DLEDGER_REPLICA_DIFFERS"]
        assert [(a["broker"], a["file"].endswith(first_kept)) for a in differs] == [("g", True)], mode
