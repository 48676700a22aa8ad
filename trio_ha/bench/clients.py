"""``trio-ha bench produce`` / ``trio-ha bench consume``: the client library against a real
cluster, next to the loopback round trip measured in the same run.

The deployment is the realistic one, on one machine: a name server, a master broker and its
slave, each in its own child process (``python -m trio_ha.bench.clients node JSON``: it starts
the node on port 0, prints its addresses as one JSON line, and runs until its stdin closes or
it gets SIGINT/SIGTERM, then shuts down gracefully), and the producers and consumers in this
process. N concurrent producers are N trio tasks sharing one client instance (one connection
to the master), as a Java application's threads share one ``MQClientInstance``; the 16-task
runs are repeated with 4 client instances (4 connections) beside it.

``bench produce`` (one JSON object per result, in this order):

1. ``produce.config``; the name server starts;
2. for ASYNC_MASTER and then SYNC_MASTER (both ASYNC_FLUSH, both with a SLAVE): the cluster
   starts (``produce.cluster``), the master's slave connection is awaited and a topic of 4
   queues is created; the loopback round trip is measured (``limit.loopback_rtt``: blocking
   sockets between this process and a child; ``limit.loopback_rtt_trio``: trio on both
   sides); then ``produce.send`` for 1 KiB bodies, single ``send`` and ``send_batch`` of 32,
   with 1 producer task, 16 tasks on one client instance and 16 tasks on 4 instances: a
   warm-up, then a run bounded by time and by messages; every send timed; each in
   ``passes`` passes (2; quick: 1), the fastest reported with every pass's rate;
3. ``produce.summary``: the issue's targets (16 producers on one instance, SYNC_MASTER with a
   slave: single sends and batches of 32), met or not, and the reference figures.

``bench consume``: a SYNC_MASTER + SLAVE cluster; a topic of 4 queues is preloaded with N
messages (``consume.preload``: batches of 32, 16 tasks) and the slave waited for; then
``consume.pull``: 4 tasks, one per queue, ``PullConsumer.pull`` of 32 from the first offset to
the last, from the master and from the slave (the consumer's ``suggestWhichBrokerId`` pinned to
the slave's id, as when a master is gone); and the ``messages()`` stream (the high-level API,
one task) from the master; every run bounded by time and by N, in passes as above (each
from the first offset again); then ``consume.summary``.

Each result carries ``failures`` (by status: send statuses other than SEND_OK, pull statuses
other than FOUND, exceptions by class and broker code), latency percentiles in microseconds,
``cpu_cores`` (CPU seconds / wall seconds of this process and of every node during the run:
on a 2-core machine the three processes share the cores; ``others`` is what the rest of the
machine used meanwhile, i.e. how busy a shared machine was) and the round-trip limit. Rates
count acknowledged messages only (a batch of 32 counts 32); ``mb_per_s`` is decimal MB/s of
bodies. Benchmarks report figures; they never assert.

Profiling: with ``TRIO_HA_BENCH_PROFILE=<dir>`` in the environment, each measured run (warm-up
excluded) is profiled with cProfile in this process (``<dir>/client-<run>.prof``) and in the
master and the slave, which start and stop their profiler when told on their stdin
(``<dir>/<node>-<run>.prof``, e.g. ``master-sync-sync-single-16x1-pass0.prof``). Profiles
count wall time (a thread-CPU clock costs ~0.5 us a call here, more than most calls it would
time): on a busy machine, time spent waiting for a core lands on whatever call was running,
mostly socket calls that wake a peer. The figures of a profiled run are not comparable with
others.
"""

from __future__ import annotations

import contextlib
import cProfile
import gc
import json
import logging
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import attrs
import trio

from .. import _backend
from ..client import (
    Message,
    MQBrokerError,
    MQError,
    PullStatus,
    SendStatus,
    open_admin,
    open_client_instance,
    open_producer,
    open_pull_consumer,
)
from ..wire.remoting import RequestCode, ResponseCode
from . import tidy
from .replication import (
    _child_env,
    _Children,
    _latency_us,
    _stderr_tail,
    _trio_run,
    raw_rtt,
    trio_rtt,
)
from .store import _RunState

MB = 1_000_000
MiB = 1 << 20

BODY_SIZE = 1024
BATCH = 32
QUEUES = 4
PULL_BATCH = 32
MODES = ("single", "batch")
#: (producer tasks, client instances they share)
SHAPES = ((1, 1), (16, 1), (16, 4))
ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
SOURCES = ("master", "slave")

TARGET_SYNC_SINGLE_16 = 15_000
TARGET_SYNC_BATCH_16 = 100_000
TARGET_CONSUME = 100_000

#: the issue's figures for scale (same machine class; not measured here)
REFERENCE = {
    "redis_replica_xadd_wait_16_c_clients_per_s": 30_700,
    "redis_replica_xadd_wait_16_redis_py_clients_per_s": 7_200,
    "nats_jetstream_r3_acked_publish_16_c_clients_per_s": 7_900,
}

PROFILE_ENV = "TRIO_HA_BENCH_PROFILE"
PRODUCER_GROUP = "BenchProducerGroup"
TAGS = "TagA"
RECORD_ESTIMATE = 1300  # bytes of commitlog per 1 KiB message (header, topic, properties)

_CLOCK_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100



