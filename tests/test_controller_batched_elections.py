"""The controller's own elections commit together (``controller/service.py``, "Elections
commit together"): masters found dead at once are replaced in one commit, each set decided
on its own, and a set whose election cannot be recorded fails alone."""

from __future__ import annotations

from conftest import wait_until
from trio_ha.controller.liveness import BrokerIdentity
from trio_ha.controller.memory import MemoryStateStore
from trio_ha.controller.records import BrokerSetRecord, MemberRecord, key_for
from trio_ha.controller.state_store import Write
from trio_ha.remoting import RemotingClient, open_remoting_client
from trio_ha.testing import open_controller
from trio_ha.wire.remoting import RemotingCommand, RequestCode

CLUSTER = "BatchCluster"


def _record(name: str, master_epoch: int = 1) -> BrokerSetRecord:
    return BrokerSetRecord(
        CLUSTER, name, (MemberRecord(1, "127.0.0.1:1", "127.0.0.1:1;1"),
                        MemberRecord(2, "127.0.0.1:2", "127.0.0.1:2;1")), 3,
        master_id=1, master_epoch=master_epoch, sync_state_set=frozenset({1, 2}),
        sync_state_set_epoch=2)


async def _heartbeat(client: RemotingClient, name: str, broker_id: int) -> None:
    await client.invoke_oneway(RemotingCommand.request(RequestCode.BROKER_HEARTBEAT, {
        "clusterName": CLUSTER, "brokerName": name, "brokerAddr": f"127.0.0.1:{broker_id}",
        "brokerId": broker_id, "heartbeatTimeoutMills": 60_000}, oneway=True))


async def _three_sets_whose_masters_die_together(records: dict[str, BrokerSetRecord]):
    store = MemoryStateStore()
    for name, record in records.items():
        await store.commit([Write(key_for(name), 0, record.encode())])
    return store


async def test_masters_dead_together_are_replaced_in_one_commit():
    names = ["set-a", "set-b", "set-c"]
    store = await _three_sets_whose_masters_die_together({n: _record(n) for n in names})
    async with open_controller(store=store) as ctl, open_remoting_client(ctl.address) as link:
        service = ctl.service
        for name in names:
            for broker_id in (1, 2):
                await _heartbeat(link, name, broker_id)
        await wait_until(lambda: service.statistics().brokers_alive == 6, "every member heard")
        before = service.statistics()
        # the three masters found dead in one scan (as ``scan`` does for expired entries)
        for name in names:
            service.live.forget(BrokerIdentity(CLUSTER, name, 1))
            service.schedule_election(name)
        await wait_until(lambda: service.statistics().elections == before.elections + 3,
                         "three elections")
        after = service.statistics()
        assert after.commits == before.commits + 1
        assert after.controller_elections == before.controller_elections + 3
        for name in names:
            stored = service.state.get(name)
            assert stored is not None
            record = stored.record
            assert (record.master_id, record.master_epoch, record.sync_state_set) == \
                (2, 2, frozenset({2}))


async def test_a_set_that_cannot_be_elected_fails_alone_in_its_batch():
    """A masterEpoch at Java's int limit cannot take another election: that set's rule
    raises, the other set of the same batch is still elected and committed."""
    store = await _three_sets_whose_masters_die_together(
        {"stuck": _record("stuck", master_epoch=2**31 - 1), "fine": _record("fine")})
    async with open_controller(store=store) as ctl, open_remoting_client(ctl.address) as link:
        service = ctl.service
        for name in ("stuck", "fine"):
            for broker_id in (1, 2):
                await _heartbeat(link, name, broker_id)
        await wait_until(lambda: service.statistics().brokers_alive == 4, "every member heard")
        before = service.statistics()
        for name in ("stuck", "fine"):
            service.live.forget(BrokerIdentity(CLUSTER, name, 1))
            service.schedule_election(name)
        await wait_until(lambda: service.statistics().elections == before.elections + 1,
                         "the fine set's election")
        fine, stuck = service.state.get("fine"), service.state.get("stuck")
        assert fine is not None and stuck is not None
        assert (fine.record.master_id, fine.record.master_epoch) == (2, 2)
        assert (stuck.record.master_id, stuck.record.master_epoch) == (1, 2**31 - 1)
        assert service.statistics().commits == before.commits + 1
