"""Several of our controllers over one etcd (issue 39), in process, against a real 3-member
etcd (the ``etcd3`` fixture, started once for this module).

Brokers are played over the raw protocol, as tests/test_controller_verbs.py does: each
"broker" keeps one connection to every controller and heartbeats on all of them (as RocketMQ
brokers do with a DLedger controller group), and sends its requests to whichever leads.
What is checked: exactly one controller leads and the others answer NOT_LEADER naming it;
a set's records are in etcd; when the leader stops another takes over, knows the set, and
fails a dead master over; two controllers that both believe they lead cannot both grant;
with etcd down, changes get an error after a bounded wait while heartbeats and
GET_METADATA_INFO are still answered.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import time
from collections.abc import AsyncIterator

import attrs
import pytest
import trio

from conftest import wait_until
from test_controller_server import (
    bodies_in,
    broker_spec,
    first_send_ok,
    send_some,
    wait_master,
)
from trio_ha.config import ConfigError, parse_properties_text
from trio_ha.controller.config import ControllerServerConfig, StoreType
from trio_ha.controller.etcd import (
    ControllerLeadership,
    EtcdKeys,
    EtcdStateStore,
    open_etcd_leadership,
)
from trio_ha.controller.etcd_client import open_etcd_client
from trio_ha.controller.records import BrokerSetRecord, key_for
from trio_ha.controller.server import LEADER_ONLY_CODES
from trio_ha.controller.service import ControllerService
from trio_ha.remoting import RemotingClient, RemotingError, open_remoting_client
from trio_ha.testing import free_broker_port, open_controller
from trio_ha.testing.processes import NodeProcess
from trio_ha.wire.controller import SyncStateSet
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

CLUSTER, NAME = "C1", "broker-e"
#: short leases: a stopped leader is replaced quickly (etcd's floor is about 1.5 s)
LEASE = 2
_groups = itertools.count()


def fresh_keys() -> EtcdKeys:
    """A controller group of its own in the shared etcd."""
    return EtcdKeys(f"/test/ctl-cluster/{next(_groups)}/")


def controller_config(etcd3, keys: EtcdKeys, index: int) -> ControllerServerConfig:
    return ControllerServerConfig(
        listen_port=0, bind_address="127.0.0.1", store_type=StoreType.ETCD,
        etcd_endpoints=etcd3.endpoints, etcd_keys=keys, etcd_lease_seconds=LEASE,
        self_id=f"n{index}")


@attrs.define(eq=False)
class Running:
    address: str
    service: ControllerService
    scope: trio.CancelScope


async def _run(config: ControllerServerConfig, *,
               task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.CancelScope() as scope:
        async with open_controller(config) as ctl:
            task_status.started(Running(ctl.address, ctl.service, scope))
            await trio.sleep_forever()


@contextlib.asynccontextmanager
async def controllers(etcd3, keys: EtcdKeys, count: int = 3) -> AsyncIterator[list[Running]]:
    """``count`` controllers of one group; each can be stopped alone (``scope.cancel()``)."""
    async with trio.open_nursery() as nursery:
        running = [await nursery.start(_run, controller_config(etcd3, keys, i))
                   for i in range(count)]
        yield running
        nursery.cancel_scope.cancel()


async def call(client: RemotingClient, code: int, fields: dict | None = None,
               body: bytes = b"", timeout: float = 5) -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), timeout)


async def metadata(address: str) -> dict[str, str]:
    async with open_remoting_client(address) as client:
        reply = await call(client, RequestCode.CONTROLLER_GET_METADATA_INFO)
        assert reply.code == ResponseCode.SUCCESS, reply
        return reply.ext_fields


async def leaders(running: list[Running]) -> list[str]:
    return [c.address for c in running
            if (await metadata(c.address)).get("isLeader") == "true"]


async def one_leader(running: list[Running], timeout: float = 20) -> Running:
    async def exactly_one():
        found = await leaders(running)
        return found if len(found) == 1 else None
    found = await wait_until(exactly_one, "exactly one controller leading", timeout=timeout)
    return next(c for c in running if c.address == found[0])


@attrs.define(eq=False)
class Broker:
    """A broker played over the raw protocol: a connection to every controller, on which
    it heartbeats until it is closed."""

    broker_id: int
    address: str
    links: dict[str, RemotingClient]
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    max_offset: int = 0

    async def heartbeats(self) -> None:
        with self.scope:
            for _ in range(600):  # bounded: every test ends long before
                for link in list(self.links.values()):
                    with contextlib.suppress(Exception):  # a stopped controller's link
                        await link.invoke_oneway(RemotingCommand.request(
                            RequestCode.BROKER_HEARTBEAT, {
                                "clusterName": CLUSTER, "brokerName": NAME,
                                "brokerAddr": self.address, "brokerId": self.broker_id,
                                "heartbeatTimeoutMills": 10_000, "epoch": 0,
                                "maxOffset": self.max_offset}, oneway=True))
                await trio.sleep(0.1)


@contextlib.asynccontextmanager
async def broker(nursery: trio.Nursery, broker_id: int, running: list[Running],
                 max_offset: int = 0) -> AsyncIterator[Broker]:
    """A broker connected to every controller; leaving the block closes its connections
    (to a controller, a death: RocketMQ's onBrokerChannelClose)."""
    async with contextlib.AsyncExitStack() as stack:
        links = {c.address: await stack.enter_async_context(open_remoting_client(c.address))
                 for c in running}
        played = Broker(broker_id, f"127.0.0.1:{10_000 + broker_id}", links,
                        max_offset=max_offset)
        nursery.start_soon(played.heartbeats)
        try:
            yield played
        finally:
            played.scope.cancel()


async def join(client: RemotingClient, played: Broker) -> None:
    applied = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
        "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": played.broker_id,
        "registerCheckCode": f"{played.address};1"})
    assert applied.code == ResponseCode.SUCCESS, applied
    registered = await call(client, RequestCode.CONTROLLER_REGISTER_BROKER, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerId": played.broker_id,
        "brokerAddress": played.address})
    assert registered.code == ResponseCode.SUCCESS, registered


