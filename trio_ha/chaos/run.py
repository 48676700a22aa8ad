"""A chaos run from start to verdict (``trio-ha chaos run``).

1. Make what the run's fault kinds need (``capabilities`` leaves out the kinds this machine
   cannot inject, and the verdict names them): test hosts for network faults, a small disk
   per broker for disk faults, the clock shim for clock jumps.
2. Start the cluster from the ``trio-ha`` executable: a name server, a master, its slaves
   (each through a fault proxy to the master's HA port); create the topic; wait until a
   send is acknowledged (a SYNC_MASTER's slave has attached).
3. Run the producers and the consumer group, and inject the schedule's faults (one after
   another, or overlapping), each recorded with the time it was in force and its end.
4. When the time is up: stop the producers, heal what is still in force (the faults'
   ``finally``), start a node left down, give the consumer a few seconds to catch up, then
   SIGKILL every node at once: the final state is what a crash of everything leaves.
5. Open each store in this process (recovery runs as at a broker's start) and check the
   history against them (``checker``). The configuration, the history, the verdict as JSON
   and the report are written to the run directory, and the stores stay there, so
   ``check_run`` can judge the run again and ``replay_config`` run it again.

In controller mode (``--controller embedded|etcd``) step 2 starts the controllers too (the
name server embedding one, with its journal in the run directory; or three ``trio-ha
controller`` processes over a 3-member etcd the harness starts), the brokers are peers with
``enableControllerMode=true`` and no proxies (whoever the controller elects is master), and
step 3 also watches the controllers' view of the set (a ``master`` event in the history at
each change). Before the final SIGKILL the harness waits, within a bound, for every broker
to be back in the in-sync set; the checker reads the store of the master named last as the
final master. On test hosts each controller has a host of its own and etcd listens on the
harness's gateway address, so isolating the controller leader cuts it off from etcd too.
``--controller rocketmq`` runs RocketMQ 5.3.3's controller and brokers (JVMs) in their place,
on loopback, under the same name server, clients and checker.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from ..client import MQError, open_admin
from ..testing import free_broker_port, open_fault_proxy
from ..testing.etcd import EtcdCluster, EtcdNotInstalled, etcd_binary
from ..testing.rocketmq import (
    BROKER_JVM,
    BROKER_READY,
    CONTROLLER_FILE_SIZE,
    CONTROLLER_JVM,
    CONTROLLER_READY,
    VERSION_5,
    RocketMQ,
    RocketMQUnavailable,
    broker_properties_text,
)
from . import clockshift, disk, testnet
from .checker import Verdict, check, read_store
from .cluster import ChaosNode
from .failover import final_master
from .faults import Cluster, inject, start
from .history import FaultEvent, History, MasterEvent, SendEvent
from .plan import (
    CLASSIC_ONLY_KINDS,
    CLIENT_LINK_KINDS,
    CLOCK_KINDS,
    CONTROLLER_KINDS,
    DISK_KINDS,
    NETWORK_KINDS,
    ChaosConfig,
    Fault,
    FaultKind,
    schedule,
)
from .workload import consume, monotonic_clock, produce

__all__ = ["SEGMENT_SIZE", "capabilities", "check_run", "replay_config", "run_chaos"]

#: commitlog segments of the run's brokers (small: faults land near segment ends too)
SEGMENT_SIZE = 4 * 1024 * 1024
#: the other store files small too, so they roll over (and are created) during a run:
#: consume queue files of 3,000 entries, index files of 20,000
STORE_SIZES = {"mappedFileSizeCommitLog": str(SEGMENT_SIZE),
               "mappedFileSizeConsumeQueue": str(3000 * 20),
               "maxIndexNum": "20000", "maxHashSlotNum": "5000"}
#: each broker's small disk, when disk faults are on
DISK_SIZE = 256 * 1024 * 1024
#: how long the cluster has to acknowledge its first send
READY_TIMEOUT = 60.0
#: controller mode: how often the harness asks the controllers who is master
WATCH_INTERVAL = 0.25
#: controller mode: how long the end of a run waits for every broker to be in sync again
IN_SYNC_TIMEOUT = 30.0
#: controller mode: the etcd leases of the controllers (a dead leader is replaced after it)
ETCD_LEASE_SECONDS = 2
#: what ``--controller rocketmq`` can inject (its JVMs on loopback)
ROCKETMQ_KINDS = frozenset({FaultKind.KILL_MASTER, FaultKind.KILL_SLAVE, FaultKind.PAUSE_MASTER,
                            FaultKind.PAUSE_SLAVE, FaultKind.KILL_CONTROLLER_LEADER})
#: how long a RocketMQ JVM may take to boot (two cores, other JVMs beside it)
JAVA_START_TIMEOUT = 120.0


def capabilities(config: ChaosConfig) -> tuple[ChaosConfig, dict[str, str]]:
    """``config`` with its network settled (``auto``: test hosts where they can be made)
    and only the fault kinds this machine can inject, and why each other kind it asked for
    cannot be (test hosts, small disks and the clock shim need root, tools and a compiler;
    client-link proxies need loopback)."""
    wanted = set(config.kinds)
    missing: dict[str, str] = {}
    if config.controller == "rocketmq":
        try:
            RocketMQ.fetch(VERSION_5)
        except RocketMQUnavailable as exc:
            raise ValueError(f"--controller rocketmq: {exc}") from None
        if config.network == "hosts":
            raise ValueError("--controller rocketmq runs on loopback (--network loopback)")
        config = attrs.evolve(config, network="loopback")
        missing.update((kind.value, "--controller rocketmq: the JVMs run on loopback, "
                        "without the clock shim or small disks: kills and pauses only")
                       for kind in wanted - ROCKETMQ_KINDS)
    if config.controller == "etcd":
        try:
            etcd_binary()
        except EtcdNotInstalled as exc:
            raise ValueError(f"--controller etcd: {exc}") from None
    if config.controller is None:
        missing.update((kind.value, "controller mode only (--controller)")
                       for kind in wanted & CONTROLLER_KINDS)
    else:
        missing.update((kind.value, "classic mode only: in controller mode a slave finds its "
                        "master through the name server and clients reach whoever is "
                        "elected, so no proxy stands on those links (network faults on "
                        "test hosts break them instead)") for kind in wanted & CLASSIC_ONLY_KINDS)
        if config.controller != "etcd" and FaultKind.KILL_ETCD_MEMBER in wanted:
            missing[FaultKind.KILL_ETCD_MEMBER.value] = "needs --controller etcd"
    network = config.network
    hosts_unavailable = testnet.unavailable() if network != "loopback" else "--network loopback"
    if network == "hosts" and hosts_unavailable:
        raise ValueError(f"--network hosts: {hosts_unavailable}")
    network = "loopback" if hosts_unavailable else "hosts"
    if network == "hosts":
        why_not_here = ("the nodes are on test hosts, whose network faults reach the client "
                        "links too (--network loopback puts proxies on them)")
        missing.update((kind.value, why_not_here) for kind in wanted & CLIENT_LINK_KINDS
                       if kind.value not in missing)
    else:
        missing.update((kind.value, f"no test hosts: {hosts_unavailable}")
                       for kind in wanted & (NETWORK_KINDS
                                             | {FaultKind.ISOLATE_CONTROLLER_LEADER})
                       if kind.value not in missing)
    for kinds, why_not in ((DISK_KINDS, disk.unavailable), (CLOCK_KINDS, clockshift.available)):
        asked = wanted & kinds
        reason = why_not() if asked else None
        if reason:
            missing.update((kind.value, reason) for kind in asked)
    kinds = tuple(kind for kind in config.kinds if kind.value not in missing)
    if not kinds:
        raise ValueError(f"none of the fault kinds asked for can be injected here: {missing}")
    return attrs.evolve(config, kinds=kinds, network=network), missing


def _broker_properties(config: ChaosConfig, run_dir: Path, name: str, broker_id: int,
                       namesrv: str, host: str, advertised: str, port: int,
                       ha_master: str | None) -> dict[str, str]:
    properties = {
        "brokerClusterName": "ChaosCluster", "brokerName": "chaos-broker",
        "brokerId": str(broker_id),
        "brokerRole": config.role if broker_id == 0 else "SLAVE",
        "flushDiskType": config.flush, "namesrvAddr": namesrv,
        "listenPort": str(port), "haListenPort": str(port + 1), "bindAddress": host,
        "haBindAddress": host, "brokerIP1": advertised, "vipChannelEnable": "false",
        "storePathRootDir": str(run_dir / name),
        "haHousekeepingInterval": str(config.ha_housekeeping_ms),
        "autoCreateTopicEnable": "true", "haSyncAcks": str(config.sync_acks), **STORE_SIZES,
    }
    if ha_master is not None:
        properties["haMasterAddress"] = ha_master
    return properties


def _controlled_properties(config: ChaosConfig, run_dir: Path, name: str, namesrv: str,
                           controllers: list[str], host: str, port: int) -> dict[str, str]:
    """A broker of the set in controller mode: no id, no role, no HA master (the controller
    gives them). Its timers are short so that a run sees many failovers: the controllers
    declare it dead after the HA housekeeping interval without a heartbeat (a pause longer
    than that is a failover), a slave that lags that long leaves the in-sync set (a send
    waits for every member of it), and it asks who is master every second."""
    interval = str(config.ha_housekeeping_ms)
    return {
        "brokerClusterName": "ChaosCluster", "brokerName": "chaos-broker",
        "enableControllerMode": "true", "controllerAddr": ";".join(controllers),
        "flushDiskType": config.flush, "namesrvAddr": namesrv,
        "listenPort": str(port), "haListenPort": str(port + 1), "bindAddress": host,
        "haBindAddress": host, "brokerIP1": host, "vipChannelEnable": "false",
        "storePathRootDir": str(run_dir / name), "haHousekeepingInterval": interval,
        "controllerHeartBeatTimeoutMills": interval, "haMaxTimeSlaveNotCatchup": interval,
        "brokerHeartbeatInterval": "500", "syncBrokerMetadataPeriod": "1000",
        "syncControllerMetadataPeriod": "2000", "checkSyncStateSetPeriod": "1000",
        "haSendHeartbeatInterval": "1000", "registerNameServerPeriod": "10000",
        "autoCreateTopicEnable": "true", **STORE_SIZES,
    }


async def _wait_ready(namesrv: str, config: ChaosConfig, history: History) -> None:
    """Create the topic on the master and wait until a send is acknowledged. The probes are
    sends like any other (producer 0, at time 0): the consumer reads them too."""
    from ..client import Message, open_producer

    with trio.fail_after(READY_TIMEOUT):
        for attempt in range(1, 1_000_000):
            probe = f"p0-{attempt}"
            try:
                async with open_admin(namesrv) as admin:
                    await admin.create_topic(config.topic, config.queues)
                async with open_producer(namesrv, "chaos_probe") as producer:
                    result = await producer.send(Message(config.topic, probe.encode(),
                                                         keys=probe))
            except MQError as exc:
                history.send(SendEvent(probe, 0, 0.0, 0.0, None, error=str(exc)[:300]))
            else:
                history.send(SendEvent(probe, 0, 0.0, 0.0, result.send_status.name,
                                       offset_msg_id=result.offset_msg_id,
                                       queue_id=result.message_queue.queue_id,
                                       queue_offset=result.queue_offset))
                if result.send_status.name == "SEND_OK":
                    return
            await trio.sleep(0.5)


async def _inject_all(faults: list[Fault], cluster: Cluster, history: History, clock,
                      config: ChaosConfig) -> None:
    """Each fault at its time: one after another, or (``overlap``) each in its own task."""
    async def one(index: int, fault: Fault) -> None:
        # (each fault draws from its own generator: overlapping faults in any order make
        # the same choices, such as where a cut falls, as on the run being replayed)
        rng = random.Random(config.seed * 1_000_003 + index)
        started: list[float] = []
        landed: list[ChaosNode] = []
        detail, failed = "cut short by the end of the run", False
        try:
            detail = await inject(fault, cluster, rng, lambda: started.append(clock()),
                                  landed.append)
        except Exception as exc:
            # A fault the harness could not make or undo (a tool that failed, a node that
            # would not start again) is recorded and fails the verdict; the run goes on.
            detail, failed = repr(exc)[:500], True
            started.append(started[0] if started else clock())
        finally:
            # (a fault cut short before it was in force is no fault)
            if started:
                node = landed[0] if landed else None
                history.fault(FaultEvent(fault.kind.value, fault.target, started[0],
                                         clock(), detail, failed,
                                         node.name if node else "",
                                         node.addr if node else ""))

    async with trio.open_nursery() as nursery:
        for index, fault in enumerate(faults):
            await trio.sleep(max(0.0, fault.at - clock()))
            if config.overlap:
                nursery.start_soon(one, index, fault)
            else:
                await one(index, fault)


def run_chaos(config: ChaosConfig, run_dir: Path) -> Verdict:
    """Run ``config`` with everything under ``run_dir``; the verdict (also written there as
    ``verdict.json`` and ``report.txt``, beside ``history.jsonl``). Fault kinds this machine
    cannot inject are left out, and the verdict says which and why. ``run_dir`` must be new
    or empty: a run's history and stores are its own."""
    run_dir = run_dir.resolve()  # (the conf files name it: ``chaos check`` runs anywhere)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise FileExistsError(f"{run_dir} is not empty: a chaos run needs a directory of "
                              f"its own")
    run_dir.mkdir(parents=True, exist_ok=True)
    config, missing = capabilities(config)
    (run_dir / "config.json").write_text(json.dumps(config.as_dict(), indent=1) + "\n")
    history = History.to_file(run_dir / "history.jsonl")
    try:
        verdict = trio.run(_run, config, run_dir, history)
    finally:
        history.close()
    if missing:
        verdict = attrs.evolve(verdict, figures={**verdict.figures,
                                                 "kinds not injected here": missing})
    (run_dir / "verdict.json").write_text(json.dumps(verdict.as_dict(), indent=1))
    (run_dir / "report.txt").write_text(verdict.report() + "\n")
    return verdict


