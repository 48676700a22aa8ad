"""A fault-injecting TCP proxy for replication (public through :mod:`trio_ha.testing`).

Put a :class:`FaultProxy` between a slave and its master (the slave's ``ha_master_address``
is the proxy's address) and break the link on purpose while the two replicate::

    async with open_fault_proxy(master.ha_address) as proxy:
        slave_config = attrs.evolve(config, ha_master_address=proxy.address_text)
        ...
        proxy.stall()                          # stop forwarding, both ways (a dead network)
        proxy.resume()
        cut = await proxy.cut_mid_frame(100)   # close both sides 100 bytes into a frame body
        proxy.set_delay(0.002, max_chunk=700)  # forward in small, late pieces

The proxy knows the classic HA framing (master -> slave ``offset:8 size:4 body``), so a cut
can land at an exact place inside a frame: that is where a byte-based replication protocol
is fragile (RocketMQ's slave keeps half a record; ours must resume from the exact byte).

Nothing here is used by the store; it is for tests (of this package, and of applications
that embed it). Every forwarding task lives in the proxy's nursery: leaving
``open_fault_proxy`` closes every proxied connection.
"""

from __future__ import annotations

import contextlib
import random

import attrs
import trio

from ..wire.ha import FRAME_HEADER

__all__ = ["Cut", "FaultProxy", "ProxyConnection", "open_fault_proxy"]

_RECEIVE_SIZE = 64 * 1024


@attrs.frozen
class Cut:
    """Where the proxy cut a connection, in the master -> slave byte stream."""

    #: which connection (1 = the first the proxy accepted)
    connection: int
    #: master -> slave bytes forwarded on that connection before the cut
    stream_offset: int
    #: the frame being cut: its log offset and body size (None: cut at a raw byte count
    #: before any header was complete)
    frame_offset: int | None
    frame_size: int | None
    #: bytes of that frame's header (0-12) and body that got through
    header_bytes: int
    body_bytes: int


class _FrameCursor:
    """Follows the master -> slave stream frame by frame: where each byte falls."""

    def __init__(self) -> None:
        self.header = bytearray()
        self.frame: tuple[int, int] | None = None  # (offset, size) of the frame in progress
        self.body_done = 0

    def advance(self, n: int, data: bytes | memoryview) -> None:
        """``data[:n]`` went through."""
        view = memoryview(data)[:n]
        while view:
            if self.frame is None:
                take = min(len(view), FRAME_HEADER.size - len(self.header))
                self.header += view[:take]
                view = view[take:]
                if len(self.header) == FRAME_HEADER.size:
                    offset, size = FRAME_HEADER.unpack(self.header)
                    self.header.clear()
                    self.body_done = 0
                    self.frame = (offset, size) if size > 0 else None
            else:
                take = min(len(view), self.frame[1] - self.body_done)
                self.body_done += take
                view = view[take:]
                if self.body_done == self.frame[1]:
                    self.frame = None
                    self.body_done = 0

    def find_cut(self, data, *, into_body: int | None, into_header: int | None) -> int | None:
        """How many bytes of ``data`` (the next bytes of the stream) to forward so that the
        stream stops exactly ``into_body`` bytes into the body of a data frame longer than
        that, or ``into_header`` bytes into a frame header; None if that point is not in
        ``data``."""
        probe = _FrameCursor()
        probe.header = bytearray(self.header)
        probe.frame = self.frame
        probe.body_done = self.body_done
        view = memoryview(data)
        position = 0
        while True:
            remaining = len(view) - position
            if probe.frame is None:
                have = len(probe.header)
                if into_header is not None and have <= into_header:
                    need = into_header - have
                    return position + need if need <= remaining else None
                step = min(remaining, FRAME_HEADER.size - have)
            else:
                size = probe.frame[1]
                if into_body is not None and size > into_body and probe.body_done <= into_body:
                    need = into_body - probe.body_done
                    return position + need if need <= remaining else None
                step = min(remaining, size - probe.body_done)
            if step == 0:
                return None
            probe.advance(step, view[position : position + step])
            position += step


@attrs.define(eq=False)
class ProxyConnection:
    """One proxied connection: ``client`` is the side that connected to the proxy (the
    slave), ``server`` the side the proxy connected to (the master)."""

    number: int
    client: trio.SocketStream
    server: trio.SocketStream | None = None
    #: ``ip:port`` of the proxy's end of the server connection: the peer address the server
    #: (the master) sees for this connection
    server_address: str | None = None
    #: bytes forwarded client -> server and server -> client
    bytes_up: int = 0
    bytes_down: int = 0
    closed: bool = False
    #: why it ended: "client closed", "server closed", "cut", "error: ...", "proxy closed"
    end_reason: str | None = None
    _cursor: _FrameCursor = attrs.field(factory=_FrameCursor)
    _scope: trio.CancelScope | None = None

    def close(self, reason: str = "cut") -> None:
        """End this connection now (both sides)."""
        if self.end_reason is None:
            self.end_reason = reason
        if self._scope is not None:
            self._scope.cancel()


