"""The client instance: what every producer, consumer and admin of one process shares.

One concept at about 800 lines: the instance is the shared state of a client process (id,
connections, routes, heartbeats), and splitting it would spread one lifecycle over modules.

RocketMQ's Java client keeps one ``MQClientInstance`` per process and name server set: one
client id, one connection per broker, one topic route cache, one heartbeat. This module is
that, as a trio async context manager::

    async with open_client_instance("127.0.0.1:9876") as client:
        async with open_producer(client, "pg") as producer, \\
                   open_pull_consumer(client, "cg") as consumer:
            ...

(``open_producer("127.0.0.1:9876", "pg")`` with an address instead opens a private instance
for that producer.) What the instance does:

- **client id** ``ip@pid#n``, as Java's ``clientIP@instanceName`` where the default instance
  name is the pid plus a discriminator;
- **connections**: a ``RemotingClientPool``, one connection per address, remade after a break;
- **routes**: GET_ROUTEINFO_BY_TOPIC from the name servers (the first that answers; a failing
  one is skipped), cached per topic, refreshed every ``poll_name_server_interval`` (30 s) for
  every topic in use, and on demand after a failure, so a master change is followed at once:
  one lookup at a time per topic, shared by every caller that waited for it, spaced 100 ms
  growing to 1 s while the route stays the same (``route_gate``). A topic
  the name server does not know can be sent to through the default topic TBW102's route
  (the broker then creates it), as Java producers do;
- **heartbeats**: HEART_BEAT to every broker in the routes every
  ``heartbeat_broker_interval`` (30 s), at once when a group or a subscription is added and
  when a new broker address shows up; the body names the producer groups and the consumer
  groups with their subscriptions;
- **unregistration**: UNREGISTER_CLIENT to every known broker when a group closes (bounded
  by the request timeout, never blocking the close longer).

Every network wait is bounded by a timeout. Leaving the block cancels the background tasks
and closes the connections.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import random
import re
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import attrs
import trio

from .._errors import TrioHAError, unwrap_single_exception
from ..remoting import (
    PreparedRequest,
    RemotingClient,
    RemotingClientPool,
    RemotingError,
    RemotingTimeout,
)
from ..remoting.tls import TlsClientConfig
from ..wire.acl import Credentials
from ..wire.errors import RouteDecodeError
from ..wire.heartbeat import (
    CLUSTERING,
    CONSUME_ACTIVELY,
    CONSUME_FROM_LAST_OFFSET,
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from ..wire.permission import readable, writable
from ..wire.record import java_string_hash, parse_host_port
from ..wire.remoting import LanguageCode, RemotingCommand, RequestCode, ResponseCode
from ..wire.route import QueueData, TopicRouteData
from .route_gate import RouteGate

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_TOPIC",
    "MASTER_ID",
    "ClientConfig",
    "ClientInstance",
    "MQBrokerError",
    "MQClientError",
    "MQError",
    "MessageQueue",
    "open_client_instance",
    "parse_subscription",
]

#: the template topic for topics created on first send (``AUTO_CREATE_TOPIC_KEY_TOPIC``)
DEFAULT_TOPIC = "TBW102"
#: queues a producer asks for when the broker creates a topic on first send
DEFAULT_TOPIC_QUEUE_NUMS = 4
MASTER_ID = 0
#: what we announce in the remoting header
LANGUAGE = LanguageCode.PYTHON


# ---- errors -------------------------------------------------------------------------------------


class MQError(TrioHAError):
    """Base of the client's errors."""


class MQClientError(MQError):
    """The client could not do what was asked: no route, no broker reachable, a timeout, an
    invalid message (Java's ``MQClientException``)."""


class MQBrokerError(MQError):
    """A broker answered with an error code (Java's ``MQBrokerException``)."""

    def __init__(self, code: int, remark: str | None, broker_addr: str | None = None) -> None:
        self.code = code
        self.remark = remark
        self.broker_addr = broker_addr
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        where = f" from {broker_addr}" if broker_addr else ""
        super().__init__(f"broker error {name} ({code}){where}: {remark or ''}")


