"""The epoch history of a store: which controller epoch wrote which stretch of the commitlog.

In RocketMQ 5's controller mode every master term has an epoch number, and a store records
where each epoch it knows of began (``EpochEntry``: epoch, start offset; an entry ends where
the next one begins, the last one at the store's max offset). Two stores compare their
histories to find the offset up to which their logs must agree (``find_consistent_point``):
a slave truncates to it before it copies from a new master, so a tail that only an old master
wrote never survives next to a log that went on without it.

``EpochCache`` is that history as a pure value-holder (no I/O, no trio): the rules of
RocketMQ 5.3.3's ``EpochFileCache``, its refusals included (``append``: an epoch that starts
where the last one starts is refused, as RocketMQ refuses it; docs/differences.md weighs the
alternatives).
``EpochFile`` is the same history on disk, in RocketMQ's text format
(``<count>\\n<crc>\\n<epoch>-<start>\\n...``, docs/formats.md 'Epoch file'), read with the
``.bak`` fall-back RocketMQ has, and written crash-safely, which RocketMQ 5.3.3 does not do
(it overwrites the file in place without an fsync).

Everything on ``EpochFile`` blocks on the file system: call it from a worker thread.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Sequence

import attrs

from ..._durable import fsync_dir, replace_synced
from ..._errors import TrioHAError

__all__ = [
    "EPOCH_FILE_NAME",
    "HANDSHAKE_MAX_ENTRIES",
    "EpochCache",
    "EpochEntry",
    "EpochFile",
    "EpochFileError",
    "decode_epoch_file",
    "encode_epoch_file",
]

#: ``<storePathRootDir>/epochFileCheckpoint`` unless storePathEpochFile says otherwise
EPOCH_FILE_NAME = "epochFileCheckpoint"
#: the most entries a master's handshake reply carries: RocketMQ's reply buffer holds 1000
#: (12 bytes each) and overflows past them
HANDSHAKE_MAX_ENTRIES = 1000

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1


class EpochFileError(TrioHAError):
    """An epoch file (and its ``.bak``) cannot be read, or an entry does not fit the format.
    The message names the file(s) and why."""


@attrs.frozen
class EpochEntry:
    """Epoch ``epoch`` began at commitlog offset ``start_offset``."""

    epoch: int
    start_offset: int


@attrs.define(eq=False)
class EpochCache:
    """A store's epochs, oldest first: epochs strictly rise, start offsets never fall (and
    rise between entries this appends; a file RocketMQ reads may hold equal ones).

    Pure: it changes only the list it holds. Whoever owns it writes it out (``EpochFile``)."""

    _entries: list[EpochEntry] = attrs.field(factory=list[EpochEntry], alias="entries")

    @property
    def entries(self) -> tuple[EpochEntry, ...]:
        return tuple(self._entries)

    @property
    def last_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def last_epoch(self) -> int:
        """The newest epoch, or -1 without one (RocketMQ's ``lastEpoch``)."""
        return self._entries[-1].epoch if self._entries else -1

    def __len__(self) -> int:
        return len(self._entries)

    def end_of(self, index: int, max_offset: int) -> int:
        """Where entry ``index`` ends: the next entry's start, or ``max_offset`` (the store's)
        for the last one."""
        if index + 1 < len(self._entries):
            return self._entries[index + 1].start_offset
        return max_offset

    def entry_at(self, epoch: int) -> EpochEntry | None:
        return next((e for e in self._entries if e.epoch == epoch), None)

    def append(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` begins at ``start_offset``; False (nothing changed) unless
        both are larger than the last entry's (RocketMQ's ``appendEntry``).

        So a master elected again before it wrote anything keeps its last epoch, and its
        file lags the controller's epoch until it writes, exactly as a RocketMQ broker's
        does: its frames carry that epoch, and the slaves' files, RocketMQ's included, agree
        with it. Recording the empty epoch, or replacing the last entry with it, makes the
        histories of mixed broker sets differ, and replacing can leave a slave with nothing
        in common (docs/differences.md). The caller says so in its log."""
        if not 0 <= epoch <= _INT32_MAX or not 0 <= start_offset <= _INT64_MAX:
            raise ValueError(f"epoch {epoch} at {start_offset}: out of the file's range")
        last = self.last_entry
        if last is not None and (epoch <= last.epoch or start_offset <= last.start_offset):
            return False
        self._entries.append(EpochEntry(epoch, start_offset))
        return True

    def truncate_from(self, offset: int) -> bool:
        """Drop the entries that start at or after ``offset`` (the log was cut there);
        whether any went (RocketMQ's ``truncateSuffixByOffset``)."""
        kept = [e for e in self._entries if e.start_offset < offset]
        changed = len(kept) != len(self._entries)
        self._entries[:] = kept
        return changed

    def truncate_from_epoch(self, epoch: int) -> bool:
        """Drop the entries of ``epoch`` and later (a new master whose file already names
        its epoch or a later one: RocketMQ's ``truncateSuffixByEpoch``)."""
        kept = [e for e in self._entries if e.epoch < epoch]
        changed = len(kept) != len(self._entries)
        self._entries[:] = kept
        return changed

    def expire_before(self, min_offset: int) -> bool:
        """Drop the entries that end before ``min_offset``, the log's new first byte, once
        older segments were deleted. The last entry never goes: its end is the log's end.
        (RocketMQ: ``truncatePrefixByOffset(minPhyOffset - 1)`` drops ends <= min - 1.)"""
        entries = self._entries
        drop = 0
        while drop < len(entries) - 1 and entries[drop + 1].start_offset < min_offset:
            drop += 1
        del entries[:drop]
        return drop > 0

    def find_consistent_point(self, master_entries: Sequence[EpochEntry], master_max: int,
                              local_max: int) -> int:
        """The offset up to which this (the slave's) log and the master's agree, or -1.

        RocketMQ 5.3.3's ``EpochFileCache.findConsistentPoint``: the last entries end at each
        side's max offset; walk the local epochs newest first, and at the first one the
        master also has with the same start, the point is the lesser of the two ends."""
        by_epoch: dict[int, tuple[int, int]] = {}
        for index, entry in enumerate(master_entries):
            end = (master_entries[index + 1].start_offset if index + 1 < len(master_entries)
                   else master_max)
            by_epoch[entry.epoch] = (entry.start_offset, end)
        for index in range(len(self._entries) - 1, -1, -1):
            local = self._entries[index]
            theirs = by_epoch.get(local.epoch)
            if theirs is not None and theirs[0] == local.start_offset:
                return min(self.end_of(index, local_max), theirs[1])
        return -1

    def newest(self, limit: int = HANDSHAKE_MAX_ENTRIES) -> tuple[EpochEntry, ...]:
        """The newest ``limit`` entries, oldest first: what a master's handshake reply
        carries. (RocketMQ sends them all and overflows its buffer past 1000; the newest
        are the ones a consistent point is found among.)"""
        return tuple(self._entries[-limit:]) if limit > 0 else ()


# ---- the file format --------------------------------------------------------------------


def _crc(text: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: CRC32 with the sign bit cleared."""
    return zlib.crc32(text) & 0x7FFFFFFF


def encode_epoch_file(entries: Iterable[EpochEntry]) -> bytes:
    """The bytes of an epoch file holding ``entries``, as RocketMQ's ``CheckpointFile.write``
    makes them on Linux (its line separator is the platform's)."""
    lines = b"".join(b"%d-%d\n" % (e.epoch, e.start_offset) for e in entries)
    count = lines.count(b"\n")
    return b"%d\n%d\n" % (count, _crc(lines)) + lines


def decode_epoch_file(data: bytes) -> list[EpochEntry]:
    """The entries of an epoch file; ValueError saying what is wrong.

    As RocketMQ reads it: line 1 the count, line 2 the CRC over the entry lines (each with
    its newline; 0: not checked), then ``<epoch>-<start>`` lines. Stricter than RocketMQ in
    one way: a line that is not an entry is an error here (RocketMQ skips it and then
    usually fails on the count)."""
    if not data:
        raise ValueError("the file is empty")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise ValueError("the file is not text") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if len(lines) < 2:
        raise ValueError("the count and CRC lines are missing")
    try:
        count, crc = int(lines[0]), int(lines[1])
    except ValueError:
        raise ValueError(f"the count and CRC lines are not numbers: {lines[:2]!r}") from None
    entries: list[EpochEntry] = []
    for line in lines[2:]:
        epoch, dash, start = line.partition("-")
        if not dash or not epoch.isdigit() or not start.isdigit():
            raise ValueError(f"line {line!r} is not <epoch>-<startOffset>")
        entry = EpochEntry(int(epoch), int(start))
        if entry.epoch > _INT32_MAX or entry.start_offset > _INT64_MAX:
            raise ValueError(f"line {line!r} is out of range (an int epoch, a long offset)")
        if entries and (entry.epoch <= entries[-1].epoch
                        or entry.start_offset < entries[-1].start_offset):
            raise ValueError(f"line {line!r} is out of order after {entries[-1]}")
        entries.append(entry)
    if count != len(entries):
        raise ValueError(f"it says {count} entries, but holds {len(entries)}")
    body = "".join(line + "\n" for line in lines[2:]).encode("ascii")
    if crc != 0 and crc != _crc(body):
        raise ValueError(f"its CRC {crc} does not match its entries' {_crc(body)}")
    return entries


# ---- the file ---------------------------------------------------------------------------


@attrs.define(eq=False)
class EpochFile:
    """A store's epoch history and the file it lives in (``path`` and ``path + ".bak"``).

    Change the history through the methods here: each one that changes it writes the file
    before it returns, so what a store answers about its epochs is what a restart finds."""

    path: str
    cache: EpochCache = attrs.field(factory=EpochCache)

    @property
    def bak_path(self) -> str:
        return self.path + ".bak"

    @classmethod
    def load(cls, path: str) -> EpochFile:
        """The history at ``path``: the file's, or its ``.bak``'s when the file is missing,
        empty, holds no entries, or is broken (as RocketMQ reads it); an empty history when
        neither exists. EpochFileError, naming both files, when the file is broken and the
        ``.bak`` cannot stand in for it."""
        main, main_error = _read_entries(path)
        if main:
            return cls(path, EpochCache(main))
        bak, bak_error = _read_entries(path + ".bak")
        if bak_error is not None or (main_error is not None and bak is None):
            why = main_error or ("no entries" if main is not None else "missing")
            raise EpochFileError(
                f"cannot read the epoch file {path} ({why}) nor its backup {path}.bak "
                f"({bak_error or 'missing'})"
            )
        return cls(path, EpochCache(bak or []))

    def append(self, epoch: int, start_offset: int) -> bool:
        """``EpochCache.append``, written out when it changed something."""
        return self._saved(self.cache.append(epoch, start_offset))

    def truncate_from(self, offset: int) -> bool:
        return self._saved(self.cache.truncate_from(offset))

    def truncate_from_epoch(self, epoch: int) -> bool:
        return self._saved(self.cache.truncate_from_epoch(epoch))

    def expire_before(self, min_offset: int) -> bool:
        return self._saved(self.cache.expire_before(min_offset))

    def _saved(self, changed: bool) -> bool:
        if changed:
            self.save()
        return changed

    def save(self) -> None:
        """Write the history so that a crash at any moment leaves the old or the new one
        readable under the file's name, and the one before in ``.bak``.

        The previous content goes to ``.bak`` first (through a tmp file and a rename), then
        the new content replaces the file the same way; each file and the directory are
        fsync'ed. A previous content that is broken is not backed up (the ``.bak`` it was
        read from stays). With no entries ``.bak`` is removed instead: RocketMQ reads a file
        of 0 entries as "look in .bak", and the old entries there would come back."""
        directory = os.path.dirname(self.path) or "."
        os.makedirs(directory, exist_ok=True)
        data = encode_epoch_file(self.cache.entries)
        if self.cache.entries:
            previous = _read_or_none(self.path)
            if previous and _decodes(previous):
                replace_synced(self.bak_path, previous)
        else:
            try:
                os.unlink(self.bak_path)
            except FileNotFoundError:
                pass
            else:
                fsync_dir(directory)
        replace_synced(self.path, data)


def _read_or_none(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def _decodes(data: bytes) -> bool:
    try:
        decode_epoch_file(data)
    except ValueError:
        return False
    return True


def _read_entries(path: str) -> tuple[list[EpochEntry] | None, str | None]:
    """(entries, None), (None, None) for a missing file, or (None, why it is broken)."""
    data = _read_or_none(path)
    if data is None:
        return None, None
    try:
        return decode_epoch_file(data), None
    except ValueError as exc:
        return None, str(exc)
