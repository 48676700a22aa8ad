"""What ``trio-ha bench produce`` and ``trio-ha bench consume`` share: the cluster they run
against, their plan, and how a run's passes and failures are reported.

The deployment is the realistic one, on one machine: a name server, a master broker and its
slave, each in its own child process (:class:`trio_ha.testing.ProcessCluster`: every node
prints its addresses once it serves and stops gracefully when its stdin closes), and the
producers and consumers in this process. :class:`BenchCluster` adds what a benchmark needs
around it: the topic (4 queues) created and routed once the slave is attached, the master's
replication state, CPU per process, and profiling.

Profiling: with ``TRIO_HA_BENCH_PROFILE=<dir>`` in the environment, each measured run (warm-up
excluded) is profiled with cProfile in this process (``<dir>/client-<run>.prof``) and in the
master and the slave, which start and stop their profiler when told on their stdin
(``<dir>/<node>-<run>.prof``, e.g. ``master-sync-single-16x1-pass0.prof``). Profiles count
wall time (a thread-CPU clock costs more per call than most calls it would time): on a busy machine,
time spent waiting for a core lands on whatever call was running, mostly socket calls that wake a
peer. The figures of a profiled run are not comparable with others.
"""

from __future__ import annotations

import cProfile
import os
import time

import attrs
import trio

from ..client import MQBrokerError, MQError, open_admin
from ..testing import ClusterConfig, ProcessCluster
from ..testing.processes import NodeProcess
from ..wire.remoting import ResponseCode
from .harness import WARM_SEGMENTS, MiB, Plan, median_run, trio_run
from .loopback import Children, raw_rtt, round_trip_limit, trio_rtt

BODY_SIZE = 1024
BATCH = 32
QUEUES = 4
PULL_BATCH = 32
TAGS = "TagA"
RECORD_ESTIMATE = 1300  # bytes of commitlog per 1 KiB message (header, topic, properties)
#: (producer tasks, client instances they share), as bench produce runs them; 32 tasks show
#: what the code does with more sends in flight than the targets' 16 (``bench.produce``)
SHAPES = ((1, 1), (16, 1), (16, 4), (32, 1))
MODES = ("single", "batch")

PROFILE_ENV = "TRIO_HA_BENCH_PROFILE"


