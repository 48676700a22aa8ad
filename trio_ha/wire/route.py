"""Name server and broker JSON bodies: route data, cluster info, broker registration, heartbeats.

RocketMQ serialises these with fastjson, which has one habit that matters here: a map whose keys
are not strings (``brokerAddrs``, keyed by broker id) is written with **unquoted** numeric keys,
``{"brokerAddrs":{0:"10.0.0.1:10911"}}``, which no standard JSON parser accepts. 4.9.4 started
answering GET_ROUTEINFO_BY_TOPIC in standard JSON (quoted keys, non-ASCII escaped) and broke
clients that only knew the old form (RocketMQ issues #1445, #4471), so the name server now picks
the form per caller: standard JSON for ``version >= 401`` or ``acceptStandardJsonOnly=true``,
fastjson's form otherwise (``wants_standard_json``). Other bodies (cluster info, register body)
are always fastjson's form.

So this module has a reader that accepts both forms (``read_json``: standard JSON first, then
again with numeric keys quoted) and a writer with both modes (``write_json``), which also writes
bean fields in alphabetical order and leaves out nulls, as fastjson does, and can reproduce
fastjson's tab-indented "pretty" layout used for the config files (``metadata.py``).

Every decoder takes untrusted bytes: sizes are bounded before parsing, the compressed register
body is inflated with an output limit (a zlib bomb fails fast), and anything malformed raises
``RouteDecodeError``. Values are frozen attrs classes; JSON field names are RocketMQ's.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from typing import Any, Iterator

import attrs

from .errors import RouteDecodeError, WireError
from .permission import Permission

__all__ = [
    "BROADCASTING",
    "CLUSTERING",
    "CONSUME_ACTIVELY",
    "CONSUME_PASSIVELY",
    "DEFAULT_MAX_INFLATED_LENGTH",
    "DEFAULT_MAX_JSON_LENGTH",
    "PERM_INHERIT",
    "PERM_PRIORITY",
    "PERM_READ",
    "PERM_WRITE",
    "BrokerData",
    "ClusterInfo",
    "ConsumerData",
    "ConsumerIdList",
    "DataVersion",
    "HeartbeatData",
    "KVTable",
    "Permission",
    "ProducerData",
    "QueueData",
    "RegisterBrokerBody",
    "RouteDecodeError",
    "SubscriptionData",
    "TopicConfig",
    "TopicConfigSerializeWrapper",
    "TopicRouteData",
    "read_json",
    "wants_standard_json",
    "write_json",
]

#: the ``perm`` bits under their old names; new code says ``Permission.READ`` (these go once
#: nothing imports them)
PERM_PRIORITY = Permission.PRIORITY
PERM_READ = Permission.READ
PERM_WRITE = Permission.WRITE
PERM_INHERIT = Permission.INHERIT

#: the largest JSON document we parse (frames are at most 16 MiB; config files may be larger)
DEFAULT_MAX_JSON_LENGTH = 64 * 1024 * 1024
#: the largest inflated compressed register body
DEFAULT_MAX_INFLATED_LENGTH = 64 * 1024 * 1024

#: MQVersion.V4_9_4's ordinal: callers at or above it get standard JSON route data
V4_9_4 = 401

TOPIC_FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")

# ConsumeType, MessageModel and ConsumeFromWhere are Java enums, kept here as their names
CONSUME_ACTIVELY = "CONSUME_ACTIVELY"  # pull
CONSUME_PASSIVELY = "CONSUME_PASSIVELY"  # push
CLUSTERING = "CLUSTERING"
BROADCASTING = "BROADCASTING"
CONSUME_FROM_LAST_OFFSET = "CONSUME_FROM_LAST_OFFSET"
CONSUME_FROM_FIRST_OFFSET = "CONSUME_FROM_FIRST_OFFSET"
CONSUME_FROM_TIMESTAMP = "CONSUME_FROM_TIMESTAMP"

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_I = struct.Struct(">i")


def wants_standard_json(version: int, accept_standard_json_only: bool = False) -> bool:
    """Whether the name server answers this GET_ROUTEINFO_BY_TOPIC caller in standard JSON."""
    return version >= V4_9_4 or accept_standard_json_only


# ---- reading ----------------------------------------------------------------------------------

# a JSON string (skipped as is), or an unquoted integer key after '{' or ','
_NUMERIC_KEY = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")|([{,]\s*)(-?[0-9]+)(\s*:)', re.S)


def _quote_key(match: re.Match) -> str:
    if match.group(1) is not None:
        return match.group(1)
    return f'{match.group(2)}"{match.group(3)}"{match.group(4)}'


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def read_json(
    data: bytes | bytearray | memoryview | str,
    *,
    max_length: int = DEFAULT_MAX_JSON_LENGTH,
    error: type[WireError] = RouteDecodeError,
    what: str = "JSON body",
) -> Any:
    """Parse standard JSON or fastjson's output (unquoted numeric object keys). Raises
    ``error`` for anything else, for a document over ``max_length`` and for invalid UTF-8."""
    if len(data) > max_length:
        raise error(f"{what} of {len(data)} bytes exceeds the limit of {max_length}")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8: {exc}") from None
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError):
        pass
    try:
        return _DECODER.decode(_NUMERIC_KEY.sub(_quote_key, text))
    except (ValueError, RecursionError) as exc:
        raise error(f"{what} is not valid JSON: {exc}") from None


# ---- writing ----------------------------------------------------------------------------------

_FAST_STR = json.JSONEncoder(ensure_ascii=False, check_circular=False).encode
_STANDARD_STR = json.JSONEncoder(ensure_ascii=True, check_circular=False).encode


def write_json(value: Any, *, standard_json: bool = False, pretty: bool = False) -> str:
    """Write ``value`` (dicts, lists, tuples, sets, str, int, bool, None) as fastjson would.

    Dict entries with a None value are left out (fastjson omits nulls); string keys are sorted
    (fastjson sorts bean fields; ``MapSortField`` sorts maps); int keys are written bare in
    fastjson's form and quoted in standard form, which also escapes non-ASCII (fastjson's
    ``BrowserCompatible``). Sets are written sorted. ``pretty`` reproduces fastjson's
    ``PrettyFormat``: a tab-indented line per string-keyed entry, int-keyed maps on one line
    with the closing brace on the next."""
    out: list[str] = []
    _emit(value, out, _STANDARD_STR if standard_json else _FAST_STR, standard_json, pretty, 0)
    return "".join(out)


def _key_order(item: tuple) -> tuple:
    key = item[0]
    return (0, key, "") if type(key) is int else (1, 0, key)


def _emit(value: Any, out: list, enc: Callable, standard: bool, pretty: bool, depth: int) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(enc(value))
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, Mapping):
        items = [item for item in value.items() if item[1] is not None]
        if not items:
            out.append("{}")
            return
        items.sort(key=_key_order)
        out.append("{")
        inner = "\n" + "\t" * (depth + 1) if pretty else ""
        for i, (key, item) in enumerate(items):
            if i:
                out.append(",")
            if type(key) is int:
                out.append(f'"{key}":' if standard else f"{key}:")
            elif isinstance(key, str):
                out.append(inner)
                out.append(enc(key))
                out.append(":")
            else:
                raise TypeError(f"JSON object keys must be str or int, not {type(key).__name__}")
            _emit(item, out, enc, standard, pretty, depth + 1)
        if pretty:
            out.append("\n" + "\t" * depth)
        out.append("}")
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        out.append("[")
        for i, item in enumerate(items):
            if i:
                out.append(",")
            _emit(item, out, enc, standard, pretty, depth + 1)
        out.append("]")
    elif isinstance(value, float):
        out.append(repr(value))
    else:
        raise TypeError(f"cannot write {type(value).__name__} as JSON")


# ---- typed access to parsed JSON ----------------------------------------------------------------


class _Bad(Exception):
    """A parsed JSON value has the wrong shape; turned into the caller's typed error."""


