"""Host addresses, offsetMsgId and UNIQ_KEY.

offsetMsgId (common/.../message/MessageDecoder.java createMessageId / decodeMessageId, 5.3.3, 4.9.7, 3.1.4):
    upper-case hex of  store-host IP (4 or 16 bytes) | int32 port | int64 PHYSICALOFFSET   -> 32 or 56 hex chars
UNIQ_KEY (common/.../message/MessageClientIDSetter.java createUniqID, 4.9.7 / 5.3.3):
    upper-case hex of  IP (4 or 16 bytes) | int16 pid | int32 ClassLoader.hashCode |
                       int32 ms since start of month (producer time zone) | int16 counter
Host text follows Java's InetAddress.getHostAddress: dotted IPv4, and for IPv6 eight lower-case hex groups without
zero compression ("0:0:0:0:0:0:0:1"); with a port: "ip:port" / "[ipv6]:port".
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import lru_cache

from txlog_io.errors import UsageError

_PORT = struct.Struct(">i")
_OFFSET = struct.Struct(">q")
_UNIQ_TAIL = struct.Struct(">hiih")


def java_ipv6_text(ip16: bytes) -> str:
    return ":".join(format(int.from_bytes(ip16[i:i + 2], "big"), "x") for i in range(0, 16, 2))


def ip_text(ip: bytes) -> str:
    if len(ip) == 4:
        return ".".join(str(b) for b in ip)
    return java_ipv6_text(ip)


def host_text(ip: bytes, port: int) -> str:
    return f"{ip_text(ip)}:{port}" if len(ip) == 4 else f"[{ip_text(ip)}]:{port}"


@lru_cache(maxsize=4096)
@lru_cache(maxsize=4096)
def parse_host(text: str) -> tuple:
    """"ip:port" / "[ipv6]:port" (a leading "/" as Java prints it is accepted) -> (ip bytes, port).

    Cached: an encoder asks for the same few born / store hosts on every record (errors are not cached)."""
    t = text[1:] if text.startswith("/") else text
    try:
        if t.startswith("["):
            addr, _, port = t[1:].partition("]:")
        else:
            addr, _, port = t.rpartition(":")
        return ipaddress.ip_address(addr).packed, int(port)
    except ValueError as exc:
        raise UsageError(f"not a host address 'ip:port' or '[ipv6]:port': {text!r}") from exc


def offset_msg_id(store_ip: bytes, store_port: int, physical_offset: int) -> str:
    return (store_ip + _PORT.pack(store_port) + _OFFSET.pack(physical_offset)).hex().upper()


def decode_offset_msg_id(msg_id: str) -> tuple:
    """-> (host text, physical offset).  32 hex chars = IPv4, 56 = IPv6 (decodeMessageId's rule)."""
    if len(msg_id) not in (32, 56):
        raise UsageError(f"offsetMsgId must have 32 or 56 hex chars, got {len(msg_id)}: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    ip_len = 4 if len(raw) == 16 else 16
    port = _PORT.unpack_from(raw, ip_len)[0]
    return host_text(raw[:ip_len], port), _OFFSET.unpack_from(raw, ip_len + 4)[0]


@dataclass(frozen=True)
class UniqKey:
    ip: bytes
    pid: int            # low 16 bits of the producer's pid, signed int16 as Java stores it
    class_loader_hash: int
    ms_since_month_start: int
    counter: int

    @property
    def ip_text(self) -> str:
        return ip_text(self.ip)


_MONTH_CACHE: dict = {}


def month_start_ms(epoch_ms: int, tz=timezone.utc) -> int:
    """Start of the month containing epoch_ms, as MessageClientIDSetter.setStartTime computes it.

    Cached per (time zone, month window): generating millions of ids must not build a datetime per id."""
    window = _MONTH_CACHE.get(tz)
    if window is not None and window[0] <= epoch_ms < window[1]:
        return window[0]
    dt = datetime.fromtimestamp(epoch_ms / 1000.0, tz)
    start = dt.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    nxt = (start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1))
    window = (int(start.timestamp() * 1000), int(nxt.timestamp() * 1000))
    _MONTH_CACHE[tz] = window
    return window[0]


def create_uniq_key(ip: bytes, pid: int, class_loader_hash: int, epoch_ms: int, counter: int,
                    tz=timezone.utc) -> str:
    """createUniqID for a message sent at epoch_ms (time zone of the producer JVM = tz)."""
    ms = epoch_ms - month_start_ms(epoch_ms, tz)
    tail = _UNIQ_TAIL.pack(_s16(pid), _s32(class_loader_hash), _s32(ms), _s16(counter))
    return (ip + tail).hex().upper()


def parse_uniq_key(key: str) -> UniqKey:
    if len(key) not in (32, 56):
        raise UsageError(f"UNIQ_KEY must have 32 or 56 hex chars, got {len(key)}: {key!r}")
    raw = bytes.fromhex(key)
    ip_len = len(raw) - 12
    pid, cl, ms, counter = _UNIQ_TAIL.unpack_from(raw, ip_len)
    return UniqKey(raw[:ip_len], pid, cl, ms, counter)


def _s16(v: int) -> int:
    v &= 0xFFFF
    return v - 0x10000 if v & 0x8000 else v


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v & 0x80000000 else v
