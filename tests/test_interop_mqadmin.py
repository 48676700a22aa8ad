"""Issue 10, point 2: the real mqadmin (4.9.8, and 5.3.3's for point 7) against our name
server, SYNC_MASTER and SLAVE.

Each command exits 0, prints no exception, names our brokers and agrees with our state:
offsets, queue counts, message fields, configuration. mqadmin exits 0 after many failures (it
prints the stack trace and returns), so every check reads the output, not the exit status
alone.
"""

from __future__ import annotations

import re

import pytest

from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.testing.rocketmq import RocketMQ, program_lines

pytestmark = pytest.mark.interop

CLIENT = "trioha.interop.Client"
TOPIC = "AdminT"
GROUP = "admin_group"


@pytest.fixture(scope="module", params=["rocketmq_clients", "rocketmq5"])
def state(request, rocketmq_clients, tmp_path_factory):
    """Our cluster with 8 messages in TOPIC, all consumed by GROUP (offsets committed) through
    the 4.9.8 client, and the mqadmin of the parameter's version."""
    rocketmq = rocketmq_clients
    admin_peer: RocketMQ = request.getfixturevalue(request.param)
    run = tmp_path_factory.mktemp("mqadmin")
    config = ClusterConfig(data_dir=str(run / "ours"), master_port=free_broker_port())
    with ProcessCluster.start(config) as cluster:
        out = rocketmq.run_program(run / "producer", CLIENT, "produce", "--namesrv",
                                   cluster.namesrv_addr, "--topic", TOPIC, "--count", 8)
        sent = program_lines(out)[:-1]
        out = rocketmq.run_program(run / "consumer", CLIENT, "push", "--namesrv",
                                   cluster.namesrv_addr, "--topic", TOPIC, "--group", GROUP,
                                   "--expect", 8, "--idle-seconds", 3, "--max-seconds", 60)
        assert program_lines(out)[-1]["received"] == 8
        yield cluster, sent, run, admin_peer


def admin(state, *args: object) -> str:
    cluster, _, run, peer = state
    out = peer.mqadmin(run / "adm", *args[:1], "-n", cluster.namesrv_addr, *args[1:])
    assert "Exception" not in out, out
    return out


def test_cluster_list_topic_list_and_routes(state):
    cluster = state[0]
    out = admin(state, "clusterList")
    rows = [line.split() for line in out.splitlines()[1:] if line.strip()]
    assert sorted((r[0], r[1], r[2], r[3]) for r in rows) == [
        ("DefaultCluster", "broker-a", "0", cluster.master.addr),
        ("DefaultCluster", "broker-a", "1", cluster.slave.addr)]

    topics = admin(state, "topicList").split()
    assert TOPIC in topics and f"%RETRY%{GROUP}" in topics

    route = admin(state, "topicRoute", "-t", TOPIC)
    assert f'0:"{cluster.master.addr}"' in route and f'1:"{cluster.slave.addr}"' in route
    assert '"readQueueNums":4' in route and '"writeQueueNums":4' in route


def test_update_topic_then_status(state):
    cluster, sent = state[:2]
    out = admin(state, "updateTopic", "-c", "DefaultCluster", "-t", "AdminNew",
                "-r", 3, "-w", 3)
    assert f"create topic to {cluster.master.addr} success" in out
    route = admin(state, "topicRoute", "-t", "AdminNew")
    assert '"readQueueNums":3' in route and '"writeQueueNums":3' in route

    status = admin(state, "topicStatus", "-t", TOPIC)
    # (5.x adds a "Topic Put TPS" line after the table)
    rows = {int(r[1]): (int(r[2]), int(r[3]))
            for r in (line.split() for line in status.splitlines())
            if r and r[0] == "broker-a"}
    per_queue = {q: sum(1 for line in sent if line["queueId"] == q) for q in range(4)}
    assert rows == {q: (0, n) for q, n in per_queue.items()}


def test_broker_status_and_config(state):
    cluster = state[0]
    master = admin(state, "brokerStatus", "-b", cluster.master.addr)
    slave = admin(state, "brokerStatus", "-b", cluster.slave.addr)

    def field(text: str, name: str) -> str:
        match = re.search(rf"^{name}\s*: (.*)$", text, re.M)
        assert match, text
        return match.group(1).strip()
    assert field(master, "brokerRole") == "SYNC_MASTER"
    assert field(slave, "brokerRole") == "SLAVE"
    assert int(field(master, "commitLogMaxOffset")) > 0
    assert field(master, "commitLogMaxOffset") == field(slave, "commitLogMaxOffset")
    assert field(master, "msgPutTotalTodayNow") == "8"

    config = admin(state, "getBrokerConfig", "-b", cluster.master.addr)
    assert f"============{cluster.master.addr}============" in config
    values = dict(re.findall(r"^(\w+)\s+=  (.*)$", config, re.M))
    assert values["brokerRole"] == "SYNC_MASTER"
    assert values["brokerName"] == "broker-a"
    assert values["listenPort"] == cluster.master.addr.rsplit(":", 1)[1]
    assert values["mappedFileSizeCommitLog"] == str(1 << 20)


def test_consumer_progress(state):
    out = admin(state, "consumerProgress", "-g", GROUP)
    rows = [line.split() for line in out.splitlines() if line.startswith(TOPIC)]
    assert len(rows) == 4
    for row in rows:
        broker_offset, consumer_offset, diff = int(row[3]), int(row[4]), int(row[5])
        assert (consumer_offset, diff) == (broker_offset, 0)
    assert sum(int(row[3]) for row in rows) == 8
    assert "Diff Total: 0" in out


def test_query_messages_and_send(state):
    cluster, sent, _, peer = state
    first = sent[0]
    # 5.x's queryMsgById wants the topic too
    by_id = ("-t", TOPIC) if peer.major >= 5 else ()
    for args in (("queryMsgById", "-i", first["offsetMsgId"], *by_id),
                 ("queryMsgByOffset", "-t", TOPIC, "-b", "broker-a", "-i", first["queueId"],
                  "-o", first["queueOffset"])):
        out = admin(state, *args)
        assert f"OffsetID:            {first['offsetMsgId']}" in out
        assert f"Topic:               {TOPIC}" in out
        assert "Keys:                [key-0]" in out
        assert f"Queue ID:            {first['queueId']}" in out
        assert f"Queue Offset:        {first['queueOffset']}" in out
        assert f"Store Host:          {cluster.master.addr}" in out
        assert f"UNIQ_KEY={first['msgId']}" in out
        # The message track asks who consumes the topic and whether they are online.
        assert f"consumerGroup={GROUP}" in out

    out = admin(state, "sendMessage", "-t", TOPIC, "-p", "from-mqadmin")
    [row] = [line.split() for line in out.splitlines()[1:] if line.strip()]
    assert row[0] == "broker-a" and row[2] == "SEND_OK"
