"""ConsumeQueue: the per-(topic, queue) index into the commitlog.

Each entry is 20 bytes — commitlog offset (8), record size (4), tag hash (8) — and entry ``n``
is the message with queue offset ``n``, so a consumer at offset ``n`` finds its message with
one multiplication. Files hold 300,000 entries and are named by their first byte's position
(``consumequeue/<topic>/<queueId>/00000000000006000000``), byte for byte as RocketMQ lays them
out (docs/formats.md, 'Consume queue'). A file has its full size from the start but is sparse:
blocks are reserved 64 KiB at a time ahead of the entries (``Segment.reserve_to``), so a new
queue costs 64 KiB of disk, not 6 MB, and a full disk fails a reservation (an OSError the
dispatcher waits out) instead of a store into the mapping (SIGBUS).

Entries are written only by the dispatcher, from records already in the commitlog, and writing
one is idempotent: a record at or below the highest commitlog offset already indexed is
skipped. That is what lets recovery re-dispatch a range without caring what was there.
"""

from __future__ import annotations

import logging
import os
import re
import shutil

import attrs

from ..watermark import Watermark
from ..wire.layout import CQ_BLANK_ENTRY, CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from .segment import Segment
from .segments import SegmentGapError, SegmentQueue

log = logging.getLogger(__name__)


def _entry_valid(segment: Segment, index: int) -> bool:
    # read(2), not the mapping: past the entries a file may be a hole (see Segment.pread)
    offset, size, _tags = CQ_ENTRY.unpack(segment.pread(index * CQ_ENTRY_SIZE, CQ_ENTRY_SIZE))
    return offset >= 0 and size > 0


def valid_prefix(segment: Segment) -> int:
    """How many entries at the start of ``segment`` are valid (they form a prefix)."""
    low, high = 0, segment.size // CQ_ENTRY_SIZE
    while low < high:
        middle = (low + high) // 2
        if _entry_valid(segment, middle):
            low = middle + 1
        else:
            high = middle
    return low


@attrs.frozen
class QueueEntry:
    commitlog_offset: int
    size: int
    tags_code: int


