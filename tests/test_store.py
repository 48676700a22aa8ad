"""The store against the scenarios of RocketMQ's own store tests (DefaultMessageStoreTest,
BatchPutMessageTest, ...) and its contract (docs/formats.md)."""

import itertools
import os
import random
import shutil
import sys
import tempfile
import time

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_ha import (
    BrokerRole,
    FlushDiskType,
    GetMessageStatus,
    Message,
    PutMessageStatus,
    StoreConfig,
    StoreLockedError,
    _backend,
    open_store,
)
from trio_ha.store import MessageStore, PutRequest, retention
from trio_ha.store.dispatch import PAUSE_BELOW, ROUND_PAUSE
from trio_ha.store.recovery import RecoveryReport
from trio_ha.wire import record as rec


def body_for(i: int, size: int) -> bytes:
    return (f"{i}:".encode() * (size // 2 + 1))[:size]


async def stored_at(store: MessageStore, commitlog_offset: int) -> rec.StoredMessage:
    """The message at ``commitlog_offset``, which the test knows is there."""
    message = await store.look_message_by_offset(commitlog_offset)
    assert message is not None, f"no message at {commitlog_offset}"
    return message


def recovery_of(store: MessageStore) -> RecoveryReport:
    assert store.recovery is not None  # an open store has recovered
    return store.recovery


async def test_write_and_read_across_segments(make_config):
    config = make_config()
    async with open_store(config) as store:
        results = []
        for i in range(600):
            message = Message("TopicTest", body_for(i, 200 + i % 50), tags=f"T{i % 3}", keys=f"k{i}")
            results.append(await store.put_message(message, queue_id=i % 2))
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert store.statistics().segments > 2
        await store.wait_dispatched()
        for queue_id in (0, 1):
            found = []
            offset = 0
            while True:
                batch = await store.get_messages("TopicTest", queue_id, offset, 32)
                if not batch:
                    break
                found.extend(batch)
                offset = batch[-1].queue_offset + 1
            assert [m.queue_offset for m in found] == list(range(300))
            expected = [r for i, r in enumerate(results) if i % 2 == queue_id]
            assert [m.commitlog_offset for m in found] == [r.commitlog_offset for r in expected]
        for i, result in enumerate(results):
            message = await stored_at(store, result.commitlog_offset)
            assert message.body == body_for(i, 200 + i % 50)
            assert message.keys == (f"k{i}",) and message.tags == f"T{i % 3}"
            assert message.msg_id == result.msg_id and message.crc_ok


async def test_queue_offsets_and_msg_ids_follow_rocketmq_rules(make_config):
    async with open_store(make_config()) as store:
        first = await store.put_message(Message("A", b"1"), queue_id=0)
        second = await store.put_message(Message("A", b"2"), queue_id=0)
        other = await store.put_message(Message("A", b"3"), queue_id=1)
        assert (first.queue_offset, second.queue_offset, other.queue_offset) == (0, 1, 0)
        assert second.commitlog_offset == first.commitlog_offset + first.size
        assert first.msg_id == rec.message_id(rec.encode_host("127.0.0.1", 10911), first.commitlog_offset)
        await store.wait_dispatched()
        assert store.max_queue_offset("A", 0) == 2 and store.max_queue_offset("A", 1) == 1


async def test_transaction_half_and_rollback_records_get_no_queue_offset(make_config):
    async with open_store(make_config()) as store:
        normal = await store.put_message(Message("Tx", b"n"), queue_id=0)
        half = await store.put_message(Message("Tx", b"h", sys_flag=rec.TRANSACTION_PREPARED), queue_id=0)
        rollback = await store.put_message(Message("Tx", b"r", sys_flag=rec.TRANSACTION_ROLLBACK), queue_id=0)
        commit = await store.put_message(Message("Tx", b"c", sys_flag=rec.TRANSACTION_COMMIT), queue_id=0)
        assert (normal.queue_offset, half.queue_offset, rollback.queue_offset, commit.queue_offset) == (0, 0, 0, 1)
        await store.wait_dispatched()
        assert store.max_queue_offset("Tx", 0) == 2
        assert [m.body for m in await store.get_messages("Tx", 0, 0, 10)] == [b"n", b"c"]
        # The half message is in the commitlog all the same.
        assert (await stored_at(store, half.commitlog_offset)).body == b"h"


async def test_batch_put_gets_consecutive_offsets_all_or_nothing(make_config):
    async with open_store(make_config()) as store:
        messages = [Message("Batch", body_for(i, 100), tags="b", keys=f"bk{i}") for i in range(64)]
        result = await store.put_messages(messages, queue_id=3)
        assert result.status is PutMessageStatus.PUT_OK and result.count == 64
        assert len(result.msg_id.split(",")) == 64
        await store.wait_dispatched()
        stored = await store.get_messages("Batch", 3, 0, 64)
        assert [m.body for m in stored] == [m.body for m in messages]
        assert [m.queue_offset for m in stored] == list(range(64))
        assert [m.msg_id for m in stored] == list(result.msg_ids)
        offsets = [m.commitlog_offset for m in stored]
        assert all(
            b == a + s.size for (a, b), s in zip(itertools.pairwise(offsets), stored, strict=False)
        )
        # Mixed topics, transactions and empty batches are refused.
        mixed = await store.put_messages([Message("A", b""), Message("B", b"")])
        assert mixed.status is PutMessageStatus.MESSAGE_ILLEGAL
        tx = await store.put_messages([Message("A", b"", sys_flag=rec.TRANSACTION_PREPARED)])
        assert tx.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert (await store.put_messages([])).status is PutMessageStatus.MESSAGE_ILLEGAL
        bad = await store.put(PutRequest.batch("Batch", 3, b"\x00\x00\x00\x30garbage"))
        assert bad.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert store.max_queue_offset("Batch", 3) == 64


async def test_batch_larger_than_free_space_moves_whole_to_next_segment(make_config):
    async with open_store(make_config()) as store:
        filler = await store.put_message(Message("F", b"x" * 60_000))
        result = await store.put_messages([Message("F", body_for(i, 1000)) for i in range(10)])
        assert result.ok
        # The whole batch went to the next segment: it starts exactly at a segment boundary.
        assert result.commitlog_offset == 64 * 1024 > filler.commitlog_offset


async def test_oversize_body_is_message_illegal_and_store_keeps_working(make_config):
    async with open_store(make_config(max_message_size=1000)) as store:
        too_big = await store.put_message(Message("T", b"x" * 1001))
        assert too_big.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert (await store.put_message(Message("T", b"x" * 1000))).ok
        batch = await store.put_messages([Message("T", b"x" * 600), Message("T", b"x" * 600)])
        assert batch.status is PutMessageStatus.MESSAGE_ILLEGAL  # batch body > maxMessageSize
        await store.wait_dispatched()
        assert store.max_queue_offset("T", 0) == 1


async def test_record_larger_than_a_segment_is_illegal_not_an_endless_roll(make_config):
    async with open_store(make_config(mapped_file_size_commit_log=8192)) as store:
        result = await store.put_message(Message("T", b"x" * 9000))
        assert result.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert (await store.put_message(Message("T", b"ok"))).ok


async def test_properties_over_32767_bytes_are_rejected_and_queue_unchanged(make_config):
    async with open_store(make_config()) as store:
        result = await store.put_message(Message("T", b"x", properties={"big": "v" * 32767}))
        assert result.status is PutMessageStatus.PROPERTIES_SIZE_EXCEEDED
        assert (await store.put_message(Message("T", b"y"))).queue_offset == 0


async def test_invalid_topics_are_rejected(make_config):
    async with open_store(make_config()) as store:
        for topic in ("", "../escape", "a/b", "x" * 128, "spaces are bad"):
            result = await store.put_message(Message(topic, b"x"))
            assert result.status is PutMessageStatus.MESSAGE_ILLEGAL, topic
        assert not await trio.Path(store.root, "escape").exists()


async def test_get_message_statuses(make_config):
    async with open_store(make_config()) as store:
        assert (store.read_queue("Nope", 0, 0, 1)).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        for i in range(3):
            await store.put_message(Message("S", bytes([i])))
        await store.wait_dispatched()
        found = store.read_queue("S", 0, 1, 10)
        assert found.status is GetMessageStatus.FOUND and found.next_begin_offset == 3
        assert [m.body for m in found.messages] == [b"\x01", b"\x02"]
        one = store.read_queue("S", 0, 3, 10)
        assert one.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and one.next_begin_offset == 3
        badly = store.read_queue("S", 0, 9, 10)
        assert badly.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
        limited = store.read_queue("S", 0, 0, 10, max_bytes=1)
        assert len(limited.messages) == 1 and limited.next_begin_offset == 1


async def test_repeated_open_and_close_keeps_everything(make_config):
    config = make_config()
    offsets = []
    for round_ in range(5):
        async with open_store(config) as store:
            assert recovery_of(store).abnormal is False
            result = await store.put_message(Message("R", f"round {round_}".encode()))
            assert result.queue_offset == round_
            offsets.append(result.commitlog_offset)
    async with open_store(config) as store:
        bodies = [m.body for m in await store.get_messages("R", 0, 0, 10)]
        assert bodies == [f"round {i}".encode() for i in range(5)]


async def test_second_open_of_a_store_in_use_fails_clearly(make_config):
    config = make_config()
    async with open_store(config):
        with pytest.raises(StoreLockedError, match="already open"):
            async with open_store(config):
                pass
    async with open_store(config):  # released on close
        pass


async def test_lock_excludes_another_process(make_config):
    config = make_config()
    async with open_store(config) as store:
        code = (
            "import trio, sys\n"
            "from trio_ha import StoreConfig, open_store, StoreLockedError\n"
            f"cfg = StoreConfig(store_path_root_dir={store.root!r}, mapped_file_size_commit_log=65536, mapped_file_size_consume_queue=2000)\n"
            "async def main():\n"
            "    try:\n"
            "        async with open_store(cfg): pass\n"
            "    except StoreLockedError as e:\n"
            "        print('LOCKED', e); sys.exit(3)\n"
            "trio.run(main)\n"
        )
        proc = await trio.run_process([sys.executable, "-c", code], capture_stdout=True, check=False)
        assert proc.returncode == 3 and b"in use by another process" in proc.stdout


async def test_slave_refuses_puts(make_config):
    async with open_store(make_config(broker_role=BrokerRole.SLAVE)) as store:
        result = await store.put_message(Message("T", b"x"))
        assert result.status is PutMessageStatus.SERVICE_NOT_AVAILABLE


async def test_sync_flush_puts_are_flushed_before_they_return(make_config):
    async with open_store(make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)) as store:
        for i in range(20):
            result = await store.put_message(Message("D", body_for(i, 300)))
            assert result.ok
            assert store.commitlog.flushed.value >= result.commitlog_offset + result.size


async def test_group_commit_serves_many_puts_with_few_syncs(make_config):
    async with open_store(make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)) as store:
        before = store.statistics().flushes
        results = []

        async def writer(n):
            for i in range(8):
                results.append(await store.put_message(Message("G", body_for(i, 100)), queue_id=n % 4))

        async with trio.open_nursery() as nursery:
            for n in range(64):
                nursery.start_soon(writer, n)
        assert len(results) == 512 and all(r.ok for r in results)
        syncs = store.statistics().flushes - before
        assert 0 < syncs < len(results) / 4


