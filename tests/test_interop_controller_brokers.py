"""Issue 38: our brokers in RocketMQ 5's controller mode, judged by the real 5.3.3 controller.

Two of our brokers (real processes) of one broker set, our name server and one real
controller: the first broker to start is made master, the second joins as its slave, our
client sends through the name server, and mqadmin's controller verbs show the set. Then the
master is SIGKILLed, five times in turn, under load from four of our producers and the real
Java producer (RocketMQ 5.3.3's): the controller elects the slave, which becomes master
without a restart, and both clients' sends succeed again through the name server; every send
answered SEND_OK, by either, is readable after it. The killed broker restarts and rejoins as
a slave.
"""

from __future__ import annotations

import functools
import os
import time

import pytest
import trio

from conftest import wait_until
from trio_ha.client import Message, MQError, open_producer, open_pull_consumer
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess
from trio_ha.testing.rocketmq import JavaProcess, RocketMQ, program_lines
from trio_ha.wire.controller import EpochEntryCacheBody, encode_broker_names
from trio_ha.wire.fastjson import read_json
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import ClusterInfo

pytestmark = pytest.mark.interop

CLUSTER = "OurCtlCluster"
BROKER_NAME = "broker-c"
TOPIC = "CtlOurs"


def broker_spec(root: str, port: int, namesrv: str, controller: str) -> dict:
    return {"kind": "broker", "log_level": "INFO", "properties": {
        "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "brokerIP1": "127.0.0.1",
        "bindAddress": "127.0.0.1", "listenPort": str(port), "namesrvAddr": namesrv,
        "enableControllerMode": "true", "controllerAddr": controller,
        "storePathRootDir": root, "mappedFileSizeCommitLog": str(DEFAULT_SEGMENT_SIZE),
        "maxHashSlotNum": "1000", "maxIndexNum": "4000", "haSendHeartbeatInterval": "1000",
        "autoCreateTopicEnable": "true", "checkSyncStateSetPeriod": "1000",
    }}


async def replica_info(controller: str) -> tuple[str | None, int, list[int]]:
    """The set's master address, master epoch and in-sync set, as the controller says."""
    async with open_remoting_client(controller) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": BROKER_NAME}), 10)
    if reply.code != ResponseCode.SUCCESS:
        return None, 0, []
    members = read_json(reply.body)["syncStateSet"] if reply.body else []
    return (reply.ext_fields.get("masterAddress"), int(reply.ext_fields.get("masterEpoch", 0)),
            sorted(members))


async def wait_master(controller: str, address: str, members: int, timeout: float) -> int:
    """Until ``address`` is master with ``members`` in its in-sync set; its epoch."""
    async def seen():
        master, epoch, in_sync = await replica_info(controller)
        return epoch if master == address and len(in_sync) == members else None
    return await wait_until(seen, f"{address} master with {members} in sync", timeout=timeout,
                            interval=0.2)


async def epoch_cache(address: str) -> EpochEntryCacheBody:
    async with open_remoting_client(address) as client:
        reply = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_EPOCH_CACHE),
                                    10)
    assert reply.code == ResponseCode.SUCCESS, reply
    return EpochEntryCacheBody.decode(reply.body)


async def first_send_ok(namesrv: str, timeout: float) -> float:
    """Send until one is answered SEND_OK (a failover under way refuses the others); the
    trio time it was answered."""
    async with open_producer(namesrv, "ctlOurProducers", send_msg_timeout=2.0,
                             retry_times_when_send_failed=0) as producer:
        with trio.fail_after(timeout):
            while True:  # bounded by the deadline
                try:
                    await producer.send(Message(TOPIC, b"first after the kill"))
                    return trio.current_time()
                except MQError:
                    await trio.sleep(0.05)


