"""What the broker does with input it must refuse (issue 9, points 11-13): bad names and
numbers, system topics, and floods of groups, topics and offsets that do not exist.

Every request goes over a real socket to a real broker, as a hostile client would send it;
every flood is bounded in count. What the broker keeps is read back through the protocol
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_TOPIC_CONFIG).
"""

import json
import logging

import pytest
import trio
import trio.testing

from trio_ha.broker import BrokerConfig, admin, dispatch
from trio_ha.broker.clients import ClientManager
from trio_ha.broker.metadata import MetadataLimitError
from trio_ha.chaos import hostile
from trio_ha.chaos.hostile import BAD_TOPIC, LONG_TOPIC
from trio_ha.chaos.hostile import commit_request as commit
from trio_ha.chaos.hostile import create_topic_request as create_topic
from trio_ha.chaos.hostile import heartbeat_request as heartbeat
from trio_ha.chaos.hostile import pull_request as pull
from trio_ha.chaos.hostile import send_request as send
from trio_ha.client import Message, MQClientError, open_producer
from trio_ha.remoting import RemotingConnection, open_remoting_client
from trio_ha.testing import ClusterConfig, serve_cluster
from trio_ha.wire.heartbeat import HeartbeatData
from trio_ha.wire.metadata import (
    decode_consumer_offsets,
    decode_subscription_groups,
    decode_topics_json,
)
from trio_ha.wire.permission import Permission
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


async def start_cluster(nursery, tmp_path, *, slaves=0, **properties):
    config = ClusterConfig(data_dir=tmp_path / "cluster", slaves=slaves,
                           master_role="ASYNC_MASTER", properties=properties)
    return await nursery.start(serve_cluster, config)


async def get_all(client, code):
    reply = await client.invoke(RemotingCommand.request(code), 5)
    assert reply.code == ResponseCode.SUCCESS
    return reply.body


async def groups_of(client) -> set[str]:
    body = await get_all(client, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    return set(decode_subscription_groups(body).subscription_group_table)


async def offsets_of(client) -> dict[str, dict[int, int]]:
    body = await get_all(client, RequestCode.GET_ALL_CONSUMER_OFFSET)
    return {key: dict(queues) for key, queues in decode_consumer_offsets(body).offset_table.items()}


async def topics_of(client):
    body = await get_all(client, RequestCode.GET_ALL_TOPIC_CONFIG)
    return decode_topics_json(body).topic_config_table


def one_line(reply: RemotingCommand) -> str:
    """The reply's remark, asserted to be one short line."""
    assert reply.remark is not None
    assert "\n" not in reply.remark and len(reply.remark) <= 300, reply.remark
    return reply.remark


# ---- point 11 -----------------------------------------------------------------------------------


async def test_point_11_invalid_client_input_is_a_one_line_answer_without_a_traceback(
    nursery, tmp_path, caplog
):
    addresses = await start_cluster(nursery, tmp_path)
    caplog.set_level(logging.INFO, logger="trio_ha")
    async with open_remoting_client(addresses.master.broker_addr) as client:
        assert (await client.invoke(send("T"), 5)).code == ResponseCode.SUCCESS
        caplog.clear()
        # One request per handler path that takes a name or a number from the client.
        attack = await hostile.invalid_input(addresses.master.broker_addr)
        assert sum(attack.answers.values()) == len(hostile.invalid_requests())
        assert "SUCCESS" not in attack.answers
        assert attack.note == ""  # no request that was not refused with one short line
        # The flood, bounded: 500 pulls naming the 250-character group.
        for _ in range(500):
            reply = await client.invoke(pull(group=hostile.BAD_GROUP), 5)
            assert reply.code == ResponseCode.SYSTEM_ERROR
            assert "group" in one_line(reply)
        # The broker still answers a well-formed pull.
        assert (await client.invoke(pull(), 5)).code == ResponseCode.SUCCESS
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert not tracebacks, tracebacks[0].getMessage()
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) <= 3, [r.getMessage() for r in loud]


async def test_point_11_names_follow_rocketmqs_remarks(nursery, tmp_path):
    addresses = await start_cluster(nursery, tmp_path)
    async with open_remoting_client(addresses.master.broker_addr) as client:
        for topic, remark in [
            ("", "The specified topic is blank."),
            (BAD_TOPIC, "The specified topic contains illegal characters, allowing only "
                        "^[%|a-zA-Z0-9_-]+$"),
            (LONG_TOPIC, "The specified topic is longer than topic max length."),
            ("T\n", "The specified topic contains illegal characters, allowing only "
                    "^[%|a-zA-Z0-9_-]+$"),
        ]:
            for request in (send(topic), create_topic(topic)):
                reply = await client.invoke(request, 5)
                assert (reply.code, reply.remark) == (ResponseCode.SYSTEM_ERROR, remark)
        assert "T\n" not in await topics_of(client)


