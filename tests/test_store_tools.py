"""``trio-ha store verify|inspect|truncate`` (issue 13, operations): offline tools on store
directories written by the store itself.

The CLI is run as an operator runs it, the real executable in a child process; the library
(``trio_ha.store.offline``) is also called directly. Where verify says what recovery would
do, the test opens the store afterwards and checks that recovery did exactly that.
"""

from __future__ import annotations

import filecmp
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from conftest import ha_slave_of, wait_until
from trio_ha import BrokerRole, Message, PutMessageResult, PutMessageStatus, StoreConfig, open_store
from trio_ha.store import MessageStore, StoreLockedError
from trio_ha.store.offline import (
    OfflineStoreError,
    TruncatePlan,
    inspect_store,
    truncate_store,
    verify_store,
)
from trio_ha.wire import layout

SEGMENT = 64 * 1024
#: 40 entries per consume-queue file: the queues below span several files
CQ_FILE = 40 * layout.CQ_ENTRY_SIZE
TOPICS = ("Orders", "Audit")
QUEUES = 3


def store_config(root: Path, **overrides: Any) -> StoreConfig:
    values: dict[str, Any] = dict(
        store_path_root_dir=str(root), mapped_file_size_commit_log=SEGMENT,
        mapped_file_size_consume_queue=CQ_FILE,
    )
    values.update(overrides)
    return StoreConfig(**values)


@attrs.frozen
class Put:
    topic: str
    queue_id: int
    key: str
    result: PutMessageResult


def body(i: int) -> bytes:
    return f"message {i} ".encode() * (5 + i % 30)


async def put_messages(store: MessageStore, count: int, start: int = 0) -> list[Put]:
    puts = []
    for i in range(start, start + count):
        topic, queue_id = TOPICS[i % len(TOPICS)], i % QUEUES
        key = f"key-{i}"
        result = await store.put_message(Message(topic, body(i), keys=key), queue_id=queue_id)
        assert result.status is PutMessageStatus.PUT_OK
        puts.append(Put(topic, queue_id, key, result))
    await store.wait_dispatched()
    return puts


async def write_store(config: StoreConfig, count: int = 600) -> list[Put]:
    async with open_store(config) as store:
        return await put_messages(store, count)


def per_queue(puts: list[Put]) -> dict[tuple[str, int], int]:
    counts: dict[tuple[str, int], int] = {}
    for p in puts:
        counts[(p.topic, p.queue_id)] = counts.get((p.topic, p.queue_id), 0) + 1
    return counts


@attrs.frozen
class Ran:
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        return json.loads(self.stdout)


async def cli(*args: str, stdin: bytes = b"") -> Ran:
    """``trio-ha <args>`` in a child process, as an operator runs it."""
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "trio_ha.cli", *args], stdin=stdin, capture_stdout=True,
            capture_stderr=True, check=False,
        )
    return Ran(done.returncode, done.stdout.decode(), done.stderr.decode())


def assert_one_line_failure(ran: Ran, *words: str) -> None:
    assert ran.returncode == 1, ran
    assert "Traceback" not in ran.stderr, ran.stderr
    lines = ran.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trio-ha: "), ran.stderr
    for word in words:
        assert word in lines[0], lines[0]


def flip_byte(path: Path, position: int, mask: int = 0xFF) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        old = f.read(1)[0]
        f.seek(position)
        f.write(bytes([old ^ mask]))


def segment_path(config: StoreConfig, offset: int) -> tuple[Path, int]:
    base = offset - offset % SEGMENT
    return Path(config.store_path_root_dir) / "commitlog" / f"{base:020d}", offset - base


