"""Cutting a live store back to an offset (MessageStore.truncate_to, trio_ha.store.truncation):
what readers, queues, the index, the epoch file and the next put see after it, what it
refuses, and that a SIGKILL at every step of it (and of finishing it at the next open) leaves
the store cut or untouched, never a mix (RocketMQ #10666 leaves the tail valid on disk)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import attrs
import pytest
import trio

from trio_ha import BrokerRole, GetMessageStatus, open_store
from trio_ha.store import MessageStore, TruncationError
from trio_ha.store.ha.epochs import EpochEntry, EpochFile
from trio_ha.store.truncation import INTENT_NAME

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import truncation_crash as child  # noqa: E402

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "truncation_crash.py")
#: every step a live truncation announces, in order, and "none" (it finishes)
STEPS = ["checked", "intent-written", "memory-cut", "commitlog-zeroed", "queues-synced",
         "index-cut", "epochs-cut", "checkpoint-written", "intent-removed", "none"]
FOREVER = 2**62


async def put_all(store: MessageStore) -> list[int]:
    offsets = []
    for i in range(child.MESSAGES):
        message, queue_id = child.message(i)
        result = await store.put_message(message, queue_id)
        assert result.ok, result
        offsets.append(result.commitlog_offset)
    await store.wait_dispatched()
    return offsets


def kept_of(queue: tuple[str, int], kept: int) -> list[int]:
    """The messages of ``queue`` among the first ``kept``, in queue order."""
    return [i for i in range(kept) if (child.TOPICS[i % 2], i % child.QUEUES) == queue]


async def check_store(store: MessageStore, end: int, kept: int) -> None:
    """The store ends at ``end`` and holds exactly the first ``kept`` messages, through
    every way of reading it."""
    assert store.max_commitlog_offset == end
    assert store.commitlog.max_offset == end
    for topic in child.TOPICS:
        for queue_id in range(child.QUEUES):
            expected = kept_of((topic, queue_id), kept)
            assert store.max_queue_offset(topic, queue_id) == len(expected)
            got = store.read_queue(topic, queue_id, 0, 1000)
            assert [m.keys for m in got.messages] == [(f"key{i}",) for i in expected]
            assert [m.body for m in got.messages] == \
                [child.message(i)[0].body for i in expected]
            beyond = store.read_queue(topic, queue_id, len(expected), 10)
            assert beyond.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE,
                                     GetMessageStatus.NO_MESSAGE_IN_QUEUE)
    for i in {0, kept - 1, kept, child.CUT_AT, child.MESSAGES - 1}:
        if not 0 <= i < child.MESSAGES:
            continue
        topic = child.TOPICS[i % 2]
        found = store.query_message(topic, f"key{i}", 32, 0, FOREVER).records
        assert len(found) == (1 if i < kept else 0), i


async def check_next_put(store: MessageStore, end: int, kept: int) -> None:
    message, queue_id = child.message(kept)
    result = await store.put_message(attrs.evolve(message, keys=("after-cut",)), queue_id)
    assert result.ok, result
    assert result.commitlog_offset == end
    assert result.queue_offset == len(kept_of((message.topic, queue_id), kept))
    await store.wait_dispatched()
    assert store.query_message(message.topic, "after-cut", 32, 0, FOREVER).records


def tail_is_zero(root: str, cut: int) -> bool:
    """Every commitlog byte at or past ``cut`` on disk is zero (no file past it, or zeros)."""
    directory = os.path.join(root, "commitlog")
    for name in os.listdir(directory):
        base = int(name)
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        if base + len(data) <= cut:
            continue
        if any(data[max(0, cut - base):]):
            return False
    return True


async def test_a_new_master_cuts_its_store(make_config):
    config = make_config(**_small(child.store_config("x")))
    async with open_store(config) as store:
        offsets = await put_all(store)
        end = store.max_commitlog_offset
        cut = offsets[child.CUT_AT]
        epochs = EpochFile.load(config.epoch_file_path)
        for epoch, start in [(1, 0), (2, offsets[100]), (3, cut), (4, offsets[400])]:
            assert epochs.append(epoch, start)
        store.epochs = epochs

        with pytest.raises(TruncationError, match="only the change-to-master path"):
            await store.truncate_to(cut)
        with pytest.raises(TruncationError, match="not a record boundary"):
            await store.truncate_to(cut + 1, for_new_master=True)
        with pytest.raises(TruncationError, match="the log ends at"):
            await store.truncate_to(end + 1, for_new_master=True)
        await check_store(store, end, child.MESSAGES)  # nothing changed

        assert await store.truncate_to(cut, for_new_master=True) == end - cut
        await check_store(store, cut, child.CUT_AT)
        assert store.epochs.cache.entries == (EpochEntry(1, 0), EpochEntry(2, offsets[100]))
        assert list(EpochFile.load(config.epoch_file_path).cache.entries) == \
            [EpochEntry(1, 0), EpochEntry(2, offsets[100])]
        assert not os.path.exists(os.path.join(store.root, INTENT_NAME))
        await store.flush()
        assert tail_is_zero(store.root, cut)
        await check_next_put(store, cut, child.CUT_AT)
    async with open_store(config) as store:
        assert store.recovery is not None and not store.recovery.abnormal
        assert store.max_commitlog_offset > cut
        assert store.read_queue(child.TOPICS[child.CUT_AT % 2], child.CUT_AT % child.QUEUES,
                                0, 1000).messages[-1].keys == ("after-cut",)


async def test_a_slave_cuts_its_store_and_the_epoch_file_on_disk(make_config):
    config = make_config(**_small(child.store_config("x")))
    async with open_store(config) as store:
        offsets = await put_all(store)
    cut = offsets[child.CUT_AT]
    epochs = EpochFile.load(config.epoch_file_path)
    assert epochs.append(5, 0) and epochs.append(6, cut)
    slave = attrs.evolve(config, broker_role=BrokerRole.SLAVE,
                         ha_master_address="127.0.0.1:1")
    async with open_store(slave) as store:
        assert store.epochs is None  # the store keeps none in memory; the file is cut
        await store.truncate_to(cut)
        await check_store(store, cut, child.CUT_AT)
        # Cutting where the log ends cuts nothing, and still drops epochs starting there.
        assert await store.truncate_to(cut) == 0
    assert list(EpochFile.load(config.epoch_file_path).cache.entries) == [EpochEntry(5, 0)]
    async with open_store(config) as store:
        await check_store(store, cut, child.CUT_AT)
        await check_next_put(store, cut, child.CUT_AT)


def _small(config) -> dict:
    """The crash helper's file sizes, for make_config."""
    return {name: getattr(config, name) for name in (
        "mapped_file_size_commit_log", "mapped_file_size_consume_queue", "max_hash_slot_num",
        "max_index_num")}


