"""Admin requests: topics, cluster info, broker runtime info and config, topic statistics,
consumer-group progress and lag, offsets, messages by id and by key.

``async with open_admin(namesrv_addr) as admin`` (or ``open_admin(instance)``), then e.g.
``await admin.create_topic("orders", 8)`` — UPDATE_AND_CREATE_TOPIC on every master of the
cluster, as ``mqadmin updateTopic -c`` does; the brokers re-register at once, so the name
server's route follows.

Figures read from every broker group (topic stats, consumer progress, subscription groups,
messages by key) ask the group's master and, when it does not answer, its slaves in turn, as
RocketMQ's tools do
(``BrokerData.selectBrokerAddr``: the master, else a slave). The ``*_by_group`` methods say
which broker of each group answered, or that none did, so that an operator's tool can mark a
figure that comes from a slave (whose copy of the offsets trails the master's by up to
``slaveSyncInterval``) and never show a group nobody answered for as zero.

Why one module at about 700 lines: one method per admin request, each a request and the
decoding of its answer, sharing the group-by-group asking (``_ask_group``) and ``ByGroup``.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any, Generic, TypeVar

import attrs
import trio

from .._errors import unwrap_single_exception
from ..remoting import RemotingError
from ..wire.controller import (
    SPECS,
    BrokerReplicasInfo,
    GetMetaDataResponseHeader,
    encode_broker_names,
)
from ..wire.errors import MetadataDecodeError, RecordDecodeError, RouteDecodeError, WireError
from ..wire.metadata import decode_subscription_groups
from ..wire.permission import Permission
from ..wire.record import (
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    StoredMessage,
    decode_message_id,
    decode_record,
    peek_header,
)
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..wire.route import BrokerData, ClusterInfo, KVTable, TopicList, TopicRouteData
from ..wire.stats import ConsumeStats, TopicStats
from .instance import (
    DEFAULT_TOPIC,
    MASTER_ID,
    ClientInstance,
    MessageQueue,
    MQBrokerError,
    MQClientError,
    MQError,
    use_instance,
)

__all__ = ["Admin", "Answered", "ByGroup", "open_admin"]

#: QUERY_MESSAGE's flag for a query by the client's message id (UNIQ_KEY)
UNIQUE_KEY_QUERY = "_UNIQUE_KEY_QUERY"
#: at most this many messages from each broker for one query by key (RocketMQ's default)
DEFAULT_QUERY_MAX = 32


def parse_properties_body(body: bytes) -> dict[str, str]:
    """GET_BROKER_CONFIG's body: ``key=value`` lines."""
    table = {}
    for line in body.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            table[key.strip()] = value.strip()
    return table


def decode_records(body: bytes, what: str) -> list[StoredMessage]:
    """The records laid end to end in a QUERY_MESSAGE answer."""
    messages = []
    pos = 0
    try:
        while pos < len(body):
            message = decode_record(body, pos)
            messages.append(message)
            pos += peek_header(body, pos).size
    except RecordDecodeError as exc:
        raise MQClientError(f"bad records from {what}: {exc}") from None
    return messages


@attrs.frozen
class Answered:
    """Which broker of a group (``broker_name``) gave its figures, or, when none of them
    did, why (``error``)."""

    broker_name: str
    broker_id: int | None = None
    address: str | None = None
    error: str | None = None

    @property
    def known(self) -> bool:
        return self.broker_id is not None

    @property
    def source(self) -> str:
        """``master``, ``slave`` or ``unknown``: where the group's figures come from."""
        if self.broker_id is None:
            return "unknown"
        return "master" if self.broker_id == MASTER_ID else "slave"


_S = TypeVar("_S")


@attrs.frozen
class ByGroup(Generic[_S]):
    """Figures merged over the broker groups that answered, and who answered for each group
    (sorted by broker name)."""

    figures: _S
    answers: tuple[Answered, ...] = ()

    @property
    def unknown(self) -> tuple[Answered, ...]:
        """The groups none of whose brokers answered: their figures are not in ``figures``."""
        return tuple(a for a in self.answers if not a.known)

    @property
    def from_slaves(self) -> tuple[Answered, ...]:
        return tuple(a for a in self.answers if a.source == "slave")

    def answer_of(self, broker_name: str) -> Answered | None:
        return next((a for a in self.answers if a.broker_name == broker_name), None)

    def complete(self) -> _S:
        """``figures``, or MQClientError when a group's figures are missing from them."""
        if self.unknown:
            raise no_answer(self.unknown)
        return self.figures