async def elect(client: RemotingClient, broker_id: int, *, designate: bool = False,
                timeout: float = 5) -> RemotingCommand:
    return await call(client, RequestCode.CONTROLLER_ELECT_MASTER, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerId": broker_id,
        "designateElect": designate}, timeout=timeout)


async def replica_info(client: RemotingClient) -> tuple[int | None, int, frozenset[int]]:
    reply = await call(client, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": NAME})
    assert reply.code == ResponseCode.SUCCESS, reply
    master = reply.ext_fields.get("masterBrokerId")
    return (None if master is None else int(master), int(reply.ext_fields["masterEpoch"]),
            SyncStateSet.decode(reply.body).members)


async def in_sync(client: RemotingClient, master: int, epoch: int, members: set[int]) -> None:
    grown = await call(client, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
        "brokerName": NAME, "masterBrokerId": master, "masterEpoch": epoch},
        SyncStateSet(frozenset(members), 1).encode())
    assert grown.code == ResponseCode.SUCCESS, grown


async def record_in_etcd(etcd3, keys: EtcdKeys) -> BrokerSetRecord:
    async with open_etcd_client(etcd3.endpoints) as client:
        stored = (await EtcdStateStore(client, keys.state).load())[key_for(NAME)]
    return BrokerSetRecord.decode(stored.value)


async def wait_heard(running: list[Running], played: list[Broker]) -> None:
    """Until every controller counts every broker's heartbeat: a follower counts only
    members of sets it knows, and reads the records every half second."""
    def heard() -> bool:
        now = trio.current_time()
        return all(c.service.live.alive_count(now) == len(played) for c in running)
    await wait_until(heard, "every controller hearing every broker", timeout=10)


