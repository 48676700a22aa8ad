"""The name server's admin requests (issue 13), as mqadmin sends them: KV config (kept in
kvConfigPath across restarts), deleting a topic's routes, wiping and adding back a broker's
write permission, the topics of a cluster, its own configuration; and the refusal of a second
live master for a broker name (our fix: RocketMQ lets it replace the first)."""

import json
from typing import Any

import pytest
import trio

from trio_ha import _backend
from trio_ha.config import ConfigError
from trio_ha.namesrv import (
    KVConfigFileError,
    MasterConflict,
    NamesrvConfig,
    RouteInfoManager,
    serve_namesrv,
)
from trio_ha.remoting import open_remoting_client
from trio_ha.wire.metadata import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from trio_ha.wire.permission import Permission
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import KVConfigTable, KVTable, RegisterBrokerBody, TopicList, TopicRouteData

RW = int(Permission.READ | Permission.WRITE)


def topics(*names, version=1, queues=4):
    return TopicConfigSerializeWrapper(
        {n: TopicConfig(n, queues, queues) for n in names}, DataVersion(version, 1000 + version)
    )


def register_request(name, addr, broker_id=0, *, cluster="DefaultCluster", body_topics=None,
                     ha="127.0.0.1:10912"):
    body = RegisterBrokerBody(body_topics or topics("TopicA")).encode()
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": name, "brokerAddr": addr, "clusterName": cluster, "haServerAddr": ha,
        "brokerId": broker_id, "compressed": False, "bodyCrc32": _backend.engine.crc32(body),
    }, body=body)


async def call(address: str, code: int, fields: dict[str, Any] | None = None,
               body: bytes = b"") -> RemotingCommand:
    async with open_remoting_client(address) as client:
        return await client.invoke(RemotingCommand.request(code, fields, body=body), 5)


async def start_namesrv(nursery, kv_path=None, **settings) -> str:
    _, port = await nursery.start(serve_namesrv, NamesrvConfig(
        listen_port=0, bind_address="127.0.0.1", kv_config_path=kv_path, **settings))
    return f"127.0.0.1:{port}"


@pytest.fixture
async def namesrv(nursery):
    return await start_namesrv(nursery)


async def route_of(namesrv: str, topic: str) -> TopicRouteData | None:
    reply = await call(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return TopicRouteData.decode(reply.body)


def perms(route: TopicRouteData | None) -> dict[str, int]:
    assert route is not None
    return {q.broker_name: q.perm for q in route.queue_datas}


async def topic_list(namesrv: str, cluster: str | None = None) -> list[str]:
    if cluster is None:
        reply = await call(namesrv, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)
    else:
        reply = await call(namesrv, RequestCode.GET_TOPICS_BY_CLUSTER, {"cluster": cluster})
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return sorted(TopicList.decode(reply.body).topic_list)


# ---- KV config ---------------------------------------------------------------------------------


async def test_kv_config_put_get_list_delete_and_it_survives_a_restart(tmp_path):
    path = tmp_path / "namesrv" / "kvConfig.json"  # the directory does not exist yet
    async with trio.open_nursery() as first:
        ns = await start_namesrv(first, str(path))
        for key, value in (("k1", "v1"), ("k2", "v2")):
            reply = await call(ns, RequestCode.PUT_KV_CONFIG,
                               {"namespace": "ns1", "key": key, "value": value})
            assert reply.code == ResponseCode.SUCCESS, reply.remark
        got = await call(ns, RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "k1"})
        assert got.code == ResponseCode.SUCCESS and got.ext_fields["value"] == "v1"
        missing = await call(ns, RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "nope"})
        assert missing.code == ResponseCode.QUERY_NOT_FOUND
        assert missing.remark == "No config item, Namespace: ns1 Key: nope"
        listed = await call(ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "ns1"})
        assert KVTable.decode(listed.body).table == {"k1": "v1", "k2": "v2"}
        no_ns = await call(ns, RequestCode.GET_KVLIST_BY_NAMESPACE, {"namespace": "other"})
        assert no_ns.code == ResponseCode.QUERY_NOT_FOUND
        assert no_ns.remark == "No config item, Namespace: other"
        deleted = await call(ns, RequestCode.DELETE_KV_CONFIG, {"namespace": "ns1", "key": "k2"})
        assert deleted.code == ResponseCode.SUCCESS
        # RocketMQ's file: {"configTable":{namespace:{key:value}}}
        assert json.loads(path.read_bytes()) == {"configTable": {"ns1": {"k1": "v1"}}}
        first.cancel_scope.cancel()
    async with trio.open_nursery() as second:
        ns = await start_namesrv(second, str(path))
        got = await call(ns, RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "k1"})
        assert got.code == ResponseCode.SUCCESS and got.ext_fields["value"] == "v1"
        gone = await call(ns, RequestCode.GET_KV_CONFIG, {"namespace": "ns1", "key": "k2"})
        assert gone.code == ResponseCode.QUERY_NOT_FOUND
        second.cancel_scope.cancel()


