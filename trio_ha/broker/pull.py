"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + PullRequestHoldService).

A pull that finds nothing new (PULL_NOT_FOUND) and carries the SUSPEND flag is held: it waits
on its queue's arrival watermark, which the dispatcher raises as soon as a message is indexed,
for at most suspendTimeoutMillis (or shortPollingTimeMills without long polling), then reads
again and answers. RocketMQ parks such requests in a table scanned every 5 s and woken by the
reput thread; here the waiting pull is just a task (the remoting server runs every request in
its own), so many held pulls share one connection without blocking anything else.

Statuses map to response codes as docs/remoting.md, 'Pull' lists, with the slave's rules: a slave
does not correct offsets (offsetCheckInSlave is off) and suggests the master (broker id 0).
The response body is the raw records, unchanged, as RocketMQ clients decode them: views of
the mapped commitlog (a ``MappedReply``), which the connection's writer hands to ``sendmsg``
as they are — no copy of a record's bytes is made on the way out.

A pull names its consumer group: a name outside RocketMQ's charset is SYSTEM_ERROR, and a group
the broker does not have and may not create (autoCreateSubscriptionGroup off, or
maxSubscriptionGroupNums reached) is SUBSCRIPTION_GROUP_NOT_EXIST, as RocketMQ answers.
"""

from __future__ import annotations

import os

import trio

from ..remoting import RemotingConnection
from ..store.results import GetMessageStatus
from ..wire import layout
from ..wire import record as rec
from ..wire.permission import readable
from ..wire.remoting import (
    MappedReply,
    PullMessageRequestHeader,
    RemotingCommand,
    ResponseCode,
    pull_message_header,
)
from .broker import Broker
from .metadata import MetadataLimitError, group_problem

#: ``MixAll.MASTER_ID``: the broker id a pull response suggests to read from the master
MASTER_ID = 0
#: ``whichBrokerWhenConsumeSlowly``'s default: the slave a lagging consumer is sent to
SLOW_CONSUMER_BROKER_ID = 1
#: assumed when the machine does not say how much memory it has
FALLBACK_TOTAL_MEMORY = 8 * 1024**3


def _total_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return FALLBACK_TOTAL_MEMORY


TOTAL_MEMORY = _total_memory()


def parse_subscription(
    expression: str | None,
) -> tuple[frozenset[int] | None, frozenset[str] | None]:
    """A TAG expression ("*", "" or "a || b") as tag hash codes and tags (None: everything)."""
    if expression is None:
        return None, None
    tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
    if not tags or "*" in tags:
        return None, None
    return frozenset(rec.java_string_hash(t) for t in tags), tags


def _record_tags(record: bytes | memoryview) -> str | None:
    """TAGS of a raw record, without decoding the body."""
    return rec.decode_properties(layout.properties_slice(record)).get(rec.PROPERTY_TAGS)


async def process_pull(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand | MappedReply:
    header = pull_message_header(request)
    config = broker.config
    if not readable(config.broker_permission):
        return RemotingCommand.response_to(
            request, ResponseCode.NO_PERMISSION,
            remark=f"the broker[{config.broker_name}] pulling message is forbidden",
        )
    topic_config = broker.metadata.topics.get(header.topic)
    read_queues = topic_config.read_queue_nums if topic_config is not None else 0
    if topic_config is None and broker.is_slave:
        # A slave holds replicated queues before (or without) the master's topic config —
        # the master may have died before the next metadata sync: serve what it has.
        read_queues = 1 + max((q for t, q in broker.store.queues.queues if t == header.topic),
                              default=-1)
    if read_queues == 0:
        return RemotingCommand.response_to(
            request, ResponseCode.TOPIC_NOT_EXIST,
            remark=f"topic[{header.topic}] not exist, apply first please!",
        )
    if not 0 <= header.queue_id < read_queues:
        return RemotingCommand.response_to(
            request, ResponseCode.SYSTEM_ERROR,
            remark=f"queueId[{header.queue_id}] is illegal, topic:[{header.topic}] "
                   f"topicConfig.readQueueNums:[{read_queues}]",
        )
    problem = group_problem(header.consumer_group)
    if problem is not None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR, remark=problem)
    subscriptions = broker.metadata.subscriptions
    # A pull creates its group on demand within the same bound per connection as a
    # heartbeat does, or a client refused at heartbeat would get its groups by pulling.
    if subscriptions.find_or_create(header.consumer_group, creator=connection) is None:
        return RemotingCommand.response_to(
            request, ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
            remark=f"subscription group [{header.consumer_group}] does not exist, "
                   f"{subscriptions.why_not_created(connection)}",
        )
    if header.has_subscription:
        codes, tags = parse_subscription(header.subscription)
    else:
        registered = broker.clients.subscription(header.consumer_group, header.topic)
        codes, tags = parse_subscription(registered.sub_string if registered else None)

    response = _pull_once(broker, request, header, codes, tags)
    # The offset the pull carries is committed now, as it is read, never after a hold: while
    # the pull is held the consumer may commit a later offset (UPDATE_CONSUMER_OFFSET, as it
    # does every 5 s and as it shuts down), which a commit at the hold's end would take back.
    # RocketMQ commits it in the first pass too (PullMessageProcessor: only when the broker
    # may still suspend the pull).
    if (
        header.has_commit_offset
        and not broker.is_slave
        and header.commit_offset >= 0
    ):
        try:
            broker.metadata.offsets.commit(
                header.consumer_group, header.topic, header.queue_id, header.commit_offset
            )
        except MetadataLimitError:
            pass  # the table is full (and said so in the log); the pull's answer stands
    if (
        isinstance(response, RemotingCommand)
        and response.code == ResponseCode.PULL_NOT_FOUND
        and header.has_suspend
        and header.suspend_timeout_millis > 0
    ):
        wait = (header.suspend_timeout_millis if config.long_polling_enable
                else config.short_polling_time_mills) / 1000
        arrivals = broker.store.queue_arrivals(header.topic, header.queue_id)
        # Held on the connection: the wait ends early when it closes or the server drains it
        # (the pull then answers as after a timeout).
        with connection.holding(wait):
            await arrivals.wait_for(header.queue_offset + 1)
        if connection.closed:
            return response  # its consumer has gone: nobody reads a second look
        # Many held pulls may wake at once: each waits for room under the connection's reply
        # bound before reading, and nothing after this checkpoints before the reply is queued.
        await connection.wait_reply_room()
        response = _pull_once(broker, request, header, codes, tags)
    else:
        await trio.lowlevel.checkpoint()
    return response


def _pull_once(
    broker: Broker,
    request: RemotingCommand,
    header: PullMessageRequestHeader,
    codes: frozenset[int] | None,
    tags: frozenset[str] | None,
) -> RemotingCommand | MappedReply:
    config = broker.config
    store = broker.store
    result = store.read_queue(
        header.topic, header.queue_id, header.queue_offset,
        min(header.max_msg_nums, config.max_transfer_count_on_message_in_memory),
        max_bytes=config.max_transfer_bytes_on_message_in_memory, tag_codes=codes, raw=True,
    )
    records = result.spans
    if tags is not None and records:
        records = tuple(r for r in result.records if _record_tags(r) in tags)
    status = result.status
    next_offset = result.next_begin_offset
    if status is GetMessageStatus.FOUND and not records:
        status = GetMessageStatus.NO_MATCHED_MESSAGE  # only hash collisions were found
    found = status is GetMessageStatus.FOUND
    broker.stats.record_get((len(records) if tags is not None else len(result.records))
                            if found else 0)

    # Suggest the slave when the consumer has fallen far behind (RocketMQ: more than 40% of
    # RAM between its position and the log end), if the group reads from slaves at all.
    suggest = MASTER_ID
    if result.last_commitlog_offset >= 0 and config.slave_read_enable:
        behind = store.max_commitlog_offset - result.last_commitlog_offset
        if behind > TOTAL_MEMORY * config.access_message_in_memory_max_ratio / 100:
            group = broker.metadata.subscriptions.find_or_create(header.consumer_group)
            suggest = (group.which_broker_when_consume_slowly if group is not None
                       else SLOW_CONSUMER_BROKER_ID)

    code = {
        GetMessageStatus.FOUND: ResponseCode.SUCCESS,
        GetMessageStatus.NO_MATCHED_MESSAGE: ResponseCode.PULL_RETRY_IMMEDIATELY,
        GetMessageStatus.MESSAGE_WAS_REMOVING: ResponseCode.PULL_RETRY_IMMEDIATELY,
        GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
        GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
        GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
        GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    }.get(status)
    if code is None:  # NO_MESSAGE_IN_QUEUE, NO_MATCHED_LOGIC_QUEUE
        code = (ResponseCode.PULL_OFFSET_MOVED if header.queue_offset != 0
                else ResponseCode.PULL_NOT_FOUND)
    if broker.is_slave and code == ResponseCode.PULL_OFFSET_MOVED:
        # A slave does not correct offsets (offsetCheckInSlave=false): retry at the master.
        code = ResponseCode.PULL_RETRY_IMMEDIATELY
        next_offset = header.queue_offset
        suggest = MASTER_ID
    response = RemotingCommand.response_to(
        request, code, remark=status.name,
        ext_fields={
            "suggestWhichBrokerId": suggest, "nextBeginOffset": next_offset,
            "minOffset": result.min_offset, "maxOffset": result.max_offset,
        },
    )
    return MappedReply(response, records) if code == ResponseCode.SUCCESS else response