# ---- configuration ---------------------------------------------------------------------------


def test_etcd_keys_are_read_and_etcd_without_endpoints_is_refused():
    config = ControllerServerConfig.from_properties({
        "controllerType": "etcd", "controllerEtcdEndpoints": "127.0.0.1:2379;h2:2379",
        "controllerEtcdKeyPrefix": "/mine/", "controllerEtcdLeaseSeconds": "5"})
    assert config.etcd_endpoints == ("http://127.0.0.1:2379", "http://h2:2379")
    assert config.etcd_keys.election == "/mine/leader"
    assert config.etcd_lease_seconds == 5
    assert config.to_properties()["controllerEtcdKeyPrefix"] == "/mine/"
    assert ControllerServerConfig().etcd_keys.prefix == "/trio-ha/controller/"
    with pytest.raises(ConfigError, match="controllerEtcdEndpoints"):
        ControllerServerConfig.from_properties({"controllerType": "etcd"})
    with pytest.raises(ConfigError, match="controllerEtcdKeyPrefix"):
        ControllerServerConfig.from_properties({"controllerEtcdKeyPrefix": "/no-slash"})
    with pytest.raises(ConfigError, match="controllerEtcdLeaseSeconds"):
        ControllerServerConfig.from_properties({"controllerEtcdLeaseSeconds": "0"})


def test_the_example_conf_file_reads():
    with open("conf/controller-etcd.conf", encoding="utf-8") as file:
        properties = parse_properties_text(file.read())
    config = ControllerServerConfig.from_properties(properties)
    assert config.store_type is StoreType.ETCD
    assert len(config.etcd_endpoints) == 3


async def test_a_term_is_served_only_once_its_records_are_read(etcd3):
    """Elected is not yet leading: until ``gained`` (the records read again) returned for
    this term, requests are refused as a follower's. A follower names the leader and keeps
    calling ``follow`` (reading the records)."""
    keys = fresh_keys()
    may_finish = trio.Event()
    gained_calls: list[float] = []
    follow_calls: list[float] = []

    async def gained() -> None:
        gained_calls.append(trio.current_time())
        await may_finish.wait()

    async def b_gained() -> None:
        await trio.lowlevel.checkpoint()
        gained_calls.append(trio.current_time())

    async def follow() -> None:
        await trio.lowlevel.checkpoint()
        follow_calls.append(trio.current_time())

    async def nothing() -> None:
        await trio.lowlevel.checkpoint()

    async with open_etcd_client(etcd3.endpoints) as client, \
            open_etcd_leadership(client, keys.election, "a:1", ttl=LEASE) as candidacy, \
            trio.open_nursery() as nursery:
        leadership = ControllerLeadership(candidacy, "n7")
        await nursery.start(leadership.run, gained, nothing)
        with trio.fail_after(20):
            await candidacy.wait_leading()
        await wait_until(lambda: gained_calls, "gained called", timeout=10)
        assert candidacy.is_leader and not leadership.is_leader
        assert leadership.leader_id is None
        may_finish.set()
        await wait_until(lambda: leadership.is_leader, "leading once gained", timeout=10)
        assert (leadership.leader_address, leadership.leader_id) == ("a:1", "n7")
        assert len(gained_calls) == 1

        async with open_etcd_leadership(client, keys.election, "b:1", ttl=LEASE) as other:
            follower = ControllerLeadership(other, "n8")
            nursery.start_soon(follower.run, b_gained, follow)
            await wait_until(lambda: len(follow_calls) >= 2, "the follower following",
                             timeout=10)
            assert not follower.is_leader
            assert (follower.leader_address, follower.leader_id) == ("a:1", None)
            # the leader steps down and stands again behind b: b leads once it gained its
            # term, and a follows, naming b
            await candidacy.resign()
            assert not leadership.is_leader
            await wait_until(lambda: follower.is_leader, "b leading", timeout=20)
            assert len(gained_calls) == 2
            await wait_until(lambda: leadership.leader_address == "b:1", "a naming b",
                             timeout=10)
            assert not leadership.is_leader
        nursery.cancel_scope.cancel()


