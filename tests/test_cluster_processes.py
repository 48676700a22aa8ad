"""A cluster of real processes (``trio_ha.testing.ProcessCluster``: a name server, a master
and its slave, each its own interpreter): the master is killed with SIGKILL after a producer
wrote, the slave serves what was acknowledged, then the master restarts and nothing is lost."""

import pytest
import trio

from conftest import wait_until
from trio_ha.remoting import RemotingError, open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.wire import record as rec
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


def send(topic, body, queue=0):
    return RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
        "a": "pg", "b": topic, "c": "TBW102", "d": 4, "e": queue, "f": 0, "g": 1, "h": 0,
        "i": f"KEYS\x01{body.decode()}"}, body=body)


def pull(topic, queue, offset):
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subVersion": 0})


def records(body: bytes) -> list:
    out, view = [], memoryview(body)
    while view:
        m = rec.decode_record(view)
        out.append(m)
        view = view[m.size:]
    return out


async def read_all(address, topic, queue, start=0):
    bodies, offset = [], start
    async with open_remoting_client(address) as client:
        while True:
            reply = await client.invoke(pull(topic, queue, offset), 5)
            if reply.code != ResponseCode.SUCCESS:
                return bodies, reply
            bodies += [m.body for m in records(reply.body)]
            offset = int(reply.ext_fields["nextBeginOffset"])


async def test_kill_the_master_read_from_the_slave_restart_and_lose_nothing(tmp_path):
    # Fixed ports, with listenPort - 2 (VIP) and + 1 (HA) free too: the master comes back on
    # the same ports after its crash.
    config = ClusterConfig(
        data_dir=tmp_path, master_role="SYNC_MASTER", master_port=free_broker_port(),
        slave_ports=(free_broker_port(),),
        properties=dict(mappedFileSizeCommitLog=1048576, haReconnectInterval=200,
                        slaveSyncInterval=500),
    )
    with ProcessCluster.start(config) as cluster:
        master_addr, slave_addr = cluster.master.addr, cluster.slave.addr
        acked = []
        async with open_remoting_client(master_addr) as producer:
            with trio.fail_after(20):
                i = 0
                while len(acked) < 50:
                    body = f"m{i}".encode()
                    reply = await producer.invoke(send("Orders", body), 5)
                    if reply.code == ResponseCode.SUCCESS:  # SYNC_MASTER: the slave has it
                        acked.append(body)
                    i += 1
        cluster.master.kill()

        # The master is gone: its port refuses, and the slave still serves every acked message.
        with pytest.raises(RemotingError):
            async with open_remoting_client(master_addr, connect_timeout=2) as c:
                await c.invoke(send("Orders", b"lost?"), 2)

        async def slave_has_acked():  # acked bytes are on the slave; its index may lag a moment
            on_slave, _ = await read_all(slave_addr, "Orders", 0)
            return set(acked) <= set(on_slave)

        await wait_until(slave_has_acked, "the slave to serve every acked message", interval=0.05)
        async with open_remoting_client(slave_addr) as slave:
            refused = await slave.invoke(send("Orders", b"to the slave"), 5)
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE

        # Restart the master on the same store: it recovers, the slave reconnects, all resumes.
        assert cluster.restart(cluster.master).addr == master_addr
        async with open_remoting_client(master_addr) as producer:

            async def accepted():
                reply = await producer.invoke(send("Orders", b"after restart"), 5)
                return reply.code == ResponseCode.SUCCESS

            await wait_until(accepted, "the restarted master to accept a send", timeout=20,
                             interval=0.1)

        async def on(address):
            bodies, _ = await read_all(address, "Orders", 0)
            return bodies if b"after restart" in bodies else None

        on_master = await wait_until(lambda: on(master_addr), "the master to serve the new message",
                                     interval=0.05)
        assert set(acked) <= set(on_master)
        on_slave = await wait_until(lambda: on(slave_addr), "the slave to copy the new message",
                                    interval=0.1)
        assert on_slave == on_master
