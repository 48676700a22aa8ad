"""Role changes of a controller-mode store: the classic role changes (``roles``) with the
AutoSwitch HA protocol and the epoch history.

The controller names a store's role and the master's epoch (RocketMQ 5's
``ReplicasManager``); the broker's controller link calls these. They are ``roles``'
changes in the same order, with the helpers of that module (``settle``, ``hand_over``,
``close_ha_connections``, the ``RoleScope``), and three differences:

- Becoming master, the new epoch's entry (epoch, the log's end once a torn tail is cut) is
  appended to the epoch file before a put is accepted (RocketMQ's ``changeToMaster``); if
  the file refuses it (the last epoch began at the same offset: nothing was written since),
  that is logged and the term serves under the last entry, as RocketMQ's does. The HA
  service is given the term (``autoswitch_master.MasterTerm``: the epoch history and the
  in-sync set), so its connections speak AutoSwitch and SYNC_MASTER puts wait for the set.
  Elected again while master (a new epoch), the store starts a new term the same way: its
  slaves reconnect and handshake against the new history.
- Becoming slave, the HA client is the AutoSwitch client (``autoswitch_slave``), which cuts
  the log to the point it shares with its master before it copies; the HA service's term
  ends (a controller-mode slave serves no slave), and what its acks had answered is set
  back, so that the cut is not refused for acks of a term that is over.
- The epoch file is loaded (in a worker thread) the first time a role needs it, and kept
  on the store (``MessageStore.epochs``), so that a truncation cuts the history the store
  serves from.

Each change also says what the store's confirm offset (``confirm``: how far its consume
queues are built) follows. A slave becoming master shows its whole log (RocketMQ's election
leaves the new master alone in its set), then the term's in-sync set, which starts from what
readers saw; a master's term makes its puts ask the set first when minInSyncReplicas is
above 1 (``MessageStore.gate_puts``: IN_SYNC_REPLICAS_NOT_ENOUGH). A slave holds the offset
where it is, and its master's frames raise it (``autoswitch_slave``).
"""

from __future__ import annotations

import functools
import logging
from typing import Protocol

import trio

from ..config import BrokerRole
from . import roles
from .confirm import ConfirmOffset
from .ha.autoswitch_master import MasterTerm
from .ha.autoswitch_slave import AutoSwitchHAClient
from .ha.epochs import EpochFile
from .ha.sync_state import SyncState
from .roles import RoleChangeError, RoleScope, RoleStore

log = logging.getLogger(__name__)


class ControllerStore(RoleStore, Protocol):
    """What a controller-mode role change needs of the store (``MessageStore``)."""

    epochs: EpochFile | None
    confirm: ConfirmOffset | None

    async def truncate_to(self, offset: int, *, for_new_master: bool = False) -> int: ...

    def gate_puts(self, sync_state: SyncState | None) -> None: ...

    def follow_confirm(self, offset: int) -> None: ...


def _confirm_of(store: ControllerStore) -> ConfirmOffset:
    confirm = store.confirm
    if confirm is None:  # (a controller-mode store always has one)
        raise RoleChangeError("the store keeps no confirm offset (enableControllerMode)")
    return confirm


def _scope(store: ControllerStore) -> RoleScope:
    if not store.config.enable_controller_mode:
        raise RoleChangeError("the store is not in controller mode (enableControllerMode)")
    if store.ha_service is None:
        raise RoleChangeError("a controller-mode store needs its HA listener (haListenPort)")
    scope = store.role_scope
    if scope is None:
        raise RoleChangeError("the store is not running: its role cannot change")
    return scope


async def epochs_of(store: ControllerStore) -> EpochFile:
    """The store's epoch history, loaded from storePathEpochFile the first time."""
    if store.epochs is None:
        store.epochs = await trio.to_thread.run_sync(EpochFile.load,
                                                     store.config.epoch_file_path)
    return store.epochs


