"""The in-sync replica set alone: RocketMQ 5's SyncStateSet rules, with no socket and no trio.

A hypothesis state machine plays the slaves (they connect as a controller brokerId, ack,
drop, come back, some as async learners), the master's log (it grows) and clock (ticks), and a
controller with a set and an epoch of its own that accepts, refuses, applies and loses the
answer, answers polls, and sends stale notices. After every step it checks the invariants
against its own record (``SyncStateMachine``); which invariant each check pins is said at the
check. The example tests after it play RocketMQ's own bugs in this area, one each.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from trio_ha.store.ha import sync_state as sync_state_module
from trio_ha.store.ha.ledger import Step
from trio_ha.store.ha.sync_state import DEFINITE_REFUSALS, Link, Proposal, SyncState

MASTER = 1
SLAVES = (2, 3, 4, 5)
FENCED_SYNC_STATE_SET_EPOCH = 2001
ALTER_SYNC_STATE_SET_FAILED = 2013
BROKER_NOT_ALIVE = 2006


class SyncStateMachine(RuleBasedStateMachine):
    @initialize(all_ack=st.booleans(), honest=st.booleans(),
                others=st.sets(st.sampled_from(SLAVES), max_size=2),
                set_epoch=st.integers(0, 3), max_offset=st.integers(0, 500),
                data=st.data())
    def setup(self, all_ack: bool, honest: bool, others: set[int], set_epoch: int,
              max_offset: int, data: st.DataObject) -> None:
        confirm = data.draw(st.integers(0, max_offset))
        self.now = 0.0
        self.state = SyncState(
            MASTER, frozenset({MASTER, *others}), set_epoch,
            epoch_start=data.draw(st.integers(0, max_offset)), max_offset=max_offset,
            started=self.now, confirm_offset=confirm, all_ack=all_ack,
            in_sync_replicas=data.draw(st.integers(1, 3)),
            min_in_sync_replicas=data.draw(st.integers(1, 3)))
        #: honest slaves ack what they hold, and what they hold only grows: then the
        #: controller's set holds every byte answered (the guarantee the rules exist for)
        self.honest = honest
        self.held = {s: (confirm if s in others else 0) for s in SLAVES}
        self.links: dict[int, Link] = {}
        #: the controller's own view, and every set it ever told the master
        self.ctl_members = self.state.members
        self.ctl_epoch = set_epoch
        self.told = {(self.state.members, set_epoch)}
        self.pending: Proposal | None = None
        self.last_confirm = self.state.confirm_offset
        self.last_replicated = self.state.replicated
        self.last_epoch = set_epoch

    # ---- the slaves -------------------------------------------------------------------------

    @rule(slave=st.sampled_from(SLAVES), learner=st.booleans())
    def attach(self, slave: int, learner: bool) -> None:
        old = self.links.get(slave)
        link = self.state.attach(slave, learner=learner)
        assert link is not None and link.open and link.acked is None
        if old is not None:
            # A newer connection for the same id supersedes the older: closed, and handed
            # to the pump to close its socket.
            assert not old.open and old in self.state.superseded
        self.links[slave] = link

    @rule()
    def attach_as_the_master(self) -> None:
        """A peer that names the master's own id gets no link."""
        assert self.state.attach(MASTER) is None

    @rule(slave=st.sampled_from(SLAVES), twice=st.booleans())
    def drop(self, slave: int, twice: bool) -> None:
        link = self.links.pop(slave, None)
        if link is None:
            return
        self.state.drop(link)
        if twice:
            self.state.drop(link)
        assert not link.open

    @rule(slave=st.sampled_from(SLAVES), data=st.data())
    def ack(self, slave: int, data: st.DataObject) -> None:
        link = self.links.get(slave)
        if link is None:
            return
        max_offset = self.state.max_offset
        if self.honest:
            held = self.held[slave]
            if held < max_offset:
                held = data.draw(st.one_of(st.just(max_offset), st.integers(held, max_offset)))
            self.held[slave] = offset = held
        else:
            offset = data.draw(st.one_of(st.integers(0, max_offset + 50), st.just(max_offset)))
        self._step(lambda: self.state.ack(link, offset, self.now))

    # ---- the master's log and clock ---------------------------------------------------------

    @rule(size=st.integers(1, 100))
    def append(self, size: int) -> None:
        offset = self.state.max_offset + size
        self._step(lambda: self.state.max_moved(offset))
        assert self.state.max_offset == offset

    @rule(seconds=st.sampled_from([0.5, 1.0, 5.0, 16.0]))
    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.state.tick(self.now)

    # ---- proposals and the controller -------------------------------------------------------

    @rule()
    def propose(self) -> None:
        had_one = self.state.in_flight is not None
        due = self.state.proposal_due
        proposal = self.state.take_proposal(self.now)
        if proposal is None:
            assert self.state.in_flight is self.pending
            return
        # At most one in flight; only when it said one was due.
        assert not had_one and due and self.pending is None
        assert self.state.in_flight is proposal
        # The proposal carries the CURRENT epoch, names the master and never a slave without
        # a connection, nor an async learner it adds (#9897).
        assert proposal.epoch == self.state.set_epoch
        assert MASTER in proposal.members and proposal.members != self.state.members
        for member in proposal.members - {MASTER}:
            link = self.links.get(member)
            assert link is not None and link.open
            if member not in self.state.members:
                assert not link.learner
                assert link.acked is not None and link.acked >= self.state.epoch_start
        self.pending = proposal

    @precondition(lambda self: self.pending is not None)
    @rule(how=st.sampled_from(["accept", "refuse", "not alive", "lost after applying",
                               "lost", "already that set"]))
    def answer(self, how: str) -> None:
        proposal = self.pending
        assert proposal is not None
        self.pending = None
        current = proposal.epoch == self.ctl_epoch
        if how in ("accept", "lost after applying") and current:
            self.ctl_members, self.ctl_epoch = proposal.members, self.ctl_epoch + 1
            self.told.add((self.ctl_members, self.ctl_epoch))
        if how == "accept" and current:
            self._step(lambda: self.state.accepted(self.ctl_members, self.ctl_epoch, self.now))
        elif how in ("lost", "lost after applying"):
            self._step(lambda: self.state.refused(None, self.now))
        elif not current:
            self._step(lambda: self.state.refused(FENCED_SYNC_STATE_SET_EPOCH, self.now))
        elif how == "already that set":
            self._step(lambda: self.state.refused(ALTER_SYNC_STATE_SET_FAILED, self.now))
        else:
            code = BROKER_NOT_ALIVE if how == "not alive" else min(DEFINITE_REFUSALS)
            self._step(lambda: self.state.refused(code, self.now))
        assert self.state.in_flight is None

    @rule(lag=st.sampled_from([0.0, 1.0]))
    def poll(self, lag: float) -> None:
        """GET_REPLICA_INFO (or a role notice): the controller's set as it is."""
        self.told.add((self.ctl_members, self.ctl_epoch))
        self._step(lambda: self.state.controller_set(self.ctl_members, self.ctl_epoch,
                                                     asked_at=self.now - lag))

    @rule(data=st.data())
    def stale_notice(self, data: st.DataObject) -> None:
        """A notice from the past, or one that does not name this master: never applied."""
        members = frozenset(data.draw(st.sets(st.sampled_from((MASTER, *SLAVES)), max_size=4)))
        if MASTER in members:
            epoch = data.draw(st.integers(-1, self.state.set_epoch - 1))
        else:
            epoch = data.draw(st.integers(0, self.state.set_epoch + 3))
        before = (self.state.members, self.state.set_epoch)
        self._step(lambda: self.state.controller_set(members, epoch, asked_at=self.now))
        assert (self.state.members, self.state.set_epoch) == before

    def _step(self, event: Callable[[], Step]) -> None:
        """Run an event; RAISE exactly when the confirm offset or ``replicated`` rose."""
        confirm, replicated = self.state.confirm_offset, self.state.replicated
        step = event()
        rose = self.state.confirm_offset > confirm or self.state.replicated > replicated
        assert (step is Step.RAISE) == rose, (step, confirm, replicated)

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def the_master_is_always_in_the_set(self) -> None:
        assert MASTER in self.state.members and MASTER in self.state.union

    @invariant()
    def only_the_controller_changes_the_set(self) -> None:
        """Every set applied was told by the controller (an acceptance, a poll, a notice),
        with a higher epoch than the one before."""
        state = self.state
        assert (state.members, state.set_epoch) in self.told
        assert state.set_epoch >= self.last_epoch
        self.last_epoch = state.set_epoch

    @invariant()
    def at_most_one_proposal_in_flight(self) -> None:
        assert self.state.in_flight is self.pending
        if self.pending is not None:
            assert self.pending.members <= self.state.union

    @invariant()
    def confirm_offset_and_replicated_never_go_backwards(self) -> None:
        state = self.state
        assert state.confirm_offset >= self.last_confirm
        assert state.replicated >= self.last_replicated
        rose = state.replicated > self.last_replicated
        self.last_confirm, self.last_replicated = state.confirm_offset, state.replicated
        if state.all_ack:
            assert state.confirm_offset == state.replicated
            if rose:
                # A put is answered only when every member of the union acked its end, on
                # the connection it has now (#5663: the proposed members count; #6662: a
                # member without a connection or an ack holds it back).
                for member in state.union - {MASTER}:
                    link = self.links.get(member)
                    assert link is not None and link.open and link.acked is not None
                    assert link.acked >= state.replicated, (member, link.acked)
            assert state.waits_for_slaves == (state.union != {MASTER})
        else:
            # RocketMQ: with allAckInSyncStateSet off, the confirm offset is the max, and puts
            # wait for inSyncReplicas acks, the master's own included, from any slave.
            assert state.confirm_offset == state.max_offset
            needed = state.in_sync_replicas - 1
            if rose and needed > 0:
                acks = [link.acked for link in self.links.values() if link.acked is not None]
                assert sum(a >= state.replicated for a in acks) >= needed

    @invariant()
    def puts_are_refused_below_min_in_sync_replicas(self) -> None:
        state = self.state
        count = len(state.members)
        if state.in_flight is not None:
            count = max(count, len(state.in_flight.members))
        assert state.in_sync_count == count
        assert state.admits_puts == (count >= state.min_in_sync_replicas)

    @invariant()
    def the_controllers_set_holds_every_answered_byte(self) -> None:
        """With honest slaves and allAck: whatever the controller's set is (it may have
        applied a proposal whose answer was lost), the master counts all of it, and every
        slave in it holds every byte a put was answered for: a failover to any of them loses
        no acknowledged send."""
        state = self.state
        if not (self.honest and state.all_ack):
            return
        assert self.ctl_members <= state.union
        for member in self.ctl_members - {MASTER}:
            assert self.held[member] >= state.replicated, (member, self.held, state.replicated)


