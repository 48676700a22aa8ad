"""Which processor answers which request (RocketMQ's processor table).

Sends and consumer send-backs go to ``send``, END_TRANSACTION to ``transactions``, pulls to
``pull`` (each in its own task, so held pulls wait without blocking the connection; sends
and the admin verbs are served in the reader's round without one, ``handle_now``),
everything else this broker supports to ``admin``; requests it knows but does not support get
a response saying what is missing, and any other code REQUEST_CODE_NOT_SUPPORTED. The VIP port
(RocketMQ's "fast" channel) serves the same except pulls.

Processors check client input themselves and answer with RocketMQ's codes. What a metadata
table refuses and a processor did not catch (``MetadataRequestError``: a bad name or number,
a table at its cap) is still the client's doing, not a broker bug: it is answered here with
SYSTEM_ERROR and its one-line message, and logged at debug level only — a client repeating a
bad request must not fill the log with tracebacks.
"""

from __future__ import annotations

import logging

import trio

from ..remoting import RUN_IN_TASK, PendingReply, RemotingConnection
from ..remoting.answers import Reply
from ..remoting.connection import RunInTask
from ..wire.remoting import MappedReply, RemotingCommand, RequestCode, ResponseCode
from . import admin
from .broker import Broker
from .metadata import MetadataRequestError
from .pull import process_pull
from .send import process_send, process_send_back, process_send_now
from .transactions import end_transaction

__all__ = ["SEND_CODES", "handle", "handle_now", "handle_vip"]

log = logging.getLogger(__name__)

#: the longest remark a refusal carries (its message quotes client input)
MAX_REMARK = 256

SEND_CODES = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
})


def handle_now(broker: Broker, request: RemotingCommand,
               connection: RemotingConnection) -> Reply | PendingReply | RunInTask:
    """What the reader serves in its own round, without a task (the remoting server's
    ``FastHandler``): sends (a SYNC send's wait is a ``PendingReply``, answered from the round
    its ack arrives in) and the admin verbs, which never wait. Pulls, which may be held, and
    the rest run in tasks of their own (``handle``). Issue 11: a task per request cost the
    master a spawn and two more steps per send."""
    code = request.code
    try:
        if code in SEND_CODES:
            return process_send_now(broker, request, connection)
        handler = admin.HANDLERS.get(code)
        if handler is not None:
            return handler(broker, request, connection)
    except MetadataRequestError as exc:
        return _refused(request, connection, exc)
    return RUN_IN_TASK


async def handle(broker: Broker, request: RemotingCommand,
                 connection: RemotingConnection) -> RemotingCommand | MappedReply | bytes:
    try:
        return await _route(broker, request, connection)
    except MetadataRequestError as exc:
        return _refused(request, connection, exc)


def _refused(request: RemotingCommand, connection: RemotingConnection,
             exc: MetadataRequestError) -> RemotingCommand:
    log.debug("broker: request code %d from %s refused: %s", request.code,
              connection.peer, exc)
    return RemotingCommand.response_to(
        request, ResponseCode.SYSTEM_ERROR, remark=one_line(str(exc))
    )


def one_line(text: str) -> str:
    """``text`` as one line of at most MAX_REMARK characters."""
    text = " ".join(text.split())
    return text if len(text) <= MAX_REMARK else text[: MAX_REMARK - 3] + "..."


#: RocketMQ 5 clients send a lite pull consumer's pulls as LITE_PULL_MESSAGE; its broker
#: serves both codes with one processor, and so do we.
PULL_CODES = frozenset({RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE})


async def _route(broker: Broker, request: RemotingCommand,
                 connection: RemotingConnection) -> RemotingCommand | MappedReply | bytes:
    code = request.code
    if code in SEND_CODES:
        return await process_send(broker, request, connection)
    if code in PULL_CODES:
        broker.stats.gets += 1
        return await process_pull(broker, request, connection)
    if code == RequestCode.CONSUMER_SEND_MSG_BACK:
        return await process_send_back(broker, request, connection)
    if code == RequestCode.END_TRANSACTION:
        if broker.is_slave:
            await trio.lowlevel.checkpoint()
            return RemotingCommand.response_to(
                request, ResponseCode.SLAVE_NOT_AVAILABLE,
                remark="a slave keeps no transactions; end it at the master")
        return await end_transaction(broker.store, request,
                                     broker.transaction_check.decisions)
    handler = admin.HANDLERS.get(code)
    await trio.lowlevel.checkpoint()
    if handler is not None:
        return handler(broker, request, connection)
    refused = admin.unsupported(request)
    if refused is not None:
        return refused
    return RemotingCommand.response_to(
        request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        remark=f" request type {code} not supported",
    )


async def handle_vip(broker: Broker, request: RemotingCommand,
                     connection: RemotingConnection) -> RemotingCommand | MappedReply | bytes:
    """The VIP port serves the same requests except pulls (as RocketMQ's fast channel)."""
    if request.code in PULL_CODES:
        await trio.lowlevel.checkpoint()
        return RemotingCommand.response_to(
            request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            remark="pulls are served on the main port, not the VIP port",
        )
    return await handle(broker, request, connection)
