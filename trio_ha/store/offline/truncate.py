"""``truncate_store``: the explicit repair of a diverged slave, its store cut back to a record
boundary so that its next start replicates from there.

It cuts with the store's own code — ``CommitLog.set_end``, zeroing what follows as recovery does
after damage, and ``ConsumeQueue.truncate_dirty`` — drops the index entries past the cut, and
lowers the checkpoint to what is left. It holds the store's lock from the plan to the last
write, so it refuses a store a broker has open, and no broker can open it meanwhile.

Its steps go from the least to the most telling (index, queues, checkpoint, commitlog): stopped
half-way, the store still opens, and running it again finishes the job.
"""

from __future__ import annotations

import array
import os
import sys
from collections.abc import Callable
from typing import BinaryIO

import attrs

import trio_ha._backend as _backend

from ...config import StoreConfig
from ...wire import layout
from ...wire.layout import CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from .. import index as index_files
from ..checkpoint import Checkpoint
from ..commitlog import CommitLog
from ..consume_queue import ConsumeQueue, valid_prefix
from ..segment import Segment
from ._directory import (
    SCAN_BATCH,
    CheckpointSummary,
    OfflineStoreError,
    QueueDir,
    StoreDir,
    common_size,
    index_entries_at,
    index_paths,
    loadable_prefix,
    locate,
    mapped,
    queue_dirs,
    queue_file_size,
    read_checkpoint,
    read_index_header,
    segment_files,
    store_lock,
)

__all__ = ["IndexCut", "QueueCut", "TruncateOutcome", "TruncatePlan", "truncate_store"]


@attrs.frozen
class QueueCut:
    topic: str
    queue_id: int
    max_offset_before: int
    max_offset_after: int
    #: every entry was past the cut: the queue goes, as recovery removes such a queue
    removed: bool


@attrs.frozen
class IndexCut:
    name: str
    entries_before: int
    #: entries kept; None: the file is deleted (all of it was past the cut)
    entries_after: int | None


@attrs.frozen
class TruncatePlan:
    root: str
    offset: int
    #: where the records end now, and what goes
    log_end: int
    bytes_cut: int
    records_cut: int
    segments_deleted: tuple[str, ...]
    #: the segment file cut in the middle (its tail is zeroed), if any
    segment_cut: str | None
    queue_cuts: tuple[QueueCut, ...]
    index_cuts: tuple[IndexCut, ...]
    checkpoint_before: CheckpointSummary
    checkpoint_after: CheckpointSummary
    abort_present: bool

    @property
    def changes_anything(self) -> bool:
        return bool(self.bytes_cut or self.segments_deleted or self.queue_cuts
                    or self.index_cuts or self.checkpoint_before != self.checkpoint_after)


@attrs.frozen
class TruncateOutcome:
    plan: TruncatePlan
    applied: bool


@attrs.frozen
class _Boundary:
    #: the segment holding the cut (the one it starts, or the one it ends)
    index: int
    #: the last record kept: its commitlog offset and store time (None: nothing is kept)
    last_kept: tuple[int, int] | None


def _walk_to(segment: Segment, offset: int, max_record: int
             ) -> tuple[tuple[int, int] | None, int | None, tuple[int, int] | None, int,
                        _backend.ScanResult]:
    """Walk the records of ``segment`` (headers, no CRC) up to ``offset``: the last record
    starting below it (offset, store time), whether one starts at it (its offset), the
    record that spans it (start, end), where the walk stopped and how."""
    scanner = _backend.engine.scanner(SCAN_BATCH)
    before: tuple[int, int] | None = None
    spanning: tuple[int, int] | None = None
    position = 0
    at_offset: int | None = None
    while True:
        result = scanner.scan(segment.handle, segment.size, position, segment.base_offset, 0,
                              max_record)
        for i in range(result.count):
            info = result.infos[i]
            if info.phys_offset >= offset:
                if info.phys_offset == offset:
                    at_offset = offset
                return before, at_offset, None, info.phys_offset - segment.base_offset, result
            if info.phys_offset + info.size > offset:
                spanning = (info.phys_offset, info.phys_offset + info.size)
                return before, None, spanning, info.phys_offset - segment.base_offset, result
            before = (info.phys_offset, info.store_timestamp)
        position = result.end
        if result.stop != _backend.STOP_FULL:
            return before, at_offset, None, position, result


