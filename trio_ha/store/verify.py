"""Checking a record before it is served (``checkCRCOnRead``, on by default).

RocketMQ serves pulled records without looking at them: a bit flipped on disk after
recovery, or a consume-queue entry that points at the wrong bytes, reaches the consumer as a
message. Here every record a pull, a lookup or VIEW_MESSAGE_BY_ID is about to serve goes
through the native scanner first — magic, TOTALSIZE and every declared length, BODYCRC — and
must carry its own position as PHYSICALOFFSET; a pull also checks that the record is the
one its consume-queue entry promised (topic, queue id, queue offset). A record that fails is
not served: the pull treats it as missing (OFFSET_FOUND_NULL, the consumer moves past it),
``statistics().unverified_reads`` counts it, and the log says so at most once every 10 s.

It costs one C call per record plus the CRC of its body (docs/performance.md has the figure;
docs/formats.md, 'Reading', the rules).
"""

from __future__ import annotations

import logging
import time

import attrs

import trio_ha._backend as _backend

from .._backend import Scanner
from ..wire import layout
from .segment import Segment

log = logging.getLogger(__name__)

#: at most one log line about unverified records per this many seconds
LOG_INTERVAL = 10.0


@attrs.define(eq=False)
class RecordVerifier:
    max_record: int
    #: records that failed their check and were not served
    failures: int = 0
    _scanner: Scanner = attrs.field(init=False, factory=lambda: _backend.engine.scanner(1))
    _last_log: float = attrs.field(init=False, default=float("-inf"))
    _suppressed: int = attrs.field(init=False, default=0)

    def problem(self, segment: Segment, at: int, record: bytes,
                expect: tuple[bytes, int, int] | None = None) -> str | None:
        """Why ``record``, the bytes at ``at`` in ``segment``, is not a record to serve
        (None: it is). ``expect``: the (topic, queue id, queue offset) a consume-queue entry
        promised."""
        size = len(record)
        result = self._scanner.scan(segment.handle, at + size, at, segment.base_offset,
                                    _backend.SCAN_CHECK_CRC, self.max_record)
        if result.count != 1 or result.end != at + size:
            return f"{result.reason} (TOTALSIZE {result.size})"
        (physical,) = layout.INT64.unpack_from(record, layout.PHYSICALOFFSET_AT)
        if physical != segment.base_offset + at:
            return f"PHYSICALOFFSET {physical}"
        if expect is not None:
            info = result.infos[0]
            topic, queue_id, queue_offset = expect
            if info.queue_offset != queue_offset or info.queue_id != queue_id or record[
                info.topic_pos - at : info.topic_pos - at + info.topic_len
            ] != topic:
                found = record[info.topic_pos - at : info.topic_pos - at + info.topic_len]
                return (f"the record is {found!r}/{info.queue_id} queue offset "
                        f"{info.queue_offset}, its entry is {topic!r}/{queue_id} queue offset "
                        f"{queue_offset}")
        return None

    def refused(self, offset: int, problem: str, where: str) -> None:
        """Count (and log, rate-limited) a record that was not served."""
        self.failures += 1
        now = time.monotonic()
        if now - self._last_log < LOG_INTERVAL:
            self._suppressed += 1
            return
        more = f" (and {self._suppressed} more in the last {LOG_INTERVAL:g} s)" \
            if self._suppressed else ""
        self._last_log, self._suppressed = now, 0
        log.error("record at commitlog offset %d (%s) failed its check and is not served: "
                  "%s%s", offset, where, problem, more)
