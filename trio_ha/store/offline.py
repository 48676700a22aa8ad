"""Offline tools for a store directory that no broker has open: verify, inspect, truncate.

Why they exist: an operator facing a store that will not start cleanly, a slave that
diverged from its master, or a disk suspected of flipping bits needs to know what is on disk
and what the next start will do with it — *before* starting it, because a start acts:
recovery cuts the log, fills damaged ranges, rebuilds consume queues and deletes index files.

So these functions read the files the way the store reads them at open, and say what its
recovery would do by asking recovery's own rules instead of restating them: where its scan
starts (``recovery.start_index``), whether it would find intact records past damage and
resume there (``holes.find_resume``), which consume-queue entries it takes for valid
(``consume_queue.valid_prefix``), how a record is checked before it is served (the native
scanner and gatherer, ``RecordVerifier``). Records are checked in C, a batch per call; the
Python work is per record or per entry, never per byte.

``verify_store`` and ``inspect_store`` map every file read-only and change nothing.
``truncate_store`` is the explicit repair of a diverged slave: it cuts the log back to a
record boundary with the store's own code (``CommitLog.set_end``, zeroing what follows as
recovery does after damage; ``ConsumeQueue.truncate_dirty``), drops the index entries past
the cut, and lowers the checkpoint to what is left — holding the store's lock throughout, so
it refuses a store a broker has open, and no broker can open it meanwhile. Its steps go from
the least to the most telling (index, queues, checkpoint, commitlog): stopped half-way, the
store still opens, and running it again finishes the job.
"""

from __future__ import annotations

import array
import collections
import contextlib
import errno
import mmap
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import attrs

from .. import _backend
from .._errors import TrioHAError
from ..config import StoreConfig
from ..watermark import Watermark
from ..wire import layout
from ..wire import record as rec
from ..wire.layout import CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from . import index as index_files
from .checkpoint import FILE_SIZE as CHECKPOINT_FILE_SIZE
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueue, is_valid_topic, valid_prefix
from .holes import find_resume
from .lock import StoreLock, StoreLockedError
from .recovery import start_index
from .segment import Segment
from .segments import SegmentQueue
from .store import max_record_size
from .verify import RecordVerifier

__all__ = [
    "CheckpointSummary", "Damage", "IndexCut", "IndexFileSummary", "OfflineStoreError",
    "Progress", "QueueCut", "QueueSummary", "SegmentSummary", "StoreInventory",
    "TruncateOutcome", "TruncatePlan", "VerifyReport", "inspect_store", "truncate_store",
    "verify_store",
]

#: records the scanner describes per call
SCAN_BATCH = 4096
#: consume-queue entries decided per gather call (bounds the gatherer's output arrays)
GATHER_BATCH = 65536
#: a checkpoint timestamp further than this in the future is worth a warning (ms)
_FUTURE_SLACK_MS = 24 * 3600 * 1000
#: errnos that mean "this directory is read-only to us": verify then goes on without the lock
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class OfflineStoreError(TrioHAError):
    """Something an operator caused and can fix: the directory is missing or is not a store,
    or a truncation is refused (not a record boundary, beyond the end...). One line."""