def _find_boundary(store: StoreDir, segments: list[Segment], offset: int) -> _Boundary:
    """Check that ``offset`` is where a record starts, or where the records of a segment
    end; OfflineStoreError naming the nearest boundaries when it is not."""
    if not segments:
        if offset == 0:
            return _Boundary(0, None)
        raise OfflineStoreError(f"the commitlog is empty: {offset} is past its end (0)")
    first = segments[0]
    if offset < first.base_offset:
        raise OfflineStoreError(
            f"{offset} is below the commitlog's first offset {first.base_offset} (older "
            "segments were deleted)")
    if offset > segments[-1].end_offset:
        raise OfflineStoreError(f"{offset} is past the end of the commitlog's files "
                                f"({segments[-1].end_offset})")
    index = next((i for i, s in enumerate(segments) if offset < s.end_offset),
                 len(segments) - 1)
    segment = segments[index]
    max_record = store.max_record
    before, at_offset, spanning, stopped, result = _walk_to(segment, offset, max_record)
    stop_offset = segment.base_offset + stopped
    if spanning is not None:
        raise OfflineStoreError(
            f"{offset} is not a record boundary: the record at {spanning[0]} "
            f"({spanning[1] - spanning[0]} bytes) spans it; the nearest boundaries are "
            f"{spanning[0]} and {spanning[1]}")
    if at_offset is None and stop_offset != offset and offset != segment.base_offset:
        ended = result.stop == _backend.STOP_BLANK or (
            result.stop == _backend.STOP_END and stopped == segment.size)
        if ended and offset == segment.end_offset:
            pass  # the end of a full segment: where the next one starts
        elif ended:
            raise OfflineStoreError(
                f"{offset} is not a record boundary: it lies in the filler at the end of "
                f"segment {os.path.basename(segment.path)}; the nearest boundaries are "
                f"{stop_offset} and {segment.end_offset}")
        elif result.stop == _backend.STOP_BAD_MAGIC and result.size == 0 \
                and index == len(segments) - 1:
            raise OfflineStoreError(f"{offset} is past the end of the log ({stop_offset})")
        else:
            raise OfflineStoreError(
                f"the records of segment {os.path.basename(segment.path)} stop at "
                f"{stop_offset} ({result.reason}) before {offset}: it cannot be told whether "
                f"{offset} is a record boundary; truncate to {stop_offset} or earlier (or let "
                "recovery deal with the damage)")
    if before is None and index > 0 and offset == segment.base_offset:
        previous = segments[index - 1]
        before, _, _, _, _ = _walk_to(previous, previous.end_offset, max_record)
    return _Boundary(index, before)


def _count_from(segments: list[Segment], index: int, offset: int, max_record: int
                ) -> tuple[int, int]:
    """The records from ``offset`` on (a header walk) and where they end."""
    scanner = _backend.engine.scanner(SCAN_BATCH)
    records = 0
    end = offset
    for segment in segments[index:]:
        position = max(0, offset - segment.base_offset)
        while True:
            result = scanner.scan(segment.handle, segment.size, position,
                                  segment.base_offset, 0, max_record)
            records += result.count
            position = result.end
            if result.stop != _backend.STOP_FULL:
                break
        end = segment.base_offset + position
        if not (result.stop == _backend.STOP_BLANK or (
                result.stop == _backend.STOP_END and position == segment.size)):
            break
    return records, end


