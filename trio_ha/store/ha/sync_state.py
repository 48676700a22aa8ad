"""The in-sync replica set of a controller-mode master, with no socket, no trio and no clock.

In RocketMQ 5's controller mode the controller elects a new master only from the master's
SyncStateSet, so that set is a promise: every member holds every byte a SYNC_MASTER put was
answered PUT_OK for (with ``allAckInSyncStateSet``), and every byte below the confirm offset
that consumers may already have read. RocketMQ keeps the set's rules spread over the HA
service's threads (``AutoSwitchHAService``, ``AutoSwitchHAConnection``, ``ReplicasManager``,
``GroupTransferService``), where three of its bugs came from: #5663 (an expansion raced the
puts it should have gated), #6662 (a member without a connection let the confirm offset
advance) and #9897 (two slaves that dropped at once edited one copy of the set each, and the
set proposed named a dropped slave). Here the rules are one pure object, stepped with events
as etcd's raft and h11's state machines are, and tested alone with any sequence of events
(tests/test_ha_sync_state.py). The master's pumps own the sockets, the clock and the
controller client; they step it and perform what it answers.

Events, each a method (``now`` is the pump's clock, in seconds):

- ``attach``: a slave's HA connection finished its handshake, naming its controller brokerId;
  the answer is a ``Link`` the pump keeps with the connection (or None: the master's own id).
  A newer connection for the same brokerId supersedes the older one (in ``superseded``).
- ``ack``: the slave acknowledged the log up to an offset on that connection (an offset the
  pump has judged to be an acknowledgement: the ledger's rules, ``ledger.py``, come first).
- ``drop``: the connection ended (once or many times: only the first counts).
- ``max_moved``: the master's log grew (cheap: a comparison and at most two assignments).
- ``tick``: time passed (the set check, RocketMQ's ``checkSyncStateSetPeriod``).
- ``accepted`` / ``refused``: the controller's answer to the proposal in flight.
- ``controller_set``: a set the controller published (role notice, GET_REPLICA_INFO poll).

Outputs: ``proposal_due`` and ``take_proposal`` (ALTER_SYNC_STATE_SET to send: the proposed
set and the set's CURRENT epoch, as the controller wants it); ``confirm_offset`` (how far
consume queues may be built); ``replicated`` (what SYNC_MASTER puts wait for; an event answers
RAISE when it or the confirm offset rose); ``waits_for_slaves`` (whether a put need wait at
all) and ``admits_puts`` (False: refuse it, IN_SYNC_REPLICAS_NOT_ENOUGH).

The rules, with RocketMQ 5.3.3's names:

- **Only the controller changes the set.** A proposal is applied when the controller accepts
  it, or when a notice or poll shows a set with a higher syncStateSetEpoch; never from a
  local guess. A set that does not name this master is not ours to apply (a role change is).
- **One proposal in flight.** A change wanted while one is in flight is not queued: when the
  answer comes, the set wanted is worked out again from the facts of that moment (who is
  connected, acked what, caught up when), never by editing a copy per event. Two slaves that
  drop at once therefore make one proposal that names neither (#9897).
- **The union counts.** While a proposal is in flight, puts wait for and the confirm offset
  follows every member of the current set and of the proposed one (#5663). A proposal whose
  answer is unknown (no answer, or a refusal that may mean an earlier request took effect)
  keeps its members in that union until the controller's set is seen again.
- **A member without a connection freezes** the confirm offset and the puts (#6662), until the
  controller accepts a set without it; so does a member whose new connection has not acked
  yet (RocketMQ skips those, which lets the offset pass bytes the member may lack).
- **Expand** a connected slave, not an async learner, whose ack is at least the confirm offset
  and at least the start of this master's epoch; judged when the proposal is taken, so every
  put answered before it is held by the newcomer. **Shrink** a member with no connection, or
  not caught up (acked everything the master had at some moment) for ``max_not_catchup``.
- With ``all_ack`` off, or nobody but the master in the union, the confirm offset is the
  master's max, as RocketMQ's; with ``all_ack`` off, puts wait for ``in_sync_replicas`` acks
  counting the master, from any connected slave, as RocketMQ's GroupTransferService counts.
- The confirm offset and ``replicated`` never go backwards (a member that comes back with
  less than it acked before holds them where they are).

Caught-up times cost nothing per put: ``tick`` samples the master's max, and an ack that
covers a sample dates the slave's catch-up to it (so a slave's lag is over-estimated by at
most two ticks, on the side of shrinking).
"""