# ---- several controllers -----------------------------------------------------------------


async def test_one_leads_the_others_name_it_and_a_new_leader_takes_over(etcd3):
    keys = fresh_keys()
    async with controllers(etcd3, keys) as running, trio.open_nursery() as nursery:
        leader = await one_leader(running)
        followers = [c for c in running if c is not leader]

        async def named() -> bool:
            named = [(await metadata(f.address)).get("controllerLeaderAddress")
                     for f in followers]
            return named == [leader.address] * len(followers)
        await wait_until(named, "the followers naming the leader", timeout=10)
        for follower in followers:
            meta = await metadata(follower.address)
            assert meta["isLeader"] == "false"
            async with open_remoting_client(follower.address) as client:
                for code in sorted(LEADER_ONLY_CODES):
                    reply = await call(client, code, {"brokerName": NAME,
                                                      "clusterName": CLUSTER})
                    assert reply.code == ResponseCode.CONTROLLER_NOT_LEADER, (code, reply)
                    assert leader.address in (reply.remark or "")
        assert (await metadata(leader.address))["controllerLeaderAddress"] == leader.address

        # a set: 1 master, 2 in sync (2 has more data: it is the one elected next)
        async with broker(nursery, 1, running) as one, \
                broker(nursery, 2, running, max_offset=10) as two:
            admin = one.links[leader.address]
            await join(admin, one)
            await join(admin, two)
            # every controller hears both (the followers once they read the set)
            await wait_heard(running, [one, two])
            assert (await elect(admin, 1)).code == ResponseCode.SUCCESS
            await in_sync(admin, 1, 1, {1, 2})
            record = await record_in_etcd(etcd3, keys)
            assert (record.master_id, record.master_epoch, record.sync_state_set) == (
                1, 1, frozenset({1, 2}))
            assert record.member_ids == {1, 2}

            stopped_at = trio.current_time()
            leader.scope.cancel()  # the leader stops (its lease given back)
            new = await one_leader(followers)
            print(f"\nnew leader {new.address} after "
                  f"{trio.current_time() - stopped_at:.2f} s")
            admin = two.links[new.address]
            assert await replica_info(admin) == (1, 1, frozenset({1, 2}))
            nxt = await call(admin, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                             {"clusterName": CLUSTER, "brokerName": NAME})
            assert nxt.ext_fields["nextBrokerId"] == "3"
        nursery.cancel_scope.cancel()


async def test_a_new_leader_fails_a_dead_master_over(etcd3):
    keys = fresh_keys()
    async with controllers(etcd3, keys) as running, trio.open_nursery() as nursery:
        leader = await one_leader(running)
        async with broker(nursery, 2, running, max_offset=10) as two:
            async with broker(nursery, 1, running) as one:
                admin = one.links[leader.address]
                await join(admin, one)
                await join(admin, two)
                await wait_heard(running, [one, two])
                assert (await elect(admin, 1)).code == ResponseCode.SUCCESS
                await in_sync(admin, 1, 1, {1, 2})
                # SIGKILL-like for the leader would wait out its lease; stopping gives the
                # lease back. Either way the next leader reads the set from etcd.
                leader.scope.cancel()
                new = await one_leader([c for c in running if c is not leader])
                assert await replica_info(two.links[new.address]) == (1, 1,
                                                                       frozenset({1, 2}))
            # broker 1's connections closed: dead at once; the new leader elects broker 2

            async def failed_over():
                return (await replica_info(two.links[new.address]))[0] == 2
            await wait_until(failed_over, "broker 2 elected by the new leader", timeout=15)
            assert await replica_info(two.links[new.address]) == (2, 2, frozenset({2}))
            record = await record_in_etcd(etcd3, keys)
            assert (record.master_id, record.master_epoch) == (2, 2)
        nursery.cancel_scope.cancel()