def check_run(run_dir: Path) -> Verdict:
    """The verdict on a finished (or dead) run, from what its directory holds: the
    configuration, the history and the stores (recovered again, as a broker's start
    would). The same checks as at the end of the run; useful after a run died, or after a
    fix to the checker."""
    config = replay_config(run_dir)
    history = History.read(run_dir / "history.jsonl")

    return trio.run(_judge, config, history, run_dir)


async def _judge(config: ChaosConfig, history: History, run_dir: Path) -> Verdict:
    """Recover each broker's store from its conf file and check the history against them
    (in controller mode the master is the one the controller named last)."""
    names = list(config.brokers)
    named = final_master(history) if config.controller is not None else None
    if named is not None and named.master in names:
        names.remove(named.master)
        names.insert(0, named.master)
    master, *slaves = [await read_store(run_dir / f"{name}.conf", config) for name in names]
    return check(config, history, master, slaves)


def replay_config(run_dir: Path) -> ChaosConfig:
    """The configuration of an earlier run (its seed, kinds, timing): run it again to
    inject the same faults at the same times."""
    return ChaosConfig.from_dict(json.loads((run_dir / "config.json").read_text()))


@contextlib.contextmanager
def _environment(config: ChaosConfig, run_dir: Path):
    """The test network, small disks and clock shim the run's kinds need (each None or
    empty when not needed), taken down afterwards."""
    kinds = set(config.kinds)
    brokers = config.brokers
    with contextlib.ExitStack() as stack:
        network = None
        if config.network == "hosts":
            controllers = [c for c in config.controllers if c != "namesrv"]
            network = testnet.TestNetwork.create(["namesrv", *brokers, *controllers])
            stack.callback(network.close)
        etcd = None
        if config.controller == "etcd":
            # (on the gateway: the controllers on their test hosts reach it there)
            etcd = EtcdCluster.start(run_dir / "etcd",
                                     host=network.gateway if network else "127.0.0.1")
            stack.callback(etcd.close)
        disks = {}
        if kinds & DISK_KINDS:
            for name in brokers:
                disks[name] = disk.SmallDisk.mount(run_dir / name, DISK_SIZE)
                # (the stores stay in the run directory, for ``chaos check`` and a look)
                stack.callback(disks[name].unmount, keep_files=True)
        clocks = {}
        if kinds & CLOCK_KINDS:
            shift = clockshift.ClockShift.build(run_dir)
            clocks = {name: shift.for_node(name) for name in brokers}
        yield network, disks, clocks, etcd


