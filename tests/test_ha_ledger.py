"""The replication ledger alone: which acks count, with no socket and no trio.

A hypothesis state machine plays every party at once — peers that connect, ask for any
offset, ack anything (backwards, beyond what they were sent, the log end they learnt), drop
and come back; frames handed over; SYNC_MASTER puts appended, answered when ``replicated``
passes them, or timed out — and after every step checks the ledger's invariants against its
own record of what each connection was sent and acknowledged. Which invariant each check
pins is said at the check (``LedgerMachine``). The socket-level tests (tests/test_ha*.py,
tests/test_takeover.py) keep testing the same rules through the pumps.
"""

from __future__ import annotations

import ast
import pathlib

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from trio_ha.store.ha import ledger as ledger_module
from trio_ha.store.ha.ledger import Account, ReplicationLedger, Step
from trio_ha.wire.ha import HAProtocolError


@attrs.frozen
class Put:
    floor: int
    end: int
    deadline: float


@attrs.define
class Puts:
    """The group transfer service, as the ledger sees it: the waiting puts, oldest first."""

    waiting: list[Put] = attrs.field(factory=list)

    def oldest(self) -> Put | None:
        return self.waiting[0] if self.waiting else None


@attrs.define
class Peer:
    """What the test knows of one connection, apart from the ledger."""

    account: Account
    start: int | None = None
    sent: int | None = None
    #: the highest offset it acknowledged of bytes handed to it on this connection
    best_ack: int | None = None
    proven: bool = False


