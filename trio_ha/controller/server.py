"""The controller over RocketMQ remoting: one handler per request code around ``service``.

``serve_controller(config, task_status=...)`` runs in the caller's nursery (``nursery.start``)
and reports the bound ``(host, port)``; cancelling it shuts down gracefully within the
remoting limits' ``shutdown_timeout`` (running requests finish, replies are written). It opens
the StateStore ``controllerType`` names, reads the whole state, and serves:

- 904 BROKER_HEARTBEAT (one way): into the heartbeat table, the connection as the liveness
  token (its close marks the brokers on it dead at once, as RocketMQ's onBrokerChannelClose),
  served in the reader's round as it is read (``handle_now``), so a heartbeat counts before
  the requests that follow it on its connection are decided;
- 1001 / 1002 / 1003 / 1011 / 1013: decided and committed one at a time (``perform``);
- 1004 / 1006 / 1012: read from the last committed state, concurrently;
- 1005 GET_METADATA_INFO: who leads (ourselves, for ``SoleLeadership``), answered by any
  controller; 1009 / 1010: the controller's configuration as properties text.

A controller that does not lead answers CONTROLLER_NOT_LEADER (2007) to 1001-1004, 1006 and
1011-1013, as RocketMQ's followers do, naming the leader.

``controllerType=etcd`` (several controllers, docs/controller.md "Several controllers over
etcd"): the controller binds its port first (its address is its candidacy's value in the
etcd election), then opens an etcd client, campaigns (``EtcdLeadership``, seen through
``ControllerLeadership``) and keeps its records in an ``EtcdStateStore`` fenced by that
candidacy: a commit of a controller whose leader key is gone writes nothing and is answered
NOT_LEADER (``LeadershipLost``), never a grant. etcd unreachable is SYSTEM_ERROR after the
client's bounded wait (``EtcdUnavailable``), never a hang.

Bad input (a header field missing or not a number, a body that is not the JSON it should
be) is CONTROLLER_INVALID_REQUEST (2005) for that request alone; RocketMQ throws on it and
answers SYSTEM_ERROR. A remark never quotes more than a line of the request back.

``aclEnable`` (controller.conf, or the name server's file for an embedded controller): the
requests that change the controller or its records (``ACL_CHECKED_CODES``: the admin verbs,
and the brokers' own, heartbeats included) need the signature of an admin account of
``plain_acl.yml`` (``trio_ha.acl``, the name server's check); anything else is answered
NO_PERMISSION and changes nothing (a refused heartbeat is dropped). Reads stay open, as the
name server's lookups are. RocketMQ 5.3.3's controller has no ACL at all (its brokers sign
with ``innerClientAuthenticationCredentials`` anyway): this is ours, docs/controller.md "ACL".
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import attrs
import trio

from .._sockets import listen_named, local_address, peer_host
from ..acl import AclFile, acl_file_path
from ..config import ConfigError
from ..ratelog import RateLimitedLog
from ..remoting import RUN_IN_TASK, RemotingConnection, RemotingServer, not_supported
from ..remoting.answers import config_update, one_line
from ..remoting.connection import RunInTask
from ..remoting.metrics import serve_metrics
from ..wire.controller import (
    SPECS,
    AlterSyncStateSetRequestHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    CleanBrokerDataRequestHeader,
    ControllerDecodeError,
    ElectMasterRequestHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetReplicaInfoRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    SyncStateSet,
    decode_broker_names,
)
from ..wire.errors import HeaderFieldError
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from .config import CONFIG_BLACK_LIST, ControllerServerConfig, StoreType, updated_config
from .etcd import (
    ControllerLeadership,
    EtcdStateStore,
    LeadershipLost,
    open_etcd_leadership,
)
from .etcd_client import EtcdClient, EtcdConfig, EtcdError, open_etcd_client
from .journal import Journal
from .leadership import Leadership, SoleLeadership
from .memory import MemoryStateStore
from .metrics import controller_registry
from .rules import (
    Decision,
    alter_sync_state_set,
    apply_broker_id,
    clean_broker_data,
    elect_master,
    get_next_broker_id,
    get_replica_info,
    get_sync_state_data,
    register_broker,
)
from .service import ControllerService, ControllerUnavailable
from .state_store import StateStore

__all__ = [
    "ACL_CHECKED_CODES",
    "LEADER_ONLY_CODES",
    "ControllerServer",
    "EtcdParts",
    "open_controller_service",
    "open_etcd_parts",
    "open_state_store",
    "serve_controller",
]

log = logging.getLogger(__name__)

#: what a controller that does not lead refuses with CONTROLLER_NOT_LEADER (spec §2.1)
LEADER_ONLY_CODES = frozenset({
    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, RequestCode.CONTROLLER_ELECT_MASTER,
    RequestCode.CONTROLLER_REGISTER_BROKER, RequestCode.CONTROLLER_GET_REPLICA_INFO,
    RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, RequestCode.CLEAN_BROKER_DATA,
    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, RequestCode.CONTROLLER_APPLY_BROKER_ID,
})

#: with aclEnable, what needs an admin account's signature: every request that changes the
#: records, the heartbeat table or the configuration, and the configuration's text (it names
#: the store and etcd). Brokers' verbs too: any account that could send APPLY_BROKER_ID,
#: REGISTER_BROKER or heartbeats could take a member's place, so a broker signs with an admin
#: account (innerClientAuthenticationCredentials), as it must for the name server's
#: REGISTER_BROKER. Reads (1004, 1005, 1006, 1012) stay open: they tell what the name server's
#: routes tell any client, and a broker finds the leader before anything else.
ACL_CHECKED_CODES = frozenset({
    RequestCode.BROKER_HEARTBEAT, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
    RequestCode.CONTROLLER_ELECT_MASTER, RequestCode.CONTROLLER_REGISTER_BROKER,
    RequestCode.UPDATE_CONTROLLER_CONFIG, RequestCode.GET_CONTROLLER_CONFIG,
    RequestCode.CLEAN_BROKER_DATA, RequestCode.CONTROLLER_APPLY_BROKER_ID,
})

Handler = Callable[["ControllerServer", RemotingCommand, RemotingConnection],
                   Awaitable[RemotingCommand | None]]


def _respond(request: RemotingCommand, decision: Decision) -> RemotingCommand:
    fields = None
    if decision.header is not None:
        fields = SPECS[type(decision.header)].encode(decision.header)
    body = decision.body.encode() if decision.body is not None else b""
    remark = None if decision.remark is None else one_line(decision.remark)
    return RemotingCommand.response_to(request, decision.code, remark=remark,
                                       ext_fields=fields, body=body)


def _invalid(request: RemotingCommand, why: object) -> RemotingCommand:
    return RemotingCommand.response_to(request, ResponseCode.CONTROLLER_INVALID_REQUEST,
                                       remark=one_line(f"bad request: {why}"))


@attrs.define(eq=False)
class ControllerServer:
    service: ControllerService
    #: where the controller is reached, once bound (``serve``)
    address: tuple[str, int] | None = None
    remoting: RemotingServer | None = None
    #: where GET /metrics is served, once serving (None without metricsPort)
    metrics_address: tuple[str, int] | None = None
    #: with aclEnable: the accounts ``ACL_CHECKED_CODES`` are checked against (``serve``
    #: loads plain_acl.yml unless one is given)
    acl: AclFile | None = None
    #: requests the ACL refused
    acl_refusals: int = 0
    #: refusals a hostile peer can repeat at will: one line per kind every 10 s
    refusals: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))

    @property
    def config(self) -> ControllerServerConfig:
        return self.service.config

    async def handle(self, request: RemotingCommand, connection: RemotingConnection
                     ) -> RemotingCommand | None:
        handler = HANDLERS.get(request.code)
        if handler is None:
            await trio.lowlevel.checkpoint()
            return not_supported(request)
        refused = self._acl_refusal(request, connection)
        if refused is not None:
            await trio.lowlevel.checkpoint()
            return None if request.is_oneway else refused
        if request.code in LEADER_ONLY_CODES and not self.service.leadership.is_leader:
            await trio.lowlevel.checkpoint()
            return self._not_leader(request)
        try:
            return await handler(self, request, connection)
        except (HeaderFieldError, ControllerDecodeError) as exc:
            return _invalid(request, exc)
        except LeadershipLost:
            # deposed between the check above and the commit (a pause past the lease): the
            # fence wrote nothing; the broker asks the new leader
            if isinstance(self.service.leadership, ControllerLeadership):
                await self.service.leadership.lost()
            return self._not_leader(request)
        except (ControllerUnavailable, EtcdError) as exc:
            return RemotingCommand.response_to(request, ResponseCode.SYSTEM_ERROR,
                                               remark=str(exc))

    def handle_now(self, request: RemotingCommand, connection: RemotingConnection
                   ) -> RemotingCommand | None | RunInTask:
        """The reader's own round (``FastHandler``): heartbeats, served as they are read and
        in that order; everything else in a task (``handle``). A heartbeat read before a
        request on the same connection is recorded before that request is decided (a broker
        heartbeats, then asks for its first election: a task each, trio would run them in
        either order), and a flood of heartbeats costs no task each."""
        if request.code != RequestCode.BROKER_HEARTBEAT:
            return RUN_IN_TASK
        response = self._acl_refusal(request, connection)
        if response is None:
            try:
                response = self._heartbeat(request, connection)
            except (HeaderFieldError, ControllerDecodeError) as exc:
                response = _invalid(request, exc)
        return None if request.is_oneway else response

    def _acl_refusal(self, request: RemotingCommand, connection: RemotingConnection
                     ) -> RemotingCommand | None:
        """NO_PERMISSION when ACL is on and the request's signature does not allow it."""
        if self.acl is None or request.code not in ACL_CHECKED_CODES:
            return None
        refusal = self.acl.check(request, peer_host(connection.peer), ACL_CHECKED_CODES)
        if refusal is None:
            return None
        self.acl_refusals += 1
        self.refusals.log(logging.WARNING, ("acl", request.code),
                          "controller: ACL refused request code %d from %s: %s",
                          request.code, connection.peer, refusal)
        return RemotingCommand.response_to(request, ResponseCode.NO_PERMISSION,
                                           remark=one_line(refusal))

    def _not_leader(self, request: RemotingCommand) -> RemotingCommand:
        leader = self.service.leadership.leader_address
        return RemotingCommand.response_to(
            request, ResponseCode.CONTROLLER_NOT_LEADER,
            remark=f"this controller is not the leader; the leader is "
                   f"{leader or 'not known yet'}")

    async def _perform(self, request: RemotingCommand,
                       decide: Callable[..., Decision]) -> RemotingCommand:
        decision = await self.service.perform(decide)
        assert decision is not None  # the request rules always decide
        return _respond(request, decision)

    # ---- brokers ---------------------------------------------------------------------------

    async def heartbeat(self, request: RemotingCommand, connection: RemotingConnection
                        ) -> RemotingCommand | None:
        """(``handle_now`` serves heartbeats as they are read; this is ``handle``'s.)"""
        await trio.lowlevel.checkpoint()
        response = self._heartbeat(request, connection)
        return None if request.is_oneway else response

    def _heartbeat(self, request: RemotingCommand, connection: RemotingConnection
                   ) -> RemotingCommand:
        header = SPECS[BrokerHeartbeatRequestHeader].decode(request)
        return _respond(request, self.service.heartbeat(header, connection))

    async def get_next_broker_id(self, request: RemotingCommand,
                                 connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[GetNextBrokerIdRequestHeader].decode(request)
        return _respond(request, await self.service.read(
            lambda state, now: get_next_broker_id(state, header)))

    async def apply_broker_id(self, request: RemotingCommand,
                              connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[ApplyBrokerIdRequestHeader].decode(request)
        service = self.service
        return await self._perform(request, lambda state, now: apply_broker_id(
            state, header, service.config.rules_config))

    async def register_broker(self, request: RemotingCommand,
                              connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[RegisterBrokerToControllerRequestHeader].decode(request)
        live = self.service.live
        return await self._perform(
            request, lambda state, now: register_broker(state, live, now, header))

    async def elect_master(self, request: RemotingCommand,
                           connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[ElectMasterRequestHeader].decode(request)
        service = self.service
        return await self._perform(request, lambda state, now: elect_master(
            state, service.live, now, service.config.rules_config, header))

    async def alter_sync_state_set(self, request: RemotingCommand,
                                   connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[AlterSyncStateSetRequestHeader].decode(request)
        body = SyncStateSet.decode(request.body) if request.body else None
        live = self.service.live
        return await self._perform(request, lambda state, now: alter_sync_state_set(
            state, live, now, header, body))

    async def get_replica_info(self, request: RemotingCommand,
                               connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[GetReplicaInfoRequestHeader].decode(request)
        return _respond(request, await self.service.read(
            lambda state, now: get_replica_info(state, header)))

    # ---- admin -----------------------------------------------------------------------------

    async def get_sync_state_data(self, request: RemotingCommand,
                                  connection: RemotingConnection) -> RemotingCommand:
        names = decode_broker_names(request.body)
        live = self.service.live
        return _respond(request, await self.service.read(
            lambda state, now: get_sync_state_data(state, live, now, names)))

    async def clean_broker_data(self, request: RemotingCommand,
                                connection: RemotingConnection) -> RemotingCommand:
        header = SPECS[CleanBrokerDataRequestHeader].decode(request)
        live = self.service.live
        response = await self._perform(
            request, lambda state, now: clean_broker_data(state, live, now, header))
        if response.code == ResponseCode.SUCCESS:
            log.info("controller: cleaned %s of set %s", header.broker_controller_ids_to_clean
                     or "every member", header.broker_name)
        return response

    async def get_metadata(self, request: RemotingCommand,
                           connection: RemotingConnection) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        leadership = self.service.leadership
        header = GetMetaDataResponseHeader(
            group=self.config.group, controller_leader_id=leadership.leader_id,
            controller_leader_address=leadership.leader_address,
            is_leader=leadership.is_leader, peers=self._peers())
        return RemotingCommand.response_to(
            request, ResponseCode.SUCCESS,
            ext_fields=SPECS[GetMetaDataResponseHeader].encode(header))

    def _peers(self) -> str:
        """``n0:host:port;`` per peer, as RocketMQ's DLedger controller writes them."""
        config = self.config
        parts: list[str] = []
        for part in (config.peers or "").split(";"):
            name, sep, address = part.strip().partition("-")
            if sep and address:
                parts.append(f"{name}:{address};")
        if not parts and self.service.leadership.leader_address is not None:
            parts.append(f"{config.self_id}:{self.service.leadership.leader_address};")
        return "".join(parts)

    async def get_config(self, request: RemotingCommand,
                         connection: RemotingConnection) -> RemotingCommand:
        await trio.lowlevel.checkpoint()
        text = "".join(f"{k}={v}\n" for k, v in self.config.to_properties().items())
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=text.encode())

    async def update_config(self, request: RemotingCommand,
                            connection: RemotingConnection) -> RemotingCommand:
        """UPDATE_CONTROLLER_CONFIG: properties text, all or nothing. A key on the black list
        is NO_PERMISSION (RocketMQ's answer); one that cannot change at run time, an unknown
        one or a bad value is SYSTEM_ERROR naming it."""
        await trio.lowlevel.checkpoint()
        config, properties = config_update(
            request, CONFIG_BLACK_LIST, functools.partial(updated_config, self.config))
        self.service.config = config
        log.info("controller: configuration updated: %s", properties)
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS)

    # ---- running ---------------------------------------------------------------------------

    def connection_closed(self, connection: RemotingConnection) -> None:
        self.service.connection_closed(connection)

    async def serve(self, *, listeners: list[trio.SocketListener] | None = None,
                    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Serve until cancelled; reports the bound (host, port)."""
        config = self.config
        self.remoting = remoting = RemotingServer(self.handle, config.remoting,
                                                  on_close=self.connection_closed,
                                                  fast=self.handle_now)
        if config.acl_enable and self.acl is None:
            # a file that cannot be read stops the start: a controller an operator meant to
            # protect must not serve open (abandoned, not waited for, if the start is cancelled)
            self.acl = await trio.to_thread.run_sync(functools.partial(
                AclFile.open, acl_file_path(config.plain_acl_file)), abandon_on_cancel=True)
        async with trio.open_nursery() as nursery:
            if self.acl is not None:
                nursery.start_soon(self.acl.watch)
            # the service first: a connection that closes as soon as it is served must find
            # the elections running
            await nursery.start(self.service.run)
            leadership = self.service.leadership
            if isinstance(leadership, ControllerLeadership):
                await nursery.start(leadership.run, self.service.leadership_gained,
                                    self.service.follow)
            address: tuple[str, int] = await nursery.start(functools.partial(
                remoting.serve, config.listen_port, host=config.bind_address,
                listeners=listeners))
            self.address = address
            if isinstance(leadership, SoleLeadership) and leadership.address is None:
                leadership.address = advertised_address(config, address)
            if config.metrics_port is not None:
                metrics: tuple[str, int] = await nursery.start(functools.partial(
                    serve_metrics, controller_registry(self.service, {"main": remoting}),
                    host=config.bind_address, port=config.metrics_port))
                self.metrics_address = metrics
                log.info("controller: metrics at http://%s:%d/metrics", *metrics)
            log.info("controller listening on %s:%d (leader address %s, store %s)",
                     address[0], address[1], leadership.leader_address,
                     config.store_type.value)
            task_status.started(address)


def advertised_address(config: ControllerServerConfig, bound: tuple[str, int]) -> str:
    """Where brokers reach this controller: the configured address, the self peer's, or
    the bound one (this host's address for a wildcard bind: 127.0.0.1 would send brokers
    of other hosts to themselves, RocketMQ issue #9082)."""
    if config.advertised_address:
        return config.advertised_address
    peer = config.self_peer_address()
    if peer is not None:
        return peer
    host = bound[0]
    if host in ("0.0.0.0", "::", ""):
        host = local_address()
    return f"{host}:{bound[1]}"


HANDLERS: dict[int, Handler] = {
    RequestCode.BROKER_HEARTBEAT: ControllerServer.heartbeat,
    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: ControllerServer.alter_sync_state_set,
    RequestCode.CONTROLLER_ELECT_MASTER: ControllerServer.elect_master,
    RequestCode.CONTROLLER_REGISTER_BROKER: ControllerServer.register_broker,
    RequestCode.CONTROLLER_GET_REPLICA_INFO: ControllerServer.get_replica_info,
    RequestCode.CONTROLLER_GET_METADATA_INFO: ControllerServer.get_metadata,
    RequestCode.CONTROLLER_GET_SYNC_STATE_DATA: ControllerServer.get_sync_state_data,
    RequestCode.UPDATE_CONTROLLER_CONFIG: ControllerServer.update_config,
    RequestCode.GET_CONTROLLER_CONFIG: ControllerServer.get_config,
    RequestCode.CLEAN_BROKER_DATA: ControllerServer.clean_broker_data,
    RequestCode.CONTROLLER_GET_NEXT_BROKER_ID: ControllerServer.get_next_broker_id,
    RequestCode.CONTROLLER_APPLY_BROKER_ID: ControllerServer.apply_broker_id,
}


@attrs.frozen
class EtcdParts:
    """What ``controllerType=etcd`` runs on: the client, the fenced store, the leadership."""

    client: EtcdClient
    store: EtcdStateStore
    leadership: ControllerLeadership


@contextlib.asynccontextmanager
async def open_etcd_parts(config: ControllerServerConfig, address: str
                          ) -> AsyncIterator[EtcdParts]:
    """Connect to ``controllerEtcdEndpoints`` and campaign as ``address`` (what followers
    name in NOT_LEADER) until the block ends; on exit the lease is given back, so the next
    controller leads at once. The store's commits are fenced by the candidacy."""
    async with open_etcd_client(EtcdConfig(config.etcd_endpoints)) as client, \
            open_etcd_leadership(client, config.etcd_keys.election, address,
                                 ttl=config.etcd_lease_seconds) as candidacy:
        store = EtcdStateStore(client, config.etcd_keys.state, fence=candidacy)
        yield EtcdParts(client, store, ControllerLeadership(candidacy, config.self_id))


@contextlib.asynccontextmanager
async def open_state_store(config: ControllerServerConfig) -> AsyncIterator[StateStore]:
    """The StateStore ``controllerType`` names, for one controller: ``journal`` (the
    default) is the synced write-ahead file of ``controller/journal.py`` in
    ``controllerStorePath``; ``memory`` is the in-process store (nothing survives a
    restart). ``etcd`` goes with a leadership: ``open_etcd_parts``."""
    if config.store_type is StoreType.ETCD:
        raise ConfigError("controllerType=etcd: the store is opened with its leadership "
                          "(open_etcd_parts), not alone")
    if config.store_type is StoreType.JOURNAL:
        async with Journal.open(config.store_path) as journal:
            yield journal
        return
    await trio.lowlevel.checkpoint()
    yield MemoryStateStore()


@contextlib.asynccontextmanager
async def open_controller_service(
    config: ControllerServerConfig,
    *,
    store: StateStore | None = None,
    leadership: Leadership | None = None,
    listeners: list[trio.SocketListener] | None = None,
) -> AsyncIterator[tuple[ControllerService, list[trio.SocketListener] | None]]:
    """The service ``serve_controller`` serves, its state loaded, and the listeners to serve
    it on (bound here for ``controllerType=etcd``: the address is what the controller
    campaigns as; else as given). The store and the etcd election live until the block
    ends."""
    async with contextlib.AsyncExitStack() as stack:
        if store is None and config.store_type is StoreType.ETCD:
            if listeners is None:
                listeners = await listen_named(config.listen_port, config.bind_address,
                                               "listenPort")
            sockname = listeners[0].socket.getsockname()
            address = advertised_address(config, (sockname[0], sockname[1]))
            parts = await stack.enter_async_context(open_etcd_parts(config, address))
            store = parts.store
            leadership = leadership or parts.leadership
        elif store is None:
            store = await stack.enter_async_context(open_state_store(config))
        service = ControllerService(config, store,
                                    leadership or SoleLeadership(self_id=config.self_id))
        await service.load()
        yield service, listeners


async def serve_controller(
    config: ControllerServerConfig,
    *,
    store: StateStore | None = None,
    leadership: Leadership | None = None,
    listeners: list[trio.SocketListener] | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run a controller until cancelled; reports its bound (host, port). ``store`` (default:
    the one ``controllerType`` names) and ``leadership`` (default: ``SoleLeadership``; with
    ``controllerType=etcd``, the etcd election) are pluggable; a store passed in outlives
    the controller (a test restarts it on the same state)."""
    async with open_controller_service(config, store=store, leadership=leadership,
                                       listeners=listeners) as (service, bound):
        await ControllerServer(service).serve(listeners=bound, task_status=task_status)