def _free_port(host: str, proxied: bool) -> int:
    """A broker's port, free on its own address and (``proxied``: the client-link proxy
    listens there) on 127.0.0.1 too."""
    for _ in range(20):
        port = free_broker_port(host)
        if not proxied:
            return port
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError(f"no port free on both {host} and 127.0.0.1")


async def _run(config: ChaosConfig, run_dir: Path, history: History) -> Verdict:
    brokers = config.brokers
    with _environment(config, run_dir) as (network, disks, clocks, etcd):
        def host(name: str) -> str:
            """Where a node listens: its test host, or an address of its own on loopback
            (127.0.0.1 is the harness's: the client-link proxies listen there)."""
            if network is not None:
                return network.hosts[name].address
            if name in config.controllers and name != "namesrv":
                return f"127.0.0.{20 + config.controllers.index(name)}"
            return "127.0.0.1" if name == "namesrv" else f"127.0.0.{2 + brokers.index(name)}"

        def prefix(name: str) -> list[str]:
            return network.hosts[name].command([]) if network else []

        if config.controller is not None:
            return await _run_controlled(config, run_dir, history, host, prefix, network,
                                         disks, clocks, etcd)
        namesrv = ChaosNode.namesrv(run_dir, host=host("namesrv"), prefix=prefix("namesrv"))
        # (on test hosts every port is free inside the host: any free here will do)
        ports = {name: _free_port("127.0.0.1" if network else host(name), network is None)
                 for name in brokers}
        # On loopback, a broker registers (brokerIP1) the harness's address, where the
        # client-link proxy in front of its port listens.
        advertised = {name: host(name) if network else "127.0.0.1" for name in brokers}
        nodes = [namesrv]
        try:
            async with contextlib.AsyncExitStack() as stack:
                client_proxies = []
                if network is None:
                    client_proxies = [await stack.enter_async_context(open_fault_proxy(
                        (host(name), ports[name]), seed=config.seed + 100 + n,
                        host="127.0.0.1", port=ports[name])) for n, name in enumerate(brokers)]
                ha_proxies = [await stack.enter_async_context(open_fault_proxy(
                    (host("master"), ports["master"] + 1), seed=config.seed + n,
                    host=network.add_gateway_address() if network else "127.0.0.1"))
                    for n in range(config.slaves)]
                for n, name in enumerate(brokers):
                    ha_master = ha_proxies[n - 1].address_text if n else None
                    node = ChaosNode.broker(run_dir, name, _broker_properties(
                        config, run_dir, name, n, namesrv.addr, host(name), advertised[name],
                        ports[name], ha_master), prefix=prefix(name))
                    if name in clocks:
                        node.env = clocks[name].env()
                    nodes.append(node)
                cluster = Cluster(namesrv, nodes[1], nodes[2:], ha_proxies, network, disks,
                                  clocks, client_proxies)
                await start(namesrv)
                async with trio.open_nursery() as starting:  # (the brokers side by side)
                    for node in nodes[1:]:
                        starting.start_soon(start, node)
                await _wait_ready(namesrv.addr, config, history)
                await _load_and_faults(config, cluster, history)
        finally:
            # Everything at once, as a crash of every machine would: what is checked is
            # what survives that.
            await _kill_all(nodes)
        # (while the small disks are still mounted: the checker reads the files too)
        return await _judge(config, history, run_dir)


