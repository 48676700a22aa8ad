"""Delay levels, consumer send-back, retry and dead-letter topics (issue 12).

The dispatcher writes a delayed message's due time into its consume-queue entry; the schedule
service delivers due messages to their real topic (virtual time with the autojump clock, on a
real store); the broker moves DELAY messages aside, answers CONSUMER_SEND_MSG_BACK through
%RETRY%<group> and %DLQ%<group>; a delayed message survives a SIGKILL of its master.
"""

import shutil
import time

import pytest
import trio

from conftest import pulled, wait_until
from trio_ha import open_store
from trio_ha.broker.metadata import DelayOffsetManager
from trio_ha.broker.metadata.files import config_dir_of
from trio_ha.broker.schedule import ScheduleService, delayed
from trio_ha.client import Message, open_producer
from trio_ha.remoting import open_remoting_client
from trio_ha.store import PutRequest
from trio_ha.store.results import PutMessageResult
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port, serve_cluster
from trio_ha.wire import record as rec
from trio_ha.wire.metadata import SCHEDULE_TOPIC, TOPICS_JSON
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import KVTable

LEVELS = "1s 5s 10s"


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


async def put_delayed(store, topic: str, queue_id: int, level: int, body: bytes,
                      levels: int = 3, **properties: str):
    properties = {rec.PROPERTY_DELAY_TIME_LEVEL: str(level), **properties}
    moved = delayed(topic, queue_id, properties, level, levels)
    result = await store.put(PutRequest(moved.topic, moved.queue_id, body,
                                        rec.encode_properties(moved.properties).encode()))
    assert result.status.name == "PUT_OK"
    return result


# ---- the store: due times in the consume queue ---------------------------------------------------


async def test_the_dispatcher_writes_each_delayed_message_due_time_in_its_entry(make_config):
    async with open_store(make_config(message_delay_level=LEVELS)) as store:
        first = await put_delayed(store, "Orders", 2, 2, b"in five seconds")
        # A level above the highest counts as the highest (10 s, queue 2).
        high = await put_delayed(store, "Orders", 0, 7, b"in ten seconds")
        plain = await store.put(PutRequest("Orders", 0, b"now", b"TAGS\x01TagA"))
        await store.wait_dispatched()
        [entry] = store.queue_entries(SCHEDULE_TOPIC, 1, 0, 10)
        stored = await store.look_message_by_offset(first.commitlog_offset)
        assert stored is not None
        assert entry.commitlog_offset == first.commitlog_offset
        assert entry.tags_code == stored.store_timestamp + 5000
        assert stored.properties[rec.PROPERTY_REAL_TOPIC] == "Orders"
        assert stored.properties[rec.PROPERTY_REAL_QUEUE_ID] == "2"
        [entry] = store.queue_entries(SCHEDULE_TOPIC, 2, 0, 10)
        stored = await store.look_message_by_offset(high.commitlog_offset)
        assert stored is not None
        assert stored.properties[rec.PROPERTY_DELAY_TIME_LEVEL] == "3"
        assert entry.tags_code == stored.store_timestamp + 10_000
        # Any other topic keeps its tag hash.
        [entry] = store.queue_entries("Orders", 0, 0, 10)
        assert entry.commitlog_offset == plain.commitlog_offset
        assert entry.tags_code == rec.tags_code("TagA")


async def test_each_due_time_is_its_own_message_when_levels_arrive_interleaved(make_config):
    """Levels 1 and 2 taking turns: each level's queue gets one run of entries from records
    with the other level's between them, and every entry's due time is its own record's
    store time plus its own level's delay (not a neighbour's in the scan)."""
    async with open_store(make_config(message_delay_level=LEVELS)) as store:
        puts = []
        for i in range(8):
            level = 1 + i % 2
            moved = delayed("Orders", 0, {rec.PROPERTY_DELAY_TIME_LEVEL: str(level)}, level, 3)
            # Appended with no checkpoint between them: the dispatcher finds all in one scan.
            result = store.append_now(PutRequest(
                moved.topic, moved.queue_id, b"m%d" % i,
                rec.encode_properties(moved.properties).encode(),
            ))
            assert isinstance(result, PutMessageResult) and result.ok
            puts.append((level, result))
        await store.wait_dispatched()
        for level, delay in ((1, 1000), (2, 5000)):
            entries = store.queue_entries(SCHEDULE_TOPIC, level - 1, 0, 10)
            mine = [result for at, result in puts if at == level]
            assert [e.commitlog_offset for e in entries] == [r.commitlog_offset for r in mine]
            for entry, result in zip(entries, mine, strict=True):
                stored = await store.look_message_by_offset(result.commitlog_offset)
                assert stored is not None
                assert entry.tags_code == stored.store_timestamp + delay


