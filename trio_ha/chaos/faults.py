"""Injecting one fault into a running cluster, and taking it back.

:class:`Cluster` holds what a chaos run breaks: the node processes, the fault proxies on the
replication links, and, where this machine allows them, the test network, the small disks and
the clocks of the nodes. :func:`inject` applies one :class:`~.plan.Fault` for its duration and
undoes it (in a ``finally``: a run that ends mid-fault still heals), returning what happened
in a few words for the history.

Faults may overlap (``ChaosConfig.overlap``). Network rules and clock jumps compose; what
cannot be twice at once on one node (a kill or a pause, a filled disk, a throttle, a fault of
one proxy) takes that node's lock for it, so a kill waits for a pause of the same node to end
rather than killing a frozen process whose SIGCONT would then go astray.

In controller mode the master is whoever the controller elected: a fault on "the master"
(target 0) lands on the master of the moment it begins, one on "slave n" on the n-th of the
others (:meth:`Cluster.pick`, asking the controllers, or keeping the last answer when none
answers), and :func:`inject` says where it landed. A killed broker restarts and rejoins as a
slave. Controller faults kill or isolate the controller that leads (asked the same way), or
kill an etcd member; every one is undone at its end like the others.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs
import trio

from ..testing import FaultProxy
from ..testing.etcd import EtcdCluster
from . import controllers as ask
from .cluster import ChaosNode
from .disk import SmallDisk
from .plan import Fault, FaultKind
from .testnet import Rule, TestNetwork, TestNetworkError

if TYPE_CHECKING:
    from .clockshift import NodeClock

__all__ = ["Cluster", "inject"]


@attrs.define(eq=False)
class Cluster:
    namesrv: ChaosNode
    master: ChaosNode
    slaves: list[ChaosNode]
    #: slave n's replication link goes through proxies[n - 1]
    proxies: list[FaultProxy]
    #: the test network, None on loopback
    network: TestNetwork | None = None
    #: node name -> the small disk its store is on
    disks: dict[str, SmallDisk] = attrs.field(factory=dict)
    #: node name -> its shifted clock
    clocks: dict[str, NodeClock] = attrs.field(factory=dict)
    #: on loopback, the proxy in front of each broker's client port (0: the master's)
    client_proxies: list[FaultProxy] = attrs.field(factory=list)
    #: controller mode: the controller processes (embedded: the name server), the
    #: addresses brokers reach them at (in the same order), the etcd under them
    controllers: list[ChaosNode] = attrs.field(factory=list)
    controller_addrs: list[str] = attrs.field(factory=list)
    etcd: EtcdCluster | None = None
    broker_name: str = "chaos-broker"
    #: the master the controllers named last (controller mode; None before the first)
    last_master: ChaosNode | None = None
    _locks: collections.defaultdict[str, trio.Lock] = attrs.field(
        factory=lambda: collections.defaultdict(trio.Lock))

    @property
    def controlled(self) -> bool:
        return bool(self.controller_addrs)

    @property
    def brokers(self) -> list[ChaosNode]:
        return [self.master, *self.slaves]

    def node(self, target: int) -> ChaosNode:
        """The broker of ``target`` in classic mode (fixed roles)."""
        return self.master if target == 0 else self.slaves[target - 1]

    def broker_at(self, address: str | None) -> ChaosNode | None:
        return next((b for b in self.brokers if b.addr == address), None)

    async def view(self) -> ask.SetView | None:
        """The set as the leading controller sees it now (and ``last_master`` updated);
        None: no controller answered."""
        seen = await ask.replica_view(self.controller_addrs, self.broker_name)
        if seen is not None and seen.master_address:
            self.last_master = self.broker_at(seen.master_address) or self.last_master
        return seen

    async def current_master(self) -> ChaosNode:
        """The master now: fixed in classic mode; else the controllers' word, or (none
        answers, or none is master during an election) the last one they named."""
        if not self.controlled:
            await trio.lowlevel.checkpoint()
            return self.master
        await self.view()
        return self.last_master or self.master

    def pick(self, target: int, master: ChaosNode) -> ChaosNode:
        """``target``'s broker given the master: 0 the master, n the n-th of the others."""
        if not self.controlled:
            return self.node(target)
        if target == 0:
            return master
        others = [b for b in self.brokers if b is not master]
        return others[(target - 1) % len(others)]

    async def controller_leader(self) -> ChaosNode:
        """The controller process that leads (the only one, embedded; else the one that
        says so, or the first running one while none does)."""
        if len(self.controllers) == 1:
            await trio.lowlevel.checkpoint()
            return self.controllers[0]
        index = await ask.leader_index(self.controller_addrs)
        if index is None:
            return next((c for c in self.controllers if c.running), self.controllers[0])
        return self.controllers[index]

    def lock(self, node: ChaosNode | str, what: str = "process") -> trio.Lock:
        """The lock of one of ``node``'s things (its process, its disk, its link's queue);
        a name for what is not a ChaosNode (an etcd member)."""
        return self._locks[f"{node if isinstance(node, str) else node.name}:{what}"]

    def link_addresses(self, target: int, master: ChaosNode | None = None,
                       slave: ChaosNode | None = None) -> tuple[list[str], list[str]]:
        """The addresses the master knows slave ``target`` by (its own, its proxy's), and
        those the slave knows the master by (the master's, the proxy's). In controller mode
        (no proxies) the two brokers' own addresses."""
        master = master or self.master
        slave = slave or self.node(target)
        slave_host = slave.addr.rsplit(":", 1)[0]
        master_host = master.addr.rsplit(":", 1)[0]
        if not self.proxies:
            return [slave_host], [master_host]
        proxy = self.proxies[target - 1].host
        return [slave_host, proxy], [master_host, proxy]


