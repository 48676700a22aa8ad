"""What the metadata tables accept: names, queue counts, queue ids and offsets.

Every name in a table becomes a key of a RocketMQ file and, for topics, a directory under
``consumequeue/``; every number is a Java int or long on the other side. The managers check
what clients send them here, and each check raises a ``ValueError`` whose message says what
was wrong, which the request processors return as the response's remark.
"""

from __future__ import annotations

import re
from typing import Any

from trio_ha.store.consume_queue import is_valid_topic
from trio_ha.wire.layout import INT32_MAX, INT64_MAX
from trio_ha.wire.permission import Permission

__all__ = [
    "MAX_PERMISSION",
    "MAX_QUEUE_NUMS",
    "check_group",
    "check_offset",
    "check_queue_id",
    "check_queue_nums",
    "check_topic",
    "is_valid_group",
    "is_valid_topic",
]

#: upper bound on read/write queue numbers a topic may have (BenchmarkTest has 1024; every
#: queue is a directory and a file handle)
MAX_QUEUE_NUMS = 1024
#: every permission bit set: the largest ``perm`` a topic or a broker may have
MAX_PERMISSION = int(Permission.PRIORITY | Permission.READ | Permission.WRITE | Permission.INHERIT)

#: RocketMQ's group charset (``Validators.checkGroup``: the topic charset, up to 255 characters)
_VALID_GROUP = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")


def is_valid_group(group: object) -> bool:
    return type(group) is str and bool(_VALID_GROUP.match(group))


def check_topic(topic: Any) -> None:
    if type(topic) is not str or not is_valid_topic(topic):
        raise ValueError(
            f"invalid topic name {topic!r}: 1-127 characters from [%|a-zA-Z0-9_-] required"
        )


def check_group(group: Any) -> None:
    if not is_valid_group(group):
        raise ValueError(
            f"invalid consumer group name {group!r}: 1-255 characters from [%|a-zA-Z0-9_-] "
            "required"
        )


def check_queue_nums(value: Any, what: str) -> None:
    if type(value) is not int or not 1 <= value <= MAX_QUEUE_NUMS:
        raise ValueError(f"{what} must be an integer in 1..{MAX_QUEUE_NUMS}, got {value!r}")


def check_queue_id(queue_id: Any) -> None:
    if type(queue_id) is not int or not 0 <= queue_id <= INT32_MAX:
        raise ValueError(f"queue id must be an integer in 0..{INT32_MAX}, got {queue_id!r}")


def check_offset(offset: Any, what: str = "offset") -> None:
    if type(offset) is not int or not 0 <= offset <= INT64_MAX:
        raise ValueError(f"{what} must be a non-negative 64-bit integer, got {offset!r}")
