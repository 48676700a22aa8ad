"""A whole cluster in one process: a name server, a master and its slaves on loopback.

Tests, ``trio-ha dev-cluster`` and the benchmarks all need the same thing: a name server, a
master broker and N slaves that find each other through it, each the real server
(``serve_namesrv``, ``serve_broker``) with its own store under one data directory, on ports
the OS chooses unless told otherwise. :class:`ClusterConfig` says what to run; it is the one
place that turns "a SYNC_MASTER with two slaves, SYNC_FLUSH, these extra keys" into each
broker's ``broker.conf`` (RocketMQ key names), so the in-process form here and the
child-process form (:mod:`trio_ha.testing.processes`) run the same brokers.

Two shapes, as trio's own servers have:

* ``await nursery.start(serve_cluster, config)`` runs in the caller's nursery until cancelled
  and reports the cluster's addresses (a frozen :class:`ClusterAddresses`);
* ``async with open_cluster(config) as cluster`` gives a live :class:`Cluster` whose brokers a
  test can stop and restart (same ports, same store) while the rest keeps running.

Leaving either stops the brokers first (they unregister from a name server that is still
there), then the name server.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Mapping

import attrs
import trio

from ..broker import BrokerAddresses, BrokerConfig, serve_broker
from ..config import BrokerRole, FlushDiskType, parse_properties_text
from ..namesrv import NamesrvConfig, serve_namesrv
from .ports import free_broker_port

__all__ = [
    "Cluster",
    "ClusterAddresses",
    "ClusterBroker",
    "ClusterConfig",
    "open_cluster",
    "serve_cluster",
]

#: Small segments unless told otherwise: tests cross segment boundaries and leave little on
#: disk (RocketMQ's default is 1 GiB per segment, warmed page by page).
DEFAULT_SEGMENT_SIZE = 1 << 20


def _properties(value: Mapping[str, object] | str) -> dict[str, str]:
    if isinstance(value, str):
        return parse_properties_text(value)
    return {str(key): str(item) for key, item in value.items()}


def _master_role(value: BrokerRole | str) -> BrokerRole:
    role = BrokerRole(value)
    if role is BrokerRole.SLAVE:
        raise ValueError("a cluster's master is SYNC_MASTER or ASYNC_MASTER, not SLAVE")
    return role


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """What to run: a name server, a master and ``slaves`` slaves, all on ``host``.

    ``properties`` (a mapping or ``broker.conf`` text, RocketMQ key names) go to every
    broker and win over what this class derives, as an explicit value always does in a
    ``broker.conf``. Ports are 0 (the OS chooses) unless given.
    """

    #: every broker's store lives in a directory under it (``master``, ``slave1``, ...)
    data_dir: str = attrs.field(converter=os.fspath)
    slaves: int = attrs.field(default=1, validator=attrs.validators.ge(0))
    master_role: BrokerRole = attrs.field(default=BrokerRole.SYNC_MASTER, converter=_master_role)
    flush_disk_type: FlushDiskType = attrs.field(
        default=FlushDiskType.ASYNC_FLUSH, converter=FlushDiskType
    )
    properties: Mapping[str, str] = attrs.field(factory=dict, converter=_properties)
    host: str = "127.0.0.1"
    namesrv_port: int = 0
    master_port: int = 0
    #: the slaves' listen ports, in order; missing ones are 0
    slave_ports: tuple[int, ...] = attrs.field(default=(), converter=tuple)
    cluster_name: str = "DefaultCluster"
    broker_name: str = "broker-a"
    #: namesrv.conf keys for the name server (TLS, ACL: ``tls.server.mode``, ``aclEnable``...)
    namesrv_properties: Mapping[str, str] = attrs.field(factory=dict, converter=_properties)

    def namesrv_config(self) -> NamesrvConfig:
        """The name server's config: its address, and ``namesrv_properties``."""
        return NamesrvConfig.from_properties({
            "listenPort": str(self.namesrv_port), "bindAddress": self.host,
            **self.namesrv_properties})

    def store_dir(self, broker_id: int) -> str:
        """Where broker ``broker_id`` (0: the master) keeps its store."""
        return os.path.join(self.data_dir, "master" if broker_id == 0 else f"slave{broker_id}")

    def listen_port(self, broker_id: int) -> int:
        if broker_id == 0:
            return self.master_port
        index = broker_id - 1
        return self.slave_ports[index] if index < len(self.slave_ports) else 0

    def broker_properties(self, broker_id: int, namesrv_addr: str) -> dict[str, str]:
        """The ``broker.conf`` of broker ``broker_id`` (0: the master), as a mapping."""
        role = self.master_role if broker_id == 0 else BrokerRole.SLAVE
        derived = {
            "brokerClusterName": self.cluster_name,
            "brokerName": self.broker_name,
            "brokerId": broker_id,
            "brokerRole": role.value,
            "flushDiskType": self.flush_disk_type.value,
            "listenPort": self.listen_port(broker_id),
            "bindAddress": self.host,
            "brokerIP1": self.host,
            "haBindAddress": self.host,
            "namesrvAddr": namesrv_addr,
            "storePathRootDir": self.store_dir(broker_id),
            "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
        }
        return {**_properties(derived), **self.properties}


@attrs.frozen
class ClusterAddresses:
    """Where a running cluster's nodes listen."""

    #: ``host:port`` of the name server (what clients are given)
    namesrv_addr: str
    master: BrokerAddresses
    slaves: tuple[BrokerAddresses, ...]
    data_dir: str

    @property
    def slave(self) -> BrokerAddresses:
        """The first slave."""
        if not self.slaves:
            raise LookupError("this cluster has no slave")
        return self.slaves[0]