async def test_point_11_a_refusal_no_processor_caught_is_still_one_line(monkeypatch, caplog):
    def refuses(broker, request, connection):
        raise MetadataLimitError("first line\nsecond line " + "x" * 1000)

    monkeypatch.setitem(admin.HANDLERS, RequestCode.GET_MAX_OFFSET, refuses)
    request = RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0})
    caplog.set_level(logging.INFO, logger="trio_ha")
    reply = await dispatch.handle(None, request, connection(1))  # type: ignore[arg-type]
    assert isinstance(reply, RemotingCommand)  # only a pull's answer is a MappedReply
    assert reply.code == ResponseCode.SYSTEM_ERROR
    assert one_line(reply).startswith("first line second line x")
    assert not caplog.records


# ---- point 12 -----------------------------------------------------------------------------------

SYSTEM_TOPICS = ["TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "SELF_TEST_TOPIC",
                 "OFFSET_MOVED_EVENT", "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRACE_TOPIC",
                 "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC", "rmq_sys_anything",
                 # the topics a broker makes for its cluster and itself
                 "DefaultCluster", "broker-a", "DefaultCluster_REPLY_TOPIC"]
NOT_ALLOWED_SEND = ["SCHEDULE_TOPIC_XXXX", "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT",
                    "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                    "TRANS_CHECK_MAX_TIME_TOPIC"]


async def test_point_12_system_topics_cannot_be_created_or_written_by_clients(nursery, tmp_path):
    addresses = await start_cluster(nursery, tmp_path, slaves=1)
    async with open_remoting_client(addresses.master.broker_addr) as client:
        before = await topics_of(client)
        # the broker itself made them
        assert {"TBW102", "SCHEDULE_TOPIC_XXXX", "broker-a"} <= set(before)
        for topic in SYSTEM_TOPICS:
            reply = await client.invoke(create_topic(topic, 1, Permission.READ), 5)
            assert reply.code == ResponseCode.SYSTEM_ERROR, topic
            assert reply.remark == f"The topic[{topic}] is conflict with system topic."
        assert await topics_of(client) == before  # TBW102 keeps its queues and INHERIT
        for topic in NOT_ALLOWED_SEND:
            for code in (RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_MESSAGE,
                         RequestCode.SEND_BATCH_MESSAGE):
                reply = await client.invoke(send(topic, code=code), 5)
                assert reply.code == ResponseCode.NO_PERMISSION, topic
                assert reply.remark == f"Sending message to topic[{topic}] is forbidden."
            max_offset = await client.invoke(RemotingCommand.request(
                RequestCode.GET_MAX_OFFSET, {"topic": topic, "queueId": 0}), 5)
            assert max_offset.ext_fields["offset"] == "0"
        # a plain topic is still created and written
        assert (await client.invoke(create_topic("Plain"), 5)).code == ResponseCode.SUCCESS
        assert (await client.invoke(send("Plain"), 5)).code == ResponseCode.SUCCESS
    async with open_remoting_client(addresses.slave.broker_addr) as client:
        reply = await client.invoke(create_topic("OnSlave"), 5)
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert reply.remark is not None and "slave" in reply.remark
        assert "OnSlave" not in await topics_of(client)


async def test_point_12_the_client_refuses_them_before_sending(nursery, tmp_path):
    addresses = await start_cluster(nursery, tmp_path)
    async with open_producer(addresses.namesrv_addr, "pg") as producer:
        for topic in NOT_ALLOWED_SEND:
            with pytest.raises(MQClientError, match=r"Sending message to topic\[.*\] is forbidden"):
                await producer.send(Message(topic, b"x"))
        with pytest.raises(MQClientError, match="illegal characters"):
            await producer.send(Message("T\n", b"x"))


# ---- point 13 -----------------------------------------------------------------------------------


async def test_point_13_a_flood_of_unknown_groups_and_topics_stays_within_the_caps(
    nursery, tmp_path
):
    addresses = await start_cluster(
        nursery, tmp_path, maxSubscriptionGroupNums=20, maxConsumerOffsetNums=40
    )
    async with open_remoting_client(addresses.master.broker_addr) as client:
        assert (await client.invoke(send("T"), 5)).code == ResponseCode.SUCCESS
        good = await client.invoke(heartbeat("good", consumers=["good"]), 5)
        assert good.code == ResponseCode.SUCCESS
        # 200 heartbeats, each naming 3 new consumer groups and 3 new producer groups; 300
        # pulls for new groups, and commits for new groups and topics that do not exist
        flood = await hostile.metadata_flood(addresses.master.broker_addr, heartbeats=200,
                                             pulls=300, prefix="flood")
        assert flood.answers["HEART_BEAT:SUCCESS"] == 200
        commits = {key: n for key, n in flood.answers.items()
                   if key.startswith("UPDATE_CONSUMER_OFFSET:")}
        assert sum(commits.values()) == 300
        assert set(commits) <= {"UPDATE_CONSUMER_OFFSET:TOPIC_NOT_EXIST",
                                "UPDATE_CONSUMER_OFFSET:SUBSCRIPTION_GROUP_NOT_EXIST"}
        assert flood.note == ""  # every refusal one short line
        groups = await groups_of(client)
        assert len(groups) <= 20 and "good" in groups
        offsets = await offsets_of(client)
        assert not any(key.startswith("floodNoSuchTopic") for key in offsets)
        # commits for groups that exist, on every queue of the topic: bounded too
        existing = sorted(groups)
        for group in existing:
            for queue in range(4):
                reply = await client.invoke(commit(group, "T", queue, 7), 5)
                assert reply.code in (ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR)
        offsets = await offsets_of(client)
        assert sum(len(queues) for queues in offsets.values()) <= 40
        # what was stored before the cap keeps being updated
        key = next(iter(offsets))
        topic, group = key.split("@")
        queue = next(iter(offsets[key]))
        assert (await client.invoke(commit(group, topic, queue, 9), 5)).code == ResponseCode.SUCCESS
        assert (await offsets_of(client))[key][queue] == 9


async def test_point_13_groups_are_created_on_demand_only_when_auto_creation_is_on(
    nursery, tmp_path
):
    addresses = await start_cluster(nursery, tmp_path, autoCreateSubscriptionGroup="false")
    async with open_remoting_client(addresses.master.broker_addr) as client:
        assert (await client.invoke(send("T"), 5)).code == ResponseCode.SUCCESS
        before = await groups_of(client)
        for i in range(50):
            reply = await client.invoke(heartbeat(f"c{i}", consumers=[f"g{i}"]), 5)
            assert reply.code == ResponseCode.SUCCESS
            reply = await client.invoke(pull(group=f"g{i}"), 5)
            assert reply.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            reply = await client.invoke(commit(f"g{i}", "T"), 5)
            assert reply.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST
            assert reply.remark == f"Group g{i} not exist!"
        assert await groups_of(client) == before
        assert await offsets_of(client) == {}
        # a group made by an administrator works
        created = await client.invoke(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=json.dumps({"groupName": "admin_made"}).encode()), 5)
        assert created.code == ResponseCode.SUCCESS
        assert (await client.invoke(pull(group="admin_made"), 5)).code == ResponseCode.SUCCESS
        assert (await client.invoke(commit("admin_made", "T"), 5)).code == ResponseCode.SUCCESS
        reply = await client.invoke(commit("admin_made", "NoSuchTopic"), 5)
        assert (reply.code, reply.remark) == (ResponseCode.TOPIC_NOT_EXIST,
                                              "Topic NoSuchTopic not exist!")


