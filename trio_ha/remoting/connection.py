"""One remoting connection on the server side: a reader, a writer, and requests served in the
reader's round or in a task each.

The reader decodes frames. A request that never waits is served right there, in the reader's
round, by the server's ``FastHandler`` (a broker's sends and admin verbs): its reply joins the
read's one write, with no task spawned, scheduled and ended for it. A request whose
reply is made elsewhere — a SYNC_MASTER send waits for its slave's ack — comes back as an
``Answer`` to its reply (``trio_ha.answer``), given by the task that completes it (the HA ack
reader) with no task of its own either. Every other request runs in a task of its own (the
``Handler``), so a slow one (a long-polled pull holds its reply for up to 15 s) never stalls
the requests behind it.
Replies go out in whatever order they finish, matched by ``opaque`` as RocketMQ clients
expect. A finished request queues its encoded reply; the writer task writes the queue in
order, so frames never interleave and no request waits on a peer that does not read. The
writer takes every reply waiting at once (up to ``WRITE_BATCH``) and gives their buffers to
one ``sendmsg``: a pull's records go from the mapped commitlog to the socket without a copy
(``MappedReply``).
Two exceptions save the writer's round: the reader writes the replies of the requests it
served itself once it has served a read, and the last request running (held ones aside)
writes the queued replies with its own, since no other reply is coming to share the write
(both non-blocking; what the socket does not take stays queued, in order).

Every resource the peer can make us hold is bounded (``RemotingLimits``):

- **replies waiting** — once this connection's unwritten replies reach the high-water mark (or
  all connections' reach the total), the reader stops reading requests until they drain below
  the low-water mark: back-pressure reaches the peer's socket. The check before each request
  and the queueing of each reply have no checkpoint between a reply's making and its counting
  where it matters (see ``wait_reply_room``), so the bound is passed by at most the replies of
  the requests already running. A write that makes no progress for ``write_timeout`` closes
  the connection: a peer that never reads is dropped, and its replies with it.
- **one round per read** — the requests of one read start in one scheduling round, without a
  checkpoint between them, so their replies leave in one write: each promises a reply as large
  as the largest the connection has made, and the reader takes that path only while replies
  waiting and promised fit under both marks (``_wait_to_dispatch``). A request that starts a
  long wait (``holding``) drops its promise.
- **request bytes** — a connection buffers up to ``READ_ALLOWANCE`` bytes of unfinished frames
  on its own; a larger frame draws on the server's shared read budget, and waits (unread) when
  that is spent. A frame begun must be complete within ``request_timeout``, so a peer trickling
  one byte a second is closed though it is never idle.
- **requests running** — at most ``max_in_flight``; beyond it the reader stops reading.
- **time** — ``idle_timeout`` without a byte read or written closes the connection.

While the reader is not reading (back-pressure), it cannot see the peer's FIN; it polls the
socket for a hang-up every ``hangup_check_interval`` instead, so a peer that leaves with
thousands of long-polled pulls in flight has them cancelled promptly, not when they time out.
A FIN that never arrives (the peer closed while its requests still filled our receive window,
so it waits in the peer's send queue) is ended by the idle timeout, which holds while not
reading too (``_paused_wait``).
A held request uses ``holding()`` for its wait, which also ends when the server drains the
connection at shutdown (the request then answers as if its wait had timed out).

A peer that hangs up (or whose connection breaks) loses its replies, not its requests. A
request read whole is carried out, as RocketMQ's thread pools carry it out whatever became of
the channel: a producer's last oneway sends, or a consumer's offsets sent oneway just before it
closes, arrive with a FIN behind them, and a send that must first create its topic is still
running when the FIN is read. So the hang-up stops the reader, ends the held waits and drops
the replies, and the requests running get ``finish_timeout`` to finish before the connection's
nursery is cancelled. A connection closed for misbehaving (a bad frame, a frame or a write that
never completes, idling) is cancelled at once, requests and all.

Why one module at about 800 lines: the reader, the writer, the requests in flight and the
replies waiting for them share one connection's state (its budget, its pending answers, its
shutdown), and the design card gives each connection one nursery owning both pumps.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import select
import time
from collections import deque
from collections.abc import Awaitable, Callable, Generator
from typing import Final, TypeAlias

import attrs
import trio

from .._sockets import receive_from, socket_fd, unsent, write_now
from ..answer import Answer
from ..ratelog import RateLimitedLog
from ..wire.errors import RemotingDecodeError
from ..wire.remoting import NEED_DATA, FrameDecoder, MappedReply, RemotingCommand, encode
from .answers import Frame, Reply, answer, encode_reply, failure_reply
from .limits import READ_ALLOWANCE, RemotingBudgets, RemotingLimits

__all__ = [
    "RUN_IN_TASK", "CloseReason", "FastHandler", "Handler", "PendingReply", "RemotingConnection",
    "WaitInTask", "serve_connection",
]

log = logging.getLogger("trio_ha.remoting.server")

#: the most one receive asks for
RECEIVE_SIZE = 64 * 1024
#: replies are gathered into one write (one ``sendmsg``) up to this size
WRITE_BATCH = 256 * 1024
#: a write makes progress (resets ``write_timeout``) at least every this many bytes
WRITE_CHUNK = 256 * 1024
#: the most buffers one ``sendmsg`` takes (Linux's IOV_MAX is 1024)
MAX_IOV = 512

_HANGUP_EVENTS = select.POLLHUP | select.POLLERR | getattr(select, "POLLRDHUP", 0)

_closes = RateLimitedLog(log)

#: what serves requests: the request and its connection in, the reply (or None) out
Handler = Callable[[RemotingCommand, "RemotingConnection"], Awaitable[Reply]]


@attrs.frozen
class WaitInTask:
    """A request a fast handler began whose reply must be waited for in a task: ``wait``
    runs in one, as a ``Handler`` would (a SYNC send whose put waits for room in its
    service's full channel: the back-pressure needs a task to hold)."""

    wait: Callable[[], Awaitable[Reply]]


#: a reply that is being made elsewhere (a SYNC_MASTER send waits for its slave's ack): given
#: later by whoever makes it, or waited for in a task
PendingReply: TypeAlias = Answer[Reply] | WaitInTask


class RunInTask(enum.Enum):
    RUN_IN_TASK = "RUN_IN_TASK"


#: a fast handler's answer for a request it leaves to the task of the ``Handler``
RUN_IN_TASK: Final = RunInTask.RUN_IN_TASK

#: what serves requests that need no task of their own, in the reader's round: the reply, or
#: a ``PendingReply``, or RUN_IN_TASK to leave the request to the ``Handler`` (see the module)
FastHandler = Callable[[RemotingCommand, "RemotingConnection"], Reply | PendingReply | RunInTask]


class CloseReason(enum.StrEnum):
    """Why a connection ended."""

    PEER_CLOSED = "the peer closed the connection"
    LOST = "connection lost"
    BAD_FRAME = "bad frame"
    IDLE = "idle"
    REQUEST_TIMEOUT = "a request frame did not arrive within the request timeout"
    WRITE_TIMEOUT = "the peer is not reading its replies"
    TLS = "refused by the TLS mode, or the TLS handshake failed"
    SHUTDOWN = "server shutdown"


#: how each close is logged: the ordinary ends (the peer hung up, idled out, or the server
#: stopped) at DEBUG, every one, as they are as many as the connections; the abnormal ones
#: at INFO or WARNING, at most one line per reason in ten seconds (``_closes``)
_CLOSE_LOG_LEVELS = {
    CloseReason.PEER_CLOSED: logging.DEBUG,
    CloseReason.SHUTDOWN: logging.DEBUG,
    CloseReason.LOST: logging.INFO,
    CloseReason.IDLE: logging.DEBUG,
    CloseReason.BAD_FRAME: logging.WARNING,
    CloseReason.REQUEST_TIMEOUT: logging.WARNING,
    CloseReason.WRITE_TIMEOUT: logging.WARNING,
    CloseReason.TLS: logging.WARNING,
}


@attrs.define(eq=False)
class RemotingConnection:
    """One client connection, as handlers see it: who it is, whether it is closed, and the
    ways a handler cooperates with its limits (``holding``, ``wait_reply_room``)."""

    stream: trio.abc.Stream
    peer: str
    limits: RemotingLimits = attrs.field(factory=RemotingLimits)
    budgets: RemotingBudgets = attrs.field(
        default=attrs.Factory(lambda self: RemotingBudgets.for_limits(self.limits),
                              takes_self=True)
    )
    connected_at: float = attrs.field(factory=time.time)
    #: why the connection ended; None while it is open
    close_reason: CloseReason | None = None
    close_detail: str | None = None
    #: encoded replies waiting for the writer, with their sizes
    _outbox: deque[tuple[Frame, int]] = attrs.field(factory=deque[tuple[Frame, int]])
    _outbox_bytes: int = 0
    _writable: bool = True
    _in_flight: int = 0
    _read_charge: int = 0
    _draining: bool = False
    _last_activity: float = 0.0
    #: the largest reply made on this connection (None: none yet)
    _largest_reply: int | None = None
    #: the replies promised by the requests running (see ``_wait_to_dispatch``), in all and
    #: by task; a request that starts a long wait (``holding``) drops its promise
    _promised: int = 0
    _promises: dict[trio.lowlevel.Task, int] = attrs.field(factory=dict[trio.lowlevel.Task, int])
    _holds: set[trio.CancelScope] = attrs.field(factory=set[trio.CancelScope])
    #: requests served without a task whose replies are being made: each one's answer, and
    #: the reply bytes it promised
    _pending: dict[Answer[Reply], int] = attrs.field(factory=dict[Answer[Reply], int])
    _scope: trio.CancelScope | None = None
    _read_scope: trio.CancelScope | None = None
    _writer_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    #: the socket's descriptor, for a lone reply written by its request (-1: not a socket)
    _fd: int = attrs.field(init=False, default=-1)
    #: the writer is in a write: nobody else may write
    _writing: bool = False
    _room_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _slot_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    _idle_lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def __attrs_post_init__(self) -> None:
        self._fd = socket_fd(self.stream)

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    @property
    def pending_reply_bytes(self) -> int:
        """Encoded replies queued or being written."""
        return self._outbox_bytes

    @property
    def in_flight(self) -> int:
        """Requests running."""
        return self._in_flight

    # ---- for handlers ----------------------------------------------------------------------

    async def send(self, command: RemotingCommand) -> None:
        """Queue one frame for the writer (it does not wait for the bytes to be written).
        Raises trio.ClosedResourceError once the connection is closed."""
        await trio.lowlevel.checkpoint()
        if not self._enqueue(encode(command)):
            raise trio.ClosedResourceError(f"connection to {self.peer} closed: "
                                           f"{self.close_reason}")

    def send_nowait(self, command: RemotingCommand) -> bool:
        """Queue one frame for the writer from synchronous code (a notification the server
        sends on its own, such as NOTIFY_CONSUMER_IDS_CHANGED); False once the connection is
        closed. Counts against the reply limits like any reply."""
        return self._enqueue(encode(command))

    async def wait_reply_room(self) -> None:
        """Wait while this connection's replies are over the high-water mark (until they drain
        below the low one) or all connections' are over the total. A handler that builds a
        large reply after waiting — a held pull, many of which may wake at once — calls this
        first and must not checkpoint between it and returning the reply: the reply is then
        counted before the next waiter looks."""
        await trio.lowlevel.checkpoint()
        await self._wait_for_room()

    @contextlib.contextmanager
    def holding(self, timeout: float) -> Generator[trio.CancelScope]:
        """A scope for a request's long wait (a long-polled pull): cancelled after ``timeout``
        seconds, when the connection closes, or when the server drains it at shutdown; the
        block then exits normally, as after a timeout, and the request answers."""
        # A held request is not about to answer: its promised reply must not keep the reader
        # from reading meanwhile (it waits for room with ``wait_reply_room`` when it wakes).
        self._settle(self._promises.pop(trio.lowlevel.current_task(), 0))
        with trio.move_on_after(timeout) as scope:
            if self.closed or self._draining:
                scope.cancel()
            self._holds.add(scope)
            try:
                yield scope
            finally:
                self._holds.discard(scope)

    # ---- control ---------------------------------------------------------------------------

    def use_stream(self, stream: trio.abc.Stream) -> None:
        """Serve on ``stream`` instead (TLS over the accepted socket, before serving): its
        writes go through it, not straight to the socket."""
        self.stream = stream
        self._fd = socket_fd(stream)

    def close(self, reason: CloseReason, detail: object = None) -> None:
        """End the connection now: its reader, writer and requests are cancelled."""
        self._mark_closed(reason, detail)
        if self._scope is not None:
            self._scope.cancel()

    def _hang_up(self, reason: CloseReason, detail: object = None) -> None:
        """The peer has gone (FIN, RST, a failed write): stop reading, end the held waits and
        drop the replies; ``serve`` gives the requests running ``finish_timeout`` to finish
        (see the module)."""
        self._mark_closed(reason, detail)
        if self._read_scope is not None:
            self._read_scope.cancel()
        self._writer_lot.unpark_all()
        self._room_lot.unpark_all()

    def _mark_closed(self, reason: CloseReason, detail: object) -> None:
        if self.close_reason is None:
            self.close_reason = reason
            self.close_detail = str(detail) if detail is not None else None
        for scope in list(self._holds):
            scope.cancel()
        # Nobody will read them: give back what the replies hold of the shared budget.
        self.budgets.replies.release(self._outbox_bytes)
        self._outbox_bytes = 0
        self._outbox.clear()

    def drain(self) -> None:
        """Stop reading requests, end held requests early, and close once the running
        requests have finished and their replies are written (server shutdown)."""
        self._draining = True
        for scope in list(self._holds):
            scope.cancel()
        if self._read_scope is not None:
            self._read_scope.cancel()

    # ---- serving ---------------------------------------------------------------------------

    async def serve(
        self,
        handler: Handler,
        *,
        fast: FastHandler | None = None,
        on_open: Callable[[RemotingConnection], None] | None = None,
        on_close: Callable[[RemotingConnection], None] | None = None,
        after_round: Callable[[], None] | None = None,
    ) -> None:
        """Serve requests until the connection closes, misbehaves, idles out or is drained.
        ``after_round`` runs each time the requests of one read have been served, before
        their replies are written (``RemotingServer.after_round``)."""
        self._last_activity = trio.current_time()
        if on_open is not None:
            on_open(self)
        try:
            async with trio.open_nursery() as nursery:
                self._scope = nursery.cancel_scope
                if self.closed:
                    nursery.cancel_scope.cancel()
                nursery.start_soon(self._run_writer)
                try:
                    await self._run_reader(handler, fast, nursery, after_round)
                except RemotingDecodeError as exc:
                    self.close(CloseReason.BAD_FRAME, exc)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._hang_up(CloseReason.LOST, exc)
                if not self.closed:  # drained: let the running requests finish and answer
                    while self._in_flight or self._outbox_bytes:
                        await self._idle_lot.park()
                    self.close(CloseReason.SHUTDOWN)
                else:  # hung up: the requests running finish, unanswered (see the module)
                    with trio.move_on_after(self.limits.finish_timeout):
                        while self._tasks_running:
                            await self._idle_lot.park()
                    nursery.cancel_scope.cancel()
        finally:
            if self.close_reason is None:  # cancelled from outside: the shutdown deadline
                self.close_reason = CloseReason.SHUTDOWN
            self._release_all()
            reason = self.close_reason
            level = _CLOSE_LOG_LEVELS[reason]
            detail = f" ({self.close_detail})" if self.close_detail else ""
            if level > logging.DEBUG:
                _closes.log(level, reason, "remoting: closing %s: %s%s", self.peer,
                            reason.value, detail)
            else:
                log.debug("remoting: closing %s: %s%s", self.peer, reason.value, detail)
            if on_close is not None:
                on_close(self)
            await trio.aclose_forcefully(self.stream)

    # ---- the reader ------------------------------------------------------------------------

    async def _run_reader(self, handler: Handler, fast: FastHandler | None,
                          nursery: trio.Nursery,
                          after_round: Callable[[], None] | None = None) -> None:
        limits = self.limits
        decoder = FrameDecoder()
        #: when the unfinished frame in the decoder began (None: nothing unfinished)
        partial_since: float | None = None
        with trio.CancelScope() as self._read_scope:
            if self._draining:
                return
            while True:
                size = await self._reserve_read(decoder.buffered, partial_since)
                deadline = self._last_activity + limits.idle_timeout
                if partial_since is not None:
                    deadline = min(deadline, partial_since + limits.request_timeout)
                data = await receive_from(self.stream, size, deadline)
                now = trio.current_time()
                if data is None:
                    if partial_since is not None and now >= partial_since + limits.request_timeout:
                        self.close(CloseReason.REQUEST_TIMEOUT,
                                   f"{decoder.buffered} bytes of a frame in "
                                   f"{now - partial_since:.1f} s")
                        return
                    if now >= self._last_activity + limits.idle_timeout:
                        self.close(CloseReason.IDLE, f"{limits.idle_timeout:g} s")
                        return
                    continue  # a write moved the idle deadline
                if not data:
                    self._hang_up(CloseReason.PEER_CLOSED)
                    return
                self._last_activity = now
                decoder.receive_data(data)
                completed = False
                while (command := decoder.next_command()) is not NEED_DATA:
                    completed = True
                    if command.is_response:
                        continue  # we send no requests to clients; ignore stray replies
                    promise = await self._wait_to_dispatch()
                    if fast is not None and self._handle_now(fast, command, promise, nursery):
                        continue
                    self._in_flight += 1
                    self._promise(promise)
                    nursery.start_soon(self._process, functools.partial(handler, command, self),
                                       command, promise)
                if completed:
                    if after_round is not None:
                        after_round()
                    # the replies of the requests served in this round leave in one write
                    self._write_queued_now()
                self._settle_read(decoder.buffered)
                if not decoder.buffered:
                    partial_since = None
                elif completed or partial_since is None:
                    # A new frame began; time spent not reading (back-pressure) is not its.
                    partial_since = trio.current_time()
                if completed:
                    self._last_activity = trio.current_time()

    async def _reserve_read(self, buffered: int, partial_since: float | None) -> int:
        """How many bytes the next receive may ask for: within the connection's allowance,
        plus what the shared read budget grants; waits (not reading) while neither has room,
        until the unfinished frame's deadline."""
        while True:
            free = READ_ALLOWANCE + self._read_charge - buffered
            if free >= RECEIVE_SIZE:
                return RECEIVE_SIZE
            if self.budgets.requests.try_take(RECEIVE_SIZE - free):
                self._read_charge += RECEIVE_SIZE - free
                return RECEIVE_SIZE
            if free > 0:
                return free
            # A frame larger than the allowance, and the budget is spent: wait for it.
            deadline = (partial_since if partial_since is not None else trio.current_time()) \
                + self.limits.request_timeout
            if trio.current_time() >= deadline:
                self.close(CloseReason.REQUEST_TIMEOUT,
                           f"{buffered} bytes of a frame; the server's read budget is spent")
                await trio.lowlevel.checkpoint()  # cancelled: the connection is closed
            await self._paused_wait(self.budgets.requests.wait_released, deadline)

    def _settle_read(self, buffered: int) -> None:
        """Return the read budget the decoder no longer needs."""
        charge = max(0, buffered - READ_ALLOWANCE)
        if charge < self._read_charge:
            self.budgets.requests.release(self._read_charge - charge)
            self._read_charge = charge

    async def _wait_to_dispatch(self) -> int:
        """Before starting a request: room for its reply, and a slot to run in.

        The fast path starts it without a checkpoint, so the requests of one read start in one
        scheduling round and their replies leave in one write (the reader checkpoints at its
        next receive). Each request started so promises a reply as large as the largest this
        connection has made, until it answers; the fast path is taken only while the replies
        waiting and promised, with this one's, fit under this connection's high-water mark
        and every connection's total, so the bounds stay what they were. Otherwise (or before
        the first reply's size is known) the reader checkpoints before each request, and the
        running ones count their replies before it looks again. Returns the bytes this request
        promises."""
        largest = self._largest_reply
        if largest is not None and self._in_flight < self.limits.max_in_flight:
            replies = self.budgets.replies
            if (self._outbox_bytes + self._promised + largest
                    <= self.limits.write_buffer_high_water_mark
                    and replies.used + replies.promised + largest <= replies.limit):
                return largest
        await self._wait_for_room()
        while self._in_flight >= self.limits.max_in_flight:
            await self._paused_wait(self._slot_lot.park)
        # Started after a checkpoint: it promises a reply too (once sizes are known), so the
        # fast path's next look counts it.
        return self._largest_reply or 0

    async def _wait_for_room(self) -> None:
        await trio.lowlevel.checkpoint()
        while not self.closed:  # (a peer gone takes no replies: nothing to wait for)
            if not self._writable or (self._outbox_bytes + self._promised
                                      >= self.limits.write_buffer_high_water_mark):
                wait = self._room_lot.park
            elif self.budgets.replies.exhausted:
                wait = self.budgets.replies.wait_released
            else:
                return
            await self._paused_wait(wait)

    async def _paused_wait(self, wait: Callable[[], Awaitable[object]],
                           until: float = math.inf) -> None:
        """One wait of a reader that is not reading (back-pressure), until ``wait`` returns,
        ``until``, the next hang-up check or the idle deadline, whichever is first; then the
        connection is closed if the peer has gone or it has idled out (the caller loops, and
        its next checkpoint is cancelled).

        Not reading, the reader's receive cannot see the peer leave: a FIN queued behind
        unread bytes is seen by ``_check_hangup``, and one that never arrives — it sits in the
        peer's send queue behind requests our full receive window refuses (the peer closed
        while still sending), or the peer vanished — is ended by the idle timeout, which holds
        here as while reading: no byte read or written for ``idle_timeout`` closes the
        connection. (A periodic check, not an event: trio waits for a socket to be readable,
        which one with unread bytes always is; POLLRDHUP alone cannot be waited for without
        an epoll descriptor per paused connection.)"""
        idle_at = self._last_activity + self.limits.idle_timeout
        with trio.move_on_at(min(until, idle_at,
                                 trio.current_time() + self.limits.hangup_check_interval)):
            await wait()
        self._check_hangup()
        now = trio.current_time()
        if not self.closed and now >= self._last_activity + self.limits.idle_timeout:
            self.close(CloseReason.IDLE,
                       f"{self.limits.idle_timeout:g} s without a byte either way while not "
                       f"reading ({self._in_flight} requests running, "
                       f"{len(self._holds)} of them held)")

    def _check_hangup(self) -> None:
        """Close the connection if the peer has gone (FIN, RST), which a reader that is not
        reading cannot otherwise see; the caller's next checkpoint is then cancelled."""
        # (under TLS, the socket below the SSLStream: a hang-up shows there all the same)
        sock = getattr(self.stream, "socket", None) or getattr(
            getattr(self.stream, "transport_stream", None), "socket", None)
        if sock is None or self.closed:
            return
        try:
            poller = select.poll()
            poller.register(sock.fileno(), _HANGUP_EVENTS)
            hung_up = bool(poller.poll(0))
        except (OSError, ValueError):
            hung_up = True
        if hung_up:
            self._hang_up(CloseReason.PEER_CLOSED, "seen while not reading")

    # ---- requests --------------------------------------------------------------------------

    def _handle_now(self, fast: FastHandler, request: RemotingCommand, promise: int,
                    nursery: trio.Nursery) -> bool:
        """Serve ``request`` in the reader's round if ``fast`` can: False when it leaves the
        request to a task. A reply made now is queued for the read's one write; an
        ``Answer`` to a reply is queued when it is given (``_pending_done``); a
        ``WaitInTask`` is waited for in a task."""
        try:
            outcome = fast(request, self)
        except Exception as exc:
            outcome = failure_reply(request, exc, self.peer)
        if outcome is RUN_IN_TASK:
            return False
        if outcome is None or isinstance(outcome, (bytes, RemotingCommand, MappedReply)):
            data = encode_reply(outcome, request, self.peer)
            if data is not None:
                self._enqueue(data, wake=False)  # the reader writes the read's replies
            return True
        if isinstance(outcome, Answer):
            self._in_flight += 1
            self._promise(promise)
            self._pending[outcome] = promise
            outcome.when_done(functools.partial(self._pending_done, outcome, request))
        # The types say a fast handler returns nothing else; a buggy one can at run time (it
        # is answered SYSTEM_ERROR below), so the check the checker calls needless stays.
        elif isinstance(outcome, WaitInTask):  # pyright: ignore[reportUnnecessaryIsInstance]
            self._in_flight += 1
            self._promise(promise)
            nursery.start_soon(self._process, outcome.wait, request, promise)
        else:  # a fast handler's bug: neither a reply nor a pending one
            problem = TypeError(f"a fast handler returned {type(outcome).__name__}")
            data = encode_reply(failure_reply(request, problem, self.peer), request, self.peer)
            if data is not None:
                self._enqueue(data, wake=False)
        return True

    def _pending_done(self, answer: Answer[Reply], request: RemotingCommand) -> None:
        """A request's reply is given: queue it (the last request running writes every
        queued reply at once). Runs in the task that gave it (a SYNC_MASTER send's: the HA
        ack reader), so nothing here may raise into it."""
        promise = self._pending.pop(answer, None)
        if promise is None:
            return  # the connection closed meanwhile (its promise was settled then)
        try:
            data = encode_reply(answer.value, request, self.peer)
            if data is not None:
                self._enqueue(data, flush=self._in_flight - len(self._holds) <= 1)
        finally:
            self._settle(promise)
            self._request_done()

    async def _process(self, handle: Callable[[], Awaitable[Reply]], request: RemotingCommand,
                       promise: int) -> None:
        task = trio.lowlevel.current_task()
        if promise:
            self._promises[task] = promise
        try:
            data = await answer(handle, request, self.peer)
            if data is not None:
                # No checkpoint since the handler returned: counted now. The last request
                # running (held ones aside) writes the queued replies itself: no other reply
                # is coming to share the writer's next write, so waiting for it would only
                # cost a round.
                self._enqueue(data, flush=self._in_flight - len(self._holds) <= 1)
        finally:
            self._settle(self._promises.pop(task, 0))
            self._request_done()

    @property
    def _tasks_running(self) -> int:
        """Requests running in tasks: those in flight but for the ones served without a task
        whose replies are being made elsewhere (their effect has happened)."""
        return self._in_flight - len(self._pending)

    def _request_done(self) -> None:
        self._in_flight -= 1
        # (an empty lot is looked at before it is called: unpark costs time even then,
        # and these run for every request)
        if self._slot_lot:
            self._slot_lot.unpark()
        if self._idle_lot and self._in_flight <= len(self._pending):
            self._idle_lot.unpark_all()

    def _promise(self, promise: int) -> None:
        """A request starts that will make a reply of about ``promise`` bytes."""
        if promise:
            self._promised += promise
            self.budgets.replies.promise(promise)

    def _settle(self, promise: int) -> None:
        """A request's promised reply is made, or will not be soon."""
        if promise:
            self._promised -= promise
            self.budgets.replies.settle(promise)
            if self._room_lot:
                self._room_lot.unpark_all()

    # ---- the writer ------------------------------------------------------------------------

    def _enqueue(self, data: Frame, flush: bool = False, wake: bool = True) -> bool:
        """Queue a frame for the writer; with ``flush``, write what is queued now
        (non-blocking: what the socket does not take stays queued). Without ``wake`` the
        writer is not woken: the caller writes the queue itself soon, in this round
        (``_write_queued_now``), and wakes it if anything is left."""
        if self.closed:
            return False
        size = len(data) if isinstance(data, bytes) else sum(map(len, data))
        if self._largest_reply is None or size > self._largest_reply:
            self._largest_reply = size
        self._outbox.append((data, size))
        self._outbox_bytes += size
        self.budgets.replies.take(size)
        if self._outbox_bytes >= self.limits.write_buffer_high_water_mark:
            self._writable = False
        if flush:
            self._write_queued_now()
        elif wake and self._writer_lot:
            self._writer_lot.unpark()
        return True

    def _write_queued_now(self) -> None:
        """Write the queued replies now, in one non-blocking gathered write, unless the
        writer is in a write; what the socket does not take stays queued, in order, and the
        writer is woken for it."""
        if self._fd >= 0 and not self._writing and self._outbox:
            parts, size = self._gather()
            sent = write_now(self._fd, parts[:MAX_IOV])
            if sent:
                self._last_activity = trio.current_time()
            if sent < size:
                self._outbox.appendleft((unsent(parts, sent), size - sent))
            self._written(sent)
        if self._outbox and self._writer_lot:
            self._writer_lot.unpark()

    def _gather(self) -> tuple[list[bytes | memoryview], int]:
        """Take whole replies from the front of the queue, up to WRITE_BATCH bytes (at least
        one), as the buffers of one gathered write."""
        outbox = self._outbox
        parts: list[bytes | memoryview] = []
        size = 0
        while outbox and (not parts or size + outbox[0][1] <= WRITE_BATCH):
            frame, n = outbox.popleft()
            if isinstance(frame, bytes):
                parts.append(frame)
            else:
                parts.extend(part for part in frame if len(part))
            size += n
        return parts, size

    def _written(self, size: int) -> None:
        if self.closed:
            return  # the replies were dropped, and their bytes given back, at the close
        self._outbox_bytes -= size
        self.budgets.replies.release(size)
        if not self._writable and self._outbox_bytes <= self.limits.write_buffer_low_water_mark:
            self._writable = True
            self._room_lot.unpark_all()
        if not self._outbox_bytes and self._idle_lot:
            self._idle_lot.unpark_all()

    async def _run_writer(self) -> None:
        outbox = self._outbox
        # A socket takes the replies ready at once as one sendmsg of their buffers (a pull's
        # records straight from the mapping); another stream gets them joined.
        sock = getattr(self.stream, "socket", None)
        while True:
            if not outbox:
                await self._writer_lot.park()
                continue
            parts, size = self._gather()
            try:
                self._writing = True
                try:
                    if sock is not None:
                        await self._send_parts(sock, parts)
                    else:
                        await self._write(parts[0] if len(parts) == 1 else b"".join(parts))
                finally:
                    self._writing = False
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._written(size)
                self._hang_up(CloseReason.LOST, exc)
                return
            self._written(size)

    async def _send_parts(self, sock: trio.socket.SocketType,
                          parts: list[bytes | memoryview]) -> None:
        """Write ``parts`` in order with gathered sends; each must make progress within
        ``write_timeout``."""
        while parts:
            sent = 0
            with trio.move_on_after(self.limits.write_timeout) as scope:
                sent = await sock.sendmsg(parts[:MAX_IOV])
            if scope.cancelled_caught:
                await self._write_timed_out()
                return  # not reached: the connection's scope is cancelled
            self._last_activity = trio.current_time()
            parts = unsent(parts, sent)

    async def _write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), WRITE_CHUNK):
            with trio.move_on_after(self.limits.write_timeout) as scope:
                await self.stream.send_all(view[start:start + WRITE_CHUNK])
            if scope.cancelled_caught:
                await self._write_timed_out()
            self._last_activity = trio.current_time()

    async def _write_timed_out(self) -> None:
        self.close(CloseReason.WRITE_TIMEOUT,
                   f"no progress writing replies for {self.limits.write_timeout:g} s, "
                   f"{self._outbox_bytes} bytes waiting")
        await trio.lowlevel.checkpoint()  # cancelled: the connection is closed

    def _release_all(self) -> None:
        """Give back what the connection holds of the shared budgets."""
        self.budgets.replies.release(self._outbox_bytes)
        self._outbox_bytes = 0
        self._outbox.clear()
        for promise in self._pending.values():
            self._settle(promise)
        self._pending.clear()
        self.budgets.requests.release(self._read_charge)
        self._read_charge = 0


async def serve_connection(
    stream: trio.abc.Stream,
    handler: Handler,
    *,
    fast: FastHandler | None = None,
    peer: str = "?",
    limits: RemotingLimits | None = None,
    budgets: RemotingBudgets | None = None,
    on_open: Callable[[RemotingConnection], None] | None = None,
    on_close: Callable[[RemotingConnection], None] | None = None,
    after_round: Callable[[], None] | None = None,
) -> None:
    """Serve requests from one connection until it closes, misbehaves or idles out."""
    limits = limits or RemotingLimits()
    connection = RemotingConnection(stream, peer, limits,
                                    budgets or RemotingBudgets.for_limits(limits))
    await connection.serve(handler, fast=fast, on_open=on_open, on_close=on_close,
                           after_round=after_round)
