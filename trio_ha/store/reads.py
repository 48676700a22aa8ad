"""Reads: what a MessageStore serves from its consume queues, its commitlog and its index.

A pull reads a run of one queue (``read_queue``: the consume-queue entries and the records
they point at, decided together in one native call per segment); the admin and the
transaction and schedule services look records up by commitlog offset, by key (the index) or
by store time, and ask a queue its offsets. None of this changes the store: every read looks
only at mapped memory and at what readers may see (the confirmed end of the log), and each
record is checked before it is served (``verify``).

These are functions over the store rather than methods of it so that the store's module
keeps to how the store is put together and how a put goes; ``MessageStore`` binds each
public one as its method (``store.read_queue(...)``), which costs a call nothing. They see
the store through ``ReadableStore``, so this module does not import the store that holds it.
"""

from __future__ import annotations

from typing import Protocol

import trio

import trio_ha._backend as _backend

from ..config import StoreConfig
from ..watermark import Watermark
from ..wire import layout
from ..wire import record as rec
from ..wire.errors import RecordDecodeError
from .commitlog import CommitLog
from .consume_queue import ConsumeQueueTable, QueueEntry
from .index import IndexService
from .results import GetMessageResult, GetMessageStatus, QueryMessageResult
from .segment import Segment
from .verify import RecordVerifier

#: read_queue without max_bytes
_NO_BYTE_LIMIT = 2**63 - 1
#: a read's status from the last entry a gather could not serve
_GATHER_STATUS = {
    _backend.GATHER_REMOVED: GetMessageStatus.MESSAGE_WAS_REMOVING,
    _backend.GATHER_ABSENT: GetMessageStatus.OFFSET_FOUND_NULL,
    _backend.GATHER_INVALID: GetMessageStatus.OFFSET_FOUND_NULL,
}
#: enough of a record's head to reach STORETIMESTAMP, whichever host kinds SYSFLAG chooses
_STORE_TIMESTAMP_HEAD = layout.store_timestamp_at(layout.SYSFLAG_BORNHOST_V6) + 8


class ReadableStore(Protocol):
    """What the reads use of the MessageStore: its files, what readers may see of the log,
    its index, and how it checks records."""

    @property
    def config(self) -> StoreConfig: ...

    @property
    def commitlog(self) -> CommitLog: ...

    @property
    def queues(self) -> ConsumeQueueTable: ...

    @property
    def confirmed(self) -> Watermark: ...

    @property
    def index(self) -> IndexService | None: ...

    @property
    def verifier(self) -> RecordVerifier | None: ...

    @property
    def gatherer(self) -> _backend.Gatherer: ...


def max_queue_offset(store: ReadableStore, topic: str, queue_id: int) -> int:
    queue = store.queues.get(topic, queue_id)
    return queue.max_offset if queue is not None else 0


def min_queue_offset(store: ReadableStore, topic: str, queue_id: int) -> int:
    queue = store.queues.get(topic, queue_id)
    return queue.min_offset if queue is not None else 0


def topics(store: ReadableStore) -> set[str]:
    return {topic for topic, _ in store.queues.queues}


def _record_at(store: ReadableStore, offset: int, size: int | None = None,
               expect: tuple[bytes, int, int] | None = None) -> bytes | None:
    """The bytes of the record at ``offset``, if one that readers may see is there —
    checked first (``checkCRCOnRead``, see ``verify``). ``expect``: the (topic, queue
    id, queue offset) a consume-queue entry promised; a record that fails then is
    counted and logged as unverified, not only missing."""
    limit = store.confirmed.value
    segment = store.commitlog.segments.find(offset)
    if segment is None or offset + 8 > limit or offset < store.commitlog.min_offset:
        return None
    at = offset - segment.base_offset
    if size is None:
        size = int(layout.RECORD_START.unpack(segment.read(at, layout.RECORD_START.size))[0])
    if size <= 0 or offset + size > min(limit, segment.wrote_offset):
        return None
    record = segment.read(at, size)
    if store.verifier is not None:
        problem = store.verifier.problem(segment, at, record, expect)
        if problem is not None:
            if expect is not None:
                store.verifier.refused(
                    offset, problem,
                    f"{expect[0].decode(errors='replace')}/{expect[1]} queue offset "
                    f"{expect[2]}",
                )
            return None
    return record


