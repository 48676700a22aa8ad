"""The push consumer (issue 12): a listener per message over a real broker — concurrent and
orderly, failed messages retried through %RETRY% and dead-lettered, offsets committed on
close, queues shared by the members of a group and, in orderly mode, locked."""

from __future__ import annotations

import collections

import pytest
import trio
import trio.testing

from conftest import wait_until
from trio_ha.client import (
    ConsumeLater,
    Message,
    MQError,
    open_admin,
    open_producer,
    open_pull_consumer,
    open_push_consumer,
)
from trio_ha.testing import ClusterConfig, open_cluster

#: short delay levels: a retry (level 3 + times) comes back after a second
LEVELS = "1s 1s 1s 1s 1s 1s 1s 1s"


@pytest.fixture
async def cluster(tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "cluster", slaves=0, master_role="ASYNC_MASTER",
                           properties={"messageDelayLevel": LEVELS})
    async with open_cluster(config) as cluster:
        async with open_admin(cluster.namesrv_addr) as admin:
            await admin.create_topic("Orders", 4)
        yield cluster


async def produce(namesrv: str, count: int, *, prefix: str = "m", keyed: bool = False
                  ) -> list[str]:
    """``count`` messages; with ``keyed`` each of the 4 queues gets its share in order."""
    ids = []
    async with open_producer(namesrv, "pg") as producer:
        queues = await producer.publish_queues("Orders") if keyed else None
        for i in range(count):
            message = Message("Orders", f"{prefix}{i}".encode(), keys=f"{prefix}{i}")
            if queues:
                result = await producer.send(message, queue=queues[i % len(queues)])
            else:
                result = await producer.send(message)
            ids.append(result.msg_id)
    return ids


async def test_every_message_reaches_the_listener_and_offsets_survive_close(cluster):
    namesrv = cluster.namesrv_addr
    sent = await produce(namesrv, 60)
    seen: collections.Counter = collections.Counter()

    async def listener(message):
        await trio.sleep(0.001)
        seen[message.properties["UNIQ_KEY"]] += 1

    with trio.fail_after(30):
        async with open_push_consumer(namesrv, "billing", {"Orders": "*"}, listener,
                                      from_where="first", concurrency=8) as consumer:
            await wait_until(lambda: set(sent) <= set(seen), "every message", timeout=20)
            assert consumer.statistics().consumed == 60
        assert all(n == 1 for n in seen.values())
        # The offsets were committed on close: a new member of the group starts after them.
        more = await produce(namesrv, 5, prefix="late")
        async with open_push_consumer(namesrv, "billing", {"Orders": "*"}, listener,
                                      from_where="first"):
            await wait_until(lambda: set(more) <= set(seen), "the new messages", timeout=20)
        assert all(n == 1 for n in seen.values())


async def test_a_failing_message_is_retried_through_the_broker_then_dead_lettered(cluster):
    namesrv = cluster.namesrv_addr
    [poison, *rest] = await produce(namesrv, 3)
    tries: list[tuple[str, int, str]] = []
    good: set[str] = set()
    canary_tries: list[int] = []

    async def listener(message):
        uniq = message.properties["UNIQ_KEY"]
        if uniq == poison:
            tries.append((message.topic, message.reconsume_times, message.body.decode()))
            raise ConsumeLater
        if message.body == b"canary0":  # fails once: one trip through the retry path
            canary_tries.append(message.reconsume_times)
            if message.reconsume_times == 0:
                raise ConsumeLater
        good.add(uniq)

    with trio.fail_after(40):
        async with open_push_consumer(namesrv, "fussy", {"Orders": "*"}, listener,
                                      from_where="first", max_reconsume_times=2) as consumer:
            await wait_until(lambda: len(tries) >= 3, "three tries of the poison message",
                             timeout=30, interval=0.05)
            assert good == set(rest)
            # Delivered again by the broker each time, under its own topic, counted.
            assert [(t, n) for t, n, _ in tries[:3]] == [("Orders", 0), ("Orders", 1),
                                                         ("Orders", 2)]
            async with open_pull_consumer(namesrv, "dlq-reader") as reader:

                async def dead_letters():
                    [queue] = await reader.queues("%DLQ%fussy", refresh=True)
                    result = await reader.pull(queue, 0, suspend_timeout=0)
                    return result.messages or None

                [dead] = await wait_until(dead_letters, "the dead letter", timeout=20)
            assert dead.properties["UNIQ_KEY"] == poison and dead.reconsume_times == 3
            assert consumer.statistics().sent_back == 3
            # A message failed after the poison died comes back through the same delay and
            # retry queue: once it has, a fourth try of the poison would have come back too.
            await produce(namesrv, 1, prefix="canary")
            await wait_until(lambda: 1 in canary_tries, "the canary's retry", timeout=20,
                             interval=0.05)
            await trio.testing.wait_all_tasks_blocked()  # the listener calls of that pull ran
            assert len(tries) == 3  # dead: never delivered again
            assert consumer.statistics().sent_back == 3 + 1  # the poison's, and the canary's


