"""GroupCommitService: SYNC_FLUSH's flusher, and the service that answers its waiting puts.

Under SYNC_FLUSH a put is PUT_OK once its bytes are synced, and an fdatasync costs about a
third of a millisecond here, so one sync per put would cap a store at ~3,000 puts/s. Group
commit makes one sync serve every put that arrived while the previous one ran: the flusher
sleeps until something is written and not flushed, flushes everything written so far, and
goes again. The ``flushed`` watermark it raises is what the waiting puts' requests wait on.

The waiting puts' requests (``SyncRequestService``, where their queue, the channel that
admits them, its back-pressure and their answers are explained) carry the end of the record
and its deadline (syncFlushTimeout); the service completes them in offset order as
``flushed`` rises and answers FLUSH_DISK_TIMEOUT at each one's deadline — even while a sync
hangs, because the flusher is a task of its own.
"""

from __future__ import annotations

from typing import Protocol

import attrs
import trio

from ..config import StoreConfig
from ..watermark import Watermark
from .results import PutMessageStatus
from .sync_requests import SyncRequestService


class Flushable(Protocol):
    """What group commit needs of a log: its two watermarks and a flush (the CommitLog)."""

    @property
    def written(self) -> Watermark: ...

    @property
    def flushed(self) -> Watermark: ...

    async def flush(self, least_pages: int = 0) -> int: ...


@attrs.define(eq=False)
class GroupCommitService(SyncRequestService):
    """Flushes what is written, and answers SYNC_FLUSH puts as it becomes durable."""

    commitlog: Flushable = attrs.field(kw_only=True)

    @classmethod
    def for_commitlog(cls, commitlog: Flushable, config: StoreConfig) -> GroupCommitService:
        return cls(
            commitlog.flushed, config.sync_flush_timeout / 1000,
            PutMessageStatus.FLUSH_DISK_TIMEOUT, config.sync_request_channel_capacity,
            commitlog=commitlog,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Flush and answer until cancelled; then answer every request still pending."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_written)
            await nursery.start(super().run)
            task_status.started()

    async def _flush_written(self) -> None:
        """Whenever anything is written and not flushed, flush it all. Puts that append
        during one sync are covered by the next: one fdatasync serves them all."""
        commitlog = self.commitlog
        while True:
            await commitlog.written.wait_for(commitlog.flushed.value + 1)
            await commitlog.flush(0)
