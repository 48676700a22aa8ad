"""The broker's admin requests of issue 13: UPDATE_BROKER_CONFIG (the keys that change at
runtime, all or nothing), DELETE_TOPIC_IN_BROKER (config, consume queues, offsets), and the
throughput figures of GET_BROKER_RUNTIME_INFO (three windows, falling to 0 when idle)."""

import pytest
import trio

from conftest import wait_until
from test_broker import max_offset, pull_request, send_request, send_until_replicated
from trio_ha.broker.broker import TPS_WINDOWS, BrokerStats
from trio_ha.remoting import open_remoting_client
from trio_ha.store import PutMessageResult, PutMessageStatus
from trio_ha.testing import ClusterConfig, serve_cluster
from trio_ha.wire.metadata import decode_consumer_offsets, decode_topics_json
from trio_ha.wire.permission import Permission
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import KVTable, TopicRouteData

PROPERTIES = {"mappedFileSizeCommitLog": 1048576, "haReconnectInterval": 100}


@pytest.fixture
async def cluster(nursery, tmp_path):
    """A name server, a SYNC_MASTER and its SLAVE on 127.0.0.1, ports chosen by the OS."""
    config = ClusterConfig(data_dir=tmp_path / "cluster", master_role="SYNC_MASTER",
                           properties=PROPERTIES)
    addresses = await nursery.start(serve_cluster, config)
    return config, addresses


async def call(address: str, code: int, fields=None, body: bytes = b"") -> RemotingCommand:
    async with open_remoting_client(address) as client:
        return await client.invoke(RemotingCommand.request(code, fields, body=body), 5)


async def broker_config(address: str) -> dict[str, str]:
    reply = await call(address, RequestCode.GET_BROKER_CONFIG)
    assert reply.code == ResponseCode.SUCCESS
    return dict(line.split("=", 1) for line in reply.body.decode().splitlines() if line)


async def runtime_info(address: str) -> dict[str, str]:
    reply = await call(address, RequestCode.GET_BROKER_RUNTIME_INFO)
    return KVTable.decode(reply.body).table


async def route_perms(namesrv: str, topic: str) -> set[int]:
    reply = await call(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if reply.code != ResponseCode.SUCCESS:
        return set()
    return {q.perm for q in TopicRouteData.decode(reply.body).queue_datas}


# ---- UPDATE_BROKER_CONFIG ------------------------------------------------------------------------


async def test_update_broker_config_is_reflected_by_get_broker_config_and_takes_effect(cluster):
    _, addresses = cluster
    master, namesrv = addresses.master.broker_addr, addresses.namesrv_addr
    async with open_remoting_client(master) as client:
        await send_until_replicated(client, "Perm")
    assert (await broker_config(master))["brokerPermission"] == "6"

    reply = await call(master, RequestCode.UPDATE_BROKER_CONFIG,
                       body=b"brokerPermission=4\nmaxTransferCountOnMessageInMemory=2\n")
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    config = await broker_config(master)
    assert config["brokerPermission"] == "4"
    assert config["maxTransferCountOnMessageInMemory"] == "2"
    refused = await call(master, RequestCode.SEND_MESSAGE_V2,
                         send_request("Perm", b"x").ext_fields, b"x")
    assert refused.code == ResponseCode.NO_PERMISSION
    # registered again at once, with a new DataVersion: the routes say read-only

    async def read_only() -> bool:
        return await route_perms(namesrv, "Perm") == {int(Permission.READ)}

    await wait_until(read_only, "the route of Perm to lose write")

    reply = await call(master, RequestCode.UPDATE_BROKER_CONFIG, body=b"brokerPermission=6\n")
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    async with open_remoting_client(master) as client:
        for _ in range(3):
            sent = await client.invoke(send_request("Perm", b"again"), 5)
            assert sent.code == ResponseCode.SUCCESS, sent.remark
        pulled = await client.invoke(pull_request("Perm", 0, 0), 5)
        assert pulled.code == ResponseCode.SUCCESS
        assert pulled.ext_fields["nextBeginOffset"] == "2"  # at most 2 per pull now


async def test_update_broker_config_refuses_what_it_cannot_change_and_changes_nothing(cluster):
    _, addresses = cluster
    master = addresses.master.broker_addr
    reply = await call(master, RequestCode.UPDATE_BROKER_CONFIG, body=(
        b"brokerPermission=4\nlistenPort=1\nnoSuchKey=1\nsendMessageThreadPoolNums=4\n"))
    assert reply.code == ResponseCode.SYSTEM_ERROR
    remark = reply.remark or ""
    for key in ("listenPort", "noSuchKey", "sendMessageThreadPoolNums"):
        assert key in remark
    assert "brokerPermission" not in remark
    assert (await broker_config(master))["brokerPermission"] == "6"

    black = await call(master, RequestCode.UPDATE_BROKER_CONFIG, body=b"brokerConfigPath=/x\n")
    assert black.code == ResponseCode.NO_PERMISSION
    assert black.remark == "Can not update config in black list."
    for bad in (b"brokerPermission=99\n", b"autoCreateTopicEnable=maybe\n",
                b"accessMessageInMemoryMaxRatio=x\n"):
        refused = await call(master, RequestCode.UPDATE_BROKER_CONFIG, body=bad)
        assert refused.code == ResponseCode.SYSTEM_ERROR, bad
        assert bad.split(b"=")[0].decode() in (refused.remark or ""), refused.remark
    config = await broker_config(master)
    assert (config["brokerPermission"], config["autoCreateTopicEnable"]) == ("6", "true")


# ---- DELETE_TOPIC_IN_BROKER ----------------------------------------------------------------------


def commit(group: str, topic: str, queue: int, offset: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset})


