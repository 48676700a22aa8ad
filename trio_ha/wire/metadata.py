"""The broker's metadata tables as frozen values, and RocketMQ's config JSON files they live in.

The broker keeps four tables under ``<storePathRootDir>/config/`` (docs/formats.md, 'Broker
config files')::

    topics.json             {"dataVersion":{..},"topicConfigTable":{"<topic>":TopicConfig}}
    consumerOffset.json     {"offsetTable":{"<topic>@<group>":{<queueId>:<offset>}}}
    delayOffset.json        {"offsetTable":{<delayLevel>:<offset>}}
    subscriptionGroup.json  {"dataVersion":{..},"subscriptionGroupTable":{"<group>":{..}}}

Java writes them with fastjson in its "pretty" layout (tabs, one line per string-keyed entry),
fields in alphabetical order, and — the trap — integer-keyed maps with **unquoted** keys
(``{0:123,1:456}``), which is not JSON. A store directory must stay readable by RocketMQ and
ours must read RocketMQ's, so the decoders accept both quoted and unquoted keys and the
encoders write fastjson's form by default (``pretty=True`` as on disk; ``pretty=False`` is the
compact form of the GET_ALL_* response bodies; ``standard_json=True`` quotes the keys, which
Java reads as well). The same encoders produce the bodies a slave fetches from its master
(GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
GET_ALL_SUBSCRIPTIONGROUP_CONFIG).

The values are the tables' rows: ``TopicConfig`` (a topic's queues and permission, also sent
to the name server in the register body, ``route.RegisterBrokerBody``), ``DataVersion`` (the
version every table and registration carries), ``SubscriptionGroupConfig``, and the offset
tables. Writing files (tmp, bak, rename) is ``broker.metadata``'s business; nothing here
touches a file.
Unknown fields (5.x additions such as topic ``attributes``) are ignored when reading.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import MetadataDecodeError, RouteDecodeError
from .fastjson import encode_json, read_json
from .json_fields import (
    JsonShapeError,
    as_int,
    as_object,
    decoding,
    get_bool,
    get_int,
    get_object,
    get_str,
)
from .permission import Permission

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "BENCHMARK_TOPIC",
    "CONSUMER_OFFSET_JSON",
    "DEFAULT_DELAY_LEVELS",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "DELAY_OFFSET_JSON",
    "NOT_ALLOWED_SEND_TOPICS",
    "OFFSET_MOVED_EVENT_TOPIC",
    "SCHEDULE_TOPIC",
    "SELF_TEST_TOPIC",
    "SUBSCRIPTION_GROUP_JSON",
    "SYSTEM_TOPICS",
    "SYSTEM_TOPIC_PREFIX",
    "TOPICS_JSON",
    "TOPIC_FILTER_TYPES",
    "TRACE_TOPIC",
    "TRANS_CHECK_MAX_TIME_TOPIC",
    "RETRY_GROUP_TOPIC_PREFIX",
    "DLQ_GROUP_TOPIC_PREFIX",
    "TRANS_HALF_TOPIC",
    "TRANS_OP_HALF_TOPIC",
    "ConsumerOffsetTable",
    "DataVersion",
    "DelayOffsetTable",
    "MetadataDecodeError",
    "Permission",
    "SubscriptionGroupConfig",
    "SubscriptionGroupWrapper",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "decode_consumer_offsets",
    "decode_delay_offsets",
    "decode_subscription_groups",
    "decode_topics_json",
    "encode_consumer_offsets",
    "encode_delay_offsets",
    "encode_subscription_groups",
    "encode_topics_json",
    "offset_key",
    "parse_delay_levels",
    "split_offset_key",
]

TOPICS_JSON = "topics.json"
CONSUMER_OFFSET_JSON = "consumerOffset.json"
DELAY_OFFSET_JSON = "delayOffset.json"
SUBSCRIPTION_GROUP_JSON = "subscriptionGroup.json"

#: ``defaultTopicQueueNums``: queues of an auto-created topic
DEFAULT_TOPIC_QUEUE_NUMS = 8
#: ``messageDelayLevel``: level 1 is the first entry
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

#: ``<topic>@<group>`` keys of consumerOffset.json
TOPIC_GROUP_SEPARATOR = "@"

#: TopicFilterType's names
TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")

# TopicValidator's names (RocketMQ 4.9): the topics a broker makes for itself. Shared by the
# broker, which refuses clients' writes and changes to them, and the client, which checks
# before it sends (as Java's Validators).

#: the template topic of auto-creation (``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``)
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT_TOPIC = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
#: a consumer group's retry and dead-letter topics are these prefixes + the group
#: (``MixAll.RETRY_GROUP_TOPIC_PREFIX``, ``MixAll.DLQ_GROUP_TOPIC_PREFIX``)
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
#: the default message trace topic (``TopicValidator.RMQ_SYS_TRACE_TOPIC``)
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
#: topics a producer may not send to (``TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET``): only the
#: broker itself writes them
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        TRANS_HALF_TOPIC,
        TRANS_OP_HALF_TOPIC,
        TRANS_CHECK_MAX_TIME_TOPIC,
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT_TOPIC,
    }
)
#: RocketMQ 4.9's system topics (``TopicValidator.SYSTEM_TOPIC_SET``): no client creates or
#: changes them through UPDATE_AND_CREATE_TOPIC. A broker adds the topics it makes for its
#: cluster and itself (its cluster's and its own name, the reply topic).
SYSTEM_TOPICS = NOT_ALLOWED_SEND_TOPICS | {
    AUTO_CREATE_TOPIC_KEY_TOPIC, BENCHMARK_TOPIC, TRACE_TOPIC,
}
#: ``TopicValidator.SYSTEM_TOPIC_PREFIX``: every topic named so is a system topic
SYSTEM_TOPIC_PREFIX = "rmq_sys_"


def _encode(obj: dict[str, Any], pretty: bool, standard_json: bool) -> bytes:
    return encode_json(obj, standard_json=standard_json, pretty=pretty)


def _parse(data: bytes | str, what: str) -> dict[str, Any]:
    value = read_json(data, error=MetadataDecodeError, what=what)
    with decoding(MetadataDecodeError, what):
        return as_object(value, what)


def _version_or_none(obj: dict[str, Any], what: str) -> DataVersion | None:
    value = obj.get("dataVersion")
    return None if value is None else DataVersion.from_json_obj(value, f"{what}.dataVersion")


# ---- values shared with the name server --------------------------------------------------


@attrs.frozen
class DataVersion:
    """A table's version: ``counter`` rises on every change, ``timestamp`` is when (ms).
    5.x adds ``stateVersion`` (written only when non-zero, so 4.x files round-trip)."""

    counter: int = 0
    timestamp: int = 0
    state_version: int = 0

    def next_version(self, now_ms: int) -> DataVersion:
        return DataVersion(self.counter + 1, now_ms, self.state_version)

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {"counter": self.counter, "timestamp": self.timestamp}
        if self.state_version:
            obj["stateVersion"] = self.state_version
        return obj

    @classmethod
    def from_json_obj(cls, value: object, path: str = "dataVersion") -> DataVersion:
        obj = as_object(value, path)
        return cls(
            get_int(obj, "counter", path, 0),
            get_int(obj, "timestamp", path, 0),
            get_int(obj, "stateVersion", path, 0),
        )

    def encode(self) -> bytes:
        return encode_json(self.to_json_obj())

    @classmethod
    def decode(cls, data: bytes | str) -> DataVersion:
        with decoding(RouteDecodeError, "DataVersion"):
            return cls.from_json_obj(read_json(data, what="DataVersion"))


@attrs.frozen
class TopicConfig:
    """One topic's configuration (defaults as Java's: 16 queues, perm read|write). ``perm``
    holds ``Permission`` bits; read from a peer or a file it is the plain int that came,
    unknown bits included."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = Permission.READ | Permission.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json_obj(cls, value: object, path: str, name: str | None = None) -> TopicConfig:
        obj = as_object(value, path)
        filter_type = get_str(obj, "topicFilterType", path, "SINGLE_TAG")
        if filter_type not in TOPIC_FILTER_TYPES:
            raise JsonShapeError(
                f"{path}.topicFilterType {filter_type!r} is not a TopicFilterType"
            )
        return cls(
            topic_name=(
                get_str(obj, "topicName", path)
                if name is None
                else get_str(obj, "topicName", path, name)
            ),
            read_queue_nums=get_int(obj, "readQueueNums", path, 16, int32=True),
            write_queue_nums=get_int(obj, "writeQueueNums", path, 16, int32=True),
            perm=get_int(obj, "perm", path, Permission.READ | Permission.WRITE, int32=True),
            topic_filter_type=filter_type,
            topic_sys_flag=get_int(obj, "topicSysFlag", path, 0, int32=True),
            order=get_bool(obj, "order", path, False),
        )

    def encode_compact(self) -> str:
        """``TopicConfig.encode()``: the compressed register body's form,
        ``"topicName readQueueNums writeQueueNums perm topicFilterType"``."""
        return (
            f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} "
            f"{int(self.perm)} {self.topic_filter_type}"
        )

    @classmethod
    def decode_compact(cls, text: str) -> TopicConfig:
        parts = text.split(" ", 5)  # a 6th part (5.x attributes) is ignored
        if len(parts) < 5:
            raise RouteDecodeError(f"topic config {text[:80]!r} has {len(parts)} parts, not 5")
        name, read, write, perm, filter_type = parts[:5]
        if not name or filter_type not in TOPIC_FILTER_TYPES:
            raise RouteDecodeError(f"topic config {text[:80]!r} is malformed")
        with decoding(RouteDecodeError, "topic config"):
            return cls(
                name,
                as_int(read, "readQueueNums", int32=True),
                as_int(write, "writeQueueNums", int32=True),
                as_int(perm, "perm", int32=True),
                filter_type,
            )


