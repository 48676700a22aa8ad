"""The Spark data source's file side, without a Spark session: confirmed ends, planning,
Arrow batches, checked against the golden encoder and the store's own files.

Skipped only when pyarrow/numpy are missing and TRIO_HA_REQUIRE_SPARK is not 1 (bin/test
sets it, so in CI these always run)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zlib

import pytest

try:
    import numpy  # noqa: F401 - only its presence is checked here
    import pyarrow as pa
except ImportError:  # pragma: no cover - only without the spark extra
    if os.environ.get("TRIO_HA_REQUIRE_SPARK") == "1":
        raise
    pytest.skip("the spark extra (pyarrow, numpy) is not installed", allow_module_level=True)

import trio

from golden_encoder import GoldenMessage, GoldenStore, build_golden_store, encode
from trio_ha import FlushDiskType, Message, StoreConfig, open_store
from trio_ha.spark.batches import ARROW_SCHEMA, parse_properties
from trio_ha.spark.local import read_arrow
from trio_ha.spark.plan import parse_options, plan
from trio_ha.spark.store_files import StoreDir, advance, confirmed_end
from trio_ha.wire import record as rec

SEGMENT = 64 * 1024
TOPICS = ("Orders", "Payments", "Audit")


def our_messages(count: int, start: int = 0) -> list[tuple[Message, int]]:
    """Deterministic messages for our store: several topics and queues, varied bodies and
    properties, two producer hosts."""
    out = []
    for i in range(start, start + count):
        topic = TOPICS[i % 3]
        props = {"UNIQ_KEY": f"0A000001{i:024X}"}
        if i % 7 == 0:
            props["source"] = "spark-test"
        out.append((Message(
            topic,
            bytes((i + j) % 251 for j in range((i * 53) % 900)),
            tags=None if i % 6 == 0 else f"t{i % 5}",
            keys=None if i % 4 == 0 else (f"k{i}", f"user{i % 9}"),
            properties=props,
            flag=i % 5,
            born_host="10.0.0.5:5555" if i % 2 else "10.0.0.6:6666",
            born_timestamp=1_700_000_000_000 + i,
        ), i % 4))
    return out


def write_our_store(root: str, messages, *, segment_size: int = SEGMENT) -> int:
    """Put ``messages`` with the real store; returns the commitlog end."""
    config = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=segment_size,
                         mapped_file_size_consume_queue=20 * 100,
                         flush_disk_type=FlushDiskType.ASYNC_FLUSH)

    async def main() -> int:
        async with open_store(config) as store:
            for message, queue in messages:
                result = await store.put_message(message, queue)
                assert result.status.name == "PUT_OK", result
            await store.wait_dispatched()
            return store.commitlog.max_offset

    return trio.run(main)


def add_partial_tail(root: str, *, whole: bool = False) -> tuple[int, bytes]:
    """Write (part of) one more valid record at the store's end, as a writer caught in the
    middle would leave it. Returns (its offset, its bytes)."""
    store = StoreDir(root)
    end = confirmed_end(store).end
    seg = [s for s in store.segments() if s.base <= end < s.end][0]
    m = GoldenMessage(topic="Orders", body=b"tail-record" * 20, queue_id=0,
                      properties=[("TAGS", "tail")], store_host="127.0.0.1:10911",
                      born_timestamp=1_800_000_000_000, store_timestamp=1_800_000_000_000)
    m.commitlog_offset = end
    m.queue_offset = 10_000
    data = encode(m)
    part = data if whole else data[: len(data) - 40]
    with open(seg.path, "r+b") as f:
        f.seek(end - seg.base)
        f.write(part)
    return end, data


def complete_tail(root: str, offset: int, data: bytes) -> None:
    store = StoreDir(root)
    seg = [s for s in store.segments() if s.base <= offset < s.end][0]
    with open(seg.path, "r+b") as f:
        f.seek(offset - seg.base)
        f.write(data)


def flip_byte(path: str, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0xFF]))


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("golden") / "store")
    g = build_golden_store(root)
    g.write()
    return g


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("ours") / "store")
    messages = our_messages(900)
    end = write_our_store(root, messages)
    tail_offset, _ = add_partial_tail(root)
    return root, messages, end, tail_offset


def _row_view(row: dict) -> dict:
    out = dict(row)
    out["properties"] = dict(out["properties"])
    out["born_timestamp_ms"] = int(out.pop("born_timestamp").timestamp() * 1000)
    out["store_timestamp_ms"] = int(out.pop("store_timestamp").timestamp() * 1000)
    return out


# ---- golden store -------------------------------------------------------------------------


def test_golden_store_every_field(golden):
    table = read_arrow(golden.root)
    assert table.schema == ARROW_SCHEMA
    rows = [_row_view(r) for r in table.to_pylist()]
    expected = [m.expected_row(os.path.abspath(golden.root)) for m in golden.messages]
    assert len(rows) == len(expected) == 600
    for got, want in zip(rows, expected, strict=True):
        assert got == want, (got["commitlog_offset"], got, want)
    # the corners really are there
    assert any(r["size"] and r["topic"] == "T" * 140 for r in rows)
    assert any(r["born_host"].startswith("[2001:db8::7]") for r in rows)
    assert any(r["store_host"].startswith("[fe80::1]") for r in rows)
    assert len(golden.segments) > 10


def test_golden_store_against_the_reference_decoder(golden):
    """Our pure-Python decoder and the data source agree on the golden bytes too."""
    table = read_arrow(golden.root, verify_crc="false")
    assert table.column("crc_ok").null_count == table.num_rows
    for row in table.to_pylist()[::37]:
        base = row["commitlog_offset"] - row["commitlog_offset"] % golden.segment_size
        decoded = rec.decode_record(bytes(golden.segments[base]), row["commitlog_offset"] - base)
        assert decoded.topic == row["topic"] and decoded.body == row["body"]
        assert decoded.properties == dict(row["properties"])
        assert decoded.msg_id == row["msg_id"]


def test_confirmed_end_golden(golden):
    tail = confirmed_end(StoreDir(golden.root))
    assert tail.end == golden.end
    assert tail.last_offset == golden.messages[-1].commitlog_offset


def test_bare_commitlog_directory(golden):
    """A commitlog directory on its own (no consume queues) reads the same rows."""
    table = read_arrow(os.path.join(golden.root, "commitlog"), partition_bytes="4096")
    assert table.column("commitlog_offset").to_pylist() == [m.commitlog_offset for m in golden.messages]


# ---- our store ------------------------------------------------------------------------------


def test_our_store_rows_and_partial_tail(ours):
    root, messages, end, tail_offset = ours
    assert tail_offset == end
    assert confirmed_end(StoreDir(root)).end == end  # the partial record is not confirmed
    table = read_arrow(root)
    assert table.num_rows == len(messages)
    assert max(table.column("commitlog_offset").to_pylist()) < end
    assert len(StoreDir(root).segments()) >= 8
    by_offset = {r["commitlog_offset"]: r for r in table.to_pylist()}
    data = {}
    for s in StoreDir(root).segments():
        with open(s.path, "rb") as f:
            data[s.base] = f.read()
    for (message, queue), row in zip(messages, table.to_pylist(), strict=True):
        assert row["topic"] == message.topic and row["queue_id"] == queue
        assert row["body"] == message.body
        assert row["tags"] == message.tags
        assert row["keys"] == list(message.keys or ())
        assert row["uniq_key"] == message.properties["UNIQ_KEY"]
        assert dict(row["properties"]) == message.all_properties()
        assert row["born_host"] == message.born_host
    for offset in sorted(by_offset)[::29]:
        row = by_offset[offset]
        base = offset - offset % SEGMENT
        m = rec.decode_record(data[base], offset - base, check_crc=True)
        assert (m.topic, m.queue_id, m.queue_offset, m.size, m.body, m.body_crc, m.flag,
                m.sys_flag, m.born_host, m.store_host, m.msg_id, m.reconsume_times,
                m.prepared_transaction_offset) == (
            row["topic"], row["queue_id"], row["queue_offset"], row["size"], row["body"],
            row["body_crc"], row["flag"], row["sys_flag"], row["born_host"], row["store_host"],
            row["msg_id"], row["reconsume_times"], row["prepared_transaction_offset"])
        assert int(row["store_timestamp"].timestamp() * 1000) == m.store_timestamp
        assert int(row["born_timestamp"].timestamp() * 1000) == m.born_timestamp


def test_partitions_are_finer_than_segments_and_aligned(ours):
    root, messages, end, _ = ours
    opts = parse_options({"path": root, "partition_bytes": "8192"})
    chunks = plan(opts)
    segments = StoreDir(root).segments()
    assert len(chunks) > 3 * len([s for s in segments if s.base < end])
    starts = set(read_arrow(root, verify_crc="false").column("commitlog_offset").to_pylist())
    for c in chunks:
        for a, _ in c.ranges:
            assert c.base + a in starts or a == 0
    # the same without consume queues (boundaries from the native scanner)
    no_cq = plan(parse_options({"path": root, "partition_bytes": "8192",
                                "use_consume_queues": "false"}))
    assert len(no_cq) > 3 * len(segments) // 2
    table = read_arrow(root, partition_bytes="8192", use_consume_queues="false")
    assert table.column("commitlog_offset").to_pylist() == sorted(starts)


def test_topic_pushdown_reads_less(ours):
    root, messages, _, _ = ours
    all_bytes = sum(c.nbytes for c in plan(parse_options({"path": root})))
    opts = parse_options({"path": root, "topics": "Payments", "queue_ids": "1,2",
                          "merge_gap_bytes": "0"})
    chunks = plan(opts)
    assert sum(c.nbytes for c in chunks) < all_bytes / 3
    table = read_arrow(root, topics="Payments", queue_ids="1,2", merge_gap_bytes="0")
    merged = read_arrow(root, topics="Payments", queue_ids="1,2")
    assert merged.column("commitlog_offset").to_pylist() == table.column("commitlog_offset").to_pylist()
    want = [i for i, (m, q) in enumerate(messages) if m.topic == "Payments" and q in (1, 2)]
    assert table.num_rows == len(want)
    assert set(table.column("topic").to_pylist()) == {"Payments"}


def test_offset_and_time_ranges(ours):
    root, messages, _, _ = ours
    full = read_arrow(root)
    offsets = full.column("commitlog_offset").to_pylist()
    lo, hi = offsets[100] + 3, offsets[700] + 1  # not boundaries
    part = read_arrow(root, start_offset=str(lo), end_offset=str(hi))
    assert part.column("commitlog_offset").to_pylist() == [o for o in offsets if lo <= o < hi]
    stamps = [int(t.timestamp() * 1000) for t in full.column("store_timestamp").to_pylist()]
    since, until = stamps[200], stamps[600]
    part = read_arrow(root, since=str(since), until=str(until))
    assert part.num_rows == sum(1 for t in stamps if since <= t < until)


def test_crc_mismatch_fails_or_is_emitted(ours, tmp_path):
    root = str(tmp_path / "store")
    shutil.copytree(ours[0], root)
    table = read_arrow(root, verify_crc="false")
    row = table.slice(400, 1).to_pylist()[0]
    seg = [s for s in StoreDir(root).segments() if s.base <= row["commitlog_offset"] < s.end][0]
    body_at = row["commitlog_offset"] - seg.base + row["size"] - len(row["body"]) - 1 - len(
        row["topic"]) - 2 - sum(len(k) + len(v) + 2 for k, v in row["properties"]) + 1
    assert len(row["body"]) > 10
    flip_byte(seg.path, body_at + 5)
    from trio_ha.spark.store_files import CorruptRecordError

    with pytest.raises(CorruptRecordError, match=str(row["commitlog_offset"])) as info:
        read_arrow(root)
    assert info.value.offset == row["commitlog_offset"]
    emitted = read_arrow(root, on_corrupt="emit")
    assert emitted.num_rows == table.num_rows
    bad = [r for r in emitted.to_pylist() if r["crc_ok"] is False]
    assert [r["commitlog_offset"] for r in bad] == [row["commitlog_offset"]]
    assert zlib.crc32(bad[0]["body"]) & 0x7FFFFFFF != bad[0]["body_crc"]


def test_torn_tail_is_not_confirmed(tmp_path):
    g = GoldenStore(str(tmp_path / "s"))
    for _ in range(5):
        g.append(GoldenMessage(topic="A", body=b"x" * 100))
    last = g.messages[-1]
    g.write()
    seg = os.path.join(g.root, "commitlog", f"{0:020d}")
    # a whole-looking last record whose body is still being copied (bad CRC, zeros after)
    flip_byte(seg, last.commitlog_offset + last.size - 20)
    assert confirmed_end(StoreDir(g.root)).end == last.commitlog_offset
    # the same damage in the middle is corruption, confirmed (and reported by the reader)
    g2 = GoldenStore(str(tmp_path / "s2"))
    for _ in range(5):
        g2.append(GoldenMessage(topic="A", body=b"x" * 100))
    g2.write()
    mid = g2.messages[2]
    flip_byte(os.path.join(g2.root, "commitlog", f"{0:020d}"), mid.commitlog_offset + 120)
    assert confirmed_end(StoreDir(g2.root)).end == g2.end


def test_advance_limits_records_and_bytes(ours):
    root, messages, end, _ = ours
    store = StoreDir(root)
    offsets = read_arrow(root, verify_crc="false").column("commitlog_offset").to_pylist()
    assert advance(store, offsets[0], end, 1 << 22, max_records=10) == offsets[10]
    assert advance(store, offsets[5], end, 1 << 22, max_records=1) == offsets[6]
    # crossing segment ends (blank records)
    pos, seen = offsets[0], 0
    while pos < end:
        nxt = advance(store, pos, end, 1 << 22, max_bytes=5000)
        assert nxt > pos and (nxt in offsets or nxt == end)
        seen += 1
        pos = nxt
    assert seen > 10


def test_parse_properties_like_rocketmq():
    props = pa.array([
        "TAGS\x01a\x02KEYS\x01k1 k2\x02UNIQ_KEY\x01U1",
        "TAGS\x01b\x02",  # trailing separator (4.9.0-, 5.2+)
        "",
        "x\x01\x02\x01y\x02KEYS\x01  \x02v\x01a\x01b",  # empty value, empty name, blank keys
    ], pa.string())
    prop_map, tags, keys, uniq = parse_properties(props)
    assert [dict(m) for m in prop_map.to_pylist()] == [
        {"TAGS": "a", "KEYS": "k1 k2", "UNIQ_KEY": "U1"}, {"TAGS": "b"}, {},
        {"KEYS": "  ", "v": "a\x01b"}]
    assert tags.to_pylist() == ["a", "b", None, None]
    assert keys.to_pylist() == [["k1", "k2"], [], [], []]
    assert uniq.to_pylist() == ["U1", None, None, None]
    for text in ("TAGS\x01a\x02KEYS\x01k1 k2", "a\x01b\x02c\x01d\x02"):
        assert dict(parse_properties(pa.array([text]))[0].to_pylist()[0]) == rec.decode_properties(text)


def test_spark_package_does_not_import_trio(golden):
    code = (
        "import sys\n"
        "from trio_ha.spark.local import read_arrow\n"
        "import trio_ha.spark.jobs, trio_ha.spark.plot\n"
        f"t = read_arrow({golden.root!r})\n"
        "assert t.num_rows == 600\n"
        "assert 'trio' not in sys.modules, 'trio was imported'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_topic_option_returns_queue_messages_on_every_path(golden):
    """PREPARED records are in no consume queue: a topics read leaves them out, whether or
    not the consume queues pruned the ranges."""
    want = [m.commitlog_offset for m in golden.messages if m.topic == "GoldenA" and m.dispatched]
    assert len(want) < sum(1 for m in golden.messages if m.topic == "GoldenA")
    for extra in ({}, {"merge_gap_bytes": "0"}, {"use_consume_queues": "false"}):
        table = read_arrow(golden.root, topics="GoldenA", **extra)
        assert table.column("commitlog_offset").to_pylist() == want, extra


def test_bodies_a_producer_compressed_are_inflated_unless_asked_not_to(tmp_path):
    """RocketMQ's clients zlib a body over 4 KiB and set sysFlag bit 0: ``body`` is what was
    sent (``spark export`` used to write the stored zlib bytes without saying so), the
    stored bytes with decompress_body=false, and a body marked compressed that does not
    inflate fails the read naming its offset (or, with on_corrupt=emit, comes as stored)."""
    sent = [bytes(range(256)) * 40, b"plain body", b"x" * 9000]
    messages = [(Message("Zipped", zlib.compress(sent[0]), sys_flag=rec.SYSFLAG_COMPRESSED), 0),
                (Message("Zipped", sent[1]), 0),
                (Message("Zipped", zlib.compress(sent[2]), sys_flag=rec.SYSFLAG_COMPRESSED), 1)]
    root = str(tmp_path / "store")
    write_our_store(root, messages)
    rows = sorted(read_arrow(root).to_pylist(), key=lambda r: r["commitlog_offset"])
    assert [r["body"] for r in rows] == sent
    assert [r["sys_flag"] & 1 for r in rows] == [1, 0, 1]
    stored = sorted(read_arrow(root, decompress_body="false").to_pylist(),
                    key=lambda r: r["commitlog_offset"])
    assert [r["body"] for r in stored] == [m.body for m, _ in messages]

    bad_root = str(tmp_path / "bad")
    write_our_store(bad_root, [*messages, (Message("Zipped", b"not zlib at all",
                                                   sys_flag=rec.SYSFLAG_COMPRESSED), 2)])
    from trio_ha.spark.store_files import CorruptRecordError

    with pytest.raises(CorruptRecordError, match="marked compressed") as info:
        read_arrow(bad_root)
    last = max(r["commitlog_offset"] for r in read_arrow(bad_root, decompress_body="false")
               .to_pylist())
    assert info.value.offset == last
    emitted = read_arrow(bad_root, on_corrupt="emit").to_pylist()
    assert sorted(r["body"] for r in emitted) == sorted([*sent, b"not zlib at all"])