def _decode_at(
    store: ReadableStore, offset: int, size: int | None = None
) -> rec.StoredMessage | None:
    record = _record_at(store, offset, size)
    if record is None:
        return None
    try:
        return rec.decode_record(record)
    except RecordDecodeError:
        return None


def record_bytes(store: ReadableStore, commitlog_offset: int) -> bytes | None:
    """The raw record at ``commitlog_offset`` if it is a whole, valid record (for
    VIEW_MESSAGE_BY_ID, whose response body is the record unchanged)."""
    record = _record_at(store, commitlog_offset)
    if record is None:
        return None
    try:
        rec.decode_record(record)
    except RecordDecodeError:
        return None
    return record


def queue_entries(
    store: ReadableStore, topic: str, queue_id: int, queue_offset: int, max_count: int
) -> list[QueueEntry]:
    """Up to ``max_count`` consume-queue entries of (topic, queue) from ``queue_offset``
    (fewer at the end of a consume-queue file; none past the queue's end): where each
    message is in the commitlog, and its tags code (a delayed message's due time)."""
    queue = store.queues.get(topic, queue_id)
    if queue is None or queue_offset < queue.min_offset or queue_offset >= queue.max_offset:
        return []
    return queue.entries(queue_offset, min(max_count, queue.max_offset - queue_offset))


def queue_arrivals(store: ReadableStore, topic: str, queue_id: int) -> Watermark:
    """Rises with the queue's max offset: ``await queue_arrivals(t, q).wait_for(n + 1)``
    returns once message ``n`` is there (long polling)."""
    return store.queues.arrivals(topic, queue_id)


