"""Replication between stores in one process over real loopback sockets: RocketMQ's HATest
scenarios and more (docs/ha-protocol.md)."""

import contextlib
import filecmp
import os
import socket
import time
from typing import Any

import trio
import trio.testing

from conftest import TaskCounts, ha_of, ha_slave_of, wait_until
from trio_ha import (
    BrokerRole,
    FlushDiskType,
    Message,
    PutMessageResult,
    PutMessageStatus,
    StoreConfig,
    open_store,
)
from trio_ha.store import MessageStore, PutRequest, retention
from trio_ha.store.ha.transfer import SENDFILE_MIN_BYTES, SPLICE_MIN_BYTES, SocketTransport
from trio_ha.store.segment import Segment
from trio_ha.wire.ha import NEED_DATA, FrameData, FrameHeader, SlaveProtocol

SEGMENT = 64 * 1024


def master_config(root, **overrides) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SYNC_MASTER,
        ha_listen_port=0, ha_bind_address="127.0.0.1", ha_start_from_min_offset=True,
        slave_timeout=2000,
    )
    values.update(overrides)
    return StoreConfig(**values)


def slave_config(root, master: MessageStore, **overrides) -> StoreConfig:
    assert master.ha_address is not None
    host, port = master.ha_address
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=20 * 200, broker_role=BrokerRole.SLAVE,
        ha_master_address=f"{host}:{port}", ha_reconnect_interval=100,
    )
    values.update(overrides)
    return StoreConfig(**values)


def body(i: int) -> bytes:
    return f"message {i} ".encode() * (1 + i % 80)



def slave_count(master: MessageStore) -> int:
    return sum(1 for c in ha_of(master).connections if c.acked_offset is not None)


async def assert_same_files(master_root, slave_root):
    master_dir = os.path.join(master_root, "commitlog")
    slave_dir = os.path.join(slave_root, "commitlog")
    names = sorted(os.listdir(slave_dir))
    assert names, "the slave has no segments"
    for name in names:
        assert filecmp.cmp(os.path.join(master_dir, name), os.path.join(slave_dir, name), shallow=False), name


async def test_handle_ha_slave_copies_master_byte_for_byte(tmp_path):
    """RocketMQ's HATest.testHandleHA, across many segments, with every read checked."""
    async with open_store(master_config(tmp_path / "m", flush_disk_type=FlushDiskType.SYNC_FLUSH)) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            results = []
            for i in range(400):
                results.append(await master.put_message(Message("HA", body(i), tags=f"t{i % 2}", keys=f"k{i}"), queue_id=i % 4))
            assert {r.status for r in results} == {PutMessageStatus.PUT_OK}
            assert master.statistics().segments > 3
            # (a put's answer does not wait for its consume-queue entry: the master
            # dispatches in the background too, so both sides are waited for)
            await master.wait_dispatched()
            await slave.wait_dispatched(master.max_commitlog_offset)
            for queue_id in range(4):
                a = await master.get_messages("HA", queue_id, 0, 200)
                b = await slave.get_messages("HA", queue_id, 0, 200)
                assert len(a) == 100 and [m.body for m in a] == [m.body for m in b]
                assert [m.commitlog_offset for m in a] == [m.commitlog_offset for m in b]
            for r in results[::37]:
                stored = await slave.look_message_by_offset(r.commitlog_offset)
                assert stored is not None and stored.msg_id == r.msg_id
            ha = ha_of(master).connections[0]
            assert ha.acked_offset == master.max_commitlog_offset and ha.lag_bytes == 0
            slave_stats = ha_slave_of(slave)
            assert slave_stats.state == "transfer" and slave_stats.local_max_offset == master.max_commitlog_offset
    await assert_same_files(tmp_path / "m", tmp_path / "s")


