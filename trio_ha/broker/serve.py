"""``serve_broker``: a store, its replication, remoting, metadata and name server registration,
in one nursery.

``serve_broker(config, task_status=...)`` runs in the caller's nursery (``nursery.start``) and
reports a ``BrokerAddresses`` once it serves. The order matters:

0. the store directory's lock is taken before anything else, so a second broker started on
   the same directory by mistake stops before it binds, reads or writes anything;
1. the remoting port (listenPort) and RocketMQ's VIP port (listenPort - 2) are bound, so the
   store records the real address as STOREHOST even with port 0;
2. the metadata tables are loaded (in a worker thread) and the system topics added;
3. the store opens: it binds the HA port before it recovers or writes its ``abort`` file, so
   a port already taken stops the start with the store as it was;
4. only then is the ``Broker`` built, complete, and the listeners start serving;
5. the broker registers with every name server (each call bounded by
   registerBrokerTimeoutMills) and reports that it serves; it registers again every
   registerNameServerPeriod and whenever its topics change.

With ``metricsPort`` set, the broker's Prometheus series (``metrics``) are served over HTTP
from step 4 on (the port is bound in step 1 with the others), and the report's
``metrics_addr`` says where.

A master delivers delayed messages when they are due (``schedule``) and asks producers about
undecided transactions (``transactions``). A slave refuses sends,
serves pulls and queries (so consumers keep going while the master is down), learns its
master's HA address from its registration when haMasterAddress is not set — and follows it
when the master changes — and copies topics, consumer offsets, delay offsets and subscription
groups from the master every slaveSyncInterval, never moving an offset back (RocketMQ issue
#1094). The role may change while the broker serves, without a restart
(``Broker.change_to_master`` / ``change_to_slave``): whoever drives it — RocketMQ 5's
controller, an embedding program, a test — gets the live ``Broker`` through ``on_serving``.

Cancelling the nursery shuts down gracefully: listeners close, connections stop reading, held
pulls answer, running requests get at most shutdownWaitTimeSeconds to finish and write their
replies before their connections are closed, the broker unregisters, metadata and the store
are flushed, and the abort file is removed.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import attrs
import trio

from .._sockets import listen_named, peer_host
from ..acl import AclFile, ReplayGuard, acl_file_path
from ..remoting import (
    FastHandler,
    PendingReply,
    RemotingBudgets,
    RemotingClientPool,
    RemotingConnection,
    RemotingLimits,
    RemotingServer,
)
from ..remoting.answers import Reply
from ..remoting.connection import RunInTask
from ..remoting.metrics import serve_metrics
from ..store import MessageStore, StoreLock, open_store
from ..wire.remoting import RemotingCommand, ResponseCode
from .broker import Broker, BrokerAddresses
from .config import VIP_PORT_OFFSET, BrokerConfig
from .controller.link import ControllerLink
from .controller_mode import BrokerTarget
from .dispatch import handle, handle_now, handle_vip
from .metadata import BrokerMetadata, config_dir_of
from .metrics import broker_registry
from .registration import Registration

__all__ = ["load_metadata", "remoting_limits", "serve_broker"]

log = logging.getLogger(__name__)


def load_metadata(config: BrokerConfig) -> BrokerMetadata:
    """The broker's metadata tables from ``<storePathRootDir>/config``, with the system topics
    added. Blocking: run it in a worker thread."""
    metadata = BrokerMetadata.load(
        config_dir_of(config.store.store_path_root_dir),
        default_queue_nums=config.default_topic_queue_nums,
        auto_create_topic=config.auto_create_topic_enable,
        auto_create_subscription_group=config.auto_create_subscription_group,
        broker_permission=config.broker_permission,
        max_subscription_groups=config.max_subscription_group_nums,
        max_auto_created_groups_per_client=(
            config.max_auto_create_subscription_group_nums_per_client),
        max_consumer_offsets=config.max_consumer_offset_nums,
    )
    metadata.topics.ensure_system_topics(config.broker_cluster_name, config.broker_name)
    return metadata


async def serve_broker(
    config: BrokerConfig,
    *,
    task_status: trio.TaskStatus[BrokerAddresses] = trio.TASK_STATUS_IGNORED,
    on_serving: Callable[[Broker], object] | None = None,
) -> None:
    """Run a broker until cancelled; reports its BrokerAddresses through ``task_status``,
    and, just before, hands the live ``Broker`` to ``on_serving`` (to change its role)."""
    lock = await trio.to_thread.run_sync(StoreLock.acquire, config.store.store_path_root_dir)
    try:
        await _serve_locked(config, lock, task_status, on_serving)
    finally:
        lock.release()


async def _serve_locked(
    config: BrokerConfig, lock: StoreLock, task_status: trio.TaskStatus[BrokerAddresses],
    on_serving: Callable[[Broker], object] | None,
) -> None:
    host = config.bind_address
    listeners = await listen_named(config.listen_port, host, "listenPort")
    vip_listeners: list[trio.SocketListener] = []
    metrics_listeners: list[trio.SocketListener] = []
    try:
        port = listeners[0].socket.getsockname()[1]
        if config.vip_channel_enable:
            vip_port = 0 if config.listen_port == 0 else config.listen_port - VIP_PORT_OFFSET
            vip_listeners = await listen_named(vip_port, host, "the VIP port (listenPort - 2)")
        if config.metrics_port is not None:
            metrics_listeners = await listen_named(config.metrics_port, host, "metricsPort")
        if config.listen_port == 0:
            # Port 0 (tests): record the port the OS chose as STOREHOST, so msgIds point here.
            config = attrs.evolve(
                config, store=attrs.evolve(config.store, store_host=f"{config.broker_ip1}:{port}")
            )
        metadata = await trio.to_thread.run_sync(functools.partial(load_metadata, config))
        async with open_store(config.store, lock=lock) as store:
            try:
                await _run(config, store, metadata, listeners, vip_listeners,
                           metrics_listeners, task_status, on_serving)
            finally:
                with trio.CancelScope(shield=True):
                    await metadata.persist_all()
    finally:
        # Serving closes the listeners when it ends; this closes them if it never began.
        with trio.CancelScope(shield=True):
            for listener in [*listeners, *vip_listeners, *metrics_listeners]:
                await listener.aclose()


async def _run(
    config: BrokerConfig,
    store: MessageStore,
    metadata: BrokerMetadata,
    listeners: list[trio.SocketListener],
    vip_listeners: list[trio.SocketListener],
    metrics_listeners: list[trio.SocketListener],
    task_status: trio.TaskStatus[BrokerAddresses],
    on_serving: Callable[[Broker], object] | None,
) -> None:
    """Build the broker and serve until cancelled; unregister on the way out."""
    port = listeners[0].socket.getsockname()[1]
    ha = store.ha_address

    def address_of(bound: list[trio.SocketListener]) -> str | None:
        return f"{config.broker_ip1}:{bound[0].socket.getsockname()[1]}" if bound else None

    addresses = BrokerAddresses(
        broker_addr=f"{config.broker_ip1}:{port}", vip_addr=address_of(vip_listeners),
        ha_addr=f"{config.broker_ip2 or config.broker_ip1}:{ha[1]}" if ha else None,
        metrics_addr=address_of(metrics_listeners),
    )
    async with trio.open_nursery() as nursery:
        # Signed with innerClientAuthenticationCredentials when set: name servers and masters
        # with aclEnable take this broker's registrations and metadata sync then.
        pool = RemotingClientPool(nursery, tls=config.tls_client,
                                  credentials=config.inner_client_credentials)
        registration = Registration(
            config, addresses.broker_addr, addresses.ha_addr, metadata.topics, pool,
            store.ha_client,
        )
        try:
            broker = Broker(config, store, metadata, addresses, registration)
            servers = await _serve(nursery, broker, listeners, vip_listeners)
            if metrics_listeners:
                await nursery.start(functools.partial(
                    serve_metrics, broker_registry(broker, servers), host=config.bind_address,
                    port=config.metrics_port or 0, listeners=metrics_listeners,
                ))
                log.info("broker %s: metrics at http://%s/metrics", config.broker_name,
                         addresses.metrics_addr)
            log.info("broker %s (%s) serving on %s", config.broker_name, config.role.value,
                     addresses.broker_addr)
            if on_serving is not None:
                on_serving(broker)
            task_status.started(addresses)
            await trio.sleep_forever()
        finally:
            # Also when the start fails part-way (a name server refusing a second master):
            # the pool's connections are closed, and whoever accepted us forgets us.
            with trio.CancelScope(shield=True):
                await pool.aclose()
                if config.namesrv_addresses:
                    await registration.unregister_all()


def acl_checked(acl: AclFile, fast: FastHandler) -> FastHandler:
    """``fast`` behind the ACL: a request the accounts do not allow is answered
    NO_PERMISSION (RocketMQ 4.9 answers SYSTEM_ERROR) and goes no further."""

    def checked(request: RemotingCommand, connection: RemotingConnection
                ) -> Reply | PendingReply | RunInTask:
        refusal = acl.check(request, peer_host(connection.peer))
        if refusal is None:
            return fast(request, connection)
        log.debug("broker: ACL refused request code %d from %s: %s", request.code,
                  connection.peer, refusal)
        return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION,
                                           remark=refusal)

    return checked


def remoting_limits(config: BrokerConfig) -> RemotingLimits:
    """The limits of the broker's remoting ports, from its config keys."""
    return RemotingLimits(
        idle_timeout=config.server_channel_max_idle_time_seconds,
        max_in_flight=config.server_max_in_flight_requests,
        write_buffer_high_water_mark=config.write_buffer_high_water_mark,
        write_buffer_low_water_mark=config.write_buffer_low_water_mark,
        write_buffer_total=config.server_write_buffer_total_bytes,
        write_timeout=config.server_write_timeout_seconds,
        read_buffer_total=config.server_read_buffer_total_bytes,
        request_timeout=config.server_request_timeout_seconds,
        max_connections=config.server_max_connections,
        shutdown_timeout=config.shutdown_wait_time_seconds,
    )


