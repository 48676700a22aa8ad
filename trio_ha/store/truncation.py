"""Cutting a live store back to a commitlog offset, so that a SIGKILL at any moment leaves it
cut or untouched, never a mix.

Controller mode needs it twice: a slave cuts its log to the point where it agrees with a new
master before it copies from it (the epoch histories' consistent point), and a new master cuts
what it must not keep. RocketMQ 5.3.3 resets positions in memory only; the tail stays valid on
disk and comes back after a crash (RocketMQ #10666), after the store answered as if it were
gone. Here the cut is a transaction with a durable intent:

1. the offset is checked (a record boundary at or below the max offset), the epoch file
   read, and the consume queues brought up to it, before anything changes (a refusal is
   ``TruncationError``);
2. ``truncate.intent`` naming the offset is written and fsync'ed with its directory: from
   here on the cut happens, now or at the next open;
3. in memory, in one go on the event loop: the log's end, the flushed mark, the dispatcher's
   cursor, the consume queues' entries past the cut, the next queue offsets; readers see the
   cut store from here;
4. on disk, in a worker thread: the commitlog's tail zeroed and synced (later segments are
   gone already), the cut consume-queue files synced, the newest index files rebuilt up to
   the cut, the epoch file's entries from the cut on dropped, the checkpoint lowered; then
   the spare segment made for the old end is removed;
5. the intent is removed (and the directory synced).

At open, an intent found means a truncation was under way: ``complete_pending`` cuts the
commitlog files (later ones deleted, the tail zeroed, synced) and the epoch file to its offset
before anything is loaded, and recovery, told it is a crash, cuts the queues and the index to
the log it finds.

While a truncation runs the store takes no puts; the index is detached (a query by key finds
nothing for that moment). Only the change-to-master path may cut a store that takes puts
(``MessageStore.truncate_to``). An I/O error after step 2 is ``TruncationUnfinished``: the
store then takes no puts until its next open finishes the cut.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Protocol

import trio

import trio_ha._backend as _backend

from .._durable import fsync_dir
from .._errors import TrioHAError
from ..config import StoreConfig
from ..wire import layout
from .admission import Admission, max_record_size
from .checkpoint import Checkpoint
from .commitlog import CommitLog
from .confirm import ConfirmOffset
from .consume_queue import ConsumeQueue, ConsumeQueueTable
from .dispatch import Dispatcher
from .ha.epochs import EpochFile, EpochFileError
from .ha.master import HAService
from .index import IndexService
from .segment import Segment

__all__ = [
    "INTENT_NAME", "TruncatedStore", "TruncationError", "TruncationUnfinished",
    "complete_pending", "truncate_live", "truncate_to",
]

log = logging.getLogger(__name__)

#: in the store's root while a truncation is under way: ``truncate-to <offset>``
INTENT_NAME = "truncate.intent"
_INTENT_PREFIX = b"truncate-to "
#: records the boundary check reads per scan call
_SCAN_BATCH = 4096

#: called with each step's name as a truncation passes it (tests kill the process there);
#: None in production
step_hook: Callable[[str], None] | None = None


class TruncatedStore(Protocol):
    """What a truncation uses of the MessageStore (the index it takes away and puts back;
    its admission, which refuses puts while the log is cut)."""

    index: IndexService | None

    @property
    def admission(self) -> Admission: ...

    @property
    def confirm(self) -> ConfirmOffset | None: ...

    @property
    def config(self) -> StoreConfig: ...

    @property
    def root(self) -> str: ...

    @property
    def commitlog(self) -> CommitLog: ...

    @property
    def queues(self) -> ConsumeQueueTable: ...

    @property
    def dispatcher(self) -> Dispatcher: ...

    @property
    def checkpoint(self) -> Checkpoint: ...

    @property
    def epochs(self) -> EpochFile | None: ...

    @property
    def ha_service(self) -> HAService | None: ...


class TruncationError(TrioHAError):
    """A truncation was refused: nothing was changed. The message says why."""


class TruncationUnfinished(TrioHAError):
    """A truncation failed after it began (an I/O error): the store is cut in memory but
    perhaps not on disk. It takes no more puts; reopening it finishes the cut."""


def _step(name: str) -> None:
    if step_hook is not None:
        step_hook(name)


# ---- the live cut -------------------------------------------------------------------------


async def truncate_to(store: TruncatedStore, offset: int, *, for_new_master: bool = False) -> int:
    """Cut the log back to ``offset`` (a record boundary at or below the max offset), with
    its consume queues, index, epoch file and checkpoint, crash-safely; the bytes cut.
    Reads, pulls, max offsets and the next put or replicated byte all follow the cut once
    it returns. (``MessageStore.truncate_to`` is this function.)

    A store that takes puts (a master) is refused, unless the change-to-master path says it
    is that (``for_new_master``: it cuts before it serves as master; puts get
    SERVICE_NOT_AVAILABLE meanwhile). Whoever appends otherwise (a slave's HA client) stops
    first. TruncationError, with nothing changed, when it cannot be done;
    TruncationUnfinished when an I/O error stopped it half-way: the store then refuses puts
    until it is reopened, which finishes the cut (puts taken meanwhile would be cut by
    it)."""
    admission = store.admission
    refusal = admission.cut_refusal(for_new_master)
    if refusal is not None:
        await trio.lowlevel.checkpoint()
        raise TruncationError(refusal)
    accepting = admission.begin_cut()
    confirm = store.confirm
    if confirm is not None:
        confirm.before_cut(offset)  # (the cut waits for what it keeps to be dispatched)
    try:
        cut = await truncate_live(store, offset, max_record_size(store.config))
    except TruncationUnfinished:
        raise  # refusing puts for good (the admission stays ``truncating``)
    except BaseException:
        admission.end_cut(accepting)
        raise
    finally:
        if confirm is not None:
            confirm.after_cut(store.commitlog.max_offset)
    admission.end_cut(accepting)
    return cut


async def truncate_live(store: TruncatedStore, offset: int, max_record: int) -> int:
    """Cut ``store`` (running, taking no puts) back to ``offset``; the bytes cut. See the
    module's docstring for the steps. TruncationError, with nothing changed, when the offset
    is not a record boundary at or below the max offset, or the store's HA service has
    acknowledged bytes past it (slaves attached: close them first)."""
    await trio.lowlevel.checkpoint()
    commitlog = store.commitlog
    end = commitlog.max_offset
    _refuse_unless_cuttable(store, offset, end)
    await _check_boundary(commitlog, offset, end, max_record)
    dispatcher = store.dispatcher
    if dispatcher.error is not None:
        raise TruncationError(f"the store is read-only ({dispatcher.error}): it cannot be cut")
    # A broken epoch file refuses the cut now, before anything changed.
    epochs = store.epochs
    if epochs is None:
        try:
            epochs = await trio.to_thread.run_sync(_epochs_on_disk, store.config)
        except EpochFileError as exc:
            raise TruncationError(f"cannot truncate to {offset}: {exc}") from exc
    # Every record kept must be in its consume queue before the queues are cut: the next
    # queue offsets are derived from them.
    await dispatcher.dispatched.wait_for(offset)
    async with commitlog.flush_lock:
        end = commitlog.max_offset
        _refuse_unless_cuttable(store, offset, end)
        _step("checked")
        intent = intent_path(store.root)
        # From the intent on the cut must finish, here or at the next open: a cancelled
        # caller does not stop it half-way.
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(_write_intent, intent, offset)
            except OSError as exc:
                raise TruncationError(f"cannot truncate to {offset}: cannot write "
                                      f"{intent}: {exc}") from exc
            _step("intent-written")
            try:
                await _cut(store, offset, epochs, max_record, intent)
            except Exception as exc:
                raise TruncationUnfinished(
                    f"the truncation of {store.root} to {offset} failed half-way ({exc!r}); "
                    "the store takes nothing more, and its next open finishes the cut"
                ) from exc
    log.log(logging.WARNING if end > offset else logging.INFO,
            "store %s truncated to %d: %d bytes cut", store.root, offset, end - offset)
    return end - offset


async def _cut(store: TruncatedStore, offset: int, epochs: EpochFile | None, max_record: int,
               intent: str) -> None:
    """Steps 3 to 5, once the intent is on disk."""
    commitlog, dispatcher = store.commitlog, store.dispatcher
    cut_queues, index = _cut_in_memory(store, offset)
    _step("memory-cut")
    try:
        await trio.to_thread.run_sync(
            _cut_on_disk, commitlog, cut_queues, index, epochs, store.checkpoint, offset,
            max_record, abandon_on_cancel=False,
        )
    finally:
        if index is not None:
            store.index = index
            dispatcher.indexer = index
    # A spare segment made for the old end would lie past a gap: the next open refuses it.
    await commitlog.drop_spare()
    _step("spare-dropped")
    await trio.to_thread.run_sync(_remove_intent, intent)
    _step("intent-removed")


def _refuse_unless_cuttable(store: TruncatedStore, offset: int, end: int) -> None:
    commitlog = store.commitlog
    if offset < 0 or offset > end:
        raise TruncationError(f"cannot truncate to {offset}: the log ends at {end}")
    if offset < end and offset < commitlog.min_offset:
        raise TruncationError(f"cannot truncate to {offset}: the log's first offset is "
                              f"{commitlog.min_offset} (older segments were deleted)")
    ha = store.ha_service
    if ha is not None and (ha.connections or ha.replicated.value > offset):
        raise TruncationError(
            f"cannot truncate to {offset} while this store's HA service has slaves attached "
            f"or counted acks up to {ha.replicated.value}: a slave's ack past the cut would "
            "answer SYNC_MASTER puts for bytes no slave has")


async def _check_boundary(commitlog: CommitLog, offset: int, end: int,
                          max_record: int) -> None:
    """TruncationError unless a record starts at ``offset`` (or the log ends there)."""
    if offset == end:
        await trio.lowlevel.checkpoint()
        return
    segment = commitlog.segments.find(offset)
    if segment is None:
        raise TruncationError(f"cannot truncate to {offset}: no commitlog segment holds it")
    with segment.hold():
        problem = await trio.to_thread.run_sync(_walk_to, segment, offset, max_record)
    if problem is not None:
        raise TruncationError(f"cannot truncate to {offset}: {problem}")


def _walk_to(segment: Segment, offset: int, max_record: int) -> str | None:
    """Walk the record headers of ``segment`` up to ``offset``: None if a record starts
    there, else what is there. (The bytes below the log's end do not change.)"""
    scanner = _backend.engine.scanner(_SCAN_BATCH)
    limit = offset - segment.base_offset
    position = 0
    while True:
        result = scanner.scan(segment.handle, limit, position, segment.base_offset, 0,
                              max_record)
        position = result.end
        if result.stop != _backend.STOP_FULL:
            break
    if position == limit:
        return None
    at = segment.base_offset + position
    if result.stop == _backend.STOP_PARTIAL:
        return (f"it is not a record boundary: the record at {at} ({result.size} bytes) "
                f"spans it")
    if result.stop == _backend.STOP_BLANK:
        return f"it lies in the filler that ends segment {segment.path} (its records end at {at})"
    return f"the records stop at {at} before it ({result.reason})"


def _cut_in_memory(store: TruncatedStore, offset: int
                   ) -> tuple[list[ConsumeQueue], IndexService | None]:
    """The cut as readers see it, with no await in between: the log's end and flushed mark,
    the dispatcher's cursor, the consume queues, the next queue offsets. The index is taken
    away from queries and the dispatcher until the disk step rebuilt it (returned)."""
    commitlog, dispatcher = store.commitlog, store.dispatcher
    commitlog.segments.truncate(offset)  # later segments go (unlinked, or when let go)
    commitlog.written.rewind(offset)
    commitlog.flushed.rewind(offset)
    dispatcher.start_at(offset)
    cut: list[ConsumeQueue] = []
    for queue in store.queues:
        if queue.max_physical_offset > offset:
            queue.truncate_dirty(offset)
            cut.append(queue)
    commitlog.queue_offsets = {
        (queue.topic, queue.queue_id): queue.max_offset for queue in store.queues
    }
    index = store.index
    store.index = None
    dispatcher.indexer = None
    return cut, index


def _cut_on_disk(commitlog: CommitLog,
                 cut_queues: list[ConsumeQueue], index: IndexService | None,
                 epochs: EpochFile | None, checkpoint: Checkpoint, offset: int,
                 max_record: int) -> None:
    """Blocking (a worker thread): make the cut durable, step by step."""
    _zero_tail(commitlog, offset)
    _step("commitlog-zeroed")
    for queue in cut_queues:
        last = queue.files.last
        if last is not None:
            last.sync_range(0, last.size)
    _step("queues-synced")
    if index is not None:
        index.catch_up(commitlog, offset, max_record)
        index.sync()
    _step("index-cut")
    if epochs is not None:
        epochs.truncate_from(offset)
    _step("epochs-cut")
    _lower_checkpoint(checkpoint, offset)
    _step("checkpoint-written")


def _zero_tail(commitlog: CommitLog, offset: int) -> None:
    """Zero and sync what follows ``offset`` in its segment (RocketMQ leaves it valid)."""
    last = commitlog.segments.last
    if last is None or not last.base_offset <= offset < last.end_offset:
        return
    tail = offset - last.base_offset
    _backend.engine.zero(last.handle, tail, last.size - tail)
    last.sync_range(tail, last.size)


def _epochs_on_disk(config: StoreConfig) -> EpochFile | None:
    """The store's epoch file, if it has one (EpochFileError when it cannot be read)."""
    path = config.epoch_file_path
    if not (os.path.exists(path) or os.path.exists(path + ".bak")):
        return None
    return EpochFile.load(path)


def _lower_checkpoint(checkpoint: Checkpoint, offset: int) -> None:
    if checkpoint.master_flushed_offset > offset or checkpoint.confirm_phy_offset > offset:
        checkpoint.master_flushed_offset = min(checkpoint.master_flushed_offset, offset)
        checkpoint.confirm_phy_offset = min(checkpoint.confirm_phy_offset, offset)
        checkpoint.write()


# ---- the intent ----------------------------------------------------------------------------


def intent_path(root: str) -> str:
    return os.path.join(root, INTENT_NAME)


def _write_intent(path: str, offset: int) -> None:
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, _INTENT_PREFIX + b"%d\n" % offset)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path))


