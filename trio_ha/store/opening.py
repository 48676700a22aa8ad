"""Opening a store, running its services, and closing it: ``open_store``.

``open_store(config)`` locks the directory, recovers it (see ``recovery``), brings the consume
queues up to date, and runs the store's services as tasks in its own nursery: segment
pre-allocation, commitlog flush (async flush, or group commit under SYNC_FLUSH), dispatch,
consume-queue flush with the checkpoint, retention, and replication (the HA service a master
listens with, the group transfer its SYNC_MASTER puts wait on, a slave's HA client: these
two in a scope of their own, which a role change at run time replaces, see ``roles``). Leaving
the block stops taking puts, flushes everything, answers every put still waiting, writes the
checkpoint and removes the ``abort`` file — unless something was left undone, in which case
the next open performs crash recovery, as it would after a kill.

This is the store's life from the outside in; ``store`` is what the open store is and does
while it runs. The functions here set the store's running flags, which no one else does.
Blocking work (loading and recovering the files, creating the first segment) runs in a
worker thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os

import attrs
import trio

from .._errors import unwrap_single_exception
from .._sockets import listen_named
from ..config import BrokerRole, FlushDiskType, StoreConfig
from . import retention, truncation
from .admission import max_record_size
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .group_commit import GroupCommitService
from .ha.master import HAService
from .ha.slave import HAClient
from .health import StoreResourceError
from .index import IndexService
from .lock import StoreLock
from .queue_flush import flush_consume_queues, run_queue_flush
from .recovery import rebuild_disagreeing_queues, recover
from .roles import RoleScope, services_for, waits_for
from .store import MessageStore
from .verify import RecordVerifier

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def open_store(config: StoreConfig, *, lock: StoreLock | None = None):
    """Open (recovering if needed) the store at ``config.store_path_root_dir`` and run its
    services until the block ends; yields the MessageStore.

    The order keeps a failed start from touching the store: the directory's lock first (or
    the caller's ``lock``, taken before it did anything else), then the HA port, and only
    then recovery and the ``abort`` file. So a second broker on the same directory, or an HA
    port already taken, stops with the store as it was, and the next start is not mistaken
    for a crash. A lock the caller passes stays the caller's to release.
    """
    root = await trio.to_thread.run_sync(os.path.realpath, config.store_path_root_dir)
    if lock is not None and (lock.root != root or not lock.held):
        raise ValueError(f"open_store: the lock passed is for {lock.root}, not {root}")
    owned = lock is None
    if lock is None:
        lock = await trio.to_thread.run_sync(StoreLock.acquire, root)
    try:
        ha_listeners: list[trio.SocketListener] = []
        if config.ha_listen_port is not None:
            ha_listeners = await listen_named(config.ha_listen_port, config.ha_bind_address,
                                              "haListenPort")
        try:
            store = await trio.to_thread.run_sync(_load, config, root)
        except BaseException:
            with trio.CancelScope(shield=True):
                for listener in ha_listeners:
                    await listener.aclose()
            raise
        try:
            with unwrap_single_exception():
                async with trio.open_nursery() as nursery:
                    await _run_services(store, nursery, ha_listeners)
                    store.mark_running()
                    try:
                        yield store
                    finally:
                        with trio.CancelScope(shield=True):
                            await _shutdown(store)
                        nursery.cancel_scope.cancel()
        finally:
            store.mark_closed()
            _close_files(store)
    finally:
        if owned:
            lock.release()


def _abort_path(store: MessageStore) -> str:
    """Present while the store is open: found at the next open, it means a crash."""
    return os.path.join(store.root, "abort")


def _load(config: StoreConfig, root: str) -> MessageStore:
    """Load and recover the store at ``root``, whose lock the caller holds."""
    # A truncation a crash interrupted is finished before anything is loaded.
    after_truncation = truncation.complete_pending(config, root) is not None
    commitlog = CommitLog.load(config)
    try:
        queues = ConsumeQueueTable.load(
            os.path.join(root, "consumequeue"), config.mapped_file_size_consume_queue
        )
    except BaseException:
        commitlog.close()
        raise
    ha_service = HAService(config, commitlog) if config.ha_listen_port is not None else None
    store = MessageStore(
        config, commitlog, queues,
        Dispatcher(commitlog, queues, max_record_size=max_record_size(config),
                   delay_levels=config.delay_levels),
        Checkpoint.load(os.path.join(root, "checkpoint")),
        root=root,
        ha_service=ha_service,
        ha_client=(
            HAClient(config, commitlog, config.ha_master_address)
            if config.broker_role is BrokerRole.SLAVE else None
        ),
        group_commit=(
            GroupCommitService.for_commitlog(commitlog, config)
            if config.flush_disk_type is FlushDiskType.SYNC_FLUSH else None
        ),
        group_transfer=(
            ha_service.group_transfer_service()
            if config.broker_role is BrokerRole.SYNC_MASTER and ha_service is not None
            else None
        ),
        waits=waits_for(config.broker_role, config.flush_disk_type),
        verifier=(
            RecordVerifier(max_record_size(config)) if config.check_crc_on_read else None
        ),
    )
    try:
        _recover(store, after_truncation=after_truncation)
        with open(_abort_path(store), "wb"):
            pass
    except BaseException:
        _close_files(store)
        raise
    return store


def _recover(store: MessageStore, *, after_truncation: bool) -> None:
    """Recovery, the index, the first segment, and the consume queues brought up to the
    recovered end of the log: what must be true before the store takes a put. After a
    truncation that a crash interrupted, recovery runs as after a crash: it cuts the queues
    and the index to the log."""
    config, commitlog, dispatcher = store.config, store.commitlog, store.dispatcher
    abnormal = after_truncation or os.path.exists(_abort_path(store))
    store.recovery = recover(
        commitlog, store.queues, dispatcher, store.checkpoint,
        abnormal=abnormal, check_crc=config.check_crc_on_recover,
        max_record=max_record_size(config),
        skip_holes=config.skip_corrupt_records_on_recover,
        quarantine_dir=os.path.join(store.root, "corrupt"),
    )
    log.info("store %s recovered %s", store.root, store.recovery.describe())
    if config.message_index_enable:
        store.index = IndexService.load(
            store.root, config, abnormal=abnormal,
            checkpoint_timestamp=store.checkpoint.index_msg_timestamp,
        )
        # The index picks up where its files end, up to the recovered end of the log
        # (files naming records past it are stale). Not the dispatcher's cursor: after a
        # clean stop recovery sets it back to the last segment's start to re-dispatch
        # it, often 0, and every index file then looked stale and was rebuilt.
        store.index.catch_up(commitlog, commitlog.max_offset, max_record_size(config))
        dispatcher.indexer = store.index
    if not commitlog.segments.segments and config.broker_role is not BrokerRole.SLAVE:
        # A slave's log starts wherever its master starts it (HA creates that segment).
        first = commitlog.create_first_segment(0)
        commitlog.segments.append_segment(first)
    # Bring the consume queues up to the recovered end before taking puts (RocketMQ's
    # start() blocks until reput has caught up), then derive the next queue offsets.
    while dispatcher.dispatch_available(commitlog.max_offset):
        pass
    if dispatcher.stalled is not None:
        # The next queue offsets come from the consume queues: they must be whole first.
        raise StoreResourceError(
            f"store {store.root}: cannot bring the consume queues up to the commitlog: "
            f"{dispatcher.stalled}"
        )
    rebuilt = rebuild_disagreeing_queues(commitlog, store.queues, dispatcher)
    if rebuilt:
        store.recovery = attrs.evolve(store.recovery, rebuilt_queues=rebuilt)
    commitlog.queue_offsets = {
        (queue.topic, queue.queue_id): queue.max_offset for queue in store.queues
    }
    if store.confirm is not None:
        # Controller mode: what recovery dispatched is what readers see, until the
        # controller names a role (``confirm``).
        store.confirm.recovered()


async def _run_services(store: MessageStore, nursery: trio.Nursery,
                        ha_listeners: list[trio.SocketListener]) -> None:
    commitlog = store.commitlog
    await nursery.start(commitlog.run_allocator)
    if store.group_commit is not None:
        await nursery.start(store.group_commit.run)  # SYNC_FLUSH: it flushes, too
    else:
        await nursery.start(commitlog.run_async_flush)
    # The dispatcher follows what readers may see: the log (written, or flushed under
    # SYNC_FLUSH), or in controller mode the confirm offset, which a rise wakes it for too.
    await nursery.start(store.dispatcher.run, store.confirmed)
    await nursery.start(run_queue_flush, store)
    await nursery.start(retention.run_retention, store)
    await nursery.start(store.disk.run)
    if store.ha_service is not None:
        await nursery.start(functools.partial(store.ha_service.serve, listeners=ha_listeners))
    # What only the configured role runs (the group transfer service, the HA client) runs
    # in a scope of its own, which a role change cancels and replaces (``roles``).
    store.role_scope = RoleScope(nursery)
    await store.role_scope.start(services_for(store))


async def _shutdown(store: MessageStore) -> None:
    """Stop taking puts, make everything durable, and say so with the abort file."""
    store.mark_closed()
    dispatcher = store.dispatcher
    await store.commitlog.flush(0)
    # The whole log, past a controller-mode store's confirm offset too: nobody reads from
    # here on, and the next open dispatches every whole record it recovers anyway (as
    # RocketMQ's after a clean stop), so what is left out would only make this stop look
    # like a crash.
    while dispatcher.dispatch_available(store.log_mark.value):
        await trio.lowlevel.checkpoint()
    await flush_consume_queues(store, 0)
    if dispatcher.error is None and dispatcher.behind_bytes == 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(_abort_path(store))
    else:
        log.warning(
            "store %s closed with work left (dispatch behind %d bytes, error %s); "
            "the next open will run crash recovery",
            store.root, dispatcher.behind_bytes, dispatcher.error,
        )


def _close_files(store: MessageStore) -> None:
    store.commitlog.close()
    store.queues.close()
    if store.index is not None:
        store.index.close()