async def _serve(
    nursery: trio.Nursery,
    broker: Broker,
    listeners: list[trio.SocketListener],
    vip_listeners: list[trio.SocketListener],
) -> dict[str, RemotingServer]:
    """Start the listeners and the broker's own tasks in ``nursery``; returns the remoting
    servers by listener name (``main``, ``vip``), for the metrics."""
    config = broker.config
    limits = remoting_limits(config)
    budgets = RemotingBudgets.for_limits(limits)  # the port and the VIP port share them
    fast: FastHandler = functools.partial(handle_now, broker)
    if config.acl_enable:
        # Every request reaches the fast handler first (it hands the rest to tasks), so the
        # check there covers both ports and every code, once.
        guard = ReplayGuard.of(config.acl_freshness_window_seconds,
                               config.acl_nonce_cache_size) \
            if config.acl_require_freshness else None
        # abandoned, not waited for, if the broker is stopped while the file will not open
        acl = await trio.to_thread.run_sync(functools.partial(
            AclFile.open, acl_file_path(config.plain_acl_file), guard), abandon_on_cancel=True)
        nursery.start_soon(acl.watch)
        fast = acl_checked(acl, fast)
    # A master's slaves get each read round's puts at once, from the reader's task.
    after_round = broker.store.replicate_now
    servers = {"main": RemotingServer(functools.partial(handle, broker), limits, budgets,
                                      on_close=broker.connection_closed, fast=fast,
                                      after_round=after_round, tls=config.tls_server)}
    await nursery.start(functools.partial(servers["main"].serve, 0, listeners=listeners))
    if vip_listeners:
        servers["vip"] = RemotingServer(functools.partial(handle_vip, broker), limits, budgets,
                                        on_close=broker.connection_closed, fast=fast,
                                        after_round=after_round, tls=config.tls_server)
        await nursery.start(functools.partial(servers["vip"].serve, 0, listeners=vip_listeners))
    nursery.start_soon(broker.run_housekeeping)
    if not config.namesrv_addresses:
        log.warning("broker %s: no namesrvAddr (broker.conf, -n or $NAMESRV_ADDR): it registers "
                    "nowhere, so clients find it only by its address %s", config.broker_name,
                    broker.addresses.broker_addr)
    if config.enable_controller_mode:
        # Fenced until the controller names the role: the store takes no puts and nothing is
        # registered; each role change registers at once (docs/controller-mode.md).
        await broker.start_role_services(nursery)
        link = ControllerLink(config, broker.addresses.broker_addr, broker.registration.pool,
                              BrokerTarget(broker))
        broker.controller_link = link
        await nursery.start(link.run)
        if config.namesrv_addresses:
            nursery.start_soon(_register_once_unfenced, broker, link)
        return servers
    if config.namesrv_addresses:
        # Registered before "started": whoever started the broker finds it in the routes.
        await broker.registration.register_all()
        nursery.start_soon(broker.registration.run)
    # A master's schedule and transaction check, or a slave's metadata sync, in a scope of
    # their own: a role change replaces them (``Broker.change_to_master``/``change_to_slave``).
    await broker.start_role_services(nursery)
    return servers


async def _register_once_unfenced(broker: Broker, link: ControllerLink) -> None:
    """A controller-mode broker's periodic registration starts once it has a role."""
    await link.role_known.wait()
    await broker.registration.run()
