"""Our controller over the wire (issue 39), in process: each verb and each refusal against a
running server, heartbeats as connections, the controller's own elections (a closed
connection, an expired heartbeat), role-change notices reaching a listening "broker", a commit
conflict decided again, a controller that does not lead, and a restart on the same store."""

from __future__ import annotations

import functools

import attrs
import pytest
import trio

from conftest import wait_until
from test_metrics import scrape
from trio_ha.config import ConfigError
from trio_ha.controller.config import ControllerServerConfig
from trio_ha.controller.journal import Journal
from trio_ha.controller.memory import MemoryStateStore
from trio_ha.controller.records import BrokerSetRecord, MemberRecord, key_for
from trio_ha.controller.server import LEADER_ONLY_CODES, serve_controller
from trio_ha.controller.state_store import CommitConflict, StateStore, Write
from trio_ha.remoting import RemotingClient, open_remoting_client, serve_remoting
from trio_ha.testing import open_controller
from trio_ha.wire.controller import (
    BrokerReplicasInfo,
    ElectMasterResponseBody,
    SyncStateSet,
    encode_broker_names,
)
from trio_ha.wire.remoting import RemotingCommand, RequestCode, ResponseCode

CLUSTER, NAME = "C1", "broker-v"
CONFIG = ControllerServerConfig(listen_port=0, bind_address="127.0.0.1")


async def call(client: RemotingClient, code: int, fields: dict | None = None,
               body: bytes = b"") -> RemotingCommand:
    return await client.invoke(RemotingCommand.request(code, fields, body), 5)


async def heartbeat(client: RemotingClient, broker_id: int, address: str, *,
                    timeout_ms: int = 10_000, epoch: int = 0, max_offset: int = 0) -> None:
    await client.invoke_oneway(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerAddr": address,
        "brokerId": broker_id, "heartbeatTimeoutMills": timeout_ms, "epoch": epoch,
        "maxOffset": max_offset}, oneway=True))


async def join(client: RemotingClient, broker_id: int, address: str) -> RemotingCommand:
    """APPLY_BROKER_ID then REGISTER_BROKER, as a broker starting does."""
    applied = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
        "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": broker_id,
        "registerCheckCode": f"{address};1"})
    assert applied.code == ResponseCode.SUCCESS, applied
    return await call(client, RequestCode.CONTROLLER_REGISTER_BROKER, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerId": broker_id,
        "brokerAddress": address})


async def replica_info(client: RemotingClient) -> tuple[int | None, int, frozenset[int]]:
    reply = await call(client, RequestCode.CONTROLLER_GET_REPLICA_INFO, {"brokerName": NAME})
    assert reply.code == ResponseCode.SUCCESS, reply
    master = reply.ext_fields.get("masterBrokerId")
    return (None if master is None else int(master), int(reply.ext_fields["masterEpoch"]),
            SyncStateSet.decode(reply.body).members)


async def elect(client: RemotingClient, broker_id: int) -> RemotingCommand:
    return await call(client, RequestCode.CONTROLLER_ELECT_MASTER, {
        "clusterName": CLUSTER, "brokerName": NAME, "brokerId": broker_id,
        "designateElect": False})


async def start(nursery: trio.Nursery, store: StateStore,
                config: ControllerServerConfig = CONFIG, **kwargs) -> str:
    host, port = await nursery.start(functools.partial(serve_controller, config, store=store,
                                                       **kwargs))
    return f"{host}:{port}"


