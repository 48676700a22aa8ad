"""The broker's state, as every request processor sees it: one object, complete when built.

A ``Broker`` holds what serving a request needs — the configuration, the open store, the loaded
metadata tables, the addresses it serves on, its registration with the name servers, the
clients connected to it and its counters. ``serve_broker`` (``trio_ha.broker.serve``) opens the
store and loads the metadata first and only then builds the Broker, so no processor ever sees
a broker without its store; the processors (``send``, ``pull``, ``admin``) take it as their
first argument, and ``dispatch`` routes requests to them.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import attrs
import trio

from ..config import BrokerRole
from ..remoting import RemotingConnection
from ..store import MessageStore, PutMessageResult
from ..wire import layout
from ..wire.metadata import TopicConfig
from ..wire.remoting import SendMessageRequestHeader
from .clients import ClientManager
from .config import BrokerConfig
from .metadata import BrokerMetadata
from .queue_locks import QueueLockManager
from .registration import Registration
from .schedule import ScheduleService
from .slave_sync import SlaveSync
from .transactions import TransactionCheck

__all__ = ["Broker", "BrokerAddresses", "BrokerStats"]

log = logging.getLogger(__name__)

#: how many recent puts ``BrokerStats.put_rate`` averages over
PUT_RATE_WINDOW = 64


@attrs.frozen
class BrokerAddresses:
    #: where clients connect (brokerIP1:listenPort)
    broker_addr: str
    #: RocketMQ's VIP channel (listenPort - 2), or None
    vip_addr: str | None
    #: where slaves connect for replication, or None
    ha_addr: str | None


@attrs.define(eq=False)
class BrokerStats:
    """Counters for GET_BROKER_RUNTIME_INFO."""

    puts: int = 0
    put_failures: int = 0
    gets: int = 0
    #: (monotonic time, puts so far) of the latest puts
    _recent: deque[tuple[float, int]] = attrs.field(
        factory=lambda: deque(maxlen=PUT_RATE_WINDOW)
    )

    def record_put(self, result: PutMessageResult) -> None:
        if result.status.stored:
            self.puts += max(1, result.count)
            self._recent.append((time.monotonic(), self.puts))
        else:
            self.put_failures += 1

    def put_rate(self) -> float:
        if len(self._recent) < 2:
            return 0.0
        (t0, n0), (t1, n1) = self._recent[0], self._recent[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0


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
    #: a slave's copy of its master's metadata (None on a master)
    slave_sync: SlaveSync | None = attrs.field(
        default=attrs.Factory(
            lambda self: SlaveSync(self.registration, self.metadata,
                                   self.config.slave_sync_interval / 1000)
            if self.config.role is BrokerRole.SLAVE else None,
            takes_self=True,
        )
    )
    #: which client of a group holds which queue (orderly consumption)
    queue_locks: QueueLockManager = attrs.field(factory=QueueLockManager)
    started_at: float = attrs.field(factory=time.time)
    #: set when a table should be written before the next periodic round
    _persist_soon: trio.Event = attrs.field(factory=trio.Event, init=False)

    @property
    def is_slave(self) -> bool:
        return self.config.role is BrokerRole.SLAVE

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
