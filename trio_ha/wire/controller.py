"""The broker <-> controller protocol of RocketMQ 5's controller mode: headers and bodies.

A controller-mode broker never picks its own role. It asks a controller (RocketMQ's
``ControllerStartup``, or one embedded in a name server) for a broker id, registers, asks to
be elected, heartbeats, and is told who the master is; a master proposes changes of its
in-sync replica set (the "SyncStateSet"). Every exchange is a RemotingCommand whose header
travels in ``extFields`` (the classes below, with ``HeaderField`` tuples as the send header
has) and whose body is fastjson JSON (the ``*Body`` classes). The request codes are in
``codes.RequestCode`` (904, 1001-1013) and the controller's answers in ``codes.ResponseCode``
(2000-2016).

Field names, Java types and defaults are RocketMQ 5.3.3's
(``remoting/.../protocol/header/controller``, ``NotifyBrokerRoleChangedRequestHeader``,
``namesrv/BrokerHeartbeatRequestHeader``, ``body/SyncStateSet``, ``ElectMasterResponseBody``,
``EpochEntryCache``); docs/controller-mode.md says what each exchange is for. Two habits of
the real controller matter when reading its bodies: sets of broker ids are JSON arrays of
numbers, and ``brokerAddrs`` maps are keyed by unquoted numbers (fastjson), which
``read_json`` accepts. Every decoder takes untrusted bytes and raises
``ControllerDecodeError`` for anything malformed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from .errors import WireError
from .fastjson import encode_json, read_json
from .json_fields import (
    as_int,
    as_object,
    decoding,
    get_bool,
    get_int,
    get_list,
    get_object,
    get_str,
)
from .remoting.headers import FieldKind, HeaderField, HeaderSpec
from .route import BrokerData

__all__ = [
    "MAX_CONTROLLER_BODY",
    "AlterSyncStateSetRequestHeader",
    "AlterSyncStateSetResponseHeader",
    "ApplyBrokerIdRequestHeader",
    "ApplyBrokerIdResponseHeader",
    "BrokerHeartbeatRequestHeader",
    "BrokerReplicasInfo",
    "CleanBrokerDataRequestHeader",
    "ControllerDecodeError",
    "ElectMasterRequestHeader",
    "ElectMasterResponseBody",
    "ElectMasterResponseHeader",
    "EpochEntryCacheBody",
    "EpochEntryView",
    "GetMetaDataResponseHeader",
    "GetNextBrokerIdRequestHeader",
    "GetNextBrokerIdResponseHeader",
    "GetReplicaInfoRequestHeader",
    "GetReplicaInfoResponseHeader",
    "NotifyBrokerRoleChangedRequestHeader",
    "RegisterBrokerToControllerRequestHeader",
    "RegisterBrokerToControllerResponseHeader",
    "ReplicaIdentity",
    "ReplicasInfo",
    "SyncStateSet",
    "decode_broker_names",
    "encode_broker_names",
]

#: the largest controller body we parse: a set of a few broker ids, an epoch list of at most
#: a few thousand entries, one broker group's addresses
MAX_CONTROLLER_BODY = 1024 * 1024

_STR, _INT, _LONG, _BOOL = FieldKind.STR, FieldKind.INT, FieldKind.LONG, FieldKind.BOOL


class ControllerDecodeError(WireError):
    """A controller-protocol body is malformed."""


def _opt(attr: str, name: str, kind: FieldKind = _STR) -> HeaderField:
    return HeaderField(attr, name, kind, required=False)


# ---- start-up: ids and registration ---------------------------------------------------------


@attrs.frozen
class GetNextBrokerIdRequestHeader:
    """CONTROLLER_GET_NEXT_BROKER_ID (1012): which controller id would a new member get."""

    cluster_name: str | None = None
    broker_name: str | None = None

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"))


@attrs.frozen
class GetNextBrokerIdResponseHeader:
    cluster_name: str | None = None
    broker_name: str | None = None
    next_broker_id: int | None = None

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"),
              _opt("next_broker_id", "nextBrokerId", _LONG))


@attrs.frozen
class ApplyBrokerIdRequestHeader:
    """CONTROLLER_APPLY_BROKER_ID (1013): claim an id. ``register_check_code`` is
    ``<brokerAddr>;<millis>``; the controller takes the broker's address from it, and accepts
    a second claim of the same id only with the same code (a broker retrying)."""

    cluster_name: str | None = None
    broker_name: str | None = None
    applied_broker_id: int | None = None
    register_check_code: str | None = None

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"),
              _opt("applied_broker_id", "appliedBrokerId", _LONG),
              _opt("register_check_code", "registerCheckCode"))


@attrs.frozen
class ApplyBrokerIdResponseHeader:
    """The answer to APPLY_BROKER_ID names the set back; success is the response code."""

    cluster_name: str | None = None
    broker_name: str | None = None

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"))


@attrs.frozen
class RegisterBrokerToControllerRequestHeader:
    """CONTROLLER_REGISTER_BROKER (1003): a broker with an id says where it is now."""

    cluster_name: str | None = None
    broker_name: str | None = None
    broker_id: int | None = None
    broker_address: str | None = None
    invoke_time: int = 0

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"),
              _opt("broker_id", "brokerId", _LONG), _opt("broker_address", "brokerAddress"),
              _opt("invoke_time", "invokeTime", _LONG))


@attrs.frozen
class RegisterBrokerToControllerResponseHeader:
    """The master fields are set only when the set has a master and it is alive."""

    cluster_name: str | None = None
    broker_name: str | None = None
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None

    FIELDS = (_opt("cluster_name", "clusterName"), _opt("broker_name", "brokerName"),
              _opt("master_broker_id", "masterBrokerId", _LONG),
              _opt("master_address", "masterAddress"),
              _opt("master_epoch", "masterEpoch", _INT),
              _opt("sync_state_set_epoch", "syncStateSetEpoch", _INT))


# ---- roles -----------------------------------------------------------------------------------


@attrs.frozen
class ElectMasterRequestHeader:
    """CONTROLLER_ELECT_MASTER (1002): from a broker (elect me, or anyone if my set has no
    master), or from an admin with ``designate_elect`` (elect exactly ``broker_id``)."""

    cluster_name: str = ""
    broker_name: str = ""
    broker_id: int = -1
    designate_elect: bool = False
    invoke_time: int = 0

    FIELDS = (HeaderField("cluster_name", "clusterName"),
              HeaderField("broker_name", "brokerName"),
              HeaderField("broker_id", "brokerId", _LONG),
              HeaderField("designate_elect", "designateElect", _BOOL),
              _opt("invoke_time", "invokeTime", _LONG))


@attrs.frozen
class ElectMasterResponseHeader:
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None

    FIELDS = (_opt("master_broker_id", "masterBrokerId", _LONG),
              _opt("master_address", "masterAddress"),
              _opt("master_epoch", "masterEpoch", _INT),
              _opt("sync_state_set_epoch", "syncStateSetEpoch", _INT))


@attrs.frozen
class GetReplicaInfoRequestHeader:
    """CONTROLLER_GET_REPLICA_INFO (1004): who is the master of my set, at which epoch."""

    broker_name: str | None = None

    FIELDS = (_opt("broker_name", "brokerName"),)


@attrs.frozen
class GetReplicaInfoResponseHeader:
    master_broker_id: int | None = None
    master_address: str | None = None
    master_epoch: int | None = None

    FIELDS = (_opt("master_broker_id", "masterBrokerId", _LONG),
              _opt("master_address", "masterAddress"),
              _opt("master_epoch", "masterEpoch", _INT))


@attrs.frozen
class NotifyBrokerRoleChangedRequestHeader:
    """NOTIFY_BROKER_ROLE_CHANGED (1008), controller -> broker after an election; the body is
    the new ``SyncStateSet``. Sent as a request whose answer the controller ignores."""

    master_address: str | None = None
    master_epoch: int | None = None
    sync_state_set_epoch: int | None = None
    master_broker_id: int | None = None

    FIELDS = (_opt("master_address", "masterAddress"),
              _opt("master_epoch", "masterEpoch", _INT),
              _opt("sync_state_set_epoch", "syncStateSetEpoch", _INT),
              _opt("master_broker_id", "masterBrokerId", _LONG))


@attrs.frozen
class AlterSyncStateSetRequestHeader:
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001), master -> leader; the body is the proposed set
    with the *current* set epoch."""

    broker_name: str | None = None
    master_broker_id: int | None = None
    master_epoch: int | None = None
    invoke_time: int = 0

    FIELDS = (_opt("broker_name", "brokerName"),
              _opt("master_broker_id", "masterBrokerId", _LONG),
              _opt("master_epoch", "masterEpoch", _INT),
              _opt("invoke_time", "invokeTime", _LONG))


