"""Controller mode on a ``Broker``: what the controller link performs, and the two requests
a controller-mode broker answers.

``controller`` (the package) holds what needs no broker: the identity files, the pure rules,
and the link that talks to the controllers. This module is where they meet the broker, so the
package never imports it back.

**The adapter** (``BrokerTarget``, the link's ``RoleTarget``):

- become master → ``Broker.change_to_master(epoch)`` (the store stops copying, cuts a torn
  tail, waits for dispatch and takes puts; the broker registers as id 0 with the epoch as its
  state version), then the in-sync set the controller named;
- become slave → ``Broker.change_to_slave(master_addr, None, broker_id, epoch)``. The HA
  address stays None: in controller mode a slave learns its master's HA address only from its
  name server registration answer, as RocketMQ's does (spec §2.5);
- the heartbeat's figures: the store's last epoch, its log end and its confirm offset.

**The requests** (``admin.HANDLERS`` routes them here):

- NOTIFY_BROKER_ROLE_CHANGED (1008), from a controller after an election: handed to the
  link's deciding task (``ControllerLink.role_notice``), which acts on it only if its master
  epoch is newer than the one the broker acted on last. Answered at once: the controller
  ignores the answer, and a role change may take seconds.
- GET_BROKER_EPOCH_CACHE (1007), from mqadmin's ``getBrokerEpoch``: the store's epoch history
  with each entry's end (the next one's start; the open last one ends at Java's
  Long.MAX_VALUE, as RocketMQ's master reports it) and the log end.

A broker not in controller mode answers both as RocketMQ's does: SYSTEM_ERROR.
"""

from __future__ import annotations

import attrs
import trio

from ..remoting import RemotingConnection
from ..store import SyncState
from ..wire.controller import EpochEntryCacheBody, EpochEntryView, SyncStateSet
from ..wire.errors import WireError
from ..wire.layout import INT64_MAX
from ..wire.remoting import RemotingCommand, ResponseCode
from .broker import Broker

__all__ = ["BrokerTarget", "broker_epoch_cache", "notify_role_changed"]

@attrs.define(eq=False)
class BrokerTarget:
    broker: Broker
    #: the in-sync set of this broker's current master term (None: not master)
    sync_state: SyncState | None = None

    async def change_to_master(self, epoch: int, sync_state_set: SyncStateSet,
                               same_master: bool) -> None:
        link = self.broker.controller_link
        assert link is not None and link.identity is not None
        self.sync_state = None
        self.sync_state = await self.broker.change_to_controller_master(
            epoch, link.identity.broker_id, sync_state_set.members, sync_state_set.epoch)

    async def change_to_slave(self, master_addr: str, master_id: int, epoch: int,
                              broker_id: int) -> None:
        self.sync_state = None
        await self.broker.change_to_controller_slave(master_addr, broker_id, epoch)

    def apply_sync_state_set(self, sync_state_set: SyncStateSet,
                             asked_at: float | None = None) -> None:
        state = self.sync_state
        if state is None:
            return
        when = trio.current_time() if asked_at is None else asked_at
        state.controller_set(sync_state_set.members, sync_state_set.epoch, when)
        # Whatever the step said: raising the puts' watermark to where it is costs nothing.
        self.broker.store.raise_replicated()

    def take_proposal(self, now: float) -> SyncStateSet | None:
        state = self.sync_state
        if state is None:
            return None
        state.tick(now)
        proposal = state.take_proposal(now)
        return None if proposal is None else SyncStateSet(proposal.members, proposal.epoch)

    def proposal_answered(self, accepted: SyncStateSet | None, code: int | None,
                          now: float) -> None:
        state = self.sync_state
        if state is None:
            return
        if accepted is not None:
            state.accepted(accepted.members, accepted.epoch, now)
        else:
            state.refused(code, now)
        self.broker.store.raise_replicated()

    def last_epoch(self) -> int:
        epochs = self.broker.store.epochs
        return epochs.cache.last_epoch if epochs is not None else 0

    def max_offset(self) -> int:
        return self.broker.store.commitlog.max_offset

    def confirm_offset(self) -> int:
        state = self.sync_state
        if state is not None:
            return state.confirm_offset
        return self.broker.store.max_commitlog_offset


# ---- the requests ------------------------------------------------------------------

#: RocketMQ's remark (with its trailing space) for a classic broker
ONLY_CONTROLLER_MODE = "this request only for controllerMode "


def notify_role_changed(broker: Broker, request: RemotingCommand,
                        connection: RemotingConnection) -> RemotingCommand:
    link = broker.controller_link
    if link is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=ONLY_CONTROLLER_MODE)
    try:
        link.role_notice(request)
    except WireError as exc:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=str(exc)[:256])
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


def broker_epoch_cache(broker: Broker, request: RemotingCommand,
                       connection: RemotingConnection) -> RemotingCommand:
    if broker.controller_link is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=ONLY_CONTROLLER_MODE)
    epochs = broker.store.epochs
    entries = list(epochs.cache.entries) if epochs is not None else []
    views = tuple(
        EpochEntryView(entry.epoch, entry.start_offset,
                       entries[i + 1].start_offset if i + 1 < len(entries) else INT64_MAX)
        for i, entry in enumerate(entries))
    body = EpochEntryCacheBody(broker.config.broker_cluster_name, broker.config.broker_name,
                               broker.registration.broker_id, views,
                               broker.store.commitlog.max_offset)
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body.encode())
