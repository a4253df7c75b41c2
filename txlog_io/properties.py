"""Message properties string <-> map, and Java's String.hashCode.

Layout (common/.../message/MessageDecoder.java, messageProperties2String / string2messageProperties, 5.3.3 and
4.9.7; 3.1.4 splits with String.split but yields the same map for well-formed input):

    name 0x01 value 0x02 name 0x01 value 0x02 ...        (the last entry is terminated by 0x02 too)

Decoding follows the 5.x reader exactly: split on 0x02 (a missing final 0x02 is fine); in each segment the key is
the text before the first 0x01 and the value everything after it; both must be non-empty or the segment is
ignored; a later duplicate key wins.  Separators are ASCII, so working on bytes gives the same result as Java
working on UTF-16 chars.
"""
from __future__ import annotations

from operator import mul
from typing import Mapping, Sequence

NAME_VALUE_SEPARATOR = b"\x01"
PROPERTY_SEPARATOR = b"\x02"

# Keys the auditor cares about (common/.../message/MessageConst.java).
TRAN_MSG = "TRAN_MSG"
PGROUP = "PGROUP"
REAL_TOPIC = "REAL_TOPIC"
REAL_QID = "REAL_QID"
UNIQ_KEY = "UNIQ_KEY"
TRANSACTION_ID = "__transactionId__"
TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
TRAN_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
KEYS = "KEYS"
TAGS = "TAGS"
WAIT = "WAIT"
DELAY = "DELAY"
CLUSTER = "CLUSTER"
CRC32 = "__CRC32#"
INNER_NUM = "INNER_NUM"


def encode_properties(props: Mapping[str, str], trailing_separator: bool = True) -> bytes:
    """messageProperties2String: every entry with a non-null value, in map order, separated by 0x02.

    3.x and 5.x terminate the last entry with 0x02 as well; real 4.9.8 stores have no final 0x02 (observed in
    the fixtures), so the caller picks the variant its version writes.
    """
    text = "\x02".join([f"{k}\x01{v}" for k, v in props.items() if v is not None])
    if text and trailing_separator:
        text += "\x02"
    return text.encode("utf-8")


def decode_properties(raw: bytes) -> dict:
    """string2messageProperties on the raw bytes; invalid UTF-8 is replaced (U+FFFD), never raised."""
    result: dict = {}
    n = len(raw)
    index = 0
    while index < n:
        end = raw.find(PROPERTY_SEPARATOR, index)
        if end < 0:
            end = n
        if end - index >= 3:
            kv = raw.find(NAME_VALUE_SEPARATOR, index, end)
            if index < kv < end - 1:
                result[raw[index:kv].decode("utf-8", "replace")] = raw[kv + 1:end].decode("utf-8", "replace")
        index = end + 1
    return result


#: 31**k mod 2**32, lowest power first: the hash of code units c[0..n) is sum(c[n-1-k] * _POW31[k]) mod 2**32
#: (the units reversed, multiplied pairwise: map stops at the shorter sequence, so no slice of the table)
_POW31_MAX = 512
_POW31 = [pow(31, k, 1 << 32) for k in range(_POW31_MAX)]


#: long ASCII strings are hashed as prefix + the last _TAIL characters: hash(a + b) = hash(a) * 31**len(b) +
#: hash(b) (mod 2**32), and the prefix's hash is remembered (index keys "topic#UNIQ_KEY" share all but the
#: UNIQ_KEY's time and counter digits); the table is emptied when it reaches _PREFIX_CACHE_MAX entries
_TAIL = 12
_PREFIX_CACHE_MAX = 4096
_prefix_hashes: dict = {}


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode (UTF-16 code units, 32-bit signed wrap-around)."""
    if 2 * _TAIL < len(s) <= _POW31_MAX and s.isascii():
        prefix = s[:-_TAIL]
        hp = _prefix_hashes.get(prefix)
        if hp is None:
            if len(_prefix_hashes) >= _PREFIX_CACHE_MAX:
                _prefix_hashes.clear()
            hp = _prefix_hashes[prefix] = sum(map(mul, prefix.encode("ascii")[::-1], _POW31))
        h = (hp * _POW31[_TAIL] + sum(map(mul, s[-_TAIL:].encode("ascii")[::-1], _POW31))) & 0xFFFFFFFF
        return h - (1 << 32) if h & 0x80000000 else h
    if s.isascii():
        units: Sequence[int] = s.encode("ascii")
    else:
        data = s.encode("utf-16-be")
        units = [(data[i] << 8) | data[i + 1] for i in range(0, len(data), 2)]
    n = len(units)
    if n <= _POW31_MAX:
        h = sum(map(mul, units[::-1], _POW31)) & 0xFFFFFFFF
    else:
        h = 0
        for u in units:
            h = (31 * h + u) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def tags_code(tags: str | None) -> int:
    """Consume-queue tagsCode for an ordinary topic: TAGS.hashCode(), 0 without tags (sign-extended to int64)."""
    return java_string_hash(tags) if tags else 0
