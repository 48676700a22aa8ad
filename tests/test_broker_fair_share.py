"""No one client locks the others out, and odd admin input gets a clean answer (issue 35,
defects 5 and 7, the broker's part): queue locks bounded per client, per group and in all;
consumer groups made by heartbeats bounded per client and below maxSubscriptionGroupNums;
a deeply nested subscription-group body, out-of-range UPDATE_BROKER_CONFIG values and
subscription-group fields refused in one line."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from trio_ha.broker.metadata import SYSTEM_CONSUMER_GROUPS, SubscriptionGroupManager
from trio_ha.broker.queue_locks import QueueLockManager
from trio_ha.chaos import hostile
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, serve_cluster
from trio_ha.wire.metadata import SubscriptionGroupConfig, decode_subscription_groups
from trio_ha.wire.queue_locks import QueueId
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


async def start_broker(nursery, tmp_path, **properties) -> str:
    addresses = await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "c", slaves=0, master_role="ASYNC_MASTER", properties=properties))
    return addresses.master.broker_addr


def warnings_from(caplog, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


# ---- queue locks ---------------------------------------------------------------------------------


async def test_seventy_lock_batch_requests_leave_an_orderly_consumer_its_locks_as_rocketmq_does_not(
        nursery, tmp_path, caplog):
    """70 LOCK_BATCH_MQ of 1024 made-up queues each (more than the 65,536 locks a broker
    keeps), a new group and client id each time, over one connection: the hoarder gets its
    client's share, an orderly consumer on another connection still locks its queues, and
    the refusals are one line per request at most."""
    broker = await start_broker(nursery, tmp_path)
    caplog.set_level(logging.INFO, logger="trio_ha.broker.queue_locks")
    outcome = await hostile.lock_hoarding(broker, requests=70, queues=1024)
    assert outcome.answers["LOCK_BATCH_MQ:SUCCESS"] == 70
    assert outcome.answers["hoarded"] == 4096  # maxQueueLockNumsPerClient
    assert outcome.answers["honest locked"] == 4
    assert len(warnings_from(caplog, "trio_ha.broker.queue_locks")) <= 69


async def test_queue_locks_are_bounded_per_client_per_group_and_in_all(autojump_clock):
    queues = [QueueId("T", "broker-a", i) for i in range(10)]
    locks = QueueLockManager(max_locks=8, max_locks_per_group=5, max_locks_per_client=3)
    # Per client (connection): whatever client ids and groups it names.
    assert len(locks.lock("g1", "a", queues[:2], owner="conn1")) == 2
    assert len(locks.lock("g2", "b", queues, owner="conn1")) == 1
    assert locks.lock("g3", "c", queues, owner="conn1") == set()
    # Renewing what it holds through the same connection is never refused; through
    # another, within that one's bound (a hoarder cannot gather locks connection by
    # connection, then renew them all through one).
    assert locks.lock("g1", "a", queues[:2], owner="conn1") == set(queues[:2])
    assert locks.lock("g1", "a", queues[:2], owner="conn9") == set(queues[:2])  # moved
    assert locks.lock("g2", "b", queues[:1], owner="conn9") == {queues[0]}  # 3 on conn9
    assert locks.lock("g3", "x", queues[5:6], owner="conn5") == {queues[5]}
    assert locks.lock("g3", "x", queues[5:6], owner="conn9") == set()  # conn9 is full
    assert locks.holder("g3", queues[5]) == "x"
    locks.unlock("g3", "x", queues)
    locks.lock("g1", "a", queues[:2], owner="conn1")  # back where they were
    locks.lock("g2", "b", queues[:1], owner="conn1")
    # Per group, across connections.
    assert len(locks.lock("g4", "d", queues, owner="conn2")) == 3
    assert len(locks.lock("g4", "e", queues, owner="conn3")) == 2  # 5 in g4
    # In all: 3 + 5 held; the ninth is refused whoever asks.
    assert locks.lock("g5", "f", queues[:1], owner="conn4") == set()
    locks.unlock("g4", "d", queues)
    assert locks.lock("g5", "f", queues[:1], owner="conn4") == set(queues[:1])
    # A lock that expired is swept when a bound is reached.
    await trio.sleep(61)
    assert len(locks.lock("g6", "g", queues, owner="conn1")) == 3


# ---- consumer groups made by heartbeats ------------------------------------------------------


async def test_heartbeats_declaring_ten_thousand_groups_leave_room_for_an_admin_group(
        nursery, tmp_path, caplog):
    """Ten heartbeats of 1,000 new consumer groups each, 10,000 in all, against a broker
    that keeps 2,000: the heartbeats succeed, the flooder's connection creates its 256
    groups, and a group an operator creates afterwards is created and consumed from; the
    refusals are a line or two, not 9,744."""
    broker = await start_broker(nursery, tmp_path, maxSubscriptionGroupNums=2000)
    caplog.set_level(logging.INFO, logger="trio_ha.broker.metadata.subscription_groups")
    async with open_remoting_client(broker) as client:
        reply = await client.invoke(hostile.send_request("T"), 5)
        assert reply.code == ResponseCode.SUCCESS
        member = await client.invoke(hostile.heartbeat_request("old", consumers=["existing"]), 5)
        assert member.code == ResponseCode.SUCCESS
    outcome = await hostile.group_flood(broker, heartbeats=10, groups=1000)
    assert outcome.answers == {
        "HEART_BEAT:SUCCESS": 10, "admin UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:SUCCESS": 1,
        "admin HEART_BEAT:SUCCESS": 1, "admin PULL_MESSAGE:SUCCESS": 1,
    }
    async with open_remoting_client(broker) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), 5)
        groups = decode_subscription_groups(reply.body).subscription_group_table
        flooded = [g for g in groups if g.startswith("gflood") and g != "gflood_admin"]
        assert len(flooded) == 256  # maxAutoCreateSubscriptionGroupNumsPerClient
        assert "existing" in groups and "gflood_admin" in groups
        # A group that exists keeps working for a client whose heartbeat also names new ones.
        reply = await client.invoke(hostile.heartbeat_request(
            "old", consumers=["existing", *[f"more{i}" for i in range(300)]]), 5)
        assert reply.code == ResponseCode.SUCCESS
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "existing"}), 5)
        assert reply.code == ResponseCode.SUCCESS
    refusals = [r for r in warnings_from(caplog, "trio_ha.broker.metadata.subscription_groups")
                if "not created" in r.getMessage()]
    assert 1 <= len(refusals) <= 2


def test_groups_made_on_demand_stop_below_the_cap_and_per_creator(tmp_path):
    system = len(SYSTEM_CONSUMER_GROUPS)
    groups = SubscriptionGroupManager.load(tmp_path, max_groups=system + 20,
                                           max_auto_created_per_creator=5)

    class Connection:  # a creator is any object the caller names (the broker: a connection)
        pass

    one, other = Connection(), Connection()
    made = [g for g in (f"a{i}" for i in range(10)) if groups.find_or_create(g, creator=one)]
    assert len(made) == 5
    assert "maxAutoCreateSubscriptionGroupNumsPerClient=5" in groups.why_not_created(one)
    assert groups.find_or_create("a0", creator=one) is not None  # it exists: found
    # In all, on demand stops at nine tenths of the cap (here 25 of 27); an operator's
    # request may go on to the cap.
    for i in range(20):
        groups.find_or_create(f"b{i}")
    assert len(groups.wrapper().subscription_group_table) == system + 18
    assert groups.find_or_create("late", creator=other) is None
    assert "left to UPDATE_AND_CREATE_SUBSCRIPTIONGROUP" in groups.why_not_created(other)
    groups.update(SubscriptionGroupConfig("by-admin"))
    assert groups.find_or_create("by-admin") is not None



async def test_pulls_create_groups_within_the_same_bound_per_client_as_heartbeats(
        nursery, tmp_path):
    """A client whose heartbeat may create no more groups gets none by pulling either: pulls
    of new groups over one connection stop at maxAutoCreateSubscriptionGroupNumsPerClient,
    with the reason in the remark, while another connection still gets its group."""
    broker = await start_broker(nursery, tmp_path, maxAutoCreateSubscriptionGroupNumsPerClient=3)
    async with open_remoting_client(broker) as client:
        reply = await client.invoke(hostile.send_request("T"), 5)
        assert reply.code == ResponseCode.SUCCESS
        codes = [(await client.invoke(hostile.pull_request("T", group=f"pulled{i}"), 5)).code
                 for i in range(5)]
        assert codes.count(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST) == 2, codes
        refused = await client.invoke(hostile.pull_request("T", group="pulled9"), 5)
        assert "maxAutoCreateSubscriptionGroupNumsPerClient=3" in (refused.remark or "")
    async with open_remoting_client(broker) as other:
        reply = await other.invoke(hostile.pull_request("T", group="elsewhere"), 5)
        assert reply.code != ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, reply.remark

# ---- unpolished answers ----------------------------------------------------------------------


async def test_a_deeply_nested_subscription_group_body_is_not_valid_json_without_a_traceback(
        nursery, tmp_path, caplog):
    broker = await start_broker(nursery, tmp_path)
    caplog.set_level(logging.DEBUG)
    deep = b'{"groupName":"g","x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    async with open_remoting_client(broker) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=deep), 5)
        remark = reply.remark or ""
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert "not valid JSON" in remark and "\n" not in remark
        assert len(remark) < 300
        # The connection and the broker are fine.
        reply = await client.invoke(hostile.subscription_group_request("fine"), 5)
        assert reply.code == ResponseCode.SUCCESS
    assert not [r for r in caplog.records if r.exc_info]
    assert not any("RecursionError" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("setting", [
    "shortPollingTimeMills=99999999999999", "maxTransferBytesOnMessageInMemory=1",
    "maxTransferCountOnMessageInMemory=2147483648", "registerBrokerTimeoutMills=99999999999",
])
async def test_update_broker_config_range_checks_what_it_changes(nursery, tmp_path, setting):
    broker = await start_broker(nursery, tmp_path)
    key = setting.partition("=")[0]
    async with open_remoting_client(broker) as client:
        async def current():
            reply = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CONFIG), 5)
            return dict(line.split("=", 1) for line in reply.body.decode().splitlines())

        before = (await current())[key]
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.UPDATE_BROKER_CONFIG, body=setting.encode()), 5)
        remark = reply.remark or ""
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert f"{key}=" in remark and "outside" in remark
        assert (await current())[key] == before


@pytest.mark.parametrize(("field", "value"), [
    ("retryMaxTimes", -1), ("brokerId", -1), ("whichBrokerWhenConsumeSlowly", -5),
    ("retryQueueNums", -1),
])
async def test_a_subscription_group_refuses_negative_fields(nursery, tmp_path, field, value):
    broker = await start_broker(nursery, tmp_path)
    async with open_remoting_client(broker) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            body=json.dumps({"groupName": "neg", field: value}).encode()), 5)
        remark = reply.remark or ""
        assert reply.code == ResponseCode.SYSTEM_ERROR
        assert remark.startswith(f"group neg: {field} must be in 0..")
        assert remark.endswith(f", got {value}")
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG), 5)
        assert "neg" not in decode_subscription_groups(reply.body).subscription_group_table
