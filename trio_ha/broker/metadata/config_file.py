"""One table of broker metadata and its file: the state on the event loop, the writes in a
worker thread.

A manager's table lives on the event loop. Every change and every read is a plain synchronous
method called from a trio task, so nothing interleaves inside one (trio switches tasks only at
checkpoints) and no lock guards the table. Persisting is the only part that leaves the loop:
``persist()`` takes a snapshot of the table on the loop — copies of its dicts, whose values
are frozen — and hands it to a worker thread (``trio.to_thread.run_sync``) that encodes it and
replaces the file (``files.atomic_write``).

Two promises hold for each file:

- its writes never overlap: a ``trio.Lock`` (FIFO) admits one writer at a time, and a writer
  cannot be abandoned mid-write by a cancellation;
- the newest snapshot is the one that ends up on disk: a writer takes its snapshot only once
  it holds the lock, so every later writer's snapshot is at least as new.

``dirty`` is cleared when a snapshot is taken and set again if its write fails, so a change
made during a write, or lost with a failed one, is written by the next ``persist()`` — what
the broker's periodic ``persist_dirty()`` relies on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar

import attrs
import trio

from trio_ha.wire.metadata import DataVersion

from .files import atomic_write

__all__ = ["ConfigFile", "VersionedTable", "now_ms"]

#: what a manager's snapshot is (the frozen wrapper its file encodes)
S = TypeVar("S")
#: the values of a name-keyed table
V = TypeVar("V")


def now_ms() -> int:
    """Wall-clock milliseconds, as RocketMQ stamps a DataVersion."""
    return time.time_ns() // 1_000_000


@attrs.define(eq=False)
class ConfigFile(Generic[S]):
    """A table kept in one RocketMQ config file. Subclasses give the file's name and implement
    ``snapshot()`` (cheap copies, on the loop) and ``encode_snapshot()`` (pure, run in the
    worker thread)."""

    #: ``<config dir>/<file_name>``
    path: str
    _dirty: bool = attrs.field(default=False, init=False)
    _write_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False, repr=False)

    file_name: ClassVar[str]

    @property
    def dirty(self) -> bool:
        """True when the table changed since it was loaded or last persisted."""
        return self._dirty

    def snapshot(self) -> S:
        """A copy of the table that later changes cannot reach."""
        raise NotImplementedError

    @staticmethod
    def encode_snapshot(snapshot: S) -> bytes:
        """The file's bytes for ``snapshot``."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The file's bytes for the current table (what ``persist()`` writes)."""
        return self.encode_snapshot(self.snapshot())

    async def persist(self) -> None:
        """Write the table to its file, atomically, in a worker thread. Clears ``dirty``; on
        failure ``dirty`` is set again and the error propagates."""
        async with self._write_lock:
            await self._persist_locked()

    async def persist_if_dirty(self) -> bool:
        """``persist()`` if anything changed; returns whether it wrote. Callers that queued
        behind a writer which already wrote their change find nothing to do."""
        async with self._write_lock:
            if not self._dirty:
                return False
            await self._persist_locked()
            return True

    async def _persist_locked(self) -> None:
        snapshot = self.snapshot()
        self._dirty = False
        try:
            # Not abandoned on cancellation: the lock is held until the write has ended.
            await trio.to_thread.run_sync(self._write, snapshot, abandon_on_cancel=False)
        except BaseException:
            self._dirty = True
            raise

    def _write(self, snapshot: S) -> None:
        # In the worker thread: the snapshot is no longer shared with the loop.
        data = self.encode_snapshot(snapshot)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        atomic_write(self.path, data)


@attrs.define(eq=False)
class VersionedTable(ConfigFile[S], Generic[S, V]):
    """A config file holding a name-keyed table with a DataVersion that rises on every change
    (the name server and slaves compare versions to decide whether to take the table)."""

    _table: dict[str, V]
    _version: DataVersion
    #: milliseconds for DataVersion timestamps
    _clock: Callable[[], int] = attrs.field(default=now_ms, kw_only=True, alias="clock")

    def _bump(self) -> None:
        self._version = self._version.next_version(self._clock())
        self._dirty = True

    @property
    def data_version(self) -> DataVersion:
        return self._version

    def get(self, name: str) -> V | None:
        return self._table.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._table