_REQUIRED: Any = object()


@contextmanager
def _decoding(error: type[WireError], what: str) -> Iterator[None]:
    try:
        yield
    except _Bad as exc:
        raise error(f"{what}: {exc}") from None


def _obj(value: Any, path: str) -> dict:
    if type(value) is not dict:
        raise _Bad(f"{path} must be an object, got {_type_name(value)}")
    return value


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _field(obj: dict, key: str, path: str, default: Any) -> Any:
    value = obj.get(key)
    if value is None:
        if default is _REQUIRED:
            raise _Bad(f"{path}.{key} is missing")
        return _REQUIRED  # caller returns its default
    return value


def _as_int(value: Any, path: str, lo: int = _INT64_MIN, hi: int = _INT64_MAX) -> int:
    # fastjson also reads numbers written as strings
    if type(value) is str and 0 < len(value) < 21 and value.isascii():
        digits = value[1:] if value[0] == "-" else value
        if digits.isdigit():
            value = int(value)
    if type(value) is not int or not lo <= value <= hi:
        raise _Bad(f"{path} must be an integer in range, got {_short_value(value)}")
    return value


def _short_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _get_int(
    obj: dict, key: str, path: str, default: Any = _REQUIRED, *, int32: bool = False
) -> int:
    value = _field(obj, key, path, default)
    if value is _REQUIRED:
        return default
    if int32:
        return _as_int(value, f"{path}.{key}", _INT32_MIN, _INT32_MAX)
    return _as_int(value, f"{path}.{key}")


