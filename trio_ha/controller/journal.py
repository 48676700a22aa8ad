# pyright: strict
"""The one-controller StateStore: records in memory, every commit appended to a write-ahead
file and fsync'ed before ``commit`` returns.

It is one module at about 600 lines because it is one durable object: appends, group commit,
recovery and compaction all act on one file under one lock (the bytes themselves are
``journal_format``'s).

Why a file of our own and not etcd for one controller: a single controller needs no
consensus, only durability, and an append plus an ``fdatasync`` is the cheapest durable write
there is (about 0.3 ms here). Issue 39 asks that a restarted controller know every broker id,
epoch and in-sync set it ever granted; that is exactly "replay the file".

How (the bytes are in ``journal_format``; docs/controller.md has them byte by byte):

- ``<dir>/journal`` is the file: a header, then frames. One append writes one frame, so a
  commit is all-or-nothing on disk (its CRC covers it whole). The records live in a dict;
  the dict changes only after the frame is durable, so ``load`` never shows a record that a
  crash could take back.
- Commits are serialised by a ``trio.Lock`` and group-committed: a caller queues its writes
  and takes the lock; whoever holds it writes *every* queued commit as one frame with one
  fsync, each commit checked in order against the state the earlier ones leave. While one
  fsync runs, the next group gathers. File writes and fsyncs run in a worker thread, so the
  event loop never waits on the disk.
- Recovery at open replays every whole frame. A torn tail (a crash mid-append) is cut off,
  synced and logged; damage anywhere else refuses to start (``JournalCorrupt``).
- Compaction, when the file passes ``compact_bytes`` or ``compact_frames``: a snapshot of
  every record is written whole to ``journal.tmp`` and fsync'ed (``write_snapshot``), renamed
  over ``journal`` and the directory fsync'ed (``install_snapshot``), then appends continue
  on the new file. A crash before the rename leaves the old file (the tmp file is removed at
  the next open); after it, the new one; both hold the same records.
- ``<dir>/journal.lock`` is held with ``flock`` while the journal is open: a second
  controller on the same directory (another process, or this one) is refused at once
  (``JournalLocked``); the kernel drops the lock when the process dies.

A write or fsync that fails leaves the journal refusing every later commit
(``JournalFailed``): after a failed fsync nobody knows what reached the disk, so the only
honest continuation is a restart, whose recovery reads what is there. A caller that gets
``JournalFailed`` (or is cancelled while its commit is being written) does not know whether
its commit happened: like a lost answer from etcd, it reads again.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Final

import attrs
import trio

from .._durable import fsync_dir, replace_synced, write_synced
from .._errors import TrioHAError
from .journal_format import (
    KIND_COMMIT,
    KIND_SNAPSHOT,
    MAX_BODY,
    MAX_KEY_BYTES,
    Entry,
    encode_frame,
    file_header,
    replay,
    snapshot_entries,
)
from .state_store import CommitConflict, Versioned, Write

__all__ = [
    "JOURNAL_NAME", "LOCK_NAME", "SNAPSHOT_TMP_NAME", "CompactionFailed", "CompactionInfo",
    "Journal",
    "JournalFailed", "JournalLocked", "JournalStatistics", "install_snapshot", "write_snapshot",
]

log = logging.getLogger(__name__)

JOURNAL_NAME: Final = "journal"
SNAPSHOT_TMP_NAME: Final = "journal.tmp"  # what _durable.replace_synced also names its tmp
LOCK_NAME: Final = "journal.lock"
DEFAULT_COMPACT_BYTES: Final = 64 << 20
#: replaying 100,000 small frames takes about half a second here: the bound on a restart
DEFAULT_COMPACT_FRAMES: Final = 100_000
#: one group commit's frame at most this big: later commits wait for the next frame
_BATCH_BYTES: Final = MAX_BODY // 4
#: a single commit at most this big (it must fit in a frame of its own)
_COMMIT_BYTES: Final = MAX_BODY // 4
#: frame bytes per entry besides the key and value (op, version, key and value lengths)
_ENTRY_OVERHEAD: Final = 15


class JournalLocked(TrioHAError, RuntimeError):
    """Another journal (another controller, in this process or another) has the directory
    open."""


class JournalFailed(TrioHAError, OSError):
    """A write or fsync of the journal failed: it takes no more commits, and whether the
    commit that saw this happened is unknown until a restart replays the file."""


class CompactionFailed(TrioHAError, OSError):
    """``compact()`` could not write the snapshot (a full disk): the journal is intact, in
    charge and takes commits; compaction is tried again later."""


@attrs.frozen
class CompactionInfo:
    """The last compaction: at which sequence, the file's size before and after, and when
    (``time.time()``)."""

    sequence: int
    bytes_before: int
    bytes_after: int
    unix_time: float


@attrs.frozen
class JournalStatistics:
    """A snapshot of a journal's counters (those named "since open" restart at zero)."""

    #: commits written since open (a commit of only absent deletes writes nothing)
    commits: int
    #: commits refused with CommitConflict since open
    conflicts: int
    #: frames appended since open: one per group commit
    frames: int
    #: fdatasync/fsync calls on journal files since open (opening and compaction included)
    fsyncs: int
    #: bytes appended since open (snapshots not counted)
    bytes_written: int
    #: the journal file's size now
    file_bytes: int
    #: live records now
    records: int
    #: the last version given out
    sequence: int
    #: whole frames replayed at open, and torn-tail bytes cut then
    recovered_frames: int
    cut_bytes: int
    compactions: int
    last_compaction: CompactionInfo | None


