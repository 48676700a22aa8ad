# pyright: strict
"""The replicated controller's parts on etcd (issue 39): its key scheme, StateStore, leadership.

Several of our controllers share one state by keeping it in etcd, an existing consensus
engine, instead of a consensus of ours. They talk to etcd through ``etcd_client`` (a small v3
client over the JSON gateway); this module is what the controller builds on it:

- :class:`EtcdKeys` is where one group of controllers keeps its things: records under
  ``<prefix>state/``, the election under ``<prefix>leader``.
- :class:`EtcdStateStore` is the StateStore protocol (``state_store.py``) over the keys under
  one prefix: a record's version is its key's ``mod_revision``, and a commit is one etcd
  transaction whose compares are the versions the rules read (``create_revision == 0`` for
  "must not exist"). Revisions only grow, a deleted and recreated key included, so a
  controller that decided from a stale read always loses to the one that committed first:
  two controllers can never both grant from the same state (two masters for one epoch).
  With a ``fence`` (the leadership), every commit also compares the leader key's
  ``create_revision``, so a deposed leader's late commit fails as :class:`LeadershipLost`.
- :class:`EtcdLeadership` campaigns on etcd's election API with a lease it keeps alive. Its
  leadership is valid locally until the last keepalive's send time plus the lease's TTL, a
  point never later than etcd's own expiry, so a leader cut off from etcd stops granting
  (``is_leader`` turns false, ``wait_deposed`` returns) before any other controller can be
  elected; a revoked or expired lease is noticed at the next keepalive (a third of the TTL).
  Followers read the leader's value, its controller address, for their NOT_LEADER answers.
- :class:`ControllerLeadership` is that candidacy as the controller server's ``Leadership``:
  a term is served only once its records are read, and a follower keeps the leader's address
  and the records current.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from .._errors import TrioHAError, unwrap_single_exception
from .etcd_client import (
    EtcdClient,
    EtcdError,
    EtcdRequestError,
    EtcdUnavailable,
    Json,
    LeaderKey,
    TxnResult,
    compare_create_revision,
    compare_mod_revision,
    op_delete,
    op_put,
    op_range,
    range_response,
)
from .state_store import CommitConflict, Versioned, Write

__all__ = [
    "ControllerLeadership",
    "EtcdKeys",
    "EtcdLeadership",
    "EtcdStateStore",
    "LeadershipLost",
    "open_etcd_leadership",
]

log = logging.getLogger(__name__)


class LeadershipLost(EtcdError, RuntimeError):
    """This controller does not lead (any more): a fenced commit wrote nothing."""



# --- the key scheme --------------------------------------------------------------------------


@attrs.frozen
class EtcdKeys:
    """Where one group of controllers keeps its things in etcd (docs/controller.md, "etcd"):
    its records under ``<prefix>state/``, its election's candidacies under
    ``<prefix>leader/``. Groups with different prefixes share one etcd without meeting."""

    #: ``controllerEtcdKeyPrefix``
    prefix: str = "/trio-ha/controller/"

    def __attrs_post_init__(self) -> None:
        if not self.prefix.endswith("/"):
            raise ValueError(f"an etcd key prefix ends with '/': {self.prefix!r}")

    @property
    def state(self) -> str:
        """The StateStore's prefix: a record named ``k`` is the key ``<prefix>state/k``."""
        return self.prefix + "state/"

    @property
    def election(self) -> str:
        """The election's name: candidacies are ``<prefix>leader/<lease id in hex>``."""
        return self.prefix + "leader"




# --- the StateStore --------------------------------------------------------------------------