SyncStateMachine.TestCase.settings = settings(max_examples=400, stateful_step_count=50,
                                              deadline=None)
test_sync_state_invariants = SyncStateMachine.TestCase


# ---- RocketMQ's bugs and the rules, one scenario each ---------------------------------------


def master_of(*others: int, all_ack: bool = True, in_sync_replicas: int = 1,
              min_in_sync_replicas: int = 1) -> SyncState:
    """A master (id 1) whose accepted set is itself and ``others``, at epoch 5, its log and
    its confirm offset at 1000."""
    return SyncState(MASTER, frozenset({MASTER, *others}), 5, epoch_start=0, max_offset=1000,
                     started=0.0, confirm_offset=1000, all_ack=all_ack,
                     in_sync_replicas=in_sync_replicas,
                     min_in_sync_replicas=min_in_sync_replicas)


def connected(state: SyncState, slave: int, acked: int, now: float = 0.0) -> Link:
    link = state.attach(slave)
    assert link is not None
    state.ack(link, acked, now)
    return link


def test_an_expansion_in_flight_counts_the_newcomer_5663():
    """#5663: a slave caught up is proposed; until the controller answers, puts wait for it
    too, so a failover to it after the controller applied the set loses nothing."""
    state = master_of()
    assert not state.waits_for_slaves and state.confirm_offset == 1000
    slave = connected(state, 2, 1000)
    assert state.proposal_due
    proposal = state.take_proposal(0.0)
    assert proposal == Proposal(frozenset({1, 2}), 5)
    assert state.waits_for_slaves and state.union == {1, 2}
    assert state.max_moved(1100) is Step.NOTHING  # the put ending at 1100 waits for slave 2
    assert state.replicated == 1000 and state.confirm_offset == 1000
    assert state.ack(slave, 1100, 0.1) is Step.RAISE and state.replicated == 1100
    assert state.accepted(frozenset({1, 2}), 6, 0.2) is Step.NOTHING
    assert state.members == {1, 2} and state.set_epoch == 6 and state.in_flight is None


