"""The broker's state, as every request processor sees it: one object, complete when built.

A ``Broker`` holds what serving a request needs — the configuration, the open store, the loaded
metadata tables, the addresses it serves on, its registration with the name servers, the
clients connected to it and its counters. ``serve_broker`` (``trio_ha.broker.serve``) opens the
store and loads the metadata first and only then builds the Broker, so no processor ever sees
a broker without its store; the processors (``send``, ``pull``, ``admin``) take it as their
first argument, and ``dispatch`` routes requests to them.

Its role may change while it serves (``change_to_master`` / ``change_to_slave``: RocketMQ 5's
controller mode, spec ``controller-mode.md`` §2.4). What only a role runs — a master's delay
schedule and transaction check, a slave's metadata sync — runs in a ``RoleScope`` of the
broker's nursery, so leaving the role cancels exactly that; the store changes its own role
(``trio_ha.store.roles``); and the broker registers at once with its new id and the master
epoch as its state version. Whether the broker is a slave is the store's role, read where a
request is served: a send that reaches a broker that stopped being the master gets the
slave's answer (SERVICE_NOT_AVAILABLE, as a RocketMQ 4.x/5.x slave's store answers it).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio

from ..config import BrokerRole
from ..remoting import RemotingConnection
from ..store import MessageStore, PutMessageResult, RoleChangeError, RoleScope, SyncState
from ..wire import layout
from ..wire.metadata import TopicConfig
from ..wire.remoting import SendMessageRequestHeader
from .clients import ClientManager
from .config import BrokerConfig
from .controller.link import ControllerLink
from .metadata import BrokerMetadata
from .queue_locks import QueueLockManager
from .registration import MASTER_ID, Registration
from .schedule import ScheduleService
from .slave_sync import SlaveSync, sync_from_master
from .transactions import TransactionCheck

__all__ = ["TPS_WINDOWS", "Broker", "BrokerAddresses", "BrokerStats", "RateCounter"]

log = logging.getLogger(__name__)

#: how long a slave becoming master tries to copy the old master's metadata one last time
LAST_SYNC_TIMEOUT = 2.0
#: the windows (seconds) of the throughput figures GET_BROKER_RUNTIME_INFO reports, as
#: RocketMQ's StoreStatsService: "putTps" is "<last 10 s> <last 60 s> <last 600 s>"
TPS_WINDOWS = (10, 60, 600)


@attrs.frozen
class BrokerAddresses:
    #: where clients connect (brokerIP1:listenPort)
    broker_addr: str
    #: RocketMQ's VIP channel (listenPort - 2), or None
    vip_addr: str | None
    #: where slaves connect for replication, or None
    ha_addr: str | None
    #: the Prometheus endpoint (``metricsPort``), or None
    metrics_addr: str | None = None


@attrs.define(eq=False)
class RateCounter:
    """A count that only rises, and how fast it rose over each of the last ``TPS_WINDOWS``.

    Counting is an addition and a clock read. The history is one mark per second in which
    something was counted — the total just before that second's first event — so an idle
    counter keeps no marks, and its rates fall to 0 once its last events are older than the
    window (RocketMQ samples every counter every second in a thread; a rate of the last N
    events, as we had, showed an idle broker's old rate forever). The rate over W seconds is
    exact over [floor(now) - W, now], a span of W to W + 1 seconds, or over the counter's life
    when that is shorter."""

    clock: Callable[[], float]
    total: int = 0
    #: (second, total before that second's first event), oldest first
    _marks: deque[tuple[int, int]] = attrs.field(
        factory=lambda: deque(maxlen=max(TPS_WINDOWS) + 2)
    )
    _last_second: int | None = None
    _started: float = attrs.field(
        default=attrs.Factory(lambda self: self.clock(), takes_self=True)
    )

    def add(self, count: int = 1) -> None:
        second = int(self.clock())
        if second != self._last_second:
            self._marks.append((second, self.total))
            self._last_second = second
        self.total += count

    def rate(self, window: float) -> float:
        """Events per second over the last ``window`` seconds."""
        now = self.clock()
        start = max(float(int(now) - window), self._started)
        if now <= start:
            return 0.0
        # Every event before the first marked second at or after ``first`` happened before
        # ``start`` (or, when ``start`` is when the counter began, there is none before it);
        # if there is no such second, nothing happened since.
        first = int(start)
        before = next((total for second, total in self._marks if second >= first), self.total)
        return (self.total - before) / (now - start)

    def rates_text(self) -> str:
        """The rates over ``TPS_WINDOWS``, as RocketMQ writes them: Java doubles separated by
        spaces ("12.5 3.0 0.3"). Unlike RocketMQ, a window longer than the broker has run is
        the rate since it started, not an empty string (mqadmin reads the first number)."""
        return " ".join(java_double(self.rate(window)) for window in TPS_WINDOWS)


def java_double(value: float) -> str:
    """``Double.toString`` for the rates reported here (0 or 1e-3 up to 1e7, where Java and
    Python both write the shortest decimal with at least one fractional digit)."""
    return repr(float(value))


@attrs.define(eq=False)
class BrokerStats:
    """Counters for GET_BROKER_RUNTIME_INFO: RocketMQ's StoreStatsService figures. Puts count
    stored messages; reads count pull reads that found messages and those that found none
    (a held pull reads again when it wakes), and the messages the found ones served
    ("transferred", RocketMQ's msgGetTotal). ``clock`` is injectable for tests."""

    clock: Callable[[], float] = time.monotonic
    put_failures: int = 0
    #: pull requests received (a held pull counts once, however often it reads)
    gets: int = 0
    #: messages stored (a batch counts each of its messages)
    stored: RateCounter = attrs.field(
        default=attrs.Factory(lambda self: RateCounter(self.clock), takes_self=True)
    )
    #: pull reads that found messages
    gets_found: RateCounter = attrs.field(
        default=attrs.Factory(lambda self: RateCounter(self.clock), takes_self=True)
    )
    #: pull reads that found none (an empty queue, an offset past the end, no tag matched)
    gets_missed: RateCounter = attrs.field(
        default=attrs.Factory(lambda self: RateCounter(self.clock), takes_self=True)
    )
    #: messages the pulls served
    transferred: RateCounter = attrs.field(
        default=attrs.Factory(lambda self: RateCounter(self.clock), takes_self=True)
    )

    @property
    def puts(self) -> int:
        return self.stored.total

    def record_put(self, result: PutMessageResult) -> None:
        if result.status.stored:
            self.stored.add(max(1, result.count))
        else:
            self.put_failures += 1

    def record_get(self, messages: int) -> None:
        """One pull read: ``messages`` served (0: it found none)."""
        if messages:
            self.gets_found.add()
            self.transferred.add(messages)
        else:
            self.gets_missed.add()

    def total_get_rates_text(self) -> str:
        """``getTotalTps``: found + missed reads per second, per window."""
        return " ".join(java_double(self.gets_found.rate(w) + self.gets_missed.rate(w))
                        for w in TPS_WINDOWS)


@attrs.define(eq=False)
class Broker:
    config: BrokerConfig
    store: MessageStore
    metadata: BrokerMetadata
    addresses: BrokerAddresses
    registration: Registration
    clients: ClientManager = attrs.field(
        default=attrs.Factory(
            lambda self: ClientManager(max_producer_groups=self.config.max_producer_group_nums),
            takes_self=True,
        )
    )
    stats: BrokerStats = attrs.field(factory=BrokerStats)
    #: delivers delayed messages when due (a master's; a slave delivers none)
    schedule: ScheduleService = attrs.field(
        default=attrs.Factory(
            lambda self: ScheduleService(self.store, self.metadata.delay_offsets,
                                         self.config.store.delay_levels),
            takes_self=True,
        )
    )
    #: asks producers about undecided half messages (a master's)
    transaction_check: TransactionCheck = attrs.field(
        default=attrs.Factory(
            lambda self: TransactionCheck(
                self.store, self.metadata, self.clients,
                interval=self.config.transaction_check_interval,
                timeout=self.config.transaction_time_out,
                check_max=self.config.transaction_check_max,
                topics_changed=self.topics_changed,
            ),
            takes_self=True,
        )
    )
    #: a slave's copy of its master's metadata (it runs while the broker is a slave)
    slave_sync: SlaveSync = attrs.field(
        default=attrs.Factory(
            lambda self: SlaveSync(self.registration, self.metadata,
                                   self.config.slave_sync_interval / 1000,
                                   self.store.max_queue_offset),
            takes_self=True,
        )
    )
    #: which client of a group holds which queue (orderly consumption)
    queue_locks: QueueLockManager = attrs.field(
        default=attrs.Factory(
            lambda self: QueueLockManager(
                max_locks=self.config.max_queue_lock_nums,
                max_locks_per_group=self.config.max_queue_lock_nums_per_group,
                max_locks_per_client=self.config.max_queue_lock_nums_per_client,
            ),
            takes_self=True,
        )
    )
    started_at: float = attrs.field(factory=time.time)
    #: set when a table should be written before the next periodic round
    _persist_soon: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: what the current role runs, in the broker's nursery (``start_role_services``)
    _role_scope: RoleScope | None = attrs.field(default=None, init=False)
    #: in controller mode, the broker's membership of its set (``controller.link``)
    controller_link: ControllerLink | None = attrs.field(default=None, init=False)

    @property
    def is_slave(self) -> bool:
        return self.store.role is BrokerRole.SLAVE

    @property
    def state_version(self) -> int:
        """The master epoch of the last role change (0: none): the registered stateVersion."""
        return self.registration.state_version

    # ---- its role --------------------------------------------------------------------------

    def _role_services(self) -> list[Callable[..., Awaitable[None]]]:
        """What the broker's current role runs: RocketMQ's changeSpecialServiceStatus (the
        schedule and the transaction check on a master) and SlaveSynchronize (a slave's)."""
        if self.is_slave:
            return [self._run_slave_sync]
        return [self.schedule.run, self.transaction_check.run]

    async def _run_slave_sync(self, *, task_status: trio.TaskStatus[None] = (
            trio.TASK_STATUS_IGNORED)) -> None:
        task_status.started()
        await self.slave_sync.run()

    async def start_role_services(self, nursery: trio.Nursery) -> None:
        """Start what the broker's role runs, in a scope of ``nursery`` that a role change
        replaces (``serve_broker`` calls it once the broker serves)."""
        self._role_scope = RoleScope(nursery)
        await self._role_scope.start(self._role_services())

    async def change_to_master(self, epoch: int,
                               role: BrokerRole = BrokerRole.SYNC_MASTER) -> None:
        """Become the master (RocketMQ's ``ReplicasManager.changeToMaster``): the slave sync
        stops; the store stops copying, cuts a torn tail, waits for dispatch and takes puts
        (``role``: SYNC_MASTER as RocketMQ's controller mode makes it, or ASYNC_MASTER);
        the schedule and the transaction check start; the broker registers at once as id 0
        with ``epoch`` as its state version. An epoch below the last change's is refused."""
        await self._become_master(epoch, functools.partial(self.store.change_to_master, role))

    async def change_to_controller_master(self, epoch: int, broker_id: int,
                                          sync_state_set: frozenset[int],
                                          sync_state_set_epoch: int) -> SyncState:
        """``change_to_master`` in controller mode: the store appends the epoch to its epoch
        file, speaks AutoSwitch to its slaves and answers SYNC_MASTER puts once the in-sync
        set (returned: the controller link proposes its changes) has them."""
        term: list[SyncState] = []

        async def store_change() -> None:
            term.append(await self.store.change_to_controller_master(
                epoch=epoch, broker_id=broker_id, sync_state_set=sync_state_set,
                sync_state_set_epoch=sync_state_set_epoch))

        await self._become_master(epoch, store_change)
        return term[0]

    async def _become_master(self, epoch: int,
                             store_change: Callable[[], Awaitable[object]]) -> None:
        async with self._changing_role(epoch) as scope:
            await scope.stop()
            await self._last_sync_from_master()
            await store_change()
            self.registration.take_role(MASTER_ID, epoch, None, None)
            await scope.start(self._role_services())
        await self.registration.register_all()

    async def change_to_controller_slave(self, master_addr: str, broker_id: int,
                                         epoch: int) -> None:
        """``change_to_slave`` in controller mode: the store copies with the AutoSwitch
        protocol, cutting its log to the point shared with the master first. The master's
        HA address comes from the name server's answer to the registration, as RocketMQ's
        does (``Registration`` hands it to the store's HA client)."""
        await self._become_slave(master_addr, broker_id, epoch, functools.partial(
            self.store.change_to_controller_slave, None, broker_id=broker_id))

    async def change_to_slave(self, master_addr: str | None, master_ha_addr: str | None,
                              broker_id: int, epoch: int | None = None) -> None:
        """Become a slave of the master at ``master_addr`` (remoting) / ``master_ha_addr``
        (HA; None: learn both from the name servers), registered as ``broker_id`` (> 0,
        the controller's id): the schedule and the transaction check stop, before the
        store refuses puts, answers those waiting and starts copying; the slave sync starts;
        the broker registers at once, with ``epoch`` (None: the last one) as its state
        version (RocketMQ's ``ReplicasManager.changeToSlave``)."""
        await self._become_slave(master_addr, broker_id, epoch, functools.partial(
            self.store.change_to_slave, master_ha_addr))

    async def _become_slave(self, master_addr: str | None, broker_id: int, epoch: int | None,
                            store_change: Callable[[], Awaitable[object]]) -> None:
        if broker_id <= MASTER_ID:
            raise ValueError(f"a slave's broker id is above {MASTER_ID}, not {broker_id}")
        version = self.state_version if epoch is None else epoch
        async with self._changing_role(version) as scope:
            await scope.stop()
            await store_change()
            self.registration.take_role(broker_id, version, master_addr, self.store.ha_client)
            await scope.start(self._role_services())
        await self.registration.register_all()

    async def _last_sync_from_master(self) -> None:
        """A slave about to become master copies the old master's metadata once more, if
        that still answers within LAST_SYNC_TIMEOUT (an orderly switch: it does). RocketMQ
        does not, and a topic created in the last slaveSyncInterval before a switch is then
        missing on the new master, and from the routes (rocketmq-helm #33)."""
        master = self.registration.master_addr
        if not self.is_slave or not master or master == self.addresses.broker_addr:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(LAST_SYNC_TIMEOUT):
            outcomes = await sync_from_master(self.registration.pool, master, self.metadata,
                                              self.store.max_queue_offset)
            log.info("broker %s: last metadata sync from the old master %s: %s",
                     self.config.broker_name, master,
                     ", ".join(f"{name} {o.detail}" for name, o in outcomes.items()))

    @contextlib.asynccontextmanager
    async def _changing_role(self, epoch: int) -> AsyncIterator[RoleScope]:
        """One role change at a time, never to an epoch older than the last."""
        scope = self._role_scope
        if scope is None:
            raise RoleChangeError("the broker does not serve yet: its role cannot change")
        async with scope.changing:
            if epoch < self.state_version:
                raise RoleChangeError(
                    f"epoch {epoch} is older than this broker's, {self.state_version}")
            log.info("broker %s: changing role at epoch %d (was %s, brokerId %d)",
                     self.config.broker_name, epoch, self.store.role.value,
                     self.registration.broker_id)
            yield scope

    @property
    def master_addr(self) -> str | None:
        """The master's remoting address, learned from registration (slaves)."""
        return self.registration.master_addr

    def connection_closed(self, connection: RemotingConnection) -> None:
        self.clients.connection_closed(connection)

    # ---- topics ----------------------------------------------------------------------------------

    def auto_create_topic(self, header: SendMessageRequestHeader) -> TopicConfig | None:
        """Create a topic on first send when autoCreateTopicEnable allows it."""
        topics = self.metadata.topics
        before = topics.data_version
        try:
            created = topics.create_topic_in_send(
                header.topic, header.default_topic, header.default_topic_queue_nums,
            )
        except ValueError as exc:
            log.info("broker: not auto-creating topic %s: %s", header.topic, exc)
            return None
        if created is not None and topics.data_version != before:
            log.info("broker: auto-created topic %s (%d queues)", header.topic,
                     created.write_queue_nums)
            self.topics_changed()
        return created

    def queue_nums(self, topic: str) -> int:
        """How many queues ``topic`` has here for reading and committing: the larger of its
        read and write queue numbers (RocketMQ's bound for a queue id); 0 for a topic this
        broker does not know. A slave also counts the queues it holds replicated data for: the
        master's topic config may not have reached it yet (or ever, if the master died)."""
        config = self.metadata.topics.get(topic)
        if config is not None:
            return max(config.read_queue_nums, config.write_queue_nums)
        if not self.is_slave:
            return 0
        return 1 + max((q for t, q in self.store.queues.queues if t == topic), default=-1)

    def topics_changed(self) -> None:
        """Topic configs changed: tell the name servers now (RocketMQ registers at once), and
        write topics.json without waiting for the periodic round."""
        self.registration.register_soon()
        self._persist_soon.set()

    async def persist_topics(self) -> None:
        """Write topics.json now if it changed. A topic created by a send is written before
        the send is answered, as RocketMQ's TopicConfigManager does: otherwise a crash in the
        next few seconds keeps the messages but loses their topic, and with it their route
        (found by the real broker opening our store after a SIGKILL). A write that fails
        (full disk) is logged by the table and retried by the periodic round."""
        try:
            await self.metadata.topics.persist_if_dirty()
        except OSError:
            self._persist_soon.set()

    def earliest_message_time(self) -> int:
        """STORETIMESTAMP of the oldest record the store holds, or -1."""
        record = self.store.record_bytes(self.store.min_commitlog_offset)
        return layout.read_store_timestamp(record) if record is not None else -1

    # ---- housekeeping ------------------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        """Persist changed metadata every flushConsumerOffsetInterval (and soon after a topic
        change); expire silent clients."""
        interval = self.config.flush_consumer_offset_interval / 1000
        while True:
            with trio.move_on_after(interval):
                await self._persist_soon.wait()
            self._persist_soon = trio.Event()
            self.clients.expire(trio.current_time())
            try:
                await self.metadata.persist_dirty()
            except OSError:
                # A full disk or no descriptors left: the tables stay dirty and are written
                # at the next round (each file's error was logged); never end the broker.
                continue
