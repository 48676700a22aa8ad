"""Issue 10, points 3 and 4: replication between our brokers and the real RocketMQ 4.9.7, both
ways, over RocketMQ's classic HA protocol.

Point 4 — their slave from our master: a real SLAVE, learning our SYNC_MASTER through our name
server, copies our commitlog byte for byte; our SYNC_MASTER answers SLAVE_NOT_AVAILABLE until it
is attached and SEND_OK once it has the bytes; its SlaveSynchronize calls (topic configs from our
VIP port, subscription groups, consumer offsets, delay offsets) get answers it can store and load;
and a Java consumer reads from it after our master stops.

Point 3 — our slave from their master: our SLAVE copies a real SYNC_MASTER's commitlog byte for
byte, indexes it, takes its metadata, and serves a Java consumer once their master stops.
"""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest
import trio

from trio_ha.remoting import open_remoting_client
from trio_ha.testing import ClusterConfig, NodeProcess, ProcessCluster, free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.rocketmq import RocketMQ, program_lines
from trio_ha.wire.errors import WireError
from trio_ha.wire.fastjson import read_json
from trio_ha.wire.remoting import RemotingCommand, RequestCode
from trio_ha.wire.route import KVTable

pytestmark = pytest.mark.interop

CLIENT = "trioha.interop.Client"
_names = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{next(_names)}"


def wait_for(predicate, what: str, timeout: float = 60.0, interval: float = 0.3):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"gave up after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def attach_probe(peer: RocketMQ, run: Path, namesrv: str, topic: str,
                 sent: list[dict] | None = None) -> bool:
    """One send (appended to ``sent``); True once a SYNC_MASTER answers SEND_OK (a slave is
    attached)."""
    lines = program_lines(peer.run_program(run / "probe", CLIENT, "produce", "--namesrv",
                                           namesrv, "--topic", topic, "--count", 1,
                                           "--prefix", "probe"))
    if sent is not None:
        sent.append(lines[0])
    return lines[0].get("status") == "SEND_OK"


def wait_attached(peer: RocketMQ, run: Path, namesrv: str, topic: str,
                  what: str) -> list[dict]:
    """Probe until a send answers SEND_OK; the probes sent (all stored)."""
    probes: list[dict] = []
    wait_for(lambda: attach_probe(peer, run, namesrv, topic, probes), what, timeout=60,
             interval=1)
    return probes


def commitlog_bytes(directory: Path) -> tuple[int, bytes]:
    """A commitlog directory's segments joined: (offset of the first, their bytes)."""
    names = sorted(name for name in os.listdir(directory) if name.isdigit())
    if not names:
        return 0, b""
    first = int(names[0])
    data = bytearray()
    for index, name in enumerate(names):
        assert int(name) == first + index * DEFAULT_SEGMENT_SIZE, names
        data += (directory / name).read_bytes()
    return first, bytes(data)


def our_log_end(broker: NodeProcess) -> int:
    """Our broker's commitlog end (GET_BROKER_RUNTIME_INFO's commitLogMaxOffset). A slave
    moves it only once the bytes below it are in its segment files, so a read of the files
    that starts after this answer finds every one of them.

    Bytes past it may be being written while the files are read, and a read of a file that
    is being written can come back torn, zeros then data: read() copies page by page while
    the writer goes on (a page copied just before a write keeps its zeros, later pages have
    the new bytes), and a memcpy into a mapping may store a piece's first bytes last. Past
    this end a look cannot tell such a read from a hole in the slave's log (it once failed
    so), so it compares only up to here; the end of the test compares the whole logs."""
    async def ask() -> int:
        async with open_remoting_client(broker.addr) as client:
            reply = await client.invoke(
                RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO), 5)
        return int(KVTable.decode(reply.body).table["commitLogMaxOffset"])

    return trio.run(ask)


def produce(peer: RocketMQ, run_dir: Path, namesrv: str, topic: str, count: int,
            *args: object) -> list[dict]:
    out = peer.run_program(run_dir, CLIENT, "produce", "--namesrv", namesrv, "--topic", topic,
                           "--count", count, *args)
    lines = program_lines(out)
    assert lines[-1]["done"] is True, out[-3000:]
    return lines[:-1]