def test_a_slave_behind_the_confirm_offset_or_the_epoch_start_is_not_added():
    state = SyncState(MASTER, frozenset({1, 9}), 5, epoch_start=500, max_offset=600,
                      started=0.0, confirm_offset=100)
    connected(state, 9, 100)
    assert state.confirm_offset == 100
    two = connected(state, 2, 300)  # past the confirm offset, before this epoch began
    learner = state.attach(3, learner=True)
    assert learner is not None
    state.ack(learner, 600, 0.0)  # an async learner never joins
    assert state.take_proposal(0.0) is None
    state.ack(two, 500, 0.0)  # from this epoch's start on
    state.tick(1.0)
    assert state.take_proposal(1.0) == Proposal(frozenset({1, 2, 9}), 5)


def test_a_member_without_a_connection_freezes_the_confirm_offset_6662():
    """#6662: a member that lost its connection (a partition) still counts until the
    controller accepts a set without it: nothing past what it acked is confirmed."""
    state = master_of(2, 3)
    two, three = connected(state, 2, 1000), connected(state, 3, 1000)
    state.max_moved(1200)
    assert state.ack(two, 1200, 1.0) is Step.NOTHING  # 3 has not acked it yet
    state.drop(three)
    assert state.ack(two, 1200, 1.0) is Step.NOTHING
    state.max_moved(1300)
    assert state.confirm_offset == 1000 and state.replicated == 1000
    back = state.attach(3)  # it comes back: frozen until the new connection acks
    assert back is not None and state.ack(two, 1300, 2.0) is Step.NOTHING
    assert state.ack(back, 1250, 2.0) is Step.RAISE and state.confirm_offset == 1250
    state.drop(back)
    proposal = state.take_proposal(3.0)
    assert proposal == Proposal(frozenset({1, 2}), 5)
    state.max_moved(1400)
    assert state.confirm_offset == 1250  # frozen while the shrink is in flight
    assert state.accepted(frozenset({1, 2}), 6, 3.5) is Step.RAISE
    assert state.confirm_offset == 1300 and state.replicated == 1300


