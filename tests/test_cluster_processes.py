"""A cluster of real processes started through the ``trio-ha`` command: the master is killed
with SIGKILL while a consumer reads and a producer writes, then restarted."""

import os
import signal
import socket
import subprocess
import sys

import pytest
import trio

from trio_ha.remoting import RemotingError, open_remoting_client
from trio_ha.wire import record as rec
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_broker_port() -> int:
    """A port p with p-2 (VIP) and p+1 (HA) free as well."""
    for _ in range(50):
        port = free_port()
        if port < 1030:
            continue
        probes = []
        try:
            for p in (port - 2, port, port + 1):
                probe = socket.socket()
                probes.append(probe)  # closed below even if its bind fails
                probe.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no free broker port")


def start(args, log_path):
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "trio_ha.cli", *args], stdout=log,
                                stderr=subprocess.STDOUT)


def conf(path, **values) -> str:
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    path.write_text(text)
    return str(path)


async def wait_port(port, timeout=20):
    with trio.fail_after(timeout):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.aclose()
                return
            except OSError:
                await trio.sleep(0.1)


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
    ns_port, master_port, slave_port = free_port(), free_broker_port(), free_broker_port()
    namesrv = f"127.0.0.1:{ns_port}"
    common = dict(namesrvAddr=namesrv, bindAddress="127.0.0.1", brokerIP1="127.0.0.1",
                  haBindAddress="127.0.0.1", mappedFileSizeCommitLog=1048576,
                  haReconnectInterval=200, slaveSyncInterval=500)
    master_conf = conf(tmp_path / "master.conf", brokerRole="SYNC_MASTER", listenPort=master_port,
                       storePathRootDir=tmp_path / "m", **common)
    slave_conf = conf(tmp_path / "slave.conf", brokerRole="SLAVE", brokerId=1, listenPort=slave_port,
                      storePathRootDir=tmp_path / "s", **common)
    procs = [start(["namesrv", "--port", str(ns_port), "--bind", "127.0.0.1"], tmp_path / "ns.log")]
    try:
        await wait_port(ns_port)
        master = start(["broker", "-c", master_conf], tmp_path / "m.log")
        procs.append(master)
        procs.append(start(["broker", "-c", slave_conf], tmp_path / "s.log"))
        await wait_port(master_port)
        await wait_port(slave_port)
        acked = []
        async with open_remoting_client(f"127.0.0.1:{master_port}") as producer:
            with trio.fail_after(20):
                i = 0
                while len(acked) < 50:
                    body = f"m{i}".encode()
                    reply = await producer.invoke(send("Orders", body), 5)
                    if reply.code == ResponseCode.SUCCESS:  # SYNC_MASTER: the slave has it
                        acked.append(body)
                    i += 1
        master.send_signal(signal.SIGKILL)
        master.wait(10)

        # The master is gone: its port refuses, and the slave still serves every acked message.
        with pytest.raises(RemotingError):
            async with open_remoting_client(f"127.0.0.1:{master_port}", connect_timeout=2) as c:
                await c.invoke(send("Orders", b"lost?"), 2)
        with trio.fail_after(10):  # acked bytes are on the slave; its index may lag a moment
            while True:
                on_slave, _ = await read_all(f"127.0.0.1:{slave_port}", "Orders", 0)
                if set(acked) <= set(on_slave):
                    break
                await trio.sleep(0.05)
        async with open_remoting_client(f"127.0.0.1:{slave_port}") as slave:
            refused = await slave.invoke(send("Orders", b"to the slave"), 5)
            assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE

        # Restart the master on the same store: it recovers, the slave reconnects, all resumes.
        procs.append(start(["broker", "-c", master_conf], tmp_path / "m2.log"))
        await wait_port(master_port)
        async with open_remoting_client(f"127.0.0.1:{master_port}") as producer:
            with trio.fail_after(20):
                while True:
                    reply = await producer.invoke(send("Orders", b"after restart"), 5)
                    if reply.code == ResponseCode.SUCCESS:
                        break
                    await trio.sleep(0.1)
        with trio.fail_after(10):
            while True:
                on_master, _ = await read_all(f"127.0.0.1:{master_port}", "Orders", 0)
                if b"after restart" in on_master:
                    break
                await trio.sleep(0.05)
        assert set(acked) <= set(on_master)
        with trio.fail_after(10):
            while True:
                on_slave, _ = await read_all(f"127.0.0.1:{slave_port}", "Orders", 0)
                if b"after restart" in on_slave:
                    break
                await trio.sleep(0.1)
        assert on_slave == on_master
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