def _topic_table_from_json(value: object, path: str) -> dict[str, TopicConfig]:
    table = as_object(value, path) if value is not None else {}
    return {
        name: TopicConfig.from_json_obj(item, f"{path}[{name!r}]", name)
        for name, item in table.items()
    }


@attrs.frozen
class TopicConfigSerializeWrapper:
    """``topics.json``, the GET_ALL_TOPIC_CONFIG body and part of the register body."""

    topic_config_table: dict[str, TopicConfig] = attrs.field(factory=dict[str, TopicConfig])
    data_version: DataVersion = DataVersion()

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json_obj(),
            "topicConfigTable": {
                name: config.to_json_obj() for name, config in self.topic_config_table.items()
            },
        }

    @classmethod
    def from_json_obj(
        cls, value: object, path: str = "topics"
    ) -> TopicConfigSerializeWrapper:
        obj = as_object(value, path)
        version = obj.get("dataVersion")
        return cls(
            _topic_table_from_json(obj.get("topicConfigTable"), f"{path}.topicConfigTable"),
            DataVersion() if version is None else DataVersion.from_json_obj(version),
        )


# ---- topics.json --------------------------------------------------------------------------


def decode_topics_json(data: bytes | str) -> TopicConfigSerializeWrapper:
    obj = _parse(data, TOPICS_JSON)
    with decoding(MetadataDecodeError, TOPICS_JSON):
        return TopicConfigSerializeWrapper.from_json_obj(obj, TOPICS_JSON)


