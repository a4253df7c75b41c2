"""Audit configuration: ``conf/audit-defaults.properties`` + ``conf/broker-defaults.json`` (+ a user
``--conf-file``).

Spark-free (the command-line pre-check imports it before any JVM starts).

* :func:`load_broker_profiles` -> ``{name: BrokerProfile}`` for the version profiles ``3.x``, ``4.0-4.2``,
  ``4.3-4.5``, ``4.6-4.9``, ``5.0``, ``5.1+``; :func:`profile_name_for_version` maps ``"4.9.8"`` ->
  ``"4.6-4.9"``.
* :func:`load_audit_config` -> :class:`AuditConfig`: the defaults merged with an optional user file (Java
  ``.properties`` or JSON, flat ``{"mode": "full"}`` or nested ``{"broker": {"transactionTimeOut": 3000}}``).
  Every key is validated; an unknown key or a bad value raises :class:`ConfigError` (a ``UsageError``) naming
  it.
* :meth:`AuditConfig.profile` returns the chosen profile with the user's ``broker.<key>`` overrides applied.

The conf directory is ``$TXAUDIT_CONF_DIR`` when set (spark-submit.sh sets it), else ``<repo>/conf``.

Object storage: one set of S3 settings (``txlog_io.storefs.S3Settings``: the standard AWS environment
variables and profile files, ``AWS_ENDPOINT_URL``) feeds all three clients -- ``pyarrow.fs`` (the store
readers, :meth:`S3Settings.arrow_options`), delta-rs (:func:`delta_storage_options`) and Spark's S3A
(:func:`spark_s3a_conf`, plus :func:`executor_env` so that the Python workers of a cluster resolve the same
settings).  Secrets are passed on, never printed or logged.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

from txlog_io.errors import UsageError
from txlog_io.storefs import S3Settings

PROFILE_NAMES = ("3.x", "4.0-4.2", "4.3-4.5", "4.6-4.9", "5.0", "5.1+")
MODES = ("indexed", "full")
DELTA_WRITERS = ("auto", "delta-rs", "spark")
#: where the reconstruction reduces (jobs.reconstruct.spark.reconstruct's ``path``)
RECONSTRUCT_PATHS = ("auto", "driver", "broker", "distributed")
OP_BODY_FORMATS = ("none", "single", "batched")
TRANSACTION_SCHEMES = ("statetable", "real-topic", "half-topic")
MIN_SPLIT_BYTES = 4 * 1024

AUDIT_DEFAULTS_FILE = "audit-defaults.properties"
BROKER_DEFAULTS_FILE = "broker-defaults.json"


class ConfigError(UsageError):
    """A configuration file or key is wrong; the message names the file and the key."""


@dataclass(frozen=True)
class BrokerProfile:
    """Broker defaults of one RocketMQ version range (None = no such setting / mechanism in that range)."""

    name: str
    versions: str
    transaction_scheme: str                       # statetable (3.x) | real-topic (4.0-4.2) | half-topic
    transaction_timeout_ms: Optional[int]         # transactionTimeOut
    transaction_check_max: Optional[int]          # transactionCheckMax (None = unbounded / no checker)
    transaction_check_interval_ms: Optional[int]  # transactionCheckInterval
    file_reserved_time_hours: int                 # fileReservedTime
    op_body_format: str                           # none | single ("1234") | batched ("1234,1236,")
    discard_topic: bool                           # discards go to TRANS_CHECK_MAX_TIME_TOPIC
    rollback_record: bool                         # a ROLLBACK record is written to the CommitLog
    ipv6_hosts: bool                              # IPv6 born/store hosts possible
    magic_v2: bool                                # MESSAGE_MAGIC_CODE_V2 possible
    checkpoint_size: int                          # bytes of the checkpoint file in use
    transaction_op_msg_max_size: Optional[int] = None       # transactionOpMsgMaxSize (5.1+)
    transaction_op_batch_interval_ms: Optional[int] = None  # transactionOpBatchInterval (5.1+)
    notes: str = ""


# JSON key (RocketMQ spelling) -> (BrokerProfile field, kind)
_PROFILE_KEYS: Dict[str, Tuple[str, str]] = {
    "versions": ("versions", "str"),
    "transactionScheme": ("transaction_scheme", "scheme"),
    "transactionTimeOut": ("transaction_timeout_ms", "int?"),
    "transactionCheckMax": ("transaction_check_max", "int?"),
    "transactionCheckInterval": ("transaction_check_interval_ms", "int?"),
    "fileReservedTime": ("file_reserved_time_hours", "int"),
    "opBodyFormat": ("op_body_format", "opbody"),
    "discardTopic": ("discard_topic", "bool"),
    "rollbackRecord": ("rollback_record", "bool"),
    "ipv6Hosts": ("ipv6_hosts", "bool"),
    "magicV2": ("magic_v2", "bool"),
    "checkpointSize": ("checkpoint_size", "int"),
    "transactionOpMsgMaxSize": ("transaction_op_msg_max_size", "int?"),
    "transactionOpBatchInterval": ("transaction_op_batch_interval_ms", "int?"),
    "notes": ("notes", "str"),
}
_OPTIONAL_PROFILE_FIELDS = ("transaction_op_msg_max_size", "transaction_op_batch_interval_ms", "notes")
_REQUIRED_PROFILE_KEYS = frozenset(k for k, (f, _) in _PROFILE_KEYS.items()
                                   if f not in _OPTIONAL_PROFILE_FIELDS)


@dataclass(frozen=True)
class AuditConfig:
    """Merged audit settings.  ``tables`` / ``broker_overrides`` are tuples of pairs (kept hashable)."""

    mode: str = "indexed"
    split_bytes: int = 128 * 1024 * 1024
    include_bodies: bool = False
    broker_profile: str = "auto"
    delta_writer: str = "auto"
    reconstruct_path: str = "auto"
    tables: Tuple[Tuple[str, str], ...] = ()
    broker_overrides: Tuple[Tuple[str, object], ...] = ()    # (BrokerProfile field, typed value)
    profiles: Tuple[Tuple[str, BrokerProfile], ...] = ()
    sources: Tuple[str, ...] = ()                             # files merged, in order

    def table(self, logical: str) -> str:
        """Directory name under ``--out`` of the logical table ``logical`` (``table.<logical>`` key)."""
        for k, v in self.tables:
            if k == logical:
                return v
        raise ConfigError(f"no output table {logical!r} configured "
                          f"(add table.{logical}=<name> to the config)")

    @property
    def table_names(self) -> Dict[str, str]:
        return dict(self.tables)

    def profile(self, name: Optional[str] = None) -> BrokerProfile:
        """Profile ``name`` (default: ``broker.profile``; must not be ``auto`` then) with the overrides
        applied."""
        name = name or self.broker_profile
        if name == "auto":
            raise ConfigError("broker.profile is 'auto': pass the detected profile name "
                              "(see profile_name_for_version)")
        by_name = dict(self.profiles)
        if name not in by_name:
            raise ConfigError(f"unknown broker profile {name!r} (known: {', '.join(by_name)})")
        prof = by_name[name]
        return replace(prof, **dict(self.broker_overrides)) if self.broker_overrides else prof


# ------------------------------------------------------------------------------------------------------------
# file readers
# ------------------------------------------------------------------------------------------------------------

def conf_dir() -> Path:
    env = os.environ.get("TXAUDIT_CONF_DIR")
    return Path(env) if env else Path(__file__).resolve().parent.parent / "conf"


def parse_properties(text: str) -> Dict[str, str]:
    """Java ``.properties`` subset: ``key=value`` / ``key: value`` / ``key value``, ``#``/``!`` comments,
    backslash line continuation, surrounding blanks trimmed.  The last occurrence of a key wins."""
    out: Dict[str, str] = {}
    logical = ""
    for raw in text.splitlines():
        line = raw.strip() if not logical else raw.lstrip()
        if not logical and (not line or line[0] in "#!"):
            continue
        if line.endswith("\\") and not line.endswith("\\\\"):
            logical += line[:-1]
            continue
        logical += line
        m = re.match(r"^((?:[^\s:=\\]|\\.)+)\s*[:=\s]\s*(.*)$", logical)
        if m:
            key, value = m.group(1), m.group(2)
        else:
            key, value = logical, ""
        out[key.replace("\\", "")] = value.strip()
        logical = ""
    if logical:
        out[logical] = ""
    return out


def _flatten(obj: Mapping, prefix: str = "") -> Dict[str, object]:
    out: Dict[str, object] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def read_conf_file(path) -> Dict[str, str]:
    """A user configuration file as flat ``key -> string``: JSON when it parses as a JSON object (or ends in
    ``.json``), else Java properties."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file {p}: {e}") from None
    stripped = text.lstrip()
    if p.suffix.lower() == ".json" or stripped.startswith("{"):
        try:
            obj = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"config file {p} is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ConfigError(f"config file {p} must hold a JSON object")
        flat = {k: v for k, v in _flatten(obj).items() if not k.split(".")[-1].startswith("_")}
        return {k: _json_scalar_to_str(p, k, v) for k, v in flat.items()}
    return parse_properties(text)