async def change_to_master(store: ControllerStore, *, epoch: int, broker_id: int,
                           sync_state_set: frozenset[int], sync_state_set_epoch: int
                           ) -> MasterTerm:
    """Make ``store`` the SYNC_MASTER of master epoch ``epoch`` (RocketMQ: a master in
    controller mode is always SYNC_MASTER), with the in-sync set the controller named
    (``sync_state_set`` at ``sync_state_set_epoch``; it holds ``broker_id``, this broker's
    controller id). The term is returned; its in-sync set (``MasterTerm.sync_state``) is
    what the broker's controller link proposes changes to and applies the controller's
    answers to (``MessageStore.change_to_controller_master`` returns it)."""
    scope = _scope(store)
    service = store.ha_service
    assert service is not None  # _scope checked it
    confirm = _confirm_of(store)
    config = store.config
    async with scope.changing:
        was = store.role
        await scope.stop()  # the HA client, or the last term's group transfer, ends
        store.ha_client = None
        store.group_transfer = None
        confirm.hold()  # (the last term's set decides no more; its gate stays till the next)
        if was is BrokerRole.SLAVE:
            # An elected master's set is itself alone: its whole log is confirmed, and its
            # queues are built to the end before it serves (the torn tail is found there).
            confirm.follow_log()
            # RocketMQ's truncateInvalidMsg: the epoch begins at the last whole record.
            await roles.settle(
                store, cut=functools.partial(store.truncate_to, for_new_master=True))
        service.autoswitch = None
        await roles.close_ha_connections(store)
        epochs = await epochs_of(store)
        start = store.commitlog.max_offset
        if not await trio.to_thread.run_sync(epochs.append, epoch, start):
            log.warning("store %s: epoch %d at %d not recorded (the last is %s): this term "
                        "serves under it, as RocketMQ's does", store.config.store_path_root_dir,
                        epoch, start, epochs.cache.last_entry)
        history = epochs.cache.entries
        sync_state = SyncState(
            broker_id, sync_state_set, sync_state_set_epoch,
            epoch_start=history[-1].start_offset, max_offset=start,
            # What readers were shown before this term is confirmed: the set goes on from it.
            started=trio.current_time(), confirm_offset=min(confirm.visible.value, start),
            all_ack=config.all_ack_in_sync_state_set, in_sync_replicas=config.in_sync_replicas,
            min_in_sync_replicas=config.min_in_sync_replicas,
            max_not_catchup=config.ha_max_time_slave_not_catchup / 1000,
        )
        term = MasterTerm(history, sync_state)
        service.autoswitch = term
        term.raise_replicated(service)
        confirm.follow_term(sync_state, service.replicated)
        store.gate_puts(sync_state)
        store.group_transfer = service.group_transfer_service()
        await scope.start(roles.services_for(store))
        store.take_role(BrokerRole.SYNC_MASTER)
        log.info("store %s: %s -> SYNC_MASTER of epoch %d at commitlog offset %d (in-sync "
                 "set %s)", config.store_path_root_dir, was.value, epoch, start,
                 sorted(sync_state_set))
        return term


async def change_to_slave(store: ControllerStore, master_ha_address: str | None, *,
                          broker_id: int) -> None:
    """Make ``store`` a slave, with controller id ``broker_id``, of the master whose HA
    service is at ``master_ha_address`` (None: not known yet; the broker learns it from the
    name server and calls again, or the client follows ``update_master_address``), copying
    with the AutoSwitch protocol and cutting its log to the point it shares with the master
    first. (``MessageStore.change_to_controller_slave`` is this function.)"""
    scope = _scope(store)
    service = store.ha_service
    assert service is not None
    # A configured haMasterAddress pins where the slave copies from (a proxy in front of the
    # master, in tests). RocketMQ's controller-mode slave ignores it and always takes the
    # address the name server names (docs/controller-mode.md, "Under faults").
    master_ha_address = master_ha_address or store.config.ha_master_address or None
    confirm = _confirm_of(store)
    async with scope.changing:
        was = store.role
        client = store.ha_client
        if (was is BrokerRole.SLAVE and isinstance(client, AutoSwitchHAClient)
                and client.broker_id == broker_id):
            await trio.lowlevel.checkpoint()
            client.update_master_address(master_ha_address)
            return
        store.take_role(BrokerRole.SLAVE)  # no put is taken from here on
        if was is not BrokerRole.SLAVE:
            await roles.hand_over(store)
        await scope.stop()  # the group transfer service answers what still waits
        store.group_transfer = None
        store.gate_puts(None)
        # A slave's confirm offset is its master's: held where it is until the master's
        # frames say more (a cut to the point shared with the master lowers it).
        confirm.hold()
        service.autoswitch = None
        await roles.close_ha_connections(store)
        # The term's acks answered its puts, all answered now; the log may be cut below them.
        service.replicated.rewind(0)
        await epochs_of(store)
        store.ha_client = AutoSwitchHAClient(store.config, store.commitlog,
                                             master_ha_address, store=store,
                                             broker_id=broker_id)
        await scope.start(roles.services_for(store))
        log.info("store %s: %s -> SLAVE (controller id %d) of %s at commitlog offset %d",
                 store.config.store_path_root_dir, was.value, broker_id,
                 master_ha_address or "(not known yet)", store.commitlog.max_offset)


def raise_replicated(store: ControllerStore) -> None:
    """The in-sync set's answer rose (an accepted set, a shrink): wake the puts it covers,
    and show consumers what it confirms. (``MessageStore.raise_replicated``.)"""
    service = store.ha_service
    if service is not None and service.autoswitch is not None:
        service.autoswitch.raise_replicated(service)
    if store.confirm is not None:
        store.confirm.refresh()


def follow_confirm(store: ControllerStore, offset: int) -> None:
    """A slave: its master confirmed the log up to ``offset`` (capped at this log's end):
    the consume queues may be built up to there. (``MessageStore.follow_confirm``.)"""
    if store.confirm is not None:
        store.confirm.master_confirmed(offset)
