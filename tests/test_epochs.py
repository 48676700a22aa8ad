"""The epoch history of controller mode (trio_ha.store.ha.epochs): the pure cache against
references written from RocketMQ 5.3.3's rules as the spec sheet words them
(../shared/spec/controller-mode.md §3.2-3.4), the file byte for byte, its .bak fall-back,
and its crash-safe write under SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_ha import StoreConfig
from trio_ha.store.ha.epochs import (
    HANDSHAKE_MAX_ENTRIES,
    EpochCache,
    EpochEntry,
    EpochFile,
    EpochFileError,
    decode_epoch_file,
    encode_epoch_file,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- strategies ---------------------------------------------------------------------------


@st.composite
def histories(draw, max_size: int = 8) -> list[EpochEntry]:
    """A valid history: epochs strictly rising, starts never falling (an epoch that wrote
    nothing starts where the next one does)."""
    count = draw(st.integers(0, max_size))
    epoch, start = draw(st.integers(0, 3)), draw(st.integers(0, 1000))
    entries = []
    for _ in range(count):
        entries.append(EpochEntry(epoch, start))
        epoch += draw(st.integers(1, 3))
        start += draw(st.sampled_from([0, 0, 1, 50, 100, 1000]))
    return entries


@st.composite
def diverged(draw) -> tuple[list[EpochEntry], int, list[EpochEntry], int]:
    """Two histories that share a prefix and then go their own ways (a master's and a
    slave's), each with a max offset at or past its last start."""
    common = draw(histories(max_size=5))
    epoch = common[-1].epoch + 1 if common else 0
    start = common[-1].start_offset if common else 0

    def tail() -> list[EpochEntry]:
        own, e, s = [], epoch, start
        for _ in range(draw(st.integers(0, 3))):
            e += draw(st.integers(0, 2))
            s += draw(st.sampled_from([0, 10, 100]))
            if own and (e <= own[-1].epoch):
                e = own[-1].epoch + 1
            own.append(EpochEntry(e, s))
            e += 1
        return own

    master = common[:draw(st.integers(0, len(common)))] if draw(st.booleans()) else list(common)
    master = master + tail()
    slave = common[:draw(st.integers(0, len(common)))] + tail()

    def max_of(entries: list[EpochEntry]) -> int:
        last = entries[-1].start_offset if entries else 0
        return last + draw(st.sampled_from([0, 1, 10, 100, 5000]))

    return master, max_of(master), slave, max_of(slave)


# ---- references, from the spec sheet's words ------------------------------------------------


def reference_append(entries: list[EpochEntry], epoch: int, start: int) -> bool:
    """§3.2 step 5: "The append needs a strictly larger epoch and start; otherwise it is
    only logged"."""
    if entries and not (epoch > entries[-1].epoch and start > entries[-1].start_offset):
        return False
    entries.append(EpochEntry(epoch, start))
    return True


def reference_point(local: list[EpochEntry], local_max: int, master: list[EpochEntry],
                    master_max: int) -> int:
    """§3.2 step 3: "the last epoch ends at the master's maxPhyOffset on the master side, and
    at the local max on the local side. Walk local epochs newest first. At the first epoch
    the master also has with the same startOffset, the truncation point is
    min(localEnd, masterEnd)"; no match is -1."""

    def ends(entries: list[EpochEntry], last_end: int) -> dict[int, tuple[int, int]]:
        out = {}
        for i, entry in enumerate(entries):
            end = entries[i + 1].start_offset if i + 1 < len(entries) else last_end
            out[entry.epoch] = (entry.start_offset, end)
        return out

    mine, theirs = ends(local, local_max), ends(master, master_max)
    for entry in reversed(local):
        if entry.epoch in theirs and theirs[entry.epoch][0] == entry.start_offset:
            return min(mine[entry.epoch][1], theirs[entry.epoch][1])
    return -1


# ---- the pure cache ---------------------------------------------------------------------------


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 3000)), max_size=30))
def test_append_follows_the_rules(operations):
    cache, model = EpochCache(), []
    for epoch, start in operations:
        assert cache.append(epoch, start) == reference_append(model, epoch, start)
        assert list(cache.entries) == model
        assert cache.last_epoch == (model[-1].epoch if model else -1)
        assert cache.last_entry == (model[-1] if model else None)


