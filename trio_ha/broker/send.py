"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (RocketMQ's SendMessageProcessor).

The producer's properties string is stored as it came, with the broker's CLUSTER property
added, as RocketMQ does; a batch body goes to the store's native batch encoder untouched. The
store's status becomes the response code in docs/remoting.md, 'Send': the four "stored"
statuses carry msgId, queueId and queueOffset (and MSG_REGION, TRACE_ON), the others an error
remark.

A message with a delay level (DELAY) is stored in SCHEDULE_TOPIC_XXXX until it is due
(``schedule``). A message sent to a retry topic (``%RETRY%<group>``: the Java consumer's
fallback when CONSUMER_SEND_MSG_BACK fails) that has been consumed maxReconsumeTimes times
already goes to the group's dead-letter topic instead (RocketMQ's ``handleRetryAndDLQ``).
CONSUMER_SEND_MSG_BACK itself is ``process_send_back``. What this broker does not do —
RocketMQ 5's timer messages — is refused with a response that says so, never stored as if it
were a plain message. A transactional message (TRAN_MSG=true) is stored as a half message
until END_TRANSACTION (``transactions``).

The topic is checked first, as RocketMQ's ``msgCheck`` does: a name outside RocketMQ's charset
or length is SYSTEM_ERROR with ``validateTopic``'s remark, and the topics only the broker
itself writes (SCHEDULE_TOPIC_XXXX, the transaction topics, SELF_TEST_TOPIC,
OFFSET_MOVED_EVENT) are NO_PERMISSION, "Sending message to topic[...] is forbidden." The broker
writes them through its store, never through this processor.
"""

from __future__ import annotations

import functools
import random

import attrs
import trio

from ..answer import Answer
from ..remoting import RUN_IN_TASK, PendingReply, RemotingConnection
from ..remoting.answers import Reply, failure_reply
from ..remoting.connection import RunInTask, WaitInTask
from ..store import PendingPut, PutMessageResult, PutMessageStatus, PutRequest
from ..wire import record as rec
from ..wire.metadata import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
)
from ..wire.permission import writable
from ..wire.remoting import (
    RemotingCommand,
    RequestCode,
    ResponseCode,
    SendMessageRequestHeader,
    send_message_header,
)
from ..wire.remoting.message_headers import encode_stored_send_response
from .broker import Broker
from .metadata import NOT_ALLOWED_SEND_TOPICS, topic_problem
from .schedule import delay_level, delayed
from .transactions import half_message, is_transactional

STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: ResponseCode.SYSTEM_ERROR,
}

REMARKS = {
    PutMessageStatus.CREATE_MAPEDFILE_FAILED:
        "create mapped file failed, server is busy or broken.",
    PutMessageStatus.OS_PAGECACHE_BUSY:
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
    # RocketMQ 5.3.3's SendMessageProcessor and EndTransactionProcessor, word for word
    PutMessageStatus.IN_SYNC_REPLICAS_NOT_ENOUGH: "in-sync replicas not enough",
}

PROPERTY_CLUSTER = "CLUSTER"
#: RocketMQ 5's timer messages (any delivery time, the timer wheel): not supported here
TIMER_PROPERTIES = frozenset({"TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS"})
#: RocketMQ's DLQ_NUMS_PER_GROUP: a dead-letter topic has one queue
DLQ_NUMS_PER_GROUP = 1
#: ``TopicSysFlag.buildSysFlag(false, true)``: a retry topic made for a unit-mode consumer
UNIT_MODE_SYS_FLAG = 0x2
#: what a stored message's response carries in MSG_REGION and TRACE_ON: RocketMQ's defaults of
#: ``regionId`` and ``traceOn``
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
DEFAULT_REGION_ID = "DefaultRegion"
TRACE_ON = "true"


def send_reply(
    request: RemotingCommand, result: PutMessageResult, queue_id: int
) -> RemotingCommand | bytes:
    """``send_response``; a PUT_OK's as its encoded frame, formatted in one step."""
    if result.status is PutMessageStatus.PUT_OK:
        return encode_stored_send_response(
            request, result.msg_id, queue_id, result.queue_offset, DEFAULT_REGION_ID, TRACE_ON,
        )
    return send_response(request, result, queue_id)


def send_response(
    request: RemotingCommand, result: PutMessageResult, queue_id: int
) -> RemotingCommand:
    status = result.status
    code = STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR)
    if status.stored:
        return RemotingCommand.response_to(
            request, code, remark=None if status is PutMessageStatus.PUT_OK else status.name,
            ext_fields={
                "msgId": result.msg_id, "queueId": queue_id, "queueOffset": result.queue_offset,
                PROPERTY_MSG_REGION: DEFAULT_REGION_ID, PROPERTY_TRACE_SWITCH: TRACE_ON,
            },
        )
    return RemotingCommand.response_to(
        request, code, remark=REMARKS.get(status) or result.remark or status.name
    )


