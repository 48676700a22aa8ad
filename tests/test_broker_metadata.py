"""Broker metadata: the four config tables, their files, auto-creation and slave sync, and
persisting snapshots from the event loop."""

# The tests read back what they have just put into a table: a None there fails the test anyway.
# pyright: reportOptionalMemberAccess=false

import functools
import os
import threading

import pytest
import trio
import trio.testing

from trio_ha.broker.metadata import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    SYSTEM_CONSUMER_GROUPS,
    BrokerMetadata,
    ConsumerOffsetManager,
    DelayOffsetManager,
    InvalidMetadataError,
    MetadataLimitError,
    MetadataLoadError,
    SubscriptionGroupManager,
    TopicConfigManager,
    atomic_write,
    config_dir_of,
    config_file,
    load_with_backup,
)
from trio_ha.broker.metadata.files import backup_previous, install_tmp, write_tmp
from trio_ha.broker.slave_sync import sync_from_master
from trio_ha.remoting import open_client_pool, serve_remoting
from trio_ha.wire.metadata import (
    ConsumerOffsetTable,
    DataVersion,
    DelayOffsetTable,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    decode_topics_json,
    encode_consumer_offsets,
    encode_delay_offsets,
    encode_subscription_groups,
    encode_topics_json,
)
from trio_ha.wire.permission import Permission
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

RW = Permission.READ | Permission.WRITE


class Clock:
    """Milliseconds that advance by 1 on every call."""

    def __init__(self, start: int = 1_700_000_000_000) -> None:
        self.now = start

    def __call__(self) -> int:
        self.now += 1
        return self.now


@pytest.fixture
def cfg(tmp_path):
    path = tmp_path / "config"
    path.mkdir()
    return str(path)


