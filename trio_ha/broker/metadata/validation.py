"""What the metadata tables accept: names, queue counts, queue ids and offsets.

Every name in a table becomes a key of a RocketMQ file and, for topics, a directory under
``consumequeue/``; every number is a Java int or long on the other side. The managers check
what clients send them here. Client input a table refuses raises a ``MetadataRequestError``
(a ``ValueError``) whose message is one short line — untrusted input in it is abbreviated —
so a request processor can answer it as the response's remark, without a traceback in the
log: ``InvalidMetadataError`` for a bad name or number, ``MetadataLimitError`` for a table
at its configured size.

The remarks for names are RocketMQ's (``TopicValidator.validateTopic`` for topics, the
client's ``Validators.checkGroup`` for groups), so a client sees what a RocketMQ broker says.
"""

from __future__ import annotations

import re
from typing import Any

from trio_ha.wire.layout import INT32_MAX, INT64_MAX
from trio_ha.wire.permission import Permission
from trio_ha.wire.remoting.java import abbreviate

from ..._errors import TrioHAError

__all__ = [
    "MAX_PERMISSION",
    "MAX_QUEUE_NUMS",
    "TOPIC_MAX_LENGTH",
    "GROUP_MAX_LENGTH",
    "InvalidMetadataError",
    "MetadataLimitError",
    "MetadataRequestError",
    "check_group",
    "check_offset",
    "check_queue_id",
    "check_queue_nums",
    "check_topic",
    "group_problem",
    "is_valid_group",
    "is_valid_topic",
    "topic_problem",
]

#: upper bound on read/write queue numbers a topic may have (BenchmarkTest has 1024; every
#: queue is a directory and a file handle)
MAX_QUEUE_NUMS = 1024
#: every permission bit set: the largest ``perm`` a topic or a broker may have
MAX_PERMISSION = int(Permission.PRIORITY | Permission.READ | Permission.WRITE | Permission.INHERIT)
#: ``TopicValidator.TOPIC_MAX_LENGTH``
TOPIC_MAX_LENGTH = 127
#: ``Validators.CHARACTER_MAX_LENGTH``: a group name's limit
GROUP_MAX_LENGTH = 255

#: RocketMQ's charset of topic and group names (``TopicValidator.VALID_CHAR_BIT_MAP``);
#: fullmatch, so a trailing newline is not let through as ``$`` would
_NAME_CHARS = re.compile(r"[%|a-zA-Z0-9_-]+")
_ILLEGAL_CHARACTERS = "contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"


class MetadataRequestError(TrioHAError, ValueError):
    """Client input a metadata table refuses. The message is one line, fit for a remark."""


class InvalidMetadataError(MetadataRequestError):
    """A name or a number outside what the tables (and RocketMQ's files) can hold."""


class MetadataLimitError(MetadataRequestError):
    """A table is at its configured size and the request would add to it."""


def topic_problem(topic: object) -> str | None:
    """RocketMQ's remark for an unusable topic name (``validateTopic``), or None if it is
    fine."""
    if type(topic) is not str or not topic.strip():
        return "The specified topic is blank."
    if not _NAME_CHARS.fullmatch(topic):
        return f"The specified topic {_ILLEGAL_CHARACTERS}"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    return None


def group_problem(group: object) -> str | None:
    """The remark for an unusable group name (as RocketMQ's client checks it), or None."""
    if type(group) is not str or not group.strip():
        return "the specified group is blank"
    if not _NAME_CHARS.fullmatch(group):
        return f"the specified group[{abbreviate(group)!r}] {_ILLEGAL_CHARACTERS}"
    if len(group) > GROUP_MAX_LENGTH:
        return f"the specified group is longer than group max length {GROUP_MAX_LENGTH}."
    return None


def is_valid_topic(topic: object) -> bool:
    """A topic name RocketMQ accepts; also what keeps it from naming a path outside
    ``consumequeue/``."""
    return topic_problem(topic) is None


def is_valid_group(group: object) -> bool:
    return group_problem(group) is None


def check_topic(topic: Any) -> None:
    problem = topic_problem(topic)
    if problem is not None:
        shown = abbreviate(topic) if type(topic) is str else topic
        raise InvalidMetadataError(f"invalid topic name {shown!r}: {problem}")


def check_group(group: Any) -> None:
    problem = group_problem(group)
    if problem is not None:
        raise InvalidMetadataError(f"invalid consumer group name: {problem}")


def check_queue_nums(value: Any, what: str) -> None:
    if type(value) is not int or not 1 <= value <= MAX_QUEUE_NUMS:
        raise InvalidMetadataError(
            f"{what} must be an integer in 1..{MAX_QUEUE_NUMS}, got {value!r}"
        )


def check_queue_id(queue_id: Any) -> None:
    if type(queue_id) is not int or not 0 <= queue_id <= INT32_MAX:
        raise InvalidMetadataError(
            f"queue id must be an integer in 0..{INT32_MAX}, got {queue_id!r}"
        )


def check_offset(offset: Any, what: str = "offset") -> None:
    if type(offset) is not int or not 0 <= offset <= INT64_MAX:
        raise InvalidMetadataError(
            f"{what} must be a non-negative 64-bit integer, got {offset!r}"
        )
