"""Index files and queries by key (issue 12).

The files are parsed here independently, from the reference's layout (§3.3), not with the
module that writes them; the native and the Python engine must write the same bytes; queries
find messages by KEYS value and by UNIQ_KEY, within a time range, across full files, after a
crash (the files past the checkpoint are rebuilt), on a slave, and over QUERY_MESSAGE.
"""

from __future__ import annotations

import os
import shutil
import struct

import pytest

from conftest import wait_until
from trio_ha import _backend, open_store
from trio_ha.remoting import open_remoting_client
from trio_ha.store import PutRequest
from trio_ha.store import index as index_module
from trio_ha.testing import ClusterConfig, serve_cluster
from trio_ha.wire import record as rec
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

SLOTS, ENTRIES = 101, 64
SMALL = dict(max_hash_slot_num=SLOTS, max_index_num=ENTRIES)
FOREVER = (0, 2**62)


def parse_index(path: str, slots: int = SLOTS) -> tuple[dict, list[int], list[tuple]]:
    """Header, slots and entries of an index file, read with struct from the reference."""
    with open(path, "rb") as f:
        data = f.read()
    names = ("begin_ts", "end_ts", "begin_phy", "end_phy", "slot_count", "index_count")
    header = dict(zip(names, struct.unpack_from(">qqqqii", data, 0), strict=True))
    slot_values = [struct.unpack_from(">i", data, 40 + 4 * i)[0] for i in range(slots)]
    entries = [struct.unpack_from(">iqii", data, 40 + 4 * slots + 20 * i)
               for i in range(header["index_count"])]
    return header, slot_values, entries


def size_of(path: str) -> int:
    return os.path.getsize(path)


def read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def java_key_hash(text: str) -> int:
    h = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        h = (31 * h + int(unit, 16)) & 0xFFFFFFFF
    h = h - 2**32 if h >= 2**31 else h
    return 0 if h == -(2**31) else abs(h)


async def put(store, topic, body, *, keys="", uniq=None, sys_flag=0):
    properties = {}
    if keys:
        properties["KEYS"] = keys
    if uniq:
        properties["UNIQ_KEY"] = uniq
    result = await store.put(PutRequest(topic, 0, body,
                                        rec.encode_properties(properties).encode(),
                                        sys_flag=sys_flag))
    assert result.status.name == "PUT_OK"
    return result


def index_files(root) -> list[str]:
    directory = os.path.join(root, "index")
    return [os.path.join(directory, n) for n in sorted(os.listdir(directory))]


async def test_the_index_file_is_rocketmqs_layout(make_config):
    config = make_config(**SMALL)
    async with open_store(config) as store:
        first = await put(store, "Orders", b"a", keys="k1 k2", uniq="U1")
        second = await put(store, "Orders", b"b", keys="k1", uniq="U2")
        await put(store, "Orders", b"c")  # no keys: not indexed
        rolled = await put(store, "Orders", b"d", keys="k9", sys_flag=rec.TRANSACTION_ROLLBACK)
        await store.wait_dispatched()
        assert rolled.commitlog_offset > 0
    [path] = index_files(config.store_path_root_dir)
    assert len(os.path.basename(path)) == 17 and os.path.basename(path).isdigit()
    assert size_of(path) == 40 + 4 * SLOTS + 20 * ENTRIES
    header, slots, entries = parse_index(path)
    first_ts = (await _stored_at(config, first.commitlog_offset))
    second_ts = (await _stored_at(config, second.commitlog_offset))
    assert header == {"begin_ts": first_ts, "end_ts": second_ts,
                      "begin_phy": first.commitlog_offset, "end_phy": second.commitlog_offset,
                      "slot_count": header["slot_count"], "index_count": 6}
    # Entry 0 is unused; then UNIQ_KEY before KEYS, in the order the messages were stored.
    keys = ["Orders#U1", "Orders#k1", "Orders#k2", "Orders#U2", "Orders#k1"]
    offsets = [first.commitlog_offset] * 3 + [second.commitlog_offset] * 2
    for n, (key, offset) in enumerate(zip(keys, offsets, strict=True), start=1):
        hashed, phy, diff, previous = entries[n]
        assert (hashed, phy) == (java_key_hash(key), offset)
        assert diff == (second_ts - first_ts) // 1000 * (n > 3)
        # Each entry points at the newest older entry of its slot (0: none).
        older = [m for m in range(1, n) if java_key_hash(keys[m - 1]) % SLOTS == hashed % SLOTS]
        assert previous == (older[-1] if older else 0)
    # A slot holds its newest entry; the count is of slots in use.
    used = {java_key_hash(k) % SLOTS for k in keys}
    assert header["slot_count"] == len(used)
    for slot in used:
        assert slots[slot] == max(n for n, k in enumerate(keys, start=1)
                                  if java_key_hash(k) % SLOTS == slot)


