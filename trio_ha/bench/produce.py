"""``trio-ha bench produce``: the client library's sends to a real cluster, next to the
loopback round trip measured in the same run.

What runs (one JSON object per result, in this order):

1. ``produce.config``;
2. for ASYNC_MASTER and then SYNC_MASTER (both ASYNC_FLUSH, both with a SLAVE): the cluster
   starts, three child processes (:class:`trio_ha.bench.clients.BenchCluster`), the master's
   slave connection is awaited and a topic of 4 queues is created (``produce.cluster``); the
   loopback round trip is measured (``limit.loopback_rtt``: blocking sockets between this
   process and a child; ``limit.loopback_rtt_trio``: trio on both sides); then
   ``produce.send`` for 1 KiB bodies, single ``send`` and ``send_batch`` of 32, with 1
   producer task, 16 tasks on one client instance, 16 tasks on 4 instances and 32 tasks on
   one instance: a warm-up,
   then a run bounded by time and by messages; every send timed; each in ``passes`` passes
   (3; quick: 1), the median pass reported with every pass's rate and their spread, and the
   CPU each process spent per message (``cpu_us_per_msg``);
3. ``produce.summary``: the send targets of docs/performance.md (SYNC_MASTER with a slave:
   16 producers on one instance, single sends and batches of 32; CPU per single send of
   master, slave and client; one producer's p50 next to the trio round trip), met or not,
   and the reference figures.

N concurrent producers are N trio tasks sharing one client instance (one connection to the
master), as a Java application's threads share one ``MQClientInstance``; the 16-task runs are
repeated with 4 client instances (4 connections) beside it.

Why 32 tasks too: 16 producers that each wait for their answer are a closed loop of 16 sends
in flight, and it runs in rounds — the client sends 16, the master stores 16 and pushes them
to the slave in one frame, the slave acks them at once, the master answers 16, the client
sends the next 16 — so each process waits for the others part of every round and the two
cores are not both busy (about 1.3 of 2, measured with 16 single sends here). Handing the
work on in smaller pieces, so that the processes overlap, cost as much CPU as the overlap
gained when tried on this machine (each wake-up is expensive). 32 tasks keep more in flight:
their rate is what the same code does once the loop, not the CPU per message, stops being
the bound. The summary gives it beside each 16-producer target; the targets stay at 16.
``docs/performance.md`` has the measured split of a send's CPU and what was tried.

Each result carries ``failures`` (by status: send statuses other than SEND_OK, exceptions by
class and broker code), latency percentiles in microseconds, ``cpu_cores`` (CPU seconds / wall
seconds of this process and of every node during the run: on a 2-core machine the three
processes share the cores; ``others`` is what the rest of the machine used meanwhile, i.e.
how busy a shared machine was) and the round-trip limit. Rates count acknowledged messages
only (a batch of 32 counts 32); ``mb_per_s`` is decimal MB/s of bodies. Benchmarks report
figures; they never assert.
"""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import time
from collections.abc import Iterator

import trio

from ..client import Message, MQError, SendStatus, open_admin, open_client_instance, open_producer
from .clients import (
    BATCH,
    BODY_SIZE,
    MODES,
    PROFILE_ENV,
    QUEUES,
    SHAPES,
    TAGS,
    BenchCluster,
    ClientsPlan,
    error_key,
    measure_rtt,
    median_pass,
)
from .harness import (
    MB,
    CpuMeter,
    RunState,
    common_fields,
    config_fields,
    fit_plan,
    latency_us,
    scratch_directory,
    tidied,
    trio_run,
)
from .loopback import Children

ROLES = ("ASYNC_MASTER", "SYNC_MASTER")
PRODUCER_GROUP = "BenchProducerGroup"

#: the send targets: SYNC_MASTER + slave, 16 producers on one client instance
TARGET_SYNC_SINGLE_16 = 15_000
TARGET_SYNC_BATCH_16 = 150_000
#: ... CPU per single send at 16 producers, microseconds, by process
TARGET_CPU_US_PER_SEND = {"master": 60, "slave": 25, "client": 60}
#: ... one producer's single send, p50 microseconds
TARGET_SYNC_SINGLE_1_P50_US = 350

