"""The trio client library against a real cluster: a name server, a SYNC_MASTER and its SLAVE
on 127.0.0.1, all in this process, real sockets on ports chosen by the OS.

Every wait is bounded (``trio.fail_after``); nothing asserts a duration.
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import socket
import time

import attrs
import pytest
import trio

from conftest import pulls_taken, wait_until
from trio_ha.client import (
    Message,
    MessageQueue,
    MQBrokerError,
    MQClientError,
    MQError,
    PullStatus,
    SendStatus,
    open_admin,
    open_client_instance,
    open_producer,
    open_pull_consumer,
)
from trio_ha.client.instance import _UniqIdGenerator, parse_subscription
from trio_ha.remoting import open_client_pool, serve_remoting
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import BrokerData, QueueData, TopicRouteData

STORED = {SendStatus.SEND_OK, SendStatus.FLUSH_DISK_TIMEOUT, SendStatus.FLUSH_SLAVE_TIMEOUT,
          SendStatus.SLAVE_NOT_AVAILABLE}


async def wait_send_ok(producer, topic: str = "Warmup", limit: float = 20) -> list:
    """Send probes until one is SEND_OK (a SYNC_MASTER answers SLAVE_NOT_AVAILABLE until its
    slave is connected, and errors while it is down); returns the stored results."""
    stored = []

    async def send_ok() -> bool:
        try:
            result = await producer.send(Message(topic, b"probe", tags="probe"))
        except MQError:
            return False
        stored.append(result)
        return result.send_status is SendStatus.SEND_OK

    await wait_until(send_ok, f"a SEND_OK to {topic}", timeout=limit, interval=0.05)
    return stored


@pytest.fixture
async def cluster(tmp_path):
    """A SYNC_MASTER and its SLAVE, up and replicating. No VIP channel: the master restarts
    on its own ports in test_master_down_then_back, and listenPort - 2 was never reserved."""
    config = ClusterConfig(data_dir=tmp_path / "cluster", master_role="SYNC_MASTER", properties={
        "mappedFileSizeCommitLog": 1048576, "registerNameServerPeriod": 10000,
        "vipChannelEnable": "false", "slaveSyncInterval": 1000, "haReconnectInterval": 300,
        "metricsPort": 0,
    })
    async with open_cluster(config) as cluster:
        async with open_producer(cluster.namesrv_addr, "warmup-producer") as producer:
            await wait_send_ok(producer)
        yield cluster


async def consume(stream, count: int, limit: float = 20) -> list:
    messages = []
    with trio.fail_after(limit):
        async for message in stream:
            messages.append(message)
            if len(messages) == count:
                break
    return messages


def assert_queue_order(messages, start: dict | None = None, *, gaps: bool = False) -> dict:
    """Per queue, offsets rise by one from ``start`` (default: the first seen); with
    ``gaps`` (filtered messages), they only rise."""
    nexts = dict(start or {})
    for m in messages:
        key = (m.topic, m.queue_id)
        if key in nexts:
            if gaps:
                assert m.queue_offset >= nexts[key], (key, m.queue_offset, nexts[key])
            else:
                assert m.queue_offset == nexts[key], (key, m.queue_offset, nexts[key])
        nexts[key] = m.queue_offset + 1
    return nexts


def uniq(message) -> str:
    return message.properties["UNIQ_KEY"]


# ---- produce, consume, commit, resume --------------------------------------------------------


async def test_produce_consume_exactly_once_and_resume(cluster):
    topic = "Orders"
    tags = ("TagA", "TagB", "TagC")
    sent = {}
    with trio.fail_after(30):
        async with open_producer(cluster.namesrv_addr, "orders-producer") as producer:
            for i in range(300):
                result = await producer.send(
                    Message(topic, f"order {i}".encode(), tags=tags[i % 3], keys=(f"k{i}", f"o{i % 7}"))
                )
                assert result.send_status is SendStatus.SEND_OK
                assert result.message_queue.topic == topic
                assert len(result.msg_id) == 32 and len(result.offset_msg_id) == 32
                sent[result.msg_id] = (i, result)
        queues_used = {r.message_queue for _, r in sent.values()}
        assert len(queues_used) > 1  # round-robin over several queues
        assert len(sent) == 300  # unique ids

        async with open_pull_consumer(cluster.namesrv_addr, "orders") as consumer:
            assert set(await consumer.queues(topic)) >= queues_used
            async with consumer.messages(topic) as stream:
                first = await consume(stream, 200)
        async with open_pull_consumer(cluster.namesrv_addr, "orders") as consumer:
            async with consumer.messages(topic) as stream:
                rest = await consume(stream, 100)
            for mq in await consumer.queues(topic):
                assert await consumer.committed_offset(mq) == await consumer.max_offset(mq)

    everything = first + rest
    ids = [uniq(m) for m in everything]
    assert len(set(ids)) == 300 and set(ids) == set(sent)  # exactly once
    # each queue in order, from 0, and the second consumer resumed where the first stopped
    nexts = assert_queue_order(everything, {(topic, q.queue_id): 0 for q in queues_used})
    for m in everything:
        i, result = sent[uniq(m)]
        assert m.body == f"order {i}".encode()
        assert m.tags == tags[i % 3]
        assert m.keys == (f"k{i}", f"o{i % 7}")
        assert (m.queue_id, m.queue_offset) == (result.message_queue.queue_id, result.queue_offset)
        assert m.msg_id == result.offset_msg_id
    assert sum(nexts.values()) == 300


async def test_large_body_is_compressed_and_inflated(cluster):
    body = bytes(range(256)) * 40  # 10 KiB, over the 4 KiB threshold
    with trio.fail_after(20):
        async with open_client_instance(cluster.namesrv_addr) as client:
            async with open_producer(client, "big-p") as producer, \
                    open_pull_consumer(client, "big-c") as consumer:
                result = await producer.send(Message("Big", body, tags="T"))
                mq = result.message_queue
                pulled = await consumer.pull(mq, result.queue_offset, 1, suspend_timeout=0)
                assert pulled.status is PullStatus.FOUND
                (message,) = pulled.messages
                assert message.body == body
                assert message.properties["MAX_OFFSET"] == str(result.queue_offset + 1)
                async with open_admin(client) as admin:
                    stored = await admin.view_message(result.offset_msg_id)
                assert stored.sys_flag & 0x1  # stored compressed, as RocketMQ producers do
                assert len(stored.body) < len(body)


# ---- tag filtering -----------------------------------------------------------------------------


async def test_tag_filtering(cluster):
    topic = "Tagged"
    with trio.fail_after(30):
        async with open_admin(cluster.namesrv_addr) as admin:
            await admin.create_topic(topic, 2)
            await admin.create_topic("OnlyC", 1)
        async with open_producer(cluster.namesrv_addr, "tag-producer") as producer:
            await wait_for_route(producer, topic, 2)
            await wait_for_route(producer, "OnlyC", 1)
            expected = []
            for i in range(30):
                tag = ("TagA", "TagB", "TagC")[i % 3]
                result = await producer.send(Message(topic, f"{tag}-{i}".encode(), tags=tag))
                assert result.send_status is SendStatus.SEND_OK
                if tag != "TagC":
                    expected.append(result.msg_id)
            # "Aa" and "BB" have the same Java hash code: only the tag string tells them apart
            collide = await producer.send(Message(topic, b"BB", tags="BB"))
            wanted = await producer.send(Message(topic, b"Aa", tags="Aa"))
            for _ in range(3):
                await producer.send(Message("OnlyC", b"c", tags="TagC"))

        async with open_pull_consumer(cluster.namesrv_addr, "tag-consumer") as consumer:
            async with consumer.messages(topic, subscription="TagA || TagB",
                                         from_where="first") as stream:
                got = await consume(stream, len(expected))
            assert sorted(uniq(m) for m in got) == sorted(expected)
            assert {m.tags for m in got} == {"TagA", "TagB"}
            assert_queue_order(got, gaps=True)

            # a queue holding only other tags: NO_MATCHED_MSG, and the offset moves past them
            (only_c,) = await consumer.queues("OnlyC")
            result = await consumer.pull(only_c, 0, subscription="TagA", suspend_timeout=0)
            assert result.status is PullStatus.NO_MATCHED_MSG
            assert result.next_begin_offset == 3 and result.messages == []

            # hash collision
            found = []
            for mq in await consumer.queues(topic):
                result = await consumer.pull(mq, 0, 64, subscription="Aa", suspend_timeout=0)
                found += result.messages
            assert [uniq(m) for m in found] == [wanted.msg_id]
            assert collide.msg_id not in [uniq(m) for m in found]


async def wait_for_route(client_user, topic: str, queue_nums: int) -> None:
    """Until the name server's route of ``topic`` has ``queue_nums`` queues (a broker
    re-registers at once after a topic change)."""
    instance = client_user.instance

    async def routed() -> bool:
        await instance.refresh_route(topic, max_age=0)
        return len(instance.subscribe_queues(topic)) == queue_nums

    await wait_until(routed, f"a route of {topic} with {queue_nums} queues", interval=0.05)


def test_parse_subscription():
    assert parse_subscription("t", "*").sub_string == "*"
    assert parse_subscription("t", "").tags_set == frozenset()
    sub = parse_subscription("t", "TagA || TagB")
    assert sub.tags_set == {"TagA", "TagB"}
    assert sub.code_set == {2598919, 2598920}


# ---- long polling ---------------------------------------------------------------------------


async def test_long_polling(cluster):
    topic = "Polled"
    with trio.fail_after(30):
        async with open_client_instance(cluster.namesrv_addr) as client:
            async with open_admin(client) as admin:
                await admin.create_topic(topic, 1)
            async with open_producer(client, "poll-p") as producer, \
                    open_pull_consumer(client, "poll-c") as consumer:
                await wait_for_route(consumer, topic, 1)
                (mq,) = await consumer.queues(topic)
                results = []
                master = cluster.master.started_addresses
                taken = await pulls_taken(master)

                async def pull():
                    results.append(await consumer.pull(mq, 0, suspend_timeout=20))

                async def parked():
                    return await pulls_taken(master) == taken + 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(pull)
                    await wait_until(parked, "the pull to reach the broker and be held")
                    assert results == []  # held: nothing to return yet
                    sent = await producer.send(Message(topic, b"wake up"))
                # the held pull answered with the message sent after it started
                (result,) = results
                assert result.status is PullStatus.FOUND
                assert [uniq(m) for m in result.messages] == [sent.msg_id]
                assert result.next_begin_offset == 1

                # nothing comes: NO_NEW_MSG once the suspend timeout passes
                empty = await consumer.pull(mq, 1, suspend_timeout=0.5)
                assert empty.status is PullStatus.NO_NEW_MSG
                assert empty.next_begin_offset == 1 and empty.messages == []
                # an offset beyond the end
                moved = await consumer.pull(mq, 5, suspend_timeout=0)
                assert moved.status is PullStatus.OFFSET_ILLEGAL
                # RocketMQ's correction: the min offset when it is 0, else the max offset
                assert moved.next_begin_offset == 0


# ---- batches ---------------------------------------------------------------------------------


async def test_batch_send(cluster):
    topic = "Batched"
    messages = [Message(topic, f"item {i}".encode(), tags="B", keys=f"b{i}") for i in range(32)]
    with trio.fail_after(20):
        async with open_client_instance(cluster.namesrv_addr) as client:
            async with open_producer(client, "batch-p") as producer, \
                    open_pull_consumer(client, "batch-c") as consumer:
                result = await producer.send_batch(messages)
                assert result.send_status is SendStatus.SEND_OK
                ids = result.msg_id.split(",")
                offset_ids = result.offset_msg_id.split(",")
                assert len(ids) == len(set(ids)) == 32 and len(offset_ids) == 32
                pulled = await consumer.pull(
                    result.message_queue, result.queue_offset, 32, suspend_timeout=0
                )
                assert pulled.status is PullStatus.FOUND
                assert [m.queue_offset for m in pulled.messages] == list(
                    range(result.queue_offset, result.queue_offset + 32)
                )
                assert [m.body for m in pulled.messages] == [m.body for m in messages]
                assert [uniq(m) for m in pulled.messages] == ids
                assert [m.msg_id for m in pulled.messages] == offset_ids
                assert [m.keys for m in pulled.messages] == [(f"b{i}",) for i in range(32)]

                with pytest.raises(MQClientError, match="same topic"):
                    await producer.send_batch([Message(topic, b"a"), Message("Other", b"b")])

                # Each message of a batch gets UNIQ_KEY (kept if set, made if missing or
                # empty) and WAIT (kept if set) after its own properties, as a single send
                # prepares it.
                odd = [
                    Message(topic, b"plain"),
                    Message(topic, b"own-id", properties={"UNIQ_KEY": "MYID0001", "x": "1"}),
                    Message(topic, b"empty-id", properties={"UNIQ_KEY": "", "y": "2"}),
                    Message(topic, b"no-wait", tags="T", properties={"WAIT": "false"}),
                    Message(topic, b"tags-in-props", properties={"TAGS": "P", "KEYS": "k"}),
                ]
                result = await producer.send_batch(odd)
                ids = result.msg_id.split(",")
                assert ids[1] == "MYID0001" and all(ids) and len(set(ids)) == 5
                pulled = await consumer.pull(
                    result.message_queue, result.queue_offset, 5, suspend_timeout=0
                )
                got = [m.properties for m in pulled.messages]
                assert [p["UNIQ_KEY"] for p in got] == ids
                assert [p["WAIT"] for p in got] == ["true", "true", "true", "false", "true"]
                assert got[1]["x"] == "1" and got[2]["y"] == "2"
                assert pulled.messages[3].tags == "T" and pulled.messages[4].tags == "P"
                assert pulled.messages[4].keys == ("k",)


# ---- errors ------------------------------------------------------------------------------------


async def test_send_errors_are_typed(cluster):
    with trio.fail_after(20):
        async with open_producer(cluster.namesrv_addr, "err-p") as producer:
            with pytest.raises(MQClientError, match="body length is zero"):
                await producer.send(Message("Errors", b""))
            with pytest.raises(MQClientError, match="illegal characters"):
                await producer.send(Message("bad topic!", b"x"))
            # the broker refuses timer messages with MESSAGE_ILLEGAL: never retried
            with pytest.raises(MQBrokerError) as info:
                await producer.send(Message("Errors", b"x", properties={"TIMER_DELAY_SEC": "3"}))
            assert info.value.code == ResponseCode.MESSAGE_ILLEGAL
            assert "timer" in (info.value.remark or "").lower()


async def test_heartbeat_registers_and_close_unregisters(cluster):
    with trio.fail_after(20):
        async with open_client_instance(cluster.namesrv_addr) as client:
            async with open_producer(client, "hb-p") as producer:
                await producer.send(Message("Beats", b"x"))
                async with open_pull_consumer(client, "hb-c") as consumer:
                    (mq, *_) = await consumer.queues("Beats")
                    await consumer.pull(mq, 0, subscription="TagX", suspend_timeout=0)
                    # the background task sends a heartbeat as soon as a group or subscription
                    # is added, to the master and the slave
                    for address in (cluster.master.addr, cluster.slave.addr):
                        async def registered(address=address):
                            return await consumer_ids(client, address, "hb-c") == [client.client_id]

                        await wait_until(registered, f"{address} to list the consumer",
                                         interval=0.05)
                    results = await client.send_heartbeats()
                    assert results == {cluster.master.addr: True, cluster.slave.addr: True}
                    data = client.heartbeat_data()
                    assert [p.group_name for p in data.producer_data_set] == ["hb-p"]
                    (consumer_data,) = data.consumer_data_set
                    assert consumer_data.subscription_data_set[0].sub_string == "TagX"
                # the consumer closed: UNREGISTER_CLIENT removed it
                assert await consumer_ids(client, cluster.master.addr, "hb-c") == []


async def consumer_ids(client, address: str, group: str) -> list[str]:
    response = await client.invoke(
        address, client.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    )
    if response.code != ResponseCode.SUCCESS:
        return []
    return json.loads(response.body)["consumerIdList"]


async def test_routes_are_refreshed_periodically(cluster):
    topic = "Growing"
    with trio.fail_after(20):
        async with open_client_instance(cluster.namesrv_addr, poll_name_server_interval=0.1,
                                        heartbeat_broker_interval=0.1) as client:
            async with open_admin(client) as admin:
                await admin.create_topic(topic, 2)
                async with open_pull_consumer(client, "grow-c") as consumer:
                    await wait_for_route(consumer, topic, 2)
                    await admin.create_topic(topic, 5)  # nobody asks for the route again...
                    await wait_until(lambda: len(client.subscribe_queues(topic)) == 5,
                                     "the periodic refresh to find 5 queues",  # ...it does
                                     timeout=20, interval=0.05)


# ---- admin -------------------------------------------------------------------------------------


async def test_admin(cluster):
    topic = "Administered"
    with trio.fail_after(30):
        async with open_admin(cluster.namesrv_addr) as admin:
            created = await admin.create_topic(topic, 3)
            assert created == {"broker-a": cluster.master.addr}
            route = await wait_until(lambda: admin.topic_route(topic),
                                     f"the name server to route {topic}", interval=0.05)
            (queue_data,) = route.queue_datas
            assert (queue_data.read_queue_nums, queue_data.write_queue_nums) == (3, 3)
            assert topic in await admin.topic_list()

            info = await admin.cluster_info()
            assert info.cluster_addr_table == {"DefaultCluster": frozenset({"broker-a"})}
            assert info.broker_addr_table["broker-a"].broker_addrs == {
                0: cluster.master.addr, 1: cluster.slave.addr,
            }

            master_info = await admin.runtime_info(cluster.master.addr)
            assert master_info["brokerRole"] == "SYNC_MASTER"
            assert int(master_info["commitLogMaxOffset"]) > 0
            slave_info = await admin.runtime_info(cluster.slave.addr)
            assert slave_info["brokerRole"] == "SLAVE"

            mq = MessageQueue(topic, "broker-a", 2)
            async with open_producer(admin.instance, "admin-p") as producer:
                before = (await admin.runtime_info(cluster.master.addr))["commitLogMaxOffset"]
                results = [await producer.send(Message(topic, f"m{i}".encode()), queue=mq)
                           for i in range(5)]
            assert [r.queue_offset for r in results] == list(range(5))
            assert {r.message_queue for r in results} == {mq}
            # A send is answered once its record is in the commitlog (and on the slave); the
            # consume queue that max_offset counts is built from it just after, as RocketMQ's
            # reput service does: the index catches up within a dispatch round.
            async def indexed() -> bool:
                return await admin.max_offset(mq) == 5

            await wait_until(indexed, "the consume queue to index the five messages",
                             interval=0.01)
            assert await admin.min_offset(mq) == 0
            assert await admin.max_offset(MessageQueue(topic, "broker-a", 0)) == 0
            assert await admin.search_offset(mq, 0) == 0
            assert await admin.search_offset(mq, 2**62) == 5
            assert await admin.earliest_msg_store_time(mq) > 0
            message = await admin.view_message(results[3].offset_msg_id)
            assert message.body == b"m3" and message.queue_offset == 3
            assert int(before) > 0

            with pytest.raises(MQClientError, match="cluster"):
                await admin.create_topic("Nowhere", 1, cluster="NoSuchCluster")


# ---- master down and back ------------------------------------------------------------------


async def test_master_down_then_back(cluster):
    topic = "Failover"
    acked = {}
    with trio.fail_after(60):
        async with open_producer(cluster.namesrv_addr, "fo-p", send_msg_timeout=3) as producer, \
                open_pull_consumer(cluster.namesrv_addr, "fo-c") as consumer:
            for i in range(100):
                result = await producer.send(Message(topic, f"before {i}".encode(), tags="T"))
                assert result.send_status is SendStatus.SEND_OK
                acked[result.msg_id] = result
            # the slave must know the topic (it copies topic configs from the master)
            await wait_slave_knows(cluster, consumer, topic)

            # small batches, so most messages are still on the brokers when the master stops
            async with consumer.messages(topic, from_where="first", batch_size=4) as stream:
                got = await consume(stream, 40)

                # ---- the master goes down
                await cluster.master.stop()
                with trio.fail_after(15):
                    with pytest.raises(MQError) as info:
                        await producer.send(Message(topic, b"while down"))
                assert isinstance(info.value, (MQClientError, MQBrokerError))

                # the consumer keeps reading, from the slave
                got += await consume(stream, 60)
                assert consumer.instance.master_addr("broker-a") is None
                (mq, *_) = await consumer.queues(topic, refresh=True)
                assert consumer.instance.find_broker_addr("broker-a") == (cluster.slave.addr, 1)
                direct = await consumer.pull(mq, 0, 4, suspend_timeout=0)
                assert direct.status is PullStatus.FOUND and direct.broker_addr == cluster.slave.addr
                assert direct.suggest_which_broker_id == 0  # the slave points at the master
                await stream.commit()  # goes to the slave while the master is away
                assert await consumer.committed_offset(mq) is not None

                # ---- the master comes back on the same port and store
                await cluster.master.restart()
                for result in await wait_send_ok(producer, topic):
                    acked[result.msg_id] = result
                for i in range(20):
                    result = await producer.send(Message(topic, f"after {i}".encode(), tags="T"))
                    assert result.send_status in STORED
                    acked[result.msg_id] = result
                after = len(acked) - 100
                got += await consume(stream, after)

    ids = [uniq(m) for m in got]
    assert len(ids) == len(set(ids)) == len(acked)
    assert set(ids) == set(acked)  # every acknowledged message, exactly once
    assert_queue_order(got)

    # nothing acknowledged was lost: a new group reads everything from the master
    with trio.fail_after(20):
        async with open_pull_consumer(cluster.namesrv_addr, "fo-audit") as auditor:
            async with auditor.messages(topic, from_where="first") as stream:
                audit = await consume(stream, len(acked))
    assert {uniq(m) for m in audit} == set(acked)
    assert {m.store_host for m in audit} == {cluster.master.addr}


async def wait_slave_knows(cluster, consumer, topic: str) -> None:
    instance = consumer.instance

    async def knows() -> bool:
        # the slave's pull answers TOPIC_NOT_EXIST until it has synced the topic
        response = await instance.invoke(cluster.slave.addr, instance.request(
            RequestCode.PULL_MESSAGE, {
                "consumerGroup": "probe", "topic": topic, "queueId": 0, "queueOffset": 0,
                "maxMsgNums": 1, "sysFlag": 0, "commitOffset": 0,
                "suspendTimeoutMillis": 0, "subVersion": 0,
            }))
        return response.code != ResponseCode.TOPIC_NOT_EXIST

    await wait_until(knows, f"the slave to know {topic}", interval=0.1)


# ---- misc ----------------------------------------------------------------------------------------


async def test_no_name_server_is_a_clear_error(nursery):
    with trio.fail_after(10):
        async with open_producer("127.0.0.1:1", "nobody", send_msg_timeout=1) as producer:
            with pytest.raises(MQClientError, match="no name server answered"):
                await producer.send(Message("Nowhere", b"x"))


async def test_selector_and_explicit_queue(cluster):
    topic = "Selected"
    with trio.fail_after(20):
        async with open_producer(cluster.namesrv_addr, "sel-p") as producer:
            await producer.send(Message(topic, b"create"))
            await wait_for_route(producer, topic, 4)
            counts = collections.Counter()
            for i in range(12):
                result = await producer.send(
                    Message(topic, str(i).encode()),
                    selector=lambda queues, message: queues[int(message.body) % 2],
                )
                counts[result.message_queue.queue_id] += 1
            assert counts == {0: 6, 1: 6}
            mq = MessageQueue(topic, "broker-a", 3)
            result = await producer.send(Message(topic, b"x"), queue=mq)
            assert result.message_queue == mq


# ---- the producer's retry rules, against scripted brokers ---------------------------------------


@attrs.define(eq=False)
class ScriptedCluster:
    """One remoting server playing the name server (a route with two broker groups whose
    masters are two more servers) and brokers that answer sends with scripted codes."""

    namesrv_addr: str = ""
    broker_addrs: dict = attrs.field(factory=dict)
    codes: dict = attrs.field(factory=dict)  # broker name -> response code (None: no answer)
    sends: list = attrs.field(factory=list)  # broker names, in order

    async def start(self, nursery: trio.Nursery) -> None:
        host, port = await nursery.start(
            lambda task_status: serve_remoting(self.namesrv, 0, host="127.0.0.1",
                                               task_status=task_status))
        self.namesrv_addr = f"{host}:{port}"
        for name in ("broker-a", "broker-b"):
            host, port = await nursery.start(
                lambda task_status, name=name: serve_remoting(
                    lambda request, connection: self.broker(name, request), 0,
                    host="127.0.0.1", task_status=task_status))
            self.broker_addrs[name] = f"{host}:{port}"

    async def namesrv(self, request, connection):
        await trio.lowlevel.checkpoint()
        route = TopicRouteData(
            queue_datas=[QueueData(name, 2, 2) for name in self.broker_addrs],
            broker_datas=[BrokerData("c", name, {0: addr}) for name, addr in self.broker_addrs.items()],
        )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=route.encode(standard_json=True))

    async def broker(self, name: str, request):
        await trio.lowlevel.checkpoint()
        if request.code == RequestCode.SEND_MESSAGE_V2:
            self.sends.append(name)
            code = self.codes[name]
            if code is None:
                await trio.sleep_forever()
            fields = {"msgId": "7F0000010000000100000000000000FF", "queueId": request.ext_fields["e"],
                      "queueOffset": 7}
            return RemotingCommand.response_to(request, code, remark=f"scripted {code}",
                                               ext_fields=fields)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


@pytest.mark.parametrize(
    ("codes", "options", "expected_sends", "outcome"),
    [
        # a busy broker: the retry goes to the other broker group
        ({"broker-a": ResponseCode.SYSTEM_BUSY, "broker-b": ResponseCode.SYSTEM_BUSY}, {}, 3,
         ResponseCode.SYSTEM_BUSY),
        ({"broker-a": ResponseCode.SERVICE_NOT_AVAILABLE, "broker-b": ResponseCode.SUCCESS}, {},
         None, SendStatus.SEND_OK),
        # never retried
        ({"broker-a": ResponseCode.MESSAGE_ILLEGAL, "broker-b": ResponseCode.MESSAGE_ILLEGAL}, {},
         1, ResponseCode.MESSAGE_ILLEGAL),
        # stored but not fully: a result, retried elsewhere only when asked to
        ({"broker-a": ResponseCode.SLAVE_NOT_AVAILABLE, "broker-b": ResponseCode.SLAVE_NOT_AVAILABLE},
         {}, 1, SendStatus.SLAVE_NOT_AVAILABLE),
        ({"broker-a": ResponseCode.FLUSH_SLAVE_TIMEOUT, "broker-b": ResponseCode.FLUSH_SLAVE_TIMEOUT},
         {"retry_another_broker_when_not_store_ok": True}, 3, SendStatus.FLUSH_SLAVE_TIMEOUT),
    ],
)
async def test_send_retry_rules(nursery, codes, options, expected_sends, outcome):
    scripted = ScriptedCluster(codes=codes)
    await scripted.start(nursery)
    with trio.fail_after(10):
        async with open_producer(scripted.namesrv_addr, "retry-p", **options) as producer:
            if isinstance(outcome, SendStatus):
                result = await producer.send(Message("Scripted", b"x"))
                assert result.send_status is outcome
                assert result.queue_offset == 7
                if outcome is SendStatus.SEND_OK:
                    assert scripted.sends[-1] == "broker-b"
                    assert len(scripted.sends) <= 2
            else:
                with pytest.raises(MQBrokerError) as info:
                    await producer.send(Message("Scripted", b"x"))
                assert info.value.code == outcome
                assert info.value.remark == f"scripted {int(outcome)}"
    if expected_sends is not None:
        assert len(scripted.sends) == expected_sends
    # consecutive attempts go to different broker groups
    assert all(a != b for a, b in zip(scripted.sends, scripted.sends[1:], strict=False))


async def test_send_to_a_dead_broker_fails_over_and_times_out(nursery):
    scripted = ScriptedCluster(codes={"broker-a": ResponseCode.SUCCESS,
                                      "broker-b": ResponseCode.SUCCESS})
    await scripted.start(nursery)
    dead = await dead_address()
    scripted.broker_addrs["broker-a"] = dead
    with trio.fail_after(10):
        async with open_producer(scripted.namesrv_addr, "dead-p") as producer:
            for _ in range(4):  # whichever group round-robin picks first, the send lands on b
                result = await producer.send(Message("Scripted", b"x"))
                assert result.message_queue.broker_name == "broker-b"
        scripted.broker_addrs["broker-b"] = dead
        async with open_producer(scripted.namesrv_addr, "dead-p2") as producer:
            with pytest.raises(MQClientError, match="failed 3 times"):
                await producer.send(Message("Scripted", b"x"))


async def test_a_send_no_broker_answers_ends_at_its_timeout(nursery):
    """The send's deadline ends its call's wait (the connection's timer, not a cancel scope
    around the send), and the retries after it find no time left: one attempt, then the
    timeout as the send's error; the producer's connection serves the next send."""
    scripted = ScriptedCluster(codes={"broker-a": None, "broker-b": None})
    await scripted.start(nursery)
    with trio.fail_after(10):
        async with open_producer(scripted.namesrv_addr, "mute-p") as producer:
            with pytest.raises(MQClientError, match="timed out after 0.5 s"):
                await producer.send(Message("Scripted", b"x"), timeout=0.5)
            assert len(scripted.sends) == 1
            scripted.codes.update({"broker-a": ResponseCode.SUCCESS,
                                   "broker-b": ResponseCode.SUCCESS})
            result = await producer.send(Message("Scripted", b"y"))
            assert result.send_status is SendStatus.SEND_OK


async def dead_address() -> str:
    """An address nothing listens on."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    return f"127.0.0.1:{port}"


