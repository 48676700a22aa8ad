"""Which brokers the controller hears: the heartbeat table, with time passed in.

Every controller keeps its own table, in memory, as RocketMQ's DLedger controller does (brokers
heartbeat to every controller, so each one's table is complete): liveness is not state to
replicate, it is what this process observes now. The rules read it to decide who may be
elected, who may join an in-sync set, and whether a master is still there.

A broker is alive while ``last heartbeat + its heartbeat timeout >= now`` (the timeout comes
in the heartbeat, 10 s by default), and dead at once when the connection it heartbeats on
closes (RocketMQ's ``onBrokerChannelClose``): a killed master is failed over immediately, a
hung one after its timeout. Times are monotonic seconds given by the caller, never read here.

Two deliberate choices, both in docs/controller.md:

- **The latest report wins.** RocketMQ only ever raises the recorded (epoch, maxOffset), so a
  broker that truncated its log keeps its old, larger offset until its entry expires, and can
  win an election on bytes it no longer has. We keep what the broker says now: a heartbeat on
  one connection is in order, and the newest one is the truth.
- **The table is bounded.** RocketMQ adds an entry for any heartbeat at all. Here the rules
  only pass on heartbeats of registered members at their registered address
  (``rules.accept_heartbeat``: a flood from 10,000 addresses adds nothing), and the table
  itself holds at most ``capacity`` entries: a new identity beyond that is refused (after the
  expired entries are dropped) rather than growing the table, and a heartbeat timeout is
  clamped to ``MAX_HEARTBEAT_TIMEOUT_MS`` so that no entry can hold its place forever.
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_ELECTION_PRIORITY",
    "DEFAULT_HEARTBEAT_TIMEOUT_MS",
    "MAX_HEARTBEAT_TIMEOUT_MS",
    "BrokerIdentity",
    "HeartbeatTable",
    "LiveInfo",
]

#: a heartbeat without a timeout counts for 10 s (RocketMQ's DEFAULT_BROKER_CHANNEL_EXPIRED_TIME)
DEFAULT_HEARTBEAT_TIMEOUT_MS = 10_000
#: the longest a heartbeat may count for: a broker asking for more gets this
MAX_HEARTBEAT_TIMEOUT_MS = 3_600_000
#: a broker that sends no priority ranks last among equals (Java's Integer.MAX_VALUE)
DEFAULT_ELECTION_PRIORITY = 2**31 - 1
#: entries the table holds at most; far above any real deployment's brokers
DEFAULT_CAPACITY = 4096


@attrs.frozen
class BrokerIdentity:
    """A broker as the controller knows it: its set and its controller id."""

    cluster: str
    broker_name: str
    broker_id: int


@attrs.frozen
class LiveInfo:
    """The last heartbeat of one broker, as received."""

    address: str
    channel: Hashable
    last_heartbeat: float
    timeout_ms: int
    epoch: int
    max_offset: int
    confirm_offset: int
    election_priority: int

    def alive_at(self, now: float) -> bool:
        return self.last_heartbeat + self.timeout_ms / 1000 >= now


@attrs.define(eq=False)
class HeartbeatTable:
    """The heartbeat table: mutable, in memory, no I/O."""

    capacity: int = DEFAULT_CAPACITY
    _entries: dict[BrokerIdentity, LiveInfo] = attrs.field(factory=dict[BrokerIdentity, LiveInfo],
                                                            init=False)

    def __len__(self) -> int:
        return len(self._entries)

    def heartbeat(
        self,
        identity: BrokerIdentity,
        *,
        address: str,
        now: float,
        channel: Hashable | None = None,
        timeout_ms: int | None = None,
        epoch: int | None = None,
        max_offset: int | None = None,
        confirm_offset: int | None = None,
        election_priority: int | None = None,
    ) -> bool:
        """Record a heartbeat received at ``now``; False if the table is full and this is a
        new identity (the heartbeat is dropped). ``channel`` names the connection it came on
        (default: the address), for ``channel_closed``; missing numbers take RocketMQ's
        defaults (-1 for epoch and offsets)."""
        if identity not in self._entries and len(self._entries) >= self.capacity:
            self.expired(now)
            if len(self._entries) >= self.capacity:
                return False
        timeout = DEFAULT_HEARTBEAT_TIMEOUT_MS if timeout_ms is None else timeout_ms
        self._entries[identity] = LiveInfo(
            address=address,
            channel=address if channel is None else channel,
            last_heartbeat=now,
            timeout_ms=max(0, min(timeout, MAX_HEARTBEAT_TIMEOUT_MS)),
            epoch=-1 if epoch is None else epoch,
            max_offset=-1 if max_offset is None else max_offset,
            confirm_offset=-1 if confirm_offset is None else confirm_offset,
            election_priority=(DEFAULT_ELECTION_PRIORITY if election_priority is None
                               else election_priority),
        )
        return True

    def channel_closed(self, channel: Hashable) -> list[BrokerIdentity]:
        """The connection ``channel`` closed: every broker that heartbeats on it is dead now.
        Returns them (removed from the table)."""
        dead = [i for i, info in self._entries.items() if info.channel == channel]
        for identity in dead:
            del self._entries[identity]
        return dead

    def expired(self, now: float) -> list[BrokerIdentity]:
        """Drop and return the brokers whose last heartbeat no longer counts at ``now``."""
        dead = [i for i, info in self._entries.items() if not info.alive_at(now)]
        for identity in dead:
            del self._entries[identity]
        return dead

    def next_expiry(self) -> float | None:
        """The earliest time an entry stops counting (None: the table is empty). The server
        sleeps until then, so a silent broker is found dead at its timeout, not up to a scan
        interval later."""
        if not self._entries:
            return None
        return min(info.last_heartbeat + info.timeout_ms / 1000
                   for info in self._entries.values())

    def alive_count(self, now: float) -> int:
        return sum(1 for info in self._entries.values() if info.alive_at(now))

    def forget(self, identity: BrokerIdentity) -> None:
        """Drop one broker's entry (its metadata was cleaned)."""
        self._entries.pop(identity, None)

    def get(self, identity: BrokerIdentity) -> LiveInfo | None:
        return self._entries.get(identity)

    def is_alive(self, identity: BrokerIdentity, now: float) -> bool:
        info = self._entries.get(identity)
        return info is not None and info.alive_at(now)
