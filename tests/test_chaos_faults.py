"""The chaos harness's fault machinery on its own: test hosts (network namespaces with
nftables rules) and small disks, each shown to do what a fault claims, and to heal.

They need root, ``ip`` and ``nft``: where those are missing the tests skip with the reason,
or fail under TRIO_HA_REQUIRE_CHAOS=1 (CI), which bin/test's set-up provides for.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from trio_ha.chaos import disk, testnet
from trio_ha.chaos.cluster import ChaosNode
from trio_ha.chaos.faults import Cluster, inject
from trio_ha.chaos.plan import Fault, FaultKind
from trio_ha.chaos.testnet import TestNetwork
from trio_ha.testing import FaultProxy


def _require(reason: str | None, what: str) -> None:
    if reason is None:
        return
    if os.environ.get("TRIO_HA_REQUIRE_CHAOS") == "1":
        pytest.fail(f"TRIO_HA_REQUIRE_CHAOS=1 but {what} cannot be made here: {reason}")
    pytest.skip(f"{what} cannot be made here: {reason}")


@pytest.fixture(scope="module")
def network():
    _require(testnet.unavailable(), "test hosts")
    net = TestNetwork.create(["a", "b"])
    try:
        yield net
    finally:
        net.close()


# A UDP echo on each host, driven by a probe that says how many of its datagrams came back
# and how many the far side saw: UDP shows each direction on its own, where TCP needs both.
_ECHO = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.bind((sys.argv[1], 9000))
seen = 0
while True:
    data, peer = s.recvfrom(100)
    answer = str(seen).encode() if data == b"count" else data
    seen = 0 if data == b"count" else seen + 1
    try:
        s.sendto(answer, peer)
    except OSError:  # (EPERM: an output rule dropped it)
        pass
"""

_PROBE = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
s.settimeout(0.6)
n = int(sys.argv[2])
for i in range(n):
    if i % 20 == 19:
        time.sleep(0.002)  # (paced: no socket buffer on the way overflows)
    try:
        s.sendto(b"x", (sys.argv[1], 9000))
    except OSError:  # (EPERM: an output rule dropped it)
        pass
back = 0
try:
    while back < n:
        s.recv(100)
        back += 1
except socket.timeout:
    pass
print(back)
"""

_COUNT = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
s.sendto(b"count", (sys.argv[1], 9000))
try:
    print(int(s.recv(100)))
except socket.timeout:
    print(-1)
"""


@pytest.fixture(scope="module")
def echoes(network):
    servers = [subprocess.Popen(host.command([sys.executable, "-c", _ECHO, host.address]))
               for host in network.hosts.values()]
    try:
        for name in network.hosts:  # each echo answers before the tests begin
            for _ in range(50):
                if _exchange(network, None, name, 1) == (1, 1):
                    break
            else:
                pytest.fail(f"the echo on {name} never answered")
        yield
    finally:
        for server in servers:
            server.kill()
            server.wait()


def _send(network: TestNetwork, source: str | None, target: str, n: int = 20) -> int:
    """How many of ``n`` datagrams from ``source`` (None: the harness's own namespace) to
    ``target``'s echo came back."""
    probe = [sys.executable, "-c", _PROBE, network.hosts[target].address, str(n)]
    if source is not None:
        probe = network.hosts[source].command(probe)
    return int(subprocess.run(probe, capture_output=True, text=True, timeout=30,
                              check=True).stdout)


def _seen(network: TestNetwork, target: str) -> int:
    """How many datagrams ``target``'s echo saw since last asked, asked from the harness's
    namespace (-1: no answer)."""
    ask = subprocess.run([sys.executable, "-c", _COUNT, network.hosts[target].address],
                         capture_output=True, text=True, timeout=30, check=True)
    return int(ask.stdout)


def _exchange(network: TestNetwork, source: str | None, target: str, n: int = 20):
    """(datagrams echoed back, datagrams the target saw): for rules that leave the path
    from the harness's namespace to ``target`` alone."""
    return _send(network, source, target, n), _seen(network, target)


def test_hosts_reach_each_other_and_the_harness(network, echoes):
    assert _exchange(network, "a", "b") == (20, 20)
    assert _exchange(network, "b", "a") == (20, 20)
    assert _exchange(network, None, "a") == (20, 20)


def test_a_partition_drops_both_ways_between_two_hosts_only(network, echoes):
    rule = network.block("a", [network.hosts["b"].address])
    try:
        assert _exchange(network, "a", "b") == (0, 0)  # a's datagrams never leave
        assert _exchange(network, "b", "a") == (0, 0)  # b's never get in
        assert _exchange(network, None, "a") == (20, 20)  # the rest of the network does
    finally:
        network.heal(rule)
    assert _exchange(network, "a", "b") == (20, 20)


def test_a_one_way_blackhole_loses_one_direction_and_carries_the_other(network, echoes):
    rule = network.block("a", [network.hosts["b"].address], inbound=False)
    try:
        # a -> b is lost; b -> a arrives, but a's echo back is lost
        assert _exchange(network, "a", "b") == (0, 0)
        assert _exchange(network, "b", "a") == (0, 20)
    finally:
        network.heal(rule)
    rule = network.block("a", [network.hosts["b"].address], outbound=False)
    try:
        # a -> b arrives (b counts it), b's echo back is lost
        assert _exchange(network, "a", "b") == (0, 20)
    finally:
        network.heal(rule)
    assert _exchange(network, "b", "a") == (20, 20)