async def test_two_controllers_that_both_believe_they_lead_cannot_both_grant(etcd3):
    """The old leader's candidacy key is deleted behind its back while its lease lives (what
    a leader paused past an election looks like to it): the other controller is elected, and
    the old one still believes it leads. Both are asked to elect a different master for the
    same next epoch: the old leader's commit is fenced in etcd (LeadershipLost, answered
    NOT_LEADER), the new leader's is granted; one master for epoch 2."""
    keys = fresh_keys()
    async with controllers(etcd3, keys, count=2) as running, trio.open_nursery() as nursery:
        old = await one_leader(running)
        new = next(c for c in running if c is not old)
        async with broker(nursery, 1, running) as one, broker(nursery, 2, running) as two, \
                broker(nursery, 3, running) as three:
            admin = one.links[old.address]
            for played in (one, two, three):
                await join(admin, played)
            await wait_heard(running, [one, two, three])
            assert (await elect(admin, 1)).code == ResponseCode.SUCCESS
            await in_sync(admin, 1, 1, {1, 2, 3})

            async with open_etcd_client(etcd3.endpoints) as client:
                found = await client.leader(keys.election.encode())
                assert found is not None and found.value.decode() == old.address
                await client.delete_range(found.key)

            async def both_believe() -> bool:
                return sorted(await leaders(running)) == sorted([old.address, new.address])
            await wait_until(both_believe, "both controllers believing they lead",
                             timeout=15)

            replies: dict[str, RemotingCommand] = {}

            async def designate(controller: Running, broker_id: int) -> None:
                link = one.links[controller.address]
                replies[controller.address] = await elect(link, broker_id, designate=True,
                                                          timeout=15)
            async with trio.open_nursery() as racing:
                racing.start_soon(designate, old, 2)
                racing.start_soon(designate, new, 3)
            assert replies[old.address].code == ResponseCode.CONTROLLER_NOT_LEADER, replies
            assert replies[new.address].code == ResponseCode.SUCCESS, replies
            assert replies[new.address].ext_fields["masterEpoch"] == "2"
            record = await record_in_etcd(etcd3, keys)
            assert (record.master_id, record.master_epoch) == (3, 2)
            # the refused one stepped down: it now follows and names the new leader

            async def follows() -> bool:
                meta = await metadata(old.address)
                return (meta["isLeader"] == "false"
                        and meta.get("controllerLeaderAddress") == new.address)
            await wait_until(follows, "the deposed controller following", timeout=15)
            assert await leaders(running) == [new.address]
        nursery.cancel_scope.cancel()


async def test_etcd_down_changes_get_an_error_and_heartbeats_are_served(etcd3):
    keys = fresh_keys()
    async with controllers(etcd3, keys, count=2) as running, trio.open_nursery() as nursery:
        leader = await one_leader(running)
        async with broker(nursery, 1, running) as one:
            admin = one.links[leader.address]
            await join(admin, one)
            await wait_heard(running, [one])
            for index in range(len(etcd3.members)):
                etcd3.kill(index)
            asked = trio.current_time()
            reply = await call(admin, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 2,
                "registerCheckCode": "127.0.0.1:10002;1"}, timeout=30)
            print(f"\nwith etcd down, a change was answered {reply.code} ({reply.remark}) "
                  f"after {trio.current_time() - asked:.2f} s")
            assert reply.code in (ResponseCode.SYSTEM_ERROR,
                                  ResponseCode.CONTROLLER_NOT_LEADER), reply
            for controller in running:
                async with open_remoting_client(controller.address) as client:
                    beat = await call(client, RequestCode.BROKER_HEARTBEAT, {
                        "clusterName": CLUSTER, "brokerName": NAME,
                        "brokerAddr": one.address, "brokerId": 1,
                        "heartbeatTimeoutMills": 10_000})
                    assert beat.code == ResponseCode.SUCCESS, beat
                    meta = await call(client, RequestCode.CONTROLLER_GET_METADATA_INFO)
                    assert meta.code == ResponseCode.SUCCESS, meta
            # no controller leads without etcd once its lease's time is up
            await wait_until(lambda: _no_leader(running), "leadership lapsing", timeout=15)
        nursery.cancel_scope.cancel()