def read_queue(
    store: ReadableStore,
    topic: str,
    queue_id: int,
    queue_offset: int,
    max_count: int,
    *,
    max_bytes: int | None = None,
    tag_codes: frozenset[int] | None = None,
    raw: bool = False,
) -> GetMessageResult:
    """Messages of one queue from ``queue_offset`` with RocketMQ's GetMessageStatus and
    next offset. Synchronous: it reads only mapped memory.

    ``tag_codes`` keeps only entries whose tag hash is in the set (RocketMQ filters by
    hash here; the exact tag is checked by whoever reads the record). With ``raw`` the
    result holds each record's bytes unchanged (what a pull response carries) in
    ``records`` instead of decoded ``messages``, and in ``spans`` with adjacent records
    merged: views of the mapped segments, not copies (see GetMessageResult).

    Each record is checked before it is served (``verify``), in C, together with the
    consume-queue entry that points at it: one native call decides a run of entries."""
    queue = store.queues.get(topic, queue_id)
    if queue is None:
        return GetMessageResult(GetMessageStatus.NO_MATCHED_LOGIC_QUEUE)
    low, high = queue.min_offset, queue.max_offset
    if high == 0:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, (), 0, low, high)
    if queue_offset < low:
        return GetMessageResult(GetMessageStatus.OFFSET_TOO_SMALL, (), low, low, high)
    if queue_offset == high:
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_ONE, (), high, low, high)
    if queue_offset > high:
        return GetMessageResult(
            GetMessageStatus.OFFSET_OVERFLOW_BADLY, (), low if low == 0 else high, low, high
        )
    verifier = store.verifier
    gatherer = store.gatherer
    flags = _backend.GATHER_VERIFY if verifier is not None else 0
    max_record = verifier.max_record if verifier is not None else layout.INT32_MAX
    codes = None if tag_codes is None else tuple(tag_codes)
    byte_limit = max_bytes if max_bytes is not None else _NO_BYTE_LIMIT
    limit = store.confirmed.value
    commitlog_min = store.commitlog.min_offset
    segments = store.commitlog.segments
    topic_bytes = topic.encode()
    # the records (``raw``) or the decoded messages found: ``found`` is whichever this read fills
    records: list[memoryview] = []
    messages: list[rec.StoredMessage] = []
    found: list[memoryview] | list[rec.StoredMessage] = records if raw else messages
    spans: list[tuple[Segment, int, int]] = []  # (segment, position, length)
    next_offset = queue_offset
    total = 0
    last_commitlog_offset = -1
    status = GetMessageStatus.NO_MATCHED_MESSAGE
    # RocketMQ scans at most max(16000 bytes, maxMsgNums * 20) of consume queue per pull.
    budget = max(800, max_count)
    while len(found) < max_count and next_offset < high and budget > 0:
        entries = queue.entry_bytes(next_offset, min(budget, max_count - len(found) + 64))
        if not entries:
            break
        # The segment of the first entry's record; the gather stops where the next one is.
        segment = segments.find(layout.INT64.unpack_from(entries)[0])
        if segment is None:
            segment = segments.segments[-1] if segments.segments else None
        if segment is None:
            break  # no commitlog at all: nothing a consume queue points at is readable
        result = gatherer.gather(
            segment.handle, segment.size, segment.base_offset, commitlog_min,
            min(limit, segment.wrote_offset), entries, codes, topic_bytes, queue_id,
            next_offset, flags, max_record, max_count - len(found), byte_limit, total,
        )
        looked = result.entries
        if looked == 0 and result.stop == _backend.GATHER_SEGMENT:
            # Its record is in no segment (past the log's end): missing.
            status = GetMessageStatus.OFFSET_FOUND_NULL
            looked = 1
        elif result.problems:
            status = _GATHER_STATUS[result.last_problem]
            if verifier is not None and _backend.GATHER_INVALID in result.outcomes:
                _report_unverified(store, verifier, segment, entries, result.outcomes,
                                        topic_bytes, queue_id, next_offset)
        if result.found:
            whole = segment.view()
            if raw:
                records.extend(whole[at : at + size] for at, size in result.records)
                gathered = result.spans
                if spans and spans[-1][0] is segment and sum(spans[-1][1:]) == gathered[0][0]:
                    # the run goes on across a consume-queue file: one span still
                    spans[-1] = (segment, spans[-1][1], spans[-1][2] + gathered[0][1])
                    gathered = gathered[1:]
                spans.extend((segment, at, size) for at, size in gathered)
            else:
                for at, size in result.records:
                    try:
                        messages.append(rec.decode_record(whole[at : at + size]))
                    except RecordDecodeError:
                        status = GetMessageStatus.OFFSET_FOUND_NULL
            total += result.bytes
            last_commitlog_offset = result.last_phys
        next_offset += looked
        budget -= looked
        if result.stop in (_backend.GATHER_COUNT, _backend.GATHER_BYTES):
            break
    if found:
        status = GetMessageStatus.FOUND
    if raw:
        views = tuple(segment.view(at, at + size) for segment, at, size in spans)
        return GetMessageResult(status, (), next_offset, low, high, tuple(records),
                                last_commitlog_offset, views)
    return GetMessageResult(status, tuple(messages), next_offset, low, high, (),
                            last_commitlog_offset)


def _report_unverified(store: ReadableStore, verifier: RecordVerifier, segment: Segment,
                       entries: bytes,
                       outcomes: bytes, topic: bytes, queue_id: int,
                       first_queue_offset: int) -> None:
    """Count and log the records a gather refused, with why (the slow check says)."""
    for i, outcome in enumerate(outcomes):
        if outcome != _backend.GATHER_INVALID:
            continue
        offset, size, _ = layout.CQ_ENTRY.unpack_from(entries, i * layout.CQ_ENTRY_SIZE)
        at = offset - segment.base_offset
        problem = verifier.problem(segment, at, segment.read(at, size),
                                   (topic, queue_id, first_queue_offset + i))
        verifier.refused(
            offset, problem or "it changed while being read",
            f"{topic.decode(errors='replace')}/{queue_id} queue offset "
            f"{first_queue_offset + i}",
        )