async def process_send(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand | bytes:
    plan = _plan_send(broker, request, connection)
    if plan is None:
        # Its topic is made here: the topic table is written before the send is answered.
        header = send_message_header(request)
        if broker.auto_create_topic(header) is not None:
            await broker.persist_topics()
            # (None again if the topic went meanwhile: an admin deleted it)
            plan = _plan_send(broker, request, connection)
        if plan is None:
            plan = RemotingCommand.response_to(
                request, ResponseCode.TOPIC_NOT_EXIST,
                remark=f"topic[{header.topic}] not exist, apply first please!",
            )
    if isinstance(plan, RemotingCommand):
        await trio.lowlevel.checkpoint()
        return plan
    result = await broker.store.put(plan.put)
    broker.stats.record_put(result)
    return send_reply(request, result, plan.queue_id)


def process_send_now(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> Reply | PendingReply | RunInTask:
    """``process_send`` in the reader's round, without a task: the reply, or a
    SYNC send's ``PendingReply`` (``_reply_when_done``); left to ``process_send``'s task
    when the topic must be made or the log needs its next segment first (both wait)."""
    plan = _plan_send(broker, request, connection)
    if plan is None:
        return RUN_IN_TASK
    if isinstance(plan, RemotingCommand):
        return plan
    outcome = broker.store.append_now(plan.put)
    if outcome is None:
        return RUN_IN_TASK
    if isinstance(outcome, PendingPut):
        return _reply_when_done(broker, request, connection.peer, plan.queue_id, outcome)
    broker.stats.record_put(outcome)
    return send_reply(request, outcome, plan.queue_id)


def _reply_when_done(broker: Broker, request: RemotingCommand, peer: str, queue_id: int,
                     put: PendingPut) -> PendingReply:
    """The reply of a send whose put waits for SYNC_FLUSH or slaves: an answer given from
    the task that answers the put (the slave's ack reader), or, when the put must wait for
    room in a full channel, a task's wait for it."""
    reply: Answer[Reply] = Answer()
    if put.when_done(functools.partial(_give_reply, broker, request, peer, queue_id, reply)):
        return reply
    return WaitInTask(functools.partial(_wait_reply, broker, request, peer, queue_id, put))


def _give_reply(broker: Broker, request: RemotingCommand, peer: str, queue_id: int,
                reply: Answer[Reply], result: PutMessageResult) -> None:
    reply.set(_reply(broker, request, peer, queue_id, result))


async def _wait_reply(broker: Broker, request: RemotingCommand, peer: str, queue_id: int,
                      put: PendingPut) -> Reply:
    return _reply(broker, request, peer, queue_id, await put.wait())


def _reply(broker: Broker, request: RemotingCommand, peer: str, queue_id: int,
           result: PutMessageResult) -> RemotingCommand | bytes:
    try:
        broker.stats.record_put(result)
        return send_reply(request, result, queue_id)
    except Exception as exc:  # never into the task that answered the put
        return failure_reply(request, exc, peer)


@attrs.frozen
class _SendPlan:
    """A send that passed every check: what to store where, and the queue the producer
    chose (the response names it; the put may go elsewhere: a delay, a dead letter)."""

    put: PutRequest
    queue_id: int


def _plan_send(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand | _SendPlan | None:
    """Check a send and work out where it goes: the refusal, the plan, or None when its
    topic does not exist yet (``process_send`` makes it, if it may)."""
    header = send_message_header(request)
    config = broker.config
    if not writable(config.broker_permission):
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"the broker[{config.broker_name}] sending message is forbidden",
        )
    if broker.is_slave:
        return RemotingCommand.response_to(
            request, ResponseCode.SERVICE_NOT_AVAILABLE,
            remark=f"broker {config.broker_name} ({broker.addresses.broker_addr}) is a SLAVE "
                   "and does not accept writes; send to its master",
        )
    problem = topic_problem(header.topic)
    if problem is not None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark=problem)
    if header.topic in NOT_ALLOWED_SEND_TOPICS:
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"Sending message to topic[{header.topic}] is forbidden.",
        )
    topic_config = broker.metadata.topics.get(header.topic)
    if topic_config is None:
        return None
    queue_id = header.queue_id
    if queue_id < 0:
        queue_id = random.randrange(topic_config.write_queue_nums)
    elif queue_id >= topic_config.write_queue_nums:
        return RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR,
            remark=f"request queueId[{queue_id}] is illegal, {topic_config} Producer: "
                   f"{connection.peer}",
        )
    properties = rec.decode_properties(header.properties or "")
    prepared = is_transactional(properties)
    tx_type = header.sys_flag & rec.TRANSACTION_TYPE_MASK
    if prepared and config.reject_transaction_message:
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"the broker[{config.broker_name}] sending transaction message is forbidden",
        )
    if tx_type != rec.TRANSACTION_NOT_TYPE and not prepared:
        # Commits and rollbacks come as END_TRANSACTION; a record of these types sent as a
        # message would be stored where no consumer ever sees it.
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark="a transaction type in sysFlag needs TRAN_MSG=true (a half message); "
                   "commit or roll back with END_TRANSACTION",
        )
    if timer := sorted(TIMER_PROPERTIES & properties.keys()):
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark=f"timer messages ({', '.join(timer)}) are not supported by this broker "
                   "(trio_ha); use a delay level (DELAY)",
        )
    try:
        level = delay_level(properties)
    except ValueError:
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark=f"the DELAY property must be a delay level, got "
                   f"{properties[rec.PROPERTY_DELAY_TIME_LEVEL]!r}",
        )
    batch = request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch
    if batch and (level is not None or prepared):
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark="a batch cannot have a delay level (DELAY) or be transactional",
        )
    if prepared and level is not None:
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark="a transactional message cannot have a delay level (DELAY)",
        )
    # Where the message is stored; the response names the queue the producer chose.
    topic, store_queue = header.topic, queue_id
    if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        dead = _dead_letter_if_exhausted(broker, request, header)
        if isinstance(dead, RemotingCommand):
            return dead
        if dead is not None:
            topic, store_queue, level = dead, 0, None
            properties.pop(rec.PROPERTY_DELAY_TIME_LEVEL, None)
    sys_flag = header.sys_flag
    if level is not None:
        moved = delayed(topic, store_queue, properties, level, len(config.store.delay_levels))
        topic, store_queue, properties = moved.topic, moved.queue_id, moved.properties
    elif prepared:
        # A half message: kept aside until END_TRANSACTION (``transactions``), as a plain
        # message of the half topic, which the check reads.
        properties = half_message(topic, store_queue, properties)
        topic, store_queue = TRANS_HALF_TOPIC, 0
        sys_flag &= ~rec.TRANSACTION_TYPE_MASK
        _ensure_transaction_topics(broker)
    wait = properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false"
    properties[PROPERTY_CLUSTER] = config.broker_cluster_name
    if batch:
        # A batch's own properties are appended to each of its messages, where a later key
        # wins over the message's own. RocketMQ 5 clients give the batch a UNIQ_KEY of its
        # own, so RocketMQ 5 brokers store every message of a batch under the batch's id:
        # consumers see one msgId for the whole batch (a consumer that deduplicates by it
        # drops all but one) and it matches none of the ids the producer was given. Each
        # message keeps its own id here.
        properties.pop(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, None)
    # Positional, in PutRequest's field order (every send comes this way); the 0 is
    # prepared_transaction_offset, which only END_TRANSACTION's commit sets.
    return _SendPlan(PutRequest(
        topic, store_queue, request.body, rec.encode_properties(properties).encode(),
        bool(batch), header.flag, sys_flag, header.born_timestamp, connection.peer,
        header.reconsume_times or 0, 0, wait,
    ), queue_id)


