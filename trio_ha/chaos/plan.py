"""What a chaos run does: its configuration, and the faults it injects, drawn from a seed.

The schedule is a pure function of the configuration (seed included): the same seed on the
same configuration injects the same faults in the same order at the same times, so a run
that found something can be replayed. What the cluster does in between is not
deterministic (scheduling, timing), which is why every run records its own history.

In controller mode (``ChaosConfig.controller``) the brokers take their roles from a
controller, so a fault's target is a role, not a process: target 0 is whoever is master when
the fault begins, target n the n-th of the others (``faults`` asks the controller then). The
schedule stays a function of the seed; which process a fault lands on is recorded in the
history. Controller faults (the controller leader killed or isolated, an etcd member killed)
join the kinds there.
"""

from __future__ import annotations

import enum
import random

import attrs

__all__ = ["CLASSIC_ONLY_KINDS", "CLIENT_LINK_KINDS", "CLOCK_KINDS", "CONTROLLERS",
           "CONTROLLER_KINDS", "DISK_KINDS", "HA_LINK_KINDS", "NETWORK_KINDS", "ChaosConfig",
           "Fault", "FaultKind", "default_kinds", "schedule"]


class FaultKind(enum.StrEnum):
    #: SIGKILL the master, restart it after a short down time
    KILL_MASTER = "kill-master"
    #: SIGKILL a slave, restart it after a short down time
    KILL_SLAVE = "kill-slave"
    #: SIGSTOP the master for longer than the HA housekeeping interval, then SIGCONT
    PAUSE_MASTER = "pause-master"
    PAUSE_SLAVE = "pause-slave"
    #: cut a slave's replication link inside a frame (the fault proxy)
    CUT_HA_LINK = "cut-ha-link"
    #: stop forwarding on a slave's replication link for a while (a dead network), both ways
    STALL_HA_LINK = "stall-ha-link"
    #: forward a slave's replication link in small, late pieces for a while
    SLOW_HA_LINK = "slow-ha-link"
    # -- on loopback: a fault proxy in front of each broker's client port --
    #: cut every client connection of a broker inside a frame of its answers
    CUT_CLIENT_LINK = "cut-client-link"
    #: stop forwarding on a broker's client connections for a while, both ways
    STALL_CLIENT_LINK = "stall-client-link"
    #: forward a broker's client connections in small, late pieces for a while
    SLOW_CLIENT_LINK = "slow-client-link"
    # -- on test hosts (network namespaces, ``testnet``) --
    #: the master and a slave lose every packet between them, both ways
    PARTITION_SLAVE = "partition-slave"
    #: the packets one way between the master and a slave are lost (``amount`` > 0: master
    #: to slave; < 0: slave to master), the other way flows
    BLACKHOLE_SLAVE = "blackhole-slave"
    #: the master loses every packet: clients, name server and slaves alike
    ISOLATE_MASTER = "isolate-master"
    #: a node drops ``amount`` % of its packets at random, both ways
    LOSSY_NETWORK = "lossy-network"
    #: a node's link is limited to ``amount`` kbit/s, both ways
    SLOW_NETWORK = "slow-network"
    # -- on small disks (``disk``) --
    #: a node's store filesystem has no free byte left
    DISK_FULL = "disk-full"
    # -- under the clock shim (``clockshift``) --
    #: a node's wall clock jumps by ``amount`` seconds, and back when the fault ends
    CLOCK_JUMP = "clock-jump"
    # -- controller mode only --
    #: SIGKILL the controller that leads (embedded: the name server that embeds it), restart
    #: it after a short down time
    KILL_CONTROLLER_LEADER = "kill-controller-leader"
    #: the controller that leads loses every packet (test hosts): brokers, etcd, everyone
    ISOLATE_CONTROLLER_LEADER = "isolate-controller-leader"
    #: SIGKILL one member of the controllers' etcd (``--controller etcd``), restart it
    KILL_ETCD_MEMBER = "kill-etcd-member"