async def test_every_verb_and_its_refusals():
    store = MemoryStateStore()
    async with trio.open_nursery() as nursery:
        address = await start(nursery, store)
        async with open_remoting_client(address) as client:
            meta = await call(client, RequestCode.CONTROLLER_GET_METADATA_INFO)
            assert meta.code == ResponseCode.SUCCESS
            assert meta.ext_fields["isLeader"] == "true"
            assert meta.ext_fields["controllerLeaderAddress"] == address
            assert meta.ext_fields["peers"] == f"n0:{address};"

            nxt = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                             {"clusterName": CLUSTER, "brokerName": NAME})
            assert (nxt.code, nxt.ext_fields["nextBrokerId"]) == (ResponseCode.SUCCESS, "1")
            # no brokerName: the rules' CONTROLLER_INVALID_REQUEST
            bad = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID, {})
            assert bad.code == ResponseCode.CONTROLLER_INVALID_REQUEST
            # a new set's first id must be 1
            wrong = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 2,
                "registerCheckCode": "h:1;1"})
            assert wrong.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
            # an id that is not a number loses only that request
            junk = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": "x1",
                "registerCheckCode": "h:1;1"})
            assert junk.code == ResponseCode.CONTROLLER_INVALID_REQUEST, junk

            registered = await join(client, 1, "h:1")
            assert registered.code == ResponseCode.SUCCESS, registered
            assert "masterBrokerId" not in registered.ext_fields  # no master yet
            taken = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 1,
                "registerCheckCode": "h:9;1"})
            assert taken.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID
            assert (await join(client, 2, "h:2")).code == ResponseCode.SUCCESS
            unknown = await call(client, RequestCode.CONTROLLER_REGISTER_BROKER, {
                "clusterName": CLUSTER, "brokerName": NAME, "brokerId": 7,
                "brokerAddress": "h:7"})
            assert unknown.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED

            await heartbeat(client, 1, "h:1")
            await heartbeat(client, 2, "h:2")
            elected = await elect(client, 1)
            assert elected.code == ResponseCode.SUCCESS, elected
            assert elected.ext_fields["masterEpoch"] == "1"
            assert ElectMasterResponseBody.decode(elected.body).sync_state_set == {1}
            again = await elect(client, 2)
            assert again.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST
            # the elect header's clusterName is required: missing, it is INVALID_REQUEST
            headless = await call(client, RequestCode.CONTROLLER_ELECT_MASTER,
                                  {"brokerName": NAME, "brokerId": 1, "designateElect": False})
            assert headless.code == ResponseCode.CONTROLLER_INVALID_REQUEST, headless
            assert await replica_info(client) == (1, 1, frozenset({1}))
            absent = await call(client, RequestCode.CONTROLLER_GET_REPLICA_INFO,
                                {"brokerName": "nobody"})
            assert absent.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST

            alter = {"brokerName": NAME, "masterBrokerId": 1, "masterEpoch": 1}
            stale = await call(client, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, alter,
                               SyncStateSet(frozenset({1, 2}), 0).encode())
            assert stale.code == ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH
            hostile = await call(client, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, alter,
                                 b'{"syncStateSet":"nope"')
            assert hostile.code == ResponseCode.CONTROLLER_INVALID_REQUEST, hostile
            grown = await call(client, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, alter,
                               SyncStateSet(frozenset({1, 2}), 1).encode())
            assert grown.code == ResponseCode.SUCCESS, grown
            assert grown.ext_fields["newSyncStateSetEpoch"] == "2"
            assert await replica_info(client) == (1, 1, frozenset({1, 2}))

            data = await call(client, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                              encode_broker_names([NAME, "nobody"]))
            table = BrokerReplicasInfo.decode(data.body).replicas_info_table
            assert list(table) == [NAME]
            assert sorted((r.broker_id, r.alive) for r in table[NAME].in_sync_replicas) == \
                [(1, True), (2, True)]
            garbage = await call(client, RequestCode.CONTROLLER_GET_SYNC_STATE_DATA, None,
                                 b"\xff" * 64)
            assert garbage.code == ResponseCode.CONTROLLER_INVALID_REQUEST

            living = await call(client, RequestCode.CLEAN_BROKER_DATA, {
                "clusterName": CLUSTER, "brokerName": NAME, "brokerControllerIdsToClean": "2"})
            assert living.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
            forced = await call(client, RequestCode.CLEAN_BROKER_DATA, {
                "clusterName": CLUSTER, "brokerName": NAME, "brokerControllerIdsToClean": "2",
                "isCleanLivingBroker": "true"})
            assert forced.code == ResponseCode.SUCCESS, forced
            assert await replica_info(client) == (1, 1, frozenset({1}))

            shown = await call(client, RequestCode.GET_CONTROLLER_CONFIG)
            assert "scanNotActiveBrokerInterval=5000\n" in shown.body.decode()
            changed = await call(client, RequestCode.UPDATE_CONTROLLER_CONFIG, None,
                                 b"scanNotActiveBrokerInterval=1000\n")
            assert changed.code == ResponseCode.SUCCESS, changed
            shown = await call(client, RequestCode.GET_CONTROLLER_CONFIG)
            assert "scanNotActiveBrokerInterval=1000\n" in shown.body.decode()
            black = await call(client, RequestCode.UPDATE_CONTROLLER_CONFIG, None,
                               b"controllerStorePath=/tmp/x\n")
            assert black.code == ResponseCode.NO_PERMISSION
            fixed = await call(client, RequestCode.UPDATE_CONTROLLER_CONFIG, None,
                               b"listenPort=1\n")
            assert fixed.code == ResponseCode.SYSTEM_ERROR
            other = await call(client, RequestCode.GET_BROKER_EPOCH_CACHE)
            assert other.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
            # after every refusal the connection still serves
            assert (await call(client, RequestCode.CONTROLLER_GET_METADATA_INFO)).code == 0
        nursery.cancel_scope.cancel()


