"""The broker: a store, its replication, remoting, metadata and name server registration, in
one nursery.

``serve_broker(config, task_status=...)`` runs in the caller's nursery (``nursery.start``) and
reports a ``BrokerAddresses`` once it serves: the remoting port (listenPort) and RocketMQ's VIP
port (listenPort - 2) are bound first, so the store records the real address as STOREHOST
even with port 0; then the store opens (recovering if needed, HA included), and the broker
registers with every name server at once and every registerNameServerPeriod after.

A slave refuses sends, serves pulls and queries (so consumers keep going while the master is
down), learns its master's HA address from its registration when haMasterAddress is not set
— and follows it when the master changes — and copies topics, consumer offsets and
subscription groups from the master every slave_sync_interval, never moving an offset back
(RocketMQ issue #1094).

Cancelling the nursery shuts down gracefully: listeners close, in-flight requests end, the
broker unregisters, metadata and the store are flushed, and the abort file is removed.
"""

from __future__ import annotations

import logging
import time
from collections import deque

import attrs
import trio

from ..config import BrokerRole
from ..remoting import (
    RemotingClientPool,
    RemotingConnection,
    RemotingError,
    open_remoting_client,
    serve_remoting,
)
from ..store import open_store
from ..store.results import PutMessageResult
from ..wire.errors import MetadataDecodeError, RouteDecodeError
from ..wire.metadata import decode_consumer_offsets, decode_subscription_groups, decode_topics_json
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import RegisterBrokerBody, TopicConfig
from . import admin
from .clients import ClientManager
from .config import BrokerConfig
from .metadata import BrokerMetadata, config_dir_of
from .pull import process_pull
from .send import process_send

log = logging.getLogger(__name__)

