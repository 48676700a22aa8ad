"""Store directories seen as files: segments, the confirmed end, consume queues, boundaries.

Nothing here imports Spark or trio. The driver uses it to plan partitions and streaming
offsets; executors use it (through ``trio_ha.spark.batches``) to read. Files are opened
read-only and never locked, so a live store — a running master or slave — can be read while
it writes.

Terms:

* a *store directory* is a RocketMQ ``storePathRootDir`` (it holds ``commitlog/`` and usually
  ``consumequeue/``), ours or a real 4.9 broker's; a bare commitlog directory also works;
* a *segment* is one commitlog file, named by the commitlog offset of its first byte;
* a *boundary* is a commitlog offset where a record starts (or a segment starts);
* the *confirmed end* is the end of the last whole, valid record on disk (see
  :func:`confirmed_end`): nothing at or past it is ever emitted.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import _backend
from .._errors import TrioHAError
from ..wire import layout

__all__ = [
    "StoreError", "CorruptRecordError", "Segment", "StoreDir", "MappedSegment",
    "TailState", "confirmed_end", "DEFAULT_MAX_RECORD", "CQ_DTYPE", "queue_files",
    "read_queue_file", "read_queue_offsets", "queue_entry_count", "dispatch_end", "advance",
    "INFO_DTYPE", "infos_to_numpy", "iter_scan",
]

#: the largest record accepted: RocketMQ's default maxMessageSize (4 MiB of body) plus the
#: 64 KiB its encoder reserves for the rest, plus slack for long properties
DEFAULT_MAX_RECORD = layout.DEFAULT_MAX_MESSAGE_SIZE + 128 * 1024

_MAGICS = (layout.MAGIC_V1, layout.MAGIC_V2)
#: where a record's PHYSICALOFFSET field lies, relative to the record
_PHYS_FIELD = slice(layout.PHYSICALOFFSET_AT, layout.PHYSICALOFFSET_AT + layout.INT64.size)


def _numpy_dtype(entry: struct.Struct, names: Sequence[str]) -> np.dtype:
    """A numpy structured dtype with the fields of a big-endian struct, packed as it is."""
    widths = {"b": 1, "h": 2, "i": 4, "q": 8}
    fmt = entry.format
    if fmt[0] != ">" or len(fmt) - 1 != len(names) or not set(fmt[1:]) <= set(widths):
        raise ValueError(f"no numpy twin for struct format {fmt!r}")
    dtype = np.dtype([(name, f">i{widths[code]}") for name, code in zip(names, fmt[1:],
                                                                         strict=True)])
    assert dtype.itemsize == entry.size
    return dtype


#: a consume-queue entry: commitlog offset, size, tags code (wire/layout.py's CQ_ENTRY)
CQ_DTYPE = _numpy_dtype(layout.CQ_ENTRY, ("offset", "size", "tags"))


class StoreError(TrioHAError, OSError):
    """A store directory is missing, unreadable, or changed under the reader."""


class CorruptRecordError(TrioHAError, ValueError):
    """A record inside the confirmed range is invalid; the message names the offset."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


@dataclass(frozen=True)
class Segment:
    path: str
    base: int  # commitlog offset of the first byte
    size: int  # file size

    @property
    def end(self) -> int:
        return self.base + self.size