def _get_str(obj: dict, key: str, path: str, default: Any = _REQUIRED) -> Any:
    value = _field(obj, key, path, default)
    if value is _REQUIRED:
        return default
    if type(value) is str:
        return value
    if type(value) is int:
        return str(value)
    raise _Bad(f"{path}.{key} must be a string, got {_type_name(value)}")


def _get_bool(obj: dict, key: str, path: str, default: Any = _REQUIRED) -> bool:
    value = _field(obj, key, path, default)
    if value is _REQUIRED:
        return default
    if type(value) is bool:
        return value
    if type(value) is str and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise _Bad(f"{path}.{key} must be a boolean, got {_type_name(value)}")


def _get_list(obj: dict, key: str, path: str) -> list:
    value = obj.get(key)
    if value is None:
        return []
    if type(value) is not list:
        raise _Bad(f"{path}.{key} must be an array, got {_type_name(value)}")
    return value


def _get_obj(obj: dict, key: str, path: str, *, required: bool = False) -> dict:
    value = obj.get(key)
    if value is None:
        if required:
            raise _Bad(f"{path}.{key} is missing")
        return {}
    return _obj(value, f"{path}.{key}")


def _int_key(key: str, path: str) -> int:
    return _as_int(key, f"{path} key")


def _str_items(value: Any, path: str) -> list[str]:
    if value is None:
        return []
    if type(value) is not list:
        raise _Bad(f"{path} must be an array, got {_type_name(value)}")
    for i, item in enumerate(value):
        if type(item) is not str:
            raise _Bad(f"{path}[{i}] must be a string, got {_type_name(item)}")
    return value


def _dumps(obj: Any, standard_json: bool = False) -> bytes:
    return write_json(obj, standard_json=standard_json).encode("utf-8", "replace")


# ---- values ----------------------------------------------------------------------------------


@attrs.frozen
class DataVersion:
    """A table's version: ``counter`` rises on every change, ``timestamp`` is when (ms).
    5.x adds ``stateVersion`` (written only when non-zero, so 4.x files round-trip)."""

    counter: int = 0
    timestamp: int = 0
    state_version: int = 0

    def next_version(self, now_ms: int) -> DataVersion:
        return DataVersion(self.counter + 1, now_ms, self.state_version)

    def to_json_obj(self) -> dict:
        obj = {"counter": self.counter, "timestamp": self.timestamp}
        if self.state_version:
            obj["stateVersion"] = self.state_version
        return obj

    @classmethod
    def from_json_obj(cls, value: Any, path: str = "dataVersion") -> DataVersion:
        obj = _obj(value, path)
        return cls(
            _get_int(obj, "counter", path, 0),
            _get_int(obj, "timestamp", path, 0),
            _get_int(obj, "stateVersion", path, 0),
        )

    def encode(self) -> bytes:
        return _dumps(self.to_json_obj())

    @classmethod
    def decode(cls, data: bytes | str) -> DataVersion:
        with _decoding(RouteDecodeError, "DataVersion"):
            return cls.from_json_obj(read_json(data, what="DataVersion"))


