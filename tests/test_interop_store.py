"""Issue 10, point 5: store directories cross over, both ways.

A store the real 4.9.7 broker wrote — after a clean stop and after SIGKILL — opens with
``trio_ha.open_store``, and every message its consumer was served reads back the same (topic,
queue, queue offset, commitlog offset, id, keys, tags, properties, body). A store our broker
wrote — clean and after SIGKILL — starts a real broker, which serves every message to a Java
consumer. A store our recovery repaired (filler records in place of a damaged one) starts a real
broker too, which serves every intact message and skips the filler.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from test_crash import TORN_SEGMENT, segment_file, torn_config, write_torn_store
from test_store_damage import POINT_4_DAMAGE, pick_damaged
from trio_ha import StoreConfig, open_store
from trio_ha.store.recovery import RecoveryReport
from trio_ha.testing import ClusterConfig, ProcessCluster, free_broker_port
from trio_ha.testing.cluster import DEFAULT_SEGMENT_SIZE
from trio_ha.testing.rocketmq import RocketMQ, program_lines
from trio_ha.wire.record import decode_record

pytestmark = pytest.mark.interop

CLIENT = "trioha.interop.Client"

#: what each test writes: topic -> producer arguments
LOAD = {
    "FilesBig": ("--count", 1200, "--size", 1024),          # crosses 1 MiB segments
    "FilesBatch": ("--count", 48, "--mode", "batch", "--batch", 16),
    "FilesTags": ("--count", 30, "--tags", "TagA,TagB,TagC", "--property", "k=v"),
}


def produce_load(peer: RocketMQ, run: Path, namesrv: str) -> list[dict]:
    sent = []
    for topic, args in LOAD.items():
        out = peer.run_program(run / "producer", CLIENT, "produce", "--namesrv", namesrv,
                               "--topic", topic, *args)
        lines = program_lines(out)
        assert lines[-1]["errors"] == 0, out[-2000:]
        sent += [{**line, "topic": topic} for line in lines[:-1]]
    return sent


def consume_all(peer: RocketMQ, run: Path, namesrv: str, group: str, expect: int) -> list[dict]:
    out = peer.run_program(run / group, CLIENT, "pull", "--namesrv", namesrv, "--topic",
                           ",".join(LOAD), "--group", group, "--expect", expect,
                           "--idle-seconds", 4, "--max-seconds", 90)
    return [line for line in program_lines(out) if "msgId" in line]


def served_view(line: dict) -> tuple:
    """What identifies a served message and what it carries."""
    props = {k: v for k, v in line["properties"].items()
             if k not in ("MIN_OFFSET", "MAX_OFFSET", "CONSUME_START_TIME")}
    return (line["topic"], line["queueId"], line["queueOffset"], line["commitLogOffset"],
            line["msgId"], base64.b64decode(line["body"]), line["tags"], line["keys"],
            tuple(sorted(props.items())))


#: index files small enough for a test; both brokers must read them with the same sizes
INDEX_SLOTS, INDEX_ENTRIES = 1000, 4000
INDEX_PROPERTIES = {"maxHashSlotNum": str(INDEX_SLOTS), "maxIndexNum": str(INDEX_ENTRIES)}


def real_broker_properties(namesrv: str, port: int, store: Path, **extra) -> dict:
    return {"brokerClusterName": "DefaultCluster", "brokerName": "broker-a", "brokerId": 0,
            "brokerRole": "ASYNC_MASTER", "namesrvAddr": namesrv, "listenPort": port,
            "storePathRootDir": str(store), "mappedFileSizeCommitLog": DEFAULT_SEGMENT_SIZE,
            **INDEX_PROPERTIES, **extra}


async def read_back(config: StoreConfig) -> tuple[list[tuple], RecoveryReport | None]:
    """Every message of LOAD's topics as ``served_view`` sees it, and the recovery report."""
    found = []
    async with open_store(config) as store:
        for topic in LOAD:
            for queue_id in range(16):
                offset = store.min_queue_offset(topic, queue_id)
                while offset < store.max_queue_offset(topic, queue_id):
                    messages = await store.get_messages(topic, queue_id, offset, 64)
                    assert messages, (topic, queue_id, offset)
                    for m in messages:
                        props = {k: v for k, v in m.properties.items()
                                 if k not in ("MIN_OFFSET", "MAX_OFFSET")}
                        found.append((m.topic, m.queue_id, m.queue_offset, m.commitlog_offset,
                                      m.properties.get("UNIQ_KEY"), m.body,
                                      m.properties.get("TAGS"), m.properties.get("KEYS"),
                                      tuple(sorted(props.items()))))
                    offset = messages[-1].queue_offset + 1
        report = store.statistics().recovery
    return found, report


