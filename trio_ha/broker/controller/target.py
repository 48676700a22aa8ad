"""The broker as the controller link sees it: roles to take, figures to report.

``link.ControllerLink`` decides; this adapter performs on a ``Broker``:

- become master → ``Broker.change_to_master(epoch)`` (the store stops copying, cuts a torn
  tail, waits for dispatch and takes puts; the broker registers as id 0 with the epoch as its
  state version), then the in-sync set the controller named;
- become slave → ``Broker.change_to_slave(master_addr, None, broker_id, epoch)``. The HA
  address stays None: in controller mode a slave learns its master's HA address only from its
  name server registration answer, as RocketMQ's does (spec §2.5);
- the heartbeat's figures: the store's last epoch, its log end and its confirm offset.

The broker's own nursery owns what each role runs, so a change here is one call each way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ...wire.controller import SyncStateSet

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["BrokerTarget"]


@attrs.define(eq=False)
class BrokerTarget:
    broker: Broker
    #: the in-sync set the controller last gave this broker as master
    sync_state_set: SyncStateSet = attrs.field(factory=SyncStateSet)

    async def change_to_master(self, epoch: int, sync_state_set: SyncStateSet,
                               same_master: bool) -> None:
        await self.broker.change_to_master(epoch)
        self.apply_sync_state_set(sync_state_set)

    async def change_to_slave(self, master_addr: str, master_id: int, epoch: int,
                              broker_id: int) -> None:
        await self.broker.change_to_slave(master_addr, None, broker_id, epoch)

    def apply_sync_state_set(self, sync_state_set: SyncStateSet,
                             asked_at: float | None = None) -> None:
        if sync_state_set.epoch >= self.sync_state_set.epoch:
            self.sync_state_set = sync_state_set

    def take_proposal(self, now: float) -> SyncStateSet | None:
        return None

    def proposal_answered(self, accepted: SyncStateSet | None, code: int | None,
                          now: float) -> None:
        return None

    def last_epoch(self) -> int:
        epochs = self.broker.store.epochs
        return epochs.last_epoch if epochs is not None else 0

    def max_offset(self) -> int:
        return self.broker.store.commitlog.max_offset

    def confirm_offset(self) -> int:
        return self.broker.store.max_commitlog_offset
