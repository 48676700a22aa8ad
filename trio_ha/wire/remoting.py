"""RocketMQ's remoting protocol: frames, the two header encodings, and the core custom headers.

Every broker and name server request and response is one frame (docs/remoting.md, 'Frame')::

    total length L:4 | serialize type:1, header length H:3 | header:H | body:L-4-H

where L counts everything after itself. The header is either fastjson JSON (serialize type 0,
what every client sends by default) or RocketMQ's binary layout (type 1; docs/remoting.md,
'Header fields', has both). Both carry the same fields: ``code`` (request code in requests,
response code in responses), ``language``, ``version``, ``opaque`` (the request id a response
echoes), ``flag`` (bit 0 response, bit 1 oneway), ``remark`` and ``extFields``, a string map
holding the request's custom header.

Why this module is more than ``json.loads``:

- The peer is untrusted. ``FrameDecoder`` checks the declared lengths as soon as it has read
  them, before it buffers the frame (a length of 0x7FFFFFFF fails after 4 bytes, not after
  2 GiB), checks header fields and their types, and raises ``RemotingDecodeError`` and nothing
  else. After an error the decoder stays broken: the connection must close.
- Real clients are sloppy in one way Java tolerates: extFields values arrive as JSON numbers and
  booleans, not only strings (fastjson coerces them). We coerce them the way Java renders them
  (``7`` -> ``"7"``, ``true`` -> ``"true"``, ``1.50`` -> ``"1.50"``) and drop nulls, so the
  processors only ever see strings.
- Custom header fields are parsed with Java's rules (``Integer.parseInt``, ``Long.parseLong``,
  ``Boolean.parseBoolean``); a missing or malformed field raises ``HeaderFieldError`` naming
  it, which the broker turns into an error response rather than a closed connection.
- Sends are the hot path (tens of thousands a second), so encoding builds the JSON header with
  one string format and the frame with one join; ``encode_head`` lets a pump send a large body
  (a pull response made of mapped commitlog slices) without copying it at all.

Like ``ha.py`` this is sans-I/O in the h11 style: ``receive_data(bytes)``, then
``next_command()`` until it returns ``NEED_DATA``.
"""

from __future__ import annotations

import enum
import json
import struct
from collections.abc import Iterable, Mapping
from decimal import Decimal
from json.encoder import encode_basestring as _quote  # JSON string, non-ASCII kept
from typing import Any, TypeVar

import attrs

from .errors import HeaderFieldError, RemotingDecodeError
from .ha import NEED_DATA, _NeedData

__all__ = [
    "DEFAULT_VERSION",
    "MAX_EXT_FIELDS",
    "MAX_EXT_KEY_LENGTH",
    "MAX_EXT_VALUE_LENGTH",
    "MAX_FRAME_LENGTH",
    "MAX_HEADER_LENGTH",
    "NEED_DATA",
    "FieldKind",
    "FrameDecoder",
    "HeaderField",
    "HeaderFieldError",
    "LanguageCode",
    "PullMessageRequestHeader",
    "PullSysFlag",
    "RemotingCommand",
    "RemotingDecodeError",
    "RemotingFlag",
    "RequestCode",
    "ResponseCode",
    "SendMessageRequestHeader",
    "SerializeType",
    "decode_custom_header",
    "decode_frame",
    "encode",
    "encode_custom_header",
    "encode_head",
    "encode_pull_message_fields",
    "encode_send_message_fields",
    "encode_send_message_v2_fields",
    "java_string",
    "pull_message_header",
    "send_message_header",
]

# ---- constants ----------------------------------------------------------------------------

#: ``com.rocketmq.remoting.frameMaxLength``: Netty's frame limit, which counts the 4-byte
#: length field too, so the largest total length L is this minus 4.
MAX_FRAME_LENGTH = 16 * 1024 * 1024
#: our limit on a header (Java has none beyond the frame); 1 MiB is far above any real header
MAX_HEADER_LENGTH = 1024 * 1024
#: limits on extFields: entries per header, key length, value length (UTF-8 bytes for the binary
#: header, characters for JSON). Values carry message properties (at most 32767 bytes in the
#: store), so the value limit leaves room for the broker to answer MESSAGE_ILLEGAL itself.
MAX_EXT_FIELDS = 1024
MAX_EXT_KEY_LENGTH = 1024
MAX_EXT_VALUE_LENGTH = 256 * 1024