#: the kinds that need the client-link proxies (loopback), test hosts, small disks, the
#: clock shim
CLIENT_LINK_KINDS = frozenset({FaultKind.CUT_CLIENT_LINK, FaultKind.STALL_CLIENT_LINK,
                               FaultKind.SLOW_CLIENT_LINK})
NETWORK_KINDS = frozenset({FaultKind.PARTITION_SLAVE, FaultKind.BLACKHOLE_SLAVE,
                           FaultKind.ISOLATE_MASTER, FaultKind.LOSSY_NETWORK,
                           FaultKind.SLOW_NETWORK})
DISK_KINDS = frozenset({FaultKind.DISK_FULL})
HA_LINK_KINDS = frozenset({FaultKind.CUT_HA_LINK, FaultKind.STALL_HA_LINK,
                           FaultKind.SLOW_HA_LINK})
#: the kinds of controller mode only
CONTROLLER_KINDS = frozenset({FaultKind.KILL_CONTROLLER_LEADER,
                              FaultKind.ISOLATE_CONTROLLER_LEADER, FaultKind.KILL_ETCD_MEMBER})
#: the kinds of classic mode only: in controller mode a slave finds its master's HA port
#: through the name server (no proxy can be put in its way, and a fixed ``haMasterAddress``
#: would outlive the first failover), and the brokers' client ports have no proxies (a
#: master's address is whatever the controller elected). Link faults there are network
#: faults between test hosts (partition, blackhole, isolate, loss, throttle).
CLASSIC_ONLY_KINDS = HA_LINK_KINDS | CLIENT_LINK_KINDS
#: the controller kinds ``--controller`` takes (None: classic, a fixed master)
CONTROLLERS = ("embedded", "etcd", "rocketmq")
CLOCK_KINDS = frozenset({FaultKind.CLOCK_JUMP})
#: the kinds that hit the master (target 0) only
_MASTER_KINDS = frozenset({FaultKind.KILL_MASTER, FaultKind.PAUSE_MASTER,
                           FaultKind.ISOLATE_MASTER, FaultKind.KILL_CONTROLLER_LEADER,
                           FaultKind.ISOLATE_CONTROLLER_LEADER})
#: members of the controllers' etcd (``--controller etcd``)
ETCD_MEMBERS = 3
#: the kinds that hit the master or a slave (target 0..slaves)
_ANY_NODE_KINDS = frozenset({FaultKind.LOSSY_NETWORK, FaultKind.SLOW_NETWORK,
                             FaultKind.DISK_FULL, FaultKind.CLOCK_JUMP, *CLIENT_LINK_KINDS})


@attrs.frozen
class Fault:
    #: seconds after the workload starts
    at: float
    kind: FaultKind
    #: which slave (1-based) for the slave and link faults; 0 for the master (in controller
    #: mode: the master when the fault begins, or the controller leader); the member
    #: (0-based) for kill-etcd-member
    target: int
    #: how long the node is down, paused, stalled or slow
    duration: float
    #: the kind's size: a loss in %, a rate in kbit/s, a clock jump in seconds, a
    #: blackhole's direction (0 where a kind has none)
    amount: float = 0.0


def _within_slaves(slaves: int, sync_acks: int) -> None:
    if not 1 <= sync_acks <= slaves:
        raise ValueError(f"sync_acks must be within 1..slaves ({slaves}), not {sync_acks}")


def default_kinds(controller: str | None) -> tuple[FaultKind, ...]:
    """Every kind that means something in the mode (the machine may still lack some:
    ``run.capabilities``). Classic: every kind of the classic harness, in its order, so the
    schedules of earlier runs are drawn the same."""
    if controller is None:
        return tuple(k for k in FaultKind if k not in CONTROLLER_KINDS)
    return tuple(k for k in FaultKind if k not in CLASSIC_ONLY_KINDS
                 and (k is not FaultKind.KILL_ETCD_MEMBER or controller == "etcd"))


