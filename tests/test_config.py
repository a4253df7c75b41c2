"""jobs.config: conf/ defaults, broker profiles, user overrides with validation."""
from __future__ import annotations

import json

import pytest

from jobs import config as C
from txlog_io.errors import UsageError


def test_defaults():
    cfg = C.load_audit_config()
    assert (cfg.mode, cfg.split_bytes, cfg.include_bodies, cfg.broker_profile, cfg.delta_writer) == \
        ("indexed", 128 * 1024 * 1024, False, "auto", "auto")
    assert cfg.table("transactions") == "transactions"
    assert cfg.table("audit_anomalies") == "audit_anomalies"
    with pytest.raises(C.ConfigError, match="no output table"):
        cfg.table("nope")
    hash(cfg)                                                    # frozen and hashable


def test_profiles_match_the_format_reference():
    p = C.load_broker_profiles()
    assert tuple(p) == C.PROFILE_NAMES
    assert p["3.x"].file_reserved_time_hours == 48 and p["3.x"].transaction_scheme == "statetable"
    assert p["3.x"].transaction_check_max is None and p["3.x"].checkpoint_size == 24
    assert p["4.0-4.2"].transaction_check_interval_ms is None and p["4.0-4.2"].rollback_record
    assert (p["4.3-4.5"].transaction_timeout_ms, p["4.3-4.5"].transaction_check_max) == (6000, 15)
    assert not p["4.3-4.5"].discard_topic and p["4.6-4.9"].discard_topic
    assert not p["4.3-4.5"].ipv6_hosts and p["4.6-4.9"].ipv6_hosts
    assert p["5.0"].checkpoint_size == 32 and p["5.0"].op_body_format == "single" and not p["5.0"].magic_v2
    last = p["5.1+"]
    assert (last.transaction_check_interval_ms, last.op_body_format, last.magic_v2, last.checkpoint_size) == \
        (30000, "batched", True, 40)
    assert (last.transaction_op_msg_max_size, last.transaction_op_batch_interval_ms) == (4096, 3000)
    for prof in p.values():
        if prof.name != "3.x":
            assert prof.file_reserved_time_hours == 72


def test_broker_defaults_are_one_set_of_numbers():
    """conf/broker-defaults.json, the reference broker's profiles and the reconstruction's built-in fallbacks
    (AuditParams.for_profile) carry the same broker settings, so a store generated with a profile is audited
    with the settings it was generated with.  The one deliberate difference: 4.0 - 4.2 has no check service
    (transactionTimeOut null in conf and refbroker); the auditor still needs an age threshold for
    PREPARED_PAST_TIMEOUT and uses the 4.3+ default."""
    import dataclasses

    from jobs.audit.run import CONFIG_TO_RECON
    from jobs.reconstruct.spark import AuditParams
    from refbroker.profiles import PROFILE_NAMES, get_profile

    conf = C.load_broker_profiles()
    assert tuple(PROFILE_NAMES) == C.PROFILE_NAMES
    keys = ("transactionTimeOut", "transactionCheckMax", "transactionCheckInterval", "fileReservedTime")
    for name in C.PROFILE_NAMES:
        c = conf[name]
        from_conf = (c.transaction_timeout_ms, c.transaction_check_max, c.transaction_check_interval_ms,
                     c.file_reserved_time_hours)
        rb = dataclasses.asdict(get_profile(name))
        assert tuple(rb[k] for k in keys) == from_conf, name
        assert (rb["checkpoint_size"], rb["magic_v2"], rb["ipv6_hosts"]) == \
            (c.checkpoint_size, c.magic_v2, c.ipv6_hosts), name
        ap = dataclasses.asdict(AuditParams.for_profile(CONFIG_TO_RECON[name]))
        expected = dict(zip(keys, from_conf, strict=True))
        if name == "4.0-4.2":
            expected["transactionTimeOut"] = 6000
        assert {k: ap[k] for k in keys} == expected, name


