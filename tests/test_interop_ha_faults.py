"""Issue 10, bad input and faults between our nodes and the real RocketMQ 4.9.7.

Their slave dies in the middle of a frame, a peer on our HA port acknowledges bytes beyond our
log, their master is killed and restarted while our slave copies from it: each time our node
keeps running, the replication picks up again, and our store opens clean afterwards (no hole,
every record passes its check).
"""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

import pytest
import trio

from test_interop_ha import (
    CLIENT,
    attach_probe,
    broker_status,
    commitlog_bytes,
    our_slave_properties,
    real_slave_properties,
    started_broker_status,
    unique,
    wait_attached,
    wait_for,
)
from trio_ha import StoreConfig, open_store
from trio_ha.testing import ClusterConfig, NodeProcess, ProcessCluster, free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.rocketmq import RocketMQ, program_lines, remove_unsized_commitlog_files

pytestmark = pytest.mark.interop


def queue_entries(store_dir: Path, topic: str) -> int:
    """How many consume-queue entries ``topic`` has in a store directory (20 bytes each;
    the files are sparse, zero past their last entry)."""
    total = 0
    for queue_dir in (store_dir / "consumequeue" / topic).iterdir():
        for segment in queue_dir.iterdir():
            data = segment.read_bytes()
            total += sum(1 for i in range(0, len(data), 20) if data[i:i + 20] != bytes(20))
    return total


def background_load(peer: RocketMQ, run: Path, namesrv: str, topic: str, count: int):
    """A Java producer sending ``count`` 1 KiB messages in batches of 16, in the background;
    returns once it has had its first answer."""
    return peer.start_program(run / "load", CLIENT, "produce", "--namesrv", namesrv,
                              "--topic", topic, "--count", count, "--size", 1024,
                              "--mode", "batch", "--batch", 16, "--timeout", 10000,
                              name="load", ready='"i":0,')


def finish_load(producer) -> list[dict]:
    producer.wait(120)
    lines = program_lines(producer.output())
    assert lines[-1]["done"] is True, producer.tail()
    return lines[:-1]


async def assert_store_clean(store_dir: Path, topic: str, expected: int) -> None:
    """The store opens with a normal recovery and no hole, and every message of ``topic``
    reads back with its check passed."""
    config = StoreConfig(store_path_root_dir=str(store_dir),
                         mapped_file_size_commit_log=DEFAULT_SEGMENT_SIZE)
    async with open_store(config) as store:
        report = store.statistics().recovery
        assert report is not None and not report.abnormal and report.holes == (), report
        count = 0
        for queue_id in range(8):
            offset = store.min_queue_offset(topic, queue_id)
            while offset < store.max_queue_offset(topic, queue_id):
                messages = await store.get_messages(topic, queue_id, offset, 256)
                assert messages, (queue_id, offset)
                count += len(messages)
                offset = messages[-1].queue_offset + 1
        assert store.statistics().unverified_reads == 0
    assert count == expected


def test_their_slave_killed_mid_frame_and_an_ack_beyond_our_log(rocketmq, tmp_path):
    config = ClusterConfig(data_dir=str(tmp_path / "ours"), slaves=0,
                           master_port=free_broker_port())
    topic = unique("FaultT")
    slave_port = free_broker_port()
    slave_dir = tmp_path / "their_slave"
    with ProcessCluster.start(config) as cluster:
        namesrv = cluster.namesrv_addr
        props = real_slave_properties(rocketmq, namesrv, slave_port, config.broker_name)
        slave = rocketmq.start_broker(slave_dir, props, name="slave")
        try:
            probes = wait_attached(rocketmq, tmp_path, namesrv, topic,
                                   "our SYNC_MASTER to see the real slave")

            # A peer on our HA port acknowledges bytes we never wrote: it loses its own
            # connection; the real slave's acks still count.
            ha_addr = cluster.master.addresses.ha_addr
            assert ha_addr is not None
            ha_host, ha_port = ha_addr.rsplit(":", 1)
            status = broker_status(rocketmq, tmp_path / "adm", namesrv, cluster.master.addr)
            end = int(status["commitLogMaxOffset"])
            with socket.create_connection((ha_host, int(ha_port)), timeout=15) as rogue:
                rogue.sendall(struct.pack(">q", end))
                time.sleep(0.5)
                rogue.sendall(struct.pack(">q", end + 64 * DEFAULT_SEGMENT_SIZE))
                deadline = time.monotonic() + 15
                closed = False
                while time.monotonic() < deadline and not closed:
                    try:
                        closed = rogue.recv(65536) == b""
                    except ConnectionResetError:
                        closed = True
                assert closed, "our master kept the connection that acknowledged too much"
            assert attach_probe(rocketmq, tmp_path, namesrv, topic, probes)

            # Their slave dies while our master is writing frames to it.
            producer = background_load(rocketmq, tmp_path, namesrv, topic, 3000)
            time.sleep(0.5)
            slave.kill()
            sent = finish_load(producer)
            assert not [line for line in sent if "error" in line]
            assert {line["status"] for line in sent} <= {
                "SEND_OK", "FLUSH_SLAVE_TIMEOUT", "SLAVE_NOT_AVAILABLE"}
            cluster.check()

            # It comes back and catches up byte for byte.
            slave = rocketmq.start_broker(slave_dir, props, name="slave")
            ours = Path(config.store_dir(0)) / "commitlog"
            theirs = slave_dir / "store" / "commitlog"

            def equal() -> bool:
                _, our_bytes = commitlog_bytes(ours)
                status = broker_status(rocketmq, tmp_path / "adm", namesrv, cluster.master.addr)
                end = int(status["commitLogMaxOffset"])
                _, their_bytes = commitlog_bytes(theirs)
                return len(their_bytes) >= end and their_bytes[:end] == our_bytes[:end]
            wait_for(equal, "their restarted slave to catch up", timeout=90, interval=1)
            cluster.check()
        finally:
            slave.kill()
    # Every send was stored, whatever its status said about the slave.
    trio.run(assert_store_clean, Path(config.store_dir(0)), topic, len(probes) + len(sent))