@attrs.frozen(kw_only=True)
class ChaosConfig:
    """One run: the cluster, the load and the faults."""

    role: str = attrs.field(default="SYNC_MASTER",
                            validator=attrs.validators.in_(("SYNC_MASTER", "ASYNC_MASTER")))
    flush: str = attrs.field(default="SYNC_FLUSH",
                             validator=attrs.validators.in_(("SYNC_FLUSH", "ASYNC_FLUSH")))
    slaves: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))
    #: the master's haSyncAcks: how many slaves a SYNC_MASTER's SEND_OK waits for
    sync_acks: int = attrs.field(default=1, validator=lambda config, _, value:
                                 _within_slaves(config.slaves, value))
    seconds: float = attrs.field(default=120.0, validator=attrs.validators.ge(10))
    seed: int = 1
    #: mean seconds between fault starts (each is drawn uniformly in [0.5, 1.5] times it)
    fault_interval: float = attrs.field(default=4.0, validator=attrs.validators.ge(0.5))
    #: None: classic (a fixed master and its slaves); ``embedded``: a name server with
    #: ``enableControllerInNamesrv=true`` (its controller's journal on disk); ``etcd``:
    #: three ``trio-ha controller`` processes over a 3-member etcd; ``rocketmq``: RocketMQ
    #: 5.3.3's own controller (DLedger, one) and brokers, our name server, on loopback
    controller: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.in_(CONTROLLERS)))
    kinds: tuple[FaultKind, ...] = attrs.field(
        default=attrs.Factory(lambda config: default_kinds(config.controller),
                              takes_self=True), converter=tuple)
    producers: int = attrs.field(default=2, validator=attrs.validators.in_(range(1, 65)))
    #: sends per second per producer (at most; a send waits for its answer first)
    rate: float = attrs.field(default=40.0, validator=attrs.validators.gt(0))
    queues: int = attrs.field(default=4, validator=attrs.validators.in_(range(1, 65)))
    topic: str = "ChaosTopic"
    group: str = "chaos_consumer"
    #: the brokers' HA housekeeping interval: a pause longer than it breaks the link
    ha_housekeeping_ms: int = 3000
    #: the producers' send timeout (all retries included), seconds
    send_timeout: float = 3.0
    #: how long the consumer (and the slaves) may go on after the producers stop, before
    #: every node is killed
    settle_seconds: float = attrs.field(default=8.0, validator=attrs.validators.ge(0))
    #: where the nodes live: ``hosts`` (a test host each: real network faults), ``loopback``
    #: (127.0.0.x, with a fault proxy in front of each broker's client port), or ``auto``
    #: (hosts where they can be made)
    network: str = attrs.field(default="auto",
                               validator=attrs.validators.in_(("auto", "hosts", "loopback")))
    #: whether a fault may start while others still last (each starts at its own time;
    #: two that cannot be at once on one node, such as two kills, wait for each other)
    overlap: bool = False

    @property
    def brokers(self) -> list[str]:
        """The brokers' names, master first: their conf files, stores and test hosts. In
        controller mode roles move, so the names do not say one: ``broker0`` .. ``brokerN``."""
        if self.controller is not None:
            return [f"broker{n}" for n in range(self.slaves + 1)]
        return ["master", *(f"slave{n}" for n in range(1, self.slaves + 1))]

    @property
    def controllers(self) -> list[str]:
        """The controller processes' names (their conf files, logs and test hosts); the
        embedded controller is the name server's."""
        if self.controller == "etcd":
            return [f"ctl{n}" for n in range(3)]
        if self.controller == "rocketmq":
            return ["ctl0"]
        return ["namesrv"] if self.controller == "embedded" else []

    @property
    def strict(self) -> bool:
        """Whether an acknowledged send must be on ``sync_acks`` slaves too: with
        SYNC_MASTER a SEND_OK means that many slaves had the bytes (in their page caches at
        least), and the run's
        crashes are of processes, which page caches outlive, so either flush mode owes it.
        (A power loss could take an ASYNC_FLUSH slave's unflushed tail; the harness does
        not cut power.) An ASYNC_MASTER's slave may lack the newest acknowledged sends. In
        controller mode a SEND_OK waits for the in-sync set, which may be the master alone
        (a slave left it): what it promises is checked on the final master instead."""
        return self.role == "SYNC_MASTER" and self.controller is None

    def as_dict(self) -> dict[str, object]:
        """The configuration as JSON values (``from_dict`` reads it back)."""
        return {k: (list(v) if isinstance(v, tuple) else v)
                for k, v in attrs.asdict(self).items()}

    @classmethod
    def from_dict(cls, values: dict[str, object]) -> ChaosConfig:
        known = attrs.fields_dict(cls)
        unknown = set(values) - set(known)
        if unknown:
            raise ValueError(f"not chaos settings: {sorted(unknown)}")
        return cls(**{k: (tuple(FaultKind(kind) for kind in v)  # type: ignore[union-attr]
                          if k == "kinds" else v) for k, v in values.items()})

    def describe(self) -> str:
        if self.controller is not None:
            return (f"controller {self.controller}, {self.flush}, {self.slaves + 1} brokers, "
                    f"{self.seconds:g} s, seed {self.seed}")
        return (f"{self.role}+{self.flush}, {self.slaves} slave(s), {self.seconds:g} s, "
                f"seed {self.seed}")


