"""Retention: delete commitlog segments past fileReservedTime, and the index behind them.

Every cleanResourceInterval the oldest segments are checked: a segment whose last write is
older than fileReservedTime hours is deleted at the configured hour (deleteWhen, "04") or at
once when the disk is fuller than diskMaxUsedSpaceRatio — at most 10 per round, oldest first
(the log must stay contiguous), never the active segment, never one the dispatcher or the
flusher has not finished with. Consume-queue files whose entries all point below the new
commitlog start go with them. A segment a reader still holds is unmapped and unlinked only
when the reader lets go (``Segment.destroy``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Protocol

import trio

from ..config import StoreConfig
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .ha.epochs import EpochFile
from .health import disk_used_ratio
from .index import IndexService

log = logging.getLogger(__name__)

MAX_DELETIONS_PER_ROUND = 10


class RetainedStore(Protocol):
    """What retention works on: the MessageStore's log, its index and its dispatcher (a
    protocol, so this module need not import the store that runs it)."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def commitlog(self) -> CommitLog: ...

    @property
    def index(self) -> IndexService | None: ...

    @property
    def queues(self) -> ConsumeQueueTable: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def epochs(self) -> EpochFile | None: ...


def _is_delete_hour(delete_when: str, now: float) -> bool:
    hour = time.localtime(now).tm_hour
    return any(part.strip().isdigit() and int(part) == hour for part in delete_when.split(";"))


async def delete_expired_files(
    store: RetainedStore, *, now: float | None = None, force: bool = False
) -> int:
    """One retention round; returns how many commitlog segments were deleted. ``force``
    ignores the hour and the disk ratio (an operator's manual delete), never the age."""
    config = store.config
    now = time.time() if now is None else now
    if (
        not force
        and not _is_delete_hour(config.delete_when, now)
        and disk_used_ratio(config.commitlog_dir) * 100 < config.disk_max_used_space_ratio
    ):
        await trio.lowlevel.checkpoint()
        return 0
    commitlog = store.commitlog
    segments = commitlog.segments
    expiry = config.file_reserved_time * 3600
    deleted = 0
    while deleted < MAX_DELETIONS_PER_ROUND and len(segments.segments) > 1:
        oldest = segments.segments[0]
        if now - oldest.mtime() < expiry:
            break
        done_with = min(store.dispatcher.cursor, commitlog.flushed.value)
        if oldest.end_offset > done_with:
            break
        segments.retire_first()
        deleted += 1
        log.info("retention: deleted commitlog segment %s", os.path.basename(oldest.path))
        if config.delete_commit_log_files_interval:
            await trio.sleep(config.delete_commit_log_files_interval / 1000)
    if deleted:
        for queue in list(store.queues):
            queue.delete_expired(commitlog.min_offset)
        if store.index is not None:
            store.index.delete_expired(commitlog.min_offset)
        if store.epochs is not None:
            # The epochs that ended before the log's new first byte (RocketMQ's
            # truncateEpochFilePrefix); the file is written in a thread.
            await trio.to_thread.run_sync(store.epochs.expire_before, commitlog.min_offset)
    await trio.lowlevel.checkpoint()
    return deleted


async def run_retention(
    store: RetainedStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    task_status.started()
    while True:
        await trio.sleep(store.config.clean_resource_interval / 1000)
        await delete_expired_files(store)
