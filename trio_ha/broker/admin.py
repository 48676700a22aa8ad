"""The broker's other requests: clients and groups, offsets, queries, topics, runtime info.

Each handler takes the broker and the request and returns the response (RocketMQ's
ClientManageProcessor, ConsumerManageProcessor, QueryMessageProcessor and AdminBrokerProcessor,
for the requests this broker supports). Requests it does not support get a response naming
what is missing.

Names and numbers from the client are checked before they reach a table; what a table refuses
is answered with RocketMQ's code and a one-line remark (``MetadataRequestError``), never a
traceback. Three requests follow RocketMQ 4.9's AdminBrokerProcessor in what they refuse: a
slave changes no topic or subscription group ("please execute it from master broker"), and
no client creates or changes a system topic ("The topic[...] is conflict with system topic.");
the broker makes those itself at startup. Offset commits follow RocketMQ 5's
ConsumerManageProcessor: the group must exist (or be created on demand, as a pull would
create it) and the topic too, so consumerOffset.json only names what the broker has.

Two admin requests change the broker itself. UPDATE_BROKER_CONFIG changes only the keys whose
new value the broker uses at once (``RUNTIME_CONFIG_KEYS``) and refuses the whole request,
naming the keys, when it holds any other: RocketMQ sets any field by reflection and answers
SUCCESS whether or not anything reads it again. The change is in memory (GET_BROKER_CONFIG
shows it); the broker does not know which file it was started from, so a restart reads
broker.conf as it was. DELETE_TOPIC_IN_BROKER removes the topic's config, its consume queues
and every group's offsets of it (RocketMQ 4.9.8 keeps the offsets; 5.x removes them too).

Why one module at about 800 lines: it is the broker's table of small handlers (about forty,
each a request's checks around one table or store call), sharing the answer helpers at its
top (``ok``, ``error``, ``refused_on_slave``); its sections follow RocketMQ's processors, and
a handler is found by its request's name.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import time
import typing
from collections.abc import Callable

import attrs
import trio

from ..config import ConfigError, StoreConfig, parse_properties_text, parse_value
from ..remoting import RemotingConnection
from ..store import MessageStore
from ..wire import layout
from ..wire.errors import MetadataDecodeError, RouteDecodeError
from ..wire.fastjson import read_json, write_json
from ..wire.heartbeat import HeartbeatData
from ..wire.metadata import (
    RETRY_GROUP_TOPIC_PREFIX,
    DataVersion,
    SubscriptionGroupConfig,
    TopicConfig,
    decode_subscription_groups,
    encode_consumer_offsets,
    encode_delay_offsets,
    encode_subscription_groups,
    encode_topics_json,
)
from ..wire.permission import Permission
from ..wire.queue_locks import LockBatchRequest, LockBatchResponse
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.remoting.java import abbreviate
from ..wire.route import KVTable
from . import controller_mode
from .broker import Broker
from .config import BrokerConfig
from .config_keys import ROCKETMQ_KEYS
from .metadata import MetadataRequestError, group_problem, topic_problem
from .pull import TOTAL_MEMORY

log = logging.getLogger(__name__)


def _our_version() -> str:
    # From the installed distribution, not ``trio_ha.__version__``: importing the package
    # root would make the broker depend on everything the root exports.
    try:
        return importlib.metadata.version("trio-ha")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - run from a bare tree
        return "unknown"


#: what GET_BROKER_RUNTIME_INFO says this broker is
BROKER_VERSION_DESC = f"trio_ha {_our_version()}"
#: ``MQVersion.CURRENT_VERSION``, as GET_BROKER_RUNTIME_INFO reports it
BROKER_VERSION_CODE = "409"

#: an admin request's processor: synchronous, it answers from memory
AdminHandler = Callable[[Broker, RemotingCommand, RemotingConnection], RemotingCommand]

#: requests RocketMQ serves and this broker does not (yet): what is missing, for the remark
UNSUPPORTED: dict[int, str] = {
    RequestCode.SEND_REPLY_MESSAGE: "request/reply messages",
    RequestCode.SEND_REPLY_MESSAGE_V2: "request/reply messages",
}


def _text(encoded: str | bytes) -> bytes:
    return encoded.encode() if isinstance(encoded, str) else encoded


def ok(request: RemotingCommand, **kwargs) -> RemotingCommand:
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, **kwargs)


def error(request: RemotingCommand, remark: str,
          code: int = ResponseCode.SYSTEM_ERROR) -> RemotingCommand:
    return RemotingCommand.response_to(request, code, remark=remark)


def refused_on_slave(broker: Broker, request: RemotingCommand) -> RemotingCommand | None:
    """RocketMQ's ``validateSlave``: a slave's topics and groups are its master's copies."""
    if not broker.is_slave:
        return None
    return error(request, "Can't modify topic or subscription group from slave broker, "
                          "please execute it from master broker.")


