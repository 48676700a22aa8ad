"""Issue 39: two real RocketMQ 5.3.3 brokers in controller mode, and mqadmin, against OUR
controller (a child process; our name server). The first broker is elected master, the second
joins its in-sync set; mqadmin's controller verbs read and drive our controller
(getControllerMetaData, getSyncStateSet, getBrokerEpoch); electMaster switches the master role
to the second broker; that master is SIGKILLed and our controller makes the first one master
again; cleanBrokerMetadata forgets the dead one; the real Java client sends to the master.
"""

from __future__ import annotations

import os
import time

import pytest

from trio_ha.testing import free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess
from trio_ha.testing.rocketmq import program_lines

pytestmark = pytest.mark.interop

CLUSTER = "RealOnOurs"
BROKER_NAME = "broker-r"
CLIENT = "trioha.interop.Client"


def admin_table(rocketmq5, run_dir, *args: object) -> dict[str, str]:
    """mqadmin's ``#key\\tvalue`` lines."""
    out = rocketmq5.mqadmin(run_dir, *args)
    return dict(line[1:].split("\t", 1) for line in out.splitlines()
                if line.startswith("#") and "\t" in line)


def wait_for(rocketmq5, run_dir, controller: str, master: str, members: int,
             timeout: float) -> dict[str, str]:
    """Until mqadmin getSyncStateSet shows ``master`` with ``members`` in sync."""
    deadline = time.monotonic() + timeout
    shown: dict[str, str] = {}
    for attempt in range(1000):  # bounded by the deadline too
        shown = admin_table(rocketmq5, f"{run_dir}-{attempt}", "getSyncStateSet", "-a",
                            controller, "-b", BROKER_NAME)
        if shown.get("MasterAddr") == master and shown.get("SyncStateSetNums") == str(members):
            return shown
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    pytest.fail(f"{master} not master of {members} within {timeout:g} s: {shown}")


def test_real_brokers_and_mqadmin_under_our_controller(rocketmq5, tmp_path):
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    ports = [free_broker_port() for _ in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes: list[NodeProcess] = []
    java = []
    try:
        ctl = NodeProcess.start("ctl", {"kind": "controller", "log_level": "INFO",
                                        "properties": {"controllerType": "memory"}},
                                log_dir=logs)
        nodes.append(ctl)
        controller = ctl.addr
        namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                    log_dir=logs)
        nodes.append(namesrv)

        def broker(i: int):
            process = rocketmq5.start_broker(tmp_path / f"b{i}", {
                "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME,
                "listenPort": ports[i], "namesrvAddr": namesrv.addr,
                "enableControllerMode": True, "controllerAddr": controller,
                "haSendHeartbeatInterval": 1000, "checkSyncStateSetPeriod": 1000,
                "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxHashSlotNum": 1000,
                "maxIndexNum": 4000}, name=f"b{i}")
            java.append(process)
            return process

        broker(0)
        wait_for(rocketmq5, tmp_path / "w1", controller, addrs[0], 1, 30)
        second = broker(1)
        shown = wait_for(rocketmq5, tmp_path / "w2", controller, addrs[0], 2, 60)
        assert (shown["brokerName"], shown["MasterBrokerId"], shown["MasterEpoch"]) == \
            (BROKER_NAME, "1", "1"), shown

        meta = admin_table(rocketmq5, tmp_path / "meta", "getControllerMetaData", "-a",
                           controller)
        assert (meta["ControllerLeaderId"], meta["ControllerLeaderAddress"]) == \
            ("n0", controller), meta
        epochs = rocketmq5.mqadmin(tmp_path / "epochs", "getBrokerEpoch", "-n", namesrv.addr,
                                   "-b", BROKER_NAME)
        assert epochs.count("EpochEntry{epoch=1, startOffset=0") == 2, epochs

        # an admin's switch-over: broker 2 is made master while both live; broker 1 follows
        # it and is taken back into its in-sync set
        rocketmq5.mqadmin(tmp_path / "elect", "electMaster", "-a", controller, "-c", CLUSTER,
                          "-bn", BROKER_NAME, "-b", 2)
        shown = wait_for(rocketmq5, tmp_path / "w3", controller, addrs[1], 2, 60)
        assert (shown["MasterBrokerId"], shown["MasterEpoch"]) == ("2", "2"), shown

        second.kill()  # the master now: our controller elects broker 1
        shown = wait_for(rocketmq5, tmp_path / "w4", controller, addrs[0], 1, 30)
        assert (shown["MasterBrokerId"], shown["MasterEpoch"]) == ("1", "3"), shown
        rocketmq5.mqadmin(tmp_path / "clean", "cleanBrokerMetadata", "-a", controller,
                          "-c", CLUSTER, "-bn", BROKER_NAME, "-b", 2)
        out = rocketmq5.mqadmin(tmp_path / "after-clean", "getSyncStateSet", "-a",
                                controller, "-b", BROKER_NAME)
        assert addrs[1] not in out and addrs[0] in out, out

        out = rocketmq5.run_program(tmp_path / "producer", CLIENT, "produce", "--namesrv",
                                    namesrv.addr, "--topic", "OurCtlT", "--count", 10)
        assert program_lines(out)[-1] == {"done": True, "count": 10, "errors": 0}, out[-3000:]
    finally:
        for process in java:
            process.kill()
        for node in reversed(nodes):
            node.kill()