async def test_due_times_are_written_again_when_recovery_rebuilds_the_queue(make_config):
    config = make_config(message_delay_level=LEVELS)
    async with open_store(config) as store:
        put = await put_delayed(store, "Orders", 0, 1, b"soon")
        await store.wait_dispatched()
        [before] = store.queue_entries(SCHEDULE_TOPIC, 0, 0, 10)
    # The queue's files go; reopening rebuilds them from the commitlog.
    shutil.rmtree(f"{config.store_path_root_dir}/consumequeue/{SCHEDULE_TOPIC}")
    async with open_store(config) as store:
        await store.wait_dispatched()
        [after] = store.queue_entries(SCHEDULE_TOPIC, 0, 0, 10)
    assert after == before and after.commitlog_offset == put.commitlog_offset


# ---- the schedule service, in virtual time ---------------------------------------------------


def virtual_wall_clock():
    """Wall-clock milliseconds that move with trio's (autojump) clock."""
    base = wall_ms() - int(trio.current_time() * 1000)
    return lambda: base + int(trio.current_time() * 1000)


async def test_delayed_messages_are_delivered_when_due_and_not_before(make_config, tmp_path,
                                                                     autojump_clock):
    config = make_config(message_delay_level=LEVELS)
    offsets = DelayOffsetManager.load(tmp_path / "config")
    async with open_store(config) as store:
        start = trio.current_time()
        clock = virtual_wall_clock()
        await put_delayed(store, "Orders", 1, 2, b"five", KEYS="k5", UNIQ_KEY="ID5")
        await put_delayed(store, "Orders", 1, 1, b"one", KEYS="k1", UNIQ_KEY="ID1")
        service = ScheduleService(store, offsets, config.delay_levels, now_ms=clock)
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            arrivals = store.queue_arrivals("Orders", 1)
            await arrivals.wait_for(1)
            one = trio.current_time() - start
            await arrivals.wait_for(2)
            five = trio.current_time() - start
            nursery.cancel_scope.cancel()
        # Each when due (1 s, 5 s; the store stamps real milliseconds, so the puts' own real
        # time shows as a few ms), and the later level second.
        assert 1.0 <= one < 1.2 and 5.0 <= five < 5.2, (one, five)
        delivered = await store.get_messages("Orders", 1, 0, 10)
        assert [m.body for m in delivered] == [b"one", b"five"]
        for m in delivered:
            assert rec.PROPERTY_DELAY_TIME_LEVEL not in m.properties
            assert m.properties[rec.PROPERTY_REAL_TOPIC] == "Orders"
            assert m.properties[rec.PROPERTY_WAIT_STORE_MSG_OK] == "false"
        assert [m.properties["UNIQ_KEY"] for m in delivered] == ["ID1", "ID5"]
        assert (offsets.get(1), offsets.get(2), offsets.get(3)) == (1, 1, None)
        stats = service.statistics()
        assert stats.delivered == 2 and stats.levels[1] == (1, 1) and stats.levels[3] == (0, 0)


async def test_a_restarted_service_goes_on_from_the_written_offsets(make_config, tmp_path,
                                                                   autojump_clock):
    """Delivered messages are not delivered again; those not delivered yet still are, even
    when they fell due while no service ran."""
    config = make_config(message_delay_level=LEVELS)
    async with open_store(config) as store:
        offsets = DelayOffsetManager.load(tmp_path / "config")
        clock = virtual_wall_clock()
        await put_delayed(store, "Orders", 0, 1, b"first")  # due in 1 s
        await put_delayed(store, "Orders", 0, 2, b"second")  # due in 5 s
        async with trio.open_nursery() as nursery:
            await nursery.start(ScheduleService(store, offsets, config.delay_levels,
                                                now_ms=clock).run)
            await store.queue_arrivals("Orders", 0).wait_for(1)
            nursery.cancel_scope.cancel()
        await offsets.persist()
        assert [m.body for m in await store.get_messages("Orders", 0, 0, 10)] == [b"first"]
        await trio.sleep(10)  # "second" falls due while nothing delivers
        offsets = DelayOffsetManager.load(tmp_path / "config")
        assert (offsets.get(1), offsets.get(2)) == (1, None)  # level 2 delivered nothing
        async with trio.open_nursery() as nursery:
            await nursery.start(ScheduleService(store, offsets, config.delay_levels,
                                                now_ms=clock).run)
            await store.queue_arrivals("Orders", 0).wait_for(2)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        assert [m.body for m in await store.get_messages("Orders", 0, 0, 10)] == [
            b"first", b"second"]


