"""Issue 39: our controller with two of our brokers in controller mode, every node a real
process (no Java). The first broker becomes master, the second its slave, and the in-sync set
grows to two; the master is SIGKILLed, our controller elects the slave (its connection closed:
at once), sends succeed again through the name server and nothing acknowledged is lost; the
old master restarts and rejoins as a slave. A paused (SIGSTOPped) master is replaced at its
heartbeat timeout. Then `trio-ha controller` and `trio-ha namesrv` with
enableControllerInNamesrv, as an operator runs them.

The same checks, with the same helpers, as tests/test_interop_controller_brokers.py, which runs
our brokers under the real 5.3.3 controller: here the controller is ours.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import trio

from test_interop_controller_brokers import (
    BROKER_NAME,
    CLUSTER,
    TOPIC,
    bodies_in,
    broker_spec,
    send_some,
    wait_master,
)
from trio_ha.client import Message, MQError, open_producer
from trio_ha.remoting import open_remoting_client
from trio_ha.testing import free_broker_port
from trio_ha.testing.processes import NodeProcess, child_env
from trio_ha.wire.remoting import RemotingCommand, RequestCode


async def first_send_ok(namesrv: str, timeout: float) -> bytes:
    """Send until one is answered SEND_OK (a failover under way refuses the others)."""
    async with open_producer(namesrv, "ctlOwnFirst", send_msg_timeout=2.0,
                             retry_times_when_send_failed=0) as producer:
        with trio.fail_after(timeout):
            for i in range(100_000):  # bounded by the deadline too
                body = f"after-kill-{i}".encode()
                try:
                    await producer.send(Message(TOPIC, body))
                    return body
                except MQError:
                    await trio.sleep(0.05)
    raise AssertionError("no send answered")


def test_our_brokers_fail_over_under_our_controller(tmp_path):
    """Our controller (its journal on disk) and two of our brokers: the first is master, the
    second joins; the master is SIGKILLed and the slave elected; then the controller itself
    is SIGKILLed and started again on its journal: it knows the set's ids and epoch, so the old
    master, restarted, rejoins as a slave of the new one and the set grows back to two."""
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    ports = [free_broker_port() for _ in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    roots = [str(tmp_path / f"b{i}") for i in range(2)]
    nodes: list[NodeProcess] = []
    try:
        ctl_port = free_broker_port()
        ctl_spec = {"kind": "controller", "log_level": "INFO", "properties": {
            "controllerType": "journal", "controllerStorePath": str(tmp_path / "ctl"),
            "listenPort": str(ctl_port)}}
        controller_node = NodeProcess.start("ctl", ctl_spec, log_dir=logs)
        nodes.append(controller_node)
        controller = controller_node.addr
        namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                    log_dir=logs)
        nodes.append(namesrv)
        brokers: list[NodeProcess | None] = [None, None]

        def start(i: int) -> NodeProcess:
            node = NodeProcess.start(f"b{i}", broker_spec(roots[i], ports[i], namesrv.addr,
                                                          controller), log_dir=logs)
            brokers[i] = node
            nodes.append(node)
            return node

        start(0)
        assert trio.run(wait_master, controller, addrs[0], 1, 30.0) == 1
        with open(os.path.join(roots[0], "brokerIdentity")) as identity:
            assert identity.read() == f"{CLUSTER}#{BROKER_NAME}#1"
        start(1)
        acked = trio.run(send_some, namesrv.addr, 20, "before")
        trio.run(wait_master, controller, addrs[0], 2, 30.0)
        acked += trio.run(send_some, namesrv.addr, 20, "in-sync")

        master = brokers[0]
        assert master is not None
        master.kill()  # SIGKILL: its connection to the controller closes
        assert trio.run(wait_master, controller, addrs[1], 1, 30.0) == 2
        acked.append(trio.run(first_send_ok, namesrv.addr, 30.0))
        acked += trio.run(send_some, namesrv.addr, 10, "after")

        controller_node.kill()  # the controller crashes; it comes back on its journal
        nodes.append(NodeProcess.start("ctl2", ctl_spec, log_dir=logs))
        assert trio.run(wait_master, controller, addrs[1], 1, 30.0) == 2
        start(0)  # the old master comes back as a slave of the new one
        acked += trio.run(send_some, namesrv.addr, 10, "rejoin")
        trio.run(wait_master, controller, addrs[1], 2, 30.0)
        assert not set(acked) - trio.run(bodies_in, namesrv.addr)
    finally:
        for node in reversed(nodes):
            node.kill()


def test_namesrv_embeds_a_controller_on_its_own_port(tmp_path):
    """`trio-ha namesrv` with enableControllerInNamesrv serves the controller on the self
    peer's port of controllerDLegerPeers, as RocketMQ's NamesrvStartup does."""
    ns_port, ctl_port = free_broker_port(), free_broker_port()
    conf = tmp_path / "namesrv.conf"
    conf.write_text(f"listenPort={ns_port}\nbindAddress=127.0.0.1\n"
                    "enableControllerInNamesrv=true\ncontrollerType=memory\n"
                    f"controllerDLegerGroup=group1\n"
                    f"controllerDLegerPeers=n0-127.0.0.1:{ctl_port}\n"
                    f"controllerDLegerSelfId=n0\nkvConfigPath={tmp_path / 'kv.json'}\n")
    process = subprocess.Popen([sys.executable, "-m", "trio_ha.cli", "namesrv", "-c", str(conf)],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               env=child_env(), cwd=tmp_path)
    try:
        assert process.stdout is not None
        lines = []
        for _ in range(50):  # bounded: the two readiness lines come first
            line = process.stdout.readline().decode()
            lines.append(line)
            if not line or line.startswith("name server listening"):
                break
        assert f"controller (embedded) listening on 127.0.0.1:{ctl_port}\n" in lines, lines

        async def ask() -> RemotingCommand:
            async with open_remoting_client(f"127.0.0.1:{ctl_port}") as client:
                return await client.invoke(RemotingCommand.request(
                    RequestCode.CONTROLLER_GET_METADATA_INFO), 5)
        meta = trio.run(ask)
        assert meta.ext_fields["isLeader"] == "true"
        assert meta.ext_fields["controllerLeaderAddress"] == f"127.0.0.1:{ctl_port}"
        assert meta.ext_fields["group"] == "group1"
        assert meta.ext_fields["peers"] == f"n0:127.0.0.1:{ctl_port};"
    finally:
        process.terminate()
        process.wait(30)
        if process.stdout is not None:
            process.stdout.close()


def test_cli_controller_reads_a_rocketmq_controller_conf_and_serves(tmp_path):
    """`trio-ha controller -c` takes RocketMQ's controller-standalone.conf as it is (the port
    is the self peer's), prints its settings with -p, refuses a typo, and serves."""
    port = free_broker_port()
    conf = tmp_path / "controller.conf"
    conf.write_text("controllerDLegerGroup = group1\n"
                    f"controllerDLegerPeers = n0-127.0.0.1:{port}\n"
                    "controllerDLegerSelfId = n0\ncontrollerType = memory\n"
                    "controllerThreadPoolNums = 16\nbindAddress = 127.0.0.1\n")
    cli = [sys.executable, "-m", "trio_ha.cli"]
    printed = subprocess.run([*cli, "controller", "-c", str(conf), "-p"], capture_output=True,
                             text=True, env=child_env(), timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert f"listenPort={port}\n" in printed.stdout
    assert "scanNotActiveBrokerInterval=5000\n" in printed.stdout
    shipped = subprocess.run([*cli, "controller", "-c", os.path.join(
        os.path.dirname(__file__), "..", "conf", "controller.conf"), "-p"],
        capture_output=True, text=True, env=child_env(), timeout=120)
    assert shipped.returncode == 0 and "listenPort=9878\n" in shipped.stdout, shipped
    typo = tmp_path / "typo.conf"
    typo.write_text("enableElectUncleanMastr=true\n")
    refused = subprocess.run([*cli, "controller", "-c", str(typo)], capture_output=True,
                             text=True, env=child_env(), timeout=120)
    assert refused.returncode == 2 and "enableElectUncleanMaster" in refused.stderr, refused

    with subprocess.Popen([*cli, "controller", "-c", str(conf)], stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, env=child_env()) as process:
        try:
            assert process.stdout is not None
            line = process.stdout.readline().decode()
            assert line == f"controller listening on 127.0.0.1:{port}\n", line

            async def ask() -> RemotingCommand:
                async with open_remoting_client(f"127.0.0.1:{port}") as client:
                    return await client.invoke(RemotingCommand.request(
                        RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                        {"clusterName": CLUSTER, "brokerName": BROKER_NAME}), 5)
            assert trio.run(ask).ext_fields["nextBrokerId"] == "1"
        finally:
            process.terminate()
            assert process.wait(30) == 0


def test_a_paused_master_is_replaced_at_its_heartbeat_timeout(tmp_path):
    """SIGSTOP the master (its connection stays open, it falls silent): our controller finds
    it dead when its heartbeat times out (2 s here), not at a later scan, and elects the
    slave; sends succeed again. The time is printed, never asserted."""
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    ports = [free_broker_port() for _ in range(2)]
    addrs = [f"127.0.0.1:{p}" for p in ports]
    nodes: list[NodeProcess] = []
    try:
        ctl = NodeProcess.start("ctl", {"kind": "controller", "properties": {
            "controllerType": "memory"}}, log_dir=logs)
        nodes.append(ctl)
        namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                    log_dir=logs)
        nodes.append(namesrv)
        brokers = []
        for i in range(2):
            spec = broker_spec(str(tmp_path / f"b{i}"), ports[i], namesrv.addr, ctl.addr)
            spec["properties"]["controllerHeartBeatTimeoutMills"] = "2000"
            brokers.append(NodeProcess.start(f"b{i}", spec, log_dir=logs))
            nodes.append(brokers[-1])
            if i == 0:
                trio.run(wait_master, ctl.addr, addrs[0], 1, 30.0)
        acked = trio.run(send_some, namesrv.addr, 10, "before")
        trio.run(wait_master, ctl.addr, addrs[0], 2, 30.0)

        os.kill(brokers[0].pid, signal.SIGSTOP)
        paused = time.monotonic()
        try:
            assert trio.run(wait_master, ctl.addr, addrs[1], 1, 30.0) == 2
            print(f"our controller: paused master replaced {time.monotonic() - paused:.2f} s "
                  "after SIGSTOP (heartbeat timeout 2 s)")
            acked.append(trio.run(first_send_ok, namesrv.addr, 30.0))
        finally:
            os.kill(brokers[0].pid, signal.SIGCONT)
        assert not set(acked) - trio.run(bodies_in, namesrv.addr)
    finally:
        for node in reversed(nodes):
            node.kill()
