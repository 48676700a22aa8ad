"""The producer: SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE with RocketMQ's send rules.

``async with open_producer(namesrv_addr, group) as producer`` then ``await
producer.send(Message(topic, body, tags=..., keys=...))``. What the Java
``DefaultMQProducer`` does, this does:

- every message gets a client-generated unique id in its ``UNIQ_KEY`` property (the "msgId"
  users see; the broker's own id, built from its address and the commitlog offset, is the
  ``offset_msg_id``), and ``WAIT=true`` unless set;
- a body over ``compress_over`` bytes (4 KiB) is zlib-compressed with the COMPRESSED sysflag
  (consumers decompress it; batches are never compressed);
- the queue is picked round-robin over the writable queues of broker groups whose master is in
  the route; a retry goes to a queue of another broker group when there is one;
- failures that are safe to retry (no connection, a broken connection, a timeout, and the
  broker codes SYSTEM_ERROR, SYSTEM_BUSY, SERVICE_NOT_AVAILABLE, TOPIC_NOT_EXIST,
  NO_PERMISSION) are retried ``retry_times_when_send_failed`` times (2), within the one
  ``timeout`` of the call; other codes (MESSAGE_ILLEGAL...) raise at once;
- each such failure looks the topic's route up again at once (the instance spaces those
  lookups), so a master change is followed by the send's own retry, not the next 30 s poll:
  a slave answers a send SERVICE_NOT_AVAILABLE (ours and RocketMQ 4.9's) or SYSTEM_BUSY
  (RocketMQ 5's, which rejects the request), a dead master refuses the connection. A retry
  with no other broker group to go to waits for that lookup (within ``timeout``);
- the stored-but-not-fully statuses FLUSH_DISK_TIMEOUT, FLUSH_SLAVE_TIMEOUT and
  SLAVE_NOT_AVAILABLE are results, not errors, and are only retried on another broker when
  ``retry_another_broker_when_not_store_ok`` is set (off by default: the message is stored on
  the master, and a retry would store it twice);
- a topic the name server does not know is sent through TBW102's route, so the broker
  creates it (``autoCreateTopicEnable``).

``send(message, queue=mq)`` and ``send(message, selector=fn)`` pick the queue themselves and
are not retried elsewhere (ordered messages must stay on their queue), as in Java.

Why one module at about 650 lines: the send rules (queue choice, retries, timeouts, the
statuses that are results) apply alike to single sends, batches, ordered sends and
transactions, and live with the one producer that applies them.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import random
import re
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import attrs
import trio

from .._errors import TrioHAError
from ..remoting import RemotingError
from ..wire import record as rec
from ..wire.errors import RecordDecodeError
from ..wire.metadata import NOT_ALLOWED_SEND_TOPICS, RETRY_GROUP_TOPIC_PREFIX
from ..wire.record import (
    DEFAULT_MAX_MESSAGE_SIZE,
    MAX_TOPIC_LENGTH,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    SYSFLAG_COMPRESSED,
    Message,
    StoredMessage,
    encode_batch_items,
)
from ..wire.remoting import (
    DEFAULT_VERSION,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SendMessageRequestHeader,
    SendRequest,
)
from .instance import (
    DEFAULT_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
    LANGUAGE,
    ClientInstance,
    MessageQueue,
    MQBrokerError,
    MQClientError,
    use_instance,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = ["Producer", "SendResult", "SendStatus", "open_producer"]

PROPERTY_DELAY = "DELAY"
_TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")

#: broker codes after which the send is retried (Java's retryResponseCodes, plus SYSTEM_BUSY)
RETRY_CODES = frozenset({
    ResponseCode.TOPIC_NOT_EXIST,
    ResponseCode.SERVICE_NOT_AVAILABLE,
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.SYSTEM_BUSY,
    ResponseCode.NO_PERMISSION,
})


class SendStatus(enum.Enum):
    """The client's view of a stored message (docs/remoting.md, 'Send')."""

    SEND_OK = "SEND_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"


_STATUS_BY_CODE: dict[int, SendStatus] = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}


@attrs.frozen
class SendResult:
    send_status: SendStatus
    #: the UNIQ_KEY the client gave the message (comma-joined for a batch)
    msg_id: str
    #: the broker's id: store address + commitlog offset (comma-joined for a batch)
    offset_msg_id: str
    message_queue: MessageQueue
    #: the queue offset of the message (of the first one for a batch)
    queue_offset: int
    region_id: str | None = None
    trace_on: bool = True


