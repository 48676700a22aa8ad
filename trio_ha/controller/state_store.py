"""Where a controller keeps what it granted: the one interface its rules commit through.

The controller's rules are a pure state machine (``rules``): a request read against the
current state gives a decision, and the decision's changes are the new records of the broker
sets it touched. Those records must be durable before the answer leaves, and two controllers
must never both grant from the same state (two masters for one epoch). Both needs are one
operation: *commit these records if none of them changed since I read them*.

- The write-ahead journal (the default, one controller) appends the records and fsyncs before
  ``commit`` returns; versions are its own counters.
- etcd (several controllers) does it as one transaction whose compares are the keys'
  ``mod_revision``: a controller that read a stale state loses the race with
  ``CommitConflict`` and reads again.

A key names one broker set (or the controller's own metadata); its value is opaque bytes
here (the rules encode and decode their records).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs

from .._errors import TrioHAError

__all__ = ["CommitConflict", "StateStore", "Versioned", "Write"]


@attrs.frozen
class Versioned:
    """A record as read: its bytes and the version a later write must name."""

    version: int
    value: bytes


@attrs.frozen
class Write:
    """One record to write: ``value`` None deletes it. ``expected_version`` is the version it
    was read at; 0 means "must not exist yet"."""

    key: str
    expected_version: int
    value: bytes | None


class CommitConflict(TrioHAError):
    """A record changed since it was read (another controller, or another request of this
    one, committed first): nothing of the commit was written; read again and decide again."""


class StateStore(Protocol):
    """Durable, versioned records with all-or-nothing conditional commits."""

    async def load(self) -> Mapping[str, Versioned]:
        """Every record, as of now."""
        ...

    async def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        """Write all of ``writes`` or none: raises ``CommitConflict`` if any key's version is
        not its ``expected_version``. Durable when it returns; the new version of each key
        written (deleted keys are absent)."""
        ...