def _run_child(root: str, step: str) -> tuple[int, list[str]]:
    done = subprocess.run([sys.executable, HELPER, root, step], capture_output=True,
                          timeout=300, check=False)
    lines = done.stdout.decode().splitlines()
    if done.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"child failed ({done.returncode}): {done.stderr.decode()}")
    return done.returncode, lines


@pytest.mark.parametrize("step", STEPS)
async def test_a_kill_at_any_step_leaves_the_store_cut_or_untouched(tmp_path, step):
    root = str(tmp_path / "store")
    code, lines = await trio.to_thread.run_sync(_run_child, root, step)
    assert code == (0 if step == "none" else -signal.SIGKILL)
    cut_line = next(line for line in lines if line.startswith("CUT "))
    cut, end, second, fourth = (int(x) for x in cut_line.split()[1:])
    assert cut < end
    await _check_after_crash(root, step != "checked", cut, end, second, fourth)


async def test_a_kill_while_the_next_open_finishes_a_cut(tmp_path):
    root = str(tmp_path / "store")
    code, lines = await trio.to_thread.run_sync(_run_child, root, "memory-cut")
    assert code == -signal.SIGKILL
    assert os.path.exists(os.path.join(root, INTENT_NAME))
    code, _ = await trio.to_thread.run_sync(_run_child, root, "reopen:recovery-cut")
    assert code == -signal.SIGKILL
    cut, end, second, fourth = (int(x) for x in lines[0].split()[1:])
    await _check_after_crash(root, True, cut, end, second, fourth)


async def _check_after_crash(root: str, truncated: bool, cut: int, end: int, second: int,
                             fourth: int) -> None:
    config = child.store_config(root)
    async with open_store(config) as store:
        assert not os.path.exists(os.path.join(root, INTENT_NAME))
        if truncated:
            await check_store(store, cut, child.CUT_AT)
        else:
            await check_store(store, end, child.MESSAGES)
    if truncated:
        assert tail_is_zero(root, cut)
        expected = [EpochEntry(1, 0), EpochEntry(2, second)]
    else:
        expected = [EpochEntry(1, 0), EpochEntry(2, second), EpochEntry(3, cut),
                    EpochEntry(4, fourth)]
    assert list(EpochFile.load(config.epoch_file_path).cache.entries) == expected
    # The stale tail never comes back: the next put goes where the cut (or the end) is.
    async with open_store(config) as store:
        await check_next_put(store, cut if truncated else end,
                             child.CUT_AT if truncated else child.MESSAGES)
