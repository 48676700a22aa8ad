"""Crash durability: real SIGKILLs of a writing process, and hand-made torn tails.

``test_sigkill_*``: a child process (tests/crash_writer.py) puts with SYNC_FLUSH and prints
every acknowledged record the moment its put returns; the parent SIGKILLs it at random moments
(while the interpreter starts, while the store opens and recovers, while puts are in flight),
restarts it on the recovered store again and again (crash recovery on top of crash recovery),
and every few kills opens the store itself and checks that

* every acknowledged record is there, at its commitlog offset, with its key, topic, queue,
  queue offset and body (body CRC included), and is served by its consume queue;
* the commitlog is a chain of valid records (and end-of-segment blanks) from its first byte to
  exactly ``max_commitlog_offset``; every record in it, acknowledged or not, is intact;
* the consume queues agree with the commitlog: each queue's entries 0..max-1 are exactly the
  records of that queue in commitlog order, queue offsets dense, none repeated or skipped;
* nothing past the end is served, and the bytes past the end on disk are zero.

``test_torn_tail_*``: a store is written and closed, its last record damaged on disk (cut
short, zeroed, CRC flipped, TOTALSIZE torn), and it must recover — with and without the
``abort`` file — to exactly the record before the damage, and keep working.

A SIGKILL leaves the kernel's page cache intact, so the kill tests check what a process
crash can do (torn appends, half-done recovery, consume queues behind the log, a spare segment
left over) — not a lost fsync; the torn-tail tests model what a lost disk write leaves.

Kill timing is random, from a seeded generator (``CRASH_SEED`` overrides the seed; it is
printed with every failure). No test asserts a duration; every loop is bounded in count, and
every wait for the child in time.
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
import trio

from trio_ha import Message, PutMessageStatus, StoreConfig, open_store
from trio_ha.store import MessageStore
from trio_ha.store.recovery import RecoveryReport
from trio_ha.store.segment import SegmentError
from trio_ha.wire import record as rec

_WRITER_PATH = Path(__file__).with_name("crash_writer.py")
_spec = importlib.util.spec_from_file_location("_crash_writer", _WRITER_PATH)
assert _spec is not None and _spec.loader is not None
cw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cw)

SEED = int(os.environ.get("CRASH_SEED", "20240611"))
#: how long the parent waits for one child to reach the point it wants to kill it at
CHILD_EVENT_TIMEOUT = 60.0


# ---- what was acknowledged --------------------------------------------------------------------


@attrs.frozen
class Ack:
    offset: int
    key: str
    topic: str
    queue_id: int
    queue_offset: int


def parse_ack(line: str) -> Ack:
    _, offset, key, topic, queue_id, queue_offset = line.split(" ")
    return Ack(int(offset), key, topic, int(queue_id), int(queue_offset))


# ---- the store check -----------------------------------------------------------------------------


@attrs.frozen
class StoreCheck:
    end: int
    records: int
    blanks: int
    queues: int
    acked: int


def recovery_of(store: MessageStore) -> RecoveryReport:
    assert store.recovery is not None  # an open store has recovered
    return store.recovery


def _only_key(message: rec.StoredMessage) -> str:
    keys = message.keys
    assert len(keys) == 1, f"record at {message.commitlog_offset} has keys {keys!r}"
    return keys[0]


async def verify_store(store, acked: Mapping[str, Ack], *, context: str = "") -> StoreCheck:
    """Everything the crash tests promise about a recovered store (see the module doc)."""
    where = f" [{context}]" if context else ""
    segment_size = store.config.mapped_file_size_commit_log
    start, end = store.min_commitlog_offset, store.max_commitlog_offset

    # 1. The commitlog, record by record, from its first byte to exactly its end.
    by_queue: dict[tuple[str, int], list[rec.StoredMessage]] = defaultdict(list)
    found: dict[str, rec.StoredMessage] = {}
    offset, blanks = start, 0
    while offset < end:
        head = store.commitlog.read_available(offset, 8)
        assert len(head) == 8, f"commitlog unreadable at {offset} (end {end}){where}"
        size, magic = struct.unpack(">iI", head)
        if magic == rec.BLANK_MAGIC:
            segment_end = offset - offset % segment_size + segment_size
            assert offset + size == segment_end, (
                f"blank record at {offset} declares {size} bytes, segment ends at "
                f"{segment_end}{where}"
            )
            offset, blanks = segment_end, blanks + 1
            continue
        message = await store.look_message_by_offset(offset)
        assert message is not None, (
            f"no valid record at commitlog offset {offset} (TOTALSIZE {size}, magic "
            f"{magic:#x}), though the log claims to end at {end}{where}"
        )
        assert message.commitlog_offset == offset, (
            f"record at {offset} says PHYSICALOFFSET {message.commitlog_offset}{where}"
        )
        assert message.crc_ok, f"record at {offset} fails its body CRC{where}"
        key = _only_key(message)
        assert message.body == cw.expected_body(key), f"record {key} at {offset}: wrong body{where}"
        assert message.tags == cw.expected_tags(key), f"record {key} at {offset}: wrong tags{where}"
        assert key not in found, (
            f"key {key} stored twice: at {found[key].commitlog_offset} and {offset}{where}"
        )
        found[key] = message
        queue = by_queue[(message.topic, message.queue_id)]
        assert message.queue_offset == len(queue), (
            f"record {key} at {offset} has queue offset {message.queue_offset} in "
            f"{message.topic}/{message.queue_id}, expected {len(queue)} (queue offsets must "
            f"be dense and unique in commitlog order){where}"
        )
        queue.append(message)
        offset += message.size
    assert offset == end, f"the last record runs past the end: {offset} > {end}{where}"

    # 2. Every acknowledged record, where its put said it is.
    for key, ack in acked.items():
        message = found.get(key)
        assert message is not None, (
            f"acknowledged record {key} at commitlog offset {ack.offset} "
            f"({ack.topic}/{ack.queue_id} queue offset {ack.queue_offset}) is lost; the "
            f"store ends at {end}{where}"
        )
        assert (message.commitlog_offset, message.topic, message.queue_id, message.queue_offset) == (
            ack.offset, ack.topic, ack.queue_id, ack.queue_offset
        ), f"acknowledged record {key} moved: {ack} vs {message}{where}"

    # 3. The consume queues against the commitlog, through the public read and on disk.
    queue_keys = {(queue.topic, queue.queue_id) for queue in store.queues}
    assert set(by_queue) <= queue_keys, (
        f"records of {set(by_queue) - queue_keys} have no consume queue{where}"
    )
    for topic, queue_id in sorted(queue_keys):
        messages = by_queue.get((topic, queue_id), [])
        assert store.max_queue_offset(topic, queue_id) == len(messages), (
            f"{topic}/{queue_id}: consume queue max offset "
            f"{store.max_queue_offset(topic, queue_id)}, commitlog holds {len(messages)} "
            f"records of it{where}"
        )
        assert store.min_queue_offset(topic, queue_id) == 0
        cq = store.queues.get(topic, queue_id)
        entries = []
        while len(entries) < len(messages):
            more = cq.entries(len(entries), 256)
            assert more, f"{topic}/{queue_id}: no entry at queue offset {len(entries)}{where}"
            entries.extend(more)
        for message, entry in zip(messages, entries, strict=True):
            assert (entry.commitlog_offset, entry.size, entry.tags_code) == (
                message.commitlog_offset, message.size, rec.tags_code(message.tags)
            ), f"{topic}/{queue_id} entry {message.queue_offset}: {entry} vs {message}{where}"
        served: list[rec.StoredMessage] = []
        while len(served) < len(messages):
            batch = await store.get_messages(topic, queue_id, len(served), 32)
            assert batch, f"{topic}/{queue_id}: nothing served at {len(served)}{where}"
            served.extend(batch)
        assert [(m.queue_offset, m.commitlog_offset) for m in served] == [
            (m.queue_offset, m.commitlog_offset) for m in messages
        ], f"{topic}/{queue_id}: get_messages disagrees with the commitlog{where}"
        # Nothing past the end of the queue.
        assert await store.get_messages(topic, queue_id, len(messages), 32) == []
        assert cq.entry(len(messages)) is None

    # 4. Nothing past the end of the log, neither served nor left on disk to come back.
    assert await store.look_message_by_offset(end) is None
    assert store.commitlog.read_available(end, 4096) == b""
    assert_zero_after(store.config, end, where)
    return StoreCheck(end, len(found), blanks, len(queue_keys), len(acked))


def assert_zero_after(config: StoreConfig, end: int, where: str = "") -> None:
    """Every commitlog byte on disk at or past ``end`` is zero (the segment holding ``end``
    from there on, later segments — a pre-allocated spare — entirely)."""
    size = config.mapped_file_size_commit_log
    directory = config.commitlog_dir
    for name in sorted(os.listdir(directory)):
        if not (len(name) == 20 and name.isdigit()):
            continue
        base = int(name)
        if base + size <= end:
            continue
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        tail = data[max(0, end - base):]
        if tail.count(0) != len(tail):
            first = next(i for i, b in enumerate(tail) if b) + max(0, end - base)
            pytest.fail(
                f"segment {name}: non-zero byte at position {first} (log offset "
                f"{base + first}) past the end of the log {end}{where}"
            )


# ---- the child ---------------------------------------------------------------------------------


@attrs.define
class ChildRun:
    run: int
    mode: str
    delay: float
    returncode: int | None = None
    lines: list[str] = attrs.field(factory=list)
    stderr: str = ""

    @property
    def acks(self) -> list[Ack]:
        return [parse_ack(line) for line in self.lines if line.startswith("ACK ")]

    @property
    def opened(self) -> list[str] | None:
        for line in self.lines:
            if line.startswith("OPENED "):
                return line.split(" ", 4)[1:]
        return None

    @property
    def nacks(self) -> list[str]:
        return [line for line in self.lines if line.startswith("NACK ")]

    def describe(self) -> str:
        return (
            f"child run {self.run} (kill mode {self.mode}, delay {self.delay:.3f} s, "
            f"exit {self.returncode}, {len(self.acks)} acks, opened {self.opened}); "
            f"stderr: {self.stderr[-2000:]!r}"
        )


async def run_and_kill_child(store_dir: Path, log_dir: Path, seed: int, run: int,
                             rng: random.Random) -> ChildRun:
    """Start the writer, SIGKILL it at a random moment, collect what it acknowledged."""
    mode = rng.choices(["spawn", "open", "recovery", "write", "long"], weights=[2, 2, 3, 12, 1])[0]
    delay = {
        "spawn": rng.uniform(0.0, 0.45),  # interpreter start-up or store open
        "open": rng.uniform(0.0, 0.03),  # store open: locking, loading, recovery
        "recovery": rng.uniform(0.0, 0.015),  # recovery scans, truncates, re-dispatches
        "write": rng.uniform(0.0, 0.35),  # puts in flight
        "long": rng.uniform(1.0, 1.6),  # past the first consume-queue flush and checkpoint
    }[mode]
    # What to wait for first (RECOVERING falls back to OPENED if the store never says it).
    wanted = {
        "spawn": (), "open": ("START",), "recovery": ("RECOVERING", "OPENED "),
        "write": ("OPENED ",), "long": ("OPENED ",),
    }[mode]
    child = ChildRun(run, mode, delay)
    pending = bytearray()
    eof = False
    changed = trio.Event()

    async def pump(stream) -> None:
        nonlocal changed, eof
        while True:
            data = await stream.receive_some(65536)
            if not data:
                break
            pending.extend(data)
            *complete, rest = pending.split(b"\n")
            child.lines.extend(line.decode() for line in complete)
            pending[:] = rest  # a torn last line (killed mid-write) is dropped
            changed.set()
            changed = trio.Event()
        eof = True
        changed.set()

    stderr_path = log_dir / f"child-{run}.stderr"
    with await trio.to_thread.run_sync(open, stderr_path, "wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(_WRITER_PATH), str(store_dir), str(seed), str(run)],
            stdout=subprocess.PIPE, stderr=stderr,
        )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, process.stdout)
            if wanted:
                with trio.fail_after(CHILD_EVENT_TIMEOUT):
                    while not eof and not any(line.startswith(wanted) for line in child.lines):
                        await changed.wait()
            await trio.sleep(delay)
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
            await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()
    child.returncode = process.returncode
    child.stderr = stderr_path.read_text(errors="replace")
    return child


# ---- the kill loop ---------------------------------------------------------------------------------


@attrs.define
class CrashStats:
    kills: int = 0
    kills_before_open: int = 0
    #: killed after START, before OPENED: inside open_store (lock, load, recovery)
    kills_during_open: int = 0
    #: of those, killed after recovery had begun
    kills_during_recovery: int = 0
    kills_while_writing: int = 0
    acked: int = 0
    verifications: int = 0
    abnormal_recoveries_seen: int = 0
    records: int = 0
    segments: int = 0
    end: int = 0
    modes: dict[str, int] = attrs.field(factory=dict)


async def crash_chain(root: Path, seed: int, kills: int, verify_every: int,
                      stats: CrashStats) -> None:
    """``kills`` child runs on one store, each killed; the parent verifies the store every
    ``verify_every`` kills and after the last one."""
    rng = random.Random(seed)
    store_dir = root / "store"
    log_dir = root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    config = cw.store_config(store_dir)
    abort_path = store_dir / "abort"
    acked: dict[str, Ack] = {}
    acked_offsets: dict[int, str] = {}
    # Did a child since the parent's last clean close get its store open (abort file made)?
    opened_since_close = False
    history: list[str] = []
    for run in range(kills):
        child = await run_and_kill_child(store_dir, log_dir, seed, run, rng)
        history.append(child.describe())
        context = f"seed {seed}, " + child.describe()
        assert child.returncode == -signal.SIGKILL, f"child did not die by our SIGKILL: {context}"
        stats.kills += 1
        stats.modes[child.mode] = stats.modes.get(child.mode, 0) + 1
        opened = child.opened
        if opened is None:
            stats.kills_before_open += 1
            stats.kills_during_open += "START" in child.lines
            stats.kills_during_recovery += "RECOVERING" in child.lines
        else:
            abnormal = opened[0] == "True"
            if opened_since_close:
                assert abnormal, (
                    f"a previous child was killed with the store open, yet this one "
                    f"recovered normally: {context}"
                )
            stats.abnormal_recoveries_seen += abnormal
            opened_since_close = True
        bad = [n for n in child.nacks if n.split(" ")[1] not in (
            "FLUSH_DISK_TIMEOUT", "CREATE_MAPEDFILE_FAILED")]
        assert not bad, f"puts failed: {bad[:5]}; {context}"
        acks = child.acks
        if acks:
            stats.kills_while_writing += 1
        for ack in acks:
            assert ack.key not in acked, f"key {ack.key} acknowledged twice: {context}"
            assert ack.offset not in acked_offsets, (
                f"commitlog offset {ack.offset} acknowledged for {acked_offsets[ack.offset]} "
                f"and again for {ack.key}: {context}"
            )
            acked[ack.key] = ack
            acked_offsets[ack.offset] = ack.key
        stats.acked = len(acked)

        if (run + 1) % verify_every == 0 or run == kills - 1:
            expect_abnormal = abort_path.exists()
            if opened_since_close:
                assert expect_abnormal, f"abort file missing after a kill: {context}"
            async with open_store(config) as store:
                report = recovery_of(store)
                assert report.abnormal is expect_abnormal, f"{report}; {context}"
                assert report.end_offset == store.max_commitlog_offset, f"{report}; {context}"
                check = await verify_store(
                    store, acked, context=f"seed {seed}, after run {run}: {report}; "
                    f"last children: {history[-verify_every:]}",
                )
                stats.segments = store.statistics().segments
            assert not abort_path.exists(), "a clean close must remove the abort file"
            opened_since_close = False
            stats.verifications += 1
            stats.records, stats.end = check.records, check.end


async def test_sigkill_during_sync_flush_puts_loses_no_acknowledged_message(tmp_path):
    """The issue's crash test: 24 kills of a SYNC_FLUSH writer at random moments."""
    stats = CrashStats()
    await crash_chain(tmp_path, SEED, kills=24, verify_every=4, stats=stats)
    print(f"crash test (seed {SEED}): {stats}")
    assert stats.kills >= 20
    assert stats.verifications >= 6
    # The schedule is random; with 24 kills most land while puts are in flight.
    assert stats.kills_while_writing >= 5, stats
    assert stats.acked > 0 and stats.records >= stats.acked


