"""RocketMQ's remoting frame (``RemotingCommand``) with the JSON header, and ACL 1.0 request signing.

Layout (``org.apache.rocketmq.remoting.protocol.RemotingCommand.encode`` / ``decode``, identical in 4.9.8 and
5.3.3; all integers big-endian)::

    int32  length            4 + header length + body length (the frame's size without this field;
                             NettyDecoder is a LengthFieldBasedFrameDecoder(16 MiB, 0, 4, 0, 4))
    int32  serialize+hlen    SerializeType code << 24 | header length (``markProtocolType``;
                             ``getHeaderLength`` = & 0xFFFFFF, ``getProtocolType`` = >> 24):
                             JSON = 0 (``SerializeType.JSON``), ROCKETMQ = 1 (binary, not spoken here)
    bytes  header            JSON = ``RemotingSerializable.encode(this)``: fastjson of the command's getters,
                             names sorted: ``code`` (int), ``extFields`` (string -> string; the custom header's
                             non-null fields by ``makeCustomHeaderToNet``, values ``toString()``), ``flag``,
                             ``language`` (``LanguageCode`` name), ``opaque`` (request id the response
                             repeats), ``remark`` (omitted when null), ``serializeTypeCurrentRPC``, ``version``
                             (``MQVersion.Version`` ordinal of the sender)
    bytes  body              the rest of the frame (absent = empty)

``flag`` bits: bit 0 (``RPC_TYPE``) set = response (``markResponseType``), bit 1 (``RPC_ONEWAY``) set =
one-way request, which the server never answers (``NettyRemotingAbstract.processRequestCommand`` writes a
response only ``if (!cmd.isOnewayRPC())``).

ACL 1.0 (``org.apache.rocketmq.acl.common.AclClientRPCHook.doBeforeRequest`` + ``AclUtils.combineRequestContent``
+ ``AclSigner``): add ``AccessKey`` (and ``SecurityToken`` when given) to ``extFields``; sort every ext field by
name (``TreeMap``: Java ``String.compareTo``, UTF-16 code units), concatenate their values except
``Signature``, UTF-8 encode, append the body; ``Signature`` = Base64(HmacSHA1(secretKey as UTF-8, that)).

Golden frames from RocketMQ's own classes: tests/data/remoting_golden.json (tests/realbroker/GoldenFrames.java).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import struct
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

from txlog_io.errors import TxlogError

# RequestCode / ResponseCode values used here (org.apache.rocketmq.common.protocol.RequestCode in 4.9.8,
# org.apache.rocketmq.remoting.protocol.RequestCode in 5.3.3: the same numbers)
QUERY_MESSAGE = 12
END_TRANSACTION = 37
GET_ROUTEINFO_BY_TOPIC = 105
RESUME_CHECK_HALF_MESSAGE = 323
UPDATE_AND_CREATE_TOPIC = 17

SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
NO_PERMISSION = 16
TOPIC_NOT_EXIST = 17
QUERY_NOT_FOUND = 22

RPC_TYPE_BIT = 1 << 0          # response
RPC_ONEWAY_BIT = 1 << 1        # one-way request
SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
MAX_FRAME = 16 * 1024 * 1024   # NettyDecoder FRAME_MAX_LENGTH default (com.rocketmq.remoting.frameMaxLength)

ACCESS_KEY = "AccessKey"
SECRET_KEY = "SecretKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"

_HEAD = struct.Struct(">ii")


class RemotingFormatError(TxlogError):
    """Bytes that are not a RemotingCommand frame this codec reads (the reason says which field)."""


@dataclass
class Command:
    code: int
    ext_fields: Optional[Dict[str, str]] = None
    opaque: int = 0
    flag: int = 0
    language: str = "PYTHON"
    version: int = 0
    remark: Optional[str] = None
    body: bytes = b""
    extra: Dict[str, object] = field(default_factory=dict)   # other header keys, kept on decode

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RPC_TYPE_BIT)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & RPC_ONEWAY_BIT)

    def header_json(self) -> dict:
        """The header object in fastjson's order (keys sorted; null ``remark`` / ``extFields`` omitted)."""
        h: dict = {"code": self.code}
        if self.ext_fields is not None:
            h["extFields"] = {str(k): str(v) for k, v in self.ext_fields.items()}
        h["flag"] = self.flag
        h["language"] = self.language
        h["opaque"] = self.opaque
        if self.remark is not None:
            h["remark"] = self.remark
        h["serializeTypeCurrentRPC"] = "JSON"
        h["version"] = self.version
        return h


