"""config/*.json (fastjson, lenient parse + byte-exact writer) and the store checkpoint file.

Sources: common/.../ConfigManager.java (load -> loadBak, persist), common/.../MixAll.java (string2File, file2String),
broker/.../offset/ConsumerOffsetManager.java (TOPIC_GROUP_SEPARATOR "@"), broker/.../topic/TopicConfigManager.java,
broker/.../schedule/ScheduleMessageService.java (delayOffset.json), store/.../StoreCheckpoint.java — 5.3.3 / 4.9.7 /
3.1.4; fastjson 1.2.x serializer/MapSerializer.java and JSONSerializer.println for the pretty format.

fastjson pretty format, as written by RocketMQ (and reproduced by write_fastjson):
    {                                  a map / bean: '{', then per String key a newline + one tab per depth,
    \t"offsetTable":{                  '"key":value', entries separated by ','; after the last entry a newline
    \t\t"TopicA@CID":{0:506,1:73       + the parent's tabs, then '}' ('{}' when empty).  Non-String (Integer)
    \t\t}                              keys are written bare and inline, with no newline before them, so an
    \t}                                integer-keyed map prints as '{0:506,1:73' + newline + tabs + '}'.
    }                                  Sets print compact ('["a","b"]').  Null values are skipped.  No final newline.
Integer keys make the files non-standard JSON; `parse_fastjson` quotes bare keys with a small tokenizer (strings are
copied verbatim, so digits or colons inside strings are never touched), drops trailing commas, and then hands the
text to json.loads.  Bare integer keys come back as Python ints, quoted keys as str, so a parse -> write round trip
is byte-identical.

Checkpoint (4096 bytes = one OS page, big-endian int64s; StoreCheckpoint):
     0 physicMsgTimestamp   8 logicsMsgTimestamp   16 indexMsgTimestamp        (3.x and later: 24-byte variant)
    24 masterFlushedOffset                                                     (5.0.0 and later: 32-byte variant)
    32 confirmPhyOffset                                                        (5.1.1 and later: 40-byte variant)
Which fields are meaningful: with a version hint, exactly those that version writes.  Without one, the file cannot
tell "written as 0" from "never written", so we take the longest variant whose last field is non-zero
(confirmPhyOffset != 0 -> 40, else masterFlushedOffset != 0 -> 32, else 24) and report the others as None.
"""
from __future__ import annotations

import bisect
import json
import math
import os
import re
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import pyarrow as pa

from schemas import store as store_schemas
from txlog_io import readstats
from txlog_io.errors import (
    Anomaly,
    AnomalyKind,
    EncodeError,
    FormatError,
    StoreNotFoundError,
    UnreadableFileError,
    UsageError,
)
from txlog_io.positional import input_size, open_input
from txlog_io.storefs import as_path

TOPIC_GROUP_SEPARATOR = "@"  # ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR
BAK_SUFFIX = ".bak"          # MixAll.string2File keeps the previous content here
TMP_SUFFIX = ".tmp"
MAX_CONFIG_FILE_BYTES = 256 << 20  # bound before reading: real config files are kilobytes to a few megabytes

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


# ---------------------------------------------------------------------------------------------------------------
# Lenient fastjson parsing
# ---------------------------------------------------------------------------------------------------------------

class _LenientJsonError(Exception):
    def __init__(self, position: int, message: str):
        super().__init__(message)
        self.position = position
        self.message = message


_WHITESPACE = " \t\r\n"
_TOKEN_STOP = set(_WHITESPACE) | set("{}[]:,\"'")
_INTEGER = re.compile(r"-?[0-9]+")


def _scan_string(text: str, start: int) -> int:
    """Index just after the string literal opening at `start` (quote char text[start]); escapes are skipped."""
    quote = text[start]
    i = start + 1
    n = len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return i + 1
        i += 1
    raise _LenientJsonError(start, "unterminated string")


def _single_to_double_quoted(literal: str) -> str:
    """fastjson also accepts 'single-quoted' strings; re-express one as a JSON string."""
    body = literal[1:-1]
    out = []
    i = 0
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body) and body[i + 1] == "'":
            out.append("'")
            i += 2
            continue
        if c == '"':
            out.append('\\"')
        else:
            out.append(c)
        i += 1
    return '"' + "".join(out) + '"'


