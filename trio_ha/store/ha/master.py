"""The master side of replication: the HA listener and one connection per slave.

Each slave connection is one nursery with three tasks: the ack reader, the log writer, and
the re-judge of an ack that could not count yet (``_count_when_due``), which sleeps until the
reader tells it so. If the reader or the writer fails — the peer closed, broke the protocol,
went silent past haHousekeepingInterval — the nursery cancels the others, and
``handle_stream`` closes the socket and drops the connection from the table, in one place.
The service itself runs one more task, the 60 s lag log (``_log_differences``), beside the
listener's. RocketMQ's HAConnection runs two threads that each poll with 1 s selects and tear
each other down by flags. At most ``ha_max_connections`` connections live at once. A newcomer
beyond that takes the slot of the longest-unproven connection (one whose peer never
acknowledged a byte it carried: ``HAConnection.proven``), so that peers restating the log end
cannot keep a slave out; with every slot proven it is closed at once (and logged so, at most
every 10 s).

These are pumps: socket -> protocol -> ledger -> watermark, and log -> frame -> transport.
The rules of which acks count, which connection makes way, and what ``replicated`` is live in
the sans-I/O ``ledger`` (``ReplicationLedger``); the pumps step it with what happened and
perform what it answers.

Why one module at about 800 lines: the connection's pumps and the service that admits,
authenticates and evicts connections step one ledger and one connection table, and the
statistics they report are read from both; the rules themselves live in ``ledger``.

Which acks count. RocketMQ keeps one global ``push2SlaveMaxOffset``, the highest report of any
socket, first reports included, so any peer that knows the log end can make a SYNC_MASTER put
PUT_OK without a slave (issues #1155, #3015). Here a report acknowledges only bytes that its
connection carried: a connection starts at the offset the master accepted from its first
report, and a later report acknowledges the bytes between that start and itself — never more
than the frames handed to that connection (beyond is a protocol error). The first report is a
request and acknowledges nothing. A connection's acks answer puts only once it carried every
byte of the oldest waiting put: that put appended after the connection was accepted, or starts
at or after the connection's start (``counted``; from then on it carried every later put too).
``replicated`` — what SYNC_MASTER puts wait for — is the ``ha_sync_acks``-th highest ack among
counted connections (the ledger keeps these rules). A real slave that reconnects with a full
log reports its end, the master continues from there, and its acks count from the first byte
it is sent (docs/ha-protocol.md, *Which acks count*).

Cost. A peer may stream reports as fast as it likes, and it costs the master little: one
read is one processing round, in which the protocol keeps and hands over only the last whole
report (a report is a cumulative offset); a report that repeats the last one costs a
comparison, and a changed ack moves one entry of two sorted lists (a binary search and a move
of at most ``ha_max_connections`` pointers) instead of sorting every connection's ack. A read
that brings more reports than a slave has to say (one per frame it was sent, and a few) makes
the reader wait FLOOD_PAUSE before it reads again, so a flood costs a few dozen reads a second
and TCP slows the peer down (an unpaused flood once took most of a CPU).
``is_slave_ok`` is a binary search too.

The writer sleeps on the commitlog's ``written`` watermark: a put wakes it at once (RocketMQ
polls every 100 ms on an ASYNC_MASTER), and with nothing to send it sends a heartbeat every
haSendHeartbeatInterval. A broker's server does not wait for that wake when it can help it:
after the requests of one read it calls ``push_now``, and a connection whose link is idle gets
that round's puts at once, from the server's task (``HAConnection.push_now`` says why).

A slave that asks for an offset the master cannot serve (below its first segment, or beyond
its end: the logs diverged) gets one heartbeat carrying the master's first offset — never its
end — which the slave reports as a divergence, and the connection ends.

SYNC_MASTER puts do not wait here: ``replicated`` feeds the group transfer service
(``group_transfer``), which answers them, and ``is_slave_ok`` tells it when there is no slave
worth waiting for.
"""

from __future__ import annotations

import collections
import enum
import itertools
import logging
import time
from typing import NoReturn, Protocol

import attrs
import trio