async def test_a_message_with_no_real_topic_is_skipped_not_stuck(make_config, tmp_path,
                                                                autojump_clock):
    config = make_config(message_delay_level=LEVELS)
    async with open_store(config) as store:
        offsets = DelayOffsetManager.load(tmp_path / "config")
        # Written into the schedule topic by hand, without REAL_TOPIC: nothing can deliver it.
        await store.put(PutRequest(SCHEDULE_TOPIC, 0, b"orphan", b"DELAY\x011"))
        await put_delayed(store, "Orders", 0, 1, b"fine")
        service = ScheduleService(store, offsets, config.delay_levels,
                                  now_ms=virtual_wall_clock())
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            await store.queue_arrivals("Orders", 0).wait_for(1)
            nursery.cancel_scope.cancel()
        assert service.statistics().skipped == 1 and offsets.get(1) == 2


# ---- the broker: DELAY sends, send-back, retry and dead letters ----------------------------------


@pytest.fixture
async def cluster(nursery, tmp_path):
    return await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "cluster", slaves=0, master_role="ASYNC_MASTER",
        properties={"messageDelayLevel": "1s 1s 1s 2s"}))


def send_request(topic, body, props, *, reconsume=None, most=None):
    fields = {"a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0,
              "i": props}
    if reconsume is not None:
        fields["j"] = reconsume
    if most is not None:
        fields["l"] = most
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, fields, body=body)


def send_back(offset, group, delay_level=0, most=None):
    fields = {"offset": offset, "group": group, "delayLevel": delay_level,
              "originMsgId": "", "originTopic": "Orders", "unitMode": "false"}
    if most is not None:
        fields["maxReconsumeTimes"] = most
    return RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, fields)


async def test_a_delay_message_reaches_its_topic_after_its_delay(cluster):
    async with open_producer(cluster.namesrv_addr, "pg") as producer:
        sent_at = wall_ms()
        result = await producer.send(Message("Later", b"hello", properties={"DELAY": "2"}))
    async with open_remoting_client(cluster.master.broker_addr) as client:
        assert await pulled(client, "Later", result.message_queue.queue_id) == []
        [message] = await wait_until(lambda: pulled(client, "Later", result.message_queue.queue_id),
                                     "the delayed message to arrive", timeout=10, interval=0.05)
        assert message.body == b"hello" and message.store_timestamp - sent_at >= 1000
        assert message.properties["UNIQ_KEY"] == result.msg_id
        # The schedule's progress, as mqadmin brokerStatus shows it.
        reply = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)
        table = KVTable.decode(reply.body).table
        assert table["scheduleMessageOffset_2"] == "1,1"


