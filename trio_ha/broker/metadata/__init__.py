"""The broker's metadata tables and their files under ``<storePathRootDir>/config/``.

Four tables, each a manager over one RocketMQ config file, one module each:

================================  =========================  ===================================
manager (module)                  file                       who changes it
================================  =========================  ===================================
``TopicConfigManager``            ``topics.json``            UPDATE_AND_CREATE_TOPIC, auto-create
(``topics``)                                                 on send, DELETE_TOPIC, slave sync
``ConsumerOffsetManager``         ``consumerOffset.json``    UPDATE_CONSUMER_OFFSET, pull commits,
(``consumer_offsets``)                                       slave sync (monotonic merge)
``SubscriptionGroupManager``      ``subscriptionGroup.json`` auto-create on pull, admin, slave sync
(``subscription_groups``)
``DelayOffsetManager``            ``delayOffset.json``       the schedule service, slave sync
(``delay_offsets``)
================================  =========================  ===================================

``BrokerMetadata`` (``broker_metadata``) holds the four. ``config_file`` is what they share: the
table lives on the event loop, and ``persist()`` writes a snapshot of it in a worker thread,
one write per file at a time, the newest last. ``files`` writes and reads RocketMQ's files
(atomically, with a ``.bak`` fallback); ``validation`` checks names and numbers. The bytes are
exactly what the ``trio_ha.wire.metadata`` encoders produce (fastjson's pretty layout, unquoted
integer keys), and files written by RocketMQ load here.
"""

from .broker_metadata import BrokerMetadata
from .consumer_offsets import DEFAULT_MAX_CONSUMER_OFFSETS, ConsumerOffsetManager
from .delay_offsets import DelayOffsetManager
from .files import CONFIG_DIR_NAME, MetadataLoadError, atomic_write, config_dir_of, load_with_backup
from .subscription_groups import (
    DEFAULT_MAX_AUTO_CREATED_PER_CLIENT,
    DEFAULT_MAX_SUBSCRIPTION_GROUPS,
    SYSTEM_CONSUMER_GROUPS,
    SubscriptionGroupManager,
)
from .topics import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    BENCHMARK_TOPIC,
    NOT_ALLOWED_SEND_TOPICS,
    OFFSET_MOVED_EVENT_TOPIC,
    SCHEDULE_TOPIC,
    SELF_TEST_TOPIC,
    SYSTEM_TOPICS,
    TopicConfigManager,
    validate_topic_config,
)
from .validation import (
    MAX_QUEUE_NUMS,
    InvalidMetadataError,
    MetadataLimitError,
    MetadataRequestError,
    group_problem,
    is_valid_group,
    topic_problem,
)

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "BENCHMARK_TOPIC",
    "CONFIG_DIR_NAME",
    "DEFAULT_MAX_AUTO_CREATED_PER_CLIENT",
    "DEFAULT_MAX_CONSUMER_OFFSETS",
    "DEFAULT_MAX_SUBSCRIPTION_GROUPS",
    "MAX_QUEUE_NUMS",
    "NOT_ALLOWED_SEND_TOPICS",
    "OFFSET_MOVED_EVENT_TOPIC",
    "SCHEDULE_TOPIC",
    "SELF_TEST_TOPIC",
    "SYSTEM_CONSUMER_GROUPS",
    "SYSTEM_TOPICS",
    "BrokerMetadata",
    "ConsumerOffsetManager",
    "DelayOffsetManager",
    "InvalidMetadataError",
    "MetadataLimitError",
    "MetadataLoadError",
    "MetadataRequestError",
    "SubscriptionGroupManager",
    "TopicConfigManager",
    "atomic_write",
    "config_dir_of",
    "group_problem",
    "is_valid_group",
    "load_with_backup",
    "topic_problem",
    "validate_topic_config",
]
