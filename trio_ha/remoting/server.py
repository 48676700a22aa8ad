"""RocketMQ remoting over trio: the server side — listeners, connections, shutdown.

``serve_remoting(handler, port, ...)`` (or a ``RemotingServer``) accepts connections and serves
each with a ``RemotingConnection`` (see ``connection``: requests served in the reader's round
or in a task each, replies gathered into one write, every resource bounded by
``RemotingLimits``). Here:

- **connections** are limited per listener (``max_connections``) and, for the whole process,
  to the file descriptor limit less a reserve (``limits.fd_connection_limit``), so idle
  connections cannot take the descriptors the store needs to roll a segment. A connection over
  a limit is accepted and closed at once. An accept that fails for want of descriptors or
  memory (EMFILE, ENFILE, ENOBUFS, ENOMEM) is retried after a back-off, never fatal.
- **shutdown** is graceful with a deadline (hypercorn's habit): when the server is cancelled,
  its listeners close, every connection stops reading, held requests (long-polled pulls) answer
  at once, running requests finish and replies are written — and whatever is not done after
  ``shutdown_timeout`` is cancelled and its connection closed. The connections run in a
  nursery shielded from the caller's cancellation, under that deadline, so a peer that never
  reads cannot hold the process up.
- **log lines** a peer can cause (bad frames, refusals, failing requests) are rate-limited.
"""

from __future__ import annotations

import errno
import logging
import os
import ssl
from collections import Counter
from collections.abc import Callable, Mapping

import attrs
import trio

from .._sockets import listen_named, peer_host, peer_name
from ..ratelog import RateLimitedLog
from .connection import CloseReason, FastHandler, Handler, RemotingConnection
from .limits import RemotingBudgets, RemotingLimits, fd_connection_limit
from .tls import TlsRefused, TlsServerConfig

__all__ = ["RemotingServer", "RemotingServerStatistics", "serve_remoting"]

log = logging.getLogger(__name__)

#: seconds between INFO lines about new connections to one listener (the rest go to DEBUG)
CONNECTED_LOG_INTERVAL = 60.0

#: accept errors that mean "not now" (out of descriptors or memory), not "never"
ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_MIN = 0.05
ACCEPT_RETRY_MAX = 1.0


@attrs.define(eq=False)
class _ProcessConnections:
    """Remoting connections open in this process, every server's: file descriptors are the
    process's, not one listener's."""

    count: int = 0


_PROCESS = _ProcessConnections()


@attrs.frozen
class RemotingServerStatistics:
    #: connections open now
    connections: int
    accepted: int
    #: accepted and closed at once: over max_connections or the file descriptor limit
    refused: int
    #: accepts that failed for want of descriptors or memory, and were retried
    accept_errors: int
    #: connections that ended, by CloseReason name
    closed: Mapping[str, int]
    #: encoded replies waiting to be written, all connections
    reply_bytes_pending: int
    #: request bytes buffered beyond the connections' own allowances (the shared read budget)
    request_bytes_buffered: int
    #: requests running, all connections
    requests_in_flight: int


