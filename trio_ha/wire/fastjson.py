"""fastjson's JSON, read and written: the dialect every RocketMQ body and config file is in.

RocketMQ serialises its bodies and config files with fastjson, which has one habit that
matters: a map whose keys are not strings (``brokerAddrs``, keyed by broker id; the offset
tables, keyed by queue id) is written with **unquoted** numeric keys,
``{"brokerAddrs":{0:"10.0.0.1:10911"}}``, which no standard JSON parser accepts. Some callers
want standard JSON instead (quoted keys, non-ASCII escaped; see ``route.wants_standard_json``).

So this module has a reader that accepts both forms (``read_json``: standard JSON first, then
again with numeric keys quoted) and a writer with both modes (``write_json``), which also writes
bean fields in alphabetical order and leaves out nulls, as fastjson does, and can reproduce
fastjson's tab-indented "pretty" layout of the config files (``metadata``).

The reader takes untrusted bytes: the size is bounded before parsing, and anything that is not
JSON in either form (NaN included) raises the caller's ``WireError`` subclass.
``json_fields`` turns the parsed value into typed fields.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Mapping
from typing import Any, NoReturn, cast

from .errors import RouteDecodeError, WireError

__all__ = [
    "DEFAULT_MAX_JSON_LENGTH", "MAX_JSON_DEPTH", "ObjectKeyedMap", "encode_json", "read_json",
    "read_json_object_keys", "write_json",
]

#: the largest JSON document we parse (frames are at most 16 MiB; config files may be larger)
DEFAULT_MAX_JSON_LENGTH = 64 * 1024 * 1024


# ---- reading ----------------------------------------------------------------------------------

# a JSON string (skipped as is), or an unquoted integer key after '{' or ','
_NUMERIC_KEY = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|([{,]\s*)(-?[0-9]+)(\s*:)', re.S)


def _quote_key(match: re.Match[str]) -> str:
    if match.group(1) is not None:
        return match.group(1)
    return f'{match.group(2)}"{match.group(3)}"{match.group(4)}'


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def read_json(
    data: bytes | bytearray | memoryview | str,
    *,
    max_length: int = DEFAULT_MAX_JSON_LENGTH,
    error: type[WireError] = RouteDecodeError,
    what: str = "JSON body",
) -> Any:
    """Parse standard JSON or fastjson's output (unquoted numeric object keys). Raises
    ``error`` for anything else, for a document over ``max_length`` and for invalid UTF-8."""
    if len(data) > max_length:
        raise error(f"{what} of {len(data)} bytes exceeds the limit of {max_length}")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8: {exc}") from None
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _DECODER.decode(_NUMERIC_KEY.sub(_quote_key, text))
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None


#: how deep ``read_json_object_keys`` nests before it refuses (RocketMQ's bodies use 4)
MAX_JSON_DEPTH = 32


class ObjectKeyedMap(list[tuple[Any, Any]]):
    """A JSON object whose keys are not all strings, as (key, value) pairs in document order:
    fastjson writes a ``Map<MessageQueue, ...>`` with the MessageQueue *objects* as keys
    (``{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{...}}}``)."""


def read_json_object_keys(
    data: bytes | bytearray | memoryview | str,
    *,
    max_length: int = DEFAULT_MAX_JSON_LENGTH,
    error: type[WireError] = RouteDecodeError,
    what: str = "JSON body",
) -> Any:
    """Parse fastjson's output where a map may have any JSON value as a key (an object, a bare
    number, a string). An object whose keys are all strings becomes a dict; any other, an
    ``ObjectKeyedMap``. Raises ``error`` for anything else, for a document over ``max_length``,
    nesting deeper than MAX_JSON_DEPTH, and invalid UTF-8."""
    if len(data) > max_length:
        raise error(f"{what} of {len(data)} bytes exceeds the limit of {max_length}")
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what} is not UTF-8: {exc}") from None
    try:
        value, end = _keyed_value(text, _skip_space(text, 0), 0)
        if _skip_space(text, end) != len(text):
            raise ValueError(f"extra data at character {end}")
    except (ValueError, IndexError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None
    return value


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _keyed_value(text: str, i: int, depth: int) -> tuple[Any, int]:
    if text[i] != "{":
        # Strings, numbers, literals and arrays (which hold plain JSON in these bodies).
        return _DECODER.raw_decode(text, i)
    if depth >= MAX_JSON_DEPTH:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")
    pairs: list[tuple[Any, Any]] = []
    i = _skip_space(text, i + 1)
    if text[i] == "}":
        return {}, i + 1
    while True:
        key, i = _keyed_value(text, _skip_space(text, i), depth + 1)
        i = _skip_space(text, i)
        if text[i] != ":":
            raise ValueError(f"expected ':' at character {i}")
        value, i = _keyed_value(text, _skip_space(text, i + 1), depth + 1)
        pairs.append((key, value))
        i = _skip_space(text, i)
        if text[i] == ",":
            i += 1
            continue
        if text[i] == "}":
            break
        raise ValueError(f"expected ',' or '}}' at character {i}")
    if all(isinstance(key, str) for key, _ in pairs):
        return dict(pairs), i + 1
    return ObjectKeyedMap(pairs), i + 1


# ---- writing ----------------------------------------------------------------------------------

_FAST_STR = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
_STANDARD_STR = json.JSONEncoder(ensure_ascii=True, check_circular=False).encode


def write_json(value: Any, *, standard_json: bool = False, pretty: bool = False) -> str:
    """Write ``value`` (dicts, lists, tuples, sets, str, int, bool, None) as fastjson would.

    Dict entries with a None value are left out (fastjson omits nulls); string keys are sorted
    (fastjson sorts bean fields; ``MapSortField`` sorts maps); int keys are written bare in
    fastjson's form and quoted in standard form, which also escapes non-ASCII (fastjson's
    ``BrowserCompatible``). Sets are written sorted. ``pretty`` reproduces fastjson's
    ``PrettyFormat``: a tab-indented line per string-keyed entry, int-keyed maps on one line
    with the closing brace on the next."""
    out: list[str] = []
    _emit(value, out, _STANDARD_STR if standard_json else _FAST_STR, standard_json, pretty, 0)
    return "".join(out)


def _key_order(item: tuple[object, object]) -> tuple[int, object, str]:
    key = item[0]
    return (0, key, "") if type(key) is int else (1, 0, str(key))


def _emit(
    value: Any,
    out: list[str],
    enc: Callable[[str], str],
    standard: bool,
    pretty: bool,
    depth: int,
) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(enc(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, Mapping):
        # The writer's input is any Python value (its type says Any); from here on a mapping's
        # keys and values are objects we look at, and the keys are checked one by one below.
        mapping = cast("Mapping[object, object]", value)
        items = [item for item in mapping.items() if item[1] is not None]
        if not items:
            out.append("{}")
            return
        items.sort(key=_key_order)
        out.append("{")
        inner = "\n" + "\t" * (depth + 1) if pretty else ""
        for i, (key, item) in enumerate(items):
            if i:
                out.append(",")
            if type(key) is int:
                out.append(f'"{key}":' if standard else f"{key}:")
            elif isinstance(key, str):
                out.append(inner)
                out.append(enc(key))
                out.append(":")
            else:
                raise TypeError(f"JSON object keys must be str or int, not {type(key).__name__}")
            _emit(item, out, enc, standard, pretty, depth + 1)
        if pretty:
            out.append("\n" + "\t" * depth)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        # Sorting a set compares its members, which must be of one orderable kind (sets
        # here hold str or int), as the writer's contract says.
        members = cast("Collection[Any]", value)
        ordered = sorted(members) if isinstance(members, (set, frozenset)) else members
        out.append("[")
        for i, item in enumerate(ordered):
            if i:
                out.append(",")
            _emit(item, out, enc, standard, pretty, depth + 1)
        out.append("]")
    elif isinstance(value, float):
        out.append(repr(value))
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON")


def encode_json(value: Any, *, standard_json: bool = False, pretty: bool = False) -> bytes:
    """``write_json`` as UTF-8 bytes (a lone surrogate becomes ``?``, as Java's getBytes)."""
    return write_json(value, standard_json=standard_json, pretty=pretty).encode("utf-8", "replace")