def consume(peer: RocketMQ, run_dir: Path, namesrv: str, topic: str, group: str,
            expect: int) -> list[dict]:
    out = peer.run_program(run_dir, CLIENT, "push", "--namesrv", namesrv, "--topic", topic,
                           "--group", group, "--expect", expect, "--idle-seconds", 10,
                           "--max-seconds", 60)
    return [line for line in program_lines(out) if "msgId" in line]


def broker_status(peer: RocketMQ, run_dir: Path, namesrv: str, addr: str) -> dict[str, str]:
    """``mqadmin brokerStatus``: the broker's runtime info as a mapping."""
    status = started_broker_status(peer, run_dir, namesrv, addr)
    assert status is not None, f"{addr} has no runtime sample yet (started under a second ago)"
    return status


def started_broker_status(peer: RocketMQ, run_dir: Path, namesrv: str,
                          addr: str) -> dict[str, str] | None:
    """``broker_status`` of a real broker that may have just started: None while it cannot
    answer yet. RocketMQ's StoreStatsService takes its first sample a second after it starts;
    until then GET_BROKER_RUNTIME_INFO fails with NoSuchElementException (LinkedList.getLast
    of its empty sample list)."""
    out = peer.mqadmin(run_dir, "brokerStatus", "-n", namesrv, "-b", addr)
    if "NoSuchElementException" in out:
        return None
    assert "Exception" not in out, out
    status = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            status[key.strip()] = value.strip()
    return status


def version_properties(peer: RocketMQ, port: int, role: str) -> dict[str, object]:
    """What a broker of this major version needs besides: 4.x takes listenPort + 1 for HA
    whatever it is told; 5.x honours haListenPort, runs a timer store unless told not to, a
    5.x SYNC_MASTER waits for a slave only with inSyncReplicas=2, and a 5.x SLAVE refuses every
    pull ("[REJECTREQUEST]system busy") unless slaveReadEnable=true."""
    if peer.major < 5:
        return {}
    extra: dict[str, object] = {"haListenPort": port + 1, "timerWheelEnable": "false"}
    if role == "SYNC_MASTER":
        extra["inSyncReplicas"] = 2
    if role == "SLAVE":
        extra["slaveReadEnable"] = "true"
    return extra


def real_slave_properties(peer: RocketMQ, namesrv: str, port: int,
                          broker_name: str) -> dict[str, object]:
    return {
        "brokerClusterName": "DefaultCluster", "brokerName": broker_name, "brokerId": 1,
        "brokerRole": "SLAVE", "flushDiskType": "ASYNC_FLUSH", "namesrvAddr": namesrv,
        "listenPort": port, "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
        "maxMessageSize": 512 * 1024, "maxHashSlotNum": 1000, "maxIndexNum": 4000,
        "registerNameServerPeriod": 10000,
        # It reports its log end every 5 s by default, the first time 5 s after it connects.
        "haSendHeartbeatInterval": 1000, **version_properties(peer, port, "SLAVE"),
    }


#: The real peer of each replication test: 4.9.7, and 5.3.3 in classic master/slave mode
#: (issue 10 point 7). The Java client and mqadmin are 4.9.7's in both.
PEERS = ["rocketmq", "rocketmq5"]


# ---- point 4: their slave, our master ------------------------------------------------------------


