"""Issue 35 against the real RocketMQ 4.9.7 broker with ``aclEnable=true``: our client's
requests, which carry our seal (``AclSeal``) beside RocketMQ's signature, are verified there
unchanged; and a captured read sent again as DELETE_TOPIC_IN_BROKER deletes the topic there
(the hole ``test_acl_replay.py`` shows our broker closing); and real mqadmin, which cannot
seal, still creates and deletes on our ACL broker."""

from __future__ import annotations

import os
import textwrap

import attrs
import pytest
import trio

from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.testing.rocketmq import BROKER_JVM
from trio_ha.wire.acl import Credentials, sign
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

pytestmark = pytest.mark.interop

ADMIN = Credentials("rocketmq2", "12345678")

ACL_YAML = textwrap.dedent("""\
    accounts:
      - accessKey: rocketmq2
        secretKey: 12345678
        admin: true
    """)


def create_topic(topic: str) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
        "topic": topic, "defaultTopic": "TBW102", "readQueueNums": "4", "writeQueueNums": "4",
        "perm": "6", "topicFilterType": "SINGLE_TAG", "topicSysFlag": "0", "order": "false"})


def topic_request(code: int, topic: str) -> RemotingCommand:
    return RemotingCommand.request(code, {"topic": topic})


def test_rocketmq_4_9_verifies_our_sealed_requests_and_deletes_on_a_replayed_read(rocketmq,
                                                                                   tmp_path):
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL_YAML)
    port = free_broker_port()
    # RocketMQ 4.9 reads $ROCKETMQ_HOME + rocketmq.acl.plain.file: a path relative to the
    # shared home, so that nothing is written there
    relative = os.path.relpath(acl, rocketmq.home)
    broker = rocketmq.start_broker(tmp_path / "broker", {
        "brokerClusterName": "AclCluster", "brokerName": "acl-a", "brokerId": 0,
        "brokerRole": "ASYNC_MASTER", "namesrvAddr": "127.0.0.1:1", "listenPort": port,
        "mappedFileSizeCommitLog": 1 << 20, "maxHashSlotNum": 1000, "maxIndexNum": 4000,
        "aclEnable": "true",
    }, jvm=[*BROKER_JVM, f"-Drocketmq.acl.plain.file={relative}"])

    async def main() -> None:
        async with open_remoting_client(f"127.0.0.1:{port}") as client:
            created = await client.invoke(sign(create_topic("Sealed"), ADMIN), 10)
            assert created.code == ResponseCode.SUCCESS, created.remark
            assert "AclSeal" in sign(create_topic("x"), ADMIN).ext_fields
            # the ACL is on: a wrong secret is refused (4.9 answers SYSTEM_ERROR)
            forged = await client.invoke(
                sign(create_topic("Forged"), Credentials("rocketmq2", "not-the-secret")), 10)
            assert forged.code != ResponseCode.SUCCESS
            # a captured read of the topic, sent again as its delete
            read = sign(topic_request(RequestCode.GET_TOPIC_STATS_INFO, "Sealed"), ADMIN)
            assert (await client.invoke(read, 10)).code == ResponseCode.SUCCESS
            replayed = await client.invoke(
                attrs.evolve(read, code=RequestCode.DELETE_TOPIC_IN_BROKER), 10)
            assert replayed.code == ResponseCode.SUCCESS, replayed.remark
            after = await client.invoke(
                sign(topic_request(RequestCode.GET_TOPIC_STATS_INFO, "Sealed"), ADMIN), 10)
            assert after.code == ResponseCode.TOPIC_NOT_EXIST, after.remark

    try:
        trio.run(main)
    finally:
        broker.stop()


def test_real_mqadmin_creates_and_deletes_topics_on_our_acl_broker_unsealed(rocketmq_clients,
                                                                            tmp_path):
    """mqadmin (4.9.8) cannot seal: its destructive verbs, in their own shape, still work on
    our broker in the default mode."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(ACL_YAML)
    config = ClusterConfig(data_dir=str(tmp_path / "ours"), slaves=0,
                           master_role="ASYNC_MASTER",
                           properties={"aclEnable": "true", "plainAclFile": str(acl)})
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "tools.yml").write_text("accessKey: rocketmq2\nsecretKey: 12345678\n")
    with ProcessCluster.start(config) as running:
        namesrv, master = running.namesrv_addr, running.master.addr
        out = rocketmq_clients.mqadmin(tmp_path / "create", "updateTopic", "-n", namesrv,
                                       "-b", master, "-t", "MqadminTopic", home=home)
        assert f"create topic to {master} success" in out, out[-3000:]
        out = rocketmq_clients.mqadmin(tmp_path / "group", "updateSubGroup", "-n", namesrv,
                                       "-b", master, "-g", "MqadminGroup", home=home)
        assert "success" in out, out[-3000:]
        out = rocketmq_clients.mqadmin(tmp_path / "delete", "deleteTopic", "-n", namesrv,
                                       "-c", "DefaultCluster", "-t", "MqadminTopic", home=home)
        assert "delete topic [MqadminTopic] from cluster [DefaultCluster] success" in out, \
            out[-3000:]
