"""A whole cluster in one process: a name server, a SYNC_MASTER and its SLAVE, on loopback.

``trio-ha dev-cluster`` (and ``bin/run``) use it so a newcomer sees replication work in a
minute; tests use it with port 0. ``serve_dev_cluster`` runs in the caller's nursery and
reports a ``DevCluster`` with the nodes' addresses; each node is the real thing
(``serve_namesrv``, ``serve_broker``) with embedded defaults and its data under one directory.
"""

from __future__ import annotations

import os

import attrs
import trio

from .broker import BrokerAddresses, BrokerConfig, serve_broker
from .namesrv import NamesrvConfig, serve_namesrv


@attrs.frozen
class DevCluster:
    namesrv_addr: str
    master: BrokerAddresses
    slave: BrokerAddresses
    data_dir: str


def broker_properties(
    data_dir: str, *, role: str, broker_id: int, listen_port: int, namesrv_addr: str,
    host: str = "127.0.0.1",
) -> str:
    """The broker.conf of one dev-cluster broker (RocketMQ key names)."""
    name = "master" if broker_id == 0 else f"slave{broker_id}"
    return "\n".join([
        "brokerClusterName=DevCluster",
        "brokerName=broker-a",
        f"brokerId={broker_id}",
        f"brokerRole={role}",
        "flushDiskType=ASYNC_FLUSH",
        f"listenPort={listen_port}",
        f"bindAddress={host}",
        f"brokerIP1={host}",
        f"haBindAddress={host}",
        f"namesrvAddr={namesrv_addr}",
        f"storePathRootDir={os.path.join(data_dir, name)}",
        "mappedFileSizeCommitLog=67108864",
        "autoCreateTopicEnable=true",
        "haSlaveFallbehindMax=268435456",
        "haReconnectInterval=1000",
        "",
    ])


async def serve_dev_cluster(
    data_dir: str,
    *,
    namesrv_port: int = 9876,
    master_port: int = 10911,
    slave_port: int = 10921,
    host: str = "127.0.0.1",
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the three nodes until cancelled; reports a DevCluster."""
    os.makedirs(data_dir, exist_ok=True)
    async with trio.open_nursery() as nursery:
        ns_host, ns_port = await nursery.start(
            serve_namesrv, NamesrvConfig(listen_port=namesrv_port, bind_address=host)
        )
        namesrv_addr = f"{host}:{ns_port}"
        master = await nursery.start(serve_broker, BrokerConfig.from_properties(broker_properties(
            data_dir, role="SYNC_MASTER", broker_id=0, listen_port=master_port,
            namesrv_addr=namesrv_addr, host=host,
        )))
        slave = await nursery.start(serve_broker, BrokerConfig.from_properties(broker_properties(
            data_dir, role="SLAVE", broker_id=1, listen_port=slave_port,
            namesrv_addr=namesrv_addr, host=host,
        )))
        task_status.started(DevCluster(namesrv_addr, master, slave, data_dir))
