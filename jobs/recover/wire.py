"""A blocking RocketMQ remoting client over one TCP connection per address (txlog_io.remoting frames).

``Remote.call`` sends one request and waits for the response whose ``opaque`` equals the request's (the
server answers every request that is not one-way, ``NettyRemotingAbstract.processRequestCommand``); with
credentials every request is signed as ``AclClientRPCHook`` signs it.  Failures to reach or talk to a server
raise :class:`Unreachable` (one line, naming the address, never a credential).
"""
from __future__ import annotations

import itertools
import socket
import time
from typing import Dict, Optional

from txlog_io import remoting as R

# MQVersion.Version.V4_9_8.ordinal(): at least V4_9_4, so a NameServer answers GET_ROUTEINFO_BY_TOPIC with
# standard JSON (DefaultRequestProcessor / ClientRequestProcessor.getRouteInfoByTopic)
CLIENT_VERSION = 409


class Unreachable(Exception):
    """A server could not be reached, closed the connection, or did not answer in time."""


class Remote:
    def __init__(self, timeout_s: float = 5.0, credentials: Optional[R.Credentials] = None):
        self.timeout_s = timeout_s
        self.credentials = credentials
        self._socks: Dict[str, socket.socket] = {}
        self._opaque = itertools.count(int(time.time()) & 0xFFFF)

    def _connect(self, addr: str) -> socket.socket:
        s = self._socks.get(addr)
        if s is not None:
            return s
        host, _, port = addr.rpartition(":")
        try:
            s = socket.create_connection((host, int(port)), timeout=self.timeout_s)
        except (OSError, ValueError) as e:
            raise Unreachable(f"cannot connect to {addr}: {e.strerror or e}") from None
        s.settimeout(self.timeout_s)
        self._socks[addr] = s
        return s

    def _recv(self, s: socket.socket, n: int, addr: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = s.recv(min(n - len(buf), 1 << 20))
            except socket.timeout:
                raise Unreachable(f"{addr} did not answer within {self.timeout_s:g} s") from None
            except OSError as e:
                raise Unreachable(f"{addr}: {e.strerror or e}") from None
            if not chunk:
                raise Unreachable(f"{addr} closed the connection")
            buf += chunk
        return bytes(buf)

    def call(self, addr: str, code: int, ext: Dict[str, str], body: bytes = b"") -> R.Command:
        cmd = R.Command(code, {k: str(v) for k, v in ext.items() if v is not None}, opaque=next(self._opaque),
                        version=CLIENT_VERSION, body=body)
        if self.credentials is not None:
            R.sign(cmd, self.credentials)
        s = self._connect(addr)
        try:
            s.sendall(R.encode_command(cmd))
        except OSError as e:
            self.close(addr)
            raise Unreachable(f"cannot send to {addr}: {e.strerror or e}") from None
        try:
            while True:
                length = R.frame_length(self._recv(s, 4, addr))
                resp = R.decode_payload(self._recv(s, length, addr))
                if resp.is_response and resp.opaque == cmd.opaque:
                    return resp
        except (Unreachable, R.RemotingFormatError):
            self.close(addr)
            raise

    def close(self, addr: Optional[str] = None) -> None:
        for a in ([addr] if addr else list(self._socks)):
            s = self._socks.pop(a, None)
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass


__all__ = ["Remote", "Unreachable", "CLIENT_VERSION"]
