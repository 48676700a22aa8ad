"""The controller's Prometheus series, read from its service at each scrape.

``controller_registry(service, servers)`` is a ``CollectorRegistry`` of the controller's own
(never the process-wide default: a name server may embed a controller, and tests run several
in one process) whose collector reads ``ControllerService.statistics()`` when scraped —
elections, heartbeats, live brokers, broker sets, commits and conflicts, role-change notices —
per broker set (labels ``cluster``, ``brokerName``) its master epoch, in-sync set epoch and
in-sync set size, and whether it has a master, from the state the controller last committed
or read, and the remoting listener's connections. Nothing is kept between scrapes. (A follower
of several controllers over etcd shows the sets as it last read them.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from ..remoting import RemotingServer
from ..remoting.metrics import remoting_families
from .service import ControllerService

__all__ = ["ControllerCollector", "controller_registry"]

#: counter name -> (statistics field, help)
_COUNTERS = {
    "trio_ha_controller_elections": ("elections", "Elections that made a master."),
    "trio_ha_controller_own_elections": (
        "controller_elections", "Elections the controller started for a dead master."),
    "trio_ha_controller_heartbeats": ("heartbeats", "Broker heartbeats received."),
    "trio_ha_controller_commits": ("commits", "Decisions committed to the state store."),
    "trio_ha_controller_commit_conflicts": (
        "conflicts", "Commits refused because a record changed since it was read."),
    "trio_ha_controller_notices_sent": ("notices_sent", "Role-change notices sent."),
    "trio_ha_controller_notices_failed": (
        "notices_failed", "Role-change notices that could not be sent within 3 s."),
    "trio_ha_controller_notices_dropped": (
        "notices_dropped", "Role-change notices dropped: too many waiting."),
}
_GAUGES = {
    "trio_ha_controller_brokers_alive": ("brokers_alive", "Brokers whose heartbeat counts."),
    "trio_ha_controller_broker_sets": ("sets", "Broker sets the controller knows."),
}


@attrs.define(eq=False)
class ControllerCollector:
    service: ControllerService
    servers: Mapping[str, RemotingServer] = attrs.field(factory=dict[str, RemotingServer])

    def collect(self) -> Iterator[Metric]:
        stats = self.service.statistics()
        for name, (field, text) in _COUNTERS.items():
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], getattr(stats, field))
            yield counter
        for name, (field, text) in _GAUGES.items():
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], getattr(stats, field))
            yield gauge
        yield from self._set_families()
        leader = GaugeMetricFamily("trio_ha_controller_is_leader",
                                   "1 while this controller leads.")
        leader.add_metric([], 1 if self.service.leadership.is_leader else 0)
        yield leader
        yield from remoting_families(self.servers, {})


    def _set_families(self) -> Iterator[Metric]:
        names = ["cluster", "brokerName"]
        families = {
            "master_epoch": GaugeMetricFamily(
                "trio_ha_controller_set_master_epoch",
                "The set's master epoch: it rises at every election.", labels=names),
            "set_epoch": GaugeMetricFamily(
                "trio_ha_controller_set_sync_state_set_epoch",
                "The epoch of the set's in-sync set: it rises at every change of the set.",
                labels=names),
            "in_sync": GaugeMetricFamily(
                "trio_ha_controller_set_in_sync_replicas",
                "Members of the set's in-sync set (the master included).", labels=names),
            "has_master": GaugeMetricFamily(
                "trio_ha_controller_set_has_master", "1 while the set has a master.",
                labels=names),
        }
        for name, stored in sorted(self.service.state.sets.items()):
            record = stored.record
            values = [record.cluster, name]
            families["master_epoch"].add_metric(values, record.master_epoch)
            families["set_epoch"].add_metric(values, record.sync_state_set_epoch)
            families["in_sync"].add_metric(values, len(record.sync_state_set))
            families["has_master"].add_metric(values, 0 if record.master_id is None else 1)
        yield from families.values()


def controller_registry(service: ControllerService,
                        servers: Mapping[str, RemotingServer]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ControllerCollector(service, servers))
    return registry