#: MQVersion ordinal we announce: V4_9_8 (4.9.4 is 401, 5.3.3 is 479)
DEFAULT_VERSION = 409

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_FRAME_HEAD = struct.Struct(">iI")  # total length, serialize type << 24 | header length
_LENGTH = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark length
_KEY_LEN = struct.Struct(">h")
_VAL_LEN = struct.Struct(">i")
_BIN_MIN_HEADER = _BIN_FIXED.size + 4  # 21: fixed part, remark length, extFields length


class RequestCode(enum.IntEnum):
    """Request codes (the 9xx/10xx ones are 5.x; docs/remoting.md, 'Request codes', says which
    ones we serve)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_TOPIC_CONFIG_LIST = 22
    GET_TOPIC_NAME_LIST = 23
    UPDATE_BROKER_CONFIG = 25
    GET_BROKER_CONFIG = 26
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    GET_CONSUMER_LIST_BY_GROUP = 38
    CHECK_TRANSACTION_STATE = 39
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    CHECK_CLIENT_CONFIG = 46
    PUT_KV_CONFIG = 100
    GET_KV_CONFIG = 101
    DELETE_KV_CONFIG = 102
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    WIPE_WRITE_PERM_OF_BROKER = 205
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    QUERY_DATA_VERSION = 322
    SEND_REPLY_MESSAGE = 324
    SEND_REPLY_MESSAGE_V2 = 325
    ADD_WRITE_PERM_OF_BROKER = 327
    BROKER_HEARTBEAT = 904
    CONTROLLER_ALTER_SYNC_STATE_SET = 1001
    CONTROLLER_ELECT_MASTER = 1002
    CONTROLLER_REGISTER_BROKER = 1003
    CONTROLLER_GET_REPLICA_INFO = 1004
    CONTROLLER_GET_METADATA_INFO = 1005
    CONTROLLER_GET_SYNC_STATE_DATA = 1006
    GET_BROKER_EPOCH_CACHE = 1007
    NOTIFY_BROKER_ROLE_CHANGED = 1008
    CONTROLLER_GET_NEXT_BROKER_ID = 1012
    CONTROLLER_APPLY_BROKER_ID = 1013


class ResponseCode(enum.IntEnum):
    """Response codes (docs/remoting.md, 'Response codes')."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    FILTER_DATA_NOT_EXIST = 27
    FILTER_DATA_NOT_LATEST = 28
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    CONSUMER_NOT_ONLINE = 206
    CONSUME_MSG_TIMEOUT = 207
    NO_MESSAGE = 208
    FLOW_CONTROL = 215


class RemotingFlag(enum.IntFlag):
    """The ``flag`` bits of a command (RemotingCommand's RPC_TYPE and RPC_ONEWAY bits). An
    ``IntFlag``, so a member is the int Java sends (``%d`` and JSON print the number); a
    decoded command's ``flag`` stays a plain int, as ``code`` does."""

    #: set on responses, clear on requests (RPC_TYPE)
    RESPONSE = 0x1
    #: a request that wants no response (RPC_ONEWAY)
    ONEWAY = 0x2


# The bits as plain ints for the per-command tests: ``int & IntFlag`` builds a new flag member
# (about a microsecond), ``int & int`` does not.
_RESPONSE_BIT = RemotingFlag.RESPONSE.value
_ONEWAY_BIT = RemotingFlag.ONEWAY.value


class LanguageCode(enum.IntEnum):
    """The sender's language: its name in JSON headers, this value in binary ones."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12


class SerializeType(enum.IntEnum):
    """The high byte of the header-length word."""

    JSON = 0
    ROCKETMQ = 1


class PullSysFlag(enum.IntFlag):
    """``sysFlag`` bits of PULL_MESSAGE."""

    COMMIT_OFFSET = 0x1
    SUSPEND = 0x2
    SUBSCRIPTION = 0x4
    CLASS_FILTER = 0x8
    LITE_PULL_MESSAGE = 0x10


_LANGUAGE_BY_NAME = {member.name: member for member in LanguageCode}
_LANGUAGE_BY_CODE = {member.value: member for member in LanguageCode}
_LANGUAGE_NAMES = {member.value: member.name for member in LanguageCode}
_SERIALIZE_TYPES = {member.value: member for member in SerializeType}


# ---- Java renderings of values ---------------------------------------------------------------


def java_string(value: object) -> str:
    """A header value as Java writes it into extFields: ints in decimal, booleans
    ``true``/``false``, strings unchanged."""
    if type(value) is str:
        return value  # type: ignore[return-value]
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, Decimal):
        return _decimal_text(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise TypeError(f"extFields values must be str, int or bool, not {type(value).__name__}")


def _decimal_text(value: Decimal) -> str:
    # fastjson parses JSON fractions as BigDecimal; BigDecimal.toString and Decimal.__str__
    # follow the same scientific-notation rules ("1.50", "1E+3"); BigDecimal has no -0.
    if value.is_zero():
        value = value.copy_abs()
    return str(value)


def _parse_java_integer(text: str, lo: int, hi: int) -> int | None:
    """``Integer.parseInt`` / ``Long.parseLong``: an optional sign and ASCII digits, in range.
    Python's ``int()`` would also take spaces, underscores and non-ASCII digits."""
    if 0 < len(text) <= 20 and text.isascii():
        digits = text[1:] if text[0] in "+-" else text
        if digits.isdigit():
            value = int(text)
            if lo <= value <= hi:
                return value
    return None


