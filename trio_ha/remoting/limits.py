"""What one remoting server may spend: the limits, the byte budgets its connections share, and
the file descriptors the process keeps for everything else.

The peer is untrusted, so every resource a connection can make the server hold is bounded per
connection and in total (docs/remoting.md, "Limits and bad input"):

- replies waiting to be written: ``write_buffer_high_water_mark`` per connection (Netty's write
  buffer water marks, RocketMQ's writeBufferHighWaterMark / writeBufferLowWaterMark) and
  ``write_buffer_total`` for all connections — beyond either the server stops reading requests
  (back-pressure), and a write that makes no progress for ``write_timeout`` closes its
  connection;
- request bytes buffered (a frame not yet complete): a small allowance per connection, beyond it
  ``read_buffer_total`` for all connections, and ``request_timeout`` for a begun frame to
  arrive (a 1-byte-a-second sender is closed);
- requests running at once: ``max_in_flight`` per connection;
- connections: ``max_connections`` per listener, and never more than the process's file
  descriptor limit less a reserve for the store (see ``fd_connection_limit``);
- time: ``idle_timeout`` without a byte either way, ``shutdown_timeout`` to drain at shutdown.
"""

from __future__ import annotations

import resource
from typing import Any

import attrs
import trio

__all__ = [
    "FD_RESERVE_MIN", "READ_ALLOWANCE", "ByteBudget", "RemotingBudgets", "RemotingLimits",
    "fd_connection_limit",
]

KiB = 1024
MiB = 1024 * KiB

#: request bytes a connection may buffer without drawing on the shared read budget: one
#: receive, so small requests never wait for a budget that large frames have taken
READ_ALLOWANCE = 64 * KiB
#: file descriptors kept for the rest of the process (store segments, consume queues, HA,
#: name server connections) when the connection limit is clamped to the fd limit: a quarter of
#: the limit, at least this many
FD_RESERVE_MIN = 256


def _positive(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


def _non_negative(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{attribute.name} must be a number >= 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RemotingLimits:
    """The limits of one remoting server (the broker's and the name server's config keys)."""

    #: close a connection with no byte read or written for this long
    #: (serverChannelMaxIdleTimeSeconds)
    idle_timeout: float = attrs.field(default=120.0, validator=_positive)
    #: requests running at once per connection; beyond it the server stops reading
    max_in_flight: int = attrs.field(default=4096, validator=_positive)
    #: reply bytes waiting per connection at which the server stops reading its requests
    write_buffer_high_water_mark: int = attrs.field(default=4 * MiB, validator=_positive)
    #: ... and below which it reads again
    write_buffer_low_water_mark: int = attrs.field(default=1 * MiB, validator=_non_negative)
    #: reply bytes waiting in all connections at which the server stops reading requests
    write_buffer_total: int = attrs.field(default=256 * MiB, validator=_positive)
    #: a write that makes no progress for this long closes its connection (the peer is not
    #: reading its replies)
    write_timeout: float = attrs.field(default=30.0, validator=_positive)
    #: request bytes buffered beyond each connection's allowance, all connections together
    read_buffer_total: int = attrs.field(default=128 * MiB, validator=_positive)
    #: a frame begun must arrive whole within this long
    request_timeout: float = attrs.field(default=30.0, validator=_positive)
    #: connections per listener; more are accepted and closed at once
    max_connections: int = attrs.field(default=10_000, validator=_positive)
    #: at shutdown, how long connections may take to finish their requests and write their
    #: replies before they are closed
    shutdown_timeout: float = attrs.field(default=5.0, validator=_non_negative)
    #: how often a connection the server is not reading (back-pressure) is checked for a peer
    #: that has gone away
    hangup_check_interval: float = attrs.field(default=1.0, validator=_positive)
    #: when a peer hangs up (or its connection breaks), how long the requests it had already
    #: sent may take to finish before they are cancelled: a request read whole is carried
    #: out, as RocketMQ's thread pools do; only its reply is lost
    finish_timeout: float = attrs.field(default=10.0, validator=_non_negative)

    def __attrs_post_init__(self) -> None:
        if self.write_buffer_low_water_mark > self.write_buffer_high_water_mark:
            raise ValueError(
                f"write_buffer_low_water_mark ({self.write_buffer_low_water_mark}) must not "
                f"exceed write_buffer_high_water_mark ({self.write_buffer_high_water_mark})"
            )


@attrs.define(eq=False)
class ByteBudget:
    """Bytes shared by many connections: taken and released by them, waited for when spent."""

    limit: int
    used: int = 0
    #: bytes expected but not made yet (the replies of requests running): they count against
    #: the limit as if used
    promised: int = 0
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    @property
    def exhausted(self) -> bool:
        return self.used + self.promised >= self.limit

    def promise(self, size: int) -> None:
        self.promised += size

    def settle(self, size: int) -> None:
        """A promise of ``size`` bytes is kept (the bytes were taken) or dropped."""
        self.promised -= size
        if size > 0 and self._lot and not self.exhausted:
            self._lot.unpark_all()

    def try_take(self, size: int) -> bool:
        """Take ``size`` bytes if they fit under the limit."""
        if self.used + size > self.limit:
            return False
        self.used += size
        return True

    def take(self, size: int) -> None:
        """Take ``size`` bytes whether or not they fit (the bytes exist already)."""
        self.used += size

    def release(self, size: int) -> None:
        if size <= 0:
            return
        self.used -= size
        if self._lot and not self.exhausted:
            self._lot.unpark_all()

    async def wait_released(self) -> None:
        """Wait until some bytes are released (then look again)."""
        await self._lot.park()


@attrs.define(eq=False)
class RemotingBudgets:
    """The budgets one server's connections share (the broker shares them between its port and
    its VIP port)."""

    replies: ByteBudget
    requests: ByteBudget

    @classmethod
    def for_limits(cls, limits: RemotingLimits) -> RemotingBudgets:
        return cls(ByteBudget(limits.write_buffer_total), ByteBudget(limits.read_buffer_total))


def fd_connection_limit() -> int | None:
    """How many connections this process may hold open before it risks running out of file
    descriptors: the soft RLIMIT_NOFILE less a reserve (a quarter, at least FD_RESERVE_MIN);
    None when unlimited."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(1, soft - max(FD_RESERVE_MIN, soft // 4))