class _Normalized:
    """The text made standard JSON, which bare keys were integers (per object, in closing order), and a map from
    positions in the new text back to the original (for error positions)."""

    def __init__(self, text: str):
        self.pieces: list = []
        self.length = 0
        self.closing_flags: list = []
        self.shift_at: list = [0]      # normalized positions where the running delta changes
        self.shift_delta: list = [0]   # normalized - original from that position on
        self._run(text)
        self.text = "".join(self.pieces)

    def _emit(self, piece: str, original_length: int) -> None:
        self.pieces.append(piece)
        self.length += len(piece)
        if len(piece) != original_length:
            self.shift_at.append(self.length)
            self.shift_delta.append(self.shift_delta[-1] + len(piece) - original_length)

    def original_position(self, normalized_position: int) -> int:
        index = bisect.bisect_right(self.shift_at, normalized_position) - 1
        return max(0, normalized_position - self.shift_delta[index])

    def _run(self, text: str) -> None:
        stack: list = []   # frames: ["{", expecting_key, flags] or ["["]
        last_significant = -1  # index in pieces of the last non-whitespace piece
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            top: Any = stack[-1] if stack else None     # a frame of ``stack`` or None
            in_key_position = top is not None and top[0] == "{" and top[1]
            if c in _WHITESPACE:
                j = i
                while j < n and text[j] in _WHITESPACE:
                    j += 1
                self._emit(text[i:j], j - i)
                i = j
                continue
            if c == '"' or c == "'":
                j = _scan_string(text, i)
                literal = text[i:j]
                self._emit(literal if c == '"' else _single_to_double_quoted(literal), j - i)
                if in_key_position:
                    top[2].append(False)
                    top[1] = False
                i = j
            elif c == "{":
                stack.append(["{", True, []])
                self._emit(c, 1)
                i += 1
            elif c == "[":
                stack.append(["["])
                self._emit(c, 1)
                i += 1
            elif c in "}]":
                expected = "{" if c == "}" else "["
                if top is None or top[0] != expected:
                    raise _LenientJsonError(i, f"unbalanced {c!r}")
                if last_significant >= 0 and self.pieces[last_significant] == ",":
                    self.pieces[last_significant] = " "  # trailing comma: same length, so positions hold
                stack.pop()
                if c == "}":
                    self.closing_flags.append(top[2])
                self._emit(c, 1)
                i += 1
            elif c == ",":
                if top is not None and top[0] == "{":
                    top[1] = True
                self._emit(c, 1)
                i += 1
            elif c == ":":
                self._emit(c, 1)
                i += 1
            else:
                j = i
                while j < n and text[j] not in _TOKEN_STOP:
                    j += 1
                token = text[i:j]
                if in_key_position:
                    self._emit(json.dumps(token), j - i)
                    top[2].append(bool(_INTEGER.fullmatch(token)))
                    top[1] = False
                else:
                    self._emit(token, j - i)  # true / false / null / numbers; anything else fails in json.loads
                i = j
            last_significant = len(self.pieces) - 1


def parse_fastjson(text: str, *, file: str = "<string>") -> Any:
    """Parse fastjson output (unquoted integer keys, trailing commas, 'single quotes' tolerated).

    Bare integer keys become ints; every other key stays a str.  Raises FormatError(BAD_JSON) with the position
    in the original text.
    """
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        normalized = _Normalized(text)
    except _LenientJsonError as e:
        raise FormatError(AnomalyKind.BAD_JSON, file, e.position, e.message) from None
    pending = iter(normalized.closing_flags)

    def build_object(pairs):
        flags = next(pending, [])
        result = {}
        for index, (key, value) in enumerate(pairs):
            bare_integer = index < len(flags) and flags[index]
            result[int(key) if bare_integer else key] = value
        return result

    try:
        return json.loads(normalized.text, object_pairs_hook=build_object)
    except json.JSONDecodeError as e:
        raise FormatError(AnomalyKind.BAD_JSON, file, normalized.original_position(e.pos), e.msg) from None
    except RecursionError:
        raise FormatError(AnomalyKind.BAD_JSON, file, 0, "nesting too deep") from None