def encode_topics_json(
    wrapper: TopicConfigSerializeWrapper, *, pretty: bool = True, standard_json: bool = False
) -> bytes:
    return _encode(wrapper.to_json_obj(), pretty, standard_json)


# ---- consumerOffset.json ----------------------------------------------------------------------


def offset_key(topic: str, group: str) -> str:
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def split_offset_key(key: str) -> tuple[str, str]:
    """``"topic@group"`` -> (topic, group); neither may contain ``@``."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        raise ValueError(f"offset table key {key!r} is not <topic>@<group>")
    return parts[0], parts[1]


@attrs.frozen
class ConsumerOffsetTable:
    """Committed offsets: ``"topic@group"`` -> queue id -> next offset to consume.
    ``data_version`` is 5.x's (None: not written, as 4.9)."""

    offset_table: dict[str, dict[int, int]] = attrs.field(factory=dict[str, dict[int, int]])
    data_version: DataVersion | None = None

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        return self.offset_table.get(offset_key(topic, group), {})


def decode_consumer_offsets(data: bytes | str) -> ConsumerOffsetTable:
    obj = _parse(data, CONSUMER_OFFSET_JSON)
    with decoding(MetadataDecodeError, CONSUMER_OFFSET_JSON):
        table = get_object(obj, "offsetTable", CONSUMER_OFFSET_JSON)
        offsets: dict[str, dict[int, int]] = {}
        for key, queues in table.items():
            path = f"offsetTable[{key!r}]"
            offsets[key] = {
                as_int(queue, f"{path} key", int32=True): as_int(
                    offset, f"{path}[{queue}]"
                )
                for queue, offset in as_object(queues, path).items()
            }
        return ConsumerOffsetTable(offsets, _version_or_none(obj, CONSUMER_OFFSET_JSON))


def encode_consumer_offsets(
    table: ConsumerOffsetTable, *, pretty: bool = True, standard_json: bool = False
) -> bytes:
    obj: dict[str, Any] = {"offsetTable": table.offset_table}
    if table.data_version is not None:
        obj["dataVersion"] = table.data_version.to_json_obj()
    return _encode(obj, pretty, standard_json)


# ---- delayOffset.json -----------------------------------------------------------------------


@attrs.frozen
class DelayOffsetTable:
    """Progress of the schedule service: delay level -> offset in SCHEDULE_TOPIC_XXXX's queue
    (level - 1)."""

    offset_table: dict[int, int] = attrs.field(factory=dict[int, int])
    data_version: DataVersion | None = None


