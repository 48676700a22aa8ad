"""Who is connected: producer and consumer groups, learned from heartbeats.

A RocketMQ client sends HEART_BEAT every 30 s over each broker connection, naming its client
id and the groups it produces or consumes for (with their subscriptions). A client is dropped
from its groups when its connection closes or after 120 s without a heartbeat, so
GET_CONSUMER_LIST_BY_GROUP lists live consumers only — what rebalancing relies on.

When the set of a consumer group's clients changes — one joins, leaves, closes its connection
or expires — or a member's subscriptions change, every remaining member is sent
NOTIFY_CONSUMER_IDS_CHANGED (oneway), as RocketMQ's broker does: the Java client then rebalances
at once instead of at its next 20 s rebalance. Without it, a consumer joining a group keeps the
queues it was given while the old members keep theirs too, and both consume them for up to 20 s;
a lite pull consumer waits 20 s for its first queues.

The table is bounded: a group disappears with its last client; a consumer group's
subscriptions are those of its latest heartbeat (as RocketMQ's ``updateSubscription``), not
every topic ever named; the admin processor registers consumers only for subscription groups
the broker has (themselves capped); and at most ``max_producer_groups``
(``maxProducerGroupNums``) producer groups are tracked — a heartbeat naming more is answered,
its extra groups ignored.
"""

from __future__ import annotations

import itertools
import logging

import attrs

from ..remoting import RemotingConnection
from ..wire.heartbeat import ConsumerData, HeartbeatData, SubscriptionData
from ..wire.remoting import RemotingCommand, RequestCode

log = logging.getLogger(__name__)

CLIENT_EXPIRY_SECONDS = 120.0
#: ``maxProducerGroupNums``' default
DEFAULT_MAX_PRODUCER_GROUPS = 10_000


@attrs.define
class ClientChannel:
    client_id: str
    connection: RemotingConnection
    last_update: float
    #: the client's language and version, from its heartbeat's frame
    language: str = "JAVA"
    version: int = 0


@attrs.define(eq=False)
class ConsumerGroupInfo:
    group: str
    #: connection -> channel
    channels: dict[int, ClientChannel] = attrs.field(factory=dict)
    #: topic -> subscription (the latest heartbeat wins, as in RocketMQ)
    subscriptions: dict[str, SubscriptionData] = attrs.field(factory=dict)
    consume_type: str | None = None
    message_model: str | None = None
    consume_from_where: str | None = None


