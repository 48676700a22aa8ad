"""Crash recovery: find where the verified log ends, cut everything after it, re-index.

At open, every segment's positions say "full"; recovery establishes the truth
(docs/formats.md, 'Recovery', tells it step by step):

* consume queues are scanned for their last valid entry and cut there;
* the commitlog is scanned forward with CRC checks from a starting segment — the third from
  last after a clean shutdown, or, after a crash (the ``abort`` file is present), the newest
  segment whose first record is older than the checkpoint's safe timestamp — and it ends at
  the first record that is not whole and valid (bad magic, size, CRC, or a torn tail);
* everything after that end is removed: later segments deleted, the rest of the last one
  zeroed (RocketMQ leaves the bytes, so an old record that lines up after a later crash could
  come back), consume-queue entries pointing at or past it dropped;
* after a crash every valid record scanned is re-dispatched (consume-queue writes are
  idempotent), and an entry already in its queue that differs from what its record says is
  rewritten: a kill in the middle of copying an entry can leave its offset and size with a
  zero tags code, which the queues' own check cannot tell from a whole entry; after a clean
  stop the dispatcher resumes from the queues' end, or from the start of the last segment if
  that is earlier, so a queue that lost its tail is rebuilt.

Nothing after the first invalid record is ever served, even if later bytes look valid.
"""

from __future__ import annotations

import logging
import os

import attrs

import trio_ha._backend as _backend

from .._backend import Scanner
from ..wire import layout
from ..wire.layout import CQ_BLANK_SIZE, CQ_ENTRY, CQ_ENTRY_SIZE
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher
from .holes import Hole, fill_hole, find_resume
from .segment import Segment

log = logging.getLogger(__name__)


