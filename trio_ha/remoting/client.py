"""RocketMQ remoting over trio: the client side.

``RemotingClient`` is one connection, served by a reader and a writer task in one nursery
(``run``): either failing ends the connection, fails every waiting call and cancels the other.
The reader matches responses to waiting calls by ``opaque``, so any number of calls (long-polled
pulls among them) share the connection and complete in any order. Every call has its own
timeout; a call that times out simply stops waiting (its late reply is dropped), unlike
RocketMQ's Java client, which gives up on the whole connection. ``RemotingClientPool`` keeps one
client per address and reconnects when a connection breaks.

Why a writer task. A call does not write its request itself: it queues the encoded frame and
waits for its response. The writer wakes once per scheduling round and writes every frame
queued by then in one ``send`` (whole frames, in order, so they never interleave). Sixteen
producer tasks sharing a connection make one system call a round instead of sixteen, and no
call holds a lock or a shielded scope around a socket write (a profile of 16 producers put
about a tenth of the client's time there).

A call may ask for its frame to go out at once instead (``flush=True``, Netty's
``writeAndFlush`` to the default's ``write``): when nothing is queued or being written, the
caller writes it itself (non-blocking; what the socket does not take goes to the writer,
ahead of anything queued after it). Pulls do: their answers are large and their callers busy
with them, so four pulls answered together would otherwise go back together only after all
four bodies are decoded — the broker idle meanwhile; flushed, each is on its way while the
next body decodes (``bench consume`` shows it). Sends do not: sixteen producers' frames
gathered into one write cost the broker fewer reads and rounds than sixteen writes. A lone call —
none other waiting on the connection — is flushed too: no other frame is coming to share the
writer's next write.

Why not always the round's end. Gathering a whole round into one write puts sixteen producers
in lockstep: the client builds all sixteen frames while the broker idles, then the broker and
its slave work on them while the client idles, and two cores do the work of one. So once
WRITE_EARLY bytes are queued, the caller that crossed the mark writes them itself
(non-blocking): the broker starts on the first frames while the client builds the rest. With
16 producers and 1 KiB sends (about 22 KB a round) that is two writes a round instead of one:
more sends a second, for a little more broker CPU per send (more, smaller reads and
replication frames). The figures behind these three choices are in docs/performance.md,
*Small costs that shaped the code*.

Why a timer task for timeouts. A call's timeout could be a cancel scope around its wait, but
a scope with a deadline costs more to enter and leave than formatting the request does. So a call
with a deadline puts (deadline, opaque) on the connection's heap, and one timer task answers the
calls still waiting when their deadlines come (``_run_timer``); it sleeps until the earliest, and is
woken earlier only when a call comes with an earlier deadline than any before it (sends with one
timeout come in deadline order: never). Answered calls leave the heap when they reach its front. A
call with neither timeout nor deadline waits as long as its caller's own scope lets it (a consumer's
pull, under the pull's deadline).

A server may send requests of its own on the connection (a broker's oneway
NOTIFY_CONSUMER_IDS_CHANGED, CHECK_TRANSACTION_STATE). The reader hands each to
``on_request(address, request)``, a plain function that must not block; without one they are
dropped.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import ssl
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

import attrs
import trio

from .._errors import TrioHAError, unwrap_single_exception
from .._sockets import receive_from, socket_fd, write_now
from ..config import ConfigError
from ..wire.acl import Credentials, sign
from ..wire.errors import RemotingDecodeError
from ..wire.layout import INT32_MAX
from ..wire.record import parse_host_port
from ..wire.remoting import NEED_DATA, FrameDecoder, RemotingCommand, RemotingFlag, encode
from .tls import TlsClientConfig

log = logging.getLogger(__name__)

RECEIVE_SIZE = 256 * 1024
#: the writer joins queued frames into one write up to this size (a larger frame goes alone,
#: without a copy)
WRITE_BATCH = 256 * 1024
#: queued frames are written at once, not at the round's end, when they reach this many bytes
#: (see the module's docstring): about half the frames sixteen 1 KiB sends queue in a round
WRITE_EARLY = 16 * 1024
#: the most frames one gathered write takes
MAX_IOV = 512
#: oneway requests (which wait for no response) wait while this many bytes are unwritten:
#: a server that stops reading cannot make the client buffer without bound
ONEWAY_HIGH_WATER = 4 * 1024 * 1024


class RemotingError(TrioHAError):
    """A remote call failed: no connection, the connection broke, or it timed out."""


class RemotingTimeout(RemotingError):
    pass


class RemotingConnectError(RemotingError):
    pass


_opaques = itertools.count(1)


def _next_opaque() -> int:
    """A request id for ``opaque``: a Java int, kept non-negative as the counter wraps."""
    return next(_opaques) & INT32_MAX


class PreparedRequest(Protocol):
    """A request that encodes its own frame (``wire.remoting.SendRequest``)."""

    @property
    def code(self) -> int: ...

    def command(self) -> RemotingCommand: ...

    def frame(self, opaque: int) -> bytes: ...


@attrs.define(eq=False)
class _Call:
    event: trio.Event = attrs.field(factory=trio.Event)
    response: RemotingCommand | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class RemotingClient:
    address: str
    stream: trio.abc.Stream
    #: what the reader does with a request the server sends (see the module's docstring)
    on_request: Callable[[str, RemotingCommand], None] | None = None
    #: an ACL account: every request goes out signed with it (``trio_ha.wire.acl.sign``)
    credentials: Credentials | None = None
    _pending: dict[int, _Call] = attrs.field(factory=dict[int, _Call])
    #: encoded frames for the writer, and their size
    _outbox: list[bytes | memoryview] = attrs.field(factory=list[bytes | memoryview])
    _outbox_bytes: int = 0
    _writer_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _room_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    closed: bool = False
    error: BaseException | None = None
    #: the socket's descriptor for a caller's own write (-1: the stream is not a socket)
    _fd: int = attrs.field(init=False, default=-1)
    #: the writer is in a send: nobody else may write
    _writing: bool = False
    #: (deadline, opaque) of the calls that have one, a heap; answered ones are dropped when
    #: they reach the front (``_run_timer``)
    _deadlines: list[tuple[float, int]] = attrs.field(factory=list[tuple[float, int]])
    #: when the timer task wakes next (inf: when a deadline comes), its sleep, and its wait
    _timer_at: float = math.inf
    _timer_sleep: trio.CancelScope | None = None
    _timer_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def __attrs_post_init__(self) -> None:
        self._fd = socket_fd(self.stream)

    def _queue(self, data: bytes, flush: bool = False) -> None:
        """Hand one frame to the writer; with ``flush``, write it now if nothing is queued or
        being written (what the socket does not take goes to the writer)."""
        if self.closed:
            raise RemotingError(f"connection to {self.address} is closed: {self.error}")
        if flush and self._fd >= 0 and not (self._outbox or self._writing):
            sent = write_now(self._fd, (data,))
            if sent == len(data):
                return
            data = data[sent:]
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_bytes >= WRITE_EARLY:
            self._write_queued_now()
        if self._outbox and self._writer_lot:
            self._writer_lot.unpark()

    def _write_queued_now(self) -> None:
        """Write the queued frames now in one non-blocking gathered write, unless the writer is
        in a write; what the socket does not take stays queued, in order, for the writer."""
        if self._fd < 0 or self._writing:
            return
        frames = self._outbox
        count = min(len(frames), MAX_IOV)
        sent = write_now(self._fd, frames[:count])
        self._outbox_bytes -= sent
        done = 0
        while done < count and sent >= len(frames[done]):
            sent -= len(frames[done])
            done += 1
        if sent:  # a frame cut short: its tail goes first, without a copy
            frames[done] = memoryview(frames[done])[sent:]
        del frames[:done]
        if self._room_lot and self._outbox_bytes < ONEWAY_HIGH_WATER:
            self._room_lot.unpark_all()

    async def invoke(self, request: RemotingCommand | PreparedRequest,
                     timeout: float | None = None, *, deadline: float | None = None,
                     flush: bool = False) -> RemotingCommand:
        """Send ``request`` and wait for its response at most ``timeout`` seconds, or until
        ``deadline`` (trio time), whichever comes first; ``RemotingTimeout`` then. With
        neither, as long as the caller's own cancel scope lets it (a timeout is then the
        caller's to report). ``flush``: write it at once rather than with the round's other
        frames. A ``PreparedRequest`` is encoded by itself once its opaque is known (a
        send's fast path), or made a command first where one is needed (to sign it)."""
        if isinstance(request, RemotingCommand):
            command, prepared = request, None
        elif self.credentials is not None:
            command, prepared = request.command(), None
        else:
            command, prepared = None, request
        if command is not None and self.credentials is not None:
            command = sign(command, self.credentials)
        if timeout is not None:
            ends = trio.current_time() + timeout
            deadline = ends if deadline is None else min(deadline, ends)
        opaque = _next_opaque()
        call = _Call()
        # A lone call (none other waiting on this connection) goes out at once: no other
        # frame is coming to share the writer's next write.
        flush = flush or not self._pending
        self._pending[opaque] = call
        try:
            if prepared is not None:
                self._queue(prepared.frame(opaque), flush)
            else:
                assert command is not None
                self._queue(encode(command, opaque=opaque), flush)
            if deadline is not None:
                self._add_deadline(deadline, opaque)
            await call.event.wait()
            if call.error is not None:
                raise RemotingError(f"connection to {self.address} broke: {call.error}")
            if call.response is None:
                waited = (f"{timeout:g} s" if timeout is not None
                          else "the caller's deadline")
                raise RemotingTimeout(
                    f"no response from {self.address} to request {request.code} "
                    f"within {waited}"
                )
            return call.response
        finally:
            self._pending.pop(opaque, None)
            deadlines = self._deadlines
            while deadlines and deadlines[0][1] not in self._pending:
                heapq.heappop(deadlines)  # answered (this call, or others before it)

    def _add_deadline(self, deadline: float, opaque: int) -> None:
        heapq.heappush(self._deadlines, (deadline, opaque))
        if deadline < self._timer_at:  # earlier than the timer's wake-up: move it
            self._timer_at = deadline
            if self._timer_sleep is not None:
                self._timer_sleep.deadline = deadline
            else:
                self._timer_lot.unpark()

    async def _run_timer(self) -> None:
        """Answer each call still waiting at its deadline (it raises RemotingTimeout)."""
        deadlines, pending = self._deadlines, self._pending
        while True:
            now = trio.current_time()
            while deadlines and (deadlines[0][0] <= now or deadlines[0][1] not in pending):
                _, opaque = heapq.heappop(deadlines)
                call = pending.get(opaque)
                if call is not None:
                    call.event.set()  # with no response: timed out
            if not deadlines:
                self._timer_at = math.inf
                await self._timer_lot.park()
                continue
            self._timer_at = deadlines[0][0]
            with trio.CancelScope(deadline=self._timer_at) as self._timer_sleep:
                await trio.sleep_forever()
            self._timer_sleep = None

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        """Queue ``request`` with the ONEWAY flag; returns once it is queued (waiting first
        while ONEWAY_HIGH_WATER bytes are unwritten). Nothing says whether it arrived."""
        await trio.lowlevel.checkpoint()
        while self._outbox_bytes >= ONEWAY_HIGH_WATER and not self.closed:
            await self._room_lot.park()
        request = attrs.evolve(request, flag=request.flag | RemotingFlag.ONEWAY)
        if self.credentials is not None:
            request = sign(request, self.credentials)
        self._queue(encode(request, opaque=_next_opaque()))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the connection: its reader, its writer and its timer, until the reader or
        the writer ends it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_writer, nursery.cancel_scope)
            nursery.start_soon(self._run_timer)
            task_status.started()
            await self._run_reader()
            nursery.cancel_scope.cancel()

    async def _run_writer(self, scope: trio.CancelScope) -> None:
        try:
            while True:
                if not self._outbox:
                    await self._writer_lot.park()
                    continue
                # Whole frames from the front, up to WRITE_BATCH (at least one).
                frames = self._outbox
                count, size = 1, len(frames[0])
                while count < len(frames) and size + len(frames[count]) <= WRITE_BATCH:
                    size += len(frames[count])
                    count += 1
                data = frames[0] if count == 1 else b"".join(frames[:count])
                del frames[:count]
                self._writing = True
                try:
                    await self.stream.send_all(data)
                finally:
                    self._writing = False
                self._outbox_bytes -= len(data)
                if self._outbox_bytes < ONEWAY_HIGH_WATER:
                    self._room_lot.unpark_all()
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail(RemotingError(f"sending to {self.address} failed: {exc}"))
            scope.cancel()

    async def _run_reader(self) -> None:
        decoder = FrameDecoder()
        try:
            while True:
                data = await receive_from(self.stream, RECEIVE_SIZE)
                if not data:
                    raise RemotingError("the server closed the connection")
                decoder.receive_data(data)
                while (command := decoder.next_command()) is not NEED_DATA:
                    if not command.is_response:
                        if self.on_request is not None:
                            self.on_request(self.address, command)
                        continue
                    call = self._pending.get(command.opaque)
                    if call is not None:
                        call.response = command
                        call.event.set()
        except (RemotingError, RemotingDecodeError, trio.BrokenResourceError,
                trio.ClosedResourceError, OSError) as exc:
            self._fail(exc)
            await trio.aclose_forcefully(self.stream)  # the socket, not only the calls

    def _fail(self, exc: BaseException, *, by_us: bool = False) -> None:
        if not self.closed and not by_us:
            log.info("remoting: connection to %s ended: %s", self.address, exc)
        self.closed = True
        self.error = exc
        self._outbox.clear()
        self._outbox_bytes = 0
        self._room_lot.unpark_all()
        for call in self._pending.values():
            call.error = exc
            call.event.set()

    async def aclose(self) -> None:
        self._fail(RemotingError("closed"), by_us=True)
        with trio.CancelScope(shield=True):
            await self.stream.aclose()