def _json_scalar_to_str(path, key, v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, (int, float, str)):
        return str(v)
    raise ConfigError(f"config file {path}: key '{key}' must be a string, number, boolean or null, got {v!r}")


# ------------------------------------------------------------------------------------------------------------
# value parsing
# ------------------------------------------------------------------------------------------------------------

_TRUE = {"true", "yes", "on", "1"}
_FALSE = {"false", "no", "off", "0"}
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_TABLE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def _bool(src, key, value) -> bool:
    v = str(value).strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise ConfigError(f"{src}: key '{key}': expected true or false, got {value!r}")


def _int(src, key, value, optional=False) -> Optional[int]:
    if value is None or (optional and str(value).strip().lower() in ("null", "none", "")):
        if optional:
            return None
        raise ConfigError(f"{src}: key '{key}': a value is required")
    if isinstance(value, bool):
        raise ConfigError(f"{src}: key '{key}': expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{src}: key '{key}': expected an integer, got {value!r}") from None


def parse_size(src, key, value) -> int:
    m = _SIZE.match(str(value))
    if not m:
        raise ConfigError(f"{src}: key '{key}': expected a byte count such as 134217728 or 128m, "
                          f"got {value!r}")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def _choice(src, key, value, choices) -> str:
    v = str(value).strip()
    if v not in choices:
        raise ConfigError(f"{src}: key '{key}': expected one of {', '.join(choices)}, got {value!r}")
    return v


