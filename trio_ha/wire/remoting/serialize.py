"""The two header encodings of a command: fastjson JSON (serialize type 0) and RocketMQ's
binary layout (type 1). docs/remoting.md, 'Header fields', has both byte layouts.

Both carry the same fields; a response goes out in the encoding its request came in. Decoding
takes untrusted bytes and raises ``RemotingDecodeError`` and nothing else: field types and
lengths are checked, extFields are bounded in number and size.

Real clients are sloppy in one way Java tolerates: JSON extFields values arrive as numbers and
booleans, not only strings (fastjson coerces them). We coerce them the way Java renders them
(``7`` -> ``"7"``, ``true`` -> ``"true"``, ``1.50`` -> ``"1.50"``) and drop nulls, so the
processors only ever see strings.

Sends are the hot path (tens of thousands a second). JSON headers are read and written by
orjson, in a third to a half of the time the standard library takes (figures in
docs/performance.md, *Small costs*). orjson serves only the plain case, though:
the standard library's reading is the contract. A header orjson refuses (malformed UTF-8, which
Java replaces; lone surrogate escapes; integers past 64 bits, which orjson reads as floats) or
whose values are not the plain kinds (integer fields in range, string extFields) is read again
by the standard library, which gives the coerced values and the errors described above; a
command orjson cannot write (a lone surrogate, a value that is not a string) is written by the
format it replaced. Both paths give the same bytes and the same values wherever both apply
(``tests/test_wire_json_paths.py`` compares them).
"""

from __future__ import annotations

import json
import struct
from decimal import Decimal
from json.encoder import encode_basestring as _quote  # JSON string, non-ASCII kept
from typing import Any, NoReturn

import orjson

from ..errors import RemotingDecodeError
from .codes import LanguageCode
from .command import RemotingCommand
from .java import JAVA_INT_RANGE, abbreviate, java_decimal_text

__all__ = [
    "BINARY_MIN_HEADER_LENGTH",
    "MAX_EXT_FIELDS",
    "MAX_EXT_KEY_LENGTH",
    "MAX_EXT_VALUE_LENGTH",
    "HeaderValues",
    "decode_binary_header",
    "decode_json_header",
    "encode_binary_header",
    "encode_json_header",
]

#: limits on extFields: entries per header, key length, value length (UTF-8 bytes for the binary
#: header, characters for JSON). Values carry message properties (at most 32767 bytes in the
#: store), so the value limit leaves room for the broker to answer MESSAGE_ILLEGAL itself.
MAX_EXT_FIELDS = 1024
MAX_EXT_KEY_LENGTH = 1024
MAX_EXT_VALUE_LENGTH = 256 * 1024

#: a decoded header: code, language, version, opaque, flag, remark, extFields
HeaderValues = tuple[int, LanguageCode, int, int, int, str | None, dict[str, str]]

_LENGTH = struct.Struct(">i")
_BIN_FIXED = struct.Struct(">hBhiii")  # code, language, version, opaque, flag, remark length
_KEY_LEN = struct.Struct(">h")
_VAL_LEN = struct.Struct(">i")
#: the shortest binary header: the fixed part, the remark length and the extFields length
BINARY_MIN_HEADER_LENGTH = _BIN_FIXED.size + 4  # 21

_LANGUAGE_BY_NAME = {member.name: member for member in LanguageCode}
_ONLY_STR = {str}
_LANGUAGE_BY_CODE = {member.value: member for member in LanguageCode}
_LANGUAGE_NAMES = {member.value: member.name for member in LanguageCode}


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


def encode_json_header(command: RemotingCommand, opaque: int | None = None) -> bytes:
    """The JSON header, as fastjson writes it (with ``opaque`` in place of the command's, if
    given: a client numbers its requests as it sends them)."""
    ext = command.ext_fields
    if not ext or set(map(type, ext.values())) == _ONLY_STR:
        header: dict[str, object] = {"code": command.code}
        if ext:
            header["extFields"] = ext
        header["flag"] = command.flag
        header["language"] = _LANGUAGE_NAMES[command.language]
        header["opaque"] = command.opaque if opaque is None else opaque
        if command.remark is not None:
            header["remark"] = command.remark
        header["serializeTypeCurrentRPC"] = "JSON"
        header["version"] = command.version
        try:
            return orjson.dumps(header)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate (Java writes '?'), a key that is not a string
    return _encode_json_header_formatted(command, opaque)


def _encode_json_header_formatted(command: RemotingCommand, opaque: int | None) -> bytes:
    """``encode_json_header`` by string format, for what orjson does not write."""
    ext = command.ext_fields
    remark = command.remark
    return _utf8(
        _JSON_HEADER
        % (
            command.code,
            ',"extFields":{' + ",".join([f"{_quote(k)}:{_quote(v)}" for k, v in ext.items()]) + "}"
            if ext
            else "",
            command.flag,
            _LANGUAGE_NAMES[command.language],
            command.opaque if opaque is None else opaque,
            ',"remark":' + _quote(remark) if remark is not None else "",
            command.version,
        )
    )


