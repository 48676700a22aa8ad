"""The broker's Prometheus series, read from its live state at each scrape.

``broker_registry(broker, servers)`` is a ``CollectorRegistry`` of the broker's own (never the
process-wide default: several brokers in one process each serve their own) holding one
``BrokerCollector``. The collector keeps nothing between scrapes: it reads the public snapshots
the broker and its store already keep for GET_BROKER_RUNTIME_INFO and the admin commands —
``store.statistics()`` (commitlog offsets, replication per slave or as a slave, the flush and
replication wait histograms of the sync request services), ``broker.stats`` (puts, pulls),
the consumer offsets against the queues' ends (consumer-group lag, as ``admin.consume_stats``
computes it), the connected clients and the remoting servers' connections. So a broker without
a metrics port pays nothing, and one with it pays only when scraped.

Rates are left to Prometheus: puts and pulls are counters (``rate(...[1m])`` gives the decaying
window an operator wants, over any window they choose). Every series carries the labels
``cluster``, ``brokerName`` and ``brokerId`` (Prometheus adds ``instance`` and ``job``). In
controller mode ``brokerId`` is the id the controller gave the broker (its config's is -1 there
for every member, and the id it registers with changes with its role), and the broker adds
its view of its set: the master epoch it acted on last, the in-sync set's epoch and, on the
master, the set's size, and the role changes (elections) it went through.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import CollectorRegistry

from ..remoting import RemotingServer
from ..remoting.metrics import remoting_families
from ..store import (
    HAClientState,
    HAConnectionState,
    HAMasterStatistics,
    HASlaveStatistics,
    StoreStatistics,
    SyncServiceStatistics,
)
from ..wire.metadata import split_offset_key
from .broker import Broker

__all__ = ["BrokerCollector", "broker_registry"]


@attrs.define(eq=False)
class BrokerCollector:
    """Yields the broker's series when scraped (see the module's docstring)."""

    broker: Broker
    #: the remoting servers by listener name (``main``, ``vip``)
    servers: Mapping[str, RemotingServer] = attrs.field(factory=dict)

    @property
    def labels(self) -> dict[str, str]:
        config = self.broker.config
        link = self.broker.controller_link
        broker_id = (link.identity.broker_id if link is not None and link.identity is not None
                     else config.broker_id)
        return {"cluster": config.broker_cluster_name, "brokerName": config.broker_name,
                "brokerId": str(broker_id)}

    def collect(self) -> Iterator[Metric]:
        labels = self.labels
        yield from self._broker_families(labels)
        stats = self.broker.store.statistics()
        yield from _store_families(labels, stats)
        if stats.ha is not None:
            yield from _ha_master_families(labels, stats.ha)
        if stats.ha_slave is not None:
            yield from _ha_slave_families(labels, stats.ha_slave)
        yield from _wait_families(
            labels, "trio_ha_flush_wait",
            "SYNC_FLUSH puts' waits for the disk, from append to answer (timeouts included).",
            stats.group_commit)
        yield from _wait_families(
            labels, "trio_ha_replication_wait",
            "SYNC_MASTER puts' waits for slave acks, from append to answer (timeouts "
            "included).", stats.group_transfer)
        yield from self._consumer_families(labels)
        yield from self._controller_families(labels)
        yield from remoting_families(self.servers, labels)

    def _controller_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        """Controller mode: the broker's view of its set (nothing for a classic broker)."""
        link = self.broker.controller_link
        if link is None:
            return
        state = link.state  # None until the broker has its id
        yield _gauge(labels, "trio_ha_broker_master_epoch",
                     "Controller mode: the master epoch of the set's view this broker last "
                     "acted on (0: no role yet).", state.master_epoch if state else 0)
        yield _gauge(labels, "trio_ha_broker_sync_state_set_epoch",
                     "Controller mode: the epoch of the in-sync set this broker last applied.",
                     state.sync_state_set.epoch if state else 0)
        if state is not None and state.is_master:
            yield _gauge(labels, "trio_ha_broker_in_sync_replicas",
                         "Controller mode, on the master: members of its in-sync set (itself "
                         "included).", len(state.sync_state_set.members))
        yield _counter(labels, "trio_ha_broker_role_changes",
                       "Controller mode: role changes this broker took, each at a higher "
                       "master epoch (the elections it went through, its first role included).",
                       state.role_changes if state else 0)

    def _broker_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        broker = self.broker
        names = list(labels)
        info = GaugeMetricFamily(
            "trio_ha_broker_info", "The broker's role (always 1).", labels=[*names, "role"])
        info.add_metric([*labels.values(), broker.config.role.value], 1)
        yield info
        yield _counter(labels, "trio_ha_messages_put",
                       "Messages stored by sends (a batch counts its messages).",
                       broker.stats.puts)
        yield _counter(labels, "trio_ha_message_put_failures",
                       "Send requests the store did not take.", broker.stats.put_failures)
        yield _counter(labels, "trio_ha_pull_requests",
                       "Pull requests served (RocketMQ's msgGetTotalTodayNow).",
                       broker.stats.gets)

    def _consumer_families(self, labels: dict[str, str]) -> Iterator[Metric]:
        """Per consumer group and topic: messages not consumed yet (the queues' ends less the
        group's committed offsets, over the topic's queues, as GET_CONSUME_STATS counts
        them), and each group's connected clients."""
        broker = self.broker
        store = broker.store
        names = [*labels, "group", "topic"]
        lag = GaugeMetricFamily(
            "trio_ha_consumer_group_lag_messages",
            "Messages the group has not consumed yet: queue max offsets less its committed "
            "offsets.", labels=names)
        for key, committed in broker.metadata.offsets.table().offset_table.items():
            try:
                topic, group = split_offset_key(key)
            except ValueError:
                continue
            config = broker.metadata.topics.get(topic)
            queue_ids = range(config.write_queue_nums) if config is not None else committed
            behind = sum(
                max(0, store.max_queue_offset(topic, queue_id) - max(0, committed.get(queue_id, 0)))
                for queue_id in queue_ids
            )
            lag.add_metric([*labels.values(), group, topic], behind)
        yield lag
        clients = GaugeMetricFamily(
            "trio_ha_consumer_group_clients", "Consumer clients connected, by group.",
            labels=[*labels, "group"])
        for group, info in broker.clients.consumers.items():
            clients.add_metric([*labels.values(), group], len(info.channels))
        yield clients
        producers = GaugeMetricFamily(
            "trio_ha_producer_groups", "Producer groups with a connected client.",
            labels=list(labels))
        producers.add_metric(list(labels.values()), len(broker.clients.producers))
        yield producers