def schedule(config: ChaosConfig) -> list[Fault]:
    """The faults of a run, in time order; none starts in the last tenth of the run, so
    the cluster can settle before the final check."""
    rng = random.Random(config.seed)
    faults = []
    at = config.fault_interval * rng.uniform(0.5, 1.5)
    end = config.seconds * 0.9
    housekeeping = config.ha_housekeeping_ms / 1000
    while at < end:
        kind = rng.choice(config.kinds)
        if kind in _MASTER_KINDS:
            target = 0
        elif kind is FaultKind.KILL_ETCD_MEMBER:
            target = rng.randrange(ETCD_MEMBERS)
        elif kind in _ANY_NODE_KINDS:
            target = rng.randint(0, config.slaves)
        else:
            target = rng.randint(1, config.slaves)
        amount = 0.0
        if kind in (FaultKind.PAUSE_MASTER, FaultKind.PAUSE_SLAVE):
            # longer than the housekeeping interval: the other side gives up on the link
            duration = housekeeping * rng.uniform(1.2, 2.0)
        elif kind in (FaultKind.CUT_HA_LINK, FaultKind.CUT_CLIENT_LINK):
            duration = 0.0
        elif kind in (FaultKind.PARTITION_SLAVE, FaultKind.BLACKHOLE_SLAVE,
                      FaultKind.ISOLATE_MASTER, FaultKind.ISOLATE_CONTROLLER_LEADER):
            # shorter or longer than the housekeeping interval: a link that survives the
            # loss, or one that is given up and made again
            duration = housekeeping * rng.uniform(0.3, 2.0)
            if kind is FaultKind.BLACKHOLE_SLAVE:
                amount = rng.choice((1.0, -1.0))
        elif kind is FaultKind.LOSSY_NETWORK:
            duration, amount = rng.uniform(1.0, 4.0), float(rng.choice((5, 20, 50)))
        elif kind is FaultKind.SLOW_NETWORK:
            duration, amount = rng.uniform(1.0, 4.0), float(rng.choice((256, 1024, 8192)))
        elif kind is FaultKind.CLOCK_JUMP:
            # minutes to hours either way: past the checkpoint's timestamps, short of the
            # retention time (72 h; a jump past it legitimately expires segments)
            seconds = rng.uniform(60.0, 3 * 3600.0)
            duration, amount = rng.uniform(1.0, 6.0), round(rng.choice((1, -1)) * seconds, 3)
        else:
            duration = rng.uniform(0.5, 3.0)
        faults.append(Fault(round(at, 3), kind, target, round(duration, 3), amount))
        at += (0.0 if config.overlap else duration) + (
            config.fault_interval * rng.uniform(0.5, 1.5))
    return faults
