"""The bodies of LOCK_BATCH_MQ and UNLOCK_BATCH_MQ (orderly consumption's queue locks).

A consumer that must see each queue's messages in order locks its queues at the broker first:
``{"consumerGroup":..., "clientId":..., "mqSet":[{"topic":...,"brokerName":...,"queueId":..}]}``
asks for them, and the answer ``{"lockOKMQSet":[...]}`` names those it now holds. UNLOCK takes
the same body and answers nothing. fastjson JSON, as RocketMQ's ``LockBatchRequestBody``,
``UnlockBatchRequestBody`` and ``LockBatchResponseBody``; anything malformed, or more than
``MAX_QUEUES`` queues, raises ``RouteDecodeError``.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import RouteDecodeError
from .fastjson import encode_json, read_json
from .json_fields import as_object, decoding, get_int, get_list, get_str

__all__ = ["MAX_QUEUES", "LockBatchRequest", "LockBatchResponse", "QueueId"]

#: the most queues one request may name (a consumer asks for its share of its topics)
MAX_QUEUES = 4096


@attrs.frozen(order=True)
class QueueId:
    """RocketMQ's ``MessageQueue`` as these bodies carry it."""

    topic: str
    broker_name: str
    queue_id: int

    def to_json_obj(self) -> dict[str, Any]:
        return {"brokerName": self.broker_name, "queueId": self.queue_id, "topic": self.topic}

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> QueueId:
        obj = as_object(value, path)
        return cls(get_str(obj, "topic", path), get_str(obj, "brokerName", path),
                   get_int(obj, "queueId", path, int32=True))


def _queues(obj: dict[str, Any], key: str, path: str) -> tuple[QueueId, ...]:
    items = get_list(obj, key, path) if key in obj and obj[key] is not None else []
    if len(items) > MAX_QUEUES:
        raise RouteDecodeError(f"{path}.{key} names {len(items)} queues, more than {MAX_QUEUES}")
    return tuple(QueueId.from_json_obj(item, f"{path}.{key}[{i}]") for i, item in enumerate(items))


@attrs.frozen
class LockBatchRequest:
    """LOCK_BATCH_MQ's body, and UNLOCK_BATCH_MQ's (the same fields)."""

    consumer_group: str
    client_id: str
    mq_set: tuple[QueueId, ...] = attrs.field(default=(), converter=tuple)

    def encode(self) -> bytes:
        return encode_json({
            "clientId": self.client_id, "consumerGroup": self.consumer_group,
            "mqSet": [q.to_json_obj() for q in sorted(set(self.mq_set))],
        })

    @classmethod
    def decode(cls, data: bytes | str) -> LockBatchRequest:
        with decoding(RouteDecodeError, "LockBatchRequestBody"):
            obj = as_object(read_json(data, what="LockBatchRequestBody"), "body")
            return cls(get_str(obj, "consumerGroup", "body"), get_str(obj, "clientId", "body"),
                       _queues(obj, "mqSet", "body"))


@attrs.frozen
class LockBatchResponse:
    """LOCK_BATCH_MQ's answer: the queues the client holds now."""

    lock_ok_mq_set: tuple[QueueId, ...] = attrs.field(default=(), converter=tuple)

    def encode(self) -> bytes:
        return encode_json({"lockOKMQSet": [q.to_json_obj() for q in sorted(self.lock_ok_mq_set)]})

    @classmethod
    def decode(cls, data: bytes | str) -> LockBatchResponse:
        with decoding(RouteDecodeError, "LockBatchResponseBody"):
            obj = as_object(read_json(data, what="LockBatchResponseBody"), "body")
            return cls(_queues(obj, "lockOKMQSet", "body"))