async def _stored_at(config, offset) -> int:
    async with open_store(config) as store:
        message = await store.look_message_by_offset(offset)
        assert message is not None
        return message.store_timestamp


def index_with(engine, segment: bytes, slots: int, entries: int) -> list[bytes]:
    """``segment``'s records indexed by ``engine`` into fresh index buffers (a new one each
    time one fills up, as IndexService rolls files)."""
    handle = engine.handle_for(segment)
    result = engine.scanner(1024).scan(handle, len(segment), 0, 0, 0, 1 << 20)
    files = [bytearray(index_module.file_size(slots, entries))]
    first = 0
    while first < result.count:
        done = engine.index_put(engine.handle_for(files[-1]), slots, entries, handle, result,
                                first)
        first += done
        if first < result.count:
            files.append(bytearray(index_module.file_size(slots, entries)))
    return [bytes(f) for f in files]


@pytest.mark.skipif(_backend.native_module is None, reason="compares the C engine's output")
async def test_the_native_and_python_engines_write_the_same_bytes(make_config):
    """Many keys, non-ASCII ones, repeated and trailing spaces, records without keys, a
    rolled-back transaction, files that fill up: the same records give the same bytes."""
    config = make_config(**SMALL, message_index_enable=False)
    async with open_store(config) as store:
        for i in range(60):
            keys = "  ".join(f"k{i}-{j}é" for j in range(i % 4)) + (" " if i % 5 else "")
            await put(store, "Tx", f"m{i}".encode(), keys=keys,
                      uniq=None if i % 7 == 0 else f"ID{i}😀",
                      sys_flag=rec.TRANSACTION_ROLLBACK if i == 13 else 0)
    [path] = os.listdir(os.path.join(config.store_path_root_dir, "commitlog"))
    segment = read_bytes(os.path.join(config.store_path_root_dir, "commitlog", path))
    assert _backend.native_module is not None
    native = index_with(_backend.NativeEngine(_backend.native_module), segment, SLOTS, ENTRIES)
    python = index_with(_backend.python_engine, segment, SLOTS, ENTRIES)
    assert len(native) >= 3 and native == python
    # And what they wrote is what the reference says: record 0 has no keys, so the first
    # entry is record 1's UNIQ_KEY (a character outside the BMP: two UTF-16 units), then its
    # one KEYS value.
    # A record whose keys do not all fit goes to the next file whole.
    assert ENTRIES - 4 < struct.unpack_from(">qqqqii", native[0], 0)[5] <= ENTRIES
    first, second = (struct.unpack_from(">iqii", native[0], 40 + 4 * SLOTS + 20 * n)[0]
                     for n in (1, 2))
    assert (first, second) == (java_key_hash("Tx#ID1😀"), java_key_hash("Tx#k1-0é"))


async def test_queries_find_messages_by_key_and_by_id_across_full_files(make_config):
    async with open_store(make_config(**SMALL)) as store:
        results = []
        for i in range(40):  # 3 keys each: two files and a bit
            results.append(await put(store, "Orders", f"m{i}".encode(),
                                     keys=f"order-{i % 5} all", uniq=f"U{i}"))
        await store.wait_dispatched()
        assert store.index is not None and len(store.index.files) >= 2
        found = store.query_message("Orders", "order-3", 64, *FOREVER)
        bodies = [rec.decode_record(r).body for r in found.records]
        assert bodies == [f"m{i}".encode() for i in reversed(range(3, 40, 5))]  # newest first
        assert found.index_last_update_phy_offset == results[-1].commitlog_offset
        [record] = store.query_message("Orders", "U17", 64, *FOREVER).records
        assert rec.decode_record(record).body == b"m17"
        assert len(store.query_message("Orders", "all", 10, *FOREVER).records) == 10
        # Another topic, an unknown key, a time range before everything: nothing.
        assert store.query_message("Other", "order-3", 64, *FOREVER).records == []
        assert store.query_message("Orders", "nope", 64, *FOREVER).records == []
        assert store.query_message("Orders", "order-3", 64, 0, 1000).records == []


