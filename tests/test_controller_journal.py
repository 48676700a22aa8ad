"""The controller's write-ahead journal (issue 39): real files, real fsync, real SIGKILLs.

What a restarted controller must know is everything it committed; so each test commits
through ``Journal``, damages or kills where a crash would, opens the directory again and
compares the records (bytes and versions) with what was acknowledged:

- commits, conflicts (nothing written), deletes, versions that never come back after a
  delete, replay after a restart;
- the last frame cut at every byte (a crash mid-append) recovers to the commit before it;
  a byte flipped anywhere in a frame that whole frames follow refuses to open;
- compaction keeps the records and versions, and a stop after each of its steps (tmp file
  written; renamed) opens to the same records;
- one directory, one journal (flock), across tasks and processes;
- many tasks committing at once: each commit durable, versions unique, one fsync per group;
- a child committing with compaction every few KiB, SIGKILLed at random moments, again and
  again: every acknowledged commit is there, the one in flight is all there or not at all;
- a full disk (a tmpfs of our own, root only) fails the commit with ``JournalFailed`` and a
  restart recovers what was acknowledged.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from trio_ha.chaos import disk
from trio_ha.controller import (
    CommitConflict,
    CompactionFailed,
    Journal,
    JournalCorrupt,
    JournalFailed,
    JournalLocked,
    JournalStatistics,
    Versioned,
    Write,
)
from trio_ha.controller import journal_format as fmt
from trio_ha.controller.journal import (
    JOURNAL_NAME,
    SNAPSHOT_TMP_NAME,
    install_snapshot,
    write_snapshot,
)

_WRITER = Path(__file__).with_name("journal_crash_writer.py")
SEED = int(os.environ.get("CRASH_SEED", "20261207"))
CHILD_EVENT_TIMEOUT = 60.0


def journal_file(directory: Path) -> Path:
    return directory / JOURNAL_NAME


async def records_of(directory: Path) -> dict[str, Versioned]:
    async with Journal.open(directory) as journal:
        return dict(await journal.load())


# ---- commits, conflicts, deletes, replay -------------------------------------------------------


async def test_round_trip_and_replay(tmp_path):
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == {}
        assert await journal.commit([Write("a", 0, b"1"), Write("b", 0, b"")]) == {"a": 1, "b": 1}
        assert await journal.commit([Write("a", 1, b"2")]) == {"a": 2}
        assert await journal.commit([Write("c", 0, bytes(range(256)) * 40)]) == {"c": 3}
        state = dict(await journal.load())
        stats = journal.statistics()
    assert state == {
        "a": Versioned(2, b"2"), "b": Versioned(1, b""), "c": Versioned(3, bytes(range(256)) * 40),
    }
    assert (stats.commits, stats.frames, stats.records, stats.sequence) == (3, 3, 3, 3)
    assert stats.file_bytes == journal_file(tmp_path).stat().st_size
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == state
        assert journal.statistics().recovered_frames == 3
        # The counter survives the restart: the next commit gives out version 4.
        assert await journal.commit([Write("d", 0, b"x")]) == {"d": 4}


async def test_load_is_a_copy(tmp_path):
    async with Journal.open(tmp_path) as journal:
        await journal.commit([Write("a", 0, b"1")])
        before = await journal.load()
        await journal.commit([Write("a", 1, b"2")])
        assert before == {"a": Versioned(1, b"1")}


async def test_conflicts_write_nothing(tmp_path):
    async with Journal.open(tmp_path) as journal:
        await journal.commit([Write("a", 0, b"1"), Write("b", 0, b"1")])
        size = journal_file(tmp_path).stat().st_size
        refused = [
            [Write("a", 0, b"x")],  # must not exist yet, but does
            [Write("a", 2, b"x")],  # a version it never had
            [Write("z", 1, b"x")],  # absent, but expected at 1
            [Write("z", 3, None)],  # a delete of an absent record at a version
            # all-or-nothing: "a" is current, "b" is stale
            [Write("a", 1, b"x"), Write("b", 7, b"x"), Write("new", 0, b"x")],
        ]
        for writes in refused:
            with pytest.raises(CommitConflict):
                await journal.commit(writes)
        assert journal_file(tmp_path).stat().st_size == size
        assert await journal.load() == {"a": Versioned(1, b"1"), "b": Versioned(1, b"1")}
        stats = journal.statistics()
        assert (stats.conflicts, stats.commits, stats.sequence) == (len(refused), 1, 1)
    assert await records_of(tmp_path) == {"a": Versioned(1, b"1"), "b": Versioned(1, b"1")}


async def test_delete_and_no_version_comes_back(tmp_path):
    async with Journal.open(tmp_path) as journal:
        await journal.commit([Write("a", 0, b"1"), Write("b", 0, b"1")])
        assert await journal.commit([Write("a", 1, None)]) == {}
        assert await journal.load() == {"b": Versioned(1, b"1")}
        # Deleting what is absent (expected 0) is allowed and writes nothing.
        size = journal_file(tmp_path).stat().st_size
        assert await journal.commit([Write("a", 0, None)]) == {}
        assert journal_file(tmp_path).stat().st_size == size
        # Written again, "a" gets a version it never had: a reader that still holds
        # version 1 of the old record cannot write over the new one.
        assert await journal.commit([Write("a", 0, b"again")]) == {"a": 3}
        with pytest.raises(CommitConflict):
            await journal.commit([Write("a", 1, b"stale")])
        # a delete and a put in one commit
        assert await journal.commit([Write("a", 3, None), Write("c", 0, b"c")]) == {"c": 4}
    assert await records_of(tmp_path) == {"b": Versioned(1, b"1"), "c": Versioned(4, b"c")}


async def test_misuse_is_refused_before_anything_is_written(tmp_path):
    async with Journal.open(tmp_path) as journal:
        with pytest.raises(ValueError, match="twice"):
            await journal.commit([Write("a", 0, b"1"), Write("a", 0, b"2")])
        with pytest.raises(ValueError, match="key"):
            await journal.commit([Write("", 0, b"1")])
        with pytest.raises(ValueError, match="key"):
            await journal.commit([Write("k" * 70000, 0, b"1")])
        with pytest.raises(ValueError, match="negative"):
            await journal.commit([Write("a", -1, b"1")])
        assert await journal.commit([]) == {}
        assert journal.statistics().sequence == 0
    assert journal_file(tmp_path).stat().st_size == fmt.FILE_HEADER_SIZE


async def test_statistics_are_a_frozen_snapshot(tmp_path):
    async with Journal.open(tmp_path) as journal:
        before = journal.statistics()
        await journal.commit([Write("a", 0, b"1")])
        after = journal.statistics()
    assert isinstance(before, JournalStatistics)
    assert before.commits == 0 and after.commits == 1
    assert after.fsyncs > before.fsyncs
    assert after.bytes_written == after.file_bytes - fmt.FILE_HEADER_SIZE
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        after.commits = 5  # type: ignore[misc]


# ---- torn tails and damage -----------------------------------------------------------------------


async def _three_commits(directory: Path) -> tuple[list[int], list[dict[str, Versioned]]]:
    """Three commits; the file's size and the records after each (index 0: empty)."""
    sizes: list[int] = []
    states: list[dict[str, Versioned]] = []
    async with Journal.open(directory) as journal:
        sizes.append(journal_file(directory).stat().st_size)
        states.append({})
        for writes in (
            [Write("set/a", 0, b"A" * 30), Write("set/b", 0, b"B" * 5)],
            [Write("set/a", 1, b"A2"), Write("set/b", 1, None)],
            [Write("set/c", 0, b"C" * 20), Write("set/a", 2, b"A3")],
        ):
            await journal.commit(writes)
            sizes.append(journal_file(directory).stat().st_size)
            states.append(dict(await journal.load()))
    return sizes, states