def test_append_refuses_what_rocketmq_refuses():
    cache = EpochCache()
    assert cache.append(1, 0)
    assert not cache.append(1, 100)  # not a larger epoch
    assert cache.append(2, 100)
    assert not cache.append(3, 99)  # starts before the last epoch
    # Epoch 2 wrote nothing: RocketMQ refuses 3@100 (its file lags the controller's epoch
    # until the master writes), and so do we (docs/differences.md).
    assert not cache.append(3, 100)
    assert cache.append(4, 101)
    assert cache.entries == (EpochEntry(1, 0), EpochEntry(2, 100), EpochEntry(4, 101))
    assert cache.end_of(1, 500) == 101 and cache.end_of(2, 500) == 500
    with pytest.raises(ValueError, match="range"):
        cache.append(2**31, 200)


@given(histories(), st.integers(0, 10_000))
def test_truncate_from_drops_entries_starting_at_or_after(entries, offset):
    cache = EpochCache(list(entries))
    changed = cache.truncate_from(offset)
    assert list(cache.entries) == [e for e in entries if e.start_offset < offset]
    assert changed == (len(cache) != len(entries))


@given(histories(), st.integers(0, 30))
def test_truncate_from_epoch_drops_that_epoch_and_later(entries, epoch):
    cache = EpochCache(list(entries))
    cache.truncate_from_epoch(epoch)
    assert list(cache.entries) == [e for e in entries if e.epoch < epoch]


@given(histories(), st.integers(0, 10_000))
def test_expire_before_drops_entries_that_end_before_the_new_min(entries, min_offset):
    """RocketMQ: truncatePrefixByOffset(minPhyOffset - 1) removes the entries whose end is
    <= minPhyOffset - 1; the last entry's end is Long.MAX_VALUE in its cache."""
    cache = EpochCache(list(entries))
    cache.expire_before(min_offset)
    expected = [e for i, e in enumerate(entries)
                if i == len(entries) - 1 or not entries[i + 1].start_offset <= min_offset - 1]
    assert list(cache.entries) == expected


@settings(max_examples=400)
@given(diverged())
def test_find_consistent_point_matches_the_spec(case):
    master, master_max, slave, slave_max = case
    cache = EpochCache(list(slave))
    assert cache.find_consistent_point(master, master_max, slave_max) == \
        reference_point(slave, slave_max, master, master_max)


def test_consistent_point_examples_from_the_spec():
    # §3.4: old master A has {1@0} and max X; B was elected at epoch 2 with max Y < X.
    a = EpochCache([EpochEntry(1, 0)])
    assert a.find_consistent_point([EpochEntry(1, 0), EpochEntry(2, 700)], 900, 1000) == 700
    # Nothing in common: the handshake fails.
    assert EpochCache([EpochEntry(3, 50)]).find_consistent_point([EpochEntry(4, 50)], 90, 60) \
        == -1


def test_refusing_an_empty_epoch_keeps_the_consistent_point():
    """The decision in docs/differences.md, against RocketMQ's findConsistentPoint (the same
    rules as ours, checked above). A master re-elected (epoch 2) before it wrote anything
    past 0; a slave that saw epoch 1 from its heartbeat frames holds {1@0}."""
    slave = EpochCache([EpochEntry(1, 0)])
    master = EpochCache([EpochEntry(1, 0)])
    assert not master.append(2, 0)  # refused: the master's frames keep saying epoch 1
    assert slave.find_consistent_point(master.entries, 500, 300) == 300
    # The rejected alternative, replacing 1@0 by 2@0: nothing in common, for ever.
    assert slave.find_consistent_point([EpochEntry(2, 0)], 500, 300) == -1
    # The other one, recording 2@0 as well: a RocketMQ slave refuses 2@0 from the frames,
    # keeps the new epoch's bytes under epoch 1, and the next handshake cuts them all.
    recorded = [EpochEntry(1, 0), EpochEntry(2, 0), EpochEntry(3, 300)]
    assert slave.find_consistent_point(recorded, 500, 300) == 0


