"""Registration with the name servers (RocketMQ's ``registerBrokerAll`` and BrokerOuterAPI).

A broker registers with every name server at once: when it starts (before it reports that it
serves, as RocketMQ's ``BrokerController.start`` does), every ``registerNameServerPeriod`` (kept
within 10..60 s, as RocketMQ does) and as soon as its topics change; it unregisters when it
shuts down. REGISTER_BROKER carries the topic table (with the
broker's permission applied) and its CRC; each name server is asked in parallel, each call
bounded by ``registerBrokerTimeoutMills``, so one dead name server delays none of the others.
With ``innerClientAuthenticationCredentials`` (RocketMQ 5's key) every request is signed with
that ACL account (the pool signs), which a name server with ``aclEnable`` requires: an admin
account of its plain_acl.yml.

A name server's answer to a slave names its master (remoting and HA addresses). The slave
remembers the former (where the metadata sync reads from) and points its HA client at the
latter, following a new master when the answer changes — unless ``haMasterAddress`` is
configured, which always wins. With ``haAuthSecret`` a new master is followed (HA and
metadata sync both) only once it has passed the HA handshake (``HAClient.follow_master_address``).

The broker id registered is the configured one until the broker changes role at run time
(``Broker.change_to_master`` / ``change_to_slave``, RocketMQ 5's controller mode): then 0 as
a master, the controller's id as a slave, and the master epoch rides along as the
``stateVersion`` of the topic table's DataVersion (``ReplicasManager`` sets it so; a 5.x name
server keeps a stale master from taking id 0 back by it).

Our name server refuses a second master for a broker name whose master is live (RocketMQ's
lets it replace the first, and the two then take turns in the routes, and the slave follows
whichever registered last). A master refused so when it starts raises
``DuplicateMasterError`` and does not serve: that is a broker started with the wrong
brokerName, brokerId or brokerRole. A master refused later, while serving (a name server
that restarted and met the other one first), keeps serving and logs the refusal at every
registration: stopping a master that works is worse than a route that names the other one.
"""

from __future__ import annotations

import logging

import attrs
import trio

from .._errors import TrioHAError
from ..remoting import RemotingClientPool, RemotingError, open_remoting_client
from ..store import HAClient
from ..wire import record as rec
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import RegisterBrokerBody
from .config import BrokerConfig
from .metadata import TopicConfigManager

__all__ = ["MASTER_ID", "DuplicateMasterError", "Registration"]

log = logging.getLogger(__name__)

#: RocketMQ keeps ``registerNameServerPeriod`` within these bounds (ms)
MIN_REGISTER_PERIOD_MS = 10_000
MAX_REGISTER_PERIOD_MS = 60_000
#: how soon a slave that has not learned its master yet asks again (RocketMQ waits a period)
SLAVE_WITHOUT_MASTER_RETRY = 1.0
#: UNREGISTER_BROKER at shutdown: every name server together, within this (s)
UNREGISTER_TIMEOUT = 2.0
#: ``MixAll.MASTER_ID``: the broker id of a master; a slave's is above it
MASTER_ID = 0


class DuplicateMasterError(TrioHAError):
    """A name server refused this master at startup: another master (brokerId 0) with the same
    brokerName is live at another address. The message is one line, for the operator."""

    def __init__(self, namesrv_addr: str, broker_name: str, broker_addr: str,
                 live_master: str, remark: str) -> None:
        self.namesrv_addr = namesrv_addr
        self.broker_name = broker_name
        self.broker_addr = broker_addr
        #: the address of the master that holds the broker name
        self.live_master = live_master
        super().__init__(
            f"name server {namesrv_addr} refused this broker ({broker_name}, brokerId 0, "
            f"{broker_addr}) as a second master: {remark}. Stop the master at {live_master} "
            f"first, or give this broker another brokerName, or make it a SLAVE "
            f"(brokerRole=SLAVE, brokerId > 0)"
        )