class Progress(Protocol):
    """Where the long walks report how far they are (the CLI draws a bar from it)."""

    def begin(self, what: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...


class _NoProgress:
    def begin(self, what: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


# ---- results ----------------------------------------------------------------------------------


@attrs.frozen
class Damage:
    """The first bad byte of one area, what is wrong there and what the next start does."""

    #: "commitlog", "consume queue" or "index"
    area: str
    #: the file (relative to the store directory when inside it) and the position in it
    file: str
    file_offset: int
    #: the commitlog offset of the bad byte (commitlog), or the one a bad entry points at
    commitlog_offset: int | None
    problem: str
    #: what crash recovery — the next open of the store — would do about it
    recovery: str
    #: for a consume-queue entry: "topic/queueId" and the entry's queue offset
    queue: str | None = None
    queue_offset: int | None = None


@attrs.frozen
class VerifyReport:
    root: str
    segments: int
    #: records whose every check passed, and their bytes (filler blanks not counted)
    records: int
    record_bytes: int
    #: the verified commitlog range: from the first segment to the first bad byte or the end
    log_start: int
    log_end: int
    queues: int
    #: consume-queue entries checked against their records; entries pointing past commitlog
    #: damage cannot be checked and are counted apart
    queue_entries: int
    queue_entries_unchecked: int
    index_files: int
    #: the last stop was not clean: the next open runs crash recovery
    abort_present: bool
    damage: tuple[Damage, ...]
    #: oddities that do not stop the store nor lose data (a checkpoint ahead of the log...)
    warnings: tuple[str, ...]

    @property
    def clean(self) -> bool:
        return not self.damage


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
class CheckpointSummary:
    present: bool
    physic_msg_timestamp: int
    logics_msg_timestamp: int
    index_msg_timestamp: int
    master_flushed_offset: int
    confirm_phy_offset: int

    @classmethod
    def of(cls, checkpoint: Checkpoint, present: bool) -> CheckpointSummary:
        return cls(present, checkpoint.physic_msg_timestamp, checkpoint.logics_msg_timestamp,
                   checkpoint.index_msg_timestamp, checkpoint.master_flushed_offset,
                   checkpoint.confirm_phy_offset)


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


# ---- the store directory ---------------------------------------------------------------------


@attrs.frozen
class _StoreDir:
    root: str
    commitlog_dir: str
    queue_root: str
    index_dir: str
    config: StoreConfig
    #: sizes come from the config the caller gave (else from the files themselves)
    sizes_configured: bool

    @property
    def max_record(self) -> int:
        return max_record_size(self.config)

    def relative(self, path: str) -> str:
        inside = os.path.relpath(path, self.root)
        return path if inside.startswith("..") else inside


def _locate(store_dir: str, config: StoreConfig | None) -> _StoreDir:
    if not os.path.exists(store_dir):
        raise OfflineStoreError(f"no such directory: {store_dir}")
    if not os.path.isdir(store_dir):
        raise OfflineStoreError(f"not a directory: {store_dir}")
    root = os.path.realpath(store_dir)
    sizes_configured = config is not None
    config = attrs.evolve(config or StoreConfig(), store_path_root_dir=root)
    commitlog_dir = os.path.realpath(config.commitlog_dir)
    if not os.path.isdir(commitlog_dir):
        raise OfflineStoreError(f"{store_dir} is not a store directory: it has no "
                                f"{os.path.relpath(commitlog_dir, root)}/")
    return _StoreDir(root, commitlog_dir, os.path.join(root, "consumequeue"),
                     os.path.join(root, "index"), config, sizes_configured)


@attrs.frozen
class _File:
    name: str
    path: str
    base: int
    size: int


def _segment_files(directory: str) -> list[_File]:
    """The files of a log directory named as segments, oldest first (other names are what
    the store ignores too)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            base = layout.parse_segment_file_name(name)
            path = os.path.join(directory, name)
            if base is not None and os.path.isfile(path):
                found.append(_File(name, path, base, os.path.getsize(path)))
    return sorted(found, key=lambda f: f.base)


def _common_size(files: Sequence[_File]) -> int | None:
    """The size most of ``files`` have: a store's segments all have one."""
    sizes = collections.Counter(f.size for f in files)
    return sizes.most_common(1)[0][0] if sizes else None


def _loadable_prefix(files: list[_File], size: int) -> tuple[int, str | None, bool]:
    """How many of ``files`` the store loads as one log, why it stops at the next one
    (SegmentQueue.load's and Segment.open's rules), and whether that reason is a gap."""
    if files and size <= 0:
        return 0, f"{files[0].name} is empty", False
    for i, f in enumerate(files):
        if f.size != size:
            return i, f"{f.name} has {f.size} bytes, not the segment size {size}", False
        if f.base % size:
            return i, (f"{f.name} names offset {f.base}, not a multiple of the segment size "
                       f"{size}"), False
        if i and f.base != files[i - 1].base + size:
            start = files[i - 1].base + size
            return i, (f"the files for [{start}, {f.base}) are missing: "
                       f"{files[i - 1].name} ends at {start}, the next file is {f.name}"), True
    return len(files), None, False


def _map_read_only(f: _File) -> Segment:
    """A store Segment over ``f`` whose mapping cannot be written (Segment.open maps for
    writing: these tools must not change a byte)."""
    fd = os.open(f.path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        raise
    segment = Segment(f.path, f.base, f.size, fd, mapping, _backend.engine.handle_for(mapping))
    segment.wrote_position = segment.flushed_position = f.size
    return segment


@contextlib.contextmanager
def _mapped(files: Sequence[_File]) -> Iterator[list[Segment]]:
    segments: list[Segment] = []
    try:
        for f in files:
            segments.append(_map_read_only(f))
        yield segments
    finally:
        for segment in segments:
            segment.close()


def _commitlog_of(store: _StoreDir, segments: list[Segment], size: int) -> CommitLog:
    """A CommitLog around read-only segments, for recovery's functions that take one."""
    queue = SegmentQueue(store.commitlog_dir, size, segments=list(segments))
    commitlog = CommitLog(store.config, queue, Watermark(), Watermark())
    end = segments[-1].wrote_offset if segments else 0
    commitlog.written.reset(end)
    return commitlog


def _read_checkpoint(store: _StoreDir) -> tuple[Checkpoint, bool, int | None]:
    path = os.path.join(store.root, "checkpoint")
    try:
        size: int | None = os.path.getsize(path)
    except FileNotFoundError:
        size = None
    return Checkpoint.load(path), size is not None, size


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


@contextlib.contextmanager
def _store_lock(root: str, *, read_only_ok: bool) -> Iterator[str | None]:
    """Hold the store's lock for the block (StoreLockedError when a broker has it open).
    With ``read_only_ok`` a directory where the lock cannot be written (a read-only copy)
    is worked on unlocked; the block gets a warning to pass on."""
    try:
        lock = StoreLock.acquire(root)
    except OSError as exc:
        if not read_only_ok or exc.errno not in _READ_ONLY_ERRNOS:
            raise
        yield (f"the store's lock cannot be taken ({exc.strerror}): nothing keeps a broker "
               "from opening it during the check")
        return
    try:
        yield None
    finally:
        lock.release()


# ---- verify: the commitlog ------------------------------------------------------------------


@attrs.frozen
class _LogWalk:
    records: int
    record_bytes: int
    #: where the verified records end: the first bad byte, or the end of the log
    end: int
    last_timestamp: int
    damage: Damage | None


def _stop_problem(segment: Segment, position: int, result: _backend.ScanResult,
                  max_record: int) -> str:
    """What the scanner found at ``position`` when it stopped on something bad."""
    stop, size = result.stop, result.size
    if stop == _backend.STOP_PARTIAL:
        if size:
            return (f"torn record: TOTALSIZE {size} runs past the end of the segment "
                    f"({segment.size - position} bytes left)")
        return f"only {segment.size - position} bytes left in the segment and no blank record"
    if stop == _backend.STOP_BAD_MAGIC:
        (magic,) = layout.INT32.unpack_from(segment.read(position + layout.MAGIC_AT, 4))
        return f"bad magic code 0x{magic & 0xFFFFFFFF:08X} (TOTALSIZE {size})"
    if stop == _backend.STOP_BAD_SIZE:
        return (f"bad size: TOTALSIZE {size} is outside [{rec.record_size(0, 0, 0)}, "
                f"{max_record}] or the record's declared lengths do not add up to it")
    if stop == _backend.STOP_TORN:
        return (f"torn record: its last bytes are zero (TOTALSIZE {size}): its header reached "
                "the file, the tail of its properties or topic did not")
    if stop == _backend.STOP_BAD_CRC:
        stored = layout.INT32.unpack_from(segment.read(position + layout.BODYCRC_AT, 4))[0]
        try:
            body = rec.decode_record(segment.read(position, size), check_crc=False,
                                     max_size=max_record).body
            actual = f", the body's is {_backend.engine.crc32(body)}"
        except rec.RecordDecodeError:
            actual = ""
        return f"body CRC mismatch: BODYCRC {stored}{actual} (TOTALSIZE {size})"
    return f"{result.reason} (TOTALSIZE {size})"


def _walk_log(store: _StoreDir, segments: list[Segment], checkpoint: Checkpoint,
              abnormal: bool, segment_size: int, progress: Progress) -> _LogWalk:
    """Check every record of every segment — magic, sizes and declared lengths and BODYCRC
    (the scanner), PHYSICALOFFSET equal to its position (here) — up to the first bad byte,
    and say what recovery would do with that byte."""
    max_record = store.max_record
    scanner = _backend.engine.scanner(SCAN_BATCH)
    records = record_bytes = 0
    #: store time of the last good record, and the segment it is in (recovery's resume
    #: search counts only the records its own scan passed)
    last_timestamp, last_index = 0, -1
    progress.begin("commitlog", sum(s.size for s in segments))
    #: where recovery would say the log ends: a full last segment ends at its blank record
    end = 0
    for index, segment in enumerate(segments):
        end = segment.base_offset
        position = 0
        view = segment.view()
        try:
            while True:
                result = scanner.scan(segment.handle, segment.size, position,
                                      segment.base_offset, _backend.SCAN_CHECK_CRC, max_record)
                infos = result.infos
                for i in range(result.count):
                    info = infos[i]
                    at = info.phys_offset - segment.base_offset
                    (physical,) = layout.INT64.unpack_from(view, at + layout.PHYSICALOFFSET_AT)
                    if physical != info.phys_offset:
                        damage = _damage(
                            store, segments, index, at, checkpoint, abnormal, segment_size,
                            f"PHYSICALOFFSET is {physical}, not the record's position "
                            f"{info.phys_offset}",
                            "recovery does not check PHYSICALOFFSET and keeps the record; "
                            "reads refuse to serve it (checkCRCOnRead), and recovery's search "
                            "past damage does not take it for a record that chains",
                        )
                        return _LogWalk(records + i, record_bytes + at - position,
                                        info.phys_offset, last_timestamp, damage)
                if result.count:
                    records += result.count
                    record_bytes += result.end - position
                    last_timestamp = infos[result.count - 1].store_timestamp
                    last_index = index
                progress.advance(result.end - position)
                position = result.end
                if result.stop != _backend.STOP_FULL:
                    break
        finally:
            view.release()
        end = segment.base_offset + position
        if result.stop == _backend.STOP_BLANK or (
            result.stop == _backend.STOP_END and position == segment.size
        ):
            progress.advance(segment.size - position)
            end = segment.base_offset + segment.size  # (as recovery: see recover())
            continue
        zeros = result.stop == _backend.STOP_BAD_MAGIC and result.size == 0
        last = index == len(segments) - 1
        if zeros and last:
            # The end of the log — unless intact records follow the zeros (a page lost at
            # power failure while later ones reached the disk): recovery's own search says.
            resume = find_resume(segments, index, position, flags=_recovery_flags(store),
                                 max_record=max_record, min_timestamp=last_timestamp)
            if resume is None:
                progress.advance(segment.size - position)
                return _LogWalk(records, record_bytes, end, last_timestamp, None)
            problem = f"zeros where a record should start, but intact records follow at {resume}"
        elif zeros:
            problem = "zeros where a record should start, although later segments exist"
        else:
            problem = _stop_problem(segment, position, result, max_record)
        damage = _damage(store, segments, index, position, checkpoint, abnormal, segment_size,
                         problem, None, zeros=zeros, min_timestamp=last_timestamp,
                         last_index=last_index, crc=result.stop == _backend.STOP_BAD_CRC)
        return _LogWalk(records, record_bytes, end, last_timestamp, damage)
    return _LogWalk(records, record_bytes, end, last_timestamp, None)


def _recovery_flags(store: _StoreDir) -> int:
    return _backend.SCAN_CHECK_CRC if store.config.check_crc_on_recover else 0


def _damage(store: _StoreDir, segments: list[Segment], index: int, position: int,
            checkpoint: Checkpoint, abnormal: bool, segment_size: int, problem: str,
            recovery: str | None, *, zeros: bool = False, min_timestamp: int = 0,
            last_index: int = -1, crc: bool = False) -> Damage:
    segment = segments[index]
    offset = segment.base_offset + position
    if recovery is None:
        recovery = _recovery_outcome(store, segments, index, position, checkpoint, abnormal,
                                     segment_size, zeros=zeros, min_timestamp=min_timestamp,
                                     last_index=last_index, crc=crc)
    return Damage("commitlog", store.relative(segment.path), position, offset, problem,
                  recovery)


def _recovery_outcome(store: _StoreDir, segments: list[Segment], index: int, position: int,
                      checkpoint: Checkpoint, abnormal: bool, segment_size: int, *,
                      zeros: bool, min_timestamp: int, last_index: int, crc: bool) -> str:
    """What ``recovery.recover`` does with a scan that stops at ``position`` of
    ``segments[index]``: the same start segment, the same search for records that chain,
    the same cut."""
    config = store.config
    segment = segments[index]
    offset = segment.base_offset + position
    start = start_index(_commitlog_of(store, segments, segment_size), checkpoint, abnormal,
                         store.max_record)
    how = "a crash (the abort file is present)" if abnormal else "a clean stop"
    if index < start:
        return (f"recovery does not read it: after {how} its scan starts at segment "
                f"{os.path.basename(segments[start].path)}; the bytes stay, and reads refuse "
                "to serve a record that fails its check (checkCRCOnRead)")
    if crc and not config.check_crc_on_recover:
        return ("recovery keeps the record (checkCRCOnRecover=false); reads refuse to serve it "
                "(checkCRCOnRead)")
    # Recovery's search starts from the last record its own scan passed.
    min_timestamp = min_timestamp if last_index >= start else 0
    last = index == len(segments) - 1
    looks_past = config.skip_corrupt_records_on_recover and (abnormal or not zeros or not last)
    resume = None
    if looks_past or zeros:
        resume = find_resume(segments, index, position, flags=_recovery_flags(store),
                             max_record=store.max_record, min_timestamp=min_timestamp)
    if looks_past and resume is not None:
        filler = ("the end-of-segment blank record" if resume >= segment.end_offset
                  else "filler records (ROLLBACK records of the topic TRIO_HA_RECOVERY_HOLE)")
        return (f"recovery would replace the {resume - offset} damaged bytes "
                f"[{offset}, {resume}) with {filler}, keeping a copy under corrupt/, and keep "
                f"the records from {resume} on; consume queues with entries in that range "
                "are rebuilt from the commitlog")
    if zeros and last and resume is not None:
        return (f"recovery would end the log at {offset} (after {how} it takes zeros in the "
                f"last segment for the end of the log), losing the intact records from "
                f"{resume} on")
    later = len(segments) - 1 - index
    lost = segments[-1].end_offset - offset
    files = f"the rest of {os.path.basename(segment.path)}"
    if later:
        files += f" and {later} later segment file{'s' if later > 1 else ''}"
    return (f"recovery would truncate the log to {offset}, losing everything after it: up to "
            f"{lost} bytes ({files}); consume-queue entries past it are dropped")


# ---- verify: consume queues -------------------------------------------------------------------


@attrs.frozen
class _QueueDir:
    topic: str
    queue_id: int
    directory: str

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.queue_id}"


def _queue_dirs(store: _StoreDir) -> list[_QueueDir]:
    """The consume queues the store would load (ConsumeQueueTable.load's rules)."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for topic in sorted(os.listdir(store.queue_root)):
            topic_dir = os.path.join(store.queue_root, topic)
            if not os.path.isdir(topic_dir) or not is_valid_topic(topic):
                continue
            for name in sorted(os.listdir(topic_dir), key=lambda n: (len(n), n)):
                if name.isdigit() and os.path.isdir(os.path.join(topic_dir, name)):
                    found.append(_QueueDir(topic, int(name), os.path.join(topic_dir, name)))
    return found


def _queue_file_size(store: _StoreDir, queues: list[_QueueDir]) -> int:
    if store.sizes_configured:
        return store.config.mapped_file_size_consume_queue
    sizes = collections.Counter(
        f.size for queue in queues for f in _segment_files(queue.directory)
    )
    return sizes.most_common(1)[0][0] if sizes else store.config.mapped_file_size_consume_queue


@attrs.frozen
class _QueueCheck:
    entries: int
    unchecked: int
    damage: Damage | None


def _verify_queue(store: _StoreDir, queue: _QueueDir, file_size: int, commitlog: SegmentQueue,
                  readable_end: int, damaged_from: int | None,
                  gatherer: _backend.Gatherer) -> _QueueCheck:
    files = _segment_files(queue.directory)
    usable, why, gap = _loadable_prefix(files, file_size)

    def bad(f: _File, at: int, problem: str, recovery: str, points_at: int | None = None,
            queue_offset: int | None = None) -> Damage:
        return Damage("consume queue", store.relative(f.path), at, points_at, problem,
                      recovery, queue.key, queue_offset)

    if why is not None and usable == 0:
        f = files[0]
        return _QueueCheck(0, 0, bad(f, 0, why, _queue_layout_outcome(gap)))
    checked = unchecked = 0
    topic = queue.topic.encode()
    verifier = RecordVerifier(store.max_record)
    with _mapped(files[:usable]) as segments:
        for number, segment in enumerate(segments):
            f = files[number]
            valid = valid_prefix(segment)
            entries = segment.pread(0, valid * CQ_ENTRY_SIZE)
            first_queue_offset = segment.base_offset // CQ_ENTRY_SIZE
            done = 0
            while done < valid:
                chunk = entries[done * CQ_ENTRY_SIZE : (done + GATHER_BATCH) * CQ_ENTRY_SIZE]
                phys, size, _tags = CQ_ENTRY.unpack_from(chunk)
                target = commitlog.find(phys) or _nearest(commitlog, phys)
                if target is None:
                    # No commitlog at all: every entry but a blank filler points nowhere.
                    blanks = _leading_blanks(chunk)
                    result_entries = blanks
                    outcomes = bytes([_backend.GATHER_REMOVED]) * blanks
                    if blanks < len(chunk) // CQ_ENTRY_SIZE:
                        outcomes += bytes([_backend.GATHER_ABSENT])
                else:
                    result = gatherer.gather(
                        target.handle, target.size, target.base_offset, commitlog.min_offset,
                        min(readable_end, target.end_offset), chunk, None, topic,
                        queue.queue_id, first_queue_offset + done, _backend.GATHER_VERIFY,
                        store.max_record, len(chunk) // CQ_ENTRY_SIZE, 2**62,
                    )
                    result_entries, outcomes = result.entries, result.outcomes
                problem_at = _first_problem(outcomes)
                if problem_at is None and result_entries:
                    checked += result_entries
                    done += result_entries
                    continue
                # The entry at `problem_at` (or the first one, whose record is in no segment)
                i = problem_at if problem_at is not None else 0
                checked += i
                at = (done + i) * CQ_ENTRY_SIZE
                phys, size, _tags = CQ_ENTRY.unpack_from(entries, at)
                queue_offset = first_queue_offset + done + i
                if damaged_from is not None and phys + max(size, 0) > damaged_from:
                    # Past the commitlog's first bad byte nothing can be checked; entries
                    # are in commitlog order, so neither can any later one.
                    unchecked += valid - done - i + sum(
                        valid_prefix(s) for s in segments[number + 1 :]
                    )
                    return _QueueCheck(checked, unchecked, None)
                outcome = outcomes[i] if problem_at is not None else _backend.GATHER_ABSENT
                edge = done + i in (0, valid - 1)
                if outcome == _backend.GATHER_INVALID and target is not None:
                    record_at = phys - target.base_offset
                    problem = verifier.problem(
                        target, record_at, target.read(record_at, size),
                        (topic, queue.queue_id, queue_offset),
                    ) or "the record failed the check of a pull"
                    text = f"points at the record at {phys} ({size} bytes), which fails: {problem}"
                elif phys >= readable_end:
                    text = (f"points at commitlog offset {phys}, at or past the end of the "
                            f"log ({readable_end})")
                else:
                    text = (f"points at {phys} with size {size}, which is not a whole record "
                            f"inside the log (it ends at {readable_end})")
                return _QueueCheck(checked, unchecked, bad(
                    f, at, text, _queue_entry_outcome(phys, readable_end, edge),
                    phys, queue_offset,
                ))
            if valid * CQ_ENTRY_SIZE < segment.size and number < len(files) - 1:
                return _QueueCheck(checked, unchecked, bad(
                    f, valid * CQ_ENTRY_SIZE,
                    f"the file holds {valid} entries, but later files exist",
                    "recovery marks the queue as disagreeing with the commitlog and rebuilds "
                    "it from the commitlog", None, first_queue_offset + valid,
                ))
    if why is not None:
        f = files[usable]
        return _QueueCheck(checked, unchecked, bad(f, 0, why, _queue_layout_outcome(gap)))
    return _QueueCheck(checked, unchecked, None)


def _nearest(commitlog: SegmentQueue, offset: int) -> Segment | None:
    """The segment a gather runs against for an entry whose record is in none: the first
    one below the log (the entry reads as removed), else the last (it reads as absent)."""
    if not commitlog.segments:
        return None
    return commitlog.segments[0] if offset < commitlog.min_offset else commitlog.segments[-1]


def _leading_blanks(entries: bytes) -> int:
    count = 0
    for _phys, size, _tags in CQ_ENTRY.iter_unpack(entries):
        if size != CQ_BLANK_SIZE:
            break
        count += 1
    return count


def _first_problem(outcomes: bytes) -> int | None:
    """The first outcome that is neither found nor removed (a blank filler or an entry
    below the log's first offset, both normal), found in C."""
    hits = [at for code in (_backend.GATHER_ABSENT, _backend.GATHER_INVALID)
            if (at := outcomes.find(bytes((code,)))) >= 0]
    return min(hits) if hits else None


def _queue_layout_outcome(gap: bool) -> str:
    if gap:
        return ("recovery deletes the queue's files and rebuilds it from the commitlog "
                "(ConsumeQueue.open)")
    return "the store refuses to open (every consume-queue file must have the configured size)"


def _queue_entry_outcome(phys: int, log_end: int, edge: bool) -> str:
    if phys >= log_end:
        return ("recovery drops this entry and every later one (the queue ends before it); "
                "the dispatcher indexes again whatever records the log holds")
    if edge:
        return ("recovery checks each file's first and last entries, finds this one wrong, "
                "and rebuilds the queue from the commitlog")
    return ("recovery checks only each file's first and last entries and would not notice; "
            "pulls refuse this entry's record (OFFSET_FOUND_NULL: the consumer skips it)")


# ---- verify: index files and checkpoint -------------------------------------------------------


def _index_paths(store: _StoreDir) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return [os.path.join(store.index_dir, n)
                for n in sorted(os.listdir(store.index_dir)) if n.isdigit()]
    return []


def _read_index_header(path: str) -> index_files.IndexHeader | None:
    with open(path, "rb") as f:
        raw = f.read(index_files.HEADER_SIZE)
    if len(raw) < index_files.HEADER_SIZE:
        return None
    return index_files.IndexHeader(*index_files.HEADER.unpack(raw))


def _index_entries_at(store: _StoreDir) -> int:
    return index_files.HEADER_SIZE + 4 * store.config.max_hash_slot_num


def _verify_index(store: _StoreDir, log_end: int, clean_log: bool
                  ) -> tuple[list[Damage], list[str]]:
    """Headers, and the last entry of each file: cheap, and what the store trusts at open
    (the newest file's end says where indexing resumes)."""
    damage: list[Damage] = []
    warnings: list[str] = []
    expected = index_files.file_size(store.config.max_hash_slot_num, store.config.max_index_num)
    for path in _index_paths(store):
        name = store.relative(path)
        size = os.path.getsize(path)
        if size != expected:
            warnings.append(
                f"{name} has {size} bytes, not the {expected} of maxHashSlotNum="
                f"{store.config.max_hash_slot_num} and maxIndexNum={store.config.max_index_num}"
                " (pass the broker's config with -c if it sets them; a store opened with "
                "these settings refuses the file)")
            continue
        header = _read_index_header(path)
        if header is None:
            continue
        count = header.index_count
        if not 1 <= count <= store.config.max_index_num:
            damage.append(Damage("index", name, 36, None, f"indexCount is {count}",
                                 "the store opens it and reads entries up to indexCount"))
            continue
        if clean_log and header.end_phy_offset >= log_end and count > 1:
            damage.append(Damage(
                "index", name, 24, header.end_phy_offset,
                f"endPhyOffset {header.end_phy_offset} is at or past the end of the log "
                f"({log_end})",
                "the store keeps the file: queries by key may name records that are not "
                "there, and records up to that offset are not indexed again "
                "(`trio-ha store truncate` cuts such entries)"))
            continue
        if count > 1:
            at = _index_entries_at(store) + index_files.ENTRY_SIZE * (count - 1)
            with open(path, "rb") as f:
                f.seek(at)
                _hash, phys, _diff, previous = index_files.ENTRY.unpack(
                    f.read(index_files.ENTRY_SIZE))
            if phys > header.end_phy_offset or not 0 <= previous < count:
                damage.append(Damage(
                    "index", name, at, phys,
                    f"its last entry points at {phys} (previous {previous}), outside what the "
                    f"header says (endPhyOffset {header.end_phy_offset}, {count} entries)",
                    "the store opens it; queries by key that reach the entry may answer "
                    "wrongly"))
    return damage, warnings


def _checkpoint_warnings(checkpoint: Checkpoint, present: bool, size: int | None,
                         last_timestamp: int, records: int) -> list[str]:
    if not present:
        return ["no checkpoint file: after a crash, recovery would scan the log from its "
                "first segment"]
    warnings = []
    if size != CHECKPOINT_FILE_SIZE:
        warnings.append(f"the checkpoint file has {size} bytes, not {CHECKPOINT_FILE_SIZE}")
    now = time.time_ns() // 1_000_000
    for name, value in (("physicMsgTimestamp", checkpoint.physic_msg_timestamp),
                        ("logicsMsgTimestamp", checkpoint.logics_msg_timestamp),
                        ("indexMsgTimestamp", checkpoint.index_msg_timestamp)):
        if value < 0 or value > now + _FUTURE_SLACK_MS:
            warnings.append(f"checkpoint {name} is {value}, not a time the store could "
                            "have recorded")
        elif name != "indexMsgTimestamp" and records and value > last_timestamp:
            warnings.append(
                f"checkpoint {name} {value} is after the last record's store time "
                f"{last_timestamp}: after a crash, recovery would trust records the log "
                "does not hold and may start its scan too late")
    return warnings


def verify_store(store_dir: str, *, config: StoreConfig | None = None,
                 progress: Progress | None = None) -> VerifyReport:
    """Check every commitlog segment, consume queue, index file header and the checkpoint of
    a store no broker has open (StoreLockedError otherwise; the lock is held meanwhile).
    ``config``: the broker's store settings (segment sizes, maxMessageSize, the recovery
    switches); without it the sizes are read from the files and the rest is the default."""
    store = _locate(store_dir, config)
    progress = progress or _NoProgress()
    with _store_lock(store.root, read_only_ok=True) as lock_warning:
        report = _verify(store, progress)
    if lock_warning is not None:
        report = attrs.evolve(report, warnings=(lock_warning, *report.warnings))
    return report


def _verify(store: _StoreDir, progress: Progress) -> VerifyReport:
    abnormal = os.path.exists(os.path.join(store.root, "abort"))
    checkpoint, present, checkpoint_size = _read_checkpoint(store)
    files = _segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else _common_size(files)) or store.config.mapped_file_size_commit_log
    usable, why, _gap = _loadable_prefix(files, size)
    damage: list[Damage] = []
    warnings: list[str] = []
    with _mapped(files[:usable]) as segments:
        walk = _walk_log(store, segments, checkpoint, abnormal, size, progress)
        if walk.damage is not None:
            damage.append(walk.damage)
        damaged_from = walk.end if walk.damage is not None else None
        if why is not None:
            bad = files[usable]
            damage.append(Damage("commitlog", store.relative(bad.path), 0, bad.base, why,
                                 "the store refuses to open until the files are put right"))
            damaged_from = bad.base if damaged_from is None else damaged_from
        log_end = walk.end
        commitlog = SegmentQueue(store.commitlog_dir, size, segments=list(segments))
        queues = _queue_dirs(store)
        file_size = _queue_file_size(store, queues)
        gatherer = _backend.engine.gatherer()
        entries = unchecked = 0
        progress.begin("consume queues", len(queues))
        for queue in queues:
            check = _verify_queue(store, queue, file_size, commitlog, log_end, damaged_from,
                                  gatherer)
            entries += check.entries
            unchecked += check.unchecked
            if check.damage is not None:
                damage.append(check.damage)
            progress.advance(1)
        index_damage, index_warnings = _verify_index(store, log_end,
                                                     damaged_from is None)
        damage.extend(index_damage)
        warnings.extend(index_warnings)
    if damaged_from is None:  # the last record's time is known only for a whole log
        warnings.extend(_checkpoint_warnings(checkpoint, present, checkpoint_size,
                                             walk.last_timestamp, walk.records))
    if abnormal:
        warnings.append("the abort file is present: the last stop was not clean, and the next "
                        "open runs crash recovery")
    return VerifyReport(
        store.root, usable, walk.records, walk.record_bytes, files[0].base if files else 0,
        log_end, len(queues), entries, unchecked, len(_index_paths(store)), abnormal,
        tuple(damage), tuple(warnings),
    )


# ---- inspect ---------------------------------------------------------------------------------


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


def _queue_summary(queue: _QueueDir, file_size: int, commitlog_min: int) -> QueueSummary | None:
    files = _segment_files(queue.directory)
    usable, _why, _gap = _loadable_prefix(files, file_size)
    if not usable:
        return None
    with _mapped(files[:usable]) as segments:
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
    store = _locate(store_dir, config)
    files = _segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else _common_size(files))
    summaries: list[SegmentSummary] = []
    min_offset = max_offset = 0
    if files and size is not None:
        usable, _why, _gap = _loadable_prefix(files, size)
        for f in files[:usable]:
            summaries.append(SegmentSummary(f.name, f.base, f.size, f.base + f.size, "full"))
        if usable:
            with _mapped(files[usable - 1 : usable]) as (last,):
                position, full = _records_end(last, store.max_record)
            state = "full" if full else ("empty" if position == 0 else "active")
            # (a full segment's log ends at its end, its blank included, as recovery says)
            end = last.base_offset + (last.size if full else position)
            summaries[-1] = attrs.evolve(summaries[-1], written_end=end, state=state)
            min_offset, max_offset = files[0].base, end
    checkpoint, present, _size = _read_checkpoint(store)
    queues = _queue_dirs(store)
    file_size = _queue_file_size(store, queues)
    queue_summaries = tuple(
        summary for queue in queues
        if (summary := _queue_summary(queue, file_size, min_offset)) is not None
    )
    index = []
    for path in _index_paths(store):
        header = _read_index_header(path)
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


# ---- truncate --------------------------------------------------------------------------------


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


def _find_boundary(store: _StoreDir, segments: list[Segment], offset: int) -> _Boundary:
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


def _plan_queue_cut(queue: _QueueDir, file_size: int, offset: int) -> QueueCut | None:
    files = _segment_files(queue.directory)
    usable, why, _gap = _loadable_prefix(files, file_size)
    if not usable or why is not None:
        # Left alone: the next open rebuilds a queue with a missing file from the (cut)
        # commitlog, and refuses one with a mis-sized file whatever is done here.
        return None
    with _mapped(files[:usable]) as segments:
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


def _plan_index_cuts(store: _StoreDir, segments: list[Segment], offset: int
                     ) -> list[tuple[IndexCut, tuple[int, int] | None]]:
    """Each index file with entries at or past ``offset``: deleted when all of it is past,
    else cut to the entries below, with the (end offset, end time) its header gets."""
    cuts: list[tuple[IndexCut, tuple[int, int] | None]] = []
    expected = index_files.file_size(store.config.max_hash_slot_num, store.config.max_index_num)
    entries_at = _index_entries_at(store)
    for path in _index_paths(store):
        header = _read_index_header(path)
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


def _index_entry_phys(f, entries_at: int, entry: int) -> int:
    f.seek(entries_at + index_files.ENTRY_SIZE * entry)
    return index_files.ENTRY.unpack(f.read(index_files.ENTRY_SIZE))[1]


def _store_timestamp(segments: list[Segment], offset: int) -> int:
    for segment in segments:
        if segment.base_offset <= offset < segment.end_offset:
            at = offset - segment.base_offset
            head = segment.read(at, layout.store_timestamp_at(layout.SYSFLAG_BORNHOST_V6) + 8)
            return layout.read_store_timestamp(head)
    return 0


def _plan(store: _StoreDir, offset: int
          ) -> tuple[TruncatePlan, int, int, list[tuple[IndexCut, tuple[int, int] | None]]]:
    files = _segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else _common_size(files)) or store.config.mapped_file_size_commit_log
    usable, why, _gap = _loadable_prefix(files, size)
    if why is not None:
        raise OfflineStoreError(f"the commitlog's files are not one log ({why}): the store "
                                "cannot open it, and it cannot be truncated")
    with _mapped(files) as segments:
        boundary = _find_boundary(store, segments, offset)
        records_cut, log_end = _count_from(segments, boundary.index, offset, store.max_record)
        index_cuts = _plan_index_cuts(store, segments, offset)
    log_end = max(log_end, offset)
    deleted = tuple(f.name for f in files if f.base >= offset)
    containing = [f for f in files if f.base < offset < f.base + f.size]
    segment_cut = containing[0].name if containing else None
    queues = _queue_dirs(store)
    file_size = _queue_file_size(store, queues)
    queue_cuts = tuple(cut for queue in queues
                       if (cut := _plan_queue_cut(queue, file_size, offset)) is not None)
    checkpoint, present, _size = _read_checkpoint(store)
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


