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
wall-clock jump neither expires a lock early nor keeps one alive.

The table is bounded three ways, so that no one client can lock every other one out (RocketMQ
has no bound: 70 requests of 4096 made-up queues each would take every lock there is). A
request gets only the locks that fit (expired entries are swept first, once per request):

* in all, ``maxQueueLockNums`` (65,536);
* per consumer group, ``maxQueueLockNumsPerGroup`` (16,384);
* per client, ``maxQueueLockNumsPerClient`` (4,096): the locks taken through one connection.
  A client id is whatever the request body says, so a hoarder would invent one per request;
  the connection it sends on is not its to choose. A real client locks at most the queues
  rebalancing gives it, over its one connection to this broker, for all its groups; 4,096
  is also the most one request may name. A renewal through another connection (a client
  that reconnected) moves the lock there, within that connection's bound.

A request that is refused some of its queues is logged in one line (rate-limited), never one
per queue.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs
import trio

from ..ratelog import RateLimitedLog
from ..wire.queue_locks import QueueId

__all__ = [
    "DEFAULT_MAX_LOCKS_PER_CLIENT", "DEFAULT_MAX_LOCKS_PER_GROUP", "LOCK_LIFETIME", "MAX_LOCKS",
    "QueueLockManager",
]

log = logging.getLogger(__name__)

#: seconds a lock lasts past its last renewal
LOCK_LIFETIME = 60.0
#: ``maxQueueLockNums``' default: the most (group, queue) locks a broker keeps
MAX_LOCKS = 65536
#: ``maxQueueLockNumsPerGroup``' default
DEFAULT_MAX_LOCKS_PER_GROUP = 16384
#: ``maxQueueLockNumsPerClient``' default
DEFAULT_MAX_LOCKS_PER_CLIENT = 4096


@attrs.define
class _Lock:
    client_id: str
    renewed_at: float
    #: the connection (its peer address) it was taken or last renewed through
    owner: str = ""


@attrs.define(eq=False)
class QueueLockManager:
    lifetime: float = LOCK_LIFETIME
    max_locks: int = MAX_LOCKS
    max_locks_per_group: int = DEFAULT_MAX_LOCKS_PER_GROUP
    max_locks_per_client: int = DEFAULT_MAX_LOCKS_PER_CLIENT
    #: group -> queue -> lock
    _table: dict[str, dict[QueueId, _Lock]] = attrs.field(factory=dict)
    _count: int = 0
    #: owner (connection) -> locks it holds
    _owned: dict[str, int] = attrs.field(factory=dict)
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    def lock(self, group: str, client_id: str, queues: Iterable[QueueId],
             owner: str = "") -> set[QueueId]:
        """Take or renew the locks of ``queues`` for ``client_id``, asking through ``owner``
        (the connection's peer address); the ones it holds now."""
        now = trio.current_time()
        locks = self._table.setdefault(group, {})
        held = set()
        refused = 0
        bound = None
        swept = False
        for queue in queues:
            lock = locks.get(queue)
            if lock is not None and lock.client_id == client_id and (
                    lock.owner == owner
                    or self._owned.get(owner, 0) < self.max_locks_per_client):
                # A renewal; through another connection (a client that reconnected) it counts
                # there from now on, within that connection's bound: else a hoarder could
                # gather locks through one connection after another and renew them all
                # through one.
                self._move(lock, owner)
                lock.renewed_at = now
                held.add(queue)
                continue
            if lock is not None and lock.client_id == client_id:
                refused += 1
                bound = f"maxQueueLockNumsPerClient={self.max_locks_per_client} reached"
                continue
            if lock is not None and now - lock.renewed_at <= self.lifetime:
                continue  # another client's
            bound = self._full(group, owner, adding=lock is None)
            if bound is not None and not swept:
                swept = True
                self._sweep(now)
                self._table[group] = locks  # the sweep drops empty groups, this one too
                lock = locks.get(queue)
                bound = self._full(group, owner, adding=lock is None)
            if bound is not None:
                refused += 1
                continue
            if lock is None:
                locks[queue] = _Lock(client_id, now, owner)
                self._count += 1
                self._owned[owner] = self._owned.get(owner, 0) + 1
            else:
                log.info("queue locks: %s of %s expired for %s, taken by %s", queue, group,
                         lock.client_id, client_id)
                self._move(lock, owner)
                lock.client_id, lock.renewed_at = client_id, now
            held.add(queue)
        if refused:
            self._log.log(logging.WARNING, ("refused", bound),
                          "queue locks: %d queue(s) of group %s not locked for %s (%s): %s",
                          refused, group, client_id, owner or "?", bound)
        if not locks:
            self._table.pop(group, None)
        return held

    def _full(self, group: str, owner: str, *, adding: bool) -> str | None:
        """Which bound one more lock of ``group`` through ``owner`` would pass, if any (a
        lock taken over from an expired holder adds to the owner's count only)."""
        if self._owned.get(owner, 0) >= self.max_locks_per_client:
            return f"maxQueueLockNumsPerClient={self.max_locks_per_client} reached"
        if adding and len(self._table.get(group, ())) >= self.max_locks_per_group:
            return f"maxQueueLockNumsPerGroup={self.max_locks_per_group} reached"
        if adding and self._count >= self.max_locks:
            return f"the table is full (maxQueueLockNums={self.max_locks})"
        return None

    def _move(self, lock: _Lock, owner: str) -> None:
        if lock.owner == owner:
            return
        self._disown(lock)
        lock.owner = owner
        self._owned[owner] = self._owned.get(owner, 0) + 1

    def _disown(self, lock: _Lock) -> None:
        left = self._owned.get(lock.owner, 0) - 1
        if left > 0:
            self._owned[lock.owner] = left
        else:
            self._owned.pop(lock.owner, None)

    def unlock(self, group: str, client_id: str, queues: Iterable[QueueId]) -> None:
        """Give up the locks of ``queues`` that ``client_id`` holds."""
        locks = self._table.get(group)
        if locks is None:
            return
        for queue in queues:
            lock = locks.get(queue)
            if lock is not None and lock.client_id == client_id:
                del locks[queue]
                self._disown(lock)
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
                self._disown(locks.pop(queue))
                swept += 1
            if not locks:
                del self._table[group]
        self._count -= swept
        return swept