from ..._errors import TrioHAError
from ..._sockets import listen_named, peer_host
from ...config import StoreConfig
from ...ratelog import RateLimitedLog
from ...watermark import Watermark
from ...wire.ha import NEED_DATA, REPORT, HAProtocolError, MasterProtocol
from ..commitlog import CommitLog
from ..segment import Segment
from .auth import HANDSHAKE_TIMEOUT, authenticate_slave
from .group_transfer import GroupTransferService
from .ledger import RAISE, RECHECK, Account, PendingPut, ReplicationLedger
from .transfer import HATransport, transport_for

log = logging.getLogger(__name__)

RECEIVE_SIZE = 64 * 1024
#: reports a read may bring beyond one per frame sent since the previous read before the
#: connection counts as flooding (``HAConnection._flooding``)
REPORT_SLACK = 16
#: how long the reader of a flooding connection waits before it reads again
FLOOD_PAUSE = 0.02
#: a writer whose frames the socket keeps taking at once yields every this many bytes
YIELD_BYTES = 1024 * 1024
DIFF_LOG_INTERVAL = 60.0
#: at most one line per this many seconds about connections refused at the cap
REFUSAL_LOG_INTERVAL = 10.0


class HAConnectionClosed(TrioHAError):
    """The slave connection ended (peer closed, timed out, or cannot be served)."""


class HAConnectionState(enum.StrEnum):
    """Where the master's connection to one slave stands (a str: logs and admin tables
    print it as is)."""

    #: connected; the master sends nothing until the slave says where its log ends
    WAITING_FOR_REPORT = "waiting for first report"
    #: sending the log from the offset the slave asked for
    TRANSFER = "transfer"
    #: the slave asked for bytes this master cannot serve; the connection ends
    DIVERGED = "diverged"


@attrs.frozen
class SlaveConnectionStatistics:
    address: str
    state: HAConnectionState
    connected_since: float
    #: the first report: where the slave asked the master to start
    requested_offset: int | None
    #: the slave's last report once its request was accepted (its log end, as it says)
    acked_offset: int | None
    lag_bytes: int
    #: wall-clock time since which the slave has been behind (None: caught up)
    lag_since: float | None
    next_transfer_offset: int | None
    bytes_sent: int
    #: where this connection's transfer started (None until the request is accepted)
    start_offset: int | None = None
    #: the end of the bytes this connection carried and the slave acknowledged
    confirmed_offset: int | None = None
    #: whether its acks answer SYNC_MASTER puts (it carried every byte of the puts waiting)
    counted: bool = False
    #: frames with log bytes handed to the socket, and how many of them a server's round
    #: pushed itself (``MessageStore.replicate_now``) rather than the connection's writer
    frames_sent: int = 0
    frames_pushed: int = 0
    #: reads of reports the master processed, and those after which it paused the reader
    #: because the peer said more than a slave has to (a report flood)
    reads: int = 0
    reads_paused: int = 0


@attrs.frozen
class HAMasterStatistics:
    listen_address: tuple[str, int] | None
    master_offset: int
    replicated_offset: int
    connections: tuple[SlaveConnectionStatistics, ...]
    #: ha_max_connections, and the connections closed at once because it was reached
    max_connections: int = 0
    refused_connections: int = 0
    #: peers turned away by the authentication handshake (haAuthSecret)
    auth_failures: int = 0
    #: unproven connections closed to make room for a newcomer (``HAService._evict``)
    evicted_connections: int = 0


class AutoSwitchServing(Protocol):
    """What a controller-mode master serves its slaves with in its current term
    (``autoswitch_master.MasterTerm``): its connections speak the AutoSwitch protocol, and
    its SYNC_MASTER puts wait for the in-sync set. The role change sets it on the service;
    None while the store is not a controller-mode master."""

    def connection(self, service: HAService, transport: HATransport, address: str,
                   account: Account) -> HAConnection: ...

    def group_transfer_service(self, service: HAService) -> GroupTransferService: ...

    def raise_replicated(self, service: HAService) -> None: ...