async def _load_and_faults(config: ChaosConfig, cluster: Cluster, history: History) -> None:
    namesrv = cluster.namesrv.addr
    clock = monotonic_clock()
    producers_scope = trio.CancelScope()
    consumer_scope = trio.CancelScope()

    async def producers() -> None:
        with producers_scope:
            async with trio.open_nursery() as nursery:
                for producer_no in range(1, config.producers + 1):
                    nursery.start_soon(produce, namesrv, config, producer_no, history, clock)

    async def consumer() -> None:
        with consumer_scope:
            await consume(namesrv, config, history, clock)

    watch_scope = trio.CancelScope()

    async def watcher() -> None:
        with watch_scope:
            await _watch_masters(cluster, history, clock)

    async with trio.open_nursery() as load:
        load.start_soon(producers)
        load.start_soon(consumer)
        if cluster.controlled:
            load.start_soon(watcher)
        with trio.move_on_after(config.seconds):
            await _inject_all(schedule(config), cluster, history, clock, config)
            await trio.sleep_forever()
        producers_scope.cancel()
        # The faults healed as they were cancelled; start what a fault left down or
        # paused, then let the consumer read what is left.
        for node in [*cluster.controllers, cluster.master, *cluster.slaves]:
            if node.paused:
                node.resume()
            if not node.running:
                await start(node)
        if cluster.etcd is not None:
            await trio.to_thread.run_sync(cluster.etcd.heal)
        await trio.sleep(config.settle_seconds)
        if cluster.controlled:
            await _until_in_sync(cluster)
            watch_scope.cancel()
            # The last view, recorded whatever the one before: the final master is the
            # last one named.
            view = await cluster.view()
            if view is not None:
                node = cluster.broker_at(view.master_address)
                history.master(MasterEvent(clock(), node.name if node else None, view.epoch,
                                           view.in_sync, view.master_address))
        consumer_scope.cancel()


