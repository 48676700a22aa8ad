"""Answer: a value given once, later, that a task awaits or a callback receives.

Every guarantee the system waits for is answered this way: a SYNC_FLUSH or SYNC_MASTER put's
request to its service (``store.sync_requests``), and the reply of a send served in the
reader's round and answered when its slave acks (``remoting.connection``). One type, so the
waits compose: a put that needs both guarantees waits on both through ``wait_all`` or
``when_all``, and the broker turns a put's answer into a reply's with one callback.

Whoever answers calls ``set`` once (later calls are ignored and say so); from then on
``done`` is true and ``value`` holds it. There are two ways to listen, one of each at most,
because each answer has one owner: a task ``await``\\ s it (it parks directly, as a Watermark
waiter does, with no Event made per wait: every waiting put comes through here), or a caller
with no task to wait in registers ``when_done(callback)``, which runs inside ``set``, in the
answering task, so it must not raise. A callback takes no arguments: one that needs the value
reads it from the answer it was registered on (partials carry it), and the same callback can
then count several answers (``when_all``) without a wrapper per answer.

A task that is cancelled while it waits just stops listening; the answer is still given, to
nobody.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, Generic, TypeVar

import attrs
import trio

T = TypeVar("T")


@attrs.define(eq=False)
class Answer(Generic[T]):
    """A value given once (``set``), awaited by one task or received by one callback."""

    _value: T | None = attrs.field(init=False, default=None)
    #: the answer is given. A plain attribute and not a property over a private one: the
    #: puts' ``when_all`` reads it for every answer it waits on. Only ``set`` writes it.
    done: bool = attrs.field(init=False, default=False)
    _waiter: trio.lowlevel.Task | None = attrs.field(init=False, default=None)
    _callback: Callable[[], None] | None = attrs.field(init=False, default=None)

    @property
    def value(self) -> T:
        """The answer; only once ``done``."""
        if not self.done:
            raise RuntimeError("no answer yet")
        return self._value  # type: ignore[return-value]  # (set: a T, which may be None)

    def set(self, value: T) -> bool:
        """Give the answer, wake the waiting task and call the callback. False, changing
        nothing, if it was given already (the first answer counts)."""
        if self.done:
            return False
        self._value = value
        self.done = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            trio.lowlevel.reschedule(waiter)
        callback = self._callback
        if callback is not None:
            self._callback = None
            callback()
        return True

    def when_done(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the answer is given: now if it is, else from ``set``."""
        if self.done:
            callback()
            return
        if self._callback is not None:
            raise RuntimeError("an answer calls back one listener")
        self._callback = callback

    async def wait(self) -> T:
        """The answer, once given (after a checkpoint if it is already)."""
        if self.done:
            await trio.lowlevel.checkpoint()
        else:
            if self._waiter is not None:
                raise RuntimeError("another task is already waiting for this answer")
            self._waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._stop_listening)
        return self.value

    def __await__(self) -> Generator[Any, None, T]:
        return self.wait().__await__()

    def _stop_listening(self, _raise_cancel: object) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED


def when_all(answers: Sequence[Answer[Any] | None], callback: Callable[[], None]) -> None:
    """Call ``callback()`` once, when the last of ``answers`` is given (now, if all are).
    None entries are skipped: a caller passes what it may or may not be waiting for (a put's
    flush and replica answers). Waiting on one answer registers ``callback`` itself."""
    first = None
    for answer in answers:
        if answer is not None and not answer.done:
            if first is not None:
                _when_each(answers, callback)
                return
            first = answer
    if first is None:
        callback()
    else:
        first.when_done(callback)


def _when_each(answers: Sequence[Answer[Any] | None], callback: Callable[[], None]) -> None:
    """``when_all`` for two answers or more not given yet: count them down."""
    waiting = [answer for answer in answers if answer is not None and not answer.done]
    left = [len(waiting)]

    def one_given() -> None:
        left[0] -= 1
        if not left[0]:
            callback()

    for answer in waiting:
        answer.when_done(one_given)


async def wait_all(answers: Sequence[Answer[Any] | None]) -> None:
    """Return once every one of ``answers`` is given (None entries skipped, as in
    ``when_all``); each wait is a checkpoint."""
    for answer in answers:
        if answer is not None:
            await answer.wait()
