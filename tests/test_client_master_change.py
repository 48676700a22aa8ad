"""Issue 38: our client follows a master change at once, not at its next 30 s route poll.

A send that fails on a broker that is no longer the master (a refused connection, a slave's
SERVICE_NOT_AVAILABLE) looks the topic's route up again right away, and the send's own retry
uses the fresh route. Lookups are bounded per topic (``trio_ha.client.route_gate``): one at a
time, shared by every caller that waited for it, spaced 100 ms growing to 1 s while the route
stays the same. The back-off rule alone with times passed in; a burst of failing sends
against a scripted name server; and a real cluster whose master is replaced twice, with the
periodic poll set to an hour. Nothing here asserts a duration: the counts of route lookups,
and that the sends succeeded, say it.
"""

from __future__ import annotations

import collections
import math

import attrs
import pytest
import trio

from conftest import wait_until
from test_broker import send_request
from trio_ha.client import (
    ClientInstance,
    Message,
    MQClientError,
    SendStatus,
    open_admin,
    open_producer,
)
from trio_ha.client.instance import DEFAULT_TOPIC
from trio_ha.client.route_gate import RouteGate
from trio_ha.remoting import open_remoting_client, serve_remoting
from trio_ha.testing import ClusterBroker, ClusterConfig, open_cluster
from trio_ha.testing.cluster import pinned_ports, restartable
from trio_ha.wire.record import decode_message_id
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode
from trio_ha.wire.route import BrokerData, QueueData, TopicRouteData

#: long enough that no periodic poll runs during a test: every lookup is on demand
AN_HOUR = 3600.0


# ---- the back-off alone ------------------------------------------------------------------------


def test_lookups_are_spaced_100_ms_growing_to_1_s_while_the_route_stays_the_same():
    gate = RouteGate(0.1, 1.0)
    assert gate.opens_at() == -math.inf  # the first lookup goes at once
    now, spacings = 10.0, []
    for _ in range(7):
        gate.start(now)
        gate.finish(changed=False)
        spacings.append(round(gate.opens_at() - now, 6))
        now = gate.opens_at()
    assert spacings == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert gate.started_count == 7


def test_a_changed_route_or_a_quiet_spell_starts_the_spacing_again():
    gate = RouteGate(0.1, 1.0)
    for now in (0.0, 0.1, 0.3, 0.7):
        gate.start(now)
        gate.finish(changed=False)
    assert gate.interval == pytest.approx(0.8)
    gate.start(1.5)
    gate.finish(changed=True)  # the new master showed up
    assert gate.opens_at() == pytest.approx(1.6)
    for now in (1.6, 1.7):
        gate.start(now)
        gate.finish(changed=False)
    assert gate.interval == pytest.approx(0.2)
    gate.start(1.7 + 2.0)  # nothing asked for two seconds: a new episode
    assert gate.interval == pytest.approx(0.1)
    gate.finish(changed=False)
    assert gate.opens_at() == pytest.approx(3.8)


# ---- a scripted name server ----------------------------------------------------------------------


@attrs.define(eq=False)
class ScriptedNamesrv:
    """A name server that routes every topic to one broker group, whose master address the
    test sets, and counts the lookups it answers, and how many were in flight at once."""

    master: str = ""
    #: once set, the master every lookup after the next one names
    moves_to: str | None = None
    lookups: int = 0
    in_flight: int = 0
    most_in_flight: int = 0
    address: str = ""

    async def start(self, nursery: trio.Nursery) -> None:
        host, port = await nursery.start(
            lambda task_status: serve_remoting(self.handle, 0, host="127.0.0.1",
                                               task_status=task_status))
        self.address = f"{host}:{port}"

    async def handle(self, request, connection):
        if request.code != RequestCode.GET_ROUTEINFO_BY_TOPIC:
            await trio.lowlevel.checkpoint()
            return RemotingCommand.response_to(request, ResponseCode.SUCCESS)
        self.lookups += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await trio.sleep(0.02)  # long enough for other lookups to overlap, if any were sent
        finally:
            self.in_flight -= 1
        route = TopicRouteData(queue_datas=[QueueData("broker-a", 2, 2)],
                               broker_datas=[BrokerData("c", "broker-a", {0: self.master})])
        if self.moves_to is not None:
            self.master = self.moves_to
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS,
                                           body=route.encode(standard_json=True))


