"""Issue 36, defect 6 with the real RocketMQ 4.9.8 Java client: its consumer commits to the
slave while the master is down (RemoteBrokerOffsetStore falls back to any broker of the name);
once the master is back and the slave has synced, a consumer of the group reads nothing
again."""

from __future__ import annotations

import pytest

from conftest import wait_until
from test_interop_java_client import consume, produce
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.testing.rocketmq import RocketMQ
from trio_ha.wire.metadata import decode_consumer_offsets
from trio_ha.wire.remoting import RemotingCommand, RequestCode

pytestmark = pytest.mark.interop


async def test_a_java_groups_outage_commits_reach_the_returning_master_as_rocketmq_does_not(
        rocketmq_clients: RocketMQ, tmp_path):
    config = ClusterConfig(
        data_dir=str(tmp_path / "ours"), master_port=free_broker_port(),
        slave_ports=(free_broker_port(),),
        properties={"slaveSyncInterval": 500, "haReconnectInterval": 200})
    with ProcessCluster.start(config) as cluster:
        namesrv, master, slave = cluster.namesrv_addr, cluster.master.addr, cluster.slave.addr
        sent = produce(rocketmq_clients, tmp_path / "producer", namesrv, "JavaOutage", 100)
        assert {line["status"] for line in sent} == {"SEND_OK"}
        before = consume(rocketmq_clients, tmp_path / "c1", "pull", namesrv, "JavaOutage",
                         "jbilling", 40)

        async def total(address: str) -> int:
            """The group's committed offsets on ``address``, summed over the queues."""
            async with open_remoting_client(address) as client:
                reply = await client.invoke(
                    RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET), 5)
            table = decode_consumer_offsets(reply.body).offset_table
            return sum(table.get("JavaOutage@jbilling", {}).values())

        async def slave_copied() -> bool:
            return await total(slave) == await total(master) > 0

        await wait_until(slave_copied, "the slave to copy the group's offsets", timeout=20,
                         interval=0.2)
        cluster.master.kill()
        # (the 60 the first consumer left: it committed its 40 as it shut down)
        during = consume(rocketmq_clients, tmp_path / "c2", "pull", namesrv, "JavaOutage",
                         "jbilling", 60)
        seen = {line["msgId"] for line in before} | {line["msgId"] for line in during}
        assert {line["msgId"] for line in sent} <= seen
        assert await total(slave) == 100  # the Java consumer committed to the slave

        cluster.restart(cluster.master)

        async def master_learned() -> bool:
            return await total(master) == 100

        await wait_until(master_learned, "the master to learn the offsets committed to the slave",
                         timeout=30, interval=0.3)
        # A consumer rebalances and pulls as it starts: were the offsets wrong, it would have
        # messages within a second or two; 12 s is ample.
        again = consume(rocketmq_clients, tmp_path / "c3", "pull", namesrv, "JavaOutage",
                        "jbilling", 1, max_seconds=12)
        assert again == []  # nothing is delivered twice