def _short(text: str) -> str:
    return text if len(text) <= 64 else text[:61] + "..."


# ---- the command ------------------------------------------------------------------------------


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


_MISSING: Any = _Missing()
_T = TypeVar("_T")


def _body_repr(body: bytes) -> str:
    return f"<{len(body)} bytes>"


@attrs.frozen
class RemotingCommand:
    """One request or response. ``ext_fields`` maps names to strings (see ``java_string``);
    ``body`` is raw bytes. ``code`` is a plain int on decode (compare with ``RequestCode`` /
    ``ResponseCode`` members, which are ints)."""

    code: int
    language: LanguageCode = LanguageCode.JAVA
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] = attrs.field(factory=dict)
    body: bytes = attrs.field(default=b"", repr=_body_repr)
    serialize_type: SerializeType = SerializeType.JSON

    @property
    def is_response(self) -> bool:
        return bool(self.flag & _RESPONSE_BIT)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & _ONEWAY_BIT)

    # -- construction

    @classmethod
    def request(
        cls,
        code: int,
        ext_fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        opaque: int = 0,
        oneway: bool = False,
        remark: str | None = None,
        language: LanguageCode = LanguageCode.JAVA,
        version: int = DEFAULT_VERSION,
        serialize_type: SerializeType = SerializeType.JSON,
    ) -> RemotingCommand:
        """A request. Field values may be ints or booleans (rendered as Java does); None values
        are left out. The connection assigns ``opaque`` (``attrs.evolve`` it if needed)."""
        return cls(
            code=code,
            language=language,
            version=version,
            opaque=opaque,
            flag=RemotingFlag.ONEWAY if oneway else 0,
            remark=remark,
            ext_fields=_string_fields(ext_fields),
            body=bytes(body),
            serialize_type=serialize_type,
        )

    @classmethod
    def response_to(
        cls,
        request: RemotingCommand,
        code: int,
        remark: str | None = None,
        ext_fields: Mapping[str, object] | None = None,
        body: bytes = b"",
        *,
        serialize_type: SerializeType | None = None,
        language: LanguageCode = LanguageCode.JAVA,
        version: int = DEFAULT_VERSION,
    ) -> RemotingCommand:
        """The response to ``request``: echoes its opaque, sets the response bit and uses its
        serialize type (pass ``serialize_type`` for the remoting layer's own errors, which Java
        sends in the server's default type)."""
        return cls(
            code=code,
            language=language,
            version=version,
            opaque=request.opaque,
            flag=RemotingFlag.RESPONSE,
            remark=remark,
            ext_fields=_string_fields(ext_fields),
            body=bytes(body),
            serialize_type=request.serialize_type if serialize_type is None else serialize_type,
        )

    # -- typed access to custom header fields

    def field_str(self, name: str, default: _T = _MISSING) -> str | _T:
        value = self.ext_fields.get(name)
        if value is None:
            return _missing(name, default)
        return value

    def field_int(self, name: str, default: _T = _MISSING) -> int | _T:
        """A Java ``int`` field (``Integer.parseInt``)."""
        return self._integer(name, default, _INT32_MIN, _INT32_MAX, "an int")

    def field_long(self, name: str, default: _T = _MISSING) -> int | _T:
        """A Java ``long`` field (``Long.parseLong``)."""
        return self._integer(name, default, _INT64_MIN, _INT64_MAX, "a long")

    def field_bool(self, name: str, default: _T = _MISSING) -> bool | _T:
        """A boolean field, parsed as Java's ``Boolean.parseBoolean``: ``true`` in any case is
        True and anything else is False (never an error once present)."""
        value = self.ext_fields.get(name)
        if value is None:
            return _missing(name, default)
        return value.lower() == "true"

    def _integer(self, name: str, default: Any, lo: int, hi: int, what: str) -> Any:
        text = self.ext_fields.get(name)
        if text is None:
            return _missing(name, default)
        value = _parse_java_integer(text, lo, hi)
        if value is None:
            raise HeaderFieldError(
                name, f"the custom field <{name}> is not {what}: {_short(text)!r}"
            )
        return value