SEND_CODES = frozenset({
    RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
})


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
    puts: int = 0
    put_failures: int = 0
    gets: int = 0
    _recent: deque = attrs.field(factory=lambda: deque(maxlen=64))

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
    store: object = None
    metadata: BrokerMetadata = None
    clients: ClientManager = attrs.field(factory=ClientManager)
    stats: BrokerStats = attrs.field(factory=BrokerStats)
    addresses: BrokerAddresses | None = None
    started_at: float = attrs.field(factory=time.time)
    #: the master's remoting address, learned from registration (slaves)
    master_addr: str | None = None
    _pool: RemotingClientPool | None = None
    _register_now: trio.Event = attrs.field(factory=trio.Event)

    @property
    def is_slave(self) -> bool:
        return self.config.role is BrokerRole.SLAVE

    # ---- requests ---------------------------------------------------------------------------

    async def handle(self, request: RemotingCommand, connection: RemotingConnection):
        code = request.code
        if code in SEND_CODES:
            return await process_send(self, request, connection)
        if code == RequestCode.PULL_MESSAGE:
            self.stats.gets += 1
            return await process_pull(self, request, connection)
        handler = admin.HANDLERS.get(code)
        await trio.lowlevel.checkpoint()
        if handler is not None:
            return handler(self, request, connection)
        refused = admin.unsupported(request)
        if refused is not None:
            return refused
        return RemotingCommand.response_to(
            request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
            remark=f" request type {code} not supported",
        )

    async def handle_vip(self, request: RemotingCommand, connection: RemotingConnection):
        """The VIP port serves the same requests except pulls (as RocketMQ's fast channel)."""
        if request.code == RequestCode.PULL_MESSAGE:
            await trio.lowlevel.checkpoint()
            return RemotingCommand.response_to(
                request, ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                remark="pulls are served on the main port, not the VIP port",
            )
        return await self.handle(request, connection)

    def connection_closed(self, connection: RemotingConnection) -> None:
        self.clients.connection_closed(connection)

    # ---- topics ----------------------------------------------------------------------------------

    def auto_create_topic(self, header) -> TopicConfig | None:
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

    def topics_changed(self) -> None:
        """Topic configs changed: tell the name servers now (RocketMQ registers at once)."""
        self._register_now.set()

    def earliest_message_time(self) -> int:
        store = self.store
        stamp = store._store_timestamp_at(store.min_commitlog_offset)
        return stamp if stamp is not None else -1

    # ---- registration ------------------------------------------------------------------------

    def _register_request(self) -> RemotingCommand:
        body = RegisterBrokerBody(self.metadata.topics.registration_wrapper()).encode()
        from .. import _backend

        return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.addresses.broker_addr,
            "clusterName": self.config.broker_cluster_name,
            "haServerAddr": self.addresses.ha_addr or "",
            "brokerId": self.config.broker_id,
            "compressed": False,
            "bodyCrc32": _backend.engine.crc32(body),
        }, body=body)

    async def register_all(self) -> None:
        """REGISTER_BROKER with every name server (each bounded by its timeout)."""
        timeout = self.config.register_broker_timeout_mills / 1000
        request = self._register_request()
        async with trio.open_nursery() as nursery:
            for address in self.config.namesrv_addresses:
                nursery.start_soon(self._register_one, address, request, timeout)

    async def _register_one(self, address: str, request: RemotingCommand, timeout: float) -> None:
        try:
            response = await self._pool.invoke(address, request, timeout)
        except RemotingError as exc:
            log.warning("broker: registering with name server %s failed: %s", address, exc)
            self._pool.forget(address)
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning("broker: name server %s refused the registration: %s", address,
                        response.remark)
            return
        if self.is_slave:
            self._follow_master(response.ext_fields.get("masterAddr"),
                                response.ext_fields.get("haServerAddr"))

    def _follow_master(self, master_addr: str | None, ha_addr: str | None) -> None:
        if master_addr != self.master_addr:
            log.info("broker: master of %s is now %s", self.config.broker_name, master_addr)
            self.master_addr = master_addr
        client = self.store.ha_client
        if client is not None and not self.config.store.ha_master_address and ha_addr:
            client.update_master_address(ha_addr)

    async def run_registration(self) -> None:
        period = min(max(self.config.register_name_server_period, 10_000), 60_000) / 1000
        while True:
            self._register_now = trio.Event()
            await self.register_all()
            # A slave that has not learned its master yet (it registered first) asks again
            # every second instead of waiting a whole period (RocketMQ waits 30 s).
            wait = 1.0 if self.is_slave and self.master_addr is None else period
            with trio.move_on_after(wait):
                await self._register_now.wait()

    async def unregister_all(self, timeout: float = 2.0) -> None:
        """UNREGISTER_BROKER with every name server, in parallel, within ``timeout``. Runs
        at shutdown, when the pool's readers are already cancelled: each call gets its own
        short-lived connection."""
        request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
            "brokerName": self.config.broker_name, "brokerAddr": self.addresses.broker_addr,
            "clusterName": self.config.broker_cluster_name, "brokerId": self.config.broker_id,
        })

        async def one(address: str) -> None:
            try:
                async with open_remoting_client(address, connect_timeout=timeout) as client:
                    await client.invoke(request, timeout)
            except RemotingError as exc:
                log.info("broker: unregistering from %s failed: %s", address, exc)

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for address in self.config.namesrv_addresses:
                    nursery.start_soon(one, address)

    # ---- slave metadata sync ----------------------------------------------------------------

    async def run_slave_sync(self) -> None:
        """Copy topics, consumer offsets and subscription groups from the master."""
        await trio.sleep(min(3.0, self.config.slave_sync_interval / 1000))
        while True:
            if self.master_addr and self.master_addr != self.addresses.broker_addr:
                try:
                    await self._sync_from_master(self.master_addr)
                except (RemotingError, RouteDecodeError, MetadataDecodeError) as exc:
                    log.info("broker: metadata sync from %s failed: %s", self.master_addr, exc)
            await trio.sleep(self.config.slave_sync_interval / 1000)

    async def _sync_from_master(self, master: str) -> None:
        timeout = 3.0
        topics = await self._pool.invoke(master, RemotingCommand.request(RequestCode.GET_ALL_TOPIC_CONFIG), timeout)
        if topics.code == ResponseCode.SUCCESS:
            self.metadata.topics.replace_from_master(decode_topics_json(topics.body))
        offsets = await self._pool.invoke(master, RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET), timeout)
        if offsets.code == ResponseCode.SUCCESS:
            self.metadata.offsets.merge_from_master(decode_consumer_offsets(offsets.body))
        groups = await self._pool.invoke(master, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), timeout)
        if groups.code == ResponseCode.SUCCESS:
            self.metadata.subscriptions.replace_from_master(decode_subscription_groups(groups.body))

    # ---- housekeeping ------------------------------------------------------------------------

    async def run_housekeeping(self) -> None:
        """Persist consumer offsets every flushConsumerOffsetInterval; expire silent clients."""
        interval = self.config.flush_consumer_offset_interval / 1000
        while True:
            await trio.sleep(interval)
            self.clients.expire(trio.current_time())
            await self.metadata.persist_dirty()


