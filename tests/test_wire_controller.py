"""The controller protocol's headers and bodies, against the layouts RocketMQ 5.3.3 writes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.wire.controller import (
    SPECS,
    ApplyBrokerIdResponseHeader,
    BrokerHeartbeatRequestHeader,
    BrokerReplicasInfo,
    ControllerDecodeError,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    EpochEntryCacheBody,
    EpochEntryView,
    GetMetaDataResponseHeader,
    RegisterBrokerToControllerResponseHeader,
    ReplicaIdentity,
    ReplicasInfo,
    SyncStateSet,
    decode_broker_names,
    encode_broker_names,
)
from trio_ha.wire.errors import HeaderFieldError
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


def test_sync_state_set_reads_what_fastjson_writes_and_writes_it_back() -> None:
    body = b'{"syncStateSet":[1,2],"syncStateSetEpoch":3}'
    members = SyncStateSet.decode(body)
    assert members == SyncStateSet(frozenset({1, 2}), 3)
    assert members.encode() == body


def test_elect_answer_with_unquoted_numeric_keys() -> None:
    # fastjson writes Map<Long, String> keys as bare numbers
    body = (b'{"brokerMemberGroup":{"brokerAddrs":{1:"127.0.0.1:30911",2:"127.0.0.1:30921"},'
            b'"brokerName":"broker-a","cluster":"c1"},"syncStateSet":[2]}')
    answer = ElectMasterResponseBody.decode(body)
    assert answer.sync_state_set == frozenset({2})
    assert answer.broker_addrs == {1: "127.0.0.1:30911", 2: "127.0.0.1:30921"}
    assert (answer.cluster, answer.broker_name) == ("c1", "broker-a")
    assert ElectMasterResponseBody.decode(answer.encode()) == answer


def test_elect_answer_without_member_group() -> None:
    # CONTROLLER_MASTER_STILL_EXIST carries no member group
    assert ElectMasterResponseBody.decode(b'{"syncStateSet":[1]}') == \
        ElectMasterResponseBody(frozenset({1}))


def test_epoch_cache_body_round_trips_with_java_field_names() -> None:
    body = EpochEntryCacheBody("c1", "broker-a", 0, (
        EpochEntryView(1, 0, 7000), EpochEntryView(2, 7000, 2**63 - 1)), 9000)
    encoded = body.encode()
    assert b'"epochList":[{"endOffset":7000,"epoch":1,"startOffset":0}' in encoded
    assert b'"maxOffset":9000' in encoded and b'"clusterName":"c1"' in encoded
    assert EpochEntryCacheBody.decode(encoded) == body


@pytest.mark.parametrize("body", [
    b"", b"[]", b'{"syncStateSet":"x"}', b'{"syncStateSet":[1,"a"]}',
    b'{"syncStateSetEpoch":99999999999}', b"\xff\xfe", b"{" * 100,
])
def test_malformed_sync_state_sets_are_decode_errors(body: bytes) -> None:
    with pytest.raises(ControllerDecodeError):
        SyncStateSet.decode(body)


def test_headers_use_rocketmq_field_names() -> None:
    header = BrokerHeartbeatRequestHeader(
        cluster_name="c1", broker_addr="127.0.0.1:30911", broker_name="broker-a", broker_id=1,
        epoch=3, max_offset=1024, confirm_offset=512, heartbeat_timeout_mills=10_000,
        election_priority=2**31 - 1)
    assert SPECS[BrokerHeartbeatRequestHeader].encode(header) == {
        "clusterName": "c1", "brokerAddr": "127.0.0.1:30911", "brokerName": "broker-a",
        "brokerId": "1", "epoch": "3", "maxOffset": "1024", "confirmOffset": "512",
        "heartbeatTimeoutMills": "10000", "electionPriority": "2147483647",
    }
    elect = SPECS[ElectMasterRequestHeader].encode(ElectMasterRequestHeader("c1", "b", 2))
    assert elect["designateElect"] == "false" and elect["brokerId"] == "2"


def test_register_answer_without_a_master_leaves_master_fields_unset() -> None:
    response = RemotingCommand.response_to(
        RemotingCommand.request(RequestCode.CONTROLLER_REGISTER_BROKER), ResponseCode.SUCCESS,
        ext_fields={"clusterName": "c1", "brokerName": "b"})
    header = SPECS[RegisterBrokerToControllerResponseHeader].decode(response)
    assert header.master_broker_id is None and header.master_epoch is None


def test_metadata_header_reads_is_leader() -> None:
    response = RemotingCommand.response_to(
        RemotingCommand.request(RequestCode.CONTROLLER_GET_METADATA_INFO), ResponseCode.SUCCESS,
        ext_fields={"group": "g", "controllerLeaderId": "n0", "isLeader": "true",
                    "controllerLeaderAddress": "127.0.0.1:9878", "peers": "n0:127.0.0.1:9878"})
    header = SPECS[GetMetaDataResponseHeader].decode(response)
    assert header.is_leader and header.controller_leader_address == "127.0.0.1:9878"


def test_a_heartbeat_without_required_fields_is_refused() -> None:
    request = RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {"clusterName": "c1"})
    with pytest.raises(HeaderFieldError):
        SPECS[BrokerHeartbeatRequestHeader].decode(request)


def test_broker_name_list() -> None:
    assert decode_broker_names(encode_broker_names(["a", "b"])) == ["a", "b"]
    with pytest.raises(ControllerDecodeError):
        decode_broker_names(b'{"a":1}')


@given(st.frozensets(st.integers(0, 2**63 - 1), max_size=8), st.integers(0, 2**31 - 1))
def test_sync_state_set_round_trip(members: frozenset[int], epoch: int) -> None:
    value = SyncStateSet(members, epoch)
    assert SyncStateSet.decode(value.encode()) == value


@given(st.binary(max_size=64))
def test_any_bytes_decode_or_raise_the_typed_error(data: bytes) -> None:
    for decode in (SyncStateSet.decode, ElectMasterResponseBody.decode,
                   EpochEntryCacheBody.decode):
        try:
            decode(data)
        except ControllerDecodeError:
            pass


def test_broker_replicas_info_in_fastjsons_layout() -> None:
    # what a 5.3.3 controller answers getSyncStateSet with: bean fields sorted, nulls left out
    body = (b'{"replicasInfoTable":{"broker-a":{"inSyncReplicas":[{"alive":true,'
            b'"brokerAddress":"127.0.0.1:30911","brokerId":1,"brokerName":"broker-a"}],'
            b'"masterAddress":"127.0.0.1:30911","masterBrokerId":1,"masterEpoch":2,'
            b'"notInSyncReplicas":[{"alive":false,"brokerAddress":"127.0.0.1:30921",'
            b'"brokerId":2,"brokerName":"broker-a"}],"syncStateSetEpoch":3}}}')
    info = BrokerReplicasInfo.decode(body)
    assert info == BrokerReplicasInfo({"broker-a": ReplicasInfo(
        1, "127.0.0.1:30911", 2, 3,
        (ReplicaIdentity("broker-a", 1, "127.0.0.1:30911", True),),
        (ReplicaIdentity("broker-a", 2, "127.0.0.1:30921", False),))})
    assert info.encode() == body
    no_master = BrokerReplicasInfo({"b": ReplicasInfo(None, None, 3, 4)})
    assert no_master.encode() == (b'{"replicasInfoTable":{"b":{"inSyncReplicas":[],'
                                  b'"masterEpoch":3,"notInSyncReplicas":[],'
                                  b'"syncStateSetEpoch":4}}}')
    assert BrokerReplicasInfo.decode(no_master.encode()) == no_master


@pytest.mark.parametrize("body", [
    b"[]", b'{"replicasInfoTable":[]}', b'{"replicasInfoTable":{"a":1}}',
    b'{"replicasInfoTable":{"a":{"inSyncReplicas":[{"brokerId":"x"}]}}}',
    b'{"replicasInfoTable":{"a":{"masterEpoch":99999999999}}}',
    b'{"replicasInfoTable":{"a":{"inSyncReplicas":[{"brokerId":1,"alive":"maybe"}]}}}',
])
def test_malformed_broker_replicas_info_is_a_decode_error(body: bytes) -> None:
    with pytest.raises(ControllerDecodeError):
        BrokerReplicasInfo.decode(body)


def test_apply_broker_id_answer_header_names_the_set() -> None:
    assert SPECS[ApplyBrokerIdResponseHeader].encode(ApplyBrokerIdResponseHeader("c1", "b")) == \
        {"clusterName": "c1", "brokerName": "b"}
