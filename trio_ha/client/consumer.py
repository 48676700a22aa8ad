"""The pull consumer: PULL_MESSAGE with long polling, consumer offsets, and a message stream.

``async with open_pull_consumer(namesrv_addr, group) as consumer``, then either pull queue by
queue, as Java's ``DefaultMQPullConsumer``::

    for mq in await consumer.queues(topic):
        offset = await consumer.committed_offset(mq) or 0
        result = await consumer.pull(mq, offset, 32, subscription="TagA || TagB")
        ...                                   # result.messages, result.next_begin_offset
        await consumer.commit(mq, result.next_begin_offset)

or let a stream do the loop (this client's share of the topic's queues, messages of each
queue in order, offsets committed every ``commit_interval`` and when the block ends)::

    async with consumer.messages(topic) as stream:
        async for message in stream:
            ...

Consumers of one group share a stream's topic: each reads the slice of its queues that
RocketMQ's average allocation gives it among the group's live consumers, cut again when one
joins or leaves (``rebalance``), so two replicas of a service each see half the messages, not
all of them. A stream given an explicit list of queues reads them whole.

A pull carries the subscription (SUBSCRIPTION flag, ``TAG`` expression) and, with a
``suspend_timeout``, the SUSPEND flag: the broker holds a pull that finds nothing for up to
that long and answers as soon as a message arrives (long polling); the call's own timeout is
above it. The broker filters by tag hash code; the client filters again by the tag string, as
RocketMQ clients do (hash codes collide).

Where pulls go: to the broker id the last response suggested for the queue
(``suggestWhichBrokerId``, the master at first) if the route has it, else to the lowest id in
the route — so when the master is gone from the route, reads fall back to a slave, which still
serves them. Offsets are committed to the master, or to a slave when there is no master.

Why one module at about 750 lines: the pull consumer, its stream and its rebalance are one
lifecycle (the stream owns the queues the rebalance hands it and commits the offsets the
consumer tracks); split, each part would reach into the others' state.
"""

from __future__ import annotations

import collections
import contextlib
import enum
import logging
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import attrs
import trio

from .. import _backend
from .._errors import unwrap_single_exception
from ..remoting import RemotingError
from ..wire.errors import RecordDecodeError, RouteDecodeError
from ..wire.heartbeat import SubscriptionData
from ..wire.queue_locks import LockBatchRequest, LockBatchResponse, QueueId
from ..wire.record import PROPERTY_RETRY_TOPIC, SYSFLAG_COMPRESSED, StoredMessage
from ..wire.remoting import (
    PullMessageRequestHeader,
    PullSysFlag,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    encode_pull_message_fields,
)
from .instance import (
    MASTER_ID,
    ClientInstance,
    MessageQueue,
    MQBrokerError,
    MQClientError,
    MQError,
    parse_subscription,
    use_instance,
)
from .rebalance import REBALANCE_INTERVAL, allocate_averagely

log = logging.getLogger(__name__)

__all__ = ["MessageStream", "PullConsumer", "PullResult", "PullStatus", "open_pull_consumer"]

PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
#: the COMPRESSION_TYPE bits of sysFlag (5.x; 0 means zlib, as 4.x writes it)
_COMPRESSION_TYPE_MASK = 0x700
_ZLIB_TYPES = (0x000, 0x300)


class PullStatus(enum.Enum):
    FOUND = "FOUND"
    NO_NEW_MSG = "NO_NEW_MSG"
    NO_MATCHED_MSG = "NO_MATCHED_MSG"
    OFFSET_ILLEGAL = "OFFSET_ILLEGAL"


_STATUS_BY_CODE = {
    ResponseCode.SUCCESS: PullStatus.FOUND,
    ResponseCode.PULL_NOT_FOUND: PullStatus.NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: PullStatus.NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: PullStatus.OFFSET_ILLEGAL,
}