def _read_text(path: Path) -> str:
    try:
        with open_input(path) as f:
            size = input_size(f)
            if size > MAX_CONFIG_FILE_BYTES:
                raise FormatError(AnomalyKind.BAD_JSON, str(path), 0, "config file too large to be real",
                                  f"<= {MAX_CONFIG_FILE_BYTES} bytes", f"{size} bytes")
            raw = f.read(MAX_CONFIG_FILE_BYTES + 1)
            readstats.add(len(raw), "config")
    except IsADirectoryError:
        raise UnreadableFileError(str(path), "is a directory") from None
    except OSError as e:
        raise UnreadableFileError(str(path), e.strerror or str(e)) from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(AnomalyKind.BAD_JSON, str(path), e.start, "not valid UTF-8") from None


def load_fastjson_file(path, *, source: str = "config") -> tuple:
    """(object or None, text or None, path actually read, anomalies), with ConfigManager.load's fallback:
    a missing, empty or unparsable file is replaced by its `.bak` copy (reported).  Raises StoreNotFoundError
    only when neither exists."""
    main = as_path(path)
    bak = main.with_name(main.name + BAK_SUFFIX)
    if not main.exists() and not bak.exists():
        raise StoreNotFoundError(str(main), "config file")
    anomalies = []
    for candidate in (main, bak):
        if not candidate.exists():
            anomalies.append(Anomaly(AnomalyKind.MISSING_FILE, str(candidate), 0,
                                     "config file missing" + ("; using the .bak copy" if candidate == main else ""),
                                     "a file", "missing", source))
            continue
        try:
            text = _read_text(candidate)
            if not text.strip():
                raise FormatError(AnomalyKind.BAD_JSON, str(candidate), 0, "empty file")
            obj = parse_fastjson(text, file=str(candidate))
        except FormatError as e:
            anomaly = e.anomaly
            if candidate == main and bak.exists():
                anomaly = Anomaly(anomaly.kind, anomaly.file, anomaly.position,
                                  anomaly.detail + f"; falling back to {bak.name} (as ConfigManager.loadBak does)",
                                  anomaly.expected, anomaly.actual, source)
            else:
                anomaly = Anomaly(anomaly.kind, anomaly.file, anomaly.position, anomaly.detail, anomaly.expected,
                                  anomaly.actual, source)
            anomalies.append(anomaly)
            continue
        return obj, text, candidate, anomalies
    return None, None, None, anomalies


def _entry_anomaly(file: Path, text: Optional[str], key: Any, detail: str, expected: str, actual: Any) -> Anomaly:
    position = 0
    if text is not None:
        found = text.find(json.dumps(key) if isinstance(key, str) else str(key))
        position = max(found, 0)
    return Anomaly(AnomalyKind.BAD_CONFIG_ENTRY, str(file), position, detail, expected, str(actual), "config")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _table(obj, name: str, file: Path, text: Optional[str], anomalies: list) -> dict:
    if obj is None:
        return {}
    if not isinstance(obj, dict):
        anomalies.append(_entry_anomaly(file, None, name, "top level is not an object", "an object",
                                        type(obj).__name__))
        return {}
    table = obj.get(name)
    if table is None:
        anomalies.append(_entry_anomaly(file, None, name, f"no {name}", f"an {name} object", "missing"))
        return {}
    if not isinstance(table, dict):
        anomalies.append(_entry_anomaly(file, text, name, f"{name} is not an object", "an object",
                                        type(table).__name__))
        return {}
    return table


def _int_key(key) -> Optional[int]:
    if _is_int(key):
        return key
    if isinstance(key, str) and _INTEGER.fullmatch(key):
        return int(key)  # fastjson with WriteNonStringKeyAsString quotes them; RocketMQ still reads an Integer
    return None