class StoreDir:
    """One store directory. Listings are read afresh on every call (the store may roll,
    retention may delete)."""

    def __init__(self, path: str) -> None:
        path = os.path.abspath(os.path.expanduser(str(path)))
        self.path = path
        if os.path.isdir(os.path.join(path, "commitlog")):
            self.commitlog_dir = os.path.join(path, "commitlog")
            root = path
        elif os.path.isdir(path) and any(
            layout.parse_segment_file_name(n) is not None for n in os.listdir(path)
        ):
            self.commitlog_dir = path  # a bare commitlog directory
            root = os.path.dirname(path)
        else:
            raise StoreError(f"{path}: not a store directory (no commitlog/ in it)")
        cq = os.path.join(root, "consumequeue")
        self.consumequeue_dir = cq if os.path.isdir(cq) else None

    def __repr__(self) -> str:
        return f"StoreDir({self.path!r})"

    def segments(self) -> list[Segment]:
        out: list[Segment] = []
        try:
            names = os.listdir(self.commitlog_dir)
        except OSError as exc:
            raise StoreError(f"{self.commitlog_dir}: {exc.strerror}") from exc
        for name in names:
            base = layout.parse_segment_file_name(name)
            if base is None:
                continue
            path = os.path.join(self.commitlog_dir, name)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:  # deleted by retention just now
                continue
            if size > 0:
                out.append(Segment(path, base, size))
        out.sort(key=lambda s: s.base)
        return out

    def queues(self) -> list[tuple[str, int, str]]:
        """(topic, queue id, directory) of every consume queue."""
        if self.consumequeue_dir is None:
            return []
        out: list[tuple[str, int, str]] = []
        for topic in sorted(os.listdir(self.consumequeue_dir)):
            tdir = os.path.join(self.consumequeue_dir, topic)
            if not os.path.isdir(tdir):
                continue
            for qid in os.listdir(tdir):
                if qid.lstrip("-").isdigit() and os.path.isdir(os.path.join(tdir, qid)):
                    out.append((topic, int(qid), os.path.join(tdir, qid)))
        return out


# ---- reading segments --------------------------------------------------------------------


def info_dtype() -> np.dtype:
    """A numpy structured dtype laid out exactly like the C th_record_info."""
    engine = _backend.engine
    fields = [
        ("phys_offset", "i8"), ("queue_offset", "i8"), ("born_timestamp", "i8"),
        ("store_timestamp", "i8"), ("prepared_tx_offset", "i8"), ("tags_code", "i8"),
        ("size", "i4"), ("queue_id", "i4"), ("flag", "i4"), ("sys_flag", "i4"),
        ("body_crc", "i4"), ("reconsume_times", "i4"), ("born_host_pos", "u4"),
        ("store_host_pos", "u4"), ("body_pos", "u4"), ("body_len", "u4"), ("topic_pos", "u4"),
        ("props_pos", "u4"), ("topic_len", "u2"), ("props_len", "u2"), ("born_host_len", "u1"),
        ("store_host_len", "u1"), ("version", "u1"), ("crc_ok", "u1"),
    ]
    names = [n for n, _ in fields]
    formats = ["=" + f for _, f in fields]
    if isinstance(engine, _backend.NativeEngine):
        ffi = engine.ffi
        offsets = [ffi.offsetof("th_record_info", n) for n in names]
        itemsize = ffi.sizeof("th_record_info")
        return np.dtype({"names": names, "formats": formats, "offsets": offsets,
                         "itemsize": itemsize})
    return np.dtype(list(zip(names, formats, strict=True)))


INFO_DTYPE = info_dtype()
_INFO_FIELDS: tuple[str, ...] = INFO_DTYPE.names or ()


def infos_to_numpy(infos: Sequence[_backend.RecordInfo], count: int) -> np.ndarray:
    """The first ``count`` scanned records as a structured array (a copy: the scanner reuses
    its output buffer)."""
    if count == 0:
        return np.empty(0, INFO_DTYPE)
    engine = _backend.engine
    if isinstance(engine, _backend.NativeEngine):
        raw = engine.ffi.buffer(infos, count * INFO_DTYPE.itemsize)
        return np.frombuffer(raw, INFO_DTYPE, count).copy()
    out = np.empty(count, INFO_DTYPE)
    for i in range(count):  # the pure-Python engine only: no compiler on this machine
        info = infos[i]
        out[i] = tuple(getattr(info, n) for n in _INFO_FIELDS)
    return out


_NO_BYTES = np.empty(0, np.uint8)