def test_isolation_cuts_a_host_off_from_everyone_but_itself(network, echoes):
    rule = network.isolate("b")
    try:
        assert _exchange(network, None, "b")[0] == 0
        assert _exchange(network, "a", "b")[0] == 0
        loopback = subprocess.run(network.hosts["b"].command(
            [sys.executable, "-c", _PROBE, "127.0.0.1", "5"]), capture_output=True, text=True,
            timeout=30)
        # (the echo listens on b's test address, not on loopback: nothing answers, but the
        # send itself is not refused by the rules)
        assert loopback.returncode == 0
    finally:
        network.heal(rule)
    assert _exchange(network, None, "b") == (20, 20)


def test_random_loss_drops_a_share_of_packets_each_way(network, echoes):
    rule = network.lose("b", 50)
    try:
        back = _send(network, "a", "b", 400)
    finally:
        network.heal(rule)
    seen = _seen(network, "b")
    # Each datagram crosses b's rules twice (in, then its echo out): about a half arrive,
    # a quarter come back. Six standard deviations either way.
    assert 140 <= seen <= 260, seen
    assert 40 <= back <= 160, back
    assert _exchange(network, "a", "b") == (20, 20)


def test_faults_overlap_and_each_heal_takes_only_its_own(network, echoes):
    block = network.block("a", [network.hosts["b"].address])
    isolate = network.isolate("a")
    try:
        network.heal(block)
        assert _exchange(network, None, "a")[0] == 0  # still isolated
    finally:
        network.heal(isolate)
    assert _exchange(network, None, "a") == (20, 20)
    listing = subprocess.run(network.hosts["a"].command(["nft", "list", "table", "inet",
                                                         testnet.TABLE]),
                             capture_output=True, text=True, check=True).stdout
    assert "chain" not in listing


def test_a_throttle_puts_a_token_bucket_on_both_ends_and_heals(network, echoes):
    rule = network.throttle("b", 256)
    host = network.hosts["b"]

    def qdiscs() -> str:
        outer = subprocess.run(["tc", "qdisc", "show", "dev", host.outer_link],
                               capture_output=True, text=True, check=True).stdout
        inner = subprocess.run(host.command(["tc", "qdisc", "show", "dev", "eth0"]),
                               capture_output=True, text=True, check=True).stdout
        return outer + inner

    try:
        assert qdiscs().count("tbf") == 2 and "256Kbit" in qdiscs()
        assert _exchange(network, "a", "b") == (20, 20)  # slow, not lossy
    finally:
        network.heal(rule)
    assert "tbf" not in qdiscs()


def test_close_takes_every_host_and_the_bridge_down():
    _require(testnet.unavailable(), "test hosts")
    net = TestNetwork.create(["x"])
    names = [host.netns for host in net.hosts.values()]
    net.close()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(name in listed for name in names)
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    assert net.bridge not in links


def test_a_small_disk_fills_to_the_last_page_and_gives_it_back(tmp_path):
    _require(disk.unavailable(), "small disks")
    small = disk.SmallDisk.mount(tmp_path / "fs", 16 * 1024 * 1024)
    try:
        (small.path / "data").write_bytes(b"x" * 100_000)
        taken = small.fill()
        assert taken > 15 * 1024 * 1024 and small.free < 4096
        with pytest.raises(OSError, match="No space left") as caught:
            (small.path / "more").write_bytes(b"y" * 8192)
        assert caught.value.errno == 28  # ENOSPC
        small.release()
        assert small.free > 15 * 1024 * 1024
        (small.path / "more").write_bytes(b"y" * 8192)
    finally:
        small.unmount()
    assert not os.path.ismount(tmp_path / "fs")


async def test_a_network_fault_cut_short_by_the_end_of_a_run_is_healed():
    """A run's end cancels the faults in force; each must still take its rules away (the
    heal runs shielded: an unshielded thread call would be cancelled before it began)."""
    _require(testnet.unavailable(), "test hosts")
    network = await trio.to_thread.run_sync(TestNetwork.create, ["master", "slave1"])
    try:
        def node(name: str) -> ChaosNode:
            return ChaosNode(name, [], Path(os.devnull), f"{network.hosts[name].address}:1")

        # (the replication proxy is not served: only its address goes into the rules)
        proxy = FaultProxy(("127.0.0.1", 1), host=network.add_gateway_address())
        cluster = Cluster(node("master"), node("master"), [node("slave1")], [proxy], network)
        for fault in (Fault(0.0, FaultKind.ISOLATE_MASTER, 0, 60.0),
                      Fault(0.0, FaultKind.PARTITION_SLAVE, 1, 60.0),
                      Fault(0.0, FaultKind.SLOW_NETWORK, 1, 60.0, 256.0)):
            in_force = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(inject, fault, cluster, random.Random(0), in_force.set)
                await in_force.wait()
                nursery.cancel_scope.cancel()
        for host in network.hosts.values():
            rules = await trio.run_process(
                host.command(["nft", "list", "table", "inet", testnet.TABLE]),
                capture_stdout=True)
            assert b"chain" not in rules.stdout, rules.stdout
            qdiscs = await trio.run_process(host.command(["tc", "qdisc", "show", "dev", "eth0"]),
                                            capture_stdout=True)
            assert b"tbf" not in qdiscs.stdout, qdiscs.stdout
    finally:
        await trio.to_thread.run_sync(network.close)