async def test_a_hash_collision_is_not_a_match(make_config):
    # "Aa" and "BB" have the same Java hash code, so the same slot and key hash.
    assert java_key_hash("T#Aa") == java_key_hash("T#BB")
    async with open_store(make_config(**SMALL)) as store:
        await put(store, "T", b"aa", keys="Aa")
        await put(store, "T", b"bb", keys="BB")
        await store.wait_dispatched()
        [record] = store.query_message("T", "Aa", 64, *FOREVER).records
        assert rec.decode_record(record).body == b"aa"


async def test_files_past_the_checkpoint_are_rebuilt_after_a_crash(make_config, tmp_path):
    """A copy of a running store is what a SIGKILL leaves: the abort file, an index file
    written past the checkpoint's indexMsgTimestamp. It is deleted and rebuilt from the
    commitlog, and the queries answer as before."""
    config = make_config(**SMALL)
    async with open_store(config) as store:
        for i in range(10):
            await put(store, "Orders", f"m{i}".encode(), keys=f"k{i}", uniq=f"U{i}")
        await store.wait_dispatched()
        before = [parse_index(p) for p in index_files(config.store_path_root_dir)]
        names = [os.path.basename(p) for p in index_files(config.store_path_root_dir)]
        crashed = tmp_path / "crashed"
        shutil.copytree(config.store_path_root_dir, crashed,
                        ignore=shutil.ignore_patterns("lock"))
    assert (crashed / "abort") in set(crashed.iterdir())
    copy = make_config(store_path_root_dir=str(crashed), **SMALL)
    async with open_store(copy) as store:
        assert store.recovery is not None and store.recovery.abnormal
        [record] = store.query_message("Orders", "k7", 64, *FOREVER).records
        assert rec.decode_record(record).body == b"m7"
    # The same content, in a new file: the old one was deleted and rebuilt.
    assert [parse_index(p) for p in index_files(crashed)] == before
    assert not {os.path.basename(p) for p in index_files(crashed)} & set(names)


def flip_first_byte_of(path: str, text: bytes, start: int) -> None:
    """Damage the first byte of ``text`` found at or after ``start`` in the file."""
    with open(path, "r+b") as f:
        data = f.read(start + 4096)
        f.seek(data.index(text, start))
        f.write(b"X")


async def test_catch_up_resumes_after_the_last_indexed_record_not_inside_it(make_config):
    """The newest index files lost (deleted here; a crash that deletes files past the
    checkpoint does the same) on a log longer than what recovery dispatches again (its last
    three segments): the next open indexes again from the end of the last record the
    remaining files hold. (It used to scan from that record's start + 1, found no record
    there, and indexed nothing: the keys in the older segments stayed unfindable.)"""
    config = make_config(**SMALL, mapped_file_size_commit_log=64 * 1024)
    body = b"x" * 1000
    async with open_store(config) as store:
        for i in range(400):  # seven segments, a dozen index files
            await put(store, "Orders", body + str(i).encode(), keys=f"k{i}", uniq=f"U{i}")
        await store.wait_dispatched()
        assert len(store.commitlog.segments.segments) >= 6
    files = index_files(config.store_path_root_dir)
    assert len(files) >= 6
    for path in files[1:]:
        os.unlink(path)
    async with open_store(config) as store:
        for i in (0, 40, 100, 200, 399):
            [record] = store.query_message("Orders", f"k{i}", 64, *FOREVER).records
            assert rec.decode_record(record).body == body + str(i).encode()


