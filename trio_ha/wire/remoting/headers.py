"""Custom headers: a request's typed header, carried in the command's string map ``extFields``.

Java describes each request header as a class (``SendMessageRequestHeader``...) whose fields
``makeCustomHeaderToNet`` writes into extFields as strings and ``decodeCommandCustomHeader``
reads back with Java's parsing rules. Here a header is an attrs class plus a tuple of
``HeaderField`` saying, per attribute, the extFields name, the Java type and whether Java marks
it ``@CFNotNull``. A missing required field or a number Java could not parse raises
``HeaderFieldError`` naming the field (the broker answers it; the connection stays).

Send headers are decoded tens of thousands of times a second, so a ``HeaderSpec`` works out its
decoding plan once, and plain digits that cannot overflow skip the full Java parse.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import attrs

from ..errors import HeaderFieldError
from .command import RemotingCommand
from .java import JAVA_INT_RANGE, JAVA_LONG_RANGE, abbreviate, java_string, parse_java_integer

__all__ = [
    "FieldKind",
    "HeaderField",
    "HeaderSpec",
    "decode_custom_header",
    "encode_custom_header",
]

_H = TypeVar("_H", bound=attrs.AttrsInstance)


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
    attribute's default. ``alias`` is the long name a one-letter field stands for (the V2
    send header's ``a``..``n``), quoted in error messages."""

    attr: str
    name: str
    kind: FieldKind = FieldKind.STR
    required: bool = True
    alias: str | None = None


# A plan step: attribute, extFields name, kind (0 str, 1 int, 2 long, 3 bool: small ints are
# the cheapest thing to compare in the loop), required, the field (for error messages).
_Step = tuple[str, str, int, bool, HeaderField]
_KIND_CODES = {FieldKind.STR: 0, FieldKind.INT: 1, FieldKind.LONG: 2, FieldKind.BOOL: 3}


def _plan_of(spec: HeaderSpec[Any]) -> tuple[_Step, ...]:
    return tuple((f.attr, f.name, _KIND_CODES[f.kind], f.required, f) for f in spec.fields)


@attrs.frozen
class HeaderSpec(Generic[_H]):
    """A custom header class and its fields, with the decoding plan worked out once."""

    cls: Callable[..., _H]
    fields: tuple[HeaderField, ...] = attrs.field(converter=tuple)
    _plan: tuple[_Step, ...] = attrs.field(
        init=False, repr=False, eq=False, default=attrs.Factory(_plan_of, takes_self=True)
    )

    def decode(self, command: RemotingCommand) -> _H:
        """Build the header from ``command``'s extFields, as Java's
        ``decodeCommandCustomHeader``."""
        ext = command.ext_fields
        kwargs: dict[str, object] = {}
        for attr, name, kind, required, field in self._plan:
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
                value = parse_java_integer(text, JAVA_INT_RANGE if kind == 1 else JAVA_LONG_RANGE)
                if value is None:
                    raise HeaderFieldError(
                        name,
                        f"the custom field <{name}>{_alias(field)} is not "
                        f"{'an int' if kind == 1 else 'a long'}: {abbreviate(text)!r}",
                    )
                kwargs[attr] = value
        return self.cls(**kwargs)

    def encode(self, header: _H) -> dict[str, str]:
        """extFields for ``header``, as Java's ``makeCustomHeaderToNet`` writes them."""
        return encode_custom_header(header, self.fields)


# (the fields tuple, its spec) by (class, id of the tuple): the tuple is held, so its id stays
# unique; a few header classes exist, the bound only guards against a caller that makes
# fields tuples on the fly
_SPECS: dict[tuple[object, int], tuple[tuple[HeaderField, ...], HeaderSpec[Any]]] = {}


def decode_custom_header(
    command: RemotingCommand, cls: Callable[..., _H], fields: Iterable[HeaderField]
) -> _H:
    """Build ``cls`` from ``command``'s extFields, as Java's ``decodeCommandCustomHeader``:
    a required field that is missing raises ``HeaderFieldError`` ("the custom field <x> is
    null"), and so does a number Java could not parse."""
    if isinstance(fields, tuple):
        cached = _SPECS.get((cls, id(fields)))
        if cached is not None and cached[0] is fields:
            return cached[1].decode(command)
    spec = HeaderSpec(cls, fields)
    if isinstance(fields, tuple) and len(_SPECS) < 256:
        _SPECS[(cls, id(fields))] = (fields, spec)
    return spec.decode(command)


def encode_custom_header(
    header: attrs.AttrsInstance, fields: Iterable[HeaderField]
) -> dict[str, str]:
    """extFields for ``header`` (an attrs class) as Java's ``makeCustomHeaderToNet`` writes
    them: every non-null field, rendered as a string."""
    result: dict[str, str] = {}
    for field in fields:
        value = getattr(header, field.attr)
        if value is not None:
            result[field.name] = java_string(value)
    return result


def _alias(field: HeaderField) -> str:
    return f" ({field.alias})" if field.alias else ""


def _null_message(field: HeaderField) -> str:
    return f"the custom field <{field.name}>{_alias(field)} is null"