async def test_send_back_retries_through_the_retry_topic_then_dead_letters(cluster):
    group = "gback"
    async with open_remoting_client(cluster.master.broker_addr) as client:
        reply = await client.invoke(send_request("Orders", b"fail me", "UNIQ_KEY\x01ID1"), 5)
        assert reply.code == ResponseCode.SUCCESS
        [original] = await wait_until(lambda: pulled(client, "Orders"), "the message")
        # Level 0: 3 + reconsume times (level 3: 1 s here), to %RETRY%gback.
        reply = await client.invoke(send_back(original.commitlog_offset, group), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        [retried] = await wait_until(lambda: pulled(client, f"%RETRY%{group}"), "the retry",
                                     timeout=10, interval=0.05)
        assert retried.body == b"fail me" and retried.reconsume_times == 1
        assert retried.properties[rec.PROPERTY_RETRY_TOPIC] == "Orders"
        assert retried.properties[rec.PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id
        assert retried.properties["UNIQ_KEY"] == "ID1"
        assert retried.store_timestamp - original.store_timestamp >= 1000
        # Consumed once already, at most once more: the second failure is a dead letter, at
        # once (no delay), in a topic made for it.
        reply = await client.invoke(send_back(retried.commitlog_offset, group, most=1), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        [dead] = await wait_until(lambda: pulled(client, f"%DLQ%{group}"), "the dead letter")
        assert dead.reconsume_times == 2 and dead.body == b"fail me"
        assert dead.properties[rec.PROPERTY_RETRY_TOPIC] == "Orders"
        assert dead.properties[rec.PROPERTY_ORIGIN_MESSAGE_ID] == original.msg_id
        assert rec.PROPERTY_DELAY_TIME_LEVEL not in dead.properties
        route = await client.invoke(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 5)
        assert f"%DLQ%{group}" in route.body.decode()
        # A negative level means: straight to the dead letters.
        reply = await client.invoke(send_back(original.commitlog_offset, group, -1), 5)
        assert reply.code == ResponseCode.SUCCESS
        assert len(await wait_until(lambda: _at_least(client, f"%DLQ%{group}", 2),
                                    "the second dead letter")) == 2
        # An offset where no message starts is refused, with RocketMQ's words.
        reply = await client.invoke(send_back(original.commitlog_offset + 1, group), 5)
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert (reply.remark or "").startswith("look message by offset failed")


async def _at_least(client, topic, count):
    found = await pulled(client, topic)
    return found if len(found) >= count else None


async def test_a_send_to_a_retry_topic_past_its_max_times_is_a_dead_letter(cluster):
    """The Java consumer's fallback when send-back fails: it sends to %RETRY%<group> itself
    with reconsumeTimes + 1 and DELAY 3 + times. Within the limit it is delayed; past it,
    dead-lettered (RocketMQ's handleRetryAndDLQ)."""
    async with open_remoting_client(cluster.master.broker_addr) as client:
        within = await client.invoke(
            send_request("%RETRY%gsend", b"again", "DELAY\x013", reconsume=1, most=2), 5)
        assert within.code == ResponseCode.SUCCESS
        past = await client.invoke(
            send_request("%RETRY%gsend", b"no more", "DELAY\x014", reconsume=2, most=2), 5)
        assert past.code == ResponseCode.SUCCESS
        [dead] = await wait_until(lambda: pulled(client, "%DLQ%gsend"), "the dead letter")
        assert dead.body == b"no more"
        [retry] = await wait_until(lambda: pulled(client, "%RETRY%gsend"), "the retry",
                                   timeout=10, interval=0.05)
        assert retry.body == b"again" and retry.reconsume_times == 1


# ---- a delayed message survives a SIGKILL of its master -----------------------------------------


async def test_a_delayed_message_survives_a_sigkill_of_its_master(tmp_path):
    """DELAY=3 (10 s): the master is killed during the wait and restarted; the message still
    arrives once due, from the schedule topic's queue in the recovered store."""
    config = ClusterConfig(data_dir=tmp_path, slaves=0, master_role="ASYNC_MASTER",
                           master_port=free_broker_port(),
                           properties={"flushConsumerOffsetInterval": 500})
    with ProcessCluster.start(config) as cluster:
        async with open_producer(cluster.namesrv_addr, "pg") as producer:
            sent_at = wall_ms()
            result = await producer.send(Message("Survives", b"due later",
                                                 properties={"DELAY": "3"}))
        # What the kill must leave behind: the message waiting in its level's queue (DELAY 3:
        # queue 2), and its topic (created by the send) written by a round of persisting.
        topics = trio.Path(config_dir_of(config.store_dir(0)), TOPICS_JSON)
        async with open_remoting_client(cluster.master.addr) as client:

            async def waiting():
                reply = await client.invoke(RemotingCommand.request(
                    RequestCode.GET_MAX_OFFSET, {"topic": SCHEDULE_TOPIC, "queueId": 2}), 5)
                if reply.code != ResponseCode.SUCCESS or reply.ext_fields["offset"] != "1":
                    return False
                try:
                    return "Survives" in await topics.read_text()
                except FileNotFoundError:
                    return False

            await wait_until(waiting, "the delayed message stored and its topic written",
                             interval=0.1)
            # not delivered yet: the kill comes while it waits
            assert await pulled(client, "Survives", result.message_queue.queue_id) == []
        cluster.master.kill()
        cluster.restart(cluster.master)
        async with open_remoting_client(cluster.master.addr) as client:
            queue = result.message_queue.queue_id
            [message] = await wait_until(lambda: pulled(client, "Survives", queue),
                                         "the delayed message after the crash", timeout=30,
                                         interval=0.1)
        assert message.body == b"due later" and message.store_timestamp - sent_at >= 10_000
        assert message.properties["UNIQ_KEY"] == result.msg_id
