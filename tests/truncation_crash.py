"""Child process of the truncation crash tests (tests/test_truncation.py).

Usage: ``python tests/truncation_crash.py STORE_DIR STEP``

Opens the store at STORE_DIR (``store_config``), puts ``MESSAGES`` messages (``message``
says which; the same every run), records four epochs in the epoch file, prints
``CUT <offset> <end> <epoch 2's start> <epoch 4's start>`` (the cut is the offset of
message ``CUT_AT``) and then cuts the store there with
``MessageStore.truncate_to`` as the change-to-master path does. When the truncation passes
STEP (a name ``trio_ha.store.truncation`` announces), the process SIGKILLs itself. STEP
``reopen:<name>`` instead opens an existing store and dies at that step of finishing an
interrupted truncation. ``none`` lets it finish: it prints ``DONE`` and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha import Message, StoreConfig, open_store  # noqa: E402
from trio_ha.store import truncation  # noqa: E402
from trio_ha.store.ha.epochs import EpochFile  # noqa: E402

MESSAGES = 600
CUT_AT = 250
TOPICS = ("CutA", "CutB")
QUEUES = 3


def store_config(root: str) -> StoreConfig:
    # Small files, so the cut deletes commitlog segments, zeroes the tail of another, and
    # cuts consume-queue and index files in the middle.
    return StoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 100,
        max_hash_slot_num=500,
        max_index_num=300,
    )


def message(i: int) -> tuple[Message, int]:
    """The i-th message and its queue id."""
    topic = TOPICS[i % len(TOPICS)]
    body = (f"{i}:".encode() * 200)[: 200 + i % 97]
    return Message(topic, body, tags=f"T{i % 4}", keys=f"key{i}"), i % QUEUES


def epochs_before(cut: int, offsets: list[int]) -> list[tuple[int, int]]:
    """The epochs the child records: two before the cut, one at it, one after."""
    return [(1, 0), (2, offsets[100]), (3, cut), (4, offsets[400])]


def _kill_at(step: str):
    def hook(name: str) -> None:
        if name == step:
            os.kill(os.getpid(), signal.SIGKILL)

    return hook


async def main(root: str, step: str) -> None:
    config = store_config(root)
    if step.startswith("reopen:"):
        truncation.step_hook = _kill_at(step.removeprefix("reopen:"))
        async with open_store(config):
            pass
        print("DONE", flush=True)
        return
    async with open_store(config) as store:
        offsets = []
        for i in range(MESSAGES):
            msg, queue_id = message(i)
            result = await store.put_message(msg, queue_id)
            assert result.ok, result
            offsets.append(result.commitlog_offset)
        cut = offsets[CUT_AT]
        epochs = EpochFile.load(config.epoch_file_path)
        for epoch, start in epochs_before(cut, offsets):
            assert epochs.append(epoch, start)
        store.epochs = epochs
        await store.wait_dispatched()
        print(f"CUT {cut} {store.max_commitlog_offset} {offsets[100]} {offsets[400]}",
              flush=True)
        truncation.step_hook = _kill_at(step)
        await store.truncate_to(cut, for_new_master=True)
        truncation.step_hook = None
    print("DONE", flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2])
