"""The broker's side of controller mode, over the wire: find the leader, register, heartbeat,
listen, poll, and perform what ``replicas.ReplicaState`` decides.

RocketMQ's ``ReplicasManager`` runs this on five scheduled executors sharing one lock. Here
it is one nursery (``ControllerLink.run``) with one task per duty, and every view of the set
(from the registration, an election, a NOTIFY_BROKER_ROLE_CHANGED or a poll) goes through one
memory channel to one task that decides and performs, so two role changes never overlap and
a notice arriving mid-change waits its turn instead of racing it.

Start-up (spec: ``../shared/spec/controller-mode.md`` §2.3):

1. find the leader: ask every controller CONTROLLER_GET_METADATA_INFO until one names it;
2. take an id: ``brokerIdentity`` if it exists; else the pending claim in
   ``brokerIdentity-temp``, or a new one (GET_NEXT_BROKER_ID, then write the claim);
   APPLY_BROKER_ID; write ``brokerIdentity`` (``identity``);
3. REGISTER_BROKER; one heartbeat; if the answer names a live master, follow it; else
   ELECT_MASTER for ourselves (the first broker of a set wins unconditionally), every 5 s
   until the set has a master.

Then, until cancelled: a heartbeat one-way to every controller every brokerHeartbeatInterval
(brokers heartbeat to all of them because each DLedger controller keeps its own table), on
the one connection per controller the pool keeps (closing it is how the controller learns a
broker died, so it is never closed on purpose); GET_REPLICA_INFO to the leader every
syncBrokerMetadataPeriod; the leader looked up again every syncControllerMetadataPeriod, and
at once when a request to it fails or answers CONTROLLER_NOT_LEADER.

A request that fails is logged and tried again by the next round; nothing here ends the
broker. The broker is "fenced" (registers nowhere, takes no puts) until the first role is
taken: ``role_known`` is set then.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import attrs
import trio

from ..._errors import TrioHAError
from ...remoting import RemotingClientPool, RemotingError
from ...wire.controller import (
    SPECS,
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    ControllerDecodeError,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetMetaDataResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    SyncStateSet,
)
from ...wire.errors import WireError
from ...wire.remoting import RemotingCommand, RequestCode, ResponseCode
from ..config import BrokerConfig
from .identity import BrokerIdentity, IdentityFiles, PendingIdentity
from .replicas import (
    AskElection,
    BecomeMaster,
    BecomeSlave,
    MasterView,
    NewSyncStateSet,
    ReplicaState,
    RoleDecision,
)

__all__ = ["ControllerError", "ControllerLink", "RoleTarget"]

log = logging.getLogger(__name__)

#: each request to a controller is bounded by this (s); RocketMQ uses 3 s
REQUEST_TIMEOUT = 3.0
#: retry of a start-up step that failed (s); RocketMQ sleeps up to 1 s between tries
RETRY_MIN, RETRY_MAX = 0.2, 3.0
#: a set with no master: ask for an election again after this (s), as RocketMQ
ELECT_RETRY = 5.0
#: views waiting for the deciding task; a burst beyond this drops the oldest poll result
#: (a later poll brings the same news)
VIEW_BACKLOG = 16


class ControllerError(TrioHAError):
    """A controller answered a request with an error code (or an unreadable answer)."""

    def __init__(self, code: int, remark: str | None) -> None:
        super().__init__(f"controller answered {_code_name(code)}: {remark or ''}")
        self.code = code


def _code_name(code: int) -> str:
    try:
        return ResponseCode(code).name
    except ValueError:
        return str(code)


class RoleTarget(Protocol):
    """What the link needs of the broker: perform a role, and the figures a heartbeat carries."""

    async def change_to_master(self, epoch: int, sync_state_set: SyncStateSet,
                               same_master: bool) -> None: ...

    async def change_to_slave(self, master_addr: str, master_id: int, epoch: int,
                              broker_id: int) -> None: ...

    def apply_sync_state_set(self, sync_state_set: SyncStateSet,
                             asked_at: float | None = None) -> None: ...

    def take_proposal(self, now: float) -> SyncStateSet | None:
        """As master: the in-sync set to propose now (members, and the set's CURRENT
        epoch), marked in flight; None when nothing is to change."""
        ...

    def proposal_answered(self, accepted: SyncStateSet | None, code: int | None,
                          now: float) -> None:
        """The controller's answer to the proposal in flight: the set it accepted, or the
        refusal's code (None: no answer)."""
        ...

    def last_epoch(self) -> int: ...

    def max_offset(self) -> int: ...

    def confirm_offset(self) -> int: ...