def read_consumer_offsets(path) -> tuple:
    """(rows, anomalies) from consumerOffset.json: one row {topic, group, queue_id, offset, file} per queue.

    Keys of offsetTable are "topic@group"; topic and group names cannot contain '@' (validated character set), so
    a key must split into exactly two parts, like ConsumerOffsetManager's `split(TOPIC_GROUP_SEPARATOR)` checks.
    """
    obj, text, used, anomalies = load_fastjson_file(path, source="config")
    rows = []
    for key, queues in _table(obj, "offsetTable", used, text, anomalies).items():
        parts = key.split(TOPIC_GROUP_SEPARATOR) if isinstance(key, str) else []
        if len(parts) != 2 or not parts[0] or not parts[1]:
            anomalies.append(_entry_anomaly(used, text, key, "offsetTable key is not 'topic@group'",
                                            "exactly one '@' between non-empty names", key))
            continue
        if not isinstance(queues, dict):
            anomalies.append(_entry_anomaly(used, text, key, "queue offsets are not an object",
                                            "{queueId: offset}", type(queues).__name__))
            continue
        for queue_key, offset in queues.items():
            queue_id = _int_key(queue_key)
            if queue_id is None or not _INT32_MIN <= queue_id <= _INT32_MAX:
                anomalies.append(_entry_anomaly(used, text, key, f"bad queue id in {key}", "an int32 queue id",
                                                queue_key))
                continue
            if not _is_int(offset) or not _INT64_MIN <= offset <= _INT64_MAX:
                anomalies.append(_entry_anomaly(used, text, key, f"bad offset for queue {queue_id} of {key}",
                                                "an int64 offset", offset))
                continue
            rows.append({"topic": parts[0], "group": parts[1], "queue_id": queue_id, "offset": offset,
                         "file": str(used)})
    return rows, anomalies


def consumer_offsets_batch(rows) -> pa.RecordBatch:
    """Rows from read_consumer_offsets as a schemas.CONSUMER_OFFSETS RecordBatch."""
    schema = store_schemas.CONSUMER_OFFSETS.arrow_schema()
    return pa.RecordBatch.from_pylist([{name: row[name] for name in schema.names} for row in rows], schema=schema)


def read_topics(path) -> tuple:
    """(topicConfigTable {topic: config dict}, anomalies) from topics.json."""
    obj, text, used, anomalies = load_fastjson_file(path, source="config")
    topics = {}
    for name, config in _table(obj, "topicConfigTable", used, text, anomalies).items():
        if not isinstance(config, dict):
            anomalies.append(_entry_anomaly(used, text, name, "topic config is not an object", "an object",
                                            type(config).__name__))
            continue
        topics[str(name)] = config
    return topics, anomalies


def read_delay_offsets(path) -> tuple:
    """({delay level: offset}, anomalies) from delayOffset.json (SCHEDULE_TOPIC_XXXX queue id = level - 1)."""
    obj, text, used, anomalies = load_fastjson_file(path, source="config")
    offsets = {}
    for key, offset in _table(obj, "offsetTable", used, text, anomalies).items():
        level = _int_key(key)
        if level is None or not _is_int(offset):
            anomalies.append(_entry_anomaly(used, text, key, "bad delay offset entry", "{level: offset}",
                                            f"{key}: {offset}"))
            continue
        offsets[level] = offset
    return offsets, anomalies


# ---------------------------------------------------------------------------------------------------------------
# fastjson writer
# ---------------------------------------------------------------------------------------------------------------

def _quote(text: str) -> str:
    # json.dumps escapes exactly what fastjson escapes by default: '"', '\\' and control characters.
    return json.dumps(text, ensure_ascii=False)


def _java_double(value: float) -> str:
    """Java Double.toString (what fastjson writes): plain between 1e-3 and 1e7, else d.dddE<n>; NaN/Inf -> null."""
    if math.isnan(value) or math.isinf(value):
        return "null"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    if 1e-3 <= abs(value) < 1e7:
        text = repr(value)
        return text if "." in text else text + ".0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)   # finite: NaN and the infinities returned above
    text = "".join(map(str, digits))
    mantissa = text[0] + "." + (text[1:] or "0")
    return ("-" if sign else "") + f"{mantissa}E{len(text) - 1 + exponent}"


