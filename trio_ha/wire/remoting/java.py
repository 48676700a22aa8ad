"""Header values as Java writes and reads them.

A custom header travels as ``extFields``, a map of strings. Java renders its fields into that
map with ``String.valueOf`` and parses them back with ``Integer.parseInt``,
``Long.parseLong`` and ``Boolean.parseBoolean``. To talk to Java clients we must render and
parse the same way, which is not Python's way: ``str(True)`` is ``"True"``, and ``int()``
accepts spaces, underscores and non-ASCII digits that Java rejects. fastjson also reads JSON
fractions as ``BigDecimal``, whose ``toString`` is what a Java peer would have seen.
"""

from __future__ import annotations

from decimal import Decimal

from ..layout import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN

__all__ = [
    "JAVA_INT_RANGE",
    "JAVA_LONG_RANGE",
    "JavaValue",
    "abbreviate",
    "java_decimal_text",
    "java_string",
    "parse_java_integer",
]

#: what a header field may hold before it is rendered: a string, an int (bool included),
#: or a fraction fastjson read as a BigDecimal
JavaValue = str | int | Decimal

#: the bounds of a Java ``int`` and ``long``, for ``parse_java_integer``
JAVA_INT_RANGE = (INT32_MIN, INT32_MAX)
JAVA_LONG_RANGE = (INT64_MIN, INT64_MAX)


def java_string(value: object) -> str:
    """A header value (a ``JavaValue``) as Java writes it into extFields: ints in decimal,
    booleans ``true``/``false``, strings unchanged. It takes any object and raises TypeError
    for what is not a JavaValue: header classes' fields reach it through ``getattr``, unchecked."""
    if type(value) is str:
        return value
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, Decimal):
        return java_decimal_text(value)
    if isinstance(value, str):
        return str.__str__(value)
    raise TypeError(f"extFields values must be str, int or bool, not {type(value).__name__}")


def java_decimal_text(value: Decimal) -> str:
    """``BigDecimal.toString``: fastjson parses JSON fractions as BigDecimal, whose toString
    and ``Decimal.__str__`` follow the same scientific-notation rules (``"1.50"``,
    ``"1E+3"``); BigDecimal has no -0."""
    if value.is_zero():
        value = value.copy_abs()
    return str(value)


def parse_java_integer(text: str, bounds: tuple[int, int]) -> int | None:
    """``Integer.parseInt`` / ``Long.parseLong`` (``bounds`` is ``JAVA_INT_RANGE`` or
    ``JAVA_LONG_RANGE``): an optional sign and ASCII digits, in range; None otherwise."""
    if 0 < len(text) <= 20 and text.isascii():
        digits = text[1:] if text[0] in "+-" else text
        if digits.isdigit():
            value = int(text)
            if bounds[0] <= value <= bounds[1]:
                return value
    return None


def abbreviate(text: str) -> str:
    """``text`` cut to 64 characters, for an error message quoting untrusted input."""
    return text if len(text) <= 64 else text[:61] + "..."