def _missing(name: str, default: Any) -> Any:
    if default is _MISSING:
        raise HeaderFieldError(name, f"the custom field <{name}> is null")
    return default


def _string_fields(fields: Mapping[str, object] | None) -> dict[str, str]:
    if not fields:
        return {}
    return {str(k): java_string(v) for k, v in fields.items() if v is not None}


# ---- encoding ----------------------------------------------------------------------------------

# fastjson writes bean fields alphabetically and omits nulls; a HashMap (extFields) in its
# iteration order, so we keep insertion order. Decoding never depends on order.
_JSON_HEADER = (
    '{"code":%d%s,"flag":%d,"language":"%s","opaque":%d%s,'
    '"serializeTypeCurrentRPC":"JSON","version":%d}'
)


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # lone surrogates: Java's getBytes writes '?'
        return text.encode("utf-8", "replace")


def _json_header(command: RemotingCommand) -> bytes:
    ext = command.ext_fields
    remark = command.remark
    return _utf8(
        _JSON_HEADER
        % (
            command.code,
            ',"extFields":{%s}' % ",".join([f"{_quote(k)}:{_quote(v)}" for k, v in ext.items()])
            if ext
            else "",
            command.flag,
            _LANGUAGE_NAMES[command.language],
            command.opaque,
            ',"remark":' + _quote(remark) if remark is not None else "",
            command.version,
        )
    )


def _binary_header(command: RemotingCommand) -> bytes:
    remark = _utf8(command.remark) if command.remark else b""
    parts = [b"", remark, b""]
    ext_len = 0
    for key, value in command.ext_fields.items():
        if key is None or value is None:
            continue
        k = _utf8(key)
        v = _utf8(value)
        if len(k) > 0x7FFF:
            raise ValueError(f"extFields key of {len(k)} bytes does not fit a short")
        parts += (_KEY_LEN.pack(len(k)), k, _VAL_LEN.pack(len(v)), v)
        ext_len += 6 + len(k) + len(v)
    try:
        parts[0] = _BIN_FIXED.pack(
            command.code,
            int(command.language),
            command.version,
            command.opaque,
            command.flag,
            len(remark),
        )
    except struct.error as exc:
        raise ValueError(f"a header field does not fit the ROCKETMQ binary header: {exc}") from None
    parts[2] = _LENGTH.pack(ext_len)
    return b"".join(parts)


def encode_head(command: RemotingCommand, body_length: int | None = None) -> bytes:
    """The frame up to the body: length words and header. The caller sends ``body_length``
    bytes of body next (default: ``len(command.body)``), e.g. straight from mapped segments."""
    if command.serialize_type == SerializeType.ROCKETMQ:
        header = _binary_header(command)
        stype = 1
    else:
        header = _json_header(command)
        stype = 0
    if body_length is None:
        body_length = len(command.body)
    total = 4 + len(header) + body_length
    if len(header) > 0xFFFFFF or total + 4 > MAX_FRAME_LENGTH:
        raise ValueError(
            f"frame of {total + 4} bytes (header {len(header)}) exceeds the remoting limits"
        )
    return _FRAME_HEAD.pack(total, (stype << 24) | len(header)) + header


def encode(command: RemotingCommand) -> bytes:
    """The whole frame, as one bytes object (one copy of the body)."""
    body = command.body
    if not body:
        return encode_head(command, 0)
    return b"".join((encode_head(command, len(body)), body))


# ---- decoding ----------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise RemotingDecodeError(f"JSON header contains {name}, which is not JSON")


_JSON_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)


def _json_int(obj: dict, key: str, default: int) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not int:
        raise RemotingDecodeError(
            f"JSON header field {key!r} must be an integer, got {type(value).__name__}"
        )
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise RemotingDecodeError(f"JSON header field {key!r} is out of range: {value}")
    return value