def decode_delay_offsets(data: bytes | str) -> DelayOffsetTable:
    obj = _parse(data, DELAY_OFFSET_JSON)
    with decoding(MetadataDecodeError, DELAY_OFFSET_JSON):
        table = get_object(obj, "offsetTable", DELAY_OFFSET_JSON)
        return DelayOffsetTable(
            {
                as_int(level, "offsetTable key", int32=True): as_int(
                    offset, f"offsetTable[{level}]"
                )
                for level, offset in table.items()
            },
            _version_or_none(obj, DELAY_OFFSET_JSON),
        )


def encode_delay_offsets(
    table: DelayOffsetTable, *, pretty: bool = True, standard_json: bool = False
) -> bytes:
    obj: dict[str, Any] = {"offsetTable": table.offset_table}
    if table.data_version is not None:
        obj["dataVersion"] = table.data_version.to_json_obj()
    return _encode(obj, pretty, standard_json)


_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> dict[int, int]:
    """``messageDelayLevel`` -> {level (from 1): delay in ms}."""
    levels: dict[int, int] = {}
    for i, item in enumerate(text.split(), start=1):
        unit = _DELAY_UNITS_MS.get(item[-1:])
        number = item[:-1]
        if unit is None or not number.isdigit() or not number.isascii():
            raise ValueError(f"delay level {item!r} is not <number><s|m|h|d>")
        levels[i] = int(number) * unit
    return levels


# ---- subscriptionGroup.json ---------------------------------------------------------------------


@attrs.frozen
class SubscriptionGroupConfig:
    """A consumer group's settings (4.9 fields and defaults)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "brokerId": self.broker_id,
            "consumeBroadcastEnable": self.consume_broadcast_enable,
            "consumeEnable": self.consume_enable,
            "consumeFromMinEnable": self.consume_from_min_enable,
            "groupName": self.group_name,
            "notifyConsumerIdsChangedEnable": self.notify_consumer_ids_changed_enable,
            "retryMaxTimes": self.retry_max_times,
            "retryQueueNums": self.retry_queue_nums,
            "whichBrokerWhenConsumeSlowly": self.which_broker_when_consume_slowly,
        }

    @classmethod
    def from_json_obj(
        cls, value: object, path: str, name: str | None = None
    ) -> SubscriptionGroupConfig:
        obj = as_object(value, path)
        return cls(
            group_name=(
                get_str(obj, "groupName", path)
                if name is None
                else get_str(obj, "groupName", path, name)
            ),
            consume_enable=get_bool(obj, "consumeEnable", path, True),
            consume_from_min_enable=get_bool(obj, "consumeFromMinEnable", path, True),
            consume_broadcast_enable=get_bool(obj, "consumeBroadcastEnable", path, True),
            retry_queue_nums=get_int(obj, "retryQueueNums", path, 1, int32=True),
            retry_max_times=get_int(obj, "retryMaxTimes", path, 16, int32=True),
            broker_id=get_int(obj, "brokerId", path, 0),
            which_broker_when_consume_slowly=get_int(obj, "whichBrokerWhenConsumeSlowly", path, 1),
            notify_consumer_ids_changed_enable=get_bool(
                obj, "notifyConsumerIdsChangedEnable", path, True
            ),
        )


@attrs.frozen
class SubscriptionGroupWrapper:
    """``subscriptionGroup.json`` and the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""

    subscription_group_table: dict[str, SubscriptionGroupConfig] = attrs.field(
        factory=dict[str, SubscriptionGroupConfig]
    )
    data_version: DataVersion = DataVersion()

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "dataVersion": self.data_version.to_json_obj(),
            "subscriptionGroupTable": {
                name: config.to_json_obj() for name, config in self.subscription_group_table.items()
            },
        }


def decode_subscription_groups(data: bytes | str) -> SubscriptionGroupWrapper:
    what = SUBSCRIPTION_GROUP_JSON
    obj = _parse(data, what)
    with decoding(MetadataDecodeError, what):
        table = get_object(obj, "subscriptionGroupTable", what)
        return SubscriptionGroupWrapper(
            {
                name: SubscriptionGroupConfig.from_json_obj(
                    item, f"subscriptionGroupTable[{name!r}]", name
                )
                for name, item in table.items()
            },
            _version_or_none(obj, what) or DataVersion(),
        )


def encode_subscription_groups(
    wrapper: SubscriptionGroupWrapper, *, pretty: bool = True, standard_json: bool = False
) -> bytes:
    return _encode(wrapper.to_json_obj(), pretty, standard_json)