def test_their_master_restarting_while_our_slave_copies(rocketmq, tmp_path):
    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    master_port = free_broker_port()
    master_props = {
        "brokerClusterName": "PeerCluster", "brokerName": "peer-a", "brokerId": 0,
        "brokerRole": "SYNC_MASTER", "flushDiskType": "ASYNC_FLUSH",
        "namesrvAddr": namesrv_addr, "listenPort": master_port,
        "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxMessageSize": 512 * 1024,
        "maxHashSlotNum": 1000, "maxIndexNum": 4000, "registerNameServerPeriod": 10000,
    }
    topic = unique("RestartT")
    namesrv = rocketmq.start_namesrv(tmp_path / "their_ns", namesrv_port)
    our_slave = None
    master = None
    slave_dir = tmp_path / "our_slave"
    try:
        master = rocketmq.start_broker(tmp_path / "their_master", master_props, name="master")
        log_dir = tmp_path / "logs"
        log_dir.mkdir()
        our_slave = NodeProcess.start("slave", {"kind": "broker", "properties":
            our_slave_properties(slave_dir, "peer-a", 1, namesrvAddr=namesrv_addr)},
            log_dir=str(log_dir))
        wait_attached(rocketmq, tmp_path, namesrv_addr, topic,
                      "their SYNC_MASTER to see our slave")

        producer = background_load(rocketmq, tmp_path, namesrv_addr, topic, 3000)
        time.sleep(0.5)
        master.kill()  # mid-copy: our slave loses its master in the middle of the stream
        producer.wait(120)
        our_slave.check()
        # Killed while allocating its next segment, RocketMQ 4.x leaves an empty file that
        # its own restart refuses; an operator deletes it, and so do we.
        remove_unsized_commitlog_files(tmp_path / "their_master" / "store")
        master = rocketmq.start_broker(tmp_path / "their_master", master_props, name="master")
        more = program_lines(rocketmq.run_program(
            tmp_path / "after", CLIENT, "produce", "--namesrv", namesrv_addr, "--topic", topic,
            "--count", 500, "--size", 1024, "--mode", "batch", "--batch", 16))
        assert more[-1]["errors"] == 0

        theirs = tmp_path / "their_master" / "store" / "commitlog"
        ours = slave_dir / "commitlog"

        def equal() -> bool:
            status = started_broker_status(rocketmq, tmp_path / "adm", namesrv_addr,
                                           f"127.0.0.1:{master_port}")
            if status is None:  # their restarted master's first second
                return False
            end = int(status["commitLogMaxOffset"])
            _, their_bytes = commitlog_bytes(theirs)
            _, our_bytes = commitlog_bytes(ours)
            return len(our_bytes) >= end and our_bytes[:end] == their_bytes[:end]
        wait_for(equal, "our slave to catch up with their restarted master", timeout=90,
                 interval=1)
        our_slave.check()
    finally:
        if our_slave is not None:
            our_slave.stop()
        if master is not None:
            master.kill()
        namesrv.kill()
    # What their master kept is not known in advance (it was killed mid-load): our slave
    # indexed what it copied, and every entry reads back with its check passed.
    trio.run(assert_store_clean, slave_dir, topic, queue_entries(slave_dir, topic))


def test_a_client_gone_mid_frame_leaves_our_broker_serving(rocketmq, tmp_path):
    """A real Java producer SIGKILLed while it streams 256 KiB messages, and a peer that
    sends half a frame and hangs up: our broker answers the next client, and its store opens
    clean with every indexed message readable."""
    config = ClusterConfig(data_dir=str(tmp_path / "ours"), slaves=0,
                           master_role="ASYNC_MASTER")
    topic = unique("MidFrame")
    with ProcessCluster.start(config) as cluster:
        namesrv = cluster.namesrv_addr
        host, port = cluster.master.addr.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as half:
            # A frame that says 1,000 bytes follow, and only 100 of them.
            half.sendall(struct.pack(">i", 1000) + b"\0" * 100)
        producer = rocketmq.start_program(
            tmp_path / "big", CLIENT, "produce", "--namesrv", namesrv, "--topic", topic,
            "--count", 2000, "--size", 256 * 1024, "--mode", "async", name="big",
            ready='"i":')
        producer.kill()
        cluster.check()
        after = program_lines(rocketmq.run_program(
            tmp_path / "after", CLIENT, "produce", "--namesrv", namesrv, "--topic", topic,
            "--count", 5))
        assert [line["status"] for line in after[:-1]] == ["SEND_OK"] * 5
        cluster.check()
    store_dir = Path(config.store_dir(0))
    trio.run(assert_store_clean, store_dir, topic, queue_entries(store_dir, topic))