def _normalise_ext(raw: object, header_length: int) -> dict[str, str]:
    if raw is None:
        return {}
    if type(raw) is not dict:
        raise RemotingDecodeError(f"extFields must be an object, got {type(raw).__name__}")
    if not raw:
        return raw
    if len(raw) > MAX_EXT_FIELDS:
        raise RemotingDecodeError(f"{len(raw)} extFields exceed the limit of {MAX_EXT_FIELDS}")
    if header_length > MAX_EXT_KEY_LENGTH and max(map(len, raw)) > MAX_EXT_KEY_LENGTH:
        raise RemotingDecodeError(f"an extFields key exceeds {MAX_EXT_KEY_LENGTH} characters")
    if set(map(type, raw.values())) == _ONLY_STR:
        # the common case, checked at C speed; a value cannot be longer than its header
        if header_length > MAX_EXT_VALUE_LENGTH:
            _check_value_lengths(raw)
        return raw
    fields: dict[str, str] = {}
    for key, value in raw.items():
        t = type(value)
        if t is str:
            pass
        elif value is None:
            continue  # fastjson keeps the null; every reader treats it as absent
        elif t is bool:
            value = "true" if value else "false"
        elif t is int:
            value = int.__repr__(value)
        elif t is Decimal:
            value = _decimal_text(value)
        else:
            raise RemotingDecodeError(
                f"extFields value of {_short(key)!r} must be a string, number or boolean, "
                f"got {'an object' if t is dict else 'an array'}"
            )
        fields[key] = value
    if header_length > MAX_EXT_VALUE_LENGTH:
        _check_value_lengths(fields)
    return fields


_ONLY_STR = {str}


def _check_value_lengths(fields: dict[str, str]) -> None:
    for key, value in fields.items():
        if len(value) > MAX_EXT_VALUE_LENGTH:
            raise RemotingDecodeError(
                f"extFields value of {_short(key)!r} has {len(value)} characters, over the "
                f"limit of {MAX_EXT_VALUE_LENGTH}"
            )


