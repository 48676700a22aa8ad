"""Fixtures and helpers shared by the suite.

``wait_until``, ``pulled``, ``metric_total``, ``pulls_taken`` and the HA statistics
accessors ``ha_of`` / ``ha_slave_of`` are imported by the tests that use them (``from
conftest import wait_until``), not fixtures: module-level helpers of those tests call them
too, and plain functions need no plumbing to get there.

For the tests that drive the ``trio-ha`` executable from plain (not trio) test functions:
``cli`` runs it, ``ok_json`` runs it for JSON that must come, ``wait_for`` is ``wait_until``
for code that blocks, and ``stop_processes`` ends the nodes a fixture started.
"""

import inspect
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from trio_ha import FlushDiskType, MessageStore, StoreConfig
from trio_ha.broker.broker import BrokerAddresses
from trio_ha.store.ha import HAMasterStatistics, HASlaveStatistics
from trio_ha.testing import free_broker_port
from trio_ha.testing.etcd import EtcdCluster, EtcdNotInstalled, etcd_binary
from trio_ha.testing.rocketmq import (
    CLIENTS_VERSION,
    DEFAULT_VERSION,
    VERSION_5,
    RocketMQ,
    RocketMQUnavailable,
    controller_leader,
)
from trio_ha.wire import record as rec
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode


async def wait_until(predicate, what: str, *, timeout: float = 10.0, interval: float = 0.01):
    """Call ``predicate`` (a function, or an async function) every ``interval`` seconds until
    it returns something true, and return that; fail the test, naming ``what`` was awaited,
    if ``timeout`` seconds pass first. For what has no event to wait on (another process's
    state, a server's tables seen from outside); where a ``trio.Event`` or a watermark
    exists, wait on it instead."""
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(interval)
    pytest.fail(f"gave up after {timeout:g} s waiting for {what}")


def wait_for(check, what: str, attempts: int = 60, pause: float = 0.5):
    """``check()`` until it returns something true, and return that; fail, naming ``what``
    was awaited, after ``attempts`` looks ``pause`` seconds apart (bounded in count and time).
    ``wait_until`` for tests that run no trio loop (they drive child processes)."""
    for _ in range(attempts):
        value = check()
        if value:
            return value
        time.sleep(pause)
    raise AssertionError(f"{what}: not seen after {attempts} looks")


def cli(*args, env_namesrv: str | None = None, timeout: float = 120
        ) -> subprocess.CompletedProcess[str]:
    """``trio-ha ARGS...`` (``python -m trio_ha.cli``) to its end, output captured as text;
    with ``env_namesrv``, NAMESRV_ADDR set to it."""
    env = None if env_namesrv is None else {**os.environ, "NAMESRV_ADDR": env_namesrv}
    return subprocess.run([sys.executable, "-m", "trio_ha.cli", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def ok_json(*args):
    """``trio-ha ARGS... --json``, which must succeed: its output, decoded."""
    done = cli(*args, "--json")
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return json.loads(done.stdout)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """SIGTERM the nodes, last started first, and wait for each (30 s, then SIGKILL)."""
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


async def pulled(client, topic: str, queue: int = 0, offset: int = 0) -> list:
    """The messages of (topic, queue) from ``offset`` a PULL_MESSAGE over ``client`` (a
    remoting client) returns right now, decoded ([] when it finds none)."""
    reply = await client.invoke(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": topic, "queueId": queue, "queueOffset": offset,
        "maxMsgNums": 32, "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0,
        "subVersion": 0}), 5)
    if reply.code != ResponseCode.SUCCESS:
        return []
    out, view = [], memoryview(reply.body)
    while view:
        message = rec.decode_record(view)
        out.append(message)
        view = view[message.size:]
    return out


async def metric_total(metrics_addr: str, name: str) -> float:
    """The sum of the samples ``name`` in one scrape of a node's Prometheus endpoint: how a
    test sees a broker's counters when it holds only the broker's addresses (a cluster from
    ``serve_cluster``) — the pulls it has taken, say, to know one is parked."""
    host, port = metrics_addr.rsplit(":", 1)
    data = bytearray()
    with trio.fail_after(10):
        async with await trio.open_tcp_stream(host, int(port)) as stream:
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n")
            while chunk := await stream.receive_some(65536):
                data += chunk
    body = bytes(data).partition(b"\r\n\r\n")[2].decode()
    return sum(sample.value for family in text_string_to_metric_families(body)
               for sample in family.samples if sample.name == name)


async def pulls_taken(broker: BrokerAddresses) -> float:
    """The pull requests a broker (started with ``metricsPort=0``) has taken. It counts a pull
    and, finding nothing, parks it in the same step (nothing between waits): once the count
    has risen, the pull is parked."""
    assert broker.metrics_addr is not None, "the broker serves no metrics (metricsPort)"
    return await metric_total(broker.metrics_addr, "trio_ha_pull_requests_total")


