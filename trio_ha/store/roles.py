"""Roles at run time: a store changes between master and slave without a restart.

RocketMQ 5's controller mode moves the master of a broker group from one process to another
(``ReplicasManager.changeToMaster`` / ``changeToSlave``, spec ``controller-mode.md`` §2.4), so
a store's role cannot be a constant of its configuration. ``MessageStore.role`` is the role
now; the put path reads it through the one flag it always read (``Admission.accepting``), so
the change costs a put nothing.

What each role runs is a short list (``services_for``): a slave runs its HA client, a
SYNC_MASTER its group transfer service, an ASYNC_MASTER nothing of its own (the HA listener,
flush, dispatch and the rest run in every role). They run in a ``RoleScope``: one cancel
scope of their own inside the store's nursery, so that leaving a role cancels exactly what
that role started, and waits until it has ended — the group transfer service answers every
put still waiting as it ends (``sync_requests``), so a put is answered once, and never
PUT_OK for bytes no slave acknowledged. The broker runs its own role's services (the delay
schedule, the transaction check, the slave's metadata sync) in a ``RoleScope`` of its own.

Becoming a master, in order (RocketMQ's ``AutoSwitchHAService.changeToMaster``):

1. the HA client stops: nothing more is written into the log by replication;
2. the log is flushed and the consume queues are brought up to its end (``settle``). A
   slave receives byte ranges, not records, so its log may end inside a record whose rest
   never came; dispatch stops at the last whole record, and what follows it — the torn
   tail — is sealed: zeroed, and the segment closed there with the blank record that ends
   a segment (RocketMQ's END_OF_FILE), synced, so the next put goes to a new segment.
   Recovery cuts a torn tail at open by lowering the log's end; at run time the end only
   rises, because the tasks waiting for the log to grow (dispatch, group commit, long polls)
   wait for an offset past the torn bytes, and would wait until the log grew past them again;
3. the next queue offsets come from the consume queues, as after recovery;
4. the SYNC_MASTER's group transfer service starts, and the HA connections served as a
   slave are closed (their peers may hold the torn bytes; they come back and say where
   their logs end, as RocketMQ's ``destroyConnections`` makes them);
5. puts are accepted.

Becoming a slave: puts are refused at once; the slaves attached get up to slaveTimeout to
take what was written (``hand_over``: an orderly switch leaves the new master with every
byte, so this store then follows it as a prefix, where classic HA can only report a
divergence); the group transfer service ends, answering what waits; the HA client starts.

A change that is cancelled part-way leaves a store that refuses puts and runs no HA client:
change its role again. One change runs at a time (``RoleScope.changing``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import attrs
import trio

import trio_ha._backend as _backend

from .._errors import TrioHAError
from ..config import BrokerRole, FlushDiskType, StoreConfig
from ..watermark import Watermark
from ..wire.layout import END_FILE_MIN_BLANK_LENGTH
from .commitlog import CommitLog, SegmentUnavailable
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .ha.group_transfer import GroupTransferService
from .ha.master import HAService
from .ha.slave import HAClient
from .health import RETRY_INTERVAL

log = logging.getLogger(__name__)

#: a role's service: a task started with ``nursery.start`` (it reports when it runs)
Service = Callable[..., Awaitable[None]]
#: scheduling rounds a role change waits for the HA connections it closed to end
CLOSE_ROUNDS = 100


class RoleChangeError(TrioHAError):
    """The store cannot take the role asked for (it is closed, or its log cannot be made
    whole); it refuses puts and runs no HA client until a change succeeds."""


def waits_for(role: BrokerRole, flush_disk_type: FlushDiskType) -> bool:
    """Whether a put of a store in ``role`` waits after its append: for the disk (SYNC_FLUSH)
    or for slaves (SYNC_MASTER)."""
    return flush_disk_type is FlushDiskType.SYNC_FLUSH or role is BrokerRole.SYNC_MASTER


class RoleStore(Protocol):
    """What a role change needs of the store (``MessageStore``)."""

    config: StoreConfig
    commitlog: CommitLog
    queues: ConsumeQueueTable
    dispatcher: Dispatcher
    ha_service: HAService | None
    ha_client: HAClient | None
    group_transfer: GroupTransferService | None
    role_scope: RoleScope | None

    @property
    def role(self) -> BrokerRole: ...

    @property
    def confirmed(self) -> Watermark: ...

    def take_role(self, role: BrokerRole) -> None: ...


def services_for(store: RoleStore) -> list[Service]:
    """What the store's current role runs beside the services of every role."""
    services: list[Service] = []
    if store.group_transfer is not None:
        services.append(store.group_transfer.run)
    if store.ha_client is not None:
        services.append(store.ha_client.run)
    return services