def _decode_json_header(header: bytes) -> tuple:
    # Java decodes the header bytes with replacement of malformed UTF-8; so do we.
    text = header.decode("utf-8", "replace")
    try:
        obj = _JSON_DECODER.decode(text)
    except RemotingDecodeError:
        raise
    except (ValueError, RecursionError, ArithmeticError) as exc:
        raise RemotingDecodeError(f"JSON header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise RemotingDecodeError(f"JSON header must be an object, got {type(obj).__name__}")
    if "code" not in obj:
        raise RemotingDecodeError("JSON header has no code")
    code = _json_int(obj, "code", 0)
    language_raw = obj.get("language")
    if language_raw is None:
        language = LanguageCode.JAVA
    elif type(language_raw) is str:
        # fastjson turns an unknown enum name into null; Java then answers as usual
        language = _LANGUAGE_BY_NAME.get(language_raw, LanguageCode.OTHER)
    elif type(language_raw) is int:
        language = _LANGUAGE_BY_CODE.get(language_raw, LanguageCode.OTHER)
    else:
        raise RemotingDecodeError(
            f"JSON header field 'language' must be a string, got {type(language_raw).__name__}"
        )
    remark = obj.get("remark")
    if remark is not None and type(remark) is not str:
        raise RemotingDecodeError(
            f"JSON header field 'remark' must be a string, got {type(remark).__name__}"
        )
    return (
        code,
        language,
        _json_int(obj, "version", 0),
        _json_int(obj, "opaque", 0),
        _json_int(obj, "flag", 0),
        remark,
        _normalise_ext(obj.get("extFields"), len(header)),
    )


def _decode_binary_header(buf: bytes | bytearray, start: int, end: int) -> tuple:
    if end - start < _BIN_MIN_HEADER:
        raise RemotingDecodeError(
            f"ROCKETMQ header of {end - start} bytes is shorter than {_BIN_MIN_HEADER}"
        )
    code, language_code, version, opaque, flag, remark_len = _BIN_FIXED.unpack_from(buf, start)
    pos = start + _BIN_FIXED.size
    if remark_len < 0 or remark_len > end - pos - 4:
        raise RemotingDecodeError(f"remark length {remark_len} does not fit the header")
    remark = None
    if remark_len:
        remark = bytes(buf[pos : pos + remark_len]).decode("utf-8", "replace")
        pos += remark_len
    (ext_len,) = _LENGTH.unpack_from(buf, pos)
    pos += 4
    if ext_len < 0 or ext_len != end - pos:
        raise RemotingDecodeError(
            f"extFields length {ext_len} does not match the {end - pos} bytes left in the header"
        )
    fields: dict[str, str] = {}
    while pos < end:
        if len(fields) >= MAX_EXT_FIELDS:
            raise RemotingDecodeError(f"more than {MAX_EXT_FIELDS} extFields")
        if end - pos < 2:
            raise RemotingDecodeError("extFields entry truncated in its key length")
        (key_len,) = _KEY_LEN.unpack_from(buf, pos)
        pos += 2
        if key_len < 0 or key_len > MAX_EXT_KEY_LENGTH or key_len > end - pos - 4:
            raise RemotingDecodeError(f"extFields key length {key_len} is out of range")
        key = bytes(buf[pos : pos + key_len]).decode("utf-8", "replace")
        pos += key_len
        (value_len,) = _VAL_LEN.unpack_from(buf, pos)
        pos += 4
        if value_len < 0 or value_len > MAX_EXT_VALUE_LENGTH or value_len > end - pos:
            raise RemotingDecodeError(f"extFields value length {value_len} is out of range")
        fields[key] = bytes(buf[pos : pos + value_len]).decode("utf-8", "replace")
        pos += value_len
    return (
        code,
        _LANGUAGE_BY_CODE.get(language_code, LanguageCode.OTHER),
        version,
        opaque,
        flag,
        remark,
        fields,
    )


@attrs.define
class FrameDecoder:
    """Decodes a stream of frames. Feed it with ``receive_data``; call ``next_command`` until
    it returns ``NEED_DATA``. Raises ``RemotingDecodeError``; after that every call raises
    again (the stream has lost its framing: close the connection)."""

    max_frame_length: int = MAX_FRAME_LENGTH
    max_header_length: int = MAX_HEADER_LENGTH
    _buffer: bytearray = attrs.field(factory=bytearray)
    _pos: int = 0  # start of the unconsumed bytes in _buffer
    _error: RemotingDecodeError | None = None

    #: consumed bytes are dropped from the front of the buffer once there are at least this
    #: many and they are at least half of it: amortised O(1) per byte, never O(n^2)
    COMPACT_AT = 64 * 1024

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as commands."""
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._error is not None:
            raise self._broken()
        self._buffer += data

    def next_command(self) -> RemotingCommand | _NeedData:
        if self._error is not None:
            raise self._broken()
        try:
            return self._next()
        except RemotingDecodeError as exc:
            self._error = exc
            self._buffer = bytearray()
            self._pos = 0
            raise

    def _broken(self) -> RemotingDecodeError:
        return RemotingDecodeError(f"the frame decoder failed earlier: {self._error}")

    def _next(self) -> RemotingCommand | _NeedData:
        buf = self._buffer
        pos = self._pos
        available = len(buf) - pos
        if available < 4:
            return NEED_DATA
        (total,) = _LENGTH.unpack_from(buf, pos)
        # Netty's limit counts the length field: L + 4 <= max
        if total <= 4 or total > self.max_frame_length - 4:
            raise RemotingDecodeError(
                f"frame length {total} is out of range (5..{self.max_frame_length - 4})"
            )
        if available < 8:
            return NEED_DATA
        (word,) = _LENGTH.unpack_from(buf, pos + 4)
        stype = (word >> 24) & 0xFF
        header_len = word & 0xFFFFFF
        serialize_type = _SERIALIZE_TYPES.get(stype)
        if serialize_type is None:
            raise RemotingDecodeError(f"unknown serialize type {stype}")
        if header_len == 0 or header_len > total - 4:
            raise RemotingDecodeError(
                f"header length {header_len} does not fit a frame of length {total}"
            )
        if header_len > self.max_header_length:
            raise RemotingDecodeError(
                f"header length {header_len} exceeds the limit of {self.max_header_length}"
            )
        end = pos + 4 + total
        if len(buf) < end:
            return NEED_DATA
        header_start = pos + 8
        body_start = header_start + header_len
        if serialize_type is SerializeType.JSON:
            with memoryview(buf) as view:
                header = bytes(view[header_start:body_start])
            fields = _decode_json_header(header)
        else:
            fields = _decode_binary_header(buf, header_start, body_start)
        if body_start < end:
            with memoryview(buf) as view:
                body = bytes(view[body_start:end])
        else:
            body = b""
        # consume the frame
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end >= self.COMPACT_AT and end * 2 >= len(buf):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        code, language, version, opaque, flag, remark, ext = fields
        return RemotingCommand(
            code, language, version, opaque, flag, remark, ext, body, serialize_type
        )


def decode_frame(frame: bytes | bytearray | memoryview) -> RemotingCommand:
    """Decode exactly one complete frame (with its leading length)."""
    decoder = FrameDecoder()
    decoder.receive_data(frame)
    command = decoder.next_command()
    if command is NEED_DATA:
        raise RemotingDecodeError(f"incomplete frame ({len(frame)} bytes)")
    if decoder.buffered:
        raise RemotingDecodeError(f"{decoder.buffered} bytes after the frame")
    return command  # type: ignore[return-value]


# ---- custom headers ----------------------------------------------------------------------------


class FieldKind(enum.Enum):
    """How a custom header field is parsed: Java String, int, long or boolean."""

    STR = "str"
    INT = "int"
    LONG = "long"
    BOOL = "bool"


@attrs.frozen
class HeaderField:
    """One field of a custom header: the Python attribute, the extFields name, its Java type,
    and whether Java marks it @CFNotNull. Optional fields missing from the request take the
    attribute's default."""

    attr: str
    name: str
    kind: FieldKind = FieldKind.STR
    required: bool = True


_H = TypeVar("_H")


def decode_custom_header(
    command: RemotingCommand, cls: type[_H], fields: Iterable[HeaderField]
) -> _H:
    """Build ``cls`` from ``command``'s extFields, as Java's ``decodeCommandCustomHeader``:
    a required field that is missing raises ``HeaderFieldError`` ("the custom field <x> is
    null"), and so does a number Java could not parse."""
    return _decode_planned(command, cls, _plan(fields))


def _decode_planned(command: RemotingCommand, cls: Any, plan: tuple) -> Any:
    ext = command.ext_fields
    kwargs: dict[str, Any] = {}
    for attr, name, kind, required, field in plan:
        text = ext.get(name)
        if text is None:
            if required:
                raise HeaderFieldError(name, _null_message(field))
            continue
        if kind == 0:  # str
            kwargs[attr] = text
        elif kind == 3:  # bool
            kwargs[attr] = text == "true" or text.lower() == "true"
        # int / long: plain digits that cannot overflow are the common case
        elif text.isdigit() and len(text) < (10 if kind == 1 else 19) and text.isascii():
            kwargs[attr] = int(text)
        else:
            if kind == 1:
                value = _parse_java_integer(text, _INT32_MIN, _INT32_MAX)
            else:
                value = _parse_java_integer(text, _INT64_MIN, _INT64_MAX)
            if value is None:
                raise HeaderFieldError(
                    name,
                    f"the custom field <{name}>{_alias(field)} is not "
                    f"{'an int' if kind == 1 else 'a long'}: {_short(text)!r}",
                )
            kwargs[attr] = value
    return cls(**kwargs)


_KIND_CODES = {"str": 0, "int": 1, "long": 2, "bool": 3}
_PLANS: dict[int, tuple] = {}  # id(fields tuple) -> (the tuple, its plan)


def _plan(fields: Iterable[HeaderField]) -> tuple:
    cached = _PLANS.get(id(fields))
    if cached is not None and cached[0] is fields:
        return cached[1]
    plan = tuple((f.attr, f.name, _KIND_CODES[f.kind.value], f.required, f) for f in fields)
    if isinstance(fields, tuple) and len(_PLANS) < 256:
        _PLANS[id(fields)] = (fields, plan)  # holding the tuple keeps its id unique
    return plan


def _alias(field: HeaderField) -> str:
    long_name = _V2_LONG_NAMES.get(field.name)
    return f" ({long_name})" if long_name else ""


def _null_message(field: HeaderField) -> str:
    return f"the custom field <{field.name}>{_alias(field)} is null"


def encode_custom_header(header: object, fields: Iterable[HeaderField]) -> dict[str, str]:
    """extFields for ``header`` as Java's ``makeCustomHeaderToNet`` writes them: every
    non-null field, rendered as a string."""
    result: dict[str, str] = {}
    for field in fields:
        value = getattr(header, field.attr)
        if value is not None:
            result[field.name] = java_string(value)
    return result


@attrs.frozen
class SendMessageRequestHeader:
    """The header of SEND_MESSAGE (long names), SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE
    (single letters ``a``..``n``), and SEND_REPLY_MESSAGE(_V2)."""

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str | None = None
    reconsume_times: int | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None
    batch: bool = False
    broker_name: str | None = None


_S, _I32, _I64, _B = FieldKind.STR, FieldKind.INT, FieldKind.LONG, FieldKind.BOOL

# (attribute, V1 name, V2 letter, kind, required)
_SEND_SPEC = (
    ("producer_group", "producerGroup", "a", _S, True),
    ("topic", "topic", "b", _S, True),
    ("default_topic", "defaultTopic", "c", _S, True),
    ("default_topic_queue_nums", "defaultTopicQueueNums", "d", _I32, True),
    ("queue_id", "queueId", "e", _I32, True),
    ("sys_flag", "sysFlag", "f", _I32, True),
    ("born_timestamp", "bornTimestamp", "g", _I64, True),
    ("flag", "flag", "h", _I32, True),
    ("properties", "properties", "i", _S, False),
    ("reconsume_times", "reconsumeTimes", "j", _I32, False),
    ("unit_mode", "unitMode", "k", _B, False),
    ("max_reconsume_times", "maxReconsumeTimes", "l", _I32, False),
    ("batch", "batch", "m", _B, False),
    ("broker_name", "bname", "n", _S, False),
)
SEND_MESSAGE_FIELDS = tuple(HeaderField(a, v1, k, r) for a, v1, _, k, r in _SEND_SPEC)
SEND_MESSAGE_V2_FIELDS = tuple(HeaderField(a, v2, k, r) for a, _, v2, k, r in _SEND_SPEC)
_V2_LONG_NAMES = {v2: v1 for _, v1, v2, _, _ in _SEND_SPEC}
_V2_CODES = frozenset(
    (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE, RequestCode.SEND_REPLY_MESSAGE_V2)
)
_V1_CODES = frozenset((RequestCode.SEND_MESSAGE, RequestCode.SEND_REPLY_MESSAGE))
_SEND_V1_PLAN = _plan(SEND_MESSAGE_FIELDS)
_SEND_V2_PLAN = _plan(SEND_MESSAGE_V2_FIELDS)


def send_message_header(command: RemotingCommand) -> SendMessageRequestHeader:
    """The send header of a SEND_MESSAGE / _V2 / SEND_BATCH_MESSAGE / SEND_REPLY_MESSAGE(_V2)
    request, with the letters of the V2 forms mapped to their long names (as the Java broker
    does, the request code decides which names are read)."""
    if command.code in _V2_CODES:
        return _decode_planned(command, SendMessageRequestHeader, _SEND_V2_PLAN)
    if command.code in _V1_CODES:
        return _decode_planned(command, SendMessageRequestHeader, _SEND_V1_PLAN)
    raise ValueError(f"request code {command.code} is not a send request")


def encode_send_message_v2_fields(header: SendMessageRequestHeader) -> dict[str, str]:
    """extFields of a SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE request."""
    return encode_custom_header(header, SEND_MESSAGE_V2_FIELDS)


def encode_send_message_fields(header: SendMessageRequestHeader) -> dict[str, str]:
    """extFields of a SEND_MESSAGE (V1, long names) request."""
    return encode_custom_header(header, SEND_MESSAGE_FIELDS)


@attrs.frozen
class PullMessageRequestHeader:
    """The header of PULL_MESSAGE (11)."""

    consumer_group: str
    topic: str
    queue_id: int
    queue_offset: int
    max_msg_nums: int
    sys_flag: int
    commit_offset: int
    suspend_timeout_millis: int
    sub_version: int
    subscription: str | None = None
    expression_type: str | None = None
    #: 5.x additions, absent from 4.x clients
    max_msg_bytes: int | None = None
    broker_name: str | None = None

    @property
    def has_commit_offset(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.COMMIT_OFFSET)

    @property
    def has_suspend(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUSPEND)

    @property
    def has_subscription(self) -> bool:
        return bool(self.sys_flag & PullSysFlag.SUBSCRIPTION)


PULL_MESSAGE_FIELDS = (
    HeaderField("consumer_group", "consumerGroup"),
    HeaderField("topic", "topic"),
    HeaderField("queue_id", "queueId", _I32),
    HeaderField("queue_offset", "queueOffset", _I64),
    HeaderField("max_msg_nums", "maxMsgNums", _I32),
    HeaderField("sys_flag", "sysFlag", _I32),
    HeaderField("commit_offset", "commitOffset", _I64),
    HeaderField("suspend_timeout_millis", "suspendTimeoutMillis", _I64),
    HeaderField("subscription", "subscription", _S, False),
    HeaderField("sub_version", "subVersion", _I64),
    HeaderField("expression_type", "expressionType", _S, False),
    HeaderField("max_msg_bytes", "maxMsgBytes", _I32, False),
    HeaderField("broker_name", "bname", _S, False),
)


_PULL_PLAN = _plan(PULL_MESSAGE_FIELDS)


def pull_message_header(command: RemotingCommand) -> PullMessageRequestHeader:
    return _decode_planned(command, PullMessageRequestHeader, _PULL_PLAN)


def encode_pull_message_fields(header: PullMessageRequestHeader) -> dict[str, str]:
    return encode_custom_header(header, PULL_MESSAGE_FIELDS)