@attrs.define(eq=False)
class ClientManager:
    consumers: dict[str, ConsumerGroupInfo] = attrs.field(factory=dict)
    #: producer group -> connection -> channel
    producers: dict[str, dict[int, ClientChannel]] = attrs.field(factory=dict)
    max_producer_groups: int = attrs.field(default=DEFAULT_MAX_PRODUCER_GROUPS, kw_only=True)
    _full_logged: bool = attrs.field(default=False, init=False)
    #: opaques of the notifications this broker sends (clients ignore them for oneways)
    _opaques: itertools.count = attrs.field(factory=itertools.count, init=False)

    def heartbeat(self, data: HeartbeatData, connection: RemotingConnection, now: float, *,
                  language: str = "JAVA", version: int = 0) -> None:
        """Register the heartbeat's producers and consumers. The caller decides which
        consumer groups may register (those the broker has a subscription group for)."""
        key = id(connection)
        channel = ClientChannel(data.client_id, connection, now, language, version)
        for producer in data.producer_data_set:
            channels = self.producers.get(producer.group_name)
            if channels is None:
                if self._producers_full():
                    continue
                channels = self.producers[producer.group_name] = {}
            channels[key] = channel
        for consumer in data.consumer_data_set:
            self._register_consumer(consumer, channel)

    def _producers_full(self) -> bool:
        full = len(self.producers) >= self.max_producer_groups
        if full and not self._full_logged:
            log.warning("clients: maxProducerGroupNums=%d producer groups registered; "
                        "heartbeats naming more are not tracked", self.max_producer_groups)
        self._full_logged = full
        return full

    def _register_consumer(self, consumer: ConsumerData, channel: ClientChannel) -> None:
        info = self.consumers.get(consumer.group_name)
        if info is None:
            info = self.consumers[consumer.group_name] = ConsumerGroupInfo(consumer.group_name)
        key = id(channel.connection)
        joined = key not in info.channels
        info.channels[key] = channel
        info.consume_type = consumer.consume_type
        info.message_model = consumer.message_model
        info.consume_from_where = consumer.consume_from_where
        # The latest heartbeat's set replaces the group's (RocketMQ's updateSubscription drops
        # the topics a heartbeat no longer names).
        subscriptions = {s.topic: s for s in consumer.subscription_data_set}
        resubscribed = subscriptions.keys() != info.subscriptions.keys()
        info.subscriptions = subscriptions
        if joined or resubscribed:
            self._consumer_ids_changed(info)

    def _consumer_ids_changed(self, info: ConsumerGroupInfo) -> None:
        """Tell every member of the group to rebalance now (see the module's docstring)."""
        for channel in info.channels.values():
            channel.connection.send_nowait(RemotingCommand.request(
                RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": info.group},
                oneway=True, opaque=next(self._opaques)))

    def _drop_consumer_channels(self, group: str, keys: list[int]) -> None:
        """Remove these channels from the group; notify those left, or drop the group."""
        info = self.consumers[group]
        for key in keys:
            del info.channels[key]
        if not info.channels:
            del self.consumers[group]
        elif keys:
            self._consumer_ids_changed(info)

    def unregister(self, client_id: str, *, producer_group: str | None,
                   consumer_group: str | None) -> None:
        if producer_group:
            channels = self.producers.get(producer_group, {})
            for key in [k for k, c in channels.items() if c.client_id == client_id]:
                del channels[key]
            if not channels:
                self.producers.pop(producer_group, None)
        if consumer_group:
            info = self.consumers.get(consumer_group)
            if info is not None:
                self._drop_consumer_channels(
                    consumer_group,
                    [k for k, c in info.channels.items() if c.client_id == client_id])

    def connection_closed(self, connection: RemotingConnection) -> None:
        key = id(connection)
        for group in list(self.producers):
            channels = self.producers[group]
            channels.pop(key, None)
            if not channels:
                del self.producers[group]
        for group in list(self.consumers):
            if key in self.consumers[group].channels:
                self._drop_consumer_channels(group, [key])

    def expire(self, now: float, expiry: float = CLIENT_EXPIRY_SECONDS) -> None:
        for group in list(self.producers):
            channels = self.producers[group]
            for key in [k for k, c in channels.items() if now - c.last_update > expiry]:
                del channels[key]
            if not channels:
                del self.producers[group]
        for group in list(self.consumers):
            channels = self.consumers[group].channels
            self._drop_consumer_channels(
                group, [k for k, c in channels.items() if now - c.last_update > expiry])

    def producer_connection(self, group: str) -> RemotingConnection | None:
        """A live connection of a producer of ``group`` (the one heard from last), for a
        transaction check; None when the group has none."""
        channels = self.producers.get(group)
        live = [c for c in (channels or {}).values() if c.connection.close_reason is None]
        if not live:
            return None
        return max(live, key=lambda c: c.last_update).connection

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        if info is None:
            return []
        return sorted({c.client_id for c in info.channels.values()})

    def groups_subscribed_to(self, topic: str) -> list[str]:
        """The consumer groups whose clients subscribe to ``topic`` now."""
        return [group for group, info in self.consumers.items() if topic in info.subscriptions]

    def subscription(self, group: str, topic: str) -> SubscriptionData | None:
        info = self.consumers.get(group)
        return info.subscriptions.get(topic) if info is not None else None