def encode_command(cmd: Command) -> bytes:
    """The whole frame (with its leading length field), JSON header."""
    header = json.dumps(cmd.header_json(), separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(header) > 0xFFFFFF:
        raise RemotingFormatError(f"header of {len(header)} bytes does not fit 24 bits")
    body = cmd.body or b""
    length = 4 + len(header) + len(body)
    if length > MAX_FRAME:
        raise RemotingFormatError(f"frame of {length} bytes exceeds the {MAX_FRAME}-byte frame limit")
    return _HEAD.pack(length, (SERIALIZE_JSON << 24) | len(header)) + header + body


_UNQUOTED_INT_KEY = re.compile(r'([{,])(-?\d+):')


def loads_fastjson(text: str):
    """``json.loads``, also for fastjson's default output of ``Map<Long|Integer, ...>`` (unquoted numeric keys,
    e.g. ``TopicRouteData.brokerAddrs`` from a NameServer that does not write standard JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_UNQUOTED_INT_KEY.sub(r'\1"\2":', text))


def frame_length(prefix: bytes) -> int:
    """The length field of a frame (bytes that follow it); checks it against the frame limit."""
    if len(prefix) < 4:
        raise RemotingFormatError(f"frame length field: {len(prefix)} of 4 bytes")
    (length,) = struct.unpack(">i", prefix[:4])
    if length < 4 or length > MAX_FRAME:
        raise RemotingFormatError(f"frame length {length} outside 4..{MAX_FRAME}")
    return length


def decode_command(frame: bytes) -> Command:
    """A whole frame (with its leading length field) -> Command."""
    length = frame_length(frame)
    if len(frame) != 4 + length:
        raise RemotingFormatError(f"frame length field says {length} bytes follow, {len(frame) - 4} do")
    return decode_payload(frame[4:])


def decode_payload(payload: bytes) -> Command:
    """The frame without its length field (what NettyDecoder hands to ``RemotingCommand.decode``)."""
    if len(payload) < 4:
        raise RemotingFormatError(f"header length field: {len(payload)} of 4 bytes")
    (ori,) = struct.unpack(">i", payload[:4])
    kind, hlen = (ori >> 24) & 0xFF, ori & 0xFFFFFF
    if hlen > len(payload) - 4:
        raise RemotingFormatError(f"header length {hlen} exceeds the {len(payload) - 4} bytes after it")
    if kind != SERIALIZE_JSON:
        raise RemotingFormatError(f"serialize type {kind} (only JSON = 0 is read; ROCKETMQ = 1 is binary)")
    try:
        h = json.loads(payload[4:4 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise RemotingFormatError(f"JSON header does not parse: {e}") from None
    if not isinstance(h, dict) or not isinstance(h.get("code"), int):
        raise RemotingFormatError("JSON header without an integer 'code'")
    ext = h.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise RemotingFormatError("JSON header 'extFields' is not an object")
    known = {"code", "extFields", "flag", "language", "opaque", "remark", "serializeTypeCurrentRPC", "version"}
    return Command(code=h["code"], ext_fields=None if ext is None else {str(k): str(v) for k, v in ext.items()},
                   opaque=int(h.get("opaque", 0)), flag=int(h.get("flag", 0)),
                   language=str(h.get("language", "JAVA")), version=int(h.get("version", 0)),
                   remark=h.get("remark"), body=bytes(payload[4 + hlen:]),
                   extra={k: v for k, v in h.items() if k not in known})


# ---- ACL 1.0 ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Credentials:
    """AccessKey / SecretKey (/ SecurityToken) of ``SessionCredentials``; ``repr`` never shows the secret."""
    access_key: str
    secret_key: str = field(repr=False)
    security_token: Optional[str] = field(default=None, repr=False)


def _java_order(key: str):
    """Java ``String.compareTo`` order: UTF-16 code units."""
    return key.encode("utf-16-be")


def signature_content(ext_fields: Mapping[str, str], body: Optional[bytes]) -> bytes:
    """``AclUtils.combineRequestContent``: values sorted by field name (``Signature`` left out), then body."""
    values = "".join(str(ext_fields[k]) for k in sorted(ext_fields, key=_java_order) if k != SIGNATURE)
    return values.encode("utf-8") + (body or b"")


def calc_signature(data: bytes, secret_key: str) -> str:
    """``AclSigner.calSignature``: Base64(HmacSHA1(key = secretKey UTF-8, data))."""
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), data, hashlib.sha1).digest()).decode("ascii")


def sign(cmd: Command, creds: Credentials) -> Command:
    """``AclClientRPCHook.doBeforeRequest`` on ``cmd`` (its ext fields get AccessKey, SecurityToken, Signature)."""
    ext = dict(cmd.ext_fields or {})
    ext[ACCESS_KEY] = creds.access_key
    if creds.security_token is not None:
        ext[SECURITY_TOKEN] = creds.security_token
    ext[SIGNATURE] = calc_signature(signature_content(ext, cmd.body), creds.secret_key)
    cmd.ext_fields = ext
    return cmd


__all__ = ["Command", "Credentials", "RemotingFormatError", "encode_command", "decode_command", "decode_payload",
           "frame_length", "sign", "signature_content", "calc_signature", "loads_fastjson"]