@attrs.frozen
class AlterSyncStateSetResponseHeader:
    new_sync_state_set_epoch: int = 0

    FIELDS = (_opt("new_sync_state_set_epoch", "newSyncStateSetEpoch", _INT),)


@attrs.frozen
class BrokerHeartbeatRequestHeader:
    """BROKER_HEARTBEAT (904), sent one-way to every controller every brokerHeartbeatInterval.
    The controller elects among live members by ``epoch``, then ``max_offset``, then
    ``election_priority`` (lower first), and declares the broker dead after
    ``heartbeat_timeout_mills`` without one."""

    cluster_name: str
    broker_addr: str
    broker_name: str
    broker_id: int | None = None
    epoch: int | None = None
    max_offset: int | None = None
    confirm_offset: int | None = None
    heartbeat_timeout_mills: int | None = None
    election_priority: int | None = None

    FIELDS = (HeaderField("cluster_name", "clusterName"),
              HeaderField("broker_addr", "brokerAddr"),
              HeaderField("broker_name", "brokerName"),
              _opt("broker_id", "brokerId", _LONG),
              _opt("epoch", "epoch", _INT),
              _opt("max_offset", "maxOffset", _LONG),
              _opt("confirm_offset", "confirmOffset", _LONG),
              _opt("heartbeat_timeout_mills", "heartbeatTimeoutMills", _LONG),
              _opt("election_priority", "electionPriority", _INT))


