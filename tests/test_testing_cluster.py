"""trio_ha.testing's cluster helpers: a name server, a master and N slaves on 127.0.0.1, in
this process (serve_cluster, open_cluster) and as child processes (ProcessCluster)."""

import os
import random
import socket
import subprocess
import sys

import pytest
import trio

from conftest import wait_until
from trio_ha.broker import BrokerConfig
from trio_ha.client import Message, SendStatus, open_admin, open_producer
from trio_ha.config import BrokerRole, FlushDiskType
from trio_ha.testing import (
    ClusterConfig,
    ProcessCluster,
    free_broker_port,
    open_cluster,
    serve_cluster,
)


def test_config_derives_each_brokers_conf_and_explicit_keys_win(tmp_path):
    config = ClusterConfig(
        data_dir=tmp_path, slaves=2, master_role="ASYNC_MASTER", flush_disk_type="SYNC_FLUSH",
        properties="defaultTopicQueueNums=3\nhaReconnectInterval=100\nbrokerIP1=127.0.0.2\n",
        master_port=12000, slave_ports=(12010,), cluster_name="C1",
    )
    master = BrokerConfig.from_properties(config.broker_properties(0, "127.0.0.1:9"))
    assert master.role is BrokerRole.ASYNC_MASTER and master.broker_id == 0
    assert master.store.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert master.listen_port == 12000 and master.broker_cluster_name == "C1"
    assert master.store.store_path_root_dir == os.path.join(tmp_path, "master")
    assert master.default_topic_queue_nums == 3 and master.broker_ip1 == "127.0.0.2"
    assert master.namesrv_addresses == ["127.0.0.1:9"]
    slaves = [BrokerConfig.from_properties(config.broker_properties(i, "127.0.0.1:9"))
              for i in (1, 2)]
    assert [(s.role, s.broker_id, s.listen_port) for s in slaves] == [
        (BrokerRole.SLAVE, 1, 12010), (BrokerRole.SLAVE, 2, 0)]
    assert slaves[1].store.store_path_root_dir == os.path.join(tmp_path, "slave2")
    assert slaves[1].store.ha_reconnect_interval == 100
    with pytest.raises(ValueError, match="SLAVE"):
        ClusterConfig(data_dir=tmp_path, master_role="SLAVE")


async def test_serve_cluster_in_a_nursery_with_two_slaves(nursery, tmp_path):
    config = ClusterConfig(data_dir=tmp_path, slaves=2, master_role="ASYNC_MASTER",
                           flush_disk_type="SYNC_FLUSH", properties={"haReconnectInterval": 100})
    addresses = await nursery.start(serve_cluster, config)
    assert addresses.slave == addresses.slaves[0] and len(addresses.slaves) == 2
    with trio.fail_after(30):
        async with open_admin(addresses.namesrv_addr) as admin:
            info = await admin.cluster_info()
            assert info.broker_addr_table["broker-a"].broker_addrs == {
                0: addresses.master.broker_addr, 1: addresses.slaves[0].broker_addr,
                2: addresses.slaves[1].broker_addr,
            }
            assert (await admin.runtime_info(addresses.master.broker_addr))["brokerRole"] == (
                "ASYNC_MASTER")
            async with open_producer(admin.instance, "p") as producer:
                result = await producer.send(Message("Everywhere", b"x"))
            assert result.send_status is SendStatus.SEND_OK
            end = (await admin.runtime_info(addresses.master.broker_addr))["commitLogMaxOffset"]
            for slave in addresses.slaves:

                async def caught_up(slave=slave):
                    table = await admin.runtime_info(slave.broker_addr)
                    return table["commitLogMaxOffset"] == end

                await wait_until(caught_up, f"{slave.broker_addr} to copy the master's log")
    assert sorted(os.listdir(tmp_path)) == ["master", "slave1", "slave2"]