def _newest_index_time(store: _StoreDir,
                       cuts: list[tuple[IndexCut, tuple[int, int] | None]]) -> int:
    """The end time of the newest index file left after the cuts (0: none is left)."""
    by_name = {cut.name: (cut, end) for cut, end in cuts}
    for path in reversed(_index_paths(store)):
        name = os.path.basename(path)
        if name not in by_name:
            header = _read_index_header(path)
            return header.end_timestamp if header is not None else 0
        cut, end = by_name[name]
        if cut.entries_after is None:
            continue
        if end is not None:
            return end[1]
        header = _read_index_header(path)
        return header.begin_timestamp if header is not None else 0
    return 0


def truncate_store(store_dir: str, offset: int, *, config: StoreConfig | None = None,
                   dry_run: bool = False,
                   confirm: Callable[[TruncatePlan], bool] | None = None) -> TruncateOutcome:
    """Cut the store back to the commitlog offset ``offset``, a record boundary, so that
    its next start (a slave's) replicates from there. Holds the store's lock from the plan
    to the last write: StoreLockedError while a broker has it open. ``confirm`` sees the
    plan and may say no; ``dry_run`` only plans."""
    store = _locate(store_dir, config)
    if offset < 0:
        raise OfflineStoreError(f"{offset} is not a commitlog offset")
    with _store_lock(store.root, read_only_ok=False):
        plan, segment_size, file_size, index_cuts = _plan(store, offset)
        if dry_run or not plan.changes_anything or (confirm is not None and not confirm(plan)):
            return TruncateOutcome(plan, False)
        _apply(store, plan, segment_size, file_size, index_cuts)
        return TruncateOutcome(plan, True)


def _apply(store: _StoreDir, plan: TruncatePlan, segment_size: int, file_size: int,
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


def _cut_index_file(store: _StoreDir, path: str, keep_count: int,
                    end: tuple[int, int] | None) -> None:
    """Keep the entries below ``keep_count`` of an index file: slots that named a dropped
    entry name the newest kept one of their chain instead, the dropped entries are zeroed,
    the header ends at the last kept record (``end``: its offset and store time)."""
    slot_num = store.config.max_hash_slot_num
    entries_at = _index_entries_at(store)
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