async def test_a_kv_config_written_by_rocketmq_is_read(tmp_path, nursery):
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable":{"ORDER_TOPIC_CONFIG":{"Orders":"broker-a:4"}}}')
    ns = await start_namesrv(nursery, str(path))
    got = await call(ns, RequestCode.GET_KV_CONFIG,
                     {"namespace": "ORDER_TOPIC_CONFIG", "key": "Orders"})
    assert got.ext_fields["value"] == "broker-a:4"


async def test_a_damaged_kv_config_file_stops_the_name_server_naming_it(tmp_path):
    path = tmp_path / "kvConfig.json"
    path.write_text('{"configTable":{"ns":')
    with pytest.raises(KVConfigFileError, match="kvConfigPath .*kvConfig.json") as caught:
        await serve_namesrv(NamesrvConfig(listen_port=0, bind_address="127.0.0.1",
                                          kv_config_path=str(path)))
    assert isinstance(caught.value, ConfigError)  # the CLI prints those as one line


async def test_order_topic_config_goes_to_registering_brokers_and_into_routes_when_enabled(
        namesrv):
    reply = await call(namesrv, RequestCode.PUT_KV_CONFIG, {
        "namespace": "ORDER_TOPIC_CONFIG", "key": "TopicA", "value": "broker-a:4"})
    assert reply.code == ResponseCode.SUCCESS
    async with open_remoting_client(namesrv) as broker:  # the broker stays while connected
        registered = await broker.invoke(register_request("broker-a", "10.0.0.1:10911"), 5)
        assert registered.code == ResponseCode.SUCCESS
        assert KVTable.decode(registered.body).table == {"TopicA": "broker-a:4"}
        route = await route_of(namesrv, "TopicA")
        assert route is not None and route.order_topic_conf is None  # orderMessageEnable=false
        update = await call(namesrv, RequestCode.UPDATE_NAMESRV_CONFIG,
                            body=b"orderMessageEnable=true\n")
        assert update.code == ResponseCode.SUCCESS, update.remark
        route = await route_of(namesrv, "TopicA")
        assert route is not None and route.order_topic_conf == "broker-a:4"


# ---- topics and write permission -------------------------------------------------------------