async def test_torn_tail_at_every_byte_recovers_to_the_commit_before(tmp_path):
    sizes, states = await _three_commits(tmp_path / "orig")
    original = journal_file(tmp_path / "orig").read_bytes()
    assert len(original) == sizes[3]
    for cut in range(sizes[2], sizes[3]):
        directory = tmp_path / f"cut{cut}"
        directory.mkdir()
        journal_file(directory).write_bytes(original[:cut])
        async with Journal.open(directory) as journal:
            assert await journal.load() == states[2], f"cut at {cut}"
            stats = journal.statistics()
            assert stats.cut_bytes == cut - sizes[2]
            assert stats.recovered_frames == 2
            assert journal_file(directory).stat().st_size == sizes[2]
            # and it goes on: the next commit takes the version the torn one had
            assert await journal.commit([Write("set/d", 0, b"d")]) == {"set/d": 3}
        assert await records_of(directory) == {**states[2], "set/d": Versioned(3, b"d")}
        shutil.rmtree(directory)


@pytest.mark.parametrize("filler", [b"\0", b"\xa5"])
async def test_last_frame_lost_in_a_power_cut_is_cut(tmp_path, filler):
    """A power loss can keep a file's new size but not its new bytes: zeros, or whatever the
    blocks held. Never acknowledged (its fsync never returned), so it is cut."""
    sizes, states = await _three_commits(tmp_path)
    data = bytearray(journal_file(tmp_path).read_bytes())
    data[sizes[2] + 5 :] = filler * (sizes[3] - sizes[2] - 5)
    journal_file(tmp_path).write_bytes(bytes(data))
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == states[2]
        assert journal.statistics().cut_bytes == sizes[3] - sizes[2]


