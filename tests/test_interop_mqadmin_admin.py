"""Issue 13: the real mqadmin's admin commands against our name server and brokers —
wipeWritePerm / addWritePerm, deleteTopic, updateKvConfig / updateOrderConf, getNamesrvConfig,
updateBrokerConfig, and the rates clusterList and brokerStatus read.

mqadmin exits 0 after many failures (it prints the stack trace and returns), so every check
reads the output. The nodes run with HOME in the test's directory: the name server keeps its
KV config in ~/namesrv/kvConfig.json, as RocketMQ does.
"""

from __future__ import annotations

import re

import pytest

from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.testing.rocketmq import RocketMQ

pytestmark = pytest.mark.interop


@pytest.fixture(scope="module", params=["rocketmq_clients", "rocketmq5"])
def state(request, tmp_path_factory):
    """Our name server, SYNC_MASTER and SLAVE, and the mqadmin of the parameter's version."""
    admin_peer: RocketMQ = request.getfixturevalue(request.param)
    run = tmp_path_factory.mktemp("mqadmin_admin")
    home = run / "home"
    home.mkdir()
    config = ClusterConfig(data_dir=str(run / "ours"), master_port=free_broker_port())
    with ProcessCluster.start(config, env={"HOME": str(home)}) as cluster:
        yield cluster, run, admin_peer, home


def admin(state, *args: object) -> str:
    cluster, run, peer, _ = state
    out = peer.mqadmin(run / "adm", *args[:1], "-n", cluster.namesrv_addr, *args[1:])
    assert "Exception" not in out, out
    return out


def route_perms(state, topic: str) -> set[int]:
    route = admin(state, "topicRoute", "-t", topic)
    return {int(perm) for perm in re.findall(r'"perm":(\d+)', route)}


def test_wipe_and_add_write_perm(state):
    cluster = state[0]
    admin(state, "updateTopic", "-c", "DefaultCluster", "-t", "WipeT", "-r", 2, "-w", 2)
    topics = len(admin(state, "topicList").split())
    out = admin(state, "wipeWritePerm", "-b", "broker-a")
    match = re.search(r"wipe write perm of broker\[broker-a\] in name server\[(.+)\] OK, (\d+)",
                      out)
    assert match, out
    assert match.group(1) == cluster.namesrv_addr
    assert int(match.group(2)) == topics  # every topic is on broker-a
    assert route_perms(state, "WipeT") == {4}
    out = admin(state, "addWritePerm", "-b", "broker-a")
    assert re.search(rf"add write perm of broker\[broker-a\] in name server\[.+\] OK, {topics}",
                     out), out
    assert route_perms(state, "WipeT") == {6}


def test_delete_topic_from_cluster_and_name_server(state):
    admin(state, "updateTopic", "-c", "DefaultCluster", "-t", "DeleteT", "-r", 2, "-w", 2)
    assert "DeleteT" in admin(state, "topicList").split()
    out = admin(state, "deleteTopic", "-c", "DefaultCluster", "-t", "DeleteT")
    assert "delete topic [DeleteT] from cluster [DefaultCluster] success." in out
    assert "delete topic [DeleteT] from NameServer success." in out
    assert "DeleteT" not in admin(state, "topicList").split()


def test_kv_config_and_order_conf(state):
    home = state[3]
    out = admin(state, "updateKvConfig", "-s", "AdminNs", "-k", "color", "-v", "blue")
    assert "create or update kv config to namespace success." in out
    out = admin(state, "updateOrderConf", "-t", "OrderT", "-m", "put", "-v", "broker-a:4")
    assert "update orderConf success" in out
    out = admin(state, "updateOrderConf", "-t", "OrderT", "-m", "get")
    assert "orderConf=[broker-a:4]" in out
    kv_file = (home / "namesrv" / "kvConfig.json").read_text()
    assert '"color":"blue"' in kv_file and '"OrderT":"broker-a:4"' in kv_file
    out = admin(state, "deleteKvConfig", "-s", "AdminNs", "-k", "color")
    assert "delete kv config from namespace success." in out
    assert '"color"' not in (home / "namesrv" / "kvConfig.json").read_text()
    config = admin(state, "getNamesrvConfig")
    values = dict(re.findall(r"^(\w+)\s+=  (.*)$", config, re.M))
    assert values["kvConfigPath"] == str(home / "namesrv" / "kvConfig.json")


def test_update_broker_config(state):
    cluster = state[0]
    out = admin(state, "updateBrokerConfig", "-b", cluster.master.addr,
                "-k", "maxTransferCountOnMessageInMemory", "-v", "16")
    assert f"update broker config success, {cluster.master.addr}" in out
    config = admin(state, "getBrokerConfig", "-b", cluster.master.addr)
    values = dict(re.findall(r"^(\w+)\s+=  (.*)$", config, re.M))
    assert values["maxTransferCountOnMessageInMemory"] == "16"
    _, run, peer, _ = state
    refused = peer.mqadmin(run / "adm", "updateBrokerConfig", "-n", cluster.namesrv_addr,
                           "-b", cluster.master.addr, "-k", "listenPort", "-v", "1")
    assert "cannot change while the broker runs" in refused and "listenPort" in refused


def test_cluster_list_and_broker_status_read_the_rates(state):
    cluster = state[0]
    admin(state, "sendMessage", "-t", "RatesT", "-p", "hello")
    out = admin(state, "clusterList")
    header, *rows = [line for line in out.splitlines() if line.strip()]
    assert "#InTPS" in header and "#OutTPS" in header
    master_row = next(line for line in rows if cluster.master.addr in line)
    # InTPS and OutTPS follow the address and the version: "<in>(...) <out>(...)"; InTPS is
    # putTps' first window, which has the message just sent
    rates = re.search(r"(\d+\.\d+)\(\d+,\d+ms\)\s+(\d+\.\d+)\(", master_row)
    assert rates and float(rates.group(1)) > 0, master_row
    status = admin(state, "brokerStatus", "-b", cluster.master.addr)
    put_tps = re.search(r"^putTps\s*: (.*)$", status, re.M)
    assert put_tps, status
    windows = put_tps.group(1).split()
    assert len(windows) == 3 and float(windows[0]) > 0, put_tps.group(1)
    for key in ("getFoundTps", "getMissTps", "getTotalTps", "getTransferedTps"):
        match = re.search(rf"^{key}\s*: (.*)$", status, re.M)
        assert match and len(match.group(1).split()) == 3, (key, status)
