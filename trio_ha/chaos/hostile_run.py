"""``trio-ha chaos hostile``: every attack of ``hostile`` and the fuzzer of ``fuzz`` against a
real cluster, while a well-behaved client keeps using it; then the stores are verified.

Why it exists: the hardening tests each attack one server in-process, one attack at a time.
What an operator needs to know is whether a node — a real process, with every listener open
at once — survives all of it together: the design card's promise (§7) that a bad peer never
takes down the node, never corrupts the store and never blocks other connections. So:

1. a cluster starts in child processes (``ProcessCluster``: name server, SYNC_MASTER, SLAVE),
   with short remoting timeouts so that the node's own limits act within the run, plus a
   *victim* slave whose master is a ``RogueHAMaster`` of this process;
2. for ``seconds``: the attacks run one after another (each bounded by what is left), the
   fuzzer fires at the broker, the name server, the master's HA port and (as its master) the
   victim, and a good producer and consumer send and pull throughout;
3. the rogue master then tries to start the victim where no log can begin, and the good
   consumer reads back everything that was acknowledged;
4. the nodes stop (gracefully: a node that hangs on shutdown fails the run), and
   ``verify_store`` checks every store directory.

The run returns a ``HostileReport`` (``hostile_report``: when a run passes, and the report
an operator reads); this module is the run that fills it in, and re-exports its names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator

import attrs
import trio

from ..client import (
    Message,
    MessageQueue,
    MQError,
    PullConsumer,
    PullStatus,
    SendStatus,
    open_producer,
    open_pull_consumer,
)
from ..remoting import RemotingError, open_remoting_client
from ..store.offline import OfflineStoreError, verify_store
from ..testing import ClusterConfig, NodeProcess, ProcessCluster
from ..testing.processes import log_tail
from ..wire.acl import Credentials, sign
from ..wire.errors import WireError
from ..wire.record import PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import KVTable
from . import hostile
from .fuzz import (
    FuzzOutcome,
    FuzzTarget,
    MasterFrameFuzz,
    TargetKind,
    fuzz_targets,
    master_frame_script,
)
from .hostile_report import GoodClientOutcome, HostileReport, NodeVerdict, StoreVerdict

__all__ = ["GoodClientOutcome", "HostilePlan", "HostileReport", "NodeVerdict",
           "StoreVerdict", "run_hostile"]

GOOD_TOPIC = "ChaosGood"
GOOD_PRODUCERS = "chaos_good_pg"
GOOD_CONSUMERS = "chaos_good_cg"
#: the master's maxSubscriptionGroupNums in the run (RocketMQ's default is 100,000)
GROUP_TABLE_SIZE = 1000
#: the topic held pulls wait on: nothing is ever sent to it
IDLE_TOPIC = "ChaosIdle"
#: the cluster's remoting timeouts, short so that the node's own limits act within a run
SERVER_TIMEOUT_SECONDS = 2
#: answers to a send that mean "stored", short of every guarantee (a slave slow to ack
#: under attack is no failure of the node)
STORED = frozenset(SendStatus)
#: the most time each attack is sure of in the first round, even when the run's time is up
FIRST_ROUND_FLOOR = 3.0
#: what the rogue master's last sessions start an empty slave at: off a segment boundary
ROGUE_START = 2**62 + 4096


@attrs.frozen
class HostilePlan:
    seconds: float = 60.0
    seed: int = 0
    #: connections each connection flood opens (to the broker and to the name server)
    connections: int = 2000
    #: the longest time the good client may go without a successful send
    max_stall: float = 15.0
    #: where the cluster's stores and logs go; None: a temporary directory, removed after a
    #: run that passed
    data_dir: str | None = None



# ---- the good client --------------------------------------------------------------------------


@attrs.define
class GoodClient:
    """A producer sending a message every ``interval`` and a consumer pulling every queue,
    counting what worked; ``drain`` reads back what was acknowledged."""

    namesrv: str
    interval: float = 0.05
    sends: Counter[str] = attrs.field(factory=Counter)
    send_failures: Counter[str] = attrs.field(factory=Counter)
    pulls: Counter[str] = attrs.field(factory=Counter)
    pull_failures: Counter[str] = attrs.field(factory=Counter)
    acknowledged: set[str] = attrs.field(factory=set)
    received: set[str] = attrs.field(factory=set)
    offsets: dict[MessageQueue, int] = attrs.field(factory=dict)
    last_success: float | None = None
    longest_gap: float = 0.0

    async def produce(self, keep_going: Callable[[], bool]) -> None:
        async with open_producer(self.namesrv, GOOD_PRODUCERS, send_msg_timeout=10.0) as producer:
            number = 0
            while keep_going():
                number += 1
                try:
                    result = await producer.send(Message(GOOD_TOPIC, b"good %d" % number,
                                                         keys=f"good{number}"))
                except MQError as exc:
                    self.send_failures[_error_key(exc)] += 1
                else:
                    self.sends[result.send_status.name] += 1
                    if result.send_status is SendStatus.SEND_OK:
                        self.acknowledged.add(result.msg_id)
                        now = time.monotonic()
                        if self.last_success is not None:
                            self.longest_gap = max(self.longest_gap, now - self.last_success)
                        self.last_success = now
                await trio.sleep(self.interval)

    async def consume(self, keep_going: Callable[[], bool], *,
                      count_failures: bool = True) -> None:
        """Pull every queue of the good topic while ``keep_going()`` (long polls of 1 s)."""
        async with open_pull_consumer(self.namesrv, GOOD_CONSUMERS) as consumer:
            try:
                queues = await consumer.queues(GOOD_TOPIC)
            except MQError as exc:
                if count_failures:
                    self.pull_failures[_error_key(exc)] += 1
                return
            async with trio.open_nursery() as nursery:
                for queue in queues:
                    nursery.start_soon(self._pull_queue, consumer, queue, keep_going,
                                       count_failures)

    async def _pull_queue(self, consumer: PullConsumer, queue: MessageQueue,
                          keep_going: Callable[[], bool], count_failures: bool) -> None:
        await trio.lowlevel.checkpoint()
        while keep_going():
            try:
                result = await consumer.pull(queue, self.offsets.get(queue, 0),
                                             suspend_timeout=1.0, timeout=15.0)
            except MQError as exc:
                if count_failures:
                    self.pull_failures[_error_key(exc)] += 1
                await trio.sleep(0.2)
                continue
            self.pulls[result.status.name] += 1
            for message in result.messages:
                key = message.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
                if key is not None:
                    self.received.add(key)
            self.offsets[queue] = result.next_begin_offset
            if result.status is PullStatus.OFFSET_ILLEGAL:
                await trio.sleep(0.2)

    async def drain(self, seconds: float) -> None:
        """Read on until every acknowledged message was read or ``seconds`` pass."""
        with trio.move_on_after(seconds):
            await self.consume(lambda: not self.acknowledged <= self.received,
                               count_failures=False)

    def outcome(self) -> GoodClientOutcome:
        lost = sorted(self.acknowledged - self.received)
        return GoodClientOutcome(dict(self.sends), dict(self.send_failures), dict(self.pulls),
                                 dict(self.pull_failures), len(self.received), len(lost),
                                 tuple(lost[:3]), round(self.longest_gap, 3))


def _error_key(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if isinstance(code, int):
        return f"{type(exc).__name__}:{hostile.code_name(code)}"
    return type(exc).__name__


async def _request(address: str, request: RemotingCommand) -> RemotingCommand | None:
    try:
        async with open_remoting_client(address) as client:
            return await client.invoke(request, 5)
    except (RemotingError, OSError):
        return None


async def _prepare_topics(broker: str, namesrv: str, timeout: float = 30.0) -> None:
    """Create the good and idle topics on the master and wait until the name server routes
    the good one (the broker registers its topics when they change)."""
    for topic in (GOOD_TOPIC, IDLE_TOPIC):
        reply = await _request(broker, hostile.create_topic_request(topic, 4))
        if reply is None or reply.code != ResponseCode.SUCCESS:
            raise RuntimeError(f"could not create topic {topic} on {broker}: {reply}")
    route = RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": GOOD_TOPIC})
    with trio.move_on_after(timeout):
        while True:
            reply = await _request(namesrv, route)
            if reply is not None and reply.code == ResponseCode.SUCCESS:
                return
            await trio.sleep(0.1)
    raise RuntimeError(f"the name server has no route of {GOOD_TOPIC} after {timeout:g} s")


async def _ha_state(broker: str) -> str:
    """A slave's replication state, from its runtime info (``haState``)."""
    reply = await _request(broker, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO))
    if reply is None or reply.code != ResponseCode.SUCCESS:
        return "unknown (no runtime info)"
    try:
        table = KVTable.decode(reply.body).table
    except WireError:
        return "unknown (bad runtime info)"
    return table.get("haState", "unknown")