class _Plan:
    """How much work each part does. ``quick`` is for a smoke test (each command < 40 s)."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        if quick:
            self.segment_size = 64 * MiB
            self.run_seconds = 0.5
            self.warmup_seconds = 0.1
            self.max_messages = 200_000
            self.rtt_count = 3000
            self.rtt_seconds = 0.3
            self.preload_messages = 40_000
            self.consume_seconds = 0.75
            self.passes = 1
        else:
            self.segment_size = 256 * MiB
            self.run_seconds = 3.0
            self.warmup_seconds = 0.3
            # twice what 3 s at the batch target (100k msgs/s) would store: a bound on disk
            # use that a run reaching it is far past the target anyway
            self.max_messages = 600_000
            self.rtt_count = 50_000
            self.rtt_seconds = 2.0
            self.preload_messages = 480_000
            self.consume_seconds = 3.0
            self.passes = 2
        self.start_timeout = 60.0
        self.scaled_for_disk = False

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


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process ``pid`` (Linux ``/proc``), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return None
    fields = data.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICK


def _machine_busy_seconds() -> float | None:
    """CPU seconds all processes of this machine have been busy since boot (``/proc/stat``:
    everything but idle and iowait), None where there is no /proc."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    ticks = [int(v) for v in fields[1:]]
    return (sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)) / _CLOCK_TICK


