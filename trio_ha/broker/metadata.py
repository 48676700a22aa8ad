"""The broker's metadata tables and their files under ``<storePathRootDir>/config/``.

Four tables, each a small manager over one RocketMQ config file (reference §4.4):

================================  =========================  ===================================
manager                           file                       who changes it
================================  =========================  ===================================
``TopicConfigManager``            ``topics.json``            UPDATE_AND_CREATE_TOPIC, auto-create
                                                             on send, DELETE_TOPIC, slave sync
``ConsumerOffsetManager``         ``consumerOffset.json``    UPDATE_CONSUMER_OFFSET, pull commits,
                                                             slave sync (monotonic merge)
``SubscriptionGroupManager``      ``subscriptionGroup.json`` auto-create on pull, admin, slave sync
``DelayOffsetManager``            ``delayOffset.json``       the schedule service (not yet), sync
================================  =========================  ===================================

The managers are plain synchronous objects. The broker calls them from trio tasks and runs
``persist()`` in a worker thread (``trio.to_thread.run_sync(manager.persist)``), so each manager
guards its state with a ``threading.Lock``: ``persist()`` takes a snapshot under the lock and
encodes and writes outside it. A second lock serialises writers, so two overlapping
``persist()`` calls cannot interleave their files and the later snapshot is always written last.
Every manager has a ``dirty`` flag (set by any change, cleared by a successful persist) so the
broker can write only what changed, e.g. consumer offsets every ``flushConsumerOffsetInterval``.

Files are RocketMQ's: the bytes are exactly what the ``trio_ha.wire.metadata`` encoders produce
(fastjson's pretty layout, unquoted integer keys), and files written by RocketMQ load here.
``atomic_write`` keeps RocketMQ's order (content to ``<file>.tmp``, previous content to
``<file>.bak``, tmp renamed over the file) and adds the fsyncs RocketMQ lacks; ``load_with_backup``
falls back to ``<file>.bak`` as RocketMQ's ``ConfigManager.load`` does.

Slave synchronisation (reference §8): topics and subscription groups are replaced wholesale when
the master's DataVersion differs; consumer offsets are merged **monotonically** per queue, so a
master that restarted with older offsets cannot drag the slave's newer ones back (RocketMQ issue
#1094, where ``putAll`` did exactly that and consumers saw duplicates).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from trio_ha.store.consume_queue import is_valid_topic
from trio_ha.wire.metadata import (
    CONSUMER_OFFSET_JSON,
    DEFAULT_TOPIC_QUEUE_NUMS,
    DELAY_OFFSET_JSON,
    SUBSCRIPTION_GROUP_JSON,
    TOPICS_JSON,
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics_json,
    encode_consumer_offsets,
    encode_delay_offsets,
    encode_subscription_groups,
    encode_topics_json,
    offset_key,
)
from trio_ha.wire.route import (
    PERM_INHERIT,
    PERM_PRIORITY,
    PERM_READ,
    PERM_WRITE,
    TOPIC_FILTER_TYPES,
)

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "BENCHMARK_TOPIC",
    "CONFIG_DIR_NAME",
    "MAX_QUEUE_NUMS",
    "NOT_ALLOWED_SEND_TOPICS",
    "OFFSET_MOVED_EVENT_TOPIC",
    "SCHEDULE_TOPIC",
    "SELF_TEST_TOPIC",
    "SYSTEM_CONSUMER_GROUPS",
    "BrokerMetadata",
    "ConsumerOffsetManager",
    "DelayOffsetManager",
    "MetadataLoadError",
    "SubscriptionGroupManager",
    "TopicConfigManager",
    "atomic_write",
    "config_dir_of",
    "is_valid_group",
    "load_with_backup",
    "validate_topic_config",
]

log = logging.getLogger(__name__)

#: ``<storePathRootDir>/config``
CONFIG_DIR_NAME = "config"

#: the template topic of auto-creation (``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``)
AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
BENCHMARK_TOPIC = "BenchmarkTest"
OFFSET_MOVED_EVENT_TOPIC = "OFFSET_MOVED_EVENT"
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: ``<cluster>_REPLY_TOPIC`` (request/reply)
REPLY_TOPIC_POSTFIX = "REPLY_TOPIC"
#: queues of SCHEDULE_TOPIC_XXXX: one per delay level
SCHEDULE_TOPIC_QUEUE_NUMS = 18
#: topics a producer may not send to (``TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET``)
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        SCHEDULE_TOPIC,
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        SELF_TEST_TOPIC,
        OFFSET_MOVED_EVENT_TOPIC,
    }
)

#: upper bound on read/write queue numbers accepted by ``create_or_update`` (BenchmarkTest has
#: 1024; every queue is a directory and a file handle)
MAX_QUEUE_NUMS = 1024
_MAX_PERM = PERM_PRIORITY | PERM_READ | PERM_WRITE | PERM_INHERIT

#: groups RocketMQ's SubscriptionGroupManager creates at startup (``init()``)
SYSTEM_CONSUMER_GROUPS = (
    "TOOLS_CONSUMER",
    "FILTERSRV_CONSUMER",
    "SELF_TEST_C_GROUP",
    "CID_ONS-HTTP-PROXY",
    "CID_ONSAPI_PULL",
    "CID_ONSAPI_PERMISSION",
    "CID_ONSAPI_OWNER",
)
#: ``MixAll.isSysConsumerGroup``: created on demand even with auto-creation off
_SYS_GROUP_PREFIX = "CID_RMQ_SYS_"

#: RocketMQ's group charset (``Validators.checkGroup``: the topic charset, up to 255 characters)
_VALID_GROUP = re.compile(r"^[%|a-zA-Z0-9_-]{1,255}$")
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

T = TypeVar("T")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def config_dir_of(store_path_root_dir: str | os.PathLike) -> str:
    """``<storePathRootDir>/config``, where RocketMQ keeps the metadata files."""
    return os.path.join(os.fspath(store_path_root_dir), CONFIG_DIR_NAME)


def is_valid_group(group: str) -> bool:
    return type(group) is str and bool(_VALID_GROUP.match(group))


# ---- files -------------------------------------------------------------------------------------


class MetadataLoadError(Exception):
    """Neither a config file nor its ``.bak`` could be loaded. The message names both files and
    why each failed; the broker must not start with an empty table in place of a damaged one."""


def _tmp_path(path: str) -> str:
    return path + ".tmp"


def _bak_path(path: str) -> str:
    return path + ".bak"


def _write_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platforms that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError as exc:  # pragma: no cover - some file systems refuse fsync on a directory
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


def _read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


# The three steps of atomic_write, separate so tests can stop between them (a crash).


def _write_tmp(path: str, data: bytes) -> None:
    """Step 1: the new content to ``<path>.tmp``, fsync'ed. A ``.tmp`` left by a crash is
    simply overwritten (and never loaded)."""
    _write_synced(_tmp_path(path), data)


def _backup_previous(path: str) -> None:
    """Step 2: the current content to ``<path>.bak`` (through ``<path>.bak.tmp`` and a rename,
    so a crash here leaves the old ``.bak`` whole). An empty or missing current file is not
    backed up: it would only replace a useful ``.bak`` with nothing."""
    previous = _read_or_none(path)
    if not previous:
        return
    bak_tmp = _tmp_path(_bak_path(path))
    _write_synced(bak_tmp, previous)
    os.replace(bak_tmp, _bak_path(path))


def _install_tmp(path: str) -> None:
    """Step 3: rename ``<path>.tmp`` over ``<path>`` and fsync the directory. RocketMQ deletes
    the file first; ``os.replace`` is atomic on POSIX, so the file never goes missing."""
    os.replace(_tmp_path(path), path)
    _fsync_dir(os.path.dirname(path))


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Replace the file at ``path`` with ``data`` so that a crash at any point leaves either the
    old or the new content under ``path`` (and the previous content in ``<path>.bak``).

    RocketMQ's order (``MixAll.string2File``): content -> ``<path>.tmp``; previous content ->
    ``<path>.bak``; tmp renamed to ``<path>``; plus an fsync of each file written and of the
    directory after the rename. The directory must exist. Blocking: run it in a worker thread."""
    path = os.fspath(path)
    _write_tmp(path, data)
    _backup_previous(path)
    _install_tmp(path)