Selector = Callable[[Sequence[MessageQueue], Message], MessageQueue]


class TransactionState(enum.Enum):
    """What a local transaction (or a check of one) says: RocketMQ's LocalTransactionState."""

    COMMIT = rec.TRANSACTION_COMMIT
    ROLLBACK = rec.TRANSACTION_ROLLBACK
    #: not decided yet: the broker asks the group again later (CHECK_TRANSACTION_STATE)
    UNKNOWN = 0


#: runs the local transaction of a half message; its answer commits or rolls it back
LocalTransaction = Callable[[Message], Awaitable[TransactionState]]
#: answers the broker's question about a half message whose transaction was not decided
TransactionCheck = Callable[[StoredMessage], Awaitable[TransactionState]]



@attrs.frozen
class TransactionSendResult:
    #: where the half message went
    send_result: SendResult
    #: what the local transaction decided (ROLLBACK without running it when the half message
    #: was not stored as SEND_OK)
    state: TransactionState


@attrs.define(eq=False)
class Producer:
    instance: ClientInstance
    group: str
    #: retries after the first attempt (retryTimesWhenSendFailed)
    retry_times_when_send_failed: int = 2
    retry_another_broker_when_not_store_ok: bool = False
    #: default timeout of one send() call, all retries included (sendMsgTimeout)
    send_msg_timeout: float = 3.0
    #: bodies larger than this are compressed (compressMsgBodyOverHowmuch); None: never
    compress_over: int | None = 4096
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    default_topic_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS
    _indexes: dict[str, int] = attrs.field(factory=dict)

    # ---- public -----------------------------------------------------------------------------

    async def send(
        self,
        message: Message,
        *,
        queue: MessageQueue | None = None,
        selector: Selector | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send one message and wait for the broker's answer. Returns a SendResult for the
        four stored statuses; raises MQBrokerError (the broker's code and remark) or
        MQClientError (no route, no broker reachable, timed out, invalid message)."""
        self._check_message(message)
        if selector is None:
            encoded, uniq_id = self._prepared_properties(message)
        else:  # the selector sees the message as it is sent, UNIQ_KEY and all (as Java's)
            message, uniq_id = self._prepared(message)
            encoded = message.encoded_properties()
        body, sys_flag = message.body, message.sys_flag
        if self.compress_over is not None and len(body) > self.compress_over:
            body, sys_flag = zlib.compress(body, 5), sys_flag | SYSFLAG_COMPRESSED
        properties = encoded.decode()
        return await self._send(
            message.topic, body, properties, sys_flag, message.flag, uniq_id,
            queue=queue, selector=selector, message=message, batch=False, timeout=timeout,
        )

    async def send_batch(
        self,
        messages: Sequence[Message],
        *,
        queue: MessageQueue | None = None,
        timeout: float | None = None,
    ) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE: stored together on one
        queue with consecutive offsets. Not for delayed or retry-topic messages."""
        if not messages:
            raise MQClientError("a batch needs at least one message")
        first = messages[0]
        self._check_message(first)
        topic = first.topic
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            raise MQClientError("retry-group messages cannot be sent in a batch")
        items = []
        ids = []
        # One id per message made at once (a message that has its UNIQ_KEY leaves one unused).
        fresh = iter(self.instance.new_uniq_ids(len(messages)))
        for message in messages:
            if message is not first:
                if not isinstance(message, Message):
                    raise MQClientError(f"expected a Message, got {type(message).__name__}")
                if message.topic != topic:
                    raise MQClientError("all messages of a batch must have the same topic")
                self._check_body(message)  # the topic is the first one's, checked
            if message.properties.get(PROPERTY_DELAY, "0") not in ("", "0"):
                raise MQClientError("delayed messages cannot be sent in a batch")
            properties, uniq_id = self._prepared_properties(message, fresh)
            items.append((message.flag, message.body, properties))
            ids.append(uniq_id)
        try:
            body = encode_batch_items(items)
        except ValueError as exc:
            raise MQClientError(f"cannot encode the batch: {exc}") from None
        if len(body) > self.max_message_size:
            raise MQClientError(
                f"the batch is {len(body)} bytes, more than the maximum {self.max_message_size}"
            )
        # The batch's own properties are added to every message by the broker: send none, so
        # each message keeps its own UNIQ_KEY.
        return await self._send(
            topic, body, None, 0, 0, ",".join(ids), queue=queue, selector=None, message=None,
            batch=True, timeout=timeout,
        )

    # ---- checks and preparation ------------------------------------------------------------------

    def _check_message(self, message: Message) -> None:
        """Java's ``Validators.checkMessage``."""
        if not isinstance(message, Message):
            raise MQClientError(f"expected a Message, got {type(message).__name__}")
        topic = message.topic
        if not topic or not topic.strip():
            raise MQClientError("the specified topic is blank")
        if len(topic) > MAX_TOPIC_LENGTH:
            raise MQClientError(f"the specified topic is longer than {MAX_TOPIC_LENGTH} characters")
        if not _TOPIC_PATTERN.fullmatch(topic):  # whole: "$" would let a trailing newline in
            raise MQClientError(
                f"the specified topic {topic!r} contains illegal characters "
                f"(allowed: {_TOPIC_PATTERN.pattern})"
            )
        if topic == DEFAULT_TOPIC:
            raise MQClientError(f"the topic {DEFAULT_TOPIC} is reserved for topic auto-creation")
        if topic in NOT_ALLOWED_SEND_TOPICS:  # the broker refuses them (NO_PERMISSION)
            raise MQClientError(f"Sending message to topic[{topic}] is forbidden.")
        self._check_body(message)

    def _check_body(self, message: Message) -> None:
        if not message.body:
            raise MQClientError("the message body length is zero")
        if len(message.body) > self.max_message_size:
            raise MQClientError(
                f"the message body size {len(message.body)} is over the maximum "
                f"{self.max_message_size}"
            )

    def _prepared(self, message: Message) -> tuple[Message, str]:
        """The message with UNIQ_KEY (kept if set) and WAIT, as Java's client sends it."""
        properties = message.properties
        uniq_id = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if uniq_id and PROPERTY_WAIT_STORE_MSG_OK in properties:
            return message, uniq_id
        added = dict(properties)
        if not uniq_id:
            uniq_id = added[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self.instance.new_uniq_id()
        added.setdefault(PROPERTY_WAIT_STORE_MSG_OK, "true")
        return attrs.evolve(message, properties=added), uniq_id

    def _prepared_properties(self, message: Message,
                             fresh: Iterator[str] | None = None) -> tuple[bytes, str]:
        """``_prepared``'s message's PROPERTIES field, without a new Message: the added
        UNIQ_KEY and WAIT go at the end, where ``_prepared``'s dict puts them (every send
        prepares its message, and a copy of it per send would be a good part of its cost). A new
        UNIQ_KEY is the next of ``fresh`` (a batch's ids, made together) when given."""
        properties = message.properties
        uniq_id = properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
        if uniq_id == "":  # present but empty: replaced in place, as _prepared does
            prepared, uniq_id = self._prepared(message)
            return prepared.encoded_properties(), uniq_id
        encoded = message.encoded_properties()
        added = []
        if uniq_id is None:
            uniq_id = next(fresh) if fresh is not None else self.instance.new_uniq_id()
            added.append(f"{PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX}\x01{uniq_id}")
        if PROPERTY_WAIT_STORE_MSG_OK not in properties:
            added.append(f"{PROPERTY_WAIT_STORE_MSG_OK}\x01true")
        if added:
            tail = "\x02".join(added).encode()
            encoded = encoded + b"\x02" + tail if encoded else tail
        return encoded, uniq_id

    # ---- transactions ---------------------------------------------------------------------------

    async def send_in_transaction(
        self, message: Message, execute: LocalTransaction, *, timeout: float | None = None
    ) -> TransactionSendResult:
        """Send ``message`` as a half message, run ``execute`` (the local transaction), and
        commit or roll the message back as it answers (END_TRANSACTION). UNKNOWN, or an
        exception from ``execute`` (logged), leaves it to the broker's check, which this
        producer's ``check`` (``open_producer(check=...)``) answers. RocketMQ's
        TransactionMQProducer.sendMessageInTransaction."""
        properties = dict(message.properties)
        properties[rec.PROPERTY_TRANSACTION_PREPARED] = "true"
        properties[rec.PROPERTY_PRODUCER_GROUP] = self.group
        half = attrs.evolve(message, properties=properties,
                            sys_flag=(message.sys_flag & ~rec.TRANSACTION_TYPE_MASK)
                            | rec.TRANSACTION_PREPARED)
        result = await self.send(half, timeout=timeout)
        if result.send_status is not SendStatus.SEND_OK:
            state = TransactionState.ROLLBACK
        else:
            try:
                state = await execute(message)
            except Exception:
                log.exception("client: the local transaction of %s failed", result.msg_id)
                state = TransactionState.UNKNOWN
        await self._end_transaction(result, state)
        return TransactionSendResult(result, state)

    async def _end_transaction(self, result: SendResult, state: TransactionState) -> None:
        """END_TRANSACTION (oneway) to the half message's broker; a failure is logged: the
        broker's check asks again."""
        address = self.instance.master_addr(result.message_queue.broker_name)
        try:
            _, commitlog_offset = rec.decode_message_id(result.offset_msg_id)
        except RecordDecodeError:
            log.warning("client: bad offsetMsgId %r; the broker will check",
                        result.offset_msg_id)
            return
        if address is None:
            log.info("client: no master of %s to end %s; the broker will check",
                     result.message_queue.broker_name, result.msg_id)
            return
        request = self.instance.request(RequestCode.END_TRANSACTION, end_transaction_fields(
            self.group, result.queue_offset, commitlog_offset, state, result.msg_id,
            from_check=False))
        try:
            await self.instance.invoke_oneway(address, request)
        except RemotingError as exc:
            log.info("client: ending %s at %s failed: %s; the broker will check",
                     result.msg_id, address, exc)

    # ---- queue selection -------------------------------------------------------------------------

    async def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The topic's writable queues, looking the route up when none are known."""
        queues = self.instance.publish_queues(topic)
        if not queues:
            await self.instance.refresh_route(topic, allow_default=True)
            queues = self.instance.publish_queues(topic)
        return queues

    def _select(self, topic: str, queues: list[MessageQueue], last_broker: str | None
                ) -> MessageQueue:
        """Round-robin; after a failure, the next queue on another broker group if any."""
        index = self._indexes.get(topic)
        if index is None:
            index = random.randrange(1 << 16)
        for _ in range(len(queues) if last_broker is not None else 0):
            index += 1
            queue = queues[index % len(queues)]
            if queue.broker_name != last_broker:
                self._indexes[topic] = index
                return queue
        index += 1
        self._indexes[topic] = index
        return queues[index % len(queues)]

    # ---- sending ---------------------------------------------------------------------------------

    async def _send(
        self, topic: str, body: bytes, properties: str | None, sys_flag: int, flag: int,
        msg_id: str, *, queue: MessageQueue | None, selector: Selector | None,
        message: Message | None, batch: bool, timeout: float | None,
    ) -> SendResult:
        timeout = self.send_msg_timeout if timeout is None else timeout
        deadline = trio.current_time() + timeout
        # Everything, route lookups included, ends by the deadline. Not under one cancel
        # scope (too dear a send; docs/performance.md): the call's wait ends there by the
        # connection's timer, and only what must wait for something else — a route, a connection —
        # waits under a scope of its own (_until).
        try:
            return await self._send_within(
                topic, body, properties, sys_flag, flag, msg_id, queue=queue,
                selector=selector, message=message, batch=batch, timeout=timeout,
                deadline=deadline,
            )
        except _OutOfTime:
            raise MQClientError(f"sending to {topic} timed out after {timeout:g} s") from None

    async def _send_within(
        self, topic: str, body: bytes, properties: str | None, sys_flag: int, flag: int,
        msg_id: str, *, queue: MessageQueue | None, selector: Selector | None,
        message: Message | None, batch: bool, timeout: float, deadline: float,
    ) -> SendResult:
        async def attempt(mq: MessageQueue) -> SendResult:
            return await self._send_to(
                mq, body, properties, sys_flag, flag, msg_id, batch, deadline
            )

        if queue is not None or selector is not None:
            if queue is None:
                # a selector comes with the one message it selects a queue for
                assert selector is not None and message is not None
                queues = await _until(deadline, self.publish_queues, topic)
                if not queues:
                    raise MQClientError(self._no_route_text(topic))
                queue = selector(queues, message)
                if not isinstance(queue, MessageQueue):
                    raise MQClientError(f"the selector returned {queue!r}, not a MessageQueue")
            if queue.topic != topic:
                raise MQClientError(f"queue {queue} is not a queue of topic {topic}")
            try:
                return await attempt(queue)
            except RemotingError as exc:
                if trio.current_time() >= deadline:
                    raise _OutOfTime from exc
                await self._refresh_quietly(topic, deadline)
                raise MQClientError(f"sending to {queue} failed: {exc}") from exc

        attempts = 1 + max(self.retry_times_when_send_failed, 0)
        last_broker: str | None = None
        last_error: BaseException | None = None
        result: SendResult | None = None
        for number in range(attempts):
            queues = (self.instance.publish_queues(topic)
                      or await _until(deadline, self.publish_queues, topic))
            if not queues:
                error = MQClientError(self._no_route_text(topic))
                raise error from last_error
            mq = self._select(topic, queues, last_broker)
            last_broker = mq.broker_name
            if trio.current_time() >= deadline:
                break
            try:
                result = await attempt(mq)
            except MQBrokerError as exc:
                if exc.code not in RETRY_CODES:
                    raise
                last_error = exc
            except (RemotingError, MQClientError) as exc:
                last_error = exc
            else:
                if (
                    result.send_status is SendStatus.SEND_OK
                    or not self.retry_another_broker_when_not_store_ok
                    or number == attempts - 1
                ):
                    return result
                continue
            await self._refresh_quietly(topic, deadline, failed_broker=mq.broker_name,
                                        retrying=number < attempts - 1)
        if result is not None:  # an earlier attempt stored it (not fully): that is the answer
            return result
        if isinstance(last_error, MQBrokerError):
            raise last_error
        if trio.current_time() >= deadline:
            raise MQClientError(
                f"sending to {topic} timed out after {timeout:g} s"
                + (f"; last error: {last_error}" if last_error else "")
            ) from last_error
        raise MQClientError(
            f"sending to {topic} failed {attempts} times; last error: {last_error}"
        ) from last_error

    def _no_route_text(self, topic: str) -> str:
        route = self.instance.routes.get(topic)
        if route is not None and route.queue_datas:
            return (f"no writable queue for topic {topic}: no broker group of its route has a "
                    "master (the master is down or not registered)")
        return f"no route info of topic {topic} (is the name server or the broker up?)"

    async def _refresh_quietly(self, topic: str, deadline: float, *,
                               failed_broker: str | None = None, retrying: bool = False) -> None:
        """After a failed attempt: refresh ``topic``'s route (at once, unless its back-off
        holds the lookup back), giving up quietly on an error or at ``deadline``. When a retry
        follows with no other broker group to go to than ``failed_broker`` (the master of the
        only group died or became a slave), the retry waits for that lookup, within
        ``deadline``, so that it goes where the fresh route says, not where the send just
        failed."""
        if trio.current_time() >= deadline:
            # The attempt used the send's whole time (a broker that took the request and
            # never answered): the route is looked up anyway, for the sends that follow.
            self.instance.refresh_route_soon(topic)
            await trio.lowlevel.checkpoint()
            return
        wait = retrying and all(queue.broker_name == failed_broker
                                for queue in self.instance.publish_queues(topic))
        with trio.move_on_at(deadline):
            try:
                await self.instance.refresh_route(topic, allow_default=True,
                                                  wait_until=deadline if wait else None)
            except MQClientError:
                pass

    async def _send_to(
        self, mq: MessageQueue, body: bytes, properties: str | None, sys_flag: int, flag: int,
        msg_id: str, batch: bool, deadline: float,
    ) -> SendResult:
        address = self.instance.master_addr(mq.broker_name)
        if address is None:
            await _until(deadline, functools.partial(
                self.instance.refresh_route, mq.topic, allow_default=True))
            address = self.instance.master_addr(mq.broker_name)
        if address is None:
            raise MQClientError(f"the master of broker {mq.broker_name} is not in the route")
        header = SendMessageRequestHeader(
            producer_group=self.group,
            topic=mq.topic,
            default_topic=DEFAULT_TOPIC,
            default_topic_queue_nums=self.default_topic_queue_nums,
            queue_id=mq.queue_id,
            sys_flag=sys_flag,
            born_timestamp=time.time_ns() // 1_000_000,
            flag=flag,
            properties=properties or None,
            reconsume_times=0,
            unit_mode=False,
            batch=batch,
            broker_name=mq.broker_name,
        )
        # The frame is formatted once its opaque is known (SendRequest.frame).
        request = SendRequest(
            header, body, RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2,
            LANGUAGE, DEFAULT_VERSION,
        )
        if trio.current_time() >= deadline:
            raise MQClientError(f"no time left to send to {address}")
        response = await self.instance.invoke_by_deadline(address, request, deadline=deadline)
        status = _STATUS_BY_CODE.get(response.code)
        if status is None:
            raise MQBrokerError(response.code, response.remark, address)
        fields = response.ext_fields
        try:
            queue_id = int(fields.get("queueId", mq.queue_id))
            queue_offset = int(fields.get("queueOffset", -1))
        except ValueError:
            raise MQClientError(f"bad send response from {address}: {fields}") from None
        return SendResult(
            send_status=status,
            msg_id=msg_id,
            offset_msg_id=fields.get("msgId", ""),
            message_queue=MessageQueue(mq.topic, mq.broker_name, queue_id),
            queue_offset=queue_offset,
            region_id=fields.get("MSG_REGION"),
            trace_on=fields.get("TRACE_ON", "true") != "false",
        )


class _OutOfTime(TrioHAError):
    """A send's deadline passed while it waited for something other than its call."""


async def _until(deadline: float, fn: Callable[..., Awaitable[_T]], *args: Any) -> _T:
    """``await fn(*args)``, given up at ``deadline`` (``_OutOfTime``): what a send waits
    for besides its call (a route, a connection) waits under a scope of its own."""
    with trio.move_on_at(deadline):
        return await fn(*args)
    raise _OutOfTime


def end_transaction_fields(group: str, table_offset: int, commitlog_offset: int,
                           state: TransactionState, msg_id: str, *, from_check: bool
                           ) -> dict[str, Any]:
    return {"producerGroup": group, "tranStateTableOffset": table_offset,
            "commitLogOffset": commitlog_offset, "commitOrRollback": state.value,
            "fromTransactionCheck": "true" if from_check else "false", "msgId": msg_id,
            "transactionId": msg_id}


async def _answer_check(instance: ClientInstance, address: str, request: RemotingCommand
                        ) -> None:
    """CHECK_TRANSACTION_STATE from ``address``: ask the group's check listener about the
    message and END_TRANSACTION (from check) with its answer. Errors are logged: the broker
    asks again at its next round."""
    try:
        message = rec.decode_record(request.body)
        fields = request.ext_fields
        table_offset = int(fields["tranStateTableOffset"])
        commitlog_offset = int(fields["commitLogOffset"])
    except (RecordDecodeError, KeyError, ValueError) as exc:
        log.warning("client: bad CHECK_TRANSACTION_STATE from %s: %s", address, exc)
        return
    group = message.properties.get(rec.PROPERTY_PRODUCER_GROUP, "")
    check = instance.transaction_listeners.get(group)
    if check is None:
        log.info("client: no transaction check for group %r here", group)
        return
    msg_id = request.ext_fields.get("msgId") or message.properties.get(
        rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, "")
    try:
        state = await check(message)
    except Exception:
        log.exception("client: the transaction check of %s failed", msg_id)
        return
    end = instance.request(RequestCode.END_TRANSACTION, end_transaction_fields(
        group, table_offset, commitlog_offset, state, msg_id, from_check=True))
    try:
        await instance.invoke_oneway(address, end)
    except RemotingError as exc:
        log.info("client: answering the check of %s at %s failed: %s", msg_id, address, exc)


@contextlib.asynccontextmanager
async def open_producer(
    namesrv_addr: str | Iterable[str] | ClientInstance, group: str, **options: Any
) -> AsyncIterator[Producer]:
    """A Producer of ``group``. ``namesrv_addr`` is ``"host:port;..."`` or a ClientInstance
    to share. ``options``: Producer fields (``retry_times_when_send_failed``,
    ``retry_another_broker_when_not_store_ok``, ``send_msg_timeout``, ``compress_over``,
    ``max_message_size``...) and, with an address, ClientConfig fields. ``check``: the
    listener that answers the broker's questions about this group's undecided transactions
    (``Producer.send_in_transaction``)."""
    check: TransactionCheck | None = options.pop("check", None)
    producer_fields = {f.name for f in attrs.fields(Producer)} - {"instance", "group", "_indexes"}
    producer_options = {k: v for k, v in options.items() if k in producer_fields}
    client_options = {k: v for k, v in options.items() if k not in producer_fields}
    if not group:
        raise MQClientError("a producer needs a group name")
    async with use_instance(namesrv_addr, client_options) as instance:
        if check is not None:
            instance.transaction_listeners[group] = check
            instance.transaction_checker = functools.partial(_answer_check, instance)
        instance.register_producer(group)
        try:
            yield Producer(instance, group, **producer_options)
        finally:
            instance.transaction_listeners.pop(group, None)
            await instance.unregister(producer_group=group)
