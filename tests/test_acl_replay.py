"""Issue 35, defect 2: a signed request replayed, and replayed as another request.

RocketMQ 4.9's signature covers the extFields' values and the body, not the request code,
the keys or a time (``trio_ha.wire.acl``), so a captured read verifies again as a delete.
``trio_ha.acl.replay`` has the defences: a seal (ours) bound to the code, mqadmin's shape
for an unsealed destructive verb, and strict mode (``aclRequireFreshness``)."""

from __future__ import annotations

import textwrap

import attrs
import pytest

from trio_ha.acl import PlainAcl, ReplayGuard
from trio_ha.chaos.hostile import replay_signatures, replayed_as
from trio_ha.client import (
    Credentials,
    Message,
    open_admin,
    open_client_instance,
    open_producer,
)
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.wire.acl import ACCESS_KEY, SIGNATURE, request_signature, sign
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

ADMIN = Credentials("rocketmq2", "12345678")
APP = Credentials("RocketMQ", "12345678")

ACL_YAML = textwrap.dedent("""\
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        admin: false
        defaultTopicPerm: PUB|SUB
        defaultGroupPerm: PUB|SUB
      - accessKey: rocketmq2
        secretKey: 12345678
        admin: true
    """)


def legacy_sign(request: RemotingCommand, credentials: Credentials) -> RemotingCommand:
    """Signed as RocketMQ's AclClientRPCHook signs (mqadmin, the Java client): no seal."""
    fields = {**request.ext_fields, ACCESS_KEY: credentials.access_key}
    fields[SIGNATURE] = request_signature(fields, request.body, credentials.secret_key)
    return attrs.evolve(request, ext_fields=fields)


def topic_request(code: int, topic: str) -> RemotingCommand:
    return RemotingCommand.request(code, {"topic": topic})


def create_topic(topic: str) -> RemotingCommand:
    # the fields mqadmin's updateTopic sends (CreateTopicRequestHeader)
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
        "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})


async def topic_exists(client, topic: str) -> bool:
    reply = await client.invoke(sign(topic_request(RequestCode.GET_TOPIC_CONFIG, topic), ADMIN),
                                5)
    assert reply.code in (ResponseCode.SUCCESS, ResponseCode.TOPIC_NOT_EXIST), reply.remark
    return reply.code == ResponseCode.SUCCESS


def acl_cluster(tmp_path, **properties: str) -> ClusterConfig:
    acl_path = tmp_path / "plain_acl.yml"
    acl_path.write_text(ACL_YAML)
    return ClusterConfig(data_dir=str(tmp_path / "data"), slaves=0, master_role="ASYNC_MASTER",
                         properties={"aclEnable": "true", "plainAclFile": str(acl_path),
                                     **properties})


async def test_a_captured_read_or_create_replayed_as_delete_topic_deletes_nothing_as_rocketmq_does_not(
        tmp_path):
    """An admin's signed GET_TOPIC_CONFIG (our client's), and mqadmin's signed create-topic,
    captured and sent again as DELETE_TOPIC_IN_BROKER in every way that keeps the signed
    bytes (the code swapped; a field's value spliced into the next, into SecurityToken or
    into the body): refused, the topic stays. RocketMQ 4.9 deletes it. A real delete, ours
    or mqadmin's (unsealed, its own fields only), still deletes."""
    async with open_cluster(acl_cluster(tmp_path)) as cluster, \
            open_remoting_client(cluster.master.addr) as client:
        for topic in ("Victim", "Mqadmin", "Other"):
            reply = await client.invoke(legacy_sign(create_topic(topic), ADMIN), 5)
            assert reply.code == ResponseCode.SUCCESS, reply.remark  # mqadmin's create works
        captured = {
            "Victim": sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "Victim"), ADMIN),
            "Mqadmin": legacy_sign(create_topic("Mqadmin"), ADMIN),
        }
        for topic, capture in captured.items():
            outcome = await replay_signatures(cluster.master.addr, capture,
                                              RequestCode.DELETE_TOPIC_IN_BROKER)
            assert await topic_exists(client, topic), outcome.answers
            assert outcome.frames_sent == len(replayed_as(capture, 0)) >= 2
            assert not [way for way in outcome.answers if way.endswith(":SUCCESS")] or \
                all("into topic" in way for way in outcome.answers
                    if way.endswith(":SUCCESS")), outcome.answers
        # what the splices into the topic's value deleted: a topic named by the spliced bytes
        # (no such topic), never the one read
        reply = await client.invoke(
            sign(topic_request(RequestCode.DELETE_TOPIC_IN_BROKER, "Victim"), ADMIN), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        assert not await topic_exists(client, "Victim")
        reply = await client.invoke(
            legacy_sign(topic_request(RequestCode.DELETE_TOPIC_IN_BROKER, "Mqadmin"), ADMIN), 5)
        assert reply.code == ResponseCode.SUCCESS, reply.remark
        assert not await topic_exists(client, "Mqadmin")
        assert await topic_exists(client, "Other")


def test_a_seal_binds_the_code_and_an_unsealed_destructive_verb_has_mqadmins_shape():
    acl = PlainAcl.parse(ACL_YAML)
    read = sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "T"), ADMIN)
    assert acl.check(read, "h") is None
    swapped = attrs.evolve(read, code=RequestCode.DELETE_TOPIC_IN_BROKER)
    assert "sealed for request code 351" in (acl.check(swapped, "h") or "")
    tampered = attrs.evolve(read, ext_fields={**read.ext_fields, "AclSeal": "1:351:1:n:x"})
    assert "signature does not match" in (acl.check(tampered, "h") or "")
    # unsealed (mqadmin): its own header's fields, of their kinds, and no body, only
    delete = legacy_sign(topic_request(RequestCode.DELETE_TOPIC_IN_BROKER, "T"), ADMIN)
    assert acl.check(delete, "h") is None
    for extra in ({"b": "x"}, {"SecurityToken": "x"}):
        bad = legacy_sign(RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER,
                                                  {"topic": "T", **extra}), ADMIN)
        assert "only its own header's fields" in (acl.check(bad, "h") or "")
    bad_kind = legacy_sign(attrs.evolve(create_topic("T"), ext_fields={
        **create_topic("T").ext_fields, "perm": "6x"}), ADMIN)
    assert "wrong kind of value" in (acl.check(bad_kind, "h") or "")
    with_body = legacy_sign(attrs.evolve(delete, body=b"x",
                                         ext_fields={"topic": "T"}), ADMIN)
    assert "carries no body" in (acl.check(with_body, "h") or "")
    # a read is not a destructive verb: unsealed, any shape (RocketMQ's clients)
    assert acl.check(legacy_sign(RemotingCommand.request(
        RequestCode.GET_TOPIC_CONFIG, {"topic": "T", "extra": "x"}), ADMIN), "h") is None