def _profile_value(src, key, kind, value):
    if kind == "str":
        return "" if value is None else str(value)
    if kind == "int":
        return _int(src, key, value)
    if kind == "int?":
        return _int(src, key, value, optional=True)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        return _bool(src, key, value)
    if kind == "scheme":
        return _choice(src, key, value, TRANSACTION_SCHEMES)
    if kind == "opbody":
        return _choice(src, key, value, OP_BODY_FORMATS)
    raise AssertionError(kind)


# ------------------------------------------------------------------------------------------------------------
# loaders
# ------------------------------------------------------------------------------------------------------------

def load_broker_profiles(path=None) -> Dict[str, BrokerProfile]:
    """``conf/broker-defaults.json`` -> ``{profile name: BrokerProfile}`` (every profile and key checked)."""
    p = Path(path) if path else conf_dir() / BROKER_DEFAULTS_FILE
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"broker defaults not found: {p}") from None
    except ValueError as e:
        raise ConfigError(f"{p} is not valid JSON: {e}") from None
    profiles = doc.get("profiles") if isinstance(doc, dict) else None
    if not isinstance(profiles, dict):
        raise ConfigError(f"{p}: expected an object with a 'profiles' object")
    out: Dict[str, BrokerProfile] = {}
    for name, body in profiles.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{p}: profile {name!r} must be an object")
        kwargs = {"name": name}
        for key, value in body.items():
            if key.startswith("_"):
                if key == "_notes":
                    kwargs["notes"] = str(value)
                continue
            if key not in _PROFILE_KEYS:
                raise ConfigError(f"{p}: profile {name!r}: unknown key '{key}' "
                                  f"(known: {', '.join(sorted(_PROFILE_KEYS))})")
            field_name, kind = _PROFILE_KEYS[key]
            kwargs[field_name] = _profile_value(f"{p} profile {name!r}", key, kind, value)
        missing = sorted(k for k in _REQUIRED_PROFILE_KEYS if _PROFILE_KEYS[k][0] not in kwargs)
        if missing:
            raise ConfigError(f"{p}: profile {name!r} lacks key(s) {', '.join(missing)}")
        out[name] = BrokerProfile(**kwargs)
    absent = [n for n in PROFILE_NAMES if n not in out]
    if absent:
        raise ConfigError(f"{p}: missing profile(s) {', '.join(absent)}")
    return out


