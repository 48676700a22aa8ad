"""The master side of replication: the HA listener and one connection per slave.

Each slave connection is one nursery with two tasks: the ack reader and the log writer. If
either fails — the peer closed, broke the protocol, went silent past haHousekeepingInterval —
the nursery cancels the other, and ``_handle`` closes the socket and drops the connection from
the table, in one place. RocketMQ's HAConnection runs two threads that each poll with 1 s
selects and tear each other down by flags.

Acks are kept per connection. RocketMQ keeps one global ``push2SlaveMaxOffset``, never lowered
and never checked, so any socket writing eight bytes to port 10912 could make a SYNC_MASTER
report PUT_OK without a slave (issues #1155, #3015). Here an ack beyond what the master has
written closes that connection, and ``replicated`` — what SYNC_MASTER puts wait for — is the
``ha_sync_acks``-th highest ack among live connections.

The writer sleeps on the commitlog's ``written`` watermark: a put wakes it at once (RocketMQ
polls every 100 ms on an ASYNC_MASTER), and with nothing to send it sends a heartbeat every
haSendHeartbeatInterval. A slave that asks for an offset the master cannot serve (below its
first segment, or beyond its end: the logs diverged) gets one heartbeat carrying the master's
offset, which the slave reports as a divergence, and the connection ends.

SYNC_MASTER puts do not wait here: ``replicated`` feeds the group transfer service
(``group_transfer``), which answers them, and ``is_slave_ok`` tells it when there is no slave
worth waiting for.
"""

from __future__ import annotations

import enum
import logging
import time
from typing import NoReturn

import attrs
import trio

from ...config import StoreConfig
from ...watermark import Watermark
from ...wire.ha import NEED_DATA, HAProtocolError, MasterProtocol
from ..commitlog import CommitLog
from .transfer import HATransport, transport_for

log = logging.getLogger(__name__)

RECEIVE_SIZE = 64 * 1024
DIFF_LOG_INTERVAL = 60.0


class HAConnectionClosed(Exception):
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
    requested_offset: int | None
    acked_offset: int | None
    lag_bytes: int
    #: wall-clock time since which the slave has been behind (None: caught up)
    lag_since: float | None
    next_transfer_offset: int | None
    bytes_sent: int


@attrs.frozen
class HAMasterStatistics:
    listen_address: tuple[str, int] | None
    master_offset: int
    replicated_offset: int
    connections: tuple[SlaveConnectionStatistics, ...]