async def _run_controlled(config: ChaosConfig, run_dir: Path, history: History,
                          host: Callable[[str], str], prefix: Callable[[str], list[str]],
                          network: testnet.TestNetwork | None, disks: dict[str, disk.SmallDisk],
                          clocks: dict[str, clockshift.NodeClock],
                          etcd: EtcdCluster | None) -> Verdict:
    """``_run`` in controller mode: the controllers, the name server and the brokers as
    peers of one set; then the load, the faults and the verdict as in classic mode."""
    brokers = config.brokers
    namesrv_host = host("namesrv")
    controllers: list[ChaosNode] = []
    if config.controller == "embedded":
        ctl_port = free_broker_port("127.0.0.1" if network else namesrv_host)
        namesrv = ChaosNode.namesrv(run_dir, host=namesrv_host, prefix=prefix("namesrv"),
                                    properties={
            "enableControllerInNamesrv": "true", "controllerType": "journal",
            "controllerStorePath": str(run_dir / "controller"),
            "controllerDLegerGroup": "chaos", "controllerDLegerSelfId": "n0",
            "controllerDLegerPeers": f"n0-{namesrv_host}:{ctl_port}",
            "scanNotActiveBrokerInterval": "1000",
            "kvConfigPath": str(run_dir / "namesrv-kv.json")})
        controllers.append(namesrv)
        controller_addrs = [f"{namesrv_host}:{ctl_port}"]
    elif config.controller == "rocketmq":
        return await _run_rocketmq(config, run_dir, history)
    else:
        assert etcd is not None
        namesrv = ChaosNode.namesrv(run_dir, host=namesrv_host, prefix=prefix("namesrv"))
        for n, name in enumerate(config.controllers):
            ctl_host = host(name)
            controllers.append(ChaosNode.controller(run_dir, name, {
                "listenPort": str(free_broker_port("127.0.0.1" if network else ctl_host)),
                "bindAddress": ctl_host, "controllerType": "etcd",
                "controllerEtcdEndpoints": ",".join(etcd.endpoints),
                "controllerEtcdLeaseSeconds": str(ETCD_LEASE_SECONDS),
                "controllerDLegerGroup": "chaos", "controllerDLegerSelfId": f"n{n}",
                "controllerStorePath": str(run_dir / name),
                "scanNotActiveBrokerInterval": "1000"}, prefix=prefix(name)))
        controller_addrs = [c.addr for c in controllers]
    nodes = [namesrv, *(c for c in controllers if c is not namesrv)]
    try:
        for name in brokers:
            port = free_broker_port("127.0.0.1" if network else host(name))
            node = ChaosNode.broker(run_dir, name, _controlled_properties(
                config, run_dir, name, namesrv.addr, controller_addrs, host(name), port),
                prefix=prefix(name))
            if name in clocks:
                node.env = clocks[name].env()
            nodes.append(node)
        broker_nodes = nodes[-len(brokers):]
        cluster = Cluster(namesrv, broker_nodes[0], broker_nodes[1:], [], network, disks,
                          clocks, controllers=controllers, controller_addrs=controller_addrs,
                          etcd=etcd)
        await _serve_controlled(config, cluster, nodes, history)
    finally:
        await _kill_all(nodes)
    return await _judge(config, history, run_dir)