@pytest.mark.soak
async def test_sigkill_soak_200_kills(tmp_path):
    """Opt-in (-m soak): 200 kills in 4 chains of 50, the store verified every 5 kills."""
    total = CrashStats()
    for chain in range(4):
        stats = CrashStats()
        root = tmp_path / f"chain{chain}"
        await crash_chain(root, SEED + chain, kills=50, verify_every=5, stats=stats)
        print(f"soak chain {chain} (seed {SEED + chain}): {stats}")
        for field in ("kills", "kills_before_open", "kills_during_open", "kills_during_recovery",
                      "kills_while_writing", "acked",
                      "verifications", "abnormal_recoveries_seen", "records"):
            setattr(total, field, getattr(total, field) + getattr(stats, field))
        for mode, count in stats.modes.items():
            total.modes[mode] = total.modes.get(mode, 0) + count
        # Keep the disk bounded: each chain's store goes once it is verified.
        shutil.rmtree(root / "store")
    print(f"soak total: {total}")
    assert total.kills >= 200


# ---- torn tails ----------------------------------------------------------------------------------

TORN_SEGMENT = 16 * 1024
TORN_TOPIC = "TornTail"


def torn_config(root: Path) -> StoreConfig:
    return StoreConfig(
        store_path_root_dir=str(root / "store"),
        mapped_file_size_commit_log=TORN_SEGMENT,
        mapped_file_size_consume_queue=20 * 16,
        flush_disk_type="SYNC_FLUSH",
    )


