"""The name server's route table (RocketMQ's RouteInfoManager), as plain state.

Brokers register every 30 s; clients ask which brokers serve a topic. The table knows:
clusters and their broker names, each broker name's addresses by broker id (0 is the master),
each topic's queues per broker name, and when each broker address last registered. Time is
passed in, so expiry is tested without clocks, and the server wraps this in trio.

Rules kept from RocketMQ (docs/remoting.md, 'Name server'): topic queue data comes only from
a master's registration (broker id 0), and only when its data version changed; an address that
registers under another broker id replaces its old entry (a role switch); a broker silent for
120 s, or whose connection closed, is removed. A slave's registration is answered with its
master's address and HA address, which is how a slave finds its master without configuration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from ..wire.metadata import DataVersion, TopicConfigSerializeWrapper
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


@attrs.frozen
class RegisterResult:
    master_addr: str | None
    ha_server_addr: str | None


@attrs.define(eq=False)
class RouteInfoManager:
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
    ) -> RegisterResult:
        self.cluster_addr_table.setdefault(cluster, set()).add(broker_name)
        _, addrs = self.broker_addr_table.setdefault(broker_name, (cluster, {}))
        self.broker_addr_table[broker_name] = (cluster, addrs)
        for other_id in [i for i, a in addrs.items() if a == broker_addr and i != broker_id]:
            del addrs[other_id]  # the same address under a new id: a role switch
        first = addrs.get(broker_id) != broker_addr
        addrs[broker_id] = broker_addr

        version = topics.data_version if topics is not None else DataVersion()
        previous = self.broker_live_table.get(broker_addr)
        changed = first or previous is None or previous.data_version != version
        if broker_id == 0 and topics is not None and changed:
            # only a master's topics make routes, and only when its data version moved
            self._update_topic_queues(broker_name, topics)
        self.broker_live_table[broker_addr] = BrokerLiveInfo(
            now, version, ha_server_addr, connection, cluster, broker_name, broker_id
        )
        if broker_id == 0:
            return RegisterResult(None, None)
        master = addrs.get(0)
        master_live = self.broker_live_table.get(master) if master else None
        return RegisterResult(master, master_live.ha_server_addr if master_live else None)

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

    def unregister_broker(self, *, broker_addr: str, broker_name: str, broker_id: int) -> None:
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
            self.unregister_broker(
                broker_addr=broker_addr, broker_name=live.broker_name, broker_id=live.broker_id
            )

    def scan_not_active(self, now: float, expiry: float = BROKER_EXPIRY_SECONDS) -> list[str]:
        """Remove brokers whose last registration is older than ``expiry`` seconds."""
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