@attrs.define(kw_only=True)
class ClientsPlan(Plan):
    """How much work each part does. ``quick`` is for a smoke test (each command < 40 s)."""

    segment_size: int
    run_seconds: float
    warmup_seconds: float
    max_messages: int
    rtt_count: int
    rtt_seconds: float
    preload_messages: int
    consume_seconds: float
    passes: int
    start_timeout: float = 60.0

    @classmethod
    def make(cls, quick: bool) -> ClientsPlan:
        if quick:
            return cls(quick=True, segment_size=64 * MiB, run_seconds=0.5, warmup_seconds=0.1,
                       max_messages=200_000, rtt_count=3000, rtt_seconds=0.3,
                       preload_messages=40_000, consume_seconds=0.75, passes=1)
        # max_messages: twice what 3 s at the batch target (100k msgs/s) would store, a bound
        # on disk use that a run reaching it is far past the target anyway
        return cls(quick=False, segment_size=256 * MiB, run_seconds=3.0, warmup_seconds=0.3,
                   max_messages=600_000, rtt_count=50_000, rtt_seconds=2.0,
                   preload_messages=480_000, consume_seconds=3.0, passes=3)

    def fit_disk(self, free: int) -> None:
        """A cluster's master and slave, filled by every pass of every run at its message
        bound, stay below a third of the free space."""
        runs = len(MODES) * len(SHAPES) * self.passes
        per_message = 2 * RECORD_ESTIMATE
        budget = free // 3
        if runs * self.max_messages * per_message > budget:
            self.scaled_for_disk = True
            self.max_messages = max(10_000, budget // (runs * per_message))
        if self.preload_messages * per_message > budget:
            self.scaled_for_disk = True
            self.preload_messages = max(4_000, budget // per_message // 128 * 128)


def median_pass(runs: list[dict]) -> dict:
    """The pass with the median rate (the lower middle of an even count) as the figure, with
    every pass's rate, their spread (min, median, max) and the other processes' CPU during
    each; failures are summed over all passes."""
    middle, spread = median_run(runs, "msgs_per_s")
    figure = dict(middle)
    figure["passes_msgs_per_s"] = [r["msgs_per_s"] for r in runs]
    figure["spread_msgs_per_s"] = spread
    figure["passes_others_cores"] = [r["cpu_cores"].get("others") for r in runs]
    figure["failures"] = sum(r["failures"] for r in runs)
    statuses: dict[str, int] = {}
    for r in runs:
        for key, n in (r["failures_by_status"] or {}).items():
            statuses[key] = statuses.get(key, 0) + n
    figure["failures_by_status"] = statuses or None
    return figure


def error_key(exc: BaseException) -> str:
    """How a failed call is counted: the exception's class, and a broker's response code."""
    if isinstance(exc, MQBrokerError):
        try:
            return f"MQBrokerError:{ResponseCode(exc.code).name}"
        except ValueError:
            return f"MQBrokerError:{exc.code}"
    return type(exc).__name__


def measure_rtt(children: Children, plan: ClientsPlan, common: dict) -> tuple[dict, list[dict]]:
    """The loopback round trips (raw and trio), as the limit and as results to print."""
    rtt = raw_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
    rtt_trio = trio_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
    results = [
        {"bench": "limit.loopback_rtt", **common, **rtt,
         "note": "8-byte ping-pong, TCP_NODELAY, this process and a child, blocking sockets "
                 "(trio_ha.bench.loopback.raw_rtt), with the cluster up and idle"},
        {"bench": "limit.loopback_rtt_trio", **common, **rtt_trio,
         "note": "the same ping-pong, trio sockets in both processes"},
    ]
    return round_trip_limit(rtt, rtt_trio), results


class Profiling:
    """With PROFILE_ENV set: cProfile of this process over each measured run (written to
    ``<dir>/client-<label>.prof``) and, through their stdin, of every node of the cluster
    (``<dir>/<node>-<label>.prof``). Without it, nothing."""

    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.directory = os.environ.get(PROFILE_ENV)
        self.nodes = nodes
        self.profiler: cProfile.Profile | None = None
        self.label = ""

    def start(self, label: str) -> None:
        if not self.directory:
            return
        self.label = label
        for node in self.nodes:
            node.start_profile(label)
        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def stop(self) -> None:
        if self.profiler is None or not self.directory:
            return
        self.profiler.disable()
        for node in self.nodes:
            node.stop_profile()
        os.makedirs(self.directory, exist_ok=True)
        self.profiler.dump_stats(os.path.join(self.directory, f"client-{self.label}.prof"))
        self.profiler = None


# ---- the cluster ---------------------------------------------------------------------------------


@attrs.define(eq=False)
class BenchCluster:
    """A :class:`ProcessCluster` (a master of ``role`` and one slave, ASYNC_FLUSH) and the
    topic the benchmark uses."""

    role: str
    processes: ProcessCluster
    topic: str

    @classmethod
    def start(cls, root: str, logs: str, plan: ClientsPlan, role: str, label: str,
              topic: str) -> tuple[BenchCluster, dict]:
        """Start the cluster under ``root`` (its nodes' logs in ``logs``) and prepare it
        (:meth:`prepare`); returns it and what the preparation found."""
        config = ClusterConfig(
            data_dir=root, master_role=role, flush_disk_type="ASYNC_FLUSH",
            cluster_name=f"Bench{label.capitalize()}", broker_name=f"bench-{label}",
            properties={"mappedFileSizeCommitLog": plan.segment_size,
                        "autoCreateTopicEnable": "true",
                        "warmMapedFileEnable": str(WARM_SEGMENTS).lower()},
        )
        processes = ProcessCluster.start(config, log_dir=logs, timeout=plan.start_timeout,
                                         profile_dir=os.environ.get(PROFILE_ENV))
        cluster = cls(role, processes, topic)
        try:
            ready = trio_run(cluster.prepare, plan.start_timeout)
        except BaseException:
            processes.close()
            raise
        return cluster, ready

    @property
    def namesrv_addr(self) -> str:
        return self.processes.namesrv_addr

    @property
    def master(self) -> NodeProcess:
        return self.processes.master

    @property
    def slave(self) -> NodeProcess:
        return self.processes.slave

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.master.pid, "slave": self.slave.pid,
                "namesrv": self.processes.namesrv.pid}

    def profiling(self) -> Profiling:
        return Profiling([self.master, self.slave])

    def check(self) -> None:
        """Raise if a node has exited: the runs after it would only measure failures."""
        self.processes.check()

    def close(self) -> None:
        self.processes.close()

    def describe(self) -> dict:
        config = self.processes.config
        return {
            "master_role": self.role, "cluster": config.cluster_name,
            "broker_name": config.broker_name, "topic": self.topic,
            "namesrv": self.namesrv_addr,
            "master": {"addr": self.master.addr, "ha_addr": self.master.info.get("ha_addr"),
                       "pid": self.master.pid, "start_seconds": self.master.started_seconds},
            "slave": {"addr": self.slave.addr, "pid": self.slave.pid,
                      "start_seconds": self.slave.started_seconds},
        }

    async def prepare(self, timeout: float) -> dict:
        """Wait for the slave's first ack at the master, create the topic (4 queues) and wait
        until the name server routes it."""
        started = time.perf_counter()
        info: dict = {}
        async with open_admin(self.namesrv_addr) as admin:
            table: dict[str, str] = {}
            with trio.move_on_after(timeout):
                while True:
                    table = await runtime(admin, self.master.addr)
                    if int(table.get("slave0AckedOffset", "-1")) >= 0:
                        break
                    await trio.sleep(0.05)
            info["slave_connected_seconds"] = time.perf_counter() - started
            info["slave_connected"] = int(table.get("slave0AckedOffset", "-1")) >= 0
            await admin.create_topic(self.topic, QUEUES, cluster=self.processes.config.cluster_name)
            route = None
            with trio.move_on_after(timeout):
                while True:
                    route = await admin.topic_route(self.topic)
                    if route is not None and route.queue_datas:
                        break
                    await trio.sleep(0.05)
            info["topic_routed"] = route is not None and bool(route.queue_datas)
        info["ready_seconds"] = time.perf_counter() - started
        return info

    async def replication_state(self, admin) -> tuple[int, int]:
        """(master's log end, the slave's ack); (0, -1) when the master does not answer."""
        table = await runtime(admin, self.master.addr)
        return (int(table.get("commitLogMaxOffset", "0") or 0),
                int(table.get("slave0AckedOffset", "-1") or -1))

    async def wait_slave(self, admin, timeout: float) -> dict:
        """After a run: how far the slave's acks were behind the master's log, and how long
        it took them to catch up (bounded; at once when the master does not answer)."""
        end, acked = await self.replication_state(admin)
        started = time.perf_counter()
        behind = end - acked if acked >= 0 else None
        with trio.move_on_after(timeout):
            while 0 <= acked < end:
                await trio.sleep(0.01)
                _, acked = await self.replication_state(admin)
        return {"slave_behind_bytes_at_end": behind, "slave_caught_up": acked >= end,
                "slave_catchup_seconds": time.perf_counter() - started}


async def runtime(admin, address: str) -> dict[str, str]:
    """A broker's runtime table, empty when it does not answer."""
    try:
        return await admin.runtime_info(address)
    except MQError:
        return {}
