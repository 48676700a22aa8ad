"""Typed fields out of parsed JSON, with fastjson's leniency and a path in every error.

``fastjson.read_json`` gives dicts, lists, strings and numbers of any shape: the bytes came from
a peer or a file. The body and config decoders (``route``, ``heartbeat``, ``metadata``) read
their fields through these helpers, which check each type and range, accept what fastjson
accepts when Java reads (a number written as a string, ``"true"`` for a boolean, a missing
field for its default), and raise ``JsonShapeError`` naming where the bad value sits
(``route.brokerDatas[0].brokerAddrs['x'] key must be an integer in range``). A decoder runs
inside ``decoding(SomeWireError, "what")``, which turns that into the caller's typed error.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, TypeVar, cast, overload

from .._errors import TrioHAError
from .errors import WireError
from .layout import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

__all__ = [
    "JsonShapeError",
    "as_int",
    "as_object",
    "decoding",
    "get_bool",
    "get_int",
    "get_list",
    "get_object",
    "get_str",
    "str_items",
]

_T = TypeVar("_T")


class JsonShapeError(TrioHAError):
    """A parsed JSON value has the wrong shape; ``decoding`` turns it into the caller's typed
    error."""


@contextmanager
def decoding(error: type[WireError], what: str) -> Generator[None, None, None]:
    """Raise ``error("<what>: <problem>")`` for a ``JsonShapeError`` inside the block."""
    try:
        yield
    except JsonShapeError as exc:
        raise error(f"{what}: {exc}") from None


def as_object(value: object, path: str) -> dict[str, Any]:
    """``value`` if it is a JSON object."""
    if type(value) is not dict:
        raise JsonShapeError(f"{path} must be an object, got {_type_name(value)}")
    # The parser makes a dict only of an object whose keys are all strings (a JSON object, or
    # read_json_object_keys' all-string case); its values are JSON of any shape, read by the
    # get_* helpers.
    return cast("dict[str, Any]", value)


def as_int(value: object, path: str, *, int32: bool = False) -> int:
    """``value`` as a Java long (or int, with ``int32``); fastjson also reads numbers written
    as strings."""
    if type(value) is str and 0 < len(value) < 21 and value.isascii():
        digits = value[1:] if value[0] == "-" else value
        if digits.isdigit():
            value = int(value)
    lo, hi = (INT32_MIN, INT32_MAX) if int32 else (INT64_MIN, INT64_MAX)
    if type(value) is not int or not lo <= value <= hi:
        raise JsonShapeError(f"{path} must be an integer in range, got {_short_value(value)}")
    return value


class _Missing:
    """The default of the ``get_*`` helpers: no default, a missing field is an error."""


_MISSING = _Missing()


def _field(obj: dict[str, Any], key: str, path: str, default: object) -> object:
    """The value at ``key``, or None if it is missing (null counts as missing) and has a
    default."""
    value = obj.get(key)
    if value is None and default is _MISSING:
        raise JsonShapeError(f"{path}.{key} is missing")
    return value


@overload
def get_int(obj: dict[str, Any], key: str, path: str, *, int32: bool = False) -> int: ...
@overload
def get_int(
    obj: dict[str, Any], key: str, path: str, default: _T, *, int32: bool = False
) -> int | _T: ...
def get_int(
    obj: dict[str, Any], key: str, path: str, default: object = _MISSING, *, int32: bool = False
) -> object:
    """``obj[key]`` as a Java long (or int, with ``int32``)."""
    value = _field(obj, key, path, default)
    if value is None:
        return default
    return as_int(value, f"{path}.{key}", int32=int32)


@overload
def get_str(obj: dict[str, Any], key: str, path: str) -> str: ...
@overload
def get_str(obj: dict[str, Any], key: str, path: str, default: _T) -> str | _T: ...
def get_str(obj: dict[str, Any], key: str, path: str, default: object = _MISSING) -> object:
    """``obj[key]`` as a string (a number is read as its digits, as fastjson does)."""
    value = _field(obj, key, path, default)
    if value is None:
        return default
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    raise JsonShapeError(f"{path}.{key} must be a string, got {_type_name(value)}")


@overload
def get_bool(obj: dict[str, Any], key: str, path: str) -> bool: ...
@overload
def get_bool(obj: dict[str, Any], key: str, path: str, default: _T) -> bool | _T: ...
def get_bool(obj: dict[str, Any], key: str, path: str, default: object = _MISSING) -> object:
    """``obj[key]`` as a boolean (``"true"`` / ``"false"`` in any case too)."""
    value = _field(obj, key, path, default)
    if value is None:
        return default
    if type(value) is bool:
        return value
    if type(value) is str and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise JsonShapeError(f"{path}.{key} must be a boolean, got {_type_name(value)}")


def get_list(obj: dict[str, Any], key: str, path: str) -> list[Any]:
    """``obj[key]`` as an array; missing is empty."""
    value = obj.get(key)
    if value is None:
        return []
    if type(value) is not list:
        raise JsonShapeError(f"{path}.{key} must be an array, got {_type_name(value)}")
    # A JSON array holds JSON of any shape; the caller checks each item.
    return cast("list[Any]", value)


def get_object(
    obj: dict[str, Any], key: str, path: str, *, required: bool = False
) -> dict[str, Any]:
    """``obj[key]`` as an object; missing is empty unless ``required``."""
    value = obj.get(key)
    if value is None:
        if required:
            raise JsonShapeError(f"{path}.{key} is missing")
        return {}
    return as_object(value, f"{path}.{key}")


def str_items(value: object, path: str) -> list[str]:
    """``value`` as an array of strings; null is empty."""
    if value is None:
        return []
    if type(value) is not list:
        raise JsonShapeError(f"{path} must be an array, got {_type_name(value)}")
    # A JSON array, of items of any shape until each is checked here.
    items = cast("list[object]", value)
    for i, item in enumerate(items):
        if type(item) is not str:
            raise JsonShapeError(f"{path}[{i}] must be a string, got {_type_name(item)}")
    return cast("list[str]", items)


_TYPE_NAMES: dict[type[object], str] = {
    dict: "an object", list: "an array", str: "a string", bool: "a boolean",
}


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), "null" if value is None else "a number")


def _short_value(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
