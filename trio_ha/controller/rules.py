"""The controller's rules: each request, read against the records and the heartbeats, gives a
``Decision``. No trio, no sockets, no files, no clock.

This is the shape of etcd's raft library and of RocketMQ's ``ReplicasInfoManager``: the caller
(the trio server) decodes a request, calls the rule with the state it read, the heartbeat
table and ``now``, then *performs* the decision: it commits ``decision.writes`` through the
StateStore, and only once that returns sends the response and the role-change notices. If the
commit fails with ``CommitConflict`` (another controller, or another request, wrote first), it
reads again and decides again; it never answers from a decision it could not commit. Every
write names the version its record was read at (0 for a set that did not exist), which is what
makes that safe: a decision computed from a stale read can never overwrite a newer one.

Codes, checks and their order follow RocketMQ 5.3.3 (``ReplicasInfoManager``,
``DefaultElectPolicy``, ``ControllerManager``), so real brokers and mqadmin see the answers
they expect; the remarks are ours. Where we differ on purpose, docs/controller.md says so:
missing header fields are CONTROLLER_INVALID_REQUEST (RocketMQ throws), the next broker id
stays above every applied id, a set's cluster must match, heartbeats count only from members
at their registered address, a live member's id is not moved to another address by
REGISTER_BROKER, the first election takes the requester only if it is alive, cleaning checks
every member's liveness, and a change of the in-sync set always bumps its epoch.

It is one module at over 600 lines because it is one concept, RocketMQ's ReplicasInfoManager:
one rule per controller request over the same records and heartbeats, with the checks in
RocketMQ's order; split by request, that order and the records' invariants would be read in
pieces.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import attrs

from ..wire.controller import (
    AlterSyncStateSetRequestHeader,
    AlterSyncStateSetResponseHeader,
    ApplyBrokerIdRequestHeader,
    ApplyBrokerIdResponseHeader,
    BrokerHeartbeatRequestHeader,
    BrokerReplicasInfo,
    CleanBrokerDataRequestHeader,
    ElectMasterRequestHeader,
    ElectMasterResponseBody,
    ElectMasterResponseHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    GetReplicaInfoRequestHeader,
    GetReplicaInfoResponseHeader,
    NotifyBrokerRoleChangedRequestHeader,
    RegisterBrokerToControllerRequestHeader,
    RegisterBrokerToControllerResponseHeader,
    ReplicaIdentity,
    ReplicasInfo,
    SyncStateSet,
)
from ..wire.remoting.codes import ResponseCode
from .election import ElectionOutcome, elect
from .liveness import BrokerIdentity, HeartbeatTable, LiveInfo
from .records import BrokerSetRecord, MemberRecord, RecordError, broker_name_of_key, key_for
from .state_store import Versioned, Write

__all__ = [
    "ControllerConfig",
    "ControllerState",
    "Decision",
    "RecordChange",
    "RoleChangeNotice",
    "StoredSet",
    "accept_heartbeat",
    "alter_sync_state_set",
    "apply_broker_id",
    "clean_broker_data",
    "controller_elect",
    "elect_master",
    "get_next_broker_id",
    "get_replica_info",
    "get_sync_state_data",
    "on_broker_dead",
    "register_broker",
    "sets_to_reelect",
]

ResponseHeader = (
    GetNextBrokerIdResponseHeader | ApplyBrokerIdResponseHeader
    | RegisterBrokerToControllerResponseHeader | ElectMasterResponseHeader
    | GetReplicaInfoResponseHeader | AlterSyncStateSetResponseHeader
)
ResponseBody = SyncStateSet | ElectMasterResponseBody | BrokerReplicasInfo


@attrs.frozen
class ControllerConfig:
    """The rules' settings (RocketMQ's ControllerConfig names in the comments)."""

    #: enableElectUncleanMaster: elect outside the in-sync set when nobody in it is alive
    enable_elect_unclean_master: bool = False
    #: notifyBrokerRoleChanged: tell the alive members after an election
    notify_broker_role_changed: bool = True
    #: broker sets the controller keeps at most (ours: RocketMQ has no limit): without ACL,
    #: anyone who reaches the port can APPLY_BROKER_ID under new names, and every set is a
    #: record held in memory and in the store; far above any real deployment
    max_sets: int = 16_384


# ---- state -----------------------------------------------------------------------------------


@attrs.frozen
class StoredSet:
    """A record as read, with the version a write of it must name."""

    version: int
    record: BrokerSetRecord


@attrs.frozen
class RecordChange:
    """One record a decision replaces (``record`` None deletes it), and the version it read."""

    broker_name: str
    expected_version: int
    record: BrokerSetRecord | None

    def write(self) -> Write:
        return Write(key_for(self.broker_name), self.expected_version,
                     None if self.record is None else self.record.encode())


@attrs.frozen
class ControllerState:
    """Every broker set the controller knows, by broker name, as last read or committed."""

    sets: Mapping[str, StoredSet] = attrs.field(factory=dict[str, StoredSet])

    def get(self, broker_name: str | None) -> StoredSet | None:
        return None if broker_name is None else self.sets.get(broker_name)

    @classmethod
    def from_store(cls, records: Mapping[str, Versioned]) -> ControllerState:
        """The state a StateStore's ``load`` gives. Keys that are not broker-set keys are the
        controller's other metadata and are skipped; a damaged record raises ``RecordError``
        (a controller must not decide from a state it cannot read whole)."""
        sets: dict[str, StoredSet] = {}
        for key, item in records.items():
            name = broker_name_of_key(key)
            if name is None:
                continue
            record = BrokerSetRecord.decode(item.value)
            if record.broker_name != name:
                raise RecordError(f"the record under {key!r} names set {record.broker_name!r}")
            sets[name] = StoredSet(item.version, record)
        return cls(sets)

    def after(self, decision: Decision, versions: Mapping[str, int]) -> ControllerState:
        """The state once ``decision`` is committed; ``versions`` is what ``commit`` returned
        (the new version of each key written)."""
        sets = dict(self.sets)
        for change in decision.changes:
            if change.record is None:
                sets.pop(change.broker_name, None)
            else:
                sets[change.broker_name] = StoredSet(versions[key_for(change.broker_name)],
                                                     change.record)
        return ControllerState(sets)


# ---- decisions -------------------------------------------------------------------------------


@attrs.frozen
class RoleChangeNotice:
    """A NOTIFY_BROKER_ROLE_CHANGED (1008) to send, one way, to ``address`` once the decision
    is committed."""

    address: str
    header: NotifyBrokerRoleChangedRequestHeader
    body: SyncStateSet


@attrs.frozen
class Decision:
    """What a request gives: the response (code, remark, header, body), the records to commit
    before answering, and the notices to send after."""

    code: int = ResponseCode.SUCCESS
    remark: str | None = None
    header: ResponseHeader | None = None
    body: ResponseBody | None = None
    changes: tuple[RecordChange, ...] = ()
    notices: tuple[RoleChangeNotice, ...] = ()

    @property
    def ok(self) -> bool:
        return self.code == ResponseCode.SUCCESS

    @property
    def writes(self) -> tuple[Write, ...]:
        return tuple(change.write() for change in self.changes)


#: the longest piece of a request a remark quotes (a name or address of a megabyte is
#: not echoed back)
_QUOTED = 128


def _cut(text: str | None) -> str:
    """``text`` as a remark quotes it: at most ``_QUOTED`` characters."""
    text = "" if text is None else text
    return text if len(text) <= _QUOTED else text[:_QUOTED] + "..."


def _refuse(code: int, remark: str, header: ResponseHeader | None = None) -> Decision:
    return Decision(code, remark, header)


def _invalid(what: str) -> Decision:
    return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, f"the request has no {what}")


def _change(stored: StoredSet | None, name: str, record: BrokerSetRecord | None) -> RecordChange:
    return RecordChange(name, 0 if stored is None else stored.version, record)


def _identity(record: BrokerSetRecord, broker_id: int) -> BrokerIdentity:
    return BrokerIdentity(record.cluster, record.broker_name, broker_id)


def _alive(live: HeartbeatTable, now: float, record: BrokerSetRecord, broker_id: int) -> bool:
    return live.is_alive(_identity(record, broker_id), now)


def _sync_state_set(record: BrokerSetRecord) -> SyncStateSet:
    return SyncStateSet(record.sync_state_set, record.sync_state_set_epoch)


# ---- ids and registration --------------------------------------------------------------------


def get_next_broker_id(state: ControllerState, header: GetNextBrokerIdRequestHeader) -> Decision:
    """CONTROLLER_GET_NEXT_BROKER_ID (1012): the id a new member should apply for (1 for a
    set nobody registered yet). Changes nothing: the id is taken by APPLY_BROKER_ID."""
    if not header.broker_name:
        return _invalid("brokerName")
    stored = state.get(header.broker_name)
    next_id = 1 if stored is None else stored.record.next_broker_id
    return Decision(header=GetNextBrokerIdResponseHeader(header.cluster_name, header.broker_name,
                                                         next_id))


def apply_broker_id(state: ControllerState, header: ApplyBrokerIdRequestHeader,
                    config: ControllerConfig = ControllerConfig()) -> Decision:
    """CONTROLLER_APPLY_BROKER_ID (1013): take an id. The address is the part of the check
    code before ``;``. The first id of a new set must be 1; a taken id is granted again only to
    the same check code (a broker retrying), otherwise CONTROLLER_BROKER_ID_INVALID."""
    name, cluster = header.broker_name, header.cluster_name
    if not name:
        return _invalid("brokerName")
    if not cluster:
        return _invalid("clusterName")
    if header.applied_broker_id is None:
        return _invalid("appliedBrokerId")
    if not header.register_check_code:
        return _invalid("registerCheckCode")
    broker_id, code = header.applied_broker_id, header.register_check_code
    response = ApplyBrokerIdResponseHeader(cluster, name)
    address = code.split(";", 1)[0]
    stored = state.get(name)
    if stored is None:
        if len(state.sets) >= config.max_sets:
            return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST,
                           f"the controller holds {len(state.sets)} broker sets, its limit: "
                           f"no new set {_cut(name)}", response)
        if broker_id != 1:
            return _refuse(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                           f"set {name} has no members yet: its first broker id is 1, "
                           f"not {broker_id}", response)
        try:
            member = MemberRecord(1, address, code)
        except RecordError as exc:  # a check code over the record's limit
            return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc), response)
        record = _new_record(cluster, name, member)
        if isinstance(record, Decision):
            return record
        return Decision(header=response, changes=(_change(None, name, record),))
    record = stored.record
    if record.cluster != cluster:
        return _refuse(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                       f"set {name} belongs to cluster {record.cluster}, not {cluster}", response)
    existing = record.member(broker_id)
    if existing is not None:
        if existing.register_check_code == code:
            return Decision(header=response)  # a retry of a granted claim: nothing to write
        return _refuse(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                       f"broker id {broker_id} of set {name} belongs to another broker",
                       response)
    try:
        updated = attrs.evolve(record, members=(*record.members,
                                                MemberRecord(broker_id, address, code)),
                               next_broker_id=max(record.next_broker_id + 1, broker_id + 1))
    except RecordError as exc:
        return _refuse(ResponseCode.CONTROLLER_BROKER_ID_INVALID, str(exc), response)
    return Decision(header=response, changes=(_change(stored, name, updated),))


def _new_record(cluster: str, name: str, member: MemberRecord | None = None
                ) -> BrokerSetRecord | Decision:
    try:
        return BrokerSetRecord(cluster, name, () if member is None else (member,), 2)
    except RecordError as exc:
        return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc))


def register_broker(
    state: ControllerState, live: HeartbeatTable, now: float,
    header: RegisterBrokerToControllerRequestHeader,
) -> Decision:
    """CONTROLLER_REGISTER_BROKER (1003): a member says where it serves now. The answer names
    the master only if there is one and it is alive; the body is the in-sync set. A changed
    address is written."""
    name = header.broker_name
    if not name:
        return _invalid("brokerName")
    if not header.broker_address:
        return _invalid("brokerAddress")
    response = RegisterBrokerToControllerResponseHeader(header.cluster_name, name)
    stored = state.get(name)
    if stored is None:
        return _refuse(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"set {name} is not registered with the controller", response)
    record = stored.record
    member = record.member(header.broker_id)
    if member is None or header.broker_id is None:
        return _refuse(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"broker id {header.broker_id} is not registered in set {name}",
                       response)
    if member.address != header.broker_address and _alive(live, now, record, member.broker_id):
        # A second broker claiming a live member's id (a copied brokerIdentity file, or a
        # forgery): RocketMQ moves the id to the new address. Here the id stays with the broker
        # that heartbeats for it; one that really moved is dead at its old address (its
        # connection closed with its process) and registers at once.
        return _refuse(ResponseCode.CONTROLLER_BROKER_ID_INVALID,
                       f"broker id {member.broker_id} of set {name} is alive at "
                       f"{member.address}: {_cut(header.broker_address)} cannot take it",
                       response)
    master = record.master_id
    if master is not None and _alive(live, now, record, master):
        response = attrs.evolve(response, master_broker_id=master,
                                master_address=record.address_of(master),
                                master_epoch=record.master_epoch,
                                sync_state_set_epoch=record.sync_state_set_epoch)
    changes: tuple[RecordChange, ...] = ()
    if member.address != header.broker_address:
        try:
            moved = attrs.evolve(member, address=header.broker_address)
        except RecordError as exc:
            return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, str(exc), response)
        updated = attrs.evolve(record, members=tuple(
            moved if m.broker_id == member.broker_id else m for m in record.members))
        changes = (_change(stored, name, updated),)
    return Decision(header=response, body=_sync_state_set(record), changes=changes)


# ---- heartbeats and liveness -----------------------------------------------------------------


def accept_heartbeat(
    state: ControllerState, live: HeartbeatTable, now: float,
    header: BrokerHeartbeatRequestHeader, channel: Hashable | None = None,
) -> Decision:
    """BROKER_HEARTBEAT (904): record it in ``live`` if it comes from a registered member of
    a known set (the only rule that changes the table; it writes no record). Anything else is
    dropped, so unknown senders cannot grow the table. The heartbeat is one way: the code is
    for logs and tests."""
    if header.broker_id is None:
        return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, "a heartbeat without brokerId")
    stored = state.get(header.broker_name)
    member = None if stored is None else stored.record.member(header.broker_id)
    if stored is None or member is None or stored.record.cluster != header.cluster_name:
        return _refuse(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"broker {_cut(header.broker_name)}/{header.broker_id} is not registered")
    if header.broker_addr != member.address:
        # Another address claiming a member's id (RocketMQ counts it): it would keep a dead
        # master "alive" and take over its entry's connection, so the master's own connection
        # closing would no longer be seen. A broker that moved registers its new address first.
        return _refuse(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"broker {_cut(header.broker_name)}/{header.broker_id} is registered at "
                       f"{member.address}, not {_cut(header.broker_addr)}")
    accepted = live.heartbeat(
        _identity(stored.record, header.broker_id), address=header.broker_addr, now=now,
        channel=channel, timeout_ms=header.heartbeat_timeout_mills, epoch=header.epoch,
        max_offset=header.max_offset, confirm_offset=header.confirm_offset,
        election_priority=header.election_priority)
    if not accepted:
        return _refuse(ResponseCode.CONTROLLER_INVALID_REQUEST, "the heartbeat table is full")
    return Decision(remark="heartbeat accepted")


def on_broker_dead(
    state: ControllerState, live: HeartbeatTable, now: float, config: ControllerConfig,
    identity: BrokerIdentity,
) -> Decision | None:
    """A broker was found dead (its channel closed, or its heartbeats expired): if it was its
    set's master, the controller elects a new one (``controller_elect``); otherwise None,
    nothing to do."""
    stored = state.get(identity.broker_name)
    if (stored is None or stored.record.cluster != identity.cluster
            or stored.record.master_id != identity.broker_id):
        return None
    return controller_elect(state, live, now, config, identity.broker_name)


def sets_to_reelect(state: ControllerState, live: HeartbeatTable, now: float) -> list[str]:
    """The sets whose master is dead while another member is alive (RocketMQ's periodic
    ``scanNeedReelectBrokerSets``), to pass to ``controller_elect``; sorted."""
    names: list[str] = []
    for name, stored in state.sets.items():
        record = stored.record
        if record.master_id is None or _alive(live, now, record, record.master_id):
            continue
        if any(_alive(live, now, record, i) for i in record.member_ids):
            names.append(name)
    return sorted(names)


# ---- roles -----------------------------------------------------------------------------------


def controller_elect(
    state: ControllerState, live: HeartbeatTable, now: float, config: ControllerConfig,
    broker_name: str,
) -> Decision:
    """An election the controller starts itself (a dead master): ELECT_MASTER with no broker
    id. If nobody is eligible the set is left without a master at a new masterEpoch (the old
    master is fenced), and its in-sync set is kept for when a member returns."""
    return elect_master(state, live, now, config,
                        ElectMasterRequestHeader(broker_name=broker_name, broker_id=-1))


def elect_master(
    state: ControllerState, live: HeartbeatTable, now: float, config: ControllerConfig,
    header: ElectMasterRequestHeader,
) -> Decision:
    """CONTROLLER_ELECT_MASTER (1002), from a broker (``broker_id`` = itself), an admin
    (``designate_elect``: exactly ``broker_id``) or the controller (``broker_id`` -1).

    The first election of a set (masterEpoch 0) takes the requesting member; later ones follow
    ``election.elect``. A new master bumps both epochs and makes the in-sync set {master};
    the old master still eligible is MASTER_STILL_EXIST; nobody eligible is
    CONTROLLER_MASTER_NOT_AVAILABLE for the controller (which then records "no master" at a
    new masterEpoch) and CONTROLLER_ELECT_MASTER_FAILED for anyone else (no change)."""
    name = header.broker_name
    stored = state.get(name)
    if stored is None:
        return _refuse(ResponseCode.CONTROLLER_BROKER_NEED_TO_BE_REGISTERED,
                       f"set {name} is not registered with the controller")
    record = stored.record
    requester = header.broker_id
    by_controller = requester == -1
    outcome: ElectionOutcome | None = None
    if (record.master_epoch == 0 and record.member(requester) is not None
            and _alive(live, now, record, requester)):
        # The first master is the requester, as RocketMQ's; but only one that is alive
        # (a broker heartbeats before it asks, on the same connection): RocketMQ would make a
        # member that never came up master, and the set would have no live master until it
        # does.
        outcome = ElectionOutcome(requester)
    if outcome is None:

        def live_info(broker_id: int) -> LiveInfo | None:
            info = live.get(_identity(record, broker_id))
            return info if info is not None and info.alive_at(now) else None

        outcome = elect(
            sync_state_set=record.sync_state_set,
            all_members=record.member_ids if config.enable_elect_unclean_master else None,
            old_master=record.master_id,
            designated=requester if header.designate_elect else None,
            live_info=live_info)
    new_master = outcome.master
    if new_master is not None and new_master == record.master_id:
        return Decision(
            ResponseCode.CONTROLLER_MASTER_STILL_EXIST,
            f"master {new_master} of set {name} is alive: no election needed",
            ElectMasterResponseHeader(new_master, record.address_of(new_master),
                                      record.master_epoch, record.sync_state_set_epoch),
            ElectMasterResponseBody(record.sync_state_set))
    if new_master is not None:
        updated = attrs.evolve(record, master_id=new_master,
                               master_epoch=record.master_epoch + 1,
                               sync_state_set=frozenset({new_master}),
                               sync_state_set_epoch=record.sync_state_set_epoch + 1)
        address = updated.address_of(new_master)
        notices: tuple[RoleChangeNotice, ...] = ()
        if config.notify_broker_role_changed:
            notice = NotifyBrokerRoleChangedRequestHeader(
                address, updated.master_epoch, updated.sync_state_set_epoch, new_master)
            notices = tuple(RoleChangeNotice(m.address, notice, _sync_state_set(updated))
                            for m in updated.members if _alive(live, now, updated, m.broker_id))
        return Decision(
            ResponseCode.SUCCESS,
            f"broker {new_master} is the master of set {name}" + (
                " (unclean: it was not in the in-sync set)" if outcome.unclean else ""),
            ElectMasterResponseHeader(new_master, address, updated.master_epoch,
                                      updated.sync_state_set_epoch),
            ElectMasterResponseBody(updated.sync_state_set, updated.cluster, name,
                                    updated.addresses),
            (_change(stored, name, updated),), notices)
    if by_controller:
        changes: tuple[RecordChange, ...] = ()
        if record.master_id is not None:
            # Fence the dead master: a new masterEpoch with nobody at it. The in-sync set is
            # kept, so its members can be elected when they come back.
            changes = (_change(stored, name, attrs.evolve(
                record, master_id=None, master_epoch=record.master_epoch + 1)),)
        return Decision(ResponseCode.CONTROLLER_MASTER_NOT_AVAILABLE,
                        f"the master of set {name} is gone and no member can be elected",
                        changes=changes)
    return _refuse(ResponseCode.CONTROLLER_ELECT_MASTER_FAILED,
                   f"no member of set {name} can be elected now")


def alter_sync_state_set(
    state: ControllerState, live: HeartbeatTable, now: float,
    header: AlterSyncStateSetRequestHeader, body: SyncStateSet | None,
) -> Decision:
    """CONTROLLER_ALTER_SYNC_STATE_SET (1001): the master proposes a new in-sync set, naming
    the epochs it holds. Refused, in RocketMQ's order: an unknown set or an unchanged set
    (2013), not the master (2002), a stale masterEpoch (2000) or set epoch (2001), a member
    not registered (2003) or not alive (2006), a set without the master (2013)."""
    name = header.broker_name
    if not name:
        return _invalid("brokerName")
    if body is None:
        return _invalid("body (the proposed SyncStateSet)")
    stored = state.get(name)
    failed = ResponseCode.CONTROLLER_ALTER_SYNC_STATE_SET_FAILED
    if stored is None:
        return _refuse(failed, f"set {name} is not registered with the controller")
    record = stored.record
    proposed = body.members
    if proposed == record.sync_state_set:
        return _refuse(failed, f"the proposed in-sync set of {name} is the current one")
    if record.master_id is None or record.master_id != header.master_broker_id:
        return _refuse(ResponseCode.CONTROLLER_INVALID_MASTER,
                       f"the master of set {name} is {record.master_id}, "
                       f"not {header.master_broker_id}")
    if header.master_epoch != record.master_epoch:
        return _refuse(ResponseCode.CONTROLLER_FENCED_MASTER_EPOCH,
                       f"set {name} is at masterEpoch {record.master_epoch}, "
                       f"not {header.master_epoch}")
    if body.epoch != record.sync_state_set_epoch:
        return _refuse(ResponseCode.CONTROLLER_FENCED_SYNC_STATE_SET_EPOCH,
                       f"set {name} is at syncStateSetEpoch {record.sync_state_set_epoch}, "
                       f"not {body.epoch}")
    for broker_id in sorted(proposed):
        if record.member(broker_id) is None:
            return _refuse(ResponseCode.CONTROLLER_INVALID_REPLICAS,
                           f"broker {broker_id} is not a member of set {name}")
        if not _alive(live, now, record, broker_id):
            return _refuse(ResponseCode.CONTROLLER_BROKER_NOT_ALIVE,
                           f"broker {broker_id} of set {name} is not alive")
    if record.master_id not in proposed:
        return _refuse(failed, f"the proposed in-sync set of {name} leaves out its master "
                               f"{record.master_id}")
    updated = attrs.evolve(record, sync_state_set=proposed,
                           sync_state_set_epoch=record.sync_state_set_epoch + 1)
    return Decision(header=AlterSyncStateSetResponseHeader(updated.sync_state_set_epoch),
                    body=_sync_state_set(updated), changes=(_change(stored, name, updated),))


# ---- reading and admin -----------------------------------------------------------------------


def get_replica_info(state: ControllerState, header: GetReplicaInfoRequestHeader) -> Decision:
    """CONTROLLER_GET_REPLICA_INFO (1004): the set's master (even a dead one: brokers poll
    this to learn the epoch), its masterEpoch and its in-sync set; an unknown set is
    CONTROLLER_BROKER_METADATA_NOT_EXIST."""
    stored = state.get(header.broker_name)
    if stored is None:
        return _refuse(ResponseCode.CONTROLLER_BROKER_METADATA_NOT_EXIST,
                       f"set {header.broker_name} is not known to the controller")
    record = stored.record
    return Decision(header=GetReplicaInfoResponseHeader(
        record.master_id, record.address_of(record.master_id), record.master_epoch),
        body=_sync_state_set(record))


def get_sync_state_data(
    state: ControllerState, live: HeartbeatTable, now: float, broker_names: Sequence[str],
) -> Decision:
    """CONTROLLER_GET_SYNC_STATE_DATA (1006): for each known name asked for, the master, the
    epochs, and every member with its address and liveness, split by in-sync or not. Unknown
    names are left out."""
    table: dict[str, ReplicasInfo] = {}
    for name in broker_names:
        stored = state.get(name)
        if stored is None:
            continue
        record = stored.record
        replicas = [(m.broker_id in record.sync_state_set,
                     ReplicaIdentity(name, m.broker_id, m.address,
                                     _alive(live, now, record, m.broker_id)))
                    for m in record.members]
        table[name] = ReplicasInfo(
            record.master_id, record.address_of(record.master_id), record.master_epoch,
            record.sync_state_set_epoch, tuple(r for in_sync, r in replicas if in_sync),
            tuple(r for in_sync, r in replicas if not in_sync))
    return Decision(body=BrokerReplicasInfo(table))


def clean_broker_data(
    state: ControllerState, live: HeartbeatTable, now: float,
    header: CleanBrokerDataRequestHeader,
) -> Decision:
    """CLEAN_BROKER_DATA (1011), admin: forget the members ``1;2`` of a set, or the whole set
    when no ids are given. Without ``isCleanLivingBroker`` a living broker is never forgotten
    (CONTROLLER_INVALID_CLEAN_BROKER_METADATA, as for bad ids and an unknown set). Forgetting
    the master leaves the set without one at a new masterEpoch; forgetting in-sync members
    bumps the set's epoch; forgetting the last member deletes the record."""
    invalid = ResponseCode.CONTROLLER_INVALID_CLEAN_BROKER_METADATA
    name = header.broker_name
    text = (header.broker_controller_ids_to_clean or "").strip()
    ids: frozenset[int] | None = None
    if text:
        try:
            ids = frozenset(int(part) for part in text.split(";"))
        except ValueError:
            return _refuse(invalid, f"brokerControllerIdsToClean must be ids separated by ';', "
                                    f"not {text[:64]!r}")
    stored = state.get(name)
    if not header.is_clean_living_broker and stored is not None:
        record = stored.record
        targets = record.member_ids if ids is None else ids & record.member_ids
        living = sorted(i for i in targets if _alive(live, now, record, i))
        if living:
            return _refuse(invalid, f"brokers {living} of set {name} are alive: not cleaned "
                                    "(isCleanLivingBroker forces it)")
    if stored is None:
        return _refuse(invalid, f"set {name} is not known to the controller")
    record = stored.record
    remaining = record.member_ids if ids is None else record.member_ids - ids
    if ids is None or not remaining:
        return Decision(changes=(_change(stored, name, None),))
    if remaining == record.member_ids:
        return Decision()  # none of the ids were members: nothing to forget
    # One evolve: a record is checked whole, and half-way (a master or an in-sync id that is
    # no longer a member) it would be invalid.
    lost_master = record.master_id is not None and record.master_id not in remaining
    lost_in_sync = not record.sync_state_set <= remaining
    updated = attrs.evolve(
        record,
        members=tuple(m for m in record.members if m.broker_id in remaining),
        master_id=None if lost_master else record.master_id,
        master_epoch=record.master_epoch + 1 if lost_master else record.master_epoch,
        sync_state_set=record.sync_state_set & remaining,
        sync_state_set_epoch=(record.sync_state_set_epoch + 1 if lost_in_sync
                              else record.sync_state_set_epoch))
    return Decision(changes=(_change(stored, name, updated),))
