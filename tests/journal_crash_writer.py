"""Child process of the journal's SIGKILL test (tests/test_controller_journal.py).

Usage: ``python tests/journal_crash_writer.py DIR RUN``

Opens the controller journal at DIR with a tiny compaction threshold (so snapshots are
written and switched in all the time, and a kill lands inside compaction often) and has
WRITERS concurrent tasks commit until it is killed. Writer ``w`` owns the keys ``w<w>k0`` to
``w<w>k<KEYS-1>``, so its commits never conflict and the parent can model each writer's
records exactly. Before each commit it writes, in one ``write(2)``::

    TRY <w> <tag> <key>=P|D ...      (P: put the tag's bytes, D: delete)

and when the commit returns::

    ACK <w> <tag> <version>          (the version of its puts; 0 when it put nothing)

Other lines: ``START``, ``OPENED <sequence> <records>`` once the journal is open, ``BUG
<text>`` (a conflict on an owned key: the parent fails). A writer has at most one commit in
flight, so after a kill each writer's records are its acknowledged state, or that state with
its last TRY applied.
"""

from __future__ import annotations

import os
import random
import sys

# The package comes from the checkout this file lives in, whatever the working directory.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

import trio  # noqa: E402

from trio_ha.controller import CommitConflict, Journal, Write  # noqa: E402

WRITERS = 6
KEYS = 5
COMPACT_BYTES = 4096
#: a run stops committing after this many commits per writer (bounds a run's work)
MAX_COMMITS = 3000


def key_of(writer: int, index: int) -> str:
    return f"w{writer}k{index}"


def _emit(text: str) -> None:
    data = text.encode()
    while data:
        data = data[os.write(1, data):]


async def _writer(journal: Journal, run: int, writer: int, versions: dict[str, int]) -> None:
    rng = random.Random(f"{run}:{writer}")
    for n in range(MAX_COMMITS):
        tag = f"r{run}w{writer}n{n}"
        keys = rng.sample([key_of(writer, i) for i in range(KEYS)], rng.randint(1, 3))
        writes = []
        for key in keys:
            delete = key in versions and rng.random() < 0.25
            writes.append(Write(key, versions.get(key, 0), None if delete else tag.encode()))
        _emit(f"TRY {writer} {tag} "
              + " ".join(f"{w.key}={'D' if w.value is None else 'P'}" for w in writes) + "\n")
        try:
            result = await journal.commit(writes)
        except CommitConflict as exc:
            _emit(f"BUG {writer} {exc}\n")
            raise
        for write in writes:
            if write.value is None:
                versions.pop(write.key, None)
            else:
                versions[write.key] = result[write.key]
        _emit(f"ACK {writer} {tag} {max(result.values(), default=0)}\n")


async def main(directory: str, run: int) -> None:
    _emit("START\n")
    async with Journal.open(directory, compact_bytes=COMPACT_BYTES) as journal:
        records = await journal.load()
        _emit(f"OPENED {journal.statistics().sequence} {len(records)}\n")
        async with trio.open_nursery() as nursery:
            for writer in range(WRITERS):
                mine = {
                    key: records[key].version
                    for i in range(KEYS)
                    if (key := key_of(writer, i)) in records
                }
                nursery.start_soon(_writer, journal, run, writer, mine)
        _emit("DONE\n")
        await trio.sleep_forever()  # the parent kills us; never a clean close


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} DIR RUN")
    trio.run(main, sys.argv[1], int(sys.argv[2]))