# ---- values -----------------------------------------------------------------------------------


@attrs.frozen(order=True)
class MessageQueue:
    """One queue of a topic on one broker group (master and slaves share the name)."""

    topic: str
    broker_name: str
    queue_id: int


@attrs.frozen(kw_only=True)
class ClientConfig:
    """Java's ``ClientConfig`` knobs, in seconds."""

    #: route refresh period for the topics in use (pollNameServerInterval)
    poll_name_server_interval: float = 30.0
    #: heartbeat period (heartbeatBrokerInterval)
    heartbeat_broker_interval: float = 30.0
    #: timeout of admin-style requests (route lookups, offsets, heartbeats)
    request_timeout: float = 3.0
    connect_timeout: float = 3.0
    #: after a failure, a topic's route is looked up again at once, then at most this often
    #: (seconds), the spacing doubling while the lookups find the same route...
    route_refresh_min_interval: float = 0.1
    #: ...up to this (``route_gate``; docs/remoting.md, *Our client*)
    route_refresh_max_interval: float = 1.0
    #: the ip part of the client id (the address the name server is reached from by default)
    client_ip: str | None = None
    #: the part after ``@`` (default: pid#n)
    instance_name: str | None = None
    #: an ACL account (Java's ``AclClientRPCHook``): every request goes out signed with it
    credentials: Credentials | None = None
    #: TLS for every connection (``TlsClientConfig(enable=True, trust_cert_path=...)``)
    tls: TlsClientConfig | None = None


def parse_subscription(topic: str, expression: str | None) -> SubscriptionData:
    """A TAG expression (``"*"``, ``""`` or ``"TagA || TagB"``) as RocketMQ's
    ``FilterAPI.buildSubscriptionData``: the tags and their Java hash codes; ``*`` for all."""
    text = (expression or "").strip()
    if not text or text == "*":
        return SubscriptionData(topic, "*", sub_version=_now_ms())
    tags = [t.strip() for t in text.split("||") if t.strip()]
    if not tags or "*" in tags:
        return SubscriptionData(topic, "*", sub_version=_now_ms())
    return SubscriptionData(
        topic, text, tags_set=tags, code_set=[java_string_hash(t) for t in tags],
        sub_version=_now_ms(),
    )


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- unique message ids (MessageClientIDSetter) ---------------------------------------------