# ---- controller metadata and admin -------------------------------------------------------------


@attrs.frozen
class GetMetaDataResponseHeader:
    """CONTROLLER_GET_METADATA_INFO (1005), answered by any controller: who leads.
    ``peers`` is ``n0:ip:port;n1:ip:port``."""

    group: str | None = None
    controller_leader_id: str | None = None
    controller_leader_address: str | None = None
    is_leader: bool = False
    peers: str | None = None

    FIELDS = (_opt("group", "group"), _opt("controller_leader_id", "controllerLeaderId"),
              _opt("controller_leader_address", "controllerLeaderAddress"),
              _opt("is_leader", "isLeader", _BOOL), _opt("peers", "peers"))


@attrs.frozen
class CleanBrokerDataRequestHeader:
    """CLEAN_BROKER_DATA (1011), admin -> leader: forget members of a set (``1;2``)."""

    broker_name: str
    cluster_name: str | None = None
    broker_controller_ids_to_clean: str | None = None
    is_clean_living_broker: bool = False
    invoke_time: int = 0

    FIELDS = (HeaderField("broker_name", "brokerName"), _opt("cluster_name", "clusterName"),
              _opt("broker_controller_ids_to_clean", "brokerControllerIdsToClean"),
              _opt("is_clean_living_broker", "isCleanLivingBroker", _BOOL),
              _opt("invoke_time", "invokeTime", _LONG))


#: a HeaderSpec per header class, built once
SPECS: dict[type[Any], HeaderSpec[Any]] = {
    cls: HeaderSpec(cls, cls.FIELDS) for cls in (
        GetNextBrokerIdRequestHeader, GetNextBrokerIdResponseHeader, ApplyBrokerIdRequestHeader,
        ApplyBrokerIdResponseHeader,
        RegisterBrokerToControllerRequestHeader, RegisterBrokerToControllerResponseHeader,
        ElectMasterRequestHeader, ElectMasterResponseHeader, GetReplicaInfoRequestHeader,
        GetReplicaInfoResponseHeader, NotifyBrokerRoleChangedRequestHeader,
        AlterSyncStateSetRequestHeader, AlterSyncStateSetResponseHeader,
        BrokerHeartbeatRequestHeader, GetMetaDataResponseHeader, CleanBrokerDataRequestHeader,
    )
}


# ---- bodies ----------------------------------------------------------------------------------