@attrs.define(eq=False)
class ConsumeQueue:
    topic: str
    queue_id: int
    files: SegmentQueue
    #: queue offset of the first entry still present (retention moves it up)
    min_logic_offset: int = 0
    #: commitlog end (offset + size) of the last entry; writes at or below it are repeats
    max_physical_offset: int = 0
    #: rises with max_offset: long-polled pulls wait on it for the next message
    arrivals: Watermark = attrs.field(factory=Watermark)
    #: why this queue does not agree with the commitlog (a file zeroed or lost, entries at
    #: the wrong positions), when something showed it; recovery rebuilds such a queue from
    #: the commitlog (recovery.rebuild_disagreeing_queues)
    disagreement: str | None = None
    #: store timestamp of the oldest record whose entry may not be on disk yet (0: every
    #: entry is); the checkpoint's logicsMsgTimestamp stays below it
    unflushed_since: int = 0
    #: entries crash recovery found differing from their records and rewrote (``mend_run``),
    #: and what the first of them was, for recovery's one line about this queue
    mended: int = 0
    first_mended: str = ""

    @classmethod
    def open(cls, root: str, topic: str, queue_id: int, file_size: int) -> ConsumeQueue:
        directory = os.path.join(root, topic, str(queue_id))
        try:
            return cls(topic, queue_id, SegmentQueue.load(directory, file_size, reserved=False))
        except SegmentGapError as exc:
            # A consume queue is derived data: with a file missing, what remains cannot be
            # trusted to say where its entries belong. Start it empty and let recovery
            # rebuild it from the commitlog (the files go now, so none is reused by name).
            log.warning("%s; the consume queue is rebuilt from the commitlog", exc)
            shutil.rmtree(directory, ignore_errors=True)
            queue = cls(topic, queue_id, SegmentQueue.load(directory, file_size, reserved=False))
            queue.disagreement = f"a file is missing: {exc}"
            return queue

    def close(self) -> None:
        self.files.close()

    def destroy(self) -> None:
        directory = self.files.directory
        self.files.close()
        shutil.rmtree(directory, ignore_errors=True)

    # ---- offsets ----------------------------------------------------------------------------

    @property
    def max_offset(self) -> int:
        """Queue offset the next entry gets (= number of entries ever written)."""
        return self.files.max_offset // CQ_ENTRY_SIZE

    @property
    def min_offset(self) -> int:
        return max(self.min_logic_offset, self.files.min_offset // CQ_ENTRY_SIZE)

    # ---- writes ------------------------------------------------------------------------------

    def put(self, commitlog_offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """Index one record. Returns False when the entry was a repeat and was skipped."""
        if commitlog_offset + size <= self.max_physical_offset:
            return False
        position = queue_offset * CQ_ENTRY_SIZE
        current = self.files.max_offset
        if not self.files.segments:
            # A queue that starts past 0 (its early files were deleted, or this is a slave
            # that began mid-log): begin at the file holding the entry, blank-filled up to it.
            first = self.files.create_segment(self.files.next_base(position))
            current = first.base_offset
            if position > current:
                try:
                    self._write_blanks(current, position)
                except OSError:
                    # No room for the filler (ENOSPC, EMFILE): leave no file behind, so the
                    # retry starts this queue afresh rather than finding a gap.
                    self.files.segments.remove(first)
                    first.destroy()
                    raise
                current = position
            self.min_logic_offset = queue_offset
        if position < current:
            # A record the queue has not indexed (it lies past max_physical_offset) claims
            # a queue offset the queue already gave to another record: the queue's entries
            # are not this commitlog's. Keep what is there; recovery rebuilds the queue.
            self._disagrees(
                f"the record at commitlog offset {commitlog_offset} has queue offset "
                f"{queue_offset}, which already holds an entry"
            )
            return False
        if position > current:
            # Entries are missing (a zeroed or lost file). RocketMQ appends the entry at the
            # current end, which serves this record under another record's queue offset and
            # makes the next put reuse one; the entry goes to its own position instead, the
            # gap reads as removed, and recovery rebuilds the queue from the commitlog.
            self._disagrees(
                f"the record at commitlog offset {commitlog_offset} has queue offset "
                f"{queue_offset}, but the queue holds {current // CQ_ENTRY_SIZE} entries"
            )
            self._write_blanks(current, position)
        segment = self._writable_segment(position)
        at = position - segment.base_offset
        segment.reserve_to(at + CQ_ENTRY_SIZE)
        segment.write(at, CQ_ENTRY.pack(commitlog_offset, size, tags_code))
        segment.wrote_position = at + CQ_ENTRY_SIZE
        self.max_physical_offset = commitlog_offset + size
        self.arrivals.raise_to(self.max_offset)
        return True

    def put_run(self, entries: bytes | memoryview, first_queue_offset: int, first_end: int,
                last_end: int) -> None:
        """Index a run of records that follow each other in this queue: ``entries`` holds
        their 20-byte entries, ``first_end``/``last_end`` the commitlog end of the first and
        last record. The common case (the run continues the queue) is one write per file;
        anything unusual (a repeat, a gap, an empty queue) goes through ``put`` entry by
        entry, with its rules."""
        if last_end <= self.max_physical_offset:
            return  # all of it is indexed already
        position = first_queue_offset * CQ_ENTRY_SIZE
        if (
            first_end <= self.max_physical_offset
            or not self.files.segments
            or position != self.files.max_offset
        ):
            for i, (offset, size, tags) in enumerate(CQ_ENTRY.iter_unpack(entries)):
                self.put(offset, size, tags, first_queue_offset + i)
            return
        # Room first, for the whole run (a file may roll in the middle): a write is never
        # half done because the disk or the descriptors ran out (OSError, before any entry).
        total = len(entries)
        chunks: list[tuple[Segment, int, int, int]] = []
        done = 0
        while done < total:
            segment = self._writable_segment(position + done)
            at = position + done - segment.base_offset
            n = min(total - done, segment.size - at)
            segment.reserve_to(at + n)
            chunks.append((segment, at, done, n))
            done += n
        for segment, at, done, n in chunks:
            segment.write(at, entries[done : done + n])
            segment.wrote_position = at + n
        self.max_physical_offset = last_end
        self.arrivals.raise_to(self.max_offset)

    def mend_run(self, entries: bytes | memoryview, first_queue_offset: int) -> int:
        """Crash recovery's re-dispatch: rewrite the entries of a run that the queue already
        holds but that differ from ``entries`` (what the records say). Returns how many.

        Repeats are otherwise skipped by commitlog offset, unread. But an entry is copied
        into the mapping by plain stores, and a SIGKILL between two of them leaves its first
        bytes (commitlog offset and size, which is all ``recover`` can judge an entry by)
        with the rest still zero: the tags code reads 0 and a consumer's tag filter drops
        the message. Every record carries its queue offset, so the record decides what its
        slot must hold, as in a rebuild; only slots already written are looked at (the rest
        is ``put_run``'s)."""
        start = first_queue_offset * CQ_ENTRY_SIZE
        end = min(start + len(entries), self.files.max_offset)
        position = max(start, self.files.min_offset)
        mended = 0
        while position < end:
            segment = self.files.find(position)
            if segment is None:
                break
            at = position - segment.base_offset
            n = min(end - position, segment.wrote_position - at)
            if n <= 0:
                break
            wanted = bytes(entries[position - start : position - start + n])
            held = segment.read(at, n)
            if held != wanted:
                for i in range(0, n, CQ_ENTRY_SIZE):
                    entry = wanted[i : i + CQ_ENTRY_SIZE]
                    if held[i : i + CQ_ENTRY_SIZE] == entry:
                        continue
                    if not self.first_mended:
                        self.first_mended = (
                            f"queue offset {(position + i) // CQ_ENTRY_SIZE} held "
                            f"{CQ_ENTRY.unpack(held[i : i + CQ_ENTRY_SIZE])}, its record says "
                            f"{CQ_ENTRY.unpack(entry)}"
                        )
                    segment.write(at + i, entry)
                    segment.flushed_position = min(segment.flushed_position, at + i)
                    mended += 1
            position += n
        if mended:
            self.mended += mended
            # the newest entry may have been one of them (a torn size or offset)
            self.max_physical_offset = self._last_real_physical_end()
        return mended

    def _disagrees(self, reason: str) -> None:
        if self.disagreement is None:
            self.disagreement = reason
            log.error("consume queue %s disagrees with the commitlog: %s", self.files.directory,
                      reason)

    def _write_blanks(self, start: int, end: int) -> None:
        while start < end:
            segment = self._writable_segment(start)
            at = start - segment.base_offset
            n = min(end - start, segment.size - at) // CQ_ENTRY_SIZE
            segment.reserve_to(at + n * CQ_ENTRY_SIZE)
            segment.write(at, CQ_BLANK_ENTRY * n)
            segment.wrote_position = at + n * CQ_ENTRY_SIZE
            start += n * CQ_ENTRY_SIZE

    def _writable_segment(self, position: int) -> Segment:
        last = self.files.last
        if last is None or position >= last.end_offset:
            last = self.files.create_segment(self.files.next_base(position))
        return last

    # ---- reads ---------------------------------------------------------------------------------

    def entries(self, queue_offset: int, max_count: int) -> list[QueueEntry]:
        """Up to ``max_count`` entries from ``queue_offset``, not crossing a file."""
        return [QueueEntry(*fields)
                for fields in CQ_ENTRY.iter_unpack(self.entry_bytes(queue_offset, max_count))]

    def entry_bytes(self, queue_offset: int, max_count: int) -> bytes:
        """The same entries as they are stored (20 bytes each)."""
        position = queue_offset * CQ_ENTRY_SIZE
        segment = self.files.find(position)
        if segment is None:
            return b""
        start = position - segment.base_offset
        end = min(segment.wrote_position, start + max_count * CQ_ENTRY_SIZE)
        if end <= start:
            return b""
        return segment.read(start, end - start)

    def entry(self, queue_offset: int) -> QueueEntry | None:
        found = self.entries(queue_offset, 1)
        return found[0] if found else None

    # ---- recovery and retention -----------------------------------------------------------------

    def recover(self) -> None:
        """Find the last valid entry and cut the queue right after it.

        RocketMQ scans entry by entry from the third-to-last file; entries are only ever
        appended, so a file is a run of valid entries followed by zeros (a torn entry at the
        boundary is invalid too), and a bisection finds the boundary without touching the
        300,000 entries of a full file one by one in Python.

        What cannot be the result of appends is noted in ``disagreement`` (recovery then
        rebuilds the queue from the commitlog): a file before the last three whose first or
        last entry is invalid, a file that is not the last with invalid entries, a queue
        whose files hold no valid entry at all."""
        segments = self.files.segments
        if not segments:
            return
        index = max(0, len(segments) - 3)
        for segment in segments[:index]:
            last = segment.size // CQ_ENTRY_SIZE - 1
            if not (_entry_valid(segment, 0) and _entry_valid(segment, last)):
                self._disagrees(f"file {os.path.basename(segment.path)} is not full of entries "
                                "although later files exist")
                break
        end = segments[index].base_offset
        for segment in segments[index:]:
            valid = valid_prefix(segment)
            end = segment.base_offset + valid * CQ_ENTRY_SIZE
            if valid * CQ_ENTRY_SIZE < segment.size:
                if segment is not segments[-1]:
                    self._disagrees(
                        f"file {os.path.basename(segment.path)} holds {valid} entries, but "
                        "later files exist"
                    )
                # Past the prefix there are zeros, or one torn entry: clear that slot only
                # (zeroing to the end of a 6 MB file on every open would dirty all of it).
                at = valid * CQ_ENTRY_SIZE
                if segment.pread(at, CQ_ENTRY_SIZE) != bytes(CQ_ENTRY_SIZE):
                    segment.write(at, bytes(CQ_ENTRY_SIZE))
                segment.wrote_position = segment.flushed_position = at
                break
        self._cut(end)
        if self.files.max_offset <= self.files.min_offset:
            self._disagrees("its files hold no valid entry")
        self.max_physical_offset = self._last_real_physical_end()
        self.arrivals.reset(self.max_offset)

    def points_into(self, start: int, end: int) -> bool:
        """Whether an entry points at a commitlog offset in ``[start, end)``. Entries are in
        commitlog order, so this reads backwards from the newest only as far as ``start``."""
        if self.max_physical_offset <= start:
            return False
        for segment in reversed(self.files.segments):
            raw = segment.read(0, segment.wrote_position)
            for at in range(len(raw) - CQ_ENTRY_SIZE, -1, -CQ_ENTRY_SIZE):
                offset, size, _tags = CQ_ENTRY.unpack_from(raw, at)
                if size == CQ_BLANK_SIZE:
                    continue
                if offset < start:
                    return False
                if offset < end:
                    return True
        return False

    def _last_real_physical_end(self) -> int:
        """Commitlog end of the newest entry that is not a blank filler."""
        for segment in reversed(self.files.segments):
            for at in range(segment.wrote_position - CQ_ENTRY_SIZE, -1, -CQ_ENTRY_SIZE):
                offset, size, _tags = CQ_ENTRY.unpack(segment.read(at, CQ_ENTRY_SIZE))
                if size != CQ_BLANK_SIZE:
                    return offset + size
        return 0

    def _cut(self, position: int) -> None:
        for segment in list(self.files.segments):
            if segment.base_offset >= position and segment is not self.files.first:
                self.files.segments.remove(segment)
                segment.destroy()
        last = self.files.last
        if last is not None:
            at = max(0, min(position - last.base_offset, last.size))
            if at < last.wrote_position:
                last.write(at, bytes(last.wrote_position - at))
            last.wrote_position = at
            last.flushed_position = min(last.flushed_position, at)

    def truncate_dirty(self, commitlog_offset: int) -> None:
        """Drop every entry that points at or past ``commitlog_offset`` (the commitlog was cut
        there by recovery), zeroing the dropped bytes so they never come back."""
        cut = None
        for segment in reversed(self.files.segments):
            raw = segment.read(0, segment.wrote_position)
            keep = 0
            for i, (offset, size, _tags) in enumerate(CQ_ENTRY.iter_unpack(raw)):
                if size != CQ_BLANK_SIZE and offset >= commitlog_offset:
                    break
                keep = i + 1
            cut = segment.base_offset + keep * CQ_ENTRY_SIZE
            if keep:
                break
        if cut is not None:
            self._cut(cut)
        self.max_physical_offset = self._last_real_physical_end()
        self.arrivals.reset(self.max_offset)

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete whole files whose last entry points below the commitlog's first byte.
        Returns the number of files deleted. The newest file is always kept."""
        deleted = 0
        while len(self.files.segments) > 1:
            first = self.files.segments[0]
            raw = first.read(first.size - CQ_ENTRY_SIZE, CQ_ENTRY_SIZE)
            offset, size, _ = CQ_ENTRY.unpack(raw)
            if offset + size > commitlog_min_offset:
                break
            self.files.retire_first()
            deleted += 1
        self.correct_min_offset(commitlog_min_offset)
        return deleted

    def correct_min_offset(self, commitlog_min_offset: int) -> None:
        """Move min_logic_offset to the first entry whose record still exists."""
        first = self.files.first
        if first is None:
            return
        raw = first.read(0, first.wrote_position)
        for i, (offset, size, _tags) in enumerate(CQ_ENTRY.iter_unpack(raw)):
            if size != CQ_BLANK_SIZE and offset >= commitlog_min_offset:
                self.min_logic_offset = (first.base_offset + i * CQ_ENTRY_SIZE) // CQ_ENTRY_SIZE
                return
        self.min_logic_offset = self.max_offset

    # ---- durability ------------------------------------------------------------------------------

    def dirty_segments(self, least_pages: int) -> list[tuple[Segment, int, int]]:
        out: list[tuple[Segment, int, int]] = []
        for segment in self.files.segments:
            if segment.flushed_position >= segment.wrote_position:
                continue
            if least_pages and segment.dirty_pages() < least_pages and not segment.is_full:
                continue
            out.append((segment, segment.flushed_position, segment.wrote_position))
        return out


_VALID_TOPIC = re.compile(r"^[%|a-zA-Z0-9_-]{1,127}$")


def is_valid_topic(topic: str) -> bool:
    """RocketMQ's topic charset. It is also what keeps a topic from naming a path outside
    ``consumequeue/`` — replicated records are checked too, not only client puts."""
    return bool(_VALID_TOPIC.match(topic))


@attrs.define(eq=False)
class ConsumeQueueTable:
    """All consume queues of a store, opened lazily, keyed by (topic, queue id)."""

    root: str
    file_size: int
    queues: dict[tuple[str, int], ConsumeQueue] = attrs.field(
        factory=dict[tuple[str, int], ConsumeQueue])
    #: arrival watermarks handed out for queues that do not exist yet (a long poll on a
    #: topic before its first message); the queue adopts its mark when it is created
    _future_arrivals: dict[tuple[str, int], Watermark] = attrs.field(
        factory=dict[tuple[str, int], Watermark])

    @classmethod
    def load(cls, root: str, file_size: int) -> ConsumeQueueTable:
        table = cls(root, file_size)
        os.makedirs(root, exist_ok=True)
        for topic in sorted(os.listdir(root)):
            topic_dir = os.path.join(root, topic)
            if not os.path.isdir(topic_dir) or not is_valid_topic(topic):
                continue
            for name in sorted(os.listdir(topic_dir)):
                if name.isdigit():
                    queue_id = int(name)
                    table.queues[(topic, queue_id)] = ConsumeQueue.open(
                        root, topic, queue_id, file_size
                    )
        return table

    def close(self) -> None:
        for queue in self.queues.values():
            queue.close()

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self.queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        key = (topic, queue_id)
        queue = self.queues.get(key)
        if queue is None:
            queue = self.queues[key] = ConsumeQueue.open(self.root, topic, queue_id, self.file_size)
            mark = self._future_arrivals.pop(key, None)
            if mark is not None:
                queue.arrivals = mark
        return queue

    def arrivals(self, topic: str, queue_id: int) -> Watermark:
        """The watermark that rises with this queue's max offset, even before it exists."""
        queue = self.queues.get((topic, queue_id))
        if queue is not None:
            return queue.arrivals
        if len(self._future_arrivals) > 65536:
            self._future_arrivals.clear()  # bound it; waiters on dropped marks time out
        return self._future_arrivals.setdefault((topic, queue_id), Watermark())

    def remove(self, queue: ConsumeQueue) -> None:
        """Delete a queue's files and forget it."""
        self.queues.pop((queue.topic, queue.queue_id), None)
        queue.destroy()

    def replace_empty(self, queue: ConsumeQueue) -> ConsumeQueue:
        """Delete a queue's files and put an empty queue in its place (the same arrival
        watermark: long polls on it stay attached). Recovery rebuilds it from the
        commitlog."""
        queue.destroy()
        fresh = ConsumeQueue.open(self.root, queue.topic, queue.queue_id, self.file_size)
        fresh.arrivals = queue.arrivals
        self.queues[(queue.topic, queue.queue_id)] = fresh
        return fresh

    def __iter__(self):
        return iter(self.queues.values())

    def max_physical_offset(self) -> int:
        return max((q.max_physical_offset for q in self.queues.values()), default=0)

    def destroy_all(self) -> None:
        for queue in self.queues.values():
            queue.destroy()
        self.queues.clear()