def pinned_ports(properties: Mapping[str, str], addresses: BrokerAddresses) -> dict[str, str]:
    """``properties`` with the ports ``addresses`` were bound to, so that a broker started
    again (after a stop or a crash) is found where it was: clients keep its address, the
    slaves its HA port. (Its VIP port is listenPort - 2 then: with the VIP channel enabled,
    that port must be free too.)"""
    pinned = dict(properties)
    pinned["listenPort"] = addresses.broker_addr.rsplit(":", 1)[1]
    if addresses.ha_addr is not None:
        pinned["haListenPort"] = addresses.ha_addr.rsplit(":", 1)[1]
    return pinned


def restartable(properties: dict[str, str], host: str) -> dict[str, str]:
    """``properties`` with a port chosen now for a broker left to choose (listenPort 0, no
    haListenPort): one below the ephemeral range, with its HA and VIP ports free too
    (``free_broker_port``). A broker bound to port 0 gets its ports from that range, and its
    VIP port (listenPort - 2) is bound for the first time only when it restarts, so another
    process's connection could hold any of them by then (a restart failed so)."""
    if properties["listenPort"] != "0" or "haListenPort" in properties:
        return properties
    return {**properties, "listenPort": str(free_broker_port(host))}


@attrs.define(eq=False)
class ClusterBroker:
    """One broker of an in-process cluster, in its own cancel scope, so a test can stop it
    and start it again while the rest of the cluster runs."""

    broker_id: int
    #: its ``broker.conf``, as a mapping
    properties: dict[str, str]
    _nursery: trio.Nursery
    #: where it listens (of the latest start)
    addresses: BrokerAddresses | None = None
    _scope: trio.CancelScope | None = None
    _stopped: trio.Event = attrs.field(factory=trio.Event)

    @property
    def addr(self) -> str:
        """``host:port`` clients connect to."""
        return self.started_addresses.broker_addr

    @property
    def started_addresses(self) -> BrokerAddresses:
        """Where it listens; raises if it has never started."""
        if self.addresses is None:
            raise RuntimeError("the broker has not started")
        return self.addresses

    @property
    def running(self) -> bool:
        return self._scope is not None and not self._stopped.is_set()

    async def start(self) -> BrokerAddresses:
        """Start the broker; returns once it serves."""
        if self.running:
            raise RuntimeError("the broker is running")
        self._stopped = trio.Event()
        config = BrokerConfig.from_properties(self.properties)
        addresses: BrokerAddresses = await self._nursery.start(self._run, config)
        self.addresses = addresses
        return addresses

    async def _run(self, config: BrokerConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        try:
            with trio.CancelScope() as self._scope:
                await serve_broker(config, task_status=task_status)
        finally:
            self._stopped.set()

    def cancel(self) -> None:
        """Begin a graceful stop (without waiting for it)."""
        if self._scope is not None:
            self._scope.cancel()

    async def wait_stopped(self) -> None:
        """Wait until the broker has stopped (at once if it never started)."""
        if self._scope is not None:
            await self._stopped.wait()

    async def stop(self) -> None:
        """Stop the broker gracefully (it unregisters, flushes and closes its store) and wait
        until it has."""
        self.cancel()
        await self.wait_stopped()

    async def restart(self) -> BrokerAddresses:
        """Stop the broker if it runs, then start it again on the same ports and store."""
        if self.running:
            await self.stop()
        if self.addresses is not None:
            self.properties = pinned_ports(self.properties, self.addresses)
        return await self.start()


@attrs.define(eq=False)
class Cluster:
    """A running in-process cluster (see :func:`open_cluster`)."""

    config: ClusterConfig
    namesrv_addr: str
    master: ClusterBroker
    slaves: list[ClusterBroker]

    @property
    def slave(self) -> ClusterBroker:
        """The first slave."""
        if not self.slaves:
            raise LookupError("this cluster has no slave")
        return self.slaves[0]

    @property
    def brokers(self) -> list[ClusterBroker]:
        return [self.master, *self.slaves]

    @property
    def addresses(self) -> ClusterAddresses:
        """Where the nodes listen now."""
        return ClusterAddresses(
            self.namesrv_addr,
            self.master.started_addresses,
            tuple(slave.started_addresses for slave in self.slaves),
            self.config.data_dir,
        )


@contextlib.asynccontextmanager
async def open_cluster(config: ClusterConfig) -> AsyncIterator[Cluster]:
    """Run the cluster ``config`` describes for the block: the name server, then the master,
    then the slaves, each started once it serves."""
    os.makedirs(config.data_dir, exist_ok=True)
    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(serve_namesrv, config.namesrv_config())
        namesrv_addr = f"{config.host}:{port}"
        brokers = [
            ClusterBroker(broker_id, config.broker_properties(broker_id, namesrv_addr), nursery)
            for broker_id in range(config.slaves + 1)
        ]
        cluster = Cluster(config, namesrv_addr, brokers[0], brokers[1:])
        try:
            for broker in brokers:
                # its ports chosen just before it binds them (``restartable``)
                broker.properties = restartable(broker.properties, config.host)
                await broker.start()
            yield cluster
        finally:
            # Brokers first, all at once: each unregisters from the name server on its way out.
            for broker in brokers:
                broker.cancel()
            for broker in brokers:
                await broker.wait_stopped()
            nursery.cancel_scope.cancel()


async def serve_cluster(config: ClusterConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the cluster ``config`` describes until cancelled; reports its
    :class:`ClusterAddresses` through ``task_status``."""
    async with open_cluster(config) as cluster:
        task_status.started(cluster.addresses)
        await trio.sleep_forever()