async def test_a_flipped_byte_before_the_tail_refuses_to_open(tmp_path):
    sizes, _ = await _three_commits(tmp_path / "orig")
    original = journal_file(tmp_path / "orig").read_bytes()
    directory = tmp_path / "damaged"
    directory.mkdir()
    # every byte of the header, of the first frame and of the middle frame
    for position in range(sizes[2]):
        damaged = bytearray(original)
        damaged[position] ^= 0x40
        journal_file(directory).write_bytes(bytes(damaged))
        with pytest.raises(JournalCorrupt):
            async with Journal.open(directory):
                pass
        # refused, not "repaired": the file is as it was
        assert journal_file(directory).read_bytes() == bytes(damaged), position
    # and the directory is not left locked by the refusal
    journal_file(directory).write_bytes(original)
    assert len(await records_of(directory)) == 2


async def test_a_damaged_last_frame_is_a_torn_tail(tmp_path):
    """A flipped byte in the last frame looks exactly like a torn append (that frame was
    the last write): it is cut, as docs/controller.md says. Documented, not hidden."""
    sizes, states = await _three_commits(tmp_path)
    damaged = bytearray(journal_file(tmp_path).read_bytes())
    damaged[sizes[2] + 20] ^= 0x01
    journal_file(tmp_path).write_bytes(bytes(damaged))
    assert await records_of(tmp_path) == states[2]


_HEADER = fmt.file_header()
_PUT = fmt.Entry("k", 1, b"v")
_GOOD = fmt.encode_frame(fmt.KIND_COMMIT, 1, [_PUT])


def test_replay_of_a_good_image():
    assert fmt.replay(_HEADER + _GOOD).records == {"k": Versioned(1, b"v")}


@pytest.mark.parametrize(
    ("image", "what"),
    [
        (b"X" * 16 + _GOOD, "magic"),
        (_HEADER[:10], "header"),
        (b"", "header"),
        (_HEADER + _GOOD + fmt.encode_frame(fmt.KIND_SNAPSHOT, 1, [_PUT]), "not the first"),
        (_HEADER + _GOOD + fmt.encode_frame(fmt.KIND_COMMIT, 1, [_PUT]), "not above"),
        (_HEADER + fmt.encode_frame(fmt.KIND_COMMIT, 1, [fmt.Entry("k", 2, b"v")]), "order"),
        (_HEADER + fmt.encode_frame(9, 1, [_PUT]), "unknown kind"),
    ],
    ids=["foreign", "short-header", "empty", "late-snapshot", "sequence-back",
         "version-past-frame", "unknown-kind"],
)
def test_replay_refuses_what_the_writer_never_writes(image, what):
    """CRC-valid frames the writer can never produce are a bug or a foreign file, never a
    torn append: refused."""
    with pytest.raises(JournalCorrupt, match=what):
        fmt.replay(image)


