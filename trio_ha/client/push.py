"""The push consumer: a listener called for each message, the pulling done for it.

``open_push_consumer(namesrv_addr, group, {"orders": "TagA || TagB"}, listener)`` runs, for the
block, what RocketMQ's DefaultMQPushConsumer runs in threads: every queue this client is given
among the group's live consumers (RocketMQ's average allocation, cut again when a member joins
or leaves: ``rebalance``) is pulled with long polling by a task of its own, and each message
goes to ``await listener(message)``::

    async def handle(message):
        ...                       # return: consumed; raise: try it again later

    async with open_push_consumer("127.0.0.1:9876", "billing", {"orders": "*"}, handle):
        await trio.sleep_forever()

A listener that raises has failed the message: the exception is logged with its traceback
(``ConsumeLater`` is the quiet way to ask for a retry) and counted, and the message is sent
back to the broker (CONSUMER_SEND_MSG_BACK), which delivers it again through
``%RETRY%<group>`` — after 10 s, then longer each time — and after ``max_reconsume_times``
retries puts it in ``%DLQ%<group>``. The consumer subscribes to its retry topic, as Java's
does, and hands a retried message to the listener under its first topic. If the broker cannot
take a message back, the consumer calls the listener again itself after a pause.

Concurrently (the default) up to ``concurrency`` listener calls run at once, across queues; a
queue's offset is committed past a batch once every message of it is done, every
``commit_interval`` and when the block ends, so a crash replays at most the batches in hand
(at-least-once). ``orderly=True`` calls the listener for one message of a queue at a time, in
queue order, and only for queues this client has locked at the broker (LOCK_BATCH_MQ, renewed
every 20 s), so two members never read one queue at once; a failed message is retried in
place after ``orderly_retry_delay`` until ``max_reconsume_times``, then sent to the dead
letters, as RocketMQ's orderly consumer does.

Leaving the block cancels the pulls and the listener calls still running (their messages are
delivered again later), commits the offsets of what was consumed, gives up the locks and
unregisters the group.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs
import trio

from .._errors import TrioHAError, unwrap_single_exception
from ..wire.metadata import RETRY_GROUP_TOPIC_PREFIX
from ..wire.record import PROPERTY_RETRY_TOPIC, StoredMessage
from .consumer import PullConsumer, PullStatus, open_pull_consumer
from .instance import ClientInstance, MessageQueue, MQError
from .rebalance import REBALANCE_INTERVAL, allocate_averagely

__all__ = ["ConsumeLater", "PushConsumer", "PushConsumerStatistics", "open_push_consumer"]

log = logging.getLogger(__name__)

#: how often an orderly consumer renews its locks (RocketMQ: every 20 s; a lock lasts 60 s)
LOCK_RENEW_INTERVAL = 20.0
#: after a failed pull, or a send-back the broker did not take, wait this long
RETRY_PAUSE = 1.0

Listener = Callable[[StoredMessage], Awaitable[Any]]


class ConsumeLater(TrioHAError):
    """Raised by a listener to have the message delivered again later, without a traceback
    in the log."""


@attrs.frozen
class PushConsumerStatistics:
    #: the queues this client reads now
    queues: frozenset[MessageQueue]
    consumed: int
    #: listener calls that raised, and of those the messages the broker took back
    failed: int
    sent_back: int


@attrs.define(eq=False)
class _QueueWork:
    scope: trio.CancelScope
    done: trio.Event = attrs.field(factory=trio.Event)
    #: the next offset to commit (everything before it is consumed); None: none yet
    consumed: int | None = None
    committed: int | None = None


@attrs.define(eq=False)
class PushConsumer:
    consumer: PullConsumer
    subscriptions: dict[str, str]
    listener: Listener
    orderly: bool = False
    concurrency: int = 16
    max_reconsume_times: int = 16
    from_where: str = "last"
    batch_size: int = 32
    suspend_timeout: float = 15.0
    commit_interval: float = 5.0
    orderly_retry_delay: float = 1.0
    _limiter: trio.CapacityLimiter = attrs.field(init=False)
    _work: dict[MessageQueue, _QueueWork] = attrs.field(factory=dict, init=False)
    _locked: set[MessageQueue] = attrs.field(factory=set, init=False)
    _consumed: int = attrs.field(default=0, init=False)
    _failed: int = attrs.field(default=0, init=False)
    _sent_back: int = attrs.field(default=0, init=False)

    def __attrs_post_init__(self) -> None:
        self._limiter = trio.CapacityLimiter(self.concurrency)
        if self.from_where not in ("last", "first"):
            raise ValueError(f"from_where must be 'last' or 'first', not {self.from_where!r}")

    @property
    def group(self) -> str:
        return self.consumer.group

    @property
    def instance(self) -> ClientInstance:
        return self.consumer.instance

    def statistics(self) -> PushConsumerStatistics:
        return PushConsumerStatistics(frozenset(self._work), self._consumed, self._failed,
                                      self._sent_back)

    # ---- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Rebalance and consume until cancelled; then commit, unlock and return."""
        topics = dict(self.subscriptions)
        if not self.orderly:  # an orderly consumer retries in place, never via the broker
            topics.setdefault(RETRY_GROUP_TOPIC_PREFIX + self.group, "*")
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._commit_periodically)
                if self.orderly:
                    nursery.start_soon(self._renew_locks)
                task_status.started()
                await self._rebalance_forever(nursery, topics)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(
                    self.instance.config.request_timeout * 2):
                await self._commit(list(self._work))
                if self._locked:
                    await self.consumer.unlock(self._locked)

    async def _rebalance_forever(self, nursery: trio.Nursery, topics: dict[str, str]) -> None:
        first = True
        while True:
            signal = self.instance.rebalance_signal(self.group)
            if first:
                await self.instance.send_heartbeats()
                first = False
            wanted: set[MessageQueue] = set()
            complete = True
            for topic in topics:
                share = await self._share(topic)
                if share is None:
                    complete = False
                else:
                    wanted.update(share)
            for queue in [q for q in self._work if q not in wanted and complete]:
                await self._release(queue)
            if self.orderly:
                await self._lock_new(wanted)
            for queue in sorted(wanted - set(self._work)):
                if self.orderly and queue not in self._locked:
                    continue  # held by another member: tried again at the next cut
                work = self._work[queue] = _QueueWork(trio.CancelScope())
                nursery.start_soon(self._consume_queue, queue, topics[queue.topic], work)
            if not complete:
                # Not on the broker's list yet (its first heartbeat went out before any route
                # named a broker): say who we are, then look again soon.
                await self.instance.send_heartbeats()
            pause = REBALANCE_INTERVAL if complete else RETRY_PAUSE
            if self.orderly and wanted - set(self._work):
                pause = min(pause, RETRY_PAUSE * 5)
            with trio.move_on_after(pause):
                await signal.wait()

    async def _share(self, topic: str) -> list[MessageQueue] | None:
        """This client's queues of ``topic``; None when it cannot tell yet."""
        try:
            queues = await self.consumer.queues(topic, refresh=True)
        except MQError as exc:
            if not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                log.info("client: no queues of %s for %s yet: %s", topic, self.group, exc)
            return [] if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) else None
        ids = await self.instance.consumer_ids(self.group, topic)
        if ids is None or self.instance.client_id not in ids:
            return None
        return allocate_averagely(queues, ids, self.instance.client_id)

    async def _lock_new(self, wanted: set[MessageQueue]) -> None:
        missing = wanted - self._locked
        if missing:
            self._locked |= await self.consumer.lock(missing)

    async def _renew_locks(self) -> None:
        while True:
            await trio.sleep(LOCK_RENEW_INTERVAL)
            mine = set(self._work)
            if not mine:
                continue
            held = await self.consumer.lock(mine)
            for queue in mine - held:
                log.warning("client: lost the lock of %s; stopping it", queue)
                await self._release(queue, unlock=False)
            self._locked = held | (self._locked - mine)

    async def _release(self, queue: MessageQueue, *, unlock: bool = True) -> None:
        """Stop reading ``queue``: cancel its task, wait for it, commit what it consumed."""
        work = self._work.get(queue)
        if work is None:
            return
        work.scope.cancel()
        await work.done.wait()
        await self._commit([queue])
        del self._work[queue]
        if queue in self._locked:
            self._locked.discard(queue)
            if unlock:
                await self.consumer.unlock([queue])

    async def _commit_periodically(self) -> None:
        while True:
            await trio.sleep(self.commit_interval)
            await self._commit(list(self._work))

    async def _commit(self, queues: Iterable[MessageQueue]) -> None:
        for queue in queues:
            work = self._work.get(queue)
            if work is None or work.consumed is None or work.consumed == work.committed:
                continue
            try:
                await self.consumer.commit(queue, work.consumed)
                work.committed = work.consumed
            except MQError as exc:
                log.info("client: committing %s at %s failed: %s", queue, work.consumed, exc)

    # ---- one queue ---------------------------------------------------------------------------

    async def _start_offset(self, queue: MessageQueue) -> int:
        committed = await self.consumer.committed_offset(queue)
        if committed is not None and committed >= 0:
            return committed
        if self.from_where == "first" or queue.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return await self.consumer.min_offset(queue)
        return await self.consumer.max_offset(queue)

    async def _consume_queue(self, queue: MessageQueue, subscription: str,
                             work: _QueueWork) -> None:
        try:
            with work.scope:
                offset = None
                while offset is None:
                    try:
                        offset = await self._start_offset(queue)
                    except MQError as exc:
                        log.info("client: no start offset for %s yet: %s", queue, exc)
                        await trio.sleep(RETRY_PAUSE)
                work.consumed = work.committed = offset
                while True:
                    try:
                        result = await self.consumer.pull(
                            queue, offset, self.batch_size, subscription=subscription,
                            suspend_timeout=self.suspend_timeout)
                    except MQError as exc:
                        log.info("client: pulling %s failed: %s", queue, exc)
                        await trio.sleep(RETRY_PAUSE)
                        continue
                    if result.status is PullStatus.OFFSET_ILLEGAL:
                        log.info("client: offset %s of %s is illegal; moving to %s", offset,
                                 queue, result.next_begin_offset)
                    messages = [m for m in result.messages if m.queue_offset >= offset]
                    if self.orderly:
                        for message in messages:
                            await self._consume_in_order(queue, message)
                    elif messages:
                        async with trio.open_nursery() as batch:
                            for message in messages:
                                batch.start_soon(self._consume_one, queue, message)
                    offset = result.next_begin_offset
                    work.consumed = offset
        finally:
            work.done.set()

    def _as_delivered(self, message: StoredMessage) -> StoredMessage:
        """A retried message under its first topic, as the listener expects it."""
        first = message.properties.get(PROPERTY_RETRY_TOPIC)
        if first and message.topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            return attrs.evolve(message, topic=first)
        return message

    async def _call(self, message: StoredMessage) -> bool:
        """The listener's verdict on ``message``: True consumed, False failed."""
        try:
            await self.listener(self._as_delivered(message))
        except ConsumeLater:
            self._failed += 1
            return False
        except Exception:
            self._failed += 1
            log.exception("client: the listener of %s failed message %s", self.group,
                          message.properties.get("UNIQ_KEY", message.msg_id))
            return False
        self._consumed += 1
        return True

    async def _consume_one(self, queue: MessageQueue, message: StoredMessage) -> None:
        while True:
            async with self._limiter:
                if await self._call(message):
                    return
            try:
                await self.consumer.send_back(message, queue,
                                              max_reconsume_times=self.max_reconsume_times)
                self._sent_back += 1
                return
            except MQError as exc:
                log.info("client: sending %s back failed (%s); trying it here again",
                         message.msg_id, exc)
                await trio.sleep(RETRY_PAUSE)

    async def _consume_in_order(self, queue: MessageQueue, message: StoredMessage) -> None:
        times = message.reconsume_times
        while not await self._call(message):
            times += 1
            if times > self.max_reconsume_times:
                # Used up in place: to the dead letters, and the queue goes on.
                try:
                    await self.consumer.send_back(message, queue, delay_level=-1,
                                                  max_reconsume_times=self.max_reconsume_times)
                    self._sent_back += 1
                    return
                except MQError as exc:
                    log.info("client: dead-lettering %s failed (%s); trying it again",
                             message.msg_id, exc)
            await trio.sleep(self.orderly_retry_delay)


