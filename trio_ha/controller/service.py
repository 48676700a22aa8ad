"""Performing the rules' decisions: commit, then answer, then tell the brokers.

The rules (``rules.py``) are pure: a request read against the state gives a ``Decision``.
This module is the thin trio adapter that makes decisions true, the way etcd's raft node
wraps its pure state machine:

- **Commit before answering.** A decision that changes records is committed through the
  StateStore first; the answer leaves only after ``commit`` returned (durable). On
  ``CommitConflict`` (another controller, or a stale read) the records are read again and the
  request decided again, at most ``MAX_COMMIT_ATTEMPTS`` times; a decision that could not be
  committed is never answered (the request fails with ``ControllerUnavailable``).
- **One writer at a time.** Requests that may change records run under one lock, so two
  requests of this controller never decide from the same state and race at the store (the
  conflict path stays for other controllers). Reads (GET_REPLICA_INFO, GET_SYNC_STATE_DATA,
  GET_NEXT_BROKER_ID) and heartbeats take no lock: they read the last committed state, an
  immutable value.
- **Notices in the background.** NOTIFY_BROKER_ROLE_CHANGED goes one way to each alive
  member after the commit, from a task of its own with a 3 s limit per notice (RocketMQ's),
  so a dead broker never delays an answer; a lost notice is covered by the brokers' poll of
  GET_REPLICA_INFO every 5 s. The queue is bounded: past it, notices are dropped and counted.
- **The controller's own elections.** A broker is dead when its connection closes
  (``connection_closed``, RocketMQ's onBrokerChannelClose) or its heartbeat expires; if it
  was its set's master, an election runs (``controller_elect``), tried up to
  ``electMasterMaxRetryCount`` times 3 s apart while it fails for want of a store, one task
  per set at a time.
- **Elections commit together.** The elections waiting when one can be decided are decided
  and committed as one (``_run_elections``), as a store's group commit does with puts: ten
  masters that die at once cost one commit and a second for the late ones, not ten in a row
  (``bench controller`` showed the tenth group waiting for nine commits: 80 ms on the journal,
  over 500 ms on a busy etcd). Each set is decided on its own within the batch (a set whose
  rule fails is that set's failure alone), and each election task retries as before.

Scanning: RocketMQ scans for expired heartbeats every ``scanNotActiveBrokerInterval`` (5 s),
so a hung master is found dead between its timeout and its timeout + 5 s. Ours sleeps until
the earliest entry of the heartbeat table is due to expire, or at most the interval, so a
paused master is found dead at its timeout (+ a few ms) and its successor is elected then:
issue 39's "a new master within the heartbeat timeout + 1 s". A scan is a walk over a table of
a few entries per broker; waking at each expiry costs nothing that matters.

Start-up grace: after the controller starts (or becomes leader) its heartbeat table is empty,
and the brokers' heartbeats arrive over the next second in no order. The periodic "master
dead while a member lives" re-election (RocketMQ's scanInactiveMasterAndTriggerReelect)
waits one default heartbeat timeout (10 s) before it runs, so a slave heard before its master
is not elected over a master that is alive. Deaths seen (a closed connection, an expired
entry) are acted on at once: they are of brokers that were heard.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Hashable

import attrs
import trio

from .._errors import TrioHAError
from ..remoting import RemotingClientPool, RemotingError
from ..wire.controller import (
    SPECS,
    BrokerHeartbeatRequestHeader,
    ElectMasterResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
)
from ..wire.remoting import RemotingCommand, RequestCode, ResponseCode
from .config import ControllerServerConfig
from .leadership import Leadership
from .liveness import (
    DEFAULT_HEARTBEAT_TIMEOUT_MS,
    MAX_HEARTBEAT_TIMEOUT_MS,
    BrokerIdentity,
    HeartbeatTable,
)
from .rules import (
    ControllerState,
    Decision,
    RecordChange,
    RoleChangeNotice,
    accept_heartbeat,
    controller_elect,
    sets_to_reelect,
)
from .state_store import CommitConflict, StateStore

__all__ = [
    "ControllerService",
    "ControllerStatistics",
    "ControllerUnavailable",
    "Decide",
]

log = logging.getLogger(__name__)

#: decide, commit; on a conflict read again and decide again, at most this often
MAX_COMMIT_ATTEMPTS = 5
#: seconds between two tries of one election (RocketMQ waits 3 s)
ELECT_RETRY_WAIT = 3.0
#: a role-change notice gets this long to connect and be written (RocketMQ's 3 s)
NOTICE_TIMEOUT = 3.0
#: notices waiting to be sent, at most; and sent at once, at most
NOTICE_QUEUE = 1024
NOTICE_CONCURRENCY = 16
#: the scan wakes this long after the earliest expiry (an entry counts until *after* it)
EXPIRY_SLACK = 0.005
#: and never sooner than this after the last scan (a table of already-expired entries
#: must not spin)
MIN_SCAN_GAP = 0.05
#: the periodic re-election waits this long after the start (see the module's docstring)
REELECT_GRACE = DEFAULT_HEARTBEAT_TIMEOUT_MS / 1000

#: a rule applied to the state and ``now``; None: nothing to do
Decide = Callable[[ControllerState, float], Decision | None]


class ControllerUnavailable(TrioHAError, RuntimeError):
    """A decision could not be committed (the store kept conflicting, or failed)."""


@attrs.frozen
class ControllerStatistics:
    """A snapshot of what the controller did and sees."""

    #: elections that made a master (any requester)
    elections: int
    #: elections the controller started itself (a dead master), whatever their outcome
    controller_elections: int
    heartbeats: int
    brokers_alive: int
    #: broker sets known
    sets: int
    commits: int
    conflicts: int
    notices_sent: int
    notices_failed: int
    notices_dropped: int


@attrs.define(eq=False)
class _ElectionAsk:
    """One set's election waiting for the next batch, and its outcome."""

    broker_name: str
    done: trio.Event = attrs.field(factory=trio.Event)
    decision: Decision | None = None
    error: BaseException | None = None


