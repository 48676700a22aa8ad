"""The master's side of RocketMQ 5's AutoSwitch HA protocol (controller mode): one slave
connection, and the term that serves them.

A controller-mode master serves its slaves on the same HA port, through the same service
(``master.HAService``: slots, eviction, authentication, the connection table, the lag log),
but each connection speaks AutoSwitch (``wire.ha_autoswitch``): the slave opens with a
handshake naming its controller brokerId, the master answers with its epoch list and log
end, the slave truncates to the point both logs agree on, and its first ack is its request.
From there it is the classic connection's pump — a reader of acks, a writer of frames
straight from the segment, ``push_now`` from the server's task, a heartbeat after
haSendHeartbeatInterval idle — so ``AutoSwitchConnection`` is an ``HAConnection`` that
overrides only what the protocol changes: what a read decodes, where a transfer starts,
what a frame's header is (a batch is cut at the end of the epoch its bytes were written in,
and carries the confirm offset), and how a heartbeat looks. The classic hot path is the
same code, one method dispatch away.

Which acks count. Each ack is judged first by the replication ledger, as a classic one is
(``ledger.report``): an ack beyond what this connection carried is a protocol error, and an
ack at or below where its transfer started acknowledges nothing (the first ack is a request,
which any peer can make up). What the ledger confirms — the end of bytes this connection
carried and its slave acknowledged — then feeds the in-sync set (``sync_state.SyncState``),
for the slave's controller brokerId. The ledger's own ``replicated`` (the classic
``ha_sync_acks``-th ack) is not used: a controller-mode SYNC_MASTER put waits for what the
in-sync set says (every member's ack, with allAckInSyncStateSet), through the service's
``replicated`` watermark, which the connections raise when the set's answer rises
(``InSyncTransferService`` answers the puts from it, as the classic group transfer does).

A handshake that names the master's own brokerId, or that comes again once the transfer
began, ends that connection only; a newer connection for the same brokerId ends the older
one (the set keeps one connection per replica).

``MasterTerm`` is what one master term serves with: the epoch history as the term began
(entries only change when the term changes or old segments expire; a snapshot keeps the
batch rule free of the file's locking and copying) and the in-sync set of the term. The
controller-mode role change (``store.controller_roles``) makes one and sets it on the HA
service, which then hands it each new connection.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NoReturn

import attrs
import trio

from ...wire.ha_autoswitch import (
    NEED_DATA,
    AutoSwitchMasterProtocol,
    HAProtocolError,
    SlaveHandshake,
    plan_batch,
    transfer_start,
)
from ..results import PutMessageStatus
from ..segment import Segment
from ..sync_requests import SyncRequest
from .epochs import EpochEntry
from .group_transfer import GroupTransferService
from .ledger import RAISE, Account
from .master import HAConnection, HAConnectionClosed, HAService
from .sync_state import Link, SyncState
from .transfer import HATransport

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class MasterTerm:
    """What a controller-mode master serves its slaves with in one term."""

    #: this master's epoch history as the term began, oldest first (its own entry last)
    epochs: tuple[EpochEntry, ...]
    #: the in-sync set of the term (the broker's controller link proposes and applies it)
    sync_state: SyncState

    def connection(self, service: HAService, transport: HATransport, address: str,
                   account: Account) -> HAConnection:
        return AutoSwitchConnection(service, transport, address, account, term=self)

    def group_transfer_service(self, service: HAService) -> GroupTransferService:
        config = service.config
        return InSyncTransferService(
            service.replicated, config.slave_timeout / 1000,
            PutMessageStatus.FLUSH_SLAVE_TIMEOUT, config.sync_request_channel_capacity,
            is_slave_ok=_always, sync_state=self.sync_state,
        )

    def raise_replicated(self, service: HAService) -> None:
        """The set's answer rose: wake the puts it covers."""
        service.replicated.raise_to(self.sync_state.replicated)