# ---- compaction -------------------------------------------------------------------------------


async def test_compaction_keeps_records_and_versions(tmp_path):
    expected: dict[str, Versioned] = {}
    async with Journal.open(tmp_path, compact_bytes=2048) as journal:
        for n in range(200):
            key = f"set{n % 7}"
            current = expected.get(key)
            if current is not None and n % 5 == 0:
                await journal.commit([Write(key, current.version, None)])
                del expected[key]
            else:
                value = f"value {n}".encode() * 3
                result = await journal.commit(
                    [Write(key, 0 if current is None else current.version, value)]
                )
                expected[key] = Versioned(result[key], value)
        # the highest version given out belongs to a deleted record: the counter must not
        # go back with it
        last = journal.statistics().sequence
        await journal.commit([Write("set0", expected["set0"].version, None)])
        del expected["set0"]
        await journal.compact()
        stats = journal.statistics()
        assert stats.compactions > 3
        assert stats.last_compaction is not None
        assert stats.last_compaction.sequence == last + 1
        assert stats.file_bytes == journal_file(tmp_path).stat().st_size < 2048
        assert await journal.load() == expected
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == expected
        assert journal.statistics().recovered_frames == 1  # the snapshot alone
        assert await journal.commit([Write("new", 0, b"n")]) == {"new": last + 2}