class _UniqIdGenerator:
    """Java's ``MessageClientIDSetter.createUniqID``: 16 bytes as 32 upper-case hex digits —
    client ip (4), pid (2), a per-process random (4, Java's class loader hash), milliseconds
    since the start of the month (4) and a counter (2)."""

    def __init__(self) -> None:
        self._prefix: str | None = None
        self._counter = itertools.count(random.randrange(1 << 16))
        self._month_start_ms = 0
        self._next_month_ms = 0

    def prefix(self, ip: str) -> str:
        if self._prefix is None:
            try:
                ip_bytes = socket.inet_aton(ip)
            except OSError:
                ip_bytes = random.randbytes(4)
            self._prefix = (
                ip_bytes + struct.pack(">H", os.getpid() & 0xFFFF) + random.randbytes(4)
            ).hex().upper()
        return self._prefix

    def _month_times(self, now_ms: int) -> None:
        now = time.localtime(now_ms / 1000)
        start = time.mktime((now.tm_year, now.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        year, month = (now.tm_year + 1, 1) if now.tm_mon == 12 else (now.tm_year, now.tm_mon + 1)
        end = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
        self._month_start_ms = int(start * 1000)
        self._next_month_ms = int(end * 1000)

    def _month_ms(self) -> int:
        """Milliseconds since the start of this month (its bounds cached), as 32 bits."""
        now_ms = _now_ms()
        if not self._month_start_ms <= now_ms < self._next_month_ms:
            self._month_times(now_ms)
        return (now_ms - self._month_start_ms) & 0xFFFFFFFF

    def create(self, ip: str) -> str:
        tail = struct.pack(">IH", self._month_ms(), next(self._counter) & 0xFFFF)
        return self.prefix(ip) + tail.hex().upper()

    def create_many(self, ip: str, count: int) -> list[str]:
        """``count`` ids as ``create`` makes them one by one within one millisecond: one
        clock reading, and the counters packed and hexed together (a batch's messages), in
        a third of the time."""
        head = self.prefix(ip) + format(self._month_ms(), "08X")
        counter = self._counter
        counters = struct.pack(f">{count}H", *[next(counter) & 0xFFFF for _ in range(count)])
        digits = counters.hex().upper()
        return [head + digits[i : i + 4] for i in range(0, 4 * count, 4)]


_UNIQ_IDS = _UniqIdGenerator()
_INSTANCE_NUMBERS = itertools.count()


def _local_ip(namesrv_addrs: Iterable[str]) -> str:
    """The local address used to reach the first name server (no packet is sent)."""
    for address in namesrv_addrs:
        try:
            host, port = parse_host_port(address)
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((host, port))
                return sock.getsockname()[0]
        except (OSError, ValueError):
            continue
    return "127.0.0.1"


def parse_namesrv_addr(namesrv_addr: str | Iterable[str]) -> tuple[str, ...]:
    """``"host:port;host:port"`` (RocketMQ's namesrvAddr) or a list of addresses."""
    if isinstance(namesrv_addr, str):
        parts = re.split(r"[;,\s]+", namesrv_addr)
    else:
        parts = list(namesrv_addr)
    addrs = tuple(p.strip() for p in parts if p and p.strip())
    if not addrs:
        raise MQClientError("no name server address given")
    for address in addrs:
        try:
            parse_host_port(address)
        except ValueError as exc:
            raise MQClientError(f"bad name server address {address!r}: {exc}") from None
    return addrs


# ---- the instance ------------------------------------------------------------------------------


@attrs.define(eq=False)
class ClientInstance:
    namesrv_addrs: tuple[str, ...]
    config: ClientConfig
    client_id: str
    client_ip: str
    pool: RemotingClientPool
    nursery: trio.Nursery
    #: topic -> the route the name server gave
    routes: dict[str, TopicRouteData] = attrs.field(factory=dict)
    #: topic -> TBW102's route, for producers of topics the name server does not know yet
    default_routes: dict[str, TopicRouteData] = attrs.field(factory=dict)
    #: broker name -> {broker id: address}, from the latest route naming that broker
    broker_addrs: dict[str, dict[int, str]] = attrs.field(factory=dict)
    producer_groups: set[str] = attrs.field(factory=set)
    #: consumer group -> topic -> subscription
    consumer_groups: dict[str, dict[str, SubscriptionData]] = attrs.field(factory=dict)
    closed: bool = False
    _namesrv_index: int = 0
    _route_locks: dict[str, trio.Lock] = attrs.field(factory=dict)
    #: topic -> when its route may be looked up again on demand (the back-off)
    _route_gates: dict[str, RouteGate] = attrs.field(factory=dict)
    _heartbeat_now: trio.Event = attrs.field(factory=trio.Event)
    _heartbeat_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: what answers a broker's CHECK_TRANSACTION_STATE (set by transactional producers), and
    #: their check listeners by producer group
    transaction_checker: Callable[[str, RemotingCommand], Awaitable[None]] | None = None
    transaction_listeners: dict[str, Any] = attrs.field(factory=dict)
    #: consumer group -> set (and replaced) when a broker says the group's members changed
    _rebalance_signals: dict[str, trio.Event] = attrs.field(factory=dict)
    #: topic -> (the route they were made from, its writable queues): a send asks every time
    _publish_cache: dict[str, tuple[TopicRouteData, tuple[MessageQueue, ...]]] = attrs.field(
        factory=dict)

    # ---- requests --------------------------------------------------------------------------

    def request(self, code: int, fields: dict | None = None, body: bytes = b"") -> RemotingCommand:
        return RemotingCommand.request(code, fields, body, language=LANGUAGE)

    async def invoke(self, address: str, request: RemotingCommand, timeout: float | None = None,
                     *, flush: bool = False) -> RemotingCommand:
        """One call to ``address``; raises ``RemotingError`` (connect, broken, timeout).
        ``flush``: the request is written at once (``RemotingClient.invoke``)."""
        if timeout is None:
            timeout = self.config.request_timeout
        client = await self._connection(address)
        return await client.invoke(request, max(timeout, 0.0), flush=flush)

    async def invoke_oneway(self, address: str, request: RemotingCommand) -> None:
        """``request`` to ``address`` with the ONEWAY flag: no answer comes."""
        client = await self._connection(address)
        await client.invoke_oneway(request)

    async def invoke_by_deadline(self, address: str, request: RemotingCommand | PreparedRequest,
                                 *, deadline: float | None = None, flush: bool = False
                                 ) -> RemotingCommand:
        """One call to ``address`` that ends by ``deadline`` (trio time; RemotingTimeout
        then), or, with None, bounded only by the caller's own cancel scope: so a send or a
        pull runs under one deadline, not two. A send passes its deadline and holds no scope
        on its way (``Producer._send``): the connection's timer keeps it, and only a
        connection still to be made waits under a scope. ``flush``: the request is written
        at once (``RemotingClient.invoke``)."""
        client = self.pool.connected(address)
        if client is None:
            with trio.move_on_at(math.inf if deadline is None else deadline):
                client = await self._connection(address)
            if client is None:
                raise RemotingTimeout(f"no time left to connect to {address}")
        return await client.invoke(request, deadline=deadline, flush=flush)

    async def _connection(self, address: str) -> RemotingClient:
        return await self.pool.client(address)

    async def invoke_namesrv(self, request: RemotingCommand, timeout: float | None = None
                             ) -> RemotingCommand:
        """Ask the name servers in turn, starting with the last one that answered."""
        errors = []
        count = len(self.namesrv_addrs)
        for step in range(count):
            index = (self._namesrv_index + step) % count
            address = self.namesrv_addrs[index]
            try:
                response = await self.invoke(address, request, timeout)
            except RemotingError as exc:
                errors.append(f"{address}: {exc}")
                continue
            self._namesrv_index = index
            return response
        raise MQClientError(f"no name server answered: {'; '.join(errors)}")

    # ---- routes -------------------------------------------------------------------------------

    async def fetch_route(self, topic: str, timeout: float | None = None) -> TopicRouteData | None:
        """The name server's route for ``topic`` (None: it does not know the topic)."""
        response = await self.invoke_namesrv(
            self.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), timeout
        )
        if response.code == ResponseCode.TOPIC_NOT_EXIST:
            return None
        if response.code != ResponseCode.SUCCESS:
            raise MQClientError(
                f"name server refused the route of {topic}: {response.code} {response.remark}"
            )
        try:
            return TopicRouteData.decode(response.body)
        except RouteDecodeError as exc:
            raise MQClientError(f"bad route data for {topic}: {exc}") from None

    async def refresh_route(
        self, topic: str, *, max_age: float | None = None, allow_default: bool = False,
        wait_until: float | None = None,
    ) -> TopicRouteData | None:
        """Fetch ``topic``'s route now, if its back-off allows (``RouteGate``: the next lookup
        of a topic 100 ms after the last, the spacing growing to 1 s while lookups find the
        same route), else return the cached one; with ``max_age`` instead, unless it was
        fetched within ``max_age`` seconds (0: now, as the periodic poll does). With
        ``wait_until`` (trio time), a lookup the back-off holds back is waited for, when it
        may start by then. One lookup at a time per topic: callers that waited for one share
        its answer. A topic without a cached route is always looked up (it may have just been
        created). With ``allow_default``, a topic the name server does not know gets TBW102's
        route for publishing. Returns the route (None when the topic has none). Raises
        ``MQClientError`` when no name server answers."""
        gate = self._route_gates.get(topic)
        if gate is None:
            gate = self._route_gates[topic] = RouteGate(
                self.config.route_refresh_min_interval, self.config.route_refresh_max_interval)
        asked = gate.started_count
        lock = self._route_locks.setdefault(topic, trio.Lock())
        while True:
            async with lock:
                cached = topic in self.routes or (allow_default and topic in self.default_routes)
                if gate.started_count != asked and (cached or not allow_default):
                    return self.routes.get(topic)  # a lookup began after our ask: ours too
                now = trio.current_time()
                if not cached:
                    return await self._look_up(topic, gate, allow_default)
                if max_age is not None:
                    if gate.last_start is not None and now - gate.last_start <= max_age:
                        return self.routes.get(topic)
                    return await self._look_up(topic, gate, allow_default)
                opens = gate.opens_at()
                if opens <= now:
                    return await self._look_up(topic, gate, allow_default)
                if wait_until is None or opens > wait_until:
                    return self.routes.get(topic)
            # Wait without the lock, so callers that do not wait are not held up; whoever
            # looks up first when it opens answers every waiter.
            await trio.sleep_until(opens)

    def refresh_route_soon(self, topic: str) -> None:
        """``refresh_route`` in the background (no checkpoint): for a send that ran out of
        time on a broker that never answered (a stopped process), whose own refresh had no
        time left; the next send then goes where the fresh route says."""
        self.nursery.start_soon(self._refresh_in_background, topic)

    async def _refresh_in_background(self, topic: str) -> None:
        try:
            await self.refresh_route(topic, allow_default=True)
        except MQClientError as exc:
            log.debug("client: route of %s not refreshed: %s", topic, exc)

    async def _look_up(self, topic: str, gate: RouteGate, allow_default: bool
                       ) -> TopicRouteData | None:
        """One lookup of ``topic``'s route (and TBW102's, with ``allow_default``, when the
        name server has none), told to its back-off."""
        before = self.routes.get(topic), self.default_routes.get(topic)
        gate.start(trio.current_time())
        try:
            route = await self.fetch_route(topic)
            if route is not None:
                self._set_route(topic, route)
                self.default_routes.pop(topic, None)
                return route
            if allow_default:
                default = await self.fetch_route(DEFAULT_TOPIC)
                if default is not None:
                    self.default_routes[topic] = _default_publish_route(default)
                    self._learn_brokers(default)
                    # The name server no longer routes the topic (its only master went, and
                    # the one that replaced it has not the topic yet): a route kept from
                    # before would send every retry to the old master; TBW102's reaches a
                    # live one, which creates the topic.
                    self.routes.pop(topic, None)
            return None
        finally:
            gate.finish(changed=(self.routes.get(topic), self.default_routes.get(topic)) != before)

    async def route(self, topic: str) -> TopicRouteData | None:
        """The cached route of ``topic``, fetched if there is none yet."""
        route = self.routes.get(topic)
        if route is None:
            route = await self.refresh_route(topic)
        return route

    def _set_route(self, topic: str, route: TopicRouteData) -> None:
        old = self.routes.get(topic)
        self.routes[topic] = route
        if old != route:
            log.debug("client: route of %s is now %s", topic, route)
        self._learn_brokers(route)

    def _learn_brokers(self, route: TopicRouteData) -> None:
        new_address = False
        for data in route.broker_datas:
            known = self.broker_addrs.get(data.broker_name, {})
            if set(data.broker_addrs.values()) - set(known.values()):
                new_address = True
            self.broker_addrs[data.broker_name] = dict(data.broker_addrs)
        if new_address:
            self._heartbeat_now.set()

    def _rebuild_broker_addrs(self) -> None:
        """After a full refresh: forget brokers no route names any more."""
        table: dict[str, dict[int, str]] = {}
        for route in [*self.default_routes.values(), *self.routes.values()]:
            for data in route.broker_datas:
                table[data.broker_name] = dict(data.broker_addrs)
        self.broker_addrs = table

    def publish_queues(self, topic: str) -> list[MessageQueue]:
        """The writable queues of ``topic``: queues with write permission on broker groups
        whose master is in the route (a group without a master takes no writes)."""
        route = self.routes.get(topic) or self.default_routes.get(topic)
        if route is None:
            return []
        cached = self._publish_cache.get(topic)
        if cached is not None and cached[0] is route:  # routes are values: same route, same queues
            return list(cached[1])
        masters = {d.broker_name for d in route.broker_datas if MASTER_ID in d.broker_addrs}
        queues = []
        for data in sorted(route.queue_datas, key=lambda d: d.broker_name):
            if writable(data.perm) and data.broker_name in masters:
                queues.extend(
                    MessageQueue(topic, data.broker_name, i) for i in range(data.write_queue_nums)
                )
        self._publish_cache[topic] = (route, tuple(queues))
        return queues

    def subscribe_queues(self, topic: str) -> list[MessageQueue]:
        """The readable queues of ``topic`` (on any broker group still in the route)."""
        route = self.routes.get(topic)
        if route is None:
            return []
        named = {d.broker_name for d in route.broker_datas if d.broker_addrs}
        queues = []
        for data in sorted(route.queue_datas, key=lambda d: d.broker_name):
            if readable(data.perm) and data.broker_name in named:
                queues.extend(
                    MessageQueue(topic, data.broker_name, i) for i in range(data.read_queue_nums)
                )
        return queues

    def master_addr(self, broker_name: str) -> str | None:
        return self.broker_addrs.get(broker_name, {}).get(MASTER_ID)

    def find_broker_addr(
        self, broker_name: str, broker_id: int = MASTER_ID
    ) -> tuple[str, int] | None:
        """Java's ``findBrokerAddressInSubscribe``: the address of ``broker_id`` in the group,
        else the lowest id present (the master if there is one, else a slave)."""
        addrs = self.broker_addrs.get(broker_name)
        if not addrs:
            return None
        if broker_id in addrs:
            return addrs[broker_id], broker_id
        lowest = min(addrs)
        return addrs[lowest], lowest

    async def find_broker_addr_refreshing(
        self, topic: str, broker_name: str, broker_id: int = MASTER_ID
    ) -> tuple[str, int]:
        found = self.find_broker_addr(broker_name, broker_id)
        if found is None:
            await self.refresh_route(topic)
            found = self.find_broker_addr(broker_name, broker_id)
        if found is None:
            raise MQClientError(f"the broker {broker_name} of topic {topic} is not in its route")
        return found

    async def _run_route_refresh(self) -> None:
        interval = self.config.poll_name_server_interval
        while True:
            await trio.sleep(interval)
            topics = set(self.routes) | set(self.default_routes)
            for topic in sorted(topics):
                try:
                    await self.refresh_route(
                        topic, max_age=0, allow_default=topic in self.default_routes
                    )
                except MQClientError as exc:
                    log.info("client: refreshing the route of %s failed: %s", topic, exc)
            self._rebuild_broker_addrs()

    # ---- groups and heartbeats -------------------------------------------------------------------

    def register_producer(self, group: str) -> None:
        if group in self.producer_groups:
            raise MQClientError(f"producer group {group!r} is already open in this client")
        self.producer_groups.add(group)
        self._heartbeat_now.set()

    def register_consumer(self, group: str) -> None:
        if group in self.consumer_groups:
            raise MQClientError(f"consumer group {group!r} is already open in this client")
        self.consumer_groups[group] = {}
        self._heartbeat_now.set()

    def subscribe(self, group: str, subscription: SubscriptionData) -> None:
        """Record ``group``'s subscription (what heartbeats tell the brokers)."""
        table = self.consumer_groups.setdefault(group, {})
        old = table.get(subscription.topic)
        if old is None or old.sub_string != subscription.sub_string:
            table[subscription.topic] = subscription
            self._heartbeat_now.set()

    def rebalance_signal(self, group: str) -> trio.Event:
        """Set when a broker next says ``group``'s members changed
        (NOTIFY_CONSUMER_IDS_CHANGED); ask again for the next change after it is set."""
        signal = self._rebalance_signals.get(group)
        if signal is None or signal.is_set():
            signal = self._rebalance_signals[group] = trio.Event()
        return signal

    def server_request(self, address: str, request: RemotingCommand) -> None:
        """A request the broker at ``address`` sent on our connection
        (``RemotingClientPool.on_request``)."""
        if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            group = request.ext_fields.get("consumerGroup")
            signal = self._rebalance_signals.get(group or "")
            if signal is not None:
                signal.set()
        elif request.code == RequestCode.CHECK_TRANSACTION_STATE and self.transaction_checker:
            # Answered in a task of its own: the checker may take its time (or hang: then
            # the broker asks again at its next round).
            self.nursery.start_soon(self.transaction_checker, address, request)
        else:
            log.debug("client: ignoring request code %d from a broker", request.code)

    async def consumer_ids(self, group: str, topic: str) -> list[str] | None:
        """The live client ids of ``group`` as a broker of ``topic`` knows them
        (GET_CONSUMER_LIST_BY_GROUP to the first broker group's master, else any of its
        brokers); None when no broker answers with a list."""
        route = self.routes.get(topic)
        names = sorted({d.broker_name for d in route.broker_datas}) if route else []
        for name in names:
            found = self.find_broker_addr(name)
            if found is None:
                continue
            request = self.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                   {"consumerGroup": group})
            try:
                response = await self.invoke(found[0], request)
            except RemotingError as exc:
                log.info("client: listing the consumers of %s at %s failed: %s", group,
                         found[0], exc)
                continue
            if response.code != ResponseCode.SUCCESS:
                log.info("client: %s has no consumer list for %s: %s", found[0], group,
                         response.remark)
                continue
            try:
                return list(ConsumerIdList.decode(response.body).consumer_id_list)
            except RouteDecodeError as exc:
                log.info("client: bad consumer list from %s: %s", found[0], exc)
        return None

    def heartbeat_data(self) -> HeartbeatData:
        return HeartbeatData(
            client_id=self.client_id,
            producer_data_set=[ProducerData(g) for g in sorted(self.producer_groups)],
            consumer_data_set=[
                ConsumerData(
                    group_name=group,
                    consume_type=CONSUME_ACTIVELY,
                    message_model=CLUSTERING,
                    consume_from_where=CONSUME_FROM_LAST_OFFSET,
                    subscription_data_set=[subs[t] for t in sorted(subs)],
                )
                for group, subs in sorted(self.consumer_groups.items())
            ],
        )

    def _all_broker_addresses(self) -> list[str]:
        return sorted({a for addrs in self.broker_addrs.values() for a in addrs.values()})

    async def send_heartbeats(self) -> dict[str, bool]:
        """HEART_BEAT to every broker in the routes (masters only when there is no consumer,
        as Java does); returns address -> success. Failures are logged, never raised."""
        if not self.producer_groups and not self.consumer_groups:
            return {}
        if self.consumer_groups:
            addresses = self._all_broker_addresses()
        else:
            addresses = sorted({a[MASTER_ID] for a in self.broker_addrs.values() if MASTER_ID in a})
        results: dict[str, bool] = {}
        async with self._heartbeat_lock:
            body = self.heartbeat_data().encode()

            async def one(address: str) -> None:
                try:
                    response = await self.invoke(
                        address, self.request(RequestCode.HEART_BEAT, body=body)
                    )
                except RemotingError as exc:
                    log.info("client: heartbeat to %s failed: %s", address, exc)
                    results[address] = False
                    return
                results[address] = response.code == ResponseCode.SUCCESS
                if response.code != ResponseCode.SUCCESS:
                    log.info("client: %s refused the heartbeat: %s", address, response.remark)

            async with trio.open_nursery() as nursery:
                for address in addresses:
                    nursery.start_soon(one, address)
        return results

    async def _run_heartbeat(self) -> None:
        while True:
            with trio.move_on_after(self.config.heartbeat_broker_interval):
                await self._heartbeat_now.wait()
            self._heartbeat_now = trio.Event()
            await self.send_heartbeats()

    async def unregister(self, *, producer_group: str | None = None,
                         consumer_group: str | None = None) -> None:
        """Forget a group and send UNREGISTER_CLIENT for it to every known broker (bounded by
        the request timeout; errors are logged)."""
        if producer_group is not None:
            self.producer_groups.discard(producer_group)
        if consumer_group is not None:
            self.consumer_groups.pop(consumer_group, None)
        fields = {"clientID": self.client_id, "producerGroup": producer_group,
                  "consumerGroup": consumer_group}
        request = self.request(RequestCode.UNREGISTER_CLIENT, fields)

        async def one(address: str) -> None:
            try:
                await self.invoke(address, request)
            except RemotingError as exc:
                log.info("client: unregistering from %s failed: %s", address, exc)

        with trio.move_on_after(self.config.request_timeout) as scope:
            scope.shield = True
            async with trio.open_nursery() as nursery:
                for address in self._all_broker_addresses():
                    nursery.start_soon(one, address)

    def new_uniq_id(self) -> str:
        return _UNIQ_IDS.create(self.client_ip)

    def new_uniq_ids(self, count: int) -> list[str]:
        return _UNIQ_IDS.create_many(self.client_ip, count)