def read_intent(root: str) -> int | None:
    """The offset of the truncation under way in the store at ``root`` (None: none is).
    The file is written whole or not at all (a rename); anything else in it is an error."""
    path = intent_path(root)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    text = data.removeprefix(_INTENT_PREFIX).rstrip(b"\n")
    if not data.startswith(_INTENT_PREFIX) or not text.isdigit():
        raise TruncationError(f"{path} names no offset ({data[:64]!r}): a truncation was under "
                              "way; see docs/formats.md 'Truncation' before removing it")
    return int(text)


def _remove_intent(path: str) -> None:
    os.unlink(path)
    fsync_dir(os.path.dirname(path))


# ---- at open ---------------------------------------------------------------------------------


def complete_pending(config: StoreConfig, root: str) -> int | None:
    """Blocking, at open, before anything is loaded: finish the truncation a crash
    interrupted, if any (its offset; None when there was none). The commitlog files from the
    cut on are deleted, newest first, and the rest of the one holding it is zeroed and
    synced; the epoch file and the checkpoint follow; the intent goes. Recovery, run as
    after a crash, then cuts the consume queues and the index to the log it finds."""
    offset = read_intent(root)
    if offset is None:
        return None
    log.warning("store %s: a truncation to %d was under way; finishing it", root, offset)
    directory = config.commitlog_dir
    files = sorted(
        (base, name) for name in os.listdir(directory)
        if (base := layout.parse_segment_file_name(name)) is not None
    ) if os.path.isdir(directory) else []
    for base, name in reversed(files):
        if base >= offset:
            os.unlink(os.path.join(directory, name))
        else:
            _zero_file_from(os.path.join(directory, name), offset - base)
            break
    if files:
        fsync_dir(directory)
    _step("recovery-cut")
    epochs = _epochs_on_disk(config)
    if epochs is not None:
        epochs.truncate_from(offset)
    _lower_checkpoint(Checkpoint.load(os.path.join(root, "checkpoint")), offset)
    _remove_intent(intent_path(root))
    return offset


def _zero_file_from(path: str, position: int) -> None:
    """Zero what is not zero from ``position`` to the end of the file, and sync it (holes
    stay holes: a chunk of zeros is not written again)."""
    chunk = 1 << 20
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        while position < size:
            length = min(chunk, size - position)
            if any(os.pread(fd, length, position)):
                os.pwrite(fd, bytes(length), position)
            position += length
        os.fsync(fd)
    finally:
        os.close(fd)