def _entry(segments: list[Segment], file_size: int, queue_offset: int) -> tuple[int, int]:
    position = queue_offset * CQ_ENTRY_SIZE
    segment = segments[(position - segments[0].base_offset) // file_size]
    phys, size, _tags = CQ_ENTRY.unpack(segment.pread(position - segment.base_offset,
                                                      CQ_ENTRY_SIZE))
    return phys, size


def _plan_queue_cut(queue: QueueDir, file_size: int, offset: int) -> QueueCut | None:
    files = segment_files(queue.directory)
    usable, why, _gap = loadable_prefix(files, file_size)
    if not usable or why is not None:
        # Left alone: the next open rebuilds a queue with a missing file from the (cut)
        # commitlog, and refuses one with a mis-sized file whatever is done here.
        return None
    with mapped(files[:usable]) as segments:
        last = segments[-1]
        high = (last.base_offset + valid_prefix(last) * CQ_ENTRY_SIZE) // CQ_ENTRY_SIZE
        floor = segments[0].base_offset // CQ_ENTRY_SIZE
        # Entries follow the commitlog, so those past the cut are a suffix: bisect for it
        # (blank fillers at the head count as kept, as truncate_dirty keeps them).
        low, top = floor, high
        while low < top:
            middle = (low + top) // 2
            phys, size = _entry(segments, file_size, middle)
            if size != CQ_BLANK_SIZE and phys >= offset:
                top = middle
            else:
                low = middle + 1
    if low == high:
        return None
    return QueueCut(queue.topic, queue.queue_id, high, low, low == floor)


def _plan_index_cuts(store: StoreDir, segments: list[Segment], offset: int
                     ) -> list[tuple[IndexCut, tuple[int, int] | None]]:
    """Each index file with entries at or past ``offset``: deleted when all of it is past,
    else cut to the entries below, with the (end offset, end time) its header gets."""
    cuts: list[tuple[IndexCut, tuple[int, int] | None]] = []
    expected = index_files.file_size(store.config.max_hash_slot_num, store.config.max_index_num)
    entries_at = index_entries_at(store)
    for path in index_paths(store):
        header = read_index_header(path)
        if header is None or header.end_phy_offset < offset:
            continue
        name = os.path.basename(path)
        count = header.index_count
        if header.begin_phy_offset >= offset:
            # beginPhyOffset is its first entry's (or, before any, the previous file's end):
            # every entry of the file is at or past the cut.
            cuts.append((IndexCut(name, max(0, count - 1), None), None))
            continue
        if os.path.getsize(path) != expected:
            raise OfflineStoreError(
                f"index file {store.relative(path)} must be cut but its size does not match "
                f"maxHashSlotNum={store.config.max_hash_slot_num} and maxIndexNum="
                f"{store.config.max_index_num}: pass the broker's config with -c")
        with open(path, "rb") as f:
            # Entries are added in commitlog order: bisect for the first one past the cut.
            low, top = 1, max(1, count)
            while low < top:
                middle = (low + top) // 2
                if _index_entry_phys(f, entries_at, middle) >= offset:
                    top = middle
                else:
                    low = middle + 1
            end = None
            if low > 1:
                phys = _index_entry_phys(f, entries_at, low - 1)
                end = (phys, _store_timestamp(segments, phys))
        cuts.append((IndexCut(name, max(0, count - 1), low - 1), end))
    return cuts


def _index_entry_phys(f: BinaryIO, entries_at: int, entry: int) -> int:
    f.seek(entries_at + index_files.ENTRY_SIZE * entry)
    return index_files.ENTRY.unpack(f.read(index_files.ENTRY_SIZE))[1]


def _store_timestamp(segments: list[Segment], offset: int) -> int:
    for segment in segments:
        if segment.base_offset <= offset < segment.end_offset:
            at = offset - segment.base_offset
            head = segment.read(at, layout.store_timestamp_at(layout.SYSFLAG_BORNHOST_V6) + 8)
            return layout.read_store_timestamp(head)
    return 0


def _plan(store: StoreDir, offset: int
          ) -> tuple[TruncatePlan, int, int, list[tuple[IndexCut, tuple[int, int] | None]]]:
    files = segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else common_size(files)) or store.config.mapped_file_size_commit_log
    _usable, why, _gap = loadable_prefix(files, size)
    if why is not None:
        raise OfflineStoreError(f"the commitlog's files are not one log ({why}): the store "
                                "cannot open it, and it cannot be truncated")
    with mapped(files) as segments:
        boundary = _find_boundary(store, segments, offset)
        records_cut, log_end = _count_from(segments, boundary.index, offset, store.max_record)
        index_cuts = _plan_index_cuts(store, segments, offset)
    log_end = max(log_end, offset)
    deleted = tuple(f.name for f in files if f.base >= offset)
    containing = [f for f in files if f.base < offset < f.base + f.size]
    segment_cut = containing[0].name if containing else None
    queues = queue_dirs(store)
    file_size = queue_file_size(store, queues)
    queue_cuts = tuple(cut for queue in queues
                       if (cut := _plan_queue_cut(queue, file_size, offset)) is not None)
    checkpoint, present, _size = read_checkpoint(store)
    before = CheckpointSummary.of(checkpoint, present)
    kept_time = boundary.last_kept[1] if boundary.last_kept is not None else 0
    index_time = _newest_index_time(store, index_cuts)
    after = attrs.evolve(
        before,
        physic_msg_timestamp=min(before.physic_msg_timestamp, kept_time),
        logics_msg_timestamp=min(before.logics_msg_timestamp, kept_time),
        index_msg_timestamp=min(before.index_msg_timestamp, index_time),
        master_flushed_offset=min(before.master_flushed_offset, offset),
        confirm_phy_offset=min(before.confirm_phy_offset, offset),
    )
    plan = TruncatePlan(
        store.root, offset, log_end, log_end - offset, records_cut, deleted, segment_cut,
        queue_cuts, tuple(cut for cut, _end in index_cuts), before, after,
        os.path.exists(os.path.join(store.root, "abort")),
    )
    return plan, size, file_size, index_cuts