@attrs.define(eq=False)
class RoleScope:
    """The services of one role, in a cancel scope of their own inside ``nursery``: leaving
    the role cancels exactly them (``stop``), and the next role's start in a new scope."""

    nursery: trio.Nursery
    #: held for the whole of a role change: one at a time
    changing: trio.Lock = attrs.field(factory=trio.Lock)
    _scope: trio.CancelScope | None = None
    _ended: trio.Event | None = None

    async def start(self, services: Sequence[Service]) -> None:
        """Start ``services`` (each reports that it runs) in a new scope; the previous
        role's must have been stopped."""
        if self._scope is not None:
            raise RuntimeError("the previous role's services still run: stop them first")
        self._scope, self._ended = await self.nursery.start(self._run, tuple(services))

    async def _run(self, services: tuple[Service, ...], *,
                   task_status: trio.TaskStatus[tuple[trio.CancelScope, trio.Event]]) -> None:
        ended = trio.Event()
        try:
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    for service in services:
                        await nursery.start(service)
                    task_status.started((scope, ended))
                    await trio.sleep_forever()  # a role with no service still has a scope
        finally:
            ended.set()

    async def stop(self) -> None:
        """Cancel the current role's services and wait until they have ended (a group
        transfer service has answered every put that waited by then)."""
        scope, ended = self._scope, self._ended
        self._scope = self._ended = None
        if scope is None or ended is None:
            await trio.lowlevel.checkpoint()
            return
        scope.cancel()
        await ended.wait()


def _scope_of(store: RoleStore) -> RoleScope:
    scope = store.role_scope
    if scope is None:
        raise RoleChangeError("the store is not running: its role cannot change")
    return scope


async def change_to_master(store: RoleStore,
                           role: BrokerRole = BrokerRole.SYNC_MASTER) -> None:
    """Make ``store`` a master of kind ``role`` (see the module for the order)."""
    if role is BrokerRole.SLAVE:
        raise ValueError("change_to_master takes SYNC_MASTER or ASYNC_MASTER")
    roles = _scope_of(store)
    async with roles.changing:
        was = store.role
        if was is role:
            await trio.lowlevel.checkpoint()
            return
        await roles.stop()
        store.ha_client = None
        store.group_transfer = None
        if was is BrokerRole.SLAVE:
            await settle(store)
            await close_ha_connections(store)
        if role is BrokerRole.SYNC_MASTER and store.ha_service is not None:
            store.group_transfer = store.ha_service.group_transfer_service()
        await roles.start(services_for(store))
        store.take_role(role)
        log.info("store %s: %s -> %s at commitlog offset %d", store.config.store_path_root_dir,
                 was.value, role.value, store.commitlog.max_offset)


async def change_to_slave(store: RoleStore, master_ha_address: str | None) -> None:
    """Make ``store`` a slave that copies from ``master_ha_address`` (None: the configured
    haMasterAddress, or, without one, whatever the name server names later). A slave told of
    another master follows it."""
    roles = _scope_of(store)
    address = master_ha_address or store.config.ha_master_address or None
    async with roles.changing:
        was = store.role
        if was is BrokerRole.SLAVE and store.ha_client is not None:
            await trio.lowlevel.checkpoint()
            store.ha_client.update_master_address(address)
            return
        store.take_role(BrokerRole.SLAVE)  # no put is taken from here on
        await hand_over(store)
        await roles.stop()  # the group transfer service answers what still waits
        store.group_transfer = None
        await close_ha_connections(store)
        store.ha_client = HAClient(store.config, store.commitlog, address)
        await roles.start(services_for(store))
        log.info("store %s: %s -> SLAVE of %s at commitlog offset %d",
                 store.config.store_path_root_dir, was.value, address or "(not known yet)",
                 store.commitlog.max_offset)


async def hand_over(store: RoleStore) -> None:
    """Give the attached slaves up to slaveTimeout to acknowledge the whole log, which grows
    no more. A put waiting for them may still be answered PUT_OK meanwhile; a slave that
    has every byte can become the next master without this store diverging from it."""
    service = store.ha_service
    if service is None or not service.connections:
        await trio.lowlevel.checkpoint()
        return
    with trio.move_on_after(store.config.slave_timeout / 1000):
        await service.replicated.wait_for(store.commitlog.max_offset)