async def test_group_commit_timeout_gives_flush_disk_timeout_and_keeps_the_message(make_config):
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=200)
    async with open_store(config) as store:
        results = []
        # A stalled disk: the flusher cannot get in while we hold its lock.
        async with store.commitlog._flush_lock:
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(lambda i=i: _append_result(store, results, i))
        assert len(results) == 100
        assert {r.status for r in results} == {PutMessageStatus.FLUSH_DISK_TIMEOUT}
        assert all(r.status.stored for r in results)
        # Once the disk is back, new puts succeed and the timed-out ones are durable too.
        later = await store.put_message(Message("W", b"after"))
        assert later.ok
        assert store.commitlog.flushed.value >= max(r.commitlog_offset for r in results)
        await store.wait_dispatched()
        assert store.max_queue_offset("W", 0) == 101


async def _append_result(store, results, i):
    results.append(await store.put_message(Message("W", body_for(i, 50))))


async def test_wait_false_skips_the_sync_flush_wait(make_config):
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=100)
    async with open_store(config) as store:
        async with store.commitlog._flush_lock:
            result = await store.put_message(Message("W", b"x", properties={"WAIT": "false"}))
        assert result.status is PutMessageStatus.PUT_OK


async def test_sync_flush_consumers_never_see_unflushed_messages(make_config):
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH, sync_flush_timeout=100)
    async with open_store(config) as store:
        async with store.commitlog._flush_lock:
            result = await store.put_message(Message("V", b"x"))
            assert result.status is PutMessageStatus.FLUSH_DISK_TIMEOUT
            assert store.max_queue_offset("V", 0) == 0
            assert await store.look_message_by_offset(result.commitlog_offset) is None
        await store.flush()
        await store.wait_dispatched()
        assert store.max_queue_offset("V", 0) == 1


