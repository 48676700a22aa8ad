"""The name server's Prometheus series, read from its route table at each scrape.

``namesrv_registry(routes, servers)`` is a ``CollectorRegistry`` of the name server's own
(never the process-wide default: a test or ``trio-ha dev-cluster`` runs name servers and
brokers in one process) whose collector reads the live ``RouteInfoManager`` when scraped: the
brokers registered, per cluster and each with the age of its last registration (a broker whose
age nears the 120 s expiry has stopped registering), the topics routed, and the remoting
connections (``trio_ha.remoting.metrics``). Nothing is kept between scrapes. A name server has
no cluster of its own, so its series carry no node labels; Prometheus adds ``instance``.

The collector takes the route table, not the ``NameServer``, so that the server module can
build it without the two importing each other.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping

import attrs
import trio
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from ..remoting import RemotingServer
from ..remoting.metrics import remoting_families
from .routes import RouteInfoManager

__all__ = ["NamesrvCollector", "namesrv_registry"]


@attrs.define(eq=False)
class NamesrvCollector:
    """Yields the name server's series when scraped (see the module's docstring)."""

    routes: RouteInfoManager
    #: the remoting servers by listener name (``main``)
    servers: Mapping[str, RemotingServer] = attrs.field(factory=dict)

    def collect(self) -> Iterator[Metric]:
        live = self.routes.broker_live_table
        brokers = GaugeMetricFamily(
            "trio_ha_namesrv_brokers", "Brokers registered (not expired), by cluster.",
            labels=["cluster"])
        for cluster, count in sorted(Counter(info.cluster for info in live.values()).items()):
            brokers.add_metric([cluster], count)
        yield brokers
        age = GaugeMetricFamily(
            "trio_ha_namesrv_broker_registration_age_seconds",
            "Seconds since the broker last registered (it expires at 120 s).",
            labels=["cluster", "brokerName", "brokerId", "brokerAddr"])
        now = trio.current_time()
        for address, info in sorted(live.items()):
            age.add_metric([info.cluster, info.broker_name, str(info.broker_id), address],
                           max(0.0, now - info.last_update))
        yield age
        topics = GaugeMetricFamily("trio_ha_namesrv_topics", "Topics with a route.")
        topics.add_metric([], len(self.routes.topic_queue_table))
        yield topics
        yield from remoting_families(self.servers, {})


def namesrv_registry(
    routes: RouteInfoManager, servers: Mapping[str, RemotingServer]
) -> CollectorRegistry:
    """A registry of the name server's own with its collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NamesrvCollector(routes, servers))
    return registry
