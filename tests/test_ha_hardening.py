"""Issue 9's HA points, each attacked from outside over real loopback sockets (a frozen slave
is a real slave process stopped with SIGSTOP):

1. a peer on the HA port that learns the master's log end cannot make a SYNC_MASTER put
   PUT_OK by presenting it: a first report acknowledges nothing, an ack counts only for bytes
   its connection carried, and a refusal does not tell the log end;
9. a flood of reports costs one decoded report per read, and HA connections beyond
   haMaxConnections are closed at once;
14. a rogue master cannot make an empty slave start its log where no log can begin.

No test asserts a duration; the puts' slave timeout is short so that each test takes a few
seconds at most.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

import ha_slave_process
from conftest import ha_of, ha_slave_of, wait_until
from ha_slave_process import master_config
from trio_ha import BrokerRole, Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.chaos import hostile
from trio_ha.store import MessageStore
from trio_ha.store.ha import SlaveConnectionStatistics
from trio_ha.wire.ha import FRAME_HEADER as FRAME
from trio_ha.wire.ha import NEED_DATA, REPORT, MasterProtocol, NeedData, SlaveReport
from trio_ha.wire.layout import INT64_MAX

SEGMENT = 64 * 1024
OK = PutMessageStatus.PUT_OK
NOT_REPLICATED = {PutMessageStatus.FLUSH_SLAVE_TIMEOUT, PutMessageStatus.SLAVE_NOT_AVAILABLE}

_CHILD_PATH = Path(ha_slave_process.__file__)


def connections(master: MessageStore) -> dict[str, SlaveConnectionStatistics]:
    return {c.address: c for c in ha_of(master).connections}


def accepted(master: MessageStore) -> int:
    """Connections whose request the master accepted."""
    return sum(c.start_offset is not None for c in ha_of(master).connections)


def max_offset(store: MessageStore) -> int:
    return store.statistics().max_commitlog_offset


def address_text(address) -> str:
    return f"{address[0]}:{address[1]}"


def ha_address(master: MessageStore) -> str:
    assert master.ha_address is not None
    return address_text(master.ha_address)


async def connect(master: MessageStore) -> trio.SocketStream:
    return await hostile.connect_raw(ha_address(master))


async def receive_exactly(stream: trio.SocketStream, n: int) -> bytes:
    data = await hostile.receive_exactly(stream, n, timeout=5)
    assert len(data) == n, f"{len(data)} of {n} bytes before the master closed or 5 s passed"
    return data


@contextlib.asynccontextmanager
async def slave_process(store_dir: Path, master_address: str, log_path: Path):
    """tests/ha_slave_process.py replicating from ``master_address`` until the block ends."""
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
                    pytest.fail(f"the slave process exited ({process.returncode}) before READY")
                output += data
        yield process
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()
            await process.stdin.aclose()
            await process.stdout.aclose()


# ---- point 1 -----------------------------------------------------------------------------------


async def learn_the_end_from_a_refusal(master: MessageStore) -> int:
    """The old leak: ask for bytes far beyond the log; the refusal's heartbeat said where the
    log ends. Returns the offset the refusal carried."""
    answer = await hostile.ask_beyond_the_log(ha_address(master))
    assert answer.closed and len(answer.data) == FRAME.size, answer
    offset, size = FRAME.unpack(answer.data)
    assert size == 0  # a heartbeat
    return offset


async def present_the_end(master: MessageStore, end: int, *, from_just_below: bool) -> None:
    """A rogue that knows the log end ``end`` (a put's record ends there) tries to make that
    put PUT_OK on a fresh connection (``hostile.present_log_end``)."""
    presented = await hostile.present_log_end(ha_address(master), end,
                                              from_just_below=from_just_below)
    if from_just_below:
        assert presented.first_frame == (end - 1, 1) and presented.body_received == 1
    assert presented.reports_sent == 4  # the master took them all (none was beyond its log)


@attrs.define
class Puts:
    master: MessageStore
    results: list = attrs.field(factory=list)

    async def put(self, i: int):
        result = await self.master.put_message(Message("Point1", b"%d" % i * 50))
        self.results.append(result)
        return result

    async def until_ok(self, attempts: int = 200) -> None:
        """Put until one is PUT_OK: a slave replicates."""
        with trio.fail_after(20):
            for i in range(attempts):
                if (await self.put(i)).status is OK:
                    return
                await trio.sleep(0.05)
        pytest.fail(f"no PUT_OK in {attempts} puts")


@pytest.mark.parametrize("real_slave", ["frozen", "absent"])
async def test_point_1_a_rogue_that_learns_the_log_end_cannot_make_a_sync_master_put_ok(
    tmp_path, real_slave
):
    """RocketMQ #1155 again: with the only real slave frozen (SIGSTOP) or absent, a peer that
    learns the log end and presents it on a new connection must not make a waiting
    SYNC_MASTER put PUT_OK (it used to: 6 of 6 PUT_OK)."""
    async with open_store(master_config(tmp_path / "m")) as master:
        puts = Puts(master)
        async with contextlib.AsyncExitStack() as stack:
            if real_slave == "frozen":
                process = await stack.enter_async_context(slave_process(
                    tmp_path / "s", address_text(master.ha_address), tmp_path / "slave.log"
                ))
                await puts.until_ok()
                process.send_signal(signal.SIGSTOP)
                stack.callback(process.send_signal, signal.SIGCONT)
            else:
                # A rogue that says where its log ends and then neither reads nor acks: it
                # makes puts wait for slaves (as a frozen slave does) instead of
                # SLAVE_NOT_AVAILABLE at once.
                holder = await stack.enter_async_context(await connect(master))
                await holder.send_all(REPORT.pack(max_offset(master)))
                await wait_until(lambda: len(connections(master)) == 1, "the holder's request")
            attacked = []
            for i in range(1, 7):
                async with trio.open_nursery() as nursery:
                    before = max_offset(master)
                    nursery.start_soon(puts.put, i)
                    await wait_until(lambda before=before: max_offset(master) > before,
                                     "the put to append")
                    end = max_offset(master)  # what a rogue can learn (it used to be told)
                    await present_the_end(master, end, from_just_below=i % 2 == 0)
                result = puts.results[-1]
                assert result.commitlog_offset + result.size == end
                attacked.append(result.status)
            assert set(attacked) <= NOT_REPLICATED, attacked
            # And the refusal of a request beyond the log no longer says where the log ends.
            assert await learn_the_end_from_a_refusal(master) != max_offset(master)


async def test_point_1_a_real_slave_that_restarts_with_a_full_log_counts_from_its_first_new_byte(
    tmp_path,
):
    """The classic protocol still works for a slave that restarts with a full log: it reports
    its end first, the master sends from there, and its acks of the new bytes answer puts."""
    async with open_store(master_config(tmp_path / "m", ha_housekeeping_interval=1000)) as master:
        puts = Puts(master)
        address = address_text(master.ha_address)
        for restart in range(2):
            async with slave_process(tmp_path / "s", address, tmp_path / "slave.log"):
                await puts.until_ok()
                (connection,) = connections(master).values()
                assert connection.counted and connection.start_offset is not None
                if restart:  # it came back with its log, and was not sent it again
                    assert connection.requested_offset == connection.start_offset > 0
                statuses = [(await puts.put(10 + i)).status for i in range(20)]
                assert set(statuses) == {OK}
            await wait_until(lambda: not connections(master), "the master to drop the slave")


async def test_point_1_a_connection_counts_once_the_put_it_did_not_carry_is_answered(tmp_path):
    """A slave connects while a put from before waits (its bytes were not sent on this
    connection): its ack of a later put cannot count yet. Once the old put is answered (its
    deadline), the connection counts and the later put is PUT_OK, without another report."""
    # The later put's deadline must fall well after the old put's, or on a busy machine the
    # service can wake past both and time them out together (seen in CI): 0.5 s apart.
    async with open_store(master_config(tmp_path / "m", slave_timeout=1500)) as master:
        holder = await connect(master)  # makes puts wait, never acks
        slave = await connect(master)
        async with holder, slave, trio.open_nursery() as nursery:
            await holder.send_all(REPORT.pack(max_offset(master)))
            await wait_until(lambda: accepted(master) == 1, "the holder's request")
            puts = Puts(master)
            nursery.start_soon(puts.put, 1)
            await wait_until(lambda: max_offset(master) > 0, "the old put to append")
            start = max_offset(master)
            await slave.send_all(REPORT.pack(start))  # it starts after the old put
            await wait_until(lambda: accepted(master) == 2, "the slave's request")
            await trio.testing.wait_all_tasks_blocked()  # the master has done all it will with it
            assert not puts.results  # the old put still waits: the slave cannot count yet
            nursery.start_soon(puts.put, 2)
            size = 0
            while size == 0:  # heartbeats (size 0) may come first: the data frame is put 2's
                offset, size = FRAME.unpack(await receive_exactly(slave, FRAME.size))
                assert offset == start
            assert len(await receive_exactly(slave, size)) == size
            await slave.send_all(REPORT.pack(start + size))  # its one and only ack
        old, new = sorted(puts.results, key=lambda r: r.commitlog_offset)
        assert old.commitlog_offset + old.size == start
        assert old.status is PutMessageStatus.FLUSH_SLAVE_TIMEOUT  # never sent to the slave
        assert new.status is OK


# ---- point 9 -----------------------------------------------------------------------------------


async def test_point_9_a_report_flood_is_decoded_once_per_read(tmp_path, monkeypatch):
    """One socket streams 1 MiB of reports (131,072 of them) at a master with an honest slave
    and puts going on: the master decodes at most one report per read (the last whole one),
    drops nothing it should not, and keeps replicating."""
    decoded = []
    original = MasterProtocol.next_event

    def counting(self: MasterProtocol) -> SlaveReport | NeedData:
        event = original(self)
        if event is not NEED_DATA:
            decoded.append(event)
        return event

    monkeypatch.setattr(MasterProtocol, "next_event", counting)
    config = master_config(tmp_path / "m", ha_housekeeping_interval=1000, slave_timeout=2000)
    async with open_store(config) as master:
        slave_config = ha_slave_process.slave_config(
            str(tmp_path / "s"), address_text(master.ha_address)
        )
        async with open_store(slave_config):
            puts = Puts(master)
            await puts.until_ok()
            here = max_offset(master)
            flood = await hostile.open_ha_peer(ha_address(master), here)
            async with flood:
                await wait_until(lambda: any(c.requested_offset == here
                                             for c in connections(master).values()),
                                 "the flood's request")
                decoded.clear()
                reports = 131_072
                sent = []

                async def stream_reports():
                    sent.append(await hostile.stream_reports(flood, here, reports=reports))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream_reports)
                    statuses = [(await puts.put(i)).status for i in range(1, 21)]
                assert sent == [reports]
            # The master reads what is buffered, then the end, and drops the connection.
            await wait_until(lambda: all(c.requested_offset != here
                                         for c in connections(master).values()),
                             "the master to read the whole flood")
            assert set(statuses) == {OK}
            # Every read of up to 64 KiB yields at most one report: 1 MiB is at least 16
            # reads, and at most a few thousand however the kernel cuts it.
            flood_events = [e for e in decoded if e.offset == here and not e.first]
            assert len(flood_events) <= reports // 16, len(flood_events)


async def prove(peer: trio.SocketStream) -> None:
    """Do what a slave does on ``peer`` (whose request the master accepted): read frames
    until one carries bytes, and acknowledge them."""
    offset = size = 0
    while size == 0:  # heartbeats first, perhaps
        offset, size = FRAME.unpack(await receive_exactly(peer, FRAME.size))
    await receive_exactly(peer, size)
    await peer.send_all(REPORT.pack(offset + size))


async def test_point_9_ha_connections_beyond_the_limit_are_closed_at_once(tmp_path):
    """Once every slot is held by a proven connection (one that acknowledged bytes it
    carried: issue 35 lets a newcomer evict an unproven one), a newcomer is closed at once."""
    limit = 8
    config = master_config(tmp_path / "m", ha_max_connections=limit, slave_timeout=2000)
    async with open_store(config) as master:
        slave_config = ha_slave_process.slave_config(
            str(tmp_path / "s"), address_text(master.ha_address)
        )
        async with open_store(slave_config):
            puts = Puts(master)
            await puts.until_ok()
            peers = [await connect(master) for _ in range(limit - 1)]  # the slave is one
            for peer in peers:
                await peer.send_all(REPORT.pack(max_offset(master)))
            await wait_until(lambda: accepted(master) == limit, "the master to hold its limit")
            assert (await puts.put(1)).status is OK
            for peer in peers:
                await prove(peer)
            await wait_until(lambda: all(c.confirmed_offset is not None
                                         for c in ha_of(master).connections),
                             "every connection to be proven")
            extra = [await connect(master) for _ in range(20)]
            for stream in extra:
                # Closed at once, without a report: nothing to read, then the end.
                assert await hostile.read_until_closed(stream, 5) == hostile.NodeAnswer(b"", True)
            stats = ha_of(master)
            assert len(stats.connections) == limit
            assert stats.max_connections == limit and stats.refused_connections == 20
            assert stats.evicted_connections == 0
            assert {(await puts.put(i)).status for i in range(2, 11)} == {OK}
            for stream in peers + extra:
                await stream.aclose()
            # Room again once connections leave.
            await wait_until(lambda: len(ha_of(master).connections) == 1, "the peers to go")
            again = await connect(master)
            async with again:
                await again.send_all(REPORT.pack(max_offset(master)))
                await wait_until(lambda: len(ha_of(master).connections) == 2,
                                 "a new connection to be served")


# ---- point 14 ----------------------------------------------------------------------------------


@pytest.mark.parametrize("offset", [
    INT64_MAX + 1 - SEGMENT,  # aligned, but its segment ends at 2^63: past the largest offset
    2**62 + SEGMENT // 2,  # off a segment boundary
    2**62 + 4096,
], ids=["segment-ends-past-2^63-1", "half-segment", "page"])
async def test_point_14_an_empty_slave_refuses_a_start_where_no_log_can_begin(tmp_path, offset):
    rogue = hostile.RogueHAMaster(hostile.start_at(offset, 100))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(rogue.serve)
        config = ha_slave_process.slave_config(str(tmp_path / "s"), address)
        async with open_store(config) as slave:
            await wait_until(lambda: ha_slave_of(slave).state == "refused",
                             "the slave to refuse the master's start offset")
            await trio.sleep(0.5)  # five reconnect intervals: it does not try again
            await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
            stats = ha_slave_of(slave)
            assert stats.state == "refused" and stats.refusal is not None
            assert str(offset) in stats.refusal
            assert rogue.sessions == 1
            # Nothing written: at most the allocator's spare first segment exists.
            assert max_offset(slave) == 0
            files = {p.name for p in (tmp_path / "s" / "commitlog").iterdir()}
            assert files <= {"0" * 20}, files
            # An operator who fixed things lets it try again (and it refuses again).
            assert slave.ha_client is not None
            slave.ha_client.clear_divergence()
            await wait_until(lambda: rogue.sessions == 2, "another attempt")
            await wait_until(lambda: ha_slave_of(slave).state == "refused", "the refusal")
        nursery.cancel_scope.cancel()


async def test_point_14_an_empty_slave_still_starts_at_the_highest_segment_that_fits(tmp_path):
    offset = INT64_MAX + 1 - 2 * SEGMENT  # its segment ends at 2^63 - SEGMENT
    rogue = hostile.RogueHAMaster(hostile.start_at(offset, 100))
    async with trio.open_nursery() as nursery:
        address = await nursery.start(rogue.serve)
        config = ha_slave_process.slave_config(str(tmp_path / "s"), address)
        async with open_store(config) as slave:
            await wait_until(lambda: max_offset(slave) == offset + 100, "the frame to arrive")
            assert ha_slave_of(slave).state == "transfer"
        nursery.cancel_scope.cancel()


async def test_a_peer_that_connects_and_misbehaves_in_a_loop_cannot_fill_the_masters_log(
        tmp_path, caplog):
    """Found by ``trio-ha chaos hostile``: every hostile HA connection cost the master a line
    or two (connected, closed, asks beyond the log: 3,700 lines in 25 s). Now at most one line
    per kind and peer host every 10 s, with the count of those left out."""
    async with open_store(master_config(tmp_path / "m")) as master:
        assert master.ha_address is not None
        host, port = master.ha_address
        with caplog.at_level(logging.INFO, logger="trio_ha.store.ha.master"):
            for _ in range(60):
                await hostile.ask_beyond_the_log(f"{host}:{port}", timeout=2.0)
        lines = [r.getMessage() for r in caplog.records if r.name == "trio_ha.store.ha.master"]
        assert sum("connected" in m for m in lines) == 1, lines
        assert sum("asks for offset" in m for m in lines) == 1, lines
        assert sum("closed" in m for m in lines) <= 2, lines
        # and the master still replicates to a real slave from the same host
        slave = StoreConfig(store_path_root_dir=str(tmp_path / "s"), broker_role=BrokerRole.SLAVE,
                            ha_master_address=f"{host}:{port}", ha_reconnect_interval=100)
        async with open_store(slave) as replica:
            async def stored_on_both():  # (SLAVE_NOT_AVAILABLE until the slave has attached)
                result = await master.put_message(Message("T", b"after the storm"), 0)
                return result.status is PutMessageStatus.PUT_OK

            await wait_until(stored_on_both, "a put acknowledged by the slave", timeout=20,
                             interval=0.1)
            await replica.commitlog.written.wait_for(master.max_commitlog_offset)
