"""The sync thread: how written ranges of the commitlog become durable without the event loop
waiting on the interpreter's lock.

An msync blocks for a few hundred microseconds, so it cannot run on the event loop; it ran in
a trio worker thread (``trio.to_thread.run_sync``). That thread is a Python thread: it needs
the interpreter's lock to start the call and again to report back, and the event loop holds
that lock whenever it is running tasks. Under SYNC_FLUSH the loop is busy exactly then (the
puts of the next group, the slave's acks), so the handoffs cost more than the msync
(docs/performance.md has the figures).

The native engine has a thread of its own for this (``th_sync_thread_*`` in ``native/``): it
is told of a range under its own mutex, calls msync, and adds 1 to an eventfd, which the loop
waits on like any socket. Nothing on its side touches the interpreter. Ranges go one at a time
— the commitlog's flushes do already, under its flush lock.

A sync cannot be abandoned half-way: its segment must stay mapped until msync returns, and
the flushed watermark must not claim what is not synced. So a cancelled flush waits for the
range in progress (a shielded wait, as ``abandon_on_cancel=False`` did). Without the native
engine the ranges are synced in a trio worker thread, as before.
"""

from __future__ import annotations

import os

import attrs
import trio

import trio_ha._backend as _backend

from .segment import Segment, sync_ranges


@attrs.define(eq=False)
class SyncThread:
    """Syncs ``(segment, start, end)`` ranges, on the native sync thread when there is one."""

    _done_fd: int = -1
    _thread: _backend.NativeSyncThread | None = None

    @classmethod
    def start(cls) -> SyncThread:
        """The native sync thread with its eventfd, or the worker-thread fallback (the
        Python engine, or a system without eventfd: Linux only)."""
        if not hasattr(os, "eventfd"):
            return cls()
        done_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        try:
            thread = _backend.engine.start_sync_thread(done_fd)
        except BaseException:
            os.close(done_fd)
            raise
        if thread is None:
            os.close(done_fd)
            return cls()
        return cls(done_fd, thread)

    @property
    def native(self) -> bool:
        return self._thread is not None

    async def sync(self, work: list[tuple[Segment, int, int]]) -> None:
        """Make each range durable, in order; the caller holds the segments. Raises OSError
        if msync fails (the ranges before it are synced)."""
        thread = self._thread
        if thread is None:
            await trio.to_thread.run_sync(sync_ranges, work, abandon_on_cancel=False)
            return
        with trio.CancelScope(shield=True):
            for segment, start, end in work:
                if end > start:
                    thread.submit(segment.handle, start, end - start)
                    await self._wait_done(thread)

    async def _wait_done(self, thread: _backend.NativeSyncThread) -> None:
        while True:
            await trio.lowlevel.wait_readable(self._done_fd)
            try:
                os.eventfd_read(self._done_fd)
            except BlockingIOError:
                continue  # woken for nothing
            # The thread adds to the counter only once its range is finished (one range at
            # a time, every wake-up read here, shielded), so the result is ready.
            thread.result()
            return

    def close(self) -> None:
        """Stop the thread (after the range in progress, if any) and close the eventfd."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.stop()
        if self._done_fd >= 0:
            os.close(self._done_fd)
            self._done_fd = -1