def truncating_config(root: Path) -> StoreConfig:
    """torn_config with ``skipCorruptRecordsOnRecover=false``: the log ends at the first
    damaged record whatever follows it (RocketMQ's rule, and ours before issue 9 point 4;
    test_store_damage.py covers the default, which keeps intact records that chain)."""
    return attrs.evolve(torn_config(root), skip_corrupt_records_on_recover=False)


@attrs.frozen
class Written:
    ack: Ack
    size: int
    body_len: int
    props_len: int


def torn_key(i: int, size: int, run: int = 0) -> str:
    return cw.make_key(0, run, 0, i, 0, size)


async def write_torn_store(config: StoreConfig, count: int, *, run: int = 0,
                           sizes=None) -> list[Written]:
    """``count`` messages over two queues, closed cleanly. Bodies 100..1100 bytes, so the
    16 KiB segments roll a few times."""
    written = []
    async with open_store(config) as store:
        for i in range(count):
            size = sizes(i) if sizes is not None else 100 + (i * 379) % 1000
            key = torn_key(i, size, run)
            message = Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key)
            result = await store.put_message(message, i % 2)
            assert result.status is PutMessageStatus.PUT_OK
            ack = Ack(result.commitlog_offset, key, TORN_TOPIC, i % 2, result.queue_offset)
            written.append(Written(ack, result.size, size, len(message.encoded_properties())))
        await store.wait_dispatched()
    return written


