"""``verify_store``: every record, queue entry and index file of a stopped store checked, and
the first bad byte of each area named with what the next start would do about it.

An operator facing a store that will not start cleanly, or a disk suspected of flipping bits,
needs that answer *before* the start, because the start acts. So the answer is recovery's own
rules asked, never restated: where its scan starts (``recovery.start_index``), whether it would
find intact records past damage and resume there (``holes.find_resume``), which consume-queue
entries it takes for valid (``consume_queue.valid_prefix``), how a record is checked before it
is served (the native scanner and gatherer, ``RecordVerifier``). Records are checked in C, a
batch per call; the Python work is per record or per entry, never per byte.

Why one module at about 600 lines: the three areas it checks (records, queue entries, index
files) are checked against one walk of the log (a queue entry or an index entry must point
inside the records the walk verified), so they share that walk's result.

It maps every file read-only and changes nothing. It holds the store's lock meanwhile, so it
refuses a store a broker has open; on a read-only copy, where the lock cannot be taken, it goes
on and says so.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

import attrs

import trio_ha._backend as _backend

from ...config import StoreConfig
from ...watermark import Watermark
from ...wire import layout
from ...wire import record as rec
from ...wire.layout import CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from .. import index as index_files
from ..checkpoint import FILE_SIZE as CHECKPOINT_FILE_SIZE
from ..checkpoint import Checkpoint
from ..commitlog import CommitLog
from ..consume_queue import valid_prefix
from ..holes import find_resume
from ..recovery import start_index
from ..segment import Segment
from ..segments import SegmentQueue
from ..verify import RecordVerifier
from ._directory import (
    SCAN_BATCH,
    QueueDir,
    SegmentFile,
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

__all__ = ["Damage", "Progress", "VerifyReport", "verify_store"]

#: consume-queue entries decided per gather call (bounds the gatherer's output arrays)
GATHER_BATCH = 65536
#: a checkpoint timestamp further than this in the future is worth a warning (ms)
_FUTURE_SLACK_MS = 24 * 3600 * 1000


class Progress(Protocol):
    """Where the long walks report how far they are (the CLI draws a bar from it)."""

    def begin(self, what: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...


class _NoProgress:
    def begin(self, what: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


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


def _commitlog_of(store: StoreDir, segments: list[Segment], size: int) -> CommitLog:
    """A CommitLog around read-only segments, for recovery's functions that take one."""
    queue = SegmentQueue(store.commitlog_dir, size, segments=list(segments))
    commitlog = CommitLog(store.config, queue, Watermark(), Watermark())
    end = segments[-1].wrote_offset if segments else 0
    commitlog.written.reset(end)
    return commitlog


# ---- the commitlog ------------------------------------------------------------------


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


def _walk_log(store: StoreDir, segments: list[Segment], checkpoint: Checkpoint,
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


def _recovery_flags(store: StoreDir) -> int:
    return _backend.SCAN_CHECK_CRC if store.config.check_crc_on_recover else 0


def _damage(store: StoreDir, segments: list[Segment], index: int, position: int,
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


def _recovery_outcome(store: StoreDir, segments: list[Segment], index: int, position: int,
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


# ---- consume queues -------------------------------------------------------------------


@attrs.frozen
class _QueueCheck:
    entries: int
    unchecked: int
    damage: Damage | None


def _verify_queue(store: StoreDir, queue: QueueDir, file_size: int, commitlog: SegmentQueue,
                  readable_end: int, damaged_from: int | None,
                  gatherer: _backend.Gatherer) -> _QueueCheck:
    files = segment_files(queue.directory)
    usable, why, gap = loadable_prefix(files, file_size)

    def bad(f: SegmentFile, at: int, problem: str, recovery: str, points_at: int | None = None,
            queue_offset: int | None = None) -> Damage:
        return Damage("consume queue", store.relative(f.path), at, points_at, problem,
                      recovery, queue.key, queue_offset)

    if why is not None and usable == 0:
        f = files[0]
        return _QueueCheck(0, 0, bad(f, 0, why, _queue_layout_outcome(gap)))
    checked = unchecked = 0
    topic = queue.topic.encode()
    verifier = RecordVerifier(store.max_record)
    with mapped(files[:usable]) as segments:
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


# ---- index files and checkpoint -------------------------------------------------------


def _verify_index(store: StoreDir, log_end: int, clean_log: bool
                  ) -> tuple[list[Damage], list[str]]:
    """Headers, and the last entry of each file: cheap, and what the store trusts at open
    (the newest file's end says where indexing resumes)."""
    damage: list[Damage] = []
    warnings: list[str] = []
    expected = index_files.file_size(store.config.max_hash_slot_num, store.config.max_index_num)
    for path in index_paths(store):
        name = store.relative(path)
        size = os.path.getsize(path)
        if size != expected:
            warnings.append(
                f"{name} has {size} bytes, not the {expected} of maxHashSlotNum="
                f"{store.config.max_hash_slot_num} and maxIndexNum={store.config.max_index_num}"
                " (pass the broker's config with -c if it sets them; a store opened with "
                "these settings refuses the file)")
            continue
        header = read_index_header(path)
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
            at = index_entries_at(store) + index_files.ENTRY_SIZE * (count - 1)
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
    warnings: list[str] = []
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
    store = locate(store_dir, config)
    progress = progress or _NoProgress()
    with store_lock(store.root, read_only_ok=True) as lock_warning:
        report = _verify(store, progress)
    if lock_warning is not None:
        report = attrs.evolve(report, warnings=(lock_warning, *report.warnings))
    return report


def _verify(store: StoreDir, progress: Progress) -> VerifyReport:
    abnormal = os.path.exists(os.path.join(store.root, "abort"))
    checkpoint, present, checkpoint_size = read_checkpoint(store)
    files = segment_files(store.commitlog_dir)
    size = (store.config.mapped_file_size_commit_log if store.sizes_configured
            else common_size(files)) or store.config.mapped_file_size_commit_log
    usable, why, _gap = loadable_prefix(files, size)
    damage: list[Damage] = []
    warnings: list[str] = []
    with mapped(files[:usable]) as segments:
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
        queues = queue_dirs(store)
        file_size = queue_file_size(store, queues)
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
        log_end, len(queues), entries, unchecked, len(index_paths(store)), abnormal,
        tuple(damage), tuple(warnings),
    )