async def _serve_controlled(config: ChaosConfig, cluster: Cluster, nodes: list[ChaosNode],
                            history: History) -> None:
    """Start the nodes (the others side by side, then the brokers side by side), then the
    load and the faults."""
    async with trio.open_nursery() as starting:
        for node in nodes:
            if node not in cluster.brokers:
                starting.start_soon(start, node)
    async with trio.open_nursery() as starting:
        for node in cluster.brokers:
            starting.start_soon(start, node)
    await _wait_ready(cluster.namesrv.addr, config, history)
    await _load_and_faults(config, cluster, history)


async def _kill_all(nodes: list[ChaosNode]) -> None:
    """SIGKILL every node, as a crash of every machine would (each even if another's kill
    fails)."""
    with trio.CancelScope(shield=True):
        failures = []
        for node in nodes:
            try:
                await trio.to_thread.run_sync(node.kill)
            except OSError as exc:
                failures.append(exc)
        if failures:
            raise failures[0]


async def _run_rocketmq(config: ChaosConfig, run_dir: Path, history: History) -> Verdict:
    """``--controller rocketmq``: RocketMQ 5.3.3's controller (DLedger, a group of one, its
    store in the run directory) and brokers, as RocketMQ ships them, under our name server
    and our clients, on loopback. The brokers are set as ours are (``_controlled_properties``),
    ``allAckInSyncStateSet=true`` included (RocketMQ's default is false: an ack from the
    master alone, which a failover may lose). Their stores are judged by our reader (the
    files are byte-compatible)."""
    rocketmq = RocketMQ.fetch(VERSION_5)
    namesrv = ChaosNode.namesrv(run_dir)
    ctl_port = free_broker_port()
    ctl_home = run_dir / "ctl0-home"
    ctl_conf = run_dir / "ctl0.conf"
    ctl_conf.write_text(broker_properties_text({
        "controllerType": "DLedger", "controllerDLegerGroup": "chaos",
        "controllerDLegerPeers": f"n0-127.0.0.1:{ctl_port}", "controllerDLegerSelfId": "n0",
        "controllerStorePath": str(run_dir / "ctl0"), "mappedFileSize": CONTROLLER_FILE_SIZE,
        "configStorePath": str(ctl_home / "controller.properties"),
        "scanNotActiveBrokerInterval": 1000}))
    controller = ChaosNode.foreign(
        "ctl0", [*rocketmq.java_command(CONTROLLER_JVM, ctl_home),
                 "org.apache.rocketmq.controller.ControllerStartup", "-c", str(ctl_conf)],
        log_path=run_dir / "ctl0.log", addr=f"127.0.0.1:{ctl_port}", ready=CONTROLLER_READY,
        cwd=ctl_home)
    nodes = [namesrv, controller]
    for name in config.brokers:
        port = free_broker_port()
        properties = _controlled_properties(config, run_dir, name, namesrv.addr,
                                            [controller.addr], "127.0.0.1", port)
        for ours in ("bindAddress", "haBindAddress", "vipChannelEnable"):
            properties.pop(ours)  # (RocketMQ binds every address)
        properties.update({"brokerIP2": "127.0.0.1", "allAckInSyncStateSet": "true"})
        conf = run_dir / f"{name}.conf"
        conf.write_text(broker_properties_text(properties))
        home = run_dir / f"{name}-home"
        nodes.append(ChaosNode.foreign(
            name, [*rocketmq.java_command(BROKER_JVM, home),
                   "org.apache.rocketmq.broker.BrokerStartup", "-c", str(conf)],
            log_path=run_dir / f"{name}.log", addr=f"127.0.0.1:{port}",
            ready=BROKER_READY.pattern, cwd=home, store_dir=run_dir / name))
    for node in nodes[1:]:
        node.start_timeout = JAVA_START_TIMEOUT
    brokers = nodes[2:]
    cluster = Cluster(namesrv, brokers[0], brokers[1:], [], None, {}, {},
                      controllers=[controller], controller_addrs=[controller.addr])
    try:
        await _serve_controlled(config, cluster, nodes, history)
    finally:
        await _kill_all(nodes)
    return await _judge(config, history, run_dir)


async def _watch_masters(cluster: Cluster, history: History, clock: Callable[[], float]
                         ) -> None:
    """Record the controllers' view of the set each time it changes, until cancelled."""
    last: tuple[str | None, int, int] | None = None
    while True:
        view = await cluster.view()
        if view is not None:
            node = cluster.broker_at(view.master_address)
            now = (node.name if node else None, view.epoch, view.in_sync)
            if now != last:
                last = now
                history.master(MasterEvent(clock(), now[0], view.epoch, view.in_sync,
                                           view.master_address))
        await trio.sleep(WATCH_INTERVAL)


async def _until_in_sync(cluster: Cluster) -> None:
    """Wait (within ``IN_SYNC_TIMEOUT``) until a master is named with every broker in its
    in-sync set: a broker that rejoined has cut its log back by then, so the slaves' logs
    can be held to being a prefix of the master's. What is found at the bound is judged."""
    with trio.move_on_after(IN_SYNC_TIMEOUT):
        while True:
            view = await cluster.view()
            if view is not None and view.master_address and \
                    view.in_sync == len(cluster.brokers):
                return
            await trio.sleep(WATCH_INTERVAL)
