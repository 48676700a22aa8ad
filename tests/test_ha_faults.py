"""Fault injection for HA replication (DESIGN §4, §6, §7; docs/ha-protocol.md and
docs/differences.md).

A broken network between slave and master (``trio_ha.testing.FaultProxy``: stalls, cuts at
exact places of the frame stream, late and fragmented delivery), a slave process killed with
SIGKILL, hostile peers on the master's HA port, and a fake master. Throughout:

- replication recovers by itself, and the slave's commitlog ends up byte-identical to the
  master's (nothing duplicated, nothing missing) with equal consume queues;
- a SYNC_MASTER put returns PUT_OK only when a slave holds the record: checked at the moment
  each put returns, against the in-process slave's log end; puts during a fault get
  FLUSH_SLAVE_TIMEOUT or SLAVE_NOT_AVAILABLE.

Real loopback sockets and real time with short intervals. trio's autojump clock jumps as soon
as every task is blocked, which includes "waiting for the kernel to move loopback bytes", so
with real sockets the protocol timeouts would fire spuriously; the timers are instead tested
here with intervals of 100 ms - 1 s, and no test asserts a duration.
"""

from __future__ import annotations

import contextlib
import random
import signal
import socket as stdsocket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

import ha_slave_process
from conftest import ha_of, ha_slave_of, wait_until
from trio_ha import BrokerRole, Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.ha import SlaveConnectionStatistics
from trio_ha.testing import open_fault_proxy

SEGMENT = 64 * 1024
TOPIC = "Fault"
QUEUES = 3
OK = PutMessageStatus.PUT_OK
NOT_REPLICATED = {PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE}
REPORT = struct.Struct(">q")
FRAME = struct.Struct(">qi")
#: timers short enough for tests: heartbeats 100 ms, housekeeping 1 s, reconnect 100 ms
FAST = dict(ha_send_heartbeat_interval=100, ha_housekeeping_interval=1000, ha_reconnect_interval=100)

_CHILD_PATH = Path(ha_slave_process.__file__)


# ---- configuration and helpers -----------------------------------------------------------------


def master_config(root, role=BrokerRole.SYNC_MASTER, **overrides) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=role, ha_listen_port=0,
        ha_bind_address="127.0.0.1", ha_start_from_min_offset=True, slave_timeout=500, **FAST,
    )
    values.update(overrides)
    return StoreConfig(**values)


def slave_config(root, master_address: str | None, **overrides) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
        ha_master_address=master_address, **FAST,
    )
    values.update(overrides)
    return StoreConfig(**values)


def address_text(address) -> str:
    return f"{address[0]}:{address[1]}"


def body(i: int) -> bytes:
    """Deterministic bodies of varied sizes, so frames cut records at many places."""
    size = random.Random(i).randint(30, 3000)
    return (f"<{i}>".encode() * size)[:size]



def ha_address_of(master: MessageStore) -> tuple[str, int]:
    assert master.ha_address is not None
    return master.ha_address


def connections(store: MessageStore) -> dict[str, SlaveConnectionStatistics]:
    """The master's slave connections by peer address."""
    return {c.address: c for c in ha_of(store).connections}


def max_offset(store) -> int:
    return store.statistics().max_commitlog_offset


async def wait_caught_up(master, slave, timeout: float = 20.0) -> int:
    """Wait until the slave holds (and has dispatched) everything the master has."""
    end = max_offset(master)
    await wait_until(lambda: max_offset(slave) >= end, f"the slave to reach {end}",
                     timeout=timeout)
    assert max_offset(slave) == end
    with trio.fail_after(timeout):
        await slave.wait_dispatched(end)
    return end


async def assert_queues_agree(master, slave) -> int:
    total = 0
    for queue_id in range(QUEUES):
        high = master.max_queue_offset(TOPIC, queue_id)
        assert slave.max_queue_offset(TOPIC, queue_id) == high
        ours = await master.get_messages(TOPIC, queue_id, 0, high + 1)
        theirs = await slave.get_messages(TOPIC, queue_id, 0, high + 1)
        assert len(ours) == high
        assert ours == theirs
        total += high
    return total


def segment_files(root) -> dict[str, bytes]:
    directory = Path(root) / "commitlog"
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def assert_identical_commitlogs(master_root, slave_root) -> None:
    ours, theirs = segment_files(master_root), segment_files(slave_root)
    assert ours, "the master has no segments"
    assert sorted(theirs) == sorted(ours)
    for name, data in ours.items():
        other = theirs[name]
        if other != data:
            first = next(i for i, (a, b) in enumerate(zip(data, other, strict=True)) if a != b) \
                if len(other) == len(data) else min(len(data), len(other))
            pytest.fail(f"segment {name} differs at byte {first} (log offset "
                        f"{int(name) + first}); sizes {len(data)} / {len(other)}")


