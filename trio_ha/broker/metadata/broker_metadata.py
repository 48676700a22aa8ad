"""The four metadata tables of one broker, loaded together and written together.

The broker loads them once at startup (``BrokerMetadata.load``, blocking: in a worker thread)
before anything else can touch them, writes the changed ones every
``flushConsumerOffsetInterval`` (``persist_dirty``) and all of them at shutdown
(``persist_all``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import attrs

from trio_ha.ratelog import RateLimitedLog
from trio_ha.wire.metadata import DEFAULT_TOPIC_QUEUE_NUMS
from trio_ha.wire.permission import Permission

from .config_file import ConfigFile, now_ms
from .consumer_offsets import DEFAULT_MAX_CONSUMER_OFFSETS, ConsumerOffsetManager
from .delay_offsets import DelayOffsetManager
from .subscription_groups import (
    DEFAULT_MAX_AUTO_CREATED_PER_CLIENT,
    DEFAULT_MAX_SUBSCRIPTION_GROUPS,
    SubscriptionGroupManager,
)
from .topics import TopicConfigManager

__all__ = ["BrokerMetadata"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class BrokerMetadata:
    topics: TopicConfigManager
    offsets: ConsumerOffsetManager
    subscriptions: SubscriptionGroupManager
    delay_offsets: DelayOffsetManager
    #: a full disk fails every round until it is freed: one line per file per 10 s
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    @classmethod
    def load(
        cls,
        config_dir: str | os.PathLike[str],
        *,
        default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        auto_create_topic: bool = True,
        auto_create_subscription_group: bool = True,
        broker_permission: int = Permission.READ | Permission.WRITE,
        max_subscription_groups: int = DEFAULT_MAX_SUBSCRIPTION_GROUPS,
        max_auto_created_groups_per_client: int = DEFAULT_MAX_AUTO_CREATED_PER_CLIENT,
        max_consumer_offsets: int = DEFAULT_MAX_CONSUMER_OFFSETS,
        clock: Callable[[], int] = now_ms,
    ) -> BrokerMetadata:
        """Load every table from ``config_dir`` (``config_dir_of(storePathRootDir)``); missing
        files give empty tables. Blocking. Raises ``MetadataLoadError`` if a file and its
        backup are both damaged. System topics are not added here: call
        ``topics.ensure_system_topics``."""
        return cls(
            TopicConfigManager.load(
                config_dir,
                default_queue_nums=default_queue_nums,
                auto_create=auto_create_topic,
                broker_permission=broker_permission,
                clock=clock,
            ),
            ConsumerOffsetManager.load(config_dir, max_offsets=max_consumer_offsets),
            SubscriptionGroupManager.load(
                config_dir, auto_create=auto_create_subscription_group,
                max_groups=max_subscription_groups, clock=clock,
                max_auto_created_per_creator=max_auto_created_groups_per_client,
            ),
            DelayOffsetManager.load(config_dir),
        )

    def managers(self) -> tuple[ConfigFile[Any], ...]:
        return (self.topics, self.offsets, self.subscriptions, self.delay_offsets)

    async def persist_all(self) -> None:
        """Write all four files (shutdown). Every file is attempted; the first error is raised
        after the others were written."""
        await self._persist(only_dirty=False)

    async def persist_dirty(self) -> list[str]:
        """Write the files whose tables changed; returns their names."""
        return await self._persist(only_dirty=True)

    async def _persist(self, *, only_dirty: bool) -> list[str]:
        written: list[str] = []
        error: Exception | None = None
        for manager in self.managers():
            try:
                if only_dirty:
                    wrote = await manager.persist_if_dirty()
                else:
                    await manager.persist()
                    wrote = True
            except Exception as exc:
                self._log.log(logging.ERROR, manager.file_name, "cannot persist %s: %s",
                              manager.path, exc)
                error = error or exc
            else:
                self._log.ended(manager.file_name)
                if wrote:
                    written.append(manager.file_name)
        if error is not None:
            raise error
        return written
