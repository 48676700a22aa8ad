"""The newcomer's cluster: a name server, a SYNC_MASTER and its SLAVE on loopback, on
RocketMQ's usual ports, data under one directory.

``trio-ha dev-cluster`` (and ``bin/run``) use it so a newcomer sees replication work in a
minute. It is :func:`trio_ha.testing.serve_cluster` with the settings a local try-out wants
(RocketMQ's ports, 64 MiB segments, slaves allowed to fall far behind); tests use the same
helper with port 0.
"""

from __future__ import annotations

import trio

from .testing import ClusterConfig, serve_cluster

#: broker.conf keys of every dev-cluster broker, beside those the cluster helper derives
DEV_PROPERTIES = {
    "mappedFileSizeCommitLog": 64 * 1024 * 1024,
    "autoCreateTopicEnable": "true",
    "haSlaveFallbehindMax": 256 * 1024 * 1024,
}


def dev_cluster_config(
    data_dir: str, *, namesrv_port: int = 9876, master_port: int = 10911,
    slave_port: int = 10921, host: str = "127.0.0.1",
) -> ClusterConfig:
    """The dev cluster: SYNC_MASTER + one SLAVE, ASYNC_FLUSH, cluster ``DevCluster``."""
    return ClusterConfig(
        data_dir=data_dir, slaves=1, master_role="SYNC_MASTER", flush_disk_type="ASYNC_FLUSH",
        properties=DEV_PROPERTIES, host=host, namesrv_port=namesrv_port,
        master_port=master_port, slave_ports=(slave_port,), cluster_name="DevCluster",
    )


async def serve_dev_cluster(
    data_dir: str,
    *,
    namesrv_port: int = 9876,
    master_port: int = 10911,
    slave_port: int = 10921,
    host: str = "127.0.0.1",
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the three nodes until cancelled; reports a ``ClusterAddresses``."""
    config = dev_cluster_config(data_dir, namesrv_port=namesrv_port, master_port=master_port,
                                slave_port=slave_port, host=host)
    await serve_cluster(config, task_status=task_status)