def write_snapshot(directory: str, records: Mapping[str, Versioned], sequence: int) -> int:
    """Compaction's first step: every record, as one snapshot frame after a file header, into
    ``journal.tmp``, fsync'ed. Returns its size. Blocking; a crash after it leaves the old
    journal in charge (the tmp file is removed at the next open)."""
    data = file_header() + encode_frame(KIND_SNAPSHOT, sequence, snapshot_entries(records))
    write_synced(os.path.join(directory, SNAPSHOT_TMP_NAME), data)
    return len(data)


def install_snapshot(directory: str) -> None:
    """Compaction's second step: ``journal.tmp`` renamed over ``journal`` (atomic) and the
    directory fsync'ed, so the switch survives a power loss. Blocking."""
    os.replace(os.path.join(directory, SNAPSHOT_TMP_NAME), os.path.join(directory, JOURNAL_NAME))
    fsync_dir(directory)


@attrs.define(eq=False)
class _Pending:
    """One caller's commit while it waits for a frame."""

    writes: tuple[Write, ...]
    size: int
    taken: bool = False
    result: dict[str, int] | None = None
    error: Exception | None = None


def _checked(writes: Sequence[Write]) -> tuple[tuple[Write, ...], int]:
    """The writes as a tuple, and their size in a frame; ValueError for a misuse (these are
    the rules' bugs, refused before anything is queued)."""
    result = tuple(writes)
    seen: set[str] = set()
    size = 0
    for write in result:
        if not isinstance(write, Write):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise TypeError(f"commit takes Write values, not {type(write).__name__}")
        key = write.key.encode()
        if not key or len(key) > MAX_KEY_BYTES:
            raise ValueError(f"a key is 1 to {MAX_KEY_BYTES} UTF-8 bytes: {write.key!r}")
        if write.key in seen:
            raise ValueError(f"one commit writes key {write.key!r} twice")
        if write.expected_version < 0:
            raise ValueError(f"expected_version {write.expected_version} is negative")
        seen.add(write.key)
        size += _ENTRY_OVERHEAD + len(key) + (0 if write.value is None else len(write.value))
    if size > _COMMIT_BYTES:
        raise ValueError(f"a commit of {size} bytes is over the journal's {_COMMIT_BYTES}")
    return result, size