@attrs.define(eq=False)
class ControllerService:
    config: ControllerServerConfig
    store: StateStore
    leadership: Leadership
    state: ControllerState = attrs.field(factory=ControllerState)
    live: HeartbeatTable = attrs.field(factory=HeartbeatTable)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _electing: set[str] = attrs.field(factory=set[str], init=False)
    #: elections waiting for the next batch, and the event that wakes the batcher
    _asks: list[_ElectionAsk] = attrs.field(factory=list[_ElectionAsk], init=False)
    _asks_waiting: trio.Event = attrs.field(factory=trio.Event, init=False)
    _started_at: float | None = attrs.field(default=None, init=False)
    #: a commit failed half-way: read the store again before the next decision
    _stale: bool = attrs.field(default=False, init=False)
    #: when the scan means to wake next, and the event that wakes it sooner (a heartbeat
    #: whose entry expires before then)
    _planned_scan: float = attrs.field(default=float("inf"), init=False)
    _rescan: trio.Event = attrs.field(factory=trio.Event, init=False)
    _notice_send: trio.MemorySendChannel[RoleChangeNotice] = attrs.field(init=False)
    _notice_receive: trio.MemoryReceiveChannel[RoleChangeNotice] = attrs.field(init=False)
    _elections: int = 0
    _controller_elections: int = 0
    _heartbeats: int = 0
    _commits: int = 0
    _conflicts: int = 0
    _notices_sent: int = 0
    _notices_failed: int = 0
    _notices_dropped: int = 0

    def __attrs_post_init__(self) -> None:
        self._notice_send, self._notice_receive = trio.open_memory_channel[RoleChangeNotice](
            NOTICE_QUEUE)

    def statistics(self) -> ControllerStatistics:
        return ControllerStatistics(
            elections=self._elections, controller_elections=self._controller_elections,
            heartbeats=self._heartbeats,
            brokers_alive=self.live.alive_count(trio.current_time()),
            sets=len(self.state.sets), commits=self._commits, conflicts=self._conflicts,
            notices_sent=self._notices_sent, notices_failed=self._notices_failed,
            notices_dropped=self._notices_dropped)

    async def load(self) -> None:
        """Read the whole state from the store (``RecordError`` if a record is damaged)."""
        self.state = ControllerState.from_store(await self.store.load())

    # ---- performing ------------------------------------------------------------------------

    async def perform(self, decide: Decide) -> Decision | None:
        """Decide under the write lock and commit what the decision changes; the decision
        once it is durable (None: ``decide`` found nothing to do). Raises
        ``ControllerUnavailable`` if the commit kept conflicting."""
        async with self._lock:
            if self._stale:
                await self.load()
                self._stale = False
            for _ in range(MAX_COMMIT_ATTEMPTS):
                before = self.state
                decision = decide(before, trio.current_time())
                if decision is None or not decision.changes:
                    await trio.lowlevel.checkpoint()
                    return decision
                try:
                    versions = await self.store.commit(decision.writes)
                except CommitConflict as exc:
                    self._conflicts += 1
                    log.info("controller: commit conflict (%s); reading the state again", exc)
                    await self.load()
                    continue
                except BaseException:
                    # a store that failed (or a request cancelled) mid-commit may or may not
                    # have written: the next decision starts from what the store holds
                    self._stale = True
                    raise
                self._commits += 1
                self.state = before.after(decision, versions)
                self._committed(before, decision)
                return decision
            raise ControllerUnavailable(
                f"the state store conflicted {MAX_COMMIT_ATTEMPTS} times in a row")

    async def read(self, decide: Callable[[ControllerState, float], Decision]) -> Decision:
        """A rule that changes nothing, against the last committed state (no lock: the state
        is an immutable value; only after a failed commit is the store read first)."""
        if self._stale:
            async with self._lock:
                if self._stale:
                    await self.load()
                    self._stale = False
        else:
            await trio.lowlevel.checkpoint()
        decision = decide(self.state, trio.current_time())
        assert not decision.changes, "a read rule must not change records"
        return decision

    def _committed(self, before: ControllerState, decision: Decision) -> None:
        if decision.ok and isinstance(decision.header, ElectMasterResponseHeader):
            self._elections += 1
            log.info("controller: %s (masterEpoch %s)", decision.remark,
                     decision.header.master_epoch)
        for change in decision.changes:
            # a cleaned member's heartbeats no longer count: drop them now, not at expiry
            old = before.get(change.broker_name)
            if old is None:
                continue
            kept = frozenset() if change.record is None else change.record.member_ids
            for broker_id in old.record.member_ids - kept:
                self.live.forget(BrokerIdentity(old.record.cluster, change.broker_name,
                                                broker_id))
        for notice in decision.notices:
            try:
                self._notice_send.send_nowait(notice)
            except trio.WouldBlock:
                self._notices_dropped += 1
                log.warning("controller: role-change notice to %s dropped: %d waiting "
                            "(the broker's poll will see the change)", notice.address,
                            NOTICE_QUEUE)

    # ---- liveness --------------------------------------------------------------------------

    def heartbeat(self, header: BrokerHeartbeatRequestHeader, channel: Hashable) -> Decision:
        self._heartbeats += 1
        now = trio.current_time()
        decision = accept_heartbeat(self.state, self.live, now, header, channel)
        if decision.ok:
            # only this entry moved: O(1), not a walk of the table per heartbeat
            timeout = header.heartbeat_timeout_mills
            timeout = DEFAULT_HEARTBEAT_TIMEOUT_MS if timeout is None else timeout
            expiry = now + max(0, min(timeout, MAX_HEARTBEAT_TIMEOUT_MS)) / 1000
            if expiry + EXPIRY_SLACK < self._planned_scan:
                self._rescan.set()
        return decision

    def connection_closed(self, channel: Hashable) -> None:
        """A connection closed: the brokers that heartbeat on it are dead now."""
        for identity in self.live.channel_closed(channel):
            log.info("controller: broker %s/%d is dead: its connection closed",
                     identity.broker_name, identity.broker_id)
            self.schedule_election(identity.broker_name)

    def scan(self, now: float) -> None:
        """Expired heartbeats, and (after the start-up grace) sets whose master is dead while
        a member lives: an election for each set concerned."""
        for identity in self.live.expired(now):
            log.info("controller: broker %s/%d is dead: no heartbeat within its timeout",
                     identity.broker_name, identity.broker_id)
            self.schedule_election(identity.broker_name)
        if self._started_at is not None and now - self._started_at >= REELECT_GRACE:
            for name in sets_to_reelect(self.state, self.live, now):
                self.schedule_election(name)

    def schedule_election(self, broker_name: str) -> None:
        """Start an election for ``broker_name`` unless one runs (only if we lead)."""
        if (self._nursery is None or broker_name in self._electing
                or not self.leadership.is_leader):
            return
        self._electing.add(broker_name)
        self._nursery.start_soon(self._elect, broker_name)

    def _dead_master_election(self, broker_name: str, state: ControllerState, now: float
                              ) -> Decision | None:
        """An election if the set still has a master and it is dead (checked again under the
        lock at each try: the master may have come back, or someone elected already)."""
        if not self.leadership.is_leader:
            return None
        stored = state.get(broker_name)
        master = None if stored is None else stored.record.master_id
        if stored is None or master is None:
            return None
        record = stored.record
        if self.live.is_alive(BrokerIdentity(record.cluster, broker_name, master), now):
            return None
        self._controller_elections += 1
        return controller_elect(state, self.live, now, self.config.rules_config, broker_name)

    async def _elect(self, broker_name: str) -> None:
        try:
            for attempt in range(1, self.config.elect_master_max_retry_count + 1):
                try:
                    decision = await self._batched_election(broker_name)
                except (ControllerUnavailable, OSError) as exc:
                    log.warning("controller: election %d for %s failed: %s", attempt,
                                broker_name, exc)
                except Exception:
                    # a damaged record, an epoch at its limit: this set's election fails,
                    # the controller serves on (the others' elections are not its to stop)
                    log.exception("controller: election %d for %s failed", attempt,
                                  broker_name)
                else:
                    if decision is not None and decision.code == \
                            ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE:
                        log.warning("controller: %s", decision.remark)
                    return
                await trio.sleep(ELECT_RETRY_WAIT)
        finally:
            self._electing.discard(broker_name)

    async def _batched_election(self, broker_name: str) -> Decision | None:
        """``_dead_master_election`` for one set, decided and committed with the others
        waiting (see ``_run_elections``); raises what deciding or committing it raised."""
        ask = _ElectionAsk(broker_name)
        self._asks.append(ask)
        self._asks_waiting.set()
        await ask.done.wait()
        if ask.error is not None:
            raise ask.error
        return ask.decision

    def _decide_elections(self, asks: list[_ElectionAsk], state: ControllerState, now: float
                          ) -> Decision | None:
        """Each waiting set's election, against one state, as one decision: their records
        (one per set: no two write the same key) and their notices. A set whose rule raises
        has that as its outcome; the others go on. Called again after a commit conflict."""
        changes: list[RecordChange] = []
        notices: list[RoleChangeNotice] = []
        for ask in asks:
            ask.decision, ask.error = None, None
            try:
                decision = self._dead_master_election(ask.broker_name, state, now)
            except Exception as exc:
                ask.error = exc
                continue
            ask.decision = decision
            if decision is not None:
                changes.extend(decision.changes)
                notices.extend(decision.notices)
        if not changes:
            return None
        return Decision(changes=tuple(changes), notices=tuple(notices))

    async def _run_elections(self) -> None:
        """Until cancelled: take every election waiting, decide and commit them as one, and
        hand each its own outcome."""
        while True:  # until cancelled; each round waits for asks
            await self._asks_waiting.wait()
            self._asks_waiting = trio.Event()
            asks, self._asks = self._asks, []
            try:
                await self.perform(functools.partial(self._decide_elections, asks))
            except Exception as exc:  # the commit failed: every set of the batch did
                for ask in asks:
                    ask.decision, ask.error = None, exc
            else:
                for ask in asks:
                    decision = ask.decision
                    if (ask.error is None and decision is not None and decision.ok
                            and isinstance(decision.header, ElectMasterResponseHeader)):
                        self._elections += 1
                        log.info("controller: %s (masterEpoch %s)", decision.remark,
                                 decision.header.master_epoch)
            finally:
                for ask in asks:
                    ask.done.set()

    async def leadership_gained(self) -> None:
        """Call when this controller becomes the leader (a Leadership of several
        controllers): the records are read again (the previous leader wrote them) and the
        start-up grace begins again, as the heartbeat table may lag."""
        async with self._lock:
            await self.load()
            self._started_at = trio.current_time()

    async def follow(self) -> None:
        """Call now and then while another controller leads: read the records it wrote, so
        heartbeats of the sets it created since are counted here too (brokers heartbeat to
        every controller: whoever leads next then knows who is alive)."""
        async with self._lock:
            await self.load()
            self._stale = False

    # ---- running ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """The scan and the notices, until cancelled (``load`` first)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._started_at = trio.current_time()
                nursery.start_soon(self._run_scan)
                nursery.start_soon(self._run_notices)
                nursery.start_soon(self._run_elections)
                task_status.started()
        finally:
            # A broker's connection that closes after this (the server stops after the
            # service, or a caller keeps the server) starts no election in a closed nursery.
            self._nursery = None

    async def _run_scan(self) -> None:
        while True:  # until cancelled; each round sleeps at least MIN_SCAN_GAP
            now = trio.current_time()
            wake = now + self.config.scan_interval
            expiry = self.live.next_expiry()
            if expiry is not None:
                wake = min(wake, expiry + EXPIRY_SLACK)
            self._planned_scan = wake = max(wake, now + MIN_SCAN_GAP)
            with trio.move_on_at(wake):
                await self._rescan.wait()
            if self._rescan.is_set():
                self._rescan = trio.Event()
                await trio.sleep_until(min(wake, trio.current_time() + MIN_SCAN_GAP))
                continue  # plan again with the new entry
            self.scan(trio.current_time())

    async def _run_notices(self) -> None:
        limiter = trio.CapacityLimiter(NOTICE_CONCURRENCY)
        async with trio.open_nursery() as nursery:
            pool = RemotingClientPool(nursery, connect_timeout=NOTICE_TIMEOUT)
            try:
                async for notice in self._notice_receive:
                    token = object()
                    await limiter.acquire_on_behalf_of(token)
                    nursery.start_soon(self._notify, pool, notice, limiter, token)
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await pool.aclose()

    async def _notify(self, pool: RemotingClientPool, notice: RoleChangeNotice,
                      limiter: trio.CapacityLimiter, token: object) -> None:
        try:
            request = RemotingCommand.request(
                RequestCode.NOTIFY_BROKER_ROLE_CHANGED,
                SPECS[NotifyBrokerRoleChangedRequestHeader].encode(notice.header),
                notice.body.encode(), oneway=True)
            with trio.move_on_after(NOTICE_TIMEOUT) as scope:
                try:
                    await pool.invoke_oneway(notice.address, request)
                except (RemotingError, OSError) as exc:
                    self._notices_failed += 1
                    pool.forget(notice.address)
                    log.info("controller: role-change notice to %s failed: %s",
                             notice.address, exc)
                    return
            if scope.cancelled_caught:
                self._notices_failed += 1
                pool.forget(notice.address)
                log.info("controller: role-change notice to %s timed out", notice.address)
                return
            self._notices_sent += 1
        finally:
            limiter.release_on_behalf_of(token)
