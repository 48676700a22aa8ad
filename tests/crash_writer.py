"""Child process of the crash-durability tests (tests/test_crash.py).

Usage: ``python tests/crash_writer.py STORE_DIR SEED [RUN]``

Opens the store at STORE_DIR with SYNC_FLUSH and small segments (so commitlog segments and
consume-queue files roll often) and has several concurrent writer tasks put messages — single
puts and batches, several topics and queues, random body sizes — until it is killed. As soon as
a put returns PUT_OK it writes, in one ``write(2)`` to stdout (no buffering)::

    ACK <commitlog_offset> <key> <topic> <queue_id> <queue_offset>

one line per stored record (a batch gives one line per record, offsets from the result).
Other lines: ``START`` (before the store is opened), ``RECOVERING`` (recovery begins),
``OPENED <abnormal> <end_offset>
<records> <stop_reason...>`` (after ``open_store`` yielded: the store's abort file exists
from here on), ``NACK <status> <key> <remark...>`` for a put that did not return PUT_OK.

Keys never repeat across runs on one store: they carry the seed and the run number (RUN, or
when it is not given, a counter kept in ``STORE_DIR.runs`` next to the store). The body of a
message is derived from its key alone (``expected_body``), so the parent can check every
byte of every record it finds, acknowledged or not.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sys

# The package comes from the checkout this file lives in, whatever the working directory.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha import FlushDiskType, Message, StoreConfig, open_store  # noqa: E402
from trio_ha.wire import record as rec  # noqa: E402

COMMITLOG_SEGMENT = 64 * 1024
CQ_FILE = 20 * 128  # 128 entries per consume-queue file: they roll often
TOPICS = ("CrashA", "CrashB", "Crash_C-1")
QUEUES = 3
WRITERS = 6
#: a run stops putting after this many records (bounds the disk a long soak uses)
MAX_RECORDS_PER_RUN = 5000
_KEY = re.compile(r"^k(\d+)r(\d+)w(\d+)n(\d+)b(\d+)s(\d+)$")


def store_config(root: str) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(root),
        mapped_file_size_commit_log=COMMITLOG_SEGMENT,
        mapped_file_size_consume_queue=CQ_FILE,
        flush_disk_type=FlushDiskType.SYNC_FLUSH,
    )


def make_key(seed: int, run: int, writer: int, seq: int, item: int, size: int) -> str:
    return f"k{seed}r{run}w{writer}n{seq}b{item}s{size}"


def body_size(key: str) -> int:
    match = _KEY.match(key)
    if match is None:
        raise ValueError(f"not a crash_writer key: {key!r}")
    return int(match.group(6))


def expected_body(key: str) -> bytes:
    """The body a message with this key carries: sha256(key) repeated, cut to the size the
    key names."""
    size = body_size(key)
    digest = hashlib.sha256(key.encode()).digest()
    return (digest * (size // len(digest) + 1))[:size]


def expected_tags(key: str) -> str:
    return f"tag{int(hashlib.sha256(key.encode()).digest()[0]) % 7}"


def _random_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.05:
        return 0
    if roll < 0.70:
        return rng.randint(1, 300)
    if roll < 0.95:
        return rng.randint(300, 2000)
    return rng.randint(2000, 8192)


def _next_run(root: str) -> int:
    """Claim a run number: one byte appended per start (O_APPEND is atomic)."""
    path = os.path.abspath(root).rstrip(os.sep) + ".runs"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        run = os.fstat(fd).st_size
        os.write(fd, b".")
        os.fsync(fd)
    finally:
        os.close(fd)
    return run


def _emit(text: str) -> None:
    data = text.encode()
    while data:
        written = os.write(1, data)
        data = data[written:]


async def _writer(store, seed: int, run: int, writer: int, budget: list[int]) -> None:
    rng = random.Random(f"{seed}:{run}:{writer}")
    seq = 0
    while budget[0] > 0:
        topic = rng.choice(TOPICS)
        queue_id = rng.randrange(QUEUES)
        count = rng.randint(2, 4) if rng.random() < 0.2 else 1
        keys = [make_key(seed, run, writer, seq, i, _random_size(rng)) for i in range(count)]
        seq += 1
        budget[0] -= count
        messages = [
            Message(topic, expected_body(key), tags=expected_tags(key), keys=key) for key in keys
        ]
        if count == 1:
            result = await store.put_message(messages[0], queue_id)
            offsets = [result.commitlog_offset]
        else:
            result = await store.put_messages(messages, queue_id)
            offsets = [rec.decode_message_id(msg_id)[1] for msg_id in result.msg_ids]
        if result.status.name == "PUT_OK":
            _emit("".join(
                f"ACK {offset} {key} {topic} {queue_id} {result.queue_offset + i}\n"
                for i, (offset, key) in enumerate(zip(offsets, keys, strict=True))
            ))
        else:
            _emit(f"NACK {result.status.name} {keys[0]} {result.remark}\n")


def _announce_recovery() -> None:
    """Print RECOVERING when the store starts recovering, so the parent can aim a kill
    inside recovery. (Only a print around the store's own call; if the store no longer
    calls ``recover`` by that name, the line is simply not printed.)"""
    from trio_ha.store import opening as store_module

    original = getattr(store_module, "recover", None)
    if original is None:
        return

    def recover(*args, **kwargs):
        _emit("RECOVERING\n")
        return original(*args, **kwargs)

    store_module.recover = recover


async def main(root: str, seed: int, run: int) -> None:
    _announce_recovery()
    _emit("START\n")
    async with open_store(store_config(root)) as store:
        report = store.recovery
        assert report is not None  # an open store has recovered
        _emit(
            f"OPENED {report.abnormal} {report.end_offset} {report.records} "
            f"{report.stop_reason}\n"
        )
        budget = [MAX_RECORDS_PER_RUN]
        async with trio.open_nursery() as nursery:
            for writer in range(WRITERS):
                nursery.start_soon(_writer, store, seed, run, writer, budget)
        _emit("DONE\n")
        await trio.sleep_forever()  # the parent kills us; never a clean close


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(f"usage: {sys.argv[0]} STORE_DIR SEED [RUN]")
    store_dir, seed_arg = sys.argv[1], int(sys.argv[2])
    run_arg = int(sys.argv[3]) if len(sys.argv) == 4 else _next_run(store_dir)
    trio.run(main, store_dir, seed_arg, run_arg)