class TaskCounts(trio.abc.Instrument):
    """Counts, by task name, the tasks spawned and the steps (scheduling rounds) they run,
    while ``counting``: what the fast-path tests (issue 11) pin. Add it with
    ``trio.lowlevel.add_instrument`` and remove it after."""

    def __init__(self) -> None:
        self.counting = True
        self.spawned: dict[str, int] = {}
        self.steps: dict[str, int] = {}

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if self.counting:
            self.spawned[task.name] = self.spawned.get(task.name, 0) + 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        if self.counting:
            self.steps[task.name] = self.steps.get(task.name, 0) + 1

    @staticmethod
    def of(counts: dict[str, int], suffix: str) -> int:
        """The count of the tasks whose name ends with ``suffix`` (a function's qualname)."""
        return sum(n for name, n in counts.items() if name.endswith(suffix))


def ha_of(master: MessageStore) -> HAMasterStatistics:
    """Replication as a master sees it (for a store that has an HA service)."""
    stats = master.statistics().ha
    assert stats is not None
    return stats


def ha_slave_of(slave: MessageStore) -> HASlaveStatistics:
    """Replication as a slave sees it."""
    stats = slave.statistics().ha_slave
    assert stats is not None
    return stats


@pytest.fixture
def make_config(tmp_path):
    """A StoreConfig in a temporary directory, with small segments so tests cross many."""

    def make(**overrides) -> StoreConfig:
        values: dict[str, Any] = dict(
            store_path_root_dir=str(tmp_path / "store"),
            mapped_file_size_commit_log=64 * 1024,
            mapped_file_size_consume_queue=20 * 100,
            flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        )
        values.update(overrides)
        return StoreConfig(**values)

    return make


@pytest.fixture
def store_dir(tmp_path):
    path = tmp_path / "store"
    os.makedirs(path, exist_ok=True)
    return path


def _rocketmq_peer(version: str, *, clients_only: bool = False) -> RocketMQ:
    """The real RocketMQ, fetched once per session; where it cannot run here the interop
    tests skip with the reason — or fail, under TRIO_HA_REQUIRE_ROCKETMQ=1 (CI)."""
    try:
        peer = RocketMQ.fetch(version, clients_only=clients_only)
        peer.compile_programs()
    except RocketMQUnavailable as exc:
        if os.environ.get("TRIO_HA_REQUIRE_ROCKETMQ") == "1":
            pytest.fail(f"TRIO_HA_REQUIRE_ROCKETMQ=1 but RocketMQ {version} cannot run: {exc}")
        pytest.skip(f"RocketMQ {version} cannot run here: {exc}")
    return peer


@pytest.fixture(scope="session")
def rocketmq() -> RocketMQ:
    """The real Apache RocketMQ 4.x with its servers (4.9.7: see trio_ha.testing.rocketmq
    for why)."""
    return _rocketmq_peer(DEFAULT_VERSION)


@pytest.fixture(scope="session")
def rocketmq_clients() -> RocketMQ:
    """The real Java client and mqadmin of RocketMQ 4.9.8, without servers (the registry
    serves no 4.9.8 broker or name server)."""
    return _rocketmq_peer(CLIENTS_VERSION, clients_only=True)


@pytest.fixture(scope="session")
def rocketmq5() -> RocketMQ:
    """The real Apache RocketMQ 5.3.3."""
    return _rocketmq_peer(VERSION_5)


@pytest.fixture
def controller5(rocketmq5, tmp_path):
    """The address of one real RocketMQ 5.3.3 controller (DLedger, a group of one) in
    ``tmp_path/controller``, once it leads; SIGKILLed after the test."""
    port = free_broker_port()
    address = f"127.0.0.1:{port}"
    controller = rocketmq5.start_controller(tmp_path / "controller", port)
    try:
        controller_leader([address])
        yield address
    finally:
        controller.kill()


@pytest.fixture(scope="session")
def etcd_installed() -> str:
    """The etcd executable (Debian's etcd-server). Where there is none, the tests that need
    it skip with the reason — or fail, under TRIO_HA_REQUIRE_ETCD=1 (CI)."""
    try:
        return etcd_binary()
    except EtcdNotInstalled as exc:
        if os.environ.get("TRIO_HA_REQUIRE_ETCD") == "1":
            pytest.fail(f"TRIO_HA_REQUIRE_ETCD=1 but {exc}")
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def _etcd3_cluster(etcd_installed, tmp_path_factory):
    """A real 3-member etcd cluster for one test module: started once (about two seconds),
    stopped after the module."""
    with EtcdCluster.start(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster


@pytest.fixture
def etcd3(_etcd3_cluster):
    """The module's 3-member etcd cluster, every member running and healthy when the test
    begins (a test before it may have killed or paused one). Tests share its keyspace: each
    uses keys of its own."""
    _etcd3_cluster.heal()
    return _etcd3_cluster