@attrs.frozen
class RecoveryReport:
    abnormal: bool
    start_offset: int
    end_offset: int
    records: int
    stop_reason: str
    #: consume queues ("topic/queueId") that disagreed with the commitlog and were rebuilt
    #: from it, and why
    rebuilt_queues: tuple[str, ...] = ()
    #: damaged commitlog ranges replaced by filler because intact records followed them
    #: ("[start, end): what was found")
    holes: tuple[str, ...] = ()
    #: consume queues ("topic/queueId: ...") whose entries differed from the records they
    #: index (torn by the crash) and were rewritten from them
    mended_queues: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line for the log: how the last stop was, what was verified, what was mended."""
        text = (f"after {'a crash' if self.abnormal else 'a clean stop'}: {self.records} "
                f"records verified in [{self.start_offset}, {self.end_offset}) "
                f"({self.stop_reason})")
        if self.rebuilt_queues:
            text += f"; rebuilt {len(self.rebuilt_queues)} consume queues: " + \
                    ", ".join(self.rebuilt_queues)
        if self.holes:
            text += f"; {len(self.holes)} damaged ranges filled: " + ", ".join(self.holes)
        if self.mended_queues:
            text += f"; mended {len(self.mended_queues)} consume queues: " + \
                    ", ".join(self.mended_queues)
        return text


def _first_record_timestamp(scanner: Scanner, segment: Segment, max_record: int) -> int | None:
    result = scanner.scan(segment.handle, segment.size, 0, segment.base_offset, 0, max_record)
    if result.count == 0:
        return None
    return result.infos[0].store_timestamp


def start_index(commitlog: CommitLog, checkpoint: Checkpoint, abnormal: bool,
                 max_record: int) -> int:
    """The index of the segment recovery's scan starts at (the last three after a clean stop;
    after a crash, the newest whose first record the checkpoint vouches for). Offline tools
    ask it too, so they say what recovery would do."""
    segments = commitlog.segments.segments
    if not abnormal:
        return max(0, len(segments) - 3)
    scanner = _backend.engine.scanner(1)
    safe = checkpoint.min_timestamp
    for index in range(len(segments) - 1, -1, -1):
        timestamp = _first_record_timestamp(scanner, segments[index], max_record)
        if timestamp is not None and 0 < timestamp <= safe:
            return index
    return 0


def recover(
    commitlog: CommitLog,
    queues: ConsumeQueueTable,
    dispatcher: Dispatcher,
    checkpoint: Checkpoint,
    *,
    abnormal: bool,
    check_crc: bool,
    max_record: int,
    skip_holes: bool = False,
    quarantine_dir: str = "",
) -> RecoveryReport:
    """Blocking: run before any service starts. With ``skip_holes``, a damaged record that
    intact records follow is replaced by filler and the scan goes on (see ``holes``)."""
    for queue in queues:
        queue.recover()
    segments = commitlog.segments.segments
    if not segments:
        queues.destroy_all()
        commitlog.set_end(0, zero_tail=False)
        dispatcher.start_at(0)
        return RecoveryReport(abnormal, 0, 0, 0, "empty store")

    index = start_index(commitlog, checkpoint, abnormal, max_record)
    start_offset = segments[index].base_offset
    flags = _backend.SCAN_CHECK_CRC if check_crc else 0
    if abnormal:
        flags |= _backend.SCAN_TAGS
        dispatcher.start_at(start_offset)
    scanner = _backend.engine.scanner(4096)
    end = start_offset
    records = 0
    reason = "end of log"
    holes: list[Hole] = []
    last_timestamp = 0
    position = 0
    while index < len(segments):
        segment = segments[index]
        while True:
            result = scanner.scan(segment.handle, segment.size, position, segment.base_offset,
                                  flags, max_record)
            records += result.count
            if result.count:
                last_timestamp = result.infos[result.count - 1].store_timestamp
            if abnormal:
                dispatcher.index(segment, result, mend=True)
            position = result.end
            if result.stop != _backend.STOP_FULL:
                break
        end = segment.base_offset + position
        if result.stop == _backend.STOP_BLANK or (
            result.stop == _backend.STOP_END and position == segment.size
        ):
            # The segment is done (its blank says the next record did not fit): the log
            # goes on at the next segment's base, whether or not that file exists. (It may
            # not: a recovery that deleted an empty or torn last segment, then died, left
            # a blank closing the last file; the end is still the segment's end, as it was
            # for the recovery that deleted it, not the blank's offset.)
            end = segment.base_offset + segment.size
            index += 1
            position = 0
            continue
        zeros = result.stop == _backend.STOP_BAD_MAGIC and result.size == 0
        if zeros:
            reason = "end of log"
        elif result.stop == _backend.STOP_PARTIAL:
            reason = f"torn record ({result.size} bytes declared) at the end of a segment"
        else:
            reason = f"{result.reason} (TOTALSIZE {result.size})"
        # Zeros in the last segment after a clean stop are the end the store wrote (no need
        # to read the rest of the segment); after a crash they may be a page that never
        # reached the disk while later pages did; anywhere else they are damage.
        if skip_holes and (abnormal or not zeros or index < len(segments) - 1):
            resume = find_resume(segments, index, position, flags=flags, max_record=max_record,
                                 min_timestamp=last_timestamp)
            if resume is not None:
                holes.append(fill_hole(
                    segment, position, resume, reason=reason, store_timestamp=last_timestamp,
                    store_host=commitlog.store_host, max_record=max_record,
                    quarantine_dir=quarantine_dir,
                ))
                reason = "end of log"
                if resume >= segment.end_offset:
                    index, position = index + 1, 0
                else:
                    position = resume - segment.base_offset
                continue
        break

    mended: list[str] = []
    for queue in queues:
        if queue.mended:
            # Entries a kill tore mid-copy, rewritten by the re-dispatch (RocketMQ keeps them)
            note = (f"{queue.topic}/{queue.queue_id}: {queue.mended} entries rewritten from "
                    f"their records (the first: {queue.first_mended})")
            log.warning("recovery: consume queue %s", note)
            mended.append(note)
            queue.mended, queue.first_mended = 0, ""
    if reason != "end of log":
        log.warning("recovery: commitlog ends at %d: %s; everything after it is discarded",
                    end, reason)
    commitlog.set_end(end, zero_tail=reason != "end of log")
    for queue in list(queues):
        if queue.max_physical_offset > end:
            queue.truncate_dirty(end)
            if queue.max_offset == queue.files.min_offset // CQ_ENTRY_SIZE:
                queues.remove(queue)  # every record it indexed is gone with the tail
    for hole in holes:
        for queue in queues:
            if queue.disagreement is None and queue.points_into(hole.start, hole.end):
                queue.disagreement = f"entries point into the damaged commitlog bytes {hole}"
    check_queues(commitlog, queues, max_record)
    if not abnormal:
        # RocketMQ resumes at the highest end over all queues, so a queue that lost its tail
        # is never rebuilt and its next put reuses a stored queue offset. Re-dispatching the
        # last segment as well costs one scan without CRC (entries already there are skipped
        # a run at a time) and rebuilds any queue whose tail is missing from it.
        last = commitlog.segments.last
        resume = max(queues.max_physical_offset(), commitlog.min_offset)
        dispatcher.start_at(min(resume, last.base_offset) if last is not None else resume)
    else:
        dispatcher.start_at(end)  # every valid record up to the end was indexed above
    return RecoveryReport(abnormal, start_offset, end, records, reason,
                          holes=tuple(str(hole) for hole in holes),
                          mended_queues=tuple(mended))


def check_queues(commitlog: CommitLog, queues: ConsumeQueueTable, max_record: int) -> None:
    """Check each consume queue against the records it points at: for every file, its first
    and its last entry must point at a whole record of this topic and queue id, of the
    entry's size, that carries the entry's queue offset as QUEUEOFFSET and its own position
    as PHYSICALOFFSET. A queue that fails is marked (``disagreement``) for the rebuild.
    Two record heads per file: cheap, and it finds a file zeroed or copied from elsewhere
    wherever it sits. Entries that point below the commitlog's first byte (deleted by
    retention) cannot be checked and are skipped."""
    scanner = _backend.engine.scanner(1)
    for queue in queues:
        if queue.disagreement is not None:
            continue
        topic = queue.topic.encode()
        for segment in queue.files.segments:
            count = segment.wrote_position // CQ_ENTRY_SIZE
            for index in sorted({0, count - 1}) if count else ():
                offset, size, _tags = CQ_ENTRY.unpack(
                    segment.read(index * CQ_ENTRY_SIZE, CQ_ENTRY_SIZE)
                )
                if size == CQ_BLANK_SIZE or offset < commitlog.min_offset:
                    continue
                queue_offset = segment.base_offset // CQ_ENTRY_SIZE + index
                problem = _entry_problem(commitlog, scanner, max_record, offset, size,
                                         topic, queue.queue_id, queue_offset)
                if problem is not None:
                    queue.disagreement = (
                        f"entry {queue_offset} (file {os.path.basename(segment.path)}) "
                        f"{problem}"
                    )
                    break
            if queue.disagreement is not None:
                break


def _entry_problem(commitlog: CommitLog, scanner: Scanner, max_record: int, offset: int,
                   size: int, topic: bytes, queue_id: int, queue_offset: int) -> str | None:
    segment = commitlog.segments.find(offset)
    if segment is None or size <= 0 or offset + size > min(commitlog.max_offset,
                                                           segment.wrote_offset):
        return f"points at {offset}+{size}, outside the commitlog"
    at = offset - segment.base_offset
    result = scanner.scan(segment.handle, at + size, at, segment.base_offset, 0, max_record)
    if result.count != 1:
        return f"points at {offset}, where no record of {size} bytes is ({result.reason})"
    info = result.infos[0]
    (physical,) = layout.INT64.unpack(segment.read(at + layout.PHYSICALOFFSET_AT, 8))
    found = (segment.read(info.topic_pos, info.topic_len), info.queue_id, info.queue_offset,
             physical)
    if found != (topic, queue_id, queue_offset, offset):
        return (
            f"points at the record at {offset} with topic {found[0]!r}, queue id {found[1]}, "
            f"queue offset {found[2]} and PHYSICALOFFSET {found[3]}"
        )
    return None


def rebuild_disagreeing_queues(commitlog: CommitLog, queues: ConsumeQueueTable,
                               dispatcher: Dispatcher) -> tuple[str, ...]:
    """Rebuild every consume queue marked as disagreeing with the commitlog, from the
    commitlog, after the dispatcher has indexed everything else up to its cursor.

    RocketMQ writes an entry whose queue offset lies past a queue's end at that end, so a
    zeroed file is "repaired" with entries at the wrong positions: a consumer at offset 0
    gets the message stored as offset N, the messages before it become unreachable, and the
    next put reuses a queue offset. Every record carries its QUEUEOFFSET, so the queue is
    rebuilt instead: its files are deleted and one scan of the retained commitlog writes
    each of its records' entries at its own position (blank fillers before the first record
    still retained, as for any queue that starts past 0). The scan reads record heads only;
    it costs one pass over the commitlog, once, when damage was found."""
    damaged = [queue for queue in queues if queue.disagreement is not None]
    if not damaged:
        return ()
    keys: set[tuple[str, int]] = set()
    notes: list[str] = []
    for queue in damaged:
        log.warning("recovery: consume queue %s disagrees with the commitlog (%s); rebuilding "
                    "it from the commitlog", queue.files.directory, queue.disagreement)
        notes.append(f"{queue.topic}/{queue.queue_id}: {queue.disagreement}")
        keys.add((queue.topic, queue.queue_id))
        queues.replace_empty(queue)
    scanned = dispatcher.reindex(keys, commitlog.min_offset, dispatcher.cursor)
    for topic, queue_id in sorted(keys):
        queue = queues.get(topic, queue_id)
        if queue is None:
            continue
        if not queue.files.segments:
            queues.remove(queue)  # the commitlog holds no record of it
            continue
        queue.arrivals.reset(queue.max_offset)
        # A gap found by the rebuild itself is in the commitlog (records lost to a hole):
        # its queue offsets read as removed, which is all there is to do.
        queue.disagreement = None
        log.warning("recovery: consume queue %s rebuilt: offsets %d..%d", queue.files.directory,
                    queue.min_offset, queue.max_offset)
    log.warning("recovery: rebuilt %d consume queue(s) from %d records of the commitlog",
                len(keys), scanned)
    return tuple(notes)
