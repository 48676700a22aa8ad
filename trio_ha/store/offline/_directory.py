"""A store directory as the store itself would load it, for tools that must not open it.

Opening a store acts (recovery cuts the log, fills damaged ranges, rebuilds consume queues and
deletes index files), so the offline tools find and read its files themselves — and must find
the same ones the store would. Which files of a log directory are segments, and where the run
of them that loads as one log stops, follow ``SegmentQueue.load``'s and ``Segment.open``'s
rules; the consume queues are the directories ``ConsumeQueueTable.load`` would take; sizes come
from the broker's config when the caller passes it, else from the files themselves.

Files are mapped read-only and wrapped in the store's own ``Segment``, so the store's readers
and the native scanner work on them unchanged while no byte can be written. The lock is taken
as the store takes it: a tool holding it and a broker exclude each other.

What verify, inspect and truncate share, and nothing else; each tool is its own module.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import mmap
import os
from collections.abc import Generator, Sequence

import attrs

import trio_ha._backend as _backend

from ..._errors import TrioHAError
from ...config import StoreConfig
from ...wire import layout
from .. import index as index_files
from ..admission import max_record_size
from ..checkpoint import Checkpoint
from ..consume_queue import is_valid_topic
from ..lock import StoreLock
from ..segment import Segment

#: records the scanner describes per call
SCAN_BATCH = 4096
#: errnos that mean "this directory is read-only to us": verify then goes on without the lock
_READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


class OfflineStoreError(TrioHAError):
    """Something an operator caused and can fix: the directory is missing or is not a store,
    or a truncation is refused (not a record boundary, beyond the end...). One line."""


@attrs.frozen
class CheckpointSummary:
    present: bool
    physic_msg_timestamp: int
    logics_msg_timestamp: int
    index_msg_timestamp: int
    master_flushed_offset: int
    confirm_phy_offset: int

    @classmethod
    def of(cls, checkpoint: Checkpoint, present: bool) -> CheckpointSummary:
        return cls(present, checkpoint.physic_msg_timestamp, checkpoint.logics_msg_timestamp,
                   checkpoint.index_msg_timestamp, checkpoint.master_flushed_offset,
                   checkpoint.confirm_phy_offset)


@attrs.frozen
class StoreDir:
    root: str
    commitlog_dir: str
    queue_root: str
    index_dir: str
    config: StoreConfig
    #: sizes come from the config the caller gave (else from the files themselves)
    sizes_configured: bool

    @property
    def max_record(self) -> int:
        return max_record_size(self.config)

    def relative(self, path: str) -> str:
        inside = os.path.relpath(path, self.root)
        return path if inside.startswith("..") else inside


def locate(store_dir: str, config: StoreConfig | None) -> StoreDir:
    if not os.path.exists(store_dir):
        raise OfflineStoreError(f"no such directory: {store_dir}")
    if not os.path.isdir(store_dir):
        raise OfflineStoreError(f"not a directory: {store_dir}")
    root = os.path.realpath(store_dir)
    sizes_configured = config is not None
    config = attrs.evolve(config or StoreConfig(), store_path_root_dir=root)
    commitlog_dir = os.path.realpath(config.commitlog_dir)
    if not os.path.isdir(commitlog_dir):
        raise OfflineStoreError(f"{store_dir} is not a store directory: it has no "
                                f"{os.path.relpath(commitlog_dir, root)}/")
    return StoreDir(root, commitlog_dir, os.path.join(root, "consumequeue"),
                     os.path.join(root, "index"), config, sizes_configured)


@attrs.frozen
class SegmentFile:
    name: str
    path: str
    base: int
    size: int


def segment_files(directory: str) -> list[SegmentFile]:
    """The files of a log directory named as segments, oldest first (other names are what
    the store ignores too)."""
    found: list[SegmentFile] = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(directory):
            base = layout.parse_segment_file_name(name)
            path = os.path.join(directory, name)
            if base is not None and os.path.isfile(path):
                found.append(SegmentFile(name, path, base, os.path.getsize(path)))
    return sorted(found, key=lambda f: f.base)


def common_size(files: Sequence[SegmentFile]) -> int | None:
    """The size most of ``files`` have: a store's segments all have one."""
    sizes = collections.Counter(f.size for f in files)
    return sizes.most_common(1)[0][0] if sizes else None


