"""Issue 39: `trio-ha status` and the Prometheus series of a controller-mode cluster.

One cluster for the module, every node a real process: a name server embedding our controller
(its journal on disk, its metrics on a port) and three of our brokers in controller mode, each
with a metrics port. `status` (JSON and table) must show the group's master, both epochs, the
in-sync set with addresses, and the controller leader, learned from the brokers' own
controllerAddr or from --controller; the brokers' and the controller's series must say the
same. Then the master is SIGKILLed: the status and the series follow the election. A classic
cluster's status has no controller part.

Each test waits for the set to be settled (a master, all three in sync) first, so none depends
on another having run; the failover test restarts the broker it killed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import attrs
import pytest
import trio

from conftest import wait_for, wait_until
from test_metrics import scrape, value
from trio_ha.client import Message, MQError, SendStatus, open_admin, open_producer
from trio_ha.testing import ClusterConfig, free_broker_port, open_cluster
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess, child_env
from trio_ha.wire.controller import ReplicasInfo

CLUSTER = "StatusCtl"
NAME = "broker-s"
TOPIC = "StatusCtlTopic"


@attrs.define(eq=False)
class Running:
    namesrv: NodeProcess
    controller: str
    controller_metrics: str
    brokers: list[NodeProcess]
    logs: str

    def broker_at(self, address: str) -> NodeProcess:
        return next(b for b in self.brokers if b.addr == address)


async def set_info(namesrv: str, controller: str) -> ReplicasInfo | None:
    async with open_admin(namesrv) as admin:
        return (await admin.sync_state_data(controller, [NAME])).replicas_info_table.get(NAME)


async def send_some(namesrv: str, count: int) -> None:
    """``count`` messages answered SEND_OK: a slave joins the in-sync set only once it
    acknowledged what the master holds, which an empty log never asks of it."""
    async with open_producer(namesrv, "status-writer", send_msg_timeout=3.0) as producer:
        for i in range(count):
            await wait_until(lambda i=i: sent_ok(producer, i), f"SEND_OK for message {i}",
                             timeout=30, interval=0.2)


async def sent_ok(producer, i: int) -> bool:
    try:
        result = await producer.send(Message(TOPIC, b"status-%d" % i))
    except MQError:
        return False
    return result.send_status is SendStatus.SEND_OK


def settled(cluster: Running) -> ReplicasInfo:
    """Wait until the set has a master and all three brokers in its in-sync set."""
    def check() -> ReplicasInfo | None:
        info = trio.run(set_info, cluster.namesrv.addr, cluster.controller)
        ok = (info is not None and info.master_address is not None
              and len(info.in_sync_replicas) == 3 and not info.not_in_sync_replicas
              and all(r.alive for r in info.in_sync_replicas))
        return info if ok else None
    return wait_for(check, "a master with all three brokers in sync", attempts=120, pause=0.25)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("ctl-status")
    logs = str(root / "logs")
    os.makedirs(logs)
    ctl_port, metrics_port = free_broker_port(), free_broker_port()
    nodes: list[NodeProcess] = []
    brokers: list[NodeProcess] = []  # the failover test replaces the one it restarts
    try:
        namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port(),
                                           "log_level": "INFO", "properties": {
            "enableControllerInNamesrv": "true", "controllerType": "journal",
            "controllerStorePath": str(root / "controller"),
            "controllerListenPort": str(ctl_port), "controllerMetricsPort": str(metrics_port),
            "kvConfigPath": str(root / "kv.json")}}, log_dir=logs)
        nodes.append(namesrv)
        controller = f"127.0.0.1:{ctl_port}"
        for i in range(3):
            port = free_broker_port()
            brokers.append(NodeProcess.start(f"b{i}", {"kind": "broker", "log_level": "INFO",
                                                       "properties": {
                "brokerClusterName": CLUSTER, "brokerName": NAME, "brokerIP1": "127.0.0.1",
                "bindAddress": "127.0.0.1", "listenPort": str(port),
                "namesrvAddr": namesrv.addr, "enableControllerMode": "true",
                "controllerAddr": controller, "storePathRootDir": str(root / f"b{i}"),
                "mappedFileSizeCommitLog": str(DEFAULT_SEGMENT_SIZE), "metricsPort": "0",
                "autoCreateTopicEnable": "true", "checkSyncStateSetPeriod": "1000",
            }}, log_dir=logs))
            nodes.append(brokers[-1])
        running = Running(namesrv, controller, f"127.0.0.1:{metrics_port}", brokers, logs)
        trio.run(send_some, namesrv.addr, 10)
        settled(running)
        yield running
    finally:
        for node in [*brokers, *reversed(nodes)]:
            node.kill()


def status(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trio_ha.cli", "status", *args],
                          capture_output=True, text=True, env=child_env(), timeout=120)


def status_json(cluster: Running, *args: str) -> dict:
    result = status("-n", cluster.namesrv.addr, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_status_json_shows_the_master_epochs_in_sync_set_and_leader(cluster):
    info = settled(cluster)
    snapshot = status_json(cluster)  # the controller found through the brokers' config
    view = snapshot["controller"]
    assert view["addresses"] == [cluster.controller] and view["error"] is None
    assert view["leader"] == cluster.controller and view["leaderId"]
    [group] = view["groups"]
    registered = {b["brokerId"]: b["address"] for b in snapshot["brokers"]}
    assert group["brokerName"] == NAME
    assert group["masterAddress"] == registered[0] == info.master_address
    assert group["masterBrokerId"] == info.master_broker_id
    assert group["masterEpoch"] == info.master_epoch >= 1
    assert group["syncStateSetEpoch"] == info.sync_state_set_epoch >= 1
    assert sorted(r["address"] for r in group["inSync"]) == sorted(b.addr for b in
                                                                   cluster.brokers)
    assert sorted(r["brokerId"] for r in group["inSync"]) == [1, 2, 3]
    assert all(r["alive"] for r in group["inSync"]) and group["notInSync"] == []

    named = status_json(cluster, "--controller", cluster.controller)
    assert named["controller"]["groups"] == view["groups"]
    dead = f"127.0.0.1:{free_broker_port()}"
    unreachable = status_json(cluster, "--controller", dead)
    assert unreachable["controller"]["addresses"] == [dead]
    assert dead in unreachable["controller"]["error"]
    assert len(unreachable["brokers"]) == 3  # the rest of the status is there


def test_status_table_shows_the_controller_view(cluster):
    info = settled(cluster)
    result = status("-n", cluster.namesrv.addr)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"controller mode: leader {cluster.controller}" in out
    rows = [line for line in out.splitlines()
            if f" {info.master_epoch} / {info.sync_state_set_epoch} " in line]
    assert len(rows) == 1, out
    assert f"{info.master_broker_id} {info.master_address}" in rows[0]
    assert all(b.addr in rows[0] for b in cluster.brokers), rows[0]


async def scrape_all(cluster: Running) -> tuple[dict[str, dict], dict]:
    brokers = {b.addr: await scrape(b.info["metrics_addr"]) for b in cluster.brokers}
    return brokers, await scrape(cluster.controller_metrics)


def test_brokers_and_controller_export_epoch_set_size_and_elections(cluster):
    info = settled(cluster)
    brokers, controller = trio.run(scrape_all, cluster)
    ids = set()
    for address, samples in brokers.items():
        labels = {"cluster": CLUSTER, "brokerName": NAME}
        assert value(samples, "trio_ha_broker_master_epoch", **labels) == info.master_epoch
        assert value(samples, "trio_ha_broker_role_changes_total", **labels) >= 1
        ids.add(samples["trio_ha_broker_master_epoch"][0].labels["brokerId"])
        if address == info.master_address:
            assert value(samples, "trio_ha_broker_in_sync_replicas", **labels) == 3
            assert value(samples, "trio_ha_broker_sync_state_set_epoch",
                         **labels) == info.sync_state_set_epoch
        else:
            assert "trio_ha_broker_in_sync_replicas" not in samples
    assert ids == {"1", "2", "3"}  # the controller's ids, not the config's -1
    assert value(controller, "trio_ha_controller_set_master_epoch",
                 brokerName=NAME) == info.master_epoch
    assert value(controller, "trio_ha_controller_set_sync_state_set_epoch",
                 brokerName=NAME) == info.sync_state_set_epoch
    assert value(controller, "trio_ha_controller_set_in_sync_replicas", brokerName=NAME) == 3
    assert value(controller, "trio_ha_controller_set_has_master", cluster=CLUSTER) == 1
    assert value(controller, "trio_ha_controller_elections_total") >= 1


def test_a_failover_shows_in_status_and_metrics(cluster):
    before = settled(cluster)
    brokers, controller = trio.run(scrape_all, cluster)
    changes = {a: value(s, "trio_ha_broker_role_changes_total") for a, s in brokers.items()}
    elections = value(controller, "trio_ha_controller_elections_total")
    assert before.master_address is not None
    victim = cluster.broker_at(before.master_address)
    victim.kill()
    try:
        def elected() -> ReplicasInfo | None:
            info = trio.run(set_info, cluster.namesrv.addr, cluster.controller)
            ok = (info is not None and info.master_epoch > before.master_epoch
                  and info.master_address not in (None, victim.addr))
            return info if ok else None
        after = wait_for(elected, "a new master", attempts=120, pause=0.25)
        new_master = after.master_address
        assert new_master is not None
        trio.run(send_some, cluster.namesrv.addr, 5)  # for the other survivor to rejoin the set

        def shown() -> dict | None:
            view = status_json(cluster)["controller"]
            [group] = view["groups"] or [None]
            return group if group and group["masterEpoch"] == after.master_epoch else None
        group = wait_for(shown, "status showing the new master", attempts=20, pause=0.5)
        assert group["masterAddress"] == new_master != victim.addr
        assert victim.addr not in {r["address"] for r in group["inSync"]}

        survivors = [b for b in cluster.brokers if b is not victim]

        async def new_series() -> dict[str, dict]:
            return {b.addr: await scrape(b.info["metrics_addr"]) for b in survivors}

        def followed() -> dict[str, dict] | None:
            # both survivors at the new epoch, and the other one back in the new master's
            # in-sync set (the election leaves the new master alone in it)
            scraped = trio.run(new_series)
            ok = (all(value(s, "trio_ha_broker_master_epoch") == after.master_epoch
                      for s in scraped.values())
                  and value(scraped[new_master],
                            "trio_ha_broker_in_sync_replicas") == 2)
            return scraped if ok else None
        scraped = wait_for(followed, "the survivors at the new epoch, both in sync",
                           attempts=80, pause=0.25)
        for address, samples in scraped.items():
            # one election: one role change each (the elected one and the one that follows)
            assert value(samples, "trio_ha_broker_role_changes_total") == changes[address] + 1
        controller_after = trio.run(scrape, cluster.controller_metrics)
        assert value(controller_after, "trio_ha_controller_elections_total") == elections + 1
        assert value(controller_after, "trio_ha_controller_set_master_epoch",
                     brokerName=NAME) == after.master_epoch
        assert value(controller_after, "trio_ha_controller_set_in_sync_replicas",
                     brokerName=NAME) == 2
    finally:
        cluster.brokers[cluster.brokers.index(victim)] = NodeProcess.start(
            victim.name, victim.spec, log_dir=cluster.logs)
    settled(cluster)  # the old master rejoined: the module's cluster is whole again


async def test_a_classic_cluster_status_has_no_controller_part(tmp_path):
    from trio_ha.cli.status import cluster_status

    async with open_cluster(ClusterConfig(data_dir=str(tmp_path))) as running:
        snapshot = await cluster_status(running.namesrv_addr)
    assert "controller" not in snapshot
    assert {b["role"] for b in snapshot["brokers"]} == {"SYNC_MASTER", "SLAVE"}