def _always(end: int) -> bool:
    """A controller-mode put always waits (the set says for whom; a member without a
    connection holds it to its deadline, FLUSH_SLAVE_TIMEOUT, as RocketMQ's does)."""
    return True


@attrs.define(eq=False)
class InSyncTransferService(GroupTransferService):
    """The group transfer service of a controller-mode master: a put waits until the in-sync
    set's ``replicated`` covers it. The set must know the log grew before a put ending there
    is answered (with nobody but the master in the set, that growth is what answers it), so
    each request tells it first: a comparison, and only on a SYNC_MASTER put's request."""

    sync_state: SyncState = attrs.field(kw_only=True)

    def request(self, end: int, start: float) -> SyncRequest:
        state = self.sync_state
        if state.max_moved(end) is RAISE:
            self.watermark.raise_to(state.replicated)
        return super().request(end, start)


@attrs.define(eq=False)
class AutoSwitchConnection(HAConnection):
    """One slave connection of a controller-mode master (see the module)."""

    term: MasterTerm = attrs.field(kw_only=True)
    autoswitch: AutoSwitchMasterProtocol = attrs.field(factory=AutoSwitchMasterProtocol)
    #: the slave as the in-sync set knows it, once its handshake came
    link: Link | None = None
    #: the reader has something for the writer before the transfer starts (a handshake to
    #: answer, or the request)
    _handshake_step: trio.Event = attrs.field(factory=trio.Event)

    async def run(self) -> None:
        try:
            await super().run()
        finally:
            if self.link is not None:
                self.term.sync_state.drop(self.link)

    # ---- reader ----------------------------------------------------------------------------

    def _on_read(self, data: bytes | bytearray) -> None:
        self.reads += 1
        protocol = self.autoswitch
        protocol.receive_data(data)
        while (event := protocol.next_event()) is not NEED_DATA:
            if isinstance(event, SlaveHandshake):
                self._on_handshake(event)
            elif event.first:
                self._on_request(event.offset)
                self._handshake_step.set()
            else:
                self._on_report(event.offset)

    def _on_handshake(self, handshake: SlaveHandshake) -> None:
        """The slave named itself (again, if its reply was slow: the same name). The writer
        sends the reply."""
        if self.link is None:
            sync_state = self.term.sync_state
            link = sync_state.attach(handshake.broker_id, learner=handshake.async_learner)
            if link is None:
                raise HAProtocolError(
                    f"the peer handshakes as brokerId {handshake.broker_id}, this master's own")
            self.link = link
            superseded, sync_state.superseded[:] = list(sync_state.superseded), []
            for connection in list(self.service.connections.values()):
                if isinstance(connection, AutoSwitchConnection) and connection.link in superseded:
                    connection.evict()
        self._handshake_step.set()

    def _start_offset(self, requested: int) -> int:
        """RocketMQ's rule (``transfer_start``): the request, or for 0 the master's first
        byte (its last segment's, if the handshake asked for that). A start no epoch of
        this master holds (the log older than its first epoch entry) cannot be served: -1,
        which the caller refuses."""
        commitlog = self.commitlog
        handshake = self.autoswitch.handshake
        start = transfer_start(
            requested, min_offset=commitlog.min_offset, max_offset=commitlog.max_offset,
            segment_size=commitlog.segment_size,
            sync_from_last_file=handshake is not None and handshake.sync_from_last_file,
        )
        if start is None:
            return commitlog.min_offset
        if start < commitlog.max_offset and plan_batch(self.term.epochs, start, start) is None:
            return -1
        return start

    def _on_request(self, requested: int) -> None:
        """The first report, as classic HA takes it; and, when the master's log holds no
        byte (an idle new cluster), the slave is caught up by it: nothing is there to lack.
        RocketMQ grows the set on that ack of the log's end; ours counts acks of carried bytes
        only (``ledger``), and an empty log carries none, so without this a slave of a
        cluster nobody has written to yet would stay outside the set until the first put.
        No put waits for the log's end of an empty log, so this answers none; a log with
        bytes still needs them carried and acked (a peer may claim any offset)."""
        super()._on_request(requested)
        commitlog, link = self.commitlog, self.link
        if (link is not None and self.account.start is not None
                and commitlog.max_offset == commitlog.min_offset):
            term = self.term
            if term.sync_state.ack(link, commitlog.max_offset,
                                   trio.current_time()) is RAISE:
                term.raise_replicated(self.service)

    def _on_report(self, offset: int) -> None:
        """An ack after the request: the ledger judges it (HAProtocolError beyond what this
        connection carried), and what it confirms is the slave's ack for the in-sync set."""
        account = self.account
        self.service.ledger.report(account, offset)
        confirmed, link = account.confirmed, self.link
        if confirmed is not None and link is not None:
            term = self.term
            if term.sync_state.ack(link, confirmed, trio.current_time()) is RAISE:
                term.raise_replicated(self.service)
        if account.start is None:
            return
        if offset >= self.commitlog.max_offset:
            self.lag_since = None
        elif self.lag_since is None:
            self.lag_since = time.time()

    # ---- writer ----------------------------------------------------------------------------

    async def _write_log(self) -> None:
        """Answer the handshake (each time the slave asks: it repeats it every 5 s until it
        has an answer), then, once the request came, send the log as the classic writer
        does, with this protocol's frames."""
        protocol = self.autoswitch
        while protocol.request is None:
            await self._handshake_step.wait()
            self._handshake_step = trio.Event()
            if protocol.reply_due:
                reply = protocol.send_handshake_reply(self.term.epochs,
                                                      self.commitlog.max_offset)
                await self.transport.send_all(reply)
        await super()._write_log()

    def _frame(self, segment: Segment, offset: int) -> tuple[bytes, int, int]:
        """The frame from ``offset``: what is written in ``segment`` up to haTransferBatchSize
        (and what a RocketMQ slave's buffer takes), cut at the end of the epoch that wrote
        ``offset``, labelled with that epoch and the set's confirm offset."""
        start = offset - segment.base_offset
        limit = min(segment.wrote_position,
                    start + min(self.service.config.ha_transfer_batch_size,
                                self.autoswitch.max_frame_body))
        batch = plan_batch(self.term.epochs, offset, segment.base_offset + limit)
        if batch is None:  # refused at the request: no epoch holds an offset past it
            raise HAConnectionClosed(f"no epoch of this master holds offset {offset}")
        header = self.autoswitch.send_batch_header(batch, self.term.sync_state.confirm_offset)
        return header, start, start + batch.size

    def _heartbeat(self, offset: int) -> bytes:
        label = plan_batch(self.term.epochs, offset, offset)
        assert label is not None  # the writer's offset is never below the request's start
        return self.autoswitch.send_heartbeat(offset, label.epoch, label.epoch_start_offset,
                                              self.term.sync_state.confirm_offset)

    async def _refuse(self, requested: int) -> NoReturn:
        """The slave asked for bytes this master cannot serve: the connection ends (an
        AutoSwitch slave found its consistent point in the handshake, so this is a slave
        whose log is older than what this master keeps, or a peer making things up)."""
        commitlog = self.commitlog
        self.service.peer_log.log(
            logging.ERROR, ("diverged", self.address),
            "HA: slave %s asks for offset %d, which this master cannot serve (its log [%d, "
            "%d), epochs from %s); replication to it stops", self.address, requested,
            commitlog.min_offset, commitlog.max_offset, _first_start(self.term.epochs),
        )
        await trio.lowlevel.checkpoint()
        raise HAConnectionClosed(f"slave requested offset {requested}, which is not servable")


def _first_start(epochs: Sequence[EpochEntry]) -> int | None:
    return epochs[0].start_offset if epochs else None