@attrs.frozen
class TopicConfig:
    """One topic's configuration (defaults as Java's: 16 queues, perm read|write)."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = Permission.READ | Permission.WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def to_json_obj(self) -> dict:
        return {
            "order": self.order,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicFilterType": self.topic_filter_type,
            "topicName": self.topic_name,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json_obj(cls, value: Any, path: str, name: str | None = None) -> TopicConfig:
        obj = _obj(value, path)
        filter_type = _get_str(obj, "topicFilterType", path, "SINGLE_TAG")
        if filter_type not in TOPIC_FILTER_TYPES:
            raise _Bad(f"{path}.topicFilterType {filter_type!r} is not a TopicFilterType")
        return cls(
            topic_name=_get_str(obj, "topicName", path, _REQUIRED if name is None else name),
            read_queue_nums=_get_int(obj, "readQueueNums", path, 16, int32=True),
            write_queue_nums=_get_int(obj, "writeQueueNums", path, 16, int32=True),
            perm=_get_int(obj, "perm", path, Permission.READ | Permission.WRITE, int32=True),
            topic_filter_type=filter_type,
            topic_sys_flag=_get_int(obj, "topicSysFlag", path, 0, int32=True),
            order=_get_bool(obj, "order", path, False),
        )

    def encode_compact(self) -> str:
        """``TopicConfig.encode()``: the compressed register body's form,
        ``"topicName readQueueNums writeQueueNums perm topicFilterType"``."""
        return (
            f"{self.topic_name} {self.read_queue_nums} {self.write_queue_nums} "
            f"{int(self.perm)} {self.topic_filter_type}"
        )

    @classmethod
    def decode_compact(cls, text: str) -> TopicConfig:
        parts = text.split(" ", 5)  # a 6th part (5.x attributes) is ignored
        if len(parts) < 5:
            raise RouteDecodeError(f"topic config {text[:80]!r} has {len(parts)} parts, not 5")
        name, read, write, perm, filter_type = parts[:5]
        if not name or filter_type not in TOPIC_FILTER_TYPES:
            raise RouteDecodeError(f"topic config {text[:80]!r} is malformed")
        with _decoding(RouteDecodeError, "topic config"):
            return cls(
                name,
                _as_int(read, "readQueueNums", _INT32_MIN, _INT32_MAX),
                _as_int(write, "writeQueueNums", _INT32_MIN, _INT32_MAX),
                _as_int(perm, "perm", _INT32_MIN, _INT32_MAX),
                filter_type,
            )


def _topic_table_from_json(value: Any, path: str) -> dict[str, TopicConfig]:
    table = _obj(value, path) if value is not None else {}
    return {
        name: TopicConfig.from_json_obj(item, f"{path}[{name!r}]", name)
        for name, item in table.items()
    }


@attrs.frozen
class TopicConfigSerializeWrapper:
    """``topics.json``, the GET_ALL_TOPIC_CONFIG body and part of the register body."""

    topic_config_table: dict[str, TopicConfig] = attrs.field(factory=dict)
    data_version: DataVersion = DataVersion()

    def to_json_obj(self) -> dict:
        return {
            "dataVersion": self.data_version.to_json_obj(),
            "topicConfigTable": {
                name: config.to_json_obj() for name, config in self.topic_config_table.items()
            },
        }

    @classmethod
    def from_json_obj(cls, value: Any, path: str = "topics") -> TopicConfigSerializeWrapper:
        obj = _obj(value, path)
        version = obj.get("dataVersion")
        return cls(
            _topic_table_from_json(obj.get("topicConfigTable"), f"{path}.topicConfigTable"),
            DataVersion() if version is None else DataVersion.from_json_obj(version),
        )


@attrs.frozen
class BrokerData:
    """One broker group (master and slaves under one name). ``broker_addrs``: id -> ip:port."""

    cluster: str
    broker_name: str
    broker_addrs: dict[int, str] = attrs.field(factory=dict)
    #: 5.x fields, written only when set
    enable_acting_master: bool = False
    zone_name: str | None = None

    def to_json_obj(self) -> dict:
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
    def from_json_obj(cls, value: Any, path: str) -> BrokerData:
        obj = _obj(value, path)
        addrs = _get_obj(obj, "brokerAddrs", path)
        broker_addrs = {}
        for key, addr in addrs.items():
            if type(addr) is not str:
                raise _Bad(f"{path}.brokerAddrs[{key!r}] must be a string")
            broker_addrs[_int_key(key, f"{path}.brokerAddrs")] = addr
        return cls(
            cluster=_get_str(obj, "cluster", path, ""),
            broker_name=_get_str(obj, "brokerName", path),
            broker_addrs=broker_addrs,
            enable_acting_master=_get_bool(obj, "enableActingMaster", path, False),
            zone_name=_get_str(obj, "zoneName", path, None),
        )


@attrs.frozen
class QueueData:
    """A topic's queues on one broker group."""

    broker_name: str
    read_queue_nums: int
    write_queue_nums: int
    perm: int = Permission.READ | Permission.WRITE
    topic_sys_flag: int = 0

    def to_json_obj(self) -> dict:
        return {
            "brokerName": self.broker_name,
            "perm": self.perm,
            "readQueueNums": self.read_queue_nums,
            "topicSysFlag": self.topic_sys_flag,
            "writeQueueNums": self.write_queue_nums,
        }

    @classmethod
    def from_json_obj(cls, value: Any, path: str) -> QueueData:
        obj = _obj(value, path)
        # before 4.9 the field was misspelt topicSynFlag
        sys_flag = obj.get("topicSysFlag", obj.get("topicSynFlag"))
        return cls(
            broker_name=_get_str(obj, "brokerName", path),
            read_queue_nums=_get_int(obj, "readQueueNums", path, 0, int32=True),
            write_queue_nums=_get_int(obj, "writeQueueNums", path, 0, int32=True),
            perm=_get_int(obj, "perm", path, Permission.READ | Permission.WRITE, int32=True),
            topic_sys_flag=0 if sys_flag is None else _as_int(sys_flag, f"{path}.topicSysFlag"),
        )