async def kill_under_load(victim: NodeProcess, controller: str, successor: str,
                          namesrv: str, prefix: str, took: list[float],
                          killed_wall: list[float] | None = None) -> list[bytes]:
    """Four producers send all the time; SIGKILL ``victim`` (the master) among them, until
    ``successor`` is master and has answered SEND_OK. Records the seconds from the kill to
    that first SEND_OK in ``took`` and the kill's wall-clock time in ``killed_wall``; returns
    every body answered SEND_OK."""
    acked: list[bytes] = []
    killed_at: list[float] = []
    successor_port = int(successor.rsplit(":", 1)[1])
    first_ok = trio.Event()
    loaded = trio.Event()  # the producers' sends are being answered

    async def load(task: int) -> None:
        async with open_producer(namesrv, f"ctlLoad{task}", send_msg_timeout=2.0,
                                 retry_times_when_send_failed=0) as producer:
            for i in range(100_000):  # bounded by the deadline below too
                body = f"{prefix}{task}-{i}".encode()
                try:
                    result = await producer.send(Message(TOPIC, body))
                except MQError:
                    await trio.sleep(0.02)
                    continue
                acked.append(body)
                loaded.set()
                # offsetMsgId names the broker that stored it: ip (8 hex), port (8 hex), offset
                if killed_at and not first_ok.is_set() and \
                        int(result.offset_msg_id[8:16], 16) == successor_port:
                    took.append(trio.current_time() - killed_at[0])
                    first_ok.set()

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            for task in range(4):
                nursery.start_soon(load, task)
            await loaded.wait()
            victim.kill()
            killed_at.append(trio.current_time())
            if killed_wall is not None:
                killed_wall.append(time.time())
            await wait_master(controller, successor, 1, 60.0)
            await first_ok.wait()
            await trio.sleep(0.3)
            nursery.cancel_scope.cancel()
    return acked


async def wait_registered_master(namesrv: str, timeout: float = 30.0) -> str:
    """Until the name server lists a master (id 0) for the set; its address. (The controller
    names a master before that master's registration reaches the name server: a producer
    asking in between finds no route.)"""
    async def master() -> str | None:
        async with open_remoting_client(namesrv) as client:
            reply = await client.invoke(RemotingCommand.request(
                RequestCode.GET_BROKER_CLUSTER_INFO), 10)
        broker = ClusterInfo.decode(reply.body).broker_addr_table.get(BROKER_NAME)
        return broker.broker_addrs.get(0) if broker is not None else None
    return await wait_until(master, "a master of the set in the name server", timeout=timeout,
                            interval=0.1)


async def send_some(namesrv: str, count: int, prefix: str) -> list[bytes]:
    """``count`` sends, each retried by the producer, once the name server lists a master;
    the bodies answered SEND_OK (any other answer fails the test)."""
    await wait_registered_master(namesrv)
    sent = []
    async with open_producer(namesrv, "ctlOurProducers", send_msg_timeout=5.0,
                             retry_times_when_send_failed=4) as producer:
        for i in range(count):
            body = f"{prefix}{i}".encode()
            await producer.send(Message(TOPIC, body))
            sent.append(body)
    return sent


async def bodies_in(namesrv: str) -> set[bytes]:
    """Every message body the topic's master serves, read queue by queue from offset 0."""
    found: set[bytes] = set()
    async with open_pull_consumer(namesrv, "ctlOurReaders") as consumer:
        for queue in await consumer.queues(TOPIC, refresh=True):
            offset, end = 0, await consumer.max_offset(queue)
            while offset < end:  # bounded: each pull moves on or ends the queue
                result = await consumer.pull(queue, offset, 32, suspend_timeout=0)
                found.update(m.body for m in result.messages)
                if result.next_begin_offset <= offset:
                    break
                offset = result.next_begin_offset
    return found


JAVA_CLIENT = "trioha.interop.Client"


def start_java_producer(rocketmq5: RocketMQ, run_dir, namesrv: str, stop_file) -> JavaProcess:
    """The real Java producer, sending one message after another and going on after failures,
    until ``stop_file`` exists. It learns a new master from the name server at its next route
    poll (pollNameServerInterval, 30 s by default, 1 s here: the setting an application that
    rides out failovers shortens)."""
    return rocketmq5.start_program(
        run_dir, JAVA_CLIENT, "produce", "--mode", "steady", "--namesrv", namesrv,
        "--topic", TOPIC, "--group", "ctlJavaProducer", "--prefix", "java", "--timeout", 2000,
        "--poll-namesrv-ms", 1000, "--stop-file", stop_file, "--max-seconds", 900,
        "--interval-ms", 5, name="java-producer")


class JavaLines:
    """The Java producer's lines, read as they come (whole lines only: it is still printing)."""

    def __init__(self, java: JavaProcess):
        self.java = java
        self.lines: list[dict] = []
        self._read = 0

    def update(self) -> list[dict]:
        output = self.java.output()
        end = output.rfind("\n") + 1
        if end > self._read:
            self.lines += program_lines(output[self._read:end])
            self._read = end
        return self.lines