def log_bytes(root, start: int, end: int) -> bytes:
    """Bytes [start, end) of the commitlog under ``root``, read from its segment files."""
    out = bytearray()
    for name, data in segment_files(root).items():
        base = int(name)
        lo, hi = max(start, base), min(end, base + len(data))
        if lo < hi:
            assert base + (lo - base) == start + len(out), "a gap in the segment files"
            out += data[lo - base : hi - base]
    assert len(out) == end - start
    return bytes(out)


@attrs.define(eq=False)
class Putter:
    """Puts on the master and checks every result the moment it returns.

    ``fault`` is set by the test while a fault is active: a put that started and finished
    within one fault is recorded in ``during_fault``. With an in-process ``slave``, a
    SYNC_MASTER PUT_OK whose record end the slave's log has not reached is a violation."""

    master: MessageStore
    slave: MessageStore | None = None
    sync: bool = True
    puts: int = 0
    results: list = attrs.field(factory=list)
    during_fault: list = attrs.field(factory=list)
    violations: list[str] = attrs.field(factory=list)
    fault: int | None = None

    async def put(self):
        i = self.puts
        self.puts += 1
        fault = self.fault
        result = await self.master.put_message(
            Message(TOPIC, body(i), tags=f"t{i % 3}", keys=f"k{i}"), queue_id=i % QUEUES
        )
        allowed = {OK} | (NOT_REPLICATED if self.sync else set())
        if result.status not in allowed:
            self.violations.append(f"put {i}: unexpected status {result.status}")
        if result.status is OK and self.sync and self.slave is not None:
            slave_end = max_offset(self.slave)
            end = result.commitlog_offset + result.size
            if slave_end < end:
                self.violations.append(
                    f"put {i}: PUT_OK for a record ending at {end}, but the slave's log ends "
                    f"at {slave_end}"
                )
        self.results.append(result)
        if fault is not None and self.fault == fault:
            self.during_fault.append((fault, result.status))
        return result

    async def run(self, stop: trio.Event, *, max_puts: int = 3000, pause: float = 0.002):
        while not stop.is_set() and self.puts < max_puts:
            result = await self.put()
            await trio.sleep(pause if result.status is OK else 5 * pause)

    async def put_until_ok(self, attempts: int = 200):
        """Put until one returns PUT_OK: replication works (again)."""
        with trio.fail_after(20):
            for _ in range(attempts):
                result = await self.put()
                if result.status is OK:
                    return result
                await trio.sleep(0.02)
        pytest.fail(f"no PUT_OK in {attempts} puts")

    async def until_replicating(self):
        """SYNC_MASTER: a PUT_OK; ASYNC_MASTER: a put that reached the slave."""
        if self.sync:
            return await self.put_until_ok()
        result = await self.put()
        end = result.commitlog_offset + result.size
        slave = self.slave
        assert slave is not None, "an ASYNC_MASTER putter follows its slave"
        await wait_until(lambda: max_offset(slave) >= end, "the slave to replicate")
        return result

    def statuses(self, fault: int | None = None) -> list:
        return [s for f, s in self.during_fault if fault is None or f == fault]


