"""The name server's bodies: route data, cluster info, broker registration.

A broker registers with every name server (REGISTER_BROKER, a ``RegisterBrokerBody`` carrying
its topic configs) and clients ask them for routes (GET_ROUTEINFO_BY_TOPIC, a
``TopicRouteData``: which broker groups serve a topic, their queues and addresses).

All are fastjson JSON (``fastjson``), whose unquoted numeric keys (``brokerAddrs``, keyed by
broker id) no standard parser accepts. 4.9.4 started answering GET_ROUTEINFO_BY_TOPIC in
standard JSON (quoted keys, non-ASCII escaped) and broke clients that only knew the old form
(RocketMQ issues #1445, #4471), so the name server now picks the form per caller: standard JSON
for ``version >= 401`` or ``acceptStandardJsonOnly=true``, fastjson's form otherwise
(``wants_standard_json``). Other bodies (cluster info, register body) are always fastjson's
form.

Every decoder takes untrusted bytes: sizes are bounded before parsing, the compressed register
body is inflated with an output limit (a zlib bomb fails fast), and anything malformed raises
``RouteDecodeError``. Values are frozen attrs classes; JSON field names are RocketMQ's.

The bodies that used to live here too stay importable from here: the topic configs and data
version (now in ``metadata``), the heartbeat bodies (``heartbeat``), the JSON reader and
writer (``fastjson``) and ``Permission``.
"""

from __future__ import annotations

import struct
import zlib
from typing import Any

import attrs