async def answer_sends(request, connection):
    await trio.lowlevel.checkpoint()
    if request.code == RequestCode.SEND_MESSAGE_V2:
        fields = {"msgId": "7F0000010000000100000000000000FF",
                  "queueId": request.ext_fields["e"], "queueOffset": 3}
        return RemotingCommand.response_to(request, ResponseCode.SUCCESS, ext_fields=fields)
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS)


async def dead_address() -> str:
    """An address nothing listens on."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()
    return f"127.0.0.1:{port}"


async def test_a_burst_of_failing_sends_shares_one_lookup_at_a_time(nursery):
    namesrv = ScriptedNamesrv(master=await dead_address())
    await namesrv.start(nursery)
    sends = 20
    failures = []
    with trio.fail_after(20):
        async with open_producer(namesrv.address, "burst-p",
                                 poll_name_server_interval=AN_HOUR) as producer:

            async def send(i: int) -> None:
                with pytest.raises(MQClientError) as caught:
                    await producer.send(Message("Burst", f"m{i}".encode()), timeout=2)
                failures.append(caught.value)

            async with trio.open_nursery() as burst:
                for i in range(sends):
                    burst.start_soon(send, i)
    assert len(failures) == sends  # every send failed: the only master is dead
    assert namesrv.most_in_flight == 1
    # Every send failed three times (60 failures); each failure asked for the route, and
    # the lookups were shared and spaced instead of one per failure.
    assert 1 <= namesrv.lookups < sends


async def test_the_retry_of_a_send_uses_the_route_looked_up_after_its_failure(nursery):
    """The only broker group's master is dead; by the next lookup the name server names a
    live one: the same send() succeeds there, after two lookups (the first route, the
    one after the failure)."""
    host, port = await nursery.start(
        lambda task_status: serve_remoting(answer_sends, 0, host="127.0.0.1",
                                           task_status=task_status))
    live = f"{host}:{port}"
    namesrv = ScriptedNamesrv(master=await dead_address(), moves_to=live)
    await namesrv.start(nursery)
    with trio.fail_after(20):
        async with open_producer(namesrv.address, "moved-p",
                                 poll_name_server_interval=AN_HOUR) as producer:
            result = await producer.send(Message("Moved", b"x"), timeout=5)
    assert result.send_status is SendStatus.SEND_OK
    assert producer.instance.master_addr("broker-a") == live
    assert namesrv.lookups == 2


async def test_a_send_that_times_out_on_a_silent_master_still_looks_the_route_up(nursery):
    """A master that takes requests and never answers (a SIGSTOPped process): the send runs
    out of time, with no time left for its own route lookup, so the lookup runs after it;
    the next send goes to the master the name server names by then."""

    async def silent(request, connection):
        await trio.sleep_forever()

    host, port = await nursery.start(
        lambda task_status: serve_remoting(silent, 0, host="127.0.0.1",
                                           task_status=task_status))
    live_host, live_port = await nursery.start(
        lambda task_status: serve_remoting(answer_sends, 0, host="127.0.0.1",
                                           task_status=task_status))
    namesrv = ScriptedNamesrv(master=f"{host}:{port}", moves_to=f"{live_host}:{live_port}")
    await namesrv.start(nursery)
    with trio.fail_after(20):
        async with open_producer(namesrv.address, "silent-p", retry_times_when_send_failed=0,
                                 poll_name_server_interval=AN_HOUR) as producer:
            with pytest.raises(MQClientError, match="timed out"):
                await producer.send(Message("Silent", b"x"), timeout=0.5)
            assert namesrv.lookups == 1
            live = f"{live_host}:{live_port}"
            await wait_until(lambda: producer.instance.master_addr("broker-a") == live,
                             "the route looked up after the timeout")
            assert namesrv.lookups == 2
            result = await producer.send(Message("Silent", b"y"), timeout=5)
    assert result.send_status is SendStatus.SEND_OK


# ---- a real cluster whose master is replaced -----------------------------------------------------


@attrs.define
class Lookups:
    """Route lookups (GET_ROUTEINFO_BY_TOPIC) by the client instance watched, per topic."""

    watched: ClientInstance | None = None
    counts: collections.Counter = attrs.field(factory=collections.Counter)

    def take(self) -> dict[str, int]:
        """The counts since the last take."""
        counts = dict(self.counts)
        self.counts.clear()
        return counts


@pytest.fixture
def lookups(monkeypatch) -> Lookups:
    seen = Lookups()
    fetch = ClientInstance.fetch_route

    async def counted(self, topic, timeout=None):
        if self is seen.watched:
            seen.counts[topic] += 1
        return await fetch(self, topic, timeout)

    monkeypatch.setattr(ClientInstance, "fetch_route", counted)
    return seen


def broker_addrs(route: TopicRouteData | None) -> dict[int, str] | None:
    if route is None or not route.broker_datas:
        return None
    return route.broker_datas[0].broker_addrs


async def test_a_producer_follows_a_replaced_master_within_one_send(tmp_path,
                                                                     lookups: Lookups):
    """broker-a's master A stops and a new broker B takes id 0 on another port, without the
    topic (it creates it from TBW102); then B stops, its address comes back as a slave
    (answering sends SERVICE_NOT_AVAILABLE) and C is the master, with the topic. Each time the
    producer's next send fails at the old address and its retry lands on the new master,
    after one lookup, while the periodic poll (an hour) never runs."""
    config = ClusterConfig(data_dir=tmp_path / "cluster", slaves=0, master_role="ASYNC_MASTER",
                           properties={"mappedFileSizeCommitLog": 1048576})
    topic = "Moving"
    with trio.fail_after(120):
        async with open_cluster(config) as cluster, \
                open_admin(cluster.namesrv_addr) as admin, \
                trio.open_nursery() as nursery:

            def broker(broker_id: int, store: str) -> ClusterBroker:
                properties = {**config.broker_properties(broker_id, cluster.namesrv_addr),
                              "storePathRootDir": str(tmp_path / store)}
                return ClusterBroker(broker_id, restartable(properties, config.host), nursery)

            async def routed(route_topic: str, addrs: dict[int, str]) -> None:
                async def shows() -> bool:
                    return broker_addrs(await admin.topic_route(route_topic)) == addrs

                await wait_until(shows, f"the route of {route_topic} to be {addrs}",
                                 timeout=30, interval=0.05)

            a = cluster.master.addr
            await admin.create_topic(topic, 4)
            await routed(topic, {0: a})
            async with open_producer(cluster.namesrv_addr, "moving-p",
                                     poll_name_server_interval=AN_HOUR) as producer:
                lookups.watched = producer.instance
                for i in range(5):
                    result = await producer.send(Message(topic, f"on A {i}".encode()))
                    assert result.send_status is SendStatus.SEND_OK
                    assert decode_message_id(result.offset_msg_id)[0] == a
                assert lookups.take() == {topic: 1}

                # ---- A stops; B takes id 0 of broker-a on another port, without the topic
                await cluster.master.stop()
                b_broker = broker(0, "b")
                b = (await b_broker.start()).broker_addr
                assert b != a
                await routed(DEFAULT_TOPIC, {0: b})
                result = await producer.send(Message(topic, b"on B"))
                assert result.send_status is SendStatus.SEND_OK
                assert decode_message_id(result.offset_msg_id)[0] == b
                # one lookup of the topic (gone from the name server) and one of TBW102
                assert lookups.take() == {topic: 1, DEFAULT_TOPIC: 1}

                # ---- B stops; its address comes back as a slave, and C is the master
                await b_broker.stop()
                slave = ClusterBroker(1, {
                    **pinned_ports(b_broker.properties, b_broker.started_addresses),
                    "brokerId": "1", "brokerRole": "SLAVE",
                    "storePathRootDir": str(tmp_path / "b-as-slave")}, nursery)
                c_broker = broker(0, "c")
                assert (await slave.start()).broker_addr == b
                c = (await c_broker.start()).broker_addr
                await admin.create_topic(topic, 4)  # on C, the only master
                await routed(topic, {0: c, 1: b})
                async with open_remoting_client(b) as direct:  # what the producer meets at b
                    refused = await direct.invoke(send_request(topic, b"x"), 5)
                assert refused.code == ResponseCode.SERVICE_NOT_AVAILABLE, refused.remark
                result = await producer.send(Message(topic, b"on C"))
                assert result.send_status is SendStatus.SEND_OK
                assert decode_message_id(result.offset_msg_id)[0] == c
                assert lookups.take() == {topic: 1}
            for node in (slave, c_broker):  # before the name server goes: they unregister
                await node.stop()