async def start(node: ChaosNode) -> None:
    await trio.to_thread.run_sync(node.start)


async def inject(fault: Fault, cluster: Cluster, rng: random.Random,
                 applied: Callable[[], object] = lambda: None,
                 landed: Callable[[ChaosNode], object] = lambda node: None) -> str:
    """Apply ``fault``, hold it for its duration, undo it; what happened, in a few words.
    ``applied`` is called once the fault is in force (after a wait for a node's lock), and
    ``landed`` with the process it lands on (in controller mode the target names a role:
    the master when the fault begins, the controller leader), before any lock is waited
    for."""
    kind = fault.kind
    if kind in (FaultKind.KILL_CONTROLLER_LEADER, FaultKind.ISOLATE_CONTROLLER_LEADER,
                FaultKind.KILL_ETCD_MEMBER):
        return await _controller_fault(fault, cluster, applied, landed)
    master = await cluster.current_master()
    node = cluster.pick(fault.target, master)
    landed(node)
    if kind in (FaultKind.KILL_MASTER, FaultKind.KILL_SLAVE):
        async with cluster.lock(node):
            await trio.to_thread.run_sync(node.kill)
            applied()
            await trio.sleep(fault.duration)
            await start(node)
        return f"{node.name} killed, restarted"
    if kind in (FaultKind.PAUSE_MASTER, FaultKind.PAUSE_SLAVE):
        async with cluster.lock(node):
            node.pause()
            await _hold(fault, applied, node.resume)
        return f"{node.name} paused"
    # One proxy fault at a time per proxy: a cut waits for the frame it is armed for, and
    # the end of one stall or slowdown would end another's early.
    if kind in (FaultKind.CUT_HA_LINK, FaultKind.STALL_HA_LINK, FaultKind.SLOW_HA_LINK):
        async with cluster.lock(node, "replication proxy"):
            return await _proxy_fault(fault, cluster.proxies[fault.target - 1],
                                      f"{node.name}'s replication link", rng, applied)
    if kind in (FaultKind.CUT_CLIENT_LINK, FaultKind.STALL_CLIENT_LINK,
                FaultKind.SLOW_CLIENT_LINK):
        async with cluster.lock(node, "client proxy"):
            return await _proxy_fault(fault, cluster.client_proxies[fault.target],
                                      f"{node.name}'s client links", rng, applied)
    if kind is FaultKind.DISK_FULL:
        disk = cluster.disks[node.name]
        async with cluster.lock(node, "disk"):
            taken = await trio.to_thread.run_sync(disk.fill)
            await _hold(fault, applied, disk.release)
        return f"{node.name}'s disk filled ({taken >> 20} MiB of ballast)"
    if kind is FaultKind.CLOCK_JUMP:
        clock = cluster.clocks[node.name]
        clock.jump(fault.amount)
        await _hold(fault, applied, lambda: clock.jump(-fault.amount))
        return f"{node.name}'s clock jumped {fault.amount:+.0f} s and back"
    return await _network_fault(fault, cluster, applied, master, node)


async def _controller_fault(fault: Fault, cluster: Cluster, applied: Callable[[], object],
                            landed: Callable[[ChaosNode], object]) -> str:
    kind = fault.kind
    if kind is FaultKind.KILL_ETCD_MEMBER:
        etcd = cluster.etcd
        assert etcd is not None, "kill-etcd-member needs --controller etcd"
        member = etcd.members[fault.target % len(etcd.members)]
        async with cluster.lock(member.name):
            await trio.to_thread.run_sync(member.kill)
            applied()
            await trio.sleep(fault.duration)
            # (restart waits until the member is healthy: it rejoins the cluster)
            await trio.to_thread.run_sync(etcd.restart, etcd.members.index(member))
        return f"etcd member {member.name} killed, restarted"
    # (embedded, the leader is the name server: killing or isolating it takes the routes
    # away too, until the brokers register again)
    leader = await cluster.controller_leader()
    landed(leader)
    if kind is FaultKind.KILL_CONTROLLER_LEADER:
        async with cluster.lock(leader):
            await trio.to_thread.run_sync(leader.kill)
            applied()
            await trio.sleep(fault.duration)
            await start(leader)
        return f"controller leader {leader.name} killed, restarted"
    network = cluster.network
    assert network is not None, f"{kind} needs the test network"
    rule = await trio.to_thread.run_sync(network.isolate, leader.name)
    try:
        await _hold(fault, applied, lambda: None)
    finally:
        with trio.CancelScope(shield=True):
            await _heal(network, [rule])
    return f"controller leader {rule.label}"