async def test_semi_sync_replica_slave_loss_gives_slave_not_available(tmp_path):
    """RocketMQ's HATest.testSemiSyncReplica (4.9.8 statuses)."""
    async with open_store(master_config(tmp_path / "m")) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            first = [await master.put_message(Message("Semi", body(i), tags="a", keys=f"k{i}")) for i in range(5)]
            assert all(r.status is PutMessageStatus.PUT_OK for r in first)
            await slave.wait_dispatched(master.max_commitlog_offset)
            for r in first:
                on_master = await master.look_message_by_offset(r.commitlog_offset)
                on_slave = await slave.look_message_by_offset(r.commitlog_offset)
                assert on_master is not None and on_slave is not None
                assert (on_slave.body, on_slave.topic, on_slave.tags, on_slave.keys) == (
                    on_master.body, on_master.topic, on_master.tags, on_master.keys)
        await wait_until(lambda: not ha_of(master).connections,
                         "the master to drop its connections")
        later = [await master.put_message(Message("Semi", body(i))) for i in range(5)]
        assert {r.status for r in later} == {PutMessageStatus.SLAVE_NOT_AVAILABLE}
        assert all(r.status.stored for r in later)


async def test_async_master_returns_before_replication_and_slave_follows(tmp_path):
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)
    async with open_store(config) as master:
        results = [await master.put_message(Message("A", body(i))) for i in range(50)]
        assert {r.status for r in results} == {PutMessageStatus.PUT_OK}  # no slave needed
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            more = [await master.put_message(Message("A", body(i))) for i in range(50, 100)]
            assert {r.status for r in more} == {PutMessageStatus.PUT_OK}
            await slave.wait_dispatched(master.max_commitlog_offset)
            assert slave.max_queue_offset("A", 0) == 100


async def test_wait_false_skips_the_replica_wait(tmp_path):
    async with open_store(master_config(tmp_path / "m")) as master:
        result = await master.put_message(Message("W", b"x", properties={"WAIT": "false"}))
        assert result.status is PutMessageStatus.PUT_OK


async def test_slave_restart_resumes_from_its_own_max_offset(tmp_path):
    async with open_store(master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            for i in range(100):
                await master.put_message(Message("R", body(i)))
            await slave.wait_dispatched(master.max_commitlog_offset)
            end_before = slave.max_commitlog_offset
        for i in range(100, 300):  # the slave is away
            await master.put_message(Message("R", body(i)))
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: ha_of(master).connections,
                             "the master to list a connection")
            requested = ha_of(master).connections[0].requested_offset
            assert requested == end_before  # it asked for what it lacked, not from scratch
            await slave.wait_dispatched(master.max_commitlog_offset)
            assert slave.max_queue_offset("R", 0) == 300
            assert [m.body for m in await slave.get_messages("R", 0, 0, 300)] == [body(i) for i in range(300)]
    await assert_same_files(tmp_path / "m", tmp_path / "s")


async def test_a_catching_up_slave_splices_large_frames_whole_and_reads_small_ones_into_the_mapping(tmp_path):
    """Issue 11: frames of SPLICE_MIN_BYTES or more go from the socket into the segment files
    by splice, to their last byte (a readv of a frame's tail into the mapping would start
    readahead that zero-fills pages ahead of the bytes); a small frame (a put once caught up)
    is read into the mapping. Either way the slave's files are the master's, byte for byte,
    across segment boundaries, and its queues serve the same messages."""
    segment = 1 << 20
    async with open_store(master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER,
                                        mapped_file_size_commit_log=segment)) as master:
        bodies = [os.urandom(10_000) for _ in range(350)]  # ~3.5 MiB: four segments
        for i, data in enumerate(bodies):
            result = await master.put_message(Message("Bulk", data), queue_id=i % 2)
            assert result.status is PutMessageStatus.PUT_OK
        end = master.max_commitlog_offset
        assert end % segment >= SPLICE_MIN_BYTES  # the last segment's frame is large too
        async with open_store(slave_config(tmp_path / "s", master,
                                           mapped_file_size_commit_log=segment)) as slave:
            await slave.wait_dispatched(end)
            stats = ha_slave_of(slave)
            assert stats.bytes_received == stats.bytes_spliced == end
            result = await master.put_message(Message("Bulk", b"small"), queue_id=0)
            await slave.wait_dispatched(master.max_commitlog_offset)
            stats = ha_slave_of(slave)
            assert stats.bytes_received == master.max_commitlog_offset
            assert stats.bytes_spliced == end
            for queue_id in (0, 1):
                got = [m.body for m in await slave.get_messages("Bulk", queue_id, 0, 400)]
                assert got == bodies[queue_id::2] + ([b"small"] if queue_id == 0 else [])
    await assert_same_files(tmp_path / "m", tmp_path / "s")


