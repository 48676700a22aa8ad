"""The slave's side of RocketMQ 5's AutoSwitch HA protocol (controller mode): the client that
finds where its log and a new master's agree, cuts its own log back to there, and copies on.

After a failover a slave may hold bytes its new master never had: the old master wrote them
and died before anyone copied them, or this store is that old master, rejoining. The classic
client could only report such a divergence and wait for an operator; this one settles it as
RocketMQ 5 does, from the epoch histories. A session:

1. connect (and prove haAuthSecret, if set), as the classic client does;
2. send the handshake (this broker's controller brokerId), again every 5 s until the master
   answers with its log end and epoch list;
3. find the consistent point (``EpochCache.find_consistent_point``: the newest epoch both
   histories hold with the same start, up to the shorter end); cut the log back to it with
   ``MessageStore.truncate_to`` (crash-safe: a kill half way leaves the cut store at the
   next open), and drop the epoch entries from it on. No point (-1): the logs share nothing
   this slave can keep; the session fails, says so in the log, and tries again after 2 s,
   as RocketMQ does. A store with no epoch history at all (a classic store turned
   controller-mode) keeps its log and asks to continue at its end, unchecked, as RocketMQ's;
4. ack the log end: the master's first ack is the request, where it starts;
5. receive frames straight into the commitlog mapping, as the classic client does (the
   receive loop and the acks are the classic session's shape, its ``Reports`` included);
   record an epoch entry when a frame starts an epoch this log has not seen, before its bytes
   are written and acked (a crash then cannot leave acked bytes whose epoch the log forgot;
   the frame RocketMQ labels with the next epoch, starting at its end, is recorded after its
   body), and keep the confirm offset: the master's, capped at the local end once the
   frame's body is in (as RocketMQ's slave sets it), which the store's consume queues are
   built up to (``MessageStore.follow_confirm``).

Everything else — the back-off between sessions, following a new master address, the
``diverged`` state for a frame that does not continue the log (after a truncation that can
only be a broken or hostile master) — is the classic client's (``slave.HAClient``): this is
that client with another session.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import attrs
import trio

from ..._errors import TrioHAError
from ...wire.ha_autoswitch import (
    NEED_DATA,
    AutoSwitchSlaveProtocol,
    FrameData,
    FrameEnd,
    HandshakeReply,
    HAProtocolError,
    TransferHeader,
)
from ..commitlog import CommitLog
from .epochs import EpochEntry, EpochFile
from .slave import YIELD_BYTES, HAClient, HAClientState, MasterConnectionLost, Reports
from .transfer import HATransport

log = logging.getLogger(__name__)

#: how often the handshake is sent again while the master does not answer (RocketMQ's)
HANDSHAKE_REPEAT = 5.0
#: how long a slave whose log shares no epoch with its master waits before it tries again
NO_CONSISTENT_POINT_RETRY = 2.0
RECEIVE_SIZE = 64 * 1024


class HandshakeFailed(HAProtocolError):
    """The slave could not bring its log to a point the master's continues (no common
    epoch, or the cut was refused): the session ends and is tried again."""


class ReplicaStore(Protocol):
    """What the client needs of its store (``MessageStore``): the epoch history it keeps
    up to date, and the crash-safe cut."""

    commitlog: CommitLog
    epochs: EpochFile | None

    async def truncate_to(self, offset: int, *, for_new_master: bool = False) -> int: ...

    def follow_confirm(self, offset: int) -> None: ...


class _Acks:
    """The AutoSwitch ack, as ``Reports`` asks for a report."""

    def __init__(self, protocol: AutoSwitchSlaveProtocol) -> None:
        self.send_report = protocol.send_ack


@attrs.define(eq=False)
class AutoSwitchHAClient(HAClient):
    """The HA client of a controller-mode slave (see the module)."""

    store: ReplicaStore = attrs.field(kw_only=True)
    #: this broker's controller brokerId, named in the handshake
    broker_id: int = attrs.field(kw_only=True)
    #: the master's confirm offset, capped at the local log end (-1: none heard yet)
    confirm_offset: int = -1
    #: where the last handshake's consistent point was, and the bytes it cut (statistics)
    consistent_point: int | None = None
    truncated_bytes: int = 0

    async def _replicate(self, transport: HATransport, address: str) -> None:
        protocol = AutoSwitchSlaveProtocol(self.broker_id)
        self.state = HAClientState.HANDSHAKE
        reply = await self._handshake(transport, protocol)
        local_end = await self._truncate(address, reply)
        protocol.start_transfer(local_end)
        await transport.send_all(protocol.send_ack(local_end))
        self.state = HAClientState.TRANSFER
        self.connected_since = time.time()
        log.info("HA: replicating from %s (AutoSwitch, master epoch %d), local log ends at %d",
                 address, reply.last_epoch, local_end)
        reports = Reports(transport, _Acks(protocol), self.commitlog.written, local_end,
                          self.config.ha_send_heartbeat_interval / 1000)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reports.run)
            await self._receive_frames(transport, protocol, reports)

    async def _handshake(self, transport: HATransport,
                         protocol: AutoSwitchSlaveProtocol) -> HandshakeReply:
        """Send the handshake until the master answers (within haHousekeepingInterval)."""
        with trio.fail_after(self.config.ha_housekeeping_interval / 1000):
            while True:
                await transport.send_all(protocol.send_handshake())
                with trio.move_on_after(HANDSHAKE_REPEAT):
                    while True:
                        data = await transport.receive_some(RECEIVE_SIZE)
                        if not data:
                            raise MasterConnectionLost("master closed the connection")
                        protocol.receive_data(data)
                        event = protocol.next_event()
                        if isinstance(event, HandshakeReply):
                            return event

    async def _truncate(self, address: str, reply: HandshakeReply) -> int:
        """Bring the log to the point where the master's continues it; the log end then."""
        store, commitlog = self.store, self.commitlog
        epochs = store.epochs
        if epochs is None:
            epochs = store.epochs = await trio.to_thread.run_sync(
                EpochFile.load, self.config.epoch_file_path)
        local_end = commitlog.max_offset
        if not len(epochs.cache):
            if local_end:
                log.warning("HA: this slave has no epoch history: it continues its log at %d "
                            "from %s unchecked, as RocketMQ does", local_end, address)
            self.consistent_point = local_end
            return local_end
        master_epochs = [EpochEntry(e.epoch, e.start_offset) for e in reply.epochs]
        point = epochs.cache.find_consistent_point(master_epochs, reply.master_max_offset,
                                                   local_end)
        if point < 0:
            log.error(
                "HA: the log of this slave (epochs %s, end %d) shares no epoch with the log "
                "of master %s (epochs %s, end %d): it cannot copy from it; trying again in "
                "%g s. Fix: check that %s is this broker set's master; if it is, this "
                "store's data is not its set's: move it aside and restart the broker.",
                _describe(epochs.cache.entries), local_end, address, _describe(master_epochs),
                reply.master_max_offset, NO_CONSISTENT_POINT_RETRY, address)
            await trio.sleep(NO_CONSISTENT_POINT_RETRY)
            raise HandshakeFailed(f"no consistent point with master {address}")
        self.consistent_point = point
        if point < local_end:
            log.warning("HA: truncating this slave's log from %d to %d, the last point its "
                        "epochs share with master %s", local_end, point, address)
            try:
                self.truncated_bytes += await store.truncate_to(point)
            except TrioHAError as exc:  # a TruncationError: the store is as it was
                raise HandshakeFailed(f"cannot truncate to {point}: {exc}") from exc
        if any(e.start_offset >= point for e in epochs.cache.entries):
            await trio.to_thread.run_sync(epochs.truncate_from, point)
        return commitlog.max_offset

    async def _receive_frames(self, transport: HATransport, protocol: AutoSwitchSlaveProtocol,
                              reports: Reports) -> None:
        """The classic receive loop (``HAClient._receive``), with this protocol's events."""
        commitlog = self.commitlog
        silence = self.config.ha_housekeeping_interval / 1000
        body_offset = 0  # log offset of the next body byte
        frame_size = 0  # bytes in the body being received
        report = reports.before_wait
        unyielded = 0
        #: an epoch RocketMQ labelled a frame with, starting at its end: recorded after it
        starting: tuple[int, int] | None = None
        #: the confirm offset of the frame being received (-1: the master sent none)
        confirm = -1
        with trio.CancelScope(deadline=trio.current_time() + silence) as quiet:
            while True:
                wanted = protocol.bytes_wanted
                if protocol.body_remaining:
                    segment = await commitlog.replica_segment(body_offset)
                    start = segment.wrote_position
                    n = await transport.receive_into_segment_eagerly(
                        segment, start, start + min(wanted, segment.size - start), frame_size,
                        report)
                    if n == 0:
                        raise MasterConnectionLost("master closed the connection")
                    commitlog.replica_appended(segment, n)
                    protocol.body_received(n)
                    body_offset += n
                else:
                    data = await transport.receive_eagerly(wanted, report)
                    if not data:
                        raise MasterConnectionLost("master closed the connection")
                    n = len(data)
                    protocol.receive_data(data)
                quiet.deadline = trio.current_time() + silence
                while (event := protocol.next_event()) is not NEED_DATA:
                    if isinstance(event, TransferHeader):
                        self.last_frame_time = time.time()
                        self._served = True
                        body_offset, frame_size = event.offset, event.size
                        confirm = event.confirm_offset
                        if event.is_heartbeat:
                            self._confirmed(confirm)
                        if event.new_epoch:
                            if event.epoch_start_offset <= event.offset or event.is_heartbeat:
                                # Its bytes are the epoch's: recorded before they are
                                # acked, so that a crash cannot keep acked bytes whose
                                # epoch this log forgot (the next handshake would cut them).
                                await self._record_epoch(event.epoch, event.epoch_start_offset)
                            else:
                                # RocketMQ labels the frame that ends an epoch with the next
                                # one, starting at the frame's end: recorded after the body.
                                starting = (event.epoch, event.epoch_start_offset)
                    elif isinstance(event, FrameData):
                        body_offset = await commitlog.append_replica(body_offset, event.data)
                    elif isinstance(event, FrameEnd):
                        self.bytes_received += event.size
                        if starting is not None:
                            await self._record_epoch(*starting)
                            starting = None
                        self._confirmed(confirm)
                if reports.drained:
                    reports.drained = False
                    unyielded = n
                else:
                    unyielded += n
                    if unyielded >= YIELD_BYTES:
                        unyielded = 0
                        reports.report_now()
                        await trio.lowlevel.checkpoint()
        raise MasterConnectionLost(f"master silent for {silence:g} s")

    def _confirmed(self, offset: int) -> None:
        """The master confirmed its log up to ``offset`` (-1: it has not computed it): this
        store's consume queues may be built up to there, as far as its log goes."""
        if offset >= 0:
            end = self.commitlog.max_offset
            self.confirm_offset = confirm = offset if offset < end else end
            self.store.follow_confirm(confirm)

    async def _record_epoch(self, epoch: int, start: int) -> None:
        """A frame of an epoch this connection had not seen is in: record where the epoch
        began, if it is newer than this log's last (a reconnect restates the current one)."""
        epochs = self.store.epochs
        assert epochs is not None  # loaded by the handshake
        last = epochs.cache.last_entry
        if last is not None and (epoch <= last.epoch or start <= last.start_offset):
            if epoch > last.epoch:
                log.warning("HA: master epoch %d starts at %d, not after this log's epoch %d "
                            "at %d: not recorded (as RocketMQ's cache refuses it)", epoch,
                            start, last.epoch, last.start_offset)
            return
        await trio.to_thread.run_sync(epochs.append, epoch, start)


def _describe(entries: tuple[EpochEntry, ...] | list[EpochEntry]) -> str:
    shown = ", ".join(f"{e.epoch}@{e.start_offset}" for e in entries[-5:])
    return ("..., " if len(entries) > 5 else "") + (shown or "none")
