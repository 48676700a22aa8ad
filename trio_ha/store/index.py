"""Index files: find messages by key (RocketMQ's IndexService and IndexFile).

Every message is indexed under ``<topic>#<UNIQ_KEY>`` (the id a client gave it) and under
``<topic>#<k>`` for each space-separated value of its KEYS property, so QUERY_MESSAGE finds
it by either. The files are RocketMQ's, byte for byte, in ``<storePathRootDir>/index/``,
each named by the local time it was made (``yyyyMMddHHmmssSSS``): a 40-byte header
(beginTimestamp, endTimestamp, beginPhyOffset, endPhyOffset, hashSlotCount, indexCount), then
``maxHashSlotNum`` 4-byte slots, then ``maxIndexNum`` 20-byte entries (docs/formats.md,
*Index files*). A slot holds the newest entry whose key hashes there; each entry names the
entry before it in the same slot, so a lookup walks one chain, newest first, and stops at the
start of its time range. A full file is followed by a new one.

The dispatcher feeds the index as it builds the consume queues, so master and slave both have
one. The native engine puts every key of a scanned batch in one call (``th_index_put``): the
per-message cost is a property scan and a hash in C, not Python.

Durability. Writes go to the mapping; the current file is synced at every thorough
consume-queue flush (flushConsumeQueueThoroughInterval) and at shutdown, and the checkpoint's
indexMsgTimestamp then records its end. After a crash, files that end past that timestamp may
hold entries whose pages never reached the disk: they are deleted, as RocketMQ deletes them,
and the index is rebuilt from the commitlog from the end of the newest file kept (``catch_up``),
which also indexes a store that had no index before.

The files are sparse (420 MB each with RocketMQ's sizes; the disk holds the pages written),
and a store into a page of a shared mapping that the filesystem cannot back is SIGBUS: the
process dies, reads and all (RocketMQ has the same hole). So no byte is written
into a file before its blocks are reserved (fallocate), and a refused reservation is an
OSError the dispatcher waits out (a stall: puts get SERVICE_NOT_AVAILABLE, reads go on):

* the header, when the file is created;
* the hash slots (4 x maxHashSlotNum: 20 MB with RocketMQ's sizes), whole, before the first
  entry goes in. They are written at random, one page per new key hash, so they cannot be
  reserved ahead of a write position; a file that is only ever read (a full one, or one a
  reopened store keeps) never reserves them;
* the entries, written in order, 1 MiB at a time ahead of the write position (reserving
  the 400 MB region at once would cost every store that indexes anything 400 MB).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import time

import attrs

import trio_ha._backend as _backend

from .._backend import Handle, ScanResult
from .._errors import TrioHAError
from ..config import StoreConfig
from ..wire.errors import RecordDecodeError
from ..wire.record import peek_header
from .commitlog import CommitLog
from .segment import Segment

__all__ = ["IndexFile", "IndexFileError", "IndexService", "QueryOffsetResult"]

log = logging.getLogger(__name__)

HEADER = struct.Struct(">qqqqii")
ENTRY = struct.Struct(">iqii")
SLOT = struct.Struct(">i")
HEADER_SIZE = HEADER.size
ENTRY_SIZE = ENTRY.size
#: entries reserved on disk ahead of the writes at a time (1 MiB of entries)
RESERVE_ENTRIES = (1 << 20) // ENTRY_SIZE
#: what a catch-up scan reads at a time
CATCH_UP_BATCH = 4096


class IndexFileError(TrioHAError, OSError):
    """An index file is mis-sized or cannot be read."""


def file_size(slot_num: int, index_num: int) -> int:
    return HEADER_SIZE + 4 * slot_num + ENTRY_SIZE * index_num


def _reserve_blocks(fd: int, path: str, offset: int, length: int) -> None:
    """fallocate, with the file named in the error (a stalled dispatch says which)."""
    try:
        _backend.engine.fallocate(fd, offset, length)
    except OSError as exc:
        raise OSError(exc.errno, f"cannot reserve {length} bytes of index file {path}: "
                                 f"{exc.strerror}") from exc


def file_name(now: float | None = None) -> str:
    """``yyyyMMddHHmmssSSS`` in local time, as RocketMQ names index files."""
    now = time.time() if now is None else now
    return time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"


@attrs.frozen
class IndexHeader:
    begin_timestamp: int
    end_timestamp: int
    begin_phy_offset: int
    end_phy_offset: int
    hash_slot_count: int
    index_count: int


@attrs.define(eq=False)
class IndexFile:
    path: str
    slot_num: int
    index_num: int
    _fd: int
    _mmap: mmap.mmap
    handle: Handle
    #: entries below this are reserved on disk
    _reserved: int = 0
    #: the hash slots' blocks are reserved on disk (done before the first entry goes in)
    _slots_reserved: bool = False
    #: the next record did not fit: the next one goes to a new file
    _sealed: bool = False

    @classmethod
    def create(cls, directory: str, slot_num: int, index_num: int, *, begin_phy_offset: int,
               begin_timestamp: int, now: float | None = None) -> IndexFile:
        """A new empty file that starts where the last one ended (RocketMQ carries the end
        offset and time over, for the time range of a file that gets no entry yet)."""
        name = file_name(now)
        while os.path.exists(os.path.join(directory, name)):  # two in one millisecond
            name = str(int(name) + 1)
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, file_size(slot_num, index_num))
            _reserve_blocks(fd, path, 0, HEADER_SIZE)  # (the slots wait for the first entry)
            index = cls._map(path, fd, slot_num, index_num)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        HEADER.pack_into(index._mmap, 0, begin_timestamp, begin_timestamp, begin_phy_offset,
                         begin_phy_offset, 0, 1)
        return index

    @classmethod
    def open(cls, path: str, slot_num: int, index_num: int) -> IndexFile:
        fd = os.open(path, os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            if size != file_size(slot_num, index_num):
                raise IndexFileError(
                    f"index file {path} has {size} bytes, not the {file_size(slot_num, index_num)}"
                    f" of maxHashSlotNum={slot_num} and maxIndexNum={index_num}")
            index = cls._map(path, fd, slot_num, index_num)
        except BaseException:
            os.close(fd)
            raise
        index._reserved = index.header().index_count  # written entries have their blocks
        return index

    @classmethod
    def _map(cls, path: str, fd: int, slot_num: int, index_num: int) -> IndexFile:
        mapping = mmap.mmap(fd, file_size(slot_num, index_num), mmap.MAP_SHARED,
                            mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(path, slot_num, index_num, fd, mapping,
                   _backend.engine.handle_for(mapping))

    def header(self) -> IndexHeader:
        return IndexHeader(*HEADER.unpack_from(self._mmap, 0))

    @property
    def is_full(self) -> bool:
        return self._sealed or self.header().index_count >= self.index_num

    def put(self, segment: Segment, result: ScanResult, first: int) -> int:
        """Index the scanned records ``first``.. of ``segment``; how many were done (fewer
        when this file filled up: then it is full, and the rest go to a new file)."""
        if not self._slots_reserved:
            self._fallocate(0, HEADER_SIZE + 4 * self.slot_num)
            self._slots_reserved = True
        done = 0
        try:
            while first + done < result.count:
                count = self.header().index_count
                if count >= self.index_num:
                    break
                if self._reserved < min(self.index_num, count + RESERVE_ENTRIES // 2):
                    self._reserve(min(self.index_num, count + RESERVE_ENTRIES))
                limit = min(self.index_num, self._reserved)
                step = _backend.engine.index_put(self.handle, self.slot_num, limit,
                                                 segment.handle, result, first + done)
                done += step
                if step == 0:  # the next record's keys do not fit below `limit`
                    if limit >= self.index_num:
                        self._sealed = True
                        break
                    self._reserve(min(self.index_num, self._reserved + RESERVE_ENTRIES))
        except OSError:
            if done:
                return done  # the caller keeps what went in; the next call raises again
            raise
        return done

    def _reserve(self, entries: int) -> None:
        start = HEADER_SIZE + 4 * self.slot_num + ENTRY_SIZE * self._reserved
        end = HEADER_SIZE + 4 * self.slot_num + ENTRY_SIZE * entries
        self._fallocate(start, end - start)
        self._reserved = entries

    def _fallocate(self, offset: int, length: int) -> None:
        _reserve_blocks(self._fd, self.path, offset, length)

    def select(self, hashed: int, begin: int, end: int, max_num: int, out: list[int]) -> None:
        """Append to ``out`` the commitlog offsets of entries with this key hash stored in
        [begin, end] (ms), newest first, until ``out`` holds ``max_num`` (RocketMQ's
        ``selectPhyOffset``)."""
        header = self.header()
        count = header.index_count
        if count <= 1:
            return
        data = self._mmap
        (current,) = SLOT.unpack_from(data, HEADER_SIZE + 4 * (hashed % self.slot_num))
        entries_at = HEADER_SIZE + 4 * self.slot_num
        seen = 0
        while 0 < current < count and len(out) < max_num and seen < count:
            seen += 1
            stored_hash, phy, diff, previous = ENTRY.unpack_from(data,
                                                                 entries_at + ENTRY_SIZE * current)
            if diff < 0:
                break
            stored_at = header.begin_timestamp + diff * 1000
            if stored_hash == hashed and begin <= stored_at <= end:
                out.append(phy)
            if previous <= 0 or previous > count or previous == current or stored_at < begin:
                break
            current = previous

    def time_matched(self, begin: int, end: int) -> bool:
        h = self.header()
        return ((begin < h.begin_timestamp and end > h.end_timestamp)
                or h.begin_timestamp <= begin <= h.end_timestamp
                or h.begin_timestamp <= end <= h.end_timestamp)

    def flush(self) -> None:
        """Sync the mapping (blocking; the engine's msync releases the GIL)."""
        try:
            _backend.engine.msync(self.handle, 0, file_size(self.slot_num, self.index_num))
        except NotImplementedError:  # the Python engine
            os.fsync(self._fd)

    def close(self) -> None:
        _backend.engine.release_handle(self.handle)
        self._mmap.close()
        os.close(self._fd)

    def destroy(self) -> None:
        self.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


@attrs.frozen
class QueryOffsetResult:
    #: commitlog offsets of the records found, newest first
    phy_offsets: list[int]
    #: end time and end offset of the newest index file (QUERY_MESSAGE's response fields)
    index_last_update_timestamp: int
    index_last_update_phy_offset: int


@attrs.define(eq=False)
class IndexService:
    directory: str
    slot_num: int
    index_num: int
    files: list[IndexFile] = attrs.field(factory=list[IndexFile])
    #: the commitlog offset of the last record indexed (-1: none yet)
    after: int = -1
    #: the newest file's end time when it was last synced (the checkpoint's indexMsgTimestamp)
    synced_timestamp: int = 0

    @classmethod
    def load(cls, root: str, config: StoreConfig, *, abnormal: bool,
             checkpoint_timestamp: int) -> IndexService:
        """Open the index files under ``<root>/index`` (blocking). After a crash, files that
        end past ``checkpoint_timestamp`` are deleted: their tails may never have reached the
        disk (``catch_up`` rebuilds what they held)."""
        directory = os.path.join(root, "index")
        os.makedirs(directory, exist_ok=True)
        service = cls(directory, config.max_hash_slot_num, config.max_index_num)
        names = sorted(n for n in os.listdir(directory) if n.isdigit())
        for name in names:
            index = IndexFile.open(os.path.join(directory, name), service.slot_num,
                                   service.index_num)
            if abnormal and index.header().end_timestamp > checkpoint_timestamp:
                log.info("index: %s ends after the checkpoint (%d); rebuilding it from the "
                         "commitlog", index.path, checkpoint_timestamp)
                index.destroy()
                continue
            service.files.append(index)
        for stale in os.listdir(directory):
            if not stale.isdigit():
                log.warning("index: ignoring %s in %s", stale, directory)
        service._resume_after_last_file()
        if service.files:
            service.synced_timestamp = service.files[-1].header().end_timestamp
        return service

    def _resume_after_last_file(self) -> None:
        """``after`` from the newest file: the last record it indexed (-1: none)."""
        self.after = -1
        if self.files:
            header = self.files[-1].header()
            if header.index_count > 1 or len(self.files) > 1:
                self.after = header.end_phy_offset

    def add(self, segment: Segment, result: ScanResult) -> None:
        """Index what a dispatch scan of ``segment`` found (records at or before ``after``
        are indexed already and skipped)."""
        count = result.count
        if not count:
            return
        infos = result.infos
        first = 0
        if infos[0].phys_offset <= self.after:
            while first < count and infos[first].phys_offset <= self.after:
                first += 1
        while first < count:
            done = self._writable().put(segment, result, first)
            if done:  # kept as it goes: a batch that fails part-way resumes after it
                first += done
                self.after = infos[first - 1].phys_offset
        # Never back: the dispatch that recovery runs again at open hands over records
        # indexed already, and moving back to them would index the later ones twice.
        self.after = max(self.after, infos[count - 1].phys_offset)

    def _writable(self) -> IndexFile:
        if self.files and not self.files[-1].is_full:
            return self.files[-1]
        last = self.files[-1].header() if self.files else None
        index = IndexFile.create(
            self.directory, self.slot_num, self.index_num,
            begin_phy_offset=last.end_phy_offset if last else 0,
            begin_timestamp=last.end_timestamp if last else 0,
        )
        self.files.append(index)
        return index

    def catch_up(self, commitlog: CommitLog, until: int, max_record: int) -> int:
        """Index the records of ``commitlog`` after ``after`` up to ``until`` (blocking: at
        open, before dispatch goes on). Returns how many records were scanned.

        Files that name records at or past the log's end are deleted first, newest first,
        and what they held that is still in the log is indexed again: recovery may have cut
        the log back (a damaged tail), or a crash lost a tail the index had seen. Left alone,
        their entries would point past the log, and ``after`` past the end would keep the
        records later written there from ever being indexed."""
        while self.files:
            header = self.files[-1].header()
            empty = header.index_count <= 1  # (an empty file is made again when needed)
            if not empty and header.end_phy_offset < until:
                break
            stale = self.files.pop()
            if not empty:
                log.info("index: %s names records past the log's end (%d); rebuilding it "
                         "from the commitlog", stale.path, until)
            stale.destroy()
        self._resume_after_last_file()
        scanner = _backend.engine.scanner(CATCH_UP_BATCH)
        scanned = 0
        for segment, result in commitlog.scan_range(scanner, self._resume_offset(commitlog),
                                                    until, 0, max_record):
            self.add(segment, result)
            scanned += result.count
        if scanned:
            log.info("index: caught up with %d records of the commitlog", scanned)
        return scanned

    def _resume_offset(self, commitlog: CommitLog) -> int:
        """Where indexing goes on: the end of the record at ``after`` (its start plus its
        TOTALSIZE), or the log's start."""
        if self.after < 0:
            return 0
        try:
            return self.after + peek_header(commitlog.read(self.after, 8)).size
        except (IndexError, RecordDecodeError):
            # Retention took the record's segment: the scan starts at the log's first offset.
            return self.after + 1

    def query(self, topic: str, key: str, max_num: int, begin: int, end: int
              ) -> QueryOffsetResult:
        """Where the messages of ``topic`` with ``key`` stored in [begin, end] are, newest
        first, at most ``max_num`` (RocketMQ's ``queryOffset``)."""
        found: list[int] = []
        hashed = _backend.index_key_hash(f"{topic}#{key}")
        for index in reversed(self.files):
            if index.time_matched(begin, end):
                index.select(hashed, begin, end, max_num, found)
            if index.header().begin_timestamp < begin or len(found) >= max_num:
                break
        last = self.files[-1].header() if self.files else None
        unique = list(dict.fromkeys(found))
        return QueryOffsetResult(unique, last.end_timestamp if last else 0,
                                 last.end_phy_offset if last else 0)

    def sync(self) -> int:
        """Sync every file written since the last sync (blocking); the newest file's end
        time, now durable."""
        if not self.files:
            return self.synced_timestamp
        end = self.files[-1].header().end_timestamp
        for index in self.files:
            if index.header().end_timestamp > self.synced_timestamp or index is self.files[-1]:
                index.flush()
        self.synced_timestamp = end
        return end

    def delete_expired(self, commitlog_min_offset: int) -> int:
        """Delete the files (never the newest) whose every entry is below the commitlog's
        first offset; how many went."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].header().end_phy_offset < commitlog_min_offset:
            self.files.pop(0).destroy()
            deleted += 1
        return deleted

    def close(self) -> None:
        for index in self.files:
            index.close()
        self.files.clear()