def _write(value, out: list, depth: int, pretty: bool) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, (int, np.integer)):
        out.append(str(int(value)))
    elif isinstance(value, (float, np.floating)):
        out.append(_java_double(float(value)))
    elif isinstance(value, str):
        out.append(_quote(value))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for key, item in value.items():
            if item is None:
                continue  # fastjson skips null values unless WriteMapNullValue
            if not first:
                out.append(",")
            if isinstance(key, str):
                if pretty:
                    out.append("\n" + "\t" * (depth + 1))
                out.append(_quote(key))
            elif isinstance(key, (int, np.integer)) and not isinstance(key, bool):
                out.append(str(int(key)))   # MapSerializer: non-String keys bare and inline
            else:
                raise EncodeError("map key", "str or int", key)
            out.append(":")
            first = False
            _write(item, out, depth + 1, pretty)
        if pretty and len(value) > 0:
            out.append("\n" + "\t" * depth)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        # fastjson prints Sets (the only collections RocketMQ's config files hold, e.g. groupTopicMap) compact.
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _write(item, out, depth + 1, pretty)
        out.append("]")
    else:
        raise EncodeError("value", "None, bool, int, float, str, dict or list", type(value).__name__)


def write_fastjson(obj, *, pretty: bool = True) -> str:
    """JSON.toJSONString(obj, prettyFormat) as RocketMQ's ConfigManager.encode(true) produces it (see module doc)."""
    out: list = []
    _write(obj, out, 0, pretty)
    return "".join(out)


def write_config_file(path, text: str) -> None:
    """MixAll.string2File: write `<name>.tmp`, copy the previous content to `<name>.bak`, then move tmp in place."""
    target = Path(path)
    tmp = target.with_name(target.name + TMP_SUFFIX)
    bak = target.with_name(target.name + BAK_SUFFIX)
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    if target.exists():
        with open(target, "rb") as src:
            previous = src.read()
        with open(bak, "wb") as f:
            f.write(previous)
    os.replace(tmp, target)


# ---------------------------------------------------------------------------------------------------------------
# Checkpoint
# ---------------------------------------------------------------------------------------------------------------

CHECKPOINT_FILE_SIZE = 4096  # MappedFile.OS_PAGE_SIZE
CHECKPOINT_DTYPE = np.dtype([("physic_msg_timestamp", ">i8"), ("logics_msg_timestamp", ">i8"),
                             ("index_msg_timestamp", ">i8"), ("master_flushed_offset", ">i8"),
                             ("confirm_phy_offset", ">i8")])
assert CHECKPOINT_DTYPE.fields is not None and CHECKPOINT_DTYPE.names is not None  # structured
_CHECKPOINT_NAMES = CHECKPOINT_DTYPE.names
_CHECKPOINT_FIELDS = CHECKPOINT_DTYPE.fields
_CHECKPOINT_STRUCT = struct.Struct(">" + "q" * len(_CHECKPOINT_NAMES))
CHECKPOINT_VARIANT_3X = CHECKPOINT_DTYPE.fields["master_flushed_offset"][1]   # 24
CHECKPOINT_VARIANT_5_0 = CHECKPOINT_DTYPE.fields["confirm_phy_offset"][1]     # 32
CHECKPOINT_VARIANT_5_1_1 = CHECKPOINT_DTYPE.itemsize                          # 40


def checkpoint_variant_for_version(version: str) -> int:
    """24 before 5.0.0, 32 for 5.0.0 - 5.1.0, 40 from 5.1.1."""
    match = re.match(r"\s*(\d+)(?:\.(\d+))?(?:\.(\d+))?", str(version))
    if not match:
        raise UsageError(f"cannot read a RocketMQ version from {version!r}")
    parts = tuple(int(p) if p is not None else 0 for p in match.groups())
    if parts < (5, 0, 0):
        return CHECKPOINT_VARIANT_3X
    if parts < (5, 1, 1):
        return CHECKPOINT_VARIANT_5_0
    return CHECKPOINT_VARIANT_5_1_1