def _body(data: bytes | bytearray | memoryview, what: str) -> dict[str, Any]:
    value = read_json(data, max_length=MAX_CONTROLLER_BODY, error=ControllerDecodeError,
                      what=what)
    with decoding(ControllerDecodeError, what):
        return as_object(value, what)


def _ids(obj: dict[str, Any], key: str, path: str) -> frozenset[int]:
    if obj.get(key) is None:
        return frozenset()
    return frozenset(as_int(v, f"{path}.{key}[]") for v in get_list(obj, key, path))


@attrs.frozen
class SyncStateSet:
    """The in-sync replica set of a broker set (controller brokerIds) and its epoch."""

    members: frozenset[int] = attrs.field(converter=frozenset, factory=frozenset)
    epoch: int = 0

    def encode(self) -> bytes:
        return encode_json({"syncStateSet": sorted(self.members),
                            "syncStateSetEpoch": self.epoch})

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> SyncStateSet:
        obj = _body(data, "SyncStateSet")
        with decoding(ControllerDecodeError, "SyncStateSet"):
            return cls(_ids(obj, "syncStateSet", "SyncStateSet"),
                       get_int(obj, "syncStateSetEpoch", "SyncStateSet", 0, int32=True))


@attrs.frozen
class ElectMasterResponseBody:
    """The answer to ELECT_MASTER: the set's members and addresses (``broker_addrs``, by
    controller id; absent on MASTER_STILL_EXIST) and the new in-sync set."""

    sync_state_set: frozenset[int] = attrs.field(converter=frozenset, factory=frozenset)
    cluster: str | None = None
    broker_name: str | None = None
    broker_addrs: dict[int, str] = attrs.field(factory=dict[int, str])

    def encode(self) -> bytes:
        obj: dict[str, Any] = {"syncStateSet": sorted(self.sync_state_set)}
        if self.broker_name is not None:
            obj["brokerMemberGroup"] = BrokerData(
                self.cluster or "", self.broker_name, dict(self.broker_addrs)).to_json_obj()
        return encode_json(obj)

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> ElectMasterResponseBody:
        what = "ElectMasterResponseBody"
        obj = _body(data, what)
        with decoding(ControllerDecodeError, what):
            members = _ids(obj, "syncStateSet", what)
            if obj.get("brokerMemberGroup") is None:
                return cls(members)
            group = BrokerData.from_json_obj(get_object(obj, "brokerMemberGroup", what),
                                             f"{what}.brokerMemberGroup")
            return cls(members, group.cluster, group.broker_name, group.broker_addrs)


@attrs.frozen
class EpochEntryView:
    """One epoch of a broker's log: written from ``start_offset`` up to ``end_offset``
    (Java's Long.MAX_VALUE for the open last epoch)."""

    epoch: int
    start_offset: int
    end_offset: int


@attrs.frozen
class EpochEntryCacheBody:
    """The answer to GET_BROKER_EPOCH_CACHE (1007): a broker's epoch history, for mqadmin's
    ``getBrokerEpoch``. ``broker_id`` is the broker's current id (0 for a master)."""

    cluster_name: str
    broker_name: str
    broker_id: int
    epochs: tuple[EpochEntryView, ...]
    max_offset: int

    def encode(self) -> bytes:
        return encode_json({
            "brokerId": self.broker_id,
            "brokerName": self.broker_name,
            "clusterName": self.cluster_name,
            "epochList": [{"endOffset": e.end_offset, "epoch": e.epoch,
                           "startOffset": e.start_offset} for e in self.epochs],
            "maxOffset": self.max_offset,
        })

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> EpochEntryCacheBody:
        what = "EpochEntryCache"
        obj = _body(data, what)
        with decoding(ControllerDecodeError, what):
            epochs = tuple(
                EpochEntryView(get_int(e, "epoch", f"{what}.epochList[]", int32=True),
                               get_int(e, "startOffset", f"{what}.epochList[]"),
                               get_int(e, "endOffset", f"{what}.epochList[]"))
                for e in (as_object(v, f"{what}.epochList[]")
                          for v in get_list(obj, "epochList", what))
            )
            return cls(get_str(obj, "clusterName", what, ""), get_str(obj, "brokerName", what, ""),
                       get_int(obj, "brokerId", what, 0), epochs,
                       get_int(obj, "maxOffset", what, 0))


