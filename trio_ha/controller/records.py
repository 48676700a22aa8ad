"""What the controller remembers of one broker set, as one whole record.

RocketMQ's controller keeps two tables per broker name (the members with their addresses and
check codes; the master, both epochs and the in-sync set) and rebuilds them by replaying a log
of small events. We keep one record per broker set instead and write it whole: every decision
of the rules replaces the records it touched, under the version it read (``state_store``).
A whole record needs no replay order, can be compared and checked on its own, and is what an
etcd key holds naturally; the cost, a few hundred bytes per change, is nothing at the rate
brokers change roles.

A record lives under the key ``sets/<brokerName>`` (the name percent-encoded, so a ``/`` in it
cannot make a second path level). The key names the broker name alone and not the cluster,
because RocketMQ's requests find a set by broker name alone (GET_REPLICA_INFO and
ALTER_SYNC_STATE_SET carry no cluster); the cluster is a field of the record.

The bytes are JSON with sorted keys and sorted lists, so one record always encodes to the same
bytes, and carry ``"format": 1`` so that a later layout can be told apart and refused by an
older controller instead of misread. ``decode`` takes the bytes as hostile (a damaged journal,
a hand-edited etcd key): it bounds the size, checks every type, range and cross-field rule, and
raises ``RecordError`` for anything else.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, cast
from urllib.parse import quote, unquote

import attrs

from .._errors import TrioHAError

__all__ = [
    "KEY_PREFIX",
    "MAX_MEMBERS",
    "MAX_RECORD_BYTES",
    "RECORD_FORMAT",
    "BrokerSetRecord",
    "MemberRecord",
    "RecordError",
    "broker_name_of_key",
    "key_for",
]

#: the layout version written into every record; decode refuses any other
RECORD_FORMAT = 1
#: where broker-set records live among the StateStore's keys
KEY_PREFIX = "sets/"
#: a record of a few members is a few hundred bytes; anything near this is not ours
MAX_RECORD_BYTES = 256 * 1024
#: members of one set: RocketMQ sets have two or three; a thousand is a runaway, not a set
MAX_MEMBERS = 1024
#: the longest broker name, cluster name, address or check code we keep
MAX_TEXT = 1024

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class RecordError(TrioHAError, ValueError):
    """A broker-set record is invalid: damaged bytes, an unknown format, or fields that break
    the record's rules (a master that is not a member, a negative epoch, ...)."""


def key_for(broker_name: str) -> str:
    """The StateStore key of the set named ``broker_name``."""
    return KEY_PREFIX + quote(broker_name, safe="")


def broker_name_of_key(key: str) -> str | None:
    """The broker name a key names, or None if the key is not a broker-set key."""
    if not key.startswith(KEY_PREFIX):
        return None
    return unquote(key[len(KEY_PREFIX):])


def _text(value: str) -> None:
    if len(value) > MAX_TEXT:
        raise RecordError(f"a text field of {len(value)} characters exceeds {MAX_TEXT}")


@attrs.frozen
class MemberRecord:
    """One broker of the set: its controller id, the address it serves on, and the check code
    (``<addr>;<millis>``) it applied for its id with, which a retry of the same broker repeats."""

    broker_id: int
    address: str
    register_check_code: str

    def __attrs_post_init__(self) -> None:
        if not 1 <= self.broker_id <= _INT64_MAX:
            raise RecordError(f"broker id {self.broker_id} is not a positive long")
        _text(self.address)
        _text(self.register_check_code)


def _members(value: Iterable[MemberRecord]) -> tuple[MemberRecord, ...]:
    return tuple(sorted(value, key=lambda m: m.broker_id))