def load_with_backup(
    path: str | os.PathLike, decode: Callable[[bytes], T] | None = None
) -> T | bytes | None:
    """Read a config file as RocketMQ's ``ConfigManager.load`` does: the file if it is present,
    non-empty and decodes, else ``<path>.bak``.

    Returns ``decode(content)`` (the raw bytes when ``decode`` is None), or None when there is
    nothing to load (neither file exists, or they are empty — what a fresh broker or an
    interrupted first write leaves). A ``ValueError`` from ``decode`` (every wire decode error is
    one) or an ``OSError`` reading the file makes it "bad"; if the file is bad and the backup is
    missing, empty or bad too, ``MetadataLoadError`` names both files and both reasons (unlike
    RocketMQ, which then starts with an empty table and overwrites the damaged file later). A
    ``<path>.tmp`` is never read: it may be a half-written file of a crashed write."""
    path = os.fspath(path)
    failures: list[str] = []
    damaged = False
    for candidate in (path, _bak_path(path)):
        try:
            data = _read_or_none(candidate)
        except OSError as exc:
            failures.append(f"{candidate}: cannot read: {exc}")
            damaged = True
            continue
        if data is None:
            failures.append(f"{candidate}: missing")
            continue
        if not data.strip():
            failures.append(f"{candidate}: empty")
            continue
        try:
            value = data if decode is None else decode(data)
        except ValueError as exc:
            failures.append(f"{candidate}: {exc}")
            damaged = True
            continue
        if candidate != path:
            log.warning("loaded %s from its backup (%s)", path, failures[0])
        return value
    if not damaged:
        return None
    raise MetadataLoadError(f"cannot load {path} or its backup: " + "; ".join(failures))


