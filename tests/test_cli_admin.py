"""The operator's commands through the real executable: a name server, a SYNC_MASTER and its
SLAVE started with ``trio-ha namesrv`` / ``trio-ha broker -c`` from conf files, then every
admin verb, ``status``, ``produce``, ``consume`` and ``message get`` against them, as tables
and as JSON."""

from __future__ import annotations

import json
import re
import select
import subprocess
import sys

import pytest

from conftest import cli, ok_json, stop_processes, wait_for

TOPIC = "CliOrders"
GROUP = "cli_billing"
#: each node's log file (--log-file), by role, filled by the cluster fixture
LOGS: dict = {}


def first_line(proc: subprocess.Popen, timeout: float = 60) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return proc.stdout.readline()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(namesrv address, master address, slave address) of a cluster of three processes."""
    root = tmp_path_factory.mktemp("cli_admin")
    procs: list[subprocess.Popen] = []

    def start(role, *args):
        LOGS[role] = root / f"{role}.log"
        proc = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", "--log-file",
                                 str(LOGS[role]), *args], cwd=root,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc

    try:
        namesrv = start("namesrv", "namesrv", "--port", "0", "--bind", "127.0.0.1")
        listening = re.fullmatch(r"name server listening on (\S+)\n", first_line(namesrv))
        assert listening
        namesrv_addr = listening[1]
        addresses = []
        for role, broker_id in (("SYNC_MASTER", 0), ("SLAVE", 1)):
            conf = root / f"{role.lower()}.conf"
            conf.write_text(
                f"brokerClusterName=CliCluster\nbrokerName=cli-broker\nbrokerId={broker_id}\n"
                f"brokerRole={role}\nlistenPort=0\nhaListenPort=0\nbindAddress=127.0.0.1\n"
                f"haBindAddress=127.0.0.1\nbrokerIP1=127.0.0.1\nvipChannelEnable=false\n"
                f"storePathRootDir={root / role.lower()}\nmappedFileSizeCommitLog=1048576\n"
                f"namesrvAddr={namesrv_addr}\n")
            broker = start(role, "broker", "-c", conf)
            serving = re.search(r"serving on (\S+), HA", first_line(broker))
            assert serving, f"the {role} did not start"
            addresses.append(serving[1])
        yield namesrv_addr, addresses[0], addresses[1]
    finally:
        stop_processes(procs)


def test_cluster_list_as_table_json_and_mqadmin_name(cluster):
    namesrv, master, slave = cluster
    rows = ok_json("admin", "cluster-list", "-n", namesrv)
    assert [(r["brokerName"], r["brokerId"], r["address"], r["role"]) for r in rows] == [
        ("cli-broker", 0, master, "SYNC_MASTER"), ("cli-broker", 1, slave, "SLAVE")]
    table = cli("admin", "clusterList", env_namesrv=namesrv)  # mqadmin's name, $NAMESRV_ADDR
    assert table.returncode == 0, table.stderr
    assert master in table.stdout and "SYNC_MASTER" in table.stdout and slave in table.stdout


def test_topics_produce_consume_progress_and_status(cluster):
    """Create a topic, send 30 messages, consume 10 of them as a group, see the lag at 20 in
    consumer-progress and status, consume the rest and see it reach zero; status shows the
    slave caught up with its master."""
    namesrv, master, slave = cluster
    created = ok_json("admin", "update-topic", "-n", namesrv, "-t", TOPIC, "-r", 4, "-w", 4)
    assert created == [{"topic": TOPIC, "brokerName": "cli-broker", "master": master}]
    assert {"topic": TOPIC} in ok_json("admin", "topic-list", "-n", namesrv)
    route = ok_json("admin", "topic-route", "-n", namesrv, "-t", TOPIC)
    assert [q["writeQueueNums"] for q in route["queueDatas"]] == [4]

    sent = ok_json("produce", "-n", namesrv, "-t", TOPIC, "-c", 30, "-k", "order-42",
                   "--tags", "paid")
    assert sent["sent"] == 30 and sent["statuses"] == {"SEND_OK": 30}
    status = ok_json("admin", "topic-status", "-n", namesrv, "-t", TOPIC)
    assert sum(q["maxOffset"] - q["minOffset"] for q in status) == 30 and len(status) == 4

    first = cli("consume", "-n", namesrv, "-t", TOPIC, "-g", GROUP, "-c", 10, "--json")
    assert first.returncode == 0, first.stderr
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert len(lines) == 10 and {m["keys"] for m in lines} == {"order-42"}
    progress = ok_json("admin", "consumer-progress", "-n", namesrv, "-g", GROUP)
    assert sum(r["lag"] for r in progress) == 20
    assert sum(r["brokerOffset"] for r in progress) == 30

    def snapshot_with(lag: int):
        snap = ok_json("status", "-n", namesrv)
        groups = {g["group"]: g for g in snap["groups"]}
        slave_row = next(b for b in snap["brokers"] if b["brokerId"] == 1)
        if GROUP in groups and groups[GROUP]["lag"] == lag and slave_row["lagBytes"] == 0:
            return snap
        return None

    snap = wait_for(lambda: snapshot_with(20), "status with the group's lag at 20")
    master_row, slave_row = snap["brokers"]
    assert master_row["role"] == "SYNC_MASTER" and slave_row["role"] == "SLAVE"
    assert slave_row["maxOffset"] == master_row["maxOffset"] > 0
    assert slave_row["haState"] and slave_row["divergence"] is None
    assert master_row["slaves"][0]["ackedOffset"] == master_row["maxOffset"]
    assert {
        k: v for k, v in next(t for t in snap["topics"] if t["topic"] == TOPIC).items()
        if k in ("topic", "queues", "messages")} == {"topic": TOPIC, "queues": 4, "messages": 30}

    rest = cli("consume", "-n", namesrv, "-t", TOPIC, "-g", GROUP, "-q", "--idle-seconds", 2)
    assert rest.returncode == 0 and "consumed 20 messages" in rest.stderr, rest.stderr
    wait_for(lambda: snapshot_with(0), "status with the group's lag at 0")
    table = cli("status", "-n", namesrv)
    assert table.returncode == 0 and GROUP in table.stdout and TOPIC in table.stdout


def test_message_lookups_by_offset_id_client_id_and_key(cluster):
    namesrv = cluster[0]
    sent = ok_json("produce", "-n", namesrv, "-t", TOPIC, "-b", "find me", "-k", "needle")
    last = sent["last"]
    by_offset = ok_json("message", "get", "-n", namesrv, last["offsetMsgId"])
    by_client = ok_json("message", "get", "-n", namesrv, last["msgId"], "-t", TOPIC)
    for found in (by_offset, by_client):
        assert len(found) == 1
        assert found[0]["body"] == "find me" and found[0]["keys"] == "needle"
        assert found[0]["offsetMsgId"] == last["offsetMsgId"] and found[0]["msgId"] == last["msgId"]
    single = ok_json("admin", "sendMessage", "-n", namesrv, "-t", TOPIC, "-p", "hello", "-k",
                     "needle")
    assert single["sent"] == 1 and single["statuses"] == {"SEND_OK": 1}
    by_key = ok_json("admin", "query-msg-by-key", "-n", namesrv, "-t", TOPIC, "-k", "needle")
    assert [m["offsetMsgId"] for m in by_key] == [last["offsetMsgId"],
                                                  single["last"]["offsetMsgId"]]
    table = cli("message", "get", "-n", namesrv, last["offsetMsgId"])
    assert table.returncode == 0 and "find me" in table.stdout


def test_broker_status_and_config(cluster):
    namesrv, master, slave = cluster
    runtime = {r["key"]: r["value"] for r in ok_json("admin", "broker-status", "-n", namesrv,
                                                      "-b", slave)}
    assert runtime["brokerRole"] == "SLAVE" and "haState" in runtime
    config = {r["key"]: r["value"] for r in ok_json("admin", "broker-config", "-n", namesrv,
                                                     "-b", master)}
    assert config["brokerName"] == "cli-broker" and config["brokerRole"] == "SYNC_MASTER"
    assert config["brokerClusterName"] == "CliCluster"


def test_failures_are_one_line_and_exit_1(cluster):
    namesrv = cluster[0]
    for args, words in (
        (("admin", "topic-route", "-n", namesrv, "-t", "NoSuchTopic"), "knows no topic"),
        (("admin", "consumer-connection", "-n", namesrv, "-g", "nobody_here"), "not online"),
        (("message", "get", "-n", namesrv, "00" * 16), "no message"),
        (("admin", "topic-list", "-n", "127.0.0.1:1"), "127.0.0.1:1"),
    ):
        done = cli(*args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("trio-ha: ") and words in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stdout == ""


def test_cluster_changes_topics_permissions_kv_and_broker_config(cluster):
    """The verbs that change a running cluster, each checked by reading the change back."""
    namesrv, master, _ = cluster
    assert {"topic": "CliTemp"} not in ok_json("admin", "topic-list", "-n", namesrv)
    ok_json("admin", "update-topic", "-n", namesrv, "-t", "CliTemp", "-r", 2, "-w", 2)
    assert {"topic": "CliTemp"} in ok_json("admin", "topic-list", "-n", namesrv,
                                           "-c", "CliCluster")
    assert ok_json("admin", "topic-list", "-n", namesrv, "-c", "NoSuchCluster") == []
    deleted = ok_json("admin", "deleteTopic", "-n", namesrv, "-t", "CliTemp")
    assert deleted == [{"topic": "CliTemp", "brokerName": "cli-broker", "master": master}]
    assert {"topic": "CliTemp"} not in ok_json("admin", "topic-list", "-n", namesrv)
    gone = cli("admin", "topic-route", "-n", namesrv, "-t", "CliTemp")
    assert gone.returncode == 1 and "knows no topic" in gone.stderr

    # TOPIC must exist here whichever worker runs this test: xdist may give this module's
    # tests to two workers, each with a cluster of its own (creating it again changes nothing)
    ok_json("admin", "update-topic", "-n", namesrv, "-t", TOPIC, "-r", 4, "-w", 4)
    wiped = ok_json("admin", "wipe-write-perm", "-n", namesrv, "-b", "cli-broker")
    assert wiped[0]["topics"] >= 1
    refused = cli("produce", "-n", namesrv, "-t", TOPIC)
    assert refused.returncode == 1, refused.stdout
    route = ok_json("admin", "topic-route", "-n", namesrv, "-t", TOPIC)
    assert [q["perm"] & 2 for q in route["queueDatas"]] == [0]  # no write bit
    restored = ok_json("admin", "add-write-perm", "-n", namesrv, "-b", "cli-broker")
    assert restored[0]["topics"] >= 1
    assert ok_json("produce", "-n", namesrv, "-t", TOPIC)["statuses"] == {"SEND_OK": 1}

    done = cli("admin", "update-kv-config", "-n", namesrv, "-s", "ORDER_TOPIC_CONFIG", "-k",
               TOPIC, "-v", "cli-broker:4")
    assert done.returncode == 0, done.stderr
    assert ok_json("admin", "kv-config", "-n", namesrv, "-s", "ORDER_TOPIC_CONFIG") == [
        {"key": TOPIC, "value": "cli-broker:4"}]
    done = cli("admin", "deleteKvConfig", "-n", namesrv, "-s", "ORDER_TOPIC_CONFIG", "-k", TOPIC)
    assert done.returncode == 0, done.stderr
    assert ok_json("admin", "kv-config", "-n", namesrv, "-s", "ORDER_TOPIC_CONFIG") == []
    settings = {r["key"]: r["value"] for r in ok_json("admin", "namesrv-config", "-n", namesrv)}
    assert settings["listenPort"] == "0"

    def broker_setting(key):
        rows = ok_json("admin", "broker-config", "-n", namesrv, "-b", master)
        return {r["key"]: r["value"] for r in rows}[key]

    assert broker_setting("autoCreateTopicEnable") == "true"
    done = cli("admin", "update-broker-config", "-n", namesrv, "-b", master, "-k",
               "autoCreateTopicEnable", "-v", "false")
    assert done.returncode == 0 and "autoCreateTopicEnable=false" in done.stdout, done.stderr
    assert broker_setting("autoCreateTopicEnable") == "false"
    refused = cli("admin", "update-broker-config", "-n", namesrv, "-b", master, "-k",
                  "listenPort", "-v", "1")
    assert refused.returncode == 1 and "listenPort" in refused.stderr, refused.stderr
    done = cli("admin", "updateBrokerConfig", "-n", namesrv, "-b", master, "-k",
               "autoCreateTopicEnable", "-v", "true")
    assert done.returncode == 0, done.stderr


def test_the_nodes_log_their_state_changes(cluster):
    """One line per change an operator cares about, each with its time and level:
    registration, the slave attaching, its master, connections, recovery."""
    namesrv, master, slave = cluster
    logs = {role: path.read_text() for role, path in LOGS.items()}
    for role in ("SYNC_MASTER", "SLAVE"):
        assert "recovered after a clean stop" in logs[role]
        assert f"registered with name server {namesrv}" in logs[role]
    assert re.search(r"INFO  trio_ha\.store\.ha\.master: HA: slave \S+ connected",
                     logs["SYNC_MASTER"])
    assert f"master of cli-broker is now {master}" in logs["SLAVE"]
    assert "HA: replicating from" in logs["SLAVE"]
    assert re.search(r"remoting: \S+ connected to", logs["namesrv"])
    for line in logs["SYNC_MASTER"].splitlines():
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} (DEBUG|INFO |WARNING|ERROR)",
                        line), line


def test_a_sync_master_without_an_attached_slave_is_not_ready():
    """The README's tour once went on from ``status --wait-ready`` before the slave had
    registered: the master alone looked ready, and the next 1000 sends answered
    SLAVE_NOT_AVAILABLE. A SYNC_MASTER is ready once its own report lists a slave."""
    from trio_ha.cli.status import not_ready

    master = {"brokerName": "broker-a", "brokerId": 0, "role": "SYNC_MASTER"}
    slave = {"brokerName": "broker-a", "brokerId": 1, "role": "SLAVE", "haState": "transfer",
             "lagBytes": 0}
    assert "without an attached slave" in str(not_ready({"brokers": [master]}))
    assert "without an attached slave" in str(not_ready({"brokers": [master, slave]}))
    attached = {**master, "slaves": [{"address": "127.0.0.1:1", "ackedOffset": 0,
                                      "lagBytes": 0}]}
    assert not_ready({"brokers": [attached, slave]}) is None
    assert not_ready({"brokers": [{**master, "role": "ASYNC_MASTER"}]}) is None
    assert "not caught up" in str(not_ready({"brokers": [attached, {**slave, "lagBytes": 9}]}))
