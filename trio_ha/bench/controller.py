"""``trio-ha bench controller``: our controller under 100 broker groups (issue 39).

Issue 39 asks that the controller answer elections and heartbeats for 100 broker groups
without a heartbeat being read late. This benchmark puts that load on the real thing and
prints what it held:

- **The controller** runs as operators run it: ``trio-ha controller -c <file>`` in a child
  process, with the journal store (``--store journal``, the default), or two controllers
  over a 3-member etcd cluster (``--store etcd``; :class:`~trio_ha.testing.etcd.EtcdCluster`),
  one leading and one following, as the replicated mode runs.
- **The brokers** are simulated in this process: 100 groups of 3. Each broker does what
  ``broker/controller/link.py`` does, over the same codecs: GET_NEXT_BROKER_ID, APPLY_BROKER_ID
  (with a ``brokerIdentity``-style check code), REGISTER_BROKER, a heartbeat, ELECT_MASTER for
  itself when the set has no master; the master then reports its in-sync set of three
  (ALTER_SYNC_STATE_SET). Then every broker heartbeats every ``brokerHeartbeatInterval``
  (1 s, RocketMQ's default) with ``controllerHeartBeatTimeoutMills`` (10 s) in the heartbeat,
  to every controller, each on a connection of its own (closing it is how a controller sees a
  broker die, so brokers cannot share one), and polls GET_REPLICA_INFO every
  ``syncBrokerMetadataPeriod`` (5 s). Each broker listens on a port of its own for
  NOTIFY_BROKER_ROLE_CHANGED, which the controller sends to the members' addresses.

How "read late" is seen from outside. A real broker's heartbeat is one way; ours ask for the
answer the controller gives a two-way heartbeat (``server.py``: the table is updated before
the answer is made), so every heartbeat has a latency, and an answer that came after X ms
bounds how late the controller's table saw it. On top of that, during each heartbeat phase a
sampler asks, every 2 s, the leader for every set's members with their liveness
(GET_SYNC_STATE_DATA: a member shown dead while it heartbeats is a heartbeat read too late)
and each controller's ``/metrics`` for its count of live brokers; and any election the
controller started (its ``own_elections`` counter) or role-change notice received while every
master heartbeats is a spurious one. A heartbeat is counted *late* when its answer took
longer than one heartbeat interval: by then the next heartbeat is due and the controller's
view of that broker lags a whole beat. A second phase sends the heartbeats one way, as real
brokers do, for the controller's CPU per heartbeat without the answer's write (on this kind of
VM the write that wakes the other process is most of a small request's cost); a third sends
them ten times as often (0.1 s) to show the headroom.

Elections: the masters of K groups at once (K = 1, three times, and 10) are killed (their
connections closed, as a crashed process's are) or go silent (heartbeats stop, the connection
stays: a hung process, found dead at its heartbeat timeout). For each group we time how soon
its new master is readable (GET_REPLICA_INFO polled every 10 ms; for a silent master from the
moment its timeout ran out) and when the NOTIFY_BROKER_ROLE_CHANGED reached the new master,
and check that it was a live member of the in-sync set. Then the old master comes back as a
slave (registers again, heartbeats) and the new master reports the set of three again, so
every round starts from full groups.

CPU: each process's CPU seconds over each phase (``CpuMeter``), and per heartbeat for the
controllers. ``quiet`` phases (heartbeats and polls paused for less than the timeout) show what
the controllers spend with nothing arriving: with etcd, mostly the follower reading every
record again every 0.5 s (``controller/etcd.py`` FOLLOW_INTERVAL), measured with no sets and
with 100.

Everything is bounded in count and time; ``--quick`` runs 10 groups, short phases and a 4 s
heartbeat timeout (for the silent rounds) as a smoke test. Benchmarks report; they never
assert.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import select
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator

import attrs
import trio

from .._errors import TrioHAError
from ..remoting import RemotingClient, RemotingConnection, RemotingError, RemotingServer
from ..testing.etcd import EtcdCluster
from ..testing.ports import free_broker_port
from ..testing.processes import child_env, log_tail
from ..wire.controller import (
    SPECS,
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    BrokerReplicasInfo,
    ElectMasterRequestHeader,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    SyncStateSet,
    encode_broker_names,
)
from ..wire.errors import WireError
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from . import percentile
from .harness import (
    CpuMeter,
    Plan,
    common_fields,
    config_fields,
    count,
    latency_us,
    poll_until,
    scratch_directory,
    tidied,
    trio_run,
)

STORES = ("journal", "etcd")
CLUSTER = "BenchControllerCluster"
REPLICAS = 3
#: RocketMQ 5.3.3's broker defaults (BrokerConfig: brokerHeartbeatInterval,
#: controllerHeartBeatTimeoutMills, syncBrokerMetadataPeriod)
HEARTBEAT_INTERVAL = 1.0
HEARTBEAT_TIMEOUT_MS = 10_000
POLL_PERIOD = 5.0
#: each request waits at most this long (the broker's own limit, link.py)
REQUEST_TIMEOUT = 3.0
#: how often an election round reads the groups whose master it stopped
ELECTION_POLL = 0.01
#: an election round gives up on a group after its master's timeout plus this
ELECTION_BOUND = 30.0
#: how often the sampler reads the controllers' view of liveness during a heartbeat phase
SAMPLE_PERIOD = 2.0
#: registrations in flight at once during the setup (groups)
SETUP_CONCURRENCY = 16
#: with this set to a directory, each controller runs under cProfile (``<dir>/ctl<n>.prof``)
PROFILE_ENV = "TRIO_HA_BENCH_PROFILE"
#: the controller's follower reads etcd this often (controller/etcd.py FOLLOW_INTERVAL)
FOLLOW_INTERVAL = 0.5


@attrs.define(kw_only=True)
class ControllerPlan(Plan):
    groups: int
    #: what the brokers put in their heartbeats (controllerHeartBeatTimeoutMills)
    heartbeat_timeout_ms: int
    steady_seconds: float
    #: the same, with one-way heartbeats (what a real broker sends: the controller's CPU)
    oneway_seconds: float
    #: the stress phase: the same brokers heartbeating this often
    stress_interval: float
    stress_seconds: float
    #: heartbeats and polls paused (must stay well under the timeout)
    quiet_seconds: float
    #: election rounds: (how, masters stopped at once)
    rounds: tuple[tuple[str, int], ...]

    @classmethod
    def make(cls, quick: bool) -> ControllerPlan:
        if quick:
            return cls(quick=True, groups=10, heartbeat_timeout_ms=4000, steady_seconds=3.0,
                       oneway_seconds=2.0,
                       stress_interval=0.1, stress_seconds=1.5, quiet_seconds=1.0,
                       rounds=(("close", 1), ("close", 2), ("silent", 1), ("silent", 2)))
        return cls(quick=False, groups=100, heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS,
                   steady_seconds=30.0, oneway_seconds=20.0, stress_interval=0.1,
                   stress_seconds=10.0, quiet_seconds=5.0,
                   rounds=(("close", 1), ("close", 1), ("close", 1), ("close", 10),
                           ("silent", 1), ("silent", 10)))


def run_controller_benchmarks(directory: str | None = None, *, quick: bool = False,
                              store: str = "journal") -> Iterator[dict]:
    """Run the benchmark against ``store`` (journal or etcd) in a scratch directory (inside
    ``directory`` if given) and yield one dict per result (floats to 5 significant digits).
    The scratch directory and every child process are gone at the end, also on error."""
    if store not in STORES:
        raise ValueError(f"store must be one of {', '.join(STORES)}, not {store!r}")
    yield from tidied(_controller(directory, ControllerPlan.make(quick), store))


# ---- the controller processes --------------------------------------------------------------


@attrs.define(eq=False)
class ControllerProcess:
    """``trio-ha controller -c <file>`` in a child process: its address once it serves, and
    its ``/metrics`` (a port chosen here)."""

    name: str
    process: subprocess.Popen[bytes]
    addr: str
    metrics_url: str
    log_path: str

    @classmethod
    def start(cls, name: str, properties: dict[str, str], directory: str, log_dir: str,
              timeout: float = 60.0) -> ControllerProcess:
        metrics_port = free_broker_port()
        properties = {"bindAddress": "127.0.0.1", "listenPort": "0",
                      "metricsPort": str(metrics_port), **properties}
        conf = os.path.join(directory, f"{name}.conf")
        with open(conf, "w") as f:
            f.writelines(f"{key}={value}\n" for key, value in properties.items())
        log_path = os.path.join(log_dir, f"{name}.log")
        command = [sys.executable, "-m", "trio_ha.cli", "--log-file", log_path, "controller",
                   "-c", conf]
        profile_dir = os.environ.get(PROFILE_ENV)
        if profile_dir:  # cProfile writes it when the controller exits (SIGINT: cleanly)
            os.makedirs(profile_dir, exist_ok=True)
            command[1:1] = ["-m", "cProfile", "-o", os.path.join(profile_dir, f"{name}.prof")]
        with open(os.path.join(log_dir, f"{name}.stderr"), "ab") as err:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL,
                                       stdout=subprocess.PIPE, stderr=err, env=child_env())
        assert process.stdout is not None
        deadline = time.monotonic() + timeout
        addr = None
        while addr is None and time.monotonic() < deadline:  # a few lines at most
            ready, _, _ = select.select([process.stdout], [], [],
                                        max(0.0, deadline - time.monotonic()))
            line = process.stdout.readline().decode(errors="replace") if ready else ""
            if not line:
                break
            if line.startswith("controller listening on "):
                addr = line.split()[-1]
        if addr is None:
            _stop(process, 5)
            raise RuntimeError(f"controller {name} did not start within {timeout:g} s: "
                               f"{log_tail(log_path)}")
        return cls(name, process, addr, f"http://127.0.0.1:{metrics_port}/metrics", log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def check(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"controller {self.name} exited with status {code}: "
                               f"{log_tail(self.log_path)}")

    def stop(self) -> None:
        _stop(self.process, 15)


def _stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGINT (a graceful stop), SIGKILL after ``timeout`` seconds."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    if process.stdout is not None:
        process.stdout.close()


def scrape(url: str) -> dict[str, float]:
    """A Prometheus text page as {series name: value} (``_total`` dropped from counters;
    our controller's series carry no labels but the remoting ones, kept whole)."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        name = name.removesuffix("_total")
        try:
            values[name] = float(value)
        except ValueError:
            continue
    return values


# ---- what is measured --------------------------------------------------------------------------


@attrs.define(eq=False)
class Tally:
    """One kind of request in one window: sent, answered (by code), failed (by error), and the
    latency of every answer."""

    sent: int = 0
    ok: int = 0
    refused: dict[str, int] = attrs.field(factory=dict)
    failed: dict[str, int] = attrs.field(factory=dict)
    latencies: list[int] = attrs.field(factory=list)

    def result(self) -> dict:
        return {"sent": self.sent, "ok": self.ok, "refused": sum(self.refused.values()),
                "failed": sum(self.failed.values()), "refused_by_code": self.refused or None,
                "failed_by_error": self.failed or None,
                "latency_us": latency_us(self.latencies)}


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


@attrs.define(eq=False)
class Window:
    """What the brokers did while one phase ran: heartbeats by controller, polls, the
    driver's own lateness, and the sampler's readings."""

    heartbeats: dict[str, Tally] = attrs.field(factory=dict)
    polls: Tally = attrs.field(factory=Tally)
    in_flight: int = 0
    #: how far behind its schedule a heartbeat left this process (the driver's own delay)
    behind_max: float = 0.0
    #: sampler: readings, members shown dead while heartbeating, least live brokers seen
    samples: int = 0
    dead_members_seen: int = 0
    dead_examples: list[str] = attrs.field(factory=list)
    brokers_alive_min: dict[str, float] = attrs.field(factory=dict)

    def tally(self, controller: str) -> Tally:
        tally = self.heartbeats.get(controller)
        if tally is None:
            tally = self.heartbeats[controller] = Tally()
        return tally

    async def drained(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every request sent in the window is answered."""
        with trio.move_on_after(timeout):
            await poll_until(lambda: not self.in_flight, interval=0.01)


@attrs.frozen
class Notice:
    """A NOTIFY_BROKER_ROLE_CHANGED as one simulated broker received it."""

    at: float
    target: str
    header: NotifyBrokerRoleChangedRequestHeader


# ---- the simulated brokers ---------------------------------------------------------------------


@attrs.define(eq=False)
class SimBroker:
    group: SimGroup
    broker_id: int
    #: where its NOTIFY_BROKER_ROLE_CHANGED arrive (a listener of its own)
    address: str
    #: one connection per controller, by controller name
    clients: dict[str, RemotingClient] = attrs.field(factory=dict)
    heartbeating: bool = False
    #: the epoch and log end its heartbeats report
    epoch: int = 0
    max_offset: int = 0
    last_sent: float = float("-inf")
    _heartbeat: RemotingCommand | None = None

    def heartbeat_command(self, timeout_ms: int) -> RemotingCommand:
        """The heartbeat, encoded once per epoch (the figures it carries change only then)."""
        command = self._heartbeat
        if command is None:
            header = BrokerHeartbeatRequestHeader(
                cluster_name=CLUSTER, broker_addr=self.address, broker_name=self.group.name,
                broker_id=self.broker_id, epoch=self.epoch, max_offset=self.max_offset,
                confirm_offset=self.max_offset, heartbeat_timeout_mills=timeout_ms)
            command = self._heartbeat = RemotingCommand.request(
                RequestCode.BROKER_HEARTBEAT, SPECS[BrokerHeartbeatRequestHeader].encode(header))
        return command

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self._heartbeat = None


@attrs.define(eq=False)
class SimGroup:
    name: str
    brokers: dict[int, SimBroker] = attrs.field(factory=dict)
    master_id: int | None = None
    master_epoch: int = 0
    sync_set: frozenset[int] = frozenset()
    sync_epoch: int = 0
    #: used by an election round already (each round takes fresh groups)
    used: bool = False


class BenchError(TrioHAError, RuntimeError):
    """The controller answered a set-up request with an error: the run cannot go on."""


@attrs.define(eq=False)
class Fleet:
    """The simulated brokers and the controllers they talk to (names -> addresses)."""

    nursery: trio.Nursery
    controllers: dict[str, str]
    leader: str
    plan: ControllerPlan
    groups: list[SimGroup] = attrs.field(factory=list)
    by_address: dict[str, SimBroker] = attrs.field(factory=dict)
    interval: float = HEARTBEAT_INTERVAL
    #: heartbeats one way, as real brokers send them (no latency then)
    oneway: bool = False
    paused: bool = False
    window: Window = attrs.field(factory=Window)
    notices: list[Notice] = attrs.field(factory=list)
    setup: dict[str, Tally] = attrs.field(factory=dict)
    admin: RemotingClient | None = None

    # ---- connections and requests ----

    async def connect(self, name: str) -> RemotingClient:
        address = self.controllers[name]
        host, port = address.rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        client = RemotingClient(address, stream)
        await self.nursery.start(client.run)
        return client

    async def call(self, client: RemotingClient, code: RequestCode, header: object = None,
                   body: bytes = b"", *, tally: Tally | None = None,
                   ok: tuple[int, ...] = (ResponseCode.SUCCESS,)) -> RemotingCommand:
        """A request; BenchError unless its answer's code is one of ``ok``."""
        fields = SPECS[type(header)].encode(header) if header is not None else None
        request = RemotingCommand.request(code, fields, body)
        if tally is None:
            tally = self.setup.setdefault(code.name, Tally())
        tally.sent += 1
        started = time.perf_counter_ns()
        try:
            response = await client.invoke(request, REQUEST_TIMEOUT)
        except RemotingError as exc:
            count(tally.failed, type(exc).__name__)
            raise BenchError(f"{code.name}: {exc}") from exc
        tally.latencies.append(time.perf_counter_ns() - started)
        if response.code not in ok:
            count(tally.refused, _code_name(response.code))
            raise BenchError(f"{code.name} answered {_code_name(response.code)}: "
                             f"{response.remark}")
        tally.ok += 1
        return response

    # ---- the notices ----

    async def on_request(self, request: RemotingCommand, connection: RemotingConnection
                         ) -> RemotingCommand | None:
        await trio.lowlevel.checkpoint()
        if request.code != RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            return RemotingCommand.response_to(request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED)
        now = trio.current_time()
        try:
            header = SPECS[NotifyBrokerRoleChangedRequestHeader].decode(request)
        except WireError:
            return None
        socket = getattr(connection.stream, "socket", None)
        target = "?"
        if socket is not None:
            host, port = socket.getsockname()[:2]
            target = f"{host}:{port}"
        self.notices.append(Notice(now, target, header))
        return None if request.is_oneway else RemotingCommand.response_to(
            request, ResponseCode.SUCCESS)

    # ---- registration ----

    async def register_group(self, group: SimGroup) -> None:
        """Members 1..3 join one after another as real brokers of one set starting
        together would (the first elects itself); then the master reports all three in
        sync."""
        for broker in list(group.brokers.values()):
            await self.register(broker)
        master = group.brokers[group.master_id] if group.master_id is not None else None
        if master is None:
            raise BenchError(f"set {group.name} has no master after its members registered")
        await self.alter_to_all(group)

    async def register(self, broker: SimBroker) -> None:
        group = broker.group
        for name in self.controllers:
            broker.clients[name] = await self.connect(name)
        leader = broker.clients[self.leader]
        response = await self.call(leader, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                   GetNextBrokerIdRequestHeader(CLUSTER, group.name))
        next_id = SPECS[GetNextBrokerIdResponseHeader].decode(response).next_broker_id
        if next_id != broker.broker_id:
            raise BenchError(f"set {group.name}: next broker id {next_id}, expected "
                             f"{broker.broker_id}")
        await self.call(leader, RequestCode.CONTROLLER_APPLY_BROKER_ID,
                        ApplyBrokerIdRequestHeader(
                            CLUSTER, group.name, broker.broker_id,
                            f"{broker.address};{int(time.time() * 1000)}"))
        await self.register_again(broker)
        if group.master_id is None:
            response = await self.call(
                leader, RequestCode.CONTROLLER_ELECT_MASTER,
                ElectMasterRequestHeader(CLUSTER, group.name, broker.broker_id, False,
                                         int(time.time() * 1000)),
                ok=(ResponseCode.SUCCESS, ResponseCode.CONTROLLER_MASTER_STILL_EXIST))
            header = SPECS[ElectMasterResponseHeader].decode(response)
            master_id = header.master_broker_id
            if master_id is None:
                raise BenchError(f"set {group.name}: no master elected")
            group.master_id = master_id
            group.master_epoch = header.master_epoch or 0
            group.sync_set = frozenset({master_id})
            group.sync_epoch = header.sync_state_set_epoch or 0
        broker.set_epoch(group.master_epoch)
        self.nursery.start_soon(self._heartbeat_loop, broker)
        self.nursery.start_soon(self._poll_loop, broker)

    async def register_again(self, broker: SimBroker) -> None:
        """REGISTER_BROKER and one heartbeat to every controller, answered (the broker is
        alive to the controllers when this returns), and its heartbeats on from now."""
        group = broker.group
        response = await self.call(
            broker.clients[self.leader], RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterBrokerToControllerRequestHeader(CLUSTER, group.name, broker.broker_id,
                                                    broker.address, int(time.time() * 1000)))
        header = SPECS[RegisterBrokerToControllerResponseHeader].decode(response)
        if header.master_broker_id is not None and group.master_id is None:
            group.master_id = header.master_broker_id
        # One heartbeat, answered, to the leader (a follower may not know the set yet: it
        # reads the records every 0.5 s); the broker's schedule sends the rest.
        tally = self.setup.setdefault("BROKER_HEARTBEAT", Tally())
        tally.sent += 1
        started = time.perf_counter_ns()
        broker.last_sent = trio.current_time()
        try:
            answer = await broker.clients[self.leader].invoke(
                broker.heartbeat_command(self.plan.heartbeat_timeout_ms), REQUEST_TIMEOUT)
        except RemotingError as exc:
            count(tally.failed, type(exc).__name__)
            raise BenchError(f"BROKER_HEARTBEAT: {exc}") from exc
        tally.latencies.append(time.perf_counter_ns() - started)
        if answer.code != ResponseCode.SUCCESS:
            count(tally.refused, _code_name(answer.code))
            raise BenchError(f"BROKER_HEARTBEAT answered {_code_name(answer.code)}: "
                             f"{answer.remark}")
        tally.ok += 1
        broker.heartbeating = True

    async def alter_to_all(self, group: SimGroup) -> None:
        """The master proposes every member in sync (ALTER_SYNC_STATE_SET)."""
        assert group.master_id is not None
        proposal = SyncStateSet(frozenset(group.brokers), group.sync_epoch)
        master = group.brokers[group.master_id]
        response = await self.call(
            master.clients[self.leader], RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
            AlterSyncStateSetRequestHeader(group.name, group.master_id, group.master_epoch,
                                           int(time.time() * 1000)),
            proposal.encode())
        header = SPECS[AlterSyncStateSetResponseHeader].decode(response)
        group.sync_set = proposal.members
        group.sync_epoch = header.new_sync_state_set_epoch

    # ---- steady state ----

    async def _heartbeat_loop(self, broker: SimBroker) -> None:
        """Heartbeats on a fixed schedule (a random phase, then every ``interval``), each a
        task of its own so that a slow answer never delays the next beat (a real broker's
        are one way)."""
        interval = self.interval
        next_at = trio.current_time() + random.random() * interval
        while True:  # until the fleet's nursery is cancelled; each round sleeps
            await trio.sleep_until(next_at)
            now = trio.current_time()
            window = self.window
            window.behind_max = max(window.behind_max, now - next_at)
            if self.interval != interval:
                # a new schedule: a new random phase (the old phases, squeezed into a tenth
                # of the interval, would make 300 brokers beat in one burst)
                interval = self.interval
                next_at = now + random.random() * interval
                continue
            # A beat missed (this process fell behind) is skipped, the phase kept: catching
            # up with ``now`` would line every late broker up on the same instant.
            next_at += interval * max(1, int((now - next_at) / interval) + 1)
            if not broker.heartbeating or self.paused:
                continue
            broker.last_sent = now
            command = broker.heartbeat_command(self.plan.heartbeat_timeout_ms)
            for name, client in broker.clients.items():
                if client.closed:
                    continue
                if self.oneway:  # as a real broker sends them: no answer to wait for
                    tally = window.tally(name)
                    tally.sent += 1
                    try:
                        await client.invoke_oneway(command)
                    except RemotingError as exc:
                        count(tally.failed, type(exc).__name__)
                    continue
                window.in_flight += 1
                self.nursery.start_soon(self._one_heartbeat, window, name, client, command)

    async def _one_heartbeat(self, window: Window, name: str, client: RemotingClient,
                             command: RemotingCommand) -> None:
        tally = window.tally(name)
        tally.sent += 1
        started = time.perf_counter_ns()
        try:
            response = await client.invoke(command, REQUEST_TIMEOUT)
        except RemotingError as exc:
            if not client.closed:  # a connection closed on purpose (a killed master) is none
                count(tally.failed, type(exc).__name__)
            else:
                tally.sent -= 1
            return
        finally:
            window.in_flight -= 1
        tally.latencies.append(time.perf_counter_ns() - started)
        if response.code == ResponseCode.SUCCESS:
            tally.ok += 1
        else:
            count(tally.refused, _code_name(response.code))

    async def _poll_loop(self, broker: SimBroker) -> None:
        """GET_REPLICA_INFO every syncBrokerMetadataPeriod, as brokers poll."""
        await trio.sleep(random.random() * POLL_PERIOD)
        while True:  # until cancelled; each round sleeps POLL_PERIOD
            client = broker.clients.get(self.leader)
            if broker.heartbeating and not self.paused and client is not None \
                    and not client.closed:
                window = self.window
                window.in_flight += 1
                try:
                    await self.call(client, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                    GetReplicaInfoRequestHeader(broker.group.name),
                                    tally=window.polls)
                except BenchError:
                    pass  # counted in the tally
                finally:
                    window.in_flight -= 1
            await trio.sleep(POLL_PERIOD)

    async def sample(self, processes: dict[str, ControllerProcess]) -> None:
        """Every SAMPLE_PERIOD until cancelled: the leader's view of every member's
        liveness, and each controller's count of live brokers."""
        assert self.admin is not None
        names = [g.name for g in self.groups]
        body = encode_broker_names(names)
        while True:  # until cancelled; each round sleeps SAMPLE_PERIOD
            await trio.sleep(SAMPLE_PERIOD)
            window = self.window
            expected = {(b.group.name, b.broker_id) for g in self.groups
                        for b in g.brokers.values() if b.heartbeating}
            try:
                response = await self.admin.invoke(RemotingCommand.request(
                    RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, body=body), REQUEST_TIMEOUT)
                table = BrokerReplicasInfo.decode(response.body).replicas_info_table
            except (RemotingError, WireError):
                continue
            window.samples += 1
            for name, info in table.items():
                for replica in (*info.in_sync_replicas, *info.not_in_sync_replicas):
                    if not replica.alive and (name, replica.broker_id) in expected:
                        window.dead_members_seen += 1
                        if len(window.dead_examples) < 5:
                            window.dead_examples.append(f"{name}/{replica.broker_id}")
            for cname, process in processes.items():
                try:
                    metrics = await trio.to_thread.run_sync(scrape, process.metrics_url)
                except OSError:
                    continue
                alive = metrics.get("trio_ha_controller_brokers_alive")
                if alive is not None:
                    previous = window.brokers_alive_min.get(cname)
                    window.brokers_alive_min[cname] = (alive if previous is None
                                                       else min(previous, alive))


# ---- the run -----------------------------------------------------------------------------------


def _controller(directory: str | None, plan: ControllerPlan, store: str) -> Iterator[dict]:
    begun = time.perf_counter()
    with scratch_directory(directory, "controller") as scratch, contextlib.ExitStack() as stack:
        yield {
            "bench": "controller.config", **config_fields(plan, scratch), "store": store,
            "groups": plan.groups, "replicas": REPLICAS, "brokers": plan.groups * REPLICAS,
            "heartbeat_interval_s": HEARTBEAT_INTERVAL,
            "heartbeat_timeout_ms": plan.heartbeat_timeout_ms, "poll_period_s": POLL_PERIOD,
            "steady_seconds": plan.steady_seconds, "oneway_seconds": plan.oneway_seconds,
            "stress_interval_s": plan.stress_interval,
            "stress_seconds": plan.stress_seconds, "quiet_seconds": plan.quiet_seconds,
            "election_rounds": [list(r) for r in plan.rounds],
            "note": "controllers: `trio-ha controller -c` child processes; brokers: simulated "
                    "in this process (one connection per broker per controller, a listener "
                    "each for role-change notices); heartbeats are two-way so that each has "
                    "an answer to time (a real broker's are one way)",
        }
        started = time.perf_counter()
        pids: dict[str, int] = {}
        if store == "etcd":
            etcd = stack.enter_context(EtcdCluster.start(os.path.join(scratch.base, "etcd")))
            for index, member in enumerate(etcd.members):
                assert member.pid is not None
                pids[f"etcd{index}"] = member.pid
            properties = [{"controllerType": "etcd",
                           "controllerEtcdEndpoints": ",".join(etcd.endpoints),
                           "controllerDLegerSelfId": f"n{index}"} for index in range(2)]
        else:
            properties = [{"controllerType": "journal",
                           "controllerStorePath": os.path.join(scratch.base, "ctl0")}]
        processes: dict[str, ControllerProcess] = {}
        for index, props in enumerate(properties):
            process = ControllerProcess.start(f"ctl{index}", props, scratch.base, scratch.logs)
            stack.callback(process.stop)
            processes[process.name] = process
        yield {"bench": "controller.start", **common_fields(plan.quick), "store": store,
               "controllers": {name: p.addr for name, p in processes.items()},
               "etcd_members": 3 if store == "etcd" else 0,
               "seconds": time.perf_counter() - started}
        results: list[dict] = []
        try:
            trio_run(_drive, plan, store, processes, pids, results)
        finally:
            yield from results
        for process in processes.values():
            process.check()
        summary = _summary(plan, store, results)
        summary["total_seconds"] = time.perf_counter() - begun
        summary["loadavg"] = os.getloadavg()
        yield summary


async def _find_leader(processes: dict[str, ControllerProcess]) -> str:
    """The name of the controller that leads (GET_METADATA_INFO), within 30 s."""
    with trio.fail_after(30):
        while True:  # bounded by the scope; each round sleeps
            for name, process in processes.items():
                host, port = process.addr.rsplit(":", 1)
                try:
                    stream = await trio.open_tcp_stream(host, int(port))
                except OSError:
                    continue
                async with trio.open_nursery() as nursery:
                    client = RemotingClient(process.addr, stream)
                    await nursery.start(client.run)
                    try:
                        response = await client.invoke(RemotingCommand.request(
                            RequestCode.CONTROLLER_GET_METADATA_INFO), REQUEST_TIMEOUT)
                        header = SPECS[GetMetaDataResponseHeader].decode(response)
                    except (RemotingError, WireError):
                        header = None
                    await client.aclose()
                    nursery.cancel_scope.cancel()
                if header is not None and header.is_leader:
                    return name
            await trio.sleep(0.1)


async def _drive(plan: ControllerPlan, store: str, processes: dict[str, ControllerProcess],
                 extra_pids: dict[str, int], results: list[dict]) -> None:
    common = {**common_fields(plan.quick), "store": store, "groups": plan.groups}
    leader = await _find_leader(processes)
    roles = {name: ("leader" if name == leader else "follower") for name in processes}
    pids = {roles[name]: p.pid for name, p in processes.items()} | extra_pids

    async def metrics() -> dict[str, dict[str, float]]:
        return {roles[name]: await trio.to_thread.run_sync(scrape, p.metrics_url)
                for name, p in processes.items()}

    async def quiet(label: str, fleet: Fleet | None) -> None:
        """Nothing arriving: what the controllers spend by themselves."""
        if fleet is not None:
            fleet.paused = True
        await trio.sleep(0.3)
        cpu = CpuMeter(pids)
        await trio.sleep(plan.quiet_seconds)
        cores = cpu.cores()
        if fleet is not None:
            fleet.paused = False
        result = {"bench": "controller.quiet", **common, "phase": label,
                  "sets_known": 0 if fleet is None else len(fleet.groups),
                  "seconds": plan.quiet_seconds, "cpu_cores": cores,
                  "note": "heartbeats and polls paused (for less than the timeout): the "
                          "controllers' own work; with etcd the follower reads every record "
                          f"again every {FOLLOW_INTERVAL} s"}
        follower = cores.get("follower")
        if follower is not None:
            result["follower_cpu_ms_per_follow_round"] = follower * FOLLOW_INTERVAL * 1000
        results.append(result)

    await quiet("before-setup", None)

    async with trio.open_nursery() as nursery:
        fleet = Fleet(nursery, {name: p.addr for name, p in processes.items()}, leader, plan)
        # the brokers' notice listeners: one port each, served by one server
        listeners: list[trio.SocketListener] = []
        for index in range(plan.groups):
            group = SimGroup(f"bench-ctl-{index:03d}")
            for broker_id in range(1, REPLICAS + 1):
                bound = await trio.open_tcp_listeners(0, host="127.0.0.1")
                listeners.extend(bound)
                port = bound[0].socket.getsockname()[1]
                broker = SimBroker(group, broker_id, f"127.0.0.1:{port}",
                                   max_offset=1_000_000 * broker_id)
                group.brokers[broker_id] = broker
                fleet.by_address[broker.address] = broker
            fleet.groups.append(group)
        await nursery.start(functools.partial(RemotingServer(fleet.on_request).serve,
                                              listeners=listeners))
        fleet.admin = await fleet.connect(leader)

        # -- setup
        started = time.perf_counter()
        limiter = trio.CapacityLimiter(SETUP_CONCURRENCY)
        failures: list[str] = []

        async def join(group: SimGroup) -> None:
            async with limiter:
                try:
                    await fleet.register_group(group)
                except BenchError as exc:
                    failures.append(str(exc))

        async with trio.open_nursery() as joining:
            for group in fleet.groups:
                joining.start_soon(join, group)
        setup_seconds = time.perf_counter() - started
        results.append({
            "bench": "controller.setup", **common,
            "brokers": sum(len(g.brokers) for g in fleet.groups),
            "masters": sum(1 for g in fleet.groups if g.master_id is not None),
            "sets_of_three_in_sync": sum(1 for g in fleet.groups
                                         if len(g.sync_set) == REPLICAS),
            "seconds": setup_seconds, "failures": len(failures),
            "errors_sample": failures[:3] or None,
            "requests": {code: tally.result() for code, tally in fleet.setup.items()},
            "note": f"{SETUP_CONCURRENCY} groups at a time; in each, members 1, 2, 3 one "
                    "after another (GET_NEXT_BROKER_ID, APPLY_BROKER_ID, REGISTER_BROKER, a "
                    "heartbeat, ELECT_MASTER for the first), then ALTER_SYNC_STATE_SET",
        })
        if failures:
            raise BenchError(f"{len(failures)} groups failed to register: {failures[0]}")
        await trio.sleep(max(1.0, 2 * FOLLOW_INTERVAL))  # followers have read the sets

        # -- heartbeats held: the real interval, then ten times as often
        for label, interval, seconds, oneway in (
                ("steady", HEARTBEAT_INTERVAL, plan.steady_seconds, False),
                ("steady-oneway", HEARTBEAT_INTERVAL, plan.oneway_seconds, True),
                ("stress", plan.stress_interval, plan.stress_seconds, False)):
            fleet.interval, fleet.oneway = interval, oneway
            await trio.sleep(HEARTBEAT_INTERVAL)  # every broker on the new schedule
            results.append(await _heartbeat_phase(fleet, processes, roles, pids, metrics,
                                                  common, label, seconds))
            fleet.interval, fleet.oneway = HEARTBEAT_INTERVAL, False
        await trio.sleep(HEARTBEAT_INTERVAL)

        await quiet("with-sets", fleet)

        # -- elections
        for how, k in plan.rounds:
            for process in processes.values():
                process.check()
            results.append(await _election_round(fleet, pids, metrics, common, how, k))

        nursery.cancel_scope.cancel()


async def _heartbeat_phase(fleet: Fleet, processes: dict[str, ControllerProcess],
                           roles: dict[str, str], pids: dict[str, int],
                           metrics: Callable[[], Awaitable[dict[str, dict[str, float]]]],
                           common: dict, label: str, seconds: float) -> dict:
    # the counters first: every heartbeat of the window then arrives after this reading
    before = await metrics()
    window = fleet.window = Window()
    notices_before = len(fleet.notices)
    cpu = CpuMeter(pids)
    started = time.perf_counter()
    async with trio.open_nursery() as sampling:
        sampling.start_soon(fleet.sample, {roles[n]: p for n, p in processes.items()})
        await trio.sleep(seconds)
        sampling.cancel_scope.cancel()
    elapsed = time.perf_counter() - started
    cores = cpu.cores()
    fleet.window = Window()  # heartbeats sent from now on belong to no phase
    # what the controllers received during the phase (for the rate and CPU per heartbeat),
    # and, once every answer of the phase is in, what they received by then (at least every
    # heartbeat they answered; it counts the next heartbeats too)
    at_end = await metrics()
    await window.drained(REQUEST_TIMEOUT + 1)
    after = await metrics()
    heartbeats = "trio_ha_controller_heartbeats"
    heartbeating = sum(1 for g in fleet.groups for b in g.brokers.values() if b.heartbeating)
    by_controller: dict[str, dict] = {}
    for name, tally in window.heartbeats.items():
        role = roles[name]
        in_phase = at_end[role].get(heartbeats, 0.0) - before[role].get(heartbeats, 0.0)
        received = after[role].get(heartbeats, 0.0) - before[role].get(heartbeats, 0.0)
        core = cores.get(role)
        lat = tally.latencies
        interval_ns = int(HEARTBEAT_INTERVAL * 1e9)  # late: the broker's next beat was due
        by_controller[role] = {
            **tally.result(), "held_per_s": (in_phase if fleet.oneway else tally.ok) / elapsed,
            "received_in_phase": in_phase, "received_by_controller": received,
            "late_over_100ms": sum(1 for v in lat if v > 100_000_000),
            "late_over_interval": sum(1 for v in lat if v > interval_ns),
            "brokers_alive_min": window.brokers_alive_min.get(role),
            "cpu_us_per_heartbeat": (core * elapsed / in_phase * 1e6
                                     if core is not None and in_phase else None),
        }
    own_elections = {role: after[role].get("trio_ha_controller_own_elections", 0.0)
                     - before[role].get("trio_ha_controller_own_elections", 0.0)
                     for role in after}
    interval = fleet.interval
    return {
        "bench": "controller.heartbeats", **common, "phase": label, "oneway": fleet.oneway,
        "interval_s": interval, "brokers_heartbeating": heartbeating,
        "offered_per_s": heartbeating * len(fleet.controllers) / interval,
        "held_per_s": sum(c["held_per_s"] for c in by_controller.values()),
        "seconds": elapsed, "by_controller": by_controller,
        "polls": window.polls.result(),
        "driver_behind_max_ms": window.behind_max * 1000,
        "liveness_samples": window.samples,
        "members_seen_dead": window.dead_members_seen,
        "dead_examples": window.dead_examples or None,
        "own_elections": own_elections,
        "notices_received": len(fleet.notices) - notices_before,
        "cpu_cores": cores,
        "note": "held_per_s: heartbeats answered SUCCESS per second (all controllers; one-way "
                "heartbeats: as counted by the controllers, and no latency); "
                "latency: send to answer (the table is updated before the answer is made); "
                "late_over_interval: answers slower than the 1 s broker interval; "
                "members_seen_dead: members the leader showed dead (GET_SYNC_STATE_DATA every "
                f"{SAMPLE_PERIOD:g} s) while they heartbeat; own_elections and "
                "notices_received: elections while every master heartbeats (spurious); "
                "cpu_us_per_heartbeat: the controller's CPU over the phase (polls and "
                "samples included) per heartbeat it received",
    }


async def _election_round(fleet: Fleet, pids: dict[str, int],
                          metrics: Callable[[], Awaitable[dict[str, dict[str, float]]]],
                          common: dict, how: str, k: int) -> dict:
    """Stop the masters of ``k`` fresh groups at once (``close``: their connections;
    ``silent``: their heartbeats) and time each group's new master."""
    assert fleet.admin is not None
    admin = fleet.admin
    plan = fleet.plan
    targets = [g for g in fleet.groups if not g.used
               and len(g.sync_set) == REPLICAS][:k]
    window = fleet.window = Window()
    before = await metrics()
    notices_before = len(fleet.notices)
    old = {g.name: (g.master_id, g.master_epoch, g.sync_set) for g in targets}
    #: per group: when its master counts as gone (close: now; silent: its timeout ran out)
    gone_at: dict[str, float] = {}
    cpu = CpuMeter(pids)
    round_started = time.perf_counter()
    for group in targets:
        group.used = True
        assert group.master_id is not None
        group.brokers[group.master_id].heartbeating = False
    if how == "close":
        now = trio.current_time()
        for group in targets:
            assert group.master_id is not None
            for client in group.brokers[group.master_id].clients.values():
                await client.aclose()
            gone_at[group.name] = now
    else:
        for group in targets:
            assert group.master_id is not None
            gone_at[group.name] = (group.brokers[group.master_id].last_sent
                                   + plan.heartbeat_timeout_ms / 1000)
    readable: dict[str, tuple[float, GetReplicaInfoResponseHeader, SyncStateSet | None]] = {}
    #: per group: when the last poll that still showed the old master was sent
    still_old: dict[str, float] = {}

    async def watch(group: SimGroup) -> None:
        old_master, old_epoch, _ = old[group.name]
        await trio.sleep_until(gone_at[group.name] - 0.3)
        request = RemotingCommand.request(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            SPECS[GetReplicaInfoRequestHeader].encode(GetReplicaInfoRequestHeader(group.name)))
        with trio.move_on_at(gone_at[group.name] + ELECTION_BOUND):
            while True:  # bounded by the scope; each round sleeps ELECTION_POLL
                sent = trio.current_time()
                try:
                    response = await admin.invoke(request, REQUEST_TIMEOUT)
                except RemotingError:
                    response = None
                if response is not None and response.code == ResponseCode.SUCCESS:
                    header = SPECS[GetReplicaInfoResponseHeader].decode(response)
                    if (header.master_epoch or 0) > old_epoch and header.master_broker_id \
                            not in (None, old_master):
                        body = SyncStateSet.decode(response.body) if response.body else None
                        readable[group.name] = (trio.current_time(), header, body)
                        return
                    still_old[group.name] = sent
                await trio.sleep(ELECTION_POLL)

    async with trio.open_nursery() as watching:
        for group in targets:
            watching.start_soon(watch, group)
    # CPU over a round of a few milliseconds is clock-tick noise: only for the long ones
    cores = cpu.cores() if time.perf_counter() - round_started >= 1 else None
    await trio.sleep(0.2)  # the last notices land
    after = await metrics()

    readable_ms: list[float] = []
    #: the new master became readable after this (the last poll that showed the old one)
    readable_after_ms: list[float] = []
    notified_ms: list[float] = []
    in_sync = 0
    for group in targets:
        seen = readable.get(group.name)
        if seen is None:
            continue
        at, header, body = seen
        readable_ms.append((at - gone_at[group.name]) * 1000)
        readable_after_ms.append(
            max(0.0, still_old.get(group.name, gone_at[group.name]) - gone_at[group.name])
            * 1000)
        new_master = header.master_broker_id
        assert new_master is not None
        _, _, old_set = old[group.name]
        if new_master in old_set and group.brokers[new_master].heartbeating:
            in_sync += 1
        new_address = group.brokers[new_master].address
        arrived = [n.at for n in fleet.notices[notices_before:]
                   if n.target == new_address and n.header.master_broker_id == new_master
                   and (n.header.master_epoch or 0) == header.master_epoch]
        if arrived:
            notified_ms.append((min(arrived) - gone_at[group.name]) * 1000)
        group.master_id = new_master
        group.master_epoch = header.master_epoch or 0
        if body is not None:
            group.sync_set, group.sync_epoch = body.members, body.epoch

    # the old masters come back as slaves; the new masters report the set of three again
    restored = 0

    async def restore(group: SimGroup) -> None:
        nonlocal restored
        old_id = old[group.name][0]
        assert old_id is not None
        old_master = group.brokers[old_id]
        try:
            if how == "close":
                for name in fleet.controllers:
                    old_master.clients[name] = await fleet.connect(name)
            for broker in group.brokers.values():
                broker.set_epoch(group.master_epoch)
            await fleet.register_again(old_master)
            await fleet.alter_to_all(group)
        except BenchError:
            return
        restored += 1

    async with trio.open_nursery() as restoring:
        for group in targets:
            if group.name in readable:
                restoring.start_soon(restore, group)
    fleet.window = Window()
    await window.drained(REQUEST_TIMEOUT + 1)

    def delta(role: str, series: str) -> float:
        return after[role].get(series, 0.0) - before[role].get(series, 0.0)

    ordered = sorted(readable_ms)
    heartbeats = Tally()
    for tally in window.heartbeats.values():
        heartbeats.sent += tally.sent
        heartbeats.ok += tally.ok
        heartbeats.latencies.extend(tally.latencies)
        for key, n in (*tally.refused.items(), *tally.failed.items()):
            heartbeats.failed[key] = heartbeats.failed.get(key, 0) + n
    return {
        "bench": "controller.election", **common, "how": how, "masters_stopped": k,
        "groups": len(targets), "elected": len(readable_ms),
        "elected_from_live_in_sync": in_sync, "notified": len(notified_ms),
        "restored": restored,
        "readable_ms": {"p50": percentile(ordered, 0.5), "max": ordered[-1] if ordered else None,
                        "all": ordered},
        "readable_after_ms": {"p50": percentile(sorted(readable_after_ms), 0.5),
                              "max": max(readable_after_ms) if readable_after_ms else None},
        "notified_new_master_ms": {"p50": percentile(sorted(notified_ms), 0.5),
                                   "max": max(notified_ms) if notified_ms else None},
        "controller_elections": {role: delta(role, "trio_ha_controller_own_elections")
                                 for role in after},
        "commits": {role: delta(role, "trio_ha_controller_commits") for role in after},
        "heartbeats_meanwhile": {"sent": heartbeats.sent, "ok": heartbeats.ok,
                                 "not_ok": heartbeats.failed or None,
                                 "latency_us": latency_us(heartbeats.latencies)},
        "cpu_cores": cores, "poll_interval_ms": ELECTION_POLL * 1000,
        "note": ("readable_ms: from closing the masters' connections (a crash) "
                 if how == "close" else
                 "readable_ms: from the moment the silent master's timeout ran out (its last "
                 "heartbeat's send time + the timeout) ")
                + "until GET_REPLICA_INFO shows the new master (polled every "
                  f"{ELECTION_POLL * 1000:g} ms: readable_after_ms is when the last poll "
                  "that still showed the old master was sent, a lower bound); "
                  "notified_new_master_ms: until the NOTIFY_BROKER_ROLE_CHANGED reached the "
                  "new master",
    }


def _summary(plan: ControllerPlan, store: str, results: list[dict]) -> dict:
    """Issue 39's target, met or not: at the real interval no heartbeat answered later than
    one interval, no member shown dead, no controller election while the masters heartbeat."""
    steady = next((r for r in results if r["bench"] == "controller.heartbeats"
                   and r["phase"] == "steady"), None)
    oneway = next((r for r in results if r["bench"] == "controller.heartbeats"
                   and r["phase"] == "steady-oneway"), None)
    elections = [r for r in results if r["bench"] == "controller.election"]
    summary: dict = {"bench": "controller.summary", **common_fields(plan.quick),
                     "store": store, "groups": plan.groups}
    if steady is not None:
        late = sum(c["late_over_interval"] for c in steady["by_controller"].values())
        failed = sum(c["failed"] + c["refused"] for c in steady["by_controller"].values())
        spurious = sum(steady["own_elections"].values()) + steady["notices_received"]
        summary.update({
            "target": "groups heartbeat at the broker interval with no heartbeat answered later "
                      "than the interval, none refused or lost, no member shown dead and no "
                      "election",
            "held_per_s": steady["held_per_s"], "offered_per_s": steady["offered_per_s"],
            "heartbeat_p99_us": {role: c["latency_us"]["p99"]
                                 for role, c in steady["by_controller"].items()},
            "heartbeat_max_us": {role: c["latency_us"]["max"]
                                 for role, c in steady["by_controller"].items()},
            "late": late, "failed_or_refused": failed,
            "members_seen_dead": steady["members_seen_dead"], "spurious_elections": spurious,
            "cpu_us_per_heartbeat": {role: c["cpu_us_per_heartbeat"]
                                     for role, c in steady["by_controller"].items()},
            "cpu_us_per_oneway_heartbeat": None if oneway is None else {
                role: c["cpu_us_per_heartbeat"] for role, c in oneway["by_controller"].items()},
            "meets": (late == 0 and failed == 0 and steady["members_seen_dead"] == 0
                      and spurious == 0),
        })
    summary["election_readable_ms"] = {
        f"{r['how']} x{r['masters_stopped']}": r["readable_ms"]["max"] for r in elections}
    summary["elections_complete"] = all(r["elected"] == r["groups"] for r in elections)
    return summary