def decode_checkpoint(path, *, version: Optional[str] = None) -> dict:
    """The checkpoint's fields: physic/logics/index_msg_timestamp, master_flushed_offset and confirm_phy_offset
    (None when the variant does not have them), variant (24/32/40) and anomalies (BAD_CHECKPOINT)."""
    file_str = str(path)
    try:
        with open_input(path) as f:
            size = input_size(f)
            raw = f.read(CHECKPOINT_FILE_SIZE)
            readstats.add(len(raw), "checkpoint")
    except FileNotFoundError:
        raise StoreNotFoundError(file_str, "checkpoint") from None
    except IsADirectoryError:
        raise UnreadableFileError(file_str, "is a directory") from None
    except OSError as e:
        raise UnreadableFileError(file_str, e.strerror or str(e)) from None
    anomalies = []
    if size != CHECKPOINT_FILE_SIZE:
        # RocketMQ maps exactly one page: a short file reads as zero-padded, extra bytes are never read.
        anomalies.append(Anomaly(AnomalyKind.BAD_CHECKPOINT, file_str, min(size, CHECKPOINT_FILE_SIZE),
                                 "checkpoint is not one 4096-byte page", str(CHECKPOINT_FILE_SIZE), str(size),
                                 "checkpoint"))
    page = raw.ljust(CHECKPOINT_FILE_SIZE, b"\0")
    values = dict(zip(_CHECKPOINT_NAMES, _CHECKPOINT_STRUCT.unpack_from(page, 0), strict=True))
    if version is not None:
        variant = checkpoint_variant_for_version(version)
    elif values["confirm_phy_offset"]:
        variant = CHECKPOINT_VARIANT_5_1_1
    elif values["master_flushed_offset"]:
        variant = CHECKPOINT_VARIANT_5_0
    else:
        variant = CHECKPOINT_VARIANT_3X
    tail = np.frombuffer(page, dtype=np.uint8)[variant:]
    stray = np.flatnonzero(tail)
    if stray.size:
        pos = variant + int(stray[0])
        anomalies.append(Anomaly(AnomalyKind.BAD_CHECKPOINT, file_str, pos,
                                 f"non-zero bytes after the {variant}-byte checkpoint variant", "zero bytes",
                                 f"0x{page[pos]:02x}", "checkpoint"))
    for name in ("physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp"):
        if values[name] < 0:
            pos = _CHECKPOINT_FIELDS[name][1]
            anomalies.append(Anomaly(AnomalyKind.BAD_CHECKPOINT, file_str, pos, f"negative {name}", ">= 0",
                                     str(values[name]), "checkpoint"))
    return {
        "physic_msg_timestamp": values["physic_msg_timestamp"],
        "logics_msg_timestamp": values["logics_msg_timestamp"],
        "index_msg_timestamp": values["index_msg_timestamp"],
        "master_flushed_offset": values["master_flushed_offset"] if variant >= CHECKPOINT_VARIANT_5_0 else None,
        "confirm_phy_offset": values["confirm_phy_offset"] if variant >= CHECKPOINT_VARIANT_5_1_1 else None,
        "variant": variant,
        "anomalies": anomalies,
    }


def encode_checkpoint(physic_msg_timestamp: int, logics_msg_timestamp: int, index_msg_timestamp: int,
                      master_flushed_offset: Optional[int] = None, confirm_phy_offset: Optional[int] = None
                      ) -> bytes:
    """A 4096-byte checkpoint page; the 5.x fields are written only when given (zero otherwise, like 3.x/4.x)."""
    fields = [physic_msg_timestamp, logics_msg_timestamp, index_msg_timestamp,
              master_flushed_offset or 0, confirm_phy_offset or 0]
    for name, value in zip(_CHECKPOINT_NAMES, fields, strict=True):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise EncodeError(name, "an int", value)
        if not _INT64_MIN <= int(value) <= _INT64_MAX:
            raise EncodeError(name, "an int64", value)
    return _CHECKPOINT_STRUCT.pack(*(int(v) for v in fields)).ljust(CHECKPOINT_FILE_SIZE, b"\0")
