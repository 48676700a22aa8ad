"""The metrics endpoint the broker and the name server share: Prometheus text over HTTP, on trio.

Both servers expose what they know as a Prometheus scrape (``GET /metrics``) on a port of its
own when configured (the broker's ``metricsPort``, the name server's ``metrics_port``). Each
builds a ``prometheus_client`` ``CollectorRegistry`` of its own — never the process-wide default
registry, so several nodes in one process (tests, ``trio-ha dev-cluster``) each serve their own
series — whose collectors read the node's live state when scraped. This module holds what the
two have in common, which is why it sits in the remoting layer, the lowest one both servers
stand on: the HTTP endpoint (``serve_metrics``) and the series of the remoting servers
themselves (``remoting_families``: connections open, accepted, refused, requests running).

The endpoint is a small HTTP/1.1 server of its own rather than ``prometheus_client``'s
``start_http_server``, which runs in a thread: the collectors read state the trio event loop
owns, so they must run on the loop, between its tasks, where nothing changes under them. A
scrape is one request per connection (``Connection: close``; Prometheus reconnects each scrape
at no cost that matters at scrape intervals). The peer is untrusted like every other listener's
(design card, section 7): a request head is at most ``max_request_head`` bytes, it and the
reply each get ``timeout`` seconds, a client silent for ``idle_timeout`` is closed, and
whatever a client sends or does costs only its own connection.

The endpoint has its own connection budget, apart from the remoting listeners':
``max_connections`` at once. A scrape must get through while idle or trickling (slowloris)
connections hold the budget (a few hundred slowloris or a few thousand idle connections once
made every scrape fail, as each new connection was closed at once), so the accept is fair to the
newcomer: when the budget is full, the connection that has waited longest for its request head makes
way (closed, one rate-limited log line for the lot); only when every connection is already being
answered is the newcomer closed instead. A scrape sends its head at once and is answered in
milliseconds, so under a flood it is evicted only if ``max_connections`` more connections arrive
before its head does; a held connection, idle or trickling, lasts only until ``max_connections``
newer ones come (and ``idle_timeout`` or ``timeout`` at most). Only ``GET`` and ``HEAD`` of
``/metrics`` answer with the series (a query string is ignored); any other path is 404, any other
method 405, a malformed head 400, an oversized one 431. A collector that fails answers 500 and is
logged, rate-limited: a bug in a series must not stop the node.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

import attrs
import trio
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from .._errors import TrioHAError
from .._sockets import listen_named
from ..ratelog import RateLimitedLog
from .server import RemotingServer

__all__ = ["MetricsHttpLimits", "remoting_families", "serve_metrics"]

log = logging.getLogger(__name__)

#: the reasons the endpoint answers with, by status code
_REASONS = {
    200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
    431: "Request Header Fields Too Large", 500: "Internal Server Error",
}
METRICS_PATH = "/metrics"


@attrs.frozen(kw_only=True)
class MetricsHttpLimits:
    """What one client of the metrics endpoint may make it hold."""

    #: bytes of a request's line and headers (a scrape's are a few hundred)
    max_request_head: int = attrs.field(default=8192, validator=attrs.validators.ge(64))
    #: seconds for the whole request head to arrive, and again for the reply to be taken
    timeout: float = attrs.field(default=10.0, validator=attrs.validators.gt(0))
    #: seconds a client may send nothing while its request head is unfinished
    idle_timeout: float = attrs.field(default=3.0, validator=attrs.validators.gt(0))
    #: connections open at once (the endpoint's own budget); a new one beyond it takes the
    #: place of the one that has waited longest for its request head (see the module)
    max_connections: int = attrs.field(default=32, validator=attrs.validators.ge(1))


class _HeadTooLarge(TrioHAError):
    pass


@attrs.define(eq=False)
class _MetricsEndpoint:
    registry: CollectorRegistry
    limits: MetricsHttpLimits
    #: connections holding a place in the budget (an evicted one no longer does)
    open_connections: int = 0
    #: connections still reading their request head, oldest first, by their scopes: the ones
    #: that make way for a new connection when the budget is full (cancelled to close them)
    _unfinished: dict[trio.CancelScope, None] = attrs.field(
        factory=dict[trio.CancelScope, None]
    )
    _evicted: set[trio.CancelScope] = attrs.field(factory=set[trio.CancelScope])
    #: connections closed to make room, and newcomers refused, since the last log line
    _evictions: int = 0
    _refusals: int = 0
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    async def serve_connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            if self.open_connections >= self.limits.max_connections and not self._make_room():
                self._refusals += 1
                self._log_crowding()
                return  # every place is being answered: the newcomer is closed at once
            self.open_connections += 1
            scope = trio.CancelScope()
            try:
                with scope:
                    await self._answer(stream, scope)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the client went away: only its connection ends
            finally:
                self._unfinished.pop(scope, None)
                if scope in self._evicted:
                    self._evicted.discard(scope)  # its place was given away already
                else:
                    self.open_connections -= 1

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for its request head (it ends as
        one that timed out, without a reply); False when every one is being answered."""
        for scope in self._unfinished:
            del self._unfinished[scope]
            self._evicted.add(scope)
            scope.cancel()
            self.open_connections -= 1
            self._evictions += 1
            self._log_crowding()
            return True
        return False

    def _log_crowding(self) -> None:
        if self._log.log(logging.WARNING, "crowded",
                         "metrics: more than %d connections at once: %d closed while waiting "
                         "for their request (oldest first), %d refused while all were being "
                         "answered", self.limits.max_connections, self._evictions,
                         self._refusals):
            self._evictions = self._refusals = 0

    async def _answer(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        reply = None
        self._unfinished[scope] = None
        with trio.move_on_after(self.limits.timeout):
            try:
                head = await _read_head(stream, self.limits.max_request_head,
                                        self.limits.idle_timeout)
            except _HeadTooLarge:
                reply = _reply(431, b"request head too large\n")
            else:
                if head is not None:
                    reply = self._reply_to(head)
        # a whole head came (or none will): no longer a candidate to make way
        self._unfinished.pop(scope, None)
        if reply is None:
            return  # the client closed, or was too slow, before a whole request head came
        with trio.move_on_after(self.limits.timeout):
            await stream.send_all(reply)

    def _reply_to(self, head: bytes) -> bytes:
        line = head.split(b"\n", 1)[0].rstrip(b"\r")
        parts = line.split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            return _reply(400, b"malformed request line\n")
        method, target = parts[0], parts[1]
        if method not in (b"GET", b"HEAD"):
            return _reply(405, b"only GET and HEAD\n", extra=b"Allow: GET, HEAD\r\n")
        if target.split(b"?", 1)[0] != METRICS_PATH.encode():
            return _reply(404, b"not found: the series are at /metrics\n")
        try:
            body = generate_latest(self.registry)
        except Exception as exc:
            self._log.log(logging.ERROR, ("collect", type(exc)),
                          "metrics: collecting the series failed", exc_info=exc)
            return _reply(500, b"collecting the series failed\n")
        return _reply(200, body, content_type=CONTENT_TYPE_LATEST, head_only=method == b"HEAD")


async def _read_head(stream: trio.SocketStream, limit: int, idle_timeout: float
                     ) -> bytes | None:
    """The request's line and headers (without the blank line that ends them), or None if the
    client closes first or sends nothing for ``idle_timeout`` seconds. Raises _HeadTooLarge
    past ``limit`` bytes. A body is never read: a scrape has none, and the connection closes
    after the reply."""
    buffer = bytearray()
    while True:
        for terminator in (b"\r\n\r\n", b"\n\n"):
            end = buffer.find(terminator)
            if end >= 0:
                return bytes(buffer[:end])
        room = limit + 4 - len(buffer)
        if room <= 0:
            raise _HeadTooLarge
        chunk = b""
        with trio.move_on_after(idle_timeout):
            chunk = await stream.receive_some(room)
        if not chunk:
            return None
        buffer += chunk


def _reply(status: int, body: bytes, *, content_type: str = "text/plain; charset=utf-8",
           head_only: bool = False, extra: bytes = b"") -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        f"Content-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n"
    ).encode("ascii") + extra + b"\r\n"
    return head if head_only else head + body