@attrs.define(eq=False)
class _PendingCut:
    into_body: int | None
    into_header: int | None
    raw_bytes: int | None
    done: trio.Event = attrs.field(factory=trio.Event)
    result: Cut | None = None


class FaultProxy:
    """A loopback TCP proxy to ``target`` that injects faults on demand.

    - :meth:`stall` / :meth:`resume`: stop forwarding in both directions (bytes pile up in
      the kernel's buffers and back-pressure reaches both peers; a close is held back too),
      then carry on as if nothing happened.
    - :meth:`cut_mid_frame`, :meth:`cut_mid_header`, :meth:`cut_after`: forward exactly up to
      a point of the master -> slave stream, then close both sides of that connection.
    - :meth:`set_delay`: forward each chunk after a delay, in chunks of at most
      ``max_chunk`` bytes (random sizes from a seeded generator), so frames arrive in odd
      pieces.
    - :meth:`close_all`: close every live connection.

    ``accepted`` counts the connections made to the proxy; ``connections`` keeps them all.
    """

    def __init__(self, target: tuple[str, int], *, seed: int = 0, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.target = (target[0], target[1])
        self.host = host
        self.port = port
        self.address: tuple[str, int] | None = None
        self.accepted = 0
        self.connections: list[ProxyConnection] = []
        self.cuts: list[Cut] = []
        self._flowing = trio.Event()
        self._flowing.set()
        self._delay = 0.0
        self._max_chunk: int | None = None
        self._random = random.Random(seed)
        self._pending_cut: _PendingCut | None = None

    # ---- control -------------------------------------------------------------------------

    @property
    def address_text(self) -> str:
        """``ip:port`` of the proxy, for ``ha_master_address``."""
        if self.address is None:
            raise RuntimeError("the proxy is not serving yet")
        return f"{self.address[0]}:{self.address[1]}"

    @property
    def stalled(self) -> bool:
        return not self._flowing.is_set()

    @property
    def live_connections(self) -> list[ProxyConnection]:
        return [c for c in self.connections if not c.closed]

    def stall(self) -> None:
        """Stop forwarding (both directions, every connection, new ones too)."""
        if self._flowing.is_set():
            self._flowing = trio.Event()

    def resume(self) -> None:
        self._flowing.set()

    def set_delay(self, delay: float, *, max_chunk: int | None = None) -> None:
        """Forward every chunk ``delay`` seconds late, chunks of at most ``max_chunk`` bytes
        (None: whatever one receive gives). ``set_delay(0)`` turns it off."""
        if delay < 0 or (max_chunk is not None and max_chunk < 1):
            raise ValueError("delay must be >= 0 and max_chunk >= 1")
        self._delay = delay
        self._max_chunk = max_chunk

    def close_all(self, reason: str = "cut") -> None:
        for connection in self.live_connections:
            connection.close(reason)

    async def cut_mid_frame(self, body_bytes: int) -> Cut:
        """Close the next connection whose master -> slave stream reaches a data frame with
        a body longer than ``body_bytes``, exactly ``body_bytes`` into that body (0: right
        after its header). Returns once the cut happened (wrap it in a timeout)."""
        if body_bytes < 0:
            raise ValueError("body_bytes must be >= 0")
        return await self._cut(_PendingCut(into_body=body_bytes, into_header=None, raw_bytes=None))

    async def cut_mid_header(self, header_bytes: int) -> Cut:
        """Close the next connection ``header_bytes`` (1-11) into a frame header."""
        if not 0 < header_bytes < FRAME_HEADER.size:
            raise ValueError("header_bytes must be within 1..11")
        return await self._cut(
            _PendingCut(into_body=None, into_header=header_bytes, raw_bytes=None)
        )

    async def cut_after(self, n: int) -> Cut:
        """Close the next connection to carry ``n`` more master -> slave bytes, right after
        them."""
        if n < 1:
            raise ValueError("n must be >= 1")
        return await self._cut(_PendingCut(into_body=None, into_header=None, raw_bytes=n))

    async def _cut(self, pending: _PendingCut) -> Cut:
        if self._pending_cut is not None:
            raise RuntimeError("a cut is already armed")
        self._pending_cut = pending
        try:
            await pending.done.wait()
        finally:
            if self._pending_cut is pending:
                self._pending_cut = None
        assert pending.result is not None
        return pending.result

    # ---- serving -------------------------------------------------------------------------

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        sockname = listeners[0].socket.getsockname()
        self.address = (sockname[0], sockname[1])
        task_status.started(self.address)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        self.accepted += 1
        connection = ProxyConnection(self.accepted, client)
        self.connections.append(connection)
        try:
            with trio.CancelScope() as scope:
                connection._scope = scope
                try:
                    # From the proxy's own address, so a test host's rules can tell the
                    # proxied link from other traffic of the same machine.
                    connection.server = await trio.open_tcp_stream(
                        *self.target, local_address=self.host)
                    host, port = connection.server.socket.getsockname()[:2]
                    connection.server_address = f"{host}:{port}"
                except OSError as exc:
                    connection.end_reason = f"error: connecting to the target: {exc}"
                    return
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._pump_up, connection, nursery.cancel_scope)
                    nursery.start_soon(self._pump_down, connection, nursery.cancel_scope)
            if connection.end_reason is None:
                connection.end_reason = "proxy closed"
        finally:
            connection.closed = True
            with trio.CancelScope(shield=True):
                if connection.server is not None:
                    await connection.server.aclose()
                await client.aclose()

    async def _receive(self, stream: trio.SocketStream) -> bytes:
        size = _RECEIVE_SIZE
        if self._max_chunk is not None:
            size = self._random.randint(1, self._max_chunk)
        try:
            return await stream.receive_some(size)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            return b""

    async def _gate(self) -> None:
        """Hold data (and closes) while stalled; apply the delay."""
        while not self._flowing.is_set():
            await self._flowing.wait()
        if self._delay:
            await trio.sleep(self._delay)

    async def _send(self, connection: ProxyConnection, stream: trio.SocketStream, data) -> bool:
        try:
            await stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            if connection.end_reason is None:
                connection.end_reason = f"error: {exc!r}"
            return False
        return True

    async def _pump_up(self, connection: ProxyConnection, scope: trio.CancelScope) -> None:
        """slave -> master: reports."""
        server = connection.server
        assert server is not None  # the pumps start once the target answered
        while True:
            data = await self._receive(connection.client)
            await self._gate()
            if not data:
                if connection.end_reason is None:
                    connection.end_reason = "client closed"
                break
            if not await self._send(connection, server, data):
                break
            connection.bytes_up += len(data)
        scope.cancel()

    async def _pump_down(self, connection: ProxyConnection, scope: trio.CancelScope) -> None:
        """master -> slave: frames; where cuts happen."""
        server = connection.server
        assert server is not None  # the pumps start once the target answered
        while True:
            data = await self._receive(server)
            await self._gate()
            if not data:
                if connection.end_reason is None:
                    connection.end_reason = "server closed"
                break
            pending = self._pending_cut
            cut_at = None
            if pending is not None and not pending.done.is_set():
                if pending.raw_bytes is not None:
                    cut_at = pending.raw_bytes if pending.raw_bytes <= len(data) else None
                    if cut_at is None:
                        pending.raw_bytes -= len(data)
                else:
                    cut_at = connection._cursor.find_cut(
                        data, into_body=pending.into_body, into_header=pending.into_header
                    )
            if cut_at is not None:
                data = data[:cut_at]
            if data and not await self._send(connection, connection.client, data):
                break
            connection._cursor.advance(len(data), data)
            connection.bytes_down += len(data)
            if cut_at is not None:
                assert pending is not None  # a cut point comes from the pending cut
                cursor = connection._cursor
                frame = cursor.frame
                header = bytes(cursor.header)
                if frame is None and len(header) >= 8:
                    frame_offset = int.from_bytes(header[:8], "big", signed=True)
                else:
                    frame_offset = frame[0] if frame is not None else None
                cut = Cut(
                    connection=connection.number,
                    stream_offset=connection.bytes_down,
                    frame_offset=frame_offset,
                    frame_size=frame[1] if frame is not None else None,
                    header_bytes=len(header) if frame is None else FRAME_HEADER.size,
                    body_bytes=cursor.body_done if frame is not None else 0,
                )
                self.cuts.append(cut)
                pending.result = cut
                pending.done.set()
                connection.end_reason = "cut"
                break
        scope.cancel()


@contextlib.asynccontextmanager
async def open_fault_proxy(target: tuple[str, int], *, seed: int = 0,
                           host: str = "127.0.0.1", port: int = 0):
    """Run a :class:`FaultProxy` to ``target`` (``(host, port)``) for the block, listening
    on ``host``:``port`` (0: any free port) and connecting from ``host``."""
    proxy = FaultProxy(target, seed=seed, host=host, port=port)
    async with trio.open_nursery() as nursery:
        await nursery.start(proxy.serve)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