@pytest.mark.parametrize("peer_name", PEERS)
def test_point_4_real_slave_replicates_from_our_sync_master(peer_name, request, rocketmq,
                                                            tmp_path):
    peer: RocketMQ = request.getfixturevalue(peer_name)
    master_port = free_broker_port()
    config = ClusterConfig(data_dir=str(tmp_path / "ours"), slaves=0, master_port=master_port)
    with ProcessCluster.start(config) as cluster:
        namesrv = cluster.namesrv_addr
        topic = unique("HaT")
        # No slave yet: stored, but a SYNC_MASTER says so.
        early = produce(rocketmq, tmp_path / "producer", namesrv, topic, 3)
        assert {line["status"] for line in early} == {"SLAVE_NOT_AVAILABLE"}

        slave_port = free_broker_port()
        slave = peer.start_broker(
            tmp_path / "their_slave",
            real_slave_properties(peer, namesrv, slave_port, config.broker_name), name="slave")
        slave_addr = f"127.0.0.1:{slave_port}"
        try:
            # The real slave reports first haSendHeartbeatInterval (1 s) after it connects.
            probes = wait_attached(rocketmq, tmp_path, namesrv, topic,
                                   "our SYNC_MASTER to see the real slave")
            # Enough to cross a segment boundary (1 MiB segments).
            sent = produce(rocketmq, tmp_path / "producer", namesrv, topic, 1400, "--size",
                           1024, "--mode", "batch", "--batch", 16)
            assert {line["status"] for line in sent} == {"SEND_OK"}

            ours = Path(config.store_dir(0)) / "commitlog"
            theirs = tmp_path / "their_slave" / "store" / "commitlog"
            status = wait_for(
                lambda: (s := broker_status(rocketmq, tmp_path / "adm", namesrv, slave_addr))
                and int(s["commitLogMaxOffset"]) >= 1024 * 1400 and s,
                "their slave to catch up (mqadmin brokerStatus)")
            their_max = int(status["commitLogMaxOffset"])
            our_first, our_bytes = commitlog_bytes(ours)
            their_first, their_bytes = commitlog_bytes(theirs)
            assert (our_first, their_first) == (0, 0)
            ours_status = broker_status(rocketmq, tmp_path / "adm", namesrv, cluster.master.addr)
            assert their_max == int(ours_status["commitLogMaxOffset"])
            assert their_bytes[:their_max] == our_bytes[:their_max]
            assert their_max > DEFAULT_SEGMENT_SIZE

            # Their SlaveSynchronize took our topics (from the VIP port), groups and offsets,
            # in files their broker loads again at its next start.
            group = unique("gha")
            total = len(early) + len(probes) + len(sent)
            consumed = consume(rocketmq, tmp_path / "c1", namesrv, topic, group, total)
            assert len({line["msgId"] for line in consumed}) == total
            config_dir = tmp_path / "their_slave" / "store" / "config"
            # A 5.x slave syncs every 60 s, the first time a minute after start, and serves no
            # topic before it has synced its config: for 5.x the rest waits about a minute.
            wait_metadata_synced(config_dir, topic, group, total, "their slave",
                                 timeout=40 if peer.major < 5 else 90)
            # fastjson text (integer keys unquoted), as their master would have sent.
            wait_for(lambda: "offsetTable" in read_whole_json(config_dir / "delayOffset.json"),
                     "their slave's delayOffset.json", timeout=20)

            # Our master goes; a Java consumer reads everything from their slave.
            cluster.stop(cluster.master)
            fresh = consume(rocketmq, tmp_path / "c2", namesrv, topic, unique("gslave"), total)
            assert {line["msgId"] for line in fresh} >= {line["msgId"] for line in sent}
            if peer.major >= 5:
                return
            # ... and their slave starts again from what it stored (a file it cannot load,
            # such as a bad delayOffset.json, would stop a 4.x broker: exit -3).
            slave.stop()
            slave = peer.start_broker(
                tmp_path / "their_slave",
                real_slave_properties(peer, namesrv, slave_port, config.broker_name),
                name="slave")
        finally:
            slave.kill()


def wait_metadata_synced(config_dir: Path, topic: str, group: str, committed: int,
                         whose: str, *, timeout: float) -> None:
    """Until a slave's config files hold the topic, the group and the group's final offsets
    (``committed`` in all): they arrive with the slave's next sync after the consumer's last
    commit reached the master. Offsets are fastjson text (integer keys unquoted)."""
    def offsets() -> int:
        table = read_whole_json(config_dir / "consumerOffset.json").get("offsetTable", {})
        return sum(table.get(f"{topic}@{group}", {}).values())
    wait_for(lambda: topic in _read(config_dir / "topics.json")
             and group in _read(config_dir / "subscriptionGroup.json")
             and offsets() == committed,
             f"{whose} to sync the master's metadata", timeout=timeout)


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def read_whole_json(path: Path) -> dict:
    """A broker's config file, or {} while it is missing or being written: each sync
    rewrites it in place (RocketMQ 5.x's ``MixAll.string2File`` copies the old text to
    ``.bak``, then writes the file itself), so a read can find it empty or cut short."""
    try:
        return read_json(_read(path) or "{}")
    except WireError:
        return {}