async def _no_leader(running: list[Running]) -> bool:
    return not await leaders(running)


# ---- processes: a SIGKILLed leader, our brokers ----------------------------------------------


async def _leading(addresses: list[str]) -> str | None:
    found = []
    for address in addresses:
        with contextlib.suppress(OSError, RemotingError, trio.TooSlowError):  # a dead one
            if (await metadata(address)).get("isLeader") == "true":
                found.append(address)
    return found[0] if len(found) == 1 else None


def test_our_brokers_fail_over_across_a_killed_leader_controller(etcd3, tmp_path):
    """Three controllers (child processes) over etcd and two of our brokers whose
    controllerAddr names all three. The leader controller is SIGKILLed (its lease is not
    given back: the next one leads once it expires); the new leader knows the set; then the
    master broker is SIGKILLed and the new leader elects the slave; nothing acknowledged is
    lost."""
    keys = fresh_keys()
    logs = str(tmp_path / "logs")
    os.makedirs(logs)
    nodes: list[NodeProcess] = []
    try:
        controllers: dict[str, NodeProcess] = {}
        for index in range(3):
            node = NodeProcess.start(f"ctl{index}", {"kind": "controller", "log_level": "INFO",
                                                     "properties": {
                "controllerType": "etcd", "controllerEtcdEndpoints": ",".join(etcd3.endpoints),
                "controllerEtcdKeyPrefix": keys.prefix,
                "controllerEtcdLeaseSeconds": str(LEASE), "controllerDLegerSelfId": f"n{index}",
                "bindAddress": "127.0.0.1", "listenPort": str(free_broker_port())}},
                log_dir=logs)
            nodes.append(node)
            controllers[node.addr] = node
        addresses = list(controllers)
        leader = trio.run(functools.partial(wait_until, lambda: _leading(addresses),
                                            "one controller leading", timeout=20))
        namesrv = NodeProcess.start("ns", {"kind": "namesrv", "port": free_broker_port()},
                                    log_dir=logs)
        nodes.append(namesrv)
        ports = [free_broker_port() for _ in range(2)]
        brokers = [f"127.0.0.1:{p}" for p in ports]
        broker_nodes = []
        for i in range(2):
            node = NodeProcess.start(f"b{i}", broker_spec(
                str(tmp_path / f"b{i}"), ports[i], namesrv.addr, ";".join(addresses)),
                log_dir=logs)
            nodes.append(node)
            broker_nodes.append(node)
            if i == 0:
                assert trio.run(wait_master, leader, brokers[0], 1, 30.0) == 1
        acked = trio.run(send_some, namesrv.addr, 10, "before")
        trio.run(wait_master, leader, brokers[0], 2, 30.0)

        killed_at = time.monotonic()
        controllers[leader].kill()  # SIGKILL: its lease lives on until its TTL
        rest = [a for a in addresses if a != leader]
        new = trio.run(functools.partial(wait_until, lambda: _leading(rest),
                                         "a new leader", timeout=20))
        print(f"\nleader {leader} SIGKILLed; {new} leads after "
              f"{time.monotonic() - killed_at:.2f} s (lease {LEASE} s)")
        assert trio.run(wait_master, new, brokers[0], 2, 30.0) == 1  # it knows the set

        broker_nodes[0].kill()  # the master broker dies: its connections close
        assert trio.run(wait_master, new, brokers[1], 1, 30.0) == 2
        acked.append(trio.run(first_send_ok, namesrv.addr, 30.0))
        assert not set(acked) - trio.run(bodies_in, namesrv.addr)
    finally:
        for node in reversed(nodes):
            node.kill()
