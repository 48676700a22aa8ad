"""The controller's rules, request by request, with RocketMQ 5.3.3's codes; then invariants
over random request sequences. No network, no clock: time is the harness's ``now``."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from controller_harness import Harness
from trio_ha.controller.liveness import BrokerIdentity
from trio_ha.controller.records import BrokerSetRecord, key_for
from trio_ha.controller.rules import (
    ControllerConfig,
    ControllerState,
    Decision,
    accept_heartbeat,
    alter_sync_state_set,
    apply_broker_id,
    clean_broker_data,
    controller_elect,
    elect_master,
    get_next_broker_id,
    get_replica_info,
    get_sync_state_data,
    on_broker_dead,
    register_broker,
    sets_to_reelect,
)
from trio_ha.controller.state_store import CommitConflict
from trio_ha.wire.controller import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerReplicasInfo,
    CleanBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    SyncStateSet,
)
from trio_ha.wire.remoting import ResponseCode

A = "broker-a"
ADDR = {1: "10.0.0.1:30911", 2: "10.0.0.2:30911", 3: "10.0.0.3:30911"}


def record(h: Harness, name: str = A) -> BrokerSetRecord:
    return h.state.sets[name].record


def three_members(h: Harness) -> None:
    for i in (1, 2, 3):
        assert h.join(A, ADDR[i]) == i


def elect(h: Harness, broker_id: int, designate: bool = False) -> Decision:
    return h.perform(elect_master(h.state, h.live, h.now, h.config, ElectMasterRequestHeader(
        h.cluster, A, broker_id, designate)))


def alter(h: Harness, members: set[int], *, master: int | None = None,
          master_epoch: int | None = None, epoch: int | None = None) -> Decision:
    r = record(h)
    return h.perform(alter_sync_state_set(
        h.state, h.live, h.now,
        AlterSyncStateSetRequestHeader(A, r.master_id if master is None else master,
                                       r.master_epoch if master_epoch is None else master_epoch),
        SyncStateSet(frozenset(members),
                     r.sync_state_set_epoch if epoch is None else epoch)))


def running_set(h: Harness) -> None:
    """Three members, 1 master (first election), all alive, in-sync {1, 2}."""
    three_members(h)
    for i in (1, 2, 3):
        h.beat(A, i)
    assert elect(h, 1).ok
    assert alter(h, {1, 2}).ok


# ---- ids and registration --------------------------------------------------------------------


def test_next_broker_id_is_1_for_a_new_set_then_counts_up() -> None:
    h = Harness()
    first = get_next_broker_id(h.state, GetNextBrokerIdRequestHeader("c1", A))
    assert first.header == GetNextBrokerIdResponseHeader("c1", A, 1) and not first.changes
    h.join(A, ADDR[1])
    assert get_next_broker_id(h.state, GetNextBrokerIdRequestHeader("c1", A)).header == \
        GetNextBrokerIdResponseHeader("c1", A, 2)
    missing = get_next_broker_id(h.state, GetNextBrokerIdRequestHeader("c1", None))
    assert missing.code == ResponseCode.CONTROLLER_INVALID_REQUEST


def test_apply_takes_the_address_from_the_check_code_and_writes_a_new_set_at_version_0() -> None:
    h = Harness()
    decision = apply_broker_id(h.state, ApplyBrokerIdRequestHeader(
        "c1", A, 1, "10.0.0.1:30911;1700000000000"))
    assert decision.ok and len(decision.writes) == 1
    write = decision.writes[0]
    assert write.key == key_for(A) == "sets/broker-a" and write.expected_version == 0
    assert write.value is not None
    stored = BrokerSetRecord.decode(write.value)
    assert stored.address_of(1) == "10.0.0.1:30911" and stored.next_broker_id == 2
    assert stored.member(1) is not None
    assert stored.member(1).register_check_code == "10.0.0.1:30911;1700000000000"  # type: ignore[union-attr]


def test_apply_refuses_a_first_id_other_than_1() -> None:
    h = Harness()
    d = apply_broker_id(h.state, ApplyBrokerIdRequestHeader("c1", A, 2, "x:1;1"))
    assert d.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID and not d.changes


def test_apply_again_with_the_same_check_code_is_accepted_without_a_write() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    again = apply_broker_id(h.state, ApplyBrokerIdRequestHeader("c1", A, 1, f"{ADDR[1]};1000"))
    assert again.ok and not again.changes


def test_a_broker_claiming_another_brokers_id_is_refused_with_2014() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    other = apply_broker_id(h.state, ApplyBrokerIdRequestHeader("c1", A, 1, f"{ADDR[2]};5"))
    assert other.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID and not other.changes


def test_apply_refuses_a_set_of_another_cluster() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    d = apply_broker_id(h.state, ApplyBrokerIdRequestHeader("c2", A, 2, f"{ADDR[2]};5"))
    assert d.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID


def test_next_id_stays_above_an_id_applied_out_of_turn() -> None:
    # RocketMQ adds one to its counter per applied id, so after ids 1 and 5 it offers 3, then
    # 4, then 5, which is taken: a broker told 5 is refused forever. Ours offers 6.
    h = Harness()
    h.join(A, ADDR[1])
    assert h.perform(apply_broker_id(h.state, ApplyBrokerIdRequestHeader(
        "c1", A, 5, f"{ADDR[2]};5"))).ok
    assert record(h).next_broker_id == 6


def test_new_sets_stop_at_the_limit_and_known_sets_still_grow() -> None:
    h = Harness(config=ControllerConfig(max_sets=3))
    for name in ("s1", "s2", "s3"):
        assert h.perform(apply_broker_id(h.state, ApplyBrokerIdRequestHeader(
            "c1", name, 1, f"{name}:1;1"), h.config)).ok
    full = apply_broker_id(h.state, ApplyBrokerIdRequestHeader("c1", "s4", 1, "s4:1;1"),
                           h.config)
    assert full.code == ResponseCode.CONTROLLER_INVALID_REQUEST and not full.changes
    assert h.perform(apply_broker_id(h.state, ApplyBrokerIdRequestHeader(
        "c1", "s1", 2, "s1:2;1"), h.config)).ok
    assert set(h.state.sets) == {"s1", "s2", "s3"}


def test_apply_without_fields_is_an_invalid_request() -> None:
    h = Harness()
    for header in (ApplyBrokerIdRequestHeader(None, A, 1, "a;1"),
                   ApplyBrokerIdRequestHeader("c1", A, None, "a;1"),
                   ApplyBrokerIdRequestHeader("c1", A, 1, None)):
        assert apply_broker_id(h.state, header).code == ResponseCode.CONTROLLER_INVALID_REQUEST


def test_register_refuses_unknown_sets_and_ids_with_2010() -> None:
    h = Harness()
    unknown = register_broker(h.state, h.live, h.now, RegisterBrokerToControllerRequestHeader(
        "c1", A, 1, ADDR[1]))
    assert unknown.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    h.join(A, ADDR[1])
    stranger = register_broker(h.state, h.live, h.now, RegisterBrokerToControllerRequestHeader(
        "c1", A, 7, ADDR[2]))
    assert stranger.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_register_names_the_master_only_while_it_is_alive() -> None:
    h = Harness()
    running_set(h)
    header = RegisterBrokerToControllerRequestHeader("c1", A, 3, ADDR[3])
    alive = register_broker(h.state, h.live, h.now, header)
    assert alive.header == RegisterBrokerToControllerResponseHeader(
        "c1", A, 1, ADDR[1], 1, 2)
    assert alive.body == SyncStateSet(frozenset({1, 2}), 2) and not alive.changes
    h.kill(A, 1)
    dead = register_broker(h.state, h.live, h.now, header)
    assert dead.ok and dead.header == RegisterBrokerToControllerResponseHeader("c1", A)
    assert dead.body == SyncStateSet(frozenset({1, 2}), 2)


def test_register_from_a_new_address_writes_it() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    version = h.state.sets[A].version
    moved = register_broker(h.state, h.live, h.now, RegisterBrokerToControllerRequestHeader(
        "c1", A, 1, "10.9.9.9:1"))
    assert moved.ok and moved.writes[0].expected_version == version
    h.perform(moved)
    assert record(h).address_of(1) == "10.9.9.9:1"
    assert record(h).member(1).register_check_code == f"{ADDR[1]};1000"  # type: ignore[union-attr]


# ---- elections -------------------------------------------------------------------------------


def test_first_election_takes_the_requester_only_once_it_is_heard() -> None:
    h = Harness()
    three_members(h)
    # RocketMQ makes any member that asks first master, heard or not; ours refuses one that
    # never heartbeated (a broker heartbeats before it asks)
    unheard = elect(h, 2)
    assert unheard.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED and not unheard.changes
    assert record(h).master_epoch == 0
    h.beat(A, 2)
    d = elect(h, 2)
    assert d.ok and d.header == ElectMasterResponseHeader(2, ADDR[2], 1, 1)
    assert d.body == ElectMasterResponseBody(frozenset({2}), "c1", A, ADDR)
    r = record(h)
    assert (r.master_id, r.master_epoch, r.sync_state_set_epoch, r.sync_state_set) == \
        (2, 1, 1, frozenset({2}))
    assert [n.address for n in d.notices] == [ADDR[2]]  # the only member heard


def test_register_does_not_move_a_live_members_id_to_another_address() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    h.beat(A, 1)
    taken = register_broker(h.state, h.live, h.now, RegisterBrokerToControllerRequestHeader(
        "c1", A, 1, "10.9.9.9:1"))
    assert taken.code == ResponseCode.CONTROLLER_BROKER_ID_INVALID and not taken.changes
    # the same address is no move: served
    assert register_broker(h.state, h.live, h.now, RegisterBrokerToControllerRequestHeader(
        "c1", A, 1, ADDR[1])).ok
    h.kill(A, 1)  # dead at its old address: the move is served
    assert h.perform(register_broker(h.state, h.live, h.now,
                                     RegisterBrokerToControllerRequestHeader(
                                         "c1", A, 1, "10.9.9.9:1"))).ok
    assert record(h).address_of(1) == "10.9.9.9:1"


def test_a_heartbeat_for_a_members_id_from_another_address_is_dropped() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    assert accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, 1, ADDR[1]),
                            channel="own").ok
    forged = accept_heartbeat(h.state, h.live, h.now + 5,
                              h.heartbeat_header(A, 1, "10.9.9.9:1"), channel="other")
    assert forged.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    info = h.live.get(BrokerIdentity("c1", A, 1))
    assert info is not None and (info.channel, info.last_heartbeat) == ("own", h.now)


def test_elect_for_an_unknown_set_is_2010() -> None:
    h = Harness()
    d = elect_master(h.state, h.live, h.now, h.config, ElectMasterRequestHeader("c1", A, 1))
    assert d.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED


def test_an_alive_master_stays_with_2011_and_its_header_and_set() -> None:
    h = Harness()
    running_set(h)
    before = h.state
    d = elect(h, 2)
    assert d.code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST and not d.changes
    assert d.header == ElectMasterResponseHeader(1, ADDR[1], 1, 2)
    assert d.body == ElectMasterResponseBody(frozenset({1, 2}))  # no member group on 2011
    assert h.state == before


def test_broker_triggered_election_after_the_master_died() -> None:
    h = Harness()
    running_set(h)
    h.beat(A, 2, epoch=1, max_offset=500)
    h.kill(A, 1)
    d = elect(h, 3)  # a broker outside the in-sync set asks: the in-sync member wins
    assert d.ok and d.header == ElectMasterResponseHeader(2, ADDR[2], 2, 3)
    assert d.body == ElectMasterResponseBody(frozenset({2}), "c1", A, ADDR)
    assert record(h).sync_state_set == {2}
    # every alive member hears of it, at its address, with the new set
    assert sorted(n.address for n in d.notices) == [ADDR[2], ADDR[3]]
    for notice in d.notices:
        assert (notice.header.master_address, notice.header.master_epoch,
                notice.header.sync_state_set_epoch, notice.header.master_broker_id) == \
            (ADDR[2], 2, 3, 2)
        assert notice.body == SyncStateSet(frozenset({2}), 3)


def test_no_notices_when_role_change_notification_is_off() -> None:
    h = Harness(config=ControllerConfig(notify_broker_role_changed=False))
    running_set(h)
    h.kill(A, 1)
    d = elect(h, 2)
    assert d.ok and d.notices == ()


def test_nobody_eligible_for_a_broker_is_2012_and_changes_nothing() -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 1)
    h.kill(A, 2)
    d = elect(h, 3)  # 3 is alive but not in sync; unclean elections are off
    assert d.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED and not d.changes


def test_unclean_election_takes_an_out_of_sync_member_when_enabled() -> None:
    h = Harness(config=ControllerConfig(enable_elect_unclean_master=True))
    running_set(h)
    h.kill(A, 1)
    h.kill(A, 2)
    d = elect(h, 3)
    assert d.ok and record(h).master_id == 3 and "unclean" in (d.remark or "")


def test_controller_election_with_nobody_eligible_fences_the_master_and_keeps_the_set() -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 1)
    h.kill(A, 2)
    d = h.perform(controller_elect(h.state, h.live, h.now, h.config, A))
    assert d.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE
    r = record(h)
    assert (r.master_id, r.master_epoch, r.sync_state_set, r.sync_state_set_epoch) == \
        (None, 2, frozenset({1, 2}), 2)
    # again with no master left: no epoch bump for nothing
    again = controller_elect(h.state, h.live, h.now, h.config, A)
    assert again.code == ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE and not again.changes
    # an in-sync member comes back and asks: it is elected at the next epoch
    h.beat(A, 2)
    back = elect(h, 2)
    assert back.ok and record(h).master_id == 2 and record(h).master_epoch == 3


def test_admin_designates_an_in_sync_member_even_with_a_live_master() -> None:
    h = Harness()
    running_set(h)
    d = elect(h, 2, designate=True)
    assert d.ok and record(h).master_id == 2


@pytest.mark.parametrize("target", [3, 9])  # alive but not in sync; not a member
def test_admin_designating_a_broker_outside_the_pool_fails(target: int) -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 1)
    d = elect(h, target, designate=True)
    assert d.code == ResponseCode.CONTROLLER_ELECT_MASTER_FAILED and not d.changes


def test_admin_designating_the_live_master_gets_2011() -> None:
    h = Harness()
    running_set(h)
    assert elect(h, 1, designate=True).code == ResponseCode.CONTROLLER_MASTER_STILL_EXIST


def test_a_dead_master_triggers_an_election_and_a_dead_slave_does_not() -> None:
    h = Harness()
    running_set(h)
    h.beat(A, 2, epoch=1, max_offset=10)
    (slave,) = h.kill(A, 3)
    assert on_broker_dead(h.state, h.live, h.now, h.config, slave) is None
    (master,) = h.kill(A, 1)
    assert master == BrokerIdentity("c1", A, 1)
    d = on_broker_dead(h.state, h.live, h.now, h.config, master)
    assert d is not None and d.ok
    h.perform(d)
    assert record(h).master_id == 2


def test_expired_heartbeats_kill_a_hung_master() -> None:
    h = Harness()
    running_set(h)
    h.now += 5
    h.beat(A, 2)
    h.beat(A, 3)
    h.now += 6  # 1's last heartbeat is 11 s old, its timeout 10 s
    assert h.live.expired(h.now) == [BrokerIdentity("c1", A, 1)]
    assert sets_to_reelect(h.state, h.live, h.now) == [A]
    h.perform(controller_elect(h.state, h.live, h.now, h.config, A))
    assert record(h).master_id == 2 and sets_to_reelect(h.state, h.live, h.now) == []


def test_no_reelection_scan_while_every_member_is_dead() -> None:
    h = Harness()
    running_set(h)
    for i in (1, 2, 3):
        h.kill(A, i)
    assert sets_to_reelect(h.state, h.live, h.now) == []


# ---- the in-sync set -------------------------------------------------------------------------


def test_alter_grows_the_set_and_bumps_its_epoch() -> None:
    h = Harness()
    running_set(h)
    d = alter(h, {1, 2, 3})
    assert d.ok and d.header == AlterSyncStateSetResponseHeader(3)
    assert d.body == SyncStateSet(frozenset({1, 2, 3}), 3)
    assert record(h).sync_state_set == {1, 2, 3}


def test_alter_refusals_have_rocketmqs_codes() -> None:
    h = Harness()
    unknown = alter_sync_state_set(h.state, h.live, h.now, AlterSyncStateSetRequestHeader(
        A, 1, 1), SyncStateSet(frozenset({1}), 0))
    assert unknown.code == ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    running_set(h)
    h.join(A, "10.0.0.4:1")  # member 4 never heartbeats
    before = h.state
    cases = [
        (dict(members={1, 2}), ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
        (dict(members={1, 2, 3}, master=2), ResponseCode.CONTROLLER_INVALID_MASTER),
        (dict(members={1, 2, 3}, master_epoch=0), ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH),
        (dict(members={1, 2, 3}, epoch=1), ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH),
        (dict(members={1, 2, 9}), ResponseCode.CONTROLLER_INVALID_REPLICAS),
        (dict(members={1, 2, 4}), ResponseCode.CONTROLLER_BROKER_NOT_ALIVE),
        (dict(members={2, 3}), ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED),
    ]
    for kwargs, code in cases:
        d = alter(h, **kwargs)
        assert (d.code, d.changes) == (code, ()), kwargs
    assert h.state == before


def test_alter_by_a_set_without_master_is_invalid_master() -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 1)
    h.kill(A, 2)
    h.perform(controller_elect(h.state, h.live, h.now, h.config, A))
    d = alter(h, {1, 3}, master=1)
    assert d.code == ResponseCode.CONTROLLER_INVALID_MASTER


def test_alter_without_a_body_is_an_invalid_request() -> None:
    h = Harness()
    running_set(h)
    d = alter_sync_state_set(h.state, h.live, h.now, AlterSyncStateSetRequestHeader(A, 1, 1),
                             None)
    assert d.code == ResponseCode.CONTROLLER_INVALID_REQUEST


# ---- reading ---------------------------------------------------------------------------------


def test_replica_info_and_its_unknown_set() -> None:
    h = Harness()
    unknown = get_replica_info(h.state, GetReplicaInfoRequestHeader(A))
    assert unknown.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST
    running_set(h)
    d = get_replica_info(h.state, GetReplicaInfoRequestHeader(A))
    assert d.header == GetReplicaInfoResponseHeader(1, ADDR[1], 1)
    assert d.body == SyncStateSet(frozenset({1, 2}), 2)


def test_sync_state_data_lists_members_with_liveness_split_by_in_sync() -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 3)
    d = get_sync_state_data(h.state, h.live, h.now, [A, "broker-unknown"])
    assert isinstance(d.body, BrokerReplicasInfo)
    info = d.body.replicas_info_table
    assert list(info) == [A]
    a = info[A]
    assert (a.master_broker_id, a.master_address, a.master_epoch, a.sync_state_set_epoch) == \
        (1, ADDR[1], 1, 2)
    assert [(r.broker_id, r.broker_address, r.alive) for r in a.in_sync_replicas] == \
        [(1, ADDR[1], True), (2, ADDR[2], True)]
    assert [(r.broker_id, r.alive) for r in a.not_in_sync_replicas] == [(3, False)]
    encoded = d.body.encode()
    assert encoded.startswith(b'{"replicasInfoTable":{"broker-a":{"inSyncReplicas":[{"alive":true,')
    assert BrokerReplicasInfo.decode(encoded) == d.body


# ---- cleaning --------------------------------------------------------------------------------


def clean(h: Harness, ids: str | None, living: bool = False, name: str = A) -> Decision:
    return h.perform(clean_broker_data(h.state, h.live, h.now, CleanBrokerDataRequestHeader(
        name, "c1", ids, living)))


def test_clean_refuses_living_brokers_unless_forced() -> None:
    h = Harness()
    running_set(h)
    for ids in (None, "3", "2;3"):
        d = clean(h, ids)
        assert d.code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA and not d.changes
    forced = clean(h, "3", living=True)
    assert forced.ok and record(h).member_ids == {1, 2}


def test_clean_refuses_bad_ids_and_unknown_sets() -> None:
    h = Harness()
    assert clean(h, None).code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    h.join(A, ADDR[1])
    assert clean(h, "1;x").code == ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA


def test_clean_of_dead_members_fences_a_lost_master_and_bumps_the_set_epoch() -> None:
    h = Harness()
    running_set(h)
    h.kill(A, 1)
    d = clean(h, "1")
    assert d.ok
    r = record(h)
    assert (r.member_ids, r.master_id, r.master_epoch, r.sync_state_set,
            r.sync_state_set_epoch) == ({2, 3}, None, 2, {2}, 3)
    assert r.next_broker_id == 4  # ids are not handed out again


def test_clean_of_the_whole_set_deletes_its_record() -> None:
    h = Harness()
    running_set(h)
    for i in (1, 2, 3):
        h.kill(A, i)
    version = h.state.sets[A].version
    d = clean(h, None)
    assert d.ok and d.writes[0].value is None and d.writes[0].expected_version == version
    assert A not in h.state.sets and key_for(A) not in h.records.items


def test_clean_of_the_last_members_deletes_the_record() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    assert clean(h, "1;7").ok and A not in h.state.sets


# ---- heartbeats ------------------------------------------------------------------------------


def test_heartbeats_count_only_from_registered_members() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    ok = accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, 1, ADDR[1], epoch=0))
    assert ok.ok and h.live.is_alive(BrokerIdentity("c1", A, 1), h.now)
    no_id = accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, None, ADDR[1]))
    assert no_id.code == ResponseCode.CONTROLLER_INVALID_REQUEST
    stranger = accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, 2, ADDR[2]))
    assert stranger.code == ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED
    assert len(h.live) == 1


def test_a_flood_of_heartbeats_from_10000_unknown_brokers_does_not_grow_the_table() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    for i in range(10_000):
        accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(
            f"flood-{i}", i % 7 + 1, f"10.1.{i // 256}.{i % 256}:1"))
        accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, 1000 + i, "x:1"))
    assert len(h.live) == 0
    assert accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(A, 1, ADDR[1])).ok
    assert len(h.live) == 1


# ---- stale reads -----------------------------------------------------------------------------


def test_a_decision_from_a_stale_read_loses_to_the_one_committed_first() -> None:
    h = Harness()
    running_set(h)
    stale = h.state
    # Two controllers (or two requests) decide from the same read: an admin moves the master
    # to 2 ...
    first = elect_master(stale, h.live, h.now, h.config,
                         ElectMasterRequestHeader("c1", A, 2, True))
    # ... while the old master grows its in-sync set
    second = alter_sync_state_set(stale, h.live, h.now, AlterSyncStateSetRequestHeader(A, 1, 1),
                                  SyncStateSet(frozenset({1, 2, 3}), 2))
    assert first.ok and second.ok
    assert first.writes[0].expected_version == second.writes[0].expected_version
    h.perform(first)
    with pytest.raises(CommitConflict):
        h.records.commit(second.writes)
    assert record(h).master_id == 2 and record(h).sync_state_set == {2}
    # decided again from a fresh read, the old master's proposal is fenced
    again = alter_sync_state_set(h.state, h.live, h.now, AlterSyncStateSetRequestHeader(A, 1, 1),
                                 SyncStateSet(frozenset({1, 2, 3}), 2))
    assert again.code == ResponseCode.CONTROLLER_INVALID_MASTER


def test_state_from_store_skips_other_keys_and_refuses_misplaced_records() -> None:
    h = Harness()
    h.join(A, ADDR[1])
    items = dict(h.records.items)
    from trio_ha.controller.state_store import Versioned

    items["controller/meta"] = Versioned(1, b"anything")
    assert ControllerState.from_store(items) == h.state
    items[key_for("broker-b")] = items[key_for(A)]
    from trio_ha.controller.records import RecordError

    with pytest.raises(RecordError):
        ControllerState.from_store(items)


# ---- invariants over random request sequences -------------------------------------------------

NAMES = ("broker-a", "broker-b")

_beat = st.tuples(st.just("beat"), st.sampled_from(NAMES), st.integers(1, 4),
                  st.integers(0, 5), st.integers(0, 2**40))
_elect = st.tuples(st.just("elect"), st.sampled_from(NAMES), st.integers(-1, 4), st.booleans())
_alter = st.tuples(st.just("alter"), st.sampled_from(NAMES), st.frozensets(st.integers(1, 3)),
                   st.sampled_from([0] * 8 + [-1, 1]), st.sampled_from([0] * 8 + [-1, 1]),
                   st.sampled_from([True] * 4 + [False]))
# weighted by repetition: mostly the steady state (heartbeats, elections, set changes, deaths),
# sometimes new members, time passing, scans and cleaning
_op = st.one_of(
    _beat, _beat, _beat, _elect, _elect, _alter, _alter, _alter,
    st.tuples(st.just("kill"), st.sampled_from(NAMES), st.integers(1, 4)),
    st.tuples(st.just("kill"), st.sampled_from(NAMES), st.integers(1, 4)),
    st.tuples(st.just("join"), st.sampled_from(NAMES), st.integers(1, 4)),
    st.tuples(st.just("clean"), st.sampled_from(NAMES), st.frozensets(st.integers(1, 4)),
              st.booleans()),
    st.tuples(st.just("tick"), st.integers(0, 15)),
    st.tuples(st.just("scan")),
)


def _step(h: Harness, op: tuple[object, ...]) -> Decision | None:
    kind = op[0]
    if kind == "join":
        _, name, host = op
        assert isinstance(name, str) and isinstance(host, int)
        n = get_next_broker_id(h.state, GetNextBrokerIdRequestHeader("c1", name)).header
        assert isinstance(n, GetNextBrokerIdResponseHeader) and n.next_broker_id is not None
        return apply_broker_id(h.state, ApplyBrokerIdRequestHeader(
            "c1", name, n.next_broker_id, f"10.0.{host}.{n.next_broker_id}:1;0"))
    if kind == "beat":
        _, name, broker_id, epoch, offset = op
        assert isinstance(name, str) and isinstance(broker_id, int)
        stored = h.state.get(name)
        address = None if stored is None else stored.record.address_of(broker_id)
        accept_heartbeat(h.state, h.live, h.now, h.heartbeat_header(
            name, broker_id, address or "x:1", epoch=epoch, max_offset=offset))  # type: ignore[arg-type]
        return None
    if kind == "kill":
        _, name, broker_id = op
        assert isinstance(name, str) and isinstance(broker_id, int)
        identity = BrokerIdentity("c1", name, broker_id)
        info = h.live.get(identity)
        if info is None:
            return None
        for dead in h.live.channel_closed(info.channel):
            d = on_broker_dead(h.state, h.live, h.now, h.config, dead)
            if d is not None:
                return d
        return None
    if kind == "elect":
        _, name, broker_id, designate = op
        return elect_master(h.state, h.live, h.now, h.config, ElectMasterRequestHeader(
            "c1", name, broker_id, designate))  # type: ignore[arg-type]
    if kind == "alter":
        _, name, members, master_delta, epoch_delta, with_master = op
        assert isinstance(name, str) and isinstance(master_delta, int)
        assert isinstance(epoch_delta, int) and isinstance(members, frozenset)
        stored = h.state.get(name)
        if stored is None:
            return None
        r = stored.record
        if with_master and r.master_id is not None:  # a real master's proposals include it
            members = members | {r.master_id}
        return alter_sync_state_set(h.state, h.live, h.now, AlterSyncStateSetRequestHeader(
            name, r.master_id, r.master_epoch + master_delta),
            SyncStateSet(members, max(0, r.sync_state_set_epoch + epoch_delta)))
    if kind == "clean":
        _, name, ids, living = op
        assert isinstance(ids, frozenset)
        text = ";".join(str(i) for i in sorted(ids)) or None
        return clean_broker_data(h.state, h.live, h.now, CleanBrokerDataRequestHeader(
            name, "c1", text, living))  # type: ignore[arg-type]
    if kind == "tick":
        h.now += op[1]  # type: ignore[operator]
        for dead in h.live.expired(h.now):
            d = on_broker_dead(h.state, h.live, h.now, h.config, dead)
            if d is not None:
                return d
        return None
    names = sets_to_reelect(h.state, h.live, h.now)
    return controller_elect(h.state, h.live, h.now, h.config, names[0]) if names else None


@settings(max_examples=500, deadline=None)
@given(ops=st.lists(_op, max_size=60), unclean=st.booleans(), stale_at=st.integers(0, 60))
def test_invariants_over_random_request_sequences(
    ops: list[tuple[object, ...]], unclean: bool, stale_at: int
) -> None:
    h = Harness(config=ControllerConfig(enable_elect_unclean_master=unclean))
    for name in NAMES:  # two running sets: three members each, all alive, 1 the master
        for i in (1, 2, 3):
            assert h.join(name, f"10.{len(name)}.{NAMES.index(name)}.{i}:1") == i
            h.beat(name, i)
        h.perform(elect_master(h.state, h.live, h.now, h.config,
                               ElectMasterRequestHeader("c1", name, 1)))
    stale_state: ControllerState | None = None
    for i, op in enumerate(ops):
        if i == stale_at:
            stale_state = h.state
        before = h.state
        decision = _step(h, op)
        if decision is None:
            continue
        # every write names the version its record was read at (0: did not exist)
        for change in decision.changes:
            stored = before.get(change.broker_name)
            assert change.expected_version == (0 if stored is None else stored.version)
        # refusals change nothing; only MASTER_NOT_AVAILABLE may fence without success
        if not decision.ok and decision.code != ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE:
            assert decision.changes == ()
        h.perform(decision)
        event(f"{op[0]} -> {ResponseCode(decision.code).name}")
        for change in decision.changes:
            old = before.get(change.broker_name)
            new = change.record
            if old is None or new is None:
                continue  # a new set, or a forgotten one
            # epochs never go down while a set exists
            assert new.master_epoch >= old.record.master_epoch
            assert new.sync_state_set_epoch >= old.record.sync_state_set_epoch
            if new.master_id != old.record.master_id and new.master_id is not None:
                # a new master bumps both epochs and stands alone in its in-sync set
                assert new.sync_state_set == {new.master_id}
                assert new.master_epoch == old.record.master_epoch + 1
                first = old.record.master_epoch == 0
                identity = BrokerIdentity(new.cluster, new.broker_name, new.master_id)
                assert h.live.is_alive(identity, h.now)  # the first one too
                if not first:
                    if "unclean" not in (decision.remark or ""):
                        assert new.master_id in old.record.sync_state_set
                    else:
                        assert unclean
            if new.sync_state_set != old.record.sync_state_set:
                assert new.sync_state_set_epoch > old.record.sync_state_set_epoch
            if new.master_id is not None:
                assert new.master_id in new.sync_state_set
        # a decision from an older read, if it writes what has since changed, cannot commit
        if stale_state is not None and stale_state != h.state and decision.changes:
            replay = _step_on(stale_state, h, op)
            if replay is not None and any(
                    stale_state.get(c.broker_name) != h.state.get(c.broker_name)
                    for c in replay.changes):
                with pytest.raises(CommitConflict):
                    h.records.commit(replay.writes)


def _step_on(state: ControllerState, h: Harness, op: tuple[object, ...]) -> Decision | None:
    if op[0] not in ("elect", "alter", "clean", "join"):
        return None
    saved = h.state
    h.state = state
    try:
        return _step(h, op)
    finally:
        h.state = saved