class _ConfigFile:
    """Shared plumbing: a file path, the state lock, the writer lock and the dirty flag.
    Subclasses implement ``_snapshot_locked()`` (cheap copies, under the lock) and
    ``_encode(snapshot)`` (outside it)."""

    file_name: str

    def __init__(self, config_dir: str | os.PathLike) -> None:
        self.config_dir = os.fspath(config_dir)
        self.path = os.path.join(self.config_dir, self.file_name)
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._dirty = False

    @property
    def dirty(self) -> bool:
        """True when the table changed since it was loaded or last persisted."""
        return self._dirty

    def _snapshot_locked(self) -> Any:
        raise NotImplementedError

    def _encode(self, snapshot: Any) -> bytes:
        raise NotImplementedError

    def encode(self) -> bytes:
        """The file's bytes for the current table (what ``persist()`` writes)."""
        with self._lock:
            snapshot = self._snapshot_locked()
        return self._encode(snapshot)

    def persist(self) -> None:
        """Write the table to its file (atomically; blocking — call it in a worker thread).
        Clears ``dirty``; on failure ``dirty`` is set again and the error propagates."""
        with self._write_lock:
            with self._lock:
                snapshot = self._snapshot_locked()
                self._dirty = False
            try:
                data = self._encode(snapshot)
                os.makedirs(self.config_dir, exist_ok=True)
                atomic_write(self.path, data)
            except BaseException:
                with self._lock:
                    self._dirty = True
                raise

    def persist_if_dirty(self) -> bool:
        """``persist()`` if anything changed; returns whether it wrote."""
        if not self._dirty:
            return False
        self.persist()
        return True


# ---- topics.json -------------------------------------------------------------------------------


def _check_queue_nums(value: Any, what: str) -> None:
    if type(value) is not int or not 1 <= value <= MAX_QUEUE_NUMS:
        raise ValueError(f"{what} must be an integer in 1..{MAX_QUEUE_NUMS}, got {value!r}")


def _check_topic(topic: Any) -> None:
    if type(topic) is not str or not is_valid_topic(topic):
        raise ValueError(
            f"invalid topic name {topic!r}: 1-127 characters from [%|a-zA-Z0-9_-] required"
        )


def validate_topic_config(config: TopicConfig) -> None:
    """Raise ``ValueError`` with a clear message unless ``config`` is acceptable for
    ``create_or_update``: a valid name, 1..MAX_QUEUE_NUMS queues, perm within the four bits,
    a known filter type."""
    _check_topic(config.topic_name)
    _check_queue_nums(config.read_queue_nums, f"topic {config.topic_name}: readQueueNums")
    _check_queue_nums(config.write_queue_nums, f"topic {config.topic_name}: writeQueueNums")
    if type(config.perm) is not int or not 0 <= config.perm <= _MAX_PERM:
        raise ValueError(f"topic {config.topic_name}: perm must be in 0..{_MAX_PERM}, "
                         f"got {config.perm!r}")
    if config.topic_filter_type not in TOPIC_FILTER_TYPES:
        raise ValueError(f"topic {config.topic_name}: topicFilterType must be one of "
                         f"{TOPIC_FILTER_TYPES}, got {config.topic_filter_type!r}")
    if type(config.topic_sys_flag) is not int or not 0 <= config.topic_sys_flag <= _INT32_MAX:
        raise ValueError(f"topic {config.topic_name}: topicSysFlag {config.topic_sys_flag!r} "
                         "is out of range")