def no_answer(unknown: Iterable[Answered]) -> MQClientError:
    return MQClientError("no broker answered for " + "; ".join(
        f"{a.broker_name} ({a.error})" for a in unknown))


def asking_order(data: BrokerData) -> list[tuple[int, str]]:
    """The brokers of a group in the order to ask them: the master, then the slaves by id
    (RocketMQ picks a random slave; by id, repeated looks ask the same one)."""
    return sorted(data.broker_addrs.items())


@attrs.define(eq=False)
class Admin:
    instance: ClientInstance
    #: brokers that could not be reached during this Admin's life, with why: a group's
    #: later requests go straight to its next broker instead of each waiting out the timeout
    #: of a master that hangs (a machine gone without closing its connections stays in the
    #: name server for up to 120 s). A new Admin (each ``status --watch`` refresh) asks again.
    unreachable: dict[str, str] = attrs.field(factory=dict)

    async def _invoke(self, address: str, code: int, fields: dict[str, Any] | None = None,
                      body: bytes = b"", timeout: float | None = None) -> RemotingCommand:
        try:
            response = await self.instance.invoke(
                address, self.instance.request(code, fields, body), timeout
            )
        except RemotingError as exc:
            self.unreachable[address] = str(exc)
            raise MQClientError(f"request {code} to {address} failed: {exc}") from exc
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark, address)
        return response

    # ---- name server -----------------------------------------------------------------------------

    async def cluster_info(self) -> ClusterInfo:
        """GET_BROKER_CLUSTER_INFO: clusters, their broker names, each group's addresses."""
        response = await self.instance.invoke_namesrv(
            self.instance.request(RequestCode.GET_BROKER_CLUSTER_INFO)
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark)
        try:
            return ClusterInfo.decode(response.body)
        except RouteDecodeError as exc:
            raise MQClientError(f"bad cluster info: {exc}") from None

    async def topic_route(self, topic: str) -> TopicRouteData | None:
        """The name server's route of ``topic`` (None: unknown), fetched now."""
        return await self.instance.fetch_route(topic)

    async def topic_list(self) -> list[str]:
        """GET_ALL_TOPIC_LIST_FROM_NAMESERVER."""
        response = await self.instance.invoke_namesrv(
            self.instance.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
        )
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark)
        try:
            return list(json.loads(response.body)["topicList"])
        except (ValueError, KeyError, TypeError) as exc:
            raise MQClientError(f"bad topic list: {exc}") from None

    # ---- topics ---------------------------------------------------------------------------------

    async def create_topic(
        self,
        topic: str,
        queue_nums: int = 8,
        *,
        cluster: str | None = None,
        read_queue_nums: int | None = None,
        write_queue_nums: int | None = None,
        perm: int = Permission.READ | Permission.WRITE,
        order: bool = False,
        topic_filter_type: str = "SINGLE_TAG",
        topic_sys_flag: int = 0,
    ) -> dict[str, str]:
        """UPDATE_AND_CREATE_TOPIC (create, or update the queue numbers and perm) on the
        master of every broker group of ``cluster`` (default: the only cluster). Returns
        broker name -> master address of the groups updated; groups without a master in
        the name server are skipped, and having none at all is an error."""
        info = await self.cluster_info()
        if cluster is None:
            if len(info.cluster_addr_table) != 1:
                raise MQClientError(
                    f"name a cluster: the name server knows {sorted(info.cluster_addr_table)}"
                )
            (cluster,) = info.cluster_addr_table
        names = info.cluster_addr_table.get(cluster)
        if not names:
            raise MQClientError(f"the name server knows no cluster {cluster!r}")
        masters = {}
        for name in sorted(names):
            data = info.broker_addr_table.get(name)
            if data is not None and MASTER_ID in data.broker_addrs:
                masters[name] = data.broker_addrs[MASTER_ID]
        if not masters:
            raise MQClientError(f"no broker group of cluster {cluster} has a master")
        fields = {
            "topic": topic,
            "defaultTopic": DEFAULT_TOPIC,
            "readQueueNums": queue_nums if read_queue_nums is None else read_queue_nums,
            "writeQueueNums": queue_nums if write_queue_nums is None else write_queue_nums,
            "perm": perm,
            "topicFilterType": topic_filter_type,
            "topicSysFlag": topic_sys_flag,
            "order": order,
        }
        failures: dict[str, Exception] = {}

        async def one(name: str, address: str) -> None:
            try:
                await self._invoke(address, RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
            except (MQClientError, MQBrokerError) as exc:
                failures[name] = exc

        with unwrap_single_exception():
            async with trio.open_nursery() as nursery:
                for name, address in masters.items():
                    nursery.start_soon(one, name, address)
        if len(failures) == 1 and len(masters) == 1:
            raise next(iter(failures.values()))
        if failures:
            done = sorted(set(masters) - set(failures))
            raise MQClientError(
                f"creating topic {topic} failed on {sorted(failures)} (done on {done}): "
                + "; ".join(f"{n}: {e}" for n, e in sorted(failures.items()))
            )
        return masters

    async def masters(self, cluster: str | None = None) -> dict[str, str]:
        """Broker name -> master address of every broker group the name server knows (of
        ``cluster`` only, when given)."""
        info = await self.cluster_info()
        names = (set(info.broker_addr_table) if cluster is None
                 else set(info.cluster_addr_table.get(cluster, ())))
        found = {}
        for name in sorted(names):
            data = info.broker_addr_table.get(name)
            if data is not None and MASTER_ID in data.broker_addrs:
                found[name] = data.broker_addrs[MASTER_ID]
        return found

    # ---- name server writes (mqadmin sends them to every name server) ---------------------------

    async def _on_every_namesrv(self, code: int, fields: dict[str, Any],
                                body: bytes = b"") -> list[RemotingCommand]:
        """``code`` to each name server in turn; their answers. Any failure is an error
        naming that name server (the ones before it have the change)."""
        answers = []
        for address in self.instance.namesrv_addrs:
            answers.append(await self._invoke(address, code, fields, body))
        return answers

    async def topics_by_cluster(self, cluster: str) -> list[str]:
        """GET_TOPICS_BY_CLUSTER: the topics on the brokers of ``cluster``."""
        response = await self.instance.invoke_namesrv(
            self.instance.request(RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster}))
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark)
        try:
            return sorted(TopicList.decode(response.body).topic_list)
        except RouteDecodeError as exc:
            raise MQClientError(f"bad topic list: {exc}") from None

    async def delete_topic(self, topic: str, cluster: str | None = None) -> dict[str, str]:
        """mqadmin deleteTopic: DELETE_TOPIC_IN_BROKER on every master of ``cluster`` (all
        clusters by default), then DELETE_TOPIC_IN_NAMESRV on every name server. Returns the
        masters it was deleted on (broker name -> address)."""
        masters = await self.masters(cluster)
        for address in masters.values():
            await self._invoke(address, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic})
        fields: dict[str, Any] = {"topic": topic}
        if cluster is not None:
            fields["clusterName"] = cluster
        await self._on_every_namesrv(RequestCode.DELETE_TOPIC_IN_NAMESRV, fields)
        return masters

    async def wipe_write_perm(self, broker_name: str) -> int:
        """WIPE_WRITE_PERM_OF_BROKER on every name server: producers stop choosing the
        broker's queues (before maintenance); the most topics any name server changed."""
        answers = await self._on_every_namesrv(RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                                               {"brokerName": broker_name})
        return max(int(a.ext_fields.get("wipeTopicCount", 0)) for a in answers)

    async def add_write_perm(self, broker_name: str) -> int:
        """ADD_WRITE_PERM_OF_BROKER on every name server: the reverse of wipe_write_perm."""
        answers = await self._on_every_namesrv(RequestCode.ADD_WRITE_PERM_OF_BROKER,
                                               {"brokerName": broker_name})
        return max(int(a.ext_fields.get("addTopicCount", 0)) for a in answers)

    async def put_kv_config(self, namespace: str, key: str, value: str) -> None:
        """PUT_KV_CONFIG on every name server (e.g. ORDER_TOPIC_CONFIG, mqadmin updateOrderConf)."""
        await self._on_every_namesrv(RequestCode.PUT_KV_CONFIG,
                                     {"namespace": namespace, "key": key, "value": value})

    async def delete_kv_config(self, namespace: str, key: str) -> None:
        await self._on_every_namesrv(RequestCode.DELETE_KV_CONFIG,
                                     {"namespace": namespace, "key": key})

    async def kv_config(self, namespace: str) -> dict[str, str]:
        """GET_KVLIST_BY_NAMESPACE: the namespace's entries ({} when it has none)."""
        response = await self.instance.invoke_namesrv(self.instance.request(
            RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": namespace}))
        if response.code == ResponseCode.QUERY_NOT_FOUND:
            return {}
        if response.code != ResponseCode.SUCCESS:
            raise MQBrokerError(response.code, response.remark)
        try:
            return dict(KVTable.decode(response.body).table)
        except RouteDecodeError as exc:
            raise MQClientError(f"bad KV list: {exc}") from None

    async def namesrv_config(self) -> dict[str, dict[str, str]]:
        """GET_NAMESRV_CONFIG of every name server, by address."""
        answers = await self._on_every_namesrv(RequestCode.GET_NAMESRV_CONFIG, {})
        return {address: parse_properties_body(answer.body)
                for address, answer in zip(self.instance.namesrv_addrs, answers, strict=True)}

    # ---- brokers --------------------------------------------------------------------------------

    async def update_broker_config(self, broker_addr: str, settings: dict[str, str]) -> None:
        """UPDATE_BROKER_CONFIG: change settings of a running broker (the keys it can change
        at runtime; all or nothing)."""
        body = "".join(f"{k}={v}\n" for k, v in settings.items()).encode()
        await self._invoke(broker_addr, RequestCode.UPDATE_BROKER_CONFIG, body=body)

    async def broker_config(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_CONFIG: every setting of the broker, by RocketMQ's key names."""
        response = await self._invoke(broker_addr, RequestCode.GET_BROKER_CONFIG)
        return parse_properties_body(response.body)

    async def subscription_groups(self, broker_addr: str) -> list[str]:
        """GET_ALL_SUBSCRIPTIONGROUP_CONFIG: the names of the broker's consumer groups."""
        response = await self._invoke(broker_addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        try:
            return sorted(decode_subscription_groups(response.body).subscription_group_table)
        except MetadataDecodeError as exc:
            raise MQClientError(f"bad subscription groups from {broker_addr}: {exc}") from None

    async def _ask_group(self, data: BrokerData, code: int,
                         fields: dict[str, Any]) -> tuple[Answered, RemotingCommand | None]:
        """``code`` to the group's master, else to each slave in turn until one answers.
        Only a broker that cannot be reached is passed over: an error code is an answer
        (MQBrokerError)."""
        failures = []
        for broker_id, address in asking_order(data):
            if address in self.unreachable:
                failures.append(f"{address} did not answer earlier: {self.unreachable[address]}")
                continue
            try:
                response = await self._invoke(address, code, fields)
            except (MQClientError, OSError) as exc:
                failures.append(str(exc))
                continue
            return Answered(data.broker_name, broker_id, address), response
        return Answered(data.broker_name, error="; ".join(failures)
                        or "the name server lists no broker of it"), None

    async def _every_group(self) -> list[BrokerData]:
        info = await self.cluster_info()
        return [info.broker_addr_table[name] for name in sorted(info.broker_addr_table)]

    async def topic_stats_by_group(self, topic: str) -> ByGroup[TopicStats]:
        """GET_TOPIC_STATS_INFO from each broker group serving ``topic`` (its master, else a
        slave): each queue's min and max offset and the store time of its last message."""
        route = await self.topic_route(topic)
        if route is None:
            if not (await self.cluster_info()).broker_addr_table:
                # the name server forgets a topic with its last broker
                raise MQClientError(f"the status of {topic} is unknown: the name server lists "
                                    "no broker (all down?) and so knows no topic")
            raise MQClientError(f"the name server knows no topic {topic!r}")
        queues: list = []
        answers = []
        for data in sorted(route.broker_datas, key=lambda d: d.broker_name):
            answer, response = await self._ask_group(data, RequestCode.GET_TOPIC_STATS_INFO,
                                                     {"topic": topic})
            answers.append(answer)
            if response is not None:
                try:
                    queues.extend(TopicStats.decode(response.body).queues)
                except RouteDecodeError as exc:
                    raise MQClientError(f"bad topic stats from {answer.address}: {exc}") from None
        return ByGroup(TopicStats(tuple(sorted(queues))), tuple(answers))

    async def topic_stats(self, topic: str) -> TopicStats:
        """``topic_stats_by_group``'s figures; MQClientError if a group gave none."""
        return (await self.topic_stats_by_group(topic)).complete()

    async def consume_stats_by_group(self, group: str,
                                     topic: str | None = None) -> ByGroup[ConsumeStats]:
        """GET_CONSUME_STATS from every broker group the name server knows (its master, else
        a slave): per queue the broker's max offset, the group's committed offset and so its
        lag (``.lag`` in messages)."""
        total = ConsumeStats()
        fields = {"consumerGroup": group} if topic is None else {"consumerGroup": group,
                                                                 "topic": topic}
        answers = []
        for data in await self._every_group():
            answer, response = await self._ask_group(data, RequestCode.GET_CONSUME_STATS, fields)
            answers.append(answer)
            if response is not None:
                try:
                    total = total.merged(ConsumeStats.decode(response.body))
                except RouteDecodeError as exc:
                    raise MQClientError(
                        f"bad consume stats from {answer.address}: {exc}") from None
        return ByGroup(total, tuple(answers))

    async def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """``consume_stats_by_group``'s figures; MQClientError if a group gave none."""
        return (await self.consume_stats_by_group(group, topic)).complete()

    async def subscription_groups_by_group(self) -> ByGroup[list[str]]:
        """The consumer groups of every broker group (its master, else a slave), merged."""
        names: set[str] = set()
        answers = []
        for data in await self._every_group():
            answer, response = await self._ask_group(
                data, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
            answers.append(answer)
            if response is not None:
                try:
                    names.update(decode_subscription_groups(response.body)
                                 .subscription_group_table)
                except MetadataDecodeError as exc:
                    raise MQClientError(
                        f"bad subscription groups from {answer.address}: {exc}") from None
        return ByGroup(sorted(names), tuple(answers))

    async def consumer_connections(self, group: str) -> dict[str, Any]:
        """``consumer_connections_answered``'s table."""
        return (await self.consumer_connections_answered(group))[1]

    async def consumer_connections_answered(self, group: str) -> tuple[Answered, dict[str, Any]]:
        """GET_CONSUMER_CONNECTION_LIST: the group's live clients and subscriptions, from
        the first broker group that has any, asking its master, else its slaves (a consumer
        heartbeats every broker of its routes, slaves too, so a slave knows the group's
        clients while its master is down); with which broker answered. MQBrokerError
        CONSUMER_NOT_ONLINE when every group answered and none has the group's clients;
        MQClientError when some group could not be asked (its clients may be there)."""
        last: MQBrokerError | None = None
        unknown = []
        for data in await self._every_group():
            try:
                answer, response = await self._ask_group(
                    data, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": group})
            except MQBrokerError as exc:
                last = exc
                continue
            if response is None:
                unknown.append(answer)
                continue
            try:
                return answer, dict(json.loads(response.body))
            except (ValueError, TypeError) as exc:
                raise MQClientError(
                    f"bad consumer connections from {answer.address}: {exc}") from None
        if unknown:
            raise no_answer(unknown)
        if last is not None:
            raise last
        raise MQClientError("the name server lists no broker")

    async def query_by_key(self, topic: str, key: str, *, max_num: int = DEFAULT_QUERY_MAX,
                           begin_ms: int = 0, end_ms: int | None = None,
                           unique_key: bool = False) -> list[StoredMessage]:
        """QUERY_MESSAGE on each broker group serving ``topic`` (its master, else a slave,
        as RocketMQ's queryMessage does): the messages with ``key`` among their KEYS (or,
        with ``unique_key``, whose client message id UNIQ_KEY is ``key``) stored between
        ``begin_ms`` and ``end_ms`` (now by default), oldest first. MQClientError when no
        broker of a group answered: an empty answer would claim there is no such message."""
        fields: dict[str, Any] = {
            "topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_ms,
            "endTimestamp": int(time.time() * 1000) if end_ms is None else end_ms,
        }
        if unique_key:
            fields[UNIQUE_KEY_QUERY] = "true"
        route = await self.topic_route(topic)
        if route is None:
            raise MQClientError(f"the name server knows no topic {topic!r}")
        found: list[StoredMessage] = []
        unknown = []
        for data in route.broker_datas:
            try:
                answer, response = await self._ask_group(data, RequestCode.QUERY_MESSAGE, fields)
            except MQBrokerError as exc:
                if exc.code == ResponseCode.QUERY_NOT_FOUND:
                    continue
                raise
            if response is None:
                unknown.append(answer)
            else:
                found.extend(decode_records(response.body, str(answer.address)))
        if unknown:
            raise no_answer(unknown)
        if unique_key:
            found = [m for m in found
                     if m.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key]
        return sorted(found, key=lambda m: (m.store_timestamp, m.commitlog_offset))


    # ---- controllers (RocketMQ 5's controller mode) ---------------------------------------------

    async def controller_metadata(self, controller: str) -> GetMetaDataResponseHeader:
        """CONTROLLER_GET_METADATA_INFO (1005), which any controller answers: who leads
        (mqadmin's ``getControllerMetaData``)."""
        response = await self._invoke(controller, RequestCode.CONTROLLER_GET_METADATA_INFO)
        try:
            return SPECS[GetMetaDataResponseHeader].decode(response)
        except WireError as exc:
            raise MQClientError(f"bad controller metadata from {controller}: {exc}") from None

    async def controller_leader(self, controllers: Iterable[str]
                                ) -> tuple[str, GetMetaDataResponseHeader]:
        """Ask ``controllers`` in turn until one names the leader: its address and the
        answer. MQClientError when none does (all down, or an election under way)."""
        errors: list[str] = []
        for controller in controllers:
            try:
                meta = await self.controller_metadata(controller)
            except MQError as exc:
                errors.append(str(exc))
                continue
            if meta.controller_leader_address:
                return meta.controller_leader_address, meta
            errors.append(f"{controller} knows no leader")
        raise MQClientError("no controller named a leader: " + ("; ".join(errors) or "none asked"))

    async def sync_state_data(self, controller: str, broker_names: Iterable[str]
                              ) -> BrokerReplicasInfo:
        """CONTROLLER_GET_SYNC_STATE_DATA (1006), asked of the leader: each named broker set's
        master, epochs and members, in the in-sync set or not (mqadmin's
        ``getSyncStateSet``). Sets the controller does not know are left out."""
        response = await self._invoke(controller, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA,
                                      body=encode_broker_names(broker_names))
        try:
            return BrokerReplicasInfo.decode(response.body)
        except WireError as exc:
            raise MQClientError(f"bad in-sync set data from {controller}: {exc}") from None

    async def runtime_info(self, broker_addr: str) -> dict[str, str]:
        """GET_BROKER_RUNTIME_INFO: the broker's key/value statistics table."""
        response = await self._invoke(broker_addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        try:
            return dict(KVTable.decode(response.body).table)
        except RouteDecodeError as exc:
            raise MQClientError(f"bad runtime info from {broker_addr}: {exc}") from None

    async def _queue_address(self, queue: MessageQueue) -> str:
        found = await self.instance.find_broker_addr_refreshing(
            queue.topic, queue.broker_name, MASTER_ID
        )
        return found[0]

    async def _queue_request(self, queue: MessageQueue, code: int, extra: dict | None = None,
                             key: str = "offset") -> int:
        address = await self._queue_address(queue)
        fields = {"topic": queue.topic, "queueId": queue.queue_id, **(extra or {})}
        response = await self._invoke(address, code, fields)
        try:
            return int(response.ext_fields[key])
        except (KeyError, ValueError):
            raise MQClientError(f"bad response from {address}: {response.ext_fields}") from None

    async def max_offset(self, queue: MessageQueue) -> int:
        """GET_MAX_OFFSET (from the master, or a slave when the master is down)."""
        return await self._queue_request(queue, RequestCode.GET_MAX_OFFSET)

    async def min_offset(self, queue: MessageQueue) -> int:
        return await self._queue_request(queue, RequestCode.GET_MIN_OFFSET)

    async def search_offset(self, queue: MessageQueue, timestamp_ms: int) -> int:
        """SEARCH_OFFSET_BY_TIMESTAMP: the first offset stored at or after ``timestamp_ms``."""
        return await self._queue_request(
            queue, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"timestamp": timestamp_ms}
        )

    async def earliest_msg_store_time(self, queue: MessageQueue) -> int:
        return await self._queue_request(
            queue, RequestCode.GET_EARLIEST_MSG_STORETIME, key="timestamp"
        )

    async def view_message(self, offset_msg_id: str) -> StoredMessage:
        """``view_message_answered``'s message."""
        return (await self.view_message_answered(offset_msg_id))[1]

    async def view_message_answered(self, offset_msg_id: str) -> tuple[Answered, StoredMessage]:
        """VIEW_MESSAGE_BY_ID: the message an offsetMsgId names, from the broker it names or,
        when that broker does not answer, from another broker of its group (a slave holds the
        master's commitlog byte for byte, so the same offset names the same record there);
        with which broker answered.

        A master that was killed is gone from the name server's lists, so its group is found
        by address while it is listed, and otherwise among the groups listing no master. A
        record read elsewhere counts only if it is the one the id names (its store host and
        commitlog offset make the same id): the id is the record's identity, not a hint."""
        try:
            address, offset = decode_message_id(offset_msg_id)
        except RecordDecodeError as exc:
            raise MQClientError(str(exc)) from None
        wanted = offset_msg_id.upper()
        try:
            response = await self._invoke(address, RequestCode.VIEW_MESSAGE_BY_ID,
                                          {"offset": offset})
        except MQClientError as exc:  # unreachable (a broker's error code is an answer)
            failures = [str(exc)]
        else:
            message = self._record(response.body, address)
            for data in await self._every_group():
                for broker_id, listed in data.broker_addrs.items():
                    if listed == address:
                        return Answered(data.broker_name, broker_id, address), message
            # not listed (the name server lost it): the broker that stored the record
            return Answered("", MASTER_ID, address), message
        for data in await self._groups_that_may_hold(address):
            for broker_id, other in asking_order(data):
                if other == address or other in self.unreachable:
                    continue
                try:
                    response = await self._invoke(other, RequestCode.VIEW_MESSAGE_BY_ID,
                                                  {"offset": offset})
                except (MQClientError, MQBrokerError) as exc:
                    failures.append(str(exc))
                    continue
                message = self._record(response.body, other)
                if message.msg_id == wanted:
                    return Answered(data.broker_name, broker_id, other), message
                failures.append(f"{other} holds another message at offset {offset}")
        raise MQClientError(f"no broker answered for the message {offset_msg_id}: "
                            + "; ".join(failures))

    async def _groups_that_may_hold(self, address: str) -> list[BrokerData]:
        """The group listing ``address``; else every group that lists no master (the
        address's, if its master is the one that is down)."""
        groups = await self._every_group()
        listing = [d for d in groups if address in d.broker_addrs.values()]
        return listing or [d for d in groups if MASTER_ID not in d.broker_addrs]

    @staticmethod
    def _record(body: bytes, address: str) -> StoredMessage:
        try:
            return decode_record(body)
        except RecordDecodeError as exc:
            raise MQClientError(f"bad message from {address}: {exc}") from None


@contextlib.asynccontextmanager
async def open_admin(
    namesrv_addr: str | Iterable[str] | ClientInstance, **options: Any
) -> AsyncIterator[Admin]:
    """An Admin on ``namesrv_addr`` (``"host:port;..."``) or a ClientInstance to share."""
    async with use_instance(namesrv_addr, options) as instance:
        yield Admin(instance)
