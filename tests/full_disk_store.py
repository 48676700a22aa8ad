"""Child process of the full-disk tests (tests/test_full_disk.py, issue 36 defect 1).

Usage: ``python tests/full_disk_store.py PHASE DIR``

DIR is a small filesystem of its own (the parent mounts a tmpfs there). The child opens an
embedded store under it, writes until the phase's file is the next thing to need a block,
takes every free byte of the filesystem, writes on until the store refuses, checks that
what it acknowledged is readable, gives the bytes back, and checks that writes resume by
themselves and that a reopened store holds everything it acknowledged. A separate process,
because the failure this guards against is SIGBUS: a store into a page of a shared mapping
that the filesystem cannot back kills the whole process — the parent sees it as the exit
status (-7), not as a crashed test runner.

Phases: ``commitlog`` (a new commitlog segment), ``sparse_segment`` (appends into a sparse
commitlog segment found at open, as RocketMQ writes them), ``consume_queue`` (a consume-queue file
rolls), ``index`` (an index file grows past its reserved entries: few slots, small
reservation steps), ``index_roll`` (a new index file), ``checkpoint`` (the checkpoint file
cannot be created). It prints ``OK <what>`` on success and exits 0; an assertion that fails
exits 1 with its traceback on stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path

# The package comes from the checkout this file lives in, whatever the working directory.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha import FlushDiskType, Message, PutMessageStatus, StoreConfig, open_store  # noqa: E402
from trio_ha.chaos.disk import SmallDisk  # noqa: E402
from trio_ha.store import index as index_module  # noqa: E402
from trio_ha.store.checkpoint import Checkpoint  # noqa: E402

KiB = 1024
MiB = 1024 * KiB
#: a phase writes at most this many messages before the store must refuse one
MAX_PUTS = 5000
#: seconds a phase waits for the store to resume once the bytes are back
RESUME_WITHIN = 15


class LineCounter(logging.Handler):
    """Counts the log lines that contain a text (one line per event, never a flood)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.count += 1


def config_for(phase: str, root: Path) -> StoreConfig:
    values: dict = dict(
        store_path_root_dir=str(root / "store"),
        mapped_file_size_commit_log=1 * MiB,
        flush_disk_type=FlushDiskType.ASYNC_FLUSH,
        allocate_timeout=500,
        # The monitor would refuse puts before the files run out of room; the point here is
        # what happens when they do (something else filled the disk faster than it looks).
        disk_space_warning_level_ratio=100,
        flush_interval_consume_queue=50,
        flush_consume_queue_thorough_interval=100,
    )
    if phase == "sparse_segment":
        values["message_index_enable"] = False  # (the index would fault first on main)
    if phase == "consume_queue":
        values["mapped_file_size_consume_queue"] = 16 * 20  # a new file every 16 entries
    if phase in ("index", "index_roll"):
        # 400 KB of slots: a new key's slot is most likely on a page not touched before
        values.update(max_hash_slot_num=100_000, max_index_num=300)
    return StoreConfig(**values)


async def make_sparse_segment(config: StoreConfig) -> None:
    """A store whose only commitlog segment is sparse past its first record, as RocketMQ
    leaves its segments (it maps them without reserving blocks) or a copy may."""
    async with open_store(config) as store:
        assert (await store.put_message(Message("Full", b"before", keys="before"))).ok
    sparsify(Path(config.commitlog_dir), config.mapped_file_size_commit_log)


def sparsify(directory: Path, size: int) -> None:
    """The one segment in ``directory`` rewritten: its first page, then a hole."""
    [path] = directory.iterdir()
    used = path.read_bytes()[: 4 * KiB]
    path.unlink()
    with open(path, "wb") as f:
        f.write(used)
        f.truncate(size)
    assert path.stat().st_blocks * 512 < size


def checkpoint_size(root: str) -> int | None:
    try:
        return os.path.getsize(os.path.join(root, "checkpoint"))
    except FileNotFoundError:
        return None


def n_before_fill(index) -> int:
    """Entries in the newest index file (its header counts one more: entry 0 is unused)."""
    return index.files[-1].header().index_count - 1 if index.files else 0