async def test_lookup_by_time_binary_search(make_config):
    async with open_store(make_config()) as store:
        stamps = []
        for i in range(40):
            result = await store.put_message(Message("Time", body_for(i, 20)))
            stamps.append(result.store_timestamp)
            if i % 10 == 9:
                await trio.sleep(0.02)
        await store.wait_dispatched()
        for i in (0, 9, 10, 25, 39):
            found = store.get_offset_in_queue_by_time("Time", 0, stamps[i])
            assert found == stamps.index(stamps[i])
            assert store.get_message_store_timestamp("Time", 0, found) == stamps[i]
        assert store.get_offset_in_queue_by_time("Time", 0, 0) == 0
        assert store.get_offset_in_queue_by_time("Time", 0, stamps[-1] + 1) == 40
        assert store.get_earliest_message_time("Time", 0) == stamps[0]


async def test_lookup_by_offset_rejects_offsets_that_are_not_record_starts(make_config):
    async with open_store(make_config()) as store:
        result = await store.put_message(Message("L", b"hello"))
        for bad in (result.commitlog_offset + 1, result.commitlog_offset + result.size, -5, 10**12):
            assert await store.look_message_by_offset(bad) is None


async def test_store_timestamps_rise_with_offsets(make_config):
    async with open_store(make_config()) as store:
        results = [await store.put_message(Message("M", b"x")) for _ in range(200)]
        stamps = [r.store_timestamp for r in results]
        assert stamps == sorted(stamps)