@attrs.define(eq=False)
class Follower:
    """A leadership that someone else holds."""

    is_leader: bool = False
    leader_address: str | None = "10.0.0.9:9878"
    leader_id: str | None = "n1"


async def test_a_controller_that_does_not_lead_refuses_with_not_leader():
    async with trio.open_nursery() as nursery:
        address = await start(nursery, MemoryStateStore(), leadership=Follower())
        async with open_remoting_client(address) as client:
            for code in sorted(LEADER_ONLY_CODES):
                reply = await call(client, code, {"brokerName": NAME, "clusterName": CLUSTER})
                assert reply.code == ResponseCode.CONTROLLER_NOT_LEADER, (code, reply)
            meta = await call(client, RequestCode.CONTROLLER_GET_METADATA_INFO)
            assert meta.ext_fields["isLeader"] == "false"
            assert meta.ext_fields["controllerLeaderAddress"] == "10.0.0.9:9878"
            assert (await call(client, RequestCode.GET_CONTROLLER_CONFIG)).code == 0
        nursery.cancel_scope.cancel()


async def notice_listener(nursery: trio.Nursery, received: list[RemotingCommand]) -> str:
    """A stand-in broker port that records the NOTIFY_BROKER_ROLE_CHANGED it is sent."""

    async def handler(request: RemotingCommand, connection) -> None:
        await trio.lowlevel.checkpoint()
        if request.code == RequestCode.NOTIFY_BROKER_ROLE_CHANGED:
            received.append(request)

    host, port = await nursery.start(functools.partial(serve_remoting, handler, 0,
                                                       host="127.0.0.1"))
    return f"{host}:{port}"


async def two_in_sync(client: RemotingClient, master: str, slave: str,
                      slave_connection: RemotingClient, *, master_timeout_ms: int = 10_000
                      ) -> None:
    """Brokers 1 (master, heartbeating on ``client``) and 2 (on ``slave_connection``), both
    in the in-sync set; 2 has the greater offset, so it is the one elected next."""
    await join(client, 1, master)
    await join(client, 2, slave)
    await heartbeat(client, 1, master, timeout_ms=master_timeout_ms)
    await heartbeat(slave_connection, 2, slave, max_offset=10)
    assert (await elect(client, 1)).code == ResponseCode.SUCCESS
    grown = await call(client, RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET, {
        "brokerName": NAME, "masterBrokerId": 1, "masterEpoch": 1},
        SyncStateSet(frozenset({1, 2}), 1).encode())
    assert grown.code == ResponseCode.SUCCESS, grown


