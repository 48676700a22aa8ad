"""A StateStore in memory: the same versions and conflicts as the durable stores, no disk.

The controller's server is written against the ``StateStore`` protocol, and the durable
stores (the write-ahead journal, etcd) are separate modules. This one lets the server run and
be tested before and beside them, and is what ``controllerType=memory`` asks for: a
controller whose grants do not outlive its process (its brokers keep their ``brokerIdentity``
files, so a restarted memory controller refuses their ids until they are cleaned — use it for
tests and demonstrations only).

Its semantics are the protocol's, honestly: every key has a version that grows on each write
(a per-store counter, so a deleted and re-created key never reuses a version), a commit names
the version each key was read at (0: must not exist), and any mismatch fails the whole commit
with ``CommitConflict`` before anything is written. A store object outlives a server that
uses it, so a test can restart a controller "with the same store" in one process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs
import trio

from .state_store import CommitConflict, Versioned, Write

__all__ = ["MemoryStateStore"]


@attrs.define(eq=False)
class MemoryStateStore:
    """Versioned records in a dict; all-or-nothing conditional commits."""

    _records: dict[str, Versioned] = attrs.field(factory=dict[str, Versioned], init=False)
    _counter: int = attrs.field(default=0, init=False)
    #: commits that succeeded / failed with CommitConflict (for tests and statistics)
    commits: int = attrs.field(default=0, init=False)
    conflicts: int = attrs.field(default=0, init=False)

    async def load(self) -> Mapping[str, Versioned]:
        await trio.lowlevel.checkpoint()
        return dict(self._records)

    async def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        await trio.lowlevel.checkpoint()
        # Check every key first: nothing is written unless all of them match.
        for write in writes:
            current = self._records.get(write.key)
            version = 0 if current is None else current.version
            if version != write.expected_version:
                self.conflicts += 1
                raise CommitConflict(f"{write.key!r} is at version {version}, "
                                     f"not {write.expected_version}")
        keys = [w.key for w in writes]
        if len(set(keys)) != len(keys):
            raise CommitConflict(f"one commit writes a key twice: {sorted(keys)}")
        versions: dict[str, int] = {}
        for write in writes:
            if write.value is None:
                self._records.pop(write.key, None)
                continue
            self._counter += 1
            self._records[write.key] = Versioned(self._counter, bytes(write.value))
            versions[write.key] = self._counter
        self.commits += 1
        return versions
