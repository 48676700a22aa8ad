"""RocketMQ remoting over trio: the server side.

One nursery per connection. Its reader decodes frames and starts one task per request, so a
slow request (a long-polled pull holds its reply for up to 15 s) never stalls the requests
behind it; replies go out in whatever order they finish, matched by ``opaque`` as RocketMQ
clients expect. Replies are written by ``RemotingConnection.send``: under a lock, so frames
never interleave, and shielded from cancellation, so a frame is never left half-written.

The peer is untrusted: frame and header sizes are checked by the decoder before anything is
buffered, a malformed frame closes that one connection, and at most ``max_in_flight`` requests
run at once per connection — beyond that the reader stops reading, and back-pressure reaches
the peer's socket. A connection silent for ``idle_timeout`` seconds (RocketMQ: 120) is closed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import attrs
import trio

from .._sockets import peer_name
from ..wire.errors import HeaderFieldError, RemotingDecodeError
from ..wire.remoting import NEED_DATA, FrameDecoder, RemotingCommand, ResponseCode, encode

log = logging.getLogger(__name__)

RECEIVE_SIZE = 256 * 1024
DEFAULT_IDLE_TIMEOUT = 120.0
DEFAULT_MAX_IN_FLIGHT = 4096

Handler = Callable[[RemotingCommand, "RemotingConnection"], Awaitable[RemotingCommand | None]]


@attrs.define(eq=False)
class RemotingConnection:
    """One client connection, as processors see it."""

    stream: trio.abc.Stream
    peer: str
    connected_at: float = attrs.field(factory=time.time)
    closed: bool = False
    _send_lock: trio.Lock = attrs.field(factory=trio.Lock)

    async def send(self, command: RemotingCommand) -> None:
        """Send one frame: under the lock, so frames never interleave, and shielded, so a
        cancelled sender never leaves half a frame on the wire."""
        if self.closed:
            raise trio.ClosedResourceError("connection closed")
        data = encode(command)
        async with self._send_lock:
            with trio.CancelScope(shield=True):
                await self.stream.send_all(data)


def not_supported(request: RemotingCommand) -> RemotingCommand:
    """RocketMQ's answer to a request code nobody handles."""
    return RemotingCommand.response_to(
        request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        remark=f" request type {request.code} not supported",
    )


async def serve_connection(
    stream: trio.abc.Stream,
    handler: Handler,
    *,
    peer: str = "?",
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    on_open: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
) -> None:
    """Serve requests from one connection until it closes, misbehaves or idles out."""
    connection = RemotingConnection(stream, peer)
    decoder = FrameDecoder()
    limiter = trio.CapacityLimiter(max_in_flight)
    if on_open is not None:
        on_open(connection)
    try:
        async with trio.open_nursery() as nursery:
            try:
                while True:
                    data: bytes | bytearray | None = None
                    with trio.move_on_after(idle_timeout):
                        data = await stream.receive_some(RECEIVE_SIZE)
                    if data is None:
                        log.info("remoting: closing %s, idle for %g s", peer, idle_timeout)
                        break
                    if not data:
                        break
                    decoder.receive_data(data)
                    while (command := decoder.next_command()) is not NEED_DATA:
                        if command.is_response:
                            continue  # we send no requests to clients; ignore stray replies
                        token = object()  # one slot per request in flight
                        await limiter.acquire_on_behalf_of(token)
                        nursery.start_soon(_process, handler, connection, command, limiter,
                                           token)
            except RemotingDecodeError as exc:
                log.warning("remoting: bad frame from %s, closing: %s", peer, exc)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("remoting: connection %s lost: %s", peer, exc)
            connection.closed = True
            nursery.cancel_scope.cancel()
    finally:
        connection.closed = True
        if on_close is not None:
            on_close(connection)
        with trio.CancelScope(shield=True):
            await stream.aclose()


async def _process(handler: Handler, connection: RemotingConnection, request: RemotingCommand,
                   limiter: trio.CapacityLimiter, token: object) -> None:
    try:
        try:
            response = await handler(request, connection)
        except HeaderFieldError as exc:
            response = RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, remark=f"bad request header: {exc}"
            )
        except Exception as exc:  # a processor bug costs one request, not the connection
            log.exception("remoting: request code %d from %s failed", request.code,
                          connection.peer)
            response = RemotingCommand.response_to(
                request, ResponseCode.SYSTEM_ERROR, remark=f"{type(exc).__name__}: {exc}"
            )
        if response is None or request.is_oneway or connection.closed:
            return
        try:
            await connection.send(response)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            connection.closed = True
    finally:
        limiter.release_on_behalf_of(token)


async def serve_remoting(
    handler: Handler,
    port: int,
    *,
    host: str | None = None,
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    on_open: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (port 0: the OS picks), or on ``listeners`` already bound,
    and serve every connection with ``handler``; reports the bound ``(host, port)``."""
    if listeners is None:
        listeners = await trio.open_tcp_listeners(port, host=host)
    sockname = listeners[0].socket.getsockname()

    async def handle(stream: trio.SocketStream) -> None:
        await serve_connection(
            stream, handler, peer=peer_name(stream.socket), idle_timeout=idle_timeout,
            max_in_flight=max_in_flight, on_open=on_open, on_close=on_close,
        )

    async with trio.open_nursery() as nursery:
        task_status.started((sockname[0], sockname[1]))
        await trio.serve_listeners(handle, listeners, handler_nursery=nursery)
