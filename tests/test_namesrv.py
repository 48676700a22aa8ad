"""The name server over real sockets, and its route table alone."""

from typing import Any

import attrs
import pytest
import trio

from trio_ha import _backend
from trio_ha.namesrv import NamesrvConfig, RouteInfoManager, serve_namesrv
from trio_ha.remoting import open_remoting_client
from trio_ha.wire.metadata import DataVersion, TopicConfig, TopicConfigSerializeWrapper
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import ClusterInfo, RegisterBrokerBody, TopicRouteData


def topics(*names, version=1, queues=4):
    return TopicConfigSerializeWrapper(
        {n: TopicConfig(n, queues, queues) for n in names}, DataVersion(version, 1000 + version)
    )


def register_request(name, addr, broker_id, *, ha="127.0.0.1:10912", body_topics=None,
                     compressed=False, crc=True):
    body = RegisterBrokerBody(body_topics or topics("TopicA")).encode(compressed=compressed)
    return RemotingCommand.request(RequestCode.REGISTER_BROKER, {
        "brokerName": name, "brokerAddr": addr, "clusterName": "DefaultCluster",
        "haServerAddr": ha, "brokerId": broker_id, "compressed": compressed,
        "bodyCrc32": _backend.engine.crc32(body) if crc else 0,
    }, body=body)


@pytest.fixture
async def namesrv(nursery):
    host, port = await nursery.start(
        serve_namesrv, NamesrvConfig(listen_port=0, bind_address="127.0.0.1")
    )
    return f"127.0.0.1:{port}"


async def test_register_then_route_in_both_json_forms(namesrv):
    async with open_remoting_client(namesrv) as broker:
        reply = await broker.invoke(register_request("broker-a", "10.0.0.1:10911", 0), 3)
        assert reply.code == ResponseCode.SUCCESS
        async with open_remoting_client(namesrv) as client:
            new = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}, version=409), 3)
            assert b'"brokerAddrs":{"0":"10.0.0.1:10911"}' in new.body
            old = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TopicA"}, version=300), 3)
            assert b'"brokerAddrs":{0:"10.0.0.1:10911"}' in old.body  # fastjson, issue #4471
            asked = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC,
                {"topic": "TopicA", "acceptStandardJsonOnly": True}, version=300), 3)
            assert b'{"0":' in asked.body
            for reply in (new, old):
                route = TopicRouteData.decode(reply.body)
                assert route.broker_datas[0].broker_addrs == {0: "10.0.0.1:10911"}
                assert route.queue_datas[0].write_queue_nums == 4
            missing = await client.invoke(RemotingCommand.request(
                RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Nope"}), 3)
            assert missing.code == ResponseCode.TOPIC_NOT_EXIST


async def test_slave_learns_its_masters_address_and_ha_address(namesrv):
    async with open_remoting_client(namesrv) as master, open_remoting_client(namesrv) as slave:
        await master.invoke(register_request("broker-a", "10.0.0.1:10911", 0, ha="10.0.0.1:10912"), 3)
        reply = await slave.invoke(register_request("broker-a", "10.0.0.2:10911", 1, ha="10.0.0.2:10912"), 3)
        assert reply.ext_fields["masterAddr"] == "10.0.0.1:10911"
        assert reply.ext_fields["haServerAddr"] == "10.0.0.1:10912"
        info = await slave.invoke(RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO), 3)
        cluster = ClusterInfo.decode(info.body)
        assert cluster.broker_addr_table["broker-a"].broker_addrs == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
        assert cluster.cluster_addr_table == {"DefaultCluster": frozenset({"broker-a"})}


async def test_compressed_register_body_and_crc_check(namesrv):
    async with open_remoting_client(namesrv) as broker:
        ok = await broker.invoke(register_request("b", "10.0.0.9:10911", 0, compressed=True,
                                                  body_topics=topics("Zipped")), 3)
        assert ok.code == ResponseCode.SUCCESS
        bad = register_request("b", "10.0.0.9:10911", 0)
        bad = attrs.evolve(bad, ext_fields={**bad.ext_fields, "bodyCrc32": "12345"})
        reply = await broker.invoke(bad, 3)
        assert reply.code == ResponseCode.SYSTEM_ERROR and "crc32" in (reply.remark or "")
        listing = await broker.invoke(RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER), 3)
        assert b'"Zipped"' in listing.body


async def test_a_broker_is_removed_when_its_connection_closes(namesrv):
    async with open_remoting_client(namesrv) as client:
        async with open_remoting_client(namesrv) as broker:
            await broker.invoke(register_request("gone", "10.0.0.5:10911", 0, body_topics=topics("T")), 3)
            route = await client.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), 3)
            assert route.code == ResponseCode.SUCCESS
        with trio.fail_after(3):
            while True:
                route = await client.invoke(RemotingCommand.request(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"}), 3)
                if route.code == ResponseCode.TOPIC_NOT_EXIST:
                    break
                await trio.sleep(0.01)


async def test_unknown_requests_get_request_code_not_supported(namesrv):
    async with open_remoting_client(namesrv) as client:
        reply = await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE), 3)
        assert reply.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_route_table_expires_brokers_after_120_s():
    routes = RouteInfoManager()
    routes.register_broker(cluster="c", broker_addr="a:1", broker_name="b", broker_id=0,
                           ha_server_addr=None, topics=topics("T"), connection=None, now=0.0)
    assert routes.scan_not_active(100.0) == []
    assert routes.pick_route("T") is not None
    assert routes.scan_not_active(121.0) == ["a:1"]
    assert routes.pick_route("T") is None and routes.cluster_info().broker_addr_table == {}


def test_topic_queues_only_from_masters_and_only_on_a_new_data_version():
    routes = RouteInfoManager()
    common: dict[str, Any] = dict(
        cluster="c", broker_name="b", ha_server_addr=None, connection=None, now=0.0
    )
    routes.register_broker(broker_addr="s:1", broker_id=1, topics=topics("FromSlave"), **common)
    assert routes.pick_route("FromSlave") is None
    routes.register_broker(broker_addr="m:1", broker_id=0, topics=topics("T", version=1, queues=4), **common)
    routes.register_broker(broker_addr="m:1", broker_id=0, topics=topics("T", version=1, queues=8), **common)
    route = routes.pick_route("T")
    assert route is not None
    assert route.queue_datas[0].write_queue_nums == 4  # same version: ignored
    routes.register_broker(broker_addr="m:1", broker_id=0, topics=topics("T", version=2, queues=8), **common)
    route = routes.pick_route("T")
    assert route is not None
    assert route.queue_datas[0].write_queue_nums == 8


def test_an_address_reregistering_under_another_id_replaces_its_old_entry():
    routes = RouteInfoManager()
    common: dict[str, Any] = dict(
        cluster="c", broker_name="b", ha_server_addr=None, topics=topics("T"), connection=None,
        now=0.0,
    )
    routes.register_broker(broker_addr="x:1", broker_id=1, **common)
    routes.register_broker(broker_addr="x:1", broker_id=0, **common)  # promoted to master
    assert routes.cluster_info().broker_addr_table["b"].broker_addrs == {0: "x:1"}