# ---- the pool closes what the peer closed (a socket leak found while writing the client) ----


async def test_pool_closes_a_connection_the_peer_closed(nursery):
    async def close_at_once(stream):
        await stream.aclose()

    listeners = await nursery.start(trio.serve_tcp, close_at_once, 0)
    address = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
    async with open_client_pool() as pool:
        old = await pool.client(address)
        await wait_until(lambda: old.closed, "the pool to close what the peer closed", timeout=5)
        try:
            new = await pool.client(address)  # reconnects
            assert new is not old
            assert isinstance(old.stream, trio.SocketStream)
            assert old.stream.socket.fileno() == -1, "the broken connection's socket is still open"
        finally:
            await old.aclose()  # don't leak from this test


def test_unique_ids_have_java_createuniqid_layout():
    """MessageClientIDSetter.createUniqID's 16 bytes as 32 upper-case hex digits: client ip,
    pid, a per-process random, milliseconds since the start of the month, a counter."""
    generator = _UniqIdGenerator()
    before = time.time()
    first, second = generator.create("10.1.2.3"), generator.create("10.1.2.3")
    after = time.time()
    for uniq in (first, second):
        assert len(uniq) == 32 and uniq == uniq.upper()
        raw = bytes.fromhex(uniq)
        assert raw[:4] == socket.inet_aton("10.1.2.3")
        assert int.from_bytes(raw[4:6], "big") == os.getpid() & 0xFFFF
    assert first[:20] == second[:20]  # ip, pid and the random: one per process
    now = time.localtime(before)
    month_start = time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1))
    elapsed_ms = int.from_bytes(bytes.fromhex(first)[10:14], "big")
    assert int((before - month_start) * 1000) - 1 <= elapsed_ms <= int((after - month_start) * 1000) + 1
    counters = [int.from_bytes(bytes.fromhex(u)[14:16], "big") for u in (first, second)]
    assert counters[1] == (counters[0] + 1) & 0xFFFF


def test_a_batchs_ids_made_at_once_are_what_one_by_one_would_make():
    """create_many (a batch's messages) gives the ids create would give one by one within a
    millisecond: the same prefix, the time, consecutive counters — across the wrap of the
    16-bit counter — and create carries on after them."""
    generator = _UniqIdGenerator()
    generator._counter = itertools.count(0xFFFE)
    before = generator.create("10.1.2.3")
    batch = generator.create_many("10.1.2.3", 5)
    after = generator.create("10.1.2.3")
    assert len(set(batch)) == 5
    for uniq in batch:
        assert len(uniq) == 32 and uniq == uniq.upper()
        assert uniq[:20] == before[:20]
    times = [int(u[20:28], 16) for u in (before, *batch, after)]
    assert times == sorted(times)  # the clock at each call (one reading for the batch)
    counters = [int(u[28:], 16) for u in (before, *batch, after)]
    assert counters == [0xFFFE, 0xFFFF, 0, 1, 2, 3, 4]
    assert generator.create_many("10.1.2.3", 0) == []