async def serve_broker(config: BrokerConfig, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run a broker until cancelled; reports its BrokerAddresses through ``task_status``."""
    host = config.bind_address
    listeners = await trio.open_tcp_listeners(config.listen_port, host=host)
    port = listeners[0].socket.getsockname()[1]
    vip_listeners = None
    if config.vip_channel_enable:
        vip_port = 0 if config.listen_port == 0 else config.listen_port - 2
        vip_listeners = await trio.open_tcp_listeners(vip_port, host=host)
    if config.listen_port == 0:
        # Port 0 (tests): record the port the OS chose as STOREHOST, so msgIds point here.
        config = attrs.evolve(
            config, store=attrs.evolve(config.store, store_host=f"{config.broker_ip1}:{port}")
        )
    broker = Broker(config)
    broker.metadata = await trio.to_thread.run_sync(
        lambda: BrokerMetadata.load(
            config_dir_of(config.store.store_path_root_dir),
            default_queue_nums=config.default_topic_queue_nums,
            auto_create_topic=config.auto_create_topic_enable,
            auto_create_subscription_group=config.auto_create_subscription_group,
            broker_permission=config.broker_permission,
        ),
        abandon_on_cancel=False,
    )
    broker.metadata.topics.ensure_system_topics(config.broker_cluster_name, config.broker_name)
    async with open_store(config.store) as store:
        broker.store = store
        ha = store.ha_address
        vip_addr = None
        if vip_listeners is not None:
            vip_addr = f"{config.broker_ip1}:{vip_listeners[0].socket.getsockname()[1]}"
        broker.addresses = BrokerAddresses(
            broker_addr=f"{config.broker_ip1}:{port}", vip_addr=vip_addr,
            ha_addr=f"{config.broker_ip2 or config.broker_ip1}:{ha[1]}" if ha else None,
        )
        try:
            async with trio.open_nursery() as nursery:
                broker._pool = RemotingClientPool(nursery)
                idle = config.server_channel_max_idle_time_seconds
                await nursery.start(lambda task_status: serve_remoting(
                    broker.handle, 0, listeners=listeners, idle_timeout=idle,
                    on_close=broker.connection_closed, task_status=task_status))
                if vip_listeners is not None:
                    await nursery.start(lambda task_status: serve_remoting(
                        broker.handle_vip, 0, listeners=vip_listeners, idle_timeout=idle,
                        on_close=broker.connection_closed, task_status=task_status))
                nursery.start_soon(broker.run_housekeeping)
                if config.namesrv_addresses:
                    nursery.start_soon(broker.run_registration)
                if broker.is_slave:
                    nursery.start_soon(broker.run_slave_sync)
                log.info("broker %s (%s) serving on %s", config.broker_name, config.role.value,
                         broker.addresses.broker_addr)
                task_status.started(broker.addresses)
                try:
                    await trio.sleep_forever()
                finally:
                    with trio.CancelScope(shield=True):
                        await broker._pool.aclose()
                        if config.namesrv_addresses:
                            await broker.unregister_all()
        finally:
            with trio.CancelScope(shield=True):
                await broker.metadata.persist_all()