def _newest_index_time(store: StoreDir,
                       cuts: list[tuple[IndexCut, tuple[int, int] | None]]) -> int:
    """The end time of the newest index file left after the cuts (0: none is left)."""
    by_name = {cut.name: (cut, end) for cut, end in cuts}
    for path in reversed(index_paths(store)):
        name = os.path.basename(path)
        if name not in by_name:
            header = read_index_header(path)
            return header.end_timestamp if header is not None else 0
        cut, end = by_name[name]
        if cut.entries_after is None:
            continue
        if end is not None:
            return end[1]
        header = read_index_header(path)
        return header.begin_timestamp if header is not None else 0
    return 0


def truncate_store(store_dir: str, offset: int, *, config: StoreConfig | None = None,
                   dry_run: bool = False,
                   confirm: Callable[[TruncatePlan], bool] | None = None) -> TruncateOutcome:
    """Cut the store back to the commitlog offset ``offset``, a record boundary, so that
    its next start (a slave's) replicates from there. Holds the store's lock from the plan
    to the last write: StoreLockedError while a broker has it open. ``confirm`` sees the
    plan and may say no; ``dry_run`` only plans."""
    store = locate(store_dir, config)
    if offset < 0:
        raise OfflineStoreError(f"{offset} is not a commitlog offset")
    with store_lock(store.root, read_only_ok=False):
        plan, segment_size, file_size, index_cuts = _plan(store, offset)
        if dry_run or not plan.changes_anything or (confirm is not None and not confirm(plan)):
            return TruncateOutcome(plan, False)
        _apply(store, plan, segment_size, file_size, index_cuts)
        return TruncateOutcome(plan, True)