async def test_a_large_frames_tail_is_spliced_too_and_a_small_frame_is_read_into_the_mapping(tmp_path):
    """The receive path is chosen by the frame's size, not by what is left of it: the last
    100 bytes of a 1 MiB frame still go by splice (a readv into the mapping there starts
    readahead, which zero-fills pages ahead of the bytes that the next splices then write
    again); a frame of 100 bytes is read into the mapping."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    segment = Segment.create(str(tmp_path), 0, 1 << 20, warm=False)
    try:
        async with listener, await trio.open_tcp_stream(
                *listener.socket.getsockname()) as sender:
            receiver = SocketTransport(await listener.accept())
            try:
                first, second = os.urandom(100), os.urandom(100)
                await sender.send_all(first)
                with trio.fail_after(5):
                    assert await receiver.receive_into_segment_eagerly(
                        segment, 0, 100, 1 << 20, lambda: None) == 100
                assert receiver.bytes_spliced == 100
                await sender.send_all(second)
                with trio.fail_after(5):
                    assert await receiver.receive_into_segment_eagerly(
                        segment, 100, 200, 100, lambda: None) == 100
                assert receiver.bytes_spliced == 100
                assert segment.read(0, 200) == first + second
            finally:
                await receiver.aclose()
    finally:
        segment.close()


async def test_master_restart_and_the_slave_reconnects(tmp_path):
    async with open_store(master_config(tmp_path / "m")) as master:
        assert master.ha_address is not None
        port = master.ha_address[1]
        slave_cfg = slave_config(tmp_path / "s", master)
        async with open_store(slave_cfg) as slave:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            assert (await master.put_message(Message("M", b"one"))).ok
    async with open_store(slave_cfg) as slave:
        # The master is down: the slave backs off and keeps serving reads.
        await wait_until(lambda: ha_slave_of(slave).state == "backoff",
                         "the slave to back off")
        assert ha_slave_of(slave).last_error
        assert [m.body for m in await slave.get_messages("M", 0, 0, 5)] == [b"one"]
        async with open_store(master_config(tmp_path / "m", ha_listen_port=port)) as master:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            assert (await master.put_message(Message("M", b"two"))).ok
            await slave.wait_dispatched(master.max_commitlog_offset)
            assert [m.body for m in await slave.get_messages("M", 0, 0, 5)] == [b"one", b"two"]


async def test_two_slaves_and_two_required_acks(tmp_path):
    async with open_store(master_config(tmp_path / "m", ha_sync_acks=2)) as master:
        async with open_store(slave_config(tmp_path / "s1", master)) as one:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            lonely = await master.put_message(Message("Two", b"x"))
            assert lonely.status is PutMessageStatus.SLAVE_NOT_AVAILABLE  # one slave < two acks
            async with open_store(slave_config(tmp_path / "s2", master)) as two:
                await wait_until(lambda: slave_count(master) == 2, "two slaves to ack")
                results = [await master.put_message(Message("Two", body(i))) for i in range(20)]
                assert {r.status for r in results} == {PutMessageStatus.PUT_OK}
                await two.wait_dispatched(master.max_commitlog_offset)
                await one.wait_dispatched(master.max_commitlog_offset)
                assert one.max_queue_offset("Two", 0) == two.max_queue_offset("Two", 0) == 21
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            assert (await master.put_message(Message("Two", b"y"))).status is PutMessageStatus.SLAVE_NOT_AVAILABLE


async def test_slave_far_behind_is_not_available_is_slave_ok(tmp_path):
    """isSlaveOK: a slave more than haSlaveFallbehindMax behind does not count."""
    config = master_config(tmp_path / "m", ha_slave_fallbehind_max=10_000)
    async with open_store(config) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            assert (await master.put_message(Message("Gap", b"small"))).ok
            big = await master.put_message(Message("Gap", b"z" * 20_000))
            assert big.status is PutMessageStatus.SLAVE_NOT_AVAILABLE
            await slave.wait_dispatched(master.max_commitlog_offset)  # it still gets it
            assert slave.max_queue_offset("Gap", 0) == 2


async def test_empty_slave_starts_at_the_masters_last_segment_by_default(tmp_path):
    config = master_config(tmp_path / "m", ha_start_from_min_offset=False, broker_role=BrokerRole.ASYNC_MASTER)
    async with open_store(config) as master:
        for i in range(300):
            await master.put_message(Message("Last", body(i)))
        last_segment = master.commitlog.segments.segments[-1].base_offset
        assert last_segment > 0
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await slave.wait_dispatched(master.max_commitlog_offset)
            assert slave.min_commitlog_offset == last_segment
            assert sorted(os.listdir(tmp_path / "s" / "commitlog"))[0] == f"{last_segment:020d}"
            # Its queues start where its log does: older offsets are too small, newer are served.
            low = slave.min_queue_offset("Last", 0)
            assert low > 0
            first = await slave.get_messages("Last", 0, low, 1)
            assert first[0].body == body(low)


async def test_slave_behind_the_masters_retained_log_diverges_fixes_rocketmq_3388(tmp_path):
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER, delete_commit_log_files_interval=0)
    async with open_store(config) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await master.put_message(Message("Old", body(1)))
            await slave.wait_dispatched(master.max_commitlog_offset)
            slave_end = slave.max_commitlog_offset
        for i in range(400):
            await master.put_message(Message("Old", body(i)))
        await master.flush()
        await master.wait_dispatched()
        old = time.time() - 100 * 3600
        for segment in master.commitlog.segments.segments[:2]:
            os.utime(segment.path, (old, old))
        assert await retention.delete_expired_files(master, force=True) == 2
        assert master.min_commitlog_offset > slave_end
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: ha_slave_of(slave).state == "diverged",
                             "the slave to report the divergence")
            stats = ha_slave_of(slave)
            assert stats.divergence is not None
            assert str(master.min_commitlog_offset) in stats.divergence
            assert str(slave_end) in stats.divergence
            assert "gone from the master" in stats.divergence
            # It stays put: no reconnect loop, and it still serves what it has.
            await trio.sleep(0.3)
            await trio.testing.wait_all_tasks_blocked()  # and what was due in it has run
            assert ha_slave_of(slave).state == "diverged"
            assert slave.max_commitlog_offset == slave_end


async def test_slave_ahead_of_its_master_diverges_instead_of_looping_fixes_rocketmq_323(tmp_path):
    async with open_store(master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            for i in range(50):
                await master.put_message(Message("Ahead", body(i)))
            await slave.wait_dispatched(master.max_commitlog_offset)
            slave_end = slave.max_commitlog_offset
    # A new, empty master (it lost everything): the slave holds bytes it does not have.
    async with open_store(master_config(tmp_path / "m2", broker_role=BrokerRole.ASYNC_MASTER)) as fresh:
        async with open_store(slave_config(tmp_path / "s", fresh)) as slave:
            await wait_until(lambda: ha_slave_of(slave).state == "diverged",
                             "the slave to report the divergence")
            stats = ha_slave_of(slave)
            assert stats.divergence is not None
            assert str(slave_end) in stats.divergence and "master lost its tail" in stats.divergence
            assert ha_of(fresh).connections == ()
            assert slave.max_commitlog_offset == slave_end  # nothing was overwritten


async def test_slave_checkpoint_records_replicated_store_times(tmp_path):
    async with open_store(master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            results = [await master.put_message(Message("Ck", body(i))) for i in range(20)]
            await slave.wait_dispatched(master.max_commitlog_offset)
            await slave.flush()
            await slave.flush_consume_queues(0)
            last = results[-1].store_timestamp
            assert slave.checkpoint.physic_msg_timestamp == last
            assert slave.checkpoint.logics_msg_timestamp == last


async def test_frames_carry_what_is_ready_up_to_1_mib_by_default_or_the_configured_batch(tmp_path):
    """A catching-up slave gets frames sized by what is ready: up to 1 MiB by default (not
    RocketMQ's fixed 32 KiB, which holds catch-up to a fifth of the speed), never past a
    segment's written end; an explicit haTransferBatchSize is the cap instead. Read here by
    a bare slave that reports offset 0 and decodes the frame headers."""
    segment = 4 << 20

    async def frame_sizes(config: StoreConfig) -> list[int]:
        async with open_store(config) as master:
            for i in range(3000):
                result = await master.put_message(Message("Frames", b"f" * 1000, keys=str(i)))
                assert result.status is PutMessageStatus.PUT_OK
            end = master.max_commitlog_offset
            assert master.ha_address is not None
            stream = await trio.open_tcp_stream(*master.ha_address)
            protocol = SlaveProtocol(expected=0)
            await stream.send_all(protocol.send_report(0))
            sizes, received = [], 0
            with trio.fail_after(10):
                while received < end:
                    data = await stream.receive_some(1 << 20)
                    assert data
                    protocol.receive_data(data)
                    while (event := protocol.next_event()) is not NEED_DATA:
                        if isinstance(event, FrameHeader):
                            sizes.append(event.size)
                            received += event.size
            await stream.aclose()
            return sizes

    common: dict[str, Any] = dict(broker_role=BrokerRole.ASYNC_MASTER,
                                  mapped_file_size_commit_log=segment)
    sizes = await frame_sizes(master_config(tmp_path / "default", **common))
    assert max(sizes) == 1 << 20 and len(sizes) <= 4  # ~3 MB ready: whole MiBs at once
    sizes = await frame_sizes(master_config(tmp_path / "small", **common,
                                            ha_transfer_batch_size=32 * 1024))
    assert max(sizes) == 32 * 1024 and len(sizes) > 3000 * 1000 // (32 * 1024)


async def test_a_sync_master_put_costs_the_ha_tasks_one_round_each_and_wakes_no_reporter(tmp_path):
    """Issue 11: the slave takes a frame's header and body and reports, all in the round the
    frame arrived in (trio's socket yields after every receive that found bytes: that was
    three rounds and a wake of the reporter task per ack), and the master's writer sends a
    frame the socket takes at once without a round of its own after it. Counted with an
    instrument over sequential SYNC_MASTER puts on real sockets."""
    steps = TaskCounts()
    steps.counting = False
    async with open_store(master_config(tmp_path / "m")) as master:
        async with open_store(slave_config(tmp_path / "s", master)) as slave:
            await wait_until(lambda: slave_count(master) == 1, "one slave to ack")
            for i in range(20):
                assert (await master.put_message(Message("Rounds", body(i)))).status is PutMessageStatus.PUT_OK
            trio.lowlevel.add_instrument(steps)
            try:
                steps.counting = True
                puts = 50
                for i in range(puts):
                    result = await master.put_message(Message("Rounds", body(i)))
                    assert result.status is PutMessageStatus.PUT_OK
                steps.counting = False
            finally:
                trio.lowlevel.remove_instrument(steps)
            assert slave.max_commitlog_offset == master.max_commitlog_offset

    def of(suffix: str) -> int:
        return steps.of(steps.steps, suffix)

    # (a heartbeat each way, every haSendHeartbeatInterval, may fall in the window on a slow
    # machine: one step more for each task it wakes; the old code took 100 receiver and 150
    # reporter steps for these 50 puts)
    assert of("slave.HAClient.run") <= puts + 2  # the receiver: one wake per frame
    assert of("slave._Reports.run") <= 1  # every ack went out from the receiver
    assert of("master.HAConnection._write_log") <= puts + 2
    assert of("master.HAConnection._read_acks") <= puts + 2


async def test_a_report_the_socket_takes_only_part_of_is_finished_by_the_reporter_task():
    """The receiver's non-blocking report can be cut short by a full socket; the reporter
    task sends the rest before anything else, so the master reads one whole report."""
    from trio_ha.store.ha.slave import _Reports
    from trio_ha.watermark import Watermark
    from trio_ha.wire.ha import REPORT

    class HalfTakingTransport:
        def __init__(self) -> None:
            self.wire = bytearray()

        def send_nowait(self, data: bytes) -> int:
            self.wire += data[:3]
            return 3

        async def send_all(self, data: bytes) -> None:
            await trio.lowlevel.checkpoint()
            self.wire += data

    transport = HalfTakingTransport()
    written = Watermark(100)
    reports = _Reports(transport, SlaveProtocol(expected=100), written, 100, 5.0)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(reports.run)
        written.raise_to(250)
        reports.before_wait()
        assert bytes(transport.wire) == REPORT.pack(250)[:3]
        written.raise_to(400)
        reports.before_wait()  # the tail is pending: this leaves the new end to the task
        await trio.testing.wait_all_tasks_blocked()  # the reporter task sends the rest
        assert len(transport.wire) == 16
        nursery.cancel_scope.cancel()
    assert bytes(transport.wire) == REPORT.pack(250) + REPORT.pack(400)


class BareSlave:
    """A slave socket the test drives by hand: it reports when told to, and decodes every
    frame and heartbeat with the slave's protocol (which fails on any frame that does not
    continue the log where the last one ended)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.protocol = SlaveProtocol(expected=0)
        self.log = bytearray()  # the frame bodies received, in order, from offset 0
        self.headers: list[tuple[int, int]] = []

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, master: MessageStore, *, receive_buffer: int | None = None):
        """Connected to ``master``'s HA port, its request (offset 0) sent; closed after."""
        assert master.ha_address is not None
        sock = trio.socket.socket()
        if receive_buffer is not None:  # before connecting, so the window starts small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        async with trio.SocketStream(sock) as stream:
            await sock.connect(master.ha_address)
            slave = cls(stream)
            await slave.report(0)
            yield slave

    async def report(self, offset: int) -> None:
        await self.stream.send_all(self.protocol.send_report(offset))

    async def receive_until(self, end: int, *, heartbeats: int = 0) -> None:
        """Read frames until the log received reaches ``end`` and ``heartbeats`` empty
        frames arrived."""
        with trio.fail_after(10):
            while len(self.log) < end or sum(1 for _, s in self.headers if s == 0) < heartbeats:
                data = await self.stream.receive_some(1 << 20)
                assert data, "the master closed the connection"
                self.protocol.receive_data(data)
                while (event := self.protocol.next_event()) is not NEED_DATA:
                    if isinstance(event, FrameHeader):
                        self.headers.append((event.offset, event.size))
                    elif isinstance(event, FrameData):
                        self.log += event.data