def test_two_slaves_dropping_at_once_make_one_proposal_naming_neither_9897():
    """#9897: two members drop at the same moment; the set proposed is worked out from the
    facts, so it is one proposal without both, not one per drop each naming the other."""
    state = master_of(2, 3, 4)
    links = {s: connected(state, s, 1000) for s in (2, 3, 4)}
    state.drop(links[3])
    state.drop(links[4])
    assert state.take_proposal(0.0) == Proposal(frozenset({1, 2}), 5)
    assert state.take_proposal(0.0) is None  # one in flight
    state.accepted(frozenset({1, 2}), 6, 0.0)
    assert state.take_proposal(0.0) is None  # nothing more to change
    state.max_moved(1100)
    assert state.ack(links[2], 1100, 0.1) is Step.RAISE and state.replicated == 1100


def test_drops_while_a_proposal_is_in_flight_make_one_proposal_after_the_answer_9897():
    state = master_of(2, 3, 4)
    links = {s: connected(state, s, 1000) for s in (2, 3, 4)}
    five = connected(state, 5, 1000)
    assert state.take_proposal(0.0) == Proposal(frozenset({1, 2, 3, 4, 5}), 5)
    state.drop(links[3])
    state.drop(links[4])
    assert not state.proposal_due and state.take_proposal(0.0) is None
    state.accepted(frozenset({1, 2, 3, 4, 5}), 6, 0.1)
    assert state.take_proposal(0.1) == Proposal(frozenset({1, 2, 5}), 6)
    state.accepted(frozenset({1, 2, 5}), 7, 0.2)
    state.max_moved(1100)
    state.ack(links[2], 1100, 0.3)
    assert state.ack(five, 1100, 0.3) is Step.RAISE and state.replicated == 1100


