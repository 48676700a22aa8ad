"""The operator's tools with a broker group's master down (issue 36, defect 2), through real
processes: a name server, a SYNC_MASTER and its SLAVE (``ProcessCluster``) and the
``trio-ha`` executable. Produce, consume part of it as a group, SIGKILL the master: then
``admin consumer-progress``, ``admin topic-status`` and ``status`` show the slave's figures,
marked as the slave's; with the slave killed too, they say the figures are unknown, never 0.

``message get`` by offsetMsgId and ``admin consumer-connection`` fall back to the slave the
same way (a slave holds the master's commitlog byte for byte; consumers heartbeat slaves).

Also, from defect 3, ``status`` never shows a lag (``lag 0 B``) beside ``DIVERGED``."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys

import trio

from conftest import cli, ok_json, wait_for
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, ProcessCluster
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.stats import ConsumeStats

TOPIC = "MasterDownOrders"
GROUP = "master_down_billing"
#: a consumer group that stays connected through the outage (consumer-connection)
WATCHERS = "master_down_watchers"
SENT = 50
CONSUMED = 20
KEY = "order-7"


def ok(*args) -> subprocess.CompletedProcess:
    done = cli(*args)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def slave_stats(slave_addr: str) -> ConsumeStats | None:
    """What the slave itself says of the group (GET_CONSUME_STATS asked of it directly)."""

    async def ask() -> ConsumeStats | None:
        async with open_remoting_client(slave_addr) as client:
            reply = await client.invoke(RemotingCommand.request(
                RequestCode.GET_CONSUME_STATS, {"consumerGroup": GROUP}), 5)
        return ConsumeStats.decode(reply.body) if reply.code == ResponseCode.SUCCESS else None

    return trio.run(ask)


def slave_connections(slave_addr: str) -> dict | None:
    """What the slave itself says of the watchers (GET_CONSUMER_CONNECTION_LIST)."""

    async def ask() -> dict | None:
        async with open_remoting_client(slave_addr) as client:
            reply = await client.invoke(RemotingCommand.request(
                RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": WATCHERS}), 5)
        return json.loads(reply.body) if reply.code == ResponseCode.SUCCESS else None

    return trio.run(ask)


def stopped(node) -> contextlib.AbstractContextManager:
    """SIGSTOP ``node`` for the block: a broker that hangs, as a machine gone without closing
    its connections does (the name server keeps listing it for up to 120 s)."""

    @contextlib.contextmanager
    def hold():
        node.process.send_signal(signal.SIGSTOP)
        try:
            yield
        finally:
            if node.poll() is None:
                node.process.send_signal(signal.SIGCONT)

    return hold()


def assert_from_the_slave(namesrv: str, slave_addr: str, lag: int) -> None:
    """consumer-progress, topic-status and status show the slave's figures, marked so."""
    rows = ok_json("admin", "consumer-progress", "-n", namesrv, "-g", GROUP)
    assert sum(r["lag"] for r in rows) == lag
    assert {(r["source"], r["sourceAddress"]) for r in rows} == {("slave", slave_addr)}
    table = ok("admin", "consumerProgress", "-n", namesrv, "-g", GROUP).stdout
    assert f"lag {lag} messages" in table and "from a slave" in table, table

    rows = ok_json("admin", "topic-status", "-n", namesrv, "-t", TOPIC)
    assert len(rows) == 4 and sum(r["maxOffset"] - r["minOffset"] for r in rows) == SENT
    assert {r["source"] for r in rows} == {"slave"}
    assert "from a slave" in ok("admin", "topic-status", "-n", namesrv, "-t", TOPIC).stdout

    snap = ok_json("status", "-n", namesrv)
    topic = next(t for t in snap["topics"] if t["topic"] == TOPIC)
    assert (topic["queues"], topic["messages"], topic["source"]) == (4, SENT, "slave")
    group = next(g for g in snap["groups"] if g["group"] == GROUP)
    assert (group["lag"], group["source"]) == (lag, "slave")
    text = ok("status", "-n", namesrv).stdout
    assert "slave of broker-a" in text and "None" not in text, text
    # (and a lookup by key reads the slave's index, as mqadmin queryMsgByKey does)
    found = ok_json("admin", "query-msg-by-key", "-n", namesrv, "-t", TOPIC, "-k", KEY,
                    "--max", 64)
    assert len(found) == SENT


def assert_message_and_watchers_from_the_slave(namesrv: str, slave_addr: str,
                                                message_id: str) -> None:
    """``message get`` by offsetMsgId reads the slave's copy, saying so; consumer-connection
    lists the connected watcher from the slave."""
    done = ok("message", "get", "-n", namesrv, message_id, "--json")
    [row] = json.loads(done.stdout)
    assert (row["offsetMsgId"], row["keys"]) == (message_id, KEY), row
    assert f"read from the slave {slave_addr} of broker-a" in done.stderr, done.stderr
    body = ok_json("admin", "consumer-connection", "-n", namesrv, "-g", WATCHERS)
    assert (body["source"], body["sourceAddress"]) == ("slave", slave_addr), body
    assert len(body["connectionSet"]) == 1, body
    table = " ".join(ok("admin", "consumer-connection", "-n", namesrv, "-g",
                        WATCHERS).stdout.split())  # (a long title wraps)
    assert f"from the slave {slave_addr} of broker-a" in table, table