def the_connection(master: MessageStore):
    assert master.ha_service is not None
    (connection,) = master.ha_service.connections.values()
    return connection


def sent_to_slave(master: MessageStore) -> int | None:
    (connection,) = ha_of(master).connections
    return connection.next_transfer_offset


def put_now(master: MessageStore, size: int) -> int:
    """Append one record without a task switch; the log's end after it."""
    result = master.append_now(PutRequest("Pushed", 0, os.urandom(size),
                                          wait_store_msg_ok=False))
    assert isinstance(result, PutMessageResult) and result.status is PutMessageStatus.PUT_OK
    return master.max_commitlog_offset


async def test_a_rounds_puts_go_to_an_idle_slave_from_the_callers_task_and_the_writer_sends_the_rest(tmp_path):
    """Issue 11: a server calls ``replicate_now`` once it has served a read; on an idle link
    the round's puts leave then, in one frame, from the server's task (not a scheduling
    round later from the HA writer: ~30 us on every SYNC send at one producer). A frame the
    socket takes only part of is finished by the writer before anything else, and the
    heartbeat that follows carries the log's end, not where the writer last looked."""
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER,
                           mapped_file_size_commit_log=4 << 20, ha_send_heartbeat_interval=300,
                           ha_transfer_method="send")  # (sendfile: large frames are the writer's)
    async with open_store(config) as master, BareSlave.open(master, receive_buffer=4096) as slave:
        await wait_until(lambda: slave_count(master) == 1, "the request accepted")
        await trio.testing.wait_all_tasks_blocked()  # the writer waits for the log to grow

        end = put_now(master, 100)
        end = put_now(master, 200)
        assert sent_to_slave(master) == 0  # nothing left yet: no task has run
        master.replicate_now()
        assert sent_to_slave(master) == end  # handed over in the caller's task, one frame
        await slave.receive_until(end)
        assert slave.headers == [(0, end)]
        await slave.report(end)
        await wait_until(lambda: the_connection(master).acked_offset == end, "the ack")

        # A frame far larger than both socket buffers: the push hands over what fits.
        connection = the_connection(master)
        assert isinstance(connection.transport, SocketTransport)
        connection.transport.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        start = end
        end = put_now(master, 512 * 1024)
        master.replicate_now()
        assert connection._frame_rest is not None  # the socket took part of it
        assert sent_to_slave(master) == end
        await slave.receive_until(end, heartbeats=1)  # the writer sent the rest, then idled
        assert slave.headers[1] == (start, end - start)
        assert slave.headers[2:] == [(end, 0)] * (len(slave.headers) - 2)  # heartbeats at the end
        assert bytes(slave.log) == master.commitlog.read(0, end)