async def test_an_index_past_a_log_cut_back_by_recovery_is_rebuilt(make_config):
    """After a clean stop, recovery may still cut the log back (here: a damaged record, with
    skipCorruptRecordsOnRecover off, ends the log there). The index must forget the records
    that were cut, and index the ones written after at the same offsets (it used to skip
    them: its cursor stayed past the log's end)."""
    config = make_config(**SMALL, skip_corrupt_records_on_recover=False)
    async with open_store(config) as store:
        results = [await put(store, "Orders", f"body-{i}".encode(), keys=f"k{i}")
                   for i in range(10)]
        await store.wait_dispatched()
    cut = results[6].commitlog_offset
    segment = os.path.join(config.store_path_root_dir, "commitlog", f"{0:020d}")
    flip_first_byte_of(segment, b"body-6", cut)
    async with open_store(config) as store:
        assert store.max_commitlog_offset == cut  # cut back by recovery
        assert store.query_message("Orders", "k8", 64, *FOREVER).records == []
        fresh = [await put(store, "Orders", f"fresh-{i}".encode(), keys=f"f{i}")
                 for i in range(4)]
        assert fresh[0].commitlog_offset == cut
        await store.wait_dispatched()
        for i in range(4):
            [record] = store.query_message("Orders", f"f{i}", 64, *FOREVER).records
            assert rec.decode_record(record).body == f"fresh-{i}".encode()
        [record] = store.query_message("Orders", "k3", 64, *FOREVER).records
        assert rec.decode_record(record).body == b"body-3"


async def test_a_store_without_index_files_gets_them_at_open(make_config):
    config = make_config(**SMALL, message_index_enable=False)
    async with open_store(config) as store:
        await put(store, "Orders", b"old", keys="legacy")
        await store.wait_dispatched()
        assert store.index is None
        assert store.query_message("Orders", "legacy", 64, *FOREVER).records == []
    async with open_store(make_config(**SMALL)) as store:
        assert len(store.query_message("Orders", "legacy", 64, *FOREVER).records) == 1


async def test_index_files_below_the_commitlog_are_deleted(make_config):
    async with open_store(make_config(**SMALL)) as store:
        for i in range(50):
            await put(store, "Orders", f"m{i}".encode(), keys=f"k{i} x", uniq=f"U{i}")
        await store.wait_dispatched()
        index = store.index
        assert index is not None
        first_end = index.files[0].header().end_phy_offset
        count = len(index.files)
        assert index.delete_expired(first_end) == 0  # its last entry is still in the log
        assert index.delete_expired(first_end + 1) == 1
        assert len(index.files) == count - 1
        assert index.delete_expired(2**62) == count - 2  # never the newest


def query_request(topic, key, *, unique=False, max_num=32, begin=0, end=2**62):
    fields = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin,
              "endTimestamp": end}
    if unique:
        fields["_UNIQUE_KEY_QUERY"] = "true"
    return RemotingCommand.request(RequestCode.QUERY_MESSAGE, fields)


async def test_query_message_over_the_wire_on_master_and_slave(nursery, tmp_path):
    addresses = await nursery.start(serve_cluster, ClusterConfig(
        data_dir=tmp_path / "c", master_role="ASYNC_MASTER",
        properties={"maxHashSlotNum": SLOTS, "maxIndexNum": 1000}))
    async with open_remoting_client(addresses.master.broker_addr) as master:
        for i in range(5):
            reply = await master.invoke(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
                "a": "pg", "b": "Keyed", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0,
                "i": f"KEYS\x01order-{i % 2}\x02UNIQ_KEY\x01ID{i}"}, body=f"m{i}".encode()), 5)
            assert reply.code == ResponseCode.SUCCESS
    for broker in (addresses.master, addresses.slave):
        async with open_remoting_client(broker.broker_addr) as client:

            async def found(client=client):
                reply = await client.invoke(query_request("Keyed", "order-0"), 5)
                if reply.code != ResponseCode.SUCCESS:
                    return None
                # all three indexed (the slave may still be copying the last ones)
                return reply if len(_backend.engine.decode_records(reply.body)) == 3 else None

            reply = await wait_until(found, "the query to find order-0", interval=0.05)
            bodies = sorted(m.body for m in _backend.engine.decode_records(reply.body))
            assert bodies == [b"m0", b"m2", b"m4"]
            assert int(reply.ext_fields["indexLastUpdatePhyoffset"]) > 0
            reply = await client.invoke(query_request("Keyed", "ID3", unique=True), 5)
            [message] = _backend.engine.decode_records(reply.body)
            assert message.body == b"m3"
            missing = await client.invoke(query_request("Keyed", "nothing"), 5)
            assert missing.code == ResponseCode.QUERY_NOT_FOUND
            assert missing.remark == "can not find message, maybe time range not correct"