async def _connect(address: str, timeout: float, tls: TlsClientConfig | None,
                   context: ssl.SSLContext | None) -> trio.abc.Stream:
    """A stream to ``address``: TCP, with TLS over it when ``tls`` is enabled; the whole of
    it within ``timeout``."""
    host, port = parse_host_port(address)
    try:
        with trio.fail_after(timeout):
            stream = await trio.open_tcp_stream(host, port)
            if tls is not None and tls.enable:
                try:
                    return await tls.wrap(stream, context or tls.context(), host)
                except BaseException:
                    await trio.aclose_forcefully(stream)
                    raise
            return stream
    except trio.TooSlowError:
        raise RemotingConnectError(f"connecting to {address} timed out") from None
    except trio.BrokenResourceError as exc:  # the TLS handshake failed
        raise RemotingConnectError(
            f"TLS with {address} failed: {exc.__cause__ or exc}") from exc
    except OSError as exc:
        raise RemotingConnectError(f"cannot connect to {address}: {exc}") from exc


@contextlib.asynccontextmanager
async def open_remoting_client(
    address: str, *, connect_timeout: float = 3.0, credentials: Credentials | None = None,
    tls: TlsClientConfig | None = None,
) -> AsyncGenerator[RemotingClient, None]:
    """A connected RemotingClient whose reader runs until the block ends."""
    try:
        context = tls.context() if tls is not None and tls.enable else None
    except ConfigError as exc:
        raise RemotingConnectError(f"cannot connect to {address}: {exc}") from None
    stream = await _connect(address, connect_timeout, tls, context)
    client = RemotingClient(address, stream, credentials=credentials)
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            await nursery.start(client.run)
            try:
                yield client
            finally:
                await client.aclose()
                nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class RemotingClientPool:
    """One connection per address, made on first use and remade after it breaks."""

    nursery: trio.Nursery
    connect_timeout: float = 3.0
    #: given to every connection (``RemotingClient.on_request``)
    on_request: Callable[[str, RemotingCommand], None] | None = None
    #: given to every connection: its requests go out signed (``RemotingClient.credentials``)
    credentials: Credentials | None = None
    #: with ``enable``: every connection is TLS (RocketMQ's tls.enable)
    tls: TlsClientConfig | None = None
    _tls_context: ssl.SSLContext | None = None
    _clients: dict[str, RemotingClient] = attrs.field(factory=dict[str, RemotingClient])
    _connecting: dict[str, trio.Lock] = attrs.field(factory=dict[str, trio.Lock])

    def connected(self, address: str) -> RemotingClient | None:
        """The open connection to ``address``, if there is one (no wait, no checkpoint)."""
        client = self._clients.get(address)
        return client if client is not None and not client.closed else None

    async def client(self, address: str) -> RemotingClient:
        client = self.connected(address)
        if client is not None:
            return client
        lock = self._connecting.setdefault(address, trio.Lock())
        async with lock:
            client = self.connected(address)
            if client is not None:
                return client
            if self.tls is not None and self.tls.enable and self._tls_context is None:
                try:
                    self._tls_context = self.tls.context()
                except ConfigError as exc:
                    raise RemotingConnectError(f"cannot connect to {address}: {exc}") from None
            stream = await _connect(address, self.connect_timeout, self.tls, self._tls_context)
            client = RemotingClient(address, stream, self.on_request, self.credentials)
            await self.nursery.start(client.run)
            self._clients[address] = client
            return client

    async def invoke(
        self, address: str, request: RemotingCommand, timeout: float
    ) -> RemotingCommand:
        client = await self.client(address)
        return await client.invoke(request, timeout)

    async def invoke_oneway(self, address: str, request: RemotingCommand) -> None:
        client = await self.client(address)
        await client.invoke_oneway(request)

    def forget(self, address: str) -> None:
        client = self._clients.pop(address, None)
        if client is not None:
            self.nursery.start_soon(client.aclose)

    async def aclose(self) -> None:
        for client in list(self._clients.values()):
            await client.aclose()
        self._clients.clear()


@contextlib.asynccontextmanager
async def open_client_pool(
    *, connect_timeout: float = 3.0
) -> AsyncGenerator[RemotingClientPool, None]:
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            pool = RemotingClientPool(nursery, connect_timeout)
            try:
                yield pool
            finally:
                await pool.aclose()
                nursery.cancel_scope.cancel()
