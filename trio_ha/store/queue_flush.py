"""The consume queues' flush, and the checkpoint it moves.

Consume-queue entries reach the disk in rounds (every flushIntervalConsumeQueue, at least
flushConsumeQueueLeastPages dirty pages of a queue; all of them every
flushConsumeQueueThoroughInterval), and after each round the checkpoint records what is now
durable on both sides, so crash recovery knows where it may start. The store runs
``run_queue_flush`` as one of its services and calls ``flush_consume_queues`` once more when
it closes. Functions over the store (``FlushedStore``), as the reads are: the store's module
keeps to how the store is put together, and this one need not import it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

import trio

from ..config import StoreConfig
from ..ratelog import RateLimitedLog
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .health import describe
from .index import IndexService
from .segment import sync_ranges


class FlushedStore(Protocol):
    """What the flush uses of the MessageStore."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def root(self) -> str: ...

    @property
    def commitlog(self) -> CommitLog: ...

    @property
    def queues(self) -> ConsumeQueueTable: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def checkpoint(self) -> Checkpoint: ...

    @property
    def index(self) -> IndexService | None: ...

    @property
    def health_log(self) -> RateLimitedLog: ...


async def run_queue_flush(
    store: FlushedStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    """Flush consume queues every flushIntervalConsumeQueue (2 dirty pages at least, all
    of them every flushConsumeQueueThoroughInterval), then the checkpoint."""
    config = store.config
    task_status.started()
    last_thorough = trio.current_time()
    while True:
        await trio.sleep(config.flush_interval_consume_queue / 1000)
        least = config.flush_consume_queue_least_pages
        now = trio.current_time()
        if now - last_thorough >= config.flush_consume_queue_thorough_interval / 1000:
            least, last_thorough = 0, now
        await flush_consume_queues(store, least)


async def flush_consume_queues(store: FlushedStore, least_pages: int = 0) -> None:
    """Sync dirty consume-queue pages, then record in the checkpoint only what is now
    durable on both sides: the flushed commitlog's and the flushed queues' timestamps."""
    logics_timestamp = store.dispatcher.last_store_timestamp
    work = [item for queue in store.queues for item in queue.dirty_segments(least_pages)]
    with contextlib.ExitStack() as holds:
        for segment, _, _ in work:
            holds.enter_context(segment.hold())
        if work:
            await trio.to_thread.run_sync(sync_ranges, work, abandon_on_cancel=False)
    for segment, _, end in work:
        segment.flushed_position = max(segment.flushed_position, end)
    # A queue with fewer than least_pages dirty pages was skipped (and entries may have
    # arrived during the sync): the checkpoint must stay below the oldest record whose
    # entry is not on disk, or a crash recovery starting after it would never re-index
    # that entry (RocketMQ moves logicsMsgTimestamp only in thorough rounds for this).
    for queue in store.queues:
        if queue.unflushed_since:
            if queue.dirty_segments(0):
                logics_timestamp = min(logics_timestamp, queue.unflushed_since - 1)
            else:
                queue.unflushed_since = 0
    checkpoint = store.checkpoint
    changed = False
    if least_pages == 0 and store.index is not None:
        # A thorough round: the index files' writes reach the disk, then the checkpoint
        # says up to when (crash recovery keeps the files that end by then).
        try:
            synced = await trio.to_thread.run_sync(store.index.sync, abandon_on_cancel=False)
        except OSError as exc:
            synced = 0
            store.health_log.log(logging.ERROR, "index", "store %s: cannot sync the index "
                                 "files: %s", store.root, describe(exc))
        if synced > checkpoint.index_msg_timestamp:
            checkpoint.index_msg_timestamp = synced
            changed = True
    if logics_timestamp > checkpoint.logics_msg_timestamp:
        checkpoint.logics_msg_timestamp = logics_timestamp
        changed = True
    physic = store.commitlog.flushed_store_timestamp
    if physic > checkpoint.physic_msg_timestamp:
        checkpoint.physic_msg_timestamp = physic
        changed = True
    if changed:
        try:
            await trio.to_thread.run_sync(checkpoint.write, abandon_on_cancel=False)
        except OSError as exc:
            # No descriptor or no room for it: the file keeps its older values, which
            # only make a crash recovery start earlier. Try again next round.
            store.health_log.log(logging.ERROR, "checkpoint",
                                 "store %s: cannot write the checkpoint: %s", store.root,
                                 describe(exc))