@attrs.define(eq=False)
class HAConnection:
    service: HAService
    transport: HATransport
    address: str
    #: what this connection was handed over, confirmed and counted (the service's ledger)
    account: Account
    protocol: MasterProtocol = attrs.field(factory=MasterProtocol)
    state: HAConnectionState = HAConnectionState.WAITING_FOR_REPORT
    connected_since: float = attrs.field(factory=time.time)
    requested_offset: int | None = None
    #: where the writer sends from next
    next_offset: int | None = None
    bytes_sent: int = 0
    frames_sent: int = 0
    frames_pushed: int = 0
    #: reads of reports processed, and those after which the reader paused (a flood)
    reads: int = 0
    reads_paused: int = 0
    _frames_at_last_read: int = 0
    lag_since: float | None = None
    #: the start offset of a request the master cannot serve (the writer refuses it)
    _refused: int | None = None
    #: when the writer last handed a frame or heartbeat to the transport (trio clock)
    _last_send: float = 0.0
    #: the writer waits for the log to grow: ``push_now`` may send for it
    _parked: bool = False
    #: what the socket did not take of a pushed frame: the header's rest, and the body's
    #: rest as log offsets [start, end); the writer sends it before anything else
    _frame_rest: tuple[bytes, int, int] | None = None
    _first_report: trio.Event = attrs.field(factory=trio.Event)
    #: set when an ack could not count yet: ``_count_when_due`` judges it again later
    _uncounted: trio.Event = attrs.field(factory=trio.Event)
    #: ends the connection's tasks when it is evicted (``HAService._evict``)
    _scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    @property
    def commitlog(self) -> CommitLog:
        return self.service.commitlog

    # What the ledger keeps of this connection, by the names statistics and tests know.

    @property
    def start_offset(self) -> int | None:
        """Where the transfer starts (None until the request is accepted)."""
        return self.account.start

    @property
    def accepted_end(self) -> int | None:
        """The master's log end when the request was accepted."""
        return self.account.accepted_end

    @property
    def acked_offset(self) -> int | None:
        """The slave's last report since the request was accepted: its log end, as it says."""
        return self.account.acked

    @property
    def sent_offset(self) -> int | None:
        """The log end this connection's slave can hold: its start plus every frame handed
        to the transport; an ack beyond it acknowledges bytes never sent to it."""
        return self.account.sent

    @property
    def confirmed_offset(self) -> int | None:
        """The end of the bytes this connection carried that the slave acknowledged."""
        return self.account.confirmed

    @property
    def counted(self) -> bool:
        """Its confirmed offset counts for ``replicated`` (see the module docstring)."""
        return self.account.counted

    @property
    def proven(self) -> bool:
        """Whether its peer acknowledged a byte this connection carried to it (a report past
        its start, within what it was sent): what a slave does and a peer that only
        restates an offset it learnt cannot. Once proven, for the connection's life."""
        return self.account.proven

    async def run(self) -> None:
        with self._scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._read_acks)
                nursery.start_soon(self._write_log)
                nursery.start_soon(self._count_when_due)

    def evict(self) -> None:
        """End the connection (its tasks are cancelled; ``handle_stream`` closes it)."""
        self._scope.cancel()

    # ---- reader ----------------------------------------------------------------------------

    async def _read_acks(self) -> None:
        silence = self.service.config.ha_housekeeping_interval / 1000
        heard = trio.current_time()
        # The silence deadline is armed once per silence interval, not moved at every read
        # (moving a cancel scope's deadline is a heap operation: a peer that streams reports
        # paid it per read). When it fires early, the loop looks at when the peer was last
        # heard and arms it again from there; a cancelled receive has read nothing.
        while True:  # until the peer is silent for ``silence``, closes, or breaks the protocol
            with trio.move_on_at(heard + silence):
                while True:
                    data = await self.transport.receive_some(RECEIVE_SIZE)
                    if not data:
                        raise HAConnectionClosed("slave closed the connection")
                    heard = trio.current_time()
                    self._on_read(data)
                    if self._flooding(len(data)):
                        self.reads_paused += 1
                        await trio.sleep(FLOOD_PAUSE)
            if trio.current_time() >= heard + silence:
                break
        raise HAConnectionClosed(f"no report from the slave for {silence:g} s")

    def _on_read(self, data: bytes | bytearray) -> None:
        """One processing round: what one read brought, however many reports that is."""
        self.reads += 1
        self.protocol.log_end = self.commitlog.max_offset
        self.protocol.receive_data(data)
        # At most two events per read: the first report, and the last of the rest.
        while (event := self.protocol.next_event()) is not NEED_DATA:
            if event.first:
                self._on_request(event.offset)
            else:
                self._on_report(event.offset)

    def _flooding(self, size: int) -> bool:
        """Whether a read of ``size`` bytes brought more reports than a slave has to say: one
        per frame it was sent since the previous read, one per haSendHeartbeatInterval, and
        REPORT_SLACK for reads that cut a burst in two. Such a peer (a slave never is one)
        is read at most once per FLOOD_PAUSE, so that streaming reports as fast as the
        socket takes them costs the master a few reads a second, and TCP slows the peer
        down instead of the master speeding up."""
        frames = self.frames_sent - self._frames_at_last_read
        self._frames_at_last_read = self.frames_sent
        return size // REPORT.size > frames + REPORT_SLACK

    def _on_request(self, requested: int) -> None:
        """The first report: where the slave's log ends, so where to start. It acknowledges
        nothing (any peer can say any offset); what the master accepts is decided here, at
        once, so that the reports that follow are judged against it."""
        commitlog = self.commitlog
        self.requested_offset = requested
        start = self._start_offset(requested)
        if start < commitlog.min_offset or start > commitlog.max_offset:
            self._refused = start
        else:
            self.next_offset = start
            self.state = HAConnectionState.TRANSFER
            self.service.ledger.accept(self.account, requested, start, commitlog.max_offset)
        self._first_report.set()

    def _on_report(self, offset: int) -> None:
        """A report after the request: the ledger judges it (and raises HAProtocolError for
        an ack of bytes this connection never carried); this performs what it answers."""
        service = self.service
        account = self.account
        step = service.ledger.report(account, offset)
        if step is RAISE:
            service.replicated.raise_to(service.ledger.replicated)
        elif step is RECHECK:
            self._uncounted.set()
        if account.start is None:
            return  # the request was refused: the writer is ending the connection
        if offset >= self.commitlog.max_offset:
            self.lag_since = None
        elif self.lag_since is None:
            self.lag_since = time.time()

    async def _count_when_due(self) -> None:
        """Judge an ack that could not count again once the put that stood in the way is
        answered (at its deadline at the latest), rather than at the slave's next report,
        which may come only after the puts this connection did carry timed out."""
        service = self.service
        ledger = service.ledger
        while not self.counted:
            await self._uncounted.wait()
            self._uncounted = trio.Event()
            # The ledger judges first, then says when to look again: the service answers the
            # blocking put at the same deadline this task wakes at, and whichever runs first,
            # the put behind it must not be mistaken for the blocker (it was, and the
            # connection then counted only at that later put's deadline).
            while True:
                due = ledger.recheck(self.account)
                if due is None:
                    break
                await trio.sleep_until(due)  # at once if past: a checkpoint
            service.replicated.raise_to(ledger.replicated)

    # ---- writer ----------------------------------------------------------------------------

    def _start_offset(self, requested: int) -> int:
        commitlog = self.commitlog
        if requested != 0:
            return requested
        if self.service.config.ha_start_from_min_offset:
            return commitlog.min_offset
        end = commitlog.max_offset
        return end - end % commitlog.segment_size  # RocketMQ: the start of the last segment

    async def _write_log(self) -> None:
        config = self.service.config
        commitlog = self.commitlog
        await self._first_report.wait()
        if self._refused is not None:
            await self._refuse(self._refused)
        heartbeat = config.ha_send_heartbeat_interval / 1000
        self._last_send = trio.current_time()
        unyielded = 0  # bytes sent since this task last let others run
        while True:
            if self._frame_rest is not None:
                await self._send_frame_rest()
            offset = self.next_offset
            assert offset is not None  # accepted, as the first report was not refused
            if offset < commitlog.max_offset:
                # No waiting for more puts here: the remoting server starts the requests of one
                # read in one scheduling round, so their puts are all in the log when this
                # task runs, and one frame carries them (waiting rounds for more was tried
                # and dropped: docs/performance.md). When the link was idle, ``push_now`` has
                # usually sent them already, from the server's task.
                segment = commitlog.segments.find(offset)
                if segment is None:
                    await self._refuse(offset)
                with segment.hold():
                    header, start, end = self._frame(segment, offset)
                    # Bytes handed to the kernel can be acked before the send call returns
                    # (trio yields after the syscall): count the frame as carried from here.
                    self._handed_over(offset, end - start)
                    await self.transport.send_frame(header, segment, start, end)
                # A frame the socket takes at once costs no scheduling round: a writer that
                # keeps a fast slave's socket fed lets the ack reader and the puts run every
                # so often.
                unyielded += end - start
                if unyielded >= YIELD_BYTES:
                    unyielded = 0
                    await trio.lowlevel.checkpoint()
                continue
            unyielded = 0
            self._parked = True
            try:
                with trio.move_on_at(self._last_send + heartbeat):
                    await commitlog.written.wait_for(offset + 1)
                    continue
            finally:
                self._parked = False
            if self.next_offset != offset:
                continue  # pushed meanwhile: no heartbeat due, and the offset moved
            await self.transport.send_all(self._heartbeat(offset))
            self._last_send = trio.current_time()

    def _heartbeat(self, offset: int) -> bytes:
        """An empty frame at ``offset``: the writer's sign of life on an idle link."""
        return self.protocol.send_heartbeat(offset)

    def push_now(self) -> None:
        """Send what the log gained since the last frame now, with one non-blocking write
        from the caller's task, if this connection's writer is parked waiting for it and the
        slave has acknowledged everything sent before (an idle link).

        Why: the writer task runs only in the scheduling round after the puts' round, behind
        the reader's next receive and a batch switch, a good part of a SYNC send's latency at
        one producer (docs/performance.md). Only an idle link is pushed to, so that when
        frames are in flight (many producers, many connections) the writer still gathers the
        puts of several rounds into one frame instead of each server round sending its own.
        What the socket does not take, the writer sends: it was woken by the same puts."""
        if not self._parked or self._frame_rest is not None:
            return
        offset, acked = self.next_offset, self.acked_offset
        if offset is None or acked is None or acked < offset:
            return
        commitlog = self.commitlog
        if offset >= commitlog.max_offset:
            return
        segment = commitlog.segments.find(offset)
        if segment is None or segment.closed:
            return  # not servable: the writer, woken by the same puts, finds out and says so
        with segment.hold():
            header, start, end = self._frame(segment, offset)
            taken = self.transport.send_frame_nowait(header, segment, start, end)
        if not taken:
            return
        size = end - start
        self._handed_over(offset, size)
        self.frames_pushed += 1
        if taken < len(header) + size:
            self._frame_rest = (header[taken:], offset + max(0, taken - len(header)),
                                offset + size)

    def _frame(self, segment: Segment, offset: int) -> tuple[bytes, int, int]:
        """The frame that starts at ``offset`` in ``segment`` (held by the caller): its
        header, and its body as [start, end) of the segment — what is written there, up to
        haTransferBatchSize."""
        start = offset - segment.base_offset
        end = min(segment.wrote_position, start + self.service.config.ha_transfer_batch_size)
        return self.protocol.send_frame_header(offset, end - start), start, end

    def _handed_over(self, offset: int, size: int) -> None:
        """The frame of ``size`` bytes at ``offset`` was handed to the transport."""
        self.next_offset = offset + size
        self.service.ledger.handed_over(self.account, self.next_offset)
        self.bytes_sent += size
        self.frames_sent += 1
        self._last_send = trio.current_time()

    async def _send_frame_rest(self) -> None:
        """Send what the socket did not take of a frame ``push_now`` began."""
        assert self._frame_rest is not None
        head, offset, end = self._frame_rest
        segment = self.commitlog.segments.find(offset)
        if segment is None:
            await self._refuse(offset)
        with segment.hold():
            start = offset - segment.base_offset
            await self.transport.send_frame(head, segment, start, start + end - offset)
        self._frame_rest = None

    async def _refuse(self, requested: int) -> NoReturn:
        """The slave asked for bytes this master cannot send. Tell it so (one heartbeat at
        the master's first offset, which is not where the slave's log ends, so the slave sees
        the offsets disagree and reports the divergence) and end the connection — instead of
        RocketMQ's silent heartbeats forever. The heartbeat never carries the master's log
        end: a peer that asks for bytes beyond it learns nothing it could report back."""
        commitlog = self.commitlog
        behind = requested < commitlog.min_offset
        why = (
            "below the master's first retained offset" if behind
            else "beyond the master's log end (the master lost data the slave has)"
        )
        self.state = HAConnectionState.DIVERGED
        self.service.peer_log.log(
            logging.ERROR, ("diverged", peer_host(self.address)),
            "HA: slave %s asks for offset %d, %s (master log [%d, %d)); replication to it "
            "stops. Fix: wipe the slave's store (or restore the master) and restart the slave.",
            self.address, requested, why, commitlog.min_offset, commitlog.max_offset,
        )
        await self.transport.send_all(self.protocol.send_heartbeat(commitlog.min_offset))
        raise HAConnectionClosed(f"slave requested offset {requested}, {why}")

    def statistics(self) -> SlaveConnectionStatistics:
        end = self.commitlog.max_offset
        acked = self.acked_offset
        return SlaveConnectionStatistics(
            address=self.address,
            state=self.state,
            connected_since=self.connected_since,
            requested_offset=self.requested_offset,
            acked_offset=acked,
            lag_bytes=max(0, end - (acked if acked is not None else end)),
            lag_since=self.lag_since,
            next_transfer_offset=self.next_offset,
            bytes_sent=self.bytes_sent,
            frames_sent=self.frames_sent,
            frames_pushed=self.frames_pushed,
            reads=self.reads,
            reads_paused=self.reads_paused,
            start_offset=self.start_offset,
            confirmed_offset=self.confirmed_offset,
            counted=self.counted,
        )


