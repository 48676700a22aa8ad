"""``trio-ha bench consume``: the client library's pulls from a real cluster, next to the
loopback round trip measured in the same run.

What runs (one JSON object per result, in this order): ``consume.config``; a SYNC_MASTER +
SLAVE cluster, three child processes (:class:`trio_ha.bench.clients.BenchCluster`,
``consume.cluster``); a topic of 4 queues preloaded with N messages (``consume.preload``:
batches of 32, 16 tasks) and the slave waited for; the loopback round trips; then
``consume.pull``: 4 tasks, one per queue, ``PullConsumer.pull`` of 32 from the first offset to
the last, from the master and from the slave (the consumer's ``suggestWhichBrokerId`` pinned
to the slave's id, as when a master is gone); and ``consume.stream``, the ``messages()`` stream
(the high-level API, one task) from the master; every run bounded by time and by N, in passes
(each from the first offset again), the median pass reported with every pass's rate and their
spread; then ``consume.summary``.

Each result carries ``failures`` (pull statuses other than FOUND, exceptions by class and
broker code, pulls that skipped or repeated an offset), latency percentiles per pull in
microseconds, ``cpu_cores`` per process and the round-trip limit. Benchmarks report figures;
they never assert.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Iterator

import trio

from ..client import (
    Message,
    MQBrokerError,
    MQError,
    PullStatus,
    SendStatus,
    open_client_instance,
    open_producer,
    open_pull_consumer,
)
from ..wire.remoting import RequestCode, ResponseCode
from .clients import (
    BATCH,
    BODY_SIZE,
    PROFILE_ENV,
    PULL_BATCH,
    QUEUES,
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
    common_fields,
    config_fields,
    count,
    fit_plan,
    latency_us,
    scratch_directory,
    tidied,
    trio_run,
)
from .loopback import Children

SOURCES = ("master", "slave")
#: the pull target (docs/performance.md), from the master and from the slave
TARGET_CONSUME = 200_000


def run_consume_benchmarks(directory: str | None = None, *, quick: bool = False
                           ) -> Iterator[dict]:
    """Run the consume benchmarks in a scratch directory (inside ``directory`` if given) and
    yield one dict per result (floats to 5 significant digits). The scratch directory and
    every child process are gone at the end, also on error or Ctrl-C."""
    yield from tidied(_consume(directory, quick))


def _consume(directory: str | None, quick: bool) -> Iterator[dict]:
    plan = ClientsPlan.make(quick)
    begun = time.perf_counter()
    common = common_fields(quick)
    with scratch_directory(directory, "consume") as scratch, Children(scratch.logs) as children:
        fit_plan(plan, scratch)
        yield {
            "bench": "consume.config", **config_fields(plan, scratch),
            "body_size": BODY_SIZE, "queues": QUEUES, "pull_batch": PULL_BATCH,
            "preload_messages": plan.preload_messages, "run_seconds": plan.consume_seconds,
            "passes": plan.passes,
            "sources": list(SOURCES), "segment_size": plan.segment_size,
            "profiling": os.environ.get(PROFILE_ENV) or None,
            "note": "name server, SYNC_MASTER and SLAVE are child processes (python -m "
                    "trio_ha.testing.node); consumers are trio tasks in this process",
        }
        cluster, ready = BenchCluster.start(os.path.join(scratch.base, "sync"), scratch.logs,
                                            plan, "SYNC_MASTER", "sync", "BenchConsume")
        try:
            yield from _consume_runs(cluster, ready, plan, children, common, begun)
        finally:
            cluster.close()


def _consume_runs(cluster: BenchCluster, ready: dict, plan: ClientsPlan, children: Children,
                  common: dict, begun: float) -> Iterator[dict]:
    yield {"bench": "consume.cluster", **common, **cluster.describe(), **ready,
           "flush": "ASYNC_FLUSH", "queues": QUEUES}
    preload, offsets = trio_run(_preload, cluster, plan.preload_messages,
                                max(60.0, plan.preload_messages / 5000), "consume-preload")
    yield {"bench": "consume.preload", **common, "master_role": "SYNC_MASTER", **preload,
           "note": "batches of 32 x 1 KiB to explicit queues, 16 tasks on one client "
                   "instance; then the slave's consume queues are awaited"}
    limit, limit_results = measure_rtt(children, plan, common)
    yield from limit_results

    runs = {}
    for source in SOURCES:
        cluster.check()
        run = median_pass([
            trio_run(_consume_pull, cluster, plan, source, offsets,
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
    run = median_pass([
        trio_run(_consume_stream, cluster, plan, offsets, f"BenchConsumer-stream-{index}",
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


# ---- the runs ------------------------------------------------------------------------------------


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


async def _preload(cluster: BenchCluster, total: int, timeout: float, label: str
                   ) -> tuple[dict, dict[int, tuple[int, int]]]:
    """``total`` 1 KiB messages in batches of 32, spread evenly over the 4 queues by 16
    tasks; then wait until the slave holds every queue to its end."""
    body = os.urandom(BODY_SIZE)
    batches_per_queue = -(-total // (QUEUES * BATCH))
    remaining = dict.fromkeys(range(QUEUES), batches_per_queue)
    statuses: dict[str, int] = {}
    errors: list[str] = []
    ok = failed = 0
    async with open_client_instance(cluster.namesrv_addr) as client:
        async with open_producer(client, "BenchPreloadGroup") as producer:
            queues = list(await producer.publish_queues(cluster.topic))
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
                        count(statuses, error_key(exc))
                        if len(errors) < 3:
                            errors.append(str(exc))
                        continue
                    if result.send_status is SendStatus.SEND_OK:
                        ok += 1
                    else:
                        failed += 1
                        count(statuses, result.send_status.name)

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


async def _consume_pull(cluster: BenchCluster, plan: ClientsPlan, source: str,
                        offsets: dict[int, tuple[int, int]], group: str, label: str) -> dict:
    """4 tasks, one per queue, pulling 32 at a time from each queue's first offset to its
    last, from the master or the slave; bounded by time."""
    address = cluster.master.addr if source == "master" else cluster.slave.addr
    broker_id = 0 if source == "master" else 1
    latencies: list[int] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    by_address: dict[str, int] = {}
    counts = dict.fromkeys(offsets, 0)
    gaps = 0
    clock_ns = time.perf_counter_ns
    async with open_client_instance(cluster.namesrv_addr) as client:
        async with open_pull_consumer(client, group) as consumer:
            queues = await consumer.queues(cluster.topic)

            async def drain(queue, stop_at: float, limit: int | None, record: bool) -> None:
                nonlocal gaps
                offset, end = offsets[queue.queue_id]
                if limit is not None:
                    end = min(end, offset + limit)
                while offset < end and time.perf_counter() < stop_at:
                    consumer.prefer_broker(queue, broker_id)
                    t0 = clock_ns()
                    try:
                        result = await consumer.pull(queue, offset, PULL_BATCH,
                                                     suspend_timeout=1.0, timeout=5.0)
                    except MQError as exc:
                        if record:
                            count(statuses, error_key(exc))
                            if len(errors) < 3:
                                errors.append(str(exc))
                        await trio.sleep(0.01)
                        continue
                    if not record:
                        offset = result.next_begin_offset
                        continue
                    latencies.append(clock_ns() - t0)
                    count(by_address, result.broker_addr or "?")
                    messages = result.messages
                    if result.status is not PullStatus.FOUND or not messages:
                        count(statuses, result.status.name)
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
            cpu = CpuMeter(cluster.pids)
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
        "latency_us": latency_us(latencies),
        "failures": failures, "failures_by_status": statuses or None,
        "out_of_order_pulls": gaps, "errors_sample": errors or None,
        "complete": messages == expected, "expected_messages": expected,
        "bounded_by": "messages" if messages == expected else "time",
        "pulls_by_address": by_address, "pulled_from": address,
        "queues_pulled": len(queues), "cpu_cores": cores,
    }


async def _consume_stream(cluster: BenchCluster, plan: ClientsPlan,
                          offsets: dict[int, tuple[int, int]], group: str, label: str) -> dict:
    """The ``messages()`` stream over every queue from the first offset (one task)."""
    expected = sum(hi - lo for lo, hi in offsets.values())
    seen: dict[int, int] = {q: lo for q, (lo, hi) in offsets.items()}
    out_of_order = 0
    messages = 0
    async with open_client_instance(cluster.namesrv_addr) as client:
        async with open_pull_consumer(client, group) as consumer:
            await consumer.queues(cluster.topic)
            gc.collect()
            profiling = cluster.profiling()
            profiling.start(label)
            cpu = CpuMeter(cluster.pids)
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