@attrs.frozen
class TopicRouteData:
    """The GET_ROUTEINFO_BY_TOPIC body."""

    queue_datas: tuple[QueueData, ...] = attrs.field(default=(), converter=tuple)
    broker_datas: tuple[BrokerData, ...] = attrs.field(default=(), converter=tuple)
    #: broker address -> filter server addresses
    filter_server_table: dict[str, tuple[str, ...]] = attrs.field(factory=dict)
    order_topic_conf: str | None = None

    def to_json_obj(self) -> dict:
        return {
            "brokerDatas": [data.to_json_obj() for data in self.broker_datas],
            "filterServerTable": {k: list(v) for k, v in self.filter_server_table.items()},
            "orderTopicConf": self.order_topic_conf,
            "queueDatas": [data.to_json_obj() for data in self.queue_datas],
        }

    def encode(self, *, standard_json: bool) -> bytes:
        """The body, in the form the caller wants (see ``wants_standard_json``)."""
        return _dumps(self.to_json_obj(), standard_json)

    @classmethod
    def decode(cls, data: bytes | str) -> TopicRouteData:
        with _decoding(RouteDecodeError, "TopicRouteData"):
            obj = _obj(read_json(data, what="TopicRouteData"), "route")
            filters = _get_obj(obj, "filterServerTable", "route")
            return cls(
                queue_datas=tuple(
                    QueueData.from_json_obj(item, f"route.queueDatas[{i}]")
                    for i, item in enumerate(_get_list(obj, "queueDatas", "route"))
                ),
                broker_datas=tuple(
                    BrokerData.from_json_obj(item, f"route.brokerDatas[{i}]")
                    for i, item in enumerate(_get_list(obj, "brokerDatas", "route"))
                ),
                filter_server_table={
                    addr: tuple(_str_items(servers, f"route.filterServerTable[{addr!r}]"))
                    for addr, servers in filters.items()
                },
                order_topic_conf=_get_str(obj, "orderTopicConf", "route", None),
            )