@attrs.define(eq=False)
class EtcdStateStore:
    """The controller's records under ``prefix`` in etcd (see the module's docstring). A
    record's key is ``prefix`` + its name (UTF-8); its version, the key's mod_revision."""

    client: EtcdClient
    prefix: str
    #: when set, commits succeed only while it leads (its leader key still stands)
    fence: EtcdLeadership | None = None

    def _key(self, name: str) -> bytes:
        return (self.prefix + name).encode()

    async def load(self) -> Mapping[str, Versioned]:
        prefix = self.prefix.encode()
        _, kvs = await self.client.get_prefix(prefix)
        return {kv.key[len(prefix):].decode(): Versioned(kv.mod_revision, kv.value)
                for kv in kvs}

    async def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        names = [w.key for w in writes]
        if len(set(names)) != len(names):
            raise ValueError(f"a commit writes each record once: {sorted(names)}")
        compares: list[Json] = []
        success: list[Json] = []
        for write in writes:
            key = self._key(write.key)
            if write.expected_version == 0:
                compares.append(compare_create_revision(key, 0))
            else:
                compares.append(compare_mod_revision(key, write.expected_version))
            success.append(op_delete(key) if write.value is None else op_put(key, write.value))
        failure: list[Json] = []
        leader: LeaderKey | None = None
        if self.fence is not None:
            leader = self.fence.leader_key
            if leader is None:
                await trio.lowlevel.checkpoint()
                raise LeadershipLost("not the controller leader: nothing committed")
            compares.append(compare_create_revision(leader.key, leader.rev))
            failure.append(op_range(leader.key))
        if not writes and leader is None:
            await trio.lowlevel.checkpoint()
            return {}
        result = await self.client.txn(compares, success, failure)
        if not result.succeeded:
            if leader is not None and not _leader_stands(result, leader):
                raise LeadershipLost("the controller leadership moved on (its etcd leader key "
                                     "is gone): nothing committed")
            if result.retried:
                landed = await self._landed(writes)
                if landed is not None:
                    return landed
            raise CommitConflict(f"a record changed since it was read (one of "
                                 f"{', '.join(sorted(names))}): nothing committed")
        return {w.key: result.revision for w in writes if w.value is not None}

    async def _landed(self, writes: Sequence[Write]) -> Mapping[str, int] | None:
        """After a commit that failed its compares on a second attempt: whether the first
        attempt was applied after all. It was if the records are now exactly what it wrote,
        in one revision (a transaction's writes share it) past every version it expected;
        the commit's result then, else None. (Another controller writing the very same
        bytes at once would pass too: then both granted the same thing, which is no
        conflict.)"""
        result = await self.client.txn([], [op_range(self._key(w.key)) for w in writes])
        revisions: set[int] = set()
        for write, response in zip(writes, result.responses, strict=True):
            kvs = range_response(response) or []
            if write.value is None:
                if kvs:
                    return None
                continue
            if len(kvs) != 1 or kvs[0].value != write.value:
                return None
            if kvs[0].mod_revision <= write.expected_version:
                return None
            revisions.add(kvs[0].mod_revision)
        if len(revisions) > 1:
            return None
        return {w.key: revision for w in writes if w.value is not None
                for revision in revisions}


def _leader_stands(result: TxnResult, leader: LeaderKey) -> bool:
    """Whether a failed fenced txn's range (its failure branch) still finds our leader key."""
    for response in result.responses:
        kvs = range_response(response)
        if kvs is not None:
            return any(kv.create_revision == leader.rev for kv in kvs)
    return False


# --- leadership ------------------------------------------------------------------------------


