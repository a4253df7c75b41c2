"""The CommitLog files before the first present one: deleted by retention, or lost (txlog_io/retention.py).

Two reference-broker 4.6-4.9 stores with 64 KiB CommitLog files and 10-unit consume-queue files: one whose
oldest third was deleted the way RocketMQ's retention does it (the consume-queue and index files wholly below
the new first offset deleted in the same clean-up: ``refbroker.faults.retention``), one whose oldest
CommitLog file alone was removed from an otherwise clean store.  The first reads as retention (no finding,
EVIDENCE_IN_DELETED_RANGE as before); the second gets one COMMITLOG_HEAD_MISSING finding naming the range,
and what pointed below the first file is PREPARED_RECORD_MISSING and carries STATE_UNCERTAIN_DAMAGED_RANGE
where a state rests on that range -- in full and indexed mode alike.
"""
from __future__ import annotations

import shutil

import pytest
from damage_audits import audit_both_modes

SMALL = dict(commitlog_file_size=64 * 1024, consumequeue_file_size=200, background_messages=50, msg_bytes=600)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    import refbroker

    base = tmp_path_factory.mktemp("head")
    kept = refbroker.generate("4.6-4.9", "retention", 40, 11, base / "ret", **SMALL).store_dir
    clean = refbroker.generate("4.6-4.9", "clean", 40, 11, base / "clean", **SMALL).store_dir
    lost = base / "lost" / "store"
    shutil.copytree(clean, lost)
    files = sorted((lost / "commitlog").iterdir())
    assert len(files) >= 2
    files[0].unlink()
    return {"ret": str(kept), "lost": str(lost), "first": int(files[1].name)}


def _head(store):
    from txlog_io.mappedfile import discover_store

    return [a for a in discover_store(store).anomalies if a.kind == "COMMITLOG_HEAD_MISSING"]


def test_retention_reads_as_retention_and_a_lost_head_as_damage(stores):
    assert _head(stores["ret"]) == []
    found = _head(stores["lost"])
    assert len(found) == 1
    a = found[0]
    assert a.source == "commitlog" and a.physical_offset == 0 and a.length == stores["first"]
    assert "lost, not deleted by retention" in a.detail and a.file.endswith(f"{stores['first']:020d}")


@pytest.fixture(scope="module")
def audits(spark, stores):
    return audit_both_modes(spark, {"ret": stores["ret"], "lost": stores["lost"]})


@pytest.mark.spark
def test_a_lost_head_is_not_explained_by_retention(audits, stores):
    for mode, got in audits.items():
        tx = {(t["broker"], t["transaction_key"]): t for t in got["transactions"]}
        ret = [t for (b, _), t in tx.items() if b == "ret"]
        lost = [t for (b, _), t in tx.items() if b == "lost"]
        assert any("EVIDENCE_IN_DELETED_RANGE" in t["flags"] for t in ret), mode
        assert not any("EVIDENCE_IN_DELETED_RANGE" in t["flags"] for t in lost), mode
        assert any("PREPARED_RECORD_MISSING" in t["flags"] for t in lost), mode
        assert not [t for t in ret if "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"]], mode
        for t in lost:      # a state reached by absence over the lost range says so
            if t["state"] in ("PREPARED", "DISCARDED") and (t["prepared_commitlog_offset"] or 0) < stores["first"]:
                assert "STATE_UNCERTAIN_DAMAGED_RANGE" in t["flags"], (mode, t)
        head = [a for a in got["anomalies"] if a["broker"] == "lost" and a["code"] == "COMMITLOG_HEAD_MISSING"]
        assert len(head) == 1, (mode, head)
    full = {(t["broker"], t["transaction_key"]): (t["state"], sorted(t["flags"]))
            for t in audits["full"]["transactions"]}
    indexed = {(t["broker"], t["transaction_key"]): (t["state"], sorted(t["flags"]))
               for t in audits["indexed"]["transactions"]}
    assert full == indexed