@pytest.mark.parametrize("stop", ["clean", "sigkill"])
async def test_a_store_the_real_broker_wrote_opens_in_trio_ha(rocketmq, tmp_path, stop):
    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    store_dir = tmp_path / "their_store"
    namesrv = rocketmq.start_namesrv(tmp_path / "ns", namesrv_port)
    try:
        broker = rocketmq.start_broker(tmp_path / "broker", real_broker_properties(
            namesrv_addr, free_broker_port(), store_dir))
        try:
            sent = produce_load(rocketmq, tmp_path, namesrv_addr)
            served = consume_all(rocketmq, tmp_path, namesrv_addr, "gfiles", len(sent))
        finally:
            if stop == "clean":
                broker.stop()
            else:
                broker.kill()
    finally:
        namesrv.kill()
    assert (store_dir / "abort").exists() == (stop == "sigkill")
    assert sorted(line["msgId"] for line in served) == sorted(line["msgId"] for line in sent)

    config = StoreConfig(store_path_root_dir=str(store_dir),
                         mapped_file_size_commit_log=DEFAULT_SEGMENT_SIZE,
                         max_hash_slot_num=INDEX_SLOTS, max_index_num=INDEX_ENTRIES)
    found, report = await read_back(config)
    # Their index files answer our queries by key and by the client's id.
    async with open_store(config) as store:
        for line in sent[::97]:
            by_key = store.query_message(line["topic"], f"key-{line['i']}", 64, 0, 2**62)
            by_id = store.query_message(line["topic"], line["msgId"], 64, 0, 2**62)
            for found_records in (by_key.records, by_id.records):
                assert line["msgId"] in {m.properties["UNIQ_KEY"] for m in
                                         map(decode_record, found_records)}, line
    assert report is not None and report.abnormal == (stop == "sigkill")
    assert sorted(found) == sorted(served_view(line) for line in served)
    assert max(m[3] for m in found) > DEFAULT_SEGMENT_SIZE  # more than one segment
    # Their index files and config directory were left as they were.
    assert os.listdir(store_dir / "index")
    assert (store_dir / "config" / "topics.json").exists()


@pytest.mark.parametrize("stop", ["clean", "sigkill"])
def test_a_store_trio_ha_wrote_starts_a_real_broker(rocketmq, tmp_path, stop):
    config = ClusterConfig(data_dir=str(tmp_path / "ours"), slaves=0,
                           master_role="ASYNC_MASTER", properties=INDEX_PROPERTIES)
    with ProcessCluster.start(config) as cluster:
        sent = produce_load(rocketmq, tmp_path, cluster.namesrv_addr)
        if stop == "sigkill":
            cluster.master.kill()
    store_dir = Path(config.store_dir(0))
    assert (store_dir / "abort").exists() == (stop == "sigkill")

    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    namesrv = rocketmq.start_namesrv(tmp_path / "ns", namesrv_port)
    try:
        broker = rocketmq.start_broker(tmp_path / "broker", real_broker_properties(
            namesrv_addr, free_broker_port(), store_dir))
        try:
            served = consume_all(rocketmq, tmp_path, namesrv_addr, "gours", len(sent))
            # Our index files answer their broker's queries by key.
            line = sent[len(sent) // 2]
            out = rocketmq.mqadmin(tmp_path / "adm", "queryMsgByKey", "-n", namesrv_addr,
                                   "-t", line["topic"], "-k", f"key-{line['i']}")
            assert line["msgId"] in out, out
        finally:
            # The clean variant checks that their broker stops cleanly on our store too.
            if stop == "clean":
                broker.stop()
            else:
                broker.kill()
    finally:
        namesrv.kill()
    by_id = {line["msgId"]: line for line in served}
    assert sorted(by_id) == sorted(line["msgId"] for line in sent)
    for line in sent:
        got = by_id[line["msgId"]]
        assert (got["topic"], got["offsetMsgId"], got["queueId"], got["queueOffset"]) == (
            line["topic"], line["offsetMsgId"], line["queueId"], line["queueOffset"])
        assert base64.b64decode(got["body"]).decode().startswith(f"body-{line['i']}")
    if stop == "clean":
        assert not (store_dir / "abort").exists(), "the real broker stopped cleanly"


async def test_a_store_with_our_recovery_filler_starts_a_real_broker(rocketmq, tmp_path):
    """Point 4 of issue 9 replaces a damaged record with ROLLBACK filler records of topic
    TRIO_HA_RECOVERY_HOLE (and keeps every record after it). A real broker opens the repaired
    store and serves every intact message; the filler is never served."""
    config = torn_config(tmp_path)
    written = await write_torn_store(config, 60)
    damaged = pick_damaged(written, "middle_of_segment")
    victim = written[damaged]
    path, pos = segment_file(config, victim.ack.offset)
    POINT_4_DAMAGE["crc_mismatch"](path, pos, victim)
    async with open_store(config) as store:
        report = store.statistics().recovery
        assert report is not None and len(report.holes) == 1
    store_dir = Path(config.store_path_root_dir)

    namesrv_port = free_broker_port()
    namesrv_addr = f"127.0.0.1:{namesrv_port}"
    namesrv = rocketmq.start_namesrv(tmp_path / "ns", namesrv_port)
    topic = victim.ack.topic
    try:
        broker = rocketmq.start_broker(tmp_path / "broker", real_broker_properties(
            namesrv_addr, free_broker_port(), store_dir,
            mappedFileSizeCommitLog=TORN_SEGMENT,
            mappedFileSizeConsumeQueue=config.mapped_file_size_consume_queue,
            # Our embedded store kept no topics.json; the real broker needs the topic's queues.
            autoCreateTopicEnable="true"))
        try:
            rocketmq.mqadmin(tmp_path / "adm", "updateTopic", "-n", namesrv_addr, "-c",
                             "DefaultCluster", "-t", topic, "-r", 2, "-w", 2)
            out = rocketmq.run_program(tmp_path / "c", CLIENT, "pull", "--namesrv",
                                       namesrv_addr, "--topic", topic, "--group", "gfill",
                                       "--expect", len(written) - 1, "--idle-seconds", 4,
                                       "--max-seconds", 60)
            served = [line for line in program_lines(out) if "msgId" in line]
        finally:
            broker.kill()
    finally:
        namesrv.kill()
    got = sorted(line["commitLogOffset"] for line in served)
    want = sorted(w.ack.offset for i, w in enumerate(written) if i != damaged)
    assert got == want
    assert {line["topic"] for line in served} == {topic}