async def test_a_closed_connection_elects_the_slave_and_notifies_it():
    received: list[RemotingCommand] = []
    async with trio.open_nursery() as nursery:
        slave = await notice_listener(nursery, received)
        address = await start(nursery, MemoryStateStore())
        async with open_remoting_client(address) as admin, \
                open_remoting_client(address) as slave_link:
            async with open_remoting_client(address) as master_link:
                await two_in_sync(master_link, "127.0.0.1:1", slave, slave_link)
            # the master's connection is closed: it is dead at once, the slave is elected
            await wait_until(lambda: replica_info(admin), "an election", timeout=10)

            async def elected():
                return await replica_info(admin) == (2, 2, frozenset({2}))
            await wait_until(elected, "broker 2 master at epoch 2", timeout=10)
            # (the first election's notice may come first: the slave was heard by then)
            def second() -> RemotingCommand | None:
                return next((n for n in received if n.ext_fields.get("masterEpoch") == "2"),
                            None)
            notice = await wait_until(second, "the role-change notice", timeout=10)
            assert notice.is_oneway
            assert notice.ext_fields["masterBrokerId"] == "2"
            assert notice.ext_fields["masterEpoch"] == "2"
            assert notice.ext_fields["masterAddress"] == slave
            assert SyncStateSet.decode(notice.body) == SyncStateSet(frozenset({2}), 3)
        nursery.cancel_scope.cancel()


async def test_an_expired_heartbeat_elects_the_slave():
    async with trio.open_nursery() as nursery:
        address = await start(nursery, MemoryStateStore())
        async with open_remoting_client(address) as admin, \
                open_remoting_client(address) as master_link, \
                open_remoting_client(address) as slave_link:
            await two_in_sync(master_link, "127.0.0.1:1", "127.0.0.1:2", slave_link,
                              master_timeout_ms=300)

            async def slave_heartbeats() -> None:
                for _ in range(200):  # bounded: the test ends long before
                    await heartbeat(slave_link, 2, "127.0.0.1:2", max_offset=10)
                    await trio.sleep(0.1)
            # the master's connection stays open but it falls silent (a paused process)

            async def elected():
                return (await replica_info(admin))[0] == 2
            # (the heartbeats stop before their connection closes: a nursery inside the block)
            async with trio.open_nursery() as beats:
                beats.start_soon(slave_heartbeats)
                await wait_until(elected, "broker 2 elected after the master's timeout",
                                 timeout=10)
                assert await replica_info(admin) == (2, 2, frozenset({2}))
                beats.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_a_commit_conflict_is_decided_again_on_the_new_state():
    store = MemoryStateStore()
    async with trio.open_nursery() as nursery:
        address = await start(nursery, store)
        async with open_remoting_client(address) as client:
            assert (await join(client, 1, "h:1")).code == ResponseCode.SUCCESS
            # another controller writes the set behind this one's back: id 2 taken
            current = (await store.load())[key_for(NAME)]
            record = BrokerSetRecord.decode(current.value)
            other = attrs.evolve(record, members=(*record.members,
                                                  MemberRecord(2, "h:2", "h:2;1")),
                                 next_broker_id=3)
            await store.commit([Write(key_for(NAME), current.version, other.encode())])
            # this controller's state is stale: its grant of id 2 to another broker conflicts,
            # it reads again and refuses, as it would have from the new state
            taken = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 2,
                "registerCheckCode": "h:3;1"})
            assert taken.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID, taken
            assert store.conflicts == 1
            nxt = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                             {"clusterName": CLUSTER, "brokerName": NAME})
            assert nxt.ext_fields["nextBrokerId"] == "3"
        nursery.cancel_scope.cancel()


async def test_a_restarted_controller_keeps_ids_and_epochs_in_its_journal(tmp_path):
    """The second controller opens the journal the first one wrote (replaying the file, as a
    new process does): it knows the ids and the epoch the first granted."""
    for round_ in range(2):
        async with Journal.open(tmp_path / "ctl") as store, trio.open_nursery() as nursery:
            address = await start(nursery, store)
            async with open_remoting_client(address) as client:
                if round_ == 0:
                    await join(client, 1, "h:1")
                    await heartbeat(client, 1, "h:1")
                    assert (await elect(client, 1)).code == ResponseCode.SUCCESS
                    assert (await join(client, 2, "h:2")).code == ResponseCode.SUCCESS
                else:
                    assert await replica_info(client) == (1, 1, frozenset({1}))
                    nxt = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                     {"clusterName": CLUSTER, "brokerName": NAME})
                    assert nxt.ext_fields["nextBrokerId"] == "3"
                    # the retry of a granted claim is granted again, another one refused
                    again = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                        "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 2,
                        "registerCheckCode": "h:2;1"})
                    assert again.code == ResponseCode.SUCCESS
            nursery.cancel_scope.cancel()