# ---- point 3: our slave, their master ------------------------------------------------------------


def our_slave_properties(store: Path, broker_name: str, broker_id: int,
                         **extra: object) -> dict[str, str]:
    values = {
        "brokerClusterName": "PeerCluster", "brokerName": broker_name,
        "brokerId": broker_id, "brokerRole": "SLAVE", "listenPort": free_broker_port(),
        "bindAddress": "127.0.0.1", "brokerIP1": "127.0.0.1", "haBindAddress": "127.0.0.1",
        "storePathRootDir": str(store), "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
        **extra,
    }
    return {key: str(value) for key, value in values.items()}


@pytest.mark.parametrize("peer_name", PEERS)
def test_point_3_our_slave_replicates_from_a_real_sync_master(peer_name, request, rocketmq,
                                                             tmp_path):
    peer: RocketMQ = request.getfixturevalue(peer_name)
    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    master_port = free_broker_port()
    broker_name = "peer-a"
    namesrv = peer.start_namesrv(tmp_path / "their_ns", namesrv_port)
    slaves: list[NodeProcess] = []
    master = load = None
    try:
        master = peer.start_broker(tmp_path / "their_master", {
            "brokerClusterName": "PeerCluster", "brokerName": broker_name, "brokerId": 0,
            "brokerRole": "SYNC_MASTER", "flushDiskType": "ASYNC_FLUSH",
            "namesrvAddr": namesrv_addr, "listenPort": master_port,
            "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE, "maxMessageSize": 512 * 1024,
            "maxHashSlotNum": 1000, "maxIndexNum": 4000, "registerNameServerPeriod": 10000,
            **version_properties(peer, master_port, "SYNC_MASTER"),
        }, name="master")
        topic = unique("Ha3T")
        # No slave yet. 4.x answers at once; a 5.x SYNC_MASTER (inSyncReplicas=2) waits
        # syncFlushTimeout (5 s) for one and then says so.
        # A 5.x broker may print its boot line before its first registration is done: send
        # once its route is known. (The client's own timeout outlasts the broker's 5 s wait.)
        deadline = time.monotonic() + 30
        early = produce(rocketmq, tmp_path / "producer", namesrv_addr, topic, 1,
                        "--timeout", 15_000)
        while "status" not in early[0] and time.monotonic() < deadline:
            time.sleep(1)
            early = produce(rocketmq, tmp_path / "producer", namesrv_addr, topic, 1,
                            "--timeout", 15_000)
        expected = "SLAVE_NOT_AVAILABLE" if peer.major < 5 else "FLUSH_SLAVE_TIMEOUT"
        assert {line.get("status") for line in early} == {expected}, early
        log_dir = str(tmp_path / "our_logs")
        os.makedirs(log_dir)
        # One slave learns the master through their name server, one is pointed at its HA
        # port (haMasterAddress, no name server: it registers nowhere).
        slaves.append(NodeProcess.start("slave1", {"kind": "broker", "properties":
            our_slave_properties(tmp_path / "our_slave1", broker_name, 1,
                                 namesrvAddr=namesrv_addr)}, log_dir=log_dir))
        slaves.append(NodeProcess.start("slave2", {"kind": "broker", "properties":
            our_slave_properties(tmp_path / "our_slave2", broker_name, 2,
                                 haMasterAddress=f"127.0.0.1:{master_port + 1}")},
            log_dir=log_dir))

        probes = wait_attached(rocketmq, tmp_path, namesrv_addr, topic,
                               "their SYNC_MASTER to see our slave")
        # While the load runs, our slave's log is a prefix of theirs at every look, up to the
        # end it reports: ask it first, then read ours, then theirs (each only grows).
        # (The 4.9.7 client: with a 5.x client the real 5.x broker stores a batch's messages
        # under one msgId, docs/differences.md.)
        load = rocketmq.start_program(tmp_path / "load", CLIENT, "produce", "--namesrv",
                                  namesrv_addr, "--topic", topic, "--count", 1400, "--size",
                                  1024, "--mode", "batch", "--batch", 16, name="load")
        looks = 0
        while load.poll() is None and looks < 20:
            end = our_log_end(slaves[0])
            first, ours_now = commitlog_bytes(tmp_path / "our_slave1" / "commitlog")
            _, theirs_now = commitlog_bytes(tmp_path / "their_master" / "store" / "commitlog")
            assert first == 0 and len(ours_now) >= end
            assert theirs_now[:end] == ours_now[:end]
            looks += 1
            time.sleep(0.2)
        load.wait(120)
        sent = program_lines(load.output())[:-1]
        assert len(sent) == 1400 and {line["status"] for line in sent} == {"SEND_OK"}
        # A delayed message: their master's scheduler keeps delay offsets, which our slave
        # copies as a 4.9 slave does (GET_ALL_DELAY_OFFSET, stored verbatim).
        delayed = produce(rocketmq, tmp_path / "producer", namesrv_addr, unique("Delay"), 1,
                          "--delay", 1)
        assert delayed[0]["status"] == "SEND_OK"
        total = len(early) + len(probes) + len(sent)
        group = unique("g3")
        consumed = consume(rocketmq, tmp_path / "c1", namesrv_addr, topic, group, total)
        assert len({line["msgId"] for line in consumed}) == total

        status = broker_status(rocketmq, tmp_path / "adm", namesrv_addr,
                               f"127.0.0.1:{master_port}")
        their_max = int(status["commitLogMaxOffset"])
        assert their_max > DEFAULT_SEGMENT_SIZE
        _, their_bytes = commitlog_bytes(tmp_path / "their_master" / "store" / "commitlog")
        for slave in slaves:
            directory = tmp_path / slave.name.replace("slave", "our_slave") / "commitlog"
            wait_for(lambda d=directory: len(commitlog_bytes(d)[1]) >= their_max
                     and commitlog_bytes(d)[1][:their_max] == their_bytes[:their_max],
                     f"{slave.name}'s commitlog to equal theirs")
            slave.check()

        # The slave that knows the master's remoting address (from the name server) took its
        # metadata as a 4.9 slave does; its own status agrees with the master's.
        config_dir = tmp_path / "our_slave1" / "config"
        wait_metadata_synced(config_dir, topic, group, total, "our slave", timeout=40)
        # Level 1 (1 s) has delivered the delayed message: its offset is 1 on their master,
        # and so on our slave once synced.
        wait_for(lambda: read_whole_json(config_dir / "delayOffset.json")
                 .get("offsetTable", {}).get("1") == 1,
                 "our slave to copy their delay offsets", timeout=40)
        # Their master may still write (the scheduler puts the delayed message back into its
        # topic when level 1 is due, which can be after their_max was read): the two agree at a
        # look where their master did not move while ours was read.
        def max_offsets_agree() -> bool:
            before = broker_status(rocketmq, tmp_path / "adm", namesrv_addr,
                                   f"127.0.0.1:{master_port}")["commitLogMaxOffset"]
            ours = broker_status(rocketmq, tmp_path / "adm", namesrv_addr,
                                 slaves[0].addr)["commitLogMaxOffset"]
            after = broker_status(rocketmq, tmp_path / "adm", namesrv_addr,
                                  f"127.0.0.1:{master_port}")["commitLogMaxOffset"]
            assert int(ours) <= int(after), (ours, after)
            return before == after == ours

        wait_for(max_offsets_agree, "our slave's brokerStatus max offset to equal their master's",
                 timeout=60)

        # Their master goes; a Java consumer reads everything from our slave.
        master.stop()
        fresh = consume(rocketmq, tmp_path / "c2", namesrv_addr, topic, unique("gslave"), total)
        assert {line["msgId"] for line in fresh} >= {line["msgId"] for line in sent}
        for slave in slaves:
            slave.check()
    finally:
        if load is not None and load.poll() is None:
            load.kill()  # a check failed while it ran: it must not outlive the test
        for slave in slaves:
            slave.stop()
        if master is not None:
            master.kill()
        namesrv.kill()