async def get_messages(
    store: ReadableStore,
    topic: str,
    queue_id: int,
    queue_offset: int,
    max_count: int = 32,
    *,
    max_bytes: int | None = None,
) -> list[rec.StoredMessage]:
    """Up to ``max_count`` decoded messages of (topic, queue) from ``queue_offset``."""
    await trio.lowlevel.checkpoint()
    return list(
        read_queue(store, topic, queue_id, queue_offset, max_count, max_bytes=max_bytes).messages
    )


def query_message(
    store: ReadableStore, topic: str, key: str, max_num: int, begin: int, end: int
) -> QueryMessageResult:
    """The records of ``topic`` whose UNIQ_KEY or one of whose KEYS is ``key``, stored in
    [begin, end] (ms since the epoch), newest first, at most ``max_num`` (and
    maxMsgsNumBatch). The index may name records of other keys with the same hash and
    records since removed: only whole, valid records of this topic and key are
    returned (RocketMQ leaves that filter to the client)."""
    if store.index is None:
        return QueryMessageResult([], 0, 0)
    max_num = min(max_num, store.config.max_msgs_num_batch)
    found = store.index.query(topic, key, max_num, begin, end)
    records: list[bytes] = []
    for offset in found.phy_offsets:
        record = _record_at(store, offset)
        if record is None:
            continue
        try:
            message = rec.decode_record(record)
        except RecordDecodeError:
            continue
        if message.topic == topic and (
            key in message.keys
            or message.properties.get(rec.PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX) == key
        ):
            records.append(record)
    return QueryMessageResult(records, found.index_last_update_timestamp,
                              found.index_last_update_phy_offset)


async def look_message_by_offset(
    store: ReadableStore, commitlog_offset: int
) -> rec.StoredMessage | None:
    """The record starting at ``commitlog_offset``, or None if no valid record starts
    there."""
    await trio.lowlevel.checkpoint()
    return _decode_at(store, commitlog_offset)


def _store_timestamp_at(store: ReadableStore, commitlog_offset: int) -> int | None:
    segment = store.commitlog.segments.find(commitlog_offset)
    if segment is None:
        return None
    head = segment.read(commitlog_offset - segment.base_offset, _STORE_TIMESTAMP_HEAD)
    if len(head) < layout.SYSFLAG_AT + 4:
        return None
    if len(head) < layout.store_timestamp_at(layout.read_sys_flag(head)) + 8:
        return None
    return layout.read_store_timestamp(head)


def get_offset_in_queue_by_time(
    store: ReadableStore, topic: str, queue_id: int, timestamp: int
) -> int:
    """The first queue offset whose message was stored at or after ``timestamp`` (ms);
    the queue's max offset when every message is older. Binary search: store times
    rise with commitlog offset, so they rise along a queue too."""
    queue = store.queues.get(topic, queue_id)
    if queue is None:
        return 0
    low, high = queue.min_offset, queue.max_offset
    while low < high:
        middle = (low + high) // 2
        entry = queue.entry(middle)
        stamp = None if entry is None else _store_timestamp_at(store, entry.commitlog_offset)
        if stamp is None or stamp < timestamp:
            low = middle + 1
        else:
            high = middle
    return low


def get_message_store_timestamp(
    store: ReadableStore, topic: str, queue_id: int, queue_offset: int
) -> int | None:
    queue = store.queues.get(topic, queue_id)
    entry = queue.entry(queue_offset) if queue is not None else None
    return None if entry is None else _store_timestamp_at(store, entry.commitlog_offset)


def get_earliest_message_time(store: ReadableStore, topic: str, queue_id: int) -> int | None:
    first = min_queue_offset(store, topic, queue_id)
    return get_message_store_timestamp(store, topic, queue_id, first)