@attrs.define(eq=False)
class Journal:
    """The write-ahead journal of one controller's store path (open with ``Journal.open``)."""

    directory: str
    _fd: int = attrs.field(alias="fd")
    _lock_fd: int = attrs.field(alias="lock_fd")
    _records: dict[str, Versioned] = attrs.field(alias="records")
    _sequence: int = attrs.field(alias="sequence")
    #: the journal file's size: where the next frame goes
    _end: int = attrs.field(alias="end")
    _frames_in_file: int = attrs.field(alias="frames_in_file")
    _compact_bytes: int = attrs.field(alias="compact_bytes")
    _compact_frames: int = attrs.field(alias="compact_frames")
    _recovered_frames: int = attrs.field(alias="recovered_frames")
    _cut_bytes: int = attrs.field(alias="cut_bytes")
    _fsyncs: int = attrs.field(alias="fsyncs")
    #: compaction runs when the file reaches this size (raised after a snapshot that is
    #: itself big, so a large state does not compact on every commit)
    _compact_at: int = attrs.field(init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _queue: list[_Pending] = attrs.field(factory=list[_Pending], init=False)
    _failed: BaseException | None = attrs.field(default=None, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _commits: int = attrs.field(default=0, init=False)
    _conflicts: int = attrs.field(default=0, init=False)
    _frames: int = attrs.field(default=0, init=False)
    _bytes_written: int = attrs.field(default=0, init=False)
    _compactions: int = attrs.field(default=0, init=False)
    _last_compaction: CompactionInfo | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._compact_at = self._compact_bytes

    # ---- opening and closing ----------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(
        cls,
        directory: str | os.PathLike[str],
        *,
        compact_bytes: int = DEFAULT_COMPACT_BYTES,
        compact_frames: int = DEFAULT_COMPACT_FRAMES,
    ) -> AsyncGenerator[Journal]:
        """Lock ``directory`` (made if missing), recover its journal and yield it; closed
        (and unlocked) on exit, after any commit being written has finished."""
        if compact_bytes <= 0 or compact_frames <= 0:
            raise ValueError("compact_bytes and compact_frames must be positive")
        journal = await trio.to_thread.run_sync(
            cls._open_sync, os.fspath(directory), compact_bytes, compact_frames
        )
        try:
            yield journal
        finally:
            with trio.CancelScope(shield=True):
                await journal._aclose()

    @classmethod
    def _open_sync(cls, directory: str, compact_bytes: int, compact_frames: int) -> Journal:
        directory = os.path.abspath(directory)
        _make_directory(directory)
        lock_fd = _lock_directory(directory)
        try:
            return cls._recover(directory, lock_fd, compact_bytes, compact_frames)
        except BaseException:
            os.close(lock_fd)
            raise

    @classmethod
    def _recover(
        cls, directory: str, lock_fd: int, compact_bytes: int, compact_frames: int
    ) -> Journal:
        path = os.path.join(directory, JOURNAL_NAME)
        fsyncs = 0
        try:
            # A compaction (or the first creation) that a crash interrupted before its
            # rename: never read, the journal beside it is complete.
            os.unlink(os.path.join(directory, SNAPSHOT_TMP_NAME))
            log.info("removed an unfinished journal snapshot in %s", directory)
        except FileNotFoundError:
            pass
        if not os.path.exists(path):
            replace_synced(path, file_header())  # created whole, or not at all
            fsyncs += 2
            log.info("new controller journal %s", path)
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            data = _read_all(fd)
            state = replay(data)
            if state.torn is not None:
                torn = state.torn
                log.warning(
                    "controller journal %s: cut a torn tail of %d bytes at %d (%s); it was "
                    "never acknowledged",
                    path, torn.length, torn.offset, torn.reason,
                )
                os.ftruncate(fd, state.end)
                os.fsync(fd)
                fsyncs += 1
            return cls(
                directory,
                fd=fd,
                lock_fd=lock_fd,
                records=dict(state.records),
                sequence=state.sequence,
                end=state.end,
                frames_in_file=state.frames,
                compact_bytes=compact_bytes,
                compact_frames=compact_frames,
                recovered_frames=state.frames,
                cut_bytes=0 if state.torn is None else state.torn.length,
                fsyncs=fsyncs,
            )
        except BaseException:
            os.close(fd)
            raise

    async def _aclose(self) -> None:
        """Wait for the frame being written (if any), then close the files. Commits queued
        behind it are refused."""
        async with self._lock:
            self._closed = True
            for pending in self._queue:
                pending.error = JournalFailed(f"journal {self.directory} closed")
                pending.taken = True
            self._queue.clear()
            os.close(self._fd)
            os.close(self._lock_fd)  # releases the flock

    # ---- StateStore -------------------------------------------------------------------------

    async def load(self) -> Mapping[str, Versioned]:
        """Every durable record (a copy: later commits do not change it)."""
        await trio.lowlevel.checkpoint()
        self._check_usable()
        return dict(self._records)

    async def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        """Write all of ``writes`` or none, durably (see ``StateStore.commit``). Raises
        ``CommitConflict`` (nothing written), ``JournalFailed`` (outcome unknown)."""
        checked, size = _checked(writes)
        self._check_usable()
        if not checked:
            await trio.lowlevel.checkpoint()
            return {}
        pending = _Pending(checked, size)
        self._queue.append(pending)
        try:
            async with self._lock:
                if not pending.taken:
                    await self._write_group()
        except BaseException:
            if not pending.taken:  # cancelled while waiting its turn: it was never written
                self._queue.remove(pending)
            raise
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None  # a taken commit always ends with one or the other
        return pending.result

    def _check_usable(self) -> None:
        if self._closed:
            raise JournalFailed(f"journal {self.directory} is closed")
        if self._failed is not None:
            raise JournalFailed(
                f"journal {self.directory} failed earlier ({self._failed}); restart to recover"
            )

    # ---- group commit -----------------------------------------------------------------------

    def _take_group(self) -> list[_Pending]:
        """The queued commits that go into the next frame, oldest first."""
        size = 0
        count = 0
        for pending in self._queue:
            if count and size + pending.size > _BATCH_BYTES:
                break
            size += pending.size
            count += 1
        group = self._queue[:count]
        del self._queue[:count]
        for pending in group:
            pending.taken = True
        return group

    async def _write_group(self) -> None:
        """With the lock held: decide every queued commit, write the accepted ones as one
        frame with one fsync, then apply them."""
        group = self._take_group()
        try:
            if self._failed is not None or self._closed:
                for pending in group:
                    pending.error = JournalFailed(f"journal {self.directory} takes no commits")
                return
            changes, entries, sequence, accepted = self._decide(group)
            if entries:
                frame = encode_frame(KIND_COMMIT, sequence, entries)
                try:
                    await trio.to_thread.run_sync(self._append_sync, self._fd, self._end, frame)
                except OSError as exc:
                    self._failed = exc
                    log.error("controller journal %s: append failed: %s", self.directory, exc)
                    for pending, _, _ in accepted:
                        pending.error = JournalFailed(
                            f"journal {self.directory}: append failed ({exc}); the commit "
                            "may or may not be on disk"
                        )
                    return
                # Durable: now, and only now, the records change (no checkpoint from here).
                for key, record in changes.items():
                    if record is None:
                        self._records.pop(key, None)
                    else:
                        self._records[key] = record
                self._sequence = sequence
                self._end += len(frame)
                self._frames_in_file += 1
                self._frames += 1
                self._fsyncs += 1
                self._bytes_written += len(frame)
            for pending, result, wrote in accepted:
                pending.result = result
                self._commits += wrote
            if self._end >= self._compact_at or self._frames_in_file >= self._compact_frames:
                await self._compact_locked()
        finally:
            for pending in group:
                if pending.result is None and pending.error is None:
                    # Only an error of ours (a bug) gets here: never leave a caller hanging.
                    self._failed = self._failed or RuntimeError("journal group commit broke")
                    pending.error = JournalFailed(f"journal {self.directory} broke mid-commit")

    def _decide(
        self, group: list[_Pending]
    ) -> tuple[
        dict[str, Versioned | None], list[Entry], int, list[tuple[_Pending, dict[str, int], bool]]
    ]:
        """Check each commit against the records as the commits before it leave them; give
        each accepted one the next sequence. Changes nothing of the journal's records (they
        change when the frame is durable). Returns the changed records (None: deleted), the
        frame's entries, its sequence, and each accepted commit with its result and whether
        it writes anything."""
        changes: dict[str, Versioned | None] = {}
        entries: list[Entry] = []
        accepted: list[tuple[_Pending, dict[str, int], bool]] = []
        sequence = self._sequence

        def current(key: str) -> Versioned | None:
            return changes[key] if key in changes else self._records.get(key)

        for pending in group:
            stale: list[tuple[str, int, int]] = []
            for write in pending.writes:
                record = current(write.key)
                found = 0 if record is None else record.version
                if found != write.expected_version:
                    stale.append((write.key, write.expected_version, found))
            if stale:
                key, expected, found = stale[0]
                more = f" (and {len(stale) - 1} more)" if len(stale) > 1 else ""
                pending.error = CommitConflict(
                    f"record {key!r} is at version {found}, not {expected}{more}"
                )
                self._conflicts += 1
                continue
            writes = [w for w in pending.writes if w.value is not None or current(w.key)]
            result: dict[str, int] = {}
            if writes:  # else only deletes of absent records: nothing to write
                sequence += 1
            for write in writes:
                entries.append(Entry(write.key, sequence, write.value))
                if write.value is None:
                    changes[write.key] = None
                else:
                    changes[write.key] = Versioned(sequence, write.value)
                    result[write.key] = sequence
            accepted.append((pending, result, bool(writes)))
        return changes, entries, sequence, accepted

    def _append_sync(self, fd: int, offset: int, frame: bytes) -> None:
        """In a worker thread: the frame at ``offset``, then fdatasync (which also makes the
        file's new size durable)."""
        view = memoryview(frame)
        while view:  # each turn writes at least one byte, or raises
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
        os.fdatasync(fd)

    # ---- compaction -------------------------------------------------------------------------

    async def compact(self) -> CompactionInfo:
        """Compact now (it also happens by itself past ``compact_bytes``/``compact_frames``)."""
        async with self._lock:
            self._check_usable()
            error = await self._compact_locked()
            self._check_usable()  # the switch failed: JournalFailed
            if error is not None or self._last_compaction is None:
                raise CompactionFailed(
                    f"journal {self.directory}: the snapshot failed ({error}); the journal "
                    "goes on without it"
                )
            return self._last_compaction

    async def _compact_locked(self) -> OSError | None:
        """Compact with the lock held; the error that kept the snapshot from being written
        (the journal goes on), or None. A failed switch leaves the journal failed."""
        before = self._end
        records = dict(self._records)
        try:
            size = await trio.to_thread.run_sync(
                write_snapshot, self.directory, records, self._sequence
            )
        except OSError as exc:
            # The old journal is intact and still in charge: keep going, try again later.
            log.error("controller journal %s: snapshot failed: %s", self.directory, exc)
            self._compact_at = self._end + self._compact_bytes
            try:
                os.unlink(os.path.join(self.directory, SNAPSHOT_TMP_NAME))
            except OSError:
                pass
            return exc
        self._fsyncs += 1
        try:
            self._fd = await trio.to_thread.run_sync(self._switch_sync, self._fd)
        except OSError as exc:
            # Renamed or not, synced or not: the open descriptor may now name a file that
            # is no longer the journal. Only a restart knows which file is in charge.
            self._failed = exc
            log.error("controller journal %s: snapshot switch failed: %s", self.directory, exc)
            return None
        self._fsyncs += 1
        self._end = size
        self._frames_in_file = 1
        self._compactions += 1
        self._compact_at = max(self._compact_bytes, 2 * size)
        self._last_compaction = CompactionInfo(self._sequence, before, size, time.time())
        log.info(
            "controller journal %s compacted: %d bytes to %d at sequence %d",
            self.directory, before, size, self._sequence,
        )
        return None

    def _switch_sync(self, old_fd: int) -> int:
        install_snapshot(self.directory)
        fd = os.open(os.path.join(self.directory, JOURNAL_NAME), os.O_RDWR | os.O_CLOEXEC)
        os.close(old_fd)
        return fd

    # ---- statistics -------------------------------------------------------------------------

    def statistics(self) -> JournalStatistics:
        return JournalStatistics(
            commits=self._commits,
            conflicts=self._conflicts,
            frames=self._frames,
            fsyncs=self._fsyncs,
            bytes_written=self._bytes_written,
            file_bytes=self._end,
            records=len(self._records),
            sequence=self._sequence,
            recovered_frames=self._recovered_frames,
            cut_bytes=self._cut_bytes,
            compactions=self._compactions,
            last_compaction=self._last_compaction,
        )


def _make_directory(directory: str) -> None:
    """``os.makedirs``, and each directory it creates made durable in its parent: the
    journal's own fsyncs cover its file and its entry in ``directory``, not ``directory``'s
    entry in its parent."""
    missing: list[str] = []
    path = directory
    while not os.path.isdir(path) and len(missing) < 256:  # bounded by the path's depth
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    os.makedirs(directory, exist_ok=True)
    for created in reversed(missing):
        fsync_dir(os.path.dirname(created))


def _lock_directory(directory: str) -> int:
    """flock ``<directory>/journal.lock`` (exclusive, not waiting); its descriptor."""
    path = os.path.join(directory, LOCK_NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise JournalLocked(
                f"controller store {directory} is in use by another controller (its lock "
                f"file {path} is locked)"
            ) from None
        raise
    return fd


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks: list[bytes] = []
    offset = 0
    while offset < size:  # bounded by the size read above; a short read moves on
        chunk = os.pread(fd, min(size - offset, 16 << 20), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)
