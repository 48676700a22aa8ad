"""``inspect_store``: what a store directory holds, as the store would report it.

The segments and where the records of the last one stop, each consume queue's readable range,
the index files' headers, the checkpoint, the broker's config files, whether the last stop was
clean and whether a broker holds the lock. The ranges are the store's: the log ends where
recovery would end it (a full last segment at its end, its blank included), a queue starts at
its first entry whose record the commitlog still holds.

It reads without the lock, so it works on an open store too, with the tail as it was a moment
ago: that is how a master is checked before its diverged slave is cut (docs/ha-protocol.md).
It maps every file read-only and changes nothing.
"""

from __future__ import annotations

import os

import attrs

import trio_ha._backend as _backend

from ...config import StoreConfig
from ...wire.layout import CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from ..consume_queue import valid_prefix
from ..lock import StoreLock, StoreLockedError
from ..segment import Segment
from ._directory import (
    SCAN_BATCH,
    CheckpointSummary,
    QueueDir,
    common_size,
    index_paths,
    loadable_prefix,
    locate,
    mapped,
    queue_dirs,
    queue_file_size,
    read_checkpoint,
    read_index_header,
    segment_files,
)

__all__ = [
    "IndexFileSummary", "QueueSummary", "SegmentSummary", "StoreInventory", "inspect_store",
]


@attrs.frozen
class SegmentSummary:
    name: str
    base_offset: int
    size: int
    #: commitlog offset where its data ends: the end of the file for every segment but the
    #: last (the writer moved on only when it was full); for the last, where its records
    #: stop — its blank record when it is full — which is where the next open ends the log
    written_end: int
    #: "full", "active" (the last, with room) or "empty"
    state: str


@attrs.frozen
class QueueSummary:
    topic: str
    queue_id: int
    files: int
    #: the queue offsets a consumer can read: [min_offset, max_offset)
    min_offset: int
    max_offset: int

    @property
    def entries(self) -> int:
        return self.max_offset - self.min_offset


@attrs.frozen
class IndexFileSummary:
    name: str
    entries: int
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int


@attrs.frozen
class StoreInventory:
    root: str
    commitlog_dir: str
    segment_size: int | None
    segments: tuple[SegmentSummary, ...]
    #: the commitlog's readable range, as the store would report it
    min_offset: int
    max_offset: int
    checkpoint: CheckpointSummary
    queues: tuple[QueueSummary, ...]
    index_files: tuple[IndexFileSummary, ...]
    #: the broker's metadata files under config/
    config_files: tuple[str, ...]
    #: the last stop was not clean (the next open runs crash recovery)
    abort_present: bool
    #: "held" (a broker has the store open), "free", or "unknown" (the lock cannot be tried)
    lock: str


def _lock_state(root: str) -> str:
    """Whether a broker holds the store's lock, found by trying it as the store does (a
    lock file that does not exist is held by nobody; it is not created here)."""
    if not os.path.exists(os.path.join(root, "lock")):
        return "free"
    try:
        lock = StoreLock.acquire(root)
    except StoreLockedError:
        return "held"
    except OSError:
        return "unknown"
    lock.release()
    return "free"


def _records_end(segment: Segment, max_record: int) -> tuple[int, bool]:
    """Where the records of ``segment`` stop (a header walk, no CRC), and whether the
    segment is full (it ends in a blank record, or records fill it exactly)."""
    scanner = _backend.engine.scanner(SCAN_BATCH)
    position = 0
    while True:
        result = scanner.scan(segment.handle, segment.size, position, segment.base_offset, 0,
                              max_record)
        position = result.end
        if result.stop != _backend.STOP_FULL:
            break
    full = result.stop == _backend.STOP_BLANK or (
        result.stop == _backend.STOP_END and position == segment.size)
    return position, full


def _queue_summary(queue: QueueDir, file_size: int, commitlog_min: int) -> QueueSummary | None:
    files = segment_files(queue.directory)
    usable, _why, _gap = loadable_prefix(files, file_size)
    if not usable:
        return None
    with mapped(files[:usable]) as segments:
        last = segments[-1]
        max_offset = (last.base_offset + valid_prefix(last) * CQ_ENTRY_SIZE) // CQ_ENTRY_SIZE
        first = segments[0]
        # The store's min offset: the first entry that is no filler and whose record the
        # commitlog still holds (ConsumeQueue.correct_min_offset).
        min_offset = max_offset
        raw = first.pread(0, valid_prefix(first) * CQ_ENTRY_SIZE)
        for i, (phys, size, _tags) in enumerate(CQ_ENTRY.iter_unpack(raw)):
            if size != CQ_BLANK_SIZE and phys >= commitlog_min:
                min_offset = first.base_offset // CQ_ENTRY_SIZE + i
                break
    return QueueSummary(queue.topic, queue.queue_id, usable, min(min_offset, max_offset),
                        max_offset)


def inspect_store(store_dir: str, *, config: StoreConfig | None = None) -> StoreInventory:
    """What a store directory holds, read without the lock (so it works on an open store
    too, with the tail as it was a moment ago) and without changing anything."""
    store = locate(store_dir, config)
    files = segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else common_size(files))
    summaries: list[SegmentSummary] = []
    min_offset = max_offset = 0
    if files and size is not None:
        usable, _why, _gap = loadable_prefix(files, size)
        for f in files[:usable]:
            summaries.append(SegmentSummary(f.name, f.base, f.size, f.base + f.size, "full"))
        if usable:
            with mapped(files[usable - 1 : usable]) as (last,):
                position, full = _records_end(last, store.max_record)
            state = "full" if full else ("empty" if position == 0 else "active")
            # (a full segment's log ends at its end, its blank included, as recovery says)
            end = last.base_offset + (last.size if full else position)
            summaries[-1] = attrs.evolve(summaries[-1], written_end=end, state=state)
            min_offset, max_offset = files[0].base, end
    checkpoint, present, _size = read_checkpoint(store)
    queues = queue_dirs(store)
    file_size = queue_file_size(store, queues)
    queue_summaries = tuple(
        summary for queue in queues
        if (summary := _queue_summary(queue, file_size, min_offset)) is not None
    )
    index: list[IndexFileSummary] = []
    for path in index_paths(store):
        header = read_index_header(path)
        if header is not None:
            index.append(IndexFileSummary(
                os.path.basename(path), max(0, header.index_count - 1), header.begin_timestamp,
                header.end_timestamp, header.begin_phy_offset, header.end_phy_offset))
    config_dir = os.path.join(store.root, "config")
    config_files: tuple[str, ...] = ()
    if os.path.isdir(config_dir):
        config_files = tuple(sorted(n for n in os.listdir(config_dir)
                                    if os.path.isfile(os.path.join(config_dir, n))))
    return StoreInventory(
        store.root, store.commitlog_dir, size, tuple(summaries), min_offset, max_offset,
        CheckpointSummary.of(checkpoint, present), queue_summaries, tuple(index),
        config_files, os.path.exists(os.path.join(store.root, "abort")),
        _lock_state(store.root),
    )