async def test_open_cluster_stops_and_restarts_a_broker_on_its_ports(tmp_path):
    config = ClusterConfig(data_dir=tmp_path, properties={"vipChannelEnable": "false"})
    with trio.fail_after(30):
        async with open_cluster(config) as cluster:
            before = cluster.addresses
            await cluster.master.stop()
            assert not cluster.master.running and cluster.slave.running
            await cluster.master.restart()
            assert cluster.master.running
            assert cluster.addresses == before
        assert not cluster.master.running and not cluster.slave.running


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
        return int(ports.read().split()[0])


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_free_broker_ports_are_below_the_ephemeral_range_with_vip_and_ha_free():
    low = ephemeral_low()
    for _ in range(20):
        port = free_broker_port()
        assert port - 2 >= 1030 and port + 1 < low
        for p in (port - 2, port, port + 1):
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", p))


def test_a_port_handed_out_is_not_handed_out_again_while_its_node_may_still_be_starting(
        tmp_path, monkeypatch):
    """Free to bind is not enough (a node binds a while after its ports are chosen): a port
    handed out is noted, and neither this process nor another hands it out again until the
    note is older than RESERVED_SECONDS (an in-process cluster failed to listen once, a
    port of its handed to the other test worker's broker too)."""
    from trio_ha.testing import ports

    notes = str(tmp_path / "notes")
    monkeypatch.setattr(ports, "RESERVATIONS", notes)
    port = free_broker_port()

    class Same(random.Random):  # every pick is that port
        def randrange(self, *args, **kwargs):
            return port

    monkeypatch.setattr(ports, "random", Same())
    with pytest.raises(RuntimeError, match="no free broker port"):
        free_broker_port()
    other = subprocess.run(
        [sys.executable, "-c",
         "import sys; from trio_ha.testing import ports; ports.RESERVATIONS = sys.argv[1]; "
         "ports.random.randrange = lambda *a: int(sys.argv[2]); "
         "print(ports.free_broker_port())", notes, str(port)],
        capture_output=True, text=True, timeout=60)
    assert other.returncode != 0 and "no free broker port" in other.stderr, other
    with socket.socket() as probe:  # (the ports are free all along: only the note holds them)
        probe.bind(("127.0.0.1", port))
    monkeypatch.setattr(ports, "RESERVED_SECONDS", 0.0)  # the note has run out
    assert free_broker_port() == port


def test_a_killed_slave_restarts_on_ports_no_outgoing_connection_can_have_taken(tmp_path):
    """The ports a node binds at 0 (and the VIP port, listenPort - 2, which a restart binds
    first) come from the ephemeral range, where any connection may take them while the node
    is down: a restart failed so under two test workers. Nodes left to choose get theirs below
    that range, bound the same on the first start as on every restart."""
    low = ephemeral_low()
    config = ClusterConfig(data_dir=tmp_path, slaves=1)
    with ProcessCluster.start(config) as cluster:
        before = {node.name: (node.addr, node.info.get("ha_addr"), node.info.get("vip_addr"))
                  for node in cluster.nodes}
        for addresses in before.values():
            assert all(port_of(a) < low for a in addresses if a is not None)
        assert port_of(cluster.slave.info["vip_addr"]) == port_of(cluster.slave.addr) - 2
        cluster.slave.kill()
        cluster.restart(cluster.slave)
        slave = cluster.slave
        assert (slave.addr, slave.info.get("ha_addr"), slave.info.get("vip_addr")) == \
            before["slave1"]


def test_process_cluster_runs_children_and_leaves_none(tmp_path):
    config = ClusterConfig(data_dir=tmp_path, master_role="ASYNC_MASTER")
    with ProcessCluster.start(config) as cluster:
        pids = [node.pid for node in cluster.nodes]
        assert all(_running(pid) for pid in pids) and os.getpid() not in pids
        assert cluster.addresses.slave.broker_addr == cluster.slave.addr
        assert cluster.master.info["role"] == "ASYNC_MASTER"
        cluster.slave.kill()
        with pytest.raises(RuntimeError, match="slave1 exited"):
            cluster.check()
        cluster.restart(cluster.slave)
        cluster.check()
        pids.append(cluster.slave.pid)
    assert not any(_running(pid) for pid in pids)
    assert os.path.exists(os.path.join(tmp_path, "logs", "master.log"))
