"""The round trip ``bin/run`` shows a newcomer: produce to the SYNC_MASTER, read back from the
SLAVE, with the client library, against a running dev cluster."""

from __future__ import annotations

import time
from typing import Protocol

import trio

from .client import open_admin, open_producer, open_pull_consumer
from .wire.record import Message

TOPIC = "DemoTopic"


class Cluster(Protocol):
    """All the demo needs of a running cluster: where its name server listens."""

    @property
    def namesrv_addr(self) -> str: ...


async def round_trip(cluster: Cluster, *, count: int = 100) -> None:
    # On every master of the cluster: with several broker groups, the topic's queues spread
    # over all of them and the producer sends round the lot.
    async with open_admin(cluster.namesrv_addr) as admin:
        masters = await admin.create_topic(TOPIC, 4)
    if len(masters) > 1:
        print(f"{TOPIC} has 4 queues on each of {', '.join(sorted(masters))}", flush=True)
    started = time.perf_counter()
    async with open_producer(cluster.namesrv_addr, "demo-producer") as producer:
        # A SYNC_MASTER acknowledges only what its slave holds: wait for the slave to attach.
        with trio.fail_after(30):
            while True:
                first = await producer.send(Message(TOPIC, b"hello #0", tags="demo", keys="k0"))
                if first.send_status.name == "SEND_OK":
                    break
                await trio.sleep(0.2)
        results = [first]
        for i in range(1, count):
            results.append(await producer.send(
                Message(TOPIC, f"hello #{i}".encode(), tags="demo", keys=f"k{i}")))
    sent = time.perf_counter() - started
    statuses = sorted({r.send_status.name for r in results})
    print(f"produced {count} messages to {TOPIC} in {sent * 1000:.0f} ms: {statuses} "
          "(from a SYNC_MASTER, SEND_OK means its slave has the message too)", flush=True)

    async with open_pull_consumer(cluster.namesrv_addr, "demo-consumer") as consumer:
        received = 0
        for queue in await consumer.queues(TOPIC):
            offset = 0
            while True:
                result = await consumer.pull(queue, offset, 32, suspend_timeout=0.2)
                received += len(result.messages)
                if not result.messages:
                    break
                offset = result.next_begin_offset
        print(f"consumed {received} messages back from the cluster", flush=True)