@attrs.frozen
class ReplicaIdentity:
    """One member of a broker set as CONTROLLER_GET_SYNC_STATE_DATA shows it: its controller
    id, address, and whether the controller hears its heartbeats."""

    broker_name: str
    broker_id: int
    broker_address: str
    alive: bool = False

    def to_json_obj(self) -> dict[str, Any]:
        return {"alive": self.alive, "brokerAddress": self.broker_address,
                "brokerId": self.broker_id, "brokerName": self.broker_name}

    @classmethod
    def from_json_obj(cls, obj: dict[str, Any], path: str) -> ReplicaIdentity:
        return cls(get_str(obj, "brokerName", path, ""), get_int(obj, "brokerId", path),
                   get_str(obj, "brokerAddress", path, ""), get_bool(obj, "alive", path, False))


@attrs.frozen
class ReplicasInfo:
    """One broker set in a ``BrokerReplicasInfo``: its master (None when it has none), both
    epochs, and its members split by whether they are in the in-sync set."""

    master_broker_id: int | None
    master_address: str | None
    master_epoch: int
    sync_state_set_epoch: int
    in_sync_replicas: tuple[ReplicaIdentity, ...] = ()
    not_in_sync_replicas: tuple[ReplicaIdentity, ...] = ()

    def to_json_obj(self) -> dict[str, Any]:
        # None values are left out by the writer, as fastjson leaves out nulls.
        return {"inSyncReplicas": [r.to_json_obj() for r in self.in_sync_replicas],
                "masterAddress": self.master_address, "masterBrokerId": self.master_broker_id,
                "masterEpoch": self.master_epoch,
                "notInSyncReplicas": [r.to_json_obj() for r in self.not_in_sync_replicas],
                "syncStateSetEpoch": self.sync_state_set_epoch}

    @classmethod
    def from_json_obj(cls, obj: dict[str, Any], path: str) -> ReplicasInfo:
        def replicas(key: str) -> tuple[ReplicaIdentity, ...]:
            where = f"{path}.{key}[]"
            return tuple(ReplicaIdentity.from_json_obj(as_object(v, where), where)
                         for v in get_list(obj, key, path))

        return cls(get_int(obj, "masterBrokerId", path, None),
                   get_str(obj, "masterAddress", path, None),
                   get_int(obj, "masterEpoch", path, 0, int32=True),
                   get_int(obj, "syncStateSetEpoch", path, 0, int32=True),
                   replicas("inSyncReplicas"), replicas("notInSyncReplicas"))


@attrs.frozen
class BrokerReplicasInfo:
    """The answer to CONTROLLER_GET_SYNC_STATE_DATA (1006), what mqadmin's
    ``getSyncStateSet`` prints: per broker name asked for and known, its ``ReplicasInfo``."""

    replicas_info_table: dict[str, ReplicasInfo] = attrs.field(factory=dict[str, ReplicasInfo])

    def encode(self) -> bytes:
        return encode_json({"replicasInfoTable": {
            name: info.to_json_obj() for name, info in self.replicas_info_table.items()}})

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> BrokerReplicasInfo:
        what = "BrokerReplicasInfo"
        obj = _body(data, what)
        with decoding(ControllerDecodeError, what):
            table = get_object(obj, "replicasInfoTable", what)
            return cls({name: ReplicasInfo.from_json_obj(
                            as_object(value, f"{what}.replicasInfoTable[{name!r}]"),
                            f"{what}.replicasInfoTable[{name!r}]")
                        for name, value in table.items()})


def encode_broker_names(names: Iterable[str]) -> bytes:
    """The body of CONTROLLER_GET_SYNC_STATE_DATA (1006): a JSON list of broker names."""
    return encode_json(list(names))


def decode_broker_names(data: bytes | bytearray | memoryview) -> list[str]:
    value = read_json(data, max_length=MAX_CONTROLLER_BODY, error=ControllerDecodeError,
                      what="broker name list")
    names: list[str] = []
    for item in value if isinstance(value, list) else [None]:  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(item, str):
            raise ControllerDecodeError("broker name list must be a JSON list of strings")
        names.append(item)
    return names
