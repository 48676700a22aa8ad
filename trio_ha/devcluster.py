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

**Controller mode** (``trio-ha dev-cluster --controller``, :func:`serve_controller_dev_cluster`):
the name server embeds RocketMQ 5's controller (``enableControllerInNamesrv``, its journal
under the data directory), and each group is three brokers with ``enableControllerMode``
that learn their ids and roles from it. Those brokers are child processes, not tasks of
this one, because the point of the cluster is its failover: a master killed with SIGKILL
must be a process that dies as a crashed machine does (no ``finally``, its connections cut
by the kernel), while the name server, the controller and the other brokers live on. Each
child runs the conf file written as ``<data>/<group>-<n>.conf`` (the file ``trio-ha broker
-c`` takes), through ``python -m trio_ha.testing.node``, which serves exactly that broker
but also stops when its stdin closes: a dev cluster that is itself killed leaves no broker
behind (a child of ``trio-ha broker -c`` would live on, holding its ports). Stores are
``<data>/<group>-<n>/``, logs ``<data>/logs/<group>-<n>.log``.
"""

from __future__ import annotations

import json
import os
import signal
import string
import subprocess
import sys

import attrs
import trio

from ._errors import TrioHAError
from .config import parse_properties_text
from .namesrv import NamesrvConfig, serve_namesrv
from .testing import ClusterAddresses, ClusterConfig, free_broker_port
from .testing.cluster import ClusterBroker
from .testing.processes import NODE_MODULE, child_env, log_tail

__all__ = [
    "CONTROLLER_PORT", "DEV_PROPERTIES", "BrokerChild", "ControllerDevCluster",
    "DevClusterAddresses", "DevClusterError", "dev_group_configs", "serve_controller_dev_cluster",
    "serve_dev_cluster",
]

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


# ---- controller mode ---------------------------------------------------------------------------

#: the embedded controller's port: RocketMQ's quick start has its DLedger peer on 9878
CONTROLLER_PORT = 9878
#: broker.conf keys of every controller-mode dev broker, beside DEV_PROPERTIES and the derived
#: ones: a slave that caught up joins the in-sync set within a second, not five
CONTROLLER_DEV_PROPERTIES = {**DEV_PROPERTIES, "checkSyncStateSetPeriod": 1000}
#: seconds a broker child has to say it serves, and to stop once asked, before it is killed
BROKER_START_TIMEOUT = 60.0
BROKER_STOP_TIMEOUT = 20.0
#: at most this many bytes of a child's first line (its addresses as JSON)
MAX_READY_LINE = 64 * 1024


class DevClusterError(TrioHAError, RuntimeError):
    """A dev cluster's node did not start or stop as it should."""