#: the targets' reference figures for scale (same machine class; not measured here)
REFERENCE = {
    "redis_replica_xadd_wait_16_c_clients_per_s": 30_700,
    "redis_replica_xadd_wait_16_redis_py_clients_per_s": 7_200,
    "nats_jetstream_r3_acked_publish_16_c_clients_per_s": 7_900,
}


def run_produce_benchmarks(directory: str | None = None, *, quick: bool = False
                           ) -> Iterator[dict]:
    """Run the produce benchmarks in a scratch directory (inside ``directory`` if given) and
    yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error or Ctrl-C."""
    yield from tidied(_produce(directory, quick))


def _produce(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = ClientsPlan.make(quick)
    begun = time.perf_counter()
    common = common_fields(quick)
    with scratch_directory(directory, "produce") as scratch, Children(scratch.logs) as children:
        fit_plan(plan, scratch)
        yield {
            "bench": "produce.config", **config_fields(plan, scratch),
            "body_size": BODY_SIZE, "batch": BATCH, "queues": QUEUES,
            "master_roles": list(ROLES), "modes": list(MODES),
            "shapes": [{"producers": p, "client_instances": i} for p, i in SHAPES],
            "run_seconds": plan.run_seconds, "warmup_seconds": plan.warmup_seconds,
            "passes": plan.passes,
            "max_messages_per_run": plan.max_messages, "segment_size": plan.segment_size,
            "profiling": os.environ.get(PROFILE_ENV) or None,
            "note": "name server, master and slave are child processes (python -m "
                    "trio_ha.testing.node), a cluster of its own for each master role; "
                    "producers are trio tasks in this process; all share this machine's "
                    "cores (loadavg says how busy it was)",
        }
        runs: dict[tuple[str, str, int, int], dict] = {}
        limits: dict[str, dict] = {}
        for role in ROLES:
            label = "sync" if role == "SYNC_MASTER" else "async"
            root = os.path.join(scratch.base, label)
            cluster, ready = BenchCluster.start(root, os.path.join(scratch.logs, label), plan,
                                                role, label, f"BenchProduce{label.capitalize()}")
            try:
                yield {"bench": "produce.cluster", **common, **cluster.describe(), **ready,
                       "flush": "ASYNC_FLUSH", "queues": QUEUES}
                limit, limit_results = measure_rtt(children, plan, common)
                limits[role] = limit
                yield from limit_results
                for mode in MODES:
                    for producers, instances in SHAPES:
                        name = f"{label}-{mode}-{producers}x{instances}"
                        cluster.check()
                        run = median_pass([
                            trio_run(_produce_run, cluster, plan, mode, producers, instances,
                                     f"{name}-pass{index}")
                            for index in range(plan.passes)
                        ])
                        runs[role, mode, producers, instances] = run
                        p50 = run["latency_us"]["p50"]
                        run["cpu_us_per_msg"] = {
                            process: cores * run["seconds"] / run["messages"] * 1e6
                            for process, cores in run["cpu_cores"].items()
                            if cores is not None and run["messages"]
                            and process in ("client", "master", "slave")}
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
                cluster.close()
            shutil.rmtree(root, ignore_errors=True)

        targets = []
        for mode, target in (("single", TARGET_SYNC_SINGLE_16), ("batch", TARGET_SYNC_BATCH_16)):
            run = runs["SYNC_MASTER", mode, 16, 1]
            targets.append({
                "result": f"SYNC_MASTER + slave, 16 producers (one client instance), "
                          f"1 KiB {'single sends' if mode == 'single' else 'batches of 32'}",
                "target": f"msgs_per_s >= {target}", "msgs_per_s": run["msgs_per_s"],
                "spread_msgs_per_s": run["spread_msgs_per_s"],
                "failures": run["failures"],
                "meets": run["msgs_per_s"] >= target and run["failures"] == 0,
                "with_4_instances_msgs_per_s": runs["SYNC_MASTER", mode, 16, 4]["msgs_per_s"],
                "with_32_producers_msgs_per_s": runs["SYNC_MASTER", mode, 32, 1]["msgs_per_s"],
            })
        single_16 = runs["SYNC_MASTER", "single", 16, 1]
        for name, target in TARGET_CPU_US_PER_SEND.items():
            used = single_16["cpu_us_per_msg"].get(name)
            targets.append({
                "result": f"CPU of the {name} per single send, SYNC_MASTER + slave, "
                          "16 producers", "target": f"cpu_us_per_msg <= {target}",
                "cpu_us_per_msg": used, "meets": used is not None and used <= target,
                # a trio process's CPU per wake-up (read and write) on this machine: a node
                # woken once per send could not use less
                "limit_trio_cpu_us_per_wake": limits["SYNC_MASTER"]["trio_cpu_us_per_wake"],
            })
        single_1 = runs["SYNC_MASTER", "single", 1, 1]
        p50 = single_1["latency_us"]["p50"]
        targets.append({
            "result": "SYNC_MASTER + slave, 1 producer, 1 KiB single send latency",
            "target": f"p50_us <= {TARGET_SYNC_SINGLE_1_P50_US}", "p50_us": p50,
            "limit_trio_rtt_p50_us": limits["SYNC_MASTER"]["trio_p50_us"],
            "limit_trio_cpu_us_per_wake": limits["SYNC_MASTER"]["trio_cpu_us_per_wake"],
            "meets": p50 is not None and p50 <= TARGET_SYNC_SINGLE_1_P50_US,
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


def _produce_target(role: str, mode: str, producers: int, instances: int) -> int | None:
    if role != "SYNC_MASTER" or producers != 16 or instances != 1:
        return None
    return TARGET_SYNC_SINGLE_16 if mode == "single" else TARGET_SYNC_BATCH_16


# ---- one run ------------------------------------------------------------------------------------


async def _drive_sends(sends: list, tasks: int, state: RunState, measure: bool) -> None:
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
                state.fail(error_key(exc), str(exc))
                continue
            if measure:
                latencies.append(clock_ns() - t0)
            if result.send_status is ok_status:
                state.ok += 1
            else:
                state.fail(result.send_status.name)

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(task, index)


async def _produce_run(cluster: BenchCluster, plan: ClientsPlan, mode: str, producers: int,
                       instances: int, label: str) -> dict:
    body = os.urandom(BODY_SIZE)
    per_send = 1 if mode == "single" else BATCH
    async with contextlib.AsyncExitStack() as stack:
        sends = []
        clients = []
        for _ in range(instances):
            client = await stack.enter_async_context(open_client_instance(cluster.namesrv_addr))
            clients.append(client)
            producer = await stack.enter_async_context(open_producer(client, PRODUCER_GROUP))
            if mode == "single":
                message = Message(cluster.topic, body, tags=TAGS)
                sends.append(lambda p=producer, m=message: p.send(m))
            else:
                batch = [Message(cluster.topic, body, tags=TAGS) for _ in range(BATCH)]
                sends.append(lambda p=producer, b=batch: p.send_batch(b))
        admin = await stack.enter_async_context(open_admin(clients[0]))

        # warm-up on the same path: routes, connections, heartbeats, the broker's caches
        warm = RunState(plan.max_messages // per_send, time.perf_counter() + plan.warmup_seconds)
        await _drive_sends(sends, producers, warm, False)
        await cluster.wait_slave(admin, 30)
        end_before, _ = await cluster.replication_state(admin)

        gc.collect()
        profiling = cluster.profiling()
        profiling.start(label)
        cpu = CpuMeter(cluster.pids)
        state = RunState(max(1, plan.max_messages // per_send), 0.0)
        started = time.perf_counter()
        state.deadline = started + plan.run_seconds
        await _drive_sends(sends, producers, state, True)
        elapsed = time.perf_counter() - started
        cores = cpu.cores()
        profiling.stop()
        replication = await cluster.wait_slave(admin, 30)
        end_after, _ = await cluster.replication_state(admin)
    messages = state.ok * per_send
    return {
        "messages": messages,
        "sends": state.ok,
        "seconds": elapsed,
        "msgs_per_s": messages / elapsed,
        "sends_per_s": state.ok / elapsed,
        "mb_per_s": messages * BODY_SIZE / elapsed / MB,
        "record_bytes": end_after - end_before if end_after >= end_before else None,
        "latency_us": latency_us(state.latencies),
        "failures": state.failed,
        "failures_by_status": state.statuses or None,
        "errors_sample": state.errors or None,
        "bounded_by": "messages" if state.remaining <= 0 else "time",
        "cpu_cores": cores,
        **replication,
        "warmup_sends": warm.ok, "warmup_failures": warm.failed,
    }
