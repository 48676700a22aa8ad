"""What a newcomer is shown against a running dev cluster, with the client library.

- ``round_trip``: produce to the SYNC_MASTER, read back from the cluster (``trio-ha
  dev-cluster --demo``).
- ``failover`` (``trio-ha dev-cluster --controller --demo``, what ``bin/run`` shows): a
  broker group in controller mode loses its master to a SIGKILL, the controller elects a
  slave from the in-sync set (the master epoch rises), the new master answers SEND_OK, and
  everything acknowledged before and after the kill is read back. Every wait has a deadline;
  what did not happen in time ends the demo with a ``DemoError`` naming it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

import attrs
import trio

from ._errors import TrioHAError
from .client import MQError, open_admin, open_producer, open_pull_consumer
from .client.producer import SendResult
from .wire.controller import ReplicasInfo
from .wire.errors import WireError
from .wire.record import Message, decode_message_id

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


# ---- the failover demo (controller mode) -------------------------------------------------------

FAILOVER_TOPIC = "FailoverDemo"
_T = TypeVar("_T")


class DemoError(TrioHAError, RuntimeError):
    """Something the demo shows did not happen (in time)."""


class FailoverBroker(Protocol):
    """A broker of the cluster the failover demo can kill and start again."""

    @property
    def addr(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    async def kill(self) -> None: ...

    async def restart(self) -> None: ...


class FailoverCluster(Protocol):
    """All the failover demo needs of a running controller-mode cluster."""

    @property
    def namesrv_addr(self) -> str: ...

    @property
    def controller_addr(self) -> str: ...

    @property
    def broker_names(self) -> list[str]: ...

    def broker_at(self, address: str) -> FailoverBroker | None: ...


@attrs.frozen
class FailoverReport:
    """What the failover demo saw."""

    old_master: str
    old_epoch: int
    new_master: str
    new_epoch: int
    #: seconds from the SIGKILL to the first SEND_OK stored by the new master
    kill_to_send_ok: float
    acknowledged: int
    read_back: int


def describe(name: str, info: ReplicasInfo) -> str:
    """One line of a set as the controller sees it."""
    in_sync = ", ".join(f"{r.broker_id} {r.broker_address}" for r in sorted(
        info.in_sync_replicas, key=lambda r: r.broker_id))
    return (f"{name}: master {info.master_broker_id} at {info.master_address}, "
            f"master epoch {info.master_epoch}, in-sync set [{in_sync}] "
            f"(set epoch {info.sync_state_set_epoch})")


async def _until(seconds: float, what: str, probe: Callable[[], Awaitable[_T | None]],
                 interval: float = 0.1) -> _T:
    """``probe()`` every ``interval`` s until it gives a value; DemoError naming ``what``
    after ``seconds``. Failures of a probe (a node restarting) count as "not yet"."""
    last_error = ""
    with trio.move_on_after(seconds):
        while True:  # bounded by the deadline
            try:
                value = await probe()
            except (MQError, OSError, WireError) as exc:
                last_error = f" (last: {exc})"
                value = None
            if value is not None:
                return value
            await trio.sleep(interval)
    raise DemoError(f"{what} did not happen within {seconds:g} s{last_error}")


def _say(line: str) -> None:
    print(line, flush=True)


def _stored_by(result: SendResult) -> str:
    """The address of the broker that stored a sent message (its offset message id)."""
    try:
        return decode_message_id(result.offset_msg_id)[0]
    except WireError:
        return "?"


async def failover(cluster: FailoverCluster, *, count: int = 50, timeout: float = 60.0,
                   out: Callable[[str], None] = _say) -> FailoverReport:
    """The failover demo on the cluster's first broker group (see the module docstring)."""
    name = cluster.broker_names[0]
    controller = cluster.controller_addr
    async with open_admin(cluster.namesrv_addr) as admin:

        async def set_info() -> ReplicasInfo | None:
            table = (await admin.sync_state_data(controller, [name])).replicas_info_table
            return table.get(name)

        async def all_in_sync() -> ReplicasInfo | None:
            info = await set_info()
            ok = (info is not None and info.master_address and not info.not_in_sync_replicas
                  and len(info.in_sync_replicas) > 1)
            return info if ok else None

        async def topic_created() -> dict[str, str] | None:
            return await admin.create_topic(FAILOVER_TOPIC, 4) or None

        await _until(timeout, f"{name}: {FAILOVER_TOPIC} created on its master", topic_created)
        sent = await _send_and_kill(cluster, set_info, all_in_sync, count, timeout, out)
        old_master = sent.old_master
        victim = sent.victim
        assert victim is not None

        everything = await _until(timeout, "reading every message back",
                                  lambda: _all_bodies(cluster.namesrv_addr, FAILOVER_TOPIC))
        # the topic may hold earlier runs' messages too (the same data directory)
        found = {body for body in everything if body.startswith(sent.run)}
        lost = set(sent.acked) - found
        if lost:
            raise DemoError(f"{len(lost)} of {len(sent.acked)} acknowledged messages were not "
                            f"read back, e.g. {sorted(lost)[0]!r}")
        out(f"read back {len(found)} messages: all {len(sent.acked)} acknowledged sends are "
            "there, nothing acknowledged was lost")

        await victim.restart()

        async def rejoined() -> ReplicasInfo | None:
            info = await all_in_sync()
            ok = info is not None and old_master in {r.broker_address
                                                     for r in info.in_sync_replicas}
            return info if ok else None

        again = await _until(timeout, f"the old master {old_master} rejoining the in-sync set",
                             rejoined)
        out(f"restarted the old master {old_master} (pid {victim.pid}): it copied what it "
            "lacked from the new master and is back in the in-sync set")
        out(describe(name, again))
    return FailoverReport(old_master, sent.old_epoch, sent.new_master, sent.new_epoch,
                          sent.took, len(sent.acked), len(found))