# ---- the run ----------------------------------------------------------------------------------


@attrs.frozen
class _Addresses:
    namesrv: str
    broker: str
    slave_broker: str
    master_ha: str
    victim_broker: str
    #: the master's metrics endpoint (metricsPort)
    master_metrics: str


@attrs.define
class _Run:
    """The attack phase, inside trio."""

    plan: HostilePlan
    addresses: _Addresses
    nodes: list[NodeProcess]
    rogue_socket: socket.socket
    attacks: list[hostile.AttackOutcome] = attrs.field(factory=list)
    fuzz: list[FuzzOutcome] = attrs.field(factory=list)
    good: GoodClient | None = None
    victim_state: str = "unknown"

    async def main(self) -> None:
        a = self.addresses
        await _prepare_topics(a.broker, a.namesrv)
        self.good = good = GoodClient(a.namesrv)
        master_frames = MasterFrameFuzz()
        rogue = hostile.RogueHAMaster(master_frame_script(self.plan.seed, master_frames))
        listener = trio.SocketListener(trio.socket.from_stdlib_socket(self.rogue_socket))
        started = trio.current_time()
        until = started + self.plan.seconds
        attacks_over = trio.Event()  # the good client stops then

        def keep_going() -> bool:
            return not attacks_over.is_set()

        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: rogue.serve(listeners=[listener],
                                                                task_status=task_status))
            async with trio.open_nursery() as good_client:
                good_client.start_soon(good.produce, keep_going)
                good_client.start_soon(good.consume, keep_going)
                async with trio.open_nursery() as work:
                    work.start_soon(self._fuzz, until)
                    work.start_soon(self._attack, until)
                attacks_over.set()
            self.fuzz.append(master_frames.outcome(rogue, trio.current_time() - started))
            # Last, the rogue master offers the victim a start where no log can begin: it
            # must refuse (and stop asking), having written nothing.
            rogue.script = hostile.start_at(ROGUE_START)
            before, ended_before = rogue.sessions, rogue.ended_by_slave
            with trio.move_on_after(10):
                while True:
                    if rogue.sessions > before and await _ha_state(a.victim_broker) == "refused":
                        break
                    await trio.sleep(0.2)
            self.victim_state = await _ha_state(a.victim_broker)
            self.attacks.append(hostile.AttackOutcome(
                "rogue HA master", rogue.address or "", connections=rogue.sessions - before,
                closed_by_node=rogue.ended_by_slave - ended_before,
                note=f"the victim slave's state: {self.victim_state}"))
            await good.drain(15)
            nursery.cancel_scope.cancel()

    async def _fuzz(self, until: float) -> None:
        a = self.addresses
        targets = [FuzzTarget("broker", TargetKind.BROKER, a.broker),
                   FuzzTarget("slave broker", TargetKind.BROKER, a.slave_broker),
                   FuzzTarget("name server", TargetKind.NAMESRV, a.namesrv),
                   FuzzTarget("master HA", TargetKind.HA_MASTER, a.master_ha)]
        self.fuzz += await fuzz_targets(targets, seed=self.plan.seed,
                                        seconds=until - trio.current_time(), max_frames=200_000)

    async def _attack(self, until: float) -> None:
        """Every attack once, in turn, then again from the first while time remains. Each is
        bounded by what is left of the run, but in the first round gets at least its share
        of the run (at most ``FIRST_ROUND_FLOOR`` seconds), so that every attack is made
        even when those before it took long; the quick ones come first, then those that
        wait for the node's timeouts."""
        a = self.addresses
        n = self.plan.connections
        big_replies = hostile.request_frames(RequestCode.GET_BROKER_CONFIG, 2000)
        small_replies = hostile.request_frames(RequestCode.GET_BROKER_CLUSTER_INFO, 2000)
        held = hostile.request_frames(RequestCode.PULL_MESSAGE, 64, consumerGroup="chaos_held",
                                      topic=IDLE_TOPIC, queueId=0, queueOffset=0, maxMsgNums=32,
                                      sysFlag=2, commitOffset=0, suspendTimeoutMillis=30_000,
                                      subVersion=0)
        slow = hostile.request_frames(RequestCode.GET_BROKER_RUNTIME_INFO, 1, pad="x" * 200)
        first_round = True
        share = 0.1  # set below: the run's time over the number of attacks

        def left(at_most: float) -> float:
            floor = min(at_most, FIRST_ROUND_FLOOR, share) if first_round else 0.1
            return max(floor, min(at_most, until - trio.current_time()))

        # the broker closes what waits on its timeouts (SERVER_TIMEOUT_SECONDS) well within
        # these bounds; the name server's timeouts are RocketMQ's (30 s): its attacks end
        # at their bound, the connections still open
        waits = SERVER_TIMEOUT_SECONDS + 4
        attacks = [
            lambda: hostile.bad_frames(a.broker, connections=50, seconds=left(10)),
            lambda: hostile.bad_frames(a.namesrv, connections=50, seconds=left(10)),
            lambda: hostile.bad_frames(a.slave_broker, connections=20, seconds=left(10)),
            lambda: hostile.invalid_input(a.broker, seconds=left(10)),
            lambda: hostile.metadata_flood(a.broker, heartbeats=50, pulls=50, seconds=left(10),
                                           prefix="chaosflood"),
            lambda: hostile.connection_flood(a.broker, connections=n, hold_seconds=1,
                                             seconds=left(20)),
            lambda: hostile.connection_flood(a.namesrv, connections=n, hold_seconds=1,
                                             seconds=left(20)),
            lambda: hostile.connection_flood(a.master_ha, connections=200, hold_seconds=1,
                                             seconds=left(10), attack="HA connection flood"),
            lambda: hostile.ha_report_flood(a.master_ha, seconds=left(5)),
            lambda: hostile.rogue_slave(a.master_ha, seconds=left(15), seed=self.plan.seed),
            lambda: hostile.abandon_long_polls(a.broker, held, hold_seconds=left(1), frames=64),
            lambda: hostile.non_reading_clients(a.broker, big_replies, clients=2,
                                                seconds=left(waits), frames=2000),
            lambda: hostile.partial_frames(a.broker, connections=6, sent=1 << 20,
                                           seconds=left(waits)),
            lambda: hostile.slowloris(a.broker, slow, seconds=left(waits)),
            lambda: hostile.non_reading_clients(a.namesrv, small_replies, clients=1,
                                                seconds=left(2), frames=2000),
            lambda: hostile.partial_frames(a.namesrv, connections=3, sent=1 << 20,
                                           seconds=left(2)),
            lambda: hostile.slowloris(a.namesrv, slow, seconds=left(2)),
            lambda: hostile.leave_with_requests_unsent(a.broker, held, seconds=left(waits)),
            lambda: hostile.crowd_the_metrics(a.master_metrics, idle=n, slowloris=300,
                                              seconds=left(waits)),
            lambda: hostile.broker_name_takeover(a.namesrv, "broker-a", fake_addr="127.0.0.1:9",
                                                 fake_ha_addr="127.0.0.1:9", seconds=left(10)),
            lambda: hostile.lock_hoarding(a.broker, requests=20, queues=1024,
                                          seconds=left(10), prefix="chaoshoard"),
            lambda: hostile.group_flood(a.broker, heartbeats=2, groups=2000, seconds=left(10),
                                        prefix="chaosgflood"),
            # a signed read of a topic no one uses, replayed as its delete
            lambda: hostile.replay_signatures(a.broker, sign(RemotingCommand.request(
                RequestCode.GET_TOPIC_CONFIG, {"topic": "chaosReplayed"}),
                Credentials("chaosAdmin", "chaosSecret")), RequestCode.DELETE_TOPIC_IN_BROKER,
                seconds=left(5)),
            lambda: hostile.ha_slot_squatters(a.master_ha, seconds=left(10)),
            lambda: hostile.offset_past_the_end_through_the_slave(
                a.slave_broker, a.broker, IDLE_TOPIC, seconds=left(15)),
        ]
        share = max(0.1, self.plan.seconds / len(attacks))
        for _ in range(100):  # bounded: the deadline ends it long before
            for attack in attacks:
                if not first_round and trio.current_time() >= until:
                    return
                self.attacks.append(await attack())
            first_round = False
            if trio.current_time() >= until:
                return