@attrs.define(eq=False)
class ControllerLink:
    """One broker's membership of a controller-mode set (see the module docstring)."""

    config: BrokerConfig
    broker_addr: str
    pool: RemotingClientPool
    target: RoleTarget
    identity_files: IdentityFiles = attrs.field(default=attrs.Factory(
        lambda self: IdentityFiles(Path(self.config.store.store_path_root_dir),
                                   self.config.broker_cluster_name, self.config.broker_name),
        takes_self=True))
    clock: Callable[[], float] = time.time
    #: the controller leader's address, once known
    leader: str | None = None
    identity: BrokerIdentity | None = None
    state: ReplicaState | None = None
    #: set once the first role was taken (the broker is no longer fenced)
    role_known: trio.Event = attrs.field(factory=trio.Event)
    #: counters, for statistics and tests
    heartbeats_sent: int = 0
    notices_received: int = 0
    _views_in: trio.MemorySendChannel[MasterView] = attrs.field(init=False)
    _views_out: trio.MemoryReceiveChannel[MasterView] = attrs.field(init=False)
    _leader_changed: trio.Event = attrs.field(factory=trio.Event)
    _proposal_wanted: trio.Event = attrs.field(factory=trio.Event)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    #: an election loop runs (at most one)
    _electing: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._views_in, self._views_out = trio.open_memory_channel[MasterView](VIEW_BACKLOG)

    @property
    def controllers(self) -> list[str]:
        return self.config.controller_addresses

    # ---- requests ------------------------------------------------------------------------------

    async def _call(self, address: str, code: RequestCode, header: Any = None,
                    body: bytes = b"") -> RemotingCommand:
        fields = SPECS[type(header)].encode(header) if header is not None else None
        request = RemotingCommand.request(code, fields, body)
        response = await self.pool.invoke(address, request, REQUEST_TIMEOUT)
        if response.code not in (ResponseCode.SUCCESS,
                                 ResponseCode.CONTROLLER_MASTER_STILL_EXIST):
            if response.code == ResponseCode.CONTROLLER_NOT_LEADER and address == self.leader:
                self._lose_leader()
            raise ControllerError(response.code, response.remark)
        return response

    async def _call_leader(self, code: RequestCode, header: Any = None,
                           body: bytes = b"") -> RemotingCommand:
        leader = self.leader or await self._find_leader()
        try:
            return await self._call(leader, code, header, body)
        except RemotingError:
            self._lose_leader()
            raise

    def _lose_leader(self) -> None:
        self.leader = None
        self._leader_changed.set()
        self._leader_changed = trio.Event()

    async def _find_leader(self) -> str:
        """Ask the controllers who leads until one says (forever, with back-off)."""
        wait = RETRY_MIN
        while True:
            for address in self.controllers:
                try:
                    response = await self._call(address, RequestCode.CONTROLLER_GET_METADATA_INFO)
                    header = SPECS[GetMetaDataResponseHeader].decode(response)
                except (RemotingError, ControllerError, WireError) as exc:
                    log.debug("controller %s: no metadata: %s", address, exc)
                    continue
                if header.controller_leader_address:
                    if header.controller_leader_address != self.leader:
                        log.info("broker %s: the controller leader is %s",
                                 self.config.broker_name, header.controller_leader_address)
                    self.leader = leader = header.controller_leader_address
                    return leader
            log.warning("broker %s: no controller of %s names a leader; trying again in %.1f s",
                        self.config.broker_name, ";".join(self.controllers), wait)
            await trio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX)

    # ---- start-up ------------------------------------------------------------------------------

    async def _take_identity(self) -> BrokerIdentity:
        """The id this broker has, or one the controller grants now."""
        files = self.identity_files
        identity = await trio.to_thread.run_sync(files.load)
        if identity is not None:
            return identity
        pending = await trio.to_thread.run_sync(files.load_pending)
        if pending is None:
            response = await self._call_leader(
                RequestCode.CONTROLLER_GET_NEXT_BROKER_ID,
                GetNextBrokerIdRequestHeader(self.config.broker_cluster_name,
                                             self.config.broker_name))
            answer = SPECS[GetNextBrokerIdResponseHeader].decode(response)
            if answer.next_broker_id is None or answer.next_broker_id < 1:
                raise ControllerError(response.code, f"no usable next broker id: "
                                                     f"{answer.next_broker_id}")
            pending = PendingIdentity(
                self.config.broker_cluster_name, self.config.broker_name,
                answer.next_broker_id, f"{self.broker_addr};{int(self.clock() * 1000)}")
            await trio.to_thread.run_sync(files.save_pending, pending)
        try:
            await self._call_leader(
                RequestCode.CONTROLLER_APPLY_BROKER_ID,
                ApplyBrokerIdRequestHeader(pending.cluster, pending.broker_name,
                                           pending.broker_id, pending.register_check_code))
        except ControllerError:
            # Taken by another broker meanwhile: start over with a fresh id.
            await trio.to_thread.run_sync(files.drop_pending)
            raise
        identity = pending.granted()
        await trio.to_thread.run_sync(files.save, identity)
        log.info("broker %s: the controller granted broker id %d", self.config.broker_name,
                 identity.broker_id)
        return identity

    async def _register(self, identity: BrokerIdentity) -> MasterView:
        response = await self._call_leader(
            RequestCode.CONTROLLER_REGISTER_BROKER,
            RegisterBrokerToControllerRequestHeader(
                self.config.broker_cluster_name, self.config.broker_name, identity.broker_id,
                self.broker_addr, int(self.clock() * 1000)))
        header = SPECS[RegisterBrokerToControllerResponseHeader].decode(response)
        return MasterView(header.master_broker_id, header.master_address,
                          header.master_epoch or 0, _sync_state_set(response.body))

    async def _elect_self(self) -> MasterView:
        assert self.identity is not None
        response = await self._call_leader(
            RequestCode.CONTROLLER_ELECT_MASTER,
            ElectMasterRequestHeader(self.config.broker_cluster_name, self.config.broker_name,
                                     self.identity.broker_id, False, int(self.clock() * 1000)))
        header = SPECS[ElectMasterResponseHeader].decode(response)
        members = None
        if response.body:
            body = ElectMasterResponseBody.decode(response.body)
            members = SyncStateSet(body.sync_state_set, header.sync_state_set_epoch or 0)
        return MasterView(header.master_broker_id, header.master_address,
                          header.master_epoch or 0, members)

    async def _start(self) -> None:
        """Steps 1-3 of the module docstring, each retried until it succeeds."""
        wait = RETRY_MIN
        while True:
            try:
                self.identity = await self._take_identity()
                self.state = ReplicaState(self.identity.broker_id)
                view = await self._register(self.identity)
                break
            except (RemotingError, ControllerError, WireError) as exc:
                log.warning("broker %s: registering with the controller failed (%s); trying "
                            "again in %.1f s", self.config.broker_name, exc, wait)
                await trio.sleep(wait * (0.5 + random.random()))
                wait = min(wait * 2, RETRY_MAX)
        await self._heartbeat_all()
        await self._views_in.send(view)

    # ---- steady state ----------------------------------------------------------------------------

    def heartbeat_request(self) -> RemotingCommand:
        assert self.identity is not None
        header = BrokerHeartbeatRequestHeader(
            cluster_name=self.config.broker_cluster_name, broker_addr=self.broker_addr,
            broker_name=self.config.broker_name, broker_id=self.identity.broker_id,
            epoch=self.target.last_epoch(), max_offset=self.target.max_offset(),
            confirm_offset=self.target.confirm_offset(),
            heartbeat_timeout_mills=self.config.controller_heart_beat_timeout_mills,
            election_priority=self.config.broker_election_priority)
        return RemotingCommand.request(RequestCode.BROKER_HEARTBEAT,
                                       SPECS[BrokerHeartbeatRequestHeader].encode(header),
                                       oneway=True)

    async def _heartbeat_all(self) -> None:
        request = self.heartbeat_request()
        for address in self.controllers:
            try:
                with trio.fail_after(REQUEST_TIMEOUT):
                    await self.pool.invoke_oneway(address, request)
                self.heartbeats_sent += 1
            except (RemotingError, trio.TooSlowError) as exc:
                log.debug("broker %s: no heartbeat to controller %s: %s",
                          self.config.broker_name, address, exc)

    async def _run_heartbeats(self) -> None:
        interval = self.config.broker_heartbeat_interval / 1000
        while True:
            await trio.sleep(interval)
            await self._heartbeat_all()

    async def _run_polls(self) -> None:
        period = self.config.sync_broker_metadata_period / 1000
        await trio.sleep(min(period, 3.0))
        while True:
            try:
                view = await self.replica_info()
            except ControllerError as exc:
                if exc.code == ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST \
                        and self.identity is not None:
                    # The controller forgot this set (cleanBrokerMetadata, a wiped store):
                    # register again, as RocketMQ does.
                    log.warning("broker %s: the controller has no record of this set; "
                                "registering again", self.config.broker_name)
                    try:
                        view = await self._register(self.identity)
                    except (RemotingError, ControllerError, WireError) as again:
                        log.warning("broker %s: registering again failed: %s",
                                    self.config.broker_name, again)
                        view = None
                else:
                    log.info("broker %s: replica info: %s", self.config.broker_name, exc)
                    view = None
            except (RemotingError, WireError) as exc:
                log.info("broker %s: replica info: %s", self.config.broker_name, exc)
                view = None
            if view is not None:
                self._offer(view)
            await trio.sleep(period)

    async def replica_info(self) -> MasterView:
        """GET_REPLICA_INFO from the leader, as a view."""
        asked_at = trio.current_time()
        response = await self._call_leader(
            RequestCode.CONTROLLER_GET_REPLICA_INFO,
            GetReplicaInfoRequestHeader(self.config.broker_name))
        header = SPECS[GetReplicaInfoResponseHeader].decode(response)
        return MasterView(header.master_broker_id, header.master_address,
                          header.master_epoch or 0, _sync_state_set(response.body), asked_at)

    async def _run_proposals(self) -> None:
        """As master: every checkSyncStateSetPeriod, and when woken by ``proposal_due``,
        send the in-sync set change the master wants (ALTER_SYNC_STATE_SET) and hand the
        controller's answer back. One at a time: the set's rules allow one in flight."""
        period = self.config.check_sync_state_set_period / 1000
        while True:
            with trio.move_on_after(period):
                await self._proposal_wanted.wait()
            self._proposal_wanted = trio.Event()
            assert self.state is not None and self.identity is not None
            if not self.state.is_master:
                continue
            proposal = self.target.take_proposal(trio.current_time())
            if proposal is None:
                continue
            accepted: SyncStateSet | None = None
            code: int | None = None
            try:
                response = await self._call_leader(
                    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET,
                    AlterSyncStateSetRequestHeader(
                        self.config.broker_name, self.identity.broker_id,
                        self.state.master_epoch, int(self.clock() * 1000)),
                    proposal.encode())
                header = SPECS[AlterSyncStateSetResponseHeader].decode(response)
                body = _sync_state_set(response.body)
                accepted = SyncStateSet(body.members if body is not None else proposal.members,
                                        header.new_sync_state_set_epoch)
                log.info("broker %s: the controller accepted the in-sync set %s (epoch %d)",
                         self.config.broker_name, sorted(accepted.members), accepted.epoch)
            except ControllerError as exc:
                code = exc.code
                log.info("broker %s: in-sync set %s refused: %s", self.config.broker_name,
                         sorted(proposal.members), exc)
            except (RemotingError, WireError) as exc:
                log.info("broker %s: in-sync set %s: no answer: %s", self.config.broker_name,
                         sorted(proposal.members), exc)
            self.target.proposal_answered(accepted, code, trio.current_time())
            if accepted is not None:
                self.state.set_applied(accepted)

    def proposal_due(self) -> None:
        """The master's in-sync set wants a change: propose it now rather than at the next
        period (called from the HA pumps; no checkpoint)."""
        self._proposal_wanted.set()

    async def _run_leader_refresh(self) -> None:
        period = self.config.sync_controller_metadata_period / 1000
        while True:
            with trio.move_on_after(period):
                await self._leader_changed.wait()
            try:
                with trio.fail_after(period):
                    await self._find_leader()
            except trio.TooSlowError:
                continue

    def _offer(self, view: MasterView) -> None:
        try:
            self._views_in.send_nowait(view)
        except trio.WouldBlock:
            log.info("broker %s: controller views arrive faster than roles change; a later "
                     "poll brings this one again", self.config.broker_name)

    def role_notice(self, request: RemotingCommand) -> None:
        """NOTIFY_BROKER_ROLE_CHANGED (1008) from a controller: queue it for the deciding
        task. Raises WireError for a malformed notice (the caller answers it)."""
        header = SPECS[NotifyBrokerRoleChangedRequestHeader].decode(request)
        members = _sync_state_set(request.body)
        if members is not None and header.sync_state_set_epoch is not None:
            members = SyncStateSet(members.members, header.sync_state_set_epoch)
        self.notices_received += 1
        self._offer(MasterView(header.master_broker_id, header.master_address,
                               header.master_epoch or 0, members))

    async def _run_decisions(self) -> None:
        """The one task that turns views into roles (see the module docstring)."""
        assert self.state is not None
        async for view in self._views_out:
            decision = self.state.observe(view)
            if decision is None:
                if self.state.master_epoch == 0 and not view.has_master:
                    decision = AskElection(view.epoch)
                else:
                    continue
            if isinstance(decision, AskElection):
                if not self._electing:
                    self._electing = True
                    assert self._nursery is not None
                    self._nursery.start_soon(self._elect_until_master)
                continue
            await self._perform(decision)

    async def _elect_until_master(self) -> None:
        """ELECT_MASTER every ELECT_RETRY s while the set has no master we acted on."""
        assert self.state is not None
        try:
            await self._elect_loop()
        finally:
            self._electing = False

    async def _elect_loop(self) -> None:
        assert self.state is not None
        while True:
            try:
                view = await self._elect_self()
                self._offer(view)
                if view.has_master:
                    return
                log.warning("broker %s: the controller found no master for the set (epoch "
                            "%d); asking again in %.0f s", self.config.broker_name, view.epoch,
                            ELECT_RETRY)
            except (RemotingError, ControllerError, WireError) as exc:
                log.warning("broker %s: election request failed: %s", self.config.broker_name,
                            exc)
            await trio.sleep(ELECT_RETRY)
            if self.role_known.is_set() and self.state.master_id is not None:
                return

    async def _perform(self, decision: RoleDecision) -> None:
        assert self.state is not None and self.identity is not None
        name = self.config.broker_name
        try:
            if isinstance(decision, NewSyncStateSet):
                self.target.apply_sync_state_set(decision.sync_state_set, decision.asked_at)
                self.state.set_applied(decision.sync_state_set)
                return
            if isinstance(decision, BecomeMaster):
                log.info("broker %s: becoming master at epoch %d (in-sync set %s)", name,
                         decision.epoch, sorted(decision.sync_state_set.members))
                await self.target.change_to_master(decision.epoch, decision.sync_state_set,
                                                   decision.same_master)
            elif isinstance(decision, BecomeSlave):
                log.info("broker %s: following master %d at %s, epoch %d", name,
                         decision.master_id, decision.master_addr, decision.epoch)
                await self.target.change_to_slave(decision.master_addr, decision.master_id,
                                                  decision.epoch, self.identity.broker_id)
            else:
                return
        except Exception:
            # The next notice or poll brings the same epoch again: the change is retried.
            log.exception("broker %s: the role change %s failed", name, decision)
            return
        self.state.role_taken(decision)
        self.role_known.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        """Until cancelled. Reports started at once: the broker serves (fenced) meanwhile."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await self._start()
            nursery.start_soon(self._run_decisions)
            nursery.start_soon(self._run_heartbeats)
            nursery.start_soon(self._run_polls)
            nursery.start_soon(self._run_leader_refresh)
            nursery.start_soon(self._run_proposals)


def _sync_state_set(body: bytes) -> SyncStateSet | None:
    if not body:
        return None
    try:
        return SyncStateSet.decode(body)
    except ControllerDecodeError as exc:
        log.warning("controller: unreadable in-sync set: %s", exc)
        return None