@attrs.frozen
class PullResult:
    status: PullStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = attrs.field(factory=list)
    #: the broker id the broker suggests for the next pull of this queue
    suggest_which_broker_id: int = MASTER_ID
    #: where the pull went
    broker_addr: str | None = None


def decode_messages(body: bytes, queue: MessageQueue, result_fields: dict[str, str],
                    subscription: SubscriptionData) -> list[StoredMessage]:
    """A pull body (concatenated store records) as messages, filtered by tag string and with
    MIN_OFFSET / MAX_OFFSET set and compressed bodies inflated, as Java's
    ``processPullResult`` does."""
    tags = subscription.tags_set
    extra = {
        PROPERTY_MIN_OFFSET: result_fields.get("minOffset", "0"),
        PROPERTY_MAX_OFFSET: result_fields.get("maxOffset", "0"),
    }
    try:
        decoded = _backend.engine.decode_records(body, extra_properties=extra)
    except RecordDecodeError as exc:
        raise MQClientError(f"bad record in the pull response of {queue}: {exc}") from None
    if not tags and not any(m.sys_flag & SYSFLAG_COMPRESSED for m in decoded):
        return decoded
    messages = []
    for message in decoded:
        if tags and message.tags not in tags:
            continue
        if message.sys_flag & SYSFLAG_COMPRESSED and (
            message.sys_flag & _COMPRESSION_TYPE_MASK
        ) in _ZLIB_TYPES:
            try:
                message = attrs.evolve(
                    message, body=zlib.decompress(message.body),
                    sys_flag=message.sys_flag & ~SYSFLAG_COMPRESSED,
                )
            except zlib.error:
                log.warning("client: message %s of %s does not inflate; left compressed",
                            message.queue_offset, queue)
        messages.append(message)
    return messages


