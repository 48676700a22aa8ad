"""``topics.json``: the broker's topics, their queue counts and permissions.

RocketMQ's TopicConfigManager: a topic name -> ``TopicConfig`` table with a DataVersion bumped
on every change. Topics appear through UPDATE_AND_CREATE_TOPIC, through a send to an unknown
topic when a template topic allows it (auto-creation, with TBW102 as the usual template), at
startup (the system topics RocketMQ creates), and on a slave by copying the master's table.
What the broker registers with the name servers is this table, with the broker's own
permission applied.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import ClassVar

import attrs

from trio_ha.wire.layout import INT32_MAX
from trio_ha.wire.metadata import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    DEFAULT_TOPIC_QUEUE_NUMS,
    NOT_ALLOWED_SEND_TOPICS,
    OFFSET_MOVED_EVENT_TOPIC,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    SYSTEM_TOPIC_PREFIX,
    SYSTEM_TOPICS,
    TOPIC_FILTER_TYPES,
    TOPICS_JSON,
    TRACE_TOPIC,
    DataVersion,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_topics_json,
    encode_topics_json,
)
from trio_ha.wire.permission import Permission, readable, writable
from trio_ha.wire.remoting.java import abbreviate

from .config_file import VersionedTable, now_ms
from .files import load_with_backup
from .validation import (
    MAX_PERMISSION,
    MAX_QUEUE_NUMS,
    InvalidMetadataError,
    check_queue_nums,
    check_topic,
    is_valid_topic,
)

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "BENCHMARK_TOPIC",
    "NOT_ALLOWED_SEND_TOPICS",
    "OFFSET_MOVED_EVENT_TOPIC",
    "REPLY_TOPIC_POSTFIX",
    "SCHEDULE_TOPIC",
    "SCHEDULE_TOPIC_QUEUE_NUMS",
    "SELF_TEST_TOPIC",
    "SYSTEM_TOPICS",
    "SYSTEM_TOPIC_PREFIX",
    "TRACE_TOPIC",
    "TopicConfigManager",
    "validate_topic_config",
]

log = logging.getLogger(__name__)

#: BenchmarkTest's queues (RocketMQ creates it with 1024)
BENCHMARK_TOPIC_QUEUE_NUMS = 1024
#: ``<cluster>_REPLY_TOPIC`` (request/reply)
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
#: queues of SCHEDULE_TOPIC_XXXX: one per delay level
SCHEDULE_TOPIC_QUEUE_NUMS = 18

_READ_WRITE = Permission.READ | Permission.WRITE


def validate_topic_config(config: TopicConfig) -> None:
    """Raise ``InvalidMetadataError`` (a ValueError) with a one-line message unless ``config``
    is acceptable for ``create_or_update``: a valid name, 1..MAX_QUEUE_NUMS queues, perm
    within the four bits, a known filter type."""
    check_topic(config.topic_name)
    check_queue_nums(config.read_queue_nums, f"topic {config.topic_name}: readQueueNums")
    check_queue_nums(config.write_queue_nums, f"topic {config.topic_name}: writeQueueNums")
    # Permission members are ints (an IntFlag); a bool is not a permission
    perm = config.perm
    name = config.topic_name
    if not isinstance(perm, int) or isinstance(perm, bool) or not 0 <= perm <= MAX_PERMISSION:
        raise InvalidMetadataError(
            f"topic {name}: perm must be in 0..{MAX_PERMISSION}, got {config.perm!r}"
        )
    if config.topic_filter_type not in TOPIC_FILTER_TYPES:
        raise InvalidMetadataError(
            f"topic {name}: topicFilterType must be one of {TOPIC_FILTER_TYPES}, "
            f"got {abbreviate(str(config.topic_filter_type))!r}"
        )
    if type(config.topic_sys_flag) is not int or not 0 <= config.topic_sys_flag <= INT32_MAX:
        raise InvalidMetadataError(
            f"topic {name}: topicSysFlag {config.topic_sys_flag!r} is out of range"
        )


@attrs.define(eq=False)
class TopicConfigManager(VersionedTable[TopicConfigSerializeWrapper, TopicConfig]):
    """``topics.json``: topic name -> ``TopicConfig``, with a DataVersion bumped on every change.

    ``auto_create`` is ``autoCreateTopicEnable``: whether TBW102 exists and may serve as the
    template of topics created on send. ``default_queue_nums`` is ``defaultTopicQueueNums``
    (TBW102's queues). ``broker_permission`` is ``brokerPermission``; it only changes what is
    registered with the name server (``registration_wrapper``)."""

    file_name: ClassVar[str] = TOPICS_JSON

    default_queue_nums: int = attrs.field(default=DEFAULT_TOPIC_QUEUE_NUMS, kw_only=True)
    auto_create: bool = attrs.field(default=True, kw_only=True)
    broker_permission: int = attrs.field(default=_READ_WRITE, kw_only=True)
    _system_topics: set[str] = attrs.field(factory=set, init=False)

    @classmethod
    def load(
        cls,
        config_dir: str | os.PathLike[str],
        *,
        default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        auto_create: bool = True,
        broker_permission: int = _READ_WRITE,
        clock: Callable[[], int] = now_ms,
    ) -> TopicConfigManager:
        """Read ``<config_dir>/topics.json`` (or its backup); an empty table at version 0 when
        there is none. Blocking. Raises ``MetadataLoadError`` if both copies are damaged."""
        check_queue_nums(default_queue_nums, "defaultTopicQueueNums")
        path = os.path.join(os.fspath(config_dir), cls.file_name)
        loaded = load_with_backup(path, decode_topics_json)
        if loaded is None:
            loaded = TopicConfigSerializeWrapper({}, DataVersion(0, clock()))
        return cls(
            path,
            dict(loaded.topic_config_table),
            loaded.data_version,
            clock=clock,
            default_queue_nums=default_queue_nums,
            auto_create=auto_create,
            broker_permission=broker_permission,
        )

    # -- reading

    def topic_names(self) -> list[str]:
        return sorted(self._table)

    def is_system_topic(self, topic: str) -> bool:
        """RocketMQ's ``TopicValidator.isSystemTopic``: one of RocketMQ's system topics, a
        ``rmq_sys_`` topic, or one that ``ensure_system_topics`` made (or would make) on this
        broker — its cluster's, its own, the trace and reply topics."""
        return (topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX)
                or topic in self._system_topics)

    def wrapper(self) -> TopicConfigSerializeWrapper:
        """The table and its version: ``topics.json`` and the GET_ALL_TOPIC_CONFIG body."""
        return self.snapshot()

    def registration_wrapper(self) -> TopicConfigSerializeWrapper:
        """What REGISTER_BROKER carries: ``wrapper()``, except that a broker whose permission is
        not read+write reports every topic with the broker's permission (and default filter
        type, flags and order, as RocketMQ's ``registerBrokerAll`` rebuilds them)."""
        wrapper = self.wrapper()
        perm = self.broker_permission
        if readable(perm) and writable(perm):
            return wrapper
        return TopicConfigSerializeWrapper(
            {
                name: TopicConfig(name, c.read_queue_nums, c.write_queue_nums, perm)
                for name, c in wrapper.topic_config_table.items()
            },
            wrapper.data_version,
        )

    # -- changing

    def ensure_system_topics(
        self,
        cluster_name: str,
        broker_name: str,
        *,
        cluster_topic_enable: bool = True,
        broker_topic_enable: bool = True,
        trace_topic: str | None = None,
    ) -> list[str]:
        """Add the topics RocketMQ's TopicConfigManager creates at startup, where missing (a
        loaded file's entry wins, as RocketMQ's ``putAll`` over its defaults): SELF_TEST_TOPIC;
        TBW102 when auto-creation is on (read+write+inherit, ``default_queue_nums`` queues);
        BenchmarkTest; the cluster-name topic (inherit, plus read+write with
        ``clusterTopicEnable``); the broker-name topic (1 queue, likewise with
        ``brokerTopicEnable``); OFFSET_MOVED_EVENT; SCHEDULE_TOPIC_XXXX (18 queues); the trace
        topic if given; ``<cluster>_REPLY_TOPIC``. Names outside the topic charset (a broker
        named after a dotted host name) are skipped with a warning. Bumps the DataVersion if
        anything was added; returns the names added."""
        rw = _READ_WRITE
        wanted = [TopicConfig(SELF_TEST_TOPIC, 1, 1)]
        if self.auto_create:
            n = self.default_queue_nums
            wanted.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, n, n, Permission.INHERIT | rw))
        n = BENCHMARK_TOPIC_QUEUE_NUMS
        wanted.append(TopicConfig(BENCHMARK_TOPIC, n, n))
        wanted.append(
            TopicConfig(cluster_name, perm=Permission.INHERIT | (rw if cluster_topic_enable else 0))
        )
        wanted.append(
            TopicConfig(broker_name, 1, 1, Permission.INHERIT | (rw if broker_topic_enable else 0))
        )
        wanted.append(TopicConfig(OFFSET_MOVED_EVENT_TOPIC, 1, 1))
        n = SCHEDULE_TOPIC_QUEUE_NUMS
        wanted.append(TopicConfig(SCHEDULE_TOPIC, n, n))
        if trace_topic is not None:
            wanted.append(TopicConfig(trace_topic, 1, 1))
        wanted.append(TopicConfig(f"{cluster_name}_{REPLY_TOPIC_POSTFIX}", 1, 1))

        added = []
        for config in wanted:
            name = config.topic_name
            if not is_valid_topic(name):
                log.warning("system topic %r is not a valid topic name; not created", name)
                continue
            self._system_topics.add(name)
            if name not in self._table:
                self._table[name] = config
                added.append(name)
        if added:
            self._bump()
        return added

    def create_or_update(self, config: TopicConfig) -> TopicConfig | None:
        """UPDATE_AND_CREATE_TOPIC: store ``config`` (validated, see ``validate_topic_config``)
        and bump the DataVersion. Returns the previous config, if any."""
        validate_topic_config(config)
        old = self._table.get(config.topic_name)
        self._table[config.topic_name] = config
        self._bump()
        log.info("%s topic config %s", "updated" if old else "created", config)
        return old

    def create_topic_in_send(
        self,
        topic: str,
        default_topic: str,
        queue_nums: int,
        *,
        topic_sys_flag: int = 0,
    ) -> TopicConfig | None:
        """A send to a topic this broker does not know (``createTopicInSendMessageMethod``).

        Returns the existing config if the topic exists. Otherwise the topic is created from
        the template ``default_topic`` (the producer's ``defaultTopic``, normally TBW102) when
        that topic exists and has the INHERIT perm — TBW102 never counts as inheritable while
        auto-creation is off — with min(``queue_nums``, the template's write queues) read and
        write queues, the template's perm without INHERIT and its filter type, and
        ``topic_sys_flag``; the DataVersion is bumped (the broker should then persist and
        re-register). Returns None when creation is not allowed (the caller answers
        TOPIC_NOT_EXIST). Raises ``ValueError`` for an invalid topic name."""
        check_topic(topic)
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        template = self._table.get(default_topic)
        if template is None:
            reason = f"default topic {default_topic!r} does not exist"
        elif default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create:
            reason = "autoCreateTopicEnable is off"
        elif not template.perm & Permission.INHERIT:
            reason = f"default topic {default_topic!r} has no inherit perm ({template.perm})"
        else:
            n = min(queue_nums, template.write_queue_nums, MAX_QUEUE_NUMS)
            if n >= 1:
                config = TopicConfig(
                    topic,
                    n,
                    n,
                    template.perm & ~int(Permission.INHERIT),  # keeps bits we do not know
                    template.topic_filter_type,
                    topic_sys_flag,
                )
                self._table[topic] = config
                self._bump()
                log.info("created topic %s (%d read, %d write queues, perm %d) from default "
                         "topic %s", config.topic_name, config.read_queue_nums,
                         config.write_queue_nums, config.perm, default_topic)
                return config
            reason = f"queue count {n} (requested {queue_nums}) is not positive"
        # Debug, not warning: any client can send to unknown topics as often as it likes, and
        # the TOPIC_NOT_EXIST answer already tells it.
        log.debug("cannot create topic %r on send: %s", topic, reason)
        return None

    def create_topic_in_send_back(
        self,
        topic: str,
        queue_nums: int,
        perm: int = _READ_WRITE,
        *,
        topic_sys_flag: int = 0,
    ) -> TopicConfig:
        """Retry / dead-letter topics (``createTopicInSendMessageBackMethod``): the existing
        config, or a new one with ``queue_nums`` queues and ``perm``, regardless of
        auto-creation. Bumps the DataVersion when it creates."""
        config = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
        validate_topic_config(config)
        existing = self._table.get(topic)
        if existing is not None:
            return existing
        self._table[topic] = config
        self._bump()
        log.info("created topic %s (%d read, %d write queues, perm %d)", config.topic_name,
                 config.read_queue_nums, config.write_queue_nums, config.perm)
        return config

    def set_broker_permission(self, perm: int) -> bool:
        """UPDATE_BROKER_CONFIG of ``brokerPermission``: what registrations report from now
        on. Bumps the DataVersion when it changes, so the name servers take the topics again
        (RocketMQ's ``updateBrokerConfig`` does the same). Returns whether it changed."""
        if perm == self.broker_permission:
            return False
        self.broker_permission = perm
        self._bump()
        return True

    def delete(self, topic: str) -> bool:
        """DELETE_TOPIC_IN_BROKER: remove the topic; bumps the DataVersion if it existed."""
        if self._table.pop(topic, None) is None:
            return False
        self._bump()
        log.info("deleted topic %s", topic)
        return True

    def replace_from_master(self, wrapper: TopicConfigSerializeWrapper) -> bool:
        """Slave sync (GET_ALL_TOPIC_CONFIG): if the master's DataVersion differs from ours,
        take its whole table and its version. Entries with a name outside the topic charset are
        dropped (they would name paths). Returns whether anything was replaced."""
        if wrapper.data_version == self._version:
            return False
        table = {}
        for name, config in wrapper.topic_config_table.items():
            if is_valid_topic(name) and config.topic_name == name:
                table[name] = config
            else:
                log.warning("ignoring topic %r from the master: invalid name", name)
        self._table = table
        self._version = wrapper.data_version
        self._dirty = True
        return True

    # -- persistence

    def snapshot(self) -> TopicConfigSerializeWrapper:
        return TopicConfigSerializeWrapper(dict(self._table), self._version)

    @staticmethod
    def encode_snapshot(snapshot: TopicConfigSerializeWrapper) -> bytes:
        return encode_topics_json(snapshot)
