"""Segment: one fixed-size, memory-mapped file of a log (RocketMQ's MappedFile).

A segment is named by the log offset of its first byte as 20 zero-padded digits and always has
exactly its configured size; the log's bytes live at ``[base_offset, base_offset + size)``.
Appends are plain copies into the shared mapping (by the native encoder, on the event loop);
durability comes from ``msync`` of the written range in a worker thread — never
``mmap.flush()``, which holds the GIL for the whole sync.

A segment is shared by appenders, readers and the retention task. Readers ``hold()`` it; a
segment retired by retention is unmapped and unlinked only when its last holder lets go, so a
reader never sees its memory disappear.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os

import attrs

import trio_ha._backend as _backend

from .._backend import Handle
from .._errors import TrioHAError
from ..wire.layout import parse_segment_file_name, segment_file_name

log = logging.getLogger(__name__)

PAGE_SIZE = mmap.PAGESIZE
#: blocks of a sparse segment (a consume-queue file) are reserved this many bytes at a time
#: (3,276 entries), ahead of the writes that need them
RESERVE_STEP = 64 * 1024


class SegmentError(TrioHAError, OSError):
    """A segment file is missing, mis-sized or cannot be mapped."""


@attrs.define(eq=False)
class Segment:
    path: str
    base_offset: int
    size: int
    _fd: int
    _mmap: mmap.mmap
    #: the record engine's handle on the mapping
    handle: Handle
    #: bytes appended (readable end within the segment)
    wrote_position: int = 0
    #: bytes known to be on disk
    flushed_position: int = 0
    _holders: int = 0
    _retired: bool = False
    _closed: bool = False
    #: bytes from the start whose blocks are known to be reserved on disk: a store into the
    #: mapping below it cannot fault for lack of space (SIGBUS)
    _reserved: int = 0

    # ---- life cycle -------------------------------------------------------------------

    @classmethod
    def create(cls, directory: str, base_offset: int, size: int, *, warm: bool,
               reserve: bool = True, keep_fd: bool = True) -> Segment:
        """Create a zero-filled segment file (blocking: call from a worker thread).

        The file is sized under a temporary name and renamed, so a crash never leaves a
        mis-sized segment behind. With ``reserve`` its blocks are reserved at once
        (fallocate), so a full disk fails here rather than as SIGBUS on a later store into
        the mapping (commitlog segments); without, the file is sparse and ``reserve_to``
        reserves blocks ahead of each write, in RESERVE_STEP steps (consume-queue files: a
        queue with one message costs a step, not 6 MB). With ``warm`` every page is written
        once so appends on the event loop never take a first-touch fault. Without
        ``keep_fd`` the descriptor is closed once the file is mapped (the mapping stays):
        an open consume-queue file then costs one descriptor, the duplicate Python's mmap
        keeps (3.13's ``trackfd=False`` would drop that one too), instead of two.
        """
        path = os.path.join(directory, segment_file_name(base_offset))
        tmp = path + ".tmp"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.ftruncate(fd, size)
            if reserve:
                _backend.engine.fallocate(fd, 0, size)
            os.rename(tmp, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        segment = cls._map(path, base_offset, size, fd, keep_fd)
        segment._reserved = size if reserve else 0
        if warm:
            _backend.engine.warm(segment.handle, 0, size)
        return segment

    @classmethod
    def open(cls, path: str, size: int, *, keep_fd: bool = True) -> Segment:
        """Map an existing segment; its positions start at ``size`` until recovery sets them.
        Its blocks are not taken as reserved, even for a commitlog segment: RocketMQ makes
        its segments sparse (and a copy or a restore may too), so whoever writes into an
        opened segment reserves first (``reserve_to``: recovery does it for the commitlog's
        last segment; a no-op, and cheap, where the file already has its blocks)."""
        base = parse_segment_file_name(os.path.basename(path))
        if base is None:
            raise SegmentError(f"{path}: not a segment file name")
        fd = os.open(path, os.O_RDWR)
        actual = os.fstat(fd).st_size
        if actual != size:
            os.close(fd)
            raise SegmentError(
                f"{path}: size {actual} differs from the configured segment size {size}; "
                "a store must be opened with the segment size it was written with"
            )
        segment = cls._map(path, base, size, fd, keep_fd)
        segment.wrote_position = segment.flushed_position = size
        return segment

    @classmethod
    def _map(cls, path: str, base_offset: int, size: int, fd: int, keep_fd: bool) -> Segment:
        try:
            mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except OSError as exc:
            os.close(fd)
            raise SegmentError(exc.errno, f"{path}: cannot map: {exc.strerror}") from exc
        if not keep_fd:
            os.close(fd)
            fd = -1
        return cls(path, base_offset, size, fd, mm, _backend.engine.handle_for(mm))

    def close(self) -> None:
        """Unmap and close now. Callers make sure no reader or worker thread still uses it."""
        if self._closed:
            return
        self._closed = True
        _backend.engine.release_handle(self.handle)
        self.handle = None
        try:
            self._mmap.close()
        except BufferError:
            # A view of the mapping is still referenced (typically by the traceback of a
            # cancelled socket read into it); it is unmapped when that reference dies.
            log.debug("segment %s: mapping still referenced at close; left to the GC",
                      self.path)
        if self._fd >= 0:
            os.close(self._fd)

    def destroy(self) -> None:
        """Remove the file, now if nobody holds the segment, else when the last holder lets
        go."""
        self._retired = True
        if self._holders == 0:
            self._destroy_now()

    def _destroy_now(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        # DEBUG: the callers that matter to an operator (retention, truncation) say so at INFO
        log.debug("deleted segment %s", self.path)

    @contextlib.contextmanager
    def hold(self):
        """Keep the mapping alive while the body runs (retention waits for it)."""
        if self._closed:
            raise SegmentError(f"{self.path} was already deleted")
        self._holders += 1
        try:
            yield self
        finally:
            self._holders -= 1
            if self._retired and self._holders == 0:
                self._destroy_now()

    # ---- positions ----------------------------------------------------------------------

    @property
    def end_offset(self) -> int:
        return self.base_offset + self.size

    @property
    def wrote_offset(self) -> int:
        return self.base_offset + self.wrote_position

    @property
    def closed(self) -> bool:
        """Unmapped (closed or deleted): it can no longer be held or read."""
        return self._closed

    @property
    def is_full(self) -> bool:
        return self.wrote_position == self.size

    def view(self, start: int = 0, end: int | None = None) -> memoryview:
        """A zero-copy view of ``[start, end)`` within the segment; release it (or drop it)
        before the segment can close."""
        return memoryview(self._mmap)[start : self.size if end is None else end]

    def read(self, start: int, length: int) -> bytes:
        return self._mmap[start : start + length]

    def pread(self, start: int, length: int) -> bytes:
        """Bytes of the file through read(2), not the mapping: reading a hole of a sparse
        file through a shared mapping can fault a page in, and on tmpfs with no room left
        that fault is a SIGBUS; read(2) returns zeros. For recovery's look at consume-queue
        files, whose tails are holes."""
        if self._fd >= 0:
            return os.pread(self._fd, length, start)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def find(self, pattern: bytes, start: int, end: int | None = None) -> int:
        """The first position of ``pattern`` in ``[start, end)``, or -1 (C speed, no copy)."""
        return self._mmap.find(pattern, start, self.size if end is None else end)

    def write(self, position: int, data: bytes | bytearray | memoryview) -> None:
        self._mmap[position : position + len(data)] = data

    # ---- durability -----------------------------------------------------------------------

    def reserve_to(self, end: int) -> None:
        """Make sure the blocks of ``[0, end)`` are reserved on disk before a write there:
        fallocate up to ``end`` rounded up to RESERVE_STEP (through a descriptor opened for
        the call when the segment keeps none). ENOSPC or EMFILE is raised here, before
        anything is written, instead of a SIGBUS at the write."""
        if end <= self._reserved:
            return
        target = min(self.size, -(-end // RESERVE_STEP) * RESERVE_STEP)
        if self._fd >= 0:
            _backend.engine.fallocate(self._fd, self._reserved, target - self._reserved)
        else:
            fd = os.open(self.path, os.O_RDWR)
            try:
                _backend.engine.fallocate(fd, self._reserved, target - self._reserved)
            finally:
                os.close(fd)
        self._reserved = target

    def dirty_pages(self) -> int:
        return self.wrote_position // PAGE_SIZE - self.flushed_position // PAGE_SIZE

    def sync_range(self, start: int, end: int) -> None:
        """Make ``[start, end)`` durable. Blocking: runs in a worker thread."""
        if end <= start:
            return
        try:
            _backend.engine.msync(self.handle, start, end - start)
        except NotImplementedError:  # Python engine: no raw pointer
            if self._fd >= 0:
                os.fdatasync(self._fd)  # the whole file, without holding the GIL
            else:
                page = start - start % PAGE_SIZE
                self._mmap.flush(page, end - page)

    @property
    def fd(self) -> int:
        """The segment's descriptor (commitlog segments; consume-queue files keep none of
        their own)."""
        if self._fd < 0:
            raise SegmentError(f"{self.path} is mapped without a descriptor")
        return self._fd

    def mtime(self) -> float:
        return os.stat(self.path).st_mtime if self._fd < 0 else os.fstat(self._fd).st_mtime


def sync_ranges(work: list[tuple[Segment, int, int]]) -> None:
    """Make each ``(segment, start, end)`` range durable (blocking: a worker thread)."""
    for segment, start, end in work:
        segment.sync_range(start, end)
