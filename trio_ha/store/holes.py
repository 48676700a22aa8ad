"""Holes: a damaged record inside the log with intact records after it (docs/formats.md,
'Recovery', step 3).

A process kill cannot leave one — appends are sequential and publish MAGIC last, so what a
kill tears is the tail — but a lost page at power failure (written back out of order under
ASYNC_FLUSH) or a flipped bit on the disk can: one record fails its checks and the records
after it are whole. Truncating there, as RocketMQ does, throws away every acknowledged
message after the damage. Recovery instead looks past the damage for the next record that
*chains* — it starts where its own PHYSICALOFFSET says, and it and the records after it
(up to ``CHAIN_CHECK`` of them) pass the scanner's checks (magic, sizes, CRC), carry their
own positions as PHYSICALOFFSET and never go back in store time, starting no earlier than the
last good record before the damage (so stale records of an earlier life of the file, which
RocketMQ leaves behind a cut, are not taken for new ones). When one is found, the damaged
bytes are copied to ``<storePathRootDir>/corrupt/`` and replaced by filler the format already
has: ROLLBACK-type records of the topic ``HOLE_TOPIC`` (every reader walks through them and
none indexes them: RocketMQ's dispatcher, ours and the Spark reader skip ROLLBACK records),
or the end-of-segment blank when the damage runs to the end of its segment. The damaged
record itself is never served: its bytes could not be verified.
"""

from __future__ import annotations

import contextlib
import logging
import os

import attrs

import trio_ha._backend as _backend

from ..wire import layout
from ..wire import record as rec
from .segment import Segment

log = logging.getLogger(__name__)

#: how many records after the damage must chain before recovery trusts them
CHAIN_CHECK = 16
#: the topic of the filler records that replace damaged bytes
HOLE_TOPIC = "TRIO_HA_RECOVERY_HOLE"
#: the property a filler record carries: "<first damaged offset>,<offset the log resumes at>"
HOLE_PROPERTY = "TRIO_HA_HOLE"
#: at most this many damaged bytes are kept in the quarantine file of one hole
QUARANTINE_LIMIT = 16 * 1024 * 1024

_MAGICS = (layout.MAGIC_V1.to_bytes(4, "big"), layout.MAGIC_V2.to_bytes(4, "big"))


@attrs.frozen
class Hole:
    #: commitlog offset of the first damaged byte, and where the log resumes
    start: int
    end: int
    #: what the scanner found at ``start``
    reason: str

    def __str__(self) -> str:
        return f"[{self.start}, {self.end}): {self.reason}"


def find_resume(segments: list[Segment], index: int, position: int, *, flags: int,
                max_record: int, min_timestamp: int) -> int | None:
    """The commitlog offset of the first record after ``position`` of ``segments[index]``
    that chains (see the module doc): in the same segment, or else the next segment's first
    record. None when there is none: the damage is the end of the log."""
    scanner = _backend.engine.scanner(CHAIN_CHECK)
    segment = segments[index]
    search = position + 1
    while (candidate := _next_magic(segment, search)) is not None:
        if _chains(scanner, segment, candidate, flags, max_record, min_timestamp):
            return segment.base_offset + candidate
        search = candidate + 1
    if index + 1 < len(segments):
        following = segments[index + 1]
        if _chains(scanner, following, 0, flags, max_record, min_timestamp):
            return following.base_offset
    return None


def _next_magic(segment: Segment, start: int) -> int | None:
    """The first position at or after ``start`` whose MAGIC field holds a record magic."""
    found = [segment.find(magic, start + layout.MAGIC_AT) for magic in _MAGICS]
    hits = [at - layout.MAGIC_AT for at in found if at >= 0]
    return min(hits) if hits else None


def _chains(scanner: _backend.Scanner, segment: Segment, position: int, flags: int, max_record: int,
            min_timestamp: int) -> bool:
    if position + rec.record_size(0, 0, 0) > segment.size:
        return False
    result = scanner.scan(segment.handle, segment.size, position, segment.base_offset, flags,
                          max_record)
    if result.count == 0:
        return False
    previous = min_timestamp
    for i in range(result.count):
        info = result.infos[i]
        at = info.phys_offset - segment.base_offset + layout.PHYSICALOFFSET_AT
        (physical,) = layout.INT64.unpack(segment.read(at, 8))
        if physical != info.phys_offset or info.store_timestamp < previous:
            return False
        previous = info.store_timestamp
    return True


def fill_hole(segment: Segment, position: int, resume: int, *, reason: str,
              store_timestamp: int, store_host: bytes, max_record: int,
              quarantine_dir: str) -> Hole:
    """Replace ``[position, resume - base)`` of ``segment`` (``resume`` may be the segment's
    end) with filler, after copying the damaged bytes to the quarantine directory; sync it.
    Blocking (recovery)."""
    hole = Hole(segment.base_offset + position, resume, reason)
    end = resume - segment.base_offset
    # The damage may be a hole of the file (a page that never reached the disk): its blocks
    # first, so a full disk is an OSError here, not SIGBUS at the filler's store.
    segment.reserve_to(end)
    _quarantine(segment, position, end, hole, quarantine_dir)
    if end == segment.size:
        blank = rec.encode_blank(segment.size - position)
        _publish(segment, position, blank)
    else:
        for at, record in _fillers(segment.base_offset, position, end, hole, store_timestamp,
                                   store_host, max_record):
            _publish(segment, at, record)
    segment.sync_range(position, end)
    log.error("recovery: damaged commitlog bytes %s replaced by filler (the records after them "
              "chain and are kept; the damaged bytes are in %s)", hole, quarantine_dir)
    return hole


def _publish(segment: Segment, at: int, record: bytes) -> None:
    """Write a record with its MAGIC last, as appends do: a crash in between leaves bytes no
    scan accepts, and the next recovery finds the same hole."""
    segment.write(at + layout.MAGIC_AT, bytes(4))
    segment.write(at, record[: layout.MAGIC_AT])
    segment.write(at + layout.MAGIC_AT + 4, record[layout.MAGIC_AT + 4 :])
    segment.write(at + layout.MAGIC_AT, record[layout.MAGIC_AT : layout.MAGIC_AT + 4])


def _fillers(base: int, start: int, end: int, hole: Hole, store_timestamp: int,
             store_host: bytes, max_record: int):
    """ROLLBACK records of HOLE_TOPIC that tile ``[start, end)`` exactly, none larger than
    ``max_record`` and none smaller than an empty one."""
    topic = HOLE_TOPIC.encode()
    properties = rec.encode_properties({HOLE_PROPERTY: f"{hole.start},{hole.end}"}).encode()
    smallest = rec.record_size(0, len(topic), len(properties))
    at = start
    while at < end:
        size = end - at
        if size > max_record:
            size = min(max_record, size - smallest)
        body = bytes(size - smallest)
        yield at, rec.encode_record(
            topic=topic, body=body, properties=properties, queue_id=0, flag=0,
            queue_offset=0, commitlog_offset=base + at,
            sys_flag=layout.TRANSACTION_ROLLBACK, born_timestamp=store_timestamp,
            born_host=store_host, store_timestamp=store_timestamp, store_host=store_host,
        )
        at += size


def _quarantine(segment: Segment, start: int, end: int, hole: Hole, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{hole.start:020d}-{hole.end:020d}")
    data = segment.read(start, min(end - start, QUARANTINE_LIMIT))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
