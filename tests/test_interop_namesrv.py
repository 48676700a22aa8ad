"""Issue 10, point 6: mixed name servers. Our broker registers with the real 4.9.7 name server
and the Java client routes through it to us; the real broker registers with our name server,
mqadmin clusterList through ours shows it, and the Java client routes through ours to it."""

from __future__ import annotations

import os
import time

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


# ---- issue 35: real brokers and a name server with aclEnable ----------------------------------

ACL_BROKER_KEY, ACL_BROKER_SECRET = "brokerAdmin", "broker-secret-key"


def _acl_namesrv(tmp_path, *, whitelist: str | None = None) -> NodeProcess:
    os.makedirs(tmp_path, exist_ok=True)
    acl = tmp_path / "plain_acl.yml"
    acl.write_text(
        (f"globalWhiteRemoteAddresses:\n  - {whitelist}\n" if whitelist else "")
        + f"accounts:\n  - accessKey: {ACL_BROKER_KEY}\n    secretKey: {ACL_BROKER_SECRET}\n"
        "    admin: true\n")
    log_dir = tmp_path / "logs"
    os.makedirs(log_dir, exist_ok=True)
    return NodeProcess.start("namesrv", {
        "kind": "namesrv", "host": "127.0.0.1", "port": 0,
        "properties": {"aclEnable": "true", "plainAclFile": str(acl)}}, log_dir=str(log_dir))


def _registered(peer, tmp_path, namesrv: str, broker_name: str) -> list[list[str]]:
    listing = peer.mqadmin(tmp_path / "adm", "clusterList", "-n", namesrv)
    return [line.split()[:4] for line in listing.splitlines()[1:]
            if line.split()[1:2] == [broker_name]]


def _wait_registered(peer, tmp_path, namesrv: str, broker_name: str, *,
                     seconds: float = 30.0) -> list[list[str]]:
    deadline = time.monotonic() + seconds
    while True:  # bounded by the deadline; a broker registers at start, then every 30 s
        rows = _registered(peer, tmp_path, namesrv, broker_name)
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(1)


def test_a_real_5_3_broker_signs_its_registration_with_our_acl_name_server(
        rocketmq5, tmp_path):
    """Issue 35: RocketMQ 5.3.3 signs what it sends a name server with
    innerClientAuthenticationCredentials (AclClientRPCHook): our name server with aclEnable
    takes its registration, as it takes ours."""
    ours = _acl_namesrv(tmp_path)
    broker = None
    try:
        port = free_broker_port()
        broker = rocketmq5.start_broker(tmp_path / "theirs", {
            "brokerClusterName": "AclCluster", "brokerName": "theirs5", "brokerId": 0,
            "brokerRole": "ASYNC_MASTER", "namesrvAddr": ours.addr, "listenPort": port,
            "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxHashSlotNum": 1000,
            "maxIndexNum": 4000,
            "innerClientAuthenticationCredentials":
                f'{{"accessKey":"{ACL_BROKER_KEY}","secretKey":"{ACL_BROKER_SECRET}"}}',
            # 5.3 keeps the inner account as a user of its own ACL 2.0 store: it needs one
            "authenticationMetadataProvider": "org.apache.rocketmq.auth.authentication."
                                              "provider.LocalAuthenticationMetadataProvider",
        })
        rows = _wait_registered(rocketmq5, tmp_path, ours.addr, "theirs5")
        assert rows == [["AclCluster", "theirs5", "0", f"127.0.0.1:{port}"]], rows
        # at shutdown it unregisters over the connection it registered on: honoured
        broker.stop()
        broker = None
        assert _registered(rocketmq5, tmp_path, ours.addr, "theirs5") == []
        with open(ours.log_path, encoding="utf-8", errors="replace") as log:
            assert "refused" not in log.read()
    finally:
        if broker is not None:
            broker.kill()
        ours.stop()


def test_a_real_4_9_broker_cannot_sign_and_registers_with_our_acl_name_server_only_when_whitelisted(
        rocketmq, tmp_path):
    """Issue 35: RocketMQ 4.9.7's broker has no setting to sign its registrations, so our name
    server with aclEnable refuses them, unless the broker's address is in
    globalWhiteRemoteAddresses (the documented way to keep a 4.9 broker)."""
    ours = _acl_namesrv(tmp_path / "refused")
    broker = None
    try:
        properties = {
            "brokerClusterName": "AclCluster", "brokerName": "theirs4", "brokerId": 0,
            "brokerRole": "ASYNC_MASTER", "namesrvAddr": ours.addr,
            "listenPort": free_broker_port(), "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
            "maxHashSlotNum": 1000, "maxIndexNum": 4000,
        }
        broker = rocketmq.start_broker(tmp_path / "theirs", properties)
        assert _registered(rocketmq, tmp_path, ours.addr, "theirs4") == []
    finally:
        if broker is not None:
            broker.kill()
        ours.stop()
    ours = _acl_namesrv(tmp_path / "whitelisted", whitelist="127.0.0.1")
    broker = None
    try:
        properties["namesrvAddr"] = ours.addr
        properties["listenPort"] = port = free_broker_port()
        broker = rocketmq.start_broker(tmp_path / "theirs2", properties)
        rows = _wait_registered(rocketmq, tmp_path, ours.addr, "theirs4")
        assert rows == [["AclCluster", "theirs4", "0", f"127.0.0.1:{port}"]], rows
        broker.stop()
        broker = None
        with open(ours.log_path, encoding="utf-8", errors="replace") as log:
            assert "refused" not in log.read()
    finally:
        if broker is not None:
            broker.kill()
        ours.stop()
