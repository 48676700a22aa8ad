"""From a handler's outcome to the bytes of its reply: typed refusals answered in one line, and
the unexpected logged at a rate a hostile peer cannot raise.

A handler refuses bad input by raising ``RequestError(code, remark)`` (or the wire's
``HeaderFieldError`` for a custom header Java could not parse): the peer gets that response
code with a one-line remark, and the log gets nothing — bad input is the peer's problem, not
the server's. Any other exception is a bug on our side, or input nobody thought to check: the
request is answered SYSTEM_ERROR with ``<type>: <message>`` on one line (RocketMQ answers a
failing processor the same way, with ``RemotingHelper.exceptionSimpleDesc``), and the traceback
is logged at most once per request code and exception type every ten seconds, with the count
of the rest.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Collection
from typing import TypeVar

from .._errors import TrioHAError
from ..config import ConfigError, parse_properties_text
from ..ratelog import RateLimitedLog
from ..wire.errors import HeaderFieldError
from ..wire.remoting import MappedReply, RemotingCommand, ResponseCode, encode, encode_parts

__all__ = [
    "MAX_REMARK", "Frame", "Reply", "RequestError", "answer", "config_update", "encode_reply",
    "failure_reply", "not_supported", "one_line",
]

C = TypeVar("C")

#: an encoded frame: one bytes object, or buffers written in order (a ``MappedReply``)
Frame = bytes | list[bytes | memoryview]

log = logging.getLogger("trio_ha.remoting.server")

#: the longest remark an error answer carries (the peer's own input may be in the message)
MAX_REMARK = 256

_failures = RateLimitedLog(log)
_WHITESPACE = re.compile(r"\s+")


class RequestError(TrioHAError):
    """A request the server refuses: answered with ``code`` and ``remark`` (one line), not
    logged. Raise it from a handler for input that is wrong, not for a fault of the server."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = code
        self.remark = remark


def one_line(text: str, limit: int = MAX_REMARK) -> str:
    """``text`` on one line (runs of whitespace, newlines included, become one space), cut to
    ``limit`` characters."""
    text = _WHITESPACE.sub(" ", text).strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def not_supported(request: RemotingCommand) -> RemotingCommand:
    """RocketMQ's answer to a request code nobody handles."""
    return RemotingCommand.response_to(
        request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        remark=f" request type {request.code} not supported",
    )


def config_update(request: RemotingCommand, black_list: Collection[str],
                  update: Callable[[dict[str, str]], C]) -> tuple[C, dict[str, str]]:
    """An UPDATE_*_CONFIG request's body checked as RocketMQ's servers check it, all or
    nothing: the new config ``update`` makes of its properties, and the properties. Raises
    ``RequestError``: SYSTEM_ERROR when the body is not properties text, NO_PERMISSION for a
    key on ``black_list``, SYSTEM_ERROR naming the problem when ``update`` refuses a value
    (``ConfigError``: a key that cannot change at run time, an unknown one, a bad value)."""
    try:
        properties = parse_properties_text(request.body.decode("utf-8"))
    except (UnicodeDecodeError, ConfigError) as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"string2Properties error: {exc}") from None
    if any(key in black_list for key in properties):
        raise RequestError(ResponseCode.NO_PERMISSION, "Can not update config in black list.")
    try:
        return update(properties), properties
    except ConfigError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, str(exc)) from None


#: what a handler answers: the response, the response with mapped body buffers, its frame
#: already encoded (bytes: a hot path that formats its own, as the broker's SEND_OK), or None
#: (no response: a oneway request, or nothing to say)
Reply = RemotingCommand | MappedReply | bytes | None


async def answer(handle: Callable[[], Awaitable[Reply]], request: RemotingCommand,
                 peer: str) -> Frame | None:
    """Run ``handle`` (a handler applied to ``request`` from ``peer``) and return the encoded
    reply (None: no reply — a oneway request, or a handler with nothing to say). Never raises
    for the handler's exceptions; cancellation passes through."""
    try:
        response = await handle()
    except Exception as exc:
        response = failure_reply(request, exc, peer)
    return encode_reply(response, request, peer)


def failure_reply(request: RemotingCommand, exc: Exception, peer: str) -> RemotingCommand:
    """The response to ``request`` whose handler raised ``exc`` (see the module)."""
    if isinstance(exc, RequestError):
        return RemotingCommand.response_to(request, exc.code, remark=one_line(exc.remark))
    if isinstance(exc, HeaderFieldError):
        return RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR, remark=one_line(f"bad request header: {exc}")
        )
    # a processor bug costs one request, not the connection
    _failures.log(
        logging.ERROR, ("handler", request.code, type(exc)),
        "remoting: request code %d from %s failed: %s", request.code, peer,
        one_line(f"{type(exc).__name__}: {exc}"), exc_info=exc,
    )
    return RemotingCommand.response_to(
        request, ResponseCode.SYSTEM_ERROR, remark=one_line(f"{type(exc).__name__}: {exc}")
    )


def encode_reply(response: Reply, request: RemotingCommand, peer: str) -> Frame | None:
    """The bytes of ``response`` to ``request`` (None: nothing goes back). Never raises: a
    reply the wire cannot carry is answered SYSTEM_ERROR, and logged."""
    if response is None or request.is_oneway:
        return None
    if isinstance(response, bytes):
        return response
    try:
        if isinstance(response, MappedReply):
            return encode_parts(response)
        return encode(response)
    except Exception as exc:  # a reply the wire cannot carry (a header field out of range)
        _failures.log(
            logging.ERROR, ("encode", request.code, type(exc)),
            "remoting: the reply to request code %d from %s cannot be encoded: %s",
            request.code, peer, one_line(str(exc)), exc_info=exc,
        )
        return encode(RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR,
            remark=one_line(f"the reply cannot be encoded: {exc}"),
        ))