def segment_file(config: StoreConfig, offset: int) -> tuple[Path, int]:
    size = config.mapped_file_size_commit_log
    base = offset - offset % size
    return Path(config.commitlog_dir) / f"{base:020d}", offset - base


def patch(path: Path, position: int, data: bytes) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwrite(fd, data, position) == len(data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_at(path: Path, position: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(length)


def zero_to_segment_end(config: StoreConfig, path: Path, position: int) -> None:
    """A file "truncated" at ``position``: segments keep their size, so the rest is zero."""
    patch(path, position, bytes(config.mapped_file_size_commit_log - position))


def _topic_len_position(w: Written) -> int:
    """In-record position of the 1-byte topic length (v1, IPv4 hosts): 84 + 4 + body."""
    return 88 + w.body_len


def _set_totalsize(value: int):
    def damage(config, path, pos, w):
        patch(path, pos, struct.pack(">i", value if value < 2**31 else value - 2**32))
    return damage


def _totalsize(fn):
    def damage(config, path, pos, w):
        patch(path, pos, struct.pack(">i", fn(config, pos, w)))
    return damage


def _zero_from(fn):
    def damage(config, path, pos, w):
        zero_to_segment_end(config, path, pos + fn(w))
    return damage


def _flip(fn, mask: int = 0xFF):
    def damage(config, path, pos, w):
        at = pos + fn(w)
        patch(path, at, bytes([read_at(path, at, 1)[0] ^ mask]))
    return damage


def _zero_16_from_topic_length(config, path, pos, w):
    patch(path, pos + _topic_len_position(w), bytes(16))


def _killed_mid_copy(fn):
    """What a SIGKILL during the encoder's copy leaves: MAGIC not yet published (0), the
    record written up to a point, zeros after it."""
    def damage(config, path, pos, w):
        zero_to_segment_end(config, path, pos + fn(w))
        patch(path, pos + 4, bytes(4))
    return damage


#: damage kind -> function(config, segment path, in-segment position, Written)
DAMAGE = {
    # A file cut short inside the last record (zero from a point to the segment end).
    "truncated_record_never_started": _zero_from(lambda w: 0),
    "truncated_inside_totalsize": _zero_from(lambda w: 2),
    "truncated_after_totalsize": _zero_from(lambda w: 4),
    "truncated_after_magic": _zero_from(lambda w: 8),
    "truncated_inside_header": _zero_from(lambda w: 40),
    "truncated_inside_body": _zero_from(lambda w: 88 + w.body_len // 2),
    "truncated_before_topic_length": _zero_from(lambda w: _topic_len_position(w)),
    "truncated_inside_topic": _zero_from(lambda w: _topic_len_position(w) + 1 + len(TORN_TOPIC) // 2),
    "truncated_before_properties_length": _zero_from(lambda w: w.size - w.props_len - 2),
    # Zeroed bytes in the middle of the record.
    "zeroed_16_bytes_from_topic_length_rocketmq_testRecover": _zero_16_from_topic_length,
    "zeroed_body_length_field": lambda c, path, pos, w: patch(path, pos + 84, bytes(4)),
    # A flipped CRC check.
    "flipped_body_byte_crc_mismatch": _flip(lambda w: 88 + w.body_len // 2),
    "flipped_bit_in_crc_field": _flip(lambda w: 11, 0x01),
    "bad_magic": lambda c, path, pos, w: patch(path, pos + 4, b"\x12\x34\x56\x78"),
    # A torn TOTALSIZE.
    "totalsize_zero": _set_totalsize(0),
    "totalsize_negative": _set_totalsize(0xFFFFFFFF),
    "totalsize_huge": _set_totalsize(0x7FFFFFFF),
    "totalsize_one_short": _totalsize(lambda c, pos, w: w.size - 1),
    "totalsize_one_long": _totalsize(lambda c, pos, w: w.size + 1),
    "totalsize_past_segment_end": _totalsize(
        lambda c, pos, w: c.mapped_file_size_commit_log - pos + 64
    ),
    "totalsize_high_byte_torn": _totalsize(lambda c, pos, w: w.size | 0x01000000),
    # A kill inside the encoder's copy (MAGIC is published last): never accepted, wherever
    # the copy stopped — including inside the properties, which BODYCRC does not cover.
    "killed_while_copying_body": _killed_mid_copy(lambda w: 88 + w.body_len // 2),
    "killed_while_copying_properties": _killed_mid_copy(lambda w: w.size - w.props_len // 2),
    "killed_before_the_last_byte": _killed_mid_copy(lambda w: w.size - 1),
    "killed_after_the_last_byte_before_magic": _killed_mid_copy(lambda w: w.size),
    # A record whose header and body reached the file but whose properties' tail did not:
    # BODYCRC does not cover them, so recovery used to take it whole. The chaos harness
    # produced one on a slave (a replication frame cut inside the record's properties, the
    # slave then SIGKILLed: 15 zero bytes its master never sent again, the slave's log no
    # longer a prefix of the master's). A whole record never ends in a 0 byte.
    "truncated_inside_properties_a_slave_cut_mid_frame_then_killed": _zero_from(
        lambda w: w.size - w.props_len // 2),
    "truncated_last_byte": _zero_from(lambda w: w.size - 1),
}


async def check_recovered_before(config: StoreConfig, written: list[Written], damaged: int,
                                 *, abnormal: bool) -> None:
    """Reopen after damage to record ``damaged``: the log ends right before it, everything
    before it is served, nothing from it on; then the store takes writes that survive a
    reopen."""
    bad = written[damaged]
    end = bad.ack.offset
    before = {w.ack.key: w.ack for w in written[:damaged]}
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        report = recovery_of(store)
        context = f"damaged record at {end} ({bad}); {report}"
        assert report.abnormal is abnormal, context
        assert store.max_commitlog_offset == end, context
        assert report.end_offset == end, context
        assert store.max_queue_offset(TORN_TOPIC, bad.ack.queue_id) == bad.ack.queue_offset, context
        assert await store.look_message_by_offset(end) is None, context
        assert await store.get_messages(TORN_TOPIC, bad.ack.queue_id, bad.ack.queue_offset) == []
        for w in written[damaged:]:
            assert await store.look_message_by_offset(w.ack.offset) is None, (w, context)
        for w in written[:damaged]:
            message = await store.look_message_by_offset(w.ack.offset)
            assert message is not None and _only_key(message) == w.ack.key, (w, context)
            [served] = await store.get_messages(TORN_TOPIC, w.ack.queue_id, w.ack.queue_offset, 1)
            assert served.commitlog_offset == w.ack.offset
        await verify_store(store, before, context=context)

        # The store goes on: the next put takes the damaged record's place and queue offset.
        key = torn_key(10_000, 50, run=1)
        result = await store.put_message(
            Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key),
            bad.ack.queue_id,
        )
        assert result.status is PutMessageStatus.PUT_OK
        assert result.queue_offset == bad.ack.queue_offset
        fits = result.size + rec.END_FILE_MIN_BLANK_LENGTH <= TORN_SEGMENT - end % TORN_SEGMENT
        assert result.commitlog_offset == (end if fits else end - end % TORN_SEGMENT + TORN_SEGMENT)
        before[key] = Ack(result.commitlog_offset, key, TORN_TOPIC, bad.ack.queue_id,
                          result.queue_offset)
        await store.wait_dispatched()
    async with open_store(config) as store:
        assert recovery_of(store).abnormal is False
        assert store.max_commitlog_offset == result.commitlog_offset + result.size
        await verify_store(store, before, context="reopened after the write that followed recovery")


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
@pytest.mark.parametrize("kind", list(DAMAGE))
async def test_torn_tail_recovers_to_last_valid_record(tmp_path, kind, abnormal):
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    last = written[-1]
    path, pos = segment_file(config, last.ack.offset)
    assert pos > 0, "the last record should not start its segment in this layout"
    DAMAGE[kind](config, path, pos, last)
    await check_recovered_before(config, written, len(written) - 1, abnormal=abnormal)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_torn_first_record_of_last_segment_drops_that_segment(tmp_path, abnormal):
    """The damaged record opens its segment: the log ends at the previous segment's blank,
    the damaged segment's file goes, and the next put starts a fresh one at the same base."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    first = max(i for i, w in enumerate(written) if w.ack.offset % TORN_SEGMENT == 0)
    written = written[: first + 1]
    # Drop the records after it, as if the crash came right after the first one.
    path, pos = segment_file(config, written[first].ack.offset)
    _flip(lambda w: 88 + w.body_len // 2)(config, path, pos, written[first])
    zero_to_segment_end(config, path, written[first].size)
    await check_recovered_before(config, written, first, abnormal=abnormal)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_a_blank_closing_the_last_segment_ends_the_log_at_the_segment_end(
    tmp_path, abnormal
):
    """As above, but an earlier recovery already deleted the torn segment and was killed
    before anything else: the last file now ends in a blank. The log still ends at that
    segment's end, as it did for the recovery that deleted the file, not at the blank's
    offset (the crash suite caught two recoveries disagreeing: the second left the blank's
    bytes past its end)."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    first = max(i for i, w in enumerate(written) if w.ack.offset % TORN_SEGMENT == 0)
    written = written[: first + 1]
    path, _ = segment_file(config, written[first].ack.offset)
    path.unlink()
    await check_recovered_before(config, written, first, abnormal=abnormal)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_nothing_after_the_first_invalid_record_is_served_even_if_it_looks_valid(
    tmp_path, abnormal
):
    """Damage in the middle of the log — later records, even whole later segments, are
    valid: with skipCorruptRecordsOnRecover off, the log still ends at the damage, later
    segment files are deleted and the consume queues (both queues) are cut to match."""
    config = truncating_config(tmp_path)
    written = await write_torn_store(config, 60)
    segments_before = sorted(os.listdir(config.commitlog_dir))
    # A record in the second-to-last segment that is not its first.
    last_base = written[-1].ack.offset - written[-1].ack.offset % TORN_SEGMENT
    damaged = max(
        i for i, w in enumerate(written)
        if last_base - TORN_SEGMENT < w.ack.offset < last_base and w.ack.offset % TORN_SEGMENT
    )
    w = written[damaged]
    path, pos = segment_file(config, w.ack.offset)
    _zero_16_from_topic_length(config, path, pos, w)
    await check_recovered_before(config, written, damaged, abnormal=abnormal)
    segments_after = sorted(os.listdir(config.commitlog_dir))
    assert f"{last_base:020d}" in segments_before
    assert len(segments_after) < len(segments_before)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_recovery_zeroes_tail_so_stale_records_never_return(tmp_path, abnormal):
    """RocketMQ cuts the log by moving positions and leaves the bytes. A new record of the
    same size written at the cut then lines up with the old, still valid records after it,
    and the next recovery serves them again (with stale queue offsets). Here recovery zeroes
    everything past the end, so they never come back (docs/differences.md, 'Store and
    recovery'). (With skipCorruptRecordsOnRecover off: by default the records after the
    damage chain and are kept, see test_store_damage.py.)"""
    config = truncating_config(tmp_path)
    written = await write_torn_store(config, 12, sizes=lambda i: 200)  # one segment, same sizes
    damaged = 6
    w = written[damaged]
    path, pos = segment_file(config, w.ack.offset)
    _flip(lambda w: 88 + w.body_len // 2)(config, path, pos, w)
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        assert store.max_commitlog_offset == w.ack.offset
        # Replace the damaged record by one of exactly the same size.
        key = torn_key(6, 200, run=7)
        result = await store.put_message(
            Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key),
            w.ack.queue_id,
        )
        assert (result.commitlog_offset, result.size) == (w.ack.offset, w.size)
        await store.wait_dispatched()
    # The old records 7..11 would now line up right after the new one; scan the log as
    # after a crash.
    (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        assert store.max_commitlog_offset == result.commitlog_offset + result.size
        assert await store.look_message_by_offset(written[damaged + 1].ack.offset) is None
        assert store.max_queue_offset(TORN_TOPIC, w.ack.queue_id) == w.ack.queue_offset + 1
        assert store.max_queue_offset(TORN_TOPIC, 1 - w.ack.queue_id) == (damaged + 1) // 2
        acked = {x.ack.key: x.ack for x in written[:damaged]}
        acked[key] = Ack(result.commitlog_offset, key, TORN_TOPIC, w.ack.queue_id, result.queue_offset)
        await verify_store(store, acked, context="stale records must not return")
    assert read_at(path, pos + w.size, 8) == bytes(8)


@pytest.mark.parametrize("abnormal", [False, True], ids=["normal", "abnormal"])
async def test_recovery_cuts_consume_queue_and_zeroes_its_stale_entries(tmp_path, abnormal):
    """The consume-queue side of the zeroed tail: entries pointing past the new end are
    dropped and their bytes zeroed, so the queue file holds nothing after its last entry."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    damaged = 30
    w = written[damaged]
    path, pos = segment_file(config, w.ack.offset)
    _flip(lambda w: 88 + w.body_len // 2)(config, path, pos, w)
    zero_to_segment_end(config, path, pos + w.size)  # the later records never made it
    for later in written[damaged + 1:]:
        if later.ack.offset - later.ack.offset % TORN_SEGMENT != w.ack.offset - pos:
            later_path, _ = segment_file(config, later.ack.offset)
            later_path.unlink(missing_ok=True)
    if abnormal:
        (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        for queue_id in (0, 1):
            entries = store.max_queue_offset(TORN_TOPIC, queue_id)
            assert entries == sum(1 for x in written[:damaged] if x.ack.queue_id == queue_id)
    cq_file_size = config.mapped_file_size_consume_queue
    for queue_id in (0, 1):
        entries = sum(1 for x in written[:damaged] if x.ack.queue_id == queue_id)
        directory = Path(config.store_path_root_dir) / "consumequeue" / TORN_TOPIC / str(queue_id)
        for name in sorted(os.listdir(directory)):
            data = (directory / name).read_bytes()
            assert len(data) == cq_file_size
            start = max(0, entries * 20 - int(name))
            assert data[start:] == bytes(len(data) - start), (
                f"{directory / name}: stale bytes after the last entry ({entries} entries)"
            )


async def test_abnormal_recovery_rebuilds_a_torn_consume_queue_tail(tmp_path):
    """After a crash the consume queue may have lost entries the commitlog still has:
    abnormal recovery re-dispatches them."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    queue_dir = Path(config.store_path_root_dir) / "consumequeue" / TORN_TOPIC / "0"
    files = sorted(os.listdir(queue_dir))
    last = queue_dir / files[-1]
    data = bytearray(last.read_bytes())
    used = len(data.rstrip(b"\0"))
    used += (-used) % 20
    patch(last, max(0, used - 30), bytes(30))  # tear the last entry and a half
    (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        assert recovery_of(store).abnormal
        await verify_store(store, {w.ack.key: w.ack for w in written}, context="torn CQ")


@pytest.mark.parametrize("which", ["last", "earlier"])
async def test_abnormal_recovery_rewrites_an_entry_torn_after_its_size_as_rocketmq_does_not(
    tmp_path, which
):
    """A SIGKILL in the middle of copying a consume-queue entry into its mapping can leave its
    commitlog offset and size in place and its tags code still zero (the failure seen once in
    test_sigkill_during_sync_flush_puts_loses_no_acknowledged_message: entry (12703450, 1827,
    0) for a record with tags). Recovery judges entries by offset and size alone and then
    skipped the record as a repeat, so the queue kept tags code 0 and a consumer's tag filter
    dropped the message. The abnormal re-dispatch must rewrite the entry from its record —
    the last entry of a queue (a single put's copy) or one before it (a run's copy, which may
    store its first bytes last)."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    queue_id = 0 if which == "last" else 1
    ours = [w for w in written if w.ack.queue_id == queue_id]
    torn = ours[-1] if which == "last" else ours[len(ours) // 2]
    entries_per_file = config.mapped_file_size_consume_queue // 20
    queue_offset = torn.ack.queue_offset
    path = (Path(config.store_path_root_dir) / "consumequeue" / TORN_TOPIC / str(queue_id)
            / f"{queue_offset // entries_per_file * config.mapped_file_size_consume_queue:020d}")
    at = queue_offset % entries_per_file * 20
    offset, size, tags = struct.unpack(">qiq", read_at(path, at, 20))
    assert (offset, size) == (torn.ack.offset, torn.size) and tags != 0
    patch(path, at + 12, bytes(8))  # offset and size stored, the tags code not yet
    (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        report = recovery_of(store)
        assert report.abnormal
        await verify_store(store, {w.ack.key: w.ack for w in written},
                           context=f"{which} entry's tags code torn")
        assert [note.split(":")[0] for note in report.mended_queues] == [
            f"{TORN_TOPIC}/{queue_id}"
        ], report
    assert struct.unpack(">qiq", read_at(path, at, 20)) == (offset, size, tags)


async def test_normal_recovery_rebuilds_a_consume_queue_that_lost_its_tail_unlike_rocketmq(tmp_path):
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)  # queue 1 holds the very last record
    queue_dir = Path(config.store_path_root_dir) / "consumequeue" / TORN_TOPIC / "0"
    last = queue_dir / sorted(os.listdir(queue_dir))[-1]
    used = len(last.read_bytes().rstrip(b"\0"))
    used += (-used) % 20
    patch(last, used - 20, bytes(20))  # queue 0 loses its last entry; no abort file
    async with open_store(config) as store:
        assert not recovery_of(store).abnormal
        key = torn_key(10_000, 10, run=3)
        result = await store.put_message(
            Message(TORN_TOPIC, cw.expected_body(key), tags=cw.expected_tags(key), keys=key), 0
        )
        assert result.status is PutMessageStatus.PUT_OK
        await store.wait_dispatched()
        acked = {w.ack.key: w.ack for w in written}
        acked[key] = Ack(result.commitlog_offset, key, TORN_TOPIC, 0, result.queue_offset)
        await verify_store(store, acked, context="consume queue torn after a clean shutdown")


async def test_first_batch_to_a_topic_the_store_has_not_seen_is_put_ok(tmp_path):
    """Regression: an uncommitted store.py (seen while this file was written) refused the
    first put_messages to a topic not yet in its topic cache with MESSAGE_ILLEGAL "batch
    body of 428 bytes exceeds maxMessageSize 4194304"; the crash writer hit it at once."""
    async with open_store(torn_config(tmp_path)) as store:
        result = await store.put_messages(
            [Message("NeverSeenBefore", b"a"), Message("NeverSeenBefore", b"b")], 3
        )
        assert result.status is PutMessageStatus.PUT_OK, result.remark
        assert result.count == 2 and result.queue_offset == 0


async def test_leftover_tmp_segment_of_an_interrupted_preallocation_is_ignored(tmp_path):
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 10)
    end = written[-1].ack.offset + written[-1].size
    stray = Path(config.commitlog_dir) / f"{TORN_SEGMENT:020d}.tmp"
    stray.write_bytes(b"\x01" * 100)  # a crash between create and rename
    async with open_store(config) as store:
        assert store.max_commitlog_offset == end
        await verify_store(store, {w.ack.key: w.ack for w in written})
    assert not stray.exists()


@pytest.mark.parametrize("which", ["commitlog", "consumequeue"])
async def test_segment_file_cut_short_on_disk_is_refused_with_segment_error(tmp_path, which):
    """A segment whose file is shorter than the configured size (cut short on disk, not by
    us: we size files under a temporary name before renaming them) is refused with a clear
    SegmentError naming the file, rather than mapped and half served; the directory lock is
    released, so the operator can fix the file and reopen."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 40)
    if which == "commitlog":
        path, _ = segment_file(config, written[-1].ack.offset)
        full_size = config.mapped_file_size_commit_log
    else:
        directory = Path(config.store_path_root_dir) / "consumequeue" / TORN_TOPIC / "0"
        path = directory / sorted(os.listdir(directory))[-1]
        full_size = config.mapped_file_size_consume_queue
    cut = full_size // 2 - full_size // 2 % 20
    os.truncate(path, cut)
    for _ in range(2):  # the second attempt proves the lock was released
        with pytest.raises(SegmentError, match=path.name):
            async with open_store(config):
                pass  # pragma: no cover
    # Back to its size, the zeroed rest is a torn tail. (Abnormal, so that a consume queue
    # that lost entries is rebuilt from the commitlog.)
    os.truncate(path, full_size)
    (Path(config.store_path_root_dir) / "abort").touch()
    async with open_store(config) as store:
        if which == "commitlog":
            base = int(path.name)
            survivors = [w for w in written if w.ack.offset + w.size <= base + cut]
            assert store.max_commitlog_offset == survivors[-1].ack.offset + survivors[-1].size
        else:
            survivors = written
        await verify_store(store, {w.ack.key: w.ack for w in survivors}, context=which)
