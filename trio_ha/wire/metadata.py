"""RocketMQ's config JSON files, as pure functions between bytes and frozen values.

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

Writing files (tmp, bak, rename) is the store's business; nothing here touches a file.
Unknown fields (5.x additions such as topic ``attributes``) are ignored when reading.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import MetadataDecodeError
from .route import (
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    DataVersion,
    Permission,
    TopicConfig,
    TopicConfigSerializeWrapper,
    _REQUIRED,
    _as_int,
    _decoding,
    _get_bool,
    _get_int,
    _get_obj,
    _get_str,
    _obj,
    read_json,
    write_json,
)

__all__ = [
    "CONSUMER_OFFSET_JSON",
    "DEFAULT_DELAY_LEVELS",
    "DEFAULT_TOPIC_QUEUE_NUMS",
    "DELAY_OFFSET_JSON",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "SUBSCRIPTION_GROUP_JSON",
    "TOPICS_JSON",
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

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


def _encode(obj: Any, pretty: bool, standard_json: bool) -> bytes:
    return write_json(obj, standard_json=standard_json, pretty=pretty).encode("utf-8", "replace")


def _parse(data: bytes | str, what: str) -> dict:
    value = read_json(data, error=MetadataDecodeError, what=what)
    with _decoding(MetadataDecodeError, what):
        return _obj(value, what)


def _version_or_none(obj: dict, what: str) -> DataVersion | None:
    value = obj.get("dataVersion")
    return None if value is None else DataVersion.from_json_obj(value, f"{what}.dataVersion")


# ---- topics.json --------------------------------------------------------------------------


def decode_topics_json(data: bytes | str) -> TopicConfigSerializeWrapper:
    obj = _parse(data, TOPICS_JSON)
    with _decoding(MetadataDecodeError, TOPICS_JSON):
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

    offset_table: dict[str, dict[int, int]] = attrs.field(factory=dict)
    data_version: DataVersion | None = None

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        return self.offset_table.get(offset_key(topic, group), {})


def decode_consumer_offsets(data: bytes | str) -> ConsumerOffsetTable:
    obj = _parse(data, CONSUMER_OFFSET_JSON)
    with _decoding(MetadataDecodeError, CONSUMER_OFFSET_JSON):
        table = _get_obj(obj, "offsetTable", CONSUMER_OFFSET_JSON)
        offsets: dict[str, dict[int, int]] = {}
        for key, queues in table.items():
            path = f"offsetTable[{key!r}]"
            offsets[key] = {
                _as_int(queue, f"{path} key", _INT32_MIN, _INT32_MAX): _as_int(
                    offset, f"{path}[{queue}]"
                )
                for queue, offset in _obj(queues, path).items()
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

    offset_table: dict[int, int] = attrs.field(factory=dict)
    data_version: DataVersion | None = None


def decode_delay_offsets(data: bytes | str) -> DelayOffsetTable:
    obj = _parse(data, DELAY_OFFSET_JSON)
    with _decoding(MetadataDecodeError, DELAY_OFFSET_JSON):
        table = _get_obj(obj, "offsetTable", DELAY_OFFSET_JSON)
        return DelayOffsetTable(
            {
                _as_int(level, "offsetTable key", _INT32_MIN, _INT32_MAX): _as_int(
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

    def to_json_obj(self) -> dict:
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
        cls, value: Any, path: str, name: str | None = None
    ) -> SubscriptionGroupConfig:
        obj = _obj(value, path)
        return cls(
            group_name=_get_str(obj, "groupName", path, _REQUIRED if name is None else name),
            consume_enable=_get_bool(obj, "consumeEnable", path, True),
            consume_from_min_enable=_get_bool(obj, "consumeFromMinEnable", path, True),
            consume_broadcast_enable=_get_bool(obj, "consumeBroadcastEnable", path, True),
            retry_queue_nums=_get_int(obj, "retryQueueNums", path, 1, int32=True),
            retry_max_times=_get_int(obj, "retryMaxTimes", path, 16, int32=True),
            broker_id=_get_int(obj, "brokerId", path, 0),
            which_broker_when_consume_slowly=_get_int(obj, "whichBrokerWhenConsumeSlowly", path, 1),
            notify_consumer_ids_changed_enable=_get_bool(
                obj, "notifyConsumerIdsChangedEnable", path, True
            ),
        )


@attrs.frozen
class SubscriptionGroupWrapper:
    """``subscriptionGroup.json`` and the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""

    subscription_group_table: dict[str, SubscriptionGroupConfig] = attrs.field(factory=dict)
    data_version: DataVersion = DataVersion()

    def to_json_obj(self) -> dict:
        return {
            "dataVersion": self.data_version.to_json_obj(),
            "subscriptionGroupTable": {
                name: config.to_json_obj() for name, config in self.subscription_group_table.items()
            },
        }


def decode_subscription_groups(data: bytes | str) -> SubscriptionGroupWrapper:
    what = SUBSCRIPTION_GROUP_JSON
    obj = _parse(data, what)
    with _decoding(MetadataDecodeError, what):
        table = _get_obj(obj, "subscriptionGroupTable", what)
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
