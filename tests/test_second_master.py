"""A second master for a broker name (issue 13). RocketMQ's name server lets a second
brokerId-0 broker with the same brokerName replace the first: the route then flaps between the
two at every registration, and the slave is pointed at whichever registered last — a master
whose commitlog is not the one it copies. Ours refuses the second while the first is live, and
the second broker stops at startup with DuplicateMasterError, one line naming who holds the
name."""

import sys

import pytest
import trio

from test_broker import send_request, send_until_replicated
from trio_ha.broker import BrokerConfig, serve_broker
from trio_ha.broker.registration import DuplicateMasterError
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.testing.processes import child_env
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import KVTable, TopicRouteData

PROPERTIES = {"mappedFileSizeCommitLog": 1048576, "haReconnectInterval": 100}


def leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in leaves(sub)]
    return [exc]


async def runtime_info(address: str) -> dict[str, str]:
    async with open_remoting_client(address) as client:
        reply = await client.invoke(RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)
    return KVTable.decode(reply.body).table


async def broker_addrs(namesrv: str, topic: str) -> dict[int, str]:
    async with open_remoting_client(namesrv) as client:
        reply = await client.invoke(RemotingCommand.request(
            RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": topic}), 5)
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    (data,) = TopicRouteData.decode(reply.body).broker_datas
    return data.broker_addrs


def intruder_properties(config: ClusterConfig, namesrv: str, store: str) -> dict[str, str]:
    """The master's broker.conf, with its own store and ports: the same brokerName, brokerId 0."""
    return {**config.broker_properties(0, namesrv), "storePathRootDir": store, "listenPort": "0"}


async def test_second_master_for_a_broker_name_is_refused_and_the_slave_stays_healthy(tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "cluster", master_role="SYNC_MASTER",
                           properties=PROPERTIES)
    with trio.fail_after(60):
        async with open_cluster(config) as cluster:
            master = cluster.master.started_addresses
            slave = cluster.slave.started_addresses
            async with open_remoting_client(master.broker_addr) as client:
                await send_until_replicated(client, "Before")
            assert await broker_addrs(cluster.namesrv_addr, "Before") == {
                0: master.broker_addr, 1: slave.broker_addr}

            intruder = BrokerConfig.from_properties(
                intruder_properties(config, cluster.namesrv_addr, str(tmp_path / "intruder")))
            with pytest.raises(BaseExceptionGroup) as caught:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_broker, intruder)
            (refusal,) = [e for e in leaves(caught.value) if isinstance(e, DuplicateMasterError)]
            assert refusal.live_master == master.broker_addr
            message = str(refusal)
            assert "\n" not in message
            assert master.broker_addr in message and "broker-a" in message

            # The first master keeps the name and the slave keeps copying it.
            assert await broker_addrs(cluster.namesrv_addr, "Before") == {
                0: master.broker_addr, 1: slave.broker_addr}
            async with open_remoting_client(master.broker_addr) as client:
                for i in range(20):  # a SYNC_MASTER answers SUCCESS once its slave has it
                    sent = await client.invoke(send_request("After", f"m{i}".encode()), 5)
                    assert sent.code == ResponseCode.SUCCESS, sent.remark
            master_end = int((await runtime_info(master.broker_addr))["commitLogMaxOffset"])
            info = await runtime_info(slave.broker_addr)
            assert info["haMasterAddress"] == master.ha_addr
            assert info["haDivergence"] == ""
            assert int(info["commitLogMaxOffset"]) >= master_end
            assert await broker_addrs(cluster.namesrv_addr, "After") == {
                0: master.broker_addr, 1: slave.broker_addr}


async def test_a_second_master_process_exits_naming_the_master_that_holds_its_name(tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "cluster", slaves=0, master_role="ASYNC_MASTER",
                           properties=PROPERTIES)
    with trio.fail_after(90):
        async with open_cluster(config) as cluster:
            master = cluster.master.started_addresses
            conf = tmp_path / "intruder.conf"
            properties = intruder_properties(config, cluster.namesrv_addr,
                                             str(tmp_path / "intruder"))
            conf.write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
            result = await trio.run_process(
                [sys.executable, "-m", "trio_ha.cli", "broker", "-c", str(conf)],
                capture_stdout=True, capture_stderr=True, check=False,
                env=child_env({"COLUMNS": "1000"}),  # a traceback, if printed, is not wrapped
                cwd=str(tmp_path))
            stderr = result.stderr.decode(errors="replace")
            assert result.returncode == 1, stderr
            assert "refused this broker" in stderr and master.broker_addr in stderr, stderr
            # one line (after the log's): the reason, not a traceback
            assert stderr.splitlines()[-1].startswith("trio-ha: name server "), stderr
            assert "Traceback" not in stderr, stderr
            async with open_remoting_client(master.broker_addr) as client:
                sent = await client.invoke(send_request("StillHere", b"x"), 5)
                assert sent.code == ResponseCode.SUCCESS, sent.remark
            assert (await broker_addrs(cluster.namesrv_addr, "StillHere"))[0] == master.broker_addr
