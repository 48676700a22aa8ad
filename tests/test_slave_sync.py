"""Slave metadata sync end to end (issue 12): topics, groups and offsets made on the master
arrive on the slave; after the master restarts with older offsets than the slave holds (a
consumer committed to the slave while the master was down), the slave keeps the newer ones
(RocketMQ #1094)."""

from __future__ import annotations

import trio

from conftest import wait_until
from trio_ha.client import open_admin
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.wire.metadata import (
    decode_consumer_offsets,
    decode_subscription_groups,
    decode_topics_json,
)
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


def commit(group: str, topic: str, queue: int, offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset})


async def body_of(address: str, code: int) -> bytes:
    async with open_remoting_client(address) as client:
        reply = await client.invoke(RemotingCommand.request(code), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return reply.body


async def slave_offset(slave: str, key: str, queue: int) -> int | None:
    table = decode_consumer_offsets(await body_of(slave, RequestCode.GET_ALL_CONSUMER_OFFSET))
    return table.offset_table.get(key, {}).get(queue)


async def test_metadata_reaches_the_slave_and_newer_slave_offsets_survive_a_master_restart(
        tmp_path):
    config = ClusterConfig(data_dir=tmp_path, master_role="SYNC_MASTER",
                           master_port=free_broker_port(), slave_ports=(free_broker_port(),),
                           properties={"slaveSyncInterval": 300, "vipChannelEnable": "false"})
    with ProcessCluster.start(config) as cluster, trio.fail_after(90):
        master, slave = cluster.master.addr, cluster.slave.addr
        async with open_admin(cluster.namesrv_addr) as admin:
            await admin.create_topic("Synced", 2)
        async with open_remoting_client(master) as client:
            for queue, offset in ((0, 10), (1, 4)):
                reply = await client.invoke(commit("gsync", "Synced", queue, offset), 5)
                assert reply.code == ResponseCode.SUCCESS, reply.remark

        async def arrived() -> bool:
            topics = decode_topics_json(
                await body_of(slave, RequestCode.GET_ALL_TOPIC_CONFIG)).topic_config_table
            groups = decode_subscription_groups(await body_of(
                slave, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)).subscription_group_table
            return ("Synced" in topics and "gsync" in groups
                    and await slave_offset(slave, "Synced@gsync", 0) == 10)

        await wait_until(arrived, "the topic, group and offsets on the slave", timeout=20,
                         interval=0.2)

        # The master goes; a consumer commits further on the slave meanwhile.
        cluster.master.kill()
        async with open_remoting_client(slave) as client:
            reply = await client.invoke(commit("gsync", "Synced", 0, 15), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
        assert await slave_offset(slave, "Synced@gsync", 0) == 15

        # The master comes back with its older offsets (10) and moves queue 1 on.
        cluster.restart(cluster.master)
        async with open_remoting_client(master) as client:
            reply = await client.invoke(commit("gsync", "Synced", 1, 6), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark

        async def synced_after_restart() -> bool:
            return await slave_offset(slave, "Synced@gsync", 1) == 6

        await wait_until(synced_after_restart, "a sync after the restart", timeout=30,
                         interval=0.2)
        assert await slave_offset(slave, "Synced@gsync", 0) == 15  # never moved back