class _CpuMeter:
    """CPU seconds of this process, of named child processes and of the whole machine over
    an interval, as cores (CPU seconds / wall seconds). ``others`` is what the rest of the
    machine used meanwhile: on a shared machine, the cores the run did not get."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.start()

    def start(self) -> None:
        self._wall = time.perf_counter()
        self._self = time.process_time()
        self._children = {name: _cpu_seconds(pid) for name, pid in self.pids.items()}
        self._machine = _machine_busy_seconds()

    def cores(self) -> dict:
        wall = time.perf_counter() - self._wall
        result = {"client": (time.process_time() - self._self) / wall}
        for name, pid in self.pids.items():
            now, before = _cpu_seconds(pid), self._children[name]
            result[name] = (now - before) / wall if now is not None and before is not None else None
        result["total"] = sum(v for v in result.values() if v is not None)
        machine = _machine_busy_seconds()
        if machine is not None and self._machine is not None:
            result["machine"] = (machine - self._machine) / wall
            result["others"] = max(0.0, result["machine"] - result["total"])
        return result


def _best_pass(runs: list[dict]) -> dict:
    """The pass with the highest rate, with every pass's rate and the other processes' CPU
    during it; failures are summed over all passes (a shared machine can only make a pass
    slower, so the best pass is the figure, as for the other benchmarks' limits)."""
    best = dict(max(runs, key=lambda r: r["msgs_per_s"]))
    best["passes_msgs_per_s"] = [r["msgs_per_s"] for r in runs]
    best["passes_others_cores"] = [r["cpu_cores"].get("others") for r in runs]
    best["failures"] = sum(r["failures"] for r in runs)
    statuses: dict[str, int] = {}
    for r in runs:
        for key, n in (r["failures_by_status"] or {}).items():
            statuses[key] = statuses.get(key, 0) + n
    best["failures_by_status"] = statuses or None
    return best


def _error_key(exc: BaseException) -> str:
    if isinstance(exc, MQBrokerError):
        try:
            return f"MQBrokerError:{ResponseCode(exc.code).name}"
        except ValueError:
            return f"MQBrokerError:{exc.code}"
    return type(exc).__name__


def _count(table: dict, key: str) -> None:
    table[key] = table.get(key, 0) + 1


# ---- nodes: child processes ------------------------------------------------------------------


@attrs.define(eq=False)
class _Node:
    name: str
    proc: subprocess.Popen
    stderr_path: str
    info: dict = attrs.field(factory=dict)
    started_seconds: float = 0.0

    @property
    def addr(self) -> str:
        return self.info["addr"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def command(self, line: str) -> None:
        """One line to the node's stdin (profiling commands); ignored if it has gone."""
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass


class _Nodes:
    """Name servers and brokers in child processes. A node stops when its stdin closes;
    ``close`` stops every node still running (killing it after a grace period)."""

    def __init__(self, logs: str) -> None:
        self.logs = logs
        self.nodes: list[_Node] = []

    def start(self, name: str, args: dict, timeout: float) -> _Node:
        stderr_path = os.path.join(self.logs, f"{name}.stderr")
        command = [sys.executable, "-m", "trio_ha.bench.clients", "node",
                   json.dumps({"name": name, **args})]
        started = time.perf_counter()
        with open(stderr_path, "ab") as stderr:
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=stderr, env=_child_env())
        node = _Node(name, proc, stderr_path)
        self.nodes.append(node)
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if ready else b""
        if not line.strip():
            self.stop(node)
            raise RuntimeError(f"node {name} did not start within {timeout:g} s: "
                               f"{_stderr_tail(stderr_path)}")
        node.info = json.loads(line)
        node.started_seconds = time.perf_counter() - started
        return node

    def stop(self, *nodes: _Node, timeout: float = 20.0) -> None:
        """Close the nodes' stdin (a graceful stop), wait, kill what is left."""
        for node in nodes:
            if node.proc.stdin is not None and not node.proc.stdin.closed:
                with contextlib.suppress(OSError):
                    node.proc.stdin.close()
        deadline = time.monotonic() + timeout
        for node in nodes:
            try:
                node.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait()
            if node.proc.stdout is not None:
                node.proc.stdout.close()
            if node in self.nodes:
                self.nodes.remove(node)

    def close(self) -> None:
        # brokers first (they unregister from the name server), then the name servers
        brokers = [n for n in self.nodes if not n.name.startswith("namesrv")]
        self.stop(*brokers)
        self.stop(*list(self.nodes))


def _broker_properties(root: str, *, cluster: str, broker_name: str, role: str,
                       namesrv: str, segment_size: int) -> str:
    slave = role == "SLAVE"
    return "\n".join([
        f"brokerClusterName={cluster}",
        f"brokerName={broker_name}",
        f"brokerId={1 if slave else 0}",
        f"brokerRole={role}",
        "flushDiskType=ASYNC_FLUSH",
        "listenPort=0",
        "bindAddress=127.0.0.1",
        "brokerIP1=127.0.0.1",
        "haBindAddress=127.0.0.1",
        f"namesrvAddr={namesrv}",
        f"storePathRootDir={root}",
        f"mappedFileSizeCommitLog={segment_size}",
        "autoCreateTopicEnable=true",
        "haReconnectInterval=1000",
        "",
    ])


@attrs.define(eq=False)
class _Cluster:
    role: str
    namesrv: _Node
    master: _Node
    slave: _Node
    cluster: str
    broker_name: str
    topic: str

    def profiling(self) -> _Profiling:
        return _Profiling([self.master, self.slave])

    @property
    def pids(self) -> dict[str, int]:
        return {"master": self.master.pid, "slave": self.slave.pid,
                "namesrv": self.namesrv.pid}

    def check(self) -> None:
        """Raise if a node has exited: the runs after it would only measure failures."""
        for node in (self.namesrv, self.master, self.slave):
            code = node.proc.poll()
            if code is not None:
                raise RuntimeError(f"node {node.name} exited with status {code}: "
                                   f"{_stderr_tail(node.stderr_path)}")

    def describe(self) -> dict:
        return {
            "master_role": self.role, "cluster": self.cluster, "broker_name": self.broker_name,
            "topic": self.topic, "namesrv": self.namesrv.addr,
            "master": {"addr": self.master.addr, "ha_addr": self.master.info.get("ha_addr"),
                       "pid": self.master.pid,
                       "start_seconds": self.master.started_seconds},
            "slave": {"addr": self.slave.addr, "pid": self.slave.pid,
                      "start_seconds": self.slave.started_seconds},
        }


def _start_cluster(nodes: _Nodes, base: str, plan: _Plan, role: str, namesrv: _Node,
                   label: str, topic: str) -> tuple[_Cluster, dict]:
    cluster_name = f"Bench{label.capitalize()}"
    broker_name = f"bench-{label}"
    master = nodes.start(f"master-{label}", {"kind": "broker", "properties": _broker_properties(
        os.path.join(base, f"master-{label}"), cluster=cluster_name, broker_name=broker_name,
        role=role, namesrv=namesrv.addr, segment_size=plan.segment_size,
    )}, plan.start_timeout)
    slave = nodes.start(f"slave-{label}", {"kind": "broker", "properties": _broker_properties(
        os.path.join(base, f"slave-{label}"), cluster=cluster_name, broker_name=broker_name,
        role="SLAVE", namesrv=namesrv.addr, segment_size=plan.segment_size,
    )}, plan.start_timeout)
    cluster = _Cluster(role, namesrv, master, slave, cluster_name, broker_name, topic)
    ready = _trio_run(_prepare_cluster, cluster, plan.start_timeout)
    return cluster, ready


async def _runtime(admin, address: str) -> dict[str, str]:
    try:
        return await admin.runtime_info(address)
    except MQError:
        return {}


async def _prepare_cluster(cluster: _Cluster, timeout: float) -> dict:
    """Wait for the slave's first ack at the master, create the topic (4 queues) and wait
    until the name server routes it."""
    started = time.perf_counter()
    info: dict = {}
    async with open_admin(cluster.namesrv.addr) as admin:
        with trio.move_on_after(timeout):
            while True:
                table = await _runtime(admin, cluster.master.addr)
                if int(table.get("slave0AckedOffset", "-1")) >= 0:
                    break
                await trio.sleep(0.05)
        info["slave_connected_seconds"] = time.perf_counter() - started
        info["slave_connected"] = int(table.get("slave0AckedOffset", "-1")) >= 0
        await admin.create_topic(cluster.topic, QUEUES, cluster=cluster.cluster)
        with trio.move_on_after(timeout):
            while True:
                route = await admin.topic_route(cluster.topic)
                if route is not None and route.queue_datas:
                    break
                await trio.sleep(0.05)
        info["topic_routed"] = route is not None and bool(route.queue_datas)
    info["ready_seconds"] = time.perf_counter() - started
    return info


async def _replication_state(admin, cluster: _Cluster) -> tuple[int, int]:
    """(master's log end, the slave's ack); (0, -1) when the master does not answer."""
    table = await _runtime(admin, cluster.master.addr)
    return (int(table.get("commitLogMaxOffset", "0") or 0),
            int(table.get("slave0AckedOffset", "-1") or -1))


async def _wait_slave(admin, cluster: _Cluster, timeout: float) -> dict:
    """After a run: how far the slave's acks were behind the master's log, and how long it
    took them to catch up (bounded; at once when the master does not answer)."""
    end, acked = await _replication_state(admin, cluster)
    started = time.perf_counter()
    behind = end - acked if acked >= 0 else None
    with trio.move_on_after(timeout):
        while 0 <= acked < end:
            await trio.sleep(0.01)
            _, acked = await _replication_state(admin, cluster)
    return {"slave_behind_bytes_at_end": behind, "slave_caught_up": acked >= end,
            "slave_catchup_seconds": time.perf_counter() - started}


# ---- the child entry point -------------------------------------------------------------------


class _NodeProfiler:
    """cProfile of a node's event loop over the runs the parent names: ``profile-start
    LABEL`` and ``profile-stop`` lines on stdin; each stop writes ``<dir>/<node>-<LABEL>.prof``
    (PROFILE_ENV names the directory; without it the commands are ignored)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.directory = os.environ.get(PROFILE_ENV)
        self.profiler: cProfile.Profile | None = None
        self.label = ""

    def command(self, line: str) -> None:
        verb, _, label = line.strip().partition(" ")
        if self.directory is None:
            return
        if verb == "profile-start":
            self.stop()
            self.label = label or "run"
            self.profiler = cProfile.Profile()
            self.profiler.enable()
        elif verb == "profile-stop":
            self.stop()

    def stop(self) -> None:
        if self.profiler is None:
            return
        self.profiler.disable()
        os.makedirs(self.directory, exist_ok=True)
        self.profiler.dump_stats(os.path.join(self.directory, f"{self.name}-{self.label}.prof"))
        self.profiler = None


async def _until_stopped(profiler: _NodeProfiler) -> None:
    """Serve stdin's commands; return when stdin reaches EOF (the parent closed it, or died)
    or on SIGINT/SIGTERM."""
    async with trio.open_nursery() as nursery:

        async def stdin_commands() -> None:
            stream = trio.lowlevel.FdStream(os.dup(0))
            pending = b""
            async with stream:
                while data := await stream.receive_some(4096):
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        profiler.command(line.decode(errors="replace"))
            nursery.cancel_scope.cancel()

        async def signalled(signals) -> None:
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()

        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            nursery.start_soon(stdin_commands)
            nursery.start_soon(signalled, signals)
            await trio.sleep_forever()


async def _serve_node(args: dict) -> None:
    from ..broker import BrokerConfig, serve_broker
    from ..namesrv import NamesrvConfig, serve_namesrv

    profiler = _NodeProfiler(args["name"])
    try:
        async with trio.open_nursery() as nursery:
            if args["kind"] == "namesrv":
                _, port = await nursery.start(
                    serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1")
                )
                info = {"addr": f"127.0.0.1:{port}"}
            else:
                config = BrokerConfig.from_properties(args["properties"])
                addresses = await nursery.start(serve_broker, config)
                info = {"addr": addresses.broker_addr, "ha_addr": addresses.ha_addr,
                        "vip_addr": addresses.vip_addr, "role": config.role.value}
            info["pid"] = os.getpid()
            print(json.dumps(info), flush=True)
            await _until_stopped(profiler)
            nursery.cancel_scope.cancel()
    finally:
        profiler.stop()


def _node_main(args: dict) -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"{args['name']} %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(_serve_node, args)
    except KeyboardInterrupt:
        pass


# ---- limits ------------------------------------------------------------------------------------


def _measure_rtt(children: _Children, plan: _Plan, common: dict) -> tuple[dict, list[dict]]:
    rtt = raw_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
    rtt_trio = trio_rtt(children, count=plan.rtt_count, seconds=plan.rtt_seconds, timeout=60)
    results = [
        {"bench": "limit.loopback_rtt", **common, **rtt,
         "note": "8-byte ping-pong, TCP_NODELAY, this process and a child, blocking sockets "
                 "(trio_ha.bench.replication.raw_rtt), with the cluster up and idle"},
        {"bench": "limit.loopback_rtt_trio", **common, **rtt_trio,
         "note": "the same ping-pong, trio sockets in both processes"},
    ]
    limit = {"name": "loopback_rtt_p50", "value": rtt["p50_us"], "unit": "us",
             "p99_us": rtt["p99_us"], "trio_p50_us": rtt_trio["p50_us"],
             "trio_p99_us": rtt_trio["p99_us"]}
    return limit, results


class _Profiling:
    """With PROFILE_ENV set: cProfile of this process over each measured run (written to
    ``<dir>/client-<label>.prof``) and, through their stdin, of every node of the cluster
    (``<dir>/<node>-<label>.prof``). Without it, nothing."""

    def __init__(self, nodes: list[_Node]) -> None:
        self.directory = os.environ.get(PROFILE_ENV)
        self.nodes = nodes
        self.profiler: cProfile.Profile | None = None
        self.label = ""

    def start(self, label: str) -> None:
        if not self.directory:
            return
        self.label = label
        for node in self.nodes:
            node.command(f"profile-start {label}")
        self.profiler = cProfile.Profile()
        self.profiler.enable()

    def stop(self) -> None:
        if self.profiler is None:
            return
        self.profiler.disable()
        for node in self.nodes:
            node.command("profile-stop")
        os.makedirs(self.directory, exist_ok=True)
        self.profiler.dump_stats(os.path.join(self.directory, f"client-{self.label}.prof"))
        self.profiler = None


def _scratch(directory: str | None, what: str) -> tuple[str, str]:
    if directory is not None:
        os.makedirs(directory, exist_ok=True)
    base = tempfile.mkdtemp(prefix=f"trio-ha-bench-{what}-", dir=directory)
    logs = os.path.join(base, "logs")
    os.makedirs(logs)
    return base, logs


# ---- produce -----------------------------------------------------------------------------------


class _SendState(_RunState):
    """The shared budget of one run (``remaining`` counts sends) and what came back."""

    def __init__(self, remaining: int, deadline: float) -> None:
        super().__init__(remaining, deadline)
        self.errors: list[str] = []


async def _drive_sends(sends: list, tasks: int, state: _SendState, measure: bool) -> None:
    """``tasks`` tasks, task i calling ``sends[i % len(sends)]()`` in a loop until the
    budget or the deadline runs out; every call timed when ``measure``."""
    clock = time.perf_counter
    clock_ns = time.perf_counter_ns
    latencies = state.latencies
    ok_status = SendStatus.SEND_OK

    async def task(index: int) -> None:
        send = sends[index % len(sends)]
        while state.remaining > 0 and clock() < state.deadline:
            state.remaining -= 1
            t0 = clock_ns()
            try:
                result = await send()
            except MQError as exc:
                state.failed += 1
                _count(state.statuses, _error_key(exc))
                if len(state.errors) < 3:
                    state.errors.append(str(exc))
                continue
            if measure:
                latencies.append(clock_ns() - t0)
            if result.send_status is ok_status:
                state.ok += 1
            else:
                state.failed += 1
                _count(state.statuses, result.send_status.name)

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(task, index)


async def _produce_run(cluster: _Cluster, plan: _Plan, mode: str, producers: int,
                       instances: int, label: str) -> dict:
    body = os.urandom(BODY_SIZE)
    per_send = 1 if mode == "single" else BATCH
    async with contextlib.AsyncExitStack() as stack:
        sends = []
        for _ in range(instances):
            client = await stack.enter_async_context(open_client_instance(cluster.namesrv.addr))
            producer = await stack.enter_async_context(open_producer(client, PRODUCER_GROUP))
            if mode == "single":
                message = Message(cluster.topic, body, tags=TAGS)
                sends.append(lambda p=producer, m=message: p.send(m))
            else:
                batch = [Message(cluster.topic, body, tags=TAGS) for _ in range(BATCH)]
                sends.append(lambda p=producer, b=batch: p.send_batch(b))
        admin = await stack.enter_async_context(open_admin(client))

        # warm-up on the same path: routes, connections, heartbeats, the broker's caches
        warm = _SendState(plan.max_messages // per_send, time.perf_counter() + plan.warmup_seconds)
        await _drive_sends(sends, producers, warm, False)
        await _wait_slave(admin, cluster, 30)
        end_before, _ = await _replication_state(admin, cluster)

        gc.collect()
        profiling = cluster.profiling()
        profiling.start(label)
        cpu = _CpuMeter(cluster.pids)
        state = _SendState(max(1, plan.max_messages // per_send), 0.0)
        started = time.perf_counter()
        state.deadline = started + plan.run_seconds
        await _drive_sends(sends, producers, state, True)
        elapsed = time.perf_counter() - started
        cores = cpu.cores()
        profiling.stop()
        replication = await _wait_slave(admin, cluster, 30)
        end_after, _ = await _replication_state(admin, cluster)
    messages = state.ok * per_send
    return {
        "messages": messages,
        "sends": state.ok,
        "seconds": elapsed,
        "msgs_per_s": messages / elapsed,
        "sends_per_s": state.ok / elapsed,
        "mb_per_s": messages * BODY_SIZE / elapsed / MB,
        "record_bytes": end_after - end_before if end_after >= end_before else None,
        "latency_us": _latency_us(state.latencies),
        "failures": state.failed,
        "failures_by_status": state.statuses or None,
        "errors_sample": state.errors or None,
        "bounded_by": "messages" if state.remaining <= 0 else "time",
        "cpu_cores": cores,
        **replication,
        "warmup_sends": warm.ok, "warmup_failures": warm.failed,
    }


def _tidied(results: Iterator[dict]) -> Iterator[dict]:
    """``results`` with floats rounded; closing it (also when the caller stops early) runs
    the generator's cleanup: child processes and the scratch directory go."""
    with contextlib.closing(results):
        for result in results:
            yield tidy(result)


def run_produce_benchmarks(directory: str | None = None, *, quick: bool = False
                           ) -> Iterator[dict]:
    """Run the produce benchmarks in a scratch directory (inside ``directory`` if given) and
    yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error or Ctrl-C."""
    yield from _tidied(_produce(directory, quick))


def _produce(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = _Plan(quick)
    base, logs = _scratch(directory, "produce")
    nodes = _Nodes(logs)
    children = _Children(logs)
    begun = time.perf_counter()
    common = {"backend": _backend.native_backend, "quick": quick}
    try:
        plan.fit_disk(shutil.disk_usage(base).free)
        yield {
            "bench": "produce.config", **common, "scratch_dir": base,
            "body_size": BODY_SIZE, "batch": BATCH, "queues": QUEUES,
            "master_roles": list(ROLES), "modes": list(MODES),
            "shapes": [{"producers": p, "client_instances": i} for p, i in SHAPES],
            "run_seconds": plan.run_seconds, "warmup_seconds": plan.warmup_seconds,
            "passes": plan.passes,
            "max_messages_per_run": plan.max_messages, "segment_size": plan.segment_size,
            "scaled_for_disk": plan.scaled_for_disk, "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
            "profiling": os.environ.get(PROFILE_ENV) or None,
            "note": "name server, master and slave are child processes (python -m "
                    "trio_ha.bench.clients node); producers are trio tasks in this process; "
                    "all share this machine's cores (loadavg says how busy it was)",
        }
        namesrv = nodes.start("namesrv", {"kind": "namesrv"}, plan.start_timeout)
        runs: dict[tuple[str, str, int, int], dict] = {}
        for role in ROLES:
            label = "sync" if role == "SYNC_MASTER" else "async"
            cluster, ready = _start_cluster(nodes, base, plan, role, namesrv, label,
                                            f"BenchProduce{label.capitalize()}")
            try:
                yield {"bench": "produce.cluster", **common, **cluster.describe(), **ready,
                       "flush": "ASYNC_FLUSH", "queues": QUEUES}
                limit, limit_results = _measure_rtt(children, plan, common)
                yield from limit_results
                for mode in MODES:
                    for producers, instances in SHAPES:
                        name = f"{label}-{mode}-{producers}x{instances}"
                        cluster.check()
                        run = _best_pass([
                            _trio_run(_produce_run, cluster, plan, mode, producers, instances,
                                      f"{name}-pass{index}")
                            for index in range(plan.passes)
                        ])
                        runs[role, mode, producers, instances] = run
                        p50 = run["latency_us"]["p50"]
                        result = {
                            "bench": "produce.send", "master_role": role, "slave": True,
                            "flush": "ASYNC_FLUSH", "mode": mode,
                            "batch": 1 if mode == "single" else BATCH,
                            "body_size": BODY_SIZE, "producers": producers,
                            "client_instances": instances, **run, "limit": limit,
                            "ratio_p50_to_rtt": p50 / limit["value"] if p50 else None,
                            "ratio_p50_to_trio_rtt": (p50 / limit["trio_p50_us"]
                                                      if p50 else None),
                        }
                        target = _produce_target(role, mode, producers, instances)
                        if target is not None:
                            result["target"] = f"msgs_per_s >= {target}"
                            result["meets_target"] = (run["msgs_per_s"] >= target
                                                      and run["failures"] == 0)
                        result.update(common)
                        result["note"] = (
                            "latency: from the call to Producer.send/send_batch until it "
                            "returns (broker stored it" + (
                                " and the slave acked it" if role == "SYNC_MASTER" else "")
                            + "); with many tasks it includes waiting for the client's one "
                              "event loop; cpu_cores: CPU seconds / wall seconds per process"
                        )
                        yield result
            finally:
                nodes.stop(cluster.slave, cluster.master)
            shutil.rmtree(os.path.join(base, f"master-{label}"), ignore_errors=True)
            shutil.rmtree(os.path.join(base, f"slave-{label}"), ignore_errors=True)

        targets = []
        for mode, target in (("single", TARGET_SYNC_SINGLE_16), ("batch", TARGET_SYNC_BATCH_16)):
            run = runs["SYNC_MASTER", mode, 16, 1]
            targets.append({
                "result": f"SYNC_MASTER + slave, 16 producers (one client instance), "
                          f"1 KiB {'single sends' if mode == 'single' else 'batches of 32'}",
                "target": f"msgs_per_s >= {target}", "msgs_per_s": run["msgs_per_s"],
                "failures": run["failures"],
                "meets": run["msgs_per_s"] >= target and run["failures"] == 0,
                "with_4_instances_msgs_per_s": runs["SYNC_MASTER", mode, 16, 4]["msgs_per_s"],
            })
        yield {
            "bench": "produce.summary", **common, "targets": targets,
            "all_met": all(t["meets"] for t in targets),
            "msgs_per_s": {
                f"{role} {mode} {p}x{i}": runs[role, mode, p, i]["msgs_per_s"]
                for role in ROLES for mode in MODES for p, i in SHAPES
            },
            "p50_us": {
                f"{role} {mode} {p}x{i}": runs[role, mode, p, i]["latency_us"]["p50"]
                for role in ROLES for mode in MODES for p, i in SHAPES
            },
            "reference": REFERENCE,
            "failures": sum(r["failures"] for r in runs.values()),
            "total_seconds": time.perf_counter() - begun, "loadavg": os.getloadavg(),
        }
    finally:
        nodes.close()
        children.close()
        shutil.rmtree(base, ignore_errors=True)


def _produce_target(role: str, mode: str, producers: int, instances: int) -> int | None:
    if role != "SYNC_MASTER" or producers != 16 or instances != 1:
        return None
    return TARGET_SYNC_SINGLE_16 if mode == "single" else TARGET_SYNC_BATCH_16


# ---- consume -----------------------------------------------------------------------------------


async def _queue_offsets(instance, address: str, topic: str) -> dict[int, tuple[int, int]]:
    """(min, max) offset of every queue of ``topic`` at the broker ``address``."""
    offsets = {}
    for queue_id in range(QUEUES):
        found = []
        for code in (RequestCode.GET_MIN_OFFSET, RequestCode.GET_MAX_OFFSET):
            response = await instance.invoke(
                address, instance.request(code, {"topic": topic, "queueId": queue_id})
            )
            if response.code != ResponseCode.SUCCESS:
                raise MQBrokerError(response.code, response.remark, address)
            found.append(int(response.ext_fields["offset"]))
        offsets[queue_id] = (found[0], found[1])
    return offsets


async def _preload(cluster: _Cluster, total: int, timeout: float, label: str
                   ) -> tuple[dict, dict[int, tuple[int, int]]]:
    """``total`` 1 KiB messages in batches of 32, spread evenly over the 4 queues by 16
    tasks; then wait until the slave holds every queue to its end."""
    body = os.urandom(BODY_SIZE)
    batches_per_queue = -(-total // (QUEUES * BATCH))
    remaining = {q: batches_per_queue for q in range(QUEUES)}
    statuses: dict[str, int] = {}
    errors: list[str] = []
    ok = failed = 0
    async with open_client_instance(cluster.namesrv.addr) as client:
        async with open_producer(client, "BenchPreloadGroup") as producer:
            queues = [q for q in await producer.publish_queues(cluster.topic)]
            batch = [Message(cluster.topic, body, tags=TAGS) for _ in range(BATCH)]
            profiling = cluster.profiling()
            profiling.start(label)
            started = time.perf_counter()
            deadline = started + timeout

            async def task(index: int) -> None:
                nonlocal ok, failed
                queue = queues[index % len(queues)]
                while remaining[queue.queue_id] > 0 and time.perf_counter() < deadline:
                    remaining[queue.queue_id] -= 1
                    try:
                        result = await producer.send_batch(batch, queue=queue)
                    except MQError as exc:
                        remaining[queue.queue_id] += 1
                        failed += 1
                        _count(statuses, _error_key(exc))
                        if len(errors) < 3:
                            errors.append(str(exc))
                        continue
                    if result.send_status is SendStatus.SEND_OK:
                        ok += 1
                    else:
                        failed += 1
                        _count(statuses, result.send_status.name)

            async with trio.open_nursery() as nursery:
                for index in range(16):
                    nursery.start_soon(task, index)
            elapsed = time.perf_counter() - started
            profiling.stop()
        master = await _queue_offsets(client, cluster.master.addr, cluster.topic)
        waited = time.perf_counter()
        slave = {}
        with trio.move_on_after(timeout):
            while True:
                slave = await _queue_offsets(client, cluster.slave.addr, cluster.topic)
                if slave == master:
                    break
                await trio.sleep(0.05)
        slave_wait = time.perf_counter() - waited
    messages = ok * BATCH
    return {
        "messages": messages, "sends": ok, "seconds": elapsed,
        "msgs_per_s": messages / elapsed, "mb_per_s": messages * BODY_SIZE / elapsed / MB,
        "failures": failed, "failures_by_status": statuses or None,
        "errors_sample": errors or None,
        "queues": {str(q): {"min": lo, "max": hi} for q, (lo, hi) in master.items()},
        "slave_has_all": slave == master, "slave_wait_seconds": slave_wait,
    }, master


async def _consume_pull(cluster: _Cluster, plan: _Plan, source: str,
                        offsets: dict[int, tuple[int, int]], group: str, label: str) -> dict:
    """4 tasks, one per queue, pulling 32 at a time from each queue's first offset to its
    last, from the master or the slave; bounded by time."""
    address = cluster.master.addr if source == "master" else cluster.slave.addr
    broker_id = 0 if source == "master" else 1
    latencies: list[int] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    by_address: dict[str, int] = {}
    counts = {q: 0 for q in offsets}
    gaps = 0
    clock_ns = time.perf_counter_ns
    async with open_client_instance(cluster.namesrv.addr) as client:
        async with open_pull_consumer(client, group) as consumer:
            queues = await consumer.queues(cluster.topic)
            pin = consumer._pull_from  # suggestWhichBrokerId, per queue (a bench may look)

            async def drain(queue, stop_at: float, limit: int | None, record: bool) -> None:
                nonlocal gaps
                offset, end = offsets[queue.queue_id]
                if limit is not None:
                    end = min(end, offset + limit)
                while offset < end and time.perf_counter() < stop_at:
                    pin[queue] = broker_id
                    t0 = clock_ns()
                    try:
                        result = await consumer.pull(queue, offset, PULL_BATCH,
                                                     suspend_timeout=1.0, timeout=5.0)
                    except MQError as exc:
                        if record:
                            _count(statuses, _error_key(exc))
                            if len(errors) < 3:
                                errors.append(str(exc))
                        await trio.sleep(0.01)
                        continue
                    if not record:
                        offset = result.next_begin_offset
                        continue
                    latencies.append(clock_ns() - t0)
                    _count(by_address, result.broker_addr or "?")
                    messages = result.messages
                    if result.status is not PullStatus.FOUND or not messages:
                        _count(statuses, result.status.name)
                        if result.next_begin_offset == offset:
                            await trio.sleep(0.01)
                        offset = max(offset, result.next_begin_offset)
                        continue
                    n = len(messages)
                    if (messages[0].queue_offset != offset
                            or messages[-1].queue_offset != offset + n - 1
                            or len(messages[-1].body) != BODY_SIZE):
                        gaps += 1
                    counts[queue.queue_id] += n
                    offset = result.next_begin_offset

            # warm-up: a few pulls of every queue (connection, subscription, caches)
            warm_until = time.perf_counter() + plan.warmup_seconds
            async with trio.open_nursery() as nursery:
                for queue in queues:
                    nursery.start_soon(drain, queue, warm_until, 20 * PULL_BATCH, False)
            gc.collect()
            profiling = cluster.profiling()
            profiling.start(label)
            cpu = _CpuMeter(cluster.pids)
            started = time.perf_counter()
            stop_at = started + plan.consume_seconds
            async with trio.open_nursery() as nursery:
                for queue in queues:
                    nursery.start_soon(drain, queue, stop_at, None, True)
            elapsed = time.perf_counter() - started
            cores = cpu.cores()
            profiling.stop()
    messages = sum(counts.values())
    expected = sum(hi - lo for lo, hi in offsets.values())
    failures = sum(statuses.values()) + gaps
    return {
        "messages": messages, "pulls": len(latencies), "seconds": elapsed,
        "msgs_per_s": messages / elapsed, "mb_per_s": messages * BODY_SIZE / elapsed / MB,
        "pulls_per_s": len(latencies) / elapsed,
        "messages_per_pull": messages / len(latencies) if latencies else None,
        "latency_us": _latency_us(latencies),
        "failures": failures, "failures_by_status": statuses or None,
        "out_of_order_pulls": gaps, "errors_sample": errors or None,
        "complete": messages == expected, "expected_messages": expected,
        "bounded_by": "messages" if messages == expected else "time",
        "pulls_by_address": by_address, "pulled_from": address,
        "queues_pulled": len(queues), "cpu_cores": cores,
    }


async def _consume_stream(cluster: _Cluster, plan: _Plan, offsets: dict[int, tuple[int, int]],
                          group: str, label: str) -> dict:
    """The ``messages()`` stream over every queue from the first offset (one task)."""
    expected = sum(hi - lo for lo, hi in offsets.values())
    seen: dict[int, int] = {q: lo for q, (lo, hi) in offsets.items()}
    out_of_order = 0
    messages = 0
    async with open_client_instance(cluster.namesrv.addr) as client:
        async with open_pull_consumer(client, group) as consumer:
            await consumer.queues(cluster.topic)
            gc.collect()
            profiling = cluster.profiling()
            profiling.start(label)
            cpu = _CpuMeter(cluster.pids)
            started = time.perf_counter()
            stop_at = started + plan.consume_seconds
            clock = time.perf_counter
            async with consumer.messages(cluster.topic, from_where="first",
                                         batch_size=PULL_BATCH, suspend_timeout=1.0) as stream:
                async for message in stream:
                    messages += 1
                    queue_id = message.queue_id
                    if message.queue_offset != seen[queue_id]:
                        out_of_order += 1
                    seen[queue_id] = message.queue_offset + 1
                    if messages >= expected or (messages & 63 == 0 and clock() >= stop_at):
                        break
            elapsed = time.perf_counter() - started
            cores = cpu.cores()
            profiling.stop()
    return {
        "messages": messages, "seconds": elapsed, "msgs_per_s": messages / elapsed,
        "mb_per_s": messages * BODY_SIZE / elapsed / MB,
        "failures": out_of_order, "failures_by_status": (
            {"OUT_OF_ORDER": out_of_order} if out_of_order else None),
        "complete": messages == expected, "expected_messages": expected,
        "bounded_by": "messages" if messages == expected else "time",
        "latency_us": None, "cpu_cores": cores,
    }


def run_consume_benchmarks(directory: str | None = None, *, quick: bool = False
                           ) -> Iterator[dict]:
    """Run the consume benchmarks in a scratch directory (inside ``directory`` if given) and
    yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error or Ctrl-C."""
    yield from _tidied(_consume(directory, quick))


def _consume(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = _Plan(quick)
    base, logs = _scratch(directory, "consume")
    nodes = _Nodes(logs)
    children = _Children(logs)
    begun = time.perf_counter()
    common = {"backend": _backend.native_backend, "quick": quick}
    try:
        plan.fit_disk(shutil.disk_usage(base).free)
        yield {
            "bench": "consume.config", **common, "scratch_dir": base,
            "body_size": BODY_SIZE, "queues": QUEUES, "pull_batch": PULL_BATCH,
            "preload_messages": plan.preload_messages, "run_seconds": plan.consume_seconds,
            "passes": plan.passes,
            "sources": list(SOURCES), "segment_size": plan.segment_size,
            "scaled_for_disk": plan.scaled_for_disk, "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(), "profiling": os.environ.get(PROFILE_ENV) or None,
            "note": "name server, SYNC_MASTER and SLAVE are child processes; consumers are "
                    "trio tasks in this process",
        }
        namesrv = nodes.start("namesrv", {"kind": "namesrv"}, plan.start_timeout)
        cluster, ready = _start_cluster(nodes, base, plan, "SYNC_MASTER", namesrv, "sync",
                                        "BenchConsume")
        yield {"bench": "consume.cluster", **common, **cluster.describe(), **ready,
               "flush": "ASYNC_FLUSH", "queues": QUEUES}
        preload, offsets = _trio_run(_preload, cluster, plan.preload_messages,
                                     max(60.0, plan.preload_messages / 5000), "consume-preload")
        yield {"bench": "consume.preload", **common, "master_role": "SYNC_MASTER", **preload,
               "note": "batches of 32 x 1 KiB to explicit queues, 16 tasks on one client "
                       "instance; then the slave's consume queues are awaited"}
        limit, limit_results = _measure_rtt(children, plan, common)
        yield from limit_results

        runs = {}
        for source in SOURCES:
            cluster.check()
            run = _best_pass([
                _trio_run(_consume_pull, cluster, plan, source, offsets,
                          f"BenchConsumer-{source}-{index}", f"consume-pull-{source}-pass{index}")
                for index in range(plan.passes)
            ])
            runs["pull", source] = run
            p50 = run["latency_us"]["p50"]
            result = {
                "bench": "consume.pull", "api": "pull", "source": source,
                "master_role": "SYNC_MASTER", "queues": QUEUES, "tasks": QUEUES,
                "pull_batch": PULL_BATCH, "body_size": BODY_SIZE, **run, "limit": limit,
                "ratio_p50_to_rtt": p50 / limit["value"] if p50 else None,
                "ratio_p50_to_trio_rtt": p50 / limit["trio_p50_us"] if p50 else None,
            }
            if source == "master":
                result["target"] = f"msgs_per_s >= {TARGET_CONSUME}"
                result["meets_target"] = (run["msgs_per_s"] >= TARGET_CONSUME
                                          and run["failures"] == 0)
            result.update(common)
            result["note"] = (
                "one task per queue, PullConsumer.pull of 32 from the queue's first offset "
                "until its last or the time is up; latency per pull; "
                + ("pulls go to the master" if source == "master" else
                   "pulls pinned to the slave (suggestWhichBrokerId=1, as after a master "
                   "failure)")
            )
            yield result
        cluster.check()
        run = _best_pass([
            _trio_run(_consume_stream, cluster, plan, offsets, f"BenchConsumer-stream-{index}",
                      f"consume-stream-master-pass{index}")
            for index in range(plan.passes)
        ])
        runs["stream", "master"] = run
        yield {"bench": "consume.stream", "api": "messages()", "source": "master",
               "master_role": "SYNC_MASTER", "queues": QUEUES, "tasks": 1,
               "batch_size": PULL_BATCH, "body_size": BODY_SIZE, **run, "limit": limit,
               **common,
               "note": "PullConsumer.messages(topic, from_where='first'): one task iterating "
                       "a stream that pulls all 4 queues concurrently, 32 per pull"}

        master = runs["pull", "master"]
        slave = runs["pull", "slave"]
        targets = [{
            "result": "consume, pull of 32 over 4 queues concurrently, from the master",
            "target": f"msgs_per_s >= {TARGET_CONSUME}", "msgs_per_s": master["msgs_per_s"],
            "failures": master["failures"],
            "meets": master["msgs_per_s"] >= TARGET_CONSUME and master["failures"] == 0,
        }]
        yield {
            "bench": "consume.summary", **common, "targets": targets,
            "all_met": all(t["meets"] for t in targets),
            "also": [{
                "result": "consume, pull of 32 over 4 queues concurrently, from the slave",
                "target": f"msgs_per_s >= {TARGET_CONSUME}",
                "msgs_per_s": slave["msgs_per_s"], "failures": slave["failures"],
                "meets": slave["msgs_per_s"] >= TARGET_CONSUME and slave["failures"] == 0,
            }],
            "msgs_per_s": {f"{api} {source}": r["msgs_per_s"]
                           for (api, source), r in runs.items()},
            "preload_msgs_per_s": preload["msgs_per_s"],
            "failures": sum(r["failures"] for r in runs.values()) + preload["failures"],
            "total_seconds": time.perf_counter() - begun, "loadavg": os.getloadavg(),
        }
    finally:
        nodes.close()
        children.close()
        shutil.rmtree(base, ignore_errors=True)


# ---- child entry point ---------------------------------------------------------------------------


def _child_main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "node":
        print("usage: python -m trio_ha.bench.clients node JSON", file=sys.stderr)
        return 2
    _node_main(json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