class LedgerMachine(RuleBasedStateMachine):
    peers = Bundle("peers")

    @initialize(sync_acks=st.integers(1, 2), max_connections=st.integers(1, 4),
                fallbehind=st.integers(1, 300), log_end=st.integers(0, 200),
                put_waits=st.integers(0, 40))
    def setup(self, sync_acks: int, max_connections: int, fallbehind: int,
              log_end: int, put_waits: int) -> None:
        self.puts = Puts()
        self.ledger = ReplicationLedger(sync_acks=sync_acks, fallbehind_max=fallbehind,
                                        max_connections=max_connections,
                                        oldest_waiting=self.puts.oldest)
        self.log_end = log_end
        self.now = 0.0
        self.all_peers: list[Peer] = []
        self.last_replicated = 0
        self.evicted_proven: list[Peer] = []
        if put_waits:  # a put from before any slave connected still waits
            self.append(put_waits, waits=True)

    # ---- the world's events -----------------------------------------------------------------

    @rule(size=st.integers(1, 50), waits=st.booleans())
    def append(self, size: int, waits: bool) -> None:
        """A put appends; a SYNC_MASTER one waits for slaves (asynchronous ones do not)."""
        floor = self.log_end
        self.log_end += size
        if waits:
            self.puts.waiting.append(Put(floor, self.log_end, self.now + 3.0))

    @precondition(lambda self: self.puts.waiting)
    @rule()
    def time_out_oldest(self) -> None:
        """The oldest put reaches its deadline: FLUSH_SLAVE_TIMEOUT, and time passes."""
        put = self.puts.waiting.pop(0)
        self.now = max(self.now, put.deadline)

    @rule(target=peers)
    def connect(self) -> object:
        return self._connect()

    @rule(target=peers, data=st.data())
    def connect_and_request(self, data: st.DataObject) -> object:
        """A slave's usual start: it connects and reports where its log ends at once — the
        log end, or (one that reconnects) somewhere in the puts still waiting."""
        peer = self._connect()
        if isinstance(peer, Peer):
            self.first_report(peer, data, edges_only=True)
        return peer

    def _connect(self) -> object:
        by_key = {p.account.key: p for p in self.all_peers}
        account = self.ledger.admit(len(self.all_peers))
        for victim in self.ledger.evicted:
            peer = by_key[victim.key]
            if peer.proven:
                self.evicted_proven.append(peer)
        self.ledger.evicted.clear()
        if account is None:
            # Refused: only when every slot is held by a proven connection.
            assert all(p.proven for p in self.all_peers if p.account.open)
            return multiple()  # nothing joins the bundle
        peer = Peer(account)
        self.all_peers.append(peer)
        return peer

    @rule(peer=peers, data=st.data())
    def first_report(self, peer: Peer, data: st.DataObject, edges_only: bool = False) -> None:
        """The first report: a request the master serves (as the pump decides: a start within
        the log) or refuses. It acknowledges nothing. Drawn mostly at the edges that matter:
        the log end, and the bytes of the waiting puts."""
        if peer.start is not None:
            return
        edges = []
        for put in self.puts.waiting:
            edges += [put.floor + 1, put.end - 1, put.floor, put.end]
        edges += [self.log_end, 0, self.log_end + 1]
        request = data.draw(st.sampled_from(edges) if edges_only
                            else st.one_of(st.sampled_from(edges),
                                           st.integers(0, self.log_end + 50)))
        start = request if request <= self.log_end else None
        if start is None:
            return  # refused: the writer ends the connection, the ledger is not told
        self.ledger.accept(peer.account, request, start, self.log_end)
        peer.start = peer.sent = start
        # The first report is a request: nothing is confirmed by it.
        assert peer.account.confirmed is None

    @rule(peer=peers, size=st.one_of(st.none(), st.integers(1, 60)))
    def hand_over(self, peer: Peer, size: int | None) -> None:
        """A frame goes out: ``size`` bytes, or (None) all that the log has."""
        if peer.sent is None or peer.sent >= self.log_end:
            return
        peer.sent = self.log_end if size is None else min(self.log_end, peer.sent + size)
        self.ledger.handed_over(peer.account, peer.sent)

    @rule(peer=peers)
    def catch_up(self, peer: Peer) -> None:
        """A slave's round: it is sent all the log has and acknowledges all of it."""
        if peer.sent is None:
            return
        if peer.sent < self.log_end:
            self.hand_over(peer, None)
        self._report(peer, peer.sent)

    @rule(peer=peers, data=st.data())
    def report(self, peer: Peer, data: st.DataObject) -> None:
        """Any report at all: within what it was sent, the log end it learnt, backwards,
        beyond — a pump that checked nothing before the ledger."""
        choices = [st.integers(0, self.log_end + 50), st.just(self.log_end)]
        if peer.sent is not None and peer.start is not None:
            choices += [st.sampled_from([peer.sent, peer.start + 1, peer.start, peer.sent + 1]),
                        st.integers(max(0, peer.sent - 20), peer.sent)]
        self._report(peer, data.draw(st.one_of(*choices)))

    def _report(self, peer: Peer, offset: int) -> None:
        replicated_before = self.ledger.replicated
        if peer.sent is not None and offset > peer.sent:
            # An ack of bytes this connection never carried is a protocol error.
            with pytest.raises(HAProtocolError):
                self.ledger.report(peer.account, offset)
            return
        step = self.ledger.report(peer.account, offset)
        # RAISE exactly when ``replicated`` rose.
        assert (step is Step.RAISE) == (self.ledger.replicated > replicated_before)
        if (peer.start is not None and peer.sent is not None and offset > peer.start
                and peer.account.open):
            peer.proven = True
            peer.best_ack = max(peer.best_ack or 0, offset)
        self._answer_puts()

    @rule(peer=peers)
    def recheck(self, peer: Peer) -> None:
        """Time passed for an ack that could not count: judged again."""
        due = self.ledger.recheck(peer.account)
        if due is not None:
            # Still not counted: it is told to look again at the blocking put's deadline.
            oldest = self.puts.oldest()
            assert not peer.account.counted and oldest is not None and due == oldest.deadline
        self._answer_puts()

    @rule(peer=consumes(peers), twice=st.booleans())
    def drop(self, peer: Peer, twice: bool) -> None:
        self.ledger.drop(peer.account)
        if twice:
            self.ledger.drop(peer.account)  # an evicted connection's tasks end later

    def _answer_puts(self) -> None:
        """The group transfer service answers every waiting put ``replicated`` passed. Each
        must have been carried whole and acknowledged by ``sync_acks`` connections: the
        security invariant, per put (RocketMQ #1155/#3015)."""
        waiting = self.puts.waiting
        while waiting and waiting[0].end <= self.ledger.replicated:
            put = waiting.pop(0)
            carriers = [p for p in self.all_peers
                        if p.start is not None and p.start <= put.floor
                        and p.best_ack is not None and p.best_ack >= put.end]
            assert len(carriers) >= self.ledger.sync_acks, (put, self.all_peers)

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def replicated_never_goes_backwards(self) -> None:
        """What a put was told stays true: ``replicated`` only rises."""
        assert self.ledger.replicated >= self.last_replicated
        self.last_replicated = self.ledger.replicated

    @invariant()
    def replicated_is_acknowledged_by_enough_connections(self) -> None:
        """``replicated`` never exceeds an offset that ``sync_acks`` distinct connections each
        acknowledged of bytes handed to them on that connection."""
        replicated = self.ledger.replicated
        if replicated:
            acks = [p.best_ack for p in self.all_peers if p.best_ack is not None]
            assert sum(a >= replicated for a in acks) >= self.ledger.sync_acks

    @invariant()
    def no_connection_counts_twice(self) -> None:
        """The counted offsets are exactly one per open counted account (dropped ones and
        repeated reports add nothing); the same for the reports ``is_slave_ok`` reads."""
        open_peers = [p for p in self.all_peers if p.account.open]
        assert self.ledger.counted_offsets() == sorted(
            p.account.confirmed for p in open_peers
            if p.account.counted and p.account.confirmed is not None)
        assert self.ledger.reported_offsets() == sorted(
            p.account.acked for p in open_peers if p.account.acked is not None)
        assert self.ledger.open_accounts == len(open_peers)

    @invariant()
    def slots_hold_and_proven_connections_stay(self) -> None:
        """At most ``max_connections`` open accounts; a proven one is never evicted; proven
        is for life."""
        assert self.ledger.open_accounts <= self.ledger.max_connections
        assert self.evicted_proven == []
        for peer in self.all_peers:
            assert peer.account.proven == peer.proven

    @invariant()
    def is_slave_ok_counts_close_slaves(self) -> None:
        """Whether a put waits counts the open accepted connections whose last report is
        within ``fallbehind_max`` of its end, each once."""
        ledger = self.ledger
        for end in (0, self.log_end, self.log_end + ledger.fallbehind_max):
            close = sum(1 for p in self.all_peers
                        if p.account.open and p.account.acked is not None
                        and p.account.acked > end - ledger.fallbehind_max)
            assert ledger.is_slave_ok(end) == (close >= ledger.sync_acks)


LedgerMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=40,
                                           deadline=None)
test_ledger_invariants = LedgerMachine.TestCase


# ---- the rules, one scenario each -----------------------------------------------------------


def ledger_with(puts: Puts, *, sync_acks: int = 1, max_connections: int = 4) -> ReplicationLedger:
    return ReplicationLedger(sync_acks=sync_acks, fallbehind_max=1000,
                             max_connections=max_connections, oldest_waiting=puts.oldest)


def accepted(ledger: ReplicationLedger, key: int, start: int, log_end: int) -> Account:
    account = ledger.admit(key)
    assert account is not None
    ledger.accept(account, start, start, log_end)
    return account


def test_a_peer_that_restates_the_log_end_acknowledges_nothing():
    """Pins: the first report is a request; a report at the start confirms nothing."""
    puts = Puts([Put(100, 150, 5.0)])
    ledger = ledger_with(puts)
    squatter = accepted(ledger, 0, 150, 150)
    assert ledger.report(squatter, 150) is Step.NOTHING
    assert squatter.confirmed is None and not squatter.counted and not squatter.proven
    assert ledger.replicated == 0


def test_an_ack_past_what_the_connection_carried_is_an_error():
    ledger = ledger_with(Puts())
    account = accepted(ledger, 0, 100, 100)
    ledger.handed_over(account, 120)
    with pytest.raises(HAProtocolError, match="carried the log only up to 120"):
        ledger.report(account, 121)
    assert ledger.report(account, 120) is Step.RAISE and ledger.replicated == 120


def test_a_put_from_before_the_connection_started_keeps_its_acks_from_counting_until_answered():
    """Pins the re-check: the put in the way is named by its deadline; once it is answered,
    the same ack counts without a new report."""
    puts = Puts([Put(50, 100, 7.0)])
    ledger = ledger_with(puts)
    account = accepted(ledger, 0, 80, 100)  # started inside the waiting put
    ledger.handed_over(account, 130)
    assert ledger.report(account, 130) is Step.RECHECK
    assert account.proven and not account.counted and ledger.replicated == 0
    assert ledger.recheck(account) == 7.0
    puts.waiting.pop(0)  # timed out
    assert ledger.recheck(account) is None
    assert account.counted and ledger.replicated == 130


def test_two_acks_needed_count_two_connections_not_one_twice():
    ledger = ledger_with(Puts(), sync_acks=2)
    one, two = accepted(ledger, 0, 0, 0), accepted(ledger, 1, 0, 0)
    for account in (one, two):
        ledger.handed_over(account, 40)
    assert ledger.report(one, 30) is Step.NOTHING
    assert ledger.report(one, 40) is Step.NOTHING  # the same connection again
    assert ledger.replicated == 0
    assert ledger.report(two, 20) is Step.RAISE and ledger.replicated == 20
    ledger.drop(one)
    ledger.drop(one)
    assert ledger.counted_offsets() == [20] and ledger.replicated == 20


def test_the_longest_unproven_connection_makes_way_and_a_proven_one_never_does():
    ledger = ledger_with(Puts(), max_connections=2)
    proven, squatter = accepted(ledger, 0, 0, 10), accepted(ledger, 1, 10, 10)
    ledger.handed_over(proven, 10)
    ledger.report(proven, 10)
    assert ledger.has_room()
    newcomer = ledger.admit(2)
    assert newcomer is not None and ledger.evicted == [squatter] and not squatter.open
    ledger.evicted.clear()
    ledger.accept(newcomer, 0, 0, 10)
    ledger.handed_over(newcomer, 5)
    ledger.report(newcomer, 5)  # an ack of bytes it was carried proves it
    assert newcomer.proven
    assert not ledger.has_room() and ledger.admit(3) is None and ledger.evicted == []


def test_the_ledger_imports_no_io():
    """The ledger is sans-I/O: no trio, no sockets, nothing of the store's files."""
    tree = ast.parse(pathlib.Path(ledger_module.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not {name for name in imported
                if name.split(".")[0] in {"trio", "socket", "os", "selectors"}
                or name.lstrip(".").split(".")[0] in {"commitlog", "segment", "transfer"}}
    assert imported  # the walk saw the imports