from __future__ import annotations

from typing import Final

import attrs

from .ledger import NOTHING, RAISE, Step

#: ALTER_SYNC_STATE_SET refusals that prove the controller refused this very request when it
#: checked it (CONTROLLER_FENCED_MASTER_EPOCH, _INVALID_MASTER, _INVALID_REPLICAS,
#: _BROKER_NOT_ALIVE, _NOT_LEADER): its set did not change. Any other answer (no answer,
#: _FENCED_SYNC_STATE_SET_EPOCH, _ALTER_SYNC_STATE_SET_FAILED, which also means "already that
#: set", an unknown code) leaves open that an earlier request of ours took effect.
DEFINITE_REFUSALS: Final = frozenset({2000, 2002, 2003, 2006, 2007})

#: what "every slave holds" means when no slave is waited for: past any log end
_UNBOUNDED: Final = 1 << 63


@attrs.frozen
class Proposal:
    """An ALTER_SYNC_STATE_SET to send: ``members`` with the set's current ``epoch``."""

    members: frozenset[int]
    epoch: int


@attrs.define(eq=False)
class Replica:
    """What the master knows of one controller brokerId, across its connections."""

    broker_id: int
    #: its open connection, or None
    link: Link | None = None
    #: the last time it held everything the master had (None: never seen caught up)
    caught_up: float | None = None
    #: it is in the union the acks are counted over
    counted: bool = False


@attrs.define(eq=False)
class Link:
    """One slave HA connection, as the set sees it. ``acked`` is its last acknowledgement on
    this connection (None before the first one)."""

    replica: Replica
    learner: bool = False
    acked: int | None = None
    open: bool = True

    @property
    def broker_id(self) -> int:
        return self.replica.broker_id


