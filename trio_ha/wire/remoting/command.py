"""``RemotingCommand``: one request or response of RocketMQ's remoting protocol, as a value.

Every frame carries the same header fields (docs/remoting.md, 'Header fields'): ``code``
(request code in requests, response code in responses), ``language``, ``version``,
``opaque`` (the request id a response echoes), ``flag`` (``RemotingFlag``: response, oneway),
``remark`` and ``extFields``, a string map holding the request's custom header. A command is
those fields plus the body; ``frames`` turns it into bytes and back.

Named constructors build requests and responses the way Java does (a response echoes the
request's opaque and serialize type); the ``field_*`` accessors read a custom header field
with Java's parsing rules and raise ``HeaderFieldError`` naming it, which the broker turns into
an error response rather than a closed connection.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar, cast, overload

import attrs

from ..errors import HeaderFieldError
from .codes import DEFAULT_VERSION, LanguageCode, RemotingFlag, SerializeType
from .java import (
    JAVA_INT_RANGE,
    JAVA_LONG_RANGE,
    JavaValue,
    abbreviate,
    java_string,
    parse_java_integer,
)

__all__ = ["RemotingCommand", "string_fields"]

_T = TypeVar("_T")

# The flag bits as plain ints for the per-command tests: ``int & IntFlag`` builds a new flag
# member (about a microsecond), ``int & int`` does not.
_RESPONSE_BIT = RemotingFlag.RESPONSE.value
_ONEWAY_BIT = RemotingFlag.ONEWAY.value


class _Missing:
    """The default of the ``field_*`` accessors: no default, a missing field is an error."""

    def __repr__(self) -> str:
        return "MISSING"


_MISSING = _Missing()


def _body_repr(body: bytes) -> str:
    return f"<{len(body)} bytes>"


@attrs.frozen
class RemotingCommand:
    """One request or response. ``ext_fields`` maps names to strings (see ``java_string``);
    ``body`` is raw bytes. ``code`` and ``flag`` are plain ints on decode (compare them with
    ``RequestCode`` / ``ResponseCode`` / ``RemotingFlag`` members, which are ints): a peer may
    send codes and bits we have no name for."""

    code: int
    language: LanguageCode = LanguageCode.JAVA
    version: int = 0
    opaque: int = 0
    flag: int = 0
    remark: str | None = None
    # The factory is ``dict`` itself, cast once here: plain ``factory=dict`` leaves the field's
    # item types unknown to the checker, and ``factory=dict[str, str]`` would make every
    # command pay a generic alias call.
    ext_fields: dict[str, str] = attrs.field(factory=cast("Callable[[], dict[str, str]]", dict))
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
        ext_fields: Mapping[str, JavaValue | None] | None = None,
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
            ext_fields=string_fields(ext_fields),
            body=bytes(body),
            serialize_type=serialize_type,
        )

    @classmethod
    def response_to(
        cls,
        request: RemotingCommand,
        code: int,
        remark: str | None = None,
        ext_fields: Mapping[str, JavaValue | None] | None = None,
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
            ext_fields=string_fields(ext_fields),
            body=bytes(body),
            serialize_type=request.serialize_type if serialize_type is None else serialize_type,
        )

    # -- typed access to custom header fields

    @overload
    def field_str(self, name: str) -> str: ...
    @overload
    def field_str(self, name: str, default: _T) -> str | _T: ...
    def field_str(self, name: str, default: object = _MISSING) -> object:
        value = self.ext_fields.get(name)
        if value is None:
            return _missing(name, default)
        return value

    @overload
    def field_int(self, name: str) -> int: ...
    @overload
    def field_int(self, name: str, default: _T) -> int | _T: ...
    def field_int(self, name: str, default: object = _MISSING) -> object:
        """A Java ``int`` field (``Integer.parseInt``)."""
        return self._integer(name, default, JAVA_INT_RANGE, "an int")

    @overload
    def field_long(self, name: str) -> int: ...
    @overload
    def field_long(self, name: str, default: _T) -> int | _T: ...
    def field_long(self, name: str, default: object = _MISSING) -> object:
        """A Java ``long`` field (``Long.parseLong``)."""
        return self._integer(name, default, JAVA_LONG_RANGE, "a long")

    @overload
    def field_bool(self, name: str) -> bool: ...
    @overload
    def field_bool(self, name: str, default: _T) -> bool | _T: ...
    def field_bool(self, name: str, default: object = _MISSING) -> object:
        """A boolean field, parsed as Java's ``Boolean.parseBoolean``: ``true`` in any case is
        True and anything else is False (never an error once present)."""
        value = self.ext_fields.get(name)
        if value is None:
            return _missing(name, default)
        return value.lower() == "true"

    def _integer(self, name: str, default: object, bounds: tuple[int, int], what: str) -> object:
        text = self.ext_fields.get(name)
        if text is None:
            return _missing(name, default)
        value = parse_java_integer(text, bounds)
        if value is None:
            raise HeaderFieldError(
                name, f"the custom field <{name}> is not {what}: {abbreviate(text)!r}"
            )
        return value


def _missing(name: str, default: object) -> object:
    if default is _MISSING:
        raise HeaderFieldError(name, f"the custom field <{name}> is null")
    return default


def string_fields(fields: Mapping[str, JavaValue | None] | None) -> dict[str, str]:
    """extFields from a mapping of header values: each rendered as Java does
    (``java_string``), None values left out."""
    if not fields:
        return {}
    return {str(k): java_string(v) for k, v in fields.items() if v is not None}