async def wait_for(predicate, what: str, timeout: float = RESUME_WITHIN):
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if hasattr(value, "__await__"):
                value = await value
            if value:
                return value
            await trio.sleep(0.02)
    raise AssertionError(f"gave up after {timeout} s waiting for {what}")


async def run(phase: str, root: Path) -> None:
    if phase == "index":
        index_module.RESERVE_ENTRIES = 64  # the entries grow past a reservation often
    config = config_for(phase, root)
    disk = SmallDisk(root, 0)  # mounted by the parent; the child only fills and frees it
    acked: list[tuple[str, int, str]] = []  # topic, queue offset, key
    body = b"b" * (2 * KiB)
    refusals: set[PutMessageStatus] = set()
    counter = LineCounter("cannot write the checkpoint")
    logging.getLogger("trio_ha").addHandler(counter)
    if phase == "sparse_segment":
        await make_sparse_segment(config)
    async with open_store(config) as store:
        async def put(n: int) -> bool:
            key = f"key-{n}"
            result = await store.put_message(Message("Full", body, keys=key))
            if result.ok:
                acked.append(("Full", result.queue_offset, key))
                return True
            refusals.add(result.status)
            return False

        assert await put(0)
        await store.wait_dispatched()
        if phase == "index_roll":
            # Up to the last entry of the first index file: the next put needs a new file.
            index = store.index
            assert index is not None
            while n_before_fill(index) < config.max_index_num - 1 and len(acked) < MAX_PUTS:
                assert await put(len(acked))
                await store.wait_dispatched()
            assert len(index.files) == 1 and index.files[0].is_full
        if phase == "checkpoint":
            with contextlib.suppress(FileNotFoundError):  # (not written yet, or written)
                os.unlink(os.path.join(store.root, "checkpoint"))
        # A page left for the new index file's header (or whatever takes it first).
        disk.fill(leave=4 * KiB if phase == "index_roll" else 0)
        n = len(acked)
        if phase == "checkpoint":
            # The rounds run every 50 ms: a second of them, each failing to create the file.
            for _ in range(20):
                assert await put(n)
                n += 1
                await trio.sleep(0.05)
            assert checkpoint_size(store.root) in (None, 0, 4096)  # never a torn one
            assert 1 <= counter.count <= 2, counter.count  # one line, not one per round
        else:
            while n < MAX_PUTS and await put(n):
                n += 1
                if n % 8 == 0:
                    await trio.sleep(0.005)  # let the dispatcher reach the full file
            assert refusals, f"{n} puts on a full disk and none refused"
            expected = (PutMessageStatus.CREATE_MAPEDFILE_FAILED
                        if phase in ("commitlog", "sparse_segment")
                        else PutMessageStatus.SERVICE_NOT_AVAILABLE)
            assert refusals == {expected}, refusals
        # Reads go on: everything acknowledged that was indexed before the disk filled.
        [first] = await store.get_messages("Full", 0, acked[0][1], 1)
        assert first.body == body and acked[0][2] in first.keys
        disk.release()

        async def taken() -> bool:
            return await put(10 * MAX_PUTS + len(acked))

        await wait_for(taken, "puts to be taken again once the bytes are back")
        await store.wait_dispatched()
        if phase == "checkpoint":
            await wait_for(lambda: Checkpoint.load(os.path.join(store.root, "checkpoint"))
                           .physic_msg_timestamp > 0, "the checkpoint to be written")
    # Reopened: every acknowledged message is there, by queue offset and (index) by key.
    async with open_store(config) as store:
        for topic, queue_offset, key in acked:
            [message] = await store.get_messages(topic, 0, queue_offset, 1)
            assert key in message.keys, (queue_offset, key, message.keys)
            if phase.startswith("index"):
                found = store.query_message(topic, key, 4, 0, 2**62)
                assert len(found.records) == 1, (key, len(found.records))
    print(f"OK {phase}: {len(acked)} acknowledged, refused with "
          f"{sorted(s.name for s in refusals)}", flush=True)


def main() -> None:
    phase, directory = sys.argv[1], Path(sys.argv[2])
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    trio.run(run, phase, directory)


if __name__ == "__main__":
    main()