@attrs.define(eq=False)
class Registration:
    """What this broker tells the name servers, and what a slave learns back."""

    config: BrokerConfig
    #: where clients reach this broker (brokerIP1:listenPort)
    broker_addr: str
    #: where slaves reach this broker's HA service, or None
    ha_addr: str | None
    topics: TopicConfigManager
    pool: RemotingClientPool
    #: the store's HA client (slaves): told where the master's HA service is
    ha_client: HAClient | None = None
    #: the master's remoting address, learned from registration (slaves)
    master_addr: str | None = None
    #: the id registered: the configured brokerId until a role change sets it
    broker_id: int = attrs.field(
        default=attrs.Factory(lambda self: self.config.broker_id, takes_self=True))
    #: the master epoch of the last role change (0: none), sent as the DataVersion's
    #: stateVersion
    state_version: int = 0
    _register_now: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: whether a registration round has completed (the broker serves from then on)
    _started: bool = attrs.field(default=False, init=False)
    #: the name servers whose last answer was a registration: the log says when that changes
    _registered_with: set[str] = attrs.field(factory=set, init=False)
    #: the last round had a refusal as a second master: the next comes soon, not a period
    #: later (a master made at run time may register before the old one has left id 0)
    _refused: bool = attrs.field(default=False, init=False)

    @property
    def is_slave(self) -> bool:
        return self.broker_id != MASTER_ID

    def take_role(self, broker_id: int, state_version: int, master_addr: str | None,
                  ha_client: HAClient | None) -> None:
        """Register from now on as ``broker_id`` (0: the master) with ``state_version``; a
        slave's master is ``master_addr`` until a name server says otherwise, and its HA
        client ``ha_client`` follows the master the name servers name."""
        self.broker_id = broker_id
        self.state_version = state_version
        self.ha_client = ha_client
        if broker_id == MASTER_ID:
            self.master_addr = None
        else:
            self._set_master(master_addr)
        self._registered_with.clear()  # each name server's acceptance is logged again

    def register_soon(self) -> None:
        """Topic configs changed: tell the name servers now (RocketMQ registers at once)."""
        self._register_now.set()

    def register_request(self) -> RemotingCommand:
        wrapper = self.topics.registration_wrapper()
        if self.state_version:
            wrapper = attrs.evolve(wrapper, data_version=attrs.evolve(
                wrapper.data_version, state_version=self.state_version))
        body = RegisterBrokerBody(wrapper).encode()
        return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
            "brokerName": self.config.broker_name,
            "brokerAddr": self.broker_addr,
            "clusterName": self.config.broker_cluster_name,
            "haServerAddr": self.ha_addr or "",
            "brokerId": self.broker_id,
            "compressed": False,
            # UtilAll.crc32: the same masked CRC-32 as a record's BODYCRC
            "bodyCrc32": rec.body_crc(body),
        }, body=body)

    async def register_all(self) -> None:
        """REGISTER_BROKER with every name server (each bounded by its timeout). The first
        round raises ``DuplicateMasterError`` if a name server refuses this master because
        another holds its broker name, after unregistering from those that accepted it."""
        timeout = self.config.register_broker_timeout_mills / 1000
        request = self.register_request()
        refusals: list[DuplicateMasterError] = []
        async with trio.open_nursery() as nursery:
            for address in self.config.namesrv_addresses:
                nursery.start_soon(self._register_one, address, request, timeout, refusals)
        self._refused = bool(refusals)
        if not refusals:
            self._started = True
            return
        if self._started:
            for refusal in refusals:
                log.error("broker: %s", refusal)
            return
        # Not serving yet: leave no trace in the name servers that took it, close the
        # connections (serve_broker closes the pool only once it serves), and stop.
        await self.unregister_all()
        await self.pool.aclose()
        raise refusals[0]

    async def _register_one(self, address: str, request: RemotingCommand, timeout: float,
                            refusals: list[DuplicateMasterError]) -> None:
        try:
            response = await self.pool.invoke(address, request, timeout)
        except RemotingError as exc:
            log.warning("broker: registering with name server %s failed: %s", address, exc)
            self._registered_with.discard(address)
            self.pool.forget(address)
            return
        live_master = response.ext_fields.get("masterAddr")
        if (response.code == ResponseCode.NO_PERMISSION and live_master
                and self.broker_id == MASTER_ID and live_master != self.broker_addr):
            refusals.append(DuplicateMasterError(
                address, self.config.broker_name, self.broker_addr, live_master,
                response.remark or "another master holds this broker name"))
            return
        if response.code != ResponseCode.SUCCESS:
            log.warning("broker: name server %s refused the registration: %s", address,
                        response.remark)
            self._registered_with.discard(address)
            return
        if address not in self._registered_with:
            self._registered_with.add(address)
            log.info("broker: %s (%s, brokerId %d) registered with name server %s",
                     self.config.broker_name, self.broker_addr, self.broker_id, address)
        if self.is_slave:
            self._follow_master(response.ext_fields.get("masterAddr"),
                                response.ext_fields.get("haServerAddr"))

    def _follow_master(self, master_addr: str | None, ha_addr: str | None) -> None:
        client = self.ha_client
        if client is not None and not self.config.store.ha_master_address and ha_addr:
            # With haAuthSecret the HA client moves only to a master that passes the
            # handshake; the metadata sync follows it then, not before.
            client.follow_master_address(ha_addr, lambda: self._set_master(master_addr))
        else:
            self._set_master(master_addr)

    def _set_master(self, master_addr: str | None) -> None:
        if master_addr != self.master_addr:
            log.info("broker: master of %s is now %s", self.config.broker_name,
                     master_addr or "none (no master registered)")
            self.master_addr = master_addr

    async def run(self) -> None:
        """Register again every period, or sooner when asked, until cancelled. The first
        registration is the caller's (``register_all`` before the broker reports it serves)."""
        period = min(max(self.config.register_name_server_period, MIN_REGISTER_PERIOD_MS),
                     MAX_REGISTER_PERIOD_MS) / 1000
        while True:
            # A slave that has not learned its master yet (it registered first), or a master
            # refused while another held id 0, asks again soon instead of waiting a period.
            soon = self._refused or (self.is_slave and self.master_addr is None)
            wait = SLAVE_WITHOUT_MASTER_RETRY if soon else period
            with trio.move_on_after(wait):
                await self._register_now.wait()
            # A change while registering sets the new event: it is registered next round.
            self._register_now = trio.Event()
            await self.register_all()

    async def unregister_all(self, timeout: float = UNREGISTER_TIMEOUT) -> None:
        """UNREGISTER_BROKER with every name server, in parallel, within ``timeout``. Runs
        at shutdown, when the pool's readers are already cancelled: each call gets its own
        short-lived connection."""
        request = RemotingCommand.request(RequestCode.UNREGISTER_BROKER, {
            "brokerName": self.config.broker_name, "brokerAddr": self.broker_addr,
            "clusterName": self.config.broker_cluster_name, "brokerId": self.broker_id,
        })

        async def one(address: str) -> None:
            try:
                async with open_remoting_client(address, connect_timeout=timeout,
                                                credentials=self.pool.credentials) as client:
                    response = await client.invoke(request, timeout)
            except RemotingError as exc:
                log.info("broker: unregistering from %s failed: %s", address, exc)
                return
            if response.code != ResponseCode.SUCCESS:
                # without ACL, a name server may take this for another's request while it
                # has not yet seen the registering connection close (which removes us too)
                log.info("broker: name server %s refused the unregistration: %s", address,
                         response.remark)

        with trio.move_on_after(timeout):
            async with trio.open_nursery() as nursery:
                for address in self.config.namesrv_addresses:
                    nursery.start_soon(one, address)