@contextlib.asynccontextmanager
async def putting(putter: Putter, tasks: int = 2, **kwargs):
    """Run ``tasks`` put loops for the block."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(lambda: putter.run(stop, **kwargs))
        try:
            yield
        finally:
            stop.set()


@contextlib.asynccontextmanager
async def proxied_pair(tmp_path, role, *, master_overrides=None, slave_overrides=None, seed=0):
    """Master, fault proxy, and a slave that replicates through the proxy."""
    async with open_store(master_config(tmp_path / "m", role, **(master_overrides or {}))) as master:
        async with open_fault_proxy(ha_address_of(master), seed=seed) as proxy:
            config = slave_config(tmp_path / "s", proxy.address_text, **(slave_overrides or {}))
            async with open_store(config) as slave:
                yield master, proxy, slave


async def finish_and_compare(master, slave, putter: Putter) -> None:
    """After the faults: replication caught up, queues equal, no violation."""
    if putter.sync:
        await putter.put_until_ok()
    await wait_caught_up(master, slave)
    assert await assert_queues_agree(master, slave) == sum(
        r.status.stored for r in putter.results
    )
    assert putter.violations == []


# ---- 1. a broken network between slave and master ---------------------------------------------


async def test_stall_shorter_than_housekeeping_times_puts_out_and_keeps_the_connection(tmp_path):
    settings = dict(ha_housekeeping_interval=3000, slave_timeout=300)
    async with proxied_pair(tmp_path, BrokerRole.SYNC_MASTER, master_overrides=settings,
                            slave_overrides=dict(ha_housekeeping_interval=3000)) as (master, proxy, slave):
        putter = Putter(master, slave)
        await putter.put_until_ok()
        async with putting(putter):
            await trio.sleep(0.2)
            proxy.stall()
            putter.fault = 1
            await trio.sleep(1.0)
            putter.fault = None
            proxy.resume()
            await trio.sleep(0.3)
        await finish_and_compare(master, slave, putter)
        during = putter.statuses(1)
        # Nothing crossed the proxy while those puts ran: none may claim a slave has them.
        assert during and set(during) <= NOT_REPLICATED, during
        assert PutMessageStatus.FLUSH_SLAVE_TIMEOUT in during
        # A stall shorter than haHousekeepingInterval does not cost the connection.
        assert proxy.accepted == 1
    assert_identical_commitlogs(tmp_path / "m", tmp_path / "s")


@pytest.mark.parametrize("role", [BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER])
async def test_stall_past_housekeeping_both_sides_give_up_and_replication_recovers(tmp_path, role):
    settings = dict(ha_housekeeping_interval=500, slave_timeout=300)
    async with proxied_pair(tmp_path, role, master_overrides=settings,
                            slave_overrides=dict(ha_housekeeping_interval=500)) as (master, proxy, slave):
        putter = Putter(master, slave, sync=role is BrokerRole.SYNC_MASTER)
        await putter.until_replicating()
        await wait_until(lambda: proxy.connections[0].server_address in connections(master),
                         "the master to list the proxied slave")
        first = proxy.connections[0].server_address
        async with putting(putter):
            await trio.sleep(0.2)
            proxy.stall()
            putter.fault = 1
            # Both ends notice the silence on their own: the master drops the connection
            # (housekeeping on reads), the slave ends its session and reconnects.
            await wait_until(lambda: first not in connections(master),
                             "the master's housekeeping to drop the stalled slave")
            await wait_until(lambda: proxy.accepted >= 2,
                             "the slave's housekeeping to end the session and reconnect")
            await trio.sleep(0.3)
            putter.fault = None
            proxy.resume()
            await trio.sleep(0.3)
        await finish_and_compare(master, slave, putter)
        during = putter.statuses(1)
        assert during
        if putter.sync:
            assert set(during) <= NOT_REPLICATED, during
            assert PutMessageStatus.SLAVE_NOT_AVAILABLE in during
        else:
            assert set(during) == {OK}
    assert_identical_commitlogs(tmp_path / "m", tmp_path / "s")


#: where to cut the master -> slave stream: (what, bytes into it)
CUTS = [("body", 0), ("body", 1), ("body", 97), ("header", 5), ("header", 11),
        ("body", 1500), ("header", 8), ("raw", 3)]


@pytest.mark.parametrize(("role", "method"), [
    (BrokerRole.ASYNC_MASTER, "send"),
    (BrokerRole.SYNC_MASTER, "send"),
    (BrokerRole.SYNC_MASTER, "sendfile"),
])
async def test_cuts_at_exact_places_of_the_frame_stream_lose_and_duplicate_nothing(
    tmp_path, role, method
):
    sync = role is BrokerRole.SYNC_MASTER
    async with proxied_pair(tmp_path, role, master_overrides=dict(ha_transfer_method=method)) as (
        master, proxy, slave
    ):
        putter = Putter(master, slave, sync=sync)
        await putter.until_replicating()
        async with putting(putter):
            for number, (what, at) in enumerate(CUTS, 1):
                putter.fault = number
                with trio.fail_after(10):
                    if what == "body":
                        cut = await proxy.cut_mid_frame(at)
                    elif what == "header":
                        cut = await proxy.cut_mid_header(at)
                    else:
                        cut = await proxy.cut_after(at)
                putter.fault = None
                if what == "body":
                    # Inside a data frame: its header and exactly `at` body bytes got through.
                    assert cut.frame_size is not None and cut.frame_size > at, cut
                    assert cut.body_bytes == at, cut
                elif what == "header":
                    assert cut.header_bytes == at and cut.frame_size is None, cut
                # The slave reconnects through the proxy and asks for the exact byte after
                # what it got: no earlier than the cut frame (it had every whole frame before
                # it), no later than what crossed the proxy.
                await wait_until(lambda cut=cut: proxy.accepted > cut.connection,
                                 "the slave to reconnect")
                again = proxy.connections[cut.connection]
                await wait_until(
                    lambda again=again: again.server_address is not None
                    and again.server_address in connections(master)
                    and connections(master)[again.server_address].requested_offset is not None,
                    "the slave's first report on the new connection",
                )
                assert again.server_address is not None
                requested = connections(master)[again.server_address].requested_offset
                assert requested is not None  # waited for above
                if cut.frame_offset is not None:
                    assert cut.frame_offset <= requested <= cut.frame_offset + cut.body_bytes
                await putter.until_replicating()
        await finish_and_compare(master, slave, putter)
        assert len(proxy.cuts) == len(CUTS)
        assert proxy.accepted >= len(CUTS) + 1
    assert_identical_commitlogs(tmp_path / "m", tmp_path / "s")


@pytest.mark.parametrize("role", [BrokerRole.ASYNC_MASTER, BrokerRole.SYNC_MASTER])
async def test_late_fragmented_delivery_keeps_replicating(tmp_path, role):
    """Every chunk forwarded 1 ms late, in random pieces of 1-997 bytes (headers and
    reports split anywhere)."""
    sync = role is BrokerRole.SYNC_MASTER
    async with proxied_pair(tmp_path, role, master_overrides=dict(slave_timeout=3000),
                            seed=7) as (master, proxy, slave):
        putter = Putter(master, slave, sync=sync)
        await putter.until_replicating()
        async with putting(putter, max_puts=600):
            proxy.set_delay(0.001, max_chunk=997)
            putter.fault = 1
            await trio.sleep(1.5)
            putter.fault = None
            proxy.set_delay(0)
        await finish_and_compare(master, slave, putter)
        during = putter.statuses(1)
        assert during.count(OK) >= 10, during
        assert proxy.accepted == 1  # slow is not dead
    assert_identical_commitlogs(tmp_path / "m", tmp_path / "s")


# ---- 2. SIGKILL of a slave process ------------------------------------------------------------


@contextlib.asynccontextmanager
async def slave_process(store_dir: Path, master_address: str, log_path: Path):
    """Run tests/ha_slave_process.py until the block ends (SIGKILL at the latest)."""
    with await trio.to_thread.run_sync(open, log_path, "ab") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(_CHILD_PATH), str(store_dir), master_address],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
        )
    assert process.stdin is not None and process.stdout is not None
    try:
        output = b""
        with trio.fail_after(60):
            while b"READY\n" not in output:
                data = await process.stdout.receive_some(4096)
                if not data:
                    await process.wait()
                    pytest.fail(f"the slave process exited ({process.returncode}) before READY:"
                                f"\n{await trio.Path(log_path).read_text(errors='replace')}")
                output += data
        yield process
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()
            await process.stdin.aclose()
            await process.stdout.aclose()


async def kill(process) -> None:
    process.send_signal(signal.SIGKILL)
    with trio.fail_after(10):
        await process.wait()
    assert process.returncode == -signal.SIGKILL


async def assert_acknowledged_on_slave(slave_dir: Path, master, putter: Putter) -> int:
    """Open the killed slave's store in this process (no master: nothing new arrives) and
    check that every PUT_OK record is there, intact, and that its log is a byte prefix of the
    master's. Returns the slave's log end."""
    config = ha_slave_process.slave_config(str(slave_dir), None)
    async with open_store(config) as slave:
        recovery = slave.statistics().recovery
        assert recovery is not None and recovery.abnormal  # killed: its abort file was left
        end = max_offset(slave)
        acked = [r for r in putter.results if r.status is OK]
        assert acked
        for result in acked:
            assert result.commitlog_offset + result.size <= end
            ours = await master.look_message_by_offset(result.commitlog_offset)
            theirs = await slave.look_message_by_offset(result.commitlog_offset)
            assert theirs is not None and theirs == ours
    start = int(min(segment_files(slave_dir)))
    assert log_bytes(slave_dir, start, end) == log_bytes(master.config.store_path_root_dir, start, end)
    return end


async def test_sigkill_slave_process_under_sync_master(tmp_path):
    master_dir, slave_dir = tmp_path / "m", tmp_path / "s"
    log_path = tmp_path / "slave-process.stderr"
    async with open_store(master_config(master_dir)) as master:
        address = address_text(master.ha_address)
        putter = Putter(master)  # the slave is another process: checked after each kill
        async with slave_process(slave_dir, address, log_path) as process:
            await putter.put_until_ok()
            for _ in range(100):
                await putter.put()
            await putter.put_until_ok()
            await kill(process)  # the instant a put returned PUT_OK: that record must survive
            # Nobody holds the new records: never PUT_OK, and the answer comes within the
            # slave timeout (a status, not a hang).
            with trio.fail_after(10):
                after_kill = [(await putter.put()).status for _ in range(5)]
            assert set(after_kill) <= NOT_REPLICATED, after_kill
        first_end = await assert_acknowledged_on_slave(slave_dir, master, putter)

        async with slave_process(slave_dir, address, log_path) as process:
            await putter.put_until_ok()
            for _ in range(100):
                await putter.put()
            await putter.put_until_ok()
            await kill(process)
        second_end = await assert_acknowledged_on_slave(slave_dir, master, putter)
        assert second_end > first_end

        # The same store, now in this process, catches up and matches byte for byte.
        async with open_store(ha_slave_process.slave_config(str(slave_dir), address)) as slave:
            putter.slave = slave
            await finish_and_compare(master, slave, putter)
    assert putter.violations == []
    assert_identical_commitlogs(master_dir, slave_dir)


# ---- 3. hostile peers on the master's HA port ---------------------------------------------------


async def connect(address) -> trio.SocketStream:
    return await trio.open_tcp_stream(*address)


def local_address(stream: trio.SocketStream) -> str:
    return address_text(stream.socket.getsockname())


async def read_until_closed(stream: trio.SocketStream, timeout: float = 10.0) -> bytes:
    """Everything the master sends until it closes the connection."""
    received = bytearray()
    with trio.fail_after(timeout):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:  # reset
                break
            if not data:
                break
            received += data
    return bytes(received)


@contextlib.asynccontextmanager
async def replicating(tmp_path, **master_overrides):
    """A SYNC_MASTER with a real slave (direct) and puts running that must all be PUT_OK."""
    values: dict[str, Any] = dict(slave_timeout=3000)
    values.update(master_overrides)
    async with open_store(master_config(tmp_path / "m", **values)) as master:
        async with open_store(slave_config(tmp_path / "s", address_text(master.ha_address))) as slave:
            putter = Putter(master, slave)
            await putter.put_until_ok()
            (real,) = connections(master)
            replicating_from = len(putter.results)
            async with putting(putter, max_puts=1000, pause=0.005):
                yield master, slave, putter
                await wait_until(lambda: len(putter.results) - replicating_from >= 20,
                                 "puts alongside the hostile peer")
            await finish_and_compare(master, slave, putter)
            # The real slave kept its one connection and every put was PUT_OK.
            assert list(connections(master)) == [real]
            assert {r.status for r in putter.results[replicating_from:]} == {OK}


async def assert_dropped(master, hostile: str) -> None:
    await wait_until(lambda: hostile not in connections(master),
                     f"the master to drop {hostile}")


@pytest.mark.parametrize("garbage", [
    b"\xff" * 64,  # a negative offset
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",  # a huge first request, then worse
    random.Random(3).randbytes(4096),
], ids=["negative", "http", "random"])
async def test_garbage_costs_only_the_senders_connection(tmp_path, garbage):
    async with replicating(tmp_path) as (master, slave, putter):
        stream = await connect(master.ha_address)
        hostile = local_address(stream)
        await stream.send_all(garbage)
        await read_until_closed(stream)
        await assert_dropped(master, hostile)
        await stream.aclose()


async def test_torn_report_then_close(tmp_path):
    async with replicating(tmp_path) as (master, slave, putter):
        stream = await connect(master.ha_address)
        hostile = local_address(stream)
        await wait_until(lambda: hostile in connections(master), "the master to list the peer")
        await stream.send_all(REPORT.pack(0)[:3])
        await stream.aclose()
        await assert_dropped(master, hostile)


async def test_torn_report_then_silence_is_dropped_by_housekeeping(tmp_path):
    async with replicating(tmp_path, ha_housekeeping_interval=500) as (master, slave, putter):
        stream = await connect(master.ha_address)
        hostile = local_address(stream)
        await stream.send_all(REPORT.pack(0)[:3])
        assert await read_until_closed(stream) == b""  # no first report: nothing sent
        await assert_dropped(master, hostile)
        await stream.aclose()


@pytest.mark.parametrize("ack", ["beyond the log", "backwards"])
async def test_bad_ack_costs_only_the_senders_connection(tmp_path, ack):
    async with replicating(tmp_path) as (master, slave, putter):
        stream = await connect(master.ha_address)
        hostile = local_address(stream)
        start = max_offset(master)
        await stream.send_all(REPORT.pack(start))
        await wait_until(lambda: hostile in connections(master)
                         and connections(master)[hostile].acked_offset == start,
                         "the master to take the first report")
        await stream.send_all(REPORT.pack(2**62 if ack == "beyond the log" else start - 1))
        await read_until_closed(stream)
        await assert_dropped(master, hostile)
        await stream.aclose()


@pytest.mark.parametrize("beyond", [1, 2**62], ids=["one byte", "huge"])
async def test_bogus_ack_cannot_make_sync_master_put_ok_fixes_rocketmq_1155_3015(tmp_path, beyond):
    """No slave at all; a peer sends a first report, then acks bytes beyond the master's
    log while a SYNC_MASTER put waits (RocketMQ took the max of all acks, unchecked)."""
    async with open_store(master_config(tmp_path / "m", slave_timeout=500)) as master:
        putter = Putter(master)
        for _ in range(3):
            assert (await putter.put()).status is PutMessageStatus.SLAVE_NOT_AVAILABLE
        stream = await connect(master.ha_address)
        hostile = local_address(stream)
        start = max_offset(master)
        await stream.send_all(REPORT.pack(start))
        await wait_until(lambda: hostile in connections(master)
                         and connections(master)[hostile].acked_offset == start,
                         "the master to take the first report")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(putter.put)
            await wait_until(lambda: max_offset(master) > start, "the put to append")
            end = max_offset(master)
            await stream.send_all(REPORT.pack(min(end + beyond, 2**62)))
        (result,) = putter.results[-1:]
        assert result.commitlog_offset + result.size == end
        assert result.status in NOT_REPLICATED
        assert ha_of(master).replicated_offset < end
        await read_until_closed(stream)
        await assert_dropped(master, hostile)
        await stream.aclose()
        # And with the bogus peer gone, no slave: SLAVE_NOT_AVAILABLE at once.
        assert (await putter.put()).status is PutMessageStatus.SLAVE_NOT_AVAILABLE


async def test_ack_of_bytes_never_sent_on_that_connection_cannot_make_sync_master_put_ok(tmp_path):
    big: dict[str, Any] = dict(mapped_file_size_commit_log=1024 * 1024)
    async with open_store(master_config(tmp_path / "m", slave_timeout=500, **big)) as master:
        no_wait = {"WAIT": "false"}
        for i in range(250):  # 4 MB: more than the peer's and the master's socket buffers hold
            await master.put_message(Message("Big", bytes([i]) * 16384, properties=no_wait))
        sock = trio.socket.socket()
        sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 1)
        with sock:
            await sock.connect(ha_address_of(master))
            hostile = address_text(sock.getsockname())
            await sock.send(REPORT.pack(0))  # everything, please; then never read
            await wait_until(lambda: hostile in connections(master)
                             and connections(master)[hostile].acked_offset == 0,
                             "the master to take the request")
            putter = Putter(master)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(putter.put)
                start = max_offset(master)
                await wait_until(lambda: max_offset(master) > start, "the put to append")
                end = max_offset(master)
                await sock.send(REPORT.pack(end))  # at most the log end, so not refused
            stats = connections(master).get(hostile)
            # Nowhere near `end` went to this peer (its buffers hold ~2 MB at most).
            assert stats is None or (stats.next_transfer_offset or 0) < end - 1024 * 1024
            assert putter.results[-1].status is not OK


async def test_peer_that_resets_before_it_is_served_costs_only_its_connection(tmp_path):
    async with replicating(tmp_path) as (master, slave, putter):
        # Connect and reset (SO_LINGER 0) before the master's accept loop runs: the kernel
        # completes the handshake; the master accepts an already-reset socket.
        raw = stdsocket.socket()
        raw.connect(ha_address_of(master))
        raw.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_LINGER, struct.pack("ii", 1, 0))
        raw.close()
        await trio.testing.wait_all_tasks_blocked()  # the master has accepted and dropped it
        stream = await connect(master.ha_address)  # the listener still serves
        hostile = local_address(stream)
        await wait_until(lambda: hostile in connections(master), "the master to list a new peer")
        await stream.aclose()


async def test_peer_that_never_reads_blocks_only_its_own_writer(tmp_path):
    """A peer asks for the whole log and never reads: the master's writer for it blocks on
    a full socket buffer. The real slave is unaffected, and the master still closes cleanly
    with that writer blocked."""
    big: dict[str, Any] = dict(mapped_file_size_commit_log=1024 * 1024)
    master_dir = tmp_path / "m"
    sock = trio.socket.socket()
    sock.setsockopt(stdsocket.SOL_SOCKET, stdsocket.SO_RCVBUF, 1)
    watchdog_fired = False

    async def watchdog():
        # Closing the master must not wait for the blocked writer. If it does, free the
        # writer (our end goes away) so the test ends and says so, instead of hanging.
        nonlocal watchdog_fired
        await trio.sleep(10)
        watchdog_fired = True
        sock.close()

    try:
        async with trio.open_nursery() as outer:
            async with open_store(master_config(master_dir, slave_timeout=3000, **big)) as master:
                async with open_store(slave_config(tmp_path / "s", address_text(master.ha_address),
                                                   **big)) as slave:
                    await wait_until(lambda: any(c.acked_offset is not None
                                                 for c in connections(master).values()),
                                     "the slave to connect")
                    for i in range(250):  # 4 MB: more than a socket pair's buffers hold
                        result = await master.put_message(Message("Big", bytes([i]) * 16384))
                        assert result.status is OK
                    await sock.connect(ha_address_of(master))
                    hostile = address_text(sock.getsockname())
                    await sock.send(REPORT.pack(0))
                    async with trio.open_nursery() as nursery:
                        async def keep_reporting():
                            # Acks (of nothing new) so housekeeping keeps the peer: only its
                            # writer is stuck.
                            while True:
                                await trio.sleep(0.2)
                                await sock.send(REPORT.pack(0))

                        nursery.start_soon(keep_reporting)
                        sent = []

                        def writer_stuck() -> bool:
                            c = connections(master).get(hostile)
                            sent.append(None if c is None else c.bytes_sent)
                            return (len(sent) > 20 and sent[-1] is not None
                                    and len(set(sent[-20:])) == 1)

                        await wait_until(writer_stuck, "the writer for the peer to block",
                                         interval=0.02)
                        assert sent[-1] < max_offset(master)
                        results = [await master.put_message(Message("Big", b"after" * 100))
                                   for _ in range(50)]
                        assert {r.status for r in results} == {OK}
                        await wait_caught_up(master, slave)
                        nursery.cancel_scope.cancel()
                # The slave is gone; the peer is still connected, its writer still blocked,
                # as the master closes.
                stuck = connections(master).get(hostile)
                assert stuck is not None and stuck.bytes_sent == sent[-1]
                outer.start_soon(watchdog)
            outer.cancel_scope.cancel()
    finally:
        sock.close()
    assert not watchdog_fired, "closing the master waited for a writer blocked by its peer"
    async with open_store(master_config(master_dir, **big)) as master:
        recovery = master.statistics().recovery
        assert recovery is not None and not recovery.abnormal  # it closed cleanly


# ---- 3b. a fake master -------------------------------------------------------------------------


@attrs.define(eq=False)
class FakeMaster:
    """A listener that plays master: records reports, answers with ``frames``."""

    frames: bytes = b""
    accepted: int = 0
    reports: list[int] = attrs.field(factory=list)
    closed_by_slave: int = 0
    address: tuple[str, int] | None = None

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED):
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.address = listeners[0].socket.getsockname()[:2]
        task_status.started(self.address)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        async with stream:
            buffer = b""
            sent = False
            while True:
                try:
                    data = await stream.receive_some(4096)
                except trio.BrokenResourceError:
                    data = b""
                if not data:
                    self.closed_by_slave += 1
                    return
                buffer += data
                while len(buffer) >= 8:
                    self.reports.append(REPORT.unpack(buffer[:8])[0])
                    buffer = buffer[8:]
                if not sent and self.frames:
                    sent = True
                    await stream.send_all(self.frames)


@contextlib.asynccontextmanager
async def fake_master(frames: bytes = b""):
    fake = FakeMaster(frames)
    async with trio.open_nursery() as nursery:
        await nursery.start(fake.serve)
        yield fake
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("direction", ["ahead", "behind"])
async def test_frame_at_an_unexpected_offset_diverges_once_not_a_reconnect_loop_fixes_rocketmq_323(
    tmp_path, direction
):
    # A slave with some log, copied from a real master.
    async with open_store(master_config(tmp_path / "m")) as master:
        async with open_store(slave_config(tmp_path / "s", address_text(master.ha_address))) as slave:
            putter = Putter(master, slave)
            await putter.put_until_ok()
            for _ in range(20):
                assert (await putter.put()).status is OK
            end = await wait_caught_up(master, slave)
    wrong = end + 1000 if direction == "ahead" else end - 100
    async with fake_master(FRAME.pack(wrong, 0)) as fake:
        async with open_store(slave_config(tmp_path / "s", address_text(fake.address))) as slave:
            await wait_until(lambda: ha_slave_of(slave).state == "diverged",
                             "the slave to report the divergence")
            await trio.sleep(1.0)  # ten reconnect intervals
            await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
            stats = ha_slave_of(slave)
            assert stats.state == "diverged"
            assert stats.divergence is not None
            assert str(end) in stats.divergence and str(wrong) in stats.divergence
            assert fake.accepted == 1, "the diverged slave kept reconnecting"
            assert fake.reports[:1] == [end]
            assert fake.closed_by_slave == 1  # it let go of the connection
            assert max_offset(slave) == end  # and wrote nothing


# ---- 4. timers ---------------------------------------------------------------------------------


async def test_master_sends_heartbeats_to_an_idle_slave(tmp_path):
    config = master_config(tmp_path / "m", BrokerRole.ASYNC_MASTER, ha_housekeeping_interval=10_000)
    async with open_store(config) as master:
        for i in range(3):
            await master.put_message(Message(TOPIC, body(i)))
        end = max_offset(master)
        stream = await connect(master.ha_address)
        async with stream:
            await stream.send_all(REPORT.pack(end))  # up to date: only heartbeats are due
            received = b""
            with trio.fail_after(10):
                while len(received) < 2 * FRAME.size:
                    data = await stream.receive_some(4096)
                    assert data, "the master closed the connection"
                    received += data
            frames = [FRAME.unpack_from(received, i) for i in range(0, len(received) // 12 * 12, 12)]
            assert frames[:2] == [(end, 0), (end, 0)]


async def test_master_housekeeping_drops_a_slave_that_goes_silent(tmp_path):
    config = master_config(tmp_path / "m", ha_housekeeping_interval=500)
    async with open_store(config) as master:
        stream = await connect(master.ha_address)
        async with stream:
            await stream.send_all(REPORT.pack(0))
            await wait_until(lambda: len(connections(master)) == 1, "the master to list the peer")
            received = await read_until_closed(stream)  # heartbeats, then the close
            assert len(received) % FRAME.size == 0
        await wait_until(lambda: not ha_of(master).connections,
                         "the master to drop the connection")


async def test_slave_housekeeping_leaves_a_silent_master_and_reconnects(tmp_path):
    async with fake_master() as fake:  # accepts, reads reports, never sends a byte
        config = slave_config(tmp_path / "s", address_text(fake.address),
                              ha_housekeeping_interval=300)
        async with open_store(config) as slave:
            await wait_until(lambda: fake.accepted >= 2,
                             "the slave to give up on the silent master and reconnect")
            # It reported all the while (every 100 ms): RocketMQ 4.9.8 times out on its own
            # writes and would never notice.
            assert len(fake.reports) >= 2
            assert ha_slave_of(slave).last_error


async def test_slave_backs_off_and_retries_when_nobody_listens(tmp_path):
    with trio.socket.socket() as placeholder:  # holds the port; refuses connections
        await placeholder.bind(("127.0.0.1", 0))
        address = placeholder.getsockname()
        config = slave_config(tmp_path / "s", address_text(address))
        async with open_store(config) as slave:
            seen = set()

            def backed_off() -> bool:
                stats = ha_slave_of(slave)
                seen.add(stats.state)
                return stats.state == "backoff" and stats.last_error is not None

            await wait_until(backed_off, "the slave to back off", interval=0.002)
            assert seen <= {"idle", "connecting", "backoff"}
            # Now someone listens: the slave retries after its back-off and gets in.
            placeholder.listen(1)
            with trio.fail_after(10):
                accepted, _ = await placeholder.accept()
            with accepted:
                data = b""
                with trio.fail_after(10):
                    while len(data) < 8:
                        chunk = await accepted.recv(8)
                        assert chunk
                        data += chunk
                assert REPORT.unpack(data[:8]) == (0,)  # an empty slave's first report