async def _hold(fault: Fault, applied: Callable[[], object],
                undo: Callable[[], object]) -> None:
    """The fault is in force: say so, hold it for its duration, then undo it (cancelled
    too: a run that ends mid-fault leaves nothing broken)."""
    applied()
    try:
        await trio.sleep(fault.duration)
    finally:
        undo()  # (no checkpoint: undone even when the run ends mid-fault)


async def _proxy_fault(fault: Fault, proxy: FaultProxy, link: str, rng: random.Random,
                       applied: Callable[[], object]) -> str:
    if fault.kind in (FaultKind.CUT_HA_LINK, FaultKind.CUT_CLIENT_LINK):
        applied()  # (armed: the cut itself comes with the next frame)
        with trio.move_on_after(2.0) as waited:
            if fault.kind is FaultKind.CUT_HA_LINK:
                cut = await proxy.cut_mid_frame(rng.randint(1, 4096))
                return (f"{link} cut {cut.body_bytes} bytes into the body of the frame at "
                        f"log offset {cut.frame_offset}")
            # answers are remoting frames of a few hundred bytes: a cut a little way into
            # the stream lands inside one (its length, header or body)
            cut = await proxy.cut_after(rng.randint(1, 600))
            return f"{link} cut after {cut.stream_offset} bytes of a connection's answers"
        if waited.cancelled_caught:
            proxy.close_all("cut")
        return f"{link} cut (nothing in flight)"
    if fault.kind in (FaultKind.STALL_HA_LINK, FaultKind.STALL_CLIENT_LINK):
        proxy.stall()
        await _hold(fault, applied, proxy.resume)
        return f"{link} stalled"
    proxy.set_delay(0.005, max_chunk=512)
    await _hold(fault, applied, lambda: proxy.set_delay(0))
    return f"{link} slowed"


async def _network_fault(fault: Fault, cluster: Cluster, applied: Callable[[], object],
                         master: ChaosNode, node: ChaosNode) -> str:
    network = cluster.network
    assert network is not None, f"{fault.kind} needs the test network"
    kind = fault.kind
    changes: list[functools.partial[Rule]] = []
    if kind in (FaultKind.PARTITION_SLAVE, FaultKind.BLACKHOLE_SLAVE):
        slave_side, master_side = cluster.link_addresses(fault.target, master, node)
        if kind is FaultKind.PARTITION_SLAVE:
            changes.append(functools.partial(network.block, master.name, slave_side))
            changes.append(functools.partial(network.block, node.name, master_side))
        else:
            # one way: the master's packets towards the slave vanish, or the slave's
            # towards the master do; the other direction flows
            towards_slave = fault.amount > 0
            changes.append(functools.partial(network.block, master.name, slave_side,
                                             inbound=not towards_slave,
                                             outbound=towards_slave))
    elif kind is FaultKind.ISOLATE_MASTER:
        changes.append(functools.partial(network.isolate, master.name))
    elif kind is FaultKind.LOSSY_NETWORK:
        changes.append(functools.partial(network.lose, node.name, int(fault.amount)))
    elif kind is FaultKind.SLOW_NETWORK:
        changes.append(functools.partial(network.throttle, node.name, int(fault.amount)))
    else:  # pragma: no cover - every kind is handled above
        raise AssertionError(kind)
    # (one token bucket per link: a second throttle of the node waits for the first)
    one_at_a_time = (cluster.lock(node, "link") if kind is FaultKind.SLOW_NETWORK
                     else contextlib.nullcontext())
    rules: list[Rule] = []
    async with one_at_a_time:
        try:
            for change in changes:  # (each rule is kept as soon as it is made)
                rules.append(await trio.to_thread.run_sync(change))
            await _hold(fault, applied, lambda: None)
        finally:
            with trio.CancelScope(shield=True):
                await _heal(network, rules)
    return "; ".join(rule.label for rule in rules)


async def _heal(network: TestNetwork, rules: list[Rule]) -> None:
    """Heal every rule (all are tried; the first failure is raised after)."""
    failures = []
    for rule in rules:
        try:
            await trio.to_thread.run_sync(network.heal, rule)
        except TestNetworkError as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
