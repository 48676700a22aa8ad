"""The pure rules of a controller-mode broker's view of its set (no network)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_ha.broker.controller import (
    AskElection,
    BecomeMaster,
    BecomeSlave,
    BrokerIdentity,
    IdentityError,
    IdentityFiles,
    MasterView,
    NewSyncStateSet,
    PendingIdentity,
    ReplicaState,
)
from trio_ha.wire.controller import SyncStateSet

ME = 2


def test_a_higher_epoch_naming_me_makes_me_master() -> None:
    state = ReplicaState(ME)
    members = SyncStateSet(frozenset({ME}), 1)
    decision = state.observe(MasterView(ME, "127.0.0.1:30921", 1, members))
    assert decision == BecomeMaster(1, members, same_master=False)
    assert isinstance(decision, BecomeMaster)
    state.role_taken(decision)
    assert state.is_master and state.master_epoch == 1 and state.role_changes == 1
    # the same news again (a poll after the notice) is old news
    assert state.observe(MasterView(ME, "127.0.0.1:30921", 1, members)) is None
    state.role_taken(decision)  # taken twice by mistake: counted once
    assert state.role_changes == 1


def test_another_master_makes_me_slave_and_an_older_epoch_is_ignored() -> None:
    state = ReplicaState(ME)
    decision = state.observe(MasterView(1, "127.0.0.1:30911", 3))
    assert decision == BecomeSlave(1, "127.0.0.1:30911", 3, same_master=False)
    assert isinstance(decision, BecomeSlave)
    state.role_taken(decision)
    assert state.observe(MasterView(ME, "127.0.0.1:30921", 2)) is None
    # a new epoch of the same master: follow on
    assert state.observe(MasterView(1, "127.0.0.1:30911", 4)) == \
        BecomeSlave(1, "127.0.0.1:30911", 4, same_master=True)


def test_a_higher_epoch_without_a_master_asks_for_an_election() -> None:
    state = ReplicaState(ME)
    state.role_taken(BecomeSlave(1, "a:1", 3, same_master=False))
    assert state.observe(MasterView(None, None, 4)) == AskElection(4)
    assert state.master_epoch == 3  # nothing taken yet


def test_a_master_takes_a_newer_set_at_the_same_epoch_only() -> None:
    state = ReplicaState(ME)
    state.role_taken(BecomeMaster(2, SyncStateSet(frozenset({ME}), 1), same_master=False))
    grown = SyncStateSet(frozenset({1, ME}), 2)
    assert state.observe(MasterView(ME, "x:1", 2, grown)) == NewSyncStateSet(grown)
    state.set_applied(grown)
    assert state.observe(MasterView(ME, "x:1", 2, SyncStateSet(frozenset({ME}), 1))) is None
    assert state.sync_state_set == grown


def test_a_failed_change_is_decided_again() -> None:
    state = ReplicaState(ME)
    view = MasterView(ME, "x:1", 5)
    assert isinstance(state.observe(view), BecomeMaster)
    # role_taken was never called: the next poll decides the same again
    assert isinstance(state.observe(view), BecomeMaster)


views = st.builds(
    MasterView,
    st.one_of(st.none(), st.integers(1, 3)),
    st.sampled_from([None, "127.0.0.1:1", "127.0.0.1:2"]),
    st.integers(0, 6),
    st.one_of(st.none(), st.builds(SyncStateSet, st.frozensets(st.integers(1, 3)),
                                   st.integers(0, 6))),
)


@given(st.lists(st.tuples(views, st.booleans()), max_size=30))
def test_epochs_acted_on_only_rise_and_roles_follow_the_view(
        steps: list[tuple[MasterView, bool]]) -> None:
    state = ReplicaState(ME)
    taken = 0
    for view, performed in steps:
        before = state.master_epoch
        decision = state.observe(view)
        if view.epoch <= before:
            assert not isinstance(decision, (BecomeMaster, BecomeSlave, AskElection))
        if isinstance(decision, BecomeMaster):
            assert view.master_id == ME
        if isinstance(decision, BecomeSlave):
            assert decision.master_id == view.master_id != ME
        if performed and isinstance(decision, (BecomeMaster, BecomeSlave)):
            state.role_taken(decision)
            taken += 1
            assert state.master_epoch == view.epoch > before
        else:
            assert state.master_epoch == before
        # the metrics' elections seen: one per role change taken, never for old news
        assert state.role_changes == taken


# ---- identity files ------------------------------------------------------------------------


def test_identity_files_in_rocketmq_format(tmp_path: Path) -> None:
    files = IdentityFiles(tmp_path, "c1", "broker-a")
    assert files.load() is None and files.load_pending() is None
    pending = PendingIdentity("c1", "broker-a", 2, "127.0.0.1:30921;1700000000000")
    files.save_pending(pending)
    assert (tmp_path / "brokerIdentity-temp").read_text() == \
        "c1#broker-a#2#127.0.0.1:30921;1700000000000"
    assert files.load_pending() == pending
    files.save(pending.granted())
    assert (tmp_path / "brokerIdentity").read_text() == "c1#broker-a#2"
    assert not (tmp_path / "brokerIdentity-temp").exists()
    assert files.load() == BrokerIdentity("c1", "broker-a", 2)


def test_an_identity_of_another_broker_set_is_refused_naming_both(tmp_path: Path) -> None:
    (tmp_path / "brokerIdentity").write_text("c1#broker-b#1")
    with pytest.raises(IdentityError, match="broker-b.*broker-a"):
        IdentityFiles(tmp_path, "c1", "broker-a").load()


@pytest.mark.parametrize("text", ["c1#broker-a", "c1#broker-a#x", "#broker-a#1"])
def test_a_damaged_identity_file_is_a_clear_error(tmp_path: Path, text: str) -> None:
    (tmp_path / "brokerIdentity").write_text(text)
    with pytest.raises(IdentityError, match="brokerIdentity"):
        IdentityFiles(tmp_path, "c1", "broker-a").load()
