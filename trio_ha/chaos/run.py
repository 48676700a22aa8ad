"""A chaos run from start to verdict (``trio-ha chaos run``).

1. Start the cluster from the ``trio-ha`` executable: a name server, a master, its slaves
   (each through a fault proxy to the master's HA port); create the topic; wait until a
   send is acknowledged (a SYNC_MASTER's slave has attached).
2. Run the producers and the consumer group, and inject the schedule's faults one after
   another, each recorded with its start and end.
3. When the time is up: stop the producers, give the consumer a few seconds to catch up,
   undo what is still undone (a paused node, a stalled link, a node still down), then
   SIGKILL every node at once: the final state is what a crash of everything leaves.
4. Open each store in this process (recovery runs as at a broker's start) and check the
   history against them (``checker``). The history, the verdict as JSON and the report are
   written to the run directory.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import trio

from ..client import MQError, open_admin
from ..config import BrokerRole
from ..testing import FaultProxy, free_broker_port, open_fault_proxy
from .checker import Verdict, check, read_store
from .cluster import ChaosNode
from .history import FaultEvent, History, SendEvent
from .plan import ChaosConfig, Fault, FaultKind, schedule
from .workload import consume, monotonic_clock, produce

__all__ = ["SEGMENT_SIZE", "run_chaos"]

#: commitlog segments of the run's brokers (small: faults land near segment ends too)
SEGMENT_SIZE = 4 * 1024 * 1024
#: how long the consumer may go on after the producers stop
CONSUMER_GRACE = 8.0
#: how long the cluster has to acknowledge its first send
READY_TIMEOUT = 60.0


def _broker_properties(config: ChaosConfig, run_dir: Path, name: str, broker_id: int,
                       namesrv: str, port: int, ha_master: str | None) -> dict[str, str]:
    properties = {
        "brokerClusterName": "ChaosCluster", "brokerName": "chaos-broker",
        "brokerId": str(broker_id),
        "brokerRole": config.role if broker_id == 0 else "SLAVE",
        "flushDiskType": config.flush, "namesrvAddr": namesrv,
        "listenPort": str(port), "haListenPort": str(port + 1), "bindAddress": "127.0.0.1",
        "haBindAddress": "127.0.0.1", "brokerIP1": "127.0.0.1", "vipChannelEnable": "false",
        "storePathRootDir": str(run_dir / name), "mappedFileSizeCommitLog": str(SEGMENT_SIZE),
        "haHousekeepingInterval": str(config.ha_housekeeping_ms),
        "autoCreateTopicEnable": "true",
    }
    if ha_master is not None:
        properties["haMasterAddress"] = ha_master
    return properties


async def _start(node: ChaosNode) -> None:
    await trio.to_thread.run_sync(node.start)


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


async def _inject(fault: Fault, master: ChaosNode, slaves: list[ChaosNode],
                  proxies: list[FaultProxy], rng: random.Random) -> str:
    """Apply ``fault`` and undo it after its duration; what happened, in a few words."""
    kind = fault.kind
    if kind in (FaultKind.KILL_MASTER, FaultKind.KILL_SLAVE):
        node = master if kind is FaultKind.KILL_MASTER else slaves[fault.target - 1]
        await trio.to_thread.run_sync(node.kill)
        await trio.sleep(fault.duration)
        await _start(node)
        return f"{node.name} killed, restarted"
    if kind in (FaultKind.PAUSE_MASTER, FaultKind.PAUSE_SLAVE):
        node = master if kind is FaultKind.PAUSE_MASTER else slaves[fault.target - 1]
        node.pause()
        try:
            await trio.sleep(fault.duration)
        finally:
            node.resume()
        return f"{node.name} paused"
    proxy = proxies[fault.target - 1]
    if kind is FaultKind.CUT_HA_LINK:
        with trio.move_on_after(2.0) as waited:
            cut = await proxy.cut_mid_frame(rng.randint(1, 4096))
            return f"slave{fault.target}'s link cut at {cut}"
        if waited.cancelled_caught:
            proxy.close_all("cut")
        return f"slave{fault.target}'s link cut (no frame in flight)"
    if kind is FaultKind.STALL_HA_LINK:
        proxy.stall()
        try:
            await trio.sleep(fault.duration)
        finally:
            proxy.resume()
        return f"slave{fault.target}'s link stalled"
    proxy.set_delay(0.005, max_chunk=512)
    try:
        await trio.sleep(fault.duration)
    finally:
        proxy.set_delay(0)
    return f"slave{fault.target}'s link slowed"


async def _inject_all(faults: list[Fault], master: ChaosNode, slaves: list[ChaosNode],
                      proxies: list[FaultProxy], history: History, clock, seed: int) -> None:
    rng = random.Random(seed)
    for fault in faults:
        await trio.sleep(max(0.0, fault.at - clock()))
        started = clock()
        detail = await _inject(fault, master, slaves, proxies, rng)
        history.fault(FaultEvent(fault.kind.value, fault.target, started, clock(), detail))


def run_chaos(config: ChaosConfig, run_dir: Path) -> Verdict:
    """Run ``config`` with everything under ``run_dir``; the verdict (also written there as
    ``verdict.json`` and ``report.txt``, beside ``history.jsonl``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    history = History.to_file(run_dir / "history.jsonl")
    try:
        verdict = trio.run(_run, config, run_dir, history)
    finally:
        history.close()
    (run_dir / "verdict.json").write_text(json.dumps(verdict.as_dict(), indent=1))
    (run_dir / "report.txt").write_text(verdict.report() + "\n")
    return verdict


async def _run(config: ChaosConfig, run_dir: Path, history: History) -> Verdict:
    namesrv = ChaosNode.namesrv(run_dir)
    master_port = free_broker_port()
    master = ChaosNode.broker(run_dir, "master", _broker_properties(
        config, run_dir, "master", 0, namesrv.addr, master_port, None))
    nodes = [namesrv, master]
    slaves: list[ChaosNode] = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            proxies = [await stack.enter_async_context(
                open_fault_proxy(("127.0.0.1", master_port + 1), seed=config.seed + n))
                for n in range(config.slaves)]
            for n, proxy in enumerate(proxies, 1):
                slaves.append(ChaosNode.broker(run_dir, f"slave{n}", _broker_properties(
                    config, run_dir, f"slave{n}", n, namesrv.addr, free_broker_port(),
                    proxy.address_text)))
            nodes.extend(slaves)
            for node in nodes:
                await _start(node)
            await _wait_ready(namesrv.addr, config, history)
            clock = monotonic_clock()
            producers_scope = trio.CancelScope()
            consumer_scope = trio.CancelScope()

            async def producers() -> None:
                with producers_scope:
                    async with trio.open_nursery() as nursery:
                        for producer_no in range(1, config.producers + 1):
                            nursery.start_soon(produce, namesrv.addr, config, producer_no,
                                               history, clock)

            async def consumer() -> None:
                with consumer_scope:
                    await consume(namesrv.addr, config, history, clock)

            async with trio.open_nursery() as load:
                load.start_soon(producers)
                load.start_soon(consumer)
                with trio.move_on_after(config.seconds):
                    await _inject_all(schedule(config), master, slaves, proxies, history,
                                      clock, config.seed)
                    await trio.sleep_forever()
                producers_scope.cancel()
                # Undo what a fault cut short (a node left down or paused), then let the
                # consumer read what is left.
                for node in [master, *slaves]:
                    if node.paused:
                        node.resume()
                    if not node.running:
                        await _start(node)
                await trio.sleep(CONSUMER_GRACE)
                consumer_scope.cancel()
    finally:
        # Everything at once, as a crash of every machine would: what is checked is what
        # survives that.
        for node in nodes:
            await trio.to_thread.run_sync(node.kill)
    master_contents = await read_store(master.store_dir or run_dir, config, SEGMENT_SIZE,
                                       BrokerRole(config.role))
    slave_contents = [await read_store(s.store_dir or run_dir, config, SEGMENT_SIZE,
                                       BrokerRole.SLAVE) for s in slaves]
    return check(config, history, master_contents, slave_contents)

