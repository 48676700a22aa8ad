"""A harness for the controller's rules: a state, a heartbeat table, a clock, and a versioned
in-memory record store that commits as the StateStore contract says (all or nothing, each
write's expected version checked, 0 meaning "must not exist").

The store is the contract's semantics in a dozen lines, not a mock of a real part: the journal
and the etcd backend are being written beside the rules, and the rules' tests must not wait for
them. Their own tests check that they keep the same contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from trio_ha.controller.liveness import BrokerIdentity, HeartbeatTable
from trio_ha.controller.rules import (
    ControllerConfig,
    ControllerState,
    Decision,
    apply_broker_id,
    get_next_broker_id,
    register_broker,
)
from trio_ha.controller.state_store import CommitConflict, Versioned, Write
from trio_ha.wire.controller import (
    ApplyBrokerIdRequestHeader,
    BrokerHeartbeatRequestHeader,
    GetNextBrokerIdRequestHeader,
    GetNextBrokerIdResponseHeader,
    RegisterBrokerToControllerRequestHeader,
)


@attrs.define(eq=False)
class MemoryRecords:
    """Versioned records with conditional all-or-nothing commits; versions are one counter for
    the whole store, as etcd's revisions are."""

    items: dict[str, Versioned] = attrs.field(factory=dict[str, Versioned])
    revision: int = 0

    def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        for w in writes:
            current = self.items.get(w.key)
            if (0 if current is None else current.version) != w.expected_version:
                raise CommitConflict(f"{w.key} is not at version {w.expected_version}")
        self.revision += 1
        versions: dict[str, int] = {}
        for w in writes:
            if w.value is None:
                self.items.pop(w.key, None)
            else:
                self.items[w.key] = Versioned(self.revision, w.value)
                versions[w.key] = self.revision
        return versions


@attrs.define(eq=False)
class Harness:
    config: ControllerConfig = ControllerConfig()
    records: MemoryRecords = attrs.field(factory=MemoryRecords)
    state: ControllerState = attrs.field(factory=ControllerState)
    live: HeartbeatTable = attrs.field(factory=HeartbeatTable)
    now: float = 1000.0
    cluster: str = "c1"

    def perform(self, decision: Decision) -> Decision:
        """Commit a decision's writes and move the state on, as the server does; the state
        after must be what a fresh load of the records gives."""
        versions = self.records.commit(decision.writes)
        self.state = self.state.after(decision, versions)
        assert self.state == ControllerState.from_store(self.records.items)
        return decision

    def join(self, name: str, address: str) -> int:
        """A broker's start-up: next id, apply, register. Returns its id."""
        answer = get_next_broker_id(
            self.state, GetNextBrokerIdRequestHeader(self.cluster, name)).header
        assert isinstance(answer, GetNextBrokerIdResponseHeader)
        broker_id = answer.next_broker_id
        assert isinstance(broker_id, int)
        applied = self.perform(apply_broker_id(self.state, ApplyBrokerIdRequestHeader(
            self.cluster, name, broker_id, f"{address};{broker_id}000")))
        assert applied.ok, applied.remark
        registered = self.perform(register_broker(
            self.state, self.live, self.now,
            RegisterBrokerToControllerRequestHeader(self.cluster, name, broker_id, address)))
        assert registered.ok, registered.remark
        return broker_id

    def beat(self, name: str, broker_id: int, *, epoch: int = 0, max_offset: int = 0,
             priority: int | None = None, timeout_ms: int = 10_000) -> None:
        address = self.state.sets[name].record.address_of(broker_id)
        assert address is not None
        assert self.live.heartbeat(
            BrokerIdentity(self.cluster, name, broker_id), address=address, now=self.now,
            timeout_ms=timeout_ms, epoch=epoch, max_offset=max_offset,
            election_priority=priority)

    def heartbeat_header(self, name: str, broker_id: int | None, address: str,
                         **fields: int) -> BrokerHeartbeatRequestHeader:
        return BrokerHeartbeatRequestHeader(self.cluster, address, name, broker_id, **fields)

    def kill(self, name: str, broker_id: int) -> list[BrokerIdentity]:
        address = self.state.sets[name].record.address_of(broker_id)
        return self.live.channel_closed(address)
