"""What a controller-mode broker does with what it hears about its set: pure rules.

A broker hears who its set's master is from four places: the answer to its registration, the
answer to its own ELECT_MASTER, the controller's NOTIFY_BROKER_ROLE_CHANGED, and its poll of
GET_REPLICA_INFO every syncBrokerMetadataPeriod. They arrive in any order, late, twice, or
from a controller that has since lost its leadership. One rule makes that safe, the same as
RocketMQ's ``ReplicasManager``: **act only on a higher master epoch**. The controller bumps the
epoch at every election, so an older or repeated view of the set is ignored, and a broker can
never go back to a master it already left.

``ReplicaState`` holds the broker's view (its controller id, the master epoch it acted on, the
master, the in-sync set) and answers each ``observe`` with what to do, as etcd's raft answers
with a ``Ready``: become master, become slave, ask for an election (a higher epoch with no
master: the old master died and no eligible replica was found when the controller tried), take
a new in-sync set (a master hearing its own set changed at the same epoch), or nothing. The
caller (``link.ControllerLink``) performs it and, for a role change, tells the state that it
did (``role_taken``) only once it succeeded, so a failed change is tried again by the next
notice or poll rather than recorded as done. Everything here is tested without a network
(tests/test_controller_replicas.py).
"""

from __future__ import annotations

import attrs

from ...wire.controller import SyncStateSet

__all__ = ["AskElection", "BecomeMaster", "BecomeSlave", "MasterView", "NewSyncStateSet",
           "ReplicaState", "RoleDecision"]


@attrs.frozen
class MasterView:
    """What one answer or notice says about the set: its master (None: no master now) at
    ``epoch``, and the in-sync set (None when the answer carries none)."""

    master_id: int | None
    master_addr: str | None
    epoch: int
    sync_state_set: SyncStateSet | None = None
    #: when (trio time) the request that brought this view was sent: a set seen in an answer
    #: is at least as new as that moment (None: a notice, as new as its arrival)
    asked_at: float | None = None

    @property
    def has_master(self) -> bool:
        return self.master_id is not None and bool(self.master_addr)


@attrs.frozen
class BecomeMaster:
    """Take the master's role at ``epoch`` (or, already master, start the new epoch)."""

    epoch: int
    sync_state_set: SyncStateSet
    #: already the master with id 0: no truncation, no role switch; a new epoch entry, a new
    #: state version and a registration (RocketMQ's changeToMasterWhenLastRoleIsMaster)
    same_master: bool


@attrs.frozen
class BecomeSlave:
    """Follow ``master_addr`` (the master's remoting address) at ``epoch``."""

    master_id: int
    master_addr: str
    epoch: int
    #: the master did not change (a new epoch of the same master): follow on, re-register
    same_master: bool


@attrs.frozen
class AskElection:
    """The set has no master at a newer epoch than ours: ask the controller to elect."""

    epoch: int


@attrs.frozen
class NewSyncStateSet:
    """This master's in-sync set changed at the same epoch (an accepted proposal, a poll)."""

    sync_state_set: SyncStateSet
    asked_at: float | None = None


RoleDecision = BecomeMaster | BecomeSlave | AskElection | NewSyncStateSet


@attrs.define(eq=False)
class ReplicaState:
    """A controller-mode broker's view of its set (see the module docstring)."""

    #: this broker's controller id (from its brokerIdentity)
    broker_id: int
    #: the master epoch this broker last acted on (0: none yet)
    master_epoch: int = 0
    master_id: int | None = None
    master_addr: str | None = None
    #: the in-sync set this broker last applied (a master's; a slave keeps the last it saw)
    sync_state_set: SyncStateSet = attrs.field(factory=SyncStateSet)
    #: role changes taken (each at a higher master epoch: an election this broker went
    #: through, its first role included), for the broker's metrics
    role_changes: int = 0

    @property
    def is_master(self) -> bool:
        return self.master_id == self.broker_id and self.master_epoch > 0

    def observe(self, view: MasterView) -> RoleDecision | None:
        """What to do about ``view``; nothing changes here until ``role_taken`` or
        ``set_applied`` says the caller did it."""
        if view.epoch > self.master_epoch:
            if not view.has_master:
                return AskElection(view.epoch)
            assert view.master_id is not None and view.master_addr is not None
            if view.master_id == self.broker_id:
                members = view.sync_state_set or SyncStateSet(frozenset({self.broker_id}), 0)
                return BecomeMaster(view.epoch, members, same_master=self.is_master)
            return BecomeSlave(view.master_id, view.master_addr, view.epoch,
                               same_master=view.master_id == self.master_id)
        if (view.epoch == self.master_epoch and self.is_master
                and view.sync_state_set is not None
                and view.sync_state_set.epoch > self.sync_state_set.epoch):
            return NewSyncStateSet(view.sync_state_set, view.asked_at)
        return None

    def role_taken(self, decision: BecomeMaster | BecomeSlave) -> None:
        """The caller performed ``decision``: record it (later views at or below its epoch are
        old news)."""
        if decision.epoch <= self.master_epoch:
            return
        self.master_epoch = decision.epoch
        self.role_changes += 1
        if isinstance(decision, BecomeMaster):
            self.master_id = self.broker_id
            self.master_addr = None
            self.set_applied(decision.sync_state_set)
        else:
            self.master_id = decision.master_id
            self.master_addr = decision.master_addr

    def set_applied(self, members: SyncStateSet) -> None:
        """A newer in-sync set took effect (only ever forward)."""
        if members.epoch >= self.sync_state_set.epoch:
            self.sync_state_set = members
