"""SegmentQueue: the ordered segments of one log directory (RocketMQ's MappedFileQueue).

Used by the commitlog (1 GiB segments of records) and by each consume queue (6,000,000-byte
files of 20-byte entries). It knows file names, sizes and offsets — nothing of what the bytes
mean. Segments are contiguous: segment ``i + 1`` starts where segment ``i`` ends.
"""

from __future__ import annotations

import bisect
import logging
import os

import attrs

from ..wire.layout import parse_segment_file_name, segment_file_name
from .segment import Segment, SegmentError

log = logging.getLogger(__name__)


class SegmentGapError(SegmentError):
    """Segment files are missing between two that exist: the bytes in between are lost, and
    reading on would join records that never followed each other."""

    def __init__(self, directory: str, before: int, offset: int, after: int) -> None:
        self.directory = directory
        #: base of the file before the gap, where the gap starts, base of the file after it
        self.before, self.offset, self.after = before, offset, after
        super().__init__(
            f"{directory}: gap between segments at offset {offset}: "
            f"{segment_file_name(before)} ends there but the next file is "
            f"{segment_file_name(after)}; the files for [{offset}, {after}) are missing"
        )

    def __reduce__(self):
        return (type(self), (self.directory, self.before, self.offset, self.after))


@attrs.define(eq=False)
class SegmentQueue:
    directory: str
    segment_size: int
    segments: list[Segment] = attrs.field(factory=list[Segment])
    #: segments are created with their blocks reserved and keep their descriptor (the
    #: commitlog); False: sparse, blocks reserved ahead of writes, no descriptor of their
    #: own (consume queues; see Segment.create)
    reserved: bool = True

    @classmethod
    def load(cls, directory: str, segment_size: int, *, reserved: bool = True) -> SegmentQueue:
        """Map every segment file in ``directory`` (created if missing), oldest first.

        Leftover ``.tmp`` files of an interrupted pre-allocation are removed. A gap between
        segments is an error: the log would silently lose the bytes in it.
        """
        os.makedirs(directory, exist_ok=True)
        queue = cls(directory, segment_size, reserved=reserved)
        bases: list[int] = []
        for name in os.listdir(directory):
            if name.endswith(".tmp"):
                os.unlink(os.path.join(directory, name))
                continue
            base = parse_segment_file_name(name)
            if base is not None:
                bases.append(base)
        previous: int | None = None
        for base in sorted(bases):
            if base % segment_size:
                queue.close()
                raise SegmentError(
                    f"{directory}: segment {segment_file_name(base)} is not a multiple of the "
                    f"segment size {segment_size}"
                )
            if previous is not None and base != previous + segment_size:
                queue.close()
                raise SegmentGapError(directory, previous, previous + segment_size, base)
            previous = base
            path = os.path.join(directory, segment_file_name(base))
            try:
                queue.segments.append(Segment.open(path, segment_size, keep_fd=reserved))
            except BaseException:
                queue.close()
                raise
        return queue

    def close(self) -> None:
        for segment in self.segments:
            segment.close()
        self.segments.clear()

    # ---- lookups ---------------------------------------------------------------------------

    @property
    def first(self) -> Segment | None:
        return self.segments[0] if self.segments else None

    @property
    def last(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def min_offset(self) -> int:
        return self.segments[0].base_offset if self.segments else 0

    @property
    def max_offset(self) -> int:
        """One past the last appended byte."""
        return self.segments[-1].wrote_offset if self.segments else 0

    def find(self, offset: int) -> Segment | None:
        """The segment holding ``offset``, or None when it is outside the queue."""
        segments = self.segments
        if not segments or offset < segments[0].base_offset:
            return None
        index = (offset - segments[0].base_offset) // self.segment_size
        if index >= len(segments):
            return None
        segment = segments[index]
        if segment.base_offset <= offset < segment.end_offset:
            return segment
        # Contiguity is checked at load, but be robust against a future layout change.
        bases = [s.base_offset for s in segments]
        i = bisect.bisect_right(bases, offset) - 1
        return segments[i] if i >= 0 and offset < segments[i].end_offset else None

    def next_base(self, offset_hint: int = 0) -> int:
        """Where the next segment starts: after the last one, or at the segment containing
        ``offset_hint`` for an empty queue."""
        if self.segments:
            return self.segments[-1].end_offset
        return offset_hint - offset_hint % self.segment_size

    # ---- changes -----------------------------------------------------------------------------

    def append_segment(self, segment: Segment) -> None:
        if segment.size != self.segment_size:
            raise SegmentError(f"{segment.path}: wrong size {segment.size}")
        if self.segments and segment.base_offset != self.segments[-1].end_offset:
            raise SegmentError(
                f"{segment.path} does not follow {self.segments[-1].path}"
            )
        self.segments.append(segment)

    def create_segment(self, base_offset: int, *, warm: bool = False) -> Segment:
        """Create, map and append a segment synchronously (small files, or tests)."""
        segment = Segment.create(self.directory, base_offset, self.segment_size, warm=warm,
                                 reserve=self.reserved, keep_fd=self.reserved)
        segment.wrote_position = segment.flushed_position = 0
        self.append_segment(segment)
        return segment

    def truncate(self, offset: int) -> None:
        """Forget everything at or after ``offset``: later segments are deleted, the one
        containing it is cut (positions only; the caller zeroes bytes if it needs to)."""
        while self.segments and self.segments[-1].base_offset >= offset:
            segment = self.segments.pop()
            if segment.base_offset == offset and not any(segment.pread(0, 8)):
                # Nothing was ever written in it: the empty first segment of an empty store,
                # or a spare left by a crash. Removing it loses nothing (read(2), not the
                # mapping: the file may be sparse, and a hole read through it can SIGBUS).
                log.debug("recovery: removing empty segment %s at the log's end", segment.path)
            else:
                log.warning("recovery: deleting segment %s beyond offset %d", segment.path,
                            offset)
            segment.destroy()
        last = self.last
        if last is not None and offset < last.end_offset:
            position = offset - last.base_offset
            last.wrote_position = min(last.wrote_position, position)
            last.flushed_position = min(last.flushed_position, position)

    def retire_first(self) -> Segment:
        segment = self.segments.pop(0)
        segment.destroy()
        return segment