def test_config_reads_rocketmq_keys_and_the_self_peer_port():
    config = ControllerServerConfig.from_properties({
        "controllerDLegerGroup": "group1", "controllerDLegerPeers": "n0-127.0.0.1:9870",
        "controllerDLegerSelfId": "n0", "scanNotActiveBrokerInterval": "2000",
        "enableElectUncleanMaster": "true", "controllerType": "memory",
        "controllerThreadPoolNums": "16"})
    assert (config.listen_port, config.group, config.scan_interval) == (9870, "group1", 2.0)
    assert config.rules_config.enable_elect_unclean_master
    assert ControllerServerConfig.from_properties({}).listen_port == 9878
    with pytest.raises(ConfigError, match="scanNotActiveBrokerInterva"):
        ControllerServerConfig.from_properties({"scanNotActiveBrokerIntervall": "1"})
    with pytest.raises(ConfigError):
        ControllerServerConfig.from_properties({"controllerType": "zookeeper"})


async def test_memory_store_is_all_or_nothing():
    store = MemoryStateStore()
    versions = await store.commit([Write("a", 0, b"1")])
    with pytest.raises(CommitConflict):
        await store.commit([Write("b", 0, b"2"), Write("a", 0, b"3")])
    assert set(await store.load()) == {"a"}
    await store.commit([Write("a", versions["a"], None)])
    assert await store.load() == {}


async def test_statistics_count_what_the_controller_did():
    async with open_controller() as ctl:
        async with open_remoting_client(ctl.address) as client:
            await join(client, 1, "h:1")
            await heartbeat(client, 1, "h:1")
            await wait_until(lambda: ctl.service.statistics().heartbeats == 1, "the heartbeat")
            assert (await elect(client, 1)).code == ResponseCode.SUCCESS
            stats = ctl.service.statistics()
            assert (stats.elections, stats.sets, stats.brokers_alive, stats.commits) == \
                (1, 1, 1, 2)  # apply and elect (register wrote nothing: same address)
            assert stats.controller_elections == 0
        # its connection closed: broker 1 is dead; the controller's own election finds
        # nobody and fences the set (masterEpoch 2, no master)
        await wait_until(lambda: ctl.service.statistics().controller_elections == 1,
                         "the controller's election")
        assert ctl.service.statistics().brokers_alive == 0
        async with open_remoting_client(ctl.address) as client:
            assert await replica_info(client) == (None, 2, frozenset({1}))


async def test_metrics_are_served_from_the_statistics():
    config = attrs.evolve(CONFIG, metrics_port=0)
    store = MemoryStateStore()
    async with trio.open_nursery() as nursery:
        from trio_ha.controller.leadership import SoleLeadership
        from trio_ha.controller.server import ControllerServer
        from trio_ha.controller.service import ControllerService

        server = ControllerServer(ControllerService(config, store, SoleLeadership()))
        host, port = await nursery.start(server.serve)
        async with open_remoting_client(f"{host}:{port}") as client:
            await join(client, 1, "h:1")
            await heartbeat(client, 1, "h:1")
            assert (await elect(client, 1)).code == ResponseCode.SUCCESS
            assert server.metrics_address is not None
            samples = await scrape("{}:{}".format(*server.metrics_address))
            assert samples["trio_ha_controller_elections_total"][0].value == 1
            assert samples["trio_ha_controller_broker_sets"][0].value == 1
            assert samples["trio_ha_controller_brokers_alive"][0].value == 1
            assert samples["trio_ha_controller_is_leader"][0].value == 1
        nursery.cancel_scope.cancel()


async def test_a_controller_that_gains_leadership_reads_what_the_last_leader_wrote():
    store = MemoryStateStore()
    async with open_controller(store=store) as ctl:
        async with open_remoting_client(ctl.address) as client:
            # the previous leader granted id 1 of a set this controller never saw
            record = BrokerSetRecord(CLUSTER, NAME, (), 2)
            record = attrs.evolve(record, members=(MemberRecord(1, "h:1", "h:1;1"),))
            await store.commit([Write(key_for(NAME), 0, record.encode())])
            before = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                                {"clusterName": CLUSTER, "brokerName": NAME})
            assert before.ext_fields["nextBrokerId"] == "1"  # stale: not read since
            await ctl.service.leadership_gained()
            after = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                               {"clusterName": CLUSTER, "brokerName": NAME})
            assert after.ext_fields["nextBrokerId"] == "2"