class MappedSegment:
    """A segment mapped read-only, with the record engine's handle on it."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        try:
            fd = os.open(segment.path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise StoreError(
                f"{segment.path}: segment disappeared (deleted by retention?)"
            ) from exc
        try:
            size = os.fstat(fd).st_size
            self.size = min(size, segment.size)
            self.mm = mmap.mmap(fd, self.size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        try:
            self.mm.madvise(mmap.MADV_SEQUENTIAL)
        except (AttributeError, OSError):
            pass
        self.handle: _backend.Handle = _backend.engine.handle_for(self.mm)
        self.array: np.ndarray = np.frombuffer(self.mm, np.uint8)

    def close(self) -> None:
        # The handle and array are dropped, not released: Arrow buffers made from the array
        # may outlive this object, and the mapping stays alive as long as they do.
        self.handle = None
        self.array = _NO_BYTES
        try:
            self.mm.close()
        except BufferError:  # an Arrow buffer still views it; the mapping goes with it
            pass

    def __enter__(self) -> MappedSegment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def base(self) -> int:
        return self.segment.base

    def header(self, pos: int) -> tuple[int, int] | None:
        """(TOTALSIZE, MAGIC) at ``pos``, or None past the end."""
        if pos + layout.RECORD_START.size > self.size:
            return None
        return layout.RECORD_START.unpack_from(self.mm, pos)

    def is_record_start(self, pos: int) -> bool:
        """Whether a record plausibly starts at ``pos``: a message magic and the stored
        PHYSICALOFFSET equal to this offset (a blank record counts too)."""
        head = self.header(pos)
        if head is None:
            return False
        _size, magic = head
        if magic == layout.BLANK_MAGIC:
            return True
        if magic not in _MAGICS or pos + _PHYS_FIELD.stop > self.size:
            return False
        return layout.INT64.unpack_from(self.mm, pos + _PHYS_FIELD.start)[0] == self.base + pos

    def stored_phys(self, positions: np.ndarray) -> np.ndarray:
        """The PHYSICALOFFSET field of the records at ``positions`` (vectorised)."""
        idx = positions.astype(np.int64)[:, None] + np.arange(_PHYS_FIELD.start, _PHYS_FIELD.stop)
        return self.array[idx].view(">i8").reshape(-1).astype(np.int64)

    def record_at(
        self, pos: int, limit: int, max_record: int, flags: int = 0
    ) -> tuple[Any | None, _backend.ScanResult]:
        """Scan one record at ``pos``: (structured row or None, ScanResult)."""
        scanner = _backend.engine.scanner(1)
        res = scanner.scan(self.handle, limit, pos, self.base, flags, max_record)
        if res.count:
            return infos_to_numpy(res.infos, 1)[0], res
        return None, res


def iter_scan(
    mseg: MappedSegment, pos: int, limit: int, *, flags: int, max_record: int,
    capacity: int = 65536,
) -> Iterator[tuple[np.ndarray, _backend.ScanResult]]:
    """Yield (structured infos, ScanResult) from ``pos`` until the scanner stops for a reason
    other than a full output buffer."""
    scanner = _backend.engine.scanner(capacity)
    while True:
        res = scanner.scan(mseg.handle, limit, pos, mseg.base, flags, max_record)
        yield infos_to_numpy(res.infos, res.count), res
        if res.stop != _backend.STOP_FULL:
            return
        pos = res.end


# ---- the confirmed end -------------------------------------------------------------------


@dataclass(frozen=True)
class TailState:
    """Where the whole, valid records of a store end, and what the last one looked like (so
    a later call can continue from here instead of rescanning)."""

    end: int  # commitlog offset just past the last whole valid record
    segment_base: int  # the segment holding ``end`` (or whose blank ends at it)
    last_offset: int  # commitlog offset of the last record (-1 when none)
    last_size: int
    last_crc: int
    first: int  # first offset still present (first segment's base)


def _has_data(mseg: MappedSegment) -> bool:
    return mseg.is_record_start(0)


def _scan_tail(
    mseg: MappedSegment, pos: int, max_record: int, check_crc: bool
) -> tuple[int, bool, Any | None]:
    """Scan a segment from ``pos`` (a boundary) to where its valid records end. Returns
    (end position, full: whether a blank record closes the segment, last record row)."""
    flags = _backend.SCAN_CHECK_CRC if check_crc else 0
    scanner = _backend.engine.scanner(65536)
    last = None
    while True:
        res = scanner.scan(mseg.handle, mseg.size, pos, mseg.base, flags, max_record)
        if res.count:
            arr = infos_to_numpy(res.infos, res.count)
            # A recycled or stale file can hold old records past the write position: a
            # record only counts if its stored PHYSICALOFFSET is its own offset.
            rel = arr["phys_offset"] - mseg.base
            bad = np.nonzero(mseg.stored_phys(rel) != arr["phys_offset"])[0]
            if len(bad):
                k = int(bad[0])
                if k:
                    last = arr[k - 1]
                return int(rel[k]), False, last
            last = arr[-1]
        if res.stop == _backend.STOP_FULL:
            pos = res.end
            continue
        if res.stop == _backend.STOP_BLANK:
            return mseg.size, True, last
        if res.stop == _backend.STOP_BAD_CRC:
            # A whole record whose body does not match its CRC. If a valid record (or the
            # blank) follows, it is corruption inside the log: confirmed, and reported by the
            # reader. If nothing follows, it is a record still being written (a torn tail).
            nxt = res.end + res.size
            if nxt < mseg.size and mseg.is_record_start(nxt):
                row, _ = mseg.record_at(res.end, mseg.size, max_record, 0)
                last = row
                pos = nxt
                continue
            return res.end, False, last
        return res.end, False, last  # END, PARTIAL, BAD_MAGIC (zeros), BAD_SIZE


def confirmed_end(store: StoreDir, *, max_record: int = DEFAULT_MAX_RECORD,
                  previous: TailState | None = None, check_crc: bool = True) -> TailState:
    """The end of the last whole, valid record of ``store``.

    Without a running broker to ask, this is read from the files: the tail segment (the
    last one holding data) is scanned with the native scanner (with CRC) and the end of the
    last whole record whose stored PHYSICALOFFSET matches its position is the end. A partial
    record at the tail — one a live store is still writing — is never included, and neither
    is a last record whose body CRC does not match (a torn write). On a slave every byte on
    disk came from the master, so this is the replicated end; on a live master it
    approximates the flushed end by what is on disk and whole (the page cache included).

    ``previous`` (from an earlier call) lets the scan continue from where it ended, after
    checking that its last record is still there unchanged; otherwise the tail segment is
    scanned from its start."""
    segments = store.segments()
    if not segments:
        return TailState(0, 0, -1, 0, 0, 0)
    first = segments[0].base
    start_index, start_pos, last = None, 0, None
    if previous is not None and previous.end >= first:
        for i, seg in enumerate(segments):
            if seg.base == previous.segment_base:
                if previous.last_offset >= 0 and not _still_there(segments, previous, max_record):
                    break
                start_index, start_pos = i, previous.end - seg.base
                break
    if start_index is None:
        # The tail segment: the last one whose first record is valid. Later files are
        # preallocated (empty) segments.
        start_index = 0
        for i in range(len(segments) - 1, -1, -1):
            with MappedSegment(segments[i]) as mseg:
                if _has_data(mseg):
                    start_index = i
                    break
        start_pos = 0
    result_last = None
    if previous is not None and start_pos:
        result_last = (previous.last_offset, previous.last_size, previous.last_crc)
    i, pos = start_index, start_pos
    while True:
        seg = segments[i]
        with MappedSegment(seg) as mseg:
            if pos >= mseg.size:
                end, full, last = mseg.size, True, None
            else:
                end, full, last = _scan_tail(mseg, pos, max_record, check_crc)
        if last is not None:
            result_last = (int(last["phys_offset"]), int(last["size"]), int(last["body_crc"]))
        if full and i + 1 < len(segments) and segments[i + 1].base == seg.end:
            with MappedSegment(segments[i + 1]) as nxt:
                if _has_data(nxt):
                    i, pos = i + 1, 0
                    continue
        lo, ls, lc = result_last if result_last else (-1, 0, 0)
        return TailState(seg.base + end, seg.base, lo, ls, lc, first)


def _still_there(segments: list[Segment], previous: TailState, max_record: int) -> bool:
    """Whether the last record an earlier scan saw is still at its offset, unchanged (a
    master that lost its tail, or a slave that was truncated, fails this)."""
    for seg in segments:
        if seg.base <= previous.last_offset < seg.end:
            with MappedSegment(seg) as mseg:
                row, _ = mseg.record_at(previous.last_offset - seg.base, mseg.size, max_record)
                return (row is not None and int(row["size"]) == previous.last_size
                        and int(row["body_crc"]) == previous.last_crc
                        and mseg.is_record_start(previous.last_offset - seg.base))
    return False


# ---- consume queues ----------------------------------------------------------------------


def queue_files(directory: str) -> list[tuple[int, str]]:
    """(first entry's byte offset in the queue, path) of one consume queue's files, in order."""
    out: list[tuple[int, str]] = []
    for name in os.listdir(directory):
        base = layout.parse_segment_file_name(name)
        if base is not None:
            out.append((base, os.path.join(directory, name)))
    out.sort()
    return out


def read_queue_file(path: str) -> np.ndarray:
    """The valid entries of one consume-queue file (CQ_DTYPE), in file order: without the
    blank fillers at the head of a queue that starts past 0 and the zeroed, not yet written
    tail of a preallocated file."""
    raw = np.fromfile(path, dtype=CQ_DTYPE)
    sizes = raw["size"]
    return raw[(raw["offset"] >= 0) & (sizes > 0) & (sizes != layout.CQ_BLANK_SIZE)]


def read_queue_offsets(directory: str, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """Commitlog offsets of the valid entries of one consume queue that fall in [lo, hi),
    sorted (a queue is dispatched in commitlog order). Files wholly outside are skipped."""
    parts: list[np.ndarray] = []
    for _, path in queue_files(directory):
        try:
            entries = read_queue_file(path)
        except OSError:
            continue
        offsets = entries["offset"].astype(np.int64)
        if not len(offsets):
            continue
        if hi is not None and offsets[0] >= hi:
            break
        if offsets[-1] < lo:
            continue
        parts.append(offsets[(offsets >= lo) & ((offsets < hi) if hi is not None else True)])
    if not parts:
        return np.empty(0, np.int64)
    return np.concatenate(parts)


def queue_entry_count(directory: str) -> int:
    """A cheap size estimate of a queue: bytes of its files / the entry size."""
    total = 0
    for _, path in queue_files(directory):
        try:
            total += os.stat(path).st_size
        except OSError:
            pass
    return total // layout.CQ_ENTRY_SIZE


def dispatch_end(store: StoreDir) -> int:
    """A lower bound of how far the dispatcher got: the largest end (offset + size) of any
    consume-queue entry. Records below it that belong to a queue are in that queue."""
    best = 0
    for _, _, directory in store.queues():
        for _, path in reversed(queue_files(directory)):
            entries = read_queue_file(path)
            if len(entries):
                best = max(best, int(entries["offset"][-1]) + int(entries["size"][-1]))
                break
    return best


def advance(store: StoreDir, begin: int, end: int, max_record: int, *,
            max_bytes: int | None = None, max_records: int | None = None) -> int:
    """A record boundary in (begin, end] that keeps a micro-batch within ``max_bytes`` and
    ``max_records`` (always at least one record past ``begin``; ``begin`` and ``end`` are
    boundaries). Scans record headers from ``begin`` with the native scanner."""
    budget_bytes = max_bytes if max_bytes is not None else end - begin
    budget_rows = max_records if max_records is not None else None
    taken_bytes = 0
    taken_rows = 0
    pos_offset = begin
    for seg in store.segments():
        if seg.end <= pos_offset:
            continue
        if seg.base >= end:
            break
        with MappedSegment(seg) as mseg:
            pos = max(pos_offset, seg.base) - seg.base
            limit = min(mseg.size, end - seg.base)
            capacity = max(1, min(65536, budget_rows - taken_rows)) if budget_rows else 65536
            for arr, res in iter_scan(mseg, pos, limit, flags=0, max_record=max_record,
                                      capacity=capacity):
                if len(arr):
                    sizes = arr["size"].astype(np.int64)
                    cum = taken_bytes + np.cumsum(sizes)
                    fit = int(np.searchsorted(cum, budget_bytes, side="right"))
                    if budget_rows is not None:
                        fit = min(fit, budget_rows - taken_rows)
                    if taken_rows == 0:
                        fit = max(fit, 1)  # always make progress
                    if fit < len(arr):
                        return int(arr["phys_offset"][fit])
                    taken_bytes = int(cum[-1])
                    taken_rows += len(arr)
                    if budget_rows is not None and taken_rows >= budget_rows:
                        return int(arr["phys_offset"][-1] + arr["size"][-1])
                if res.stop == _backend.STOP_FULL:
                    continue
                if res.stop == _backend.STOP_BLANK:
                    pos_offset = seg.end
                    break
                # END (the limit) or anything else: the rest of the range is not ours to judge
                return min(end, seg.base + res.end) if res.stop == _backend.STOP_END else end
    return end