from .errors import RouteDecodeError
from .fastjson import DEFAULT_MAX_JSON_LENGTH, encode_json, read_json, write_json
from .heartbeat import (
    BROADCASTING,
    CLUSTERING,
    CONSUME_ACTIVELY,
    CONSUME_FROM_FIRST_OFFSET,
    CONSUME_FROM_LAST_OFFSET,
    CONSUME_FROM_TIMESTAMP,
    CONSUME_PASSIVELY,
    ConsumerData,
    ConsumerIdList,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from .json_fields import (
    JsonShapeError,
    as_int,
    as_object,
    decoding,
    get_bool,
    get_int,
    get_list,
    get_object,
    get_str,
    str_items,
)
from .metadata import TOPIC_FILTER_TYPES, DataVersion, TopicConfig, TopicConfigSerializeWrapper
from .permission import Permission

__all__ = [
    "DEFAULT_MAX_INFLATED_LENGTH",
    "BrokerData",
    "ClusterInfo",
    "KVConfigTable",
    "KVTable",
    "QueueData",
    "RegisterBrokerBody",
    "RouteDecodeError",
    "TopicList",
    "TopicRouteData",
    "wants_standard_json",
    # moved to their own modules, importable from here as before
    "BROADCASTING",
    "CLUSTERING",
    "CONSUME_ACTIVELY",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
    "CONSUME_PASSIVELY",
    "DEFAULT_MAX_JSON_LENGTH",
    "TOPIC_FILTER_TYPES",
    "ConsumerData",
    "ConsumerIdList",
    "DataVersion",
    "HeartbeatData",
    "Permission",
    "ProducerData",
    "SubscriptionData",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "read_json",
    "write_json",
]

#: the largest inflated compressed register body
DEFAULT_MAX_INFLATED_LENGTH = 64 * 1024 * 1024

#: MQVersion.V4_9_4's ordinal: callers at or above it get standard JSON route data
V4_9_4 = 401

_I = struct.Struct(">i")


def wants_standard_json(version: int, accept_standard_json_only: bool = False) -> bool:
    """Whether the name server answers this GET_ROUTEINFO_BY_TOPIC caller in standard JSON."""
    return version >= V4_9_4 or accept_standard_json_only


@attrs.frozen
class BrokerData:
    """One broker group (master and slaves under one name). ``broker_addrs``: id -> ip:port."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict[int, str])
    #: 5.x fields, written only when set
    enable_acting_master: bool = False
    zone_name: str | None = None

    def to_json_obj(self) -> dict[str, Any]:
        obj: dict[str, Any] = {
            "brokerAddrs": dict(self.broker_addrs),
            "brokerName": self.broker_name,
            "cluster": self.cluster,
        }
        if self.enable_acting_master:
            obj["enableActingMaster"] = True
        if self.zone_name is not None:
            obj["zoneName"] = self.zone_name
        return obj

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> BrokerData:
        obj = as_object(value, path)
        addrs = get_object(obj, "brokerAddrs", path)
        broker_addrs: dict[int, str] = {}
        for key, addr in addrs.items():
            if type(addr) is not str:
                raise JsonShapeError(f"{path}.brokerAddrs[{key!r}] must be a string")
            broker_addrs[as_int(key, f"{path}.brokerAddrs key")] = addr
        return cls(
            cluster=get_str(obj, "cluster", path, ""),
            broker_name=get_str(obj, "brokerName", path),
            broker_addrs=broker_addrs,
            enable_acting_master=get_bool(obj, "enableActingMaster", path, False),
            zone_name=get_str(obj, "zoneName", path, None),
        )


@attrs.frozen
class QueueData:
    """A topic's queues on one broker group."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = Permission.READ | Permission.WRITE
    topic_sys_flag: int = 0

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json_obj(cls, value: object, path: str) -> QueueData:
        obj = as_object(value, path)
        # before 4.9 the field was misspelt topicSynFlag
        sys_flag = obj.get("topicSysFlag", obj.get("topicSynFlag"))
        return cls(
            broker_name=get_str(obj, "brokerName", path),
            read_queue_nums=get_int(obj, "readQueueNums", path, 0, int32=True),
            write_queue_nums=get_int(obj, "writeQueueNums", path, 0, int32=True),
            perm=get_int(obj, "perm", path, Permission.READ | Permission.WRITE, int32=True),
            topic_sys_flag=0 if sys_flag is None else as_int(sys_flag, f"{path}.topicSysFlag"),
        )


@attrs.frozen
class TopicRouteData:
    """The GET_ROUTEINFO_BY_TOPIC body."""

    queue_datas: tuple[QueueData, ...] = attrs.field(default=(), converter=tuple)
    broker_datas: tuple[BrokerData, ...] = attrs.field(default=(), converter=tuple)
    #: broker address -> filter server addresses
    filter_server_table: dict[str, tuple[str, ...]] = attrs.field(
        factory=dict[str, tuple[str, ...]]
    )
    order_topic_conf: str | None = None

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "brokerDatas": [data.to_json_obj() for data in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [data.to_json_obj() for data in self.queue_datas],
        }

    def encode(self, *, standard_json: bool) -> bytes:
        """The body, in the form the caller wants (see ``wants_standard_json``)."""
        return encode_json(self.to_json_obj(), standard_json=standard_json)

    @classmethod
    def decode(cls, data: bytes | str) -> TopicRouteData:
        with decoding(RouteDecodeError, "TopicRouteData"):
            obj = as_object(read_json(data, what="TopicRouteData"), "route")
            filters = get_object(obj, "filterServerTable", "route")
            return cls(
                queue_datas=tuple(
                    QueueData.from_json_obj(item, f"route.queueDatas[{i}]")
                    for i, item in enumerate(get_list(obj, "queueDatas", "route"))
                ),
                broker_datas=tuple(
                    BrokerData.from_json_obj(item, f"route.brokerDatas[{i}]")
                    for i, item in enumerate(get_list(obj, "brokerDatas", "route"))
                ),
                filter_server_table={
                    addr: tuple(str_items(servers, f"route.filterServerTable[{addr!r}]"))
                    for addr, servers in filters.items()
                },
                order_topic_conf=get_str(obj, "orderTopicConf", "route", None),
            )


@attrs.frozen
class ClusterInfo:
    """The GET_BROKER_CLUSTER_INFO body."""

    broker_addr_table: dict[str, BrokerData] = attrs.field(factory=dict[str, BrokerData])
    cluster_addr_table: dict[str, frozenset[str]] = attrs.field(
        factory=dict[str, frozenset[str]]
    )

    def to_json_obj(self) -> dict[str, Any]:
        return {
            "brokerAddrTable": {k: v.to_json_obj() for k, v in self.broker_addr_table.items()},
            "clusterAddrTable": {k: frozenset(v) for k, v in self.cluster_addr_table.items()},
        }

    def encode(self, *, standard_json: bool = False) -> bytes:
        """Java's name server always answers in fastjson's form (unquoted broker ids)."""
        return encode_json(self.to_json_obj(), standard_json=standard_json)

    @classmethod
    def decode(cls, data: bytes | str) -> ClusterInfo:
        with decoding(RouteDecodeError, "ClusterInfo"):
            obj = as_object(read_json(data, what="ClusterInfo"), "clusterInfo")
            brokers = get_object(obj, "brokerAddrTable", "clusterInfo")
            clusters = get_object(obj, "clusterAddrTable", "clusterInfo")
            return cls(
                {
                    name: BrokerData.from_json_obj(item, f"clusterInfo.brokerAddrTable[{name!r}]")
                    for name, item in brokers.items()
                },
                {
                    name: frozenset(str_items(names, f"clusterInfo.clusterAddrTable[{name!r}]"))
                    for name, names in clusters.items()
                },
            )


@attrs.frozen
class RegisterBrokerBody:
    """The REGISTER_BROKER body: the broker's topic configs, their version, filter servers.

    Two forms: JSON (the default) and, with ``compressed=true`` in the header, a zlib stream of
    ``int length + DataVersion JSON; int topic count; per topic int length + "topicName
    readQueueNums writeQueueNums perm topicFilterType"; int length + filter server list JSON``.
    5.x appends a topic-queue-mapping count and entries: we write a count of 0 (4.x ignores
    trailing bytes, 5.x needs them) and ignore whatever follows on decode. The compact topic
    form has no ``topicSysFlag`` or ``order``: they arrive as 0 and false, as in Java."""

    topic_config_serialize_wrapper: TopicConfigSerializeWrapper = attrs.field(
        factory=TopicConfigSerializeWrapper
    )
    filter_server_list: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    @property
    def topic_config_table(self) -> dict[str, TopicConfig]:
        return self.topic_config_serialize_wrapper.topic_config_table

    @property
    def data_version(self) -> DataVersion:
        return self.topic_config_serialize_wrapper.data_version

    def encode(self, *, compressed: bool = False) -> bytes:
        if not compressed:
            wrapper = self.topic_config_serialize_wrapper
            return encode_json(
                {
                    "filterServerList": list(self.filter_server_list),
                    "topicConfigSerializeWrapper": wrapper.to_json_obj(),
                }
            )
        parts: list[bytes] = []
        version = self.data_version.encode()
        parts += (_I.pack(len(version)), version)
        parts.append(_I.pack(len(self.topic_config_table)))
        for config in self.topic_config_table.values():
            text = config.encode_compact().encode()
            parts += (_I.pack(len(text)), text)
        filters = encode_json(list(self.filter_server_list))
        parts += (_I.pack(len(filters)), filters, _I.pack(0))
        return zlib.compress(b"".join(parts), 9)

    @classmethod
    def decode(
        cls,
        data: bytes | bytearray | memoryview,
        *,
        compressed: bool = False,
        max_inflated_length: int = DEFAULT_MAX_INFLATED_LENGTH,
    ) -> RegisterBrokerBody:
        if compressed:
            return cls._decode_compressed(bytes(data), max_inflated_length)
        with decoding(RouteDecodeError, "RegisterBrokerBody"):
            obj = as_object(read_json(data, what="RegisterBrokerBody"), "body")
            wrapper = obj.get("topicConfigSerializeWrapper")
            return cls(
                TopicConfigSerializeWrapper()
                if wrapper is None
                else TopicConfigSerializeWrapper.from_json_obj(
                    wrapper, "body.topicConfigSerializeWrapper"
                ),
                tuple(str_items(obj.get("filterServerList"), "body.filterServerList")),
            )

    @classmethod
    def _decode_compressed(cls, data: bytes, limit: int) -> RegisterBrokerBody:
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(data, limit + 1)
        except zlib.error as exc:
            raise RouteDecodeError(f"compressed register body does not inflate: {exc}") from None
        if len(raw) > limit:
            raise RouteDecodeError(f"compressed register body inflates beyond {limit} bytes")
        reader = _Cursor(raw)
        version = DataVersion.decode(reader.chunk("DataVersion"))
        count = reader.int("topic count")
        if count < 0 or count * 4 > reader.remaining:
            raise RouteDecodeError(f"topic count {count} does not fit the register body")
        table: dict[str, TopicConfig] = {}
        for _ in range(count):
            try:
                text = reader.chunk("topic config").decode("utf-8")
            except UnicodeDecodeError:
                raise RouteDecodeError("topic config is not UTF-8") from None
            config = TopicConfig.decode_compact(text)
            table[config.topic_name] = config
        filters = read_json(reader.chunk("filter server list"), what="filter server list")
        with decoding(RouteDecodeError, "RegisterBrokerBody"):
            servers = tuple(str_items(filters, "filterServerList"))
        return cls(TopicConfigSerializeWrapper(table, version), servers)


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def int(self, what: str) -> int:
        if self.remaining < 4:
            raise RouteDecodeError(f"register body truncated before the {what}")
        (value,) = _I.unpack_from(self.data, self.pos)
        self.pos += 4
        return value

    def chunk(self, what: str) -> bytes:
        length = self.int(f"{what} length")
        if length < 0 or length > self.remaining:
            raise RouteDecodeError(f"{what} length {length} does not fit the register body")
        value = self.data[self.pos : self.pos + length]
        self.pos += length
        return value


@attrs.frozen
class KVTable:
    """``{"table":{...}}``: GET_BROKER_RUNTIME_INFO and the register response body."""

    table: dict[str, str] = attrs.field(factory=dict[str, str])

    def encode(self) -> bytes:
        return encode_json({"table": dict(self.table)})

    @classmethod
    def decode(cls, data: bytes | str) -> KVTable:
        with decoding(RouteDecodeError, "KVTable"):
            obj = as_object(read_json(data, what="KVTable"), "body")
            table = get_object(obj, "table", "body")
            return cls({k: get_str(table, k, "body.table") for k in table if table[k] is not None})


@attrs.frozen
class TopicList:
    """``{"brokerAddr":..,"topicList":[...]}``: the GET_ALL_TOPIC_LIST_FROM_NAMESERVER and
    GET_TOPICS_BY_CLUSTER body. Java keeps the names in a set (no order); we write them sorted.
    ``brokerAddr`` is set only by RocketMQ's system-topic list, and left out when None."""

    topic_list: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    broker_addr: str | None = None

    def encode(self) -> bytes:
        return encode_json({"brokerAddr": self.broker_addr, "topicList": sorted(self.topic_list)})

    @classmethod
    def decode(cls, data: bytes | str) -> TopicList:
        with decoding(RouteDecodeError, "TopicList"):
            obj = as_object(read_json(data, what="TopicList"), "body")
            return cls(tuple(str_items(obj.get("topicList"), "body.topicList")),
                       get_str(obj, "brokerAddr", "body", None))


@attrs.frozen
class KVConfigTable:
    """The name server's KV config file (RocketMQ's ``kvConfig.json``, its
    KVConfigSerializeWrapper): ``{"configTable":{namespace:{key:value}}}``."""

    config_table: dict[str, dict[str, str]] = attrs.field(factory=dict[str, dict[str, str]])

    def encode(self) -> bytes:
        return encode_json({"configTable": {ns: dict(kv) for ns, kv in self.config_table.items()}})

    @classmethod
    def decode(cls, data: bytes | str) -> KVConfigTable:
        with decoding(RouteDecodeError, "KVConfigTable"):
            obj = as_object(read_json(data, what="KVConfigTable"), "kvConfig")
            table = obj.get("configTable")
            if table is None:
                return cls()
            namespaces = as_object(table, "kvConfig.configTable")
            out: dict[str, dict[str, str]] = {}
            for namespace, entries in namespaces.items():
                path = f"kvConfig.configTable[{namespace!r}]"
                items = as_object(entries, path)
                out[namespace] = {key: get_str(items, key, path)
                                  for key in items if items[key] is not None}
            return cls(out)