@contextlib.contextmanager
def _data_directory(plan: HostilePlan) -> Iterator[tuple[str, list[bool]]]:
    """The run's directory and a flag the run sets when it passed: a temporary directory is
    removed then (and kept for inspection otherwise); a given one is always kept."""
    if plan.data_dir is not None:
        os.makedirs(plan.data_dir, exist_ok=True)
        yield plan.data_dir, [False]
        return
    base = tempfile.mkdtemp(prefix="trio-ha-chaos-hostile-")
    passed = [False]
    try:
        yield base, passed
    finally:
        if passed[0]:
            shutil.rmtree(base, ignore_errors=True)


def _victim_properties(data_dir: str, rogue_address: str) -> dict[str, str]:
    """A slave of its own broker group, pointed at the rogue master, with no name server."""
    return {
        "brokerClusterName": "ChaosVictims", "brokerName": "victim", "brokerId": "1",
        "brokerRole": "SLAVE", "listenPort": "0", "bindAddress": "127.0.0.1",
        "brokerIP1": "127.0.0.1", "haBindAddress": "127.0.0.1",
        "haMasterAddress": rogue_address, "storePathRootDir": os.path.join(data_dir, "victim"),
        "mappedFileSizeCommitLog": str(1 << 20),
    }


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _verify(name: str, path: str) -> StoreVerdict:
    try:
        report = verify_store(path)
    except OfflineStoreError as exc:
        return StoreVerdict(name, path, False, damage=(str(exc),))
    return StoreVerdict(
        name, path, report.clean, report.records, report.log_end,
        tuple(f"{d.area} {d.file} at {d.commitlog_offset}: {d.problem}" for d in report.damage),
        report.warnings,
    )