def profile_name_for_version(version: str) -> str:
    """RocketMQ version string (``"4.9.8"``, ``"5.3.3"``, ``"3.1.4"``, ``"rocketmq-all-4.2.0"``) -> profile
    name."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if not m:
        raise ConfigError(f"not a RocketMQ version: {version!r}")
    major, minor = int(m.group(1)), int(m.group(2))
    if major <= 3:
        return "3.x"
    if major == 4:
        if minor <= 2:
            return "4.0-4.2"
        if minor <= 5:
            return "4.3-4.5"
        return "4.6-4.9"
    if major == 5 and minor == 0:
        return "5.0"
    return "5.1+"


def _apply(settings: Dict[str, object], src: str, key: str, value, profile_names) -> None:
    """Validate one ``key=value`` and store its typed value in ``settings``."""
    if key == "mode":
        settings["mode"] = _choice(src, key, value, MODES)
    elif key == "split.bytes":
        n = parse_size(src, key, value)
        if n < MIN_SPLIT_BYTES:
            raise ConfigError(f"{src}: key '{key}': must be at least {MIN_SPLIT_BYTES} bytes, got {value!r}")
        settings["split_bytes"] = n
    elif key == "include.bodies":
        settings["include_bodies"] = _bool(src, key, value)
    elif key == "broker.profile":
        settings["broker_profile"] = _choice(src, key, value, ("auto",) + tuple(profile_names))
    elif key == "delta.writer":
        settings["delta_writer"] = _choice(src, key, value, DELTA_WRITERS)
    elif key == "reconstruct.path":
        settings["reconstruct_path"] = _choice(src, key, value, RECONSTRUCT_PATHS)
    elif key.startswith("table."):
        name = str(value).strip()
        if not _TABLE_NAME.match(name):
            raise ConfigError(f"{src}: key '{key}': not a usable table directory name: {value!r}")
        settings.setdefault("tables", {})[key[len("table."):]] = name
    elif key.startswith("broker.") and key[len("broker."):] in _PROFILE_KEYS:
        pkey = key[len("broker."):]
        field_name, kind = _PROFILE_KEYS[pkey]
        settings.setdefault("broker_overrides", {})[field_name] = _profile_value(src, key, kind, value)
    else:
        raise ConfigError(f"{src}: unknown key '{key}'")


def load_audit_config(conf_file=None, overrides: Optional[Mapping[str, object]] = None,
                      defaults_path=None, broker_defaults_path=None) -> AuditConfig:
    """Defaults, then ``conf_file`` (if any), then ``overrides`` (``key -> value``, e.g. from the command
    line).

    Keys a user file may set: those of ``audit-defaults.properties`` (``table.<name>`` keys may add new
    tables)
    and ``broker.<key>`` for the keys of a broker profile."""
    dpath = Path(defaults_path) if defaults_path else conf_dir() / AUDIT_DEFAULTS_FILE
    if not dpath.is_file():
        raise ConfigError(f"audit defaults not found: {dpath}")
    profiles = load_broker_profiles(broker_defaults_path)
    settings: Dict[str, object] = {}
    sources = [str(dpath)]
    defaults = parse_properties(dpath.read_text(encoding="utf-8"))
    for k, v in defaults.items():
        _apply(settings, str(dpath), k, v, profiles)
    default_keys = set(defaults)
    layers = []
    if conf_file:
        layers.append((str(conf_file), read_conf_file(conf_file)))
        sources.append(str(Path(conf_file).resolve()))
    if overrides:
        layers.append(("command line", dict(overrides)))
    for src, values in layers:
        for k, v in values.items():
            if not (k in default_keys or k.startswith("table.")
                    or (k.startswith("broker.") and k[len("broker."):] in _PROFILE_KEYS)):
                known = sorted(default_keys) + ["broker.<" + "|".join(sorted(_PROFILE_KEYS)) + ">"]
                raise ConfigError(f"{src}: unknown key '{k}' (known: {', '.join(known)})")
            _apply(settings, src, k, v, profiles)
    tables = settings.pop("tables", {})
    names = list(tables.values())
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"two output tables share the directory name(s) {', '.join(dup)}")
    overrides_t = tuple(sorted(settings.pop("broker_overrides", {}).items()))
    valid = {f.name for f in fields(AuditConfig)}
    assert set(settings) <= valid, settings
    return AuditConfig(tables=tuple(sorted(tables.items())), broker_overrides=overrides_t,
                       profiles=tuple(profiles.items()), sources=tuple(sources), **settings)


# ------------------------------------------------------------------------------------------------------------
# object storage (one place for pyarrow.fs, delta-rs and Spark's S3A)
# ------------------------------------------------------------------------------------------------------------

#: delta-rs commit options a user may set in the environment (passed on as they are)
_DELTA_COMMIT_KEYS = ("AWS_S3_ALLOW_UNSAFE_RENAME", "AWS_COPY_IF_NOT_EXISTS", "AWS_CONDITIONAL_PUT")


def object_store_settings(env: Optional[Mapping[str, str]] = None) -> S3Settings:
    """The S3 settings of this process (``env`` defaults to ``os.environ``)."""
    return S3Settings.from_env(env)


def delta_storage_options(settings: Optional[S3Settings] = None,
                          env: Optional[Mapping[str, str]] = None) -> Dict[str, str]:
    """delta-rs ``storage_options`` of the same settings.

    Commits: delta-rs (1.x) writes each ``_delta_log/<version>.json`` with a conditional PUT
    (``If-None-Match: *``, put-if-absent), which AWS S3 and the S3-compatible servers with conditional writes
    refuse (412) when the version exists: two writers can never both commit a version, so no DynamoDB lock
    and no ``AWS_S3_ALLOW_UNSAFE_RENAME`` (a copy-then-delete rename, not atomic) are set.  A server without
    conditional writes needs one of delta-rs' own options, taken from the environment when set there:
    ``AWS_S3_ALLOW_UNSAFE_RENAME=true`` (then only the run lock keeps writers apart), ``AWS_COPY_IF_NOT_EXISTS``
    or ``AWS_CONDITIONAL_PUT``."""
    s = settings or object_store_settings(env)
    env = os.environ if env is None else env
    opts = {k: env[k] for k in _DELTA_COMMIT_KEYS if env.get(k)}
    if s.endpoint_url:
        opts["AWS_ENDPOINT_URL"] = s.endpoint_url
        if s.endpoint_url.lower().startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
        opts["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "false"
    if s.region or s.endpoint_url:
        opts["AWS_REGION"] = s.region or "us-east-1"
    if s.access_key_id and s.secret_access_key:
        opts["AWS_ACCESS_KEY_ID"], opts["AWS_SECRET_ACCESS_KEY"] = s.access_key_id, s.secret_access_key
        if s.session_token:
            opts["AWS_SESSION_TOKEN"] = s.session_token
    return opts


def spark_s3a_conf(settings: Optional[S3Settings] = None) -> Dict[str, str]:
    """``spark.hadoop.fs.s3a.*`` of the same settings (empty when nothing is set: S3A's own chain)."""
    s = settings or object_store_settings()
    p = "spark.hadoop.fs.s3a."
    conf: Dict[str, str] = {}
    if s.endpoint_url:
        conf[p + "endpoint"] = s.endpoint_url
        conf[p + "path.style.access"] = "true"
        conf[p + "connection.ssl.enabled"] = str(s.endpoint_url.lower().startswith("https://")).lower()
    if s.region:
        conf[p + "endpoint.region"] = s.region
    if s.access_key_id and s.secret_access_key:
        conf[p + "access.key"], conf[p + "secret.key"] = s.access_key_id, s.secret_access_key
        if s.session_token:
            conf[p + "session.token"] = s.session_token
            conf[p + "aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
    return conf


def executor_env(settings: Optional[S3Settings] = None) -> Dict[str, str]:
    """``spark.executorEnv.*`` carrying the same settings to the Python workers (they read the environment;
    Spark redacts the secret and token values in its UI and logs)."""
    s = settings or object_store_settings()
    env = {"AWS_ENDPOINT_URL": s.endpoint_url, "AWS_REGION": s.region, "AWS_ACCESS_KEY_ID": s.access_key_id,
           "AWS_SECRET_ACCESS_KEY": s.secret_access_key, "AWS_SESSION_TOKEN": s.session_token}
    if not (s.access_key_id and s.secret_access_key):
        env.pop("AWS_ACCESS_KEY_ID"), env.pop("AWS_SECRET_ACCESS_KEY"), env.pop("AWS_SESSION_TOKEN")
    return {f"spark.executorEnv.{k}": v for k, v in env.items() if v}


def object_store_conf(settings: Optional[S3Settings] = None) -> Dict[str, str]:
    """The Spark conf a session of the audit gets from the S3 settings: :func:`spark_s3a_conf` and
    :func:`executor_env` (empty when the environment sets nothing)."""
    s = settings or object_store_settings()
    return {**spark_s3a_conf(s), **executor_env(s)}


__all__ = ["AuditConfig", "BrokerProfile", "ConfigError", "PROFILE_NAMES", "MODES", "DELTA_WRITERS",
           "RECONSTRUCT_PATHS",
           "load_audit_config", "load_broker_profiles", "profile_name_for_version", "read_conf_file",
           "parse_properties", "conf_dir", "object_store_settings", "delta_storage_options", "spark_s3a_conf",
           "executor_env", "object_store_conf"]
