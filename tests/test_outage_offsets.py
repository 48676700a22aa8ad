"""Issue 36, defect 6: offsets a group commits to the slave while the master is down reach the
master when it returns, so the group is not handed the same messages again. The README tour's
steps, with real processes: produce, consume part, kill the master, consume the rest from the
slave, restart the master."""

from __future__ import annotations

import trio

from conftest import wait_until
from trio_ha import Message
from trio_ha.broker.metadata import BrokerMetadata, ConsumerOffsetManager
from trio_ha.broker.slave_sync import hand_over_offsets
from trio_ha.chaos import hostile
from trio_ha.client import open_admin, open_producer, open_pull_consumer
from trio_ha.remoting import RemotingClientPool, open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port, serve_cluster
from trio_ha.wire.metadata import ConsumerOffsetTable, decode_consumer_offsets, decode_topics_json
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

TOPIC = "Orders"
GROUP = "billing"


async def committed(address: str) -> int:
    """The sum of the group's committed offsets of TOPIC on ``address`` (its consumed count,
    since it started at offset 0 of every queue)."""
    async with open_remoting_client(address) as client:
        reply = await client.invoke(
            RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    table = decode_consumer_offsets(reply.body).offset_table
    return sum(table.get(f"{TOPIC}@{GROUP}", {}).values())


async def committed_of(address: str, key: str) -> dict[int, int]:
    async with open_remoting_client(address) as client:
        reply = await client.invoke(
            RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET), 5)
    return dict(decode_consumer_offsets(reply.body).offset_table.get(key, {}))


async def consume(namesrv: str, count: int | None, idle: float) -> int:
    """Read with the group until ``count`` messages (or ``idle`` seconds without one); the
    stream commits the offsets when its block ends. Returns how many arrived."""
    received = 0
    async with open_pull_consumer(namesrv, GROUP) as consumer:
        async with consumer.messages(TOPIC, from_where="first", suspend_timeout=1) as stream:
            while count is None or received < count:
                with trio.move_on_after(idle):
                    await stream.__anext__()
                    received += 1
                    continue
                break
    return received


async def test_offsets_committed_during_an_outage_reach_the_returning_master_as_rocketmq_does_not(
        tmp_path):
    config = ClusterConfig(
        data_dir=tmp_path, master_role="SYNC_MASTER", master_port=free_broker_port(),
        slave_ports=(free_broker_port(),),
        properties={"slaveSyncInterval": 500, "haReconnectInterval": 200,
                    "vipChannelEnable": "false"})
    with ProcessCluster.start(config) as cluster, trio.fail_after(120):
        namesrv, master, slave = cluster.namesrv_addr, cluster.master.addr, cluster.slave.addr
        async with open_admin(namesrv) as admin:
            await admin.create_topic(TOPIC, 4)
        async with open_producer(namesrv, "tour-producer") as producer:
            for i in range(1000):
                await producer.send(Message(TOPIC, f"order #{i}".encode(), keys="order-1"))

        assert await consume(namesrv, 400, idle=10) == 400
        assert await committed(master) == 400

        async def slave_copied() -> bool:
            return await committed(slave) == 400

        await wait_until(slave_copied, "the slave to copy the group's offsets", timeout=20,
                         interval=0.2)

        # The master dies; the other 600 are read from the slave, which takes the commits.
        cluster.master.kill()
        assert await consume(namesrv, 600, idle=10) == 600
        assert await committed(slave) == 1000

        # The master comes back with the 400 it had; the slave attaches and syncs.
        cluster.restart(cluster.master)

        async def lag() -> int:
            async with open_admin(namesrv) as admin:
                return (await admin.consume_stats(GROUP, TOPIC)).lag

        async def caught_up() -> bool:
            return await committed(master) == 1000 and await lag() == 0

        await wait_until(caught_up, "the master to learn the offsets committed to the slave",
                         timeout=30, interval=0.3)
        assert await committed(slave) == 1000
        assert await consume(namesrv, None, idle=3) == 0  # nothing is delivered twice


async def test_an_offset_committed_to_the_slave_past_the_queues_end_reaches_the_master_capped(
        tmp_path):
    """The hostile suite's attack: a consumer's commit far past the end of a queue, made to
    the slave, is handed to the master no further than the queue's end."""
    config = ClusterConfig(data_dir=tmp_path, master_role="SYNC_MASTER",
                           properties={"slaveSyncInterval": 300, "vipChannelEnable": "false"})
    with ProcessCluster.start(config) as cluster, trio.fail_after(60):
        master, slave = cluster.master.addr, cluster.slave.addr
        async with open_admin(cluster.namesrv_addr) as admin:
            await admin.create_topic("Capped", 1)
        async with open_producer(cluster.namesrv_addr, "capped-producer") as producer:
            for i in range(5):
                await producer.send(Message("Capped", f"m{i}".encode()))

        async def slave_has_the_topic() -> bool:
            async with open_remoting_client(slave) as client:
                reply = await client.invoke(
                    RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), 5)
            return "Capped" in decode_topics_json(reply.body).topic_config_table

        await wait_until(slave_has_the_topic, "the slave to copy the topic", timeout=20,
                         interval=0.2)
        outcome = await hostile.offset_past_the_end_through_the_slave(slave, master, "Capped",
                                                                      seconds=20)
        assert outcome.answers == {"UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:SUCCESS": 1,
                                   "UPDATE_CONSUMER_OFFSET:SUCCESS": 1, "master:capped": 1}