async def test_delete_topic_removes_it_from_routes_and_the_topic_list(namesrv):
    async with open_remoting_client(namesrv) as broker_a, open_remoting_client(namesrv) as broker_b:
        for client, name, addr, cluster in ((broker_a, "broker-a", "10.0.0.1:10911", "c1"),
                                            (broker_b, "broker-b", "10.0.0.2:10911", "c2")):
            reply = await client.invoke(register_request(
                name, addr, cluster=cluster, body_topics=topics("Gone", "Kept", "Shared")), 5)
            assert reply.code == ResponseCode.SUCCESS
        reply = await call(namesrv, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Gone"})
        assert reply.code == ResponseCode.SUCCESS
        assert await route_of(namesrv, "Gone") is None
        assert await topic_list(namesrv) == ["Kept", "Shared"]
        # with clusterName, only that cluster's broker names lose it
        reply = await call(namesrv, RequestCode.DELETE_TOPIC_IN_NAMESRV,
                           {"topic": "Shared", "clusterName": "c1"})
        assert reply.code == ResponseCode.SUCCESS
        assert perms(await route_of(namesrv, "Shared")) == {"broker-b": RW}
        assert await topic_list(namesrv) == ["Kept", "Shared"]
        # a topic no one has: SUCCESS, as RocketMQ
        reply = await call(namesrv, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": "Never"})
        assert reply.code == ResponseCode.SUCCESS


async def test_wipe_write_perm_takes_write_from_one_broker_name_and_counts_its_topics(namesrv):
    async with open_remoting_client(namesrv) as broker_a, open_remoting_client(namesrv) as broker_b:
        await broker_a.invoke(register_request(
            "broker-a", "10.0.0.1:10911", body_topics=topics("T1", "T2", "T3")), 5)
        await broker_b.invoke(register_request(
            "broker-b", "10.0.0.2:10911", body_topics=topics("T1")), 5)
        wiped = await call(namesrv, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                           {"brokerName": "broker-a"})
        assert wiped.code == ResponseCode.SUCCESS
        assert wiped.ext_fields["wipeTopicCount"] == "3"
        assert perms(await route_of(namesrv, "T1")) == {"broker-a": Permission.READ,
                                                        "broker-b": RW}
        assert perms(await route_of(namesrv, "T3")) == {"broker-a": Permission.READ}
        # the same DataVersion registered again keeps the wipe (RocketMQ's rule); a new one
        # gives the broker's own permissions back
        await broker_a.invoke(register_request(
            "broker-a", "10.0.0.1:10911", body_topics=topics("T1", "T2", "T3")), 5)
        assert perms(await route_of(namesrv, "T2")) == {"broker-a": Permission.READ}
        none = await call(namesrv, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
                          {"brokerName": "no-such-broker"})
        assert none.ext_fields["wipeTopicCount"] == "0"
        added = await call(namesrv, RequestCode.ADD_WRITE_PERM_OF_BROKER,
                           {"brokerName": "broker-a"})
        assert added.ext_fields["addTopicCount"] == "3"
        assert perms(await route_of(namesrv, "T1")) == {"broker-a": RW, "broker-b": RW}
        await call(namesrv, RequestCode.WIPE_WRITE_PERM_OF_BROKER, {"brokerName": "broker-a"})
        await broker_a.invoke(register_request(
            "broker-a", "10.0.0.1:10911", body_topics=topics("T1", "T2", "T3", version=2)), 5)
        assert perms(await route_of(namesrv, "T2")) == {"broker-a": RW}


async def test_topics_by_cluster(namesrv):
    async with open_remoting_client(namesrv) as broker_a, open_remoting_client(namesrv) as broker_b:
        await broker_a.invoke(register_request(
            "broker-a", "10.0.0.1:10911", cluster="c1", body_topics=topics("A", "Both")), 5)
        await broker_b.invoke(register_request(
            "broker-b", "10.0.0.2:10911", cluster="c2", body_topics=topics("B", "Both")), 5)
        assert await topic_list(namesrv, "c1") == ["A", "Both"]
        assert await topic_list(namesrv, "c2") == ["B", "Both"]
        assert await topic_list(namesrv, "nope") == []
        assert await topic_list(namesrv) == ["A", "B", "Both"]


# ---- its own configuration ---------------------------------------------------------------------


def properties(body: bytes) -> dict[str, str]:
    return dict(line.split("=", 1) for line in body.decode().splitlines() if line)


async def test_namesrv_config_get_and_update(tmp_path, nursery):
    ns = await start_namesrv(nursery, str(tmp_path / "kv.json"))
    got = properties((await call(ns, RequestCode.GET_NAMESRV_CONFIG)).body)
    assert got["kvConfigPath"] == str(tmp_path / "kv.json")
    assert got["listenPort"] == "0" and got["orderMessageEnable"] == "false"
    assert got["brokerChannelExpiredTime"] == "120000"
    reply = await call(ns, RequestCode.UPDATE_NAMESRV_CONFIG,
                       body=b"scanNotActiveBrokerInterval=2000\nbrokerChannelExpiredTime=60000\n")
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    got = properties((await call(ns, RequestCode.GET_NAMESRV_CONFIG)).body)
    assert got["scanNotActiveBrokerInterval"] == "2000"
    assert got["brokerChannelExpiredTime"] == "60000"
    black = await call(ns, RequestCode.UPDATE_NAMESRV_CONFIG, body=b"kvConfigPath=/tmp/x\n")
    assert black.code == ResponseCode.NO_PERMISSION
    assert black.remark == "Can not update config in black list."
    refused = await call(ns, RequestCode.UPDATE_NAMESRV_CONFIG,
                         body=b"orderMessageEnable=true\nlistenPort=1\nbogusKey=1\n")
    assert refused.code == ResponseCode.SYSTEM_ERROR
    assert "listenPort" in (refused.remark or "") and "bogusKey" in (refused.remark or "")
    bad = await call(ns, RequestCode.UPDATE_NAMESRV_CONFIG, body=b"brokerChannelExpiredTime=-5\n")
    assert bad.code == ResponseCode.SYSTEM_ERROR and "brokerChannelExpiredTime" in (bad.remark or "")
    got = properties((await call(ns, RequestCode.GET_NAMESRV_CONFIG)).body)
    assert got["orderMessageEnable"] == "false"  # all or nothing
    assert got["brokerChannelExpiredTime"] == "60000"


def test_kv_config_file_form():
    table = KVConfigTable({"ns": {"k": "v"}})
    assert table.encode() == b'{"configTable":{"ns":{"k":"v"}}}'
    assert KVConfigTable.decode(table.encode()) == table
    assert KVConfigTable.decode(b"{}") == KVConfigTable()


# ---- a second master -----------------------------------------------------------------------------


def test_second_live_master_for_a_broker_name_is_refused_until_the_first_is_gone():
    routes = RouteInfoManager(broker_expiry=120.0)
    common: dict[str, Any] = dict(cluster="c", broker_name="b", ha_server_addr=None,
                                  connection=None)
    routes.register_broker(broker_addr="m1:1", broker_id=0, topics=topics("T"), now=0.0, **common)
    routes.register_broker(broker_addr="s:1", broker_id=1, topics=topics("T"), now=0.0, **common)
    with pytest.raises(MasterConflict) as caught:
        routes.register_broker(broker_addr="m2:1", broker_id=0, topics=topics("X"), now=100.0,
                               **common)
    assert caught.value.live_master == "m1:1" and "m1:1" in str(caught.value)
    # nothing of the refused registration was recorded
    assert routes.cluster_info().broker_addr_table["b"].broker_addrs == {0: "m1:1", 1: "s:1"}
    assert routes.pick_route("X") is None and "m2:1" not in routes.broker_live_table
    # the master re-registering keeps its place, and a slave still learns it
    routes.register_broker(broker_addr="m1:1", broker_id=0, topics=topics("T"), now=100.0,
                           **common)
    slave = routes.register_broker(broker_addr="s:1", broker_id=1, topics=None, now=100.0,
                                   **common)
    assert slave.master_addr == "m1:1"
    # silent past the expiry (not yet swept): the new master may take the name
    routes.register_broker(broker_addr="m2:1", broker_id=0, topics=topics("X"), now=221.0,
                           **common)
    assert routes.cluster_info().broker_addr_table["b"].broker_addrs[0] == "m2:1"
    assert "m1:1" not in routes.broker_live_table
    # and a master that unregisters frees the name at once
    routes.unregister_broker(broker_addr="m2:1", broker_name="b", broker_id=0)
    routes.register_broker(broker_addr="m3:1", broker_id=0, topics=topics("T"), now=222.0,
                           **common)
    assert routes.cluster_info().broker_addr_table["b"].broker_addrs[0] == "m3:1"


async def test_second_master_registration_is_answered_with_the_live_masters_address(namesrv):
    async with open_remoting_client(namesrv) as first, open_remoting_client(namesrv) as second:
        ok = await first.invoke(register_request("broker-a", "10.0.0.1:10911"), 5)
        assert ok.code == ResponseCode.SUCCESS
        refused = await second.invoke(register_request("broker-a", "10.0.0.2:10911"), 5)
        assert refused.code == ResponseCode.NO_PERMISSION
        assert refused.ext_fields["masterAddr"] == "10.0.0.1:10911"
        assert "10.0.0.1:10911" in (refused.remark or "")
        route = await route_of(namesrv, "TopicA")
        assert route is not None and route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911"}
    # both connections closed: the name is free again
    async with open_remoting_client(namesrv) as third:
        ok = await third.invoke(register_request("broker-a", "10.0.0.2:10911"), 5)
        assert ok.code == ResponseCode.SUCCESS