def loadable_prefix(files: list[SegmentFile], size: int) -> tuple[int, str | None, bool]:
    """How many of ``files`` the store loads as one log, why it stops at the next one
    (SegmentQueue.load's and Segment.open's rules), and whether that reason is a gap."""
    if files and size <= 0:
        return 0, f"{files[0].name} is empty", False
    for i, f in enumerate(files):
        if f.size != size:
            return i, f"{f.name} has {f.size} bytes, not the segment size {size}", False
        if f.base % size:
            return i, (f"{f.name} names offset {f.base}, not a multiple of the segment size "
                       f"{size}"), False
        if i and f.base != files[i - 1].base + size:
            start = files[i - 1].base + size
            return i, (f"the files for [{start}, {f.base}) are missing: "
                       f"{files[i - 1].name} ends at {start}, the next file is {f.name}"), True
    return len(files), None, False


def map_read_only(f: SegmentFile) -> Segment:
    """A store Segment over ``f`` whose mapping cannot be written (Segment.open maps for
    writing: these tools must not change a byte)."""
    fd = os.open(f.path, os.O_RDONLY)
    try:
        mapping = mmap.mmap(fd, f.size, mmap.MAP_SHARED, mmap.PROT_READ)
    except BaseException:
        os.close(fd)
        raise
    segment = Segment(f.path, f.base, f.size, fd, mapping, _backend.engine.handle_for(mapping))
    segment.wrote_position = segment.flushed_position = f.size
    return segment


@contextlib.contextmanager
def mapped(files: Sequence[SegmentFile]) -> Generator[list[Segment]]:
    segments: list[Segment] = []
    try:
        for f in files:
            segments.append(map_read_only(f))
        yield segments
    finally:
        for segment in segments:
            segment.close()


def read_checkpoint(store: StoreDir) -> tuple[Checkpoint, bool, int | None]:
    path = os.path.join(store.root, "checkpoint")
    try:
        size: int | None = os.path.getsize(path)
    except FileNotFoundError:
        size = None
    return Checkpoint.load(path), size is not None, size


@contextlib.contextmanager
def store_lock(root: str, *, read_only_ok: bool) -> Generator[str | None]:
    """Hold the store's lock for the block (StoreLockedError when a broker has it open).
    With ``read_only_ok`` a directory where the lock cannot be written (a read-only copy)
    is worked on unlocked; the block gets a warning to pass on."""
    try:
        lock = StoreLock.acquire(root)
    except OSError as exc:
        if not read_only_ok or exc.errno not in _READ_ONLY_ERRNOS:
            raise
        yield (f"the store's lock cannot be taken ({exc.strerror}): nothing keeps a broker "
               "from opening it during the check")
        return
    try:
        yield None
    finally:
        lock.release()


@attrs.frozen
class QueueDir:
    topic: str
    queue_id: int
    directory: str

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.queue_id}"


def queue_dirs(store: StoreDir) -> list[QueueDir]:
    """The consume queues the store would load (ConsumeQueueTable.load's rules)."""
    found: list[QueueDir] = []
    with contextlib.suppress(FileNotFoundError):
        for topic in sorted(os.listdir(store.queue_root)):
            topic_dir = os.path.join(store.queue_root, topic)
            if not os.path.isdir(topic_dir) or not is_valid_topic(topic):
                continue
            for name in sorted(os.listdir(topic_dir), key=lambda n: (len(n), n)):
                if name.isdigit() and os.path.isdir(os.path.join(topic_dir, name)):
                    found.append(QueueDir(topic, int(name), os.path.join(topic_dir, name)))
    return found


def queue_file_size(store: StoreDir, queues: list[QueueDir]) -> int:
    if store.sizes_configured:
        return store.config.mapped_file_size_consume_queue
    sizes = collections.Counter(
        f.size for queue in queues for f in segment_files(queue.directory)
    )
    return sizes.most_common(1)[0][0] if sizes else store.config.mapped_file_size_consume_queue


def index_paths(store: StoreDir) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return [os.path.join(store.index_dir, n)
                for n in sorted(os.listdir(store.index_dir)) if n.isdigit()]
    return []


def read_index_header(path: str) -> index_files.IndexHeader | None:
    with open(path, "rb") as f:
        raw = f.read(index_files.HEADER_SIZE)
    if len(raw) < index_files.HEADER_SIZE:
        return None
    return index_files.IndexHeader(*index_files.HEADER.unpack(raw))


def index_entries_at(store: StoreDir) -> int:
    return index_files.HEADER_SIZE + 4 * store.config.max_hash_slot_num
