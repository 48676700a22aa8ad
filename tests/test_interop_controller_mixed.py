"""Issue 38, mixed broker sets: our broker and a real RocketMQ 5.3.3 broker in one set.

The AutoSwitch HA protocol is written from a spec sheet and, until these tests, had only
ever met itself. Here each side meets the real thing, under the real 5.3.3 controller and
the real name server, both ways round:

* the Java broker starts first and is master; ours joins as its slave (our AutoSwitch
  client against the Java ``AutoSwitchHAConnection``), copies and joins the in-sync set;
  the 5.3.3 Java client sends;
* ours starts first and is master; the Java broker joins as its slave (the Java
  ``AutoSwitchHAClient`` against our master connection), copies and joins the in-sync set.

Then each is master in turn: the master is SIGKILLed, the other takes over, the Java
client's sends succeed and every send answered SEND_OK is readable; the killed one restarts,
rejoins as slave (truncating to the point both logs share, by the other's epoch list) and
catches up; and once more the other way. A third test restarts a Java slave without its
epoch file against our master.

At each check the two commitlogs on disk agree byte for byte as far as the shorter goes
(segment files have the same names and layout on both sides: docs/formats.md) and the
epoch files agree (the survivor's adds its new epoch). What the Java broker does on the HA
port is written up in docs/controller-mode-observed.md.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import trio

from test_interop_controller import CLIENT
from test_interop_controller_brokers import (
    BROKER_NAME,
    CLUSTER,
    TOPIC,
    bodies_in,
    broker_spec,
    kill_under_load,
    send_some,
    wait_master,
)
from trio_ha.store.ha.epochs import EPOCH_FILE_NAME, EpochEntry, decode_epoch_file
from trio_ha.testing import free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.processes import NodeProcess
from trio_ha.testing.rocketmq import program_lines

pytestmark = pytest.mark.interop


def java_broker(rocketmq5, run_dir: Path, port: int, namesrv: str, controller: str):
    """A real 5.3.3 broker of our broker set, in controller mode, its store in
    ``run_dir/store``."""
    return rocketmq5.start_broker(run_dir, {
        "brokerClusterName": CLUSTER, "brokerName": BROKER_NAME, "listenPort": port,
        "namesrvAddr": namesrv, "enableControllerMode": True, "controllerAddr": controller,
        "haSendHeartbeatInterval": 1000, "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
        "maxHashSlotNum": 1000, "maxIndexNum": 4000, "autoCreateTopicEnable": True,
        "checkSyncStateSetPeriod": 1000,
        # as ours by default: a send is answered once every in-sync member has it, so a
        # failover loses no acknowledged send (RocketMQ's default, false, may)
        "allAckInSyncStateSet": True}, name=run_dir.name)


def java_produce(rocketmq5, run_dir: Path, namesrv: str, prefix: str, count: int = 10
                 ) -> list[bytes]:
    """``count`` sends by the 5.3.3 Java client, each retried; all must be answered SEND_OK.
    The bodies sent."""
    out = rocketmq5.run_program(run_dir, CLIENT, "produce", "--namesrv", namesrv, "--topic",
                                TOPIC, "--count", count, "--prefix", prefix, "--retries", 4)
    lines = program_lines(out)
    assert lines[-1] == {"done": True, "count": count, "errors": 0}, out[-3000:]
    assert {line.get("status") for line in lines[:-1]} == {"SEND_OK"}, lines
    return [f"{prefix}-{i}".encode() for i in range(count)]


def commitlog(store_root: str | Path) -> bytes:
    """The commitlog's bytes from offset 0, its segment files (named by their first offset)
    laid side by side, without the zeros after the last record (preallocated space)."""
    directory = Path(store_root) / "commitlog"
    data = bytearray()
    for segment in sorted(directory.iterdir(), key=lambda path: int(path.name)):
        start = int(segment.name)
        if len(data) < start:
            data.extend(bytes(start - len(data)))
        data[start:start + DEFAULT_SEGMENT_SIZE] = segment.read_bytes()
    return bytes(data).rstrip(b"\0")


def epochs(store_root: str | Path) -> list[EpochEntry]:
    with open(os.path.join(store_root, EPOCH_FILE_NAME), "rb") as file:
        return decode_epoch_file(file.read())


def assert_logs_agree(longer_root: str | Path, other_root: str | Path) -> None:
    """``longer_root``'s commitlog holds the other's as a byte prefix (and may go further);
    its epoch file holds the other's entries and may add newer ones."""
    longer, other = commitlog(longer_root), commitlog(other_root)
    assert other, f"{other_root} holds no commitlog bytes"
    assert len(longer) >= len(other), (len(longer), len(other))
    if not longer.startswith(other):
        differ = next(i for i in range(len(other)) if longer[i] != other[i])
        pytest.fail(f"the commitlogs of {longer_root} and {other_root} differ from byte "
                    f"{differ}")
    longer_epochs, other_epochs = epochs(longer_root), epochs(other_root)
    assert other_epochs, f"{other_root} has no epoch entry"
    assert longer_epochs[:len(other_epochs)] == other_epochs, (longer_epochs, other_epochs)


