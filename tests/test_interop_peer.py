"""The harness that runs the real Apache RocketMQ (trio_ha.testing.rocketmq) does what the
interop tests rely on: a real name server and broker start from the cached jars, mqadmin talks
to them, our Java programs compile and run, and a stop is a clean JVM shutdown (the broker's
abort file is gone, so its next start is a normal recovery)."""

import threading
from pathlib import Path

import pytest

from trio_ha.testing import free_broker_port
from trio_ha.testing.rocketmq import (
    CLIENTS_VERSION,
    RocketMQ,
    broker_properties_text,
    program_lines,
    remove_unsized_commitlog_files,
)

pytestmark = pytest.mark.interop


def test_broker_conf_refuses_values_rocketmq_would_silently_ignore():
    assert broker_properties_text({"brokerRole": "SYNC_MASTER", "x": True}) == (
        "brokerRole=SYNC_MASTER\nx=true\n")
    for bad in ("SYNC_MASTER ", "SLAVE # comment", "a\nb"):
        with pytest.raises(ValueError, match="broker.conf cannot hold"):
            broker_properties_text({"brokerRole": bad})


def test_the_clients_only_peer_has_the_client_and_mqadmin_and_no_servers(rocketmq_clients,
                                                                          tmp_path):
    """4.9.8 runs as clients only: its jars are the client's and mqadmin's, and asking it for
    a server says why there is none (rather than a Java ClassNotFoundException)."""
    jars = {path.name for path in rocketmq_clients.lib.glob("*.jar")}
    assert {"rocketmq-client-4.9.8.jar", "rocketmq-tools-4.9.8.jar"} <= jars
    assert not [name for name in jars if name.startswith(("rocketmq-broker", "rocketmq-namesrv"))]
    with pytest.raises(RuntimeError, match="without its servers"):
        rocketmq_clients.start_namesrv(tmp_path / "ns", free_broker_port())
    assert "mqadmin" in rocketmq_clients.mqadmin(tmp_path / "adm", check=True)  # its help text


def test_workers_filling_a_cold_cache_at_once_download_and_compile_once(rocketmq_clients,
                                                                        tmp_path, monkeypatch):
    """Test workers (pytest -n) start with the same cold cache: one fetches and compiles
    while the others wait for it, and every worker gets the one complete copy (a second
    download would replace lib/ under the JVMs of the first)."""
    calls = {"download": 0, "compile": 0}
    download, compile_ = RocketMQ._download, RocketMQ._compile

    def counted(name, real):
        def call(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        return call

    monkeypatch.setattr(RocketMQ, "_download", counted("download", download))
    monkeypatch.setattr(RocketMQ, "_compile", counted("compile", compile_))
    got: list[tuple[RocketMQ, Path]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def worker() -> None:
        try:
            start.wait()
            peer = RocketMQ.fetch(CLIENTS_VERSION, clients_only=True, cache_dir=tmp_path)
            got.append((peer, peer.compile_programs()))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert not errors, errors
    assert calls == {"download": 1, "compile": 1}
    assert len({(peer.lib, classes) for peer, classes in got}) == 1 and len(got) == 3
    peer, classes = got[0]
    assert (peer.lib / "rocketmq-tools-4.9.8.jar").exists()
    assert (classes / ".complete").exists()
    # No staging directory is left beside the cache entry.
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        f"{CLIENTS_VERSION}-clients", f"{CLIENTS_VERSION}-clients.lock"]


def test_real_namesrv_broker_mqadmin_and_our_programs(rocketmq, tmp_path):
    namesrv_port = free_broker_port()
    broker_port = free_broker_port()
    namesrv = rocketmq.start_namesrv(tmp_path / "ns", namesrv_port)
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    try:
        broker = rocketmq.start_broker(tmp_path / "master", {
            "brokerClusterName": "PeerCluster", "brokerName": "peer-a", "brokerId": 0,
            "brokerRole": "SYNC_MASTER", "namesrvAddr": namesrv_addr,
            "listenPort": broker_port, "mappedFileSizeCommitLog": 1 << 20,
            "maxHashSlotNum": 1000, "maxIndexNum": 4000,
        })
        try:
            listing = rocketmq.mqadmin(tmp_path / "adm", "clusterList", "-n", namesrv_addr)
            assert "PeerCluster" in listing and f"127.0.0.1:{broker_port}" in listing
            out = rocketmq.run_program(tmp_path / "producer", "trioha.interop.Client", "produce",
                                       "--namesrv", namesrv_addr, "--topic", "HarnessT",
                                       "--count", 3)
            lines = program_lines(out)
            # No slave: a real SYNC_MASTER stores the message and says SLAVE_NOT_AVAILABLE.
            assert [line.get("status") for line in lines[:3]] == ["SLAVE_NOT_AVAILABLE"] * 3
            assert lines[-1] == {"done": True, "count": 3, "errors": 0}
        finally:
            assert broker.stop() is not None
        assert not (tmp_path / "master" / "store" / "abort").exists(), broker.tail()
    finally:
        namesrv.kill()


def test_rocketmq_refuses_its_own_empty_segment_and_the_helper_clears_it(rocketmq, tmp_path):
    """A real 4.x broker killed between creating and sizing its next commitlog file will not
    start again (seen in test_their_master_restarting_while_our_slave_copies); the helper
    removes the empty file, which holds no bytes, and the broker starts."""
    store = tmp_path / "broker" / "store"
    (store / "commitlog").mkdir(parents=True)
    (store / "commitlog" / "00000000000000000000").touch()
    properties = {
        "brokerClusterName": "PeerCluster", "brokerName": "peer-a", "brokerId": 0,
        "brokerRole": "ASYNC_MASTER", "namesrvAddr": "127.0.0.1:1",
        "listenPort": free_broker_port(), "mappedFileSizeCommitLog": 1 << 20,
        "maxHashSlotNum": 1000, "maxIndexNum": 4000,
    }
    with pytest.raises(RuntimeError, match="exited with status"):
        rocketmq.start_broker(tmp_path / "broker", properties, name="refused")
    log = (tmp_path / "broker" / "logs" / "rocketmq.log").read_text()
    assert "length not matched message store config value" in log

    assert remove_unsized_commitlog_files(store) == [store / "commitlog" / "00000000000000000000"]
    assert remove_unsized_commitlog_files(store) == []
    broker = rocketmq.start_broker(tmp_path / "broker", properties, name="started")
    broker.kill()
