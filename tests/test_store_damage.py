"""Damaged store files (issue 9, points 2-4): what recovery does with a consume queue that
disagrees with the commitlog, a commitlog with a missing segment, and a bad record in the
middle of the log; and the CRC check on the pull path.

Each test damages files of a store that was written and closed by the store itself, then
reopens it (after a clean stop and, where it matters, as after a crash) and checks the whole
store with ``test_crash.verify_store``: every acknowledged record where its put said, the
consume queues exactly the records of each queue in commitlog order, nothing served past the
end.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import attrs
import pytest

from test_crash import (
    TORN_SEGMENT,
    TORN_TOPIC,
    Ack,
    Written,
    _flip,
    _topic_len_position,
    cw,
    patch,
    recovery_of,
    segment_file,
    torn_config,
    torn_key,
    verify_store,
    write_torn_store,
)
from trio_ha import Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.store.holes import HOLE_TOPIC
from trio_ha.store.segments import SegmentGapError

# ---- point 2: a consume queue that disagrees with the commitlog ---------------------------


def queue_dir(config: StoreConfig, queue_id: int, topic: str = TORN_TOPIC) -> Path:
    return Path(config.store_path_root_dir) / "consumequeue" / topic / str(queue_id)


def zero_file(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.write(bytes(size))
        f.flush()
        os.fsync(f.fileno())


async def reopen_and_check(config: StoreConfig, written: list[Written], *, abnormal: bool,
                           context: str, rebuilt: str = f"{TORN_TOPIC}/0") -> None:
    """Reopen; the damaged queue is rebuilt, the whole store agrees with the commitlog, and
    the next put to each queue takes the next queue offset (none is reused)."""
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    acked = {w.ack.key: w.ack for w in written}
    async with open_store(config) as store:
        report = recovery_of(store)
        assert report.abnormal is abnormal
        assert [note.split(":")[0] for note in report.rebuilt_queues] == [rebuilt], report
        await verify_store(store, acked, context=context)
        for queue_id in (0, 1):
            count = sum(1 for w in written if w.ack.queue_id == queue_id)
            key = torn_key(20_000 + queue_id, 30, run=9)
            result = await store.put_message(
                Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key),
                queue_id,
            )
            assert result.status is PutMessageStatus.PUT_OK
            assert result.queue_offset == count, f"queue offset reused [{context}]"
            acked[key] = Ack(result.commitlog_offset, key, TORN_TOPIC, queue_id, count)
        await store.wait_dispatched()
    async with open_store(config) as store:
        assert recovery_of(store).rebuilt_queues == ()
        await verify_store(store, acked, context=f"{context}, reopened after the puts")


def big_cq_config(root: Path) -> StoreConfig:
    """One consume-queue file holds every entry of a queue (the reported case: a queue of
    one file, zeroed)."""
    return attrs.evolve(torn_config(root), mapped_file_size_consume_queue=20 * 4096)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_point_2_zeroed_consume_queue_file_is_rebuilt_at_the_right_offsets(
    tmp_path, abnormal
):
    """The reported case: a queue's only consume-queue file is zeroed. Before the fix,
    normal recovery re-dispatched the last commitlog segment and wrote its records at the
    queue's (empty) end — queue offset 0 served the record stored as offset N, the records
    before it were unreachable, and the next put reused a queue offset."""
    config = big_cq_config(tmp_path)
    written = await write_torn_store(config, 120)  # ~7 commitlog segments, 60 per queue
    zero_file(queue_dir(config, 0) / f"{0:020d}")
    await reopen_and_check(config, written, abnormal=abnormal, context="zeroed CQ file")


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_point_2_zeroed_consume_queue_of_old_records_never_reuses_queue_offsets(
    tmp_path, abnormal
):
    """A queue whose records all lie before the segments recovery re-dispatches: zeroing its
    file left it empty, and the next put took queue offset 0 again."""
    config = big_cq_config(tmp_path)
    written = await write_torn_store(config, 120)
    # A third queue, written first, then 60 more records on queues 0/1 after it.
    async with open_store(config) as store:
        early = []
        for i in range(5):
            key = torn_key(30_000 + i, 40, run=4)
            result = await store.put_message(
                Message("EarlyTopic", cw.expected_body(key), tags=cw.expected_tags(key),
                        keys=key), 0,
            )
            early.append(Ack(result.commitlog_offset, key, "EarlyTopic", 0, result.queue_offset))
        await store.wait_dispatched()
    more = await write_torn_store(config, 60, run=5)
    zero_file(queue_dir(config, 0, "EarlyTopic") / f"{0:020d}")
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    acked = {w.ack.key: w.ack for w in written + more} | {a.key: a for a in early}
    async with open_store(config) as store:
        assert [n.split(":")[0] for n in recovery_of(store).rebuilt_queues] == ["EarlyTopic/0"]
        await verify_store(store, acked, context="zeroed CQ of an early queue")
        key = torn_key(30_100, 40, run=6)
        result = await store.put_message(
            Message("EarlyTopic", cw.expected_body(key), tags=cw.expected_tags(key), keys=key), 0
        )
        assert result.queue_offset == len(early), "queue offset reused"


@pytest.mark.parametrize("which", ["first", "middle", "last"])
async def test_point_2_zeroed_file_among_many_is_rebuilt(tmp_path, which):
    """Small consume-queue files (16 entries): one of a queue's files zeroed, normal
    recovery. A zeroed file before the last three used to be taken as data (zero entries
    served as nothing); the last ones were 'repaired' at the wrong positions."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 150)  # 75 entries per queue: 5 files each
    files = sorted(os.listdir(queue_dir(config, 0)))
    assert len(files) == 5
    name = {"first": files[0], "middle": files[2], "last": files[-1]}[which]
    zero_file(queue_dir(config, 0) / name)
    await reopen_and_check(config, written, abnormal=False, context=f"zeroed {which} CQ file")