def _apply(store: StoreDir, plan: TruncatePlan, segment_size: int, file_size: int,
           index_cuts: list[tuple[IndexCut, tuple[int, int] | None]]) -> None:
    offset = plan.offset
    # 1. The index: were the commitlog cut first and this step lost, the index's end would
    #    lie past the log's and records written there later would never be indexed.
    for cut, end in index_cuts:
        path = os.path.join(store.index_dir, cut.name)
        if cut.entries_after is None:
            os.unlink(path)
        else:
            _cut_index_file(store, path, cut.entries_after + 1, end)
    # 2. Consume queues, with recovery's own cut (entries zeroed, emptied queues removed).
    for cut in plan.queue_cuts:
        queue = ConsumeQueue.open(store.queue_root, cut.topic, cut.queue_id, file_size)
        try:
            queue.recover()
            if queue.max_physical_offset > offset:
                queue.truncate_dirty(offset)
            emptied = queue.max_offset == queue.files.min_offset // CQ_ENTRY_SIZE
            if not emptied:
                for segment in queue.files.segments:
                    segment.sync_range(0, segment.size)
        finally:
            queue.close()
        if emptied:
            queue.destroy()  # its files are closed already; this removes the directory
    # 3. The checkpoint only claims what is left.
    checkpoint_path = os.path.join(store.root, "checkpoint")
    if plan.checkpoint_before.present and plan.checkpoint_after != plan.checkpoint_before:
        after = plan.checkpoint_after
        Checkpoint(checkpoint_path, after.physic_msg_timestamp, after.logics_msg_timestamp,
                   after.index_msg_timestamp, after.master_flushed_offset,
                   after.confirm_phy_offset).write()
    # 4. The commitlog, as recovery cuts a damaged tail: later segments deleted, the rest of
    #    the cut one zeroed (so no old record lines up with a new one), everything synced.
    commitlog = CommitLog.load(attrs.evolve(
        store.config, store_path_commit_log=store.commitlog_dir,
        mapped_file_size_commit_log=segment_size,
    ))
    try:
        # The later segments go newest first (a stop half-way leaves a shorter log, never
        # a gap); set_end would delete them too, but logs each as recovery's doing.
        segments = commitlog.segments.segments
        while segments and segments[-1].base_offset >= offset:
            segments.pop().destroy()
        commitlog.set_end(offset, zero_tail=True)
    finally:
        commitlog.close()


def _cut_index_file(store: StoreDir, path: str, keep_count: int,
                    end: tuple[int, int] | None) -> None:
    """Keep the entries below ``keep_count`` of an index file: slots that named a dropped
    entry name the newest kept one of their chain instead, the dropped entries are zeroed,
    the header ends at the last kept record (``end``: its offset and store time)."""
    slot_num = store.config.max_hash_slot_num
    entries_at = index_entries_at(store)
    fd = os.open(path, os.O_RDWR)
    try:
        header = index_files.IndexHeader(
            *index_files.HEADER.unpack(os.pread(fd, index_files.HEADER_SIZE, 0)))
        slots = array.array("i")
        slots.frombytes(os.pread(fd, 4 * slot_num, index_files.HEADER_SIZE))
        if sys.byteorder == "little":
            slots.byteswap()  # the file is big-endian
        for slot in [i for i, value in enumerate(slots) if value >= keep_count]:
            value = slots[slot]
            while value >= keep_count:
                raw = os.pread(fd, index_files.ENTRY_SIZE,
                               entries_at + index_files.ENTRY_SIZE * value)
                previous = index_files.ENTRY.unpack(raw)[3]
                value = previous if 0 < previous < value else 0
            slots[slot] = value
            os.pwrite(fd, index_files.SLOT.pack(value), index_files.HEADER_SIZE + 4 * slot)
        dropped = header.index_count - keep_count
        if dropped > 0:
            os.pwrite(fd, bytes(index_files.ENTRY_SIZE * dropped),
                      entries_at + index_files.ENTRY_SIZE * keep_count)
        end_phy, end_time = end if end is not None else (header.begin_phy_offset,
                                                          header.begin_timestamp)
        used = len(slots) - slots.count(0)
        os.pwrite(fd, index_files.HEADER.pack(header.begin_timestamp, end_time,
                                              header.begin_phy_offset, end_phy, used,
                                              keep_count), 0)
        os.fsync(fd)
    finally:
        os.close(fd)