@attrs.define(eq=False)
class EtcdLeadership:
    """This controller's candidacy in an etcd election (see the module's docstring). Open
    it with :func:`open_etcd_leadership`; it campaigns until it leads, leads while its lease
    lives, and campaigns again with a new lease if it loses it."""

    client: EtcdClient
    #: the election's name (its candidacies are keys under ``election/``)
    election: bytes
    #: our controller address: what followers name in NOT_LEADER answers
    address: str
    #: the lease's TTL in seconds
    ttl: int = 3
    #: how long one campaign request may wait on one member before it is sent again (a
    #: stopped member would otherwise hold a candidate forever)
    campaign_wait: float = 10.0
    _leader: LeaderKey | None = attrs.field(default=None, init=False)
    #: our leadership holds until then (trio's clock): the last keepalive's send time + TTL
    _valid_until: float = attrs.field(default=-math.inf, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: the running candidacy (one lease): cancelled to start over
    _candidacy: trio.CancelScope | None = attrs.field(default=None, init=False)
    #: times this candidacy was elected (a new term each time)
    terms: int = attrs.field(default=0, init=False)

    @property
    def is_leader(self) -> bool:
        """Whether we lead now: elected, and our lease certainly alive."""
        return self._leader is not None and trio.current_time() < self._valid_until

    @property
    def leader_key(self) -> LeaderKey | None:
        """Our leader key while we lead (what fenced commits compare), else None."""
        return self._leader if self.is_leader else None

    async def wait_leading(self) -> None:
        """Return once we lead."""
        while not self.is_leader:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()

    async def wait_deposed(self) -> None:
        """Return once we do not lead (at once if we do not)."""
        while self.is_leader:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()

    async def leader_address(self) -> str | None:
        """The leading controller's address as etcd has it now (ours when we lead), or None
        while nobody leads."""
        kv = await self.client.leader(self.election)
        return None if kv is None else kv.value.decode(errors="replace")

    def _set_leader(self, leader: LeaderKey | None) -> None:
        if leader is not None:
            self.terms += 1
        self._leader = leader
        self._changed.set()
        self._changed = trio.Event()

    async def run(self) -> None:
        """Lease, campaign, lead; again whenever the lease is lost. Runs until cancelled
        (:func:`open_etcd_leadership` runs it in its nursery)."""
        while True:
            # etcd starts the lease's clock when the grant reaches it, after this instant:
            # validity counted from here ends first.
            asked = trio.current_time()
            try:
                lease, granted = await self.client.lease_grant(self.ttl)
            except EtcdError:
                await trio.sleep(self.ttl / 3)
                continue
            self._valid_until = asked + granted
            try:
                async with trio.open_nursery() as nursery:
                    self._candidacy = nursery.cancel_scope
                    nursery.start_soon(self._keep_alive, lease, granted, nursery.cancel_scope)
                    nursery.start_soon(self._campaign, lease, nursery.cancel_scope)
            finally:
                self._candidacy = None
                self._set_leader(None)
                self._valid_until = -math.inf
                with trio.move_on_after(self.client.config.request_timeout) as scope:
                    scope.shield = True
                    try:  # a lease we stopped renewing: let the next candidate in now
                        await self.client.lease_revoke(lease, call_timeout=scope.deadline
                                                       - trio.current_time())
                    except EtcdError:
                        pass

    async def _keep_alive(self, lease: int, ttl: int, scope: trio.CancelScope) -> None:
        """Renew the lease every third of its TTL; when it is gone (etcd says so, or no
        renewal got through before our validity ran out), cancel ``scope``: the candidacy
        ends and a new one begins."""
        try:
            while True:
                await trio.sleep(max(0.05, ttl / 3))
                renewed = False
                with trio.move_on_at(self._valid_until):
                    while not renewed:
                        sent = trio.current_time()
                        try:
                            remaining = self._valid_until - sent
                            left = await self.client.lease_keepalive(lease,
                                                                     call_timeout=remaining)
                        except EtcdUnavailable:
                            await trio.sleep(0.05)
                            continue
                        if left <= 0:
                            return  # revoked or expired in etcd
                        self._valid_until = sent + left
                        renewed = True
                if not renewed:
                    return  # validity ran out before etcd heard from us
        finally:
            scope.cancel()

    async def _campaign(self, lease: int, scope: trio.CancelScope) -> None:
        """Campaign until elected. etcd refusing the candidacy (its lease gone, mostly)
        cancels ``scope``: the candidacy starts over with a new lease."""
        while True:
            try:
                leader = await self.client.campaign(self.election, lease,
                                                    self.address.encode(),
                                                    wait=self.campaign_wait)
            except EtcdUnavailable:
                continue  # no answer in campaign_wait (also: still a follower): again
            except EtcdRequestError:
                scope.cancel()
                return
            self._set_leader(leader)
            return

    async def resign(self) -> None:
        """Step down: stop leading at once, give the lease back (its candidacy key goes
        with it, so the next candidate leads), and stand again with a new lease, behind
        the candidates already waiting. (To leave for good, leave
        :func:`open_etcd_leadership`.)"""
        self._set_leader(None)
        self._valid_until = -math.inf
        if self._candidacy is not None:
            self._candidacy.cancel()
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_etcd_leadership(client: EtcdClient, election: str, address: str, *,
                               ttl: int = 3,
                               campaign_wait: float = 10.0,
                               ) -> AsyncGenerator[EtcdLeadership, None]:
    """Campaign in ``election`` (a name of its own in etcd's keyspace) as ``address`` for as
    long as the block runs; on exit, stop leading and give the lease back (so the next
    candidate leads at once, not a TTL later)."""
    if ttl < 1:
        raise ValueError("the leadership lease's TTL is at least one second")
    leadership = EtcdLeadership(client, election.encode(), address, ttl, campaign_wait)
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leadership.run)
            try:
                yield leadership
            finally:
                nursery.cancel_scope.cancel()