def test_newest_is_what_a_handshake_reply_carries():
    cache = EpochCache([EpochEntry(e, e * 10) for e in range(1500)])
    carried = cache.newest()
    assert len(carried) == HANDSHAKE_MAX_ENTRIES
    assert carried[0] == EpochEntry(500, 5000) and carried[-1] == EpochEntry(1499, 14990)
    assert EpochCache([EpochEntry(1, 0)]).newest() == (EpochEntry(1, 0),)
    assert cache.newest(0) == ()


# ---- the format ---------------------------------------------------------------------------


def test_the_spec_example_byte_for_byte():
    entries = [EpochEntry(7, 7000), EpochEntry(8, 8000)]
    data = encode_epoch_file(entries)
    assert data == b"2\n773307083\n7-7000\n8-8000\n"
    # The CRC is RocketMQ's UtilAll.crc32 (the sign bit cleared) of the entry lines.
    assert zlib.crc32(b"7-7000\n8-8000\n") & 0x7FFFFFFF == 773307083
    assert decode_epoch_file(data) == entries


def test_zero_entries_and_an_unchecked_crc():
    assert encode_epoch_file([]) == b"0\n0\n"
    assert decode_epoch_file(b"0\n0\n") == []
    # A CRC of 0 means "do not check" (CheckpointFile.NOT_CHECK_CRC_MAGIC_CODE).
    assert decode_epoch_file(b"1\n0\n5-100\n") == [EpochEntry(5, 100)]
    # The last line may lack its newline (Java's readLine reads it).
    assert decode_epoch_file(b"1\n0\n5-100") == [EpochEntry(5, 100)]


@pytest.mark.parametrize("data, why", [
    (b"", "empty"),
    (b"2\n", "missing"),
    (b"x\n0\n", "not numbers"),
    (b"2\n0\n7-7000\n", "says 2 entries"),
    (b"2\n1\n7-7000\n8-8000\n", "CRC"),
    (b"1\n0\n7:7000\n", "not <epoch>-<startOffset>"),
    (b"1\n0\n-7-7000\n", "not <epoch>-<startOffset>"),
    (b"2\n0\n8-8000\n7-7000\n", "out of order"),
    (b"1\n0\n2147483648-0\n", "out of range"),
])
def test_broken_files_say_why(data, why):
    with pytest.raises(ValueError, match=why):
        decode_epoch_file(data)


@given(histories(max_size=20))
def test_encode_decode_round_trip(entries):
    assert decode_epoch_file(encode_epoch_file(entries)) == entries


# ---- the file -----------------------------------------------------------------------------


def test_path_follows_store_path_epoch_file(tmp_path):
    assert StoreConfig(store_path_root_dir=str(tmp_path)).epoch_file_path == \
        str(tmp_path / "epochFileCheckpoint")
    explicit = StoreConfig.from_properties(
        f"storePathRootDir={tmp_path}\nstorePathEpochFile={tmp_path}/e/epochs\n")
    assert explicit.store_path_epoch_file == f"{tmp_path}/e/epochs"
    assert explicit.epoch_file_path == f"{tmp_path}/e/epochs"


def test_save_writes_rocketmq_bytes_and_keeps_the_previous_in_bak(tmp_path):
    path = str(tmp_path / "epochFileCheckpoint")
    epochs = EpochFile.load(path)
    assert epochs.cache.entries == ()
    assert epochs.append(7, 7000)
    assert not os.path.exists(path + ".bak")  # nothing before it
    assert epochs.append(8, 8000)
    with open(path, "rb") as f:
        assert f.read() == b"2\n773307083\n7-7000\n8-8000\n"
    with open(path + ".bak", "rb") as f:
        assert f.read() == encode_epoch_file([EpochEntry(7, 7000)])
    assert not epochs.append(8, 9000)  # refused: nothing written
    assert EpochFile.load(path).cache.entries == (EpochEntry(7, 7000), EpochEntry(8, 8000))
    assert not os.path.exists(path + ".tmp")


