"""The admin statistics bodies: a topic's queues (GET_TOPIC_STATS_INFO, ``TopicStatsTable``)
and a consumer group's progress (GET_CONSUME_STATS, ``ConsumeStats``).

Both are fastjson maps keyed by MessageQueue *objects*, which standard JSON cannot hold, so
they are read with ``read_json_object_keys``. Lag is what an operator asks for first:
``QueueProgress.lag`` is the messages the group has not consumed, per queue.
"""

from __future__ import annotations

from typing import Any

import attrs

from .errors import RouteDecodeError
from .fastjson import ObjectKeyedMap, read_json_object_keys
from .json_fields import as_object, decoding, get_int
from .queue_locks import QueueId

__all__ = ["ConsumeStats", "QueueProgress", "QueueStats", "TopicStats"]


def _queue_entries(obj: dict[str, Any], path: str) -> list[tuple[QueueId, dict[str, Any]]]:
    table = obj.get("offsetTable", {})
    if isinstance(table, dict) and not table:
        return []
    if not isinstance(table, ObjectKeyedMap):
        raise RouteDecodeError(f"{path}.offsetTable is not keyed by message queues")
    return [(QueueId.from_json_obj(key, f"{path}.offsetTable key"),
             as_object(value, f"{path}.offsetTable[{i}]"))
            for i, (key, value) in enumerate(table)]


@attrs.frozen(order=True)
class QueueStats:
    """One queue of a topic on one broker: offsets and the store time of its last message."""

    queue: QueueId
    min_offset: int
    max_offset: int
    last_update_ms: int


@attrs.frozen
class TopicStats:
    """GET_TOPIC_STATS_INFO's body (RocketMQ's TopicStatsTable)."""

    queues: tuple[QueueStats, ...] = ()

    @classmethod
    def decode(cls, data: bytes | str) -> TopicStats:
        with decoding(RouteDecodeError, "TopicStatsTable"):
            obj = as_object(read_json_object_keys(data, what="TopicStatsTable"), "body")
            return cls(tuple(sorted(
                QueueStats(queue, get_int(value, "minOffset", "body"),
                           get_int(value, "maxOffset", "body"),
                           get_int(value, "lastUpdateTimestamp", "body", 0))
                for queue, value in _queue_entries(obj, "body"))))


@attrs.frozen(order=True)
class QueueProgress:
    """One queue of a group's progress: the broker's max offset, the group's committed offset
    and the store time of the last message it consumed."""

    queue: QueueId
    broker_offset: int
    consumer_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(0, self.broker_offset - self.consumer_offset)


@attrs.frozen
class ConsumeStats:
    """GET_CONSUME_STATS's body (RocketMQ's ConsumeStats)."""

    queues: tuple[QueueProgress, ...] = ()
    consume_tps: float = 0.0

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @classmethod
    def decode(cls, data: bytes | str) -> ConsumeStats:
        with decoding(RouteDecodeError, "ConsumeStats"):
            obj = as_object(read_json_object_keys(data, what="ConsumeStats"), "body")
            tps = obj.get("consumeTps", 0.0)
            if isinstance(tps, bool) or not isinstance(tps, int | float):
                raise RouteDecodeError("body.consumeTps is not a number")
            return cls(tuple(sorted(
                QueueProgress(queue, get_int(value, "brokerOffset", "body"),
                              get_int(value, "consumerOffset", "body"),
                              get_int(value, "lastTimestamp", "body", 0))
                for queue, value in _queue_entries(obj, "body"))), float(tps))

    def merged(self, other: ConsumeStats) -> ConsumeStats:
        """This and ``other`` (another broker's answer) as one table."""
        return ConsumeStats(tuple(sorted(self.queues + other.queues)),
                            self.consume_tps + other.consume_tps)