def wait_caught_up(master_root: str | Path, slave_root: str | Path, timeout: float) -> None:
    """Until the slave's commitlog is as long as the master's (the check itself is
    :func:`assert_logs_agree`)."""
    deadline = time.monotonic() + timeout
    while len(commitlog(slave_root)) < len(commitlog(master_root)):  # bounded by the deadline
        if time.monotonic() > deadline:
            pytest.fail(f"{slave_root} did not catch up with {master_root} in {timeout:g} s")
        time.sleep(0.2)


class Peers:
    """The name server, ours and the Java broker of one test; all killed at its end."""

    def __init__(self, rocketmq5, tmp_path: Path, controller: str) -> None:
        self.rocketmq5, self.tmp_path, self.controller = rocketmq5, tmp_path, controller
        self.logs = str(tmp_path / "logs")
        os.makedirs(self.logs)
        ns_port = free_broker_port()
        self.namesrv = f"127.0.0.1:{ns_port}"
        self.ours_port, self.java_port = free_broker_port(), free_broker_port()
        self.ours_addr = f"127.0.0.1:{self.ours_port}"
        self.java_addr = f"127.0.0.1:{self.java_port}"
        self.ours_root = str(tmp_path / "ours")
        self.java_root = tmp_path / "java" / "store"
        self.processes: list = [rocketmq5.start_namesrv(tmp_path / "ns", ns_port)]

    def start_ours(self) -> NodeProcess:
        node = NodeProcess.start("ours", broker_spec(self.ours_root, self.ours_port,
                                                     self.namesrv, self.controller),
                                 log_dir=self.logs)
        self.processes.append(node)
        return node

    def start_java(self):
        process = java_broker(self.rocketmq5, self.tmp_path / "java", self.java_port,
                              self.namesrv, self.controller)
        self.processes.append(process)
        return process

    def roles(self, name: str) -> tuple[str, str | Path, str | Path]:
        """``name``'s (ours or "java") address and store root, and the other's store root."""
        if name == "ours":
            return self.ours_addr, self.ours_root, self.java_root
        return self.java_addr, self.java_root, self.ours_root

    def kill_all(self) -> None:
        for process in reversed(self.processes):
            process.kill()


def fail_over(peers: Peers, victim, survivor: str, acked: list[bytes], step: str) -> None:
    """SIGKILL ``victim`` (the master) while nothing is sent: ``survivor`` (ours or "java")
    becomes master, the Java client's sends succeed, the survivor's log and epoch file extend
    the victim's by the new epoch, and every acknowledged send is readable."""
    addr, root, other_root = peers.roles(survivor)
    epochs_before = epochs(root)
    victim.kill()
    trio.run(wait_master, peers.controller, addr, 1, 60.0)
    acked += java_produce(peers.rocketmq5, peers.tmp_path / step, peers.namesrv, step)
    assert_logs_agree(root, other_root)
    now = epochs(root)
    assert now[:-1] == epochs_before and now[-1].epoch == epochs_before[-1].epoch + 1, now
    bodies = trio.run(bodies_in, peers.namesrv)
    lost = [body for body in acked if body not in bodies]
    assert not lost, f"{len(lost)} of {len(acked)} acknowledged sends lost: {lost[:5]}"


def rejoin(peers: Peers, slave: str, acked: list[bytes], step: str):
    """``slave`` (ours or "java") starts again, joins the master's in-sync set, copies what
    it lacks; both logs and epoch files are then the same. The slave's process."""
    process = peers.start_ours() if slave == "ours" else peers.start_java()
    master = "java" if slave == "ours" else "ours"
    master_addr, master_root, slave_root = peers.roles(master)
    trio.run(wait_master, peers.controller, master_addr, 2, 90.0)
    acked += java_produce(peers.rocketmq5, peers.tmp_path / step, peers.namesrv, step)
    wait_caught_up(master_root, slave_root, 30)
    assert_logs_agree(master_root, slave_root)
    assert_logs_agree(slave_root, master_root)
    assert epochs(slave_root) == epochs(master_root)
    return process


def test_ours_joins_a_real_master_as_slave_and_takes_over(rocketmq5, controller5, tmp_path):
    peers = Peers(rocketmq5, tmp_path, controller5)
    try:
        java = peers.start_java()
        trio.run(wait_master, controller5, peers.java_addr, 1, 60.0)
        acked = java_produce(rocketmq5, tmp_path / "p1", peers.namesrv, "before")
        # our slave joins the in-sync set once it has acknowledged what the master confirmed
        ours = rejoin(peers, "ours", acked, "in-sync")
        assert [entry.epoch for entry in epochs(peers.ours_root)] == [1]

        fail_over(peers, java, "ours", acked, "ours-master")
        java = rejoin(peers, "java", acked, "java-back")
        fail_over(peers, ours, "java", acked, "java-master")
        rejoin(peers, "ours", acked, "ours-back")
        assert [entry.epoch for entry in epochs(peers.ours_root)] == [1, 2, 3]
    finally:
        peers.kill_all()


