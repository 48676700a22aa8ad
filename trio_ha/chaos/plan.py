"""What a chaos run does: its configuration, and the faults it injects, drawn from a seed.

The schedule is a pure function of the configuration (seed included): the same seed on the
same configuration injects the same faults in the same order at the same times, so a run
that found something can be replayed. What the cluster does in between is not
deterministic (scheduling, timing), which is why every run records its own history.
"""

from __future__ import annotations

import enum
import random

import attrs

__all__ = ["ChaosConfig", "Fault", "FaultKind", "schedule"]


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


@attrs.frozen
class Fault:
    #: seconds after the workload starts
    at: float
    kind: FaultKind
    #: which slave (1-based) for the slave and link faults; 0 for the master
    target: int
    #: how long the node is down, paused, stalled or slow
    duration: float


@attrs.frozen(kw_only=True)
class ChaosConfig:
    """One run: the cluster, the load and the faults."""

    role: str = attrs.field(default="SYNC_MASTER",
                            validator=attrs.validators.in_(("SYNC_MASTER", "ASYNC_MASTER")))
    flush: str = attrs.field(default="SYNC_FLUSH",
                             validator=attrs.validators.in_(("SYNC_FLUSH", "ASYNC_FLUSH")))
    slaves: int = attrs.field(default=1, validator=attrs.validators.in_((1, 2)))
    seconds: float = attrs.field(default=120.0, validator=attrs.validators.ge(10))
    seed: int = 1
    #: mean seconds between fault starts (each is drawn uniformly in [0.5, 1.5] times it)
    fault_interval: float = attrs.field(default=4.0, validator=attrs.validators.ge(0.5))
    kinds: tuple[FaultKind, ...] = attrs.field(default=tuple(FaultKind), converter=tuple)
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

    @property
    def strict(self) -> bool:
        """Whether an acknowledged send must be on every slave too (SYNC_MASTER +
        SYNC_FLUSH: the configuration whose every SEND_OK is on two machines' disks or
        page caches)."""
        return self.role == "SYNC_MASTER" and self.flush == "SYNC_FLUSH"

    def describe(self) -> str:
        return (f"{self.role}+{self.flush}, {self.slaves} slave(s), {self.seconds:g} s, "
                f"seed {self.seed}")


def schedule(config: ChaosConfig) -> list[Fault]:
    """The faults of a run, in time order; none starts in the last tenth of the run, so
    the cluster can settle before the final check."""
    rng = random.Random(config.seed)
    faults = []
    at = config.fault_interval * rng.uniform(0.5, 1.5)
    end = config.seconds * 0.9
    while at < end:
        kind = rng.choice(config.kinds)
        target = 0 if kind in (FaultKind.KILL_MASTER, FaultKind.PAUSE_MASTER) else (
            rng.randint(1, config.slaves))
        if kind in (FaultKind.PAUSE_MASTER, FaultKind.PAUSE_SLAVE):
            # longer than the housekeeping interval: the other side gives up on the link
            duration = config.ha_housekeeping_ms / 1000 * rng.uniform(1.2, 2.0)
        elif kind is FaultKind.CUT_HA_LINK:
            duration = 0.0
        else:
            duration = rng.uniform(0.5, 3.0)
        faults.append(Fault(round(at, 3), kind, target, round(duration, 3)))
        at += duration + config.fault_interval * rng.uniform(0.5, 1.5)
    return faults
