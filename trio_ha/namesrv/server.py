"""The name server: the route table and the KV config behind RocketMQ's remoting protocol.

``serve_namesrv(config, task_status=...)`` runs in the caller's nursery and reports its bound
address. Brokers register over it and are dropped 120 s after their last registration, or at
once when their connection closes; clients ask for routes (standard JSON for callers at
version 401 or above, or asking ``acceptStandardJsonOnly``; fastjson's unquoted numeric keys for
older ones, as RocketMQ does since issue #4471).

It also serves what mqadmin asks a name server, as RocketMQ 4.9.8's DefaultRequestProcessor
does: the KV config (``kvconfig``, written to ``kvConfigPath``), deleting a topic's routes,
wiping or adding back a broker's write permission, the topics of a cluster, and its own
configuration (``getNamesrvConfig``; ``updateNamesrvConfig`` for the keys that can change while
it runs). A registration from a stale master (a live address holds its id with a greater
``stateVersion``, RocketMQ 5's fence) is ignored and answered SUCCESS naming no master, as
RocketMQ 5 answers it. Answers that differ on purpose: a second master for a live broker name,
with the same stateVersion, is refused (``routes.MasterConflict``), and so is an
UNREGISTER_BROKER (or a registration of the same address) from another connection than the
live one that registered it (``routes.RegistrationHeld``). With ``aclEnable``,
REGISTER_BROKER and UNREGISTER_BROKER need an admin account's signature as the admin verbs do
(RocketMQ 5's brokers sign them with ``innerClientAuthenticationCredentials``, ours too; a
RocketMQ 4.9 broker cannot sign, and needs its address in ``globalWhiteRemoteAddresses``).

Why one module at about 600 lines: the server is the request table of the name server (one
handler per request code around ``routes`` and the KV config); the route rules themselves
live in ``routes``.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import trio

from .. import _backend
from .._sockets import peer_host
from ..acl import NAMESRV_ADMIN_CODES, AclFile, acl_file_path
from ..config import ConfigError, check_keys, render_value
from ..controller.config import CONTROLLER_FILE_KEYS, ControllerServerConfig
from ..controller.config import ROCKETMQ_KEYS as ROCKETMQ_CONTROLLER_KEYS
from ..controller.server import serve_controller
from ..ratelog import RateLimitedLog
from ..remoting import RemotingConnection, RemotingLimits, RemotingServer, not_supported
from ..remoting.answers import config_update
from ..remoting.metrics import serve_metrics
from ..remoting.tls import TLS_KEYS, TlsServerConfig, tls_settings
from ..wire.acl import ACCESS_KEY
from ..wire.errors import RouteDecodeError
from ..wire.metadata import DataVersion
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import RegisterBrokerBody, TopicList, wants_standard_json
from .kvconfig import DEFAULT_KV_CONFIG_PATH, NAMESPACE_ORDER_TOPIC_CONFIG, KVConfigManager
from .metrics import namesrv_registry
from .routes import BROKER_EXPIRY_SECONDS, MasterConflict, RegistrationHeld, RouteInfoManager

log = logging.getLogger(__name__)

#: the brokers' own verbs that change routes: with aclEnable they need an admin account's
#: signature, as the admin verbs do (our extension: RocketMQ's name server checks nothing, and
#: anyone who reaches it could unregister a live master and register their own)
BROKER_CODES = frozenset({RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER})
#: what the name server's ACL checks (every other request is a lookup, open to all)
ACL_CHECKED_CODES = NAMESRV_ADMIN_CODES | BROKER_CODES


@attrs.frozen(kw_only=True)
class NamesrvConfig:
    listen_port: int = 9876
    bind_address: str = "0.0.0.0"
    #: how often expired brokers are looked for (RocketMQ: every 10 s, first after 5 s)
    scan_interval: float = 10.0
    broker_expiry: float = BROKER_EXPIRY_SECONDS
    #: connections, idle time, buffered bytes, shutdown deadline (the broker's remoting keys)
    remoting: RemotingLimits = attrs.field(factory=RemotingLimits)
    #: where the KV config is kept (RocketMQ's kvConfigPath); None: in memory only
    kv_config_path: str | None = DEFAULT_KV_CONFIG_PATH
    #: put the ORDER_TOPIC_CONFIG value of a topic in its route's ``orderTopicConf``
    order_message_enable: bool = False
    #: the Prometheus endpoint's port (GET /metrics on bind_address; 0: the OS chooses);
    #: None serves no metrics
    metrics_port: int | None = None
    #: the admin verbs (delete topic, write permissions, KV config, config updates) and the
    #: brokers' REGISTER/UNREGISTER_BROKER need an admin account of plain_acl.yml (our
    #: extension: RocketMQ's name server checks nothing)
    acl_enable: bool = False
    #: where plain_acl.yml is (default: $ROCKETMQ_HOME/conf/plain_acl.yml)
    plain_acl_file: str | None = None
    #: TLS on the port: RocketMQ's ``tls.server.*`` keys (namesrv.conf or tls.config.file)
    tls_server: TlsServerConfig = attrs.field(factory=TlsServerConfig)
    #: enableControllerInNamesrv: a controller in this process, on its own port (the self
    #: peer's port of controllerDLegerPeers, or controllerListenPort; 9878 by default), as
    #: RocketMQ's NamesrvStartup embeds one; None: no controller
    controller: ControllerServerConfig | None = None

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> NamesrvConfig:
        """A ``namesrv.conf`` (RocketMQ's keys) as a config. Unknown keys are an error naming
        the closest known one; RocketMQ's tuning keys (thread pools, buffers) are accepted
        and named in one warning."""
        ignored = check_keys(properties, FILE_KEYS | TLS_KEYS | CONTROLLER_FILE_KEYS,
                             accepted=ROCKETMQ_NAMESRV_KEYS | ROCKETMQ_CONTROLLER_KEYS)
        if ignored:
            log.warning("namesrv.conf: RocketMQ keys with no meaning here, ignored: %s",
                        ", ".join(ignored))
        values: dict[str, Any] = {}
        for key, raw in properties.items():
            key, raw = key.strip(), str(raw).strip()
            if key in ("listenPort", "metricsPort"):
                port = _port(key, raw)
                values["listen_port" if key == "listenPort" else "metrics_port"] = port
            elif key == "bindAddress":
                values["bind_address"] = raw
            elif key == "kvConfigPath":
                values["kv_config_path"] = os.path.expanduser(raw)
            elif key == "aclEnable":
                values["acl_enable"] = _boolean(key, raw)
            elif key == "enableControllerInNamesrv" and _boolean(key, raw):
                controller = ControllerServerConfig.from_properties(properties, embedded=True)
                values["controller"] = attrs.evolve(
                    controller, bind_address=str(properties.get("bindAddress", "0.0.0.0")))
            elif key == "plainAclFile":
                values["plain_acl_file"] = os.path.expanduser(raw)
            elif key == "serverChannelMaxIdleTimeSeconds":
                values["remoting"] = attrs.evolve(RemotingLimits(),
                                                  idle_timeout=_positive_ms(key, raw) * 1000)
            elif key in RUNTIME_KEYS:
                field, parse = RUNTIME_KEYS[key]
                values[field] = parse(key, raw)
        values["tls_server"] = TlsServerConfig.from_settings(tls_settings(properties))
        return cls(**values)

    def to_properties(self) -> dict[str, str]:
        """GET_NAMESRV_CONFIG: the settings under RocketMQ's keys (the scan interval is 5.x's
        ``scanNotActiveBrokerInterval``; the expiry is RocketMQ's fixed 120 s, named after its
        constant), in milliseconds where RocketMQ counts them so."""
        values: dict[str, object] = {
            "listenPort": self.listen_port,
            "bindAddress": self.bind_address,
            "kvConfigPath": self.kv_config_path,
            "orderMessageEnable": self.order_message_enable,
            "scanNotActiveBrokerInterval": round(self.scan_interval * 1000),
            "brokerChannelExpiredTime": round(self.broker_expiry * 1000),
            "serverChannelMaxIdleTimeSeconds": round(self.remoting.idle_timeout),
            "metricsPort": self.metrics_port,
            "aclEnable": self.acl_enable,
            "plainAclFile": self.plain_acl_file,
            "configBlackList": ";".join(CONFIG_BLACK_LIST),
            "enableControllerInNamesrv": self.controller is not None,
        }
        if self.controller is not None:
            values.update({k: v for k, v in self.controller.to_properties().items()
                           if k not in ("listenPort", "bindAddress", "configBlackList",
                                        "metricsPort")})
            values["controllerListenPort"] = self.controller.listen_port
            values["controllerMetricsPort"] = self.controller.metrics_port
        rendered = {key: render_value(value) for key, value in values.items()}
        return {key: text for key, text in sorted(rendered.items()) if text is not None}


#: UPDATE_NAMESRV_CONFIG refuses these with NO_PERMISSION, as RocketMQ's configBlackList does
CONFIG_BLACK_LIST = ("configBlackList", "configStorePath", "kvConfigPath", "rocketmqHome")


def _positive_ms(key: str, raw: str) -> float:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a whole number of milliseconds") from None
    if value <= 0:
        raise ConfigError(f"{key}={value} must be positive")
    return value / 1000


def _port(key: str, raw: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise ConfigError(f"{key}={value} is not a port (0..65535)")
    return value


def _boolean(key: str, raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise ConfigError(f"{key}={raw!r} is not true or false")
    return raw.lower() == "true"


#: the keys UPDATE_NAMESRV_CONFIG changes while the name server runs: key -> (field, parser)
RUNTIME_KEYS: dict[str, tuple[str, Callable[[str, str], object]]] = {
    "orderMessageEnable": ("order_message_enable", _boolean),
    "scanNotActiveBrokerInterval": ("scan_interval", _positive_ms),
    "brokerChannelExpiredTime": ("broker_expiry", _positive_ms),
}


#: the keys a namesrv.conf may set here (``NamesrvConfig.from_properties``)
FILE_KEYS = frozenset({"listenPort", "bindAddress", "kvConfigPath", "metricsPort",
                       "enableControllerInNamesrv",
                       "serverChannelMaxIdleTimeSeconds", "aclEnable", "plainAclFile",
                       *RUNTIME_KEYS})
_ROCKETMQ_NAMESRV_KEY_LIST = """
    rocketmqHome configStorePath productEnvName clusterTest serverWorkerThreads
    serverCallbackExecutorThreads serverSelectorThreads serverOnewaySemaphoreValue
    serverAsyncSemaphoreValue serverSocketSndBufSize serverSocketRcvBufSize
    serverPooledByteBufAllocatorEnable useEpollNativeSelector writeBufferHighWaterMark
    writeBufferLowWaterMark serverSocketBacklog