@pytest.mark.parametrize("version,name", [
    ("3.1.4", "3.x"), ("4.0.0", "4.0-4.2"), ("rocketmq-all-4.2.0", "4.0-4.2"), ("4.3.0", "4.3-4.5"),
    ("4.5.2", "4.3-4.5"), ("4.6.0", "4.6-4.9"), ("4.9.8", "4.6-4.9"), ("5.0.0", "5.0"), ("5.1.0", "5.1+"),
    ("5.3.3", "5.1+"),
])
def test_profile_for_version(version, name):
    assert C.profile_name_for_version(version) == name


def test_properties_override(tmp_path):
    f = tmp_path / "site.properties"
    f.write_text("# site\nmode = full\nsplit.bytes: 64m\ninclude.bodies=yes\nbroker.profile=4.6-4.9\n"
                 "broker.transactionTimeOut=3000\nbroker.discardTopic=false\ntable.transactions=tx_v2\n"
                 "table.extra=\\\n  extra_table\n")
    cfg = C.load_audit_config(f)
    assert (cfg.mode, cfg.split_bytes, cfg.include_bodies) == ("full", 64 << 20, True)
    prof = cfg.profile()
    assert prof.name == "4.6-4.9" and prof.transaction_timeout_ms == 3000 and prof.discard_topic is False
    assert C.load_broker_profiles()["4.6-4.9"].transaction_timeout_ms == 6000   # defaults untouched
    assert cfg.table("transactions") == "tx_v2" and cfg.table("extra") == "extra_table"
    assert cfg.sources[-1] == str(f)


def test_json_override(tmp_path):
    f = tmp_path / "site.json"
    f.write_text(json.dumps({"mode": "full", "broker": {"profile": "5.0", "transactionCheckMax": 5},
                             "split.bytes": 1048576, "include.bodies": True, "_comment": "ignored"}))
    cfg = C.load_audit_config(f)
    assert (cfg.mode, cfg.split_bytes, cfg.include_bodies, cfg.broker_profile) == \
        ("full", 1 << 20, True, "5.0")
    assert cfg.profile().transaction_check_max == 5


@pytest.mark.parametrize("text,needle", [
    ("mode=full\nsplit.bites=1\n", "split.bites"),
    ("broker.transactionTimeout=1\n", "broker.transactionTimeout"),
    ("mode=fast\n", "mode"),
    ("split.bytes=12x\n", "split.bytes"),
    ("split.bytes=100\n", "at least"),
    ("include.bodies=maybe\n", "include.bodies"),
    ("broker.profile=6.0\n", "broker.profile"),
    ("delta.writer=jdbc\n", "delta.writer"),
    ("broker.transactionCheckMax=many\n", "transactionCheckMax"),
    ("table.transactions=a/b\n", "table.transactions"),
    ("table.transactions=x\ntable.profiles=x\n", "share"),
])
def test_bad_user_keys(tmp_path, text, needle):
    f = tmp_path / "bad.properties"
    f.write_text(text)
    with pytest.raises(UsageError, match=needle.replace(".", r"\.")):
        C.load_audit_config(f)


def test_bad_files(tmp_path):
    with pytest.raises(C.ConfigError, match="not found"):
        C.load_audit_config(tmp_path / "missing.properties")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(C.ConfigError, match="not valid JSON"):
        C.load_audit_config(bad)
    arr = tmp_path / "arr.json"
    arr.write_text("[1]")
    with pytest.raises(C.ConfigError, match="JSON object"):
        C.load_audit_config(arr)


def test_profile_lookup_errors():
    cfg = C.load_audit_config()
    with pytest.raises(C.ConfigError, match="auto"):
        cfg.profile()
    with pytest.raises(C.ConfigError, match="unknown broker profile"):
        cfg.profile("9.x")
    assert cfg.profile("5.1+").name == "5.1+"


def test_broken_broker_defaults(tmp_path):
    f = tmp_path / "b.json"
    f.write_text(json.dumps({"profiles": {"3.x": {"versions": "x", "bogus": 1}}}))
    with pytest.raises(C.ConfigError, match="bogus"):
        C.load_broker_profiles(f)


def test_properties_parser():
    got = C.parse_properties("a=1\n b : 2 \nc 3\n! comment\n# c\nd=\ne=x\\\n   y\n")
    assert got == {"a": "1", "b": "2", "c": "3", "d": "", "e": "xy"}