async def test_two_members_share_the_queues(cluster):
    namesrv = cluster.namesrv_addr
    sent = await produce(namesrv, 40)
    seen: dict[str, set[str]] = collections.defaultdict(set)

    def listener_for(name):
        async def listener(message):
            seen[message.properties["UNIQ_KEY"]].add(name)
        return listener

    with trio.fail_after(30):
        async with open_push_consumer(namesrv, "shared", {"Orders": "*"}, listener_for("a"),
                                      from_where="first") as a, \
                open_push_consumer(namesrv, "shared", {"Orders": "*"}, listener_for("b"),
                                   from_where="first") as b:

            def split() -> bool:
                mine = {q for q in a.statistics().queues if q.topic == "Orders"}
                theirs = {q for q in b.statistics().queues if q.topic == "Orders"}
                return len(mine) == len(theirs) == 2 and not mine & theirs

            await wait_until(split, "the two to split the four queues", timeout=20)
            await wait_until(lambda: set(sent) <= set(seen), "every message", timeout=20)
    readers = {name for names in seen.values() for name in names}
    assert readers == {"a", "b"}


async def test_orderly_members_lock_their_queues_and_keep_queue_order(cluster):
    namesrv = cluster.namesrv_addr
    sent = await produce(namesrv, 40, keyed=True)
    order: dict[int, list[tuple[str, int]]] = collections.defaultdict(list)
    failures = {"m5": 2}  # m5 fails twice, then succeeds: its queue waits for it

    def listener_for(name):
        async def listener(message):
            body = message.body.decode()
            if failures.get(body, 0) > 0:
                failures[body] -= 1
                raise ConsumeLater
            order[message.queue_id].append((name, message.queue_offset))
        return listener

    with trio.fail_after(40):
        async with open_push_consumer(namesrv, "ordered", {"Orders": "*"}, listener_for("a"),
                                      orderly=True, from_where="first",
                                      orderly_retry_delay=0.05) as a, \
                open_push_consumer(namesrv, "ordered", {"Orders": "*"}, listener_for("b"),
                                   orderly=True, from_where="first",
                                   orderly_retry_delay=0.05) as b:
            await wait_until(lambda: sum(map(len, order.values())) >= len(sent),
                             "every message, in order", timeout=30)
            held = [a.statistics().queues, b.statistics().queues]
    assert not held[0] & held[1]  # never the same queue
    for queue_id, seen in order.items():
        offsets = [offset for _, offset in seen]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets), queue_id
    assert failures["m5"] == 0


async def test_a_push_consumer_reads_on_from_the_slave_while_the_master_is_down(tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "ha", master_role="SYNC_MASTER", properties={
        "mappedFileSizeCommitLog": 1048576, "vipChannelEnable": "false",
        "slaveSyncInterval": 300, "haReconnectInterval": 300})
    seen: set[str] = set()

    async def listener(message):
        await trio.sleep(0.01)
        seen.add(message.properties["UNIQ_KEY"])

    async with open_cluster(config) as cluster:
        namesrv = cluster.namesrv_addr
        with trio.fail_after(60):
            async with open_admin(namesrv) as admin:
                await admin.create_topic("Orders", 4)
            sent: list[str] = []

            async def produce_acked():
                async with open_producer(namesrv, "pg") as producer:
                    while len(sent) < 80:
                        result = await producer.send(Message("Orders", b"x"))
                        if result.send_status.name == "SEND_OK":  # the slave has it
                            sent.append(result.msg_id)

            await produce_acked()
            async with open_pull_consumer(namesrv, "probe") as probe:

                async def slave_knows_the_topic():
                    [queue, *_] = await probe.queues("Orders", refresh=True)
                    probe.prefer_broker(queue, 1)
                    try:
                        await probe.pull(queue, 0, 1, suspend_timeout=0)
                    except MQError:
                        return False
                    return True

                await wait_until(slave_knows_the_topic, "the slave to know the topic",
                                 interval=0.1)
            async with open_push_consumer(namesrv, "failover", {"Orders": "*"}, listener,
                                          from_where="first", batch_size=4, concurrency=1):
                await wait_until(lambda: len(seen) >= 20, "some messages", timeout=20)
                await cluster.master.stop()
                await wait_until(lambda: set(sent) <= seen, "the rest, from the slave",
                                 timeout=30)