@attrs.define(eq=False)
class SyncState:
    """The master's in-sync set: its rules, stepped with events. One per master term."""

    #: this master's controller brokerId
    broker_id: int
    #: the set the controller accepted last, and its syncStateSetEpoch
    members: frozenset[int]
    set_epoch: int
    #: where this master's epoch began in the log (its last epoch entry's start offset)
    epoch_start: int
    #: the master's log end
    max_offset: int
    #: when this term began: each slave the set names then has ``max_not_catchup`` from it
    started: float
    #: the confirm offset before this term (the store's), kept if no better one can be told
    confirm_offset: int = 0
    #: allAckInSyncStateSet (ours defaults to true), inSyncReplicas, minInSyncReplicas
    all_ack: bool = True
    in_sync_replicas: int = 1
    min_in_sync_replicas: int = 1
    #: haMaxTimeSlaveNotCatchup and checkSyncStateSetPeriod, in seconds
    max_not_catchup: float = 15.0
    retry_interval: float = 5.0
    #: the ALTER_SYNC_STATE_SET sent and not answered yet
    in_flight: Proposal | None = attrs.field(init=False, default=None)
    #: what SYNC_MASTER puts wait for: never goes backwards
    replicated: int = attrs.field(init=False, default=0)
    #: connections superseded by a newer one for the same brokerId, for the pump to close
    superseded: list[Link] = attrs.field(init=False, factory=list[Link])
    #: the last refusal's code (None: no answer), for statistics
    last_refusal: int | None = attrs.field(init=False, default=None)
    _replicas: dict[int, Replica] = attrs.field(init=False, factory=dict[int, Replica])
    #: the union's members but this master: whose acks count
    _counted: tuple[Replica, ...] = attrs.field(init=False, default=())
    #: members of answered proposals whose outcome is unknown, and when that answer came
    _unresolved: frozenset[int] = attrs.field(init=False, default=frozenset[int]())
    _unresolved_since: float = attrs.field(init=False, default=0.0)
    #: the offset every slave the puts wait for holds (None: one of them has no ack)
    _held: int | None = attrs.field(init=False, default=0)
    #: something changed that may change the set wanted; a refusal holds proposals back
    _dirty: bool = attrs.field(init=False, default=True)
    _backing_off: bool = attrs.field(init=False, default=False)
    _retry_at: float = attrs.field(init=False, default=0.0)
    #: the master's max at the last two ticks, and when (dates a slave's catch-up)
    _older_mark: tuple[int, float] = attrs.field(init=False, default=(0, 0.0))
    _newer_mark: tuple[int, float] = attrs.field(init=False, default=(0, 0.0))

    def __attrs_post_init__(self) -> None:
        if self.broker_id not in self.members:
            raise ValueError(f"the set {sorted(self.members)} does not name this master "
                             f"{self.broker_id}")
        for broker_id in self.members:
            if broker_id != self.broker_id:
                self._replica(broker_id).caught_up = self.started  # time to reconnect
        self._older_mark = self._newer_mark = (self.max_offset, self.started)
        self.replicated = self.confirm_offset
        self._recount()
        self._publish()

    # ---- connections ------------------------------------------------------------------------

    def attach(self, broker_id: int, *, learner: bool = False) -> Link | None:
        """A slave connection finished its handshake as ``broker_id``. None for the master's
        own id (a confused or hostile peer: the pump closes it)."""
        if broker_id == self.broker_id:
            return None
        replica = self._replica(broker_id)
        old = replica.link
        if old is not None:
            old.open = False
            self.superseded.append(old)
        replica.link = link = Link(replica, learner)
        if not self.all_ack:
            self._recount_any()  # the superseded connection's ack no longer counts
        elif replica.counted:
            self._held = None  # a member's new connection has acked nothing yet
        return link

    def drop(self, link: Link) -> None:
        """The connection ended. A member's drop freezes what it counted for and makes a
        shrink due; the drop of an outsider changes nothing but its count."""
        if not link.open:
            return
        link.open = False
        replica = link.replica
        replica.link = None
        if replica.counted:
            self._dirty = True
        if not self.all_ack:
            self._recount_any()
        elif replica.counted:
            self._held = None

    def ack(self, link: Link, offset: int, now: float) -> Step:
        """The slave acknowledged the log up to ``offset``. RAISE: the confirm offset or
        ``replicated`` rose."""
        if not link.open:
            return NOTHING
        link.acked = offset
        replica = link.replica
        self._date_catch_up(replica, offset, now)
        if (not replica.counted and not link.learner and offset >= self.confirm_offset
                and offset >= self.epoch_start):
            self._dirty = True  # an expansion may be due
        if not self.all_ack:
            self._recount_any()
        elif replica.counted:
            self._held = self._held_by_members()
        else:
            return NOTHING
        return self._publish()

    def _date_catch_up(self, replica: Replica, offset: int, now: float) -> None:
        """The ack holds everything the master had now, or at one of the last two ticks."""
        caught_up = replica.caught_up
        if offset >= self.max_offset:
            when = now
        elif offset >= self._newer_mark[0]:
            when = self._newer_mark[1]
        elif offset >= self._older_mark[0]:
            when = self._older_mark[1]
        else:
            return
        if caught_up is None or when > caught_up:
            replica.caught_up = when

    # ---- the log and time -------------------------------------------------------------------

    def max_moved(self, offset: int) -> Step:
        """The master's log now ends at ``offset``. The pump tells it before any put ending
        there is answered: an expansion is judged against the confirm offset, which must
        cover every put answered so far (with no slave to wait for, it is this max)."""
        if offset <= self.max_offset:
            return NOTHING
        self.max_offset = offset
        return self._publish()

    def tick(self, now: float) -> None:
        """Time passed: date the catch-up of slaves that hold everything, sample the max,
        and see whether a member fell behind for too long or a refusal's back-off ended."""
        max_offset = self.max_offset
        for replica in self._replicas.values():
            link = replica.link
            if link is not None and link.acked is not None and link.acked >= max_offset:
                replica.caught_up = now
        self._older_mark, self._newer_mark = self._newer_mark, (max_offset, now)
        if self._backing_off and now >= self._retry_at:
            self._backing_off = False
        limit = now - self.max_not_catchup
        for broker_id in self.members:
            if broker_id != self.broker_id:
                replica = self._replicas[broker_id]
                if replica.link is None or replica.caught_up is None or replica.caught_up < limit:
                    self._dirty = True

    # ---- proposals and the controller's answers ---------------------------------------------

    @property
    def proposal_due(self) -> bool:
        """Whether ``take_proposal`` may have something to send (the pump wakes its
        proposer; several events before it looks make one proposal)."""
        return self._dirty and self.in_flight is None and not self._backing_off

    def take_proposal(self, now: float) -> Proposal | None:
        """The proposal to send now, worked out from the facts of this moment, and marked in
        flight (its members count from now on); None if nothing is to change, or if one is in
        flight, or a refusal's back-off runs."""
        if not self.proposal_due:
            return None
        self._dirty = False
        wanted = self._wanted(now)
        if wanted == self.members:
            return None
        proposal = Proposal(wanted, self.set_epoch)
        self.in_flight = proposal
        self._recount()
        return proposal

    def _wanted(self, now: float) -> frozenset[int]:
        """The set the facts call for: the master; members connected and caught up within
        ``max_not_catchup``; slaves (not learners) that hold the confirm offset and the
        start of this master's epoch."""
        limit = now - self.max_not_catchup
        floor = max(self.confirm_offset, self.epoch_start)
        wanted = {self.broker_id}
        for broker_id, replica in self._replicas.items():
            link = replica.link
            if link is None:
                continue
            if broker_id in self.members:
                if replica.caught_up is not None and replica.caught_up >= limit:
                    wanted.add(broker_id)
            elif not link.learner and link.acked is not None and link.acked >= floor:
                wanted.add(broker_id)
        return frozenset(wanted)

    def accepted(self, members: frozenset[int], epoch: int, now: float) -> Step:
        """The controller accepted the proposal in flight: the set is now ``members`` at
        ``epoch`` (applied if newer than what we know)."""
        self.in_flight = None
        self._dirty = True  # the facts may have moved on while it was in flight
        return self._apply(members, epoch, now)

    def refused(self, code: int | None, now: float) -> Step:
        """The controller refused the proposal in flight with ``code`` (None: no answer).
        Proposals hold back for ``retry_interval``. Unless the refusal is definite, the
        proposal's members keep counting until the controller's set is seen again."""
        proposal = self.in_flight
        if proposal is None:
            return NOTHING
        self.in_flight = None
        self.last_refusal = code
        self._dirty = self._backing_off = True
        self._retry_at = now + self.retry_interval
        if code not in DEFINITE_REFUSALS and proposal.epoch == self.set_epoch:
            self._unresolved |= proposal.members
            self._unresolved_since = now
        self._recount()
        return self._publish()

    def controller_set(self, members: frozenset[int], epoch: int, asked_at: float) -> Step:
        """The controller's set, from a role notice or a poll asked at ``asked_at``. A newer
        one is applied. The set we know at the epoch we know, asked after an unknown answer
        came, shows that the proposal answered so did not take effect."""
        if (epoch == self.set_epoch and members == self.members and self._unresolved
                and asked_at >= self._unresolved_since):
            self._unresolved = frozenset()
            self._dirty = True
            self._recount()
            return self._publish()
        return self._apply(members, epoch, asked_at)

    def _apply(self, members: frozenset[int], epoch: int, now: float) -> Step:
        if epoch <= self.set_epoch or self.broker_id not in members:
            return NOTHING
        joined = members - self.members
        self.members = members
        self.set_epoch = epoch
        # Proposals made on an older epoch can no longer take effect: the controller refuses
        # a stale epoch.
        self._unresolved = frozenset()
        self._dirty = True
        for broker_id in joined:
            if broker_id != self.broker_id:
                # A newcomer's time to keep up starts when it joins, as a member's named at
                # the term's start does: it was judged in sync when it was proposed.
                replica = self._replica(broker_id)
                if replica.caught_up is None or replica.caught_up < now:
                    replica.caught_up = now
        self._recount()
        return self._publish()

    # ---- what the puts and the consume queues see -------------------------------------------

    @property
    def union(self) -> frozenset[int]:
        """Every member the acks count over: the set, the proposal in flight, and proposals
        whose outcome is unknown."""
        union = self.members | self._unresolved
        if self.in_flight is not None:
            union |= self.in_flight.members
        return union

    @property
    def in_sync_count(self) -> int:
        """RocketMQ's inSyncReplicasNums: the set's size, or the proposed set's while one is
        in flight, whichever is larger."""
        in_flight = self.in_flight
        if in_flight is None:
            return len(self.members)
        return max(len(self.members), len(in_flight.members))

    @property
    def admits_puts(self) -> bool:
        """False: refuse a SYNC_MASTER put, IN_SYNC_REPLICAS_NOT_ENOUGH."""
        return self.in_sync_count >= self.min_in_sync_replicas

    @property
    def waits_for_slaves(self) -> bool:
        """Whether a put waits for slaves at all (else it is PUT_OK as it is appended)."""
        if self.all_ack:
            return bool(self._counted)
        return self.in_sync_replicas > 1

    def links(self) -> list[Link]:
        """The open connections (a copy: for statistics and tests)."""
        return [r.link for r in self._replicas.values() if r.link is not None]

    def replica(self, broker_id: int) -> Replica | None:
        return self._replicas.get(broker_id)

    # ---- counting ---------------------------------------------------------------------------

    def _replica(self, broker_id: int) -> Replica:
        replica = self._replicas.get(broker_id)
        if replica is None:
            replica = self._replicas[broker_id] = Replica(broker_id)
        return replica

    def _recount(self) -> None:
        """The union changed: mark whose acks count, and what they hold."""
        union = self.union
        for replica in self._replicas.values():
            replica.counted = False
        counted: list[Replica] = []
        for broker_id in union:
            if broker_id != self.broker_id:
                replica = self._replica(broker_id)
                replica.counted = True
                counted.append(replica)
        self._counted = tuple(counted)
        if self.all_ack:
            self._held = self._held_by_members()
        else:
            self._recount_any()

    def _held_by_members(self) -> int | None:
        """The lowest ack of the union's slaves (all_ack); None if one has none (#6662)."""
        if not self.all_ack:
            return self._held
        lowest: int | None = None
        for replica in self._counted:
            link = replica.link
            if link is None or link.acked is None:
                return None
            if lowest is None or link.acked < lowest:
                lowest = link.acked
        return self.max_offset if lowest is None else lowest

    def _recount_any(self) -> None:
        """``in_sync_replicas`` acks counting the master, from any connected slave."""
        needed = self.in_sync_replicas - 1
        if needed <= 0:
            self._held = _UNBOUNDED  # nothing to wait for
            return
        acks = sorted((r.link.acked for r in self._replicas.values()
                       if r.link is not None and r.link.acked is not None), reverse=True)
        self._held = acks[needed - 1] if len(acks) >= needed else 0

    def _publish(self) -> Step:
        """Raise the confirm offset and ``replicated`` to what the counted slaves hold (never
        lower them)."""
        held = self._held
        max_offset = self.max_offset
        if self.all_ack:
            if held is None:
                return NOTHING  # frozen: a member has no connection or no ack
            if not self._counted:
                held = max_offset
            confirm = replicated = held if held < max_offset else max_offset
        else:
            confirm = max_offset
            assert held is not None  # counted from any connection: never frozen
            replicated = held if held < max_offset else max_offset
        step = NOTHING
        if confirm > self.confirm_offset:
            self.confirm_offset = confirm
            step = RAISE
        if replicated > self.replicated:
            self.replicated = replicated
            step = RAISE
        return step
