"""The handle on the native sync thread (``th_sync_thread_*`` in native/files.c).

In a module of its own because two modules name it: the engine protocol (``start_sync_thread``
returns one) and the native engine (which makes it). In either of them, the two would import
each other.
"""

from __future__ import annotations

import errno
import os
from typing import Any


class NativeSyncThread:
    """The C sync thread (``th_sync_thread_*``): one range at a time; ``submit`` it, wait for
    the done eventfd, then ``result``. Each call is a short C call under the thread's mutex."""

    def __init__(self, lib: Any, thread: Any) -> None:
        self._lib = lib
        self._thread = thread

    def submit(self, handle: Any, start: int, length: int) -> None:
        """Start syncing ``[start, start + length)`` of the mapping ``handle`` (the native
        engine's ``Handle``, a cffi pointer: Any, as ``Handle`` is; not imported from the
        protocol, which imports this module); the caller keeps the mapping alive until
        ``result`` says it is done."""
        if self._thread is None:
            raise RuntimeError("the sync thread has stopped")
        rc = self._lib.th_sync_thread_submit(self._thread, handle + start, length)
        if rc < 0:
            raise RuntimeError("the sync thread is busy with another range")

    def result(self) -> None:
        """Raises BlockingIOError while the range is in progress, OSError if msync failed."""
        rc = self._lib.th_sync_thread_result(self._thread)
        if rc == -errno.EBUSY:
            raise BlockingIOError(errno.EBUSY, "the range is still being synced")
        if rc < 0:
            raise OSError(-rc, f"msync: {os.strerror(-rc)}")

    def stop(self) -> None:
        """Let the range in progress finish, then end the thread (idempotent)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._lib.th_sync_thread_stop(thread)
