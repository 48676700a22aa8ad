"""Watermark: a value that only rises, and tasks that wait for it to reach an offset.

One primitive serves every "wait until the log reaches X" in the system: the flushed offset
(SYNC_FLUSH puts), the written offset (the dispatcher, replication writers, long polls), the
acked offset (SYNC_MASTER puts). RocketMQ builds each of these from a thread that wakes every
few milliseconds and re-checks a list; here a rise wakes exactly the waiters it satisfies, as a
prefix of a heap ordered by offset, and a waiter that gives up (a cancel scope or deadline
around ``wait_for``) simply leaves. Nothing polls.
"""

from __future__ import annotations

import heapq
import itertools

import attrs
import trio


@attrs.frozen
class WatermarkStatistics:
    value: int
    waiters: int


@attrs.define(eq=False)
class Watermark:
    """A monotonically rising integer with ``await wait_for(target)``."""

    _value: int = 0
    _waiters: list[tuple[int, int, trio.Event]] = attrs.field(factory=list)
    _counter: itertools.count = attrs.field(factory=itertools.count)

    @property
    def value(self) -> int:
        return self._value

    def raise_to(self, value: int) -> None:
        """Move the mark up to ``value`` (lower values are ignored) and wake whoever it
        satisfies. Synchronous, so it can be called from inside an append."""
        if value <= self._value:
            return
        self._value = value
        waiters = self._waiters
        while waiters and waiters[0][0] <= value:
            heapq.heappop(waiters)[2].set()

    def reset(self, value: int) -> None:
        """Set the mark to ``value`` even if lower (recovery truncated the log). Waiters above
        the new value keep waiting; those at or below it wake."""
        if value >= self._value:
            self.raise_to(value)
        else:
            self._value = value

    async def wait_for(self, target: int) -> int:
        """Return once the mark is at least ``target`` (at once if it already is, after a
        checkpoint). Returns the mark's value at that moment."""
        if self._value >= target:
            await trio.lowlevel.checkpoint()
            return self._value
        event = trio.Event()
        entry = (target, next(self._counter), event)
        heapq.heappush(self._waiters, entry)
        try:
            await event.wait()
        finally:
            if not event.is_set():
                # Cancelled or timed out: take our entry out so the heap does not grow.
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
        return self._value

    def statistics(self) -> WatermarkStatistics:
        return WatermarkStatistics(value=self._value, waiters=len(self._waiters))