def read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def write(path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


# ---- RocketMQ-format samples (fastjson PrettyFormat: tabs, sorted fields, bare int keys) ---------

TOPICS_SAMPLE = (
    b'{\n\t"dataVersion":{\n\t\t"counter":3,\n\t\t"timestamp":1700000000123\n\t},\n'
    b'\t"topicConfigTable":{\n'
    b'\t\t"TBW102":{\n\t\t\t"order":false,\n\t\t\t"perm":7,\n\t\t\t"readQueueNums":8,\n'
    b'\t\t\t"topicFilterType":"SINGLE_TAG",\n\t\t\t"topicName":"TBW102",\n'
    b'\t\t\t"topicSysFlag":0,\n\t\t\t"writeQueueNums":8\n\t\t},\n'
    b'\t\t"orders":{\n\t\t\t"order":true,\n\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,\n'
    b'\t\t\t"topicFilterType":"MULTI_TAG",\n\t\t\t"topicName":"orders",\n'
    b'\t\t\t"topicSysFlag":0,\n\t\t\t"writeQueueNums":2\n\t\t}\n'
    b"\t}\n}"
)

OFFSETS_SAMPLE = (
    b'{\n\t"offsetTable":{\n'
    b'\t\t"%RETRY%cg1@cg1":{0:0\n\t\t},\n'
    b'\t\t"orders@cg1":{0:123,1:456,2:7\n\t\t}\n'
    b"\t}\n}"
)

DELAY_SAMPLE = b'{\n\t"offsetTable":{1:0,2:17,3:5\n\t}\n}'

GROUPS_SAMPLE = (
    b'{\n\t"dataVersion":{\n\t\t"counter":9,\n\t\t"timestamp":1700000000999\n\t},\n'
    b'\t"subscriptionGroupTable":{\n'
    b'\t\t"cg1":{\n\t\t\t"brokerId":0,\n\t\t\t"consumeBroadcastEnable":true,\n'
    b'\t\t\t"consumeEnable":false,\n\t\t\t"consumeFromMinEnable":true,\n'
    b'\t\t\t"groupName":"cg1",\n\t\t\t"notifyConsumerIdsChangedEnable":true,\n'
    b'\t\t\t"retryMaxTimes":3,\n\t\t\t"retryQueueNums":1,\n'
    b'\t\t\t"whichBrokerWhenConsumeSlowly":1\n\t\t}\n'
    b"\t}\n}"
)


# ---- atomic_write / load_with_backup -------------------------------------------------------------


def test_atomic_write_keeps_previous_content_as_bak(cfg):
    path = os.path.join(cfg, "x.json")
    atomic_write(path, b"one")
    assert read(path) == b"one"
    assert not os.path.exists(path + ".bak")
    atomic_write(path, b"two")
    assert read(path) == b"two"
    assert read(path + ".bak") == b"one"
    atomic_write(path, b"three")
    assert (read(path), read(path + ".bak")) == (b"three", b"two")
    assert sorted(os.listdir(cfg)) == ["x.json", "x.json.bak"]


@pytest.mark.parametrize("steps", [1, 2])
def test_crash_between_steps_leaves_old_content_and_tmp_is_ignored(cfg, steps):
    path = os.path.join(cfg, "x.json")
    atomic_write(path, b"old")
    write_tmp(path, b"new")  # crash after step 1 ...
    if steps == 2:
        backup_previous(path)  # ... or after step 2
        assert read(path + ".bak") == b"old"
    assert os.path.exists(path + ".tmp")
    assert load_with_backup(path) == b"old"
    # the next write simply overwrites the stale tmp
    atomic_write(path, b"newer")
    assert load_with_backup(path) == b"newer"
    assert not os.path.exists(path + ".tmp")
    write_tmp(path, b"last")
    backup_previous(path)
    install_tmp(path)
    assert (read(path), read(path + ".bak")) == (b"last", b"newer")


def test_half_written_tmp_never_loaded(cfg):
    path = os.path.join(cfg, "topics.json")
    write(path + ".tmp", TOPICS_SAMPLE[:40])  # a crash mid-write of the very first file
    assert load_with_backup(path, decode_topics_json) is None
    assert TopicConfigManager.load(cfg).topic_names() == []


@pytest.mark.parametrize(
    "main",
    [None, b"", b"  \n", b"{garbage", TOPICS_SAMPLE[: len(TOPICS_SAMPLE) // 2], b"\xff\xfe"],
    ids=["missing", "empty", "blank", "garbage", "truncated", "not-utf8"],
)
def test_load_falls_back_to_bak(cfg, main):
    path = os.path.join(cfg, "topics.json")
    write(path + ".bak", TOPICS_SAMPLE)
    if main is not None:
        write(path, main)
    wrapper = load_with_backup(path, decode_topics_json)
    assert wrapper.data_version == DataVersion(3, 1700000000123)
    manager = TopicConfigManager.load(cfg)
    assert manager.get("orders").write_queue_nums == 2
    assert manager.data_version.counter == 3


def test_load_nothing_gives_none(cfg):
    path = os.path.join(cfg, "topics.json")
    assert load_with_backup(path, decode_topics_json) is None
    write(path, b"")
    assert load_with_backup(path, decode_topics_json) is None


@pytest.mark.parametrize("bak", [None, b"", b"[1,2"], ids=["missing", "empty", "garbage"])
def test_load_both_bad_raises_naming_files(cfg, bak):
    path = os.path.join(cfg, "consumerOffset.json")
    write(path, b'{"offsetTable":{"a@b":{0:')
    if bak is not None:
        write(path + ".bak", bak)
    with pytest.raises(MetadataLoadError) as info:
        ConsumerOffsetManager.load(cfg)
    message = str(info.value)
    assert path in message and path + ".bak" in message


# ---- RocketMQ samples, round trips, byte identity ------------------------------------------------


async def test_rocketmq_samples_parse_and_persist_byte_identical(cfg):
    for name, sample in [
        ("topics.json", TOPICS_SAMPLE),
        ("consumerOffset.json", OFFSETS_SAMPLE),
        ("delayOffset.json", DELAY_SAMPLE),
    ]:
        write(os.path.join(cfg, name), sample)
    write(os.path.join(cfg, "subscriptionGroup.json"), GROUPS_SAMPLE)
    md = BrokerMetadata.load(cfg)

    topics = md.topics
    assert topics.data_version == DataVersion(3, 1700000000123)
    assert topics.get("orders") == TopicConfig("orders", 4, 2, RW, "MULTI_TAG", 0, True)
    assert topics.get(AUTO_CREATE_TOPIC_KEY_TOPIC).perm == Permission.INHERIT | RW
    assert md.offsets.query("cg1", "orders", 1) == 456  # unquoted numeric keys
    assert md.offsets.query("cg1", "%RETRY%cg1", 0) == 0
    assert md.offsets.query("cg1", "orders", 3) is None
    assert md.offsets.offsets_of_group("cg1") == {"orders": {0: 123, 1: 456, 2: 7},
                                                   "%RETRY%cg1": {0: 0}}
    assert md.delay_offsets.get(2) == 17
    assert md.subscriptions.get("cg1").consume_enable is False
    assert md.subscriptions.get("cg1").retry_max_times == 3

    # nothing changed in these three: persisting reproduces RocketMQ's bytes exactly
    assert not (md.topics.dirty or md.offsets.dirty or md.delay_offsets.dirty)
    await md.persist_all()
    assert read(os.path.join(cfg, "topics.json")) == TOPICS_SAMPLE
    assert read(os.path.join(cfg, "consumerOffset.json")) == OFFSETS_SAMPLE
    assert read(os.path.join(cfg, "delayOffset.json")) == DELAY_SAMPLE
    # and the previous content went to .bak
    assert read(os.path.join(cfg, "topics.json.bak")) == TOPICS_SAMPLE


async def test_files_are_what_the_wire_encoders_produce(cfg):
    md = BrokerMetadata.load(cfg, clock=Clock())
    md.topics.ensure_system_topics("DefaultCluster", "broker-a")
    md.topics.create_or_update(TopicConfig("t1", 4, 4))
    md.offsets.commit("g1", "t1", 3, 99)
    md.offsets.commit("g1", "t1", 0, 5)
    md.subscriptions.find_or_create("g1")
    md.delay_offsets.update(3, 42)
    assert sorted(await md.persist_dirty()) == sorted(
        ["topics.json", "consumerOffset.json", "subscriptionGroup.json", "delayOffset.json"]
    )
    assert read(os.path.join(cfg, "topics.json")) == encode_topics_json(md.topics.wrapper())
    assert read(os.path.join(cfg, "consumerOffset.json")) == encode_consumer_offsets(
        md.offsets.table()
    )
    assert read(os.path.join(cfg, "subscriptionGroup.json")) == encode_subscription_groups(
        md.subscriptions.wrapper()
    )
    assert read(os.path.join(cfg, "delayOffset.json")) == encode_delay_offsets(
        md.delay_offsets.table()
    )
    assert b"{0:5,3:99" in read(os.path.join(cfg, "consumerOffset.json"))  # fastjson form
    assert md.topics.encode() == read(os.path.join(cfg, "topics.json"))


async def test_round_trip_through_files(cfg):
    md = BrokerMetadata.load(cfg, clock=Clock())
    md.topics.ensure_system_topics("c", "b")
    md.topics.create_or_update(TopicConfig("t1", 2, 3, Permission.READ, "MULTI_TAG", 1, True))
    md.offsets.commit("g", "t1", 1, 2**40)
    md.subscriptions.update(SubscriptionGroupConfig("g", retry_max_times=5, broker_id=1))
    md.delay_offsets.update(18, 7)
    await md.persist_all()

    again = BrokerMetadata.load(cfg)
    assert again.topics.wrapper() == md.topics.wrapper()
    assert again.offsets.table() == md.offsets.table()
    assert again.subscriptions.wrapper() == md.subscriptions.wrapper()
    assert again.delay_offsets.table() == md.delay_offsets.table()
    assert not any(m.dirty for m in again.managers())
    assert await again.persist_dirty() == []


def test_config_dir_of():
    assert config_dir_of("/data/store") == os.path.join("/data/store", "config")


# ---- topics --------------------------------------------------------------------------------------


async def test_data_version_bumps_on_every_change(cfg):
    clock = Clock()
    topics = TopicConfigManager.load(cfg, clock=clock)
    v0 = topics.data_version
    assert v0.counter == 0 and not topics.dirty
    topics.create_or_update(TopicConfig("a", 4, 4))
    v1 = topics.data_version
    assert (v1.counter, v1.timestamp) == (1, clock.now)
    assert topics.dirty
    assert topics.create_or_update(TopicConfig("a", 8, 8)) == TopicConfig("a", 4, 4)
    assert topics.data_version.counter == 2
    assert topics.delete("a") is True
    assert topics.data_version.counter == 3
    assert topics.delete("a") is False
    topics.get("a")
    assert topics.data_version.counter == 3
    await topics.persist()
    assert not topics.dirty
    assert TopicConfigManager.load(cfg).data_version == topics.data_version


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (TopicConfig("bad topic", 4, 4), "invalid topic name"),
        (TopicConfig("a" * 128, 4, 4), "invalid topic name"),
        (TopicConfig("../x", 4, 4), "invalid topic name"),
        (TopicConfig("t", 0, 4), "readQueueNums"),
        (TopicConfig("t", 4, 1025), "writeQueueNums"),
        (TopicConfig("t", 4, 4, perm=16), "perm"),
        (TopicConfig("t", 4, 4, topic_filter_type="SQL"), "topicFilterType"),
    ],
)
def test_create_or_update_validates(cfg, config, words):
    topics = TopicConfigManager.load(cfg)
    with pytest.raises(ValueError, match=words):
        topics.create_or_update(config)
    assert topics.topic_names() == [] and not topics.dirty


def test_ensure_system_topics(cfg):
    write(os.path.join(cfg, "topics.json"), TOPICS_SAMPLE)  # has TBW102 with 8 queues
    topics = TopicConfigManager.load(cfg, default_queue_nums=4, clock=Clock())
    added = topics.ensure_system_topics("DefaultCluster", "broker-a")
    assert AUTO_CREATE_TOPIC_KEY_TOPIC not in added  # the file's entry wins
    assert topics.get(AUTO_CREATE_TOPIC_KEY_TOPIC).read_queue_nums == 8
    assert set(added) == {
        "SELF_TEST_TOPIC", "BenchmarkTest", "DefaultCluster", "broker-a",
        "OFFSET_MOVED_EVENT", "SCHEDULE_TOPIC_XXXX", "DefaultCluster_REPLY_TOPIC",
    }
    assert topics.get("DefaultCluster") == TopicConfig("DefaultCluster", 16, 16, 7)
    assert topics.get("broker-a") == TopicConfig("broker-a", 1, 1, 7)
    assert topics.get("SELF_TEST_TOPIC") == TopicConfig("SELF_TEST_TOPIC", 1, 1, RW)
    assert topics.get("SCHEDULE_TOPIC_XXXX").write_queue_nums == 18
    assert topics.data_version.counter == 4
    assert topics.is_system_topic("broker-a") and not topics.is_system_topic("orders")
    assert topics.ensure_system_topics("DefaultCluster", "broker-a") == []
    assert topics.data_version.counter == 4

    fresh = TopicConfigManager.load(os.path.join(cfg, "other"), auto_create=False)
    added = fresh.ensure_system_topics(
        "C", "host.example.com", cluster_topic_enable=False, trace_topic="RMQ_SYS_TRACE_TOPIC"
    )
    assert AUTO_CREATE_TOPIC_KEY_TOPIC not in added
    assert "host.example.com" not in added  # not a valid topic name: skipped
    assert fresh.get("C").perm == Permission.INHERIT
    assert "RMQ_SYS_TRACE_TOPIC" in added


def test_auto_create_on_send(cfg):
    topics = TopicConfigManager.load(cfg, default_queue_nums=8, clock=Clock())
    topics.ensure_system_topics("DefaultCluster", "broker-a")
    v = topics.data_version.counter

    created = topics.create_topic_in_send("new1", "TBW102", 4, topic_sys_flag=2)
    assert created == TopicConfig("new1", 4, 4, RW, "SINGLE_TAG", 2)
    assert topics.get("new1") == created and topics.data_version.counter == v + 1
    # queue count is capped by the template's write queues
    assert topics.create_topic_in_send("new2", "TBW102", 64).write_queue_nums == 8
    # an existing topic is returned as is, no bump
    assert topics.create_topic_in_send("new1", "TBW102", 2) == created
    assert topics.data_version.counter == v + 2
    # the cluster topic (perm 7) is a template too, as in RocketMQ
    assert topics.create_topic_in_send("new3", "DefaultCluster", 4).perm == RW

    # refusals: no template, template without INHERIT, non-positive count
    assert topics.create_topic_in_send("x1", "nope", 4) is None
    assert topics.create_topic_in_send("x2", "SELF_TEST_TOPIC", 4) is None
    assert topics.create_topic_in_send("x3", "TBW102", 0) is None
    assert [t for t in ("x1", "x2", "x3") if t in topics] == []
    with pytest.raises(ValueError, match="invalid topic name"):
        topics.create_topic_in_send("a/b", "TBW102", 4)


def test_auto_create_off_refuses_tbw102_even_from_file(cfg):
    write(os.path.join(cfg, "topics.json"), TOPICS_SAMPLE)  # TBW102 with perm 7
    topics = TopicConfigManager.load(cfg, auto_create=False)
    v = topics.data_version
    assert topics.create_topic_in_send("new1", "TBW102", 4) is None
    assert "new1" not in topics and topics.data_version == v and not topics.dirty


def test_create_topic_in_send_back(cfg):
    topics = TopicConfigManager.load(cfg, auto_create=False)
    config = topics.create_topic_in_send_back("%RETRY%g1", 1)
    assert config == TopicConfig("%RETRY%g1", 1, 1, RW)
    assert topics.create_topic_in_send_back("%RETRY%g1", 4) == config
    assert topics.data_version.counter == 1


def test_registration_wrapper_applies_broker_permission(cfg):
    topics = TopicConfigManager.load(cfg)
    topics.create_or_update(TopicConfig("t", 4, 4, RW, "MULTI_TAG", 0, True))
    assert topics.registration_wrapper() == topics.wrapper()
    topics.broker_permission = Permission.READ  # read-only broker
    wrapper = topics.registration_wrapper()
    assert wrapper.topic_config_table["t"] == TopicConfig("t", 4, 4, Permission.READ)
    assert wrapper.data_version == topics.data_version


async def test_topics_replace_from_master_only_when_version_differs(cfg):
    slave = TopicConfigManager.load(cfg, clock=Clock())
    slave.create_or_update(TopicConfig("local", 1, 1))
    same = TopicConfigSerializeWrapper({"m": TopicConfig("m", 2, 2)}, slave.data_version)
    assert slave.replace_from_master(same) is False
    assert slave.topic_names() == ["local"]

    await slave.persist()
    master = TopicConfigSerializeWrapper(
        {"m": TopicConfig("m", 2, 2), "..": TopicConfig("..", 1, 1)}, DataVersion(7, 123)
    )
    assert slave.replace_from_master(master) is True
    assert slave.topic_names() == ["m"]  # replaced wholesale; the invalid name is dropped
    assert slave.data_version == DataVersion(7, 123)
    assert slave.dirty
    assert slave.replace_from_master(master) is False


# ---- consumer offsets ----------------------------------------------------------------------------


async def test_commit_query_and_dirty_flag(cfg):
    offsets = ConsumerOffsetManager.load(cfg)
    assert not offsets.dirty
    assert offsets.query("g", "t", 0) is None
    offsets.commit("g", "t", 0, 10)
    assert offsets.dirty and offsets.query("g", "t", 0) == 10
    offsets.commit("g", "t", 0, 3)  # a consumer may move back (offset reset)
    assert offsets.query("g", "t", 0) == 3
    assert await offsets.persist_if_dirty() is True
    assert not offsets.dirty and await offsets.persist_if_dirty() is False
    offsets.commit("g", "t", 0, 3)  # same value: nothing to write
    assert not offsets.dirty
    offsets.commit("g2", "t", 1, 1)
    assert offsets.offsets_of_group("g") == {"t": {0: 3}}
    assert offsets.table().offsets("t", "g2") == {1: 1}
    assert offsets.remove_group("g") == 1 and offsets.offsets_of_group("g") == {}
    for bad in [("g@x", "t", 0, 1), ("g", "t@x", 0, 1), ("g", "t", -1, 1), ("g", "t", 0, -1)]:
        with pytest.raises(InvalidMetadataError):
            offsets.commit(*bad)


async def test_merge_from_master_is_monotonic_rocketmq_1094(cfg):
    """After a master restart its offsets may be older than the slave's (consumers committed
    to the slave while the master was down); RocketMQ's putAll took them and consumers got
    duplicates (#1094). The merge only moves offsets forward."""
    slave = ConsumerOffsetManager.load(cfg)
    slave.commit("g", "t", 0, 500)
    slave.commit("g", "t", 1, 80)
    slave.commit("g", "only_slave", 0, 9)
    await slave.persist()
    master = ConsumerOffsetTable(
        {"t@g": {0: 100, 1: 90, 2: 5}, "other@g2": {0: 1}, "bad-key": {0: 1}}
    )
    assert slave.merge_from_master(master) == 3  # t/1 advanced, t/2 and other@g2 added
    assert slave.offsets_of_group("g") == {"t": {0: 500, 1: 90, 2: 5}, "only_slave": {0: 9}}
    assert slave.query("g2", "other", 0) == 1
    assert slave.dirty
    await slave.persist()
    assert slave.merge_from_master(master) == 0 and not slave.dirty
    # it survives a restart of the slave
    assert ConsumerOffsetManager.load(cfg).query("g", "t", 0) == 500


async def test_point_13_offset_cap_counts_commits_merges_and_removals(cfg):
    offsets = ConsumerOffsetManager.load(cfg, max_offsets=4)
    offsets.commit("g", "t", 0, 1)
    offsets.commit("g", "t", 1, 1)
    offsets.merge_from_master(ConsumerOffsetTable({"t@g": {1: 5, 2: 5}, "u@h": {0: 1}}))
    assert offsets.count == 4  # the master's offsets are taken past the cap: it bounded them
    with pytest.raises(MetadataLimitError, match="maxConsumerOffsetNums=4"):
        offsets.commit("g", "t", 3, 1)
    offsets.commit("g", "t", 0, 9)  # what is held keeps moving
    assert offsets.query("g", "t", 0) == 9
    assert offsets.remove_group("h") == 1 and offsets.count == 3
    offsets.commit("g", "t", 3, 1)
    await offsets.persist()
    reloaded = ConsumerOffsetManager.load(cfg, max_offsets=2)  # a smaller cap: all load
    assert reloaded.count == 4
    with pytest.raises(MetadataLimitError):
        reloaded.commit("g2", "t", 0, 1)


def test_point_13_subscription_group_cap(cfg):
    groups = SubscriptionGroupManager.load(cfg, max_groups=len(SYSTEM_CONSUMER_GROUPS) + 1)
    assert groups.find_or_create("first") is not None
    assert groups.find_or_create("second") is None
    assert "maxSubscriptionGroupNums" in groups.why_not_created()
    with pytest.raises(MetadataLimitError):
        groups.update(SubscriptionGroupConfig("second"))
    assert groups.update(SubscriptionGroupConfig("first", consume_enable=False)) is not None
    assert groups.delete("first") and groups.find_or_create("second") is not None


def test_point_11_names_are_matched_whole(cfg):
    offsets = ConsumerOffsetManager.load(cfg)
    for group, topic in [("g\n", "t"), ("g", "t\n"), ("", "t"), ("g", " ")]:
        with pytest.raises(InvalidMetadataError):
            offsets.commit(group, topic, 0, 1)


async def test_merge_adopts_5x_data_version(cfg):
    offsets = ConsumerOffsetManager.load(cfg)
    assert offsets.data_version is None
    offsets.merge_from_master(ConsumerOffsetTable({}, DataVersion(4, 5)))
    assert offsets.data_version == DataVersion(4, 5) and offsets.dirty
    await offsets.persist()
    assert b'"dataVersion"' in read(offsets.path)
    assert ConsumerOffsetManager.load(cfg).data_version == DataVersion(4, 5)


async def test_persist_while_committing(cfg):
    """Commits go on while the flusher writes snapshots in a worker thread: the file it
    leaves is the final table (the manager's state is on the loop; no lock guards it)."""
    offsets = ConsumerOffsetManager.load(cfg)
    stop = trio.Event()
    errors = []

    async def flusher():
        try:
            while not stop.is_set():
                await offsets.persist_if_dirty()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(flusher)
        try:
            for i in range(2000):
                offsets.commit("g", f"t{i % 50}", i % 8, i)
                if i % 10 == 0:
                    await trio.lowlevel.checkpoint()
        finally:
            stop.set()
    assert not errors
    await offsets.persist_if_dirty()
    assert ConsumerOffsetManager.load(cfg).table() == offsets.table()


class SlowWrites:
    """Stands in for ``atomic_write`` in the worker thread: counts writers at once, keeps what
    each wrote in order, and holds each write until the test lets it finish."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.most_active = 0
        self.written: list[bytes] = []
        self.started = threading.Semaphore(0)
        self.proceed = threading.Semaphore(0)

    def __call__(self, path, data: bytes) -> None:
        with self.lock:
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        self.started.release()
        self.proceed.acquire()
        atomic_write(path, data)
        with self.lock:
            self.written.append(data)
            self.active -= 1


async def wait_for_write_start(writes: SlowWrites) -> None:
    await trio.to_thread.run_sync(writes.started.acquire)


async def test_overlapping_persists_never_overlap_and_the_newest_lands_last(cfg, monkeypatch):
    offsets = ConsumerOffsetManager.load(cfg)
    writes = SlowWrites()
    monkeypatch.setattr(config_file, "atomic_write", writes)
    encoded = []
    async with trio.open_nursery() as nursery:
        for i in range(5):
            offsets.commit("g", "t", 0, i)
            encoded.append(offsets.encode())
            nursery.start_soon(offsets.persist)
            await trio.testing.wait_all_tasks_blocked()
        # the first writer took the first snapshot; the others queue behind it
        await wait_for_write_start(writes)
        offsets.commit("g", "t", 0, 99)
        encoded.append(offsets.encode())
        for _ in range(5):
            writes.proceed.release()
        for _ in range(4):
            await wait_for_write_start(writes)
    assert writes.most_active == 1
    # each queued writer snapshots once it holds the lock: the later four all see the newest
    assert writes.written == [encoded[0]] + [encoded[-1]] * 4
    assert read(offsets.path) == encoded[-1]
    assert not offsets.dirty


async def test_change_during_a_write_stays_dirty(cfg, monkeypatch):
    offsets = ConsumerOffsetManager.load(cfg)
    offsets.commit("g", "t", 0, 1)
    writes = SlowWrites()
    monkeypatch.setattr(config_file, "atomic_write", writes)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(offsets.persist)
        await wait_for_write_start(writes)
        assert not offsets.dirty
        offsets.commit("g", "t", 0, 2)  # after the snapshot: not in this write
        writes.proceed.release()
    assert offsets.dirty
    assert ConsumerOffsetManager.load(cfg).query("g", "t", 0) == 1
    writes.proceed.release()
    assert await offsets.persist_if_dirty() is True
    assert ConsumerOffsetManager.load(cfg).query("g", "t", 0) == 2


def make_unwritable(cfg):
    os.rmdir(cfg)
    write(cfg, b"")  # a file where the config directory should be


async def test_failed_persist_stays_dirty(cfg):
    offsets = ConsumerOffsetManager.load(cfg)
    offsets.commit("g", "t", 0, 1)
    make_unwritable(cfg)
    with pytest.raises(FileExistsError):
        await offsets.persist()
    assert offsets.dirty


# ---- subscription groups -------------------------------------------------------------------------


def test_subscription_groups(cfg):
    groups = SubscriptionGroupManager.load(cfg, auto_create=False, clock=Clock())
    for name in SYSTEM_CONSUMER_GROUPS:
        assert groups.get(name) == SubscriptionGroupConfig(name)
    v = groups.data_version.counter
    assert groups.find_or_create("cg") is None and groups.data_version.counter == v
    assert groups.find_or_create("CID_RMQ_SYS_TRANS") == SubscriptionGroupConfig(
        "CID_RMQ_SYS_TRANS"
    )
    assert groups.data_version.counter == v + 1
    groups.auto_create = True
    config = groups.find_or_create("cg")
    assert config == SubscriptionGroupConfig("cg")
    assert (config.retry_queue_nums, config.retry_max_times, config.broker_id) == (1, 16, 0)
    assert groups.find_or_create("cg") is config and groups.data_version.counter == v + 2
    assert groups.update(SubscriptionGroupConfig("cg", consume_enable=False)) == config
    assert groups.data_version.counter == v + 3
    assert groups.delete("cg") and not groups.delete("cg")
    with pytest.raises(ValueError, match="group"):
        groups.find_or_create("a b")


def test_subscription_groups_load_and_replace_from_master(cfg):
    write(os.path.join(cfg, "subscriptionGroup.json"), GROUPS_SAMPLE)
    groups = SubscriptionGroupManager.load(cfg, clock=Clock())
    assert groups.get("cg1").consume_enable is False
    assert groups.get("TOOLS_CONSUMER") is not None
    assert groups.data_version.counter == 10  # the system groups were added: one bump
    master = SubscriptionGroupWrapper({"m": SubscriptionGroupConfig("m")}, DataVersion(1, 2))
    assert groups.replace_from_master(master) is True
    assert groups.get("cg1") is None and groups.get("m") is not None
    assert groups.replace_from_master(master) is False


# ---- delay offsets -------------------------------------------------------------------------------


async def test_delay_offsets(cfg):
    write(os.path.join(cfg, "delayOffset.json"), DELAY_SAMPLE)
    delay = DelayOffsetManager.load(cfg)
    assert delay.table() == DelayOffsetTable({1: 0, 2: 17, 3: 5})
    delay.update(2, 18)
    await delay.persist()
    assert read(delay.path) == b'{\n\t"offsetTable":{1:0,2:18,3:5\n\t}\n}'
    assert read(delay.path + ".bak") == DELAY_SAMPLE
    assert delay.replace_from_master(DelayOffsetTable({1: 4})) is True
    assert delay.table().offset_table == {1: 4}
    assert delay.replace_from_master(DelayOffsetTable({1: 4})) is False
    with pytest.raises(InvalidMetadataError, match="delay level"):
        delay.update(0, 1)


async def test_persist_all_attempts_every_file(cfg):
    md = BrokerMetadata.load(cfg)
    md.offsets.commit("g", "t", 0, 1)
    make_unwritable(cfg)
    with pytest.raises(FileExistsError):
        await md.persist_all()
    assert all(m.dirty for m in md.managers())


def test_unreadable_config_dir_is_an_error(cfg):
    make_unwritable(cfg)
    with pytest.raises(MetadataLoadError, match="Not a directory"):
        BrokerMetadata.load(os.path.join(cfg, "sub"))


# ---- slave sync from a master over remoting ------------------------------------------------------


async def test_slave_sync_takes_the_masters_tables(cfg, nursery):
    master = BrokerMetadata.load(os.path.join(cfg, "master"), clock=Clock())
    master.topics.ensure_system_topics("c", "b")
    master.topics.create_or_update(TopicConfig("t1", 2, 2))
    master.offsets.commit("g", "t1", 0, 5)  # older than the slave's
    master.offsets.commit("g", "t1", 1, 7)
    master.delay_offsets.update(3, 42)
    master.subscriptions.update(SubscriptionGroupConfig("g", retry_max_times=5))
    bodies = {
        RequestCode.GET_ALL_TOPIC_CONFIG: encode_topics_json(master.topics.wrapper(), pretty=False),
        RequestCode.GET_ALL_CONSUMER_OFFSET: encode_consumer_offsets(master.offsets.table(), pretty=False),
        RequestCode.GET_ALL_DELAY_OFFSET: encode_delay_offsets(master.delay_offsets.table(), pretty=False),
        RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: encode_subscription_groups(
            master.subscriptions.wrapper(), pretty=False
        ),
    }

    async def handler(request, connection):
        await trio.lowlevel.checkpoint()
        body = bodies.get(request.code)
        if body is None:
            return RemotingCommand.response_to(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    host, port = await nursery.start(functools.partial(serve_remoting, handler, 0, host="127.0.0.1"))
    slave = BrokerMetadata.load(os.path.join(cfg, "slave"), clock=Clock())
    slave.offsets.commit("g", "t1", 0, 9)
    async with open_client_pool() as pool:
        outcomes = await sync_from_master(pool, f"{host}:{port}", slave)
        assert {name: o.detail for name, o in outcomes.items()} == {
            "topics": "changed", "consumer_offsets": "changed", "delay_offsets": "changed",
            "subscription_groups": "changed"}
        assert slave.topics.wrapper() == master.topics.wrapper()
        assert slave.offsets.offsets_of_group("g") == {"t1": {0: 9, 1: 7}}  # never moved back
        assert slave.delay_offsets.table() == master.delay_offsets.table()
        assert slave.subscriptions.wrapper() == master.subscriptions.wrapper()
        assert all(m.dirty for m in slave.managers())

        # a master that refuses one request: that table is left as it is, the others still sync
        del bodies[RequestCode.GET_ALL_DELAY_OFFSET]
        master.offsets.commit("g", "t1", 1, 8)
        bodies[RequestCode.GET_ALL_CONSUMER_OFFSET] = encode_consumer_offsets(
            master.offsets.table(), pretty=False
        )
        bodies[RequestCode.GET_ALL_TOPIC_CONFIG] = b"{not json"  # and one that is garbage
        outcomes = await sync_from_master(pool, f"{host}:{port}", slave)
        assert not outcomes["delay_offsets"].ok and "refused" in outcomes["delay_offsets"].detail
        assert not outcomes["topics"].ok
        assert outcomes["consumer_offsets"].detail == "changed"
        assert outcomes["subscription_groups"].detail == "unchanged"
        assert slave.offsets.query("g", "t1", 1) == 8
        assert slave.delay_offsets.get(3) == 42