def test_truncating_to_nothing_records_nothing(tmp_path):
    """RocketMQ's write([]) is a no-op: the old entries stay on disk. And RocketMQ reads a
    file of 0 entries as "look in .bak": so the .bak goes too."""
    path = str(tmp_path / "epochFileCheckpoint")
    epochs = EpochFile.load(path)
    epochs.append(1, 0)
    epochs.append(2, 100)
    assert epochs.truncate_from(0)
    with open(path, "rb") as f:
        assert f.read() == b"0\n0\n"
    assert not os.path.exists(path + ".bak")
    assert EpochFile.load(path).cache.entries == ()


@pytest.mark.parametrize("broken", [b"", b"garbage", b"2\n5\n1-0\n2-10\n", b"3\n0\n1-0\n"])
def test_load_falls_back_to_bak(tmp_path, broken):
    path = str(tmp_path / "epochFileCheckpoint")
    good = [EpochEntry(1, 0), EpochEntry(2, 10)]
    with open(path + ".bak", "wb") as f:
        f.write(encode_epoch_file(good))
    with open(path, "wb") as f:
        f.write(broken)
    assert list(EpochFile.load(path).cache.entries) == good
    os.unlink(path)  # missing: the .bak too (as RocketMQ reads it)
    assert list(EpochFile.load(path).cache.entries) == good


def test_load_refuses_when_both_are_broken(tmp_path):
    path = str(tmp_path / "epochFileCheckpoint")
    with open(path, "wb") as f:
        f.write(b"2\n0\n1-0\n")
    with open(path + ".bak", "wb") as f:
        f.write(b"1\n1\n1-0\n")
    with pytest.raises(EpochFileError) as info:
        EpochFile.load(path)
    assert path in str(info.value) and path + ".bak" in str(info.value)
    os.unlink(path + ".bak")
    # Broken with no .bak: refused too (RocketMQ reads it as no epochs, and then skips
    # the truncation a diverged slave needs).
    with pytest.raises(EpochFileError, match="missing"):
        EpochFile.load(path)


_SAVER = """
import sys
sys.path.insert(0, {repo!r})
from trio_ha.store.ha.epochs import EpochCache, EpochEntry, EpochFile
a = [EpochEntry(e, e * 1000) for e in range(1, 40)]
b = a + [EpochEntry(e, e * 1000) for e in range(40, 400)]
epochs = EpochFile({path!r}, EpochCache(list(a)))
epochs.save()
print("ready", flush=True)
while True:
    for history in (b, a):
        epochs.cache = EpochCache(list(history))
        epochs.save()
"""


def test_a_kill_at_any_moment_of_a_save_leaves_a_whole_history(tmp_path):
    """Saves of two histories, one after the other, SIGKILLed at random moments: the file
    and its .bak each load, whole, as one of the two."""
    path = str(tmp_path / "epochFileCheckpoint")
    a = [EpochEntry(e, e * 1000) for e in range(1, 40)]
    b = a + [EpochEntry(e, e * 1000) for e in range(40, 400)]
    rng = random.Random(38)
    for _ in range(12):
        child = subprocess.Popen([sys.executable, "-c", _SAVER.format(repo=REPO, path=path)],
                                 stdout=subprocess.PIPE)
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == b"ready\n"
            time.sleep(rng.uniform(0, 0.05))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert list(EpochFile.load(path).cache.entries) in (a, b)
        with open(path, "rb") as f:
            assert decode_epoch_file(f.read()) in (a, b)
        if os.path.exists(path + ".bak"):
            with open(path + ".bak", "rb") as f:
                assert decode_epoch_file(f.read()) in (a, b)
