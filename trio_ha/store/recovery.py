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
  idempotent); after a clean stop the dispatcher resumes from the queues' end, or from the
  start of the last segment if that is earlier, so a queue that lost its tail is rebuilt.

Nothing after the first invalid record is ever served, even if later bytes look valid.
"""

from __future__ import annotations

import logging

import attrs

from .. import _backend
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable
from .dispatch import Dispatcher

log = logging.getLogger(__name__)


@attrs.frozen
class RecoveryReport:
    abnormal: bool
    start_offset: int
    end_offset: int
    records: int
    stop_reason: str


def _first_record_timestamp(scanner, segment, max_record: int) -> int | None:
    result = scanner.scan(segment.handle, segment.size, 0, segment.base_offset, 0, max_record)
    if result.count == 0:
        return None
    return result.infos[0].store_timestamp


def _start_index(commitlog: CommitLog, checkpoint: Checkpoint, abnormal: bool,
                 max_record: int) -> int:
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
) -> RecoveryReport:
    """Blocking: run before any service starts."""
    for queue in queues:
        queue.recover()
    segments = commitlog.segments.segments
    if not segments:
        queues.destroy_all()
        commitlog.set_end(0, zero_tail=False)
        dispatcher.start_at(0)
        return RecoveryReport(abnormal, 0, 0, 0, "empty store")

    index = _start_index(commitlog, checkpoint, abnormal, max_record)
    start_offset = segments[index].base_offset
    flags = _backend.SCAN_CHECK_CRC if check_crc else 0
    if abnormal:
        flags |= _backend.SCAN_TAGS
        dispatcher.start_at(start_offset)
    scanner = _backend.engine.scanner(4096)
    end = start_offset
    records = 0
    reason = "end of log"
    while index < len(segments):
        segment = segments[index]
        position = 0
        while True:
            result = scanner.scan(segment.handle, segment.size, position, segment.base_offset,
                                  flags, max_record)
            records += result.count
            if abnormal:
                dispatcher.index(segment, result)
            position = result.end
            if result.stop != _backend.STOP_FULL:
                break
        end = segment.base_offset + position
        if result.stop == _backend.STOP_BLANK or (
            result.stop == _backend.STOP_END and position == segment.size
        ):
            index += 1
            if index < len(segments):
                end = segments[index].base_offset
            continue
        if result.stop == _backend.STOP_BAD_MAGIC and result.size == 0:
            reason = "end of log"
        elif result.stop == _backend.STOP_PARTIAL:
            reason = f"torn record ({result.size} bytes declared) at the end of a segment"
        else:
            reason = f"{result.reason} (TOTALSIZE {result.size})"
        break

    if reason != "end of log":
        log.warning("recovery: commitlog ends at %d: %s; everything after it is discarded",
                    end, reason)
    commitlog.set_end(end, zero_tail=reason != "end of log")
    for queue in queues:
        if queue.max_physical_offset > end:
            queue.truncate_dirty(end)
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
    return RecoveryReport(abnormal, start_offset, end, records, reason)