@attrs.define(eq=False)
class PullConsumer:
    instance: ClientInstance
    group: str
    #: timeout of offset requests (None: the client's request_timeout)
    request_timeout: float | None = None
    #: queue -> the broker id to pull from next (suggestWhichBrokerId)
    _pull_from: dict[MessageQueue, int] = attrs.field(factory=dict)

    # ---- queues ---------------------------------------------------------------------------------

    async def queues(self, topic: str, *, refresh: bool = False) -> list[MessageQueue]:
        """The readable queues of ``topic``. Raises MQClientError if it has no route.
        ``refresh``: look the route up unless that was done within
        ``route_refresh_min_interval`` (asked for, so not spaced as failures' lookups are)."""
        if refresh or topic not in self.instance.routes:
            await self.instance.refresh_route(
                topic, max_age=self.instance.config.route_refresh_min_interval)
        queues = self.instance.subscribe_queues(topic)
        if not queues and topic not in self.instance.routes:
            raise MQClientError(f"no route info of topic {topic}")
        return queues

    def prefer_broker(self, queue: MessageQueue, broker_id: int) -> None:
        """Pull ``queue`` from ``broker_id`` of its broker group next (0: the master), as a
        broker's suggestWhichBrokerId does; the next pull response's suggestion replaces it."""
        self._pull_from[queue] = broker_id

    def _pull_address(self, queue: MessageQueue) -> tuple[str, int] | None:
        return self.instance.find_broker_addr(
            queue.broker_name, self._pull_from.get(queue, MASTER_ID)
        )

    async def _offset_address(self, queue: MessageQueue) -> str:
        """The master of the queue's broker group, else one of its slaves."""
        found = await self.instance.find_broker_addr_refreshing(
            queue.topic, queue.broker_name, MASTER_ID
        )
        return found[0]

    # ---- pull ------------------------------------------------------------------------------------

    async def pull(
        self,
        queue: MessageQueue,
        offset: int,
        max_nums: int = 32,
        *,
        subscription: str = "*",
        suspend_timeout: float = 15.0,
        timeout: float | None = None,
    ) -> PullResult:
        """Pull up to ``max_nums`` messages of ``queue`` from ``offset``. With
        ``suspend_timeout`` > 0 the broker holds the pull until a message arrives or that
        many seconds pass (then NO_NEW_MSG); ``timeout`` (default: ``suspend_timeout`` + the
        request timeout) bounds the whole call. Raises MQBrokerError for an error code and
        MQClientError when no broker of the queue answers."""
        sub = parse_subscription(queue.topic, subscription)
        self.instance.subscribe(self.group, sub)
        if timeout is None:
            timeout = suspend_timeout + self.instance.config.request_timeout
        sys_flag = PullSysFlag.SUBSCRIPTION
        if suspend_timeout > 0:
            sys_flag |= PullSysFlag.SUSPEND
        header = PullMessageRequestHeader(
            consumer_group=self.group,
            topic=queue.topic,
            queue_id=queue.queue_id,
            queue_offset=offset,
            max_msg_nums=max_nums,
            sys_flag=int(sys_flag),
            commit_offset=0,
            suspend_timeout_millis=int(max(suspend_timeout, 0) * 1000),
            sub_version=sub.sub_version,
            subscription=sub.sub_string,
            expression_type="TAG",
        )
        request = self.instance.request(
            RequestCode.PULL_MESSAGE, encode_pull_message_fields(header)
        )
        deadline = trio.current_time() + timeout
        with trio.CancelScope(deadline=deadline):  # route lookups included
            return await self._pull_within(queue, request, sub, deadline)
        raise MQClientError(f"pulling {queue} timed out after {timeout:g} s")

    async def _pull_within(self, queue: MessageQueue, request, sub: SubscriptionData,
                           deadline: float) -> PullResult:
        tried: set[str] = set()
        while True:
            found = self._pull_address(queue)
            if found is None or found[0] in tried:
                await self._refresh_quietly(queue.topic)
                found = self._pull_address(queue)
            if found is None:
                raise MQClientError(
                    f"the broker {queue.broker_name} of {queue} is not in the route"
                )
            address, _ = found
            if address in tried:
                raise MQClientError(f"pulling {queue} failed at {', '.join(sorted(tried))}")
            tried.add(address)
            try:
                # Written at once: the caller of a pull is busy with the last answer while
                # the broker makes this one (see RemotingClient). Bounded by the pull's own
                # deadline (the caller's scope), not a second one.
                response = await self.instance.invoke_by_deadline(address, request, flush=True)
            except RemotingError as exc:
                # the broker is gone (or going): look the route up again and try the node it
                # names now, once per address
                log.info("client: pull of %s from %s failed: %s", queue, address, exc)
                self._pull_from.pop(queue, None)
                await self._refresh_quietly(queue.topic)
                if trio.current_time() >= deadline:
                    raise MQClientError(f"pulling {queue} from {address} failed: {exc}") from exc
                continue
            return self._pull_result(response, queue, sub, address)

    def _pull_result(self, response, queue: MessageQueue, sub: SubscriptionData,
                     address: str) -> PullResult:
        status = _STATUS_BY_CODE.get(response.code)
        if status is None:
            raise MQBrokerError(response.code, response.remark, address)
        fields = response.ext_fields
        try:
            suggest = int(fields.get("suggestWhichBrokerId", MASTER_ID))
            next_begin = int(fields["nextBeginOffset"])
            min_offset = int(fields.get("minOffset", 0))
            max_offset = int(fields.get("maxOffset", 0))
        except (KeyError, ValueError):
            raise MQClientError(f"bad pull response from {address}: {fields}") from None
        self._pull_from[queue] = suggest
        messages = []
        if status is PullStatus.FOUND and response.body:
            messages = decode_messages(response.body, queue, fields, sub)
        return PullResult(status, next_begin, min_offset, max_offset, messages, suggest, address)

    async def _refresh_quietly(self, topic: str) -> None:
        try:
            await self.instance.refresh_route(topic)
        except MQClientError as exc:
            log.info("client: route refresh of %s failed: %s", topic, exc)

    # ---- offsets ---------------------------------------------------------------------------------

    async def _offset_request(self, queue: MessageQueue, code: int, fields: dict[str, Any] | None,
                              timeout: float | None, body: bytes = b""
                              ) -> tuple[str, RemotingCommand]:
        """A request about ``queue`` to its master (else a slave): offsets, send-back, locks."""
        address = await self._offset_address(queue)
        request = self.instance.request(code, fields, body)
        try:
            response = await self.instance.invoke(address, request, timeout or self.request_timeout)
        except RemotingError as exc:
            await self._refresh_quietly(queue.topic)
            raise MQClientError(f"request {code} for {queue} to {address} failed: {exc}") from exc
        return address, response

    async def commit(
        self, queue: MessageQueue, offset: int, *, timeout: float | None = None
    ) -> None:
        """UPDATE_CONSUMER_OFFSET: ``offset`` is the next offset this group will read."""
        address, response = await self._offset_request(
            queue, RequestCode.UPDATE_CONSUMER_OFFSET,
            {"consumerGroup": self.group, "topic": queue.topic, "queueId": queue.queue_id,
             "commitOffset": offset}, timeout,
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)

    async def committed_offset(self, queue: MessageQueue, *, timeout: float | None = None
                               ) -> int | None:
        """QUERY_CONSUMER_OFFSET: the group's committed offset, None when it has none
        (QUERY_NOT_FOUND). The broker answers 0 for a group that never committed on a queue
        whose first message is still in memory (RocketMQ's rule)."""
        address, response = await self._offset_request(
            queue, RequestCode.QUERY_CONSUMER_OFFSET,
            {"consumerGroup": self.group, "topic": queue.topic, "queueId": queue.queue_id},
            timeout,
        )
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        try:
            return int(response.ext_fields["offset"])
        except (KeyError, ValueError):
            raise MQClientError(f"bad offset response from {address}") from None

    # ---- retries and queue locks ------------------------------------------------------------

    async def send_back(self, message: StoredMessage, queue: MessageQueue, *,
                        delay_level: int = 0, max_reconsume_times: int = 16,
                        timeout: float | None = None) -> None:
        """CONSUMER_SEND_MSG_BACK: this group failed ``message`` (read from ``queue``); the
        broker delivers it again through ``%RETRY%<group>`` (``delay_level`` 0: 3 + the
        times it was consumed), or to ``%DLQ%<group>`` once it was consumed
        ``max_reconsume_times`` times or with ``delay_level`` -1. Raises MQError when the
        broker does not take it."""
        origin = message.properties.get(PROPERTY_RETRY_TOPIC, message.topic)
        address, response = await self._offset_request(
            queue, RequestCode.CONSUMER_SEND_MSG_BACK,
            {"offset": message.commitlog_offset, "group": self.group,
             "delayLevel": delay_level, "originMsgId": message.msg_id, "originTopic": origin,
             "unitMode": "false", "maxReconsumeTimes": max_reconsume_times}, timeout,
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)

    async def lock(self, queues: Iterable[MessageQueue], *, timeout: float | None = None
                   ) -> set[MessageQueue]:
        """LOCK_BATCH_MQ to each queue's master: the queues this client holds now (a lock
        lasts 60 s past its last renewal). Queues whose broker does not answer are not held."""
        held: set[MessageQueue] = set()
        by_broker: dict[str, list[MessageQueue]] = collections.defaultdict(list)
        for queue in queues:
            by_broker[queue.broker_name].append(queue)
        for broker_name, members in by_broker.items():
            body = LockBatchRequest(self.group, self.instance.client_id, tuple(
                QueueId(q.topic, q.broker_name, q.queue_id) for q in members)).encode()
            try:
                address, response = await self._offset_request(
                    members[0], RequestCode.LOCK_BATCH_MQ, None, timeout, body)
            except MQClientError as exc:
                log.info("client: locking queues of %s failed: %s", broker_name, exc)
                continue
            if response.code != ResponseCode.SUCCESS:
                log.info("client: %s refused the locks: %s", address, response.remark)
                continue
            try:
                locked = LockBatchResponse.decode(response.body).lock_ok_mq_set
            except RouteDecodeError as exc:
                log.info("client: bad lock answer from %s: %s", address, exc)
                continue
            held.update(MessageQueue(q.topic, q.broker_name, q.queue_id) for q in locked)
        return held

    async def unlock(self, queues: Iterable[MessageQueue], *, timeout: float | None = None
                     ) -> None:
        """UNLOCK_BATCH_MQ: give up this client's locks of ``queues`` (errors are logged)."""
        by_broker: dict[str, list[MessageQueue]] = collections.defaultdict(list)
        for queue in queues:
            by_broker[queue.broker_name].append(queue)
        for members in by_broker.values():
            body = LockBatchRequest(self.group, self.instance.client_id, tuple(
                QueueId(q.topic, q.broker_name, q.queue_id) for q in members)).encode()
            try:
                await self._offset_request(members[0], RequestCode.UNLOCK_BATCH_MQ, None,
                                           timeout, body)
            except MQClientError as exc:
                log.info("client: unlocking %s failed: %s", members, exc)

    async def _queue_offset(self, queue: MessageQueue, code: int, timeout: float | None) -> int:
        address, response = await self._offset_request(
            queue, code, {"topic": queue.topic, "queueId": queue.queue_id}, timeout
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        return int(response.ext_fields.get("offset", 0))

    async def max_offset(self, queue: MessageQueue, *, timeout: float | None = None) -> int:
        """GET_MAX_OFFSET: the offset the next message of the queue will get."""
        return await self._queue_offset(queue, RequestCode.GET_MAX_OFFSET, timeout)

    async def min_offset(self, queue: MessageQueue, *, timeout: float | None = None) -> int:
        return await self._queue_offset(queue, RequestCode.GET_MIN_OFFSET, timeout)

    # ---- stream ----------------------------------------------------------------------------------

    def messages(
        self,
        topic: str,
        queues: list[MessageQueue] | None = None,
        *,
        subscription: str = "*",
        from_where: str = "last",
        batch_size: int = 32,
        suspend_timeout: float = 15.0,
        commit_interval: float = 5.0,
    ) -> MessageStream:
        """An async iterator over the messages of ``queues``, each queue's messages in offset
        order. By default the queues are this client's share of ``topic``'s readable queues
        among the group's live consumers (``rebalance``: every consumer of the group, ours
        or Java's, reads its own slice, and the slices are cut again when a consumer joins or
        leaves or the route changes); an explicit ``queues`` list is read whole, shared with
        nobody. Each queue starts at the group's committed offset, or, when there is none, at
        its max offset (``from_where="last"``, Java's CONSUME_FROM_LAST_OFFSET) or min offset
        (``"first"``). A message counts as consumed when the next one is asked for; consumed
        offsets are committed every ``commit_interval`` seconds, on ``commit()``, and when
        the stream is used as ``async with`` and the block ends. It runs until the caller
        stops iterating; every wait inside is bounded and cancellable."""
        if from_where not in ("last", "first"):
            raise ValueError(f"from_where must be 'last' or 'first', not {from_where!r}")
        return MessageStream(
            self, topic, None if queues is None else list(queues), subscription, from_where,
            batch_size, suspend_timeout, commit_interval,
        )


@attrs.define(eq=False)
class _QueueState:
    offset: int | None = None  # next offset to pull (None: not looked up yet)
    consumed: int | None = None  # next offset after what the caller has consumed
    committed: int | None = None
    failures: int = 0
    retry_at: float = 0.0


class MessageStream:
    """See ``PullConsumer.messages``."""

    #: back-off after a failed pull of a queue: doubles from MIN to MAX
    BACKOFF_MIN = 0.1
    BACKOFF_MAX = 3.0
    #: a pull that made no progress and found nothing (a slave that does not correct
    #: offsets answers so) is retried after this long rather than at once
    NO_PROGRESS_DELAY = 0.2
    #: how soon to look again at a group whose consumer list lacks this client
    REBALANCE_RETRY = 0.5

    def __init__(self, consumer: PullConsumer, topic: str, queues: list[MessageQueue] | None,
                 subscription: str, from_where: str, batch_size: int, suspend_timeout: float,
                 commit_interval: float) -> None:
        self.consumer = consumer
        self.topic = topic
        self._fixed_queues = queues
        self.subscription = subscription
        self.from_where = from_where
        self.batch_size = batch_size
        self.suspend_timeout = suspend_timeout
        self.commit_interval = commit_interval
        self._states: dict[MessageQueue, _QueueState] = {}
        #: (queue, message, consumed offset once the caller has taken it)
        self._buffer: collections.deque = collections.deque()
        self._handed_out: tuple[MessageQueue, int] | None = None
        self._last_commit = trio.current_time()
        self._closed = False
        #: this client's share of the topic's queues (None: not computed yet)
        self._assigned: list[MessageQueue] | None = None
        self._rebalanced_at = float("-inf")
        #: set when the group's members change: time to cut the shares again
        self._signal: trio.Event | None = None

    # -- iteration

    def __aiter__(self) -> MessageStream:
        return self

    async def __anext__(self) -> StoredMessage:
        if self._closed:
            raise StopAsyncIteration
        self._ack_handed_out()
        if trio.current_time() - self._last_commit >= self.commit_interval:
            await self.commit()
        while not self._buffer:
            await self._fetch()
        queue, message, consumed = self._buffer.popleft()
        self._handed_out = (queue, consumed)
        return message

    def _ack_handed_out(self) -> None:
        if self._handed_out is not None:
            queue, consumed = self._handed_out
            self._states[queue].consumed = consumed
            self._handed_out = None

    @property
    def consumed_offsets(self) -> dict[MessageQueue, int]:
        """Per queue, the offset after the messages consumed so far."""
        return {q: s.consumed for q, s in self._states.items() if s.consumed is not None}

    # -- commits and closing

    async def commit(self) -> None:
        """Commit every consumed offset not committed yet (errors are logged; the offsets
        stay due and are tried again at the next commit)."""
        self._last_commit = trio.current_time()
        due = [(q, s, s.consumed) for q, s in self._states.items()
               if s.consumed is not None and s.consumed != s.committed]

        async def one(queue: MessageQueue, state: _QueueState, offset: int) -> None:
            try:
                await self.consumer.commit(queue, offset)
            except MQError as exc:
                log.info("client: committing %s at %s failed: %s", queue, offset, exc)
                return
            state.committed = offset

        with unwrap_single_exception():
            async with trio.open_nursery() as nursery:
                for queue, state, offset in due:
                    nursery.start_soon(one, queue, state, offset)

    async def aclose(self) -> None:
        """Count the last message handed out as consumed and commit (bounded, shielded)."""
        if self._closed:
            return
        self._closed = True
        self._ack_handed_out()
        with trio.move_on_after(self.consumer.instance.config.request_timeout * 2) as scope:
            scope.shield = True
            await self.commit()

    async def __aenter__(self) -> MessageStream:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.aclose()

    # -- fetching

    async def _queues(self) -> list[MessageQueue]:
        if self._fixed_queues is not None:
            return self._fixed_queues
        instance = self.consumer.instance
        queues = instance.subscribe_queues(self.topic)
        if not queues:
            if self._assigned is None:  # never had a route: say so
                queues = await self.consumer.queues(self.topic, refresh=True)
            else:
                await self.consumer._refresh_quietly(self.topic)
                queues = instance.subscribe_queues(self.topic)
        signal = self._signal
        if (self._assigned is None or signal is None or signal.is_set()
                or trio.current_time() - self._rebalanced_at >= REBALANCE_INTERVAL):
            await self._rebalance(queues)
        assert self._assigned is not None
        # A queue gone from the route is given up at once; a new one waits for the next cut.
        return [q for q in self._assigned if q in queues]

    async def _rebalance(self, queues: list[MessageQueue]) -> None:
        """Cut the group's shares again (``rebalance``) and give up the queues no longer
        ours: their consumed offsets are committed and what was buffered of them dropped."""
        instance, group = self.consumer.instance, self.consumer.group
        # Taken before listing: a change while the list is on its way signals this one.
        self._signal = instance.rebalance_signal(group)
        if self._assigned is None:
            await instance.send_heartbeats()  # be on the broker's list before reading it
        ids = await instance.consumer_ids(group, self.topic)
        now = trio.current_time()
        if ids is None or instance.client_id not in ids:
            # No broker answered, or none has our heartbeat yet: look again soon.
            log.info("client: %s is not in the consumer list of %s yet (%s)",
                     instance.client_id, group, ids)
            self._rebalanced_at = now - REBALANCE_INTERVAL + self.REBALANCE_RETRY
            if self._assigned is None:
                self._assigned = []
            return
        self._rebalanced_at = now
        assigned = allocate_averagely(queues, ids, instance.client_id)
        released = set(self._assigned or ()) - set(assigned)
        if released:
            await self._release(released)
        if assigned != self._assigned:
            log.info("client: %s of group %s now reads %d of %d queues of %s", instance.client_id,
                     group, len(assigned), len(queues), self.topic)
        self._assigned = assigned

    async def _release(self, queues: set[MessageQueue]) -> None:
        self._ack_handed_out()
        self._buffer = collections.deque(item for item in self._buffer if item[0] not in queues)
        states = {queue: self._states.pop(queue) for queue in queues if queue in self._states}
        due = [(q, s.consumed) for q, s in states.items()
               if s.consumed is not None and s.consumed != s.committed]

        async def one(queue: MessageQueue, offset: int) -> None:
            try:
                await self.consumer.commit(queue, offset)
            except MQError as exc:
                log.info("client: committing %s at %s on giving it up failed: %s", queue,
                         offset, exc)

        with unwrap_single_exception():
            async with trio.open_nursery() as nursery:
                for queue, offset in due:
                    nursery.start_soon(one, queue, offset)

    async def _group_changed(self) -> None:
        """Return when the group's members change (never, for a fixed list of queues)."""
        if self._signal is None:
            await trio.sleep_forever()
        else:
            await self._signal.wait()

    def _failed(self, queue: MessageQueue, exc: BaseException) -> None:
        state = self._states[queue]
        state.failures += 1
        delay = min(self.BACKOFF_MAX, self.BACKOFF_MIN * 2 ** (state.failures - 1))
        state.retry_at = trio.current_time() + delay
        log.info("client: stream of %s: %s (retrying in %.1f s)", queue, exc, delay)

    async def _start_offset(self, queue: MessageQueue, state: _QueueState) -> int:
        committed = await self.consumer.committed_offset(queue)
        if committed is None or committed < 0:
            if self.from_where == "first":
                committed = await self.consumer.min_offset(queue)
            else:
                committed = await self.consumer.max_offset(queue)
        state.offset = state.consumed = state.committed = committed
        return committed

    async def _fetch(self) -> None:
        """One round: pull every ready queue without waiting; if none had anything, pull
        them all with long polling until the first answers with news."""
        queues = await self._queues()
        for queue in queues:
            self._states.setdefault(queue, _QueueState())
        now = trio.current_time()
        ready = [q for q in queues if self._states[q].retry_at <= now]
        if not ready:
            if queues:
                await trio.sleep_until(min(self._states[q].retry_at for q in queues))
            else:
                with trio.move_on_after(self.BACKOFF_MAX):
                    await self._group_changed()
            return
        progressed, answered = await self._pull_round(ready, 0.0)
        if not progressed and answered and self.suspend_timeout > 0:
            await self._pull_round(answered, self.suspend_timeout)

    async def _pull_round(self, queues: list[MessageQueue], suspend: float
                          ) -> tuple[bool, list[MessageQueue]]:
        """Pull ``queues`` concurrently; with ``suspend``, stop at the first that brings
        messages or moves its offset (the others' held pulls are abandoned: their offsets did
        not move, so nothing is lost). Returns whether any queue moved, and the queues that
        answered."""
        progressed = False
        results: dict[MessageQueue, PullResult] = {}

        async def one(queue: MessageQueue, cancel: trio.CancelScope) -> None:
            nonlocal progressed
            state = self._states[queue]
            try:
                offset = state.offset
                if offset is None:
                    offset = await self._start_offset(queue, state)
                result = await self.consumer.pull(
                    queue, offset, self.batch_size, subscription=self.subscription,
                    suspend_timeout=suspend,
                )
            except MQError as exc:
                self._failed(queue, exc)
                return
            state.failures = 0
            results[queue] = result
            if result.messages or result.next_begin_offset != state.offset:
                progressed = True
                if suspend > 0:
                    cancel.cancel()

        async def regroup(pulls: trio.CancelScope) -> None:
            await self._group_changed()
            pulls.cancel()  # held pulls are abandoned: the shares are cut again first

        with unwrap_single_exception():
            async with trio.open_nursery() as watch:
                async with trio.open_nursery() as nursery:
                    for queue in queues:
                        nursery.start_soon(one, queue, nursery.cancel_scope)
                    if suspend > 0 and self._fixed_queues is None:
                        watch.start_soon(regroup, nursery.cancel_scope)
                watch.cancel_scope.cancel()

        for queue in sorted(results):
            self._accept(queue, results[queue])
        answered = []
        for queue, result in sorted(results.items()):
            if not progressed and result.status is PullStatus.NO_MATCHED_MSG:
                # it came back at once without moving: a slave that does not correct offsets
                # answers so until it has the data; don't spin on it
                self._states[queue].retry_at = trio.current_time() + self.NO_PROGRESS_DELAY
            else:
                answered.append(queue)
        return progressed, answered

    def _accept(self, queue: MessageQueue, result: PullResult) -> None:
        state = self._states[queue]
        if result.status is PullStatus.OFFSET_ILLEGAL:
            log.info("client: offset %s of %s is illegal; moving to %s", state.offset, queue,
                     result.next_begin_offset)
        start = state.offset if state.offset is not None else result.next_begin_offset
        messages = [m for m in result.messages if m.queue_offset >= start]
        state.offset = result.next_begin_offset
        if not messages:
            state.consumed = result.next_begin_offset
            return
        for i, message in enumerate(messages):
            last = i == len(messages) - 1
            consumed = result.next_begin_offset if last else message.queue_offset + 1
            self._buffer.append((queue, message, consumed))


@contextlib.asynccontextmanager
async def open_pull_consumer(
    namesrv_addr: str | Iterable[str] | ClientInstance, group: str, **options: Any
) -> AsyncIterator[PullConsumer]:
    """A PullConsumer of ``group``. ``namesrv_addr`` is ``"host:port;..."`` or a
    ClientInstance to share; ``options`` are ClientConfig fields (with an address) and
    ``request_timeout``."""
    if not group:
        raise MQClientError("a consumer needs a group name")
    request_timeout = options.pop("request_timeout", None)
    async with use_instance(namesrv_addr, options) as instance:
        instance.register_consumer(group)
        try:
            yield PullConsumer(instance, group, request_timeout)
        finally:
            await instance.unregister(consumer_group=group)