def unsupported(request: RemotingCommand) -> RemotingCommand | None:
    feature = UNSUPPORTED.get(request.code)
    if feature is None:
        return None
    return RemotingCommand.response_to(
        request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
        remark=f"{feature} (request code {request.code}) is not supported by this broker "
               "(trio_ha) yet",
    )


# ---- clients ---------------------------------------------------------------------------------


def heart_beat(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    try:
        data = HeartbeatData.decode(request.body)
    except RouteDecodeError as exc:
        return error(request, f"bad heartbeat body: {exc}")
    groups = [c.group_name for c in data.consumer_data_set]
    groups += [p.group_name for p in data.producer_data_set]
    for group in groups:
        problem = group_problem(group)
        if problem is not None:
            return error(request, f"bad heartbeat body: {problem}")
    # As RocketMQ: a consumer's group is created on demand when autoCreateSubscriptionGroup
    # allows it (and, here, within the on-demand bounds: in all, and per connection). Only
    # consumers of groups the broker has are registered: a pull of any other group is refused
    # anyway. The heartbeat answers SUCCESS whatever was refused, as RocketMQ's does: a client
    # whose heartbeat fails logs it every 30 s and its groups that exist would gain nothing.
    subscriptions = broker.metadata.subscriptions
    consumers = tuple(c for c in data.consumer_data_set
                      if subscriptions.find_or_create(c.group_name, creator=connection)
                      is not None)
    refused = len(data.consumer_data_set) - len(consumers)
    if refused and subscriptions.auto_create:
        subscriptions.log_refusal(f"a heartbeat of {data.client_id} from {connection.peer}",
                                  refused, connection)
    if not broker.is_slave:
        _create_retry_topics(broker, [c.group_name for c in consumers])
    broker.clients.heartbeat(attrs.evolve(data, consumer_data_set=consumers), connection,
                             trio.current_time(), language=request.language.name,
                             version=request.version)
    return ok(request)


def _create_retry_topics(broker: Broker, groups: list[str]) -> None:
    """Each consumer group gets its retry topic ``%RETRY%<group>`` (retryQueueNums queues,
    read-write) at its first heartbeat, as RocketMQ's ClientManageProcessor does: Java push
    consumers subscribe to it, and mqadmin consumerProgress looks up its route first.
    Consumer send-back (``send.process_send_back``) fills it."""
    topics = broker.metadata.topics
    created = False
    for group in groups:
        retry = RETRY_GROUP_TOPIC_PREFIX + group
        if topics.get(retry) is not None:
            continue
        config = broker.metadata.subscriptions.find_or_create(group)
        queues = config.retry_queue_nums if config is not None else 1
        if queues > 0 and topic_problem(retry) is None:
            topics.create_topic_in_send_back(retry, queues)
            created = True
    if created:
        broker.topics_changed()


def unregister_client(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    broker.clients.unregister(
        request.field_str("clientID"),
        producer_group=request.field_str("producerGroup", None),
        consumer_group=request.field_str("consumerGroup", None),
    )
    return ok(request)


def consumer_list(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    group = request.field_str("consumerGroup")
    ids = broker.clients.consumer_ids(group)
    if not ids:
        return error(request, f"no consumer for this group, {abbreviate(group)}")
    return ok(request, body=json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode())


def check_client_config(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    return ok(request)


# ---- offsets ------------------------------------------------------------------------------------


def query_consumer_offset(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    group = request.field_str("consumerGroup")
    topic = request.field_str("topic")
    queue_id = request.field_int("queueId")
    offset = broker.metadata.offsets.query(group, topic, queue_id)
    if offset is not None:
        return ok(request, ext_fields={"offset": offset})
    # RocketMQ: a group with no committed offset starts at 0 if the queue still holds its
    # first message in memory; otherwise the client decides (QUERY_NOT_FOUND).
    store = broker.store
    if store.min_queue_offset(topic, queue_id) <= 0 and _first_message_in_memory(
        broker, topic, queue_id
    ):
        return ok(request, ext_fields={"offset": 0})
    return RemotingCommand.response_to(
        request, ResponseCode.QUERY_NOT_FOUND,
        remark="Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
    )


def _first_message_in_memory(broker: Broker, topic: str, queue_id: int) -> bool:
    store = broker.store
    queue = store.queues.get(topic, queue_id)
    entry = queue.entry(0) if queue is not None else None
    if entry is None:
        return True  # nothing there yet: start from the beginning
    behind = store.max_commitlog_offset - entry.commitlog_offset
    return behind <= TOTAL_MEMORY * broker.config.access_message_in_memory_max_ratio / 100


def update_consumer_offset(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    group = request.field_str("consumerGroup")
    topic = request.field_str("topic")
    queue_id = request.field_int("queueId")
    offset = request.field_long("commitOffset")
    problem = group_problem(group) or topic_problem(topic)
    if problem is not None:
        return error(request, problem)
    if broker.metadata.subscriptions.find_or_create(group) is None:
        return error(request, f"Group {group} not exist!",
                     ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST)
    queues = broker.queue_nums(topic)
    if queues == 0:
        return error(request, f"Topic {topic} not exist!", ResponseCode.TOPIC_NOT_EXIST)
    if not 0 <= queue_id < queues:
        return error(request, f"queueId[{queue_id}] is illegal, topic:[{topic}] "
                              f"queueNums:[{queues}]")
    if offset < 0:
        return error(request, f"commitOffset[{offset}] is illegal, it must not be negative")
    # On a slave, kept apart too: the slave hands it to its master when it is there again.
    commit = (broker.metadata.offsets.commit_on_slave if broker.is_slave
              else broker.metadata.offsets.commit)
    try:
        commit(group, topic, queue_id, offset)
    except MetadataRequestError as exc:
        return error(request, str(exc))
    return ok(request)


def max_offset(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    offset = broker.store.max_queue_offset(request.field_str("topic"), request.field_int("queueId"))
    return ok(request, ext_fields={"offset": offset})


def min_offset(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    offset = broker.store.min_queue_offset(request.field_str("topic"), request.field_int("queueId"))
    return ok(request, ext_fields={"offset": offset})


def search_offset(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    offset = broker.store.get_offset_in_queue_by_time(
        request.field_str("topic"), request.field_int("queueId"), request.field_long("timestamp")
    )
    return ok(request, ext_fields={"offset": offset})


def earliest_store_time(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    stamp = broker.store.get_earliest_message_time(request.field_str("topic"),
                                                   request.field_int("queueId"))
    return ok(request, ext_fields={"timestamp": stamp if stamp is not None else -1})


def view_message_by_id(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    offset = request.field_long("offset")
    record = broker.store.record_bytes(offset)
    if record is None:
        return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                           remark=f"can not find message by the offset, {offset}")
    return ok(request, body=record)


# ---- topics, groups, config --------------------------------------------------------------------


def _topic_change_refused(broker: Broker, request: RemotingCommand,
                          topic: str) -> RemotingCommand | None:
    """Why a client may not create, change or delete ``topic`` here (RocketMQ's answers: a
    slave changes no topic, a bad name, a system topic), or None."""
    refused = refused_on_slave(broker, request)
    if refused is not None:
        return refused
    problem = topic_problem(topic)
    if problem is not None:
        return error(request, problem)
    if broker.metadata.topics.is_system_topic(topic):
        return error(request, f"The topic[{topic}] is conflict with system topic.")
    return None


def update_and_create_topic(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    topic = request.field_str("topic")
    refused = _topic_change_refused(broker, request, topic)
    if refused is not None:
        return refused
    try:
        config = TopicConfig(
            topic_name=topic,
            read_queue_nums=request.field_int("readQueueNums"),
            write_queue_nums=request.field_int("writeQueueNums"),
            perm=request.field_int("perm", Permission.READ | Permission.WRITE),
            topic_filter_type=request.field_str("topicFilterType", "SINGLE_TAG"),
            topic_sys_flag=request.field_int("topicSysFlag", 0),
            order=request.field_bool("order", False),
        )
        broker.metadata.topics.create_or_update(config)
    except MetadataRequestError as exc:
        return error(request, str(exc))
    broker.topics_changed()
    return ok(request)


def all_topic_config(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    wrapper = broker.metadata.topics.wrapper()
    return ok(request, body=_text(encode_topics_json(wrapper, pretty=False)))


def topic_config(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_TOPIC_CONFIG (RocketMQ 5's admin, e.g. mqadmin topicStatus): one topic's config as
    a TopicConfigAndQueueMapping. This broker has no static topics, so no ``mappingDetail``
    (fastjson omits the null): the admin then treats the topic as an ordinary one."""
    topic = request.field_str("topic")
    config = broker.metadata.topics.get(topic)
    if config is None:
        return error(request, f"No topic in this broker. topic: {topic}",
                     ResponseCode.TOPIC_NOT_EXIST)
    return ok(request, body=write_json(config.to_json_obj()).encode())


def all_consumer_offsets(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    table = broker.metadata.offsets.table()
    if table.data_version is None:
        # A RocketMQ 5 slave reads the body's dataVersion unconditionally (it stopped its
        # offset sync with a NullPointerException on our 4.9-style body); 4.9 slaves ignore it.
        table = attrs.evolve(table, data_version=DataVersion(0, int(time.time() * 1000)))
    return ok(request, body=_text(encode_consumer_offsets(table, pretty=False)))


def all_message_request_modes(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_ALL_MESSAGE_REQUEST_MODE (a RocketMQ 5 slave's metadata sync asks for it): the
    groups switched to pop consumption — none, as this broker has no pop mode."""
    return ok(request, body=b'{"messageRequestModeMap":{}}')


def all_delay_offsets(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    table = broker.metadata.delay_offsets.table()
    return ok(request, body=_text(encode_delay_offsets(table, pretty=False)))


def all_subscription_groups(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    wrapper = broker.metadata.subscriptions.wrapper()
    return ok(request, body=_text(encode_subscription_groups(wrapper, pretty=False)))


def update_subscription_group(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    refused = refused_on_slave(broker, request)
    if refused is not None:
        return refused
    try:
        # read_json, as HEART_BEAT reads its body: a deeply nested document is "not valid
        # JSON", not a RecursionError and a traceback
        obj = read_json(request.body, error=MetadataDecodeError, what="subscription group")
        if not isinstance(obj, dict):
            raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
        wrapped = decode_subscription_groups(
            json.dumps({"subscriptionGroupTable": {obj["groupName"]: obj}})
        )
        (config,) = wrapped.subscription_group_table.values()
    except (ValueError, KeyError, TypeError, RecursionError, MetadataDecodeError) as exc:
        return error(request, f"bad subscription group body: {exc}")
    assert isinstance(config, SubscriptionGroupConfig)
    try:
        broker.metadata.subscriptions.update(config)
    except MetadataRequestError as exc:
        return error(request, str(exc))
    return ok(request)


def runtime_info(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    store = broker.store
    stats = store.statistics()
    table = {
        "brokerVersionDesc": BROKER_VERSION_DESC,
        "brokerVersion": BROKER_VERSION_CODE,
        "brokerRole": store.role.value,
        "commitLogMinOffset": stats.min_commitlog_offset,
        "commitLogMaxOffset": stats.max_commitlog_offset,
        "commitLogFlushedOffset": stats.flushed_offset,
        "dispatchBehindBytes": stats.dispatch_behind_bytes,
        "remainHowManyDataToFlush": max(0, stats.max_commitlog_offset - stats.flushed_offset),
        "msgPutTotalTodayNow": broker.stats.puts,
        # messages served by pulls, as RocketMQ counts them
        "msgGetTotalTodayNow": broker.stats.transferred.total,
        # StoreStatsService's rates, each "<10 s> <60 s> <600 s>" (mqadmin clusterList shows
        # the first of putTps and getTransferedTps)
        "putTps": broker.stats.stored.rates_text(),
        "getFoundTps": broker.stats.gets_found.rates_text(),
        "getMissTps": broker.stats.gets_missed.rates_text(),
        "getTotalTps": broker.stats.total_get_rates_text(),
        "getTransferedTps": broker.stats.transferred.rates_text(),
        "putMessageFailedTimes": broker.stats.put_failures,
        # What mqadmin clusterList prints besides (it fails on a missing key). We have no
        # send or pull thread-pool queue and no commitlog put lock to wait on: zeros, true.
        "sendThreadPoolQueueSize": 0,
        "sendThreadPoolQueueHeadWaitTimeMills": 0,
        "pullThreadPoolQueueSize": 0,
        "pullThreadPoolQueueHeadWaitTimeMills": 0,
        "pageCacheLockTimeMills": 0,
        "msgPutTotalTodayMorning": 0,
        "msgGetTotalTodayMorning": 0,
        "msgPutTotalYesterdayMorning": 0,
        "msgGetTotalYesterdayMorning": 0,
        "earliestMessageTimeStamp": broker.earliest_message_time(),
        "runtime": f"{int(time.time() - broker.started_at)} s",
        "recoveryAbnormal": stats.recovery.abnormal if stats.recovery else False,
    }
    if not broker.is_slave:
        # RocketMQ's scheduleMessageOffset_<level>: "delivered up to,queue's max offset"
        for level, (offset, end) in broker.schedule.statistics().levels.items():
            table[f"scheduleMessageOffset_{level}"] = f"{offset},{end}"
    health = stats.health
    if health is not None:
        # RocketMQ's RunningStats names, as fractions; and what keeps the store from taking
        # (some) puts, if anything
        table["commitLogDiskRatio"] = f"{health.disk.commitlog:.4f}"
        table["consumeQueueDiskRatio"] = f"{health.disk.consume_queues:.4f}"
        trouble = health.disk_full or health.dispatch_stalled or health.allocation_error
        if trouble:
            table["storeTrouble"] = trouble
    if stats.ha is not None:
        for i, c in enumerate(stats.ha.connections):
            table[f"slave{i}Address"] = c.address
            table[f"slave{i}AckedOffset"] = c.acked_offset if c.acked_offset is not None else -1
            table[f"slave{i}LagBytes"] = c.lag_bytes
            table[f"slave{i}FramesSent"] = c.frames_sent
            table[f"slave{i}FramesPushed"] = c.frames_pushed
    if stats.ha_slave is not None:
        table["haMasterAddress"] = stats.ha_slave.master_address or ""
        table["haState"] = stats.ha_slave.state
        table["haDivergence"] = stats.ha_slave.divergence or ""
    return ok(request, body=KVTable({k: str(v) for k, v in table.items()}).encode())


def broker_config(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_BROKER_CONFIG: every setting as ``key=value`` lines (RocketMQ's keys), and the
    topic table's DataVersion in ``version``, as RocketMQ answers."""
    text = "".join(f"{key}={value}\n" for key, value in broker.config.to_properties().items())
    version = broker.metadata.topics.wrapper().data_version
    return ok(request, body=text.encode(),
              ext_fields={"version": write_json(version.to_json_obj())})


#: what UPDATE_BROKER_CONFIG may change: the keys whose new value the broker uses from the next
#: request on (read per request, or handed to the tables it changes here)
RUNTIME_CONFIG_KEYS = frozenset({
    "brokerPermission", "autoCreateTopicEnable", "autoCreateSubscriptionGroup",
    "longPollingEnable", "shortPollingTimeMills", "slaveReadEnable",
    "accessMessageInMemoryMaxRatio", "maxTransferCountOnMessageInMemory",
    "maxTransferBytesOnMessageInMemory", "rejectTransactionMessage",
    "registerBrokerTimeoutMills",
})
#: never changed by a request (RocketMQ's configBlackList): NO_PERMISSION
CONFIG_BLACK_LIST = frozenset({"brokerConfigPath", "rocketmqHome", "configBlackList"})


def update_broker_config(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """UPDATE_BROKER_CONFIG (mqadmin updateBrokerConfig): the body is properties text. All or
    nothing: a key on the black list is NO_PERMISSION (RocketMQ's answer); a key that cannot
    change while the broker runs, one it does not know, or a bad value is SYSTEM_ERROR naming
    them, and nothing changes."""
    try:
        properties = parse_properties_text(request.body.decode("utf-8"))
    except (UnicodeDecodeError, ConfigError) as exc:
        return error(request, f"string2Properties error: {exc}")
    if not CONFIG_BLACK_LIST.isdisjoint(properties):
        return error(request, "Can not update config in black list.", ResponseCode.NO_PERMISSION)
    fields = BrokerConfig.property_fields()
    ours = fields.keys() | StoreConfig.property_keys()
    fixed = sorted(k for k in properties if k in ours and k not in RUNTIME_CONFIG_KEYS)
    meaningless = sorted(k for k in properties if k in ROCKETMQ_KEYS and k not in ours)
    unknown = sorted(k for k in properties if k not in ours and k not in ROCKETMQ_KEYS)
    if fixed or meaningless or unknown:
        parts = []
        if fixed:
            parts.append(f"cannot change while the broker runs (set in broker.conf and "
                         f"restart): {', '.join(fixed)}")
        if meaningless:
            parts.append(f"RocketMQ keys this broker has no use for: {', '.join(meaningless)}")
        if unknown:
            parts.append(f"unknown keys: {', '.join(unknown)}")
        return error(request, "broker config not updated: " + "; ".join(parts))
    hints = typing.get_type_hints(BrokerConfig)
    config = broker.config
    for key, raw in properties.items():
        field = fields[key]
        try:
            config = attrs.evolve(config, **{field: parse_value(key, hints[field], raw)})
        except ConfigError as exc:  # the validators name the field; the operator knows the key
            return error(request, f"broker config not updated: {key}={raw!r}: "
                                  f"{str(exc).replace(field, key)}")
    _apply_config(broker, config)
    log.info("broker: configuration updated by %s: %s", connection.peer, properties)
    return ok(request)


def _apply_config(broker: Broker, config: BrokerConfig) -> None:
    """Make ``config`` the broker's: the processors read it per request; the tables and the
    registration that keep a copy of a setting get the new one."""
    broker.config = config
    broker.registration.config = config
    topics = broker.metadata.topics
    topics.auto_create = config.auto_create_topic_enable
    broker.metadata.subscriptions.auto_create = config.auto_create_subscription_group
    if topics.set_broker_permission(config.broker_permission):
        # the name servers take every topic again, with the new permission, now
        broker.topics_changed()


def delete_topic(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """DELETE_TOPIC_IN_BROKER (mqadmin deleteTopic, before the name servers): the topic's
    config, consume queues and consumer offsets. SUCCESS also for a topic the broker does not
    have, as RocketMQ; refused on a slave and for system topics."""
    topic = request.field_str("topic")
    refused = _topic_change_refused(broker, request, topic)
    if refused is not None:
        return refused
    existed = broker.metadata.topics.delete(topic)
    groups = broker.metadata.offsets.remove_topic(topic)
    queues = remove_consume_queues(broker.store, topic)
    if existed:
        broker.topics_changed()
    log.info("broker: topic %s deleted by %s (%s, %d consume queues, offsets of %d groups)",
             topic, connection.peer, "its config" if existed else "no config", queues, groups)
    return ok(request)


def remove_consume_queues(store: MessageStore, topic: str) -> int:
    """Delete ``topic``'s consume queues and their files (RocketMQ's ``cleanUnusedTopic``, for
    one topic); returns how many there were.

    Each file goes through ``Segment.destroy``, which waits for a consume-queue flush that
    holds it in a worker thread. The commitlog's next queue offsets are kept: a slave keeps its
    queues of the topic (deletes are not replicated), and messages sent to the topic again
    continue their numbering there instead of reusing offsets the slave has (RocketMQ starts
    again from 0). A record dispatched later (a send in flight) makes its queue again."""
    table = store.queues
    doomed = [queue for (name, _), queue in table.queues.items() if name == topic]
    for queue in doomed:
        del table.queues[(queue.topic, queue.queue_id)]
        for segment in queue.files.segments:
            segment.destroy()
        queue.files.segments.clear()
        shutil.rmtree(queue.files.directory, ignore_errors=True)
    if doomed:
        try:
            os.rmdir(os.path.dirname(doomed[0].files.directory))
        except OSError:
            pass  # not empty (a queue made again meanwhile), or already gone
    return len(doomed)


def _queue_json(topic: str, broker_name: str, queue_id: int) -> str:
    # A MessageQueue as fastjson writes a map key of that type: the object itself.
    return write_json({"brokerName": broker_name, "queueId": queue_id, "topic": topic})


def _store_time_at(broker: Broker, topic: str, queue_id: int, queue_offset: int) -> int:
    """STORETIMESTAMP of the message at ``queue_offset`` of the queue, or 0."""
    queue = broker.store.queues.get(topic, queue_id)
    entry = queue.entry(queue_offset) if queue is not None and queue_offset >= 0 else None
    record = broker.store.record_bytes(entry.commitlog_offset) if entry is not None else None
    return layout.read_store_timestamp(record) if record is not None else 0


def topic_stats(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_TOPIC_STATS_INFO (mqadmin topicStatus): each queue's min and max offset and the
    store time of its last message."""
    topic = request.field_str("topic")
    config = broker.metadata.topics.get(topic)
    if config is None:
        return error(request, f"topic[{topic}] not exist", ResponseCode.TOPIC_NOT_EXIST)
    store = broker.store
    name = broker.config.broker_name
    entries = []
    for queue_id in range(config.write_queue_nums):
        max_offset = max(0, store.max_queue_offset(topic, queue_id))
        stats = {"minOffset": max(0, store.min_queue_offset(topic, queue_id)),
                 "maxOffset": max_offset,
                 "lastUpdateTimestamp": _store_time_at(broker, topic, queue_id, max_offset - 1)}
        entries.append(f"{_queue_json(topic, name, queue_id)}:{write_json(stats)}")
    return ok(request, body=('{"offsetTable":{' + ",".join(entries) + "}}").encode())


def consume_stats(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_CONSUME_STATS (mqadmin consumerProgress): per queue of each topic the group has
    offsets for (or the one named), the broker's max offset, the group's offset and the store
    time of the last message it consumed."""
    group = request.field_str("consumerGroup")
    named = request.field_str("topic", "")
    offsets = broker.metadata.offsets.offsets_of_group(group)
    topics = [named] if named else sorted(offsets)
    store = broker.store
    name = broker.config.broker_name
    entries = []
    for topic in topics:
        config = broker.metadata.topics.get(topic)
        if config is None:
            continue
        committed = offsets.get(topic, {})
        for queue_id in range(config.write_queue_nums):
            consumer_offset = max(0, committed.get(queue_id, 0))
            stats = {
                "brokerOffset": max(0, store.max_queue_offset(topic, queue_id)),
                "consumerOffset": consumer_offset,
                "lastTimestamp": (_store_time_at(broker, topic, queue_id, consumer_offset - 1)
                                  if consumer_offset > 0 else 0),
            }
            entries.append(f"{_queue_json(topic, name, queue_id)}:{write_json(stats)}")
    body = '{"consumeTps":0.0,"offsetTable":{' + ",".join(entries) + "}}"
    return ok(request, body=body.encode())


def consumer_connections(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """GET_CONSUMER_CONNECTION_LIST (mqadmin consumerConnection, message track): the group's
    live clients and what they subscribe to; CONSUMER_NOT_ONLINE when it has none."""
    group = request.field_str("consumerGroup")
    info = broker.clients.consumers.get(group)
    if info is None or not info.channels:
        return error(request, f"the consumer group[{group}] not online",
                     ResponseCode.CONSUMER_NOT_ONLINE)
    body = {
        "connectionSet": [
            {"clientId": c.client_id, "clientAddr": c.connection.peer, "language": c.language,
             "version": c.version}
            for c in info.channels.values()],
        "subscriptionTable": {t: s.to_json_obj() for t, s in info.subscriptions.items()},
        "consumeType": info.consume_type,
        "messageModel": info.message_model,
        "consumeFromWhere": info.consume_from_where,
    }
    return ok(request, body=write_json(body).encode())


def topic_consumed_by(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """QUERY_TOPIC_CONSUME_BY_WHO (mqadmin's message track): the groups subscribed to the
    topic now, and those that have offsets for it."""
    topic = request.field_str("topic")
    groups = set(broker.clients.groups_subscribed_to(topic))
    groups.update(broker.metadata.offsets.groups_of_topic(topic))
    return ok(request, body=write_json({"groupList": sorted(groups)}).encode())


# ---- queries by key ---------------------------------------------------------------------------

#: the extField a client sets when it queries by its own message id (UNIQ_KEY)
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: how many messages such a query returns (RocketMQ's defaultQueryMaxNum)
DEFAULT_QUERY_MAX_NUM = 32


def query_message(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """QUERY_MESSAGE: the records of a topic with a key (a KEYS value or the client's
    UNIQ_KEY) stored in a time range, from the index files; QUERY_NOT_FOUND when none."""
    topic = request.field_str("topic")
    key = request.field_str("key")
    max_num = request.field_int("maxNum")
    begin = request.field_long("beginTimestamp")
    end = request.field_long("endTimestamp")
    if request.ext_fields.get(UNIQUE_MSG_QUERY_FLAG) == "true":
        max_num = DEFAULT_QUERY_MAX_NUM
    found = broker.store.query_message(topic, key, max(max_num, 0), begin, end)
    fields = {"indexLastUpdateTimestamp": found.index_last_update_timestamp,
              "indexLastUpdatePhyoffset": found.index_last_update_phy_offset}
    if not found.records:
        return RemotingCommand.response_to(
            request, ResponseCode.QUERY_NOT_FOUND,
            remark="can not find message, maybe time range not correct", ext_fields=fields,
        )
    return ok(request, ext_fields=fields, body=b"".join(found.records))


# ---- queue locks (orderly consumption) ---------------------------------------------------------


def lock_batch_mq(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """LOCK_BATCH_MQ: take or renew the client's locks; the answer names those it holds."""
    try:
        body = LockBatchRequest.decode(request.body)
    except RouteDecodeError as exc:
        return error(request, f"bad lock request body: {exc}")
    held = broker.queue_locks.lock(body.consumer_group, body.client_id, body.mq_set,
                                   owner=connection.peer)
    return ok(request, body=LockBatchResponse(tuple(held)).encode())


def unlock_batch_mq(
    broker: Broker, request: RemotingCommand, connection: RemotingConnection
) -> RemotingCommand:
    """UNLOCK_BATCH_MQ: give up the client's locks of these queues."""
    try:
        body = LockBatchRequest.decode(request.body)
    except RouteDecodeError as exc:
        return error(request, f"bad unlock request body: {exc}")
    broker.queue_locks.unlock(body.consumer_group, body.client_id, body.mq_set)
    return ok(request)


HANDLERS: dict[int, AdminHandler] = {
    RequestCode.QUERY_MESSAGE: query_message,
    RequestCode.LOCK_BATCH_MQ: lock_batch_mq,
    RequestCode.UNLOCK_BATCH_MQ: unlock_batch_mq,
    RequestCode.HEART_BEAT: heart_beat,
    RequestCode.UNREGISTER_CLIENT: unregister_client,
    RequestCode.CHECK_CLIENT_CONFIG: check_client_config,
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: consumer_list,
    RequestCode.QUERY_CONSUMER_OFFSET: query_consumer_offset,
    RequestCode.UPDATE_CONSUMER_OFFSET: update_consumer_offset,
    RequestCode.GET_MAX_OFFSET: max_offset,
    RequestCode.GET_MIN_OFFSET: min_offset,
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: search_offset,
    RequestCode.GET_EARLIEST_MSG_STORETIME: earliest_store_time,
    RequestCode.VIEW_MESSAGE_BY_ID: view_message_by_id,
    RequestCode.UPDATE_AND_CREATE_TOPIC: update_and_create_topic,
    RequestCode.GET_ALL_TOPIC_CONFIG: all_topic_config,
    RequestCode.GET_TOPIC_CONFIG: topic_config,
    RequestCode.GET_ALL_CONSUMER_OFFSET: all_consumer_offsets,
    RequestCode.GET_ALL_MESSAGE_REQUEST_MODE: all_message_request_modes,
    RequestCode.GET_ALL_DELAY_OFFSET: all_delay_offsets,
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: all_subscription_groups,
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: update_subscription_group,
    RequestCode.GET_BROKER_RUNTIME_INFO: runtime_info,
    RequestCode.GET_BROKER_CONFIG: broker_config,
    RequestCode.UPDATE_BROKER_CONFIG: update_broker_config,
    RequestCode.DELETE_TOPIC_IN_BROKER: delete_topic,
    RequestCode.GET_TOPIC_STATS_INFO: topic_stats,
    RequestCode.GET_CONSUME_STATS: consume_stats,
    RequestCode.QUERY_TOPIC_CONSUME_BY_WHO: topic_consumed_by,
    RequestCode.GET_CONSUMER_CONNECTION_LIST: consumer_connections,
    RequestCode.NOTIFY_BROKER_ROLE_CHANGED: controller_mode.notify_role_changed,
    RequestCode.GET_BROKER_EPOCH_CACHE: controller_mode.broker_epoch_cache,
}