@attrs.define(eq=False)
class RemotingServer:
    handler: Handler
    limits: RemotingLimits = attrs.field(factory=RemotingLimits)
    budgets: RemotingBudgets = attrs.field(
        default=attrs.Factory(lambda self: RemotingBudgets.for_limits(self.limits),
                              takes_self=True)
    )
    on_open: Callable[[RemotingConnection], None] | None = None
    on_close: Callable[[RemotingConnection], None] | None = None
    #: serves the requests that need no task of their own (``FastHandler``)
    fast: FastHandler | None = None
    #: runs in a connection's reader each time it has served the requests of one read,
    #: before their replies are written: where work those requests began is best finished
    #: at once, batched per read (a broker sends the round's puts to its slaves); must not
    #: raise or wait
    after_round: Callable[[], None] | None = None
    #: TLS (``tls.server.mode`` and its files); None or disabled: plain connections only
    tls: TlsServerConfig | None = None
    _tls: tuple[TlsServerConfig, ssl.SSLContext] | None = attrs.field(init=False, default=None)
    connections: set[RemotingConnection] = attrs.field(factory=set[RemotingConnection])
    _accepted: int = 0
    _refused: int = 0
    _accept_errors: int = 0
    _closed: Counter[str] = attrs.field(factory=Counter[str])
    _connections_scope: trio.CancelScope | None = None
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    _connected_log: RateLimitedLog = attrs.field(
        factory=lambda: RateLimitedLog(log, interval=CONNECTED_LOG_INTERVAL))

    def __attrs_post_init__(self) -> None:
        if self.tls is not None and self.tls.enabled:
            self._tls = (self.tls, self.tls.context())

    def statistics(self) -> RemotingServerStatistics:
        return RemotingServerStatistics(
            connections=len(self.connections), accepted=self._accepted, refused=self._refused,
            accept_errors=self._accept_errors, closed=dict(self._closed),
            reply_bytes_pending=self.budgets.replies.used,
            request_bytes_buffered=self.budgets.requests.used,
            requests_in_flight=sum(c.in_flight for c in self.connections),
        )

    async def serve(
        self,
        port: int = 0,
        *,
        host: str | None = None,
        listeners: list[trio.SocketListener] | None = None,
        task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Listen on ``host:port`` (port 0: the OS picks), or on ``listeners`` already bound,
        until cancelled; reports the bound ``(host, port)``. Cancelling it shuts down within
        ``limits.shutdown_timeout``."""
        if listeners is None:
            listeners = await listen_named(port, host, "listenPort")
        sockname = listeners[0].socket.getsockname()
        stopping = trio.Event()
        async with trio.open_nursery() as nursery:
            connections: trio.Nursery = await nursery.start(self._run_connections, stopping)
            task_status.started((sockname[0], sockname[1]))
            try:
                async with trio.open_nursery() as accepting:
                    for listener in listeners:
                        accepting.start_soon(self._accept, listener, connections)
            finally:
                with trio.CancelScope(shield=True):
                    for listener in listeners:
                        await listener.aclose()
                self._shut_down(stopping)

    async def _run_connections(
        self, stopping: trio.Event, task_status: trio.TaskStatus[trio.Nursery]
    ) -> None:
        """The connections' nursery, shielded from the caller's cancellation: at shutdown they
        get ``shutdown_timeout`` to finish (the scope's deadline), not nothing."""
        with trio.CancelScope(shield=True) as scope:
            self._connections_scope = scope
            async with trio.open_nursery() as nursery:
                task_status.started(nursery)
                await stopping.wait()

    def _shut_down(self, stopping: trio.Event) -> None:
        if self._connections_scope is not None:
            self._connections_scope.deadline = trio.current_time() + self.limits.shutdown_timeout
        for connection in list(self.connections):
            connection.drain()
        stopping.set()

    async def _accept(self, listener: trio.SocketListener, connections: trio.Nursery) -> None:
        name = _listener_name(listener)
        open_here = 0
        backoff = ACCEPT_RETRY_MIN

        def closed(connection: RemotingConnection) -> None:
            nonlocal open_here
            open_here -= 1
            _PROCESS.count -= 1
            self.connections.discard(connection)
            self._closed[(connection.close_reason or CloseReason.SHUTDOWN).name] += 1

        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in ACCEPT_CAPACITY_ERRNOS:
                    raise
                self._accept_errors += 1
                self._log.log(logging.WARNING, ("accept", name, exc.errno),
                              "remoting: accepting on %s failed: %s; retrying in %g s",
                              name, os.strerror(exc.errno or 0), backoff)
                await trio.sleep(backoff)
                backoff = min(backoff * 2, ACCEPT_RETRY_MAX)
                continue
            backoff = ACCEPT_RETRY_MIN
            limit = self.limits.max_connections
            fd_limit = fd_connection_limit()
            if open_here >= limit or (fd_limit is not None and _PROCESS.count >= fd_limit):
                self._refused += 1
                why = (f"{open_here} connections, the listener's limit" if open_here >= limit
                       else f"{_PROCESS.count} connections in the process, the limit its "
                            "file descriptors allow")
                self._log.log(logging.WARNING, ("refused", name),
                              "remoting: refusing a connection from %s on %s: %s",
                              peer_name(stream.socket), name, why)
                await trio.aclose_forcefully(stream)
                continue
            self._accepted += 1
            open_here += 1
            _PROCESS.count += 1
            connection = RemotingConnection(stream, peer_name(stream.socket), self.limits,
                                            self.budgets)
            self.connections.add(connection)  # now, so a shutdown from here on drains it
            connections.start_soon(self._serve_one, connection, name, closed)

    async def _serve_one(self, connection: RemotingConnection, name: str,
                         closed: Callable[[RemotingConnection], None]) -> None:
        # Every connection at DEBUG (RocketMQ logs channelActive for each); at INFO one line
        # per minute and listener, with the count of those since: a tool that connects every
        # second (`status --watch 1`) made 855 of a name server's 874 lines.
        if not self._connected_log.log(logging.INFO, name, "remoting: %s connected to %s",
                                       connection.peer, name):
            log.debug("remoting: %s connected to %s", connection.peer, name)
        try:
            if self._tls is not None:
                tls, context = self._tls
                assert isinstance(connection.stream, trio.SocketStream)
                try:
                    connection.use_stream(await tls.secure(
                        connection.stream, context, self.limits.request_timeout))
                except TlsRefused as exc:
                    connection.close(CloseReason.TLS, exc)
                    self._log.log(logging.WARNING, ("tls", peer_host(connection.peer)),
                                  "remoting: closing %s: %s", connection.peer, exc)
                    await trio.aclose_forcefully(connection.stream)
                    return
            await connection.serve(self.handler, fast=self.fast, on_open=self.on_open,
                                   on_close=self.on_close, after_round=self.after_round)
        finally:
            closed(connection)


def _listener_name(listener: trio.SocketListener) -> str:
    try:
        host, port = listener.socket.getsockname()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


async def serve_remoting(
    handler: Handler,
    port: int,
    *,
    host: str | None = None,
    limits: RemotingLimits | None = None,
    budgets: RemotingBudgets | None = None,
    on_open: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``host:port`` (port 0: the OS picks), or on ``listeners`` already bound,
    and serve every connection with ``handler`` under ``limits``; reports the bound
    ``(host, port)``. ``budgets`` lets servers share their byte budgets."""
    limits = limits or RemotingLimits()
    server = RemotingServer(handler, limits, budgets or RemotingBudgets.for_limits(limits),
                            on_open, on_close)
    await server.serve(port, host=host, listeners=listeners, task_status=task_status)