async def test_point_2_consume_queue_entries_pointing_at_other_records_are_rebuilt(tmp_path):
    """Entries that are valid in form but point at the wrong records (queue 0's file holds
    queue 1's entries) are found by checking the queue against the records it points at."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 60)
    q0, q1 = queue_dir(config, 0), queue_dir(config, 1)
    name = sorted(os.listdir(q0))[0]
    (q0 / name).write_bytes((q1 / name).read_bytes())
    await reopen_and_check(config, written, abnormal=False, context="swapped CQ file")


# ---- point 3: a missing segment -------------------------------------------------------------


async def test_point_3_missing_middle_commitlog_segment_is_a_clear_gap_error(tmp_path):
    """Before: IndexError from the loader (it closed the segments it had, then read the last
    one's end for its message). Now a SegmentGapError naming the offset and both files;
    the lock is released, so the second attempt says the same, and with the file back the
    store opens whole."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 100)
    directory = Path(config.commitlog_dir)
    names = sorted(os.listdir(directory))
    assert len(names) >= 5
    missing = directory / names[2]
    saved = missing.read_bytes()
    missing.unlink()
    gap = int(names[2])
    for _ in range(2):
        with pytest.raises(SegmentGapError) as caught:
            async with open_store(config):
                pass  # pragma: no cover
        error = caught.value
        assert (error.before, error.offset, error.after) == (int(names[1]), gap, int(names[3]))
        message = str(error)
        assert f"gap between segments at offset {gap}" in message
        assert names[1] in message and names[3] in message
    missing.write_bytes(saved)
    async with open_store(config) as store:
        await verify_store(store, {w.ack.key: w.ack for w in written}, context="file back")


async def test_point_3_missing_middle_consume_queue_file_is_rebuilt(tmp_path):
    """The same gap in a consume queue (derived data) is not fatal: the queue is rebuilt from
    the commitlog."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 150)
    names = sorted(os.listdir(queue_dir(config, 0)))
    (queue_dir(config, 0) / names[2]).unlink()
    await reopen_and_check(config, written, abnormal=False, context="missing CQ file")


# ---- point 4: a damaged record in the middle of the log -----------------------------------


def damage_flip_body(path: Path, pos: int, w: Written) -> None:
    _flip(lambda w: 88 + w.body_len // 2)(None, path, pos, w)


def damage_zero_header(path: Path, pos: int, w: Written) -> None:
    patch(path, pos + _topic_len_position(w), bytes(16))


def damage_bad_magic(path: Path, pos: int, w: Written) -> None:
    patch(path, pos + 4, b"\x12\x34\x56\x78")


def damage_zero_range(path: Path, pos: int, w: Written) -> None:
    """A lost page: zeros over this record and into the next (or to its segment's end)."""
    patch(path, pos, bytes(min(w.size + 150, TORN_SEGMENT - pos)))


POINT_4_DAMAGE = {
    "crc_mismatch": damage_flip_body,
    "zeroed_16_bytes": damage_zero_header,
    "bad_magic": damage_bad_magic,
    "zeroed_range": damage_zero_range,
}


def pick_damaged(written: list[Written], where: str) -> int:
    """A record of the second segment that is not its first: its last one, or one with
    records of the same segment after it."""
    second = [i for i, w in enumerate(written)
              if TORN_SEGMENT <= w.ack.offset < 2 * TORN_SEGMENT and w.ack.offset % TORN_SEGMENT]
    return second[-1] if where == "last_of_segment" else second[len(second) // 2]


async def check_kept_all_but(store, written: list[Written], lost: set[int], *,
                             context: str) -> None:
    """Every record but ``lost`` is where its put said, served by its queue at its queue
    offset; the lost ones are never served, and their queue offsets read as removed."""
    for i, w in enumerate(written):
        message = await store.look_message_by_offset(w.ack.offset)
        served = await store.get_messages(TORN_TOPIC, w.ack.queue_id, w.ack.queue_offset, 1)
        if i in lost:
            assert message is None or message.topic == HOLE_TOPIC, (i, w, context)
            assert all(m.queue_offset != w.ack.queue_offset for m in served), (i, context)
            continue
        assert message is not None and message.keys == (w.ack.key,), (i, w, context)
        assert message.crc_ok
        assert [m.commitlog_offset for m in served] == [w.ack.offset], (i, w, served, context)


@pytest.mark.parametrize("where", ["middle_of_segment", "last_of_segment"])
@pytest.mark.parametrize("kind", list(POINT_4_DAMAGE))
@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_point_4_recovery_keeps_the_intact_records_after_a_damaged_one(
    tmp_path, abnormal, kind, where
):
    """Before: recovery ended the log at the damaged record and discarded everything after
    it, acknowledged SYNC_FLUSH records and later segments included. Now the damaged bytes
    are replaced by filler (and kept in corrupt/), every record after them is kept, the
    damaged record is never served, and its queue offset reads as removed."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 60)
    damaged = pick_damaged(written, where)
    w = written[damaged]
    path, pos = segment_file(config, w.ack.offset)
    POINT_4_DAMAGE[kind](path, pos, w)
    lost = {damaged}
    zeroed_end = w.ack.offset + min(w.size + 150, TORN_SEGMENT - pos)
    if kind == "zeroed_range" and written[damaged + 1].ack.offset < zeroed_end:
        lost.add(damaged + 1)
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    end = written[-1].ack.offset + written[-1].size
    async with open_store(config) as store:
        report = recovery_of(store)
        context = f"{kind} at {w.ack.offset}: {report}"
        assert store.max_commitlog_offset == end, context
        assert len(report.holes) == 1 and report.holes[0].startswith(f"[{w.ack.offset}, ")
        await check_kept_all_but(store, written, lost, context=context)
        key = torn_key(40_000, 60, run=2)
        result = await store.put_message(
            Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key),
            w.ack.queue_id,
        )
        last_of_queue = max(x.ack.queue_offset for x in written if x.ack.queue_id == w.ack.queue_id)
        assert result.queue_offset == last_of_queue + 1
        await store.wait_dispatched()
    quarantined = os.listdir(Path(config.store_path_root_dir) / "corrupt")
    assert quarantined == [f"{w.ack.offset:020d}-{report.holes[0].split(', ')[1].split(')')[0]:0>20}"]
    for crashed in (False, True):  # the filler is a valid part of the log for every later open
        if crashed:
            (Path(config.store_path_root_dir) / "abort").touch()
        async with open_store(config) as store:
            report = recovery_of(store)
            assert report.holes == () and report.rebuilt_queues == (), report
            assert store.max_commitlog_offset == result.commitlog_offset + result.size
            await check_kept_all_but(store, written, lost, context=f"reopened {crashed}")


async def test_point_4_stale_records_behind_a_damaged_one_are_not_taken_back(tmp_path):
    """Records after the damage whose store time goes back (what RocketMQ leaves behind a
    cut: an earlier life of the file) do not chain: the log ends at the damage."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 12, sizes=lambda i: 200)  # one segment
    damaged = 6
    path, _ = segment_file(config, 0)
    older = struct.pack(">q", 1_000_000)  # 1970: older than anything before the damage
    for later in written[damaged + 1:]:
        patch(path, later.ack.offset + 56, older)  # STORETIMESTAMP (IPv4 born host)
    damage_flip_body(path, written[damaged].ack.offset, written[damaged])
    async with open_store(config) as store:
        report = recovery_of(store)
        assert report.holes == ()
        assert store.max_commitlog_offset == written[damaged].ack.offset
        for later in written[damaged:]:
            assert await store.look_message_by_offset(later.ack.offset) is None


async def test_point_4_skip_can_be_turned_off(tmp_path):
    config = attrs.evolve(torn_config(tmp_path), skip_corrupt_records_on_recover=False)
    written = await write_torn_store(config, 60)
    damaged = pick_damaged(written, "middle_of_segment")
    path, pos = segment_file(config, written[damaged].ack.offset)
    damage_flip_body(path, pos, written[damaged])
    async with open_store(config) as store:
        assert store.max_commitlog_offset == written[damaged].ack.offset
        assert recovery_of(store).holes == ()


async def test_point_4_pulls_never_serve_a_record_that_fails_its_check(tmp_path):
    """Damage after recovery (a bit flipped on disk while the store runs; an entry that
    points at another record of the queue): before, pulls served both as messages. Now
    such a record is not served — the pull moves past it as OFFSET_FOUND_NULL — counted in
    statistics and logged."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 30)
    by_queue = [w for w in written if w.ack.queue_id == 0]
    flipped, pointed = by_queue[5], by_queue[9]
    async with open_store(config) as store:
        path, pos = segment_file(config, flipped.ack.offset)
        damage_flip_body(path, pos, flipped)  # the store's mapping sees the write
        queue = store.queues.get(TORN_TOPIC, 0)
        assert queue is not None
        segment = queue.files.find(pointed.ack.queue_offset * 20)
        assert segment is not None
        other = by_queue[10]
        segment.write(pointed.ack.queue_offset * 20 - segment.base_offset,
                      struct.pack(">qiq", other.ack.offset, other.size, 0))
        for raw in (False, True):
            result = store.read_queue(TORN_TOPIC, 0, 0, 32, raw=raw)
            served = ([m.commitlog_offset for m in result.messages] if not raw else
                      [struct.unpack_from(">q", r, 28)[0] for r in result.records])
            expected = [w.ack.offset for w in by_queue if w not in (flipped, pointed)]
            assert served == expected
            assert result.next_begin_offset == len(by_queue)
        assert store.statistics().unverified_reads == 4
        assert await store.look_message_by_offset(flipped.ack.offset) is None
        assert store.record_bytes(flipped.ack.offset) is None
        assert await store.look_message_by_offset(other.ack.offset) is not None
