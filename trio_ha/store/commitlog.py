"""CommitLog: every message of every topic, appended to one log of segments.

Appending runs on the event loop, through one path (``append``) for single messages and
batches alike: a put takes its queue offset and store timestamp, encodes its record(s)
straight into the active segment's mapping (native encoder) and moves the ``written``
watermark, with no await in between — so appends are atomic with respect to each other
without RocketMQ's put lock, and queue offsets and store timestamps rise with the offset.
The next queue offset of every queue lives here for that reason (RocketMQ's CommitLog keeps
its topicQueueTable too).

What is slow lives in other threads, behind awaits that happen *outside* that critical
section: creating and warming the next segment, in a worker thread (the allocator keeps one
spare ready, so an append normally just switches to it), and msync for flushing, on the sync
thread (``sync_thread``: a native thread that never takes the interpreter's lock). A put that
finds the active segment full while the spare is still being prepared waits for it, bounded
by ``allocate_timeout`` (CREATE_MAPEDFILE_FAILED after that, as RocketMQ's 5 s wait).

Flushing is one coroutine, ``flush()``, used by the async flush service (every 500 ms when at
least 4 pages are dirty, everything every 10 s) and by group commit (SYNC_FLUSH: flush whatever
is written, then again; every put that arrived during one msync is made durable by the next;
see ``group_commit``). The ``flushed`` watermark says how far the log is durable.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import attrs
import trio

import trio_ha._backend as _backend

from .._errors import TrioHAError
from ..config import BrokerRole, StoreConfig
from ..ratelog import RateLimitedLog
from ..watermark import Watermark
from ..wire import record as rec
from ..wire.layout import INT64_MAX
from .health import RETRY_INTERVAL, StoreResourceError, describe
from .results import PutMessageResult, PutMessageStatus
from .segment import Segment
from .segments import SegmentQueue
from .sync_thread import SyncThread

log = logging.getLogger(__name__)


class SegmentUnavailable(TrioHAError):
    """The next commitlog segment cannot be had now (a put gets CREATE_MAPEDFILE_FAILED)."""


class AllocationTimeout(SegmentUnavailable):
    """The next segment was not ready within allocate_timeout."""


class AllocationFailed(SegmentUnavailable):
    """The allocator's last attempt to create the next segment failed (ENOSPC, EMFILE...);
    it tries again every RETRY_INTERVAL."""


class ReplicaOffsetError(TrioHAError):
    """Replicated bytes do not fit this log where they claim to go."""


class ReplicaStartError(ReplicaOffsetError):
    """An empty slave log was asked to start where no log can: off a segment boundary, or
    where its first segment would end beyond the largest 64-bit offset."""


#: One message as ``append`` takes it: topic (encoded), body, properties (encoded), queue id,
#: flag, sys flag, born timestamp (None: the store timestamp), born host (encoded),
#: reconsume times, prepared transaction offset. A plain tuple: it is built on every put.
MessageItem = tuple[bytes, bytes, bytes, int, int, int, int | None, bytes, int, int]
#: A SEND_BATCH_MESSAGE body as ``append`` takes it: the body, topic (encoded), batch
#: properties, queue id, sys flag, born timestamp (None: the store timestamp), born host
#: (encoded), the largest body an item may have.
BatchItem = tuple[bytes, bytes, bytes, int, int, int | None, bytes, int]
Item = TypeVar("Item", MessageItem, BatchItem)
#: Encodes an item into ``segment`` at ``position`` with the given queue offset, store
#: timestamp and store host: (new position or a negative ERR_* code, commitlog offsets of
#: the records written).
Encoder = Callable[[Segment, int, int, int, bytes, Item], tuple[int, tuple[int, ...]]]


def encode_message(segment: Segment, position: int, queue_offset: int, store_timestamp: int,
                   store_host: bytes, item: MessageItem) -> tuple[int, tuple[int, ...]]:
    """The Encoder of one message (a MessageItem)."""
    (topic, body, properties, queue_id, flag, sys_flag, born_timestamp, born_host,
     reconsume_times, prepared_offset) = item
    new_position = _backend.engine.encode_record(
        segment.handle, segment.size, position, segment.base_offset, topic, body, properties,
        queue_id, flag, queue_offset, sys_flag,
        store_timestamp if born_timestamp is None else born_timestamp, born_host,
        store_timestamp, store_host, reconsume_times, prepared_offset,
    )
    return new_position, (segment.base_offset + position,)


def encode_batch(segment: Segment, position: int, queue_offset: int, store_timestamp: int,
                 store_host: bytes, item: BatchItem) -> tuple[int, tuple[int, ...]]:
    """The Encoder of a batch (a BatchItem): every item becomes a record of its own."""
    (body, topic, batch_properties, queue_id, sys_flag, born_timestamp, born_host,
     max_body_size) = item
    new_position, offsets = _backend.engine.encode_batch(
        segment.handle, segment.size, position, segment.base_offset, body, topic,
        batch_properties, queue_id, queue_offset, sys_flag,
        store_timestamp if born_timestamp is None else born_timestamp, born_host,
        store_timestamp, store_host, max_body_size,
    )
    return new_position, tuple(offsets)


@attrs.define(eq=False)
class CommitLog:
    config: StoreConfig
    segments: SegmentQueue
    #: one past the last appended byte (readable end of the log)
    written: Watermark
    #: everything below is on disk
    flushed: Watermark
    #: store timestamp of the last appended record
    last_store_timestamp: int = 0
    #: store timestamp of the last record known flushed (checkpoint physicMsgTimestamp)
    flushed_store_timestamp: int = 0
    #: how many flushes synced something (group commit shows as far fewer than puts)
    flush_count: int = 0
    #: the queue offset the next message of each (topic, queue id) gets; the store fills it
    #: from the consume queues after recovery
    queue_offsets: dict[tuple[str, int], int] = attrs.field(factory=dict[tuple[str, int], int])
    _spare: Segment | None = None
    _spare_ready: trio.Event = attrs.field(factory=trio.Event)
    _spare_wanted: trio.Event = attrs.field(factory=trio.Event)
    #: set when an allocation attempt ends, success or failure (puts waiting for the spare
    #: look again)
    _attempted: trio.Event = attrs.field(factory=trio.Event)
    #: why the allocator's last attempt failed (None: it did not), and how many failed
    allocation_error: str | None = None
    allocation_failures: int = 0
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    _flush_lock: trio.Lock = attrs.field(factory=trio.Lock)
    #: what runs the flushes' msyncs, started at the first flush (``sync_thread``)
    _sync_thread: SyncThread | None = None
    _store_host: bytes = b""

    @classmethod
    def load(cls, config: StoreConfig) -> CommitLog:
        segments = SegmentQueue.load(config.commitlog_dir, config.mapped_file_size_commit_log)
        commitlog = cls(config, segments, Watermark(), Watermark())
        commitlog._store_host = rec.encode_host(*rec.parse_host_port(config.store_host))
        return commitlog

    def close(self) -> None:
        if self._sync_thread is not None:
            self._sync_thread.close()
            self._sync_thread = None
        if self._spare is not None:
            # Nothing was written to it: remove it so the directory holds only real data.
            self._spare.destroy()
            self._spare = None
        self.segments.close()

    @property
    def segment_size(self) -> int:
        return self.segments.segment_size

    @property
    def store_host(self) -> bytes:
        return self._store_host

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    @property
    def flush_lock(self) -> trio.Lock:
        """Held by every flush: whoever holds it knows no msync is under way and that the
        ``flushed`` mark does not move (a live truncation holds it)."""
        return self._flush_lock

    @property
    def max_offset(self) -> int:
        return self.written.value

    def set_end(self, offset: int, *, zero_tail: bool) -> None:
        """After recovery (blocking): the log ends at ``offset``; everything below it is
        synced to disk before anyone is told it is flushed.

        With ``zero_tail`` the rest of the last segment is zeroed and synced too. Recovery
        asks for it when the log ended in a torn or corrupt record: RocketMQ leaves those
        bytes, and a later crash can then line a new record up with an old one behind it
        that scans as valid. A clean end (zeros) needs no zeroing.

        The last segment, which appends go on into, gets its blocks reserved first: it may
        be sparse (RocketMQ wrote it, or a copy made it so), and a store into a hole that the
        filesystem cannot back is SIGBUS. No room for them is StoreResourceError: the store
        does not open until there is (free some and open it again)."""
        self.segments.truncate(offset)
        last = self.segments.last
        if last is not None:
            try:
                last.reserve_to(last.size)
            except OSError as exc:
                raise StoreResourceError(
                    f"cannot reserve the blocks of the last commitlog segment {last.path}, "
                    f"which appends go on into: {describe(exc)}"
                ) from exc
        if last is not None and zero_tail and offset >= last.base_offset:
            tail = offset - last.base_offset
            if tail < last.size:
                _backend.engine.zero(last.handle, tail, last.size - tail)
                last.sync_range(tail, last.size)
        # What survived a crash may be in the page cache only: make it durable now.
        for segment in self.segments.segments[-2:]:
            segment.sync_range(0, min(segment.wrote_position, max(0, offset - segment.base_offset)))
        self.written.reset(offset)
        self.flushed.reset(offset)

    # ---- segments ---------------------------------------------------------------------------

    def _next_base(self) -> int:
        return self.segments.next_base(self.written.value)

    def _take_spare(self) -> Segment | None:
        spare = self._spare
        if spare is None or spare.base_offset != self._next_base():
            return None
        self._spare = None
        self._spare_ready = trio.Event()
        spare.wrote_position = spare.flushed_position = 0
        self.segments.append_segment(spare)
        self._spare_wanted.set()
        return spare

    def writable_segment(self) -> Segment | None:
        """The segment the next append goes to, or None while the spare is not ready."""
        last = self.segments.last
        if last is not None and not last.is_full:
            return last
        return self._take_spare()

    async def wait_for_segment(self) -> None:
        """Wait for the allocator's spare: AllocationFailed at once while its attempts fail
        (it keeps trying on its own), AllocationTimeout after allocate_timeout."""
        self._spare_wanted.set()
        if self.allocation_error is not None:
            await trio.lowlevel.checkpoint()
            raise AllocationFailed(
                f"the next commitlog segment cannot be created: {self.allocation_error}"
            )
        with trio.move_on_after(self.config.allocate_timeout / 1000):
            await trio.lowlevel.checkpoint()  # a checkpoint even when the spare is there
            while not self._spare_ready.is_set():
                await self._attempted.wait()
                if self.allocation_error is not None and not self._spare_ready.is_set():
                    raise AllocationFailed(
                        f"the next commitlog segment cannot be created: {self.allocation_error}"
                    )
            return
        raise AllocationTimeout(
            f"next commitlog segment not ready after {self.config.allocate_timeout} ms"
        )

    def create_first_segment(self, base_offset: int) -> Segment:
        """Blocking (worker thread): the segment at ``base_offset`` of an empty log."""
        # A slave's segments are filled by replication, which writes every page anyway:
        # warming them first would write each page twice.
        warm = (
            self.config.warm_mapped_file_enable
            and self.config.broker_role is not BrokerRole.SLAVE
        )
        segment = Segment.create(self.segments.directory, base_offset, self.segment_size, warm=warm)
        segment.wrote_position = segment.flushed_position = 0
        return segment

    async def run_allocator(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Keep one spare segment ready after the last (RocketMQ's AllocateMappedFileService)."""
        task_status.started()
        while True:
            base = self._next_base()
            spare = self._spare
            if spare is not None and spare.base_offset != base:
                spare.destroy()  # the log was truncated or restarted elsewhere
                self._spare = spare = None
                self._spare_ready = trio.Event()
            if spare is None:
                try:
                    created = await trio.to_thread.run_sync(
                        self.create_first_segment, base, abandon_on_cancel=False
                    )
                except OSError as exc:
                    # A full disk or no descriptors left: say so, let puts that need the
                    # segment fail at once, and try again (never end the store for it).
                    self.allocation_failures += 1
                    self.allocation_error = describe(exc)
                    self._log.log(logging.ERROR, "allocate",
                                  "cannot create commitlog segment %d: %s; puts that need it "
                                  "get CREATE_MAPEDFILE_FAILED until it can be created",
                                  base, self.allocation_error)
                    self._attempt_ended()
                    await trio.sleep(RETRY_INTERVAL)
                    continue
                if self.allocation_error is not None:
                    log.warning("commitlog segment %d created after %d failed attempts (%s)",
                                base, self.allocation_failures, self.allocation_error)
                    self.allocation_error = None
                    self._log.ended("allocate")
                if base != self._next_base():
                    created.destroy()
                    self._attempt_ended()
                    continue
                self._spare = created
                self._spare_ready.set()
                self._attempt_ended()
            self._spare_wanted = trio.Event()
            await self._spare_wanted.wait()

    def _attempt_ended(self) -> None:
        self._attempted.set()
        self._attempted = trio.Event()

    def end_segment(self, segment: Segment) -> None:
        """Fill the rest of ``segment`` with the blank record: the next append rolls over."""
        remaining = segment.size - segment.wrote_position
        if remaining >= rec.END_FILE_MIN_BLANK_LENGTH:
            segment.write(segment.wrote_position, rec.encode_blank(remaining))
        segment.wrote_position = segment.size
        self.written.raise_to(segment.end_offset)

    def next_store_timestamp(self) -> int:
        """Wall-clock ms, never below the previous record's: store time rises with offset."""
        now = time.time_ns() // 1_000_000
        if now < self.last_store_timestamp:
            now = self.last_store_timestamp
        return now

    def record_appended(self, segment: Segment, new_position: int, store_timestamp: int) -> None:
        segment.wrote_position = new_position
        self.last_store_timestamp = store_timestamp
        self.written.raise_to(segment.base_offset + new_position)

    # ---- appends ----------------------------------------------------------------------------

    async def append(
        self, encode: Encoder[Item], item: Item, queue: tuple[str, int] | None
    ) -> PutMessageResult | int:
        """Append one put — ``encode`` writes ``item``'s record(s) — at the end of the log,
        with the next queue offset of ``queue`` (None: the record takes no queue offset, as
        a transaction's half or rollback record). Returns the PUT_OK result, or the
        encoder's negative ERR_* code when the item cannot be encoded.

        The only await is for the next segment, when the last one is full (AllocationTimeout
        after allocate_timeout); a cancelled wait there means nothing was appended. The
        append itself is ``append_now``: atomic."""
        while (appended := self.append_now(encode, item, queue)) is None:
            await self.wait_for_segment()
        return appended

    def append_now(
        self, encode: Encoder[Item], item: Item, queue: tuple[str, int] | None
    ) -> PutMessageResult | int | None:
        """``append`` without waiting: None, with nothing of this put appended, when the
        last segment is full and the next is not ready yet. A put that does not fit the rest
        of a segment ends it with a blank record (so the segment may be closed even when
        this returns None) and goes, whole, to the next (RocketMQ's END_OF_FILE)."""
        store_host = self._store_host
        while True:
            segment = self.segments.segments[-1]
            if segment.wrote_position == segment.size:
                next_segment = self.writable_segment()
                if next_segment is None:
                    return None
                segment = next_segment
            position = segment.wrote_position
            queue_offset = self.queue_offsets.get(queue, 0) if queue is not None else 0
            store_timestamp = self.next_store_timestamp()
            new_position, record_offsets = encode(
                segment, position, queue_offset, store_timestamp, store_host, item
            )
            if new_position >= 0:
                break
            if new_position == _backend.ERR_NO_SPACE and position > 0:
                self.end_segment(segment)
                continue
            return new_position
        self.record_appended(segment, new_position, store_timestamp)
        if queue is not None:
            self.queue_offsets[queue] = queue_offset + len(record_offsets)
        return PutMessageResult(
            PutMessageStatus.PUT_OK, segment.base_offset + position, new_position - position,
            queue_offset, record_offsets, store_timestamp, "", store_host,
        )

    # ---- replication (the slave side) -------------------------------------------------------

    async def replica_segment(self, offset: int) -> Segment:
        """The segment that takes replicated bytes at ``offset``, which must be this log's
        end; a new segment is made when the last one is full (or the log is empty and the
        master starts it at a segment boundary, as masters do)."""
        last = self.segments.last
        if last is not None and offset != self.max_offset:
            raise ReplicaOffsetError(
                f"replicated bytes for offset {offset}, but this log ends at {self.max_offset}"
            )
        if last is not None and offset < last.end_offset:
            return last
        if offset % self.segment_size:
            raise (ReplicaOffsetError if last is not None else ReplicaStartError)(
                f"a new segment must start at a multiple of the segment size "
                f"{self.segment_size}; the master sent offset {offset} (do both sides use the "
                "same mappedFileSizeCommitLog?)"
            )
        if last is None:
            # An empty slave log begins where its master starts it, if a log can: its first
            # segment must end at a 64-bit offset (a master never sends one that does not;
            # a rogue one could, and the log could then never grow).
            if offset > INT64_MAX - self.segment_size:
                raise ReplicaStartError(
                    f"the master would start this log at offset {offset}, where a segment of "
                    f"{self.segment_size} bytes ends beyond the largest 64-bit offset"
                )
            self.written.reset(offset)
            self.flushed.reset(offset)
        # Segments come from the allocator here too: one creator per file name.
        while (segment := self._take_spare()) is None:
            try:
                await self.wait_for_segment()
            except SegmentUnavailable as exc:
                raise ReplicaOffsetError(str(exc)) from None
        return segment

    def replica_appended(self, segment: Segment, n: int) -> None:
        """``n`` replicated bytes were written at the segment's end."""
        if segment.wrote_position + n > segment.size:
            raise ReplicaOffsetError(
                f"replicated bytes run past the end of segment {segment.base_offset} "
                "(do master and slave use the same mappedFileSizeCommitLog?)"
            )
        segment.wrote_position += n
        self.written.raise_to(segment.base_offset + segment.wrote_position)

    async def append_replica(self, offset: int, data: bytes | bytearray | memoryview) -> int:
        """Write replicated ``data`` at ``offset`` (the log's end); returns the new end."""
        segment = await self.replica_segment(offset)
        position = segment.wrote_position
        if position + len(data) > segment.size:
            raise ReplicaOffsetError(
                f"replicated bytes at {offset} run past the end of segment "
                f"{segment.base_offset} (do master and slave use the same "
                "mappedFileSizeCommitLog?)"
            )
        segment.write(position, data)
        self.replica_appended(segment, len(data))
        return self.max_offset

    # ---- reads -----------------------------------------------------------------------------------

    def scan_range(self, scanner: _backend.Scanner, start: int, end: int, flags: int,
                   max_record: int) -> Iterator[tuple[Segment, _backend.ScanResult]]:
        """The records in ``[start, end)`` (below the log's min offset: from there), batch by
        batch, each with the segment it is in: what recovery's queue rebuild and the index's
        catch-up walk. Stops at a partial or damaged record. Synchronous; a result is only
        valid until the next one."""
        segments = self.segments
        offset = max(start, segments.min_offset)
        while offset < end:
            segment = segments.find(offset)
            if segment is None:
                return
            limit = min(segment.wrote_position, end - segment.base_offset)
            result = scanner.scan(segment.handle, limit, offset - segment.base_offset,
                                  segment.base_offset, flags, max_record)
            yield segment, result
            offset = segment.base_offset + result.end
            if result.stop == _backend.STOP_BLANK or (
                result.stop == _backend.STOP_END and offset == segment.end_offset
            ):
                offset = segment.end_offset
            elif result.stop != _backend.STOP_FULL:
                return

    def read(self, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of the log (within one segment, below the end)."""
        segment = self.segments.find(offset)
        if segment is None or offset + length > segment.wrote_offset:
            raise IndexError(f"commitlog range {offset}+{length} is not readable")
        return segment.read(offset - segment.base_offset, length)

    def read_available(self, offset: int, max_length: int) -> bytes:
        """Up to ``max_length`` bytes from ``offset`` to the end of its segment's data."""
        segment = self.segments.find(offset)
        if segment is None:
            return b""
        start = offset - segment.base_offset
        end = min(segment.wrote_position, start + max_length)
        return segment.read(start, end - start) if end > start else b""

    # ---- flushing -------------------------------------------------------------------------------

    def dirty_pages(self) -> int:
        return math.ceil(max(0, self.written.value - self.flushed.value) / 4096)

    async def flush(self, least_pages: int = 0) -> int:
        """Make everything written so far durable (or nothing, if fewer than ``least_pages``
        pages are dirty and the active segment is not full). Returns the flushed offset."""
        async with self._flush_lock:
            start = self.flushed.value
            target = self.written.value
            if target <= start:
                return start
            if least_pages and self.dirty_pages() < least_pages:
                last = self.segments.last
                if last is None or not last.is_full:
                    return start
            store_timestamp = self.last_store_timestamp
            work: list[tuple[Segment, int, int]] = []
            offset = start
            while offset < target:
                segment = self.segments.find(offset)
                if segment is None:
                    break
                end = min(segment.wrote_offset, target)
                work.append((segment, offset - segment.base_offset, end - segment.base_offset))
                offset = end
                if end < segment.end_offset:
                    break
            if self._sync_thread is None:
                self._sync_thread = SyncThread.start()
            with contextlib.ExitStack() as holds:
                for segment, _, _ in work:
                    holds.enter_context(segment.hold())
                await self._sync_thread.sync(work)
            for segment, _, end in work:
                segment.flushed_position = max(segment.flushed_position, end)
            self.flushed_store_timestamp = store_timestamp
            self.flush_count += 1
            self.flushed.raise_to(offset)
            return offset

    async def run_async_flush(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """ASYNC_FLUSH: every flushIntervalCommitLog, flush if enough pages are dirty; a full
        flush at least every flushCommitLogThoroughInterval."""
        config = self.config
        task_status.started()
        last_thorough = trio.current_time()
        while True:
            await trio.sleep(config.flush_interval_commit_log / 1000)
            now = trio.current_time()
            least = config.flush_commit_log_least_pages
            if now - last_thorough >= config.flush_commit_log_thorough_interval / 1000:
                least = 0
                last_thorough = now
            await self.flush(least)
