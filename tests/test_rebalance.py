"""Consumers of one group share a topic's queues (issue 12, rebalance).

``allocate_averagely`` against RocketMQ's AllocateMessageQueueAveragely's known splits; then
real consumers, each its own client instance, against a real broker: three share eight
queues without overlap, a fourth joins and one leaves while messages keep coming, and every
message is consumed (at-least-once: duplicates are counted and reported, gaps fail).
"""

from __future__ import annotations

import collections

import pytest
import trio

from conftest import wait_until
from trio_ha.client import Message, MessageQueue, open_admin, open_producer, open_pull_consumer
from trio_ha.client.rebalance import allocate_averagely
from trio_ha.testing import ClusterConfig, open_cluster

QUEUES = [MessageQueue("T", "b", i) for i in range(8)]


@pytest.mark.parametrize(("ids", "expected"), [
    # 8 queues over 3: 3, 3, 2 (the first len % n take one more)
    (["c1", "c2", "c3"], {"c1": [0, 1, 2], "c2": [3, 4, 5], "c3": [6, 7]}),
    # over 4: 2 each
    (["c1", "c2", "c3", "c4"], {"c1": [0, 1], "c2": [2, 3], "c3": [4, 5], "c4": [6, 7]}),
    # more consumers than queues: one each, the last ones idle
    ([f"c{i:02}" for i in range(10)], {"c00": [0], "c07": [7], "c08": [], "c09": []}),
])
def test_average_allocation_matches_rocketmq(ids, expected):
    for me, queues in expected.items():
        assert [q.queue_id for q in allocate_averagely(QUEUES, ids, me)] == queues
    # Whatever order the lists come in, every queue has exactly one reader.
    taken = [q for me in ids for q in allocate_averagely(list(reversed(QUEUES)), ids[::-1], me)]
    assert sorted(taken) == sorted(QUEUES)[:len(taken)] and len(set(taken)) == len(taken)


def test_a_client_not_in_the_list_reads_nothing():
    assert allocate_averagely(QUEUES, ["a", "b"], "c") == []


@pytest.fixture
async def cluster(tmp_path):
    config = ClusterConfig(data_dir=tmp_path / "cluster", slaves=0, master_role="ASYNC_MASTER")
    async with open_cluster(config) as cluster:
        yield cluster


class Member:
    """One consumer of the group, reading the topic's stream in its own task."""

    def __init__(self, name: str, seen: collections.Counter, owners: dict) -> None:
        self.name = name
        self.seen = seen
        self.owners = owners
        self.stream = None
        self.scope = trio.CancelScope()
        self.done = trio.Event()

    async def run(self, namesrv: str, topic: str, *, task_status=trio.TASK_STATUS_IGNORED):
        try:
            async with open_pull_consumer(namesrv, "shared") as consumer:
                async with consumer.messages(topic, from_where="first", suspend_timeout=2,
                                             commit_interval=0.2) as stream:
                    self.stream = stream
                    task_status.started()
                    with self.scope:
                        async for message in stream:
                            self.seen[message.properties["UNIQ_KEY"]] += 1
                            self.owners[message.properties["UNIQ_KEY"]].add(self.name)
        finally:
            self.done.set()

    def assigned(self) -> set[MessageQueue]:
        return set(self.stream._assigned or ()) if self.stream else set()


def disjoint_cover(members: list[Member]) -> bool:
    shares = [m.assigned() for m in members]
    union = set().union(*shares)
    return len(union) == 8 and sum(map(len, shares)) == 8


async def test_a_group_shares_its_queues_while_members_join_and_leave(cluster):
    namesrv = cluster.namesrv_addr
    topic = "Shared"
    seen: collections.Counter = collections.Counter()
    owners: dict = collections.defaultdict(set)
    sent: list[str] = []
    with trio.fail_after(60):
        async with open_admin(namesrv) as admin:
            await admin.create_topic(topic, 8)
        async with open_producer(namesrv, "pg") as producer, trio.open_nursery() as nursery:

            async def produce(count: int) -> None:
                for _ in range(count):
                    result = await producer.send(Message(topic, f"m{len(sent)}".encode()))
                    sent.append(result.msg_id)

            async def consumed_all() -> bool:
                return set(sent) <= set(seen)

            await produce(8)  # the route has all eight queues before anyone subscribes
            members = [Member(f"c{i}", seen, owners) for i in range(4)]
            for member in members[:3]:
                await nursery.start(member.run, namesrv, topic)
            await wait_until(lambda: disjoint_cover(members[:3]), "three members to split the "
                             "eight queues", timeout=15, interval=0.05)
            assert sorted(len(m.assigned()) for m in members[:3]) == [2, 3, 3]
            await produce(200)
            await wait_until(consumed_all, "the first 208 messages", timeout=20)

            # A fourth joins mid-stream: two queues each.
            await nursery.start(members[3].run, namesrv, topic)
            await produce(100)
            await wait_until(lambda: disjoint_cover(members), "four members to split the queues",
                             timeout=15, interval=0.05)
            assert sorted(len(m.assigned()) for m in members) == [2, 2, 2, 2]
            await produce(100)

            # The first leaves (its stream commits and it unregisters): the others take over.
            members[0].scope.cancel()
            await members[0].done.wait()
            await produce(100)
            await wait_until(lambda: disjoint_cover(members[1:]), "three members to split "
                             "again", timeout=15, interval=0.05)
            await produce(100)
            await wait_until(consumed_all, "every message", timeout=20)
            nursery.cancel_scope.cancel()

    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    print(f"{len(sent)} messages sent, {len(seen)} consumed, {duplicates} delivered twice or "
          f"more (at-least-once while the group changes)")
    assert set(sent) <= set(seen)  # no gaps
    # Every member read something, and most messages had exactly one reader.
    readers = collections.Counter(name for names in owners.values() for name in names)
    assert set(readers) == {"c0", "c1", "c2", "c3"}
    assert duplicates < len(sent) // 4