@attrs.frozen
class ClusterInfo:
    """The GET_BROKER_CLUSTER_INFO body."""

    broker_addr_table: dict[str, BrokerData] = attrs.field(factory=dict)
    cluster_addr_table: dict[str, frozenset[str]] = attrs.field(factory=dict)

    def to_json_obj(self) -> dict:
        return {
            "brokerAddrTable": {k: v.to_json_obj() for k, v in self.broker_addr_table.items()},
            "clusterAddrTable": {k: frozenset(v) for k, v in self.cluster_addr_table.items()},
        }

    def encode(self, *, standard_json: bool = False) -> bytes:
        """Java's name server always answers in fastjson's form (unquoted broker ids)."""
        return _dumps(self.to_json_obj(), standard_json)

    @classmethod
    def decode(cls, data: bytes | str) -> ClusterInfo:
        with _decoding(RouteDecodeError, "ClusterInfo"):
            obj = _obj(read_json(data, what="ClusterInfo"), "clusterInfo")
            brokers = _get_obj(obj, "brokerAddrTable", "clusterInfo")
            clusters = _get_obj(obj, "clusterAddrTable", "clusterInfo")
            return cls(
                {
                    name: BrokerData.from_json_obj(item, f"clusterInfo.brokerAddrTable[{name!r}]")
                    for name, item in brokers.items()
                },
                {
                    name: frozenset(_str_items(names, f"clusterInfo.clusterAddrTable[{name!r}]"))
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
            return _dumps(
                {
                    "filterServerList": list(self.filter_server_list),
                    "topicConfigSerializeWrapper": wrapper.to_json_obj(),
                }
            )
        parts = []
        version = self.data_version.encode()
        parts += (_I.pack(len(version)), version)
        parts.append(_I.pack(len(self.topic_config_table)))
        for config in self.topic_config_table.values():
            text = config.encode_compact().encode()
            parts += (_I.pack(len(text)), text)
        filters = _dumps(list(self.filter_server_list))
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
        with _decoding(RouteDecodeError, "RegisterBrokerBody"):
            obj = _obj(read_json(data, what="RegisterBrokerBody"), "body")
            wrapper = obj.get("topicConfigSerializeWrapper")
            return cls(
                TopicConfigSerializeWrapper()
                if wrapper is None
                else TopicConfigSerializeWrapper.from_json_obj(
                    wrapper, "body.topicConfigSerializeWrapper"
                ),
                tuple(_str_items(obj.get("filterServerList"), "body.filterServerList")),
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
        with _decoding(RouteDecodeError, "RegisterBrokerBody"):
            servers = tuple(_str_items(filters, "filterServerList"))
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
class SubscriptionData:
    """A consumer's subscription to one topic. ``code_set`` holds the tags' Java hash codes."""

    topic: str
    sub_string: str = "*"
    tags_set: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    code_set: frozenset[int] = attrs.field(default=frozenset(), converter=frozenset)
    sub_version: int = 0
    expression_type: str = "TAG"
    class_filter_mode: bool = False

    def to_json_obj(self) -> dict:
        return {
            "classFilterMode": self.class_filter_mode,
            "codeSet": self.code_set,
            "expressionType": self.expression_type,
            "subString": self.sub_string,
            "subVersion": self.sub_version,
            "tagsSet": self.tags_set,
            "topic": self.topic,
        }

    @classmethod
    def from_json_obj(cls, value: Any, path: str) -> SubscriptionData:
        obj = _obj(value, path)
        codes = obj.get("codeSet")
        if codes is not None and type(codes) is not list:
            raise _Bad(f"{path}.codeSet must be an array")
        return cls(
            topic=_get_str(obj, "topic", path),
            sub_string=_get_str(obj, "subString", path, "*"),
            tags_set=_str_items(obj.get("tagsSet"), f"{path}.tagsSet"),
            code_set=[
                _as_int(code, f"{path}.codeSet[{i}]", _INT32_MIN, _INT32_MAX)
                for i, code in enumerate(codes or ())
            ],
            sub_version=_get_int(obj, "subVersion", path, 0),
            # a null expressionType means TAG to the broker
            expression_type=_get_str(obj, "expressionType", path, "TAG"),
            class_filter_mode=_get_bool(obj, "classFilterMode", path, False),
        )


@attrs.frozen
class ProducerData:
    group_name: str

    def to_json_obj(self) -> dict:
        return {"groupName": self.group_name}

    @classmethod
    def from_json_obj(cls, value: Any, path: str) -> ProducerData:
        return cls(_get_str(_obj(value, path), "groupName", path))


@attrs.frozen
class ConsumerData:
    group_name: str
    consume_type: str | None = CONSUME_PASSIVELY
    message_model: str | None = CLUSTERING
    consume_from_where: str | None = CONSUME_FROM_LAST_OFFSET
    subscription_data_set: tuple[SubscriptionData, ...] = attrs.field(default=(), converter=tuple)
    unit_mode: bool = False

    def to_json_obj(self) -> dict:
        return {
            "consumeFromWhere": self.consume_from_where,
            "consumeType": self.consume_type,
            "groupName": self.group_name,
            "messageModel": self.message_model,
            "subscriptionDataSet": [s.to_json_obj() for s in self.subscription_data_set],
            "unitMode": self.unit_mode,
        }

    @classmethod
    def from_json_obj(cls, value: Any, path: str) -> ConsumerData:
        obj = _obj(value, path)
        return cls(
            group_name=_get_str(obj, "groupName", path),
            consume_type=_get_str(obj, "consumeType", path, None),
            message_model=_get_str(obj, "messageModel", path, None),
            consume_from_where=_get_str(obj, "consumeFromWhere", path, None),
            subscription_data_set=[
                SubscriptionData.from_json_obj(item, f"{path}.subscriptionDataSet[{i}]")
                for i, item in enumerate(_get_list(obj, "subscriptionDataSet", path))
            ],
            unit_mode=_get_bool(obj, "unitMode", path, False),
        )


@attrs.frozen
class HeartbeatData:
    """The HEART_BEAT (34) request body."""

    client_id: str
    producer_data_set: tuple[ProducerData, ...] = attrs.field(default=(), converter=tuple)
    consumer_data_set: tuple[ConsumerData, ...] = attrs.field(default=(), converter=tuple)

    @property
    def producer_groups(self) -> tuple[str, ...]:
        return tuple(p.group_name for p in self.producer_data_set)

    def to_json_obj(self) -> dict:
        return {
            "clientID": self.client_id,
            "consumerDataSet": [c.to_json_obj() for c in self.consumer_data_set],
            "producerDataSet": [p.to_json_obj() for p in self.producer_data_set],
        }

    def encode(self) -> bytes:
        return _dumps(self.to_json_obj())

    @classmethod
    def decode(cls, data: bytes | str) -> HeartbeatData:
        with _decoding(RouteDecodeError, "HeartbeatData"):
            obj = _obj(read_json(data, what="HeartbeatData"), "heartbeat")
            return cls(
                client_id=_get_str(obj, "clientID", "heartbeat"),
                producer_data_set=[
                    ProducerData.from_json_obj(item, f"heartbeat.producerDataSet[{i}]")
                    for i, item in enumerate(_get_list(obj, "producerDataSet", "heartbeat"))
                ],
                consumer_data_set=[
                    ConsumerData.from_json_obj(item, f"heartbeat.consumerDataSet[{i}]")
                    for i, item in enumerate(_get_list(obj, "consumerDataSet", "heartbeat"))
                ],
            )


@attrs.frozen
class ConsumerIdList:
    """The GET_CONSUMER_LIST_BY_GROUP response body."""

    consumer_id_list: tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def encode(self) -> bytes:
        return _dumps({"consumerIdList": list(self.consumer_id_list)})

    @classmethod
    def decode(cls, data: bytes | str) -> ConsumerIdList:
        with _decoding(RouteDecodeError, "ConsumerIdList"):
            obj = _obj(read_json(data, what="ConsumerIdList"), "body")
            return cls(tuple(_str_items(obj.get("consumerIdList"), "body.consumerIdList")))


@attrs.frozen
class KVTable:
    """``{"table":{...}}``: GET_BROKER_RUNTIME_INFO and the register response body."""

    table: dict[str, str] = attrs.field(factory=dict)

    def encode(self) -> bytes:
        return _dumps({"table": dict(self.table)})

    @classmethod
    def decode(cls, data: bytes | str) -> KVTable:
        with _decoding(RouteDecodeError, "KVTable"):
            obj = _obj(read_json(data, what="KVTable"), "body")
            table = _get_obj(obj, "table", "body")
            return cls({k: _get_str(table, k, "body.table") for k in table if table[k] is not None})