def _ensure_transaction_topics(broker: Broker) -> None:
    """The half and op topics, made at the first half message (one read-write queue each),
    as RocketMQ makes them on first use."""
    topics = broker.metadata.topics
    made = False
    for topic in (TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC):
        if topics.get(topic) is None:
            topics.create_topic_in_send_back(topic, 1)
            made = True
    if made:
        broker.topics_changed()


def _dead_letter_if_exhausted(
    broker: Broker, request: RemotingCommand, header: SendMessageRequestHeader
) -> str | RemotingCommand | None:
    """A send to ``%RETRY%<group>``: the group's dead-letter topic when the message has been
    consumed maxReconsumeTimes times (the request's, else the group's retryMaxTimes), None to
    send it on as asked, or the refusal when the group does not exist."""
    group = header.topic[len(RETRY_GROUP_TOPIC_PREFIX):]
    group_config = broker.metadata.subscriptions.find_or_create(group)
    if group_config is None:
        return RemotingCommand.response_to(
            request, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            remark=f"subscription group not exist, {group}",
        )
    most = header.max_reconsume_times
    if most is None:
        most = group_config.retry_max_times
    if (header.reconsume_times or 0) < most:
        return None
    return _dead_letter_topic(broker, group)


def _dead_letter_topic(broker: Broker, group: str) -> str:
    """``%DLQ%<group>``, created on demand with one read-write queue, as RocketMQ 4.9.8
    creates it (older releases made it write-only)."""
    topic = DLQ_GROUP_TOPIC_PREFIX + group
    if broker.metadata.topics.get(topic) is None:
        broker.metadata.topics.create_topic_in_send_back(topic, DLQ_NUMS_PER_GROUP)
        broker.topics_changed()
    return topic


