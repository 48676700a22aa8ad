"""Dispatch: build the consume queues from the commitlog (RocketMQ's ReputMessageService).

The dispatcher follows a cursor through the commitlog and, for every whole record below a
limit, writes its consume-queue entry. It does not care who wrote the bytes: on a master they
come from puts, on a slave from replication, during abnormal recovery from the disk. So a
record cut short at the limit is "wait for more" (a slave receives byte ranges, not records:
RocketMQ issue #9002), and only a record that is wrong in itself stops it with an error.

Entries of SCHEDULE_TOPIC_XXXX (delayed messages, one queue per delay level) hold the time the
message is due in their tags-code slot, not a tag hash, as RocketMQ's dispatcher writes them:
the record's store time plus its level's delay. The schedule service reads the due time from
the entry alone, so a level's queue is walked without reading a record that is not due.

The limit is a watermark: the written offset under ASYNC_FLUSH, the flushed offset under
SYNC_FLUSH (5.x's confirm offset), so a consumer never sees a message that a crash could
still take back. Records are found by the native scanner in batches, without reading bodies.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence, Set

import attrs
import trio

import trio_ha._backend as _backend

from .._backend import RecordInfo, Scanner, ScanResult
from ..ratelog import RateLimitedLog
from ..watermark import Watermark
from ..wire import record as rec
from ..wire.metadata import SCHEDULE_TOPIC
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable, is_valid_topic
from .health import RETRY_INTERVAL, describe
from .index import IndexService
from .segment import Segment

log = logging.getLogger(__name__)

SCAN_BATCH = 4096
#: the tags-code slot of a 20-byte consume-queue entry (at byte 12)
_TAGS_CODE = struct.Struct(">q")
# After a round, pause this long before the next (RocketMQ's reput sleeps 1 ms too): a lone
# message is indexed at once, a stream of appends is indexed in batches instead of waking the
# dispatcher for every record.
ROUND_PAUSE = 0.001
# ... unless the round indexed at least this many records: the appends come in groups already
# (a server round's sends, a group commit's flush, a batch), so the next group wakes the
# dispatcher, and the pause would only cost its timer. A trio timer ends in a Cancelled
# exception, raised and caught: a few per cent of a broker's CPU (docs/performance.md).
PAUSE_BELOW = 16
# A single dispatch round indexes at most this many records before yielding to the loop.
ROUND_BUDGET = 16384


@attrs.define(eq=False)
class Dispatcher:
    commitlog: CommitLog
    queues: ConsumeQueueTable
    max_record_size: int
    #: milliseconds of each delay level (level n at index n - 1): ``messageDelayLevel``
    delay_levels: tuple[int, ...] = ()
    #: the index files, fed with every batch dispatched (messageIndexEnable)
    indexer: IndexService | None = None
    cursor: int = 0
    #: everything below is indexed
    dispatched: Watermark = attrs.field(factory=Watermark)
    #: store timestamp of the last indexed record (checkpoint logicsMsgTimestamp)
    last_store_timestamp: int = 0
    #: set when a record is corrupt: the dispatcher stops there instead of guessing
    error: str | None = None
    #: why the last round could not write a consume-queue or index entry (ENOSPC, EMFILE: a
    #: state that passes, unlike ``error``); the round is tried again every RETRY_INTERVAL
    stalled: str | None = None
    #: how many rounds stalled so
    stalls: int = 0
    _log: RateLimitedLog = attrs.field(factory=lambda: RateLimitedLog(log))
    _scanner: Scanner = attrs.field(init=False, factory=lambda: _backend.engine.scanner(SCAN_BATCH))
    #: topic bytes as found in records -> the topic, or None for bytes that are no topic
    _topics: dict[bytes, str | None] = attrs.field(factory=dict[bytes, str | None])

    def start_at(self, offset: int) -> None:
        self.cursor = offset
        self.dispatched.reset(offset)

    def _topic(self, segment: Segment, info: RecordInfo) -> str | None:
        raw = segment.read(info.topic_pos, info.topic_len)
        if raw in self._topics:
            return self._topics[raw]
        try:
            text: str | None = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        topic = text if text is not None and is_valid_topic(text) else None
        if len(self._topics) < 100_000:
            self._topics[raw] = topic
        return topic

    def index(self, segment: Segment, result: ScanResult,
              only: Set[tuple[str, int]] | None = None, *, mend: bool = False) -> None:
        """Write the consume-queue entries of the records a scan found in ``segment`` (with
        ``only``, of those queues alone: a rebuild; with ``mend``, entries already there are
        compared with the records and rewritten where they differ: crash recovery).

        The engine groups the records into runs bound for one queue with consecutive queue
        offsets, other queues' records possibly between them, and lays out each run's 20-byte
        entries together: a batch of a thousand messages to one queue is one write here, not
        a thousand, and so are a thousand single sends that producers spread over a few
        queues (a write per queue, not per record)."""
        if not result.count:
            return
        queues = self.queues
        infos = result.infos
        runs, entries, order = _backend.engine.cq_runs(segment.handle, result)
        latest = -1
        for first, count, last_index, entry in runs:
            info = infos[first]
            topic = self._topic(segment, info)
            if topic is None or info.queue_id < 0:
                if only is None:
                    log.error(
                        "dispatch: record at %d has an invalid topic or queue id %d; "
                        "not indexed", info.phys_offset, info.queue_id,
                    )
                continue
            if only is not None and (topic, info.queue_id) not in only:
                continue
            last = infos[last_index]
            run = entries[entry * 20 : (entry + count) * 20]
            if topic == SCHEDULE_TOPIC:
                run = self._with_due_times(segment, infos, order[entry : entry + count], run)
            queue = queues.find_or_create(topic, info.queue_id)
            if mend:
                queue.mend_run(run, info.queue_offset)
            if not queue.unflushed_since:
                queue.unflushed_since = info.store_timestamp
            queue.put_run(
                run, info.queue_offset,
                info.phys_offset + info.size, last.phys_offset + last.size,
            )
            latest = max(latest, last_index)
        if only is None and latest >= 0:
            self.last_store_timestamp = infos[latest].store_timestamp
        if only is None and self.indexer is not None:
            self.indexer.add(segment, result)

    def _with_due_times(self, segment: Segment, infos: Sequence[RecordInfo],
                        records: Sequence[int], run: bytes | memoryview) -> bytes:
        """``run``'s entries with each delayed message's due time in the tags-code slot
        (RocketMQ's ``computeDeliverTimestamp``: a level above the highest counts as the
        highest; a level without a delay, one second). An entry whose DELAY property is
        missing or not a number keeps its tag hash."""
        patched = bytearray(run)
        levels = self.delay_levels
        for i, record in enumerate(records):
            info = infos[record]
            properties = rec.decode_properties(segment.read(info.props_pos, info.props_len))
            text = properties.get(rec.PROPERTY_DELAY_TIME_LEVEL, "")
            if not text.isdigit() or int(text) <= 0:
                continue
            level = min(int(text), len(levels))
            delay = levels[level - 1] if level else 1000
            _TAGS_CODE.pack_into(patched, i * 20 + 12, info.store_timestamp + delay)
        return bytes(patched)

    def reindex(self, only: Set[tuple[str, int]], start: int, end: int) -> int:
        """Index the records of the queues in ``only`` found in ``[start, end)`` of the
        commitlog, which is below the cursor (recovery's rebuild of queues that disagree
        with the commitlog). Synchronous. Returns how many records were scanned."""
        scanned = 0
        for segment, result in self.commitlog.scan_range(
                self._scanner, start, end, _backend.SCAN_TAGS, self.max_record_size):
            self.index(segment, result, only)
            scanned += result.count
        return scanned

    def dispatch_available(self, limit: int, budget: int = ROUND_BUDGET) -> int:
        """Index whole records in ``[cursor, limit)``, up to ``budget`` of them. Synchronous.
        Returns how many records were passed."""
        segments = self.commitlog.segments
        passed = 0
        while self.cursor < limit and passed < budget and self.error is None:
            segment = segments.find(self.cursor)
            if segment is None:
                if self.cursor < segments.min_offset:
                    log.warning(
                        "dispatch: cursor %d is below the commitlog start %d; jumping",
                        self.cursor, segments.min_offset,
                    )
                    self.cursor = segments.min_offset
                    continue
                break
            start = self.cursor - segment.base_offset
            end = min(segment.wrote_position, limit - segment.base_offset)
            if end <= start:
                break
            with segment.hold():
                result = self._scanner.scan(
                    segment.handle, end, start, segment.base_offset, _backend.SCAN_TAGS,
                    self.max_record_size,
                )
                try:
                    self.index(segment, result)
                except OSError as exc:
                    # No room for a consume-queue file or its blocks, or no descriptor to
                    # create it: stay at this batch (what was indexed of it is skipped as a
                    # repeat next time) and try again later; never end the store for it.
                    self._stalled(exc)
                    break
            if self.stalled is not None:
                log.warning("dispatch: consume queues writable again after %d stalled rounds "
                            "(%s)", self.stalls, self.stalled)
                self.stalled = None
                self._log.ended("stall")
            passed += result.count
            self.cursor = segment.base_offset + result.end
            stop = result.stop
            if stop == _backend.STOP_BLANK:
                self.cursor = segment.end_offset
            elif stop == _backend.STOP_PARTIAL:
                break  # the rest of the record is not there yet
            elif stop not in (_backend.STOP_END, _backend.STOP_FULL):
                self.error = (
                    f"corrupt commitlog record at offset {self.cursor}: {result.reason} "
                    f"(TOTALSIZE {result.size}); dispatch stopped there"
                )
                log.error("dispatch: %s", self.error)
        self.dispatched.raise_to(self.cursor)
        # On a slave nothing is put, so the commitlog learns its records' store times here
        # (RocketMQ sets physicMsgTimestamp at dispatch on a slave). The dispatcher lags the
        # log, so this errs old: crash recovery then starts a little earlier, never later.
        commitlog = self.commitlog
        if self.last_store_timestamp > commitlog.last_store_timestamp:
            commitlog.last_store_timestamp = self.last_store_timestamp
        return passed

    def _stalled(self, exc: OSError) -> None:
        self.stalls += 1
        self.stalled = f"cannot write a consume-queue or index entry: {describe(exc)}"
        self._log.log(logging.ERROR, "stall", "dispatch: %s; at commitlog offset %d, puts get "
                      "SERVICE_NOT_AVAILABLE until it can", self.stalled, self.cursor)

    async def run(
        self, limit: Watermark, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Follow ``limit`` for ever, indexing what appears below it."""
        task_status.started()
        while True:
            if self.stalled is not None:
                await trio.sleep(RETRY_INTERVAL)
            await limit.wait_for(self.cursor + 1)
            passed = self.dispatch_available(limit.value)
            if passed == 0 and self.cursor < limit.value:
                if self.stalled is not None:
                    continue
                # Nothing whole to index yet (a partial record) or stopped by an error:
                # wait for more bytes rather than spin.
                await limit.wait_for(limit.value + 1)
            elif passed < PAUSE_BELOW:
                await trio.sleep(ROUND_PAUSE)

    @property
    def behind_bytes(self) -> int:
        return max(0, self.commitlog.max_offset - self.cursor)