async def test_while_a_frame_is_unacknowledged_the_writer_gathers_later_rounds(tmp_path):
    """The push goes only to an idle link. With a frame in flight (many producers, many
    connections), a round's puts are left to the HA writer, which gathers every round
    before it runs into one frame, as it did before the push existed."""
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER)
    async with open_store(config) as master, BareSlave.open(master) as slave:
        await wait_until(lambda: slave_count(master) == 1, "the request accepted")
        await trio.testing.wait_all_tasks_blocked()
        first = put_now(master, 100)
        master.replicate_now()
        assert sent_to_slave(master) == first
        second = put_now(master, 100)
        master.replicate_now()  # the first frame is not acknowledged: not pushed
        third = put_now(master, 100)
        master.replicate_now()
        assert sent_to_slave(master) == first
        await trio.testing.wait_all_tasks_blocked()  # the writer's round
        assert sent_to_slave(master) == third
        await slave.receive_until(third)
        assert slave.headers == [(0, first), (first, third - first)]
        assert second < third
        await slave.report(third)
        await wait_until(lambda: the_connection(master).acked_offset == third, "the ack")
        fourth = put_now(master, 100)
        master.replicate_now()  # idle again
        assert sent_to_slave(master) == fourth


async def test_a_push_racing_the_heartbeat_deadline_never_heartbeats_behind_the_log(tmp_path, autojump_clock):
    """The writer's heartbeat deadline and a round's push can fall in one scheduling batch:
    the writer is cancelled out of its wait, then the push sends the new records before the
    writer runs. The writer must then see that the log moved on; a heartbeat at the offset
    it waited at would be behind the frame just sent, and a slave takes that as a diverged
    master. Each round here wakes exactly at the writer's deadline (trio runs a batch in
    either order, so some rounds have the push first)."""
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER,
                           ha_send_heartbeat_interval=1000)
    async with open_store(config) as master, BareSlave.open(master) as slave:
        await wait_until(lambda: slave_count(master) == 1, "the request accepted")
        connection = the_connection(master)
        end = 0
        for _ in range(24):
            await trio.testing.wait_all_tasks_blocked()
            await trio.sleep_until(connection._last_send + 1.0)
            end = put_now(master, 100)
            master.replicate_now()
            await slave.receive_until(end)
            await slave.report(end)
            await wait_until(lambda end=end: connection.acked_offset == end, "the ack")
        assert bytes(slave.log) == master.commitlog.read(0, end)