@attrs.define(eq=False)
class _Sent:
    #: this run's messages start with it: a run on a data directory an earlier run used
    #: reads those messages back too
    run: bytes = attrs.field(factory=lambda: b"%x-" % time.time_ns())
    victim: FailoverBroker | None = None
    old_master: str = ""
    old_epoch: int = 0
    acked: list[bytes] = attrs.field(factory=list[bytes])
    new_master: str = ""
    new_epoch: int = 0
    took: float = 0.0


async def _send_and_kill(cluster: FailoverCluster,
                         set_info: Callable[[], Awaitable[ReplicasInfo | None]],
                         all_in_sync: Callable[[], Awaitable[ReplicasInfo | None]],
                         count: int, timeout: float, out: Callable[[str], None]) -> _Sent:
    """Send ``count`` messages, wait until every slave is in the in-sync set, SIGKILL the
    master, wait for the controller's election, send until the new master answers SEND_OK
    (timed from the kill), then ``count - 1`` more."""
    sent = _Sent()
    name = cluster.broker_names[0]
    async with open_producer(cluster.namesrv_addr, "failover-demo", send_msg_timeout=3.0,
                             retry_times_when_send_failed=0) as producer:

        async def send(body: bytes) -> SendResult | None:
            result = await producer.send(Message(FAILOVER_TOPIC, body, keys=body.decode()))
            if result.send_status.name != "SEND_OK":
                return None
            sent.acked.append(body)
            return result

        for i in range(count):
            await _until(timeout, "SEND_OK from the master",
                         lambda i=i: send(b"%sbefore-%d" % (sent.run, i)))
        out(f"sent {count} messages to {FAILOVER_TOPIC}: a SEND_OK means every member of the "
            "in-sync set holds the message")
        # A slave joins the set once it holds what the master confirmed (an empty log's
        # slaves do not join: they have acknowledged nothing yet, hence the sends first).
        before = await _until(timeout, f"{name}: every slave in the master's in-sync set",
                              all_in_sync)
        out(describe(name, before))
        old_master = before.master_address
        assert old_master is not None
        victim = cluster.broker_at(old_master)
        if victim is None:
            raise DemoError(f"the master {old_master} is not one of this cluster's brokers")
        sent.victim, sent.old_master, sent.old_epoch = victim, old_master, before.master_epoch

        out(f"SIGKILL the master {old_master} (pid {victim.pid}) ...")
        killed_at = time.perf_counter()
        await victim.kill()

        async def elected() -> ReplicasInfo | None:
            info = await set_info()
            ok = (info is not None and info.master_epoch > before.master_epoch
                  and info.master_address and info.master_address != old_master)
            return info if ok else None

        after = await _until(timeout, "the controller electing a new master", elected)
        out(f"the controller elected a new master {time.perf_counter() - killed_at:.2f} s after "
            f"the kill: master epoch {before.master_epoch} -> {after.master_epoch}")
        out(describe(name, after))
        new_master = after.master_address
        assert new_master is not None
        sent.new_master, sent.new_epoch = new_master, after.master_epoch
        number = 0

        async def send_to_new() -> SendResult | None:
            nonlocal number
            number += 1
            try:
                result = await send(b"%safter-%d" % (sent.run, number))
            except MQError:
                await trio.sleep(0.05)  # a route that still names the dead master: again
                return None
            return result if result is not None and _stored_by(result) == new_master else None

        first = await _until(timeout, f"SEND_OK from the new master {new_master}", send_to_new,
                             interval=0)
        sent.took = time.perf_counter() - killed_at
        out(f"first SEND_OK from the new master {_stored_by(first)} {sent.took:.2f} s after "
            "the kill")
        for _ in range(count - 1):
            await _until(timeout, "SEND_OK from the new master", send_to_new, interval=0)
        out(f"sent {count - 1} more messages: SEND_OK from the new master")
    return sent


async def _all_bodies(namesrv_addr: str, topic: str) -> set[bytes]:
    """Every message body of ``topic``, pulled from each queue's start to its end."""
    bodies: set[bytes] = set()
    async with open_pull_consumer(namesrv_addr, "failover-demo-reader") as consumer:
        queues: Sequence = await consumer.queues(topic, refresh=True)
        for queue in queues:
            offset = 0
            for _ in range(100_000):  # bounded: each round moves on or stops
                result = await consumer.pull(queue, offset, 32, suspend_timeout=0.2)
                if not result.messages:
                    break
                bodies.update(m.body for m in result.messages)
                offset = result.next_begin_offset
    return bodies
