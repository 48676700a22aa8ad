"""The heartbeat table, with time passed in, and the broker-set record's bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.controller.liveness import (
    DEFAULT_ELECTION_PRIORITY,
    MAX_HEARTBEAT_TIMEOUT_MS,
    BrokerIdentity,
    HeartbeatTable,
)
from trio_ha.controller.records import (
    MAX_RECORD_BYTES,
    BrokerSetRecord,
    MemberRecord,
    RecordError,
    broker_name_of_key,
    key_for,
)

B1 = BrokerIdentity("c1", "broker-a", 1)
B2 = BrokerIdentity("c1", "broker-a", 2)


def test_alive_until_last_heartbeat_plus_timeout_then_expired() -> None:
    t = HeartbeatTable()
    assert t.heartbeat(B1, address="a:1", now=100.0, timeout_ms=10_000)
    assert t.is_alive(B1, 110.0) and not t.is_alive(B1, 110.001)
    assert t.expired(110.0) == [] and t.expired(110.5) == [B1]
    assert t.get(B1) is None and len(t) == 0


def test_defaults_are_rocketmqs() -> None:
    t = HeartbeatTable()
    t.heartbeat(B1, address="a:1", now=0.0)
    info = t.get(B1)
    assert info is not None
    assert (info.timeout_ms, info.epoch, info.max_offset, info.confirm_offset,
            info.election_priority, info.channel) == \
        (10_000, -1, -1, -1, DEFAULT_ELECTION_PRIORITY, "a:1")


def test_a_closed_channel_kills_its_brokers_at_once() -> None:
    t = HeartbeatTable()
    t.heartbeat(B1, address="a:1", now=0.0, channel="conn-7")
    t.heartbeat(B2, address="b:1", now=0.0, channel="conn-8")
    assert t.channel_closed("conn-9") == []
    assert t.channel_closed("conn-7") == [B1]
    assert not t.is_alive(B1, 0.0) and t.is_alive(B2, 0.0)


def test_the_latest_report_wins_even_when_the_offset_goes_down() -> None:
    # RocketMQ keeps the highest (epoch, maxOffset) ever heard; a broker that truncated its
    # log would keep ranking on bytes it no longer has.
    t = HeartbeatTable()
    t.heartbeat(B1, address="a:1", now=0.0, epoch=3, max_offset=9000, election_priority=1)
    t.heartbeat(B1, address="a:1", now=1.0, epoch=3, max_offset=4000)
    info = t.get(B1)
    assert info is not None
    assert (info.epoch, info.max_offset, info.last_heartbeat, info.election_priority) == \
        (3, 4000, 1.0, DEFAULT_ELECTION_PRIORITY)


def test_timeouts_are_clamped() -> None:
    t = HeartbeatTable()
    t.heartbeat(B1, address="a:1", now=0.0, timeout_ms=2**62)
    t.heartbeat(B2, address="b:1", now=0.0, timeout_ms=-5)
    assert t.get(B1).timeout_ms == MAX_HEARTBEAT_TIMEOUT_MS  # type: ignore[union-attr]
    assert not t.is_alive(B1, MAX_HEARTBEAT_TIMEOUT_MS / 1000 + 1)
    assert t.is_alive(B2, 0.0) and not t.is_alive(B2, 0.001)


def test_a_full_table_refuses_newcomers_but_keeps_its_members_and_frees_expired_places() -> None:
    t = HeartbeatTable(capacity=100)
    for i in range(10_000):
        t.heartbeat(BrokerIdentity("c", f"flood-{i}", 1), address=f"10.0.{i // 256}.{i % 256}:1",
                    now=0.0)
        assert len(t) <= 100
    assert len(t) == 100
    assert not t.heartbeat(B1, address="a:1", now=5.0)
    assert t.heartbeat(BrokerIdentity("c", "flood-0", 1), address="x:1", now=5.0)  # a member
    assert t.heartbeat(B1, address="a:1", now=10.5)  # the others expired: room again
    assert len(t) == 2


# ---- records ---------------------------------------------------------------------------------


def sample() -> BrokerSetRecord:
    return BrokerSetRecord(
        "c1", "broker-a", (MemberRecord(2, "b:1", "b:1;2"), MemberRecord(1, "a:1", "a:1;1")),
        3, 1, 4, 7, frozenset({2, 1}))


def test_record_round_trips_to_stable_versioned_json() -> None:
    r = sample()
    data = r.encode()
    assert BrokerSetRecord.decode(data) == r
    assert json.loads(data)["format"] == 1
    assert data == BrokerSetRecord.decode(data).encode()
    assert data == (
        b'{"brokerName":"broker-a","cluster":"c1","format":1,"masterEpoch":4,"masterId":1,'
        b'"members":[{"address":"a:1","id":1,"registerCheckCode":"a:1;1"},'
        b'{"address":"b:1","id":2,"registerCheckCode":"b:1;2"}],"nextBrokerId":3,'
        b'"syncStateSet":[1,2],"syncStateSetEpoch":7}')
    assert [m.broker_id for m in r.members] == [1, 2]


def test_keys_name_the_broker_name_alone_and_escape_it() -> None:
    assert key_for("broker-a") == "sets/broker-a"
    assert key_for("a/b c") == "sets/a%2Fb%20c"
    assert broker_name_of_key(key_for("a/b c")) == "a/b c"
    assert broker_name_of_key("controller/meta") is None


def _mutated(**changes: object) -> bytes:
    obj = json.loads(sample().encode())
    obj.update(changes)
    return json.dumps(obj).encode()


@pytest.mark.parametrize("data", [
    b"", b"\xff", b"[]", b"null", b'{"format":1}', b"{" * 5000, b'{"format":NaN}',
    _mutated(format=2), _mutated(format=True), _mutated(format="1"),
    _mutated(masterId=9), _mutated(syncStateSet=[1, 5]), _mutated(masterEpoch=-1),
    _mutated(masterEpoch=2**31), _mutated(nextBrokerId=2), _mutated(members="x"),
    _mutated(members=[{"id": 1, "address": "a", "registerCheckCode": "c"}] * 2),
    _mutated(members=[{"id": 0, "address": "a", "registerCheckCode": "c"}]),
    _mutated(members=[{"id": 1, "address": 5, "registerCheckCode": "c"}]),
    _mutated(cluster=None), _mutated(syncStateSet=[True]), _mutated(masterId=1.0),
    _mutated(brokerName="x" * 5000), b" " * (MAX_RECORD_BYTES + 1),
])
def test_damaged_records_raise_record_error(data: bytes) -> None:
    with pytest.raises(RecordError):
        BrokerSetRecord.decode(data)


@given(st.binary(max_size=300))
def test_random_bytes_decode_or_raise_record_error(data: bytes) -> None:
    try:
        BrokerSetRecord.decode(data)
    except RecordError:
        pass


@given(st.integers(0, len(sample().encode()) - 1), st.integers(0, 255))
def test_a_flipped_byte_decodes_to_a_valid_record_or_raises_record_error(
        at: int, value: int) -> None:
    data = bytearray(sample().encode())
    data[at] = value
    try:
        r = BrokerSetRecord.decode(bytes(data))
    except RecordError:
        return
    assert BrokerSetRecord.decode(r.encode()) == r