#: ``MQVersion.Version.V3_4_9.ordinal()``: clients from this version on may set
#: maxReconsumeTimes in a send-back (and in a send to a retry topic)
VERSION_3_4_9 = 165


async def process_send_back(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """CONSUMER_SEND_MSG_BACK: a consumer failed a message; it comes back later through the
    group's retry topic, or goes to its dead-letter topic once it has been consumed
    maxReconsumeTimes times (RocketMQ 4.9.8's ``asyncConsumerSendMsgBack``).

    A copy of the record at ``offset`` is stored with RECONSUMETIMES one higher, RETRY_TOPIC
    naming its first topic and ORIGIN_MESSAGE_ID its first msgId, to ``%RETRY%<group>`` with
    delay level ``delayLevel`` (0: 3 + the times it was consumed, so each retry waits longer;
    it goes through SCHEDULE_TOPIC_XXXX like any delayed message), or to ``%DLQ%<group>``
    without delay when the times are used up or ``delayLevel`` is negative."""
    await trio.lowlevel.checkpoint()
    group = request.field_str("group")
    offset = request.field_long("offset")
    delay = request.field_int("delayLevel", 0)
    config = broker.config
    group_config = broker.metadata.subscriptions.find_or_create(group)
    if group_config is None:
        return RemotingCommand.response_to(
            request, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            remark=f"subscription group not exist, {group}",
        )
    if not writable(config.broker_permission):
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"the broker[{config.broker_ip1}] sending message is forbidden",
        )
    if broker.is_slave:
        return RemotingCommand.response_to(
            request, ResponseCode.SERVICE_NOT_AVAILABLE,
            remark=f"broker {config.broker_name} is a SLAVE and stores no retries; send the "
                   "message back to its master",
        )
    if group_config.retry_queue_nums <= 0:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
    topics = broker.metadata.topics
    topic = RETRY_GROUP_TOPIC_PREFIX + group
    queue_id = random.randrange(group_config.retry_queue_nums)
    if topics.get(topic) is None:
        topics.create_topic_in_send_back(
            topic, group_config.retry_queue_nums,
            topic_sys_flag=UNIT_MODE_SYS_FLAG if request.field_bool("unitMode", False) else 0,
        )
        broker.topics_changed()
    topic_config = topics.get(topic)
    if topic_config is None or not writable(topic_config.perm):
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"the topic[{topic}] sending message is forbidden",
        )
    message = await broker.store.look_message_by_offset(offset)
    if message is None:
        return RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR, remark=f"look message by offset failed, {offset}"
        )
    properties = dict(message.properties)
    properties.setdefault(rec.PROPERTY_RETRY_TOPIC, message.topic)
    properties[rec.PROPERTY_WAIT_STORE_MSG_OK] = "false"
    most = group_config.retry_max_times
    if request.version >= VERSION_3_4_9:
        most = request.field_int("maxReconsumeTimes", most)
    if message.reconsume_times >= most or delay < 0:
        topic, queue_id = _dead_letter_topic(broker, group), 0
        properties.pop(rec.PROPERTY_DELAY_TIME_LEVEL, None)
    else:
        level = delay or 3 + message.reconsume_times
        moved = delayed(topic, queue_id, properties, level, len(config.store.delay_levels))
        topic, queue_id, properties = moved.topic, moved.queue_id, moved.properties
    properties.setdefault(rec.PROPERTY_ORIGIN_MESSAGE_ID, message.msg_id)
    result = await broker.store.put(PutRequest(
        topic, queue_id, message.body, rec.encode_properties(properties).encode(),
        flag=message.flag, sys_flag=message.sys_flag, born_timestamp=message.born_timestamp,
        born_host=message.born_host, reconsume_times=message.reconsume_times + 1,
        wait_store_msg_ok=False,
    ))
    broker.stats.record_put(result)
    if result.status is PutMessageStatus.PUT_OK:
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
    return RemotingCommand.response_to(
        request, ResponseCode.SYSTEM_ERROR, remark=result.remark or result.status.name
    )