async def test_compaction_stopped_after_each_step(tmp_path):
    """A crash after each step of a compaction: after the snapshot's tmp file is written
    (and synced) the old journal is in charge; after the rename, the snapshot is. Both
    open to the same records; the tmp file never counts."""
    sizes, states = await _three_commits(tmp_path)
    final = states[3]
    sequence = 3

    # 1. stopped after writing the tmp file
    size = write_snapshot(str(tmp_path), final, sequence)
    assert (tmp_path / SNAPSHOT_TMP_NAME).stat().st_size == size
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == final
        assert journal.statistics().recovered_frames == 3  # the old journal, not the tmp
        assert not (tmp_path / SNAPSHOT_TMP_NAME).exists()

    # 1b. stopped while writing the tmp file (half of it, then garbage)
    snapshot = fmt.file_header() + fmt.encode_frame(
        fmt.KIND_SNAPSHOT, sequence, fmt.snapshot_entries(final)
    )
    (tmp_path / SNAPSHOT_TMP_NAME).write_bytes(snapshot[: len(snapshot) // 2] + b"\xff" * 9)
    assert await records_of(tmp_path) == final
    assert not (tmp_path / SNAPSHOT_TMP_NAME).exists()

    # 2. stopped after the rename (and its directory sync): the snapshot is the journal
    write_snapshot(str(tmp_path), final, sequence)
    install_snapshot(str(tmp_path))
    assert journal_file(tmp_path).stat().st_size == size < sizes[3]
    async with Journal.open(tmp_path) as journal:
        assert await journal.load() == final
        assert journal.statistics().recovered_frames == 1
        assert await journal.commit([Write("after", 0, b"x")]) == {"after": sequence + 1}
    assert (await records_of(tmp_path))["after"] == Versioned(sequence + 1, b"x")


async def test_a_failed_snapshot_leaves_the_journal_in_charge(tmp_path):
    """The snapshot cannot be written (here its tmp path is a directory: a real EISDIR, as a
    full disk would give ENOSPC): the old journal stays complete and in charge, commits go
    on, and compaction happens once the snapshot can be written again."""
    async with Journal.open(tmp_path, compact_bytes=1024) as journal:
        (tmp_path / SNAPSHOT_TMP_NAME).mkdir()
        expected: dict[str, Versioned] = {}
        for n in range(40):
            key = f"k{n % 4}"
            old = expected.get(key)
            value = f"value {n}".encode() * 4
            got = await journal.commit([Write(key, 0 if old is None else old.version, value)])
            expected[key] = Versioned(got[key], value)
        assert journal.statistics().compactions == 0
        assert journal.statistics().file_bytes > 1024
        with pytest.raises(CompactionFailed, match="snapshot failed"):
            await journal.compact()
        await journal.commit([Write("still", 0, b"taking commits")])
        expected["still"] = (await journal.load())["still"]
        (tmp_path / SNAPSHOT_TMP_NAME).rmdir()
        await journal.compact()
        assert journal.statistics().compactions == 1
        assert await journal.load() == expected
    assert await records_of(tmp_path) == expected


# ---- one journal per directory -----------------------------------------------------------------


async def test_two_opens_of_one_directory_are_refused(tmp_path):
    async with Journal.open(tmp_path) as journal:
        await journal.commit([Write("a", 0, b"1")])
        with pytest.raises(JournalLocked, match="in use"):
            async with Journal.open(tmp_path):
                pass
        # another process too
        probe = await trio.run_process(
            [sys.executable, "-c", (
                "import sys, trio\n"
                "from trio_ha.controller import Journal, JournalLocked\n"
                "async def main():\n"
                "    async with Journal.open(sys.argv[1]):\n"
                "        pass\n"
                "try:\n"
                "    trio.run(main)\n"
                "except JournalLocked:\n"
                "    sys.exit(3)\n"
            ), str(tmp_path)],
            capture_stdout=True, capture_stderr=True, check=False,
        )
        assert probe.returncode == 3, probe.stderr.decode()
        # the refused opens changed nothing
        assert await journal.commit([Write("a", 1, b"2")]) == {"a": 2}
    async with Journal.open(tmp_path) as journal:  # closed: free again
        assert await journal.load() == {"a": Versioned(2, b"2")}


# ---- many tasks at once ---------------------------------------------------------------------------


async def test_concurrent_commits_are_all_durable_and_versioned(tmp_path):
    tasks, rounds = 40, 15
    results: dict[int, list[tuple[str, int, bytes]]] = {t: [] for t in range(tasks)}
    increments = 0

    async with Journal.open(tmp_path) as journal:

        async def worker(task: int) -> None:
            nonlocal increments
            version = 0
            for n in range(rounds):
                value = f"{task}:{n}".encode()
                got = await journal.commit([Write(f"own{task}", version, value)])
                version = got[f"own{task}"]
                results[task].append((f"own{task}", version, value))
                # a counter every task increments: read, decide, commit, again on conflict
                for _attempt in range(tasks * rounds):
                    state = await journal.load()
                    counter = state.get("counter")
                    count = 0 if counter is None else int(counter.value)
                    try:
                        await journal.commit([Write(
                            "counter", 0 if counter is None else counter.version,
                            str(count + 1).encode(),
                        )])
                    except CommitConflict:
                        continue
                    increments += 1
                    break
                else:
                    pytest.fail("a counter increment never got through")

        async with trio.open_nursery() as nursery:
            for task in range(tasks):
                nursery.start_soon(worker, task)
        stats = journal.statistics()
        state = dict(await journal.load())

    assert increments == tasks * rounds
    assert state["counter"].value == str(tasks * rounds).encode()
    for task, written in results.items():
        versions = [version for _, version, _ in written]
        assert versions == sorted(set(versions)), f"task {task}: {versions}"
        assert state[f"own{task}"] == Versioned(written[-1][1], written[-1][2])
    every_version = [v for written in results.values() for _, v, _ in written]
    assert len(every_version) == len(set(every_version))  # one version per commit
    assert stats.commits == 2 * tasks * rounds
    assert stats.fsyncs >= stats.frames  # each frame its fsync
    assert await records_of(tmp_path) == state


async def test_a_group_is_one_frame_with_one_fsync(tmp_path):
    """Commits that queue while the journal is busy go out together: here the test holds the
    journal's lock (as a running fsync does) until every task has queued."""
    async with Journal.open(tmp_path) as journal:
        await journal.commit([Write("shared", 0, b"0")])
        before = journal.statistics()
        outcomes: dict[int, object] = {}

        async def one(task: int) -> None:
            try:
                outcomes[task] = await journal.commit(
                    [Write(f"k{task}", 0, b"v"), Write("shared", 1, f"{task}".encode())]
                    if task % 10 == 0 else [Write(f"k{task}", 0, b"v")]
                )
            except CommitConflict as exc:
                outcomes[task] = exc

        async with trio.open_nursery() as nursery:
            async with journal._lock:  # the test stands in for a long fsync
                for task in range(50):
                    nursery.start_soon(one, task)
                await trio.testing.wait_all_tasks_blocked()
        after = journal.statistics()
        state = dict(await journal.load())
    assert after.frames - before.frames == 1
    assert after.fsyncs - before.fsyncs == 1
    # Checked in queue order: the first of the five tasks that write "shared" at version 1
    # takes it, the other four conflict; every other commit gets a version of its own.
    sharers = [t for t in range(50) if t % 10 == 0]
    winners = [t for t in sharers if not isinstance(outcomes[t], CommitConflict)]
    assert len(winners) == 1, outcomes
    winner = winners[0]
    won = outcomes[winner]
    assert isinstance(won, dict) and won["shared"] == won[f"k{winner}"]
    versions = sorted(v for t in range(50) if t % 10 or t == winner
                      for v in set(outcomes[t].values()))  # type: ignore[union-attr]
    assert versions == list(range(2, 48))
    assert state["shared"] == Versioned(won["shared"], f"{winner}".encode())
    assert await records_of(tmp_path) == state


async def test_a_commit_cancelled_while_queued_is_never_written(tmp_path):
    async with Journal.open(tmp_path) as journal:
        async with trio.open_nursery() as nursery:
            async with journal._lock:
                cancel = trio.CancelScope()

                async def doomed() -> None:
                    with cancel:
                        await journal.commit([Write("doomed", 0, b"x")])

                nursery.start_soon(doomed)
                await trio.testing.wait_all_tasks_blocked()
                cancel.cancel()
                await trio.testing.wait_all_tasks_blocked()
        assert await journal.commit([Write("kept", 0, b"y")]) == {"kept": 1}
    assert await records_of(tmp_path) == {"kept": Versioned(1, b"y")}


# ---- real SIGKILLs -------------------------------------------------------------------------------


@attrs.define
class _Writer:
    """One child writer's records as the parent models them."""

    acked: dict[str, Versioned] = attrs.field(factory=dict)
    #: the last TRY not yet acknowledged: its tag and its writes (key, put?)
    trying: tuple[str, list[tuple[str, bool]]] | None = None


def _apply_lines(writers: dict[int, _Writer], lines: list[str]) -> int:
    acks = 0
    for line in lines:
        words = line.split(" ")
        if words[0] == "BUG":
            pytest.fail(f"child: {line}")
        if words[0] == "TRY":
            writer = writers.setdefault(int(words[1]), _Writer())
            writes = [(w.split("=")[0], w.split("=")[1] == "P") for w in words[3:]]
            writer.trying = (words[2], writes)
        elif words[0] == "ACK":
            writer = writers[int(words[1])]
            assert writer.trying is not None and writer.trying[0] == words[2], line
            for key, put in writer.trying[1]:
                if put:
                    writer.acked[key] = Versioned(int(words[3]), words[2].encode())
                else:
                    writer.acked.pop(key, None)
            writer.trying = None
            acks += 1
    return acks


def _check_recovered(writers: dict[int, _Writer], records: dict[str, Versioned], run: int):
    """Each writer's records are its acknowledged state, or that state with its one commit
    in flight applied whole; then the model is what was found."""
    for number, writer in writers.items():
        mine = {k: v for k, v in records.items() if k.startswith(f"w{number}k")}
        if mine == writer.acked:
            writer.trying = None
            continue
        assert writer.trying is not None, (run, number, mine, writer.acked)
        tag, writes = writer.trying
        expected = dict(writer.acked)
        for key, put in writes:
            if put:
                expected[key] = Versioned(mine[key].version if key in mine else -1, tag.encode())
            else:
                expected.pop(key, None)
        assert mine == expected, (run, number, mine, expected)
        assert len({mine[key].version for key, put in writes if put}) <= 1  # one commit
        writer.acked = mine
        writer.trying = None


async def _run_and_kill(directory: Path, run: int, rng: random.Random, logs: Path) -> list[str]:
    """Start the child, SIGKILL it at a random moment, return the whole lines it wrote."""
    lines: list[str] = []
    buffer = bytearray()
    changed = trio.Event()

    async def pump(stream) -> None:
        nonlocal changed
        while data := await stream.receive_some(65536):  # ends at EOF (the child is dead)
            buffer.extend(data)
            *complete, rest = buffer.split(b"\n")
            lines.extend(line.decode() for line in complete)
            buffer[:] = rest  # a line cut by the kill is dropped (its commit is in flight)
            changed.set()
            changed = trio.Event()

    wait_for = rng.choice(["START", "OPENED ", "OPENED ", "OPENED "])
    delay = rng.uniform(0.0, 0.05) if wait_for == "START" else rng.uniform(0.0, 0.4)
    with (logs / f"child-{run}.stderr").open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(_WRITER), str(directory), str(run)],
            stdout=subprocess.PIPE, stderr=stderr,
        )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, process.stdout)
            with trio.fail_after(CHILD_EVENT_TIMEOUT):
                while process.poll() is None and not any(
                    line.startswith(wait_for) for line in lines
                ):
                    await changed.wait()
            await trio.sleep(delay)
            process.send_signal(signal.SIGKILL)
            await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()
            assert process.stdout is not None
            await process.stdout.aclose()
    assert process.returncode == -signal.SIGKILL, (
        run, process.returncode, (logs / f"child-{run}.stderr").read_text()[-2000:]
    )
    return lines