def encode_binary_header(command: RemotingCommand, opaque: int | None = None) -> bytes:
    """The ROCKETMQ binary header (``opaque`` as in ``encode_json_header``). Raises ValueError
    for a field that does not fit."""
    remark = _utf8(command.remark) if command.remark else b""
    parts = [b"", remark, b""]
    ext_len = 0
    for key, value in command.ext_fields.items():
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
            command.opaque if opaque is None else opaque,
            command.flag,
            len(remark),
        )
    except struct.error as exc:
        raise ValueError(f"a header field does not fit the ROCKETMQ binary header: {exc}") from None
    parts[2] = _LENGTH.pack(ext_len)
    return b"".join(parts)


# ---- decoding ----------------------------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise RemotingDecodeError(f"JSON header contains {name}, which is not JSON")


_JSON_DECODER = json.JSONDecoder(parse_float=Decimal, parse_constant=_reject_constant)

# What either parser makes of a JSON document (a number with a fraction is a Decimal from the
# standard library, a float from orjson). A parse result is declared as this, which costs nothing
# per frame where a cast is a call; ``type(x) is dict`` then narrows it to an object, whose keys
# are strings and whose values are any JSON value (Any: each is checked where it is read).
_Parsed = dict[str, Any] | list[Any] | str | int | float | Decimal | bool | None


def _json_int(obj: dict[str, object], key: str, default: int) -> int:
    value = obj.get(key)
    if value is None:
        return default
    if type(value) is not int:
        raise RemotingDecodeError(
            f"JSON header field {key!r} must be an integer, got {type(value).__name__}"
        )
    if not JAVA_INT_RANGE[0] <= value <= JAVA_INT_RANGE[1]:
        raise RemotingDecodeError(f"JSON header field {key!r} is out of range: {value}")
    return value


def _normalise_ext(raw: _Parsed, header_length: int) -> dict[str, str]:
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
        # The same class as type(value) for what a JSON parser makes, and as fast; the checker
        # gives type() of an Any no type, and this one Any.
        t = value.__class__
        if t is str:
            pass
        elif value is None:
            continue  # fastjson keeps the null; every reader treats it as absent
        elif t is bool:
            value = "true" if value else "false"
        elif t is int:
            value = int.__repr__(value)
        elif t is Decimal:
            value = java_decimal_text(value)
        else:
            raise RemotingDecodeError(
                f"extFields value of {abbreviate(key)!r} must be a string, number or boolean, "
                f"got {'an object' if t is dict else 'an array'}"
            )
        fields[key] = value
    if header_length > MAX_EXT_VALUE_LENGTH:
        _check_value_lengths(fields)
    return fields



def _check_value_lengths(fields: dict[str, str]) -> None:
    for key, value in fields.items():
        if len(value) > MAX_EXT_VALUE_LENGTH:
            raise RemotingDecodeError(
                f"extFields value of {abbreviate(key)!r} has {len(value)} characters, over the "
                f"limit of {MAX_EXT_VALUE_LENGTH}"
            )


def decode_json_header(header: bytes) -> HeaderValues:
    """The fields of a JSON header: read by orjson when it is the plain case, else by the
    standard library (the module's docstring says why both)."""
    try:
        obj: _Parsed = orjson.loads(header)
    except orjson.JSONDecodeError:
        return _decode_json_header_exactly(header)
    if type(obj) is dict and "code" in obj:
        try:
            return _header_values(obj, len(header))
        except RemotingDecodeError:
            # A field of another type or out of range, or a float, which orjson reads where
            # the contract reads a Decimal: the exact path reads it, or says what is wrong.
            pass
    return _decode_json_header_exactly(header)


def _decode_json_header_exactly(header: bytes) -> HeaderValues:
    """``decode_json_header`` by the standard library: Java's replacement of malformed UTF-8,
    numbers as Decimal, every error."""
    text = header.decode("utf-8", "replace")
    try:
        obj: _Parsed = _JSON_DECODER.decode(text)
    except RemotingDecodeError:
        raise
    except (ValueError, RecursionError, ArithmeticError) as exc:
        raise RemotingDecodeError(f"JSON header is not valid JSON: {exc}") from None
    if type(obj) is not dict:
        raise RemotingDecodeError(f"JSON header must be an object, got {type(obj).__name__}")
    if "code" not in obj:
        raise RemotingDecodeError("JSON header has no code")
    return _header_values(obj, len(header))


def _header_values(obj: dict[str, Any], header_length: int) -> HeaderValues:
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
        _normalise_ext(obj.get("extFields"), header_length),
    )


def decode_binary_header(buf: bytes | bytearray, start: int, end: int) -> HeaderValues:
    """The fields of the binary header at ``buf[start:end]``."""
    if end - start < BINARY_MIN_HEADER_LENGTH:
        raise RemotingDecodeError(
            f"ROCKETMQ header of {end - start} bytes is shorter than {BINARY_MIN_HEADER_LENGTH}"
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