async def test_with_the_sendfile_method_a_large_frame_is_left_to_the_writer(tmp_path):
    """haTransferMethod=sendfile: a frame of SENDFILE_MIN_BYTES or more goes by sendfile, as
    the writer sends it, so the round does not push it as a gathered write; smaller frames
    are pushed as with the send method."""
    config = master_config(tmp_path / "m", broker_role=BrokerRole.ASYNC_MASTER,
                           mapped_file_size_commit_log=4 << 20, ha_transfer_method="sendfile")
    async with open_store(config) as master, BareSlave.open(master) as slave:
        await wait_until(lambda: slave_count(master) == 1, "the request accepted")
        await trio.testing.wait_all_tasks_blocked()
        large = put_now(master, SENDFILE_MIN_BYTES)
        master.replicate_now()
        assert sent_to_slave(master) == 0
        await trio.testing.wait_all_tasks_blocked()  # the writer's round: sendfile
        assert sent_to_slave(master) == large
        await slave.receive_until(large)
        await slave.report(large)
        await wait_until(lambda: the_connection(master).acked_offset == large, "the ack")
        small = put_now(master, 100)
        master.replicate_now()
        assert sent_to_slave(master) == small
        await slave.receive_until(small)
        assert bytes(slave.log) == master.commitlog.read(0, small)
        (connection,) = ha_of(master).connections
        assert (connection.frames_sent, connection.frames_pushed) == (2, 1)