def test_a_real_broker_joins_our_master_as_slave_and_takes_over(rocketmq5, controller5,
                                                                tmp_path):
    peers = Peers(rocketmq5, tmp_path, controller5)
    try:
        ours = peers.start_ours()
        trio.run(wait_master, controller5, peers.ours_addr, 1, 60.0)
        acked = trio.run(send_some, peers.namesrv, 20, "before")
        rejoin(peers, "java", acked, "in-sync")
        assert [entry.epoch for entry in epochs(peers.java_root)] == [1]

        # (the other way round, a Java master's failover to ours and back, is the test above)
        fail_over(peers, ours, "java", acked, "java-master")
        rejoin(peers, "ours", acked, "ours-back")
        assert [entry.epoch for entry in epochs(peers.ours_root)] == [1, 2]
    finally:
        peers.kill_all()


def test_a_real_slave_without_its_epoch_file_rejoins_our_master(rocketmq5, controller5,
                                                                tmp_path):
    """The adapter's suspect: a Java slave with data but no epoch file (lost, or a broker
    new to controller mode). It skips the truncation and its first ack is its log end (not
    0 and then its end), where our master goes on from; it takes its epoch entry from the
    frames."""
    peers = Peers(rocketmq5, tmp_path, controller5)
    try:
        peers.start_ours()
        trio.run(wait_master, controller5, peers.ours_addr, 1, 60.0)
        acked = trio.run(send_some, peers.namesrv, 20, "before")
        java = peers.start_java()
        trio.run(wait_master, controller5, peers.ours_addr, 2, 90.0)
        wait_caught_up(peers.ours_root, peers.java_root, 30)
        java.kill()
        trio.run(wait_master, controller5, peers.ours_addr, 1, 60.0)
        for name in (EPOCH_FILE_NAME, EPOCH_FILE_NAME + ".bak"):
            (peers.java_root / name).unlink(missing_ok=True)
        acked += trio.run(send_some, peers.namesrv, 20, "alone")
        peers.start_java()
        trio.run(wait_master, controller5, peers.ours_addr, 2, 90.0)
        acked += trio.run(send_some, peers.namesrv, 20, "rejoined")
        wait_caught_up(peers.ours_root, peers.java_root, 30)
        assert_logs_agree(peers.ours_root, peers.java_root)
        assert_logs_agree(peers.java_root, peers.ours_root)
        # it wrote its epoch file again from the frames' labels
        assert epochs(peers.java_root) == epochs(peers.ours_root) == [EpochEntry(1, 0)]
        bodies = trio.run(bodies_in, peers.namesrv)
        assert not [body for body in acked if body not in bodies]
    finally:
        peers.kill_all()


def assert_share_up_to_the_new_epoch(survivor_root: str | Path, victim_root: str | Path
                                     ) -> None:
    """After a failover under load: the victim may hold a tail the survivor never had, but
    up to where the survivor's new epoch began the two logs are the same bytes."""
    began = epochs(survivor_root)[-1].start_offset
    survivor, victim = commitlog(survivor_root), commitlog(victim_root)
    assert len(victim) >= began and survivor[:began] == victim[:began], \
        (began, len(survivor), len(victim))
    assert epochs(victim_root) == epochs(survivor_root)[:-1]


# Opt-in (-m "interop and soak"): about a minute of the interop budget, and the failovers
# under load of our brokers alone run in every suite (test_interop_controller_brokers.py).
@pytest.mark.soak
def test_mixed_failovers_under_load_lose_no_acknowledged_send(rocketmq5, controller5,
                                                              tmp_path):
    """Four producers send all the time while the master is SIGKILLed, each way: the killed
    broker may hold bytes the new master never had, which it cuts when it rejoins (ours by
    the Java master's epoch list, the Java broker by ours)."""
    peers = Peers(rocketmq5, tmp_path, controller5)
    took: list[float] = []
    try:
        ours = peers.start_ours()
        trio.run(wait_master, controller5, peers.ours_addr, 1, 60.0)
        acked = trio.run(send_some, peers.namesrv, 20, "before")
        java = rejoin(peers, "java", acked, "in-sync")

        acked += trio.run(kill_under_load, ours, controller5, peers.java_addr, peers.namesrv,
                          "load1-", took)
        assert_share_up_to_the_new_epoch(peers.java_root, peers.ours_root)
        rejoin(peers, "ours", acked, "ours-back")

        acked += trio.run(kill_under_load, java, controller5, peers.ours_addr, peers.namesrv,
                          "load2-", took)
        assert_share_up_to_the_new_epoch(peers.ours_root, peers.java_root)
        rejoin(peers, "java", acked, "java-back")
        assert [entry.epoch for entry in epochs(peers.java_root)] == [1, 2, 3]

        bodies = trio.run(bodies_in, peers.namesrv)
        lost = [body for body in acked if body not in bodies]
        print(f"mixed under load: {len(acked)} sends answered SEND_OK, {len(lost)} lost; "
              f"SIGKILL to first SEND_OK of the new master: "
              f"{', '.join(f'{t:.2f} s' for t in took)}")
        assert not lost, f"{len(lost)} of {len(acked)} acknowledged sends lost: {lost[:5]}"
    finally:
        peers.kill_all()