async def test_sigkill_while_committing_and_compacting(tmp_path):
    rng = random.Random(SEED)
    directory = tmp_path / "ctl"
    writers: dict[int, _Writer] = {}
    total_acks = 0
    for run in range(8):
        lines = await _run_and_kill(directory, run, rng, tmp_path)
        total_acks += _apply_lines(writers, lines)
        async with Journal.open(directory) as journal:
            records = dict(await journal.load())
            stats = journal.statistics()
        _check_recovered(writers, records, run)
        # every version acknowledged is at or below the journal's counter
        assert all(v.version <= stats.sequence for v in records.values())
    assert total_acks > 100, f"only {total_acks} acknowledged commits in 8 runs (seed {SEED})"
    # the child compacted (the file starts with a snapshot) and compaction bounds the file
    data = journal_file(directory).read_bytes()
    assert data[fmt.FILE_HEADER_SIZE + fmt.FRAME_HEADER_SIZE] == fmt.KIND_SNAPSHOT
    assert len(data) < 4 * 4096


# ---- a full disk -------------------------------------------------------------------------------


async def test_full_disk_fails_the_commit_and_a_restart_recovers(tmp_path):
    reason = disk.unavailable()
    if reason is not None:
        if os.environ.get("TRIO_HA_REQUIRE_CHAOS") == "1":
            pytest.fail(f"TRIO_HA_REQUIRE_CHAOS=1 but a small disk cannot be mounted: {reason}")
        pytest.skip(f"a small disk cannot be mounted here: {reason}")
    small = disk.SmallDisk.mount(tmp_path / "fs", 1 << 20)
    try:
        directory = small.path / "ctl"
        async with Journal.open(directory) as journal:
            await journal.commit([Write("kept", 0, b"k" * 100)])
            small.fill()
            acknowledged = 0
            failure: JournalFailed | None = None
            for n in range(64):  # bounded: the disk is full long before
                try:
                    await journal.commit([Write(f"big{n}", 0, b"b" * 16384)])
                except JournalFailed as exc:
                    failure = exc
                    break
                acknowledged += 1
            assert failure is not None and "may or may not" in str(failure)
            # failed once, it takes nothing more, even a small commit that would fit
            with pytest.raises(JournalFailed, match="restart"):
                await journal.commit([Write("small", 0, b"s")])
        small.release()
        async with Journal.open(directory) as journal:
            records = await journal.load()
            assert records["kept"] == Versioned(1, b"k" * 100)
            assert {f"big{i}" for i in range(acknowledged)} <= set(records)
            await journal.commit([Write("after", 0, b"a")])
    finally:
        small.unmount()