async def settle(store: RoleStore,
                 cut: Callable[[int], Awaitable[object]] | None = None) -> None:
    """Make the log whole and the consume queues complete, once nothing writes into it: flush
    it, dispatch every whole record, seal a torn tail (or, with ``cut``, cut the log back to
    its last whole record: controller mode, where the new master's epoch must begin exactly
    where its whole records end, so that a slave holding the torn bytes cuts them too), and
    derive the next queue offsets."""
    commitlog, dispatcher = store.commitlog, store.dispatcher
    await commitlog.flush(0)  # (SYNC_FLUSH dispatches only what is flushed)
    while True:
        if dispatcher.error is not None:
            raise RoleChangeError(f"the commitlog cannot be dispatched: {dispatcher.error}")
        passed = dispatcher.dispatch_available(store.confirmed.value)
        if dispatcher.stalled is not None:
            await trio.sleep(RETRY_INTERVAL)  # a full disk: the queues must be whole first
            continue
        await trio.lowlevel.checkpoint()
        if passed == 0:
            break
    end = dispatcher.cursor
    last = commitlog.segments.last
    if last is not None and end > commitlog.max_offset:
        # The log ends inside the blank record that closes a segment: it is closed.
        commitlog.end_segment(last)
    elif end < commitlog.max_offset:
        if cut is not None:
            await cut(end)
        else:
            await seal_torn_tail(commitlog, end)
    # A closed segment is flushed to its end: the blank record is all that follows its last
    # record. Under SYNC_FLUSH readers see only flushed bytes (``confirmed``), so without
    # this the log's visible end would stay inside the blank record until the next put's
    # flush.
    await commitlog.flush(0)
    commitlog.queue_offsets = {
        (queue.topic, queue.queue_id): queue.max_offset for queue in store.queues
    }
    while not commitlog.segments.segments and commitlog.writable_segment() is None:
        # An empty slave had no segment (its master would have started the log); a master
        # appends into one: the allocator's spare, at the log's start (one creator per file).
        try:
            await commitlog.wait_for_segment()
        except SegmentUnavailable as exc:
            raise RoleChangeError(f"no first commitlog segment: {exc}") from exc


async def seal_torn_tail(commitlog: CommitLog, end: int) -> None:
    """Close the last segment at ``end``, the end of its last whole record: zero the bytes
    after it (a record cut short, at most one), write the blank record that ends a segment
    there, and sync both before any put comes, so that no crash finds the torn bytes again
    with new records after them (recovery would stop at them and lose those). The log's end
    rises to the segment's end; nothing of it is lowered."""
    last = commitlog.segments.last
    if last is None or end < last.base_offset:
        raise RoleChangeError(
            f"the commitlog's whole records end at {end}, before its last segment: "
            "a torn tail never spans segments (run trio-ha verify on this store)"
        )
    start, stop = end - last.base_offset, last.wrote_position
    _backend.engine.zero(last.handle, start, stop - start)
    last.wrote_position = start
    commitlog.end_segment(last)  # the blank record at ``start``; ``written`` rises
    synced = max(stop, min(start + END_FILE_MIN_BLANK_LENGTH, last.size))
    with last.hold():
        await trio.to_thread.run_sync(last.sync_range, start, synced)
    log.warning("commitlog: sealed the segment at offset %d after the last whole record: "
                "%d bytes of a record cut short (the rest never came from the old master) "
                "are gone; the log goes on at %d", end, stop - start, last.end_offset)


async def close_ha_connections(store: RoleStore) -> None:
    """Close every HA connection this store serves, and wait until they are out of its table:
    each peer connects again and says where its log ends, judged against the log as the new
    role has it, and no put of the new role is pushed to a connection of the old one (a
    server pushes each round's puts to the connections in the table, from its own task)."""
    service = store.ha_service
    if service is None or not service.connections:
        await trio.lowlevel.checkpoint()
        return
    closing = list(service.connections.values())
    for connection in closing:
        connection.evict()
    # An evicted connection leaves the table as its tasks end, a few scheduling rounds
    # later (it has no event to wait on); bounded, in case one is slow to end.
    for _ in range(CLOSE_ROUNDS):
        await trio.lowlevel.checkpoint()
        connections = service.connections
        if not any(connections.get(c.account.key) is c for c in closing):
            return
    log.warning("HA: %d connections of the old role still closing after %d rounds",
                len(closing), CLOSE_ROUNDS)