def connection(port: int) -> RemotingConnection:
    """A connection the client table can key on (it never sends)."""
    stream, _ = trio.testing.memory_stream_pair()
    return RemotingConnection(stream=stream, peer=f"127.0.0.1:{port}")


def test_point_13_client_table_is_bounded_and_forgets_closed_connections():
    clients = ClientManager(max_producer_groups=5)
    connections = [connection(port) for port in range(20)]
    for i, conn in enumerate(connections):
        data = HeartbeatData.decode(heartbeat(
            f"c{i}", producers=[f"p{i}_{j}" for j in range(3)], consumers=["cg"],
            topic=f"topic{i}").body)
        clients.heartbeat(data, conn, now=1.0)
    assert len(clients.producers) <= 5
    # a consumer's subscriptions are the latest heartbeat's, not every topic ever named
    assert set(clients.consumers["cg"].subscriptions) == {"topic19"}
    for conn in connections:
        clients.connection_closed(conn)
    assert clients.producers == {} and clients.consumers == {}


@pytest.mark.parametrize("expire", [True, False])
def test_point_13_expired_and_unregistered_clients_leave_no_empty_groups(expire):
    clients = ClientManager()
    data = HeartbeatData.decode(heartbeat("c", producers=["p"], consumers=["cg"]).body)
    clients.heartbeat(data, connection(1), now=1.0)
    if expire:
        clients.expire(now=1000.0)
    else:
        clients.unregister("c", producer_group="p", consumer_group="cg")
    assert clients.producers == {} and clients.consumers == {}


def test_point_13_the_caps_are_config_keys():
    config = BrokerConfig.from_properties(
        "maxSubscriptionGroupNums=7\nmaxConsumerOffsetNums=9\nmaxProducerGroupNums=11\n")
    assert (config.max_subscription_group_nums, config.max_consumer_offset_nums,
            config.max_producer_group_nums) == (7, 9, 11)
