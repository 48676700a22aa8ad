"""The newcomer's cluster: a name server and one or more broker groups (a master and its
slaves each) on loopback, on RocketMQ's usual ports, data under one directory.

``trio-ha dev-cluster`` (and ``bin/run``) use it so a newcomer sees replication work in a
minute: by default one SYNC_MASTER and its SLAVE. It grows to what a user wants to try:
no slave or two, an ASYNC_MASTER, SYNC_FLUSH, and several broker groups behind one name
server (``broker-a``, ``broker-b``...; the way RocketMQ scales out: a topic's queues are
spread over every group's master, and a producer sends round the lot).

Each group is :class:`trio_ha.testing.ClusterConfig`'s brokers with the settings a local
try-out wants (64 MiB segments, topics created on first use, slaves allowed to fall far
behind); the name server is shared.
"""

from __future__ import annotations

import os
import string

import attrs
import trio

from .namesrv import NamesrvConfig, serve_namesrv
from .testing import ClusterAddresses, ClusterConfig
from .testing.cluster import ClusterBroker

__all__ = ["DEV_PROPERTIES", "DevClusterAddresses", "dev_group_configs", "serve_dev_cluster"]

#: broker.conf keys of every dev-cluster broker, beside those the cluster helper derives
DEV_PROPERTIES = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
    "autoCreateTopicEnable": "true",
    "haSlaveFallbehindMax": 256 * 1024 * 1024,
}
#: the ports of group g are those of the first group plus g times this
GROUP_PORT_STRIDE = 100
#: the second slave of a group listens this far above the first
SLAVE_PORT_STRIDE = 10
#: at most this many broker groups (broker-a ... broker-z)
MAX_GROUPS = len(string.ascii_lowercase)


@attrs.frozen
class DevClusterAddresses:
    """Where a running dev cluster listens: the name server, and each group's brokers."""

    namesrv_addr: str
    groups: tuple[ClusterAddresses, ...]
    data_dir: str

    @property
    def master(self):
        """The first group's master."""
        return self.groups[0].master

    @property
    def slaves(self):
        """The first group's slaves."""
        return self.groups[0].slaves


def _port(base: int, offset: int) -> int:
    return 0 if base == 0 else base + offset


def dev_group_configs(
    data_dir: str, *, groups: int = 1, slaves: int = 1, master_role: str = "SYNC_MASTER",
    flush_disk_type: str = "ASYNC_FLUSH", master_port: int = 10911, slave_port: int = 10921,
    host: str = "127.0.0.1",
) -> list[ClusterConfig]:
    """One ClusterConfig per broker group: ``broker-a`` keeps its data in ``data_dir/broker-a``
    (or ``data_dir`` itself when it is the only group, as before groups existed) and listens
    on ``master_port`` (its slaves on ``slave_port``, ``slave_port + 10``); group g adds
    100 g to every port. Port 0 leaves every port to the OS."""
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"groups must be 1..{MAX_GROUPS}, not {groups}")
    if not 0 <= slaves <= 2:
        raise ValueError(f"slaves must be 0, 1 or 2, not {slaves}")
    configs = []
    for g in range(groups):
        name = f"broker-{string.ascii_lowercase[g]}"
        shift = g * GROUP_PORT_STRIDE
        configs.append(ClusterConfig(
            data_dir=data_dir if groups == 1 else os.path.join(data_dir, name),
            slaves=slaves, master_role=master_role, flush_disk_type=flush_disk_type,
            properties=DEV_PROPERTIES, host=host, master_port=_port(master_port, shift),
            slave_ports=tuple(_port(slave_port, shift + SLAVE_PORT_STRIDE * i)
                              for i in range(slaves)),
            cluster_name="DevCluster", broker_name=name,
        ))
    return configs


async def serve_dev_cluster(
    data_dir: str,
    *,
    groups: int = 1,
    slaves: int = 1,
    master_role: str = "SYNC_MASTER",
    flush_disk_type: str = "ASYNC_FLUSH",
    namesrv_port: int = 9876,
    master_port: int = 10911,
    slave_port: int = 10921,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[DevClusterAddresses] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the name server and every group's brokers until cancelled; reports a
    ``DevClusterAddresses`` once all serve. Leaving stops the brokers first (they unregister),
    then the name server."""
    configs = dev_group_configs(
        data_dir, groups=groups, slaves=slaves, master_role=master_role,
        flush_disk_type=flush_disk_type, master_port=master_port, slave_port=slave_port,
        host=host)
    await trio.to_thread.run_sync(lambda: os.makedirs(data_dir, exist_ok=True))
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(
            serve_namesrv, NamesrvConfig(listen_port=namesrv_port, bind_address=host))
        namesrv_addr = f"{host}:{port}"
        brokers = [[ClusterBroker(i, config.broker_properties(i, namesrv_addr), nursery)
                    for i in range(config.slaves + 1)] for config in configs]
        try:
            for group in brokers:
                for broker in group:
                    await broker.start()
            task_status.started(DevClusterAddresses(
                namesrv_addr,
                tuple(ClusterAddresses(namesrv_addr, group[0].started_addresses,
                                       tuple(b.started_addresses for b in group[1:]),
                                       config.data_dir)
                      for config, group in zip(configs, brokers, strict=True)),
                data_dir))
            await trio.sleep_forever()
        finally:
            all_brokers = [b for group in brokers for b in group]
            for broker in all_brokers:
                broker.cancel()
            with trio.CancelScope(shield=True):
                for broker in all_brokers:
                    await broker.wait_stopped()
            nursery.cancel_scope.cancel()
