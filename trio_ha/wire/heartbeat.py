"""The client bodies a broker receives: HEART_BEAT's ``HeartbeatData`` (who the client is, its
producer groups, its consumer groups and their subscriptions) and the answer to
GET_CONSUMER_LIST_BY_GROUP.

A heartbeat is how a broker learns its clients: the broker keeps each consumer group's
subscriptions from it (``SubscriptionData``, whose ``codeSet`` holds the tags' Java hash codes
the pull filter compares), and drops a client whose heartbeats stop. Bodies are fastjson JSON;
decoding is lenient where fastjson is (a null ``expressionType`` means TAG) and raises
``RouteDecodeError`` for anything malformed.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import RouteDecodeError
from .fastjson import encode_json, read_json
from .json_fields import (
    as_int,
    as_object,
    decoding,
    get_bool,
    get_int,
    get_list,
    get_str,
    str_items,
)

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "CONSUME_ACTIVELY",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
    "CONSUME_PASSIVELY",
    "ConsumerData",
    "ConsumerIdList",
    "HeartbeatData",
    "ProducerData",
    "SubscriptionData",
]

# ConsumeType, MessageModel and ConsumeFromWhere are Java enums, kept here as their names
CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # pull
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # push
CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"


@attrs.frozen
class SubscriptionData:
    """A consumer's subscription to one topic. ``code_set`` holds the tags' Java hash codes."""

    topic: str
    sub_string: str = "*"
    tags_set: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    code_set: frozenset[int] = attrs.field(default=frozenset(), converter=frozenset)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": self.code_set,
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": self.tags_set,
            "topic": self.topic,
        }

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> SubscriptionData:
        obj = as_object(value, path)
        codes = get_list(obj, "codeSet", path)
        return cls(
            topic=get_str(obj, "topic", path),
            sub_string=get_str(obj, "subString", path, "*"),
            tags_set=str_items(obj.get("tagsSet"), f"{path}.tagsSet"),
            code_set=[
                as_int(code, f"{path}.codeSet[{i}]", int32=True)
                for i, code in enumerate(codes)
            ],
            sub_version=get_int(obj, "subVersion", path, 0),
            # a null expressionType means TAG to the broker
            expression_type=get_str(obj, "expressionType", path, "TAG"),
            class_filter_mode=get_bool(obj, "classFilterMode", path, False),
        )


@attrs.frozen
class ProducerData:
    group_name: str

    def to_json_obj(self) -> dict[str, Any]:
        return {"groupName": self.group_name}

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> ProducerData:
        return cls(get_str(as_object(value, path), "groupName", path))


@attrs.frozen
class ConsumerData:
    group_name: str
    consume_type: str | None = CONSUME_PASSIVELY
    message_model: str | None = CLUSTERING
    consume_from_where: str | None = CONSUME_FROM_LAST_OFFSET
    subscription_data_set: tuple[SubscriptionData, ...] = attrs.field(default=(), converter=tuple)
    unit_mode: bool = False

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "consumeFromWhere": self.consume_from_where,
            "consumeType": self.consume_type,
            "groupName": self.group_name,
            "messageModel": self.message_model,
            "subscriptionDataSet": [s.to_json_obj() for s in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> ConsumerData:
        obj = as_object(value, path)
        return cls(
            group_name=get_str(obj, "groupName", path),
            consume_type=get_str(obj, "consumeType", path, None),
            message_model=get_str(obj, "messageModel", path, None),
            consume_from_where=get_str(obj, "consumeFromWhere", path, None),
            subscription_data_set=[
                SubscriptionData.from_json_obj(item, f"{path}.subscriptionDataSet[{i}]")
                for i, item in enumerate(get_list(obj, "subscriptionDataSet", path))
            ],
            unit_mode=get_bool(obj, "unitMode", path, False),
        )


@attrs.frozen
class HeartbeatData:
    """The HEART_BEAT (34) request body."""

    client_id: str
    producer_data_set: tuple[ProducerData, ...] = attrs.field(default=(), converter=tuple)
    consumer_data_set: tuple[ConsumerData, ...] = attrs.field(default=(), converter=tuple)

    @property
    def producer_groups(self) -> tuple[str, ...]:
        return tuple(p.group_name for p in self.producer_data_set)

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "clientID": self.client_id,
            "consumerDataSet": [c.to_json_obj() for c in self.consumer_data_set],
            "producerDataSet": [p.to_json_obj() for p in self.producer_data_set],
        }

    def encode(self) -> bytes:
        return encode_json(self.to_json_obj())

    @classmethod
    def decode(cls, data: bytes | str) -> HeartbeatData:
        with decoding(RouteDecodeError, "HeartbeatData"):
            obj = as_object(read_json(data, what="HeartbeatData"), "heartbeat")
            return cls(
                client_id=get_str(obj, "clientID", "heartbeat"),
                producer_data_set=[
                    ProducerData.from_json_obj(item, f"heartbeat.producerDataSet[{i}]")
                    for i, item in enumerate(get_list(obj, "producerDataSet", "heartbeat"))
                ],
                consumer_data_set=[
                    ConsumerData.from_json_obj(item, f"heartbeat.consumerDataSet[{i}]")
                    for i, item in enumerate(get_list(obj, "consumerDataSet", "heartbeat"))
                ],
            )


@attrs.frozen
class ConsumerIdList:
    """The GET_CONSUMER_LIST_BY_GROUP response body."""

    consumer_id_list: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def encode(self) -> bytes:
        return encode_json({"consumerIdList": list(self.consumer_id_list)})

    @classmethod
    def decode(cls, data: bytes | str) -> ConsumerIdList:
        with decoding(RouteDecodeError, "ConsumerIdList"):
            obj = as_object(read_json(data, what="ConsumerIdList"), "body")
            return cls(tuple(str_items(obj.get("consumerIdList"), "body.consumerIdList")))
