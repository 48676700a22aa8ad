"""Queue locks for orderly consumption (RocketMQ's RebalanceLockManager).

An orderly consumer reads each queue from one client at a time, so it locks its queues at the
broker before it pulls them (LOCK_BATCH_MQ) and renews the locks while it reads (the Java
client every 20 s). A lock belongs to one client id within one consumer group; it lasts
``LOCK_LIFETIME`` (60 s, RocketMQ's rocketmq.broker.rebalance.lockMaxLiveTime) past its last
renewal, after which another client of the group may take it. UNLOCK_BATCH_MQ gives locks up
(a consumer that leaves, or gives a queue to another member).

The table lives in memory, as RocketMQ's does: after a broker restart every lock is free, and
consumers take them again at their next renewal. Each broker, a slave too, keeps its own
table and answers from it, as RocketMQ 4.9's brokers do. Time is trio's monotonic clock, so a
wall-clock jump neither expires a lock early nor keeps one alive. The table is bounded: a
request that would grow it past ``MAX_LOCKS`` gets only the locks that fit (expired entries
are swept first).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs
import trio

from ..wire.queue_locks import QueueId

__all__ = ["LOCK_LIFETIME", "MAX_LOCKS", "QueueLockManager"]

log = logging.getLogger(__name__)

#: seconds a lock lasts past its last renewal
LOCK_LIFETIME = 60.0
#: the most (group, queue) locks a broker keeps
MAX_LOCKS = 65536


@attrs.define
class _Lock:
    client_id: str
    renewed_at: float


@attrs.define(eq=False)
class QueueLockManager:
    lifetime: float = LOCK_LIFETIME
    max_locks: int = MAX_LOCKS
    #: group -> queue -> lock
    _table: dict[str, dict[QueueId, _Lock]] = attrs.field(factory=dict)
    _count: int = 0

    def lock(self, group: str, client_id: str, queues: Iterable[QueueId]) -> set[QueueId]:
        """Take or renew the locks of ``queues`` for ``client_id``; the ones it holds now."""
        now = trio.current_time()
        locks = self._table.setdefault(group, {})
        held = set()
        for queue in queues:
            lock = locks.get(queue)
            if lock is None:
                if self._count >= self.max_locks:
                    swept = self._sweep(now)
                    self._table[group] = locks  # the sweep drops empty groups, this one too
                    if not swept:
                        log.warning("queue locks: the table is full (%d); %s of %s not locked",
                                    self.max_locks, queue, group)
                        continue
                locks[queue] = _Lock(client_id, now)
                self._count += 1
                held.add(queue)
            elif lock.client_id == client_id:
                lock.renewed_at = now
                held.add(queue)
            elif now - lock.renewed_at > self.lifetime:
                log.info("queue locks: %s of %s expired for %s, taken by %s", queue, group,
                         lock.client_id, client_id)
                locks[queue] = _Lock(client_id, now)
                held.add(queue)
        if not locks:
            self._table.pop(group, None)
        return held

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueId]) -> None:
        """Give up the locks of ``queues`` that ``client_id`` holds."""
        locks = self._table.get(group)
        if locks is None:
            return
        for queue in queues:
            lock = locks.get(queue)
            if lock is not None and lock.client_id == client_id:
                del locks[queue]
                self._count -= 1
        if not locks:
            del self._table[group]

    def holder(self, group: str, queue: QueueId) -> str | None:
        """The client that holds ``queue``'s lock in ``group`` now, if one does."""
        lock = self._table.get(group, {}).get(queue)
        if lock is None or trio.current_time() - lock.renewed_at > self.lifetime:
            return None
        return lock.client_id

    def _sweep(self, now: float) -> int:
        """Drop expired locks; how many went."""
        swept = 0
        for group in list(self._table):
            locks = self._table[group]
            for queue in [q for q, lock in locks.items() if now - lock.renewed_at > self.lifetime]:
                del locks[queue]
                swept += 1
            if not locks:
                del self._table[group]
        self._count -= swept
        return swept
