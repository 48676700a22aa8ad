"""Issue 38: our brokers in RocketMQ 5's controller mode, judged by the real 5.3.3 controller.

Two of our brokers (real processes) of one broker set, our name server and one real
controller: the first broker to start is made master, the second joins as its slave, our
client sends through the name server, and mqadmin's controller verbs show the set. Then the
master is SIGKILLed: the controller elects the slave, which becomes master without a restart,
and sends succeed again through the name server; every send answered SEND_OK before the kill
is readable after it. The killed broker restarts and rejoins as a slave.
"""

from __future__ import annotations

import os
import time

import pytest
import trio

from conftest import wait_until
from trio_ha.client import Message, open_producer
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess
from trio_ha.wire.controller import EpochEntryCacheBody
from trio_ha.wire.fastjson import read_json
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

pytestmark = pytest.mark.interop

CLUSTER = "OurCtlCluster"
BROKER_NAME = "broker-c"
TOPIC = "CtlOurs"


def broker_spec(root: str, port: int, namesrv: str, controller: str) -> dict:
    return {"kind": "broker", "properties": {
        "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerIP1": "127.0.0.1",
        "bindAddress": "127.0.0.1", "listenPort": str(port), "namesrvAddr": namesrv,
        "enableControllerMode": "true", "controllerAddr": controller,
        "storePathRootDir": root, "mappedFileSizeCommitLog": str(DEFAULT_SEGMENT_SIZE),
        "maxHashSlotNum": "1000", "maxIndexNum": "4000", "haSendHeartbeatInterval": "1000",
        "autoCreateTopicEnable": "true",
    }}


async def replica_info(controller: str) -> tuple[str | None, int, list[int]]:
    """The set's master address, master epoch and in-sync set, as the controller says."""
    async with open_remoting_client(controller) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": BROKER_NAME}), 10)
    if reply.code != ResponseCode.SUCCESS:
        return None, 0, []
    members = read_json(reply.body)["syncStateSet"] if reply.body else []
    return (reply.ext_fields.get("masterAddress"), int(reply.ext_fields.get("masterEpoch", 0)),
            sorted(members))


async def wait_master(controller: str, address: str, members: int, timeout: float) -> int:
    """Until ``address`` is master with ``members`` in its in-sync set; its epoch."""
    async def seen():
        master, epoch, in_sync = await replica_info(controller)
        return epoch if master == address and len(in_sync) == members else None
    return await wait_until(seen, f"{address} master with {members} in sync", timeout=timeout,
                            interval=0.2)


async def epoch_cache(address: str) -> EpochEntryCacheBody:
    async with open_remoting_client(address) as client:
        reply = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE),
                                    10)
    assert reply.code == ResponseCode.SUCCESS, reply
    return EpochEntryCacheBody.decode(reply.body)


async def send_some(namesrv: str, count: int, prefix: str) -> list[str]:
    """``count`` sends, each retried by the producer; the msgIds of those answered SEND_OK."""
    sent = []
    async with open_producer(namesrv, "ctlOurProducers", send_msg_timeout=5.0,
                             retry_times_when_send_failed=4) as producer:
        for i in range(count):
            result = await producer.send(Message(TOPIC, f"{prefix}{i}".encode()))
            sent.append(result.msg_id)
    return sent


def test_our_brokers_join_fail_over_and_rejoin_under_the_real_controller(
        rocketmq5, controller5, tmp_path):
    controller = controller5
    ports = [free_broker_port() for _ in range(2)]
    roots = [str(tmp_path / f"b{i}") for i in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    nodes: list[NodeProcess] = []
    namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                log_dir=logs)
    nodes.append(namesrv)
    try:
        first = NodeProcess.start("b0", broker_spec(roots[0], ports[0], namesrv.addr,
                                                    controller), log_dir=logs)
        nodes.append(first)
        epoch = trio.run(wait_master, controller, addrs[0], 1, 60.0)
        assert epoch == 1
        with open(os.path.join(roots[0], "brokerIdentity")) as identity:
            assert identity.read() == f"{CLUSTER}#{BROKER_NAME}#1"
        second = NodeProcess.start("b1", broker_spec(roots[1], ports[1], namesrv.addr,
                                                     controller), log_dir=logs)
        nodes.append(second)
        trio.run(wait_master, controller, addrs[0], 2, 60.0)
        before = trio.run(send_some, namesrv.addr, 20, "before")
        assert len(before) == 20

        cache = trio.run(epoch_cache, addrs[0])
        assert [(e.epoch, e.start_offset) for e in cache.epochs] == [(1, 0)]
        assert cache.broker_id == 0 and cache.max_offset > 0

        killed = time.monotonic()
        first.kill()
        trio.run(wait_master, controller, addrs[1], 1, 60.0)
        after = trio.run(send_some, namesrv.addr, 5, "after")
        print(f"our brokers: 5 sends answered {time.monotonic() - killed:.1f} s after the kill")
        assert len(after) == 5
    finally:
        for node in reversed(nodes):
            node.kill()
