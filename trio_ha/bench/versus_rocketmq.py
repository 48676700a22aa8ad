"""``trio-ha bench versus-rocketmq``: the same Java load against the real RocketMQ and against us.

Our other benchmarks compare us with the machine's limits; this one compares us with the
system a user would otherwise run. One load generator — ``trioha.interop.Load``, our own
program on the real 4.9.7 Java client (``interop/java``) — runs with identical settings against
a real cluster (name server, SYNC_MASTER, SLAVE) and against ours (``ProcessCluster``: name
server, SYNC_MASTER, SLAVE) on the same machine in the same run, for SYNC_FLUSH and
ASYNC_FLUSH. Both sides use 128 MiB commitlog segments (RocketMQ's 1 GiB default would only cost
disk) and everything else at its default.

Phases, each after a warm-up of the client (JIT, connections, routes) and once the slave is
attached (a send answers SEND_OK):

* ``send_1_thread`` / ``send_16_threads``: 1 KiB single sends, each timed;
* ``batch_32``: batches of 32 × 1 KiB from 16 threads (rates count messages, not batches);
* ``pull_master``: a lite pull consumer (32 per pull) reads everything sent, from the master;
* ``pull_slave``: the master is stopped and a fresh group reads it all from the slave — the
  failover read path, the only way a 4.x client reads from a slave by default.

Each row prints our rate next to RocketMQ's with the ratio (ours / theirs, above 1 is better
for us), send latency p50/p99, and CPU microseconds per message of the broker, the slave and
the client (``/proc/<pid>/stat`` over the timed part, which the load generator marks with a
``start`` line; the client reports its own JVM's CPU time). Counts and times are bounded in
every phase; on a shared machine the figures are only as quiet as the machine.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from ..testing import ClusterConfig, ProcessCluster, free_broker_port
from ..testing.rocketmq import JavaProcess, RocketMQ, program_lines
from .harness import WARM_SEGMENTS, common_fields, cpu_seconds, scratch_directory, tidied

__all__ = ["VersusPlan", "format_table", "run_versus_benchmarks"]

#: RocketMQ's brokers get what its own scripts give them, scaled to this machine (G1, a heap
#: they do not have to fight for); the load generator runs with the full JIT.
BROKER_JVM = ("-Xms1g", "-Xmx1g", "-XX:MaxDirectMemorySize=1g", "-XX:+UseG1GC",
              "-XX:-OmitStackTraceInFastThrow",
              "-Drocketmq.broker.diskSpaceWarningLevelRatio=0.98",
              "-Drocketmq.broker.diskSpaceCleanForciblyRatio=0.97")
LOAD_JVM = ("-Xms512m", "-Xmx512m", "-XX:+UseG1GC")

LOAD = "trioha.interop.Load"
CLIENT = "trioha.interop.Client"
SEGMENT = 128 << 20
FLUSH_TYPES = ("SYNC_FLUSH", "ASYNC_FLUSH")
PHASES = ("send_1_thread", "send_16_threads", "batch_32", "pull_master", "pull_slave")


@attrs.frozen
class VersusPlan:
    """How much each phase sends (messages) and how long any may take."""

    quick: bool
    warmup: int
    send_1: int
    send_16: int
    batch_32: int
    max_seconds: int

    @classmethod
    def make(cls, quick: bool) -> VersusPlan:
        if quick:
            return cls(True, warmup=100, send_1=100, send_16=800, batch_32=3_200,
                       max_seconds=40)
        return cls(False, warmup=3_000, send_1=3_000, send_16=40_000, batch_32=128_000,
                   max_seconds=90)


@attrs.frozen
class PhaseResult:
    messages: int
    seconds: float
    p50_us: float | None
    p99_us: float | None
    errors: int
    statuses: dict
    #: CPU microseconds per message: broker, slave, client
    cpu_us: dict

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0


@attrs.define(eq=False)
class Side:
    """One running cluster: where its name server is, its broker and slave pids, and how to
    stop its master (for the slave read)."""

    name: str
    namesrv: str
    pids: dict[str, int]
    stop_master: Callable[[], object]


@contextlib.contextmanager
def rocketmq_cluster(peer: RocketMQ, run: Path, flush: str) -> Iterator[Side]:
    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    started: list[JavaProcess] = []
    try:
        started.append(peer.start_namesrv(run / "ns", namesrv_port))
        common = {"brokerClusterName": "VersusCluster", "brokerName": "broker-a",
                  "namesrvAddr": namesrv_addr, "flushDiskType": flush,
                  "mappedFileSizeCommitLog": SEGMENT, "maxHashSlotNum": 100_000,
                  "maxIndexNum": 400_000}
        master = peer.start_broker(run / "master", {
            **common, "brokerId": 0, "brokerRole": "SYNC_MASTER",
            "listenPort": free_broker_port()}, name="master", jvm=BROKER_JVM)
        started.append(master)
        slave = peer.start_broker(run / "slave", {
            **common, "brokerId": 1, "brokerRole": "SLAVE",
            "listenPort": free_broker_port()}, name="slave", jvm=BROKER_JVM)
        started.append(slave)
        yield Side("rocketmq", namesrv_addr, {"broker": master.pid, "slave": slave.pid},
                   master.stop)
    finally:
        # Nothing of the run is kept: no need to wait out their clean shutdown (seconds each).
        for process in reversed(started):
            process.kill()


@contextlib.contextmanager
def trio_ha_cluster(run: Path, flush: str) -> Iterator[Side]:
    config = ClusterConfig(data_dir=str(run / "ours"), flush_disk_type=flush,
                           properties={"mappedFileSizeCommitLog": str(SEGMENT),
                                       "warmMapedFileEnable": str(WARM_SEGMENTS).lower()})
    with ProcessCluster.start(config) as cluster:
        yield Side("trio_ha", cluster.namesrv_addr,
                   {"broker": cluster.master.pid, "slave": cluster.slave.pid},
                   lambda: cluster.stop(cluster.master))


def _wait_attached(peer: RocketMQ, run: Path, side: Side, topic: str, timeout: float) -> None:
    """Until a send answers SEND_OK: the slave is attached (a 4.x slave's first report comes
    about 5 s after it connects)."""
    deadline = time.monotonic() + timeout
    while True:
        out = peer.run_program(run / "probe", CLIENT, "produce", "--namesrv", side.namesrv,
                               "--topic", topic, "--count", 1, check=False)
        lines = program_lines(out)
        if lines and lines[0].get("status") == "SEND_OK":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{side.name}: the slave did not attach within {timeout:g} s")
        time.sleep(1)


def _measured(peer: RocketMQ, run: Path, side: Side, args: list[object],
              result_phase: str, plan: VersusPlan) -> PhaseResult:
    """Run the load generator; CPU of the brokers between its ``start`` and result lines."""
    program = peer.start_program(run / "load", LOAD, *args, name="load", jvm=LOAD_JVM,
                                 timeout=plan.max_seconds + 60)
    try:
        program.wait_for_line('"phase":"start"', timeout=plan.max_seconds + 60)
        before = {name: cpu_seconds(pid) for name, pid in side.pids.items()}
        program.wait_for_line(f'"phase":"{result_phase}"', timeout=plan.max_seconds + 60)
        after = {name: cpu_seconds(pid) for name, pid in side.pids.items()}
        program.wait(30)
    finally:
        if program.poll() is None:
            program.stop(timeout=5)
    [line] = [x for x in program_lines(program.output()) if x.get("phase") == result_phase]
    messages = int(line["messages"])
    per = 1e6 / messages if messages else 0.0
    cpu = {}
    for name in side.pids:
        start, end = before[name], after[name]
        if start is not None and end is not None:
            cpu[name] = (end - start) * per
    cpu["client"] = float(line.get("cpu_seconds", 0.0)) * per
    return PhaseResult(messages, float(line["seconds"]), line.get("p50_us"), line.get("p99_us"),
                       int(line.get("errors", 0)), dict(line.get("statuses", {})), cpu)


def _run_side(peer: RocketMQ, run: Path, side: Side, plan: VersusPlan) -> dict[str, PhaseResult]:
    topic = "VersusTopic"
    _wait_attached(peer, run, side, topic, timeout=60)
    common = ["--namesrv", side.namesrv, "--topic", topic, "--max-seconds", plan.max_seconds]
    results = {
        "send_1_thread": _measured(peer, run, side, [
            "send", *common, "--threads", 1, "--count", plan.send_1, "--warmup", plan.warmup],
            "send", plan),
        "send_16_threads": _measured(peer, run, side, [
            "send", *common, "--threads", 16, "--count", plan.send_16, "--warmup", plan.warmup],
            "send", plan),
        "batch_32": _measured(peer, run, side, [
            "send", *common, "--threads", 16, "--count", plan.batch_32, "--batch", 32,
            "--warmup", plan.warmup], "send", plan),
    }
    # Everything sent so far, warm-ups and probes included, is read back from each node.
    stored = sum(r.messages for r in results.values())
    results["pull_master"] = _measured(peer, run, side, [
        "pull", *common, "--group", "versus_master", "--expect", stored], "pull", plan)
    side.stop_master()
    side.pids.pop("broker")
    results["pull_slave"] = _measured(peer, run, side, [
        "pull", *common, "--group", "versus_slave", "--expect", stored], "pull", plan)
    return results


def _row(name: str, ours: PhaseResult, theirs: PhaseResult) -> dict:
    return {
        "name": name, "unit": "msg/s",
        "ours": ours.rate, "theirs": theirs.rate,
        "ratio": ours.rate / theirs.rate if theirs.rate else None,
        "ours_p50_us": ours.p50_us, "theirs_p50_us": theirs.p50_us,
        "ours_p99_us": ours.p99_us, "theirs_p99_us": theirs.p99_us,
        "ours_cpu_us_per_msg": ours.cpu_us, "theirs_cpu_us_per_msg": theirs.cpu_us,
        "ours_messages": ours.messages, "theirs_messages": theirs.messages,
        "ours_errors": ours.errors, "theirs_errors": theirs.errors,
        "ours_statuses": ours.statuses, "theirs_statuses": theirs.statuses,
    }


def _versus(directory: str | None, plan: VersusPlan,
            flush_types: tuple[str, ...]) -> Iterator[dict]:
    peer = RocketMQ.fetch()
    peer.compile_programs()
    with scratch_directory(directory, "versus") as scratch:
        yield {"name": "versus.config", **common_fields(plan.quick), "rocketmq": peer.version,
               "flush_types": list(flush_types), "segment_bytes": SEGMENT,
               "cpus": os.cpu_count(), "loadavg": os.getloadavg(), **attrs.asdict(plan)}
        for flush in flush_types:
            run = Path(scratch.base) / flush
            with rocketmq_cluster(peer, run / "rocketmq", flush) as side:
                theirs = _run_side(peer, run / "rocketmq", side, plan)
            with trio_ha_cluster(run / "trio_ha", flush) as side:
                ours = _run_side(peer, run / "trio_ha", side, plan)
            for phase in PHASES:
                yield _row(f"versus.{phase}.{flush}", ours[phase], theirs[phase])


def run_versus_benchmarks(directory: str | None, *, quick: bool = False,
                          flush_types: tuple[str, ...] = FLUSH_TYPES) -> Iterator[dict]:
    """The rows (see the module's docstring), the first being the run's configuration."""
    return tidied(_versus(directory, VersusPlan.make(quick), flush_types))


def format_table(rows: list[dict]) -> str:
    """The rows as a text table, ours next to RocketMQ's."""
    def num(value: object, fmt: str = "{:,.0f}") -> str:
        return "-" if value is None else fmt.format(value)

    def cpu(values: dict) -> str:
        return "/".join(num(values.get(k)) for k in ("broker", "slave", "client"))

    head = (f"{'row':<30} {'ours msg/s':>11} {'theirs':>11} {'ratio':>6}  "
            f"{'p50 us o/t':>15} {'p99 us o/t':>17}  {'cpu us/msg b/s/c ours':>22}  "
            f"{'theirs':>16}")
    lines = [head, "-" * len(head)]
    for row in rows:
        if not row["name"].startswith("versus.") or row["name"] == "versus.config":
            continue
        lines.append(
            f"{row['name'][7:]:<30} {num(row['ours']):>11} {num(row['theirs']):>11} "
            f"{num(row['ratio'], '{:.2f}'):>6}  "
            f"{num(row['ours_p50_us']) + '/' + num(row['theirs_p50_us']):>15} "
            f"{num(row['ours_p99_us']) + '/' + num(row['theirs_p99_us']):>17}  "
            f"{cpu(row['ours_cpu_us_per_msg']):>22}  {cpu(row['theirs_cpu_us_per_msg']):>16}")
    return "\n".join(lines)