def files_digest(root: Path) -> dict[str, str]:
    """Every file under ``root`` but the lock, by content."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "lock":
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


# ---- verify ----------------------------------------------------------------------------------


async def test_a_store_written_by_the_store_verifies_clean_with_the_right_counts(tmp_path):
    config = store_config(tmp_path / "store")
    puts = await write_store(config)
    end = puts[-1].result.commitlog_offset + puts[-1].result.size
    ran = await cli("store", "verify", config.store_path_root_dir, "--json")
    assert ran.returncode == 0, ran
    report = ran.json()
    segments = sorted(os.listdir(Path(config.store_path_root_dir) / "commitlog"))
    assert len(segments) >= 3
    assert report["clean"] is True and report["damage"] == []
    assert report["segments"] == len(segments)
    assert report["records"] == len(puts)
    assert report["record_bytes"] == sum(p.result.size for p in puts)
    assert (report["log_start"], report["log_end"]) == (0, end)
    assert report["queues"] == len(TOPICS) * QUEUES
    assert report["queue_entries"] == len(puts) and report["queue_entries_unchecked"] == 0
    assert report["index_files"] == 1
    human = await cli("store", "verify", config.store_path_root_dir)
    assert human.returncode == 0, human
    assert f"{len(puts)} records" in human.stdout and human.stdout.rstrip().endswith("clean")


@pytest.mark.parametrize("where", ["middle", "last"])
async def test_a_flipped_body_byte_is_named_with_what_recovery_then_does(tmp_path, where):
    """The damaged record's commitlog offset, its file and position; then recovery does what
    verify said: a hole filled and everything after kept (middle), or the log cut there
    (the last record: nothing intact follows it)."""
    config = store_config(tmp_path / "store")
    puts = await write_store(config)
    damaged = puts[len(puts) // 2] if where == "middle" else puts[-1]
    offset = damaged.result.commitlog_offset
    path, position = segment_path(config, offset)
    flip_byte(path, position + layout.FIXED_PART_IPV4 + 4 + 3)  # a byte of the body

    ran = await cli("store", "verify", config.store_path_root_dir)
    assert ran.returncode == 2, ran
    assert f"DAMAGE at commitlog offset {offset} (commitlog/{path.name}, position {position}" \
        in ran.stdout, ran.stdout
    assert "body CRC mismatch" in ran.stdout
    resume = offset + damaged.result.size
    report = (await cli("store", "verify", config.store_path_root_dir, "--json")).json()
    [damage] = report["damage"]
    assert (damage["area"], damage["commitlog_offset"], damage["file"], damage["file_offset"]) \
        == ("commitlog", offset, f"commitlog/{path.name}", position)
    assert report["records"] == puts.index(damaged) and report["log_end"] == offset
    if where == "middle":
        assert f"replace the {damaged.result.size} damaged bytes [{offset}, {resume})" \
            in damage["recovery"]
    else:
        assert f"truncate the log to {offset}" in damage["recovery"]

    async with open_store(config) as store:
        recovery = store.recovery
        assert recovery is not None
        if where == "middle":
            assert recovery.holes and recovery.holes[0].startswith(f"[{offset}, {resume})")
            assert store.max_commitlog_offset == puts[-1].result.commitlog_offset + \
                puts[-1].result.size
        else:
            assert recovery.holes == () and store.max_commitlog_offset == offset
    after = (await cli("store", "verify", config.store_path_root_dir, "--json")).json()
    # Recovery repaired the commitlog as announced. (When it cuts the log after a clean
    # stop it leaves the index file's end past the cut: verify names that, and a truncate
    # to the log's end mends it.)
    assert after["log_end"] == store.max_commitlog_offset
    assert {d["area"] for d in after["damage"]} <= {"index"}, after["damage"]
    mended = await cli("store", "truncate", config.store_path_root_dir, "--to",
                       str(after["log_end"]), "--yes")
    assert mended.returncode == 0, mended
    assert (await cli("store", "verify", config.store_path_root_dir)).returncode == 0


async def test_a_flipped_consume_queue_byte_is_found(tmp_path):
    config = store_config(tmp_path / "store")
    await write_store(config)
    entry = 45  # the second file of the queue, neither its first nor its last entry
    base = entry * layout.CQ_ENTRY_SIZE // CQ_FILE * CQ_FILE
    path = Path(config.store_path_root_dir) / "consumequeue" / "Audit" / "2" / f"{base:020d}"
    flip_byte(path, entry * layout.CQ_ENTRY_SIZE - base + 7, 0x10)  # its commitlog offset

    ran = await cli("store", "verify", config.store_path_root_dir, "--json")
    assert ran.returncode == 2, ran
    [damage] = ran.json()["damage"]
    assert (damage["area"], damage["queue"], damage["queue_offset"]) == \
        ("consume queue", "Audit/2", entry)
    assert damage["file"] == f"consumequeue/Audit/2/{base:020d}"
    assert damage["file_offset"] == entry * layout.CQ_ENTRY_SIZE - base
    assert "would not notice" in damage["recovery"]
    human = await cli("store", "verify", config.store_path_root_dir)
    assert human.returncode == 2
    assert f"DAMAGE at consume queue Audit/2 queue offset {entry}" in human.stdout


async def test_the_library_verifies_and_reports_damage_in_both_areas(tmp_path):
    config = store_config(tmp_path / "store")
    puts = await write_store(config, 200)
    report = verify_store(config.store_path_root_dir)
    assert report.clean and report.records == 200 and report.queue_entries == 200
    # A wrong PHYSICALOFFSET: the scanner passes the record, verify does not.
    victim = puts[20].result.commitlog_offset
    path, position = segment_path(config, victim)
    flip_byte(path, position + layout.PHYSICALOFFSET_AT + 7, 0x01)
    report = verify_store(config.store_path_root_dir)
    assert not report.clean
    assert report.damage[0].commitlog_offset == victim
    assert "PHYSICALOFFSET" in report.damage[0].problem
    assert report.records == 20


# ---- inspect ---------------------------------------------------------------------------------


async def test_inspect_shows_the_topics_queues_and_offsets_that_were_put(tmp_path):
    config = store_config(tmp_path / "store")
    puts = await write_store(config)
    end = puts[-1].result.commitlog_offset + puts[-1].result.size
    ran = await cli("store", "inspect", config.store_path_root_dir, "--json")
    assert ran.returncode == 0, ran
    inventory = ran.json()
    expected = per_queue(puts)
    assert {(q["topic"], q["queue_id"]): (q["min_offset"], q["max_offset"], q["entries"])
            for q in inventory["queues"]} == {k: (0, n, n) for k, n in expected.items()}
    assert inventory["topics"] == {
        topic: {"queues": QUEUES, "entries": sum(n for (t, _), n in expected.items() if t == topic)}
        for topic in TOPICS
    }
    assert (inventory["min_offset"], inventory["max_offset"]) == (0, end)
    segments = inventory["segments"]
    assert [s["base_offset"] for s in segments] == [i * SEGMENT for i in range(len(segments))]
    assert segments[-1]["written_end"] == end and segments[-1]["state"] == "active"
    assert all(s["state"] == "full" for s in segments[:-1])
    assert inventory["segment_size"] == SEGMENT
    assert inventory["abort_present"] is False and inventory["lock"] == "free"
    assert inventory["checkpoint"]["present"] is True
    assert inventory["checkpoint"]["physic_msg_timestamp"] == puts[-1].result.store_timestamp
    assert len(inventory["index_files"]) == 1
    table = await cli("store", "inspect", config.store_path_root_dir)
    assert table.returncode == 0, table
    assert "Orders" in table.stdout and "Audit" in table.stdout and str(end) in table.stdout


async def test_inspect_of_an_open_store_says_the_lock_is_held_and_the_stop_not_clean(tmp_path):
    config = store_config(tmp_path / "store")
    async with open_store(config) as store:
        await put_messages(store, 10)
        inventory = (await cli("store", "inspect", config.store_path_root_dir, "--json")).json()
        assert inventory["lock"] == "held" and inventory["abort_present"] is True
        # in this process too, where a POSIX lock does not exclude its holder
        assert inspect_store(config.store_path_root_dir).lock == "held"
    assert inspect_store(config.store_path_root_dir).lock == "free"


async def test_operator_mistakes_are_one_line_and_exit_1(tmp_path):
    missing = tmp_path / "nowhere"
    for command in ("verify", "inspect"):
        assert_one_line_failure(await cli("store", command, str(missing)), "no such directory")
    (tmp_path / "empty").mkdir()
    assert_one_line_failure(await cli("store", "verify", str(tmp_path / "empty")),
                            "not a store directory")
    assert_one_line_failure(
        await cli("store", "truncate", str(tmp_path / "empty"), "--to", "0", "--yes"),
        "not a store directory")
    assert_one_line_failure(
        await cli("store", "verify", str(tmp_path / "empty"), "-c", str(tmp_path / "no.conf")),
        "No such file")


# ---- truncate --------------------------------------------------------------------------------


async def test_verify_and_truncate_refuse_a_store_that_is_open(tmp_path):
    config = store_config(tmp_path / "store")
    async with open_store(config) as store:
        puts = await put_messages(store, 50)
        offset = puts[10].result.commitlog_offset
        before = store.max_commitlog_offset
        ran = await cli("store", "truncate", config.store_path_root_dir, "--to", str(offset),
                        "--yes")
        assert_one_line_failure(ran, "in use")
        assert_one_line_failure(await cli("store", "verify", config.store_path_root_dir),
                                "in use")
        with pytest.raises(StoreLockedError):
            truncate_store(config.store_path_root_dir, offset)
        assert store.max_commitlog_offset == before
        assert store.max_queue_offset(puts[10].topic, puts[10].queue_id) > 0
    async with open_store(config) as store:
        assert store.max_commitlog_offset == before


async def test_truncate_refuses_an_offset_that_is_not_a_record_boundary(tmp_path):
    config = store_config(tmp_path / "store")
    puts = await write_store(config, 100)
    record = puts[40].result
    before = files_digest(Path(config.store_path_root_dir))
    ran = await cli("store", "truncate", config.store_path_root_dir, "--to",
                    str(record.commitlog_offset + 5), "--yes")
    assert_one_line_failure(ran, "not a record boundary", str(record.commitlog_offset),
                            str(record.commitlog_offset + record.size))
    end = puts[-1].result.commitlog_offset + puts[-1].result.size
    assert_one_line_failure(await cli("store", "truncate", config.store_path_root_dir, "--to",
                                      str(end + 1000), "--yes"), "past the end")
    assert files_digest(Path(config.store_path_root_dir)) == before


async def test_truncate_cuts_the_log_queues_index_and_checkpoint_and_the_store_resumes_there(
    tmp_path,
):
    config = store_config(tmp_path / "store")
    puts = await write_store(config)
    root = Path(config.store_path_root_dir)
    cut = 437
    offset = puts[cut].result.commitlog_offset
    kept, gone = puts[:cut], puts[cut:]

    before = files_digest(root)
    dry = await cli("store", "truncate", str(root), "--to", str(offset), "--dry-run")
    assert dry.returncode == 0, dry
    assert f"cut the commitlog back to {offset}" in dry.stdout and "dry run" in dry.stdout
    declined = await cli("store", "truncate", str(root), "--to", str(offset), stdin=b"n\n")
    assert declined.returncode == 1 and "nothing was changed" in declined.stderr
    assert files_digest(root) == before

    ran = await cli("store", "truncate", str(root), "--to", str(offset), "--json",
                    stdin=b"y\n")
    assert ran.returncode == 0, ran
    plan = ran.json()
    end = puts[-1].result.commitlog_offset + puts[-1].result.size
    assert plan["applied"] is True and plan["records_cut"] == len(gone)
    assert (plan["log_end"], plan["bytes_cut"]) == (end, end - offset)
    assert plan["checkpoint_after"]["physic_msg_timestamp"] == kept[-1].result.store_timestamp
    assert (await cli("store", "verify", str(root))).returncode == 0

    async with open_store(config) as store:
        assert store.max_commitlog_offset == offset
        assert store.recovery is not None and store.recovery.holes == ()
        expected = per_queue(kept)
        for topic in TOPICS:
            for queue_id in range(QUEUES):
                assert store.max_queue_offset(topic, queue_id) == expected[(topic, queue_id)]
        last = kept[-1]
        [message] = await store.get_messages(last.topic, last.queue_id,
                                             expected[(last.topic, last.queue_id)] - 1, 1)
        assert message.commitlog_offset == last.result.commitlog_offset
        # The index answers for what is left, not for what went, and takes new keys.
        assert store.query_message(last.topic, last.key, 8, 0, 2**62).records
        assert not store.query_message(gone[0].topic, gone[0].key, 8, 0, 2**62).records
        [again] = await put_messages(store, 1, start=cut)
        assert again.result.commitlog_offset == offset
        assert again.result.queue_offset == expected[(again.topic, again.queue_id)]
        assert store.query_message(again.topic, again.key, 8, 0, 2**62).records
    assert (await cli("store", "verify", str(root))).returncode == 0


async def test_truncate_to_a_segment_start_drops_whole_queues_and_files(tmp_path):
    """The library directly: a cut at the start of the second segment deletes every later
    segment, and a topic written only after the cut loses its consume queue."""
    config = store_config(tmp_path / "store")
    async with open_store(config) as store:
        early = await put_messages(store, 250)
        late = await store.put_message(Message("Late", b"after the cut"), queue_id=0)
        await store.wait_dispatched()
        boundary = SEGMENT
        assert early[-1].result.commitlog_offset > boundary > early[0].result.commitlog_offset
        assert late.commitlog_offset > boundary
    seen: list[TruncatePlan] = []

    def refuse(plan: TruncatePlan) -> bool:
        seen.append(plan)
        return False

    with pytest.raises(OfflineStoreError, match="not a record boundary"):
        truncate_store(config.store_path_root_dir, boundary - 3)
    outcome = truncate_store(config.store_path_root_dir, boundary, confirm=refuse)
    assert not outcome.applied and seen == [outcome.plan]
    outcome = truncate_store(config.store_path_root_dir, boundary)
    assert outcome.applied and outcome.plan.segment_cut is None
    assert len(outcome.plan.segments_deleted) >= 1
    assert any(c.topic == "Late" and c.removed for c in outcome.plan.queue_cuts)
    assert not (Path(config.store_path_root_dir) / "consumequeue" / "Late" / "0").exists()
    # The first segment is full (its records, then its blank): the log ends at the cut,
    # the segment's end, as recovery ends it (not at the blank: see docs/differences.md).
    kept = [p for p in early if p.result.commitlog_offset < boundary]
    inventory = inspect_store(config.store_path_root_dir)
    assert inventory.max_offset == boundary and inventory.segments[-1].state == "full"
    assert [s.name for s in inventory.segments] == [f"{0:020d}"]
    async with open_store(config) as store:
        assert store.max_commitlog_offset == boundary
        for (topic, queue_id), n in per_queue(kept).items():
            assert store.max_queue_offset(topic, queue_id) == n
        assert store.max_queue_offset("Late", 0) == 0
        # and the next record opens the second segment, and Late's queue afresh (these were
        # read after this put before, which raced the dispatcher indexing it)
        again = await store.put_message(Message("Late", b"after the cut"), queue_id=0)
        assert again.commitlog_offset == boundary and again.queue_offset == 0
        await store.wait_dispatched()
        assert store.max_queue_offset("Late", 0) == 1


# ---- the diverged slave ----------------------------------------------------------------------


def master_config(root: Path) -> StoreConfig:
    return store_config(root, broker_role=BrokerRole.ASYNC_MASTER, ha_listen_port=0,
                        ha_bind_address="127.0.0.1", ha_start_from_min_offset=True)


def slave_config(root: Path, master: MessageStore) -> StoreConfig:
    assert master.ha_address is not None
    host, port = master.ha_address
    return store_config(root, broker_role=BrokerRole.SLAVE, ha_master_address=f"{host}:{port}",
                        ha_reconnect_interval=100)


async def test_truncate_repairs_a_diverged_slave_which_then_replicates_again(tmp_path):
    master_root, slave_root = tmp_path / "master", tmp_path / "slave"
    async with open_store(master_config(master_root)) as master:
        async with open_store(slave_config(slave_root, master)) as slave:
            await put_messages(master, 120)
            await slave.wait_dispatched(master.max_commitlog_offset)
        common = master.max_commitlog_offset
        # While detached, the slave gets bytes its master never had (as when a master that
        # lost its tail comes back): written into its store directly.
        async with open_store(store_config(slave_root)) as detached:
            await put_messages(detached, 30, start=5000)
            assert detached.max_commitlog_offset > common
        async with open_store(slave_config(slave_root, master)) as slave:
            await wait_until(lambda: ha_slave_of(slave).state == "diverged",
                             "the slave to report the divergence")
            divergence = ha_slave_of(slave).divergence
            assert divergence is not None and "master lost its tail" in divergence
        # The operator's repair: back to the prefix both logs share.
        ran = await cli("store", "truncate", str(slave_root), "--to", str(common), "--yes")
        assert ran.returncode == 0, ran
        assert (await cli("store", "verify", str(slave_root))).returncode == 0
        async with open_store(slave_config(slave_root, master)) as slave:
            assert slave.max_commitlog_offset == common
            more = await put_messages(master, 150, start=120)
            await slave.wait_dispatched(master.max_commitlog_offset)
            assert ha_slave_of(slave).state != "diverged"
            assert slave.max_commitlog_offset == master.max_commitlog_offset
            last = more[-1]
            high = master.max_queue_offset(last.topic, last.queue_id)
            assert slave.max_queue_offset(last.topic, last.queue_id) == high
            [a] = await master.get_messages(last.topic, last.queue_id, high - 1, 1)
            [b] = await slave.get_messages(last.topic, last.queue_id, high - 1, 1)
            assert (a.body, a.commitlog_offset) == (b.body, b.commitlog_offset)
    # Both closed (no spare segments left behind): the slave's log is the master's, byte
    # for byte.
    names = sorted(os.listdir(slave_root / "commitlog"))
    assert names == sorted(os.listdir(master_root / "commitlog"))
    for name in names:
        assert filecmp.cmp(master_root / "commitlog" / name, slave_root / "commitlog" / name,
                           shallow=False), name