async def test_shutdown_with_dispatch_behind_keeps_abort_file(make_config):
    config = make_config()
    async with open_store(config) as store:
        await store.put_message(Message("A", b"x"))
        await store.wait_dispatched()
        # A dispatcher that stopped on an error leaves work undone: the next open must
        # run crash recovery (RocketMQ's testDispatchBehindWhenShutdown).
        store.dispatcher.error = "simulated: queue write failed"
    assert await trio.Path(config.store_path_root_dir, "abort").exists()
    async with open_store(config) as store:
        assert recovery_of(store).abnormal
        assert [m.body for m in await store.get_messages("A", 0, 0, 5)] == [b"x"]
    assert not await trio.Path(config.store_path_root_dir, "abort").exists()


async def test_dispatcher_pauses_after_a_trickle_and_not_after_a_group(make_config, mock_clock):
    """After a round of fewer than PAUSE_BELOW records the dispatcher pauses ROUND_PAUSE (a
    trickle of appends is indexed in batches); after a group it goes straight back to
    waiting for the log, with no timer (a timer's wake-up ends in a raised Cancelled)."""
    async with open_store(make_config()) as store:
        dispatched = store.dispatcher.dispatched
        written = store.commitlog.written
        await store.put_message(Message("P", b"first"))
        await trio.testing.wait_all_tasks_blocked()
        assert dispatched.value == written.value  # a lone message: indexed at once
        await store.put_message(Message("P", b"second"))
        await trio.testing.wait_all_tasks_blocked()
        assert dispatched.value < written.value  # the pause after a round of one
        mock_clock.jump(ROUND_PAUSE)
        await trio.testing.wait_all_tasks_blocked()
        assert dispatched.value == written.value
        mock_clock.jump(ROUND_PAUSE)  # the pause after that round ends too
        await trio.testing.wait_all_tasks_blocked()

        async with trio.open_nursery() as nursery:  # one round's appends
            for i in range(PAUSE_BELOW):
                nursery.start_soon(store.put_message, Message("P", b"group %d" % i), i % 4)
        await trio.testing.wait_all_tasks_blocked()
        assert dispatched.value == written.value
        await store.put_message(Message("P", b"after the group"))
        await trio.testing.wait_all_tasks_blocked()
        assert dispatched.value == written.value  # no pause: indexed at once, no time passed
        assert len(await store.get_messages("P", 0, 0, 32)) == 2 + PAUSE_BELOW // 4 + 1


