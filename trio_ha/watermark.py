"""Watermark: a value that only rises, and tasks that wait for it to reach an offset.

One primitive serves every "wait until the log reaches X" in the system: the flushed offset
(SYNC_FLUSH puts), the written offset (the dispatcher, replication writers, long polls), the
replicated offset (SYNC_MASTER puts), a queue's arrivals (long-polled pulls). RocketMQ builds
each of these from a thread that wakes every few milliseconds and re-checks a list; here a
rise wakes exactly the waiters it satisfies, as a prefix of a heap ordered by offset, and a
waiter that gives up (a cancel scope or deadline around ``wait_for``) simply leaves.

Waiters park their task directly (``wait_task_rescheduled``) rather than each making an
Event: the wait is on hot paths. A waiter that leaves is marked dead in place (O(1)) and
dropped when the heap is popped past it or, if dead entries pile up (long polls timing out on
an idle queue), compacted away.

A rise can also call listeners, synchronously: the group commit and group transfer services
answer the puts a rise covers from there (``sync_requests``), so those puts wake in the same
scheduling round as the rise, as a waiter would, instead of one task switch later.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any, TypeAlias

import attrs
import trio

_TARGET, _SEQ, _TASK = 0, 1, 2

#: a waiter: [target, sequence, task or None (left)]. A list and not a class so that heapq
#: orders entries in C (by target, then arrival) and a leaving waiter is marked in place; a
#: list's items cannot be typed one by one, hence Any.
_Waiter: TypeAlias = list[Any]


@attrs.frozen
class WatermarkStatistics:
    value: int
    waiters: int


@attrs.define(eq=False)
class Watermark:
    """A monotonically rising integer with ``await wait_for(target)``."""

    _value: int = 0
    #: heap of waiters, the lowest target first
    _waiters: list[_Waiter] = attrs.field(factory=list[_Waiter])
    _counter: itertools.count[int] = attrs.field(factory=itertools.count)
    _dead: int = 0
    #: called with the new value after every rise
    _listeners: list[Callable[[int], None]] = attrs.field(factory=list[Callable[[int], None]])

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
        while waiters and waiters[0][_TARGET] <= value:
            entry = heapq.heappop(waiters)
            task = entry[_TASK]
            if task is None:
                self._dead -= 1
            else:
                entry[_TASK] = None
                trio.lowlevel.reschedule(task)
        if self._listeners:
            for listener in self._listeners:
                listener(value)

    def add_listener(self, listener: Callable[[int], None]) -> None:
        """Call ``listener(value)`` after every rise, inside ``raise_to`` (so it must not
        block, and must not raise)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[int], None]) -> None:
        self._listeners.remove(listener)

    def reset(self, value: int) -> None:
        """Set the mark to ``value`` even if lower (recovery truncated the log). Waiters above
        the new value keep waiting; those at or below it wake."""
        if value >= self._value:
            self.raise_to(value)
        else:
            self._value = value

    def rewind(self, value: int) -> None:
        """Set the mark to ``value`` even if lower (a live store cut its log) and wake every
        waiter: each sees the new value, possibly below its target, and must look again.
        (``reset`` leaves waiters above the new value waiting for their old targets, which
        a log that grows again from a lower end may take long to reach.)"""
        if value >= self._value:
            self.raise_to(value)
            return
        self._value = value
        waiters, self._waiters, self._dead = self._waiters, [], 0
        for entry in waiters:
            task = entry[_TASK]
            if task is not None:
                entry[_TASK] = None
                trio.lowlevel.reschedule(task)

    async def wait_for(self, target: int) -> int:
        """Return once the mark is at least ``target`` (at once if it already is, after a
        checkpoint). Returns the mark's value at that moment."""
        if self._value >= target:
            await trio.lowlevel.checkpoint()
            return self._value
        entry: _Waiter = [target, next(self._counter), trio.lowlevel.current_task()]
        heapq.heappush(self._waiters, entry)

        def abort(_raise_cancel: object) -> trio.lowlevel.Abort:
            entry[_TASK] = None  # dead in place; popped or compacted later
            self._dead += 1
            if self._dead > 64 and self._dead * 2 > len(self._waiters):
                self._compact()
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)
        return self._value

    def _compact(self) -> None:
        self._waiters = [e for e in self._waiters if e[_TASK] is not None]
        heapq.heapify(self._waiters)
        self._dead = 0

    def statistics(self) -> WatermarkStatistics:
        return WatermarkStatistics(value=self._value, waiters=len(self._waiters) - self._dead)