def test_a_member_that_does_not_catch_up_for_15_seconds_is_shrunk():
    state = master_of(2, 3)
    two, three = connected(state, 2, 1000), connected(state, 3, 1000)
    for second in range(1, 16):
        state.max_moved(1000 + 100 * second)
        state.ack(two, 1000 + 100 * second, second)  # keeps up
        state.ack(three, 1000, second)  # stuck
        state.tick(float(second))
        assert state.take_proposal(float(second)) is None
    state.tick(16.0)
    assert state.take_proposal(16.0) == Proposal(frozenset({1, 2}), 5)


def test_a_slave_a_tick_behind_is_caught_up_as_of_that_tick():
    """An ack that covers the max sampled at a tick dates the catch-up to that tick."""
    state = master_of(2)
    two = connected(state, 2, 1000)
    state.tick(10.0)
    state.max_moved(2000)
    state.ack(two, 1500, 24.0)  # holds all the master had at 10 s, not at 24 s
    replica = state.replica(2)
    assert replica is not None and replica.caught_up == 10.0
    state.tick(25.0)  # 15 s behind: not more than haMaxTimeSlaveNotCatchup yet
    assert state.take_proposal(25.0) is None
    state.tick(26.0)
    assert state.take_proposal(26.0) == Proposal(frozenset({1}), 5)


def test_in_sync_replicas_below_the_minimum_refuse_puts():
    state = master_of(2, min_in_sync_replicas=2)
    assert state.admits_puts
    link = connected(state, 2, 1000)
    state.drop(link)
    assert state.take_proposal(1.0) == Proposal(frozenset({1}), 5)
    assert state.in_sync_count == 2 and state.admits_puts  # RocketMQ: the larger, in flight
    state.accepted(frozenset({1}), 6, 1.0)
    assert state.in_sync_count == 1 and not state.admits_puts


def test_a_definite_refusal_backs_off_and_forgets_the_proposal():
    state = master_of()
    two = connected(state, 2, 1000)
    assert state.take_proposal(0.0) == Proposal(frozenset({1, 2}), 5)
    state.max_moved(1100)
    assert state.refused(BROKER_NOT_ALIVE, 0.5) is Step.RAISE  # it no longer counts
    assert state.union == {1} and state.replicated == 1100 and state.last_refusal == 2006
    state.ack(two, 1100, 1.0)
    assert not state.proposal_due and state.take_proposal(1.0) is None
    state.tick(5.5)
    assert state.take_proposal(5.5) == Proposal(frozenset({1, 2}), 5)


