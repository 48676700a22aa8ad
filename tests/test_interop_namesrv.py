"""Issue 10, point 6: mixed name servers. Our broker registers with the real 4.9.7 name server
and the Java client routes through it to us; the real broker registers with our name server,
mqadmin clusterList through ours shows it, and the Java client routes through ours to it."""

from __future__ import annotations

import os

import pytest

from trio_ha.testing import NodeProcess, free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.rocketmq import program_lines

pytestmark = pytest.mark.interop

CLIENT = "trioha.interop.Client"


def round_trip(rocketmq, run, namesrv: str, topic: str, count: int = 6) -> None:
    """Produce through ``namesrv`` and consume the same messages back."""
    out = rocketmq.run_program(run / "producer", CLIENT, "produce", "--namesrv", namesrv,
                               "--topic", topic, "--count", count)
    sent = program_lines(out)[:-1]
    assert len(sent) == count and all(line.get("msgId") for line in sent), out[-2000:]
    out = rocketmq.run_program(run / "consumer", CLIENT, "push", "--namesrv", namesrv,
                               "--topic", topic, "--group", f"g_{topic}", "--expect", count,
                               "--idle-seconds", 3, "--max-seconds", 60)
    received = [line for line in program_lines(out) if "msgId" in line]
    assert sorted(m["msgId"] for m in received) == sorted(m["msgId"] for m in sent)


def test_our_broker_registers_with_the_real_name_server(rocketmq, tmp_path):
    port = free_broker_port()
    namesrv = rocketmq.start_namesrv(tmp_path / "their_ns", port)
    # its self-signed TLS files go to its own scratch directory, not the machine's /tmp
    assert list((tmp_path / "their_ns").glob("keyutil_*")), os.listdir(tmp_path / "their_ns")
    addr = f"127.0.0.1:{port}"
    log_dir = tmp_path / "logs"
    os.makedirs(log_dir)
    broker = None
    try:
        broker = NodeProcess.start("master", {"kind": "broker", "properties": {
            "brokerClusterName": "MixedCluster", "brokerName": "ours-a", "brokerId": "0",
            "brokerRole": "ASYNC_MASTER", "listenPort": "0", "bindAddress": "127.0.0.1",
            "brokerIP1": "127.0.0.1", "namesrvAddr": addr,
            "storePathRootDir": str(tmp_path / "store"),
            "mappedFileSizeCommitLog": str(DEFAULT_SEGMENT_SIZE),
        }}, log_dir=str(log_dir))
        listing = rocketmq.mqadmin(tmp_path / "adm", "clusterList", "-n", addr)
        assert "Exception" not in listing, listing
        [row] = [line.split() for line in listing.splitlines()[1:] if line.strip()]
        assert row[:4] == ["MixedCluster", "ours-a", "0", broker.addr]
        round_trip(rocketmq, tmp_path, addr, "MixedT1")
    finally:
        if broker is not None:
            broker.stop()
        namesrv.kill()


def test_real_broker_registers_with_our_name_server(rocketmq, tmp_path):
    log_dir = tmp_path / "logs"
    os.makedirs(log_dir)
    ours = NodeProcess.start("namesrv", {"kind": "namesrv", "host": "127.0.0.1", "port": 0},
                             log_dir=str(log_dir))
    broker = None
    try:
        broker_port = free_broker_port()
        broker = rocketmq.start_broker(tmp_path / "their_broker", {
            "brokerClusterName": "MixedCluster", "brokerName": "theirs-a", "brokerId": 0,
            "brokerRole": "ASYNC_MASTER", "namesrvAddr": ours.addr, "listenPort": broker_port,
            "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxHashSlotNum": 1000,
            "maxIndexNum": 4000,
        })
        listing = rocketmq.mqadmin(tmp_path / "adm", "clusterList", "-n", ours.addr)
        rows = [line.split() for line in listing.splitlines()[1:]
                if line.startswith("MixedCluster")]
        assert [row[:4] for row in rows] == [
            ["MixedCluster", "theirs-a", "0", f"127.0.0.1:{broker_port}"]]
        # The only error allowed is their broker's own: in its first minute a 4.9.7 broker
        # answers GET_BROKER_RUNTIME_INFO with SYSTEM_ERROR (NoSuchElementException from
        # LinkedList.getLast: its per-minute stats list is still empty), so the version and
        # load columns stay empty. Nothing in the listing comes from our name server failing.
        for line in listing.splitlines():
            if "Exception:" in line and not line.lstrip().startswith("at "):
                assert ("java.util.NoSuchElementException" in line
                        and f"BROKER: 127.0.0.1:{broker_port}" in line), listing
        round_trip(rocketmq, tmp_path, ours.addr, "MixedT2")
    finally:
        if broker is not None:
            broker.kill()
        ours.stop()