@attrs.frozen
class BrokerSetRecord:
    """One broker set: its members, the next id to hand out, its master and epochs, and its
    in-sync set. Constructing one checks its rules, so an invalid record cannot exist:

    - member ids are unique and below ``next_broker_id``;
    - the master, when there is one, and every in-sync id are members;
    - both epochs are Java ints at or above 0 (the broker stores them as ints).
    """

    cluster: str
    broker_name: str
    members: tuple[MemberRecord, ...] = attrs.field(converter=_members, default=())
    next_broker_id: int = 1
    master_id: int | None = None
    master_epoch: int = 0
    sync_state_set_epoch: int = 0
    sync_state_set: frozenset[int] = attrs.field(converter=frozenset, default=frozenset())

    def __attrs_post_init__(self) -> None:
        _text(self.cluster)
        _text(self.broker_name)
        ids = [m.broker_id for m in self.members]
        if len(ids) > MAX_MEMBERS:
            raise RecordError(f"{len(ids)} members exceed the limit of {MAX_MEMBERS}")
        if len(set(ids)) != len(ids):
            raise RecordError(f"set {self.broker_name!r} lists a broker id twice")
        if not 1 <= self.next_broker_id <= _INT64_MAX or any(
                i >= self.next_broker_id for i in ids):
            raise RecordError(f"set {self.broker_name!r}: next id {self.next_broker_id} is not "
                              "above every member's id")
        if self.master_id is not None and self.master_id not in ids:
            raise RecordError(f"set {self.broker_name!r}: master {self.master_id} is not a member")
        if not self.sync_state_set <= set(ids):
            raise RecordError(f"set {self.broker_name!r}: in-sync ids "
                              f"{sorted(self.sync_state_set - set(ids))} are not members")
        for name, epoch in (("masterEpoch", self.master_epoch),
                            ("syncStateSetEpoch", self.sync_state_set_epoch)):
            if not 0 <= epoch <= _INT32_MAX:
                raise RecordError(f"set {self.broker_name!r}: {name} {epoch} is not an int >= 0")

    # ---- reading --------------------------------------------------------------------------

    @property
    def key(self) -> str:
        return key_for(self.broker_name)

    def member(self, broker_id: int | None) -> MemberRecord | None:
        for m in self.members:
            if m.broker_id == broker_id:
                return m
        return None

    def address_of(self, broker_id: int | None) -> str | None:
        m = self.member(broker_id)
        return None if m is None else m.address

    @property
    def member_ids(self) -> frozenset[int]:
        return frozenset(m.broker_id for m in self.members)

    @property
    def addresses(self) -> dict[int, str]:
        return {m.broker_id: m.address for m in self.members}

    # ---- bytes ----------------------------------------------------------------------------

    def encode(self) -> bytes:
        return json.dumps({
            "format": RECORD_FORMAT,
            "cluster": self.cluster,
            "brokerName": self.broker_name,
            "members": [{"id": m.broker_id, "address": m.address,
                         "registerCheckCode": m.register_check_code} for m in self.members],
            "nextBrokerId": self.next_broker_id,
            "masterId": self.master_id,
            "masterEpoch": self.master_epoch,
            "syncStateSetEpoch": self.sync_state_set_epoch,
            "syncStateSet": sorted(self.sync_state_set),
        }, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")

    @classmethod
    def decode(cls, data: bytes | bytearray | memoryview) -> BrokerSetRecord:
        """The record ``data`` holds; ``RecordError`` for anything that is not a valid
        record of our format."""
        if len(data) > MAX_RECORD_BYTES:
            raise RecordError(f"a broker-set record of {len(data)} bytes exceeds "
                              f"{MAX_RECORD_BYTES}")
        try:
            value: object = json.loads(bytes(data).decode("utf-8"),
                                       parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RecordError(f"a broker-set record is not JSON: {exc}") from None
        obj = _object(value, "record")
        fmt = obj.get("format")
        if fmt != RECORD_FORMAT or type(fmt) is not int:
            raise RecordError(f"a broker-set record has format {_short(fmt)}; this controller "
                              f"reads format {RECORD_FORMAT}")
        members_value = obj.get("members")
        if type(members_value) is not list:
            raise RecordError("record.members must be an array")
        members_list = cast("list[object]", members_value)
        if len(members_list) > MAX_MEMBERS:
            raise RecordError(f"{len(members_list)} members exceed the limit of {MAX_MEMBERS}")
        members: list[MemberRecord] = []
        for i, item in enumerate(members_list):
            m = _object(item, f"record.members[{i}]")
            members.append(MemberRecord(_int(m, "id", f"record.members[{i}]"),
                                        _str(m, "address", f"record.members[{i}]"),
                                        _str(m, "registerCheckCode", f"record.members[{i}]")))
        in_sync = obj.get("syncStateSet")
        if type(in_sync) is not list:
            raise RecordError("record.syncStateSet must be an array")
        master = obj.get("masterId")
        return cls(
            _str(obj, "cluster", "record"), _str(obj, "brokerName", "record"), members,
            _int(obj, "nextBrokerId", "record"),
            None if master is None else _int(obj, "masterId", "record"),
            _int(obj, "masterEpoch", "record"), _int(obj, "syncStateSetEpoch", "record"),
            frozenset(_as_int(v, "record.syncStateSet[]")
                      for v in cast("list[object]", in_sync)),
        )


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _object(value: object, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise RecordError(f"{path} must be an object")
    return cast("dict[str, Any]", value)


def _as_int(value: object, path: str) -> int:
    if type(value) is not int or not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise RecordError(f"{path} must be a long, got {_short(value)}")
    return value


def _int(obj: dict[str, Any], key: str, path: str) -> int:
    return _as_int(obj.get(key), f"{path}.{key}")


def _str(obj: dict[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if type(value) is not str:
        raise RecordError(f"{path}.{key} must be a string, got {_short(value)}")
    return value