class _VersionedTable(_ConfigFile):
    """A config file holding a name-keyed table with a DataVersion that rises on change."""

    _table: dict
    _version: DataVersion
    _clock: Callable[[], int]

    def _bump_locked(self) -> None:
        self._version = self._version.next_version(self._clock())
        self._dirty = True

    @property
    def data_version(self) -> DataVersion:
        return self._version

    def get(self, name: str):
        with self._lock:
            return self._table.get(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._table


class TopicConfigManager(_VersionedTable):
    """``topics.json``: topic name -> ``TopicConfig``, with a DataVersion bumped on every change
    (the name server and slaves compare it to decide whether to take the table).

    ``auto_create`` is ``autoCreateTopicEnable``: whether TBW102 exists and may serve as the
    template of topics created on send. ``default_queue_nums`` is ``defaultTopicQueueNums``
    (TBW102's queues). ``broker_permission`` is ``brokerPermission``; it only changes what is
    registered with the name server (``registration_wrapper``). ``clock`` gives milliseconds for
    DataVersion timestamps."""

    file_name = TOPICS_JSON

    def __init__(
        self,
        config_dir: str | os.PathLike,
        *,
        default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        auto_create: bool = True,
        broker_permission: int = PERM_READ | PERM_WRITE,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        super().__init__(config_dir)
        _check_queue_nums(default_queue_nums, "defaultTopicQueueNums")
        self.default_queue_nums = default_queue_nums
        self.auto_create = auto_create
        self.broker_permission = broker_permission
        self._clock = clock
        self._system_topics: set[str] = set()
        loaded = load_with_backup(self.path, decode_topics_json)
        if loaded is None:
            self._table: dict[str, TopicConfig] = {}
            self._version = DataVersion(0, clock())
        else:
            self._table = dict(loaded.topic_config_table)
            self._version = loaded.data_version

    # -- reading

    def topic_names(self) -> list[str]:
        with self._lock:
            return sorted(self._table)

    def is_system_topic(self, topic: str) -> bool:
        """One of the topics ``ensure_system_topics`` made (or would make) on this broker."""
        return topic in self._system_topics

    def wrapper(self) -> TopicConfigSerializeWrapper:
        """The table and its version: ``topics.json`` and the GET_ALL_TOPIC_CONFIG body."""
        with self._lock:
            return TopicConfigSerializeWrapper(dict(self._table), self._version)

    def registration_wrapper(self) -> TopicConfigSerializeWrapper:
        """What REGISTER_BROKER carries: ``wrapper()``, except that a broker whose permission is
        not read+write reports every topic with the broker's permission (and default filter
        type, flags and order, as RocketMQ's ``registerBrokerAll`` rebuilds them)."""
        wrapper = self.wrapper()
        perm = self.broker_permission
        if perm & PERM_READ and perm & PERM_WRITE:
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
        rw = PERM_READ | PERM_WRITE
        wanted = [TopicConfig(SELF_TEST_TOPIC, 1, 1)]
        if self.auto_create:
            n = self.default_queue_nums
            wanted.append(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, n, n, PERM_INHERIT | rw))
        wanted.append(TopicConfig(BENCHMARK_TOPIC, 1024, 1024))
        wanted.append(
            TopicConfig(cluster_name, perm=PERM_INHERIT | (rw if cluster_topic_enable else 0))
        )
        wanted.append(
            TopicConfig(broker_name, 1, 1, PERM_INHERIT | (rw if broker_topic_enable else 0))
        )
        wanted.append(TopicConfig(OFFSET_MOVED_EVENT_TOPIC, 1, 1))
        n = SCHEDULE_TOPIC_QUEUE_NUMS
        wanted.append(TopicConfig(SCHEDULE_TOPIC, n, n))
        if trace_topic is not None:
            wanted.append(TopicConfig(trace_topic, 1, 1))
        wanted.append(TopicConfig(f"{cluster_name}_{REPLY_TOPIC_POSTFIX}", 1, 1))

        added = []
        with self._lock:
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
                self._bump_locked()
        return added

    def create_or_update(self, config: TopicConfig) -> TopicConfig | None:
        """UPDATE_AND_CREATE_TOPIC: store ``config`` (validated, see ``validate_topic_config``)
        and bump the DataVersion. Returns the previous config, if any."""
        validate_topic_config(config)
        with self._lock:
            old = self._table.get(config.topic_name)
            self._table[config.topic_name] = config
            self._bump_locked()
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
        _check_topic(topic)
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            template = self._table.get(default_topic)
            if template is None:
                reason = f"default topic {default_topic!r} does not exist"
            elif default_topic == AUTO_CREATE_TOPIC_KEY_TOPIC and not self.auto_create:
                reason = "autoCreateTopicEnable is off"
            elif not template.perm & PERM_INHERIT:
                reason = f"default topic {default_topic!r} has no inherit perm ({template.perm})"
            else:
                n = min(queue_nums, template.write_queue_nums, MAX_QUEUE_NUMS)
                if n < 1:
                    reason = f"queue count {n} (requested {queue_nums}) is not positive"
                else:
                    config = TopicConfig(
                        topic,
                        n,
                        n,
                        template.perm & ~PERM_INHERIT,
                        template.topic_filter_type,
                        topic_sys_flag,
                    )
                    self._table[topic] = config
                    self._bump_locked()
                    reason = None
        if reason is not None:
            log.warning("cannot create topic %r on send: %s", topic, reason)
            return None
        log.info("created topic %s from default topic %s", config, default_topic)
        return config

    def create_topic_in_send_back(
        self,
        topic: str,
        queue_nums: int,
        perm: int = PERM_READ | PERM_WRITE,
        *,
        topic_sys_flag: int = 0,
    ) -> TopicConfig:
        """Retry / dead-letter topics (``createTopicInSendMessageBackMethod``): the existing
        config, or a new one with ``queue_nums`` queues and ``perm``, regardless of
        auto-creation. Bumps the DataVersion when it creates."""
        config = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
        validate_topic_config(config)
        with self._lock:
            existing = self._table.get(topic)
            if existing is not None:
                return existing
            self._table[topic] = config
            self._bump_locked()
        log.info("created topic %s", config)
        return config

    def delete(self, topic: str) -> bool:
        """DELETE_TOPIC_IN_BROKER: remove the topic; bumps the DataVersion if it existed."""
        with self._lock:
            if self._table.pop(topic, None) is None:
                return False
            self._bump_locked()
        log.info("deleted topic %s", topic)
        return True

    def replace_from_master(self, wrapper: TopicConfigSerializeWrapper) -> bool:
        """Slave sync (GET_ALL_TOPIC_CONFIG): if the master's DataVersion differs from ours,
        take its whole table and its version. Entries with a name outside the topic charset are
        dropped (they would name paths). Returns whether anything was replaced."""
        table = {}
        for name, config in wrapper.topic_config_table.items():
            if is_valid_topic(name) and config.topic_name == name:
                table[name] = config
            else:
                log.warning("ignoring topic %r from the master: invalid name", name)
        with self._lock:
            if wrapper.data_version == self._version:
                return False
            self._table = table
            self._version = wrapper.data_version
            self._dirty = True
        return True

    # -- persistence

    def _snapshot_locked(self) -> TopicConfigSerializeWrapper:
        return TopicConfigSerializeWrapper(dict(self._table), self._version)

    def _encode(self, snapshot: TopicConfigSerializeWrapper) -> bytes:
        return encode_topics_json(snapshot)


# ---- consumerOffset.json -----------------------------------------------------------------------


def _check_group(group: Any) -> None:
    if not is_valid_group(group):
        raise ValueError(
            f"invalid consumer group name {group!r}: 1-255 characters from [%|a-zA-Z0-9_-] "
            "required"
        )


def _check_queue_id(queue_id: Any) -> None:
    if type(queue_id) is not int or not 0 <= queue_id <= _INT32_MAX:
        raise ValueError(f"queue id must be an integer in 0..{_INT32_MAX}, got {queue_id!r}")


def _check_offset(offset: Any, what: str = "offset") -> None:
    if type(offset) is not int or not 0 <= offset <= _INT64_MAX:
        raise ValueError(f"{what} must be a non-negative 64-bit integer, got {offset!r}")


def _split_key(key: str) -> tuple[str, str] | None:
    parts = key.split("@")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


class ConsumerOffsetManager(_ConfigFile):
    """``consumerOffset.json``: ``"<topic>@<group>"`` -> queue id -> the next offset the group
    will consume. ``commit`` takes whatever the consumer says (it may move back: an offset
    reset); only ``merge_from_master`` is monotonic."""

    file_name = CONSUMER_OFFSET_JSON

    def __init__(self, config_dir: str | os.PathLike) -> None:
        super().__init__(config_dir)
        loaded = load_with_backup(self.path, decode_consumer_offsets)
        if loaded is None:
            self._table: dict[str, dict[int, int]] = {}
            self._version: DataVersion | None = None
        else:
            self._table = {key: dict(queues) for key, queues in loaded.offset_table.items()}
            self._version = loaded.data_version

    @property
    def data_version(self) -> DataVersion | None:
        """5.x's DataVersion of the table, kept when loaded or adopted from the master; None
        (and not written) otherwise, as 4.9."""
        return self._version

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """UPDATE_CONSUMER_OFFSET / a pull's commit offset. Raises ``ValueError`` for an invalid
        group, topic, queue id or a negative offset."""
        _check_group(group)
        _check_topic(topic)
        _check_queue_id(queue_id)
        _check_offset(offset)
        key = offset_key(topic, group)
        with self._lock:
            queues = self._table.get(key)
            if queues is None:
                queues = self._table[key] = {}
            if queues.get(queue_id) != offset:
                queues[queue_id] = offset
                self._dirty = True

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """QUERY_CONSUMER_OFFSET: the committed offset, or None when the group never committed
        one for this queue (the processor then decides between 0 and QUERY_NOT_FOUND)."""
        with self._lock:
            queues = self._table.get(offset_key(topic, group))
            return None if queues is None else queues.get(queue_id)

    def offsets_of_group(self, group: str) -> dict[str, dict[int, int]]:
        """Every topic the group committed offsets for: topic -> queue id -> offset (copies)."""
        out = {}
        with self._lock:
            for key, queues in self._table.items():
                split = _split_key(key)
                if split is not None and split[1] == group:
                    out[split[0]] = dict(queues)
        return out

    def remove_group(self, group: str) -> int:
        """Forget every offset of ``group`` (deleting a subscription group with offsets);
        returns how many topics were removed."""
        with self._lock:
            keys = [k for k in self._table if (_split_key(k) or ("", ""))[1] == group]
            for key in keys:
                del self._table[key]
            if keys:
                self._dirty = True
        return len(keys)

    def table(self) -> ConsumerOffsetTable:
        """A copy of the whole table: ``consumerOffset.json`` and the GET_ALL_CONSUMER_OFFSET
        body."""
        with self._lock:
            return self._snapshot_locked()

    def merge_from_master(self, table: ConsumerOffsetTable) -> int:
        """Slave sync (GET_ALL_CONSUMER_OFFSET). Like RocketMQ's ``putAll`` it adds what the
        master has and keeps what only we have, but per queue it never moves an offset
        backwards: after a master restart its offsets may be older than ours (consumers
        committed to this slave meanwhile), and taking them would re-deliver messages
        (RocketMQ #1094). Keys that are not ``<topic>@<group>`` and negative offsets are
        ignored. Adopts the master's DataVersion when it has one (5.x). Returns the number of
        queue offsets that were added or advanced."""
        changed = 0
        with self._lock:
            for key, queues in table.offset_table.items():
                if _split_key(key) is None:
                    log.warning("ignoring offset table key %r from the master", key)
                    continue
                mine = self._table.get(key)
                for queue_id, offset in queues.items():
                    if offset < 0 or queue_id < 0:
                        continue
                    if mine is None:
                        mine = self._table[key] = {}
                    current = mine.get(queue_id)
                    if current is None or offset > current:
                        mine[queue_id] = offset
                        changed += 1
            if table.data_version is not None and table.data_version != self._version:
                self._version = table.data_version
                self._dirty = True
            if changed:
                self._dirty = True
        return changed

    def _snapshot_locked(self) -> ConsumerOffsetTable:
        return ConsumerOffsetTable(
            {key: dict(queues) for key, queues in self._table.items()}, self._version
        )

    def _encode(self, snapshot: ConsumerOffsetTable) -> bytes:
        return encode_consumer_offsets(snapshot)


# ---- subscriptionGroup.json --------------------------------------------------------------------


class SubscriptionGroupManager(_VersionedTable):
    """``subscriptionGroup.json``: group name -> ``SubscriptionGroupConfig`` (RocketMQ 4.9
    defaults: consume enabled, from min, broadcast allowed, 1 retry queue, 16 retries, broker 0,
    slow-consume broker 1), with a DataVersion bumped on every change. RocketMQ's system groups
    are added at startup where the file lacks them. ``auto_create`` is
    ``autoCreateSubscriptionGroup``."""

    file_name = SUBSCRIPTION_GROUP_JSON

    def __init__(
        self,
        config_dir: str | os.PathLike,
        *,
        auto_create: bool = True,
        clock: Callable[[], int] = _now_ms,
    ) -> None:
        super().__init__(config_dir)
        self.auto_create = auto_create
        self._clock = clock
        loaded = load_with_backup(self.path, decode_subscription_groups)
        if loaded is None:
            self._table: dict[str, SubscriptionGroupConfig] = {}
            self._version = DataVersion(0, clock())
        else:
            self._table = dict(loaded.subscription_group_table)
            self._version = loaded.data_version
        added = False
        for name in SYSTEM_CONSUMER_GROUPS:
            if name not in self._table:
                self._table[name] = SubscriptionGroupConfig(name)
                added = True
        if added:
            self._bump_locked()

    def find_or_create(self, group: str) -> SubscriptionGroupConfig | None:
        """``findSubscriptionGroupConfig``: the group's config; a missing group is created with
        the defaults when auto-creation is on or the name starts with ``CID_RMQ_SYS_`` (bumping
        the DataVersion), else None (the caller answers SUBSCRIPTION_GROUP_NOT_EXIST). Raises
        ``ValueError`` for a name outside RocketMQ's group charset."""
        _check_group(group)
        with self._lock:
            config = self._table.get(group)
            if config is not None:
                return config
            if not (self.auto_create or group.startswith(_SYS_GROUP_PREFIX)):
                return None
            config = self._table[group] = SubscriptionGroupConfig(group)
            self._bump_locked()
        log.info("auto-created subscription group %s", group)
        return config

    def update(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig | None:
        """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: store ``config``, bump the DataVersion; returns
        the previous config, if any."""
        _check_group(config.group_name)
        if not 0 <= config.retry_queue_nums <= MAX_QUEUE_NUMS:
            raise ValueError(f"group {config.group_name}: retryQueueNums must be in "
                             f"0..{MAX_QUEUE_NUMS}, got {config.retry_queue_nums}")
        with self._lock:
            old = self._table.get(config.group_name)
            self._table[config.group_name] = config
            self._bump_locked()
        return old

    def delete(self, group: str) -> bool:
        """DELETE_SUBSCRIPTIONGROUP: bumps the DataVersion if the group existed."""
        with self._lock:
            if self._table.pop(group, None) is None:
                return False
            self._bump_locked()
        return True

    def wrapper(self) -> SubscriptionGroupWrapper:
        """``subscriptionGroup.json`` and the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body."""
        with self._lock:
            return self._snapshot_locked()

    def replace_from_master(self, wrapper: SubscriptionGroupWrapper) -> bool:
        """Slave sync: take the master's table and version if its DataVersion differs."""
        with self._lock:
            if wrapper.data_version == self._version:
                return False
            self._table = dict(wrapper.subscription_group_table)
            self._version = wrapper.data_version
            self._dirty = True
        return True

    def _snapshot_locked(self) -> SubscriptionGroupWrapper:
        return SubscriptionGroupWrapper(dict(self._table), self._version)

    def _encode(self, snapshot: SubscriptionGroupWrapper) -> bytes:
        return encode_subscription_groups(snapshot)


# ---- delayOffset.json --------------------------------------------------------------------------


class DelayOffsetManager(_ConfigFile):
    """``delayOffset.json``: delay level -> progress in SCHEDULE_TOPIC_XXXX's queue (level - 1).
    Nothing schedules delayed messages yet; the table is kept so it round-trips and a slave
    can mirror its master's."""

    file_name = DELAY_OFFSET_JSON

    def __init__(self, config_dir: str | os.PathLike) -> None:
        super().__init__(config_dir)
        loaded = load_with_backup(self.path, decode_delay_offsets)
        if loaded is None:
            loaded = DelayOffsetTable()
        self._table: dict[int, int] = dict(loaded.offset_table)
        self._version: DataVersion | None = loaded.data_version

    def get(self, level: int) -> int | None:
        with self._lock:
            return self._table.get(level)

    def update(self, level: int, offset: int) -> None:
        if type(level) is not int or not 1 <= level <= _INT32_MAX:
            raise ValueError(f"delay level must be a positive integer, got {level!r}")
        _check_offset(offset)
        with self._lock:
            if self._table.get(level) != offset:
                self._table[level] = offset
                self._dirty = True

    def table(self) -> DelayOffsetTable:
        """A copy: ``delayOffset.json`` and the GET_ALL_DELAY_OFFSET body."""
        with self._lock:
            return self._snapshot_locked()

    def replace_from_master(self, table: DelayOffsetTable) -> bool:
        """Slave sync (GET_ALL_DELAY_OFFSET): RocketMQ writes the master's body verbatim, i.e.
        takes its table. Returns whether anything changed."""
        with self._lock:
            if table.offset_table == self._table and table.data_version == self._version:
                return False
            self._table = dict(table.offset_table)
            self._version = table.data_version
            self._dirty = True
        return True

    def _snapshot_locked(self) -> DelayOffsetTable:
        return DelayOffsetTable(dict(self._table), self._version)

    def _encode(self, snapshot: DelayOffsetTable) -> bytes:
        return encode_delay_offsets(snapshot)


# ---- the facade --------------------------------------------------------------------------------


class BrokerMetadata:
    """The four tables of one broker. ``load`` reads them (blocking: at startup, or in a worker
    thread); ``persist_all`` / ``persist_dirty`` write them (blocking: in a worker thread)."""

    def __init__(
        self,
        topics: TopicConfigManager,
        offsets: ConsumerOffsetManager,
        subscriptions: SubscriptionGroupManager,
        delay_offsets: DelayOffsetManager,
    ) -> None:
        self.topics = topics
        self.offsets = offsets
        self.subscriptions = subscriptions
        self.delay_offsets = delay_offsets

    @classmethod
    def load(
        cls,
        config_dir: str | os.PathLike,
        *,
        default_queue_nums: int = DEFAULT_TOPIC_QUEUE_NUMS,
        auto_create_topic: bool = True,
        auto_create_subscription_group: bool = True,
        broker_permission: int = PERM_READ | PERM_WRITE,
        clock: Callable[[], int] = _now_ms,
    ) -> BrokerMetadata:
        """Load every table from ``config_dir`` (``config_dir_of(storePathRootDir)``); missing
        files give empty tables. Raises ``MetadataLoadError`` if a file and its backup are both
        damaged. System topics are not added here: call ``topics.ensure_system_topics``."""
        return cls(
            TopicConfigManager(
                config_dir,
                default_queue_nums=default_queue_nums,
                auto_create=auto_create_topic,
                broker_permission=broker_permission,
                clock=clock,
            ),
            ConsumerOffsetManager(config_dir),
            SubscriptionGroupManager(
                config_dir, auto_create=auto_create_subscription_group, clock=clock
            ),
            DelayOffsetManager(config_dir),
        )

    def managers(self) -> tuple[_ConfigFile, ...]:
        return (self.topics, self.offsets, self.subscriptions, self.delay_offsets)

    def persist_all(self) -> None:
        """Write all four files (shutdown). Every file is attempted; the first error is raised
        after the others were written."""
        self._persist(only_dirty=False)

    def persist_dirty(self) -> list[str]:
        """Write the files whose tables changed; returns their names."""
        return self._persist(only_dirty=True)

    def _persist(self, *, only_dirty: bool) -> list[str]:
        written: list[str] = []
        error: BaseException | None = None
        for manager in self.managers():
            if only_dirty and not manager.dirty:
                continue
            try:
                manager.persist()
            except Exception as exc:
                log.error("cannot persist %s: %s", manager.path, exc)
                error = error or exc
            else:
                written.append(manager.file_name)
        if error is not None:
            raise error
        return written
