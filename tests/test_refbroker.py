"""Reference broker: every profile x scenario writes a store that decodes cleanly apart from its injected
faults, whose consume queues match their records and whose ledger agrees with what is on disk; plus targeted
checks of the version-specific behaviour (profiles, 3.x statetable/redolog, V2, compression, IPv6, fastjson,
checkpoint)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from refbroker import generate, get_profile
from refbroker.cli import main as cli_main
from refbroker.ledger import iter_ledger
from refbroker.profiles import PROFILE_NAMES
from refbroker.verify import verify
from refbroker.workload import SCENARIOS
from txlog_io.commitlog_decode import decode_file
from txlog_io.config import (
    checkpoint_variant_for_version,
    decode_checkpoint,
    parse_fastjson,
    read_consumer_offsets,
)
from txlog_io.consumequeue import decode_redolog, decode_statetable, encode_pre_blank
from txlog_io.errors import UsageError

SMALL = dict(commitlog_file_size=96 * 1024, consumequeue_file_size=600, background_messages=50, msg_bytes=600)
TX = 40


def _combos():
    for scenario in SCENARIOS.values():
        for profile in scenario.profiles or PROFILE_NAMES:
            yield scenario.name, profile


_CACHE: dict = {}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """generate() once per (scenario, profile) for the whole module."""
    def get(scenario: str, profile: str):
        key = (scenario, profile)
        if key not in _CACHE:
            out = tmp_path_factory.mktemp(f"{scenario}_{profile}".replace("+", "p").replace(".", "_"))
            sizes = dict(SMALL)
            if scenario == "legacy-3x":
                sizes["background_messages"] = 20
            _CACHE[key] = generate(
                profile, scenario, TX if scenario != "legacy-3x" else 120, 11, out, **sizes
            )
        return _CACHE[key]
    return get


def _records(store_dir: Path) -> list:
    rows = []
    for path in sorted((store_dir / "commitlog").iterdir()):
        for batch, _ in decode_file(str(path), with_body=True):
            rows.extend(batch.to_pylist())
    return rows


# ------------------------------------------------------------------------------------------------------------
# the matrix: decode cleanly, CQ <-> records, ledger <-> disk, invariants
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scenario,profile", list(_combos()))
def test_store_decodes_and_agrees_with_ledger(store, scenario, profile):
    result = store(scenario, profile)
    report = verify(result.ledger_path.parent)
    assert not report.unexplained, report.unexplained[:5]
    assert not report.problems, report.problems[:10]
    summary = json.loads((result.ledger_path.parent / "summary.json").read_text())
    lines = list(iter_ledger(result.ledger_path))
    transactions = [e for e in lines if e["kind"] == "transaction"]
    assert len(transactions) == summary["transactions"] == sum(summary["outcomes"].values())
    assert summary["transactions"] == summary["broker"]["transactions"]
    assert Counter(e["outcome"] for e in transactions) == {k: v for k, v in summary["outcomes"].items() if v}
    assert not (result.store_dir / "ledger.jsonl").exists()      # the ledger lives next to the store
    abort = (result.store_dir / "abort").exists()
    assert abort == (SCENARIOS[scenario].final == "crash")
    # every fault line names its file and (when it damages one) the exact place the decoder reports
    for fault in (e for e in lines if e["kind"] == "fault"):
        assert fault["fault_id"].startswith("F")
        if fault["fault"] in ("BITFLIP_COMMIT_BODY", "BITFLIP_RECORD_HEADER", "BITFLIP_CQ_UNIT",
                              "BITFLIP_STATETABLE"):
            found = [a for a in report.anomalies if a["file"] == fault["file"]]
            assert any(a["position"] == fault["record_position"] and a["kind"] in fault["expected_anomalies"]
                       for a in found), (fault, found)


@pytest.mark.parametrize("scenario,profile", [("clean", p) for p in PROFILE_NAMES] +
                         [("unresolved", "5.1+"), ("legacy-3x", "3.x")])
def test_every_mapped_file_has_its_configured_size(store, scenario, profile):
    result = store(scenario, profile)
    root = result.store_dir
    sizes = {"commitlog": SMALL["commitlog_file_size"], "consumequeue": SMALL["consumequeue_file_size"]}
    for path in (root / "commitlog").iterdir():
        assert path.stat().st_size == sizes["commitlog"]
        assert path.name.isdigit() and len(path.name) == 20 and int(path.name) % sizes["commitlog"] == 0
    for path in (root / "consumequeue").glob("*/*/*"):
        assert path.stat().st_size == sizes["consumequeue"], path
    for path in (root / "transaction").glob("**/0000*"):
        assert path.stat().st_size in (2400, 4000, 48_000_000, 40_000_000)
    assert (root / "checkpoint").stat().st_size == 4096
    for name in ("consumerOffset.json", "topics.json"):
        assert (root / "config" / name).exists() and (root / "config" / (name + ".bak")).exists()


# ------------------------------------------------------------------------------------------------------------
# profiles
# ------------------------------------------------------------------------------------------------------------

def test_profile_defaults_follow_the_reference():
    p43, p46, p50, p51 = (get_profile(n) for n in ("4.3-4.5", "4.6-4.9", "5.0", "5.1+"))
    for p in (p43, p46, p50, p51):
        assert (p.transactionTimeOut, p.transactionCheckMax, p.fileReservedTime) == (6000, 15, 72)
    assert (
        p43.transactionCheckInterval == p46.transactionCheckInterval == p50.transactionCheckInterval == 60_000
    )
    assert p51.transactionCheckInterval == 30_000
    assert (p51.transactionOpMsgMaxSize, p51.transactionOpBatchInterval) == (4096, 3000)
    assert p50.op_body_format == "SINGLE" and p51.op_body_format == "COMMA_BATCH"
    assert not p43.discard_topic and p46.discard_topic
    assert [get_profile(n).checkpoint_size for n in PROFILE_NAMES] == [24, 24, 24, 24, 32, 40]
    assert get_profile("3.x").fileReservedTime == 48 and get_profile("3.x").transactionCheckMax is None
    assert not get_profile("4.0-4.2").has_checker
    assert [get_profile(n).magic_v2 for n in PROFILE_NAMES] == [False] * 5 + [True]
    assert [get_profile(n).ipv6_hosts for n in PROFILE_NAMES] == [False, False, False, True, True, True]
    assert not p46.properties_trailing_separator and p51.properties_trailing_separator
    assert set(p51.broker_defaults()) >= {
        "transactionTimeOut",
        "transactionCheckMax",
        "transactionCheckInterval",
        "fileReservedTime",
    }
    with pytest.raises(UsageError):
        get_profile("6.0")
    with pytest.raises(UsageError):
        p51.with_(noSuchSetting=1)


def test_checkpoint_variant_per_profile(store):
    for name, version in (("4.6-4.9", "4.9.8"), ("5.0", "5.0.0"), ("5.1+", "5.3.3")):
        cp = decode_checkpoint(store("clean", name).store_dir / "checkpoint", version=version)
        assert cp["variant"] == checkpoint_variant_for_version(version)
        assert not cp["anomalies"] and cp["physic_msg_timestamp"] > 1_700_000_000_000


# ------------------------------------------------------------------------------------------------------------
# record-level behaviour
# ------------------------------------------------------------------------------------------------------------

def test_half_records_and_transaction_id(store):
    for name in ("4.6-4.9", "5.0", "5.1+"):
        rows = _records(store("clean", name).store_dir)
        halves = [r for r in rows if r["topic"] == "RMQ_SYS_TRANS_HALF_TOPIC"]
        assert halves and all(r["sys_flag"] & 0xC == 0 and r["queue_id"] == 0 for r in halves)
        assert sorted(r["queue_offset"] for r in halves) == list(range(len(halves)))
        with_id = [r for r in halves if r["transaction_id"] is not None]
        if name == "5.1+":
            assert len(with_id) == len(halves) and all(r["transaction_id"] == r["uniq_key"] for r in halves)
        else:
            assert not with_id
        ops = [r for r in rows if r["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC"]
        assert ops and all(r["tags"] == "d" and r["born_host"] == r["store_host"] and r["uniq_key"] is None
                           for r in ops)
        bodies = [r["body"].decode() for r in ops]
        if name == "5.1+":
            assert all(b.endswith(",") and all(x.isdigit() for x in b[:-1].split(",")) for b in bodies)
        else:
            assert all(b.isdigit() for b in bodies)
        commits = [r for r in rows if r["transaction_type"] == "COMMIT" and r["prepared_transaction_offset"]]
        by_offset = {r["physical_offset"]: r for r in halves}
        for c in commits:
            half = by_offset[c["prepared_transaction_offset"]]
            assert c["uniq_key"] == half["uniq_key"] and c["tran_msg"] and c["real_topic"] == c["topic"]
            assert c["body"] == half["body"] and c["born_timestamp"] == half["born_timestamp"]


def test_3x_prepared_rollback_statetable_and_redolog(store):
    result = store("clean", "3.x")
    rows = _records(result.store_dir)
    prepared = sorted(
        (r for r in rows if r["transaction_type"] == "PREPARED"), key=lambda r: r["physical_offset"]
    )
    rollbacks = [r for r in rows if r["transaction_type"] == "ROLLBACK"]
    assert prepared and rollbacks
    assert [r["queue_offset"] for r in prepared] == list(range(len(prepared)))   # = statetable index
    by_offset = {r["physical_offset"]: r for r in prepared}
    for r in rollbacks:
        assert (
            r["body_size"] == 0
            and r["queue_offset"] == by_offset[r["prepared_transaction_offset"]]["queue_offset"]
        )
    assert all(r["uniq_key"] is None and "CLUSTER" not in dict(r["properties"]) for r in rows)
    units = []
    for path in sorted((result.store_dir / "transaction" / "statetable").iterdir()):
        for batch, anomalies in decode_statetable(str(path)):
            assert not anomalies
            units.extend(batch.to_pylist())
    assert [u["commitlog_offset"] for u in units] == [r["physical_offset"] for r in prepared]
    ends = {r["prepared_transaction_offset"]: r["transaction_type"] for r in rows
            if r["transaction_type"] in ("COMMIT", "ROLLBACK")}
    for u in units:
        assert u["state"] == ends.get(u["commitlog_offset"], "PREPARED")
    redo = []
    for path in sorted((result.store_dir / "transaction" / "redolog").glob("*/0/*")):
        for batch, _anomalies in decode_redolog(str(path)):
            redo.extend(batch.to_pylist())
    assert sum(1 for u in redo if u["kind"] == "PREPARED") == len(prepared)
    assert {u["tags_code"] for u in redo if u["kind"] == "END"} <= set(by_offset)


def test_legacy_3x_rebuild_reads_only_the_first_redolog_file(store):
    result = store("legacy-3x", "3.x")
    root = result.store_dir
    redolog_files = sorted((root / "transaction" / "redolog").glob("*/0/*"))
    assert len(redolog_files) >= 2, "the scenario must span several redolog files"
    summary = result.summary
    assert summary["faults"]["STATETABLE_REBUILT"] >= 1
    assert summary["flags"].get("STATETABLE_STALE", 0) + summary["flags"].get("STATETABLE_MISSING", 0) > 0
    for entry in iter_ledger(result.ledger_path):
        if entry["kind"] == "transaction" and "STATETABLE_STALE" in entry["flags"]:
            assert entry["statetable"] is not None or entry["outcome"] != "PREPARED"


def test_discard_behaviour_by_version(store):
    rows43 = _records(store("unresolved", "4.3-4.5").store_dir)
    assert not [r for r in rows43 if r["topic"] == "TRANS_CHECK_MAX_TIME_TOPIC"]
    s43 = store("unresolved", "4.3-4.5").summary
    assert s43["outcomes"]["DISCARDED"] > 0 and s43["visible_outcomes"]["DISCARDED"] == 0
    assert s43["flags"]["DISCARD_NOT_RECORDED"] == s43["outcomes"]["DISCARDED"]
    rows46 = _records(store("unresolved", "4.6-4.9").store_dir)
    discards = [r for r in rows46 if r["topic"] == "TRANS_CHECK_MAX_TIME_TOPIC"]
    assert discards and all(r["queue_id"] == 0 and r["transaction_check_times"] == 15 for r in discards)
    # a never-answered transaction: original + 15 copies (TRANSACTION_CHECK_TIMES 1..15) then one discard
    for entry in iter_ledger(store("unresolved", "4.6-4.9").ledger_path):
        if entry["kind"] == "transaction" and entry["outcome"] == "DISCARDED":
            assert [c["check_times"] for c in entry["half_copies"]] == [None] + list(range(1, 16))
            assert len(entry["discard_records"]) == 1 and entry["discard_records"][0]["reason"] == "CHECK_MAX"


def test_checkmax_storm_commits_twice_and_discards_committed(store):
    summary = store("checkmax-storm", "5.1+").summary
    assert summary["flags"]["DUPLICATE_COMMIT"] > 0 and summary["flags"]["COMMITTED_AND_DISCARDED"] > 0
    for entry in iter_ledger(store("checkmax-storm", "5.1+").ledger_path):
        if entry["kind"] == "transaction" and "COMMITTED_AND_DISCARDED" in entry["flags"]:
            assert entry["outcome"] == "COMMITTED"
        if entry["kind"] == "transaction" and "IMMUNITY_COPIES" in entry["flags"]:
            originals = [c for c in entry["half_copies"] if c["copy_kind"] == "ORIGINAL"]
            immunity = [c for c in entry["half_copies"] if c["copy_kind"] == "IMMUNITY_COPY"]
            assert all(c["tran_prepared_queue_offset"] == originals[0]["queue_offset"] for c in immunity)


def test_version_specific_encodings(store, tmp_path):
    v2 = [r for r in _records(store("clean", "5.1+").store_dir) if r["magic_version"] == 2]
    assert v2 and all(r["topic"].startswith("%RETRY%") and len(r["topic"]) > 127 for r in v2)
    for name in PROFILE_NAMES:
        rows = _records(store("clean", name).store_dir)
        if name != "5.1+":
            assert all(r["magic_version"] == 1 for r in rows)
        compressions = {r["compression"] for r in rows}
        if get_profile(name).compression_type_bits:
            assert {"LZ4", "ZSTD", "ZLIB"} <= compressions
        else:
            assert compressions <= {"NONE", "ZLIB"}
            assert all(r["sys_flag"] & 0x700 == 0 for r in rows)
        v6 = [r for r in rows if r["born_host"].startswith("[")]
        assert bool(v6) == get_profile(name).ipv6_hosts
        uniq = {len(r["uniq_key"]) for r in rows if r["uniq_key"]}
        assert uniq <= {32, 56} and (not uniq) == (name == "3.x")
    # plain topics longer than 127 characters are rejected by the send path
    from refbroker import Producer, Run

    run = Run(tmp_path / "long", "5.1+", commitlog_file_size=64 * 1024)
    producer = Producer("PID_LONG")
    run.broker.start()
    assert run.broker.send_message(producer, "T" * 128, 0, b"x") is None
    assert run.broker.stats["rejected_long_topic"] == 1
    run.broker.shutdown()
    run.finish()


def test_fastjson_config_files(store):
    for name in ("4.6-4.9", "5.1+", "3.x"):
        root = store("clean", name).store_dir
        text = (root / "config" / "consumerOffset.json").read_text()
        assert "{0:" in text and '"0"' not in text                     # bare integer keys, like fastjson
        rows, anomalies = read_consumer_offsets(root / "config" / "consumerOffset.json")
        assert not anomalies
        keys = {(r["topic"], r["group"]) for r in rows}
        if name != "3.x":
            assert ("RMQ_SYS_TRANS_HALF_TOPIC", "CID_RMQ_SYS_TRANS") in keys
        topics = parse_fastjson((root / "config" / "topics.json").read_text())
        assert "TopicOrders" in topics["topicConfigTable"]
        version = topics["dataVersion"]
        assert ("timestatmp" in version) == (name == "3.x")
        assert ("stateVersion" in version) == name.startswith("5")


def test_crashy_leaves_a_crashed_store(store):
    result = store("crashy", "4.6-4.9")
    root = result.store_dir
    assert (root / "abort").exists()
    faults = [e for e in iter_ledger(result.ledger_path) if e["kind"] == "fault"]
    kinds = Counter(f["fault"] for f in faults)
    assert (
        kinds["TORN_TAIL"] >= 2
        and kinds["CQ_DISPATCH_LAG"] >= 1
        and kinds["CRASH_BETWEEN_COMMIT_AND_OP"] == 1
    )
    rebuilt = [f for f in faults if f["fault"] == "CQ_DELETED_AND_REBUILT"]
    assert rebuilt
    queue_dir = root / rebuilt[0]["file"]
    first = sorted(queue_dir.iterdir())[0]
    data = first.read_bytes()
    if rebuilt[0]["length"]:
        assert data[:20] == encode_pre_blank()
    final_torn = [f for f in faults if f["fault"] == "TORN_TAIL" and not f["overwritten"]]
    assert len(final_torn) == 1
    summary = result.summary
    assert summary["flags"].get("COMMIT_WITHOUT_OP", 0) >= 1


def test_retention_deletes_oldest_files_and_marks_records(store):
    result = store("retention", "4.6-4.9")
    files = sorted(p.name for p in (result.store_dir / "commitlog").iterdir())
    assert files[0] != "0" * 20
    min_offset = int(files[0])
    deleted = 0
    for entry in iter_ledger(result.ledger_path):
        if entry["kind"] != "transaction":
            continue
        for copy in entry["half_copies"]:
            assert copy["present"] == (copy["commitlog_offset"] >= min_offset)
            deleted += not copy["present"]
        if any(not c["present"] for c in entry["half_copies"]):
            assert "RECORD_DELETED" in entry["flags"]
    assert deleted
    assert result.summary["broker"]["discards"] > 0             # needSkip after the clock jump


def test_generation_is_deterministic(tmp_path):
    a = generate("5.1+", "crashy", 30, 5, tmp_path / "a", **SMALL)
    b = generate("5.1+", "crashy", 30, 5, tmp_path / "b", **SMALL)
    c = generate("5.1+", "crashy", 30, 6, tmp_path / "c", **SMALL)
    files_a = sorted(p.relative_to(a.store_dir) for p in a.store_dir.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b.store_dir) for p in b.store_dir.rglob("*") if p.is_file())
    assert files_a == files_b
    for rel in files_a:
        assert (a.store_dir / rel).read_bytes() == (b.store_dir / rel).read_bytes(), rel
    assert a.ledger_path.read_text() == b.ledger_path.read_text()
    assert a.ledger_path.read_text() != c.ledger_path.read_text()


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli_main(["generate", "--profile", "4.6-4.9", "--scenario", "clean", "--transactions", "10",
                   "--background-messages", "10", "--commitlog-file-mb", "0.0625", "--cq-file-units", "30",
                   "--seed", "3", "--out", str(out), "--json"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["transactions"] == 10 and (out / "store" / "commitlog").is_dir()
    assert json.loads((out / "summary.json").read_text())["transactions"] == 10
    assert cli_main(["generate", "--profile", "4.6-4.9", "--scenario", "legacy-3x", "--transactions", "1",
                     "--seed", "1", "--out", str(tmp_path / "bad")]) == 2
    assert cli_main(["verify", str(out)]) == 0 and "0 problems" in capsys.readouterr().out
    assert cli_main(["scenarios"]) == 0 and "checkmax-storm" in capsys.readouterr().out
    assert cli_main(["profiles"]) == 0 and "transactionCheckMax" in capsys.readouterr().out
    with pytest.raises(UsageError):
        generate("5.1+", "clean", -1, 1, tmp_path / "neg")


@pytest.mark.parametrize("scenario,profile", [("clean", "5.1+"), ("clean", "3.x"), ("corrupt", "4.6-4.9"),
                                              ("crashy", "5.1+")])
def test_txlog_dump_verify_reports_only_injected_faults(store, capsys, scenario, profile):
    cli = pytest.importorskip("txlog_io.cli", reason="txlog-dump not available")
    from refbroker.verify import _fault_region

    result = store(scenario, profile)
    capsys.readouterr()
    rc = cli.main(["store", str(result.store_dir), "--verify"])
    findings = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    faults = [e for e in iter_ledger(result.ledger_path) if e["kind"] == "fault"]
    regions = [r for r in (_fault_region(f) for f in faults) if r is not None]
    for finding in findings:
        rel = str(Path(finding["file"]).relative_to(result.store_dir))
        assert any((rel == f or rel.startswith(f + "/")) and lo <= finding["position"] < hi
                   for f, lo, hi in regions), finding
    assert rc == (1 if findings else 0)
    if scenario == "clean":
        assert not findings


def test_corrupt_ledger_keeps_body_damaged_records_and_flipped_statetable_units(store):
    """A body bit flip leaves the record's header (type, PREPARED_TRANSACTION_OFFSET, properties) readable:
    the record stays present (a COMMIT still proves the commit), flagged RECORD_CORRUPTED.  A flipped 3.x
    statetable unit is reported on its transaction with the state now on disk."""
    for profile in ("3.x", "4.6-4.9"):
        result = store("corrupt", profile)
        lines = list(iter_ledger(result.ledger_path))
        by_fault = {f["fault"]: f for f in lines if f["kind"] == "fault"}
        flip = by_fault["BITFLIP_COMMIT_BODY"]
        (start, end), = flip["effects"]["body_damaged"]
        assert "corrupted" not in flip["effects"]
        hit = [e for e in lines if e["kind"] == "transaction" and flip["fault_id"] in e["faults"]]
        assert [e["transaction_key"] for e in hit] == [flip["affected"][0]["transaction_key"]]
        (entry,) = hit
        records = [r for r in entry["commit_records"] + entry["half_copies"]
                   if r["commitlog_offset"] == start]
        assert records and all(r["present"] for r in records)
        assert "RECORD_CORRUPTED" in entry["flags"] and entry["visible_outcome"] == entry["outcome"]
    result = store("corrupt", "3.x")
    lines = list(iter_ledger(result.ledger_path))
    (flip,) = [f for f in lines if f["kind"] == "fault" and f["fault"] == "BITFLIP_STATETABLE"]
    (index, state), = flip["effects"]["statetable_units"]
    assert state in (5, 9, 13)
    (entry,) = [e for e in lines if e["kind"] == "transaction" and flip["fault_id"] in e["faults"]]
    assert entry["transaction_key"] == flip["affected"][0]["transaction_key"]
    assert entry["statetable"] == {"index": index, "state": state}
    assert {"RECORD_CORRUPTED", "STATETABLE_STALE"} <= set(entry["flags"])


def test_verify_excuses_records_older_than_a_rebuilt_queue(tmp_path):
    """An op queue rebuilt from the newest CommitLog file after an operator deleted it can restart at queue
    offset 0 (no op in that file): the ops of older files have no unit, whatever their queue offsets."""
    result = generate("4.3-4.5", "crashy", 40, 11, tmp_path / "s", commitlog_file_size=64 * 1024,
                      msg_bytes=256, cq_file_units=256)
    (rebuilt,) = [e for e in iter_ledger(result.ledger_path)
                  if e["kind"] == "fault" and e["fault"] == "CQ_DELETED_AND_REBUILT"]
    assert rebuilt["first_queue_offset"] == 0 and rebuilt["recovery_start"] > 0
    report = verify(result.ledger_path.parent)
    assert report.ok, report.problems[:5]


def test_3x_visible_outcome_reads_the_statetable_when_the_records_are_gone(tmp_path):
    """3.x retention: a transaction whose prepared and commit/rollback records were deleted still shows its
    end in its statetable unit (only the dispatch of a COMMIT / ROLLBACK record writes that state); a
    statetable file retention deleted takes its units with it."""
    result = generate("3.x", "retention", 40, 7, tmp_path / "s", commitlog_file_size=48 * 1024, msg_bytes=256,
                      cq_file_units=256, statetable_file_size=10 * 24, redolog_file_size=4000)
    lines = list(iter_ledger(result.ledger_path))
    gone = [f for f in lines if f["kind"] == "fault" and f["file"].startswith("transaction/statetable/")]
    assert gone and all(f["length"] == 240 for f in gone)
    gone_ranges = [(int(f["file"].rsplit("/", 1)[1]), int(f["file"].rsplit("/", 1)[1]) + 240) for f in gone]
    by_unit = 0
    for e in (x for x in lines if x["kind"] == "transaction"):
        records = e["half_copies"] + e["commit_records"] + e["rollback_records"]
        if e["statetable"] is not None:
            assert not any(lo <= e["statetable"]["index"] * 24 < hi for lo, hi in gone_ranges)
        if not any(r["present"] for r in records) and e["statetable"] is not None \
                and e["statetable"]["state"] in (8, 12):
            assert e["visible_outcome"] == {8: "COMMITTED", 12: "ROLLED_BACK"}[e["statetable"]["state"]]
            by_unit += 1
    assert by_unit
    report = verify(result.ledger_path.parent)
    assert report.ok, report.problems[:5]