@attrs.define(eq=False)
class HAService:
    """Accepts slave connections and tracks what they hold."""

    config: StoreConfig
    commitlog: CommitLog
    #: the ha_sync_acks-th highest ack among counted connections: what SYNC_MASTER puts wait
    #: for
    replicated: Watermark = attrs.field(factory=Watermark)
    #: the live connections, by their account's key: each has an open account in ``ledger``
    connections: dict[int, HAConnection] = attrs.field(factory=dict[int, HAConnection])
    #: which acks count, and so ``replicated``; which connection makes way for a newcomer
    ledger: ReplicationLedger = attrs.field(
        init=False, default=attrs.Factory(lambda self: _ledger_for(self), takes_self=True))
    listen_address: tuple[str, int] | None = None
    #: what peers make the master log (connections, closes, divergence): at most a line per
    #: kind and peer host every 10 s, so a peer that connects and misbehaves in a loop cannot
    #: fill the log (the hostile suite wrote 3,700 lines in 25 s before)
    peer_log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    #: peers turned away by the authentication handshake (haAuthSecret)
    auth_failures: int = 0
    #: unproven connections closed to make room for a newcomer (``_admit``)
    evicted_connections: int = 0
    #: a controller-mode master's term (its connections speak AutoSwitch); None: classic,
    #: or a controller-mode store that is not master now (it serves no slave then)
    autoswitch: AutoSwitchServing | None = None
    #: the handshakes under way, oldest first (``_authenticate``)
    _handshakes: collections.deque[trio.CancelScope] = attrs.field(
        factory=collections.deque[trio.CancelScope])
    _refused: int = 0
    _refused_unlogged: int = 0
    _refusal_logged_at: float = -REFUSAL_LOG_INTERVAL

    def group_transfer_service(self) -> GroupTransferService:
        """The service that answers SYNC_MASTER puts from ``replicated``; it tells the
        ledger which put waits longest (what a connection must have carried to count).
        A controller-mode master's term has its own (puts wait for the in-sync set)."""
        if self.autoswitch is not None:
            return self.autoswitch.group_transfer_service(self)
        service = GroupTransferService.for_replicas(self.replicated, self.is_slave_ok, self.config)
        self.ledger.oldest_waiting = service.oldest_waiting
        return service

    def oldest_waiting(self) -> PendingPut | None:
        """The oldest SYNC_MASTER put still waiting, if any."""
        return self.ledger.oldest_waiting()

    def push_now(self) -> None:
        """Send each slave on an idle link what the log gained since its last frame, now,
        from the caller's task (``HAConnection.push_now``): a server calls it once it has
        served the requests of one read, so that the round's puts leave in one frame without
        waiting for the writers' scheduling round."""
        for connection in self.connections.values():
            connection.push_now()

    async def serve(self, *, listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[tuple[str, int] | None] = (
                        trio.TASK_STATUS_IGNORED)) -> None:
        """Serve slaves on ``listeners`` (bound by the caller: ``open_store`` binds the HA port
        before it writes anything), or on haListenPort, until cancelled."""
        if not listeners:
            port = self.config.ha_listen_port
            if port is None:
                raise ValueError("the HA service needs ha_listen_port (0: any free port)")
            listeners = await listen_named(port, self.config.ha_bind_address, "haListenPort")
        sockname = listeners[0].socket.getsockname()
        self.listen_address = (sockname[0], sockname[1])
        log.info("HA service listening on %s:%d", *self.listen_address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._log_differences)
            task_status.started(self.listen_address)
            await trio.serve_listeners(self.handle_stream, listeners, handler_nursery=nursery)

    async def handle_stream(self, stream: trio.abc.Stream) -> None:
        """Serve one slave on ``stream`` until the connection ends (any trio Stream: the
        listener passes TCP streams; tests may pass memory streams)."""
        transport = transport_for(stream, method=self.config.ha_transfer_method)
        address = transport.peer
        # Judged twice: before the handshake, so that a newcomer with no slot to win costs
        # none; and after it, when it takes its slot (an unproven connection may have to
        # make way then), so that a peer that fails the handshake evicts no one.
        if not self.ledger.has_room():
            await self._close_refused(transport, address)
            return
        if self.config.enable_controller_mode and self.autoswitch is None:
            # A controller-mode store serves slaves only while the controller has made it
            # master (its role change sets ``autoswitch``): a slave has no epoch to offer.
            self.peer_log.log(logging.WARNING, ("not master", peer_host(address)),
                              "HA: refused %s: this controller-mode store is not a master "
                              "now", address)
            with trio.CancelScope(shield=True):
                await transport.aclose()
            return
        if self.config.ha_auth_secret is not None and not await self._authenticate(
                transport, address, self.config.ha_auth_secret):
            return
        account = self._admit()
        if account is None:
            await self._close_refused(transport, address)
            return
        autoswitch = self.autoswitch
        if autoswitch is None and self.config.enable_controller_mode:
            self.ledger.drop(account)  # the term ended during the authentication
            with trio.CancelScope(shield=True):
                await transport.aclose()
            return
        connection = (HAConnection(self, transport, address, account) if autoswitch is None
                      else autoswitch.connection(self, transport, address, account))
        self.connections[account.key] = connection
        self.peer_log.log(logging.INFO, ("connected", peer_host(address)),
                          "HA: slave %s connected", address)
        try:
            await connection.run()
        except* (HAConnectionClosed, HAProtocolError, OSError, trio.BrokenResourceError,
                 trio.ClosedResourceError) as group:
            for exc in group.exceptions:
                self.peer_log.log(logging.WARNING, ("closed", peer_host(address), type(exc)),
                                  "HA: connection to slave %s closed: %s", address, exc)
        finally:
            self._drop(connection)
            with trio.CancelScope(shield=True):
                await transport.aclose()

    def _admit(self) -> Account | None:
        """A slot for a new peer, in the ledger: a free one, or the slot of the
        longest-unproven connection, which is closed to free it (``_evict``); None if every
        slot is held by a proven connection.

        Why evict at all: without haAuthSecret nothing tells a slave from a squatter but what
        it does, and a squatter that restates the log end it learnt never acknowledges a byte
        it was carried. Sixteen of them used to hold every slot for as long as they stayed,
        and the real slave was refused. A proven connection (``HAConnection.proven``) is
        never evicted by a newcomer, which has proven nothing yet; the longest-unproven one
        goes first, so that the newest peer — a slave that just reconnected — has the most
        time to prove itself."""
        ledger = self.ledger
        account = ledger.admit(_next_key())
        while ledger.evicted:
            self._evict(ledger.evicted.pop())
        return account

    def _evict(self, account: Account) -> None:
        """Close the connection of ``account``, which the ledger evicted to make room; its
        slot is free at once (its tasks end in their own time)."""
        connection = self.connections.pop(account.key)
        connection.evict()
        self.evicted_connections += 1
        self.peer_log.log(
            logging.WARNING, ("evicted", peer_host(connection.address)),
            "HA: closed connection %s, which had acknowledged no byte it was sent, to make "
            "room for a new peer (haMaxConnections %d); %d evicted so far",
            connection.address, self.config.ha_max_connections, self.evicted_connections,
        )

    async def _close_refused(self, transport: HATransport, address: str) -> None:
        self._refuse_connection(address)
        with trio.CancelScope(shield=True):
            await transport.aclose()

    async def _authenticate(self, transport: HATransport, address: str, secret: str) -> bool:
        """With haAuthSecret: the peer proves it knows the secret before anything else
        (``trio_ha.wire.ha_auth``); one that does not is closed, having had nothing.

        Handshakes have their own budget (ha_max_connections at once, apart from the
        established connections), and a new one past it ends the oldest: a real slave's
        handshake takes a round trip, so peers that connect and stay silent (each could
        wait HANDSHAKE_TIMEOUT) cannot keep it out."""
        scope = trio.CancelScope(deadline=trio.current_time() + HANDSHAKE_TIMEOUT)
        pending = self._handshakes
        if len(pending) >= self.config.ha_max_connections:
            pending.popleft().cancel()
        pending.append(scope)
        why: object = None
        try:
            with scope:
                await authenticate_slave(transport, secret)
            if not scope.cancelled_caught:
                return True
            why = (f"no handshake within {HANDSHAKE_TIMEOUT:g} s"
                   if trio.current_time() >= scope.deadline
                   else "its handshake made way for a newer one (too many at once)")
        except (HAProtocolError, OSError, trio.BrokenResourceError,
                trio.ClosedResourceError) as exc:
            why = exc
        finally:
            if scope in pending:
                pending.remove(scope)
        self.auth_failures += 1
        self.peer_log.log(logging.WARNING, ("auth", peer_host(address)), "HA: %s refused: %s",
                          address, why)
        with trio.CancelScope(shield=True):
            await transport.aclose()
        return False

    def _refuse_connection(self, address: str) -> None:
        """Count a connection refused at ha_max_connections; log it at most every
        REFUSAL_LOG_INTERVAL, with how many went unlogged (a peer that keeps connecting must
        not fill the log)."""
        self._refused += 1
        self._refused_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at < REFUSAL_LOG_INTERVAL:
            return
        log.warning(
            "HA: refused connection from %s: %d HA connections is the limit "
            "(haMaxConnections); %d refused since the last such line",
            address, self.config.ha_max_connections, self._refused_unlogged,
        )
        self._refusal_logged_at = now
        self._refused_unlogged = 0

    # ---- acks and SYNC_MASTER ---------------------------------------------------------------

    def _drop(self, connection: HAConnection) -> None:
        """Take ``connection`` out of the table and its acks out of the ledger (once: an
        evicted one is taken out when it is evicted, and its tasks end later)."""
        if self.connections.get(connection.account.key) is connection:
            del self.connections[connection.account.key]
        self.ledger.drop(connection.account)

    def is_slave_ok(self, end: int) -> bool:
        """Enough live slaves within haSlaveFallbehindMax of ``end`` to wait for them."""
        return self.ledger.is_slave_ok(end)

    # ---- observability ------------------------------------------------------------------

    async def _log_differences(self) -> None:
        """RocketMQ's printMasterAndSlaveDiff, per slave and never negative."""
        while True:
            await trio.sleep(DIFF_LOG_INTERVAL)
            for connection in list(self.connections.values()):
                stats = connection.statistics()
                log.info("HA: slave %s is %d bytes behind the master (state %s)",
                         stats.address, stats.lag_bytes, stats.state)

    def statistics(self) -> HAMasterStatistics:
        return HAMasterStatistics(
            listen_address=self.listen_address,
            master_offset=self.commitlog.max_offset,
            replicated_offset=self.replicated.value,
            connections=tuple(c.statistics() for c in self.connections.values()),
            max_connections=self.config.ha_max_connections,
            refused_connections=self._refused,
            auth_failures=self.auth_failures,
            evicted_connections=self.evicted_connections,
        )



def _ledger_for(service: HAService) -> ReplicationLedger:
    """The ledger of ``service``, from its config (its ``replicated`` starts where the
    service's watermark is)."""
    config = service.config
    return ReplicationLedger(
        sync_acks=config.ha_sync_acks, fallbehind_max=config.ha_slave_fallbehind_max,
        max_connections=config.ha_max_connections, replicated=service.replicated.value,
    )


_keys = itertools.count()


def _next_key() -> int:
    """A key for a new connection, never used before in this process."""
    return next(_keys)
