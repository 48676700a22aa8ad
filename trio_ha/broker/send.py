"""SEND_MESSAGE, SEND_MESSAGE_V2 and SEND_BATCH_MESSAGE (RocketMQ's SendMessageProcessor).

The producer's properties string is stored as it came, with the broker's CLUSTER property
added, as RocketMQ does; a batch body goes to the store's native batch encoder untouched. The
store's status becomes the response code in docs/remoting.md, 'Send': the four "stored"
statuses carry msgId, queueId and queueOffset (and MSG_REGION, TRACE_ON), the others an error
remark.

What this broker does not do yet — transactional half messages, delayed delivery — is refused
with a response that says so, never stored as if it were a plain message.

The topic is checked first, as RocketMQ's ``msgCheck`` does: a name outside RocketMQ's charset
or length is SYSTEM_ERROR with ``validateTopic``'s remark, and the topics only the broker
itself writes (SCHEDULE_TOPIC_XXXX, the transaction topics, SELF_TEST_TOPIC,
OFFSET_MOVED_EVENT) are NO_PERMISSION, "Sending message to topic[...] is forbidden." The broker
writes them through its store, never through this processor.
"""

from __future__ import annotations

import random

from ..remoting import RemotingConnection
from ..store.results import PutMessageResult, PutMessageStatus
from ..wire import record as rec
from ..wire.permission import Permission
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode, send_message_header
from .broker import Broker
from .metadata import NOT_ALLOWED_SEND_TOPICS, topic_problem

STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
}

REMARKS = {
    PutMessageStatus.CREATE_MAPEDFILE_FAILED:
        "create mapped file failed, server is busy or broken.",
    PutMessageStatus.OS_PAGECACHE_BUSY:
        "[PC_SYNCHRONIZED]broker busy, start flow control for a while",
}

PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_DELAY = "DELAY"
#: what a stored message's response carries in MSG_REGION and TRACE_ON: RocketMQ's defaults of
#: ``regionId`` and ``traceOn``
PROPERTY_MSG_REGION = "MSG_REGION"
PROPERTY_TRACE_SWITCH = "TRACE_ON"
DEFAULT_REGION_ID = "DefaultRegion"
TRACE_ON = "true"


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
) -> RemotingCommand:
    header = send_message_header(request)
    config = broker.config
    if not config.broker_permission & Permission.WRITE:
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
        topic_config = broker.auto_create_topic(header)
        if topic_config is None:
            return RemotingCommand.response_to(
                request, ResponseCode.TOPIC_NOT_EXIST,
                remark=f"topic[{header.topic}] not exist, apply first please!",
            )
        await broker.persist_topics()
    queue_id = header.queue_id
    if queue_id < 0:
        queue_id = random.randrange(topic_config.write_queue_nums)
    elif queue_id >= topic_config.write_queue_nums:
        return RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR,
            remark=f"request queueId[{queue_id}] is illegal, {topic_config} Producer: "
                   f"{connection.peer}",
        )
    tx_type = header.sys_flag & rec.TRANSACTION_TYPE_MASK
    if tx_type != rec.TRANSACTION_NOT_TYPE:  # prepared, commit or rollback
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark="transactional messages are not supported by this broker (trio_ha) yet",
        )
    properties = rec.decode_properties(header.properties or "")
    if properties.get(PROPERTY_DELAY, "0") not in ("", "0"):
        return RemotingCommand.response_to(
            request, ResponseCode.MESSAGE_ILLEGAL,
            remark="delayed messages (DELAY property) are not supported by this broker "
                   "(trio_ha) yet",
        )
    wait = properties.get(rec.PROPERTY_WAIT_STORE_MSG_OK) != "false"
    properties[PROPERTY_CLUSTER] = config.broker_cluster_name
    batch = request.code == RequestCode.SEND_BATCH_MESSAGE or header.batch
    if batch:
        # A batch's own properties are appended to each of its messages, where a later key
        # wins over the message's own. RocketMQ 5 clients give the batch a UNIQ_KEY of its
        # own, so RocketMQ 5 brokers store every message of a batch under the batch's id:
        # consumers see one msgId for the whole batch (a consumer that deduplicates by it
        # drops all but one) and it matches none of the ids the producer was given. Each
        # message keeps its own id here.
        properties.pop(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX, None)
    encoded = rec.encode_properties(properties).encode()
    store = broker.store
    if batch:
        result = await store.put_batch(
            header.topic, queue_id, request.body, batch_properties=encoded,
            sys_flag=header.sys_flag, born_host=connection.peer,
            born_timestamp=header.born_timestamp, wait_store_msg_ok=wait,
        )
    else:
        result = await store.put_encoded(
            header.topic, queue_id, request.body, encoded, flag=header.flag,
            sys_flag=header.sys_flag, born_timestamp=header.born_timestamp,
            born_host=connection.peer, reconsume_times=header.reconsume_times or 0,
            wait_store_msg_ok=wait,
        )
    broker.stats.record_put(result)
    return send_response(request, result, queue_id)