def run_hostile(plan: HostilePlan) -> HostileReport:
    """Run it (see the module's docstring) and report. Blocking: it runs trio itself."""
    with _data_directory(plan) as (data_dir, passed):
        config = ClusterConfig(
            data_dir=os.path.join(data_dir, "cluster"), slaves=1, master_role="SYNC_MASTER",
            properties={
                "serverWriteTimeoutSeconds": SERVER_TIMEOUT_SECONDS,
                "serverRequestTimeoutSeconds": SERVER_TIMEOUT_SECONDS,
                "serverMaxConnections": max(64, plan.connections // 2),
                "shutdownWaitTimeSeconds": 2,
                "metricsPort": 0,
                # small enough that the group flood (2 x 2,000 new groups a round) would fill
                # it, were groups made on demand not bounded per client and below the cap
                "maxSubscriptionGroupNums": GROUP_TABLE_SIZE,
            })
        rogue_socket = socket.socket()
        rogue_socket.bind(("127.0.0.1", 0))
        rogue_socket.listen(64)
        host, port = rogue_socket.getsockname()[:2]
        rogue_address = f"{host}:{port}"
        with contextlib.closing(rogue_socket), ProcessCluster.start(config) as cluster:
            victim = NodeProcess.start(
                "victim", {"kind": "broker",
                           "properties": _victim_properties(config.data_dir, rogue_address)},
                log_dir=cluster.log_dir)
            nodes = [*cluster.nodes, victim]
            try:
                run = _Run(plan, _Addresses(
                    cluster.namesrv_addr, cluster.master.addr, cluster.slave.addr,
                    cluster.master.info["ha_addr"], victim.addr,
                cluster.master.info["metrics_addr"]), nodes, rogue_socket)
                trio.run(run.main)
                up = {node.name: node.poll() is None for node in nodes}
            finally:
                victim.stop()
                cluster.close()
        verdicts = tuple(
            NodeVerdict(node.name, node.pid, up[node.name], node.poll(),
                        _file_size(node.log_path),
                        None if node.poll() == 0 else log_tail(node.log_path, 600))
            for node in nodes)
        stores = (_verify("master", config.store_dir(0)), _verify("slave1", config.store_dir(1)),
                  _verify("victim", os.path.join(config.data_dir, "victim")))
        assert run.good is not None
        report = HostileReport(
            plan.seed, plan.seconds, data_dir, tuple(run.attacks), tuple(run.fuzz),
            run.good.outcome(), verdicts, stores, run.victim_state, plan.max_stall)
        passed[0] = report.passed
        return report