async def test_delete_topic_removes_its_config_queues_and_offsets_and_is_refused_on_a_slave(
        cluster):
    config, addresses = cluster
    master, slave = addresses.master.broker_addr, addresses.slave.broker_addr
    namesrv = addresses.namesrv_addr
    queue_dir = trio.Path(config.store_dir(0), "consumequeue", "Doomed")
    async with open_remoting_client(master) as client:
        for topic in ("Doomed", "Kept"):
            created = await client.invoke(RemotingCommand.request(
                RequestCode.UPDATE_AND_CREATE_TOPIC,
                {"topic": topic, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}), 5)
            assert created.code == ResponseCode.SUCCESS
            for queue in (0, 1):
                await send_until_replicated(client, topic, queue=queue)
                reply = await client.invoke(commit("g1", topic, queue, 1), 5)
                assert reply.code == ResponseCode.SUCCESS, reply.remark
    assert sorted(p.name for p in await queue_dir.iterdir()) == ["0", "1"]

    on_slave = await call(slave, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"})
    assert on_slave.code == ResponseCode.SYSTEM_ERROR
    assert "from slave broker" in (on_slave.remark or "")
    system = await call(master, RequestCode.DELETE_TOPIC_IN_BROKER,
                        {"topic": "SCHEDULE_TOPIC_XXXX"})
    assert system.code == ResponseCode.SYSTEM_ERROR
    assert system.remark == "The topic[SCHEDULE_TOPIC_XXXX] is conflict with system topic."

    deleted = await call(master, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"})
    assert deleted.code == ResponseCode.SUCCESS, deleted.remark
    topics = decode_topics_json(
        (await call(master, RequestCode.GET_ALL_TOPIC_CONFIG)).body).topic_config_table
    assert "Doomed" not in topics and "Kept" in topics
    assert not await queue_dir.exists()
    offsets = decode_consumer_offsets(
        (await call(master, RequestCode.GET_ALL_CONSUMER_OFFSET)).body).offset_table
    assert "Doomed@g1" not in offsets and offsets["Kept@g1"] == {0: 1, 1: 1}
    maximum = await call(master, RequestCode.GET_MAX_OFFSET, {"topic": "Doomed", "queueId": 0})
    assert maximum.ext_fields["offset"] == "0"

    async def route_gone() -> bool:
        reply = await call(namesrv, RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Doomed"})
        return reply.code == ResponseCode.TOPIC_NOT_EXIST

    await wait_until(route_gone, "the name server to drop Doomed's route")
    assert await route_perms(namesrv, "Kept") == {6}
    # a topic the broker does not have: SUCCESS, as RocketMQ
    again = await call(master, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Doomed"})
    assert again.code == ResponseCode.SUCCESS


# ---- throughput ----------------------------------------------------------------------------------


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.25

    def __call__(self) -> float:
        return self.now


def stored(count: int = 1) -> PutMessageResult:
    return PutMessageResult(PutMessageStatus.PUT_OK, 0, 100, 0, tuple(range(count)))


def rates(text: str) -> list[float]:
    parts = text.split(" ")
    assert len(parts) == len(TPS_WINDOWS), text
    return [float(part) for part in parts]


def test_put_tps_decays_to_zero_when_idle():
    clock = ManualClock()
    stats = BrokerStats(clock=clock)
    assert stats.stored.rates_text() == "0.0 0.0 0.0"
    clock.now += 700  # the broker has run longer than the longest window
    for _ in range(5):  # 100 messages a second for 5 s
        for _ in range(10):
            stats.record_put(stored(10))
        clock.now += 1
    ten, sixty, six_hundred = rates(stats.stored.rates_text())
    assert 500 / 11 <= ten <= 500 / 10
    assert 500 / 61 <= sixty <= 500 / 60
    assert 500 / 601 <= six_hundred <= 500 / 600
    clock.now += 11  # idle: the 10 s window empties first
    ten, sixty, six_hundred = rates(stats.stored.rates_text())
    assert ten == 0.0 and sixty > 0 and six_hundred > 0
    clock.now += 600
    assert stats.stored.rates_text() == "0.0 0.0 0.0"
    assert stats.puts == 500  # the total stays


def test_rates_of_a_young_broker_cover_its_life():
    clock = ManualClock()
    stats = BrokerStats(clock=clock)
    stats.record_put(stored(3))  # in the second the broker started
    clock.now += 2
    stats.record_put(stored(27))
    stats.record_get(0)
    stats.record_get(4)
    clock.now += 1
    ten, sixty, six_hundred = rates(stats.stored.rates_text())
    assert ten == sixty == six_hundred == pytest.approx(10.0)  # 30 messages in 3 s
    assert rates(stats.transferred.rates_text())[0] == pytest.approx(4 / 3)
    assert rates(stats.total_get_rates_text())[0] == pytest.approx(2 / 3)
    assert stats.transferred.total == 4


async def test_runtime_info_reports_put_and_get_rates_in_three_windows(cluster):
    _, addresses = cluster
    master = addresses.master.broker_addr
    async with open_remoting_client(master) as client:
        await send_until_replicated(client, "Rates")
        sent = [await client.invoke(send_request("Rates", b"m"), 5) for _ in range(4)]
        assert all(s.code == ResponseCode.SUCCESS for s in sent), [s.remark for s in sent]
        end = int(sent[-1].ext_fields["queueOffset"]) + 1

        async def dispatched() -> bool:
            return await max_offset(client, "Rates") >= end

        await wait_until(dispatched, "the sends to be dispatched")
        served, last_code = 0, None
        for _ in range(end + 1):  # pulls that find messages, then one that finds none
            pulled = await client.invoke(pull_request("Rates", 0, served), 5)
            last_code = pulled.code
            if pulled.code != ResponseCode.SUCCESS:
                break
            served = int(pulled.ext_fields["nextBeginOffset"])
        assert last_code == ResponseCode.PULL_NOT_FOUND and served == end
    info = await runtime_info(master)
    for key in ("putTps", "getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps"):
        assert all(rate > 0 for rate in rates(info[key])), (key, info[key])
    assert int(info["msgGetTotalTodayNow"]) == served
    assert int(info["msgPutTotalTodayNow"]) >= 5
