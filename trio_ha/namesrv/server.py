"""The name server: the route table behind RocketMQ's remoting protocol.

``serve_namesrv(config, task_status=...)`` runs in the caller's nursery and reports its bound
address. Brokers register over it and are dropped 120 s after their last registration, or at
once when their connection closes; clients ask for routes (standard JSON for callers at
version 401 or above, or asking ``acceptStandardJsonOnly``; fastjson's unquoted numeric keys for
older ones, as RocketMQ does since issue #4471).
"""

from __future__ import annotations

import json
import logging

import attrs
import trio

from .. import _backend
from ..remoting import RemotingConnection, RemotingLimits, not_supported, serve_remoting
from ..wire.errors import RouteDecodeError
from ..wire.metadata import DataVersion
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import RegisterBrokerBody, wants_standard_json
from .routes import BROKER_EXPIRY_SECONDS, RouteInfoManager

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class NamesrvConfig:
    listen_port: int = 9876
    bind_address: str = "0.0.0.0"
    #: how often expired brokers are looked for (RocketMQ: every 10 s, first after 5 s)
    scan_interval: float = 10.0
    broker_expiry: float = BROKER_EXPIRY_SECONDS
    #: connections, idle time, buffered bytes, shutdown deadline (the broker's remoting keys)
    remoting: RemotingLimits = attrs.field(factory=RemotingLimits)


@attrs.define(eq=False)
class NameServer:
    config: NamesrvConfig
    routes: RouteInfoManager = attrs.field(factory=RouteInfoManager)
    address: tuple[str, int] | None = None

    async def handle(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        code = request.code
        if code == RequestCode.REGISTER_BROKER:
            return self._register(request, connection)
        if code == RequestCode.UNREGISTER_BROKER:
            self.routes.unregister_broker(
                broker_addr=request.field_str("brokerAddr"),
                broker_name=request.field_str("brokerName"),
                broker_id=request.field_long("brokerId"),
            )
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
        if code == RequestCode.GET_ROUTEINFO_BY_TOPIC:
            topic = request.field_str("topic")
            route = self.routes.pick_route(topic)
            if route is None:
                return RemotingCommand.response_to(
                    request, ResponseCode.TOPIC_NOT_EXIST,
                    remark=f"No topic route info in name server for the topic: {topic}",
                )
            standard = wants_standard_json(
                request.version, request.field_bool("acceptStandardJsonOnly", False)
            )
            return RemotingCommand.response_to(
                request, ResponseCode.SUCCESS, body=route.encode(standard_json=standard)
            )
        if code == RequestCode.GET_BROKER_CLUSTER_INFO:
            return RemotingCommand.response_to(
                request, ResponseCode.SUCCESS, body=self.routes.cluster_info().encode()
            )
        if code == RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER:
            body = json.dumps({"topicList": self.routes.topics()}, separators=(",", ":"))
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=body.encode())
        if code == RequestCode.QUERY_DATA_VERSION:
            return self._query_data_version(request)
        return not_supported(request)

    def _register(
        self, request: RemotingCommand, connection: RemotingConnection
    ) -> RemotingCommand:
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
        result = self.routes.register_broker(
            cluster=request.field_str("clusterName"),
            broker_addr=request.field_str("brokerAddr"),
            broker_name=request.field_str("brokerName"),
            broker_id=request.field_long("brokerId"),
            ha_server_addr=request.field_str("haServerAddr", None),
            topics=topics,
            connection=connection,
            now=trio.current_time(),
        )
        fields: dict[str, str] = {}
        if result.master_addr:
            fields["masterAddr"] = result.master_addr
        if result.ha_server_addr:
            fields["haServerAddr"] = result.ha_server_addr
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields=fields)

    def _query_data_version(self, request: RemotingCommand) -> RemotingCommand:
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

    def connection_closed(self, connection: RemotingConnection) -> None:
        for address in self.routes.connection_closed(connection):
            log.info("namesrv: broker %s removed: its connection closed", address)

    async def run_expiry(self) -> None:
        await trio.sleep(min(5.0, self.config.scan_interval))
        while True:
            now = trio.current_time()
            for address in self.routes.scan_not_active(now, self.config.broker_expiry):
                log.warning("namesrv: broker %s expired (no registration for %g s)",
                            address, self.config.broker_expiry)
            await trio.sleep(self.config.scan_interval)


async def serve_namesrv(
    config: NamesrvConfig = NamesrvConfig(),
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a name server until cancelled; reports its bound (host, port)."""
    server = NameServer(config)
    async with trio.open_nursery() as nursery:
        address: tuple[str, int] = await nursery.start(
            lambda task_status: serve_remoting(
                server.handle, config.listen_port, host=config.bind_address,
                limits=config.remoting, on_close=server.connection_closed,
                task_status=task_status,
            )
        )
        server.address = address
        nursery.start_soon(server.run_expiry)
        log.info("name server listening on %s:%d", *address)
        task_status.started(address)