@contextlib.asynccontextmanager
async def open_push_consumer(
    namesrv_addr: str | Iterable[str] | ClientInstance,
    group: str,
    subscriptions: Mapping[str, str],
    listener: Listener,
    *,
    orderly: bool = False,
    concurrency: int = 16,
    max_reconsume_times: int = 16,
    from_where: str = "last",
    batch_size: int = 32,
    suspend_timeout: float = 15.0,
    commit_interval: float = 5.0,
    orderly_retry_delay: float = 1.0,
    **options: Any,
) -> AsyncIterator[PushConsumer]:
    """A PushConsumer of ``group`` calling ``listener`` for the messages of
    ``subscriptions`` (topic -> tag expression) while the block runs. ``options`` are
    ClientConfig fields, as for ``open_pull_consumer``."""
    if not subscriptions:
        raise ValueError("a push consumer needs at least one subscription")
    if concurrency < 1 or batch_size < 1 or not commit_interval > 0:
        raise ValueError("concurrency, batch_size and commit_interval must be positive")
    async with open_pull_consumer(namesrv_addr, group, **options) as consumer:
        push = PushConsumer(
            consumer, dict(subscriptions), listener, orderly=orderly, concurrency=concurrency,
            max_reconsume_times=max_reconsume_times, from_where=from_where,
            batch_size=batch_size, suspend_timeout=suspend_timeout,
            commit_interval=commit_interval, orderly_retry_delay=orderly_retry_delay,
        )
        with unwrap_single_exception():
            async with trio.open_nursery() as nursery:
                await nursery.start(push.run)
                try:
                    yield push
                finally:
                    nursery.cancel_scope.cancel()