async def test_an_offset_past_the_masters_shorter_queue_is_handed_over_at_its_end(
        nursery, tmp_path):
    """A master that lost its log's tail has a shorter queue than the slave the group read
    from: the master is moved to its own end, and the slave stops handing that offset over."""
    addresses = await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "cluster", master_role="ASYNC_MASTER", slaves=0))
    async with open_admin(addresses.namesrv_addr) as admin:
        await admin.create_topic("Short", 1)
    async with open_producer(addresses.namesrv_addr, "short-producer") as producer:
        for i in range(3):
            await producer.send(Message("Short", f"m{i}".encode()))
    master = addresses.master.broker_addr
    metadata = BrokerMetadata.load(tmp_path / "slave-config")
    metadata.offsets.commit_on_slave("g", "Short", 0, 1000)  # read here, past the master's 3
    async with trio.open_nursery() as pool_tasks:
        pool = RemotingClientPool(pool_tasks)
        outcome = await hand_over_offsets(pool, master, metadata, ConsumerOffsetTable({}))
        await pool.aclose()
    assert outcome is not None and outcome.ok, outcome
    assert "1 capped" in outcome.detail
    assert await committed_of(master, "Short@g") == {0: 3}
    assert metadata.offsets.waiting_for_master == 0


# ---- the rules of the handover, on the offset table alone -------------------------------------


def slave_table(tmp_path, master: dict[str, dict[int, int]]) -> ConsumerOffsetManager:
    """A slave's offset table that copied ``master``'s."""
    offsets = ConsumerOffsetManager.load(tmp_path)
    offsets.merge_from_master(ConsumerOffsetTable(master))
    return offsets


def test_only_offsets_committed_on_the_slave_and_ahead_of_the_master_are_handed_over(tmp_path):
    offsets = slave_table(tmp_path, {"t@g": {0: 400, 1: 400, 2: 400}})
    offsets.commit_on_slave("g", "t", 0, 1000)  # ahead: handed over
    offsets.commit_on_slave("g", "t", 1, 300)   # behind the master: it wins, nothing sent
    offsets.commit_on_slave("g", "new", 0, 7)   # the master has none
    returned = ConsumerOffsetTable({"t@g": {0: 400, 1: 400, 2: 400}})
    assert sorted(offsets.handover(returned)) == [("new@g", 0, 7), ("t@g", 0, 1000)]
    assert offsets.waiting_for_master == 2
    offsets.handed_over("t@g", 0, 1000)
    offsets.handed_over("new@g", 0, 7)
    assert offsets.waiting_for_master == 0
    assert offsets.handover(returned) == []


def test_a_reset_on_the_master_is_not_undone_by_the_slaves_copies(tmp_path):
    """An operator moved the group back on the master; the slave still holds the copied
    offsets from before (its merge never moves back), but copies are never handed over."""
    offsets = slave_table(tmp_path, {"t@g": {0: 900}})
    assert offsets.handover(ConsumerOffsetTable({"t@g": {0: 100}})) == []


def test_a_handed_over_offset_is_capped_at_the_queues_end(tmp_path):
    offsets = slave_table(tmp_path, {"t@g": {0: 10}})
    offsets.commit_on_slave("g", "t", 0, 5000)  # a consumer's commit past the queue's end
    ends = {("t", 0): 250}
    assert offsets.handover(ConsumerOffsetTable({"t@g": {0: 10}}),
                            lambda topic, queue: ends[topic, queue]) == [("t@g", 0, 250)]
    # the master took 250, which is the end: nothing more to send
    assert offsets.handover(ConsumerOffsetTable({"t@g": {0: 250}}),
                            lambda topic, queue: ends[topic, queue]) == []


def test_a_commit_after_the_handover_was_sent_is_still_handed_over(tmp_path):
    offsets = slave_table(tmp_path, {})
    offsets.commit_on_slave("g", "t", 0, 50)
    assert offsets.handover(ConsumerOffsetTable({})) == [("t@g", 0, 50)]
    offsets.commit_on_slave("g", "t", 0, 60)  # while the request to the master was out
    offsets.handed_over("t@g", 0, 50)
    assert offsets.handover(ConsumerOffsetTable({"t@g": {0: 50}})) == [("t@g", 0, 60)]
    offsets.remove_group("g")
    assert offsets.waiting_for_master == 0