@attrs.define(eq=False)
class HAConnection:
    service: HAService
    transport: HATransport
    address: str
    protocol: MasterProtocol = attrs.field(factory=MasterProtocol)
    state: HAConnectionState = HAConnectionState.WAITING_FOR_REPORT
    connected_since: float = attrs.field(factory=time.time)
    requested_offset: int | None = None
    acked_offset: int | None = None
    next_offset: int | None = None
    #: the log end this connection's slave can hold: where it started, plus every frame handed
    #: to the transport; an ack beyond it acknowledges bytes never sent to it
    sent_offset: int | None = None
    bytes_sent: int = 0
    lag_since: float | None = None
    _first_report: trio.Event = attrs.field(factory=trio.Event)

    @property
    def commitlog(self) -> CommitLog:
        return self.service.commitlog

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._read_acks)
            nursery.start_soon(self._write_log)

    # ---- reader ----------------------------------------------------------------------------

    async def _read_acks(self) -> None:
        silence = self.service.config.ha_housekeeping_interval / 1000
        with trio.CancelScope(deadline=trio.current_time() + silence) as quiet:
            while True:
                data = await self.transport.receive_some(RECEIVE_SIZE)
                if not data:
                    raise HAConnectionClosed("slave closed the connection")
                quiet.deadline = trio.current_time() + silence
                self.protocol.log_end = self.commitlog.max_offset
                self.protocol.receive_data(data)
                while (event := self.protocol.next_event()) is not NEED_DATA:
                    self._on_report(event.offset, event.first)
        raise HAConnectionClosed(f"no report from the slave for {silence:g} s")

    def _on_report(self, offset: int, first: bool) -> None:
        if first:
            self.requested_offset = offset
            self.sent_offset = offset  # what the slave says it has; the writer adjusts
            self._first_report.set()
            if offset > self.commitlog.max_offset:
                return  # a request for bytes we do not have: the writer tells the slave
        elif self.sent_offset is None or offset > self.sent_offset:
            # RocketMQ #1155/#3015: acks must be of bytes this connection carried, or any
            # socket could make a SYNC_MASTER put succeed without a slave.
            raise HAProtocolError(
                f"slave acked offset {offset}, but this connection has carried the log only "
                f"up to {self.sent_offset}"
            )
        self.acked_offset = offset
        if offset >= self.commitlog.max_offset:
            self.lag_since = None
        elif self.lag_since is None:
            self.lag_since = time.time()
        self.service.ack_changed()

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
        assert self.requested_offset is not None  # set with _first_report
        offset = self._start_offset(self.requested_offset)
        if offset < commitlog.min_offset or offset > commitlog.max_offset:
            await self._refuse(offset)
        self.next_offset = offset
        self.sent_offset = offset  # the slave holds (or asked for) everything below the start
        self.state = HAConnectionState.TRANSFER
        batch = config.ha_transfer_batch_size
        heartbeat = config.ha_send_heartbeat_interval / 1000
        last_send = trio.current_time()
        while True:
            if offset < commitlog.max_offset:
                segment = commitlog.segments.find(offset)
                if segment is None:
                    await self._refuse(offset)
                with segment.hold():
                    start = offset - segment.base_offset
                    end = min(segment.wrote_position, start + batch)
                    header = self.protocol.send_frame_header(offset, end - start)
                    # Bytes handed to the kernel can be acked before the send call returns
                    # (trio yields after the syscall): count the frame as carried from here.
                    self.sent_offset = offset + (end - start)
                    await self.transport.send_frame(header, segment, start, end)
                offset += end - start
                self.next_offset = offset
                self.bytes_sent += end - start
                last_send = trio.current_time()
                continue
            with trio.move_on_at(last_send + heartbeat):
                await commitlog.written.wait_for(offset + 1)
                continue
            await self.transport.send_all(self.protocol.send_heartbeat(offset))
            last_send = trio.current_time()

    async def _refuse(self, requested: int) -> NoReturn:
        """The slave asked for bytes this master cannot send. Tell it where the master's log
        is (one heartbeat: the slave sees the offsets disagree and reports the divergence)
        and end the connection — instead of RocketMQ's silent heartbeats forever."""
        commitlog = self.commitlog
        where = commitlog.min_offset if requested < commitlog.min_offset else commitlog.max_offset
        why = (
            "below the master's first retained offset" if requested < commitlog.min_offset
            else "beyond the master's log end (the master lost data the slave has)"
        )
        self.state = HAConnectionState.DIVERGED
        log.error(
            "HA: slave %s asks for offset %d, %s (master log [%d, %d)); replication to it "
            "stops. Fix: wipe the slave's store (or restore the master) and restart the slave.",
            self.address, requested, why, commitlog.min_offset, commitlog.max_offset,
        )
        await self.transport.send_all(self.protocol.send_heartbeat(where))
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
        )


@attrs.define(eq=False)
class HAService:
    """Accepts slave connections and tracks what they hold."""

    config: StoreConfig
    commitlog: CommitLog
    #: the ha_sync_acks-th highest ack among live slaves: what SYNC_MASTER puts wait for
    replicated: Watermark = attrs.field(factory=Watermark)
    connections: dict[int, HAConnection] = attrs.field(factory=dict)
    listen_address: tuple[str, int] | None = None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Listen on haListenPort and serve slaves until cancelled."""
        port = self.config.ha_listen_port
        if port is None:
            raise ValueError("the HA service needs ha_listen_port (0: any free port)")
        listeners = await trio.open_tcp_listeners(port, host=self.config.ha_bind_address)
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
        connection = HAConnection(self, transport, address)
        self.connections[id(connection)] = connection
        log.info("HA: slave %s connected", address)
        try:
            await connection.run()
        except* (HAConnectionClosed, HAProtocolError, OSError, trio.BrokenResourceError,
                 trio.ClosedResourceError) as group:
            for exc in group.exceptions:
                log.warning("HA: connection to slave %s closed: %s", address, exc)
        finally:
            del self.connections[id(connection)]
            with trio.CancelScope(shield=True):
                await transport.aclose()

    # ---- acks and SYNC_MASTER ---------------------------------------------------------------

    def ack_changed(self) -> None:
        acks = sorted(
            (c.acked_offset for c in self.connections.values() if c.acked_offset is not None),
            reverse=True,
        )
        needed = self.config.ha_sync_acks
        if len(acks) >= needed:
            self.replicated.raise_to(acks[needed - 1])

    def is_slave_ok(self, end: int) -> bool:
        """Enough live slaves within haSlaveFallbehindMax of ``end`` to wait for them."""
        limit = self.config.ha_slave_fallbehind_max
        close = sum(
            1 for c in self.connections.values()
            if c.acked_offset is not None and end - c.acked_offset < limit
        )
        return close >= self.config.ha_sync_acks

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
        )