def broker_registry(broker: Broker, servers: Mapping[str, RemotingServer]) -> CollectorRegistry:
    """A registry of the broker's own with its collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(broker, servers))
    return registry


def _gauge(labels: dict[str, str], name: str, documentation: str, value: float) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _counter(labels: dict[str, str], name: str, documentation: str, value: float) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=list(labels))
    family.add_metric(list(labels.values()), value)
    return family


def _store_families(labels: dict[str, str], stats: StoreStatistics) -> Iterator[Metric]:
    yield _gauge(labels, "trio_ha_commitlog_min_offset",
                 "The commitlog's first offset still held (retention moves it).",
                 stats.min_commitlog_offset)
    yield _gauge(labels, "trio_ha_commitlog_max_offset",
                 "One past the commitlog's last byte readers may see.",
                 stats.max_commitlog_offset)
    yield _gauge(labels, "trio_ha_commitlog_flushed_offset",
                 "The commitlog's end on disk (synced).", stats.flushed_offset)
    yield _gauge(labels, "trio_ha_dispatch_behind_bytes",
                 "Commitlog bytes not yet in the consume queues.", stats.dispatch_behind_bytes)
    yield _counter(labels, "trio_ha_commitlog_flushes", "Commitlog syncs.", stats.flushes)
    health = stats.health
    troubled = health is not None and bool(
        health.disk_full or health.allocation_error or health.dispatch_stalled)
    yield _gauge(labels, "trio_ha_store_healthy",
                 "1 unless a full disk, a segment that cannot be made or a stalled dispatch "
                 "keeps the store from taking puts.", 0 if troubled else 1)


def _ha_master_families(labels: dict[str, str], ha: HAMasterStatistics) -> Iterator[Metric]:
    """Replication as the master sees it: one series per slave connection (``slave``: its
    address as the master sees it)."""
    yield _gauge(labels, "trio_ha_ha_slave_connections", "Slave connections to the HA port.",
                 len(ha.connections))
    yield _gauge(labels, "trio_ha_ha_replicated_offset",
                 "The offset enough slaves acknowledged for SYNC_MASTER puts.",
                 ha.replicated_offset)
    names = [*labels, "slave"]
    acked = GaugeMetricFamily(
        "trio_ha_ha_slave_acked_offset", "The offset the slave last acknowledged.",
        labels=names)
    lag = GaugeMetricFamily(
        "trio_ha_ha_slave_lag_bytes", "Bytes the slave is behind the master's log end.",
        labels=names)
    state = GaugeMetricFamily(
        "trio_ha_ha_slave_state", "The master's connection to the slave: 1 for its state.",
        labels=[*names, "state"])
    frames = CounterMetricFamily(
        "trio_ha_ha_slave_frames", "Frames of log bytes sent to the slave, by who sent them: "
        "a server's read round (the slave's link was idle) or the connection's writer.",
        labels=[*names, "sent_by"])
    for connection in ha.connections:
        values = [*labels.values(), connection.address]
        if connection.acked_offset is not None:
            acked.add_metric(values, connection.acked_offset)
        lag.add_metric(values, connection.lag_bytes)
        for candidate in HAConnectionState:
            state.add_metric([*values, candidate.name.lower()],
                             1 if candidate is connection.state else 0)
        frames.add_metric([*values, "round"], connection.frames_pushed)
        frames.add_metric([*values, "writer"], connection.frames_sent - connection.frames_pushed)
    yield from (acked, lag, state, frames)


def _ha_slave_families(labels: dict[str, str], ha: HASlaveStatistics) -> Iterator[Metric]:
    """Replication as the slave sees it."""
    state = GaugeMetricFamily(
        "trio_ha_ha_client_state", "The slave's replication: 1 for its state.",
        labels=[*labels, "state"])
    for candidate in HAClientState:
        state.add_metric([*labels.values(), candidate.value], 1 if candidate is ha.state else 0)
    yield state
    yield _gauge(labels, "trio_ha_ha_client_diverged",
                 "1 when the slave's log differs from its master's (it waits for an operator).",
                 1 if ha.divergence is not None else 0)
    yield _counter(labels, "trio_ha_ha_client_received_bytes",
                   "Log bytes received from masters.", ha.bytes_received)
    yield _counter(labels, "trio_ha_ha_client_spliced_bytes",
                   "Of the log bytes received, those spliced from the socket into segment "
                   "files (large frames; 0 where the system refuses splice).", ha.bytes_spliced)


def _wait_families(labels: dict[str, str], name: str, documentation: str,
                   stats: SyncServiceStatistics | None) -> Iterator[Metric]:
    """A sync request service's waits as a histogram (seconds), its timeouts and what waits
    now. Nothing when the store has no such service (ASYNC_FLUSH; not a SYNC_MASTER)."""
    if stats is None:
        return
    waits = stats.waits
    histogram = HistogramMetricFamily(f"{name}_seconds", documentation, labels=list(labels))
    histogram.add_metric(
        list(labels.values()),
        [(_le(bound), count) for bound, count in waits.cumulative()],
        waits.total_seconds,
    )
    yield histogram
    yield _counter(labels, f"{name}_timeouts", "Waits that ended at their deadline.",
                   stats.timed_out)
    yield _gauge(labels, f"{name}_pending", "Puts waiting now.", stats.pending)


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)