async def test_checkpoint_records_flushed_timestamps(make_config):
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    async with open_store(config) as store:
        result = await store.put_message(Message("C", b"x"))
        await store.wait_dispatched()
        await store.flush_consume_queues(0)
        assert store.checkpoint.physic_msg_timestamp == result.store_timestamp
        assert store.checkpoint.logics_msg_timestamp == result.store_timestamp
    from trio_ha.store.checkpoint import Checkpoint

    on_disk = Checkpoint.load(os.path.join(config.store_path_root_dir, "checkpoint"))
    assert on_disk.physic_msg_timestamp == result.store_timestamp
    assert (await trio.Path(config.store_path_root_dir, "checkpoint").stat()).st_size == 4096
    assert on_disk.min_timestamp == result.store_timestamp - 3000


async def test_point_2_checkpoint_never_covers_consume_queue_entries_left_unflushed(make_config):
    """flushConsumeQueueLeastPages=2 skips a queue with one dirty page; the checkpoint's
    logicsMsgTimestamp used to move to the last dispatched record whenever any queue synced,
    so it covered the skipped queue's entry, which a power loss could still take (a crash
    recovery starting after it would never re-index it)."""
    config = make_config(
        mapped_file_size_consume_queue=20 * 1024,  # 5 pages per file
        flush_interval_consume_queue=600_000,  # only this test flushes queues
    )
    async with open_store(config) as store:
        lone = await store.put_message(Message("Lone", b"x"))
        await trio.sleep(0.005)  # a later store timestamp for the rest
        # 8,400 bytes of entries: two dirty pages
        last = await store.put_messages([Message("Busy", b"y")] * 420)
        await store.wait_dispatched()
        assert last.store_timestamp > lone.store_timestamp
        await store.flush_consume_queues(2)
        busy, single = store.queues.get("Busy", 0), store.queues.get("Lone", 0)
        assert busy is not None and single is not None
        assert not busy.dirty_segments(0) and single.dirty_segments(0)  # Lone was skipped
        assert store.checkpoint.logics_msg_timestamp < lone.store_timestamp
        await store.flush_consume_queues(0)
        assert store.checkpoint.logics_msg_timestamp == last.store_timestamp


async def test_retention_deletes_old_segments_and_queue_files_but_waits_for_holders(make_config):
    config = make_config(delete_commit_log_files_interval=0)
    async with open_store(config) as store:
        for i in range(400):
            await store.put_message(Message("Old", body_for(i, 900)))
        await store.flush()
        await store.wait_dispatched()
        segments = list(store.commitlog.segments.segments)
        assert len(segments) >= 5
        old = time.time() - 73 * 3600
        for segment in segments[:3]:
            os.utime(segment.path, (old, old))
        held = segments[0]
        with held.hold():
            deleted = await retention.delete_expired_files(store, force=True)
            assert deleted == 3
            assert await trio.Path(held.path).exists()  # a reader still holds it
            assert held.read(0, 4) != b""
        assert not await trio.Path(held.path).exists()
        assert not any([await trio.Path(s.path).exists() for s in segments[:3]])
        assert store.min_commitlog_offset == segments[3].base_offset
        low = store.min_queue_offset("Old", 0)
        assert low > 0
        first = await store.get_messages("Old", 0, low, 1)
        assert first and first[0].commitlog_offset >= store.min_commitlog_offset
        too_small = store.read_queue("Old", 0, 0, 1)
        assert too_small.status is GetMessageStatus.OFFSET_TOO_SMALL and too_small.next_begin_offset == low
        # Not expired: nothing more goes.
        assert await retention.delete_expired_files(store, force=True) == 0