def java_first_ok_after(java: JavaLines, since: float, port: int, timeout: float) -> float:
    """Wall-clock time of the Java producer's first SEND_OK from the broker on ``port`` after
    ``since`` (offsetMsgId: ip, port, offset in hex)."""
    deadline = time.monotonic() + timeout
    seen = 0
    while True:  # bounded by the deadline
        lines = java.update()
        for line in lines[seen:]:
            if line.get("status") == "SEND_OK" and line["t"] >= since * 1000 and \
                    int(line["offsetMsgId"][8:16], 16) == port:
                return line["t"] / 1000
        seen = len(lines)
        if java.java.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no SEND_OK from port {port} for the Java producer: "
                                 f"{java.java.tail()}")
        time.sleep(0.1)


def mqadmin_lines(rocketmq5, run_dir, *args: object) -> list[str]:
    out = rocketmq5.mqadmin(run_dir, *args)
    return [line for line in out.splitlines() if line.strip()]


KILLS = 5


def test_our_brokers_join_fail_over_and_rejoin_under_the_real_controller(
        rocketmq5, controller5, tmp_path):
    controller = controller5
    ports = [free_broker_port() for _ in range(2)]
    roots = [str(tmp_path / f"b{i}") for i in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                log_dir=logs)
    brokers: list[NodeProcess | None] = [None, None]
    java: JavaProcess | None = None

    def start(i: int) -> NodeProcess:
        node = NodeProcess.start(f"b{i}", broker_spec(roots[i], ports[i], namesrv.addr,
                                                      controller), log_dir=logs)
        brokers[i] = node
        return node

    try:
        start(0)
        assert trio.run(wait_master, controller, addrs[0], 1, 60.0) == 1
        with open(os.path.join(roots[0], "brokerIdentity")) as identity:
            assert identity.read() == f"{CLUSTER}#{BROKER_NAME}#1"
        start(1)
        # The slave joins the in-sync set once it has acknowledged bytes it was sent up to
        # the confirm offset (its first report is a request, which proves nothing): so after
        # the first sends, not while the log is empty.
        acked = trio.run(send_some, namesrv.addr, 20, "before")
        trio.run(wait_master, controller, addrs[0], 2, 60.0)
        acked += trio.run(send_some, namesrv.addr, 20, "in-sync")

        cache = trio.run(epoch_cache, addrs[0])
        assert [(e.epoch, e.start_offset) for e in cache.epochs] == [(1, 0)]
        assert cache.broker_id == 0 and cache.max_offset > 0
        # mqadmin's controller verbs see our brokers as RocketMQ's
        shown = mqadmin_lines(rocketmq5, tmp_path / "adm1", "getSyncStateSet", "-a",
                              controller, "-b", BROKER_NAME)
        assert shown[:6] == [f"#brokerName\t{BROKER_NAME}", "#MasterBrokerId\t1",
                             f"#MasterAddr\t{addrs[0]}", "#MasterEpoch\t1",
                             "#SyncStateSetEpoch\t2", "#SyncStateSetNums\t2"], shown
        assert sum("alive=true" in line for line in shown[6:]) == 2, shown
        epochs = mqadmin_lines(rocketmq5, tmp_path / "adm2", "getBrokerEpoch", "-n",
                               namesrv.addr, "-b", BROKER_NAME)
        # each broker answers GET_BROKER_EPOCH_CACHE: the master as id 0, the slave as its
        # controller id, both with the one epoch the master began
        assert sorted(line for line in epochs if line.startswith("#brokerId")) == \
            ["#brokerId\t0", "#brokerId\t2"], epochs
        entries = [line for line in epochs if line.startswith("#Epoch")]
        assert len(entries) == 2 and all(
            line.startswith("#Epoch: EpochEntry{epoch=1, startOffset=0, endOffset=")
            for line in entries), epochs

        stop_java = tmp_path / "java-stop"
        java = start_java_producer(rocketmq5, tmp_path / "java", namesrv.addr, stop_java)
        java_lines = JavaLines(java)
        java_first_ok_after(java_lines, 0, ports[0], 60)
        master, took, java_took = 0, [], []
        for kill in range(KILLS):
            survivor = 1 - master
            killed = brokers[master]
            assert killed is not None
            killed_wall: list[float] = []
            acked += trio.run(kill_under_load, killed, controller, addrs[survivor],
                              namesrv.addr, f"load{kill}-", took, killed_wall)
            java_took.append(java_first_ok_after(java_lines, killed_wall[0], ports[survivor], 60)
                             - killed_wall[0])
            start(master)  # the old master comes back as a slave of the new one
            acked += trio.run(send_some, namesrv.addr, 10, f"rejoin{kill}-")
            trio.run(wait_master, controller, addrs[survivor], 2, 60.0)
            master = survivor
        stop_java.touch()
        assert java.wait(30) == 0, java.tail()
        java_acked = [f"java-{line['i']}".encode() for line in java_lines.update()
                      if line.get("status") == "SEND_OK"]
        for name, times in (("our client", took), ("the Java client", java_took)):
            times.sort()
            print(f"our brokers, {name}: SIGKILL to first SEND_OK of the new master over "
                  f"{KILLS} kills: median {times[len(times) // 2]:.2f} s, max {times[-1]:.2f} s")

        bodies = trio.run(bodies_in, namesrv.addr)
        lost = [body for body in acked if body not in bodies]
        java_lost = [body for body in java_acked if body not in bodies]
        print(f"our brokers: {len(acked)} sends of our client and {len(java_acked)} of the Java "
              f"client answered SEND_OK, {len(lost)} and {len(java_lost)} of them lost")
        assert not lost and not java_lost
        assert trio.run(epoch_cache, addrs[master]).epochs[-1].epoch == KILLS + 1
    finally:
        for node in [*brokers, namesrv]:
            if node is not None:
                node.kill()
        if java is not None:
            java.kill()