def test_strict_mode_refuses_a_nonce_twice_a_stale_seal_a_swapped_code_and_no_seal():
    acl = PlainAcl.parse(ACL_YAML)
    guard = ReplayGuard.of(window=300, capacity=1000)
    read = sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "T"), ADMIN)
    assert acl.check(read, "h", guard=guard) is None
    assert "nonce was seen already" in (acl.check(read, "h", guard=guard) or "")
    swapped = attrs.evolve(sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "T"), ADMIN),
                           code=RequestCode.DELETE_TOPIC_IN_BROKER)
    assert "sealed for request code" in (acl.check(swapped, "h", guard=guard) or "")
    stale = sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "T"), ADMIN)
    seal = stale.ext_fields["AclSeal"].split(":")
    sealed_at = int(seal[2]) / 1000
    assert "outside aclFreshnessWindowSeconds" in (
        guard.admit("rocketmq2", _seal_of(stale), now=sealed_at + 301) or "")
    assert "outside aclFreshnessWindowSeconds" in (
        guard.admit("rocketmq2", _seal_of(stale), now=sealed_at - 301) or "")
    unsealed = legacy_sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "T"), ADMIN)
    assert "wants sealed requests" in (acl.check(unsealed, "h", guard=guard) or "")


def _seal_of(request: RemotingCommand):
    from trio_ha.wire.acl import Seal
    seal = Seal.parse(request.ext_fields["AclSeal"])
    assert seal is not None
    return seal


def test_strict_modes_nonce_cache_refuses_when_full_and_forgets_only_expired_nonces():
    from trio_ha.acl.replay import NonceCache
    cache = NonceCache(capacity=2)
    assert cache.add(("k", "a"), expires=10, now=0) is None
    assert cache.add(("k", "b"), expires=20, now=0) is None
    assert "aclNonceCacheSize" in (cache.add(("k", "c"), expires=30, now=5) or "")
    assert "seen already" in (cache.add(("k", "a"), expires=30, now=5) or "")
    assert cache.add(("k", "c"), expires=30, now=10) is None  # "a" expired at 10
    assert len(cache) == 2


async def test_strict_mode_serves_our_client_and_refuses_a_replay_and_rocketmqs_unsealed_requests(
        tmp_path):
    """aclRequireFreshness=true on a real broker: our client sends and reads as ever; the
    same signed request sent twice is refused the second time; an unsealed one (RocketMQ's
    clients) is refused."""
    config = acl_cluster(tmp_path, aclRequireFreshness="true", aclFreshnessWindowSeconds="60")
    async with open_cluster(config) as cluster:
        async with open_client_instance(cluster.namesrv_addr, credentials=ADMIN) as instance, \
                open_admin(instance) as admin:
            await admin.create_topic("Fresh", 2, cluster="DefaultCluster")
        async with open_client_instance(cluster.namesrv_addr, credentials=APP) as instance, \
                open_producer(instance, "pg") as producer:
            sent = await producer.send(Message("Fresh", b"fresh"))
            assert sent.send_status.name == "SEND_OK"
        async with open_remoting_client(cluster.master.addr) as client:
            read = sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "TBW102"), ADMIN)
            assert (await client.invoke(read, 5)).code == ResponseCode.SUCCESS
            again = await client.invoke(read, 5)
            assert again.code == ResponseCode.NO_PERMISSION
            assert "nonce was seen already" in (again.remark or "")
            unsealed = await client.invoke(
                legacy_sign(topic_request(RequestCode.GET_TOPIC_CONFIG, "TBW102"), ADMIN), 5)
            assert unsealed.code == ResponseCode.NO_PERMISSION
            assert "aclRequireFreshness" in (unsealed.remark or "")


@pytest.mark.parametrize("key", ["aclFreshnessWindowSeconds", "aclNonceCacheSize"])
def test_strict_mode_keys_are_range_checked(key):
    from trio_ha.broker.config import BrokerConfig
    from trio_ha.config import ConfigError
    with pytest.raises((ConfigError, ValueError), match="is outside"):
        BrokerConfig.from_properties({key: "0"})