async def test_from_properties_reads_rocketmq_keys():
    config = StoreConfig.from_properties(
        "brokerRole=SYNC_MASTER\nflushDiskType=SYNC_FLUSH\nstorePathRootDir=/tmp/x\n"
        "mappedFileSizeCommitLog=1073741824\nlistenPort=10911\n# comment\nmaxMessageSize=1024\n"
    )
    assert config.broker_role is BrokerRole.SYNC_MASTER
    assert config.flush_disk_type is FlushDiskType.SYNC_FLUSH
    assert config.store_path_root_dir == "/tmp/x" and config.max_message_size == 1024


# ---- property-based: everything put comes back, across many segment boundaries --------------

message_strategy = st.builds(
    lambda topic, body, tags, props: (topic, body, tags, props),
    st.sampled_from(["TopicA", "TopicB", "T%|x-y_z"]),
    st.builds(
        lambda size, seed: random.Random(seed).randbytes(size),
        st.one_of(st.integers(0, 600), st.integers(3000, 9000)),
        st.integers(0, 2**32),
    ),
    st.one_of(st.none(), st.text("abcXYZ", min_size=1, max_size=5)),
    st.dictionaries(st.sampled_from(["a", "bb", "UNIQ_KEY"]), st.text("xyz\u00e9\u4e2d", min_size=1, max_size=10), max_size=3),
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(st.booleans(), st.lists(message_strategy, min_size=1, max_size=6), st.integers(0, 2)),
        min_size=1,
        max_size=40,
    ),
    flush=st.sampled_from(list(FlushDiskType)),
)
async def test_everything_put_reads_back_identically(ops, flush):
    root = tempfile.mkdtemp(prefix="trio-ha-prop-")
    try:
        config = StoreConfig(
            # 64 KiB segments: every batch the strategy makes fits one (6 x 9000 bytes),
            # and 40 operations still cross many segment boundaries.
            store_path_root_dir=root, mapped_file_size_commit_log=64 * 1024,
            mapped_file_size_consume_queue=20 * 8, flush_disk_type=flush,
        )
        expected = []  # (result offset, queue offset, Message, queue id)
        async with open_store(config) as store:
            for as_batch, specs, queue_id in ops:
                messages = [Message(t, b, tags=tg, properties=p) for t, b, tg, p in specs]
                if as_batch and len({m.topic for m in messages}) == 1:
                    result = await store.put_messages(messages, queue_id=queue_id)
                    assert result.ok, result
                    for i, (m, msg_id) in enumerate(zip(messages, result.msg_ids, strict=True)):
                        _, offset = rec.decode_message_id(msg_id)
                        expected.append((offset, result.queue_offset + i, m, queue_id))
                else:
                    for m in messages:
                        result = await store.put_message(m, queue_id=queue_id)
                        assert result.ok, result
                        expected.append((result.commitlog_offset, result.queue_offset, m, queue_id))
            await store.wait_dispatched()
            await _check_all(store, expected)
        async with open_store(config) as store:  # and after a restart
            await _check_all(store, expected)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _check_all(store, expected):
    for offset, queue_offset, message, queue_id in expected:
        by_offset = await store.look_message_by_offset(offset)
        by_queue = await store.get_messages(message.topic, queue_id, queue_offset, 1)
        for stored in (by_offset, by_queue[0]):
            assert stored.body == message.body and stored.topic == message.topic
            assert stored.queue_offset == queue_offset and stored.commitlog_offset == offset
            assert stored.tags == message.tags and stored.crc_ok
            assert stored.properties == message.all_properties()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([0, 1, 4 * 1024 * 1024, 4 * 1024 * 1024 - 1, 2_000_000]), min_size=2, max_size=5))
async def test_bodies_up_to_4_mib_round_trip(sizes):
    root = tempfile.mkdtemp(prefix="trio-ha-big-")
    try:
        config = StoreConfig(
            store_path_root_dir=root, mapped_file_size_commit_log=4 * 1024 * 1024 + 64 * 1024,
            mapped_file_size_consume_queue=200, warm_mapped_file_enable=False,
        )
        async with open_store(config) as store:
            results = []
            for i, size in enumerate(sizes):
                results.append(await store.put_message(Message("Big", body_for(i, size))))
            assert all(r.ok for r in results)
            for i, (size, result) in enumerate(zip(sizes, results, strict=True)):
                stored = await stored_at(store, result.commitlog_offset)
                assert stored.body == body_for(i, size)
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_puts_work_beyond_the_topic_cache(make_config):
    async with open_store(make_config()) as store:
        store.admission.topics.update({f"filler{i}": b"x" for i in range(65536)})  # the cache is full
        assert (await store.put_message(Message("Fresh", b"one"))).ok
        assert (await store.put_messages([Message("Fresh2", b"two")])).ok