async def serve_metrics(
    registry: CollectorRegistry,
    *,
    host: str,
    port: int,
    limits: MetricsHttpLimits | None = None,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` as ``GET /metrics`` on ``listeners`` (bound by a caller that binds
    all its ports before it writes anything), or on ``host:port`` (port 0: the OS picks),
    until cancelled; reports the bound ``(host, port)``."""
    if not listeners:
        listeners = await listen_named(port, host, "metricsPort")
    endpoint = _MetricsEndpoint(registry, limits or MetricsHttpLimits())
    sockname = listeners[0].socket.getsockname()
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, endpoint.serve_connection, listeners)
        task_status.started((sockname[0], sockname[1]))


def remoting_families(
    servers: Mapping[str, RemotingServer], labels: Mapping[str, str]
) -> Iterator[Metric]:
    """The series of remoting servers, ``servers`` by listener name (the broker's ``main``
    and ``vip``, the name server's ``main``), each with ``labels`` and ``listener``."""
    names = [*labels, "listener"]
    connections = GaugeMetricFamily(
        "trio_ha_remoting_connections", "Remoting connections open now.", labels=names)
    accepted = CounterMetricFamily(
        "trio_ha_remoting_connections_accepted", "Remoting connections accepted.", labels=names)
    refused = CounterMetricFamily(
        "trio_ha_remoting_connections_refused",
        "Remoting connections closed as accepted: over the listener's or the process's limit.",
        labels=names)
    in_flight = GaugeMetricFamily(
        "trio_ha_remoting_requests_in_flight", "Remoting requests running now.", labels=names)
    for listener, server in servers.items():
        stats = server.statistics()
        values = [*labels.values(), listener]
        connections.add_metric(values, stats.connections)
        accepted.add_metric(values, stats.accepted)
        refused.add_metric(values, stats.refused)
        in_flight.add_metric(values, stats.requests_in_flight)
    yield from (connections, accepted, refused, in_flight)

