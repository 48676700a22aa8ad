"""The replication ledger: which slave acks count, with no socket and no trio.

The rules of which acks answer SYNC_MASTER puts are the part of replication an attacker
aims at (RocketMQ issues #1155 and #3015: any peer that knew the log end could make a put
PUT_OK without a slave). They used to live inside the master's socket pumps, so they could
only be tested through sockets and trio. Here they are one pure object, as h11's
``_state.py`` and etcd's raft keep their rules apart from their I/O: the master's pumps
(``master.HAConnection`` and ``master.HAService``) step it with events and perform what it
answers, and the tests drive it alone with any sequence of events (tests/test_ha_ledger.py).

Events, each a method:

- ``admit``: a peer wants a slot. The answer is a new ``Account``, or None (refused: every
  slot is taken by a proven connection); an unproven account that had to make way for it is
  left in ``evicted`` for the pump to close.
- ``accept``: the connection's first report was accepted as a request (where its transfer
  starts and where the master's log ended then). A first report acknowledges nothing.
- ``handed_over``: a frame was handed to the transport; the slave may now hold up to its end.
- ``report``: a later report. Beyond what the connection was handed over it is an error;
  at or below its start it acknowledges nothing; else it confirms the bytes between.
- ``recheck``: time passed (the put that kept an ack from counting may be answered now).
- ``drop``: the connection ended (once or many times: only the first counts).

Outputs: ``replicated`` (what SYNC_MASTER puts wait for: ``report`` answers RAISE when it
rose; after ``recheck`` the pump raises its watermark to it), the accounts to evict, the
time to re-check an account whose ack could not count yet (``report`` answers RECHECK, and
``recheck`` the time), and ``is_slave_ok``, which says whether a put should wait at all.

Invariants (each pinned by a property test): ``replicated`` never goes backwards; it never
exceeds an offset that ``sync_acks`` distinct connections each acknowledged of bytes handed
to them on that connection; a connection is counted at most once however often it reports
or is dropped; at most ``max_connections`` accounts are open, and a proven one is never
evicted.

The ledger asks one question of the world, through ``oldest_waiting``: which put waits
longest (the group transfer service knows). It asks only while a connection is not counted
yet, so the per-ack path of a counted connection is a comparison, and a changed ack a
binary search and a move in a sorted list of at most ``max_connections`` entries.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable
from typing import Final, Protocol

import attrs

from ...wire.ha import HAProtocolError


class PendingPut(Protocol):
    """The oldest SYNC_MASTER put still waiting (``group_transfer.WaitingPut``): its bytes
    start at or after ``floor`` and end at ``end``; it is answered by ``deadline``."""

    @property
    def floor(self) -> int: ...

    @property
    def end(self) -> int: ...

    @property
    def deadline(self) -> float: ...


def no_put_waits() -> PendingPut | None:
    """``oldest_waiting`` of a master whose puts never wait for slaves."""
    return None


class Step(enum.Enum):
    """What a ``report`` asks of the pump (members, so no step allocates)."""

    #: nothing to do
    NOTHING = "nothing"
    #: raise the replicated watermark to ``ReplicationLedger.replicated``
    RAISE = "raise"
    #: the ack could not count yet: call ``recheck`` soon (the put in its way may be answered)
    RECHECK = "recheck"


# The members as module names, as ``wire.ha.NEED_DATA`` is: an enum member looked up on its
# class costs a descriptor call, several times a plain name's, and a report makes two or three.
NOTHING: Final = Step.NOTHING
RAISE: Final = Step.RAISE
RECHECK: Final = Step.RECHECK


@attrs.define(eq=False)
class Account:
    """What one connection was handed over, confirmed and counted. ``key`` is the pump's
    name for the connection (the ledger tells it which one to evict by it)."""

    key: int
    #: where the transfer starts, and the master's log end when the request was accepted
    start: int | None = None
    accepted_end: int | None = None
    #: the slave's last report since the request was accepted (its log end, as it says)
    acked: int | None = None
    #: the log end this connection's slave can hold: its start plus every frame handed over
    sent: int | None = None
    #: the end of the bytes this connection carried that the slave acknowledged
    confirmed: int | None = None
    #: its confirmed offset counts for ``replicated``
    counted: bool = False
    #: in the ledger (not dropped or evicted): only then do its events change anything
    open: bool = True

    @property
    def proven(self) -> bool:
        """Whether its peer acknowledged a byte this connection carried to it: what a slave
        does and a peer that restates an offset it learnt cannot. Once proven, for life."""
        return self.confirmed is not None


@attrs.define(eq=False)
class ReplicationLedger:
    """Per connection acks, and from them what SYNC_MASTER puts wait for."""

    #: ha_sync_acks, haSlaveFallbehindMax, ha_max_connections
    sync_acks: int
    fallbehind_max: int
    max_connections: int
    #: the oldest put still waiting, or None (``group_transfer.oldest_waiting``)
    oldest_waiting: Callable[[], PendingPut | None] = no_put_waits
    #: the ``sync_acks``-th highest confirmed offset among counted connections, ever
    replicated: int = 0
    #: accounts evicted to make room and not yet closed by the pump (it takes them)
    evicted: list[Account] = attrs.field(init=False, factory=list[Account])
    _open: int = attrs.field(init=False, default=0)
    #: the open accounts that are not proven yet, oldest first
    _unproven: dict[int, Account] = attrs.field(init=False, factory=dict[int, Account])
    #: acked offsets of open accepted accounts, sorted (``is_slave_ok``)
    _positions: list[int] = attrs.field(init=False, factory=list[int])
    #: confirmed offsets of open counted accounts, sorted (``replicated``)
    _confirmed: list[int] = attrs.field(init=False, factory=list[int])

    # ---- slots ------------------------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether ``admit`` would admit a newcomer now (judged before its handshake, so
        that a newcomer with no slot to win costs nothing)."""
        return self._open < self.max_connections or bool(self._unproven)

    def admit(self, key: int) -> Account | None:
        """A new account for connection ``key``, or None when every slot is held by a proven
        connection. With every slot taken but some unproven, the longest-unproven account is
        closed to make room and put in ``evicted``: the newest peer (a slave that just
        reconnected) then has the most time to prove itself, and a proven one never goes."""
        if self._open >= self.max_connections:
            if not self._unproven:
                return None
            victim = next(iter(self._unproven.values()))
            self.drop(victim)
            self.evicted.append(victim)
        account = Account(key)
        self._open += 1
        self._unproven[key] = account
        return account

    def drop(self, account: Account) -> None:
        """The connection ended: its acks leave the lists (once; later events change
        nothing)."""
        if not account.open:
            return
        account.open = False
        self._open -= 1
        self._unproven.pop(account.key, None)
        if account.acked is not None and account.start is not None:
            _remove(self._positions, account.acked)
        if account.counted and account.confirmed is not None:
            _remove(self._confirmed, account.confirmed)

    # ---- acks -------------------------------------------------------------------------------

    def accept(self, account: Account, requested: int, start: int, log_end: int) -> None:
        """The first report, ``requested``, was accepted: the transfer starts at ``start``,
        and the master's log ended at ``log_end``. It acknowledges nothing; as a report of
        where the slave's log ends it counts for ``is_slave_ok``."""
        account.start = account.sent = start
        account.accepted_end = log_end
        if account.open:
            account.acked = requested
            bisect.insort(self._positions, requested)

    def handed_over(self, account: Account, end: int) -> None:
        """A frame ending at ``end`` was handed to the transport (before the send returns:
        a fast slave can ack the bytes before the call does)."""
        account.sent = end

    def report(self, account: Account, offset: int) -> Step:
        """A report after the request. Raises HAProtocolError for an ack of bytes this
        connection never carried."""
        start, sent = account.start, account.sent
        if start is None or sent is None:
            return NOTHING  # the request was refused: the connection is ending
        if offset > sent:
            # RocketMQ #1155/#3015: acks must be of bytes this connection carried, or any
            # socket could make a SYNC_MASTER put succeed without a slave.
            raise HAProtocolError(
                f"slave acked offset {offset}, but this connection has carried the log only "
                f"up to {sent}"
            )
        old = account.acked
        if offset != old and account.open:
            assert old is not None  # set when the request was accepted
            _move(self._positions, old, offset)
            account.acked = offset
        if offset > start and (offset != account.confirmed or not account.counted):
            return self._confirm(account, offset)
        return NOTHING

    def recheck(self, account: Account) -> float | None:
        """Judge an account that could not count again (time passed: the put in its way may
        be answered). When it still cannot count, the time to judge it again: the deadline
        of the put in its way, by which that put is answered. None: counted, or nothing to
        judge. Whether ``replicated`` rose is for the caller to look at."""
        if account.counted or account.confirmed is None or not account.open:
            return None
        self._confirm(account, account.confirmed)
        # Judge first, then look at what stands in the way: the put that stood there may be
        # answered at the same deadline the caller woke at, and the put behind it must not
        # be mistaken for the blocker.
        if account.counted:
            return None
        waiting = self.oldest_waiting()
        return None if waiting is None else waiting.deadline

    def _confirm(self, account: Account, offset: int) -> Step:
        """The connection carried the log up to ``offset`` and its slave acknowledged it (or
        acknowledges it again, while the connection is not counted yet)."""
        if not account.open:
            return NOTHING
        self._unproven.pop(account.key, None)  # proven now
        if account.counted:
            old = account.confirmed
            assert old is not None  # a counted account has confirmed something
            _move(self._confirmed, old, offset)
        elif self._may_count(account):
            account.counted = True
            bisect.insort(self._confirmed, offset)
        else:
            account.confirmed = offset
            return RECHECK
        account.confirmed = offset
        needed = self.sync_acks
        confirmed = self._confirmed
        if len(confirmed) >= needed and confirmed[-needed] > self.replicated:
            self.replicated = confirmed[-needed]
            return RAISE
        return NOTHING

    def _may_count(self, account: Account) -> bool:
        """Whether the account carried every byte of every put still waiting: the oldest
        one appended after the request was accepted (so after its start), or starts at or
        after its start. Every later put then qualifies too."""
        waiting = self.oldest_waiting()
        if waiting is None:
            return True  # puts to come append after the log end, which is past the start
        start, accepted_end = account.start, account.accepted_end
        assert start is not None and accepted_end is not None  # set when accepted
        return waiting.end > accepted_end or start <= waiting.floor

    # ---- queries ----------------------------------------------------------------------------

    def is_slave_ok(self, end: int) -> bool:
        """Enough open slaves within ``fallbehind_max`` of ``end`` to wait for them."""
        positions = self._positions
        close = len(positions) - bisect.bisect_right(positions, end - self.fallbehind_max)
        return close >= self.sync_acks

    def counted_offsets(self) -> list[int]:
        """The confirmed offsets that count, sorted (a copy: for tests and statistics)."""
        return list(self._confirmed)

    def reported_offsets(self) -> list[int]:
        """The last reports of open accepted accounts, sorted (a copy)."""
        return list(self._positions)

    @property
    def open_accounts(self) -> int:
        return self._open


def _remove(values: list[int], value: int) -> None:
    """Remove one ``value`` from the sorted list ``values``."""
    del values[bisect.bisect_left(values, value)]


def _move(values: list[int], old: int, new: int) -> None:
    """Replace one ``old`` by ``new`` in the sorted list ``values``."""
    _remove(values, old)
    bisect.insort(values, new)