def assert_unknown(namesrv: str) -> None:
    """No broker of the group answers: the three commands say unknown, never 0 or none."""
    for args, words in ((("admin", "consumer-progress", "-g", GROUP), "lag of"),
                        (("admin", "topic-status", "-t", TOPIC), "status of")):
        done = cli(*args, "-n", namesrv)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert done.stderr.startswith("trio-ha: ") and words in done.stderr, done.stderr
        assert "unknown" in done.stderr and done.stdout == "", done.stderr
    text = ok("status", "-n", namesrv).stdout
    assert "unknown" in text and "lag 0" not in text and "None" not in text, text
    snap = ok_json("status", "-n", namesrv)
    assert all(g["lag"] is None for g in snap["groups"]), snap
    assert all(t.get("messages") is None for t in snap["topics"]), snap


def test_tools_fall_back_to_the_slave_while_the_master_is_down_and_never_say_no_lag(tmp_path):
    config = ClusterConfig(data_dir=tmp_path, slaves=1, properties=dict(
        mappedFileSizeCommitLog=1048576, slaveSyncInterval=500))
    with ProcessCluster.start(config) as cluster:
        namesrv, slave_addr = cluster.namesrv_addr, cluster.slave.addr
        ok("admin", "update-topic", "-n", namesrv, "-t", TOPIC, "-r", 4, "-w", 4)
        assert ok_json("produce", "-n", namesrv, "-t", TOPIC, "-c", SENT, "-k",
                       KEY)["sent"] == SENT
        idle = ok("admin", "consumer-progress", "-n", namesrv, "-g", "never_consumed").stdout
        assert "committed none" in idle and "lag 0" not in idle, idle  # known, but no lag
        consumed = ok("consume", "-n", namesrv, "-t", TOPIC, "-g", GROUP, "-c", CONSUMED, "-q")
        assert f"consumed {CONSUMED} messages" in consumed.stderr

        # The slave has copied the messages and (slaveSyncInterval) the group's offsets.
        def slave_caught_up():
            stats = slave_stats(slave_addr)
            return stats is not None and (
                sum(q.broker_offset for q in stats.queues) == SENT
                and sum(q.consumer_offset for q in stats.queues) == CONSUMED) and stats

        lag = wait_for(slave_caught_up, "the slave to hold the messages and offsets").lag
        assert lag == SENT - CONSUMED
        [stored] = ok_json("admin", "query-msg-by-key", "-n", namesrv, "-t", TOPIC, "-k", KEY,
                           "--max", 1)
        message_id = stored["offsetMsgId"]
        assert ok_json("message", "get", "-n", namesrv, message_id)[0]["keys"] == KEY

        # A consumer that stays connected (it heartbeats the master and the slave).
        watcher = subprocess.Popen(
            [sys.executable, "-m", "trio_ha.cli", "consume", "-n", namesrv, "-t", TOPIC,
             "-g", WATCHERS, "--from", "last", "--idle-seconds", "600", "-q"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            watch_and_fail_over(cluster, namesrv, slave_addr, lag, message_id)
        finally:
            watcher.kill()
            watcher.wait(30)


def watch_and_fail_over(cluster, namesrv: str, slave_addr: str, lag: int,
                        message_id: str) -> None:
    def watcher_on_the_slave():
        body = slave_connections(slave_addr)
        return body is not None and len(body.get("connectionSet", [])) == 1

    wait_for(watcher_on_the_slave, "the watcher's heartbeat to reach the slave")
    # The master hangs: the name server still lists it, it does not answer.
    with stopped(cluster.master):
        rows = ok_json("admin", "consumer-progress", "-n", namesrv, "-g", GROUP)
        assert sum(r["lag"] for r in rows) == lag
        assert {(r["source"], r["sourceAddress"]) for r in rows} == {("slave", slave_addr)}
        # ... and the slave too: the group is listed, and nobody answers for it.
        with stopped(cluster.slave):
            done = cli("admin", "consumer-progress", "-n", namesrv, "-g", GROUP)
            assert done.returncode == 1 and done.stdout == "", done.stdout
            assert "lag of" in done.stderr and "unknown" in done.stderr, done.stderr
            text = ok("status", "-n", namesrv).stdout
            assert "unknown" in text and "lag 0" not in text and "None" not in text, text
            snap = ok_json("status", "-n", namesrv)
            assert snap["groupsUnknownFor"] == ["broker-a"]
            assert [t["source"] for t in snap["topics"] if t["topic"] == TOPIC] == [
                "unknown"]
        # A message by id and the watchers, from the slave while the master hangs.
        assert_message_and_watchers_from_the_slave(namesrv, slave_addr, message_id)

    # The master killed: the name server drops it at once (its connection closed).
    cluster.master.kill()
    assert_from_the_slave(namesrv, slave_addr, lag)
    assert_message_and_watchers_from_the_slave(namesrv, slave_addr, message_id)

    # The whole group down: the name server lists no broker at all.
    cluster.slave.kill()
    assert_unknown(namesrv)


def test_status_never_shows_a_lag_beside_diverged():
    """A slave whose log ends past its master's has a computed lag of 0 bytes: shown beside
    DIVERGED it read as "caught up". The line says DIVERGED and no lag."""
    from trio_ha.cli.status import _print_status

    slave = {"cluster": "c", "brokerName": "broker-a", "brokerId": 1, "address": "127.0.0.1:1",
             "role": "SLAVE", "minOffset": 0, "maxOffset": 3970931, "putTps": "0 0 0",
             "error": None, "haState": "diverged", "haMaster": "127.0.0.1:2",
             "divergence": "this slave's log ends at 3970931, beyond the master's",
             "lagBytes": 0, "lagSeconds": 0.0}
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_status({"time": "now", "brokers": [slave], "topics": [], "groups": [],
                       "truncated": False})
    assert "DIVERGED" in out.getvalue() and "lag 0 B" not in out.getvalue(), out.getvalue()