# --- the controller's view of the election ----------------------------------------------------

#: how often a follower asks etcd who leads and reads the records again (seconds)
FOLLOW_INTERVAL = 0.5


@attrs.define(eq=False)
class ControllerLeadership:
    """An :class:`EtcdLeadership` as the controller server's ``Leadership`` (is_leader,
    leader_address, leader_id: plain properties, read at every request).

    Two things are added to the candidacy, both done by :meth:`run`:

    - **A term is served only once its records are read.** When the candidacy is elected,
      ``gained`` (the service's ``leadership_gained``: read the records the previous leader
      wrote, restart the start-up grace) runs first; ``is_leader`` stays false until it
      returned for this very term, so no request is decided from the state of before.
    - **A follower knows who leads, and what the leader wrote.** Every
      :data:`FOLLOW_INTERVAL` it asks etcd for the election's leader (the address NOT_LEADER
      names) and calls ``follow`` (the service reads the records again): its heartbeat table
      counts only members of known sets, so a set created after this controller started
      would otherwise go uncounted here, and a new leader would not know who is alive.

    etcd unreachable: the last known leader is kept, and the candidacy's own clock ends our
    leadership (its lease is not renewed); nothing here waits longer than one etcd call."""

    candidacy: EtcdLeadership
    #: controllerDLegerSelfId: GET_METADATA_INFO's controllerLeaderId while we lead
    self_id: str
    _ready_term: int = attrs.field(default=0, init=False)
    _leader_address: str | None = attrs.field(default=None, init=False)

    @property
    def is_leader(self) -> bool:
        return self.candidacy.is_leader and self.candidacy.terms == self._ready_term

    @property
    def leader_address(self) -> str | None:
        if self.is_leader:
            return self.candidacy.address
        return self._leader_address

    @property
    def leader_id(self) -> str | None:
        # Another controller's id is not in the election (its value is the address brokers
        # need): followers name the leader by address alone.
        return self.self_id if self.is_leader else None

    async def lost(self) -> None:
        """A commit found our leader key gone while we believed we led (``LeadershipLost``:
        it was deleted, or our lease expired while we were paused): step down now and stand
        again, rather than go on answering from a term etcd has ended."""
        if self.candidacy.is_leader:
            log.warning("controller: a commit found this controller deposed; standing again")
            await self.candidacy.resign()
        else:
            await trio.lowlevel.checkpoint()

    async def run(self, gained: Callable[[], Awaitable[None]],
                  follow: Callable[[], Awaitable[None]], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: serve each term once ``gained`` returned for it; while not
        leading, keep the leader's address and (``follow``) the records current."""
        candidacy = self.candidacy
        task_status.started()
        while True:  # until cancelled; each round waits or makes one bounded etcd call
            term = candidacy.terms
            if candidacy.is_leader and term != self._ready_term:
                try:
                    await gained()
                except EtcdError as exc:
                    log.warning("controller: elected, but the records could not be read "
                                "(%s); trying again", exc)
                    await trio.sleep(FOLLOW_INTERVAL)
                    continue
                if candidacy.terms == term:
                    self._ready_term = term
                    # the last leader we know, once this term ends, until etcd says who
                    self._leader_address = candidacy.address
                    log.info("controller: leading (term %d) as %s", term, candidacy.address)
                continue
            if self.is_leader:
                with trio.move_on_after(FOLLOW_INTERVAL):
                    await candidacy.wait_deposed()
                if not candidacy.is_leader:
                    log.warning("controller: no longer the leader")
                continue
            try:
                self._leader_address = await candidacy.leader_address()
                if not candidacy.is_leader:
                    await follow()
            except TrioHAError as exc:  # etcd unreachable, or a record damaged
                log.debug("controller: following: %s", exc)
            with trio.move_on_after(FOLLOW_INTERVAL):
                await candidacy.wait_leading()