@attrs.define(eq=False)
class BrokerChild:
    """One controller-mode broker in a child process: its conf file, its address (known
    before it starts: the ports are chosen by the parent), and the process while it runs."""

    name: str
    broker_name: str
    conf_path: str
    log_path: str
    addr: str
    process: trio.Process | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self, timeout: float = BROKER_START_TIMEOUT) -> None:
        """Spawn the broker and wait until it serves (its first line on stdout)."""
        def read_spec() -> dict[str, object]:
            with open(self.conf_path) as f:
                properties = parse_properties_text(f.read())
            return {"name": self.name, "kind": "broker", "log_level": "INFO",
                    "properties": properties}

        spec = await trio.to_thread.run_sync(read_spec)
        log = await trio.to_thread.run_sync(open, self.log_path, "ab")
        try:
            # The child gets its own descriptor of the log; ours closes once it has it.
            process = await trio.lowlevel.open_process(
                [sys.executable, "-m", NODE_MODULE, json.dumps(spec)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log.fileno(), env=child_env(),
                start_new_session=True)  # a Ctrl-C in the terminal is for the parent alone
        finally:
            log.close()
        self.process = process
        assert process.stdout is not None
        line = b""
        with trio.move_on_after(timeout):
            while b"\n" not in line and len(line) < MAX_READY_LINE:
                data = await process.stdout.receive_some(4096)
                if not data:
                    break
                line += data
        if b"\n" not in line:
            await self.kill()
            raise DevClusterError(f"broker {self.name} did not start within {timeout:g} s: "
                                  f"{log_tail(self.log_path)}")

    async def stop(self, timeout: float = BROKER_STOP_TIMEOUT) -> None:
        """Stop gracefully (its stdin closes), killing it if it has not within ``timeout``."""
        process = self.process
        if process is None:
            await trio.lowlevel.checkpoint()
            return
        if process.stdin is not None:
            await process.stdin.aclose()
        with trio.move_on_after(timeout):
            await process.wait()
        await self.kill()

    async def kill(self) -> None:
        """SIGKILL: the broker dies as a crashed machine does; its store keeps the abort file."""
        process = self.process
        if process is None:
            await trio.lowlevel.checkpoint()
            return
        if process.returncode is None:
            process.send_signal(signal.SIGKILL)
        await process.wait()
        for stream in (process.stdin, process.stdout):
            if stream is not None:
                await stream.aclose()

    async def restart(self, timeout: float = BROKER_START_TIMEOUT) -> None:
        """Start it again on the same conf (same ports, same store), after a stop or a kill."""
        if self.running:
            await self.stop()
        await self.start(timeout)


@attrs.define(eq=False)
class ControllerDevCluster:
    """A running controller-mode dev cluster: the name server and its embedded controller
    (in this process) and every group's brokers (child processes)."""

    namesrv_addr: str
    controller_addr: str
    data_dir: str
    #: the brokers of each group, in the order they were started
    groups: tuple[tuple[BrokerChild, ...], ...]

    @property
    def brokers(self) -> list[BrokerChild]:
        return [b for group in self.groups for b in group]

    @property
    def broker_names(self) -> list[str]:
        return [group[0].broker_name for group in self.groups]

    def broker_at(self, address: str) -> BrokerChild | None:
        """The broker listening on ``address`` (as the controller names it)."""
        return next((b for b in self.brokers if b.addr == address), None)

    async def stop(self) -> None:
        """Stop every broker at once (gracefully, each killed past its grace period)."""
        async with trio.open_nursery() as nursery:
            for broker in self.brokers:
                nursery.start_soon(broker.stop)


def _write_conf(path: str, properties: dict[str, object]) -> None:
    text = "".join(f"{key}={value}\n" for key, value in properties.items())
    with open(path, "w") as f:
        f.write(text)


async def serve_controller_dev_cluster(
    data_dir: str,
    *,
    groups: int = 1,
    slaves: int = 2,
    namesrv_port: int = 9876,
    controller_port: int = CONTROLLER_PORT,
    master_port: int = 10911,
    slave_port: int = 10921,
    host: str = "127.0.0.1",
    task_status: trio.TaskStatus[ControllerDevCluster] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the name server with its embedded controller (journal in ``data_dir/controller``)
    and, per group, ``slaves + 1`` controller-mode brokers as child processes, until
    cancelled; reports a ``ControllerDevCluster`` once every broker serves (their roles come
    from the controller a moment later). The first broker of a group starts first, so it is
    normally the first master. Ports as ``dev_group_configs``' (the first broker on
    ``master_port``, the others on ``slave_port`` and ``slave_port + 10``, group g 100 g
    higher); port 0 picks free ones. Leaving stops the brokers, then the name server."""
    if not 1 <= groups <= MAX_GROUPS:
        raise ValueError(f"groups must be 1..{MAX_GROUPS}, not {groups}")
    if not 0 <= slaves <= 2:
        raise ValueError(f"slaves must be 0, 1 or 2, not {slaves}")
    logs = os.path.join(data_dir, "logs")
    await trio.to_thread.run_sync(lambda: os.makedirs(logs, exist_ok=True))
    # Ports left to the OS are chosen here: the brokers' controllerAddr must name the
    # controller's before it binds, and a broker restarted after the demo's kill must come
    # back where it was (free_broker_port keeps them out of the ephemeral range).
    controller_port = controller_port or free_broker_port(host)
    namesrv_conf = os.path.join(data_dir, "namesrv.conf")
    namesrv_properties: dict[str, object] = {
        "listenPort": namesrv_port, "bindAddress": host,
        "kvConfigPath": os.path.join(data_dir, "namesrv", "kvConfig.json"),
        "enableControllerInNamesrv": "true", "controllerType": "journal",
        "controllerStorePath": os.path.join(data_dir, "controller"),
        "controllerListenPort": controller_port,
    }
    await trio.to_thread.run_sync(_write_conf, namesrv_conf, namesrv_properties)
    config = NamesrvConfig.from_properties({k: str(v) for k, v in namesrv_properties.items()})
    # The name server (and its controller) must outlive the brokers: stopped first, a
    # controller would see every broker's connection close at once while it shuts down.
    # So it runs under a shielded scope of its own, which only this function cancels,
    # once the brokers have stopped.
    namesrv_scope = trio.CancelScope(shield=True)

    async def run_namesrv(*, task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with namesrv_scope:
            await serve_namesrv(config, task_status=task_status)

    async with trio.open_nursery() as nursery:
        _, port = await nursery.start(run_namesrv)
        namesrv_addr = f"{host}:{port}"
        controller_addr = f"{host}:{controller_port}"
        members: list[tuple[BrokerChild, ...]] = []
        for g in range(groups):
            broker_name = f"broker-{string.ascii_lowercase[g]}"
            shift = g * GROUP_PORT_STRIDE
            ports = [_port(master_port, shift)] + [
                _port(slave_port, shift + SLAVE_PORT_STRIDE * i) for i in range(slaves)]
            group = []
            for i, listen_port in enumerate(ports):
                name = f"{broker_name}-{i}"
                listen_port = listen_port or free_broker_port(host)
                conf_path = os.path.join(data_dir, f"{name}.conf")
                await trio.to_thread.run_sync(_write_conf, conf_path, {
                    "brokerClusterName": "DevCluster", "brokerName": broker_name,
                    "enableControllerMode": "true", "controllerAddr": controller_addr,
                    "namesrvAddr": namesrv_addr, "listenPort": listen_port,
                    "bindAddress": host, "brokerIP1": host, "haBindAddress": host,
                    "storePathRootDir": os.path.join(data_dir, name),
                    **CONTROLLER_DEV_PROPERTIES,
                })
                group.append(BrokerChild(name, broker_name, conf_path,
                                         os.path.join(logs, f"{name}.log"),
                                         f"{host}:{listen_port}"))
            members.append(tuple(group))
        cluster = ControllerDevCluster(namesrv_addr, controller_addr, data_dir, tuple(members))
        try:
            async with trio.open_nursery() as starting:
                for group in cluster.groups:
                    starting.start_soon(group[0].start)
            async with trio.open_nursery() as starting:
                for group in cluster.groups:
                    for broker in group[1:]:
                        starting.start_soon(broker.start)
            task_status.started(cluster)
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True, deadline=trio.current_time()
                                  + BROKER_STOP_TIMEOUT + 10):
                await cluster.stop()
            namesrv_scope.cancel()