async def test_lookup_by_time_reads_store_timestamps_behind_ipv6_born_hosts(make_config):
    """STORETIMESTAMP follows BORNHOST, 20 bytes long when SYSFLAG says IPv6: the lookup must
    read far enough into the record to reach it (it read 72 bytes, 4 short, before)."""
    async with open_store(make_config()) as store:
        results = [
            await store.put_message(Message("Six", b"x", born_host="[::1]:5000")) for _ in range(3)
        ]
        await store.wait_dispatched()
        stored = await stored_at(store, results[0].commitlog_offset)
        assert stored.sys_flag & rec.SYSFLAG_BORNHOST_V6
        for i, result in enumerate(results):
            assert store.get_message_store_timestamp("Six", 0, i) == result.store_timestamp
        assert store.get_offset_in_queue_by_time("Six", 0, results[0].store_timestamp) == 0


async def test_raw_reads_are_views_of_the_mapping_and_outlive_retention(make_config):
    """A pull's records (read_queue raw) are views of the mapped segments, not copies, with
    adjacent records merged into one span; a read crossing segments gets a span per segment;
    and a view still reads its bytes after retention deleted the segment's file."""
    config = make_config(delete_commit_log_files_interval=0)
    async with open_store(config) as store:
        results = [await store.put_message(Message("Views", body_for(i, 900)))
                   for i in range(200)]
        await store.flush()
        await store.wait_dispatched()
        segments = list(store.commitlog.segments.segments)
        assert len(segments) >= 3
        result = store.read_queue("Views", 0, 0, 200, raw=True)
        assert result.status is GetMessageStatus.FOUND and len(result.records) == 200
        mappings = {id(s._mmap): s for s in segments}
        assert all(id(view.obj) in mappings for view in result.records + result.spans)
        # One span per segment the records sit in: all of them are adjacent within one.
        holding = {id(view.obj) for view in result.records}
        assert len(result.spans) == len(holding)
        assert b"".join(result.spans) == b"".join(result.records)
        for view, put in zip(result.records, results, strict=True):
            message = rec.decode_record(view, check_crc=True)
            assert message.commitlog_offset == put.commitlog_offset
        first = result.records[0]
        expected = bytes(first)
        old = time.time() - 73 * 3600
        os.utime(segments[0].path, (old, old))
        assert await retention.delete_expired_files(store, force=True) == 1
        assert not await trio.Path(segments[0].path).exists()
        assert bytes(first) == expected  # the view keeps the mapping
        low = store.min_queue_offset("Views", 0)
        again = store.read_queue("Views", 0, low, 200, raw=True)
        assert again.status is GetMessageStatus.FOUND
        assert all(view.obj is not first.obj for view in again.records)
        assert b"".join(again.records) == b"".join(result.records[low:])


@pytest.mark.parametrize("engine", ["native", "python"])
async def test_a_property_value_ending_in_nul_is_refused_not_stored_as_a_torn_record(
        make_config, engine, monkeypatch):
    """Recovery takes a record whose last byte is 0 for a torn one (its tail never reached
    the file) and cuts the log there; so a record may not end in 0: a message whose
    properties do is refused at put time (single and in a batch), and the store stays as it
    was."""
    if engine == "python":
        monkeypatch.setattr(_backend, "engine", _backend.python_engine)
    async with open_store(make_config()) as store:
        bad = Message("T", b"body", properties={"trailer": "ends in\x00"})
        single = await store.put_message(bad, 0)
        assert single.status is PutMessageStatus.MESSAGE_ILLEGAL and "NUL" in single.remark
        batch = await store.put_messages([Message("T", b"ok"), bad], 0)
        assert batch.status is not PutMessageStatus.PUT_OK
        assert store.max_commitlog_offset == 0
        fine = await store.put_message(Message("T", b"body", properties={"k": "v"}), 0)
        assert fine.status is PutMessageStatus.PUT_OK