def test_an_unknown_answer_keeps_counting_the_proposal_until_the_set_is_seen_again():
    """No answer: the controller may have applied it. Its members keep counting until a poll
    asked after that shows the set (the same epoch: it did not take effect)."""
    state = master_of()
    two = connected(state, 2, 1000)
    state.take_proposal(0.0)
    assert state.refused(None, 3.0) is Step.NOTHING
    assert state.union == {1, 2}
    state.drop(two)
    state.max_moved(1100)
    assert state.replicated == 1000  # slave 2 may be in the controller's set
    assert state.controller_set(frozenset({1}), 5, asked_at=2.0) is Step.NOTHING  # asked before
    assert state.controller_set(frozenset({1}), 5, asked_at=3.5) is Step.RAISE
    assert state.union == {1} and state.replicated == 1100


def test_an_unknown_answer_that_took_effect_is_learnt_from_the_next_poll():
    state = master_of()
    two = connected(state, 2, 1000)
    state.take_proposal(0.0)
    state.refused(None, 3.0)  # the controller applied it: epoch 6
    state.tick(8.0)
    state.max_moved(1100)
    assert state.take_proposal(8.0) == Proposal(frozenset({1, 2}), 5)  # tried again
    state.refused(ALTER_SYNC_STATE_SET_FAILED, 8.5)  # "that is the set already"
    assert state.union == {1, 2} and state.replicated == 1000
    state.controller_set(frozenset({1, 2}), 6, asked_at=9.0)
    assert state.members == {1, 2} and state.set_epoch == 6 and state.union == {1, 2}
    assert state.ack(two, 1100, 9.0) is Step.RAISE and state.replicated == 1100


def test_only_a_higher_epoch_naming_this_master_is_applied():
    state = master_of(2)
    state.max_moved(1100)  # held where it is: slave 2 has no connection
    assert state.controller_set(frozenset({1}), 5, asked_at=0.0) is Step.NOTHING
    assert state.controller_set(frozenset({1}), 4, asked_at=0.0) is Step.NOTHING
    assert state.controller_set(frozenset({2}), 9, asked_at=0.0) is Step.NOTHING
    assert state.members == {1, 2} and state.set_epoch == 5
    assert state.controller_set(frozenset({1}), 6, asked_at=0.0) is Step.RAISE
    assert state.members == {1} and state.set_epoch == 6


def test_with_all_ack_off_confirm_is_the_max_and_puts_wait_for_in_sync_replicas():
    state = master_of(2, 3, all_ack=False, in_sync_replicas=2)
    assert state.waits_for_slaves and state.confirm_offset == 1000
    two = connected(state, 2, 1000)
    assert state.max_moved(1100) is Step.RAISE and state.confirm_offset == 1100
    assert state.replicated == 1000
    outsider = connected(state, 4, 1050)  # any connected slave's ack counts, as RocketMQ's
    assert outsider.acked == 1050 and state.replicated == 1050
    assert state.ack(two, 1100, 0.1) is Step.RAISE and state.replicated == 1100


def test_a_newer_connection_supersedes_the_older():
    state = master_of(2)
    old = connected(state, 2, 1000)
    new = state.attach(2)
    assert new is not None and not old.open and state.superseded == [old]
    state.max_moved(1100)
    assert state.ack(old, 1100, 0.0) is Step.NOTHING  # a superseded connection counts no more
    assert state.replicated == 1000
    assert state.ack(new, 1100, 0.0) is Step.RAISE


def test_the_master_must_be_in_its_set():
    with pytest.raises(ValueError, match="does not name this master"):
        SyncState(MASTER, frozenset({2}), 0, epoch_start=0, max_offset=0, started=0.0)


def test_the_sync_state_imports_no_io():
    """The set's rules are sans-I/O: no trio, no sockets, no clock, nothing of the pumps."""
    tree = ast.parse(pathlib.Path(sync_state_module.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported
                if name.split(".")[0] in {"trio", "socket", "os", "selectors", "time"}
                or name.lstrip(".").split(".")[0] in {"master", "slave", "transfer"}}
    assert imported  # the walk saw the imports