def _default_publish_route(default: TopicRouteData) -> TopicRouteData:
    """TBW102's route as Java producers use it for a new topic: at most
    DEFAULT_TOPIC_QUEUE_NUMS queues per broker (the broker creates that many)."""
    queues = []
    for data in default.queue_datas:
        n = min(DEFAULT_TOPIC_QUEUE_NUMS, data.read_queue_nums)
        queues.append(QueueData(data.broker_name, n, n, data.perm, data.topic_sys_flag))
    return TopicRouteData(queue_datas=queues, broker_datas=default.broker_datas)


@contextlib.asynccontextmanager
async def open_client_instance(
    namesrv_addr: str | Iterable[str], *, config: ClientConfig | None = None, **options: Any
) -> AsyncIterator[ClientInstance]:
    """A ClientInstance for these name servers (``"a:9876;b:9876"``), its background tasks
    running until the block ends. ``options`` are ``ClientConfig`` fields."""
    config = attrs.evolve(config or ClientConfig(), **options)
    addrs = parse_namesrv_addr(namesrv_addr)
    client_ip = config.client_ip or _local_ip(addrs)
    number = next(_INSTANCE_NUMBERS)
    instance_name = config.instance_name or f"{os.getpid()}#{number}"
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            pool = RemotingClientPool(nursery, config.connect_timeout,
                                      credentials=config.credentials, tls=config.tls)
            instance = ClientInstance(
                namesrv_addrs=addrs, config=config, client_id=f"{client_ip}@{instance_name}",
                client_ip=client_ip, pool=pool, nursery=nursery,
            )
            pool.on_request = instance.server_request
            nursery.start_soon(instance._run_route_refresh)
            nursery.start_soon(instance._run_heartbeat)
            try:
                yield instance
            finally:
                instance.closed = True
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await pool.aclose()


@contextlib.asynccontextmanager
async def use_instance(
    namesrv_or_instance: str | Iterable[str] | ClientInstance, options: dict[str, Any]
) -> AsyncIterator[ClientInstance]:
    """The given ClientInstance, or a private one for a name server address."""
    if isinstance(namesrv_or_instance, ClientInstance):
        if options:
            raise TypeError(f"client options {sorted(options)} need a name server address, "
                            "not an existing ClientInstance")
        yield namesrv_or_instance
    else:
        async with open_client_instance(namesrv_or_instance, **options) as instance:
            yield instance