async def replicas_of(controller: str) -> dict[int, bool]:
    """Every member of the set the controller knows (in sync or not): controller id -> alive,
    by CONTROLLER_GET_SYNC_STATE_DATA."""
    async with open_remoting_client(controller) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
            encode_broker_names([BROKER_NAME])), 10)
    assert reply.code == ResponseCode.SUCCESS, reply
    table = read_json(reply.body)["replicasInfoTable"].get(BROKER_NAME, {})
    members = [*table.get("inSyncReplicas", []), *table.get("notInSyncReplicas", [])]
    return {int(m["brokerId"]): bool(m["alive"]) for m in members}


def test_mqadmin_elects_and_cleans_our_brokers(rocketmq5, controller5, tmp_path):
    """mqadmin's electMaster moves the master role to our slave (an admin's switch-over, no
    failure): our brokers swap roles at run time and sends go on; cleanBrokerMetadata makes
    the controller forget a dead broker of ours."""
    controller = controller5
    ports = [free_broker_port() for _ in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                log_dir=logs)
    nodes = [namesrv]
    try:
        for i in range(2):
            nodes.append(NodeProcess.start(f"b{i}", broker_spec(
                str(tmp_path / f"b{i}"), ports[i], namesrv.addr, controller), log_dir=logs))
            if i == 0:
                trio.run(wait_master, controller, addrs[0], 1, 60.0)
        acked = trio.run(send_some, namesrv.addr, 10, "before")
        trio.run(wait_master, controller, addrs[0], 2, 60.0)

        rocketmq5.mqadmin(tmp_path / "adm1", "electMaster", "-a", controller, "-c", CLUSTER,
                          "-bn", BROKER_NAME, "-b", 2)
        assert trio.run(wait_master, controller, addrs[1], 1, 60.0) == 2
        trio.run(first_send_ok, namesrv.addr, 60.0)
        acked += trio.run(send_some, namesrv.addr, 10, "after")
        # the old master follows the new one and is back in its in-sync set
        trio.run(wait_master, controller, addrs[1], 2, 60.0)
        assert not set(acked) - trio.run(bodies_in, namesrv.addr)

        nodes[1].kill()  # broker id 1, now the slave
        trio.run(functools.partial(
            wait_until, functools.partial(is_alive, controller, 1, False),
            "broker 1 dead in the controller's eyes", timeout=30))
        out = rocketmq5.mqadmin(tmp_path / "adm2", "cleanBrokerMetadata", "-a", controller,
                                "-c", CLUSTER, "-bn", BROKER_NAME, "-b", 1)
        assert trio.run(replicas_of, controller) == {2: True}, out
    finally:
        for node in reversed(nodes):
            node.kill()


async def is_alive(controller: str, broker_id: int, alive: bool) -> bool:
    return (await replicas_of(controller)).get(broker_id) is alive