async def test_a_stopped_service_starts_no_election_when_a_connection_closes():
    """Brokers' connections close as a controller shuts down (the dev cluster stops its
    brokers while the name server and its controller still run, or the other way round): a
    death seen after the service stopped starts nothing, where it raised "Nursery is closed to
    new arrivals" from the connection's close."""
    async with open_controller() as ctl:
        async with open_remoting_client(ctl.address) as client:
            await join(client, 1, "h:1")
            await heartbeat(client, 1, "h:1")
            assert (await elect(client, 1)).code == ResponseCode.SUCCESS
        service = ctl.service
    assert service.leadership.is_leader
    service.schedule_election(NAME)  # what a late close of the master's connection does


@attrs.define(eq=False)
class WritesThenFails:
    """A store whose next commit is written and then fails (an fsync error after the write):
    the controller cannot know whether it happened."""

    inner: MemoryStateStore = attrs.field(factory=MemoryStateStore)
    fail_next: bool = False

    async def load(self):
        return await self.inner.load()

    async def commit(self, writes):
        versions = await self.inner.commit(writes)
        if self.fail_next:
            self.fail_next = False
            raise OSError(5, "Input/output error")
        return versions


async def test_a_commit_that_fails_half_way_is_not_answered_and_the_store_is_read_again():
    store = WritesThenFails()
    async with open_controller(store=store) as ctl:
        async with open_remoting_client(ctl.address) as client:
            store.fail_next = True
            failed = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 1,
                "registerCheckCode": "h:1;1"})
            assert failed.code == ResponseCode.SYSTEM_ERROR, failed
            # the controller reads the store again before it answers from it
            nxt = await call(client, RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                             {"clusterName": CLUSTER, "brokerName": NAME})
            assert nxt.ext_fields["nextBrokerId"] == "2", nxt
            # the claim was written after all: a second broker asking for id 1 is refused,
            # the same broker retrying is granted (nothing is written twice)
            other = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 1,
                "registerCheckCode": "h:2;1"})
            assert other.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID, other
            retry = await call(client, RequestCode.CONTROLLER_APPLY_BROKER_ID, {
                "clusterName": CLUSTER, "brokerName": NAME, "appliedBrokerId": 1,
                "registerCheckCode": "h:1;1"})
            assert retry.code == ResponseCode.SUCCESS, retry
            assert (store.inner.commits, store.inner.conflicts) == (1, 0)


async def test_an_election_that_cannot_be_recorded_fails_alone_and_the_controller_serves_on():
    """A set whose masterEpoch is at Java's int limit cannot take another election: the
    controller's own election for it fails (logged), and the controller keeps serving."""
    store = MemoryStateStore()
    record = BrokerSetRecord(
        CLUSTER, NAME, (MemberRecord(1, "h:1", "h:1;1"), MemberRecord(2, "h:2", "h:2;1")), 3,
        master_id=1, master_epoch=2**31 - 1, sync_state_set=frozenset({1, 2}),
        sync_state_set_epoch=5)
    await store.commit([Write(key_for(NAME), 0, record.encode())])
    async with open_controller(store=store) as ctl:
        async with open_remoting_client(ctl.address) as admin, \
                open_remoting_client(ctl.address) as slave_link:
            await heartbeat(slave_link, 2, "h:2")
            async with open_remoting_client(ctl.address) as master_link:
                await heartbeat(master_link, 1, "h:1")
                await wait_until(lambda: ctl.service.statistics().brokers_alive == 2, "both")
            await wait_until(lambda: ctl.service.statistics().controller_elections >= 1,
                             "the controller's election")
            assert await replica_info(admin) == (1, 2**31 - 1, frozenset({1, 2}))
            meta = await call(admin, RequestCode.CONTROLLER_GET_METADATA_INFO)
            assert meta.code == ResponseCode.SUCCESS