"""
#: RocketMQ 4.9.8's other NamesrvConfig and NettyServerConfig keys: machinery we do not have
ROCKETMQ_NAMESRV_KEYS = frozenset(_ROCKETMQ_NAMESRV_KEY_LIST.split())


def updated_config(config: NamesrvConfig, properties: Mapping[str, str]) -> NamesrvConfig:
    """``config`` with ``properties`` (RocketMQ keys) applied. Raises ConfigError naming the
    keys that cannot change while the name server runs, or are unknown."""
    fixed = sorted(k for k in properties if k in config.to_properties() and k not in RUNTIME_KEYS)
    unknown = sorted(k for k in properties if k not in RUNTIME_KEYS and k not in fixed)
    if fixed or unknown:
        parts = []
        if fixed:
            parts.append(f"cannot change while the name server runs: {', '.join(fixed)}")
        if unknown:
            parts.append(f"unknown to this name server: {', '.join(unknown)}")
        raise ConfigError("; ".join(parts))
    changes = {}
    for key, raw in properties.items():
        field, parse = RUNTIME_KEYS[key]
        changes[field] = parse(key, raw)
    return attrs.evolve(config, **changes)


Handler = Callable[["NameServer", RemotingCommand, RemotingConnection],
                   Awaitable[RemotingCommand]]


@attrs.define(eq=False)
class NameServer:
    config: NamesrvConfig
    routes: RouteInfoManager = attrs.field(
        default=attrs.Factory(lambda self: RouteInfoManager(self.config.broker_expiry),
                              takes_self=True)
    )
    kv: KVConfigManager = attrs.field(factory=KVConfigManager)
    address: tuple[str, int] | None = None
    #: where GET /metrics is served, once serving (None without metrics_port)
    metrics_address: tuple[str, int] | None = None
    #: with aclEnable: the accounts the admin verbs are checked against
    acl: AclFile | None = None
    #: refusals a hostile peer can repeat at will: one line per kind every 10 s
    refusals: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    async def handle(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        handler = HANDLERS.get(request.code)
        if handler is None:
            await trio.lowlevel.checkpoint()
            return not_supported(request)
        if self.acl is not None and request.code in ACL_CHECKED_CODES:
            refusal = self.acl.check(request, peer_host(connection.peer), ACL_CHECKED_CODES)
            if refusal is not None:
                await trio.lowlevel.checkpoint()
                self.refusals.log(logging.WARNING, ("acl", request.code, peer_host(
                    connection.peer)), "namesrv: ACL refused request code %d from %s: %s",
                    request.code, connection.peer, refusal)
                return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION,
                                                   remark=refusal)
        return await handler(self, request, connection)

    # ---- brokers -----------------------------------------------------------------------------

    async def register(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        body = request.body
        expected_crc = request.field_int("bodyCrc32", 0)
        if expected_crc and _backend.engine.crc32(body) != expected_crc:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                               remark="crc32 not match")
        topics = None
        if body:
            try:
                topics = RegisterBrokerBody.decode(
                    body, compressed=request.field_bool("compressed", False)
                ).topic_config_serialize_wrapper
            except RouteDecodeError as exc:
                return RemotingCommand.response_to(
                    request, ResponseCode.SYSTEM_ERROR, remark=f"bad register body: {exc}"
                )
        try:
            result = self.routes.register_broker(
                cluster=request.field_str("clusterName"),
                broker_addr=request.field_str("brokerAddr"),
                broker_name=request.field_str("brokerName"),
                broker_id=request.field_long("brokerId"),
                ha_server_addr=request.field_str("haServerAddr", None),
                topics=topics,
                connection=connection,
                now=trio.current_time(),
                principal=self._principal(request),
            )
        except RegistrationHeld as exc:
            return self._held(request, connection, exc)
        except MasterConflict as exc:
            log.warning("namesrv: refused a second master: %s", exc)
            # masterAddr names who holds the broker name (our broker stops on this answer)
            return RemotingCommand.response_to(
                request, ResponseCode.NO_PERMISSION, remark=str(exc),
                ext_fields={"masterAddr": exc.live_master},
            )
        if result.fenced_by is not None:
            # RocketMQ's answer to a stale registration is a plain SUCCESS: the broker learns
            # its demotion from the controller. The line says why its route did not change.
            self.refusals.log(
                logging.WARNING, ("fenced", request.field_str("brokerAddr")),
                "namesrv: ignored the registration of %s as brokerId %s of %s: %s holds that id "
                "with a greater stateVersion (a stale master, RocketMQ #6316)",
                request.field_str("brokerAddr"), request.field_str("brokerId"),
                request.field_str("brokerName"), result.fenced_by)
        fields: dict[str, str] = {}
        if result.master_addr:
            fields["masterAddr"] = result.master_addr
        if result.ha_server_addr:
            fields["haServerAddr"] = result.ha_server_addr
        # As RocketMQ: the order-topic configs go back to the broker in the body.
        orders = self.kv.namespace(NAMESPACE_ORDER_TOPIC_CONFIG)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields=fields,
                                           body=orders.encode() if orders is not None else b"")

    async def unregister(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        try:
            self.routes.unregister_broker(
                broker_addr=request.field_str("brokerAddr"),
                broker_name=request.field_str("brokerName"),
                broker_id=request.field_long("brokerId"),
                connection=connection,
                principal=self._principal(request),
                now=trio.current_time(),
            )
        except RegistrationHeld as exc:
            return self._held(request, connection, exc)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    def _principal(self, request: RemotingCommand) -> str | None:
        """The ACL account a broker's request was signed by (checked in ``handle``), which may
        also change what it registered from another connection; None without ACL."""
        if self.acl is None:
            return None
        return request.ext_fields.get(ACCESS_KEY)

    def _held(self, request: RemotingCommand, connection: RemotingConnection,
              exc: RegistrationHeld) -> RemotingCommand:
        self.refusals.log(logging.WARNING, ("held", exc.broker_addr),
                          "namesrv: refused a request from %s: %s", connection.peer, exc)
        return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION, remark=str(exc))

    async def query_data_version(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        known = self.routes.data_version(request.field_str("brokerAddr"))
        try:
            asked = DataVersion.decode(request.body) if request.body else None
        except RouteDecodeError:
            asked = None
        changed = known is None or asked != known
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, ext_fields={"changed": changed},
            body=known.encode() if known is not None else b"",
        )

    # ---- routes and topics ---------------------------------------------------------------------

    async def route_by_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        topic = request.field_str("topic")
        route = self.routes.pick_route(topic)
        if route is None:
            return RemotingCommand.response_to(
                request, ResponseCode.TOPIC_NOT_EXIST,
                remark=f"No topic route info in name server for the topic: {topic}",
            )
        if self.config.order_message_enable:
            route = attrs.evolve(
                route, order_topic_conf=self.kv.get(NAMESPACE_ORDER_TOPIC_CONFIG, topic)
            )
        standard = wants_standard_json(
            request.version, request.field_bool("acceptStandardJsonOnly", False)
        )
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=route.encode(standard_json=standard)
        )

    async def cluster_info(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS, body=self.routes.cluster_info().encode()
        )

    async def all_topics(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        body = TopicList(self.routes.topics()).encode()
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body)

    async def topics_by_cluster(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """GET_TOPICS_BY_CLUSTER (mqadmin topicList -c): an unknown cluster has no topics."""
        await trio.lowlevel.checkpoint()
        topics = self.routes.topics_by_cluster(request.field_str("cluster"))
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=TopicList(topics).encode())

    async def delete_topic(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV (mqadmin deleteTopic, after the brokers): the topic's routes,
        everywhere or in ``clusterName``'s broker names."""
        await trio.lowlevel.checkpoint()
        topic = request.field_str("topic")
        cluster = request.field_str("clusterName", "") or None
        self.routes.delete_topic(topic, cluster)
        log.info("namesrv: topic %s deleted%s", topic, f" in cluster {cluster}" if cluster else "")
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def wipe_write_perm(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """WIPE_WRITE_PERM_OF_BROKER: ``wipeTopicCount`` says how many topics lost write."""
        return await self._change_write_perm(request, wipe=True)

    async def add_write_perm(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """ADD_WRITE_PERM_OF_BROKER: ``addTopicCount`` says how many topics got it back."""
        return await self._change_write_perm(request, wipe=False)

    async def _change_write_perm(self, request: RemotingCommand, *, wipe: bool
                                 ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        broker_name = request.field_str("brokerName")
        if wipe:
            count = self.routes.wipe_write_perm(broker_name)
        else:
            count = self.routes.add_write_perm(broker_name)
        log.info("namesrv: write permission of %s %s (%d topics)", broker_name,
                 "wiped" if wipe else "added", count)
        field = "wipeTopicCount" if wipe else "addTopicCount"
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           ext_fields={field: count})

    # ---- KV config -----------------------------------------------------------------------------

    async def put_kv_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        namespace = request.field_str("namespace")
        key = request.field_str("key")
        value = request.field_str("value")
        try:
            await self.kv.put(namespace, key, value)
        except OSError as exc:
            return _not_written(request, self.kv.path, exc)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def get_kv_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        namespace = request.field_str("namespace")
        key = request.field_str("key")
        value = self.kv.get(namespace, key)
        if value is None:
            return RemotingCommand.response_to(
                request, ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {namespace} Key: {key}",
            )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           ext_fields={"value": value})

    async def delete_kv_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        namespace = request.field_str("namespace")
        key = request.field_str("key")
        try:
            await self.kv.delete(namespace, key)
        except OSError as exc:
            return _not_written(request, self.kv.path, exc)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    async def kv_list(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        namespace = request.field_str("namespace")
        entries = self.kv.namespace(namespace)
        if entries is None:
            return RemotingCommand.response_to(
                request, ResponseCode.QUERY_NOT_FOUND,
                remark=f"No config item, Namespace: {namespace}",
            )
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=entries.encode())

    # ---- its own configuration -----------------------------------------------------------------

    async def get_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        text = "".join(f"{k}={v}\n" for k, v in self.config.to_properties().items())
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=text.encode())

    async def update_config(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        """UPDATE_NAMESRV_CONFIG: the body is properties text. All or nothing: a key on the
        black list is NO_PERMISSION (RocketMQ's answer); one that cannot change at runtime,
        or that we do not know, or a bad value, is SYSTEM_ERROR naming it."""
        await trio.lowlevel.checkpoint()
        config, properties = config_update(
            request, CONFIG_BLACK_LIST, functools.partial(updated_config, self.config))
        self.config = config
        self.routes.broker_expiry = config.broker_expiry
        log.info("namesrv: configuration updated: %s", properties)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    # ---- housekeeping --------------------------------------------------------------------------

    def connection_closed(self, connection: RemotingConnection) -> None:
        for address in self.routes.connection_closed(connection):
            log.info("namesrv: broker %s removed: its connection closed", address)

    async def serve(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve until cancelled; reports the bound (host, port). With ``metrics_port`` set,
        ``metrics_address`` is set before that report (``serve_namesrv`` loads the KV table
        first, then runs this)."""
        config = self.config
        remoting = RemotingServer(self.handle, config.remoting, on_close=self.connection_closed,
                                  tls=config.tls_server)
        async with trio.open_nursery() as nursery:
            address: tuple[str, int] = await nursery.start(functools.partial(
                remoting.serve, config.listen_port, host=config.bind_address,
            ))
            self.address = address
            if config.metrics_port is not None:
                metrics_address: tuple[str, int] = await nursery.start(functools.partial(
                    serve_metrics, namesrv_registry(self.routes, {"main": remoting}),
                    host=config.bind_address, port=config.metrics_port,
                ))
                self.metrics_address = metrics_address
                log.info("name server: metrics at http://%s:%d/metrics", *metrics_address)
            nursery.start_soon(self.run_expiry)
            if self.acl is not None:
                nursery.start_soon(self.acl.watch)
            log.info("name server listening on %s:%d", *address)
            task_status.started(address)

    async def run_expiry(self) -> None:
        await trio.sleep(min(5.0, self.config.scan_interval))
        while True:
            now = trio.current_time()
            for address in self.routes.scan_not_active(now, self.config.broker_expiry):
                log.warning("namesrv: broker %s expired (no registration for %g s)",
                            address, self.config.broker_expiry)
            await trio.sleep(self.config.scan_interval)


def _not_written(request: RemotingCommand, path: str | None,
                 exc: OSError) -> RemotingCommand:
    """The KV table changed in memory but its file could not be written: say so (RocketMQ only
    logs it and answers SUCCESS, and the change is lost at the next restart)."""
    log.error("namesrv: cannot write the KV config to %s: %s", path, exc)
    return RemotingCommand.response_to(
        request, ResponseCode.SYSTEM_ERROR,
        remark=f"changed in memory, but kvConfigPath {path} was not written: "
               f"{exc.strerror or exc}",
    )


HANDLERS: dict[int, Handler] = {
    RequestCode.REGISTER_BROKER: NameServer.register,
    RequestCode.UNREGISTER_BROKER: NameServer.unregister,
    RequestCode.QUERY_DATA_VERSION: NameServer.query_data_version,
    RequestCode.GET_ROUTEINFO_BY_TOPIC: NameServer.route_by_topic,
    RequestCode.GET_BROKER_CLUSTER_INFO: NameServer.cluster_info,
    RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: NameServer.all_topics,
    RequestCode.GET_TOPICS_BY_CLUSTER: NameServer.topics_by_cluster,
    RequestCode.DELETE_TOPIC_IN_NAMESRV: NameServer.delete_topic,
    RequestCode.WIPE_WRITE_PERM_OF_BROKER: NameServer.wipe_write_perm,
    RequestCode.ADD_WRITE_PERM_OF_BROKER: NameServer.add_write_perm,
    RequestCode.PUT_KV_CONFIG: NameServer.put_kv_config,
    RequestCode.GET_KV_CONFIG: NameServer.get_kv_config,
    RequestCode.DELETE_KV_CONFIG: NameServer.delete_kv_config,
    RequestCode.GET_KVLIST_BY_NAMESPACE: NameServer.kv_list,
    RequestCode.GET_NAMESRV_CONFIG: NameServer.get_config,
    RequestCode.UPDATE_NAMESRV_CONFIG: NameServer.update_config,
}


async def serve_namesrv(
    config: NamesrvConfig = NamesrvConfig(),
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a name server until cancelled; reports its bound (host, port). Raises
    ``KVConfigFileError`` (a ConfigError) if ``kv_config_path`` holds a damaged table. With
    ``controller`` set (enableControllerInNamesrv), a controller runs beside it, started
    first, on its own port."""
    kv = await trio.to_thread.run_sync(functools.partial(KVConfigManager.load,
                                                         config.kv_config_path))
    acl = None
    if config.acl_enable:
        acl = await trio.to_thread.run_sync(AclFile.open, acl_file_path(config.plain_acl_file))
    async with trio.open_nursery() as nursery:
        if config.controller is not None:
            host, port = await nursery.start(serve_controller, config.controller)
            log.info("name server: embedded controller on %s:%d", host, port)
        await NameServer(config, kv=kv, acl=acl).serve(task_status=task_status)
