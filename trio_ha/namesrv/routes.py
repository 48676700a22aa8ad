"""The name server's route table (RocketMQ's RouteInfoManager), as plain state.

Brokers register every 30 s; clients ask which brokers serve a topic. The table knows:
clusters and their broker names, each broker name's addresses by broker id (0 is the master),
each topic's queues per broker name, and when each broker address last registered. Time is
passed in, so expiry is tested without clocks, and the server wraps this in trio.

Rules kept from RocketMQ (docs/remoting.md, 'Name server'): topic queue data comes only from
a master's registration (broker id 0), and only when its data version changed; an address that
registers under another broker id replaces its old entry (a role switch); a broker silent for
120 s, or whose connection closed, is removed. A slave's registration is answered with its
live master's address and HA address (nothing while id 0 has no live holder), which is how a
slave finds its master without configuration, and in controller mode the only way.

Stale masters are fenced by data version, as RocketMQ 5 does (#6316): a broker in
controller mode registers with its master epoch as ``DataVersion.stateVersion``, and a
registration for a broker id that a *different live* address holds with a greater
stateVersion is ignored. RocketMQ answers it SUCCESS with no master named and drops the
ignored address from the live table (its entries under other ids were already removed, since
that removal comes first), so an old master that wakes after a failover cannot take id 0
back from the one the controller elected; it learns its demotion from the controller, not
from us. A registration with the *greater* stateVersion takes the id from the live holder
(the newly elected master over a stale one still connected).

One rule is ours, not RocketMQ's, and it decides what the version leaves open: a second
master (broker id 0) for a broker name is refused while the first is live (``MasterConflict``)
when their stateVersions are *equal*, which is every classic (non-controller) broker, whose
stateVersion is always 0. RocketMQ lets it replace the first, and then the two overwrite each
other at every registration: routes flap between them, and the slave is pointed at whichever
registered last, whose commitlog is not the one it copies. The first master's slot is free
again once it unregisters, its connection closes, or it has been silent longer than the
broker expiry. "Live", for both rules, is registered within that expiry: RocketMQ counts an
address live until its sweep removes it (up to 10 s later).

A second rule of ours: a live registration belongs to the connection that made it (and, with
the name server's ACL on, to the account that signed it). An UNREGISTER_BROKER of it, or a
registration of the same address, from another connection with other credentials is refused
(``RegistrationHeld``) while that connection is open and the registration has not expired.
RocketMQ honours both from anyone, which lets whoever reaches the port unregister a live
master and register their own in its place (the routes, and a slave that follows the name
server, then point at them). Brokers, ours and RocketMQ's, register and unregister over one
connection per name server, so they are not affected.

The admin requests mqadmin sends (RocketMQ 4.9.8's RouteInfoManager does the same): delete a
topic's queues (everywhere, or in one cluster), take write permission away from a broker
name's queues (``wipeWritePerm``, before stopping a broker) or give it back, and list the
topics of a cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from .._errors import TrioHAError
from ..wire.metadata import DataVersion, TopicConfigSerializeWrapper
from ..wire.permission import Permission
from ..wire.route import BrokerData, ClusterInfo, QueueData, TopicRouteData

if TYPE_CHECKING:  # the table only compares connections by identity; it never uses one
    from ..remoting import RemotingConnection

BROKER_EXPIRY_SECONDS = 120.0


@attrs.define
class BrokerLiveInfo:
    last_update: float
    data_version: DataVersion
    ha_server_addr: str | None
    connection: RemotingConnection | None
    cluster: str
    broker_name: str
    broker_id: int
    #: the ACL account that signed the registration (None: the name server checks none)
    principal: str | None = None


@attrs.frozen
class RegisterResult:
    master_addr: str | None
    ha_server_addr: str | None
    #: the live address whose greater stateVersion got this registration ignored (None: it
    #: was recorded); RocketMQ answers such a registration SUCCESS, naming no master
    fenced_by: str | None = None


class MasterConflict(TrioHAError):
    """A master (broker id 0) registered for a broker name whose live master is another
    address. The registration changed nothing."""

    def __init__(self, broker_name: str, live_master: str, intruder: str, silent_for: float,
                 expiry: float) -> None:
        self.broker_name = broker_name
        #: the address that holds the broker name
        self.live_master = live_master
        #: the address that was refused
        self.intruder = intruder
        #: seconds since the live master last registered
        self.silent_for = silent_for
        self.expiry = expiry
        super().__init__(
            f"{broker_name} already has a live master at {live_master} (registered "
            f"{silent_for:.0f} s ago); a second master at {intruder} is refused until that "
            f"one unregisters, disconnects or is silent for {expiry:g} s"
        )


class RegistrationHeld(TrioHAError):
    """A request to unregister, or register again, a live broker address came from another
    connection than the one that registered it, with other credentials. Nothing changed."""

    def __init__(self, broker_addr: str, verb: str, owner: str) -> None:
        self.broker_addr = broker_addr
        super().__init__(
            f"{verb} of {broker_addr} refused: it is registered over another connection "
            f"({owner}) that is still open; only that connection, or the same ACL account, "
            "may change it until it closes or expires"
        )


@attrs.define(eq=False)
class RouteInfoManager:
    #: seconds without a registration after which a broker counts as gone
    broker_expiry: float = BROKER_EXPIRY_SECONDS
    #: topic -> broker name -> queue data
    topic_queue_table: dict[str, dict[str, QueueData]] = attrs.field(factory=dict)
    #: broker name -> (cluster, {broker id: address})
    broker_addr_table: dict[str, tuple[str, dict[int, str]]] = attrs.field(factory=dict)
    cluster_addr_table: dict[str, set[str]] = attrs.field(factory=dict)
    #: broker address -> liveness
    broker_live_table: dict[str, BrokerLiveInfo] = attrs.field(factory=dict)

    def register_broker(
        self,
        *,
        cluster: str,
        broker_addr: str,
        broker_name: str,
        broker_id: int,
        ha_server_addr: str | None,
        topics: TopicConfigSerializeWrapper | None,
        connection: RemotingConnection | None,
        now: float,
        principal: str | None = None,
    ) -> RegisterResult:
        """Record a registration; raises ``MasterConflict`` (and records nothing) for a second
        master of a broker name whose master is live with the same stateVersion, and
        ``RegistrationHeld`` for an address another open connection registered
        (``principal``: the ACL account that signed it). A registration for an id a live
        address holds with a greater stateVersion is ignored (``RegisterResult.fenced_by``)."""
        self._check_owner(broker_addr, connection, principal, now, "registration")
        version = topics.data_version if topics is not None else DataVersion()
        entry = self.broker_addr_table.get(broker_name)
        held = entry[1] if entry is not None else {}
        holder = held.get(broker_id)
        if holder is not None and holder != broker_addr and self._check_holder(
                broker_name, broker_id, holder, broker_addr, version.state_version, now):
            # As RocketMQ: its move (below) comes before its version check, so the ignored
            # address loses its entries under other ids, and its liveness, all the same.
            self._move(held, broker_addr, broker_id)
            self.broker_live_table.pop(broker_addr, None)
            return RegisterResult(None, None, fenced_by=holder)
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        _, addrs = self.broker_addr_table.setdefault(broker_name, (cluster, {}))
        self.broker_addr_table[broker_name] = (cluster, addrs)
        self._move(addrs, broker_addr, broker_id)
        first = addrs.get(broker_id) != broker_addr
        addrs[broker_id] = broker_addr

        previous = self.broker_live_table.get(broker_addr)
        changed = first or previous is None or previous.data_version != version
        if broker_id == 0 and topics is not None and changed:
            # only a master's topics make routes, and only when its data version moved
            self._update_topic_queues(broker_name, topics)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now, version, ha_server_addr, connection, cluster, broker_name, broker_id, principal
        )
        if broker_id == 0:
            return RegisterResult(None, None)
        master = addrs.get(0)
        master_live = self._live(master, now) if master is not None else None
        if master is None or master_live is None:
            return RegisterResult(None, None)
        return RegisterResult(master, master_live.ha_server_addr)

    @staticmethod
    def _move(addrs: dict[int, str], broker_addr: str, broker_id: int) -> None:
        """Drop ``broker_addr``'s entries under ids other than ``broker_id``: the same address
        under a new id is a role switch (a promoted slave's <2,addr> becomes <0,addr>)."""
        for other_id in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
            del addrs[other_id]

    def _live(self, broker_addr: str, now: float) -> BrokerLiveInfo | None:
        """``broker_addr``'s registration if it is live: registered within the expiry."""
        live = self.broker_live_table.get(broker_addr)
        if live is None or now - live.last_update > self.broker_expiry:
            return None
        return live

    def _check_owner(self, broker_addr: str, connection: RemotingConnection | None,
                     principal: str | None, now: float, verb: str) -> None:
        """Raise ``RegistrationHeld`` unless ``connection`` (or ``principal``) may change the
        registration of ``broker_addr``: it is not live, or it is theirs. A registration
        without a connection (the table used alone) belongs to no one."""
        live = self.broker_live_table.get(broker_addr)
        if live is None or live.connection is None or live.connection is connection:
            return
        if now - live.last_update > self.broker_expiry:
            return
        if principal is not None and principal == live.principal:
            return
        raise RegistrationHeld(broker_addr, verb, str(getattr(live.connection, "peer", "?")))

    def _check_holder(self, broker_name: str, broker_id: int, holder: str, broker_addr: str,
                      state_version: int, now: float) -> bool:
        """Whether a registration of ``broker_addr`` for ``broker_id``, which ``holder`` (another
        address) has, is fenced: the holder is live with a greater stateVersion. Raises
        ``MasterConflict`` for a second master with the same stateVersion as the live one."""
        live = self._live(holder, now)
        if live is None:
            if broker_id == 0:
                # The old master is gone (past expiry, not yet swept): the new one takes its
                # place.
                self.broker_live_table.pop(holder, None)
            return False
        held = live.data_version.state_version
        if held > state_version:
            return True
        if broker_id == 0 and held == state_version:
            raise MasterConflict(broker_name, holder, broker_addr, now - live.last_update,
                                 self.broker_expiry)
        return False  # a newer epoch's master (or any slave) takes the id, as in RocketMQ

    def _update_topic_queues(self, broker_name: str, topics: TopicConfigSerializeWrapper) -> None:
        names = set(topics.topic_config_table)
        for topic, config in topics.topic_config_table.items():
            self.topic_queue_table.setdefault(topic, {})[broker_name] = QueueData(
                broker_name=broker_name,
                read_queue_nums=config.read_queue_nums,
                write_queue_nums=config.write_queue_nums,
                perm=config.perm,
                topic_sys_flag=config.topic_sys_flag,
            )
        for topic in list(self.topic_queue_table):  # topics the master no longer has
            if topic not in names:
                self._drop_queue(topic, broker_name)

    def _drop_queue(self, topic: str, broker_name: str) -> None:
        queues = self.topic_queue_table.get(topic)
        if queues is not None:
            queues.pop(broker_name, None)
            if not queues:
                del self.topic_queue_table[topic]

    def unregister_broker(self, *, broker_addr: str, broker_name: str, broker_id: int,
                          connection: RemotingConnection | None = None,
                          principal: str | None = None, now: float = 0.0) -> None:
        """UNREGISTER_BROKER; raises ``RegistrationHeld`` (and changes nothing) when
        ``broker_addr`` is live and was registered over another open connection by other
        credentials. Without a ``connection`` (the table used alone) it is not checked."""
        if connection is not None:
            self._check_owner(broker_addr, connection, principal, now, "UNREGISTER_BROKER")
        self._forget(broker_addr, broker_name, broker_id)

    def _forget(self, broker_addr: str, broker_name: str, broker_id: int) -> None:
        self.broker_live_table.pop(broker_addr, None)
        entry = self.broker_addr_table.get(broker_name)
        if entry is None:
            return
        cluster, addrs = entry
        if addrs.get(broker_id) == broker_addr:
            del addrs[broker_id]
        if not addrs:
            del self.broker_addr_table[broker_name]
            names = self.cluster_addr_table.get(cluster)
            if names is not None:
                names.discard(broker_name)
                if not names:
                    del self.cluster_addr_table[cluster]
            for topic in list(self.topic_queue_table):
                self._drop_queue(topic, broker_name)

    def _remove_address(self, broker_addr: str) -> None:
        live = self.broker_live_table.get(broker_addr)
        if live is not None:
            self._forget(broker_addr, live.broker_name, live.broker_id)

    def scan_not_active(self, now: float, expiry: float | None = None) -> list[str]:
        """Remove brokers whose last registration is older than ``expiry`` seconds (by default
        the table's ``broker_expiry``)."""
        if expiry is None:
            expiry = self.broker_expiry
        stale = [a for a, live in self.broker_live_table.items() if now - live.last_update > expiry]
        for address in stale:
            self._remove_address(address)
        return stale

    def connection_closed(self, connection: RemotingConnection) -> list[str]:
        """Remove the brokers that registered over ``connection``."""
        gone = [a for a, live in self.broker_live_table.items() if live.connection is connection]
        for address in gone:
            self._remove_address(address)
        return gone

    # ---- admin ---------------------------------------------------------------------------

    def delete_topic(self, topic: str, cluster: str | None = None) -> None:
        """DELETE_TOPIC_IN_NAMESRV: forget the topic's queues, everywhere or (``cluster``) on
        that cluster's broker names only. A master that still has the topic brings it back
        when its topic table's DataVersion next changes, as in RocketMQ."""
        if cluster is None:
            self.topic_queue_table.pop(topic, None)
            return
        for broker_name in self.cluster_addr_table.get(cluster, ()):
            self._drop_queue(topic, broker_name)

    def wipe_write_perm(self, broker_name: str) -> int:
        """WIPE_WRITE_PERM_OF_BROKER: clear the write bit of every queue of ``broker_name``, so
        producers stop choosing it (until its master registers a new DataVersion). Returns the
        number of topics it has queues of."""
        return self._set_perm(broker_name, lambda perm: perm & ~Permission.WRITE)

    def add_write_perm(self, broker_name: str) -> int:
        """ADD_WRITE_PERM_OF_BROKER: give ``broker_name``'s queues read and write permission
        back (RocketMQ sets exactly read+write). Returns the number of topics."""
        return self._set_perm(broker_name, lambda perm: Permission.READ | Permission.WRITE)

    def _set_perm(self, broker_name: str, change: Callable[[int], int]) -> int:
        count = 0
        for queues in self.topic_queue_table.values():
            data = queues.get(broker_name)
            if data is not None:
                queues[broker_name] = attrs.evolve(data, perm=int(change(data.perm)))
                count += 1
        return count

    def topics_by_cluster(self, cluster: str) -> list[str]:
        """GET_TOPICS_BY_CLUSTER: the topics with queues on the cluster's broker names (none
        for an unknown cluster)."""
        names = self.cluster_addr_table.get(cluster, set())
        return sorted(topic for topic, queues in self.topic_queue_table.items()
                      if not names.isdisjoint(queues))

    # ---- queries -------------------------------------------------------------------------

    def pick_route(self, topic: str) -> TopicRouteData | None:
        queues = self.topic_queue_table.get(topic)
        if not queues:
            return None
        broker_datas = []
        for broker_name in sorted(queues):
            entry = self.broker_addr_table.get(broker_name)
            if entry is not None:
                cluster, addrs = entry
                broker_datas.append(BrokerData(cluster, broker_name, dict(addrs)))
        return TopicRouteData(
            queue_datas=[queues[name] for name in sorted(queues)], broker_datas=broker_datas,
        )

    def cluster_info(self) -> ClusterInfo:
        return ClusterInfo(
            broker_addr_table={
                name: BrokerData(cluster, name, dict(addrs))
                for name, (cluster, addrs) in self.broker_addr_table.items()
            },
            cluster_addr_table={c: frozenset(n) for c, n in self.cluster_addr_table.items()},
        )

    def topics(self) -> list[str]:
        return sorted(self.topic_queue_table)

    def data_version(self, broker_addr: str) -> DataVersion | None:
        live = self.broker_live_table.get(broker_addr)
        return live.data_version if live is not None else None
